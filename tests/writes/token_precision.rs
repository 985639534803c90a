//! A time token handed back to the writer equals what the database stored, whatever the
//! column's declared precision. A column that keeps fewer fractional digits than the
//! guard's tokens (PostgreSQL `timestamp(0)`, MariaDB `DATETIME`) is refused before the
//! first write, naming the attribute to add, and again by every guarded write wherever
//! the table resolves (another schema or database than the one checked first); with that
//! attribute every token is stored exactly and moves on with every write. SQLite stores
//! the text written: nothing to refuse there. Each body runs on both drivers (the
//! blocking API and the async one).

#![cfg(feature = "chrono")]

use crate::common;

use chrono::NaiveDateTime;
use common::drivers::{Save, Touch, Update, UpdateByKey};
use diesel::connection::SimpleConnection;
use diesel::dsl;
use diesel::prelude::*;
use diesel_occ::{Error, Guarded, Pooled};

/// The changes of a body update.
type Body = dsl::Eq<coarse::body, &'static str>;

diesel::table! {
    /// A last-modified column declared with whole seconds.
    coarse (id) {
        id -> BigInt,
        body -> Text,
        modified -> Timestamp,
    }
}

/// Microsecond tokens (the default): more than the column keeps.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = coarse)]
struct Micro {
    id: i64,
    body: String,
    #[occ(last_modified)]
    modified: NaiveDateTime,
}

/// Tokens in whole seconds: what the column keeps.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = coarse)]
struct Second {
    id: i64,
    body: String,
    #[occ(last_modified(precision = "seconds"))]
    modified: NaiveDateTime,
}

/// The database's clock in microseconds: more than the column keeps.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = coarse)]
struct ServerMicro {
    id: i64,
    body: String,
    #[occ(last_modified(clock = database))]
    modified: NaiveDateTime,
}

/// The database's clock in whole seconds.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = coarse)]
struct ServerSecond {
    id: i64,
    body: String,
    #[occ(last_modified(clock = database, precision = "seconds"))]
    modified: NaiveDateTime,
}

/// Microsecond tokens on the writer's clock, written only by the test of two databases
/// (the check a type passed is remembered per process).
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = coarse)]
struct Wide {
    id: i64,
    body: String,
    #[occ(last_modified)]
    modified: NaiveDateTime,
}

/// Microsecond tokens on the database's clock, for the same test.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = coarse)]
struct ServerWide {
    id: i64,
    body: String,
    #[occ(last_modified(clock = database))]
    modified: NaiveDateTime,
}

