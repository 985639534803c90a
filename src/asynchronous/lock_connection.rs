//! The statements of a lock on a diesel-async connection: the blocking path's statements,
//! explanations and wait bounds (see the `locks` module), each statement awaited. SQLite's
//! connection runs the blocking path whole on its own thread (`sqlite.rs`).

use std::future::Future;
use std::time::Duration;

use diesel::OptionalExtension;
use diesel_async::methods::LoadQuery;
use diesel_async::{AsyncConnection, AsyncConnectionCore, RunQueryDsl, SimpleAsyncConnection};

use crate::connect::backend::OccBackend;
use crate::drive::blocking::executor::CannotMiss;
use crate::drive::on_async::connection::{classify, NativeAsync, NativeAsyncConnection};
use crate::drive::on_async::executor::AsyncMiss;
use crate::drive::on_async::transaction::OwnTransaction;
use crate::drive::{Body, Io, QueryOn, RunOn};
use crate::error::Error;
use crate::locks::backend::{LockBackend, ServerLockBackend};
use crate::locks::lock::{
    occ_locks, AcquireLock, CreateLock, HeldRow, LeaseLost, LockHolder, LockKey, LockOwner,
    LockRow, LockStep, LockTaken, ReleaseLock, RenewLock,
};
use crate::locks::lock_io::{check_held, write_lock, LockIo};
use crate::sql::new_token::{Counted, ReturnedBy};

/// The statements of a lock on a diesel-async connection, a part of
/// [`AsyncWriteConnection`](super::AsyncWriteConnection) (feature `locks`): every
/// connection of the library has them. Not nameable outside the crate: a caller names
/// `AsyncWriteConnection`.
pub trait LockStatements: AsyncConnection + Send {
    /// Takes the lock for `holder` if it is free or expired; its new fence. No statement
    /// waits longer than `wait`.
    #[doc(hidden)]
    fn acquire_lock<'a>(
        &'a mut self,
        key: &'a LockKey,
        holder: &'a str,
        label: Option<&'a str>,
        ttl: Duration,
        wait: Duration,
    ) -> impl Future<Output = Result<i64, Error>> + Send + 'a;

    /// Extends `holder`'s unexpired lease to `ttl` from now.
    #[doc(hidden)]
    fn renew_lock<'a>(
        &'a mut self,
        key: &'a LockKey,
        holder: &'a str,
        fence: i64,
        ttl: Duration,
        wait: Duration,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a;

    /// Frees the lock if `holder` still holds it with `fence`.
    #[doc(hidden)]
    fn release_lock<'a>(
        &'a mut self,
        key: &'a LockKey,
        holder: &'a str,
        fence: i64,
        wait: Duration,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a;

    /// Inside an open transaction: [`Error::LockLost`] unless `holder` still holds the
    /// lock with `fence` and an unexpired lease by the database's clock; the blocking
    /// `LockConnection::check_held`.
    #[doc(hidden)]
    fn check_held<'a>(
        &'a mut self,
        key: &'a LockKey,
        holder: &'a str,
        fence: i64,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a;
}

impl<C> LockStatements for C
where
    C: Io + NativeAsyncConnection + Send,
    <C as Io>::Backend: ServerLockBackend,
    <C as AsyncConnectionCore>::Backend: ServerLockBackend + NativeAsync,
    LockRow: QueryOn<C, i64>,
    HeldRow: QueryOn<C, i64>,
    LockOwner: QueryOn<C, (Option<String>, Option<String>, i64)>,
    Counted: RunOn<C, CreateLock, CannotMiss, i64>,
    for<'k> ReturnedBy<occ_locks::fence>: RunOn<C, AcquireLock, LockTaken<'k>, i64>,
    for<'k> Counted:
        RunOn<C, RenewLock, LeaseLost<'k>, i64> + RunOn<C, ReleaseLock, LeaseLost<'k>, i64>,
{
    fn check_held<'a>(
        &'a mut self,
        key: &'a LockKey,
        holder: &'a str,
        fence: i64,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a {
        check_held(self, key, holder, fence)
    }

    fn acquire_lock<'a>(
        &'a mut self,
        key: &'a LockKey,
        holder: &'a str,
        label: Option<&'a str>,
        ttl: Duration,
        wait: Duration,
    ) -> impl Future<Output = Result<i64, Error>> + Send + 'a {
        write_lock(self, key, holder, LockStep::Acquire { label, ttl }, wait)
    }

    async fn renew_lock<'a>(
        &'a mut self,
        key: &'a LockKey,
        holder: &'a str,
        fence: i64,
        ttl: Duration,
        wait: Duration,
    ) -> Result<(), Error> {
        let step = LockStep::Renew { fence, ttl };
        write_lock(self, key, holder, step, wait).await.map(drop)
    }

    async fn release_lock<'a>(
        &'a mut self,
        key: &'a LockKey,
        holder: &'a str,
        fence: i64,
        wait: Duration,
    ) -> Result<(), Error> {
        let step = LockStep::Release { fence };
        write_lock(self, key, holder, step, wait).await.map(drop)
    }
}

