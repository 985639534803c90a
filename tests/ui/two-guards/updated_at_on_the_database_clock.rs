use diesel_occ::Guarded;

diesel::table! {
    orders (id) {
        id -> BigInt,
        version -> BigInt,
        updated_at -> Timestamp,
    }
}

#[derive(Debug, diesel::Queryable, diesel::Selectable, diesel::Identifiable, Guarded)]
#[diesel(table_name = orders)]
struct Order {
    id: i64,
    #[occ(version)]
    version: i64,
    #[occ(updated_at(clock = database))]
    updated_at: chrono::NaiveDateTime,
}

fn main() {}
