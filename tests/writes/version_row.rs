//! A version row guarding a business operation (P7): the operation's own writes are plain,
//! and the guard on the version row still makes concurrent runs lose nothing.
//!
//! Blocking-only: the async API has no `guarded_operation` (version-row operations).

use crate::common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Barrier;
use std::time::Duration;

use common::models::Counter;
use common::schema::counters;
use diesel::prelude::*;
use diesel_occ::{guarded_operation, occ_versions, VersionRow, NAME_LIMIT};
use diesel_occ::{Error, RetryPolicy};

#[derive(Debug)]
enum Billing {
    NothingToBill,
    Occ(Error),
}

impl From<Error> for Billing {
    fn from(e: Error) -> Self {
        Billing::Occ(e)
    }
}

for_each_backend! {
    /// A database whose library migrations were not run: the error names the missing
    /// table and the migration to run, and nothing else is written.
    #[test]
    fn a_missing_library_table_names_the_migration() {
        use diesel::connection::SimpleConnection;
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        conn.batch_execute("DROP TABLE occ_versions; DROP TABLE occ_transitions").unwrap();

        let err = guarded_operation(conn, "invoice-run", "c-1", &RetryPolicy::default(), |_| Ok::<_, Error>(()))
            .unwrap_err();
        assert!(matches!(err, Error::MissingTable { table: "occ_versions", .. }), "{err}");
        assert!(err.to_string().contains("diesel_occ::migrations::run"), "{err}");

        let entry = diesel_occ::HistoryEntry { entity: "orders", key: "1", from: "valid", to: "shipped", actor: None };
        let err = diesel_occ::record(conn, &entry).unwrap_err();
        assert!(matches!(err, Error::MissingTable { table: "occ_transitions", .. }), "{err}");
    }

    type Pooled = diesel_occ::Pooled<Conn>;

    fn total(conn: &mut Pooled) -> i64 {
        counters::table.find("total").select(counters::value).first(conn).unwrap()
    }

    fn version(conn: &mut Pooled, name: &str, resource: &str) -> Option<i64> {
        occ_versions::table
            .find((name, resource))
            .select(occ_versions::version)
            .first(conn)
            .optional()
            .unwrap()
    }

    /// 8 threads run an operation whose writes are an unguarded read-then-write of a
    /// counter; the version row alone keeps every increment.
    #[test]
    fn concurrent_operations_lose_no_write() {
        const THREADS: usize = 8;
        const RUNS: usize = 25;
        let Some(db) = db() else { return };
        diesel::insert_into(counters::table)
            .values(&Counter { name: "total".into(), value: 0, rev: 0 })
            .execute(&mut db.conn())
            .unwrap();
        let start = Barrier::new(THREADS);
        let attempts = AtomicU32::new(0);
        let policy = RetryPolicy::default().max_attempts(10_000).max_elapsed(Duration::from_secs(300));
        let pool = &db.pool;

        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    let mut conn = pool.get().unwrap();
                    start.wait();
                    for _ in 0..RUNS {
                        let done = guarded_operation(&mut conn, "billing", "customer-1", &policy, |conn| {
                            let value: i64 = counters::table.find("total").select(counters::value).first(conn)?;
                            diesel::update(counters::table.find("total"))
                                .set(counters::value.eq(value + 1))
                                .execute(conn)?;
                            Ok::<_, Error>(value + 1)
                        })
                        .unwrap();
                        attempts.fetch_add(done.attempts, Ordering::Relaxed);
                    }
                });
            }
        });

        let conn = &mut db.conn();
        let runs = (THREADS * RUNS) as i64;
        assert_eq!(total(conn), runs, "a lost write");
        assert_eq!(version(conn, "billing", "customer-1"), Some(runs));
        let retries = attempts.load(Ordering::Relaxed) as i64 - runs;
        println!("{BACKEND}: {runs} guarded operations by {THREADS} threads, {retries} retries");
    }

    /// Two first users at once: one row is created, both runs complete.
    #[test]
    fn the_row_is_created_once_by_two_first_users_at_once() {
        let Some(db) = db() else { return };
        let start = Barrier::new(2);
        let pool = &db.pool;
        let policy = RetryPolicy::default();

        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let mut conn = pool.get().unwrap();
                    start.wait();
                    guarded_operation(&mut conn, "nightly", "2026-11-22", &policy, |_| Ok::<_, Error>(())).unwrap();
                });
            }
        });

        let rows: Vec<VersionRow> = occ_versions::table.load(&mut db.conn()).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].version, 2);
    }

    /// The operation's own error rolls back its writes and leaves the version alone.
    #[test]
    fn a_refusing_operation_writes_nothing() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        diesel::insert_into(counters::table)
            .values(&Counter { name: "total".into(), value: 5, rev: 0 })
            .execute(conn)
            .unwrap();

        let result = guarded_operation(conn, "billing", "customer-2", &RetryPolicy::default(), |conn| {
            diesel::update(counters::table.find("total")).set(counters::value.eq(0)).execute(conn).map_err(Error::from)?;
            Err::<(), _>(Billing::NothingToBill)
        });

        match result {
            Err(Billing::NothingToBill) => {}
            Err(Billing::Occ(e)) => panic!("{e}"),
            Ok(_) => panic!("the operation refused"),
        }
        assert_eq!(total(conn), 5, "the operation's write was rolled back");
        assert_eq!(version(conn, "billing", "customer-2"), Some(0));
    }

    /// Names compare exactly (case, trailing spaces, accents) and bad names are refused
    /// before anything is sent.
    #[test]
    fn names_are_exact_and_bad_ones_are_refused() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let policy = RetryPolicy::default();
        for name in ["Report", "report", "report ", "rapport", "rapporté", "ключ", "a'; DROP TABLE occ_versions; --"] {
            guarded_operation(conn, name, "r", &policy, |_| Ok::<_, Error>(())).unwrap();
        }
        let long = "x".repeat(NAME_LIMIT);
        guarded_operation(conn, &long, "r", &policy, |_| Ok::<_, Error>(())).unwrap();

        let count: i64 = occ_versions::table.count().get_result(conn).unwrap();
        assert_eq!(count, 8, "every name is its own row");
        for bad in ["x".repeat(10_000), String::new(), "nul\0byte".into()] {
            let err = guarded_operation(conn, &bad, "r", &policy, |_| Ok::<_, Error>(())).unwrap_err();
            assert!(matches!(err, Error::InvalidName { what: "lock name", .. }), "{err}");
        }
        let err = guarded_operation(conn, "ok", &"é".repeat(NAME_LIMIT + 1), &policy, |_| Ok::<_, Error>(())).unwrap_err();
        assert!(matches!(err, Error::InvalidName { what: "resource", .. }), "{err}");
        assert_eq!(occ_versions::table.count().get_result::<i64>(conn).unwrap(), 8);
    }
}
