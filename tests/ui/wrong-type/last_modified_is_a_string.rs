use diesel_occ::Guarded;

diesel::table! {
    orders (id) {
        id -> BigInt,
        updated_at -> Text,
    }
}

#[derive(Debug, diesel::Queryable, diesel::Selectable, diesel::Identifiable, Guarded)]
#[diesel(table_name = orders)]
struct Order {
    id: i64,
    #[occ(last_modified)]
    updated_at: String,
}

fn main() {}
