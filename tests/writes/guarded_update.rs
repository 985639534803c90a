//! Version-guarded update, save, touch and delete on every backend. Each body runs on
//! both drivers (the blocking API and the async one).

use crate::common;

use common::drivers::{Blocking, Delete, Save, Touch, Update, UpdateInTransaction};
use common::models::{Counter, Order, OrderForm, OrderLine, OrderPatch, Quantity};
use common::schema::{counters, order_lines, orders};
use diesel::dsl;
use diesel::prelude::*;
use diesel_occ::{Error, GuardedWrite, Token};

/// The changes of a note update.
type Note = dsl::Eq<orders::note, &'static str>;
/// The changes of a quantity update of an order line.
type LineQuantity = dsl::Eq<order_lines::quantity, i32>;

/// Patches with a `'static` lifetime, as the async driver's changes must have.
static EMPTY_PATCH: OrderPatch = OrderPatch {
    note: None,
    quantity: None,
};
static QUANTITY_7: OrderPatch = OrderPatch {
    note: None,
    quantity: Some(7),
};

/// Writes of an order inside a transaction of the caller's, on either driver.
trait OrderTransactions {
    /// In one transaction: a guarded update of `stale`'s note to `stale_note`, which must
    /// be a conflict; then a guarded update of the conflict's current row, its note to
    /// `note`; commits, or rolls back with that update's error.
    fn merge_after_conflict(
        &mut self,
        stale: &Order,
        stale_note: &'static str,
        note: &'static str,
    ) -> Result<i64, Error>;
    /// In one transaction: reads order `id` (the first read fixes the transaction's
    /// snapshot on MySQL and SQLite), runs `between`, then a guarded update of the copy
    /// read, its note to `note`; commits whatever that update answered: its answer, or
    /// the transaction's failure.
    fn update_read_copy(
        &mut self,
        id: i64,
        note: &'static str,
        between: impl FnOnce() + Send,
    ) -> Result<Result<i64, Error>, Error>;
}

