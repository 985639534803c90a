//! Locks, leases and leaders while the database stalls: another session holds the lock
//! row (`SELECT ... FOR UPDATE`; on SQLite a write transaction, which stalls every writer),
//! or the server's replies come back late over a slow link (PostgreSQL and MariaDB: SQLite
//! has no link). A frozen holder process is `tests/frozen_holder.rs`.
//!
//! Checked from the database side, not from the library's belief:
//! - every holder and leader occupies a "room" row, in a database of its own that the
//!   stalls do not touch, only while it believes it holds the lock; entering a room
//!   someone else occupies is a clash, and there must be none;
//! - when a holder's belief ends by its deadline, the lock row still names it and its
//!   lease by the database's clock has not ended;
//! - a renewal is never a success after the lease ended, and writes nothing then.
//!
//! `OCC_STALL_RUNS=20` repeats every scenario; each run prints its timings.
//!
//! Each body runs on both drivers (the blocking `Locks` on the test's r2d2 pool, and
//! `AsyncLocks` on a bb8 pool of diesel-async connections).

#![cfg(feature = "locks")]

use crate::common;

use std::time::{Duration, Instant};

use common::drivers::{Campaign, KeepAlive, LockRenewals, LockWrites, PoolOnUrl, ReleaseLease};

use chrono::NaiveDateTime;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_occ::{occ_locks, ElectionTiming, Error, LeaderEvent};

diesel::table! {
    room (id) {
        id -> BigInt,
        occupant -> Nullable<Text>,
        entries -> BigInt,
    }
}

const ROOM: &str = "CREATE TABLE room (id BIGINT PRIMARY KEY, occupant VARCHAR(64), \
                    entries BIGINT NOT NULL); INSERT INTO room VALUES (1, NULL, 0)";

