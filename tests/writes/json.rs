//! JSON extension columns: read-merge-write under the guard with retry, and one-statement
//! merges, on every backend; concurrent writers never lose each other's keys. Each body
//! runs on both drivers (the blocking API and the async one).

use crate::common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::drivers::{race, EditJsonColumn, MergeJsonInPlace};
use diesel::prelude::*;
use diesel_occ::{Error, RetryPolicy};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// A patient policy for the hot-row tests: they check end states, not latency.
fn patient() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(10_000)
        .max_elapsed(Duration::from_secs(300))
}

/// What the shipping service knows of the document; other services' keys are not here.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Shipping {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    carrier: Option<String>,
    #[serde(default)]
    parcels: u32,
}

/// The merge cases both paths must agree on: (stored document, patch, result).
fn merge_cases() -> Vec<(Value, Value, Value)> {
    vec![
        (json!({"a": 1}), json!({"b": 2}), json!({"a": 1, "b": 2})),
        // Flat patches (no member is an object; PostgreSQL's cached statement): a null
        // inside an array value is data, not a deletion; a deletion of a missing key.
        (
            json!({"a": 1, "b": 2}),
            json!({"a": [{"x": null}, null], "b": null, "c": null, "ключ 🔑": "ä"}),
            json!({"a": [{"x": null}, null], "ключ 🔑": "ä"}),
        ),
        (json!({"a": 1}), json!({}), json!({"a": 1})),
        (
            json!({"a": {"b": 1, "c": 2}}),
            json!({"a": {"c": 3, "d": 4}}),
            json!({"a": {"b": 1, "c": 3, "d": 4}}),
        ),
        (json!({"a": 1, "b": 2}), json!({"a": null}), json!({"b": 2})),
        (
            json!({"a": {"b": 1}}),
            json!({"a": {"b": null}}),
            json!({"a": {}}),
        ),
        (json!({"a": 1}), json!({"gone": null}), json!({"a": 1})),
        (
            json!({"tags": [1, 2, 3]}),
            json!({"tags": [4]}),
            json!({"tags": [4]}),
        ),
        (
            json!({"a": [1, {"b": 2}]}),
            json!({"a": {"b": 3}}),
            json!({"a": {"b": 3}}),
        ),
        (
            json!({"a": "text"}),
            json!({"a": {"b": 1}}),
            json!({"a": {"b": 1}}),
        ),
        (
            json!({"a": 5}),
            json!({"a": {"b": {"c": null, "d": [true]}}}),
            json!({"a": {"b": {"d": [true]}}}),
        ),
        (
            json!({"a": {"b": 1}}),
            json!({"a": "flat"}),
            json!({"a": "flat"}),
        ),
        (
            json!({"ключ": "значение", "🚚": 1}),
            json!({"🚚": 2, "名前": "太郎"}),
            json!({"ключ": "значение", "🚚": 2, "名前": "太郎"}),
        ),
        (
            json!({"a.b": 1, "it's": {"\"q\"": 1}}),
            json!({"a.b": null, "it's": {"\"q\"": 2, "x\\y": "$1"}}),
            json!({"it's": {"\"q\"": 2, "x\\y": "$1"}}),
        ),
        (
            json!({"n": null}),
            json!({"m": 1}),
            json!({"n": null, "m": 1}),
        ),
        (json!({"a": 1}), json!({}), json!({"a": 1})),
        (
            json!({"deep": {"er": {"est": {"x": 1}}}}),
            json!({"deep": {"er": {"est": {"y": 2}, "new": {}}}}),
            json!({"deep": {"er": {"est": {"x": 1, "y": 2}, "new": {}}}}),
        ),
        (
            json!({"s": "a'b\"c;--"}),
            json!({"s": "DROP TABLE profiles; --'"}),
            json!({"s": "DROP TABLE profiles; --'"}),
        ),
    ]
}

