//! A guarded write that fails inside the caller's transaction (a unique violation, a
//! check constraint) leaves that transaction usable on every backend: what it wrote
//! before stays, later writes go on, and the commit keeps both. PostgreSQL would abort
//! the whole transaction; the library's savepoint keeps the three backends alike. Each
//! body runs on both drivers (the blocking API and the async one).

use crate::common;

use common::drivers::{
    BatchUpdate, BulkUpdate, InTransaction, Instrument, Modify, Read, Save, Update,
};
use diesel::connection::SimpleConnection;
use diesel::dsl;
use diesel::prelude::*;
use diesel_occ::{BatchMode, GuardedWrite};
use diesel_occ::{Error, Guarded, LockWait, Pessimistic, RetryPolicy};

/// The changes of a credit update.
type Credit = dsl::Eq<accounts::credit, i32>;
/// The changes of an email update.
type Email = dsl::Eq<accounts::email, &'static str>;
/// The accounts after an id.
type IdAbove = dsl::Gt<accounts::id, i64>;

diesel::table! {
    accounts (id) {
        id -> BigInt,
        email -> Text,
        credit -> Integer,
        version -> BigInt,
    }
}

#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, Guarded)]
#[diesel(table_name = accounts)]
pub struct Account {
    id: i64,
    email: String,
    credit: i32,
    #[occ(version)]
    version: i64,
}

/// A database error that is not a conflict: the constraint refused the write.
fn assert_constraint_error<T: std::fmt::Debug>(result: Result<T, Error>) {
    match result {
        Err(Error::Database(_)) => {}
        other => panic!("expected the constraint's database error, got {other:?}"),
    }
}

