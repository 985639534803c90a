//! A lock's statements written once for both APIs: its bounded transaction (the
//! [flow](crate::flow::lock_transaction) of reads, creation, fence and write), the
//! read-back of a grant, and the check that a holder still holds it.

use std::future::{ready, Future};
use std::time::Duration;

use diesel::connection::{LoadConnection, SimpleConnection};
use diesel::result::Error as DieselError;

use super::backend::{facts, LockBackend};
use super::lock::{
    acquire_write, create_write, fence_not_read_back, grant_in_row, occ_locks, release_write,
    renew_write, AcquireLock, CreateLock, HeldRow, LeaseLost, LockKey, LockOwner, LockRow,
    LockStep, LockTaken, ReleaseLock, RenewLock,
};
use crate::connect::transaction::WriteTransaction;
use crate::drive::blocking::executor::CannotMiss;
use crate::drive::{now, Blocking, Body, Io, QueryOn, RunOn};
use crate::error::{connection_lost, Error, RetryReason};
use crate::flow::lock_transaction::{Effect, LockTransaction};
use crate::sql::new_token::{Counted, ReturnedBy};
use crate::telemetry::Call;

/// A connection a lock's transaction runs on.
pub(crate) trait LockIo: Io<Backend: LockBackend> {
    /// Runs `body` in a write transaction of the library's bounded to about `bound`: the
    /// backend's session settings before it and restored after whatever the outcome
    /// ([`LockBackend::bounded`]), judged as every transaction of the library's.
    /// `body` sends the setting inside the transaction first and judges its statements'
    /// errors, as [`write_lock`] does.
    fn bounded<'a, 'c, T, F>(
        &'c mut self,
        bound: Duration,
        body: F,
    ) -> impl Future<Output = Result<T, Error>> + Send + 'c
    where
        for<'r> F: Body<&'r mut Self, Result<T, Error>, Fut: Send> + Send + 'a,
        T: Send + 'a,
        'a: 'c;

    /// Draws the next fence, where the backend draws it before the acquisition
    /// (SQLite's).
    fn draw_fence(&mut self) -> impl Future<Output = Result<(), Error>> + Send;

    /// Sends a setting, if there is one, its error classified by its kind and text
    /// (inside a transaction, a Galera abort answers the setting: a retry, not a raw
    /// error).
    fn setting(&mut self, sql: Option<&str>) -> impl Future<Output = Result<(), Error>> + Send;
}

impl<C> LockIo for Blocking<C>
where
    C: LoadConnection + WriteTransaction + SimpleConnection + Send,
    C::Backend: LockBackend,
{
    fn bounded<'a, 'c, T, F>(
        &'c mut self,
        bound: Duration,
        body: F,
    ) -> impl Future<Output = Result<T, Error>> + Send + 'c
    where
        for<'r> F: Body<&'r mut Self, Result<T, Error>, Fut: Send> + Send + 'a,
        T: Send + 'a,
        'a: 'c,
    {
        let conn = self.inner();
        ready(C::Backend::bounded(conn, bound, |conn| {
            now(body(Blocking::wrap(conn)))
        }))
    }

    fn draw_fence(&mut self) -> impl Future<Output = Result<(), Error>> + Send {
        let drawn = C::Backend::draw_fence(self.inner());
        ready(match drawn {
            Ok(()) => Ok(()),
            Err(e) => Err(now(self.classify(e))),
        })
    }

    fn setting(&mut self, sql: Option<&str>) -> impl Future<Output = Result<(), Error>> + Send {
        ready(match sql {
            Some(sql) => self.inner().batch_execute(sql).map_err(Error::from),
            None => Ok(()),
        })
    }
}

/// The first of a query's rows, if any (diesel's `get_result` made optional).
async fn first<Q, C, U>(query: Q, conn: &mut C) -> Result<Option<U>, DieselError>
where
    Q: QueryOn<C, U>,
{
    Ok(query.load_on(conn).await?.into_iter().next())
}

/// `result`, its error classified on `conn`.
async fn classified<C: Io, T>(conn: &mut C, result: Result<T, DieselError>) -> Result<T, Error> {
    match result {
        Ok(value) => Ok(value),
        Err(error) => Err(conn.classify(error).await),
    }
}

