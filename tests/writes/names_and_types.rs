//! Entities as real schemas spell them: tables renamed with `#[sql_name]`, columns named by
//! string literals, version types behind aliases, MySQL `UNSIGNED` versions.

use crate::common;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_occ::{Error, Guarded, GuardedWrite, Token};

diesel::table! {
    #[sql_name = "legacy_items"]
    items (id) {
        id -> BigInt,
        label -> Text,
        version -> BigInt,
    }
}

/// The version type as the domain names it.
type Revision = i64;

#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, Guarded)]
#[diesel(table_name = items)]
struct Item {
    id: i64,
    #[diesel(column_name = "label")]
    title: String,
    #[occ(version)]
    version: Revision,
}

const CREATE_LEGACY_ITEMS: &str = "CREATE TABLE legacy_items \
    (id BIGINT PRIMARY KEY NOT NULL, label TEXT NOT NULL, version BIGINT NOT NULL)";

for_each_backend! {
    #[test]
    fn messages_name_the_table_by_its_sql_name() {
        let Some(db) = db() else { return };
        let conn = &mut db.conn();
        conn.batch_execute(CREATE_LEGACY_ITEMS).unwrap();
        let mut item = Item { id: 1, title: "lamp".into(), version: 0 };
        diesel::insert_into(items::table).values(&item).execute(conn).unwrap();
        let stale = item.clone();

        item.title = "desk lamp".into();
        assert_eq!(item.guarded_save(conn).unwrap(), 1);
        let conflict = stale.guarded_update(conn, items::label.eq("floor lamp")).unwrap_err();
        let missing = Item { id: 2, ..item.clone() }.guarded_update(conn, items::label.eq("x")).unwrap_err();

        let conflict = conflict.as_conflict().unwrap_or_else(|| panic!("{conflict:?}"));
        assert_eq!((conflict.table, &conflict.found), ("legacy_items", &Token::Version(1)));
        assert!(matches!(missing, Error::NotFound { table: "legacy_items", .. }), "{missing:?}");
        assert!(missing.to_string().contains("`legacy_items`"), "{missing}");
        let stored: Item = items::table.select(Item::as_select()).first(conn).unwrap();
        assert_eq!(stored, item);
    }
}

#[cfg(feature = "mysql")]
mod mysql_unsigned {
    use super::*;

    diesel::table! {
        unsigned_items (id) {
            id -> BigInt,
            label -> Text,
            version -> Unsigned<BigInt>,
        }
    }

    #[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, Guarded)]
    #[diesel(table_name = unsigned_items)]
    struct UnsignedItem {
        id: i64,
        label: String,
        #[occ(version)]
        version: u64,
    }

    #[test]
    fn unsigned_versions_advance_conflict_and_stop_at_their_maximum() {
        let Some(db) = common::mysql() else { return };
        let conn = &mut db.conn();
        conn.batch_execute(
            "CREATE TABLE unsigned_items (id BIGINT PRIMARY KEY NOT NULL, label TEXT NOT NULL, \
             version BIGINT UNSIGNED NOT NULL)",
        )
        .unwrap();
        let mut item = UnsignedItem {
            id: 1,
            label: "lamp".into(),
            version: u64::MAX - 1,
        };
        diesel::insert_into(unsigned_items::table)
            .values(&item)
            .execute(conn)
            .unwrap();
        let stale = item.clone();

        item.label = "desk lamp".into();
        assert_eq!(item.guarded_save(conn).unwrap(), u64::MAX);
        let err = stale
            .guarded_update(conn, unsigned_items::label.eq("x"))
            .unwrap_err();
        let conflict = err.as_conflict().unwrap_or_else(|| panic!("{err:?}"));
        assert_eq!(conflict.found, Token::Version(i128::from(u64::MAX)));

        let err = item
            .guarded_update(conn, unsigned_items::label.eq("y"))
            .unwrap_err();
        assert!(
            matches!(&err, Error::VersionOverflow { current, .. } if *current == Token::Version(i128::from(u64::MAX))),
            "{err:?}"
        );
        let stored: UnsignedItem = unsigned_items::table
            .select(UnsignedItem::as_select())
            .first(conn)
            .unwrap();
        assert_eq!(stored, item);
    }
}
