//! The cluster test beds: a MariaDB Galera cluster (scripts/galera.sh, GALERA_URLS), PgBouncer
//! in transaction mode (scripts/pgbouncer.sh, OCC_PGBOUNCER_URLS) and a
//! PostgreSQL primary with a streaming standby (scripts/pg-replica.sh, OCC_PG_REPLICA);
//! skipped unless they are set.
//!
//! One test binary per area (each binary links the whole dependency tree again), a
//! module per topic; `cargo test --test clusters <module>::` runs one topic.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod galera;
mod galera_proxy;
mod pg_replica;
mod pgbouncer;
