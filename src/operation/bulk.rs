//! A bulk update: every row a filter matches, in one statement.

use std::marker::PhantomData;

use super::Operation;
use crate::error::Error;

/// A guarded update of every row of entity `T` that `filter` matches, with `changes`,
/// advancing each row's token in SQL.
pub struct BulkUpdate<T, F, Ch> {
    pub(crate) filter: F,
    pub(crate) changes: Ch,
    entity: PhantomData<fn() -> T>,
}

impl<T, F, Ch> BulkUpdate<T, F, Ch> {
    /// The update of the rows `filter` matches with `changes`.
    pub(crate) fn new(filter: F, changes: Ch) -> Self {
        Self {
            filter,
            changes,
            entity: PhantomData,
        }
    }
}

impl<T, F, Ch> Operation for BulkUpdate<T, F, Ch> {
    type Output = BulkReport;
    type Error = Error;
}

/// What a bulk update did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BulkReport {
    /// Rows changed (and their versions advanced).
    pub updated: usize,
    /// Rows the filter matched that were left unchanged because their version is at its
    /// type's maximum and cannot advance.
    pub at_maximum: usize,
}

impl BulkReport {
    /// `updated` rows changed, `at_maximum` (a count read back) left alone.
    pub(crate) fn of(updated: usize, at_maximum: i64) -> Self {
        BulkReport {
            updated,
            at_maximum: usize::try_from(at_maximum).unwrap_or(usize::MAX),
        }
    }
}
