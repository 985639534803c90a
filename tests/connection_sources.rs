//! Pools of every kind the library takes: `with_connection` from async code, an exhausted
//! pool (`Error::Pool` with the pool's own error as its source, nothing written), and a
//! deadpool-diesel pool used outside its runtime. The lock, lease, election and
//! read-modify-write bodies run on both kinds of pool in their own test files.

#![cfg(all(feature = "locks", feature = "deadpool"))]

mod common;

use common::models::Order;
use common::schema::orders;

use std::time::Duration;

use diesel::prelude::*;
use diesel_occ::{with_connection, Error, GuardedModify, GuardedWrite, Locks, RetryPolicy};

/// Retries until the end state is reached: these tests count lost writes, not latency.
fn patient() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(10_000)
        .max_elapsed(Duration::from_secs(300))
        .first_delay(Duration::from_millis(1))
        .max_delay(Duration::from_millis(20))
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
}
