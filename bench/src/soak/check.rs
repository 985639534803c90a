//! The checker: per key, whether the history is linearizable against the model
//! ([`VersionedRow`]), decided by stateright's `LinearizabilityTester` (a checker written
//! for model checking in general, not for this library). A call that never answered is
//! left in flight: the tester may place it anywhere after its start, or leave it out.

use std::collections::BTreeMap;

use stateright::semantics::{ConsistencyTester, LinearizabilityTester};

use super::history::{Event, What};
use super::model::VersionedRow;

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

/// Judges every key of `events` (a history in the order it happened).
pub fn check(events: &[Event]) -> Verdict {
    let mut by_key: BTreeMap<i64, Vec<&Event>> = BTreeMap::new();
    for event in events {
        by_key.entry(event.key).or_default().push(event);
    }
    let mut verdict = Verdict {
        keys: by_key.len(),
        ..Verdict::default()
    };
    for (key, events) in by_key {
        let mut tester = LinearizabilityTester::new(VersionedRow(None));
        let mut malformed = None;
        for event in &events {
            let fed = match &event.what {
                What::Invoke { op, .. } => {
                    verdict.operations += 1;
                    tester.on_invoke(event.caller, op.clone()).map(|_| ())
                }
                What::Return { ret, .. } => tester.on_return(event.caller, ret.clone()).map(|_| ()),
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
