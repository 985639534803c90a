use diesel_occ::Guarded;

diesel::table! {
    orders (id) {
        id -> BigInt,
        version -> BigInt,
    }
}

#[derive(Debug, Clone, diesel::Queryable, diesel::Selectable, diesel::Identifiable, Guarded)]
#[diesel(table_name = orders)]
struct Order {
    id: i64,
    #[occ(version, status)]
    version: i64,
}

fn main() {}
