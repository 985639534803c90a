#[derive(Debug, Clone, Copy, PartialEq, Eq, diesel_occ::Status)]
#[occ(storage = "integer")]
enum TaskState {
    #[occ(rename = "open")]
    Open = 1,
}

fn main() {}
