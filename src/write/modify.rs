//! Read-modify-write with retry: read the row, let the caller change it, write it back
//! under its guard, and on a conflict start again from the read.
//!
//! Each attempt runs in a fresh write transaction (on SQLite an immediate one) on a
//! connection from [`Connections`]: the caller's own connection, or a pool, which may
//! hand each attempt another connection. An attempt never runs again inside a
//! transaction that failed: the transaction is rolled back first, and the next attempt
//! reads again.
//!
//! The first attempt reads without a lock. Under the default
//! [`Contention::LockWhenContended`], a retry reads the row with its lock (`FOR UPDATE`)
//! so that it cannot lose again, and a row that conflicted in the last second is read that
//! way from the first attempt: on a hot row the writers queue on the row lock instead of
//! colliding over and over. [`Contention::Optimistic`] keeps every read lock-free.
//!
//! Inside a transaction the caller already opened, a retry could not undo the caller's
//! earlier work, so exactly one attempt runs (in a savepoint) and a conflict comes back as
//! [`Error::Conflict`]: the caller retries its own transaction as a whole, for example
//! with [`RetryPolicy::run`].

use diesel::connection::{Connection, LoadConnection};

use crate::connect::backend::OccBackend;
use crate::connect::source::ConnectionSource;
use crate::connect::transaction::{commit_operation, WriteTransaction};
use crate::error::{connection_lost, Error, RetryReason};
use crate::guard::{Guarded, TokenOf};
use crate::retry::{Contention, RetryPolicy, Stop};
use crate::sql::statement::RowLock;
use crate::write::entity::{with_sources, GuardedWrite, LoadByKey, UpdateRow};
use crate::write::executor::{classify, in_transaction};
use crate::write::hot_rows::HotRow;

/// Where the attempts of a retried operation get their connection.
pub trait Connections {
    /// The connection an attempt runs on.
    type Connection: Connection;

    /// Whether each attempt gets a connection of its own, so that an attempt whose
    /// connection died before its `COMMIT` (nothing written) can run again on another.
    const FRESH_PER_ATTEMPT: bool = false;

    /// Runs `f` on a connection for one attempt.
    fn with<T>(&mut self, f: impl FnOnce(&mut Self::Connection) -> T) -> Result<T, Error>;
}

/// The caller's connection serves every attempt.
impl<C: Connection> Connections for &mut C {
    type Connection = C;

    fn with<T>(&mut self, f: impl FnOnce(&mut C) -> T) -> Result<T, Error> {
        Ok(f(self))
    }
}

/// Each attempt checks a connection out of the pool and returns it when done, so a
/// connection that died is replaced and waits between attempts hold none.
impl<S: ConnectionSource> Connections for &S {
    type Connection = S::Connection;

    const FRESH_PER_ATTEMPT: bool = true;

    fn with<T>(&mut self, f: impl FnOnce(&mut S::Connection) -> T) -> Result<T, Error> {
        self.on_connection(f)
    }
}

/// What a successful read-modify-write gives back.
#[derive(Debug)]
#[non_exhaustive]
pub struct Modified<T: Guarded, R> {
    /// The row as written, holding its new token.
    pub row: T,
    /// The row's new token.
    pub token: TokenOf<T>,
    /// What the caller's closure returned on the attempt that was written.
    pub value: R,
    /// How many attempts it took (1 when nothing conflicted).
    pub attempts: u32,
}

/// Read-modify-write with retry for every [`Guarded`] entity.
pub trait GuardedModify: GuardedWrite + Clone {
    /// Reads the row with `key`, hands it to `change`, and saves every updatable field of
    /// the changed copy under the row's guard
    /// ([`guarded_save_from`](GuardedWrite::guarded_save_from)), every attempt on `conn`.
    /// A conflict or a transient database error starts again from the read, as `policy`
    /// allows; `change` runs once per attempt, so it must not have effects outside the
    /// row.
    ///
    /// `change` may stop with the caller's own error (`Err(MyError::AlreadyCancelled)`):
    /// nothing is written and that error comes back as it is. diesel-occ's errors reach the
    /// caller through `E: From<Error>` ([`Error`] itself qualifies): [`Error::NotFound`],
    /// [`Error::RetriesExhausted`] with the last conflict, ...
    fn modify<C, R, E>(
        conn: &mut C,
        key: &Self::Key,
        policy: &RetryPolicy,
        change: impl FnMut(&mut Self) -> Result<R, E>,
    ) -> Result<Modified<Self, R>, E>
    where
        C: LoadConnection + WriteTransaction,
        C::Backend: OccBackend,
        Self: UpdateRow<C, <Self as Guarded>::Changes>,
        E: From<Error>,
    {
        modify_on(conn, key, policy, change)
    }

