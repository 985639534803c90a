//! Every branch of the end of many claims, fed by a scripted driver: each case lists the
//! effects the flow must answer and what the driver reports after each, then the outcome.
//! No database.

use diesel::result::{DatabaseErrorKind, Error as DieselError};

use super::{Effect, FinishClaims};
use crate::error::{Error, RetryReason};
use crate::flow::finish_claims::report::{FinishedClaims, KEYS_PER_STATEMENT};

diesel::table! {
    tasks (id) {
        id -> BigInt,
        state -> Text,
        version -> BigInt,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, crate::Status)]
enum Stage {
    Waiting,
    #[occ(from(Waiting))]
    Running,
    #[occ(from(Running))]
    Done,
}

#[derive(Debug, Clone, PartialEq, diesel::Queryable, diesel::Identifiable, crate::Guarded)]
#[diesel(table_name = tasks)]
struct Task {
    id: i64,
    #[occ(status)]
    state: Stage,
    #[occ(version)]
    version: i64,
}

/// What the scripted driver reports after an effect.
enum Report {
    Checked(Result<(), Error>),
    Returned(Result<Vec<i64>, Error>),
    LookedUp(Result<Option<Task>, Error>),
    AllOrNothing(Result<bool, Error>),
    EndedAlone(Result<(), Error>),
}
use Report::*;

fn deadlock() -> Error {
    Error::Retryable {
        reason: RetryReason::Deadlock,
        source: DieselError::DatabaseError(
            DatabaseErrorKind::SerializationFailure,
            Box::new("deadlock detected".to_string()),
        ),
    }
}

fn broken() -> Error {
    Error::Database(DieselError::BrokenTransactionManager)
}

fn claim_lost() -> Error {
    Error::LockLost {
        lock: "claim".into(),
        why: "another owner claimed it".into(),
    }
}

fn task(id: i64, state: Stage) -> Task {
    Task {
        id,
        state,
        version: 3,
    }
}

fn flow(keys: &[i64], returning: bool, in_callers: bool) -> FinishClaims<Task> {
    FinishClaims::new(keys, "tasks", ("w1", Stage::Running), returning, in_callers)
}

/// Feeds `script` to `flow`, checking each effect against the script's, and answers the
/// outcome after `Done`.
fn run(
    mut flow: FinishClaims<Task>,
    script: Vec<(Effect<i64>, Report)>,
) -> Result<FinishedClaims<i64>, Error> {
    let mut effect = flow.start();
    for (step, (expected, report)) in script.into_iter().enumerate() {
        assert_eq!(effect, expected, "effect {step}");
        effect = match report {
            Checked(r) => flow.checked(r),
            Returned(r) => flow.returned(r),
            LookedUp(r) => flow.looked_up(r),
            AllOrNothing(r) => flow.all_or_nothing(r),
            EndedAlone(r) => flow.ended_alone(r),
        };
    }
    assert_eq!(effect, Effect::Done, "after the script");
    flow.outcome()
}

/// Whether `effect` is a pause (its length is the policy's, drawn with jitter).
fn paused_in(effect: &Effect<i64>) -> bool {
    matches!(effect, Effect::Pause(_))
}

#[test]
fn no_keys_sends_nothing() {
    let report = run(flow(&[], true, false), vec![]).unwrap();
    assert!(report.finished.is_empty() && report.lost.is_empty());
}

#[test]
fn returning_ends_every_claim_in_one_statement_each_key_once() {
    let report = run(
        flow(&[1, 2, 1, 3], true, false),
        vec![
            (Effect::Check(1), Checked(Ok(()))),
            (
                Effect::SendReturning(vec![1, 2, 3]),
                Returned(Ok(vec![3, 1, 2])),
            ),
        ],
    )
    .unwrap();
    assert_eq!(report.finished, [1, 2, 3]);
    assert!(report.all_finished());
}

#[test]
fn a_key_not_returned_is_looked_up_and_its_row_says_why() {
    let report = run(
        flow(&[1, 2, 3], true, false),
        vec![
            (Effect::Check(1), Checked(Ok(()))),
            (Effect::SendReturning(vec![1, 2, 3]), Returned(Ok(vec![1]))),
            (
                Effect::LookUp(2),
                LookedUp(Ok(Some(task(2, Stage::Waiting)))),
            ),
            (Effect::LookUp(3), LookedUp(Ok(None))),
        ],
    )
    .unwrap();
    assert_eq!(report.finished, [1]);
    assert_eq!(report.lost.len(), 2);
    assert!(matches!(report.lost[0], (2, Error::LockLost { .. })));
    assert!(matches!(report.lost[1], (3, Error::NotFound { .. })));
}

