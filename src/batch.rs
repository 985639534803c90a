//! Batches of guarded writes with an outcome per row.
//!
//! Each row is `(key, the token the caller read, changes)`. Every row is tried, so the
//! caller learns at once which rows were written, which conflicted (with their current
//! row) and which were missing, instead of stopping at the first miss. In
//! [`BatchMode::AllOrNothing`] the batch runs in a transaction (a savepoint inside the
//! caller's) that is committed only when every row was written; in
//! [`BatchMode::Partial`] each written row stays written.
//!
//! Cost: one statement per row, plus one read per row that missed, plus the
//! transaction's `BEGIN` and `COMMIT` in all-or-nothing mode, on every backend. A batch
//! in a constant number of round trips (PostgreSQL `UPDATE ... FROM (VALUES ...)`) is
//! not offered yet.

use diesel::connection::LoadConnection;
use diesel::query_builder::AsChangeset;

use crate::backend::OccBackend;
use crate::completion::Complete;
use crate::connection::WriteTransaction;
use crate::error::{Conflict, Error, Token};
use crate::guard::{CompletionOf, TokenOf};
use crate::statement::CompareAndSet;
use crate::update::{GuardedWrite, LoadByKey, UpdateOf};

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
        C: LoadConnection + WriteTransaction,
        C::Backend: OccBackend,
        Ch: AsChangeset<Target = Self::Table>,
        I: IntoIterator<Item = (Self::Key, TokenOf<Self>, Ch)>,
        UpdateOf<Self, Ch::Changeset>: CompareAndSet<C::Backend>,
        CompletionOf<Self>: Complete<C, UpdateOf<Self, Ch::Changeset>, TokenOf<Self>>,
        Self: LoadByKey<C>,
    {
        let run = |conn: &mut C| -> Result<Vec<RowOutcome<TokenOf<Self>>>, Error> {
            rows.into_iter()
                .map(|(key, expected, changes)| {
                    outcome(Self::guarded_update_by_key(conn, &key, &expected, changes))
                })
                .collect()
        };
        match mode {
            BatchMode::Partial => Ok(BatchReport {
                rows: run(conn)?,
                applied: true,
            }),
            BatchMode::AllOrNothing => {
                let mut report = Vec::new();
                let committed = conn.write_transaction(|conn| {
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
}

impl<T: GuardedWrite> GuardedBatch for T {}

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
