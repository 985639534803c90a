#!/bin/sh
# rustdoc as docs.rs runs it: a nightly one, so that `doc(cfg)` marks each gated item
# with its feature. RUSTC_BOOTSTRAP lets this machine's one stable toolchain do the same.
# Set for rustdoc alone (cargo's RUSTDOC), not for the whole build: the dependencies'
# builds then stay the ones the other steps made, rather than built again.
RUSTC_BOOTSTRAP=1 exec rustdoc "$@"
