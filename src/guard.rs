//! What an entity tells the executor about itself: its table, key and guard token.
//!
//! `#[derive(Guarded)]` writes the implementation from the struct and the attributes
//! diesel already reads (`table_name`, `primary_key`, `column_name`), so the schema stays
//! the user's own `table!` and nothing is named twice.

use std::fmt::Debug;

use diesel::associations::HasTable;
use diesel::query_builder::AsChangeset;
use diesel::sql_types::{BigInt, Integer, SmallInt};
use diesel::{Column, Expression};

/// An entity whose updates are guarded by a version column.
///
/// Implement it with `#[derive(Guarded)]`; the write methods come from
/// [`GuardedWrite`](crate::GuardedWrite), implemented for every `Guarded` type.
/// The row must be `Debug + Send + Sync + 'static` so that a
/// [`Conflict`](crate::Conflict) can carry the current row inside [`Error`](crate::Error).
pub trait Guarded: HasTable + Debug + Send + Sync + Sized + 'static {
    /// The primary key's value: the field's type, or a tuple for composite keys.
    type Key: Clone + Debug + Send + Sync + 'static;

    /// `key_column = key` (joined with `AND` for composite keys).
    type KeyPredicate;

    /// The version's Rust type: `i16`, `i32` or `i64` (or `u16`, `u32`, `u64` for MySQL
    /// `UNSIGNED` columns), or an alias of one.
    type Version: VersionNumber;

    /// The version column of [`HasTable::Table`]: NOT NULL, of the version's SQL type.
    type VersionColumn: Column<Table = Self::Table> + VersionColumnFor<Self::Version> + Default;

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
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a version: use `i16`, `i32` or `i64` (`u16`, `u32`, `u64` for MySQL UNSIGNED columns)",
    label = "not a version type"
)]
pub trait VersionNumber: Copy + Debug + PartialEq + Send + Sync + 'static {
    /// The SQL type of a NOT NULL column holding this version.
    type SqlType;

    /// The version after this one, or `None` at the type's maximum. Versions never wrap:
    /// a wrapped version would repeat an old token and let a stale copy win.
    fn next(self) -> Option<Self>;

    /// Widened for messages and [`Token`](crate::Token).
    fn widen(self) -> i128;
}

macro_rules! version_number {
    ($($t:ty => $sql:ty),*) => {$(
        impl VersionNumber for $t {
            type SqlType = $sql;
            fn next(self) -> Option<Self> {
                self.checked_add(1)
            }
            fn widen(self) -> i128 {
                i128::from(self)
            }
        }
    )*};
}

version_number!(i16 => SmallInt, i32 => Integer, i64 => BigInt);
#[cfg(feature = "mysql")]
version_number!(
    u16 => diesel::sql_types::Unsigned<SmallInt>,
    u32 => diesel::sql_types::Unsigned<Integer>,
    u64 => diesel::sql_types::Unsigned<BigInt>
);

/// A column that can hold versions of type `V`: NOT NULL and of `V`'s SQL type. A
/// nullable version column would let a NULL silently disable the check.
#[diagnostic::on_unimplemented(
    message = "the version column `{Self}` does not hold `{V}` values: it must be NOT NULL and of the version's SQL type",
    label = "this field's column",
    note = "`i16`, `i32`, `i64` need SmallInt, Integer, BigInt (`u16`.. need Unsigned<..>); a `Nullable<..>` column is refused: a NULL version would disable the check"
)]
pub trait VersionColumnFor<V> {}

impl<C, V> VersionColumnFor<V> for C
where
    V: VersionNumber,
    C: Column + Expression<SqlType = V::SqlType>,
{
}

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
