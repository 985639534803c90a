//! Claims for slow but alive workers and for rows that keep failing, on both executors
//! (the blocking API and diesel-async), on every backend: heartbeats keep a claim from
//! being taken over as abandoned, and an attempt counter parks a row that used up its
//! attempts. End states are read from the database.

#![cfg(all(
    feature = "locks",
    feature = "async",
    any(not(feature = "mysql"), feature = "async-mysql")
))]

use crate::common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::Duration;

use chrono::NaiveDateTime;
use common::claim_paths::{add_jobs, jobs, request, ClaimWorker, Job, JobState};
use diesel::prelude::*;
use diesel_occ::{AttemptLimit, Claimed, Error};

const MINUTE: Duration = Duration::from_secs(60);

const THREE_TRIES: AttemptLimit<JobState> = AttemptLimit {
    max: 3,
    park_in: JobState::Parked,
};

for_each_backend! {
    type Db = common::TestDb<Conn>;

    /// The worker died, as far as the clock can tell: its claim time moved far back.
    fn age_claims(db: &Db) {
        diesel::sql_query("UPDATE jobs SET claimed_at = '2000-01-01 00:00:00.000' WHERE state = 'running'")
            .execute(&mut db.conn())
            .unwrap();
    }

    fn all(db: &Db) -> Vec<Job> {
        jobs::table.order(jobs::id).select(Job::as_select()).load(&mut db.conn()).unwrap()
    }

    /// A heartbeat moves the claim time to the database's now and advances the version, so
    /// a claim that looked abandoned is not taken over; without one it is, and then the
    /// old owner's heartbeat and finish are refused.
    fn a_heartbeat_keeps_a_slow_workers_claim<W: ClaimWorker>(db: &Db, worker: impl Fn() -> W) {
        add_jobs(&mut *db.conn(), 1..=1);
        let w = &mut worker();
        let claimed = w.claim(&request("slow", 1, MINUTE)).unwrap();
        assert_eq!(claimed.len(), 1);

        age_claims(db);
        let kept = w.extend_claim(1, "slow", JobState::Running).unwrap();
        assert_eq!(kept.version, claimed[0].version + 1);
        // The claim and the heartbeat may fall in one tick of the clock (SQLite stores
        // milliseconds): the heartbeat's time is not before the claim's and far after the
        // aged one.
        let aged = NaiveDateTime::parse_from_str("2000-01-01 00:00:00", "%Y-%m-%d %H:%M:%S").unwrap();
        assert!(kept.claimed_at >= claimed[0].claimed_at, "claim time moved to the database's now");
        assert!(kept.claimed_at > Some(aged + chrono::Duration::days(365 * 20)), "{:?}", kept.claimed_at);
        assert_eq!(all(db), std::slice::from_ref(&kept), "{}", W::PATH);
        assert!(w.claim(&request("rescuer", 1, MINUTE)).unwrap().is_empty(), "not taken over");

        age_claims(db);
        let taken = w.claim(&request("rescuer", 1, MINUTE)).unwrap();
        assert_eq!(taken[0].owner.as_deref(), Some("rescuer"));
        let lost = w.extend_claim(1, "slow", JobState::Running);
        assert!(matches!(lost, Err(Error::LockLost { .. })), "{lost:?}");
        let finish = w.finish_claim(1, "slow", JobState::Running, JobState::Done, None);
        assert!(matches!(finish, Err(Error::LockLost { .. })), "{finish:?}");
        assert_eq!(all(db), taken, "{}: the refused heartbeat and finish wrote nothing", W::PATH);
        let gone = w.extend_claim(99, "slow", JobState::Running);
        assert!(matches!(gone, Err(Error::NotFound { .. })), "{gone:?}");
        let long = "s".repeat(10_000);
        let bad = w.extend_claim(1, &long, JobState::Running);
        assert!(matches!(bad, Err(Error::InvalidName { what: "owner", .. })), "{bad:?}");
    }

    /// 40 aged claims of one worker; it beats for all of them while three rescuers take
    /// abandoned claims at once. Each row ends with exactly one owner: the worker where
    /// its heartbeat succeeded, a rescuer where the heartbeat was refused.
    fn heartbeats_racing_rescuers_leave_each_row_one_owner<W: ClaimWorker>(db: &Db, worker: impl Fn() -> W + Sync) {
        const ROWS: i64 = 40;
        add_jobs(&mut *db.conn(), 1..=ROWS);
        worker().claim(&request("slow", ROWS as usize, MINUTE)).unwrap();
        age_claims(db);
        let (start, worker) = (Barrier::new(4), &worker);
        let (kept, rescued) = std::thread::scope(|s| {
            let beats = s.spawn(|| {
                let mut w = worker();
                start.wait();
                let mut kept = Vec::new();
                for id in 1..=ROWS {
                    match w.extend_claim(id, "slow", JobState::Running) {
                        Ok(row) => kept.push(row.id),
                        Err(Error::LockLost { .. }) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                kept
            });
            let rescuers: Vec<_> = (0..3)
                .map(|r| {
                    let start = &start;
                    s.spawn(move || {
                        let mut w = worker();
                        let me = format!("rescuer {r}");
                        start.wait();
                        let mut taken = Vec::new();
                        for _ in 0..40 {
                            match w.claim(&request(&me, 2, MINUTE)) {
                                Ok(rows) => taken.extend(rows.into_iter().map(|row| (row.id, me.clone()))),
                                Err(e) if e.is_retryable() => {}
                                Err(e) => panic!("{e}"),
                            }
                        }
                        taken
                    })
                })
                .collect();
            let rescued: Vec<(i64, String)> = rescuers.into_iter().flat_map(|r| r.join().unwrap()).collect();
            (beats.join().unwrap(), rescued)
        });
        println!("{BACKEND} {}: {} claims kept by heartbeats, {} rescued", W::PATH, kept.len(), rescued.len());
        let rows = all(db);
        assert_eq!(kept.len() + rescued.len(), ROWS as usize, "{}: each row kept or rescued, once", W::PATH);
        let rescued: BTreeMap<i64, String> = rescued.into_iter().collect();
        for row in rows {
            let expected = if kept.contains(&row.id) { "slow".to_string() } else { rescued[&row.id].clone() };
            assert_eq!(row.owner, Some(expected), "row {}", row.id);
        }
    }

    /// A row whose worker dies every time: claimed three times (attempts 1, 2, 3), then
    /// parked with its owner cleared; good rows beside it are claimed in the same call.
    fn a_row_that_keeps_failing_is_parked_after_its_attempts<W: ClaimWorker>(db: &Db, worker: impl Fn() -> W) {
        add_jobs(&mut *db.conn(), 1..=1);
        let w = &mut worker();
        let first = w.claim_counted(&request("w1", 1, MINUTE), &THREE_TRIES).unwrap();
        assert_eq!((first.rows.len(), first.rows[0].id, first.rows[0].attempts), (1, 1, 1));
        for attempt in 2..=3 {
            age_claims(db);
            let again = w.claim_counted(&request("w2", 1, MINUTE), &THREE_TRIES).unwrap();
            assert_eq!((again.rows[0].id, again.rows[0].attempts), (1, attempt));
            assert!(again.parked.is_empty());
        }
        age_claims(db);
        add_jobs(&mut *db.conn(), 2..=3);
        let Claimed { rows, parked } = w.claim_counted(&request("w3", 3, MINUTE), &THREE_TRIES).unwrap();
        assert_eq!(parked.len(), 1, "{}", W::PATH);
        assert_eq!((parked[0].id, parked[0].state, parked[0].owner.as_deref(), parked[0].attempts), (1, JobState::Parked, None, 3));
        let mut claimed: Vec<(i64, i32)> = rows.iter().map(|r| (r.id, r.attempts)).collect();
        claimed.sort();
        assert_eq!(claimed, [(2, 1), (3, 1)]);
        let stored = all(db);
        assert_eq!(stored[0], parked[0]);
        assert!(stored[1..].iter().all(|r| r.state == JobState::Running && r.owner.as_deref() == Some("w3")));

        age_claims(db);
        let later = w.claim_counted(&request("w4", 10, MINUTE), &THREE_TRIES).unwrap();
        assert!(later.parked.is_empty() && later.rows.iter().all(|r| r.id != 1), "a parked row is never claimed again");
    }

    /// Limits that cannot work, and a bad owner, are refused before anything is written.
    fn impossible_attempt_limits_are_refused<W: ClaimWorker>(db: &Db, worker: impl Fn() -> W) {
        add_jobs(&mut *db.conn(), 1..=2);
        let w = &mut worker();
        for limit in [
            AttemptLimit { max: 0, park_in: JobState::Parked },
            AttemptLimit { max: 3, park_in: JobState::Open },
            AttemptLimit { max: 3, park_in: JobState::Running },
        ] {
            let refused = w.claim_counted(&request("w", 2, MINUTE), &limit);
            assert!(matches!(refused, Err(Error::InvalidSetting { what: "attempt limit", .. })), "{refused:?}");
        }
        let long = "w".repeat(10_000);
        let refused = w.claim_counted(&request(&long, 2, MINUTE), &THREE_TRIES);
        assert!(matches!(refused, Err(Error::InvalidName { what: "owner", .. })), "{refused:?}");
        assert!(all(db).iter().all(|r| r.state == JobState::Open && r.attempts == 0), "{}", W::PATH);
    }

    /// Four workers on 60 rows, claims abandoned after 50 ms (so rows may be taken from
    /// workers still busy with them), every fifth row killing its worker: in the end every
    /// bad row is parked with exactly the maximum attempts, and every good row is done
    /// (finished exactly once) or parked at the maximum.
    fn workers_racing_on_failing_rows_end_with_every_row_done_or_parked<W: ClaimWorker>(db: &Db, worker: impl Fn() -> W + Sync) {
        const ROWS: i64 = 60;
        add_jobs(&mut *db.conn(), 1..=ROWS);
        let finished = AtomicUsize::new(0);
        let over = AtomicBool::new(false);
        let (start, worker, pool) = (Barrier::new(4), &worker, &db.pool);
        std::thread::scope(|s| {
            for n in 0..4 {
                let (finished, over, start) = (&finished, &over, &start);
                s.spawn(move || {
                    let mut w = worker();
                    let me = format!("worker {n}");
                    start.wait();
                    while !over.load(Ordering::SeqCst) {
                        let claimed = match w.claim_counted(&request(&me, 3, Duration::from_millis(50)), &THREE_TRIES) {
                            Ok(claimed) => claimed,
                            Err(e) if e.is_retryable() => continue,
                            Err(e) => panic!("{e}"),
                        };
                        for row in claimed.rows {
                            if row.id % 5 == 0 {
                                continue; // this row kills its worker: never finished
                            }
                            match w.finish_claim(row.id, &me, JobState::Running, JobState::Done, None) {
                                Ok(()) => {
                                    finished.fetch_add(1, Ordering::SeqCst);
                                }
                                // Taken over as abandoned while this worker was busy.
                                Err(Error::LockLost { .. }) => {}
                                Err(e) if e.is_retryable() => {}
                                Err(e) => panic!("{e}"),
                            }
                        }
                        let open: i64 = jobs::table
                            .filter(jobs::state.ne("done").and(jobs::state.ne("parked")))
                            .count()
                            .get_result(&mut pool.get().unwrap())
                            .unwrap();
                        if open == 0 {
                            over.store(true, Ordering::SeqCst);
                        }
                    }
                });
            }
        });
        let rows = all(db);
        let bad: Vec<&Job> = rows.iter().filter(|r| r.id % 5 == 0).collect();
        assert!(bad.iter().all(|r| r.state == JobState::Parked && r.attempts == 3 && r.owner.is_none()), "{bad:?}");
        // A good row taken over three times before anyone finished it is parked too.
        let good: Vec<&Job> = rows.iter().filter(|r| r.id % 5 != 0).collect();
        let done = good.iter().filter(|r| r.state == JobState::Done).count();
        assert!(good.iter().all(|r| (r.state == JobState::Done && (1..=3).contains(&r.attempts)) || (r.state == JobState::Parked && r.attempts == 3)), "{good:?}");
        assert_eq!(finished.load(Ordering::SeqCst), done, "{}: each done row finished exactly once", W::PATH);
        println!("{BACKEND} {}: {done} of {} good rows done, the rest parked", W::PATH, good.len());
    }

    claim_tests_on_both_paths!(
        a_heartbeat_keeps_a_slow_workers_claim,
        heartbeats_racing_rescuers_leave_each_row_one_owner,
        a_row_that_keeps_failing_is_parked_after_its_attempts,
        impossible_attempt_limits_are_refused,
        workers_racing_on_failing_rows_end_with_every_row_done_or_parked,
    );
}
