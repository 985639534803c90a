//! Leader election on the async path: the candidate's runner, its renewals and the
//! leader's job are tokio tasks, leadership is a `watch` state, and events arrive on an
//! async channel. The safety argument and the order in which a term ends are the blocking
//! [`Candidate`](crate::Candidate)'s: the job is told (its [`Held::lost`] resolves, so it
//! is dropped at its next `.await`), awaited, and only then is the lock freed.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::locks::{AsyncLockGuard, AsyncLocks, AsyncRenewal};
use super::source::AsyncConnectionSource;
use crate::error::Error;
use crate::flow::leader_term::{Term, TermEnd, Woken};
use crate::locks::campaign::{campaign, CampaignIo};
use crate::locks::held::{first_of, Held};
use crate::locks::leader::{
    check_candidate, panic_message, ElectionTiming, LeaderEvent, Leadership, Terms,
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
        S: AsyncConnectionSource,
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
        S: AsyncConnectionSource,
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
        S: AsyncConnectionSource,
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
            runner: Some(runtime.spawn(campaign(runner, timing))),
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

/// The async runner's steps, on the candidate's task.
impl<S: AsyncConnectionSource> CampaignIo for Runner<S> {
    type Guard = AsyncLockGuard<S>;
    type Renewal = AsyncRenewal<S>;
    type Job = JoinHandle<()>;

    async fn acquire(&mut self) -> Result<AsyncLockGuard<S>, Error> {
        let timing = self.timing;
        let label = Some(self.label.as_str());
        let (name, resource) = (&self.name, &self.resource);
        (self.locks)
            .acquire(name, resource, timing.lease, label, timing.renew_deadline)
            .await
    }

    fn renewal(guard: &AsyncLockGuard<S>) -> AsyncRenewal<S> {
        guard.renewal()
    }

    /// Starts the job, if there is one, for the term `held`: it runs until it returns or
    /// the term ends ([`Held::lost`]); a panic comes back as the task's error.
    fn start_job(&self, held: Held, _fence: i64) -> Option<JoinHandle<()>> {
        let job = Arc::clone(self.job.as_ref()?);
        Some(tokio::spawn(async move {
            first_of(job(held.clone()), held.lost()).await;
        }))
    }

    /// Leads the term until it ends, as [`Term`] decides: renewals as tasks of their
    /// own, raced with a stop, the job's end and the wait's end.
    async fn lead(
        &mut self,
        renewal: &AsyncRenewal<S>,
        job: &mut Option<JoinHandle<()>>,
        _fence: i64,
    ) -> TermEnd {
        let mut term = Term::begin(self.timing.retry_period, Instant::now());
        let mut renewing: Option<JoinHandle<Result<(), Error>>> = None;
        loop {
            let wake = match term.wait_until(renewal.deadline()) {
                Ok(wake) => wake,
                Err(end) => return end,
            };
            let woken = tokio::select! {
                _ = self.stopped.wait_for(|stop| *stop) => Woken::Stop,
                ended = async { job.as_mut().expect("enabled while running").await },
                    if job.is_some() =>
                {
                    *job = None;
                    Woken::JobEnded(ended.err().filter(|e| e.is_panic()).map(|e| {
                        panic_message(e.into_panic().as_ref())
                    }))
                }
                answered = async { renewing.as_mut().expect("enabled while renewing").await },
                    if renewing.is_some() =>
                {
                    renewing = None;
                    match answered {
                        Ok(answer) => Woken::Renewed(answer),
                        Err(join) => Woken::RenewalVanished(join.to_string()),
                    }
                }
                () = tokio::time::sleep_until(wake.into()) => Woken::Timeout,
            };
            match term.woken(woken, renewal.is_held(), Instant::now()) {
                Err(end) => return end,
                Ok(false) => {}
                Ok(true) => {
                    let renewal = renewal.clone();
                    renewing = Some(tokio::spawn(async move { renewal.renew().await }));
                }
            }
        }
    }

    async fn await_job(job: JoinHandle<()>) {
        let _ = job.await;
    }

    async fn release(guard: AsyncLockGuard<S>) {
        let _ = guard.release().await;
    }

    /// Waits `period` for a stop; `true` when stopped.
    async fn wait(&mut self, period: Duration) -> bool {
        tokio::select! {
            _ = self.stopped.wait_for(|stop| *stop) => true,
            () = tokio::time::sleep(period) => false,
        }
    }

    fn report(&self, event: LeaderEvent) {
        self.leadership.send_replace(Leadership::after(&event));
        let _ = self.events.send(event);
    }

    fn terms(&self) -> &Terms {
        &self.terms
    }
}
