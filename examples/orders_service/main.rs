//! An orders API on axum over diesel-occ: ETags and `If-Match` on every write, JSON
//! extension patches that never lose a key, ship and cancel as guarded transitions, and a
//! background job that runs on one instance only (leader election on the lock table).
//! See `app.rs` for the routes.
//!
//! Run (SQLite file by default; PostgreSQL or MySQL by URL):
//!
//! ```sh
//! cargo run --example orders_service --all-features
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/diesel_occ_test \
//!     cargo run --example orders_service --all-features
//! curl -i -X POST localhost:3000/orders/1
//! curl -i -X PATCH localhost:3000/orders/1 -H 'content-type: application/merge-patch+json' -d '{"gift": true}'
//! ```
//!
//! `RUST_LOG=info` shows conflicts, retries and leadership changes.

mod app;

use std::time::Duration;

use diesel_occ::Locks;
use diesel_occ::PoolConfig;
use diesel_occ::{Candidate, ElectionTiming, Held};

type Outcome = Result<(), Box<dyn std::error::Error + Send + Sync>>;

#[tokio::main]
async fn main() -> Outcome {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "orders-service.sqlite3".into());
    let address = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let config = PoolConfig::default();
    let (router, locks) = if url.starts_with("postgres") {
        let pool = diesel_occ::postgres_pool(&url, &config)?;
        app::postgres::setup(&pool)?;
        (
            app::postgres::router(pool.clone()),
            Job::Postgres(Locks::new(pool)),
        )
    } else if url.starts_with("mysql") {
        let pool = diesel_occ::mysql_pool(&url, &config)?;
        app::mysql::setup(&pool)?;
        (
            app::mysql::router(pool.clone()),
            Job::Mysql(Locks::new(pool)),
        )
    } else {
        let pool = diesel_occ::sqlite_pool(&url, &config)?;
        app::sqlite::setup(&pool)?;
        (
            app::sqlite::router(pool.clone()),
            Job::Sqlite(Locks::new(pool)),
        )
    };
    let candidate = locks.campaign()?;

    let listener = tokio::net::TcpListener::bind(&address).await?;
    tracing::info!(%address, database = %url, "serving");
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    // Stops the job, waits for it, then frees the lock for another instance.
    for event in candidate.stop() {
        tracing::info!(?event, "leadership");
    }
    Ok(())
}

/// The lock table of the chosen backend.
enum Job {
    Sqlite(Locks<diesel_occ::SqlitePool>),
    Postgres(Locks<diesel_occ::PgPool>),
    Mysql(Locks<diesel_occ::MysqlPool>),
}

impl Job {
    /// Runs for leadership of the nightly job under this process's id; the job runs while
    /// this instance leads.
    fn campaign(self) -> Result<Candidate, diesel_occ::Error> {
        let label = format!("orders-service pid {}", std::process::id());
        let timing = ElectionTiming::default();
        match self {
            Job::Sqlite(locks) => Candidate::start_with_job(
                locks,
                "orders-service",
                "nightly",
                &label,
                timing,
                nightly_job,
            ),
            Job::Postgres(locks) => Candidate::start_with_job(
                locks,
                "orders-service",
                "nightly",
                &label,
                timing,
                nightly_job,
            ),
            Job::Mysql(locks) => Candidate::start_with_job(
                locks,
                "orders-service",
                "nightly",
                &label,
                timing,
                nightly_job,
            ),
        }
    }
}

/// The background job, on the leader only: a tick every 5 s while this instance leads.
/// Its sleep ends at once when the lead is lost or the service shuts down; the lock is
/// freed only after it returned.
fn nightly_job(held: &Held) {
    tracing::info!(fence = held.fence(), "leading: the nightly job runs here");
    while held.sleep(Duration::from_secs(5)).is_ok() {
        tracing::info!(fence = held.fence(), "nightly job: tick");
    }
    if let Err(reason) = held.check() {
        tracing::warn!(%reason, "nightly job stopped");
    }
}
