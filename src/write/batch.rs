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
//! - PostgreSQL: one statement for all the rows ([`Combined`](crate::sql::combined_updates::Combined): each row's guarded
//!   `UPDATE` in one `WITH`), plus one read of all the rows that missed. A statement holds
//!   at most [`ROWS_PER_STATEMENT`] rows and [`BINDS_PER_STATEMENT`] bound values, and a
//!   key that comes again starts the next statement (two updates of one row in one
//!   statement would race), so a batch of n distinct keys costs 2 * ceil(n / 20) round
//!   trips at most: about 2.5x faster than one statement per row (BENCHMARKS.md, W5).
//! - MySQL / MariaDB and SQLite: one statement per row, plus one read per row that
//!   missed. Neither can put several updates in one statement; SQLite runs in-process, so
//!   its round trips are function calls.
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
use crate::write::executor::{classify, refuse_double_assignment, run_each};

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
        in_mode(conn, mode, |conn| {
            rows.into_iter()
                .map(|(key, expected)| outcome(Self::delete_row(conn, &key, &expected)))
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

/// The most rows one combined statement holds. PostgreSQL's planning of a `WITH` grows
/// faster than its parts: measured on PostgreSQL 15 (1,000 guarded updates in one
/// transaction), one part per statement took 180-230 ms, 10 or 25 parts 60-80 ms, 100
/// parts 95-110 ms, and all 1,000 in one statement 470-590 ms.
pub const ROWS_PER_STATEMENT: usize = 20;

/// The most bound values one statement may carry: PostgreSQL's wire protocol counts them
/// in 16 bits.
pub(crate) const BINDS_PER_STATEMENT: usize = u16::MAX as usize;

/// One row of a combined statement: its key, the token it expects, the token a written
/// row holds when the guard computes it, and how many values it binds.
struct Pending<T: Guarded> {
    key: T::Key,
    expected: TokenOf<T>,
    next: TokenOf<T>,
    binds: usize,
}

/// The batch as [`Combined`](crate::sql::combined_updates::Combined) statements: each row's guarded update, sent a statement
/// at a time, then one read of the rows each statement missed.
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
    let mut outcomes = Vec::new();
    let (mut pending, mut updates) = (Vec::<Pending<T>>::new(), Vec::new());
    for (key, expected, changes) in rows {
        let (update, next) =
            guarded_statement::<T, C, Ch>(&key, &expected, changes, T::stamp(), None)?;
        // Refused before any statement of the batch is sent, as a single write is.
        refuse_double_assignment(T::table_name(), &update)?;
        // PostgreSQL numbers its parameters `$1`, `$2`, ...; a `$` in a quoted name only
        // makes the count, and so the statement, smaller.
        let binds = C::Backend::render(&update)?.matches('$').count();
        let bound: usize = pending.iter().map(|row| row.binds).sum();
        let full = pending.len() == ROWS_PER_STATEMENT || bound + binds > BINDS_PER_STATEMENT;
        if full || pending.iter().any(|row| row.key == key) {
            outcomes.extend(run_combined::<T, C, _>(
                conn,
                pending.drain(..),
                updates.drain(..),
            )?);
        }
        pending.push(Pending {
            key,
            expected,
            next,
            binds,
        });
        updates.push(update);
    }
    outcomes.extend(run_combined::<T, C, _>(
        conn,
        pending.drain(..),
        updates.drain(..),
    )?);
    Ok(outcomes)
}

/// Sends `updates` (of the `pending` rows, in order) as one statement and reads back the
/// rows it missed, all at once, to explain each miss as a single write does ([`RowMoved`]).
fn run_combined<T, C, S>(
    conn: &mut C,
    pending: impl Iterator<Item = Pending<T>>,
    updates: impl Iterator<Item = S>,
) -> Result<Vec<RowOutcome<TokenOf<T>>>, Error>
where
    T: LoadByKey<C>,
    C: LoadConnection,
    C::Backend: OccBackend,
    S: Assignments<C::Backend>,
    CompletionOf<T>: CompleteEach<C, S, TokenOf<T>>,
{
    let pending: Vec<_> = pending.collect();
    let writes = updates
        .zip(&pending)
        .map(|(update, row)| (update, &row.key as &dyn std::fmt::Debug))
        .collect();
    let written = run_each::<C, S, CompletionOf<T>, TokenOf<T>>(conn, T::table_name(), writes)?;
    let missed: Vec<T::Key> = pending
        .iter()
        .zip(&written)
        .filter(|(_, written)| written.is_none())
        .map(|(row, _)| row.key.clone())
        .collect();
    let mut current = match T::load_by_keys(conn, &missed) {
        Ok(current) => current,
        Err(e) => return Err(unreadable::<T, C>(&missed, e).unwrap_or_else(|e| classify(conn, e))),
    };
    pending
        .iter()
        .zip(written)
        .map(|(row, written)| {
            if let Some(written) = written {
                return Ok(RowOutcome::Written(
                    written.token.unwrap_or_else(|| row.next.clone()),
                ));
            }
            let found = current.iter().position(|c| c.key() == row.key);
            let current = found.map(|i| current.swap_remove(i));
            let miss = RowMoved::<T>::expecting(&row.key, &row.expected);
            outcome::<TokenOf<T>>(Err(miss.given::<C>(current)))
        })
        .collect()
}

/// A row's write result as an outcome; errors that are not about the row end the batch.
fn outcome<T>(result: Result<T, Error>) -> Result<RowOutcome<T>, Error> {
    match result {
        Ok(token) => Ok(RowOutcome::Written(token)),
        Err(Error::Conflict(conflict)) => Ok(RowOutcome::Conflict(conflict)),
        Err(Error::NotFound { .. }) => Ok(RowOutcome::NotFound),
        Err(Error::Refused { token, .. }) => Ok(RowOutcome::Refused(token)),
        Err(other) => Err(other),
    }
}
