//! Read-modify-write with retry, as a flow: each attempt begins a write transaction,
//! reads the row (with its lock once the row is contended), runs the caller's change and
//! guarded write, and commits; a failure rolls back and, as the retry policy allows,
//! pauses and starts again from the read.
//!
//! Every decision of `modify`, `modify_pooled` and the JSON edits, blocking and async,
//! is made here:
//!
//! - how many attempts: one inside a transaction the caller opened (a retry could not
//!   undo the caller's earlier work), else the policy's;
//! - how an attempt reads: with the row lock on a retry or a row that conflicted lately
//!   (`Contention::LockWhenContended`), plainly otherwise;
//! - what a read means: no row is `NotFound`, a row that does not read as the entity is
//!   `InvalidData` naming the suspect columns;
//! - how a failed `COMMIT` reads: as every transaction of the library's reads it
//!   (`failed_commit`): a lost connection may have committed (`Ambiguous`, never
//!   retried), a conflict or a busy database reported at `COMMIT` rolled back
//!   (`Retryable`), anything else is the database's error; inside the caller's
//!   transaction nothing commits here;
//! - how a failure before the `COMMIT` reads: the server rolled everything back, so a
//!   lost connection is a plain database error, retryable when every attempt gets a
//!   connection of its own;
//! - a read-only server's refusal, when every attempt gets a connection of its own and
//!   a new one may reach the primary: retryable, and the connection is discarded so that
//!   its pool connects again;
//! - whether to go on: the policy's bounds and waits, with a conflict marking the row
//!   contended.
//!
//! A driver feeds each effect's result to the method named after it and performs the
//! effect it gets back, until [`Effect::Done`]; then [`ReadModifyWrite::outcome`].

use std::fmt::Debug;
use std::time::Duration;

use diesel::result::Error as DieselError;

use super::hot_rows::HotRow;
use super::row_read::judge_read;
use crate::connect::transaction::{failed_commit, LostCommit};
use crate::error::{connection_lost, Error, RetryReason};
use crate::retry::{Contention, RetryPolicy, Run, Stop};
use crate::sql::statement::RowLock;

/// What a driver does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Begin the attempt's write transaction (a savepoint inside the caller's), on a
    /// connection of the attempt's own when the attempts come from a pool; then
    /// [`began`](ReadModifyWrite::began).
    Begin,
    /// Read the row by its key, with this lock; then [`read`](ReadModifyWrite::read).
    Read(RowLock),
    /// Run the attempt's change on [`row`](ReadModifyWrite::row) inside the transaction;
    /// then [`changed`](ReadModifyWrite::changed).
    Change,
    /// Commit; then [`committed`](ReadModifyWrite::committed).
    Commit,
    /// Roll back; then [`rolled_back`](ReadModifyWrite::rolled_back).
    Rollback,
    /// Give the attempt's connection back (to its pool) and wait this long; then
    /// [`paused`](ReadModifyWrite::paused).
    Pause(Duration),
    /// Finished: take the [`outcome`](ReadModifyWrite::outcome).
    Done,
}

/// Where the flow is, holding what the next step needs.
enum State<T, V, E> {
    /// Waiting for the attempt's transaction to begin.
    Beginning,
    /// Waiting for the row.
    Reading,
    /// The row read, waiting for the change.
    Changing(T),
    /// What the change gave, waiting for the `COMMIT`.
    Committing(V),
    /// Why the attempt failed, waiting for the `ROLLBACK`.
    RollingBack(Stop<E>),
    /// Waiting out the pause before the next attempt.
    Pausing,
    /// The outcome, with the attempts it took (a failure still telling the library's
    /// error from the caller's, for the call's report).
    Done(Result<(V, u32), Stop<E>>),
    /// The outcome was taken.
    Taken,
}

/// One read-modify-write of the row of `table` with `key`: `T` is the row as read, `V`
/// what a successful change gives back, `E` the caller's error.
pub(crate) struct ReadModifyWrite<'a, T, V, E> {
    run: Run<'a>,
    contended: Contended,
    fresh_per_attempt: bool,
    /// Whether a read-only refusal is retried on a new connection.
    reconnects_on_read_only: bool,
    /// Whether the attempt that just ended met a read-only server.
    unfit_connection: bool,
    nested: bool,
    table: &'static str,
    key: &'a (dyn Debug + Sync),
    suspects: &'a str,
    state: State<T, V, E>,
}

