#!/usr/bin/env bash
# Runs occ-bench several times on each backend and folds the runs into medians and
# ranges, the figures BENCHMARKS.md quotes: bench/results/medians-<backend>.md, the same
# tables written into BENCHMARKS.md's generated blocks (one per backend and workload),
# and each run's own output (summaries with query plans) under target/bench-runs/.
#
#   scripts/benchmarks.sh [RUNS] [WORKLOADS] [BACKENDS]
#   scripts/benchmarks.sh 3 w6 sqlite,postgres,mysql
#
# Defaults: 3 runs, every workload, all three backends. Starts the servers it needs, as
# the test script does (scripts/servers.sh). A full default pass takes about an hour.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/servers.sh

runs=${1:-3}
workloads=${2:-w1,w1-async,w2,w2-async,w3,w3-async,w4,w5,w6,w7}
backends=${3:-sqlite,postgres,mysql}

prepare_servers
psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'diesel_occ_bench'" |
  grep -q 1 || psql -h 127.0.0.1 -U postgres -c "CREATE DATABASE diesel_occ_bench"
mysql -uroot -h127.0.0.1 -e "CREATE DATABASE IF NOT EXISTS diesel_occ_bench"

step "building occ-bench"
cargo build --release -p diesel-occ-bench --features all-backends
bench=target/release/occ-bench
mkdir -p target/bench-runs

for backend in ${backends//,/ }; do
  case $backend in
    sqlite) url=() ;;
    postgres) url=(--url postgres://postgres@127.0.0.1:5432/diesel_occ_bench) ;;
    mysql) url=(--url mysql://root@127.0.0.1:3306/diesel_occ_bench) ;;
    *) echo "unknown backend: $backend" >&2; exit 2 ;;
  esac
  results=()
  for run in $(seq 1 "$runs"); do
    step "$backend: run $run of $runs ($workloads)"
    out=target/bench-runs/$backend-$run
    "$bench" ${url[@]+"${url[@]}"} --workloads "$workloads" --out "$out" > "$out.log" 2>&1 ||
      { tail -20 "$out.log"; exit 1; }
    results+=("$out/results.jsonl")
  done
  "$bench" --medians-of "${results[@]}" --out target/bench-runs --into BENCHMARKS.md > /dev/null
  mv target/bench-runs/medians.md "bench/results/medians-$backend.md"
  step "$backend: bench/results/medians-$backend.md, and its blocks in BENCHMARKS.md"
  cat "bench/results/medians-$backend.md"
done
