//! W5, batch: N guarded updates of distinct rows, all or nothing, three ways: by hand
//! (N diesel updates in one transaction, each checked for one row), as N single guarded
//! updates in one transaction, and as one guarded batch (on PostgreSQL a few combined
//! statements; elsewhere one statement per row in one transaction). The statements each
//! sends are counted by diesel's instrumentation, `BEGIN` and `COMMIT` included.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use diesel::connection::{Instrumentation, InstrumentationEvent};
use diesel::prelude::*;
use diesel_occ::WriteTransaction;
use diesel_occ::{BatchMode, GuardedBatch};
use diesel_occ::{Guarded, GuardedWrite};

use crate::backend::{per_backend, recreate};
use crate::measure::{median_ratio, Latencies};
use crate::report::{Record, Report};
use crate::Settings;

const STRATEGIES: [&str; 3] = [
    "hand-written updates",
    "single guarded updates",
    "guarded batch",
];

/// Counts the statements a connection starts.
fn counter(count: Arc<AtomicUsize>) -> impl Instrumentation {
    move |event: InstrumentationEvent<'_>| {
        if let InstrumentationEvent::StartQuery { .. } = event {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }
}

per_backend! {
    diesel::table! {
        bench_batch (id) {
            id -> BigInt,
            note -> Text,
            version -> BigInt,
        }
    }

    #[derive(Debug, Clone, Queryable, Selectable, Identifiable, Insertable, Guarded)]
    #[diesel(table_name = bench_batch)]
    pub struct Row {
        pub id: i64,
        pub note: String,
        #[occ(version)]
        pub version: i64,
    }

    /// One all-or-nothing pass over `rows` by `strategy`, leaving the new versions in `rows`.
    fn pass(conn: &mut Conn, strategy: usize, rows: &mut [Row], round: usize) -> Result<(), Box<dyn std::error::Error>> {
        let note = |id: i64| format!("r{round}-{id}");
        match strategy {
            0 => conn.write_transaction(|conn| -> QueryResult<()> {
                for row in rows.iter_mut() {
                    let matched = diesel::update(
                        bench_batch::table
                            .filter(bench_batch::id.eq(row.id))
                            .filter(bench_batch::version.eq(row.version)),
                    )
                    .set((bench_batch::note.eq(note(row.id)), bench_batch::version.eq(row.version + 1)))
                    .execute(conn)?;
                    if matched != 1 {
                        return Err(diesel::result::Error::RollbackTransaction);
                    }
                    row.version += 1;
                }
                Ok(())
            })?,
            1 => conn.write_transaction(|conn| -> Result<(), diesel_occ::Error> {
                for row in rows.iter_mut() {
                    row.version = row.guarded_update(conn, bench_batch::note.eq(note(row.id)))?;
                }
                Ok(())
            })?,
            _ => {
                let batch = rows
                    .iter()
                    .map(|row| (row.id, row.version, bench_batch::note.eq(note(row.id))));
                let report = Row::guarded_update_batch(conn, batch.collect::<Vec<_>>(), BatchMode::AllOrNothing)?;
                if !report.all_written() {
                    return Err(format!("a batch row missed: {:?}", report.rows.iter().find(|r| !r.is_written())).into());
                }
                for (row, outcome) in rows.iter_mut().zip(report.rows) {
                    match outcome {
                        diesel_occ::RowOutcome::Written(version) => row.version = version,
                        other => return Err(format!("row {} not written: {other:?}", row.id).into()),
                    }
                }
            }
        }
        Ok(())
    }

    pub fn run(settings: &Settings, report: &mut Report) -> Result<(), Box<dyn std::error::Error>> {
        report.section(
            "W5",
            "N guarded updates of distinct rows, all or nothing",
            "time per batch ÷ the hand-written updates' (median of the per-round ratios); below 1 is faster",
        );
        let conn = &mut <Conn as Connection>::establish(&settings.url)?;
        let statements = Arc::new(AtomicUsize::new(0));
        conn.set_instrumentation(counter(Arc::clone(&statements)));
        let bar = report.progress("W5", (settings.batch_sizes.len() * settings.batch_rounds) as u64);
        for &n in &settings.batch_sizes {
            bar.set_message(format!("N={n}"));
            recreate(
                conn,
                "bench_batch",
                "id BIGINT PRIMARY KEY NOT NULL, note VARCHAR(64) NOT NULL, version BIGINT NOT NULL",
            )?;
            let mut rows: Vec<Row> = (1..=n as i64).map(|id| Row { id, note: String::new(), version: 0 }).collect();
            for chunk in rows.chunks(500) {
                diesel::insert_into(bench_batch::table).values(chunk).execute(conn)?;
            }
            let mut times: [Latencies; 3] = Default::default();
            let mut sent = [0_usize; 3];
            for round in 0..settings.batch_rounds {
                for (s, time) in times.iter_mut().enumerate() {
                    let before = statements.load(Ordering::Relaxed);
                    let began = Instant::now();
                    pass(conn, s, &mut rows, round)?;
                    time.push(began.elapsed());
                    sent[s] = statements.load(Ordering::Relaxed) - before;
                }
                bar.inc(1);
            }
            // Every pass moved every row on by one version: anything else was lost or doubled.
            let expected = (settings.batch_rounds * STRATEGIES.len()) as i64;
            let wrong: i64 = bench_batch::table
                .filter(bench_batch::version.ne(expected))
                .count()
                .get_result(conn)?;
            for (s, strategy) in STRATEGIES.iter().enumerate() {
                let record = Record::new("W5", format!("N={n}"), *strategy)
                    .ops(times[s].len() as u64 * n as u64, times[s].total())
                    .latencies(&times[s])
                    .ratio(median_ratio(&times[s], &times[0]))
                    .with("rows", n)
                    .with("statements_per_batch", sent[s])
                    .with("rows_with_wrong_version", wrong);
                bar.suspend(|| report.record(record))?;
            }
        }
        bar.finish_and_clear();
        Ok(())
    }
}
