//! Work guarded by the lock itself: writes that commit only while the lock is held by the
//! database's clock (`write_while_held`), `with_lock` that renews while the work runs and
//! tells it when the lock is lost, and a leader's job that is stopped and awaited before
//! the lock is freed.
//!
//! Checked from the database side: a ledger row counts the protected writes and the fence
//! each carried, and counts a "regression" whenever a write lands with a fence older than
//! the one before it (a write of a holder that was already replaced).
//!
//! The protected-write bodies run on both drivers (the blocking `Locks` on the test's
//! r2d2 pool, and `AsyncLocks` on a bb8 pool of diesel-async connections).

#![cfg(feature = "locks")]

use crate::common;

use common::drivers::{CampaignWithJob, LockWrites};

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_occ::{
    occ_locks, Candidate, ElectionTiming, Error, Held, LeaderEvent, Locks, RetryPolicy,
};

diesel::table! {
    ledger (id) {
        id -> BigInt,
        writes -> BigInt,
        last_fence -> BigInt,
        regressions -> BigInt,
    }
}

diesel::table! {
    job_exits (term) {
        term -> BigInt,
        lock_still_held -> BigInt,
    }
}

const TABLES: &str = "CREATE TABLE ledger (id BIGINT PRIMARY KEY, writes BIGINT NOT NULL, \
     last_fence BIGINT NOT NULL, regressions BIGINT NOT NULL); \
     INSERT INTO ledger VALUES (1, 0, 0, 0); \
     CREATE TABLE job_exits (term BIGINT PRIMARY KEY, lock_still_held BIGINT NOT NULL)";

/// A time long past, by every backend's clock and in SQLite's text form.
const LONG_AGO: &str = "2000-01-01 00:00:00.000";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn quick() -> RetryPolicy {
    RetryPolicy::default().first_delay(ms(1)).max_delay(ms(10))
}

/// Fast election timings: lease 1 s, renew deadline 700 ms, retries every 100 ms.
fn timing() -> ElectionTiming {
    ElectionTiming {
        lease: ms(1000),
        renew_deadline: ms(700),
        retry_period: ms(100),
    }
}

/// The protected write: one more write, carrying `fence`; a fence older than the last
/// one recorded counts as a regression.
fn record_sql(fence: i64) -> String {
    format!(
        "UPDATE ledger SET writes = writes + 1, \
         regressions = regressions + CASE WHEN last_fence > {fence} THEN 1 ELSE 0 END, \
         last_fence = {fence} WHERE id = 1"
    )
}

/// [`record_sql`] on `conn`.
fn record<C>(conn: &mut C, fence: i64) -> Result<usize, Error>
where
    C: diesel::Connection,
    C::Backend: diesel::backend::Backend,
    diesel::query_builder::SqlQuery: diesel::query_dsl::methods::ExecuteDsl<C>,
{
    diesel::sql_query(record_sql(fence))
        .execute(conn)
        .map_err(Error::from)
}

/// A job's own error, or diesel-occ's.
#[derive(Debug, PartialEq)]
enum JobError {
    Occ(String),
    Refused,
}

impl From<Error> for JobError {
    fn from(e: Error) -> Self {
        JobError::Occ(e.to_string())
    }
}

fn lost_why(result: Result<impl std::fmt::Debug, Error>) -> String {
    match result {
        Err(Error::LockLost { why, .. }) => why,
        other => panic!("expected LockLost, got {other:?}"),
    }
}

