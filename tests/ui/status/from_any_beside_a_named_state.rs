use diesel_occ::Status;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Status)]
enum Stage {
    Open,
    #[occ(from(Open))]
    Shipped,
    // `any` already includes `Open`.
    #[occ(from(any, Open))]
    Archived,
}

fn main() {}
