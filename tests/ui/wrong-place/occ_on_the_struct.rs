use diesel_occ::Guarded;

diesel::table! {
    orders (id) {
        id -> BigInt,
        note -> Text,
        version -> BigInt,
    }
}

#[derive(Debug, diesel::Queryable, diesel::Selectable, diesel::Identifiable, Guarded)]
#[diesel(table_name = orders)]
#[occ(version)]
struct Order {
    id: i64,
    note: String,
    version: i64,
}

fn main() {}
