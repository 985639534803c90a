use diesel::prelude::*;
use diesel_occ::{Guarded, GuardedWrite};

diesel::table! {
    use diesel::sql_types::*;
    use diesel_occ::xmin::Xid;

    items (id) {
        id -> BigInt,
        note -> Text,
        xmin -> Xid,
    }
}

#[derive(Debug, Queryable, Selectable, Identifiable, Guarded)]
#[diesel(table_name = items)]
struct Item {
    id: i64,
    note: String,
    #[occ(xmin)]
    xmin: u32,
}

fn edit(conn: &mut SqliteConnection, item: &Item) {
    let _ = item.guarded_update(conn, items::note.eq("x"));
}

fn main() {}
