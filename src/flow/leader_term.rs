//! A leader's term, as a flow: when the runner wakes, when it renews, when and why the
//! term ends, and the order in which a term closes.
//!
//! The blocking candidate (a thread waiting on a channel) and the async one (a task in
//! `select!`) only wait, start each renewal on a thread or task of its own, and perform
//! the closing steps. A renewal runs beside the runner so that one stuck on a stalled
//! database never delays the end of the term at its local deadline.

use std::time::{Duration, Instant};

use crate::error::Error;

/// A change of leadership, as the runner reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaderEvent {
    /// This candidate leads now; the term's fencing token.
    Elected {
        /// Larger than every earlier term's.
        fence: i64,
    },
    /// This candidate lost the lead: a renewal failed or came too late. Stop leading.
    Lost {
        /// Why.
        reason: String,
    },
    /// This candidate stepped down on request and freed the lock (after its job, if it
    /// has one, returned).
    SteppedDown,
    /// The job of [`Candidate::start_with_job`](crate::Candidate::start_with_job)
    /// returned, or panicked, while this candidate led: the lock was freed, and the
    /// candidate campaigns again after a retry period.
    JobEnded {
        /// The panic's message, when the job panicked.
        panic: Option<String>,
    },
}

/// What woke a leading runner.
#[derive(Debug)]
pub(crate) enum Woken {
    /// Asked to step down, or the candidate is gone.
    Stop,
    /// The term's job returned; the panic's message when it panicked.
    JobEnded(Option<String>),
    /// The renewal in flight answered.
    Renewed(Result<(), Error>),
    /// The renewal in flight did not run to its end (its task was cancelled): why.
    #[cfg(feature = "async")]
    RenewalVanished(String),
    /// The wait ran out, or something of an earlier term arrived.
    Timeout,
}

/// How a term ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TermEnd {
    /// The candidate steps down on request.
    Stopped,
    /// The lead was lost: why, as the database said it (a renewal found the lock lost).
    Lost(String),
    /// The term's belief ended without the database saying why (its deadline passed, or
    /// the hold was found lost elsewhere): the runner's own account.
    BeliefEnded(String),
    /// The job returned while leading; the panic's message when it panicked.
    JobEnded(Option<String>),
}

/// A term in progress: when the next renewal is due, whether one is in flight, and why
/// the last one failed.
#[derive(Debug)]
pub(crate) struct Term {
    period: Duration,
    next: Instant,
    renewing: bool,
    last_error: Option<String>,
}

impl Term {
    /// A term elected at `now` that renews every `period`.
    pub(crate) fn begin(period: Duration, now: Instant) -> Term {
        Term {
            period,
            next: now + period,
            renewing: false,
            last_error: None,
        }
    }

    /// Until when the runner waits, given the hold's local `deadline` (`None` once the
    /// lease is lost): while a renewal is in flight only the deadline bounds the wait,
    /// else the next renewal or the deadline, whichever comes first.
    pub(crate) fn wait_until(&self, deadline: Option<Instant>) -> Result<Instant, TermEnd> {
        let deadline = deadline.ok_or_else(|| TermEnd::BeliefEnded("the lease was lost".into()))?;
        Ok(if self.renewing {
            deadline
        } else {
            self.next.min(deadline)
        })
    }

    /// What `woken` means at `now`, with the hold `held` (its local deadline not passed):
    /// the end of the term, or whether to start a renewal now (`true`; its answer comes
    /// back as [`Woken::Renewed`]). A renewal's transient failure is tried again next
    /// period, within the deadline.
    pub(crate) fn woken(
        &mut self,
        woken: Woken,
        held: bool,
        now: Instant,
    ) -> Result<bool, TermEnd> {
        match woken {
            Woken::Stop => return Err(TermEnd::Stopped),
            Woken::JobEnded(panic) => return Err(TermEnd::JobEnded(panic)),
            Woken::Renewed(Err(Error::LockLost { why, .. })) => return Err(TermEnd::Lost(why)),
            Woken::Renewed(answer) => self.answered(answer.err().map(|e| e.to_string()), now),
            #[cfg(feature = "async")]
            Woken::RenewalVanished(why) => self.answered(Some(why), now),
            Woken::Timeout => {}
        }
        if !held {
            return Err(TermEnd::BeliefEnded(match self.last_error.take() {
                Some(e) => format!("no renewal succeeded before the renew deadline: {e}"),
                None => "no renewal came back before the renew deadline".into(),
            }));
        }
        let renew = !self.renewing && now >= self.next;
        self.renewing |= renew;
        Ok(renew)
    }

    /// The renewal in flight answered at `now`, failing with `error` or not.
    fn answered(&mut self, error: Option<String>, now: Instant) {
        self.renewing = false;
        self.next = now + self.period;
        self.last_error = error;
    }
}

/// One step of closing a term, in the order [`TermEnd::closing`] gives.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Closing {
    /// Stop believing in the term (the hold and `is_leader` turn false).
    EndBelief,
    /// Send this event.
    Report(LeaderEvent),
    /// Tell the job why the term ended: its [`Held`](crate::Held) reports the loss, its
    /// sleeps end and an async job is dropped at its next `.await`.
    TellJob(String),
    /// Wait for the job to return.
    AwaitJob,
    /// Free the lock (an expired lease frees nothing; a lost connection leaves the lock to
    /// its lease). Its answer changes nothing.
    Release,
    /// Campaign again after this pause, unless stopped meanwhile.
    CampaignAfter(Duration),
    /// End the runner.
    End,
}

impl TermEnd {
    /// How the term closes, knowing why the term's hold was `lost`, if it was: belief
    /// ended; the loss reported at once; the job told and awaited; only then the lock
    /// freed, so the next leader is elected after this one's job stopped; then the runner
    /// ends or campaigns again.
    ///
    /// A hold found lost by one of the job's writes, which read the lock's row, says why
    /// better than the runner's own account (its belief ended, or its deadline passed):
    /// that reason is the term's, naming the new holder, and a job that ended because its
    /// write found the lock lost lost the lead. A renewal's answer from the database is
    /// kept as it is.
    pub(crate) fn closing(self, lost: Option<String>, retry_period: Duration) -> Vec<Closing> {
        let end = match (self, lost) {
            (TermEnd::JobEnded(_) | TermEnd::BeliefEnded(_), Some(why)) => TermEnd::Lost(why),
            (TermEnd::BeliefEnded(why), None) => TermEnd::Lost(why),
            (end, _) => end,
        };
        let mut steps = vec![Closing::EndBelief];
        let why = match &end {
            TermEnd::Stopped => "the candidate is stepping down".to_string(),
            TermEnd::Lost(reason) | TermEnd::BeliefEnded(reason) => {
                steps.push(Closing::Report(LeaderEvent::Lost {
                    reason: reason.clone(),
                }));
                format!("the lead was lost: {reason}")
            }
            TermEnd::JobEnded(_) => "the job ended".to_string(),
        };
        steps.extend([Closing::TellJob(why), Closing::AwaitJob, Closing::Release]);
        steps.extend(match end {
            TermEnd::Stopped => vec![Closing::Report(LeaderEvent::SteppedDown), Closing::End],
            TermEnd::Lost(_) | TermEnd::BeliefEnded(_) => {
                vec![Closing::CampaignAfter(retry_period)]
            }
            TermEnd::JobEnded(panic) => vec![
                Closing::Report(LeaderEvent::JobEnded { panic }),
                Closing::CampaignAfter(retry_period),
            ],
        });
        steps
    }
}

#[cfg(test)]
mod tests;
