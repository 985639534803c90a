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

use crate::connect::backend::OccBackend;
use crate::connect::transaction::{commit_operation, WriteTransaction};
use crate::error::{Conflict, Error, Token};
use crate::guard::stored_precision::check_stored_precision;
use crate::guard::{CompletionOf, Guarded, TokenOf};
use crate::sql::new_token::CompleteEach;
use crate::sql::statement::Assignments;
use crate::write::entity::{
    guarded_statement, unreadable, DeleteRow, GuardedWrite, LoadByKey, RowMoved, UpdateOf,
    UpdateRow,
};
use crate::write::executor::{classify, refuse_double_assignment, run_each, Written};

/// Whether a batch keeps the rows it could write when others miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchMode {
    /// Commit only if every row was written; otherwise roll every row back.
    AllOrNothing,
    /// Keep every row that was written.
    Partial,
}

/// What happened to one row of a batch.
#[derive(Debug)]
#[non_exhaustive]
pub enum RowOutcome<T> {
    /// The row held the expected token and was written; it now holds this token. In an
    /// all-or-nothing batch that was rolled back, the write was undone.
    Written(T),
    /// Someone else changed the row; the conflict carries the current row.
    Conflict(Box<Conflict>),
    /// No row has this key.
    NotFound,
    /// The row held the expected token but the database ignored the write.
    Refused(Token),
}

impl<T> RowOutcome<T> {
    /// Whether the row was written.
    pub fn is_written(&self) -> bool {
        matches!(self, RowOutcome::Written(_))
    }
}

/// The outcome of a batch: one [`RowOutcome`] per row, in the order given.
#[derive(Debug)]
pub struct BatchReport<T> {
    /// Per row, in the order the rows were given.
    pub rows: Vec<RowOutcome<T>>,
    /// Whether the written rows are in the database: always in a partial batch, only
    /// when every row was written in an all-or-nothing one.
    pub applied: bool,
}

impl<T> BatchReport<T> {
    /// The report of a batch of no rows, which sends nothing.
    pub(crate) fn empty() -> Self {
        BatchReport {
            rows: Vec::new(),
            applied: true,
        }
    }

    /// Whether every row was written (and so the batch applied).
    pub fn all_written(&self) -> bool {
        self.rows.iter().all(RowOutcome::is_written)
    }
}

/// Guarded batches for every [`GuardedWrite`] entity.
pub trait GuardedBatch: GuardedWrite {
    /// Applies each `(key, expected token, changes)` row as
    /// [`guarded_update_by_key`](GuardedWrite::guarded_update_by_key) would, and reports
    /// every row's outcome. Misses (conflict, not found, refused) are outcomes; a database
    /// error (a deadlock, a lost connection) ends the batch with that error, after rolling
    /// back an all-or-nothing batch.
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
        let mut rows = rows.into_iter().peekable();
        if rows.peek().is_none() {
            return Ok(BatchReport::empty());
        }
        in_mode(conn, mode, |conn| Self::update_rows(conn, rows))
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
        let mut rows = rows.into_iter().peekable();
        if rows.peek().is_none() {
            return Ok(BatchReport::empty());
        }
        in_mode(conn, mode, |conn| {
            rows.map(|(key, expected)| outcome(Self::delete_row(conn, &key, &expected)))
                .collect()
        })
    }
}

