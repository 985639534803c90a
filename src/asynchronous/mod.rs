//! The library on diesel-async connections (feature `async`): guarded writes, batches,
//! inserts and upserts, read-modify-write with retry, JSON edits and merges, status transitions (with
//! hooks), work on a locked row ([`AsyncPessimistic`]) and (feature `locks`) task claims ([`AsyncGuardedClaim`]), locks, leases and leader
//! election ([`AsyncLocks`], [`AsyncCandidate`]), as futures, on `AsyncPgConnection`,
//! `SyncConnectionWrapper<SqliteConnection>` and (feature `async-mysql`)
//! `AsyncMysqlConnection`. A connection checked out of a bb8 or deadpool pool with
//! [`AsyncConnectionSource::checkout`] is passed as `&mut *conn`;
//! [`AsyncGuardedModify::modify_pooled`] takes the pool itself (features `bb8`,
//! `async-deadpool`) and checks a connection out per attempt.
//!
//! ```
//! # #[cfg(all(feature = "bb8", feature = "postgres"))]
//! # mod example {
//! # use diesel::prelude::*;
//! # diesel::table! { orders (id) { id -> BigInt, name -> Text, version -> BigInt } }
//! # #[derive(Debug, Clone, Queryable, Selectable, Identifiable, diesel_occ::Guarded)]
//! # #[diesel(table_name = orders)]
//! # struct Order { id: i64, name: String, #[occ(version)] version: i64 }
//! use diesel_async::pooled_connection::bb8::Pool;
//! use diesel_async::AsyncPgConnection;
//! use diesel_occ::asynchronous::prelude::*;
//! use diesel_occ::{Error, RetryPolicy};
//!
//! async fn rename(pool: &Pool<AsyncPgConnection>, id: i64, name: String) -> Result<Order, Error> {
//!     let done = Order::modify_pooled(pool, &id, &RetryPolicy::default(), move |order| {
//!         order.name = name.clone();
//!         Ok::<_, Error>(())
//!     })
//!     .await?;
//!     Ok(done.row)
//! }
//! # }
//! ```
//!
//! A helper generic in the connection names one bound for each write it makes: the
//! write as a value of [`crate::op`] and [`AsyncRun`], e.g.
//! `Update<Order, Ch>: AsyncRun<C>` (see [`crate::op`] for an example).
//!
//! The statements, the checks made before sending, the judgement of an answer and the
//! classification of errors are the blocking path's own; on PostgreSQL and MySQL only the
//! sending differs (each statement is awaited). SQLite's diesel-async connection is a
//! blocking connection on a thread of its own, so there each call runs whole on that
//! thread, exactly as the blocking API runs it (immediate transactions, the fair write
//! queue).
//!
//! # Cancellation
//!
//! Every future here may be dropped at any `.await` (a request timeout, a `select!`):
//!
//! - a write that is one statement either reached the database whole or not at all;
//! - a transaction the library opened (a read-modify-write attempt, MySQL's read-back of
//!   a new token, a savepoint in the caller's PostgreSQL transaction) that is dropped
//!   before it ended marks the connection's transaction manager broken, and the library
//!   sends nothing more on it ([`Error::Database`](crate::Error) with diesel's
//!   `BrokenTransactionManager`). Closing the connection ends the transaction on the
//!   server. bb8 closes a broken connection when it comes back; deadpool only when it
//!   would hand it out again, so until then the transaction stays open and keeps its row
//!   locks (on SQLite the database's write lock). Connections the library checks out of
//!   a deadpool pool, and those you check out with [`AsyncConnectionSource::checkout`]
//!   (a [`DeadpoolCheckout`]), leave the pool and close when put back broken; wrap a
//!   connection from deadpool's own `Pool::get` with `DeadpoolCheckout::from` to get the
//!   same. A transaction you began yourself with a raw `BEGIN` is not seen by either
//!   pool.
//! - on MySQL, whose client cannot drop a statement half read, any call dropped before it
//!   ended marks the connection broken the same way;
//! - on SQLite a call runs to its end on the connection's thread, then the result is
//!   dropped (diesel-async waits for that thread when the future is dropped, which needs
//!   tokio's multi-thread runtime). The calls that run your async code inside their
//!   transaction (a write transaction, a guarded operation, a transition hook, work on a
//!   locked row, a write while a lock is held) are transactions of the library's as
//!   above: dropped before they ended, they leave the connection marked broken.

mod batch;
mod bulk;
#[cfg(feature = "locks")]
mod claim;
pub(crate) mod entity;
#[cfg(feature = "locks")]
mod fence;
#[cfg(feature = "locks")]
mod held;
mod insert;
mod json;
#[cfg(feature = "locks")]
mod leader;
#[cfg(feature = "locks")]
mod lease;
#[cfg(feature = "locks")]
mod lock_connection;
#[cfg(feature = "locks")]
mod locks;
mod modify;
mod pessimistic;
mod reply_timeout;
mod run;
mod source;
#[cfg(feature = "sqlite")]
mod sqlite;
mod transition;
mod version_row;
mod write_transaction;

pub use crate::drive::on_async::send::AsyncLoadByKey;
pub use batch::AsyncGuardedBatch;
pub use bulk::AsyncGuardedBulk;
#[cfg(feature = "locks")]
pub use claim::AsyncGuardedClaim;
pub use entity::AsyncGuardedWrite;
#[cfg(feature = "locks")]
pub use fence::AsyncFencedWrite;
pub use json::AsyncGuardedJson;
#[cfg(feature = "locks")]
pub use leader::AsyncCandidate;
#[cfg(feature = "locks")]
pub use lease::AsyncLease;
#[cfg(feature = "locks")]
pub use locks::{AsyncLockGuard, AsyncLocks};
pub use modify::AsyncGuardedModify;
pub use pessimistic::AsyncPessimistic;
pub use reply_timeout::establish_with_reply_timeout;
#[cfg(any(feature = "bb8", feature = "async-deadpool"))]
pub use reply_timeout::manager_config_with_reply_timeout;
#[cfg(all(
    feature = "async-mysql",
    any(feature = "bb8", feature = "async-deadpool")
))]
pub(crate) use reply_timeout::recycling_check;
pub use run::AsyncRun;
pub use source::AsyncConnectionSource;
#[cfg(feature = "async-deadpool")]
pub use source::DeadpoolCheckout;
pub use transition::{record, AsyncGuardedTransition};
pub use version_row::guarded_operation;
pub use write_transaction::{AsyncWriteConnection, LockedWork, TransactionWork, TransitionHook};

/// The async traits, to import with `use diesel_occ::asynchronous::prelude::*`.
pub mod prelude {
    #[cfg(feature = "locks")]
    pub use super::{AsyncFencedWrite, AsyncGuardedClaim};
    pub use super::{
        AsyncGuardedBatch, AsyncGuardedBulk, AsyncGuardedJson, AsyncGuardedModify,
        AsyncGuardedTransition, AsyncGuardedWrite, AsyncLoadByKey, AsyncPessimistic,
        AsyncWriteConnection,
    };
}
