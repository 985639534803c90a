//! Batches of guarded writes on a diesel-async connection: the blocking path's statements,
//! rounds and explanations ([`Chunk`]), awaited. On PostgreSQL the rows of a round that
//! set the same columns are one `UPDATE ... FROM (VALUES ...)`; on MySQL each row is its
//! own statement, as on the blocking path.

use std::future::Future;

use diesel::query_builder::AsChangeset;

use super::run::AsyncRun;
use crate::connect::backend::OccBackend;
use crate::drive::on_async::connection::{NativeAsync, NativeAsyncConnection};
use crate::drive::on_async::transaction::Call;
use crate::drive::{Io, ReadOn, RunEachOn, RunOn};
use crate::error::Error;
use crate::flow::batch::Batch;
use crate::flow::miss::RowMoved;
use crate::guard::{CompletionOf, Guarded, TokenOf};
use crate::operation::{BatchDelete, BatchUpdate, Operation};
use crate::sql::new_token::Counted;
use crate::sql::statement::Assignments;
use crate::write::batch::{
    deletes, drive, updates, written_token, BatchMode, BatchReport, Deletes, Updates,
};
use crate::write::entity::{DeleteOf, UpdateOf};

/// Guarded batches on async connections; see [`GuardedBatch`](crate::GuardedBatch).
pub trait AsyncGuardedBatch: Guarded {
    /// Applies each `(key, expected token, changes)` row as a guarded update by key would,
    /// and reports every row's outcome; see
    /// [`GuardedBatch::guarded_update_batch`](crate::GuardedBatch::guarded_update_batch).
    /// Every row's statement is built and checked before anything is sent.
    fn guarded_update_batch<C, Ch, I>(
        conn: &mut C,
        rows: I,
        mode: BatchMode,
    ) -> impl Future<Output = Result<BatchReport<TokenOf<Self>>, Error>> + Send
    where
        I: IntoIterator<Item = (Self::Key, TokenOf<Self>, Ch)>,
        BatchUpdate<Self, Ch>: AsyncRun<C>,
    {
        BatchUpdate::new(rows.into_iter().collect(), mode).run_async(conn)
    }

    /// Deletes each `(key, expected token)` row as a guarded delete by key would, and
    /// reports every row's outcome; see
    /// [`GuardedBatch::guarded_delete_batch`](crate::GuardedBatch::guarded_delete_batch).
    fn guarded_delete_batch<C, I>(
        conn: &mut C,
        rows: I,
        mode: BatchMode,
    ) -> impl Future<Output = Result<BatchReport<()>, Error>> + Send
    where
        I: IntoIterator<Item = (Self::Key, TokenOf<Self>)>,
        BatchDelete<Self>: AsyncRun<C>,
    {
        BatchDelete::new(rows.into_iter().collect(), mode).run_async(conn)
    }
}

impl<T: Guarded> AsyncGuardedBatch for T {}

impl<T, C, Ch> AsyncRun<C> for BatchUpdate<T, Ch>
where
    T: ReadOn<C>,
    C: Io + NativeAsyncConnection,
    <C as Io>::Backend: NativeAsync,
    <C as diesel_async::AsyncConnectionCore>::Backend: NativeAsync,
    Ch: AsChangeset<Target = T::Table> + Send,
    UpdateOf<T, Ch::Changeset>: Assignments<<C as Io>::Backend> + Send,
    T::Stamp: Send,
    CompletionOf<T>: RunEachOn<C, UpdateOf<T, Ch::Changeset>, TokenOf<T>>
        + for<'k> RunOn<C, UpdateOf<T, Ch::Changeset>, RowMoved<'k, T>, TokenOf<T>>,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let BatchUpdate { rows, mode } = self;
        let table = T::table_name();
        let rows = updates::<T, <C as Io>::Backend, Ch>(table, rows)?;
        conn.refuse_broken()?;
        let flow = Batch::new(table, rows, mode, conn.in_transaction(), written_token::<T>)
            .of_updates(<C as Io>::Backend::COMBINES_UPDATES);
        let mut call = Call::start(conn);
        let report = drive::<T, C, _, _, Updates>(call.conn(), flow).await;
        call.finish(report)
    }
}

impl<T, C> AsyncRun<C> for BatchDelete<T>
where
    T: ReadOn<C>,
    C: Io + NativeAsyncConnection,
    <C as Io>::Backend: NativeAsync,
    <C as diesel_async::AsyncConnectionCore>::Backend: NativeAsync,
    DeleteOf<T>: Assignments<<C as Io>::Backend> + Send,
    Counted: for<'k> RunOn<C, DeleteOf<T>, RowMoved<'k, T>, TokenOf<T>>,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let BatchDelete { rows, mode } = self;
        conn.refuse_broken()?;
        let (table, rows) = (T::table_name(), deletes::<T>(rows));
        let flow = Batch::new(table, rows, mode, conn.in_transaction(), |_, _| ());
        let mut call = Call::start(conn);
        let report = drive::<T, C, _, _, Deletes>(call.conn(), flow).await;
        call.finish(report)
    }
}
