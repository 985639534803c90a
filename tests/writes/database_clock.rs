//! The last-modified guard on the database's clock, on every backend: the server stamps
//! the row, always moving on, and the writer learns the new timestamp from the same
//! statement (`RETURNING`, PostgreSQL and SQLite) or the same transaction (MySQL).

#![cfg(feature = "chrono")]

use crate::common;

use std::sync::Barrier;

use chrono::{DateTime, NaiveDateTime, TimeDelta};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_occ::{BatchMode, Guarded, GuardedBatch, GuardedWrite, Pooled, RowOutcome};

diesel::table! {
    notes (id) {
        id -> BigInt,
        body -> Text,
        hits -> BigInt,
        changed_at -> Timestamp,
    }
}

#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, Guarded)]
#[diesel(table_name = notes)]
struct Note {
    id: i64,
    body: String,
    hits: i64,
    #[occ(last_modified(clock = database))]
    changed_at: NaiveDateTime,
}

for_each_backend! {
    fn setup(changed_at: NaiveDateTime) -> Option<common::TestDb<Conn>> {
        let db = db()?;
        let conn = &mut db.conn();
        let column = if BACKEND == "mysql" { "DATETIME(6)" } else { "TIMESTAMP" };
        conn.batch_execute(&format!(
            "CREATE TABLE notes (id BIGINT PRIMARY KEY, body TEXT NOT NULL, \
             hits BIGINT NOT NULL, changed_at {column} NOT NULL)"
        ))
        .unwrap();
        let note = Note { id: 1, body: "draft".into(), hits: 0, changed_at };
        diesel::insert_into(notes::table).values(&note).execute(conn).unwrap();
        Some(db)
    }

    fn load(conn: &mut Pooled<Conn>) -> Note {
        notes::table.find(1).select(Note::as_select()).first(conn).unwrap()
    }

    /// The server's clock, seen from the server.
    fn server_now(conn: &mut Pooled<Conn>) -> NaiveDateTime {
        let now = match BACKEND {
            "postgres" => "clock_timestamp() AT TIME ZONE 'UTC'",
            "mysql" => "UTC_TIMESTAMP(6)",
            _ => "strftime('%Y-%m-%d %H:%M:%f', 'now')",
        };
        diesel::select(diesel::dsl::sql::<diesel::sql_types::Timestamp>(now))
            .get_result(conn)
            .unwrap()
    }

    #[test]
    fn the_server_stamps_the_row_and_the_writer_learns_it() {
        let Some(db) = setup(DateTime::UNIX_EPOCH.naive_utc()) else { return };
        let conn = &mut db.conn();
        let mut note = load(conn);
        let before = server_now(conn);

        note.body = "saved".into();
        let stamped = note.guarded_save(conn).unwrap();

        let after = server_now(conn);
        assert!(before <= stamped && stamped <= after, "{before} <= {stamped} <= {after}");
        assert_eq!(load(conn), note, "the returned timestamp is the row's");
        // And the copy proves itself with it: the stored text compares equal.
        note.body = "saved again".into();
        note.guarded_save(conn).unwrap();
        assert_eq!(load(conn), note);
    }

    /// A row stamped in the future (another machine's clock, a manual fix) still advances,
    /// by one tick, and each write moves on again. (2037: MySQL binds diesel's `Timestamp`
    /// as a TIMESTAMP, whose range ends in 2038.)
    #[test]
    fn a_stored_timestamp_ahead_of_the_server_still_advances() {
        let ahead = DateTime::parse_from_rfc3339("2037-01-01T00:00:00Z").unwrap().naive_utc();
        let Some(db) = setup(ahead) else { return };
        let conn = &mut db.conn();
        let mut note = load(conn);
        let stale = note.clone();

        for i in 1..=3 {
            note.hits = i;
            assert_eq!(note.guarded_save(conn).unwrap(), ahead + TimeDelta::microseconds(i));
        }

        let err = stale.guarded_update(conn, notes::body.eq("stale")).unwrap_err();
        assert!(err.as_conflict().is_some(), "{err:?}");
        assert_eq!(load(conn), note);
    }

    /// Many writes inside one tick of the server's clock (SQLite's keeps milliseconds)
    /// each get their own timestamp.
    #[test]
    fn writes_within_one_server_tick_each_advance() {
        let Some(db) = setup(DateTime::UNIX_EPOCH.naive_utc()) else { return };
        let conn = &mut db.conn();
        let mut note = load(conn);
        let mut seen = vec![note.changed_at];

        for i in 1..=50 {
            note.hits = i;
            seen.push(note.guarded_save(conn).unwrap());
        }

        assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
        assert_eq!(load(conn), note);
    }

    /// A batch learns each written row's stamp: from its one statement on PostgreSQL,
    /// row by row elsewhere.
    #[test]
    fn a_batch_returns_each_written_rows_stamp() {
        let Some(db) = setup(DateTime::UNIX_EPOCH.naive_utc()) else { return };
        let conn = &mut db.conn();
        let note = load(conn);

        let rows = vec![(1, note.changed_at, notes::hits.eq(3)), (2, note.changed_at, notes::hits.eq(3))];
        let report = Note::guarded_update_batch(conn, rows, BatchMode::Partial).unwrap();

        match (&report.rows[0], &report.rows[1]) {
            (RowOutcome::Written(stamp), RowOutcome::NotFound) => {
                assert_eq!(*stamp, load(conn).changed_at, "the returned stamp is the row's")
            }
            other => panic!("{other:?}"),
        }
    }

    /// The same on diesel-async, with a stale row between: PostgreSQL's batch statement
    /// returns each written row's stamp; elsewhere each row's write reads its own.
    #[cfg(all(feature = "async", any(not(feature = "mysql"), feature = "async-mysql")))]
    #[test]
    fn an_async_batch_returns_each_written_rows_stamp() {
        use common::paths::AsyncOf;
        use diesel_occ::asynchronous::AsyncGuardedBatch;
        let Some(db) = setup(DateTime::UNIX_EPOCH.naive_utc()) else { return };
        let conn = &mut db.conn();
        let stale = load(conn);
        let second = Note { id: 2, ..stale.clone() };
        diesel::insert_into(notes::table).values(&second).execute(conn).unwrap();
        second.guarded_update(conn, notes::hits.eq(1)).unwrap();
        let runtime = common::paths::runtime();
        let mut async_conn = Conn::connect(&db.url, &runtime);

        let rows = vec![(1, stale.changed_at, notes::hits.eq(3)), (2, stale.changed_at, notes::hits.eq(3))];
        let batch = <Note as AsyncGuardedBatch>::guarded_update_batch(&mut async_conn, rows, BatchMode::Partial);
        let report = runtime.block_on(batch).unwrap();

        match (&report.rows[0], &report.rows[1]) {
            (RowOutcome::Written(stamp), RowOutcome::Conflict(conflict)) => {
                assert_eq!(*stamp, load(conn).changed_at, "the returned stamp is the row's");
                assert_eq!(conflict.current::<Note>().unwrap().hits, 1);
            }
            other => panic!("{other:?}"),
        }
    }

    /// Inside the caller's transaction (MySQL's read-back is then a savepoint), a stale
    /// write is still a conflict and the caller's transaction goes on.
    #[test]
    fn inside_a_transaction_the_stamp_is_read_back_and_conflicts_still_report() {
        let Some(db) = setup(DateTime::UNIX_EPOCH.naive_utc()) else { return };
        let conn = &mut db.conn();
        let stale = load(conn);

        let stamped = conn
            .transaction::<_, diesel_occ::Error, _>(|conn| {
                let stamped = stale.guarded_update(conn, notes::hits.eq(1))?;
                let err = stale.guarded_update(conn, notes::hits.eq(2)).unwrap_err();
                assert!(err.as_conflict().is_some(), "{err:?}");
                Ok(stamped)
            })
            .unwrap();

        let stored = load(conn);
        assert_eq!((stored.hits, stored.changed_at), (1, stamped));
    }

    #[test]
    fn concurrent_increments_lose_no_update() {
        const THREADS: usize = 8;
        const PER_THREAD: usize = 20;
        let Some(db) = setup(DateTime::UNIX_EPOCH.naive_utc()) else { return };
        let start = Barrier::new(THREADS);

        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    let mut conn = db.pool.get().unwrap();
                    start.wait();
                    let mut done = 0;
                    while done < PER_THREAD {
                        let note = load(&mut conn);
                        match note.guarded_update(&mut conn, notes::hits.eq(note.hits + 1)) {
                            Ok(_) => done += 1,
                            Err(e) if e.is_retryable() => {}
                            Err(e) => panic!("{e}"),
                        }
                    }
                });
            }
        });

        assert_eq!(load(&mut db.conn()).hits, (THREADS * PER_THREAD) as i64);
    }
}

