//! Locks and leases on pools of diesel-async connections (features `locks` and `bb8` or
//! `async-deadpool`): the blocking locks' table, statements, fences and beliefs, with every
//! statement awaited and every wait asleep on tokio's timer.
//!
//! What differs from the blocking [`Locks`](crate::Locks) is only what `async` changes:
//!
//! - an acquisition runs as a task of its own on the runtime, so a `try_lock` or `lock`
//!   future dropped half way (a request timed out) does not leave a lock held that nobody
//!   will release: a grant that arrives after its caller left is released at once;
//! - dropping an [`AsyncLockGuard`] releases the lock from a task spawned on the current
//!   runtime, best effort (outside a runtime nothing is sent, and the lock ends with its
//!   lease); [`AsyncLockGuard::release`] awaits the release and tells its outcome.

use std::time::{Duration, Instant};

use super::lock_connection::LockStatements;
use super::source::AsyncConnectionSource;
use super::write_transaction::AsyncWriteConnection;
use super::write_transaction::TransactionWork;
use crate::error::Error;
use crate::locks::belief::believed;
use crate::locks::held::{Held, Loss};
use crate::locks::lock::{
    is_worth_waiting_on, judge_renewal, late_grant, renewable, report_release, wait_bound, Hold,
    LockRequest,
};
use crate::retry::RetryPolicy;

/// Locks taken with connections from a pool of diesel-async connections.
///
/// ```
/// # #[cfg(all(feature = "bb8", feature = "postgres"))]
/// # mod example {
/// use std::time::Duration;
/// use diesel_async::pooled_connection::bb8::Pool;
/// use diesel_async::AsyncPgConnection;
/// use diesel_occ::asynchronous::AsyncLocks;
/// use diesel_occ::{Error, Held};
///
/// /// Runs the nightly report once across every instance of the service.
/// async fn nightly_report(pool: Pool<AsyncPgConnection>) -> Result<(), Error> {
///     let locks = AsyncLocks::new(pool);
///     locks
///         .with_lock("nightly-report", "2026-11-25", Duration::from_secs(30), Some("web-1"), |held: Held| async move {
///             // Cancelled at its next `.await` if the lease is lost; fence writes with
///             // `held.fence()`.
///             let _fence = held.fence();
///             Ok::<_, Error>(())
///         })
///         .await
/// }
/// # }
/// ```
#[derive(Clone)]
pub struct AsyncLocks<S> {
    pool: S,
}

impl<S: AsyncConnectionSource> AsyncLocks<S> {
    /// Locks whose statements run on connections from `pool` (a bb8 or deadpool pool of
    /// diesel-async connections).
    pub fn new(pool: S) -> Self {
        AsyncLocks { pool }
    }

    /// Takes the lock `(name, resource)` for `ttl` if it is free or its lease ended, else
    /// [`Error::LockHeld`] with its holder's label and the end of its lease; as
    /// [`Locks::try_lock`](crate::Locks::try_lock) decides. Must be called inside a tokio
    /// runtime: the attempt runs as a task of its own (see the module documentation).
    pub async fn try_lock(
        &self,
        name: &str,
        resource: &str,
        ttl: Duration,
        label: Option<&str>,
    ) -> Result<AsyncLockGuard<S>, Error> {
        self.acquire(name, resource, ttl, label, believed(ttl))
            .await
    }

    /// [`try_lock`](Self::try_lock), trying again while the lock is held, the database
    /// refuses for now or a grant came back too late to be believed, for at most `wait`,
    /// the pauses drawn by `policy` and slept on tokio's timer.
    pub async fn lock(
        &self,
        name: &str,
        resource: &str,
        ttl: Duration,
        label: Option<&str>,
        wait: Duration,
        policy: &RetryPolicy,
    ) -> Result<AsyncLockGuard<S>, Error> {
        policy
            .poll_async(wait, is_worth_waiting_on, || {
                self.try_lock(name, resource, ttl, label)
            })
            .await
    }

