//! The model of a lock and the row its fences protect: a fenced mutex. Each grant's fence
//! is above every earlier one; a renewal or release succeeds only for the current
//! holder; a write under a fence older than the newest the row accepted is refused.
//!
//! A lease may end at any moment (the model has no clock), so a grant is valid whoever
//! held the lock before: whether the lease had ended by the database's clock is checked
//! from the database side, by the audit of every change to the lock table.
//!
//! A lease that renews itself says it is held only while its holder is the current one,
//! and a write through it lands only then: one that lands while another holder has the
//! lock is a double holder the model sees.

use stateright::semantics::SequentialSpec;

use super::{Op, Ret};

/// The fence of a grant whose answer never came.
const UNKNOWN_FENCE: i64 = -1;

/// The lock's holder (by its fence), the newest fence granted, and the protected row.
#[derive(Debug, Clone, Default)]
pub struct FencedMutex {
    holder: Option<i64>,
    newest_grant: i64,
    row_fence: i64,
    row_value: i64,
}

impl SequentialSpec for FencedMutex {
    type Op = Op;
    type Ret = Ret;

    /// A call whose answer never came, applied: a grant of an unknown fence (the next
    /// grant must still be above the newest known), a renewal (no change), a release, a
    /// fenced write that landed if its fence allowed.
    fn invoke(&mut self, op: &Op) -> Ret {
        match op {
            Op::Acquire => {
                self.holder = Some(UNKNOWN_FENCE);
                Ret::Granted {
                    fence: UNKNOWN_FENCE,
                }
            }
            Op::Renew { .. } => Ret::Kept,
            Op::Release { fence } | Op::ReleaseLease { fence } => {
                if self.holder == Some(*fence) {
                    self.holder = None;
                }
                Ret::Released
            }
            Op::FencedWrite { fence, value } => self.write(*fence, *value),
            Op::Check { .. } => Ret::Kept,
            Op::WriteWhileHeld { fence, value } if self.holder == Some(*fence) => {
                self.write(*fence, *value)
            }
            Op::WriteWhileHeld { .. } => Ret::Lost,
            Op::ReadFenced => self.read(),
            _ => unreachable!("{op:?} is not an operation on a lock"),
        }
    }

    fn is_valid_step(&mut self, op: &Op, ret: &Ret) -> bool {
        match (op, ret) {
            (Op::Acquire, Ret::Granted { fence }) if *fence > self.newest_grant => {
                self.holder = Some(*fence);
                self.newest_grant = *fence;
                true
            }
            // Granted, then let go best effort: held by a fence no answer told, or freed
            // (a lease may end at any moment, so holding it on covers both).
            (Op::Acquire, Ret::GrantedLate) => {
                self.holder = Some(UNKNOWN_FENCE);
                true
            }
            // Refused while another holder's lease lasts: there must be one.
            (Op::Acquire, Ret::Held) => self.holder.is_some(),
            (Op::Renew { fence }, Ret::Kept) => self.holder == Some(*fence),
            // The lease may have ended unseen by the model.
            (Op::Renew { .. }, Ret::Lost) => true,
            (Op::Release { fence } | Op::ReleaseLease { fence }, Ret::Released)
                if self.holder == Some(*fence) =>
            {
                self.holder = None;
                true
            }
            // A release fails only when another holder took the lock over.
            (Op::Release { fence }, Ret::Lost) => self.holder != Some(*fence),
            // A lease's release fails, as a guard's, only when another holder took the
            // lock over, unless the lease was lost already (by time, which the model
            // cannot see) and the release itself failed: then the lock may still be
            // held, and its holder is left as it was (a later grant is valid either way).
            (Op::ReleaseLease { fence }, Ret::Lost) => self.holder != Some(*fence),
            (Op::ReleaseLease { .. }, Ret::LostUnreleased) => true,
            (Op::FencedWrite { fence, value }, _) => self.write(*fence, *value) == *ret,
            (Op::Check { fence }, Ret::Kept) => self.holder == Some(*fence),
            // The lease may have ended unseen by the model; the write then wrote nothing.
            (Op::Check { .. } | Op::WriteWhileHeld { .. }, Ret::Lost) => true,
            (Op::WriteWhileHeld { fence, value }, Ret::Done) => {
                self.holder == Some(*fence) && self.write(*fence, *value) == Ret::Done
            }
            // Refused by the fence before the hold was checked.
            (Op::WriteWhileHeld { fence, value }, Ret::Stale { .. }) => {
                self.write(*fence, *value) == *ret
            }
            (Op::ReadFenced, _) => self.read() == *ret,
            _ => false,
        }
    }
}

impl FencedMutex {
    /// A fenced write: it lands unless the row has seen a newer fence.
    fn write(&mut self, fence: i64, value: i64) -> Ret {
        if fence < self.row_fence {
            return Ret::Stale {
                current: self.row_fence,
            };
        }
        self.row_fence = fence;
        self.row_value = value;
        Ret::Done
    }

