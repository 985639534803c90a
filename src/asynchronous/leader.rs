//! Leader election on the async path: the candidate's runner, its renewals and the
//! leader's job are tokio tasks, leadership is a `watch` state, and events arrive on an
//! async channel. The safety argument and the order in which a term ends are the blocking
//! [`Candidate`](crate::Candidate)'s: the job is told (its [`Held::lost`] resolves, so it
//! is dropped at its next `.await`), awaited, and only then is the lock freed.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::locks::{AsyncLockPool, AsyncLocks, AsyncRenewal};
use crate::error::Error;
use crate::locks::held::{first_of, Held, Loss};
use crate::locks::leader::{
    check_candidate, panic_message, ElectionTiming, LeaderEvent, Leadership, TermEnd, Terms,
};

/// A leader's job on the async path: a future per term.
type AsyncJob =
    Arc<dyn Fn(Held) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A candidate running for leadership as a tokio task.
pub struct AsyncCandidate {
    terms: Terms,
    events: mpsc::UnboundedReceiver<LeaderEvent>,
    leadership: watch::Receiver<Leadership>,
    stop: watch::Sender<bool>,
    runner: Option<JoinHandle<()>>,
}

impl AsyncCandidate {
    /// Starts campaigning for lock `(name, resource)` on a task of the current tokio
    /// runtime; `label` names this candidate in the lock table.
    pub fn start<S>(
        locks: AsyncLocks<S>,
        name: &str,
        resource: &str,
        label: &str,
        timing: ElectionTiming,
    ) -> Result<AsyncCandidate, Error>
    where
        S: AsyncLockPool,
    {
        Self::campaign(locks, name, resource, label, timing, None)
    }

    /// [`start`](Self::start), and while this candidate leads, `job(held)` runs as a task
    /// once per term. When the term ends (stop, lost lead) the job's future is dropped at
    /// its next `.await`, and only after it is gone is the lock freed. A job that returns
    /// (or panics) while leading ends its term: [`LeaderEvent::JobEnded`], the lock is
    /// freed and the candidate campaigns again after a retry period. Work the job spawned
    /// elsewhere is not cancelled with it: keep the protected work inside its future.
    pub fn start_with_job<S, F>(
        locks: AsyncLocks<S>,
        name: &str,
        resource: &str,
        label: &str,
        timing: ElectionTiming,
        job: impl Fn(Held) -> F + Send + Sync + 'static,
    ) -> Result<AsyncCandidate, Error>
    where
        S: AsyncLockPool,
        F: Future<Output = ()> + Send + 'static,
    {
        let job: AsyncJob = Arc::new(move |held| Box::pin(job(held)));
        Self::campaign(locks, name, resource, label, timing, Some(job))
    }

    fn campaign<S>(
        locks: AsyncLocks<S>,
        name: &str,
        resource: &str,
        label: &str,
        timing: ElectionTiming,
        job: Option<AsyncJob>,
    ) -> Result<AsyncCandidate, Error>
    where
        S: AsyncLockPool,
    {
        check_candidate(name, resource, label, &timing)?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::InvalidSetting {
            what: "async candidate",
            reason: "AsyncCandidate is started from inside a tokio runtime".into(),
        })?;
        let terms = Terms::default();
        let (events_in, events) = mpsc::unbounded_channel();
        let (leadership_in, leadership) = watch::channel(Leadership::Following);
        let (stop, stopped) = watch::channel(false);
        let runner = Runner {
            locks,
            name: name.to_string(),
            resource: resource.to_string(),
            label: label.to_string(),
            timing,
            job,
            terms: terms.clone(),
            events: events_in,
            leadership: leadership_in,
            stopped,
        };
        Ok(AsyncCandidate {
            terms,
            events,
            leadership,
            stop,
            runner: Some(runtime.spawn(runner.run())),
        })
    }

    /// Whether this candidate leads now: elected, and its local deadline not passed. It
    /// turns false at the deadline by itself, even while a renewal is stuck.
    pub fn is_leader(&self) -> bool {
        self.terms.is_leader()
    }

    /// The local deadline of the current term while this candidate leads.
    pub fn deadline(&self) -> Option<Instant> {
        self.terms.deadline()
    }

    /// The fencing token of this candidate's current or last term.
    pub fn fence(&self) -> i64 {
        self.terms.fence()
    }

    /// Leadership as a `watch` channel: `wait_for(|l| l != &Leadership::Following)` waits
    /// for a term, `changed()` for any change; a receiver sees the latest state.
    pub fn leadership(&self) -> watch::Receiver<Leadership> {
        self.leadership.clone()
    }

    /// The next leadership change, in order; `None` once the runner ended and every event
    /// was received.
    pub async fn next_event(&mut self) -> Option<LeaderEvent> {
        self.events.recv().await
    }

    /// Steps down (the job, if running, cancelled and awaited, then the lock freed) and
    /// ends the runner. Returns the events not received yet, in order; when this candidate
    /// led, the last is [`LeaderEvent::SteppedDown`], sent after the lock was freed.
    pub async fn stop(mut self) -> Vec<LeaderEvent> {
        self.stop.send_replace(true);
        if let Some(runner) = self.runner.take() {
            let _ = runner.await;
        }
        let mut left = Vec::new();
        while let Ok(event) = self.events.try_recv() {
            left.push(event);
        }
        left
    }
}

