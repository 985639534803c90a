//! A PostgreSQL primary with an asynchronous streaming standby (`scripts/pg-replica.sh`):
//! stale copies read on the standby, writes sent to it, and a failover that loses the old
//! primary's last commits.
//!
//! Each body runs on the blocking API (the pair's r2d2 pools) and on the async API (bb8
//! pools of diesel-async connections to the same servers); each run starts a fresh pair
//! with the script, so they need root (or sudo) and run one at a time. They are skipped
//! unless `OCC_PG_REPLICA` is set (`scripts/test.sh` sets it), and fail without it when
//! `OCC_REQUIRE_CLUSTER` is set.

#![cfg(all(feature = "postgres", feature = "locks"))]

use crate::common;

use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::fenced::{protected, Protected, CREATE};
use common::models::Order;
use common::schema::orders;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::PgConnection;
use diesel_occ::{
    CheckedManager, Error, FencedWrite, GuardedModify, GuardedWrite, LockGuard, Locks, PoolConfig,
    RetryPolicy,
};

type Pool = diesel::r2d2::Pool<CheckedManager<PgConnection>>;

/// The pair's ports are fixed: one test at a time.
static PAIR: Mutex<()> = Mutex::new(());

/// Fences below 2^44 are the sequence's value; the bits above, the server's timeline.
const SEQUENCE_BITS: u32 = 44;

fn script(action: &str) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/pg-replica.sh");
    let out = Command::new("bash")
        .args([path, action])
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "pg-replica.sh {action} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// A fresh primary and standby, migrated on the primary (and so on the standby), or
/// `None` (skip).
struct Pair {
    primary: Pool,
    standby: Pool,
    primary_url: String,
    standby_url: String,
}

impl Drop for Pair {
    fn drop(&mut self) {
        // Not `script`: a panic here, while a failed test unwinds, would abort the run.
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/pg-replica.sh");
        let _ = Command::new("bash").args([path, "stop"]).status();
    }
}

/// [`pair`], the pair started by the script's `action` (`start`, `start-sync`).
fn pair_started(action: &str) -> Option<Pair> {
    if std::env::var_os("OCC_PG_REPLICA").is_none() {
        if std::env::var_os("OCC_REQUIRE_CLUSTER").is_some() {
            panic!("OCC_PG_REPLICA is not set, but OCC_REQUIRE_CLUSTER is");
        }
        eprintln!("skipped: OCC_PG_REPLICA is not set (scripts/pg-replica.sh)");
        return None;
    }
    let urls = script(action);
    let (primary_url, standby_url) = urls.trim().split_once(',').expect("two URLs");
    let config = PoolConfig {
        max_size: 4,
        // A checkout is checked only after 500 ms without an answer, and these tests stop,
        // start and promote the servers in less: a connection to the stopped standby,
        // used just before, would be handed out unchecked after the failover (CI saw the
        // test's own read fail with "server closed the connection").
        check_after_idle: Duration::ZERO,
        ..common::pool_config()
    };
    let primary = diesel_occ::postgres_pool(primary_url, &config).expect("primary pool");
    let conn = &mut primary.get().unwrap();
    common::migrate_postgres(conn);
    conn.batch_execute(CREATE).unwrap();
    let standby = diesel_occ::postgres_pool(standby_url, &config).expect("standby pool");
    let pair = Pair {
        primary,
        standby,
        primary_url: primary_url.to_string(),
        standby_url: standby_url.to_string(),
    };
    pair.wait_for_standby();
    Some(pair)
}