/// The current row of the conflict `answer` must be.
fn current_of(answer: Result<i64, Error>) -> Order {
    let err = answer.unwrap_err();
    err.as_conflict()
        .unwrap()
        .current::<Order>()
        .unwrap()
        .clone()
}

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
    type Db = common::TestDb<Conn>;
    type Pooled = diesel_occ::Pooled<Conn>;

    impl OrderTransactions for Blocking<Pooled> {
        fn merge_after_conflict(&mut self, stale: &Order, stale_note: &'static str, note: &'static str) -> Result<i64, Error> {
            self.0.transaction(|conn| {
                let current = current_of(stale.guarded_update(conn, orders::note.eq(stale_note)));
                current.guarded_update(conn, orders::note.eq(note))
            })
        }
        fn update_read_copy(&mut self, id: i64, note: &'static str, between: impl FnOnce() + Send) -> Result<Result<i64, Error>, Error> {
            self.0.transaction::<_, Error, _>(|conn| {
                let mine = load_order(conn, id).unwrap();
                between();
                Ok(mine.guarded_update(conn, orders::note.eq(note)))
            })
        }
    }

    #[cfg(all(feature = "async", any(not(feature = "mysql"), feature = "async-mysql")))]
    type Async_ = <Conn as common::paths::AsyncOf>::Async;

    #[cfg(all(feature = "async", any(not(feature = "mysql"), feature = "async-mysql")))]
    impl OrderTransactions for common::drivers::Async<Async_> {
        fn merge_after_conflict(&mut self, stale: &Order, stale_note: &'static str, note: &'static str) -> Result<i64, Error> {
            use diesel_async::AsyncConnection;
            use diesel_occ::asynchronous::AsyncGuardedWrite;
            let work = self.conn.transaction::<_, Error, _>(async move |conn: &mut Async_| {
                let stale_write = AsyncGuardedWrite::guarded_update(stale, conn, orders::note.eq(stale_note));
                let current = current_of(stale_write.await);
                AsyncGuardedWrite::guarded_update(&current, conn, orders::note.eq(note)).await
            });
            self.runtime.block_on(work)
        }
        fn update_read_copy(&mut self, id: i64, note: &'static str, between: impl FnOnce() + Send) -> Result<Result<i64, Error>, Error> {
            use diesel_async::AsyncConnection;
            use diesel_occ::asynchronous::AsyncGuardedWrite;
            let work = self.conn.transaction::<_, Error, _>(async move |conn: &mut Async_| {
                let read = orders::table.find(id).select(Order::as_select());
                let mine: Order = diesel_async::RunQueryDsl::first(read, conn).await.unwrap();
                between();
                Ok(AsyncGuardedWrite::guarded_update(&mine, conn, orders::note.eq(note)).await)
            });
            self.runtime.block_on(work)
        }
    }

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

    fn update_writes_changes_and_returns_next_version<W: Update<Order, Note>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        let order = insert_order(conn, 1, "new");

        let version = w().update(&order, orders::note.eq("gift")).unwrap();

        assert_eq!(version, 1);
        let stored = load_order(conn, 1).unwrap();
        assert_eq!((stored.note.as_str(), stored.version), ("gift", 1));
        assert_eq!(order.version, 0, "the copy is not modified by a changeset update");
    }

    fn stale_update_reports_conflict_with_current_row_and_writes_nothing<W: Update<Order, Note>>(db: &Db, w: impl Fn() -> W) {
        let (conn, w) = (&mut db.conn(), &mut w());
        let first = insert_order(conn, 1, "new");
        let stale = first.clone();
        w.update(&first, orders::note.eq("winner")).unwrap();

        let err = w.update(&stale, orders::note.eq("loser")).unwrap_err();

        let Error::Conflict(conflict) = err else { panic!("expected a conflict, got {err:?}") };
        assert_eq!(conflict.table, "orders");
        assert_eq!(conflict.key, "1");
        assert_eq!(conflict.expected, Token::Version(0));
        assert_eq!(conflict.found, Token::Version(1));
        let current = conflict.into_current::<Order>().unwrap();
        assert_eq!((current.note.as_str(), current.version), ("winner", 1));
        assert_eq!(load_order(conn, 1).unwrap().note, "winner");
    }

    fn update_of_missing_row_reports_not_found<W: Update<Order, Note>>(_: &Db, w: impl Fn() -> W) {
        let ghost = Order::new(404, "never stored");

        let err = w().update(&ghost, orders::note.eq("x")).unwrap_err();

        assert!(
            matches!(&err, Error::NotFound { table: "orders", key } if key == "404"),
            "{err:?}"
        );
    }

    fn save_writes_every_field_and_records_new_version<W: Save<Order>>(db: &Db, w: impl Fn() -> W) {
        let (conn, w) = (&mut db.conn(), &mut w());
        let mut order = insert_order(conn, 1, "new");
        order.note = "saved".into();
        order.quantity = 3;
        order.gift_message = Some("happy birthday".into());

        assert_eq!(w.save(&mut order).unwrap(), 1);
        assert_eq!(order.version, 1);
        assert_eq!(load_order(conn, 1).unwrap(), order);

        // A None is written as NULL, not skipped.
        order.gift_message = None;
        assert_eq!(w.save(&mut order).unwrap(), 2);
        assert_eq!(load_order(conn, 1).unwrap(), order);
    }

    fn stale_save_conflicts_and_leaves_row_as_the_winner_wrote_it<W: Save<Order>>(db: &Db, w: impl Fn() -> W) {
        let (conn, w) = (&mut db.conn(), &mut w());
        let mut winner = insert_order(conn, 1, "new");
        let mut loser = winner.clone();
        winner.note = "winner".into();
        w.save(&mut winner).unwrap();

        loser.note = "loser".into();
        loser.quantity = 99;
        let err = w.save(&mut loser).unwrap_err();

        assert_eq!(err.as_conflict().unwrap().current::<Order>(), Some(&winner));
        assert_eq!(loser.version, 0, "a failed save keeps the copy's version");
        assert_eq!(load_order(conn, 1).unwrap(), winner);
    }

    fn empty_patch_only_advances_version<W: Update<Order, &'static OrderPatch>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        let order = insert_order(conn, 1, "new");

        let version = w().update(&order, &EMPTY_PATCH).unwrap();

        assert_eq!(version, 1);
        let stored = load_order(conn, 1).unwrap();
        assert_eq!(stored, Order { version: 1, ..order });
    }

    fn partial_patch_writes_only_its_fields<W: Update<Order, &'static OrderPatch>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        let order = insert_order(conn, 1, "new");
        let patch = &QUANTITY_7;

        w().update(&order, patch).unwrap();

        let stored = load_order(conn, 1).unwrap();
        assert_eq!(stored, Order { quantity: 7, version: 1, ..order });
    }

    fn touch_advances_version_only<W: Touch<Order>>(db: &Db, w: impl Fn() -> W) {
        let (conn, w) = (&mut db.conn(), &mut w());
        let mut order = insert_order(conn, 1, "new");

        assert_eq!(w.touch(&mut order).unwrap(), 1);
        assert_eq!(w.touch(&mut order).unwrap(), 2);

        assert_eq!(load_order(conn, 1).unwrap(), order);
        assert_eq!(order.version, 2);
    }

    fn stale_touch_conflicts<W: Touch<Order>>(db: &Db, w: impl Fn() -> W) {
        let (conn, w) = (&mut db.conn(), &mut w());
        let mut order = insert_order(conn, 1, "new");
        let mut stale = order.clone();
        w.touch(&mut order).unwrap();

        let err = w.touch(&mut stale).unwrap_err();

        assert!(err.as_conflict().is_some(), "{err:?}");
        assert_eq!(stale.version, 0);
    }

    fn delete_removes_row_at_current_version<W: Delete<Order>>(db: &Db, w: impl Fn() -> W) {
        let (conn, w) = (&mut db.conn(), &mut w());
        let order = insert_order(conn, 1, "new");
        insert_order(conn, 2, "neighbour");

        w.delete(&order).unwrap();

        assert_eq!(load_order(conn, 1), None);
        assert!(load_order(conn, 2).is_some());
        let err = w.delete(&order).unwrap_err();
        assert!(matches!(err, Error::NotFound { .. }), "{err:?}");
    }

    fn stale_delete_conflicts_and_keeps_row<W: Update<Order, Note> + Delete<Order>>(db: &Db, w: impl Fn() -> W) {
        let (conn, w) = (&mut db.conn(), &mut w());
        let order = insert_order(conn, 1, "new");
        w.update(&order, orders::note.eq("edited")).unwrap();

        let err = w.delete(&order).unwrap_err();

        let current = err.as_conflict().unwrap().current::<Order>().unwrap();
        assert_eq!((current.note.as_str(), current.version), ("edited", 1));
        assert!(load_order(conn, 1).is_some());
    }

    fn composite_key_update_changes_only_its_row<W: Save<OrderLine>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        insert_order(conn, 1, "new");
        let lines: Vec<OrderLine> = (1..=2)
            .map(|line_no| OrderLine { order_id: 1, line_no, sku: "sku".into(), quantity: 1, version: 0 })
            .collect();
        diesel::insert_into(order_lines::table).values(&lines).execute(conn).unwrap();

        let mut first = lines[0].clone();
        first.quantity = 5;
        assert_eq!(w().save(&mut first).unwrap(), 1);

        let stored: Vec<OrderLine> = order_lines::table
            .order(order_lines::line_no)
            .select(OrderLine::as_select())
            .load(conn)
            .unwrap();
        assert_eq!(stored, vec![first, lines[1].clone()]);
    }

    fn composite_key_conflict_reports_current_line_and_key<W: Update<OrderLine, LineQuantity>>(db: &Db, w: impl Fn() -> W) {
        let (conn, w) = (&mut db.conn(), &mut w());
        insert_order(conn, 1, "new");
        let line = OrderLine { order_id: 1, line_no: 2, sku: "sku".into(), quantity: 1, version: 0 };
        diesel::insert_into(order_lines::table).values(&line).execute(conn).unwrap();
        w.update(&line, order_lines::quantity.eq(2)).unwrap();

        let err = w.update(&line, order_lines::quantity.eq(3)).unwrap_err();

        let conflict = err.as_conflict().unwrap();
        assert_eq!(conflict.key, "(1, 2)");
        assert_eq!(conflict.current::<OrderLine>().unwrap().quantity, 2);
        let missing = OrderLine { line_no: 3, ..line };
        let err = w.update(&missing, order_lines::quantity.eq(9)).unwrap_err();
        assert!(matches!(err, Error::NotFound { ref key, .. } if key == "(1, 3)"), "{err:?}");
    }

    fn renamed_smallint_version_column_is_guarded<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Save<Counter> + Update<Counter, dsl::Eq<counters::value, i64>>,
    {
        let (conn, w) = (&mut db.conn(), &mut w());
        let mut counter = Counter { name: "visits".into(), value: 0, rev: 0 };
        diesel::insert_into(counters::table).values(&counter).execute(conn).unwrap();
        let stale = counter.clone();

        counter.value = 1;
        assert_eq!(w.save(&mut counter).unwrap(), 1i16);
        let err = w.update(&stale, counters::value.eq(100)).unwrap_err();

        assert_eq!(err.as_conflict().unwrap().found, Token::Version(1));
        let stored: Counter = counters::table.select(Counter::as_select()).first(conn).unwrap();
        assert_eq!(stored, counter);
    }

    fn version_at_maximum_is_refused_without_writing<W: Update<Order, Note>>(db: &Db, w: impl Fn() -> W) {
        let (conn, w) = (&mut db.conn(), &mut w());
        insert_order(conn, 1, "new");
        set_version(conn, 1, i64::MAX);
        let order = load_order(conn, 1).unwrap();

        let err = w.update(&order, orders::note.eq("overflow")).unwrap_err();

        assert!(matches!(&err, Error::VersionOverflow { current: Token::Version(v), .. } if *v == i128::from(i64::MAX)), "{err:?}");
        assert_eq!(load_order(conn, 1).unwrap(), order);

        // One below the maximum still works and reaches it exactly.
        set_version(conn, 1, i64::MAX - 1);
        let order = load_order(conn, 1).unwrap();
        assert_eq!(w.update(&order, orders::note.eq("last")).unwrap(), i64::MAX);
    }

    fn smallint_and_integer_versions_stop_at_their_maximum<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Update<Counter, dsl::Eq<counters::value, i64>> + Update<OrderLine, LineQuantity> + Delete<OrderLine>,
    {
        let (conn, w) = (&mut db.conn(), &mut w());
        let counter = Counter { name: "c".into(), value: 0, rev: i16::MAX };
        diesel::insert_into(counters::table).values(&counter).execute(conn).unwrap();
        insert_order(conn, 1, "new");
        let line = OrderLine { order_id: 1, line_no: 1, sku: "s".into(), quantity: 1, version: i32::MAX };
        diesel::insert_into(order_lines::table).values(&line).execute(conn).unwrap();

        let err = w.update(&counter, counters::value.eq(1)).unwrap_err();
        assert!(matches!(err, Error::VersionOverflow { current: Token::Version(32767), .. }), "{err:?}");
        let err = w.update(&line, order_lines::quantity.eq(2)).unwrap_err();
        assert!(matches!(err, Error::VersionOverflow { current: Token::Version(2147483647), .. }), "{err:?}");

        // Nothing was written, and deleting needs no next version.
        let stored: OrderLine = order_lines::table.select(OrderLine::as_select()).first(conn).unwrap();
        assert_eq!(stored, line);
        w.delete(&line).unwrap();
    }

    fn update_inside_callers_transaction_rolls_back_with_it<W: UpdateInTransaction<Order, Note>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        let order = insert_order(conn, 1, "new");

        let (answer, result) = w().update_in_transaction(&order, orders::note.eq("rolled back"), false);

        assert_eq!(answer.unwrap(), 1);
        assert!(result.is_err());
        assert_eq!(load_order(conn, 1).unwrap(), order);
    }

    fn conflict_inside_callers_transaction_leaves_it_usable<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Update<Order, Note> + OrderTransactions,
    {
        let (conn, w) = (&mut db.conn(), &mut w());
        let order = insert_order(conn, 1, "new");
        let stale = order.clone();
        w.update(&order, orders::note.eq("first")).unwrap();

        let outcome = w.merge_after_conflict(&stale, "stale", "merged");

        assert_eq!(outcome.unwrap(), 2);
        assert_eq!(load_order(conn, 1).unwrap().note, "merged");
    }

    /// Another connection (a blocking one: other code of the caller's) writes after the
    /// transaction's first read.
    fn write_from_a_stale_transaction_snapshot_reports_the_latest_row<W: OrderTransactions>(db: &Db, w: impl Fn() -> W) {
        let (conn, other) = (&mut db.conn(), &mut db.conn());
        insert_order(conn, 1, "new");

        let outcome = w().update_read_copy(1, "mine", || {
            let theirs = load_order(other, 1).unwrap();
            theirs.guarded_update(other, orders::note.eq("theirs")).unwrap();
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

    fn key_that_matches_several_rows_is_reported<W: UpdateInTransaction<LineByOrderOnly, LineQuantity>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        insert_order(conn, 1, "new");
        let lines: Vec<OrderLine> = (1..=2)
            .map(|line_no| OrderLine { order_id: 1, line_no, sku: "s".into(), quantity: 1, version: 0 })
            .collect();
        diesel::insert_into(order_lines::table).values(&lines).execute(conn).unwrap();
        let line: LineByOrderOnly = order_lines::table.select(LineByOrderOnly::as_select()).first(conn).unwrap();

        let (answer, outcome) = w().update_in_transaction(&line, order_lines::quantity.eq(5), false);

        let err = answer.unwrap_err();
        assert!(matches!(err, Error::KeyNotUnique { rows: 2, .. }), "{err:?}");
        assert!(outcome.is_err());
        let quantities: Vec<i32> = order_lines::table.select(order_lines::quantity).load(conn).unwrap();
        assert_eq!(quantities, vec![1, 1], "rolled back by the caller");
    }

    fn save_skips_skip_update_fields_and_converts_serialize_as_fields<W: Save<OrderForm>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        insert_order(conn, 1, "new");
        let mut form: OrderForm = orders::table.find(1).select(OrderForm::as_select()).first(conn).unwrap();
        form.customer = "mallory".into();
        form.note = "edited".into();
        form.quantity = Quantity(4);

        assert_eq!(w().save(&mut form).unwrap(), 1);

        let stored = load_order(conn, 1).unwrap();
        assert_eq!(stored.customer, "ada", "skip_update field is not written");
        assert_eq!((stored.note.as_str(), stored.quantity, stored.version), ("edited", 4, 1));
    }

    tests_on_both_drivers!(
        |_: &Db| ();
        update_writes_changes_and_returns_next_version,
        stale_update_reports_conflict_with_current_row_and_writes_nothing,
        update_of_missing_row_reports_not_found,
        save_writes_every_field_and_records_new_version,
        stale_save_conflicts_and_leaves_row_as_the_winner_wrote_it,
        empty_patch_only_advances_version,
        partial_patch_writes_only_its_fields,
        touch_advances_version_only,
        stale_touch_conflicts,
        delete_removes_row_at_current_version,
        stale_delete_conflicts_and_keeps_row,
        composite_key_update_changes_only_its_row,
        composite_key_conflict_reports_current_line_and_key,
        renamed_smallint_version_column_is_guarded,
        version_at_maximum_is_refused_without_writing,
        smallint_and_integer_versions_stop_at_their_maximum,
        update_inside_callers_transaction_rolls_back_with_it,
        conflict_inside_callers_transaction_leaves_it_usable,
        write_from_a_stale_transaction_snapshot_reports_the_latest_row,
        key_that_matches_several_rows_is_reported,
        save_skips_skip_update_fields_and_converts_serialize_as_fields,
    );
}
