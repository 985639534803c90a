//! One lock test body, two executors: the blocking [`Locks`] on the test's r2d2 pool, and
//! [`AsyncLocks`] on a bb8 pool of diesel-async connections to the same database, driven
//! from the calling thread. Test bodies take a [`LockPath`] and run unchanged on both.

use std::time::Duration;

use diesel_occ::asynchronous::{AsyncConnectionSource, AsyncLease, AsyncLockGuard, AsyncLocks};
use diesel_occ::RetryPolicy;
use diesel_occ::{ConnectionSource, Error, Held, Lease, LockConnection, LockGuard, Locks};

/// The lock calls of the shared test bodies.
pub trait LockPath: Sync {
    /// Which executor, for messages.
    const PATH: &'static str;
    /// A held lock.
    type Guard: Send;

    fn try_lock(&self, name: &str, ttl: Duration, label: &str) -> Result<Self::Guard, Error>;
    fn lock(
        &self,
        name: &str,
        ttl: Duration,
        label: &str,
        wait: Duration,
        policy: &RetryPolicy,
    ) -> Result<Self::Guard, Error>;
    fn fence(guard: &Self::Guard) -> i64;
    fn is_held(guard: &Self::Guard) -> bool;
    fn renew(&self, guard: &mut Self::Guard) -> Result<(), Error>;
    fn release(&self, guard: Self::Guard) -> Result<(), Error>;
    /// Drops the guard where its best-effort release can run.
    fn drop_guard(&self, guard: Self::Guard);
    /// Holds the lock for `hold` under a kept-alive lease, checking it every few
    /// milliseconds; the fence and whether it stayed held throughout.
    fn hold_alive(&self, name: &str, ttl: Duration, hold: Duration) -> Result<(i64, bool), Error>;
}

/// The blocking locks on pool `S`.
pub struct BlockingLocks<S: ConnectionSource>(pub Locks<S>);

impl<S> LockPath for BlockingLocks<S>
where
    S: ConnectionSource + Sync,
    S::Connection: LockConnection,
{
    const PATH: &'static str = "blocking";
    type Guard = LockGuard<S>;

    fn try_lock(&self, name: &str, ttl: Duration, label: &str) -> Result<Self::Guard, Error> {
        self.0.try_lock(name, "main", ttl, Some(label))
    }
    fn lock(
        &self,
        name: &str,
        ttl: Duration,
        label: &str,
        wait: Duration,
        policy: &RetryPolicy,
    ) -> Result<Self::Guard, Error> {
        self.0.lock(name, "main", ttl, Some(label), wait, policy)
    }
    fn fence(guard: &Self::Guard) -> i64 {
        guard.fence()
    }
    fn is_held(guard: &Self::Guard) -> bool {
        guard.is_held()
    }
    fn renew(&self, guard: &mut Self::Guard) -> Result<(), Error> {
        guard.renew()
    }
    fn release(&self, guard: Self::Guard) -> Result<(), Error> {
        guard.release()
    }
    fn drop_guard(&self, guard: Self::Guard) {
        drop(guard);
    }
    fn hold_alive(&self, name: &str, ttl: Duration, hold: Duration) -> Result<(i64, bool), Error> {
        let lease = Lease::keep_alive(self.0.try_lock(name, "main", ttl, Some("alive"))?);
        let fence = lease.fence();
        lease.run(|held: &Held| {
            let end = std::time::Instant::now() + hold;
            let mut always = true;
            while std::time::Instant::now() < end {
                always &= held.is_held();
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok::<_, Error>((fence, always))
        })
    }
}

/// The async locks on pool `S`, driven on `runtime`.
pub struct AsyncLocksOn<S: AsyncConnectionSource> {
    pub locks: AsyncLocks<S>,
    pub runtime: tokio::runtime::Handle,
}

impl<S: AsyncConnectionSource> LockPath for AsyncLocksOn<S> {
    const PATH: &'static str = "async";
    type Guard = AsyncLockGuard<S>;

    fn try_lock(&self, name: &str, ttl: Duration, label: &str) -> Result<Self::Guard, Error> {
        self.runtime
            .block_on(self.locks.try_lock(name, "main", ttl, Some(label)))
    }
    fn lock(
        &self,
        name: &str,
        ttl: Duration,
        label: &str,
        wait: Duration,
        policy: &RetryPolicy,
    ) -> Result<Self::Guard, Error> {
        self.runtime.block_on(
            self.locks
                .lock(name, "main", ttl, Some(label), wait, policy),
        )
    }
    fn fence(guard: &Self::Guard) -> i64 {
        guard.fence()
    }
    fn is_held(guard: &Self::Guard) -> bool {
        guard.is_held()
    }
    fn renew(&self, guard: &mut Self::Guard) -> Result<(), Error> {
        self.runtime.block_on(guard.renew())
    }
    fn release(&self, guard: Self::Guard) -> Result<(), Error> {
        self.runtime.block_on(guard.release())
    }
    fn drop_guard(&self, guard: Self::Guard) {
        let _inside = self.runtime.enter();
        drop(guard);
    }
    fn hold_alive(&self, name: &str, ttl: Duration, hold: Duration) -> Result<(i64, bool), Error> {
        self.runtime.block_on(async {
            let lease = AsyncLease::keep_alive(
                self.locks
                    .try_lock(name, "main", ttl, Some("alive"))
                    .await?,
            );
            let fence = lease.fence();
            lease
                .run(|held: Held| async move {
                    let end = std::time::Instant::now() + hold;
                    let mut always = true;
                    while std::time::Instant::now() < end {
                        always &= held.is_held();
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Ok::<_, Error>((fence, always))
                })
                .await
        })
    }
}
