//! Status transitions (with hooks and conditions) and task claims, on every backend and
//! both executors.
//!
//! One test binary per area (each binary links the whole dependency tree again), a
//! module per topic; `cargo test --test status <module>::` runs one topic.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod claim;
mod claim_edges;
mod claim_upkeep;
mod status_guard;
mod telemetry;
mod transition;
mod transition_conditions;
