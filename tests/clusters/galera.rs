//! A MariaDB Galera cluster of three nodes (`scripts/galera.sh`): the library's promises
//! when each writer talks to another node. A transaction that loses certification is
//! aborted at its `COMMIT` (or at the statement after the abort), and must come back as a
//! retry, never as a raw error or a connection whose transaction manager is broken.
//!
//! The URLs of the nodes come from `GALERA_URLS` (comma-separated); without it the tests
//! are skipped, unless `OCC_REQUIRE_CLUSTER` is set. Each test runs `OCC_CLUSTER_ROUNDS`
//! rounds (default 20) of 8 threads x 50 operations, spread over the nodes, and checks
//! the end state exactly on every node.

#![cfg(feature = "mysql")]

use crate::common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::Duration;

use common::models::{Counter, Order};
use common::schema::{counters, orders};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::MysqlConnection;
use diesel_occ::{CheckedManager, Error, GuardedJson, GuardedModify, PoolConfig, RetryPolicy};
use serde_json::json;

type Pool = diesel::r2d2::Pool<CheckedManager<MysqlConnection>>;
type JsonSql = diesel::sql_types::Json;

json_profiles!();

const THREADS: usize = 8;
const OPERATIONS: usize = 50;

/// Rounds per test: `OCC_CLUSTER_ROUNDS`, 20 unless set.
fn rounds() -> usize {
    std::env::var("OCC_CLUSTER_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(20)
}

/// What the calls of a run met besides success.
#[derive(Debug, Default)]
struct Outcomes {
    /// Retryable errors (conflicts, certification failures) and exhausted retries.
    retried: AtomicUsize,
    /// Calls whose connection the server ended before their `COMMIT`: nothing landed.
    lost: AtomicUsize,
    /// Calls whose connection ended at their `COMMIT`: they may have landed.
    ambiguous: AtomicUsize,
}

impl Outcomes {
    fn ambiguous(&self) -> usize {
        self.ambiguous.load(Ordering::Relaxed)
    }
}

/// The client's word for a connection the server closed (2013, 2006).
fn lost_connection(error: &diesel::result::Error) -> bool {
    matches!(error, diesel::result::Error::DatabaseError(_, info)
        if ["Lost connection to", "MySQL server has gone away", "Server has gone away"]
            .iter()
            .any(|text| info.message().starts_with(text)))
}

/// A database of its own on the cluster, with a pool on each node.
struct Cluster {
    pools: Vec<Pool>,
    database: String,
    admin: MysqlConnection,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self
            .admin
            .batch_execute(&format!("DROP DATABASE {}", self.database));
    }
}

/// The cluster in `GALERA_URLS`, with a fresh migrated database, or `None` (skip).
fn cluster() -> Option<Cluster> {
    let urls = match std::env::var("GALERA_URLS") {
        Ok(urls) if !urls.is_empty() => urls,
        _ if std::env::var_os("OCC_REQUIRE_CLUSTER").is_some() => {
            panic!("GALERA_URLS is not set, but OCC_REQUIRE_CLUSTER is")
        }
        _ => {
            eprintln!("skipped: GALERA_URLS is not set (scripts/galera.sh start)");
            return None;
        }
    };
    let urls: Vec<&str> = urls.split(',').collect();
    let database = common::unique_name();
    let mut admin = MysqlConnection::establish(urls[0]).expect("node 1 answers");
    // DDL runs on every node before it returns (total order isolation).
    admin
        .batch_execute(&format!("CREATE DATABASE {database}"))
        .expect("create the test database");
    let config = PoolConfig {
        max_size: THREADS as u32,
        // A call a node leaves waiting for a reply ends this soon (see `MysqlSettings`).
        idle_session_timeout: Duration::from_secs(2),
        ..common::pool_config()
    };
    let pools: Vec<Pool> = urls
        .iter()
        .map(|url| {
            diesel_occ::mysql_pool(&common::with_database(url, &database), &config)
                .expect("a pool on each node")
        })
        .collect();
    common::migrate_mysql(&mut pools[0].get().expect("node 1"));
    Some(Cluster {
        pools,
        database,
        admin,
    })
}

