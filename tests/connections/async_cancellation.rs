//! Async guarded writes, read-modify-writes and write transactions dropped at random points (a tokio timeout
//! drawn from 0 to twice the longest undisturbed call, at least 3 ms, two thousand times
//! on one connection): no change lands in half, no
//! transaction stays open on the server, and a connection left inside a transaction is
//! refused by the library, never written on. Checked from the database.

#![cfg(all(
    feature = "async",
    any(not(feature = "mysql"), feature = "async-mysql")
))]

use crate::common;

use std::time::{Duration, Instant};

use common::models::{Order, OrderPatch};
use common::paths::{add_one_to, AsyncOf};
use common::schema::orders;
use diesel::prelude::*;
use diesel::result::Error as DieselError;
use diesel_occ::asynchronous::prelude::*;
use diesel_occ::{Error, RetryPolicy};

/// Rounds of the test, each a call dropped after a random time unless it finished.
const ROUNDS: u32 = 2_000;

/// What the rounds came to.
#[derive(Debug, Default)]
struct Tally {
    written: u32,
    conflicts: u32,
    dropped: u32,
    refused_broken: u32,
}

/// The next of a small deterministic sequence of timeouts, from 0 to `span`.
fn next_timeout(seed: &mut u64, span: Duration) -> Duration {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    span.mul_f64(((*seed >> 33) % 10_000) as f64 / 10_000.0)
}

/// The span the timeouts are drawn from: twice the longest of a few undisturbed `call`s
/// (after one that warms the connection), and at least 3 ms. So that drops fall anywhere
/// in a call, and some calls finish, however fast the machine and its disk are.
fn timeout_span<T>(mut call: impl FnMut() -> T) -> Duration {
    call();
    let longest = (0..5)
        .map(|_| {
            let started = Instant::now();
            call();
            started.elapsed()
        })
        .max()
        .unwrap_or_default();
    (longest * 2).max(Duration::from_millis(3))
}

