use diesel_occ::Guarded;

diesel::table! {
    orders (id) {
        id -> BigInt,
        status -> Text,
    }
}

#[derive(Debug, diesel::Queryable, diesel::Selectable, diesel::Identifiable, Guarded)]
#[diesel(table_name = orders)]
struct Order {
    #[occ(compare)]
    id: i64,
    #[occ(compare)]
    status: String,
}

fn main() {}
