//! Guarded inserts and the delete + re-insert case (ABA): a row inserted again under a
//! key that was deleted never starts at a token a copy of the old row can hold, so a
//! stale copy cannot write into it. Checked per guard kind, from the database, on every
//! backend and both drivers (the blocking API and the async one).

#![cfg(feature = "chrono")]

use crate::common;

use chrono::NaiveDateTime;
use common::drivers::{race, Delete, Insert, Touch, Update};
use common::models::Order;
use common::schema::orders;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_occ::{Error, Guarded, Pooled};

diesel::table! {
    /// A row guarded by a timestamp, on the writer's clock or the database's.
    stamped (id) {
        id -> BigInt,
        body -> Text,
        modified -> Timestamp,
    }
}

#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, Guarded)]
#[diesel(table_name = stamped)]
struct Stamped {
    id: i64,
    body: String,
    #[occ(last_modified)]
    modified: NaiveDateTime,
}

#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = stamped)]
struct ServerStamped {
    id: i64,
    body: String,
    #[occ(last_modified(clock = database))]
    modified: NaiveDateTime,
}

/// The changes of a write of an order's note.
type NoteIs = diesel::dsl::Eq<orders::note, &'static str>;

/// The changes of a write of a stamped row's body.
type BodyIs = diesel::dsl::Eq<stamped::body, &'static str>;

/// Microseconds since 1970 on 2023-11-14: every seed is past it.
const CLOCK_SEEDED: i64 = 1_700_000_000_000_000;

