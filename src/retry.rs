//! When and how long to wait before running a failed operation again.
//!
//! A [`RetryPolicy`] retries what a fresh attempt can fix, a guard conflict
//! ([`Error::Conflict`]) and a transient refusal ([`Error::Retryable`]: serialization
//! failure, deadlock, lock wait timeout, SQLite busy), and nothing else: never
//! [`Error::Ambiguous`], whose write may have landed. Waits grow exponentially up to a
//! cap, each drawn uniformly from zero to that bound ("full jitter"), so writers that
//! collided once spread out instead of colliding again in step.
//!
//! The growing bounds come from `backon`'s exponential schedule; the draw below each
//! bound is this file's own (full jitter, see `Delays`). Users who already build `backoff`'s
//! `ExponentialBackoff` can hand one over with `RetryPolicy::backoff_schedule`
//! (feature `backoff`; that crate is unmaintained, so it is never on by default).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::BackoffBuilder;

use crate::error::Error;

/// One retry about to happen, as a hook sees it.
#[derive(Debug)]
pub struct RetryEvent<'a> {
    /// The attempt that failed, counting from 1.
    pub attempt: u32,
    /// Why it failed: a conflict or a transient database error.
    pub error: &'a Error,
    /// How long the policy waits before the next attempt.
    pub delay: Duration,
}

type Hook = Arc<dyn Fn(&RetryEvent<'_>) + Send + Sync>;

/// How a read-modify-write reads its row when writers collide on it.
///
/// Plain optimistic retry collapses on a hot row: every writer reads, all but one lose,
/// and the losers' retries collide again, so goodput falls and some writers starve. Once a
/// row has shown contention, taking its lock for the read costs one queue wait and wins
/// the write for sure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contention {
    /// Every attempt reads without a lock and a conflict waits and tries again: for rows
    /// that are rarely contended, or to compare against.
    Optimistic,
    /// The default. An attempt after a conflict reads the row with its lock
    /// (`SELECT ... FOR UPDATE`; on SQLite the write transaction already holds the
    /// database's write lock), so it cannot conflict again; and a row that had a conflict
    /// within `hot_for` (in this process) is read with its lock from the first attempt.
    /// Other rows keep the lock-free first read.
    LockWhenContended {
        /// How long a conflict marks its row as hot.
        hot_for: Duration,
    },
}

impl Default for Contention {
    /// [`LockWhenContended`](Self::LockWhenContended) for one second: long enough to span
    /// a burst of writers, short enough that a row goes back to lock-free reads soon
    /// after the burst.
    fn default() -> Self {
        Contention::LockWhenContended {
            hot_for: Duration::from_secs(1),
        }
    }
}

/// How often and how patiently an operation is run again after a conflict or a transient
/// database error.
///
/// # Default
///
/// [`RetryPolicy::default()`]: at most **10 attempts** within **2 seconds**; before retry
/// n a wait drawn uniformly from `[0, min(100 ms, 2 ms * 2^(n-1))]`.
///
/// - 2 ms first bound: the writer that won holds its row for one transaction of a few
///   round trips (well under a millisecond to a few milliseconds on a LAN), so the loser's
///   fresh read usually finds it committed.
/// - doubling up to 100 ms: every further conflict means more writers on the row; the
///   spread grows until they fit, and the cap keeps any single wait small next to a web
///   request's budget.
/// - 10 attempts, 2 seconds: beyond that the row is too hot for optimistic writes; the
///   caller should hear so ([`Error::RetriesExhausted`]) and switch to a one-statement
///   write or a lock rather than wait longer. With 8 writers on one row the tests see a
///   few retries per write on average, far from the bound.
/// - read-modify-writes escalate to the row lock under contention
///   ([`Contention::default`]): measured on one hot row with 16 writers, plain optimistic
///   retry loses most of its goodput and starves writers, while the escalating reads keep
///   the goodput of `SELECT ... FOR UPDATE` (BENCHMARKS.md, workload W2).
#[derive(Clone)]
pub struct RetryPolicy {
    max_attempts: u32,
    max_elapsed: Duration,
    first_delay: Duration,
    max_delay: Duration,
    multiplier: f64,
    contention: Contention,
    hook: Option<Hook>,
    #[cfg(feature = "backoff")]
    backoff: Option<backoff::ExponentialBackoff>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 10,
            max_elapsed: Duration::from_secs(2),
            first_delay: Duration::from_millis(2),
            max_delay: Duration::from_millis(100),
            multiplier: 2.0,
            contention: Contention::default(),
            hook: None,
            #[cfg(feature = "backoff")]
            backoff: None,
        }
    }
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("max_attempts", &self.max_attempts)
            .field("max_elapsed", &self.max_elapsed)
            .field("first_delay", &self.first_delay)
            .field("max_delay", &self.max_delay)
            .field("multiplier", &self.multiplier)
            .field("contention", &self.contention)
            .field("hook", &self.hook.is_some())
            .finish_non_exhaustive()
    }
}

