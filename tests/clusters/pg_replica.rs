//! A PostgreSQL primary with an asynchronous streaming standby (`scripts/pg-replica.sh`):
//! stale copies read on the standby, writes sent to it, and a failover that loses the old
//! primary's last commits.
//!
//! Each test starts a fresh pair with the script, so they need root (or sudo) and run one
//! at a time. They are skipped unless `OCC_PG_REPLICA` is set (`scripts/test.sh` sets it),
//! and fail without it when `OCC_REQUIRE_CLUSTER` is set.

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
    CheckedManager, Error, FencedWrite, GuardedModify, GuardedWrite, Locks, PoolConfig, RetryPolicy,
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
}

impl Drop for Pair {
    fn drop(&mut self) {
        // Not `script`: a panic here, while a failed test unwinds, would abort the run.
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/pg-replica.sh");
        let _ = Command::new("bash").args([path, "stop"]).status();
    }
}

fn pair() -> Option<Pair> {
    pair_started("start")
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
        ..common::pool_config()
    };
    let primary = diesel_occ::postgres_pool(primary_url, &config).expect("primary pool");
    let conn = &mut primary.get().unwrap();
    common::migrate_postgres(conn);
    conn.batch_execute(CREATE).unwrap();
    let standby = diesel_occ::postgres_pool(standby_url, &config).expect("standby pool");
    let pair = Pair { primary, standby };
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

/// A copy read on the standby and written on the primary after someone else's write is a
/// `Conflict` whose current row is the primary's, whether the standby had replayed that
/// write (a stale read) or not (a lagging standby).
#[test]
fn a_copy_read_on_the_standby_is_checked_against_the_primary() {
    let _one = PAIR.lock().unwrap_or_else(|p| p.into_inner());
    let Some(pair) = pair() else { return };
    let conn = &mut pair.primary.get().unwrap();
    diesel::insert_into(orders::table)
        .values(&Order::new(1, "first"))
        .execute(conn)
        .unwrap();
    pair.wait_for_standby();

    // Replayed: the standby's copy is stale by the time it is written.
    let copy = order(&pair.standby, 1);
    order(&pair.primary, 1)
        .guarded_update(conn, orders::note.eq("by another writer"))
        .unwrap();
    let current = conflicting_row(copy.guarded_update(conn, orders::note.eq("from the copy")));
    assert_eq!(
        (current.note.as_str(), current.version),
        ("by another writer", 1)
    );

    // Lagging: the standby stops replaying, so its copy misses a write it never saw.
    pair.wait_for_standby();
    pair.standby
        .get()
        .unwrap()
        .batch_execute("SELECT pg_wal_replay_pause()")
        .unwrap();
    order(&pair.primary, 1)
        .guarded_update(conn, orders::note.eq("unseen by the standby"))
        .unwrap();
    let lagging = order(&pair.standby, 1);
    assert_eq!(lagging.version, 1, "the standby is behind");
    let current =
        conflicting_row(lagging.guarded_update(conn, orders::note.eq("from the lagging copy")));
    assert_eq!(
        (current.note.as_str(), current.version),
        ("unseen by the standby", 2)
    );
    assert_eq!(order(&pair.primary, 1), current, "nothing else was written");
}

/// Every kind of write sent to the standby is `ReadOnly`, at once and unretried.
#[test]
fn writes_sent_to_the_standby_are_read_only() {
    let _one = PAIR.lock().unwrap_or_else(|p| p.into_inner());
    let Some(pair) = pair() else { return };
    diesel::insert_into(orders::table)
        .values(&Order::new(1, "first"))
        .execute(&mut pair.primary.get().unwrap())
        .unwrap();
    pair.wait_for_standby();
    let standby = &mut pair.standby.get().unwrap();
    let copy = order(&pair.standby, 1);
    let read_only = |err: Error| {
        assert!(matches!(err, Error::ReadOnly { .. }), "{err:?}");
        assert!(!err.is_retryable(), "{err:?}");
    };

    read_only(
        copy.guarded_update(standby, orders::note.eq("on the standby"))
            .unwrap_err(),
    );
    let mut attempts = 0;
    let modified = Order::modify(standby, &1, &RetryPolicy::default(), |o| {
        attempts += 1;
        o.note = "modified on the standby".into();
        Ok::<_, Error>(())
    });
    read_only(modified.map(drop).unwrap_err());
    assert_eq!(attempts, 1);
    read_only(
        Protected::write_fenced(
            standby,
            &1,
            protected::last_fence,
            1,
            protected::value.eq(1),
        )
        .unwrap_err(),
    );
    let locks = Locks::new(pair.standby.clone());
    read_only(
        locks
            .try_lock("standby", "r", Duration::from_secs(30), None)
            .map(drop)
            .unwrap_err(),
    );
    assert_eq!(order(&pair.primary, 1), copy, "nothing was written");
}