impl Drop for AsyncCandidate {
    /// Tells the runner to step down; it does so on its own task (dropping cannot wait).
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

impl std::fmt::Debug for AsyncCandidate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncCandidate")
            .field("leader", &self.is_leader())
            .field("fence", &self.fence())
            .finish_non_exhaustive()
    }
}

/// The candidate's task: campaigns, then leads until stopped or lost, then campaigns
/// again. Renewals run as tasks of their own, so that a renewal stuck on a stalled
/// database never delays the loss of leadership at the deadline.
struct Runner<S> {
    locks: AsyncLocks<S>,
    name: String,
    resource: String,
    label: String,
    timing: ElectionTiming,
    job: Option<AsyncJob>,
    terms: Terms,
    events: mpsc::UnboundedSender<LeaderEvent>,
    leadership: watch::Sender<Leadership>,
    stopped: watch::Receiver<bool>,
}

impl<S: AsyncLockPool> Runner<S> {
    fn report(&self, event: LeaderEvent) {
        self.leadership.send_replace(Leadership::after(&event));
        let _ = self.events.send(event);
    }

    async fn run(mut self) {
        let timing = self.timing;
        loop {
            // Campaign: try now, then every retry period.
            let elected = self
                .locks
                .acquire(
                    &self.name,
                    &self.resource,
                    timing.lease,
                    Some(&self.label),
                    timing.renew_deadline,
                )
                .await;
            let Ok(guard) = elected else {
                if self.wait(timing.retry_period).await {
                    return;
                }
                continue;
            };
            let renewal = guard.renewal();
            self.terms.begin(renewal.belief(), guard.fence());
            self.report(LeaderEvent::Elected {
                fence: guard.fence(),
            });
            let loss = Loss::new();
            let mut job = self.start_job(renewal.held(Arc::clone(&loss)));
            let end = self.lead(&renewal, &mut job).await.given(&loss);
            renewal.end();
            self.terms.end();
            // The job stops before the lock is given up: told, awaited, then the release.
            if let Some(lost) = end.lost_event() {
                self.report(lost);
            }
            loss.set(end.why());
            if let Some(job) = job {
                let _ = job.await;
            }
            // An expired lease frees nothing; a lost connection leaves it to its lease.
            let _ = guard.release().await;
            match end {
                TermEnd::Stopped => {
                    self.report(LeaderEvent::SteppedDown);
                    return;
                }
                TermEnd::Lost(_) => {}
                TermEnd::JobEnded(panic) => self.report(LeaderEvent::JobEnded { panic }),
            }
            if self.wait(timing.retry_period).await {
                return;
            }
        }
    }

    /// Starts the job, if there is one, for the term `held`: it runs until it returns or
    /// the term ends ([`Held::lost`]); a panic comes back as the task's error.
    fn start_job(&self, held: Held) -> Option<JoinHandle<()>> {
        let job = Arc::clone(self.job.as_ref()?);
        Some(tokio::spawn(async move {
            first_of(job(held.clone()), held.lost()).await;
        }))
    }

    /// Waits `period` for a stop; `true` when stopped.
    async fn wait(&mut self, period: std::time::Duration) -> bool {
        tokio::select! {
            _ = self.stopped.wait_for(|stop| *stop) => true,
            () = tokio::time::sleep(period) => false,
        }
    }

    /// Leads the term, renewing every retry period, until stopped, lost or the job ended.
    async fn lead(
        &mut self,
        renewal: &AsyncRenewal<S>,
        job: &mut Option<JoinHandle<()>>,
    ) -> TermEnd {
        let period = self.timing.retry_period;
        let mut next = Instant::now() + period;
        let mut renewing: Option<JoinHandle<Result<(), Error>>> = None;
        let mut last_error: Option<String> = None;
        loop {
            let Some(deadline) = renewal.deadline() else {
                return TermEnd::Lost("the lease was lost".into());
            };
            let wake = if renewing.is_some() {
                deadline
            } else {
                next.min(deadline)
            };
            tokio::select! {
                _ = self.stopped.wait_for(|stop| *stop) => return TermEnd::Stopped,
                ended = async { job.as_mut().expect("enabled while running").await },
                    if job.is_some() =>
                {
                    *job = None;
                    let panic = ended.err().filter(|e| e.is_panic()).map(|e| {
                        panic_message(e.into_panic().as_ref())
                    });
                    return TermEnd::JobEnded(panic);
                }
                renewed = async { renewing.as_mut().expect("enabled while renewing").await },
                    if renewing.is_some() =>
                {
                    renewing = None;
                    next = Instant::now() + period;
                    match renewed {
                        Ok(Ok(())) => last_error = None,
                        Ok(Err(Error::LockLost { why, .. })) => return TermEnd::Lost(why),
                        // Transient: try again next period, within the deadline.
                        Ok(Err(e)) => last_error = Some(e.to_string()),
                        Err(join) => last_error = Some(join.to_string()),
                    }
                }
                () = tokio::time::sleep_until(wake.into()) => {}
            }
            if !renewal.is_held() {
                return TermEnd::unrenewed(last_error);
            }
            if renewing.is_none() && Instant::now() >= next {
                let renewal = renewal.clone();
                renewing = Some(tokio::spawn(async move { renewal.renew().await }));
            }
        }
    }
}
