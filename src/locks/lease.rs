//! Keep-alive: a lock whose lease a background thread renews at a third of its TTL, on
//! connections of its own from the pool, so that the holder keeps it while it works and
//! learns promptly when it is gone.
//!
//! [`Lease::check`] answers "do I still hold it?" without a round trip, from the lock's
//! local deadline ([`LockGuard::deadline`]): it fails with [`Error::LockLost`] once a
//! renewal found the lock lost, and once the deadline passed with no renewal back in time,
//! even while a renewal is still waiting on a stalled database. A renewal that fails for
//! another reason (the database unreachable for a moment) is tried again sooner, until the
//! deadline. Check before each step of the protected work, and fence its writes
//! ([`FencedWrite`](crate::FencedWrite)) or run them with [`Lease::write_while_held`]: a
//! check cannot stop a write that a pause delays past it. [`Lease::run`] and
//! [`Locks::with_lock`] run a closure under the lease and release it after.

use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::connect::source::ConnectionSource;

use crate::connect::transaction::WriteTransaction;
use crate::drive::now;
use crate::error::Error;
use crate::locks::held::{Held, Loss};
use crate::locks::lock::{report_loss, Hold, LockConnection, LockGuard, Locks, Renewal};
use std::future::Future;

/// A lock whose lease renews itself until it is released or dropped.
pub struct Lease<S: ConnectionSource>
where
    S::Connection: LockConnection,
{
    guard: Option<LockGuard<S>>,
    /// The hold as the protected work sees it; its loss says why renewing stopped.
    held: Held,
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// When a keep-alive renews next after a renewal answered `renewed`, renewing every
/// `interval`: in an interval after a success, sooner (a quarter of it) after a failure
/// while the lease is still `held`; or why it stops, the lease lost.
pub(crate) fn next_renewal(
    renewed: Result<(), Error>,
    held: bool,
    interval: Duration,
) -> Result<Duration, String> {
    match renewed {
        Ok(()) => Ok(interval),
        Err(Error::LockLost { why, .. }) => Err(why),
        Err(_) if held => Ok((interval / 4).max(Duration::from_millis(1))),
        Err(e) => Err(format!(
            "no renewal succeeded before the local deadline: {e}"
        )),
    }
}

/// The keep-alive's loop, written once for the thread and the tokio task: pause
/// (`stopped_after` answers whether it was told to stop meanwhile), renew, and choose the
/// next pause ([`next_renewal`]), until stopped (`None`) or the lease is lost: then the
/// belief ends, and the answer says why.
pub(crate) async fn keep_renewing<R: Renews>(
    interval: Duration,
    mut stop: impl Pauses,
    renewal: R,
) -> Option<String> {
    let mut pause = interval;
    loop {
        if stop.stopped_after(pause).await {
            return None;
        }
        match next_renewal(renewal.renew_lease().await, renewal.is_held(), interval) {
            Ok(next) => pause = next,
            Err(why) => {
                renewal.end();
                report_loss(&renewal.key, &renewal.belief, &why);
                return Some(why);
            }
        }
    }
}

/// The keep-alive's pause between renewals on either driver, cut short by a stop.
pub(crate) trait Pauses {
    /// Waits `pause`; whether it was told to stop meanwhile.
    fn stopped_after(&mut self, pause: Duration) -> impl Future<Output = bool> + Send;
}

/// The thread's pause: stopped by a message, or by the lease dropping its sender.
impl Pauses for Receiver<()> {
    fn stopped_after(&mut self, pause: Duration) -> impl Future<Output = bool> + Send {
        let timed_out = matches!(self.recv_timeout(pause), Err(RecvTimeoutError::Timeout));
        std::future::ready(!timed_out)
    }
}

/// A lease's renewal on either driver.
pub(crate) trait Renews: std::ops::Deref<Target = Hold> {
    /// Extends the lease and the belief.
    fn renew_lease(&self) -> impl Future<Output = Result<(), Error>> + Send;
}

impl<S: ConnectionSource> Renews for Renewal<S>
where
    S::Connection: LockConnection,
{
    fn renew_lease(&self) -> impl Future<Output = Result<(), Error>> + Send {
        std::future::ready(self.renew())
    }
}

/// The answer of a lease's release that `released` answered: a failed release of a lease
/// already `lost` says it was lost, and why the release failed when it was not a takeover
/// (the row may then stay held until the database's lease ends; the guard's drop tries
/// once more).
pub(crate) fn released_lease(
    released: Result<(), Error>,
    lost: Option<Error>,
) -> Result<(), Error> {
    match (released, lost) {
        (Ok(()), _) => Ok(()),
        (Err(failed), Some(Error::LockLost { lock, why }))
            if !matches!(failed, Error::LockLost { .. }) =>
        {
            Err(Error::LockLost {
                lock,
                why: format!("{why}; its release failed too: {failed}"),
            })
        }
        (Err(_), Some(lost)) => Err(lost),
        (Err(e), None) => Err(e),
    }
}

/// Whether work under a lock succeeded, given its `outcome`, whether the lock was `lost`
/// before it returned and how the release went: `outcome`'s own error unchanged; an `Ok`
/// replaced by [`Error::LockLost`] when the lease was lost before the work returned or the
/// release found the lock taken over.
pub(crate) fn outcome_under_lock<R, E: From<Error>>(
    outcome: Result<R, E>,
    lost: Option<Error>,
    released: Result<(), Error>,
) -> Result<R, E> {
    let value = outcome?;
    match (lost, released) {
        (Some(lost), _) => Err(lost.into()),
        (None, Err(lost @ Error::LockLost { .. })) => Err(lost.into()),
        // The work ran while held; a lock that could not be freed now ends with its
        // lease (the guard's drop tried again).
        (None, _) => Ok(value),
    }
}

impl<S: ConnectionSource> Lease<S>
where
    S::Connection: LockConnection,
{
    /// Starts renewing `guard`'s lease every third of its TTL (sooner again after a
    /// failed renewal, until the local deadline).
    pub fn keep_alive(guard: LockGuard<S>) -> Self {
        let loss = Loss::new();
        let (stop, stopped) = channel::<()>();
        let renewal = guard.renewal();
        let held = renewal.held(Arc::clone(&loss));
        let interval = guard.ttl() / 3;
        let shared = Arc::clone(&loss);
        let thread = crate::connect::source::spawn_in_runtime(move || {
            if let Some(why) = now(keep_renewing(interval, stopped, renewal)) {
                shared.set(why);
            }
        });
        Lease {
            guard: Some(guard),
            held,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn guard(&self) -> &LockGuard<S> {
        self.guard
            .as_ref()
            .expect("a lease holds its guard until released")
    }

    /// `Ok` while the lease is held as far as this process can tell;
    /// [`Error::LockLost`] once a renewal found it lost or the local deadline passed.
    pub fn check(&self) -> Result<(), Error> {
        self.held.check()
    }

    /// The hold as the protected work sees it: [`Held::check`], [`Held::sleep`] that ends
    /// when the lease is lost, [`Held::write_while_held`]; for another thread too.
    pub fn held(&self) -> &Held {
        &self.held
    }

    /// [`Held::write_while_held`]: `write` commits only while the lease is still held by
    /// the database's clock.
    pub fn write_while_held<C, T, E>(
        &self,
        conn: &mut C,
        write: impl FnOnce(&mut C) -> Result<T, E>,
    ) -> Result<T, E>
    where
        C: LockConnection + WriteTransaction,
        E: From<Error>,
    {
        self.held.write_while_held(conn, write)
    }

    /// Runs `work` while the lease renews itself, then releases the lock.
    ///
    /// `work` gets the [`Held`] lock: it should check it between steps (or pause with
    /// [`Held::sleep`], which ends as soon as the lock is lost) and write through
    /// [`Held::write_while_held`]. The answer is `work`'s own, except that
    /// [`Error::LockLost`] replaces an `Ok` when the lease was lost before `work` returned
    /// (its writes through `write_while_held` each landed only while held; anything else
    /// it did may have overlapped the next holder) or the release found the lock taken
    /// over. `work`'s error comes back unchanged, after the release.
    pub fn run<R, E>(self, work: impl FnOnce(&Held) -> Result<R, E>) -> Result<R, E>
    where
        E: From<Error>,
    {
        let outcome = work(&self.held);
        let lost = self.check().err();
        let released = self.release();
        outcome_under_lock(outcome, lost, released)
    }

    /// Whether this process may still act as the holder ([`check`](Self::check) is `Ok`).
    pub fn is_held(&self) -> bool {
        self.check().is_ok()
    }

    /// The local deadline of the lease ([`LockGuard::deadline`]); renewals move it on.
    pub fn deadline(&self) -> Option<Instant> {
        self.guard().deadline()
    }

    /// The fencing token of this acquisition.
    pub fn fence(&self) -> i64 {
        self.guard.as_ref().map_or(0, LockGuard::fence)
    }

    /// Stops renewing and frees the lock. [`Error::LockLost`] when another holder took it
    /// over, or when the lease was already lost and the release failed (the row may then
    /// stay held until its lease ends; the guard's drop tries once more). A lease lost by
    /// time whose row nobody took is still freed, and answers `Ok`.
    pub fn release(mut self) -> Result<(), Error> {
        self.stop_renewing();
        let lost = self.check().err();
        let guard = self
            .guard
            .take()
            .expect("a lease holds its guard until released");
        released_lease(guard.release(), lost)
    }

    fn stop_renewing(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl<S: ConnectionSource> Locks<S>
where
    S::Connection: LockConnection,
{
    /// Takes the lock ([`try_lock`](Self::try_lock): [`Error::LockHeld`] when someone holds
    /// it, and `work` does not run), runs `work` while a [`Lease`] renews it every third of
    /// `ttl`, then releases it; see [`Lease::run`] for what `work` is told and what comes
    /// back. For a lock worth waiting for, take it with [`lock`](Self::lock) and call
    /// `Lease::keep_alive(guard).run(work)`.
    pub fn with_lock<R, E>(
        &self,
        name: &str,
        resource: &str,
        ttl: Duration,
        label: Option<&str>,
        work: impl FnOnce(&Held) -> Result<R, E>,
    ) -> Result<R, E>
    where
        E: From<Error>,
    {
        let guard = self.try_lock(name, resource, ttl, label)?;
        Lease::keep_alive(guard).run(work)
    }
}

impl<S: ConnectionSource> Drop for Lease<S>
where
    S::Connection: LockConnection,
{
    /// Stops renewing; the guard then releases the lock, best effort.
    fn drop(&mut self) {
        self.stop_renewing();
    }
}

impl<S: ConnectionSource> std::fmt::Debug for Lease<S>
where
    S::Connection: LockConnection,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("guard", &self.guard)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lost(why: &str) -> Error {
        Error::LockLost {
            lock: "jobs/main".into(),
            why: why.into(),
        }
    }

    #[test]
    fn a_lost_leases_failed_release_says_why_it_failed() {
        let failed = Error::Pool("no connection within 2 s".into());
        let answer = released_lease(Err(failed), Some(lost("no renewal before the deadline")));
        assert!(
            matches!(&answer, Err(Error::LockLost { why, .. })
                if why == "no renewal before the deadline; its release failed too: \
                           no pooled connection available: no connection within 2 s"),
            "{answer:?}"
        );
        // A takeover the release found says no more than the loss.
        let answer = released_lease(Err(lost("taken over")), Some(lost("no renewal")));
        assert!(matches!(&answer, Err(Error::LockLost { why, .. }) if why == "no renewal"));
        assert!(released_lease(Ok(()), Some(lost("no renewal"))).is_ok());
    }
}
