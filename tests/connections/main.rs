//! Pools and connections: the pool builders, every pool kind, killed sessions and writers,
//! cancelled futures, and the example HTTP service.
//!
//! One test binary per area (each binary links the whole dependency tree again), a
//! module per topic; `cargo test --test connections <module>::` runs one topic.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod async_cancellation;
mod async_migrations;
mod async_pools;
mod blocking;
mod connection_faults;
mod connection_sources;
mod frozen_server;
mod http_service;
mod killed_writer;
mod pool;
mod read_only_server;
mod send_futures;
