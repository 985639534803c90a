//! Read-modify-write with retry on diesel-async connections: the blocking
//! [`GuardedModify`](crate::GuardedModify), with each attempt's statements awaited and
//! the waits between attempts slept on tokio's timer.

use std::future::Future;
use std::ops::DerefMut;

use diesel_async::AsyncConnection;

use super::entity::write_and_record;
use super::run::AsyncRun;
use super::source::AsyncConnectionSource;
use crate::drive::on_async::connection::{
    classifier, in_transaction, refuse_broken, NativeAsync, NativeAsyncConnection,
};
use crate::drive::on_async::send::AsyncLoadByKey;
use crate::drive::on_async::transaction::BeginWrite;
use crate::drive::on_async::transaction::OwnTransaction;
use crate::error::Error;
use crate::flow::read_modify_write::{Effect, ReadModifyWrite};
use crate::guard::{Guarded, TokenOf};
use crate::operation::{Modify, Operation, Update};
use crate::retry::{RetryPolicy, Stop};
use crate::sql::statement::RowLock;
use crate::write::modify::Modified;

/// Read-modify-write with retry for every [`Guarded`] entity on a diesel-async
/// connection: [`GuardedModify::modify`](crate::GuardedModify::modify) as a future, with
/// the same attempts, locking of contended rows, outcomes and rules for a transaction the
/// caller opened (one attempt). Waits between attempts sleep on tokio's timer.
pub trait AsyncGuardedModify: Guarded + Clone {
    /// Reads the row with `key`, hands it to `change`, and saves the changed copy under
    /// the row's guard, each attempt in a transaction of its own; see
    /// [`GuardedModify::modify`](crate::GuardedModify::modify).
    ///
    /// On SQLite the call runs on the connection's thread, so `change`, its value and its
    /// error must be `Send + 'static` there.
    fn modify<C, F, R, E>(
        conn: &mut C,
        key: &Self::Key,
        policy: &RetryPolicy,
        change: F,
    ) -> impl Future<Output = Result<Modified<Self, R>, E>> + Send
    where
        F: FnMut(&mut Self) -> Result<R, E>,
        E: From<Error>,
        Modify<Self, F, R, E>: AsyncRun<C>,
    {
        Modify::new(key.clone(), policy.clone(), change).run_async(conn)
    }

    /// [`modify`](Self::modify) with a connection from `pool` (bb8, deadpool: any
    /// [`AsyncConnectionSource`]) for each attempt, so that a connection that died is
    /// replaced and the waits between attempts hold none; see
    /// [`GuardedModify::modify_pooled`](crate::GuardedModify::modify_pooled). On SQLite
    /// one connection serves the call.
    fn modify_pooled<S, F, R, E>(
        pool: &S,
        key: &Self::Key,
        policy: &RetryPolicy,
        change: F,
    ) -> impl Future<Output = Result<Modified<Self, R>, E>> + Send
    where
        S: AsyncConnectionSource,
        F: FnMut(&mut Self) -> Result<R, E> + Send,
        E: From<Error>,
        Modify<Self, F, R, E>: AsyncRun<S::Connection>,
    {
        Modify::new(key.clone(), policy.clone(), change).run_pooled(pool)
    }
}

impl<T: Guarded + Clone> AsyncGuardedModify for T {}

/// Where the attempts of a read-modify-write get their connection: the caller's, or a
/// pool's for each attempt.
pub(crate) trait Attempts<C>: Send {
    /// Whether each attempt gets a connection of its own, so that one whose connection
    /// died before its `COMMIT` (nothing written) can run again on another.
    const FRESH_PER_ATTEMPT: bool;

    /// A connection for one attempt.
    type Conn: DerefMut<Target = C> + Send;

    /// The connection of the next attempt.
    fn next(&mut self) -> impl Future<Output = Result<Self::Conn, Error>> + Send;

    /// Hands the attempt's connection back (to the caller's hold, or the pool).
    fn give_back(&mut self, conn: Self::Conn);
}