for_each_backend! {
    json_profiles!();

    type Db = common::TestDb<Conn>;
    type Pooled = diesel_occ::Pooled<Conn>;

    /// Both kinds of edit of `profiles.ext`, on one driver.
    trait Json: EditJsonColumn<Profile, profiles::ext> + MergeJsonInPlace<Profile, profiles::ext> {}

    impl<W: EditJsonColumn<Profile, profiles::ext> + MergeJsonInPlace<Profile, profiles::ext>> Json for W {}

    fn insert(conn: &mut Pooled, id: i64, ext: Value) {
        let row = Profile { id, name: "ada".into(), ext, version: 0 };
        diesel::insert_into(profiles::table).values(&row).execute(conn).unwrap();
    }

    fn load(conn: &mut Pooled, id: i64) -> Profile {
        profiles::table.find(id).select(Profile::as_select()).first(conn).unwrap()
    }

    fn a_merge_patch_merges_nested_keys_deletes_nulls_and_advances_the_version<W: Json>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        insert(conn, 1, json!({"tier": "gold", "address": {"city": "Oslo", "zip": "0150"}}));

        let done = w().merge_json(&1, profiles::ext, &json!({"address": {"zip": null, "street": "Storgata"}, "vip": true}), &RetryPolicy::default()).unwrap();

        assert_eq!((done.token, done.attempts), (1, 1));
        let stored = load(conn, 1);
        assert_eq!(stored.ext, json!({"tier": "gold", "vip": true, "address": {"city": "Oslo", "street": "Storgata"}}));
        assert_eq!(stored, done.row);
    }

    /// Both paths on the same table of cases give the same, expected, document.
    fn read_merge_write_and_the_one_statement_merge_agree_on_every_case<W: Json>(db: &Db, w: impl Fn() -> W) {
        let (conn, w) = (&mut db.conn(), &mut w());
        for (i, (stored, patch, expected)) in merge_cases().into_iter().enumerate() {
            let (rmw, one) = (2 * i as i64 + 1, 2 * i as i64 + 2);
            insert(conn, rmw, stored.clone());
            insert(conn, one, stored.clone());

            w.merge_json(&rmw, profiles::ext, &patch, &RetryPolicy::default()).unwrap();
            let version = w.merge_json_in_place(&one, profiles::ext, &patch).unwrap();

            let mut in_memory = stored.clone();
            json_patch::merge(&mut in_memory, &patch);
            assert_eq!(in_memory, expected, "case {i}: the expected result is RFC 7396's");
            assert_eq!(load(conn, rmw).ext, expected, "case {i}: read-merge-write of {patch} into {stored}");
            let merged = load(conn, one);
            assert_eq!(merged.ext, expected, "case {i}: one-statement merge of {patch} into {stored}");
            assert_eq!((version, merged.version), (1, 1), "case {i}: the version advanced");
        }
    }

    /// 8 threads x 200 merges into one row, each thread keeping its own counter and adding
    /// its own keys, each on an executor of its own; `mode` picks each thread's path.
    fn hot_row<W: Json>(db: &Db, w: impl Fn() -> W + Sync, mode: &str, in_place: fn(usize) -> bool) {
        const THREADS: usize = 8;
        const MERGES: usize = 200;
        insert(&mut db.conn(), 1, json!({"owner": "nobody"}));
        let attempts = AtomicU32::new(0);
        let policy = patient();

        race(THREADS, w, |t, w| {
            for i in 1..=MERGES {
                let patch = json!({ format!("c{t}"): i, format!("k{t}_{i}"): t });
                if in_place(t) {
                    w.merge_json_in_place(&1, profiles::ext, &patch).unwrap();
                    attempts.fetch_add(1, Ordering::Relaxed);
                } else {
                    let done = w.merge_json(&1, profiles::ext, &patch, &policy).unwrap();
                    attempts.fetch_add(done.attempts, Ordering::Relaxed);
                }
            }
        });

        let row = load(&mut db.conn(), 1);
        let ext = row.ext.as_object().unwrap();
        assert_eq!(ext["owner"], json!("nobody"));
        for t in 0..THREADS {
            assert_eq!(ext[&format!("c{t}")], json!(MERGES), "thread {t}'s counter");
            for i in 1..=MERGES {
                assert_eq!(ext.get(&format!("k{t}_{i}")), Some(&json!(t)), "key k{t}_{i} was lost");
            }
        }
        assert_eq!(ext.len(), 1 + THREADS * (MERGES + 1));
        let writes = (THREADS * MERGES) as u32;
        assert_eq!(row.version, writes as i64, "every merge advanced the version once");
        let retries = attempts.load(Ordering::Relaxed) - writes;
        println!("{BACKEND} {mode}: {writes} merges by {THREADS} threads, {retries} retries ({:.2} per merge)", retries as f64 / writes as f64);
    }

    fn eight_threads_of_read_merge_write_keep_every_key<W: Json>(db: &Db, w: impl Fn() -> W + Sync) {
        hot_row(db, w, "read-merge-write", |_| false);
    }

    fn eight_threads_of_one_statement_merges_keep_every_key<W: Json>(db: &Db, w: impl Fn() -> W + Sync) {
        hot_row(db, w, "one-statement", |_| true);
    }

    fn a_mix_of_both_paths_keeps_every_key<W: Json>(db: &Db, w: impl Fn() -> W + Sync) {
        hot_row(db, w, "mixed", |t| t % 2 == 0);
    }

    /// A typed writer that knows two keys and an untyped one that adds others, at once,
    /// each on an executor of its own: neither drops the other's keys.
    fn a_typed_and_an_untyped_writer_keep_each_others_keys<W: Json>(db: &Db, w: impl Fn() -> W + Sync) {
        const EACH: u32 = 100;
        insert(&mut db.conn(), 1, json!({"parcels": 0}));
        let policy = patient();

        race(2, w, |t, w| {
            for i in 1..=EACH {
                if t == 0 {
                    w.update_json_as(&1, profiles::ext, &policy, move |shipping: &mut Shipping| {
                        shipping.parcels += 1;
                        shipping.carrier = Some(format!("carrier {i}"));
                        Ok(())
                    })
                    .unwrap();
                } else {
                    w.edit_json(&1, profiles::ext, &policy, move |doc| {
                        doc[format!("note{i}")] = json!(i);
                        Ok(())
                    })
                    .unwrap();
                }
            }
        });

        let ext = load(&mut db.conn(), 1).ext;
        let shipping: Shipping = serde_json::from_value(ext.clone()).unwrap();
        assert_eq!(shipping, Shipping { carrier: Some(format!("carrier {EACH}")), parcels: EACH });
        for i in 1..=EACH {
            assert_eq!(ext[format!("note{i}")], json!(i), "the untyped writer's key note{i}");
        }
    }

    fn a_typed_field_set_to_none_is_removed_and_unknown_keys_stay<W: Json>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        insert(conn, 1, json!({"carrier": "DHL", "parcels": 2, "crm": {"id": 7}}));

        w().update_json_as(&1, profiles::ext, &RetryPolicy::default(), |s: &mut Shipping| {
            s.carrier = None;
            Ok(())
        })
        .unwrap();

        assert_eq!(load(conn, 1).ext, json!({"parcels": 2, "crm": {"id": 7}}));
    }

    fn json_patch_applies_all_operations_or_none<W: Json>(db: &Db, w: impl Fn() -> W) {
        let (conn, w) = (&mut db.conn(), &mut w());
        insert(conn, 1, json!({"status": "new", "tags": ["a"]}));
        let patch: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": "/status", "value": "new"},
            {"op": "replace", "path": "/status", "value": "paid"},
            {"op": "add", "path": "/tags/-", "value": "b"}
        ]))
        .unwrap();

        w.patch_json(&1, profiles::ext, &patch, &RetryPolicy::default()).unwrap();
        assert_eq!(load(conn, 1).ext, json!({"status": "paid", "tags": ["a", "b"]}));

        // The same patch again: its `test` fails now, and nothing is written.
        let err = w.patch_json(&1, profiles::ext, &patch, &RetryPolicy::default()).unwrap_err();
        assert!(matches!(&err, Error::InvalidPatch { column: "ext", .. }), "{err}");
        assert_eq!((load(conn, 1).ext, load(conn, 1).version), (json!({"status": "paid", "tags": ["a", "b"]}), 1));
    }

    fn set_and_remove_at_a_pointer<W: Json>(db: &Db, w: impl Fn() -> W) {
        let (conn, w) = (&mut db.conn(), &mut w());
        insert(conn, 1, json!({"name": "ada"}));
        let policy = RetryPolicy::default();

        w.set_json(&1, profiles::ext, "/address/geo/lat", json!(59.9), &policy).unwrap();
        w.set_json(&1, profiles::ext, "/a~1b", json!("slash"), &policy).unwrap();
        assert_eq!(load(conn, 1).ext, json!({"name": "ada", "address": {"geo": {"lat": 59.9}}, "a/b": "slash"}));

        w.remove_json(&1, profiles::ext, "/address/geo", &policy).unwrap();
        let unchanged = w.remove_json(&1, profiles::ext, "/not/there", &policy).unwrap();
        assert_eq!(unchanged.token, 3, "removing nothing writes nothing");
        assert_eq!(load(conn, 1).ext, json!({"name": "ada", "address": {}, "a/b": "slash"}));
        assert_eq!(load(conn, 1).version, 3);
    }

    /// Each bad input is a clear error naming table, key and column; the row is unchanged.
    fn bad_edits_are_refused_and_write_nothing<W: Json>(db: &Db, w: impl Fn() -> W) {
        let (conn, w) = (&mut db.conn(), &mut w());
        insert(conn, 1, json!({"name": "ada"}));
        let before = load(conn, 1);
        let policy = RetryPolicy::default();
        let huge = json!({"blob": "x".repeat(diesel_occ::DOCUMENT_LIMIT_BYTES)});

        let errors = [
            w.merge_json(&1, profiles::ext, &json!([1, 2]), &policy).unwrap_err(),
            w.merge_json_in_place(&1, profiles::ext, &json!("text")).unwrap_err(),
            w.set_json(&1, profiles::ext, "/name/first", json!("x"), &policy).unwrap_err(),
            w.set_json(&1, profiles::ext, "no-slash", json!("x"), &policy).unwrap_err(),
            w.remove_json(&1, profiles::ext, "", &policy).unwrap_err(),
            w.merge_json(&1, profiles::ext, &huge, &policy).unwrap_err(),
            w.merge_json_in_place(&1, profiles::ext, &huge).unwrap_err(),
            w.edit_json(&1, profiles::ext, &policy, |doc| {
                *doc = json!(42);
                Ok(())
            })
            .unwrap_err(),
        ];

        for err in &errors {
            match err {
                Error::InvalidPatch { table: "profiles", key, column: "ext", .. } => assert_eq!(key, "1"),
                other => panic!("{other}"),
            }
        }
        assert_eq!(load(conn, 1), before);
        let missing = w.merge_json_in_place(&9, profiles::ext, &json!({"a": 1})).unwrap_err();
        assert!(matches!(missing, Error::NotFound { .. }), "{missing}");
    }

    /// A NULL where the document should be (a column the schema says is NOT NULL, but the
    /// database lets hold NULL) is reported naming table, key and column; nothing written.
    fn a_null_document_is_invalid_data<W: Json>(db: &Db, w: impl Fn() -> W) {
        use diesel::connection::SimpleConnection;
        let conn = &mut db.conn();
        let json_type = match BACKEND { "postgres" => "JSONB", "mysql" => "JSON", _ => "TEXT" };
        conn.batch_execute(&format!(
            "DROP TABLE profiles; CREATE TABLE profiles (id BIGINT PRIMARY KEY, name TEXT NOT NULL, \
             ext {json_type} NULL, version BIGINT NOT NULL); \
             INSERT INTO profiles (id, name, ext, version) VALUES (1, 'ada', NULL, 0)"
        ))
        .unwrap();

        let err = w().merge_json(&1, profiles::ext, &json!({"a": 1}), &RetryPolicy::default()).unwrap_err();

        match &err {
            Error::InvalidData { table: "profiles", column, reason } => {
                assert!(column.starts_with("ext"), "{column}");
                assert!(reason.contains("row 1"), "{reason}");
            }
            other => panic!("{other}"),
        }
        let (ext, version): (Option<String>, i64) = profiles::table
            .select((diesel::dsl::sql::<diesel::sql_types::Nullable<diesel::sql_types::Text>>("CAST(ext AS CHAR)"), profiles::version))
            .first(conn)
            .unwrap();
        assert_eq!((ext, version), (None, 0));
    }

    /// A stored document that is not an object is refused by every read-merge-write edit,
    /// naming table, key and column, and nothing is written.
    fn a_stored_document_that_is_not_an_object_is_invalid_data<W: Json>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        insert(conn, 1, json!([1, 2, 3]));

        let err = w().merge_json(&1, profiles::ext, &json!({"a": 1}), &RetryPolicy::default()).unwrap_err();

        match &err {
            Error::InvalidData { table: "profiles", column, reason } => {
                assert_eq!(column, "ext");
                assert!(reason.contains("row 1") && reason.contains("an array"), "{reason}");
            }
            other => panic!("{other}"),
        }
        assert_eq!((load(conn, 1).ext, load(conn, 1).version), (json!([1, 2, 3]), 0));
    }

    /// A one-statement merge racing its row's insert either finds no row (`NotFound`) or
    /// writes: never a refusal. Its `UPDATE` can match nothing just before the insert
    /// commits and its re-read then find the row (found by the soak: it answered
    /// `Refused`, "retrying cannot help").
    fn a_merge_racing_its_rows_insert_writes_or_finds_nothing<W: Json>(db: &Db, w: impl Fn() -> W + Sync) {
        const KEYS: i64 = 300;
        let (each_key, pool) = (std::sync::Barrier::new(2), &db.pool);
        let answers = race(2, &w, |t, w| {
            let mut wrong = Vec::new();
            for key in 1..=KEYS {
                each_key.wait();
                if t == 0 {
                    std::thread::sleep(std::time::Duration::from_micros((key as u64 * 37) % 400));
                    insert(&mut pool.get().unwrap(), key, json!({}));
                    continue;
                }
                loop {
                    match w.merge_json_in_place(&key, profiles::ext, &json!({ "m": key })) {
                        Ok(_) => break,
                        Err(Error::NotFound { .. }) => {}
                        Err(other) => {
                            wrong.push(format!("key {key}: {other}"));
                            break;
                        }
                    }
                }
            }
            wrong
        });
        let wrong: Vec<_> = answers.into_iter().flatten().collect();
        assert!(wrong.is_empty(), "{} wrong answers: {wrong:?}", wrong.len());
        let conn = &mut db.conn();
        for key in 1..=KEYS {
            let row = load(conn, key);
            if row.ext != json!({ "m": key }) {
                panic!("key {key}: the merge that answered Ok is not in the row: {row:?}");
            }
        }
    }

    tests_on_both_drivers!(
        |_: &Db| ();
        a_merge_racing_its_rows_insert_writes_or_finds_nothing,
        a_merge_patch_merges_nested_keys_deletes_nulls_and_advances_the_version,
        read_merge_write_and_the_one_statement_merge_agree_on_every_case,
        eight_threads_of_read_merge_write_keep_every_key,
        eight_threads_of_one_statement_merges_keep_every_key,
        a_mix_of_both_paths_keeps_every_key,
        a_typed_and_an_untyped_writer_keep_each_others_keys,
        a_typed_field_set_to_none_is_removed_and_unknown_keys_stay,
        json_patch_applies_all_operations_or_none,
        set_and_remove_at_a_pointer,
        bad_edits_are_refused_and_write_nothing,
        a_null_document_is_invalid_data,
        a_stored_document_that_is_not_an_object_is_invalid_data,
    );
}

