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

use diesel::result::Error as DieselError;

use crate::connect::backend::OccBackend;
use crate::connect::source::ConnectionSource;
use crate::connect::transaction::in_transaction;
use crate::connect::transaction::WriteTransaction;
use crate::drive::blocking::executor::classify;
use crate::drive::blocking::load::LoadByKey;
use crate::error::Error;
use crate::flow::read_modify_write::{Effect, ReadModifyWrite};
use crate::guard::{Guarded, TokenOf};
use crate::operation::{Modify, Operation, Run, Update};
use crate::retry::{RetryPolicy, Stop};
use crate::sql::statement::RowLock;
use crate::write::entity::{write_and_record, GuardedWrite, UpdateRow};

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
    /// [`Error::Ambiguous`].
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
        let update = Update::new(original.key(), original.token(), row.changes())
            .saving_from(&row, original)
            .owned_transaction(true);
        let token = write_and_record(&mut row, conn, update)?;
        Ok((row, token, value))
    })
}

impl<T: GuardedWrite + Clone> GuardedModify for T {}

/// Whether `conn` is inside a transaction its caller opened: then an operation makes one
/// attempt only, since a retry could not roll back the caller's earlier work.
pub(crate) fn in_caller_transaction<C: Connection>(conn: &mut C) -> bool {
    in_transaction(conn)
}

/// The blocking driver of the read-modify-write [flow](crate::flow::read_modify_write):
/// runs `attempt` (given the connection and the row as read) in a write transaction per
/// attempt on connections from `source`, sleeping out the flow's pauses, until the flow is
/// done. `attempt` returns the row as written, its new token and the caller's value.
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
    let table = T::table_name();
    let mut flow = ReadModifyWrite::new(policy, nested, S::FRESH_PER_ATTEMPT, table, key, suspects);
    let mut effect = flow.start();
    loop {
        effect = match effect {
            Effect::Begin => {
                let mut ran = None;
                let checkout = source.with(|conn| {
                    ran = Some(run_attempt(conn, &mut flow, key, &mut attempt));
                });
                match (ran, checkout) {
                    // The attempt ran: its outcome stands, whatever the source said after.
                    (Some(next), _) => next,
                    // No connection for the attempt: nothing began.
                    (None, Err(error)) => flow.began(Err(error)),
                    (None, Ok(())) => unreachable!("a source that succeeds runs the attempt"),
                }
            }
            Effect::Pause(pause) => {
                std::thread::sleep(pause);
                flow.paused()
            }
            Effect::Done => break,
            other => unreachable!("{other:?} is run inside an attempt"),
        };
    }
    Ok(Modified::of(flow.outcome()?))
}

/// One attempt of `flow` on `conn`, from its `BEGIN` to its `COMMIT` or `ROLLBACK`
/// (diesel's transaction, as [`WriteTransaction`] begins and ends it on each backend):
/// the effect after it.
fn run_attempt<T, C, V, E>(
    conn: &mut C,
    flow: &mut ReadModifyWrite<'_, T, V, E>,
    key: &T::Key,
    attempt: &mut impl FnMut(&mut C, &T) -> Result<V, Stop<E>>,
) -> Effect
where
    T: LoadByKey<C>,
    C: LoadConnection + WriteTransaction,
    C::Backend: OccBackend,
    E: From<Error>,
{
    let mut ended = None;
    let transaction = conn.write_transaction(|conn| {
        let mut effect = flow.began(Ok(()));
        loop {
            effect = match effect {
                Effect::Read(lock) => {
                    let read = match lock {
                        RowLock::None => T::read_by_key(conn, key),
                        lock => T::lock_by_key(conn, key, lock),
                    };
                    flow.read(read, |e| classify(conn, e))
                }
                Effect::Change => {
                    let changed = attempt(conn, flow.row());
                    flow.changed(changed)
                }
                Effect::Commit => {
                    ended = Some(Effect::Commit);
                    return Ok(());
                }
                Effect::Rollback => {
                    ended = Some(Effect::Rollback);
                    return Err(DieselError::RollbackTransaction);
                }
                other => unreachable!("{other:?} inside an attempt's transaction"),
            }
        }
    });
    match (ended, transaction) {
        (Some(Effect::Commit), committed) => flow.committed(committed),
        (Some(_), _) => flow.rolled_back(),
        // The BEGIN failed: nothing is open.
        (None, Err(e)) => flow.began(Err(classify(conn, e))),
        (None, Ok(())) => unreachable!("an attempt's transaction ends by the flow's word"),
    }
}
