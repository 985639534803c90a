//! W3, cancel vs ship: for each order a customer's cancel and an operator's ship are
//! released at the same moment on two connections. Exactly one must win, and the loser
//! must learn the state the winner left; any other end is a violation.
//!
//! Strategies: the library's key-only guarded transition (one statement, the allowed
//! source states in its WHERE; a miss reads the row back to say why), and the same by
//! hand: a conditional UPDATE, and a SELECT of the state when it matched no row.

use std::sync::Barrier;
use std::time::Instant;

use diesel::prelude::*;
use diesel_occ::{no_extra, GuardedStatusTransition};
use diesel_occ::{Error, Guarded, RetryPolicy, Status};

use crate::backend::{per_backend, recreate};
use crate::measure::Latencies;
use crate::report::{Record, Report};
use crate::Settings;

const STRATEGIES: [&str; 2] = [
    "hand-written conditional UPDATE + read on a miss",
    "library transition_by_key",
];

/// What one racer saw: the state it won with, or the state it was told the order is in.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Won,
    Lost { current: String },
    Failed(String),
}

impl Outcome {
    /// What the library's transition answered.
    fn of<T>(moved: Result<T, Error>) -> Outcome {
        match moved {
            Ok(_) => Outcome::Won,
            Err(Error::InvalidTransition(t)) => Outcome::Lost {
                current: t.from.to_string(),
            },
            Err(e) => Outcome::Failed(e.to_string()),
        }
    }
}

/// Whether one race ended right: one winner, the loser told the winner's state, the
/// order in that state at version 1.
fn violated(cancel: &Outcome, ship: &Outcome, stored: &str, version: i64) -> bool {
    let right = match (cancel, ship) {
        (Outcome::Won, Outcome::Lost { current }) => {
            current == "cancelled" && stored == "cancelled"
        }
        (Outcome::Lost { current }, Outcome::Won) => current == "shipped" && stored == "shipped",
        _ => false,
    };
    !right || version != 1
}

