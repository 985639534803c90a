//! The term fed by hand: each wake-up, each renewal's answer and each way a term ends.

use std::time::{Duration, Instant};

use super::{Closing, LeaderEvent, Term, TermEnd, Woken};
use crate::error::Error;

const PERIOD: Duration = Duration::from_secs(2);

fn lost(why: &str) -> Error {
    Error::LockLost {
        lock: "leader/x".into(),
        why: why.into(),
    }
}

fn transient() -> Error {
    Error::Database(diesel::result::Error::BrokenTransactionManager)
}

/// A term at `t0` whose first renewal is due and started.
fn renewing(t0: Instant) -> Term {
    let mut term = Term::begin(PERIOD, t0);
    assert_eq!(term.woken(Woken::Timeout, true, t0 + PERIOD), Ok(true));
    term
}

#[test]
fn waits_for_the_next_renewal_or_the_deadline_whichever_is_first() {
    let t0 = Instant::now();
    let term = Term::begin(PERIOD, t0);
    let far = t0 + 5 * PERIOD;
    assert_eq!(term.wait_until(Some(far)), Ok(t0 + PERIOD));
    let near = t0 + PERIOD / 2;
    assert_eq!(term.wait_until(Some(near)), Ok(near));
}

#[test]
fn a_lease_already_lost_ends_the_term_before_any_wait() {
    let term = Term::begin(PERIOD, Instant::now());
    assert_eq!(
        term.wait_until(None),
        Err(TermEnd::BeliefEnded("the lease was lost".into()))
    );
}

#[test]
fn renews_when_due_and_only_once_while_the_renewal_is_in_flight() {
    let t0 = Instant::now();
    let mut term = Term::begin(PERIOD, t0);
    assert_eq!(term.woken(Woken::Timeout, true, t0 + PERIOD / 2), Ok(false));
    assert_eq!(term.woken(Woken::Timeout, true, t0 + PERIOD), Ok(true));
    // In flight: only the deadline bounds the wait, and nothing more is started.
    let deadline = t0 + 4 * PERIOD;
    assert_eq!(term.wait_until(Some(deadline)), Ok(deadline));
    assert_eq!(term.woken(Woken::Timeout, true, t0 + 3 * PERIOD), Ok(false));
}

#[test]
fn an_answered_renewal_schedules_the_next_one_a_period_after_the_answer() {
    let t0 = Instant::now();
    let mut term = renewing(t0);
    let answered = t0 + PERIOD + Duration::from_millis(300);
    assert_eq!(
        term.woken(Woken::Renewed(Ok(())), true, answered),
        Ok(false)
    );
    let far = t0 + 10 * PERIOD;
    assert_eq!(term.wait_until(Some(far)), Ok(answered + PERIOD));
    assert_eq!(
        term.woken(Woken::Timeout, true, answered + PERIOD),
        Ok(true)
    );
}

#[test]
fn a_renewal_that_finds_the_lock_lost_ends_the_term_with_its_reason() {
    let t0 = Instant::now();
    let mut term = renewing(t0);
    assert_eq!(
        term.woken(Woken::Renewed(Err(lost("taken over"))), true, t0 + PERIOD),
        Err(TermEnd::Lost("taken over".into()))
    );
}

#[test]
fn a_transient_failure_is_tried_again_next_period_and_named_when_the_deadline_passes() {
    let t0 = Instant::now();
    let mut term = renewing(t0);
    let failed = t0 + PERIOD;
    assert_eq!(
        term.woken(Woken::Renewed(Err(transient())), true, failed),
        Ok(false)
    );
    assert_eq!(term.woken(Woken::Timeout, true, failed + PERIOD), Ok(true));
    assert_eq!(
        term.woken(Woken::Timeout, false, failed + 2 * PERIOD),
        Err(TermEnd::BeliefEnded(format!(
            "no renewal succeeded before the renew deadline: {}",
            transient()
        )))
    );
}

#[test]
fn a_success_clears_the_last_failure() {
    let t0 = Instant::now();
    let mut term = renewing(t0);
    term.woken(Woken::Renewed(Err(transient())), true, t0 + PERIOD)
        .unwrap();
    term.woken(Woken::Timeout, true, t0 + 2 * PERIOD).unwrap();
    term.woken(Woken::Renewed(Ok(())), true, t0 + 2 * PERIOD)
        .unwrap();
    assert_eq!(
        term.woken(Woken::Timeout, false, t0 + 3 * PERIOD),
        Err(TermEnd::BeliefEnded(
            "no renewal came back before the renew deadline".into()
        ))
    );
}

#[test]
fn a_deadline_passed_with_a_renewal_stuck_ends_the_term() {
    let t0 = Instant::now();
    let mut term = renewing(t0);
    assert_eq!(
        term.woken(Woken::Timeout, false, t0 + 5 * PERIOD),
        Err(TermEnd::BeliefEnded(
            "no renewal came back before the renew deadline".into()
        ))
    );
}

