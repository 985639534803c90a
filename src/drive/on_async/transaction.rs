//! Transactions the library opens on a diesel-async connection, safe to cancel.
//!
//! A future dropped between `BEGIN` and `COMMIT` (a request timed out, a `select!` took
//! another branch) cannot roll back: `Drop` cannot wait for the server. diesel-async's own
//! `transaction` then leaves the transaction open on the connection, and the next
//! statement on it runs inside that transaction. Here a transaction that was neither
//! committed nor rolled back when dropped marks the connection's transaction manager
//! broken: bb8 closes such a connection when it comes back, and so do the library's
//! deadpool checkouts ([`DeadpoolCheckout`](super::DeadpoolCheckout)); closing it ends the
//! transaction on the server, and the library sends nothing more on it
//! ([`refuse_broken`](super::connection::refuse_broken)).

use std::future::Future;

use diesel::result::Error as DieselError;
use diesel::QueryResult;
use diesel_async::{AsyncConnection, TransactionManager};

use super::connection::{classify, NativeAsync, NativeAsyncConnection};
use crate::connect::backend::OccBackend;
use crate::connect::transaction::{commit_error_given, failed_commit, LostCommit};
use crate::error::{connection_lost, Error};

/// An open transaction (or savepoint, inside the caller's transaction) of the library's
/// on `conn`; every statement of it goes through [`conn`](Self::conn).
pub(crate) struct OwnTransaction<'c, C: AsyncConnection> {
    conn: &'c mut C,
    /// Committed, rolled back, or never begun: nothing is left open by this value.
    settled: bool,
    /// A savepoint inside a transaction that was open before.
    nested: bool,
    /// SQLite's write turn, held until the transaction ends.
    _turn: WriteTurn,
}

