//! The last-modified guard on PostgreSQL's clock: the server stamps the row, always
//! moving on, and the same statement returns the new timestamp.

#![cfg(all(feature = "postgres", feature = "chrono"))]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;

use chrono::{DateTime, NaiveDateTime, TimeDelta, Utc};
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_occ::{Guarded, GuardedWrite, Pooled};

diesel::table! {
    notes (id) {
        id -> BigInt,
        body -> Text,
        hits -> BigInt,
        changed_at -> Timestamp,
    }
}

diesel::table! {
    events (id) {
        id -> BigInt,
        title -> Text,
        changed_at -> Timestamptz,
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

#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, Guarded)]
#[diesel(table_name = events)]
struct Event {
    id: i64,
    title: String,
    #[occ(last_modified(clock = database, precision = "seconds"))]
    changed_at: DateTime<Utc>,
}

fn setup(changed_at: NaiveDateTime) -> Option<common::TestDb<PgConnection>> {
    let db = common::postgres()?;
    let conn = &mut db.conn();
    conn.batch_execute(
        "CREATE TABLE notes (id BIGINT PRIMARY KEY, body TEXT NOT NULL, hits BIGINT NOT NULL, \
         changed_at TIMESTAMP NOT NULL);
         CREATE TABLE events (id BIGINT PRIMARY KEY, title TEXT NOT NULL, \
         changed_at TIMESTAMPTZ NOT NULL);",
    )
    .unwrap();
    let note = Note {
        id: 1,
        body: "draft".into(),
        hits: 0,
        changed_at,
    };
    diesel::insert_into(notes::table)
        .values(&note)
        .execute(conn)
        .unwrap();
    Some(db)
}

fn load(conn: &mut Pooled<PgConnection>) -> Note {
    notes::table
        .find(1)
        .select(Note::as_select())
        .first(conn)
        .unwrap()
}

/// The server's clock, seen from the server.
fn server_now(conn: &mut Pooled<PgConnection>) -> NaiveDateTime {
    diesel::select(diesel::dsl::sql::<diesel::sql_types::Timestamp>(
        "clock_timestamp() AT TIME ZONE 'UTC'",
    ))
    .get_result(conn)
    .unwrap()
}

#[test]
fn the_server_stamps_the_row_and_the_statement_returns_it() {
    let Some(db) = setup(DateTime::UNIX_EPOCH.naive_utc()) else {
        return;
    };
    let conn = &mut db.conn();
    let mut note = load(conn);
    let before = server_now(conn);

    note.body = "saved".into();
    let stamped = note.guarded_save(conn).unwrap();

    let after = server_now(conn);
    assert!(
        before <= stamped && stamped <= after,
        "{before} <= {stamped} <= {after}"
    );
    assert_eq!(load(conn), note, "the returned timestamp is the row's");
}

/// A row stamped in the future (another machine's clock, a manual fix) still advances,
/// by one tick, and each write moves on again.
#[test]
fn a_stored_timestamp_ahead_of_the_server_still_advances() {
    let ahead = DateTime::parse_from_rfc3339("2999-01-01T00:00:00Z")
        .unwrap()
        .naive_utc();
    let Some(db) = setup(ahead) else { return };
    let conn = &mut db.conn();
    let mut note = load(conn);
    let stale = note.clone();

    for i in 1..=3 {
        note.hits = i;
        assert_eq!(
            note.guarded_save(conn).unwrap(),
            ahead + TimeDelta::microseconds(i)
        );
    }

    let err = stale
        .guarded_update(conn, notes::body.eq("stale"))
        .unwrap_err();
    assert!(err.as_conflict().is_some(), "{err:?}");
}

#[test]
fn utc_date_times_are_stamped_at_the_declared_precision() {
    let Some(db) = setup(DateTime::UNIX_EPOCH.naive_utc()) else {
        return;
    };
    let conn = &mut db.conn();
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

#[test]
fn concurrent_increments_lose_no_update() {
    const THREADS: usize = 8;
    const PER_THREAD: usize = 20;
    let Some(db) = setup(DateTime::UNIX_EPOCH.naive_utc()) else {
        return;
    };
    let (start, retries) = (Barrier::new(THREADS), AtomicUsize::new(0));

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
                        Err(e) if e.is_retryable() => {
                            retries.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
            });
        }
    });

    assert_eq!(load(&mut db.conn()).hits, (THREADS * PER_THREAD) as i64);
}
