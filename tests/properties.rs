//! Properties on random inputs: RFC 7396 merge laws, the one-statement merge of every
//! backend agreeing with the in-memory merge, ETags surviving their text, and the
//! conditional-header parser never panicking. `PROPTEST_CASES` raises the number of
//! cases (`scripts/properties.sh` runs a longer, time-bounded pass).

mod common;

use diesel::prelude::*;
use diesel_occ::merge_diff;
use proptest::prelude::*;
use serde_json::{Map, Value};

/// JSON strings: unicode (Cyrillic, emoji, combining marks), quotes, backslashes; no NUL,
/// which PostgreSQL's `jsonb` refuses to store.
fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 _\\-\"\\\\/ä€ключ🔑\u{301}]{0,8}"
}

/// JSON values without floats (backends may print 1.0 as 1) up to `depth` levels deep.
fn value(depth: u32, nulls: bool) -> BoxedStrategy<Value> {
    let scalar = prop_oneof![
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(Value::from),
        text().prop_map(Value::String),
    ];
    let leaf = if nulls {
        prop_oneof![4 => scalar, 1 => Just(Value::Null)].boxed()
    } else {
        scalar.boxed()
    };
    leaf.prop_recursive(depth, 24, 4, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::btree_map(text(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
    .boxed()
}

/// A JSON object (a document or a merge patch).
fn object(depth: u32, nulls: bool) -> impl Strategy<Value = Value> {
    prop::collection::btree_map(text(), value(depth, nulls), 0..5)
        .prop_map(|m| Value::Object(m.into_iter().collect()))
}

fn merged(document: &Value, patch: &Value) -> Value {
    let mut result = document.clone();
    json_patch::merge(&mut result, patch);
    result
}

proptest! {
    /// Merging a patch twice is merging it once.
    #[test]
    fn a_merge_is_idempotent(document in object(3, false), patch in object(3, true)) {
        let once = merged(&document, &patch);
        prop_assert_eq!(merged(&once, &patch), once);
    }

    /// The patch `merge_diff` computes turns the old document into the new one, and is
    /// `None` exactly when they are equal (documents without nulls: RFC 7396 cannot set one).
    #[test]
    fn merge_diff_reproduces_the_change(before in object(3, false), after in object(3, false)) {
        match merge_diff(&before, &after) {
            None => prop_assert_eq!(&before, &after),
            Some(patch) => prop_assert_eq!(merged(&before, &patch), after),
        }
    }

    /// An empty patch changes nothing.
    #[test]
    fn an_empty_patch_is_the_identity(document in object(3, true)) {
        prop_assert_eq!(merged(&document, &Value::Object(Map::new())), document);
    }
}

#[cfg(feature = "http")]
mod http_properties {
    use super::*;
    use diesel_occ::http::{EntityTag, Precondition};
    use diesel_occ::Token;
    use http::{HeaderMap, HeaderValue};

    fn token() -> impl Strategy<Value = Token> {
        prop_oneof![
            any::<i64>().prop_map(|v| Token::Version(v.into())),
            any::<u32>().prop_map(Token::RowVersion),
            "[0-9: .-]{0,26}".prop_map(Token::Timestamp),
            ".{0,40}".prop_map(Token::PreImage),
        ]
    }

    proptest! {
        /// Every token's ETag survives its header text and matches only its own token.
        #[test]
        fn every_token_survives_etag_text_and_if_match(token in token(), other in token()) {
            let tag = EntityTag::of(&token);
            let parsed: EntityTag = tag.to_string().parse().unwrap();
            prop_assert!(parsed.strong_eq(&tag));
            let mut headers = HeaderMap::new();
            headers.insert("if-match", tag.header_value());
            let precondition = Precondition::if_match(&headers).unwrap();
            prop_assert!(precondition.matches(Some(&token)));
            prop_assert_eq!(precondition.matches(Some(&other)), EntityTag::of(&other) == tag);
        }

        /// A list of tags written with any spacing and empty elements parses back to them.
        #[test]
        fn tag_lists_parse_whatever_the_spacing(
            tags in prop::collection::vec(("[!#-~]{0,12}", any::<bool>()), 1..5),
            spaces in prop::collection::vec("[ \t]{0,2},?[ \t]{0,2}", 5),
        ) {
            let tags: Vec<EntityTag> = tags
                .iter()
                .map(|(text, weak)| if *weak { EntityTag::weak(text) } else { EntityTag::strong(text) }.unwrap())
                .collect();
            let line = tags
                .iter()
                .enumerate()
                .map(|(i, t)| format!("{}{t}", spaces[i]))
                .collect::<Vec<_>>()
                .join(",");
            let mut headers = HeaderMap::new();
            headers.insert("if-match", HeaderValue::from_str(&line).unwrap());
            prop_assert_eq!(Precondition::if_match(&headers).unwrap(), Precondition::Tags(tags));
        }

        /// Any header value at all: a precondition or a 400-class error, never a panic.
        #[test]
        fn any_header_value_parses_or_is_refused(bytes in prop::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(value) = HeaderValue::from_bytes(&bytes) {
                let mut headers = HeaderMap::new();
                headers.insert("if-match", value.clone());
                headers.insert("if-none-match", value);
                let _ = Precondition::if_match(&headers);
                let _ = Precondition::if_none_match(&headers);
            }
        }
    }
}

for_each_backend! {
    use diesel_occ::GuardedJsonMerge;
    use diesel_occ::Guarded;

    json_profiles!();

    /// The backend's one-statement merge gives the in-memory merge's document for random
    /// documents and patches: nested, unicode, arrays, deletions.
    #[test]
    fn the_one_statement_merge_agrees_with_the_in_memory_merge() {
        let Some(db) = db() else { return };
        // proptest's closure is `Fn`: the connection and the row counter live in cells.
        let conn = std::cell::RefCell::new(db.conn());
        let next_id = std::cell::Cell::new(0_i64);
        // 48 cases in the test suite (each is three statements); PROPTEST_CASES for more.
        let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(48);
        let config = ProptestConfig { cases, ..ProptestConfig::default() };
        proptest!(config, |(document in object(3, false), patch in object(3, true))| {
            let id = next_id.get() + 1;
            next_id.set(id);
            let conn = &mut *conn.borrow_mut();
            let row = Profile { id, name: "p".into(), ext: document.clone(), version: 0 };
            diesel::insert_into(profiles::table).values(&row).execute(conn).unwrap();
            let version = Profile::merge_json_in_place(conn, &id, profiles::ext, &patch).unwrap();
            let stored: Profile = profiles::table.find(id).select(Profile::as_select()).first(conn).unwrap();
            prop_assert_eq!(version, 1);
            prop_assert_eq!(stored.ext, merged(&document, &patch), "{} merged with {}", document, patch);
        });
    }
}
