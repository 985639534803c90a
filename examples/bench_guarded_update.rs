//! Measures what the version guard costs next to the same update written by hand.
//!
//! Per backend, four strategies update one row in turn, interleaved in rounds so that
//! machine noise hits all of them alike:
//! - `hand-written`: `diesel::update(..filter(id).filter(version)).set((note, version + 1))`
//!   and a check that one row matched; what a careful diesel user writes;
//! - `guarded_update`: the same statement through diesel-occ;
//! - `hand-written miss` / `guarded miss`: a stale write that matches no row; the library
//!   also reads the row back to say why (the price of a typed `Conflict`);
//! - `request, ping pool` / `request, occ pool`: a web request's worth of work, one
//!   worker: check a connection out, load the row, guarded update, check it back in.
//!   The first pool is r2d2 with diesel's manager and `test_on_check_out` (a `SELECT 1`
//!   per checkout); the second is diesel-occ's, which checks only connections idle for
//!   longer than 500 ms. Their ratio is the price of that round trip.
//!
//! It prints the median time per operation over the rounds and the ratio to the
//! hand-written update. Server backends run when `PG_DATABASE_URL` / `MYSQL_DATABASE_URL`
//! are set (as `scripts/test.sh` sets them).
//!
//! Run: `cargo run --release --all-features --example bench_guarded_update`

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::models::Order;
use common::schema::orders;
use diesel::prelude::*;
use diesel_occ::GuardedWrite;

const ROUNDS: usize = 9;
const OPS_PER_ROUND: usize = 300;

/// Median per-operation time of each strategy, in microseconds.
fn report(backend: &str, samples: &[(&str, Vec<Duration>)]) {
    let median = |d: &[Duration]| {
        let mut micros: Vec<f64> = d
            .iter()
            .map(|t| t.as_secs_f64() * 1e6 / OPS_PER_ROUND as f64)
            .collect();
        micros.sort_by(f64::total_cmp);
        micros[micros.len() / 2]
    };
    let base = median(&samples[0].1);
    for (name, times) in samples {
        let m = median(times);
        println!("{backend:<9} {name:<20} {m:>10.1} {:>8.2}", m / base);
    }
}

/// r2d2 with diesel's own manager, checking every connection on checkout.
fn pinging_pool<C: diesel::r2d2::R2D2Connection + 'static>(
    url: &str,
    customizer: Option<Box<dyn diesel::r2d2::CustomizeConnection<C, diesel::r2d2::Error>>>,
) -> diesel::r2d2::Pool<diesel::r2d2::ConnectionManager<C>> {
    let builder = diesel::r2d2::Pool::builder()
        .max_size(2)
        .min_idle(Some(1))
        .test_on_check_out(true);
    let builder = match customizer {
        Some(c) => builder.connection_customizer(c),
        None => builder,
    };
    builder
        .build(diesel::r2d2::ConnectionManager::new(url))
        .unwrap()
}

macro_rules! bench {
    ($backend:literal, $conn:ty, $db:expr, $customizer:expr) => {{
        let db = $db;
        let pinging = pinging_pool::<$conn>(&db.url, $customizer);
        let occ_pool = db.pool_with(&diesel_occ::PoolConfig {
            max_size: 2,
            ..common::pool_config()
        });
        let conn = &mut db.conn();
        diesel::insert_into(orders::table)
            .values(&Order::new(1, "bench"))
            .execute(conn)
            .unwrap();
        let mut order: Order = orders::table
            .find(1)
            .select(Order::as_select())
            .first(conn)
            .unwrap();
        let stale = order.clone();
        let mut samples: Vec<(&str, Vec<Duration>)> = vec![
            ("hand-written", vec![]),
            ("guarded_update", vec![]),
            ("hand-written miss", vec![]),
            ("guarded miss", vec![]),
            ("request, ping pool", vec![]),
            ("request, occ pool", vec![]),
        ];
        for round in 0..ROUNDS {
            let start = Instant::now();
            for i in 0..OPS_PER_ROUND {
                let rows = diesel::update(
                    orders::table
                        .filter(orders::id.eq(order.id))
                        .filter(orders::version.eq(order.version)),
                )
                .set((
                    orders::note.eq(format!("h{round}-{i}")),
                    orders::version.eq(order.version + 1),
                ))
                .execute(conn)
                .unwrap();
                assert_eq!(rows, 1);
                order.version += 1;
            }
            samples[0].1.push(start.elapsed());

            let start = Instant::now();
            for i in 0..OPS_PER_ROUND {
                order.version = order
                    .guarded_update(conn, orders::note.eq(format!("g{round}-{i}")))
                    .unwrap();
            }
            samples[1].1.push(start.elapsed());

            let start = Instant::now();
            for _ in 0..OPS_PER_ROUND {
                let rows = diesel::update(
                    orders::table
                        .filter(orders::id.eq(stale.id))
                        .filter(orders::version.eq(stale.version)),
                )
                .set((
                    orders::note.eq("stale"),
                    orders::version.eq(stale.version + 1),
                ))
                .execute(conn)
                .unwrap();
                assert_eq!(rows, 0);
            }
            samples[2].1.push(start.elapsed());

            let start = Instant::now();
            for _ in 0..OPS_PER_ROUND {
                let err = stale
                    .guarded_update(conn, orders::note.eq("stale"))
                    .unwrap_err();
                assert!(err.as_conflict().is_some());
            }
            samples[3].1.push(start.elapsed());

            let start = Instant::now();
            for i in 0..OPS_PER_ROUND {
                let mut pooled = pinging.get().unwrap();
                let row: Order = orders::table
                    .find(1)
                    .select(Order::as_select())
                    .first(&mut pooled)
                    .unwrap();
                row.guarded_update(&mut pooled, orders::note.eq(format!("p{round}-{i}")))
                    .unwrap();
            }
            samples[4].1.push(start.elapsed());

            let start = Instant::now();
            for i in 0..OPS_PER_ROUND {
                let mut pooled = occ_pool.get().unwrap();
                let row: Order = orders::table
                    .find(1)
                    .select(Order::as_select())
                    .first(&mut pooled)
                    .unwrap();
                row.guarded_update(&mut pooled, orders::note.eq(format!("o{round}-{i}")))
                    .unwrap();
            }
            samples[5].1.push(start.elapsed());
            order = orders::table
                .find(1)
                .select(Order::as_select())
                .first(conn)
                .unwrap();
        }
        report($backend, &samples);
    }};
}

fn main() {
    println!(
        "{ROUNDS} rounds x {OPS_PER_ROUND} updates of one row per strategy; median per operation\n"
    );
    println!(
        "{:<9} {:<20} {:>10} {:>8}",
        "backend", "strategy", "us/op", "ratio"
    );
    #[cfg(feature = "sqlite")]
    bench!(
        "sqlite",
        diesel::SqliteConnection,
        common::sqlite().unwrap(),
        Some(Box::new(diesel_occ::SqliteSettings {
            busy_timeout: Duration::from_secs(5),
        }))
    );
    #[cfg(feature = "postgres")]
    if let Some(db) = common::postgres() {
        bench!("postgres", diesel::PgConnection, db, None);
    }
    #[cfg(feature = "mysql")]
    if let Some(db) = common::mysql() {
        bench!("mysql", diesel::MysqlConnection, db, None);
    }
}