    /// [`try_lock`](Self::try_lock), believed for `length` from before the request.
    pub(crate) async fn acquire(
        &self,
        name: &str,
        resource: &str,
        ttl: Duration,
        label: Option<&str>,
        length: Duration,
    ) -> Result<AsyncLockGuard<S>, Error> {
        let request = LockRequest::new(name, resource, ttl, label, length)?;
        let (pool, label) = (self.pool.clone(), label.map(str::to_string));
        // A task of its own: if this future is dropped, the task goes on, and the guard
        // it returns to nobody releases the lock when the runtime drops it.
        let attempt = tokio::spawn(crate::telemetry::Parent::current().wrap(async move {
            let start = Instant::now();
            let mut conn = pool.checkout().await?;
            let wait = wait_bound(ttl, request.length.saturating_sub(start.elapsed()));
            let fence = conn
                .acquire_lock(&request.key, &request.holder, label.as_deref(), ttl, wait)
                .await?;
            drop(conn);
            Ok(AsyncLockGuard {
                renewal: AsyncRenewal {
                    pool,
                    hold: Hold::granted(request, fence, ttl, start),
                },
                released: false,
            })
        }));
        let guard = joined(attempt.await)?;
        if !guard.is_held() {
            let lock = guard.describe();
            // Freed on drop, best effort.
            drop(guard);
            return Err(late_grant(lock));
        }
        Ok(guard)
    }
}

/// The result of a task of the library's; a panic in it goes on in the caller.
pub(crate) fn joined<T>(
    joined: Result<Result<T, Error>, tokio::task::JoinError>,
) -> Result<T, Error> {
    match joined {
        Ok(result) => result,
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        Err(join) => Err(Error::InvalidSetting {
            what: "async runtime",
            reason: format!("the lock's task did not run to its end: {join}"),
        }),
    }
}

/// Renewing and releasing one holder's lease on connections of its own from the pool:
/// what an [`AsyncLockGuard`] does, and what a keep-alive task does for it.
#[derive(Clone)]
pub(crate) struct AsyncRenewal<S> {
    pool: S,
    hold: Hold,
}

impl<S> std::ops::Deref for AsyncRenewal<S> {
    type Target = Hold;

    fn deref(&self) -> &Hold {
        &self.hold
    }
}

impl<S: AsyncConnectionSource> crate::locks::lease::Renews for AsyncRenewal<S> {
    fn renew_lease(&self) -> impl std::future::Future<Output = Result<(), Error>> + Send {
        self.renew()
    }
}

impl<S: AsyncConnectionSource> AsyncRenewal<S> {
    /// Extends the lease and the belief, as the blocking renewal does.
    pub(crate) async fn renew(&self) -> Result<(), Error> {
        let start = Instant::now();
        let hold = &self.hold;
        renewable(&hold.key, &hold.belief)?;
        let renewed = async {
            let mut conn = self.pool.checkout().await?;
            conn.renew_lock(
                &hold.key,
                &hold.holder,
                hold.fence,
                hold.ttl,
                hold.renewal_wait(),
            )
            .await
        }
        .await;
        judge_renewal(&hold.key, &hold.belief, start, renewed)
    }

    /// Ends the belief and frees the lock if this holder still holds it.
    pub(crate) async fn release(&self) -> Result<(), Error> {
        let hold = &self.hold;
        hold.end();
        let mut conn = self.pool.checkout().await?;
        let released = conn
            .release_lock(&hold.key, &hold.holder, hold.fence, hold.release_wait())
            .await;
        report_release(hold, &released);
        released
    }
}

/// A lock held, on the async path: its fencing token, whether this process may still act
/// as its holder, and renew and release. Dropping it releases it from a task of its own,
/// best effort.
pub struct AsyncLockGuard<S: AsyncConnectionSource> {
    renewal: AsyncRenewal<S>,
    released: bool,
}

