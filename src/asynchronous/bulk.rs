//! Bulk updates by filter on a diesel-async connection: the blocking path's statement, its
//! checks and its count of rows left at their token's maximum (`bulk_plan`), awaited.

use std::future::Future;

use diesel::expression::{AppearsOnTable, Expression};
use diesel::query_builder::{AsChangeset, QueryFragment};
use diesel::sql_types::Bool;
use diesel_async::methods::{ExecuteDsl, LoadQuery};
use diesel_async::RunQueryDsl;

use super::run::AsyncRun;
use crate::drive::on_async::connection::check_stored_precision;
use crate::drive::on_async::connection::{
    classify, refuse_broken, NativeAsync, NativeAsyncConnection,
};
use crate::drive::on_async::executor::run;
use crate::drive::on_async::send::{AsyncComplete, AsyncLoadByKey};
use crate::drive::on_async::transaction::Call;
use crate::error::Error;
use crate::guard::{AdvanceInSql, CanAdvanceOf, Guarded};
use crate::operation::{BulkUpdate, Operation};
use crate::sql::new_token::Counted;
use crate::sql::statement::{Assignments, Not};
use crate::write::bulk::{bulk_plan, bulk_write, BulkPlan, BulkReport, BulkUpdateOf, CountWhere};

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
    T: AsyncLoadByKey<C>,
    T::Guard: AdvanceInSql,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    F: Expression<SqlType = Bool>
        + AppearsOnTable<T::Table>
        + QueryFragment<C::Backend>
        + Clone
        + Send
        + 'static,
    Ch: AsChangeset<Target = T::Table>,
    BulkUpdateOf<T, Ch::Changeset, F>: Assignments<C::Backend> + ExecuteDsl<C> + Send + 'static,
    Counted: AsyncComplete<C, BulkUpdateOf<T, Ch::Changeset, F>, ()>,
    CountWhere<T::Table, F, Not<CanAdvanceOf<T>>>: LoadQuery<'static, C, i64> + Send + 'static,
    CanAdvanceOf<T>: QueryFragment<C::Backend>,
{
    fn run_async(
        self,
        conn: &mut C,
    ) -> impl Future<Output = Result<<Self as Operation>::Output, <Self as Operation>::Error>> + Send
    {
        let BulkUpdate {
            filter, changes, ..
        } = self;
        let table = <T as AsyncLoadByKey<C>>::table_name();
        // Built and checked before the future: the changes need not be `Send`.
        let plan = bulk_plan::<T, C::Backend, F, Ch>(table, filter, changes);
        async move {
            let BulkPlan {
                statement,
                at_maximum,
            } = plan?;
            refuse_broken(conn)?;
            let mut call = Call::start(conn);
            let report = async {
                let conn = call.conn();
                check_stored_precision::<T, C>(conn, table).await?;
                let write = bulk_write(statement, table);
                let updated = run::<C, _, _, Counted, ()>(write, conn, false).await?.rows;
                let at_maximum = match at_maximum {
                    Some(count) => match count.get_result::<i64>(conn).await {
                        Ok(count) => count,
                        Err(e) => return Err(classify(conn, e).await),
                    },
                    None => 0,
                };
                Ok(BulkReport::of(updated, at_maximum))
            }
            .await;
            call.finish(report)
        }
    }
}