/// Runs a batch's rows in `mode`: as they come in a partial batch; in an all-or-nothing
/// one, in a transaction (a savepoint inside the caller's) committed only when every row
/// was written.
fn in_mode<C, Tok>(
    conn: &mut C,
    mode: BatchMode,
    run: impl FnOnce(&mut C) -> Result<Vec<RowOutcome<Tok>>, Error>,
) -> Result<BatchReport<Tok>, Error>
where
    C: WriteTransaction,
{
    match mode {
        BatchMode::Partial => Ok(BatchReport {
            rows: run(conn)?,
            applied: true,
        }),
        BatchMode::AllOrNothing => {
            let mut report = Vec::new();
            let committed = commit_operation(conn, |conn| {
                report = run(conn)?;
                if report.iter().all(RowOutcome::is_written) {
                    Ok(())
                } else {
                    // diesel's own request to roll back, handed back unchanged.
                    Err(Error::Database(diesel::result::Error::RollbackTransaction))
                }
            });
            let missed = !report.iter().all(RowOutcome::is_written);
            match committed {
                Ok(()) => Ok(BatchReport {
                    rows: report,
                    applied: true,
                }),
                Err(Error::Database(diesel::result::Error::RollbackTransaction)) if missed => {
                    Ok(BatchReport {
                        rows: report,
                        applied: false,
                    })
                }
                Err(e) => Err(e),
            }
        }
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
    /// Writes the rows, one outcome each; [`GuardedBatch`] runs it.
    #[doc(hidden)]
    fn update_rows(
        conn: &mut C,
        rows: impl IntoIterator<Item = (Self::Key, TokenOf<Self>, Ch)>,
    ) -> Result<Vec<RowOutcome<TokenOf<Self>>>, Error>;
}

impl<T, C, Ch> UpdateBatch<C, Ch> for T
where
    T: UpdateRow<C, Ch>,
    C: LoadConnection,
    C::Backend: OccBackend,
    Ch: AsChangeset<Target = T::Table>,
    UpdateOf<T, Ch::Changeset>: Assignments<C::Backend> + QueryFragment<C::Backend>,
    CompletionOf<T>: CompleteEach<C, UpdateOf<T, Ch::Changeset>, TokenOf<T>>,
{
    fn update_rows(
        conn: &mut C,
        rows: impl IntoIterator<Item = (T::Key, TokenOf<T>, Ch)>,
    ) -> Result<Vec<RowOutcome<TokenOf<T>>>, Error> {
        if C::Backend::COMBINES_UPDATES {
            return combined::<T, C, Ch>(conn, rows);
        }
        rows.into_iter()
            .map(|(key, expected, changes)| {
                outcome(T::update_row(
                    conn,
                    &key,
                    &expected,
                    changes,
                    T::stamp(),
                    None,
                ))
            })
            .collect()
    }
}

/// The most rows one PostgreSQL batch statement holds (fewer when the rows bind more
/// than 65,535 values in all); the batch holds this many rows' statements in memory
/// before it sends them. Measured with W5 on PostgreSQL 15 on localhost (a batch of 1,000
/// rows, median of three runs): 50 rows per statement 14.4 ms, 100 rows 11.1 ms, 250 rows
/// 8.7 ms, 500 rows 9.2 ms, 1,000 rows 8.6 ms. Flat beyond 250; the largest size saves
/// the most round trips where the server is farther away.
pub const ROWS_PER_STATEMENT: usize = 1000;

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
    /// The next round's rows taken from `rows`, built as they are taken: `None` when none
    /// is left, the first build error as it comes.
    pub(crate) fn next<I>(rows: &mut std::iter::Peekable<I>) -> Result<Option<Self>, Error>
    where
        I: Iterator<Item = Result<(Pending<T>, S), Error>>,
    {
        let mut chunk = Chunk {
            rows: Vec::new(),
            updates: Vec::new(),
        };
        while chunk.rows.len() < ROWS_PER_STATEMENT {
            // A key that comes again waits for the next round, which sees this one's write.
            let again = |next: &Result<(Pending<T>, S), Error>| {
                next.as_ref()
                    .is_ok_and(|(row, _)| chunk.rows.iter().any(|r| r.key == row.key))
            };
            match rows.next_if(|next| !again(next)) {
                Some(row) => {
                    let (row, update) = row?;
                    chunk.rows.push(row);
                    chunk.updates.push(update);
                }
                None => break,
            }
        }
        Ok((!chunk.rows.is_empty()).then_some(chunk))
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
    /// key), as a single write explains one ([`RowMoved`]).
    pub(crate) fn outcomes(
        self,
        table: &'static str,
        written: Vec<Option<Written<TokenOf<T>>>>,
        mut current: Vec<T>,
    ) -> Result<Vec<RowOutcome<TokenOf<T>>>, Error> {
        self.rows
            .into_iter()
            .zip(written)
            .map(|(row, written)| {
                let (key, expected, next) = row.into_parts();
                if let Some(written) = written {
                    return Ok(RowOutcome::Written(written.token.unwrap_or(next)));
                }
                let found = current.iter().position(|c| c.key() == key);
                let current = found.map(|i| current.swap_remove(i));
                let miss = RowMoved::<T>::expecting(&key, &expected);
                outcome::<TokenOf<T>>(Err(miss.given_in(table, current)))
            })
            .collect()
    }
}

/// The batch as PostgreSQL batch statements ([`ValuesUpdate`](crate::sql::values_update::ValuesUpdate)):
/// each row's guarded update, [`ROWS_PER_STATEMENT`] rows at a time, then one read of the
/// rows they missed.
fn combined<T, C, Ch>(
    conn: &mut C,
    rows: impl IntoIterator<Item = (T::Key, TokenOf<T>, Ch)>,
) -> Result<Vec<RowOutcome<TokenOf<T>>>, Error>
where
    T: LoadByKey<C>,
    C: LoadConnection,
    C::Backend: OccBackend,
    Ch: AsChangeset<Target = T::Table>,
    UpdateOf<T, Ch::Changeset>: Assignments<C::Backend> + QueryFragment<C::Backend>,
    CompletionOf<T>: CompleteEach<C, UpdateOf<T, Ch::Changeset>, TokenOf<T>>,
{
    check_stored_precision::<T, C>(conn)?;
    let table = T::table_name();
    let mut rows = rows
        .into_iter()
        .map(|(key, expected, changes)| {
            let (update, next) =
                guarded_statement::<T, C, Ch>(&key, &expected, changes, T::stamp(), None)?;
            // Refused before the row's statement is sent, as a single write is.
            refuse_double_assignment(table, &update)?;
            Ok((Pending::new(key, expected, next), update))
        })
        .peekable();
    let mut outcomes = Vec::new();
    while let Some(mut chunk) = Chunk::next(&mut rows)? {
        let returned = run_each::<C, _, CompletionOf<T>, _>(conn, chunk.take_updates())?;
        let written = chunk.written(table, returned)?;
        let missed = chunk.missed(&written);
        let current = match T::load_by_keys(conn, &missed) {
            Ok(current) => current,
            Err(e) => {
                return Err(unreadable::<T, C>(&missed, e).unwrap_or_else(|e| classify(conn, e)))
            }
        };
        outcomes.extend(chunk.outcomes(table, written, current)?);
    }
    Ok(outcomes)
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
