use diesel::prelude::*;
use diesel_occ::{Guarded, GuardedWrite};

diesel::table! {
    orders (id) {
        id -> BigInt,
        note -> Text,
        version -> BigInt,
    }
}

#[derive(Debug, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = orders)]
struct Order {
    id: i64,
    note: String,
    #[occ(versoin)]
    version: i64,
}

// Calls of the write methods must not add errors of their own to the derive's.
fn edit(conn: &mut SqliteConnection, order: &Order) {
    let _ = order.guarded_update(conn, orders::note.eq("x"));
    let _ = order.guarded_delete(conn);
}

fn main() {}
