//! The version-column guard (`#[occ(version)]`), the classic optimistic lock.

use std::fmt::Debug;
use std::marker::PhantomData;

use diesel::backend::Backend;
use diesel::query_builder::{AstPass, QueryFragment};
use diesel::serialize::ToSql;
use diesel::sql_types::{BigInt, HasSqlType, Integer, SmallInt};
use diesel::{Column, Expression, QueryResult};

use crate::error::Token;
use crate::guard::{AdvanceInSql, Advancing, GuardKind};
use crate::sql::statement::{ColumnEq, Increment};

/// The version-column guard (`#[occ(version)]`): `version = ?` proves the row, `version =
/// ?next` advances it, with the next version computed in Rust.
pub struct VersionGuard<Col, V>(PhantomData<(Col, V)>);

impl<Col, V> GuardKind for VersionGuard<Col, V>
where
    Col: Column + VersionColumnFor<V>,
    V: VersionNumber,
{
    type Token = V;
    type Predicate = ColumnEq<Col, V>;
    type Advance = ColumnEq<Col, V>;
    type Completion = crate::sql::new_token::Counted;

    fn predicate(token: &V) -> Self::Predicate {
        ColumnEq::new(*token)
    }

    fn advance(token: &V) -> Option<(Self::Advance, V)> {
        token.next().map(|next| (ColumnEq::new(next), next))
    }

    fn describe(token: &V) -> Token {
        Token::Version(token.widen())
    }

    /// Versions only grow: a version at its maximum refuses the next write, never wraps.
    fn precedes(found: &V, expected: &V) -> bool {
        found.widen() < expected.widen()
    }
}

impl<Col, V> Advancing for VersionGuard<Col, V> where Self: GuardKind {}

/// `version = version + 1 ... AND version <> ?max`: a row at its type's maximum is left
/// alone (SQLite would turn `i64::MAX + 1` into a float), and the new version comes back
/// with the statement.
impl<Col, V> AdvanceInSql for VersionGuard<Col, V>
where
    Col: Column + VersionColumnFor<V>,
    V: VersionNumber,
{
    type AdvanceAny = Increment<Col>;
    type CanAdvance = BelowMaximum<Col, V>;
    type TokenColumn = Col;
    type ReadBack = crate::sql::new_token::ReturnedVersion<Col>;

    fn advance_any() -> Increment<Col> {
        Increment::default()
    }

    fn can_advance() -> BelowMaximum<Col, V> {
        BelowMaximum::default()
    }

    fn at_end(token: &V) -> bool {
        *token == V::MAX
    }
}

/// The integer types a version column may have.
///
/// The next version is computed here, not in SQL, so that the executor knows the new
/// token without reading the row back and so that overflow is one rule on every backend
/// (SQLite would silently turn `i64::MAX + 1` into a float).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a version: use `i16`, `i32` or `i64` (`u16`, `u32`, `u64` for MySQL UNSIGNED columns)",
    label = "not a version type",
    note = "an `Option<_>` version is refused: a NULL version would let writes skip the check; make the column NOT NULL"
)]
pub trait VersionNumber: Copy + Debug + PartialEq + Send + Sync + 'static {
    /// The SQL type of a NOT NULL column holding this version.
    type SqlType;

    /// The largest version; a row holding it cannot be written any more.
    const MAX: Self;

    /// The version after this one, or `None` at the type's maximum. Versions never wrap:
    /// a wrapped version would repeat an old token and let a stale copy win.
    fn next(self) -> Option<Self>;

    /// Widened for messages and [`Token`].
    fn widen(self) -> i128;

    /// The version MySQL's `LAST_INSERT_ID(version)` noted: the session keeps it as an
    /// unsigned 64-bit value (a negative one in two's complement); `None` if it does not
    /// fit this type.
    #[doc(hidden)]
    fn from_noted(noted: u64) -> Option<Self>;
}

macro_rules! version_number {
    ($($t:ty => $sql:ty, $noted:ty);*) => {$(
        impl VersionNumber for $t {
            type SqlType = $sql;
            const MAX: Self = <$t>::MAX;
            fn next(self) -> Option<Self> {
                self.checked_add(1)
            }
            fn widen(self) -> i128 {
                i128::from(self)
            }
            fn from_noted(noted: u64) -> Option<Self> {
                // Reinterpreted, not converted: the session stores a signed value's bits.
                <$t>::try_from(noted as $noted).ok()
            }
        }
    )*};
}

version_number!(i16 => SmallInt, i64; i32 => Integer, i64; i64 => BigInt, i64);
#[cfg(feature = "mysql")]
version_number!(
    u16 => diesel::sql_types::Unsigned<SmallInt>, u64;
    u32 => diesel::sql_types::Unsigned<Integer>, u64;
    u64 => diesel::sql_types::Unsigned<BigInt>, u64
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

/// `"version" <> ?max`: the rows whose version can still advance.
///
/// The same rows as `< ?max` (a version never passes its type's maximum), written so
/// that a planner without statistics on the column keeps its estimate of the rows: it
/// guesses that `<` keeps a third of them, and with that PostgreSQL sorted a whole queue
/// of claimable rows where it walks the queue's index with `<>` (W6 in BENCHMARKS.md).
#[derive(Debug, Clone, Copy)]
pub struct BelowMaximum<Col, V> {
    max: V,
    column: PhantomData<Col>,
}

impl<Col, V: VersionNumber> Default for BelowMaximum<Col, V> {
    fn default() -> Self {
        BelowMaximum {
            max: V::MAX,
            column: PhantomData,
        }
    }
}

impl<Col, V, DB> QueryFragment<DB> for BelowMaximum<Col, V>
where
    DB: Backend + HasSqlType<Col::SqlType>,
    Col: Column,
    V: VersionNumber + ToSql<Col::SqlType, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_identifier(Col::NAME)?;
        out.push_sql(" <> ");
        out.push_bind_param::<Col::SqlType, V>(&self.max)
    }
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
