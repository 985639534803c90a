//! What the library reports (the `tracing` and `metrics` features), on both drivers and
//! every backend: a conflicting write, a retried read-modify-write, a lock that changes
//! holder and a leadership that changes hands each show up as the events and metrics the
//! `telemetry` module documents, with their fields, inside the span of the call that met
//! them.

#![cfg(all(feature = "tracing", feature = "metrics"))]

use crate::common;

use common::drivers::{Campaign, LockHolder, LockRenewals, Modify, Update};
use common::models::{Order, OrderPatch};
use common::schema::orders;
use common::telemetry::{metric, record, reported, Reported};

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use diesel::prelude::*;
use diesel_occ::prelude::*;
use diesel_occ::{Contention, ElectionTiming, Error, LeaderEvent, RetryPolicy};

/// The retries of modifies of `orders` after a conflict.
const RETRIES: &str = r#"diesel_occ_retries_total{db_operation="modify",db_collection_name="orders",occ_reason="conflict"}"#;

/// OpenTelemetry's `db.system` of `backend`.
fn db_system(backend: &str) -> &'static str {
    match backend {
        "sqlite" => "sqlite",
        "postgres" => "postgresql",
        _ => "mysql",
    }
}

/// A key of `orders` that no other test reports on.
fn own_key() -> i64 {
    let name = common::unique_name();
    let digits: String = name.chars().filter(char::is_ascii_digit).collect();
    // Process id, counter and nanoseconds, folded into a positive i64.
    (digits.parse::<u128>().unwrap() % (i64::MAX as u128 / 2)) as i64 + 1
}

/// The events of `name` about the row with `key` (its span's `occ.key`, or its own).
fn about_row(name: &str, key: i64) -> Vec<Reported> {
    let key = key.to_string();
    reported(|e| {
        e.name == name
            && (e.fields.get("occ.key") == Some(&key)
                || e.span_field("occ.key") == Some(key.as_str()))
    })
}

/// The events of `name` about lock (or election) `lock` (`name/resource`).
fn about_lock(name: &str, field: &str, lock: &str) -> Vec<Reported> {
    reported(|e| e.name == name && e.fields.get(field).map(String::as_str) == Some(lock))
}

