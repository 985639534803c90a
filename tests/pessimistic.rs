//! Pessimistic helpers: work on a row locked for the transaction; a held row is refused
//! at once with `NoWait`.

mod common;

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
}
