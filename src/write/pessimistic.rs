//! Pessimistic helpers: for rows so contended that optimistic writes would
//! mostly retry, lock the row first and work on it without conflicts.
//!
//! [`with_row_locked`](Pessimistic::with_row_locked) opens a write transaction, reads the
//! row with `SELECT ... FOR UPDATE` (PostgreSQL, MySQL / MariaDB), runs the closure on the
//! transaction with the row, and commits. On SQLite the write transaction is immediate and
//! exclusive, which serves the same purpose. With [`LockWait::NoWait`] a row another
//! transaction holds is [`Error::LockHeld`] at once instead of a wait: the read uses
//! `SKIP LOCKED`, and a row it skipped but that exists is reported as held (no reliance
//! on each server's error code for `NOWAIT`). SQLite cannot refuse without waiting: a busy
//! database waits for the busy timeout, then fails as retryable.

use std::future::{ready, Future};

use diesel::connection::LoadConnection;

use crate::connect::backend::OccBackend;
use crate::connect::transaction::WriteTransaction;
use crate::drive::blocking::load::LoadByKey;
use crate::drive::{now, settled, Blocking, End, ReadRow, WriteAttempt};
use crate::error::Error;
use crate::flow::miss::RowMoved;
use crate::flow::row_read::{AfterLock, LockedRead};
use crate::guard::{Guarded, TokenOf};
use crate::retry::Stop;
use crate::sql::statement::RowLock;
use crate::telemetry::Call;

/// Whether a locked read waits for a row another transaction holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockWait {
    /// Wait (up to the server's lock wait timeout, which is then retryable).
    Wait,
    /// Do not wait: [`Error::LockHeld`] at once.
    NoWait,
}

/// Pessimistic work on one row, for every entity the executor can read.
pub trait Pessimistic: crate::guard::Guarded {
    /// Runs `work` on a write transaction with the row with `key` locked until it ends,
    /// and commits; `work` may write the row and others freely (no guard needed: nobody
    /// else can write the row meanwhile). When `work` fails, everything rolls back and its
    /// error comes back unchanged. A missing row is [`Error::NotFound`].
    fn with_row_locked<C, R, E>(
        conn: &mut C,
        key: &Self::Key,
        wait: LockWait,
        work: impl FnOnce(&mut C, Self) -> Result<R, E>,
    ) -> Result<R, E>
    where
        C: LoadConnection + WriteTransaction,
        C::Backend: OccBackend,
        Self: LoadByKey<C>,
        E: From<Error>,
    {
        locked(conn, key, None, wait, work)
    }

    /// Locks this loaded copy's row as [`with_row_locked`](Self::with_row_locked) does,
    /// and runs `work` only if the row still holds the copy's token: a copy shown to a
    /// user and then confirmed ("lock what I saw") is never applied over a change made
    /// in between. The token is compared on the row the locking read returns, so the
    /// check and the lock are one statement. A row that moved on is [`Error::Conflict`]
    /// with the current row, and nothing runs.
    fn with_copy_locked<C, R, E>(
        &self,
        conn: &mut C,
        wait: LockWait,
        work: impl FnOnce(&mut C, Self) -> Result<R, E>,
    ) -> Result<R, E>
    where
        C: LoadConnection + WriteTransaction,
        C::Backend: OccBackend,
        Self: LoadByKey<C>,
        E: From<Error>,
    {
        locked(conn, &self.key(), Some(&self.token()), wait, work)
    }
}

impl<T: crate::guard::Guarded> Pessimistic for T {}

/// The row with `key` locked in a write transaction (and, if `expected` is given, still
/// holding that token), handed to `work`; committed when `work` succeeds.
fn locked<T, C, R, E>(
    conn: &mut C,
    key: &T::Key,
    expected: Option<&TokenOf<T>>,
    wait: LockWait,
    work: impl FnOnce(&mut C, T) -> Result<R, E>,
) -> Result<R, E>
where
    C: LoadConnection + WriteTransaction,
    C::Backend: OccBackend,
    T: LoadByKey<C>,
    E: From<Error>,
{
    let work = OnBlocking(work);
    now(locked_on(Blocking::wrap(conn), key, expected, wait, work))
}

