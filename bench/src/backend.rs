//! Which database a run talks to, and the per-backend modules each workload is compiled
//! into.
//!
//! diesel types a connection by its backend, and so do the library's entity traits, so
//! each workload is written once inside [`per_backend!`] and compiled three times, with
//! `Conn`, `JsonSql` and the backend's SQL spellings in scope: what a user of one backend
//! writes, with no generic bounds in the way.

use std::error::Error;

use crate::report::Report;
use crate::Settings;

/// Compiles `items` into modules `sqlite`, `postgres` and `mysql`, each with:
/// `Conn`, `AsyncConn` (its diesel-async connection), `Pool`, `JsonSql` (the JSON column's SQL type), `BACKEND`, `JSON_DDL` (the
/// JSON column's type in `CREATE TABLE`), `merge_patch(document, patch)` (the SQL
/// function a hand-written one-statement merge calls: `json_patch`, `JSON_MERGE_PATCH`,
/// and PostgreSQL's shallow `||`), `pool(url, size)` and `pool_with(url, config)`. With `uses(a, b)` first, the
/// same backend's module of each sibling `a` and `b` is in scope under that name.
macro_rules! per_backend {
    (uses($($sibling:ident),*) $($item:item)*) => {
        #[cfg(feature = "sqlite")]
        pub mod sqlite {
            #![allow(dead_code, unused_imports)]
            use super::*;
            pub type Conn = diesel::SqliteConnection;
            pub type AsyncConn = diesel_async::sync_connection_wrapper::SyncConnectionWrapper<Conn>;
            pub type Pool = diesel_occ::SqlitePool;
            pub type JsonSql = diesel::sql_types::Json;
            pub const BACKEND: &str = "sqlite";
            pub const JSON_DDL: &str = "TEXT";
            diesel::define_sql_function! {
                /// SQLite's RFC 7396 merge.
                #[sql_name = "json_patch"]
                fn merge_patch(document: diesel::sql_types::Json, patch: diesel::sql_types::Json) -> diesel::sql_types::Json;
            }
            pub fn pool(url: &str, size: u32) -> Result<Pool, diesel_occ::Error> {
                pool_with(url, &$crate::backend::pool_config(size))
            }
            pub fn pool_with(url: &str, config: &diesel_occ::PoolConfig) -> Result<Pool, diesel_occ::Error> {
                diesel_occ::sqlite_pool(url, config)
            }
            $(use super::$sibling::sqlite as $sibling;)*
            $($item)*
        }
        #[cfg(feature = "postgres")]
        pub mod postgres {
            #![allow(dead_code, unused_imports)]
            use super::*;
            pub type Conn = diesel::PgConnection;
            pub type AsyncConn = diesel_async::AsyncPgConnection;
            pub type Pool = diesel_occ::PgPool;
            pub type JsonSql = diesel::sql_types::Jsonb;
            pub const BACKEND: &str = "postgres";
            pub const JSON_DDL: &str = "JSONB";
            diesel::define_sql_function! {
                /// The function behind `jsonb || jsonb`.
                #[sql_name = "jsonb_concat"]
                fn merge_patch(document: diesel::sql_types::Jsonb, patch: diesel::sql_types::Jsonb) -> diesel::sql_types::Jsonb;
            }
            pub fn pool(url: &str, size: u32) -> Result<Pool, diesel_occ::Error> {
                pool_with(url, &$crate::backend::pool_config(size))
            }
            pub fn pool_with(url: &str, config: &diesel_occ::PoolConfig) -> Result<Pool, diesel_occ::Error> {
                diesel_occ::postgres_pool(url, config)
            }
            $(use super::$sibling::postgres as $sibling;)*
            $($item)*
        }
        #[cfg(feature = "mysql")]
        pub mod mysql {
            #![allow(dead_code, unused_imports)]
            use super::*;
            pub type Conn = diesel::MysqlConnection;
            pub type AsyncConn = diesel_async::AsyncMysqlConnection;
            pub type Pool = diesel_occ::MysqlPool;
            pub type JsonSql = diesel::sql_types::Json;
            pub const BACKEND: &str = "mysql";
            pub const JSON_DDL: &str = "JSON";
            diesel::define_sql_function! {
                /// MySQL's and MariaDB's RFC 7396 merge.
                #[sql_name = "JSON_MERGE_PATCH"]
                fn merge_patch(document: diesel::sql_types::Json, patch: diesel::sql_types::Json) -> diesel::sql_types::Json;
            }
            pub fn pool(url: &str, size: u32) -> Result<Pool, diesel_occ::Error> {
                pool_with(url, &$crate::backend::pool_config(size))
            }
            pub fn pool_with(url: &str, config: &diesel_occ::PoolConfig) -> Result<Pool, diesel_occ::Error> {
                diesel_occ::mysql_pool(url, config)
            }
            $(use super::$sibling::mysql as $sibling;)*
            $($item)*
        }
    };
    ($($item:item)*) => {
        $crate::backend::per_backend!(uses() $($item)*);
    };
}
pub(crate) use per_backend;

