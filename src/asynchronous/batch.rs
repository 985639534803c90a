//! Batches of guarded writes on a diesel-async connection: the blocking path's statements,
//! rounds and explanations ([`Chunk`]), awaited. On PostgreSQL the rows of a round that
//! set the same columns are one `UPDATE ... FROM (VALUES ...)`; on MySQL each row is its
//! own statement, as on the blocking path.

use std::future::Future;

use diesel::query_builder::AsChangeset;

use super::run::AsyncRun;
use crate::connect::backend::OccBackend;
use crate::drive::on_async::connection::check_stored_precision;
use crate::drive::on_async::connection::{
    classified, classifier, in_transaction, refuse_broken, NativeAsync, NativeAsyncConnection,
};
use crate::drive::on_async::executor::{protect_caller, run};
use crate::drive::on_async::send::{AsyncComplete, AsyncCompleteEach, AsyncLoadByKey};
use crate::drive::on_async::transaction::{Call, OwnTransaction};
use crate::error::Error;
use crate::flow::batch::rows::RoundWritten;
use crate::flow::batch::{Batch, Effect};
use crate::flow::compare_and_set::CompareAndSet;
use crate::flow::miss::RowMoved;
use crate::guard::{CompletionOf, Guarded, TokenOf};
use crate::operation::{BatchDelete, BatchUpdate, Operation};
use crate::sql::new_token::Counted;
use crate::sql::statement::Assignments;
use crate::write::batch::{deletes, updates, written_token, BatchMode, BatchReport};
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
    T: AsyncLoadByKey<C>,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    Ch: AsChangeset<Target = T::Table> + Send,
    UpdateOf<T, Ch::Changeset>: Assignments<C::Backend> + Send,
    T::Stamp: Send,
    CompletionOf<T>: AsyncComplete<C, UpdateOf<T, Ch::Changeset>, TokenOf<T>>
        + AsyncCompleteEach<C, UpdateOf<T, Ch::Changeset>, TokenOf<T>>,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let BatchUpdate { rows, mode } = self;
        let table = <T as AsyncLoadByKey<C>>::table_name();
        let rows = updates::<T, C::Backend, Ch>(table, rows)?;
        refuse_broken(conn)?;
        let flow = Batch::new(table, rows, mode, in_transaction(conn), written_token::<T>)
            .of_updates(C::Backend::COMBINES_UPDATES);
        let mut call = Call::start(conn);
        let report = drive::<T, C, _, _, Updates>(call.conn(), flow).await;
        call.finish(report)
    }
}

impl<T, C> AsyncRun<C> for BatchDelete<T>
where
    T: AsyncLoadByKey<C>,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    DeleteOf<T>: Assignments<C::Backend> + Send,
    Counted: AsyncComplete<C, DeleteOf<T>, TokenOf<T>>,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let BatchDelete { rows, mode } = self;
        let table = <T as AsyncLoadByKey<C>>::table_name();
        refuse_broken(conn)?;
        let flow = Batch::new(
            table,
            deletes::<T>(rows),
            mode,
            in_transaction(conn),
            |_, _| (),
        );
        let mut call = Call::start(conn);
        let report = drive::<T, C, _, _, Deletes>(call.conn(), flow).await;
        call.finish(report)
    }
}

/// How a batch's statements `S` of entity `T` are sent on async connection `C`.
trait SendBatch<T: Guarded, C, S> {
    /// Sends a round's statements as the backend's combined statements.
    fn round(
        conn: &mut C,
        updates: Vec<S>,
        own: bool,
    ) -> impl Future<Output = Result<RoundWritten<TokenOf<T>>, Error>> + Send;

    /// Sends one row's statement as a guarded write.
    fn row(
        conn: &mut C,
        key: &T::Key,
        expected: &TokenOf<T>,
        statement: S,
        own: bool,
    ) -> impl Future<Output = Result<Option<TokenOf<T>>, Error>> + Send;
}

/// A batch of guarded updates: combined rounds where the backend combines them.
struct Updates;

impl<T, C, S> SendBatch<T, C, S> for Updates
where
    T: AsyncLoadByKey<C>,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    S: Assignments<C::Backend> + Send,
    CompletionOf<T>: AsyncComplete<C, S, TokenOf<T>> + AsyncCompleteEach<C, S, TokenOf<T>>,
{
    async fn round(
        conn: &mut C,
        updates: Vec<S>,
        own: bool,
    ) -> Result<RoundWritten<TokenOf<T>>, Error> {
        let sent = protect_caller(conn, own, async |conn| {
            CompletionOf::<T>::run_each(conn, updates).await
        })
        .await?;
        classified(conn, sent).await
    }

    fn row(
        conn: &mut C,
        key: &T::Key,
        expected: &TokenOf<T>,
        update: S,
        own: bool,
    ) -> impl Future<Output = Result<Option<TokenOf<T>>, Error>> + Send {
        guarded_row::<T, C, S, CompletionOf<T>>(conn, key, expected, update, own)
    }
}

