//! The test harness: a fresh, migrated database per test on every backend.
//!
//! SQLite gets a temporary file; PostgreSQL a schema of its own (through `search_path`);
//! MySQL a database of its own. Tests can therefore run in parallel and check exact end
//! states. Server URLs come from `PG_DATABASE_URL` and `MYSQL_DATABASE_URL`; without them
//! the server tests are skipped, unless `CI` or `OCC_REQUIRE_SERVERS` is set: then a
//! missing or unreachable server fails the test.

#![allow(dead_code)]

#[cfg(all(
    feature = "async",
    any(not(feature = "mysql"), feature = "async-mysql")
))]
pub mod batch_paths;
#[cfg(all(
    feature = "locks",
    feature = "async",
    any(not(feature = "mysql"), feature = "async-mysql")
))]
#[macro_use]
pub mod claim_paths;
#[cfg(feature = "deadpool")]
#[macro_use]
pub mod deadpool;
#[macro_use]
pub mod drivers;
pub mod faults;
pub mod fenced;
#[cfg(all(
    feature = "locks",
    feature = "bb8",
    any(not(feature = "mysql"), feature = "async-mysql")
))]
pub mod lock_paths;
pub mod models;
#[cfg(all(
    feature = "async",
    any(not(feature = "mysql"), feature = "async-mysql")
))]
#[macro_use]
pub mod paths;
pub mod schema;
pub mod slow_link;
#[cfg(all(feature = "tracing", feature = "metrics"))]
pub mod telemetry;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use diesel::r2d2::{Pool, R2D2Connection};
use diesel::Connection;
use diesel_migrations::{EmbeddedMigrations, MigrationHarness};
use diesel_occ::PoolConfig;
use diesel_occ::{CheckedManager, Pooled};

/// A clock that stands still at the instant this thread set, for tests of writes within
/// one tick; each thread sets its own, so tests running in parallel do not meet. A test
/// runtime (`paths::runtime`) shares the clock of the thread that built it with its own
/// threads: the async driver's calls on SQLite read the clock on the connection's thread.
#[cfg(feature = "chrono")]
pub struct FrozenClock;

/// A thread's frozen instant, shared with the threads of the runtimes it built.
#[cfg(feature = "chrono")]
pub type FrozenAt = std::sync::Arc<std::sync::Mutex<Option<chrono::DateTime<chrono::Utc>>>>;

#[cfg(feature = "chrono")]
thread_local! {
    static FROZEN_AT: std::cell::RefCell<FrozenAt> = std::cell::RefCell::default();
}

#[cfg(feature = "chrono")]
impl FrozenClock {
    /// Stops this thread's clock (and that of the runtimes it built) at `instant`.
    pub fn freeze(instant: chrono::DateTime<chrono::Utc>) {
        FROZEN_AT.with(|at| *at.borrow().lock().unwrap() = Some(instant));
    }

    /// This thread's clock, to share with another thread.
    pub fn of_this_thread() -> FrozenAt {
        FROZEN_AT.with(|at| at.borrow().clone())
    }

    /// Makes `clock` this thread's clock.
    pub fn share(clock: FrozenAt) {
        FROZEN_AT.with(|at| *at.borrow_mut() = clock);
    }
}

#[cfg(feature = "chrono")]
impl diesel_occ::Clock for FrozenClock {
    fn now() -> chrono::DateTime<chrono::Utc> {
        FROZEN_AT
            .with(|at| *at.borrow().lock().unwrap())
            .expect("FrozenClock::freeze was not called on this thread")
    }
}

/// A pool builder of diesel-occ (`sqlite_pool`, `postgres_pool`, `mysql_pool`).
type MakePool<C> = fn(&str, &PoolConfig) -> Result<Pool<CheckedManager<C>>, diesel_occ::Error>;