impl<'a, T, V, E: From<Error>> ReadModifyWrite<'a, T, V, E> {
    /// A read-modify-write of the row of `table` with `key`, retried by `policy` (once
    /// only when `nested` in a transaction the caller opened). `fresh_per_attempt`: every
    /// attempt gets a connection of its own (a pool), so one whose connection died before
    /// its `COMMIT` can run again. `suspects` names the columns an unreadable row is
    /// blamed on.
    pub(crate) fn new(
        policy: &'a RetryPolicy,
        nested: bool,
        fresh_per_attempt: bool,
        table: &'static str,
        key: &'a (dyn Debug + Sync),
        suspects: &'a str,
    ) -> Self {
        let run = policy.start().of("modify", table);
        ReadModifyWrite {
            run: if nested { run.only_once() } else { run },
            contended: Contended::of(policy, table, key),
            fresh_per_attempt,
            reconnects_on_read_only: false,
            unfit_connection: false,
            nested,
            table,
            key,
            suspects,
            state: State::Beginning,
        }
    }

    /// The first effect.
    pub(crate) fn start(&self) -> Effect {
        Effect::Begin
    }

    /// The attempt's transaction began, or why it (or the attempt's connection) could
    /// not: then nothing is open and nothing was written.
    pub(crate) fn began(&mut self, begun: Result<(), Error>) -> Effect {
        self.expect(|s| matches!(s, State::Beginning), "began");
        match begun {
            Ok(()) => {
                self.state = State::Reading;
                Effect::Read(self.contended.lock_for(self.run.number()))
            }
            Err(error) => self.attempt_failed(Stop::Occ(error)),
        }
    }

    /// The row as read (`classify` judges a database error on the attempt's
    /// connection).
    pub(crate) fn read(
        &mut self,
        read: diesel::QueryResult<Option<T>>,
        classify: impl FnOnce(DieselError) -> Error,
    ) -> Effect {
        self.expect(|s| matches!(s, State::Reading), "read");
        match judge_read(self.table, self.key, self.suspects, read, classify) {
            Ok(row) => {
                self.state = State::Changing(row);
                Effect::Change
            }
            Err(error) => {
                self.state = State::RollingBack(Stop::Occ(error));
                Effect::Rollback
            }
        }
    }

    /// The row the change runs on (during [`Effect::Change`]).
    pub(crate) fn row(&self) -> &T {
        match &self.state {
            State::Changing(row) => row,
            _ => panic!("read-modify-write: the row is there only for Effect::Change"),
        }
    }

    /// What the change (the caller's closure and the guarded write) gave.
    pub(crate) fn changed(&mut self, changed: Result<V, Stop<E>>) -> Effect {
        self.expect(|s| matches!(s, State::Changing(_)), "changed");
        match changed {
            Ok(value) => {
                self.state = State::Committing(value);
                Effect::Commit
            }
            Err(stop) => {
                self.state = State::RollingBack(stop);
                Effect::Rollback
            }
        }
    }

    /// The `COMMIT` (inside the caller's transaction: the savepoint's release) ended.
    pub(crate) fn committed(&mut self, committed: Result<(), DieselError>) -> Effect {
        let value = match std::mem::replace(&mut self.state, State::Taken) {
            State::Committing(value) => value,
            _ => panic!("read-modify-write: committed without Effect::Commit"),
        };
        match committed {
            Ok(()) => {
                self.state = State::Done(Ok((value, self.run.number())));
                Effect::Done
            }
            Err(source) => self.settle(Stop::Occ(failed_commit(source, self.nested))),
        }
    }

    /// The `ROLLBACK` ended (a failed one leaves the connection for its pool to discard;
    /// the attempt's own failure is what counts).
    pub(crate) fn rolled_back(&mut self) -> Effect {
        match std::mem::replace(&mut self.state, State::Taken) {
            State::RollingBack(stop) => self.attempt_failed(stop),
            _ => panic!("read-modify-write: rolled back without Effect::Rollback"),
        }
    }

    /// The pause ended: the next attempt begins.
    pub(crate) fn paused(&mut self) -> Effect {
        self.expect(|s| matches!(s, State::Pausing), "paused");
        self.state = State::Beginning;
        Effect::Begin
    }

    /// This flow, retrying a read-only server's refusal on a new connection when
    /// `reconnect_may_reach_primary` (the backend's) and every attempt gets a connection
    /// of its own.
    pub(crate) fn reconnecting_on_read_only(mut self, reconnect_may_reach_primary: bool) -> Self {
        // Inside the caller's transaction (a test pool's, say) there is one attempt, and
        // its connection is the caller's to keep.
        self.reconnects_on_read_only =
            reconnect_may_reach_primary && self.fresh_per_attempt && !self.nested;
        self
    }

    /// Whether the attempt that just ended met a read-only server, asked once per
    /// attempt: its connection is to be discarded rather than handed out again.
    pub(crate) fn connection_unfit(&mut self) -> bool {
        std::mem::take(&mut self.unfit_connection)
    }

    /// This flow, its retries reported as those of `operation`.
    pub(crate) fn reported_as(mut self, operation: &'static str) -> Self {
        self.run = self.run.named(operation);
        self
    }

