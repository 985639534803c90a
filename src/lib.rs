#![deny(missing_docs)]
#![warn(unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]
// Without a backend the one error below is all a user needs to see: the backend-specific
// code it leaves unused would only add warnings.
#![cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(unused)
)]
// The docs link the items of every feature (docs.rs builds them all, and CI checks
// those links with every feature on); with fewer features a link to an item left out
// cannot resolve, and is shown as plain text rather than warned about (in this crate's
// own builds, or a user's `cargo doc` of it as a path or git dependency).
#![cfg_attr(
    not(all(
        feature = "sqlite",
        feature = "postgres",
        feature = "mysql",
        feature = "migrations",
        feature = "locks",
        feature = "http",
        feature = "axum",
        feature = "tokio",
        feature = "deadpool",
        feature = "async",
        feature = "async-mysql",
        feature = "bb8",
        feature = "async-deadpool",
        feature = "backoff"
    )),
    allow(rustdoc::broken_intra_doc_links)
)]
//! Optimistic concurrency control for [diesel]: writes to shared rows that never lose
//! another writer's update.
//!
//! A guarded write is a compare-and-set on one row: `UPDATE ... SET <changes>,
//! version = <next> WHERE <key> AND version = <the version you read>`. One row matched:
//! the write happened and you get the new version without a re-read. No row matched: the
//! row is read once more by key and you get a precise [`Error`]: [`Error::NotFound`], or
//! [`Error::Conflict`] carrying the row as it is now.
//!
//! ```
//! # include!("doctest_setup.rs");
//! use diesel::prelude::*;
//! use diesel_occ::prelude::*;
//!
//! diesel::table! {
//!     orders (id) {
//!         id -> BigInt,
//!         note -> Text,
//!         version -> BigInt,
//!     }
//! }
//!
//! #[derive(Debug, Clone, Queryable, Selectable, Identifiable, Guarded)]
//! #[diesel(table_name = orders)]
//! struct Order {
//!     id: i64,
//!     note: String,
//!     #[occ(version)]
//!     version: i64,
//! }
//!
//! # fn main() -> Result<(), Error> {
//! # let mut conn = doctest_connection("CREATE TABLE orders (id BIGINT PRIMARY KEY, note TEXT NOT NULL, version BIGINT NOT NULL);
//! #     INSERT INTO orders VALUES (1, 'new', 0);");
//! // Two people open the same order.
//! let mut alice: Order = orders::table.find(1).select(Order::as_select()).first(&mut conn)?;
//! let bob = alice.clone();
//!
//! // Alice saves first: the version goes from 0 to 1.
//! alice.note = "gift wrap".into();
//! assert_eq!(alice.guarded_save(&mut conn)?, 1);
//!
//! // Bob's copy is stale: his write matches no row and he learns what is there now.
//! match bob.guarded_update(&mut conn, orders::note.eq("express")) {
//!     Err(Error::Conflict(conflict)) => {
//!         let current = conflict.current::<Order>().unwrap();
//!         assert_eq!((current.note.as_str(), current.version), ("gift wrap", 1));
//!     }
//!     other => panic!("expected a conflict, got {other:?}"),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! [`prelude`] brings the derives, every trait whose methods you call, [`Error`] and
//! [`RetryPolicy`] in one import. The [`guide`] has a chapter for each capability:
//! guarded writes, retries, JSON columns, transitions and claims, locks and leases, web
//! back ends, pools, the derive's attributes, choosing a guard, failures, and how the
//! crate compares with other tools.
//!
//! # Feature flags
//! - `sqlite` (default): SQLite, bundled, nothing to install.
//! - `postgres`: PostgreSQL through libpq.
//! - `mysql`: MySQL / MariaDB through libmysqlclient.
//! - `all-backends`: all three.
//! - `chrono`: last-modified and `updated_at` timestamp guards on `chrono` date-times,
//!   on the caller's clock or the database's.
//! - `locks`: locks, leases, leader election, fencing tokens and task claims (`Locks`,
//!   `Lease`, `Candidate`, `FencedWrite`, `GuardedClaim`; turns on `chrono`, since their
//!   times come from the database clock as `chrono` date-times).
//! - `backoff`: `RetryPolicy::backoff_schedule` takes the waits from a
//!   `backoff::ExponentialBackoff`, for code that already builds them (that crate is
//!   unmaintained; the default schedule does not use it).
//! - `migrations` (default): [`migrations::run`] (and, with `async`,
//!   `migrations::run_async`) creates the library's own tables. With
//!   `default-features = false` (a server backend without the bundled SQLite), name it
//!   again.
//! - `http`: `ETag`, `If-Match` / `If-None-Match` and RFC 9457 problems for web back
//!   ends (the `http` module).
//! - `tokio`: the blocking calls from async code on tokio's blocking pool
//!   (`with_connection`).
//!
//! # The derive
//! `#[derive(Guarded)]` goes next to diesel's `Queryable`, `Selectable` and `Identifiable`
//! and reads the attributes they read. It needs `Identifiable` (for the table) and
//! `Selectable` (to read the current row back after a miss).
//!
//! Container attributes:
//! - `#[diesel(table_name = path)]`: the `table!` module (default: the struct's name in
//!   snake case with an `s`, like diesel).
//! - `#[diesel(primary_key(col, ...))]`: key columns (default `id`); composite keys work.
//! - `#[occ(pre_image)]`: the guard is the old values of every field but the key and the
//!   excluded ones ([`ChangedColumns`] narrows it to the changed ones).
//!
//! Field attributes (one guard per struct; kinds do not combine):
//! - `#[occ(version)]`: the version column, of type `i16`, `i32` or `i64` (or an alias of
//!   one), or `u16`, `u32`, `u64` for MySQL `UNSIGNED` columns; the column must be NOT
//!   NULL and of the matching SQL type ([`VersionColumnFor`]).
//! - `#[occ(last_modified)]` or `#[occ(last_modified(precision = "seconds", clock =
//!   my::Clock))]`: a `chrono::NaiveDateTime` or `chrono::DateTime<Utc>` timestamp is the
//!   token (feature `chrono`; see `LastModifiedGuard` and `DatabaseClockGuard`).
//! - `#[occ(xmin)]`: PostgreSQL's `xmin` system column is the token (a `u32` field; see
//!   `XminGuard`, feature `postgres`).
//! - `#[occ(compare)]`: the field's old value is part of a pre-image guard.
//! - `#[occ(exclude)]`: writes to the field neither check nor advance the token
//!   ([`GuardedWrite::update_excluded`]), and saves leave it alone.
//! - `#[occ(updated_at)]` or `#[occ(updated_at(precision = "seconds", clock =
//!   my::Clock))]`: a timestamp every guarded write sets to now, beside the guard
//!   (feature `chrono`).
//! - `#[diesel(column_name = name)]` or `column_name = "name"`: the field's column, when
//!   named differently.
//! - `#[diesel(skip_update)]`: left out of [`GuardedWrite::guarded_save`].
//! - `#[diesel(serialize_as = Type)]`: converted with `Into<Type>` before it is written.
//!   A field read through `deserialize_as` needs it too (or `skip_update`).
//!
//! Every other attribute diesel accepts (`check_for_backend(...)`, `belongs_to(...)`, ...)
//! is accepted and left to diesel.

