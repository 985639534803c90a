//! Claims for slow but alive workers and for rows that keep failing: heartbeats keep a
//! claim from being taken over as abandoned, and an attempt counter parks a row that used
//! up its attempts. End states are read from the database.

#![cfg(feature = "locks")]

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::Duration;

use chrono::NaiveDateTime;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_occ::{AttemptLimit, ClaimRequest, Claimed, GuardedClaim};
use diesel_occ::{Error, Guarded, Status};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Status)]
pub enum JobState {
    #[occ(from(Running))]
    Open,
    #[occ(from(Open, Running))]
    Running,
    #[occ(from(Running))]
    Done,
    #[occ(from(Open, Running))]
    Parked,
}

diesel::table! {
    jobs (id) {
        id -> BigInt,
        state -> Text,
        owner -> Nullable<Text>,
        claimed_at -> Nullable<Timestamp>,
        attempts -> Integer,
        version -> BigInt,
    }
}

#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, Guarded)]
#[diesel(table_name = jobs)]
pub struct Job {
    id: i64,
    #[occ(status)]
    state: JobState,
    owner: Option<String>,
    claimed_at: Option<NaiveDateTime>,
    attempts: i32,
    #[occ(version)]
    version: i64,
}

fn request(owner: &str, limit: usize, reclaim_after: Duration) -> ClaimRequest<'_, JobState> {
    ClaimRequest {
        from: JobState::Open,
        to: JobState::Running,
        owner,
        limit,
        reclaim_after: Some(reclaim_after),
    }
}

const MINUTE: Duration = Duration::from_secs(60);

const THREE_TRIES: AttemptLimit<JobState> = AttemptLimit {
    max: 3,
    park_in: JobState::Parked,
};