for_each_backend! {
    type Async_ = <Conn as AsyncOf>::Async;
    json_profiles!();

    /// One-statement merges (with the token back and without it) dropped at random
    /// points: each merge that landed added its key and moved the version by one, both or
    /// neither; a connection a dropped merge left half read (MySQL) is refused, never
    /// read from again.
    #[test]
    fn dropped_one_statement_merges_land_whole_or_not_at_all() {
        let Some(db) = db() else { return };
        let row = Profile { id: 1, name: "p".into(), ext: serde_json::json!({}), version: 0 };
        diesel::insert_into(profiles::table).values(&row).execute(&mut db.conn()).unwrap();
        let runtime = common::paths::runtime();
        // Calibrated on another row, so that the row under test moves only by the rounds.
        let other = Profile { id: 2, ..row.clone() };
        diesel::insert_into(profiles::table).values(&other).execute(&mut db.conn()).unwrap();
        // A fresh connection's first statements are slower: a connection replaced after a
        // drop is warmed by one undisturbed merge of the other row first, as a pool's
        // connections are, or every call on it would be dropped.
        let warm = |conn: &mut Async_| {
            let patch = serde_json::json!({"warm": 1});
            runtime.block_on(Profile::merge_json_in_place(conn, &2, profiles::ext, &patch)).unwrap();
        };
        let connect = || {
            let mut conn: Async_ = Conn::connect(&db.url, &runtime);
            warm(&mut conn);
            conn
        };
        let mut conn = connect();
        let span = timeout_span(|| warm(&mut conn));
        let (mut seed, mut tally) = (11_u64, Tally::default());
        for round in 0..ROUNDS / 2 {
            let limit = next_timeout(&mut seed, span);
            let patch = serde_json::json!({ format!("k{round}"): round });
            let outcome = if round % 2 == 0 {
                let call = Profile::merge_json_in_place(&mut conn, &1, profiles::ext, &patch);
                runtime.block_on(async { tokio::time::timeout(limit, call).await }).map(|r| r.map(drop))
            } else {
                let call = Profile::merge_json_in_place_without_token(&mut conn, &1, profiles::ext, &patch);
                runtime.block_on(async { tokio::time::timeout(limit, call).await })
            };
            match outcome {
                Ok(Ok(())) => tally.written += 1,
                Ok(Err(Error::Database(DieselError::BrokenTransactionManager))) => {
                    tally.refused_broken += 1;
                    conn = connect();
                }
                Ok(Err(other)) => panic!("round {round}: {other:?}"),
                Err(_elapsed) => tally.dropped += 1,
            }
        }
        drop(conn);
        eprintln!("{BACKEND}: timeouts up to {span:?}: {tally:?}");
        assert!(tally.written > 0 && tally.dropped > 0, "{tally:?}: both kinds of round must occur");
        let row = profiles::table.find(1).select(Profile::as_select()).first(&mut db.conn()).unwrap();
        let keys = row.ext.as_object().unwrap();
        assert_eq!(keys.len() as i64, row.version, "a merge landed in half: {row:?}");
        assert!(row.version >= i64::from(tally.written), "{row:?} {tally:?}");
        for (key, value) in keys {
            assert_eq!(key, &format!("k{value}"), "{row:?}");
        }
    }

    /// Reads by key (`load_by_key`, `read_by_key`, `load_by_keys`)
    /// dropped at random points on a bb8 pool of one connection: the next read through the
    /// pool answers its own row, never the dropped read's reply or a row cut short. (Found
    /// by the soak on MariaDB: a read dropped half way left its reply unread, and the pool
    /// handed the connection on; the next caller was told a row was missing, or got
    /// "Unexpected end of row".)
    #[test]
    fn reads_dropped_half_way_never_answer_the_next_caller() {
        let Some(db) = db() else { return };
        for (id, note) in [(1, "one"), (2, "two")] {
            let mut order = Order::new(id, "new");
            order.note = note.into();
            diesel::insert_into(orders::table).values(&order).execute(&mut db.conn()).unwrap();
        }
        let runtime = common::paths::runtime();
        let pool = runtime.block_on(async {
            diesel_async::pooled_connection::bb8::Pool::builder()
                .max_size(1)
                // bb8's own check-out query, dropped half way, is not the library's to
                // protect (RELIABILITY.md): this test drops the library's reads only.
                .test_on_check_out(false)
                .build(common::drivers::manager::<Async_>(&db.url, BACKEND))
                .await
                .unwrap()
        });
        let read_one = async |conn: &mut Async_, round: u32| match round % 3 {
            0 => <Order as diesel_occ::asynchronous::AsyncLoadByKey<Async_>>::load_by_key(conn, &1).await.map(|o| o.into_iter().collect::<Vec<_>>()),
            1 => <Order as diesel_occ::asynchronous::AsyncLoadByKey<Async_>>::read_by_key(conn, &1).await.map(|o| o.into_iter().collect()),
            _ => <Order as diesel_occ::asynchronous::AsyncLoadByKey<Async_>>::load_by_keys(conn, &[1, 1]).await,
        };
        // Reads are quicker than the other calls here: three times the quickest of a few
        // (the first on a fresh connection is slow), so that drops fall inside them.
        let quickest = (0..6)
            .map(|_| {
                let started = Instant::now();
                runtime.block_on(async { read_one(&mut pool.get().await.unwrap(), 0).await.unwrap() });
                started.elapsed()
            })
            .min()
            .unwrap_or_default();
        let span = quickest * 3;
        let (mut seed, mut dropped) = (17_u64, 0);
        for round in 0..ROUNDS {
            let limit = next_timeout(&mut seed, span);
            runtime.block_on(async {
                let first = async { read_one(&mut pool.get().await.unwrap(), round).await };
                if tokio::time::timeout(limit, first).await.is_err() {
                    dropped += 1;
                }
                let mut conn = pool.get().await.unwrap();
                let next = <Order as diesel_occ::asynchronous::AsyncLoadByKey<Async_>>::read_by_key(&mut conn, &2).await;
                match next {
                    Ok(Some(order)) if order.id == 2 && order.note == "two" => {}
                    other => panic!("round {round}: the next read answered {other:?}"),
                }
            });
        }
        eprintln!("{BACKEND}: timeouts up to {span:?}: {dropped} of {ROUNDS} reads dropped");
        // SQLite's reads run whole on the connection's thread; the servers' can be cut.
        assert!(dropped > 0 || BACKEND == "sqlite", "some reads must be dropped");
    }

    /// A call's future sends nothing until it is first polled: made outside any runtime
    /// (where SQLite's connection could not start its thread's work) and dropped
    /// unpolled, as a `select!` whose other branch was ready drops it, each of these
    /// leaves the rows as they were and never runs the caller's change.
    #[test]
    fn futures_dropped_before_their_first_poll_send_nothing() {
        use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
        use std::sync::Arc;
        let Some(db) = db() else { return };
        diesel::insert_into(orders::table).values(&Order::new(1, "new")).execute(&mut db.conn()).unwrap();
        let read = || orders::table.select(Order::as_select()).order(orders::id).load(&mut db.conn()).unwrap();
        let before = read();
        let copy = before[0].clone();
        let runtime = common::paths::runtime();
        let mut conn: Async_ = Conn::connect(&db.url, &runtime);
        let changed = Arc::new(AtomicBool::new(false));
        let seen = changed.clone();
        let policy = RetryPolicy::default();
        let change = move |o: &mut Order| {
            seen.store(true, SeqCst);
            add_one_to(o, "x")
        };
        // Not inside `runtime`: a call that started its work here would panic.
        drop(Order::modify(&mut conn, &1, &policy, change));
        let patch = OrderPatch { note: Some("updated".into()), quantity: Some(9) };
        drop(AsyncGuardedWrite::guarded_update(&copy, &mut conn, patch));
        let mut saved = Order { note: "saved".into(), ..copy.clone() };
        drop(AsyncGuardedWrite::guarded_save(&mut saved, &mut conn));
        let mut touched = copy.clone();
        drop(AsyncGuardedWrite::guarded_touch(&mut touched, &mut conn));
        drop(AsyncGuardedWrite::guarded_delete(&copy, &mut conn));
        let mut inserted = Order::new(2, "inserted");
        drop(AsyncGuardedWrite::guarded_insert(&mut inserted, &mut conn));
        let mut upserted = Order::new(3, "upserted");
        drop(AsyncGuardedWrite::guarded_upsert(&mut upserted, &mut conn));

        // The connection still works, and nothing the dropped calls held landed.
        let patch = OrderPatch { note: Some("after".into()), quantity: Some(copy.quantity) };
        runtime.block_on(AsyncGuardedWrite::guarded_update(&copy, &mut conn, patch)).unwrap();
        drop(conn);
        drop(runtime);
        assert!(!changed.load(SeqCst), "a dropped read-modify-write ran the caller's change");
        let after = read();
        assert_eq!(after.len(), 1, "{after:?}");
        assert_eq!(after[0].note, "after", "{after:?}");
        assert_eq!(after[0].version, copy.version + 1, "only the awaited update landed: {after:?}");
        assert_eq!((saved, touched, inserted, upserted.note.as_str()), (Order { note: "saved".into(), ..copy.clone() }, copy.clone(), Order::new(2, "inserted"), "upserted"));
    }

    #[test]
    fn dropped_futures_leave_no_half_change_and_no_open_transaction() {
        let Some(db) = db() else { return };
        diesel::insert_into(orders::table).values(&Order::new(1, "new")).execute(&mut db.conn()).unwrap();
        let runtime = common::paths::runtime();
        let policy = RetryPolicy::default().max_attempts(3);
        // Calibrated on a copy of the row, so that the row under test moves only by the
        // rounds' calls.
        diesel::insert_into(orders::table).values(&Order::new(2, "new")).execute(&mut db.conn()).unwrap();
        // A connection replaced after a drop is warmed first (see the merges' test).
        let warm = |conn: &mut Async_| {
            runtime.block_on(Order::modify(conn, &2, &policy, |o| add_one_to(o, "x"))).unwrap();
            let read = orders::table.find(2).select(Order::as_select());
            let copy = runtime.block_on(diesel_async::RunQueryDsl::first(read, &mut *conn)).unwrap();
            let patch = OrderPatch { note: Some(copy.note.clone()), quantity: Some(copy.quantity) };
            runtime.block_on(AsyncGuardedWrite::guarded_update(&copy, conn, patch)).unwrap();
        };
        let connect = || {
            let mut conn: Async_ = Conn::connect(&db.url, &runtime);
            warm(&mut conn);
            conn
        };
        let mut conn = connect();
        let span = timeout_span(|| warm(&mut conn));
        let (mut seed, mut tally) = (7_u64, Tally::default());
        for round in 0..ROUNDS {
            let limit = next_timeout(&mut seed, span);
            let outcome = if round % 2 == 0 {
                let call = Order::modify(&mut conn, &1, &policy, |o| add_one_to(o, "x"));
                runtime.block_on(async { tokio::time::timeout(limit, call).await }).map(|r| r.map(drop))
            } else {
                let read = orders::table.find(1).select(Order::as_select());
                let Ok(copy) = runtime.block_on(diesel_async::RunQueryDsl::first(read, &mut conn)) else {
                    // The connection is busy with a dropped call's leftovers or broken: the
                    // next write tells which.
                    continue;
                };
                let patch = OrderPatch { note: Some(format!("{}x", copy.note)), quantity: Some(copy.quantity + 1) };
                let call = AsyncGuardedWrite::guarded_update(&copy, &mut conn, patch);
                runtime.block_on(async { tokio::time::timeout(limit, call).await }).map(|r| r.map(drop))
            };
            match outcome {
                Ok(Ok(())) => tally.written += 1,
                Ok(Err(Error::Conflict(_) | Error::RetriesExhausted { .. })) => tally.conflicts += 1,
                Ok(Err(Error::Database(DieselError::BrokenTransactionManager))) => {
                    // A call dropped inside the library's transaction: nothing more is sent
                    // on this connection; a pool would discard it, the test replaces it.
                    tally.refused_broken += 1;
                    conn = connect();
                }
                Ok(Err(other)) => panic!("round {round}: {other:?}"),
                Err(_elapsed) => tally.dropped += 1,
            }
        }
        drop(conn);
        eprintln!("{BACKEND}: timeouts up to {span:?}: {tally:?}");
        assert!(tally.written > 0 && tally.dropped > 0, "{tally:?}: both kinds of round must occur");

        // Every change that landed moved the note, the quantity and the version together.
        let check = &mut db.conn();
        let row = orders::table.find(1).select(Order::as_select()).first(check).unwrap();
        assert_eq!(row.note.len() as i64 - 3, i64::from(row.quantity) - 1, "{row:?}");
        assert_eq!(row.version, i64::from(row.quantity) - 1, "{row:?}");
        assert!(row.version >= i64::from(tally.written), "{row:?} {tally:?}");

        // Closed connections end their transactions; none is left open (the server sees a
        // closed socket a moment later, so this waits for it, bounded).
        let deadline = Instant::now() + Duration::from_secs(20);
        while common::open_transactions(check, BACKEND) > 0 {
            assert!(Instant::now() < deadline, "a transaction stayed open");
            std::thread::sleep(Duration::from_millis(50));
        }
        // And nothing holds the row: a write from another connection lands at once.
        let mut fresh = row.clone();
        fresh.note.push('!');
        diesel_occ::GuardedWrite::guarded_save(&mut fresh, check).unwrap();
    }

    /// A write transaction and a guarded operation dropped half way through their work
    /// (the work wrote, then waited): nothing they wrote commits, every later call of the
    /// library on the connection is refused (no write lands in the transaction left open
    /// on it, which on SQLite would answer `Ok` and then vanish), and once the connection
    /// is closed no transaction stays open.
    #[test]
    fn a_write_transaction_dropped_half_way_leaves_its_connection_refused() {
        let Some(db) = db() else { return };
        diesel::insert_into(orders::table).values(&Order::new(1, "new")).execute(&mut db.conn()).unwrap();
        let runtime = common::paths::runtime();
        let policy = RetryPolicy::default();
        let stalled = async |conn: &mut Async_| -> Result<(), Error> {
            let write = diesel::update(orders::table.find(1)).set(orders::note.eq("never committed"));
            diesel_async::RunQueryDsl::execute(write, conn).await?;
            std::future::pending::<()>().await;
            Ok(())
        };
        for operation in [false, true] {
            let mut conn: Async_ = Conn::connect(&db.url, &runtime);
            let read = orders::table.find(1).select(Order::as_select());
            let copy = runtime.block_on(diesel_async::RunQueryDsl::first(read, &mut conn)).unwrap();
            let limit = Duration::from_millis(300);
            let dropped = if operation {
                let call = diesel_occ::asynchronous::guarded_operation(&mut conn, "billing", "run-1", &policy, stalled);
                runtime.block_on(async { tokio::time::timeout(limit, call).await }).map(drop)
            } else {
                let call = conn.write_transaction(stalled);
                runtime.block_on(async { tokio::time::timeout(limit, call).await }).map(drop)
            };
            assert!(dropped.is_err(), "the work never ends: the call was dropped");

            let broken = |answer: Result<(), Error>, what: &str| {
                assert!(matches!(answer, Err(Error::Database(DieselError::BrokenTransactionManager))), "{what}: {answer:?}");
            };
            let update = AsyncGuardedWrite::guarded_update(&copy, &mut conn, orders::note.eq("after"));
            broken(runtime.block_on(update).map(drop), "a guarded update");
            let mut saved = Order { note: "saved".into(), ..copy.clone() };
            broken(runtime.block_on(AsyncGuardedWrite::guarded_save(&mut saved, &mut conn)).map(drop), "a save");
            let modify = Order::modify(&mut conn, &1, &policy, |o| add_one_to(o, "m"));
            broken(runtime.block_on(modify).map(drop), "a read-modify-write");
            let again = conn.write_transaction(async |_: &mut Async_| Ok::<_, Error>(()));
            broken(runtime.block_on(again), "another write transaction");
            drop(conn);

            let check = &mut db.conn();
            let deadline = Instant::now() + Duration::from_secs(20);
            while common::open_transactions(check, BACKEND) > 0 {
                assert!(Instant::now() < deadline, "a transaction stayed open");
                std::thread::sleep(Duration::from_millis(50));
            }
            let row = orders::table.find(1).select(Order::as_select()).first(check).unwrap();
            assert_eq!((row.note.as_str(), row.version), ("new", 0), "nothing of the dropped call, nor after it, committed");
        }
    }
}
