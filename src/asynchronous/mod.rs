//! The library on diesel-async connections (feature `async`): guarded writes and
//! read-modify-write with retry as futures, on `AsyncPgConnection`,
//! `AsyncMysqlConnection` and `SyncConnectionWrapper<SqliteConnection>` (and the
//! connections of their bb8 and deadpool pools).
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
//!   before it ended marks the connection's transaction manager broken: bb8 and
//!   deadpool discard such a connection (closing it ends the transaction on the server),
//!   and the library sends nothing more on it ([`Error::Database`](crate::Error) with
//!   diesel's `BrokenTransactionManager`). A connection of your own must then be dropped.
//! - on SQLite the call runs to its end on the connection's thread, then the result is
//!   dropped.

mod connection;
mod entity;
mod executor;
mod modify;
mod send;
#[cfg(feature = "sqlite")]
mod sqlite;
mod transaction;

pub use connection::{NativeAsync, NativeAsyncConnection};
pub use entity::{AsyncDeleteRow, AsyncGuardedWrite, AsyncUpdateRow};
pub use modify::{AsyncGuardedModify, AsyncModifyRow};
pub use send::{AsyncComplete, AsyncLoadByKey, AsyncReadsBack};

/// The async traits, to import with `use diesel_occ::asynchronous::prelude::*`.
pub mod prelude {
    pub use super::{AsyncGuardedModify, AsyncGuardedWrite};
}