#[test]
fn a_looked_up_row_among_those_returned_ended_after_all() {
    // Another spelling of a key the database compares loosely comes back as stored.
    let report = run(
        flow(&[7], true, false),
        vec![
            (Effect::Check(7), Checked(Ok(()))),
            (Effect::SendReturning(vec![7]), Returned(Ok(vec![8]))),
            (Effect::LookUp(7), LookedUp(Ok(Some(task(8, Stage::Done))))),
        ],
    )
    .unwrap();
    assert_eq!(report.finished, [7]);
}

#[test]
fn a_row_whose_version_cannot_advance_is_lost_as_an_overflow() {
    let mut at_end = task(2, Stage::Running);
    at_end.version = i64::MAX;
    let report = run(
        flow(&[2], true, false),
        vec![
            (Effect::Check(2), Checked(Ok(()))),
            (Effect::SendReturning(vec![2]), Returned(Ok(vec![]))),
            (Effect::LookUp(2), LookedUp(Ok(Some(at_end)))),
        ],
    )
    .unwrap();
    assert!(matches!(report.lost[0], (2, Error::VersionOverflow { .. })));
}

#[test]
fn chunks_are_sent_in_order_at_the_statement_limit() {
    let keys: Vec<i64> = (0..(KEYS_PER_STATEMENT as i64 * 2 + 1)).collect();
    let chunk = |n: usize| keys.chunks(KEYS_PER_STATEMENT).nth(n).unwrap().to_vec();
    let report = run(
        flow(&keys, true, false),
        vec![
            (Effect::Check(0), Checked(Ok(()))),
            (Effect::SendReturning(chunk(0)), Returned(Ok(chunk(0)))),
            (Effect::SendReturning(chunk(1)), Returned(Ok(chunk(1)))),
            (Effect::SendReturning(chunk(2)), Returned(Ok(chunk(2)))),
        ],
    )
    .unwrap();
    assert_eq!(report.finished, keys);
}

#[test]
fn a_transient_failure_sends_the_same_statement_again_after_a_pause() {
    let mut flow = flow(&[1, 2], true, false);
    assert_eq!(flow.start(), Effect::Check(1));
    assert_eq!(flow.checked(Ok(())), Effect::SendReturning(vec![1, 2]));
    assert!(paused_in(&flow.returned(Err(deadlock()))));
    assert_eq!(flow.paused(), Effect::SendReturning(vec![1, 2]));
    assert_eq!(flow.returned(Ok(vec![1, 2])), Effect::Done);
    assert_eq!(flow.outcome().unwrap().finished, [1, 2]);
}

#[test]
fn inside_the_callers_transaction_a_transient_failure_is_the_callers_to_retry() {
    let outcome = run(
        flow(&[1, 2], true, true),
        vec![
            (Effect::Check(1), Checked(Ok(()))),
            (Effect::SendReturning(vec![1, 2]), Returned(Err(deadlock()))),
        ],
    );
    assert!(matches!(outcome, Err(Error::Retryable { .. })));
}

#[test]
fn retries_end_when_the_policy_gives_up() {
    let mut flow = flow(&[1, 2], false, false);
    flow.start();
    let mut effect = flow.checked(Ok(()));
    let mut attempts = 0;
    while effect == Effect::SendAllOrNothing(vec![1, 2]) {
        attempts += 1;
        effect = flow.all_or_nothing(Err(deadlock()));
        if paused_in(&effect) {
            effect = flow.paused();
        }
    }
    assert_eq!(effect, Effect::Done);
    assert!(attempts > 1, "{attempts} attempts");
    assert!(matches!(
        flow.outcome(),
        Err(Error::RetriesExhausted { .. })
    ));
}

#[test]
fn an_error_that_is_not_transient_ends_the_call_at_once() {
    let outcome = run(
        flow(&[1, 2], true, false),
        vec![
            (Effect::Check(1), Checked(Ok(()))),
            (Effect::SendReturning(vec![1, 2]), Returned(Err(broken()))),
        ],
    );
    assert!(matches!(outcome, Err(Error::Database(_))));
}

