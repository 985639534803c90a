//! Keep-alive leases and leader election, in one process and across processes: a leader
//! killed with SIGKILL is replaced once its lease has run out, and not before.

#![cfg(feature = "locks")]

use crate::common;

#[cfg(feature = "tokio")]
use common::drivers::WatchLeadership;
use common::drivers::{Campaign, ReleaseLease};
use common::{KillOnDrop, PoolByUrl};

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel_occ::Error;
use diesel_occ::{occ_locks, Locks};
use diesel_occ::{Candidate, ElectionTiming, LeaderEvent};

/// Fast timings for tests: a dead leader is replaced within about a second.
fn timing() -> ElectionTiming {
    ElectionTiming {
        lease: Duration::from_millis(1000),
        renew_deadline: Duration::from_millis(600),
        retry_period: Duration::from_millis(100),
    }
}

/// The failover test's timings: a lease long enough that a child process slowed by a
/// loaded machine still renews in time, so the parent is elected only once it is killed.
fn failover_timing() -> ElectionTiming {
    ElectionTiming {
        lease: Duration::from_millis(3000),
        renew_deadline: Duration::from_millis(2000),
        retry_period: Duration::from_millis(200),
    }
}

/// The next event within `wait`.
fn next_event(candidate: &Candidate, wait: Duration) -> Option<LeaderEvent> {
    candidate.events().recv_timeout(wait).ok()
}

#[test]
fn election_timings_are_validated() {
    let ms = Duration::from_millis;
    for (lease, renew_deadline, retry_period) in [
        (ms(100), ms(100), ms(10)),
        (ms(1000), ms(600), ms(500)),
        (ms(1000), ms(600), ms(0)),
        // A retry period above a third of the lease.
        (ms(1000), ms(900), ms(400)),
    ] {
        let bad = ElectionTiming {
            lease,
            renew_deadline,
            retry_period,
        };
        assert!(
            matches!(bad.validate(), Err(Error::InvalidSetting { .. })),
            "{bad:?}"
        );
    }
    assert!(ElectionTiming::default().validate().is_ok());
    assert!(timing().validate().is_ok());
}