/// A migrated database that is dropped with this value.
pub struct TestDb<C: R2D2Connection + 'static> {
    pub pool: Pool<CheckedManager<C>>,
    /// The database's URL (a file path for SQLite).
    pub url: String,
    make_pool: MakePool<C>,
    drop_namespace: Option<Box<dyn FnOnce() + Send>>,
}

impl<C: R2D2Connection + 'static> TestDb<C> {
    /// A pooled connection.
    pub fn conn(&self) -> Pooled<C> {
        self.pool.get().expect("a pooled test connection")
    }

    /// Another pool on the same database, with other settings.
    pub fn pool_with(&self, config: &PoolConfig) -> Pool<CheckedManager<C>> {
        (self.make_pool)(&self.url, config).expect("a second pool")
    }
}

impl<C: R2D2Connection + 'static> TestDb<C> {
    /// Runs `work(t, conn)` on `threads` threads that start together, each with a
    /// connection of its own checked out before the start; the results in thread order.
    pub fn race<R: Send>(
        &self,
        threads: usize,
        work: impl Fn(usize, &mut Pooled<C>) -> R + Sync,
    ) -> Vec<R> {
        let (start, work, pool) = (std::sync::Barrier::new(threads), &work, &self.pool);
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let start = &start;
                    s.spawn(move || {
                        let mut conn = pool.get().expect("a pooled test connection");
                        start.wait();
                        work(t, &mut conn)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }
}

impl<C: R2D2Connection + 'static> Drop for TestDb<C> {
    fn drop(&mut self) {
        if let Some(drop_namespace) = self.drop_namespace.take() {
            drop_namespace();
        }
    }
}

/// The pool settings of the tests: room for the 8-thread tests plus a spare.
/// A pool on a test database's URL, for a child process the test started (which must
/// reach the parent's database, not make its own).
pub trait PoolByUrl: R2D2Connection + Sized + 'static {
    fn pool(url: &str) -> Pool<CheckedManager<Self>>;
}

#[cfg(feature = "sqlite")]
impl PoolByUrl for diesel::SqliteConnection {
    fn pool(url: &str) -> Pool<CheckedManager<Self>> {
        diesel_occ::sqlite_pool(url, &PoolConfig::default()).unwrap()
    }
}

#[cfg(feature = "postgres")]
impl PoolByUrl for diesel::PgConnection {
    fn pool(url: &str) -> Pool<CheckedManager<Self>> {
        diesel_occ::postgres_pool(url, &PoolConfig::default()).unwrap()
    }
}

#[cfg(feature = "mysql")]
impl PoolByUrl for diesel::MysqlConnection {
    fn pool(url: &str) -> Pool<CheckedManager<Self>> {
        diesel_occ::mysql_pool(url, &PoolConfig::default()).unwrap()
    }
}

/// A row of the library's transition history (`occ_transitions`).
#[derive(diesel::QueryableByName)]
pub struct HistoryRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub entity_key: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub from_status: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub to_status: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub actor: Option<String>,
}

/// A child process that is killed when the test ends, however it ends, so that a failed
/// test never leaves one running.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn pool_config() -> PoolConfig {
    PoolConfig {
        max_size: 10,
        // SQLite's write lock has no queue: one of 8 writers hammering a row can wait past
        // the default 5 s on a loaded 2-core machine (CI saw a one-statement JSON merge
        // answer `Retryable { reason: Busy }`). The tests count lost writes, not lock
        // fairness, so their writers wait longer; tests of the wait itself set their own.
        busy_timeout: Duration::from_secs(60),
        ..PoolConfig::default()
    }
}

/// How many fences the fence source has handed out up to `fence`: the fence itself, but
/// on PostgreSQL fences carry the server's timeline above 2^44, which must be 1 here
/// (the test servers never failed over).
pub fn fences_issued(fence: i64) -> i64 {
    let timeline = fence >> 44;
    assert!(timeline <= 1, "fence {fence:#x} has timeline {timeline}");
    fence & ((1 << 44) - 1)
}