impl RetryPolicy {
    /// One attempt and no retry: failures come back as they are.
    pub fn never() -> Self {
        RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        }
    }

    /// At most `attempts` attempts in all (at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// No retry starts once `elapsed` has passed since the first attempt began, nor one
    /// whose wait would end past it.
    pub fn max_elapsed(mut self, elapsed: Duration) -> Self {
        self.max_elapsed = elapsed;
        self
    }

    /// The bound of the first wait; each later bound is `multiplier` times the last.
    pub fn first_delay(mut self, delay: Duration) -> Self {
        self.first_delay = delay;
        self
    }

    /// The largest bound a wait can have.
    pub fn max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }

    /// How much each bound grows (at least 1).
    pub fn multiplier(mut self, multiplier: f64) -> Self {
        self.multiplier = multiplier.max(1.0);
        self
    }

    /// How read-modify-writes read a contended row (the default escalates to its lock).
    pub fn contention(mut self, contention: Contention) -> Self {
        self.contention = contention;
        self
    }

    /// The contention mode read-modify-writes run with.
    pub fn contention_mode(&self) -> Contention {
        self.contention
    }

    /// Draws the waits from `schedule` instead of this policy's own exponential schedule,
    /// for code that already tunes a `backoff::ExponentialBackoff`. The schedule is reset
    /// at the start of every run; its `max_elapsed_time`, when set, ends the run like
    /// [`max_elapsed`](Self::max_elapsed) does. The attempt and time bounds of this
    /// policy still apply.
    #[cfg(feature = "backoff")]
    pub fn backoff_schedule(mut self, schedule: backoff::ExponentialBackoff) -> Self {
        self.backoff = Some(schedule);
        self
    }

    /// Calls `hook` before each retry's wait, for logs or metrics.
    pub fn on_retry(mut self, hook: impl Fn(&RetryEvent<'_>) + Send + Sync + 'static) -> Self {
        self.hook = Some(Arc::new(hook));
        self
    }

    /// This policy, or one attempt only when `in_callers_transaction`: a retry could not
    /// roll back the caller's earlier work, so only the caller can run it again.
    pub(crate) fn one_attempt_if(&self, in_callers_transaction: bool) -> RetryPolicy {
        if in_callers_transaction {
            RetryPolicy::never()
        } else {
            self.clone()
        }
    }

    /// The most attempts this policy makes.
    pub fn attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Runs `attempt` (given its number, from 1) until it succeeds, fails for a reason a
    /// fresh attempt cannot fix, or the policy gives up ([`never`](Self::never) hands
    /// back the first failure as it is). The caller's own errors
    /// ([`Stop::Caller`]) end the run at once and come back unchanged. An attempt must
    /// start from scratch: its own transaction, its own reads.
    ///
    /// Returns the value and the number of attempts made. When the policy gives up, the
    /// error is [`Error::RetriesExhausted`] with the last attempt's error.
    pub fn run<T, E: From<Error>>(
        &self,
        mut attempt: impl FnMut(u32) -> Result<T, Stop<E>>,
    ) -> Result<(T, u32), E> {
        let mut run = self.start();
        loop {
            match attempt(run.number) {
                Ok(value) => return Ok((value, run.number)),
                Err(stop) => std::thread::sleep(run.wait_after(stop)?),
            }
        }
    }

    /// [`run`](Self::run) for async attempts: the same decisions, but the waits between
    /// attempts sleep on the tokio runtime (its timer must be on), so a retrying request
    /// never blocks the thread that serves the others. Dropping the future between two
    /// attempts stops the run; an attempt that was running is dropped as its own future
    /// would be.
    #[cfg(feature = "tokio")]
    pub async fn run_async<T, E, F, A>(&self, mut attempt: A) -> Result<(T, u32), E>
    where
        E: From<Error>,
        F: std::future::Future<Output = Result<T, Stop<E>>>,
        A: FnMut(u32) -> F,
    {
        let mut run = self.start();
        loop {
            match attempt(run.number).await {
                Ok(value) => return Ok((value, run.number)),
                Err(stop) => tokio::time::sleep(run.wait_after(stop)?).await,
            }
        }
    }

    /// A run of this policy, from now.
    pub(crate) fn start(&self) -> Run<'_> {
        Run {
            policy: self,
            started: Instant::now(),
            delays: self.delays(),
            number: 1,
            max_attempts: self.max_attempts,
            about: ("retry_policy", ""),
        }
    }

    /// Runs `attempt` until it gives something other than an error `busy` accepts, or
    /// until `wait` has passed; waits between tries as [`run`](Self::run) does, cut short
    /// so that none ends past `wait`. The last outcome comes back as it is.
    ///
    /// For loops that wait on something other than a conflict (a held lock), so every
    /// wait in the crate follows one schedule.
    #[cfg(feature = "locks")]
    pub(crate) fn poll<T>(
        &self,
        wait: Duration,
        busy: impl Fn(&Error) -> bool,
        mut attempt: impl FnMut() -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut polling = self.polling(wait);
        loop {
            match attempt() {
                Err(error) if busy(&error) => match polling.wait() {
                    Some(pause) => std::thread::sleep(pause),
                    None => return Err(error),
                },
                other => return other,
            }
        }
    }

    /// [`poll`](Self::poll) for async tries, its waits on tokio's timer.
    #[cfg(all(feature = "locks", feature = "tokio"))]
    pub(crate) async fn poll_async<T, F>(
        &self,
        wait: Duration,
        busy: impl Fn(&Error) -> bool,
        mut attempt: impl FnMut() -> F,
    ) -> Result<T, Error>
    where
        F: std::future::Future<Output = Result<T, Error>>,
    {
        let mut polling = self.polling(wait);
        loop {
            match attempt().await {
                Err(error) if busy(&error) => match polling.wait() {
                    Some(pause) => tokio::time::sleep(pause).await,
                    None => return Err(error),
                },
                other => return other,
            }
        }
    }

    /// Waiting on something for at most `wait`, from now.
    #[cfg(feature = "locks")]
    fn polling(&self, wait: Duration) -> Polling {
        Polling {
            deadline: Instant::now() + wait,
            delays: self.delays(),
        }
    }

    /// The waits this policy draws, one per retry, without its bounds on attempts and
    /// time.
    fn delays(&self) -> Delays {
        #[cfg(feature = "backoff")]
        if let Some(schedule) = &self.backoff {
            let mut schedule = schedule.clone();
            backoff::backoff::Backoff::reset(&mut schedule);
            return Delays::Backoff(schedule);
        }
        let bounds = backon::ExponentialBuilder::new()
            .with_min_delay(self.first_delay)
            .with_max_delay(self.max_delay)
            .with_factor(self.multiplier as f32)
            .without_max_times()
            .build();
        Delays::FullJitter {
            bounds,
            rng: fastrand::Rng::new(),
        }
    }
}