    fn read(&self) -> Ret {
        Ret::Fenced {
            fence: self.row_fence,
            value: self.row_value,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stateright::semantics::{ConsistencyTester, LinearizabilityTester};

    #[test]
    fn a_fence_handed_out_twice_is_not_linearizable() {
        let mut t = LinearizabilityTester::new(FencedMutex::default());
        t.on_invoke(1u64, Op::Acquire).unwrap();
        t.on_return(1, Ret::Granted { fence: 5 }).unwrap();
        t.on_invoke(2u64, Op::Acquire).unwrap();
        t.on_return(2, Ret::Granted { fence: 5 }).unwrap();
        assert!(!t.is_consistent());
    }

    #[test]
    fn an_old_holder_cannot_renew_after_a_new_grant() {
        let mut t = LinearizabilityTester::new(FencedMutex::default());
        t.on_invoke(1u64, Op::Acquire).unwrap();
        t.on_return(1, Ret::Granted { fence: 1 }).unwrap();
        t.on_invoke(2u64, Op::Acquire).unwrap();
        t.on_return(2, Ret::Granted { fence: 2 }).unwrap();
        t.on_invoke(1u64, Op::Renew { fence: 1 }).unwrap();
        t.on_return(1, Ret::Kept).unwrap();
        assert!(!t.is_consistent());
    }

    #[test]
    fn a_lease_is_held_and_writes_only_while_its_holder_is_the_current_one() {
        let granted_twice = || {
            let mut t = LinearizabilityTester::new(FencedMutex::default());
            t.on_invoke(1u64, Op::Acquire).unwrap();
            t.on_return(1, Ret::Granted { fence: 1 }).unwrap();
            t.on_invoke(2u64, Op::Acquire).unwrap();
            t.on_return(2, Ret::Granted { fence: 2 }).unwrap();
            t
        };
        let mut t = granted_twice();
        t.on_invoke(1u64, Op::Check { fence: 1 }).unwrap();
        t.on_return(1, Ret::Kept).unwrap();
        assert!(!t.is_consistent());
        // Its fence is above any the row saw: only the hold can refuse it.
        let mut t = granted_twice();
        t.on_invoke(1u64, Op::WriteWhileHeld { fence: 1, value: 7 })
            .unwrap();
        t.on_return(1, Ret::Done).unwrap();
        assert!(!t.is_consistent());
        let mut t = granted_twice();
        t.on_invoke(1u64, Op::WriteWhileHeld { fence: 1, value: 7 })
            .unwrap();
        t.on_return(1, Ret::Lost).unwrap();
        t.on_invoke(2u64, Op::WriteWhileHeld { fence: 2, value: 8 })
            .unwrap();
        t.on_return(2, Ret::Done).unwrap();
        t.on_invoke(1u64, Op::ReadFenced).unwrap();
        t.on_return(1, Ret::Fenced { fence: 2, value: 8 }).unwrap();
        assert!(t.is_consistent());
    }

    #[test]
    fn a_leases_release_is_lost_while_held_only_when_the_release_failed() {
        let released = |ret| {
            let mut t = LinearizabilityTester::new(FencedMutex::default());
            t.on_invoke(1u64, Op::Acquire).unwrap();
            t.on_return(1, Ret::Granted { fence: 1 }).unwrap();
            t.on_invoke(1u64, Op::ReleaseLease { fence: 1 }).unwrap();
            t.on_return(1, ret).unwrap();
            t.is_consistent()
        };
        assert!(!released(Ret::Lost));
        assert!(released(Ret::LostUnreleased));
        assert!(released(Ret::Released));
    }

    #[test]
    fn a_stale_fence_is_refused_and_a_free_lock_is_not_held() {
        let mut t = LinearizabilityTester::new(FencedMutex::default());
        t.on_invoke(1u64, Op::FencedWrite { fence: 3, value: 1 })
            .unwrap();
        t.on_return(1, Ret::Done).unwrap();
        t.on_invoke(1u64, Op::FencedWrite { fence: 2, value: 1 })
            .unwrap();
        t.on_return(1, Ret::Done).unwrap();
        assert!(!t.is_consistent());
        let mut t = LinearizabilityTester::new(FencedMutex::default());
        t.on_invoke(1u64, Op::Acquire).unwrap();
        t.on_return(1, Ret::Held).unwrap();
        assert!(!t.is_consistent());
    }

    /// Seen in a soak across a failover: a grant came back after its holder's deadline,
    /// its release on drop failed, and others found the lock held until that lease ended.
    #[test]
    fn a_grant_that_came_back_late_may_hold_the_lock_until_its_lease_ends() {
        let mut t = LinearizabilityTester::new(FencedMutex::default());
        t.on_invoke(1u64, Op::Acquire).unwrap();
        t.on_return(1, Ret::GrantedLate).unwrap();
        t.on_invoke(2u64, Op::Acquire).unwrap();
        t.on_return(2, Ret::Held).unwrap();
        t.on_invoke(2u64, Op::Acquire).unwrap();
        t.on_return(2, Ret::Granted { fence: 5 }).unwrap();
        assert!(t.is_consistent());
        let mut t = LinearizabilityTester::new(FencedMutex::default());
        t.on_invoke(2u64, Op::Acquire).unwrap();
        t.on_return(2, Ret::Held).unwrap();
        assert!(!t.is_consistent(), "a lock nobody took is not held");
    }
}
