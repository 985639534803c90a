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
