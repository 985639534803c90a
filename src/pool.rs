//! r2d2 pools set up the way diesel-occ expects.
//!
//! SQLite connections get WAL (readers do not block the writer), a busy timeout (writers
//! queue instead of failing) and foreign keys. Server connections are checked on checkout,
//! so a connection the server dropped is discarded by the pool instead of failing the
//! next request.

use std::time::Duration;

use diesel::r2d2::{ConnectionManager, Pool};

use crate::error::Error;

/// Settings shared by the pool builders.
///
/// # Default
/// - `max_size`: 10 connections
/// - `min_idle`: 1 connection kept open (r2d2 would otherwise open `max_size` at once)
/// - `connection_timeout`: 30 s to wait for a free connection, then [`Error::Pool`]
/// - `busy_timeout` (SQLite only): 5 s for a writer to wait for the write lock, then a
///   [`Error::Retryable`] with [`RetryReason::Busy`](crate::RetryReason::Busy)
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Most connections the pool opens.
    pub max_size: u32,
    /// Idle connections the pool keeps open.
    pub min_idle: u32,
    /// How long `get()` waits for a connection.
    pub connection_timeout: Duration,
    /// How long a SQLite writer waits for the write lock.
    pub busy_timeout: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            max_size: 10,
            min_idle: 1,
            connection_timeout: Duration::from_secs(30),
            busy_timeout: Duration::from_secs(5),
        }
    }
}

fn builder<C: diesel::r2d2::R2D2Connection + 'static>(
    config: &PoolConfig,
) -> r2d2::Builder<ConnectionManager<C>> {
    Pool::builder()
        .max_size(config.max_size)
        .min_idle(Some(config.min_idle.min(config.max_size)))
        .connection_timeout(config.connection_timeout)
        .test_on_check_out(true)
}

/// A pool of SQLite connections.
#[cfg(feature = "sqlite")]
pub type SqlitePool = Pool<ConnectionManager<diesel::SqliteConnection>>;

/// A pool of PostgreSQL connections.
#[cfg(feature = "postgres")]
pub type PgPool = Pool<ConnectionManager<diesel::PgConnection>>;

/// A pool of MySQL / MariaDB connections.
#[cfg(feature = "mysql")]
pub type MysqlPool = Pool<ConnectionManager<diesel::MysqlConnection>>;

/// Opens a pool on the SQLite file `path` (created if missing) with [`SqliteSettings`].
///
/// `:memory:` gives every pooled connection its own empty database; use a file.
#[cfg(feature = "sqlite")]
pub fn sqlite_pool(path: &str, config: &PoolConfig) -> Result<SqlitePool, Error> {
    Ok(builder(config)
        .connection_customizer(Box::new(SqliteSettings {
            busy_timeout: config.busy_timeout,
        }))
        .build(ConnectionManager::new(path))?)
}

/// Opens a pool on the PostgreSQL `url`; connections are checked on checkout.
#[cfg(feature = "postgres")]
pub fn postgres_pool(url: &str, config: &PoolConfig) -> Result<PgPool, Error> {
    Ok(builder(config).build(ConnectionManager::new(url))?)
}

/// Opens a pool on the MySQL / MariaDB `url`; connections are checked on checkout.
///
/// diesel asks the server for rows *matched* (`CLIENT_FOUND_ROWS`), not rows changed, so
/// a guarded write that sets values equal to the stored ones still counts as done.
#[cfg(feature = "mysql")]
pub fn mysql_pool(url: &str, config: &PoolConfig) -> Result<MysqlPool, Error> {
    Ok(builder(config).build(ConnectionManager::new(url))?)
}

/// Sets up each new SQLite connection: busy timeout, WAL, `synchronous = NORMAL` (safe
/// with WAL), foreign keys. Use it with your own pool builder through
/// `connection_customizer`.
#[cfg(feature = "sqlite")]
#[derive(Debug, Clone, Copy)]
pub struct SqliteSettings {
    /// How long a writer waits for the write lock.
    pub busy_timeout: Duration,
}

#[cfg(feature = "sqlite")]
impl diesel::r2d2::CustomizeConnection<diesel::SqliteConnection, diesel::r2d2::Error>
    for SqliteSettings
{
    fn on_acquire(&self, conn: &mut diesel::SqliteConnection) -> Result<(), diesel::r2d2::Error> {
        use diesel::connection::SimpleConnection;
        // The busy timeout comes first so that switching to WAL waits for other writers.
        conn.batch_execute(&format!(
            "PRAGMA busy_timeout = {}; PRAGMA journal_mode = WAL; \
             PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;",
            self.busy_timeout.as_millis()
        ))
        .map_err(diesel::r2d2::Error::QueryError)
    }
}
