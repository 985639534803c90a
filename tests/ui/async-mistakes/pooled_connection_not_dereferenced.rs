// A connection checked out of a pool is passed as `&mut conn`: the error says to pass
// `&mut *conn`.
use diesel_async::pooled_connection::bb8::Pool;
use diesel_async::AsyncPgConnection;
use diesel_occ::asynchronous::prelude::*;
use diesel_occ::{Error, Guarded};

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

async fn save(pool: &Pool<AsyncPgConnection>, order: &mut Order) -> Result<(), Error> {
    let mut conn = pool.get().await.unwrap();
    order.guarded_save(&mut conn).await?;
    Ok(())
}

fn main() {}
