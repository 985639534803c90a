//! W2, hot-row JSON merge: N workers (threads, each on its own pooled connection) merge
//! their own counter into one row's JSON column for a fixed time. Worker `i` writes
//! `{"w<i>": <its successes so far + 1>}`, so the document at the end must hold exactly
//! each worker's count of successes (no lost update), and the version their sum (no
//! doubled one).
//!
//! Strategies: the hand-written single atomic UPDATE (the ceiling for one row), the
//! library's one-statement merge (with the new token back, and without it), pessimistic (`SELECT ... FOR UPDATE`, an immediate
//! transaction on SQLite, then a plain UPDATE), and the library's read-merge-write with
//! retry, plain optimistic and with the default policy, which reads a contended row with
//! its lock.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel_occ::GuardedJson;
use diesel_occ::GuardedJsonMerge;
use diesel_occ::{Contention, Error, Guarded, RetryPolicy};
use diesel_occ::{LockWait, Pessimistic};
use serde_json::{json, Value};

use crate::backend::{per_backend, recreate};
use crate::measure::Latencies;
use crate::report::{Record, Report};
use crate::Settings;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strategy {
    HandWritten,
    OneStatement,
    OneStatementNoToken,
    Pessimistic,
    Optimistic,
    Adaptive,
}

impl Strategy {
    const ALL: [Strategy; 6] = [
        Strategy::HandWritten,
        Strategy::OneStatement,
        Strategy::OneStatementNoToken,
        Strategy::Pessimistic,
        Strategy::Optimistic,
        Strategy::Adaptive,
    ];

    fn name(self) -> &'static str {
        match self {
            Strategy::HandWritten => "hand-written atomic UPDATE",
            Strategy::OneStatement => "library one-statement merge",
            Strategy::OneStatementNoToken => "library one-statement merge, no token back",
            Strategy::Pessimistic => "pessimistic (row lock)",
            Strategy::Optimistic => "read-merge-write, plain optimistic retry",
            Strategy::Adaptive => "read-merge-write, default policy (locks when contended)",
        }
    }
}

/// What one worker did.
#[derive(Debug, Default)]
struct Worker {
    successes: u64,
    attempts: u64,
    failures: u64,
    first_failure: Option<String>,
    latencies: Latencies,
}

/// The end state against what the workers reported.
struct Check {
    /// Successes the document does not show (lost updates).
    lost: i64,
    /// Workers whose counter differs from their successes.
    wrong_counters: usize,
    /// The version minus the successes (an update applied twice, or not counted).
    version_drift: i64,
}

fn check(document: &Value, version: i64, workers: &[Worker]) -> Check {
    let mut lost = 0;
    let mut wrong_counters = 0;
    for (i, worker) in workers.iter().enumerate() {
        let stored = document
            .get(format!("w{i}"))
            .and_then(Value::as_i64)
            .unwrap_or(0);
        lost += worker.successes as i64 - stored;
        wrong_counters += usize::from(stored != worker.successes as i64);
    }
    let successes: u64 = workers.iter().map(|w| w.successes).sum();
    Check {
        lost,
        wrong_counters,
        version_drift: version - successes as i64,
    }
}

fn record(
    workload: &'static str,
    strategy: Strategy,
    n: usize,
    elapsed: Duration,
    workers: Vec<Worker>,
    check: Check,
) -> Record {
    let successes: u64 = workers.iter().map(|w| w.successes).sum();
    let attempts: u64 = workers.iter().map(|w| w.attempts).sum();
    let failures: u64 = workers.iter().map(|w| w.failures).sum();
    let first_failure = workers.iter().find_map(|w| w.first_failure.clone());
    let min = workers.iter().map(|w| w.successes).min().unwrap_or(0);
    let max = workers.iter().map(|w| w.successes).max().unwrap_or(0);
    let mean = successes as f64 / n as f64;
    let mut latencies = Latencies::default();
    for worker in workers {
        latencies.extend(worker.latencies);
    }
    let mut record = Record::new(workload, format!("N={n}"), strategy.name())
        .ops(successes, elapsed)
        .latencies(&latencies)
        .with("workers", n)
        .with("attempts", attempts)
        .with(
            "retries_per_success",
            round2((attempts.saturating_sub(successes)) as f64 / successes.max(1) as f64),
        )
        .with("failures", failures)
        .with("worker_min", min)
        .with("worker_max", max)
        .with(
            "worker_min_of_mean",
            round2(min as f64 / mean.max(f64::MIN_POSITIVE)),
        )
        .with("lost", check.lost)
        .with("wrong_counters", check.wrong_counters)
        .with("version_drift", check.version_drift);
    if let Some(failure) = first_failure {
        record = record.with("first_failure", failure);
    }
    record
}

