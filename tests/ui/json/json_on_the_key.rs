use diesel_occ::Guarded;

diesel::table! {
    profiles (id) {
        id -> BigInt,
        version -> BigInt,
    }
}

#[derive(Debug, Clone, diesel::Queryable, diesel::Selectable, diesel::Identifiable, Guarded)]
#[diesel(table_name = profiles)]
struct Profile {
    #[occ(json)]
    id: i64,
    #[occ(version)]
    version: i64,
}

fn main() {}