/// `timestamptz` read as `DateTime<Utc>`, at a declared precision (PostgreSQL).
#[cfg(feature = "postgres")]
mod zoned {
    use super::*;
    use chrono::Utc;

    diesel::table! {
        events (id) {
            id -> BigInt,
            title -> Text,
            changed_at -> Timestamptz,
        }
    }

    #[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, Guarded)]
    #[diesel(table_name = events)]
    struct Event {
        id: i64,
        title: String,
        #[occ(last_modified(clock = database, precision = "seconds"))]
        changed_at: DateTime<Utc>,
    }

    #[test]
    fn utc_date_times_are_stamped_at_the_declared_precision() {
        let Some(db) = common::postgres() else { return };
        let conn = &mut db.conn();
        conn.batch_execute(
            "CREATE TABLE events (id BIGINT PRIMARY KEY, title TEXT NOT NULL, \
             changed_at TIMESTAMPTZ NOT NULL)",
        )
        .unwrap();
        let mut event = Event {
            id: 1,
            title: "launch".into(),
            changed_at: DateTime::UNIX_EPOCH,
        };
        diesel::insert_into(events::table)
            .values(&event)
            .execute(conn)
            .unwrap();

        event.title = "launch day".into();
        let stamped = event.guarded_save(conn).unwrap();

        assert_eq!(stamped.timestamp_subsec_micros(), 0, "whole seconds");
        let stored: Event = events::table
            .select(Event::as_select())
            .first(conn)
            .unwrap();
        assert_eq!(stored, event);
    }
}

