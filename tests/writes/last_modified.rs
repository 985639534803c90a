//! The last-modified guard: a timestamp column as the token, exact on every backend, and
//! always advancing, even when many writes fall into one clock tick. Each body runs on
//! both drivers (the blocking API and the async one).

#![cfg(feature = "chrono")]

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};

use chrono::{DateTime, NaiveDateTime, TimeDelta, Utc};
use common::drivers::{race, Read, Save, Update, UpdateByKey};
use common::models::{Document, FrozenDocument};
use common::schema::documents;
use common::FrozenClock;
use diesel::dsl;
use diesel::prelude::*;
use diesel_occ::{Error, Token};

/// The changes of a body update.
type Body = dsl::Eq<documents::body, &'static str>;
/// The changes of a hits update.
type Hits = dsl::Eq<documents::hits, i64>;

/// An instant with microseconds, as the columns keep them.
fn instant(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text).unwrap().to_utc()
}

/// The document row, read as `$ty`.
macro_rules! load {
    ($conn:expr, $ty:ty) => {
        documents::table
            .find(1)
            .select(<$ty>::as_select())
            .first::<$ty>($conn)
            .unwrap()
    };
}

fn token(at: NaiveDateTime) -> Token {
    Token::Timestamp(at.and_utc().format("%Y-%m-%d %H:%M:%S%.6f UTC").to_string())
}

