#!/usr/bin/env bash
# The whole check of diesel-occ: formatting, clippy, unit, integration (SQLite,
# PostgreSQL, MySQL/MariaDB), doc and compile-fail tests, docs as docs.rs builds them, a
# publishing dry run, the demos, a smoke run of the benchmark program on each backend, a
# short soak judged by a linearizability checker (and a broken guard it must catch), an
# advisory check of the dependencies, calls on a server frozen with SIGSTOP, a short run
# of scripts/faults.sh (session kills and a restart of each local server), and the cluster tests on a PostgreSQL primary with
# a streaming standby (scripts/pg-replica.sh), PgBouncer in transaction mode in front of
# the local PostgreSQL (scripts/pgbouncer.sh), a Patroni cluster with etcd and HAProxy
# (scripts/patroni.sh), and a 3-node MariaDB Galera cluster (scripts/galera.sh) alone and
# behind HAProxy (scripts/galera-proxy.sh), all started on loopback.
#
# Run it as root on a Debian machine (or with sudo available). It installs what is missing
# (postgresql, mariadb-server, libpq-dev, default-libmysqlclient-dev, pkg-config), starts
# the servers if they are down, creates the test databases and exports their URLs. It is
# idempotent: running it twice changes nothing the second time.
#
# Preset PG_DATABASE_URL / MYSQL_DATABASE_URL to test against other servers; then they
# are used as given and local servers are left alone.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/servers.sh
source scripts/servers.sh
preset="${PG_DATABASE_URL:-}${MYSQL_DATABASE_URL:-}"
PG_DATABASE_URL_PRESET=${PG_DATABASE_URL:-}
prepare_servers
# Server tests fail instead of skipping when a server is missing or unreachable.
export OCC_REQUIRE_SERVERS=1
export RUSTDOCFLAGS="-D warnings"

# What to stop or undo however the run ends; each step adds its own.
cleanups=()
run_cleanups() { for c in "${cleanups[@]}"; do eval "$c" || true; done; }
trap run_cleanups EXIT

