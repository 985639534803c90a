//! A NULL or malformed token in a stored row: never a skipped check, and a clear
//! `InvalidData` naming the table, the row and the guard's column. Each body runs on both
//! drivers (the blocking API and the async one).

use crate::common;

use common::drivers::UpdateByKey;
use diesel::connection::SimpleConnection;
use diesel::dsl;
use diesel::prelude::*;
use diesel_occ::{Error, Guarded};

/// The changes of a note update of a loose order.
type LooseNote = dsl::Eq<loose_orders::note, &'static str>;

diesel::table! {
    /// The schema says NOT NULL; the legacy table does not enforce it.
    loose_orders (id) {
        id -> BigInt,
        note -> Text,
        version -> BigInt,
    }
}

#[derive(Debug, Clone, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = loose_orders)]
struct LooseOrder {
    id: i64,
    note: String,
    #[occ(version)]
    version: i64,
}

#[derive(QueryableByName)]
struct Note {
    #[diesel(sql_type = diesel::sql_types::Text)]
    note: String,
}

for_each_backend! {
    type Db = common::TestDb<Conn>;

    fn a_null_version_is_invalid_data_and_nothing_is_written<W: UpdateByKey<LooseOrder, LooseNote>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        conn.batch_execute(
            "CREATE TABLE loose_orders (id BIGINT PRIMARY KEY NOT NULL, note TEXT NOT NULL, version BIGINT);
             INSERT INTO loose_orders (id, note, version) VALUES (1, 'legacy', NULL);",
        )
        .unwrap();
        let w = &mut w();

        for expected in [0, 1] {
            let err = w.update_by_key(&1, &expected, loose_orders::note.eq("x")).unwrap_err();

            match &err {
                Error::InvalidData { table, column, reason } => {
                    assert_eq!((*table, column.as_str()), ("loose_orders", "version"));
                    assert!(reason.starts_with("row 1 "), "{reason}");
                }
                other => panic!("expected InvalidData, got {other:?}"),
            }
            assert!(!err.is_retryable());
        }
        let stored: Note = diesel::sql_query("SELECT note FROM loose_orders WHERE id = 1").get_result(conn).unwrap();
        assert_eq!(stored.note, "legacy");
    }

    tests_on_both_drivers!(
        |_: &Db| ();
        a_null_version_is_invalid_data_and_nothing_is_written,
    );
}

/// SQLite keeps whatever text it is given in a timestamp column.
#[cfg(all(feature = "sqlite", feature = "chrono"))]
mod malformed_timestamp {
    use super::*;
    use common::models::Document;
    use common::schema::documents;

    /// The changes of a body update of a document.
    type Body = dsl::Eq<documents::body, &'static str>;

    type Db = common::TestDb<diesel::SqliteConnection>;

    fn a_malformed_timestamp_is_invalid_data<W: UpdateByKey<Document, Body>>(
        db: &Db,
        w: impl Fn() -> W,
    ) {
        let conn = &mut db.conn();
        conn.batch_execute(
            "INSERT INTO documents (id, body, hits, last_modified) VALUES (1, 'draft', 0, 'yesterday')",
        )
        .unwrap();
        let seen = chrono::DateTime::from_timestamp(1_700_000_000, 0)
            .unwrap()
            .naive_utc();

        let err = w()
            .update_by_key(&1, &seen, documents::body.eq("x"))
            .unwrap_err();

        assert!(
            matches!(&err, Error::InvalidData { table: "documents", column, .. } if column == "last_modified"),
            "{err:?}"
        );
    }

    #[test]
    fn blocking() {
        let db = common::sqlite().unwrap();
        let pool = &db.pool;
        a_malformed_timestamp_is_invalid_data(&db, || {
            common::drivers::Blocking(pool.get().unwrap())
        });
    }

    #[cfg(all(
        feature = "async",
        any(not(feature = "mysql"), feature = "async-mysql")
    ))]
    #[test]
    fn on_async() {
        use common::paths::AsyncOf;
        let db = common::sqlite().unwrap();
        let url = &db.url;
        a_malformed_timestamp_is_invalid_data(&db, || {
            let runtime = common::paths::runtime();
            common::drivers::Async {
                conn: diesel::SqliteConnection::connect(url, &runtime),
                runtime,
            }
        });
    }
}
