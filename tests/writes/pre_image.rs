//! Pre-image guards: the old values are the token, NULL-safe, with no schema change.
//! All columns (`#[occ(pre_image)]`), or named ones (`#[occ(compare)]`), and the ABA case
//! a pre-image cannot see.

use crate::common;

use common::drivers::{race, Read, SaveChangesFrom, SaveFrom, Update, UpdateByKey, WriteExcluded};
use common::models::Order;
use common::schema::orders;
use diesel::dsl;
use diesel::prelude::*;
use diesel_occ::{Error, Guarded, Token};

/// The changes of a note update.
type Note = dsl::Eq<orders::note, &'static str>;
/// The changes of a note update to a note read from the row.
type SameNote = dsl::Eq<orders::note, String>;
/// The changes of a status update.
type Status = dsl::Eq<orders::status, &'static str>;
/// The changes of a quantity update.
type NewQuantity = dsl::Eq<orders::quantity, i32>;
/// The changes that count a view.
type AddView = dsl::Eq<orders::views, dsl::Add<orders::views, i64>>;

/// A legacy view of `orders` with no version: every column it maps is compared, but for
/// the excluded view counter.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = orders)]
#[occ(pre_image)]
struct LegacyOrder {
    id: i64,
    customer: String,
    note: String,
    status: String,
    quantity: i32,
    gift_message: Option<String>,
    #[occ(exclude)]
    views: i64,
}

/// Only the status is compared: "ship only while still valid".
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = orders)]
struct StatusOrder {
    id: i64,
    note: String,
    #[occ(compare)]
    status: String,
}

/// Only the quantity is compared: a counter kept without a version.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = orders)]
struct QuantityOrder {
    id: i64,
    #[occ(compare)]
    quantity: i32,
}

