//! A pooled connection that reaches a read-only server: a standby still finishing its
//! promotion behind a proxy, a demoted primary set read-only, a stale name. The session
//! of the pool's one connection is made read-only (what a standby answers), then:
//!
//! - a read-modify-write on the pool (`modify_pooled`) is refused once, the connection
//!   that met the refusal is discarded, and the retry runs on a new one: applied once,
//!   in two attempts, the retry's reason `ReadOnly`. On SQLite every connection opens the
//!   same file, so the refusal is answered at once, `ReadOnly`, nothing written;
//! - a guarded write on a pooled connection answers `ReadOnly`, and a pool the library
//!   configured (its r2d2 pool, or a bb8 pool made with
//!   `manager_config_with_reply_timeout`) does not hand that connection out again.
//!
//! Both drivers: the library's r2d2 pool and a bb8 pool of diesel-async connections.

#![cfg(all(feature = "bb8", any(not(feature = "mysql"), feature = "async-mysql")))]

use crate::common;

use std::sync::{Arc, Mutex};

use common::models::{Order, OrderPatch};
use common::schema::orders;
use diesel::prelude::*;
use diesel_occ::{Error, PoolConfig, RetryPolicy, RetryReason};

/// The statement that makes a session refuse writes as a standby does.
fn read_only_sql(backend: &str) -> &'static str {
    match backend {
        "postgres" => "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
        "mysql" => "SET SESSION TRANSACTION READ ONLY",
        _ => "PRAGMA query_only = ON",
    }
}

