//! The edges of claiming and of ending claims in batches: 8 racing workers, claims in
//! the caller's transactions at each isolation level, two-column keys, takeovers racing
//! a batch end, hostile input, keys the database compares loosely, and dropped async
//! futures. End states are read from the database.

#![cfg(all(
    feature = "locks",
    feature = "async",
    any(not(feature = "mysql"), feature = "async-mysql")
))]

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use chrono::NaiveDateTime;
use common::claim_paths::{
    add_jobs, jobs, request, ClaimInTransaction, ClaimTable, ClaimWorker, Job, JobState,
};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_occ::{ClaimRequest, Error, GuardedClaim};

const MINUTE: Duration = Duration::from_secs(60);

diesel::table! {
    ctasks (queue, seq) {
        queue -> Text,
        seq -> BigInt,
        state -> Text,
        owner -> Nullable<Text>,
        claimed_at -> Nullable<Timestamp>,
        version -> BigInt,
    }
}

/// A task with a two-column key.
#[derive(
    Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, diesel_occ::Guarded,
)]
#[diesel(table_name = ctasks, primary_key(queue, seq))]
pub struct CTask {
    pub queue: String,
    pub seq: i64,
    #[occ(status)]
    pub state: JobState,
    pub owner: Option<String>,
    pub claimed_at: Option<NaiveDateTime>,
    #[occ(version)]
    pub version: i64,
}

fn create_ctasks(conn: &mut impl SimpleConnection, backend: &str) {
    let stamp = if backend == "mysql" {
        "DATETIME(6)"
    } else {
        "TIMESTAMP"
    };
    conn.batch_execute(&format!(
        "CREATE TABLE ctasks (queue VARCHAR(32) NOT NULL, seq BIGINT NOT NULL, \
         state VARCHAR(16) NOT NULL, owner VARCHAR(64), claimed_at {stamp}, \
         version BIGINT NOT NULL, PRIMARY KEY (queue, seq))"
    ))
    .unwrap();
}

fn add_ctasks(
    conn: &mut impl SimpleConnection,
    queues: &[&str],
    seqs: std::ops::RangeInclusive<i64>,
) {
    let mut rows = Vec::new();
    for q in queues {
        for s in seqs.clone() {
            rows.push(format!("('{q}', {s}, 'open', NULL, NULL, 0)"));
        }
    }
    conn.batch_execute(&format!(
        "INSERT INTO ctasks (queue, seq, state, owner, claimed_at, version) VALUES {}",
        rows.join(", ")
    ))
    .unwrap();
}

fn crequest(owner: &str, limit: usize) -> ClaimRequest<'_, JobState> {
    request(owner, limit, MINUTE)
}

#[derive(diesel::QueryableByName)]
struct N {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// Whether server session `id` sits idle with a transaction open (waits for a statement
/// still running on it to end first).
fn idle_in_transaction<C>(conn: &mut C, backend: &str, id: i64) -> bool
where
    C: diesel::connection::LoadConnection,
    diesel::query_builder::SqlQuery: diesel::query_dsl::LoadQuery<'static, C, N>,
{
    let (busy, open) = match backend {
        "postgres" => (
            format!("SELECT count(*)::bigint AS n FROM pg_stat_activity WHERE pid = {id} AND state = 'active'"),
            format!("SELECT count(*)::bigint AS n FROM pg_stat_activity WHERE pid = {id} AND state LIKE 'idle in transaction%'"),
        ),
        "mysql" => (
            format!("SELECT CAST(count(*) AS SIGNED) AS n FROM information_schema.processlist WHERE id = {id} AND command <> 'Sleep'"),
            format!("SELECT CAST(count(*) AS SIGNED) AS n FROM information_schema.innodb_trx WHERE trx_mysql_thread_id = {id}"),
        ),
        _ => return false,
    };
    let start = Instant::now();
    while diesel::sql_query(&busy).get_result::<N>(conn).unwrap().n > 0
        && start.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(2));
    }
    diesel::sql_query(&open).get_result::<N>(conn).unwrap().n > 0
}

