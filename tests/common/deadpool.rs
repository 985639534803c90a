//! deadpool-diesel pools on the test databases, built as deadpool-diesel's README builds
//! them, for the tests that run one body on every kind of pool.

use std::time::Duration;

use deadpool_diesel::{Manager, Pool, Runtime};

use diesel_occ::ConnectionSource;

use super::TestDb;

/// A runtime for a deadpool-diesel pool: its connections are handed out on it.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Runs `test` in the context of a fresh runtime, where deadpool-diesel pools hand out,
/// take back and drop their connections; the pools `test` made are gone before the
/// runtime is.
pub fn in_runtime<T>(test: impl FnOnce() -> T) -> T {
    let runtime = runtime();
    let _in_runtime = runtime.enter();
    test()
}

/// The tokio runtime of the calling thread, for threads a test starts to enter (a
/// deadpool-diesel pool needs it; an r2d2 pool ignores it).
pub fn current_runtime() -> Option<tokio::runtime::Handle> {
    tokio::runtime::Handle::try_current().ok()
}

/// A connection type deadpool-diesel pools.
pub trait Deadpooled: diesel::Connection + Sized + 'static {
    /// `deadpool_diesel::Pool<Manager<Self>>`.
    type Pool: ConnectionSource<Connection = Self>;

    /// A pool of at most `max_size` connections to `url`, whose checkouts wait at most
    /// `wait`.
    fn deadpool(url: &str, max_size: usize, wait: Duration) -> Self::Pool;
}

macro_rules! deadpooled {
    ($backend:literal, $connection:ty) => {
        #[cfg(feature = $backend)]
        impl Deadpooled for $connection {
            type Pool = Pool<Manager<Self>>;

            fn deadpool(url: &str, max_size: usize, wait: Duration) -> Self::Pool {
                Pool::builder(Manager::<Self>::new(url, Runtime::Tokio1))
                    .max_size(max_size)
                    .wait_timeout(Some(wait))
                    .runtime(Runtime::Tokio1)
                    .build()
                    .expect("a deadpool-diesel pool")
            }
        }
    };
}

deadpooled!("sqlite", diesel::SqliteConnection);
deadpooled!("postgres", diesel::PgConnection);
deadpooled!("mysql", diesel::MysqlConnection);

impl<C: Deadpooled + diesel::r2d2::R2D2Connection> TestDb<C> {
    /// A deadpool-diesel pool on this database (8 connections, checkouts wait 30 s).
    pub fn deadpool(&self) -> C::Pool {
        C::deadpool(&self.url, 8, Duration::from_secs(30))
    }
}
