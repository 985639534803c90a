use diesel_occ::Guarded;

diesel::table! {
    orders (id) {
        id -> BigInt,
        quantity -> Integer,
        version -> BigInt,
    }
}

#[derive(Debug)]
pub struct Quantity(i32);

impl From<i32> for Quantity {
    fn from(q: i32) -> Self {
        Quantity(q)
    }
}

#[derive(Debug, diesel::Queryable, diesel::Selectable, diesel::Identifiable, Guarded)]
#[diesel(table_name = orders)]
struct Order {
    id: i64,
    #[diesel(deserialize_as = i32)]
    quantity: Quantity,
    #[occ(version)]
    version: i64,
}

fn main() {}
