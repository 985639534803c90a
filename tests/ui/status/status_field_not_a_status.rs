use diesel_occ::Guarded;

diesel::table! {
    orders (id) {
        id -> BigInt,
        status -> Text,
        version -> BigInt,
    }
}

#[derive(Debug, Clone, diesel::Queryable, diesel::Selectable, diesel::Identifiable, Guarded)]
#[diesel(table_name = orders)]
struct Order {
    id: i64,
    #[occ(status)]
    status: String,
    #[occ(version)]
    version: i64,
}

fn main() {}