impl<'c, C> OwnTransaction<'c, C>
where
    C: AsyncConnection,
    C::Backend: OccBackend,
{
    /// Begins a transaction on `conn` (a savepoint inside an open one); a failure is
    /// classified as a statement's.
    pub(crate) async fn begin(conn: &'c mut C) -> Result<Self, Error> {
        let mut transaction = OwnTransaction::unsettled(conn);
        match transaction.start().await {
            Ok(()) => Ok(transaction),
            Err(e) => Err(transaction.failed_to_begin(e).await),
        }
    }

    /// The classified error of a `BEGIN` that failed, which left nothing open (and wrote
    /// nothing: a lost connection is no [`Error::Ambiguous`] here, as on the blocking
    /// path). Asked while still unsettled: dropped half way through the question
    /// (MySQL's client cannot drop a reply half read), the connection is marked broken.
    async fn failed_to_begin(&mut self, error: DieselError) -> Error {
        let error = classify(self.conn, error).await.rolled_back();
        self.settled = true;
        error
    }

    /// Begins a write transaction: SQLite's `BEGIN IMMEDIATE` after this process's
    /// earlier writers, a plain `BEGIN` elsewhere (see
    /// [`AsyncWriteConnection`](crate::asynchronous::write_transaction::AsyncWriteConnection)).
    pub(crate) async fn begin_write(conn: &'c mut C) -> Result<Self, Error>
    where
        C: BeginWrite,
    {
        let mut transaction = OwnTransaction::unsettled(conn);
        match transaction.conn.begin_write().await {
            Ok(turn) => {
                transaction._turn = turn;
                Ok(transaction)
            }
            // Nothing was begun (or the connection is left broken by diesel-async).
            Err(e) => Err(transaction.failed_to_begin(e).await),
        }
    }

    /// [`begin`](Self::begin), with diesel's error as it is.
    #[cfg(feature = "async-mysql")]
    pub(crate) async fn begin_raw(conn: &'c mut C) -> QueryResult<Self> {
        let mut transaction = OwnTransaction::unsettled(conn);
        match transaction.start().await {
            Ok(()) => Ok(transaction),
            Err(e) => {
                transaction.settled = true;
                Err(e)
            }
        }
    }

    /// Unsettled from the start: a `BEGIN` cancelled on the way may have reached the
    /// server.
    fn unsettled(conn: &'c mut C) -> Self {
        let nested = super::connection::in_transaction(conn);
        OwnTransaction {
            conn,
            settled: false,
            nested,
            _turn: Default::default(),
        }
    }

    /// Sends the `BEGIN`; one that failed left nothing open (diesel-async keeps the
    /// depth), which its caller settles.
    async fn start(&mut self) -> QueryResult<()> {
        C::TransactionManager::begin_transaction(self.conn).await
    }

    /// The connection, for the transaction's statements.
    pub(crate) fn conn(&mut self) -> &mut C {
        self.conn
    }

    /// Commits (releases the savepoint); a failed top-level `COMMIT` is judged as the
    /// blocking path judges it ([`after_failed_commit`]).
    pub(crate) async fn commit(mut self) -> QueryResult<()> {
        let committed = match C::TransactionManager::commit_transaction(self.conn).await {
            Err(error) if !self.nested => Err(after_failed_commit(self.conn, error).await),
            committed => committed,
        };
        self.settled = true;
        committed
    }

    /// Rolls back (to the savepoint); a failed top-level `ROLLBACK` is repaired as the
    /// blocking path repairs it ([`after_failed_rollback`]).
    pub(crate) async fn rollback(mut self) -> QueryResult<()> {
        let rolled_back = match C::TransactionManager::rollback_transaction(self.conn).await {
            Err(error) if !self.nested => after_failed_rollback(self.conn, error).await,
            rolled_back => rolled_back,
        };
        self.settled = true;
        rolled_back
    }

    /// Commits when `result` is `Ok`, rolls back when it is not; `result` comes back, or
    /// the error of a failed `COMMIT` (`lost_commit` turns it into the caller's error).
    pub(crate) async fn finish<T, E>(
        self,
        result: Result<T, E>,
        lost_commit: impl FnOnce(diesel::result::Error) -> E,
    ) -> Result<T, E> {
        match result {
            Ok(value) => match self.commit().await {
                Ok(()) => Ok(value),
                Err(e) => Err(lost_commit(e)),
            },
            Err(e) => {
                // The cause is what the caller needs; a failed rollback leaves the
                // connection broken, which the next call refuses.
                let _ = self.rollback().await;
                Err(e)
            }
        }
    }
}

impl<C> OwnTransaction<'_, C>
where
    C: AsyncConnection,
    C::Backend: OccBackend,
{
    /// [`finish`](Self::finish), judging the outcome as the blocking path judges one of
    /// its operations' transactions: a failure before the `COMMIT` was sent rolled
    /// everything back (a lost connection is a plain database error), a failed `COMMIT`
    /// is what [`failed_commit`] says. Inside the caller's transaction nothing commits
    /// here: its own `COMMIT` decides.
    ///
    /// An operation that failed on a connection that is then found lost (its `ROLLBACK`
    /// fails so) answers with the lost connection, as diesel's blocking `transaction`
    /// does: what it read may have been cut short (mysql_async can end a result set early
    /// when the server kills the session), so its own verdict (a missing row, say) cannot
    /// be trusted.
    pub(crate) async fn settle<T, E: LostCommit>(self, result: Result<T, E>) -> Result<T, E> {
        let nested = self.nested;
        match result {
            Ok(value) => match self.commit().await {
                Ok(()) => Ok(value),
                Err(e) => Err(E::from_occ(failed_commit(e, nested))),
            },
            Err(e) => {
                let e = if nested { e } else { e.rolled_back() };
                match self.rollback().await {
                    Err(lost) if connection_lost(&lost) => Err(E::from_occ(Error::Database(lost))),
                    _ => Err(e),
                }
            }
        }
    }

    /// [`finish`](Self::finish) for a transaction around caller code whose error type is
    /// its own: `result` comes back unchanged, a failed `COMMIT` as [`failed_commit`] says.
    pub(crate) async fn finish_for_caller<T, E: From<Error>>(
        self,
        result: Result<T, E>,
    ) -> Result<T, E> {
        let nested = self.nested;
        self.finish(result, |e| E::from(failed_commit(e, nested)))
            .await
    }
}

/// The error of a failed top-level `COMMIT` on `conn`, as the blocking path reports it:
/// the server is asked why (MySQL's error number, which the next statement wipes;
/// diesel-async keeps only the text), so that a certification failure reads as retryable
/// in any message language. diesel-async sends nothing after a failed `COMMIT` unless
/// an earlier statement of the transaction failed; then it rolls back first, the number
/// is gone and the text decides. A failed `COMMIT` can leave the transaction open, so it
/// is ended, as the blocking path ends it: a `ROLLBACK` that succeeds proves the server
/// holds no transaction and the connection usable; otherwise it stays marked broken.
/// SQLite's async connection has ended it already (diesel's blocking manager does).
async fn after_failed_commit<C>(conn: &mut C, error: DieselError) -> DieselError
where
    C: AsyncConnection,
    C::Backend: OccBackend,
{
    let cause = match error {
        DieselError::RollbackErrorOnCommit { commit_error, .. } => *commit_error,
        error => error,
    };
    let reason = C::Backend::retry_reason_async(conn, &cause).await;
    if C::Backend::ASYNC_ENDS_FAILED_COMMIT {
        // Already rolled back (or the manager marked broken): a `ROLLBACK` now would fail
        // for want of a transaction and leave a usable connection marked broken.
        return commit_error_given(cause, reason);
    }
    end_on_server(conn).await;
    commit_error_given(cause, reason)
}

/// After a top-level `ROLLBACK` that failed (a cluster reports an abort at the next
/// statement, `ROLLBACK` included: a Galera node that aborted the transaction for another
/// node's conflicting write), which leaves diesel-async's manager broken for good: one more
/// `ROLLBACK` that succeeds proves the server holds no transaction, and the connection is
/// usable again; one that fails leaves it broken, for its pool to close. The blocking
/// path's `roll_back_top_level`, awaited.
async fn after_failed_rollback<C: AsyncConnection>(
    conn: &mut C,
    error: DieselError,
) -> QueryResult<()> {
    match end_on_server(conn).await {
        true => Ok(()),
        false => Err(error),
    }
}

/// Sends one more `ROLLBACK` after the manager lost track of the transaction: one that
/// succeeds proves the server holds none, and the manager starts afresh; one that fails
/// leaves the manager marked broken. Whether it succeeded.
async fn end_on_server<C: AsyncConnection>(conn: &mut C) -> bool {
    let ended = conn.batch_execute("ROLLBACK").await.is_ok();
    let status = C::TransactionManager::transaction_manager_status_mut(conn);
    if ended {
        *status = Default::default();
    } else {
        status.set_in_error();
    }
    ended
}

impl<C: AsyncConnection> Drop for OwnTransaction<'_, C> {
    fn drop(&mut self) {
        if !self.settled {
            C::TransactionManager::transaction_manager_status_mut(self.conn).set_in_error();
        }
    }
}