/// An asynchronous failover that loses the old primary's last commits (grants among
/// them): the promoted standby's fences are above every fence the old primary handed
/// out, though its fence sequence repeats values; a stale holder's fenced write is
/// refused, and its lease is gone.
#[test]
fn fences_keep_rising_across_a_failover_that_loses_commits() {
    let _one = PAIR.lock().unwrap_or_else(|p| p.into_inner());
    let Some(pair) = pair() else { return };
    let old = Locks::new(pair.primary.clone());
    let ttl = Duration::from_secs(60);

    // Replicated: one grant, released.
    let before = old.try_lock("job", "nightly", ttl, Some("before")).unwrap();
    let first_fence = before.fence();
    before.release().unwrap();
    pair.wait_for_standby();

    // Lost: 40 grants (more than the sequence logs ahead, 32) after the standby stopped,
    // the last one still held, and a fenced write with it.
    script("detach");
    for _ in 0..39 {
        old.try_lock("job", "nightly", ttl, Some("lost"))
            .unwrap()
            .release()
            .unwrap();
    }
    let stale = old
        .try_lock("job", "nightly", ttl, Some("stale holder"))
        .unwrap();
    let lost_fence = stale.fence();
    assert!(lost_fence > first_fence);
    Protected::write_fenced(
        &mut pair.primary.get().unwrap(),
        &1,
        protected::last_fence,
        lost_fence,
        protected::value.eq(1),
    )
    .unwrap();

    script("fail-over");
    let promoted = &pair.standby;
    let new = Locks::new(promoted.clone());
    // The stale holder's grant was lost: the lock is free on the promoted server.
    let holder = new
        .try_lock("job", "nightly", ttl, Some("new holder"))
        .unwrap();
    let mask = (1i64 << SEQUENCE_BITS) - 1;
    assert!(
        holder.fence() & mask <= lost_fence & mask,
        "the scenario repeats sequence values ({:#x} after {:#x}), as the issue saw",
        holder.fence(),
        lost_fence
    );
    assert!(
        holder.fence() > lost_fence,
        "the promoted server's fence {:#x} is above every fence of the old primary ({:#x})",
        holder.fence(),
        lost_fence
    );
    assert_eq!(
        holder.fence() >> SEQUENCE_BITS,
        2,
        "the promoted server's timeline"
    );

    let conn = &mut promoted.get().unwrap();
    let row = |conn: &mut diesel_occ::Pooled<PgConnection>| -> (i64, i64) {
        protected::table
            .find(1)
            .select((protected::value, protected::last_fence))
            .first(conn)
            .unwrap()
    };
    assert_eq!(
        row(conn),
        (0, 0),
        "the old primary's fenced write was lost with it"
    );
    Protected::write_fenced(
        conn,
        &1,
        protected::last_fence,
        holder.fence(),
        protected::value.eq(2),
    )
    .unwrap();
    // The stale holder, still believing in its lease, writes to the promoted server.
    match Protected::write_fenced(
        conn,
        &1,
        protected::last_fence,
        lost_fence,
        protected::value.eq(3),
    ) {
        Err(Error::StaleFence { presented, current }) => {
            assert_eq!((presented, current), (lost_fence, holder.fence()))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(row(conn), (2, holder.fence()), "the newer write stands");
    let stale_on_new = diesel_occ::occ_locks::table
        .filter(diesel_occ::occ_locks::holder.eq("stale holder"))
        .count()
        .get_result::<i64>(conn)
        .unwrap();
    assert_eq!(stale_on_new, 0);
    std::mem::forget(stale); // its connection's server is gone; nothing to release
    holder.release().unwrap();
}

/// With synchronous replication (`synchronous_commit = remote_apply`), a failover right
/// after acknowledged grants, fenced writes and guarded writes loses none of them: the
/// promoted server shows each, and its next fence is above them all.
#[test]
fn a_failover_under_synchronous_replication_loses_no_acknowledged_write() {
    let _one = PAIR.lock().unwrap_or_else(|p| p.into_inner());
    let Some(pair) = pair_started("start-sync") else {
        return;
    };
    let old = Locks::new(pair.primary.clone());
    let ttl = Duration::from_secs(60);
    let conn = &mut pair.primary.get().unwrap();
    diesel::insert_into(orders::table)
        .values(&Order::new(1, "first"))
        .execute(conn)
        .unwrap();
    let mut last = 0;
    for i in 1..=40 {
        let guard = old.try_lock("job", "nightly", ttl, Some("holder")).unwrap();
        Protected::write_fenced(
            conn,
            &1,
            protected::last_fence,
            guard.fence(),
            protected::value.eq(i),
        )
        .unwrap();
        Order::modify(conn, &1, &RetryPolicy::default(), |o| {
            o.quantity += 1;
            Ok::<_, Error>(())
        })
        .unwrap();
        last = guard.fence();
        if i < 40 {
            guard.release().unwrap();
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
        "every acknowledged fenced write is on the promoted server"
    );
    let quantity: i32 = orders::table
        .find(1)
        .select(orders::quantity)
        .first(promoted)
        .unwrap();
    assert_eq!(
        quantity,
        1 + 40,
        "every acknowledged read-modify-write is there"
    );
    let (holder, fence): (Option<String>, i64) = diesel_occ::occ_locks::table
        .select((diesel_occ::occ_locks::label, diesel_occ::occ_locks::fence))
        .first(promoted)
        .unwrap();
    assert_eq!(
        (holder.as_deref(), fence),
        (Some("holder"), last),
        "the last grant is there"
    );
    let new = Locks::new(pair.standby.clone());
    match new.try_lock("job", "nightly", ttl, Some("successor")) {
        Err(Error::LockHeld { .. }) => {}
        other => panic!(
            "the held grant survived the failover, so: {:?}",
            other.map(|g| g.fence())
        ),
    }
}
