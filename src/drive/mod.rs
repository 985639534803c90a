//! One driver for both kinds of connection: an operation's steps are written once, as an
//! `async fn` over [`Io`], and run on a blocking connection ([`Blocking`], whose steps
//! are done by the time they are awaited, run by [`now`]) or on a diesel-async one.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use diesel::result::Error as DieselError;
use diesel::QueryResult;

use crate::connect::backend::OccBackend;
#[cfg(feature = "locks")]
use crate::connect::reply_bound::Tightened;
use crate::connect::transaction::{failed_commit, LostCommit};
use crate::error::Error;
use crate::flow::compare_and_set::{Classifier, CompareAndSet, Written};
use crate::guard::{Guarded, TokenOf};
use crate::operation::Update;
use crate::sql::statement::RowLock;

pub(crate) mod blocking;
#[cfg(feature = "async")]
pub(crate) mod on_async;
pub(crate) mod read_modify_write;

pub(crate) use blocking::Blocking;

/// The body of a transaction or a call: an async closure whose future type can be named,
/// so that a bound can ask it to be `Send` (diesel-async's way to say so of an
/// `AsyncFnOnce`).
pub(crate) trait Body<A, R>:
    AsyncFnOnce(A) -> R + FnOnce(A) -> <Self as Body<A, R>>::Fut
{
    type Fut: Future<Output = R>;
}

impl<F, A, Fut, R> Body<A, R> for F
where
    F: AsyncFnOnce(A) -> R + FnOnce(A) -> Fut,
    Fut: Future<Output = R>,
{
    type Fut = Fut;
}

/// A connection the library's operations run on.
pub(crate) trait Io: Send + Sized {
    /// The connection's backend.
    type Backend: OccBackend;

    /// Whether the connection has an open transaction.
    fn in_transaction(&mut self) -> bool;

    /// Refuses a connection an earlier cancelled call left inside a transaction.
    fn refuse_broken(&mut self) -> Result<(), Error>;

    /// Bounds each reply on the connection to `limit` while the value returned lives, if
    /// the connection is watched (see `connect::reply_bound`).
    #[cfg(feature = "locks")]
    fn tighten_replies(&mut self, limit: Duration) -> Option<Tightened>;

    /// Classifies an error a statement just returned.
    fn classify(&mut self, error: DieselError) -> impl Future<Output = Error> + Send;

    /// Waits `pause` (a retry's backoff).
    fn pause(&mut self, pause: Duration) -> impl Future<Output = ()> + Send;

    /// Runs the statements of `body` as one write: on PostgreSQL, inside a transaction
    /// the caller controls (`own` false), under a savepoint that a failure rolls back
    /// to; on SQLite after this process's earlier writers. Its error classified.
    fn protect_caller<'a, 'c, T, F>(
        &'c mut self,
        own: bool,
        body: F,
    ) -> impl Future<Output = Result<T, Error>> + Send + 'c
    where
        for<'r> F: Body<&'r mut Self, QueryResult<T>, Fut: Send> + Send + 'a,
        T: Send + 'a,
        'a: 'c;

    /// Runs `body` as one call that must not be dropped half way where the client cannot
    /// drop a statement half read (MySQL's async one): dropped, it leaves the connection
    /// marked broken.
    fn call<'a, 'c, T, F>(&'c mut self, body: F) -> impl Future<Output = T> + Send + 'c
    where
        for<'r> F: Body<&'r mut Self, T, Fut: Send> + Send + 'a,
        T: Send + 'a,
        'a: 'c;
}

/// A connection on which the library opens write transactions of its own (every
/// connection the library supports; not every wrapper of one).
pub(crate) trait Transactions: Io {
    /// Runs `body` in a write transaction of the library's (a savepoint inside the
    /// caller's), committed when it succeeds and rolled back when it fails; a failed
    /// `COMMIT` is judged as every transaction of the library's is.
    #[cfg_attr(not(feature = "locks"), allow(dead_code))] // Claims only, so far.
    fn own_transaction<'a, 'c, T, E, F>(
        &'c mut self,
        body: F,
    ) -> impl Future<Output = Result<T, E>> + Send + 'c
    where
        for<'r> F: Body<&'r mut Self, Result<T, E>, Fut: Send> + Send + 'a,
        T: Send + 'a,
        E: From<Error> + From<DieselError> + LostCommit + Send + 'a,
        'a: 'c;
}

/// Reads of entity `Self`'s rows on connection `C`.
pub(crate) trait ReadOn<C>: Guarded {
    /// The table's SQL name.
    fn table_name() -> &'static str;

