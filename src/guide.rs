//! The guide: what each capability does, when to use it, and what it costs, chapter by
//! chapter. Every example in it is a doc test, so it stays true.
//!
//! 1. [Guarded writes](guarded_writes): the compare-and-set every write is, its outcomes,
//!    the guard kinds and the write methods.
//! 2. [Retries and read-modify-write](retries): when a failed write runs again, and how.
//! 3. [JSON columns](json): merges that never drop another writer's keys.
//! 4. [Status transitions and task claiming](transitions): one winner per race.
//! 5. Locks, leases and leader election (`guide::locks`, feature `locks`): database-table
//!    locks with fencing tokens.
//! 6. [Web back ends](web): ETags, `If-Match` and problem bodies.
//! 7. [Pools, async connections and the library's tables](setup).
//! 8. [The derive](mod@derive): every attribute.
//! 9. [Choosing a guard and a retry policy](choosing).
//! 10. [When connections fail, and bad input](failures): what each outcome means.
//! 11. [Clusters and replicas](clusters): Galera, PostgreSQL standbys, failover.
//! 12. [Running behind poolers, proxies and failover](topologies): PgBouncer in
//!     transaction mode, HAProxy in front of Galera, Patroni.
//! 13. [Compared with other tools](comparison).
//!
//! What the library reports while it works (spans, events, metrics) is listed in the
//! module [`telemetry`](crate::telemetry).

#[doc = include_str!("docs/guarded_writes.md")]
pub mod guarded_writes {}

#[doc = include_str!("docs/retries.md")]
pub mod retries {}

#[doc = include_str!("docs/json.md")]
pub mod json {}

#[doc = include_str!("docs/transitions.md")]
pub mod transitions {}

#[cfg(feature = "locks")]
#[doc = include_str!("docs/locks.md")]
pub mod locks {}

#[doc = include_str!("docs/web.md")]
pub mod web {}

#[doc = include_str!("docs/setup.md")]
pub mod setup {}

#[doc = include_str!("docs/derive.md")]
pub mod derive {}

#[doc = include_str!("docs/choosing.md")]
pub mod choosing {}

#[doc = include_str!("docs/failures.md")]
pub mod failures {}

#[doc = include_str!("docs/clusters.md")]
pub mod clusters {}

#[doc = include_str!("docs/topologies.md")]
pub mod topologies {}

#[doc = include_str!("docs/comparison.md")]
pub mod comparison {}