/// A lock's bounded transaction on a server's async connection: the backend's settings
/// before `BEGIN`, restored after whatever the outcome, around a transaction of the
/// library's, as the blocking path runs it (`LockBackend::bounded`).
impl<C> LockIo for C
where
    C: Io + NativeAsyncConnection + Send,
    <C as Io>::Backend: ServerLockBackend,
    <C as AsyncConnectionCore>::Backend: ServerLockBackend + NativeAsync,
{
    async fn bounded<'a, 'c, T, F>(&'c mut self, bound: Duration, body: F) -> Result<T, Error>
    where
        for<'r> F: Body<&'r mut Self, Result<T, Error>, Fut: Send> + Send + 'a,
        T: Send + 'a,
        'a: 'c,
    {
        let bounds = <C as Io>::Backend::wait_bounds(bound);
        setting_on(self, bounds.before.as_deref()).await?;
        let ended = async {
            let mut transaction = OwnTransaction::begin(&mut *self).await?;
            let sent = body(transaction.conn()).await;
            transaction.settle(sent).await
        }
        .await;
        // Whatever the outcome (a failed `BEGIN` too), as the blocking path restores it: a
        // committed grant stays a grant when the restore fails (the connection died right
        // after the commit).
        let _ = setting_on(self, bounds.after.as_deref()).await;
        ended
    }

    async fn setting(&mut self, sql: Option<&str>) -> Result<(), Error> {
        setting_on(self, sql).await
    }

    async fn draw_fence(&mut self) -> Result<(), Error> {
        // Only SQLite draws fences, and its async connection runs the blocking path: a
        // fence not drawn would repeat the last one.
        Err(Error::InvalidSetting {
            what: "lock backend",
            reason: "this backend draws fences, which the async path does not send".into(),
        })
    }
}

/// Sends a session or transaction setting, if there is one; its error classified as the
/// blocking path classifies it (inside the transaction, a Galera abort answers the
/// setting: a retry, not a raw error).
async fn setting<C: SimpleAsyncConnection + Send>(
    conn: &mut C,
    sql: Option<&str>,
) -> Result<(), Error> {
    match sql {
        Some(sql) => conn.batch_execute(sql).await.map_err(Error::from),
        None => Ok(()),
    }
}

/// [`setting`] on a connection of the library's drivers: one that lost its connection
/// is marked broken, so that its pool does not hand it out again.
async fn setting_on<C: AsyncConnection + Send>(
    conn: &mut C,
    sql: Option<&str>,
) -> Result<(), Error> {
    let sent = setting(conn, sql).await;
    if let Err(Error::Database(error)) = &sent {
        crate::drive::on_async::connection::discard_if_lost(conn, error);
    }
    sent
}

impl<C> AsyncMiss<C> for LockTaken<'_>
where
    C: AsyncConnection + Send,
    C::Backend: OccBackend,
    LockHolder:
        LoadQuery<'static, C, (Option<String>, Option<chrono::NaiveDateTime>)> + Send + 'static,
{
    async fn explain(self, conn: &mut C) -> Error {
        match self.key.holder_read().get_result(conn).await.optional() {
            Ok(row) => self.given(row),
            Err(e) => classify(conn, e).await,
        }
    }
}

impl<C> AsyncMiss<C> for LeaseLost<'_>
where
    C: AsyncConnection + Send,
    C::Backend: OccBackend,
    LockOwner: LoadQuery<'static, C, (Option<String>, Option<String>, i64)> + Send + 'static,
{
    async fn explain(self, conn: &mut C) -> Error {
        match self.key.owner_read().get_result(conn).await.optional() {
            Ok(row) => self.given(row),
            Err(e) => classify(conn, e).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use diesel::result::{DatabaseErrorKind, Error as DieselError};

    /// A session whose transaction another Galera node's write aborted: it answers the
    /// next statement, here the lock's setting, with the certification failure.
    struct AbortedOnGalera;

    impl SimpleAsyncConnection for AbortedOnGalera {
        async fn batch_execute(&mut self, _: &str) -> diesel::QueryResult<()> {
            Err(DieselError::DatabaseError(
                DatabaseErrorKind::SerializationFailure,
                Box::new(
                    "Deadlock found when trying to get lock; try restarting transaction"
                        .to_string(),
                ),
            ))
        }
    }

    #[test]
    fn an_abort_answering_a_setting_is_a_retry_as_on_the_blocking_path() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let sent = runtime.block_on(setting(&mut AbortedOnGalera, Some("SET SESSION x = 1")));
        assert!(
            matches!(
                sent,
                Err(Error::Retryable {
                    reason: crate::RetryReason::Deadlock,
                    ..
                })
            ),
            "{sent:?}"
        );
    }
}