/// SQLite keeps a `DateTime<Utc>` as text with `+00:00`: the server's stamp is written in
/// that form, so the next write's comparison is exact.
#[cfg(feature = "sqlite")]
mod zoned_sqlite {
    use super::*;
    use chrono::Utc;

    diesel::table! {
        use diesel::sql_types::*;
        use diesel::sql_types::TimestamptzSqlite;

        events (id) {
            id -> BigInt,
            title -> Text,
            changed_at -> TimestamptzSqlite,
        }
    }

    #[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, Guarded)]
    #[diesel(table_name = events)]
    struct Event {
        id: i64,
        title: String,
        #[occ(last_modified(clock = database))]
        changed_at: DateTime<Utc>,
    }

    #[test]
    fn utc_date_times_keep_their_text_form_and_compare_exactly() {
        let Some(db) = common::sqlite() else { return };
        let conn = &mut db.conn();
        conn.batch_execute(
            "CREATE TABLE events (id BIGINT PRIMARY KEY, title TEXT NOT NULL, \
             changed_at TEXT NOT NULL)",
        )
        .unwrap();
        let mut event = Event {
            id: 1,
            title: "launch".into(),
            changed_at: DateTime::UNIX_EPOCH,
        };
        diesel::insert_into(events::table)
            .values(&event)
            .execute(conn)
            .unwrap();

        for title in ["launch day", "launched", "relaunched"] {
            event.title = title.into();
            event.guarded_save(conn).unwrap();
        }

        let stored: Event = events::table
            .select(Event::as_select())
            .first(conn)
            .unwrap();
        assert_eq!(stored, event);
        let text: String = events::table
            .select(diesel::dsl::sql::<diesel::sql_types::Text>("changed_at"))
            .first(conn)
            .unwrap();
        assert!(text.ends_with("+00:00"), "{text}");
    }
}