# cargo-audit, when missing, builds at the lowest priority in the background (about 5
# minutes of both cores on its own), in the time the tests wait on the servers; the audit
# runs at the end. Its own process group, so that a run that ends early stops it.
mkdir -p target
setsid -w nice -n 19 bash scripts/audit.sh --install-only >target/audit-install.log 2>&1 &
audit_install=$!
# Only while it runs: once it has ended, its number may be another process group's.
cleanups+=('jobs -rp | grep -qx "$audit_install" && kill -- -"$audit_install"')

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy (all targets, all backends, -D warnings)"
cargo clippy --all-targets --all-features -- -D warnings
step "cargo test on SQLite, PostgreSQL and MySQL (unit, integration, doc, compile-fail)"
# The lock tests mostly wait for leases to run out: 6 at a time (55 s, not 130 s). Every
# other target keeps the default of one per core: those are busy, more only slow them.
# The targets are the files cargo finds under tests/; the examples are built as programs.
tests=()
for file in tests/*.rs tests/*/main.rs; do
    name=${file#tests/}; name=${name%.rs}; name=${name%/main}
    [[ $name == locks ]] || tests+=(--test "$name")
done
[[ " ${tests[*]} " == *" --test writes "* && ${#tests[@]} -ge 12 ]] ||
    { echo "test targets not found: ${tests[*]}"; exit 1; }
cargo test --all-features --lib "${tests[@]}"
cargo test --all-features --test locks -- --test-threads=6
cargo test --all-features --doc
cargo build --all-features --examples
step "frozen servers: calls on a server stopped with SIGSTOP come back within their reply timeout, both drivers"
# PostgreSQL: the session's own backend is frozen; MariaDB runs every session in one
# process, so the whole local server is, and these tests run alone, one at a time. Each
# test thaws what it froze (a thread does it after 20 s whatever happens); the cleanup
# thaws the servers however the run ends. Local servers only: skipped when a URL was
# preset (the tests signal the server's processes).
if [ -z "$preset" ]; then
thaw_servers() { as_root pkill -CONT -x 'mariadbd|mysqld' || true; as_root pkill -CONT -x postgres || true; }
cleanups+=(thaw_servers)
OCC_FREEZE_SERVERS=1 cargo test --all-features --test connections frozen_server:: -- --test-threads=1
fi
step "cargo clippy of each backend alone (feature gates)"
cargo clippy --all-targets -- -D warnings
cargo clippy --lib --no-default-features --features postgres -- -D warnings
cargo clippy --lib --no-default-features --features mysql,locks -- -D warnings
# The async API without locks (its connection bound has no lock statements then).
cargo clippy --lib --no-default-features --features sqlite,async -- -D warnings
cargo clippy --lib --no-default-features --features postgres,bb8 -- -D warnings
# The telemetry's facades one without the other.
cargo clippy --lib --no-default-features --features postgres,metrics,locks -- -D warnings
cargo clippy --lib --no-default-features --features sqlite,tracing,locks,async -- -D warnings
step "no backend feature: one error that names the choices, and no warning"
out=$(cargo check --lib --no-default-features --message-format short 2>&1 || true)
grep -q "needs at least one database backend feature" <<<"$out" &&
    [[ $(grep -c "error" <<<"$out") -le 2 ]] && ! grep -q "warning" <<<"$out" ||
    { echo "$out"; exit 1; }
step "cargo doc as docs.rs builds it (every feature, each gated item marked with its feature)"
# docs.rs uses a nightly rustdoc for `doc(cfg)`: scripts/rustdoc-docsrs.sh lets this
# machine's stable one do the same, for rustdoc alone, so the build's cache holds.
RUSTDOC="$PWD/scripts/rustdoc-docsrs.sh" RUSTDOCFLAGS="-D warnings --cfg docsrs" \
    cargo doc --no-deps --all-features
# And as a user builds them with the default features: no link to a gated item may break.
cargo doc --no-deps
step "publishing: package contents and cargo publish --dry-run of both crates, in order"
bash scripts/publish-check.sh
step "the demos"
cargo run --example two_editors
cargo run --example legacy_table
step "the benchmark program: clippy, unit tests, and a smoke run on each backend"
# Tiny sizes, seconds per backend: it checks that every workload runs and that every
# exactness check holds (no lost or doubled update, one winner per race, no two lock
# holders); it asserts no speed.
cargo clippy -p diesel-occ-bench --all-targets -- -D warnings
cargo clippy -p diesel-occ-bench --all-targets --features all-backends -- -D warnings
cargo test -p diesel-occ-bench --features all-backends
# The default build (SQLite) must need no database client library.
if cargo tree -p diesel-occ-bench -e normal | grep -E "pq-sys|mysqlclient-sys"; then
    echo "the benchmark's default build links a database client library"; exit 1
fi
for url in "" "$PG_DATABASE_URL" "$MYSQL_DATABASE_URL"; do
    name=${url%%:*}
    name=${name:-sqlite}
    cargo run -q -p diesel-occ-bench --features all-backends -- --smoke ${url:+--url "$url"} \
        --out "target/bench-smoke/$name" >"target/bench-smoke-$name.log" ||
        { tail -n 20 "target/bench-smoke-$name.log"; exit 1; }
    echo "$name: smoke run passed its exactness checks"
done
step "the soak: a short mixed run per backend judged by a linearizability checker and a lock audit, and a broken guard it must catch"
# 20,000 operations per backend with every fault (session kills, row stalls, dropped
# calls, a leader process frozen past its lease, pools held exhausted); the replica bed's
# run below adds a failover. scripts/soak.sh runs the long ones (RELIABILITY.md).
for url in "" "$PG_DATABASE_URL" "$MYSQL_DATABASE_URL"; do
    name=${url%%:*}
    name=${name:-sqlite}
    cargo run -q -p diesel-occ-bench --features all-backends -- --soak 20000 ${url:+--url "$url"} \
        --out "target/soak-smoke/$name" | grep -v '^  {'
done
if cargo run -q -p diesel-occ-bench --features all-backends -- --soak 5000 --no-faults --broken-guard \
    --out target/soak-smoke/broken >target/soak-smoke-broken.log 2>&1 ||
    ! grep -q "has no linearization" target/soak-smoke-broken.log; then
    tail -n 5 target/soak-smoke-broken.log
    echo "the checker did not catch the lost updates of a broken guard"; exit 1
fi
grep "keys not linearizable" target/soak-smoke-broken.log
step "faults from outside: session kills in worker processes, a restart of each server (20 s per backend)"
if [ -z "$preset" ]; then
    env -u PG_DATABASE_URL -u MYSQL_DATABASE_URL bash scripts/faults.sh 20 2
else
    bash scripts/faults.sh 20 2
fi
step "PgBouncer in transaction mode (Debian's 1.18, and 1.24 with prepared statements): the pooler tests, and a soak through each with both restarted"
# scripts/pgbouncer.sh builds 1.24 from Debian's source package at its first start. The
# poolers are stopped however the step ends.
# In front of the local server only: skipped when PG_DATABASE_URL was preset.
if [ -z "${PG_DATABASE_URL_PRESET:-}" ]; then
cleanups+=('bash scripts/pgbouncer.sh stop')
urls=$(bash scripts/pgbouncer.sh start | tail -n 1)
# One test at a time: diesel-async prepares and runs a statement in two exchanges, and
# behind 1.18 another test's client can take the server session between them.
OCC_PGBOUNCER_URLS=$urls OCC_REQUIRE_CLUSTER=1 cargo test --all-features --test clusters pgbouncer:: -- --test-threads=1
# 1.24 keeps prepared statements: both drivers, diesel's statement cache on.
cargo run -q -p diesel-occ-bench --features all-backends -- --soak 15000 --url "${urls#*,}" \
    --outage "bash scripts/pgbouncer.sh restart" --outage-every 4 --outage-times 1 \
    --out target/soak-smoke/pgbouncer-1.24 | grep -v '^  {'
# 1.18 keeps none: the blocking API alone (workers and election candidates), without the
# statement cache (diesel-async names every statement, so it needs 1.21 or newer).
cargo run -q -p diesel-occ-bench --features all-backends -- --soak 15000 --url "${urls%%,*}" \
    --no-statement-cache --threads 8 --tasks 0 \
    --outage "bash scripts/pgbouncer.sh restart" --outage-every 4 --outage-times 1 \
    --out target/soak-smoke/pgbouncer-1.18 | grep -v '^  {'
bash scripts/pgbouncer.sh stop
fi
step "a PostgreSQL primary and a standby on loopback: stale copies, writes sent to the standby, a failover that loses commits, a soak across a failover"
# Each test starts a fresh pair (scripts/pg-replica.sh); the pair is removed however the
# step ends.
cleanups+=('bash scripts/pg-replica.sh stop')
OCC_PG_REPLICA=1 OCC_REQUIRE_CLUSTER=1 cargo test --all-features --test clusters pg_replica:: -- --test-threads=1
# The soak on a primary with a synchronous standby, through a libpq multi-host URL: the
# primary killed and the standby promoted 3 s in; every answer judged as above.
bash scripts/pg-replica.sh start-sync >/dev/null
cargo run -q -p diesel-occ-bench --features all-backends -- --soak 20000 \
    --url "postgres://postgres@127.0.0.1:5441,127.0.0.1:5442/diesel_occ_test?target_session_attrs=read-write" \
    --outage "bash scripts/pg-replica.sh fail-over" --outage-every 3 --outage-times 1 \
    --out target/soak-smoke/replica | grep -v '^  {'
bash scripts/pg-replica.sh stop
step "a Patroni cluster (two PostgreSQL nodes, etcd, HAProxy): a soak across a switchover through a multi-host URL, and across a failover with the primary killed through HAProxy"
# A fresh cluster for each (scripts/patroni.sh), removed however the step ends.
cleanups+=('bash scripts/patroni.sh stop')
urls=$(bash scripts/patroni.sh start | tail -n 1)
cargo run -q -p diesel-occ-bench --features all-backends -- --soak 15000 --url "${urls%,*}" \
    --outage "bash scripts/patroni.sh switchover" --outage-every 4 --outage-times 1 \
    --out target/soak-smoke/patroni-switchover | grep -v '^  {'
urls=$(bash scripts/patroni.sh start | tail -n 1)
cargo run -q -p diesel-occ-bench --features all-backends -- --soak 15000 --url "${urls##*,}" \
    --outage "bash scripts/patroni.sh fail-over" --outage-every 4 --outage-times 1 \
    --out target/soak-smoke/patroni-failover | grep -v '^  {'
bash scripts/patroni.sh stop
step "a 3-node MariaDB Galera cluster on loopback: read-modify-writes, merges and lock rounds across its nodes"
# 8 threads x 50 operations per round, OCC_CLUSTER_ROUNDS rounds (4 here unless set, 94 s
# against 172 s with 8, for the cold run to stay under 45 minutes; the
# tests' own default is 20), exact end states read on every node.
# The cluster is stopped however the step ends, so that it does not outlive the run.
cleanups+=('bash scripts/galera-proxy.sh stop' 'bash scripts/galera.sh stop')
bash scripts/galera.sh start
GALERA_URLS=$(bash scripts/galera.sh urls) OCC_REQUIRE_CLUSTER=1 OCC_CLUSTER_ROUNDS=${OCC_CLUSTER_ROUNDS:-4} \
    cargo test --all-features --test clusters galera:: -- --test-threads=1
step "HAProxy in front of the Galera cluster: a version read-back cut by the proxy"
# The soak through the proxy with the node in use killed is a longer command
# (CONTRIBUTING.md): a killed node that rejoins by a full state transfer breaks the
# soak's own audit trigger there.
proxy=$(bash scripts/galera-proxy.sh start | tail -n 1)
OCC_GALERA_PROXY_URL=$proxy GALERA_URLS=$(bash scripts/galera.sh urls) OCC_REQUIRE_CLUSTER=1 \
    cargo test --all-features --test clusters galera_proxy::
step "supply chain: cargo audit against the shipped advisory database (accepted: .cargo/audit.toml)"
wait "$audit_install" || { cat target/audit-install.log; exit 1; }
bash scripts/audit.sh
step "all checks passed"
