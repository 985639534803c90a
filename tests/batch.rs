//! Batches of guarded writes: every row's outcome, all-or-nothing or partial.

mod common;

use common::models::{Order, OrderPatch};
use common::schema::orders;
use std::sync::{Arc, Mutex};

use diesel::connection::{Connection, InstrumentationEvent};
use diesel::prelude::*;
use diesel_occ::{BatchMode, GuardedBatch, GuardedWrite, RowOutcome, Token};

for_each_backend! {
    type Pooled = diesel_occ::Pooled<Conn>;

    /// Orders 1 and 2 exist; 2 has been edited since it was read at version 0.
    fn setup(conn: &mut Pooled) {
        for id in [1, 2] {
            diesel::insert_into(orders::table).values(&Order::new(id, "new")).execute(conn).unwrap();
        }
        Order::guarded_update_by_key(conn, &2, &0, orders::note.eq("theirs")).unwrap();
    }

    fn notes(conn: &mut Pooled) -> Vec<(i64, String, i64)> {
        orders::table
            .select((orders::id, orders::note, orders::version))
            .order(orders::id)
            .load(conn)
            .unwrap()
    }

    /// Row 1 is current, row 2 is stale, row 3 does not exist.
    fn batch() -> Vec<(i64, i64, diesel::dsl::Eq<orders::note, &'static str>)> {
        vec![
            (1, 0, orders::note.eq("mine")),
            (2, 0, orders::note.eq("mine")),
            (3, 0, orders::note.eq("mine")),
        ]
    }

    fn assert_outcomes(rows: &[RowOutcome<i64>]) {
        assert!(matches!(rows[0], RowOutcome::Written(1)), "{rows:?}");
        match &rows[1] {
            RowOutcome::Conflict(conflict) => {
                assert_eq!(conflict.found, Token::Version(1));
                assert_eq!(conflict.current::<Order>().unwrap().note, "theirs");
            }
            other => panic!("expected a conflict, got {other:?}"),
        }
        assert!(matches!(rows[2], RowOutcome::NotFound), "{rows:?}");
    }

    #[test]
    fn partial_batch_keeps_the_rows_it_wrote_and_reports_the_others() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        setup(conn);

        let report = Order::guarded_update_batch(conn, batch(), BatchMode::Partial).unwrap();

        assert!(report.applied && !report.all_written());
        assert_outcomes(&report.rows);
        assert_eq!(notes(conn), [(1, "mine".into(), 1), (2, "theirs".into(), 1)]);
    }

    #[test]
    fn all_or_nothing_batch_rolls_back_every_row_when_one_misses() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        setup(conn);

        let report = Order::guarded_update_batch(conn, batch(), BatchMode::AllOrNothing).unwrap();

        assert!(!report.applied);
        assert_outcomes(&report.rows);
        assert_eq!(notes(conn), [(1, "new".into(), 0), (2, "theirs".into(), 1)], "row 1 was rolled back");
    }

    /// Every statement the connection sends from now on, from diesel's instrumentation.
    fn record_statements(conn: &mut Pooled) -> Arc<Mutex<Vec<String>>> {
        let statements = Arc::new(Mutex::new(Vec::<String>::new()));
        let seen = Arc::clone(&statements);
        conn.set_instrumentation(move |event: InstrumentationEvent<'_>| {
            if let InstrumentationEvent::StartQuery { query, .. } = event {
                seen.lock().unwrap().push(query.to_string());
            }
        });
        statements
    }

    /// The documented cost: on PostgreSQL one statement for all rows and one read of the
    /// rows that missed; elsewhere one UPDATE per row and one SELECT per miss.
    #[test]
    fn a_batch_costs_the_documented_number_of_statements() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        setup(conn);
        let statements = record_statements(conn);

        Order::guarded_update_batch(conn, batch(), BatchMode::Partial).unwrap();

        let statements = statements.lock().unwrap();
        let count = |verb: &str| statements.iter().filter(|sql| sql.starts_with(verb)).count();
        let expected = if BACKEND == "postgres" { (1, 1) } else { (3, 2) };
        assert_eq!((count("UPDATE"), count("SELECT")), expected, "{statements:#?}");
    }

    /// A batch of 2,500 rows, a third of them stale and a third missing: every outcome
    /// exact, and on PostgreSQL statements of at most `ROWS_PER_STATEMENT` rows plus one
    /// read per statement that missed.
    #[test]
    fn a_large_batch_reports_every_row_exactly() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let existing: Vec<Order> = (1..=1700).map(|id| Order::new(id, "new")).collect();
        for chunk in existing.chunks(500) {
            diesel::insert_into(orders::table).values(chunk).execute(conn).unwrap();
        }
        // Rows 851..=1700 were written by someone else since they were read at 0.
        diesel::update(orders::table.filter(orders::id.gt(850)))
            .set(orders::version.eq(1))
            .execute(conn)
            .unwrap();
        let statements = record_statements(conn);

        let rows: Vec<_> = (1..=2500).map(|id| (id, 0, orders::quantity.eq(id as i32 + 1000))).collect();
        let report = Order::guarded_update_batch(conn, rows, BatchMode::Partial).unwrap();

        if BACKEND == "postgres" {
            let statements = statements.lock().unwrap();
            let count = |verb: &str| statements.iter().filter(|sql| sql.starts_with(verb)).count();
            // One read per statement that had a miss: rows 851..=2500 missed.
            let rows = diesel_occ::ROWS_PER_STATEMENT;
            let with_misses: std::collections::BTreeSet<usize> = (851..=2500).map(|id| (id - 1) / rows).collect();
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
                other => panic!("row {id}: {other:?}"),
            }
        }
        let written: i64 = orders::table.filter(orders::quantity.gt(1000)).count().get_result(conn).unwrap();
        assert_eq!(written, 850);
    }

    /// A key that comes again sees the first row's write, as if the rows ran one by one.
    #[test]
    fn a_key_repeated_in_a_batch_sees_its_earlier_write() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        setup(conn);

        let rows = vec![
            (1, 0, orders::note.eq("first")),
            (1, 1, orders::note.eq("second")),
            (1, 1, orders::note.eq("stale")),
        ];
        let report = Order::guarded_update_batch(conn, rows, BatchMode::Partial).unwrap();

        assert!(matches!(report.rows[0], RowOutcome::Written(1)), "{:?}", report.rows);
        assert!(matches!(report.rows[1], RowOutcome::Written(2)), "{:?}", report.rows);
        match &report.rows[2] {
            RowOutcome::Conflict(c) => assert_eq!(c.found, Token::Version(2)),
            other => panic!("expected a conflict, got {other:?}"),
        }
        assert_eq!(notes(conn)[0], (1, "second".into(), 2));
    }

    #[test]
    fn an_empty_batch_sends_nothing() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let statements = record_statements(conn);
        let rows: Vec<(i64, i64, diesel::dsl::Eq<orders::note, &'static str>)> = Vec::new();

        let report = Order::guarded_update_batch(conn, rows, BatchMode::Partial).unwrap();

        assert!(report.rows.is_empty() && report.applied);
        assert!(statements.lock().unwrap().is_empty());
    }

    #[test]
    fn all_or_nothing_batch_commits_when_every_row_is_current() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        setup(conn);

        let rows = vec![(1, 0, orders::note.eq("a")), (2, 1, orders::note.eq("b"))];
        let report = Order::guarded_update_batch(conn, rows, BatchMode::AllOrNothing).unwrap();

        assert!(report.applied && report.all_written());
        assert_eq!(notes(conn), [(1, "a".into(), 1), (2, "b".into(), 2)]);
    }

    /// Inside the caller's transaction the batch is a savepoint: its rollback leaves the
    /// caller's own earlier write in place.
    #[test]
    fn all_or_nothing_batch_inside_a_transaction_rolls_back_only_itself() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        setup(conn);

        conn.transaction::<_, diesel_occ::Error, _>(|conn| {
            Order::guarded_update_by_key(conn, &1, &0, orders::quantity.eq(7))?;
            let report = Order::guarded_update_batch(conn, batch(), BatchMode::AllOrNothing)?;
            assert!(!report.applied);
            Ok(())
        })
        .unwrap();

        let first: Order = orders::table.find(1).select(Order::as_select()).first(conn).unwrap();
        assert_eq!((first.quantity, first.note.as_str(), first.version), (7, "new", 1));
    }

    /// Rows that set different columns (a patch's `None` fields leave some out) go in
    /// statements of their own shape: every row's outcome and value exact, a `NULL`, a
    /// quote and a `$1` among the values written as given, and on PostgreSQL one
    /// statement per shape.
    #[test]
    fn rows_of_different_shapes_are_each_written_as_given() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let existing: Vec<Order> = (1..=60).map(|id| Order::new(id, "new")).collect();
        diesel::insert_into(orders::table).values(&existing).execute(conn).unwrap();
        // Rows 41..=60 were written by someone else since they were read at 0.
        diesel::update(orders::table.filter(orders::id.gt(40))).set(orders::version.eq(5)).execute(conn).unwrap();
        let patch = |id: i64| match id % 3 {
            0 => OrderPatch { note: Some(format!("it's ${id} \"{id}\"")), quantity: None },
            1 => OrderPatch { note: None, quantity: Some(id as i32) },
            _ => OrderPatch { note: Some(format!("n{id}")), quantity: Some(-(id as i32)) },
        };
        let statements = record_statements(conn);

        let rows: Vec<_> = (1..=70).map(|id| (id, 0, patch(id))).collect();
        let report = Order::guarded_update_batch(conn, rows, BatchMode::Partial).unwrap();

        for (i, outcome) in report.rows.iter().enumerate() {
            let id = i as i64 + 1;
            match outcome {
                RowOutcome::Written(1) if id <= 40 => {}
                RowOutcome::Conflict(c) if (41..=60).contains(&id) => assert_eq!(c.found, Token::Version(5)),
                RowOutcome::NotFound if id > 60 => {}
                other => panic!("row {id}: {other:?}"),
            }
        }
        let stored: Vec<Order> = orders::table.order(orders::id).select(Order::as_select()).load(conn).unwrap();
        for order in stored {
            let id = order.id;
            let (note, quantity, version) = if id > 40 {
                ("new".to_string(), 1, 5)
            } else {
                let patch = patch(id);
                (patch.note.unwrap_or("new".into()), patch.quantity.unwrap_or(1), 1)
            };
            assert_eq!((order.note, order.quantity, order.version), (note, quantity, version), "row {id}");
        }
        if BACKEND == "postgres" {
            let statements = statements.lock().unwrap();
            assert_eq!(statements.iter().filter(|sql| sql.starts_with("UPDATE")).count(), 3, "{statements:#?}");
        }
    }

    /// A nullable column set to `NULL` by some rows and to text by others, in one batch.
    #[test]
    fn a_batch_writes_nulls_and_values_to_one_column() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let existing: Vec<Order> = (1..=10).map(|id| Order::new(id, "new")).collect();
        diesel::insert_into(orders::table).values(&existing).execute(conn).unwrap();
        let message = |id: i64| (id % 2 == 0).then(|| format!("gift {id}"));

        let rows: Vec<_> = (1..=10).map(|id| (id, 0, orders::gift_message.eq(message(id)))).collect();
        let report = Order::guarded_update_batch(conn, rows, BatchMode::AllOrNothing).unwrap();

        assert!(report.applied && report.all_written(), "{:?}", report.rows);
        let stored: Vec<(i64, Option<String>)> =
            orders::table.select((orders::id, orders::gift_message)).order(orders::id).load(conn).unwrap();
        assert_eq!(stored, (1..=10).map(|id| (id, message(id))).collect::<Vec<_>>());
    }

    /// Four threads run batches over the same 200 rows, each row's change an increment
    /// of what the thread read: a row is written exactly when its guard held, so every
    /// row's quantity counts the writes reported for it, and so does its version.
    #[test]
    fn concurrent_batches_lose_no_update() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let existing: Vec<Order> = (1..=200).map(|id| Order::new(id, "new")).collect();
        diesel::insert_into(orders::table).values(&existing).execute(conn).unwrap();

        let written = db.race(4, |t, conn| {
            let mut written = vec![0i64; 200];
            for round in 0..15 {
                let read: Vec<Order> =
                    orders::table.order(orders::id).select(Order::as_select()).load(conn).unwrap();
                // Each thread walks the rows in its own order, so the threads overlap.
                let mut rows: Vec<_> = read
                    .iter()
                    .map(|o| (o.id, o.version, orders::quantity.eq(o.quantity + 1)))
                    .collect();
                rows.rotate_left((t * 50 + round * 7) % 200);
                let ids: Vec<i64> = rows.iter().map(|row| row.0).collect();
                let report = match Order::guarded_update_batch(conn, rows, BatchMode::Partial) {
                    Ok(report) => report,
                    // A deadlock or a busy database ends a batch: the next round reads again.
                    Err(e) if e.is_retryable() => continue,
                    Err(e) => panic!("{e:?}"),
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
        });

        let stored: Vec<(i64, i32, i64)> =
            orders::table.select((orders::id, orders::quantity, orders::version)).order(orders::id).load(conn).unwrap();
        let mut total = 0;
        for (id, quantity, version) in stored {
            let reported: i64 = written.iter().map(|w| w[id as usize - 1]).sum();
            assert_eq!((i64::from(quantity), version), (reported + 1, reported), "row {id}");
            total += reported;
        }
        assert!(total >= 200, "every round of some thread writes something: {total}");
    }
}
