//! An orders API on axum over diesel-occ's async API (diesel-async connections from a bb8
//! or deadpool pool): ETags and `If-Match` on every write, JSON extension patches that never lose a
//! key, ship and cancel as guarded transitions, and a background job that runs on one
//! instance only (leader election on the lock table, as tokio tasks). See `app.rs` for the
//! routes.
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
//! What the library reports is printed by `tracing-subscriber`: `RUST_LOG=info` (the
//! default) shows leadership changes and what went wrong (a retry loop that gave up, a
//! lost lock); `RUST_LOG=info,diesel_occ=debug` shows every conflict, retry and claim,
//! each inside the span of its call (operation, table, key). `GET /metrics` answers the
//! library's counters and histograms in Prometheus' text format:
//!
//! ```sh
//! curl -s localhost:3000/metrics | grep diesel_occ_conflicts_total
//! ```

// `deadpool_pool` is not called here: the end-to-end tests serve the routes from it too.
#[allow(dead_code)]
mod app;

use diesel_occ::ElectionTiming;

type Outcome = Result<(), app::SetupError>;

#[tokio::main]
async fn main() -> Outcome {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    // The recorder's histograms drain their samples only at upkeep (or a scrape).
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "orders-service.sqlite3".into());
    let address = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let label = format!("orders-service pid {}", std::process::id());
    let timing = ElectionTiming::default();
    // bb8 here; `deadpool_pool(&url)?` serves the same routes from a deadpool pool.
    let (router, candidate) = if url.starts_with("postgres") {
        let pool = app::postgres::bb8_pool(&url).await?;
        app::postgres::setup(&pool).await?;
        let candidate = app::postgres::campaign(pool.clone(), &label, timing)?;
        (app::postgres::router(pool), candidate)
    } else if url.starts_with("mysql") {
        let pool = app::mysql::bb8_pool(&url).await?;
        app::mysql::setup(&pool).await?;
        let candidate = app::mysql::campaign(pool.clone(), &label, timing)?;
        (app::mysql::router(pool), candidate)
    } else {
        let pool = app::sqlite::bb8_pool(&url).await?;
        app::sqlite::setup(&pool).await?;
        let candidate = app::sqlite::campaign(pool.clone(), &label, timing)?;
        (app::sqlite::router(pool), candidate)
    };

    let router = router.route(
        "/metrics",
        axum::routing::get(move || std::future::ready(metrics.render())),
    );
    let listener = tokio::net::TcpListener::bind(&address).await?;
    tracing::info!(%address, database = %url, "serving");
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    // Cancels the job, waits for it, then frees the lock for another instance (the
    // library reports the step down).
    candidate.stop().await;
    Ok(())
}
