//! A server that stops answering without closing the connection: its process frozen with
//! SIGSTOP, so its kernel still acknowledges every byte and neither TCP nor the server's
//! own timeouts end the wait. Each call must come back within the connection's reply
//! timeout with what a lost connection means at that point, on both executors (an r2d2
//! pool of the library's, a bb8 pool made with `manager_config_with_reply_timeout`):
//!
//! - a write outside a transaction: `Ambiguous`, and after the thaw the server is seen to
//!   run the statement it had already received, once;
//! - a read-modify-write whose connection froze: retried on a new connection, applied
//!   once;
//! - a transition whose `COMMIT` got no reply: `Ambiguous`, the transition found applied
//!   once or not at all;
//! - a lock call, on connections whose own reply timeout is long: back within the bound
//!   its lease sets, nothing granted.
//!
//! On PostgreSQL the session's own backend process is frozen; MariaDB runs every session
//! in one process, so the whole server is frozen. That stalls every other test on it, so
//! these tests run only when `OCC_FREEZE_SERVERS` is set, one at a time
//! (`scripts/test.sh` has a step for them); a thread thaws the server whatever happens.
//! Timings are printed; the only time asserted is that the call returned before the
//! server was thawed (without the bound it waits until then).

#![cfg(all(
    target_os = "linux",
    feature = "bb8",
    feature = "locks",
    any(not(feature = "mysql"), feature = "async-mysql")
))]

use crate::common;

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::models::{Order, OrderPatch, OrderState, TrackedOrder};
use common::schema::orders;
use diesel::prelude::*;
use diesel_occ::{Error, PoolConfig, RetryPolicy};

/// The reply timeout of the tests' connections.
const BOUND: Duration = Duration::from_secs(1);

/// When the safety thread thaws a frozen server whatever the test does: a call still
/// waiting then was held past its bound.
const THAW_AFTER: Duration = Duration::from_secs(20);

/// Whether this run may freeze servers.
fn freezing_allowed() -> bool {
    let allowed = std::env::var_os("OCC_FREEZE_SERVERS").is_some();
    if !allowed {
        eprintln!("skipped: set OCC_FREEZE_SERVERS=1 to freeze servers (scripts/test.sh does)");
    }
    allowed
}

/// A process stopped with SIGSTOP until dropped (or [`THAW_AFTER`], or [`Frozen::thaw`]).
struct Frozen {
    pid: i64,
    at: Instant,
    thawed: Arc<AtomicBool>,
}

impl Frozen {
    fn new(pid: i64) -> Frozen {
        signal("STOP", pid);
        let thawed = Arc::new(AtomicBool::new(false));
        let flag = thawed.clone();
        std::thread::spawn(move || {
            std::thread::sleep(THAW_AFTER);
            if !flag.swap(true, Ordering::SeqCst) {
                signal("CONT", pid);
            }
        });
        Frozen {
            pid,
            at: Instant::now(),
            thawed,
        }
    }

    /// Thaws the process from another thread `after` it was frozen.
    fn thaw_later(&self, after: Duration) {
        let (pid, flag, at) = (self.pid, self.thawed.clone(), self.at);
        std::thread::spawn(move || {
            std::thread::sleep(after.saturating_sub(at.elapsed()));
            if !flag.swap(true, Ordering::SeqCst) {
                signal("CONT", pid);
            }
        });
    }

    /// Whether the process is still frozen.
    fn still_frozen(&self) -> bool {
        !self.thawed.load(Ordering::SeqCst)
    }

    fn thaw(&self) {
        if !self.thawed.swap(true, Ordering::SeqCst) {
            signal("CONT", self.pid);
        }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        self.thaw();
    }
}

/// Sends signal `name` to `pid`: as this user, else through `sudo` (the servers'
/// processes are not ours unless we are root).
fn signal(name: &str, pid: i64) {
    let args = [format!("-{name}"), pid.to_string()];
    let sent = |program: &str, first: &[&str]| {
        Command::new(program)
            .args(first)
            .args(&args)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    };
    assert!(
        sent("kill", &[]) || sent("sudo", &["-n", "kill"]),
        "kill -{name} {pid}: run as root, or with sudo"
    );
}

