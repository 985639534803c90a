//! W1, uncontended guarded update: one worker, random rows of a 10,000-row table, the
//! library against hand-written diesel sending the same statement. Strategies alternate in
//! rounds so that the machine's noise hits both alike; the ratio is the median of the
//! per-round ratios.
//!
//! Cases: update only (the entity is in memory), load + update (a request's read and
//! write), a stale write (the library reads the row back to return a typed `Conflict`),
//! and a request through a pool (diesel-occ's pool against r2d2 with `test_on_check_out`,
//! which pings on every checkout).

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

/// Per strategy of a case: every latency, and each round's total.
#[derive(Default)]
struct Tally {
    latencies: Latencies,
    rounds: Vec<f64>,
}

fn report_case(
    report: &mut Report,
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
        let record = Record::new("W1", case.name, case.strategies[i])
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
            report_case(report, case, tallies)?;
        }
        bar.finish_and_clear();
        Ok(())
    }
}
