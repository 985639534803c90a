//! Batches of guarded writes with an outcome per row.
//!
//! Each row is `(key, the token the caller read, changes)`. Every row is tried, so the
//! caller learns at once which rows were written, which conflicted (with their current
//! row) and which were missing, instead of stopping at the first miss. In
//! [`BatchMode::AllOrNothing`] the batch runs in a transaction (a savepoint inside the
//! caller's) that is committed only when every row was written; in
//! [`BatchMode::Partial`] each written row stays written.
//!
//! Cost, plus the transaction's `BEGIN` and `COMMIT` in all-or-nothing mode:
//! - PostgreSQL: one statement for up to [`ROWS_PER_STATEMENT`] rows that set the same
//!   columns (an `UPDATE ... FROM (VALUES ...)` with each row's values and expected token
//!   in the list), plus one read of all the rows that missed. Rows that set other columns
//!   (a changeset whose `None` fields leave some out) go in a statement of their own
//!   shape, and a key that comes again starts the next statement (two updates of one row
//!   in one statement would race). A batch of 1,000 rows of one shape is one `UPDATE`:
//!   about 6x faster than one statement per row (BENCHMARKS.md, W5).
//! - MySQL / MariaDB and SQLite: one statement per row, plus one read per row that
//!   missed. Neither can update rows with different values in one statement while
//!   checking each row's own guard; SQLite runs in-process, so its round trips are
//!   function calls.
//!
//! A database error (a deadlock, a lost connection) ends the batch with that error. On
//! PostgreSQL it undoes the whole statement it hit, so in a partial batch the rows of
//! that statement are not written either.

use diesel::connection::LoadConnection;
use diesel::query_builder::{AsChangeset, QueryFragment};
use diesel::result::Error as DieselError;

use crate::connect::backend::OccBackend;
use crate::connect::transaction::in_transaction;
use crate::connect::transaction::WriteTransaction;
use crate::error::Error;
use crate::flow::batch::{Batch, Effect};
use crate::guard::{CompletionOf, Guarded, TokenOf};
use crate::operation::{BatchDelete, BatchUpdate, Operation, Run};
use crate::sql::new_token::Counted;
use crate::sql::statement::Assignments;
use crate::write::complete::{Complete, CompleteEach};
use crate::write::entity::check_stored_precision;
use crate::write::entity::{
    delete_statement, guarded_statement_in, run_guarded, DeleteOf, DeleteRow, GuardedWrite,
    LoadByKey, RowMoved, UpdateOf, UpdateRow,
};
use crate::write::executor::{classify, refuse_double_assignment, run_each, Written};

pub use crate::operation::batch::{BatchMode, BatchReport, RowOutcome};

/// Guarded batches for every [`GuardedWrite`] entity.
pub trait GuardedBatch: GuardedWrite {
    /// Applies each `(key, expected token, changes)` row as
    /// [`guarded_update_by_key`](GuardedWrite::guarded_update_by_key) would, and reports
    /// every row's outcome. Every row's statement is built and checked before anything is
    /// sent (and held in memory until the batch ends): a refused row (a changeset that
    /// assigns the guard, a version that cannot advance) stops the batch with nothing
    /// written. Misses (conflict, not found,
    /// refused) are outcomes; a database error (a deadlock, a lost connection) ends the
    /// batch with that error, after rolling back an all-or-nothing batch.
    fn guarded_update_batch<C, Ch, I>(
        conn: &mut C,
        rows: I,
        mode: BatchMode,
    ) -> Result<BatchReport<TokenOf<Self>>, Error>
    where
        C: WriteTransaction,
        I: IntoIterator<Item = (Self::Key, TokenOf<Self>, Ch)>,
        Self: UpdateBatch<C, Ch>,
    {
        BatchUpdate::<Self, Ch>::new(rows.into_iter().collect(), mode).run(conn)
    }