    /// [`modify`](Self::modify) with a connection from `pool` (r2d2, deadpool-diesel, any
    /// [`ConnectionSource`]) for each attempt, so that a
    /// connection that died is replaced and the waits between attempts hold none. An
    /// attempt whose connection died before its `COMMIT` wrote nothing and runs again
    /// ([`RetryReason::ConnectionLost`], as `policy` allows); one whose `COMMIT` lost the
    /// connection may have landed and stops with [`Error::Ambiguous`].
    fn modify_pooled<S, R, E>(
        pool: &S,
        key: &Self::Key,
        policy: &RetryPolicy,
        change: impl FnMut(&mut Self) -> Result<R, E>,
    ) -> Result<Modified<Self, R>, E>
    where
        S: ConnectionSource,
        S::Connection: LoadConnection + WriteTransaction,
        <S::Connection as Connection>::Backend: OccBackend,
        Self: UpdateRow<S::Connection, <Self as Guarded>::Changes>,
        E: From<Error>,
    {
        modify_on(pool, key, policy, change)
    }
}

/// [`GuardedModify::modify`] on any [`Connections`].
fn modify_on<T, S, R, E>(
    source: S,
    key: &T::Key,
    policy: &RetryPolicy,
    mut change: impl FnMut(&mut T) -> Result<R, E>,
) -> Result<Modified<T, R>, E>
where
    T: GuardedWrite + Clone + UpdateRow<S::Connection, <T as Guarded>::Changes>,
    S: Connections,
    S::Connection: LoadConnection + WriteTransaction,
    <S::Connection as Connection>::Backend: OccBackend,
    E: From<Error>,
{
    let suspects = T::GUARD_COLUMNS.join(", ");
    read_modify_write(source, key, policy, &suspects, |conn, original: &T| {
        let mut row = original.clone();
        let value = change(&mut row).map_err(Stop::Caller)?;
        let token = row.guarded_save_from(conn, original)?;
        Ok((row, token, value))
    })
}

impl<T: GuardedWrite + Clone> GuardedModify for T {}

/// The row with `key`, read for an attempt: plainly, so that the attempt is optimistic
/// (the guarded write finds out whether someone else wrote meanwhile), or with `lock`
/// (`FOR UPDATE`) when the row is contended. A row that does not read as `T` is
/// [`Error::InvalidData`] naming `suspects`, the columns whose NULL or malformed value
/// would do that.
pub(crate) fn read_for_attempt<T, C, E>(
    conn: &mut C,
    key: &T::Key,
    lock: RowLock,
    suspects: &str,
) -> Result<T, Stop<E>>
where
    T: LoadByKey<C>,
    C: LoadConnection,
    C::Backend: OccBackend,
{
    let read = match lock {
        RowLock::None => T::read_by_key(conn, key),
        lock => T::lock_by_key(conn, key, lock),
    };
    attempt_read(T::table_name(), key, suspects, read, |e| classify(conn, e))
}

/// The row an attempt read of `table`, or why there is none: [`Error::NotFound`],
/// [`Error::InvalidData`] naming `suspects`, or the read's error as `classify` says.
pub(crate) fn attempt_read<T, E>(
    table: &'static str,
    key: &impl std::fmt::Debug,
    suspects: &str,
    read: diesel::QueryResult<Option<T>>,
    classify: impl FnOnce(diesel::result::Error) -> Error,
) -> Result<T, Stop<E>> {
    match read {
        Ok(Some(row)) => Ok(row),
        Ok(None) => Err(Stop::Occ(Error::NotFound {
            table,
            key: format!("{key:?}"),
        })),
        Err(diesel::result::Error::DeserializationError(cause)) => {
            Err(Stop::Occ(Error::InvalidData {
                table,
                column: suspects.to_string(),
                reason: format!("row {key:?} cannot be read: {}", with_sources(&*cause)),
            }))
        }
        Err(e) => Err(Stop::Occ(classify(e))),
    }
}