/// Every attempt on the caller's connection.
pub(crate) struct Caller<'c, C>(pub(crate) Option<&'c mut C>);

impl<'c, C: AsyncConnection> Attempts<C> for Caller<'c, C> {
    const FRESH_PER_ATTEMPT: bool = false;
    type Conn = &'c mut C;

    async fn next(&mut self) -> Result<&'c mut C, Error> {
        Ok(self
            .0
            .take()
            .expect("each attempt gives the connection back"))
    }

    fn give_back(&mut self, conn: &'c mut C) {
        self.0 = Some(conn);
    }
}

/// Each attempt checks a connection out of the pool.
pub(crate) struct FromPool<'p, S>(pub(crate) &'p S);

impl<'p, S: AsyncConnectionSource> Attempts<S::Connection> for FromPool<'p, S> {
    const FRESH_PER_ATTEMPT: bool = true;
    type Conn = S::Checkout<'p>;

    async fn next(&mut self) -> Result<S::Checkout<'p>, Error> {
        self.0.checkout().await
    }

    fn give_back(&mut self, conn: S::Checkout<'p>) {
        drop(conn);
    }
}

impl<T, C, F, R, E> AsyncRun<C> for Modify<T, F, R, E>
where
    T: AsyncLoadByKey<C> + Clone,
    Update<T, T::Changes>: AsyncRun<C>,
    C: NativeAsyncConnection + 'static,
    C::Backend: NativeAsync,
    F: FnMut(&mut T) -> Result<R, E> + Send,
    R: Send + 'static,
    E: From<Error> + Send + 'static,
{
    async fn run_async(
        self,
        conn: &mut C,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error> {
        let Modify {
            key,
            policy,
            change,
            ..
        } = self;
        refuse_broken(conn)?;
        // Inside the caller's transaction a retry could not undo the caller's earlier work.
        let nested = in_transaction(conn);
        let suspects = T::GUARD_COLUMNS.join(", ");
        modify_with(
            Caller(Some(conn)),
            nested,
            &key,
            &policy,
            &suspects,
            ChangeCopy(change),
        )
        .await
    }

    async fn run_pooled<S>(
        self,
        pool: &S,
    ) -> Result<<Self as Operation>::Output, <Self as Operation>::Error>
    where
        S: AsyncConnectionSource<Connection = C>,
    {
        let Modify {
            key,
            policy,
            change,
            ..
        } = self;
        let suspects = T::GUARD_COLUMNS.join(", ");
        modify_with(
            FromPool(pool),
            false,
            &key,
            &policy,
            &suspects,
            ChangeCopy(change),
        )
        .await
    }
}

/// The async driver of the read-modify-write [flow](crate::flow::read_modify_write): the
/// attempts on connections from `attempts` (one attempt only when `nested` in the caller's
/// transaction), each in a write transaction of its own, the flow's pauses slept on
/// tokio's timer with the connection given back. On SQLite it drives attempts whose step
/// is the caller's async code (a guarded operation); a `modify` runs whole on the
/// connection's thread instead.
pub(crate) async fn modify_with<T, C, A, S, R, E>(
    mut attempts: A,
    nested: bool,
    key: &T::Key,
    policy: &RetryPolicy,
    suspects: &str,
    mut step: S,
) -> Result<Modified<T, R>, E>
where
    T: AsyncLoadByKey<C> + Clone,
    C: BeginWrite,
    A: Attempts<C>,
    S: Step<T, C, R, E>,
    R: Send,
    E: From<Error> + Send,
{
    let table = <T as AsyncLoadByKey<C>>::table_name();
    let mut flow = ReadModifyWrite::new(policy, nested, A::FRESH_PER_ATTEMPT, table, key, suspects);
    let mut effect = flow.start();
    loop {
        effect = match effect {
            Effect::Begin => match attempts.next().await {
                Ok(mut conn) => {
                    // Dropped half way, the attempt's transaction marks the connection
                    // broken, whatever statement was on its way.
                    let next = run_attempt(&mut *conn, &mut flow, key, &mut step).await;
                    // The connection goes back (to a pool) before any pause.
                    attempts.give_back(conn);
                    next
                }
                // No connection for the attempt: nothing began.
                Err(error) => flow.began(Err(error)),
            },
            Effect::Pause(pause) => {
                tokio::time::sleep(pause).await;
                flow.paused()
            }
            Effect::Done => break,
            other => unreachable!("{other:?} is run inside an attempt"),
        };
    }
    Ok(Modified::of(flow.outcome()?))
}

/// What an attempt does with the row it read, inside its transaction: the changed row as
/// written, its token and the caller's value. A change of the row's fields
/// ([`ChangeCopy`]), an edit of a JSON document.
pub(crate) trait Step<T: Guarded, C, R, E>: Send {
    /// Applies the step to `original` on `conn`.
    fn apply<'a>(
        &'a mut self,
        conn: &'a mut C,
        original: &'a T,
    ) -> impl Future<Output = Result<(T, TokenOf<T>, R), Stop<E>>> + Send + 'a;
}

