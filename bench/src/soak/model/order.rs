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

/// Every state the order may be in: a claim that never answered may have taken it at
/// any moment while it was placed, and no answer need tell (a ship refused for its
/// amount, a heartbeat of another owner read the same either way). The tester keeps one
/// state per order of the calls, so the model keeps the set, and a call is valid when
/// it is from any of them.
#[derive(Debug, Clone)]
pub struct OrderModel {
    possible: Vec<Option<Order>>,
    ghosts: Ghosts,
}

impl OrderModel {
    pub fn new(ghosts: Ghosts) -> Self {
        OrderModel {
            possible: vec![None],
            ghosts,
        }
    }

    /// The states possible now: each one, and a placed one also taken by a claim that
    /// never answered.
    fn with_ghost_takes(&self) -> Vec<Option<Order>> {
        let mut states = self.possible.clone();
        if !self.ghosts.is_empty() {
            for order in self.possible.iter().flatten() {
                if order.status == PLACED {
                    states.push(Some(moved(order, PACKING, Some(SOME_GHOST.into()))));
                }
            }
        }
        states
    }

    fn set(&mut self, next: Vec<Option<Order>>) {
        let mut unique = Vec::with_capacity(next.len());
        for state in next {
            if !unique.contains(&state) {
                unique.push(state);
            }
        }
        self.possible = unique;
    }
}

impl SequentialSpec for OrderModel {
    type Op = Op;
    type Ret = Ret;

    /// A call that never answered: it may have run from any possible state.
    fn invoke(&mut self, op: &Op) -> Ret {
        let states = self.with_ghost_takes();
        let ret = step(&states[0], op, None).0;
        self.set(states.iter().map(|s| step(s, op, None).1).collect());
        ret
    }

    fn is_valid_step(&mut self, op: &Op, ret: &Ret) -> bool {
        let next: Vec<_> = self
            .with_ghost_takes()
            .into_iter()
            .filter_map(|state| {
                let state = state.map(|o| named(&o, ret, &self.ghosts));
                let (expected, next) = step(&state, op, Some(ret));
                (expected == *ret).then_some(next)
            })
            .collect();
        if next.is_empty() {
            return false;
        }
        self.set(next);
        true
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
        model.possible = vec![Some(Order {
            status: PLACED.into(),
            owner: None,
            amount,
            version: 0,
        })];
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

    /// Seen in a soak across a failover: a claim that never answered took the order; a
    /// ship refused for its amount (the same answer placed or taken) came next, then a
    /// cancel that never answered, and the order was read cancelled, owned by the
    /// claim's owner. The tester must not have to take the order at the ship.
    #[test]
    fn a_take_by_a_claim_that_never_answered_need_not_show_in_the_next_answer() {
        let mut model = placed(990);
        model.ghosts = Arc::new(["g".to_string()].into());
        let mut t = LinearizabilityTester::new(model);
        t.on_invoke(1u64, Op::Ship).unwrap();
        t.on_return(1, Ret::Unmet).unwrap();
        t.on_invoke(2u64, Op::Cancel).unwrap();
        t.on_invoke(3u64, Op::LoadOrder).unwrap();
        let cancelled = Order {
            status: CANCELLED.into(),
            owner: Some("g".into()),
            amount: 990,
            version: 2,
        };
        t.on_return(
            3,
            Ret::OrderRead {
                order: Some(cancelled.clone()),
            },
        )
        .unwrap();
        assert!(t.is_consistent());
        // Without the claim that never answered, no order of the calls explains it.
        let mut t = LinearizabilityTester::new(placed(990));
        t.on_invoke(1u64, Op::Ship).unwrap();
        t.on_return(1, Ret::Unmet).unwrap();
        t.on_invoke(2u64, Op::Cancel).unwrap();
        t.on_invoke(3u64, Op::LoadOrder).unwrap();
        t.on_return(
            3,
            Ret::OrderRead {
                order: Some(cancelled),
            },
        )
        .unwrap();
        assert!(!t.is_consistent());
    }
}
