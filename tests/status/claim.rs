//! Task claiming on both executors (the blocking API and diesel-async), on every backend:
//! each task goes to exactly one worker, none is left behind, an abandoned claim is taken
//! again, only the holder can finish its claim, and a claim future dropped at any point
//! leaves no half claim and no locked row. End states are read from the database.

#![cfg(all(
    feature = "locks",
    feature = "async",
    any(not(feature = "mysql"), feature = "async-mysql")
))]

use crate::common;

use std::collections::BTreeSet;
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use common::claim_paths::{add_jobs, jobs, request, ClaimWorker, Job, JobState};
use diesel::prelude::*;
use diesel_occ::Error;
use diesel_occ::{AttemptLimit, ClaimOrder, ClaimRequest};

const MINUTE: Duration = Duration::from_secs(60);

for_each_backend! {
    type Db = common::TestDb<Conn>;

    fn all(db: &Db) -> Vec<Job> {
        jobs::table.order(jobs::id).select(Job::as_select()).load(&mut db.conn()).unwrap()
    }

    /// 4 workers claim 1,000 tasks 25 at a time, each finishing what it claimed (two a
    /// batch at once, two claim by claim).
    fn four_workers_claim_every_task_exactly_once<W: ClaimWorker>(db: &Db, worker: impl Fn() -> W + Sync) {
        const TASKS: i64 = 1000;
        add_jobs(&mut *db.conn(), 1..=TASKS);
        let start = Barrier::new(4);
        let claimed = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for n in 0..4 {
                let (start, claimed, worker) = (&start, &claimed, &worker);
                s.spawn(move || {
                    let me = format!("worker-{n}");
                    let mut w = worker();
                    start.wait();
                    loop {
                        let batch = w.claim(&request(&me, 25, MINUTE)).unwrap();
                        if batch.is_empty() {
                            break;
                        }
                        assert!(batch.len() <= 25, "{}: {} rows for a limit of 25", W::PATH, batch.len());
                        for task in &batch {
                            assert_eq!((task.state, task.owner.as_deref()), (JobState::Running, Some(me.as_str())));
                            assert!(task.claimed_at.is_some());
                        }
                        // Half the workers end their batch at once, half claim by claim.
                        if n % 2 == 0 {
                            let ids: Vec<i64> = batch.iter().map(|t| t.id).collect();
                            let ended = w.finish_claims(&ids, &me, JobState::Running, JobState::Done, Some(&me)).unwrap();
                            assert_eq!((ended.finished, ended.lost.len()), (ids, 0));
                        } else {
                            for task in &batch {
                                w.finish_claim(task.id, &me, JobState::Running, JobState::Done, Some(&me)).unwrap();
                            }
                        }
                        claimed.lock().unwrap().extend(batch.iter().map(|t| (t.id, me.clone())));
                    }
                });
            }
        });

        let claimed = claimed.into_inner().unwrap();
        let ids: BTreeSet<i64> = claimed.iter().map(|(id, _)| *id).collect();
        assert_eq!(claimed.len(), TASKS as usize, "{}: a task was claimed twice", W::PATH);
        assert_eq!(ids, (1..=TASKS).collect(), "{}: a task was left behind", W::PATH);
        for task in all(db) {
            let by = claimed.iter().find(|(id, _)| *id == task.id).map(|(_, w)| w.clone());
            assert_eq!((task.state, task.owner.clone(), task.version), (JobState::Done, by, 2), "{task:?}");
        }
        let per_worker: Vec<usize> = (0..4)
            .map(|n| claimed.iter().filter(|(_, by)| *by == format!("worker-{n}")).count())
            .collect();
        println!("{BACKEND} {}: {TASKS} tasks claimed once each by 4 workers: {per_worker:?}", W::PATH);
    }

    /// A claim whose worker vanished is taken again once it is older than
    /// `reclaim_after` by the database's clock; the first worker can no longer finish it.
    fn an_abandoned_claim_is_reclaimed_and_the_old_owner_is_locked_out<W: ClaimWorker>(db: &Db, worker: impl Fn() -> W) {
        add_jobs(&mut *db.conn(), 1..=3);
        let w = &mut worker();
        let first = w.claim(&request("crashed", 10, MINUTE)).unwrap();
        assert_eq!(first.len(), 3);
        // Fresh claims are not taken over.
        assert!(w.claim(&request("rescuer", 10, MINUTE)).unwrap().is_empty());

        let long_ago = chrono::DateTime::UNIX_EPOCH.naive_utc();
        diesel::update(jobs::table.filter(jobs::id.eq(2)))
            .set(jobs::claimed_at.eq(Some(long_ago)))
            .execute(&mut db.conn())
            .unwrap();
        let rescued = w.claim(&request("rescuer", 10, MINUTE)).unwrap();

        assert_eq!(rescued.iter().map(|t| (t.id, t.owner.clone().unwrap())).collect::<Vec<_>>(), [(2, "rescuer".to_string())]);
        let lost = w.finish_claim(2, "crashed", JobState::Running, JobState::Done, None).unwrap_err();
        assert!(matches!(lost, Error::LockLost { .. }), "{lost}");
        w.finish_claim(2, "rescuer", JobState::Running, JobState::Open, None).unwrap();
        let missing = w.finish_claim(9, "rescuer", JobState::Running, JobState::Done, None).unwrap_err();
        assert!(matches!(missing, Error::NotFound { .. }), "{missing}");
        let states: Vec<(i64, JobState, Option<String>)> = all(db).into_iter().map(|t| (t.id, t.state, t.owner)).collect();
        assert_eq!(states, [
            (1, JobState::Running, Some("crashed".into())),
            (2, JobState::Open, None),
            (3, JobState::Running, Some("crashed".into())),
        ], "{}", W::PATH);
    }

    fn a_claim_without_work_or_with_a_bad_owner_writes_nothing<W: ClaimWorker>(db: &Db, worker: impl Fn() -> W) {
        let w = &mut worker();
        assert!(w.claim(&request("w", 10, MINUTE)).unwrap().is_empty());
        add_jobs(&mut *db.conn(), 1..=2);
        let long = "w".repeat(10_000);
        let err = w.claim(&request(&long, 10, MINUTE)).unwrap_err();
        assert!(matches!(err, Error::InvalidName { what: "owner", .. }), "{err}");
        assert!(w.claim(&request("w", 0, MINUTE)).unwrap().is_empty());
        assert!(all(db).iter().all(|t| t.state == JobState::Open && t.version == 0), "{}", W::PATH);
    }

    /// A row whose version cannot advance is never handed out, and does not hold up the
    /// rows behind it: the claim takes the others, and leaves it open at its version
    /// (before, the version wrapped past its type: an error on PostgreSQL and MySQL, a
    /// float on SQLite). With a limit of 1 it is passed over too, not returned as "no work".
    fn a_row_at_the_last_version_is_passed_over<W: ClaimWorker>(db: &Db, worker: impl Fn() -> W) {
        add_jobs(&mut *db.conn(), 1..=3);
        diesel::update(jobs::table.filter(jobs::id.eq_any([1, 2]))).set(jobs::version.eq(i64::MAX)).execute(&mut db.conn()).unwrap();
        let w = &mut worker();

        let first = w.claim(&request("w", 1, MINUTE)).unwrap();
        let rest = w.claim(&request("w", 10, MINUTE)).unwrap();

        assert_eq!(first.iter().map(|t| t.id).collect::<Vec<_>>(), [3], "{}", W::PATH);
        assert!(rest.is_empty(), "{}: {rest:?}", W::PATH);
        let rows: Vec<(i64, JobState, Option<String>, i64)> =
            all(db).into_iter().map(|t| (t.id, t.state, t.owner, t.version)).collect();
        assert_eq!(rows, [
            (1, JobState::Open, None, i64::MAX),
            (2, JobState::Open, None, i64::MAX),
            (3, JobState::Running, Some("w".into()), 1),
        ], "{}", W::PATH);
    }

    /// Ending a batch of claims ends each one still this worker's, and says why for every
    /// other: taken over, row gone, version at its end, never claimed. Repeated keys count
    /// once; nothing is written for the lost ones.
    fn finish_claims_ends_the_held_claims_and_explains_the_rest<W: ClaimWorker>(db: &Db, worker: impl Fn() -> W) {
        add_jobs(&mut *db.conn(), 1..=6);
        let w = &mut worker();
        let mut mine: Vec<i64> = w.claim(&request("me", 6, MINUTE)).unwrap().iter().map(|t| t.id).collect();
        mine.sort();
        assert_eq!(mine, [1, 2, 3, 4, 5, 6], "{}", W::PATH);
        add_jobs(&mut *db.conn(), 7..=7);
        let conn = &mut *db.conn();
        diesel::update(jobs::table.find(2)).set(jobs::owner.eq("thief")).execute(conn).unwrap();
        diesel::delete(jobs::table.find(3)).execute(conn).unwrap();
        diesel::update(jobs::table.find(4)).set(jobs::version.eq(i64::MAX)).execute(conn).unwrap();

        let ended = w.finish_claims(&[1, 2, 3, 4, 7, 6, 1], "me", JobState::Running, JobState::Done, None).unwrap();

        assert_eq!(ended.finished, [1, 6], "{}", W::PATH);
        assert!(!ended.all_finished());
        let lost: Vec<(i64, &'static str)> = ended.lost.iter().map(|(id, e)| (*id, match e {
            Error::LockLost { .. } => "lost",
            Error::NotFound { .. } => "gone",
            Error::VersionOverflow { .. } => "at its end",
            _ => panic!("{}: row {id}: {e}", W::PATH),
        })).collect();
        assert_eq!(lost, [(2, "lost"), (3, "gone"), (4, "at its end"), (7, "lost")], "{}", W::PATH);
        let rows: Vec<(i64, JobState, Option<String>, i64)> =
            all(db).into_iter().map(|t| (t.id, t.state, t.owner, t.version)).collect();
        assert_eq!(rows, [
            (1, JobState::Done, None, 2),
            (2, JobState::Running, Some("thief".into()), 1),
            (4, JobState::Running, Some("me".into()), i64::MAX),
            (5, JobState::Running, Some("me".into()), 1),
            (6, JobState::Done, None, 2),
            (7, JobState::Open, None, 0),
        ], "{}", W::PATH);
        assert!(w.finish_claims(&[], "me", JobState::Running, JobState::Done, None).unwrap().all_finished());
    }

    /// Where an `UPDATE` can return rows (PostgreSQL, SQLite), a claim is one statement and
    /// so is ending a batch of claims; MySQL claims in its transaction (the locked read, the
    /// update, the read of the rows as written and of their owners, which tells a claim a
    /// Galera node rolled back unseen) and ends a batch in a transaction of one statement.
    fn a_claim_and_a_batch_end_are_one_statement_where_update_returns_rows<W: ClaimWorker>(db: &Db, worker: impl Fn() -> W) {
        add_jobs(&mut *db.conn(), 1..=10);
        let w = &mut worker();
        w.claim(&request("warm", 1, MINUTE)).unwrap();
        let statements = w.record_statements();

        let claimed = w.claim(&request("me", 3, MINUTE)).unwrap();
        let claim: Vec<String> = std::mem::take(&mut *statements.lock().unwrap());
        let ids: Vec<i64> = claimed.iter().map(|t| t.id).collect();
        let ended = w.finish_claims(&ids, "me", JobState::Running, JobState::Done, None).unwrap();
        let end: Vec<String> = std::mem::take(&mut *statements.lock().unwrap());

        assert_eq!((ended.finished.len(), ended.lost.len()), (3, 0), "{}", W::PATH);
        let (claim_sent, end_sent) = if BACKEND == "mysql" { (6, 3) } else { (1, 1) };
        assert_eq!(claim.len(), claim_sent, "{}: {claim:#?}", W::PATH);
        assert_eq!(end.len(), end_sent, "{}: {end:#?}", W::PATH);
        let done = jobs::table.filter(jobs::state.eq(JobState::Done)).count().get_result::<i64>(&mut db.conn()).unwrap();
        assert_eq!(done, 3, "{}", W::PATH);
    }

    /// Batches of 3, 4 and 5 claims end as they should (the `IN` list of the end is padded
    /// to a power of two by repeating a key, which must select no other row and count no
    /// row twice), and after one batch of each size class the worker's connection prepares
    /// nothing more: its claims and ends are taken from its statement cache.
    fn batches_of_any_size_reuse_a_few_prepared_statements<W: ClaimWorker>(db: &Db, worker: impl Fn() -> W) {
        add_jobs(&mut *db.conn(), 1..=40);
        let w = &mut worker();
        let cached = w.record_cached();
        let round = |w: &mut W| {
            for size in [3, 4, 5] {
                let batch = w.claim(&request("me", size, MINUTE)).unwrap();
                assert_eq!(batch.len(), size, "{}", W::PATH);
                let ids: Vec<i64> = batch.iter().map(|t| t.id).collect();
                let ended = w.finish_claims(&ids, "me", JobState::Running, JobState::Done, None).unwrap();
                assert_eq!((ended.finished, ended.lost.len()), (ids, 0), "{}", W::PATH);
            }
        };
        round(w);
        let first: Vec<String> = std::mem::take(&mut *cached.lock().unwrap());
        let ends = first.iter().filter(|sql| sql.starts_with("UPDATE") && sql.contains("RETURNING") == (BACKEND != "mysql") && !sql.contains("claimed_at")).count();
        assert!(ends >= 1, "{}: the end of a batch was not cached: {first:#?}", W::PATH);
        round(w);
        let second: Vec<String> = std::mem::take(&mut *cached.lock().unwrap());
        assert!(second.is_empty(), "{}: prepared again: {second:#?}", W::PATH);
        // From the database: the 24 claimed rows are done, once each, the rest untouched.
        let rows = all(db);
        let done: Vec<i64> = rows.iter().filter(|j| j.state == JobState::Done).map(|j| j.id).collect();
        assert_eq!(done.len(), 24, "{}", W::PATH);
        assert!(rows.iter().filter(|j| j.state == JobState::Done).all(|j| j.version == 2 && j.owner.is_none()), "{}", W::PATH);
        assert!(rows.iter().filter(|j| j.state != JobState::Done).all(|j| j.state == JobState::Open && j.version == 0), "{}", W::PATH);
    }

    /// A claim in key order takes the lowest open keys first, whatever order the rows were
    /// written in (here the higher keys first, and the first ones rewritten after), and so
    /// does a counted claim; only that order puts `ORDER BY` in the claim's read.
    fn a_claim_in_key_order_takes_the_lowest_keys_first<W: ClaimWorker>(db: &Db, worker: impl Fn() -> W) {
        add_jobs(&mut *db.conn(), 11..=20);
        add_jobs(&mut *db.conn(), 1..=10);
        diesel::update(jobs::table.filter(jobs::id.le(3))).set(jobs::attempts.eq(0)).execute(&mut db.conn()).unwrap();
        let w = &mut worker();
        let statements = w.record_statements();
        let by_key = |limit| ClaimRequest { order: ClaimOrder::ByKey, ..request("me", limit, MINUTE) };
        let ids = |jobs: &[Job]| jobs.iter().map(|j| j.id).collect::<Vec<_>>();

        let mut first = ids(&w.claim(&by_key(3)).unwrap());
        first.sort();
        assert_eq!(first, [1, 2, 3], "{}", W::PATH);
        let sent: Vec<String> = std::mem::take(&mut *statements.lock().unwrap());
        assert!(sent.iter().any(|sql| sql.contains("ORDER BY")), "{}: {sent:#?}", W::PATH);

        let limit = AttemptLimit { max: 5, park_in: JobState::Parked };
        let counted = w.claim_counted(&by_key(4), &limit).unwrap();
        let mut next = ids(&counted.rows);
        next.sort();
        assert_eq!(next, [4, 5, 6, 7], "{}", W::PATH);
        statements.lock().unwrap().clear();

        w.claim(&request("other", 2, MINUTE)).unwrap();
        let sent: Vec<String> = std::mem::take(&mut *statements.lock().unwrap());
        assert!(sent.iter().all(|sql| !sql.contains("ORDER BY")), "{}: {sent:#?}", W::PATH);
        // From the database: the seven lowest keys are `me`'s, two others `other`'s.
        let rows = all(db);
        let mine: Vec<i64> = rows.iter().filter(|j| j.owner.as_deref() == Some("me")).map(|j| j.id).collect();
        assert_eq!(mine, [1, 2, 3, 4, 5, 6, 7], "{}", W::PATH);
        assert_eq!(rows.iter().filter(|j| j.owner.as_deref() == Some("other")).count(), 2, "{}", W::PATH);
    }

    /// Claims filtered by a condition of the caller's (ids up to a bound, as a worker of one
    /// tenant would filter): two racing workers take every matching row exactly once and
    /// nothing else; an abandoned claim is taken again only when it matches; a counted
    /// claim parks only matching rows.
    fn a_filtered_claim_takes_only_the_rows_that_match<W: ClaimWorker>(db: &Db, worker: impl Fn() -> W + Sync) {
        add_jobs(&mut *db.conn(), 1..=200);
        let start = Barrier::new(2);
        let taken: Vec<Vec<i64>> = std::thread::scope(|s| {
            let workers: Vec<_> = ["a", "b"]
                .into_iter()
                .map(|me| {
                    let (start, worker) = (&start, &worker);
                    s.spawn(move || {
                        let mut w = worker();
                        let mut mine = Vec::new();
                        start.wait();
                        loop {
                            let batch = w.claim_ids_up_to(&request(me, 7, MINUTE), 100).unwrap();
                            if batch.is_empty() {
                                break mine;
                            }
                            mine.extend(batch.iter().map(|job| job.id));
                        }
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        let mut claimed: Vec<i64> = taken.concat();
        claimed.sort();
        assert_eq!(claimed, (1..=100).collect::<Vec<_>>(), "{}: each matching row once", W::PATH);
        let rows = all(db);
        for job in &rows {
            let expected = if job.id <= 100 { JobState::Running } else { JobState::Open };
            assert_eq!(job.state, expected, "{}: job {}", W::PATH, job.id);
        }

        // Job 5 (matching) and job 150 (not) abandoned long ago: only job 5 is taken again.
        let conn = &mut db.conn();
        diesel::update(jobs::table.filter(jobs::id.eq_any([5, 150])))
            .set((jobs::state.eq(JobState::Running), jobs::owner.eq("gone"), jobs::claimed_at.eq(chrono::DateTime::UNIX_EPOCH.naive_utc())))
            .execute(conn)
            .unwrap();
        let w = &mut worker();
        let again: Vec<i64> = w.claim_ids_up_to(&request("c", 10, MINUTE), 100).unwrap().iter().map(|j| j.id).collect();
        assert_eq!(again, [5], "{}", W::PATH);

        // Counting attempts, ids up to 120: job 110 is out of attempts and parked, job 130
        // (out of attempts too, but not matching) is left alone.
        diesel::update(jobs::table.filter(jobs::id.eq_any([110, 130]))).set(jobs::attempts.eq(5)).execute(conn).unwrap();
        let limit = AttemptLimit { max: 5, park_in: JobState::Parked };
        let counted = w.claim_counted_ids_up_to(&request("d", 50, MINUTE), &limit, 120).unwrap();
        let mut ids: Vec<i64> = counted.rows.iter().map(|j| j.id).collect();
        ids.sort();
        assert_eq!(ids, (101..=120).filter(|id| *id != 110).collect::<Vec<_>>(), "{}", W::PATH);
        assert_eq!(counted.parked.iter().map(|j| j.id).collect::<Vec<_>>(), [110], "{}", W::PATH);
        let rows = all(db);
        let state = |id: i64| rows.iter().find(|j| j.id == id).unwrap().state;
        assert_eq!((state(110), state(130), state(150), state(121)), (JobState::Parked, JobState::Open, JobState::Running, JobState::Open), "{}", W::PATH);
    }

    claim_tests_on_both_paths!(
        a_filtered_claim_takes_only_the_rows_that_match,
        four_workers_claim_every_task_exactly_once,
        an_abandoned_claim_is_reclaimed_and_the_old_owner_is_locked_out,
        a_claim_without_work_or_with_a_bad_owner_writes_nothing,
        a_row_at_the_last_version_is_passed_over,
        finish_claims_ends_the_held_claims_and_explains_the_rest,
        a_claim_and_a_batch_end_are_one_statement_where_update_returns_rows,
        batches_of_any_size_reuse_a_few_prepared_statements,
        a_claim_in_key_order_takes_the_lowest_keys_first,
    );

    /// Async claims, heartbeats and finishes dropped after 0-1 or 0-15 ms (a fresh PostgreSQL
    /// connection needs several to prepare its statements), in 600 rounds on one connection: every job ends open, done by a finish that returned, or running under
    /// the worker (a claim whose answer was dropped after its commit); none is half
    /// claimed, no transaction stays open, and every job not done is claimable at once.
    #[test]
    fn dropped_claim_futures_leave_no_half_claim_and_no_locked_row() {
        use common::paths::AsyncOf;
        use diesel_occ::asynchronous::AsyncGuardedClaim;
        const JOBS: i64 = 1_500;
        let Some(db) = db() else { return };
        common::claim_paths::create_jobs(&mut *db.conn(), BACKEND);
        add_jobs(&mut *db.conn(), 1..=JOBS);
        let runtime = common::paths::runtime();
        let mut conn = Conn::connect(&db.url, &runtime);
        let (mut seed, mut dropped, mut refused) = (11_u64, 0, 0);
        // Finishes that returned, and finishes dropped before they answered.
        let (mut finished, mut unanswered) = (BTreeSet::new(), BTreeSet::new());
        let mut next_limit = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            // Half the rounds within a millisecond, half within 15.
            let range = if seed >> 63 == 0 { 1_000 } else { 15_000 };
            Duration::from_micros((seed >> 33) % range)
        };
        for round in 0..600_u32 {
            let outcome = (|| {
                let two = request("w", 2, MINUTE);
                let claim = Job::claim(&mut conn, jobs::owner, jobs::claimed_at, &two);
                let rows = runtime.block_on(async { tokio::time::timeout(next_limit(), claim).await }).map_err(|_| None)?.map_err(Some)?;
                for job in rows {
                    let beat = Job::extend_claim(&mut conn, &job.id, jobs::owner, jobs::claimed_at, "w", JobState::Running);
                    runtime.block_on(async { tokio::time::timeout(next_limit(), beat).await }).map_err(|_| None)?.map_err(Some)?;
                    let end = Job::finish_claim(&mut conn, &job.id, jobs::owner, "w", JobState::Running, JobState::Done, None);
                    match runtime.block_on(async { tokio::time::timeout(next_limit(), end).await }) {
                        Ok(Ok(())) => finished.insert(job.id),
                        Ok(Err(e)) => return Err(Some(e)),
                        Err(_) => { unanswered.insert(job.id); return Err(None) }
                    };
                }
                Ok(())
            })();
            match outcome {
                Ok(()) => {}
                Err(None) => dropped += 1,
                Err(Some(Error::Database(diesel::result::Error::BrokenTransactionManager))) => {
                    refused += 1;
                    conn = Conn::connect(&db.url, &runtime);
                }
                Err(Some(other)) => panic!("round {round}: {other:?}"),
            }
        }
        drop(conn);
        eprintln!("{BACKEND}: {} finished, {dropped} dropped, {refused} connections refused", finished.len());
        assert!(!finished.is_empty() && dropped > 0, "both kinds of round must occur");

        let deadline = Instant::now() + Duration::from_secs(20);
        while common::open_transactions(&mut db.conn(), BACKEND) > 0 {
            assert!(Instant::now() < deadline, "a transaction stayed open");
            std::thread::sleep(Duration::from_millis(50));
        }
        let rows = all(&db);
        for job in &rows {
            match job.state {
                JobState::Open => assert_eq!((job.owner.as_deref(), job.version), (None, 0), "{job:?}"),
                JobState::Done => assert!((finished.contains(&job.id) || unanswered.contains(&job.id)) && job.owner.is_none(), "{job:?}"),
                JobState::Running => assert!(job.owner.as_deref() == Some("w") && job.claimed_at.is_some(), "{job:?}"),
                JobState::Parked => panic!("{job:?}"),
            }
        }
        let done: BTreeSet<i64> = rows.iter().filter(|j| j.state == JobState::Done).map(|j| j.id).collect();
        assert!(finished.is_subset(&done), "a finish that answered did not land");
        // Nothing holds a row: a blocking claim taking over every claim at once gets
        // every job that is not done.
        let mut check = db.conn();
        let rest = <Job as diesel_occ::GuardedClaim>::claim(&mut check, jobs::owner, jobs::claimed_at, &common::claim_paths::request("check", JOBS as usize, Duration::ZERO)).unwrap();
        assert_eq!(rest.len(), rows.len() - done.len(), "a job stayed locked or half claimed");
    }
}
