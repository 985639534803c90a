//! W7, inserts and upserts, one row per call, against what a careful diesel user writes:
//! - insert: `guarded_insert` (a seeded first version) vs diesel's `insert_into`;
//! - upsert of a row that is there: `guarded_upsert` of a loaded copy vs the hand-written
//!   guarded update (`... WHERE id = ? AND version = ?`, one row checked), and, where the
//!   backend has it, the one-statement `INSERT ... ON CONFLICT (id) DO UPDATE ... WHERE
//!   version = ?` (PostgreSQL, SQLite; MySQL's `ON DUPLICATE KEY UPDATE` has no `WHERE`);
//! - upsert of a missing row: `guarded_upsert` vs the hand-written update that matches
//!   nothing followed by the insert, and the one-statement form.
//!
//! Each strategy works on rows of its own, in rounds that alternate the strategies; at
//! the end every row must hold the version its writes gave it.

use std::time::Instant;

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use diesel_occ::{Guarded, GuardedWrite, Upserted};

use crate::backend::{per_backend, recreate};
use crate::measure::{median_ratio, Latencies};
use crate::report::{Record, Report};
use crate::Settings;

/// The cases, each with its strategies; the first strategy is the baseline.
const CASES: [(&str, &[&str]); 3] = [
    ("insert", &["hand-written insert", "guarded_insert"]),
    (
        "upsert, row there",
        &[
            "hand-written guarded update",
            "guarded_upsert",
            "one-statement ON CONFLICT",
        ],
    ),
    (
        "upsert, row missing",
        &[
            "hand-written update, then insert",
            "guarded_upsert",
            "one-statement ON CONFLICT",
        ],
    ),
];

