//! Bulk updates by filter that advance the token of every row they change.
//!
//! `UPDATE t SET <changes>, version = version + 1 WHERE (<filter>) AND version < ?max`:
//! one statement, however many rows match. JPA's, SQLAlchemy's and EF Core's bulk updates
//! leave the version alone, so copies read before the bulk update still save over it;
//! here every changed row's version moves on, so those copies conflict as they should.
//!
//! The next version is computed in SQL (each row has its own), so the overflow rule is
//! kept in SQL too: a row already at its type's maximum is not changed (SQLite would turn
//! `i64::MAX + 1` into a float), and the report counts such rows with one more query.
//! Only version guards can advance in SQL: a timestamp needs the database clock, which
//! is not offered yet, and a pre-image has no token to advance.

use diesel::backend::Backend;
use diesel::connection::LoadConnection;
use diesel::expression::{AppearsOnTable, Expression};
use diesel::query_builder::{AsChangeset, AstPass, Query, QueryFragment, QueryId};
use diesel::query_dsl::methods::{ExecuteDsl, LoadQuery};
use diesel::query_source::QuerySource;
use diesel::sql_types::{BigInt, Bool};
use diesel::{Column, QueryResult, RunQueryDsl, Table};

use crate::backend::OccBackend;
use crate::completion::Counted;
use crate::error::Error;
use crate::executor::{classify, CannotMiss, CompareAndSet, Matches};
use crate::guard::Guarded;
use crate::statement::{AlsoSet, Assignments, Comma, GuardedUpdate, Increment, Joined, Maximum};
use crate::update::LoadByKey;
use crate::version::{VersionColumnFor, VersionGuard, VersionNumber};

/// What a bulk update did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BulkReport {
    /// Rows changed (and their versions advanced).
    pub updated: usize,
    /// Rows the filter matched that were left unchanged because their version is at its
    /// type's maximum and cannot advance.
    pub at_maximum: usize,
}

/// `SELECT COUNT(*) FROM <table> WHERE (<filter>) AND <condition>`.
#[derive(Debug, Clone)]
pub struct CountWhere<T: Table, F, Cond> {
    from: T::FromClause,
    filter: F,
    condition: Cond,
}

impl<T: Table, F, Cond> Query for CountWhere<T, F, Cond> {
    type SqlType = BigInt;
}

impl<T, F, Cond, DB> QueryFragment<DB> for CountWhere<T, F, Cond>
where
    DB: Backend,
    T: Table,
    T::FromClause: QueryFragment<DB>,
    F: QueryFragment<DB>,
    Cond: QueryFragment<DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql("SELECT COUNT(*) FROM ");
        self.from.walk_ast(out.reborrow())?;
        out.push_sql(" WHERE (");
        self.filter.walk_ast(out.reborrow())?;
        out.push_sql(") AND ");
        self.condition.walk_ast(out.reborrow())
    }
}

impl<T: Table, F, Cond> QueryId for CountWhere<T, F, Cond> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<T: Table, F, Cond, Conn> RunQueryDsl<Conn> for CountWhere<T, F, Cond> {}

/// The bulk `UPDATE` of entity `T` (version column `Col` of type `V`).
pub type BulkUpdateOf<T, Ch, F, Col, V> = GuardedUpdate<
    <T as diesel::associations::HasTable>::Table,
    Ch,
    AlsoSet<Increment<Col>, <T as Guarded>::Stamp>,
    F,
    Maximum<Col, V>,
>;

/// Bulk updates for entities guarded by a version column.
pub trait GuardedBulk<Col, V>: Guarded<Guard = VersionGuard<Col, V>>
where
    Col: Column + VersionColumnFor<V>,
    V: VersionNumber,
{
    /// Applies `changes` to every row `filter` matches and advances each one's version,
    /// in one statement; returns how many rows changed, and how many matched but were
    /// left alone at the version's maximum. Nothing opens a transaction: inside yours,
    /// the update rolls back with it.
    #[allow(clippy::type_complexity)]
    fn guarded_bulk_update<C, F, Ch>(
        conn: &mut C,
        filter: F,
        changes: Ch,
    ) -> Result<BulkReport, Error>
    where
        C: LoadConnection,
        C::Backend: OccBackend,
        F: Expression<SqlType = Bool>
            + AppearsOnTable<Self::Table>
            + QueryFragment<C::Backend>
            + Clone,
        Ch: AsChangeset<Target = Self::Table>,
        BulkUpdateOf<Self, Ch::Changeset, F, Col, V>: ExecuteDsl<C> + Assignments<C::Backend>,
        CountWhere<Self::Table, F, Maximum<Col, V>>: LoadQuery<'static, C, i64>,
        <Self::Table as QuerySource>::FromClause: QueryFragment<C::Backend>,
        Self: LoadByKey<C>,
    {
        let statement = BulkUpdateOf::<Self, Ch::Changeset, F, Col, V>::new(
            Self::table(),
            changes.as_changeset(),
            Joined(Increment::default(), Self::stamp(), Comma),
            filter.clone(),
            Maximum::below(),
        );
        let table = Self::table_name();
        let updated = CompareAndSet::one(
            statement,
            table,
            &"(every row the filter matches)",
            CannotMiss,
        )
        .matching(Matches::Any)
        .run::<C, Counted, ()>(conn)?
        .rows;
        let at_maximum = CountWhere::<Self::Table, F, Maximum<Col, V>> {
            from: Self::table().from_clause(),
            filter,
            condition: Maximum::at(),
        }
        .get_result::<i64>(conn)
        .map_err(|e| classify(conn, e))?;
        Ok(BulkReport {
            updated,
            at_maximum: usize::try_from(at_maximum).unwrap_or(usize::MAX),
        })
    }
}

impl<T, Col, V> GuardedBulk<Col, V> for T
where
    T: Guarded<Guard = VersionGuard<Col, V>>,
    Col: Column + VersionColumnFor<V>,
    V: VersionNumber,
{
}
