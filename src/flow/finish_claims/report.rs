//! What ending many claims did, key by key, and how the keys are taken: once each, in
//! statements of at most [`KEYS_PER_STATEMENT`].

use crate::error::Error;
use crate::flow::claim_lost::ClaimLost;
use crate::guard::status::HasStatus;
use crate::guard::AdvanceInSql;

/// What ending a batch of claims did, key by key (each key once, in the order given).
#[derive(Debug)]
pub struct FinishedClaims<K> {
    /// The claims that ended: these rows were this worker's and are now in the new state.
    pub finished: Vec<K>,
    /// The claims that had already been lost, each with why: [`Error::LockLost`] (another
    /// worker took the row over, or it left the held state), [`Error::NotFound`] (the row
    /// is gone) or [`Error::VersionOverflow`] (its version cannot advance).
    pub lost: Vec<(K, Error)>,
}

impl<K> FinishedClaims<K> {
    /// Whether every claim ended.
    pub fn all_finished(&self) -> bool {
        self.lost.is_empty()
    }
}

impl<K> Default for FinishedClaims<K> {
    fn default() -> Self {
        FinishedClaims {
            finished: Vec::new(),
            lost: Vec::new(),
        }
    }
}

impl<K: PartialEq + Clone + std::fmt::Debug> FinishedClaims<K> {
    /// Adds the outcome for `key`, which is not among the keys of the rows the statement
    /// wrote (`ended`, as stored): `current` is the row the database finds by `key` now
    /// (in `table`). It is finished if that row is one of them after all (a key the
    /// database compares more loosely than `==`), otherwise lost, and why.
    pub(crate) fn add_looked_up<T>(
        &mut self,
        table: &'static str,
        key: &K,
        ended: &[K],
        current: Option<T>,
        claim: (&str, T::Status),
    ) where
        T: HasStatus<Key = K>,
        T::Guard: AdvanceInSql,
    {
        let (owner, held) = claim;
        match current {
            Some(row) if ended.contains(&row.key()) => self.finished.push(key.clone()),
            row => {
                let why = ClaimLost::<T> { key, owner, held }.given(table, row);
                self.lost.push((key.clone(), why));
            }
        }
    }

    /// Adds the outcome of ending the claim on `key` alone: finished, lost, or an error
    /// that is not about the row (handed back).
    pub(crate) fn add_alone(&mut self, key: &K, ended: Result<(), Error>) -> Result<(), Error> {
        match ended {
            Ok(()) => self.finished.push(key.clone()),
            Err(
                why @ (Error::LockLost { .. }
                | Error::NotFound { .. }
                | Error::VersionOverflow { .. }),
            ) => self.lost.push((key.clone(), why)),
            Err(other) => return Err(other),
        }
        Ok(())
    }
}

/// Keys per statement. A key of several columns is an `OR` chain of the keys, which
/// SQLite parses as an expression tree as deep as the chain (at most 1,000 by default: 996
/// keys fail); the bound parameters stay far below every backend's limit for keys of up
/// to 16 columns. A one-column key needs no split (an `IN` list, one array on
/// PostgreSQL), but the same size keeps each statement's locks and reply short.
pub(crate) const KEYS_PER_STATEMENT: usize = 500;

/// `keys` without repeats, in their first order. Keys are only `PartialEq`, so this is
/// quadratic: meant for a batch a worker claimed (hundreds of keys), not for a table.
pub(crate) fn distinct<K: PartialEq + Clone>(keys: &[K]) -> Vec<K> {
    let mut seen: Vec<K> = Vec::with_capacity(keys.len());
    for key in keys {
        if !seen.contains(key) {
            seen.push(key.clone());
        }
    }
    seen
}