impl Worker {
    /// Counts one merge that took `attempts` (or failed with `error`), begun at `began`.
    fn tally(&mut self, began: Instant, outcome: Result<u32, Error>) {
        match outcome {
            Ok(attempts) => {
                self.latencies.push(began.elapsed());
                self.successes += 1;
                self.attempts += u64::from(attempts);
            }
            Err(e) => {
                self.failures += 1;
                self.attempts += match &e {
                    Error::RetriesExhausted { attempts, .. } => u64::from(*attempts),
                    _ => 1,
                };
                self.first_failure.get_or_insert_with(|| e.to_string());
            }
        }
    }
}

/// The strategies W2-async runs: pessimistic locking has no async helper in the library.
const ASYNC_STRATEGIES: [Strategy; 5] = [
    Strategy::HandWritten,
    Strategy::OneStatement,
    Strategy::OneStatementNoToken,
    Strategy::Optimistic,
    Strategy::Adaptive,
];

/// The hand-written one-statement merge of `patch` into row 1, in diesel's DSL so that
/// diesel prepares it once per connection, as it does the library's statements.
macro_rules! hand_merge {
    ($patch:expr) => {
        diesel::update(bench_docs::table.find(1_i64)).set((
            bench_docs::ext.eq(merge_patch(bench_docs::ext, $patch)),
            bench_docs::version.eq(bench_docs::version + 1),
        ))
    };
}

