// The blocking prelude imported in async code: the blocking `guarded_save` is found, and
// the error says to import the async one.
use diesel_occ::prelude::*;

diesel::table! {
    orders (id) {
        id -> BigInt,
        note -> Text,
        version -> BigInt,
    }
}

#[derive(Debug, Clone, diesel::Queryable, diesel::Selectable, diesel::Identifiable, Guarded)]
#[diesel(table_name = orders)]
struct Order {
    id: i64,
    note: String,
    #[occ(version)]
    version: i64,
}

async fn save(conn: &mut diesel_async::AsyncPgConnection, order: &mut Order) -> Result<(), Error> {
    order.guarded_save(conn).await?;
    Ok(())
}

fn main() {}
