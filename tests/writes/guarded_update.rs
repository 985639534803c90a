//! Version-guarded update, save, touch and delete on every backend.

use crate::common;

use common::models::{Counter, Order, OrderForm, OrderLine, OrderPatch, Quantity};
use common::schema::{counters, order_lines, orders};
use diesel::prelude::*;
use diesel_occ::{Error, GuardedWrite, Token};

/// An entity whose declared key (`order_id` alone) does not identify one line: a mistake
/// the executor must report instead of calling it a success.
#[derive(Debug, Clone, Queryable, Selectable, Identifiable, diesel_occ::Guarded)]
#[diesel(table_name = order_lines, primary_key(order_id))]
struct LineByOrderOnly {
    order_id: i64,
    line_no: i32,
    #[occ(version)]
    version: i32,
}

for_each_backend! {
    type Pooled = diesel_occ::Pooled<Conn>;

    fn insert_order(conn: &mut Pooled, id: i64, note: &str) -> Order {
        let order = Order::new(id, note);
        diesel::insert_into(orders::table).values(&order).execute(conn).unwrap();
        order
    }

    fn load_order(conn: &mut Pooled, id: i64) -> Option<Order> {
        orders::table
            .find(id)
            .select(Order::as_select())
            .first(conn)
            .optional()
            .unwrap()
    }

    fn set_version(conn: &mut Pooled, id: i64, version: i64) {
        diesel::update(orders::table.find(id))
            .set(orders::version.eq(version))
            .execute(conn)
            .unwrap();
    }

    #[test]
    fn update_writes_changes_and_returns_next_version() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let order = insert_order(conn, 1, "new");

        let version = order.guarded_update(conn, orders::note.eq("gift")).unwrap();

        assert_eq!(version, 1);
        let stored = load_order(conn, 1).unwrap();
        assert_eq!((stored.note.as_str(), stored.version), ("gift", 1));
        assert_eq!(order.version, 0, "the copy is not modified by a changeset update");
    }

    #[test]
    fn stale_update_reports_conflict_with_current_row_and_writes_nothing() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let first = insert_order(conn, 1, "new");
        let stale = first.clone();
        first.guarded_update(conn, orders::note.eq("winner")).unwrap();

        let err = stale.guarded_update(conn, orders::note.eq("loser")).unwrap_err();

        let Error::Conflict(conflict) = err else { panic!("expected a conflict, got {err:?}") };
        assert_eq!(conflict.table, "orders");
        assert_eq!(conflict.key, "1");
        assert_eq!(conflict.expected, Token::Version(0));
        assert_eq!(conflict.found, Token::Version(1));
        let current = conflict.into_current::<Order>().unwrap();
        assert_eq!((current.note.as_str(), current.version), ("winner", 1));
        assert_eq!(load_order(conn, 1).unwrap().note, "winner");
    }

    #[test]
    fn update_of_missing_row_reports_not_found() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let ghost = Order::new(404, "never stored");

        let err = ghost.guarded_update(conn, orders::note.eq("x")).unwrap_err();

        assert!(
            matches!(&err, Error::NotFound { table: "orders", key } if key == "404"),
            "{err:?}"
        );
    }

    #[test]
    fn save_writes_every_field_and_records_new_version() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let mut order = insert_order(conn, 1, "new");
        order.note = "saved".into();
        order.quantity = 3;
        order.gift_message = Some("happy birthday".into());

        assert_eq!(order.guarded_save(conn).unwrap(), 1);
        assert_eq!(order.version, 1);
        assert_eq!(load_order(conn, 1).unwrap(), order);

        // A None is written as NULL, not skipped.
        order.gift_message = None;
        assert_eq!(order.guarded_save(conn).unwrap(), 2);
        assert_eq!(load_order(conn, 1).unwrap(), order);
    }

    #[test]
    fn stale_save_conflicts_and_leaves_row_as_the_winner_wrote_it() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let mut winner = insert_order(conn, 1, "new");
        let mut loser = winner.clone();
        winner.note = "winner".into();
        winner.guarded_save(conn).unwrap();

        loser.note = "loser".into();
        loser.quantity = 99;
        let err = loser.guarded_save(conn).unwrap_err();

        assert_eq!(err.as_conflict().unwrap().current::<Order>(), Some(&winner));
        assert_eq!(loser.version, 0, "a failed save keeps the copy's version");
        assert_eq!(load_order(conn, 1).unwrap(), winner);
    }

    #[test]
    fn empty_patch_only_advances_version() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let order = insert_order(conn, 1, "new");

        let version = order.guarded_update(conn, &OrderPatch::default()).unwrap();

        assert_eq!(version, 1);
        let stored = load_order(conn, 1).unwrap();
        assert_eq!(stored, Order { version: 1, ..order });
    }

    #[test]
    fn partial_patch_writes_only_its_fields() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let order = insert_order(conn, 1, "new");
        let patch = OrderPatch { quantity: Some(7), ..OrderPatch::default() };

        order.guarded_update(conn, &patch).unwrap();

        let stored = load_order(conn, 1).unwrap();
        assert_eq!(stored, Order { quantity: 7, version: 1, ..order });
    }

    #[test]
    fn touch_advances_version_only() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let mut order = insert_order(conn, 1, "new");

        assert_eq!(order.guarded_touch(conn).unwrap(), 1);
        assert_eq!(order.guarded_touch(conn).unwrap(), 2);

        assert_eq!(load_order(conn, 1).unwrap(), order);
        assert_eq!(order.version, 2);
    }

    #[test]
    fn stale_touch_conflicts() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let mut order = insert_order(conn, 1, "new");
        let mut stale = order.clone();
        order.guarded_touch(conn).unwrap();

        let err = stale.guarded_touch(conn).unwrap_err();

        assert!(err.as_conflict().is_some(), "{err:?}");
        assert_eq!(stale.version, 0);
    }

    #[test]
    fn delete_removes_row_at_current_version() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let order = insert_order(conn, 1, "new");
        insert_order(conn, 2, "neighbour");

        order.guarded_delete(conn).unwrap();

        assert_eq!(load_order(conn, 1), None);
        assert!(load_order(conn, 2).is_some());
        let err = order.guarded_delete(conn).unwrap_err();
        assert!(matches!(err, Error::NotFound { .. }), "{err:?}");
    }

    #[test]
    fn stale_delete_conflicts_and_keeps_row() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let order = insert_order(conn, 1, "new");
        order.guarded_update(conn, orders::note.eq("edited")).unwrap();

        let err = order.guarded_delete(conn).unwrap_err();

        let current = err.as_conflict().unwrap().current::<Order>().unwrap();
        assert_eq!((current.note.as_str(), current.version), ("edited", 1));
        assert!(load_order(conn, 1).is_some());
    }

    #[test]
    fn composite_key_update_changes_only_its_row() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        insert_order(conn, 1, "new");
        let lines: Vec<OrderLine> = (1..=2)
            .map(|line_no| OrderLine { order_id: 1, line_no, sku: "sku".into(), quantity: 1, version: 0 })
            .collect();
        diesel::insert_into(order_lines::table).values(&lines).execute(conn).unwrap();

        let mut first = lines[0].clone();
        first.quantity = 5;
        assert_eq!(first.guarded_save(conn).unwrap(), 1);

        let stored: Vec<OrderLine> = order_lines::table
            .order(order_lines::line_no)
            .select(OrderLine::as_select())
            .load(conn)
            .unwrap();
        assert_eq!(stored, vec![first, lines[1].clone()]);
    }

    #[test]
    fn composite_key_conflict_reports_current_line_and_key() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        insert_order(conn, 1, "new");
        let line = OrderLine { order_id: 1, line_no: 2, sku: "sku".into(), quantity: 1, version: 0 };
        diesel::insert_into(order_lines::table).values(&line).execute(conn).unwrap();
        line.guarded_update(conn, order_lines::quantity.eq(2)).unwrap();

        let err = line.guarded_update(conn, order_lines::quantity.eq(3)).unwrap_err();

        let conflict = err.as_conflict().unwrap();
        assert_eq!(conflict.key, "(1, 2)");
        assert_eq!(conflict.current::<OrderLine>().unwrap().quantity, 2);
        let missing = OrderLine { line_no: 3, ..line };
        let err = missing.guarded_update(conn, order_lines::quantity.eq(9)).unwrap_err();
        assert!(matches!(err, Error::NotFound { ref key, .. } if key == "(1, 3)"), "{err:?}");
    }

    #[test]
    fn renamed_smallint_version_column_is_guarded() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let mut counter = Counter { name: "visits".into(), value: 0, rev: 0 };
        diesel::insert_into(counters::table).values(&counter).execute(conn).unwrap();
        let stale = counter.clone();

        counter.value = 1;
        assert_eq!(counter.guarded_save(conn).unwrap(), 1i16);
        let err = stale.guarded_update(conn, counters::value.eq(100)).unwrap_err();

        assert_eq!(err.as_conflict().unwrap().found, Token::Version(1));
        let stored: Counter = counters::table.select(Counter::as_select()).first(conn).unwrap();
        assert_eq!(stored, counter);
    }

    #[test]
    fn version_at_maximum_is_refused_without_writing() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        insert_order(conn, 1, "new");
        set_version(conn, 1, i64::MAX);
        let order = load_order(conn, 1).unwrap();

        let err = order.guarded_update(conn, orders::note.eq("overflow")).unwrap_err();

        assert!(matches!(&err, Error::VersionOverflow { current: Token::Version(v), .. } if *v == i128::from(i64::MAX)), "{err:?}");
        assert_eq!(load_order(conn, 1).unwrap(), order);

        // One below the maximum still works and reaches it exactly.
        set_version(conn, 1, i64::MAX - 1);
        let order = load_order(conn, 1).unwrap();
        assert_eq!(order.guarded_update(conn, orders::note.eq("last")).unwrap(), i64::MAX);
    }

    #[test]
    fn smallint_and_integer_versions_stop_at_their_maximum() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let counter = Counter { name: "c".into(), value: 0, rev: i16::MAX };
        diesel::insert_into(counters::table).values(&counter).execute(conn).unwrap();
        insert_order(conn, 1, "new");
        let line = OrderLine { order_id: 1, line_no: 1, sku: "s".into(), quantity: 1, version: i32::MAX };
        diesel::insert_into(order_lines::table).values(&line).execute(conn).unwrap();

        let err = counter.guarded_update(conn, counters::value.eq(1)).unwrap_err();
        assert!(matches!(err, Error::VersionOverflow { current: Token::Version(32767), .. }), "{err:?}");
        let err = line.guarded_update(conn, order_lines::quantity.eq(2)).unwrap_err();
        assert!(matches!(err, Error::VersionOverflow { current: Token::Version(2147483647), .. }), "{err:?}");

        // Nothing was written, and deleting needs no next version.
        let stored: OrderLine = order_lines::table.select(OrderLine::as_select()).first(conn).unwrap();
        assert_eq!(stored, line);
        line.guarded_delete(conn).unwrap();
    }

    #[test]
    fn update_inside_callers_transaction_rolls_back_with_it() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let order = insert_order(conn, 1, "new");

        let result: Result<(), Error> = conn.transaction(|conn| {
            order.guarded_update(conn, orders::note.eq("rolled back"))?;
            Err(Error::Database(diesel::result::Error::RollbackTransaction))
        });

        assert!(result.is_err());
        assert_eq!(load_order(conn, 1).unwrap(), order);
    }

    #[test]
    fn conflict_inside_callers_transaction_leaves_it_usable() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let order = insert_order(conn, 1, "new");
        let stale = order.clone();
        order.guarded_update(conn, orders::note.eq("first")).unwrap();

        let outcome: Result<i64, Error> = conn.transaction(|conn| {
            let err = stale.guarded_update(conn, orders::note.eq("stale")).unwrap_err();
            let current = err.as_conflict().unwrap().current::<Order>().unwrap().clone();
            current.guarded_update(conn, orders::note.eq("merged"))
        });

        assert_eq!(outcome.unwrap(), 2);
        assert_eq!(load_order(conn, 1).unwrap().note, "merged");
    }

    #[test]
    fn write_from_a_stale_transaction_snapshot_reports_the_latest_row() {
        let Some(db) = db() else { return };
        let (conn, other) = (&mut db.conn(), &mut db.conn());
        insert_order(conn, 1, "new");

        let outcome = conn.transaction(|conn| {
            // The first read fixes this transaction's snapshot (MySQL, SQLite).
            let mine = load_order(conn, 1).unwrap();
            let theirs = load_order(other, 1).unwrap();
            theirs.guarded_update(other, orders::note.eq("theirs")).unwrap();
            Ok::<_, diesel::result::Error>(mine.guarded_update(conn, orders::note.eq("mine")))
        });

        let err = outcome.unwrap().unwrap_err();
        if BACKEND == "sqlite" {
            // A snapshot older than the last commit cannot write at all in SQLite.
            assert!(matches!(err, Error::Retryable { reason: diesel_occ::RetryReason::Busy, .. }), "{err:?}");
        } else {
            let conflict = err.as_conflict().unwrap_or_else(|| panic!("{err:?}"));
            assert_eq!(conflict.found, Token::Version(1), "the re-read must not use the old snapshot");
            assert_eq!(conflict.current::<Order>().unwrap().note, "theirs");
        }
        assert_eq!(load_order(conn, 1).unwrap().note, "theirs");
    }

    #[test]
    fn key_that_matches_several_rows_is_reported() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        insert_order(conn, 1, "new");
        let lines: Vec<OrderLine> = (1..=2)
            .map(|line_no| OrderLine { order_id: 1, line_no, sku: "s".into(), quantity: 1, version: 0 })
            .collect();
        diesel::insert_into(order_lines::table).values(&lines).execute(conn).unwrap();
        let line: LineByOrderOnly = order_lines::table.select(LineByOrderOnly::as_select()).first(conn).unwrap();

        let outcome: Result<(), Error> = conn.transaction(|conn| {
            let err = line.guarded_update(conn, order_lines::quantity.eq(5)).unwrap_err();
            assert!(matches!(err, Error::KeyNotUnique { rows: 2, .. }), "{err:?}");
            Err(err)
        });

        assert!(outcome.is_err());
        let quantities: Vec<i32> = order_lines::table.select(order_lines::quantity).load(conn).unwrap();
        assert_eq!(quantities, vec![1, 1], "rolled back by the caller");
    }

    #[test]
    fn save_skips_skip_update_fields_and_converts_serialize_as_fields() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        insert_order(conn, 1, "new");
        let mut form: OrderForm = orders::table.find(1).select(OrderForm::as_select()).first(conn).unwrap();
        form.customer = "mallory".into();
        form.note = "edited".into();
        form.quantity = Quantity(4);

        assert_eq!(form.guarded_save(conn).unwrap(), 1);

        let stored = load_order(conn, 1).unwrap();
        assert_eq!(stored.customer, "ada", "skip_update field is not written");
        assert_eq!((stored.note.as_str(), stored.quantity, stored.version), ("edited", 4, 1));
    }
}
