//! `#[occ(exclude)]` fields (view counters, last-seen times): their writes neither check
//! nor advance the token, and a guarded save never overwrites them.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;

use common::models::Order;
use common::schema::orders;
use diesel::prelude::*;
use diesel_occ::{Error, Guarded, GuardedWrite};

/// An order as a page that counts its views sees it.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = orders)]
struct TrackedOrder {
    id: i64,
    note: String,
    #[occ(exclude)]
    views: i64,
    #[occ(version)]
    version: i64,
}

for_each_backend! {
    type Pooled = diesel_occ::Pooled<Conn>;

    fn insert(conn: &mut Pooled) -> TrackedOrder {
        diesel::insert_into(orders::table).values(&Order::new(1, "new")).execute(conn).unwrap();
        load(conn)
    }

    fn load(conn: &mut Pooled) -> TrackedOrder {
        orders::table.find(1).select(TrackedOrder::as_select()).first(conn).unwrap()
    }

    #[test]
    fn excluded_writes_neither_check_nor_advance_the_version() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let mut order = insert(conn);
        let stale = order.clone();
        order.note = "edited".into();
        order.guarded_save(conn).unwrap();

        // A stale copy may still count a view, and that leaves the version alone.
        stale.update_excluded(conn, orders::views.eq(orders::views + 1)).unwrap();
        TrackedOrder::update_excluded_by_key(conn, &1, orders::views.eq(orders::views + 1)).unwrap();

        let stored = load(conn);
        assert_eq!((stored.views, stored.version), (2, 1));
        // So the editor's copy is still current.
        order.note = "edited again".into();
        assert_eq!(order.guarded_save(conn).unwrap(), 2);
    }

    #[test]
    fn guarded_save_leaves_excluded_fields_alone() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let mut order = insert(conn);
        for _ in 0..5 {
            order.update_excluded(conn, orders::views.eq(orders::views + 1)).unwrap();
        }

        order.note = "edited".into();
        order.guarded_save(conn).unwrap();

        assert_eq!(order.views, 0, "this copy never saw the views");
        assert_eq!(load(conn).views, 5, "the save did not write its stale count back");
    }

    #[test]
    fn update_excluded_refuses_guarded_columns_before_sending() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let order = insert(conn);

        for err in [
            order.update_excluded(conn, orders::note.eq("sneaky")).unwrap_err(),
            order.update_excluded(conn, (orders::views.eq(9), orders::version.eq(5))).unwrap_err(),
        ] {
            assert!(matches!(&err, Error::NotExcluded { table: "orders", .. }), "{err:?}");
        }
        assert_eq!(load(conn), order, "nothing was written");
    }

    #[test]
    fn update_excluded_of_a_missing_row_is_not_found() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();

        let err = TrackedOrder::update_excluded_by_key(conn, &3, orders::views.eq(1)).unwrap_err();

        assert!(matches!(&err, Error::NotFound { key, .. } if key == "3"), "{err:?}");
    }

    /// Four threads count views while four edit the note through the guard: every view
    /// is counted, and the version moved exactly once per successful edit.
    #[test]
    fn concurrent_views_and_edits_lose_nothing() {
        const PER_THREAD: usize = 20;
        let Some(db) = db() else { return };
        insert(&mut db.conn());
        let (start, edits, retries) = (Barrier::new(8), AtomicUsize::new(0), AtomicUsize::new(0));

        std::thread::scope(|s| {
            for writer in 0..8 {
                let (start, edits, retries, pool) = (&start, &edits, &retries, &db.pool);
                s.spawn(move || {
                    let mut conn = pool.get().unwrap();
                    start.wait();
                    for i in 0..PER_THREAD {
                        if writer % 2 == 0 {
                            TrackedOrder::update_excluded_by_key(&mut conn, &1, orders::views.eq(orders::views + 1))
                                .unwrap();
                            continue;
                        }
                        loop {
                            let order = load(&mut conn);
                            match order.guarded_update(&mut conn, orders::note.eq(format!("{writer}-{i}"))) {
                                Ok(_) => break,
                                Err(e) if e.is_retryable() => retries.fetch_add(1, Ordering::Relaxed),
                                Err(e) => panic!("{e}"),
                            };
                        }
                        edits.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });

        let stored = load(&mut db.conn());
        assert_eq!(stored.views, (4 * PER_THREAD) as i64, "a lost view");
        assert_eq!(stored.version, edits.into_inner() as i64);
    }
}
