use diesel_occ::{Guarded, GuardedWrite};

diesel::table! {
    docs (id) {
        id -> BigInt,
        body -> Text,
        checksum -> Double,
    }
}

// A float compares inexactly: it cannot be a token the database maintains.
#[derive(Debug, Clone, PartialEq, diesel::Queryable, diesel::Selectable, diesel::Identifiable, Guarded)]
#[diesel(table_name = docs)]
struct Doc {
    id: i64,
    body: String,
    #[occ(row_version)]
    checksum: f64,
}

fn save(conn: &mut diesel::SqliteConnection, doc: &mut Doc) {
    let _ = doc.guarded_save(conn);
}

fn main() {}
