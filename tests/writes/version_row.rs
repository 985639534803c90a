//! A version row guarding a business operation (P7): the operation's own writes are plain,
//! and the guard on the version row still makes concurrent runs lose nothing. Each body
//! runs on both drivers (`guarded_operation`, `asynchronous::guarded_operation`).

use crate::common;

use std::time::Duration;

use common::models::Counter;
use common::schema::counters;
use diesel::prelude::*;
use diesel_occ::{occ_versions, VersionRow, NAME_LIMIT};
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

/// The guarded operations of these tests, on either driver.
trait Operations {
    /// An operation on `(billing, customer)` that adds one to counter `total` by an
    /// unguarded read-then-write: the attempts it took.
    fn add_one(&mut self, customer: &str, policy: &RetryPolicy) -> Result<u32, Error>;
    /// An operation on `(name, resource)` that does nothing.
    fn nothing(&mut self, name: &str, resource: &str) -> Result<(), Error>;
    /// An operation on `(billing, customer)` that sets `total` to 0 and then refuses with
    /// its own error.
    fn zero_then_refuse(&mut self, customer: &str) -> Result<(), Billing>;
}

for_each_backend! {
    type Db = common::TestDb<Conn>;
    type Pooled = diesel_occ::Pooled<Conn>;

    impl Operations for common::drivers::Blocking<Pooled> {
        fn add_one(&mut self, customer: &str, policy: &RetryPolicy) -> Result<u32, Error> {
            let done = diesel_occ::guarded_operation(&mut self.0, "billing", customer, policy, |conn| {
                let value: i64 = counters::table.find("total").select(counters::value).first(conn)?;
                diesel::update(counters::table.find("total")).set(counters::value.eq(value + 1)).execute(conn)?;
                Ok::<_, Error>(value + 1)
            })?;
            Ok(done.attempts)
        }
        fn nothing(&mut self, name: &str, resource: &str) -> Result<(), Error> {
            diesel_occ::guarded_operation(&mut self.0, name, resource, &RetryPolicy::default(), |_| Ok::<_, Error>(())).map(drop)
        }
        fn zero_then_refuse(&mut self, customer: &str) -> Result<(), Billing> {
            diesel_occ::guarded_operation(&mut self.0, "billing", customer, &RetryPolicy::default(), |conn| {
                diesel::update(counters::table.find("total")).set(counters::value.eq(0)).execute(conn).map_err(Error::from)?;
                Err::<(), _>(Billing::NothingToBill)
            })
            .map(drop)
        }
    }

    #[cfg(all(feature = "async", any(not(feature = "mysql"), feature = "async-mysql")))]
    type AsyncConn = <Conn as common::paths::AsyncOf>::Async;

    #[cfg(all(feature = "async", any(not(feature = "mysql"), feature = "async-mysql")))]
    impl Operations for common::drivers::Async<AsyncConn> {
        fn add_one(&mut self, customer: &str, policy: &RetryPolicy) -> Result<u32, Error> {
            let done = self.runtime.block_on(diesel_occ::asynchronous::guarded_operation(&mut self.conn, "billing", customer, policy, async |conn: &mut AsyncConn| {
                let value: i64 = diesel_async::RunQueryDsl::first(counters::table.find("total").select(counters::value), conn).await?;
                let add = diesel::update(counters::table.find("total")).set(counters::value.eq(value + 1));
                diesel_async::RunQueryDsl::execute(add, conn).await?;
                Ok::<_, Error>(value + 1)
            }))?;
            Ok(done.attempts)
        }
        fn nothing(&mut self, name: &str, resource: &str) -> Result<(), Error> {
            let policy = RetryPolicy::default();
            self.runtime
                .block_on(diesel_occ::asynchronous::guarded_operation(&mut self.conn, name, resource, &policy, async |_: &mut AsyncConn| Ok::<_, Error>(())))
                .map(drop)
        }
        fn zero_then_refuse(&mut self, customer: &str) -> Result<(), Billing> {
            let policy = RetryPolicy::default();
            self.runtime
                .block_on(diesel_occ::asynchronous::guarded_operation(&mut self.conn, "billing", customer, &policy, async |conn: &mut AsyncConn| {
                    let zero = diesel::update(counters::table.find("total")).set(counters::value.eq(0));
                    diesel_async::RunQueryDsl::execute(zero, conn).await.map_err(Error::from)?;
                    Err::<(), _>(Billing::NothingToBill)
                }))
                .map(drop)
        }
    }

    /// A database whose library migrations were not run: the error names the missing
    /// table and the migration to run, and nothing else is written.
    fn a_missing_library_table_names_the_migration<W: Operations>(db: &Db, w: impl Fn() -> W) {
        use diesel::connection::SimpleConnection;
        let conn = &mut db.conn();
        conn.batch_execute("DROP TABLE occ_versions; DROP TABLE occ_transitions").unwrap();

        let err = w().nothing("invoice-run", "c-1").unwrap_err();
        assert!(matches!(err, Error::MissingTable { table: "occ_versions", .. }), "{err}");
        assert!(err.to_string().contains("diesel_occ::migrations::run"), "{err}");

        let entry = diesel_occ::HistoryEntry { entity: "orders", key: "1", from: "valid", to: "shipped", actor: None };
        let err = diesel_occ::record(conn, &entry).unwrap_err();
        assert!(matches!(err, Error::MissingTable { table: "occ_transitions", .. }), "{err}");
    }

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

    fn insert_total(db: &Db, value: i64) {
        diesel::insert_into(counters::table)
            .values(&Counter { name: "total".into(), value, rev: 0 })
            .execute(&mut db.conn())
            .unwrap();
    }

    /// 8 threads run an operation whose writes are an unguarded read-then-write of a
    /// counter; the version row alone keeps every increment.
    fn concurrent_operations_lose_no_write<W: Operations>(db: &Db, w: impl Fn() -> W + Sync) {
        const THREADS: usize = 8;
        const RUNS: usize = 25;
        insert_total(db, 0);
        let policy = RetryPolicy::default().max_attempts(10_000).max_elapsed(Duration::from_secs(300));

        let attempts: Vec<u32> = common::drivers::race(THREADS, w, |_, w| {
            (0..RUNS).map(|_| w.add_one("customer-1", &policy).unwrap()).sum()
        });

        let conn = &mut db.conn();
        let runs = (THREADS * RUNS) as i64;
        assert_eq!(total(conn), runs, "a lost write");
        assert_eq!(version(conn, "billing", "customer-1"), Some(runs));
        let retries = attempts.iter().sum::<u32>() as i64 - runs;
        println!("{BACKEND}: {runs} guarded operations by {THREADS} threads, {retries} retries");
    }

    /// Two first users at once: one row is created, both runs complete.
    fn the_row_is_created_once_by_two_first_users_at_once<W: Operations>(db: &Db, w: impl Fn() -> W + Sync) {
        common::drivers::race(2, w, |_, w| w.nothing("nightly", "2026-11-22").unwrap());

        let rows: Vec<VersionRow> = occ_versions::table.load(&mut db.conn()).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].version, 2);
    }

    /// The operation's own error rolls back its writes and leaves the version alone.
    fn a_refusing_operation_writes_nothing<W: Operations>(db: &Db, w: impl Fn() -> W) {
        insert_total(db, 5);

        match w().zero_then_refuse("customer-2") {
            Err(Billing::NothingToBill) => {}
            Err(Billing::Occ(e)) => panic!("{e}"),
            Ok(_) => panic!("the operation refused"),
        }
        let conn = &mut db.conn();
        assert_eq!(total(conn), 5, "the operation's write was rolled back");
        assert_eq!(version(conn, "billing", "customer-2"), Some(0));
    }

    /// Names compare exactly (case, trailing spaces, accents) and bad names are refused
    /// before anything is sent.
    fn names_are_exact_and_bad_ones_are_refused<W: Operations>(db: &Db, w: impl Fn() -> W) {
        let mut w = w();
        for name in ["Report", "report", "report ", "rapport", "rapporté", "ключ", "a'; DROP TABLE occ_versions; --"] {
            w.nothing(name, "r").unwrap();
        }
        w.nothing(&"x".repeat(NAME_LIMIT), "r").unwrap();

        let conn = &mut db.conn();
        let count: i64 = occ_versions::table.count().get_result(conn).unwrap();
        assert_eq!(count, 8, "every name is its own row");
        for bad in ["x".repeat(10_000), String::new(), "nul\0byte".into()] {
            let err = w.nothing(&bad, "r").unwrap_err();
            assert!(matches!(err, Error::InvalidName { what: "lock name", .. }), "{err}");
        }
        let err = w.nothing("ok", &"é".repeat(NAME_LIMIT + 1)).unwrap_err();
        assert!(matches!(err, Error::InvalidName { what: "resource", .. }), "{err}");
        assert_eq!(occ_versions::table.count().get_result::<i64>(conn).unwrap(), 8);
    }

    tests_on_both_drivers!(
        |_: &Db| ();
        a_missing_library_table_names_the_migration,
        concurrent_operations_lose_no_write,
        the_row_is_created_once_by_two_first_users_at_once,
        a_refusing_operation_writes_nothing,
        names_are_exact_and_bad_ones_are_refused,
    );
}
