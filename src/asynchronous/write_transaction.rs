//! The write transaction of an async operation that hands the connection to caller code
//! (a transition hook, work on a locked row), and the shapes of that code.
//!
//! On PostgreSQL and MySQL it is a plain transaction. On SQLite it is what the blocking
//! API opens: `BEGIN IMMEDIATE`, after this process's earlier writers (the fair write
//! queue), so the operation never fails half way for want of the write lock; the turn is
//! held until the transaction ends, as the blocking path holds it.

use std::future::Future;

use crate::drive::on_async::connection::refuse_broken;
use crate::drive::on_async::transaction::{BeginWrite, OwnTransaction};
use crate::error::Error;
use crate::guard::status::HasStatus;

/// A diesel-async connection the library runs on: `AsyncPgConnection`,
/// `AsyncMysqlConnection` (feature `async-mysql`) and
/// `SyncConnectionWrapper<SqliteConnection>`, or a pool's connection of one passed as
/// `&mut *conn`. The one connection bound a helper generic in the connection names
/// besides its writes ([`AsyncRun`](super::AsyncRun)): it opens write transactions that
/// run caller code, and (feature `locks`) sends the statements of locks and leases. Not a
/// trait to implement: its two parts, `BeginWrite` and `LockStatements`, are the
/// library's own and cannot be named outside it.
pub trait AsyncWriteConnection: BeginWrite + LockStatements {
    /// Runs `work` in a transaction meant to write, as the blocking
    /// [`WriteTransaction::write_transaction`](crate::WriteTransaction::write_transaction)
    /// does: on SQLite `BEGIN IMMEDIATE`, after this process's earlier writers, so that it
    /// never fails half way for want of the write lock. Commits when `work` answers `Ok`,
    /// rolls back when it answers `Err` (which comes back unchanged); inside an open
    /// transaction it nests as a savepoint.
    ///
    /// Two differences from the blocking one: the error type converts from the library's
    /// [`Error`](crate::Error) (which converts from diesel's, so `?` on a query works), and
    /// a failed `BEGIN` or `COMMIT` is judged as the library's own transactions' are
    /// ([`Error::Retryable`](crate::Error::Retryable) for a conflict or a busy database,
    /// [`Error::Ambiguous`](crate::Error::Ambiguous) when the connection was lost at the
    /// `COMMIT`). And unlike diesel-async's `transaction`, a future dropped before the
    /// transaction ended leaves the connection marked broken, so that the library sends
    /// nothing more on it and a pool closes it (which ends the transaction on the
    /// server), rather than leaving the transaction open for the connection's next user.
    ///
    /// ```
    /// # #[cfg(feature = "postgres")]
    /// # mod example {
    /// use diesel::prelude::*;
    /// use diesel_async::{AsyncPgConnection, RunQueryDsl};
    /// use diesel_occ::asynchronous::prelude::*;
    /// use diesel_occ::Error;
    /// # diesel::table! { ledger (id) { id -> BigInt, amount -> BigInt } }
    ///
    /// /// Moves `amount` from one ledger row to another: both or neither.
    /// async fn transfer(conn: &mut AsyncPgConnection, from: i64, to: i64, amount: i64) -> Result<(), Error> {
    ///     // The parameter's type is written out: the compiler does not infer it here.
    ///     conn.write_transaction(async move |conn: &mut AsyncPgConnection| {
    ///         diesel::update(ledger::table.find(from))
    ///             .set(ledger::amount.eq(ledger::amount - amount))
    ///             .execute(conn)
    ///             .await?;
    ///         diesel::update(ledger::table.find(to))
    ///             .set(ledger::amount.eq(ledger::amount + amount))
    ///             .execute(conn)
    ///             .await?;
    ///         Ok(())
    ///     })
    ///     .await
    /// }
    /// # }
    /// ```
    fn write_transaction<'a, T, E, W>(
        &'a mut self,
        work: W,
    ) -> impl Future<Output = Result<T, E>> + Send + 'a
    where
        Self: Sized,
        W: for<'r> TransactionWork<'r, Self, T, E> + Send + 'a,
        T: Send + 'a,
        E: From<Error> + Send + 'a,
    {
        async move {
            refuse_broken(self)?;
            let mut transaction = OwnTransaction::begin_write(self).await?;
            let done = work(transaction.conn()).await;
            transaction.finish_for_caller(done).await
        }
    }
}

impl<C: BeginWrite + LockStatements> AsyncWriteConnection for C {}

/// The statements of locks, with feature `locks`.
#[cfg(feature = "locks")]
pub(crate) use super::lock_connection::LockStatements;

/// The statements of locks, with feature `locks` (without it, nothing).
#[cfg(not(feature = "locks"))]
pub trait LockStatements {}

#[cfg(not(feature = "locks"))]
impl<C> LockStatements for C {}

/// Caller code run on a connection inside a transaction the library opened (a write
/// transaction, a write while a lock is held): given the connection, it returns a future;
/// an `async` closure, `async |conn: &mut AsyncPgConnection| { ... }` (the parameter's
/// type written out), is one. Not a trait to implement.
pub trait TransactionWork<'r, C: 'r, T, E>:
    FnOnce(&'r mut C) -> <Self as TransactionWork<'r, C, T, E>>::Fut
{
    /// The work's future.
    type Fut: Future<Output = Result<T, E>> + Send;
}

impl<'r, F, Fut, C: 'r, T, E> TransactionWork<'r, C, T, E> for F
where
    F: FnOnce(&'r mut C) -> Fut,
    Fut: Future<Output = Result<T, E>> + Send,
{
    type Fut = Fut;
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
