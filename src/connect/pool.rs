//! r2d2 pools set up the way diesel-occ expects.
//!
//! SQLite connections get WAL (readers do not block the writer), a busy timeout (writers
//! queue instead of failing) and foreign keys. Every pool hands out connections through a
//! [`CheckedManager`]: a connection the server dropped is discarded instead of failing the
//! next request, without a round trip on every checkout.

use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::connection::{Instrumentation, InstrumentationEvent};
use diesel::r2d2::{ConnectionManager, ManageConnection, Pool, PooledConnection, R2D2Connection};

use super::reply_bound::Watch;
use super::socket_of;
use crate::error::{connection_lost, read_only_refusal, Error};

/// Settings shared by the pool builders.
///
/// # Default
/// - `max_size`: 10 connections
/// - `min_idle`: 1 connection kept open (r2d2 would otherwise open `max_size` at once)
/// - `connection_timeout`: 30 s to wait for a free connection, then [`Error::Pool`]
/// - `busy_timeout` (SQLite only): 5 s for a writer to wait for the write lock, then a
///   [`Error::Retryable`] with [`RetryReason::Busy`](crate::RetryReason::Busy)
/// - `check_after_idle`: 500 ms; a connection idle for longer is checked with a round
///   trip before it is handed out (HikariCP's default window), a busier one is not
/// - `idle_session_timeout` (MySQL only): 60 s, after which the server closes a session
///   that sent nothing; see `MysqlSettings` (feature `mysql`)
/// - `statement_cache`: on; diesel prepares each statement of fixed SQL once per
///   connection and runs it again by name
/// - `reply_timeout` (PostgreSQL and MySQL): 30 s for any statement's reply, then the
///   connection is closed (see [`PoolConfig::reply_timeout`])
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
    /// How long a connection may have gone without a successful statement before a
    /// checkout checks it with a round trip. `Duration::ZERO` checks every checkout.
    pub check_after_idle: Duration,
    /// How long a MySQL / MariaDB server keeps a session that sends nothing
    /// (`MysqlSettings`, feature `mysql`).
    pub idle_session_timeout: Duration,
    /// Whether diesel keeps its prepared statements on each connection. Turn it off
    /// behind a pooler in transaction mode that keeps no prepared statement across server
    /// sessions (PgBouncer before 1.21, or `max_prepared_statements = 0`): each
    /// statement is then prepared and run in one exchange, which such a pooler sends to
    /// one server session. Left on there, a statement fails with
    /// [`Error::StatementLostByPooler`] once the pooler hands the client another session.
    pub statement_cache: bool,
    /// How long a statement on a pooled PostgreSQL or MySQL connection may wait for the
    /// server's reply before the connection is closed under it; `None` waits for ever.
    ///
    /// The bound for a server that stops answering without closing the connection (a
    /// frozen process, a partition, a paused virtual machine): its kernel still
    /// acknowledges what the client sends, so neither TCP keepalives nor the server's own
    /// timeouts end the wait. The call then returns what a lost connection means at that
    /// point: [`Error::Ambiguous`] if the statement may have taken effect (a `COMMIT`, a
    /// write outside a transaction), a retryable loss before the commit otherwise (retried
    /// on a new connection by the calls that take a pool). It applies to every statement
    /// on the connection, yours too: raise it above your longest statement, including a
    /// row-lock wait you allow. Linux only (the watch finds the connection's socket in
    /// `/proc`); a connection whose socket could not be told apart from one the process
    /// opened at the same moment is not watched.
    pub reply_timeout: Option<Duration>,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            max_size: 10,
            min_idle: 1,
            connection_timeout: Duration::from_secs(30),
            busy_timeout: Duration::from_secs(5),
            check_after_idle: Duration::from_millis(500),
            idle_session_timeout: Duration::from_secs(60),
            statement_cache: true,
            reply_timeout: Some(Duration::from_secs(30)),
        }
    }
}

/// diesel's r2d2 [`ConnectionManager`], checking connections on checkout only when they
/// may have died.
///
/// A round trip per checkout (r2d2's `test_on_check_out` with diesel's `SELECT 1`) cost a
/// third of the round trips of a load-and-update request. Servers drop connections that
/// sat idle (a restart, `wait_timeout`, an administrator's kill), so only a connection
/// that has gone without a successful statement for [`PoolConfig::check_after_idle`] is
/// checked; a connection whose last statement found the connection lost is discarded when
/// it is returned. The manager learns both by instrumenting its connections (any
/// instrumentation set with `set_default_instrumentation` still receives every event).
/// If you replace a pooled connection's instrumentation, that connection is checked on
/// every checkout instead.
#[derive(Debug)]
pub struct CheckedManager<C: R2D2Connection + 'static> {
    inner: ConnectionManager<C>,
    check_after_idle: Duration,
    statement_cache: bool,
    reply_timeout: Option<Duration>,
}