/// A name no other test of any process uses at the same time.
pub fn unique_name() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .subsec_nanos();
    format!(
        "occ_t{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        nanos
    )
}

/// Set in CI and by `scripts/test.sh`: every backend must really run.
fn servers_required() -> bool {
    std::env::var_os("CI").is_some() || std::env::var_os("OCC_REQUIRE_SERVERS").is_some()
}

/// The URL in `var`, or `None` (skip) outside CI; in CI a missing URL fails the test.
fn server_url(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if servers_required() => {
            panic!("{var} is not set, but CI / OCC_REQUIRE_SERVERS is: server tests must not be skipped")
        }
        _ => {
            eprintln!("skipped: {var} is not set");
            None
        }
    }
}

/// The example tables, then the library's own (`diesel_occ::migrations`).
fn migrate<C>(conn: &mut C, migrations: EmbeddedMigrations)
where
    C: MigrationHarness<C::Backend> + Connection + diesel::migration::MigrationConnection,
    C::Backend: diesel_occ::migrations::LibraryMigrations,
{
    conn.run_pending_migrations(migrations)
        .expect("migrations run");
    diesel_occ::migrations::run(conn).expect("the library's migrations run");
}

#[cfg(feature = "sqlite")]
pub fn sqlite() -> Option<TestDb<diesel::SqliteConnection>> {
    const MIGRATIONS: EmbeddedMigrations =
        diesel_migrations::embed_migrations!("migrations/sqlite");
    let path = std::env::temp_dir().join(format!("{}.sqlite3", unique_name()));
    let path_text = path.to_str().expect("UTF-8 temp dir").to_owned();
    let pool = diesel_occ::sqlite_pool(&path_text, &pool_config()).expect("SQLite pool");
    migrate(&mut pool.get().expect("connection"), MIGRATIONS);
    Some(TestDb {
        pool,
        url: path_text.clone(),
        make_pool: diesel_occ::sqlite_pool,
        drop_namespace: Some(Box::new(move || {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{path_text}{suffix}"));
            }
        })),
    })
}

/// A fresh migrated database of its own on the server of `PG_DATABASE_URL`, reached
/// through the pooler whose URL is `pooler_url` (any database name: it is replaced), the
/// pool built with `config`. A database rather than a schema: a pooler in transaction
/// mode forwards no `options` (the schema's `search_path`) to the server sessions.
#[cfg(feature = "postgres")]
pub fn postgres_through(
    pooler_url: &str,
    config: &PoolConfig,
) -> Option<TestDb<diesel::PgConnection>> {
    use diesel::connection::SimpleConnection;
    let base = server_url("PG_DATABASE_URL")?;
    let name = unique_name();
    let mut admin = diesel::PgConnection::establish(&base)
        .unwrap_or_else(|e| panic!("cannot reach PostgreSQL at PG_DATABASE_URL: {e}"));
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .expect("create test database");
    let on = |url: &str| {
        let (before_query, query) = url.split_once('?').unwrap_or((url, ""));
        let server = before_query
            .rsplit_once('/')
            .expect("a database in the URL")
            .0;
        let separator = if query.is_empty() { "" } else { "?" };
        format!("{server}/{name}{separator}{query}")
    };
    migrate_postgres(&mut diesel::PgConnection::establish(&on(&base)).expect("direct connection"));
    let url = on(pooler_url);
    let pool = diesel_occ::postgres_pool(&url, config).expect("PostgreSQL pool through the pooler");
    Some(TestDb {
        pool,
        url,
        make_pool: diesel_occ::postgres_pool,
        drop_namespace: Some(Box::new(move || {
            // FORCE ends the pooler's server sessions on it.
            let drop = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
            if admin.batch_execute(&drop).is_err() {
                if let Ok(mut admin) = diesel::PgConnection::establish(&base) {
                    let _ = admin.batch_execute(&drop);
                }
            }
        })),
    })
}