/// A batch of guarded deletes: one statement per row on every backend.
struct Deletes;

impl<T, C, S> SendBatch<T, C, S> for Deletes
where
    T: AsyncLoadByKey<C>,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    S: Assignments<C::Backend> + Send,
    Counted: AsyncComplete<C, S, TokenOf<T>>,
{
    async fn round(_: &mut C, _: Vec<S>, _: bool) -> Result<RoundWritten<TokenOf<T>>, Error> {
        unreachable!("a batch of deletes writes its rows one by one")
    }

    fn row(
        conn: &mut C,
        key: &T::Key,
        expected: &TokenOf<T>,
        delete: S,
        own: bool,
    ) -> impl Future<Output = Result<Option<TokenOf<T>>, Error>> + Send {
        guarded_row::<T, C, S, Counted>(conn, key, expected, delete, own)
    }
}

/// One row's guarded write, its statement sent the way `K` says: the token read back, if
/// the guard reads one.
async fn guarded_row<T, C, S, K>(
    conn: &mut C,
    key: &T::Key,
    expected: &TokenOf<T>,
    statement: S,
    own: bool,
) -> Result<Option<TokenOf<T>>, Error>
where
    T: AsyncLoadByKey<C>,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    S: Assignments<C::Backend> + Send,
    K: AsyncComplete<C, S, TokenOf<T>>,
{
    let table = <T as AsyncLoadByKey<C>>::table_name();
    let miss = RowMoved::<T>::expecting(key, expected);
    let write = CompareAndSet::one(statement, table, key, miss);
    Ok(run::<C, _, _, K, TokenOf<T>>(write, conn, own).await?.token)
}

/// The async driver of the batch [flow](crate::flow::batch): `K` sends the statements,
/// each told whether the open transaction is the library's; an all-or-nothing batch runs
/// in an [`OwnTransaction`].
async fn drive<T, C, S, Out, K>(
    conn: &mut C,
    mut flow: Batch<T, S, Out>,
) -> Result<BatchReport<Out>, Error>
where
    T: AsyncLoadByKey<C>,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    K: SendBatch<T, C, S>,
{
    let mut effect = flow.start();
    loop {
        effect = match effect {
            Effect::Begin => match OwnTransaction::begin(&mut *conn).await {
                Err(e) => flow.began(Err(e)),
                Ok(mut transaction) => {
                    let mut effect = flow.began(Ok(()));
                    loop {
                        effect = match effect {
                            Effect::Commit => break flow.committed(transaction.commit().await),
                            Effect::Rollback => {
                                break flow.rolled_back(transaction.rollback().await)
                            }
                            other => {
                                step::<T, C, S, Out, K>(transaction.conn(), &mut flow, other).await
                            }
                        };
                    }
                }
            },
            Effect::Done => return flow.outcome(),
            other => step::<T, C, S, Out, K>(conn, &mut flow, other).await,
        };
    }
}

/// Performs one effect of a batch outside its transaction's beginning and end.
async fn step<T, C, S, Out, K>(
    conn: &mut C,
    flow: &mut Batch<T, S, Out>,
    effect: Effect<S, T::Key>,
) -> Effect<S, T::Key>
where
    T: AsyncLoadByKey<C>,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
    K: SendBatch<T, C, S>,
{
    let own = flow.own_transaction();
    match effect {
        Effect::CheckPrecision => {
            let table = <T as AsyncLoadByKey<C>>::table_name();
            flow.checked(check_stored_precision::<T, C>(conn, table).await)
        }
        Effect::SendRound(updates) => flow.sent_round(K::round(conn, updates, own).await),
        Effect::ReadMissed(keys) => {
            let read = T::load_by_keys(conn, &keys).await;
            let classify = classifier(conn, read.as_ref().err()).await;
            flow.read_missed(read, |e| classify.classify(e))
        }
        Effect::WriteRow(statement) => {
            let (key, expected) = flow.row();
            let wrote = K::row(conn, key, expected, statement, own).await;
            flow.wrote_row(wrote)
        }
        _ => unreachable!("the batch driver begins and ends the transaction itself"),
    }
}
