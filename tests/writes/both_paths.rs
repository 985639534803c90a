//! The guarded writes and the read-modify-write, one test body each, run on both
//! executors: the blocking API and the async one (diesel-async), on every backend.
//! Outcomes and end states are checked from the database.

#![cfg(all(
    feature = "async",
    any(not(feature = "mysql"), feature = "async-mysql")
))]

use crate::common;

use common::models::{Order, OrderPatch, OrderState};
use common::paths::{Async, AsyncOf, Blocking, HookError, Writes};
use common::schema::orders;
use diesel::prelude::*;
use diesel_occ::{Error, LockWait, RetryPolicy, Upserted};

fn patch(note: &str) -> OrderPatch {
    OrderPatch {
        note: Some(note.into()),
        quantity: None,
    }
}

fn conflict_current(error: Error) -> Order {
    match error {
        Error::Conflict(conflict) => conflict
            .current::<Order>()
            .expect("the current row")
            .clone(),
        other => panic!("expected a conflict, got {other:?}"),
    }
}

fn update_advances_and_a_stale_copy_conflicts<W: Writes>(w: &mut W) {
    let read = w.load(1).unwrap();
    assert_eq!(
        w.update(&read, patch("first")).unwrap(),
        read.version + 1,
        "{}",
        W::PATH
    );
    let current = conflict_current(w.update(&read, patch("stale")).unwrap_err());
    assert_eq!(
        (current.note.as_str(), current.version),
        ("first", read.version + 1)
    );
    assert_eq!(
        w.load(1).unwrap(),
        current,
        "the stale write changed nothing"
    );
}

