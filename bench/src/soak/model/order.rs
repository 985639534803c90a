//! The model of an order of the claim queue: placed, then claimed (packing) by one owner
//! who heartbeats and finishes it (shipped), or shipped or cancelled by key. Cancel and
//! ship race on the same orders: exactly one may win, and nothing leaves a final state.

use std::collections::BTreeSet;
use std::sync::Arc;

use stateright::semantics::SequentialSpec;

use super::{Op, Order, Ret, UNKNOWN_SEED};

pub const PLACED: &str = "placed";
pub const PACKING: &str = "packing";
pub const SHIPPED: &str = "shipped";
pub const CANCELLED: &str = "cancelled";

/// A ship by key needs an amount below this (its condition).
pub const SHIP_BELOW: i64 = 500;

/// The owners of claims whose answer never came: such a claim may have taken any placed
/// order, so an order may turn out packing for one of them with no answer saying so.
pub type Ghosts = Arc<BTreeSet<String>>;

/// The owner of an order taken by one of the [`Ghosts`], until an answer shows which.
const SOME_GHOST: &str = "\u{0}one of the claims that never answered";

/// The order, if it exists.
#[derive(Debug, Clone)]
pub struct OrderModel {
    order: Option<Order>,
    ghosts: Ghosts,
}

impl OrderModel {
    pub fn new(ghosts: Ghosts) -> Self {
        OrderModel {
            order: None,
            ghosts,
        }
    }
}

impl SequentialSpec for OrderModel {
    type Op = Op;
    type Ret = Ret;

    fn invoke(&mut self, op: &Op) -> Ret {
        let (ret, next) = step(&self.order, op, None);
        self.order = next;
        ret
    }

    fn is_valid_step(&mut self, op: &Op, ret: &Ret) -> bool {
        let order = self.order.as_ref().map(|o| named(o, ret, &self.ghosts));
        let (expected, next) = step(&order, op, Some(ret));
        if expected == *ret {
            self.order = next;
            return true;
        }
        // A claim that never answered may have taken the order just before.
        let Some(placed) = self.order.as_ref().filter(|o| o.status == PLACED) else {
            return false;
        };
        if self.ghosts.is_empty() {
            return false;
        }
        let taken = moved(placed, PACKING, Some(SOME_GHOST.into()));
        let (expected, next) = step(&Some(named(&taken, ret, &self.ghosts)), op, Some(ret));
        if expected == *ret {
            self.order = next;
            return true;
        }
        false
    }
}

/// `order` with [`SOME_GHOST`] as its owner named by the ghost `answered` shows.
fn named(order: &Order, answered: &Ret, ghosts: &Ghosts) -> Order {
    match answered {
        Ret::OrderRead {
            order: Some(Order {
                owner: Some(owner), ..
            }),
        } if order.owner.as_deref() == Some(SOME_GHOST) && ghosts.contains(owner) => Order {
            owner: Some(owner.clone()),
            ..order.clone()
        },
        _ => order.clone(),
    }
}

/// `order` moved to `status` (owned by `owner`), its version one on.
fn moved(order: &Order, status: &str, owner: Option<String>) -> Order {
    Order {
        status: status.into(),
        owner,
        amount: order.amount,
        version: if order.version == UNKNOWN_SEED {
            UNKNOWN_SEED
        } else {
            order.version + 1
        },
    }
}

