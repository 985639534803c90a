//! The tables diesel-occ itself needs: `occ_versions` (version rows guarding business
//! operations, [`guarded_operation`](crate::guarded_operation)), and those of later features.
//!
//! Run them with [`run`] (diesel's migration harness: each is applied once and recorded in
//! `__diesel_schema_migrations`, beside your own migrations), or embed them yourself from
//! [`MIGRATIONS`](LibraryMigrations::MIGRATIONS), or apply the SQL files under
//! `migrations/diesel_occ/<backend>/` by hand or with the diesel CLI
//! (`diesel migration run --migration-dir ...`). Their versions start with
//! `2026-11-22-9000`, out of the way of application migrations.

use diesel::backend::Backend;
use diesel::migration::MigrationConnection;
use diesel::Connection;
use diesel_migrations::{EmbeddedMigrations, MigrationHarness};

use crate::error::Error;

/// A backend's copy of the library's migrations.
pub trait LibraryMigrations: Backend {
    /// The migrations, embedded at compile time.
    const MIGRATIONS: EmbeddedMigrations;
}

#[cfg(feature = "sqlite")]
impl LibraryMigrations for diesel::sqlite::Sqlite {
    const MIGRATIONS: EmbeddedMigrations =
        diesel_migrations::embed_migrations!("migrations/diesel_occ/sqlite");
}

#[cfg(feature = "postgres")]
impl LibraryMigrations for diesel::pg::Pg {
    const MIGRATIONS: EmbeddedMigrations =
        diesel_migrations::embed_migrations!("migrations/diesel_occ/postgres");
}

#[cfg(feature = "mysql")]
impl LibraryMigrations for diesel::mysql::Mysql {
    const MIGRATIONS: EmbeddedMigrations =
        diesel_migrations::embed_migrations!("migrations/diesel_occ/mysql");
}

/// Applies the library's migrations that `conn`'s database does not have yet.
pub fn run<C>(conn: &mut C) -> Result<(), Error>
where
    C: Connection + MigrationConnection + MigrationHarness<C::Backend>,
    C::Backend: LibraryMigrations,
{
    conn.run_pending_migrations(<C::Backend as LibraryMigrations>::MIGRATIONS)
        .map(drop)
        .map_err(Error::Migration)
}

/// Applies the library's migrations that the database of the diesel-async connection
/// `conn` does not have yet (features `async` and `migrations`), without blocking the
/// runtime and on either of tokio's runtimes: on PostgreSQL each migration in a
/// transaction of its own, on MySQL / MariaDB each statement as it comes (their DDL
/// commits by itself), on SQLite through [`run`] on the connection's own thread. Each is
/// recorded in `__diesel_schema_migrations` as [`run`] records it, so either finds what
/// the other applied. A pooled connection is passed as `&mut *conn`.
#[cfg(feature = "async")]
pub async fn run_async<C: AsyncMigrations>(conn: &mut C) -> Result<(), Error> {
    conn.run_library_migrations().await
}

/// A diesel-async connection [`run_async`] applies the library's migrations on.
#[cfg(feature = "async")]
#[diagnostic::on_unimplemented(
    message = "diesel-occ cannot run its migrations on `{Self}`",
    note = "pass a diesel-async connection (`AsyncPgConnection`, `AsyncMysqlConnection`, `SyncConnectionWrapper<SqliteConnection>`); a pool's connection as `&mut *conn`"
)]
pub trait AsyncMigrations: Send {
    /// Applies the pending migrations; [`run_async`] calls it.
    #[doc(hidden)]
    fn run_library_migrations(
        &mut self,
    ) -> impl std::future::Future<Output = Result<(), Error>> + Send;
}

#[cfg(all(feature = "async", feature = "sqlite"))]
impl AsyncMigrations
    for diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>
{
    async fn run_library_migrations(&mut self) -> Result<(), Error> {
        // diesel's own harness, on the thread the connection lives on.
        self.spawn_blocking(|conn| Ok(run(conn)))
            .await
            .map_err(|e| Error::Migration(Box::new(e)))?
    }
}

