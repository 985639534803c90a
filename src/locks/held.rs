//! A held lock as the work it protects sees it: whether it is still held, a sleep that
//! ends early when it is lost, and writes that the database refuses once it is lost.
//!
//! The work gets a [`Held`] from [`Locks::with_lock`](crate::Locks::with_lock), from a
//! [`Lease`](crate::Lease) or, for a leader's job, from
//! [`Candidate::start_with_job`](crate::Candidate::start_with_job). Two checks protect it:
//!
//! - [`Held::check`] and [`Held::sleep`] answer from this process's belief (its local
//!   deadline, and what the renewals found), with no round trip: the work stops at the
//!   next step once the lock is lost, or once the holder is told to step down;
//! - [`Held::write_while_held`] runs a write in a transaction that, before it commits,
//!   locks the lock row and checks holder token, fence and expiry by the database's clock.
//!   A write from a holder that lost the lock is rolled back, whatever this process
//!   believed (a pause, a clock that jumped, someone who deleted the lock row), and while
//!   the transaction is open nobody can take the lock over. Tables with a fence column
//!   can use [`FencedWrite`](crate::FencedWrite) instead, which needs no lock table in the
//!   same database.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::connect::transaction::{commit_operation, WriteTransaction};
use crate::error::Error;
use crate::locks::belief::Belief;
use crate::locks::lock::{LockConnection, LockKey};
use crate::retry::Stop;

/// Why a holder must stop: set once (by a renewal that found the lock lost, or by a
/// leader stepping down), and waited on by [`Held::sleep`].
#[derive(Debug, Default)]
pub(crate) struct Loss {
    why: Mutex<Option<String>>,
    changed: Condvar,
    /// Wakes [`Held::lost`]'s waits on the async side.
    #[cfg(feature = "tokio")]
    wake: tokio::sync::Notify,
}