/// The answer of `op` on `state`, and the state after it; `answered` supplies the seed
/// of an insert and pins an unknown one.
fn step(state: &Option<Order>, op: &Op, answered: Option<&Ret>) -> (Ret, Option<Order>) {
    let pinned = state.as_ref().map(|o| pin(o, answered));
    let same = pinned.clone();
    let Some(order) = &pinned else {
        return match (op, answered) {
            (Op::Place { amount }, answered) => {
                let version = match answered {
                    Some(Ret::Written { version: Some(v) }) => *v,
                    _ => UNKNOWN_SEED,
                };
                let placed = Order {
                    status: PLACED.into(),
                    owner: None,
                    amount: *amount,
                    version,
                };
                let ret = Ret::Written {
                    version: Some(version),
                };
                (ret, Some(placed))
            }
            (Op::LoadOrder, _) => (Ret::OrderRead { order: None }, None),
            // A claim hands out only rows that exist.
            (Op::Claimed { .. }, _) => (Ret::NothingWritten, None),
            _ => (Ret::NotFound, None),
        };
    };
    let open = order.status == PLACED || order.status == PACKING;
    let to = |status: &str, owner: Option<String>| {
        let next = moved(order, status, owner);
        (
            Ret::Moved {
                version: next.version,
            },
            Some(next),
        )
    };
    let invalid = || {
        (
            Ret::Invalid {
                status: order.status.clone(),
            },
            same.clone(),
        )
    };
    let holds = |owner: &str| order.status == PACKING && order.owner.as_deref() == Some(owner);
    match op {
        Op::Place { .. } => (Ret::AlreadyExists, same.clone()),
        Op::LoadOrder => (
            Ret::OrderRead {
                order: same.clone(),
            },
            same.clone(),
        ),
        Op::Ship if !open => invalid(),
        Op::Ship if order.amount >= SHIP_BELOW => (Ret::Unmet, same.clone()),
        Op::Ship => to(SHIPPED, order.owner.clone()),
        Op::Cancel if !open => invalid(),
        Op::Cancel => to(CANCELLED, order.owner.clone()),
        Op::Claimed { owner } if order.status == PLACED => {
            let next = moved(order, PACKING, Some(owner.clone()));
            let ret = Ret::Taken {
                version: next.version,
            };
            (ret, Some(next))
        }
        // Handed out in another state: no answer of the model matches.
        Op::Claimed { .. } => (Ret::NothingWritten, same.clone()),
        Op::Heartbeat { owner } if holds(owner) => to(PACKING, Some(owner.clone())),
        Op::Finish { owner } if holds(owner) => {
            let next = moved(order, SHIPPED, None);
            (Ret::Done, Some(next))
        }
        Op::Heartbeat { .. } | Op::Finish { .. } => (Ret::ClaimLost, same.clone()),
        _ => unreachable!("{op:?} is not an operation on an order"),
    }
}

/// `order` with an unknown seed replaced by the version `answered` shows it had.
fn pin(order: &Order, answered: Option<&Ret>) -> Order {
    if order.version != UNKNOWN_SEED {
        return order.clone();
    }
    let version = match answered {
        Some(Ret::OrderRead { order: Some(seen) }) => seen.version,
        Some(Ret::Moved { version } | Ret::Taken { version }) => version - 1,
        _ => UNKNOWN_SEED,
    };
    Order {
        version,
        ..order.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stateright::semantics::{ConsistencyTester, LinearizabilityTester};

    fn placed(amount: i64) -> OrderModel {
        let mut model = OrderModel::new(Ghosts::default());
        model.order = Some(Order {
            status: PLACED.into(),
            owner: None,
            amount,
            version: 0,
        });
        model
    }

    #[test]
    fn cancel_and_ship_cannot_both_win() {
        let mut t = LinearizabilityTester::new(placed(10));
        t.on_invoke(1u64, Op::Ship).unwrap();
        t.on_invoke(2u64, Op::Cancel).unwrap();
        t.on_return(1, Ret::Moved { version: 1 }).unwrap();
        t.on_return(2, Ret::Moved { version: 1 }).unwrap();
        assert!(!t.is_consistent());
    }

    #[test]
    fn a_claim_is_exclusive_and_ships_once() {
        let mut t = LinearizabilityTester::new(placed(900));
        t.on_invoke(1u64, Op::Claimed { owner: "a".into() })
            .unwrap();
        t.on_return(1, Ret::Taken { version: 1 }).unwrap();
        t.on_invoke(2u64, Op::Heartbeat { owner: "b".into() })
            .unwrap();
        t.on_return(2, Ret::Moved { version: 2 }).unwrap();
        assert!(!t.is_consistent(), "b never held the claim");
    }

    #[test]
    fn an_unmet_condition_is_told_apart() {
        let mut t = LinearizabilityTester::new(placed(900));
        t.on_invoke(1u64, Op::Ship).unwrap();
        t.on_return(1, Ret::Moved { version: 1 }).unwrap();
        assert!(!t.is_consistent(), "900 is not below the ship condition");
    }

    #[test]
    fn a_claim_that_never_answered_may_have_taken_the_order() {
        let mut model = placed(10);
        model.ghosts = Arc::new(["g".to_string()].into());
        let mut t = LinearizabilityTester::new(model);
        t.on_invoke(1u64, Op::LoadOrder).unwrap();
        let taken = Order {
            status: PACKING.into(),
            owner: Some("g".into()),
            amount: 10,
            version: 1,
        };
        t.on_return(
            1,
            Ret::OrderRead {
                order: Some(taken.clone()),
            },
        )
        .unwrap();
        assert!(t.is_consistent());
        let mut t = LinearizabilityTester::new(placed(10));
        t.on_invoke(1u64, Op::LoadOrder).unwrap();
        t.on_return(1, Ret::OrderRead { order: Some(taken) })
            .unwrap();
        assert!(!t.is_consistent(), "no claim by g is in the history");
    }
}
