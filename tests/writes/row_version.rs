//! A token the database maintains (`#[occ(row_version)]`): here 16 random bytes a trigger
//! sets on every write, as a table other code owns would have. The library compares it,
//! never assigns it, and learns the value the trigger left, on every backend (SQLite's
//! `RETURNING` reports values from before its triggers ran, so it reads the row back).
//! Each body runs on both drivers (the blocking API and the async one).

use crate::common;

use common::drivers::{race, BatchUpdate, BulkUpdate, Delete, Save, Update, UpdateByKey};
use diesel::connection::SimpleConnection;
use diesel::dsl;
use diesel::prelude::*;
use diesel_occ::{BatchMode, Error, Guarded, Pooled, RowOutcome, Token};

/// The changes of a body update.
type Body = dsl::Eq<docs::body, &'static str>;

diesel::table! {
    docs (id) {
        id -> BigInt,
        body -> Text,
        rv -> Binary,
    }
}

#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = docs)]
struct Doc {
    id: i64,
    body: String,
    #[occ(row_version)]
    rv: Vec<u8>,
}

for_each_backend! {
    type Db = common::TestDb<Conn>;

    /// `docs` with rows 1..=3, and a trigger that gives a row new random bytes on every
    /// update, the way a `rowversion` or a checksum maintained by other code moves.
    fn setup(db: &Db) {
        let schema = match BACKEND {
            "postgres" => {
                "CREATE TABLE docs (id BIGINT PRIMARY KEY, body TEXT NOT NULL,
                     rv BYTEA NOT NULL DEFAULT decode(md5(random()::text), 'hex'));
                 CREATE FUNCTION docs_rv() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN NEW.rv := decode(md5(random()::text || clock_timestamp()::text), 'hex'); RETURN NEW; END $$;
                 CREATE TRIGGER docs_rv BEFORE UPDATE ON docs FOR EACH ROW EXECUTE FUNCTION docs_rv();"
            }
            "mysql" => {
                "CREATE TABLE docs (id BIGINT PRIMARY KEY, body TEXT NOT NULL,
                     rv BINARY(16) NOT NULL DEFAULT (UNHEX(MD5(RAND()))));
                 CREATE TRIGGER docs_rv BEFORE UPDATE ON docs FOR EACH ROW
                     SET NEW.rv = UNHEX(MD5(CONCAT(RAND(), NOW(6), CONNECTION_ID())));"
            }
            _ => {
                "CREATE TABLE docs (id BIGINT PRIMARY KEY, body TEXT NOT NULL,
                     rv BLOB NOT NULL DEFAULT (randomblob(16)));
                 CREATE TRIGGER docs_rv AFTER UPDATE ON docs FOR EACH ROW
                 BEGIN UPDATE docs SET rv = randomblob(16) WHERE id = NEW.id; END;"
            }
        };
        let conn = &mut db.conn();
        conn.batch_execute(schema).unwrap();
        conn.batch_execute("INSERT INTO docs (id, body) VALUES (1, 'one'), (2, 'two'), (3, 'three')").unwrap();
    }

    fn load(conn: &mut Pooled<Conn>, id: i64) -> Doc {
        docs::table.find(id).select(Doc::as_select()).first(conn).unwrap()
    }

    /// A save learns the bytes the trigger set, so the same copy saves again without
    /// conflicting with itself.
    fn a_save_learns_the_token_the_database_set<W: Save<Doc>>(db: &Db, w: impl Fn() -> W) {
        let (conn, w) = (&mut db.conn(), &mut w());
        let mut doc = load(conn, 1);
        let read = doc.rv.clone();
        doc.body = "edited".into();
        let learned = w.save(&mut doc).unwrap();
        assert_ne!(learned, read, "the trigger moved the token");
        assert_eq!(doc.rv, learned);
        assert_eq!(load(conn, 1), doc, "the copy holds what the row holds");

        doc.body = "edited again".into();
        w.save(&mut doc).unwrap();
        assert_eq!(load(conn, 1), doc);
    }

    /// A copy read before another write conflicts, with the current row and its bytes in
    /// hexadecimal; nothing is written.
    fn a_stale_copy_conflicts_with_the_current_row<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Save<Doc> + Update<Doc, Body> + Delete<Doc>,
    {
        let (conn, w) = (&mut db.conn(), &mut w());
        let stale = load(conn, 1);
        let mut winner = stale.clone();
        winner.body = "winner".into();
        w.save(&mut winner).unwrap();

        match w.update(&stale, docs::body.eq("lost")) {
            Err(Error::Conflict(conflict)) => {
                assert_eq!(conflict.current::<Doc>(), Some(&winner));
                let hex: String = winner.rv.iter().map(|b| format!("{b:02x}")).collect();
                assert_eq!(conflict.found, Token::RowValue(format!("0x{hex}")));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(w.delete(&stale), Err(Error::Conflict(_))));
        assert_eq!(load(conn, 1), winner);
    }

    /// The stateless form: a client sends back the bytes it saw.
    fn a_write_by_key_compares_the_bytes_the_client_sent<W: UpdateByKey<Doc, Body>>(db: &Db, w: impl Fn() -> W) {
        let (conn, w) = (&mut db.conn(), &mut w());
        let seen = load(conn, 2).rv;
        let next = w.update_by_key(&2, &seen, docs::body.eq("by key")).unwrap();
        assert_eq!(load(conn, 2).rv, next);
        assert!(matches!(
            w.update_by_key(&2, &seen, docs::body.eq("replayed")),
            Err(Error::Conflict(_))
        ));
        assert!(matches!(
            w.update_by_key(&2, &Vec::new(), docs::body.eq("empty token")),
            Err(Error::Conflict(_))
        ));
        assert_eq!(load(conn, 2).body, "by key");
    }

    /// Batches learn each row's bytes (one statement on PostgreSQL); a bulk update moves
    /// every row's token through the trigger, so copies read before it conflict.
    fn batches_and_bulk_updates_keep_the_tokens_exact<W>(db: &Db, w: impl Fn() -> W)
    where
        W: BatchUpdate<Doc, Body> + BulkUpdate<Doc, dsl::GtEq<docs::id, i64>, Body> + Update<Doc, Body>,
    {
        let (conn, w) = (&mut db.conn(), &mut w());
        let (one, two) = (load(conn, 1), load(conn, 2));
        let report = w.update_batch(
            vec![(1, one.rv.clone(), docs::body.eq("b1")), (2, vec![0; 16], docs::body.eq("b2"))],
            BatchMode::Partial,
        )
        .unwrap();
        match &report.rows[0] {
            RowOutcome::Written(token) => assert_eq!(token, &load(conn, 1).rv),
            other => panic!("{other:?}"),
        }
        assert!(matches!(&report.rows[1], RowOutcome::Conflict(_)));
        assert_eq!(load(conn, 2), two);

        let before = load(conn, 3);
        let bulk = w.bulk_update(docs::id.ge(2), docs::body.eq("bulk")).unwrap();
        assert_eq!(bulk.updated, 2);
        assert!(matches!(w.update(&before, docs::body.eq("stale")), Err(Error::Conflict(_))));
        assert_eq!(load(conn, 3).body, "bulk");
    }

    /// 8 threads save from one loaded copy: exactly one wins, and the row holds its body
    /// and the token it learned.
    fn racing_saves_have_one_winner<W: Save<Doc>>(db: &Db, w: impl Fn() -> W + Sync) {
        let loaded = load(&mut db.conn(), 1);
        let results: Vec<Result<Doc, Error>> = race(8, w, |t, w| {
            let mut copy = loaded.clone();
            copy.body = format!("thread {t}");
            w.save(&mut copy).map(|_| copy)
        });
        let winners: Vec<&Doc> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(winners.len(), 1, "{results:?}");
        for result in &results {
            match result {
                Ok(_) | Err(Error::Conflict(_)) => {}
                Err(Error::Retryable { .. }) if BACKEND == "sqlite" => {}
                Err(other) => panic!("{other}"),
            }
        }
        assert_eq!(&load(&mut db.conn(), 1), winners[0]);
    }

    tests_on_both_drivers!(
        setup;
        a_save_learns_the_token_the_database_set,
        a_stale_copy_conflicts_with_the_current_row,
        a_write_by_key_compares_the_bytes_the_client_sent,
        batches_and_bulk_updates_keep_the_tokens_exact,
        racing_saves_have_one_winner,
    );
}