impl<C: R2D2Connection + 'static> CheckedManager<C> {
    /// A manager for `url` that checks connections idle for longer than `check_after_idle`.
    pub fn new(url: impl Into<String>, check_after_idle: Duration) -> Self {
        CheckedManager {
            inner: ConnectionManager::new(url),
            check_after_idle,
            statement_cache: true,
            reply_timeout: None,
        }
    }

    /// The same manager, each connection closed under a statement that waited `bound`
    /// for its reply (see [`PoolConfig::reply_timeout`]).
    pub fn with_reply_timeout(mut self, bound: Duration) -> Self {
        self.reply_timeout = Some(bound);
        self
    }

    /// The same manager, its connections without diesel's prepared-statement cache (see
    /// [`PoolConfig::statement_cache`]).
    pub fn without_statement_cache(mut self) -> Self {
        self.statement_cache = false;
        self
    }
}

impl<C: R2D2Connection + Send + 'static> ManageConnection for CheckedManager<C> {
    type Connection = C;
    type Error = diesel::r2d2::Error;

    fn connect(&self) -> Result<C, Self::Error> {
        let (mut conn, watch) = match self.reply_timeout {
            Some(bound) if socket_of::has_socket::<C::Backend>() => {
                socket_of::one_at_a_time(|| {
                    let before = socket_of::before();
                    let conn = self.inner.connect()?;
                    Ok::<_, Self::Error>((conn, socket_of::watch_new_socket(&before, bound)))
                })?
            }
            _ => (self.inner.connect()?, None),
        };
        if !self.statement_cache {
            conn.set_prepared_statement_cache_size(diesel::connection::CacheSize::Disabled);
        }
        conn.set_instrumentation(Liveness {
            last_answer: Some(Instant::now()),
            lost: false,
            met_read_only: false,
            watch,
            user: diesel::connection::get_default_instrumentation(),
        });
        Ok(conn)
    }

    fn is_valid(&self, conn: &mut C) -> Result<(), Self::Error> {
        let answered_recently = conn
            .instrumentation()
            .downcast_ref::<Liveness>()
            .and_then(|liveness| liveness.last_answer)
            .is_some_and(|at| at.elapsed() < self.check_after_idle);
        if answered_recently {
            Ok(())
        } else {
            self.inner.is_valid(conn)
        }
    }

    fn has_broken(&self, conn: &mut C) -> bool {
        self.inner.has_broken(conn)
            || conn
                .instrumentation()
                .downcast_ref::<Liveness>()
                .is_some_and(|liveness| liveness.lost || liveness.met_read_only)
    }
}

/// Remembers when the server last answered on a connection, whether the connection was
/// found lost and whether it met a read-only server, then passes the event on to the
/// user's instrumentation, if any.
struct Liveness {
    last_answer: Option<Instant>,
    lost: bool,
    /// A write was refused as read-only: the connection reached a standby (through a
    /// proxy during a failover, a stale DNS name, a demoted primary set read-only), so
    /// the pool connects again rather than hand it out. On SQLite the new connection
    /// opens the same file, which costs little.
    met_read_only: bool,
    watch: Option<Arc<Watch>>,
    user: Option<Box<dyn Instrumentation>>,
}

impl Instrumentation for Liveness {
    fn on_connection_event(&mut self, event: InstrumentationEvent<'_>) {
        if let Some(watch) = &self.watch {
            watch.follow(&event);
        }
        if let InstrumentationEvent::FinishQuery { error, .. } = &event {
            match error {
                None => self.last_answer = Some(Instant::now()),
                Some(error) if connection_lost(error) => {
                    self.lost = true;
                    self.last_answer = None;
                }
                Some(error) if read_only_refusal(error) => {
                    self.met_read_only = true;
                    self.last_answer = Some(Instant::now());
                }
                // The server answered, with an error of its own.
                Some(diesel::result::Error::DatabaseError(..)) => {
                    self.last_answer = Some(Instant::now())
                }
                Some(_) => {}
            }
        }
        if let Some(user) = &mut self.user {
            user.on_connection_event(event);
        }
    }
}

