//! Pre-image guards (`#[occ(pre_image)]` on the struct, or `#[occ(compare)]` on fields):
//! the old values of some columns are the token. They need no schema change, so they
//! suit legacy tables.
//!
//! `UPDATE t SET <changes> WHERE <key> AND a IS NOT DISTINCT FROM ?a AND b ...`: the row
//! is written only while the compared columns still hold the values the caller read.
//! The comparison is NULL-safe on every backend (PostgreSQL `IS NOT DISTINCT FROM`, MySQL
//! `<=>`, SQLite `IS`), so a NULL the caller read matches a NULL that is still there.
//!
//! What it protects, and what it cannot see: a write fails when any compared column
//! changed since the read. A column that changed and changed back (valid → taken → valid,
//! the ABA case) looks unchanged, so the write goes through; a version or last-modified
//! guard sees it. Columns left out of the comparison (`#[occ(exclude)]`, or all but the
//! `#[occ(compare)]` ones) can change under the caller without a conflict.
//!
//! Only columns whose values compare exactly can be compared: floating-point columns
//! (a value read back may differ in its last bit) and PostgreSQL `json` (no equality
//! operator) are refused at compile time; exclude them.

use std::marker::PhantomData;

use diesel::query_builder::{AsChangeset, AstPass, QueryFragment, QueryId};
use diesel::serialize::ToSql;
use diesel::sql_types::HasSqlType;
use diesel::{Column, QueryResult};

use crate::connect::backend::OccBackend;
use crate::guard::Guarded;
use crate::sql::statement::{GuardedUpdate, Unguarded};

/// SQL types whose values a pre-image guard can compare exactly.
#[diagnostic::on_unimplemented(
    message = "a `{Self}` column cannot be compared exactly, so a pre-image guard cannot use it",
    label = "this field's column",
    note = "floating-point values may differ in their last bit when read back, and PostgreSQL `json` has no equality; leave the field out with `#[occ(exclude)]`, compare named fields with `#[occ(compare)]`, or use a version column"
)]
pub trait ExactlyComparable {}

macro_rules! exactly_comparable {
    ($($ty:ty),* $(,)?) => {$(
        impl ExactlyComparable for $ty {}
    )*};
}

exactly_comparable!(
    diesel::sql_types::SmallInt,
    diesel::sql_types::Integer,
    diesel::sql_types::BigInt,
    diesel::sql_types::Text,
    diesel::sql_types::Bool,
    diesel::sql_types::Binary,
    diesel::sql_types::Date,
    diesel::sql_types::Time,
    diesel::sql_types::Timestamp,
    diesel::sql_types::Numeric,
);

impl<T: ExactlyComparable + diesel::sql_types::SqlType> ExactlyComparable
    for diesel::sql_types::Nullable<T>
{
}

#[cfg(feature = "postgres")]
exactly_comparable!(
    diesel::sql_types::Timestamptz,
    diesel::sql_types::Uuid,
    diesel::sql_types::Jsonb,
);

#[cfg(feature = "mysql")]
exactly_comparable!(diesel::sql_types::TinyInt, diesel::sql_types::Datetime);

#[cfg(feature = "mysql")]
impl<T: ExactlyComparable> ExactlyComparable for diesel::sql_types::Unsigned<T> {}

#[cfg(feature = "sqlite")]
exactly_comparable!(diesel::sql_types::TimestamptzSqlite);

/// `column <null-safe => ?`: the column still holds `value`, NULL included.
#[derive(Debug, Clone)]
pub struct NullSafeEq<Col, V>
where
    Col: Column,
    Col::SqlType: ExactlyComparable,
{
    value: V,
    column: PhantomData<Col>,
}

impl<Col, V> NullSafeEq<Col, V>
where
    Col: Column,
    Col::SqlType: ExactlyComparable,
{
    /// `column` still holds `value`.
    pub fn new(value: V) -> Self {
        NullSafeEq {
            value,
            column: PhantomData,
        }
    }
}

impl<Col, V, DB> QueryFragment<DB> for NullSafeEq<Col, V>
where
    DB: OccBackend + HasSqlType<Col::SqlType>,
    Col: Column,
    Col::SqlType: ExactlyComparable,
    V: ToSql<Col::SqlType, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_identifier(Col::NAME)?;
        out.push_sql(DB::NULL_SAFE_EQ);
        out.push_bind_param::<Col::SqlType, V>(&self.value)
    }
}

impl<Col, V> QueryId for NullSafeEq<Col, V>
where
    Col: Column + 'static,
    Col::SqlType: ExactlyComparable,
    V: 'static,
{
    type QueryId = Self;
    const HAS_STATIC_QUERY_ID: bool = true;
}

/// `<a> AND <b>`: the compared columns of a pre-image, leaving out whichever part is empty
/// (in a changed-columns write, the `None` comparison of a field that did not change).
pub type AllOf<A, B> = crate::sql::statement::Joined<A, B, crate::sql::statement::And>;

/// Both conditions: `a AND b`.
pub fn all_of<A, B>(a: A, b: B) -> AllOf<A, B> {
    crate::sql::statement::Joined(a, b, crate::sql::statement::And)
}

/// An entity with a `#[occ(pre_image)]` guard that can also be written column by column:
/// only the fields a modified copy changed are written, and only their old values are
/// compared (Hibernate's "dirty" optimistic lock). Implemented by the derive.
pub trait ChangedColumns: Guarded {
    /// The changed fields' new values (`None` for a field that did not change).
    type ChangedValues: AsChangeset<Target = Self::Table>;

    /// The changed fields' old values, compared NULL-safely.
    type OldValues;

    /// What `self` changed since `original`, or `None` when nothing did.
    fn changed_since(&self, original: &Self) -> Option<(Self::ChangedValues, Self::OldValues)>;
}

/// The changed-columns `UPDATE` of entity `T`.
pub(crate) type ChangedUpdateOf<T> = GuardedUpdate<
    <T as diesel::associations::HasTable>::Table,
    <<T as ChangedColumns>::ChangedValues as AsChangeset>::Changeset,
    crate::sql::statement::AlsoSet<Unguarded, <T as Guarded>::Stamp>,
    <T as Guarded>::KeyPredicate,
    <T as ChangedColumns>::OldValues,
>;