#[cfg(not(any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
compile_error!(
    "diesel-occ needs at least one database backend feature: `sqlite`, `postgres` or `mysql`\n  \
     help: diesel-occ = { version = \"0.1\", default-features = false, features = [\"postgres\"] }"
);

// The derive's code names the crate `::diesel_occ`, also inside it (`VersionRow`).
extern crate self as diesel_occ;

mod connect;
mod drive;
mod error;
mod flow;
mod guard;
mod json;
#[cfg(feature = "locks")]
mod locks;
mod operation;
mod retry;
mod sql;
mod status;
pub mod telemetry;
mod write;

#[cfg(feature = "async")]
pub mod asynchronous;
pub mod guide;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "migrations")]
pub mod migrations;
pub mod prelude;

/// The library's writes as values. A method such as
/// [`guarded_update`](crate::GuardedWrite::guarded_update) builds one of these from its
/// arguments and runs it: [`Run`](op::Run) on a blocking connection, `AsyncRun` (in
/// `diesel_occ::asynchronous`, feature `async`) on a diesel-async one. The value owns
/// what the write needs (key, expected token, changes, stamp), so one description of a
/// write serves both APIs, and SQLite's async connection runs the blocking
/// [`Run`](op::Run) whole on its own thread.
///
/// You never build one yourself; you name one in the bounds of a helper generic in the
/// connection, as diesel's own helpers name a query:
///
/// ```
/// # #[cfg(all(feature = "async", feature = "postgres"))]
/// # mod example {
/// # use diesel::prelude::*;
/// # diesel::table! { orders (id) { id -> BigInt, name -> Text, version -> BigInt } }
/// # #[derive(Debug, Clone, Queryable, Selectable, Identifiable, diesel_occ::Guarded)]
/// # #[diesel(table_name = orders)]
/// # struct Order { id: i64, name: String, #[occ(version)] version: i64 }
/// use diesel_occ::asynchronous::{prelude::*, AsyncRun};
/// use diesel_occ::op::Update;
/// use diesel_occ::Error;
///
/// /// Renames an order on any diesel-async connection the library supports.
/// async fn rename<C>(conn: &mut C, order: &Order, name: &str) -> Result<(), Error>
/// where
///     Update<Order, diesel::dsl::Eq<orders::name, String>>: AsyncRun<C>,
/// {
///     order.guarded_update(conn, orders::name.eq(name.to_owned())).await?;
///     Ok(())
/// }
/// # }
/// ```
pub mod op {
    #[cfg(feature = "locks")]
    pub use crate::locks::fence_op::FencedUpdate;
    pub use crate::operation::{
        BatchDelete, BatchUpdate, BulkUpdate, Delete, Insert, JsonEdit, JsonMerge,
        JsonMergeNoToken, Modify, Operation, Run, SaveChanged, TouchStamp, Update, Upsert,
        WriteExcluded,
    };
    #[cfg(feature = "locks")]
    pub use crate::status::claim_op::{Claim, ClaimHeartbeat, CountedClaim, EndClaim, EndClaims};
    pub use crate::status::transition_op::{KeyTransition, Transition};
    pub use crate::write::operation::EnsureVersionRow;
}