impl Cluster {
    /// Runs `op(thread, i, conn)` until it succeeds `OPERATIONS` times in each of
    /// `THREADS` threads, thread `t` on node `t % 3`. A retryable error counts as a
    /// retry. A call whose connection the server ended (a call the node left waiting
    /// for a reply, ended by the idle bound of `MysqlSettings`) counts as lost, and the
    /// thread takes another connection, as a web back end's next request would; when
    /// that happened at the `COMMIT` the outcome is ambiguous and counted apart. Any other
    /// error fails the test.
    fn run(
        &self,
        op: impl Fn(usize, usize, &mut diesel_occ::Pooled<MysqlConnection>) -> Result<(), Error> + Sync,
    ) -> Outcomes {
        let outcomes = Outcomes::default();
        let start = Barrier::new(THREADS);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (op, outcomes, start) = (&op, &outcomes, &start);
                let pool = &self.pools[t % self.pools.len()];
                s.spawn(move || {
                    let mut conn = pool.get().expect("a connection");
                    start.wait();
                    let mut i = 0;
                    while i < OPERATIONS {
                        match op(t, i, &mut conn) {
                            Ok(()) => i += 1,
                            Err(e)
                                if e.is_retryable()
                                    || matches!(e, Error::RetriesExhausted { .. }) =>
                            {
                                outcomes.retried.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(Error::Ambiguous { .. }) => {
                                outcomes.ambiguous.fetch_add(1, Ordering::Relaxed);
                                conn = pool.get().expect("a connection");
                            }
                            Err(Error::Database(source)) if lost_connection(&source) => {
                                outcomes.lost.fetch_add(1, Ordering::Relaxed);
                                conn = pool.get().expect("a connection");
                            }
                            Err(e) => panic!("thread {t}, operation {i}: {e:?}"),
                        }
                    }
                });
            }
        });
        outcomes
    }

    /// Reads `query` on every node after the node has applied everything committed
    /// before (`wsrep_sync_wait`, which `MysqlSettings` sets on the pools' sessions).
    fn on_every_node<T>(&self, query: impl Fn(&mut MysqlConnection) -> QueryResult<T>) -> Vec<T> {
        self.pools
            .iter()
            .map(|pool| {
                let mut conn = pool.get().expect("a connection");
                // The library's pools make every session's reads causal on Galera.
                let causal: bool = diesel::select(diesel::dsl::sql::<diesel::sql_types::Bool>(
                    "@@wsrep_sync_wait & 1 = 1",
                ))
                .get_result(&mut conn)
                .unwrap();
                assert!(causal, "the pool's sessions read causally");
                query(&mut conn).unwrap()
            })
            .collect()
    }
}

impl Cluster {
    /// Order `id`'s end state on every node after `THREADS * OPERATIONS` successful
    /// increments of its quantity: every success landed once (an ambiguous call may have
    /// landed too), one version per landed write.
    fn assert_order_landed(&self, id: i64, round: usize, outcomes: &Outcomes) {
        let ends = self.on_every_node(|conn| {
            orders::table
                .find(id)
                .select((orders::quantity, orders::version))
                .first::<(i32, i64)>(conn)
        });
        let done = THREADS * OPERATIONS;
        for (quantity, version) in ends {
            let landed = done..=done + outcomes.ambiguous();
            assert!(
                landed.contains(&(quantity as usize)),
                "round {round}: {quantity} after {done} successes, {outcomes:?}"
            );
            assert_eq!(
                i64::from(quantity),
                version,
                "round {round}: one version per landed write"
            );
        }
    }
}

fn quick() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(50)
        .first_delay(Duration::from_millis(1))
        .max_delay(Duration::from_millis(20))
}

