//! Batches of guarded writes: every row's outcome, all-or-nothing or partial.

mod common;

use common::models::Order;
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

    /// The documented cost: one UPDATE per row and one SELECT per row that missed,
    /// counted from diesel's instrumentation.
    #[test]
    fn a_batch_costs_one_statement_per_row_and_one_read_per_miss() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        setup(conn);
        let statements = Arc::new(Mutex::new(Vec::<String>::new()));
        let seen = Arc::clone(&statements);
        conn.set_instrumentation(move |event: InstrumentationEvent<'_>| {
            if let InstrumentationEvent::StartQuery { query, .. } = event {
                seen.lock().unwrap().push(query.to_string());
            }
        });

        Order::guarded_update_batch(conn, batch(), BatchMode::Partial).unwrap();

        let statements = statements.lock().unwrap();
        let count = |verb: &str| statements.iter().filter(|sql| sql.starts_with(verb)).count();
        assert_eq!((count("UPDATE"), count("SELECT")), (3, 2), "{statements:#?}");
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
}
