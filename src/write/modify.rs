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
use crate::connect::source::{ConnectionSource, Connections};
use crate::connect::transaction::WriteTransaction;
use crate::drive::blocking::Sourced;
use crate::drive::read_modify_write::{read_modify_write, Step};
use crate::drive::{now, UpdateOn};
use crate::error::Error;
use crate::guard::{Guarded, TokenOf};
use crate::operation::{Modify, Operation, Run, Update};
use crate::retry::{RetryPolicy, Stop};
use crate::write::entity::{write_and_record, GuardedWrite, UpdateRow};

pub use crate::operation::modify::Modified;

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
        Modify::<Self, _, R, E>::new(key.clone(), policy.clone(), change).run(conn)
    }

    /// [`modify`](Self::modify) with a connection from `pool` (r2d2, deadpool-diesel, any
    /// [`ConnectionSource`]) for each attempt, so that a
    /// connection that died is replaced and the waits between attempts hold none. An
    /// attempt whose connection died before its `COMMIT` wrote nothing and runs again
    /// ([`RetryReason::ConnectionLost`](crate::RetryReason::ConnectionLost), as `policy`
    /// allows); one whose `COMMIT` lost the connection may have landed and stops with
    /// [`Error::Ambiguous`]. On PostgreSQL and MySQL / MariaDB, an attempt refused by a
    /// read-only server (a standby still being promoted behind a proxy) marks its
    /// connection broken, so that the pool drops it, and runs again on a new one at least
    /// 250 ms later ([`RetryReason::ReadOnly`](crate::RetryReason::ReadOnly)); a server
    /// that stays read-only ends as [`Error::ReadOnly`], or `RetriesExhausted` with it as
    /// the last error. The pool must hand out a connection to one caller at a time, as
    /// pools do.
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

impl<T, C, F, R, E> Run<C> for Modify<T, F, R, E>
where
    T: GuardedWrite + Clone + UpdateRow<C, <T as Guarded>::Changes>,
    C: LoadConnection + WriteTransaction,
    C::Backend: OccBackend,
    F: FnMut(&mut T) -> Result<R, E>,
    E: From<Error>,
{
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        modify_on(conn, &self.key, &self.policy, self.change)
    }
}

/// [`GuardedModify::modify`] on any [`Connections`].
fn modify_on<T, S, R, E>(
    source: S,
    key: &T::Key,
    policy: &RetryPolicy,
    change: impl FnMut(&mut T) -> Result<R, E>,
) -> Result<Modified<T, R>, E>
where
    T: GuardedWrite + Clone + UpdateRow<S::Connection, <T as Guarded>::Changes>,
    S: Connections,
    S::Connection: LoadConnection + WriteTransaction,
    <S::Connection as Connection>::Backend: OccBackend,
    E: From<Error>,
{
    let suspects = T::GUARD_COLUMNS.join(", ");
    let step = ChangeCopy(change);
    now(read_modify_write(
        Sourced(source),
        key,
        policy,
        &suspects,
        step,
    ))
}

impl<T: GuardedWrite + Clone> GuardedModify for T {}

/// `modify`'s step, on either driver: the caller's change of a copy of the row, saved
/// from the row as read.
pub(crate) struct ChangeCopy<F>(pub(crate) F);

impl<T, C, F, R, E> Step<T, C, R, E> for ChangeCopy<F>
where
    T: Guarded + Clone + UpdateOn<C, <T as Guarded>::Changes>,
    F: FnMut(&mut T) -> Result<R, E>,
{
    const OPERATION: &'static str = "modify";

    async fn apply<'a>(
        &'a mut self,
        conn: &'a mut C,
        original: &'a T,
    ) -> Result<(T, TokenOf<T>, R), Stop<E>> {
        let mut row = original.clone();
        let value = (self.0)(&mut row).map_err(Stop::Caller)?;
        let update = Update::new(original.key(), original.token(), row.changes())
            .saving_from(&row, original)
            .owned_transaction(true);
        let token = write_and_record(&mut row, conn, update).await?;
        Ok((row, token, value))
    }
}