    /// The row with `key` as last committed (locked inside a transaction).
    fn load_by_key(
        conn: &mut C,
        key: &Self::Key,
    ) -> impl Future<Output = QueryResult<Option<Self>>> + Send;

    /// The rows with any of `keys` that exist, in one statement (locked inside a
    /// transaction).
    fn load_by_keys(
        conn: &mut C,
        keys: &[Self::Key],
    ) -> impl Future<Output = QueryResult<Vec<Self>>> + Send;

    /// Refuses a time guard whose column would not store its tokens exactly.
    fn check_stored_precision(conn: &mut C) -> impl Future<Output = Result<(), Error>> + Send;
}

/// A query that loads rows of `U` on connection `C`.
pub(crate) trait QueryOn<C, U> {
    /// The rows.
    fn load_on(self, conn: &mut C) -> impl Future<Output = QueryResult<Vec<U>>> + Send;
}

/// A statement that changes rows on connection `C`.
#[cfg_attr(not(feature = "locks"), allow(dead_code))] // Claims only, so far.
pub(crate) trait ExecuteOn<C> {
    /// The rows it matched.
    fn execute_on(self, conn: &mut C) -> impl Future<Output = QueryResult<usize>> + Send;
}

/// Sends a compare-and-set write with statement `S` and miss `M` on connection `C` the
/// way `Self` (a token plan) says, and judges its answer.
pub(crate) trait RunOn<C, S, M, Tok> {
    /// Sends `write`; `own`: inside a transaction of the library's.
    fn run(
        conn: &mut C,
        write: CompareAndSet<'_, S, M>,
        own: bool,
    ) -> impl Future<Output = Result<Written<Tok>, Error>> + Send;
}

/// Sends statements `S` on connection `C` in as few statements as the backend allows,
/// the way `Self` (a token plan) says: the index of each one that wrote its row, with its
/// token where the database computed it. The statements must not share a key.
pub(crate) trait RunEachOn<C, S, Tok> {
    /// Sends `statements`.
    fn run_each(
        conn: &mut C,
        statements: Vec<S>,
    ) -> impl Future<Output = QueryResult<Vec<(usize, Option<Tok>)>>> + Send;
}

/// How the body of a flow's own write transaction asks it to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// Send the `COMMIT` (release the savepoint inside the caller's transaction).
    Commit,
    /// Send the `ROLLBACK` (to the savepoint).
    Rollback,
}

impl End {
    /// Commit what succeeded, roll back what failed.
    pub(crate) fn after<T, E>(result: &Result<T, E>) -> End {
        match result {
            Ok(_) => End::Commit,
            Err(_) => End::Rollback,
        }
    }
}

/// How a flow's own write transaction ended.
pub(crate) enum Ended<T> {
    /// Its `BEGIN` failed, classified: nothing is open and nothing was written.
    NotBegun(Error),
    /// The body asked for the `COMMIT`: what it gave, and the `COMMIT`'s answer (a failed
    /// top-level one already judged as every transaction of the library's: MySQL's error
    /// number asked for, the transaction ended on the server).
    Committed(T, QueryResult<()>),
    /// The body asked for the `ROLLBACK`: what it gave, and the `ROLLBACK`'s answer (a
    /// failed one leaves the connection marked broken, for its pool to discard and the
    /// next call to refuse).
    RolledBack(T, QueryResult<()>),
}

/// A connection on which a flow runs write transactions whose end it decides (the
/// attempts of a read-modify-write): a blocking one ([`Blocking`]) or any diesel-async
/// one, SQLite's included, which runs each statement on its thread.
///
/// Its futures are not declared `Send`: they are `Send` wherever what the flow holds
/// across its steps is, so the blocking API asks nothing of the caller's closures that
/// it did not ask before.
pub(crate) trait WriteAttempt: Sized {
    /// The connection's backend.
    type Backend: OccBackend;

    /// Refuses a connection an earlier cancelled call left inside a transaction; else
    /// whether a transaction (the caller's) is open on it.
    fn caller_transaction(&mut self) -> Result<bool, Error>;

