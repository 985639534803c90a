#[derive(Debug, Clone, Copy, PartialEq, Eq, diesel_occ::Status)]
enum OrderStatus {
    Cancelled,
    #[occ(rename = "cancelled")]
    Canceled,
}

fn main() {}
