use diesel_occ::{Guarded, GuardedWrite};

diesel::table! {
    orders (id) {
        id -> BigInt,
        note -> Text,
    }
}

#[derive(Debug, Clone, PartialEq, diesel::Queryable, diesel::Selectable, diesel::Identifiable, diesel::Insertable, Guarded)]
#[diesel(table_name = orders)]
#[occ(pre_image)]
struct Order {
    id: i64,
    note: String,
}

// A pre-image copy cannot prove itself once modified: an upsert would save it.
fn upsert(conn: &mut diesel::SqliteConnection) {
    let mut order = Order { id: 1, note: "new".into() };
    let _ = order.guarded_upsert(conn);
}

fn main() {}