/// MySQL's own maintained token: a `DATETIME(6) ... ON UPDATE CURRENT_TIMESTAMP(6)` column,
/// compared and read back, never assigned.
#[cfg(all(feature = "mysql", feature = "chrono"))]
mod mysql_on_update_current_timestamp {
    use super::*;

    type Conn = diesel::MysqlConnection;
    type Db = common::TestDb<Conn>;
    fn db() -> Option<Db> {
        common::mysql()
    }

    diesel::table! {
        notes (id) {
            id -> BigInt,
            body -> Text,
            changed -> Timestamp,
        }
    }
    #[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Guarded)]
    #[diesel(table_name = notes)]
    struct Note {
        id: i64,
        body: String,
        #[occ(row_version)]
        changed: chrono::NaiveDateTime,
    }

    fn create_table(db: &Db) {
        db.conn()
            .batch_execute(
                "CREATE TABLE notes (id BIGINT PRIMARY KEY, body TEXT NOT NULL,
                     changed DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6));
                 INSERT INTO notes (id, body) VALUES (1, 'new');",
            )
            .unwrap();
    }

    fn load(conn: &mut Pooled<Conn>) -> Note {
        notes::table
            .find(1)
            .select(Note::as_select())
            .first(conn)
            .unwrap()
    }

    fn is_a_row_version<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Save<Note> + Update<Note, dsl::Eq<notes::body, &'static str>>,
    {
        let (conn, w) = (&mut db.conn(), &mut w());
        let mut note = load(conn);
        let stale = note.clone();
        note.body = "edited".into();
        w.save(&mut note).unwrap();
        assert_eq!(load(conn), note, "the copy learned the stamp MySQL set");
        assert!(note.changed > stale.changed);
        assert!(matches!(
            w.update(&stale, notes::body.eq("lost")),
            Err(Error::Conflict(_))
        ));
        assert_eq!(load(conn).body, "edited");
    }

    crate::tests_on_both_drivers!(
        create_table;
        is_a_row_version,
    );
}