/// One run of a policy: its attempt number, its clock and its waits. What to do after a
/// failed attempt is decided here, whatever the attempts run on.
pub(crate) struct Run<'p> {
    policy: &'p RetryPolicy,
    started: Instant,
    delays: Delays,
    /// The attempt about to run or running, from 1.
    number: u32,
    /// The policy's bound on attempts, or 1 for a run that may not retry.
    max_attempts: u32,
    /// What the run is of, for its reports: the operation and the table.
    about: (&'static str, &'static str),
}

impl Run<'_> {
    /// The attempt about to run or running, from 1.
    pub(crate) fn number(&self) -> u32 {
        self.number
    }

    /// This run with one attempt only, its failure handed back as it is (inside a
    /// transaction the caller opened, a retry could not undo the caller's earlier work).
    pub(crate) fn only_once(mut self) -> Self {
        self.max_attempts = 1;
        self
    }

    /// This run, reported as that of `operation` (on the same table).
    pub(crate) fn named(mut self, operation: &'static str) -> Self {
        self.about.0 = operation;
        self
    }

    /// This run, reported as the retries of `operation` on `table`.
    pub(crate) fn of(mut self, operation: &'static str, table: &'static str) -> Self {
        self.about = (operation, table);
        self
    }

    /// After the current attempt stopped with `stop`: the wait before the next one (the
    /// hook has seen it), or what the run gives back.
    pub(crate) fn wait_after<E: From<Error>>(&mut self, stop: Stop<E>) -> Result<Duration, E> {
        self.wait_or_stop(stop).map_err(Stop::into_error)
    }

    /// [`wait_after`](Self::wait_after), what the run gives back still telling the
    /// library's error from the caller's.
    pub(crate) fn wait_or_stop<E>(&mut self, stop: Stop<E>) -> Result<Duration, Stop<E>> {
        self.wait_at_least_or_stop(stop, Duration::ZERO)
    }

    /// [`wait_or_stop`](Self::wait_or_stop), waiting at least `floor` before the next
    /// attempt (a failover takes seconds, not the policy's milliseconds).
    pub(crate) fn wait_at_least_or_stop<E>(
        &mut self,
        stop: Stop<E>,
        floor: Duration,
    ) -> Result<Duration, Stop<E>> {
        let policy = self.policy;
        let error = match stop {
            Stop::Caller(e) => return Err(Stop::Caller(e)),
            Stop::Occ(error) if !error.is_retryable() || self.max_attempts == 1 => {
                return Err(Stop::Occ(error))
            }
            Stop::Occ(error) => error,
        };
        let delay = match self.delays.next() {
            Some(delay) if self.number < self.max_attempts => delay.max(floor),
            _ => return Err(Stop::Occ(self.exhausted(error))),
        };
        if self.started.elapsed() + delay > policy.max_elapsed {
            return Err(Stop::Occ(self.exhausted(error)));
        }
        let retry = RetryEvent {
            attempt: self.number,
            error: &error,
            delay,
        };
        crate::telemetry::retry(self.about, &retry);
        if let Some(hook) = &policy.hook {
            hook(&retry);
        }
        self.number += 1;
        Ok(delay)
    }
}

