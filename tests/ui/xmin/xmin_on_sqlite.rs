use diesel::prelude::*;
use diesel_occ::{Guarded, LoadByKey};

diesel::table! {
    use diesel::sql_types::*;
    use diesel_occ::Xid;

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

// Every guarded call first reads or writes through `LoadByKey`, which the derive
// implements for PostgreSQL connections alone when the token is `xmin`. (A call such as
// `guarded_update` reports that first, then a long tail of follow-up errors whose wording
// varies between builds, so this case stops at the first.)
fn edit(conn: &mut SqliteConnection, item: &Item) {
    let _ = Item::load_by_key(conn, &item.id);
}

fn main() {}
