use diesel_occ::Guarded;

diesel::table! {
    orders (id) {
        id -> BigInt,
        note -> Text,
        version -> BigInt,
    }
}

#[derive(Guarded)]
enum Order {
    Open,
    Closed,
}

fn main() {}
