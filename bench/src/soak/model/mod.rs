//! The sequential models every key's history is judged against, one per kind of key: a
//! data row ([`row`]), an order of the claim queue ([`order`]) and a lock with the row
//! its fences protect ([`fenced_mutex`]). Each operation of the soak is one [`Op`] and
//! each answer one [`Ret`]; the checker asks whether some order of a key's calls,
//! consistent with real time, explains every answer the library gave.

pub mod fenced_mutex;
pub mod order;
pub mod row;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use stateright::semantics::SequentialSpec;

pub use fenced_mutex::FencedMutex;
pub use order::{Ghosts, OrderModel};
pub use row::VersionedRow;

/// The version of a row inserted by a call whose answer never came: the library seeds
/// each insert's version itself, so the model learns it from the first answer that shows
/// the row.
pub const UNKNOWN_SEED: i64 = i64::MIN;

/// A data row as the model and the answers see it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Row {
    pub version: i64,
    pub value: i64,
    pub doc: BTreeMap<String, i64>,
}

/// An order as the model and the answers see it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Order {
    pub status: String,
    pub owner: Option<String>,
    pub amount: i64,
    pub version: i64,
}

/// What a worker asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Read the row by key.
    Load,
    /// Insert the row with `value` and an empty document.
    Insert { value: i64 },
    /// A guarded update of `value` from a copy read at `expected` (`guarded_update`, or
    /// `guarded_save` when `save`).
    Update {
        expected: i64,
        value: i64,
        save: bool,
    },
    /// A guarded delete from a copy read at `expected`.
    Delete { expected: i64 },
    /// `guarded_upsert` of a copy read at `expected` (`None`: a new one) with `value` and
    /// an empty document: saved over its row while the row holds the copy's version,
    /// inserted where no row has the key.
    Upsert { expected: Option<i64>, value: i64 },
    /// Read-modify-write with retries: `value += add`.
    Add { add: i64 },
    /// A JSON merge of `{field: number}` (read-merge-write, or the one-statement merge when
    /// `in_place`).
    Merge {
        field: String,
        number: i64,
        in_place: bool,
    },

    /// Insert the order, `placed`, for `amount`.
    Place { amount: i64 },
    /// Ship it by key, only while `amount < 500` (a transition with a condition).
    Ship,
    /// Cancel it by key (a transition without one).
    Cancel,
    /// Claim up to two placed orders of the whole queue for `owner`. Recorded on key 0,
    /// which no checker judges: each order it hands out is recorded as [`Op::Claimed`] on
    /// the order's own key, from the claim's start to its answer.
    Claim { owner: String },
    /// A claim handed this order to `owner`.
    Claimed { owner: String },
    /// `owner` extends its claim (a heartbeat).
    Heartbeat { owner: String },
    /// `owner` ends its claim: packing to shipped.
    Finish { owner: String },
    /// Read the order by key.
    LoadOrder,

    /// Try to take the lock.
    Acquire,
    /// Extend the lease taken with `fence`.
    Renew { fence: i64 },
    /// Free the lock taken with `fence`.
    Release { fence: i64 },
    /// Write `value` to the protected row under `fence`.
    FencedWrite { fence: i64, value: i64 },
    /// Ask a lease taken with `fence` whether it is still held (no round trip: its
    /// keep-alive's belief).
    Check { fence: i64 },
    /// Write `value` to the protected row under `fence`, through the lease taken with it:
    /// committed only while it is held.
    WriteWhileHeld { fence: i64, value: i64 },
    /// Stop the lease taken with `fence` and free the lock.
    ReleaseLease { fence: i64 },
    /// Read the protected row.
    ReadFenced,
}

/// The kinds of key, each judged against its own model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Row,
    Order,
    Lock,
}

impl Op {
    /// The kind of key this operation addresses.
    pub fn kind(&self) -> Kind {
        match self {
            Op::Load
            | Op::Insert { .. }
            | Op::Update { .. }
            | Op::Delete { .. }
            | Op::Upsert { .. }
            | Op::Add { .. }
            | Op::Merge { .. } => Kind::Row,
            Op::Place { .. }
            | Op::Ship
            | Op::Cancel
            | Op::Claim { .. }
            | Op::Claimed { .. }
            | Op::Heartbeat { .. }
            | Op::Finish { .. }
            | Op::LoadOrder => Kind::Order,
            Op::Acquire
            | Op::Renew { .. }
            | Op::Release { .. }
            | Op::FencedWrite { .. }
            | Op::Check { .. }
            | Op::WriteWhileHeld { .. }
            | Op::ReleaseLease { .. }
            | Op::ReadFenced => Kind::Lock,
        }
    }
}

