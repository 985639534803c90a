//! PostgreSQL's `xmin` system column as the token: no schema change, the new token read
//! back by the same statement. Each body runs on both drivers (the blocking API and the
//! async one).

#![cfg(feature = "postgres")]

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};

use common::drivers::{
    race, BatchUpdate, BulkUpdate, DeleteByKey, Read, Save, Touch, Update, UpdateByKey,
};
use diesel::connection::SimpleConnection;
use diesel::dsl;
use diesel::prelude::*;
use diesel_occ::{BatchMode, Error, Guarded, Pooled, RowOutcome, Token};

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

/// The changes of a note update.
type Note = dsl::Eq<items::note, &'static str>;
/// The changes of a counter update.
type Counter = dsl::Eq<items::counter, i64>;

type Conn = PgConnection;
type Db = common::TestDb<Conn>;

fn db() -> Option<Db> {
    common::postgres()
}

fn setup(db: &Db) {
    db.conn()
        .batch_execute(
            "CREATE TABLE items (id BIGINT PRIMARY KEY, note TEXT NOT NULL, counter BIGINT NOT NULL);
             INSERT INTO items (id, note, counter) VALUES (1, 'new', 0);",
        )
        .unwrap();
}

fn load(conn: &mut Pooled<PgConnection>) -> Item {
    items::table
        .find(1)
        .select(Item::as_select())
        .first(conn)
        .unwrap()
}

fn save_returns_the_new_xmin_from_the_same_statement<W: Save<Item>>(db: &Db, w: impl Fn() -> W) {
    let conn = &mut db.conn();
    let mut item = load(conn);
    let before = item.xmin;

    item.note = "edited".into();
    let after = w().save(&mut item).unwrap();

    assert_ne!(after, before);
    assert_eq!(load(conn), item, "the returned xmin is the row's");
}

fn stale_copy_conflicts_with_the_current_row<W: Save<Item> + Update<Item, Note>>(
    db: &Db,
    w: impl Fn() -> W,
) {
    let (conn, w) = (&mut db.conn(), &mut w());
    let mut winner = load(conn);
    let stale = winner.clone();
    winner.note = "winner".into();
    w.save(&mut winner).unwrap();

    let err = w.update(&stale, items::note.eq("loser")).unwrap_err();

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

fn stateless_writes_and_deletes_take_the_xmin_the_client_saw<W>(db: &Db, w: impl Fn() -> W)
where
    W: UpdateByKey<Item, Note> + DeleteByKey<Item>,
{
    let (conn, w) = (&mut db.conn(), &mut w());
    let seen = load(conn).xmin;

    let next = w.update_by_key(&1, &seen, items::note.eq("form")).unwrap();
    let stale_delete = w.delete_by_key(&1, &seen).unwrap_err();
    w.delete_by_key(&1, &next).unwrap();

    assert!(stale_delete.as_conflict().is_some(), "{stale_delete:?}");
    let gone = w.update_by_key(&1, &next, items::note.eq("x")).unwrap_err();
    assert!(matches!(gone, Error::NotFound { .. }), "{gone:?}");
}

/// `xmin` changes only when PostgreSQL writes the row; with nothing to set there is no
/// write, so a touch is refused rather than faked.
fn touch_is_refused_before_sending<W: Touch<Item>>(db: &Db, w: impl Fn() -> W) {
    let conn = &mut db.conn();
    let mut item = load(conn);

    let err = w().touch(&mut item).unwrap_err();

    assert!(
        matches!(
            err,
            Error::Database(diesel::result::Error::QueryBuilderError(_))
        ),
        "{err:?}"
    );
    assert_eq!(load(conn), item);
}

/// Eight threads, each reading and writing on an executor of its own.
fn concurrent_increments_lose_no_update<W>(db: &Db, w: impl Fn() -> W + Sync)
where
    W: Read<Item> + Update<Item, Counter>,
{
    const THREADS: usize = 8;
    const PER_THREAD: usize = 20;
    let retries = AtomicUsize::new(0);

    race(THREADS, w, |_, w| {
        let mut done = 0;
        while done < PER_THREAD {
            let item = w.read(&1).unwrap();
            match w.update(&item, items::counter.eq(item.counter + 1)) {
                Ok(_) => done += 1,
                Err(e) if e.is_retryable() => {
                    retries.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => panic!("{e}"),
            }
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
fn a_batch_returns_each_written_rows_new_xmin<W>(db: &Db, w: impl Fn() -> W)
where
    W: UpdateByKey<Item, Note> + BatchUpdate<Item, Counter>,
{
    let (conn, w) = (&mut db.conn(), &mut w());
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
    w.update_by_key(&2, &second.xmin, items::note.eq("theirs"))
        .unwrap();

    let rows = vec![
        (1, first.xmin, items::counter.eq(5)),
        (2, second.xmin, items::counter.eq(5)),
    ];
    let report = w.update_batch(rows, BatchMode::Partial).unwrap();

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
fn bulk_update_gives_every_row_a_new_xmin<W>(db: &Db, w: impl Fn() -> W)
where
    W: BulkUpdate<Item, dsl::Gt<items::id, i64>, Counter> + Update<Item, Note>,
{
    let (conn, w) = (&mut db.conn(), &mut w());
    conn.batch_execute("INSERT INTO items (id, note, counter) VALUES (2, 'new', 0)")
        .unwrap();
    let before: Vec<Item> = items::table
        .order(items::id)
        .select(Item::as_select())
        .load(conn)
        .unwrap();

    let report = w
        .bulk_update(items::id.gt(0), items::counter.eq(5))
        .unwrap();

    assert_eq!((report.updated, report.at_maximum), (2, 0));
    for old in before {
        let stale = w.update(&old, items::note.eq("stale"));
        assert!(matches!(stale, Err(Error::Conflict(_))), "{stale:?}");
    }
    let notes: Vec<(String, i64)> = items::table
        .order(items::id)
        .select((items::note, items::counter))
        .load(conn)
        .unwrap();
    assert_eq!(notes, [("new".to_string(), 5), ("new".to_string(), 5)]);
}

crate::tests_on_both_drivers!(
    setup;
    save_returns_the_new_xmin_from_the_same_statement,
    stale_copy_conflicts_with_the_current_row,
    stateless_writes_and_deletes_take_the_xmin_the_client_saw,
    touch_is_refused_before_sending,
    concurrent_increments_lose_no_update,
    a_batch_returns_each_written_rows_new_xmin,
    bulk_update_gives_every_row_a_new_xmin,
);
