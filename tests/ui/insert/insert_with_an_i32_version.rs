use diesel_occ::{Guarded, GuardedWrite};

diesel::table! {
    orders (id) {
        id -> BigInt,
        note -> Text,
        version -> Integer,
    }
}

#[derive(Debug, Clone, diesel::Queryable, diesel::Selectable, diesel::Identifiable, diesel::Insertable, Guarded)]
#[diesel(table_name = orders)]
struct Order {
    id: i64,
    note: String,
    #[occ(version)]
    version: i32,
}

fn insert(conn: &mut diesel::SqliteConnection) {
    let mut order = Order { id: 1, note: "new".into(), version: 0 };
    let _ = order.guarded_insert(conn);
}

fn main() {}
