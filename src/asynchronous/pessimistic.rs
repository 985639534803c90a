//! Pessimistic helpers on diesel-async connections: the blocking
//! [`Pessimistic`](crate::Pessimistic), with work that is an `async` closure given the
//! connection, on the write transaction that holds the row locked.

use std::future::Future;

use diesel_async::AsyncConnection;

use super::write_transaction::{AsyncWriteConnection, LockedWork};
use crate::connect::backend::OccBackend;
use crate::drive::on_async::connection::{classifier, refuse_broken};
use crate::drive::on_async::send::AsyncLoadByKey;
use crate::drive::on_async::transaction::OwnTransaction;
use crate::error::Error;
use crate::flow::row_read::{AfterLock, LockedRead};
use crate::guard::{Guarded, TokenOf};
use crate::retry::Stop;
use crate::sql::statement::RowLock;
use crate::write::pessimistic::{row_lock, still_expected, LockWait};

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
async fn locked<T, C, R, E, W>(
    conn: &mut C,
    key: &T::Key,
    expected: Option<&TokenOf<T>>,
    wait: LockWait,
    work: W,
) -> Result<R, E>
where
    T: AsyncLoadByKey<C> + Send,
    C: AsyncWriteConnection,
    W: for<'r> LockedWork<'r, C, T, R, E> + Send,
    R: Send,
    E: From<Error> + Send,
{
    refuse_broken(conn)?;
    let mut transaction = OwnTransaction::begin_write(conn).await?;
    let result = async {
        let conn = transaction.conn();
        let suspects = T::GUARD_COLUMNS.join(", ");
        let row = read_locked::<T, C>(conn, key, row_lock(wait), &suspects).await?;
        let row = still_expected::<T>(T::table_name(), key, expected, row)?;
        work(conn, row).await.map_err(Stop::Caller)
    }
    .await;
    let result = transaction.settle(result).await;
    result.map_err(Stop::into_error)
}

/// The row with `key` read with `lock` on the library's write transaction; when it is not
/// there, why: another transaction holds it (a skipped row that exists), or it is missing.
pub(crate) async fn read_locked<T, C>(
    conn: &mut C,
    key: &T::Key,
    lock: RowLock,
    suspects: &str,
) -> Result<T, Error>
where
    T: AsyncLoadByKey<C>,
    C: AsyncConnection,
    C::Backend: OccBackend,
{
    let read = LockedRead::new(T::table_name(), key, suspects);
    let locked = T::lock_by_key(conn, key, lock).await;
    let classify = classifier(conn, locked.as_ref().err()).await;
    match read.locked(locked, |e| classify.classify(e)) {
        AfterLock::Done(row) => row,
        AfterLock::ReadUnlocked => {
            let unlocked = T::read_by_key(conn, key).await;
            let classify = classifier(conn, unlocked.as_ref().err()).await;
            read.unlocked(unlocked, |e| classify.classify(e))
        }
    }
}
