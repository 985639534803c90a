//! The checker: per key, whether the history is linearizable against the key's model
//! ([`Spec`]), decided by stateright's `LinearizabilityTester` (a checker written for
//! model checking in general, not for this library). A call that never answered is left
//! in flight: the tester may place it anywhere after its start, or leave it out.
//!
//! The tester searches the orders without remembering the states it has already seen,
//! so its time grows exponentially with the calls in flight at once on a key: a key with
//! a few dozen calls that never answered can take it hours. [`check_within`] gives up on
//! such a key after a budget and names it; a key given up on is never counted as passed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use stateright::semantics::{ConsistencyTester, LinearizabilityTester};

use super::history::{Event, What};
use super::model::{Ghosts, Op, Ret, Spec};

/// The key of the claim calls: each row they hand out is judged on its own key.
pub const CLAIMS: i64 = 0;

/// The verdict on a history.
#[derive(Debug, Default)]
pub struct Verdict {
    pub keys: usize,
    pub operations: usize,
    /// Keys no order explains, each with its events.
    pub violations: Vec<(i64, Vec<Event>)>,
    /// Histories the tester refused as malformed (a caller with two calls in flight).
    pub malformed: Vec<(i64, String)>,
}

/// A key the checker gave up on: the key, and how many of its calls never answered.
#[derive(Debug)]
pub struct GaveUp {
    pub key: i64,
    pub unanswered: usize,
}

/// Judges every key of `events` (a history in the order it was written), within `budget`.
pub fn check_within(events: Vec<Event>, budget: Duration) -> Result<Verdict, GaveUp> {
    let current = Arc::new(AtomicI64::new(CLAIMS));
    let (done, verdict) = mpsc::channel();
    let key = Arc::clone(&current);
    let events = Arc::new(events);
    let judged = Arc::clone(&events);
    // Not joined when it overruns: the process ends with it still searching.
    let checker = std::thread::spawn(move || done.send(check(&judged, &key)));
    verdict.recv_timeout(budget).map_err(|gave_up| {
        if gave_up == mpsc::RecvTimeoutError::Disconnected {
            // The checker panicked (a model that met an operation it has no rule for):
            // that panic, not a timeout.
            if let Err(panic) = checker.join() {
                std::panic::resume_unwind(panic);
            }
        }
        let key = current.load(Ordering::Relaxed);
        let unanswered = events
            .iter()
            .filter(|e| e.key == key && matches!(e.what, What::Unknown { .. }))
            .count();
        GaveUp { key, unanswered }
    })
}

/// Judges every key of `events`, telling `current` which key it is on.
fn check(events: &[Event], current: &AtomicI64) -> Verdict {
    // Where each claim started in the file, by caller and stamp.
    let claim_lines: BTreeMap<(u64, u64), usize> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.key == CLAIMS && matches!(e.what, What::Invoke { .. }))
        .map(|(line, e)| ((e.caller, e.at), line))
        .collect();
    let mut by_key: BTreeMap<i64, Vec<(usize, &Event)>> = BTreeMap::new();
    for (line, event) in events.iter().enumerate() {
        // A row a claim handed out was written when the claim answered: it belongs just
        // after the claim's start.
        let place = if is_claimed(event) {
            2 * claim_lines
                .get(&(event.caller, event.at))
                .copied()
                .unwrap_or(line)
                + 1
        } else {
            2 * line
        };
        by_key.entry(event.key).or_default().push((place, event));
    }
    let claims = by_key.remove(&CLAIMS).unwrap_or_default();
    let ghosts = ghost_claims(claims.into_iter().map(|(_, e)| e).collect());
    let mut verdict = Verdict {
        keys: by_key.len(),
        ..Verdict::default()
    };
    for (key, mut placed) in by_key {
        placed.sort_by_key(|(place, _)| *place);
        let events: Vec<&Event> = placed.into_iter().map(|(_, e)| e).collect();
        let kind = events.iter().find_map(|e| match &e.what {
            What::Invoke { op, .. } => Some(op.kind()),
            _ => None,
        });
        let Some(kind) = kind else { continue };
        current.store(key, Ordering::Relaxed);
        let mut tester = LinearizabilityTester::new(Spec::new(kind, &ghosts));
        let mut malformed = None;
        for event in &events {
            let fed = match &event.what {
                What::Invoke { op, .. } => {
                    verdict.operations += 1;
                    tester.on_invoke(event.caller, op.clone()).map(|_| ())
                }
                What::Return { ret, error, .. } => tester
                    .on_return(event.caller, refined(ret, error.as_deref()))
                    .map(|_| ()),
                What::Unknown { .. } => Ok(()),
            };
            if let Err(e) = fed {
                malformed = Some(e);
                break;
            }
        }
        if let Some(e) = malformed {
            verdict.malformed.push((key, e));
        } else if !tester.is_consistent() {
            verdict
                .violations
                .push((key, events.into_iter().cloned().collect()));
        }
    }
    verdict
}

/// How the library words a lost lease whose release failed too (`Lease::release`).
const RELEASE_FAILED: &str = "its release failed too";

/// `ret` as the model reads it: a lost lock whose release failed, by the error's text,
/// may still be held ([`Ret::LostUnreleased`]). Told here rather than when the answer is
/// recorded, so that a history recorded earlier is judged the same.
fn refined(ret: &Ret, error: Option<&str>) -> Ret {
    match (ret, error) {
        (Ret::Lost, Some(text)) if text.contains(RELEASE_FAILED) => Ret::LostUnreleased,
        _ => ret.clone(),
    }
}

fn is_claimed(event: &Event) -> bool {
    matches!(
        &event.what,
        What::Invoke {
            op: Op::Claimed { .. },
            ..
        }
    )
}

/// The owners of the claims whose answer never came.
fn ghost_claims(claims: Vec<&Event>) -> Ghosts {
    let mut owners: BTreeMap<u64, String> = BTreeMap::new();
    let mut ghosts = BTreeSet::new();
    for event in claims {
        match &event.what {
            What::Invoke {
                op: Op::Claim { owner },
                ..
            } => {
                owners.insert(event.caller, owner.clone());
            }
            What::Unknown { .. } => ghosts.extend(owners.remove(&event.caller)),
            _ => {
                owners.remove(&event.caller);
            }
        }
    }
    Arc::new(ghosts)
}
