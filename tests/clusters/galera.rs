//! A MariaDB Galera cluster of three nodes (`scripts/galera.sh`): the library's promises
//! when each writer talks to another node. A transaction that loses certification is
//! aborted at its `COMMIT` (or at the statement after the abort), and must come back as a
//! retry, never as a raw error or a connection whose transaction manager is broken.
//!
//! The URLs of the nodes come from `GALERA_URLS` (comma-separated); without it the tests
//! are skipped, unless `OCC_REQUIRE_CLUSTER` is set. Each test runs `OCC_CLUSTER_ROUNDS`
//! rounds (default 20) of 8 threads x 50 operations, spread over the nodes, and checks
//! the end state exactly on every node. Each body runs on the blocking API (r2d2 pools)
//! and on the async API (bb8 pools of diesel-async's MySQL connections, each thread
//! blocking on a shared multi-thread runtime).

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
    /// Runs `op(thread, i, worker)` until it succeeds `OPERATIONS` times in each of
    /// `THREADS` threads, thread `t` on node `t % 3` with a connection of that node
    /// (`driver`'s worker). A retryable error counts as a retry. A call whose connection
    /// the server ended (a call the node left waiting for a reply, ended by the idle bound
    /// of `MysqlSettings`) counts as lost, and the thread takes another connection, as a
    /// web back end's next request would; when that happened at the `COMMIT` the outcome
    /// is ambiguous and counted apart. Any other error fails the test.
    fn run<D: Driver>(
        &self,
        driver: &D,
        op: impl Fn(usize, usize, &mut D::Worker) -> Result<(), Error> + Sync,
    ) -> Outcomes {
        let outcomes = Outcomes::default();
        let start = Barrier::new(THREADS);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (op, outcomes, start) = (&op, &outcomes, &start);
                let node = t % self.pools.len();
                s.spawn(move || {
                    let mut worker = driver.worker(node);
                    start.wait();
                    let mut i = 0;
                    while i < OPERATIONS {
                        match op(t, i, &mut worker) {
                            Ok(()) => i += 1,
                            Err(e)
                                if e.is_retryable()
                                    || matches!(e, Error::RetriesExhausted { .. }) =>
                            {
                                outcomes.retried.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(Error::Ambiguous { .. }) => {
                                outcomes.ambiguous.fetch_add(1, Ordering::Relaxed);
                                worker = driver.worker(node);
                            }
                            Err(Error::Database(source)) if lost_connection(&source) => {
                                outcomes.lost.fetch_add(1, Ordering::Relaxed);
                                worker = driver.worker(node);
                            }
                            Err(e) => panic!("{}: thread {t}, operation {i}: {e:?}", D::NAME),
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

/// The library's calls these tests make, on one driver. Node `n` is the cluster's `n`th
/// URL, in the test's database.
trait Driver: Sync + Sized {
    /// Which API, for messages.
    const NAME: &'static str;
    /// What a thread holds: a connection of its node.
    type Worker;
    /// A pool on a URL of the test's own (the read-only node's unprivileged user).
    type Single;
    /// A held lock.
    type Guard;

    fn on(cluster: &Cluster) -> Self;
    fn worker(&self, node: usize) -> Self::Worker;
    /// `Counter::modify` of counter `name` on the worker's connection, adding one.
    fn increment_counter(&self, worker: &mut Self::Worker, name: &str) -> Result<(), Error>;
    /// `Order::modify_pooled` of order `id` on node `node`'s pool, adding one to its
    /// quantity, with the default policy.
    fn increment_order_pooled(&self, node: usize, id: i64) -> Result<(), Error>;
    /// `Profile::merge_json` of `patch` into profile `id`'s `ext`.
    fn merge_json(
        &self,
        worker: &mut Self::Worker,
        id: i64,
        patch: &serde_json::Value,
    ) -> Result<(), Error>;
    /// A pool of one connection on `url`.
    fn single(&self, url: &str) -> Self::Single;
    /// `session`, then `Order::modify` of order `id` (adding one to its quantity), on the
    /// pool's connection: the answer and how many attempts the closure saw.
    fn increment_order_on(
        &self,
        single: &Self::Single,
        session: &str,
        id: i64,
    ) -> (Result<(), Error>, usize);
    /// `session`, then `try_lock` of `("read-only", resource)` on the pool's connection,
    /// released at once. (The pool replaced the connection that met a read-only refusal,
    /// so the session is set again.)
    fn try_lock_on(
        &self,
        single: &Self::Single,
        session: &str,
        resource: &str,
    ) -> Result<(), Error>;
    /// `lock` of `("cluster", resource)` on node `node`, waiting up to a minute.
    fn lock(&self, node: usize, resource: &str) -> Result<Self::Guard, Error>;
    fn fence(guard: &Self::Guard) -> i64;
    fn release(&self, guard: Self::Guard) -> Result<(), Error>;
    /// The fence of lock `("cluster", resource)` as node `node`'s row shows it, read on the
    /// driver's own connection of that node.
    fn fence_on_node(&self, node: usize, resource: &str) -> i64;
    /// Sends a statement that reads no table on `worker` (errors ignored), so that its
    /// session is not idle.
    fn ping(&self, worker: &mut Self::Worker);
}

/// The fence of lock `("cluster", resource)`.
fn fence_query(
    resource: &str,
) -> diesel::query_builder::BoxedSqlQuery<
    'static,
    diesel::mysql::Mysql,
    diesel::query_builder::SqlQuery,
> {
    diesel::sql_query(
        "SELECT fence AS value FROM occ_locks WHERE lock_name = 'cluster' AND resource = ?",
    )
    .into_boxed()
    .bind::<diesel::sql_types::Text, _>(resource.to_string())
}

/// The blocking API on the cluster's r2d2 pools.
struct Blocking {
    pools: Vec<Pool>,
}

impl Driver for Blocking {
    const NAME: &'static str = "blocking";
    type Worker = diesel_occ::Pooled<MysqlConnection>;
    type Single = Pool;
    type Guard = diesel_occ::LockGuard<Pool>;

    fn on(cluster: &Cluster) -> Self {
        Blocking {
            pools: cluster.pools.clone(),
        }
    }
    fn worker(&self, node: usize) -> Self::Worker {
        self.pools[node].get().expect("a connection")
    }
    fn increment_counter(&self, worker: &mut Self::Worker, name: &str) -> Result<(), Error> {
        Counter::modify(worker, &name.to_string(), &quick(), |c| {
            c.value += 1;
            Ok::<_, Error>(())
        })
        .map(drop)
    }
    fn increment_order_pooled(&self, node: usize, id: i64) -> Result<(), Error> {
        Order::modify_pooled(&self.pools[node], &id, &RetryPolicy::default(), |o| {
            o.quantity += 1;
            Ok::<_, Error>(())
        })
        .map(drop)
    }
    fn merge_json(
        &self,
        worker: &mut Self::Worker,
        id: i64,
        patch: &serde_json::Value,
    ) -> Result<(), Error> {
        Profile::merge_json(worker, &id, profiles::ext, patch, &quick()).map(drop)
    }
    fn single(&self, url: &str) -> Self::Single {
        let config = PoolConfig {
            max_size: 1,
            ..common::pool_config()
        };
        diesel_occ::mysql_pool(url, &config).expect("a pool on the URL")
    }
    fn increment_order_on(
        &self,
        single: &Self::Single,
        session: &str,
        id: i64,
    ) -> (Result<(), Error>, usize) {
        let conn = &mut single.get().unwrap();
        conn.batch_execute(session).unwrap();
        let mut attempts = 0;
        let done = Order::modify(conn, &id, &RetryPolicy::default(), |o| {
            attempts += 1;
            o.quantity += 1;
            Ok::<_, Error>(())
        });
        (done.map(drop), attempts)
    }
    fn try_lock_on(
        &self,
        single: &Self::Single,
        session: &str,
        resource: &str,
    ) -> Result<(), Error> {
        single.get().unwrap().batch_execute(session).unwrap();
        diesel_occ::Locks::new(single.clone())
            .try_lock("read-only", resource, Duration::from_secs(30), None)?
            .release()
    }
    fn lock(&self, node: usize, resource: &str) -> Result<Self::Guard, Error> {
        diesel_occ::Locks::new(self.pools[node].clone()).lock(
            "cluster",
            resource,
            Duration::from_secs(30),
            Some("test"),
            Duration::from_secs(60),
            &quick(),
        )
    }
    fn fence(guard: &Self::Guard) -> i64 {
        guard.fence()
    }
    fn release(&self, guard: Self::Guard) -> Result<(), Error> {
        guard.release()
    }
    fn ping(&self, worker: &mut Self::Worker) {
        let _ = worker.batch_execute("DO 1");
    }
    fn fence_on_node(&self, node: usize, resource: &str) -> i64 {
        let row: FenceRow = fence_query(resource)
            .get_result(&mut self.pools[node].get().unwrap())
            .unwrap();
        row.value
    }
}

/// The async API on the cluster: diesel-async's MySQL client (mysql_async), a bb8 pool
/// per node set up by `MysqlSettings::async_manager_config` (a reply a node never sends
/// ends with the session's `wait_timeout`; reads are causal), every thread blocking on
/// one multi-thread runtime.
#[cfg(all(feature = "async-mysql", feature = "bb8"))]
mod async_driver {
    use super::*;
    use diesel_async::pooled_connection::bb8;
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    use diesel_async::{AsyncMysqlConnection, SimpleAsyncConnection};
    use diesel_occ::asynchronous::{
        AsyncGuardedJson, AsyncGuardedModify, AsyncLockGuard, AsyncLocks,
    };

    pub type AsyncPool = bb8::Pool<AsyncMysqlConnection>;

    pub struct OnAsync {
        pools: Vec<AsyncPool>,
        /// Dropped after the pools.
        runtime: tokio::runtime::Runtime,
    }

    impl OnAsync {
        fn pool_on(&self, url: &str, size: u32) -> AsyncPool {
            let settings = diesel_occ::MysqlSettings {
                idle_session_timeout: Duration::from_secs(2),
            };
            let manager = AsyncDieselConnectionManager::<AsyncMysqlConnection>::new_with_config(
                url,
                settings.async_manager_config(diesel_occ::PoolConfig::default().reply_timeout),
            );
            self.runtime
                .block_on(bb8::Pool::builder().max_size(size).build(manager))
                .expect("a bb8 pool")
        }
    }

    impl Driver for OnAsync {
        const NAME: &'static str = "async";
        type Worker = bb8::PooledConnection<'static, AsyncMysqlConnection>;
        type Single = AsyncPool;
        type Guard = AsyncLockGuard<AsyncPool>;

        fn on(cluster: &Cluster) -> Self {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let mut driver = OnAsync {
                pools: Vec::new(),
                runtime,
            };
            let urls = std::env::var("GALERA_URLS").expect("set, as cluster() found");
            driver.pools = urls
                .split(',')
                .map(|url| {
                    let url = common::with_database(url, &cluster.database);
                    driver.pool_on(&url, THREADS as u32)
                })
                .collect();
            driver
        }
        fn worker(&self, node: usize) -> Self::Worker {
            self.runtime
                .block_on(self.pools[node].get_owned())
                .expect("a connection")
        }
        fn increment_counter(&self, worker: &mut Self::Worker, name: &str) -> Result<(), Error> {
            let name = name.to_string();
            self.runtime.block_on(async {
                <Counter as AsyncGuardedModify>::modify(&mut **worker, &name, &quick(), |c| {
                    c.value += 1;
                    Ok::<_, Error>(())
                })
                .await
                .map(drop)
            })
        }
        fn increment_order_pooled(&self, node: usize, id: i64) -> Result<(), Error> {
            let pool = &self.pools[node];
            self.runtime.block_on(async {
                let policy = RetryPolicy::default();
                <Order as AsyncGuardedModify>::modify_pooled(pool, &id, &policy, |o| {
                    o.quantity += 1;
                    Ok::<_, Error>(())
                })
                .await
                .map(drop)
            })
        }
        fn merge_json(
            &self,
            worker: &mut Self::Worker,
            id: i64,
            patch: &serde_json::Value,
        ) -> Result<(), Error> {
            self.runtime.block_on(async {
                <Profile as AsyncGuardedJson>::merge_json(
                    &mut **worker,
                    &id,
                    profiles::ext,
                    patch,
                    &quick(),
                )
                .await
                .map(drop)
            })
        }
        fn single(&self, url: &str) -> Self::Single {
            self.pool_on(url, 1)
        }
        fn increment_order_on(
            &self,
            single: &Self::Single,
            session: &str,
            id: i64,
        ) -> (Result<(), Error>, usize) {
            let attempts = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let counted = attempts.clone();
            let done = self.runtime.block_on(async {
                let mut conn = single.get().await.unwrap();
                conn.batch_execute(session).await.unwrap();
                let policy = RetryPolicy::default();
                <Order as AsyncGuardedModify>::modify(&mut *conn, &id, &policy, move |o| {
                    counted.fetch_add(1, Ordering::SeqCst);
                    o.quantity += 1;
                    Ok::<_, Error>(())
                })
                .await
                .map(drop)
            });
            (done, attempts.load(Ordering::SeqCst))
        }
        fn try_lock_on(
            &self,
            single: &Self::Single,
            session: &str,
            resource: &str,
        ) -> Result<(), Error> {
            self.runtime.block_on(async {
                single
                    .get()
                    .await
                    .unwrap()
                    .batch_execute(session)
                    .await
                    .unwrap();
                AsyncLocks::new(single.clone())
                    .try_lock("read-only", resource, Duration::from_secs(30), None)
                    .await?
                    .release()
                    .await
            })
        }
        fn lock(&self, node: usize, resource: &str) -> Result<Self::Guard, Error> {
            let locks = AsyncLocks::new(self.pools[node].clone());
            self.runtime.block_on(locks.lock(
                "cluster",
                resource,
                Duration::from_secs(30),
                Some("test"),
                Duration::from_secs(60),
                &quick(),
            ))
        }
        fn fence(guard: &Self::Guard) -> i64 {
            guard.fence()
        }
        fn release(&self, guard: Self::Guard) -> Result<(), Error> {
            self.runtime.block_on(guard.release())
        }
        fn fence_on_node(&self, node: usize, resource: &str) -> i64 {
            self.runtime.block_on(async {
                let mut conn = self.pools[node].get().await.unwrap();
                let row: FenceRow =
                    diesel_async::RunQueryDsl::get_result(fence_query(resource), &mut *conn)
                        .await
                        .unwrap();
                row.value
            })
        }
        fn ping(&self, worker: &mut Self::Worker) {
            let _ = self.runtime.block_on(worker.batch_execute("DO 1"));
        }
    }
}

/// Runs `body` on a fresh database of the cluster with driver `D`.
fn run<D: Driver>(body: fn(&Cluster, &D)) {
    let Some(cluster) = cluster() else { return };
    let driver = D::on(&cluster);
    body(&cluster, &driver);
}

/// Each body as a `blocking` and an `on_async` test.
macro_rules! on_both_drivers {
    ($($(#[$meta:meta])* $body:ident),* $(,)?) => {
        mod blocking {
            $( $(#[$meta])* #[test] fn $body() { super::run::<super::Blocking>(super::$body) } )*
        }
        #[cfg(all(feature = "async-mysql", feature = "bb8"))]
        mod on_async {
            $( $(#[$meta])* #[test] fn $body() {
                super::run::<super::async_driver::OnAsync>(super::$body)
            } )*
        }
    };
}

on_both_drivers!(
    read_modify_writes_on_three_nodes_lose_nothing,
    pooled_read_modify_writes_with_the_default_policy_lose_nothing,
    json_merges_on_three_nodes_keep_every_key,
    writes_on_a_read_only_node_are_read_only,
    #[cfg(feature = "locks")]
    lock_rounds_on_three_nodes_have_one_holder_and_rising_fences,
    a_node_cut_off_from_the_cluster_answers_a_retry,
);

/// Node 3 cut off from the others (`gmcast.isolate`) until dropped: then it rejoins, and
/// the drop returns once it is synced again.
struct CutOff(MysqlConnection);

impl CutOff {
    /// Cuts node 3 off, calling `keep` while it waits for the node to leave.
    fn node_3(cluster: &Cluster, mut keep: impl FnMut()) -> CutOff {
        let urls = std::env::var("GALERA_URLS").expect("GALERA_URLS");
        let url =
            common::with_database(urls.split(',').nth(2).expect("3 nodes"), &cluster.database);
        let mut conn = MysqlConnection::establish(&url).expect("node 3 answers");
        conn.batch_execute("SET GLOBAL wsrep_provider_options = 'gmcast.isolate=1'")
            .expect("node 3 cut off");
        // Out of the primary component once the others stop hearing from it.
        let out = (0..300).any(|_| {
            std::thread::sleep(Duration::from_millis(100));
            keep();
            conn.batch_execute("SELECT 1 FROM counters LIMIT 1")
                .is_err()
        });
        assert!(out, "node 3 still answers 30 s after it was cut off");
        CutOff(conn)
    }
}

impl Drop for CutOff {
    fn drop(&mut self) {
        let conn = &mut self.0;
        let _ = conn.batch_execute("SET GLOBAL wsrep_provider_options = 'gmcast.isolate=0'");
        let synced = (0..600).any(|_| {
            std::thread::sleep(Duration::from_millis(100));
            diesel::sql_query("SHOW STATUS LIKE 'wsrep_local_state_comment'")
                .get_result::<Status>(conn)
                .is_ok_and(|s| s.value == "Synced")
                && conn.batch_execute("SELECT 1 FROM counters LIMIT 1").is_ok()
        });
        if !synced && !std::thread::panicking() {
            panic!("node 3 not synced 60 s after it rejoined");
        }
    }
}

#[derive(QueryableByName)]
struct Status {
    #[diesel(sql_type = diesel::sql_types::Text, column_name = "Value")]
    value: String,
}

/// A node outside the cluster's primary component runs no statement (MariaDB 1047, "WSREP
/// has not yet prepared node for application use"): nothing was written, so a
/// read-modify-write on a connection of that node answers a retry, never a raw error.
/// (The soak on the Galera test bed found it raw, with a node restarted.)
fn a_node_cut_off_from_the_cluster_answers_a_retry<D: Driver>(cluster: &Cluster, d: &D) {
    let name = format!("cut-off-{}", D::NAME);
    let counter = Counter {
        name: name.clone(),
        value: 0,
        rev: 0,
    };
    diesel::insert_into(counters::table)
        .values(&counter)
        .execute(&mut cluster.pools[0].get().unwrap())
        .unwrap();
    // Replicated to node 3 before it is cut off: a causal read there sees it.
    let mut worker = d.worker(2);
    cluster.on_every_node(|conn| counters::table.find(&name).count().get_result::<i64>(conn));
    // The worker's session is kept busy while the node leaves: the test pools end idle
    // sessions after 2 s.
    let cut_off = CutOff::node_3(cluster, || d.ping(&mut worker));
    let answered = d.increment_counter(&mut worker, &name);
    let refused = match &answered {
        Err(Error::RetriesExhausted { last, .. }) => last.as_ref(),
        other => other
            .as_ref()
            .expect_err("no write can land on a node cut off"),
    };
    assert!(
        matches!(
            refused,
            Error::Retryable {
                reason: diesel_occ::RetryReason::NodeNotReady,
                ..
            }
        ),
        "{}: {answered:?}",
        D::NAME
    );
    drop(worker);
    drop(cut_off);
    let values = cluster.on_every_node(|conn| {
        counters::table
            .find(&name)
            .select(counters::value)
            .get_result::<i64>(conn)
    });
    assert_eq!(values, vec![0, 0, 0], "nothing was written");
}

/// 8 threads x 50 read-modify-writes of one counter, each thread on its own connection of
/// its node: a certification abort at `COMMIT` is retried, and nothing is lost.
fn read_modify_writes_on_three_nodes_lose_nothing<D: Driver>(cluster: &Cluster, d: &D) {
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
        let retries = cluster.run(d, |_, _, worker| d.increment_counter(worker, &name));
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
                "{}, round {round}: {value} after {done} successes, {retries:?}",
                D::NAME
            );
            assert_eq!(
                value,
                i64::from(revision),
                "{}, round {round}: one version per landed write",
                D::NAME
            );
        }
        eprintln!(
            "{}, round {round}: {} read-modify-writes, {retries:?}",
            D::NAME,
            THREADS * OPERATIONS
        );
    }
}

/// 8 threads x 50 read-modify-writes through `modify_pooled` with the default policy (a
/// connection per attempt), spread over the nodes: nothing is lost.
fn pooled_read_modify_writes_with_the_default_policy_lose_nothing<D: Driver>(
    cluster: &Cluster,
    d: &D,
) {
    for round in 0..rounds() {
        let id = round as i64 + 1;
        diesel::sql_query(format!(
            "INSERT INTO orders (id, customer, note, status, quantity, version) VALUES ({id}, 'c', '', 'valid', 0, 0)"
        ))
        .execute(&mut cluster.pools[0].get().unwrap())
        .unwrap();
        let nodes = cluster.pools.len();
        let retries = cluster.run(d, |t, _, _| d.increment_order_pooled(t % nodes, id));
        cluster.assert_order_landed(id, round, &retries);
        eprintln!(
            "{}, round {round}: {} pooled read-modify-writes, {retries:?}",
            D::NAME,
            THREADS * OPERATIONS
        );
    }
}

/// 8 threads x 50 JSON merges of a key of their own into one document, spread over the
/// nodes: every key is there on every node.
fn json_merges_on_three_nodes_keep_every_key<D: Driver>(cluster: &Cluster, d: &D) {
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
        let retries = cluster.run(d, |t, i, worker| {
            d.merge_json(worker, id, &json!({ format!("t{t}-{i}"): i }))
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
                "{}, round {round}: a merge lost keys",
                D::NAME
            );
            let landed = THREADS * OPERATIONS..=THREADS * OPERATIONS + retries.ambiguous();
            assert!(
                landed.contains(&(version as usize)),
                "{}, round {round}: version {version}, {retries:?}",
                D::NAME
            );
        }
        eprintln!(
            "{}, round {round}: {} merges, {retries:?}",
            D::NAME,
            THREADS * OPERATIONS
        );
    }
}

/// A node set `read_only` (as a replica would be) refuses a writer without the admin
/// privilege with 1290: a guarded read-modify-write and a lock come back as
/// `Error::ReadOnly` at once, in any message language, and nothing is written.
fn writes_on_a_read_only_node_are_read_only<D: Driver>(cluster: &Cluster, d: &D) {
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
        // One connection at a time: each call runs on the session whose language was set.
        let single = d.single(&url);
        for language in ["de_DE", "en_US"] {
            let session = format!("SET lc_messages = '{language}'");
            let (done, attempts) = d.increment_order_on(&single, &session, 1);
            let err = done.unwrap_err();
            assert!(
                matches!(err, Error::ReadOnly { .. }),
                "{}, {language}: {err:?}",
                D::NAME
            );
            assert_eq!(attempts, 1, "{}, {language}: not retried", D::NAME);
            if language == "de_DE" {
                assert!(
                    err.to_string().contains("Anweisung"),
                    "{}: the server answered in German: {err}",
                    D::NAME
                );
            }
            #[cfg(feature = "locks")]
            {
                let err = d.try_lock_on(&single, &session, language).unwrap_err();
                assert!(
                    matches!(err, Error::ReadOnly { .. }),
                    "{}, {language}: {err:?}",
                    D::NAME
                );
            }
        }
        let quantity: i32 = orders::table
            .find(1)
            .select(orders::quantity)
            .first(&mut cluster.pools[2].get().unwrap())
            .unwrap();
        assert_eq!(quantity, 0, "{}: nothing was written", D::NAME);
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
fn assert_grants(name: &str, round: usize, fences: &[i64], outcomes: &Outcomes) {
    assert_eq!(fences.len(), THREADS * OPERATIONS, "{name}");
    assert_eq!(
        outcomes.ambiguous(),
        0,
        "{name}, round {round}: ambiguous grants, {outcomes:?}"
    );
    assert!(
        fences.windows(2).all(|pair| pair[0] < pair[1]),
        "{name}, round {round}: fences that do not rise with each grant: {fences:?}"
    );
}

/// A lock row's fence.
#[derive(diesel::QueryableByName)]
struct FenceRow {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    value: i64,
}

/// 8 threads on three nodes take one lock 50 times each (waiting for it with `lock`):
/// never two holders at once, every grant shown by its node's row, and the fences rise
/// with every grant, in the order the grants happened.
#[cfg(feature = "locks")]
fn lock_rounds_on_three_nodes_have_one_holder_and_rising_fences<D: Driver>(
    cluster: &Cluster,
    d: &D,
) {
    use std::sync::atomic::AtomicBool;
    use std::sync::Mutex;

    let nodes = cluster.pools.len();
    for round in 0..rounds() {
        let resource = format!("round-{round}");
        let inside = AtomicBool::new(false);
        let fences = Mutex::new(Vec::new());
        let retries = cluster.run(d, |t, _, _| {
            let node = t % nodes;
            let guard = d.lock(node, &resource)?;
            assert!(
                !inside.swap(true, Ordering::SeqCst),
                "{}, round {round}: two holders at once",
                D::NAME
            );
            fences.lock().unwrap().push(D::fence(&guard));
            // From the database: the node this thread talks to shows the grant (no phantom
            // grant of a transaction the node had aborted).
            assert_eq!(
                d.fence_on_node(node, &resource),
                D::fence(&guard),
                "{}, round {round}: thread {t} was granted a fence its node's row does not show",
                D::NAME
            );
            inside.store(false, Ordering::SeqCst);
            d.release(guard)
        });
        let fences = fences.into_inner().unwrap();
        assert_grants(D::NAME, round, &fences, &retries);
        eprintln!(
            "{}, round {round}: {} grants, {retries:?}",
            D::NAME,
            fences.len()
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

/// A copy written on node 1, then written again at once through node 2 on a session
/// without causal reads (`wsrep_sync_wait = 0`), as a user's own pool may have it: node 2
/// may not yet have applied node 1's commit, and then it misses the write. Its re-read
/// shows a row older than the copy: a server behind the caller (`Error::Retryable`,
/// `ReadBehind`), never a `Conflict` whose current row is older than the copy (seen in
/// 13-14 % of such rounds before); or, when node 2 applied the commit between the write
/// and the re-read, the copy's own row: the write ran before the node caught up
/// (`Error::Retryable`). Nobody else writes the rows, so every other answer is a
/// success, and the rows end as the answers say on every node.
fn a_node_behind_the_copy_answers_a_retry_not_a_conflict<W>(cluster: &Cluster, mut node_2: W)
where
    W: common::drivers::Update<Counter, diesel::dsl::Eq<counters::value, i64>>,
{
    use common::drivers::Update as _;
    // At least the rounds asked for, and on until node 2 was seen behind: how often it is
    // varies with the machine's load (none in 80 rounds was seen once on CI's 2 cores).
    let (least, most) = (10 * rounds(), 2_000);
    let (mut landed, mut retries) = (0, std::collections::BTreeMap::new());
    let mut rounds = 0;
    for round in 0..most {
        if round >= least && !retries.is_empty() {
            break;
        }
        rounds += 1;
        let mut copy = Counter {
            name: format!("behind-{round}"),
            value: 0,
            rev: 1,
        };
        diesel::insert_into(counters::table)
            .values(&copy)
            .execute(&mut cluster.pools[0].get().unwrap())
            .unwrap();
        // Node 2 has the row (a causal read waits for it): only the update can be missing
        // there. A row a node has not received at all reads as gone, which no library can
        // tell from a delete without causal reads.
        counters::table
            .find(&copy.name)
            .count()
            .get_result::<i64>(&mut cluster.pools[1].get().unwrap())
            .unwrap();
        let mut node_1 = common::drivers::Blocking(cluster.pools[0].get().unwrap());
        copy.rev = node_1.update(&copy, counters::value.eq(1)).unwrap();
        match node_2.update(&copy, counters::value.eq(2)) {
            Ok(_) => landed += 1,
            // Behind (ReadBehind), caught up between the write and its re-read
            // (SerializationFailure), or aborted while applying node 1's commit (Deadlock):
            // nothing written in each case.
            Err(Error::Retryable { reason, .. }) => {
                *retries.entry(format!("{reason:?}")).or_insert(0) += 1
            }
            other => panic!("round {round}: expected success or a retry, got {other:?}"),
        }
    }
    eprintln!("{rounds} rounds: {landed} landed on node 2, retries {retries:?}");
    assert!(
        !retries.is_empty(),
        "node 2 was never behind in {rounds} rounds: the test showed nothing"
    );
    let landed_rows = cluster.on_every_node(|conn| {
        counters::table
            .filter(counters::name.like("behind-%").and(counters::value.eq(2)))
            .count()
            .get_result::<i64>(conn)
    });
    assert_eq!(
        landed_rows,
        vec![landed as i64; 3],
        "the rows as the answers say"
    );
}

/// A connection to node 2 without causal reads.
fn without_causal_reads(cluster: &Cluster) -> String {
    let urls = std::env::var("GALERA_URLS").expect("GALERA_URLS");
    common::with_database(urls.split(',').nth(1).expect("3 nodes"), &cluster.database)
}

#[test]
fn blocking_a_node_behind_the_copy_answers_a_retry_not_a_conflict() {
    let Some(cluster) = cluster() else { return };
    let mut conn = MysqlConnection::establish(&without_causal_reads(&cluster)).unwrap();
    conn.batch_execute("SET SESSION wsrep_sync_wait = 0")
        .unwrap();
    a_node_behind_the_copy_answers_a_retry_not_a_conflict(
        &cluster,
        common::drivers::Blocking(conn),
    );
}

#[cfg(feature = "async-mysql")]
#[test]
fn async_a_node_behind_the_copy_answers_a_retry_not_a_conflict() {
    use common::paths::AsyncOf;
    use diesel_async::SimpleAsyncConnection;
    let Some(cluster) = cluster() else { return };
    let runtime = common::paths::runtime();
    let mut conn = MysqlConnection::connect(&without_causal_reads(&cluster), &runtime);
    runtime
        .block_on(conn.batch_execute("SET SESSION wsrep_sync_wait = 0"))
        .unwrap();
    a_node_behind_the_copy_answers_a_retry_not_a_conflict(
        &cluster,
        common::drivers::Async { conn, runtime },
    );
}

/// Inside a transaction the caller opened on node 2, a write holds a row that a commit on
/// node 1 then changes: node 2 aborts the transaction to apply that commit, and reports
/// the abort at the transaction's next statement, `ROLLBACK` included (MariaDB 1213).
/// Returns once node 2 has applied it (a causal read there waits for that).
fn abort_under(pools: &[Pool], name: &str) {
    diesel::update(counters::table.find(name))
        .set(counters::value.eq(100))
        .execute(&mut pools[0].get().unwrap())
        .unwrap();
    let applied: i64 = counters::table
        .find(name)
        .select(counters::value)
        .get_result(&mut pools[1].get().unwrap())
        .unwrap();
    assert_eq!(applied, 100);
}

fn counter_named(cluster: &Cluster, name: &str) {
    diesel::insert_into(counters::table)
        .values(&Counter {
            name: name.into(),
            value: 0,
            rev: 1,
        })
        .execute(&mut cluster.pools[0].get().unwrap())
        .unwrap();
}

/// The caller's own transaction, ended by the caller's error right after node 2 aborted
/// it: diesel's `transaction` sends `ROLLBACK`, which fails with the abort, and marks the
/// connection broken for good (every later transaction: `BrokenTransactionManager`).
/// The library's `write_transaction` ends it as its own transactions are ended: the
/// caller's error comes back, and the connection stays usable.
#[test]
fn blocking_a_galera_abort_at_rollback_leaves_write_transaction_usable() {
    use diesel_occ::WriteTransaction;
    let Some(cluster) = cluster() else { return };
    let on_node_2 = || MysqlConnection::establish(&without_causal_reads(&cluster)).unwrap();
    let touch = |conn: &mut MysqlConnection, name: &str| {
        diesel::update(counters::table.find(name))
            .set(counters::value.eq(counters::value + 1))
            .execute(conn)
    };

    counter_named(&cluster, "diesel-rollback");
    let mut conn = on_node_2();
    let answer = conn.transaction::<(), diesel::result::Error, _>(|c| {
        touch(c, "diesel-rollback")?;
        abort_under(&cluster.pools, "diesel-rollback");
        Err(diesel::result::Error::RollbackTransaction)
    });
    assert!(answer.is_err());
    let after = conn.transaction::<_, diesel::result::Error, _>(|c| touch(c, "diesel-rollback"));
    assert!(
        matches!(after, Err(diesel::result::Error::BrokenTransactionManager)),
        "diesel's own transaction after the abort: {after:?}"
    );

    counter_named(&cluster, "library-rollback");
    let mut conn = on_node_2();
    let answer = conn.write_transaction::<(), Error, _>(|c| {
        touch(c, "library-rollback")?;
        abort_under(&cluster.pools, "library-rollback");
        Err(Error::Database(diesel::result::Error::RollbackTransaction))
    });
    assert!(
        matches!(
            answer,
            Err(Error::Database(diesel::result::Error::RollbackTransaction))
        ),
        "the caller's own error: {answer:?}"
    );
    let after = conn.write_transaction::<_, Error, _>(|c| Ok(touch(c, "library-rollback")?));
    assert_eq!(after.expect("the connection is usable"), 1);
    let value: i64 = counters::table
        .find("library-rollback")
        .select(counters::value)
        .get_result(&mut conn)
        .unwrap();
    assert_eq!(value, 101, "node 1's write, then the next transaction's");
}

#[cfg(feature = "async-mysql")]
#[test]
fn async_a_galera_abort_at_rollback_leaves_write_transaction_usable() {
    use common::paths::AsyncOf;
    use diesel_async::AsyncMysqlConnection;
    use diesel_occ::asynchronous::AsyncWriteConnection;
    let bump = || {
        diesel::update(counters::table.find("async-rollback"))
            .set(counters::value.eq(counters::value + 1))
    };
    let Some(cluster) = cluster() else { return };
    counter_named(&cluster, "async-rollback");
    let runtime = common::paths::runtime();
    let mut conn = MysqlConnection::connect(&without_causal_reads(&cluster), &runtime);
    let pools = &cluster.pools[..];
    runtime.block_on(async {
        let answer = conn
            .write_transaction(async move |c: &mut AsyncMysqlConnection| {
                diesel_async::RunQueryDsl::execute(bump(), c).await?;
                abort_under(pools, "async-rollback");
                Err::<(), _>(Error::Database(diesel::result::Error::RollbackTransaction))
            })
            .await;
        assert!(
            matches!(
                answer,
                Err(Error::Database(diesel::result::Error::RollbackTransaction))
            ),
            "the caller's own error: {answer:?}"
        );
        let after = conn
            .write_transaction(async move |c: &mut AsyncMysqlConnection| {
                Ok::<_, Error>(diesel_async::RunQueryDsl::execute(bump(), c).await?)
            })
            .await;
        assert_eq!(after.expect("the connection is usable"), 1);
    });
    let value: i64 = counters::table
        .find("async-rollback")
        .select(counters::value)
        .get_result(&mut cluster.pools[0].get().unwrap())
        .unwrap();
    assert_eq!(value, 101, "node 1's write, then the next transaction's");
}
