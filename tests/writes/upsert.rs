//! Guarded upserts (save over the row holding the copy's token, or insert a missing key)
//! and batches of guarded deletes, each checked from the database on every backend and
//! both drivers (the blocking API and the async one).

use crate::common;

use common::drivers::{race, DeleteBatch, Insert, Touch, Upsert};
use common::models::Order;
use common::schema::orders;
use diesel::prelude::*;
use diesel_occ::{BatchMode, Error, Pooled, RowOutcome, Upserted};

/// Microseconds since 1970 on 2023-11-14: an inserted row's version is past it.
const CLOCK_SEEDED: i64 = 1_700_000_000_000_000;

for_each_backend! {
    type Db = common::TestDb<Conn>;

    fn stored(conn: &mut Pooled<Conn>, id: i64) -> Option<Order> {
        orders::table.find(id).select(Order::as_select()).first(conn).optional().unwrap()
    }

    fn count_orders(conn: &mut Pooled<Conn>) -> i64 {
        orders::table.count().get_result(conn).unwrap()
    }

    /// A missing key is inserted with a seeded token; the same copy, changed, is then
    /// saved over its row.
    fn an_upsert_inserts_a_missing_key_then_updates_its_row<W: Upsert<Order>>(db: &Db, w: impl Fn() -> W) {
        let (conn, w) = (&mut db.conn(), &mut w());
        let mut order = Order::new(1, "first");
        let inserted = w.upsert(&mut order).unwrap();
        let Upserted::Inserted(version) = inserted else { panic!("{inserted:?}") };
        assert!(version > CLOCK_SEEDED, "{version}");
        assert_eq!(order.version, version);
        assert_eq!(stored(conn, 1).as_ref(), Some(&order));

        order.note = "second".into();
        order.quantity = 3;
        assert_eq!(w.upsert(&mut order).unwrap(), Upserted::Updated(version + 1));
        assert_eq!(order.version, version + 1);
        assert_eq!(stored(conn, 1), Some(order));
    }

    /// A copy whose token the row no longer holds: `Conflict` with the current row, and
    /// neither the row nor the copy changes.
    fn a_stale_upsert_conflicts_and_writes_nothing<W: Upsert<Order>>(db: &Db, w: impl Fn() -> W) {
        let (conn, w) = (&mut db.conn(), &mut w());
        let mut order = Order::new(1, "first");
        w.upsert(&mut order).unwrap();
        let mut stale = order.clone();
        order.note = "winner".into();
        w.upsert(&mut order).unwrap();

        stale.note = "loser".into();
        let before = stale.clone();
        match w.upsert(&mut stale) {
            Err(Error::Conflict(conflict)) => assert_eq!(conflict.current::<Order>(), Some(&order)),
            other => panic!("{other:?}"),
        }
        assert_eq!(stale, before);
        assert_eq!(stored(conn, 1), Some(order));
        assert_eq!(count_orders(conn), 1);
    }

    /// A new copy (version 0) whose key another writer took is a conflict with that row,
    /// never written over it; so is a copy of a row that was deleted and inserted again.
    fn an_upsert_of_a_fresh_copy_onto_a_taken_key_conflicts<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Insert<Order> + Upsert<Order> + common::drivers::Delete<Order>,
    {
        let (conn, w) = (&mut db.conn(), &mut w());
        let mut theirs = Order::new(1, "theirs");
        w.insert(&mut theirs).unwrap();
        let mut mine = Order::new(1, "mine");
        match w.upsert(&mut mine) {
            Err(Error::Conflict(conflict)) => assert_eq!(conflict.current::<Order>(), Some(&theirs)),
            other => panic!("{other:?}"),
        }
        let stale = theirs.clone();
        w.delete(&theirs).unwrap();
        let mut again = Order::new(1, "again");
        w.insert(&mut again).unwrap();
        let mut stale = stale;
        assert!(matches!(w.upsert(&mut stale), Err(Error::Conflict(_))));
        assert_eq!(stored(conn, 1), Some(again));
    }

    /// 8 threads upsert one missing key from fresh copies: one insert wins, every other
    /// thread gets a conflict carrying the winner's row (or, on SQLite, a busy turn).
    fn racing_upserts_of_one_new_key_have_one_winner<W: Upsert<Order>>(db: &Db, w: impl Fn() -> W + Sync) {
        let results: Vec<Result<Order, Error>> = race(8, w, |t, w| {
            let mut order = Order::new(7, &format!("thread {t}"));
            w.upsert(&mut order).map(|_| order)
        });
        let winners: Vec<&Order> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(winners.len(), 1, "{results:?}");
        for result in &results {
            match result {
                Ok(_) => {}
                Err(Error::Conflict(conflict)) => {
                    assert_eq!(conflict.current::<Order>(), Some(winners[0]));
                }
                Err(Error::Retryable { .. }) if BACKEND == "sqlite" => {}
                Err(other) => panic!("{other}"),
            }
        }
        assert_eq!(stored(&mut db.conn(), 7).as_ref(), Some(winners[0]));
    }

    /// 8 threads upsert changes from copies of one loaded row: exactly one update lands,
    /// the row holds the winner's values at the next version.
    fn racing_upserts_of_one_loaded_row_have_one_winner<W: Insert<Order> + Upsert<Order>>(db: &Db, w: impl Fn() -> W + Sync) {
        let mut loaded = Order::new(3, "loaded");
        w().insert(&mut loaded).unwrap();
        let results: Vec<Result<(Upserted<i64>, Order), Error>> = race(8, w, |t, w| {
            let mut copy = loaded.clone();
            copy.note = format!("thread {t}");
            w.upsert(&mut copy).map(|done| (done, copy))
        });
        let winners: Vec<&(Upserted<i64>, Order)> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(winners.len(), 1, "{results:?}");
        assert_eq!(winners[0].0, Upserted::Updated(loaded.version + 1));
        for result in &results {
            match result {
                Ok(_) | Err(Error::Conflict(_)) => {}
                Err(Error::Retryable { .. }) if BACKEND == "sqlite" => {}
                Err(other) => panic!("{other}"),
            }
        }
        let conn = &mut db.conn();
        assert_eq!(stored(conn, 3).as_ref(), Some(&winners[0].1));
        assert_eq!(count_orders(conn), 1);
    }

    /// In the caller's transaction, an upsert that ends in a conflict leaves the
    /// transaction usable (PostgreSQL would abort it on the failed insert), and what was
    /// written before stays.
    fn a_conflicting_upsert_leaves_the_callers_transaction_usable<W: Insert<Order> + Upsert<Order>>(db: &Db, w: impl Fn() -> W) {
        let (conn, w) = (&mut db.conn(), &mut w());
        let mut theirs = Order::new(1, "theirs");
        w.insert(&mut theirs).unwrap();
        let before = Order::new(2, "written first");
        let mine = Order::new(1, "mine");
        let after = Order::new(3, "written after");
        let answers = w.upsert_each_in_transaction(vec![before, mine, after]).unwrap();
        assert!(answers[0].is_ok(), "{:?}", answers[0]);
        assert!(matches!(answers[1], Err(Error::Conflict(_))), "{:?}", answers[1]);
        assert!(answers[2].is_ok(), "{:?}", answers[2]);
        assert_eq!(count_orders(conn), 3);
        assert_eq!(stored(conn, 1), Some(theirs));
    }

    /// A batch of deletes by (key, token): each row's outcome, and only the rows that
    /// held their token are gone. All-or-nothing deletes nothing when one row misses.
    fn a_delete_batch_reports_each_row<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Insert<Order> + Touch<Order> + DeleteBatch<Order>,
    {
        let (conn, w) = (&mut db.conn(), &mut w());
        let mut rows: Vec<Order> = (1..=4).map(|id| Order::new(id, "row")).collect();
        for row in &mut rows {
            w.insert(row).unwrap();
        }
        // Row 2 moves on; row 9 never existed.
        let mut moved = rows[1].clone();
        w.touch(&mut moved).unwrap();
        let batch = || {
            vec![
                (1, rows[0].version),
                (2, rows[1].version),
                (9, 0),
                (4, rows[3].version),
            ]
        };

        let report = w.delete_batch(batch(), BatchMode::AllOrNothing).unwrap();
        assert!(!report.applied);
        assert_eq!(count_orders(conn), 4, "an all-or-nothing batch with misses deletes nothing");

        let report = w.delete_batch(batch(), BatchMode::Partial).unwrap();
        assert!(report.applied);
        assert!(report.rows[0].is_written());
        match &report.rows[1] {
            RowOutcome::Conflict(conflict) => assert_eq!(conflict.current::<Order>(), Some(&moved)),
            other => panic!("{other:?}"),
        }
        assert!(matches!(report.rows[2], RowOutcome::NotFound));
        assert!(report.rows[3].is_written());
        let left: Vec<i64> = orders::table.select(orders::id).order(orders::id).load(conn).unwrap();
        assert_eq!(left, vec![2, 3]);

        let report = w
            .delete_batch(vec![(2, moved.version), (3, rows[2].version)], BatchMode::AllOrNothing)
            .unwrap();
        assert!(report.applied && report.all_written());
        assert_eq!(count_orders(conn), 0);
    }

    /// 8 threads each delete the same 20 rows in partial batches: every row is deleted
    /// exactly once, by one thread, and every other thread sees it missing.
    fn racing_delete_batches_delete_each_row_once<W>(db: &Db, w: impl Fn() -> W + Sync)
    where
        W: Insert<Order> + DeleteBatch<Order>,
    {
        let mut rows: Vec<Order> = (1..=20).map(|id| Order::new(id, "row")).collect();
        {
            let w = &mut w();
            for row in &mut rows {
                w.insert(row).unwrap();
            }
        }
        let batch: Vec<(i64, i64)> = rows.iter().map(|r| (r.id, r.version)).collect();
        let reports: Vec<Result<Vec<bool>, Error>> = race(8, w, |_, w| {
            let report = w.delete_batch(batch.clone(), BatchMode::Partial)?;
            for row in &report.rows {
                assert!(matches!(row, RowOutcome::Written(()) | RowOutcome::NotFound), "{row:?}");
            }
            Ok(report.rows.iter().map(RowOutcome::is_written).collect())
        });
        let mut deleted_by = [0; 20];
        for report in &reports {
            match report {
                Ok(written) => {
                    for (row, written) in written.iter().enumerate() {
                        deleted_by[row] += usize::from(*written);
                    }
                }
                // SQLite's writers take turns; a turn that timed out ends that batch.
                Err(Error::Retryable { .. }) if BACKEND == "sqlite" => {}
                Err(other) => panic!("{other}"),
            }
        }
        if reports.iter().all(Result::is_ok) {
            assert_eq!(deleted_by, [1; 20], "each row deleted by exactly one batch");
            assert_eq!(count_orders(&mut db.conn()), 0);
        } else {
            assert!(deleted_by.iter().all(|n| *n <= 1), "{deleted_by:?}");
        }
    }

    tests_on_both_drivers!(
        |_: &Db| ();
        an_upsert_inserts_a_missing_key_then_updates_its_row,
        a_stale_upsert_conflicts_and_writes_nothing,
        an_upsert_of_a_fresh_copy_onto_a_taken_key_conflicts,
        racing_upserts_of_one_new_key_have_one_winner,
        racing_upserts_of_one_loaded_row_have_one_winner,
        a_conflicting_upsert_leaves_the_callers_transaction_usable,
        a_delete_batch_reports_each_row,
        racing_delete_batches_delete_each_row_once,
    );
}