#[cfg(feature = "async")]
#[test]
fn a_renewal_task_that_vanished_counts_as_a_failure() {
    let t0 = Instant::now();
    let mut term = renewing(t0);
    let answered = t0 + PERIOD;
    let vanished = Woken::RenewalVanished("task cancelled".into());
    assert_eq!(term.woken(vanished, true, answered), Ok(false));
    assert_eq!(
        term.woken(Woken::Timeout, false, answered + PERIOD),
        Err(TermEnd::BeliefEnded(
            "no renewal succeeded before the renew deadline: task cancelled".into()
        ))
    );
}

#[test]
fn a_stop_and_a_job_that_returned_end_the_term_even_while_renewing() {
    let t0 = Instant::now();
    assert_eq!(
        renewing(t0).woken(Woken::Stop, true, t0),
        Err(TermEnd::Stopped)
    );
    assert_eq!(
        renewing(t0).woken(Woken::JobEnded(Some("boom".into())), true, t0),
        Err(TermEnd::JobEnded(Some("boom".into())))
    );
}

#[test]
fn a_stepping_down_leader_tells_and_awaits_its_job_before_it_frees_the_lock() {
    let steps = TermEnd::Stopped.closing(None, PERIOD);
    assert_eq!(
        steps,
        vec![
            Closing::EndBelief,
            Closing::TellJob("the candidate is stepping down".into()),
            Closing::AwaitJob,
            Closing::Release,
            Closing::Report(LeaderEvent::SteppedDown),
            Closing::End,
        ]
    );
}

#[test]
fn a_lost_lead_is_reported_before_the_job_is_awaited_and_campaigns_again() {
    let steps = TermEnd::Lost("taken over".into()).closing(None, PERIOD);
    assert_eq!(
        steps,
        vec![
            Closing::EndBelief,
            Closing::Report(LeaderEvent::Lost {
                reason: "taken over".into()
            }),
            Closing::TellJob("the lead was lost: taken over".into()),
            Closing::AwaitJob,
            Closing::Release,
            Closing::CampaignAfter(PERIOD),
        ]
    );
}

#[test]
fn a_job_that_returned_ends_its_term_and_the_candidate_campaigns_again() {
    let steps = TermEnd::JobEnded(Some("boom".into())).closing(None, PERIOD);
    assert_eq!(
        steps,
        vec![
            Closing::EndBelief,
            Closing::TellJob("the job ended".into()),
            Closing::AwaitJob,
            Closing::Release,
            Closing::Report(LeaderEvent::JobEnded {
                panic: Some("boom".into())
            }),
            Closing::CampaignAfter(PERIOD),
        ]
    );
}

#[test]
fn a_job_that_ended_because_its_write_found_the_lock_lost_lost_the_lead() {
    let lost = Some("fence 7 was superseded".to_string());
    let steps = TermEnd::JobEnded(None).closing(lost, PERIOD);
    assert_eq!(
        steps[1],
        Closing::Report(LeaderEvent::Lost {
            reason: "fence 7 was superseded".into()
        })
    );
    assert_eq!(steps.last(), Some(&Closing::CampaignAfter(PERIOD)));
}

#[test]
fn a_lead_lost_after_a_write_found_the_lock_taken_names_the_new_holder() {
    // The job's write read the row first; the runner then saw only its belief end.
    let lost = Some("its lease ended and intruder holds it now, with fence 9".to_string());
    let steps = TermEnd::BeliefEnded("the lease was lost".into()).closing(lost, PERIOD);
    assert_eq!(
        steps[1],
        Closing::Report(LeaderEvent::Lost {
            reason: "its lease ended and intruder holds it now, with fence 9".into()
        })
    );
    // A renewal's answer from the database stays the reason: the hold's first finding
    // may say less.
    let lost = Some("its lease ended".to_string());
    let steps =
        TermEnd::Lost("its lease ended and intruder holds it now".into()).closing(lost, PERIOD);
    assert_eq!(
        steps[1],
        Closing::Report(LeaderEvent::Lost {
            reason: "its lease ended and intruder holds it now".into()
        })
    );
    // The runner's own account, when nothing else is known.
    let steps = TermEnd::BeliefEnded("the lease was lost".into()).closing(None, PERIOD);
    assert_eq!(
        steps[1],
        Closing::Report(LeaderEvent::Lost {
            reason: "the lease was lost".into()
        })
    );
    // Stepping down stays stepping down, whatever the hold learnt meanwhile.
    let lost = Some("it was released".to_string());
    let steps = TermEnd::Stopped.closing(lost, PERIOD);
    assert_eq!(steps.last(), Some(&Closing::End));
}