for_each_backend! {
    async_pools!();

    use diesel_occ::{GuardedModify, GuardedWrite};
    use diesel_occ::asynchronous::prelude::*;

    /// The session id of `conn` (0 on SQLite, which has none).
    fn session_blocking(conn: &mut Conn) -> i64 {
        common::session_id_sql(BACKEND).map_or(0, |sql| {
            diesel::RunQueryDsl::get_result::<common::Value>(diesel::sql_query(sql), conn)
                .unwrap()
                .value
        })
    }

    async fn session_async(conn: &mut Async_) -> i64 {
        match common::session_id_sql(BACKEND) {
            Some(sql) => diesel_async::RunQueryDsl::get_result::<common::Value>(diesel::sql_query(sql), conn)
                .await
                .unwrap()
                .value,
            None => 0,
        }
    }

    /// A pool of one connection, on either driver.
    enum OnePool {
        Blocking(r2d2::Pool<diesel_occ::CheckedManager<Conn>>),
        /// diesel's own r2d2 manager: only the library's call discards the connection.
        Plain(r2d2::Pool<diesel::r2d2::ConnectionManager<Conn>>),
        Async(diesel_async::pooled_connection::bb8::Pool<Async_>, tokio::runtime::Runtime),
    }

    impl OnePool {
        fn new(db: &common::TestDb<Conn>, on_async: bool) -> OnePool {
            if on_async {
                let runtime = common::paths::runtime();
                return OnePool::Async(bb8_pool(&db.url, 1, &runtime), runtime);
            }
            OnePool::Blocking(db.pool_with(&PoolConfig {
                max_size: 1,
                min_idle: 1,
                ..common::pool_config()
            }))
        }

        /// Makes the pool's connection read-only; its session id.
        fn make_read_only(&self) -> i64 {
            let sql = read_only_sql(BACKEND);
            match self {
                OnePool::Blocking(pool) => {
                    let conn = &mut *pool.get().unwrap();
                    diesel::RunQueryDsl::execute(diesel::sql_query(sql), conn).unwrap();
                    session_blocking(conn)
                }
                OnePool::Plain(pool) => {
                    let conn = &mut *pool.get().unwrap();
                    diesel::RunQueryDsl::execute(diesel::sql_query(sql), conn).unwrap();
                    session_blocking(conn)
                }
                OnePool::Async(pool, runtime) => runtime.block_on(async {
                    let mut conn = pool.get().await.unwrap();
                    diesel_async::RunQueryDsl::execute(diesel::sql_query(sql), &mut *conn)
                        .await
                        .unwrap();
                    session_async(&mut conn).await
                }),
            }
        }

        /// The session id of the connection the pool hands out now.
        fn session(&self) -> i64 {
            match self {
                OnePool::Blocking(pool) => session_blocking(&mut pool.get().unwrap()),
                OnePool::Plain(pool) => session_blocking(&mut pool.get().unwrap()),
                OnePool::Async(pool, runtime) => {
                    runtime.block_on(async { session_async(&mut pool.get().await.unwrap()).await })
                }
            }
        }

        /// The guarded update of `row` on a pooled connection: its new version.
        fn update(&self, row: &Order, patch: OrderPatch) -> Result<i64, Error> {
            match self {
                OnePool::Blocking(pool) => GuardedWrite::guarded_update(row, &mut *pool.get().unwrap(), patch),
                OnePool::Plain(pool) => GuardedWrite::guarded_update(row, &mut *pool.get().unwrap(), patch),
                OnePool::Async(pool, runtime) => runtime.block_on(async {
                    AsyncGuardedWrite::guarded_update(row, &mut *pool.get().await.unwrap(), patch).await
                }),
            }
        }

        fn add_one(&self, policy: &RetryPolicy) -> Result<diesel_occ::Modified<Order, ()>, Error> {
            match self {
                OnePool::Blocking(pool) => <Order as GuardedModify>::modify_pooled(
                    pool,
                    &1,
                    policy,
                    |o| common::paths::add_one_to(o, "+"),
                ),
                OnePool::Plain(pool) => <Order as GuardedModify>::modify_pooled(
                    pool,
                    &1,
                    policy,
                    |o| common::paths::add_one_to(o, "+"),
                ),
                OnePool::Async(pool, runtime) => runtime.block_on(
                    <Order as AsyncGuardedModify>::modify_pooled(pool, &1, policy, |o| {
                        common::paths::add_one_to(o, "+")
                    }),
                ),
            }
        }
    }

    fn db_with_order() -> Option<common::TestDb<Conn>> {
        let db = db()?;
        diesel::insert_into(orders::table)
            .values(&Order::new(1, "new"))
            .execute(&mut db.conn())
            .unwrap();
        Some(db)
    }

    fn patch(note: &str) -> OrderPatch {
        OrderPatch { note: Some(note.into()), ..Default::default() }
    }

    fn stored(db: &common::TestDb<Conn>) -> Order {
        orders::table.find(1).select(Order::as_select()).first(&mut db.conn()).unwrap()
    }

    fn a_pooled_read_modify_write_that_meets_a_read_only_server_retries_on_a_new_connection(on_async: bool) {
        let Some(db) = db_with_order() else { return };
        modify_on_a_read_only_connection(&db, &OnePool::new(&db, on_async));
    }

    fn modify_on_a_read_only_connection(db: &common::TestDb<Conn>, pool: &OnePool) {
        let read_only_session = pool.make_read_only();
        let reasons = Arc::new(Mutex::new(Vec::new()));
        let seen = reasons.clone();
        let policy = RetryPolicy::default().on_retry(move |event| {
            seen.lock().unwrap().push(match event.error {
                Error::Retryable { reason, .. } => Some(*reason),
                _ => None,
            })
        });

        let modified = pool.add_one(&policy);

        if BACKEND == "sqlite" {
            // The same file behind every connection: no retry can help.
            assert!(matches!(modified, Err(Error::ReadOnly { .. })), "{modified:?}");
            assert!(reasons.lock().unwrap().is_empty(), "{:?}", reasons.lock().unwrap());
            assert_eq!((stored(db).quantity, stored(db).version), (1, 0), "nothing written");
            return;
        }
        let modified = modified.unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(modified.attempts, 2);
        assert_eq!(*reasons.lock().unwrap(), [Some(RetryReason::ReadOnly)]);
        let row = stored(db);
        assert_eq!((row.quantity, row.version, row.note.as_str()), (2, 1, "new+"), "applied once");
        assert_ne!(pool.session(), read_only_session, "the read-only connection was discarded");
    }

    #[test]
    fn blocking_a_pooled_read_modify_write_that_meets_a_read_only_server_retries_on_a_new_connection() {
        a_pooled_read_modify_write_that_meets_a_read_only_server_retries_on_a_new_connection(false);
    }

    #[test]
    fn async_a_pooled_read_modify_write_that_meets_a_read_only_server_retries_on_a_new_connection() {
        a_pooled_read_modify_write_that_meets_a_read_only_server_retries_on_a_new_connection(true);
    }

    /// On a pool of diesel's own manager, which knows nothing of read-only servers: the
    /// call itself discards the connection.
    #[test]
    fn blocking_on_a_plain_r2d2_pool_a_read_modify_write_that_meets_a_read_only_server_retries_on_a_new_connection() {
        let Some(db) = db_with_order() else { return };
        let manager = diesel::r2d2::ConnectionManager::<Conn>::new(&db.url);
        let pool = OnePool::Plain(r2d2::Pool::builder().max_size(1).build(manager).unwrap());
        modify_on_a_read_only_connection(&db, &pool);
    }

    /// A pool the library configured (its r2d2 pool; a bb8 pool made with
    /// `manager_config_with_reply_timeout`): a connection that met a read-only refusal is
    /// not handed out again, whatever call met it.
    fn a_connection_that_met_a_read_only_server_is_not_handed_out_again(on_async: bool) {
        let Some(db) = db_with_order() else { return };
        let pool = if on_async {
            let runtime = common::paths::runtime();
            let manager = diesel_async::pooled_connection::AsyncDieselConnectionManager::new_with_config(
                &db.url,
                diesel_occ::asynchronous::manager_config_with_reply_timeout(std::time::Duration::from_secs(30)),
            );
            let pool = runtime
                .block_on(diesel_async::pooled_connection::bb8::Pool::builder().max_size(1).build(manager))
                .expect("a bb8 pool");
            OnePool::Async(pool, runtime)
        } else {
            OnePool::new(&db, false)
        };
        let read_only_session = pool.make_read_only();
        let row = stored(&db);

        let refused = pool.update(&row, patch("refused"));

        assert!(matches!(refused, Err(Error::ReadOnly { .. })), "{refused:?}");
        assert_eq!(stored(&db).version, 0, "nothing written");
        if BACKEND != "sqlite" {
            assert_ne!(pool.session(), read_only_session);
        }
        // The new connection writes, on SQLite too (`query_only` was the old session's).
        assert_eq!(pool.update(&row, patch("written")).unwrap(), 1);
    }

    #[test]
    fn blocking_a_connection_that_met_a_read_only_server_is_not_handed_out_again() {
        a_connection_that_met_a_read_only_server_is_not_handed_out_again(false);
    }

    #[test]
    fn async_a_connection_that_met_a_read_only_server_is_not_handed_out_again() {
        a_connection_that_met_a_read_only_server_is_not_handed_out_again(true);
    }
}
