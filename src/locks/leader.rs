//! Leader election: one runner per candidate campaigns for a lock, renews it
//! while it leads, steps down on shutdown or a lost renewal, and tells the application
//! when it gains or loses leadership.
//!
//! Safety: at most one candidate holds the lock at a time by the database's clock (the
//! acquisition is one compare-and-set against `expires_at`, computed after every wait),
//! and each term's fencing token is larger than every earlier one. A leader believes it
//! leads until a local deadline: `renew_deadline` after the instant before its last
//! successful renewal (or election) was requested, on its monotonic clock, and never
//! longer than the lease less the safety margin. [`Candidate::is_leader`] turns false at
//! that deadline by itself, even while a renewal is stuck on a stalled database, and the
//! [`LeaderEvent::Lost`] event is sent then; a renewal that comes back later does not make
//! it leader again. So a leader cut off from the database stops before its lease ends and
//! another can be elected. A leader paused longer than that (a stopped process) can still
//! act on stale belief when it wakes, which is what the fence is for: storage that checks
//! fences ([`FencedWrite`](crate::FencedWrite)) refuses its writes.

use std::future::{ready, Future};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::connect::source::ConnectionSource;

use crate::drive::now;
use crate::error::Error;
pub use crate::flow::leader_term::LeaderEvent;
use crate::flow::leader_term::{Term, TermEnd, Woken};
use crate::locks::belief::Belief;
use crate::locks::campaign::{campaign, CampaignIo};
use crate::locks::held::Held;
use crate::locks::lock::{LockConnection, LockGuard, Locks, Renewal};

/// A leader's job: run on a thread of its own for each term; see
/// [`Candidate::start_with_job`].
type Job = Arc<dyn Fn(&Held) + Send + Sync>;

/// The timing of an election, as client-go's leader election has it.
#[derive(Debug, Clone, Copy)]
pub struct ElectionTiming {
    /// How long a term lasts without renewal: how long the others wait for a dead leader.
    pub lease: Duration,
    /// A leader that has not renewed for this long steps down (shorter than `lease`).
    pub renew_deadline: Duration,
    /// How often a candidate tries to be elected, and a leader renews.
    pub retry_period: Duration,
}