for_each_backend! {
    type Db = common::TestDb<Conn>;
    type Pooled = diesel_occ::Pooled<Conn>;

    fn setup() -> Option<common::TestDb<Conn>> {
        let db = db()?;
        db.conn().batch_execute(TABLES).unwrap();
        Some(db)
    }

    /// (writes, last fence, regressions) of the ledger.
    fn ledger_row(conn: &mut Pooled) -> (i64, i64, i64) {
        ledger::table.find(1).select((ledger::writes, ledger::last_fence, ledger::regressions)).first(conn).unwrap()
    }

    fn expire_by_hand(conn: &mut Pooled, name: &str) {
        diesel::sql_query(format!("UPDATE occ_locks SET expires_at = '{LONG_AGO}' WHERE lock_name = '{name}'"))
            .execute(conn)
            .unwrap();
    }

    fn holder_of(conn: &mut Pooled, name: &str) -> Option<String> {
        occ_locks::table.find((name, "main")).select(occ_locks::holder).first(conn).unwrap()
    }

    /// A holder whose lease ended by the database's clock (its own belief still says held)
    /// and was taken over: its protected write is rolled back and names the new holder;
    /// the new holder's lands. A write's own error rolls back and comes back unchanged.
    fn a_protected_write_lands_only_while_the_lock_is_held<P: LockWrites>(db: &Db, p: &P) {
        let conn = &mut db.conn();
        let write = |guard: &P::Guard, fail: bool| p.write_while_held(guard, "", "", &record_sql(P::fence(guard)), fail);
        let old = p.try_lock("report", "main", Duration::from_secs(60), Some("host-a")).unwrap();
        write(&old, false).unwrap();
        assert_eq!(ledger_row(conn), (1, P::fence(&old), 0));

        // The write ran, then answered its own error.
        let refused = write(&old, true);
        assert!(matches!(refused, Err(Error::Database(diesel::result::Error::RollbackTransaction))), "{refused:?}");
        assert_eq!(ledger_row(conn), (1, P::fence(&old), 0), "rolled back");

        expire_by_hand(conn, "report");
        let new = p.try_lock("report", "main", Duration::from_secs(60), Some("host-b")).unwrap();
        assert!(P::is_held(&old), "the old holder's belief still says held: only the database knows");
        let why = lost_why(write(&old, false));
        assert!(why.contains("host-b holds it now"), "{why}");
        assert!(!P::is_held(&old), "a refused write ends the belief");
        assert_eq!(ledger_row(conn), (1, P::fence(&old), 0), "the stale write was rolled back");
        // Refused at once now, without a round trip.
        assert!(matches!(write(&old, false), Err(Error::LockLost { .. })));

        write(&new, false).unwrap();
        assert_eq!(ledger_row(conn), (2, P::fence(&new), 0));
        p.release(new).unwrap();
        assert!(matches!(p.release(old), Err(Error::LockLost { .. })));
    }

    /// Refused when the lease ended by the database's clock with nobody after it, when the
    /// lock row was deleted, and after a release; nothing written each time.
    fn a_protected_write_is_refused_when_the_lease_ended_or_the_row_is_gone<P: LockWrites>(db: &Db, p: &P) {
        let conn = &mut db.conn();

        let lapsed = p.try_lock("report", "main", Duration::from_secs(60), None).unwrap();
        expire_by_hand(conn, "report");
        let why = lost_why(p.write_while_held(&lapsed, "", "", &record_sql(1), false));
        assert_eq!(why, "its lease ended");

        let purged = p.try_lock("report", "main", Duration::from_secs(60), None).unwrap();
        diesel::delete(occ_locks::table).execute(conn).unwrap();
        let why = lost_why(p.write_while_held(&purged, "", "", &record_sql(1), false));
        assert_eq!(why, "its row was deleted");

        let guard = p.try_lock("report", "main", Duration::from_secs(60), None).unwrap();
        let handle = p.keep_alive_and_release(guard).unwrap();
        assert!(matches!(p.write_while_held_by(&handle, &record_sql(1)), Err(Error::LockLost { .. })));
        assert_eq!(ledger_row(conn), (0, 0, 0));
        p.drop_guard(lapsed);
        p.drop_guard(purged);
    }

    /// The database-side check reads the lease in UTC whatever the session's time zone:
    /// from sessions 13 or 14 hours ahead of UTC and 11 behind it, a held lease lets the write
    /// through and an ended one refuses it (SQLite sessions have no time zone). Each write's
    /// pooled connection is set to the zone first and back to the server's after.
    fn the_lease_check_does_not_depend_on_the_sessions_time_zone<P: LockWrites>(db: &Db, p: &P) {
        let (zones, reset): ([&str; 2], &str) = match BACKEND {
            "postgres" => (["SET TIME ZONE 'Pacific/Kiritimati'", "SET TIME ZONE 'Pacific/Pago_Pago'"], "RESET TIME ZONE"),
            "mysql" => (["SET time_zone = '+13:00'", "SET time_zone = '-11:00'"], "SET time_zone = DEFAULT"),
            _ => return,
        };
        let guard = p.try_lock("report", "main", Duration::from_secs(60), None).unwrap();
        for zone in zones {
            p.write_while_held(&guard, zone, reset, &record_sql(P::fence(&guard)), false).unwrap();
        }
        p.release(guard).unwrap();
        for zone in zones {
            let lapsed = p.try_lock("report", "main", Duration::from_secs(60), None).unwrap();
            expire_by_hand(&mut db.conn(), "report");
            let refused = p.write_while_held(&lapsed, zone, reset, &record_sql(P::fence(&lapsed)), false);
            assert_eq!(lost_why(refused), "its lease ended", "{zone}");
            p.drop_guard(lapsed);
        }
        assert_eq!(ledger_row(&mut db.conn()).0, 2);
    }

    /// On PostgreSQL a lease's times are instants (`timestamptz`): from sessions 11 hours
    /// behind UTC, in UTC and 14 hours ahead, an operator's `expires_at > now()` is true
    /// while the lease lasts, and the time left is the lease's. MySQL's `DATETIME` and
    /// SQLite's text have no zone: their times are UTC by the database's clock, as the
    /// library writes and compares them.
    fn a_lease_reads_as_the_same_instant_in_every_session_time_zone<P: LockWrites>(db: &Db, p: &P) {
        if BACKEND != "postgres" {
            return;
        }
        #[derive(QueryableByName, Debug)]
        struct Lease {
            #[diesel(sql_type = diesel::sql_types::Bool)]
            ahead: bool,
            #[diesel(sql_type = diesel::sql_types::Double)]
            seconds: f64,
        }
        #[derive(QueryableByName)]
        struct Kind {
            #[diesel(sql_type = diesel::sql_types::Text)]
            name: String,
        }
        let conn = &mut db.conn();
        let kinds: Vec<String> = diesel::sql_query(
            "SELECT data_type AS name FROM information_schema.columns WHERE table_name = 'occ_locks' \
             AND column_name IN ('acquired_at', 'renewed_at', 'expires_at') AND table_schema = current_schema()",
        )
        .load::<Kind>(conn)
        .unwrap()
        .into_iter()
        .map(|row| row.name)
        .collect();
        assert_eq!(kinds, ["timestamp with time zone"; 3]);
        let guard = p.try_lock("zoned", "main", Duration::from_secs(60), None).unwrap();
        for zone in ["Pacific/Pago_Pago", "UTC", "Pacific/Kiritimati"] {
            let mut reader = Conn::establish(&db.url).unwrap();
            reader.batch_execute(&format!("SET TIME ZONE '{zone}'")).unwrap();
            let lease: Lease = diesel::sql_query(
                "SELECT expires_at > now() AS ahead, \
                 EXTRACT(EPOCH FROM expires_at - now())::float8 AS seconds \
                 FROM occ_locks WHERE lock_name = 'zoned'",
            )
            .get_result(&mut reader)
            .unwrap();
            assert!(lease.ahead && lease.seconds > 50.0 && lease.seconds <= 60.0, "{zone}: {lease:?}");
        }
        p.release(guard).unwrap();
    }

    /// Four holders take turns on one lock while a saboteur keeps ending the current
    /// lease by the database's clock (the holders' beliefs never notice): every
    /// protected write that reports success landed, in fence order, and no write of a
    /// replaced holder landed.
    fn replaced_holders_never_land_a_write_under_racing_takeovers<P: LockWrites>(db: &Db, p: &P) {
        const HOLDERS: usize = 4;
        const ROUNDS: usize = 15;
        let (landed, refused) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let done = AtomicBool::new(false);
        let start = &Barrier::new(HOLDERS + 1);
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..HOLDERS)
                .map(|h| {
                    let (landed, refused) = (&landed, &refused);
                    s.spawn(move || {
                        start.wait();
                        for _ in 0..ROUNDS {
                            let guard = p.lock("ledger", "main", Duration::from_secs(60), Some(&format!("holder {h}")), Duration::from_secs(120), &quick()).unwrap();
                            for _ in 0..4 {
                                match p.write_while_held(&guard, "", "", &record_sql(P::fence(&guard)), false) {
                                    Ok(_) => landed.fetch_add(1, Ordering::SeqCst),
                                    Err(Error::LockLost { .. }) => {
                                        refused.fetch_add(1, Ordering::SeqCst);
                                        break;
                                    }
                                    Err(e) if e.is_retryable() => continue,
                                    Err(e) => panic!("{e}"),
                                };
                            }
                            let _ = p.release(guard);
                        }
                    })
                })
                .collect();
            let (saboteur_done, pool) = (&done, &db.pool);
            let saboteur = s.spawn(move || {
                let mut conn = pool.get().unwrap();
                start.wait();
                let mut takeovers = 0;
                while !saboteur_done.load(Ordering::SeqCst) {
                    if diesel::sql_query(format!("UPDATE occ_locks SET expires_at = '{LONG_AGO}' WHERE holder IS NOT NULL")).execute(&mut conn).is_ok() {
                        takeovers += 1;
                    }
                    std::thread::sleep(ms(3));
                }
                takeovers
            });
            for worker in workers {
                worker.join().unwrap();
            }
            done.store(true, Ordering::SeqCst);
            let takeovers = saboteur.join().unwrap();
            println!("{BACKEND}: {} writes landed, {} refused, {takeovers} leases ended by hand", landed.load(Ordering::SeqCst), refused.load(Ordering::SeqCst));
        });
        let (writes, _, regressions) = ledger_row(&mut db.conn());
        assert_eq!(regressions, 0, "a replaced holder's write landed after its successor's");
        assert_eq!(writes as usize, landed.load(Ordering::SeqCst), "every write reported landed did, and no other");
    }

    tests_on_both_drivers!(
        |db: &Db| db.conn().batch_execute(TABLES).unwrap();
        ;
        pooled:
        a_protected_write_lands_only_while_the_lock_is_held,
        a_protected_write_is_refused_when_the_lease_ended_or_the_row_is_gone,
        the_lease_check_does_not_depend_on_the_sessions_time_zone,
        a_lease_reads_as_the_same_instant_in_every_session_time_zone,
        replaced_holders_never_land_a_write_under_racing_takeovers,
        with_lock_renews_while_the_work_runs_then_releases,
        with_lock_tells_the_work_when_the_lock_is_lost,
        a_job_that_returns_or_panics_ends_its_term_and_the_candidate_campaigns_again,
    );

    /// `with_lock` on either driver, the work's steps given.
    trait WithLock {
        /// `with_lock` of `report` for `ttl` (label `worker`) whose work, `writes` times,
        /// pauses for `pause` (the lock lost meanwhile ends the work) and then makes a
        /// protected write, then tries to take the lock itself: the fence and that try's
        /// answer.
        fn with_lock_writing(&self, ttl: Duration, writes: usize, pause: Duration) -> Result<(i64, Result<(), Error>), Error>;
        /// `with_lock` of `report` whose work answers its own error.
        fn with_lock_refusing(&self, ttl: Duration) -> Result<(), JobError>;
        /// `with_lock` of `report` whose work does nothing: the answer, and whether the
        /// work ran.
        fn with_lock_idle(&self, ttl: Duration) -> (Result<(), Error>, bool);
        /// `with_lock` of `report` for `ttl` whose work runs `take_over`, sleeps a minute
        /// under the lock (`Held::sleep`, `Held::sleep_async`) and then tries a protected
        /// write: the answer, and what the sleep answered.
        fn with_lock_sleeping_through(&self, ttl: Duration, take_over: impl Fn() + Send + Sync) -> (Result<&'static str, Error>, Option<Result<(), Error>>);
    }

    type R2d2Pool = diesel::r2d2::Pool<diesel_occ::CheckedManager<Conn>>;

    impl WithLock for common::drivers::BlockingPool<R2d2Pool> {
        fn with_lock_writing(&self, ttl: Duration, writes: usize, pause: Duration) -> Result<(i64, Result<(), Error>), Error> {
            let locks = Locks::new(self.0.clone());
            locks.with_lock("report", "main", ttl, Some("worker"), |held| {
                let mut conn = self.0.get().unwrap();
                for _ in 0..writes {
                    held.sleep(pause)?;
                    held.write_while_held(&mut conn, |c| record(c, held.fence()))?;
                }
                let meanwhile = locks.try_lock("report", "main", ms(300), None).map(drop);
                Ok::<_, Error>((held.fence(), meanwhile))
            })
        }
        fn with_lock_refusing(&self, ttl: Duration) -> Result<(), JobError> {
            Locks::new(self.0.clone()).with_lock("report", "main", ttl, None, |_| Err::<(), _>(JobError::Refused))
        }
        fn with_lock_idle(&self, ttl: Duration) -> (Result<(), Error>, bool) {
            let mut ran = false;
            let held = Locks::new(self.0.clone()).with_lock("report", "main", ttl, None, |_| {
                ran = true;
                Ok::<_, Error>(())
            });
            (held, ran)
        }
        fn with_lock_sleeping_through(&self, ttl: Duration, take_over: impl Fn() + Send + Sync) -> (Result<&'static str, Error>, Option<Result<(), Error>>) {
            let mut slept = None;
            let outcome = Locks::new(self.0.clone()).with_lock("report", "main", ttl, None, |held| {
                take_over();
                slept = Some(held.sleep(Duration::from_secs(60)));
                assert!(held.write_while_held(&mut self.0.get().unwrap(), |c| record(c, held.fence())).is_err());
                Ok::<_, Error>("done")
            });
            (outcome, slept)
        }
    }

    #[cfg(all(feature = "bb8", any(not(feature = "mysql"), feature = "async-mysql")))]
    type Async_ = <Conn as common::paths::AsyncOf>::Async;

    #[cfg(all(feature = "bb8", any(not(feature = "mysql"), feature = "async-mysql")))]
    impl WithLock for common::drivers::AsyncPool<diesel_async::pooled_connection::bb8::Pool<Async_>> {
        fn with_lock_writing(&self, ttl: Duration, writes: usize, pause: Duration) -> Result<(i64, Result<(), Error>), Error> {
            use diesel_occ::asynchronous::AsyncLocks;
            let locks = AsyncLocks::new(self.pool.clone());
            let (locks, pool) = (&locks, &self.pool);
            self.runtime.block_on(locks.with_lock("report", "main", ttl, Some("worker"), async move |held: Held| {
                let mut conn = pool.get().await.unwrap();
                for _ in 0..writes {
                    held.sleep_async(pause).await?;
                    let sql = record_sql(held.fence());
                    held.write_while_held_async(&mut *conn, async move |c: &mut Async_| {
                        diesel_async::RunQueryDsl::execute(diesel::sql_query(sql), c).await.map_err(Error::from)
                    })
                    .await?;
                }
                let meanwhile = locks.try_lock("report", "main", ms(300), None).await.map(drop);
                Ok::<_, Error>((held.fence(), meanwhile))
            }))
        }
        fn with_lock_refusing(&self, ttl: Duration) -> Result<(), JobError> {
            let locks = diesel_occ::asynchronous::AsyncLocks::new(self.pool.clone());
            self.runtime.block_on(locks.with_lock("report", "main", ttl, None, async |_: Held| Err::<(), _>(JobError::Refused)))
        }
        fn with_lock_idle(&self, ttl: Duration) -> (Result<(), Error>, bool) {
            let locks = diesel_occ::asynchronous::AsyncLocks::new(self.pool.clone());
            let mut ran = false;
            let ran_it = &mut ran;
            let held = self.runtime.block_on(locks.with_lock("report", "main", ttl, None, async move |_: Held| {
                *ran_it = true;
                Ok::<_, Error>(())
            }));
            (held, ran)
        }
        fn with_lock_sleeping_through(&self, ttl: Duration, take_over: impl Fn() + Send + Sync) -> (Result<&'static str, Error>, Option<Result<(), Error>>) {
            let locks = diesel_occ::asynchronous::AsyncLocks::new(self.pool.clone());
            let slept = std::sync::Mutex::new(None);
            let (slept_in, pool, take_over) = (&slept, &self.pool, &take_over);
            let outcome = self.runtime.block_on(locks.with_lock("report", "main", ttl, None, async move |held: Held| {
                take_over();
                let answer = held.sleep_async(Duration::from_secs(60)).await;
                *slept_in.lock().unwrap() = Some(answer);
                // Dropped at this `.await` (the lock is gone) or refused.
                let mut conn = pool.get().await.unwrap();
                let sql = record_sql(held.fence());
                let refused = held
                    .write_while_held_async(&mut *conn, async move |c: &mut Async_| {
                        diesel_async::RunQueryDsl::execute(diesel::sql_query(sql), c).await.map_err(Error::from)
                    })
                    .await;
                assert!(refused.is_err());
                Ok::<_, Error>("done")
            }));
            (outcome, slept.into_inner().unwrap())
        }
    }

    /// `with_lock`: the work outlives the TTL while the lease renews itself, others are
    /// refused meanwhile, and the lock is freed after; an error of the work comes back
    /// unchanged after the release; a held lock runs nothing.
    fn with_lock_renews_while_the_work_runs_then_releases<P: LockWrites + WithLock>(db: &Db, p: &P) {
        let conn = &mut db.conn();
        // The work outlasts the lease twice over, so only renewals keep it held; a lease of
        // 1.2 s (renewed every 400 ms) leaves room for a renewal that waits on a machine
        // busy with the tests running beside this one.
        let (fence, meanwhile) = p.with_lock_writing(ms(1200), 5, ms(500)).unwrap();
        assert!(matches!(meanwhile, Err(Error::LockHeld { .. })), "{meanwhile:?}");
        assert_eq!(ledger_row(conn), (5, fence, 0));
        assert_eq!(holder_of(conn, "report"), None, "released");
        let (acquired, renewed): (Option<chrono::NaiveDateTime>, Option<chrono::NaiveDateTime>) = occ_locks::table
            .find(("report", "main"))
            .select((occ_locks::acquired_at, occ_locks::renewed_at))
            .first(conn)
            .unwrap();
        assert!(renewed > acquired, "renewed while the work ran");
        assert_eq!(p.with_lock_refusing(ms(300)), Err(JobError::Refused));
        assert_eq!(holder_of(conn, "report"), None, "released after an error too");

        let other = p.try_lock("report", "main", Duration::from_secs(60), Some("other")).unwrap();
        let (held, ran) = p.with_lock_idle(ms(300));
        assert!(matches!(held, Err(Error::LockHeld { .. })) && !ran);
        p.release(other).unwrap();
    }

    /// The lock is taken over while the work sleeps: the renewal finds it lost, the sleep
    /// ends at once with `LockLost`, and `with_lock` answers `LockLost` though the work
    /// then returned `Ok` (blocking) or was dropped at its next `.await` (async). Nothing
    /// was written, and the intruder keeps its lock.
    fn with_lock_tells_the_work_when_the_lock_is_lost<P: WithLock>(db: &Db, p: &P) {
        let conn = &mut db.conn();
        let slept = Instant::now();
        let pool = db.pool.clone();
        let (outcome, sleep_ended) = p.with_lock_sleeping_through(ms(300), move || {
            diesel::update(occ_locks::table).set(occ_locks::holder.eq("intruder")).execute(&mut pool.get().unwrap()).unwrap();
        });
        assert!(slept.elapsed() < Duration::from_secs(60), "the sleep ended when the lock was lost, not at its end");
        let why = lost_why(sleep_ended.expect("the work slept"));
        assert!(why.contains("another holder holds it now"), "{why}");
        assert!(matches!(outcome, Err(Error::LockLost { .. })), "{outcome:?}");
        assert_eq!(ledger_row(conn), (0, 0, 0));
        assert_eq!(holder_of(conn, "report").as_deref(), Some("intruder"), "nobody released the intruder's lock");
    }

    // Blocking-only: an async leader's job is a future the library drops at the end of the
    // term (`AsyncCandidate`), not a job it tells and awaits, which the next two scenarios
    // check; tests/locks/async_locks.rs checks the async one.

    /// A leader's job writes while it leads; on `stop()` it is told, awaited, and only
    /// then is the lock freed (the job saw the lock still held as it exited).
    #[test]
    fn a_leaders_job_is_stopped_and_awaited_before_the_lock_is_freed() {
        let Some(db) = setup() else { return };
        let pool = db.pool.clone();
        let candidate = Candidate::start_with_job(Locks::new(db.pool.clone()), "scheduler", "main", "leader", timing(), move |held: &Held| {
            let mut conn = pool.get().unwrap();
            while held.sleep(ms(20)).is_ok() {
                let _ = held.write_while_held(&mut conn, |c| record(c, held.fence()));
            }
            // A slow shutdown step: the lock must stay ours until it is over.
            std::thread::sleep(ms(300));
            let holder: Option<String> = occ_locks::table.find(("scheduler", "main")).select(occ_locks::holder).first(&mut conn).unwrap();
            diesel::insert_into(job_exits::table)
                .values((job_exits::term.eq(held.fence()), job_exits::lock_still_held.eq(i64::from(holder.is_some()))))
                .execute(&mut conn)
                .unwrap();
        })
        .unwrap();
        let Ok(LeaderEvent::Elected { fence }) = candidate.events().recv_timeout(Duration::from_secs(10)) else { panic!("not elected") };
        let conn = &mut db.conn();
        while ledger_row(conn).0 < 5 {
            std::thread::sleep(ms(10));
        }
        assert_eq!(candidate.stop(), [LeaderEvent::SteppedDown]);
        let exits: Vec<(i64, i64)> = job_exits::table.select((job_exits::term, job_exits::lock_still_held)).load(conn).unwrap();
        assert_eq!(exits, [(fence, 1)], "the job ended while the lock was still held");
        assert_eq!(holder_of(conn, "scheduler"), None, "freed after the job ended");
        let (writes, last_fence, regressions) = ledger_row(conn);
        assert!(writes >= 5);
        assert_eq!((last_fence, regressions), (fence, 0));
    }

    /// Another holder takes the leader's lock: the leader's job writes nothing after the
    /// takeover, `Lost` names the new holder, the job is told and awaited, and the
    /// candidate then campaigns (the intruder keeps its lock). The job's write finds the
    /// takeover first (it writes every 10 ms, the runner renews every 100) and the job
    /// then takes 300 ms to wind down, so the runner sees its belief end before the job
    /// returns: the reason is still the one the write read.
    #[test]
    fn a_leaders_job_stops_writing_when_the_lead_is_lost() {
        let Some(db) = setup() else { return };
        let pool = db.pool.clone();
        let candidate = Candidate::start_with_job(Locks::new(db.pool.clone()), "scheduler", "main", "leader", timing(), move |held: &Held| {
            let mut conn = pool.get().unwrap();
            while held.sleep(ms(10)).is_ok() {
                let _ = held.write_while_held(&mut conn, |c| record(c, held.fence()));
            }
            std::thread::sleep(ms(300));
            diesel::insert_into(job_exits::table).values((job_exits::term.eq(held.fence()), job_exits::lock_still_held.eq(0))).execute(&mut conn).unwrap();
        })
        .unwrap();
        let Ok(LeaderEvent::Elected { fence }) = candidate.events().recv_timeout(Duration::from_secs(10)) else { panic!("not elected") };
        let conn = &mut db.conn();
        while ledger_row(conn).0 < 3 {
            std::thread::sleep(ms(10));
        }
        // The intruder takes the lock for a long lease: from its commit on, no write of the
        // old term can commit (each locks the lock row before committing).
        diesel::sql_query("UPDATE occ_locks SET holder = 'intruder', label = 'intruder', fence = fence + 1000, \
                           expires_at = '2999-01-01 00:00:00.000'")
            .execute(conn)
            .unwrap();
        let at_takeover = ledger_row(conn).0;
        match candidate.events().recv_timeout(Duration::from_secs(10)) {
            Ok(LeaderEvent::Lost { reason }) => assert!(reason.contains("intruder holds it now"), "{reason}"),
            other => panic!("{other:?}"),
        }
        // The job's exit is recorded before the runner goes on (awaited), so it is here now
        // or very soon; wait for it on the database.
        let waited = Instant::now();
        while job_exits::table.count().get_result::<i64>(conn).unwrap() == 0 {
            assert!(waited.elapsed() < Duration::from_secs(10), "the job never ended");
            std::thread::sleep(ms(10));
        }
        assert!(!candidate.is_leader());
        assert_eq!(candidate.stop(), [], "it did not lead again: the intruder holds the lock");
        let (writes, last_fence, regressions) = ledger_row(conn);
        assert_eq!((writes, last_fence, regressions), (at_takeover, fence, 0), "nothing landed after the takeover");
        assert_eq!(holder_of(conn, "scheduler").as_deref(), Some("intruder"));
    }

    /// A job that returns, or panics, ends its term: `JobEnded`, the lock freed, and the
    /// candidate leads again with a higher fence (running the job again).
    fn a_job_that_returns_or_panics_ends_its_term_and_the_candidate_campaigns_again<P: CampaignWithJob>(db: &Db, p: &P) {
        let terms = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&terms);
        let mut candidate = p
            .start_candidate_with_job("scheduler", "main", "leader", timing(), Arc::new(move || {
                if counted.fetch_add(1, Ordering::SeqCst) == 0 {
                    panic!("boom");
                }
            }))
            .unwrap();
        let events: Vec<LeaderEvent> = (0..4).map_while(|_| p.next_event(&mut candidate, Duration::from_secs(30))).collect();
        let fences: Vec<i64> = events.iter().filter_map(|e| match e { LeaderEvent::Elected { fence } => Some(*fence), _ => None }).collect();
        assert_eq!(events.len(), 4, "{events:?}");
        assert_eq!(events[1], LeaderEvent::JobEnded { panic: Some("boom".into()) });
        assert_eq!(events[3], LeaderEvent::JobEnded { panic: None });
        assert!(fences.len() == 2 && fences[1] > fences[0], "{events:?}");
        drop(p.stop(candidate));
        assert!(terms.load(Ordering::SeqCst) >= 2);
        assert_eq!(holder_of(&mut db.conn(), "scheduler"), None);
    }
}