per_backend! {
    diesel::table! {
        bench_orders (id) {
            id -> BigInt,
            status -> Text,
            version -> BigInt,
        }
    }

    /// The states of an order, and which may move to which.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Status)]
    pub enum OrderStatus {
        Valid,
        #[occ(from(Valid))]
        Shipped,
        #[occ(from(Valid))]
        Cancelled,
    }

    #[derive(Debug, Clone, Queryable, Selectable, Identifiable, Guarded)]
    #[diesel(table_name = bench_orders)]
    pub struct Order {
        pub id: i64,
        #[occ(status)]
        pub status: OrderStatus,
        #[occ(version)]
        pub version: i64,
    }

    fn move_by_hand(conn: &mut Conn, id: i64, to: &str) -> QueryResult<Outcome> {
        let matched = diesel::update(
            bench_orders::table
                .filter(bench_orders::id.eq(id))
                .filter(bench_orders::status.eq("valid")),
        )
        .set((bench_orders::status.eq(to), bench_orders::version.eq(bench_orders::version + 1)))
        .execute(conn)?;
        if matched == 1 {
            return Ok(Outcome::Won);
        }
        let current = bench_orders::table.find(id).select(bench_orders::status).first(conn)?;
        Ok(Outcome::Lost { current })
    }

    fn move_with_library(conn: &mut Conn, id: i64, to: OrderStatus) -> Outcome {
        Outcome::of(Order::transition_by_key(conn, &id, to, no_extra(), &RetryPolicy::default()))
    }

    pub fn run(settings: &Settings, report: &mut Report) -> Result<(), Box<dyn std::error::Error>> {
        report.section(
            "W3",
            "cancel vs ship, two racers per order",
            "races per second ÷ the hand-written strategy's",
        );
        let pool = pool(&settings.url, 3)?;
        let races = settings.races as i64;
        fresh_orders(&pool, races)?;
        let bar = report.progress("W3", 2);
        let mut base = None;
        for (s, strategy) in STRATEGIES.iter().enumerate() {
            bar.set_message(*strategy);
            let ids: Vec<i64> = (1..=races).map(|i| i + s as i64 * races).collect();
            let start = Barrier::new(2);
            let began = Instant::now();
            let results = std::thread::scope(|scope| {
                let racers: Vec<_> = ["cancelled", "shipped"]
                    .into_iter()
                    .map(|to| {
                        let (start, ids, pool) = (&start, &ids, &pool);
                        scope.spawn(move || -> Result<(Vec<Outcome>, Latencies), diesel_occ::Error> {
                            let mut conn = pool.get()?;
                            let mut latencies = Latencies::with_capacity(ids.len());
                            let target = if to == "cancelled" { OrderStatus::Cancelled } else { OrderStatus::Shipped };
                            let outcomes = ids
                                .iter()
                                .map(|&id| {
                                    start.wait();
                                    latencies.time(|| {
                                        if s == 0 {
                                            move_by_hand(&mut conn, id, to).unwrap_or_else(|e| Outcome::Failed(e.to_string()))
                                        } else {
                                            move_with_library(&mut conn, id, target)
                                        }
                                    })
                                })
                                .collect();
                            Ok((outcomes, latencies))
                        })
                    })
                    .collect();
                racers
                    .into_iter()
                    .map(|r| r.join().expect("a racer panicked"))
                    .collect::<Result<Vec<_>, diesel_occ::Error>>()
            })?;
            let elapsed = began.elapsed();

            let mut record = judged(&pool, "W3", strategy, races, &ids, elapsed, results)?;
            let races_per_s = record.ops_per_second();
            record = record.ratio(races_per_s / *base.get_or_insert(races_per_s));
            bar.inc(1);
            bar.suspend(|| report.record(record))?;
        }
        bar.finish_and_clear();
        Ok(())
    }

    /// The record of one strategy's races on orders `ids`, judged from the stored rows:
    /// violations (not exactly one winner, or a loser told another state), and the ends.
    fn judged(
        pool: &Pool,
        workload: &'static str,
        strategy: &str,
        races: i64,
        ids: &[i64],
        elapsed: std::time::Duration,
        results: Vec<(Vec<Outcome>, Latencies)>,
    ) -> Result<Record, Box<dyn std::error::Error>> {
        let conn = &mut pool.get()?;
        let stored: Vec<(i64, String, i64)> = bench_orders::table
            .filter(bench_orders::id.eq_any(ids))
            .order(bench_orders::id)
            .select((bench_orders::id, bench_orders::status, bench_orders::version))
            .load(conn)?;
        let (mut violations, mut cancelled, mut shipped) = (0, 0, 0);
        for (i, (_, status, version)) in stored.iter().enumerate() {
            let (cancel, ship) = (&results[0].0[i], &results[1].0[i]);
            violations += usize::from(violated(cancel, ship, status, *version));
            cancelled += usize::from(status == "cancelled");
            shipped += usize::from(status == "shipped");
        }
        let mut latencies = Latencies::default();
        for (_, l) in results {
            latencies.extend(l);
        }
        Ok(Record::new(workload, format!("{races} orders"), strategy)
            .ops(races as u64, elapsed)
            .latencies(&latencies)
            .with("violations", violations)
            .with("cancelled", cancelled)
            .with("shipped", shipped))
    }

    /// The table of `2 * races` valid orders: the first half for the first strategy.
    fn fresh_orders(pool: &Pool, races: i64) -> Result<(), Box<dyn std::error::Error>> {
        let conn = &mut pool.get()?;
        recreate(
            conn,
            "bench_orders",
            "id BIGINT PRIMARY KEY NOT NULL, status VARCHAR(16) NOT NULL, version BIGINT NOT NULL",
        )?;
        let rows: Vec<_> = (1..=races * 2)
            .map(|id| (bench_orders::id.eq(id), bench_orders::status.eq("valid"), bench_orders::version.eq(0_i64)))
            .collect();
        for chunk in rows.chunks(500) {
            diesel::insert_into(bench_orders::table).values(chunk).execute(conn)?;
        }
        Ok(())
    }

    async fn move_by_hand_async(conn: &mut AsyncConn, id: i64, to: &str) -> QueryResult<Outcome> {
        let update = diesel::update(
            bench_orders::table
                .filter(bench_orders::id.eq(id))
                .filter(bench_orders::status.eq("valid")),
        )
        .set((bench_orders::status.eq(to.to_string()), bench_orders::version.eq(bench_orders::version + 1)));
        if diesel_async::RunQueryDsl::execute(update, conn).await? == 1 {
            return Ok(Outcome::Won);
        }
        let current = diesel_async::RunQueryDsl::first(bench_orders::table.find(id).select(bench_orders::status), conn).await?;
        Ok(Outcome::Lost { current })
    }

    async fn move_with_library_async(conn: &mut AsyncConn, id: i64, to: OrderStatus) -> Outcome {
        use diesel_occ::asynchronous::AsyncGuardedTransition;
        Outcome::of(<Order as AsyncGuardedTransition>::transition_by_key(conn, &id, to, no_extra(), &RetryPolicy::default()).await)
    }

    /// W3 with the two racers as tokio tasks on diesel-async connections.
    pub fn run_async(settings: &Settings, report: &mut Report) -> Result<(), Box<dyn std::error::Error>> {
        report.section(
            "W3-async",
            "cancel vs ship on diesel-async, two racing tasks per order",
            "races per second ÷ the hand-written diesel-async strategy's",
        );
        let pool = pool(&settings.url, 2)?;
        let races = settings.races as i64;
        fresh_orders(&pool, races)?;
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        let bar = report.progress("W3-async", 2);
        let mut base = None;
        for (s, strategy) in STRATEGIES.iter().enumerate() {
            bar.set_message(*strategy);
            let ids: std::sync::Arc<Vec<i64>> = std::sync::Arc::new((1..=races).map(|i| i + s as i64 * races).collect());
            let mut conns = Vec::new();
            for _ in 0..2 {
                conns.push(crate::backend::connect_async::<AsyncConn>(&settings.url, BACKEND == "sqlite", &runtime)?);
            }
            let start = std::sync::Arc::new(tokio::sync::Barrier::new(2));
            let began = Instant::now();
            let results = runtime.block_on(async {
                let racers: Vec<_> = ["cancelled", "shipped"]
                    .into_iter()
                    .zip(conns)
                    .map(|(to, mut conn)| {
                        let (start, ids) = (start.clone(), ids.clone());
                        tokio::spawn(async move {
                            let target = if to == "cancelled" { OrderStatus::Cancelled } else { OrderStatus::Shipped };
                            let mut latencies = Latencies::with_capacity(ids.len());
                            let mut outcomes = Vec::with_capacity(ids.len());
                            for &id in ids.iter() {
                                start.wait().await;
                                let began = Instant::now();
                                let outcome = if s == 0 {
                                    move_by_hand_async(&mut conn, id, to).await.unwrap_or_else(|e| Outcome::Failed(e.to_string()))
                                } else {
                                    move_with_library_async(&mut conn, id, target).await
                                };
                                latencies.push(began.elapsed());
                                outcomes.push(outcome);
                            }
                            (outcomes, latencies)
                        })
                    })
                    .collect();
                let mut results = Vec::new();
                for racer in racers {
                    results.push(racer.await.expect("a racer panicked"));
                }
                results
            });
            let elapsed = began.elapsed();
            let mut record = judged(&pool, "W3-async", strategy, races, &ids, elapsed, results)?;
            let races_per_s = record.ops_per_second();
            record = record.ratio(races_per_s / *base.get_or_insert(races_per_s));
            bar.inc(1);
            bar.suspend(|| report.record(record))?;
        }
        bar.finish_and_clear();
        Ok(())
    }
}
