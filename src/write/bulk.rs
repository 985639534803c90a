//! Bulk updates by filter that advance the token of every row they change.
//!
//! `UPDATE t SET <changes>, version = version + 1 WHERE (<filter>) AND version < ?max`:
//! one statement, however many rows match. JPA's, SQLAlchemy's and EF Core's bulk updates
//! leave the version alone, so copies read before the bulk update still save over it;
//! here every changed row's version moves on, so those copies conflict as they should.
//!
//! The next token is computed in SQL (each row has its own), so the overflow rule is
//! kept in SQL too: a row whose version is already at its type's maximum is not changed
//! (SQLite would turn `i64::MAX + 1` into a float), and the report counts such rows with
//! one more query. Offered for every guard that advances in SQL: a version, PostgreSQL's
//! `xmin`; a pre-image has no token to advance.

use diesel::backend::Backend;
use diesel::connection::LoadConnection;
use diesel::expression::{AppearsOnTable, Expression};
use diesel::query_builder::{AsChangeset, AstPass, Query, QueryFragment, QueryId};
use diesel::query_dsl::methods::{ExecuteDsl, LoadQuery};
use diesel::query_source::QuerySource;
use diesel::sql_types::{BigInt, Bool};
use diesel::{QueryResult, RunQueryDsl, Table};

use crate::connect::backend::OccBackend;
use crate::error::Error;
use crate::guard::{AdvanceAnyOf, AdvanceInSql, CanAdvanceOf, Guarded};
use crate::sql::new_token::Counted;
use crate::sql::statement::{Assignments, Comma, GuardedUpdate, Joined, Not};
use crate::write::entity::LoadByKey;
use crate::write::executor::{classify, refuse_status_write, CannotMiss, CompareAndSet, Matches};

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

/// The bulk `UPDATE` of entity `T` with changes `Ch` and filter `F`; also the shape of
/// every write that advances a row's token in SQL.
pub(crate) type BulkUpdateOf<T, Ch, F> = GuardedUpdate<
    <T as diesel::associations::HasTable>::Table,
    Ch,
    AdvanceAnyOf<T>,
    F,
    CanAdvanceOf<T>,
>;

/// Bulk updates for entities whose guard advances in SQL (a version, a timestamp, `xmin`).
pub trait GuardedBulk: Guarded
where
    Self::Guard: AdvanceInSql,
{
    /// Applies `changes` to every row `filter` matches and advances each one's token, in
    /// one statement; returns how many rows changed, and how many matched but were left
    /// alone because their token cannot advance (a version at its type's maximum).
    /// Nothing opens a transaction: inside yours, the update rolls back with it.
    fn guarded_bulk_update<C, F, Ch>(
        conn: &mut C,
        filter: F,
        changes: Ch,
    ) -> Result<BulkReport, Error>
    where
        Self: UpdateBulk<C, F, Ch>,
    {
        Self::update_bulk(conn, filter, changes)
    }
}

impl<T> GuardedBulk for T
where
    T: Guarded,
    T::Guard: AdvanceInSql,
{
}

/// A bulk update of entity `Self` by filter `F` with changes `Ch` on connection `C`, as
/// one bound; like [`UpdateRow`](crate::UpdateRow), not a trait to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run a bulk update by `{F}` with `{Ch}` on `{C}`",
    note = "the filter must be a boolean expression on the entity's table, the changes for that table, the connection a diesel connection of a backend diesel-occ supports, and the guard must advance in SQL (not a pre-image)"
)]
pub trait UpdateBulk<C, F, Ch>: LoadByKey<C> {
    /// Runs the update; [`GuardedBulk`] calls it.
    #[doc(hidden)]
    fn update_bulk(conn: &mut C, filter: F, changes: Ch) -> Result<BulkReport, Error>;
}

impl<T, C, F, Ch> UpdateBulk<C, F, Ch> for T
where
    T: LoadByKey<C>,
    T::Guard: AdvanceInSql,
    C: LoadConnection,
    C::Backend: OccBackend,
    F: Expression<SqlType = Bool> + AppearsOnTable<T::Table> + QueryFragment<C::Backend> + Clone,
    Ch: AsChangeset<Target = T::Table>,
    BulkUpdateOf<T, Ch::Changeset, F>: ExecuteDsl<C> + Assignments<C::Backend>,
    CountWhere<T::Table, F, Not<CanAdvanceOf<T>>>: LoadQuery<'static, C, i64>,
    CanAdvanceOf<T>: QueryFragment<C::Backend>,
{
    fn update_bulk(conn: &mut C, filter: F, changes: Ch) -> Result<BulkReport, Error> {
        crate::guard::stored_precision::check_stored_precision::<T, C>(conn)?;
        let statement = BulkUpdateOf::<T, Ch::Changeset, F>::new(
            T::table(),
            changes.as_changeset(),
            Joined(T::Guard::advance_any(), T::stamp(), Comma),
            filter.clone(),
            T::Guard::can_advance(),
        );
        let table = T::table_name();
        refuse_status_write(table, T::STATUS_COLUMN, &statement, 0)?;
        let every_row = "(every row the filter matches)";
        let updated = CompareAndSet::one(statement, table, &every_row, CannotMiss)
            .matching(Matches::Any)
            .run::<C, Counted, ()>(conn)?
            .rows;
        let can_advance = T::Guard::can_advance();
        if can_advance.is_noop(&C::Backend::default())? {
            // Every row can advance: none was left alone.
            return Ok(BulkReport {
                updated,
                at_maximum: 0,
            });
        }
        let at_maximum = CountWhere::<T::Table, F, Not<CanAdvanceOf<T>>> {
            from: T::table().from_clause(),
            filter,
            condition: Not(can_advance),
        }
        .get_result::<i64>(conn)
        .map_err(|e| classify(conn, e))?;
        Ok(BulkReport {
            updated,
            at_maximum: usize::try_from(at_maximum).unwrap_or(usize::MAX),
        })
    }
}
