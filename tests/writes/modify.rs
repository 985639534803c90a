//! Read-modify-write with retry: every attempt reads, changes and writes under the guard;
//! conflicts start again from the read; the caller's own errors stop it unchanged.

use crate::common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Barrier;
use std::time::Duration;

use common::models::{Counter, Order};
use common::schema::{counters, orders};
use diesel::prelude::*;
use diesel_occ::{Contention, Error, GuardedModify, GuardedWrite, RetryPolicy};

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
    type Pooled = diesel_occ::Pooled<Conn>;

    fn insert_order(conn: &mut Pooled, status: &str) {
        let mut order = Order::new(1, "new");
        order.status = status.into();
        diesel::insert_into(orders::table).values(&order).execute(conn).unwrap();
    }

    fn load(conn: &mut Pooled) -> Order {
        orders::table.find(1).select(Order::as_select()).first(conn).unwrap()
    }

    #[test]
    fn modify_writes_the_change_and_returns_value_token_and_attempts() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        insert_order(conn, "valid");

        let done = Order::modify(conn, &1, &RetryPolicy::default(), |order| {
            order.note.push_str(" + gift wrap");
            Ok::<_, Error>(order.note.len())
        })
        .unwrap();

        assert_eq!((done.value, done.token, done.attempts), ("new + gift wrap".len(), 1, 1));
        assert_eq!(load(conn), done.row);
    }

    #[test]
    fn the_callers_own_error_stops_it_unchanged_and_nothing_is_written() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        insert_order(conn, "cancelled");

        let result = Order::modify(conn, &1, &RetryPolicy::default(), |order| {
            if order.status == "cancelled" {
                return Err(ShopError::AlreadyCancelled);
            }
            order.status = "shipped".into();
            Ok(())
        });

        assert!(matches!(result, Err(ShopError::AlreadyCancelled)), "{result:?}");
        assert_eq!((load(conn).status.as_str(), load(conn).version), ("cancelled", 0));
    }

    #[test]
    fn a_missing_row_is_not_found_without_calling_the_closure() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();

        let result = Order::modify(conn, &7, &RetryPolicy::default(), |_| -> Result<(), ShopError> {
            panic!("no row to change")
        });

        assert!(matches!(result, Err(ShopError::Occ(Error::NotFound { .. }))), "{result:?}");
    }

    /// Another connection writes between an attempt's read and its write; the hook sees
    /// the conflict and the retry reads again, so it sees that write. (Not on SQLite: its
    /// attempt holds the write lock from its first read, so no writer gets in between.)
    /// Optimistic reads throughout: a locked read (the default once a row is contended)
    /// would make the closure's second writer wait for this very transaction.
    #[test]
    fn a_conflict_starts_again_from_a_fresh_read() {
        if BACKEND == "sqlite" {
            return;
        }
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        insert_order(conn, "valid");
        let retries = std::sync::Arc::new(AtomicU32::new(0));
        let seen = std::sync::Arc::clone(&retries);
        let policy = RetryPolicy::default().contention(Contention::Optimistic).on_retry(move |event| {
            assert!(event.error.as_conflict().is_some(), "{}", event.error);
            seen.fetch_add(1, Ordering::Relaxed);
        });
        let mut calls = 0;

        let done = Order::modify_pooled(&db.pool, &1, &policy, |order| {
            calls += 1;
            if calls == 1 {
                let other = &mut db.conn();
                Order::guarded_update_by_key(other, &1, &0, orders::quantity.eq(5))?;
            }
            order.note = format!("seen quantity {}", order.quantity);
            Ok::<_, Error>(())
        })
        .unwrap();

        assert_eq!((done.attempts, calls, retries.load(Ordering::Relaxed)), (2, 2, 1));
        assert_eq!(load(conn).note, "seen quantity 5", "the retry read the other write");
        assert_eq!(load(conn).version, 2);
    }

    /// Inside the caller's transaction one attempt runs, and its failure comes back as it
    /// is, for the caller to retry its whole transaction: a conflict on PostgreSQL and
    /// MySQL; on SQLite the caller's (deferred) transaction cannot write after another
    /// connection did, a retryable busy error.
    #[test]
    fn inside_the_callers_transaction_there_is_one_attempt() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        insert_order(conn, "valid");

        let mut calls = 0;
        let result = conn
            .transaction::<_, Error, _>(|conn| {
                // Optimistic: a locked read would make the closure's writer wait for us.
                let policy = RetryPolicy::default().contention(Contention::Optimistic);
                Ok(Order::modify(conn, &1, &policy, |order| {
                    calls += 1;
                    let other = &mut db.conn();
                    Order::guarded_update_by_key(other, &1, &0, orders::quantity.eq(5))?;
                    order.note = "mine".into();
                    Ok::<_, Error>(())
                }))
            })
            .unwrap();

        assert_eq!(calls, 1);
        match result {
            Err(Error::Conflict(c)) if BACKEND != "sqlite" => assert_eq!(c.found, diesel_occ::Token::Version(1)),
            Err(Error::Retryable { .. }) if BACKEND == "sqlite" => {}
            other => panic!("{other:?}"),
        }
        assert_eq!((load(conn).note.as_str(), load(conn).quantity), ("new", 5));
    }

    /// Any guard kind: here a last-modified timestamp, which the write advances.
    #[cfg(feature = "chrono")]
    #[test]
    fn modify_works_with_a_timestamp_guard() {
        use common::models::Document;
        use common::schema::documents;
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let stamp = chrono::DateTime::UNIX_EPOCH.naive_utc();
        let doc = Document { id: 1, body: "a".into(), hits: 0, last_modified: stamp };
        diesel::insert_into(documents::table).values(&doc).execute(conn).unwrap();

        let done = Document::modify(conn, &1, &RetryPolicy::default(), |d| {
            d.hits += 1;
            Ok::<_, Error>(())
        })
        .unwrap();

        assert!(done.token > stamp);
        let stored: Document = documents::table.find(1).first(conn).unwrap();
        assert_eq!(stored, done.row);
    }

    /// Eight threads add 50 each to one counter, each attempt on a connection from
    /// `source`; returns each modify's attempts.
    fn eight_threads_add_to_one_counter<S>(db: &common::TestDb<Conn>, source: &S, policy: &RetryPolicy) -> Vec<u32>
    where
        S: diesel_occ::ConnectionSource,
        S::Connection: diesel::connection::LoadConnection + diesel_occ::WriteTransaction,
        <S::Connection as diesel::Connection>::Backend: diesel_occ::OccBackend,
        Counter: diesel_occ::UpdateRow<S::Connection, <Counter as diesel_occ::Guarded>::Changes>,
    {
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
                                Counter::modify_pooled(source, &"hits".to_string(), policy, |c| {
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
    #[test]
    fn eight_threads_lose_no_increment_with_optimistic_retries() {
        let Some(db) = db() else { return };
        eight_threads_add_to_one_counter(&db, &db.pool, &optimistic());
    }

    fn optimistic() -> RetryPolicy {
        RetryPolicy::default()
            .contention(Contention::Optimistic)
            .max_attempts(1000)
            .max_elapsed(Duration::from_secs(120))
    }

    /// The same on a deadpool-diesel pool (as axum services build one), every thread in
    /// its runtime's context; its SQLite connections have no busy timeout, so a busy
    /// database is one more retry.
    #[cfg(feature = "deadpool")]
    #[test]
    fn on_a_deadpool_pool_eight_threads_lose_no_increment() {
        common::deadpool::in_runtime(|| {
            let Some(db) = db() else { return };
            eight_threads_add_to_one_counter(&db, &db.deadpool(), &optimistic().max_attempts(10_000));
        });
    }

    /// The default escalates: a retry reads the row with its lock, so it cannot conflict
    /// again, and no modify takes more than two attempts.
    #[test]
    fn eight_threads_lose_no_increment_and_a_retry_never_conflicts() {
        let Some(db) = db() else { return };
        let attempts = eight_threads_add_to_one_counter(&db, &db.pool, &RetryPolicy::default());
        assert!(attempts.iter().all(|&a| a <= 2), "{:?}", attempts.iter().max());
    }
}
