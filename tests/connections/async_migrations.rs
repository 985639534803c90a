//! The library's migrations on a diesel-async connection (`migrations::run_async`), on a
//! fresh schema of every backend, driven from tokio's current-thread runtime: they create
//! the tables, record what they applied as diesel's harness records it (so that either
//! finds nothing left to do after the other), do nothing the second time, and, run by
//! two instances at once, apply each migration once.

#![cfg(all(
    feature = "async",
    feature = "migrations",
    any(not(feature = "mysql"), feature = "async-mysql")
))]

use crate::common;

use diesel::connection::SimpleConnection;
use diesel::migration::MigrationSource;
use diesel::prelude::*;
use diesel_async::AsyncConnection;
use diesel_migrations::MigrationHarness;
use diesel_occ::migrations::{run_async, LibraryMigrations};

/// A backend of the test: a fresh, empty namespace, and both kinds of connection to it.
trait Fresh:
    Connection<Backend: LibraryMigrations>
    + MigrationHarness<Self::Backend>
    + diesel::migration::MigrationConnection
    + Sized
{
    type Async: AsyncConnection + diesel_occ::migrations::AsyncMigrations;
    /// The URL of a new empty namespace (a schema, a database, a file), or `None` to skip.
    fn fresh() -> Option<String>;
    /// Drops the namespace of `url` made by [`fresh`](Self::fresh).
    fn drop_fresh(url: &str);
}

/// tokio's current-thread runtime: `run_async` must not need the multi-thread one.
fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The versions recorded in `url`'s `__diesel_schema_migrations`.
fn recorded<C: Fresh>(url: &str) -> usize {
    let conn = &mut C::establish(url).unwrap();
    conn.applied_migrations().unwrap().len()
}

/// How many migrations the library has on backend `C`.
fn embedded<C: Fresh>() -> usize {
    MigrationSource::<C::Backend>::migrations(&<C::Backend as LibraryMigrations>::MIGRATIONS)
        .unwrap()
        .len()
}

/// `run_async` on a fresh namespace: the tables exist, every migration is recorded once,
/// the blocking harness finds nothing pending, and a second run does nothing.
fn the_async_run_creates_and_records_every_migration<C: Fresh>() {
    let Some(url) = C::fresh() else { return };
    let runtime = current_thread();
    runtime.block_on(async {
        let mut conn = C::Async::establish(&url).await.unwrap();
        run_async(&mut conn).await.unwrap();
        run_async(&mut conn).await.unwrap();
    });
    assert_eq!(recorded::<C>(&url), embedded::<C>());
    let conn = &mut C::establish(&url).unwrap();
    assert!(!conn
        .has_pending_migration(<C::Backend as LibraryMigrations>::MIGRATIONS)
        .unwrap());
    conn.batch_execute("SELECT COUNT(*) FROM occ_locks")
        .unwrap();
    diesel_occ::migrations::run(conn).unwrap();
    assert_eq!(recorded::<C>(&url), embedded::<C>());
    C::drop_fresh(&url);
}

/// The blocking run first: the async one then finds everything applied.
fn after_the_blocking_run_the_async_one_does_nothing<C: Fresh>() {
    let Some(url) = C::fresh() else { return };
    diesel_occ::migrations::run(&mut C::establish(&url).unwrap()).unwrap();
    current_thread().block_on(async {
        let mut conn = C::Async::establish(&url).await.unwrap();
        run_async(&mut conn).await.unwrap();
    });
    assert_eq!(recorded::<C>(&url), embedded::<C>());
    C::drop_fresh(&url);
}

/// Two instances starting at once on a fresh server database: both runs succeed, and each
/// migration is applied and recorded once.
fn two_instances_at_once_apply_each_migration_once<C: Fresh>() {
    let Some(url) = C::fresh() else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(2));
        let runs: Vec<_> = (0..2)
            .map(|_| {
                let (url, start) = (url.clone(), start.clone());
                tokio::spawn(async move {
                    let mut conn = C::Async::establish(&url).await.unwrap();
                    start.wait().await;
                    run_async(&mut conn).await
                })
            })
            .collect();
        for run in runs {
            run.await.unwrap().unwrap();
        }
    });
    assert_eq!(recorded::<C>(&url), embedded::<C>());
    C::drop_fresh(&url);
}