impl Default for ElectionTiming {
    /// 15 s, 10 s, 2 s: client-go's defaults.
    fn default() -> Self {
        ElectionTiming {
            lease: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl ElectionTiming {
    /// `lease > renew_deadline > retry_period * 1.2` and `retry_period <= lease / 3`, so
    /// that a leader gets several tries to renew before it must step down, steps down
    /// before its lease ends, and a waiting candidate tries several times per lease.
    pub fn validate(&self) -> Result<(), Error> {
        let invalid = |reason: String| {
            Err(Error::InvalidSetting {
                what: "election timing",
                reason,
            })
        };
        if self.retry_period.is_zero() {
            return invalid("the retry period must be above zero".into());
        }
        if self.lease <= self.renew_deadline {
            return invalid(format!(
                "the lease ({:?}) must be longer than the renew deadline ({:?})",
                self.lease, self.renew_deadline
            ));
        }
        if self.retry_period.as_secs_f64() * 3.0 > self.lease.as_secs_f64() {
            return invalid(format!(
                "the retry period ({:?}) must be at most a third of the lease ({:?}), so that a \
                 waiting candidate tries several times within one lease",
                self.retry_period, self.lease
            ));
        }
        if self.renew_deadline.as_secs_f64() <= self.retry_period.as_secs_f64() * 1.2 {
            return invalid(format!(
                "the renew deadline ({:?}) must be longer than 1.2 x the retry period ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        Ok(())
    }
}

/// Whether a candidate leads, as [`Candidate::leadership`] shows it to async code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leadership {
    /// Not leading: campaigning, stepped down, or lost at the deadline.
    Following,
    /// Leading the term with this fencing token.
    Leading {
        /// The term's fence.
        fence: i64,
    },
}

/// A candidate running for leadership on its own thread.
pub struct Candidate {
    terms: Terms,
    events: Receiver<LeaderEvent>,
    #[cfg(feature = "tokio")]
    leadership: tokio::sync::watch::Receiver<Leadership>,
    signals: Sender<Signal>,
    thread: Option<JoinHandle<()>>,
}

/// What the runner waits for.
enum Signal {
    /// Step down and end.
    Stop,
    /// A renewal of the term with this fence came back.
    Renewed(i64, Result<(), Error>),
    /// The job of the term with this fence returned (with a panic's message).
    JobEnded(i64, Option<String>),
}

impl Candidate {
    /// Starts campaigning for lock `(name, resource)`; `label` names this candidate in the
    /// lock table. Events arrive on [`events`](Self::events).
    pub fn start<S>(
        locks: Locks<S>,
        name: &str,
        resource: &str,
        label: &str,
        timing: ElectionTiming,
    ) -> Result<Candidate, Error>
    where
        S: ConnectionSource,
        S::Connection: LockConnection,
    {
        Self::campaign(locks, name, resource, label, timing, None)
    }

    /// [`start`](Self::start), and while this candidate leads, `job` runs on a thread of
    /// its own, once per term, with the term's [`Held`] lock: its fence,
    /// [`Held::check`] and [`Held::sleep`] (which end as soon as the term does) and
    /// [`Held::write_while_held`] (which the database refuses once the term is over).
    ///
    /// A term ends in this order, on [`stop`](Self::stop) and on a lost lead alike: the
    /// job is told (its `check` fails and its `sleep` returns at once), the runner waits
    /// for it to return, and only then frees the lock. So the next leader is elected only
    /// after this one's job stopped, unless the job ignores the signal for longer than
    /// the lease (then its `write_while_held` writes are refused). On a lost lead,
    /// [`LeaderEvent::Lost`] is sent at the deadline, before the wait. A job that returns
    /// (or panics) while leading ends its term: [`LeaderEvent::JobEnded`], the lock is
    /// freed and the candidate campaigns again. Loop inside the job for work that lasts
    /// the whole term. [`stop`](Self::stop) and dropping the candidate wait for the job
    /// too, without a time limit: a job must look at `check` or `sleep` between steps,
    /// and bound its own blocking calls.
    pub fn start_with_job<S>(
        locks: Locks<S>,
        name: &str,
        resource: &str,
        label: &str,
        timing: ElectionTiming,
        job: impl Fn(&Held) + Send + Sync + 'static,
    ) -> Result<Candidate, Error>
    where
        S: ConnectionSource,
        S::Connection: LockConnection,
    {
        Self::campaign(locks, name, resource, label, timing, Some(Arc::new(job)))
    }

    /// [`start_with_job`](Self::start_with_job) for an async job: while this candidate
    /// leads, `job(held)` runs once per term, driven on a thread of its own within the
    /// tokio runtime `start_with_async_job` is called from (its timers and sockets work;
    /// tasks it spawns run on that runtime as usual). When the term ends (stop, lost lead)
    /// the job's future is dropped at its next `.await` ([`Held::lost`] resolves), and only
    /// after it is gone is the lock freed; a job that returns or panics ends its term as in
    /// [`start_with_job`](Self::start_with_job). Work the job spawned elsewhere is not
    /// cancelled with it: keep the protected work inside the job's own future.
    ///
    /// [`Error::InvalidSetting`] outside a tokio runtime.
    #[cfg(feature = "tokio")]
    pub fn start_with_async_job<S, F>(
        locks: Locks<S>,
        name: &str,
        resource: &str,
        label: &str,
        timing: ElectionTiming,
        job: impl Fn(Held) -> F + Send + Sync + 'static,
    ) -> Result<Candidate, Error>
    where
        S: ConnectionSource,
        S::Connection: LockConnection,
        F: std::future::Future<Output = ()>,
    {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::InvalidSetting {
            what: "async job",
            reason:
                "start_with_async_job is called from inside the tokio runtime that drives the job"
                    .into(),
        })?;
        let driven = move |held: &Held| {
            let work = job(held.clone());
            runtime.block_on(crate::locks::held::first_of(work, held.lost()));
        };
        Self::campaign(locks, name, resource, label, timing, Some(Arc::new(driven)))
    }

    fn campaign<S>(
        locks: Locks<S>,
        name: &str,
        resource: &str,
        label: &str,
        timing: ElectionTiming,
        job: Option<Job>,
    ) -> Result<Candidate, Error>
    where
        S: ConnectionSource,
        S::Connection: LockConnection,
    {
        check_candidate(name, resource, label, &timing)?;
        let terms = Terms::default();
        let (events_in, events) = channel();
        let (signals, received) = channel::<Signal>();
        #[cfg(feature = "tokio")]
        let (leadership_in, leadership) = tokio::sync::watch::channel(Leadership::Following);
        let runner = Runner {
            locks,
            name: name.to_string(),
            resource: resource.to_string(),
            label: label.to_string(),
            timing,
            job,
            terms: terms.clone(),
            events: events_in,
            #[cfg(feature = "tokio")]
            leadership: leadership_in,
            signals: signals.clone(),
            received,
        };
        let thread = crate::connect::source::spawn_in_runtime(move || runner.run());
        Ok(Candidate {
            terms,
            events,
            #[cfg(feature = "tokio")]
            leadership,
            signals,
            thread: Some(thread),
        })
    }

    /// Whether this candidate leads now: elected, and its local deadline not passed.
    /// It turns false at the deadline by itself, even while a renewal is stuck.
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

    /// Leadership changes, in order.
    pub fn events(&self) -> &Receiver<LeaderEvent> {
        &self.events
    }

    /// Leadership as a tokio `watch` channel (feature `tokio`), for async code that must
    /// not block on [`events`](Self::events): `leadership().wait_for(|l| l != &Following)`
    /// waits for the next term, `changed()` for any change. It changes when the events are
    /// sent: to [`Leadership::Leading`] on election, back to
    /// [`Leadership::Following`] at the term's deadline, on stepping down and when a job
    /// ends its term. A receiver sees the latest state, not every change in between.
    #[cfg(feature = "tokio")]
    pub fn leadership(&self) -> tokio::sync::watch::Receiver<Leadership> {
        self.leadership.clone()
    }

    /// Steps down (freeing the lock if it leads) and ends the runner. Returns the events
    /// the runner sent that were not received yet, in order; when this candidate led, the
    /// last is [`LeaderEvent::SteppedDown`], sent after the lock was freed.
    pub fn stop(mut self) -> Vec<LeaderEvent> {
        self.shut_down();
        self.events.try_iter().collect()
    }

    fn shut_down(&mut self) {
        let _ = self.signals.send(Signal::Stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The candidate's thread: campaigns, then leads until stopped or lost, then campaigns
/// again. Renewals run on threads of their own, so that a renewal stuck on a stalled
/// database never delays the loss of leadership at the deadline.
struct Runner<S: ConnectionSource> {
    locks: Locks<S>,
    name: String,
    resource: String,
    label: String,
    timing: ElectionTiming,
    job: Option<Job>,
    terms: Terms,
    events: Sender<LeaderEvent>,
    #[cfg(feature = "tokio")]
    leadership: tokio::sync::watch::Sender<Leadership>,
    signals: Sender<Signal>,
    received: Receiver<Signal>,
}

/// A candidate's current term as the candidate and its runner share it: the belief of the
/// term while it leads, and the fence of its current or last term.
#[derive(Debug, Clone, Default)]
pub(crate) struct Terms {
    belief: Arc<Mutex<Option<Arc<Belief>>>>,
    fence: Arc<AtomicI64>,
}

impl Terms {
    /// A term with `fence` began, believed as `belief` says.
    pub(crate) fn begin(&self, belief: Arc<Belief>, fence: i64) {
        *lock(&self.belief) = Some(belief);
        self.fence.store(fence, Ordering::SeqCst);
    }

    /// The term ended.
    pub(crate) fn end(&self) {
        *lock(&self.belief) = None;
    }

    /// Whether the candidate leads now: elected, and its local deadline not passed.
    pub(crate) fn is_leader(&self) -> bool {
        lock(&self.belief)
            .as_ref()
            .is_some_and(|belief| belief.is_held())
    }

    /// The local deadline of the current term while the candidate leads.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        lock(&self.belief)
            .as_ref()
            .and_then(|belief| belief.deadline())
    }

    /// The fencing token of the current or last term.
    pub(crate) fn fence(&self) -> i64 {
        self.fence.load(Ordering::SeqCst)
    }
}

/// Checks a candidate's names and timing.
pub(crate) fn check_candidate(
    name: &str,
    resource: &str,
    label: &str,
    timing: &ElectionTiming,
) -> Result<(), Error> {
    timing.validate()?;
    crate::sql::names::check_name("lock name", name)?;
    crate::sql::names::check_name("resource", resource)?;
    crate::sql::names::check_name("label", label)?;
    Ok(())
}

#[cfg(feature = "tokio")]
impl Leadership {
    /// The leadership after `event`.
    pub(crate) fn after(event: &LeaderEvent) -> Leadership {
        match event {
            LeaderEvent::Elected { fence } => Leadership::Leading { fence: *fence },
            _ => Leadership::Following,
        }
    }
}

impl<S> Runner<S>
where
    S: ConnectionSource,
    S::Connection: LockConnection,
{
    fn run(self) {
        let timing = self.timing;
        now(campaign(self, timing));
    }
}

/// The blocking runner's steps: each call returns when it is done (`recv_timeout` waits),
/// so the campaign's future is always ready.
impl<S> CampaignIo for Runner<S>
where
    S: ConnectionSource,
    S::Connection: LockConnection,
{
    type Guard = LockGuard<S>;
    type Renewal = Renewal<S>;
    type Job = JoinHandle<()>;

    fn acquire(&mut self) -> impl Future<Output = Result<LockGuard<S>, Error>> {
        let timing = self.timing;
        ready(self.locks.acquire(
            &self.name,
            &self.resource,
            timing.lease,
            Some(&self.label),
            timing.renew_deadline,
        ))
    }

    fn renewal(guard: &LockGuard<S>) -> Renewal<S> {
        guard.renewal()
    }

    /// Starts the job, if there is one, for the term with `fence`; it tells the runner
    /// when it returns.
    fn start_job(&self, held: Held, fence: i64) -> Option<JoinHandle<()>> {
        let job = Arc::clone(self.job.as_ref()?);
        let signals = self.signals.clone();
        Some(crate::connect::source::spawn_in_runtime(move || {
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&held)));
            let panic = ran.err().map(|payload| panic_message(payload.as_ref()));
            let _ = signals.send(Signal::JobEnded(fence, panic));
        }))
    }

    /// Leads the term with `fence` until it ends, as [`Term`] decides: renewals on
    /// threads of their own, their answers and the job's end as signals.
    fn lead(
        &mut self,
        renewal: &Renewal<S>,
        _job: &mut Option<JoinHandle<()>>,
        fence: i64,
    ) -> impl Future<Output = TermEnd> {
        let mut term = Term::begin(self.timing.retry_period, Instant::now());
        ready(loop {
            let wake = match term.wait_until(renewal.deadline()) {
                Ok(wake) => wake,
                Err(end) => break end,
            };
            let woken = match self
                .received
                .recv_timeout(wake.saturating_duration_since(Instant::now()))
            {
                Ok(Signal::Stop) | Err(RecvTimeoutError::Disconnected) => Woken::Stop,
                Ok(Signal::Renewed(of, _) | Signal::JobEnded(of, _)) if of != fence => {
                    Woken::Timeout
                }
                Ok(Signal::JobEnded(_, panic)) => Woken::JobEnded(panic),
                Ok(Signal::Renewed(_, answer)) => Woken::Renewed(answer),
                Err(RecvTimeoutError::Timeout) => Woken::Timeout,
            };
            match term.woken(woken, renewal.is_held(), Instant::now()) {
                Err(end) => break end,
                Ok(false) => {}
                Ok(true) => {
                    let (renewal, signals) = (renewal.clone(), self.signals.clone());
                    crate::connect::source::spawn_in_runtime(move || {
                        let _ = signals.send(Signal::Renewed(fence, renewal.renew()));
                    });
                }
            }
        })
    }

    fn await_job(job: JoinHandle<()>) -> impl Future<Output = ()> {
        let _ = job.join();
        ready(())
    }

    fn release(guard: LockGuard<S>) -> impl Future<Output = ()> {
        let _ = guard.release();
        ready(())
    }

    /// Waits `period` for a stop; `true` when stopped. Late renewals of ended terms are
    /// passed over.
    fn wait(&mut self, period: Duration) -> impl Future<Output = bool> {
        let until = Instant::now() + period;
        ready(loop {
            match self
                .received
                .recv_timeout(until.saturating_duration_since(Instant::now()))
            {
                Ok(Signal::Stop) | Err(RecvTimeoutError::Disconnected) => break true,
                Ok(Signal::Renewed(..) | Signal::JobEnded(..)) => continue,
                Err(RecvTimeoutError::Timeout) => break false,
            }
        })
    }

    fn report(&self, event: LeaderEvent) {
        #[cfg(feature = "tokio")]
        self.leadership.send_replace(Leadership::after(&event));
        let _ = self.events.send(event);
    }

    fn terms(&self) -> &Terms {
        &self.terms
    }
}

/// A panic's message, when it is a string.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drop for Candidate {
    fn drop(&mut self) {
        self.shut_down();
    }
}

impl std::fmt::Debug for Candidate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Candidate")
            .field("leading", &self.is_leader())
            .field("fence", &self.fence())
            .finish_non_exhaustive()
    }
}