/// One call of the library on `conn`, for backends whose client cannot drop a statement
/// half read ([`NativeAsync::STATEMENTS_SURVIVE_CANCELLATION`]: MySQL's leaves the rest of
/// the reply on the socket, and the connection's next statement reads garbage). Dropped
/// before it finished, the call marks the connection's transaction manager broken, as a
/// dropped transaction does, so that it is closed when it goes back to its pool and the
/// library refuses it.
pub(crate) struct Call<'c, C: AsyncConnection> {
    conn: &'c mut C,
    finished: bool,
}

impl<'c, C> Call<'c, C>
where
    C: AsyncConnection,
    C::Backend: NativeAsync,
{
    /// A call on `conn`, until [`finish`](Self::finish).
    pub(crate) fn start(conn: &'c mut C) -> Self {
        Call {
            conn,
            finished: C::Backend::STATEMENTS_SURVIVE_CANCELLATION,
        }
    }

    /// The connection, for the call's statements.
    pub(crate) fn conn(&mut self) -> &mut C {
        self.conn
    }

    /// The call ended: its statements were read to the end.
    pub(crate) fn finish<T>(mut self, result: T) -> T {
        self.finished = true;
        result
    }
}

impl<C: AsyncConnection> Drop for Call<'_, C> {
    fn drop(&mut self) {
        if !self.finished {
            C::TransactionManager::transaction_manager_status_mut(self.conn).set_in_error();
        }
    }
}

/// The begin of a write transaction, a part of
/// [`AsyncWriteConnection`](crate::asynchronous::AsyncWriteConnection). Not nameable
/// outside the crate; the library's own flows that open one need only this part.
pub trait BeginWrite: AsyncConnection<Backend: OccBackend> + Send {
    /// Begins the write transaction (a savepoint inside an open one).
    fn begin_write(&mut self) -> impl Future<Output = QueryResult<WriteTurn>> + Send;
}

impl<C> BeginWrite for C
where
    C: NativeAsyncConnection + Send,
    C::Backend: OccBackend,
{
    async fn begin_write(&mut self) -> QueryResult<WriteTurn> {
        C::TransactionManager::begin_transaction(self).await?;
        Ok(WriteTurn::default())
    }
}

/// This process's SQLite write turn, held until the transaction ends (nothing elsewhere).
#[doc(hidden)]
#[derive(Default)]
pub struct WriteTurn {
    #[cfg(feature = "sqlite")]
    pub(crate) _turn: Option<crate::connect::write_gate::Turn>,
}