for_each_backend! {
    type Db = common::TestDb<Conn>;
    type Pooled = diesel_occ::Pooled<Conn>;

    fn insert(conn: &mut Pooled, at: NaiveDateTime) {
        let row = Document { id: 1, body: "draft".into(), hits: 0, last_modified: at };
        diesel::insert_into(documents::table).values(&row).execute(conn).unwrap();
    }

    /// The token the write returns is exactly what the column now holds (compared by the
    /// database, in the next write), and it is later than the one it replaced.
    fn save_advances_the_timestamp_and_returns_what_the_column_holds<W: Save<Document>>(db: &Db, w: impl Fn() -> W) {
        let (conn, w) = (&mut db.conn(), &mut w());
        let start = instant("2026-01-01T08:00:00.123456Z").naive_utc();
        insert(conn, start);
        let mut doc = load!(conn, Document);
        assert_eq!(doc.last_modified, start, "microseconds survive the round trip");

        doc.body = "first".into();
        let first = w.save(&mut doc).unwrap();
        doc.body = "second".into();
        let second = w.save(&mut doc).unwrap();

        assert!(start < first && first < second, "{start} < {first} < {second}");
        let stored = load!(conn, Document);
        assert_eq!(stored, doc);
        assert_eq!(stored.last_modified, second);
    }

    fn stale_copy_conflicts_and_sees_the_current_row<W: Save<Document> + Update<Document, Body>>(db: &Db, w: impl Fn() -> W) {
        let (conn, w) = (&mut db.conn(), &mut w());
        insert(conn, instant("2026-01-01T08:00:00Z").naive_utc());
        let mut winner = load!(conn, Document);
        let stale = winner.clone();
        winner.body = "winner".into();
        let won_at = w.save(&mut winner).unwrap();

        let err = w.update(&stale, documents::body.eq("loser")).unwrap_err();

        let conflict = err.as_conflict().unwrap_or_else(|| panic!("{err:?}"));
        assert_eq!(conflict.expected, token(stale.last_modified));
        assert_eq!(conflict.found, token(won_at));
        assert_eq!(conflict.current::<Document>(), Some(&winner));
        assert_eq!(load!(conn, Document).body, "winner");
    }

    /// With the clock frozen, every write still moves the token on by one microsecond, so
    /// a copy taken before any of them can never match again.
    fn many_writes_within_one_tick_each_advance_the_token<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Save<FrozenDocument> + Update<FrozenDocument, Hits>,
    {
        let (conn, w) = (&mut db.conn(), &mut w());
        let frozen = instant("2026-01-01T08:00:00Z");
        FrozenClock::freeze(frozen);
        insert(conn, frozen.naive_utc());
        let mut doc = load!(conn, FrozenDocument);
        let mut stale_copies = Vec::new();

        for i in 1..=100 {
            stale_copies.push(doc.clone());
            doc.hits += 1;
            let next = w.save(&mut doc).unwrap();
            assert_eq!(next, frozen.naive_utc() + TimeDelta::microseconds(i));
        }

        assert_eq!(load!(conn, FrozenDocument), doc);
        for stale in &stale_copies {
            let err = w.update(stale, documents::hits.eq(-1)).unwrap_err();
            assert!(err.as_conflict().is_some(), "{err:?}");
        }
        assert_eq!(load!(conn, FrozenDocument).hits, 100);
    }

    /// A clock that went back (an NTP step, another machine's clock) still advances.
    fn a_clock_behind_the_stored_timestamp_still_advances_it<W: Update<FrozenDocument, Body>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        let stored = instant("2026-06-01T12:00:00Z");
        FrozenClock::freeze(stored - TimeDelta::hours(1));
        insert(conn, stored.naive_utc());
        let doc = load!(conn, FrozenDocument);

        let next = w().update(&doc, documents::body.eq("edited")).unwrap();

        assert_eq!(next, stored.naive_utc() + TimeDelta::microseconds(1));
        assert_eq!(load!(conn, FrozenDocument).last_modified, next);
    }

    /// Eight threads increment one row through the timestamp guard, all on one frozen
    /// instant, each reading and writing on an executor of its own: no update is lost and
    /// every success moved the token by one tick.
    fn concurrent_increments_within_one_tick_lose_no_update<W>(db: &Db, w: impl Fn() -> W + Sync)
    where
        W: Read<FrozenDocument> + Update<FrozenDocument, Hits>,
    {
        const THREADS: usize = 8;
        const INCREMENTS: usize = 20;
        let frozen = instant("2026-01-01T08:00:00Z");
        insert(&mut db.conn(), frozen.naive_utc());
        let conflicts = AtomicUsize::new(0);

        race(THREADS, w, |_, w| {
            FrozenClock::freeze(frozen);
            let mut done = 0;
            while done < INCREMENTS {
                let doc = w.read(&1).unwrap();
                match w.update(&doc, documents::hits.eq(doc.hits + 1)) {
                    Ok(_) => done += 1,
                    Err(e) if e.is_retryable() => {
                        conflicts.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        });

        let end = load!(&mut db.conn(), FrozenDocument);
        let total = (THREADS * INCREMENTS) as i64;
        assert_eq!(end.hits, total, "a lost update");
        assert_eq!(end.last_modified, frozen.naive_utc() + TimeDelta::microseconds(total));
        eprintln!("{total} increments, {} retried", conflicts.load(Ordering::Relaxed));
    }

    fn stateless_update_by_key_takes_the_timestamp_the_client_saw<W: UpdateByKey<Document, Body>>(db: &Db, w: impl Fn() -> W) {
        let (conn, w) = (&mut db.conn(), &mut w());
        let seen = instant("2026-01-01T08:00:00.5Z").naive_utc();
        insert(conn, seen);

        let next = w.update_by_key(&1, &seen, documents::body.eq("from the form")).unwrap();
        let err = w.update_by_key(&1, &seen, documents::body.eq("second tab")).unwrap_err();

        assert!(next > seen);
        assert!(err.as_conflict().is_some(), "{err:?}");
        let stored = load!(conn, Document);
        assert_eq!((stored.body.as_str(), stored.last_modified), ("from the form", next));
    }

    fn missing_row_is_not_found<W: UpdateByKey<Document, Body>>(_: &Db, w: impl Fn() -> W) {
        let err = w().update_by_key(&9, &Utc::now().naive_utc(), documents::body.eq("x")).unwrap_err();

        assert!(matches!(&err, Error::NotFound { table: "documents", key } if key == "9"), "{err:?}");
    }

    tests_on_both_drivers!(
        |_: &Db| ();
        save_advances_the_timestamp_and_returns_what_the_column_holds,
        stale_copy_conflicts_and_sees_the_current_row,
        many_writes_within_one_tick_each_advance_the_token,
        a_clock_behind_the_stored_timestamp_still_advances_it,
        concurrent_increments_within_one_tick_lose_no_update,
        stateless_update_by_key_takes_the_timestamp_the_client_saw,
        missing_row_is_not_found,
    );
}

/// MySQL `DATETIME` without fractional digits keeps whole seconds (and would round a
/// fraction). Declared with `precision = "seconds"`, writes within one second advance by a
/// whole second and the token matches what the column holds.
#[cfg(feature = "mysql")]
mod mysql_whole_seconds {
    use super::*;
    use diesel::connection::SimpleConnection;

    diesel::table! {
        notes (id) {
            id -> BigInt,
            body -> Text,
            changed_at -> Datetime,
        }
    }

    #[derive(
        Debug,
        Clone,
        PartialEq,
        Queryable,
        Selectable,
        Identifiable,
        Insertable,
        diesel_occ::Guarded,
    )]
    #[diesel(table_name = notes)]
    struct Note {
        id: i64,
        body: String,
        #[occ(last_modified(precision = "seconds", clock = common::FrozenClock))]
        changed_at: NaiveDateTime,
    }

    type Conn = diesel::MysqlConnection;
    type Db = common::TestDb<Conn>;
    fn db() -> Option<Db> {
        common::mysql()
    }

    fn create_table(db: &Db) {
        db.conn()
            .batch_execute(
                "CREATE TABLE notes (id BIGINT PRIMARY KEY NOT NULL, body TEXT NOT NULL, \
                 changed_at DATETIME NOT NULL)",
            )
            .unwrap();
    }

    fn whole_second_column_advances_by_whole_seconds<W: Save<Note>>(db: &Db, w: impl Fn() -> W) {
        let (conn, w) = (&mut db.conn(), &mut w());
        let start = instant("2026-01-01T08:00:00Z").naive_utc();
        let mut note = Note {
            id: 1,
            body: "draft".into(),
            changed_at: start,
        };
        diesel::insert_into(notes::table)
            .values(&note)
            .execute(conn)
            .unwrap();
        // The clock reads a fraction the column cannot keep.
        FrozenClock::freeze(instant("2026-01-01T08:00:00.700Z"));

        let mut tokens = Vec::new();
        for i in 0..3 {
            note.body = format!("edit {i}");
            tokens.push(w.save(&mut note).unwrap());
            let stored: Note = notes::table.select(Note::as_select()).first(conn).unwrap();
            assert_eq!(stored, note, "the token is what the column holds");
        }

        let seconds: Vec<i64> = tokens.iter().map(|t| (*t - start).num_seconds()).collect();
        assert_eq!(seconds, [1, 2, 3]);
    }

    crate::tests_on_both_drivers!(
        create_table;
        whole_second_column_advances_by_whole_seconds,
    );
}

