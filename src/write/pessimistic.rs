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

use diesel::connection::LoadConnection;

use crate::connect::backend::OccBackend;
use crate::connect::transaction::{commit_operation, WriteTransaction};
use crate::drive::blocking::load::LoadByKey;
use crate::error::Error;
use crate::flow::miss::RowMoved;
use crate::flow::row_read::{AfterLock, LockedRead};
use crate::guard::{Guarded, TokenOf};
use crate::retry::Stop;
use crate::sql::statement::RowLock;

use crate::drive::blocking::executor::classify;

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
    let lock = row_lock(wait);
    let result = commit_operation(conn, |conn| -> Result<R, Stop<E>> {
        let table = T::table_name();
        let row = read_locked::<T, C>(conn, key, lock, &T::GUARD_COLUMNS.join(", "))?;
        let row = still_expected::<T>(table, key, expected, row)?;
        work(conn, row).map_err(Stop::Caller)
    });
    result.map_err(Stop::into_error)
}

/// The row lock to read with for `wait`.
pub(crate) fn row_lock(wait: LockWait) -> RowLock {
    match wait {
        LockWait::Wait => RowLock::ForUpdate,
        LockWait::NoWait => RowLock::SkipLocked,
    }
}

/// The row with `key`, read with `lock` ([`LockedRead`] judges the answers): the
/// blocking driver of the locked read.
pub(crate) fn read_locked<T, C>(
    conn: &mut C,
    key: &T::Key,
    lock: RowLock,
    suspects: &str,
) -> Result<T, Error>
where
    T: LoadByKey<C>,
    C: LoadConnection,
    C::Backend: OccBackend,
{
    let read = LockedRead::new(T::table_name(), key, suspects);
    match read.locked(T::lock_by_key(conn, key, lock), |e| classify(conn, e)) {
        AfterLock::Done(row) => row,
        AfterLock::ReadUnlocked => read.unlocked(T::read_by_key(conn, key), |e| classify(conn, e)),
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
