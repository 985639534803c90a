//! Guarded writes of entities on diesel-async connections: the blocking API's writes
//! ([`GuardedWrite`](crate::GuardedWrite)), awaited. The statements, checks and
//! outcomes are the blocking path's own; see there for what each write does.

use std::future::Future;

use diesel::query_builder::{AsChangeset, QueryFragment};

use super::run::AsyncRun;
use crate::drive::on_async::connection::NativeAsyncConnection;
use crate::drive::{Io, ReadOn, RunOn, UpdateOn};
use crate::error::Error;
use crate::flow::miss::RowMoved;
use crate::guard::pre_image::{ChangedColumns, ChangedUpdateOf};
use crate::guard::{Advancing, CompletionOf, Guarded, TokenOf};
use crate::operation::{
    Delete, Insert, Operation, SaveChanged, TouchStamp, Update, Upsert, WriteExcluded,
};
use crate::sql::new_token::Counted;
use crate::sql::statement::{Assignments, NoChanges};
use crate::write::changed_columns::save_changed;
use crate::write::entity::{delete_row, update_row, write_and_record, write_unguarded};
use crate::write::entity::{excluded_changeset, DeleteOf, UnguardedUpdateOf, UpdateOf};

/// Guarded writes for every [`Guarded`] entity on a diesel-async connection: the methods
/// of [`GuardedWrite`](crate::GuardedWrite), as futures. Their outcomes are the same
/// ([`Error::NotFound`], [`Error::Conflict`] with the current row, ...).
///
/// Dropping one of these futures (a timeout, a `select!`) never leaves half a write: each
/// is one statement, or a transaction that a dropped future leaves to the connection's
/// end (see the [module documentation](crate::asynchronous)).
pub trait AsyncGuardedWrite: Guarded {
    /// Applies `changes` to this row if it still holds this copy's token, and advances the
    /// token; see [`GuardedWrite::guarded_update`](crate::GuardedWrite::guarded_update).
    fn guarded_update<C, Ch>(
        &self,
        conn: &mut C,
        changes: Ch,
    ) -> impl Future<Output = Result<TokenOf<Self>, Error>> + Send
    where
        Update<Self, Ch>: AsyncRun<C>,
    {
        Update::new(self.key(), self.token(), changes).run_async(conn)
    }

    /// Applies `changes` to the row with `key` if it still holds `expected`; see
    /// [`GuardedWrite::guarded_update_by_key`](crate::GuardedWrite::guarded_update_by_key).
    fn guarded_update_by_key<C, Ch>(
        conn: &mut C,
        key: &Self::Key,
        expected: &TokenOf<Self>,
        changes: Ch,
    ) -> impl Future<Output = Result<TokenOf<Self>, Error>> + Send
    where
        Update<Self, Ch>: AsyncRun<C>,
    {
        Update::new(key.clone(), expected.clone(), changes).run_async(conn)
    }

