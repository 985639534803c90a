#[derive(Debug, Clone, Copy, PartialEq, Eq, diesel_occ::Status)]
enum OrderStatus {
    Valid,
    #[occ(from(Valid, Pending))]
    Shipped,
}

fn main() {}
