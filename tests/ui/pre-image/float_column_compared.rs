use diesel_occ::Guarded;

diesel::table! {
    readings (id) {
        id -> BigInt,
        celsius -> Double,
    }
}

#[derive(Debug, diesel::Queryable, diesel::Selectable, diesel::Identifiable, Guarded)]
#[diesel(table_name = readings)]
#[occ(pre_image)]
struct Reading {
    id: i64,
    celsius: f64,
}

fn main() {}