#[test]
fn read_modify_writes_on_three_nodes_lose_nothing() {
    let Some(cluster) = cluster() else { return };
    for round in 0..rounds() {
        let name = format!("hits-{round}");
        let counter = Counter {
            name: name.clone(),
            value: 0,
            rev: 0,
        };
        diesel::insert_into(counters::table)
            .values(&counter)
            .execute(&mut cluster.pools[0].get().unwrap())
            .unwrap();
        let retries = cluster.run(|_, _, conn| {
            Counter::modify(conn, &name, &quick(), |c| {
                c.value += 1;
                Ok::<_, Error>(())
            })
            .map(drop)
        });
        let ends = cluster.on_every_node(|conn| {
            counters::table
                .find(&name)
                .select((counters::value, counters::revision))
                .first::<(i64, i16)>(conn)
        });
        let done = THREADS * OPERATIONS;
        for (value, revision) in ends {
            // Every success landed once; an ambiguous call may have landed too.
            let landed = done..=done + retries.ambiguous();
            assert!(
                landed.contains(&(value as usize)),
                "round {round}: {value} after {done} successes, {retries:?}"
            );
            assert_eq!(
                value,
                i64::from(revision),
                "round {round}: one version per landed write"
            );
        }
        eprintln!(
            "round {round}: {} read-modify-writes, {retries:?}",
            THREADS * OPERATIONS
        );
    }
}

#[test]
fn pooled_read_modify_writes_with_the_default_policy_lose_nothing() {
    let Some(cluster) = cluster() else { return };
    for round in 0..rounds() {
        let id = round as i64 + 1;
        diesel::sql_query(format!(
            "INSERT INTO orders (id, customer, note, status, quantity, version) VALUES ({id}, 'c', '', 'valid', 0, 0)"
        ))
        .execute(&mut cluster.pools[0].get().unwrap())
        .unwrap();
        let retries = cluster.run(|t, _, _| {
            let pool = &cluster.pools[t % cluster.pools.len()];
            Order::modify_pooled(pool, &id, &RetryPolicy::default(), |o| {
                o.quantity += 1;
                Ok::<_, Error>(())
            })
            .map(drop)
        });
        cluster.assert_order_landed(id, round, &retries);
        eprintln!(
            "round {round}: {} pooled read-modify-writes, {retries:?}",
            THREADS * OPERATIONS
        );
    }
}

#[test]
fn json_merges_on_three_nodes_keep_every_key() {
    let Some(cluster) = cluster() else { return };
    for round in 0..rounds() {
        let id = round as i64 + 1;
        let row = Profile {
            id,
            name: "ada".into(),
            ext: json!({}),
            version: 0,
        };
        diesel::insert_into(profiles::table)
            .values(&row)
            .execute(&mut cluster.pools[0].get().unwrap())
            .unwrap();
        let retries = cluster.run(|t, i, conn| {
            let patch = json!({ format!("t{t}-{i}"): i });
            Profile::merge_json(conn, &id, profiles::ext, &patch, &quick()).map(drop)
        });
        let ends = cluster.on_every_node(|conn| {
            profiles::table
                .find(id)
                .select((profiles::ext, profiles::version))
                .first::<(serde_json::Value, i64)>(conn)
        });
        for (ext, version) in ends {
            let keys: BTreeSet<&String> = ext.as_object().expect("an object").keys().collect();
            // Each merge's key is its own: every success is there, and an ambiguous merge
            // (whose key a later call then merged again) adds no other.
            assert_eq!(
                keys.len(),
                THREADS * OPERATIONS,
                "round {round}: a merge lost keys"
            );
            let landed = THREADS * OPERATIONS..=THREADS * OPERATIONS + retries.ambiguous();
            assert!(
                landed.contains(&(version as usize)),
                "round {round}: version {version}, {retries:?}"
            );
        }
        eprintln!(
            "round {round}: {} merges, {retries:?}",
            THREADS * OPERATIONS
        );
    }
}