for_each_backend! {
    type Db = common::TestDb<Conn>;

    /// A lease kept alive outlives its TTL many times; when someone else takes the row
    /// over, the holder learns it within about a third of the TTL.
    fn a_kept_alive_lease_outlives_its_ttl_and_learns_when_it_is_taken<W: ReleaseLease>(db: &Db, w: &W) {
        let lease = w.keep_alive(w.try_lock("worker", "w1", Duration::from_millis(300), Some("me")).unwrap());

        std::thread::sleep(Duration::from_millis(1000));
        W::lease_check(&lease).unwrap();
        assert!(matches!(w.try_lock("worker", "w1", Duration::from_secs(5), None), Err(Error::LockHeld { .. })));

        diesel::update(occ_locks::table).set(occ_locks::holder.eq("intruder")).execute(&mut db.conn()).unwrap();
        let taken = Instant::now();
        while W::lease_check(&lease).is_ok() {
            assert!(taken.elapsed() < Duration::from_millis(1000), "the lost lease went unnoticed");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(matches!(W::lease_check(&lease), Err(Error::LockLost { .. })));
        assert!(matches!(w.release_lease(lease), Err(Error::LockLost { .. })));
    }

    /// The keep-alive thread carries the runtime of the code that started it, where the
    /// pool hands out its connections.
    #[cfg(feature = "deadpool")]
    #[test]
    fn a_kept_alive_lease_on_a_deadpool_pool_outlives_its_ttl() {
        common::deadpool::in_runtime(|| {
            let Some(db) = db() else { return };
            a_kept_alive_lease_outlives_its_ttl_and_learns_when_it_is_taken(&db, &common::drivers::BlockingPool(db.deadpool()));
        });
    }

    /// Two candidates: one leads; when it steps down the other is elected, with a higher
    /// fence.
    fn one_candidate_leads_and_the_other_takes_over_when_it_steps_down<W: Campaign>(_: &Db, w: &W) {
        let mut first = w.start_candidate("scheduler", "main", "first", timing()).unwrap();
        let Some(LeaderEvent::Elected { fence }) = w.next_event(&mut first, Duration::from_secs(5)) else { panic!("the first was not elected") };
        let mut second = w.start_candidate("scheduler", "main", "second", timing()).unwrap();
        assert_eq!(w.next_event(&mut second, Duration::from_millis(500)), None, "two leaders");
        assert!(W::is_leader(&first) && !W::is_leader(&second));

        assert_eq!(w.stop(first), [LeaderEvent::SteppedDown], "the leader says it stepped down");
        match w.next_event(&mut second, Duration::from_secs(5)) {
            Some(LeaderEvent::Elected { fence: next }) => assert!(next > fence),
            other => panic!("{other:?}"),
        }
        assert!(W::is_leader(&second));
        let waiting = w.start_candidate("scheduler", "main", "third", timing()).unwrap();
        assert_eq!(w.stop(waiting), [], "a candidate that never led has nothing to step down from");
        assert_eq!(w.stop(second), [LeaderEvent::SteppedDown]);
    }

    #[cfg(feature = "deadpool")]
    #[test]
    fn on_a_deadpool_pool_one_candidate_leads_at_a_time() {
        common::deadpool::in_runtime(|| {
            let Some(db) = db() else { return };
            one_candidate_leads_and_the_other_takes_over_when_it_steps_down(&db, &common::drivers::BlockingPool(db.deadpool()));
        });
    }

    tests_on_both_drivers!(
        |_: &Db| ();
        ;
        pooled:
        a_kept_alive_lease_outlives_its_ttl_and_learns_when_it_is_taken,
        one_candidate_leads_and_the_other_takes_over_when_it_steps_down,
        #[cfg(feature = "tokio")]
        async_code_follows_leadership_on_a_watch,
    );

    /// Async code follows leadership without blocking: on a current-thread runtime (one
    /// thread for everything), the first candidate's watch turns to `Leading`, the
    /// second's stays `Following` while the first leads, and when the first steps down
    /// its watch turns back and the second's turns to `Leading` with a higher fence (the
    /// lock row names the holder each watch shows); a lead lost to a taken row turns it
    /// back too.
    #[cfg(feature = "tokio")]
    fn async_code_follows_leadership_on_a_watch<W: WatchLeadership>(db: &Db, w: &W) {
        use diesel_occ::Leadership;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let holder = |db: &Db| -> Option<String> {
            occ_locks::table.select(occ_locks::label).first::<Option<String>>(&mut db.conn()).ok().flatten()
        };
        let leading = |l: &Leadership| matches!(l, Leadership::Leading { .. });
        let bound = Duration::from_secs(10);

        let first = w.start_candidate("scheduler", "main", "first", timing()).unwrap();
        let mut first_watch = W::leadership(&first);
        let Leadership::Leading { fence } = runtime
            .block_on(async { tokio::time::timeout(bound, first_watch.wait_for(leading)).await.map(|l| *l.unwrap()) })
            .expect("the first was elected")
        else {
            unreachable!()
        };
        assert_eq!(holder(db).as_deref(), Some("first"));

        let second = w.start_candidate("scheduler", "main", "second", timing()).unwrap();
        let mut second_watch = W::leadership(&second);
        let stayed = runtime.block_on(async { tokio::time::timeout(Duration::from_millis(500), second_watch.wait_for(leading)).await.is_err() });
        assert!(stayed, "two leaders");
        assert_eq!(*second_watch.borrow(), Leadership::Following);

        assert_eq!(w.stop(first), [LeaderEvent::Elected { fence }, LeaderEvent::SteppedDown]);
        assert_eq!(*first_watch.borrow(), Leadership::Following, "a stopped leader follows");
        let next = runtime
            .block_on(async { tokio::time::timeout(bound, second_watch.wait_for(leading)).await.map(|l| *l.unwrap()) })
            .expect("the second was elected");
        assert!(matches!(next, Leadership::Leading { fence: next } if next > fence), "{next:?}");
        assert_eq!(holder(db).as_deref(), Some("second"));

        // The row taken from under the leader: its watch turns back when the loss is
        // found, with the `Lost` event.
        diesel::update(occ_locks::table).set(occ_locks::holder.eq("intruder")).execute(&mut db.conn()).unwrap();
        runtime
            .block_on(async { tokio::time::timeout(bound, second_watch.wait_for(|l| !leading(l))).await.map(|_| ()) })
            .expect("the lost lead was noticed");
        assert!(!W::is_leader(&second));
        let events = w.stop(second);
        assert!(events.iter().any(|e| matches!(e, LeaderEvent::Lost { .. })), "{events:?}");
    }

    /// Records, when the async job's future is dropped, who the lock row names then.
    #[cfg(feature = "tokio")]
    struct OnCancel {
        pool: diesel::r2d2::Pool<diesel_occ::CheckedManager<Conn>>,
        holders: std::sync::Arc<std::sync::Mutex<Vec<Option<String>>>>,
    }

    #[cfg(feature = "tokio")]
    impl Drop for OnCancel {
        fn drop(&mut self) {
            let label = occ_locks::table
                .filter(occ_locks::holder.is_not_null())
                .select(occ_locks::label)
                .first::<Option<String>>(&mut self.pool.get().unwrap())
                .ok()
                .flatten();
            self.holders.lock().unwrap().push(label);
        }
    }

    /// An async leader job runs while its candidate leads; on stop it is cancelled (its
    /// future dropped) while the lock row still names this leader, and the lock is freed
    /// only after; on a lead lost to a taken row it is cancelled too.
    #[cfg(feature = "tokio")]
    #[test]
    fn an_async_job_is_cancelled_before_its_lock_is_freed() {
        use std::sync::atomic::{AtomicU32, Ordering};
        use std::sync::{Arc, Mutex};
        let Some(db) = db() else { return };
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let _in_runtime = runtime.enter();
        let (steps, holders) = (Arc::new(AtomicU32::new(0)), Arc::new(Mutex::new(Vec::new())));
        let start = |label: &str| {
            let (steps, holders, pool) = (Arc::clone(&steps), Arc::clone(&holders), db.pool.clone());
            Candidate::start_with_async_job(Locks::new(db.pool.clone()), "async-job", "main", label, timing(), move |held| {
                let (steps, on_cancel) = (Arc::clone(&steps), OnCancel { pool: pool.clone(), holders: Arc::clone(&holders) });
                async move {
                    let _on_cancel = on_cancel;
                    while held.is_held() {
                        steps.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    std::future::pending::<()>().await;
                }
            })
            .unwrap()
        };
        let wait_for_steps = |more: u32| {
            let (from, asked) = (steps.load(Ordering::SeqCst), Instant::now());
            while steps.load(Ordering::SeqCst) < from + more {
                assert!(asked.elapsed() < Duration::from_secs(10), "the job does not run");
                std::thread::sleep(Duration::from_millis(5));
            }
        };

        let me = start("me");
        assert!(matches!(next_event(&me, Duration::from_secs(5)), Some(LeaderEvent::Elected { .. })));
        wait_for_steps(3);
        assert_eq!(me.stop(), [LeaderEvent::SteppedDown]);
        assert_eq!(*holders.lock().unwrap(), [Some("me".to_string())], "cancelled while the lock was still this leader's");
        let held: i64 = occ_locks::table.filter(occ_locks::holder.is_not_null()).count().get_result(&mut db.conn()).unwrap();
        assert_eq!(held, 0, "freed after the job was gone");

        let again = start("again");
        assert!(matches!(next_event(&again, Duration::from_secs(5)), Some(LeaderEvent::Elected { .. })));
        wait_for_steps(3);
        diesel::update(occ_locks::table).set(occ_locks::holder.eq("intruder")).execute(&mut db.conn()).unwrap();
        match next_event(&again, Duration::from_secs(5)) {
            Some(LeaderEvent::Lost { .. }) => {}
            other => panic!("{other:?}"),
        }
        let asked = Instant::now();
        while holders.lock().unwrap().len() < 2 {
            assert!(asked.elapsed() < Duration::from_secs(10), "the job outlived the lost lead");
            std::thread::sleep(Duration::from_millis(5));
        }
        again.stop();
    }

    /// Outside a tokio runtime there is nothing to drive an async job: refused at start.
    #[cfg(feature = "tokio")]
    #[test]
    fn an_async_job_needs_a_runtime() {
        let Some(db) = db() else { return };
        let refused = Candidate::start_with_async_job(Locks::new(db.pool.clone()), "j", "main", "x", timing(), |_| async {});
        assert!(matches!(refused, Err(Error::InvalidSetting { what: "async job", .. })));
    }

    /// The child side of the failover test, on either driver: leads until killed.
    fn lead_until_killed<W: Campaign>(w: &W) {
        match w.try_lock("failover-probe", "main", Duration::from_secs(1), None) {
            Ok(probe) => w.drop_guard(probe),
            Err(e) => println!("PROBE FAILED {e}"),
        }
        let mut candidate = w.start_candidate("failover", "main", "child", failover_timing()).unwrap();
        if let Some(LeaderEvent::Elected { fence }) = w.next_event(&mut candidate, Duration::from_secs(30)) {
            println!("ELECTED {fence}");
        }
        loop {
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// The child on the blocking API: a `Candidate` (a thread) on an r2d2 pool.
    #[test]
    fn leader_child() {
        let Ok(url) = std::env::var(format!("OCC_LEADER_CHILD_{BACKEND}")) else { return };
        lead_until_killed(&common::drivers::BlockingPool(<Conn as PoolByUrl>::pool(&url)));
    }

    /// The child on the async API: an `AsyncCandidate` (a tokio task) on a bb8 pool.
    #[cfg(all(feature = "bb8", any(not(feature = "mysql"), feature = "async-mysql")))]
    #[test]
    fn async_leader_child() {
        let Ok(url) = std::env::var(format!("OCC_LEADER_CHILD_{BACKEND}")) else { return };
        lead_until_killed(&common::drivers::bb8_pool_on::<<Conn as common::paths::AsyncOf>::Async>(&url, BACKEND, 4));
    }

    /// A child process leads and is killed with SIGKILL: this process is elected, with a
    /// higher fence, not before the dead leader's lease ran out (checked on the database's
    /// clock); how long it took is printed.
    #[test]
    fn a_killed_leader_is_replaced_once_its_lease_ran_out() {
        killed_leader_is_replaced("leader_child");
    }

    /// The same, the killed leader an `AsyncCandidate`.
    #[cfg(all(feature = "bb8", any(not(feature = "mysql"), feature = "async-mysql")))]
    #[test]
    fn a_killed_async_leader_is_replaced_once_its_lease_ran_out() {
        killed_leader_is_replaced("async_leader_child");
    }

    /// The failover lock's label, its time (expiry while the child holds it, acquisition
    /// once the parent does) and its count of holder changes.
    fn failover_row(db: &common::TestDb<Conn>) -> (Option<String>, Option<chrono::NaiveDateTime>, i64) {
        let (label, expires, acquired, changes): (Option<String>, Option<chrono::NaiveDateTime>, Option<chrono::NaiveDateTime>, i64) = occ_locks::table
            .filter(occ_locks::lock_name.eq("failover"))
            .select((occ_locks::label, occ_locks::expires_at, occ_locks::acquired_at, occ_locks::holder_changes))
            .first(&mut db.conn())
            .unwrap();
        let time = if label.as_deref() == Some("child") { expires } else { acquired };
        (label, time, changes)
    }

    fn killed_leader_is_replaced(child: &str) {
        let Some(db) = db() else { return };
        let mut child = KillOnDrop(Command::new(std::env::current_exe().unwrap())
            .args([&common::test_name(module_path!(), child), "--exact", "--nocapture", "--test-threads=1"])
            .env(format!("OCC_LEADER_CHILD_{BACKEND}"), &db.url)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap());
        let child = &mut child.0;
        let (lines_in, lines) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = lines_in.send(line);
            }
        });
        let mut seen = Vec::new();
        let child_fence: i64 = loop {
            match lines.recv_timeout(Duration::from_secs(30)) {
                // The harness's "test ... " has no line break before the child's output.
                Ok(line) => match line.split("ELECTED ").nth(1) {
                    Some(fence) => break fence.trim().parse().unwrap(),
                    None => seen.push(line),
                },
                Err(_) => {
                    let _ = child.kill();
                    panic!("the child did not lead; it said: {seen:#?}");
                }
            }
        };
        let locks = Locks::new(db.pool.clone());
        let me = Candidate::start(locks, "failover", "main", "parent", failover_timing()).unwrap();
        assert_eq!(next_event(&me, Duration::from_millis(1500)), None, "elected while the child leads");

        child.kill().unwrap(); // SIGKILL: no step-down, no release
        let killed = Instant::now();
        child.wait().unwrap();
        // The dead leader's row, read from the database: its lease runs until `expires_at`.
        let (label, dead_until, changes) = failover_row(&db);
        let elected = next_event(&me, Duration::from_secs(30));
        let failover = killed.elapsed();

        match elected {
            Some(LeaderEvent::Elected { fence }) => assert!(fence > child_fence),
            other => panic!("not elected after the leader died: {other:?}"),
        }
        let (now_label, acquired, now_changes) = failover_row(&db);
        assert_eq!(now_label.as_deref(), Some("parent"));
        assert_eq!(now_changes, changes + 1, "one change of holder, from the dead leader to this one");
        if label.as_deref() == Some("child") {
            // Not taken over while the dead leader's lease ran (database clock both sides).
            assert!(acquired >= dead_until, "taken at {acquired:?}, the lease ran to {dead_until:?}");
        }
        // How fast is measured, not asserted: it depends on how loaded the machine is.
        let timing = failover_timing();
        println!("{BACKEND}: leader killed, new leader elected after {failover:?} (lease {:?}, retry {:?})", timing.lease, timing.retry_period);
        me.stop();
    }
}
