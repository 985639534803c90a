//! diesel-async pools (bb8, deadpool) wherever the async API takes a pool: 8 request tasks
//! sharing one pool lose no change, and an exhausted pool is `Error::Pool` keeping the
//! pool's own error, with nothing written. Checked from the database.

#![cfg(all(
    feature = "bb8",
    feature = "async-deadpool",
    any(not(feature = "mysql"), feature = "async-mysql")
))]

use crate::common;

use std::time::Duration;

use common::models::Order;
use common::paths::add_one_to;
use common::schema::orders;
use diesel::prelude::*;
use diesel_async::pooled_connection::AsyncDieselConnectionManager;

use diesel_occ::asynchronous::prelude::*;
use diesel_occ::asynchronous::AsyncConnectionSource;
use diesel_occ::{Error, RetryPolicy};

for_each_backend! {
    async_pools!();

    fn seeded() -> Option<common::TestDb<Conn>> {
        let db = db()?;
        diesel::insert_into(orders::table).values(&Order::new(1, "new")).execute(&mut db.conn()).unwrap();
        Some(db)
    }

    /// 8 tasks on a multi-thread runtime, 10 read-modify-writes each through `pool`.
    async fn eight_tasks<S: AsyncConnectionSource + Send + Sync + 'static>(pool: std::sync::Arc<S>)
    where
        diesel_occ::op::Modify<Order, fn(&mut Order) -> Result<(), Error>, (), Error>: diesel_occ::asynchronous::AsyncRun<S::Connection>,
    {
        let policy = RetryPolicy::default().max_attempts(200);
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (pool, policy) = (pool.clone(), policy.clone());
                tokio::spawn(async move {
                    for _ in 0..10 {
                        let change: fn(&mut Order) -> Result<(), Error> = |o| add_one_to(o, "x");
                        Order::modify_pooled(&*pool, &1, &policy, change).await.unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    }

    fn check_eighty_landed(db: &common::TestDb<Conn>) {
        let row = orders::table.find(1).select(Order::as_select()).first(&mut db.conn()).unwrap();
        assert_eq!((row.quantity, row.note.len(), row.version), (81, 83, 80));
    }

    #[test]
    fn bb8_pool_serves_eight_tasks_without_losing_a_change() {
        let Some(db) = seeded() else { return };
        let runtime = common::paths::runtime();
        runtime.block_on(async {
            let pool = diesel_async::pooled_connection::bb8::Pool::builder()
                .max_size(4)
                .build(manager(&db.url))
                .await
                .unwrap();
            eight_tasks(std::sync::Arc::new(pool)).await;
        });
        check_eighty_landed(&db);
    }

    #[test]
    fn deadpool_serves_eight_tasks_without_losing_a_change() {
        let Some(db) = seeded() else { return };
        let runtime = common::paths::runtime();
        runtime.block_on(async {
            let pool = diesel_async::pooled_connection::deadpool::Pool::builder(manager(&db.url))
                .max_size(4)
                .build()
                .unwrap();
            eight_tasks(std::sync::Arc::new(pool)).await;
        });
        check_eighty_landed(&db);
    }

    #[test]
    fn an_exhausted_pool_is_a_pool_error_that_keeps_its_source_and_writes_nothing() {
        let Some(db) = seeded() else { return };
        let runtime = common::paths::runtime();
        runtime.block_on(async {
            let pool = diesel_async::pooled_connection::bb8::Pool::builder()
                .max_size(1)
                .connection_timeout(Duration::from_millis(100))
                .build(manager(&db.url))
                .await
                .unwrap();
            let _held = pool.get().await.unwrap();
            let result = Order::modify_pooled(&pool, &1, &RetryPolicy::default(), |o| add_one_to(o, "x")).await;
            let Err(Error::Pool(source)) = result else { panic!("expected a pool error, got {result:?}") };
            assert!(source.downcast_ref::<diesel_async::pooled_connection::bb8::RunError>().is_some(), "{source}");
        });
        let row = orders::table.find(1).select(Order::as_select()).first(&mut db.conn()).unwrap();
        assert_eq!(row.version, 0);
    }

    /// 1,000 read-modify-writes through `pool`, each dropped after 0-3 ms (in the middle of
    /// a checkout, its test of the connection, a statement or the transaction), then 50 run
    /// to their end: every one of those 50 lands, and the row's counters agree (each change
    /// adds one to the quantity, the note and the version together).
    async fn dropped_calls_leave_the_pool_whole<S: AsyncConnectionSource + Send + Sync + 'static>(pool: S)
    where
        diesel_occ::op::Modify<Order, fn(&mut Order) -> Result<(), Error>, (), Error>: diesel_occ::asynchronous::AsyncRun<S::Connection>,
    {
        let policy = RetryPolicy::default().max_attempts(50);
        let change: fn(&mut Order) -> Result<(), Error> = |o| add_one_to(o, "x");
        for i in 0..1_000u64 {
            let cut = Duration::from_micros((i * 7_919) % 3_000);
            let _ = tokio::time::timeout(cut, Order::modify_pooled(&pool, &1, &policy, change)).await;
        }
        for _ in 0..50 {
            Order::modify_pooled(&pool, &1, &policy, change).await.unwrap();
        }
    }

    /// Every connection the pool hands out answers a query with its own reply (a connection
    /// put back with half a reply unread answers with the one before).
    async fn every_connection_answers(pool: &diesel_async::pooled_connection::bb8::Pool<Async_>) {
        use diesel::IntoSql;
        for round in 0..20 {
            let mut conns = Vec::new();
            for _ in 0..4 {
                conns.push(pool.get().await.unwrap());
            }
            for (c, conn) in conns.iter_mut().enumerate() {
                let n = (round * 4 + c) as i32;
                let query = diesel::select(n.into_sql::<diesel::sql_types::Integer>());
                let answer: i32 = diesel_async::RunQueryDsl::get_result(query, &mut **conn).await.unwrap();
                assert_eq!(answer, n);
            }
        }
    }

    fn check_counters_agree(db: &common::TestDb<Conn>) {
        let row = orders::table.find(1).select(Order::as_select()).first(&mut db.conn()).unwrap();
        assert!(row.version >= 50, "{row:?}");
        assert_eq!((row.quantity as i64, row.note.len() as i64), (row.version + 1, row.version + 3), "{row:?}");
    }

    /// Waits up to 30 s for `done`, then fails with `what`.
    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let asked = std::time::Instant::now();
        while !done() {
            assert!(asked.elapsed() < Duration::from_secs(30), "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Starts `modify_pooled` under `policy` while `holder` holds row 1's lock, and once
    /// its statement waits for that lock, runs `meanwhile` (cancelling the call, say) and
    /// commits the holder's transaction (with `holder_writes` in it). Returns the session
    /// that waited.
    fn while_the_row_is_locked<S>(
        db: &common::TestDb<Conn>,
        runtime: &tokio::runtime::Runtime,
        pool: &std::sync::Arc<S>,
        policy: RetryPolicy,
        holder_writes: Option<&str>,
        meanwhile: impl FnOnce(tokio::task::JoinHandle<Result<diesel_occ::Modified<Order, ()>, Error>>),
    ) -> i64
    where
        S: AsyncConnectionSource + Send + Sync + 'static,
        diesel_occ::op::Modify<Order, fn(&mut Order) -> Result<(), Error>, (), Error>: diesel_occ::asynchronous::AsyncRun<S::Connection>,
    {
        use diesel::connection::SimpleConnection;
        let change: fn(&mut Order) -> Result<(), Error> = |o| add_one_to(o, "x");
        let (mut holder, mut watcher) = (db.conn(), db.conn());
        let sql = common::session_id_sql(BACKEND).expect("a server backend");
        let holder_id = diesel::sql_query(sql).get_result::<common::Value>(&mut holder).unwrap().value;
        holder.batch_execute("BEGIN; SELECT id FROM orders WHERE id = 1 FOR UPDATE").unwrap();
        let call = {
            let pool = pool.clone();
            runtime.spawn(async move { Order::modify_pooled(&*pool, &1, &policy, change).await })
        };
        let mut waiting = Vec::new();
        wait_for("the call never waited for the row lock", || {
            assert!(!call.is_finished(), "the call ended while the row was locked");
            waiting = common::sessions_waiting_for(&mut watcher, BACKEND, holder_id);
            waiting.len() == 1
        });
        if let Some(writes) = holder_writes {
            holder.batch_execute(writes).unwrap();
        }
        meanwhile(call);
        holder.batch_execute("COMMIT").unwrap();
        waiting[0]
    }

    /// A call cancelled inside its transaction, its statement waiting for a row lock held
    /// elsewhere, leaves no transaction open on the server once that lock is freed, with no
    /// further checkout from `pool`: a pool that kept the broken connection idle would keep
    /// its transaction, and the row lock its statement then took, until it handed that
    /// connection out again. Cancelled once in its `UPDATE` (lock-free reads), once in its
    /// locking read (the row counts as contended after a conflict). Nothing of a cancelled
    /// call is written (its `COMMIT` was never sent), and the next call lands. Not on
    /// SQLite: its async calls run whole on the connection's own thread, so cancelling one
    /// never leaves a transaction behind.
    fn cancelled_in_its_transaction<S>(db: &common::TestDb<Conn>, runtime: &tokio::runtime::Runtime, pool: S)
    where
        S: AsyncConnectionSource + Send + Sync + 'static,
        diesel_occ::op::Modify<Order, fn(&mut Order) -> Result<(), Error>, (), Error>: diesel_occ::asynchronous::AsyncRun<S::Connection>,
    {
        use diesel::connection::SimpleConnection;
        use diesel_occ::Contention;
        let pool = std::sync::Arc::new(pool);
        let mut watcher = db.conn();
        let row = || orders::table.find(1).select(Order::as_select()).first(&mut db.conn()).unwrap();
        let cancel = |call: tokio::task::JoinHandle<_>| {
            call.abort();
            assert!(runtime.block_on(call).unwrap_err().is_cancelled());
        };
        // The cancelled call's session ends, and its transaction with it, with no further
        // checkout: a pool that kept the connection would keep the session, its
        // transaction and the row lock its statement took once the holder committed.
        let mut session_ends = |id| common::wait_until_session_ends(&mut watcher, BACKEND, id);
        let optimistic = RetryPolicy::default().contention(Contention::Optimistic);
        let cancelled = while_the_row_is_locked(db, runtime, &pool, optimistic, None, cancel);
        session_ends(cancelled);
        assert_eq!(row().version, 0);

        // The holder's write makes the call conflict: the row is contended from then on.
        let hot = RetryPolicy::default().contention(Contention::LockWhenContended { hot_for: Duration::from_secs(600) });
        let bump = Some("UPDATE orders SET version = version + 1 WHERE id = 1");
        while_the_row_is_locked(db, runtime, &pool, hot.clone(), bump, |call| {
            runtime.spawn(async move { call.await.unwrap().unwrap() });
        });
        wait_for("the contended call never landed", || row().version == 2);

        let cancelled = while_the_row_is_locked(db, runtime, &pool, hot.clone(), None, cancel);
        session_ends(cancelled);
        assert_eq!(row().version, 2);

        let change: fn(&mut Order) -> Result<(), Error> = |o| add_one_to(o, "x");
        runtime.block_on(Order::modify_pooled(&*pool, &1, &hot, change)).unwrap();
        let row = row();
        assert_eq!((row.version, row.quantity), (3, 3), "{row:?}");
    }

    /// Runs `leave_broken` (a call that leaves the only connection of `pool` broken), then
    /// checks that nothing of that call is left open: the connection was closed as it
    /// went back, so its session ended (on SQLite, another connection gets the database's
    /// write lock at once), and the pool serves the next call, the only one that lands.
    fn nothing_left_open_after<S>(
        db: &common::TestDb<Conn>,
        runtime: &tokio::runtime::Runtime,
        pool: &std::sync::Arc<S>,
        leave_broken: impl FnOnce(),
    ) where
        S: AsyncConnectionSource<Connection = Async_> + Send + Sync + 'static,
    {
        use diesel::connection::SimpleConnection;
        let session = common::session_id_sql(BACKEND).map(|sql| {
            runtime.block_on(async {
                let mut conn = pool.checkout().await.unwrap();
                diesel_async::RunQueryDsl::get_result::<common::Value>(diesel::sql_query(sql), &mut *conn).await.unwrap().value
            })
        });
        leave_broken();
        let mut check = db.conn();
        match session {
            Some(id) => common::wait_until_session_ends(&mut check, BACKEND, id),
            None => check.batch_execute("BEGIN IMMEDIATE; ROLLBACK").unwrap(),
        }
        let change: fn(&mut Order) -> Result<(), Error> = |o| add_one_to(o, "x");
        runtime.block_on(Order::modify_pooled(&**pool, &1, &RetryPolicy::default(), change)).unwrap();
        let row = orders::table.find(1).select(Order::as_select()).first(&mut check).unwrap();
        assert_eq!((row.version, row.quantity), (1, 2), "{row:?}");
    }

    /// A panic in the caller's change, inside the library's transaction, reaches the
    /// caller as a panic and leaves nothing open (on SQLite, where the change runs on the
    /// connection's thread, the transaction is rolled back there).
    fn a_panicking_change_leaves_nothing_open<S>(db: &common::TestDb<Conn>, runtime: &tokio::runtime::Runtime, pool: S)
    where
        S: AsyncConnectionSource<Connection = Async_> + Send + Sync + 'static,
    {
        let pool = std::sync::Arc::new(pool);
        nothing_left_open_after(db, runtime, &pool, || {
            let panics: fn(&mut Order) -> Result<(), Error> = |_| panic!("a bug in the caller's change");
            let pool = pool.clone();
            let call = runtime.spawn(async move { Order::modify_pooled(&*pool, &1, &RetryPolicy::default(), panics).await });
            let panicked = runtime.block_on(call).map(drop).unwrap_err();
            assert!(panicked.is_panic(), "{panicked:?}");
        });
    }

    #[test]
    fn a_panicking_change_leaves_nothing_open_in_a_bb8_pool() {
        let Some(db) = seeded() else { return };
        let runtime = common::paths::runtime();
        let pool = bb8_pool(&db.url, 1, &runtime);
        a_panicking_change_leaves_nothing_open(&db, &runtime, pool);
    }

    #[test]
    fn a_panicking_change_leaves_nothing_open_in_a_deadpool_pool() {
        let Some(db) = seeded() else { return };
        let runtime = common::paths::runtime();
        let pool = diesel_async::pooled_connection::deadpool::Pool::builder(manager(&db.url)).max_size(1).build().unwrap();
        a_panicking_change_leaves_nothing_open(&db, &runtime, pool);
    }

    /// Work on a locked row (`with_row_locked`) cancelled while it holds the row leaves
    /// nothing open (on SQLite the library's write transaction holds the database's write
    /// lock).
    fn cancelled_locked_work_leaves_nothing_open<S>(db: &common::TestDb<Conn>, runtime: &tokio::runtime::Runtime, pool: S)
    where
        S: AsyncConnectionSource<Connection = Async_> + Send + Sync + 'static,
    {
        use diesel_occ::asynchronous::AsyncPessimistic;
        use diesel_occ::LockWait;
        let pool = std::sync::Arc::new(pool);
        nothing_left_open_after(db, runtime, &pool, || {
            let holding = std::sync::Arc::new(tokio::sync::Notify::new());
            let work = {
                let (pool, holding) = (pool.clone(), holding.clone());
                runtime.spawn(async move {
                    let mut conn = pool.checkout().await?;
                    <Order as AsyncPessimistic>::with_row_locked(&mut *conn, &1, LockWait::Wait, async move |_: &mut Async_, _: Order| {
                        holding.notify_one();
                        std::future::pending::<Result<(), Error>>().await
                    })
                    .await
                })
            };
            runtime.block_on(holding.notified());
            work.abort();
            assert!(runtime.block_on(work).unwrap_err().is_cancelled());
        });
    }

    #[test]
    fn cancelled_locked_work_leaves_nothing_open_in_a_bb8_pool() {
        let Some(db) = seeded() else { return };
        let runtime = common::paths::runtime();
        let pool = bb8_pool(&db.url, 1, &runtime);
        cancelled_locked_work_leaves_nothing_open(&db, &runtime, pool);
    }

    #[test]
    fn cancelled_locked_work_leaves_nothing_open_in_a_deadpool_pool() {
        let Some(db) = seeded() else { return };
        let runtime = common::paths::runtime();
        let pool = diesel_async::pooled_connection::deadpool::Pool::builder(manager(&db.url)).max_size(1).build().unwrap();
        cancelled_locked_work_leaves_nothing_open(&db, &runtime, pool);
    }

    #[test]
    fn a_call_cancelled_in_its_transaction_leaves_nothing_open_in_a_bb8_pool() {
        if BACKEND == "sqlite" { return }
        let Some(db) = seeded() else { return };
        let runtime = common::paths::runtime();
        let pool = bb8_pool(&db.url, 2, &runtime);
        cancelled_in_its_transaction(&db, &runtime, pool);
    }

    #[test]
    fn a_call_cancelled_in_its_transaction_leaves_nothing_open_in_a_deadpool_pool() {
        if BACKEND == "sqlite" { return }
        let Some(db) = seeded() else { return };
        let runtime = common::paths::runtime();
        let pool = diesel_async::pooled_connection::deadpool::Pool::builder(manager(&db.url)).max_size(2).build().unwrap();
        cancelled_in_its_transaction(&db, &runtime, pool);
    }

    #[test]
    fn calls_dropped_at_random_points_leave_a_bb8_pool_whole() {
        let Some(db) = seeded() else { return };
        let runtime = common::paths::runtime();
        let pool = bb8_pool(&db.url, 4, &runtime);
        runtime.block_on(dropped_calls_leave_the_pool_whole(pool.clone()));
        runtime.block_on(every_connection_answers(&pool));
        check_counters_agree(&db);
    }

    #[test]
    fn calls_dropped_at_random_points_leave_a_deadpool_pool_whole() {
        let Some(db) = seeded() else { return };
        let runtime = common::paths::runtime();
        let pool = diesel_async::pooled_connection::deadpool::Pool::builder(manager(&db.url)).max_size(4).build().unwrap();
        runtime.block_on(dropped_calls_leave_the_pool_whole(pool));
        check_counters_agree(&db);
    }
}

/// Server sessions of a bb8 pool killed at random while 4 tasks run read-modify-writes
/// through it (PostgreSQL, MariaDB): each call lands once or says it may have
/// (`Ambiguous`), attempts that lost their connection before the `COMMIT` run again on
/// another, and the row's counters agree with each other and with the outcomes.
mod killed_sessions {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Arc;

    #[derive(QueryableByName)]
    struct Session {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        id: i64,
    }

    /// Kills one session listed by `list` on `admin` every few milliseconds until `done`;
    /// returns how many it killed.
    fn killer<C: diesel::Connection + diesel::connection::LoadConnection>(
        mut admin: C,
        list: String,
        kill: fn(i64) -> String,
        done: Arc<AtomicBool>,
    ) -> u32
    where
        diesel::query_builder::SqlQuery: diesel::query_dsl::LoadQuery<'static, C, Session>,
    {
        let (mut kills, mut seed) = (0, 11_u64);
        while !done.load(Ordering::Relaxed) {
            let sessions = diesel::sql_query(&list)
                .load::<Session>(&mut admin)
                .unwrap();
            if !sessions.is_empty() {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                let victim = sessions[(seed >> 33) as usize % sessions.len()].id;
                if admin.batch_execute(&kill(victim)).is_ok() {
                    kills += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(15));
        }
        kills
    }

    /// Runs the test with the killer on `$admin` and a bb8 pool of `$async` on `$url`.
    macro_rules! killed_run {
        ($async:ty, $url:expr, $admin:expr, $list:expr, $kill:expr, $check:expr) => {{
            let done = Arc::new(AtomicBool::new(false));
            let killing = {
                let (done, admin, list) = (done.clone(), $admin, $list);
                std::thread::spawn(move || killer(admin, list, $kill, done))
            };
            let (landed, ambiguous) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
            let runtime = common::paths::runtime();
            runtime.block_on(async {
                let pool = Arc::new(
                    diesel_async::pooled_connection::bb8::Pool::builder()
                        .max_size(4)
                        .build(AsyncDieselConnectionManager::<$async>::new($url))
                        .await
                        .unwrap(),
                );
                // A time budget far above the default 2 s: on a loaded machine a reconnect
                // can outlast that, and what this test counts is attempts, not time.
                let policy = RetryPolicy::default()
                    .max_attempts(100)
                    .max_elapsed(Duration::from_secs(120));
                let tasks: Vec<_> = (0..4)
                    .map(|_| {
                        let (pool, policy, landed, ambiguous) = (
                            pool.clone(),
                            policy.clone(),
                            landed.clone(),
                            ambiguous.clone(),
                        );
                        tokio::spawn(async move {
                            for _ in 0..50 {
                                let change = |o: &mut Order| add_one_to(o, "x");
                                match Order::modify_pooled(&*pool, &1, &policy, change).await {
                                    Ok(_) => landed.fetch_add(1, Ordering::Relaxed),
                                    Err(Error::Ambiguous { .. }) => {
                                        ambiguous.fetch_add(1, Ordering::Relaxed)
                                    }
                                    // The pool could not connect in time while sessions died.
                                    Err(Error::Pool(_)) => 0,
                                    Err(other) => panic!("{other:?}"),
                                };
                            }
                        })
                    })
                    .collect();
                for task in tasks {
                    task.await.unwrap();
                }
            });
            done.store(true, Ordering::Relaxed);
            let kills = killing.join().unwrap();
            let (landed, ambiguous) = (
                landed.load(Ordering::Relaxed),
                ambiguous.load(Ordering::Relaxed),
            );
            let row: Order = $check;
            eprintln!("kills {kills}, landed {landed}, ambiguous {ambiguous}, row {row:?}");
            assert!(kills > 0, "no session was killed");
            assert_eq!(i64::from(row.quantity) - 1, row.version, "{row:?}");
            assert_eq!(row.note.len() as i64 - 3, row.version, "{row:?}");
            assert!(
                row.version >= i64::from(landed),
                "a landed change is missing: {row:?}"
            );
            assert!(
                row.version <= i64::from(landed + ambiguous),
                "a change landed twice: {row:?}"
            );
        }};
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres() {
        let Some(db) = common::postgres() else { return };
        diesel::insert_into(orders::table)
            .values(&Order::new(1, "new"))
            .execute(&mut db.conn())
            .unwrap();
        let name = format!("occ_killed_{}", std::process::id());
        let url = format!("{}&application_name={name}", db.url);
        let list = format!("SELECT CAST(pid AS BIGINT) AS id FROM pg_stat_activity WHERE application_name = '{name}'");
        let admin = <diesel::PgConnection as diesel::Connection>::establish(&db.url).unwrap();
        let kill: fn(i64) -> String = |id| format!("SELECT pg_terminate_backend({id})");
        killed_run!(
            diesel_async::AsyncPgConnection,
            url,
            admin,
            list,
            kill,
            orders::table
                .find(1)
                .select(Order::as_select())
                .first(&mut db.conn())
                .unwrap()
        );
    }

    #[cfg(feature = "async-mysql")]
    #[test]
    fn mysql() {
        let Some(db) = common::mysql() else { return };
        diesel::insert_into(orders::table)
            .values(&Order::new(1, "new"))
            .execute(&mut db.conn())
            .unwrap();
        let admin = <diesel::MysqlConnection as diesel::Connection>::establish(&db.url).unwrap();
        let list = "SELECT CAST(ID AS SIGNED) AS id FROM information_schema.PROCESSLIST \
                    WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND USER <> 'system user'"
            .to_string();
        let kill: fn(i64) -> String = |id| format!("KILL {id}");
        killed_run!(
            diesel_async::AsyncMysqlConnection,
            db.url.clone(),
            admin,
            list,
            kill,
            orders::table
                .find(1)
                .select(Order::as_select())
                // A new session: the killer may have ended the pool's idle ones.
                .first(
                    &mut <diesel::MysqlConnection as diesel::Connection>::establish(&db.url)
                        .unwrap()
                )
                .unwrap()
        );
    }
}
