//! Batches of guarded writes on both executors (the blocking API and diesel-async), on
//! every backend: every row's outcome, all-or-nothing or partial, rows of several shapes,
//! concurrent batches losing nothing, and a dropped all-or-nothing batch future leaving
//! all of its rows or none. End states are read from the database.

#![cfg(all(
    feature = "async",
    any(not(feature = "mysql"), feature = "async-mysql")
))]

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::batch_paths::{BatchPatch, Batcher};
use common::models::Order;
use common::schema::orders;
use diesel::prelude::*;
use diesel_occ::{BatchMode, Error, GuardedWrite, RowOutcome, Token};

for_each_backend! {
    type Db = common::TestDb<Conn>;

    /// Orders 1 and 2 exist; 2 has been edited since it was read at version 0.
    fn setup(db: &Db) {
        let conn = &mut db.conn();
        for id in [1, 2] {
            diesel::insert_into(orders::table).values(&Order::new(id, "new")).execute(conn).unwrap();
        }
        Order::guarded_update_by_key(conn, &2, &0, orders::note.eq("theirs")).unwrap();
    }

    /// Orders `ids`, as `Order::new` makes them.
    fn insert(db: &Db, ids: std::ops::RangeInclusive<i64>) {
        let existing: Vec<Order> = ids.map(|id| Order::new(id, "new")).collect();
        for chunk in existing.chunks(500) {
            diesel::insert_into(orders::table).values(chunk).execute(&mut db.conn()).unwrap();
        }
    }

    fn notes(db: &Db) -> Vec<(i64, String, i64)> {
        orders::table
            .select((orders::id, orders::note, orders::version))
            .order(orders::id)
            .load(&mut db.conn())
            .unwrap()
    }

    fn stored(db: &Db) -> Vec<Order> {
        load_all(&mut db.conn())
    }

    fn load_all(conn: &mut diesel_occ::Pooled<Conn>) -> Vec<Order> {
        orders::table.order(orders::id).select(Order::as_select()).load(conn).unwrap()
    }

    /// Row 1 is current, row 2 is stale, row 3 does not exist.
    fn batch() -> Vec<(i64, i64, BatchPatch)> {
        vec![(1, 0, BatchPatch::note("mine")), (2, 0, BatchPatch::note("mine")), (3, 0, BatchPatch::note("mine"))]
    }

    fn assert_outcomes<T: std::fmt::Debug>(rows: &[RowOutcome<T>], written: impl Fn(&T) -> bool) {
        assert!(matches!(&rows[0], RowOutcome::Written(t) if written(t)), "{rows:?}");
        match &rows[1] {
            RowOutcome::Conflict(conflict) => {
                assert_eq!(conflict.found, Token::Version(1));
                assert_eq!(conflict.current::<Order>().unwrap().note, "theirs");
            }
            other => panic!("expected a conflict, got {other:?}"),
        }
        assert!(matches!(rows[2], RowOutcome::NotFound), "{rows:?}");
    }

    fn partial_batch_keeps_the_rows_it_wrote_and_reports_the_others<W: Batcher>(db: &Db, batcher: impl Fn() -> W) {
        setup(db);

        let report = batcher().update_batch(batch(), BatchMode::Partial).unwrap();

        assert_outcomes(&report.rows, |v| *v == 1);
        assert!(report.applied && !report.all_written());
        assert_eq!(notes(db), [(1, "mine".into(), 1), (2, "theirs".into(), 1)], "{}", W::PATH);
    }

    fn all_or_nothing_batch_rolls_back_every_row_when_one_misses<W: Batcher>(db: &Db, batcher: impl Fn() -> W) {
        setup(db);

        let report = batcher().update_batch(batch(), BatchMode::AllOrNothing).unwrap();

        assert_outcomes(&report.rows, |v| *v == 1);
        assert!(!report.applied);
        assert_eq!(notes(db), [(1, "new".into(), 0), (2, "theirs".into(), 1)], "{}", W::PATH);
    }

    fn all_or_nothing_batch_commits_when_every_row_is_current<W: Batcher>(db: &Db, batcher: impl Fn() -> W) {
        setup(db);

        let rows = vec![(1, 0, BatchPatch::note("a")), (2, 1, BatchPatch::note("b"))];
        let report = batcher().update_batch(rows, BatchMode::AllOrNothing).unwrap();

        assert!(report.applied && report.all_written());
        assert_eq!(notes(db), [(1, "a".into(), 1), (2, "b".into(), 2)]);
    }

    /// The documented cost: on PostgreSQL one statement for all rows and one read of the
    /// rows that missed; elsewhere one UPDATE per row and one SELECT per miss.
    fn a_batch_costs_the_documented_number_of_statements<W: Batcher>(db: &Db, batcher: impl Fn() -> W) {
        setup(db);
        let mut batcher = batcher();
        let statements = batcher.record_statements();

        batcher.update_batch(batch(), BatchMode::Partial).unwrap();

        let statements = statements.lock().unwrap();
        let count = |verb: &str| statements.iter().filter(|sql| sql.starts_with(verb)).count();
        let expected = if BACKEND == "postgres" { (1, 1) } else { (3, 2) };
        assert_eq!((count("UPDATE"), count("SELECT")), expected, "{}: {statements:#?}", W::PATH);
    }

    /// A batch of 2,500 rows, a third of them stale and a third missing: every outcome
    /// exact, and on PostgreSQL statements of at most `ROWS_PER_STATEMENT` rows plus one
    /// read per statement that missed.
    fn a_large_batch_reports_every_row_exactly<W: Batcher>(db: &Db, batcher: impl Fn() -> W) {
        insert(db, 1..=1700);
        // Rows 851..=1700 were written by someone else since they were read at 0.
        diesel::update(orders::table.filter(orders::id.gt(850)))
            .set(orders::version.eq(1))
            .execute(&mut db.conn())
            .unwrap();
        let mut batcher = batcher();
        let statements = batcher.record_statements();

        let rows: Vec<_> = (1..=2500).map(|id| (id, 0, BatchPatch::quantity(id as i32 + 1000))).collect();
        let report = batcher.update_batch(rows, BatchMode::Partial).unwrap();

        if BACKEND == "postgres" {
            let statements = statements.lock().unwrap();
            let count = |verb: &str| statements.iter().filter(|sql| sql.starts_with(verb)).count();
            // One read per statement that had a miss: rows 851..=2500 missed.
            let rows = diesel_occ::ROWS_PER_STATEMENT;
            let with_misses: BTreeSet<usize> = (851..=2500).map(|id| (id - 1) / rows).collect();
            assert_eq!((count("UPDATE"), count("SELECT")), (2500usize.div_ceil(rows), with_misses.len()));
        }
        for (i, outcome) in report.rows.iter().enumerate() {
            let id = i + 1;
            match outcome {
                RowOutcome::Written(1) if id <= 850 => {}
                RowOutcome::Conflict(c) if (851..=1700).contains(&id) => {
                    assert_eq!(c.current::<Order>().unwrap().id, id as i64)
                }
                RowOutcome::NotFound if id > 1700 => {}
                other => panic!("{}: row {id}: {other:?}", W::PATH),
            }
        }
        let written: i64 = orders::table.filter(orders::quantity.gt(1000)).count().get_result(&mut db.conn()).unwrap();
        assert_eq!(written, 850);
    }

    /// A key that comes again sees the first row's write, as if the rows ran one by one.
    fn a_key_repeated_in_a_batch_sees_its_earlier_write<W: Batcher>(db: &Db, batcher: impl Fn() -> W) {
        setup(db);

        let rows = vec![
            (1, 0, BatchPatch::note("first")),
            (1, 1, BatchPatch::note("second")),
            (1, 1, BatchPatch::note("stale")),
        ];
        let report = batcher().update_batch(rows, BatchMode::Partial).unwrap();

        assert!(matches!(report.rows[0], RowOutcome::Written(1)), "{:?}", report.rows);
        assert!(matches!(report.rows[1], RowOutcome::Written(2)), "{:?}", report.rows);
        match &report.rows[2] {
            RowOutcome::Conflict(c) => assert_eq!(c.found, Token::Version(2)),
            other => panic!("expected a conflict, got {other:?}"),
        }
        assert_eq!(notes(db)[0], (1, "second".into(), 2));
    }

    fn an_empty_batch_sends_nothing<W: Batcher>(_db: &Db, batcher: impl Fn() -> W) {
        let mut batcher = batcher();
        let statements = batcher.record_statements();

        let report = batcher.update_batch(Vec::new(), BatchMode::AllOrNothing).unwrap();
        let deleted = batcher.delete_batch(Vec::new(), BatchMode::AllOrNothing).unwrap();

        assert!(report.rows.is_empty() && report.applied && deleted.rows.is_empty() && deleted.applied);
        assert!(statements.lock().unwrap().is_empty(), "{}", W::PATH);
    }

    /// Inside the caller's transaction the batch is a savepoint: its rollback leaves the
    /// caller's own earlier write in place.
    fn all_or_nothing_batch_inside_a_transaction_rolls_back_only_itself<W: Batcher>(db: &Db, batcher: impl Fn() -> W) {
        setup(db);

        let report = batcher().update_batch_in_transaction((1, 0, 7), batch(), BatchMode::AllOrNothing).unwrap();

        assert!(!report.applied);
        let first = &stored(db)[0];
        assert_eq!((first.quantity, first.note.as_str(), first.version), (7, "new", 1), "{}", W::PATH);
    }

    /// A partial batch inside the caller's transaction whose rows miss keeps the caller's
    /// transaction usable and the rows it wrote.
    fn partial_batch_inside_a_transaction_keeps_what_it_wrote<W: Batcher>(db: &Db, batcher: impl Fn() -> W) {
        setup(db);

        // Row 1 as the caller's own write left it, then rows 2 (stale) and 3 (missing).
        let mut rows = batch();
        rows[0].1 = 1;
        let report = batcher().update_batch_in_transaction((1, 0, 7), rows, BatchMode::Partial).unwrap();

        assert_outcomes(&report.rows, |v| *v == 2);
        let first = &stored(db)[0];
        assert_eq!((first.quantity, first.note.as_str(), first.version), (7, "mine", 2), "{}", W::PATH);
    }

    /// Rows that set different columns (a patch's `None` fields leave some out) go in
    /// statements of their own shape: every row's outcome and value exact, a `NULL`, a
    /// quote and a `$1` among the values written as given, and on PostgreSQL one
    /// statement per shape.
    fn rows_of_different_shapes_are_each_written_as_given<W: Batcher>(db: &Db, batcher: impl Fn() -> W) {
        insert(db, 1..=60);
        // Rows 41..=60 were written by someone else since they were read at 0.
        diesel::update(orders::table.filter(orders::id.gt(40))).set(orders::version.eq(5)).execute(&mut db.conn()).unwrap();
        let patch = |id: i64| match id % 4 {
            0 => BatchPatch::note(format!("it's ${id} \"{id}\"")),
            1 => BatchPatch::quantity(id as i32),
            2 => BatchPatch { note: Some(format!("n{id}")), quantity: Some(-(id as i32)), gift_message: Some(Some(format!("g{id}"))) },
            _ => BatchPatch { gift_message: Some(None), ..BatchPatch::note("null gift") },
        };
        let mut batcher = batcher();
        // Every row's gift message starts set, so that writing NULL shows.
        diesel::update(orders::table).set(orders::gift_message.eq("before")).execute(&mut db.conn()).unwrap();
        let statements = batcher.record_statements();

        let rows: Vec<_> = (1..=70).map(|id| (id, 0, patch(id))).collect();
        let report = batcher.update_batch(rows, BatchMode::Partial).unwrap();

        for (i, outcome) in report.rows.iter().enumerate() {
            let id = i as i64 + 1;
            match outcome {
                RowOutcome::Written(1) if id <= 40 => {}
                RowOutcome::Conflict(c) if (41..=60).contains(&id) => assert_eq!(c.found, Token::Version(5)),
                RowOutcome::NotFound if id > 60 => {}
                other => panic!("{}: row {id}: {other:?}", W::PATH),
            }
        }
        for order in stored(db) {
            let id = order.id;
            let before = (String::from("new"), 1, Some(String::from("before")));
            let (expected, version) = if id > 40 {
                (before, 5)
            } else {
                let patch = patch(id);
                let gift = patch.gift_message.unwrap_or(before.2);
                ((patch.note.unwrap_or(before.0), patch.quantity.unwrap_or(before.1), gift), 1)
            };
            assert_eq!(((order.note, order.quantity, order.gift_message), order.version), (expected, version), "{}: row {id}", W::PATH);
        }
        if BACKEND == "postgres" {
            let statements = statements.lock().unwrap();
            assert_eq!(statements.iter().filter(|sql| sql.starts_with("UPDATE")).count(), 4, "{statements:#?}");
        }
    }

    /// Four workers run batches over the same 200 rows, each row's change an increment
    /// of what the worker read: a row is written exactly when its guard held, so every
    /// row's quantity counts the writes reported for it, and so does its version.
    fn concurrent_batches_lose_no_update<W: Batcher>(db: &Db, batcher: impl Fn() -> W + Sync) {
        insert(db, 1..=200);
        let start = std::sync::Barrier::new(4);
        let written: Vec<Vec<i64>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4).map(|t| {
                let (start, batcher, pool) = (&start, &batcher, &db.pool);
                s.spawn(move || {
                    let mut batcher = batcher();
                    let mut written = vec![0i64; 200];
                    start.wait();
                    for round in 0..15 {
                        let read = load_all(&mut pool.get().unwrap());
                        // Each worker walks the rows in its own order, so the workers overlap.
                        let mut rows: Vec<_> = read.iter().map(|o| (o.id, o.version, BatchPatch::quantity(o.quantity + 1))).collect();
                        rows.rotate_left((t * 50 + round * 7) % 200);
                        let ids: Vec<i64> = rows.iter().map(|row| row.0).collect();
                        let report = match batcher.update_batch(rows, BatchMode::Partial) {
                            Ok(report) => report,
                            // A deadlock or a busy database ends a batch: the next round reads again.
                            Err(e) if e.is_retryable() => continue,
                            Err(e) => panic!("{}: {e:?}", W::PATH),
                        };
                        for (id, outcome) in ids.iter().zip(&report.rows) {
                            match outcome {
                                RowOutcome::Written(_) => written[*id as usize - 1] += 1,
                                RowOutcome::Conflict(_) => {}
                                other => panic!("row {id}: {other:?}"),
                            }
                        }
                    }
                    written
                })
            }).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });

        let mut total = 0;
        for order in stored(db) {
            let reported: i64 = written.iter().map(|w| w[order.id as usize - 1]).sum();
            assert_eq!((i64::from(order.quantity), order.version), (reported + 1, reported), "{}: row {}", W::PATH, order.id);
            total += reported;
        }
        assert!(total >= 200, "every round of some worker writes something: {total}");
    }

    /// Deletes: a current row goes, a stale one conflicts with its current row, a missing
    /// one is not found; all or nothing keeps every row when one misses.
    fn delete_batches_report_every_row<W: Batcher>(db: &Db, batcher: impl Fn() -> W) {
        setup(db);
        let mut batcher = batcher();
        let rows = vec![(1, 0), (2, 0), (3, 0)];

        let all = batcher.delete_batch(rows.clone(), BatchMode::AllOrNothing).unwrap();
        assert!(!all.applied);
        assert_eq!(notes(db).len(), 2, "{}: nothing deleted", W::PATH);
        let partial = batcher.delete_batch(rows, BatchMode::Partial).unwrap();

        for report in [&all, &partial] {
            assert_outcomes(&report.rows, |_| true);
        }
        assert!(partial.applied);
        assert_eq!(notes(db), [(2, "theirs".into(), 1)], "{}", W::PATH);
    }

    /// A row refused before sending (row 1,200's version cannot advance) refuses the
    /// whole batch with nothing sent, partial or all-or-nothing, on every backend: no
    /// round of it reaches the database first.
    fn a_refused_row_stops_the_batch_before_anything_is_sent<W: Batcher>(db: &Db, batcher: impl Fn() -> W) {
        insert(db, 1..=1500);
        let mut batcher = batcher();
        let statements = batcher.record_statements();
        for mode in [BatchMode::Partial, BatchMode::AllOrNothing] {
            let rows: Vec<_> = (1..=1500)
                .map(|id| (id, if id == 1200 { i64::MAX } else { 0 }, BatchPatch::quantity(id as i32 + 1000)))
                .collect();
            match batcher.update_batch(rows, mode) {
                Err(Error::VersionOverflow { table, key, .. }) => {
                    assert_eq!((table, key.as_str()), ("orders", "1200"), "{}", W::PATH)
                }
                other => panic!("{} {mode:?}: {other:?}", W::PATH),
            }
            let sent = statements.lock().unwrap();
            assert!(!sent.iter().any(|sql| sql.contains("UPDATE")), "{} {mode:?}: {sent:#?}", W::PATH);
        }
        let written: i64 = orders::table.filter(orders::quantity.gt(1000)).count().get_result(&mut db.conn()).unwrap();
        assert_eq!(written, 0, "{}", W::PATH);
    }

    tests_on_both_paths!(
        |_: &Db| ();
        a_refused_row_stops_the_batch_before_anything_is_sent,
        partial_batch_keeps_the_rows_it_wrote_and_reports_the_others,
        all_or_nothing_batch_rolls_back_every_row_when_one_misses,
        all_or_nothing_batch_commits_when_every_row_is_current,
        a_batch_costs_the_documented_number_of_statements,
        a_large_batch_reports_every_row_exactly,
        a_key_repeated_in_a_batch_sees_its_earlier_write,
        an_empty_batch_sends_nothing,
        all_or_nothing_batch_inside_a_transaction_rolls_back_only_itself,
        partial_batch_inside_a_transaction_keeps_what_it_wrote,
        rows_of_different_shapes_are_each_written_as_given,
        concurrent_batches_lose_no_update,
        delete_batches_report_every_row,
    );

    /// An all-or-nothing batch future dropped at any point (a request timeout) leaves all
    /// of its rows written or none, and no transaction open, seen from the database.
    #[test]
    fn a_dropped_all_or_nothing_batch_leaves_all_rows_or_none() {
        use common::paths::AsyncOf;
        use diesel_occ::asynchronous::AsyncGuardedBatch;
        const ROWS: i64 = 300;
        let Some(db) = db() else { return };
        insert(&db, 1..=ROWS);
        let runtime = common::paths::runtime();
        let mut conn = Conn::connect(&db.url, &runtime);
        let rows = |version: i64, note: &str| -> Vec<_> {
            (1..=ROWS).map(|id| (id, version, BatchPatch::note(note))).collect()
        };
        // How long a whole batch takes here: the futures are dropped within twice that.
        let began = Instant::now();
        let first = runtime.block_on(Order::guarded_update_batch(&mut conn, rows(0, "timed"), BatchMode::AllOrNothing));
        assert!(first.unwrap().applied);
        let span = began.elapsed().as_micros() as u64 * 2 + 1;
        let (mut seed, mut dropped, mut applied) = (7_u64, 0, 0);
        for round in 0..120_u32 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let limit = Duration::from_micros((seed >> 33) % span);
            let version = stored(&db)[0].version;
            let batch = Order::guarded_update_batch(&mut conn, rows(version, &format!("round {round}")), BatchMode::AllOrNothing);
            match runtime.block_on(async { tokio::time::timeout(limit, batch).await }) {
                Ok(Ok(report)) => {
                    assert!(report.applied && report.all_written(), "round {round}: {:?}", report.rows.iter().find(|r| !r.is_written()));
                    applied += 1;
                }
                Ok(Err(Error::Database(diesel::result::Error::BrokenTransactionManager))) | Err(_) => {
                    // A pool discards such a connection; so does the test.
                    dropped += 1;
                    conn = Conn::connect(&db.url, &runtime);
                }
                Ok(Err(other)) => panic!("round {round}: {other:?}"),
            }
            // From the database, once the dropped connection's transaction has ended:
            // every row has the same note and version.
            let deadline = Instant::now() + Duration::from_secs(20);
            while common::open_transactions(&mut db.conn(), BACKEND) > 0 {
                assert!(Instant::now() < deadline, "a transaction stayed open");
                std::thread::sleep(Duration::from_millis(20));
            }
            let distinct: Vec<(String, i64)> = orders::table
                .select((orders::note, orders::version))
                .distinct()
                .load(&mut db.conn())
                .unwrap();
            assert_eq!(distinct.len(), 1, "round {round}: half a batch: {distinct:?}");
        }
        eprintln!("{BACKEND}: {applied} batches applied, {dropped} dropped");
        assert!(applied > 0 && dropped > 0, "both kinds of round must occur");
    }
}
