//! What a holder may believe about its lease, by its own monotonic clock.
//!
//! The database decides who holds a lock, by its own clock; the holder cannot ask before
//! every step of its work, so it keeps a local deadline that ends before the database's
//! lease does:
//!
//! - it is measured from the instant *before* the request that granted or renewed the
//!   lease was sent. The database computed the expiry after that instant (after every
//!   wait of the statement), so however long the request and its reply took, the lease
//!   by the database's clock ends later than the belief;
//! - it stops a safety margin ([`SAFETY_MARGIN`], a tenth of the lease) short of the
//!   lease, for the two clocks running at slightly different rates and for the step the
//!   holder is in when the deadline passes;
//! - it only moves on while it has not passed: a renewal that comes back after the
//!   deadline does not bring it back. Between the deadline and that reply another holder
//!   may have been told the lock is free, since the holder's last grant may have ended.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The share of a lease that a holder's belief gives up at its end: a tenth.
pub const SAFETY_MARGIN: f64 = 0.1;

/// How long a holder believes a lease of `ttl` holds: the lease less the safety margin.
pub(crate) fn believed(ttl: Duration) -> Duration {
    ttl.mul_f64(1.0 - SAFETY_MARGIN)
}

/// A holder's belief in its lease: a deadline on this process's monotonic clock, shared by
/// the holder and whatever renews for it.
#[derive(Debug)]
pub(crate) struct Belief {
    /// The instant deadlines are counted from.
    base: Instant,
    /// The deadline, in nanoseconds after `base`; 0 once the belief ended.
    until: AtomicU64,
    /// How long each grant or renewal is believed, from before its request.
    length: Duration,
    /// Whether the loss of the grant has been reported (a renewal, the keep-alive and the
    /// release may each find it; the telemetry reports it once).
    loss_reported: AtomicBool,
}

impl Belief {
    /// A belief in a grant requested at `start`, held for `length` from then.
    pub(crate) fn new(start: Instant, length: Duration) -> Self {
        let base = start;
        Belief {
            base,
            until: AtomicU64::new(nanos(length).max(1)),
            length,
            loss_reported: AtomicBool::new(false),
        }
    }

    /// Whether this is the first report of the grant's loss.
    pub(crate) fn first_loss_report(&self) -> bool {
        !self.loss_reported.swap(true, Ordering::SeqCst)
    }

    /// Whether the deadline has not passed (and the belief was not ended).
    pub(crate) fn is_held(&self) -> bool {
        self.deadline()
            .is_some_and(|deadline| Instant::now() < deadline)
    }

    /// The deadline; `None` once the belief was ended.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match self.until.load(Ordering::SeqCst) {
            0 => None,
            until => Some(self.base + Duration::from_nanos(until)),
        }
    }

    /// The time left until the deadline; zero once it passed.
    pub(crate) fn remaining(&self) -> Duration {
        self.deadline().map_or(Duration::ZERO, |deadline| {
            deadline.saturating_duration_since(Instant::now())
        })
    }

    /// Moves the deadline to `length` after `start` (the instant before the renewal was
    /// sent), if the belief still holds now. `false` when it had already passed or ended:
    /// then nothing changes.
    pub(crate) fn extend(&self, start: Instant) -> bool {
        let wanted = nanos(start.saturating_duration_since(self.base) + self.length).max(1);
        let mut current = self.until.load(Ordering::SeqCst);
        loop {
            let passed =
                current == 0 || Instant::now() >= self.base + Duration::from_nanos(current);
            if passed {
                return false;
            }
            match self.until.compare_exchange(
                current,
                current.max(wanted),
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return true,
                Err(now_current) => current = now_current,
            }
        }
    }

    /// Ends the belief for good: the lease was lost or released.
    pub(crate) fn end(&self) {
        self.until.store(0, Ordering::SeqCst);
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_belief_ends_at_its_deadline_and_is_not_revived() {
        let start = Instant::now();
        let belief = Belief::new(start, Duration::from_millis(30));
        assert!(belief.is_held());
        assert!(belief.remaining() <= Duration::from_millis(30));
        // Extended from a later request start: the deadline moves on.
        assert!(belief.extend(start + Duration::from_millis(10)));
        assert_eq!(belief.deadline(), Some(start + Duration::from_millis(40)));
        // An older request never moves it back.
        assert!(belief.extend(start));
        assert_eq!(belief.deadline(), Some(start + Duration::from_millis(40)));
        std::thread::sleep(Duration::from_millis(45));
        assert!(!belief.is_held());
        assert_eq!(belief.remaining(), Duration::ZERO);
        // A renewal that comes back after the deadline does not revive it.
        assert!(!belief.extend(Instant::now()));
        assert!(!belief.is_held());
    }

    #[test]
    fn an_ended_belief_stays_ended() {
        let belief = Belief::new(Instant::now(), Duration::from_secs(60));
        belief.end();
        assert!(!belief.is_held());
        assert_eq!(belief.deadline(), None);
        assert!(!belief.extend(Instant::now()));
    }

    #[test]
    fn the_margin_is_a_tenth_of_the_lease() {
        assert_eq!(believed(Duration::from_secs(10)), Duration::from_secs(9));
    }
}
