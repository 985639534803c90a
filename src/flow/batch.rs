//! A batch of guarded writes with an outcome per row, as a flow.
//!
//! Every decision of `guarded_update_batch` and `guarded_delete_batch`, blocking and
//! async, is made here:
//!
//! - every row's statement is built and checked before the flow starts, so a refused row
//!   (a changeset that assigns the guard or the status, a version that cannot advance)
//!   stops the batch with nothing written, in either mode and on every backend;
//! - a partial batch writes the rows as they come; an all-or-nothing one writes them in
//!   a transaction of the library's (a savepoint inside the caller's) that is committed
//!   only when every row was written, and rolled back otherwise;
//! - where the backend combines updates (PostgreSQL), a round sends up to
//!   [`ROWS_PER_STATEMENT`](crate::ROWS_PER_STATEMENT) rows, no key twice, then reads
//!   the rows it missed in one statement; elsewhere each row is one guarded write whose
//!   miss is explained as it comes;
//! - a miss (conflict, not found, refused) is the row's outcome; any other error ends the
//!   batch, after rolling back an all-or-nothing one; a failed `COMMIT` reads as every
//!   transaction of the library's reads it (`failed_commit`).
//!
//! A driver feeds each effect's result to the method named after it and performs the
//! effect it gets back, until [`Effect::Done`]; then [`Batch::outcome`].

use diesel::result::Error as DieselError;

use crate::connect::transaction::{failed_commit, LostCommit};
use crate::error::Error;
use crate::flow::compare_and_set::Written;
use crate::flow::miss::unreadable_row;
use crate::guard::{Guarded, TokenOf};
use crate::operation::batch::{BatchMode, BatchReport, RowOutcome};
use rows::{outcome, BuiltRows, Chunk, Pending, RoundWritten};

/// What a driver does next; `S` is a row's statement, `K` the entity's key.
#[derive(Debug, PartialEq)]
pub(crate) enum Effect<S, K> {
    /// Check that the guard's timestamp column stores what the guard compares (updates
    /// only); then [`checked`](Batch::checked).
    CheckPrecision,
    /// Begin the batch's transaction (a savepoint inside the caller's); then
    /// [`began`](Batch::began).
    Begin,
    /// Send these rows' statements as the backend's combined statements; then
    /// [`sent_round`](Batch::sent_round).
    SendRound(Vec<S>),
    /// Read the rows with these keys, which the round missed; then
    /// [`read_missed`](Batch::read_missed).
    ReadMissed(Vec<K>),
    /// Run this statement as one guarded write of the row [`row`](Batch::row) names; then
    /// [`wrote_row`](Batch::wrote_row).
    WriteRow(S),
    /// Commit; then [`committed`](Batch::committed).
    Commit,
    /// Roll back; then [`rolled_back`](Batch::rolled_back).
    Rollback,
    /// Finished: take the [`outcome`](Batch::outcome).
    Done,
}

/// Where the flow is, holding what the next step needs.
enum State<T: Guarded, S> {
    /// Not started, or between steps that need nothing kept.
    Idle,
    /// A round sent, waiting for its answer.
    Sending(Chunk<T, S>),
    /// A round's missed rows asked for, waiting for them.
    Reading(Chunk<T, S>, Vec<Option<Written<TokenOf<T>>>>, Vec<T::Key>),
    /// One row's write sent, waiting for its answer.
    Writing(Pending<T>),
    /// The error that ends the batch, waiting for the rollback.
    RollingBack(Error),
    /// Every row written or missed in an all-or-nothing batch, waiting for the `COMMIT`
    /// (every row written) or the `ROLLBACK`.
    Ending,
    /// The outcome.
    Done(Result<BatchReport<()>, Error>),
}

/// A batch of rows of entity `T`, each with its statement `S`, reporting `Out` for a
/// written row (its new token for an update, nothing for a delete).
pub(crate) struct Batch<T: Guarded, S, Out> {
    table: &'static str,
    mode: BatchMode,
    /// Whether the rows go in combined rounds (PostgreSQL's updates).
    combine: bool,
    /// Whether the guard's timestamp column is checked first (updates).
    check_precision: bool,
    /// Inside a transaction of the caller's: nothing commits here.
    nested: bool,
    /// The batch's transaction is open.
    in_transaction: bool,
    rows: std::iter::Peekable<std::vec::IntoIter<(Pending<T>, S)>>,
    written: Vec<RowOutcome<Out>>,
    /// What a written row reports, from the token the database read back (if the guard
    /// reads one) and the token computed before sending.
    report: fn(Option<TokenOf<T>>, TokenOf<T>) -> Out,
    state: State<T, S>,
}

