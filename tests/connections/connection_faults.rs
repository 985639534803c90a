//! Server sessions killed at random (PostgreSQL `pg_terminate_backend`, MariaDB `KILL`)
//! while workers run read-merge-writes (on one connection and through the pool),
//! one-statement merges, transitions with history hooks and lock acquisitions, renewals
//! and releases. Every operation logs what it
//! reported; the end state is checked against the log: every operation that said it was
//! done is applied exactly once, every one that failed is not applied at all, and every
//! `Ambiguous` one is found applied once or not at all (never twice: nothing retried it
//! blindly). The pool replaces the killed connections by itself.
//!
//! The workload and its checks are one body, run on both executors: the blocking API on
//! an r2d2 pool, and the async API (diesel-async) on a bb8 pool, each pool registering
//! the server sessions it opens so that the killer ends only those.
//!
//! SQLite has no server sessions to kill; a process that dies mid-write is covered by
//! `tests/killed_writer.rs`. `scripts/faults.sh` runs the same workload from several
//! processes, with a restart of the server halfway through (`fault_soak` below, which
//! does nothing unless `OCC_SOAK_SECONDS` is set).

// Locks and leases need the `chrono` feature; the async path, diesel-async's bb8 pools.
#![cfg(all(
    feature = "locks",
    feature = "bb8",
    any(not(feature = "mysql"), feature = "async-mysql")
))]

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::faults::{self, Kind, Op, Outcome, Sessions, Tally};
use common::lock_paths::{AsyncLocksOn, BlockingLocks, LockPath};
use common::HistoryRow;
use common::{KillOnDrop, PoolByUrl};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::Pool;
use diesel_occ::asynchronous::{AsyncConnectionSource, AsyncGuardedJson};
use diesel_occ::asynchronous::{AsyncGuardedModify, AsyncGuardedTransition};
use diesel_occ::GuardedJson;
use diesel_occ::GuardedJsonMerge;
use diesel_occ::Locks;
use diesel_occ::{no_extra, record, GuardedTransition, HistoryEntry};
use diesel_occ::{CheckedManager, Error, GuardedModify, RetryPolicy, Status};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

/// A task's two states, each reachable from the other: every transition can run forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Status)]
#[occ(storage = "text")]
pub enum Shift {
    #[occ(from(Busy))]
    Idle,
    #[occ(from(Idle))]
    Busy,
}

/// Rows per table the workers share: few, so that they also conflict with each other.
const ROWS: i64 = 3;
/// The lease of the shared lock: short, so that a holder lost to a fault frees it soon.
const LEASE: Duration = Duration::from_secs(1);
/// The shared lock's row, as [`LockRow`].
const SHARED_LOCK_ROW: &str =
    "SELECT label, fence, holder_changes FROM occ_locks WHERE lock_name = 'faults' AND resource = 'main'";

#[derive(QueryableByName)]
struct SessionId {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    value: i64,
}

#[derive(QueryableByName)]
struct Ended {
    #[diesel(sql_type = diesel::sql_types::Bool)]
    ended: bool,
}

#[derive(QueryableByName)]
struct LockRow {
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    label: Option<String>,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    fence: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    holder_changes: i64,
}

/// What the workers found wrong, to be printed all at once.
#[derive(Debug, Default)]
struct Anomalies(Vec<String>);

impl Anomalies {
    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.0.push(what());
        }
    }
}

/// The `landed` of an ambiguous operation found (`true`) or not found in the end state;
/// a done operation must be found, a failed one must not.
fn judge(op: &mut Op, found: bool, anomalies: &mut Anomalies) {
    match op.outcome {
        Outcome::Done => {
            anomalies.check(found, || format!("lost: {} said done, not applied", op.id))
        }
        Outcome::Failed(ref class) => anomalies.check(!found, || {
            format!("applied although failed ({class}): {}", op.id)
        }),
        Outcome::Ambiguous => op.landed = Some(found),
    }
}