    /// Deletes each `(key, expected token)` row as
    /// [`guarded_delete_by_key`](GuardedWrite::guarded_delete_by_key) would, and reports
    /// every row's outcome ([`RowOutcome::Written`] for a deleted row). One statement per
    /// row on every backend. Misses are outcomes; a database error ends the batch, as in
    /// [`guarded_update_batch`](Self::guarded_update_batch).
    fn guarded_delete_batch<C, I>(
        conn: &mut C,
        rows: I,
        mode: BatchMode,
    ) -> Result<BatchReport<()>, Error>
    where
        C: WriteTransaction,
        I: IntoIterator<Item = (Self::Key, TokenOf<Self>)>,
        Self: DeleteRow<C>,
    {
        BatchDelete::<Self>::new(rows.into_iter().collect(), mode).run(conn)
    }
}

impl<T: GuardedWrite> GuardedBatch for T {}

/// A batch of guarded updates of entity `Self` with changes `Ch` on connection `C`, as
/// one bound; like [`UpdateRow`], not a trait to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run a batch of guarded updates with `{Ch}` on `{C}`",
    note = "the changes must be for the entity's table, the connection a diesel connection of a backend diesel-occ supports, and the guard's SQL must fit that backend"
)]
pub trait UpdateBatch<C, Ch>: UpdateRow<C, Ch> {
    /// Writes the rows in `mode`, one outcome each; [`GuardedBatch`] runs it.
    #[doc(hidden)]
    fn update_batch(
        conn: &mut C,
        rows: Vec<(Self::Key, TokenOf<Self>, Ch)>,
        mode: BatchMode,
    ) -> Result<BatchReport<TokenOf<Self>>, Error>;
}

impl<T, C, Ch> UpdateBatch<C, Ch> for T
where
    T: UpdateRow<C, Ch>,
    C: LoadConnection + WriteTransaction,
    C::Backend: OccBackend,
    Ch: AsChangeset<Target = T::Table>,
    UpdateOf<T, Ch::Changeset>: Assignments<C::Backend> + QueryFragment<C::Backend>,
    CompletionOf<T>: Complete<C, UpdateOf<T, Ch::Changeset>, TokenOf<T>>
        + CompleteEach<C, UpdateOf<T, Ch::Changeset>, TokenOf<T>>,
{
    fn update_batch(
        conn: &mut C,
        rows: Vec<(T::Key, TokenOf<T>, Ch)>,
        mode: BatchMode,
    ) -> Result<BatchReport<TokenOf<T>>, Error> {
        let table = T::table_name();
        let rows = updates::<T, C::Backend, Ch>(table, rows)?;
        let flow = Batch::new(table, rows, mode, in_transaction(conn), written_token::<T>)
            .of_updates(C::Backend::COMBINES_UPDATES);
        drive(
            conn,
            flow,
            &mut |conn, updates, own| run_each::<C, _, CompletionOf<T>, _>(conn, own, updates),
            &mut |conn, key, expected, statement, own| {
                let miss = RowMoved::<T>::expecting(key, expected);
                run_guarded::<T, C, _, CompletionOf<T>>(conn, miss, statement, own)
            },
        )
    }
}

impl<T: UpdateBatch<C, Ch>, C, Ch> Run<C> for BatchUpdate<T, Ch> {
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        T::update_batch(conn, self.rows, self.mode)
    }
}

impl<T: DeleteRow<C>, C: WriteTransaction> Run<C> for BatchDelete<T> {
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        T::delete_batch(conn, self.rows, self.mode)
    }
}

/// The token a written row holds: the one the database read back, if the guard reads
/// one, else the one computed before sending.
pub(crate) fn written_token<T: Guarded>(
    returned: Option<TokenOf<T>>,
    next: TokenOf<T>,
) -> TokenOf<T> {
    returned.unwrap_or(next)
}