for_each_backend! {
    type Db = common::TestDb<Conn>;

    fn all(db: &Db) -> Vec<Job> {
        jobs::table.order(jobs::id).select(Job::as_select()).load(&mut db.conn()).unwrap()
    }

    /// 8 workers, each with its own connection, claim `tasks` rows `limit` at a time.
    fn eight_workers<W: ClaimWorker>(db: &Db, worker: &(impl Fn() -> W + Sync), limit: usize, tasks: i64) {
        add_jobs(&mut *db.conn(), 1..=tasks);
        let start = Barrier::new(8);
        let claims: Vec<Vec<(i64, String, i64)>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8).map(|n| {
                let start = &start;
                s.spawn(move || {
                    let mut w = worker();
                    let me = format!("w{n}");
                    let mut got = Vec::new();
                    start.wait();
                    loop {
                        let batch = w.claim(&request(&me, limit, MINUTE)).unwrap_or_else(|e| panic!("{}: {me}: {e:?}", W::PATH));
                        if batch.is_empty() { break; }
                        assert!(batch.len() <= limit, "{}: {} rows for limit {limit}", W::PATH, batch.len());
                        for t in &batch {
                            assert_eq!((t.state, t.owner.as_deref(), t.version), (JobState::Running, Some(me.as_str()), 1), "{}", W::PATH);
                            got.push((t.id, me.clone(), t.version));
                        }
                    }
                    got
                })
            }).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut by_id: BTreeMap<i64, String> = BTreeMap::new();
        for (id, who, _) in claims.iter().flatten() {
            if let Some(first) = by_id.insert(*id, who.clone()) {
                panic!("{}: row {id} claimed by {first} and {who}", W::PATH);
            }
        }
        assert_eq!(by_id.len() as i64, tasks, "{}: rows left behind", W::PATH);
        for row in all(db) {
            assert_eq!((row.state, row.owner.as_ref(), row.version), (JobState::Running, by_id.get(&row.id), 1), "{}", W::PATH);
        }
        eprintln!("{BACKEND} {}: limit {limit}: per worker {:?}", W::PATH, claims.iter().map(Vec::len).collect::<Vec<_>>());
    }

    fn eight_workers_limit_1<W: ClaimWorker>(db: &Db, worker: impl Fn() -> W + Sync) {
        eight_workers(db, &worker, 1, 300);
    }

    fn eight_workers_limit_100<W: ClaimWorker>(db: &Db, worker: impl Fn() -> W + Sync) {
        eight_workers(db, &worker, 100, 3000);
    }

    /// The old owner ends 300 claims at once while 4 takers take over abandoned claims
    /// (`reclaim_after` zero, so they also take from each other): a claim that was taken
    /// over is never ended by the old owner, and each row version goes to one worker.
    fn takeover_races_finish_claims<W: ClaimWorker>(db: &Db, worker: impl Fn() -> W + Sync) {
        const N: i64 = 300;
        let (mut taken_total, mut finished_total) = (0, 0);
        for round in 0..6_i64 {
            let base = round * N;
            add_jobs(&mut *db.conn(), base + 1..=base + N);
            let mine: Vec<i64> = worker().claim(&request("old", N as usize, MINUTE)).unwrap().iter().map(|t| t.id).collect();
            assert_eq!(mine.len() as i64, N);
            std::thread::sleep(Duration::from_millis(if BACKEND == "sqlite" { 1100 } else { 20 }));
            let (start, ended) = (Barrier::new(5), AtomicBool::new(false));
            let (fin, takes) = std::thread::scope(|s| {
                let (start, ended, mine, worker) = (&start, &ended, &mine, &worker);
                let finisher = s.spawn(move || {
                    let mut w = worker();
                    start.wait();
                    let r = w.finish_claims(mine, "old", JobState::Running, JobState::Done, None);
                    ended.store(true, Ordering::SeqCst);
                    r
                });
                let takers: Vec<_> = (0..4).map(|t| s.spawn(move || {
                    let mut w = worker();
                    let me = format!("taker{t}");
                    let mut got = Vec::new();
                    let mut after = 0;
                    start.wait();
                    while after < 3 {
                        if ended.load(Ordering::SeqCst) { after += 1; }
                        let batch = w.claim(&request(&me, 7, Duration::ZERO)).unwrap_or_else(|e| panic!("{}: {e:?}", W::PATH));
                        assert!(batch.len() <= 7);
                        got.extend(batch.into_iter().map(|r| (r.id, me.clone(), r.version)));
                    }
                    got
                })).collect();
                (finisher.join().unwrap(), takers.into_iter().flat_map(|h| h.join().unwrap()).collect::<Vec<_>>())
            });
            let fin = fin.unwrap_or_else(|e| panic!("{}: {e:?}", W::PATH));
            let finished: BTreeSet<i64> = fin.finished.iter().copied().collect();
            let lost: BTreeSet<i64> = fin.lost.iter().map(|(k, _)| *k).collect();
            for (k, e) in &fin.lost {
                assert!(matches!(e, Error::LockLost { .. }), "{}: {k}: {e:?}", W::PATH);
            }
            assert!(finished.is_disjoint(&lost));
            assert_eq!(finished.union(&lost).copied().collect::<Vec<_>>(), mine.iter().copied().collect::<BTreeSet<_>>().into_iter().collect::<Vec<_>>());
            // Each (row, version) handed out once; the last hand-out is the row's holder.
            let mut last: BTreeMap<i64, (i64, String)> = BTreeMap::new();
            let mut seen = BTreeSet::new();
            for (id, who, v) in &takes {
                assert!(seen.insert((*id, *v)), "{}: row {id} version {v} handed out twice", W::PATH);
                assert!(!finished.contains(id), "{}: row {id} finished by the old owner but also taken by {who} at v{v}", W::PATH);
                if last.get(id).is_none_or(|(lv, _)| v > lv) { last.insert(*id, (*v, who.clone())); }
            }
            let rows: Vec<Job> = jobs::table.filter(jobs::id.gt(base)).filter(jobs::id.le(base + N)).order(jobs::id).select(Job::as_select()).load(&mut db.conn()).unwrap();
            for row in rows {
                if finished.contains(&row.id) {
                    assert_eq!((row.state, row.owner.as_deref(), row.version), (JobState::Done, None, 2), "{}: {row:?}", W::PATH);
                } else {
                    let (v, who) = last.get(&row.id).unwrap_or_else(|| panic!("{}: lost row {} never taken: {row:?}", W::PATH, row.id));
                    assert_eq!((row.state, row.owner.as_ref(), row.version), (JobState::Running, Some(who), *v), "{}", W::PATH);
                }
            }
            taken_total += lost.len();
            finished_total += finished.len();
        }
        eprintln!("{BACKEND} {}: takeover race: {finished_total} finished by the old owner, {taken_total} taken over", W::PATH);
    }

    /// Hostile input: a 10 kB owner, an empty key list, 5,000 keys (with repeats) in one
    /// call, one lost claim in each chunk, a 10 kB next owner.
    fn hostile_finish_claims_input<W: ClaimWorker>(db: &Db, worker: impl Fn() -> W) {
        let w = &mut worker();
        let big = "x".repeat(10_000);
        add_jobs(&mut *db.conn(), 1..=5000);
        // A 10 kB owner is refused before anything is sent.
        let err = w.claim(&request(&big, 10, MINUTE)).unwrap_err();
        assert!(matches!(err, Error::InvalidName { .. }), "{}: {err:?}", W::PATH);
        assert!(all(db).iter().all(|t| t.version == 0));
        let claimed = w.claim(&request("me", 5000, MINUTE)).unwrap();
        assert_eq!(claimed.len(), 5000, "{}", W::PATH);
        // Finishing with a 10 kB owner ends nothing and writes nothing.
        let r = w.finish_claims(&[1, 2, 3], &big, JobState::Running, JobState::Done, None);
        match &r {
            Ok(f) => assert_eq!((f.finished.len(), f.lost.len()), (0, 3), "{}", W::PATH),
            Err(e) => eprintln!("{BACKEND} {}: 10 kB owner finish: {e}", W::PATH),
        }
        // Empty list: nothing sent.
        let statements = w.record_statements();
        let none = w.finish_claims(&[], "me", JobState::Running, JobState::Done, None).unwrap();
        assert!(none.finished.is_empty() && none.lost.is_empty());
        assert!(statements.lock().unwrap().is_empty(), "{}: {:?}", W::PATH, statements.lock().unwrap());
        // One lost claim in every chunk of 1,000 (rows 500, 1500, ...).
        for id in (500..=5000).step_by(1000) {
            diesel::update(jobs::table.find(id)).set(jobs::owner.eq("thief")).execute(&mut db.conn()).unwrap();
        }
        // 5,000 keys, each twice, interleaved, plus 10 keys that do not exist.
        let mut keys: Vec<i64> = (1..=5000).flat_map(|k| [k, 5001 - k]).collect();
        keys.extend(9001..=9010);
        let t = Instant::now();
        let ended = match w.finish_claims(&keys, "me", JobState::Running, JobState::Done, None) {
            Ok(ended) => ended,
            Err(e) if BACKEND == "sqlite" => {
                // See `sqlite_finish_claims_of_1000_keys`.
                let done = all(db).iter().filter(|t| t.state == JobState::Done).count();
                eprintln!("{BACKEND} {}: 5,000 keys: {e:?}; rows done after it: {done}", W::PATH);
                diesel::update(jobs::table.filter(jobs::id.eq(500))).set(jobs::owner.eq("me")).execute(&mut db.conn()).unwrap();
                hostile_next_owner(db, w, &big);
                return;
            }
            Err(e) => panic!("{}: {e:?}", W::PATH),
        };
        let sent = statements.lock().unwrap().len();
        eprintln!("{BACKEND} {}: 5,010 distinct of 10,010 keys finished in {:?}, {sent} statements", W::PATH, t.elapsed());
        let mut expected: Vec<i64> = Vec::new();
        for k in &keys { if !expected.contains(k) { expected.push(*k); } }
        let thief: Vec<i64> = (500..=5000).step_by(1000).collect();
        let want_finished: Vec<i64> = expected.iter().copied().filter(|k| *k <= 5000 && !thief.contains(k)).collect();
        assert_eq!(ended.finished, want_finished, "{}", W::PATH);
        let lost: Vec<(i64, &str)> = ended.lost.iter().map(|(k, e)| (*k, match e {
            Error::LockLost { .. } => "lost", Error::NotFound { .. } => "gone", _ => panic!("{}: {k}: {e:?}", W::PATH),
        })).collect();
        let mut want_lost: Vec<(i64, &str)> = expected.iter().copied().filter(|k| thief.contains(k)).map(|k| (k, "lost")).collect();
        want_lost.extend((9001..=9010).map(|k| (k, "gone")));
        let mut lost_sorted = lost.clone();
        lost_sorted.sort();
        want_lost.sort();
        assert_eq!(lost_sorted, want_lost, "{}", W::PATH);
        for row in all(db) {
            if thief.contains(&row.id) {
                assert_eq!((row.state, row.owner.as_deref(), row.version), (JobState::Running, Some("thief"), 1));
            } else {
                assert_eq!((row.state, row.owner.as_deref(), row.version), (JobState::Done, None, 2), "{}", W::PATH);
            }
        }
        diesel::update(jobs::table.find(500)).set(jobs::owner.eq("me")).execute(&mut db.conn()).unwrap();
        hostile_next_owner(db, w, &big);
    }

    fn hostile_next_owner<W: ClaimWorker>(db: &Db, w: &mut W, big: &str) {
        // A NUL in the owner of a finish (claims refuse one as `InvalidName`).
        let r = w.finish_claims(&[500], "a\0b", JobState::Running, JobState::Done, None);
        eprintln!("{BACKEND} {}: NUL owner finish: {:?}", W::PATH, r.as_ref().map(|f| (f.finished.len(), f.lost.len())).map_err(|e| format!("{e:?}")));
        // A 10 kB next owner (the owner column is VARCHAR(64)).
        let r = w.finish_claims(&[500], "me", JobState::Running, JobState::Done, Some(big));
        let row = jobs::table.find(500).select(Job::as_select()).first(&mut db.conn()).unwrap();
        eprintln!("{BACKEND} {}: 10 kB next owner: {:?}; row now {:?} owner len {:?}", W::PATH, r.as_ref().map(|f| (f.finished.len(), f.lost.len())).map_err(|e| e.to_string()), row.state, row.owner.as_ref().map(String::len));
    }

    claim_tests_on_both_paths!(
        eight_workers_limit_1,
        eight_workers_limit_100,
        takeover_races_finish_claims,
        hostile_finish_claims_input,
        composite_key_claim_and_finish,
        sqlite_finish_claims_of_1000_keys,
        finish_claims_with_a_loosely_compared_key,
        claims_in_caller_transactions,
        failed_claim_keeps_callers_transaction_usable,
        a_claim_on_a_lost_connection_answers_alike_on_both_drivers,
    );

    /// A claim whose connection is already lost answers the same on both drivers, and
    /// takes nothing: on MySQL its `BEGIN` fails, before anything is written, so the
    /// answer is the lost connection itself; on PostgreSQL the claim is one `UPDATE`,
    /// which may have reached the server, so the answer is `Ambiguous`.
    fn a_claim_on_a_lost_connection_answers_alike_on_both_drivers<W: ClaimWorker>(db: &Db, worker: impl Fn() -> W) {
        if BACKEND == "sqlite" {
            return; // No server session to lose.
        }
        add_jobs(&mut *db.conn(), 1..=4);
        let mut w = worker();
        w.end_session(BACKEND);
        let claimed = w.claim(&crequest("w", 2));
        // How libmysqlclient and mysql_async word a session that is gone.
        let lost = |e: &diesel::result::Error| ["gone away", "Lost connection", "Connection was killed", "Input/output error"].iter().any(|t| e.to_string().contains(t));
        match BACKEND {
            "mysql" => assert!(matches!(&claimed, Err(Error::Database(e)) if lost(e)), "{BACKEND} {}: {claimed:?}", W::PATH),
            _ => assert!(matches!(&claimed, Err(Error::Ambiguous { .. })), "{BACKEND} {}: {claimed:?}", W::PATH),
        }
        assert!(all(db).iter().all(|job| job.state == JobState::Open && job.owner.is_none()), "{BACKEND} {}: a row was taken", W::PATH);
    }

    /// Claims inside the caller's transaction: rolled back with it, committed with it, and
    /// raced by 8 workers at each isolation level (PostgreSQL: READ COMMITTED, REPEATABLE
    /// READ, SERIALIZABLE), with and without a read first that pins the snapshot.
    fn claims_in_caller_transactions<W: ClaimInTransaction>(db: &Db, worker: impl Fn() -> W + Sync) {
        add_jobs(&mut *db.conn(), 1..=10);
        {
            let w = &mut worker();
            let r: Result<(), Error> = w.in_transaction_at("rc", |w| {
                let rows = w.claim(&crequest("me", 3))?;
                assert_eq!(rows.len(), 3);
                Err(Error::Database(diesel::result::Error::RollbackTransaction))
            });
            assert!(r.is_err());
            assert!(all(db).iter().all(|t| t.state == JobState::Open && t.version == 0 && t.owner.is_none()), "{}: rolled back claim left a trace", W::PATH);
            let rows = w.in_transaction_at("rc", |w| w.claim(&crequest("me", 3))).unwrap();
            assert_eq!(rows.len(), 3);
            assert_eq!(all(db).iter().filter(|t| t.owner.as_deref() == Some("me")).count(), 3);
            let ids: Vec<i64> = rows.iter().map(|t| t.id).collect();
            let f = w.in_transaction_at("rc", |w| w.finish_claims(&ids, "me", JobState::Running, JobState::Done, None)).unwrap();
            assert_eq!(f.finished, ids);
        }
        let levels: &[&str] = if BACKEND == "postgres" { &["rc", "rr", "ser"] } else { &["rc"] };
        for level in levels {
            for read_first in [false, true] {
                for limit in [1_usize, 100] {
                    db.conn().batch_execute("DELETE FROM jobs").unwrap();
                    let tasks = if limit == 1 { 200 } else { 2000 };
                    add_jobs(&mut *db.conn(), 1..=tasks);
                    let results = common::drivers::race(8, &worker, |t, w| {
                        let me = format!("w{t}");
                        let (mut got, mut retries) = (Vec::new(), 0);
                        let mut empty = 0;
                        while empty < 2 {
                            let r = w.in_transaction_at(level, |w| {
                                if read_first {
                                    w.count_jobs(None)?;
                                    std::thread::sleep(Duration::from_millis(1));
                                }
                                let rows = w.claim(&crequest(&me, limit))?;
                                if read_first {
                                    // the transaction is still usable after the claim
                                    w.count_jobs(None)?;
                                }
                                Ok(rows)
                            });
                            match r {
                                Ok(rows) if rows.is_empty() => empty += 1,
                                Ok(rows) => {
                                    empty = 0;
                                    assert!(rows.len() <= limit, "{level}: {} rows for limit {limit}", rows.len());
                                    got.extend(rows.into_iter().map(|r| (r.id, r.version)));
                                }
                                Err(Error::Retryable { .. }) => { retries += 1; assert!(retries < 100_000) }
                                Err(e) => panic!("{BACKEND} {} {level} read_first={read_first}: {e:?}", W::PATH),
                            }
                        }
                        (me, got, retries)
                    });
                    let mut owner_of = BTreeMap::new();
                    let mut total_retries = 0;
                    for (me, got, retries) in &results {
                        total_retries += retries;
                        for (id, v) in got {
                            assert_eq!(*v, 1);
                            if let Some(o) = owner_of.insert(*id, me.clone()) { panic!("{BACKEND} {} {level}: row {id} claimed by {o} and {me}", W::PATH); }
                        }
                    }
                    let rows = all(db);
                    let left = rows.iter().filter(|r| r.state == JobState::Open).count();
                    for r in &rows {
                        if r.state == JobState::Running {
                            assert_eq!((r.owner.as_ref(), r.version), (owner_of.get(&r.id), 1), "{BACKEND} {} {level}: {r:?}", W::PATH);
                        } else {
                            assert_eq!((r.owner.as_ref(), r.version), (None, 0), "{BACKEND} {} {level}: {r:?}", W::PATH);
                        }
                    }
                    assert_eq!(owner_of.len() + left, tasks as usize);
                    assert_eq!(left, 0, "{BACKEND} {} {level} read_first={read_first} limit={limit}: rows left open", W::PATH);
                    eprintln!("{BACKEND} {} caller tx {level} read_first={read_first} limit={limit}: {} claimed, {total_retries} retries", W::PATH, owner_of.len());
                }
            }
        }
    }

    /// A claim that fails inside the caller's REPEATABLE READ transaction (the rows moved
    /// after its snapshot) leaves the transaction usable and claims nothing (PostgreSQL).
    fn failed_claim_keeps_callers_transaction_usable<W: ClaimInTransaction>(db: &Db, worker: impl Fn() -> W) {
        if BACKEND != "postgres" { return; }
        add_jobs(&mut *db.conn(), 1..=3);
        let (w, other) = (&mut worker(), &mut worker());
        let r = w.in_transaction_at("rr", |w| {
            w.count_jobs(None)?;
            let stolen = other.claim(&crequest("other", 3)).unwrap();
            assert_eq!(stolen.len(), 3);
            let e = w.claim(&crequest("me", 3)).unwrap_err();
            assert!(matches!(e, Error::Retryable { .. }), "{}: {e:?}", W::PATH);
            w.count_jobs(Some("me"))
        });
        assert_eq!(r.unwrap(), 0);
        assert!(all(db).iter().all(|t| t.owner.as_deref() == Some("other") && t.version == 1));
    }

    /// A two-column key: 4 workers claim 3 at a time, then each ends its claims and some
    /// it does not hold at once; then one worker claims 3 of a new queue and ends them
    /// with a key it never held.
    fn composite_key_claim_and_finish<W>(db: &Db, worker: impl Fn() -> W + Sync)
    where
        W: ClaimTable<CTask, ctasks::owner, ctasks::claimed_at>,
    {
        create_ctasks(&mut *db.conn(), BACKEND);
        add_ctasks(&mut *db.conn(), &["a", "b"], 1..=30);
        let results = common::drivers::race(4, &worker, |t, w| {
            let me = format!("w{t}");
            let mut got: Vec<(String, i64)> = Vec::new();
            loop {
                let rows = w.claim_rows(ctasks::owner, ctasks::claimed_at, &crequest(&me, 3)).unwrap();
                if rows.is_empty() { break; }
                assert!(rows.len() <= 3);
                for r in &rows { assert_eq!((r.owner.as_deref(), r.version, r.state), (Some(me.as_str()), 1, JobState::Running)); }
                got.extend(rows.into_iter().map(|r| (r.queue, r.seq)));
            }
            (me, got)
        });
        let mut owner_of = BTreeMap::new();
        for (me, got) in &results {
            for k in got { assert!(owner_of.insert(k.clone(), me.clone()).is_none(), "{BACKEND}: {k:?} twice"); }
        }
        assert_eq!(owner_of.len(), 60);
        // Each worker ends its own, plus w0's first key, a missing key and a repeat.
        let conn = &mut *db.conn();
        let w = &mut worker();
        let (victim, w0_first) = results.iter().find(|(_, got)| !got.is_empty()).map(|(me, got)| (me.clone(), got[0].clone())).unwrap();
        for (me, got) in &results {
            if got.is_empty() { continue; }
            let mut keys = got.clone();
            if *me != victim { keys.push(w0_first.clone()); }
            keys.push(("zz".to_string(), 1));
            keys.push(got[0].clone());
            let f = w.end_claims(&keys, ctasks::owner, me, JobState::Running, JobState::Done, None).unwrap();
            assert_eq!(&f.finished, got, "{BACKEND}: {me}");
            let lost: Vec<_> = f.lost.iter().map(|(k, e)| (k.clone(), matches!(e, Error::LockLost { .. }), matches!(e, Error::NotFound { .. }))).collect();
            let mut want = Vec::new();
            if *me != victim { want.push((w0_first.clone(), true, false)); }
            want.push((("zz".to_string(), 1), false, true));
            assert_eq!(lost, want, "{BACKEND}: {me}");
        }
        let rows: Vec<CTask> = ctasks::table.select(CTask::as_select()).load(conn).unwrap();
        assert!(rows.iter().all(|r| r.state == JobState::Done && r.version == 2 && r.owner.is_none()), "{BACKEND}: {rows:?}");
        // One worker, a new queue, and a key it never held.
        add_ctasks(conn, &["c"], 1..=5);
        let got = w.claim_rows(ctasks::owner, ctasks::claimed_at, &crequest("single", 3)).unwrap();
        assert_eq!(got.len(), 3);
        let mut keys: Vec<(String, i64)> = got.iter().map(|r| (r.queue.clone(), r.seq)).collect();
        keys.push(("a".into(), 1));
        let f = w.end_claims(&keys, ctasks::owner, "single", JobState::Running, JobState::Done, None).unwrap();
        assert_eq!(f.finished, keys[..3].to_vec());
        assert_eq!(f.lost.len(), 1);
        let rows: Vec<CTask> = ctasks::table.filter(ctasks::queue.eq("c")).select(CTask::as_select()).load(conn).unwrap();
        assert_eq!(rows.iter().filter(|r| r.state == JobState::Done && r.version == 2).count(), 3, "{rows:?}");
        assert_eq!(rows.iter().filter(|r| r.state == JobState::Open && r.version == 0).count(), 2, "{rows:?}");
    }

    /// On SQLite, ending 1,000 claims at once works: the keys are an `OR` chain, which
    /// SQLite parses as an expression tree as deep as the chain (at most 1,000 by default),
    /// so the batch is split below that.
    /// (Run on every backend.)
    fn sqlite_finish_claims_of_1000_keys<W: ClaimWorker>(db: &Db, worker: impl Fn() -> W) {
        let conn = &mut *db.conn();
        let w = &mut worker();
        let mut largest_ok = 0;
        let mut base = 0;
        for n in [990_i64, 994, 995, 996, 997, 998, 999, 1000] {
            add_jobs(conn, base + 1..=base + n);
            let ids: Vec<i64> = w.claim(&request("me", n as usize, MINUTE)).unwrap().iter().map(|t| t.id).collect();
            assert_eq!(ids.len() as i64, n);
            match w.finish_claims(&ids, "me", JobState::Running, JobState::Done, None) {
                Ok(f) => { assert_eq!(f.finished.len() as i64, n); largest_ok = n; }
                Err(e) => {
                    eprintln!("{BACKEND} {}: finish_claims of {n} keys: {e:?}", W::PATH);
                    let done = jobs::table.filter(jobs::state.eq(JobState::Done)).filter(jobs::id.gt(base)).count().get_result::<i64>(conn).unwrap();
                    eprintln!("{BACKEND}: rows of that call now done: {done} of {n}");
                }
            }
            // Leave nothing claimable for the next size.
            diesel::update(jobs::table.filter(jobs::id.gt(base))).set(jobs::state.eq(JobState::Done)).execute(conn).unwrap();
            base += n;
        }
        eprintln!("{BACKEND} {}: largest finish_claims that worked: {largest_ok} keys", W::PATH);
        assert_eq!(largest_ok, 1000, "{BACKEND} {}: finish_claims of 1,000 keys (one chunk) failed", W::PATH);
    }


    diesel::table! {
        ntasks (name) {
            name -> Text,
            state -> Text,
            owner -> Nullable<Text>,
            claimed_at -> Nullable<Timestamp>,
            version -> BigInt,
        }
    }

    #[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, diesel_occ::Guarded)]
    #[diesel(table_name = ntasks, primary_key(name))]
    pub struct NTask {
        pub name: String,
        #[occ(status)]
        pub state: JobState,
        pub owner: Option<String>,
        pub claimed_at: Option<NaiveDateTime>,
        #[occ(version)]
        pub version: i64,
    }

    /// A text key the database compares loosely (SQLite `COLLATE NOCASE`, PostgreSQL
    /// `CHAR(8)`, MySQL's case-insensitive collation): `finish_claim` of the key as the
    /// caller spells it ends the claim and says so; `finish_claims` must agree.
    fn finish_claims_with_a_loosely_compared_key<W>(db: &Db, worker: impl Fn() -> W)
    where
        W: ClaimTable<NTask, ntasks::owner, ntasks::claimed_at>,
    {
        let w = &mut worker();
        let key_type = match BACKEND { "sqlite" => "TEXT COLLATE NOCASE", "postgres" => "CHAR(8)", _ => "VARCHAR(32)" };
        let stamp = if BACKEND == "mysql" { "DATETIME(6)" } else { "TIMESTAMP" };
        let conn = &mut *db.conn();
        conn.batch_execute(&format!("CREATE TABLE ntasks (name {key_type} PRIMARY KEY, state VARCHAR(16) NOT NULL, owner VARCHAR(64), claimed_at {stamp}, version BIGINT NOT NULL)")).unwrap();
        conn.batch_execute("INSERT INTO ntasks VALUES ('abc', 'open', NULL, NULL, 0), ('xyz', 'open', NULL, NULL, 0)").unwrap();
        let got = w.claim_rows(ntasks::owner, ntasks::claimed_at, &crequest("me", 2)).unwrap();
        eprintln!("{BACKEND}: claimed keys as returned: {:?}", got.iter().map(|t| &t.name).collect::<Vec<_>>());
        let spell = |k: &str| if BACKEND == "postgres" { k.to_string() } else { k.to_uppercase() };
        let one = w.end_claim(&spell("xyz"), ntasks::owner, "me", JobState::Running, JobState::Done, None);
        let many = w.end_claims(&[spell("abc")], ntasks::owner, "me", JobState::Running, JobState::Done, None).unwrap();
        let rows: Vec<(String, JobState, i64)> = ntasks::table.order(ntasks::name).select((ntasks::name, ntasks::state, ntasks::version)).load(conn).unwrap();
        eprintln!("{BACKEND}: finish_claim {:?}; finish_claims finished {:?} lost {:?}; rows {rows:?}", one.as_ref().map_err(|e| e.to_string()), many.finished, many.lost.iter().map(|(k, e)| (k, e.to_string())).collect::<Vec<_>>());
        assert!(one.is_ok());
        assert_eq!(rows.iter().map(|r| (r.1, r.2)).collect::<Vec<_>>(), [(JobState::Done, 2), (JobState::Done, 2)]);
        assert_eq!((many.finished.len(), many.lost.len()), (1, 0), "{BACKEND}: the claim ended in the database but finish_claims reports it lost");
    }

    /// Async claims and batch finishes dropped at random points (0-3 ms): afterwards no
    /// transaction stays open on a connection the library would use again, and every row
    /// is open, done (by a finish that answered or was dropped) or still the worker's.
    #[test]
    fn dropped_finish_claims_futures() {
        use common::paths::AsyncOf;
        use diesel_occ::asynchronous::AsyncGuardedClaim;
        use diesel_async::{AsyncConnection, TransactionManager};
        type A = <Conn as AsyncOf>::Async;
        const JOBS: i64 = 6_000;
        let Some(db) = db() else { return };
        common::claim_paths::create_jobs(&mut *db.conn(), BACKEND);
        add_jobs(&mut *db.conn(), 1..=JOBS);
        let runtime = common::paths::runtime();
        let session = |conn: &mut A| -> i64 {
            match common::session_id_sql(BACKEND) {
                Some(sql) => runtime.block_on(diesel_async::RunQueryDsl::get_result::<common::Value>(diesel::sql_query(sql), conn)).unwrap().value,
                None => 0,
            }
        };
        let broken = |conn: &mut A| -> bool {
            <A as AsyncConnection>::TransactionManager::transaction_manager_status_mut(conn).transaction_depth().is_err()
        };
        let mut conn = Conn::connect(&db.url, &runtime);
        let mut sid = session(&mut conn);
        let mut seed = 7_u64;
        let mut rand = move |m: u64| { seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (seed >> 33) % m };
        let (mut finished, mut unanswered) = (BTreeSet::new(), BTreeSet::new());
        let (mut dropped, mut reconnects, mut open_on_broken) = (0, 0, 0);
        let mut check = db.conn();
        for round in 0..400 {
            let limit = [1, 10, 200, 900][rand(4) as usize];
            let req = request("w", limit, MINUTE);
            // Claims are dropped in one round of four only; finishes in every round.
            let claim_within = if rand(4) == 0 { rand(3000) } else { 60_000_000 };
            let claimed = runtime.block_on(async { tokio::time::timeout(Duration::from_micros(claim_within), <Job as AsyncGuardedClaim>::claim(&mut conn, jobs::owner, jobs::claimed_at, &req)).await });
            let ids: Vec<i64> = match claimed {
                Ok(Ok(rows)) => rows.iter().map(|t| t.id).collect(),
                Ok(Err(Error::Database(diesel::result::Error::BrokenTransactionManager))) => Vec::new(),
                Ok(Err(e)) => panic!("round {round}: claim: {e:?}"),
                Err(_) => { dropped += 1; Vec::new() }
            };
            if !ids.is_empty() && !broken(&mut conn) {
                let end = <Job as AsyncGuardedClaim>::finish_claims(&mut conn, &ids, jobs::owner, "w", JobState::Running, JobState::Done, None);
                match runtime.block_on(async { tokio::time::timeout(Duration::from_micros(rand(12_000)), end).await }) {
                    Ok(Ok(f)) => { assert!(f.lost.is_empty(), "round {round}: {:?}", f.lost); finished.extend(f.finished) }
                    Ok(Err(Error::Database(diesel::result::Error::BrokenTransactionManager))) => {}
                    Ok(Err(e)) => panic!("round {round}: finish: {e:?}"),
                    Err(_) => { dropped += 1; unanswered.extend(ids.iter().copied()); }
                }
            }
            // What the server has for this session now.
            let open = idle_in_transaction(&mut *check, BACKEND, sid);
            if broken(&mut conn) {
                if open { open_on_broken += 1; }
                drop(std::mem::replace(&mut conn, Conn::connect(&db.url, &runtime)));
                sid = session(&mut conn);
                reconnects += 1;
            } else if open {
                panic!("{BACKEND} round {round}: a transaction is open on session {sid}, and the connection is not marked broken");
            }
        }
        drop(conn);
        eprintln!("{BACKEND}: {} finished, {} unanswered, {dropped} dropped, {reconnects} reconnects, open-while-broken {open_on_broken}", finished.len(), unanswered.len());
        std::thread::sleep(Duration::from_millis(500));
        let rows = all(&db);
        for job in &rows {
            match job.state {
                JobState::Open => assert_eq!((job.owner.as_deref(), job.version), (None, 0), "{BACKEND}: {job:?}"),
                JobState::Done => assert!((finished.contains(&job.id) || unanswered.contains(&job.id)) && job.owner.is_none() && job.version == 2, "{BACKEND}: {job:?}"),
                JobState::Running => assert!(job.owner.as_deref() == Some("w") && job.version == 1 && !finished.contains(&job.id), "{BACKEND}: {job:?}"),
                JobState::Parked => panic!("{job:?}"),
            }
        }
        // Nothing stays locked: every held row can be ended now.
        let held: Vec<i64> = rows.iter().filter(|j| j.state == JobState::Running).map(|j| j.id).collect();
        let t = Instant::now();
        // (in slices of 500: SQLite refuses 1,000 keys, see `sqlite_finish_claims_of_1000_keys`)
        for slice in held.chunks(500) {
            let f = <Job as GuardedClaim>::finish_claims(&mut *db.conn(), slice, jobs::owner, "w", JobState::Running, JobState::Done, None).unwrap();
            assert_eq!((f.finished.len(), f.lost.len()), (slice.len(), 0));
        }
        assert!(t.elapsed() < Duration::from_secs(10), "rows stayed locked");
    }
}
