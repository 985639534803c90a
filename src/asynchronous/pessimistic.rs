//! Pessimistic helpers on diesel-async connections: the blocking
//! [`Pessimistic`](crate::Pessimistic), with work that is an `async` closure given the
//! connection, on the write transaction that holds the row locked.

use std::future::Future;

use super::write_transaction::{AsyncWriteConnection, LockedWork};
use crate::drive::on_async::send::AsyncLoadByKey;
use crate::error::Error;
use crate::guard::{Guarded, TokenOf};
use crate::write::pessimistic::{locked_on, LockWait, RowWork};

/// Pessimistic work on one row on an async connection; see
/// [`Pessimistic`](crate::Pessimistic) for what each call does and answers.
pub trait AsyncPessimistic: Guarded {
    /// Runs `work` (given the connection and the row) on a write transaction with the row
    /// with `key` locked until it ends, and commits; when `work` fails, everything rolls
    /// back and its error comes back unchanged. See
    /// [`Pessimistic::with_row_locked`](crate::Pessimistic::with_row_locked).
    fn with_row_locked<'a, C, R, E, W>(
        conn: &'a mut C,
        key: &'a Self::Key,
        wait: LockWait,
        work: W,
    ) -> impl Future<Output = Result<R, E>> + Send + 'a
    where
        C: AsyncWriteConnection,
        Self: AsyncLoadByKey<C> + Send,
        W: for<'r> LockedWork<'r, C, Self, R, E> + Send + 'a,
        R: Send + 'a,
        E: From<Error> + Send + 'a,
    {
        locked(conn, key, None, wait, work)
    }

    /// Locks this loaded copy's row as [`with_row_locked`](Self::with_row_locked) does,
    /// and runs `work` only if the row still holds the copy's token; see
    /// [`Pessimistic::with_copy_locked`](crate::Pessimistic::with_copy_locked).
    fn with_copy_locked<'a, C, R, E, W>(
        &'a self,
        conn: &'a mut C,
        wait: LockWait,
        work: W,
    ) -> impl Future<Output = Result<R, E>> + Send + 'a
    where
        C: AsyncWriteConnection,
        Self: AsyncLoadByKey<C> + Send + Sync,
        W: for<'r> LockedWork<'r, C, Self, R, E> + Send + 'a,
        R: Send + 'a,
        E: From<Error> + Send + 'a,
    {
        async move {
            let (key, token) = (self.key(), self.token());
            locked(conn, &key, Some(&token), wait, work).await
        }
    }
}

impl<T: Guarded> AsyncPessimistic for T {}

/// The row with `key` locked in a write transaction (and, if `expected` is given, still
/// holding that token), handed to `work`; committed when `work` succeeds.
fn locked<'a, T, C, R, E, W>(
    conn: &'a mut C,
    key: &'a T::Key,
    expected: Option<&'a TokenOf<T>>,
    wait: LockWait,
    work: W,
) -> impl Future<Output = Result<R, E>> + Send + 'a
where
    T: AsyncLoadByKey<C> + Send,
    C: AsyncWriteConnection,
    W: for<'r> LockedWork<'r, C, T, R, E> + Send + 'a,
    R: Send + 'a,
    E: From<Error> + Send + 'a,
{
    locked_on(conn, key, expected, wait, OnAsync(work))
}

/// An async closure given the connection and the row.
struct OnAsync<W>(W);

impl<C, T, R, E, W> RowWork<C, T, R, E> for OnAsync<W>
where
    W: for<'r> LockedWork<'r, C, T, R, E>,
{
    fn work(self, conn: &mut C, row: T) -> impl Future<Output = Result<R, E>> {
        (self.0)(conn, row)
    }
}