/// Every row's guarded update, built and checked before anything is sent: the first
/// refusal ([`Error::ChangesetAssignsGuard`], [`Error::StatusNotWritable`],
/// [`Error::VersionOverflow`]) refuses the batch.
pub(crate) fn updates<T, DB, Ch>(
    table: &'static str,
    rows: Vec<(T::Key, TokenOf<T>, Ch)>,
) -> Result<BuiltRows<T, UpdateOf<T, Ch::Changeset>>, Error>
where
    T: Guarded,
    Ch: AsChangeset<Target = T::Table>,
    UpdateOf<T, Ch::Changeset>: Assignments<DB>,
{
    rows.into_iter()
        .map(|(key, expected, changes)| {
            let (update, next) = guarded_statement_in::<T, DB, Ch>(
                table,
                &key,
                &expected,
                changes,
                T::stamp(),
                None,
            )?;
            refuse_double_assignment(table, &update)?;
            Ok((Pending::new(key, expected, next), update))
        })
        .collect()
}

/// Every row's guarded delete.
pub(crate) fn deletes<T: Guarded>(rows: Vec<(T::Key, TokenOf<T>)>) -> BuiltRows<T, DeleteOf<T>> {
    rows.into_iter()
        .map(|(key, expected)| {
            let statement = delete_statement::<T>(&key, &expected);
            let next = expected.clone();
            (Pending::new(key, expected, next), statement)
        })
        .collect()
}

/// A batch of guarded deletes: [`DeleteRow::delete_batch`].
pub(crate) fn delete_batch<T, C>(
    conn: &mut C,
    rows: Vec<(T::Key, TokenOf<T>)>,
    mode: BatchMode,
) -> Result<BatchReport<()>, Error>
where
    T: LoadByKey<C>,
    C: LoadConnection + WriteTransaction,
    C::Backend: OccBackend,
    DeleteOf<T>: Assignments<C::Backend>,
    Counted: Complete<C, DeleteOf<T>, TokenOf<T>>,
{
    let rows = deletes::<T>(rows);
    let flow = Batch::new(T::table_name(), rows, mode, in_transaction(conn), |_, _| ());
    drive(
        conn,
        flow,
        &mut no_rounds,
        &mut |conn, key, expected, statement, own| {
            let miss = RowMoved::<T>::expecting(key, expected);
            run_guarded::<T, C, _, Counted>(conn, miss, statement, own)
        },
    )
}

/// The rounds of a batch whose rows are written one by one: never asked for.
fn no_rounds<C, S, Tok>(_: &mut C, _: Vec<S>, _: bool) -> Result<RoundWritten<Tok>, Error> {
    unreachable!("a batch of deletes writes its rows one by one")
}

/// The blocking driver of the batch [flow](crate::flow::batch): `round` sends a round's
/// combined statements, `row` one row's guarded write; an all-or-nothing batch runs in
/// diesel's transaction, as [`WriteTransaction`] begins and ends it on each backend.
fn drive<T, C, S, Out>(
    conn: &mut C,
    mut flow: Batch<T, S, Out>,
    round: &mut impl FnMut(&mut C, Vec<S>, bool) -> Result<RoundWritten<TokenOf<T>>, Error>,
    row: &mut impl FnMut(&mut C, &T::Key, &TokenOf<T>, S, bool) -> Result<Option<TokenOf<T>>, Error>,
) -> Result<BatchReport<Out>, Error>
where
    T: LoadByKey<C>,
    C: LoadConnection + WriteTransaction,
    C::Backend: OccBackend,
{
    let mut effect = flow.start();
    loop {
        effect = match effect {
            Effect::Begin => {
                // Whether the flow asked for the COMMIT (else the ROLLBACK), once it did.
                let mut commit = None;
                let transaction = conn.write_transaction(|conn| {
                    let mut effect = flow.began(Ok(()));
                    loop {
                        effect = match effect {
                            Effect::Commit => {
                                commit = Some(true);
                                return Ok(());
                            }
                            Effect::Rollback => {
                                commit = Some(false);
                                return Err(DieselError::RollbackTransaction);
                            }
                            other => step(conn, &mut flow, other, round, row),
                        }
                    }
                });
                match (commit, transaction) {
                    (Some(true), committed) => flow.committed(committed),
                    (Some(false), Err(DieselError::RollbackTransaction)) => {
                        flow.rolled_back(Ok(()))
                    }
                    (Some(false), rolled_back) => flow.rolled_back(rolled_back),
                    // The BEGIN failed: nothing is open.
                    (None, Err(e)) => flow.began(Err(classify(conn, e))),
                    (None, Ok(())) => unreachable!("a batch's transaction ends by the flow's word"),
                }
            }
            Effect::Done => return flow.outcome(),
            other => step(conn, &mut flow, other, round, row),
        };
    }
}