for_each_backend! {
    type Db = common::TestDb<Conn>;

    /// `stamped` with a microsecond column whose default is the server's clock in UTC.
    fn create_stamped(db: &Db) {
        let column = match BACKEND {
            "postgres" => "TIMESTAMP(6) NOT NULL DEFAULT (clock_timestamp() AT TIME ZONE 'UTC')",
            "mysql" => "DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))",
            _ => "TIMESTAMP NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))",
        };
        db.conn()
            .batch_execute(&format!("CREATE TABLE stamped (id BIGINT PRIMARY KEY, body TEXT NOT NULL, modified {column})"))
            .unwrap();
    }

    fn stored_order(conn: &mut Pooled<Conn>, id: i64) -> Option<Order> {
        orders::table.find(id).select(Order::as_select()).first(conn).optional().unwrap()
    }

    /// The insert seeds the version from the clock and records it in the copy.
    fn an_insert_seeds_the_version_and_records_it<W: Insert<Order> + Update<Order, NoteIs>>(db: &Db, w: impl Fn() -> W) {
        let (conn, w) = (&mut db.conn(), &mut w());
        let mut order = Order::new(1, "new");
        let version = w.insert(&mut order).unwrap();
        assert!(version > CLOCK_SEEDED, "{version}");
        assert_eq!(order.version, version);
        assert_eq!(stored_order(conn, 1), Some(order.clone()));
        // The copy writes on as any loaded copy does.
        assert_eq!(w.update(&order, orders::note.eq("gift")).unwrap(), version + 1);
    }

    /// Delete, then insert the same key again from the very copy: the copy read before
    /// the delete conflicts with the new row instead of writing into it.
    fn a_stale_copy_cannot_write_into_a_reinserted_row<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Insert<Order> + Delete<Order> + Update<Order, NoteIs>,
    {
        let (conn, w) = (&mut db.conn(), &mut w());
        let mut order = Order::new(1, "first life");
        w.insert(&mut order).unwrap();
        let stale = order.clone();
        w.delete(&order).unwrap();
        let mut again = stale.clone();
        again.note = "second life".into();
        w.insert(&mut again).unwrap();
        assert!(again.version > stale.version);

        let stale_write = w.update(&stale, orders::note.eq("lost update"));
        match stale_write {
            Err(Error::Conflict(conflict)) => {
                assert_eq!(conflict.current::<Order>(), Some(&again));
            }
            other => panic!("the stale copy must conflict, got {other:?}"),
        }
        assert!(matches!(w.delete(&stale), Err(Error::Conflict(_))));
        assert_eq!(stored_order(conn, 1), Some(again));
    }

    /// A taken key: `AlreadyExists` with the row there; nothing written.
    fn an_insert_on_a_taken_key_is_already_exists<W: Insert<Order>>(db: &Db, w: impl Fn() -> W) {
        let (conn, w) = (&mut db.conn(), &mut w());
        let mut first = Order::new(1, "first");
        w.insert(&mut first).unwrap();
        let mut second = Order::new(1, "second");
        let before = second.clone();
        match w.insert(&mut second) {
            Err(Error::AlreadyExists { table: "orders", current, .. }) => {
                assert_eq!(current.as_any().downcast_ref::<Order>(), Some(&first));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(second, before, "the refused copy is as it was");
        assert_eq!(stored_order(conn, 1), Some(first));
    }

    /// 8 threads insert the same key at once: one row, one winner, seven
    /// `AlreadyExists` naming it.
    fn racing_inserts_of_one_key_have_one_winner<W: Insert<Order>>(db: &Db, w: impl Fn() -> W + Sync) {
        let results: Vec<Result<Order, Error>> = race(8, w, |t, w| {
            let mut order = Order::new(7, &format!("thread {t}"));
            w.insert(&mut order).map(|_| order)
        });
        let winners: Vec<&Order> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(winners.len(), 1, "{results:?}");
        for result in &results {
            match result {
                Ok(_) => {}
                Err(Error::AlreadyExists { .. }) => {}
                // SQLite's writers take turns; a turn that timed out is a retryable busy.
                Err(Error::Retryable { .. }) if BACKEND == "sqlite" => {}
                Err(other) => panic!("{other}"),
            }
        }
        assert_eq!(stored_order(&mut db.conn(), 7).as_ref(), Some(winners[0]));
    }

    /// The same for a last-modified guard on the writer's clock: the new row starts at
    /// now, past the copy's own stamp.
    fn a_reinserted_row_with_a_timestamp_guard_is_safe_from_stale_copies<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Insert<Stamped> + Delete<Stamped> + Update<Stamped, BodyIs>,
    {
        create_stamped(db);
        let (conn, w) = (&mut db.conn(), &mut w());
        let at = NaiveDateTime::parse_from_str("2026-01-01 10:00:00", "%Y-%m-%d %H:%M:%S").unwrap();
        let mut row = Stamped { id: 1, body: "first".into(), modified: at };
        w.insert(&mut row).unwrap();
        let stale = row.clone();
        w.delete(&row).unwrap();
        let mut again = stale.clone();
        w.insert(&mut again).unwrap();
        assert!(again.modified > stale.modified);
        assert!(matches!(w.update(&stale, stamped::body.eq("lost")), Err(Error::Conflict(_))));
        let stored: Stamped = stamped::table.find(1).select(Stamped::as_select()).first(conn).unwrap();
        assert_eq!(stored, again);
    }

    /// A database-clock guard needs no seeding by the library: a row inserted by other
    /// code that leaves the column to its default gets the server's now, past every stamp
    /// the old row had once the server's clock has passed the last one. (Writes faster
    /// than one per tick push the token a tick ahead of the clock, as they push a version
    /// ahead of its clock seed; SQLite's tick is a millisecond, so the test waits for the
    /// server's clock to pass the stale stamp, reading it from the server.)
    fn a_row_reinserted_with_the_servers_clock_is_safe_from_stale_copies<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Touch<ServerStamped> + Delete<ServerStamped> + Update<ServerStamped, BodyIs>,
    {
        create_stamped(db);
        let (conn, w) = (&mut db.conn(), &mut w());
        conn.batch_execute("INSERT INTO stamped (id, body) VALUES (1, 'first')").unwrap();
        let mut row: ServerStamped = stamped::table.find(1).select(ServerStamped::as_select()).first(conn).unwrap();
        w.touch(&mut row).unwrap();
        let stale = row.clone();
        w.delete(&row).unwrap();
        let server_now = match BACKEND {
            "postgres" => "clock_timestamp() AT TIME ZONE 'UTC'",
            "mysql" => "UTC_TIMESTAMP(6)",
            _ => "strftime('%Y-%m-%d %H:%M:%f', 'now')",
        };
        let passed = (0..100_000).any(|_| {
            diesel::select(diesel::dsl::sql::<diesel::sql_types::Timestamp>(server_now))
                .get_result::<NaiveDateTime>(conn)
                .unwrap()
                > stale.modified
        });
        assert!(passed, "the server's clock never passed {}", stale.modified);
        conn.batch_execute("INSERT INTO stamped (id, body) VALUES (1, 'second')").unwrap();
        assert!(matches!(w.update(&stale, stamped::body.eq("lost")), Err(Error::Conflict(_))));
        let body: String = stamped::table.find(1).select(stamped::body).first(conn).unwrap();
        assert_eq!(body, "second");
    }

    /// An insert whose key is taken when it runs and free again when the library reads
    /// the row that took it (inserted and deleted by another session meanwhile) is
    /// written or `AlreadyExists`, never the raw unique violation (found by the soak on
    /// PostgreSQL's async path).
    fn an_insert_racing_an_insert_and_delete_is_written_or_already_exists<W: Insert<Order>>(
        db: &Db,
        w: impl Fn() -> W + Sync,
    ) {
        const KEYS: i64 = 200;
        let (each_key, pool) = (std::sync::Barrier::new(2), &db.pool);
        let answers = race(2, w, |t, w| {
            let mut wrong = Vec::new();
            for key in 1..=KEYS {
                each_key.wait();
                if t == 0 {
                    // Holds the key uncommitted for a moment, so that the other insert
                    // waits on it, then frees it at once after the commit.
                    let conn = &mut pool.get().unwrap();
                    let begin = if BACKEND == "sqlite" { "BEGIN IMMEDIATE" } else { "BEGIN" };
                    conn.batch_execute(begin).unwrap();
                    let other = diesel::insert_into(orders::table).values(&Order::new(key, "other")).execute(conn);
                    // The other insert may have come first: then there is no race this round.
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    conn.batch_execute(if other.is_ok() { "COMMIT" } else { "ROLLBACK" }).unwrap();
                    if other.is_ok() {
                        diesel::delete(orders::table.find(key)).execute(conn).unwrap();
                    }
                    continue;
                }
                std::thread::sleep(std::time::Duration::from_micros(300));
                match w.insert(&mut Order::new(key, "mine")) {
                    Ok(_) | Err(Error::AlreadyExists { .. }) => {}
                    Err(other) => wrong.push(format!("key {key}: {other:?}")),
                }
            }
            wrong
        });
        let wrong: Vec<_> = answers.into_iter().flatten().collect();
        assert!(wrong.is_empty(), "{} wrong answers: {wrong:?}", wrong.len());
    }

    tests_on_both_drivers!(
        |_: &Db| ();
        an_insert_racing_an_insert_and_delete_is_written_or_already_exists,
        an_insert_seeds_the_version_and_records_it,
        a_stale_copy_cannot_write_into_a_reinserted_row,
        an_insert_on_a_taken_key_is_already_exists,
        racing_inserts_of_one_key_have_one_winner,
        a_reinserted_row_with_a_timestamp_guard_is_safe_from_stale_copies,
        a_row_reinserted_with_the_servers_clock_is_safe_from_stale_copies,
    );
}

/// `xmin` needs no seeding either: any insert gives the row the inserting transaction's
/// id, which no copy of the old row holds. PostgreSQL only, on both drivers.
#[cfg(feature = "postgres")]
mod xmin {
    #![allow(unused_imports)]
    use super::*;

    diesel::table! {
        use diesel::sql_types::*;
        use diesel_occ::Xid;

        items (id) {
            id -> BigInt,
            note -> Text,
            xmin -> Xid,
        }
    }

    #[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Guarded)]
    #[diesel(table_name = items)]
    pub struct Item {
        id: i64,
        note: String,
        #[occ(xmin)]
        xmin: u32,
    }

    type Conn = diesel::PgConnection;
    fn db() -> Option<common::TestDb<Conn>> {
        common::postgres()
    }

    type ItemNoteIs = diesel::dsl::Eq<items::note, &'static str>;

    fn a_row_reinserted_under_xmin_is_safe_from_stale_copies<W>(
        db: &common::TestDb<Conn>,
        w: impl Fn() -> W,
    ) where
        W: Delete<Item> + Update<Item, ItemNoteIs>,
    {
        let (conn, w) = (&mut db.conn(), &mut w());
        conn.batch_execute("CREATE TABLE items (id BIGINT PRIMARY KEY, note TEXT NOT NULL); INSERT INTO items VALUES (1, 'first')")
            .unwrap();
        let load = |conn: &mut Pooled<Conn>| -> Item {
            items::table
                .find(1)
                .select(Item::as_select())
                .first(conn)
                .unwrap()
        };
        let stale = load(conn);
        w.delete(&stale).unwrap();
        conn.batch_execute("INSERT INTO items VALUES (1, 'second')")
            .unwrap();
        assert!(matches!(
            w.update(&stale, items::note.eq("lost")),
            Err(Error::Conflict(_))
        ));
        assert_eq!(load(conn).note, "second");
    }

    tests_on_both_drivers!(
        |_: &common::TestDb<Conn>| ();
        a_row_reinserted_under_xmin_is_safe_from_stale_copies
    );
}
