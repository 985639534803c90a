//! Guarded inserts and the delete + re-insert case (ABA): a row inserted again under a
//! key that was deleted never starts at a token a copy of the old row can hold, so a
//! stale copy cannot write into it. Checked per guard kind, from the database.

#![cfg(feature = "chrono")]

use crate::common;

use chrono::NaiveDateTime;
use common::models::Order;
use common::schema::orders;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_occ::{Error, Guarded, GuardedWrite, Pooled};

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

/// Microseconds since 1970 on 2023-11-14: every seed is past it.
const CLOCK_SEEDED: i64 = 1_700_000_000_000_000;

for_each_backend! {
    /// `stamped` with a microsecond column whose default is the server's clock in UTC.
    fn setup_stamped() -> Option<common::TestDb<Conn>> {
        let db = db()?;
        let column = match BACKEND {
            "postgres" => "TIMESTAMP(6) NOT NULL DEFAULT (clock_timestamp() AT TIME ZONE 'UTC')",
            "mysql" => "DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))",
            _ => "TIMESTAMP NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))",
        };
        db.conn()
            .batch_execute(&format!("CREATE TABLE stamped (id BIGINT PRIMARY KEY, body TEXT NOT NULL, modified {column})"))
            .unwrap();
        Some(db)
    }

    fn stored_order(conn: &mut Pooled<Conn>, id: i64) -> Option<Order> {
        orders::table.find(id).select(Order::as_select()).first(conn).optional().unwrap()
    }

    /// The insert seeds the version from the clock and records it in the copy.
    #[test]
    fn an_insert_seeds_the_version_and_records_it() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let mut order = Order::new(1, "new");
        let version = order.guarded_insert(conn).unwrap();
        assert!(version > CLOCK_SEEDED, "{version}");
        assert_eq!(order.version, version);
        assert_eq!(stored_order(conn, 1), Some(order.clone()));
        // The copy writes on as any loaded copy does.
        assert_eq!(order.guarded_update(conn, orders::note.eq("gift")).unwrap(), version + 1);
    }

    /// Delete, then insert the same key again from the very copy: the copy read before
    /// the delete conflicts with the new row instead of writing into it.
    #[test]
    fn a_stale_copy_cannot_write_into_a_reinserted_row() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let mut order = Order::new(1, "first life");
        order.guarded_insert(conn).unwrap();
        let stale = order.clone();
        order.guarded_delete(conn).unwrap();
        let mut again = stale.clone();
        again.note = "second life".into();
        again.guarded_insert(conn).unwrap();
        assert!(again.version > stale.version);

        let stale_write = stale.guarded_update(conn, orders::note.eq("lost update"));
        match stale_write {
            Err(Error::Conflict(conflict)) => {
                assert_eq!(conflict.current::<Order>(), Some(&again));
            }
            other => panic!("the stale copy must conflict, got {other:?}"),
        }
        assert!(matches!(stale.guarded_delete(conn), Err(Error::Conflict(_))));
        assert_eq!(stored_order(conn, 1), Some(again));
    }

    /// A taken key: `AlreadyExists` with the row there; nothing written.
    #[test]
    fn an_insert_on_a_taken_key_is_already_exists() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        let mut first = Order::new(1, "first");
        first.guarded_insert(conn).unwrap();
        let mut second = Order::new(1, "second");
        let before = second.clone();
        match second.guarded_insert(conn) {
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
    #[test]
    fn racing_inserts_of_one_key_have_one_winner() {
        let Some(db) = db() else { return };
        let results: Vec<Result<Order, Error>> = db.race(8, |t, conn| {
            let mut order = Order::new(7, &format!("thread {t}"));
            order.guarded_insert(conn).map(|_| order)
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
    #[test]
    fn a_reinserted_row_with_a_timestamp_guard_is_safe_from_stale_copies() {
        let Some(db) = setup_stamped() else { return };
        let conn = &mut db.conn();
        let at = NaiveDateTime::parse_from_str("2026-01-01 10:00:00", "%Y-%m-%d %H:%M:%S").unwrap();
        let mut row = Stamped { id: 1, body: "first".into(), modified: at };
        row.guarded_insert(conn).unwrap();
        let stale = row.clone();
        row.guarded_delete(conn).unwrap();
        let mut again = stale.clone();
        again.guarded_insert(conn).unwrap();
        assert!(again.modified > stale.modified);
        assert!(matches!(stale.guarded_update(conn, stamped::body.eq("lost")), Err(Error::Conflict(_))));
        let stored: Stamped = stamped::table.find(1).select(Stamped::as_select()).first(conn).unwrap();
        assert_eq!(stored, again);
    }

    /// A database-clock guard needs no seeding by the library: a row inserted by other
    /// code that leaves the column to its default gets the server's now, past every stamp
    /// the old row had once the server's clock has passed the last one. (Writes faster
    /// than one per tick push the token a tick ahead of the clock, as they push a version
    /// ahead of its clock seed; SQLite's tick is a millisecond, so the test waits for the
    /// server's clock to pass the stale stamp, reading it from the server.)
    #[test]
    fn a_row_reinserted_with_the_servers_clock_is_safe_from_stale_copies() {
        let Some(db) = setup_stamped() else { return };
        let conn = &mut db.conn();
        conn.batch_execute("INSERT INTO stamped (id, body) VALUES (1, 'first')").unwrap();
        let mut row: ServerStamped = stamped::table.find(1).select(ServerStamped::as_select()).first(conn).unwrap();
        row.guarded_touch(conn).unwrap();
        let stale = row.clone();
        row.guarded_delete(conn).unwrap();
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
        assert!(matches!(stale.guarded_update(conn, stamped::body.eq("lost")), Err(Error::Conflict(_))));
        let body: String = stamped::table.find(1).select(stamped::body).first(conn).unwrap();
        assert_eq!(body, "second");
    }
}

/// `xmin` needs no seeding either: any insert gives the row the inserting transaction's
/// id, which no copy of the old row holds.
#[cfg(feature = "postgres")]
#[test]
fn a_row_reinserted_under_xmin_is_safe_from_stale_copies() {
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
    struct Item {
        id: i64,
        note: String,
        #[occ(xmin)]
        xmin: u32,
    }
    let Some(db) = common::postgres() else { return };
    let conn = &mut db.conn();
    conn.batch_execute("CREATE TABLE items (id BIGINT PRIMARY KEY, note TEXT NOT NULL); INSERT INTO items VALUES (1, 'first')")
        .unwrap();
    let load = |conn: &mut Pooled<PgConnection>| -> Item {
        items::table
            .find(1)
            .select(Item::as_select())
            .first(conn)
            .unwrap()
    };
    let stale = load(conn);
    stale.guarded_delete(conn).unwrap();
    conn.batch_execute("INSERT INTO items VALUES (1, 'second')")
        .unwrap();
    assert!(matches!(
        stale.guarded_update(conn, items::note.eq("lost")),
        Err(Error::Conflict(_))
    ));
    assert_eq!(load(conn).note, "second");
}