    /// Runs `body` in a write transaction of the library's (SQLite's immediate one after
    /// this process's earlier writers; a savepoint inside the caller's), ended as `body`
    /// says.
    fn write_transaction<T, F>(&mut self, body: F) -> impl Future<Output = Ended<T>>
    where
        for<'r> F: Body<&'r mut Self, (End, T)>;

    /// What classifies `error` (when there is one) as a statement's on this connection:
    /// the server asked first where the client keeps only the text (MySQL's async one).
    fn classifier(&mut self, error: Option<&DieselError>) -> impl Future<Output = Classifier>;

    /// Marks the connection broken, so that its pool does not hand it out again (one that
    /// met a read-only server: the pool's next connection may reach the primary).
    fn discard(&mut self);
}

/// What the body of a write transaction of the library's gave, judged as every such
/// transaction is (`nested`: a savepoint inside the caller's transaction): a failed
/// `BEGIN` wrote nothing and a failure before the `COMMIT` was sent rolled everything
/// back (a lost connection is then a plain database error, never `Ambiguous`); a failed
/// `COMMIT` is what [`failed_commit`] says. A failed `ROLLBACK` does not hide the failure
/// that asked for it.
pub(crate) fn settled<T, E: LostCommit>(ended: Ended<Result<T, E>>, nested: bool) -> Result<T, E> {
    match ended {
        Ended::NotBegun(error) => Err(E::from_occ(error).rolled_back()),
        Ended::Committed(value, Ok(())) => value,
        Ended::Committed(_, Err(source)) => Err(E::from_occ(failed_commit(source, nested))),
        Ended::RolledBack(Ok(_), _) => unreachable!("a body that succeeded commits"),
        Ended::RolledBack(Err(error), _) if nested => Err(error),
        Ended::RolledBack(Err(error), _) => Err(error.rolled_back()),
    }
}

/// Reads of entity `Self`'s rows inside a flow's write transaction on connection `C`.
pub(crate) trait ReadRow<C>: Guarded {
    /// The table's SQL name.
    fn table_name() -> &'static str;

    /// The row with `key`, with `lock`.
    fn read_row(
        conn: &mut C,
        key: &Self::Key,
        lock: RowLock,
    ) -> impl Future<Output = QueryResult<Option<Self>>>;
}

/// A guarded update of entity `Self` with changes `Ch` on connection `C`: the blocking
/// API's [`UpdateRow`](crate::UpdateRow), or the async one's.
pub(crate) trait UpdateOn<C, Ch>: Guarded {
    /// Runs `update`: the row's new token.
    fn update_on(
        conn: &mut C,
        update: Update<Self, Ch>,
    ) -> impl Future<Output = Result<TokenOf<Self>, Error>>;
}

/// Where the attempts of a flow get their connection: the caller's for every attempt, or
/// a pool's for each.
pub(crate) trait Attempts<C: WriteAttempt> {
    /// Whether each attempt gets a connection of its own, so that one whose connection
    /// died before its `COMMIT` (nothing written) can run again on another.
    const FRESH_PER_ATTEMPT: bool;

    /// Whether the attempts run inside a transaction the caller opened (then a retry could
    /// not undo the caller's earlier work); a broken connection of the caller's refused.
    fn caller_transaction(&mut self) -> Result<bool, Error>;

    /// Runs `body` on the connection of one attempt, given back (to its pool) when it
    /// ends; [`Error::Pool`] when none could be had, and then `body` did not run.
    fn attempt<T, F>(&mut self, body: F) -> impl Future<Output = Result<T, Error>>
    where
        for<'r> F: Body<&'r mut C, T>;

    /// Waits `pause` between attempts, holding no connection.
    fn pause(&mut self, pause: Duration) -> impl Future<Output = ()>;
}

/// Runs `future`, which must be ready when first polled: the steps of a blocking
/// connection are done before their futures are awaited.
pub(crate) fn now<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => unreachable!("a step on a blocking connection never waits"),
    }
}

#[cfg(test)]
mod tests {
    use super::now;

    #[test]
    fn a_ready_step_gives_its_output() {
        assert_eq!(now(async { 7 }), 7);
        assert_eq!(now(std::future::ready("done")), "done");
    }

    #[test]
    #[should_panic(expected = "never waits")]
    fn a_step_that_would_wait_is_a_bug_caught_at_once() {
        now(std::future::pending::<()>());
    }
}
