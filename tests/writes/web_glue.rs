//! What a web back end calls, on both drivers and every backend: the load by key that
//! answers a missing row with `NotFound` naming table and key, JSON edits pinned to a
//! request's `If-Match`, and whole-row writes (save, insert, upsert) that never store a
//! JSON document that is not an object.

#![cfg(feature = "http")]

use crate::common;

use common::drivers::{race, EditJsonIfMatch, Find, Insert, Modify, Save, Upsert};
use diesel::prelude::*;
use diesel_occ::http::{EntityTag, HttpError, Precondition};
use diesel_occ::{Error, RetryPolicy, Token};
use serde_json::{json, Value};

for_each_backend! {
    json_profiles!();

    type Db = common::TestDb<Conn>;
    type Pooled = diesel_occ::Pooled<Conn>;

    fn insert(conn: &mut Pooled, id: i64, ext: Value) -> Profile {
        let row = Profile { id, name: "ada".into(), ext, version: 0 };
        diesel::insert_into(profiles::table).values(&row).execute(conn).unwrap();
        row
    }

    fn stored(conn: &mut Pooled, id: i64) -> Option<Profile> {
        profiles::table.find(id).select(Profile::as_select()).first(conn).optional().unwrap()
    }

    /// `If-Match` naming the tags of `rows`, as a client that read them sends it.
    fn if_match(rows: &[&Profile]) -> Precondition {
        Precondition::Tags(rows.iter().map(|row| EntityTag::of_row(*row)).collect())
    }

    fn operations(value: Value) -> json_patch::Patch {
        serde_json::from_value(value).unwrap()
    }

    /// The refusal of a write pinned to a stale tag: 412 naming the row's current tag.
    fn assert_stale(answer: Result<impl std::fmt::Debug, Error>, current: &Profile) {
        match answer {
            Err(Error::Precondition(HttpError::PreconditionFailed { current: Some(tag) })) => {
                assert_eq!(tag, EntityTag::of_row(current), "the refusal names the current tag")
            }
            other => panic!("expected 412 with the current tag: {other:?}"),
        }
    }

    /// The load a handler makes: the row, or `NotFound` naming table and key (a 404), never
    /// diesel's bare `NotFound`.
    fn a_load_by_key_finds_the_row_or_names_table_and_key<W: Find<Profile>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        insert(conn, 1, json!({"a": 1}));
        assert_eq!(w().find(&1).unwrap(), stored(conn, 1).unwrap());
        match w().find(&7) {
            Err(Error::NotFound { table: "profiles", key }) => assert_eq!(key, "7"),
            other => panic!("{other:?}"),
        }
    }

    /// A merge or a JSON Patch pinned to `If-Match` applies only while the row's tag is
    /// one of the tags sent; a stale tag is 412 naming the current one, nothing written; `*`
    /// takes any existing row, an absent header the latest; a missing row is `NotFound`.
    fn a_pinned_edit_applies_only_to_the_tagged_version<W: EditJsonIfMatch<Profile, profiles::ext>>(db: &Db, w: impl Fn() -> W) {
        let (conn, policy) = (&mut db.conn(), RetryPolicy::default());
        let first = insert(conn, 1, json!({"a": 1}));
        let other = EntityTag::of(&Token::Version(99));

        let mut sent = if_match(&[&first]);
        if let Precondition::Tags(tags) = &mut sent {
            tags.insert(0, other.clone());
        }
        let second = w().merge_json_if_match(&1, profiles::ext, &json!({"b": 2}), &sent, &policy).unwrap().row;
        assert_eq!(second.ext, json!({"a": 1, "b": 2}));
        assert_eq!(stored(conn, 1).unwrap(), second, "the row as answered is the row stored");

        assert_stale(w().merge_json_if_match(&1, profiles::ext, &json!({"c": 3}), &if_match(&[&first]), &policy), &second);
        let add = operations(json!([{"op": "add", "path": "/c", "value": 3}]));
        assert_stale(w().patch_json_if_match(&1, profiles::ext, &add, &if_match(&[&first]), &policy), &second);
        assert_eq!(stored(conn, 1).unwrap(), second, "a stale tag writes nothing");

        // A weak tag never matches for a write (RFC 9110's strong comparison).
        let weak: EntityTag = format!("W/{}", EntityTag::of_row(&second)).parse().unwrap();
        assert_stale(w().merge_json_if_match(&1, profiles::ext, &json!({"c": 3}), &Precondition::Tags(vec![weak]), &policy), &second);

        let third = w().patch_json_if_match(&1, profiles::ext, &add, &if_match(&[&second]), &policy).unwrap().row;
        assert_eq!(third.ext, json!({"a": 1, "b": 2, "c": 3}));
        let fourth = w().merge_json_if_match(&1, profiles::ext, &json!({"d": 4}), &Precondition::Any, &policy).unwrap().row;
        let fifth = w().merge_json_if_match(&1, profiles::ext, &json!({"a": null}), &Precondition::Absent, &policy).unwrap().row;
        assert!(third.version < fourth.version && fourth.version < fifth.version);
        assert_eq!(stored(conn, 1).unwrap().ext, json!({"b": 2, "c": 3, "d": 4}));

        // A PATCH does not create the row: 404 whatever the header (RFC 9110, 13.2.1).
        for pinned in [Precondition::Any, if_match(&[&fifth]), Precondition::Absent] {
            match w().merge_json_if_match(&9, profiles::ext, &json!({"a": 1}), &pinned, &policy) {
                Err(Error::NotFound { table: "profiles", .. }) => {}
                other => panic!("a missing row under {pinned:?}: {other:?}"),
            }
        }
        // A merge patch that is not an object would replace the document: refused.
        match w().merge_json_if_match(&1, profiles::ext, &json!([1]), &if_match(&[&fifth]), &policy) {
            Err(Error::InvalidPatch { table: "profiles", column: "ext", .. }) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(stored(conn, 1).unwrap(), fifth);
    }

    /// Eight writers pinned to the same tag at once: exactly one lands; each other one is
    /// 412 naming the winner's tag (a row that moved on between its read and its write is
    /// not merged into), at once: under a policy of a single attempt none of them is a
    /// conflict or runs out of retries. The stored document is the winner's.
    fn writers_pinned_to_one_tag_have_one_winner<W: EditJsonIfMatch<Profile, profiles::ext>>(db: &Db, w: impl Fn() -> W + Sync) {
        let first = insert(&mut db.conn(), 1, json!({}));
        let sent = if_match(&[&first]);
        let once = RetryPolicy::default().max_attempts(1);
        let answers = race(8, w, |i, w| {
            let patch = json!({ format!("w{i}"): i });
            (i, w.merge_json_if_match(&1, profiles::ext, &patch, &sent, &once))
        });
        let winners: Vec<_> = answers.iter().filter(|(_, answer)| answer.is_ok()).collect();
        assert_eq!(winners.len(), 1, "{answers:?}");
        let (winner, won) = winners[0];
        let won = &won.as_ref().unwrap().row;
        assert_eq!(won.ext, json!({ format!("w{winner}"): winner }));
        for (_, answer) in answers.iter().filter(|(i, _)| i != winner) {
            match answer {
                Err(Error::Precondition(HttpError::PreconditionFailed { current: Some(tag) })) => {
                    assert_eq!(tag, &EntityTag::of_row(won))
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(stored(&mut db.conn(), 1).unwrap(), *won);
    }

    /// A save, a modify, an upsert or an insert of a copy whose JSON document is not an
    /// object is refused before it is sent, naming table, key and column: stored, it would
    /// make every later JSON edit of the row fail.
    fn whole_row_writes_keep_the_document_an_object<W: Save<Profile> + Insert<Profile> + Upsert<Profile> + Modify<Profile, (), Error>>(db: &Db, w: impl Fn() -> W) {
        let conn = &mut db.conn();
        let before = insert(conn, 1, json!({"a": 1}));
        for bad in [json!([1]), json!("text"), json!(42), Value::Null] {
            let mut copy = Profile { ext: bad.clone(), ..before.clone() };
            let mut new = Profile { id: 2, ext: bad.clone(), ..before.clone() };
            let into_ext = bad.clone();
            let answers = [
                w().save(&mut copy).map(drop),
                w().upsert(&mut copy).map(drop),
                w().insert(&mut new).map(drop),
                w().upsert(&mut new).map(drop),
                w().modify(&1, &RetryPolicy::default(), move |row: &mut Profile| {
                    row.ext = into_ext.clone();
                    Ok(())
                })
                .map(drop),
            ];
            for answer in answers {
                match answer {
                    Err(Error::InvalidPatch { table: "profiles", column: "ext", key, reason }) => {
                        assert!(key == "1" || key == "2", "{key}");
                        assert!(reason.contains("object"), "{reason}");
                    }
                    other => panic!("{bad:.40}: {other:?}"),
                }
            }
        }
        assert_eq!(stored(conn, 1).unwrap(), before, "nothing written");
        assert_eq!(stored(conn, 2), None, "nothing inserted");

        // A document over the edits' size limit is the caller's to store: a save of the
        // row, which may leave it as it was, is not refused for it.
        let huge = json!({"blob": "x".repeat(diesel_occ::DOCUMENT_LIMIT_BYTES)});
        let mut good = Profile { ext: huge, ..before.clone() };
        w().save(&mut good).unwrap();
        assert_eq!(stored(conn, 1).unwrap(), good);
    }

    crate::tests_on_both_drivers!(
        |_: &Db| ();
        a_load_by_key_finds_the_row_or_names_table_and_key,
        a_pinned_edit_applies_only_to_the_tagged_version,
        writers_pinned_to_one_tag_have_one_winner,
        whole_row_writes_keep_the_document_an_object,
    );
}