impl Loss {
    /// No loss yet.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Loss::default())
    }

    /// Records why the holder must stop (the first reason stays) and wakes its sleeps.
    pub(crate) fn set(&self, why: String) {
        let mut current = self.why.lock().unwrap_or_else(|p| p.into_inner());
        if current.is_none() {
            *current = Some(why);
        }
        self.changed.notify_all();
        #[cfg(feature = "tokio")]
        self.wake.notify_waiters();
    }

    /// Why the holder must stop, once it must.
    pub(crate) fn why(&self) -> Option<String> {
        self.why.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits until a loss is recorded or `until` passes.
    fn wait_until(&self, until: Instant) {
        let mut why = self.why.lock().unwrap_or_else(|p| p.into_inner());
        while why.is_none() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            why = match self.changed.wait_timeout(why, left) {
                Ok((why, _)) => why,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }
}

/// A lock held by this process, as the work it protects sees it.
#[derive(Debug, Clone)]
pub struct Held {
    key: LockKey,
    holder: String,
    fence: i64,
    belief: Arc<Belief>,
    loss: Arc<Loss>,
}

impl Held {
    /// The hold of `holder` with `fence` on `key`, believed while `belief` holds and no
    /// `loss` is recorded.
    pub(crate) fn new(
        key: LockKey,
        holder: String,
        fence: i64,
        belief: Arc<Belief>,
        loss: Arc<Loss>,
    ) -> Self {
        Held {
            key,
            holder,
            fence,
            belief,
            loss,
        }
    }

    /// The fencing token of this acquisition (or leader's term).
    pub fn fence(&self) -> i64 {
        self.fence
    }

    /// The lock's name and resource, for messages.
    pub fn describe(&self) -> String {
        self.key.describe()
    }

    /// `Ok` while this process may act as the holder; [`Error::LockLost`], saying why,
    /// once the lock was found lost, the local deadline passed with no renewal back in
    /// time, or the holder was told to stop (a leader stepping down). No round trip.
    pub fn check(&self) -> Result<(), Error> {
        let why = match self.loss.why() {
            Some(why) => why,
            None if self.belief.is_held() => return Ok(()),
            None => "its local deadline passed with no renewal back in time".to_string(),
        };
        Err(Error::LockLost {
            lock: self.describe(),
            why,
        })
    }

    /// Whether [`check`](Self::check) is `Ok`.
    pub fn is_held(&self) -> bool {
        self.check().is_ok()
    }

    /// The local deadline ([`LockGuard::deadline`](crate::LockGuard::deadline)); renewals
    /// move it on. `None` once the belief ended.
    pub fn deadline(&self) -> Option<Instant> {
        self.belief.deadline()
    }

    /// Sleeps for `duration`, or until the lock is lost or the holder told to stop: then
    /// [`Error::LockLost`] at once. Use it for the pauses of a loop that works under the
    /// lock, so that losing it interrupts the wait.
    pub fn sleep(&self, duration: Duration) -> Result<(), Error> {
        // A duration past what `Instant` can hold (`Duration::MAX`) sleeps until the loss.
        let end = Instant::now().checked_add(duration);
        loop {
            self.check()?;
            let now = Instant::now();
            if end.is_some_and(|end| now >= end) {
                return Ok(());
            }
            // The deadline may move on while waiting: wake at it and look again.
            let wake = self.belief.deadline().map_or(now, |deadline| match end {
                Some(end) => deadline.min(end),
                None => deadline,
            });
            self.loss.wait_until(wake);
        }
    }

    /// Waits on the tokio runtime until [`check`](Self::check) fails, and returns its
    /// [`Error::LockLost`]: the lock was found lost, the local deadline passed with no
    /// renewal back in time, or the holder was told to stop. For async work under the
    /// lock: race it against the work, and the work is dropped (cancelled at its next
    /// `.await`) as soon as the lock is gone.
    #[cfg(feature = "tokio")]
    pub async fn lost(&self) -> Error {
        loop {
            let notified = std::pin::pin!(self.loss.wake.notified());
            let mut notified = notified;
            // Registered before the check, so a loss recorded in between still wakes it.
            notified.as_mut().enable();
            if let Err(error) = self.check() {
                return error;
            }
            match self.belief.deadline() {
                Some(deadline) => {
                    let deadline = tokio::time::sleep_until(deadline.into());
                    first_of(notified, deadline).await;
                }
                None => notified.await,
            }
        }
    }

    /// [`sleep`](Self::sleep) on the tokio runtime: waits `duration`, or until the lock is
    /// lost or the holder told to stop, then [`Error::LockLost`] at once. For the pauses
    /// of async work under the lock that should end early when the lock goes, but not be
    /// dropped half way as racing it against [`lost`](Self::lost) would.
    #[cfg(feature = "tokio")]
    pub async fn sleep_async(&self, duration: Duration) -> Result<(), Error> {
        use std::future::Future;
        self.check()?;
        // tokio's `sleep` takes any duration (`Duration::MAX` sleeps until the loss).
        let (mut lost, mut slept) = (
            std::pin::pin!(self.lost()),
            std::pin::pin!(tokio::time::sleep(duration)),
        );
        std::future::poll_fn(|cx| {
            if let std::task::Poll::Ready(lost) = lost.as_mut().poll(cx) {
                return std::task::Poll::Ready(Err(lost));
            }
            slept.as_mut().poll(cx).map(|()| self.check())
        })
        .await
    }

    /// Runs `write` on `conn` in a transaction that commits only if this process still
    /// holds the lock by the database's own account: before committing, the lock row is
    /// locked and its holder token, fence and expiry (by the database's clock) checked.
    /// Otherwise the transaction rolls back and the answer is [`Error::LockLost`], naming
    /// who holds the lock now; this holder's belief ends with it.
    ///
    /// `conn` must reach the database of the lock table. The check runs after `write`, so
    /// the lock row is locked only for the end of the transaction (a renewal is not held
    /// up by a long write), and while it is locked nobody can take the lock over: the
    /// write lands before the next holder's grant, never after it. `write`'s own error
    /// rolls back and comes back unchanged; diesel-occ's reach the caller through
    /// `E: From<Error>`. Inside a transaction of the caller's it runs as a savepoint, and
    /// the lock row stays locked until that transaction ends: renewals wait for it, so keep
    /// such a transaction well under the renewal interval (a third of the lease), or the
    /// lease ends for want of a renewal although nobody else took it.
    ///
    /// The check waits for the lock row as the session's own settings allow (PostgreSQL's
    /// `lock_timeout`, MariaDB's `innodb_lock_wait_timeout`): it reads the clock after the
    /// wait, so a long wait can only make it refuse, never commit late. Under PostgreSQL
    /// `REPEATABLE READ` or `SERIALIZABLE` a renewal that touched the lock row since the
    /// transaction's snapshot makes the check a serialization failure
    /// ([`Error::Retryable`]): run protected writes at `READ COMMITTED` (the default).
    pub fn write_while_held<C, T, E>(
        &self,
        conn: &mut C,
        write: impl FnOnce(&mut C) -> Result<T, E>,
    ) -> Result<T, E>
    where
        C: LockConnection + WriteTransaction,
        E: From<Error>,
    {
        // Refused without a round trip when the belief already ended.
        self.check()?;
        let result = commit_operation(conn, |conn| {
            let value = write(conn).map_err(Stop::Caller)?;
            conn.check_held(&self.key, &self.holder, self.fence)?;
            Ok(value)
        });
        self.settled(result)
    }

    /// The answer of a write while held: the write's own error unchanged; a
    /// [`Error::LockLost`] from the check ends this holder's belief, with the reason.
    /// What the blocking and the async writes while held both end with.
    pub(crate) fn settled<T, E: From<Error>>(&self, result: Result<T, Stop<E>>) -> Result<T, E> {
        match result {
            Ok(value) => Ok(value),
            Err(Stop::Caller(e)) => Err(e),
            Err(Stop::Occ(e)) => {
                if let Error::LockLost { why, .. } = &e {
                    self.loss.set(why.clone());
                    self.belief.end();
                }
                Err(e.into())
            }
        }
    }

    /// The lock, the holder token and the fence the database's check compares.
    #[cfg(feature = "async")]
    pub(crate) fn checked_by(&self) -> (&LockKey, &str, i64) {
        (&self.key, &self.holder, self.fence)
    }
}

/// Waits for whichever of `a` and `b` finishes first; the other is dropped.
#[cfg(feature = "tokio")]
pub(crate) async fn first_of<A, B>(a: A, b: B)
where
    A: std::future::Future,
    B: std::future::Future,
{
    let (mut a, mut b) = (std::pin::pin!(a), std::pin::pin!(b));
    std::future::poll_fn(|cx| {
        if a.as_mut().poll(cx).is_ready() || b.as_mut().poll(cx).is_ready() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await
}
