//! Bulk updates by filter that advance the token of every row they change.
//!
//! `UPDATE t SET <changes>, version = version + 1 WHERE (<filter>) AND version <> ?max`:
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
use crate::drive::blocking::load::LoadByKey;
use crate::drive::{now, Blocking, Io, QueryOn, ReadOn, RunOn};
use crate::error::Error;
use crate::flow::compare_and_set::{refuse_status_write, CompareAndSet, Matches};
use crate::guard::{AdvanceAnyOf, AdvanceInSql, CanAdvanceOf, Guarded};
use crate::operation::{BulkUpdate, Operation, Run};
use crate::sql::new_token::Counted;
use crate::sql::statement::{Assignments, Comma, GuardedUpdate, Joined, Not};
use crate::telemetry::Call;

use crate::drive::blocking::executor::CannotMiss;

pub use crate::operation::bulk::BulkReport;

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
        BulkUpdate::<Self, F, Ch>::new(filter, changes).run(conn)
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
    note = "the filter must be a boolean expression on the entity's table, the changes for that table, the connection a diesel connection of a backend diesel-occ supports, and the guard must advance in SQL (not a pre-image)",
    note = "on a diesel-async connection, call the async API instead: `use diesel_occ::asynchronous::prelude::*`, not `diesel_occ::prelude::*`"
)]
pub trait UpdateBulk<C, F, Ch>: LoadByKey<C> {
    /// Runs the update; [`GuardedBulk`] calls it.
    #[doc(hidden)]
    fn update_bulk(conn: &mut C, filter: F, changes: Ch) -> Result<BulkReport, Error>;
}

// Errors name this trait and its hints, not the first bound of the impl that fails.
#[diagnostic::do_not_recommend]
impl<T, C, F, Ch> UpdateBulk<C, F, Ch> for T
where
    T: LoadByKey<C>,
    T::Guard: AdvanceInSql,
    C: LoadConnection + Send,
    C::Backend: OccBackend,
    F: Expression<SqlType = Bool>
        + AppearsOnTable<T::Table>
        + QueryFragment<C::Backend>
        + Clone
        + Send,
    Ch: AsChangeset<Target = T::Table>,
    BulkUpdateOf<T, Ch::Changeset, F>: ExecuteDsl<C> + Assignments<C::Backend> + Send,
    CountWhere<T::Table, F, Not<CanAdvanceOf<T>>>: LoadQuery<'static, C, i64> + Send,
    CanAdvanceOf<T>: QueryFragment<C::Backend>,
{
    fn update_bulk(conn: &mut C, filter: F, changes: Ch) -> Result<BulkReport, Error> {
        let plan = bulk_plan::<T, C::Backend, F, Ch>(T::table_name(), filter, changes);
        now(update_bulk::<T, _, F, Ch::Changeset>(
            Blocking::wrap(conn),
            plan,
        ))
    }
}

/// The bulk update `plan` (built and checked beforehand, so the caller's changes need
/// not be `Send`), on either driver: one call on the connection, the write and, for a
/// guard with a last token, the count of the matching rows left at it.
pub(crate) async fn update_bulk<T, C, F, Changes>(
    conn: &mut C,
    plan: Result<BulkPlan<T, Changes, F>, Error>,
) -> Result<BulkReport, Error>
where
    C: Io,
    T: ReadOn<C>,
    T::Guard: AdvanceInSql,
    F: Send,
    BulkUpdateOf<T, Changes, F>: Assignments<C::Backend> + Send,
    Counted: RunOn<C, BulkUpdateOf<T, Changes, F>, CannotMiss, ()>,
    CountWhere<T::Table, F, Not<CanAdvanceOf<T>>>: QueryOn<C, i64> + Send,
{
    let call = Call::new::<C::Backend>("bulk_update", T::table_name(), None);
    let answer = call
        .run(async {
            let BulkPlan {
                statement,
                at_maximum,
            } = plan?;
            conn.refuse_broken()?;
            let table = T::table_name();
            conn.call(async |conn: &mut C| {
                T::check_stored_precision(conn).await?;
                let write = bulk_write(statement, table);
                let updated = <Counted as RunOn<C, _, _, ()>>::run(conn, write, false)
                    .await?
                    .rows;
                let at_maximum = match at_maximum {
                    Some(count) => match count.load_on(conn).await {
                        Ok(counted) => counted.into_iter().next().unwrap_or(0),
                        Err(e) => return Err(conn.classify(e).await),
                    },
                    None => 0,
                };
                Ok(BulkReport::of(updated, at_maximum))
            })
            .await
        })
        .await;
    answer
}

impl<T: UpdateBulk<C, F, Ch>, C, F, Ch> Run<C> for BulkUpdate<T, F, Ch> {
    fn run(self, conn: &mut C) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        T::update_bulk(conn, self.filter, self.changes)
    }
}

/// What a bulk update's miss and messages name as its rows.
pub(crate) const EVERY_ROW: &str = "(every row the filter matches)";

/// The bulk `statement` (of `table`) as the executor runs it: any number of matched rows
/// is its job done, none a miss.
pub(crate) fn bulk_write<S>(
    statement: S,
    table: &'static str,
) -> CompareAndSet<'static, S, CannotMiss> {
    CompareAndSet::one(statement, table, &EVERY_ROW, CannotMiss).matching(Matches::Any)
}

/// A bulk update, checked: its statement, and the count of the rows it leaves alone at
/// their token's maximum (`None` where every row can advance).
pub(crate) struct BulkPlan<T: Guarded, Ch, F>
where
    T::Guard: AdvanceInSql,
{
    pub(crate) statement: BulkUpdateOf<T, Ch, F>,
    pub(crate) at_maximum: Option<CountWhere<T::Table, F, Not<CanAdvanceOf<T>>>>,
}

/// The bulk update of entity `T`'s rows (in `table`) matching `filter` with `changes` on
/// backend `DB`, refused when the changes assign the status column.
pub(crate) fn bulk_plan<T, DB, F, Ch>(
    table: &'static str,
    filter: F,
    changes: Ch,
) -> Result<BulkPlan<T, Ch::Changeset, F>, Error>
where
    T: Guarded,
    T::Guard: AdvanceInSql,
    DB: OccBackend,
    F: Clone,
    Ch: AsChangeset<Target = T::Table>,
    BulkUpdateOf<T, Ch::Changeset, F>: Assignments<DB>,
    CanAdvanceOf<T>: QueryFragment<DB>,
{
    let statement = BulkUpdateOf::<T, Ch::Changeset, F>::new(
        T::table(),
        changes.as_changeset(),
        Joined(T::Guard::advance_any(), T::stamp(), Comma),
        filter.clone(),
        T::Guard::can_advance(),
    );
    refuse_status_write(table, T::STATUS_COLUMN, &statement, 0)?;
    let can_advance = T::Guard::can_advance();
    let at_maximum = if can_advance.is_noop(&DB::default())? {
        // Every row can advance: none is left alone.
        None
    } else {
        Some(CountWhere {
            from: T::table().from_clause(),
            filter,
            condition: Not(can_advance),
        })
    };
    Ok(BulkPlan {
        statement,
        at_maximum,
    })
}