impl Run<'_> {
    /// The policy gave up after the current attempt failed with `last`.
    fn exhausted(&self, last: Error) -> Error {
        crate::telemetry::gave_up(self.about, self.number, &last);
        exhausted(self.number, last)
    }
}

/// However the run ends, how many attempts it made.
impl Drop for Run<'_> {
    fn drop(&mut self) {
        crate::telemetry::attempts(self.about.0, self.number);
    }
}

/// Waiting on something (a held lock) until a deadline, with a policy's waits.
#[cfg(feature = "locks")]
struct Polling {
    deadline: Instant,
    delays: Delays,
}

#[cfg(feature = "locks")]
impl Polling {
    /// The pause before the next try, cut short so that none ends past the deadline;
    /// `None` once the deadline has passed.
    fn wait(&mut self) -> Option<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        Some(self.delays.next().unwrap_or(left).min(left))
    }
}

/// The waits of one run of a policy.
enum Delays {
    /// Each wait drawn uniformly from `[0, bound]`, the bounds growing exponentially up to
    /// a cap ("full jitter"). `backon`'s own jitter adds up to one bound on top of the
    /// bound (`[bound, 2 * bound)`), which keeps every waiter at least a full bound apart
    /// from the row and lets the waits pass the cap; drawing from zero spreads colliding
    /// writers best and keeps every wait under `max_delay`.
    FullJitter {
        bounds: <backon::ExponentialBuilder as BackoffBuilder>::Backoff,
        rng: fastrand::Rng,
    },
    /// The waits of a caller's `backoff::ExponentialBackoff`, as it draws them.
    #[cfg(feature = "backoff")]
    Backoff(backoff::ExponentialBackoff),
}