for_each_backend! {
    type Db = common::TestDb<Conn>;

    fn insert(db: &Db, id: i64) -> Order {
        let order = Order::new(id, "new");
        diesel::insert_into(orders::table).values(&order).execute(&mut db.conn()).unwrap();
        order
    }

    /// A write from a copy another writer has overtaken: one `conflict` event naming the
    /// row and both tokens, inside the `update` call's span; the metrics count the
    /// conflict and the call's outcome.
    fn a_conflicting_write_is_reported<W: Update<Order, OrderPatch>>(db: &Db, w: impl Fn() -> W) {
        record();
        let id = own_key();
        let stale = insert(db, id);
        Order::guarded_update_by_key(&mut db.conn(), &id, &0, orders::quantity.eq(5)).unwrap();
        let conflicts = metric(r#"diesel_occ_conflicts_total{db_collection_name="orders"}"#);
        let series = format!(
            r#"diesel_occ_calls_total{{db_system="{}",db_operation="update",db_collection_name="orders",occ_outcome="conflict"}}"#,
            db_system(BACKEND)
        );
        let failed_updates = metric(&series);

        let answer = w().update(&stale, OrderPatch { note: Some("late".into()), quantity: None });
        assert!(matches!(answer, Err(Error::Conflict(_))), "{answer:?}");

        let [conflict] = &about_row("diesel_occ.conflict", id)[..] else {
            panic!("one conflict event: {:?}", about_row("diesel_occ.conflict", id))
        };
        assert_eq!(conflict.level, tracing::Level::DEBUG);
        assert_eq!(conflict.field("db.collection.name"), "orders");
        assert_eq!(conflict.field("occ.expected"), "version 0");
        assert_eq!(conflict.field("occ.current"), "version 1");
        assert_eq!(conflict.span_field("db.operation"), Some("update"));
        assert_eq!(conflict.span_field("db.system"), Some(db_system(BACKEND)));
        // The conflict is its own report: the call's end adds no second one.
        assert!(about_row("diesel_occ.call_failed", id).is_empty());

        // Tests beside this one write `orders` too: at least this test's.
        assert!(metric(r#"diesel_occ_conflicts_total{db_collection_name="orders"}"#) > conflicts);
        assert!(metric(&series) > failed_updates, "{series}");
    }

    /// A read-modify-write whose first attempt is overtaken (another connection writes
    /// from inside the change): the conflict, then one `retry` event (attempt 1, reason
    /// `conflict`, the wait), inside the `modify` call's span; the retries and the
    /// attempts are counted. Not on SQLite: an attempt holds the write lock from its read,
    /// so no writer gets in between to cause a retry (the other connection would wait).
    fn a_retried_modify_is_reported<W: Modify<Order, (), Error>>(db: &Db, w: impl Fn() -> W) {
        if BACKEND == "sqlite" {
            return;
        }
        record();
        let id = own_key();
        insert(db, id);
        let retries = metric(RETRIES);
        let runs = metric(r#"diesel_occ_attempts_count{db_operation="modify"}"#);
        let calls = Arc::new(AtomicU32::new(0));
        let (called, others) = (Arc::clone(&calls), db.pool.clone());
        let policy = RetryPolicy::default().contention(Contention::Optimistic).max_delay(Duration::from_millis(50));

        let done = w()
            .modify(&id, &policy, move |order| {
                if called.fetch_add(1, Ordering::Relaxed) == 0 {
                    Order::guarded_update_by_key(&mut others.get().unwrap(), &id, &0, orders::quantity.eq(5))?;
                }
                order.note = "modified".into();
                Ok(())
            })
            .unwrap();
        assert_eq!(done.attempts, 2);

        let in_modify = |e: &Reported| e.spans.iter().any(|s| s.get("db.operation").map(String::as_str) == Some("modify"));
        let [retry] = &about_row("diesel_occ.retry", id)[..] else { panic!("one retry event") };
        assert!(in_modify(retry), "{retry:?}");
        assert_eq!((retry.field("db.operation"), retry.field("db.collection.name")), ("modify", "orders"));
        assert_eq!((retry.field("occ.attempt"), retry.field("occ.reason")), ("1", "conflict"));
        let wait: u64 = retry.field("occ.wait_us").parse().unwrap();
        assert!(wait <= 50_000, "a wait under the policy's longest: {wait} µs");
        let conflicts = about_row("diesel_occ.conflict", id);
        assert_eq!(conflicts.len(), 1, "{conflicts:?}");
        assert!(in_modify(&conflicts[0]) && conflicts[0].span_field("db.operation") == Some("save"), "{conflicts:?}");
        assert!(about_row("diesel_occ.gave_up", id).is_empty());

        assert!(metric(RETRIES) > retries);
        assert!(metric(r#"diesel_occ_attempts_count{db_operation="modify"}"#) > runs);

        // A writer overtaken on every attempt: the policy gives up after its two, once,
        // at WARN, naming the operation and the table (the call's end adds nothing).
        let other = own_key();
        insert(db, other);
        let pool = db.pool.clone();
        let policy = policy.max_attempts(2);
        let gave_up = w().modify(&other, &policy, move |order| {
            Order::guarded_update_by_key(&mut pool.get().unwrap(), &other, &order.version, orders::quantity.eq(9))?;
            Ok(())
        });
        assert!(matches!(gave_up, Err(Error::RetriesExhausted { attempts: 2, .. })), "{gave_up:?}");
        let [given_up] = &about_row("diesel_occ.gave_up", other)[..] else {
            panic!("one report of giving up: {:?}", about_row("diesel_occ.gave_up", other))
        };
        assert_eq!(given_up.level, tracing::Level::WARN);
        assert_eq!(
            (given_up.field("db.operation"), given_up.field("db.collection.name"), given_up.field("occ.attempts")),
            ("modify", "orders", "2")
        );
        assert!(about_row("diesel_occ.call_failed", other).is_empty());
        let exhausted = format!(
            r#"diesel_occ_calls_total{{db_system="{}",db_operation="modify",db_collection_name="orders",occ_outcome="retries_exhausted"}}"#,
            db_system(BACKEND)
        );
        assert!(metric(&exhausted) >= 1.0, "{exhausted}");
    }

    /// A lock held, refused to another, left to expire, taken by the other (a higher
    /// fence), and found lost by its first holder: `lock_granted` twice, `lock_busy`
    /// naming the holder's label, `lock_lost` and `lock_released`, each with the lock's
    /// `name/resource`; the counters of this lock's name say exactly as much.
    /// Then an election: the first candidate leads, steps down, and the second leads with
    /// a higher fence, and the leader gauge follows.
    fn a_lock_handover_and_a_leadership_change_are_reported<W>(_: &Db, w: &W)
    where
        W: LockRenewals + Campaign + LockHolder,
    {
        record();
        let name = common::unique_name();
        let lock = format!("{name}/report");
        let ttl = Duration::from_millis(600);
        let mut first = w.try_lock(&name, "report", ttl, Some("first")).unwrap();
        let refused = w.try_lock(&name, "report", ttl, Some("second"));
        assert!(matches!(refused, Err(Error::LockHeld { .. })), "{:?}", refused.err());
        std::thread::sleep(ttl + Duration::from_millis(400));
        let second = w.try_lock(&name, "report", ttl, Some("second")).unwrap();
        let holders = [W::holder(&first), W::holder(&second)];
        let lost = w.renew(&mut first);
        assert!(matches!(lost, Err(Error::LockLost { .. })), "{lost:?}");
        // Its release finds the lock taken too: the loss was reported once already.
        let released = w.release(first);
        assert!(matches!(released, Err(Error::LockLost { .. })), "{released:?}");
        w.release(second).unwrap();

        let grants = about_lock("diesel_occ.lock_granted", "occ.lock", &lock);
        let fences: Vec<i64> = grants.iter().map(|g| g.field("occ.fence").parse().unwrap()).collect();
        assert_eq!(fences.len(), 2, "{grants:?}");
        assert!(fences[1] > fences[0], "{fences:?}");
        assert_eq!(grants[0].field("occ.ttl_ms"), "600");
        assert_eq!(grants[0].span_field("db.operation"), Some("lock.acquire"));
        assert_eq!(grants[0].span_field("db.collection.name"), Some("occ_locks"));
        let [busy] = &about_lock("diesel_occ.lock_busy", "occ.lock", &lock)[..] else { panic!("one refusal") };
        assert_eq!(busy.field("occ.holder"), "first");
        let [lost] = &about_lock("diesel_occ.lock_lost", "occ.lock", &lock)[..] else { panic!("one loss") };
        assert_eq!(lost.level, tracing::Level::WARN);
        assert!(lost.field("occ.why").contains("deadline"), "{lost:?}");
        let [released] = &about_lock("diesel_occ.lock_released", "occ.lock", &lock)[..] else { panic!("one release") };
        assert_eq!(released.field("occ.fence"), fences[1].to_string());
        let count = |metric_name: &str| metric(&format!(r#"{metric_name}{{occ_lock="{name}"}}"#));
        assert_eq!(count("diesel_occ_lock_grants_total"), 2.0);
        assert_eq!(count("diesel_occ_lock_busy_total"), 1.0);
        assert_eq!(count("diesel_occ_lock_losses_total"), 1.0);
        assert_eq!(count("diesel_occ_lock_releases_total"), 1.0);

        let election = common::unique_name();
        let timing = ElectionTiming {
            lease: Duration::from_millis(1000),
            renew_deadline: Duration::from_millis(600),
            retry_period: Duration::from_millis(100),
        };
        let leads = || metric(&format!(r#"diesel_occ_leader{{occ_election="{election}"}}"#));
        let mut one = w.start_candidate(&election, "main", "one", timing).unwrap();
        let Some(LeaderEvent::Elected { fence }) = w.next_event(&mut one, Duration::from_secs(5)) else { panic!("no leader") };
        assert_eq!(leads(), 1.0);
        let mut two = w.start_candidate(&election, "main", "two", timing).unwrap();
        assert_eq!(w.stop(one), [LeaderEvent::SteppedDown]);
        let Some(LeaderEvent::Elected { fence: next }) = w.next_event(&mut two, Duration::from_secs(5)) else { panic!("no new leader") };
        assert_eq!(leads(), 1.0);
        assert_eq!(w.stop(two), [LeaderEvent::SteppedDown]);
        assert_eq!(leads(), 0.0);

        let shown = format!("{election}/main");
        let gained = about_lock("diesel_occ.leadership_gained", "occ.election", &shown);
        let fences: Vec<String> = gained.iter().map(|e| e.field("occ.fence").to_owned()).collect();
        assert_eq!(fences, [fence.to_string(), next.to_string()]);
        assert!(gained.iter().all(|e| e.level == tracing::Level::INFO));
        let ended = about_lock("diesel_occ.leadership_ended", "occ.election", &shown);
        assert_eq!(ended.len(), 2, "{ended:?}");
        assert!(ended.iter().all(|e| e.field("occ.why") == "stepped down"));
        let changes = |change: &str| {
            metric(&format!(r#"diesel_occ_leadership_changes_total{{occ_election="{election}",occ_change="{change}"}}"#))
        };
        assert_eq!((changes("gained"), changes("ended"), changes("lost")), (2.0, 2.0, 0.0));

        // A holder's token is its proof of holding: no report shows it.
        let shown = reported(|e| {
            holders.iter().any(|token| {
                e.fields.values().chain(e.spans.iter().flat_map(|s| s.values())).any(|v| v.contains(token.as_str()))
            })
        });
        assert!(shown.is_empty(), "a holder token in {shown:?}");
    }

    tests_on_both_drivers!(
        |_: &Db| ();
        a_conflicting_write_is_reported,
        a_retried_modify_is_reported,
        ;
        pooled:
        a_lock_handover_and_a_leadership_change_are_reported,
    );
}