// Entities and their guards.
pub use guard::row_version::{RowVersionGuard, RowVersionValue};
#[cfg(feature = "chrono")]
pub use guard::server_clock::DatabaseClockGuard;
#[cfg(feature = "chrono")]
pub use guard::timestamp::{
    Clock, LastModifiedGuard, Micros, Millis, Precision, Seconds, SystemClock, Timestamp,
};
pub use guard::version::{VersionColumnFor, VersionGuard, VersionNumber};
#[cfg(feature = "postgres")]
pub use guard::xmin::{Xid, XminGuard};
pub use guard::{AdvanceInSql, Advancing, GuardKind, Guarded, TokenOf};

// Writes.
pub use connect::source::Connections;
pub use drive::blocking::load::LoadByKey;
pub use flow::batch::rows::ROWS_PER_STATEMENT;
pub use guard::pre_image::{ChangedColumns, ExactlyComparable};
pub use guard::seed::SeedsTokens;
pub use write::batch::{BatchMode, BatchReport, GuardedBatch, RowOutcome, UpdateBatch};
pub use write::bulk::{BulkReport, GuardedBulk, UpdateBulk};
pub use write::changed_columns::{GuardedChanges, SaveChanges};
pub use write::entity::{DeleteRow, GuardedWrite, UpdateExcluded, UpdateRow};
pub use write::insert::InsertRow;
pub use write::modify::{GuardedModify, Modified};
pub use write::operation::{guarded_operation, occ_versions, VersionRow};
pub use write::pessimistic::{LockWait, Pessimistic};
pub use write::upsert::{UpsertRow, Upserted};

// JSON columns.
pub use json::document::{merge_diff, EditJson, GuardedJson, JsonDocument, DOCUMENT_LIMIT_BYTES};
pub use json::merge_in_place::{GuardedJsonMerge, MergeInPlace};