#[cfg(feature = "postgres")]
pub fn postgres() -> Option<TestDb<diesel::PgConnection>> {
    const MIGRATIONS: EmbeddedMigrations =
        diesel_migrations::embed_migrations!("migrations/postgres");
    let base = server_url("PG_DATABASE_URL")?;
    let schema = unique_name();
    use diesel::connection::SimpleConnection;
    let mut admin = diesel::PgConnection::establish(&base)
        .unwrap_or_else(|e| panic!("cannot reach PostgreSQL at PG_DATABASE_URL: {e}"));
    admin
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .expect("create test schema");
    let separator = if base.contains('?') { '&' } else { '?' };
    // The schema names the test's sessions too, so that a test can tell its own apart
    // from those of tests running beside it in the same database. `options` stays last:
    // tests append settings of their own to it.
    let url =
        format!("{base}{separator}application_name={schema}&options=-csearch_path%3D{schema}");
    let pool = diesel_occ::postgres_pool(&url, &pool_config()).expect("PostgreSQL pool");
    migrate(&mut pool.get().expect("connection"), MIGRATIONS);
    Some(TestDb {
        pool,
        url,
        make_pool: diesel_occ::postgres_pool,
        drop_namespace: Some(Box::new(move || {
            // The admin connection is gone if the server restarted meanwhile.
            let drop = format!("DROP SCHEMA {schema} CASCADE");
            if admin.batch_execute(&drop).is_err() {
                if let Ok(mut admin) = diesel::PgConnection::establish(&base) {
                    let _ = admin.batch_execute(&drop);
                }
            }
        })),
    })
}

#[cfg(feature = "mysql")]
pub fn mysql() -> Option<TestDb<diesel::MysqlConnection>> {
    const MIGRATIONS: EmbeddedMigrations = diesel_migrations::embed_migrations!("migrations/mysql");
    let base = server_url("MYSQL_DATABASE_URL")?;
    let database = unique_name();
    use diesel::connection::SimpleConnection;
    let mut admin = diesel::MysqlConnection::establish(&base)
        .unwrap_or_else(|e| panic!("cannot reach MySQL at MYSQL_DATABASE_URL: {e}"));
    admin
        .batch_execute(&format!("CREATE DATABASE {database}"))
        .expect("create test database");
    let url = with_database(&base, &database);
    let pool = diesel_occ::mysql_pool(&url, &pool_config()).expect("MySQL pool");
    migrate(&mut pool.get().expect("connection"), MIGRATIONS);
    Some(TestDb {
        pool,
        url,
        make_pool: diesel_occ::mysql_pool,
        drop_namespace: Some(Box::new(move || {
            // The admin connection is gone if the server restarted meanwhile.
            let drop = format!("DROP DATABASE {database}");
            if admin.batch_execute(&drop).is_err() {
                if let Ok(mut admin) = diesel::MysqlConnection::establish(&base) {
                    let _ = admin.batch_execute(&drop);
                }
            }
        })),
    })
}

/// The example tables and the library's own, on a MySQL connection to an empty database.
#[cfg(feature = "mysql")]
pub fn migrate_mysql(conn: &mut diesel::MysqlConnection) {
    const MIGRATIONS: EmbeddedMigrations = diesel_migrations::embed_migrations!("migrations/mysql");
    migrate(conn, MIGRATIONS);
}

/// The example tables and the library's own, on a PostgreSQL connection.
#[cfg(feature = "postgres")]
pub fn migrate_postgres(conn: &mut diesel::PgConnection) {
    const MIGRATIONS: EmbeddedMigrations =
        diesel_migrations::embed_migrations!("migrations/postgres");
    migrate(conn, MIGRATIONS);
}

