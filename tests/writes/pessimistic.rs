//! Pessimistic helpers: work on a row locked for the transaction; a held row is refused
//! at once with `NoWait`.

use crate::common;

use std::sync::{Barrier, Mutex};

use common::models::Counter;
use common::schema::counters;
use diesel::prelude::*;
use diesel_occ::Error;
use diesel_occ::{LockWait, Pessimistic};

for_each_backend! {
    fn insert(db: &common::TestDb<Conn>) {
        diesel::insert_into(counters::table)
            .values(&Counter { name: "hits".into(), value: 0, rev: 0 })
            .execute(&mut db.conn())
            .unwrap();
    }

    /// 8 threads x 25 unguarded read-then-write increments, each on the locked row.
    #[test]
    fn work_on_a_locked_row_loses_no_update() {
        let Some(db) = db() else { return };
        insert(&db);
        let start = Barrier::new(8);
        let pool = &db.pool;

        std::thread::scope(|s| {
            for _ in 0..8 {
                let start = &start;
                s.spawn(move || {
                    let mut conn = pool.get().unwrap();
                    start.wait();
                    for _ in 0..25 {
                        Counter::with_row_locked(&mut conn, &"hits".to_string(), LockWait::Wait, |conn, row| {
                            diesel::update(counters::table.find(&row.name))
                                .set(counters::value.eq(row.value + 1))
                                .execute(conn)
                                .map_err(Error::from)
                        })
                        .unwrap();
                    }
                });
            }
        });

        let value: i64 = counters::table.find("hits").select(counters::value).first(&mut db.conn()).unwrap();
        assert_eq!(value, 200);
    }

    /// While one transaction holds the row, `NoWait` is refused at once (PostgreSQL,
    /// MySQL); a missing row is `NotFound`.
    #[test]
    fn no_wait_is_refused_while_another_holds_the_row() {
        let Some(db) = db() else { return };
        insert(&db);
        let conn = &mut db.conn();
        let missing = Counter::with_row_locked(conn, &"none".to_string(), LockWait::NoWait, |_, _| Ok::<_, Error>(()));
        assert!(matches!(missing, Err(Error::NotFound { .. })), "{missing:?}");
        if BACKEND == "sqlite" {
            return; // SQLite's exclusive write transaction waits for the busy timeout.
        }
        let (held, checked) = (Barrier::new(2), Barrier::new(2));
        let refused = Mutex::new(None);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut conn = db.pool.get().unwrap();
                Counter::with_row_locked(&mut conn, &"hits".to_string(), LockWait::Wait, |_, _| {
                    held.wait();
                    checked.wait();
                    Ok::<_, Error>(())
                })
                .unwrap();
            });
            held.wait();
            let mut conn = db.pool.get().unwrap();
            *refused.lock().unwrap() = Some(Counter::with_row_locked(&mut conn, &"hits".to_string(), LockWait::NoWait, |_, _| Ok::<_, Error>(())));
            checked.wait();
        });
        let refused = refused.into_inner().unwrap().unwrap();
        assert!(matches!(refused, Err(Error::LockHeld { .. })), "{refused:?}");
    }

    fn load(conn: &mut diesel_occ::Pooled<Conn>) -> Counter {
        counters::table.find("hits").select(Counter::as_select()).first(conn).unwrap()
    }

    /// A loaded copy is locked only while the row still holds its token: a current copy
    /// runs the work; a copy the row moved on from is a conflict with the current row,
    /// and its work never runs.
    #[test]
    fn a_copy_is_locked_only_while_current() {
        let Some(db) = db() else { return };
        insert(&db);
        let conn = &mut db.conn();
        let mut copy = load(conn);
        let seen = copy.with_copy_locked(conn, LockWait::Wait, |_, row| Ok::<_, Error>(row)).unwrap();
        assert_eq!(seen, copy);

        let stale = copy.clone();
        copy.value = 5;
        diesel_occ::GuardedWrite::guarded_save(&mut copy, conn).unwrap();
        let mut ran = false;
        let refused = stale.with_copy_locked(conn, LockWait::NoWait, |_, _| {
            ran = true;
            Ok::<_, Error>(())
        });
        match refused {
            Err(Error::Conflict(conflict)) => assert_eq!(conflict.current::<Counter>(), Some(&copy)),
            other => panic!("{other:?}"),
        }
        assert!(!ran);
        let gone = Counter { name: "none".into(), value: 0, rev: 0 };
        assert!(matches!(gone.with_copy_locked(conn, LockWait::Wait, |_, _| Ok::<_, Error>(())), Err(Error::NotFound { .. })));
    }

    /// 8 threads confirm the same loaded copy at once: the first to lock it applies its
    /// unguarded write; every other thread finds the row moved on (the lock waits, then
    /// sees the latest row) and gets a conflict. The row took exactly one write.
    #[test]
    fn racing_confirmations_of_one_copy_apply_once() {
        let Some(db) = db() else { return };
        insert(&db);
        let copy = load(&mut db.conn());
        let results: Vec<Result<(), Error>> = db.race(8, |_, conn| {
            copy.with_copy_locked(conn, LockWait::Wait, |conn, row| {
                diesel::update(counters::table.find(&row.name))
                    .set((counters::value.eq(row.value + 1), counters::revision.eq(row.rev + 1)))
                    .execute(conn)
                    .map(drop)
                    .map_err(Error::from)
            })
        });
        let applied = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(applied, 1, "{results:?}");
        for result in &results {
            assert!(matches!(result, Ok(()) | Err(Error::Conflict(_))), "{result:?}");
        }
        let stored = load(&mut db.conn());
        assert_eq!((stored.value, stored.rev), (1, 1));
    }
}