    /// The outcome and the attempts it took, once the flow answered [`Effect::Done`].
    pub(crate) fn outcome(&mut self) -> Result<(V, u32), Stop<E>> {
        match std::mem::replace(&mut self.state, State::Taken) {
            State::Done(outcome) => outcome,
            _ => panic!("read-modify-write: the outcome is there only after Effect::Done"),
        }
    }

    /// An attempt that failed before its `COMMIT` was sent: the server rolled back what
    /// it wrote, even when the connection died with it.
    fn attempt_failed(&mut self, stop: Stop<E>) -> Effect {
        if self.nested {
            self.settle(stop)
        } else {
            self.settle(stop.rolled_back())
        }
    }

    /// After a failed attempt: mark the row contended on a conflict, retry a connection
    /// lost before the `COMMIT` when the next attempt gets another (and a read-only
    /// refusal when that one may reach the primary), then pause or stop as the policy
    /// says.
    fn settle(&mut self, stop: Stop<E>) -> Effect {
        let (stop, floor) = match self.contended.settle(stop, self.fresh_per_attempt) {
            Stop::Occ(Error::ReadOnly { source }) if self.reconnects_on_read_only => {
                self.unfit_connection = true;
                let retry = Error::Retryable {
                    reason: RetryReason::ReadOnly,
                    source,
                };
                (Stop::Occ(retry), READ_ONLY_PAUSE)
            }
            other => (other, Duration::ZERO),
        };
        match self.run.wait_at_least_or_stop(stop, floor) {
            Ok(pause) => {
                self.state = State::Pausing;
                Effect::Pause(pause)
            }
            Err(e) => {
                self.state = State::Done(Err(read_only_again(e)));
                Effect::Done
            }
        }
    }

    /// Panics when a result is fed out of order: a driver's bug, never a database's.
    fn expect(&self, state: impl FnOnce(&State<T, V, E>) -> bool, step: &str) {
        assert!(
            state(&self.state),
            "read-modify-write: `{step}` fed out of order"
        );
    }
}

/// The least pause before a read-only refusal is tried again on a new connection: a
/// promotion or a proxy's switch takes seconds, and each attempt costs a connect.
const READ_ONLY_PAUSE: Duration = Duration::from_millis(250);

/// A read-only refusal the run did not retry (one attempt) or whose retries ran out, said
/// as the refusal it is: `ReadOnly`, not retryable (as the last error of
/// `RetriesExhausted` too).
fn read_only_again<E>(stop: Stop<E>) -> Stop<E> {
    let back = |error: Error| match error {
        Error::Retryable {
            reason: RetryReason::ReadOnly,
            source,
        } => Error::ReadOnly { source },
        other => other,
    };
    match stop {
        Stop::Occ(Error::RetriesExhausted { attempts, last }) => {
            Stop::Occ(Error::RetriesExhausted {
                attempts,
                last: Box::new(back(*last)),
            })
        }
        Stop::Occ(error) => Stop::Occ(back(error)),
        caller => caller,
    }
}

/// The row memory of a retried read-modify-write: the row's entry and for how long a
/// conflict marks it hot, under [`Contention::LockWhenContended`] only.
#[derive(Clone, Copy)]
struct Contended(Option<(HotRow, Duration)>);

impl Contended {
    /// The memory of the row with `key` of `table`, as `policy` asks for it (the key is
    /// hashed once per call, not per attempt).
    fn of(policy: &RetryPolicy, table: &'static str, key: &dyn Debug) -> Self {
        Contended(match policy.contention_mode() {
            Contention::LockWhenContended { hot_for } => Some((HotRow::of(table, key), hot_for)),
            Contention::Optimistic => None,
        })
    }

    /// How attempt `number` reads the row: with its lock on a retry or a hot row.
    fn lock_for(self, number: u32) -> RowLock {
        match self.0 {
            Some((row, hot_for)) if number > 1 || row.is_hot(hot_for) => RowLock::ForUpdate,
            _ => RowLock::None,
        }
    }

    /// A failed attempt's reason, after marking the row hot on a conflict. With a
    /// connection per attempt (`fresh_per_attempt`), a connection lost before the
    /// `COMMIT` (a lost `COMMIT` is `Ambiguous` by now) wrote nothing and is retryable on
    /// another one.
    fn settle<E>(self, stop: Stop<E>, fresh_per_attempt: bool) -> Stop<E> {
        if let (Stop::Occ(Error::Conflict(_)), Some((row, hot_for))) = (&stop, self.0) {
            row.mark(hot_for);
        }
        match stop {
            Stop::Occ(Error::Database(source)) if fresh_per_attempt && connection_lost(&source) => {
                Stop::Occ(Error::Retryable {
                    reason: RetryReason::ConnectionLost,
                    source,
                })
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests;