/// Runs `call`, prints how long it took, and checks it came back while the server was
/// still frozen (a call the bound did not end returns only after the thaw), and not long
/// after `bound`: a watchdog that fired many times late would still beat the thaw. The
/// margin is wide (a loaded 2-core machine) and no speed is measured.
fn timed<T>(what: &str, bound: Duration, frozen: &Frozen, call: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let result = call();
    let took = started.elapsed();
    println!("{what}: returned after {took:?} (bound {bound:?})");
    assert!(
        frozen.still_frozen() && took < bound * 2 + Duration::from_secs(3),
        "{what}: held {took:?}, past its bound {bound:?}"
    );
    result
}

for_each_backend! {
    use diesel_async::pooled_connection::bb8;
    use diesel_occ::asynchronous::prelude::*;
    use diesel_occ::{CheckedManager, GuardedModify, GuardedTransition, GuardedWrite};

    type Async_ = <Conn as common::paths::AsyncOf>::Async;

    /// The session's own server process on PostgreSQL (`value`); MariaDB's is the
    /// server's, read from its pid file.
    const PROCESS_SQL: &str = if BACKEND.len() == "postgres".len() {
        "SELECT CAST(pg_backend_pid() AS BIGINT) AS value"
    } else {
        "SELECT CAST(0 AS SIGNED) AS value"
    };

    /// The process serving the session of `conn`: its backend on PostgreSQL, the
    /// server on MariaDB (from its pid file, read as root).
    fn process_blocking(conn: &mut Conn) -> QueryResult<i64> {
        let value = diesel::RunQueryDsl::get_result::<common::Value>(
            diesel::sql_query(PROCESS_SQL),
            conn,
        )?;
        if BACKEND != "mysql" {
            return Ok(value.value);
        }
        let file = diesel::RunQueryDsl::get_result::<PidFile>(diesel::sql_query(PID_FILE_SQL), conn)?;
        Ok(read_pid(&file.value))
    }

    /// [`process_blocking`] on a diesel-async connection.
    async fn process_async(conn: &mut Async_) -> QueryResult<i64> {
        let value = diesel_async::RunQueryDsl::get_result::<common::Value>(
            diesel::sql_query(PROCESS_SQL),
            conn,
        )
        .await?;
        if BACKEND != "mysql" {
            return Ok(value.value);
        }
        let file =
            diesel_async::RunQueryDsl::get_result::<PidFile>(diesel::sql_query(PID_FILE_SQL), conn)
                .await?;
        Ok(read_pid(&file.value))
    }

    const PID_FILE_SQL: &str = "SELECT @@pid_file AS value";

    fn read_pid(path: &str) -> i64 {
        std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("the server's pid file {path}: {e}"))
            .trim()
            .parse()
            .expect("a pid")
    }

    #[derive(QueryableByName)]
    struct PidFile {
        #[diesel(sql_type = diesel::sql_types::Text)]
        value: String,
    }

    /// The executor under test: the blocking API on an r2d2 pool, or the async API on a
    /// bb8 pool, both with the reply timeout [`BOUND`].
    enum Path {
        Blocking(r2d2::Pool<CheckedManager<Conn>>),
        Async(bb8::Pool<Async_>, tokio::runtime::Runtime),
    }

    impl Path {
        /// A pool of at most `max` connections on `db`'s database, each reply waited
        /// for at most `reply`.
        fn new(db: &common::TestDb<Conn>, on_async: bool, max: u32, reply: Duration) -> Path {
            let config = PoolConfig {
                max_size: max,
                min_idle: 1,
                reply_timeout: Some(reply),
                // The checkout's own check would meet the frozen server first.
                check_after_idle: Duration::from_secs(600),
                ..common::pool_config()
            };
            if !on_async {
                return Path::Blocking(db.pool_with(&config));
            }
            let runtime = common::paths::runtime();
            let manager =
                diesel_async::pooled_connection::AsyncDieselConnectionManager::new_with_config(
                    &db.url,
                    diesel_occ::asynchronous::manager_config_with_reply_timeout(reply),
                );
            // bb8's check on checkout is a statement too, which the bound would end
            // first: without it the library's own call meets the frozen server.
            let pool = runtime.block_on(
                bb8::Pool::builder()
                    .max_size(max)
                    .test_on_check_out(false)
                    .build(manager),
            );
            Path::Async(pool.expect("a bb8 pool"), runtime)
        }

        fn name(&self) -> &'static str {
            match self {
                Path::Blocking(_) => "blocking",
                Path::Async(..) => "async",
            }
        }

        /// Freezes the process behind the connection the pool hands out next.
        fn freeze_next(&self) -> Frozen {
            let pid = match self {
                Path::Blocking(pool) => process_blocking(&mut pool.get().unwrap()).unwrap(),
                Path::Async(pool, runtime) => runtime.block_on(async {
                    process_async(&mut pool.get().await.unwrap()).await.unwrap()
                }),
            };
            Frozen::new(pid)
        }

        /// The guarded update of `row` on a pooled connection.
        fn update(&self, row: &Order, patch: OrderPatch) -> Result<i64, Error> {
            match self {
                Path::Blocking(pool) => GuardedWrite::guarded_update(row, &mut *pool.get().unwrap(), patch),
                Path::Async(pool, runtime) => runtime.block_on(async {
                    let mut conn = pool.get().await.unwrap();
                    AsyncGuardedWrite::guarded_update(row, &mut *conn, patch).await
                }),
            }
        }

        /// Adds one to the quantity of row `id` by a read-modify-write on the pool.
        fn add_one(&self, id: i64) -> Result<diesel_occ::Modified<Order, ()>, Error> {
            let policy = RetryPolicy::default();
            match self {
                Path::Blocking(pool) => <Order as GuardedModify>::modify_pooled(
                    pool,
                    &id,
                    &policy,
                    |o| common::paths::add_one_to(o, "+"),
                ),
                Path::Async(pool, runtime) => runtime.block_on(
                    <Order as AsyncGuardedModify>::modify_pooled(pool, &id, &policy, |o| {
                        common::paths::add_one_to(o, "+")
                    }),
                ),
            }
        }

        /// Tries to take lock `name` for `ttl`, and releases it at once: a guard dropped
        /// would be released in the background (on async, a task), on the pool's only
        /// connection, and could meet the frozen server before the call under test.
        fn try_lock(&self, name: &str, ttl: Duration) -> Result<i64, Error> {
            match self {
                Path::Blocking(pool) => {
                    let guard = diesel_occ::Locks::new(pool.clone()).try_lock(name, "main", ttl, None)?;
                    let fence = guard.fence();
                    guard.release().map(|()| fence)
                }
                Path::Async(pool, runtime) => runtime.block_on(async {
                    let locks = diesel_occ::asynchronous::AsyncLocks::new(pool.clone());
                    let guard = locks.try_lock(name, "main", ttl, None).await?;
                    let fence = guard.fence();
                    guard.release().await.map(|()| fence)
                }),
            }
        }

        /// Ships `row`; its hook, the last step before the `COMMIT`, freezes the process
        /// behind the connection, which it returns.
        fn ship_freezing_before_commit(
            &self,
            row: &mut TrackedOrder,
            frozen: &std::sync::Mutex<Option<Frozen>>,
        ) -> Result<i64, Error> {
            match self {
                Path::Blocking(pool) => {
                    let mut conn = pool.get().unwrap();
                    GuardedTransition::transition_then(
                        row,
                        &mut *conn,
                        OrderState::Shipped,
                        diesel_occ::no_extra(),
                        |conn, _, _| {
                            let pid = process_blocking(conn).map_err(Error::Database)?;
                            *frozen.lock().unwrap() = Some(Frozen::new(pid));
                            Ok::<_, Error>(())
                        },
                    )
                }
                Path::Async(pool, runtime) => runtime.block_on(async {
                    let mut conn = pool.get().await.unwrap();
                    AsyncGuardedTransition::transition_then(
                        row,
                        &mut *conn,
                        OrderState::Shipped,
                        diesel_occ::no_extra(),
                        async |conn: &mut Async_, _, _: &TrackedOrder| {
                            let pid = process_async(conn).await.map_err(Error::Database)?;
                            *frozen.lock().unwrap() = Some(Frozen::new(pid));
                            Ok::<_, Error>(())
                        },
                    )
                    .await
                }),
            }
        }
    }

    /// A write outside a transaction, sent to a frozen server: `Ambiguous` within the
    /// bound; the server runs the statement it had received once thawed, once.
    fn write_outside_a_transaction(on_async: bool) {
        if BACKEND == "sqlite" || !freezing_allowed() {
            return;
        }
        let Some(db) = db() else { return };
        let path = Path::new(&db, on_async, 1, BOUND);
        let row = Order::new(1, "frozen");
        diesel::insert_into(orders::table).values(&row).execute(&mut *db.conn()).unwrap();

        // Once first, so that the connection holds the statement prepared: the frozen
        // call then sends the whole write in one message.
        let patch = |note: &str| OrderPatch { note: Some(note.into()), ..Default::default() };
        path.update(&row, patch("warm")).unwrap();
        let row = Order { note: "warm".into(), version: 1, ..row };

        let frozen = path.freeze_next();
        let result = timed(&format!("{BACKEND} {} guarded update", path.name()), BOUND, &frozen, || {
            path.update(&row, patch("sent"))
        });
        assert!(matches!(result, Err(Error::Ambiguous { .. })), "{result:?}");
        let said = result.unwrap_err().to_string();
        println!("{BACKEND} {}: {said}", path.name());
        assert!(said.contains("reply timeout"), "the error names the timeout: {said}");
        frozen.thaw();

        // The frozen session had received the write: thawed, the server runs it (it
        // reads the request before it notices the client left). That is why the answer
        // could only be `Ambiguous`.
        let after = wait_for_version(&db, 1, |version| version == 2);
        assert_eq!((after.note.as_str(), after.version), ("sent", 2));
        println!("{BACKEND} {}: the ambiguous write was applied once after the thaw", path.name());
        // The pool replaced the closed connection.
        assert!(path.update(&after, OrderPatch::default()).is_ok());
    }

    /// A read-modify-write whose pooled connection froze: the attempt is lost before its
    /// commit, retried on a new connection, applied once.
    fn read_modify_write_retried(on_async: bool) {
        if BACKEND == "sqlite" || !freezing_allowed() {
            return;
        }
        let Some(db) = db() else { return };
        let path = Path::new(&db, on_async, 1, BOUND);
        let row = Order::new(2, "");
        diesel::insert_into(orders::table).values(&row).execute(&mut *db.conn()).unwrap();

        let frozen = path.freeze_next();
        if BACKEND == "mysql" {
            // The whole server is frozen: the retry's new connection waits for the thaw.
            frozen.thaw_later(BOUND * 3);
        }
        let started = Instant::now();
        let done = path.add_one(2).expect("retried on a new connection");
        println!(
            "{BACKEND} {}: read-modify-write done in {:?} after {} attempts",
            path.name(),
            started.elapsed(),
            done.attempts
        );
        assert_eq!(done.attempts, 2, "the frozen attempt was cut and retried once");
        frozen.thaw();
        let after = wait_for_version(&db, 2, |version| version >= 1);
        assert_eq!((after.quantity, after.note.as_str(), after.version), (2, "+", 1));
    }

    /// A transition whose `COMMIT` got no reply: `Ambiguous` within the bound; the
    /// transition is then found applied once or not at all.
    fn commit_without_reply(on_async: bool) {
        if BACKEND == "sqlite" || !freezing_allowed() {
            return;
        }
        let Some(db) = db() else { return };
        let path = Path::new(&db, on_async, 1, BOUND);
        diesel::insert_into(orders::table)
            .values(&Order::new(3, ""))
            .execute(&mut *db.conn())
            .unwrap();
        let mut row = orders::table
            .find(3)
            .select(TrackedOrder::as_select())
            .first(&mut *db.conn())
            .unwrap();

        let frozen = std::sync::Mutex::new(None);
        let started = Instant::now();
        let result = path.ship_freezing_before_commit(&mut row, &frozen);
        let took = started.elapsed();
        let frozen = frozen.into_inner().unwrap().expect("the hook froze the server");
        println!("{BACKEND} {} transition: returned after {took:?}", path.name());
        assert!(
            frozen.still_frozen() && took < BOUND * 2 + Duration::from_secs(3),
            "held {took:?}, past the bound {BOUND:?}"
        );
        assert!(matches!(result, Err(Error::Ambiguous { .. })), "{result:?}");
        frozen.thaw();

        let after = wait_for_version(&db, 3, |_| true);
        println!(
            "{BACKEND} {}: the ambiguous commit was {}",
            path.name(),
            if after.version == 1 { "applied" } else { "not applied" }
        );
        let shipped: String = orders::table
            .find(3)
            .select(orders::status)
            .first(&mut *db.conn())
            .unwrap();
        match after.version {
            0 => assert_eq!(shipped, "valid"),
            1 => assert_eq!(shipped, "shipped"),
            other => panic!("applied more than once: version {other}"),
        }
    }

    /// A lock call on a frozen server, on connections whose own reply timeout (30 s) is
    /// longer than the safety thaw: the lock's statements wait no longer than their
    /// lease allows (a third of the TTL, twice over for the server's own bounds, plus a
    /// second), and nothing was granted.
    fn lock_call_bounded_by_its_lease(on_async: bool) {
        if BACKEND == "sqlite" || !freezing_allowed() {
            return;
        }
        let Some(db) = db() else { return };
        let path = Path::new(&db, on_async, 1, PoolConfig::default().reply_timeout.unwrap());
        let ttl = Duration::from_secs(3);
        // Another lock first, so that the frozen call's statements are the lock's own,
        // not a first preparation.
        path.try_lock("warm", ttl).unwrap();

        let frozen = path.freeze_next();
        // The lock's reply limit: twice its wait bound (a third of the TTL) plus a second,
        // at most the TTL.
        let limit = (ttl / 3 * 2 + Duration::from_secs(1)).min(ttl);
        let result = timed(&format!("{BACKEND} {} try_lock (TTL {ttl:?})", path.name()), limit, &frozen, || {
            path.try_lock("frozen", ttl)
        });
        println!("{BACKEND} {}: {result:?}", path.name());
        frozen.thaw();
        let after = path.try_lock("frozen", ttl);
        match result {
            // Lost before its `COMMIT`: nothing was granted, the lock is free at once.
            Err(Error::Retryable { reason: diesel_occ::RetryReason::ConnectionLost, .. }) => {
                assert!(after.expect("the lock is free after the thaw") > 0)
            }
            // The `COMMIT` had been sent: the thawed server may grant it, and the lock is
            // then held until that lease ends.
            Err(Error::Ambiguous { .. }) => {
                println!("{BACKEND} {}: after the thaw: {after:?}", path.name());
                assert!(matches!(after, Ok(_) | Err(Error::LockHeld { .. })), "{after:?}");
            }
            other => panic!("neither a retryable loss nor ambiguous: {other:?}"),
        }
    }

    /// Row `id` once `ready(version)` holds (read on a fresh pool's connection, for a few
    /// seconds: a thawed server finishes what it had received).
    fn wait_for_version(db: &common::TestDb<Conn>, id: i64, ready: impl Fn(i64) -> bool) -> Order {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let row: Order = orders::table
                .find(id)
                .select(Order::as_select())
                .first(&mut *db.conn())
                .unwrap();
            if ready(row.version) || Instant::now() > deadline {
                return row;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    mod blocking {
        #[test]
        fn write_outside_a_transaction() {
            super::write_outside_a_transaction(false)
        }
        #[test]
        fn read_modify_write_retried() {
            super::read_modify_write_retried(false)
        }
        #[test]
        fn commit_without_reply() {
            super::commit_without_reply(false)
        }
        #[test]
        fn lock_call_bounded_by_its_lease() {
            super::lock_call_bounded_by_its_lease(false)
        }
    }

    mod on_async {
        #[test]
        fn write_outside_a_transaction() {
            super::write_outside_a_transaction(true)
        }
        #[test]
        fn read_modify_write_retried() {
            super::read_modify_write_retried(true)
        }
        #[test]
        fn commit_without_reply() {
            super::commit_without_reply(true)
        }
        #[test]
        fn lock_call_bounded_by_its_lease() {
            super::lock_call_bounded_by_its_lease(true)
        }
    }
}
