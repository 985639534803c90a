//! The statements of a lock on a diesel-async connection: the blocking path's statements,
//! explanations and wait bounds (see the `locks` module), each statement awaited. SQLite's
//! connection runs the blocking path whole on its own thread (`sqlite.rs`).

use std::future::Future;
use std::time::Duration;

use diesel::OptionalExtension;
use diesel_async::methods::LoadQuery;
use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};

use crate::connect::backend::OccBackend;
use crate::drive::on_async::connection::{
    classified, classify, refuse_broken, NativeAsync, NativeAsyncConnection,
};
use crate::drive::on_async::executor::{run, AsyncMiss};
use crate::drive::on_async::send::AsyncComplete;
use crate::drive::on_async::transaction::{Call, OwnTransaction};
use crate::error::Error;
use crate::flow::lock_transaction::{Effect, LockTransaction};
use crate::locks::backend::{facts, ServerLockBackend};
use crate::locks::lock::{
    acquire_write, create_write, fence_not_read_back, grant_in_row, occ_locks, release_write,
    renew_write, AcquireLock, CreateLock, HeldRow, LeaseLost, LockHolder, LockKey, LockOwner,
    LockRow, LockStep, LockTaken, ReleaseLock, RenewLock,
};
use crate::sql::new_token::{Counted, ReturnedBy};
use crate::sql::statement::Assignments;

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
    C: NativeAsyncConnection + Send,
    C::Backend: ServerLockBackend + NativeAsync,
    AcquireLock: Assignments<C::Backend>,
    RenewLock: Assignments<C::Backend>,
    ReleaseLock: Assignments<C::Backend>,
    CreateLock: Assignments<C::Backend>,
    ReturnedBy<occ_locks::fence>: AsyncComplete<C, AcquireLock, i64>,
    Counted: AsyncComplete<C, RenewLock, i64>
        + AsyncComplete<C, ReleaseLock, i64>
        + AsyncComplete<C, CreateLock, i64>,
    LockHolder:
        LoadQuery<'static, C, (Option<String>, Option<chrono::NaiveDateTime>)> + Send + 'static,
    LockOwner: LoadQuery<'static, C, (Option<String>, Option<String>, i64)> + Send + 'static,
    LockRow: LoadQuery<'static, C, i64> + Send + 'static,
    HeldRow: LoadQuery<'static, C, i64> + Send + 'static,
{
    async fn check_held<'a>(
        &'a mut self,
        key: &'a LockKey,
        holder: &'a str,
        fence: i64,
    ) -> Result<(), Error> {
        // The blocking path's two locking reads: the first waits for the row, the second
        // reads the clock after that wait.
        let waited = key.locked_row().get_result::<i64>(self).await.optional();
        classified(self, waited).await?;
        let held = key
            .held_row(holder, fence)
            .get_result::<i64>(self)
            .await
            .optional();
        let held = classified(self, held).await?;
        match held {
            Some(_) => Ok(()),
            None => Err(LeaseLost { key, holder, fence }.explain(self).await),
        }
    }

    async fn acquire_lock<'a>(
        &'a mut self,
        key: &'a LockKey,
        holder: &'a str,
        label: Option<&'a str>,
        ttl: Duration,
        wait: Duration,
    ) -> Result<i64, Error> {
        bounded(self, wait, key, holder, LockStep::Acquire { label, ttl }).await
    }

    async fn renew_lock<'a>(
        &'a mut self,
        key: &'a LockKey,
        holder: &'a str,
        fence: i64,
        ttl: Duration,
        wait: Duration,
    ) -> Result<(), Error> {
        bounded(self, wait, key, holder, LockStep::Renew { fence, ttl })
            .await
            .map(drop)
    }

    async fn release_lock<'a>(
        &'a mut self,
        key: &'a LockKey,
        holder: &'a str,
        fence: i64,
        wait: Duration,
    ) -> Result<(), Error> {
        bounded(self, wait, key, holder, LockStep::Release { fence })
            .await
            .map(drop)
    }
}

