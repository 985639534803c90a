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
//! ([`FencedWrite`](crate::FencedWrite)): a check cannot stop a write that a pause delays
//! past it.

use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use diesel::r2d2::{ManageConnection, PooledConnection, R2D2Connection};

use crate::error::Error;
use crate::locks::lock::{LockConnection, LockGuard};

/// A lock whose lease renews itself until it is released or dropped.
pub struct Lease<M: ManageConnection>
where
    M::Connection: R2D2Connection + Send + 'static,
    PooledConnection<M>: LockConnection,
{
    guard: Option<LockGuard<M>>,
    /// Why renewing stopped, if it did.
    failure: Arc<Mutex<Option<String>>>,
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl<M: ManageConnection> Lease<M>
where
    M::Connection: R2D2Connection + Send + 'static,
    PooledConnection<M>: LockConnection,
{
    /// Starts renewing `guard`'s lease every third of its TTL (sooner again after a
    /// failed renewal, until the local deadline).
    pub fn keep_alive(guard: LockGuard<M>) -> Self {
        let failure = Arc::new(Mutex::new(None));
        let (stop, stopped) = channel::<()>();
        let renewal = guard.renewal();
        let interval = guard.ttl() / 3;
        let retry = (interval / 4).max(Duration::from_millis(1));
        let shared = Arc::clone(&failure);
        let thread = std::thread::spawn(move || {
            let mut pause = interval;
            loop {
                match stopped.recv_timeout(pause) {
                    Err(RecvTimeoutError::Timeout) => {}
                    // Stopped, or the lease was dropped.
                    _ => return,
                }
                let why = match renewal.renew() {
                    Ok(()) => {
                        pause = interval;
                        continue;
                    }
                    Err(Error::LockLost { why, .. }) => why,
                    Err(_) if renewal.is_held() => {
                        pause = retry;
                        continue;
                    }
                    Err(e) => format!("no renewal succeeded before the local deadline: {e}"),
                };
                renewal.end();
                *shared.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
                return;
            }
        });
        Lease {
            guard: Some(guard),
            failure,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn guard(&self) -> &LockGuard<M> {
        self.guard
            .as_ref()
            .expect("a lease holds its guard until released")
    }

    /// `Ok` while the lease is held as far as this process can tell;
    /// [`Error::LockLost`] once a renewal found it lost or the local deadline passed.
    pub fn check(&self) -> Result<(), Error> {
        let guard = self.guard();
        let failure = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        let why = match (&*failure, guard.is_held()) {
            (Some(why), _) => why.clone(),
            (None, false) => "no renewal came back before the local deadline".to_string(),
            (None, true) => return Ok(()),
        };
        Err(Error::LockLost {
            lock: guard.describe(),
            why,
        })
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

    /// Stops renewing and frees the lock. [`Error::LockLost`] when it was already lost.
    pub fn release(mut self) -> Result<(), Error> {
        self.stop_renewing();
        let lost = self.check().err();
        let guard = self
            .guard
            .take()
            .expect("a lease holds its guard until released");
        match (guard.release(), lost) {
            (Ok(()), _) => Ok(()),
            (Err(_), Some(lost)) => Err(lost),
            (Err(e), None) => Err(e),
        }
    }

    fn stop_renewing(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl<M: ManageConnection> Drop for Lease<M>
where
    M::Connection: R2D2Connection + Send + 'static,
    PooledConnection<M>: LockConnection,
{
    /// Stops renewing; the guard then releases the lock, best effort.
    fn drop(&mut self) {
        self.stop_renewing();
    }
}

impl<M: ManageConnection> std::fmt::Debug for Lease<M>
where
    M::Connection: R2D2Connection + Send + 'static,
    PooledConnection<M>: LockConnection,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("guard", &self.guard)
            .finish_non_exhaustive()
    }
}
