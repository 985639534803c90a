//! Entities as real schemas spell them: tables renamed with `#[sql_name]`, columns named by
//! string literals, version types behind aliases, MySQL `UNSIGNED` versions. Each body
//! runs on both drivers (the blocking API and the async one).

use crate::common;

use common::drivers::{Save, Update};
use diesel::connection::SimpleConnection;
use diesel::dsl;
use diesel::prelude::*;
use diesel_occ::{Error, Guarded, Token};

/// The changes of a label update.
type Label = dsl::Eq<items::label, &'static str>;

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
    type Db = common::TestDb<Conn>;

    fn messages_name_the_table_by_its_sql_name<W: Save<Item> + Update<Item, Label>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        let w = &mut w();
        conn.batch_execute(CREATE_LEGACY_ITEMS).unwrap();
        let mut item = Item { id: 1, title: "lamp".into(), version: 0 };
        diesel::insert_into(items::table).values(&item).execute(conn).unwrap();
        let stale = item.clone();

        item.title = "desk lamp".into();
        assert_eq!(w.save(&mut item).unwrap(), 1);
        let conflict = w.update(&stale, items::label.eq("floor lamp")).unwrap_err();
        let missing = w.update(&Item { id: 2, ..item.clone() }, items::label.eq("x")).unwrap_err();

        let conflict = conflict.as_conflict().unwrap_or_else(|| panic!("{conflict:?}"));
        assert_eq!((conflict.table, &conflict.found), ("legacy_items", &Token::Version(1)));
        assert!(matches!(missing, Error::NotFound { table: "legacy_items", .. }), "{missing:?}");
        assert!(missing.to_string().contains("`legacy_items`"), "{missing}");
        let stored: Item = items::table.select(Item::as_select()).first(conn).unwrap();
        assert_eq!(stored, item);
    }

    tests_on_both_drivers!(
        |_: &Db| ();
        messages_name_the_table_by_its_sql_name,
    );
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

    /// The changes of a label update.
    type UnsignedLabel = dsl::Eq<unsigned_items::label, &'static str>;

    fn unsigned_versions_advance_conflict_and_stop_at_their_maximum<W>(
        db: &common::TestDb<diesel::MysqlConnection>,
        w: impl Fn() -> W,
    ) where
        W: Save<UnsignedItem> + Update<UnsignedItem, UnsignedLabel>,
    {
        let conn = &mut db.conn();
        let w = &mut w();
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
        assert_eq!(w.save(&mut item).unwrap(), u64::MAX);
        let err = w.update(&stale, unsigned_items::label.eq("x")).unwrap_err();
        let conflict = err.as_conflict().unwrap_or_else(|| panic!("{err:?}"));
        assert_eq!(conflict.found, Token::Version(i128::from(u64::MAX)));

        let err = w.update(&item, unsigned_items::label.eq("y")).unwrap_err();
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

    mod blocking {
        use super::*;

        #[test]
        fn unsigned_versions_advance_conflict_and_stop_at_their_maximum() {
            let Some(db) = common::mysql() else { return };
            let pool = &db.pool;
            super::unsigned_versions_advance_conflict_and_stop_at_their_maximum(&db, || {
                common::drivers::Blocking(pool.get().unwrap())
            });
        }
    }

    #[cfg(all(feature = "async", feature = "async-mysql"))]
    mod on_async {
        use super::*;

        #[test]
        fn unsigned_versions_advance_conflict_and_stop_at_their_maximum() {
            use common::paths::AsyncOf;
            let Some(db) = common::mysql() else { return };
            let url = &db.url;
            super::unsigned_versions_advance_conflict_and_stop_at_their_maximum(&db, || {
                let runtime = common::paths::runtime();
                common::drivers::Async {
                    conn: diesel::MysqlConnection::connect(url, &runtime),
                    runtime,
                }
            });
        }
    }
}