/// The table diesel's harness records applied migrations in, as it creates it.
#[cfg(all(feature = "async", any(feature = "postgres", feature = "async-mysql")))]
const MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS __diesel_schema_migrations (
       version VARCHAR(50) PRIMARY KEY NOT NULL,
       run_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP
)";

/// A migration applied, as `__diesel_schema_migrations` holds it.
#[cfg(all(feature = "async", any(feature = "postgres", feature = "async-mysql")))]
#[derive(diesel::QueryableByName)]
struct Applied {
    #[diesel(sql_type = diesel::sql_types::Text)]
    version: String,
}

/// The `up.sql` of each of a backend's migrations, by folder name: the async connections
/// of PostgreSQL and MySQL cannot run diesel's blocking harness, so they send the same
/// files themselves (a test checks the list against the embedded migrations).
#[cfg(all(feature = "async", any(feature = "postgres", feature = "async-mysql")))]
macro_rules! up_sql {
    ($backend:literal: $($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("../migrations/diesel_occ/", $backend, "/", $name, "/up.sql")))),*]
    };
}

#[cfg(all(feature = "async", feature = "postgres"))]
const POSTGRES_UP: &[(&str, &str)] = up_sql!("postgres":
    "2026-11-22-900001_occ_versions",
    "2026-11-22-900002_occ_transitions",
    "2026-11-22-900003_occ_locks",
    "2026-11-23-900004_occ_fence_source",
    "2026-11-26-900005_occ_fence_epoch",
    "2026-11-28-900006_occ_locks_instants",
);

#[cfg(all(feature = "async", feature = "async-mysql"))]
const MYSQL_UP: &[(&str, &str)] = up_sql!("mysql":
    "2026-11-22-900001_occ_versions",
    "2026-11-22-900002_occ_transitions",
    "2026-11-22-900003_occ_locks",
    "2026-11-23-900004_occ_fence_source",
);

/// The migrations of backend `DB` not yet in `applied`, in order: version, folder name
/// and `up.sql`.
#[cfg(all(feature = "async", any(feature = "postgres", feature = "async-mysql")))]
fn pending<DB: LibraryMigrations>(
    applied: &[Applied],
    up: &'static [(&'static str, &'static str)],
) -> Result<Vec<(String, &'static str)>, Error> {
    use diesel::migration::MigrationSource;
    let mut migrations =
        MigrationSource::<DB>::migrations(&DB::MIGRATIONS).map_err(Error::Migration)?;
    migrations.sort_by_key(|m| m.name().version().to_string());
    migrations
        .iter()
        .map(|m| (m.name().version().to_string(), m.name().to_string()))
        .filter(|(version, _)| !applied.iter().any(|a| &a.version == version))
        .map(|(version, name)| {
            let sql = up
                .iter()
                .find(|(folder, _)| *folder == name)
                .map(|(_, sql)| *sql);
            sql.map(|sql| (version, sql))
                .ok_or_else(|| Error::Migration(format!("no SQL for migration {name}").into()))
        })
        .collect()
}

/// The key of the advisory lock under which PostgreSQL applies each migration: instances
/// that start together apply each one once, the later ones finding it recorded.
#[cfg(all(feature = "async", feature = "postgres"))]
const POSTGRES_MIGRATION_LOCK: &str = "SELECT pg_advisory_xact_lock(7227136116900001)";

#[cfg(all(feature = "async", feature = "postgres"))]
impl AsyncMigrations for diesel_async::AsyncPgConnection {
    async fn run_library_migrations(&mut self) -> Result<(), Error> {
        use diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};
        // Two sessions creating the same table at once collide even with `IF NOT EXISTS`
        // (on the type of its rows): created under the lock too.
        let create = async |conn: &mut Self| {
            conn.batch_execute(POSTGRES_MIGRATION_LOCK).await?;
            conn.batch_execute(MIGRATIONS_TABLE).await
        };
        self.transaction(create).await.map_err(failed)?;
        let applied: Vec<Applied> =
            diesel::sql_query("SELECT version FROM __diesel_schema_migrations")
                .load(self)
                .await
                .map_err(failed)?;
        for (version, sql) in pending::<diesel::pg::Pg>(&applied, POSTGRES_UP)? {
            // One transaction per migration, as diesel's harness: DDL is transactional
            // here. Under the lock, a migration another instance applied meanwhile is
            // skipped.
            let apply = async |conn: &mut Self| {
                conn.batch_execute(POSTGRES_MIGRATION_LOCK).await?;
                let done: Vec<Applied> = diesel::sql_query(
                    "SELECT version FROM __diesel_schema_migrations WHERE version = $1",
                )
                .bind::<diesel::sql_types::Text, _>(&version)
                .load(conn)
                .await?;
                if done.is_empty() {
                    conn.batch_execute(sql).await?;
                    diesel::sql_query(
                        "INSERT INTO __diesel_schema_migrations (version) VALUES ($1)",
                    )
                    .bind::<diesel::sql_types::Text, _>(&version)
                    .execute(conn)
                    .await?;
                }
                Ok::<_, diesel::result::Error>(())
            };
            self.transaction(apply).await.map_err(failed)?;
        }
        Ok(())
    }
}

