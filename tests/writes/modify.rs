//! Read-modify-write with retry: every attempt reads, changes and writes under the guard;
//! conflicts start again from the read; the caller's own errors stop it unchanged. Each
//! body runs on both drivers (the blocking API and the async one), on every backend.

use crate::common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::drivers::{Modify, ModifyPooled};
use common::models::{Counter, Order};
use common::schema::{counters, orders};
use diesel::prelude::*;
use diesel_occ::{Contention, Error, GuardedWrite, RetryPolicy};

/// The caller's own error type, with diesel-occ's errors folded in.
#[derive(Debug)]
enum ShopError {
    AlreadyCancelled,
    Occ(Error),
}

impl From<Error> for ShopError {
    fn from(e: Error) -> Self {
        ShopError::Occ(e)
    }
}

for_each_backend! {
    type Db = common::TestDb<Conn>;
    type Pooled = diesel_occ::Pooled<Conn>;

    fn insert_order(conn: &mut Pooled, status: &str) {
        let mut order = Order::new(1, "new");
        order.status = status.into();
        diesel::insert_into(orders::table).values(&order).execute(conn).unwrap();
    }

    fn load(conn: &mut Pooled) -> Order {
        orders::table.find(1).select(Order::as_select()).first(conn).unwrap()
    }

    fn modify_writes_the_change_and_returns_value_token_and_attempts<W: Modify<Order, usize, Error>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        insert_order(conn, "valid");

        let done = w().modify(&1, &RetryPolicy::default(), |order| {
            order.note.push_str(" + gift wrap");
            Ok::<_, Error>(order.note.len())
        })
        .unwrap();

        assert_eq!((done.value, done.token, done.attempts), ("new + gift wrap".len(), 1, 1));
        assert_eq!(load(conn), done.row);
    }

    fn the_callers_own_error_stops_it_unchanged_and_nothing_is_written<W: Modify<Order, (), ShopError>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        insert_order(conn, "cancelled");

        let result = w().modify(&1, &RetryPolicy::default(), |order| {
            if order.status == "cancelled" {
                return Err(ShopError::AlreadyCancelled);
            }
            order.status = "shipped".into();
            Ok(())
        });

        assert!(matches!(result, Err(ShopError::AlreadyCancelled)), "{result:?}");
        assert_eq!((load(conn).status.as_str(), load(conn).version), ("cancelled", 0));
    }

    fn a_missing_row_is_not_found_without_calling_the_closure<W: Modify<Order, (), ShopError>>(_: &Db, w: impl Fn() -> W) {
        let result = w().modify(&7, &RetryPolicy::default(), |_| -> Result<(), ShopError> {
            panic!("no row to change")
        });

        assert!(matches!(result, Err(ShopError::Occ(Error::NotFound { .. }))), "{result:?}");
    }

    /// Another connection writes between an attempt's read and its write; the hook sees
    /// the conflict and the retry reads again, so it sees that write. (Not on SQLite: its
    /// attempt holds the write lock from its first read, so no writer gets in between.)
    /// Optimistic reads throughout: a locked read (the default once a row is contended)
    /// would make the closure's second writer wait for this very transaction.
    fn a_conflict_starts_again_from_a_fresh_read<P: ModifyPooled<Order, (), Error>>(db: &Db, pool: &P) {
        if BACKEND == "sqlite" {
            return;
        }
        let conn = &mut db.conn();
        insert_order(conn, "valid");
        let retries = Arc::new(AtomicU32::new(0));
        let seen = Arc::clone(&retries);
        let policy = RetryPolicy::default().contention(Contention::Optimistic).on_retry(move |event| {
            assert!(event.error.as_conflict().is_some(), "{}", event.error);
            seen.fetch_add(1, Ordering::Relaxed);
        });
        let calls = Arc::new(AtomicU32::new(0));
        let (called, others) = (Arc::clone(&calls), db.pool.clone());

        let done = pool.modify_pooled(&1, &policy, move |order| {
            if called.fetch_add(1, Ordering::Relaxed) == 0 {
                let other = &mut others.get().unwrap();
                Order::guarded_update_by_key(other, &1, &0, orders::quantity.eq(5))?;
            }
            order.note = format!("seen quantity {}", order.quantity);
            Ok::<_, Error>(())
        })
        .unwrap();

        assert_eq!((done.attempts, calls.load(Ordering::Relaxed), retries.load(Ordering::Relaxed)), (2, 2, 1));
        assert_eq!(load(conn).note, "seen quantity 5", "the retry read the other write");
        assert_eq!(load(conn).version, 2);
    }

    /// Inside the caller's transaction one attempt runs, and its failure comes back as it
    /// is, for the caller to retry its whole transaction: a conflict on PostgreSQL and
    /// MySQL; on SQLite the caller's (deferred) transaction cannot write after another
    /// connection did, a retryable busy error.
    fn inside_the_callers_transaction_there_is_one_attempt<W: Modify<Order, (), Error>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        insert_order(conn, "valid");

        let calls = Arc::new(AtomicU32::new(0));
        let (called, others) = (Arc::clone(&calls), db.pool.clone());
        // Optimistic: a locked read would make the closure's writer wait for us.
        let policy = RetryPolicy::default().contention(Contention::Optimistic);
        let result = w()
            .modify_in_transaction(&1, &policy, move |order| {
                called.fetch_add(1, Ordering::Relaxed);
                let other = &mut others.get().unwrap();
                Order::guarded_update_by_key(other, &1, &0, orders::quantity.eq(5))?;
                order.note = "mine".into();
                Ok::<_, Error>(())
            })
            .unwrap();

        assert_eq!(calls.load(Ordering::Relaxed), 1);
        match result {
            Err(Error::Conflict(c)) if BACKEND != "sqlite" => assert_eq!(c.found, diesel_occ::Token::Version(1)),
            Err(Error::Retryable { .. }) if BACKEND == "sqlite" => {}
            other => panic!("{other:?}"),
        }
        assert_eq!((load(conn).note.as_str(), load(conn).quantity), ("new", 5));
    }

    /// Any guard kind: here a last-modified timestamp, which the write advances.
    #[cfg(feature = "chrono")]
    fn modify_works_with_a_timestamp_guard<W: Modify<common::models::Document, (), Error>>(db: &Db, w: impl Fn() -> W) {
        use common::models::Document;
        use common::schema::documents;
        let conn = &mut db.conn();
        let stamp = chrono::DateTime::UNIX_EPOCH.naive_utc();
        let doc = Document { id: 1, body: "a".into(), hits: 0, last_modified: stamp };
        diesel::insert_into(documents::table).values(&doc).execute(conn).unwrap();

        let done = w().modify(&1, &RetryPolicy::default(), |d| {
            d.hits += 1;
            Ok::<_, Error>(())
        })
        .unwrap();

        assert!(done.token > stamp);
        let stored: Document = documents::table.find(1).first(conn).unwrap();
        assert_eq!(stored, done.row);
    }

    /// Eight threads add 50 each to one counter, each attempt on a connection from
    /// `pool`; returns each modify's attempts.
    fn eight_threads_add_to_one_counter<P: ModifyPooled<Counter, (), Error>>(db: &Db, pool: &P, policy: &RetryPolicy) -> Vec<u32> {
        const THREADS: usize = 8;
        const PER_THREAD: usize = 50;
        let conn = &mut db.conn();
        diesel::insert_into(counters::table)
            .values(&Counter { name: "hits".into(), value: 0, rev: 0 })
            .execute(conn)
            .unwrap();
        let start = Barrier::new(THREADS);
        let runtime = tokio::runtime::Handle::try_current().ok();

        let attempts: Vec<u32> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..THREADS)
                .map(|_| {
                    s.spawn(|| {
                        let _in_runtime = runtime.as_ref().map(tokio::runtime::Handle::enter);
                        start.wait();
                        (0..PER_THREAD)
                            .map(|_| {
                                pool.modify_pooled(&"hits".to_string(), policy, |c| {
                                    c.value += 1;
                                    Ok::<_, Error>(())
                                })
                                .unwrap()
                                .attempts
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            workers.into_iter().flat_map(|w| w.join().unwrap()).collect()
        });

        let counter: Counter = counters::table.find("hits").first(conn).unwrap();
        let writes = (THREADS * PER_THREAD) as u32;
        assert_eq!(counter.value, writes as i64, "a lost update");
        assert_eq!(counter.rev as u32, writes % (i16::MAX as u32 + 1));
        let retries = attempts.iter().sum::<u32>() - writes;
        println!("{BACKEND}: {writes} modifies by {THREADS} threads, {retries} retries ({:.2} per write)", retries as f64 / writes as f64);
        attempts
    }

    /// Plain optimistic retry loses nothing, however many retries it takes.
    fn eight_threads_lose_no_increment_with_optimistic_retries<P: ModifyPooled<Counter, (), Error>>(db: &Db, pool: &P) {
        eight_threads_add_to_one_counter(db, pool, &optimistic());
    }

    fn optimistic() -> RetryPolicy {
        RetryPolicy::default()
            .contention(Contention::Optimistic)
            .max_attempts(1000)
            .max_elapsed(Duration::from_secs(120))
    }

    /// The default escalates: a retry reads the row with its lock, so it cannot conflict
    /// again, and no modify takes more than two attempts.
    fn eight_threads_lose_no_increment_and_a_retry_never_conflicts<P: ModifyPooled<Counter, (), Error>>(db: &Db, pool: &P) {
        let attempts = eight_threads_add_to_one_counter(db, pool, &RetryPolicy::default());
        assert!(attempts.iter().all(|&a| a <= 2), "{:?}", attempts.iter().max());
    }

    /// The connection is cut right after the server answered `modify`'s read of a
    /// missing row: the answer is the lost connection on both drivers, not `NotFound`.
    /// (Found by the soak on MariaDB's async path: a session killed during the read gave
    /// a cut-short result, read as no row; the failed `ROLLBACK` that showed the loss was
    /// dropped, and the caller was told the row did not exist while it did.)
    fn a_connection_lost_after_the_read_is_the_answer<W: Modify<Counter, (), Error>>(db: &Db, make: impl Fn(&str) -> W) {
        let server_port = match BACKEND {
            "postgres" => 5432,
            "mysql" => 3306,
            _ => return, // Embedded: no link to cut.
        };
        let link = common::slow_link::SlowLink::to(&format!("127.0.0.1:{server_port}"));
        let w = &mut make(&link.url(&db.url, server_port));
        link.cut_after_reply_to(b"counters");
        let answer = w.modify(&"missing".to_string(), &RetryPolicy::default(), |c: &mut Counter| {
            c.value += 1;
            Ok(())
        });
        assert_eq!(link.cuts(), 1, "the link was cut after the read");
        match answer {
            Err(Error::Database(e)) => println!("{BACKEND}: {e}"),
            other => panic!("a read on a connection then lost answered {other:?}"),
        }
    }

    #[test]
    fn blocking_a_connection_lost_after_the_read_is_the_answer() {
        let Some(db) = db() else { return };
        a_connection_lost_after_the_read_is_the_answer(&db, |url| common::drivers::Blocking(Conn::establish(url).unwrap()));
    }

    #[cfg(all(feature = "async", any(not(feature = "mysql"), feature = "async-mysql")))]
    #[test]
    fn on_async_a_connection_lost_after_the_read_is_the_answer() {
        use common::paths::AsyncOf;
        let Some(db) = db() else { return };
        a_connection_lost_after_the_read_is_the_answer(&db, |url| {
            let runtime = common::paths::runtime();
            common::drivers::Async { conn: Conn::connect(url, &runtime), runtime }
        });
    }

    tests_on_both_drivers!(
        |_: &Db| ();
        modify_writes_the_change_and_returns_value_token_and_attempts,
        the_callers_own_error_stops_it_unchanged_and_nothing_is_written,
        a_missing_row_is_not_found_without_calling_the_closure,
        inside_the_callers_transaction_there_is_one_attempt,
        #[cfg(feature = "chrono")]
        modify_works_with_a_timestamp_guard;
        pooled:
        a_conflict_starts_again_from_a_fresh_read,
        eight_threads_lose_no_increment_with_optimistic_retries,
        eight_threads_lose_no_increment_and_a_retry_never_conflicts,
    );

    /// The same on a deadpool-diesel pool (as axum services build one), every thread in
    /// its runtime's context; its SQLite connections have no busy timeout, so a busy
    /// database is one more retry.
    #[cfg(feature = "deadpool")]
    #[test]
    fn on_a_deadpool_pool_eight_threads_lose_no_increment() {
        common::deadpool::in_runtime(|| {
            let Some(db) = db() else { return };
            let pool = common::drivers::BlockingPool(db.deadpool());
            eight_threads_add_to_one_counter(&db, &pool, &optimistic().max_attempts(10_000));
        });
    }

    /// The same on the async path, on a deadpool pool of diesel-async connections.
    #[cfg(all(feature = "async-deadpool", any(not(feature = "mysql"), feature = "async-mysql")))]
    #[test]
    fn on_an_async_deadpool_pool_eight_threads_lose_no_increment() {
        use diesel_async::pooled_connection::deadpool::Pool;
        let Some(db) = db() else { return };
        let manager = common::drivers::manager::<<Conn as common::paths::AsyncOf>::Async>(&db.url, BACKEND);
        let pool = common::drivers::AsyncPool::build(async { Pool::builder(manager).max_size(8).build().expect("a deadpool pool") });
        eight_threads_add_to_one_counter(&db, &pool, &optimistic().max_attempts(10_000));
    }
}
