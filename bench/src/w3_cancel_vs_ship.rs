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
        match Order::transition_by_key(conn, &id, to, no_extra(), &RetryPolicy::default()) {
            Ok(_) => Outcome::Won,
            Err(Error::InvalidTransition(t)) => Outcome::Lost { current: t.from.to_string() },
            Err(e) => Outcome::Failed(e.to_string()),
        }
    }

    pub fn run(settings: &Settings, report: &mut Report) -> Result<(), Box<dyn std::error::Error>> {
        report.section(
            "W3",
            "cancel vs ship, two racers per order",
            "races per second ÷ the hand-written strategy's",
        );
        let pool = pool(&settings.url, 3)?;
        let races = settings.races as i64;
        {
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
        }
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

            let conn = &mut pool.get()?;
            let stored: Vec<(i64, String, i64)> = bench_orders::table
                .filter(bench_orders::id.eq_any(&ids))
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
            let mut record = Record::new("W3", format!("{races} orders"), *strategy)
                .ops(races as u64, elapsed)
                .latencies(&latencies)
                .with("violations", violations)
                .with("cancelled", cancelled)
                .with("shipped", shipped);
            let races_per_s = record.ops_per_second();
            record = record.ratio(races_per_s / *base.get_or_insert(races_per_s));
            bar.inc(1);
            bar.suspend(|| report.record(record))?;
        }
        bar.finish_and_clear();
        Ok(())
    }
}
