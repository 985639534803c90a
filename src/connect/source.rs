//! Where the library's own calls get their connections: whatever pool the service already
//! has.
//!
//! [`Locks`](crate::Locks), leader election, [`modify_pooled`](crate::GuardedModify::modify_pooled)
//! and [`with_connection`](crate::with_connection) check a connection out for each
//! statement group and hand it back at once, so a lease renewal never waits behind the
//! holder's work. [`ConnectionSource`] is that one operation; it is implemented for r2d2
//! pools and, with the `deadpool` feature, for deadpool-diesel pools. A pool that cannot
//! hand out a connection is [`Error::Pool`], whatever the pool.

use diesel::connection::Connection;
use diesel::r2d2::{ManageConnection, Pool, R2D2Connection};

use crate::error::Error;

/// A pool the library checks connections out of.
///
/// Clones share the pool (the library keeps one for each background renewal or election).
pub trait ConnectionSource: Clone + Send + Sync + 'static {
    /// The connection the statements run on.
    type Connection: Connection + Send + 'static;

    /// Runs `work` on a connection checked out for it, and returns the connection to the
    /// pool when `work` ends. [`Error::Pool`] when none could be had in the pool's time.
    fn on_connection<T>(&self, work: impl FnOnce(&mut Self::Connection) -> T) -> Result<T, Error>;
}

/// r2d2 pools: the ones [`sqlite_pool`](crate::sqlite_pool) and its siblings build, or any
/// other.
impl<M> ConnectionSource for Pool<M>
where
    M: ManageConnection,
    M::Connection: R2D2Connection + Send + 'static,
{
    type Connection = M::Connection;

    fn on_connection<T>(&self, work: impl FnOnce(&mut M::Connection) -> T) -> Result<T, Error> {
        let mut conn = self.get()?;
        Ok(work(&mut conn))
    }
}

/// deadpool-diesel pools. Their connections are handed out by an async `get` on the tokio
/// runtime the pool was built in, so a call must run in that runtime's context: in
/// `spawn_blocking`, [`with_connection`](crate::with_connection), deadpool's own
/// `interact`, a thread the library started (lock renewals and elections carry the runtime
/// of the code that started them), or, blocking it, a worker of a multi-thread runtime (a
/// lock guard dropped in an async handler). Outside any runtime the call is
/// [`Error::Pool`] saying so; on the thread of a current-thread runtime, which has no other
/// thread to run the checkout on, tokio panics.
#[cfg(feature = "deadpool")]
macro_rules! deadpool_source {
    ($backend:literal, $connection:ty, $module:ident) => {
        #[cfg(feature = $backend)]
        impl ConnectionSource for deadpool_diesel::Pool<deadpool_diesel::Manager<$connection>> {
            type Connection = $connection;

            fn on_connection<T>(
                &self,
                work: impl FnOnce(&mut $connection) -> T,
            ) -> Result<T, Error> {
                let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
                    Error::pool(
                        "a deadpool-diesel pool hands out connections on its tokio runtime: call from inside it (spawn_blocking, with_connection, interact)",
                    )
                })?;
                use diesel::connection::{Connection, TransactionManager};
                let object = checkout_on(&runtime, self.get()).map_err(Error::pool)?;
                let (worked, broken) = {
                    // Poisoned: an earlier `interact` panicked while holding this connection.
                    let mut conn = object.lock().map_err(|_| {
                        Error::pool(
                            "the pooled connection was poisoned by a panic in an earlier use",
                        )
                    })?;
                    let worked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        work(&mut conn)
                    }));
                    let broken = worked.is_err()
                        || <$connection as Connection>::TransactionManager::is_broken_transaction_manager(&mut *conn);
                    (worked, broken)
                };
                // deadpool-diesel tests a connection only when it hands it out again: one
                // left inside a transaction (a panic in the caller's code, a failed
                // `ROLLBACK`) would wait idle in the pool with that transaction, and its
                // locks, open on the server. Taken out of the pool, it closes, which ends
                // the transaction (r2d2 tests a connection when it comes back).
                if broken {
                    drop(deadpool_diesel::$module::Object::take(object));
                }
                match worked {
                    Ok(value) => Ok(value),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
        }
    };
}

/// Waits for `checkout` on `runtime`. On a worker of a multi-thread runtime the worker's
/// other tasks move to other threads first (`block_in_place`), as blocking there requires;
/// elsewhere this thread simply waits.
#[cfg(feature = "deadpool")]
fn checkout_on<F: std::future::Future>(runtime: &tokio::runtime::Handle, checkout: F) -> F::Output {
    match runtime.runtime_flavor() {
        tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| runtime.block_on(checkout))
        }
        _ => runtime.block_on(checkout),
    }
}

#[cfg(feature = "deadpool")]
deadpool_source!("sqlite", diesel::SqliteConnection, sqlite);
#[cfg(feature = "deadpool")]
deadpool_source!("postgres", diesel::PgConnection, postgres);
#[cfg(feature = "deadpool")]
deadpool_source!("mysql", diesel::MysqlConnection, mysql);

/// Starts a thread that runs `work` in the tokio runtime of the caller, if there is one,
/// so that pools reached through that runtime (deadpool-diesel) serve it too.
#[cfg(feature = "locks")]
pub(crate) fn spawn_in_runtime<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    #[cfg(feature = "tokio")]
    {
        let runtime = tokio::runtime::Handle::try_current().ok();
        std::thread::spawn(move || {
            let _inside = runtime.as_ref().map(tokio::runtime::Handle::enter);
            work()
        })
    }
    #[cfg(not(feature = "tokio"))]
    std::thread::spawn(work)
}

/// Where the attempts of a retried operation get their connection.
pub trait Connections {
    /// The connection an attempt runs on.
    type Connection: Connection;

    /// Whether each attempt gets a connection of its own, so that an attempt whose
    /// connection died before its `COMMIT` (nothing written) can run again on another.
    const FRESH_PER_ATTEMPT: bool = false;

    /// Runs `f` on a connection for one attempt.
    fn with<T>(&mut self, f: impl FnOnce(&mut Self::Connection) -> T) -> Result<T, Error>;
}

/// The caller's connection serves every attempt.
impl<C: Connection> Connections for &mut C {
    type Connection = C;

    fn with<T>(&mut self, f: impl FnOnce(&mut C) -> T) -> Result<T, Error> {
        Ok(f(self))
    }
}

/// Each attempt checks a connection out of the pool and returns it when done, so a
/// connection that died is replaced and waits between attempts hold none.
impl<S: ConnectionSource> Connections for &S {
    type Connection = S::Connection;

    const FRESH_PER_ATTEMPT: bool = true;

    fn with<T>(&mut self, f: impl FnOnce(&mut S::Connection) -> T) -> Result<T, Error> {
        self.on_connection(f)
    }
}