/// How many times each scenario runs (`OCC_STALL_RUNS`, default 1).
fn runs() -> usize {
    std::env::var("OCC_STALL_RUNS")
        .ok()
        .and_then(|runs| runs.parse().ok())
        .unwrap_or(1)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[derive(QueryableByName)]
struct Fence {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    #[allow(dead_code)]
    fence: i64,
}

for_each_backend! {
    type Pooled = diesel_occ::Pooled<Conn>;
    type Db = common::TestDb<Conn>;

    /// The database's now, in the form the lock table stores.
    fn db_now(conn: &mut Conn) -> NaiveDateTime {
        let now = match BACKEND {
            "postgres" => "clock_timestamp() AT TIME ZONE 'UTC'",
            "mysql" => "UTC_TIMESTAMP(6)",
            _ => "strftime('%Y-%m-%d %H:%M:%f', 'now')",
        };
        diesel::select(diesel::dsl::sql::<diesel::sql_types::Timestamp>(now))
            .get_result(conn)
            .unwrap()
    }

    /// The lock row of `name`: holder, fence, acquired, expires.
    fn lock_row(conn: &mut Conn, name: &str) -> (Option<String>, i64, Option<NaiveDateTime>, Option<NaiveDateTime>) {
        occ_locks::table
            .find((name, "main"))
            .select((occ_locks::holder, occ_locks::fence, occ_locks::acquired_at, occ_locks::expires_at))
            .first(conn)
            .unwrap()
    }

    /// Another session holds the lock row of `name` (SQLite: the write lock) from now for
    /// `hold`. The thread returns the database's time just before it let go.
    fn stall(db: &Db, name: &str, hold: Duration) -> std::thread::JoinHandle<NaiveDateTime> {
        let mut conn = Conn::establish(&db.url).unwrap();
        if BACKEND == "sqlite" {
            conn.batch_execute("PRAGMA busy_timeout = 10000; BEGIN IMMEDIATE").unwrap();
        } else {
            conn.batch_execute("BEGIN").unwrap();
            let rows = diesel::sql_query(format!(
                "SELECT fence FROM occ_locks WHERE lock_name = '{name}' AND resource = 'main' FOR UPDATE"
            ))
            .load::<Fence>(&mut conn)
            .unwrap();
            assert_eq!(rows.len(), 1, "the lock row exists");
        }
        std::thread::spawn(move || {
            std::thread::sleep(hold);
            let at = db_now(&mut conn);
            conn.batch_execute("COMMIT").unwrap();
            at
        })
    }

    /// The room, in a database of its own.
    fn room() -> Db {
        let db = db().unwrap();
        db.conn().batch_execute(ROOM).unwrap();
        db
    }

    /// Enters the room unless someone is inside: then the clash, from the database.
    fn enter(conn: &mut Pooled, me: &str) -> Result<(), String> {
        let entered = diesel::update(room::table.find(1).filter(room::occupant.is_null()))
            .set((room::occupant.eq(me), room::entries.eq(room::entries + 1)))
            .execute(conn)
            .unwrap();
        if entered == 1 {
            return Ok(());
        }
        let inside: Option<String> = room::table.find(1).select(room::occupant).first(conn).unwrap();
        Err(format!("{me} entered while {inside:?} was inside"))
    }

    fn leave(conn: &mut Pooled, me: &str) {
        let left = diesel::update(room::table.find(1).filter(room::occupant.eq(me)))
            .set(room::occupant.eq(None::<String>))
            .execute(conn)
            .unwrap();
        assert_eq!(left, 1, "{me} was inside");
    }

    /// Occupies the room while `held()`; then checks, when `deadline_ended`, that the
    /// database's lease of `holder` outlived the belief.
    fn occupy(room: &mut Pooled, locks_db: &mut Conn, name: &str, me: &str, holder: &str, held: impl Fn() -> bool) -> Result<(), String> {
        if !held() {
            return Ok(());
        }
        enter(room, me)?;
        while held() {
            std::thread::sleep(ms(1));
        }
        leave(room, me);
        let now = db_now(locks_db);
        let (current, _, _, expires) = lock_row(locks_db, name);
        if current.as_deref() != Some(holder) || expires.is_none_or(|expires| expires <= now) {
            return Err(format!(
                "{me}'s belief outlived its lease: at its end the row names {current:?} until {expires:?}, database now {now}"
            ));
        }
        Ok(())
    }

    /// Creates the lock row of `name`, free.
    fn create_lock_row<P: LockWrites>(p: &P, name: &str) {
        let guard = p.try_lock(name, "main", ms(1000), None).unwrap();
        p.release(guard).unwrap();
    }

    /// An acquisition behind a held row waits for it, then computes its expiry: the grant
    /// starts after the stall ended, by the database's clock, and lasts the whole lease. A
    /// stall longer than the wait bound (a third of the lease) is a retryable refusal that
    /// grants nothing.
    fn an_acquisition_behind_a_held_row_computes_its_expiry_after_the_wait<P: LockWrites>(db: &Db, p: &P) {
        create_lock_row(p, "stalled");
        for run in 0..runs() {
            let conn = &mut Conn::establish(&db.url).unwrap();
            let ttl = ms(3000);

            let stalled = stall(db, "stalled", ms(500));
            let started = Instant::now();
            let guard = p.try_lock("stalled", "main", ttl, Some("a")).unwrap();
            let waited = started.elapsed();
            let stall_ended = stalled.join().unwrap();
            let (_, _, acquired, expires) = lock_row(conn, "stalled");
            let (acquired, expires) = (acquired.unwrap(), expires.unwrap());
            println!("{BACKEND} run {run}: granted after {waited:?}; stall ended {stall_ended}, acquired {acquired}, expires {expires}");
            assert!(acquired >= stall_ended, "the expiry was computed before the wait ended");
            assert!(expires - acquired >= chrono::Duration::milliseconds(2999), "{acquired} .. {expires}");
            assert!(P::is_held(&guard));
            p.release(guard).unwrap();

            let stalled = stall(db, "stalled", ms(1600));
            let started = Instant::now();
            let refused = p.try_lock("stalled", "main", ttl, Some("b"));
            let waited = started.elapsed();
            stalled.join().unwrap();
            println!("{BACKEND} run {run}: behind a 1.6 s stall, {:?} after {waited:?}", refused.as_ref().err());
            let refused = refused.map(|guard| p.drop_guard(guard));
            assert!(matches!(refused, Err(Error::Retryable { .. })), "{:?}", refused.err());
            assert_eq!(lock_row(conn, "stalled").0, None, "nothing was granted");
        }
    }

    /// A 900 ms lease whose row is held for 2.5 s: no renewal succeeds after the lease
    /// ended, none writes anything, the holder learns `LockLost` and its belief ends; a
    /// contender takes the lock once the stall is over, with a higher fence.
    fn a_renewal_that_comes_too_late_never_succeeds<P: LockRenewals>(db: &Db, p: &P) {
        create_lock_row(p, "renewed");
        for run in 0..runs() {
            let conn = &mut Conn::establish(&db.url).unwrap();
            let mut guard = p.try_lock("renewed", "main", ms(900), Some("a")).unwrap();
            let (_, _, _, granted_until) = lock_row(conn, "renewed");
            let deadline = P::deadline(&guard).unwrap();
            let started = Instant::now();
            let stalled = stall(db, "renewed", ms(2500));
            let mut outcomes = Vec::new();
            let lost = loop {
                let result = p.renew(&mut guard);
                outcomes.push((started.elapsed(), result.as_ref().err().map(common::faults::class_of)));
                match result {
                    Ok(()) => assert!(Instant::now() < deadline, "a renewal succeeded after the deadline"),
                    Err(Error::LockLost { why, .. }) => break why,
                    Err(_) => std::thread::sleep(ms(50)),
                }
            };
            stalled.join().unwrap();
            println!("{BACKEND} run {run}: renewals {outcomes:?}; lost: {lost}");
            assert!(!P::is_held(&guard));
            assert_eq!(lock_row(conn, "renewed").3, granted_until, "a late renewal wrote an expiry");
            let next = p.try_lock("renewed", "main", ms(900), Some("b")).unwrap();
            assert!(P::fence(&next) > P::fence(&guard));
            assert!(matches!(p.renew(&mut guard), Err(Error::LockLost { .. })));
            p.release(next).unwrap();
            p.drop_guard(guard);
        }
    }

    tests_on_both_drivers!(
        |_: &Db| ();
        ;
        pooled:
        an_acquisition_behind_a_held_row_computes_its_expiry_after_the_wait,
        a_renewal_that_comes_too_late_never_succeeds,
        a_kept_alive_lease_ends_at_its_deadline_while_its_row_is_held,
        a_lease_lost_for_want_of_renewal_is_still_freed_by_its_release,
        leaders_never_overlap_while_the_lease_row_is_held,
        a_slow_link_does_not_stretch_the_belief,
        a_link_cut_after_the_grants_commit_is_granted_or_ambiguous,
        a_lock_wait_cancelled_from_outside_is_retryable_and_grants_nothing,
    );

    /// A kept-alive 900 ms lease whose row is held for 2.5 s: `check()` turns false at the
    /// deadline and never back, the contender that takes over after the database's lease
    /// ended never shares the room with it.
    fn a_kept_alive_lease_ends_at_its_deadline_while_its_row_is_held<P: KeepAlive>(db: &Db, p: &P) {
        create_lock_row(p, "kept");
        for run in 0..runs() {
            let room = room();
            let lease = p.keep_alive(p.try_lock("kept", "main", ms(900), Some("a")).unwrap());
            let holder = {
                let conn = &mut Conn::establish(&db.url).unwrap();
                lock_row(conn, "kept").0.unwrap()
            };
            let (url, room_pool, lease_ref) = (db.url.as_str(), &room.pool, &lease);
            let started = Instant::now();
            let stalled = stall(db, "kept", ms(2500));
            let (checks, occupied, taken) = std::thread::scope(|s| {
                let sampler = s.spawn(|| {
                    let mut checks = Vec::new();
                    while started.elapsed() < ms(4000) {
                        checks.push((started.elapsed(), P::lease_check(lease_ref).is_ok()));
                        std::thread::sleep(ms(2));
                    }
                    checks
                });
                let worker = s.spawn(|| {
                    let conn = &mut Conn::establish(url).unwrap();
                    occupy(&mut room_pool.get().unwrap(), conn, "kept", "a", &holder, || P::lease_is_held(lease_ref))
                });
                let contender = s.spawn(|| {
                    let guard = p
                        .lock("kept", "main", ms(900), Some("c"), ms(10_000), &diesel_occ::RetryPolicy::default().first_delay(ms(5)).max_delay(ms(20)))
                        .unwrap();
                    let at = started.elapsed();
                    let conn = &mut Conn::establish(url).unwrap();
                    let holder = lock_row(conn, "kept").0.unwrap();
                    let until = Instant::now() + ms(300);
                    let occupied = occupy(&mut room_pool.get().unwrap(), conn, "kept", "c", &holder, || P::is_held(&guard) && Instant::now() < until);
                    let fence = P::fence(&guard);
                    p.release(guard).unwrap();
                    (fence, at, occupied)
                });
                (sampler.join().unwrap(), worker.join().unwrap(), contender.join().unwrap())
            });
            stalled.join().unwrap();
            let first_false = checks.iter().find(|(_, ok)| !ok).map(|(at, _)| *at).expect("the lease was lost");
            let revived = checks.iter().any(|(at, ok)| *ok && *at > first_false);
            println!("{BACKEND} run {run}: check() false from {first_false:?}, contender took fence {} at {:?}", taken.0, taken.1);
            assert!(!revived, "check() was Ok again after it failed");
            occupied.unwrap();
            taken.2.unwrap();
            assert!(taken.0 > P::lease_fence(&lease));
            assert!(matches!(P::lease_check(&lease), Err(Error::LockLost { .. })));
            p.drop_lease(lease);
        }
    }

    /// A kept-alive 900 ms lease whose row is held for 2 s: its keep-alive gives up at the
    /// deadline, and nobody takes the lock over meanwhile. Its release still frees the row
    /// (the next holder need not wait for the database's lease to end).
    fn a_lease_lost_for_want_of_renewal_is_still_freed_by_its_release<P: ReleaseLease>(db: &Db, p: &P) {
        create_lock_row(p, "unrenewed");
        let conn = &mut Conn::establish(&db.url).unwrap();
        let lease = p.keep_alive(p.try_lock("unrenewed", "main", ms(900), Some("a")).unwrap());
        stall(db, "unrenewed", ms(2000)).join().unwrap();
        assert!(matches!(P::lease_check(&lease), Err(Error::LockLost { .. })));
        let released = p.release_lease(lease);
        assert!(released.is_ok(), "{BACKEND}: {released:?}");
        assert_eq!(lock_row(conn, "unrenewed").0, None, "the release left the row held");
    }

    /// Two candidates, lease 1 s, renew deadline 700 ms; the lease row is held for 2.5 s.
    /// The leader's `is_leader()` turns false and its `Lost` arrives before anyone is
    /// elected again (the other candidate, or the old leader in a new term); the two are
    /// never leaders at once, by their own word and by the room.
    fn leaders_never_overlap_while_the_lease_row_is_held<P: Campaign>(db: &Db, p: &P) {
        let timing = ElectionTiming {
            lease: ms(1000),
            renew_deadline: ms(700),
            retry_period: ms(200),
        };
        create_lock_row(p, "leader");
        for run in 0..runs() {
            let room = room();
            let room_conn = &mut room.conn();
            let mut a = p.start_candidate("leader", "main", "a", timing).unwrap();
            let first_term = match p.next_event(&mut a, ms(5000)) {
                Some(LeaderEvent::Elected { fence }) => fence,
                other => panic!("{other:?}"),
            };
            let b = p.start_candidate("leader", "main", "b", timing).unwrap();
            let mut candidates = [(a, "a"), (b, "b")];
            let started = Instant::now();
            let stalled = stall(db, "leader", ms(2500));
            let (mut a_lost, mut next_term, mut both) = (None, None, 0);
            let mut inside = [false, false];
            while started.elapsed() < ms(8000) && next_term.is_none() {
                for (i, (candidate, me)) in candidates.iter().enumerate() {
                    let leads = P::is_leader(candidate);
                    if leads && !inside[i] {
                        enter(room_conn, me).unwrap();
                        inside[i] = true;
                    } else if !leads && inside[i] {
                        leave(room_conn, me);
                        inside[i] = false;
                    }
                }
                both += usize::from(P::is_leader(&candidates[0].0) && P::is_leader(&candidates[1].0));
                for (candidate, me) in candidates.iter_mut() {
                    match p.next_event(candidate, Duration::ZERO) {
                        Some(LeaderEvent::Lost { reason }) => a_lost = Some((started.elapsed(), *me, reason)),
                        Some(LeaderEvent::Elected { fence }) => next_term = Some((started.elapsed(), *me, fence)),
                        _ => {}
                    }
                }
                std::thread::sleep(ms(1));
            }
            stalled.join().unwrap();
            println!("{BACKEND} run {run}: lost at {a_lost:?}; elected next at {next_term:?}; both leaders in {both} samples");
            let (lost_at, loser, _) = a_lost.expect("the old leader was told it lost");
            let (elected_at, _, fence) = next_term.expect("a leader was elected again");
            assert_eq!(loser, "a");
            assert!(lost_at < elected_at);
            assert_eq!(both, 0, "two leaders at once");
            assert!(fence > first_term);
            let [(a, _), (b, _)] = candidates;
            drop(p.stop(b));
            drop(p.stop(a));
        }
    }

    /// Replies held back on a slow link (150 ms a piece on PostgreSQL, 50 ms on MySQL): the holder's belief is measured from
    /// before its request, so it ends before the database's lease, and the contender that
    /// takes over once that lease ended never shares the room with it.
    fn a_slow_link_does_not_stretch_the_belief<P>(db: &Db, p: &P)
    where
        P: LockRenewals + PoolOnUrl,
        P::Guard: Sync,
    {
        let server_port = match BACKEND {
            "postgres" => 5432,
            "mysql" => 3306,
            // Embedded: no link to slow down.
            _ => return,
        };
        create_lock_row(p, "slow");
        for run in 0..runs() {
            let room = room();
            let link = common::slow_link::SlowLink::to(&format!("127.0.0.1:{server_port}"));
            let slow = p.on_url(&link.url(&db.url, server_port), BACKEND);
            slow.drop_guard(slow.try_lock("warm", "main", ms(1000), None).unwrap());
            // MySQL's replies come in more pieces, each held back.
            link.set_latency(ms(if BACKEND == "mysql" { 50 } else { 150 }));
            let started = Instant::now();
            let guard = slow.try_lock("slow", "main", ms(3000), Some("a")).unwrap();
            let granted = started.elapsed();
            link.set_latency(Duration::ZERO);
            let conn = &mut Conn::establish(&db.url).unwrap();
            let (holder, _, acquired, expires) = lock_row(conn, "slow");
            let holder = holder.unwrap();
            let (url, room_pool, guard_ref) = (db.url.as_str(), &room.pool, &guard);
            let (occupied, taken) = std::thread::scope(|s| {
                let worker = s.spawn(|| {
                    let conn = &mut Conn::establish(url).unwrap();
                    occupy(&mut room_pool.get().unwrap(), conn, "slow", "a", &holder, || P::is_held(guard_ref))
                });
                let contender = s.spawn(|| {
                    let next = p
                        .lock("slow", "main", ms(3000), Some("c"), ms(10_000), &diesel_occ::RetryPolicy::default().first_delay(ms(5)).max_delay(ms(20)))
                        .unwrap();
                    let conn = &mut Conn::establish(url).unwrap();
                    let holder = lock_row(conn, "slow").0.unwrap();
                    let until = Instant::now() + ms(200);
                    let occupied = occupy(&mut room_pool.get().unwrap(), conn, "slow", "c", &holder, || P::is_held(&next) && Instant::now() < until)
                        .map(|()| (P::fence(&next), started.elapsed()));
                    p.release(next).unwrap();
                    occupied
                });
                (worker.join().unwrap(), contender.join().unwrap())
            });
            let belief = P::deadline(&guard).map(|d| d - started);
            println!("{BACKEND} run {run}: granted after {granted:?} (acquired {acquired:?}, expires {expires:?}); belief for {belief:?}; contender {taken:?}");
            occupied.unwrap();
            let (fence, _) = taken.unwrap();
            assert!(fence > P::fence(&guard));
            slow.drop_guard(guard);
        }
    }

    /// The link is cut right after the server answered an acquisition's `COMMIT`: MySQL
    /// then reads the grant back (a Galera node can answer a `COMMIT` that ended nothing)
    /// and finds the connection lost, PostgreSQL sends nothing more. The caller is told it
    /// holds the lock or that it may (`Ambiguous`), never a plain failure while the row
    /// names it for the whole lease.
    fn a_link_cut_after_the_grants_commit_is_granted_or_ambiguous<P>(db: &Db, p: &P)
    where
        P: LockWrites + PoolOnUrl,
    {
        let server_port = match BACKEND {
            "postgres" => 5432,
            "mysql" => 3306,
            // Embedded: no link to cut.
            _ => return,
        };
        create_lock_row(p, "cut");
        for run in 0..runs() {
            let link = common::slow_link::SlowLink::to(&format!("127.0.0.1:{server_port}"));
            let cut = p.on_url(&link.url(&db.url, server_port), BACKEND);
            cut.release(cut.try_lock("warm", "main", ms(1000), None).unwrap()).unwrap();
            link.cut_after_reply_to(b"COMMIT");
            let label = format!("cut-{run}");
            let granted = cut.try_lock("cut", "main", ms(60_000), Some(&label));
            assert_eq!(link.cuts(), 1, "the link was cut after the COMMIT");
            let conn = &mut Conn::establish(&db.url).unwrap();
            let (holder, fence, _, _) = lock_row(conn, "cut");
            let in_row: Option<String> = occ_locks::table
                .find(("cut", "main"))
                .select(occ_locks::label)
                .first(conn)
                .unwrap();
            println!("{BACKEND} run {run}: {:?}; the row: {holder:?}, {in_row:?}, fence {fence}", granted.as_ref().err());
            assert!(holder.is_some() && in_row.as_deref() == Some(label.as_str()), "the grant committed");
            match granted {
                Ok(guard) => {
                    assert_ne!(BACKEND, "mysql", "a grant MySQL could not read back was believed");
                    assert_eq!(P::fence(&guard), fence);
                    // Its pool may hand the cut connection out again: freed by hand below.
                    cut.drop_guard(guard);
                }
                Err(Error::Ambiguous { .. }) => {}
                Err(other) => panic!("a committed grant reported as {other:?}"),
            }
            diesel::sql_query("UPDATE occ_locks SET holder = NULL, expires_at = NULL WHERE lock_name = 'cut'")
                .execute(conn)
                .unwrap();
        }
    }

    /// The server session of a statement waiting on a lock row, once it has waited a
    /// while (a statement's short waits end before a cancel would reach them).
    fn waiting_session(conn: &mut Conn) -> i64 {
        #[derive(QueryableByName)]
        struct Session {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            id: i64,
        }
        // This test's sessions only (its database on MySQL, its schema's application name
        // on PostgreSQL): other tests run on the same servers.
        let sql = match BACKEND {
            "postgres" => {
                "SELECT pid::bigint AS id FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND application_name = current_setting('application_name') \
                 AND query LIKE '%occ_locks%' \
                 AND clock_timestamp() - query_start > interval '200 milliseconds' \
                 AND pid <> pg_backend_pid()"
            }
            _ => {
                "SELECT CAST(id AS SIGNED) AS id FROM information_schema.processlist \
                 WHERE command IN ('Query', 'Execute') AND db = DATABASE() \
                 AND info LIKE '%occ_locks%' AND time_ms > 200 AND id <> CONNECTION_ID()"
            }
        };
        let started = Instant::now();
        loop {
            if let Some(session) = diesel::sql_query(sql).load::<Session>(conn).unwrap().first() {
                return session.id;
            }
            assert!(started.elapsed() < ms(10_000), "no statement waits on the lock row");
            std::thread::sleep(ms(5));
        }
    }

    /// An acquisition waiting behind a held row whose statement is cancelled from outside
    /// (PostgreSQL's `pg_cancel_backend`, which reports "due to user request" as a timeout
    /// of the library's own bound can; MariaDB's `KILL QUERY`): a retryable refusal, never
    /// a raw database error, and nothing granted.
    fn a_lock_wait_cancelled_from_outside_is_retryable_and_grants_nothing<P: LockWrites>(db: &Db, p: &P) {
        if BACKEND == "sqlite" {
            return; // no statement of another session to cancel
        }
        create_lock_row(p, "cancelled");
        for run in 0..runs() {
            // Held well past the cancel (the canceller waits for 200 ms of waiting), and
            // short of the acquisition's own bound (10 s).
            let stalled = stall(db, "cancelled", ms(6000));
            let url = db.url.clone();
            let canceller = std::thread::spawn(move || {
                let conn = &mut Conn::establish(&url).unwrap();
                let id = waiting_session(conn);
                println!("{BACKEND}: cancelling the statement of session {id}");
                let cancel = match BACKEND {
                    "postgres" => format!("SELECT pg_cancel_backend({id})"),
                    _ => format!("KILL QUERY {id}"),
                };
                diesel::sql_query(cancel).execute(conn).unwrap();
            });
            let started = Instant::now();
            let refused = p.try_lock("cancelled", "main", ms(30_000), Some("a"));
            let waited = started.elapsed();
            canceller.join().unwrap();
            stalled.join().unwrap();
            println!("{BACKEND} run {run}: after {waited:?}: {:?}", refused.as_ref().err());
            let refused = refused.map(|guard| p.drop_guard(guard));
            match (BACKEND, &refused) {
                // The cancel's "due to user request", as the bound's own timeouts.
                ("postgres", Err(Error::Retryable { reason: diesel_occ::RetryReason::LockTimeout, .. })) => {}
                // `KILL QUERY`'s 1317.
                ("mysql", Err(Error::Retryable { .. })) => {}
                _ => panic!("{:?}", refused.err()),
            }
            assert!(waited < ms(5000), "the cancel ended the wait");
            let conn = &mut Conn::establish(&db.url).unwrap();
            assert_eq!(lock_row(conn, "cancelled").0, None, "nothing was granted");
        }
    }
}