for_each_backend! {
    type Db = common::TestDb<Conn>;

    /// One row, stamped 2026-01-01 10:00:00, in a column of whole seconds.
    fn setup(db: &Db) {
        let column = match BACKEND {
            "postgres" => "TIMESTAMP(0)",
            "mysql" => "DATETIME",
            _ => "TIMESTAMP",
        };
        db.conn()
            .batch_execute(&format!(
                "CREATE TABLE coarse (id BIGINT PRIMARY KEY, body TEXT NOT NULL, modified {column} NOT NULL); \
                 INSERT INTO coarse VALUES (1, 'draft', '2026-01-01 10:00:00')"
            ))
            .unwrap();
    }

    fn stored(conn: &mut Pooled<Conn>) -> (String, NaiveDateTime) {
        coarse::table.find(1).select((coarse::body, coarse::modified)).first(conn).unwrap()
    }

    fn assert_refused<T: std::fmt::Debug>(result: Result<T, Error>) {
        match result {
            Err(Error::SchemaMismatch { table: "coarse", column, reason }) => {
                assert_eq!(column, "modified");
                assert!(reason.contains("precision = \"seconds\""), "{reason}");
            }
            other => panic!("expected SchemaMismatch, got {other:?}"),
        }
    }

    /// Microsecond tokens on a column of seconds: refused before anything is written on
    /// the servers; on SQLite the token is stored as written and the next write works.
    fn finer_tokens_than_the_column_keeps_are_refused_before_writing<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Save<Micro> + UpdateByKey<Micro, Body> + Touch<ServerMicro>,
    {
        let conn = &mut db.conn();
        let w = &mut w();
        let before = stored(conn);
        let mut row: Micro = coarse::table.find(1).select(Micro::as_select()).first(conn).unwrap();
        row.body = "edited".into();
        let mut server: ServerMicro = coarse::table.find(1).select(ServerMicro::as_select()).first(conn).unwrap();
        if BACKEND == "sqlite" {
            let token = w.save(&mut row).unwrap();
            assert_eq!(stored(conn), ("edited".into(), token));
            row.body = "again".into();
            w.save(&mut row).expect("the writer's own token matches what was stored");
            return;
        }
        assert_refused(w.save(&mut row));
        assert_refused(w.update_by_key(&1, &before.1, coarse::body.eq("x")));
        assert_refused(w.touch(&mut server));
        assert_eq!(stored(conn), before, "nothing was written");
    }

    /// Whole-second tokens (the writer's clock or the database's): each write hands back
    /// exactly what was stored, the writer's next write with it succeeds, the token moves
    /// on with every write even within one second, and a copy holding an older token
    /// conflicts.
    fn tokens_the_column_keeps_are_stored_exactly_and_always_move_on<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Save<Second> + Touch<ServerSecond> + Update<Second, Body>,
    {
        let conn = &mut db.conn();
        let w = &mut w();
        let mut row: Second = coarse::table.find(1).select(Second::as_select()).first(conn).unwrap();
        let stale = row.clone();
        let mut tokens = vec![row.modified];
        for body in ["one", "two", "three"] {
            row.body = body.into();
            let token = w.save(&mut row).unwrap();
            assert_eq!(stored(conn), (body.to_string(), token), "the token handed back is the one stored");
            tokens.push(token);
        }
        let mut server: ServerSecond = coarse::table.find(1).select(ServerSecond::as_select()).first(conn).unwrap();
        for _ in 0..3 {
            let token = w.touch(&mut server).unwrap();
            assert_eq!(stored(conn).1, token);
            tokens.push(token);
        }
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "every write moved the token on: {tokens:?}");
        assert!(matches!(w.update(&stale, coarse::body.eq("stale")), Err(Error::Conflict(_))));
        assert_eq!(stored(conn).0, "three");
    }

    /// The column is checked where each write resolves the table, not remembered per
    /// entity type: after the type wrote on a database (PostgreSQL: a schema) whose column
    /// keeps microseconds, the same type on another whose column keeps whole seconds is
    /// refused with every guarded write, on both clocks, and nothing is written there;
    /// the first database still takes its writes.
    fn a_coarse_column_elsewhere_is_refused_after_a_fine_one_passed<W>(db: &Db, w: impl Fn(&Db) -> W)
    where
        W: Save<Wide> + UpdateByKey<Wide, Body> + Update<Wide, Body> + Touch<ServerWide>,
    {
        let fine = self::db().expect("a second database");
        let micros = if BACKEND == "mysql" { "DATETIME(6)" } else { "TIMESTAMP(6)" };
        fine.conn()
            .batch_execute(&format!(
                "CREATE TABLE coarse (id BIGINT PRIMARY KEY, body TEXT NOT NULL, modified {micros} NOT NULL); \
                 INSERT INTO coarse VALUES (1, 'draft', '2026-01-01 10:00:00')"
            ))
            .unwrap();
        let read = |db: &Db| -> (Wide, ServerWide) {
            let conn = &mut db.conn();
            let wide = coarse::table.find(1).select(Wide::as_select()).first(conn).unwrap();
            let server = coarse::table.find(1).select(ServerWide::as_select()).first(conn).unwrap();
            (wide, server)
        };
        // Both clocks pass their first check where the column keeps every digit.
        let (mut wide, _) = read(&fine);
        wide.body = "fine".into();
        let first = w(&fine).save(&mut wide).unwrap();
        assert_eq!(stored(&mut fine.conn()), ("fine".into(), first));
        let (_, mut server) = read(&fine);
        w(&fine).touch(&mut server).unwrap();

        let before = stored(&mut db.conn());
        let (mut wide, mut server) = read(db);
        wide.body = "rounded".into();
        if BACKEND == "sqlite" {
            w(db).save(&mut wide).expect("SQLite keeps the text written");
            w(db).save(&mut wide).expect("and the writer's next write matches it");
            return;
        }
        assert_refused(w(db).save(&mut wide));
        assert_refused(w(db).update(&wide, coarse::body.eq("x")));
        assert_refused(w(db).update_by_key(&1, &before.1, coarse::body.eq("x")));
        assert_refused(w(db).touch(&mut server));
        assert_eq!(stored(&mut db.conn()), before, "nothing was written where the column is coarse");

        let (mut wide, _) = read(&fine);
        wide.body = "still fine".into();
        let token = w(&fine).save(&mut wide).unwrap();
        assert_eq!(stored(&mut fine.conn()), ("still fine".into(), token));
    }

    tests_on_both_drivers!(
        setup;
        finer_tokens_than_the_column_keeps_are_refused_before_writing,
        tokens_the_column_keeps_are_stored_exactly_and_always_move_on;
        per_database: a_coarse_column_elsewhere_is_refused_after_a_fine_one_passed,
    );
}