/// Performs one effect of a batch outside its transaction's beginning and end.
fn step<T, C, S, Out>(
    conn: &mut C,
    flow: &mut Batch<T, S, Out>,
    effect: Effect<S, T::Key>,
    round: &mut impl FnMut(&mut C, Vec<S>, bool) -> Result<RoundWritten<TokenOf<T>>, Error>,
    row: &mut impl FnMut(&mut C, &T::Key, &TokenOf<T>, S, bool) -> Result<Option<TokenOf<T>>, Error>,
) -> Effect<S, T::Key>
where
    T: LoadByKey<C>,
    C: LoadConnection,
    C::Backend: OccBackend,
{
    let own = flow.own_transaction();
    match effect {
        Effect::CheckPrecision => flow.checked(check_stored_precision::<T, C>(conn)),
        Effect::SendRound(updates) => flow.sent_round(round(conn, updates, own)),
        Effect::ReadMissed(keys) => {
            let read = T::load_by_keys(conn, &keys);
            flow.read_missed(read, |e| classify(conn, e))
        }
        Effect::WriteRow(statement) => {
            let (key, expected) = flow.row();
            let wrote = row(conn, key, expected, statement, own);
            flow.wrote_row(wrote)
        }
        _ => unreachable!("the batch driver begins and ends the transaction itself"),
    }
}

/// The most rows one PostgreSQL batch statement holds (fewer when the rows bind more
/// than 65,535 values in all). Every row's statement of a batch is built before anything
/// is sent (so that a refused row refuses the batch with nothing written): a batch holds
/// all of them in memory, so send a very large one in slices. Measured with W5 on PostgreSQL 15 on localhost (a batch of 1,000
/// rows, median of three runs): 50 rows per statement 14.4 ms, 100 rows 11.1 ms, 250 rows
/// 8.7 ms, 500 rows 9.2 ms, 1,000 rows 8.6 ms. Flat beyond 250; the largest size saves
/// the most round trips where the server is farther away.
pub const ROWS_PER_STATEMENT: usize = 1000;

/// The index of each row of a round that its statements wrote and, for a guard whose
/// next token only the database knows, that token.
pub(crate) type RoundWritten<Tok> = Vec<(usize, Option<Tok>)>;

/// A batch's rows, each with its statement, built before anything is sent.
pub(crate) type BuiltRows<T, S> = Vec<(Pending<T>, S)>;

/// One row of a batch statement: its key, the token it expects, and the token a written
/// row holds when the guard computes it.
pub(crate) struct Pending<T: Guarded> {
    key: T::Key,
    expected: TokenOf<T>,
    next: TokenOf<T>,
}

impl<T: Guarded> Pending<T> {
    /// The row with `key`, expected at `expected`, that a write leaves at `next`.
    pub(crate) fn new(key: T::Key, expected: TokenOf<T>, next: TokenOf<T>) -> Self {
        Pending {
            key,
            expected,
            next,
        }
    }

    /// The key and the expected token.
    pub(crate) fn key_and_expected(&self) -> (&T::Key, &TokenOf<T>) {
        (&self.key, &self.expected)
    }

    /// The key, the expected token and the token a written row holds when the guard
    /// computes it.
    pub(crate) fn into_parts(self) -> (T::Key, TokenOf<T>, TokenOf<T>) {
        (self.key, self.expected, self.next)
    }
}

/// The rows one round of a batch sends: at most [`ROWS_PER_STATEMENT`] rows, no key
/// twice, with their statements in the same order.
pub(crate) struct Chunk<T: Guarded, S> {
    pub(crate) rows: Vec<Pending<T>>,
    pub(crate) updates: Vec<S>,
}