/// `DateTime<Utc>` tokens on PostgreSQL `TIMESTAMPTZ`.
#[cfg(feature = "postgres")]
mod postgres_timestamptz {
    use super::*;
    use diesel::connection::SimpleConnection;

    diesel::table! {
        events (id) {
            id -> BigInt,
            title -> Text,
            updated_at -> Timestamptz,
        }
    }

    #[derive(
        Debug,
        Clone,
        PartialEq,
        Queryable,
        Selectable,
        Identifiable,
        Insertable,
        diesel_occ::Guarded,
    )]
    #[diesel(table_name = events)]
    struct Event {
        id: i64,
        title: String,
        #[occ(last_modified)]
        updated_at: DateTime<Utc>,
    }

    type Conn = diesel::PgConnection;
    type Db = common::TestDb<Conn>;
    fn db() -> Option<Db> {
        common::postgres()
    }

    fn create_table(db: &Db) {
        db.conn()
            .batch_execute(
                "CREATE TABLE events (id BIGINT PRIMARY KEY NOT NULL, title TEXT NOT NULL, \
                 updated_at TIMESTAMPTZ NOT NULL)",
            )
            .unwrap();
    }

    fn utc_date_times_are_exact_tokens<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Save<Event> + Update<Event, dsl::Eq<events::title, &'static str>>,
    {
        let (conn, w) = (&mut db.conn(), &mut w());
        let mut event = Event {
            id: 1,
            title: "launch".into(),
            updated_at: instant("2026-01-01T08:00:00.654321Z"),
        };
        diesel::insert_into(events::table)
            .values(&event)
            .execute(conn)
            .unwrap();
        let stale = event.clone();

        event.title = "launch day".into();
        w.save(&mut event).unwrap();
        let err = w.update(&stale, events::title.eq("x")).unwrap_err();

        assert!(err.as_conflict().is_some(), "{err:?}");
        let stored: Event = events::table
            .select(Event::as_select())
            .first(conn)
            .unwrap();
        assert_eq!(stored, event);
    }

    crate::tests_on_both_drivers!(
        create_table;
        utc_date_times_are_exact_tokens,
    );
}
