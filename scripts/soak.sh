#!/usr/bin/env bash
# The soak: BACKEND and OPS operations, mixed across blocking threads and async tasks
# (bb8 and deadpool), with session kills, row stalls, dropped calls, pools held
# exhausted, leader processes frozen with SIGSTOP and outages throughout; every call is
# recorded (target/soak/BACKEND/history.jsonl) and each key's history is judged by
# stateright's linearizability checker, every lock grant by a trigger-written audit.
# Prints the operations, the faults injected, the outcomes by kind and the verdict;
# exits non-zero when a key has no linearization, the audit finds two holders at once,
# or the library answered with a raw error. RELIABILITY.md has the figures.
#
# BACKEND is one of:
#   sqlite    an SQLite file (no outage: there is no server)
#   postgres  the local PostgreSQL, restarted every 30 s
#   mysql     the local MariaDB, restarted every 30 s
#   galera    a 3-node Galera cluster on loopback (scripts/galera.sh), workers spread over
#             the nodes, a random node killed (SIGKILL) and started again every 30 s
#   replica   a PostgreSQL primary with a synchronous standby (scripts/pg-replica.sh),
#             reached through a libpq multi-host URL; the primary killed and the standby
#             promoted once, 30 s in
#
#   bash scripts/soak.sh postgres 1000000
#   bash scripts/soak.sh sqlite 20000 --no-faults --broken-guard   # the checker must fail
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: scripts/soak.sh sqlite|postgres|mysql|galera|replica OPS [occ-bench options]"
backend=${1:?$usage}
ops=${2:?$usage}
shift 2
# shellcheck source=scripts/servers.sh
source scripts/servers.sh
case "$backend" in
    sqlite) args=() ;;
    postgres)
        prepare_servers >/dev/null
        args=(--url "$PG_DATABASE_URL" --outage "source scripts/servers.sh && restart_postgres")
        ;;
    mysql)
        prepare_servers >/dev/null
        args=(--url "$MYSQL_DATABASE_URL" --outage "source scripts/servers.sh && restart_mariadb")
        ;;
    galera)
        trap 'bash scripts/galera.sh stop' EXIT
        bash scripts/galera.sh start >/dev/null
        args=(--url "$(bash scripts/galera.sh urls)"
            --outage 'bash scripts/galera.sh bounce $((RANDOM % 3 + 1))')
        ;;
    replica)
        trap 'bash scripts/pg-replica.sh stop' EXIT
        bash scripts/pg-replica.sh start-sync >/dev/null
        args=(--url "postgres://postgres@127.0.0.1:5441,127.0.0.1:5442/diesel_occ_test?target_session_attrs=read-write"
            --outage "bash scripts/pg-replica.sh fail-over" --outage-times 1)
        ;;
    *) echo "$usage" >&2; exit 2 ;;
esac
cargo build -q --release -p diesel-occ-bench --features all-backends
target/release/occ-bench --soak "$ops" "${args[@]}" --out "target/soak/$backend" "$@"
