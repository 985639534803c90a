//! Guarded inserts and upserts on diesel-async connections: the blocking
//! [`guarded_insert`](crate::GuardedWrite::guarded_insert) and
//! [`guarded_upsert`](crate::GuardedWrite::guarded_upsert), with the same seeded first
//! tokens and the same answers.

use std::future::Future;

use diesel::query_builder::AsChangeset;
use diesel::Insertable;

use super::run::AsyncRun;
use crate::drive::blocking::executor::CannotMiss;
use crate::drive::on_async::connection::check_stored_precision;
use crate::drive::on_async::connection::{refuse_broken, NativeAsync, NativeAsyncConnection};
use crate::drive::on_async::executor::{run, AsyncMiss};
use crate::drive::on_async::send::{AsyncComplete, AsyncLoadByKey};
use crate::drive::on_async::transaction::Call;
use crate::error::Error;
use crate::flow::compare_and_set::{CompareAndSet, Matches};
use crate::guard::seed::SeedsTokens;
use crate::guard::{Advancing, CompletionOf, TokenOf};
use crate::operation::{Insert, Operation, Upsert};
use crate::sql::new_token::Counted;
use crate::sql::statement::Assignments;
use crate::write::entity::{guarded_statement_in, UpdateOf};
use crate::write::insert::{key_taken, seeded, taken, InsertOf};
use crate::write::upsert::{insert_failed, saved_over, Unexplained, Upserted};

/// Misses that need no read: the blocking explanation, at once.
macro_rules! explained_without_a_read {
    ($($miss:ty),*) => {$(
        impl<C> AsyncMiss<C> for $miss {
            fn explain(self, _: &mut C) -> impl Future<Output = Error> + Send {
                std::future::ready(<$miss as crate::drive::blocking::executor::Miss<()>>::explain(self, &mut ()))
            }
        }
    )*};
}

explained_without_a_read!(CannotMiss, Unexplained);

impl<T, C> AsyncRun<C> for Insert<T>
where
    T: AsyncLoadByKey<C> + Insertable<T::Table> + Clone,
    T::Guard: SeedsTokens,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    InsertOf<T>: Assignments<C::Backend> + Send,
    Counted: AsyncComplete<C, InsertOf<T>, ()>,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        refuse_broken(conn)?;
        let table = <T as AsyncLoadByKey<C>>::table_name();
        let (row, seed) = seeded(&self.row);
        let key = row.key();
        let insert = diesel::insert_into(T::table()).values(row.clone());
        let write = CompareAndSet::one(insert, table, &key, CannotMiss).matching(Matches::Any);
        let mut call = Call::start(conn);
        let written = async {
            let conn = call.conn();
            check_stored_precision::<T, C>(conn, table).await?;
            match key_taken(run::<C, _, _, Counted, ()>(write, conn, false).await)? {
                Ok(()) => Ok(()),
                Err(info) => Err(taken(table, &key, info, T::load_by_key(conn, &key).await)),
            }
        }
        .await;
        call.finish(written)?;
        Ok((row, seed))
    }
}

impl<T, C> AsyncRun<C> for Upsert<T>
where
    T: AsyncLoadByKey<C>,
    Insert<T>: AsyncRun<C>,
    T::Guard: Advancing,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    T::Changes: AsChangeset<Target = T::Table>,
    UpdateOf<T, <T::Changes as AsChangeset>::Changeset>: Assignments<C::Backend> + Send,
    CompletionOf<T>:
        AsyncComplete<C, UpdateOf<T, <T::Changes as AsChangeset>::Changeset>, TokenOf<T>>,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        refuse_broken(conn)?;
        let mut row = self.row;
        let table = <T as AsyncLoadByKey<C>>::table_name();
        let (key, expected, stamp) = (row.key(), row.token(), T::stamp());
        let kept = Some(row.status_kept());
        let (statement, next) = guarded_statement_in::<T, C::Backend, T::Changes>(
            table,
            &key,
            &expected,
            row.changes(),
            stamp.clone(),
            kept,
        )?;
        let write = CompareAndSet::one(statement, table, &key, Unexplained);
        let mut call = Call::start(&mut *conn);
        let updated = async {
            let conn = call.conn();
            check_stored_precision::<T, C>(conn, table).await?;
            run::<C, _, _, CompletionOf<T>, _>(write, conn, false).await
        }
        .await;
        if let Some(done) = saved_over(&mut row, call.finish(updated), next, &stamp)? {
            return Ok((row, done));
        }
        let state = row.status_name();
        match Insert::new(row).run_async(conn).await {
            Ok((row, token)) => Ok((row, Upserted::Inserted(token))),
            Err(error) => Err(insert_failed::<T>(table, &key, &expected, state, error)),
        }
    }
}
