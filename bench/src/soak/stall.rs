//! A run that stops making progress ends and says what it was waiting for, rather than
//! holding the test command until CI's own limit cuts it off without a word. Every call
//! the library makes has a bound (the reply timeout, the pools' checkout timeouts, the
//! lock calls' leases), so minutes without a single event are a hang, not a slow run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::history::Recorder;

/// Longer than any bounded call, and than an outage command's own waits (a failover
/// script waits up to two minutes for each of its steps while the workers are done).
pub const LIMIT: Duration = Duration::from_secs(300);

/// What the run is waiting for, named for the report of a stall, and since when: each
/// step after the workers (an outage command finishing its waits, say) gets the whole
/// [`LIMIT`].
pub struct Phase(Mutex<(&'static str, Instant)>);

impl Phase {
    pub fn new(what: &'static str) -> Self {
        Phase(Mutex::new((what, Instant::now())))
    }

    pub fn set(&self, what: &'static str) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = (what, Instant::now());
    }

    fn get(&self) -> (&'static str, Instant) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Sets `finished` when dropped, however the run's thread ends (a panic included), so
/// that the watch stops rather than report the panic as a stall.
pub struct Finished<'a>(pub &'a AtomicBool);

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Watches `recorder` until `finished`. After [`LIMIT`] without an event it prints what
/// the run was waiting for and the calls that never answered, keeps the history, and
/// ends the process with status 3.
pub fn watch(recorder: &Recorder, phase: &Phase, finished: &AtomicBool) {
    while !finished.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(200));
        let (waiting_for, since) = phase.get();
        if recorder.quiet_for().min(since.elapsed()) < LIMIT {
            continue;
        }
        let unanswered = recorder.unanswered();
        eprintln!(
            "soak: no event for {} s while waiting for {}; {} calls had not answered{}",
            LIMIT.as_secs(),
            waiting_for,
            unanswered.len(),
            if unanswered.is_empty() {
                ""
            } else {
                ", the oldest first:"
            }
        );
        for line in unanswered.iter().take(10) {
            eprintln!("  {line}");
        }
        let _ = recorder.flush();
        std::process::exit(3);
    }
}