/// `mysql://u@h:3306/base?x` with the database replaced: `mysql://u@h:3306/<database>?x`.
#[cfg(feature = "mysql")]
pub fn with_database(url: &str, database: &str) -> String {
    let (before_query, query) = match url.split_once('?') {
        Some((u, q)) => (u, format!("?{q}")),
        None => (url, String::new()),
    };
    let authority_start = before_query.find("://").map_or(0, |i| i + 3);
    let host_part = match before_query[authority_start..].find('/') {
        Some(i) => &before_query[..authority_start + i],
        None => before_query,
    };
    format!("{host_part}/{database}{query}")
}

/// A number a test query returns as `value`.
#[derive(diesel::QueryableByName)]
pub struct Value {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub value: i64,
}

/// The query of the asking session's server id on `backend`; `None` on SQLite, where a
/// file has no sessions.
pub fn session_id_sql(backend: &str) -> Option<&'static str> {
    match backend {
        "postgres" => Some("SELECT CAST(pg_backend_pid() AS BIGINT) AS value"),
        "mysql" => Some("SELECT CAST(CONNECTION_ID() AS SIGNED) AS value"),
        _ => None,
    }
}

/// Waits until the server of `backend` no longer lists session `id`: whatever a killed
/// client had sent (a `COMMIT` in the socket, say) has then been applied or rolled back.
pub fn wait_until_session_ends<C>(conn: &mut C, backend: &str, id: i64)
where
    C: diesel::connection::LoadConnection,
    diesel::query_builder::SqlQuery: diesel::query_dsl::LoadQuery<'static, C, Value>,
{
    use diesel::RunQueryDsl;
    let listed = match backend {
        "postgres" => format!("SELECT COUNT(*) AS value FROM pg_stat_activity WHERE pid = {id}"),
        _ => format!(
            "SELECT CAST(COUNT(*) AS SIGNED) AS value FROM information_schema.PROCESSLIST WHERE ID = {id}"
        ),
    };
    let asked = std::time::Instant::now();
    while diesel::sql_query(&listed)
        .get_result::<Value>(conn)
        .unwrap()
        .value
        > 0
    {
        assert!(
            asked.elapsed() < std::time::Duration::from_secs(30),
            "session {id} outlived its client"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// The count of [`open_transactions`].
#[derive(diesel::QueryableByName)]
pub struct OpenTransactions {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// Transactions open on the server for the test's database (on `conn`, of backend
/// `backend`), other than the asking session's; none on SQLite, where a file has no
/// sessions. A lower bound on MariaDB, whose `information_schema.innodb_trx` was seen to
/// leave out a transaction waiting for a lock (see [`statements_waiting_for`]): a test
/// that must know a row is free also tries to lock it.
pub fn open_transactions<C>(conn: &mut C, backend: &str) -> i64
where
    C: diesel::connection::LoadConnection,
    diesel::query_builder::SqlQuery: diesel::query_dsl::LoadQuery<'static, C, OpenTransactions>,
{
    use diesel::RunQueryDsl;
    let sql = match backend {
        "postgres" => {
            "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() \
             AND application_name = current_setting('application_name') \
             AND pid <> pg_backend_pid() AND xact_start IS NOT NULL"
        }
        "mysql" => {
            "SELECT count(*) AS n FROM information_schema.innodb_trx t \
             JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id \
             WHERE p.db = DATABASE() AND p.id <> CONNECTION_ID()"
        }
        _ => return 0,
    };
    diesel::sql_query(sql)
        .get_result::<OpenTransactions>(conn)
        .unwrap()
        .n
}

/// The sessions (seen on `conn`, of backend `backend`) whose statement waits for a lock
/// that session `holder` holds; none on SQLite, where a file has no sessions. On MariaDB
/// the sessions whose statement in the test's database has run for over 200 ms: its
/// `information_schema.innodb_trx` did not list the waiting transaction of a diesel-async
/// connection (10.11, while `SHOW ENGINE INNODB STATUS` showed it waiting), so the process
/// list is read instead.
pub fn sessions_waiting_for<C>(conn: &mut C, backend: &str, holder: i64) -> Vec<i64>
where
    C: diesel::connection::LoadConnection,
    diesel::query_builder::SqlQuery: diesel::query_dsl::LoadQuery<'static, C, Value>,
{
    use diesel::RunQueryDsl;
    let sql = match backend {
        "postgres" => format!(
            "SELECT CAST(pid AS BIGINT) AS value FROM pg_stat_activity \
             WHERE {holder} = ANY(pg_blocking_pids(pid))"
        ),
        "mysql" => format!(
            "SELECT CAST(id AS SIGNED) AS value FROM information_schema.processlist \
             WHERE db = DATABASE() AND id NOT IN ({holder}, CONNECTION_ID()) \
             AND command IN ('Query', 'Execute') AND time_ms > 200"
        ),
        _ => return Vec::new(),
    };
    let found = diesel::sql_query(sql).load::<Value>(conn).unwrap();
    found.into_iter().map(|row| row.value).collect()
}

/// Writes each item once per backend, in modules `sqlite`, `postgres` and `mysql`, each
/// with `Conn` (the backend's connection type), `BACKEND` (its name) and `db()` (a fresh database, or `None`
/// when that server is not configured outside CI).
#[macro_export]
macro_rules! for_each_backend {
    ($($item:item)*) => {
        #[cfg(feature = "sqlite")]
        mod sqlite {
            #![allow(unused_imports, dead_code)]
            use super::*;
            pub type Conn = diesel::SqliteConnection;
            const BACKEND: &str = "sqlite";
            /// The SQL type of the backend's JSON columns.
            pub type JsonSql = diesel::sql_types::Json;
            fn db() -> Option<common::TestDb<Conn>> { common::sqlite() }
            $($item)*
        }
        #[cfg(feature = "postgres")]
        mod postgres {
            #![allow(unused_imports, dead_code)]
            use super::*;
            pub type Conn = diesel::PgConnection;
            const BACKEND: &str = "postgres";
            /// The SQL type of the backend's JSON columns.
            pub type JsonSql = diesel::sql_types::Jsonb;
            fn db() -> Option<common::TestDb<Conn>> { common::postgres() }
            $($item)*
        }
        #[cfg(feature = "mysql")]
        mod mysql {
            #![allow(unused_imports, dead_code)]
            use super::*;
            pub type Conn = diesel::MysqlConnection;
            const BACKEND: &str = "mysql";
            /// The SQL type of the backend's JSON columns.
            pub type JsonSql = diesel::sql_types::Json;
            fn db() -> Option<common::TestDb<Conn>> { common::mysql() }
            $($item)*
        }
    };
}

/// The `profiles` table (its `ext` column of the backend's JSON type) and its entity
/// `Profile`, inside a `for_each_backend!` module.
#[macro_export]
macro_rules! json_profiles {
    () => {
        diesel::table! {
            use diesel::sql_types::*;
            use super::JsonSql;

            profiles (id) {
                id -> BigInt,
                name -> Text,
                ext -> JsonSql,
                version -> BigInt,
            }
        }

        #[derive(
            Debug,
            Clone,
            PartialEq,
            Queryable,
            Selectable,
            Identifiable,
            Insertable,
            diesel_occ::Guarded,
        )]
        #[diesel(table_name = profiles)]
        pub struct Profile {
            id: i64,
            name: String,
            #[occ(json)]
            ext: serde_json::Value,
            #[occ(version)]
            version: i64,
        }
    };
}

/// The name the test harness knows the test `item` of module `module` by (give it
/// `module_path!()`): the module's path without the binary's crate name, so that a test
/// can start its own binary on one test of its module (`--exact`), in any binary.
pub fn test_name(module: &str, item: &str) -> String {
    match module.split_once("::") {
        Some((_crate, path)) => format!("{path}::{item}"),
        None => item.to_string(),
    }
}