/// The reply watch of a connection of [`CheckedManager`]'s, if it has one.
pub(crate) fn watch_of(instrumentation: &mut dyn Instrumentation) -> Option<Arc<Watch>> {
    instrumentation
        .downcast_ref::<Liveness>()
        .and_then(|liveness| liveness.watch.clone())
}

/// A connection checked out of one of this crate's pools.
pub type Pooled<C> = PooledConnection<CheckedManager<C>>;

fn builder<C: R2D2Connection + 'static>(
    url: &str,
    config: &PoolConfig,
) -> (r2d2::Builder<CheckedManager<C>>, CheckedManager<C>) {
    let builder = Pool::builder()
        .max_size(config.max_size)
        .min_idle(Some(config.min_idle.min(config.max_size)))
        .connection_timeout(config.connection_timeout)
        .test_on_check_out(true);
    let manager = CheckedManager::new(url, config.check_after_idle);
    let manager = if config.statement_cache {
        manager
    } else {
        manager.without_statement_cache()
    };
    let manager = match config.reply_timeout {
        Some(bound) => manager.with_reply_timeout(bound),
        None => manager,
    };
    (builder, manager)
}

/// A pool of SQLite connections.
#[cfg(feature = "sqlite")]
pub type SqlitePool = Pool<CheckedManager<diesel::SqliteConnection>>;

/// A pool of PostgreSQL connections.
#[cfg(feature = "postgres")]
pub type PgPool = Pool<CheckedManager<diesel::PgConnection>>;

/// A pool of MySQL / MariaDB connections.
#[cfg(feature = "mysql")]
pub type MysqlPool = Pool<CheckedManager<diesel::MysqlConnection>>;

/// Opens a pool on the SQLite file `path` (created if missing) with [`SqliteSettings`].
///
/// A private in-memory database (`:memory:`, an empty path, a `file:` URI with
/// `mode=memory` but no `cache=shared`) is refused with [`Error::InvalidSetting`]: every
/// pooled connection would open a database of its own, and the tables one creates would
/// be missing on the next. Use a file (a shared-cache `file:name?mode=memory&cache=shared`
/// is accepted, but its table-level locks fail concurrent writers at once).
#[cfg(feature = "sqlite")]
pub fn sqlite_pool(path: &str, config: &PoolConfig) -> Result<SqlitePool, Error> {
    check_sqlite_path(path)?;
    // A file has no reply to wait for: SQLite's own bound is the busy timeout.
    let config = PoolConfig {
        reply_timeout: None,
        ..config.clone()
    };
    let (builder, manager) = builder(path, &config);
    Ok(builder
        .connection_customizer(Box::new(SqliteSettings {
            busy_timeout: config.busy_timeout,
        }))
        .build(manager)?)
}

/// Refuses a SQLite path that gives every connection a private database.
#[cfg(feature = "sqlite")]
fn check_sqlite_path(path: &str) -> Result<(), Error> {
    let query = path
        .strip_prefix("file:")
        .and_then(|uri| uri.split_once('?'))
        .map_or("", |(_, query)| query);
    let parameter = |wanted: &str| query.split('&').any(|pair| pair == wanted);
    let private_memory = path.is_empty()
        || path == ":memory:"
        || path == "file::memory:"
        || (path.starts_with("file:") && parameter("mode=memory") && !parameter("cache=shared"))
        || (path.starts_with("file::memory:") && !parameter("cache=shared"));
    if private_memory {
        return Err(Error::InvalidSetting {
            what: "SQLite path",
            reason: format!(
                "{path:?} opens a private database for every pooled connection, so tables \
                 created on one are missing on the next; use a file (in a temporary \
                 directory for tests)"
            ),
        });
    }
    Ok(())
}

/// Opens a pool on the PostgreSQL `url`.
#[cfg(feature = "postgres")]
pub fn postgres_pool(url: &str, config: &PoolConfig) -> Result<PgPool, Error> {
    let (builder, manager) = builder(url, config);
    Ok(builder.build(manager)?)
}

/// Opens a pool on the MySQL / MariaDB `url`.
///
/// diesel asks the server for rows *matched* (`CLIENT_FOUND_ROWS`), not rows changed, so
/// a guarded write that sets values equal to the stored ones still counts as done.
#[cfg(feature = "mysql")]
pub fn mysql_pool(url: &str, config: &PoolConfig) -> Result<MysqlPool, Error> {
    let (builder, manager) = builder(url, config);
    let settings = MysqlSettings {
        idle_session_timeout: config.idle_session_timeout,
    };
    Ok(builder
        .connection_customizer(Box::new(settings))
        .build(manager)?)
}

