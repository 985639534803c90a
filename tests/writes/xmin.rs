//! PostgreSQL's `xmin` system column as the token: no schema change, the new token read
//! back by the same statement.

#![cfg(feature = "postgres")]

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_occ::{
    BatchMode, Error, Guarded, GuardedBatch, GuardedBulk, GuardedWrite, Pooled, RowOutcome, Token,
};

diesel::table! {
    use diesel::sql_types::*;
    use diesel_occ::Xid;

    items (id) {
        id -> BigInt,
        note -> Text,
        counter -> BigInt,
        xmin -> Xid,
    }
}

#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = items)]
struct Item {
    id: i64,
    note: String,
    counter: i64,
    #[occ(xmin)]
    xmin: u32,
}

fn setup() -> Option<common::TestDb<PgConnection>> {
    let db = common::postgres()?;
    db.conn()
        .batch_execute(
            "CREATE TABLE items (id BIGINT PRIMARY KEY, note TEXT NOT NULL, counter BIGINT NOT NULL);
             INSERT INTO items (id, note, counter) VALUES (1, 'new', 0);",
        )
        .unwrap();
    Some(db)
}

fn load(conn: &mut Pooled<PgConnection>) -> Item {
    items::table
        .find(1)
        .select(Item::as_select())
        .first(conn)
        .unwrap()
}

#[test]
fn save_returns_the_new_xmin_from_the_same_statement() {
    let Some(db) = setup() else { return };
    let conn = &mut db.conn();
    let mut item = load(conn);
    let before = item.xmin;

    item.note = "edited".into();
    let after = item.guarded_save(conn).unwrap();

    assert_ne!(after, before);
    assert_eq!(load(conn), item, "the returned xmin is the row's");
}

#[test]
fn stale_copy_conflicts_with_the_current_row() {
    let Some(db) = setup() else { return };
    let conn = &mut db.conn();
    let mut winner = load(conn);
    let stale = winner.clone();
    winner.note = "winner".into();
    winner.guarded_save(conn).unwrap();

    let err = stale
        .guarded_update(conn, items::note.eq("loser"))
        .unwrap_err();

    let conflict = err.as_conflict().unwrap_or_else(|| panic!("{err:?}"));
    assert_eq!(
        (&conflict.expected, &conflict.found),
        (
            &Token::RowVersion(stale.xmin),
            &Token::RowVersion(winner.xmin)
        )
    );
    assert_eq!(conflict.current::<Item>(), Some(&winner));
}

#[test]
fn stateless_writes_and_deletes_take_the_xmin_the_client_saw() {
    let Some(db) = setup() else { return };
    let conn = &mut db.conn();
    let seen = load(conn).xmin;

    let next = Item::guarded_update_by_key(conn, &1, &seen, items::note.eq("form")).unwrap();
    let stale_delete = Item::guarded_delete_by_key(conn, &1, &seen).unwrap_err();
    Item::guarded_delete_by_key(conn, &1, &next).unwrap();

    assert!(stale_delete.as_conflict().is_some(), "{stale_delete:?}");
    let gone = Item::guarded_update_by_key(conn, &1, &next, items::note.eq("x")).unwrap_err();
    assert!(matches!(gone, Error::NotFound { .. }), "{gone:?}");
}

/// `xmin` changes only when PostgreSQL writes the row; with nothing to set there is no
/// write, so a touch is refused rather than faked.
#[test]
fn touch_is_refused_before_sending() {
    let Some(db) = setup() else { return };
    let conn = &mut db.conn();
    let mut item = load(conn);

    let err = item.guarded_touch(conn).unwrap_err();

    assert!(
        matches!(
            err,
            Error::Database(diesel::result::Error::QueryBuilderError(_))
        ),
        "{err:?}"
    );
    assert_eq!(load(conn), item);
}

#[test]
fn concurrent_increments_lose_no_update() {
    const THREADS: usize = 8;
    const PER_THREAD: usize = 20;
    let Some(db) = setup() else { return };
    let (start, retries) = (Barrier::new(THREADS), AtomicUsize::new(0));

    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                let mut conn = db.pool.get().unwrap();
                start.wait();
                let mut done = 0;
                while done < PER_THREAD {
                    let item = load(&mut conn);
                    match item.guarded_update(&mut conn, items::counter.eq(item.counter + 1)) {
                        Ok(_) => done += 1,
                        Err(e) if e.is_retryable() => {
                            retries.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
            });
        }
    });

    assert_eq!(
        load(&mut db.conn()).counter,
        (THREADS * PER_THREAD) as i64,
        "a lost update"
    );
}

/// A batch on PostgreSQL is one statement; each written row's new `xmin` comes back
/// from it, and a stale row reports the current one.
#[test]
fn a_batch_returns_each_written_rows_new_xmin() {
    let Some(db) = setup() else { return };
    let conn = &mut db.conn();
    conn.batch_execute("INSERT INTO items (id, note, counter) VALUES (2, 'new', 0)")
        .unwrap();
    let (first, second) = (
        load(conn),
        items::table
            .find(2)
            .select(Item::as_select())
            .first::<Item>(conn)
            .unwrap(),
    );
    Item::guarded_update_by_key(conn, &2, &second.xmin, items::note.eq("theirs")).unwrap();

    let rows = vec![
        (1, first.xmin, items::counter.eq(5)),
        (2, second.xmin, items::counter.eq(5)),
    ];
    let report = Item::guarded_update_batch(conn, rows, BatchMode::Partial).unwrap();

    match (&report.rows[0], &report.rows[1]) {
        (RowOutcome::Written(xmin), RowOutcome::Conflict(conflict)) => {
            assert_eq!(*xmin, load(conn).xmin, "the returned xmin is the row's");
            assert_eq!(conflict.current::<Item>().unwrap().note, "theirs");
        }
        other => panic!("{other:?}"),
    }
}

/// A bulk update needs nothing of its own to advance `xmin`: PostgreSQL gives every
/// written row a new one, so every copy read before it conflicts.
#[test]
fn bulk_update_gives_every_row_a_new_xmin() {
    let Some(db) = setup() else { return };
    let conn = &mut db.conn();
    conn.batch_execute("INSERT INTO items (id, note, counter) VALUES (2, 'new', 0)")
        .unwrap();
    let before: Vec<Item> = items::table
        .order(items::id)
        .select(Item::as_select())
        .load(conn)
        .unwrap();

    let report = Item::guarded_bulk_update(conn, items::id.gt(0), items::counter.eq(5)).unwrap();

    assert_eq!((report.updated, report.at_maximum), (2, 0));
    for old in before {
        let stale = old.guarded_update(conn, items::note.eq("stale"));
        assert!(matches!(stale, Err(Error::Conflict(_))), "{stale:?}");
    }
    let notes: Vec<(String, i64)> = items::table
        .order(items::id)
        .select((items::note, items::counter))
        .load(conn)
        .unwrap();
    assert_eq!(notes, [("new".to_string(), 5), ("new".to_string(), 5)]);
}
