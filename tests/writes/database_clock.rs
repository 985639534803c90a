//! The last-modified guard on the database's clock, on every backend: the server stamps
//! the row, always moving on, and the writer learns the new timestamp from the same
//! statement (`RETURNING`, PostgreSQL and SQLite) or the same transaction (MySQL). Each
//! body runs on both drivers.

#![cfg(feature = "chrono")]

use crate::common;

use std::sync::Barrier;

use chrono::{DateTime, NaiveDateTime, TimeDelta};
use common::drivers::{BatchUpdate, InTransaction, Read, Save, Update};
use diesel::connection::SimpleConnection;
use diesel::dsl;
use diesel::prelude::*;
use diesel_occ::{BatchMode, Guarded, GuardedWrite, Pooled, RowOutcome};

/// The changes the bodies send.
type HitsAre = dsl::Eq<notes::hits, i64>;
type BodyIs = dsl::Eq<notes::body, &'static str>;

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
    type Db = common::TestDb<Conn>;

    /// The notes table, note 1 stamped at the epoch.
    fn setup(db: &Db) {
        let conn = &mut db.conn();
        let column = if BACKEND == "mysql" { "DATETIME(6)" } else { "TIMESTAMP" };
        conn.batch_execute(&format!(
            "CREATE TABLE notes (id BIGINT PRIMARY KEY, body TEXT NOT NULL, \
             hits BIGINT NOT NULL, changed_at {column} NOT NULL)"
        ))
        .unwrap();
        let note = Note { id: 1, body: "draft".into(), hits: 0, changed_at: DateTime::UNIX_EPOCH.naive_utc() };
        diesel::insert_into(notes::table).values(&note).execute(conn).unwrap();
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

    fn the_server_stamps_the_row_and_the_writer_learns_it<W: Save<Note>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        let w = &mut w();
        let mut note = load(conn);
        let before = server_now(conn);

        note.body = "saved".into();
        let stamped = w.save(&mut note).unwrap();

        let after = server_now(conn);
        assert!(before <= stamped && stamped <= after, "{before} <= {stamped} <= {after}");
        assert_eq!(load(conn), note, "the returned timestamp is the row's");
        // And the copy proves itself with it: the stored text compares equal.
        note.body = "saved again".into();
        w.save(&mut note).unwrap();
        assert_eq!(load(conn), note);
    }

    /// A row stamped in the future (another machine's clock, a manual fix) still advances,
    /// by one tick, and each write moves on again. (2037: MySQL binds diesel's `Timestamp`
    /// as a TIMESTAMP, whose range ends in 2038.)
    fn a_stored_timestamp_ahead_of_the_server_still_advances<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Save<Note> + Update<Note, BodyIs>,
    {
        let ahead = DateTime::parse_from_rfc3339("2037-01-01T00:00:00Z").unwrap().naive_utc();
        let conn = &mut db.conn();
        diesel::update(notes::table.find(1)).set(notes::changed_at.eq(ahead)).execute(conn).unwrap();
        let w = &mut w();
        let mut note = load(conn);
        let stale = note.clone();

        for i in 1..=3 {
            note.hits = i;
            assert_eq!(w.save(&mut note).unwrap(), ahead + TimeDelta::microseconds(i));
        }

        let err = w.update(&stale, notes::body.eq("stale")).unwrap_err();
        assert!(err.as_conflict().is_some(), "{err:?}");
        assert_eq!(load(conn), note);
    }

    /// Many writes inside one tick of the server's clock (SQLite's keeps milliseconds)
    /// each get their own timestamp.
    fn writes_within_one_server_tick_each_advance<W: Save<Note>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        let w = &mut w();
        let mut note = load(conn);
        let mut seen = vec![note.changed_at];

        for i in 1..=50 {
            note.hits = i;
            seen.push(w.save(&mut note).unwrap());
        }

        assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
        assert_eq!(load(conn), note);
    }

    /// A batch learns each written row's stamp (from its one statement on PostgreSQL,
    /// row by row elsewhere), with a stale row between and a missing one after.
    fn a_batch_returns_each_written_rows_stamp<W>(db: &Db, w: impl Fn() -> W)
    where
        W: BatchUpdate<Note, HitsAre>,
    {
        let conn = &mut db.conn();
        let stale = load(conn);
        let second = Note { id: 2, ..stale.clone() };
        diesel::insert_into(notes::table).values(&second).execute(conn).unwrap();
        second.guarded_update(conn, notes::hits.eq(1)).unwrap();

        let rows = vec![
            (1, stale.changed_at, notes::hits.eq(3)),
            (2, stale.changed_at, notes::hits.eq(3)),
            (3, stale.changed_at, notes::hits.eq(3)),
        ];
        let report = w().update_batch(rows, BatchMode::Partial).unwrap();

        match (&report.rows[0], &report.rows[1], &report.rows[2]) {
            (RowOutcome::Written(stamp), RowOutcome::Conflict(conflict), RowOutcome::NotFound) => {
                assert_eq!(*stamp, load(conn).changed_at, "the returned stamp is the row's");
                assert_eq!(conflict.current::<Note>().unwrap().hits, 1);
            }
            other => panic!("{other:?}"),
        }
    }

    /// Inside the caller's transaction (MySQL's read-back is then a savepoint), a stale
    /// write is still a conflict and the caller's transaction goes on.
    fn inside_a_transaction_the_stamp_is_read_back_and_conflicts_still_report<W>(db: &Db, w: impl Fn() -> W)
    where
        W: InTransaction + Update<Note, HitsAre>,
    {
        let conn = &mut db.conn();
        let stale = load(conn);

        let stamped = w()
            .in_transaction(|w| {
                let stamped = w.update(&stale, notes::hits.eq(1))?;
                let err = w.update(&stale, notes::hits.eq(2)).unwrap_err();
                assert!(err.as_conflict().is_some(), "{err:?}");
                Ok(stamped)
            })
            .unwrap();

        let stored = load(conn);
        assert_eq!((stored.hits, stored.changed_at), (1, stamped));
    }

    fn concurrent_increments_lose_no_update<W>(db: &Db, w: impl Fn() -> W + Sync)
    where
        W: Update<Note, HitsAre> + Read<Note>,
    {
        const THREADS: usize = 8;
        const PER_THREAD: usize = 20;
        let (start, w) = (Barrier::new(THREADS), &w);

        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    // One connection a thread (the test pool holds 10).
                    let mut driver = w();
                    start.wait();
                    let mut done = 0;
                    while done < PER_THREAD {
                        let note = driver.read(&1).expect("note 1");
                        match driver.update(&note, notes::hits.eq(note.hits + 1)) {
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

    tests_on_both_drivers!(
        setup;
        the_server_stamps_the_row_and_the_writer_learns_it,
        a_stored_timestamp_ahead_of_the_server_still_advances,
        writes_within_one_server_tick_each_advance,
        a_batch_returns_each_written_rows_stamp,
        inside_a_transaction_the_stamp_is_read_back_and_conflicts_still_report,
        concurrent_increments_lose_no_update,
    );
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
