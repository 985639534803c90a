//! Locks, leases, leader election and fenced writes, on every backend and both executors,
//! with stalls and frozen or killed holders.
//!
//! One test binary per area (each binary links the whole dependency tree again), a
//! module per topic; `cargo test --test locks <module>::` runs one topic.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod async_locks;
mod frozen_holder;
mod held_lock;
mod leader;
mod lock;
mod lock_paths;
mod lock_stalls;
mod telemetry;
