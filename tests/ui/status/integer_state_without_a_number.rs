#[derive(Debug, Clone, Copy, PartialEq, Eq, diesel_occ::Status)]
#[occ(storage = "integer")]
enum TaskState {
    Open = 1,
    #[occ(from(Open))]
    Done,
}

fn main() {}
