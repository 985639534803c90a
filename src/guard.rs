//! What an entity tells the executor about itself: its table, key and guard token.
//!
//! `#[derive(Guarded)]` writes the implementation from the struct and the attributes
//! diesel already reads (`table_name`, `primary_key`, `column_name`), so the schema stays
//! the user's own `table!` and nothing is named twice.

use std::fmt::Debug;

use diesel::associations::HasTable;
use diesel::query_builder::AsChangeset;
use diesel::Column;

/// An entity whose updates are guarded by a version column.
///
/// Implement it with `#[derive(Guarded)]`; the write methods come from
/// [`GuardedWrite`](crate::GuardedWrite), implemented for every `Guarded` type.
/// The row must be `Debug + Send + Sync + 'static` so that a
/// [`Conflict`](crate::Conflict) can carry the current row inside [`Error`](crate::Error).
pub trait Guarded: HasTable + Debug + Send + Sync + Sized + 'static {
    /// The table's name, for messages.
    const TABLE_NAME: &'static str;

    /// The primary key's value: the field's type, or a tuple for composite keys.
    type Key: Clone + Debug + Send + Sync + 'static;

    /// `key_column = key` (joined with `AND` for composite keys).
    type KeyPredicate;

    /// The version's Rust type: `i16`, `i32` or `i64`.
    type Version: VersionNumber;

    /// The version column of [`HasTable::Table`].
    type VersionColumn: Column<Table = Self::Table> + Default;

    /// Every updatable column set from the entity's fields (key and version excluded).
    /// Values are cloned out of the entity: a borrowed changeset would need a lifetime in
    /// every bound that names it, and a clone costs far less than the round trip.
    type Changes: AsChangeset<Target = Self::Table>;

    /// This row's key.
    fn key(&self) -> Self::Key;

    /// The predicate that selects the row with `key`.
    fn key_predicate(key: &Self::Key) -> Self::KeyPredicate;

    /// The version this copy was read at.
    fn version(&self) -> Self::Version;

    /// Records the version the row has after a successful write.
    fn set_version(&mut self, version: Self::Version);

    /// All updatable fields as a changeset, used by
    /// [`guarded_save`](crate::GuardedWrite::guarded_save).
    fn changes(&self) -> Self::Changes;
}

/// The integer types a version column may have.
///
/// The next version is computed here, not in SQL, so that the executor knows the new
/// token without reading the row back and so that overflow is one rule on every backend
/// (SQLite would silently turn `i64::MAX + 1` into a float).
pub trait VersionNumber: Copy + Debug + PartialEq + Send + Sync + 'static {
    /// The version after this one, or `None` at the type's maximum. Versions never wrap:
    /// a wrapped version would repeat an old token and let a stale copy win.
    fn next(self) -> Option<Self>;

    /// Widened for messages and [`Token`](crate::Token).
    fn widen(self) -> i64;
}

macro_rules! version_number {
    ($($t:ty),*) => {$(
        impl VersionNumber for $t {
            fn next(self) -> Option<Self> {
                self.checked_add(1)
            }
            fn widen(self) -> i64 {
                i64::from(self)
            }
        }
    )*};
}

version_number!(i16, i32, i64);

#[cfg(test)]
mod tests {
    use super::VersionNumber;

    #[test]
    fn versions_stop_at_the_maximum_instead_of_wrapping() {
        assert_eq!(41i16.next(), Some(42));
        assert_eq!(i16::MAX.next(), None);
        assert_eq!(i32::MAX.next(), None);
        assert_eq!(i64::MAX.next(), None);
        assert_eq!((i64::MAX - 1).next(), Some(i64::MAX));
    }
}