/// What the library answered, when it answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ret", rename_all = "snake_case")]
pub enum Ret {
    /// A load: the row, or none.
    Loaded { row: Option<Row> },
    /// A write that landed, with the token it handed back (`None` for a delete).
    Written { version: Option<i64> },
    /// An add that landed: the row's new version and value.
    Added { version: i64, value: i64 },
    /// An upsert that landed: whether it inserted the row, and the row's version.
    Upserted { inserted: bool, version: i64 },
    /// A guarded write refused: the row the library reported as current.
    Conflict { current: Row },
    /// The row is missing.
    NotFound,
    /// An insert found the key taken.
    AlreadyExists,
    /// An answer that says nothing was written (a retryable error, retries exhausted,
    /// no connection from the pool): no effect on the row.
    NothingWritten,

    /// A transition, a claim's heartbeat: the order's new version.
    Moved { version: i64 },
    /// A transition refused: the order is in `status`, which does not allow it.
    Invalid { status: String },
    /// A transition refused: the order's state allows it, its condition does not.
    Unmet,
    /// A claim handed out the order at this version.
    Taken { version: i64 },
    /// A claim's answer (key 0): the orders it handed out.
    Claims { taken: Vec<i64> },
    /// A heartbeat or finish of a claim the owner no longer holds.
    ClaimLost,
    /// A finish or a fenced write that landed.
    Done,
    /// An order as read.
    OrderRead { order: Option<Order> },

    /// The lock was granted with this fence.
    Granted { fence: i64 },
    /// A grant that came back after its holder's deadline: the library lets it go at
    /// once, best effort, so the lock may stay held until that lease ends.
    GrantedLate,
    /// The lock is held by another holder whose lease has not ended.
    Held,
    /// The lease was extended.
    Kept,
    /// The lock was freed.
    Released,
    /// The caller no longer holds the lock.
    Lost,
    /// A lease's release: the lease was lost and the release failed, so the lock may
    /// still be held (told from [`Ret::Lost`] by the error's text, see `check`).
    LostUnreleased,
    /// A fenced write refused: the row has seen the newer fence `current`.
    Stale { current: i64 },
    /// The protected row: the newest fence it accepted and its value.
    Fenced { fence: i64, value: i64 },
}

/// A key's model: the kind of its first operation decides which.
#[derive(Debug, Clone)]
pub enum Spec {
    Row(VersionedRow),
    Order(OrderModel),
    Lock(FencedMutex),
}

impl Spec {
    /// The model of a fresh key of `kind`; `ghosts` are the owners of claims whose answer
    /// never came.
    pub fn new(kind: Kind, ghosts: &Ghosts) -> Self {
        match kind {
            Kind::Row => Spec::Row(VersionedRow::default()),
            Kind::Order => Spec::Order(OrderModel::new(ghosts.clone())),
            Kind::Lock => Spec::Lock(FencedMutex::default()),
        }
    }

    fn kind(&self) -> Kind {
        match self {
            Spec::Row(_) => Kind::Row,
            Spec::Order(_) => Kind::Order,
            Spec::Lock(_) => Kind::Lock,
        }
    }
}

impl SequentialSpec for Spec {
    type Op = Op;
    type Ret = Ret;

    /// The answer of an operation applied to this state (used for operations whose
    /// answer never came: applied or not, the checker tries both).
    fn invoke(&mut self, op: &Op) -> Ret {
        if op.kind() != self.kind() {
            return Ret::NothingWritten;
        }
        match self {
            Spec::Row(m) => m.invoke(op),
            Spec::Order(m) => m.invoke(op),
            Spec::Lock(m) => m.invoke(op),
        }
    }

    /// Whether `ret` can be the answer of `op` here; a call that said nothing was written
    /// always can, and leaves the state as it was.
    fn is_valid_step(&mut self, op: &Op, ret: &Ret) -> bool {
        if op.kind() != self.kind() {
            return false;
        }
        if *ret == Ret::NothingWritten {
            return true;
        }
        match self {
            Spec::Row(m) => m.is_valid_step(op, ret),
            Spec::Order(m) => m.is_valid_step(op, ret),
            Spec::Lock(m) => m.is_valid_step(op, ret),
        }
    }
}
