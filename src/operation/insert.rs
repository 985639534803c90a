//! Writes that may create the row: a guarded insert and an upsert. Each owns the copy it
//! writes and answers it as written (its first or new token and stamp recorded), for the
//! caller to keep.

use crate::guard::{Guarded, TokenOf};

use super::Operation;
use crate::error::Error;

/// A guarded insert of `row` with a seeded first token. Answers the copy as inserted and
/// that token.
pub struct Insert<T> {
    pub(crate) row: T,
}

impl<T: Guarded> Insert<T> {
    /// The insert of `row` (the blocking API inserts in place).
    #[cfg(feature = "async")]
    pub(crate) fn new(row: T) -> Self {
        Self { row }
    }
}

impl<T: Guarded> Operation for Insert<T> {
    type Output = (T, TokenOf<T>);
    type Error = Error;
}

/// A save of `row` over its row while the row holds the copy's token, or its insert when
/// no row has its key. Answers the copy as written and which of the two happened.
pub struct Upsert<T> {
    pub(crate) row: T,
}

impl<T: Guarded> Upsert<T> {
    /// The upsert of `row` (the blocking API upserts in place).
    #[cfg(feature = "async")]
    pub(crate) fn new(row: T) -> Self {
        Self { row }
    }
}

impl<T: Guarded> Operation for Upsert<T> {
    type Output = (T, Upserted<TokenOf<T>>);
    type Error = Error;
}

/// What an upsert did, with the token the row now holds (also recorded in the copy).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Upserted<Tok> {
    /// No row had the key: the copy was inserted, with a seeded first token.
    Inserted(Tok),
    /// The row held the copy's token: the copy was saved over it.
    Updated(Tok),
}

impl<Tok> Upserted<Tok> {
    /// The token the row holds now.
    pub fn token(&self) -> &Tok {
        match self {
            Upserted::Inserted(token) | Upserted::Updated(token) => token,
        }
    }
}