/// Runs `step` on the lock `key` for `holder` in the backend's bounded transaction (its
/// setting inside the transaction first), its statements in the order [`LockTransaction`]
/// gives, and reads a grant back after the
/// `COMMIT` where the backend needs it: the fence the lock has after it. One call on the
/// connection: dropped half way, it leaves the connection marked broken where the client
/// cannot drop a statement half read.
pub(crate) async fn write_lock<C>(
    conn: &mut C,
    key: &LockKey,
    holder: &str,
    step: LockStep<'_>,
    wait: Duration,
) -> Result<i64, Error>
where
    C: LockIo,
    LockRow: QueryOn<C, i64>,
    LockOwner: QueryOn<C, (Option<String>, Option<String>, i64)>,
    Counted: RunOn<C, CreateLock, CannotMiss, i64>,
    for<'k> ReturnedBy<occ_locks::fence>: RunOn<C, AcquireLock, LockTaken<'k>, i64>,
    for<'k> Counted:
        RunOn<C, RenewLock, LeaseLost<'k>, i64> + RunOn<C, ReleaseLock, LeaseLost<'k>, i64>,
{
    let shown = key.shown();
    let call = Call::new::<C::Backend>(step.operation(), "occ_locks", Some(&shown));
    call.run_reporting(
        async move {
            conn.refuse_broken()?;
            // Every statement of the call, a grant's read-back after its `COMMIT` too.
            let _replies = conn.tighten_replies(super::backend::reply_limit(wait));
            let mut flow = LockTransaction::new(step.write(), facts::<C::Backend>());
            let confirms = flow.confirms_grant();
            // The bound's setting inside the transaction, before the lock's statements.
            let inside = C::Backend::wait_bounds(wait).inside;
            conn.call(async |conn: &mut C| {
                let mut statements = async |conn: &mut C| {
                    let mut effect = flow.begun();
                    loop {
                        effect = match effect {
                            Effect::ReadRow => {
                                let row = first(key.locked_row(), conn).await;
                                flow.read_row(classified(conn, row).await?.is_some())
                            }
                            Effect::CreateRow => {
                                <Counted as RunOn<C, _, _, i64>>::run(
                                    conn,
                                    create_write(key),
                                    true,
                                )
                                .await?;
                                flow.created_row()
                            }
                            Effect::DrawFence => {
                                conn.draw_fence().await?;
                                flow.drew_fence()
                            }
                            Effect::Write => break,
                        }
                    }
                    match step {
                        LockStep::Acquire { label, ttl } => {
                            let write = acquire_write(key, holder, label, ttl);
                            <ReturnedBy<occ_locks::fence> as RunOn<C, _, _, i64>>::run(
                                conn, write, true,
                            )
                            .await?
                            .token
                            .ok_or_else(fence_not_read_back)
                        }
                        LockStep::Renew { fence, ttl } => {
                            let write = renew_write(key, holder, fence, ttl);
                            <Counted as RunOn<C, _, _, i64>>::run(conn, write, true).await?;
                            Ok(fence)
                        }
                        LockStep::Release { fence } => {
                            let write = release_write(key, holder, fence);
                            <Counted as RunOn<C, _, _, i64>>::run(conn, write, true).await?;
                            Ok(fence)
                        }
                    }
                };
                // The errors of its statements (the setting's too: PostgreSQL reports a bound
                // that fired as a statement was ending on the next one) as the lock reports them,
                // before the `COMMIT`: a failed `COMMIT` is judged as every transaction's (it may
                // have landed).
                let sent = async |conn: &mut C| {
                    let sent = match conn.setting(inside.as_deref()).await {
                        Ok(()) => statements(conn).await,
                        Err(e) => Err(e),
                    };
                    sent.map_err(C::Backend::bounded_error)
                };
                let fence = conn.bounded(wait, sent).await.map_err(lost_before_commit)?;
                if confirms {
                    // Read back after the `COMMIT`: one plain read, which sees this session's own
                    // commit. Lost, it leaves a grant whose `COMMIT` answered unconfirmed.
                    let row = first(key.owner_read(), conn).await;
                    let row = classified(conn, row).await.map_err(unconfirmed)?;
                    grant_in_row(key, holder, fence, row)?;
                }
                Ok(fence)
            })
            .await
        },
        |answer| step.report(key, answer),
    )
    .await
}

/// A connection lost before the lock transaction's `COMMIT` (a lost `COMMIT` is
/// [`Error::Ambiguous`] by now): nothing was written, and the lock's calls take a
/// connection of their pool each, so another attempt can succeed. Before, a server that
/// stopped answering left `try_lock` a raw "Server has gone away".
fn lost_before_commit(error: Error) -> Error {
    match error {
        Error::Database(source) if connection_lost(&source) => Error::Retryable {
            reason: RetryReason::ConnectionLost,
            source,
        },
        other => other,
    }
}

/// A grant's read-back that failed: its `COMMIT` answered, so the grant may stand (it
/// holds the lock until its lease ends) or may not (see
/// [`LockBackend::CONFIRMS_GRANTS`]). Neither a plain failure nor a refusal to retry:
/// [`Error::Ambiguous`], which tells the caller to read the row before deciding.
fn unconfirmed(error: Error) -> Error {
    match error {
        Error::Database(source) | Error::Retryable { source, .. } | Error::Ambiguous { source } => {
            Error::Ambiguous { source }
        }
        other => other,
    }
}

/// Inside the caller's open transaction: [`Error::LockLost`] unless `holder` still holds
/// the lock `key` with `fence` and an unexpired lease by the database's clock. Two
/// statements, for the reason the acquisition has two: the first waits for the row (a
/// renewal in flight, someone's `FOR UPDATE`), the second reads the clock after that
/// wait. Both lock, so that they read the latest row even in a REPEATABLE READ snapshot
/// taken before the caller's write.
pub(crate) async fn check_held<C>(
    conn: &mut C,
    key: &LockKey,
    holder: &str,
    fence: i64,
) -> Result<(), Error>
where
    C: Io,
    LockRow: QueryOn<C, i64>,
    HeldRow: QueryOn<C, i64>,
    LockOwner: QueryOn<C, (Option<String>, Option<String>, i64)>,
{
    conn.refuse_broken()?;
    conn.call(async |conn: &mut C| {
        let waited = first(key.locked_row(), conn).await;
        classified(conn, waited).await?;
        let held = first(key.held_row(holder, fence), conn).await;
        if classified(conn, held).await?.is_some() {
            return Ok(());
        }
        let row = first(key.owner_read(), conn).await;
        Err(LeaseLost { key, holder, fence }.given(classified(conn, row).await?))
    })
    .await
}