per_backend! {
    diesel::table! {
        bench_upsert (id) {
            id -> BigInt,
            note -> Text,
            version -> BigInt,
        }
    }

    #[derive(Debug, Clone, Queryable, Selectable, Identifiable, Insertable, Guarded)]
    #[diesel(table_name = bench_upsert)]
    pub struct Row {
        pub id: i64,
        pub note: String,
        #[occ(version)]
        pub version: i64,
    }

    /// The one-statement guarded upsert a user of this backend can write, if any: binds
    /// id, note, version for the insert, then the version the update expects.
    fn on_conflict_sql() -> Option<&'static str> {
        match BACKEND {
            "postgres" => Some(
                "INSERT INTO bench_upsert (id, note, version) VALUES ($1, $2, $3) ON CONFLICT (id) \
                 DO UPDATE SET note = excluded.note, version = bench_upsert.version + 1 \
                 WHERE bench_upsert.version = $4",
            ),
            "sqlite" => Some(
                "INSERT INTO bench_upsert (id, note, version) VALUES (?, ?, ?) ON CONFLICT (id) \
                 DO UPDATE SET note = excluded.note, version = bench_upsert.version + 1 \
                 WHERE bench_upsert.version = ?",
            ),
            _ => None,
        }
    }

    /// One call of `strategy` in `case` on `row`, which records the version the row then
    /// holds.
    fn call(conn: &mut Conn, case: usize, strategy: usize, row: &mut Row) -> Result<(), Box<dyn std::error::Error>> {
        let missing = case == 2;
        match (case, strategy) {
            (0, 0) => {
                diesel::insert_into(bench_upsert::table).values(&*row).execute(conn)?;
            }
            (0, _) => {
                row.guarded_insert(conn)?;
            }
            (_, 0) => {
                let matched = diesel::update(
                    bench_upsert::table.filter(bench_upsert::id.eq(row.id)).filter(bench_upsert::version.eq(row.version)),
                )
                .set((bench_upsert::note.eq(&row.note), bench_upsert::version.eq(row.version + 1)))
                .execute(conn)?;
                match (matched, missing) {
                    (1, false) => row.version += 1,
                    (0, true) => {
                        diesel::insert_into(bench_upsert::table).values(&*row).execute(conn)?;
                    }
                    _ => return Err(format!("row {}: the hand-written upsert matched {matched}", row.id).into()),
                }
            }
            (_, 1) => match (row.guarded_upsert(conn)?, missing) {
                (Upserted::Updated(_), false) | (Upserted::Inserted(_), true) => {}
                (other, _) => return Err(format!("row {}: unexpected {other:?}", row.id).into()),
            },
            _ => {
                let sql = on_conflict_sql().ok_or("no one-statement upsert on this backend")?;
                let written = diesel::sql_query(sql)
                    .bind::<BigInt, _>(row.id)
                    .bind::<Text, _>(&row.note)
                    .bind::<BigInt, _>(row.version)
                    .bind::<BigInt, _>(row.version)
                    .execute(conn)?;
                if written != 1 {
                    return Err(format!("row {}: the one-statement upsert wrote {written}", row.id).into());
                }
                if !missing {
                    row.version += 1;
                }
            }
        }
        Ok(())
    }

    pub fn run(settings: &Settings, report: &mut Report) -> Result<(), Box<dyn std::error::Error>> {
        report.section(
            "W7",
            "inserts and upserts, one row per call",
            "time per call ÷ the hand-written diesel's (median of the per-round ratios); below 1 is faster",
        );
        let conn = &mut <Conn as Connection>::establish(&settings.url)?;
        recreate(
            conn,
            "bench_upsert",
            "id BIGINT PRIMARY KEY NOT NULL, note VARCHAR(64) NOT NULL, version BIGINT NOT NULL",
        )?;
        let per_round = settings.ops_per_round;
        let bar = report.progress("W7", (CASES.len() * settings.rounds) as u64);
        let mut next_id = 1_i64;
        let mut all_rows: Vec<Row> = Vec::new();
        for (case, (name, strategies)) in CASES.iter().enumerate() {
            let strategies: Vec<&str> = strategies
                .iter()
                .copied()
                .filter(|s| !s.starts_with("one-statement") || on_conflict_sql().is_some())
                .collect();
            // Each strategy's rows; for an upsert of a row that is there, inserted first.
            let mut rows: Vec<Vec<Row>> = strategies
                .iter()
                .map(|_| {
                    let first = next_id;
                    next_id += per_round as i64;
                    (first..next_id).map(|id| Row { id, note: "new".into(), version: 0 }).collect()
                })
                .collect();
            if case == 1 {
                for chunk in rows.iter().flatten().collect::<Vec<_>>().chunks(500) {
                    let chunk: Vec<Row> = chunk.iter().map(|r| (*r).clone()).collect();
                    diesel::insert_into(bench_upsert::table).values(&chunk).execute(conn)?;
                }
            }
            let mut times: Vec<Latencies> = strategies.iter().map(|_| Latencies::default()).collect();
            for round in 0..settings.rounds {
                for (s, time) in times.iter_mut().enumerate() {
                    if case != 1 && round > 0 {
                        // Inserts need rows that are not there yet: new keys each round.
                        let first = next_id;
                        next_id += per_round as i64;
                        all_rows.append(&mut rows[s]);
                        rows[s] = (first..next_id).map(|id| Row { id, note: "new".into(), version: 0 }).collect();
                    }
                    let began = Instant::now();
                    for row in rows[s].iter_mut() {
                        row.note = format!("r{round}");
                        call(conn, case, s, row)?;
                    }
                    time.push(began.elapsed());
                }
                bar.inc(1);
            }
            all_rows.extend(rows.into_iter().flatten());
            for (s, strategy) in strategies.iter().enumerate() {
                let calls = times[s].len() as u64 * per_round as u64;
                let record = Record::new("W7", *name, *strategy)
                    .ops(calls, times[s].total())
                    .ratio(median_ratio(&times[s], &times[0]))
                    .with("calls_per_round", per_round);
                bar.suspend(|| report.record(record))?;
            }
        }
        bar.finish_and_clear();
        // Every row holds the version its writes left in the copy: nothing lost or doubled.
        let stored: Vec<(i64, i64)> = bench_upsert::table
            .select((bench_upsert::id, bench_upsert::version))
            .order(bench_upsert::id)
            .load(conn)?;
        let mut expected: Vec<(i64, i64)> = all_rows.iter().map(|r| (r.id, r.version)).collect();
        expected.sort_unstable();
        if stored != expected {
            let wrong = stored.iter().zip(&expected).filter(|(s, e)| s != e).count();
            return Err(format!(
                "W7: {wrong} rows hold another version than their writes left ({} stored, {} written)",
                stored.len(),
                expected.len()
            )
            .into());
        }
        Ok(())
    }
}
