//! The statements of a lock on a diesel-async connection: the blocking path's statements,
//! explanations and wait bounds (see the `locks` module), each statement awaited. SQLite's
//! connection runs the blocking path whole on its own thread (`sqlite.rs`).

use std::future::Future;
use std::time::Duration;

use diesel::OptionalExtension;
use diesel_async::methods::LoadQuery;
use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};

use super::connection::{classified, classify, refuse_broken, NativeAsync, NativeAsyncConnection};
use super::executor::{run, AsyncMiss};
use super::send::AsyncComplete;
use super::transaction::{Call, OwnTransaction};
use crate::connect::backend::{Duplicates, OccBackend};
use crate::error::Error;
use crate::locks::backend::{LockBackend, ServerLockBackend};
use crate::locks::lock::{
    acquire_statement, grant_in_row, occ_locks, release_statement, renew_statement, AcquireLock,
    CreateLock, HeldRow, LeaseLost, LockHolder, LockKey, LockOwner, LockRow, LockTaken,
    ReleaseLock, RenewLock,
};
use crate::sql::new_token::{Counted, ReturnedBy};
use crate::sql::statement::Assignments;
use crate::write::executor::{CannotMiss, CompareAndSet, Matches};

/// A diesel-async connection locks can run on (`AsyncPgConnection`,
/// `AsyncMysqlConnection`, `SyncConnectionWrapper<SqliteConnection>`): the three
/// statements of a lock. Not a trait to implement.
pub trait AsyncLockConnection: AsyncConnection + Send {
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

/// One of the three statements, with what it needs beyond the key and the holder.
#[derive(Clone, Copy)]
enum Step<'a> {
    Acquire {
        label: Option<&'a str>,
        ttl: Duration,
    },
    Renew {
        fence: i64,
        ttl: Duration,
    },
    Release {
        fence: i64,
    },
}

impl<C> AsyncLockConnection for C
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
        bounded(self, wait, key, holder, Step::Acquire { label, ttl }).await
    }

    async fn renew_lock<'a>(
        &'a mut self,
        key: &'a LockKey,
        holder: &'a str,
        fence: i64,
        ttl: Duration,
        wait: Duration,
    ) -> Result<(), Error> {
        bounded(self, wait, key, holder, Step::Renew { fence, ttl })
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
        bounded(self, wait, key, holder, Step::Release { fence })
            .await
            .map(drop)
    }
}

/// Runs `step` in a transaction of its own on `conn` whose every wait is bounded by `wait`
/// (the backend's settings, as the blocking path sets them), and judges its `COMMIT` as
/// the blocking path does: a lost one is [`Error::Ambiguous`]. The fence the lock has
/// after it.
async fn bounded<C>(
    conn: &mut C,
    wait: Duration,
    key: &LockKey,
    holder: &str,
    step: Step<'_>,
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
    let mut call = Call::start(conn);
    let result = async {
        let conn = call.conn();
        setting(conn, bounds.before.as_deref()).await?;
        let ended = async {
            let mut transaction = OwnTransaction::begin(&mut *conn).await?;
            let sent = async {
                let conn = transaction.conn();
                setting(conn, bounds.inside.as_deref()).await?;
                // The same statements, in the same order, as the blocking `LockConnection`.
                match step {
                    Step::Acquire { label, ttl } => {
                        // Every wait happens here, before the expiry below is computed.
                        lock_row(conn, key).await?;
                        let write = CompareAndSet::one(
                            acquire_statement(key, holder, label, ttl),
                            "occ_locks",
                            key,
                            LockTaken { key },
                        );
                        run::<C, _, _, ReturnedBy<occ_locks::fence>, i64>(write, conn, true)
                            .await?
                            .token
                            .ok_or_else(|| {
                                Error::Database(diesel::result::Error::QueryBuilderError(
                                    "the lock was taken but its fence was not read back".into(),
                                ))
                            })
                    }
                    Step::Renew { fence, ttl } => {
                        // Waits here, so that the lease is checked and extended after them.
                        lock_row(conn, key).await?;
                        let write = CompareAndSet::one(
                            renew_statement(key, holder, fence, ttl),
                            "occ_locks",
                            key,
                            LeaseLost { key, holder, fence },
                        );
                        run::<C, _, _, Counted, i64>(write, conn, true).await?;
                        Ok(fence)
                    }
                    Step::Release { fence } => {
                        let write = CompareAndSet::one(
                            release_statement(key, holder, fence),
                            "occ_locks",
                            key,
                            LeaseLost { key, holder, fence },
                        );
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
        match (ended, step) {
            (Ok(fence), Step::Acquire { .. }) if C::Backend::CONFIRMS_GRANTS => {
                // The blocking path's read-back of the grant after its `COMMIT`.
                let row = key.owner_read().get_result(conn).await.optional();
                let row = classified(conn, row).await?;
                grant_in_row(key, holder, fence, row).map(|()| fence)
            }
            (ended, _) => ended,
        }
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

/// Locks the lock row for the rest of the transaction, creating it on first use, as the
/// blocking path's `lock_row` does (and for its reasons, per backend).
async fn lock_row<C>(conn: &mut C, key: &LockKey) -> Result<(), Error>
where
    C: AsyncConnection + Send,
    C::Backend: OccBackend,
    CreateLock: Assignments<C::Backend>,
    Counted: AsyncComplete<C, CreateLock, i64>,
    LockRow: LoadQuery<'static, C, i64> + Send + 'static,
{
    let create =
        CompareAndSet::one(key.create_row(), "occ_locks", key, CannotMiss).matching(Matches::Any);
    match C::Backend::DUPLICATES {
        Duplicates::OnDuplicateKey => run::<C, _, _, Counted, i64>(create, conn, true)
            .await
            .map(drop),
        Duplicates::OnConflict => {
            if read_locked(conn, key).await?.is_none() {
                run::<C, _, _, Counted, i64>(create, conn, true).await?;
                read_locked(conn, key).await?;
            }
            Ok(())
        }
    }
}

/// The lock row's fence, read `FOR UPDATE`.
async fn read_locked<C>(conn: &mut C, key: &LockKey) -> Result<Option<i64>, Error>
where
    C: AsyncConnection + Send,
    C::Backend: OccBackend,
    LockRow: LoadQuery<'static, C, i64> + Send + 'static,
{
    match key.locked_row().get_result::<i64>(conn).await.optional() {
        Ok(fence) => Ok(fence),
        Err(e) => Err(classify(conn, e).await),
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
