#!/usr/bin/env bash
# A longer randomized run of the property tests (tests/properties.rs): many more random
# documents, patches, tokens and header values than the test suite's, on SQLite,
# PostgreSQL and MySQL, stopped after a time bound. No fuzzing toolchain is needed.
#
#   bash scripts/properties.sh [cases per property, default 5000] [seconds, default 600]
#
# Uses PG_DATABASE_URL / MYSQL_DATABASE_URL as scripts/test.sh exports them (server
# properties are skipped when they are unset).
set -euo pipefail
cd "$(dirname "$0")/.."
cases=${1:-5000}
seconds=${2:-600}
cargo test --release --all-features --test properties --no-run
PROPTEST_CASES=$cases timeout "$seconds" cargo test --release --all-features --test properties
