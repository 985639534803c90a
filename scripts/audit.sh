#!/usr/bin/env bash
# Supply chain: the dependency tree (Cargo.lock) against the RustSec advisory database
# shipped beside the project (../shared/advisory-db.bundle), offline: these machines cannot
# reach the database's home. Accepted advisories, with reasons: .cargo/audit.toml.
set -euo pipefail
cd "$(dirname "$0")/.."

bundle=../shared/advisory-db.bundle
if [[ ! -f $bundle ]]; then
    echo "audit: $bundle is missing; cannot check advisories offline" >&2
    exit 1
fi
if ! command -v cargo-audit >/dev/null; then
    echo "== installing cargo-audit (once; about 5 minutes on 2 cores)"
    cargo install cargo-audit --locked --quiet
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git clone -q -b main "$bundle" "$tmp/advisory-db"
# --stale: the snapshot is older than cargo-audit's freshness limit, on purpose.
cargo audit --db "$tmp/advisory-db" --no-fetch --stale --deny warnings