/// Work on a locked row on connection `C`: the caller's closure, sync on the blocking
/// driver, awaited on the async one.
pub(crate) trait RowWork<C, T, R, E> {
    /// Runs it on `conn` with `row`.
    fn work(self, conn: &mut C, row: T) -> impl Future<Output = Result<R, E>>;
}

/// A blocking closure given the connection and the row.
struct OnBlocking<F>(F);

impl<C, T, R, E, F> RowWork<Blocking<C>, T, R, E> for OnBlocking<F>
where
    F: FnOnce(&mut C, T) -> Result<R, E>,
{
    fn work(self, conn: &mut Blocking<C>, row: T) -> impl Future<Output = Result<R, E>> {
        ready((self.0)(conn.inner(), row))
    }
}

/// The row with `key` locked in a write transaction of the library's (and, if `expected`
/// is given, still holding that token), handed to `work`; committed when `work`
/// succeeds, on either driver.
pub(crate) async fn locked_on<T, C, R, E, W>(
    conn: &mut C,
    key: &T::Key,
    expected: Option<&TokenOf<T>>,
    wait: LockWait,
    work: W,
) -> Result<R, E>
where
    C: WriteAttempt,
    T: ReadRow<C>,
    W: RowWork<C, T, R, E>,
    E: From<Error>,
{
    let call = Call::new::<C::Backend>("locked", T::table_name(), Some(key));
    // The call reports the library's error; the work's own is the caller's.
    let locked = async move {
        let nested = conn.caller_transaction().map_err(Stop::Occ)?;
        let suspects = T::GUARD_COLUMNS.join(", ");
        let body = async |conn: &mut C| -> (End, Result<R, Stop<E>>) {
            let result = async {
                let row = read_locked_on::<T, C>(conn, key, row_lock(wait), &suspects).await?;
                let row = still_expected::<T>(T::table_name(), key, expected, row)?;
                work.work(conn, row).await.map_err(Stop::Caller)
            }
            .await;
            (End::after(&result), result)
        };
        let ended = conn.write_transaction(body).await;
        settled(ended, nested)
    };
    let locked = call.run_as(locked, |stop| match stop {
        Stop::Occ(error) => Some(error),
        Stop::Caller(_) => None,
    });
    locked.await.map_err(Stop::into_error)
}

/// The row lock to read with for `wait`.
pub(crate) fn row_lock(wait: LockWait) -> RowLock {
    match wait {
        LockWait::Wait => RowLock::ForUpdate,
        LockWait::NoWait => RowLock::SkipLocked,
    }
}

/// The row with `key` read with `lock` inside a write transaction of the library's, on
/// either driver; when it is not there, why: another transaction holds it (a skipped row
/// that exists), or it is missing.
pub(crate) async fn read_locked_on<T, C>(
    conn: &mut C,
    key: &T::Key,
    lock: RowLock,
    suspects: &str,
) -> Result<T, Error>
where
    C: WriteAttempt,
    T: ReadRow<C>,
{
    let read = LockedRead::new(T::table_name(), key, suspects);
    let locked = T::read_row(conn, key, lock).await;
    let classifier = conn.classifier(locked.as_ref().err()).await;
    match read.locked(locked, |e| classifier.classify(e)) {
        AfterLock::Done(row) => row,
        AfterLock::ReadUnlocked => {
            let unlocked = T::read_row(conn, key, RowLock::None).await;
            let classifier = conn.classifier(unlocked.as_ref().err()).await;
            read.unlocked(unlocked, |e| classifier.classify(e))
        }
    }
}

/// The locked `row`, or, when it no longer holds the token `expected`, the conflict with
/// it: the locked read returned the latest row, which explains the miss as a guarded
/// write's re-read would.
pub(crate) fn still_expected<T: Guarded>(
    table: &'static str,
    key: &T::Key,
    expected: Option<&TokenOf<T>>,
    row: T,
) -> Result<T, Error> {
    match expected {
        Some(expected) if row.token() != *expected => {
            Err(RowMoved::<T>::expecting(key, expected).given_in(table, Some(row)))
        }
        _ => Ok(row),
    }
}
