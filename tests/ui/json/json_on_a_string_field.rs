use diesel_occ::Guarded;

diesel::table! {
    profiles (id) {
        id -> BigInt,
        ext -> Text,
        version -> BigInt,
    }
}

#[derive(Debug, Clone, diesel::Queryable, diesel::Selectable, diesel::Identifiable, Guarded)]
#[diesel(table_name = profiles)]
struct Profile {
    id: i64,
    #[occ(json)]
    ext: String,
    #[occ(version)]
    version: i64,
}

fn main() {}
