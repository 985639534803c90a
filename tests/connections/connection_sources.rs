//! Pools of every kind the library takes: `with_connection` from async code, an exhausted
//! pool (`Error::Pool` with the pool's own error as its source, nothing written), and a
//! deadpool-diesel pool used outside its runtime. The lock, lease, election and
//! read-modify-write bodies run on both kinds of pool in their own test files.

#![cfg(all(feature = "locks", feature = "deadpool"))]

use crate::common;

use common::models::Order;
use common::schema::orders;

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_occ::{
    with_connection, ConnectionSource, Error, GuardedModify, GuardedWrite, Locks, RetryPolicy, Stop,
};

/// Retries until the end state is reached: these tests count lost writes, not latency.
fn patient() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(10_000)
        .max_elapsed(Duration::from_secs(300))
        .first_delay(Duration::from_millis(1))
        .max_delay(Duration::from_millis(20))
}

/// A server's id of one session.
#[derive(QueryableByName)]
struct SessionId {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    value: i64,
}

for_each_backend! {
    use common::deadpool::Deadpooled;

    fn setup() -> Option<common::TestDb<Conn>> {
        let db = db()?;
        diesel::insert_into(orders::table).values(Order::new(1, "new")).execute(&mut db.conn()).unwrap();
        Some(db)
    }

    /// From async code: the work runs on a blocking thread with a pooled connection, and
    /// what it wrote is in the database.
    #[test]
    fn with_connection_serves_async_code_from_either_pool() {
        let runtime = common::deadpool::runtime();
        let _in_runtime = runtime.enter();
        let Some(db) = setup() else { return };
        let r2d2 = db.pool.clone();
        let deadpool = runtime.block_on(async { db.deadpool() });
        runtime.block_on(async {
            for (note, pool_name, version) in [("from r2d2", "r2d2", 1), ("from deadpool", "deadpool", 2)] {
                let write = move |conn: &mut Conn| {
                    let order: Order = orders::table.find(1).select(Order::as_select()).first(conn)?;
                    order.guarded_update(conn, orders::note.eq(note))
                };
                let written = match pool_name {
                    "r2d2" => with_connection(&r2d2, write).await,
                    _ => with_connection(&deadpool, write).await,
                };
                assert_eq!(written.unwrap(), version, "{pool_name}: the new version");
            }
        });
        let order: Order = orders::table.find(1).select(Order::as_select()).first(&mut db.conn()).unwrap();
        assert_eq!((order.note.as_str(), order.version), ("from deadpool", 2));
    }

    /// An exhausted pool of either kind is `Error::Pool`, with that pool's error as the
    /// source, and nothing is written.
    #[test]
    fn an_exhausted_pool_is_error_pool_with_its_source() {
        let runtime = common::deadpool::runtime();
        let _in_runtime = runtime.enter();
        let Some(db) = setup() else { return };
        let wait = Duration::from_millis(200);
        let bump = |order: &mut Order| {
            order.quantity += 1;
            Ok::<_, Error>(())
        };

        let r2d2 = db.pool_with(&diesel_occ::PoolConfig { max_size: 1, min_idle: 1, connection_timeout: wait, ..common::pool_config() });
        let held = r2d2.get().unwrap();
        let err = Order::modify_pooled(&r2d2, &1, &patient(), bump).unwrap_err();
        let Error::Pool(source) = &err else { panic!("{err:?}") };
        assert!(source.downcast_ref::<diesel::r2d2::PoolError>().is_some(), "{source:?}");
        drop(held);

        let deadpool = runtime.block_on(async { Conn::deadpool(&db.url, 1, wait) });
        let held = runtime.block_on(deadpool.get()).unwrap();
        let err = Order::modify_pooled(&deadpool, &1, &patient(), bump).unwrap_err();
        let Error::Pool(source) = &err else { panic!("{err:?}") };
        assert!(
            matches!(source.downcast_ref::<deadpool_diesel::PoolError>(), Some(deadpool_diesel::PoolError::Timeout(_))),
            "{source:?}"
        );
        drop(held);

        let order: Order = orders::table.find(1).select(Order::as_select()).first(&mut db.conn()).unwrap();
        assert_eq!((order.quantity, order.version), (1, 0), "nothing was written");
    }

    /// Outside any tokio runtime a deadpool-diesel pool cannot hand out connections: a
    /// clear `Error::Pool`, not a panic.
    #[test]
    fn a_deadpool_pool_outside_its_runtime_is_a_clear_error() {
        let runtime = common::deadpool::runtime();
        let Some(db) = setup() else { return };
        let deadpool = runtime.block_on(async { Conn::deadpool(&db.url, 1, Duration::from_secs(5)) });
        let err = std::thread::spawn(move || Locks::new(deadpool).try_lock("x", "y", Duration::from_secs(5), None).map(|_| ()))
            .join()
            .unwrap()
            .unwrap_err();
        let Error::Pool(source) = &err else { panic!("{err:?}") };
        assert!(source.to_string().contains("tokio runtime"), "{source}");
    }

    /// The server's id of the session `conn` is (PostgreSQL, MariaDB).
    fn session_id(conn: &mut Conn) -> i64 {
        let sql = match BACKEND {
            "postgres" => "SELECT CAST(pg_backend_pid() AS BIGINT) AS value",
            _ => "SELECT CAST(CONNECTION_ID() AS SIGNED) AS value",
        };
        diesel::sql_query(sql).get_result::<SessionId>(conn).unwrap().value
    }

    /// Ends session `id` and waits until the server no longer lists it.
    fn kill_session(admin: &mut Conn, id: i64) {
        let listed = if BACKEND == "postgres" {
            diesel::sql_query(format!("SELECT CASE WHEN pg_terminate_backend({id}) THEN 1::BIGINT ELSE 0::BIGINT END AS value"))
                .get_result::<SessionId>(admin)
                .unwrap();
            format!("SELECT COUNT(*) AS value FROM pg_stat_activity WHERE pid = {id}")
        } else {
            admin.batch_execute(&format!("KILL {id}")).unwrap();
            format!("SELECT CAST(COUNT(*) AS SIGNED) AS value FROM information_schema.PROCESSLIST WHERE ID = {id}")
        };
        let asked = std::time::Instant::now();
        while diesel::sql_query(&listed).get_result::<SessionId>(admin).unwrap().value > 0 {
            assert!(asked.elapsed() < Duration::from_secs(30), "session {id} outlived its kill");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A session killed while it sat idle in `pool` (one connection) never reaches the
    /// library: the pool's check replaces it, and the next read-modify-write and lock
    /// land on their first attempt, once.
    fn a_killed_idle_connection_is_replaced<S>(db: &common::TestDb<Conn>, pool: S)
    where
        S: ConnectionSource<Connection = Conn>,
    {
        let admin = &mut Conn::establish(&db.url).unwrap();
        let bump = |order: &mut Order| {
            order.quantity += 1;
            Ok::<_, Error>(())
        };
        let locks = Locks::new(pool.clone());
        for round in 1..=2_i32 {
            let killed = pool.on_connection(session_id).unwrap();
            kill_session(admin, killed);
            let done = Order::modify_pooled(&pool, &1, &patient(), bump).unwrap();
            assert_eq!(done.attempts, 1, "round {round}: the dead connection reached the write");
            assert_ne!(pool.on_connection(session_id).unwrap(), killed);

            let killed = pool.on_connection(session_id).unwrap();
            kill_session(admin, killed);
            locks.try_lock("after-a-kill", "r", Duration::from_secs(30), None).unwrap().release().unwrap();
        }
        let order: Order = orders::table.find(1).select(Order::as_select()).first(admin).unwrap();
        assert_eq!((order.quantity, order.version), (3, 2), "each write landed once");
        let held: i64 = diesel_occ::occ_locks::table
            .filter(diesel_occ::occ_locks::holder.is_not_null())
            .count()
            .get_result(admin)
            .unwrap();
        assert_eq!(held, 0, "every lock was released");
    }

    /// A panic in the caller's change inside `modify_pooled`'s transaction reaches the
    /// caller and leaves nothing open: the connection it ran on (the only one of `pool`)
    /// is closed as it goes back, so its session ends (on SQLite another connection gets
    /// the write lock at once), and the pool serves the next call.
    fn a_panicking_change_leaves_nothing_open<S>(db: &common::TestDb<Conn>, pool: S)
    where
        S: ConnectionSource<Connection = Conn>,
    {
        let session = (BACKEND != "sqlite").then(|| pool.on_connection(session_id).unwrap());
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Order::modify_pooled(&pool, &1, &patient(), |_: &mut Order| -> Result<(), Error> {
                panic!("a bug in the caller's change")
            })
        }));
        assert!(panicked.is_err(), "the panic did not reach the caller");
        let mut check = db.conn();
        match session {
            Some(id) => common::wait_until_session_ends(&mut check, BACKEND, id),
            None => check.batch_execute("BEGIN IMMEDIATE; ROLLBACK").unwrap(),
        }
        let bump = |order: &mut Order| {
            order.quantity += 1;
            Ok::<_, Error>(())
        };
        assert_eq!(Order::modify_pooled(&pool, &1, &patient(), bump).unwrap().attempts, 1);
        let order: Order = orders::table.find(1).select(Order::as_select()).first(&mut check).unwrap();
        assert_eq!((order.quantity, order.version), (2, 1));
    }

    #[test]
    fn a_panicking_change_leaves_nothing_open_in_either_pool() {
        common::deadpool::in_runtime(|| {
            let Some(db) = setup() else { return };
            let one = diesel_occ::PoolConfig { max_size: 1, ..common::pool_config() };
            a_panicking_change_leaves_nothing_open(&db, db.pool_with(&one));
            diesel::update(orders::table).set((orders::quantity.eq(1), orders::version.eq(0))).execute(&mut db.conn()).unwrap();
            a_panicking_change_leaves_nothing_open(&db, Conn::deadpool(&db.url, 1, Duration::from_secs(30)));
        });
    }

    /// SQLite has no server session to kill; its connection faults are a locked or
    /// missing file (tests/lock_stalls.rs, tests/pool.rs).
    #[test]
    fn a_killed_idle_connection_is_replaced_on_either_pool() {
        if BACKEND == "sqlite" {
            return;
        }
        common::deadpool::in_runtime(|| {
            let Some(db) = setup() else { return };
            let always_checked = diesel_occ::PoolConfig {
                max_size: 1,
                min_idle: 1,
                check_after_idle: Duration::ZERO,
                ..common::pool_config()
            };
            a_killed_idle_connection_is_replaced(&db, db.pool_with(&always_checked));
            diesel::update(orders::table).set((orders::quantity.eq(1), orders::version.eq(0))).execute(&mut db.conn()).unwrap();
            a_killed_idle_connection_is_replaced(&db, Conn::deadpool(&db.url, 1, Duration::from_secs(30)));
        });
    }

    /// A guard dropped, and a write made, on a worker thread of a multi-thread runtime
    /// (an async handler that holds a lock across an `.await`): the deadpool-diesel
    /// checkout moves the worker's other tasks away and blocks, instead of panicking, and
    /// the lock is freed in the database.
    #[test]
    fn a_worker_thread_may_drop_a_guard_and_write_through_a_deadpool_pool() {
        let runtime = common::deadpool::runtime();
        let Some(db) = setup() else { return };
        let pool = runtime.block_on(async { db.deadpool() });
        let (locks, source) = (Locks::new(pool.clone()), pool.clone());
        runtime
            .block_on(runtime.spawn(async move {
                let guard = locks.try_lock("handler", "r", Duration::from_secs(30), None).unwrap();
                tokio::task::yield_now().await;
                Order::modify_pooled(&source, &1, &patient(), |order| {
                    order.quantity += 1;
                    Ok::<_, Error>(())
                })
                .unwrap();
                drop(guard);
            }))
            .expect("the handler did not panic");
        let held: i64 = diesel_occ::occ_locks::table
            .filter(diesel_occ::occ_locks::holder.is_not_null())
            .count()
            .get_result(&mut db.conn())
            .unwrap();
        assert_eq!(held, 0, "the dropped guard freed the lock");
        let order: Order = orders::table.find(1).select(Order::as_select()).first(&mut db.conn()).unwrap();
        assert_eq!((order.quantity, order.version), (2, 1));
        runtime.block_on(async move { drop(pool) });
    }

    /// 8 request tasks on a current-thread runtime (one thread for all of them) each add
    /// 10 to one row with a read and a guarded update through `with_connection`, retried
    /// on conflict by `run_async`, half of them on each pool: every increment lands once.
    /// (That the waits give the thread back is proved in `src/retry.rs`.)
    #[test]
    fn async_requests_on_one_thread_retry_conflicts_and_lose_no_increment() {
        const TASKS: i32 = 8;
        const EACH: i32 = 10;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let Some(db) = setup() else { return };
        let deadpool = runtime.block_on(async { db.deadpool() });
        let policy = std::sync::Arc::new(patient());

        async fn add_one<S: ConnectionSource<Connection = Conn>>(pool: S, policy: &RetryPolicy) -> u32 {
            let attempt = |_| {
                let pool = pool.clone();
                async move {
                    let written: Result<i64, Error> = with_connection(&pool, |conn: &mut Conn| {
                        let order: Order = orders::table.find(1).select(Order::as_select()).first(conn)?;
                        order.guarded_update(conn, orders::quantity.eq(order.quantity + 1))
                    })
                    .await;
                    written.map_err(Stop::<Error>::Occ)
                }
            };
            let (_, attempts): (i64, u32) = policy.run_async(attempt).await.unwrap();
            attempts
        }

        let attempts: u32 = runtime.block_on(async {
            let mut tasks = Vec::new();
            for task in 0..TASKS {
                let (r2d2, deadpool, policy) = (db.pool.clone(), deadpool.clone(), std::sync::Arc::clone(&policy));
                tasks.push(tokio::spawn(async move {
                    let mut attempts = 0;
                    for _ in 0..EACH {
                        attempts += if task % 2 == 0 { add_one(r2d2.clone(), &policy).await } else { add_one(deadpool.clone(), &policy).await };
                    }
                    attempts
                }));
            }
            let mut total = 0;
            for task in tasks {
                total += task.await.unwrap();
            }
            total
        });

        let order: Order = orders::table.find(1).select(Order::as_select()).first(&mut db.conn()).unwrap();
        let writes = TASKS * EACH;
        assert_eq!((order.quantity, order.version), (1 + writes, writes as i64), "every increment landed once");
        println!("{BACKEND}: {writes} async increments, {} retries", attempts - writes as u32);
        runtime.block_on(async move { drop(deadpool) });
    }
}