/// `{"<key>": count}`: a worker's counter as a merge patch.
fn patch_of(key: &str, count: u64) -> Value {
    let mut patch = serde_json::Map::new();
    patch.insert(key.to_string(), json!(count));
    Value::Object(patch)
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

per_backend! {
    diesel::table! {
        use diesel::sql_types::*;
        use super::JsonSql;

        bench_docs (id) {
            id -> BigInt,
            ext -> JsonSql,
            version -> BigInt,
        }
    }

    #[derive(Debug, Clone, Queryable, Selectable, Identifiable, Insertable, Guarded)]
    #[diesel(table_name = bench_docs)]
    pub struct Doc {
        pub id: i64,
        #[occ(json)]
        pub ext: Value,
        #[occ(version)]
        pub version: i64,
    }

    /// One merge of `patch` (worker `key` now at `count`) by `strategy`; the attempts it took.
    fn merge(
        conn: &mut diesel_occ::Pooled<Conn>,
        strategy: Strategy,
        key: &str,
        count: u64,
        policies: &(RetryPolicy, RetryPolicy),
    ) -> Result<u32, Error> {
        let patch = patch_of(key, count);
        match strategy {
            Strategy::HandWritten => {
                let matched = hand_merge!(&patch).execute(conn)?;
                assert_eq!(matched, 1);
                Ok(1)
            }
            Strategy::OneStatement => {
                Doc::merge_json_in_place(conn, &1, bench_docs::ext, &patch)?;
                Ok(1)
            }
            Strategy::OneStatementNoToken => {
                Doc::merge_json_in_place_without_token(conn, &1, bench_docs::ext, &patch)?;
                Ok(1)
            }
            Strategy::Pessimistic => {
                Doc::with_row_locked(conn, &1, LockWait::Wait, |conn, mut doc| -> Result<(), Error> {
                    doc.ext[key] = json!(count);
                    diesel::update(bench_docs::table.find(1))
                        .set((bench_docs::ext.eq(&doc.ext), bench_docs::version.eq(doc.version + 1)))
                        .execute(conn)?;
                    Ok(())
                })?;
                Ok(1)
            }
            Strategy::Optimistic => {
                Ok(Doc::merge_json(conn, &1, bench_docs::ext, &patch, &policies.0)?.attempts)
            }
            Strategy::Adaptive => {
                Ok(Doc::merge_json(conn, &1, bench_docs::ext, &patch, &policies.1)?.attempts)
            }
        }
    }

    /// `n` workers merging by `strategy` for `point`, from a fresh document.
    fn run_point(pool: &Pool, strategy: Strategy, n: usize, point: Duration) -> Result<Record, Box<dyn std::error::Error>> {
        let conn = &mut pool.get()?;
        diesel::update(bench_docs::table.find(1))
            .set((bench_docs::ext.eq(json!({})), bench_docs::version.eq(0)))
            .execute(conn)?;
        let policies = (
            RetryPolicy::default().contention(Contention::Optimistic),
            RetryPolicy::default(),
        );
        let start = Barrier::new(n + 1);
        let (workers, elapsed) = std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|i| {
                    let (start, policies) = (&start, &policies);
                    s.spawn(move || -> Result<Worker, diesel_occ::Error> {
                        let mut conn = pool.get()?;
                        let key = format!("w{i}");
                        let mut me = Worker::default();
                        start.wait();
                        let deadline = Instant::now() + point;
                        while Instant::now() < deadline {
                            let began = Instant::now();
                            me.tally(began, merge(&mut conn, strategy, &key, me.successes + 1, policies));
                        }
                        Ok(me)
                    })
                })
                .collect();
            start.wait();
            let began = Instant::now();
            let workers: Result<Vec<Worker>, diesel_occ::Error> =
                handles.into_iter().map(|h| h.join().expect("a worker panicked")).collect();
            (workers, began.elapsed())
        });
        let workers = workers?;
        let doc: Doc = bench_docs::table.find(1).select(Doc::as_select()).first(conn)?;
        let check = check(&doc.ext, doc.version, &workers);
        Ok(record("W2", strategy, n, elapsed, workers, check))
    }

    pub fn run(settings: &Settings, report: &mut Report) -> Result<(), Box<dyn std::error::Error>> {
        report.section(
            "W2",
            "hot-row JSON merge, N workers on one row",
            "goodput ÷ the hand-written atomic UPDATE's at the same N (the ceiling for one row)",
        );
        let most = settings.workers.iter().copied().max().unwrap_or(1);
        let pool = pool(&settings.url, most as u32 + 1)?;
        {
            let conn = &mut pool.get()?;
            recreate(
                conn,
                "bench_docs",
                &format!("id BIGINT PRIMARY KEY NOT NULL, ext {JSON_DDL} NOT NULL, version BIGINT NOT NULL"),
            )?;
            diesel::insert_into(bench_docs::table)
                .values(&Doc { id: 1, ext: json!({}), version: 0 })
                .execute(conn)?;
        }
        let bar = report.progress("W2", (settings.workers.len() * Strategy::ALL.len()) as u64);
        for &n in &settings.workers {
            let mut ceiling = None;
            for strategy in Strategy::ALL {
                bar.set_message(format!("N={n} {}", strategy.name()));
                let mut record = run_point(&pool, strategy, n, settings.point)?;
                let goodput = record.ops_per_second();
                let base = *ceiling.get_or_insert(goodput);
                record = record.ratio(goodput / base);
                bar.inc(1);
                bar.suspend(|| report.record(record))?;
            }
        }
        bar.finish_and_clear();
        Ok(())
    }

    /// One merge by `strategy` on a diesel-async connection; the attempts it took.
    async fn merge_async(
        conn: &mut AsyncConn,
        strategy: Strategy,
        key: &str,
        count: u64,
        policies: &(RetryPolicy, RetryPolicy),
    ) -> Result<u32, Error> {
        use diesel_occ::asynchronous::AsyncGuardedJson;
        let patch = patch_of(key, count);
        match strategy {
            Strategy::HandWritten => {
                let matched = diesel_async::RunQueryDsl::execute(hand_merge!(&patch), conn).await?;
                assert_eq!(matched, 1);
                Ok(1)
            }
            Strategy::OneStatement => {
                <Doc as AsyncGuardedJson>::merge_json_in_place(conn, &1, bench_docs::ext, &patch).await?;
                Ok(1)
            }
            Strategy::OneStatementNoToken => {
                <Doc as AsyncGuardedJson>::merge_json_in_place_without_token(conn, &1, bench_docs::ext, &patch).await?;
                Ok(1)
            }
            Strategy::Optimistic => {
                Ok(<Doc as AsyncGuardedJson>::merge_json(conn, &1, bench_docs::ext, &patch, &policies.0).await?.attempts)
            }
            Strategy::Adaptive | Strategy::Pessimistic => {
                Ok(<Doc as AsyncGuardedJson>::merge_json(conn, &1, bench_docs::ext, &patch, &policies.1).await?.attempts)
            }
        }
    }

    /// `n` tokio tasks, each on a diesel-async connection of its own, merging by
    /// `strategy` for `point`, from a fresh document.
    fn run_point_async(
        pool: &Pool,
        runtime: &tokio::runtime::Runtime,
        url: &str,
        strategy: Strategy,
        n: usize,
        point: Duration,
    ) -> Result<Record, Box<dyn std::error::Error>> {
        let conn = &mut pool.get()?;
        diesel::update(bench_docs::table.find(1))
            .set((bench_docs::ext.eq(json!({})), bench_docs::version.eq(0)))
            .execute(conn)?;
        let mut conns = Vec::with_capacity(n);
        for _ in 0..n {
            conns.push(crate::backend::connect_async::<AsyncConn>(url, BACKEND == "sqlite", runtime)?);
        }
        let policies = std::sync::Arc::new((
            RetryPolicy::default().contention(Contention::Optimistic),
            RetryPolicy::default(),
        ));
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(n + 1));
        let (workers, elapsed) = runtime.block_on(async {
            let tasks: Vec<_> = conns
                .into_iter()
                .enumerate()
                .map(|(i, mut conn)| {
                    let (start, policies) = (start.clone(), policies.clone());
                    tokio::spawn(async move {
                        let key = format!("w{i}");
                        let mut me = Worker::default();
                        start.wait().await;
                        let deadline = Instant::now() + point;
                        while Instant::now() < deadline {
                            let began = Instant::now();
                            let outcome = merge_async(&mut conn, strategy, &key, me.successes + 1, &policies).await;
                            me.tally(began, outcome);
                        }
                        me
                    })
                })
                .collect();
            start.wait().await;
            let began = Instant::now();
            let mut workers = Vec::with_capacity(n);
            for task in tasks {
                workers.push(task.await.expect("a worker panicked"));
            }
            (workers, began.elapsed())
        });
        let doc: Doc = bench_docs::table.find(1).select(Doc::as_select()).first(conn)?;
        let check = check(&doc.ext, doc.version, &workers);
        Ok(record("W2-async", strategy, n, elapsed, workers, check))
    }

    pub fn run_async(settings: &Settings, report: &mut Report) -> Result<(), Box<dyn std::error::Error>> {
        report.section(
            "W2-async",
            "hot-row JSON merge on diesel-async, N tokio tasks on one row",
            "goodput ÷ the hand-written diesel-async atomic UPDATE's at the same N",
        );
        let pool = pool(&settings.url, 2)?;
        {
            let conn = &mut pool.get()?;
            recreate(
                conn,
                "bench_docs",
                &format!("id BIGINT PRIMARY KEY NOT NULL, ext {JSON_DDL} NOT NULL, version BIGINT NOT NULL"),
            )?;
            diesel::insert_into(bench_docs::table)
                .values(&Doc { id: 1, ext: json!({}), version: 0 })
                .execute(conn)?;
        }
        // Two worker threads, as the machine has two cores; the tasks share them.
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        let bar = report.progress("W2-async", (settings.workers.len() * ASYNC_STRATEGIES.len()) as u64);
        for &n in &settings.workers {
            let mut ceiling = None;
            for strategy in ASYNC_STRATEGIES {
                bar.set_message(format!("N={n} {}", strategy.name()));
                let mut record = run_point_async(&pool, &runtime, &settings.url, strategy, n, settings.point)?;
                let goodput = record.ops_per_second();
                let base = *ceiling.get_or_insert(goodput);
                record = record.ratio(goodput / base);
                bar.inc(1);
                bar.suspend(|| report.record(record))?;
            }
        }
        bar.finish_and_clear();
        Ok(())
    }
}
