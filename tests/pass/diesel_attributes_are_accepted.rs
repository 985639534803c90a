//! The struct attributes of diesel's own guide and derive docs, next to `Guarded`:
//! everything diesel accepts, the derive accepts, reading what concerns the guard.

use diesel::prelude::*;
use diesel_occ::Guarded;

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

#[derive(Debug, Clone, Queryable, Selectable, Identifiable, Associations, Guarded)]
#[diesel(belongs_to(User, foreign_key = user_id))]
#[diesel(table_name = posts)]
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

fn main() {
    let _ = <Post as diesel::associations::HasTable>::table();
}