/// A node set `read_only` (as a replica would be) refuses a writer without the admin
/// privilege with 1290: a guarded read-modify-write and a lock come back as
/// `Error::ReadOnly` at once, in any message language, and nothing is written.
#[test]
fn writes_on_a_read_only_node_are_read_only() {
    let Some(cluster) = cluster() else { return };
    let urls = std::env::var("GALERA_URLS").expect("set, as cluster() found");
    let node = urls.split(',').nth(2).expect("three nodes");
    let admin = &mut MysqlConnection::establish(node).expect("node 3 answers");
    let user = common::unique_name();
    admin
        .batch_execute(&format!(
            "CREATE USER '{user}'@'%'; GRANT ALL ON {}.* TO '{user}'@'%'; SET GLOBAL read_only = 1",
            cluster.database
        ))
        .unwrap();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        diesel::sql_query(
            "INSERT INTO orders (id, customer, note, status, quantity, version) VALUES (1, 'c', '', 'valid', 0, 0)",
        )
        .execute(&mut cluster.pools[0].get().unwrap())
        .unwrap();
        let url = common::with_database(
            &node.replacen("root@", &format!("{user}@"), 1),
            &cluster.database,
        );
        let pool = diesel_occ::mysql_pool(
            &url,
            &PoolConfig {
                max_size: 1,
                ..common::pool_config()
            },
        )
        .expect("a pool of the unprivileged user");
        for language in ["de_DE", "en_US"] {
            let mut conn = pool.get().unwrap();
            conn.batch_execute(&format!("SET lc_messages = '{language}'"))
                .unwrap();
            let mut attempts = 0;
            let err = Order::modify(&mut conn, &1, &RetryPolicy::default(), |o| {
                attempts += 1;
                o.quantity += 1;
                Ok::<_, Error>(())
            })
            .map(drop)
            .unwrap_err();
            assert!(matches!(err, Error::ReadOnly { .. }), "{language}: {err:?}");
            assert_eq!(attempts, 1, "{language}: not retried");
            if language == "de_DE" {
                assert!(
                    err.to_string().contains("Anweisung"),
                    "the server answered in German: {err}"
                );
            }
            drop(conn);
            #[cfg(feature = "locks")]
            {
                let locks = diesel_occ::Locks::new(pool.clone());
                let err = locks
                    .try_lock("read-only", language, Duration::from_secs(30), None)
                    .map(drop)
                    .unwrap_err();
                assert!(matches!(err, Error::ReadOnly { .. }), "{language}: {err:?}");
            }
        }
        let quantity: i32 = orders::table
            .find(1)
            .select(orders::quantity)
            .first(&mut cluster.pools[2].get().unwrap())
            .unwrap();
        assert_eq!(quantity, 0, "nothing was written");
    }));
    admin
        .batch_execute(&format!("SET GLOBAL read_only = 0; DROP USER '{user}'@'%'"))
        .unwrap();
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// A round's grants: one per operation, none ambiguous (an ambiguous grant may have left
/// the lock held by nobody for its lease), fences rising with each grant.
#[cfg(feature = "locks")]
fn assert_grants(round: usize, fences: &[i64], outcomes: &Outcomes) {
    assert_eq!(fences.len(), THREADS * OPERATIONS);
    assert_eq!(
        outcomes.ambiguous(),
        0,
        "round {round}: ambiguous grants, {outcomes:?}"
    );
    assert!(
        fences.windows(2).all(|pair| pair[0] < pair[1]),
        "round {round}: fences that do not rise with each grant: {fences:?}"
    );
}

/// A lock row's fence.
#[derive(diesel::QueryableByName)]
struct FenceRow {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    value: i64,
}

/// 8 threads on three nodes take one lock 50 times each (waiting for it with
/// `Locks::lock`): never two holders at once, and the fences rise with every grant, in
/// the order the grants happened.
#[cfg(feature = "locks")]
#[test]
fn lock_rounds_on_three_nodes_have_one_holder_and_rising_fences() {
    use diesel_occ::Locks;
    use std::sync::atomic::AtomicBool;
    use std::sync::Mutex;

    let Some(cluster) = cluster() else { return };
    let locks: Vec<Locks<Pool>> = cluster
        .pools
        .iter()
        .map(|pool| Locks::new(pool.clone()))
        .collect();
    for round in 0..rounds() {
        let resource = format!("round-{round}");
        let inside = AtomicBool::new(false);
        let fences = Mutex::new(Vec::new());
        let retries = cluster.run(|t, _, _| {
            let locks = &locks[t % locks.len()];
            let guard = locks.lock(
                "cluster",
                &resource,
                Duration::from_secs(30),
                Some("test"),
                Duration::from_secs(60),
                &quick(),
            )?;
            assert!(
                !inside.swap(true, Ordering::SeqCst),
                "round {round}: two holders at once"
            );
            fences.lock().unwrap().push(guard.fence());
            // From the database: the node this thread talks to shows the grant (no phantom
            // grant of a transaction the node had aborted).
            let mut check = cluster.pools[t % cluster.pools.len()].get().unwrap();
            let row: FenceRow = diesel::sql_query(
                "SELECT fence AS value FROM occ_locks WHERE lock_name = 'cluster' AND resource = ?",
            )
            .bind::<diesel::sql_types::Text, _>(&resource)
            .get_result(&mut check)
            .unwrap();
            assert_eq!(
                row.value,
                guard.fence(),
                "round {round}: thread {t} was granted a fence its node's row does not show"
            );
            inside.store(false, Ordering::SeqCst);
            guard.release()
        });
        let fences = fences.into_inner().unwrap();
        assert_grants(round, &fences, &retries);
        eprintln!("round {round}: {} grants, {retries:?}", fences.len());
    }
}