impl<T: Guarded, S, Out> Batch<T, S, Out> {
    /// The batch of `rows` of `table` in `mode`; `nested` when the caller has a
    /// transaction open.
    pub(crate) fn new(
        table: &'static str,
        rows: BuiltRows<T, S>,
        mode: BatchMode,
        nested: bool,
        report: fn(Option<TokenOf<T>>, TokenOf<T>) -> Out,
    ) -> Self {
        Batch {
            table,
            mode,
            combine: false,
            check_precision: false,
            nested,
            in_transaction: false,
            written: Vec::with_capacity(rows.len()),
            rows: rows.into_iter().peekable(),
            report,
            state: State::Idle,
        }
    }

    /// The same batch of updates: the guard's column is checked first, and the rows go
    /// in combined rounds where `combine` (the backend combines updates).
    pub(crate) fn of_updates(self, combine: bool) -> Self {
        Batch {
            combine,
            check_precision: true,
            ..self
        }
    }

    /// The first effect.
    pub(crate) fn start(&mut self) -> Effect<S, T::Key> {
        if self.rows.peek().is_none() {
            return self.done(Ok(BatchReport::empty()));
        }
        if self.check_precision {
            return Effect::CheckPrecision;
        }
        self.checked(Ok(()))
    }

    /// The guard's column was checked.
    pub(crate) fn checked(&mut self, checked: Result<(), Error>) -> Effect<S, T::Key> {
        if let Err(e) = checked {
            return self.done(Err(e));
        }
        match self.mode {
            BatchMode::AllOrNothing => Effect::Begin,
            BatchMode::Partial => self.next_write(),
        }
    }

    /// The batch's transaction began, or failed to.
    pub(crate) fn began(&mut self, began: Result<(), Error>) -> Effect<S, T::Key> {
        match began {
            Ok(()) => {
                self.in_transaction = true;
                self.next_write()
            }
            // Nothing was begun, so nothing of the batch can have landed: a connection
            // lost at `BEGIN` is a plain database error.
            Err(e) => self.done(Err(e.rolled_back())),
        }
    }

    /// Whether the connection's open transaction, if any, is the library's (the batch's
    /// own): then a statement needs no savepoint of its own.
    pub(crate) fn own_transaction(&self) -> bool {
        self.in_transaction
    }

    /// The key and expected token of the row whose [`Effect::WriteRow`] is under way.
    pub(crate) fn row(&self) -> (&T::Key, &TokenOf<T>) {
        match &self.state {
            State::Writing(row) => row.key_and_expected(),
            _ => panic!("batch: row without Effect::WriteRow"),
        }
    }

    /// A round's answer: the index (and token) of each row its statements wrote.
    pub(crate) fn sent_round(
        &mut self,
        sent: Result<RoundWritten<TokenOf<T>>, Error>,
    ) -> Effect<S, T::Key> {
        let chunk = match std::mem::replace(&mut self.state, State::Idle) {
            State::Sending(chunk) => chunk,
            _ => panic!("batch: sent_round without Effect::SendRound"),
        };
        let written = match sent.and_then(|returned| chunk.written(self.table, returned)) {
            Ok(written) => written,
            Err(e) => return self.fail(e),
        };
        let missed = chunk.missed(&written);
        if missed.is_empty() {
            return self.round_done(chunk, written, Vec::new());
        }
        self.state = State::Reading(chunk, written, missed.clone());
        Effect::ReadMissed(missed)
    }

    /// The rows a round missed, as they are now; `classify` judges an error that is not
    /// an unreadable row.
    pub(crate) fn read_missed(
        &mut self,
        read: Result<Vec<T>, DieselError>,
        classify: impl FnOnce(DieselError) -> Error,
    ) -> Effect<S, T::Key> {
        let (chunk, written, missed) = match std::mem::replace(&mut self.state, State::Idle) {
            State::Reading(chunk, written, missed) => (chunk, written, missed),
            _ => panic!("batch: read_missed without Effect::ReadMissed"),
        };
        match read {
            Ok(current) => self.round_done(chunk, written, current),
            Err(e) => {
                let columns = T::GUARD_COLUMNS.join(", ");
                let error =
                    unreadable_row(self.table, &missed, e, columns).unwrap_or_else(classify);
                self.fail(error)
            }
        }
    }

