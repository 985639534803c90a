//! Read-modify-write with retry on diesel-async connections: the blocking
//! [`GuardedModify`](crate::GuardedModify), with each attempt's statements awaited and
//! the waits between attempts slept on tokio's timer.

use std::future::Future;
use std::time::Duration;

use super::run::AsyncRun;
use super::source::AsyncConnectionSource;
use crate::drive::on_async::connection::{NativeAsync, NativeAsyncConnection};
use crate::drive::on_async::send::AsyncLoadByKey;
use crate::drive::on_async::transaction::BeginWrite;
use crate::drive::on_async::Caller;
use crate::drive::read_modify_write::read_modify_write;
use crate::drive::{Attempts, Body};
use crate::error::Error;
use crate::guard::Guarded;
use crate::operation::{Modify, Operation, Update};
use crate::retry::RetryPolicy;
use crate::write::modify::{ChangeCopy, Modified};

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

/// Each attempt checks a connection out of the pool, back in it before any pause; the
/// pauses sleep on tokio's timer.
pub(crate) struct FromPool<'p, S>(pub(crate) &'p S);

impl<S: AsyncConnectionSource> Attempts<S::Connection> for FromPool<'_, S> {
    const FRESH_PER_ATTEMPT: bool = true;

    fn caller_transaction(&mut self) -> Result<bool, Error> {
        Ok(false)
    }

    async fn attempt<T, F>(&mut self, body: F) -> Result<T, Error>
    where
        for<'r> F: Body<&'r mut S::Connection, T>,
    {
        let mut conn = self.0.checkout().await?;
        Ok(body(&mut *conn).await)
    }

    fn pause(&mut self, pause: Duration) -> impl Future<Output = ()> {
        tokio::time::sleep(pause)
    }
}

impl<T, C, F, R, E> AsyncRun<C> for Modify<T, F, R, E>
where
    T: AsyncLoadByKey<C> + Clone,
    Update<T, T::Changes>: AsyncRun<C>,
    C: NativeAsyncConnection + BeginWrite + 'static,
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
        let suspects = T::GUARD_COLUMNS.join(", ");
        let step = ChangeCopy(change);
        read_modify_write(Caller(conn), &key, &policy, &suspects, step).await
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
        let step = ChangeCopy(change);
        read_modify_write(FromPool(pool), &key, &policy, &suspects, step).await
    }
}