for_each_backend! {
    type Db = common::TestDb<Conn>;
    type Pooled = diesel_occ::Pooled<Conn>;

    /// Three accounts `a@x`, `b@x`, `c@x` with credit 10; emails unique, credit >= 0.
    fn create_accounts(db: &Db) {
        let conn = &mut db.conn();
        let text = if BACKEND == "mysql" { "VARCHAR(64)" } else { "TEXT" };
        conn.batch_execute(&format!(
            "CREATE TABLE accounts (id BIGINT PRIMARY KEY, email {text} NOT NULL UNIQUE, \
             credit INTEGER NOT NULL CHECK (credit >= 0), version BIGINT NOT NULL)"
        ))
        .unwrap();
        let rows: Vec<Account> = ["a", "b", "c"]
            .iter()
            .zip(1..)
            .map(|(name, id)| Account { id, email: format!("{name}@x"), credit: 10, version: 0 })
            .collect();
        diesel::insert_into(accounts::table).values(&rows).execute(conn).unwrap();
    }

    /// A fresh database with the accounts of [`create_accounts`].
    fn setup() -> Option<Db> {
        let db = db()?;
        create_accounts(&db);
        Some(db)
    }

    /// (email, credit, version) of every account, by id, as committed.
    fn stored(conn: &mut Pooled) -> Vec<(String, i32, i64)> {
        accounts::table
            .order(accounts::id)
            .select((accounts::email, accounts::credit, accounts::version))
            .load(conn)
            .unwrap()
    }

    fn load(conn: &mut Pooled, id: i64) -> Account {
        accounts::table.find(id).select(Account::as_select()).first(conn).unwrap()
    }

    /// Write, fail on a unique and then a check violation, write again, commit: the two
    /// good writes are there, the failed ones left nothing.
    fn a_failed_write_leaves_the_callers_transaction_usable<W>(db: &Db, w: impl Fn() -> W)
    where
        W: InTransaction + Update<Account, Credit> + Update<Account, Email> + Save<Account> + Read<Account>,
    {
        let conn = &mut db.conn();
        let (a, b, c) = (load(conn, 1), load(conn, 2), load(conn, 3));
        w().in_transaction(|w| {
            assert_eq!(Update::<_, Credit>::update(w, &a, accounts::credit.eq(7))?, 1);
            assert_constraint_error(Update::<_, Email>::update(w, &b, accounts::email.eq("a@x")));
            assert_constraint_error(Update::<_, Credit>::update(w, &b, accounts::credit.eq(-1)));
            let mut b = b.clone();
            b.email = "c@x".into();
            assert_constraint_error(w.save(&mut b));
            assert_eq!(Update::<_, Credit>::update(w, &c, accounts::credit.eq(13))?, 1);
            // The failed writes left the second row as it was, inside the transaction too.
            assert_eq!(w.read(&2).unwrap().version, 0);
            Ok(())
        })
        .unwrap();
        assert_eq!(
            stored(conn),
            [("a@x".into(), 7, 1), ("b@x".into(), 10, 0), ("c@x".into(), 13, 1)]
        );
    }

    /// The same for a partial batch and a bulk update that fail as a whole.
    fn a_failed_batch_or_bulk_update_leaves_the_callers_transaction_usable<W>(db: &Db, w: impl Fn() -> W)
    where
        W: InTransaction
            + Update<Account, Credit>
            + Read<Account>
            + BatchUpdate<Account, Credit>
            + BulkUpdate<Account, IdAbove, Email>,
    {
        w().in_transaction(|w| {
            let first = w.read(&1).unwrap();
            assert_eq!(w.update(&first, accounts::credit.eq(1))?, 1);
            let rows = vec![(2, 0, accounts::credit.eq(5)), (3, 0, accounts::credit.eq(-5))];
            assert_constraint_error(BatchUpdate::<Account, Credit>::update_batch(w, rows, BatchMode::Partial));
            assert_constraint_error(BulkUpdate::<Account, IdAbove, Email>::bulk_update(
                w,
                accounts::id.gt(1),
                accounts::email.eq("same@x"),
            ));
            let third = w.read(&3).unwrap();
            assert_eq!(w.update(&third, accounts::credit.eq(3))?, 1);
            Ok(())
        })
        .unwrap();
        let rows = stored(&mut db.conn());
        assert_eq!((rows[0].1, rows[0].2), (1, 1));
        assert_eq!(rows[2], ("c@x".into(), 3, 1));
        // A batch that failed as a statement on one backend may have written its other
        // row on a backend that runs a batch row by row; the failed rows wrote nothing.
        assert!(rows[1] == ("b@x".into(), 10, 0) || rows[1] == ("b@x".into(), 5, 1), "{rows:?}");
    }

    /// The library's own transactions around caller code, on either driver: each runs a
    /// closure that meets a constraint error on one account's write, handles it, and then
    /// writes another account.
    trait LibraryTransactions {
        /// `with_row_locked` of account 1: account 2 takes account 1's email (refused),
        /// then account 1's credit becomes 9.
        fn handle_a_failed_write_under_a_row_lock(&mut self) -> Result<(), Error>;
        /// `guarded_operation` of `(billing, run-1)`: account 3's credit becomes -3
        /// (refused), then 8. The attempts.
        fn handle_a_failed_write_in_an_operation(&mut self) -> Result<u32, Error>;
    }

    impl LibraryTransactions for common::drivers::Blocking<Pooled> {
        fn handle_a_failed_write_under_a_row_lock(&mut self) -> Result<(), Error> {
            Account::with_row_locked(&mut self.0, &1, LockWait::Wait, |conn, a| -> Result<(), Error> {
                let b = accounts::table.find(2).select(Account::as_select()).first(conn)?;
                assert_constraint_error(b.guarded_update(conn, accounts::email.eq("a@x")));
                a.guarded_update(conn, accounts::credit.eq(9))?;
                Ok(())
            })
        }
        fn handle_a_failed_write_in_an_operation(&mut self) -> Result<u32, Error> {
            let done = diesel_occ::guarded_operation(&mut self.0, "billing", "run-1", &RetryPolicy::default(), |conn| -> Result<(), Error> {
                let c = accounts::table.find(3).select(Account::as_select()).first(conn)?;
                assert_constraint_error(c.guarded_update(conn, accounts::credit.eq(-3)));
                c.guarded_update(conn, accounts::credit.eq(8))?;
                Ok(())
            })?;
            Ok(done.attempts)
        }
    }

    #[cfg(all(feature = "async", any(not(feature = "mysql"), feature = "async-mysql")))]
    type AsyncConn = <Conn as common::paths::AsyncOf>::Async;

    #[cfg(all(feature = "async", any(not(feature = "mysql"), feature = "async-mysql")))]
    impl LibraryTransactions for common::drivers::Async<AsyncConn> {
        fn handle_a_failed_write_under_a_row_lock(&mut self) -> Result<(), Error> {
            use diesel_occ::asynchronous::{AsyncGuardedWrite, AsyncPessimistic};
            self.runtime.block_on(<Account as AsyncPessimistic>::with_row_locked(&mut self.conn, &1, LockWait::Wait, async |conn: &mut AsyncConn, a: Account| -> Result<(), Error> {
                let b: Account = diesel_async::RunQueryDsl::first(accounts::table.find(2).select(Account::as_select()), conn).await?;
                assert_constraint_error(AsyncGuardedWrite::guarded_update(&b, conn, accounts::email.eq("a@x")).await);
                AsyncGuardedWrite::guarded_update(&a, conn, accounts::credit.eq(9)).await?;
                Ok(())
            }))
        }
        fn handle_a_failed_write_in_an_operation(&mut self) -> Result<u32, Error> {
            use diesel_occ::asynchronous::AsyncGuardedWrite;
            let policy = RetryPolicy::default();
            let done = self.runtime.block_on(diesel_occ::asynchronous::guarded_operation(&mut self.conn, "billing", "run-1", &policy, async |conn: &mut AsyncConn| -> Result<(), Error> {
                let c: Account = diesel_async::RunQueryDsl::first(accounts::table.find(3).select(Account::as_select()), conn).await?;
                assert_constraint_error(AsyncGuardedWrite::guarded_update(&c, conn, accounts::credit.eq(-3)).await);
                AsyncGuardedWrite::guarded_update(&c, conn, accounts::credit.eq(8)).await?;
                Ok(())
            }))?;
            Ok(done.attempts)
        }
    }

    /// Inside the library's own transactions, the caller's closures are the caller's: a
    /// failed write the closure handles does not spoil what commits.
    fn closures_the_library_runs_in_its_transactions_can_handle_a_failed_write<W: LibraryTransactions>(db: &Db, w: impl Fn() -> W) {
        let mut w = w();
        w.handle_a_failed_write_under_a_row_lock().unwrap();
        assert_eq!(w.handle_a_failed_write_in_an_operation().unwrap(), 1);
        assert_eq!(
            stored(&mut db.conn()),
            [("a@x".into(), 9, 1), ("b@x".into(), 10, 0), ("c@x".into(), 8, 1)]
        );
    }

    /// The savepoint is PostgreSQL's, for the caller's transactions only: a
    /// read-modify-write, whose transaction is the library's, opens none.
    fn only_writes_in_the_callers_transaction_pay_for_a_savepoint_on_postgresql<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Instrument + InTransaction + Update<Account, Credit> + Modify<Account, (), Error>,
    {
        use diesel::connection::InstrumentationEvent;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;

        let w = &mut w();
        let savepoints = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&savepoints);
        w.set_instrumentation(move |event: InstrumentationEvent<'_>| {
            if let InstrumentationEvent::BeginTransaction { depth, .. } = event {
                if depth.get() > 1 {
                    counter.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        let a = load(&mut db.conn(), 1);
        w.in_transaction(|w| w.update(&a, accounts::credit.eq(2)).map(drop)).unwrap();
        let in_callers = savepoints.swap(0, Ordering::SeqCst);
        w.modify(&2, &RetryPolicy::default(), |b: &mut Account| -> Result<(), Error> {
            b.credit += 1;
            Ok(())
        })
        .unwrap();
        let in_modify = savepoints.load(Ordering::SeqCst);
        w.set_instrumentation(|_: InstrumentationEvent<'_>| {});
        let expected = usize::from(BACKEND == "postgres");
        assert_eq!((in_callers, in_modify), (expected, 0));
    }

    /// Outside any transaction a failed write is just its error; nothing changes.
    fn a_failed_write_outside_a_transaction_writes_nothing<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Update<Account, Credit> + Update<Account, Email>,
    {
        let conn = &mut db.conn();
        let w = &mut w();
        let b = load(conn, 2);
        assert_constraint_error(Update::<_, Email>::update(w, &b, accounts::email.eq("c@x")));
        assert_eq!(Update::<_, Credit>::update(w, &b, accounts::credit.eq(4)).unwrap(), 1);
        assert_eq!(stored(conn)[1], ("b@x".into(), 4, 1));
    }

    tests_on_both_drivers!(
        create_accounts;
        a_failed_write_leaves_the_callers_transaction_usable,
        a_failed_batch_or_bulk_update_leaves_the_callers_transaction_usable,
        only_writes_in_the_callers_transaction_pay_for_a_savepoint_on_postgresql,
        a_failed_write_outside_a_transaction_writes_nothing,
        closures_the_library_runs_in_its_transactions_can_handle_a_failed_write,
    );
}