impl Pair {
    /// Waits until the standby has replayed everything the primary committed so far.
    fn wait_for_standby(&self) {
        let target: String = diesel::select(diesel::dsl::sql::<diesel::sql_types::Text>(
            "pg_current_wal_lsn()::text",
        ))
        .get_result(&mut self.primary.get().unwrap())
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let replayed = diesel::dsl::sql::<diesel::sql_types::Bool>(&format!(
            "pg_last_wal_replay_lsn() >= '{target}'::pg_lsn"
        ));
        while !diesel::select(replayed.clone())
            .get_result::<bool>(&mut self.standby.get().unwrap())
            .unwrap()
        {
            assert!(
                Instant::now() < deadline,
                "the standby did not catch up in 30 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn order(pool: &Pool, id: i64) -> Order {
    orders::table
        .find(id)
        .select(Order::as_select())
        .first(&mut pool.get().unwrap())
        .unwrap()
}

/// The current row of the `Conflict` that `result` must be.
fn conflicting_row<T: std::fmt::Debug>(result: Result<T, Error>) -> Order {
    match result {
        Err(Error::Conflict(conflict)) => conflict
            .current::<Order>()
            .expect("the current row")
            .clone(),
        other => panic!("not a conflict: {other:?}"),
    }
}

/// Which server of the pair a call goes to.
#[derive(Clone, Copy, Debug)]
enum On {
    Primary,
    /// The standby; after a failover, the promoted server.
    Standby,
}

/// The library's calls these tests make, on one driver.
trait Driver: Sized {
    /// Which API, for messages.
    const NAME: &'static str;
    /// A held lock.
    type Guard;
    /// The driver on `pair`'s two servers.
    fn on(pair: &Pair) -> Self;
    /// `copy.guarded_update` setting the note.
    fn update(&self, on: On, copy: &Order, note: &str) -> Result<(), Error>;
    /// `Order::modify` of order `id` with the default policy.
    fn modify(
        &self,
        on: On,
        id: i64,
        change: impl FnMut(&mut Order) + Send + 'static,
    ) -> Result<(), Error>;
    /// `Protected::write_fenced` of row `id`'s value, carrying `fence`.
    fn write_fenced(&self, on: On, id: i64, fence: i64, value: i64) -> Result<(), Error>;
    /// `try_lock` of `("job", "nightly")` for `ttl`, labelled `label`.
    fn try_lock(&self, on: On, ttl: Duration, label: &str) -> Result<Self::Guard, Error>;
    fn fence(guard: &Self::Guard) -> i64;
    fn release(&self, guard: Self::Guard) -> Result<(), Error>;
}

/// The blocking API on the pair's r2d2 pools.
struct Blocking {
    primary: Pool,
    standby: Pool,
}

impl Blocking {
    fn pool(&self, on: On) -> &Pool {
        match on {
            On::Primary => &self.primary,
            On::Standby => &self.standby,
        }
    }
}

impl Driver for Blocking {
    const NAME: &'static str = "blocking";
    type Guard = LockGuard<Pool>;

    fn on(pair: &Pair) -> Self {
        Blocking {
            primary: pair.primary.clone(),
            standby: pair.standby.clone(),
        }
    }
    fn update(&self, on: On, copy: &Order, note: &str) -> Result<(), Error> {
        let conn = &mut self.pool(on).get().unwrap();
        copy.guarded_update(conn, orders::note.eq(note.to_string()))
            .map(drop)
    }
    fn modify(
        &self,
        on: On,
        id: i64,
        mut change: impl FnMut(&mut Order) + Send + 'static,
    ) -> Result<(), Error> {
        let conn = &mut self.pool(on).get().unwrap();
        Order::modify(conn, &id, &RetryPolicy::default(), |o| {
            change(o);
            Ok::<_, Error>(())
        })
        .map(drop)
    }
    fn write_fenced(&self, on: On, id: i64, fence: i64, value: i64) -> Result<(), Error> {
        let conn = &mut self.pool(on).get().unwrap();
        Protected::write_fenced(
            conn,
            &id,
            protected::last_fence,
            fence,
            protected::value.eq(value),
        )
    }
    fn try_lock(&self, on: On, ttl: Duration, label: &str) -> Result<Self::Guard, Error> {
        Locks::new(self.pool(on).clone()).try_lock("job", "nightly", ttl, Some(label))
    }
    fn fence(guard: &Self::Guard) -> i64 {
        guard.fence()
    }
    fn release(&self, guard: Self::Guard) -> Result<(), Error> {
        guard.release()
    }
}

/// The async API on bb8 pools of diesel-async connections to the pair's servers, driven
/// from the test's thread.
#[cfg(feature = "bb8")]
mod async_driver {
    use super::*;

    use diesel_async::pooled_connection::bb8;
    use diesel_async::AsyncPgConnection;
    use diesel_occ::asynchronous::{
        AsyncFencedWrite, AsyncGuardedModify, AsyncGuardedWrite, AsyncLockGuard, AsyncLocks,
    };

    type AsyncPool = bb8::Pool<AsyncPgConnection>;

    pub struct OnAsync {
        primary: AsyncPool,
        standby: AsyncPool,
        /// Dropped after the pools.
        runtime: tokio::runtime::Runtime,
    }

    impl OnAsync {
        fn pool(&self, on: On) -> &AsyncPool {
            match on {
                On::Primary => &self.primary,
                On::Standby => &self.standby,
            }
        }

        /// A connection to `on`, for the call `call` makes on it.
        fn with_conn<T>(&self, on: On, call: impl AsyncFnOnce(&mut AsyncPgConnection) -> T) -> T {
            self.runtime.block_on(async {
                let mut conn = self.pool(on).get().await.expect("a connection");
                call(&mut conn).await
            })
        }
    }

    impl Driver for OnAsync {
        const NAME: &'static str = "async";
        type Guard = AsyncLockGuard<AsyncPool>;

        fn on(pair: &Pair) -> Self {
            let runtime = common::paths::runtime();
            let build = |url: &str| {
                let manager = common::drivers::manager::<AsyncPgConnection>(url, "postgres");
                runtime.block_on(bb8::Pool::builder().max_size(4).build(manager))
            };
            let primary = build(&pair.primary_url).expect("a bb8 pool on the primary");
            let standby = build(&pair.standby_url).expect("a bb8 pool on the standby");
            OnAsync {
                primary,
                standby,
                runtime,
            }
        }
        fn update(&self, on: On, copy: &Order, note: &str) -> Result<(), Error> {
            let changes = orders::note.eq(note.to_string());
            self.with_conn(on, async |conn| {
                AsyncGuardedWrite::guarded_update(copy, conn, changes)
                    .await
                    .map(drop)
            })
        }
        fn modify(
            &self,
            on: On,
            id: i64,
            mut change: impl FnMut(&mut Order) + Send + 'static,
        ) -> Result<(), Error> {
            let policy = RetryPolicy::default();
            let change = move |o: &mut Order| {
                change(o);
                Ok::<_, Error>(())
            };
            self.with_conn(on, async |conn| {
                <Order as AsyncGuardedModify>::modify(conn, &id, &policy, change)
                    .await
                    .map(drop)
            })
        }
        fn write_fenced(&self, on: On, id: i64, fence: i64, value: i64) -> Result<(), Error> {
            self.with_conn(on, async |conn| {
                <Protected as AsyncFencedWrite>::write_fenced(
                    conn,
                    &id,
                    protected::last_fence,
                    fence,
                    protected::value.eq(value),
                )
                .await
            })
        }
        fn try_lock(&self, on: On, ttl: Duration, label: &str) -> Result<Self::Guard, Error> {
            let locks = AsyncLocks::new(self.pool(on).clone());
            self.runtime
                .block_on(locks.try_lock("job", "nightly", ttl, Some(label)))
        }
        fn fence(guard: &Self::Guard) -> i64 {
            guard.fence()
        }
        fn release(&self, guard: Self::Guard) -> Result<(), Error> {
            self.runtime.block_on(guard.release())
        }
    }
}

/// Runs `body` on a pair the script's `action` started (`start`, `start-sync`), with
/// driver `D`.
fn run<D: Driver>(action: &str, body: fn(&Pair, &D)) {
    let _one = PAIR.lock().unwrap_or_else(|p| p.into_inner());
    let Some(pair) = pair_started(action) else {
        return;
    };
    let driver = D::on(&pair);
    body(&pair, &driver);
}

/// Each body as a `blocking` and an `on_async` test.
macro_rules! on_both_drivers {
    ($($action:literal => $body:ident),* $(,)?) => {
        mod blocking {
            $( #[test] fn $body() { super::run::<super::Blocking>($action, super::$body) } )*
        }
        #[cfg(feature = "bb8")]
        mod on_async {
            $( #[test] fn $body() {
                super::run::<super::async_driver::OnAsync>($action, super::$body)
            } )*
        }
    };
}

on_both_drivers!(
    "start" => a_copy_read_on_the_standby_is_checked_against_the_primary,
    "start" => writes_sent_to_the_standby_are_read_only,
    "start" => fences_keep_rising_across_a_failover_that_loses_commits,
    "start-sync" => a_failover_under_synchronous_replication_loses_no_acknowledged_write,
    "start" => a_version_lost_in_an_asynchronous_failover_is_handed_out_again,
    "start-sync" => under_synchronous_replication_a_copy_of_the_old_primary_conflicts,
);

/// A copy read on the standby and written on the primary after someone else's write is a
/// `Conflict` whose current row is the primary's, whether the standby had replayed that
/// write (a stale read) or not (a lagging standby).
fn a_copy_read_on_the_standby_is_checked_against_the_primary<D: Driver>(pair: &Pair, d: &D) {
    diesel::insert_into(orders::table)
        .values(&Order::new(1, "first"))
        .execute(&mut pair.primary.get().unwrap())
        .unwrap();
    pair.wait_for_standby();

    // Replayed: the standby's copy is stale by the time it is written.
    let copy = order(&pair.standby, 1);
    d.update(On::Primary, &order(&pair.primary, 1), "by another writer")
        .unwrap();
    let current = conflicting_row(d.update(On::Primary, &copy, "from the copy"));
    assert_eq!(
        (current.note.as_str(), current.version),
        ("by another writer", 1),
        "{}",
        D::NAME
    );

    // Lagging: the standby stops replaying, so its copy misses a write it never saw.
    pair.wait_for_standby();
    pair.standby
        .get()
        .unwrap()
        .batch_execute("SELECT pg_wal_replay_pause()")
        .unwrap();
    d.update(
        On::Primary,
        &order(&pair.primary, 1),
        "unseen by the standby",
    )
    .unwrap();
    let lagging = order(&pair.standby, 1);
    assert_eq!(lagging.version, 1, "{}: the standby is behind", D::NAME);
    let current = conflicting_row(d.update(On::Primary, &lagging, "from the lagging copy"));
    assert_eq!(
        (current.note.as_str(), current.version),
        ("unseen by the standby", 2),
        "{}",
        D::NAME
    );
    assert_eq!(
        order(&pair.primary, 1),
        current,
        "{}: nothing else was written",
        D::NAME
    );
}

/// Every kind of write sent to the standby is `ReadOnly`, at once and unretried.
fn writes_sent_to_the_standby_are_read_only<D: Driver>(pair: &Pair, d: &D) {
    diesel::insert_into(orders::table)
        .values(&Order::new(1, "first"))
        .execute(&mut pair.primary.get().unwrap())
        .unwrap();
    pair.wait_for_standby();
    let copy = order(&pair.standby, 1);
    let read_only = |err: Error| {
        assert!(
            matches!(err, Error::ReadOnly { .. }),
            "{}: {err:?}",
            D::NAME
        );
        assert!(!err.is_retryable(), "{}: {err:?}", D::NAME);
    };

    read_only(d.update(On::Standby, &copy, "on the standby").unwrap_err());
    let attempts = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = attempts.clone();
    let modified = d.modify(On::Standby, 1, move |o| {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        o.note = "modified on the standby".into();
    });
    read_only(modified.unwrap_err());
    assert_eq!(
        attempts.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "{}",
        D::NAME
    );
    read_only(d.write_fenced(On::Standby, 1, 1, 1).unwrap_err());
    match d.try_lock(On::Standby, Duration::from_secs(30), "standby") {
        Err(err) => read_only(err),
        Ok(guard) => {
            let fence = D::fence(&guard);
            std::mem::forget(guard);
            panic!("{}: a lock granted on the standby, fence {fence}", D::NAME)
        }
    }
    assert_eq!(
        order(&pair.primary, 1),
        copy,
        "{}: nothing was written",
        D::NAME
    );
}

/// An asynchronous failover that loses the old primary's last commits (grants among
/// them): the promoted standby's fences are above every fence the old primary handed
/// out, though its fence sequence repeats values; a stale holder's fenced write is
/// refused, and its lease is gone.
fn fences_keep_rising_across_a_failover_that_loses_commits<D: Driver>(pair: &Pair, d: &D) {
    let ttl = Duration::from_secs(60);

    // Replicated: one grant, released.
    let before = d.try_lock(On::Primary, ttl, "before").unwrap();
    let first_fence = D::fence(&before);
    d.release(before).unwrap();
    pair.wait_for_standby();

    // Lost: 40 grants (more than the sequence logs ahead, 32) after the standby stopped,
    // the last one still held, and a fenced write with it.
    script("detach");
    for _ in 0..39 {
        let lost = d.try_lock(On::Primary, ttl, "lost").unwrap();
        d.release(lost).unwrap();
    }
    let stale = d.try_lock(On::Primary, ttl, "stale holder").unwrap();
    let lost_fence = D::fence(&stale);
    assert!(lost_fence > first_fence, "{}", D::NAME);
    d.write_fenced(On::Primary, 1, lost_fence, 1).unwrap();

    script("fail-over");
    // The stale holder's grant was lost: the lock is free on the promoted server.
    let holder = d.try_lock(On::Standby, ttl, "new holder").unwrap();
    let fence = D::fence(&holder);
    let mask = (1i64 << SEQUENCE_BITS) - 1;
    assert!(
        fence & mask <= lost_fence & mask,
        "{}: the scenario repeats sequence values ({fence:#x} after {lost_fence:#x}), as the issue saw",
        D::NAME
    );
    assert!(
        fence > lost_fence,
        "{}: the promoted server's fence {fence:#x} is above every fence of the old primary ({lost_fence:#x})",
        D::NAME
    );
    assert_eq!(
        fence >> SEQUENCE_BITS,
        2,
        "{}: the promoted server's timeline",
        D::NAME
    );

    let row = || -> (i64, i64) {
        protected::table
            .find(1)
            .select((protected::value, protected::last_fence))
            .first(&mut pair.standby.get().unwrap())
            .unwrap()
    };
    assert_eq!(
        row(),
        (0, 0),
        "{}: the old primary's fenced write was lost with it",
        D::NAME
    );
    d.write_fenced(On::Standby, 1, fence, 2).unwrap();
    // The stale holder, still believing in its lease, writes to the promoted server.
    match d.write_fenced(On::Standby, 1, lost_fence, 3) {
        Err(Error::StaleFence { presented, current }) => {
            assert_eq!((presented, current), (lost_fence, fence), "{}", D::NAME)
        }
        other => panic!("{}: {other:?}", D::NAME),
    }
    assert_eq!(row(), (2, fence), "{}: the newer write stands", D::NAME);
    let stale_on_new = diesel_occ::occ_locks::table
        .filter(diesel_occ::occ_locks::holder.eq("stale holder"))
        .count()
        .get_result::<i64>(&mut pair.standby.get().unwrap())
        .unwrap();
    assert_eq!(stale_on_new, 0, "{}", D::NAME);
    std::mem::forget(stale); // its connection's server is gone; nothing to release
    d.release(holder).unwrap();
}

/// The documented limit of version guards under asynchronous replication (guide,
/// `topologies`): a write acknowledged by the old primary and lost in the failover
/// leaves a copy carrying a version the promoted server never had; once another writer
/// reaches that version on the promoted server, the stale copy matches it and its write
/// overwrites the newer one. Fences carry the timeline and are safe from this; versions
/// are computed by the client from the copy and are not. The rule the guide gives is
/// synchronous replication (see the next test). If a later release makes versions carry
/// an epoch, this test turns into a `Conflict` check.
fn a_version_lost_in_an_asynchronous_failover_is_handed_out_again<D: Driver>(pair: &Pair, d: &D) {
    diesel::insert_into(orders::table)
        .values(&Order::new(1, "first"))
        .execute(&mut pair.primary.get().unwrap())
        .unwrap();
    pair.wait_for_standby();

    // Acknowledged by the primary after its standby stopped: lost in the failover.
    script("detach");
    d.update(On::Primary, &order(&pair.primary, 1), "lost")
        .unwrap();
    let stale_copy = order(&pair.primary, 1);
    assert_eq!((stale_copy.note.as_str(), stale_copy.version), ("lost", 1));

    script("fail-over");
    assert_eq!(
        order(&pair.standby, 1).version,
        0,
        "{}: the write was lost",
        D::NAME
    );
    // Another writer reaches version 1 on the promoted server...
    d.update(On::Standby, &order(&pair.standby, 1), "newer")
        .unwrap();
    // ...and the stale copy, at the same version, matches it: the newer write is lost.
    d.update(On::Standby, &stale_copy, "stale").unwrap();
    let row = order(&pair.standby, 1);
    assert_eq!(
        (row.note.as_str(), row.version),
        ("stale", 2),
        "{}: the limit the guide documents is reproduced",
        D::NAME
    );
}

/// The same writes under synchronous replication: the acknowledged write survives the
/// failover, so the other writer's copy is the stale one, and its write is a `Conflict`
/// that shows the surviving row.
fn under_synchronous_replication_a_copy_of_the_old_primary_conflicts<D: Driver>(
    pair: &Pair,
    d: &D,
) {
    diesel::insert_into(orders::table)
        .values(&Order::new(1, "first"))
        .execute(&mut pair.primary.get().unwrap())
        .unwrap();
    let old_copy = order(&pair.primary, 1);
    d.update(On::Primary, &old_copy, "acknowledged").unwrap();

    script("fail-over");
    let current = conflicting_row(d.update(On::Standby, &old_copy, "from an old copy"));
    assert_eq!(
        (current.note.as_str(), current.version),
        ("acknowledged", 1),
        "{}",
        D::NAME
    );
}

/// With synchronous replication (`synchronous_commit = remote_apply`), a failover right
/// after acknowledged grants, fenced writes and guarded writes loses none of them: the
/// promoted server shows each, and its next fence is above them all.
fn a_failover_under_synchronous_replication_loses_no_acknowledged_write<D: Driver>(
    pair: &Pair,
    d: &D,
) {
    let ttl = Duration::from_secs(60);
    diesel::insert_into(orders::table)
        .values(&Order::new(1, "first"))
        .execute(&mut pair.primary.get().unwrap())
        .unwrap();
    let mut last = 0;
    for i in 1..=40 {
        let guard = d.try_lock(On::Primary, ttl, "holder").unwrap();
        d.write_fenced(On::Primary, 1, D::fence(&guard), i).unwrap();
        d.modify(On::Primary, 1, |o| o.quantity += 1).unwrap();
        last = D::fence(&guard);
        if i < 40 {
            d.release(guard).unwrap();
        } else {
            std::mem::forget(guard); // held when the primary dies
        }
    }

    script("fail-over");
    let promoted = &mut pair.standby.get().unwrap();
    let fenced: (i64, i64) = protected::table
        .find(1)
        .select((protected::value, protected::last_fence))
        .first(promoted)
        .unwrap();
    assert_eq!(
        fenced,
        (40, last),
        "{}: every acknowledged fenced write is on the promoted server",
        D::NAME
    );
    let quantity: i32 = orders::table
        .find(1)
        .select(orders::quantity)
        .first(promoted)
        .unwrap();
    assert_eq!(
        quantity,
        1 + 40,
        "{}: every acknowledged read-modify-write is there",
        D::NAME
    );
    let (holder, fence): (Option<String>, i64) = diesel_occ::occ_locks::table
        .select((diesel_occ::occ_locks::label, diesel_occ::occ_locks::fence))
        .first(promoted)
        .unwrap();
    assert_eq!(
        (holder.as_deref(), fence),
        (Some("holder"), last),
        "{}: the last grant is there",
        D::NAME
    );
    match d.try_lock(On::Standby, ttl, "successor") {
        Err(Error::LockHeld { .. }) => {}
        Err(other) => panic!(
            "{}: the held grant survived the failover, so: {other:?}",
            D::NAME
        ),
        Ok(guard) => {
            let fence = D::fence(&guard);
            std::mem::forget(guard);
            panic!(
                "{}: a second holder after the failover, fence {fence}",
                D::NAME
            )
        }
    }
}