/// The row memory of a retried read-modify-write: the row's entry and for how long a
/// conflict marks it hot, under [`Contention::LockWhenContended`] only.
#[derive(Clone, Copy)]
pub(crate) struct Contended(Option<(HotRow, std::time::Duration)>);

impl Contended {
    /// The memory of the row with `key` of `table`, as `policy` asks for it.
    pub(crate) fn of(
        policy: &RetryPolicy,
        table: &'static str,
        key: &impl std::fmt::Debug,
    ) -> Self {
        Contended(match policy.contention_mode() {
            Contention::LockWhenContended { hot_for } => Some((HotRow::of(table, key), hot_for)),
            Contention::Optimistic => None,
        })
    }

    /// How attempt `number` reads the row: with its lock on a retry or a hot row.
    pub(crate) fn lock_for(self, number: u32) -> RowLock {
        match self.0 {
            Some((row, hot_for)) if number > 1 || row.is_hot(hot_for) => RowLock::ForUpdate,
            _ => RowLock::None,
        }
    }

    /// An attempt's result, after marking the row hot on a conflict. With a connection
    /// per attempt (`fresh_per_attempt`), a connection lost before the `COMMIT` (a lost
    /// `COMMIT` is `Ambiguous` by now) wrote nothing and is retryable on another one.
    pub(crate) fn settle<V, E>(
        self,
        result: Result<V, Stop<E>>,
        fresh_per_attempt: bool,
    ) -> Result<V, Stop<E>> {
        if let (Err(Stop::Occ(Error::Conflict(_))), Some((row, hot_for))) = (&result, self.0) {
            row.mark(hot_for);
        }
        match result {
            Err(Stop::Occ(Error::Database(source)))
                if fresh_per_attempt && connection_lost(&source) =>
            {
                Err(Stop::Occ(Error::Retryable {
                    reason: RetryReason::ConnectionLost,
                    source,
                }))
            }
            other => other,
        }
    }
}

/// Whether `conn` is inside a transaction its caller opened: then an operation makes one
/// attempt only, since a retry could not roll back the caller's earlier work.
pub(crate) fn in_caller_transaction<C: Connection>(conn: &mut C) -> bool {
    in_transaction(conn)
}

/// Runs `attempt` (given the connection and the row as read) in a write transaction per
/// attempt, retried by `policy`, reading the row with its lock once it is contended as
/// `policy`'s [`Contention`] says; see the module documentation for transactions the
/// caller opened. `attempt` returns the row as written, its new token and the caller's value.
/// `suspects` names the columns an unreadable row is blamed on.
pub(crate) fn read_modify_write<T, S, R, E>(
    mut source: S,
    key: &T::Key,
    policy: &RetryPolicy,
    suspects: &str,
    mut attempt: impl FnMut(&mut S::Connection, &T) -> Result<(T, TokenOf<T>, R), Stop<E>>,
) -> Result<Modified<T, R>, E>
where
    T: LoadByKey<S::Connection>,
    S: Connections,
    S::Connection: LoadConnection + WriteTransaction,
    <S::Connection as Connection>::Backend: OccBackend,
    E: From<Error>,
{
    let nested = source.with(in_caller_transaction)?;
    let policy = if nested {
        policy.clone().max_attempts(1)
    } else {
        policy.clone()
    };
    // Only under `LockWhenContended` (the key is formatted once per call, not per attempt).
    let contended = Contended::of(&policy, T::table_name(), key);
    let ((row, token, value), attempts) = policy.run(|number| {
        let lock = contended.lock_for(number);
        source.with(|conn| {
            let result = commit_operation(conn, |conn| {
                let original = read_for_attempt::<T, _, E>(conn, key, lock, suspects)?;
                attempt(conn, &original)
            });
            contended.settle(result, S::FRESH_PER_ATTEMPT)
        })?
    })?;
    Ok(Modified {
        row,
        token,
        value,
        attempts,
    })
}
