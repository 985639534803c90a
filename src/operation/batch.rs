//! Batches: many rows' guarded updates or deletes with an outcome per row, and the
//! report they answer.

use crate::error::{Conflict, Token};
use crate::guard::{Guarded, TokenOf};

use super::Operation;
use crate::error::Error;

/// Guarded updates of many rows, each `(key, expected token, changes)`, in `mode`.
pub struct BatchUpdate<T: Guarded, Ch> {
    pub(crate) rows: Vec<(T::Key, TokenOf<T>, Ch)>,
    pub(crate) mode: BatchMode,
}

impl<T: Guarded, Ch> BatchUpdate<T, Ch> {
    /// The updates of `rows` in `mode`.
    pub(crate) fn new(rows: Vec<(T::Key, TokenOf<T>, Ch)>, mode: BatchMode) -> Self {
        Self { rows, mode }
    }
}

impl<T: Guarded, Ch> Operation for BatchUpdate<T, Ch> {
    type Output = BatchReport<TokenOf<T>>;
    type Error = Error;
}

/// Guarded deletes of many rows, each `(key, expected token)`, in `mode`.
pub struct BatchDelete<T: Guarded> {
    pub(crate) rows: Vec<(T::Key, TokenOf<T>)>,
    pub(crate) mode: BatchMode,
}

impl<T: Guarded> BatchDelete<T> {
    /// The deletes of `rows` in `mode`.
    pub(crate) fn new(rows: Vec<(T::Key, TokenOf<T>)>, mode: BatchMode) -> Self {
        Self { rows, mode }
    }
}

impl<T: Guarded> Operation for BatchDelete<T> {
    type Output = BatchReport<()>;
    type Error = Error;
}

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
