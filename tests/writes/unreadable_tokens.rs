//! A NULL or malformed token in a stored row: never a skipped check, and a clear
//! `InvalidData` naming the table, the row and the guard's column.

use crate::common;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_occ::{Error, Guarded, GuardedWrite};

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
    #[test]
    fn a_null_version_is_invalid_data_and_nothing_is_written() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        conn.batch_execute(
            "CREATE TABLE loose_orders (id BIGINT PRIMARY KEY NOT NULL, note TEXT NOT NULL, version BIGINT);
             INSERT INTO loose_orders (id, note, version) VALUES (1, 'legacy', NULL);",
        )
        .unwrap();

        for expected in [0, 1] {
            let err = LooseOrder::guarded_update_by_key(conn, &1, &expected, loose_orders::note.eq("x")).unwrap_err();

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
}

/// SQLite keeps whatever text it is given in a timestamp column.
#[cfg(all(feature = "sqlite", feature = "chrono"))]
#[test]
fn a_malformed_timestamp_is_invalid_data() {
    use common::models::Document;
    use common::schema::documents;
    let db = common::sqlite().unwrap();
    let conn = &mut db.conn();
    conn.batch_execute(
        "INSERT INTO documents (id, body, hits, last_modified) VALUES (1, 'draft', 0, 'yesterday')",
    )
    .unwrap();
    let seen = chrono::DateTime::from_timestamp(1_700_000_000, 0)
        .unwrap()
        .naive_utc();

    let err =
        Document::guarded_update_by_key(conn, &1, &seen, documents::body.eq("x")).unwrap_err();

    assert!(
        matches!(&err, Error::InvalidData { table: "documents", column, .. } if column == "last_modified"),
        "{err:?}"
    );
}
