#[derive(Debug, Clone, Copy, PartialEq, Eq, diesel_occ::Status)]
enum OrderStatus {
    Valid,
    Shipped(u32),
}

fn main() {}