/// Runs `step` in a transaction of its own on `conn` whose every wait is bounded by `wait`
/// (the backend's settings, as the blocking path sets them), its statements in the order
/// [`LockTransaction`] gives, and judges its `COMMIT` as the blocking path does: a lost
/// one is [`Error::Ambiguous`]. The fence the lock has after it.
async fn bounded<C>(
    conn: &mut C,
    wait: Duration,
    key: &LockKey,
    holder: &str,
    step: LockStep<'_>,
) -> Result<i64, Error>
where
    C: NativeAsyncConnection + Send,
    C::Backend: ServerLockBackend + NativeAsync,
    AcquireLock: Assignments<C::Backend>,
    RenewLock: Assignments<C::Backend>,
    ReleaseLock: Assignments<C::Backend>,
    CreateLock: Assignments<C::Backend>,
    ReturnedBy<occ_locks::fence>: AsyncComplete<C, AcquireLock, i64>,
    Counted: AsyncComplete<C, RenewLock, i64>
        + AsyncComplete<C, ReleaseLock, i64>
        + AsyncComplete<C, CreateLock, i64>,
    LockHolder:
        LoadQuery<'static, C, (Option<String>, Option<chrono::NaiveDateTime>)> + Send + 'static,
    LockOwner: LoadQuery<'static, C, (Option<String>, Option<String>, i64)> + Send + 'static,
    LockRow: LoadQuery<'static, C, i64> + Send + 'static,
{
    refuse_broken(conn)?;
    let bounds = C::Backend::wait_bounds(wait);
    let mut flow = LockTransaction::new(step.write(), facts::<C::Backend>());
    let mut call = Call::start(conn);
    let result = async {
        let conn = call.conn();
        setting(conn, bounds.before.as_deref()).await?;
        let ended = async {
            let mut transaction = OwnTransaction::begin(&mut *conn).await?;
            let sent = async {
                let conn = transaction.conn();
                setting(conn, bounds.inside.as_deref()).await?;
                let mut effect = flow.begun();
                loop {
                    effect = match effect {
                        Effect::ReadRow => {
                            let row = key.locked_row().get_result::<i64>(conn).await.optional();
                            flow.read_row(classified(conn, row).await?.is_some())
                        }
                        Effect::CreateRow => {
                            run::<C, _, _, Counted, i64>(create_write(key), conn, true).await?;
                            flow.created_row()
                        }
                        // Only SQLite draws fences, and its async connection runs the
                        // blocking path: a fence not drawn would repeat the last one.
                        Effect::DrawFence => {
                            return Err(Error::InvalidSetting {
                                what: "lock backend",
                                reason: "this backend draws fences, which the async path \
                                         does not send"
                                    .into(),
                            })
                        }
                        Effect::Write => break,
                    }
                }
                match step {
                    LockStep::Acquire { label, ttl } => {
                        let write = acquire_write(key, holder, label, ttl);
                        run::<C, _, _, ReturnedBy<occ_locks::fence>, i64>(write, conn, true)
                            .await?
                            .token
                            .ok_or_else(fence_not_read_back)
                    }
                    LockStep::Renew { fence, ttl } => {
                        let write = renew_write(key, holder, fence, ttl);
                        run::<C, _, _, Counted, i64>(write, conn, true).await?;
                        Ok(fence)
                    }
                    LockStep::Release { fence } => {
                        let write = release_write(key, holder, fence);
                        run::<C, _, _, Counted, i64>(write, conn, true).await?;
                        Ok(fence)
                    }
                }
            }
            .await;
            transaction.settle(sent).await
        }
        .await;
        // Whatever the outcome (a failed `BEGIN` too), as the blocking path restores it: a
        // committed grant stays a grant when the restore fails (the connection died right
        // after the commit).
        let _ = setting(conn, bounds.after.as_deref()).await;
        let fence = ended?;
        if flow.confirms_grant() {
            // The blocking path's read-back of the grant after its `COMMIT`.
            let row = key.owner_read().get_result(conn).await.optional();
            let row = classified(conn, row).await?;
            grant_in_row(key, holder, fence, row)?;
        }
        Ok(fence)
    }
    .await;
    call.finish(result).map_err(C::Backend::bounded_error)
}

/// Sends a session or transaction setting, if there is one.
async fn setting<C: SimpleAsyncConnection + Send>(
    conn: &mut C,
    sql: Option<&str>,
) -> Result<(), Error> {
    match sql {
        Some(sql) => conn.batch_execute(sql).await.map_err(Error::Database),
        None => Ok(()),
    }
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
