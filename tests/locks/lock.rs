//! Locks and leases: mutual exclusion checked with fences, expiry by the database clock,
//! owner-checked renew and release, fenced writes that refuse a paused holder.

#![cfg(feature = "locks")]

use crate::common;

use common::drivers::{LockHolder, LockRenewals, LockWrites, WriteFencedPooled};
use common::fenced::{protected, Protected};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_occ::FencedWrite;
use diesel_occ::{occ_locks, Locks, MAX_TTL};
use diesel_occ::{Error, RetryPolicy};

fn quick() -> RetryPolicy {
    RetryPolicy::default()
        .first_delay(Duration::from_millis(1))
        .max_delay(Duration::from_millis(10))
}

/// The change the fenced writes send.
type ValueIs = diesel::dsl::Eq<protected::value, i64>;

/// The error of a lock that must be refused.
fn refused<G>(taken: Result<G, Error>) -> Error {
    match taken {
        Ok(_) => panic!("expected an error, got the lock"),
        Err(e) => e,
    }
}

for_each_backend! {
    type Pooled = diesel_occ::Pooled<Conn>;
    type Db = common::TestDb<Conn>;

    fn setup() -> Option<common::TestDb<Conn>> {
        let db = db()?;
        db.conn()
            .batch_execute(common::fenced::CREATE)
            .unwrap();
        Some(db)
    }

    fn value(conn: &mut Pooled) -> (i64, i64) {
        protected::table.find(1).select((protected::value, protected::last_fence)).first(conn).unwrap()
    }

    /// 8 contenders x 20 rounds on one lock taken through `source`: never two inside at
    /// once, fences rise with every acquisition, and an unguarded read-then-write under
    /// the lock loses nothing.
    fn contenders_never_hold_the_lock_together<S>(db: &common::TestDb<Conn>, source: S)
    where
        S: diesel_occ::ConnectionSource,
        S::Connection: diesel_occ::LockConnection,
    {
        const CONTENDERS: usize = 8;
        const ROUNDS: usize = 20;
        let locks = Locks::new(source);
        let start = Barrier::new(CONTENDERS);
        let inside = AtomicBool::new(false);
        let fences = Mutex::new(Vec::new());
        let pool = &db.pool;
        let runtime = tokio::runtime::Handle::try_current().ok();

        std::thread::scope(|s| {
            for c in 0..CONTENDERS {
                let (locks, start, inside, fences, runtime) = (&locks, &start, &inside, &fences, &runtime);
                s.spawn(move || {
                    let _in_runtime = runtime.as_ref().map(tokio::runtime::Handle::enter);
                    let label = format!("contender {c}");
                    let mut conn = pool.get().unwrap();
                    start.wait();
                    for _ in 0..ROUNDS {
                        let guard = locks
                            .lock("report", "2026-11", Duration::from_secs(30), Some(&label), Duration::from_secs(120), &quick())
                            .unwrap();
                        assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                        fences.lock().unwrap().push(guard.fence());
                        let (current, _) = value(&mut conn);
                        Protected::write_fenced(&mut conn, &1, protected::last_fence, guard.fence(), protected::value.eq(current + 1)).unwrap();
                        inside.store(false, Ordering::SeqCst);
                        guard.release().unwrap();
                    }
                });
            }
        });

        let fences = fences.into_inner().unwrap();
        assert!(fences.windows(2).all(|w| w[0] < w[1]), "fences rise with every acquisition: {fences:?}");
        let holds = (CONTENDERS * ROUNDS) as i64;
        assert_eq!(fences.len() as i64, holds);
        assert_eq!(value(&mut db.conn()), (holds, *fences.last().unwrap()));
        let (fence, changes): (i64, i64) = occ_locks::table
            .select((occ_locks::fence, occ_locks::holder_changes))
            .first(&mut db.conn())
            .unwrap();
        assert_eq!((common::fences_issued(fence), changes), (holds, holds));
    }

    #[test]
    fn contenders_on_an_r2d2_pool_never_hold_the_lock_together() {
        let Some(db) = setup() else { return };
        contenders_never_hold_the_lock_together(&db, db.pool.clone());
    }

    #[cfg(feature = "deadpool")]
    #[test]
    fn contenders_on_a_deadpool_pool_never_hold_the_lock_together() {
        common::deadpool::in_runtime(|| {
            let Some(db) = setup() else { return };
            contenders_never_hold_the_lock_together(&db, db.deadpool());
        });
    }

    /// Async waiters on a current-thread runtime (one thread for all of them) take the
    /// lock in turns: never two inside at once, fences rise with every grant, and the
    /// database saw every grant. The tries run on the blocking pool and the waits on the
    /// timer, so the one thread serves every waiter.
    #[cfg(feature = "tokio")]
    #[test]
    fn async_waiters_take_the_lock_in_turns() {
        const WAITERS: usize = 4;
        const ROUNDS: usize = 5;
        let Some(db) = setup() else { return };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let locks = Locks::new(db.pool.clone());
        let inside = std::sync::Arc::new(AtomicBool::new(false));
        let fences = runtime.block_on(async {
            let mut waiters = Vec::new();
            for w in 0..WAITERS {
                let (locks, inside) = (locks.clone(), std::sync::Arc::clone(&inside));
                waiters.push(tokio::spawn(async move {
                    let mut fences = Vec::new();
                    for _ in 0..ROUNDS {
                        let guard = locks
                            .lock_async("report", "async", Duration::from_secs(30), Some(&format!("waiter {w}")), Duration::from_secs(120), &quick())
                            .await
                            .unwrap();
                        assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                        fences.push(guard.fence());
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        inside.store(false, Ordering::SeqCst);
                        tokio::task::spawn_blocking(move || guard.release()).await.unwrap().unwrap();
                    }
                    fences
                }));
            }
            let mut all = Vec::new();
            for waiter in waiters {
                all.extend(waiter.await.unwrap());
            }
            all
        });
        let mut sorted = fences.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), WAITERS * ROUNDS, "every grant had a fence of its own");
        let changes: i64 = occ_locks::table
            .filter(occ_locks::resource.eq("async"))
            .select(occ_locks::holder_changes)
            .first(&mut db.conn())
            .unwrap();
        assert_eq!(changes, (WAITERS * ROUNDS) as i64, "the database saw every grant");
    }

    /// Lock waits dropped at random points (timeouts of 0-3 ms, 300 times, while another
    /// holder comes and goes) never leave a lock held: a try that was running when its
    /// waiter went away releases what it took, so the lock is free once the tries are done
    /// and the next taker gets it at once.
    #[cfg(feature = "tokio")]
    #[test]
    fn dropped_async_lock_waits_leave_no_lock_held() {
        let Some(db) = setup() else { return };
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let locks = Locks::new(db.pool.clone());
        let policy = quick();
        let (granted, dropped) = runtime.block_on(async {
            let (mut granted, mut dropped) = (0, 0);
            for round in 0..300_u64 {
                let holder = if round % 10 == 0 {
                    let locks = locks.clone();
                    tokio::task::spawn_blocking(move || locks.try_lock("report", "cancel", Duration::from_secs(30), Some("holder")).ok()).await.unwrap()
                } else {
                    None
                };
                let wait = locks.lock_async("report", "cancel", Duration::from_secs(30), Some("waiter"), Duration::from_secs(5), &policy);
                match tokio::time::timeout(Duration::from_micros(round % 4 * 1000), wait).await {
                    Ok(Ok(guard)) => {
                        granted += 1;
                        tokio::task::spawn_blocking(move || guard.release()).await.unwrap().unwrap();
                    }
                    Ok(Err(error)) => panic!("{error:?}"),
                    Err(_) => dropped += 1,
                }
                if let Some(holder) = holder {
                    tokio::task::spawn_blocking(move || holder.release()).await.unwrap().unwrap();
                }
            }
            (granted, dropped)
        });
        // The tries of dropped waits finish on the blocking pool; the runtime's shutdown
        // waits for them.
        drop(runtime);
        let held: i64 = occ_locks::table
            .filter(occ_locks::resource.eq("cancel"))
            .filter(occ_locks::holder.is_not_null())
            .count()
            .get_result(&mut db.conn())
            .unwrap();
        assert_eq!(held, 0, "a dropped wait left the lock held ({granted} granted, {dropped} dropped)");
        locks.try_lock("report", "cancel", Duration::from_secs(30), None).unwrap().release().unwrap();
        assert!(dropped > 0 && granted > 0, "both kinds of outcome happened: {granted} granted, {dropped} dropped");
    }

    /// A holder that stops renewing loses the lease by the database's clock; the next
    /// holder's fence is higher, and the old holder's renew, release and fenced write are
    /// all refused.
    fn a_lapsed_holder_is_locked_out_and_its_fenced_write_refused<W>(db: &Db, w: &W)
    where
        W: LockRenewals + WriteFencedPooled<Protected, protected::last_fence, ValueIs>,
    {
        let conn = &mut db.conn();
        let mut paused = w.try_lock("leader", "eu", Duration::from_millis(300), Some("host-a")).unwrap();

        match w.try_lock("leader", "eu", Duration::from_secs(30), Some("host-b")) {
            Err(Error::LockHeld { holder, until, .. }) => {
                assert_eq!(holder.as_deref(), Some("host-a"));
                assert!(until.is_some());
            }
            Err(other) => panic!("expected LockHeld, got {other:?}"),
            Ok(_) => panic!("expected LockHeld, got the lock"),
        }
        w.renew(&mut paused).unwrap();
        // Past the lease, by the database's clock.
        std::thread::sleep(Duration::from_millis(800));
        let successor = w.try_lock("leader", "eu", Duration::from_secs(30), Some("host-b")).unwrap();
        let (old, new) = (W::fence(&paused), W::fence(&successor));
        assert!(new > old);
        w.write_fenced(&1, protected::last_fence, new, protected::value.eq(7)).unwrap();

        let renew = w.renew(&mut paused).unwrap_err();
        let write = w.write_fenced(&1, protected::last_fence, old, protected::value.eq(666)).unwrap_err();
        let release = w.release(paused).unwrap_err();

        assert!(matches!(renew, Error::LockLost { .. }), "{renew}");
        assert!(matches!(release, Error::LockLost { .. }), "{release}");
        match write {
            Error::StaleFence { presented, current } => assert_eq!((presented, current), (new - 1, new)),
            other => panic!("{other}"),
        }
        assert_eq!(value(conn), (7, new));
        w.release(successor).unwrap();
    }

    /// Not re-entrant; a dropped guard frees the lock; the row stays so the fence rises.
    /// (The async guard's release runs in a task of its own, so the lock row is awaited.)
    fn locks_are_not_reentrant_and_a_dropped_guard_frees_the_lock<W: LockWrites>(db: &Db, w: &W) {
        let first = w.try_lock("job", "1", Duration::from_secs(30), None).unwrap();
        assert!(matches!(w.try_lock("job", "1", Duration::from_secs(30), None), Err(Error::LockHeld { .. })));
        let fence = W::fence(&first);
        w.drop_guard(first);
        wait_until_free(db, "job");

        let second = w.try_lock("job", "1", Duration::from_secs(30), None).unwrap();
        assert_eq!(W::fence(&second), fence + 1);
        w.release(second).unwrap();
        let rows: i64 = occ_locks::table.count().get_result(&mut db.conn()).unwrap();
        assert_eq!(rows, 1, "the row is kept on release");
    }

    /// Waits (10 s at most) until lock `name`'s row names no holder.
    fn wait_until_free(db: &Db, name: &str) {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let holder: Option<String> = occ_locks::table
                .filter(occ_locks::lock_name.eq(name))
                .select(occ_locks::holder)
                .first(&mut db.conn())
                .unwrap();
            if holder.is_none() { return; }
            assert!(std::time::Instant::now() < until, "the dropped guard's lock is still held");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A held row without an expiry (written by hand, or by a tool that knows no
    /// leases) counts as expired: it is taken at once, with a higher fence, instead of
    /// blocking its lock for ever.
    fn a_held_row_without_an_expiry_is_taken<W: LockHolder>(db: &Db, w: &W) {
        let first = w.try_lock("report", "nightly", Duration::from_secs(60), Some("first")).unwrap();
        let fence = W::fence(&first);
        std::mem::forget(first);
        let conn = &mut db.conn();
        diesel::update(occ_locks::table)
            .set(occ_locks::expires_at.eq(None::<chrono::NaiveDateTime>))
            .execute(conn)
            .unwrap();

        let second = w.try_lock("report", "nightly", Duration::from_secs(60), Some("second")).unwrap();

        assert!(W::fence(&second) > fence, "{} > {fence}", W::fence(&second));
        let (holder, label, expires): (Option<String>, Option<String>, Option<chrono::NaiveDateTime>) = occ_locks::table
            .select((occ_locks::holder, occ_locks::label, occ_locks::expires_at))
            .first(conn)
            .unwrap();
        assert_eq!((holder, label.as_deref()), (Some(W::holder(&second)), Some("second")));
        assert!(expires.is_some(), "the new holder's lease has an end");
        w.release(second).unwrap();
    }

    /// Fences keep rising whatever happens to the lock row: deleted, the table emptied,
    /// the table dropped and created again. They come from a source of their own.
    fn fences_never_go_back_whatever_happens_to_the_row<W: LockWrites>(db: &Db, w: &W) {
        let conn = &mut db.conn();
        let mut fences = Vec::new();
        let mut take = |after: &str| {
            let guard = w.try_lock("purged", "main", Duration::from_secs(30), None).unwrap();
            fences.push((after.to_string(), W::fence(&guard)));
            w.release(guard).unwrap();
        };
        take("first");
        take("second");
        diesel::delete(occ_locks::table).execute(conn).unwrap();
        take("a delete of the row");
        conn.batch_execute(match BACKEND {
            "sqlite" => "DELETE FROM occ_locks",
            _ => "TRUNCATE TABLE occ_locks",
        })
        .unwrap();
        take("a truncate");
        let create = match BACKEND {
            "postgres" => concat!(
                include_str!("../../migrations/diesel_occ/postgres/2026-11-22-900003_occ_locks/up.sql"),
                include_str!("../../migrations/diesel_occ/postgres/2026-11-28-900006_occ_locks_instants/up.sql"),
            ),
            "mysql" => include_str!("../../migrations/diesel_occ/mysql/2026-11-22-900003_occ_locks/up.sql"),
            _ => include_str!("../../migrations/diesel_occ/sqlite/2026-11-22-900003_occ_locks/up.sql"),
        };
        conn.batch_execute("DROP TABLE occ_locks").unwrap();
        conn.batch_execute(create).unwrap();
        take("the table dropped and created again");
        println!("{BACKEND}: {fences:?}");
        assert!(fences.windows(2).all(|w| w[0].1 < w[1].1), "a fence went back: {fences:?}");

        // Without the fence source, acquiring says which migration creates it.
        conn.batch_execute(match BACKEND {
            "postgres" | "mysql" => "DROP SEQUENCE occ_fence_source",
            _ => "DROP TABLE occ_fence_source",
        })
        .unwrap();
        let err = refused(w.try_lock("purged", "main", Duration::from_secs(30), None));
        assert!(matches!(err, Error::MissingTable { table: "occ_fence_source", .. }), "{err}");
    }

    /// Without the library's migrations, taking a lock says which table is missing and
    /// which migration creates it.
    fn a_missing_lock_table_names_the_migration<W: LockWrites>(db: &Db, w: &W) {
        db.conn().batch_execute("DROP TABLE occ_locks").unwrap();
        let err = refused(w.try_lock("report", "nightly", Duration::from_secs(5), None));
        assert!(matches!(err, Error::MissingTable { table: "occ_locks", .. }), "{err}");
        assert!(err.to_string().contains("diesel_occ::migrations::run"), "{err}");
    }

    /// Bad names and leases are refused before anything is sent; odd but valid names are
    /// bound, stored and read back exactly.
    fn bad_input_is_refused_and_odd_names_are_exact<W: LockWrites>(db: &Db, w: &W) {
        let ttl = Duration::from_secs(30);
        for (name, resource, ttl) in [
            ("", "r", ttl),
            ("n", "", ttl),
            (&*"x".repeat(10_000), "r", ttl),
            ("nul\0", "r", ttl),
            ("n", "r", Duration::ZERO),
            ("n", "r", MAX_TTL + Duration::from_secs(1)),
        ] {
            let err = refused(w.try_lock(name, resource, ttl, None));
            assert!(matches!(err, Error::InvalidName { .. } | Error::InvalidSetting { .. }), "{err}");
        }
        let odd = ["Report", "report", "report ", "rapporté", "'; DROP TABLE occ_locks; --", "ключ/🔒"];
        for name in odd {
            w.release(w.try_lock(name, "r", ttl, Some("label ✓")).unwrap()).unwrap();
        }
        let mut stored: Vec<String> = occ_locks::table.select(occ_locks::lock_name).load(&mut db.conn()).unwrap();
        stored.sort();
        let mut expected: Vec<String> = odd.iter().map(|s| s.to_string()).collect();
        expected.sort();
        assert_eq!(stored, expected);
    }

    tests_on_both_drivers!(
        |db: &Db| db.conn().batch_execute(common::fenced::CREATE).unwrap();
        ;
        pooled:
        a_lapsed_holder_is_locked_out_and_its_fenced_write_refused,
        locks_are_not_reentrant_and_a_dropped_guard_frees_the_lock,
        a_held_row_without_an_expiry_is_taken,
        fences_never_go_back_whatever_happens_to_the_row,
        a_missing_lock_table_names_the_migration,
        bad_input_is_refused_and_odd_names_are_exact,
    );
}

/// Sessions whose transactions are SERIALIZABLE (PostgreSQL's
/// `default_transaction_isolation`): concurrent acquisitions of one row fail with
/// serialization failures, which `lock` waits on like a held lock instead of giving up.
/// 4 workers x 20 holds on a pool of such sessions: every hold is granted, one at a time.
#[cfg(feature = "postgres")]
mod serializable_sessions {
    use super::*;

    use common::drivers::PoolOnUrl;

    type Conn = diesel::PgConnection;
    type Db = common::TestDb<Conn>;
    const BACKEND: &str = "postgres";

    fn db() -> Option<Db> {
        common::postgres()
    }

    fn waiting_for_a_lock_rides_out_serialization_failures<W>(db: &Db, w: &W)
    where
        W: LockWrites + PoolOnUrl,
    {
        const WORKERS: usize = 4;
        const HOLDS: usize = 20;
        let url = format!(
            "{}%20-cdefault_transaction_isolation%3Dserializable",
            db.url
        );
        // A session on the URL both drivers' pools are built from.
        let isolation: String = diesel::select(diesel::dsl::sql::<diesel::sql_types::Text>(
            "current_setting('default_transaction_isolation')",
        ))
        .get_result(&mut Conn::establish(&url).unwrap())
        .unwrap();
        assert_eq!(isolation, "serializable");
        let w = &w.on_url(&url, BACKEND);
        let inside = AtomicBool::new(false);
        let start = Barrier::new(WORKERS);
        std::thread::scope(|s| {
            for worker in 0..WORKERS {
                let (inside, start) = (&inside, &start);
                s.spawn(move || {
                    start.wait();
                    for _ in 0..HOLDS {
                        let label = format!("worker {worker}");
                        let guard = w
                            .lock(
                                "cron",
                                "tick",
                                Duration::from_secs(30),
                                Some(&label),
                                Duration::from_secs(30),
                                &quick(),
                            )
                            .unwrap();
                        assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                        std::thread::sleep(Duration::from_millis(1));
                        inside.store(false, Ordering::SeqCst);
                        w.release(guard).unwrap();
                    }
                });
            }
        });
        let changes: i64 = occ_locks::table
            .select(occ_locks::holder_changes)
            .first(&mut db.conn())
            .unwrap();
        assert_eq!(
            changes,
            (WORKERS * HOLDS) as i64,
            "every hold was granted once"
        );
    }

    crate::tests_on_both_drivers!(
        |_: &Db| ();
        ;
        pooled:
        waiting_for_a_lock_rides_out_serialization_failures,
    );
}