/// Whether blocking connections keep diesel's prepared-statement cache (`--no-statement-cache`).
static STATEMENT_CACHE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Turns diesel's prepared-statement cache off for every blocking connection from now on.
pub fn disable_statement_cache() {
    STATEMENT_CACHE.store(false, std::sync::atomic::Ordering::Relaxed);
}

/// Whether blocking connections keep diesel's statement cache (to pass on to a child).
pub fn statement_cache() -> bool {
    STATEMENT_CACHE.load(std::sync::atomic::Ordering::Relaxed)
}

/// A blocking connection to `url`, with the statement cache as `--no-statement-cache` says.
pub fn establish<C: diesel::Connection>(url: &str) -> diesel::ConnectionResult<C> {
    let mut conn = C::establish(url)?;
    if !statement_cache() {
        conn.set_prepared_statement_cache_size(diesel::connection::CacheSize::Disabled);
    }
    Ok(conn)
}

/// A pool of `size` connections, all opened up front so that no measurement pays for a
/// connect.
pub fn pool_config(size: u32) -> diesel_occ::PoolConfig {
    diesel_occ::PoolConfig {
        statement_cache: statement_cache(),
        max_size: size,
        min_idle: size,
        // SQLite: 16 writers queue for the one write lock; give them time.
        busy_timeout: std::time::Duration::from_secs(30),
        ..diesel_occ::PoolConfig::default()
    }
}

/// `DROP TABLE IF EXISTS name; CREATE TABLE name (columns)`, in SQL all three backends read.
pub fn recreate<C: diesel::Connection>(
    conn: &mut C,
    name: &str,
    columns: &str,
) -> diesel::QueryResult<()> {
    conn.batch_execute(&format!("DROP TABLE IF EXISTS {name}"))?;
    conn.batch_execute(&format!("CREATE TABLE {name} ({columns})"))
}

/// The database of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite { temporary: bool },
    Postgres,
    Mysql,
}

macro_rules! dispatch {
    ($self:expr, $workload:ident, $settings:expr, $report:expr) => {
        dispatch!($self, $workload, run, $settings, $report)
    };
    ($self:expr, $workload:ident, $run:ident, $settings:expr, $report:expr) => {
        match $self {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite { .. } => crate::$workload::sqlite::$run($settings, $report),
            #[cfg(feature = "postgres")]
            Backend::Postgres => crate::$workload::postgres::$run($settings, $report),
            #[cfg(feature = "mysql")]
            Backend::Mysql => crate::$workload::mysql::$run($settings, $report),
            #[allow(unreachable_patterns)]
            other => Err(other.not_built().into()),
        }
    };
}

type Outcome = Result<(), Box<dyn Error>>;

impl Backend {
    /// The backend a URL names, and the URL to connect with (a fresh temporary SQLite
    /// file when none is given).
    pub fn from_url(url: Option<&str>) -> Result<(Backend, String), Box<dyn Error>> {
        let (backend, url) = Self::named_by(url)?;
        if !backend.built() {
            return Err(backend.not_built().into());
        }
        Ok((backend, url))
    }