fn by_key_writes_give_each_outcome<W: Writes>(w: &mut W) {
    let token = w.update_by_key(1, 0, patch("by key")).unwrap();
    assert_eq!(token, 1);
    assert_eq!(
        conflict_current(w.update_by_key(1, 0, patch("old token")).unwrap_err()).version,
        1
    );
    assert!(matches!(
        w.update_by_key(99, 0, patch("none")),
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(w.delete_by_key(1, 0), Err(Error::Conflict(_))));
    assert!(
        w.load(1).is_some(),
        "a delete with an old token deletes nothing"
    );
    w.delete_by_key(1, 1).unwrap();
    assert!(w.load(1).is_none());
    assert!(matches!(w.delete_by_key(1, 1), Err(Error::NotFound { .. })));
}

fn saves_record_the_token_and_refuse_a_stale_original<W: Writes>(w: &mut W) {
    let original = w.load(1).unwrap();
    let mut copy = original.clone();
    copy.quantity = 5;
    assert_eq!(w.save(&mut copy).unwrap(), 1);
    assert_eq!(copy.version, 1, "the copy records its new token");
    assert_eq!(w.load(1).unwrap(), copy);
    w.touch(&mut copy).unwrap();
    assert_eq!((copy.version, w.load(1).unwrap().quantity), (2, 5));
    let mut edited = original.clone();
    edited.note = "from an old form".into();
    assert_eq!(
        conflict_current(w.save_from(&mut edited, &original).unwrap_err()).version,
        2
    );
    assert_eq!(w.load(1).unwrap(), copy, "nothing of the stale save landed");
    let mut old = original.clone();
    assert!(matches!(w.delete(&old), Err(Error::Conflict(_))));
    old.version = i64::MAX;
    assert!(matches!(
        w.save(&mut old),
        Err(Error::VersionOverflow { .. })
    ));
    w.delete(&copy).unwrap();
    assert!(w.load(1).is_none());
}

fn modify_writes_once_and_reports_a_missing_row<W: Writes>(w: &mut W) {
    let done = w.add_one(1, "+", &RetryPolicy::default()).unwrap();
    assert_eq!((done.attempts, done.token, done.row.quantity), (1, 1, 2));
    assert_eq!(w.load(1).unwrap(), done.row);
    assert!(matches!(
        w.add_one(7, "+", &RetryPolicy::default()),
        Err(Error::NotFound { .. })
    ));
}

fn transitions_move_once_and_explain_every_refusal<W: Writes>(w: &mut W) {
    let mut copy = w.load_tracked(1).unwrap();
    let mut stale = copy.clone();
    assert_eq!(
        w.transition(&mut copy, OrderState::Shipped).unwrap(),
        1,
        "{}",
        W::PATH
    );
    assert_eq!((copy.status, copy.version), (OrderState::Shipped, 1));
    assert_eq!(w.load_tracked(1).unwrap(), copy);
    // The stale copy's state no longer allows the move: the state speaks first.
    let Err(Error::InvalidTransition(refused)) = w.transition(&mut stale, OrderState::Cancelled)
    else {
        panic!("a cancel after the ship must be refused")
    };
    assert_eq!(
        (refused.from.as_str(), refused.to.as_str()),
        ("shipped", "canceled")
    );
    assert_eq!(
        stale.status,
        OrderState::Valid,
        "a refused move leaves the copy as it was"
    );
    assert!(matches!(
        w.transition_by_key(1, OrderState::Cancelled),
        Err(Error::InvalidTransition(_))
    ));
    // A condition the row does not meet is named.
    let Err(Error::InvalidTransition(unmet)) =
        w.transition_if_more_than(&mut copy, OrderState::Delivered, 5)
    else {
        panic!("a move short of its condition must be refused")
    };
    assert!(
        unmet
            .unmet
            .as_deref()
            .is_some_and(|sql| sql.contains("quantity")),
        "{unmet:?}"
    );
    assert_eq!(
        w.transition_if_more_than(&mut copy, OrderState::Delivered, 0)
            .unwrap(),
        2
    );
    assert!(matches!(
        w.transition_by_key(9, OrderState::Held),
        Err(Error::NotFound { .. })
    ));
    let row = w.load_tracked(1).unwrap();
    assert_eq!((row.status, row.version), (OrderState::Delivered, 2));
}

fn a_stale_copy_in_an_allowed_state_conflicts<W: Writes>(w: &mut W) {
    let mut copy = w.load_tracked(1).unwrap();
    let mut stale = copy.clone();
    w.transition(&mut copy, OrderState::Held).unwrap();
    w.transition(&mut copy, OrderState::Valid).unwrap();
    // Valid again, two versions on: the state allows the move, the token does not (ABA).
    assert!(matches!(
        w.transition(&mut stale, OrderState::Shipped),
        Err(Error::Conflict(_))
    ));
    assert_eq!(w.transition_by_key(1, OrderState::Shipped).unwrap(), 3);
}

fn inserts_seed_a_token_no_earlier_copy_holds<W: Writes>(w: &mut W) {
    let old = w.load(1).unwrap();
    w.delete(&old).unwrap();
    let mut again = Order::new(1, "again");
    let seed = w.insert(&mut again).unwrap();
    assert!(
        seed > old.version + 1_000_000,
        "a seed from the clock: {seed}, {}",
        W::PATH
    );
    assert_eq!((again.version, w.load(1).unwrap()), (seed, again.clone()));
    // The copy read before the delete cannot write the new row.
    assert!(matches!(
        w.update(&old, patch("stale")),
        Err(Error::Conflict(_))
    ));
    let Err(Error::AlreadyExists { current, .. }) = w.insert(&mut Order::new(1, "twice")) else {
        panic!("a taken key must be refused")
    };
    assert_eq!(current.as_any().downcast_ref::<Order>(), Some(&again));
}

fn upserts_save_insert_and_never_overwrite<W: Writes>(w: &mut W) {
    let mut copy = w.load(1).unwrap();
    let stale = copy.clone();
    copy.quantity = 9;
    assert_eq!(
        w.upsert(&mut copy).unwrap(),
        Upserted::Updated(1),
        "{}",
        W::PATH
    );
    assert_eq!(w.load(1).unwrap(), copy);
    let mut stale = stale;
    stale.note = "overwrite?".into();
    assert!(matches!(w.upsert(&mut stale), Err(Error::Conflict(_))));
    assert_eq!(
        w.load(1).unwrap(),
        copy,
        "nothing written over a row of another token"
    );
    let mut fresh = Order::new(2, "fresh");
    let Upserted::Inserted(seed) = w.upsert(&mut fresh).unwrap() else {
        panic!("an insert")
    };
    assert_eq!((fresh.version, w.load(2).unwrap()), (seed, fresh.clone()));
}

fn excluded_fields_never_conflict_and_nothing_else_passes<W: Writes>(w: &mut W) {
    let copy = w.load(1).unwrap();
    w.set_views(1, 41).unwrap();
    assert_eq!(
        w.load(1).unwrap().version,
        0,
        "the token did not move, {}",
        W::PATH
    );
    // The copy read before the counter moved is still current.
    assert_eq!(w.update(&copy, patch("after a view")).unwrap(), 1);
    assert!(matches!(
        w.note_as_excluded(1),
        Err(Error::NotExcluded { .. })
    ));
    assert_eq!(
        w.load(1).unwrap().note,
        "after a view",
        "nothing of a refused write landed"
    );
    assert!(matches!(w.set_views(9, 1), Err(Error::NotFound { .. })));
}

/// A bulk update changes and advances every row its filter matches, one statement, and a
/// copy read before it conflicts; a filter that matches nothing changes nothing.
fn bulk_updates_advance_every_changed_row<W: Writes>(w: &mut W) {
    let mut second = w.load(1).unwrap();
    second.id = 2;
    second.quantity = 5;
    w.insert(&mut second).unwrap();
    let before = w.load(1).unwrap();
    let seeded = w.load(2).unwrap().version;
    assert_eq!(
        w.bulk_note(1, "bulk").unwrap(),
        diesel_occ::BulkReport {
            updated: 2,
            at_maximum: 0
        },
        "{}",
        W::PATH
    );
    let (one, two) = (w.load(1).unwrap(), w.load(2).unwrap());
    assert_eq!(
        (one.note.as_str(), one.version),
        ("bulk", before.version + 1),
        "{}",
        W::PATH
    );
    assert_eq!(
        (two.note.as_str(), two.version),
        ("bulk", seeded + 1),
        "{}",
        W::PATH
    );
    assert_eq!(
        conflict_current(w.update(&before, patch("stale")).unwrap_err()),
        one
    );
    assert_eq!(
        w.bulk_note(1_000, "none").unwrap(),
        diesel_occ::BulkReport {
            updated: 0,
            at_maximum: 0
        }
    );
    assert_eq!(w.load(1).unwrap(), one, "{}", W::PATH);
}

/// A hook records the move on its transaction: a failing hook rolls the move and its
/// history row back and leaves the copy as it was; a refused move never runs its hook.
fn hooks_commit_or_roll_back_with_the_transition<W: Writes>(w: &mut W) {
    let moved = w
        .transition_by_key_recorded(1, OrderState::Shipped, "operator-7", false)
        .unwrap();
    assert_eq!(
        (moved.status, moved.version),
        (OrderState::Shipped, 1),
        "{}",
        W::PATH
    );
    assert_eq!(w.load_tracked(1).unwrap(), moved);

    w.insert(&mut Order::new(2, "second")).unwrap();
    let mut second = w.load_tracked(2).unwrap();
    let before = second.clone();
    let failed = w.transition_recorded(&mut second, OrderState::Shipped, "operator-8", true);
    assert!(
        matches!(failed, Err(HookError::LabelPrinterDown)),
        "{failed:?}"
    );
    assert_eq!(second, before, "{}: the copy is as it was", W::PATH);
    let failed = w.transition_by_key_recorded(2, OrderState::Held, "operator-8", true);
    assert!(
        matches!(failed, Err(HookError::LabelPrinterDown)),
        "{failed:?}"
    );
    assert_eq!(
        w.load_tracked(2).unwrap(),
        before,
        "{}: rolled back",
        W::PATH
    );

    let refused = w.transition_by_key_recorded(1, OrderState::Held, "operator-9", false);
    assert!(
        matches!(refused, Err(HookError::Occ(Error::InvalidTransition(_)))),
        "{refused:?}"
    );
    let missing = w.transition_by_key_recorded(9, OrderState::Held, "operator-9", false);
    assert!(
        matches!(missing, Err(HookError::Occ(Error::NotFound { .. }))),
        "{missing:?}"
    );
    let mut stale = before.clone();
    w.transition(&mut second, OrderState::Held).unwrap();
    let conflict = w.transition_recorded(&mut stale, OrderState::Cancelled, "operator-9", false);
    assert!(
        matches!(conflict, Err(HookError::Occ(Error::Conflict(_)))),
        "{conflict:?}"
    );
    assert_eq!(stale, before);
    let mut held = w.load_tracked(2).unwrap();
    w.transition_recorded(&mut held, OrderState::Cancelled, "operator-10", false)
        .unwrap();
    assert_eq!(
        (held.status, held.version),
        (OrderState::Cancelled, before.version + 2)
    );

    let history = w.history();
    let expected: Vec<(String, String, String, Option<String>)> = vec![
        (
            "1".into(),
            "valid".into(),
            "shipped".into(),
            Some("operator-7".into()),
        ),
        (
            "2".into(),
            "held".into(),
            "canceled".into(),
            Some("operator-10".into()),
        ),
    ];
    assert_eq!(history, expected, "{}", W::PATH);
}

/// A row whose stored status is no state of the enum cannot be read: a transition by key
/// with a hook says which columns to look at, the same on every path, and nothing is
/// written.
fn an_unreadable_row_is_invalid_data_naming_its_columns<W: Writes>(w: &mut W) {
    w.execute("UPDATE orders SET status = 'bogus' WHERE id = 1");
    let moved = w.transition_by_key_recorded(1, OrderState::Shipped, "operator-7", false);
    match &moved {
        Err(HookError::Occ(Error::InvalidData {
            table,
            column,
            reason,
        })) => {
            assert_eq!(
                (*table, column.as_str()),
                ("orders", "status (or version)"),
                "{}",
                W::PATH
            );
            assert!(
                reason.contains("row 1 cannot be read"),
                "{}: {reason}",
                W::PATH
            );
        }
        other => panic!("{}: {other:?}", W::PATH),
    }
    assert!(w.history().is_empty(), "{}: the hook never ran", W::PATH);
    let stored = w.load(1).unwrap();
    assert_eq!(
        (stored.status.as_str(), stored.version),
        ("bogus", 0),
        "{}",
        W::PATH
    );
}

/// Work on a locked copy runs only while the row holds the copy's token; a missing row
/// is `NotFound` for both forms.
fn locked_work_runs_only_on_the_current_row<W: Writes>(w: &mut W) {
    let copy = w.load(1).unwrap();
    assert_eq!(
        w.note_if_current(&copy, "confirmed").unwrap(),
        copy,
        "{}",
        W::PATH
    );
    let now = w.load(1).unwrap();
    assert_eq!(
        (now.note.as_str(), now.version),
        ("confirmed", copy.version),
        "unguarded write"
    );
    w.update(&now, patch("moved on")).unwrap();
    let stale = w.note_if_current(&now, "stale");
    let current = conflict_current(stale.unwrap_err());
    assert_eq!(current, w.load(1).unwrap());
    assert_eq!(
        current.note,
        "moved on",
        "{}: the stale work never ran",
        W::PATH
    );
    assert_eq!(
        w.add_locked(1, 2, LockWait::NoWait).unwrap(),
        current.quantity + 2
    );
    let missing = w.add_locked(9, 1, LockWait::Wait);
    assert!(
        matches!(missing, Err(Error::NotFound { .. })),
        "{missing:?}"
    );
    let mut gone = current.clone();
    gone.id = 9;
    assert!(matches!(
        w.note_if_current(&gone, "x"),
        Err(Error::NotFound { .. })
    ));
}

for_each_backend! {
    type Async_ = <Conn as AsyncOf>::Async;
    type Pool = r2d2::Pool<diesel_occ::CheckedManager<Conn>>;

    fn seeded() -> Option<common::TestDb<Conn>> {
        let db = db()?;
        diesel::insert_into(orders::table).values(&Order::new(1, "new")).execute(&mut db.conn()).unwrap();
        Some(db)
    }

    fn async_writer(db: &common::TestDb<Conn>) -> Async<Async_> {
        let runtime = common::paths::runtime();
        Async { conn: Conn::connect(&db.url, &runtime), runtime }
    }

    /// `$body` once on each executor, each on a fresh database.
    macro_rules! on_both_paths {
        ($($body:ident),*) => {
            mod blocking {
                use super::*;
                $(#[test] fn $body() {
                    let Some(db) = seeded() else { return };
                    super::super::$body(&mut Blocking(db.conn()));
                })*
            }
            mod on_async {
                use super::*;
                $(#[test] fn $body() {
                    let Some(db) = seeded() else { return };
                    super::super::$body(&mut async_writer(&db));
                })*
            }
        };
    }

    on_both_paths!(
        update_advances_and_a_stale_copy_conflicts,
        by_key_writes_give_each_outcome,
        saves_record_the_token_and_refuse_a_stale_original,
        modify_writes_once_and_reports_a_missing_row,
        transitions_move_once_and_explain_every_refusal,
        inserts_seed_a_token_no_earlier_copy_holds,
        excluded_fields_never_conflict_and_nothing_else_passes,
        upserts_save_insert_and_never_overwrite,
        a_stale_copy_in_an_allowed_state_conflicts,
        bulk_updates_advance_every_changed_row,
        hooks_commit_or_roll_back_with_the_transition,
        an_unreadable_row_is_invalid_data_naming_its_columns,
        locked_work_runs_only_on_the_current_row
    );

    /// A move by key hands its new version back for what its backend needs and no more:
    /// one statement (`UPDATE ... RETURNING`) on PostgreSQL and SQLite; on MySQL the
    /// `UPDATE` and one `SELECT` of the version it noted, no transaction.
    fn a_move_by_key_sends_at_most_two_statements<W: Writes>(w: &mut W) {
        assert_eq!(w.transition_by_key(1, OrderState::Held).unwrap(), 1, "{}", W::PATH);
        let statements = w.record_statements();
        assert_eq!(w.transition_by_key(1, OrderState::Valid).unwrap(), 2, "{}", W::PATH);
        let sent = std::mem::take(&mut *statements.lock().unwrap());
        assert_eq!(sent.len(), if BACKEND == "mysql" { 2 } else { 1 }, "{}: {sent:#?}", W::PATH);
        let row = w.load_tracked(1).unwrap();
        assert_eq!((row.status, row.version), (OrderState::Valid, 2), "{}", W::PATH);
    }

    /// The library's own transactions (a read-modify-write attempt, the move of a
    /// transition with a hook) need no savepoint around their statements, on either
    /// driver: a failure ends the whole transaction anyway. The hook's statements are the
    /// caller's, and on PostgreSQL run under one.
    fn own_transactions_send_no_savepoint<W: Writes>(w: &mut W) {
        let statements = w.record_statements();
        w.add_one(1, "x", &RetryPolicy::default()).unwrap();
        w.transition_by_key_recorded(1, OrderState::Held, "operator-7", false).unwrap();
        let sent = std::mem::take(&mut *statements.lock().unwrap());
        let savepoint = |sql: &String| sql.to_uppercase().contains("SAVEPOINT");
        let hook = sent.iter().position(|sql| sql.contains("occ_transitions")).expect("the hook's insert");
        let moved = sent[..hook].iter().rposition(|sql| sql.starts_with("UPDATE")).expect("the move");
        assert!(!sent[..=moved].iter().any(savepoint), "{}: {sent:#?}", W::PATH);
        assert_eq!(
            sent[moved..hook].iter().any(savepoint),
            BACKEND == "postgres",
            "{}: the hook's statement is the caller's: {sent:#?}",
            W::PATH
        );
        let stored = w.load_tracked(1).unwrap();
        assert_eq!((stored.status, stored.version), (OrderState::Held, 2), "{}", W::PATH);
    }

    #[test]
    fn blocking_own_transactions_send_no_savepoint() {
        let Some(db) = seeded() else { return };
        own_transactions_send_no_savepoint(&mut Blocking(db.conn()));
    }

    #[test]
    fn async_own_transactions_send_no_savepoint() {
        let Some(db) = seeded() else { return };
        own_transactions_send_no_savepoint(&mut async_writer(&db));
    }

    #[test]
    fn a_blocking_move_by_key_sends_at_most_two_statements() {
        let Some(db) = seeded() else { return };
        a_move_by_key_sends_at_most_two_statements(&mut Blocking(db.conn()));
    }

    #[test]
    fn an_async_move_by_key_sends_at_most_two_statements() {
        let Some(db) = seeded() else { return };
        a_move_by_key_sends_at_most_two_statements(&mut async_writer(&db));
    }

    /// A cancel and a ship race on each of 20 orders, on two writers of a kind: exactly
    /// one wins each race, and the row is in the winner's state at version 1.
    fn cancel_vs_ship<W: Writes + Send>(pool: &Pool, writer: impl Fn() -> W + Sync) {
        let ids: Vec<i64> = (2..22).collect();
        {
            let conn = &mut pool.get().unwrap();
            let rows: Vec<Order> = ids.iter().map(|id| Order::new(*id, "race")).collect();
            diesel::insert_into(orders::table).values(&rows).execute(conn).unwrap();
        }
        let start = std::sync::Barrier::new(2);
        let wins: Vec<Vec<bool>> = std::thread::scope(|s| {
            let racers: Vec<_> = [OrderState::Cancelled, OrderState::Shipped]
                .into_iter()
                .map(|to| {
                    let (start, writer, ids) = (&start, &writer, &ids);
                    s.spawn(move || {
                        let mut w = writer();
                        start.wait();
                        ids.iter()
                            .map(|id| match w.transition_by_key(*id, to) {
                                Ok(token) => { assert_eq!(token, 1); true }
                                Err(Error::InvalidTransition(_)) => false,
                                Err(other) => panic!("{other:?}"),
                            })
                            .collect()
                    })
                })
                .collect();
            racers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        let mut check = Blocking(pool.get().unwrap());
        for (i, id) in ids.iter().enumerate() {
            assert!(wins[0][i] ^ wins[1][i], "order {id}: exactly one winner, {}", W::PATH);
            let row = check.load_tracked(*id).unwrap();
            let winner = if wins[0][i] { OrderState::Cancelled } else { OrderState::Shipped };
            assert_eq!((row.status, row.version), (winner, 1));
        }
    }

    #[test]
    fn cancel_vs_ship_blocking() {
        let Some(db) = seeded() else { return };
        let pool = &db.pool;
        cancel_vs_ship(pool, || Blocking(pool.get().unwrap()));
    }

    #[test]
    fn cancel_vs_ship_async() {
        let Some(db) = seeded() else { return };
        let (pool, url) = (&db.pool, &db.url);
        cancel_vs_ship(pool, || {
            let runtime = common::paths::runtime();
            Async { conn: Conn::connect(url, &runtime), runtime }
        });
    }

    /// 8 writers add one to the same row 10 times each, every one retrying its conflicts:
    /// nothing is lost, and every change moved the version once.
    fn eight_writers_lose_nothing<W: Writes + Send>(pool: &Pool, writer: impl Fn() -> W + Sync) {
        let policy = RetryPolicy::default().max_attempts(200);
        let start = std::sync::Barrier::new(8);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let mut w = writer();
                    start.wait();
                    for _ in 0..10 {
                        w.add_one(1, "x", &policy).unwrap();
                    }
                });
            }
        });
        let row = Blocking(pool.get().unwrap()).load(1).unwrap();
        assert_eq!((row.quantity, row.note.len(), row.version), (81, 3 + 80, 80), "{}", W::PATH);
    }

    #[test]
    fn eight_blocking_writers_lose_nothing() {
        let Some(db) = seeded() else { return };
        let pool = &db.pool;
        eight_writers_lose_nothing(pool, || Blocking(pool.get().unwrap()));
    }

    #[test]
    fn eight_async_writers_lose_nothing() {
        let Some(db) = seeded() else { return };
        let (pool, url) = (&db.pool, &db.url);
        eight_writers_lose_nothing(pool, || {
            let runtime = common::paths::runtime();
            Async { conn: Conn::connect(url, &runtime), runtime }
        });
    }

    /// 8 writers add one to the same locked row 10 times each by an unguarded
    /// read-then-write: nothing is lost, and the version never moved.
    fn eight_locked_writers_lose_nothing<W: Writes>(pool: &Pool, writer: impl Fn() -> W + Sync) {
        let start = std::sync::Barrier::new(8);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let mut w = writer();
                    start.wait();
                    for _ in 0..10 {
                        w.add_locked(1, 1, LockWait::Wait).unwrap();
                    }
                });
            }
        });
        let row = Blocking(pool.get().unwrap()).load(1).unwrap();
        assert_eq!((row.quantity, row.version), (81, 0), "{}", W::PATH);
    }

    #[test]
    fn eight_blocking_locked_writers_lose_nothing() {
        let Some(db) = seeded() else { return };
        let pool = &db.pool;
        eight_locked_writers_lose_nothing(pool, || Blocking(pool.get().unwrap()));
    }

    #[test]
    fn eight_async_locked_writers_lose_nothing() {
        let Some(db) = seeded() else { return };
        let (pool, url) = (&db.pool, &db.url);
        eight_locked_writers_lose_nothing(pool, || {
            let runtime = common::paths::runtime();
            Async { conn: Conn::connect(url, &runtime), runtime }
        });
    }

    /// While another transaction holds the row, `NoWait` is refused at once with
    /// `LockHeld` (PostgreSQL, MySQL; SQLite's write transaction waits instead), and the
    /// refused work never ran.
    fn no_wait_is_refused_while_the_row_is_held<W: Writes>(pool: &Pool, mut w: W) {
        if BACKEND == "sqlite" {
            return;
        }
        let (held, checked) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        let refused = std::thread::scope(|s| {
            s.spawn(|| {
                let mut conn = pool.get().unwrap();
                <Order as diesel_occ::Pessimistic>::with_row_locked(&mut conn, &1, LockWait::Wait, |_, _| {
                    held.wait();
                    checked.wait();
                    Ok::<_, Error>(())
                })
                .unwrap();
            });
            held.wait();
            let refused = w.add_locked(1, 1, LockWait::NoWait);
            checked.wait();
            refused
        });
        assert!(matches!(refused, Err(Error::LockHeld { .. })), "{}: {refused:?}", W::PATH);
        assert_eq!(Blocking(pool.get().unwrap()).load(1).unwrap().quantity, 1);
    }

    #[test]
    fn no_wait_is_refused_on_the_blocking_path_while_the_row_is_held() {
        let Some(db) = seeded() else { return };
        no_wait_is_refused_while_the_row_is_held(&db.pool, Blocking(db.pool.get().unwrap()));
    }

    #[test]
    fn no_wait_is_refused_on_the_async_path_while_the_row_is_held() {
        let Some(db) = seeded() else { return };
        no_wait_is_refused_while_the_row_is_held(&db.pool, async_writer(&db));
    }
}