/// SQLite keeps JSON as text, so a column can hold text that is not JSON at all: every
/// edit reports it, naming the column, and writes nothing.
#[cfg(feature = "sqlite")]
mod sqlite_malformed {
    use super::*;
    use sqlite::{profiles, Profile};

    type Conn = diesel::SqliteConnection;
    type Db = common::TestDb<Conn>;
    fn db() -> Option<Db> {
        common::sqlite()
    }

    fn malformed_json_is_invalid_data<W>(db: &Db, w: impl Fn() -> W)
    where
        W: EditJsonColumn<Profile, profiles::ext> + MergeJsonInPlace<Profile, profiles::ext>,
    {
        use diesel::connection::SimpleConnection;
        let conn = &mut db.conn();
        conn.batch_execute(
            "INSERT INTO profiles (id, name, ext, version) VALUES (1, 'ada', '{\"a\": 1,', 0)",
        )
        .unwrap();
        let w = &mut w();

        let err = w
            .merge_json(&1, profiles::ext, &json!({"b": 2}), &RetryPolicy::default())
            .unwrap_err();
        let in_place = w
            .merge_json_in_place(&1, profiles::ext, &json!({"b": 2}))
            .unwrap_err();

        match &err {
            Error::InvalidData {
                table: "profiles",
                column,
                reason,
            } => {
                assert!(column.starts_with("ext"), "{column}");
                assert!(reason.contains("row 1"), "{reason}");
            }
            other => panic!("{other}"),
        }
        assert!(matches!(in_place, Error::Database(_)), "{in_place}");
        let text: String = diesel::select(diesel::dsl::sql::<diesel::sql_types::Text>(
            "(SELECT ext FROM profiles)",
        ))
        .get_result(conn)
        .unwrap();
        assert_eq!(text, "{\"a\": 1,");
    }

