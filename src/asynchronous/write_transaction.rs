//! The write transaction of an async operation that hands the connection to caller code
//! (a transition hook, work on a locked row), and the shapes of that code.
//!
//! On PostgreSQL and MySQL it is a plain transaction. On SQLite it is what the blocking
//! API opens: `BEGIN IMMEDIATE`, after this process's earlier writers (the fair write
//! queue), so the operation never fails half way for want of the write lock; the turn is
//! held until the transaction ends, as the blocking path holds it.

use std::future::Future;

use diesel::QueryResult;
use diesel_async::{AsyncConnection, TransactionManager};

use super::connection::NativeAsyncConnection;
use crate::connect::backend::OccBackend;
use crate::status::HasStatus;

/// A diesel-async connection on which the library opens write transactions that run
/// caller code: `AsyncPgConnection`, `AsyncMysqlConnection` and
/// `SyncConnectionWrapper<SqliteConnection>`.
pub trait AsyncWriteConnection: AsyncConnection<Backend: OccBackend> + Send {
    /// Begins the write transaction (a savepoint inside an open one).
    #[doc(hidden)]
    fn begin_write(&mut self) -> impl Future<Output = QueryResult<WriteTurn>> + Send;
}

impl<C> AsyncWriteConnection for C
where
    C: NativeAsyncConnection + Send,
    C::Backend: OccBackend,
{
    async fn begin_write(&mut self) -> QueryResult<WriteTurn> {
        C::TransactionManager::begin_transaction(self).await?;
        Ok(WriteTurn::default())
    }
}

/// This process's SQLite write turn, held until the transaction ends (nothing elsewhere).
#[doc(hidden)]
#[derive(Default)]
pub struct WriteTurn {
    #[cfg(feature = "sqlite")]
    pub(crate) _turn: Option<crate::connect::write_gate::Turn>,
}

/// A transition hook on an async connection: given the connection (on the move's
/// transaction), the state the row left and the row as moved, it returns a future; an
/// `async` closure, `async |conn, from, row| { ... }`, is one. Not a trait to implement.
pub trait TransitionHook<'r, C: 'r, T: HasStatus + 'r, E>:
    FnOnce(&'r mut C, T::Status, &'r T) -> <Self as TransitionHook<'r, C, T, E>>::Fut
{
    /// The hook's future.
    type Fut: Future<Output = Result<(), E>> + Send;
}

impl<'r, F, Fut, C: 'r, T: HasStatus + 'r, E> TransitionHook<'r, C, T, E> for F
where
    F: FnOnce(&'r mut C, T::Status, &'r T) -> Fut,
    Fut: Future<Output = Result<(), E>> + Send,
{
    type Fut = Fut;
}

/// Work on a locked row on an async connection: given the connection (on the lock's
/// transaction) and the row, it returns a future; an `async` closure,
/// `async |conn, row| { ... }`, is one. Not a trait to implement.
pub trait LockedWork<'r, C: 'r, T, R, E>:
    FnOnce(&'r mut C, T) -> <Self as LockedWork<'r, C, T, R, E>>::Fut
{
    /// The work's future.
    type Fut: Future<Output = Result<R, E>> + Send;
}

impl<'r, F, Fut, C: 'r, T, R, E> LockedWork<'r, C, T, R, E> for F
where
    F: FnOnce(&'r mut C, T) -> Fut,
    Fut: Future<Output = Result<R, E>> + Send,
{
    type Fut = Fut;
}
