#!/usr/bin/env bash
# Faults from outside the test process, on PostgreSQL and MariaDB: PROCESSES worker
# processes run every operation (read-merge-write, one-statement merge, transition with
# its history hook, lock acquire / renew / release) on a few shared rows for SECONDS,
# each killing its own server sessions at random, while the server is restarted halfway
# through. Then the end state is checked against every process's operation log. Prints
# operations/s, sessions killed, restarts and anomalies (which must be 0).
#
#   bash scripts/faults.sh [SECONDS per backend, default 120] [PROCESSES, default 3]
#
# scripts/test.sh runs a short one (20 s, 2 processes); a few minutes makes the soak.
# Restarts need the local servers: with PG_DATABASE_URL / MYSQL_DATABASE_URL preset, the
# servers are left running and only the session kills happen.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-120}
processes=${2:-3}

# shellcheck source=scripts/servers.sh
source scripts/servers.sh
preset="${PG_DATABASE_URL:-}${MYSQL_DATABASE_URL:-}"
prepare_servers
export OCC_REQUIRE_SERVERS=1 OCC_SOAK_SECONDS=$seconds OCC_SOAK_PROCESSES=$processes
if [ -z "$preset" ]; then
    here=$(pwd)
    export OCC_SOAK_RESTART_POSTGRES="bash -c 'set -euo pipefail; source $here/scripts/servers.sh; restart_postgres'"
    export OCC_SOAK_RESTART_MYSQL="bash -c 'set -euo pipefail; source $here/scripts/servers.sh; restart_mariadb'"
else
    echo "faults: server URLs preset, so the servers are not restarted (session kills only)"
fi
cargo test --all-features --test connections fault_soak -- --nocapture --test-threads=1
