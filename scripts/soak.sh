#!/usr/bin/env bash
# The soak: BACKEND (sqlite, postgres or mysql) and OPS operations, mixed across blocking
# threads and async tasks, with session kills, row stalls and dropped calls throughout;
# every call is recorded (target/soak/BACKEND/history.jsonl) and each key's history is
# judged by stateright's linearizability checker. Prints the operations, the faults
# injected, the outcomes by kind and the verdict; exits non-zero when a key has no
# linearization or the library answered with a raw error. RELIABILITY.md has the figures.
#
#   bash scripts/soak.sh postgres 1000000
#   bash scripts/soak.sh sqlite 100000 --broken-guard   # the checker must fail
set -euo pipefail
cd "$(dirname "$0")/.."
backend=${1:?usage: scripts/soak.sh sqlite|postgres|mysql OPS [occ-bench options]}
ops=${2:?usage: scripts/soak.sh sqlite|postgres|mysql OPS [occ-bench options]}
shift 2
# shellcheck source=scripts/servers.sh
source scripts/servers.sh
case "$backend" in
    sqlite) url=() ;;
    postgres) prepare_servers >/dev/null; url=(--url "$PG_DATABASE_URL") ;;
    mysql) prepare_servers >/dev/null; url=(--url "$MYSQL_DATABASE_URL") ;;
    *) echo "unknown backend $backend: sqlite, postgres or mysql" >&2; exit 2 ;;
esac
cargo build -q --release -p diesel-occ-bench --features all-backends
exec target/release/occ-bench --soak "$ops" "${url[@]}" --out "target/soak/$backend" "$@"