    /// One row's write: the token it read back, or why it missed.
    pub(crate) fn wrote_row(
        &mut self,
        wrote: Result<Option<TokenOf<T>>, Error>,
    ) -> Effect<S, T::Key> {
        let row = match std::mem::replace(&mut self.state, State::Idle) {
            State::Writing(row) => row,
            _ => panic!("batch: wrote_row without Effect::WriteRow"),
        };
        let (_, _, next) = row.into_parts();
        let report = self.report;
        match outcome(wrote.map(|token| report(token, next))) {
            Ok(row) => {
                self.written.push(row);
                self.next_write()
            }
            Err(e) => self.fail(e),
        }
    }

    /// The `COMMIT`'s answer.
    pub(crate) fn committed(&mut self, committed: Result<(), DieselError>) -> Effect<S, T::Key> {
        self.expect_ending("committed");
        self.in_transaction = false;
        match committed {
            Ok(()) => self.report(true),
            Err(source) => self.done(Err(failed_commit(source, self.nested))),
        }
    }

    /// The `ROLLBACK`'s answer.
    pub(crate) fn rolled_back(
        &mut self,
        rolled_back: Result<(), DieselError>,
    ) -> Effect<S, T::Key> {
        self.in_transaction = false;
        match std::mem::replace(&mut self.state, State::Idle) {
            // The cause is what the caller needs; a failed rollback leaves the connection
            // broken, which its next use finds.
            State::RollingBack(cause) => self.done(Err(cause)),
            State::Ending => match rolled_back {
                Ok(()) => self.report(false),
                Err(e) => self.done(Err(Error::Database(e))),
            },
            _ => panic!("batch: rolled_back without Effect::Rollback"),
        }
    }

    /// The report, or the error that ended the batch. Call it after [`Effect::Done`].
    pub(crate) fn outcome(self) -> Result<BatchReport<Out>, Error> {
        match self.state {
            State::Done(Ok(BatchReport { applied, .. })) => Ok(BatchReport {
                rows: self.written,
                applied,
            }),
            State::Done(Err(e)) => Err(e),
            _ => panic!("batch: outcome before Effect::Done"),
        }
    }

    /// The next round or row to send, or the end of the rows.
    fn next_write(&mut self) -> Effect<S, T::Key> {
        if self.combine {
            return match Chunk::next(&mut self.rows) {
                Some(mut chunk) => {
                    let updates = chunk.take_updates();
                    self.state = State::Sending(chunk);
                    Effect::SendRound(updates)
                }
                None => self.rows_done(),
            };
        }
        match self.rows.next() {
            Some((row, statement)) => {
                self.state = State::Writing(row);
                Effect::WriteRow(statement)
            }
            None => self.rows_done(),
        }
    }

    /// A round's outcomes, given the rows it missed as they are now.
    fn round_done(
        &mut self,
        chunk: Chunk<T, S>,
        written: Vec<Option<Written<TokenOf<T>>>>,
        current: Vec<T>,
    ) -> Effect<S, T::Key> {
        let report = self.report;
        match chunk.outcomes(self.table, written, current, report) {
            Ok(rows) => {
                self.written.extend(rows);
                self.next_write()
            }
            Err(e) => self.fail(e),
        }
    }

    /// Every row was sent: commit when every row was written, else roll back (an
    /// all-or-nothing batch); a partial batch is done.
    fn rows_done(&mut self) -> Effect<S, T::Key> {
        if !self.in_transaction {
            return self.report(true);
        }
        self.state = State::Ending;
        if self.written.iter().all(RowOutcome::is_written) {
            Effect::Commit
        } else {
            Effect::Rollback
        }
    }

    /// The batch ends with `error`, after rolling back its transaction, which undoes
    /// every statement of it (a connection lost before the `COMMIT` is then a plain
    /// database error: nothing of the batch can have landed).
    fn fail(&mut self, error: Error) -> Effect<S, T::Key> {
        if !self.in_transaction {
            return self.done(Err(error));
        }
        let error = if self.nested {
            error
        } else {
            error.rolled_back()
        };
        self.state = State::RollingBack(error);
        Effect::Rollback
    }

    fn report(&mut self, applied: bool) -> Effect<S, T::Key> {
        self.done(Ok(BatchReport {
            rows: Vec::new(),
            applied,
        }))
    }

    fn done(&mut self, outcome: Result<BatchReport<()>, Error>) -> Effect<S, T::Key> {
        self.state = State::Done(outcome);
        Effect::Done
    }

    fn expect_ending(&mut self, step: &str) {
        if !matches!(self.state, State::Ending) {
            panic!("batch: {step} without Effect::Commit");
        }
        self.state = State::Idle;
    }
}

pub(crate) mod rows;
#[cfg(test)]
mod tests;