    crate::tests_on_both_drivers!(
        |_: &Db| ();
        malformed_json_is_invalid_data,
    );
}

/// A PostgreSQL `json` column (not `jsonb`) merges in one statement too: merged as
/// `jsonb`, cast back.
#[cfg(feature = "postgres")]
mod postgres_json_column {
    use super::*;

    type Conn = diesel::PgConnection;
    type Db = common::TestDb<Conn>;
    fn db() -> Option<Db> {
        common::postgres()
    }

    diesel::table! {
        plain_json (id) {
            id -> BigInt,
            ext -> Json,
            version -> BigInt,
        }
    }

    #[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, diesel_occ::Guarded)]
    #[diesel(table_name = plain_json)]
    struct PlainJson {
        id: i64,
        #[occ(json)]
        ext: Value,
        #[occ(version)]
        version: i64,
    }

    fn create_table(db: &Db) {
        use diesel::connection::SimpleConnection;
        db.conn()
            .batch_execute(
                "CREATE TABLE plain_json (id BIGINT PRIMARY KEY, ext JSON NOT NULL, version BIGINT NOT NULL);
                 INSERT INTO plain_json VALUES (1, '{\"a\": {\"b\": 1}, \"c\": 2}', 0);",
            )
            .unwrap();
    }

    fn merges_in_one_statement<W>(db: &Db, w: impl Fn() -> W)
    where
        W: EditJsonColumn<PlainJson, plain_json::ext>
            + MergeJsonInPlace<PlainJson, plain_json::ext>,
    {
        let w = &mut w();
        let version = w
            .merge_json_in_place(&1, plain_json::ext, &json!({"a": {"d": 3}, "c": null}))
            .unwrap();
        w.merge_json(
            &1,
            plain_json::ext,
            &json!({"e": [1]}),
            &RetryPolicy::default(),
        )
        .unwrap();

        let row: PlainJson = plain_json::table
            .find(1)
            .select(PlainJson::as_select())
            .first(&mut db.conn())
            .unwrap();
        assert_eq!(version, 1);
        assert_eq!(
            (row.ext, row.version),
            (json!({"a": {"b": 1, "d": 3}, "e": [1]}), 2)
        );
    }

    crate::tests_on_both_drivers!(
        create_table;
        merges_in_one_statement,
    );
}
