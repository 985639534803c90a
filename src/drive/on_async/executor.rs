//! The compare-and-set executor on a diesel-async connection: the blocking executor's
//! checks and judgement ([`CompareAndSet::checked`], [`Judge`]), with the statement and
//! the explanation of a miss sent asynchronously.

use std::future::Future;

use diesel::result::Error as DieselError;
use diesel::QueryResult;
use diesel_async::AsyncConnection;

use super::connection::{
    classified, classify, in_transaction, run_precision_check, NativeAsync, NativeAsyncConnection,
};
use super::send::{AsyncComplete, AsyncLoadByKey};
use super::transaction::OwnTransaction;
use crate::connect::backend::OccBackend;
use crate::drive::Body;
use crate::error::Error;
use crate::flow::compare_and_set::{CompareAndSet, Judged, Written};
use crate::flow::miss::{unreadable_row, Explanation, RowMoved};
use crate::guard::stored_precision::PrecisionCheck;
use crate::sql::statement::Assignments;

/// Why a statement matched fewer rows than it must, read from the database over an async
/// connection: [`Miss`](crate::drive::blocking::executor::Miss) of the async path.
pub(crate) trait AsyncMiss<C> {
    /// The error that explains the miss.
    fn explain(self, conn: &mut C) -> impl Future<Output = Error> + Send;
}

impl<T, C> AsyncMiss<C> for RowMoved<'_, T>
where
    T: AsyncLoadByKey<C>,
    C: NativeAsyncConnection,
    C::Backend: NativeAsync,
{
    async fn explain(self, conn: &mut C) -> Error {
        let key = self.key();
        match T::load_by_key(conn, key).await {
            Ok(current) => match self.explained(T::table_name(), current) {
                Explanation::Done(error) => error,
                Explanation::AskIfBehind(behind) => {
                    behind.on_server(<C::Backend as NativeAsync>::applies_writes_late(conn).await)
                }
                Explanation::AskIfLate(refusal) => {
                    let check = PrecisionCheck::again::<T, C::Backend>(T::table_name());
                    match run_precision_check(conn, check).await {
                        Err(mismatch @ Error::SchemaMismatch { .. }) => mismatch,
                        _ => refusal.on_server(
                            <C::Backend as NativeAsync>::applies_writes_late(conn).await,
                        ),
                    }
                }
            },
            Err(e) => match unreadable_row(T::table_name(), key, e, T::GUARD_COLUMNS.join(", ")) {
                Ok(unreadable) => unreadable,
                Err(e) => classify(conn, e).await,
            },
        }
    }
}

/// Sends `write` on `conn` the way `K` says and judges its answer, as
/// [`CompareAndSet::run`] does on a blocking connection. `own` says whether the
/// connection's open transaction, if any, is the library's: inside one of the caller's,
/// on PostgreSQL, the statement runs under a savepoint so that its failure leaves the
/// caller's transaction usable.
pub(crate) async fn run<C, S, M, K, Tok>(
    write: CompareAndSet<'_, S, M>,
    conn: &mut C,
    own: bool,
) -> Result<Written<Tok>, Error>
where
    C: AsyncConnection,
    C::Backend: OccBackend,
    S: Assignments<C::Backend> + Send,
    K: AsyncComplete<C, S, Tok>,
    M: AsyncMiss<C>,
{
    let (statement, judge) = write.checked::<C::Backend>()?;
    let sent = protect_caller(conn, own, async |conn| K::run(conn, statement, own).await).await?;
    match judge.sent(classified(conn, sent).await?)? {
        Judged::Written(written) => Ok(written),
        Judged::Missed(miss) => Err(miss.explain(conn).await),
    }
}

/// Runs the statements of `send` on `conn`; on PostgreSQL, inside a transaction the caller
/// controls (`own` false), under a savepoint that a failure rolls back to, so that the
/// caller's transaction stays usable. The blocking path's `protect_caller`, awaited.
pub(crate) async fn protect_caller<C, T, F>(
    conn: &mut C,
    own: bool,
    send: F,
) -> Result<QueryResult<T>, Error>
where
    C: AsyncConnection,
    C::Backend: OccBackend,
    for<'r> F: Body<&'r mut C, QueryResult<T>, Fut: Send>,
{
    if !own && C::Backend::FAILURE_ABORTS_TRANSACTION && in_transaction(conn) {
        let mut savepoint = OwnTransaction::begin(conn).await?;
        let sent = send(savepoint.conn()).await;
        Ok(savepoint.finish(sent, |e: DieselError| e).await)
    } else {
        Ok(send(conn).await)
    }
}
