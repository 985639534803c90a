use diesel::prelude::*;
use diesel_occ::{no_extra, Guarded, GuardedTransition, Status};

diesel::table! {
    orders (id) {
        id -> BigInt,
        status -> Text,
        version -> BigInt,
    }
}

diesel::table! {
    payments (id) {
        id -> BigInt,
        settled -> Bool,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Status)]
enum Stage {
    Open,
    #[occ(from(Open))]
    Shipped,
}

#[derive(Debug, Clone, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = orders)]
struct Order {
    id: i64,
    #[occ(status)]
    status: Stage,
    #[occ(version)]
    version: i64,
}

// A transition's condition is on the row itself; another table's column is refused.
fn ship(conn: &mut SqliteConnection, order: &mut Order) {
    let _ = order.transition_when(conn, Stage::Shipped, no_extra(), payments::settled.eq(true));
}

fn main() {}