impl<T: Guarded, S> Chunk<T, S> {
    /// The next round's rows taken from `rows`: `None` when none is left.
    pub(crate) fn next<I>(rows: &mut std::iter::Peekable<I>) -> Option<Self>
    where
        I: Iterator<Item = (Pending<T>, S)>,
    {
        let mut chunk = Chunk {
            rows: Vec::new(),
            updates: Vec::new(),
        };
        while chunk.rows.len() < ROWS_PER_STATEMENT {
            // A key that comes again waits for the next round, which sees this one's write.
            let again = |(row, _): &(Pending<T>, S)| chunk.rows.iter().any(|r| r.key == row.key);
            match rows.next_if(|next| !again(next)) {
                Some((row, update)) => {
                    chunk.rows.push(row);
                    chunk.updates.push(update);
                }
                None => break,
            }
        }
        (!chunk.rows.is_empty()).then_some(chunk)
    }

    /// The rows' statements, to send.
    pub(crate) fn take_updates(&mut self) -> Vec<S> {
        std::mem::take(&mut self.updates)
    }

    /// Per row, whether and how its statement wrote it, from the indexes (and tokens) of
    /// the rows written that the batch statements `returned`: a statement that wrote two
    /// rows had a key that is not unique.
    pub(crate) fn written<Tok>(
        &self,
        table: &'static str,
        returned: Vec<(usize, Option<Tok>)>,
    ) -> Result<Vec<Option<Written<Tok>>>, Error> {
        let mut written: Vec<Option<Written<Tok>>> = self.rows.iter().map(|_| None).collect();
        for (index, token) in returned {
            let rows = written[index].as_ref().map_or(0, |w| w.rows) + 1;
            if rows > 1 {
                return Err(Error::KeyNotUnique {
                    table,
                    key: format!("{:?}", self.rows[index].key),
                    rows,
                });
            }
            written[index] = Some(Written { rows, token });
        }
        Ok(written)
    }

    /// The keys of the rows that `written` says were not written.
    pub(crate) fn missed<Tok>(&self, written: &[Option<Written<Tok>>]) -> Vec<T::Key> {
        self.rows
            .iter()
            .zip(written)
            .filter(|(_, written)| written.is_none())
            .map(|(row, _)| row.key.clone())
            .collect()
    }

    /// Each row's outcome: its new token where `written` says it was written, else the
    /// explanation of its miss given the missed rows as they are now (`current`, read by
    /// key), as a single write explains one ([`RowMoved`]); `report` says what a written
    /// row reports.
    pub(crate) fn outcomes<Out>(
        self,
        table: &'static str,
        written: Vec<Option<Written<TokenOf<T>>>>,
        mut current: Vec<T>,
        report: fn(Option<TokenOf<T>>, TokenOf<T>) -> Out,
    ) -> Result<Vec<RowOutcome<Out>>, Error> {
        self.rows
            .into_iter()
            .zip(written)
            .map(|(row, written)| {
                let (key, expected, next) = row.into_parts();
                if let Some(written) = written {
                    return Ok(RowOutcome::Written(report(written.token, next)));
                }
                let found = current.iter().position(|c| c.key() == key);
                let current = found.map(|i| current.swap_remove(i));
                let miss = RowMoved::<T>::expecting(&key, &expected);
                outcome::<Out>(Err(miss.given_in(table, current)))
            })
            .collect()
    }
}

/// A row's write result as an outcome; errors that are not about the row end the batch.
pub(crate) fn outcome<T>(result: Result<T, Error>) -> Result<RowOutcome<T>, Error> {
    match result {
        Ok(token) => Ok(RowOutcome::Written(token)),
        Err(Error::Conflict(conflict)) => Ok(RowOutcome::Conflict(conflict)),
        Err(Error::NotFound { .. }) => Ok(RowOutcome::NotFound),
        Err(Error::Refused { token, .. }) => Ok(RowOutcome::Refused(token)),
        Err(other) => Err(other),
    }
}