/// The async API on the cluster: diesel-async's MySQL client (mysql_async), a bb8 pool
/// per node set up by `MysqlSettings::async_manager_config` (a reply a node never sends
/// ends with the session's `wait_timeout`; reads are causal), tasks on a multi-thread
/// runtime.
#[cfg(all(feature = "async-mysql", feature = "bb8"))]
mod on_async {
    use super::*;
    use diesel_async::pooled_connection::bb8;
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    use diesel_async::AsyncMysqlConnection;
    use std::future::Future;
    use std::sync::Arc;

    pub type AsyncPool = bb8::Pool<AsyncMysqlConnection>;

    /// The runtime and a pool on each node of `cluster`'s database.
    pub fn pools(cluster: &Cluster) -> (tokio::runtime::Runtime, Arc<Vec<AsyncPool>>) {
        let urls = std::env::var("GALERA_URLS").expect("set, as cluster() found");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let pools = urls
            .split(',')
            .map(|url| {
                let url = common::with_database(url, &cluster.database);
                let settings = diesel_occ::MysqlSettings {
                    idle_session_timeout: Duration::from_secs(2),
                };
                let manager = AsyncDieselConnectionManager::<AsyncMysqlConnection>::new_with_config(
                    url,
                    settings.async_manager_config(),
                );
                runtime
                    .block_on(bb8::Pool::builder().max_size(THREADS as u32).build(manager))
                    .expect("a bb8 pool on each node")
            })
            .collect();
        (runtime, Arc::new(pools))
    }