/// Sets up each new MySQL / MariaDB connection: the server ends the session once it has
/// sent nothing for `idle_session_timeout` (`wait_timeout`, whole seconds, at least 1).
///
/// diesel's MySQL client waits for a reply without a time limit, and a server can leave
/// it waiting for ever: a MariaDB Galera node that aborts a transaction for a conflicting
/// write from another node can, with prepared statements, end the command without
/// sending its reply (the session shows as idle, `Sleep`, while the client waits). A
/// session that stays idle that long is then closed by the server, and the waiting call
/// fails with a lost connection instead of hanging: [`Error::Retryable`] through
/// [`modify_pooled`](crate::GuardedModify::modify_pooled) and the other calls that take a
/// connection per attempt, a plain database error on a connection of the caller's (whose
/// transaction the server has rolled back), [`Error::Ambiguous`] when it was the
/// `COMMIT` that got no reply. Pooled connections that sat idle past it are replaced at
/// their next checkout (see [`CheckedManager`]). Keep it above the longest time your own
/// code keeps a checked-out connection without sending anything (an open transaction
/// waiting on a remote call, say): the server ends that session too.
///
/// On a Galera node it also makes the session's reads causal (`wsrep_sync_wait` gains
/// its read bit): a read waits until the node has applied every commit the cluster made
/// before it, so that a loaded copy, and the re-read that explains a conflict, show the
/// cluster's latest row rather than a node's older one. Use it with your own pool builder
/// through `connection_customizer`, or on a diesel-async pool through
/// `async_manager_config`.
#[cfg(feature = "mysql")]
#[derive(Debug, Clone, Copy)]
pub struct MysqlSettings {
    /// How long the server keeps a session that sends nothing.
    pub idle_session_timeout: Duration,
}

#[cfg(feature = "mysql")]
impl diesel::r2d2::CustomizeConnection<diesel::MysqlConnection, diesel::r2d2::Error>
    for MysqlSettings
{
    fn on_acquire(&self, conn: &mut diesel::MysqlConnection) -> Result<(), diesel::r2d2::Error> {
        use diesel::connection::SimpleConnection;
        conn.batch_execute(&self.idle_bound())
            .map_err(diesel::r2d2::Error::QueryError)?;
        // MySQL has no wsrep variables (an error, ignored); elsewhere off Galera a no-op.
        let _ = conn.batch_execute(CAUSAL_READS_ON_GALERA);
        Ok(())
    }
}

/// Gives a Galera node's session causal reads (see [`MysqlSettings`]).
#[cfg(feature = "mysql")]
const CAUSAL_READS_ON_GALERA: &str =
    "SET SESSION wsrep_sync_wait = IF(@@wsrep_on, @@wsrep_sync_wait | 1, @@wsrep_sync_wait)";

#[cfg(feature = "mysql")]
impl MysqlSettings {
    /// `SET SESSION wait_timeout = <idle_session_timeout in whole seconds, at least 1>`.
    fn idle_bound(&self) -> String {
        let seconds = self.idle_session_timeout.as_secs().max(1);
        format!("SET SESSION wait_timeout = {seconds}")
    }

    /// The same settings for a pool of diesel-async MySQL connections (bb8 or deadpool):
    /// a manager configuration whose setup applies them to each new connection, made
    /// with `reply_timeout` as `establish_with_reply_timeout` makes it (`None`: no
    /// bound). Use it with `AsyncDieselConnectionManager::new_with_config`.
    #[cfg(all(
        feature = "async-mysql",
        any(feature = "bb8", feature = "async-deadpool")
    ))]
    pub fn async_manager_config(
        self,
        reply_timeout: Option<Duration>,
    ) -> diesel_async::pooled_connection::ManagerConfig<diesel_async::AsyncMysqlConnection> {
        let mut config = diesel_async::pooled_connection::ManagerConfig::default();
        config.custom_setup = Box::new(move |url| {
            Box::pin(async move {
                use diesel_async::{AsyncConnection, SimpleAsyncConnection};
                let mut conn = match reply_timeout {
                    Some(bound) => {
                        crate::asynchronous::establish_with_reply_timeout(url, bound).await?
                    }
                    None => diesel_async::AsyncMysqlConnection::establish(url).await?,
                };
                conn.batch_execute(&self.idle_bound())
                    .await
                    .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
                let _ = conn.batch_execute(CAUSAL_READS_ON_GALERA).await;
                Ok(conn)
            })
        });
        if reply_timeout.is_some() {
            config.recycling_method = crate::asynchronous::recycling_check();
        }
        config
    }
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
