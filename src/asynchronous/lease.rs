//! Keep-alive on the async path: a lock whose lease a tokio task renews every third of its
//! TTL, and work run under it that is cancelled as soon as the lease is lost. The
//! decisions (when to renew next, when the lease counts as lost, what the work's answer
//! becomes) are the blocking [`Lease`](crate::Lease)'s.

use std::future::Future;
use std::time::{Duration, Instant};

use super::locks::{AsyncLockGuard, AsyncLocks};
use super::source::AsyncConnectionSource;
use super::write_transaction::AsyncWriteConnection;
use super::write_transaction::TransactionWork;
use crate::error::Error;
use crate::locks::held::{first_of, Held, Loss};
use crate::locks::lease::{keep_renewing, outcome_under_lock, released_lease, Pauses};

/// A lock whose lease a tokio task renews until it is released or dropped.
pub struct AsyncLease<S: AsyncConnectionSource> {
    guard: Option<AsyncLockGuard<S>>,
    /// The hold as the protected work sees it; its loss says why renewing stopped.
    held: Held,
    /// Tells the renewing task to stop at its next pause.
    stop: tokio::sync::watch::Sender<bool>,
}

impl<S: AsyncConnectionSource> AsyncLease<S> {
    /// Starts renewing `guard`'s lease every third of its TTL (sooner again after a failed
    /// renewal, until the local deadline), on a task of the current tokio runtime.
    pub fn keep_alive(guard: AsyncLockGuard<S>) -> Self {
        let loss = Loss::new();
        let renewal = guard.renewal();
        let held = renewal.held(std::sync::Arc::clone(&loss));
        let interval = guard.ttl() / 3;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        // Stopped only between renewals, never in the middle of one (a renewal cut short
        // costs its connection, and a checkout cut short can cost the pool one).
        tokio::spawn(async move {
            if let Some(why) = keep_renewing(interval, stopped, renewal).await {
                loss.set(why);
            }
        });
        AsyncLease {
            guard: Some(guard),
            held,
            stop,
        }
    }

    fn guard(&self) -> &AsyncLockGuard<S> {
        self.guard
            .as_ref()
            .expect("a lease holds its guard until released")
    }

    /// `Ok` while the lease is held as far as this process can tell; [`Error::LockLost`]
    /// once a renewal found it lost or the local deadline passed.
    pub fn check(&self) -> Result<(), Error> {
        self.held.check()
    }

    /// Whether this process may still act as the holder.
    pub fn is_held(&self) -> bool {
        self.check().is_ok()
    }

    /// The hold as the protected work sees it ([`Held::lost`] resolves when it ends).
    pub fn held(&self) -> &Held {
        &self.held
    }

    /// [`Held::write_while_held_async`]: `write` commits only while the lease is still
    /// held by the database's clock.
    pub async fn write_while_held<C, T, E, W>(&self, conn: &mut C, write: W) -> Result<T, E>
    where
        C: AsyncWriteConnection,
        W: for<'r> TransactionWork<'r, C, T, E>,
        E: From<Error>,
    {
        self.held.write_while_held_async(conn, write).await
    }

    /// The local deadline of the lease; renewals move it on.
    pub fn deadline(&self) -> Option<Instant> {
        self.guard().deadline()
    }

    /// The fencing token of this acquisition.
    pub fn fence(&self) -> i64 {
        self.guard().fence()
    }

    /// Runs `work` while the lease renews itself, then releases the lock.
    ///
    /// `work` gets the [`Held`] lock. If the lease is lost before `work` ends, `work` is
    /// dropped at its next `.await` (cancelled) and the answer is [`Error::LockLost`];
    /// otherwise the answer is `work`'s own, except that [`Error::LockLost`] replaces an
    /// `Ok` when the release found the lock taken over. `work`'s error comes back
    /// unchanged, after the release.
    pub async fn run<R, E, F>(self, work: impl FnOnce(Held) -> F) -> Result<R, E>
    where
        F: Future<Output = Result<R, E>>,
        E: From<Error>,
    {
        let held = self.held.clone();
        let mut outcome = None;
        first_of(
            async { outcome = Some(work(held.clone()).await) },
            held.lost(),
        )
        .await;
        let lost = self.check().err();
        let released = self.release().await;
        match outcome {
            Some(outcome) => outcome_under_lock(outcome, lost, released),
            None => Err(lost
                .unwrap_or_else(|| Error::LockLost {
                    lock: held.describe(),
                    why: "the lease was lost while the work ran".into(),
                })
                .into()),
        }
    }

    /// Stops renewing and frees the lock. [`Error::LockLost`] when another holder took it
    /// over, or when the lease was already lost and the release failed (the row may then
    /// stay held until its lease ends; the guard's drop tries once more). A lease lost by
    /// time whose row nobody took is still freed, and answers `Ok`.
    pub async fn release(mut self) -> Result<(), Error> {
        self.stop.send_replace(true);
        let lost = self.check().err();
        let guard = self
            .guard
            .take()
            .expect("a lease holds its guard until released");
        released_lease(guard.release().await, lost)
    }
}

/// The task's pause: stopped when the lease says so.
impl Pauses for tokio::sync::watch::Receiver<bool> {
    async fn stopped_after(&mut self, pause: Duration) -> bool {
        tokio::select! {
            _ = self.wait_for(|stop| *stop) => true,
            () = tokio::time::sleep(pause) => false,
        }
    }
}

impl<S: AsyncConnectionSource> AsyncLocks<S> {
    /// Takes the lock ([`try_lock`](Self::try_lock): [`Error::LockHeld`] when someone
    /// holds it, and `work` does not run), runs `work` while an [`AsyncLease`] renews it
    /// every third of `ttl`, then releases it; see [`AsyncLease::run`] for what `work` is
    /// told and what comes back (it is cancelled when the lease is lost).
    pub async fn with_lock<R, E, F>(
        &self,
        name: &str,
        resource: &str,
        ttl: Duration,
        label: Option<&str>,
        work: impl FnOnce(Held) -> F,
    ) -> Result<R, E>
    where
        F: Future<Output = Result<R, E>>,
        E: From<Error>,
    {
        let guard = self.try_lock(name, resource, ttl, label).await?;
        AsyncLease::keep_alive(guard).run(work).await
    }
}

impl<S: AsyncConnectionSource> Drop for AsyncLease<S> {
    /// Stops renewing; the guard then releases the lock, best effort.
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

impl<S: AsyncConnectionSource> std::fmt::Debug for AsyncLease<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncLease")
            .field("guard", &self.guard)
            .finish_non_exhaustive()
    }
}
