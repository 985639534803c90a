#!/usr/bin/env bash
# Supply chain: dependency trees against the RustSec advisory database shipped beside the
# project (../shared/advisory-db.bundle), offline: these machines cannot reach its home.
#
# 1. What a user builds, with no waiver: a scratch crate that depends on diesel-occ with
#    its default features, then with every feature but the `backoff` compatibility one
#    and `async-mysql`; then with `async-mysql`, waiving only the advisory its MySQL
#    client's cache crate carries (see .cargo/audit.toml for why it does not apply).
#    Its lock file starts from ours, so it holds the same versions, pruned to what that
#    user compiles. Any advisory fails.
# 2. This workspace's Cargo.lock (every feature, the tests' and the benchmark's crates).
#    The advisories accepted there, each with its reason, are in .cargo/audit.toml; they
#    may only concern what the opt-in `backoff` feature brings.
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
# scripts/test.sh installs it in the background first, and audits at the end.
[[ ${1:-} == --install-only ]] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git clone -q -b main "$bundle" "$tmp/advisory-db"
audit() { cargo audit --db "$tmp/advisory-db" --no-fetch --stale --deny warnings "$@"; }

user_crate() { # name, features line, audit options
    mkdir -p "$tmp/$1/src"
    echo 'fn main() {}' >"$tmp/$1/src/main.rs"
    cat >"$tmp/$1/Cargo.toml" <<TOML
[package]
name = "$1"
version = "0.0.0"
edition = "2021"

[dependencies]
diesel-occ = { path = "$PWD", $2 }

[workspace]
TOML
    cp Cargo.lock "$tmp/$1/Cargo.lock"
    # Resolves the scratch crate: keeps our pinned versions, drops what it does not use.
    (cd "$tmp/$1" && cargo metadata --format-version 1 >/dev/null)
    local waivers="${*:3}"
    echo "== $1: $(grep -c '^name = ' "$tmp/$1/Cargo.lock") crates, waived: ${waivers:-nothing}"
    # An empty configuration: .cargo/audit.toml's waivers are for this workspace only.
    (cd "$tmp/$1" && audit "${@:3}")
}
user_crate default-features 'default-features = true'
user_crate every-feature-but-backoff \
    'features = ["all-backends", "chrono", "locks", "http", "axum", "tokio", "deadpool", "migrations", "async", "bb8", "async-deadpool"]'
user_crate async-mysql 'features = ["async-mysql", "bb8", "async-deadpool"]' --ignore RUSTSEC-2026-0253

echo "== this workspace (accepted advisories: .cargo/audit.toml)"
audit