for_each_backend! {
    type Db = common::TestDb<Conn>;
    type Pooled = diesel_occ::Pooled<Conn>;

    fn insert(conn: &mut Pooled) {
        diesel::insert_into(orders::table).values(&Order::new(1, "new")).execute(conn).unwrap();
    }

    fn legacy(conn: &mut Pooled) -> LegacyOrder {
        orders::table.find(1).select(LegacyOrder::as_select()).first(conn).unwrap()
    }

    fn the_original_copy_writes_while_the_row_is_unchanged<W: Update<LegacyOrder, Note>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        let original = legacy(conn);

        w().update(&original, orders::note.eq("edited")).unwrap();

        assert_eq!(legacy(conn), LegacyOrder { note: "edited".into(), ..original });
    }

    fn a_change_to_any_compared_column_conflicts<W: Update<LegacyOrder, Note>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        let original = legacy(conn);
        diesel::update(orders::table.find(1)).set(orders::quantity.eq(5)).execute(conn).unwrap();

        let err = w().update(&original, orders::note.eq("stale")).unwrap_err();

        let conflict = err.as_conflict().unwrap_or_else(|| panic!("{err:?}"));
        assert!(matches!((&conflict.expected, &conflict.found), (Token::PreImage(a), Token::PreImage(b)) if a != b));
        assert_eq!(conflict.current::<LegacyOrder>().unwrap().quantity, 5);
        assert_eq!(legacy(conn).note, "new", "nothing was written");
    }

    /// `gift_message` is NULL when read and still NULL: that must match (plain `=` never
    /// does). Once it holds a value, the NULL the copy read no longer matches.
    fn nulls_compare_null_safely<W: Update<LegacyOrder, Note>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        let w = &mut w();
        let original = legacy(conn);
        assert_eq!(original.gift_message, None);

        w.update(&original, orders::note.eq("still null")).unwrap();
        let copy = legacy(conn);
        diesel::update(orders::table.find(1)).set(orders::gift_message.eq("surprise")).execute(conn).unwrap();
        let err = w.update(&copy, orders::note.eq("stale")).unwrap_err();

        assert!(err.as_conflict().is_some(), "{err:?}");
        assert_eq!(legacy(conn).note, "still null");
    }

    /// The modified copy no longer holds the values it was read with: it saves by naming
    /// its original. A second copy of the same original then conflicts.
    fn save_from_the_original_writes_the_modified_copy_once<W: SaveFrom<LegacyOrder>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        let w = &mut w();
        let original = legacy(conn);
        let mut mine = original.clone();
        let mut theirs = original.clone();

        mine.note = "mine".into();
        mine.gift_message = Some("with love".into());
        w.save_from(&mut mine, &original).unwrap();
        theirs.quantity = 9;
        let err = w.save_from(&mut theirs, &original).unwrap_err();

        assert_eq!(legacy(conn), mine);
        assert_eq!(err.as_conflict().unwrap().current::<LegacyOrder>(), Some(&mine));
    }

    /// MySQL counts rows changed by default; an update that writes the values already
    /// there must still count as done (diesel asks for rows matched).
    fn a_write_that_changes_nothing_still_succeeds<W: Update<LegacyOrder, SameNote>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        let original = legacy(conn);

        w().update(&original, orders::note.eq(original.note.clone())).unwrap();

        assert_eq!(legacy(conn), original);
    }

    /// Views are excluded: counting one does not make the copy stale.
    fn excluded_columns_are_not_compared<W>(db: &Db, w: impl Fn() -> W)
    where
        W: WriteExcluded<LegacyOrder, AddView> + Update<LegacyOrder, Note>,
    {
        let conn = &mut db.conn();
        let w = &mut w();
        let original = legacy(conn);

        w.update_excluded(&original, orders::views.eq(orders::views + 1)).unwrap();
        w.update(&original, orders::note.eq("edited")).unwrap();

        let stored = legacy(conn);
        assert_eq!((stored.views, stored.note.as_str()), (1, "edited"));
    }

    fn named_columns_guard_only_what_they_name<W: Update<StatusOrder, Status>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        let w = &mut w();
        let copy: StatusOrder = orders::table.find(1).select(StatusOrder::as_select()).first(conn).unwrap();

        // Someone edits the note: the status guard does not mind.
        diesel::update(orders::table.find(1)).set(orders::note.eq("theirs")).execute(conn).unwrap();
        w.update(&copy, orders::status.eq("shipped")).unwrap();
        // The status moved on: a copy that read "valid" cannot ship again.
        let err = w.update(&copy, orders::status.eq("shipped")).unwrap_err();

        let conflict = err.as_conflict().unwrap_or_else(|| panic!("{err:?}"));
        assert_eq!(conflict.current::<StatusOrder>().unwrap().status, "shipped");
        assert!(matches!(&conflict.expected, Token::PreImage(v) if v.contains("valid")), "{conflict:?}");
    }

    /// valid -> taken -> valid between the read and the write: the status pre-image sees
    /// no change and lets the write through; the version, which moved twice, refuses it.
    fn aba_is_invisible_to_a_pre_image_but_not_to_a_version<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Update<Order, Status> + UpdateByKey<Order, Status> + Update<Order, Note> + Update<StatusOrder, Note>,
    {
        let conn = &mut db.conn();
        let w = &mut w();
        let by_status: StatusOrder = orders::table.find(1).select(StatusOrder::as_select()).first(conn).unwrap();
        let by_version: Order = orders::table.find(1).select(Order::as_select()).first(conn).unwrap();

        let v1 = w.update(&by_version, orders::status.eq("taken")).unwrap();
        UpdateByKey::<Order, Status>::update_by_key(w, &1, &v1, orders::status.eq("valid")).unwrap();

        let version_outcome = w.update(&by_version, orders::note.eq("by version"));
        let status_outcome = w.update(&by_status, orders::note.eq("by status"));

        assert!(version_outcome.unwrap_err().as_conflict().is_some());
        assert!(status_outcome.is_ok(), "the ABA case a pre-image guard cannot see");
    }

    /// Eight threads increment a quantity guarded by its own old value: exact end state.
    fn concurrent_increments_guarded_by_the_old_value_lose_no_update<W>(db: &Db, w: impl Fn() -> W + Sync)
    where
        W: Read<QuantityOrder> + Update<QuantityOrder, NewQuantity>,
    {
        const PER_THREAD: usize = 20;

        race(8, &w, |_, w| {
            let mut done = 0;
            while done < PER_THREAD {
                let copy: QuantityOrder = w.read(&1).unwrap();
                match w.update(&copy, orders::quantity.eq(copy.quantity + 1)) {
                    Ok(_) => done += 1,
                    Err(e) if e.is_retryable() => {}
                    Err(e) => panic!("{e}"),
                }
            }
        });

        let end: QuantityOrder = orders::table.find(1).select(QuantityOrder::as_select()).first(&mut db.conn()).unwrap();
        assert_eq!(end.quantity, 1 + 8 * PER_THREAD as i32, "a lost update");
    }

    fn missing_row_is_not_found<W: Update<LegacyOrder, Note>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        let ghost = LegacyOrder { id: 2, ..legacy(conn) };

        let err = w().update(&ghost, orders::note.eq("x")).unwrap_err();

        assert!(matches!(err, Error::NotFound { .. }), "{err:?}");
    }

    tests_on_both_drivers!(
        |db: &Db| insert(&mut db.conn());
        the_original_copy_writes_while_the_row_is_unchanged,
        a_change_to_any_compared_column_conflicts,
        nulls_compare_null_safely,
        save_from_the_original_writes_the_modified_copy_once,
        a_write_that_changes_nothing_still_succeeds,
        excluded_columns_are_not_compared,
        named_columns_guard_only_what_they_name,
        aba_is_invisible_to_a_pre_image_but_not_to_a_version,
        concurrent_increments_guarded_by_the_old_value_lose_no_update,
        missing_row_is_not_found,
    );

    /// Hibernate's "dirty" mode: only the columns this copy changed are compared and
    /// written, so someone else's change to another column survives.
    fn changed_columns_mode_writes_and_compares_only_what_changed<W>(db: &Db, w: impl Fn() -> W)
    where
        W: SaveChangesFrom<LegacyOrder>,
    {
        let conn = &mut db.conn();
        let original = legacy(conn);
        let mut mine = original.clone();
        mine.note = "mine".into();
        mine.gift_message = Some("from a NULL".into());
        diesel::update(orders::table.find(1)).set(orders::quantity.eq(4)).execute(conn).unwrap();

        w().save_changes_from(&mut mine, &original).unwrap();

        let stored = legacy(conn);
        assert_eq!((stored.note.as_str(), stored.gift_message.as_deref()), ("mine", Some("from a NULL")));
        assert_eq!(stored.quantity, 4, "their change to another column survives");
    }

    fn changed_columns_mode_conflicts_on_a_column_both_changed<W>(db: &Db, w: impl Fn() -> W)
    where
        W: SaveChangesFrom<LegacyOrder>,
    {
        let conn = &mut db.conn();
        let original = legacy(conn);
        let mut mine = original.clone();
        mine.note = "mine".into();
        diesel::update(orders::table.find(1)).set(orders::note.eq("theirs")).execute(conn).unwrap();

        let err = w().save_changes_from(&mut mine, &original).unwrap_err();

        assert_eq!(err.as_conflict().unwrap().current::<LegacyOrder>().unwrap().note, "theirs");
        assert_eq!(legacy(conn).note, "theirs");
    }

    /// A changed copy whose row was deleted meanwhile: `NotFound`, nothing written.
    fn changed_columns_mode_reports_a_deleted_row<W>(db: &Db, w: impl Fn() -> W)
    where
        W: SaveChangesFrom<LegacyOrder>,
    {
        let conn = &mut db.conn();
        let original = legacy(conn);
        let mut mine = original.clone();
        mine.note = "mine".into();
        diesel::delete(orders::table.find(1)).execute(conn).unwrap();

        let err = w().save_changes_from(&mut mine, &original).unwrap_err();

        assert!(matches!(err, Error::NotFound { .. }), "{err:?}");
    }

    /// Nothing changed: nothing is sent (so not even a missing row is noticed).
    fn changed_columns_mode_sends_nothing_when_nothing_changed<W>(db: &Db, w: impl Fn() -> W)
    where
        W: SaveChangesFrom<LegacyOrder>,
    {
        let conn = &mut db.conn();
        let original = legacy(conn);
        diesel::delete(orders::table.find(1)).execute(conn).unwrap();

        w().save_changes_from(&mut original.clone(), &original).unwrap();
    }

    mod changed_columns {
        use super::*;
        tests_on_both_drivers!(
            |db: &Db| insert(&mut db.conn());
            changed_columns_mode_writes_and_compares_only_what_changed,
            changed_columns_mode_conflicts_on_a_column_both_changed,
            changed_columns_mode_reports_a_deleted_row,
            changed_columns_mode_sends_nothing_when_nothing_changed,
        );
    }
}
