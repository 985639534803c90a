use diesel::prelude::*;
use diesel_occ::{Guarded, GuardedWrite};

diesel::table! {
    orders (id) {
        id -> BigInt,
        status -> Text,
    }
}

#[derive(Debug, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = orders)]
struct Order {
    id: i64,
    #[occ(compare)]
    status: String,
}

fn ship(conn: &mut SqliteConnection, mut order: Order) {
    order.status = "shipped".into();
    let _ = order.guarded_save(conn);
}

fn main() {}
