#!/usr/bin/env bash
# Publishing without publishing: what `cargo publish` would upload, checked before anyone
# runs it for real.
#
# 1. `cargo package --list` of both crates ships the sources, migrations, licences and
#    landing page, and no tests, scripts, benchmark or CI files.
# 2. `cargo publish --workspace --dry-run`: the derive crate first, then the library,
#    each packaged and built from its package alone (the library against the derive crate
#    as packaged, so a file missing from a package fails here, not on crates.io).
set -euo pipefail
cd "$(dirname "$0")/.."

for crate in diesel-occ-derive diesel-occ; do
    files=$(cargo package --list --allow-dirty -p "$crate")
    stray=$(grep -E '^(tests|scripts|bench|examples|\.ci|\.cargo|target)/|^migrations/(sqlite|postgres|mysql)/|^\.git' <<<"$files" || true)
    if [[ -n $stray ]]; then
        echo "publish-check: $crate would ship files that are not part of the library:" >&2
        echo "$stray" >&2
        exit 1
    fi
    for needed in LICENSE-MIT LICENSE-APACHE Cargo.toml src/lib.rs; do
        grep -qx "$needed" <<<"$files" ||
            { echo "publish-check: $crate would not ship $needed" >&2; exit 1; }
    done
    echo "$crate ships $(wc -l <<<"$files") files; none of them tests, scripts or CI"
done

# The dry run serves the packaged derive crate from a temporary registry. Cargo extracts
# it under $CARGO_HOME/registry/src/<that registry>/diesel-occ-derive-<version> and
# judges its build fresh by name and version alone, as for any published crate: a copy
# or a build left by an earlier run (same version, older source) would be used instead of
# this one. Remove both, so the library is verified against the derive crate as it is now
# (rebuilding the derive crate takes seconds).
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/diesel-occ-derive-*
rm -rf "${CARGO_TARGET_DIR:-target}"/debug/.fingerprint/diesel-occ-derive-*

# --allow-dirty: a developer may run this before committing; CI runs it on a clean clone.
cargo publish --workspace --dry-run --allow-dirty --quiet
echo "cargo publish --dry-run passed for diesel-occ-derive, then diesel-occ"
