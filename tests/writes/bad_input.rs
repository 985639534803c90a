//! Bad input the other test files do not already cover (the guide's failures chapter, "Bad input"): NUL bytes,
//! unicode and SQL metacharacters in JSON keys and values, on every backend. Each body
//! runs on both drivers (the blocking API and the async one).

use crate::common;

use common::drivers::{EditJsonColumn, MergeJsonInPlace};
use diesel::prelude::*;
use diesel_occ::{Error, RetryPolicy};
use serde_json::json;

for_each_backend! {
    json_profiles!();

    type Db = common::TestDb<Conn>;

    fn load(conn: &mut diesel_occ::Pooled<Conn>) -> Profile {
        profiles::table.find(1).select(Profile::as_select()).first(conn).unwrap()
    }

    /// Unicode and SQL metacharacters in keys and values are data, stored exactly by both
    /// merge paths.
    fn unicode_and_sql_metacharacters_in_json_are_stored_exactly<W>(db: &Db, w: impl Fn() -> W)
    where
        W: EditJsonColumn<Profile, profiles::ext> + MergeJsonInPlace<Profile, profiles::ext>,
    {
        let conn = &mut db.conn();
        let w = &mut w();
        let row = Profile { id: 1, name: "p".into(), ext: json!({}), version: 0 };
        diesel::insert_into(profiles::table).values(&row).execute(conn).unwrap();
        let odd = json!({
            "'; DROP TABLE profiles; --": "x' OR '1'='1",
            "ключ 🔑 e\u{301}": {"$.a[0]": "\\\"quoted\\\""},
            "%_\\": ["a", {"b": "c"}],
        });
        w.merge_json(&1, profiles::ext, &odd, &RetryPolicy::default()).unwrap();
        assert_eq!(load(conn).ext, odd);
        let more = json!({"ключ 🔑 e\u{301}": {"$.a[0]": null, "новый": 1}});
        w.merge_json_in_place(&1, profiles::ext, &more).unwrap();
        let mut expected = odd.clone();
        json_patch::merge(&mut expected, &more);
        assert_eq!(load(conn).ext, expected);
    }

    /// A NUL byte in a JSON key or string: SQLite and MySQL store it; PostgreSQL's `jsonb`
    /// cannot hold one and refuses the statement. Either way the answer is clear and a
    /// refused write writes nothing.
    fn a_nul_byte_in_json_is_stored_or_refused_never_half_written<W>(db: &Db, w: impl Fn() -> W)
    where
        W: EditJsonColumn<Profile, profiles::ext> + MergeJsonInPlace<Profile, profiles::ext>,
    {
        let conn = &mut db.conn();
        let w = &mut w();
        let row = Profile { id: 1, name: "p".into(), ext: json!({"keep": 1}), version: 0 };
        diesel::insert_into(profiles::table).values(&row).execute(conn).unwrap();
        for patch in [json!({"nul\u{0}key": 1}), json!({"k": "nul\u{0}value"})] {
            let before = load(conn);
            let rmw = w.merge_json(&1, profiles::ext, &patch, &RetryPolicy::default());
            let one = w.merge_json_in_place(&1, profiles::ext, &patch);
            if BACKEND == "postgres" {
                for result in [rmw.map(drop), one.map(drop)] {
                    match result {
                        Err(Error::Database(e)) => assert!(e.to_string().contains("Unicode escape"), "{e}"),
                        Err(Error::InvalidPatch { .. }) => {}
                        other => panic!("{other:?}"),
                    }
                }
                assert_eq!(load(conn), before, "nothing written");
            } else {
                rmw.unwrap();
                one.unwrap();
                let mut expected = before.ext.clone();
                json_patch::merge(&mut expected, &patch);
                assert_eq!(load(conn).ext, expected);
            }
        }
    }

    tests_on_both_drivers!(
        |_: &Db| ();
        unicode_and_sql_metacharacters_in_json_are_stored_exactly,
        a_nul_byte_in_json_is_stored_or_refused_never_half_written,
    );
}
