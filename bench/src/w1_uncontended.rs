//! W1, uncontended guarded update: one worker, random rows of a 10,000-row table, the
//! library against hand-written diesel sending the same statement. Strategies alternate in
//! rounds so that the machine's noise hits both alike; the ratio is the median of the
//! per-round ratios.
//!
//! Cases: update only (the entity is in memory), load + update (a request's read and
//! write), a stale write (the library reads the row back to return a typed `Conflict`),
//! and a request through a pool (diesel-occ's pool against r2d2 with `test_on_check_out`,
//! which pings on every checkout).
//!
//! W1-async: the first three cases on a diesel-async connection (one worker on a
//! current-thread runtime), the library's async API against hand-written diesel-async
//! sending the same statement.
//!
//! W1-telemetry: the update and the stale write again, the library with nothing
//! listening to its telemetry, with a `tracing` subscriber (a formatter writing to a
//! sink) at `INFO` (what an operator runs: the calls' spans are off) and at `DEBUG` (every
//! call's span and event formatted), and with a Prometheus recorder of its metrics.

use std::time::Instant;

use diesel::prelude::*;
use diesel_occ::{Guarded, GuardedWrite};

use crate::backend::{per_backend, recreate};
use crate::measure::{median, Latencies};
use crate::report::{Record, Report};
use crate::Settings;

