//! The struct attributes of diesel's own guide and derive docs, next to `Guarded`:
//! everything diesel accepts, the derive accepts, reading what concerns the guard, and
//! the guarded writes then use the names and types those attributes give.
//! (Kept out of the compile-fail suite: a case that must compile there makes it build
//! every case one by one.) SQLite's: the entities check their fields against it.
#![cfg(feature = "sqlite")]

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_occ::{Guarded, GuardedWrite};

diesel::table! {
    users (id) {
        id -> Integer,
        name -> Text,
        version -> BigInt,
    }
}

diesel::table! {
    #[sql_name = "legacy_posts"]
    posts (id) {
        id -> Integer,
        user_id -> Integer,
        title -> Text,
        #[sql_name = "type"]
        kind -> Nullable<Text>,
        rev -> Integer,
    }
}

diesel::joinable!(posts -> users (user_id));
diesel::allow_tables_to_appear_in_same_query!(users, posts);

#[derive(Debug, Clone, Queryable, Selectable, Identifiable, AsChangeset, Guarded)]
#[diesel(table_name = users, check_for_backend(diesel::sqlite::Sqlite))]
#[diesel(treat_none_as_null = true)]
pub struct User {
    pub id: i32,
    pub name: String,
    #[occ(version)]
    #[diesel(skip_update)]
    pub version: Revision,
}

/// A type alias of the version type.
pub type Revision = i64;

#[derive(Debug, Clone, PartialEq)]
pub struct Title(String);

impl From<String> for Title {
    fn from(s: String) -> Self {
        Title(s)
    }
}

impl From<Title> for String {
    fn from(t: Title) -> Self {
        t.0
    }
}

#[derive(Debug, Clone, Queryable, Selectable, Identifiable, Associations, AsChangeset, Guarded)]
#[diesel(belongs_to(User, foreign_key = user_id))]
#[diesel(table_name = posts, treat_none_as_null = true)]
#[diesel(primary_key(id), check_for_backend(diesel::sqlite::Sqlite))]
pub struct Post {
    #[diesel(column_name = "id")]
    pub id: i32,
    pub user_id: i32,
    #[diesel(serialize_as = String, deserialize_as = String)]
    pub title: Title,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub kind: Option<String>,
    #[occ(version)]
    #[diesel(column_name = rev)]
    pub revision: i32,
}

#[test]
fn guarded_writes_use_the_names_and_types_diesel_s_attributes_give() {
    let conn = &mut SqliteConnection::establish(":memory:").unwrap();
    conn.batch_execute(
        "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT NOT NULL, version BIGINT NOT NULL); \
         CREATE TABLE legacy_posts (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL, \
           title TEXT NOT NULL, type TEXT, rev INTEGER NOT NULL); \
         INSERT INTO users VALUES (1, 'ada', 0); \
         INSERT INTO legacy_posts VALUES (7, 1, 'draft', NULL, 0);",
    )
    .unwrap();

    // `skip_update` on the version is accepted: the guard sets the version itself.
    let mut user: User = users::table.find(1).first(conn).unwrap();
    let mut stale = user.clone();
    user.name = "ada l.".into();
    assert_eq!(user.guarded_save(conn).unwrap(), 1);
    assert_eq!(user.version, 1, "the saved copy carries its new version");
    let stored: User = users::table.find(1).first(conn).unwrap();
    assert_eq!((stored.name.as_str(), stored.version), ("ada l.", 1));
    let refused = stale.guarded_save(conn).unwrap_err();
    assert!(refused.as_conflict().is_some(), "{refused:?}");

    // The version is the column `rev` of the table `legacy_posts`; the title is read
    // through `deserialize_as`.
    let post: Post = Post::belonging_to(&stored)
        .select(Post::as_select())
        .first(conn)
        .unwrap();
    assert_eq!(
        (post.title.clone(), post.revision),
        (Title("draft".into()), 0)
    );
    assert_eq!(
        post.guarded_update(conn, posts::kind.eq(Some("essay")))
            .unwrap(),
        1
    );
    let conflict = post
        .guarded_update(conn, posts::title.eq("late"))
        .unwrap_err();
    let conflict = conflict
        .as_conflict()
        .unwrap_or_else(|| panic!("{conflict:?}"));
    assert_eq!(conflict.table, "legacy_posts");
    let stored: (Option<String>, i32) = posts::table
        .find(7)
        .select((posts::kind, posts::rev))
        .first(conn)
        .unwrap();
    assert_eq!(stored, (Some("essay".into()), 1));

    // A save writes the title through `serialize_as`, and a `None` as NULL
    // (`treat_none_as_null`).
    let mut post: Post = posts::table
        .find(7)
        .select(Post::as_select())
        .first(conn)
        .unwrap();
    post.title = Title("final".into());
    post.kind = None;
    assert_eq!(post.guarded_save(conn).unwrap(), 2);
    let stored: (String, Option<String>, i32) = posts::table
        .find(7)
        .select((posts::title, posts::kind, posts::rev))
        .first(conn)
        .unwrap();
    assert_eq!(stored, ("final".into(), None, 2));
}
