//! Keep-alive: a lock whose lease a background thread renews at a third of its TTL, on
//! connections of its own from the pool, so that the holder keeps it while it works and
//! learns promptly when it is gone.
//!
//! [`Lease::check`] answers "do I still hold it?" without a round trip: it fails with
//! [`Error::LockLost`] once a renewal failed (taken over, lease ended, database
//! unreachable), and also once the last successful renewal is older than the TTL by this
//! process's monotonic clock, since then the lease may have ended even if no renewal said
//! so. Check before each step of the protected work, and fence its writes
//! ([`fence`](crate::locks::fence)): a check cannot stop a write that a pause delays past it.

use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use diesel::r2d2::{ManageConnection, PooledConnection, R2D2Connection};

use crate::error::Error;
use crate::locks::lock::{LockConnection, LockGuard};

/// What the renewing thread last found.
#[derive(Debug)]
struct Renewal {
    /// When the last renewal (or the acquisition) succeeded.
    at: Instant,
    /// Why renewing stopped, if it did.
    failure: Option<String>,
}

/// A lock whose lease renews itself until it is released or dropped.
pub struct Lease<M: ManageConnection>
where
    M::Connection: R2D2Connection + Send + 'static,
    PooledConnection<M>: LockConnection,
{
    guard: Option<LockGuard<M>>,
    renewal: Arc<Mutex<Renewal>>,
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl<M: ManageConnection> Lease<M>
where
    M::Connection: R2D2Connection + Send + 'static,
    PooledConnection<M>: LockConnection,
{
    /// Starts renewing `guard`'s lease every third of its TTL.
    pub fn keep_alive(guard: LockGuard<M>) -> Self {
        let renewal = Arc::new(Mutex::new(Renewal {
            at: Instant::now(),
            failure: None,
        }));
        let (stop, stopped) = channel::<()>();
        let mut renewer = guard.renewer();
        let interval = guard.ttl() / 3;
        let shared = Arc::clone(&renewal);
        let thread = std::thread::spawn(move || loop {
            match stopped.recv_timeout(interval) {
                Err(RecvTimeoutError::Timeout) => {}
                // Stopped, or the lease was dropped.
                _ => return,
            }
            let result = renewer();
            let mut state = shared.lock().unwrap_or_else(|p| p.into_inner());
            match result {
                Ok(()) => state.at = Instant::now(),
                Err(e) => {
                    state.failure = Some(e.to_string());
                    return;
                }
            }
        });
        Lease {
            guard: Some(guard),
            renewal,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// `Ok` while the lease is held as far as this process can tell;
    /// [`Error::LockLost`] once a renewal failed or none succeeded within the TTL.
    pub fn check(&self) -> Result<(), Error> {
        let guard = self
            .guard
            .as_ref()
            .expect("a lease holds its guard until released");
        let state = self.renewal.lock().unwrap_or_else(|p| p.into_inner());
        let lock = guard.describe();
        if let Some(failure) = &state.failure {
            return Err(Error::LockLost {
                lock: format!("{lock} (renewal failed: {failure})"),
            });
        }
        if state.at.elapsed() >= guard.ttl() {
            return Err(Error::LockLost {
                lock: format!("{lock} (no renewal within the lease)"),
            });
        }
        Ok(())
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