// Status transitions and claims.
#[cfg(feature = "locks")]
pub use flow::finish_claims::report::FinishedClaims;
pub use guard::status::{HasStatus, Status};
#[cfg(feature = "locks")]
pub use status::claim::{ClaimOrder, ClaimRequest, ClaimRows, FinishClaim, GuardedClaim};
#[cfg(feature = "locks")]
pub use status::claim_attempts::{AttemptLimit, ClaimCounted, Claimed};
#[cfg(feature = "locks")]
pub use status::claim_filter::ClaimCondition;
#[cfg(feature = "locks")]
pub use status::claim_heartbeat::ExtendClaim;
pub use status::condition::{TransitionCondition, When};
#[cfg(feature = "locks")]
pub use status::finish_claims::FinishClaims;
pub use status::transition::{
    no_extra, occ_transitions, record, GuardedStatusTransition, GuardedTransition, HistoryEntry,
    TransitionByKey, TransitionRow,
};

// Locks, leases, leader election and fencing.
#[cfg(feature = "locks")]
pub use locks::backend::{LockBackend, ServerLockBackend, WaitBounds};
#[cfg(feature = "locks")]
pub use locks::belief::SAFETY_MARGIN;
#[cfg(feature = "locks")]
pub use locks::fence::{FencedWrite, WriteFenced};
#[cfg(feature = "locks")]
pub use locks::held::Held;
#[cfg(feature = "locks")]
pub use locks::leader::{Candidate, ElectionTiming, LeaderEvent, Leadership};
#[cfg(feature = "locks")]
pub use locks::lease::Lease;
#[cfg(feature = "locks")]
pub use locks::lock::{occ_locks, LockConnection, LockGuard, Locks, MAX_TTL};
#[cfg(feature = "locks")]
pub use locks::lock_time::LockTime;

// Outcomes, retries, connections.
pub use connect::backend::OccBackend;
#[cfg(feature = "tokio")]
pub use connect::blocking::with_connection;
#[cfg(feature = "mysql")]
pub use connect::pool::{mysql_pool, MysqlPool, MysqlSettings};
#[cfg(feature = "postgres")]
pub use connect::pool::{postgres_pool, PgPool};
#[cfg(feature = "sqlite")]
pub use connect::pool::{sqlite_pool, SqlitePool, SqliteSettings};
pub use connect::pool::{CheckedManager, PoolConfig, Pooled};
pub use connect::source::ConnectionSource;
pub use connect::transaction::WriteTransaction;
pub use error::{Conflict, CurrentRow, Error, InvalidTransition, RetryReason, Token};
pub use retry::{Contention, RetryEvent, RetryPolicy, Stop};
pub use sql::names::NAME_LIMIT;

/// What the derives' generated code names; not part of the API.
#[doc(hidden)]
pub mod __private {
    /// The async backends' own questions (the cluster suite asks one directly).
    #[cfg(feature = "async")]
    pub use crate::drive::on_async::connection::NativeAsync;
    pub use crate::guard::pre_image::{all_of, AllOf, NullSafeEq};
    #[cfg(feature = "chrono")]
    pub use crate::guard::timestamp::stamp_now;
    pub use crate::guard::Unusable;
    pub use crate::json::document::{document_refusal, field, field_mut};
    pub use crate::sql::key_list::KeyIn;
    pub use crate::sql::new_token::Counted;
    pub use crate::sql::statement::{AnyOf, ColumnEq, NoChanges, Unguarded};
    /// The per-backend parts of [`ClaimCondition`](crate::ClaimCondition).
    #[cfg(feature = "locks")]
    pub use crate::status::claim_filter::{on_backends, ClaimFilter};
}

/// Derives [`Guarded`] for an entity struct; see the crate docs for its attributes.
pub use diesel_occ_derive::{Guarded, Status};

/// The diesel this crate is built on; generated code names it through this path.
#[doc(hidden)]
pub use diesel;

/// The serde_json whose `Value` JSON columns hold; generated code names it through this path.
#[doc(hidden)]
pub use serde_json;

/// The README's examples, compiled as doc tests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
