use diesel_occ::{Guarded, GuardedWrite};

diesel::table! {
    orders (id) {
        id -> BigInt,
        note -> Text,
        version -> BigInt,
    }
}

#[derive(Debug, Clone, PartialEq, diesel::Queryable, diesel::Selectable, diesel::Identifiable, Guarded)]
#[diesel(table_name = orders)]
struct Order {
    id: i64,
    note: String,
    #[occ(version)]
    version: i64,
}

// No `#[occ(updated_at)]` field: nothing for a maintenance touch to set.
fn touch(conn: &mut diesel::SqliteConnection, order: &mut Order) {
    let _ = order.touch_updated_at(conn);
}

fn main() {}
