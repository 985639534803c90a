//! Bulk updates by filter: every changed row's version advances, so copies read before
//! the bulk update cannot save over it. Each body runs on both drivers (the blocking API
//! and the async one), on every backend.

use crate::common;

use common::drivers::{BulkUpdate, Update};
use common::models::{Counter, Order};
use common::schema::{counters, orders};
use diesel::dsl;
use diesel::prelude::*;
use diesel_occ::{BulkReport, Error};

/// A filter or a change setting a text column of `orders` to a literal.
type TextIs<Column> = dsl::Eq<Column, &'static str>;

for_each_backend! {
    type Db = common::TestDb<Conn>;
    type Pooled = diesel_occ::Pooled<Conn>;

    fn insert_orders(conn: &mut Pooled) {
        for (id, status) in [(1, "valid"), (2, "valid"), (3, "shipped")] {
            let order = Order { status: status.into(), ..Order::new(id, "new") };
            diesel::insert_into(orders::table).values(&order).execute(conn).unwrap();
        }
    }

    fn rows(conn: &mut Pooled) -> Vec<(i64, String, i64)> {
        orders::table
            .select((orders::id, orders::note, orders::version))
            .order(orders::id)
            .load(conn)
            .unwrap()
    }

    fn bulk_update_advances_every_changed_row<W>(db: &Db, w: impl Fn() -> W)
    where
        W: BulkUpdate<Order, TextIs<orders::status>, TextIs<orders::note>>,
    {
        let conn = &mut db.conn();
        insert_orders(conn);

        let report = w().bulk_update(orders::status.eq("valid"), orders::note.eq("held")).unwrap();

        assert_eq!(report, BulkReport { updated: 2, at_maximum: 0 });
        assert_eq!(rows(conn), [(1, "held".into(), 1), (2, "held".into(), 1), (3, "new".into(), 0)]);
    }

    fn copies_read_before_a_bulk_update_conflict<W>(db: &Db, w: impl Fn() -> W)
    where
        W: BulkUpdate<Order, dsl::LtEq<orders::id, i64>, TextIs<orders::note>>
            + Update<Order, TextIs<orders::note>>,
    {
        let (conn, w) = (&mut db.conn(), &mut w());
        insert_orders(conn);
        let copy: Order = orders::table.find(1).select(Order::as_select()).first(conn).unwrap();

        w.bulk_update(orders::id.le(2), orders::note.eq("held")).unwrap();
        let err = w.update(&copy, orders::note.eq("stale edit")).unwrap_err();

        assert_eq!(err.as_conflict().unwrap().current::<Order>().unwrap().note, "held");
    }

    /// A SMALLINT version at 32767 cannot advance: that row is left as it is (SQLite would
    /// otherwise store 32768) and counted; the others are updated.
    fn rows_at_the_maximum_are_left_alone_and_counted<W>(db: &Db, w: impl Fn() -> W)
    where
        W: BulkUpdate<
            Counter,
            dsl::Eq<counters::value, i64>,
            dsl::Eq<counters::value, dsl::Add<counters::value, i64>>,
        >,
    {
        let conn = &mut db.conn();
        for (name, rev) in [("a", 0), ("b", i16::MAX)] {
            let counter = Counter { name: name.into(), value: 0, rev };
            diesel::insert_into(counters::table).values(&counter).execute(conn).unwrap();
        }

        let report = w().bulk_update(counters::value.eq(0), counters::value.eq(counters::value + 1)).unwrap();

        assert_eq!(report, BulkReport { updated: 1, at_maximum: 1 });
        let stored: Vec<Counter> = counters::table.order(counters::name).select(Counter::as_select()).load(conn).unwrap();
        assert_eq!(
            stored,
            [
                Counter { name: "a".into(), value: 1, rev: 1 },
                Counter { name: "b".into(), value: 0, rev: i16::MAX },
            ]
        );
    }

    fn a_bulk_changeset_that_sets_the_version_is_refused<W>(db: &Db, w: impl Fn() -> W)
    where
        W: BulkUpdate<Order, dsl::Eq<orders::id, i64>, dsl::Eq<orders::version, i64>>,
    {
        let conn = &mut db.conn();
        insert_orders(conn);

        let err = w().bulk_update(orders::id.eq(1), orders::version.eq(0i64)).unwrap_err();

        assert!(matches!(&err, Error::ChangesetAssignsGuard { column, .. } if column == "version"), "{err:?}");
        assert_eq!(rows(conn)[0], (1, "new".into(), 0));
    }

    fn a_filter_that_matches_nothing_changes_nothing<W>(db: &Db, w: impl Fn() -> W)
    where
        W: BulkUpdate<Order, TextIs<orders::status>, TextIs<orders::note>>,
    {
        let conn = &mut db.conn();
        insert_orders(conn);

        let report = w().bulk_update(orders::status.eq("cancelled"), orders::note.eq("x")).unwrap();

        assert_eq!(report, BulkReport { updated: 0, at_maximum: 0 });
    }

    tests_on_both_drivers!(
        |_: &Db| ();
        bulk_update_advances_every_changed_row,
        copies_read_before_a_bulk_update_conflict,
        rows_at_the_maximum_are_left_alone_and_counted,
        a_bulk_changeset_that_sets_the_version_is_refused,
        a_filter_that_matches_nothing_changes_nothing,
    );
}