#[test]
fn a_failed_check_or_look_up_ends_the_call() {
    let checked = run(
        flow(&[1], true, false),
        vec![(Effect::Check(1), Checked(Err(broken())))],
    );
    assert!(checked.is_err());
    let looked_up = run(
        flow(&[1], true, false),
        vec![
            (Effect::Check(1), Checked(Ok(()))),
            (Effect::SendReturning(vec![1]), Returned(Ok(vec![]))),
            (Effect::LookUp(1), LookedUp(Err(broken()))),
        ],
    );
    assert!(looked_up.is_err());
}

#[test]
fn without_returning_a_chunk_that_matched_every_key_ends_them_all() {
    let report = run(
        flow(&[1, 2, 3], false, false),
        vec![
            (Effect::Check(1), Checked(Ok(()))),
            (
                Effect::SendAllOrNothing(vec![1, 2, 3]),
                AllOrNothing(Ok(true)),
            ),
        ],
    )
    .unwrap();
    assert_eq!(report.finished, [1, 2, 3]);
}

#[test]
fn without_returning_a_chunk_that_missed_a_key_ends_each_claim_alone() {
    let report = run(
        flow(&[1, 2, 3], false, false),
        vec![
            (Effect::Check(1), Checked(Ok(()))),
            (
                Effect::SendAllOrNothing(vec![1, 2, 3]),
                AllOrNothing(Ok(false)),
            ),
            (Effect::EndAlone(1), EndedAlone(Ok(()))),
            (Effect::EndAlone(2), EndedAlone(Err(claim_lost()))),
            (Effect::EndAlone(3), EndedAlone(Ok(()))),
        ],
    )
    .unwrap();
    assert_eq!(report.finished, [1, 3]);
    assert!(matches!(report.lost[..], [(2, Error::LockLost { .. })]));
}

#[test]
fn a_single_key_is_ended_alone_at_once() {
    let report = run(
        flow(&[5], false, false),
        vec![
            (Effect::Check(5), Checked(Ok(()))),
            (Effect::EndAlone(5), EndedAlone(Ok(()))),
        ],
    )
    .unwrap();
    assert_eq!(report.finished, [5]);
}

#[test]
fn a_claim_ended_alone_is_sent_again_after_a_transient_failure() {
    let mut flow = flow(&[5], false, false);
    flow.start();
    assert_eq!(flow.checked(Ok(())), Effect::EndAlone(5));
    assert!(paused_in(&flow.ended_alone(Err(deadlock()))));
    assert_eq!(flow.paused(), Effect::EndAlone(5));
    assert_eq!(flow.ended_alone(Ok(())), Effect::Done);
    assert_eq!(flow.outcome().unwrap().finished, [5]);
}

#[test]
fn an_error_ending_a_claim_alone_that_is_not_about_the_row_ends_the_call() {
    let outcome = run(
        flow(&[5, 6], false, false),
        vec![
            (Effect::Check(5), Checked(Ok(()))),
            (
                Effect::SendAllOrNothing(vec![5, 6]),
                AllOrNothing(Ok(false)),
            ),
            (Effect::EndAlone(5), EndedAlone(Err(broken()))),
        ],
    );
    assert!(matches!(outcome, Err(Error::Database(_))));
}

#[test]
fn the_report_keeps_the_keys_order_when_a_look_up_finds_a_key_ended_after_all() {
    // Key 2 is stored as 20 (a key the database compares loosely): not among the keys
    // returned, ended all the same.
    let report = run(
        flow(&[1, 2, 3], true, false),
        vec![
            (Effect::Check(1), Checked(Ok(()))),
            (
                Effect::SendReturning(vec![1, 2, 3]),
                Returned(Ok(vec![1, 20, 3])),
            ),
            (Effect::LookUp(2), LookedUp(Ok(Some(task(20, Stage::Done))))),
        ],
    )
    .unwrap();
    assert_eq!(report.finished, [1, 2, 3]);
}

#[test]
fn results_fed_out_of_turn_end_the_call_with_an_error() {
    let mut flow = flow(&[1], true, false);
    flow.start();
    assert_eq!(flow.looked_up(Ok(None)), Effect::Done);
    assert!(flow.outcome().is_err());
}