#[cfg(all(feature = "async", feature = "async-mysql"))]
impl AsyncMigrations for diesel_async::AsyncMysqlConnection {
    async fn run_library_migrations(&mut self) -> Result<(), Error> {
        use diesel_async::SimpleAsyncConnection;
        // MySQL's DDL commits by itself, so there is no transaction to hold a lock in:
        // the whole run holds a named lock of the session's instead (instances that start
        // together apply each migration once), released however the run ends.
        self.batch_execute("DO GET_LOCK('diesel_occ_migrations', 600)")
            .await
            .map_err(failed)?;
        let ran = mysql_migrations(self).await;
        let released = self
            .batch_execute("DO RELEASE_LOCK('diesel_occ_migrations')")
            .await
            .map_err(failed);
        ran.and(released)
    }
}

/// The MySQL migrations not yet recorded, each applied then recorded, under the named lock.
#[cfg(all(feature = "async", feature = "async-mysql"))]
async fn mysql_migrations(conn: &mut diesel_async::AsyncMysqlConnection) -> Result<(), Error> {
    use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
    conn.batch_execute(MIGRATIONS_TABLE).await.map_err(failed)?;
    let applied: Vec<Applied> = diesel::sql_query("SELECT version FROM __diesel_schema_migrations")
        .load(conn)
        .await
        .map_err(failed)?;
    for (version, sql) in pending::<diesel::mysql::Mysql>(&applied, MYSQL_UP)? {
        conn.batch_execute(sql).await.map_err(failed)?;
        diesel::sql_query("INSERT INTO __diesel_schema_migrations (version) VALUES (?)")
            .bind::<diesel::sql_types::Text, _>(&version)
            .execute(conn)
            .await
            .map_err(failed)?;
    }
    Ok(())
}

/// A statement of a migration that failed.
#[cfg(all(feature = "async", any(feature = "postgres", feature = "async-mysql")))]
fn failed(error: diesel::result::Error) -> Error {
    Error::Migration(Box::new(error))
}

#[cfg(all(
    test,
    feature = "async",
    any(feature = "postgres", feature = "async-mysql")
))]
mod tests {
    use super::*;

    /// Every embedded migration has its `up.sql` in the async list, in version order.
    fn listed_in_full<DB: LibraryMigrations>(up: &'static [(&'static str, &'static str)]) {
        use diesel::migration::MigrationSource;
        let embedded = MigrationSource::<DB>::migrations(&DB::MIGRATIONS).unwrap();
        let all = pending::<DB>(&[], up).unwrap();
        assert_eq!(all.len(), embedded.len());
        assert_eq!(all.len(), up.len(), "no folder listed twice or left over");
        assert!(all.windows(2).all(|w| w[0].0 < w[1].0));
        let first = Applied {
            version: all[0].0.clone(),
        };
        assert_eq!(pending::<DB>(&[first], up).unwrap().len(), all.len() - 1);
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn the_async_list_holds_every_postgres_migration() {
        listed_in_full::<diesel::pg::Pg>(POSTGRES_UP);
    }

    #[cfg(feature = "async-mysql")]
    #[test]
    fn the_async_list_holds_every_mysql_migration() {
        listed_in_full::<diesel::mysql::Mysql>(MYSQL_UP);
    }
}
