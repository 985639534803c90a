//! JSON document edits, one test body each, on both executors (the blocking API and the
//! async one) on every backend: each edit's outcome, the rules that refuse bad input with
//! nothing written, and 8 writers merging into one row without losing a key.

#![cfg(all(
    feature = "async",
    any(not(feature = "mysql"), feature = "async-mysql")
))]

use crate::common;

use common::paths::{recorder, Async, AsyncOf, Blocking};
use diesel::prelude::*;
use diesel_occ::asynchronous::prelude::*;
use diesel_occ::{Error, GuardedJson, GuardedJsonMerge, Modified, RetryPolicy};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};

/// A typed view of part of a profile's document.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Address {
    city: Option<String>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct WithAddress {
    address: Option<Address>,
}

for_each_backend! {
    json_profiles!();

    type Async_ = <Conn as AsyncOf>::Async;
    type Pool = r2d2::Pool<diesel_occ::CheckedManager<Conn>>;

    /// The edits of the shared bodies, on `profiles`.
    trait Edits {
        const PATH: &'static str;
        fn merge(&mut self, id: i64, patch: &Value) -> Result<Modified<Profile, ()>, Error>;
        fn merge_in_place(&mut self, id: i64, patch: &Value) -> Result<i64, Error>;
        fn merge_without_token(&mut self, id: i64, patch: &Value) -> Result<(), Error>;
        fn patch(&mut self, id: i64, patch: &json_patch::Patch) -> Result<Modified<Profile, ()>, Error>;
        fn set(&mut self, id: i64, pointer: &str, value: Value) -> Result<Modified<Profile, ()>, Error>;
        fn remove(&mut self, id: i64, pointer: &str) -> Result<Modified<Profile, ()>, Error>;
        fn move_city(&mut self, id: i64, city: &'static str) -> Result<Modified<Profile, ()>, Error>;
        /// Runs `sql` on this executor's connection.
        fn execute(&mut self, sql: &str);
        /// The session's `LAST_INSERT_ID()` (MySQL).
        fn last_insert_id(&mut self) -> i64;
        /// Records every statement this executor's connection sends from now on.
        fn record_statements(&mut self) -> Arc<Mutex<Vec<String>>>;
    }

    /// A row of `SELECT LAST_INSERT_ID() AS id`.
    #[derive(QueryableByName)]
    struct LastInsertId {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        id: i64,
    }

    const LAST_INSERT_ID: &str = "SELECT CAST(LAST_INSERT_ID() AS SIGNED) AS id";


    fn to_city(city: &'static str) -> impl FnMut(&mut WithAddress) -> Result<(), Error> + Send + 'static {
        move |typed| {
            typed.address.get_or_insert(Address { city: None }).city = Some(city.into());
            Ok(())
        }
    }

    impl Edits for Blocking<diesel_occ::Pooled<Conn>> {
        const PATH: &'static str = "blocking";
        fn execute(&mut self, sql: &str) {
            diesel::connection::SimpleConnection::batch_execute(&mut *self.0, sql).unwrap();
        }
        fn last_insert_id(&mut self) -> i64 {
            diesel::sql_query(LAST_INSERT_ID).get_result::<LastInsertId>(&mut self.0).unwrap().id
        }
        fn record_statements(&mut self) -> Arc<Mutex<Vec<String>>> {
            let statements = Arc::new(Mutex::new(Vec::new()));
            self.0.set_instrumentation(recorder(&statements));
            statements
        }
        fn merge(&mut self, id: i64, patch: &Value) -> Result<Modified<Profile, ()>, Error> {
            <Profile as GuardedJson>::merge_json(&mut self.0, &id, profiles::ext, patch, &RetryPolicy::default())
        }
        fn merge_in_place(&mut self, id: i64, patch: &Value) -> Result<i64, Error> {
            <Profile as GuardedJsonMerge>::merge_json_in_place(&mut self.0, &id, profiles::ext, patch)
        }
        fn merge_without_token(&mut self, id: i64, patch: &Value) -> Result<(), Error> {
            <Profile as GuardedJsonMerge>::merge_json_in_place_without_token(&mut self.0, &id, profiles::ext, patch)
        }
        fn patch(&mut self, id: i64, patch: &json_patch::Patch) -> Result<Modified<Profile, ()>, Error> {
            <Profile as GuardedJson>::patch_json(&mut self.0, &id, profiles::ext, patch, &RetryPolicy::default())
        }
        fn set(&mut self, id: i64, pointer: &str, value: Value) -> Result<Modified<Profile, ()>, Error> {
            <Profile as GuardedJson>::set_json(&mut self.0, &id, profiles::ext, pointer, value, &RetryPolicy::default())
        }
        fn remove(&mut self, id: i64, pointer: &str) -> Result<Modified<Profile, ()>, Error> {
            <Profile as GuardedJson>::remove_json(&mut self.0, &id, profiles::ext, pointer, &RetryPolicy::default())
        }
        fn move_city(&mut self, id: i64, city: &'static str) -> Result<Modified<Profile, ()>, Error> {
            <Profile as GuardedJson>::update_json_as(&mut self.0, &id, profiles::ext, &RetryPolicy::default(), to_city(city))
        }
    }

    impl Edits for Async<Async_> {
        fn execute(&mut self, sql: &str) {
            self.runtime.block_on(diesel_async::SimpleAsyncConnection::batch_execute(&mut self.conn, sql)).unwrap();
        }
        fn last_insert_id(&mut self) -> i64 {
            let read = diesel_async::RunQueryDsl::get_result::<LastInsertId>(diesel::sql_query(LAST_INSERT_ID), &mut self.conn);
            self.runtime.block_on(read).unwrap().id
        }
        fn record_statements(&mut self) -> Arc<Mutex<Vec<String>>> {
            let statements = Arc::new(Mutex::new(Vec::new()));
            diesel_async::AsyncConnection::set_instrumentation(&mut self.conn, recorder(&statements));
            statements
        }
        const PATH: &'static str = "async";
        fn merge(&mut self, id: i64, patch: &Value) -> Result<Modified<Profile, ()>, Error> {
            let policy = RetryPolicy::default();
            self.runtime.block_on(<Profile as AsyncGuardedJson>::merge_json(&mut self.conn, &id, profiles::ext, patch, &policy))
        }
        fn merge_in_place(&mut self, id: i64, patch: &Value) -> Result<i64, Error> {
            self.runtime.block_on(<Profile as AsyncGuardedJson>::merge_json_in_place(&mut self.conn, &id, profiles::ext, patch))
        }
        fn merge_without_token(&mut self, id: i64, patch: &Value) -> Result<(), Error> {
            self.runtime.block_on(<Profile as AsyncGuardedJson>::merge_json_in_place_without_token(&mut self.conn, &id, profiles::ext, patch))
        }
        fn patch(&mut self, id: i64, patch: &json_patch::Patch) -> Result<Modified<Profile, ()>, Error> {
            let policy = RetryPolicy::default();
            self.runtime.block_on(<Profile as AsyncGuardedJson>::patch_json(&mut self.conn, &id, profiles::ext, patch, &policy))
        }
        fn set(&mut self, id: i64, pointer: &str, value: Value) -> Result<Modified<Profile, ()>, Error> {
            let policy = RetryPolicy::default();
            self.runtime.block_on(<Profile as AsyncGuardedJson>::set_json(&mut self.conn, &id, profiles::ext, pointer, value, &policy))
        }
        fn remove(&mut self, id: i64, pointer: &str) -> Result<Modified<Profile, ()>, Error> {
            let policy = RetryPolicy::default();
            self.runtime.block_on(<Profile as AsyncGuardedJson>::remove_json(&mut self.conn, &id, profiles::ext, pointer, &policy))
        }
        fn move_city(&mut self, id: i64, city: &'static str) -> Result<Modified<Profile, ()>, Error> {
            let policy = RetryPolicy::default();
            self.runtime.block_on(<Profile as AsyncGuardedJson>::update_json_as(&mut self.conn, &id, profiles::ext, &policy, to_city(city)))
        }
    }

    fn load(pool: &Pool, id: i64) -> Profile {
        profiles::table.find(id).select(Profile::as_select()).first(&mut pool.get().unwrap()).unwrap()
    }

    fn seeded(ext: Value) -> Option<common::TestDb<Conn>> {
        let db = db()?;
        let row = Profile { id: 1, name: "ada".into(), ext, version: 0 };
        diesel::insert_into(profiles::table).values(&row).execute(&mut db.conn()).unwrap();
        Some(db)
    }

    fn every_edit_lands_as_its_rfc_says<E: Edits>(e: &mut E, pool: &Pool) {
        let done = e.merge(1, &json!({"tier": null, "vip": true, "address": {"zip": "0150"}})).unwrap();
        assert_eq!((done.token, done.attempts), (1, 1), "{}", E::PATH);
        assert_eq!(load(pool, 1).ext, json!({"vip": true, "address": {"city": "Oslo", "zip": "0150"}}));
        assert_eq!(e.merge_in_place(1, &json!({"score": 7})).unwrap(), 2);
        let patch: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": "/score", "value": 7},
            {"op": "replace", "path": "/score", "value": 8}
        ])).unwrap();
        assert_eq!(e.patch(1, &patch).unwrap().token, 3);
        assert_eq!(e.set(1, "/address/street", json!("Storgata")).unwrap().token, 4);
        assert_eq!(e.remove(1, "/address/zip").unwrap().token, 5);
        assert_eq!(e.move_city(1, "Bergen").unwrap().token, 6);
        let row = load(pool, 1);
        assert_eq!(row.ext, json!({"vip": true, "score": 8, "address": {"city": "Bergen", "street": "Storgata"}}));
        assert_eq!(row.version, 6);
        // Removing what is not there changes nothing: no write, the token stays.
        assert_eq!(e.remove(1, "/nothing").unwrap().token, 6);
    }

    fn bad_input_is_refused_with_nothing_written<E: Edits>(e: &mut E, pool: &Pool) {
        let before = load(pool, 1);
        assert!(matches!(e.merge(1, &json!([1, 2])), Err(Error::InvalidPatch { .. })), "{}", E::PATH);
        assert!(matches!(e.merge_in_place(1, &json!("text")), Err(Error::InvalidPatch { .. })));
        let failed_test: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": "/tier", "value": "silver"},
            {"op": "remove", "path": "/tier"}
        ])).unwrap();
        assert!(matches!(e.patch(1, &failed_test), Err(Error::InvalidPatch { .. })));
        assert!(matches!(e.set(1, "", json!(1)), Err(Error::InvalidPatch { .. })));
        assert!(matches!(e.set(1, "/tier/x", json!(1)), Err(Error::InvalidPatch { .. })));
        assert!(matches!(e.merge(9, &json!({"a": 1})), Err(Error::NotFound { .. })));
        assert!(matches!(e.merge_in_place(9, &json!({"a": 1})), Err(Error::NotFound { .. })));
        assert_eq!(load(pool, 1), before);
    }

    /// A one-statement merge sends what its backend needs to hand the new version back
    /// and no more: one statement (`UPDATE ... RETURNING`) on PostgreSQL and SQLite; on
    /// MySQL the `UPDATE` and one `SELECT` of the version it noted, no transaction. The
    /// version it returns is the row's. On MySQL the caller's `LAST_INSERT_ID()` is the
    /// same after it, whether the merge wrote, missed its row, or ran inside the
    /// caller's transaction.
    fn a_merge_in_place_sends_at_most_two_statements<E: Edits>(e: &mut E, pool: &Pool) {
        let mysql = BACKEND == "mysql";
        if mysql {
            e.execute("CREATE TABLE occ_ids (id BIGINT AUTO_INCREMENT PRIMARY KEY, n INT)");
            e.execute("INSERT INTO occ_ids (n) VALUES (1)");
            e.execute("INSERT INTO occ_ids (n) VALUES (2)");
            assert_eq!(e.last_insert_id(), 2);
        }
        let statements = e.record_statements();
        let token = e.merge_in_place(1, &json!({"n": 1})).unwrap();
        let sent = std::mem::take(&mut *statements.lock().unwrap());
        assert_eq!(sent.len(), if mysql { 2 } else { 1 }, "{}: {sent:#?}", E::PATH);
        assert_eq!((token, load(pool, 1).version), (1, 1), "{}", E::PATH);
        if !mysql {
            return;
        }
        assert_eq!(e.last_insert_id(), 2, "{}: the caller's last insert id after a write", E::PATH);
        assert!(matches!(e.merge_in_place(9, &json!({"n": 2})), Err(Error::NotFound { .. })));
        assert_eq!(e.last_insert_id(), 2, "{}: the caller's last insert id after a miss", E::PATH);
        e.execute("BEGIN");
        e.execute("INSERT INTO occ_ids (n) VALUES (3)");
        assert_eq!(e.merge_in_place(1, &json!({"n": 3})).unwrap(), 2);
        assert_eq!(e.last_insert_id(), 3, "{}: inside the caller's transaction", E::PATH);
        e.execute("COMMIT");
        assert_eq!(load(pool, 1).ext["n"], json!(3));
    }

    /// The merge without its token sends one statement on every backend, merges and
    /// advances the version as the other does, reports a missing row, refuses a bad patch
    /// before sending anything, and leaves MySQL's `LAST_INSERT_ID()` alone.
    fn a_merge_without_token_sends_one_statement<E: Edits>(e: &mut E, pool: &Pool) {
        let mysql = BACKEND == "mysql";
        if mysql {
            e.execute("CREATE TABLE occ_ids (id BIGINT AUTO_INCREMENT PRIMARY KEY, n INT)");
            e.execute("INSERT INTO occ_ids (n) VALUES (1)");
            assert_eq!(e.last_insert_id(), 1);
        }
        let statements = e.record_statements();
        e.merge_without_token(1, &json!({"n": 1, "tier": null})).unwrap();
        let sent = std::mem::take(&mut *statements.lock().unwrap());
        assert_eq!(sent.len(), 1, "{}: {sent:#?}", E::PATH);
        let row = load(pool, 1);
        assert_eq!(row.version, 1, "{}", E::PATH);
        assert_eq!(row.ext, json!({"n": 1, "address": {"city": "Oslo"}}), "{}", E::PATH);
        assert!(
            matches!(e.merge_without_token(9, &json!({"n": 2})), Err(Error::NotFound { .. })),
            "{}",
            E::PATH
        );
        statements.lock().unwrap().clear();
        assert!(matches!(e.merge_without_token(1, &json!([1])), Err(Error::InvalidPatch { .. })));
        assert!(statements.lock().unwrap().is_empty(), "{}: a refused patch sent SQL", E::PATH);
        assert_eq!(e.merge_in_place(1, &json!({"n": 2})).unwrap(), 2, "{}", E::PATH);
        if mysql {
            assert_eq!(e.last_insert_id(), 1, "{}: the caller's last insert id", E::PATH);
        }
    }

    /// A version below zero advances like any other (MySQL notes it through the unsigned
    /// `LAST_INSERT_ID`), with the token handed back and without it.
    fn a_negative_version_advances<E: Edits>(e: &mut E, pool: &Pool) {
        diesel::update(profiles::table.find(1)).set(profiles::version.eq(-3_i64)).execute(&mut pool.get().unwrap()).unwrap();
        assert_eq!(e.merge_in_place(1, &json!({"n": 1})).unwrap(), -2, "{}", E::PATH);
        e.merge_without_token(1, &json!({"n": 2})).unwrap();
        let row = load(pool, 1);
        assert_eq!((row.version, &row.ext["n"]), (-1, &json!(2)), "{}", E::PATH);
    }

    macro_rules! on_both_paths {
        ($($body:ident),*) => {
            mod blocking {
                use super::*;
                $(#[test] fn $body() {
                    let Some(db) = seeded(json!({"tier": "gold", "address": {"city": "Oslo"}})) else { return };
                    super::$body(&mut Blocking(db.conn()), &db.pool);
                })*
            }
            mod on_async {
                use super::*;
                $(#[test] fn $body() {
                    let Some(db) = seeded(json!({"tier": "gold", "address": {"city": "Oslo"}})) else { return };
                    let runtime = common::paths::runtime();
                    let mut edits = Async { conn: Conn::connect(&db.url, &runtime), runtime };
                    super::$body(&mut edits, &db.pool);
                })*
            }
        };
    }

    on_both_paths!(
        every_edit_lands_as_its_rfc_says,
        bad_input_is_refused_with_nothing_written,
        a_merge_in_place_sends_at_most_two_statements,
        a_merge_without_token_sends_one_statement,
        a_negative_version_advances
    );

    /// 8 writers, each merging its own 10 keys into one row by read-merge-write, in one
    /// statement, and in one statement without the token, in turn: every key is there,
    /// and every merge moved the version once.
    fn eight_writers_keep_every_key<E: Edits + Send>(pool: &Pool, edits: impl Fn() -> E + Sync) {
        let start = std::sync::Barrier::new(8);
        std::thread::scope(|s| {
            for writer in 0..8 {
                let (start, edits) = (&start, &edits);
                s.spawn(move || {
                    let mut e = edits();
                    start.wait();
                    for n in 0..10 {
                        let patch = json!({ format!("w{writer}k{n}"): n });
                        match n % 3 {
                            0 => drop(e.merge(1, &patch).unwrap()),
                            1 => drop(e.merge_in_place(1, &patch).unwrap()),
                            _ => e.merge_without_token(1, &patch).unwrap(),
                        }
                    }
                });
            }
        });
        let row = load(pool, 1);
        let keys = row.ext.as_object().unwrap();
        assert_eq!(keys.len(), 80, "{}", E::PATH);
        assert_eq!(row.version, 80);
    }

    #[test]
    fn eight_blocking_writers_keep_every_key() {
        let Some(db) = seeded(json!({})) else { return };
        let pool = &db.pool;
        eight_writers_keep_every_key(pool, || Blocking(pool.get().unwrap()));
    }

    #[test]
    fn eight_async_writers_keep_every_key() {
        let Some(db) = seeded(json!({})) else { return };
        let (pool, url) = (&db.pool, &db.url);
        eight_writers_keep_every_key(pool, || {
            let runtime = common::paths::runtime();
            Async { conn: Conn::connect(url, &runtime), runtime }
        });
    }
}