impl<S: AsyncConnectionSource> AsyncLockGuard<S> {
    /// The fencing token of this acquisition: larger than every earlier holder's.
    pub fn fence(&self) -> i64 {
        self.renewal.fence
    }

    /// This holder's random token.
    pub fn holder(&self) -> &str {
        &self.renewal.holder
    }

    /// The lease each renewal grants.
    pub fn ttl(&self) -> Duration {
        self.renewal.ttl
    }

    /// The lock's name and resource, for messages.
    pub fn describe(&self) -> String {
        self.renewal.describe()
    }

    /// Whether this process may still act as the lock's holder; see
    /// [`LockGuard::is_held`](crate::LockGuard::is_held).
    pub fn is_held(&self) -> bool {
        self.renewal.is_held()
    }

    /// The local deadline; see [`LockGuard::deadline`](crate::LockGuard::deadline).
    pub fn deadline(&self) -> Option<Instant> {
        self.renewal.deadline()
    }

    /// The hold as protected work sees it ([`Held::check`], [`Held::lost`]); with no
    /// keep-alive, it ends at the local deadline unless [`renew`](Self::renew) moves it.
    pub fn held(&self) -> Held {
        self.renewal.held(Loss::new())
    }

    /// Runs `write` on `conn` in a transaction that commits only while this guard still
    /// holds the lock by the database's clock ([`Held::write_while_held_async`]), for
    /// tables without a fence column; [`Error::LockLost`] (and nothing written) once it
    /// does not. See [`LockGuard::write_while_held`](crate::LockGuard::write_while_held).
    pub async fn write_while_held<C, T, E, W>(&self, conn: &mut C, write: W) -> Result<T, E>
    where
        C: AsyncWriteConnection,
        W: for<'r> TransactionWork<'r, C, T, E>,
        E: From<Error>,
    {
        self.held().write_while_held_async(conn, write).await
    }

    /// Extends the lease to `ttl` from now (database clock); see
    /// [`LockGuard::renew`](crate::LockGuard::renew) for what each answer means.
    pub async fn renew(&mut self) -> Result<(), Error> {
        self.renewal.renew().await
    }

    /// Frees the lock, keeping its row. [`Error::LockLost`] when another holder took it
    /// over meanwhile. The release runs as a task of its own: dropping this future does
    /// not stop it half way. When it fails otherwise (no pooled connection, the connection
    /// lost), the drop of the guard tries once more from a task.
    pub async fn release(mut self) -> Result<(), Error> {
        let renewal = self.renewal.clone();
        // Until the task answers, the task is the release: a dropped caller leaves it to run.
        self.released = true;
        let release =
            crate::telemetry::Parent::current().wrap(async move { renewal.release().await });
        let result = joined(tokio::spawn(release).await);
        self.released = !matches!(&result, Err(e) if !matches!(e, Error::LockLost { .. }));
        result
    }

    /// The renewal of this lease, for a task of its own.
    pub(crate) fn renewal(&self) -> AsyncRenewal<S> {
        self.renewal.clone()
    }
}

impl<S: AsyncConnectionSource> Drop for AsyncLockGuard<S> {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.renewal.end();
        // Best effort: outside a runtime, or if the release fails, the lock ends with its
        // lease.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let renewal = self.renewal.clone();
            runtime.spawn(async move { renewal.release().await });
        }
    }
}

impl<S: AsyncConnectionSource> std::fmt::Debug for AsyncLockGuard<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncLockGuard")
            .field("lock", &self.describe())
            .field("fence", &self.fence())
            .field("ttl", &self.ttl())
            .field("held", &self.is_held())
            .field("released", &self.released)
            .finish_non_exhaustive()
    }
}

impl<S> std::fmt::Debug for AsyncLocks<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncLocks").finish_non_exhaustive()
    }
}
