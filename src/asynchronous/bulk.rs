//! Bulk updates by filter on a diesel-async connection: the blocking path's statement, its
//! checks and its count of rows left at their token's maximum (`bulk_plan`), awaited.

use std::future::Future;

use super::run::AsyncRun;
use crate::drive::blocking::executor::CannotMiss;
use crate::drive::on_async::connection::NativeAsyncConnection;
use crate::drive::{Io, QueryOn, ReadOn, RunOn};
use crate::error::Error;
use crate::guard::{AdvanceInSql, CanAdvanceOf, Guarded};
use crate::operation::{BulkUpdate, Operation};
use crate::sql::new_token::Counted;
use crate::sql::statement::{Assignments, Not};
use crate::write::bulk::{bulk_plan, update_bulk, BulkReport, BulkUpdateOf, CountWhere};
use diesel::expression::{AppearsOnTable, Expression};
use diesel::query_builder::{AsChangeset, QueryFragment};
use diesel::sql_types::Bool;

/// Bulk updates on async connections, for entities whose guard advances in SQL; see
/// [`GuardedBulk`](crate::GuardedBulk).
pub trait AsyncGuardedBulk: Guarded
where
    Self::Guard: AdvanceInSql,
{
    /// The bulk update of the rows `filter` matches; see
    /// [`GuardedBulk::guarded_bulk_update`](crate::GuardedBulk::guarded_bulk_update).
    fn guarded_bulk_update<C, F, Ch>(
        conn: &mut C,
        filter: F,
        changes: Ch,
    ) -> impl Future<Output = Result<BulkReport, Error>> + Send
    where
        BulkUpdate<Self, F, Ch>: AsyncRun<C>,
    {
        BulkUpdate::new(filter, changes).run_async(conn)
    }
}

impl<T> AsyncGuardedBulk for T
where
    T: Guarded,
    T::Guard: AdvanceInSql,
{
}

impl<T, C, F, Ch> AsyncRun<C> for BulkUpdate<T, F, Ch>
where
    T: ReadOn<C>,
    T::Guard: AdvanceInSql,
    C: Io + NativeAsyncConnection,
    F: Expression<SqlType = Bool>
        + AppearsOnTable<T::Table>
        + QueryFragment<<C as Io>::Backend>
        + Clone
        + Send
        + 'static,
    Ch: AsChangeset<Target = T::Table>,
    BulkUpdateOf<T, Ch::Changeset, F>: Assignments<<C as Io>::Backend> + Send + 'static,
    Counted: RunOn<C, BulkUpdateOf<T, Ch::Changeset, F>, CannotMiss, ()>,
    CountWhere<T::Table, F, Not<CanAdvanceOf<T>>>: QueryOn<C, i64> + Send + 'static,
    CanAdvanceOf<T>: QueryFragment<<C as Io>::Backend>,
{
    fn run_async(
        self,
        conn: &mut C,
    ) -> impl Future<Output = Result<<Self as Operation>::Output, <Self as Operation>::Error>> + Send
    {
        let BulkUpdate {
            filter, changes, ..
        } = self;
        let table = <T as ReadOn<C>>::table_name();
        // Built and checked before the future: the changes need not be `Send`.
        let plan = bulk_plan::<T, <C as Io>::Backend, F, Ch>(table, filter, changes);
        update_bulk::<T, C, F, Ch::Changeset>(conn, plan)
    }
}