/// The strategies of one case, in the order they run each round; the first is the
/// baseline of the ratio.
struct Case {
    name: &'static str,
    strategies: [&'static str; 2],
}

/// The cases of W1-async: W1's first three, on diesel-async.
const ASYNC_CASES: [Case; 3] = [
    Case {
        name: "update only",
        strategies: ["hand-written diesel-async", "library (async)"],
    },
    Case {
        name: "load + update",
        strategies: ["hand-written diesel-async", "library (async)"],
    },
    Case {
        name: "stale write (miss)",
        strategies: ["hand-written diesel-async", "library (async)"],
    },
];

const CASES: [Case; 4] = [
    Case {
        name: "update only",
        strategies: ["hand-written", "library"],
    },
    Case {
        name: "load + update",
        strategies: ["hand-written", "library"],
    },
    Case {
        name: "stale write (miss)",
        strategies: ["hand-written", "library"],
    },
    Case {
        name: "request via pool",
        strategies: ["r2d2 test_on_check_out", "diesel-occ pool"],
    },
];

/// The cases of W1-telemetry: W1's update and stale write, the library with its
/// telemetry heard in each way against the same statement by hand.
#[cfg(feature = "tracing")]
const TELEMETRY_CASES: [&str; 2] = ["update only", "stale write (miss)"];

/// The strategies of W1-telemetry, the baseline first (the recorder with the `metrics`
/// feature only).
#[cfg(feature = "tracing")]
const TELEMETRY_STRATEGIES: [&str; 5] = [
    "hand-written",
    "library, nothing listening",
    "library, tracing subscriber at INFO",
    "library, tracing subscriber at DEBUG",
    "library, Prometheus recorder",
];

/// Per strategy of a case: every latency, and each round's total.
#[derive(Default)]
struct Tally {
    latencies: Latencies,
    rounds: Vec<f64>,
}

fn report_case(
    report: &mut Report,
    workload: &'static str,
    case: &Case,
    tallies: [Tally; 2],
) -> Result<(), Box<dyn std::error::Error>> {
    let ratios: Vec<f64> = tallies[1]
        .rounds
        .iter()
        .zip(&tallies[0].rounds)
        .map(|(this, base)| this / base)
        .collect();
    for (i, tally) in tallies.iter().enumerate() {
        let record = Record::new(workload, case.name, case.strategies[i])
            .ops(tally.latencies.len() as u64, tally.latencies.total())
            .latencies(&tally.latencies)
            .ratio(if i == 0 { 1.0 } else { median(&ratios) });
        report.record(record)?;
    }
    Ok(())
}

per_backend! {
    diesel::table! {
        bench_rows (id) {
            id -> BigInt,
            note -> Text,
            version -> BigInt,
        }
    }

    #[derive(Debug, Clone, Queryable, Selectable, Identifiable, Insertable, Guarded)]
    #[diesel(table_name = bench_rows)]
    pub struct Row {
        pub id: i64,
        pub note: String,
        #[occ(version)]
        pub version: i64,
    }

    /// `bench_rows` with `n` rows at version 0; what W5 starts from too.
    pub fn fill_rows(conn: &mut Conn, n: usize) -> QueryResult<Vec<Row>> {
        recreate(
            conn,
            "bench_rows",
            "id BIGINT PRIMARY KEY NOT NULL, note VARCHAR(64) NOT NULL, version BIGINT NOT NULL",
        )?;
        let rows: Vec<Row> = (1..=n as i64)
            .map(|id| Row { id, note: String::new(), version: 0 })
            .collect();
        for chunk in rows.chunks(500) {
            diesel::insert_into(bench_rows::table).values(chunk).execute(conn)?;
        }
        Ok(rows)
    }

    /// The update a careful diesel user writes by hand: the same statement the library
    /// sends, and a check that it matched one row.
    fn hand_written_update(conn: &mut Conn, row: &mut Row, note: String) -> QueryResult<()> {
        let matched = diesel::update(
            bench_rows::table
                .filter(bench_rows::id.eq(row.id))
                .filter(bench_rows::version.eq(row.version)),
        )
        .set((bench_rows::note.eq(note), bench_rows::version.eq(row.version + 1)))
        .execute(conn)?;
        assert_eq!(matched, 1, "the row moved on: W1 has one writer");
        row.version += 1;
        Ok(())
    }

    fn load(conn: &mut Conn, id: i64) -> QueryResult<Row> {
        bench_rows::table.find(id).select(Row::as_select()).first(conn)
    }

    pub fn run(settings: &Settings, report: &mut Report) -> Result<(), Box<dyn std::error::Error>> {
        report.section(
            "W1",
            "uncontended guarded update, one worker, random rows",
            "time per operation of the second strategy ÷ the first's (median of the per-round \
             ratios); below 1 the library is faster",
        );
        let pool = pool(&settings.url, 2)?;
        let pinging = diesel::r2d2::Pool::builder()
            .max_size(2)
            .min_idle(Some(2))
            .test_on_check_out(true)
            .build(diesel::r2d2::ConnectionManager::<Conn>::new(&settings.url))?;
        let conn = &mut pool.get()?;
        let mut rows = fill_rows(conn, settings.rows)?;
        let stale = rows[0].clone();
        let bar = report.progress("W1", (CASES.len() * settings.rounds) as u64);

        for (c, case) in CASES.iter().enumerate() {
            bar.set_message(case.name);
            let mut tallies: [Tally; 2] = Default::default();
            for round in 0..settings.rounds {
                for (s, tally) in tallies.iter_mut().enumerate() {
                    // The same random rows for both strategies of a round.
                    let mut rng = fastrand::Rng::with_seed(round as u64);
                    let started = Instant::now();
                    for i in 0..settings.ops_per_round {
                        let row = &mut rows[rng.usize(..settings.rows)];
                        let note = format!("r{round}-{i}");
                        let library = s == 1;
                        tally.latencies.time(|| -> Result<(), Box<dyn std::error::Error>> {
                            match (c, library) {
                                (0, false) => hand_written_update(conn, row, note)?,
                                (0, true) => {
                                    row.version = row.guarded_update(conn, bench_rows::note.eq(note))?;
                                }
                                (1, false) => {
                                    let mut loaded = load(conn, row.id)?;
                                    hand_written_update(conn, &mut loaded, note)?;
                                    row.version = loaded.version;
                                }
                                (1, true) => {
                                    let loaded = load(conn, row.id)?;
                                    row.version = loaded.guarded_update(conn, bench_rows::note.eq(note))?;
                                }
                                (2, false) => {
                                    let matched = diesel::update(
                                        bench_rows::table
                                            .filter(bench_rows::id.eq(stale.id))
                                            .filter(bench_rows::version.eq(stale.version)),
                                    )
                                    .set((bench_rows::note.eq(note), bench_rows::version.eq(stale.version + 1)))
                                    .execute(conn)?;
                                    assert_eq!(matched, 0);
                                }
                                (2, true) => {
                                    let err = stale.guarded_update(conn, bench_rows::note.eq(note)).unwrap_err();
                                    assert!(err.as_conflict().is_some(), "{err}");
                                }
                                (_, false) => {
                                    let mut pooled = pinging.get()?;
                                    let loaded = load(&mut pooled, row.id)?;
                                    row.version = loaded.guarded_update(&mut pooled, bench_rows::note.eq(note))?;
                                }
                                (_, true) => {
                                    let mut pooled = pool.get()?;
                                    let loaded = load(&mut pooled, row.id)?;
                                    row.version = loaded.guarded_update(&mut pooled, bench_rows::note.eq(note))?;
                                }
                            }
                            Ok(())
                        })?;
                    }
                    tally.rounds.push(started.elapsed().as_secs_f64());
                }
                bar.inc(1);
            }
            report_case(report, "W1", case, tallies)?;
        }
        bar.finish_and_clear();
        Ok(())
    }

    #[cfg(feature = "tracing")]
    pub fn run_telemetry(settings: &Settings, report: &mut Report) -> Result<(), Box<dyn std::error::Error>> {
        report.section(
            "W1-telemetry",
            "W1's update and stale write with the library's telemetry heard, one worker",
            "time per operation of each strategy ÷ the hand-written one's (median of the \
             per-round ratios); the rows of the library against each other give the cost of \
             a subscriber or a recorder",
        );
        let pool = pool(&settings.url, 1)?;
        let conn = &mut pool.get()?;
        let mut rows = fill_rows(conn, settings.rows)?;
        let stale = rows[0].clone();
        let formatter = |level| {
            tracing::Dispatch::new(
                tracing_subscriber::fmt()
                    .with_writer(std::io::sink)
                    .with_max_level(level)
                    .finish(),
            )
        };
        let (info, debug) = (formatter(tracing::Level::INFO), formatter(tracing::Level::DEBUG));
        #[cfg(feature = "metrics")]
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let strategies = if cfg!(feature = "metrics") { 5 } else { 4 };
        let bar = report.progress("W1-telemetry", (TELEMETRY_CASES.len() * settings.rounds) as u64);
        for (c, case) in TELEMETRY_CASES.iter().enumerate() {
            bar.set_message(*case);
            let mut tallies: [Tally; 5] = Default::default();
            for round in 0..settings.rounds {
                for (s, tally) in tallies.iter_mut().enumerate().take(strategies) {
                    let mut rng = fastrand::Rng::with_seed(round as u64);
                    let mut one_round = || -> Result<(), Box<dyn std::error::Error>> {
                        let started = Instant::now();
                        for i in 0..settings.ops_per_round {
                            let row = &mut rows[rng.usize(..settings.rows)];
                            let note = format!("r{round}-{i}");
                            tally.latencies.time(|| -> Result<(), Box<dyn std::error::Error>> {
                                match (c, s) {
                                    (0, 0) => hand_written_update(conn, row, note)?,
                                    (0, _) => {
                                        row.version = row.guarded_update(conn, bench_rows::note.eq(note))?;
                                    }
                                    (_, 0) => {
                                        let matched = diesel::update(
                                            bench_rows::table
                                                .filter(bench_rows::id.eq(stale.id))
                                                .filter(bench_rows::version.eq(stale.version)),
                                        )
                                        .set((bench_rows::note.eq(note), bench_rows::version.eq(stale.version + 1)))
                                        .execute(conn)?;
                                        assert_eq!(matched, 0);
                                    }
                                    (_, _) => {
                                        let err = stale.guarded_update(conn, bench_rows::note.eq(note)).unwrap_err();
                                        assert!(err.as_conflict().is_some(), "{err}");
                                    }
                                }
                                Ok(())
                            })?;
                        }
                        tally.rounds.push(started.elapsed().as_secs_f64());
                        Ok(())
                    };
                    match s {
                        2 => tracing::dispatcher::with_default(&info, one_round)?,
                        3 => tracing::dispatcher::with_default(&debug, one_round)?,
                        #[cfg(feature = "metrics")]
                        4 => metrics::with_local_recorder(&recorder, one_round)?,
                        _ => one_round()?,
                    }
                }
                bar.inc(1);
            }
            for (s, tally) in tallies.iter().enumerate().take(strategies) {
                let ratios: Vec<f64> =
                    tally.rounds.iter().zip(&tallies[0].rounds).map(|(this, base)| this / base).collect();
                let record = Record::new("W1-telemetry", *case, TELEMETRY_STRATEGIES[s])
                    .ops(tally.latencies.len() as u64, tally.latencies.total())
                    .latencies(&tally.latencies)
                    .ratio(median(&ratios));
                report.record(record)?;
            }
        }
        bar.finish_and_clear();
        Ok(())
    }

    /// The async update a careful diesel-async user writes by hand: the same statement.
    async fn hand_written_async(conn: &mut AsyncConn, row: &mut Row, note: String) -> QueryResult<()> {
        let matched = diesel_async::RunQueryDsl::execute(
            diesel::update(
                bench_rows::table
                    .filter(bench_rows::id.eq(row.id))
                    .filter(bench_rows::version.eq(row.version)),
            )
            .set((bench_rows::note.eq(note), bench_rows::version.eq(row.version + 1))),
            conn,
        )
        .await?;
        assert_eq!(matched, 1, "the row moved on: W1 has one writer");
        row.version += 1;
        Ok(())
    }

    async fn load_async(conn: &mut AsyncConn, id: i64) -> QueryResult<Row> {
        diesel_async::RunQueryDsl::first(bench_rows::table.find(id).select(Row::as_select()), conn).await
    }

    /// One operation of case `c`, by the library or by hand.
    async fn async_op(
        conn: &mut AsyncConn,
        c: usize,
        library: bool,
        row: &mut Row,
        stale: &Row,
        note: String,
    ) -> Result<(), Box<dyn std::error::Error>> {
        match (c, library) {
            (0, false) => hand_written_async(conn, row, note).await?,
            (0, true) => {
                row.version = diesel_occ::asynchronous::AsyncGuardedWrite::guarded_update(row, conn, bench_rows::note.eq(note)).await?;
            }
            (1, false) => {
                let mut loaded = load_async(conn, row.id).await?;
                hand_written_async(conn, &mut loaded, note).await?;
                row.version = loaded.version;
            }
            (1, true) => {
                let loaded = load_async(conn, row.id).await?;
                row.version = diesel_occ::asynchronous::AsyncGuardedWrite::guarded_update(&loaded, conn, bench_rows::note.eq(note)).await?;
            }
            (_, false) => {
                let matched = diesel_async::RunQueryDsl::execute(
                    diesel::update(
                        bench_rows::table
                            .filter(bench_rows::id.eq(stale.id))
                            .filter(bench_rows::version.eq(stale.version)),
                    )
                    .set((bench_rows::note.eq(note), bench_rows::version.eq(stale.version + 1))),
                    conn,
                )
                .await?;
                assert_eq!(matched, 0);
            }
            (_, true) => {
                let err = diesel_occ::asynchronous::AsyncGuardedWrite::guarded_update(stale, conn, bench_rows::note.eq(note))
                    .await
                    .unwrap_err();
                assert!(err.as_conflict().is_some(), "{err}");
            }
        }
        Ok(())
    }

    pub fn run_async(settings: &Settings, report: &mut Report) -> Result<(), Box<dyn std::error::Error>> {
        use diesel_async::AsyncConnection;
        report.section(
            "W1-async",
            "uncontended guarded update on diesel-async, one worker, random rows",
            "time per operation of the library's async API ÷ hand-written diesel-async's \
             (median of the per-round ratios); below 1 the library is faster",
        );
        let pool = pool(&settings.url, 1)?;
        let mut rows = fill_rows(&mut *pool.get()?, settings.rows)?;
        drop(pool);
        let stale = rows[0].clone();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let conn = &mut runtime.block_on(AsyncConn::establish(&settings.url))?;
        let bar = report.progress("W1-async", (ASYNC_CASES.len() * settings.rounds) as u64);
        for (c, case) in ASYNC_CASES.iter().enumerate() {
            bar.set_message(case.name);
            let mut tallies: [Tally; 2] = Default::default();
            for round in 0..settings.rounds {
                for (s, tally) in tallies.iter_mut().enumerate() {
                    // The same random rows for both strategies of a round.
                    let mut rng = fastrand::Rng::with_seed(round as u64);
                    let started = Instant::now();
                    runtime.block_on(async {
                        for i in 0..settings.ops_per_round {
                            let row = &mut rows[rng.usize(..settings.rows)];
                            let note = format!("r{round}-{i}");
                            let op_started = Instant::now();
                            async_op(conn, c, s == 1, row, &stale, note).await?;
                            tally.latencies.push(op_started.elapsed());
                        }
                        Ok::<_, Box<dyn std::error::Error>>(())
                    })?;
                    tally.rounds.push(started.elapsed().as_secs_f64());
                }
                bar.inc(1);
            }
            report_case(report, "W1-async", case, tallies)?;
        }
        bar.finish_and_clear();
        Ok(())
    }
}