#[cfg(feature = "sqlite")]
impl Fresh for diesel::SqliteConnection {
    type Async =
        diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>;
    fn fresh() -> Option<String> {
        let path = std::env::temp_dir().join(format!("{}.sqlite3", common::unique_name()));
        Some(path.to_str().unwrap().to_owned())
    }
    fn drop_fresh(url: &str) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{url}{suffix}"));
        }
    }
}

#[cfg(feature = "postgres")]
impl Fresh for diesel::PgConnection {
    type Async = diesel_async::AsyncPgConnection;
    fn fresh() -> Option<String> {
        let Some(base) = std::env::var("PG_DATABASE_URL")
            .ok()
            .filter(|url| !url.is_empty())
        else {
            // Skipped as every server test is, or a failure where servers are required.
            assert!(common::postgres().is_none());
            return None;
        };
        let schema = common::unique_name();
        diesel::PgConnection::establish(&base)
            .unwrap()
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .unwrap();
        let separator = if base.contains('?') { '&' } else { '?' };
        Some(format!("{base}{separator}options=-csearch_path%3D{schema}"))
    }
    fn drop_fresh(url: &str) {
        let (base, schema) = url.rsplit_once("search_path%3D").unwrap();
        let base = base
            .trim_end_matches("options=-c")
            .trim_end_matches(['?', '&']);
        let admin = &mut diesel::PgConnection::establish(base).unwrap();
        admin
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .unwrap();
    }
}

#[cfg(feature = "mysql")]
impl Fresh for diesel::MysqlConnection {
    type Async = diesel_async::AsyncMysqlConnection;
    fn fresh() -> Option<String> {
        let Some(base) = std::env::var("MYSQL_DATABASE_URL")
            .ok()
            .filter(|url| !url.is_empty())
        else {
            // Skipped as every server test is, or a failure where servers are required.
            assert!(common::mysql().is_none());
            return None;
        };
        let database = common::unique_name();
        diesel::MysqlConnection::establish(&base)
            .unwrap()
            .batch_execute(&format!("CREATE DATABASE {database}"))
            .unwrap();
        Some(common::with_database(&base, &database))
    }
    fn drop_fresh(url: &str) {
        let database = url.rsplit('/').next().unwrap().split('?').next().unwrap();
        let admin = &mut diesel::MysqlConnection::establish(url).unwrap();
        admin
            .batch_execute(&format!("DROP DATABASE {database}"))
            .unwrap();
    }
}

macro_rules! on_backend {
    ($($backend:ident: $conn:ty),*) => {$(
        mod $backend {
            #[test]
            fn the_async_run_creates_and_records_every_migration() {
                super::the_async_run_creates_and_records_every_migration::<$conn>();
            }
            #[test]
            fn after_the_blocking_run_the_async_one_does_nothing() {
                super::after_the_blocking_run_the_async_one_does_nothing::<$conn>();
            }
        }
    )*};
}

#[cfg(feature = "sqlite")]
on_backend!(sqlite: diesel::SqliteConnection);
#[cfg(feature = "postgres")]
on_backend!(postgres: diesel::PgConnection);
#[cfg(feature = "mysql")]
on_backend!(mysql: diesel::MysqlConnection);

// Two instances at once on the servers, whose runs take a lock; SQLite's run is diesel's
// own harness on one file, whose writers take turns but whose check of what is applied
// is not under the write lock (as with the blocking `run`).
#[cfg(feature = "postgres")]
#[test]
fn postgres_two_instances_at_once_apply_each_migration_once() {
    two_instances_at_once_apply_each_migration_once::<diesel::PgConnection>();
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_two_instances_at_once_apply_each_migration_once() {
    two_instances_at_once_apply_each_migration_once::<diesel::MysqlConnection>();
}
