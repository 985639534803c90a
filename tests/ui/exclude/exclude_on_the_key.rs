use diesel_occ::Guarded;

diesel::table! {
    orders (id) {
        id -> BigInt,
        views -> BigInt,
        version -> BigInt,
    }
}

#[derive(Debug, diesel::Queryable, diesel::Selectable, diesel::Identifiable, Guarded)]
#[diesel(table_name = orders)]
struct Order {
    #[occ(exclude)]
    id: i64,
    views: i64,
    #[occ(version)]
    version: i64,
}

fn main() {}