    /// Writes every updatable field of this copy if the row still holds its token, and
    /// records the new token in the copy; see
    /// [`GuardedWrite::guarded_save`](crate::GuardedWrite::guarded_save).
    fn guarded_save<'a, C>(
        &'a mut self,
        conn: &'a mut C,
    ) -> impl Future<Output = Result<TokenOf<Self>, Error>> + Send + 'a
    where
        Self::Guard: Advancing,
        Update<Self, Self::Changes>: AsyncRun<C>,
    {
        let update = Update::new(self.key(), self.token(), self.changes()).saving(self);
        write_and_record(self, conn, update)
    }

    /// Writes every updatable field of this modified copy if the row still holds the
    /// token `original` was read with; see
    /// [`GuardedWrite::guarded_save_from`](crate::GuardedWrite::guarded_save_from).
    fn guarded_save_from<'a, C>(
        &'a mut self,
        conn: &'a mut C,
        original: &Self,
    ) -> impl Future<Output = Result<TokenOf<Self>, Error>> + Send + 'a
    where
        Update<Self, Self::Changes>: AsyncRun<C>,
    {
        let update = Update::new(original.key(), original.token(), self.changes());
        let update = update.saving_from(self, original);
        write_and_record(self, conn, update)
    }

    /// Writes the fields this modified copy changed since `original`, if the row still
    /// holds their old values (entities with `#[occ(pre_image)]` that derive
    /// [`ChangedColumns`]); see
    /// [`GuardedChanges::guarded_save_changes_from`](crate::GuardedChanges::guarded_save_changes_from).
    fn guarded_save_changes_from<'a, C>(
        &'a mut self,
        conn: &'a mut C,
        original: &Self,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a
    where
        Self: ChangedColumns,
        SaveChanged<Self>: AsyncRun<C>,
    {
        let stamp = Self::stamp();
        let saved = SaveChanged::new(self, original, stamp.clone()).run_async(conn);
        async move {
            if saved.await? {
                self.set_stamp(&stamp);
            }
            Ok(())
        }
    }

    /// Advances the token without changing anything else; see
    /// [`GuardedWrite::guarded_touch`](crate::GuardedWrite::guarded_touch).
    fn guarded_touch<'a, C>(
        &'a mut self,
        conn: &'a mut C,
    ) -> impl Future<Output = Result<TokenOf<Self>, Error>> + Send + 'a
    where
        Self::Guard: Advancing,
        Update<Self, NoChanges<Self::Table>>: AsyncRun<C>,
    {
        let update = Update::new(self.key(), self.token(), NoChanges::default()).saving(self);
        write_and_record(self, conn, update)
    }

    /// Inserts this copy as a new row with a seeded first token, and records the token
    /// and stamp in the copy; see
    /// [`GuardedWrite::guarded_insert`](crate::GuardedWrite::guarded_insert).
    fn guarded_insert<'a, C>(
        &'a mut self,
        conn: &'a mut C,
    ) -> impl Future<Output = Result<TokenOf<Self>, Error>> + Send + 'a
    where
        Self: Clone,
        Insert<Self>: AsyncRun<C>,
    {
        let inserted = Insert::new(self.clone()).run_async(conn);
        async move {
            let (row, token) = inserted.await?;
            *self = row;
            Ok(token)
        }
    }

    /// Saves this copy over its row while the row holds the copy's token, or inserts it
    /// when no row has its key; see
    /// [`GuardedWrite::guarded_upsert`](crate::GuardedWrite::guarded_upsert).
    fn guarded_upsert<'a, C>(
        &'a mut self,
        conn: &'a mut C,
    ) -> impl Future<Output = Result<crate::Upserted<TokenOf<Self>>, Error>> + Send + 'a
    where
        Self: Clone,
        Upsert<Self>: AsyncRun<C>,
    {
        let upserted = Upsert::new(self.clone()).run_async(conn);
        async move {
            let (row, answer) = upserted.await?;
            *self = row;
            Ok(answer)
        }
    }

    /// Writes `changes` to this row's excluded fields (`#[occ(exclude)]`) without checking
    /// or advancing the token; see
    /// [`GuardedWrite::update_excluded`](crate::GuardedWrite::update_excluded).
    fn update_excluded<C, Ch>(
        &self,
        conn: &mut C,
        changes: Ch,
    ) -> impl Future<Output = Result<(), Error>> + Send
    where
        WriteExcluded<Self, Ch>: AsyncRun<C>,
    {
        WriteExcluded::new(self.key(), changes).run_async(conn)
    }

    /// Writes `changes` to the excluded fields of the row with `key`; see
    /// [`GuardedWrite::update_excluded_by_key`](crate::GuardedWrite::update_excluded_by_key).
    fn update_excluded_by_key<C, Ch>(
        conn: &mut C,
        key: &Self::Key,
        changes: Ch,
    ) -> impl Future<Output = Result<(), Error>> + Send
    where
        WriteExcluded<Self, Ch>: AsyncRun<C>,
    {
        WriteExcluded::new(key.clone(), changes).run_async(conn)
    }

    /// Sets the `#[occ(updated_at)]` column to now without checking or advancing the token,
    /// and records the stamp in the copy; see
    /// [`GuardedWrite::touch_updated_at`](crate::GuardedWrite::touch_updated_at).
    fn touch_updated_at<C>(
        &mut self,
        conn: &mut C,
    ) -> impl Future<Output = Result<(), Error>> + Send
    where
        TouchStamp<Self>: AsyncRun<C>,
    {
        let stamp = Self::stamp();
        let touch = TouchStamp::new(self.key(), stamp.clone()).run_async(conn);
        async move {
            touch.await?;
            self.set_stamp(&stamp);
            Ok(())
        }
    }

    /// The stateless form of [`touch_updated_at`](Self::touch_updated_at): the row with
    /// `key`, whatever token it holds.
    fn touch_updated_at_by_key<C>(
        conn: &mut C,
        key: &Self::Key,
    ) -> impl Future<Output = Result<(), Error>> + Send
    where
        TouchStamp<Self>: AsyncRun<C>,
    {
        TouchStamp::new(key.clone(), Self::stamp()).run_async(conn)
    }

    /// Deletes the row if it still holds this copy's token; see
    /// [`GuardedWrite::guarded_delete`](crate::GuardedWrite::guarded_delete).
    fn guarded_delete<C>(&self, conn: &mut C) -> impl Future<Output = Result<(), Error>> + Send
    where
        Delete<Self>: AsyncRun<C>,
    {
        Delete::new(self.key(), self.token()).run_async(conn)
    }

    /// Deletes the row with `key` if it still holds `expected`; see
    /// [`GuardedWrite::guarded_delete_by_key`](crate::GuardedWrite::guarded_delete_by_key).
    fn guarded_delete_by_key<C>(
        conn: &mut C,
        key: &Self::Key,
        expected: &TokenOf<Self>,
    ) -> impl Future<Output = Result<(), Error>> + Send
    where
        Delete<Self>: AsyncRun<C>,
    {
        Delete::new(key.clone(), expected.clone()).run_async(conn)
    }
}