/// `modify`'s step: the caller's change of a copy, saved from the row read.
pub(crate) struct ChangeCopy<F>(pub(crate) F);

impl<T, C, F, R, E> Step<T, C, R, E> for ChangeCopy<F>
where
    T: Guarded + Clone,
    Update<T, T::Changes>: AsyncRun<C>,
    C: AsyncConnection,
    F: FnMut(&mut T) -> Result<R, E> + Send,
    R: Send + 'static,
    E: Send + 'static,
{
    async fn apply<'a>(
        &'a mut self,
        conn: &'a mut C,
        original: &'a T,
    ) -> Result<(T, TokenOf<T>, R), Stop<E>> {
        let mut row = original.clone();
        let value = (self.0)(&mut row).map_err(Stop::Caller)?;
        let update = Update::new(original.key(), original.token(), row.changes())
            .saving_from(&row, original)
            .owned_transaction(true);
        let token = write_and_record(&mut row, conn, update)
            .await
            .map_err(Stop::Occ)?;
        Ok((row, token, value))
    }
}

/// One attempt of `flow` on `conn`, from its `BEGIN` to its `COMMIT` or `ROLLBACK` (a
/// savepoint in the caller's transaction): the effect after it. A future dropped half
/// way leaves the connection marked broken ([`OwnTransaction`]).
async fn run_attempt<T, C, S, R, E>(
    conn: &mut C,
    flow: &mut ReadModifyWrite<'_, T, (T, TokenOf<T>, R), E>,
    key: &T::Key,
    step: &mut S,
) -> Effect
where
    T: AsyncLoadByKey<C>,
    C: BeginWrite,
    S: Step<T, C, R, E>,
    R: Send,
    E: From<Error> + Send,
{
    let mut transaction = match OwnTransaction::begin_write(conn).await {
        Ok(transaction) => transaction,
        Err(error) => return flow.began(Err(error)),
    };
    let mut effect = flow.began(Ok(()));
    loop {
        effect = match effect {
            Effect::Read(lock) => {
                let conn = transaction.conn();
                let read = match lock {
                    RowLock::None => T::read_by_key(conn, key).await,
                    lock => T::lock_by_key(conn, key, lock).await,
                };
                let classify = classifier(conn, read.as_ref().err()).await;
                flow.read(read, classify)
            }
            Effect::Change => {
                let changed = step.apply(transaction.conn(), flow.row()).await;
                flow.changed(changed)
            }
            Effect::Commit => return flow.committed(transaction.commit().await),
            Effect::Rollback => {
                // A failed ROLLBACK leaves the connection broken, which the next call
                // refuses; the attempt's own failure is what counts.
                let _ = transaction.rollback().await;
                return flow.rolled_back();
            }
            other => unreachable!("{other:?} inside an attempt's transaction"),
        }
    }
}
