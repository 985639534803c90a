//! Guarded inserts and upserts on diesel-async connections: the blocking
//! [`guarded_insert`](crate::GuardedWrite::guarded_insert) and
//! [`guarded_upsert`](crate::GuardedWrite::guarded_upsert), with the same seeded first
//! tokens and the same answers.

use std::future::Future;

use diesel::query_builder::AsChangeset;
use diesel::Insertable;

use super::run::AsyncRun;
use crate::drive::blocking::executor::CannotMiss;
use crate::drive::on_async::connection::NativeAsyncConnection;
use crate::drive::on_async::executor::AsyncMiss;
use crate::drive::{Io, ReadOn, RunOn};
use crate::error::Error;
use crate::guard::seed::SeedsTokens;
use crate::guard::{Advancing, CompletionOf, TokenOf};
use crate::operation::{Insert, Operation, Upsert};
use crate::sql::new_token::Counted;
use crate::sql::statement::Assignments;
use crate::write::entity::UpdateOf;
use crate::write::insert::{insert_row, InsertOf};
use crate::write::upsert::{upsert_row, Unexplained};

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
    T: ReadOn<C> + Insertable<T::Table> + Clone + Send,
    T::Guard: SeedsTokens,
    C: Io + NativeAsyncConnection,
    InsertOf<T>: Assignments<<C as Io>::Backend> + Send,
    Counted: RunOn<C, InsertOf<T>, CannotMiss, ()>,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        insert_row(conn, &self.row).await
    }
}

impl<T, C> AsyncRun<C> for Upsert<T>
where
    T: ReadOn<C> + Insertable<T::Table> + Clone + Send,
    T::Guard: Advancing + SeedsTokens,
    T::Stamp: Send,
    T::StatusKept: Send,
    C: Io + NativeAsyncConnection,
    T::Changes: AsChangeset<Target = T::Table>,
    UpdateOf<T, <T::Changes as AsChangeset>::Changeset>: Assignments<<C as Io>::Backend> + Send,
    CompletionOf<T>:
        RunOn<C, UpdateOf<T, <T::Changes as AsChangeset>::Changeset>, Unexplained, TokenOf<T>>,
    InsertOf<T>: Assignments<<C as Io>::Backend> + Send,
    Counted: RunOn<C, InsertOf<T>, CannotMiss, ()>,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let mut row = self.row;
        let done = upsert_row(conn, &mut row).await?;
        Ok((row, done))
    }
}
