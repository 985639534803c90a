//! `#[occ(updated_at)]`: a timestamp every guarded write sets, beside the guard, and that
//! the saved copy records.

#![cfg(feature = "chrono")]

use crate::common;

use chrono::{DateTime, NaiveDateTime, TimeDelta, Utc};
use common::drivers::{BulkUpdate, Save, Update};
use common::FrozenClock;
use diesel::connection::SimpleConnection;
use diesel::dsl;
use diesel::prelude::*;
use diesel_occ::{Error, Guarded, GuardedWrite};

diesel::table! {
    stamped_orders (id) {
        id -> BigInt,
        note -> Text,
        version -> BigInt,
        updated_at -> Timestamp,
    }
}

#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, Guarded)]
#[diesel(table_name = stamped_orders)]
struct StampedOrder {
    id: i64,
    note: String,
    #[occ(version)]
    version: i64,
    #[occ(updated_at(clock = common::FrozenClock))]
    updated_at: NaiveDateTime,
}

fn at(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text).unwrap().to_utc()
}

/// A clock that always reads one instant, on every thread (SQLite's async connection
/// stamps on a thread of its own, where a thread's frozen clock is not set).
struct StoppedClock;

const STOPPED_AT: &str = "2026-07-01T09:30:00.25Z";

impl diesel_occ::Clock for StoppedClock {
    fn now() -> DateTime<Utc> {
        at(STOPPED_AT)
    }
}

/// The changes the bodies send.
type NoteIs = dsl::Eq<stamped_orders::note, &'static str>;
type IdIs = dsl::Eq<stamped_orders::id, i64>;
type StampIs = dsl::Eq<stamped_orders::updated_at, NaiveDateTime>;