for_each_backend! {
    type Pooled = diesel_occ::Pooled<Conn>;

    fn setup(count: i64) -> Option<common::TestDb<Conn>> {
        let db = db()?;
        let conn = &mut db.conn();
        let stamp = if BACKEND == "mysql" { "DATETIME(6)" } else { "TIMESTAMP" };
        conn.batch_execute(&format!(
            "CREATE TABLE jobs (id BIGINT PRIMARY KEY, state VARCHAR(16) NOT NULL, owner VARCHAR(64), \
             claimed_at {stamp}, attempts INTEGER NOT NULL, version BIGINT NOT NULL)"
        ))
        .unwrap();
        let rows: Vec<Job> = (1..=count)
            .map(|id| Job { id, state: JobState::Open, owner: None, claimed_at: None, attempts: 0, version: 0 })
            .collect();
        diesel::insert_into(jobs::table).values(&rows).execute(conn).unwrap();
        Some(db)
    }

    /// The worker died, as far as the clock can tell: its claim time moved far back.
    fn age_claims(conn: &mut Pooled) {
        diesel::sql_query("UPDATE jobs SET claimed_at = '2000-01-01 00:00:00.000' WHERE state = 'running'")
            .execute(conn)
            .unwrap();
    }

    fn all(conn: &mut Pooled) -> Vec<Job> {
        jobs::table.order(jobs::id).select(Job::as_select()).load(conn).unwrap()
    }

    /// A heartbeat moves the claim time to the database's now and advances the version, so
    /// a claim that looked abandoned is not taken over; without one it is, and then the
    /// old owner's heartbeat and finish are refused.
    #[test]
    fn a_heartbeat_keeps_a_slow_workers_claim() {
        let Some(db) = setup(1) else { return };
        let conn = &mut db.conn();
        let claimed = Job::claim(conn, jobs::owner, jobs::claimed_at, &request("slow", 1, MINUTE)).unwrap();
        assert_eq!(claimed.len(), 1);

        age_claims(conn);
        let kept = Job::extend_claim(conn, &1, jobs::owner, jobs::claimed_at, "slow", JobState::Running).unwrap();
        assert_eq!(kept.version, claimed[0].version + 1);
        // The claim and the heartbeat may fall in one tick of the clock (SQLite stores
        // milliseconds): the heartbeat's time is not before the claim's and far after the
        // aged one.
        let aged = NaiveDateTime::parse_from_str("2000-01-01 00:00:00", "%Y-%m-%d %H:%M:%S").unwrap();
        assert!(kept.claimed_at >= claimed[0].claimed_at, "claim time moved to the database's now");
        assert!(kept.claimed_at > Some(aged + chrono::Duration::days(365 * 20)), "{:?}", kept.claimed_at);
        assert_eq!(all(conn), std::slice::from_ref(&kept));
        assert!(Job::claim(conn, jobs::owner, jobs::claimed_at, &request("rescuer", 1, MINUTE)).unwrap().is_empty(), "not taken over");

        age_claims(conn);
        let taken = Job::claim(conn, jobs::owner, jobs::claimed_at, &request("rescuer", 1, MINUTE)).unwrap();
        assert_eq!(taken[0].owner.as_deref(), Some("rescuer"));
        let lost = Job::extend_claim(conn, &1, jobs::owner, jobs::claimed_at, "slow", JobState::Running);
        assert!(matches!(lost, Err(Error::LockLost { .. })), "{lost:?}");
        let finish = Job::finish_claim(conn, &1, jobs::owner, "slow", JobState::Running, JobState::Done, None);
        assert!(matches!(finish, Err(Error::LockLost { .. })), "{finish:?}");
        assert_eq!(all(conn), taken, "the refused heartbeat and finish wrote nothing");
        assert!(matches!(Job::extend_claim(conn, &99, jobs::owner, jobs::claimed_at, "slow", JobState::Running), Err(Error::NotFound { .. })));
    }

    /// 40 aged claims of one worker; it beats for all of them while three rescuers take
    /// abandoned claims at once. Each row ends with exactly one owner: the worker where
    /// its heartbeat succeeded, a rescuer where the heartbeat was refused.
    #[test]
    fn heartbeats_racing_rescuers_leave_each_row_one_owner() {
        const ROWS: i64 = 40;
        let Some(db) = setup(ROWS) else { return };
        Job::claim(&mut db.conn(), jobs::owner, jobs::claimed_at, &request("slow", ROWS as usize, MINUTE)).unwrap();
        age_claims(&mut db.conn());
        let (start, pool) = (Barrier::new(4), &db.pool);
        let (kept, rescued) = std::thread::scope(|s| {
            let beats = s.spawn(|| {
                let mut conn = pool.get().unwrap();
                start.wait();
                let mut kept = Vec::new();
                for id in 1..=ROWS {
                    match Job::extend_claim(&mut conn, &id, jobs::owner, jobs::claimed_at, "slow", JobState::Running) {
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
                        let mut conn = pool.get().unwrap();
                        let me = format!("rescuer {r}");
                        start.wait();
                        let mut taken = Vec::new();
                        for _ in 0..40 {
                            match Job::claim(&mut conn, jobs::owner, jobs::claimed_at, &request(&me, 2, MINUTE)) {
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
        println!("{BACKEND}: {} claims kept by heartbeats, {} rescued", kept.len(), rescued.len());
        let rows = all(&mut db.conn());
        assert_eq!(kept.len() + rescued.len(), ROWS as usize, "each row kept or rescued, once");
        let rescued: BTreeMap<i64, String> = rescued.into_iter().collect();
        for row in rows {
            let expected = if kept.contains(&row.id) { "slow".to_string() } else { rescued[&row.id].clone() };
            assert_eq!(row.owner, Some(expected), "row {}", row.id);
        }
    }

    /// A row whose worker dies every time: claimed three times (attempts 1, 2, 3), then
    /// parked with its owner cleared; good rows beside it are claimed in the same call.
    #[test]
    fn a_row_that_keeps_failing_is_parked_after_its_attempts() {
        let Some(db) = setup(1) else { return };
        let conn = &mut db.conn();
        let first = Job::claim_counted(conn, jobs::owner, jobs::claimed_at, jobs::attempts, &request("w1", 1, MINUTE), &THREE_TRIES).unwrap();
        assert_eq!((first.rows.len(), first.rows[0].id, first.rows[0].attempts), (1, 1, 1));
        for attempt in 2..=3 {
            age_claims(conn);
            let again = Job::claim_counted(conn, jobs::owner, jobs::claimed_at, jobs::attempts, &request("w2", 1, MINUTE), &THREE_TRIES).unwrap();
            assert_eq!((again.rows[0].id, again.rows[0].attempts), (1, attempt));
            assert!(again.parked.is_empty());
        }
        age_claims(conn);
        let fresh: Vec<Job> = (2..=3)
            .map(|id| Job { id, state: JobState::Open, owner: None, claimed_at: None, attempts: 0, version: 0 })
            .collect();
        diesel::insert_into(jobs::table).values(&fresh).execute(conn).unwrap();
        let Claimed { rows, parked } = Job::claim_counted(conn, jobs::owner, jobs::claimed_at, jobs::attempts, &request("w3", 3, MINUTE), &THREE_TRIES).unwrap();
        assert_eq!(parked.len(), 1);
        assert_eq!((parked[0].id, parked[0].state, parked[0].owner.as_deref(), parked[0].attempts), (1, JobState::Parked, None, 3));
        let mut claimed: Vec<(i64, i32)> = rows.iter().map(|r| (r.id, r.attempts)).collect();
        claimed.sort();
        assert_eq!(claimed, [(2, 1), (3, 1)]);
        let stored = all(conn);
        assert_eq!(stored[0], parked[0]);
        assert!(stored[1..].iter().all(|r| r.state == JobState::Running && r.owner.as_deref() == Some("w3")));

        age_claims(conn);
        let later = Job::claim_counted(conn, jobs::owner, jobs::claimed_at, jobs::attempts, &request("w4", 10, MINUTE), &THREE_TRIES).unwrap();
        assert!(later.parked.is_empty() && later.rows.iter().all(|r| r.id != 1), "a parked row is never claimed again");
    }

    /// Limits that cannot work are refused before anything is written.
    #[test]
    fn impossible_attempt_limits_are_refused() {
        let Some(db) = setup(2) else { return };
        let conn = &mut db.conn();
        for limit in [
            AttemptLimit { max: 0, park_in: JobState::Parked },
            AttemptLimit { max: 3, park_in: JobState::Open },
            AttemptLimit { max: 3, park_in: JobState::Running },
        ] {
            let refused = Job::claim_counted(conn, jobs::owner, jobs::claimed_at, jobs::attempts, &request("w", 2, MINUTE), &limit);
            assert!(matches!(refused, Err(Error::InvalidSetting { what: "attempt limit", .. })), "{refused:?}");
        }
        assert!(all(conn).iter().all(|r| r.state == JobState::Open && r.attempts == 0));
    }

    /// Four workers on 60 rows, claims abandoned after 50 ms (so rows may be taken from
    /// workers still busy with them), every fifth row killing its worker: in the end every
    /// bad row is parked with exactly the maximum attempts, and every good row is done
    /// (finished exactly once) or parked at the maximum.
    #[test]
    fn workers_racing_on_failing_rows_end_with_every_row_done_or_parked() {
        const ROWS: i64 = 60;
        let Some(db) = setup(ROWS) else { return };
        let finished = AtomicUsize::new(0);
        let over = AtomicBool::new(false);
        let (start, pool) = (Barrier::new(4), &db.pool);
        std::thread::scope(|s| {
            for w in 0..4 {
                let (finished, over, start) = (&finished, &over, &start);
                s.spawn(move || {
                    let mut conn = pool.get().unwrap();
                    let me = format!("worker {w}");
                    start.wait();
                    while !over.load(Ordering::SeqCst) {
                        let claimed = match Job::claim_counted(&mut conn, jobs::owner, jobs::claimed_at, jobs::attempts, &request(&me, 3, Duration::from_millis(50)), &THREE_TRIES) {
                            Ok(claimed) => claimed,
                            Err(e) if e.is_retryable() => continue,
                            Err(e) => panic!("{e}"),
                        };
                        for row in claimed.rows {
                            if row.id % 5 == 0 {
                                continue; // this row kills its worker: never finished
                            }
                            match Job::finish_claim(&mut conn, &row.id, jobs::owner, &me, JobState::Running, JobState::Done, None) {
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
                            .get_result(&mut conn)
                            .unwrap();
                        if open == 0 {
                            over.store(true, Ordering::SeqCst);
                        }
                    }
                });
            }
        });
        let rows = all(&mut db.conn());
        let bad: Vec<&Job> = rows.iter().filter(|r| r.id % 5 == 0).collect();
        assert!(bad.iter().all(|r| r.state == JobState::Parked && r.attempts == 3 && r.owner.is_none()), "{bad:?}");
        // A good row taken over three times before anyone finished it is parked too.
        let good: Vec<&Job> = rows.iter().filter(|r| r.id % 5 != 0).collect();
        let done = good.iter().filter(|r| r.state == JobState::Done).count();
        assert!(good.iter().all(|r| (r.state == JobState::Done && (1..=3).contains(&r.attempts)) || (r.state == JobState::Parked && r.attempts == 3)), "{good:?}");
        assert_eq!(finished.load(Ordering::SeqCst), done, "each done row finished exactly once");
        println!("{BACKEND}: {done} of {} good rows done, the rest parked", good.len());
    }
}
