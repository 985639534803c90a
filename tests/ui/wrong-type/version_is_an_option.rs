use diesel_occ::Guarded;

diesel::table! {
    orders (id) {
        id -> BigInt,
        version -> Nullable<BigInt>,
    }
}

#[derive(Debug, diesel::Queryable, diesel::Selectable, diesel::Identifiable, Guarded)]
#[diesel(table_name = orders)]
struct Order {
    id: i64,
    #[occ(version)]
    version: Option<i64>,
}

fn main() {}