impl<T: Guarded> AsyncGuardedWrite for T {}

impl<T, C, Ch> AsyncRun<C> for Update<T, Ch>
where
    T: ReadOn<C>,
    C: Io + NativeAsyncConnection,
    Ch: AsChangeset<Target = T::Table> + Send,
    UpdateOf<T, Ch::Changeset>: Assignments<<C as Io>::Backend> + Send,
    for<'k> CompletionOf<T>: RunOn<C, UpdateOf<T, Ch::Changeset>, RowMoved<'k, T>, TokenOf<T>>,
    T::Stamp: Send,
    T::StatusKept: Send,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let Update {
            key,
            expected,
            changes,
            stamp,
            saved,
            own,
        } = self;
        update_row::<T, C, Ch>(conn, &key, &expected, changes, stamp, saved, own).await
    }
}

impl<T, C> AsyncRun<C> for Delete<T>
where
    T: ReadOn<C>,
    C: Io + NativeAsyncConnection,
    DeleteOf<T>: Assignments<<C as Io>::Backend> + Send,
    for<'k> Counted: RunOn<C, DeleteOf<T>, RowMoved<'k, T>, TokenOf<T>>,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        delete_row::<T, C>(conn, &self.key, &self.expected).await
    }
}

impl<T, C> AsyncRun<C> for SaveChanged<T>
where
    T: ReadOn<C> + ChangedColumns,
    C: Io + NativeAsyncConnection,
    ChangedUpdateOf<T>: Assignments<<C as Io>::Backend> + Send,
    for<'k> Counted: RunOn<C, ChangedUpdateOf<T>, RowMoved<'k, T>, TokenOf<T>>,
{
    fn run_async(
        self,
        conn: &mut C,
    ) -> impl Future<Output = Result<<Self as Operation>::Output, <Self as Operation>::Error>> + Send
    {
        // Checked and built before the future, on the table name of the connection's backend.
        let statement = self.statement(<T as ReadOn<C>>::table_name());
        save_changed::<T, C>(conn, statement)
    }
}

/// The async API's update, as the one read-modify-write driver runs it.
impl<T, C, Ch> UpdateOn<C, Ch> for T
where
    T: Guarded,
    Update<T, Ch>: AsyncRun<C>,
{
    fn update_on(
        conn: &mut C,
        update: Update<T, Ch>,
    ) -> impl Future<Output = Result<TokenOf<T>, Error>> {
        update.run_async(conn)
    }
}

impl<T, C, Ch> AsyncRun<C> for WriteExcluded<T, Ch>
where
    T: ReadOn<C>,
    C: Io + NativeAsyncConnection,
    Ch: AsChangeset<Target = T::Table>,
    Ch::Changeset: QueryFragment<<C as Io>::Backend> + Clone + Send + 'static,
    T::Stamp: QueryFragment<<C as Io>::Backend>,
    UnguardedUpdateOf<T, Ch::Changeset>: Assignments<<C as Io>::Backend> + Send + 'static,
    for<'k> Counted: RunOn<C, UnguardedUpdateOf<T, Ch::Changeset>, RowMoved<'k, T>, TokenOf<T>>,
{
    fn run_async(
        self,
        conn: &mut C,
    ) -> impl Future<Output = Result<<Self as Operation>::Output, <Self as Operation>::Error>> + Send
    {
        let WriteExcluded { key, changes } = self;
        let table = <T as ReadOn<C>>::table_name();
        // Checked before the future: the changes need not be `Send`.
        let changes = excluded_changeset::<T, <C as Io>::Backend, Ch>(table, changes);
        async move {
            match changes? {
                Some(changes) => write_unguarded::<T, C, _>(conn, &key, changes).await,
                None => Ok(()),
            }
        }
    }
}

impl<T, C> AsyncRun<C> for TouchStamp<T>
where
    T: ReadOn<C>,
    T::Stamp: crate::write::updated_at_touch::UpdatedAtStamp + Send + 'static,
    C: Io + NativeAsyncConnection,
    UnguardedUpdateOf<T, T::Stamp>: Assignments<<C as Io>::Backend> + Send + 'static,
    for<'k> Counted: RunOn<C, UnguardedUpdateOf<T, T::Stamp>, RowMoved<'k, T>, TokenOf<T>>,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        write_unguarded::<T, C, _>(conn, &self.key, self.stamp).await
    }
}