for_each_backend! {
    type Db = common::TestDb<Conn>;

    fn setup(db: &common::TestDb<Conn>) -> StampedOrder {
        let timestamp = if BACKEND == "mysql" { "DATETIME(6)" } else { "TIMESTAMP" };
        let conn = &mut db.conn();
        conn.batch_execute(&format!(
            "CREATE TABLE stamped_orders (id BIGINT PRIMARY KEY NOT NULL, note TEXT NOT NULL, \
             version BIGINT NOT NULL, updated_at {timestamp} NOT NULL)"
        ))
        .unwrap();
        let order = StampedOrder { id: 1, note: "new".into(), version: 0, updated_at: at("2026-01-01T00:00:00Z").naive_utc() };
        diesel::insert_into(stamped_orders::table).values(&order).execute(conn).unwrap();
        order
    }

    diesel::table! {
        use diesel::sql_types::*;
        use super::JsonSql;

        stamped_profiles (id) {
            id -> BigInt,
            ext -> JsonSql,
            version -> BigInt,
            updated_at -> Timestamp,
        }
    }

    #[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Insertable, diesel_occ::Guarded)]
    #[diesel(table_name = stamped_profiles)]
    pub struct StampedProfile {
        id: i64,
        #[occ(json)]
        ext: serde_json::Value,
        #[occ(version)]
        version: i64,
        #[occ(updated_at(clock = super::StoppedClock))]
        updated_at: NaiveDateTime,
    }

    /// A JSON edit hands back the row as the database now holds it: the new version and
    /// the stamp it wrote, whichever executor `merge` and `set` send it on.
    fn a_json_edit_returns_the_row_as_stored(
        db: &common::TestDb<Conn>,
        merge: impl Fn(&serde_json::Value) -> Result<diesel_occ::Modified<StampedProfile, ()>, Error>,
        set: impl Fn(&str, serde_json::Value) -> Result<diesel_occ::Modified<StampedProfile, ()>, Error>,
    ) {
        let (timestamp, json) = match BACKEND {
            "mysql" => ("DATETIME(6)", "JSON"),
            "postgres" => ("TIMESTAMP", "JSONB"),
            _ => ("TIMESTAMP", "TEXT"),
        };
        let conn = &mut db.conn();
        conn.batch_execute(&format!(
            "CREATE TABLE stamped_profiles (id BIGINT PRIMARY KEY NOT NULL, ext {json} NOT NULL, \
             version BIGINT NOT NULL, updated_at {timestamp} NOT NULL)"
        ))
        .unwrap();
        let row = StampedProfile { id: 1, ext: serde_json::json!({"a": 1}), version: 0, updated_at: at("2026-01-01T00:00:00Z").naive_utc() };
        diesel::insert_into(stamped_profiles::table).values(&row).execute(conn).unwrap();
        let stored = |conn: &mut diesel_occ::Pooled<Conn>| {
            stamped_profiles::table.find(1).select(StampedProfile::as_select()).first(conn).unwrap()
        };

        let merged = merge(&serde_json::json!({"b": 2})).unwrap();
        assert_eq!(merged.row, stored(conn), "the merged row is the stored one");
        assert_eq!(merged.row.updated_at, at(STOPPED_AT).naive_utc());
        assert_eq!((merged.token, merged.row.version), (1, 1));

        let set = set("/c", serde_json::json!(3)).unwrap();
        assert_eq!(set.row, stored(conn), "the edited row is the stored one");
        assert_eq!(set.row.ext, serde_json::json!({"a": 1, "b": 2, "c": 3}));
    }

    #[test]
    fn a_json_edit_returns_the_row_as_stored_on_the_blocking_path() {
        use diesel_occ::{GuardedJson, RetryPolicy};
        let Some(db) = db() else { return };
        let pool = db.pool.clone();
        a_json_edit_returns_the_row_as_stored(
            &db,
            |patch| StampedProfile::merge_json(&mut pool.get().unwrap(), &1, stamped_profiles::ext, patch, &RetryPolicy::default()),
            |pointer, value| StampedProfile::set_json(&mut pool.get().unwrap(), &1, stamped_profiles::ext, pointer, value, &RetryPolicy::default()),
        );
    }

    #[cfg(all(feature = "async", any(not(feature = "mysql"), feature = "async-mysql")))]
    #[test]
    fn a_json_edit_returns_the_row_as_stored_on_the_async_path() {
        use diesel_occ::asynchronous::AsyncGuardedJson;
        use diesel_occ::RetryPolicy;
        use std::cell::RefCell;
        let Some(db) = db() else { return };
        let runtime = common::paths::runtime();
        let conn = RefCell::new(<Conn as common::paths::AsyncOf>::connect(&db.url, &runtime));
        let policy = RetryPolicy::default();
        a_json_edit_returns_the_row_as_stored(
            &db,
            |patch| runtime.block_on(<StampedProfile as AsyncGuardedJson>::merge_json(&mut *conn.borrow_mut(), &1, stamped_profiles::ext, patch, &policy)),
            |pointer, value| runtime.block_on(<StampedProfile as AsyncGuardedJson>::set_json(&mut *conn.borrow_mut(), &1, stamped_profiles::ext, pointer, value, &policy)),
        );
    }

    fn load(conn: &mut diesel_occ::Pooled<Conn>) -> StampedOrder {
        stamped_orders::table.find(1).select(StampedOrder::as_select()).first(conn).unwrap()
    }

    /// Every guarded write stamps the row, and a save stamps the copy too.
    fn every_write_stamps_the_row_and_a_save_stamps_the_copy<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Save<StampedOrder> + Update<StampedOrder, NoteIs> + BulkUpdate<StampedOrder, IdIs, NoteIs>,
    {
        let mut order = setup(db);
        let conn = &mut db.conn();
        let w = &mut w();

        FrozenClock::freeze(at("2026-03-01T10:00:00.123456Z"));
        order.note = "saved".into();
        w.save(&mut order).unwrap();
        assert_eq!(load(conn), order, "the copy records the stamp it wrote");
        assert_eq!(order.updated_at, at("2026-03-01T10:00:00.123456Z").naive_utc());

        FrozenClock::freeze(at("2026-03-02T10:00:00Z"));
        w.update(&order, stamped_orders::note.eq("updated")).unwrap();
        assert_eq!(load(conn).updated_at, at("2026-03-02T10:00:00Z").naive_utc());

        FrozenClock::freeze(at("2026-03-03T10:00:00Z"));
        w.bulk_update(stamped_orders::id.eq(1), stamped_orders::note.eq("bulk")).unwrap();
        let stored = load(conn);
        assert_eq!((stored.version, stored.updated_at), (3, at("2026-03-03T10:00:00Z").naive_utc()));
    }

    /// The stamp is not the guard: a copy read before a write still conflicts by its
    /// version, and a failed write stamps nothing, in the row or in the copy.
    fn a_refused_write_stamps_nothing<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Save<StampedOrder> + Update<StampedOrder, NoteIs>,
    {
        let mut stale = setup(db);
        let conn = &mut db.conn();
        let w = &mut w();
        FrozenClock::freeze(at("2026-04-01T00:00:00Z"));
        w.update(&load(conn), stamped_orders::note.eq("winner")).unwrap();
        let row = load(conn);

        FrozenClock::freeze(at("2026-05-01T00:00:00Z"));
        stale.note = "loser".into();
        let err = w.save(&mut stale).unwrap_err();

        assert!(err.as_conflict().is_some(), "{err:?}");
        assert_eq!(load(conn), row);
        assert_eq!(stale.updated_at, at("2026-01-01T00:00:00Z").naive_utc());
        assert!(row.updated_at < at("2026-05-01T00:00:00Z").naive_utc() - TimeDelta::days(1));
    }

    /// The library sets the column: a changeset that also does is refused before sending.
    fn a_changeset_that_sets_the_stamp_is_refused<W>(db: &Db, w: impl Fn() -> W)
    where
        W: Update<StampedOrder, StampIs>,
    {
        let order = setup(db);
        FrozenClock::freeze(at("2026-04-01T00:00:00Z"));

        let err = w().update(&order, stamped_orders::updated_at.eq(at("2030-01-01T00:00:00Z").naive_utc())).unwrap_err();

        assert!(matches!(&err, Error::ChangesetAssignsGuard { column, .. } if column == "updated_at"), "{err:?}");
        assert_eq!(load(&mut db.conn()), order, "nothing was written");
    }

    tests_on_both_drivers!(
        |_: &Db| ();
        every_write_stamps_the_row_and_a_save_stamps_the_copy,
        a_refused_write_stamps_nothing,
        a_changeset_that_sets_the_stamp_is_refused,
    );

    /// A maintenance touch sets the update time outside the guard: the version stays, so
    /// a copy read before it still saves; the copy that touched records the stamp; a
    /// missing row is NotFound.
    #[test]
    fn a_maintenance_touch_sets_the_update_time_without_the_guard() {
        let Some(db) = db() else { return };
        let order = setup(&db);
        let pool = db.pool.clone();
        a_maintenance_touch_on(&db, order, |order| order.touch_updated_at(&mut pool.get().unwrap()), |id| {
            StampedOrder::touch_updated_at_by_key(&mut pool.get().unwrap(), &id)
        });
    }

    /// The same on the async path: the touches sent on a diesel-async connection.
    #[cfg(all(feature = "async", any(not(feature = "mysql"), feature = "async-mysql")))]
    #[test]
    fn a_maintenance_touch_on_the_async_path_sets_the_update_time_without_the_guard() {
        use diesel_occ::asynchronous::AsyncGuardedWrite;
        use std::cell::RefCell;
        let Some(db) = db() else { return };
        let order = setup(&db);
        let runtime = common::paths::runtime();
        let conn = RefCell::new(<Conn as common::paths::AsyncOf>::connect(&db.url, &runtime));
        a_maintenance_touch_on(
            &db,
            order,
            |order| runtime.block_on(AsyncGuardedWrite::touch_updated_at(order, &mut *conn.borrow_mut())),
            |id| runtime.block_on(<StampedOrder as AsyncGuardedWrite>::touch_updated_at_by_key(&mut *conn.borrow_mut(), &id)),
        );
    }

    /// The touch's behaviour, whichever executor `touch` and `touch_by_key` send it on.
    fn a_maintenance_touch_on(
        db: &common::TestDb<Conn>,
        mut order: StampedOrder,
        touch: impl Fn(&mut StampedOrder) -> Result<(), Error>,
        touch_by_key: impl Fn(i64) -> Result<(), Error>,
    ) {
        let conn = &mut db.conn();
        let mut editor = order.clone();

        FrozenClock::freeze(at("2026-06-01T08:00:00.5Z"));
        touch(&mut order).unwrap();
        assert_eq!(order.updated_at, at("2026-06-01T08:00:00.5Z").naive_utc());
        assert_eq!(load(conn), order, "the copy records the stamp; the version did not move");

        FrozenClock::freeze(at("2026-06-02T08:00:00Z"));
        touch_by_key(1).unwrap();
        assert_eq!(load(conn).updated_at, at("2026-06-02T08:00:00Z").naive_utc());
        assert!(matches!(touch_by_key(99), Err(Error::NotFound { .. })));

        // The update time is not excluded, but a maintenance job may set it directly too.
        StampedOrder::update_excluded_by_key(conn, &1, stamped_orders::updated_at.eq(at("2026-06-03T00:00:00Z").naive_utc()))
            .unwrap();
        assert!(matches!(
            StampedOrder::update_excluded_by_key(conn, &1, stamped_orders::note.eq("unguarded")),
            Err(Error::NotExcluded { .. })
        ));

        // The editor's copy was read before all of it, and still saves.
        FrozenClock::freeze(at("2026-06-04T00:00:00Z"));
        editor.note = "edited".into();
        editor.guarded_save(conn).unwrap();
        assert_eq!(load(conn), editor);
        assert_eq!(editor.version, 1);
    }
}
