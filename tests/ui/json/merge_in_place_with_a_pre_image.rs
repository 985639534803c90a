use diesel::prelude::*;
use diesel_occ::GuardedJsonMerge;
use diesel_occ::Guarded;

diesel::table! {
    profiles (id) {
        id -> BigInt,
        ext -> Jsonb,
        name -> Text,
    }
}

#[derive(Debug, Clone, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = profiles)]
#[occ(pre_image)]
struct Profile {
    id: i64,
    #[occ(json)]
    ext: serde_json::Value,
    name: String,
}

fn merge(conn: &mut PgConnection) {
    let _ = Profile::merge_json_in_place(conn, &1, profiles::ext, &serde_json::json!({}));
}

fn main() {}
