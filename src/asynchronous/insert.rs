//! Guarded inserts and upserts on diesel-async connections: the blocking
//! [`guarded_insert`](crate::GuardedWrite::guarded_insert) and
//! [`guarded_upsert`](crate::GuardedWrite::guarded_upsert), with the same seeded first
//! tokens and the same answers.

use std::future::Future;

use diesel::query_builder::AsChangeset;
use diesel::Insertable;

use super::connection::{refuse_broken, NativeAsync, NativeAsyncConnection};
use super::entity::check_stored_precision;
use super::executor::{run, AsyncMiss};
use super::send::{AsyncComplete, AsyncLoadByKey};
use super::transaction::Call;
use crate::error::Error;
use crate::guard::seed::SeedsTokens;
use crate::guard::{Advancing, CompletionOf, Guarded, TokenOf};
use crate::sql::new_token::Counted;
use crate::sql::statement::Assignments;
use crate::write::entity::{guarded_statement_in, UpdateOf};
use crate::write::executor::{CannotMiss, CompareAndSet, Matches};
use crate::write::insert::{key_taken, seeded, taken, InsertOf};
use crate::write::upsert::{inserted_or_conflict, saved_over, Unexplained, Upserted};

/// A guarded insert of entity `Self` on async connection `C`, as one bound; not a trait
/// to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run a guarded insert on `{C}`",
    note = "the entity must also derive diesel's `Insertable` and `Clone`, its guard must let the writer seed the first token, and the connection must be a diesel-async connection of a backend diesel-occ supports"
)]
pub trait AsyncInsertRow<C>: Guarded {
    /// Runs the insert.
    #[doc(hidden)]
    fn insert_row<'a>(
        &'a mut self,
        conn: &'a mut C,
    ) -> impl Future<Output = Result<TokenOf<Self>, Error>> + Send + 'a;
}

/// A guarded upsert of entity `Self` on async connection `C`, as one bound; not a trait
/// to implement.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot run a guarded upsert on `{C}`",
    note = "an upsert saves the copy or inserts it: the entity must derive diesel's `Insertable` and `Clone`, and its guard must advance (a version or a last-modified timestamp)"
)]
pub trait AsyncUpsertRow<C>: AsyncInsertRow<C> {
    /// Runs the upsert.
    #[doc(hidden)]
    fn upsert_row<'a>(
        &'a mut self,
        conn: &'a mut C,
    ) -> impl Future<Output = Result<Upserted<TokenOf<Self>>, Error>> + Send + 'a;
}

/// Misses that need no read: the blocking explanation, at once.
macro_rules! explained_without_a_read {
    ($($miss:ty),*) => {$(
        impl<C> AsyncMiss<C> for $miss {
            fn explain(self, _: &mut C) -> impl Future<Output = Error> + Send {
                std::future::ready(<$miss as crate::write::executor::Miss<()>>::explain(self, &mut ()))
            }
        }
    )*};
}

explained_without_a_read!(CannotMiss, Unexplained);

impl<T, C> AsyncInsertRow<C> for T
where
    T: AsyncLoadByKey<C> + Insertable<T::Table> + Clone,
    T::Guard: SeedsTokens,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    InsertOf<T>: Assignments<C::Backend> + Send,
    Counted: AsyncComplete<C, InsertOf<T>, ()>,
{
    async fn insert_row<'a>(&'a mut self, conn: &'a mut C) -> Result<TokenOf<T>, Error> {
        refuse_broken(conn)?;
        let table = <T as AsyncLoadByKey<C>>::table_name();
        let (row, seed) = seeded(self);
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
        *self = row;
        Ok(seed)
    }
}

impl<T, C> AsyncUpsertRow<C> for T
where
    T: AsyncInsertRow<C> + AsyncLoadByKey<C>,
    T::Guard: Advancing,
    T::Stamp: Send,
    T::StatusKept: Send,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    T::Changes: AsChangeset<Target = T::Table>,
    UpdateOf<T, <T::Changes as AsChangeset>::Changeset>: Assignments<C::Backend> + Send,
    CompletionOf<T>:
        AsyncComplete<C, UpdateOf<T, <T::Changes as AsChangeset>::Changeset>, TokenOf<T>>,
{
    async fn upsert_row<'a>(&'a mut self, conn: &'a mut C) -> Result<Upserted<TokenOf<T>>, Error> {
        refuse_broken(conn)?;
        let table = <T as AsyncLoadByKey<C>>::table_name();
        let (key, expected, stamp) = (self.key(), self.token(), T::stamp());
        let kept = Some(self.status_kept());
        let (statement, next) = guarded_statement_in::<T, C::Backend, T::Changes>(
            table,
            &key,
            &expected,
            self.changes(),
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
        if let Some(done) = saved_over(self, call.finish(updated), next, &stamp)? {
            return Ok(done);
        }
        let state = self.status_name();
        let inserted = <T as AsyncInsertRow<C>>::insert_row(self, conn).await;
        inserted_or_conflict::<T>(table, &key, &expected, state, inserted)
    }
}
