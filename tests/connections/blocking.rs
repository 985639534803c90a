//! The library from async code: blocking work on tokio's blocking pool, never on the
//! runtime's threads; a dropped request future leaves no transaction open.

#![cfg(feature = "tokio")]

use crate::common;

use std::time::Duration;

use diesel::prelude::*;
use diesel_occ::with_connection;
use diesel_occ::GuardedJson;
use diesel_occ::WriteTransaction;
use diesel_occ::{Error, RetryPolicy};
use serde_json::json;

for_each_backend! {
    json_profiles!();

    fn load(db: &common::TestDb<Conn>) -> Profile {
        profiles::table.find(1).select(Profile::as_select()).first(&mut db.conn()).unwrap()
    }

    /// 16 tasks on a 2-thread runtime each merge their own key into one row through the
    /// blocking pool: all land, and the runtime stays free meanwhile (a timer task keeps
    /// ticking).
    #[test]
    fn sixteen_async_merges_all_land() {
        let Some(db) = db() else { return };
        let row = Profile { id: 1, name: "ada".into(), ext: json!({}), version: 0 };
        diesel::insert_into(profiles::table).values(&row).execute(&mut db.conn()).unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_time().build().unwrap();

        let ticks = runtime.block_on(async {
            let ticker = tokio::spawn(async {
                let mut ticks = 0;
                let mut interval = tokio::time::interval(Duration::from_millis(5));
                for _ in 0..20 {
                    interval.tick().await;
                    ticks += 1;
                }
                ticks
            });
            let merges: Vec<_> = (0..16)
                .map(|i| {
                    let pool = db.pool.clone();
                    tokio::spawn(async move {
                        with_connection(&pool, move |conn| {
                            let patch = json!({ format!("k{i}"): i });
                            Profile::merge_json(conn, &1, profiles::ext, &patch, &RetryPolicy::default())
                        })
                        .await
                    })
                })
                .collect();
            for merge in merges {
                merge.await.unwrap().unwrap();
            }
            ticker.await.unwrap()
        });

        assert_eq!(ticks, 20);
        let stored = load(&db);
        assert_eq!(stored.version, 16);
        for i in 0..16 {
            assert_eq!(stored.ext[format!("k{i}")], json!(i), "{}", stored.ext);
        }
    }

    /// The caller gives up (a timeout drops its future) while the blocking work is inside
    /// its transaction: the work runs to its end and commits, and the connection returns to
    /// the pool with no transaction open.
    #[test]
    fn a_dropped_future_leaves_no_transaction_open() {
        let Some(db) = db() else { return };
        let row = Profile { id: 1, name: "ada".into(), ext: json!({}), version: 0 };
        diesel::insert_into(profiles::table).values(&row).execute(&mut db.conn()).unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_time().build().unwrap();
        let (entered, inside) = std::sync::mpsc::channel();
        // One connection: the check below gets the very connection the work used.
        let pool = db.pool_with(&diesel_occ::PoolConfig { max_size: 1, min_idle: 1, ..common::pool_config() });

        runtime.block_on(async {
            let work = with_connection(&pool, move |conn| {
                conn.write_transaction(|conn| {
                    entered.send(()).unwrap();
                    std::thread::sleep(Duration::from_millis(300));
                    diesel::update(profiles::table.find(1)).set(profiles::name.eq("finished")).execute(conn)?;
                    Ok::<_, Error>(())
                })
            });
            let gave_up = tokio::time::timeout(Duration::from_millis(50), work).await;
            assert!(gave_up.is_err(), "the caller timed out");
        });
        inside.recv_timeout(Duration::from_secs(5)).expect("the work had started");
        drop(runtime); // waits for the blocking task to finish

        assert_eq!(load(&db).name, "finished", "the transaction committed");
        let mut conn = pool.get().unwrap();
        // A transaction still open on a pooled connection would make this a savepoint
        // inside it; a fresh write transaction at depth zero commits on its own.
        conn.write_transaction(|conn| {
            diesel::update(profiles::table.find(1)).set(profiles::name.eq("again")).execute(conn)?;
            Ok::<_, Error>(())
        })
        .unwrap();
        assert_eq!(load(&db).name, "again");
    }
}
