use diesel_occ::Guarded;

diesel::table! {
    orders (id) {
        id -> BigInt,
        changed_at -> Timestamp,
        updated_at -> Timestamp,
    }
}

#[derive(Debug, diesel::Queryable, diesel::Selectable, diesel::Identifiable, Guarded)]
#[diesel(table_name = orders)]
struct Order {
    id: i64,
    #[occ(last_modified)]
    changed_at: chrono::NaiveDateTime,
    #[occ(updated_at)]
    updated_at: chrono::NaiveDateTime,
}

fn main() {}