    /// [`Cluster::run`] on the async API: `op(task, pool)` until it succeeds `OPERATIONS`
    /// times in each of `THREADS` tasks, task `t` on node `t % 3`.
    pub fn run<F, Fut>(
        runtime: &tokio::runtime::Runtime,
        pools: &Arc<Vec<AsyncPool>>,
        op: F,
    ) -> Outcomes
    where
        F: Fn(usize, AsyncPool) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), Error>> + Send,
    {
        let outcomes = Arc::new(Outcomes::default());
        let op = Arc::new(op);
        let tasks: Vec<_> = (0..THREADS)
            .map(|t| {
                let (pool, outcomes, op) =
                    (pools[t % pools.len()].clone(), outcomes.clone(), op.clone());
                runtime.spawn(async move {
                    let mut i = 0;
                    while i < OPERATIONS {
                        match op(t, pool.clone()).await {
                            Ok(()) => i += 1,
                            Err(e)
                                if e.is_retryable()
                                    || matches!(e, Error::RetriesExhausted { .. }) =>
                            {
                                outcomes.retried.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(Error::Ambiguous { .. }) => {
                                outcomes.ambiguous.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(Error::Database(source)) if lost_connection(&source) => {
                                outcomes.lost.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => panic!("task {t}, operation {i}: {e:?}"),
                        }
                    }
                })
            })
            .collect();
        runtime.block_on(async {
            for task in tasks {
                task.await.unwrap();
            }
        });
        Arc::into_inner(outcomes).expect("every task ended")
    }
}

/// 8 tasks x 50 read-modify-writes through the async `modify_pooled`, spread over the
/// nodes: a certification abort at `COMMIT` is retried, and nothing is lost.
#[cfg(all(feature = "async-mysql", feature = "bb8"))]
#[test]
fn async_read_modify_writes_on_three_nodes_lose_nothing() {
    use diesel_occ::asynchronous::AsyncGuardedModify;

    let Some(cluster) = cluster() else { return };
    let (runtime, pools) = on_async::pools(&cluster);
    for round in 0..rounds() {
        let id = 100 + round as i64;
        diesel::sql_query(format!(
            "INSERT INTO orders (id, customer, note, status, quantity, version) VALUES ({id}, 'c', '', 'valid', 0, 0)"
        ))
        .execute(&mut cluster.pools[0].get().unwrap())
        .unwrap();
        let outcomes = on_async::run(&runtime, &pools, move |_, pool| async move {
            <Order as AsyncGuardedModify>::modify_pooled(&pool, &id, &quick(), |o| {
                o.quantity += 1;
                Ok::<_, Error>(())
            })
            .await
            .map(drop)
        });
        cluster.assert_order_landed(id, round, &outcomes);
        eprintln!(
            "round {round}: {} async read-modify-writes, {outcomes:?}",
            THREADS * OPERATIONS
        );
    }
}

/// A guarded write that matched nothing on a row still at the expected token is a node
/// that had not yet applied another node's commit: retryable on both paths. Which node
/// does that is the one thing each driver asks the server itself; every node of the
/// cluster must say so on both (the judgement after it is one function, unit-tested).
#[cfg(feature = "async-mysql")]
#[test]
fn both_drivers_know_a_galera_node_applies_commits_late() {
    use diesel::mysql::Mysql;
    use diesel_async::AsyncConnection;
    use diesel_occ::__private::NativeAsync;
    use diesel_occ::OccBackend;

    let Some(_cluster) = cluster() else { return };
    let urls = std::env::var("GALERA_URLS").expect("set, as cluster() found");
    let runtime = common::paths::runtime();
    for url in urls.split(',') {
        let mut blocking = MysqlConnection::establish(url).expect("the node answers");
        assert!(
            <Mysql as OccBackend>::applies_writes_late(&mut blocking),
            "{url}: blocking"
        );
        let mut conn = runtime
            .block_on(diesel_async::AsyncMysqlConnection::establish(url))
            .expect("the node answers");
        let late = runtime.block_on(<Mysql as NativeAsync>::applies_writes_late(&mut conn));
        assert!(late, "{url}: async");
    }
}

/// 8 tasks on three nodes take one lock 50 times each through the async `lock`: never two
/// holders at once, every grant shown by its node's row, fences rising with each grant.
#[cfg(all(feature = "async-mysql", feature = "bb8", feature = "locks"))]
#[test]
fn async_lock_rounds_on_three_nodes_have_one_holder_and_rising_fences() {
    use diesel_occ::asynchronous::AsyncLocks;
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, Mutex};

    let Some(cluster) = cluster() else { return };
    let (runtime, pools) = on_async::pools(&cluster);
    for round in 0..rounds() {
        let resource = Arc::new(format!("async-round-{round}"));
        let inside = Arc::new(AtomicBool::new(false));
        let fences = Arc::new(Mutex::new(Vec::new()));
        let (r, i, f) = (resource.clone(), inside.clone(), fences.clone());
        let outcomes = on_async::run(&runtime, &pools, move |t, pool| {
            let (resource, inside, fences) = (r.clone(), i.clone(), f.clone());
            async move {
                let locks = AsyncLocks::new(pool.clone());
                let guard = locks
                    .lock(
                        "cluster",
                        &resource,
                        Duration::from_secs(30),
                        Some("test"),
                        Duration::from_secs(60),
                        &quick(),
                    )
                    .await?;
                assert!(
                    !inside.swap(true, Ordering::SeqCst),
                    "round {round}: two holders at once"
                );
                fences.lock().unwrap().push(guard.fence());
                let mut check = pool.get().await.unwrap();
                let query = diesel::sql_query(
                    "SELECT fence AS value FROM occ_locks WHERE lock_name = 'cluster' AND resource = ?",
                )
                .bind::<diesel::sql_types::Text, _>(resource.as_str());
                let row: FenceRow = diesel_async::RunQueryDsl::get_result(query, &mut *check)
                    .await
                    .unwrap();
                assert_eq!(
                    row.value,
                    guard.fence(),
                    "round {round}: task {t} was granted a fence its node's row does not show"
                );
                drop(check);
                inside.store(false, Ordering::SeqCst);
                guard.release().await
            }
        });
        let fences = Arc::into_inner(fences).unwrap().into_inner().unwrap();
        assert_grants(round, &fences, &outcomes);
        eprintln!("round {round}: {} async grants, {outcomes:?}", fences.len());
    }
}