for_each_backend! {
    json_profiles!();

    diesel::table! {
        fault_tasks (id) {
            id -> BigInt,
            state -> Text,
            version -> BigInt,
        }
    }

    #[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, diesel_occ::Guarded)]
    #[diesel(table_name = fault_tasks)]
    pub struct Task {
        id: i64,
        #[occ(status)]
        state: Shift,
        #[occ(version)]
        version: i64,
    }

    type Manager = CheckedManager<Conn>;

    async_pools!();

    /// The query of the server's id of the session it runs on.
    fn session_id_query() -> diesel::query_builder::SqlQuery {
        diesel::sql_query(match BACKEND {
            "postgres" => "SELECT CAST(pg_backend_pid() AS BIGINT) AS value",
            _ => "SELECT CAST(CONNECTION_ID() AS SIGNED) AS value",
        })
    }

    /// This server's id of the session `conn` is.
    fn session_id(conn: &mut Conn) -> QueryResult<i64> {
        session_id_query().get_result::<SessionId>(conn).map(|row| row.value)
    }

    /// The operations of the workload, on one executor: [`work`] and the tests run
    /// unchanged on both.
    trait FaultPath: Send + Sync + Sized + 'static {
        /// Which executor, for messages.
        const PATH: &'static str;
        type Locks: LockPath;
        /// The executor on a pool of `size` connections to `url`, and the sessions the
        /// pool opens (registered as it opens them).
        fn open(url: &str, size: u32) -> (Self, Sessions);
        fn locks(&self) -> &Self::Locks;
        /// `merge_json` of `patch` into profile `target`, on a pooled connection.
        fn merge(&self, target: i64, patch: &Value, policy: &RetryPolicy) -> Result<(), Error>;
        /// `modify_pooled` setting key `key` of profile `target` to `value`.
        fn modify(&self, target: i64, key: &str, value: usize, policy: &RetryPolicy) -> Result<(), Error>;
        /// `merge_json_in_place` of `patch` into profile `target`, on a pooled connection.
        fn merge_in_place(&self, target: i64, patch: &Value) -> Result<(), Error>;
        /// Reads task `target` and moves it to its other state, recording the move
        /// (actor `actor`) in the history from the transition's hook.
        fn transition(&self, target: i64, actor: &str) -> Result<(), Error>;
        /// Checks `size` connections out of the pool at once and asks each for its session.
        fn every_connection_answers(&self, size: u32);
    }

    /// The blocking API on an r2d2 pool built as diesel-occ builds its pools.
    struct BlockingFaults {
        pool: Pool<Manager>,
        locks: BlockingLocks<Pool<Manager>>,
    }

    impl FaultPath for BlockingFaults {
        const PATH: &'static str = "blocking";
        type Locks = BlockingLocks<Pool<Manager>>;

        fn open(url: &str, size: u32) -> (Self, Sessions) {
            let (pool, sessions) = faults::pool_with_sessions::<Conn>(url, size, session_id);
            let locks = BlockingLocks(Locks::new(pool.clone()));
            (BlockingFaults { pool, locks }, sessions)
        }
        fn locks(&self) -> &Self::Locks {
            &self.locks
        }
        fn merge(&self, target: i64, patch: &Value, policy: &RetryPolicy) -> Result<(), Error> {
            let mut conn = self.pool.get()?;
            <Profile as GuardedJson>::merge_json(&mut conn, &target, profiles::ext, patch, policy).map(drop)
        }
        fn modify(&self, target: i64, key: &str, value: usize, policy: &RetryPolicy) -> Result<(), Error> {
            let modified = <Profile as GuardedModify>::modify_pooled(&self.pool, &target, policy, |profile| {
                profile.ext[key] = json!(value);
                Ok::<_, Error>(())
            });
            modified.map(drop)
        }
        fn merge_in_place(&self, target: i64, patch: &Value) -> Result<(), Error> {
            let mut conn = self.pool.get()?;
            <Profile as GuardedJsonMerge>::merge_json_in_place(&mut conn, &target, profiles::ext, patch).map(drop)
        }
        fn transition(&self, target: i64, actor: &str) -> Result<(), Error> {
            let mut conn = self.pool.get()?;
            let mut task: Task = fault_tasks::table.find(target).select(Task::as_select()).first(&mut conn)?;
            let key = target.to_string();
            let to = other(task.state);
            let moved = GuardedTransition::transition_then(&mut task, &mut conn, to, no_extra(), |conn, from, row| {
                record(conn, &history_entry(&key, from, row, actor))
            });
            moved.map(drop)
        }
        fn every_connection_answers(&self, size: u32) {
            let all: Vec<_> = (0..size).map(|_| self.pool.get().expect("a working connection")).collect();
            for mut conn in all {
                session_id(&mut conn).expect("a live session");
            }
        }
    }

    type AsyncPool = diesel_async::pooled_connection::bb8::Pool<Async_>;

    /// The async API on a bb8 pool of diesel-async connections, driven from the calling
    /// thread (each worker thread blocks on its own operation, as a request task would
    /// await it).
    struct AsyncFaults {
        pool: AsyncPool,
        locks: AsyncLocksOn<AsyncPool>,
        runtime: tokio::runtime::Runtime,
    }

    impl FaultPath for AsyncFaults {
        const PATH: &'static str = "async";
        type Locks = AsyncLocksOn<AsyncPool>;

        fn open(url: &str, size: u32) -> (Self, Sessions) {
            let sessions = Sessions::default();
            let registered = sessions.clone();
            let mut config = diesel_async::pooled_connection::ManagerConfig::default();
            config.custom_setup = Box::new(move |url| {
                let registered = registered.clone();
                Box::pin(async move {
                    let mut conn = <Async_ as diesel_async::AsyncConnection>::establish(url).await?;
                    let id = diesel_async::RunQueryDsl::get_result::<SessionId>(session_id_query(), &mut conn)
                        .await
                        .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
                    registered.0.lock().unwrap().push(id.value);
                    Ok(conn)
                })
            });
            let manager = diesel_async::pooled_connection::AsyncDieselConnectionManager::new_with_config(url, config);
            let runtime = common::paths::runtime();
            let pool = runtime.block_on(
                AsyncPool::builder()
                    .max_size(size)
                    .min_idle(Some(1))
                    .connection_timeout(std::time::Duration::from_secs(20))
                    .build(manager),
            );
            let pool = pool.expect("a bb8 pool with registered sessions");
            let locks = AsyncLocksOn { locks: diesel_occ::asynchronous::AsyncLocks::new(pool.clone()), runtime: runtime.handle().clone() };
            (AsyncFaults { pool, locks, runtime }, sessions)
        }
        fn locks(&self) -> &Self::Locks {
            &self.locks
        }
        fn merge(&self, target: i64, patch: &Value, policy: &RetryPolicy) -> Result<(), Error> {
            self.runtime.block_on(async {
                let mut conn = self.pool.checkout().await?;
                let merged = <Profile as AsyncGuardedJson>::merge_json(&mut *conn, &target, profiles::ext, patch, policy);
                merged.await.map(drop)
            })
        }
        fn modify(&self, target: i64, key: &str, value: usize, policy: &RetryPolicy) -> Result<(), Error> {
            // Owned: SQLite's async connection runs the change on its own thread.
            let key = key.to_string();
            let modified = <Profile as AsyncGuardedModify>::modify_pooled(&self.pool, &target, policy, move |profile: &mut Profile| {
                profile.ext[&key] = json!(value);
                Ok::<_, Error>(())
            });
            self.runtime.block_on(modified).map(drop)
        }
        fn merge_in_place(&self, target: i64, patch: &Value) -> Result<(), Error> {
            self.runtime.block_on(async {
                let mut conn = self.pool.checkout().await?;
                let merged = <Profile as AsyncGuardedJson>::merge_json_in_place(&mut *conn, &target, profiles::ext, patch);
                merged.await.map(drop)
            })
        }
        fn transition(&self, target: i64, actor: &str) -> Result<(), Error> {
            self.runtime.block_on(async {
                let mut conn = self.pool.checkout().await?;
                let read = fault_tasks::table.find(target).select(Task::as_select());
                let mut task: Task = diesel_async::RunQueryDsl::first(read, &mut *conn).await?;
                let (key, to) = (target.to_string(), other(task.state));
                let moved = AsyncGuardedTransition::transition_then(
                    &mut task,
                    &mut *conn,
                    to,
                    no_extra(),
                    async |conn: &mut Async_, from, row: &Task| {
                        diesel_occ::asynchronous::record(conn, &history_entry(&key, from, row, actor)).await
                    },
                );
                moved.await.map(drop)
            })
        }
        fn every_connection_answers(&self, size: u32) {
            self.runtime.block_on(async {
                let mut all = Vec::new();
                for _ in 0..size {
                    all.push(self.pool.checkout().await.expect("a working connection"));
                }
                for conn in &mut all {
                    diesel_async::RunQueryDsl::get_result::<SessionId>(session_id_query(), &mut **conn)
                        .await
                        .expect("a live session");
                }
            });
        }
    }

    /// The state a task moves to from `state`.
    fn other(state: Shift) -> Shift {
        if state == Shift::Idle { Shift::Busy } else { Shift::Idle }
    }

    /// The history entry of a task's move by `actor`.
    fn history_entry<'a>(key: &'a str, from: Shift, row: &Task, actor: &'a str) -> HistoryEntry<'a> {
        HistoryEntry { entity: "fault_tasks", key, from: from.name(), to: row.state.name(), actor: Some(actor) }
    }

    /// Ends session `id` from `admin`; whether it was still there to end.
    fn kill_session(admin: &mut diesel_occ::Pooled<Conn>, id: i64) -> bool {
        match BACKEND {
            "postgres" => diesel::sql_query(format!("SELECT pg_terminate_backend({id}) AS ended"))
                .get_result::<Ended>(admin)
                .is_ok_and(|row| row.ended),
            _ => admin.batch_execute(&format!("KILL {id}")).is_ok(),
        }
    }

    /// The shared rows at their start: empty documents, idle tasks.
    fn set_up(conn: &mut Conn) {
        conn.batch_execute(
            "CREATE TABLE fault_tasks (id BIGINT PRIMARY KEY, state VARCHAR(16) NOT NULL, version BIGINT NOT NULL)",
        )
        .unwrap();
        for id in 1..=ROWS {
            let profile = Profile { id, name: format!("p{id}"), ext: json!({}), version: 0 };
            diesel::insert_into(profiles::table).values(&profile).execute(conn).unwrap();
            let task = Task { id, state: Shift::Idle, version: 0 };
            diesel::insert_into(fault_tasks::table).values(&task).execute(conn).unwrap();
        }
    }

    /// Runs `count` operations (or until `until`) on `path`, cycling through the kinds, on
    /// random rows; `name` makes the operation ids unique. `reader` (a pool nobody kills)
    /// reads the lock row after an ambiguous acquisition.
    fn work<P: FaultPath>(path: &P, reader: &Pool<Manager>, name: &str, count: usize, until: Option<Instant>) -> Vec<Op> {
        let locks = path.locks();
        let policy = RetryPolicy::default();
        let mut log = Vec::new();
        for i in 0..count {
            if until.is_some_and(|end| Instant::now() >= end) {
                break;
            }
            let id = format!("{name}-{i}");
            let target = fastrand::i64(1..=ROWS);
            let kind = [Kind::Merge, Kind::ModifyPooled, Kind::MergeInPlace, Kind::Transition, Kind::Acquire][i % 5];
            let op = |kind, outcome| Op { id: id.clone(), kind, target, outcome, fence: None, landed: None, at_ms: faults::now_ms() };
            let patch = json!({ &id: i });
            match kind {
                Kind::Merge => log.push(op(kind, Outcome::of(&path.merge(target, &patch, &policy)))),
                Kind::ModifyPooled => log.push(op(kind, Outcome::of(&path.modify(target, &id, i, &policy)))),
                Kind::MergeInPlace => log.push(op(kind, Outcome::of(&path.merge_in_place(target, &patch)))),
                Kind::Transition => log.push(op(kind, Outcome::of(&path.transition(target, &id)))),
                _ => {
                    let asked = Instant::now();
                    let acquired = locks.try_lock("faults", LEASE, &id);
                    let mut acquisition = op(Kind::Acquire, Outcome::of(&acquired));
                    match acquired {
                        Ok(mut guard) => {
                            acquisition.fence = Some(P::Locks::fence(&guard));
                            log.push(acquisition);
                            for _ in 0..2 {
                                log.push(op(Kind::Renew, Outcome::of(&locks.renew(&mut guard))));
                            }
                            log.push(op(Kind::Release, Outcome::of(&locks.release(guard))));
                        }
                        Err(Error::Ambiguous { .. }) => {
                            // Read before deciding, as the error says: the label is this
                            // acquisition's own. Its lease, if it landed, keeps the label in
                            // place for LEASE from `asked`; a read after that (a slow server,
                            // a restart) cannot tell, and the op stays unresolved.
                            let label = lock_row(reader).map(|row| row.label.as_deref() == Some(id.as_str()));
                            acquisition.landed = match label {
                                Some(true) => Some(true),
                                Some(false) if asked.elapsed() < LEASE / 2 => Some(false),
                                _ => None,
                            };
                            log.push(acquisition);
                        }
                        Err(_) => log.push(acquisition),
                    }
                }
            }
        }
        log
    }

    /// The shared lock's row, read with a few tries (a restart of the server may be
    /// under way). The read locks the row, so that it waits for a transaction still
    /// ending on it: MariaDB's `KILL` closes the socket at once, and the killed session's
    /// `COMMIT` can land after its client was told the connection was lost.
    fn lock_row(pool: &Pool<Manager>) -> Option<LockRow> {
        let locking = if BACKEND == "sqlite" { "" } else { " FOR UPDATE" };
        (0..20).find_map(|_| {
            let mut conn = pool.get().ok()?;
            diesel::sql_query(format!("{SHARED_LOCK_ROW}{locking}"))
                .get_result::<LockRow>(&mut conn)
                .ok()
        })
    }

    /// Checks the end state against every worker's log (updated: the ambiguous
    /// operations learn whether they landed); the anomalies found.
    fn check(conn: &mut Conn, ops: &mut [Op]) -> Anomalies {
        let mut anomalies = Anomalies::default();

        // Documents: each landed merge added its own key and moved the version by one.
        for id in 1..=ROWS {
            let profile: Profile = profiles::table.find(id).select(Profile::as_select()).first(conn).unwrap();
            let keys: BTreeSet<String> = profile.ext.as_object().unwrap().keys().cloned().collect();
            let mut mine = BTreeSet::new();
            for op in ops.iter_mut().filter(|op| op.target == id && matches!(op.kind, Kind::Merge | Kind::ModifyPooled | Kind::MergeInPlace)) {
                judge(op, keys.contains(&op.id), &mut anomalies);
                mine.insert(op.id.clone());
            }
            anomalies.check(keys.is_subset(&mine), || format!("profile {id} holds keys no operation wrote: {:?}", keys.difference(&mine).collect::<Vec<_>>()));
            anomalies.check(profile.version == keys.len() as i64, || {
                format!("profile {id}: version {} after {} merges (doubled or lost)", profile.version, keys.len())
            });
        }

        // A pooled read-modify-write runs an attempt whose connection died before its
        // COMMIT again on another connection: a lost connection never reaches its caller
        // as a plain database error.
        for op in ops.iter().filter(|op| op.kind == Kind::ModifyPooled) {
            if let Outcome::Failed(class) = &op.outcome {
                anomalies.check(!class.starts_with("database"), || format!("modify_pooled {} gave up on: {class}", op.id));
            }
        }

        // Transitions: one history row per landed move, in a chain, at the row's version.
        let history: Vec<HistoryRow> = diesel::sql_query(
            "SELECT entity_key, from_status, to_status, actor FROM occ_transitions WHERE entity = 'fault_tasks' ORDER BY id",
        )
        .load(conn)
        .unwrap();
        let mut actors: BTreeMap<&str, usize> = BTreeMap::new();
        for row in &history {
            *actors.entry(row.actor.as_deref().unwrap_or_default()).or_default() += 1;
        }
        for (actor, times) in &actors {
            anomalies.check(*times == 1, || format!("transition {actor} recorded {times} times"));
        }
        for op in ops.iter_mut().filter(|op| op.kind == Kind::Transition) {
            judge(op, actors.contains_key(op.id.as_str()), &mut anomalies);
        }
        for id in 1..=ROWS {
            let task: Task = fault_tasks::table.find(id).select(Task::as_select()).first(conn).unwrap();
            let moves: Vec<&HistoryRow> = history.iter().filter(|row| row.entity_key == id.to_string()).collect();
            let mut state = Shift::Idle.name();
            for row in &moves {
                anomalies.check(row.from_status == state, || format!("task {id}: history jumps from {state} to a move from {}", row.from_status));
                state = &row.to_status;
            }
            anomalies.check(task.state.name() == state, || format!("task {id} is {:?}, its history ends at {state}", task.state));
            anomalies.check(task.version == moves.len() as i64, || {
                format!("task {id}: version {} after {} recorded moves", task.version, moves.len())
            });
        }

        // The lock: each landed acquisition counted once in `holder_changes` (it commits
        // with the grant); fences distinct and none above the lock's. Fences come from a
        // sequence, which a killed session's rolled-back grant still advanced: gaps, never
        // repeats.
        let (fence, changes) = diesel::sql_query(SHARED_LOCK_ROW)
            .get_result::<LockRow>(conn)
            .map(|row| (row.fence, row.holder_changes))
            .unwrap_or((0, 0));
        let acquisitions: Vec<&Op> = ops.iter().filter(|op| op.kind == Kind::Acquire).collect();
        let fences: BTreeSet<i64> = acquisitions.iter().filter_map(|op| op.fence).collect();
        let done = acquisitions.iter().filter(|op| op.outcome == Outcome::Done).count();
        let landed = acquisitions.iter().filter(|op| op.landed == Some(true)).count();
        let unresolved = acquisitions.iter().filter(|op| op.outcome == Outcome::Ambiguous && op.landed.is_none()).count();
        // A grant that came back after the holder's local deadline (a reply delayed by a
        // kill or the restart) is `LockLost` and released: it landed, but was not used.
        let late = acquisitions.iter().filter(|op| op.outcome == Outcome::Failed("lock lost".into())).count();
        anomalies.check(fences.len() == done, || format!("{done} acquisitions got only {} distinct fences", fences.len()));
        anomalies.check(fences.last().is_none_or(|last| *last <= fence), || format!("a fence above the lock's {fence}"));
        anomalies.check(changes <= fence, || format!("{changes} holder changes but the fence is only {fence}"));
        // Exact when every ambiguous acquisition was resolved (the usual case).
        let found = (changes - done as i64) as usize;
        anomalies.check(landed <= found && found <= landed + unresolved + late, || {
            format!(
                "the lock changed holder {changes} times after {done} acquisitions done, {landed} ambiguous ones \
                 that landed ({unresolved} unresolved) and {late} granted too late to use"
            )
        });
        anomalies
    }

    /// Prints the figures of a run on `path` and fails on any anomaly.
    fn report(path: &str, ops: &[Op], kills: u64, took: Duration, anomalies: &Anomalies) {
        let mut tally = Tally::default();
        tally.add(ops);
        println!(
            "{BACKEND} ({path}): {} operations in {:.1} s ({:.0}/s), {kills} sessions killed, {} anomalies\n{}",
            ops.len(),
            took.as_secs_f64(),
            ops.len() as f64 / took.as_secs_f64(),
            anomalies.0.len(),
            tally.report()
        );
        assert!(anomalies.0.is_empty(), "{BACKEND} ({path}): {:#?}", anomalies.0);
    }

    /// Three workers on a pool of four connections whose sessions are killed every 5-30 ms.
    fn sessions_killed_at_random<P: FaultPath>() {
        if BACKEND == "sqlite" {
            return; // no server sessions; see the module documentation
        }
        let Some(db) = db() else { return };
        set_up(&mut db.conn());
        let (path, sessions) = P::open(&db.url, 4);
        let path = std::sync::Arc::new(path);
        let mut admin = db.conn();
        let killer = faults::Killer::start(sessions, 5..30, move |id| kill_session(&mut admin, id));

        let started = Instant::now();
        let (done, finished) = std::sync::mpsc::channel();
        for worker in 0..3 {
            let (path, reader, done) = (path.clone(), db.pool.clone(), done.clone());
            std::thread::spawn(move || done.send(work(&*path, &reader, &format!("w{worker}"), 600, None)));
        }
        let mut ops = Vec::new();
        for _ in 0..3 {
            // No worker may hang on a dead connection.
            ops.extend(finished.recv_timeout(Duration::from_secs(120)).expect("a worker is stuck"));
        }
        let took = started.elapsed();
        let kills = killer.stop();

        let anomalies = check(&mut db.conn(), &mut ops);
        report(P::PATH, &ops, kills, took, &anomalies);
        assert!(kills >= 10, "too few faults to mean anything: {kills}");
        for kind in [Kind::Merge, Kind::ModifyPooled, Kind::MergeInPlace, Kind::Transition, Kind::Acquire] {
            assert!(ops.iter().any(|op| op.kind == kind && op.outcome == Outcome::Done), "no {kind:?} succeeded on {}", P::PATH);
        }
        // The pool recovered: once its connections have been idle for longer than the
        // window after which a checkout checks them, it hands out only live ones, all at once.
        std::thread::sleep(diesel_occ::PoolConfig::default().check_after_idle * 2);
        path.every_connection_answers(4);
    }

    /// A release whose connection was killed while idle: the blocking pool hands the dead
    /// connection out (it was idle for less than its check window), the release fails (a
    /// retryable loss, or ambiguous if it was the `COMMIT`) and the guard's drop releases again on a new
    /// connection; bb8 tests the connection on checkout and replaces it, and the release
    /// succeeds. Either way the lock is free at once, not when its hour-long lease ends.
    fn a_release_that_loses_its_connection_frees_the_lock<P: FaultPath>() {
        if BACKEND == "sqlite" {
            return;
        }
        let Some(db) = db() else { return };
        let (path, sessions) = P::open(&db.url, 1);
        let locks = path.locks();
        let guard = locks.try_lock("release", Duration::from_secs(3600), "first").unwrap();
        // The pool's one connection, which the release will get, is killed while idle.
        let victim = *sessions.0.lock().unwrap().last().unwrap();
        assert!(kill_session(&mut db.conn(), victim));

        match locks.release(guard) {
            Ok(()) => assert_eq!(P::PATH, "async", "the blocking pool checked a connection idle for a moment"),
            // Lost before its `COMMIT` (nothing written, another connection may retry it),
            // or at it.
            Err(Error::Ambiguous { .. } | Error::Retryable { reason: diesel_occ::RetryReason::ConnectionLost, .. }) => {}
            Err(other) => panic!("{}: {other:?}", P::PATH),
        }
        let policy = RetryPolicy::default();
        let successor = locks.lock("release", Duration::from_secs(60), "second", Duration::from_secs(10), &policy);
        assert!(successor.is_ok(), "{}: the lock is still held: {:?}", P::PATH, successor.err());
    }

    mod blocking {
        use super::*;

        #[test]
        fn sessions_killed_at_random_lose_nothing_and_apply_nothing_twice() {
            sessions_killed_at_random::<BlockingFaults>();
        }

        #[test]
        fn a_release_that_loses_its_connection_frees_the_lock() {
            super::a_release_that_loses_its_connection_frees_the_lock::<BlockingFaults>();
        }
    }

    mod on_async {
        use super::*;

        #[test]
        fn sessions_killed_at_random_lose_nothing_and_apply_nothing_twice() {
            sessions_killed_at_random::<AsyncFaults>();
        }

        #[test]
        fn a_release_that_loses_its_connection_frees_the_lock() {
            super::a_release_that_loses_its_connection_frees_the_lock::<AsyncFaults>();
        }
    }

    /// A process of the soak: runs the workload on two threads on `path` until
    /// `OCC_FAULT_SECONDS` are over, killing its own sessions at random, then prints its
    /// operation log (`OP <json>` lines) and how many sessions it killed.
    fn soak_worker<P: FaultPath>(url: &str, seconds: u64, name: &str) {
        let (path, sessions) = P::open(url, 3);
        let path = std::sync::Arc::new(path);
        // The killer's own connections, not registered: it never kills itself.
        let admin = <Conn as PoolByUrl>::pool(url);
        let reader = admin.clone();
        let killer = faults::Killer::start(sessions, 20..80, move |id| {
            admin.get().is_ok_and(|mut conn| kill_session(&mut conn, id))
        });
        let until = Instant::now() + Duration::from_secs(seconds);
        let threads: Vec<_> = (0..2)
            .map(|t| {
                let (path, reader, name) = (path.clone(), reader.clone(), format!("{name}t{t}"));
                std::thread::spawn(move || work(&*path, &reader, &name, usize::MAX, Some(until)))
            })
            .collect();
        let ops: Vec<Op> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        let kills = killer.stop();
        let mut out = std::io::stdout().lock();
        for op in &ops {
            writeln!(out, "OP {}", serde_json::to_string(op).unwrap()).unwrap();
        }
        writeln!(out, "KILLS {kills}").unwrap();
    }

    /// The soak's worker process (run by [`fault_soak`]), on the executor that
    /// `OCC_FAULT_PATH` names.
    #[test]
    fn fault_worker() {
        let Ok(url) = std::env::var(format!("OCC_FAULT_WORKER_{BACKEND}")) else { return };
        let seconds: u64 = std::env::var("OCC_FAULT_SECONDS").unwrap().parse().unwrap();
        let name = std::env::var("OCC_FAULT_NAME").unwrap();
        match std::env::var("OCC_FAULT_PATH").as_deref() {
            Ok("async") => soak_worker::<AsyncFaults>(&url, seconds, &name),
            _ => soak_worker::<BlockingFaults>(&url, seconds, &name),
        }
    }

    /// With the soak's restarts (`scripts/faults.sh`): a lock's fence keeps rising across
    /// a server restart, even when the lock row is deleted after it.
    #[test]
    fn fault_soak_fences_rise_across_a_restart() {
        let Ok(command) = std::env::var(format!("OCC_SOAK_RESTART_{}", BACKEND.to_uppercase())) else { return };
        let Some(db) = db() else { return };
        let take = || {
            let locks = diesel_occ::Locks::new(db.pool.clone());
            let policy = diesel_occ::RetryPolicy::default();
            let guard = locks.lock("restarted", "main", Duration::from_secs(30), None, Duration::from_secs(60), &policy).unwrap();
            let fence = guard.fence();
            guard.release().unwrap();
            fence
        };
        let before = [take(), take()];
        let status = Command::new("sh").args(["-c", &command]).status().unwrap();
        assert!(status.success(), "the restart command failed: {command}");
        // The pool's connections died with the server; a new pool checks out fresh ones.
        let fresh = diesel_occ::Locks::new(db.pool_with(&common::pool_config()));
        let after_restart = fresh.lock("restarted", "main", Duration::from_secs(30), None, Duration::from_secs(60), &diesel_occ::RetryPolicy::default()).unwrap();
        let restarted = after_restart.fence();
        after_restart.release().unwrap();
        diesel::delete(diesel_occ::occ_locks::table).execute(&mut db.pool_with(&common::pool_config()).get().unwrap()).unwrap();
        let purged = fresh.try_lock("restarted", "main", Duration::from_secs(30), None).unwrap().fence();
        println!("{BACKEND}: fences {before:?}, after the restart {restarted}, after the row was deleted {purged}");
        assert!(before[0] < before[1] && before[1] < restarted && restarted < purged);
    }

    /// The soak (`scripts/faults.sh`): `OCC_SOAK_PROCESSES` worker processes (every other
    /// one on the async executor) for `OCC_SOAK_SECONDS` on one database, the server restarted halfway through by the
    /// shell command in `OCC_SOAK_RESTART_<BACKEND>`. Every process must finish (none
    /// stuck), succeed again after the restart, and the end state must match every log.
    #[test]
    fn fault_soak() {
        let Ok(seconds) = std::env::var("OCC_SOAK_SECONDS") else { return };
        if BACKEND == "sqlite" {
            return;
        }
        let seconds: u64 = seconds.parse().expect("OCC_SOAK_SECONDS: whole seconds");
        let processes: usize = std::env::var("OCC_SOAK_PROCESSES").map_or(3, |n| n.parse().expect("OCC_SOAK_PROCESSES: a count"));
        let restart = std::env::var(format!("OCC_SOAK_RESTART_{}", BACKEND.to_uppercase())).ok();
        let Some(db) = db() else { return };
        set_up(&mut db.conn());

        let started = Instant::now();
        let children: Vec<_> = (0..processes)
            .map(|p| {
                let mut child = KillOnDrop(
                    Command::new(std::env::current_exe().unwrap())
                        .args([&common::test_name(module_path!(), "fault_worker"), "--exact", "--nocapture", "--test-threads=1"])
                        .env(format!("OCC_FAULT_WORKER_{BACKEND}"), &db.url)
                        .env("OCC_FAULT_SECONDS", seconds.to_string())
                        .env("OCC_FAULT_NAME", format!("p{p}"))
                        // Every other process runs the async executor.
                        .env("OCC_FAULT_PATH", if p % 2 == 1 { "async" } else { "blocking" })
                        .stdout(Stdio::piped())
                        .spawn()
                        .unwrap(),
                );
                let stdout = child.0.stdout.take().unwrap();
                let log = std::thread::spawn(move || {
                    let (mut ops, mut kills) = (Vec::new(), 0);
                    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                        // The harness's "test ... " may precede the first line.
                        if let Some(at) = line.find("OP {") {
                            ops.push(serde_json::from_str::<Op>(&line[at + 3..]).unwrap());
                        } else if let Some(n) = line.strip_prefix("KILLS ") {
                            kills = n.trim().parse::<u64>().unwrap();
                        }
                    }
                    (ops, kills)
                });
                (child, log)
            })
            .collect();

        let mut back_at = None;
        if let Some(command) = &restart {
            std::thread::sleep(Duration::from_secs(seconds / 2));
            let status = Command::new("sh").args(["-c", command]).status().unwrap();
            assert!(status.success(), "the restart command failed: {command}");
            back_at = Some(faults::now_ms());
        }

        let deadline = started + Duration::from_secs(seconds + 90);
        let (mut ops, mut kills) = (Vec::new(), 0);
        for (p, (mut child, log)) in children.into_iter().enumerate() {
            while child.0.try_wait().unwrap().is_none() {
                assert!(Instant::now() < deadline, "worker process p{p} is stuck");
                std::thread::sleep(Duration::from_millis(100));
            }
            assert!(child.0.wait().unwrap().success(), "worker process p{p} failed");
            let (process_ops, process_kills) = log.join().unwrap();
            if let Some(back_at) = back_at {
                assert!(
                    process_ops.iter().any(|op| op.at_ms > back_at && op.outcome == Outcome::Done),
                    "p{p} did not succeed again after the restart"
                );
            }
            ops.extend(process_ops);
            kills += process_kills;
        }
        let took = started.elapsed();
        let anomalies = check(&mut db.conn(), &mut ops);
        println!("{BACKEND}: {processes} processes, {} server restart(s)", u8::from(back_at.is_some()));
        report("both executors", &ops, kills, took, &anomalies);
    }
}
