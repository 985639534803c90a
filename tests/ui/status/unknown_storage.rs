#[derive(Debug, Clone, Copy, PartialEq, Eq, diesel_occ::Status)]
#[occ(storage = "enum")]
enum OrderStatus {
    Valid,
}

fn main() {}
