//! A candidate's campaign, written once for both runners (threads and channels on the
//! blocking API, tokio tasks on the async one): campaign, lead the term until it ends,
//! then close it in the order the term's end gives ([`TermEnd::closing`]) and campaign
//! again. How a runner waits, renews and runs the job is its own; the order of the steps
//! is here.

use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::flow::leader_term::{Closing, LeaderEvent, TermEnd};
use crate::locks::held::{Held, Loss};
use crate::locks::leader::{ElectionTiming, Terms};
use crate::locks::lock::Hold;

/// What a candidate's runner does on its driver.
pub(crate) trait CampaignIo {
    /// A lock held for a term.
    type Guard;
    /// The term's renewal, shared with whatever renews it.
    type Renewal: Deref<Target = Hold>;
    /// A term's running job.
    type Job;

    /// Tries to take the lock for a term.
    fn acquire(&mut self) -> impl Future<Output = Result<Self::Guard, Error>>;

    /// The renewal of the term `guard` holds.
    fn renewal(guard: &Self::Guard) -> Self::Renewal;

    /// Starts the job, if there is one, for the term with `fence`.
    fn start_job(&self, held: Held, fence: i64) -> Option<Self::Job>;

    /// Leads the term with `fence` until it ends, as its [`Term`](crate::flow::leader_term::Term)
    /// decides.
    fn lead(
        &mut self,
        renewal: &Self::Renewal,
        job: &mut Option<Self::Job>,
        fence: i64,
    ) -> impl Future<Output = TermEnd>;

    /// Waits for the job to be gone.
    fn await_job(job: Self::Job) -> impl Future<Output = ()>;

    /// Frees the lock, best effort.
    fn release(guard: Self::Guard) -> impl Future<Output = ()>;

    /// Waits `period` for a stop; `true` when stopped.
    fn wait(&mut self, period: Duration) -> impl Future<Output = bool>;

    /// Tells the application.
    fn report(&self, event: LeaderEvent);

    /// The terms the candidate shows.
    fn terms(&self) -> &Terms;
}

/// Campaigns until stopped: each term led, then closed, in the order its end gives.
pub(crate) async fn campaign<I: CampaignIo>(mut io: I, timing: ElectionTiming) {
    loop {
        // Campaign: try now, then every retry period.
        let Ok(guard) = io.acquire().await else {
            if io.wait(timing.retry_period).await {
                return;
            }
            continue;
        };
        let renewal = I::renewal(&guard);
        let fence = renewal.fence;
        io.terms().begin(renewal.belief(), fence);
        report(&io, &renewal, LeaderEvent::Elected { fence });
        let loss = Loss::new();
        let mut job = io.start_job(renewal.held(Arc::clone(&loss)), fence);
        let mut guard = Some(guard);
        let end = io.lead(&renewal, &mut job, fence).await;
        for step in end.closing(loss.why(), timing.retry_period) {
            match step {
                Closing::EndBelief => {
                    renewal.end();
                    io.terms().end();
                }
                Closing::Report(event) => report(&io, &renewal, event),
                Closing::TellJob(why) => loss.set(why),
                Closing::AwaitJob => {
                    if let Some(job) = job.take() {
                        I::await_job(job).await;
                    }
                }
                Closing::Release => {
                    if let Some(guard) = guard.take() {
                        I::release(guard).await;
                    }
                }
                Closing::CampaignAfter(pause) => {
                    if io.wait(pause).await {
                        return;
                    }
                }
                Closing::End => return,
            }
        }
    }
}

/// Tells the application, and the telemetry, what happened to the term of `renewal`.
fn report<I: CampaignIo>(io: &I, renewal: &I::Renewal, event: LeaderEvent) {
    crate::telemetry::leadership(&renewal.key, &event);
    io.report(event);
}