impl Iterator for Delays {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        match self {
            Delays::FullJitter { bounds, rng } => {
                bounds.next().map(|bound| bound.mul_f64(rng.f64()))
            }
            #[cfg(feature = "backoff")]
            Delays::Backoff(schedule) => backoff::backoff::Backoff::next_backoff(schedule),
        }
    }
}

/// Why an attempt stopped: the caller's own reason, returned unchanged, or diesel-occ's,
/// which the policy may retry.
#[derive(Debug)]
pub enum Stop<E> {
    /// The caller's closure refused ("already cancelled"): never retried.
    Caller(E),
    /// A conflict, a database error, ...: retried when [`Error::is_retryable`].
    Occ(Error),
}

impl<E: From<Error>> Stop<E> {
    /// The error the caller sees: its own unchanged, or the library's converted.
    pub(crate) fn into_error(self) -> E {
        match self {
            Stop::Caller(e) => e,
            Stop::Occ(e) => e.into(),
        }
    }
}

impl<E> From<Error> for Stop<E> {
    fn from(error: Error) -> Self {
        Stop::Occ(error)
    }
}

impl<E> From<diesel::result::Error> for Stop<E> {
    fn from(error: diesel::result::Error) -> Self {
        Stop::Occ(error.into())
    }
}

fn exhausted(attempts: u32, last: Error) -> Error {
    Error::RetriesExhausted {
        attempts,
        last: Box::new(last),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn conflict() -> Error {
        Error::Retryable {
            reason: crate::RetryReason::Deadlock,
            source: diesel::result::Error::NotFound,
        }
    }

    fn quick() -> RetryPolicy {
        RetryPolicy::default().first_delay(Duration::from_micros(10))
    }

    #[test]
    fn retries_until_success_and_counts_attempts() {
        let result: Result<_, Error> =
            quick().run(|n| if n < 3 { Err(conflict().into()) } else { Ok(n) });
        assert_eq!(result.unwrap(), (3, 3));
    }

    #[test]
    fn gives_up_after_the_attempt_bound_with_the_last_error() {
        let result: Result<((), u32), Error> =
            quick().max_attempts(4).run(|_| Err(conflict().into()));
        match result {
            Err(Error::RetriesExhausted { attempts: 4, last }) => {
                assert!(matches!(*last, Error::Retryable { .. }))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn gives_up_when_the_time_bound_passes() {
        let policy = RetryPolicy::default()
            .max_attempts(1000)
            .first_delay(Duration::from_millis(20))
            .max_elapsed(Duration::from_millis(50));
        let started = Instant::now();
        let result: Result<((), u32), Error> = policy.run(|_| Err(conflict().into()));
        assert!(
            matches!(result, Err(Error::RetriesExhausted { .. })),
            "{result:?}"
        );
        assert!(started.elapsed() < Duration::from_millis(50) + Duration::from_millis(200));
    }

    #[test]
    fn ambiguous_and_other_errors_are_not_retried() {
        let calls = AtomicU32::new(0);
        let result: Result<((), u32), Error> = quick().run(|_| {
            calls.fetch_add(1, Ordering::Relaxed);
            Err(Error::Ambiguous {
                source: diesel::result::Error::BrokenTransactionManager,
            }
            .into())
        });
        assert!(matches!(result, Err(Error::Ambiguous { .. })));
        assert_eq!(calls.load(Ordering::Relaxed), 1);
    }

    #[derive(Debug, PartialEq)]
    enum Mine {
        AlreadyCancelled,
        Occ(String),
    }

    impl From<Error> for Mine {
        fn from(e: Error) -> Self {
            Mine::Occ(e.to_string())
        }
    }

    #[test]
    fn the_callers_own_error_comes_back_unchanged() {
        let result: Result<((), u32), Mine> =
            quick().run(|_| Err(Stop::Caller(Mine::AlreadyCancelled)));
        assert_eq!(result, Err(Mine::AlreadyCancelled));
    }

    #[test]
    fn the_hook_sees_every_retry_and_waits_stay_under_their_bounds() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let policy = RetryPolicy::default()
            .first_delay(Duration::from_millis(1))
            .max_delay(Duration::from_millis(4))
            .max_attempts(6)
            .on_retry(move |e| log.lock().unwrap().push((e.attempt, e.delay)));
        let _: Result<((), u32), Error> = policy.run(|_| Err(conflict().into()));
        let seen = seen.lock().unwrap();
        assert_eq!(
            seen.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5]
        );
        for (n, delay) in seen.iter() {
            let bound = Duration::from_millis((1u64 << (n - 1)).min(4));
            assert!(
                *delay <= bound + Duration::from_micros(1),
                "retry {n}: {delay:?} > {bound:?}"
            );
        }
    }

    #[cfg(feature = "backoff")]
    #[test]
    fn a_backoff_schedule_draws_the_waits_and_is_reset_for_every_run() {
        let schedule = backoff::ExponentialBackoff {
            initial_interval: Duration::from_millis(1),
            randomization_factor: 0.0,
            multiplier: 2.0,
            max_interval: Duration::from_millis(4),
            max_elapsed_time: None,
            ..backoff::ExponentialBackoff::default()
        };
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let policy = RetryPolicy::default()
            .backoff_schedule(schedule)
            .max_attempts(5)
            .on_retry(move |e| log.lock().unwrap().push(e.delay.as_millis()));
        for _ in 0..2 {
            let _: Result<((), u32), Error> = policy.run(|_| Err(conflict().into()));
        }
        assert_eq!(*seen.lock().unwrap(), [1, 2, 4, 4, 1, 2, 4, 4]);
    }

    /// The async run decides as the blocking one does, and its waits give the thread
    /// back: on a current-thread runtime, another task runs between every two attempts.
    /// A wait that blocked the thread (`std::thread::sleep`) would let it run never.
    #[cfg(feature = "tokio")]
    #[test]
    fn async_runs_wait_on_the_runtime_and_decide_like_blocking_ones() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async {
            let ticks = std::sync::Arc::new(AtomicU32::new(0));
            let ticker = tokio::spawn({
                let ticks = std::sync::Arc::clone(&ticks);
                async move {
                    loop {
                        ticks.fetch_add(1, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                    }
                }
            });
            let policy = quick().max_delay(Duration::from_millis(5));
            let mut seen = Vec::new();
            let outcome: Result<(u32, u32), Error> = policy
                .run_async(|number| {
                    seen.push(ticks.load(Ordering::SeqCst));
                    async move {
                        if number < 4 {
                            Err(Stop::Occ(conflict()))
                        } else {
                            Ok(number)
                        }
                    }
                })
                .await;
            assert_eq!(outcome.unwrap(), (4, 4));
            assert!(
                seen.windows(2).all(|w| w[1] > w[0]),
                "another task ran during every wait: {seen:?}"
            );

            let never: Result<((), u32), Error> = RetryPolicy::never()
                .run_async(|_| async { Err(Stop::Occ(conflict())) })
                .await;
            assert!(matches!(never, Err(Error::Retryable { .. })), "{never:?}");
            let bounded: Result<((), u32), Error> = quick()
                .max_attempts(3)
                .run_async(|_| async { Err(Stop::Occ(conflict())) })
                .await;
            assert!(
                matches!(bounded, Err(Error::RetriesExhausted { attempts: 3, .. })),
                "{bounded:?}"
            );
            ticker.abort();
        });
    }
}