    fn named_by(url: Option<&str>) -> Result<(Backend, String), Box<dyn Error>> {
        Ok(match url {
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                (Backend::Postgres, url.to_string())
            }
            Some(url) if url.starts_with("mysql://") => (Backend::Mysql, url.to_string()),
            Some(path) => (Backend::Sqlite { temporary: false }, path.to_string()),
            None => {
                let path = std::env::temp_dir()
                    .join(format!("diesel-occ-bench-{}.sqlite3", std::process::id()));
                let path = path
                    .to_str()
                    .ok_or("the temporary directory is not UTF-8")?;
                (Backend::Sqlite { temporary: true }, path.to_string())
            }
        })
    }

    /// Whether this build has the backend (its feature of the bench crate).
    fn built(self) -> bool {
        match self {
            Backend::Sqlite { .. } => cfg!(feature = "sqlite"),
            Backend::Postgres => cfg!(feature = "postgres"),
            Backend::Mysql => cfg!(feature = "mysql"),
        }
    }

    /// What to run instead, for a backend this build does not have.
    fn not_built(self) -> String {
        format!(
            "this occ-bench was built without {0}: run it with `cargo run --release -p diesel-occ-bench --features {0} -- ...`",
            self.name()
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite { .. } => "sqlite",
            Backend::Postgres => "postgres",
            Backend::Mysql => "mysql",
        }
    }

    /// The server's version, or what went wrong asking for it.
    pub fn describe(self, url: &str) -> String {
        use diesel::prelude::*;
        diesel::define_sql_function!(fn version() -> Text);
        diesel::define_sql_function!(fn sqlite_version() -> Text);
        let version = match self {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite { .. } => SqliteConnection::establish(url)
                .map_err(|e| e.to_string())
                .and_then(|mut c| {
                    diesel::select(sqlite_version())
                        .get_result::<String>(&mut c)
                        .map_err(|e| e.to_string())
                })
                .map(|v| format!("SQLite {v}")),
            #[cfg(feature = "postgres")]
            Backend::Postgres => PgConnection::establish(url)
                .map_err(|e| e.to_string())
                .and_then(|mut c| {
                    diesel::select(version())
                        .get_result::<String>(&mut c)
                        .map_err(|e| e.to_string())
                }),
            #[cfg(feature = "mysql")]
            Backend::Mysql => MysqlConnection::establish(url)
                .map_err(|e| e.to_string())
                .and_then(|mut c| {
                    diesel::select(version())
                        .get_result::<String>(&mut c)
                        .map_err(|e| e.to_string())
                }),
            #[allow(unreachable_patterns)]
            other => Err(other.not_built()),
        };
        version.unwrap_or_else(|e| format!("version unknown: {e}"))
    }

    pub fn run_w1(self, settings: &Settings, report: &mut Report) -> Outcome {
        dispatch!(self, w1_uncontended, settings, report)
    }

    #[cfg(feature = "tracing")]
    pub fn run_w1_telemetry(self, settings: &Settings, report: &mut Report) -> Outcome {
        dispatch!(self, w1_uncontended, run_telemetry, settings, report)
    }

    /// Without the library's `tracing` reports there is nothing to listen to.
    #[cfg(not(feature = "tracing"))]
    pub fn run_w1_telemetry(self, _: &Settings, _: &mut Report) -> Outcome {
        eprintln!("W1-telemetry skipped: built without the `tracing` feature");
        Ok(())
    }

    pub fn run_w1_async(self, settings: &Settings, report: &mut Report) -> Outcome {
        dispatch!(self, w1_uncontended, run_async, settings, report)
    }

    pub fn run_w2_async(self, settings: &Settings, report: &mut Report) -> Outcome {
        dispatch!(self, w2_hot_row, run_async, settings, report)
    }

    pub fn run_w3_async(self, settings: &Settings, report: &mut Report) -> Outcome {
        dispatch!(self, w3_cancel_vs_ship, run_async, settings, report)
    }

    pub fn run_w2(self, settings: &Settings, report: &mut Report) -> Outcome {
        dispatch!(self, w2_hot_row, settings, report)
    }

    pub fn run_w3(self, settings: &Settings, report: &mut Report) -> Outcome {
        dispatch!(self, w3_cancel_vs_ship, settings, report)
    }

    pub fn run_w4(self, settings: &Settings, report: &mut Report) -> Outcome {
        dispatch!(self, w4_locks, settings, report)
    }

    pub fn run_w5(self, settings: &Settings, report: &mut Report) -> Outcome {
        dispatch!(self, w5_batch, settings, report)
    }

    pub fn run_w6(self, settings: &Settings, report: &mut Report) -> Outcome {
        dispatch!(self, w6_task_claiming, settings, report)
    }

    pub fn run_w7(self, settings: &Settings, report: &mut Report) -> Outcome {
        dispatch!(self, w7_insert_upsert, settings, report)
    }

    /// Removes the temporary SQLite file (and its WAL files) a run created.
    pub fn clean_up(self, url: &str) {
        if self == (Backend::Sqlite { temporary: true }) {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{url}{suffix}"));
            }
        }
    }
}

/// A diesel-async connection to `url` made on `runtime`; SQLite's waits for the write lock
/// as the blocking pools' connections do.
pub fn connect_async<A>(
    url: &str,
    sqlite: bool,
    runtime: &tokio::runtime::Runtime,
) -> Result<A, Box<dyn Error>>
where
    A: diesel_async::AsyncConnection,
{
    runtime.block_on(async {
        let mut conn = A::establish(url).await?;
        if sqlite {
            conn.batch_execute("PRAGMA busy_timeout = 60000").await?;
        }
        Ok(conn)
    })
}
