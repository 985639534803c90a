//! SQLite write transactions of this process take turns in arrival order.
//!
//! SQLite lets one connection write at a time; the others wait in its busy handler, which
//! sleeps and polls (1 ms, 2 ms, 5 ms, ... up to 100 ms between tries). A writer that has
//! just committed usually takes the lock again before a sleeper wakes, so under load a few
//! writers win nearly every turn while others starve. Measured with 4 writers on one row:
//! the slowest got under 3 % of the mean writer's turns, and with this queue 98-100 %
//! (BENCHMARKS.md, W2 on SQLite). So before `BEGIN IMMEDIATE` the library's write
//! transactions queue here, first come first served, and each wakes the moment its turn
//! comes.
//!
//! The queue is one per process, for every SQLite file: writers to different files take
//! turns too, which costs only when both are busy at once. A writer that waits longer
//! than [`MAX_WAIT`] (a transaction on another file holding its turn for long, or a thread
//! that opens a second write transaction while holding one) stops waiting and goes on to
//! `BEGIN IMMEDIATE` as before, where SQLite's busy timeout applies: the queue orders
//! writers, it never blocks one for good. Writers outside the library (and in other
//! processes) are not in the queue and wait in SQLite's busy handler as before.

use std::collections::BTreeSet;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The longest a writer waits for its turn before going on without it.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Queue {
    /// The ticket the next arriving writer draws.
    next: u64,
    /// The ticket whose turn it is.
    serving: u64,
    /// Tickets whose writers stopped waiting; their turns are skipped.
    abandoned: BTreeSet<u64>,
}

impl Queue {
    /// Moves the turn past `ticket` and past every abandoned ticket after it.
    fn advance(&mut self) {
        self.serving += 1;
        while self.abandoned.remove(&self.serving) {
            self.serving += 1;
        }
    }
}

static QUEUE: Mutex<Queue> = Mutex::new(Queue {
    next: 0,
    serving: 0,
    abandoned: BTreeSet::new(),
});
static TURN_CHANGED: Condvar = Condvar::new();

fn queue() -> MutexGuard<'static, Queue> {
    // Every change keeps the queue consistent, so a panic elsewhere cannot break it.
    QUEUE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A writer's turn: the next writer's comes when it is dropped.
#[must_use = "the turn ends when this is dropped"]
pub(crate) struct Turn {
    ticket: u64,
}

/// Waits for this writer's turn, at most `max_wait`; `None` when the wait ran out.
pub(crate) fn wait_for_turn(max_wait: Duration) -> Option<Turn> {
    let deadline = Instant::now() + max_wait;
    let mut queue = queue();
    let ticket = queue.next;
    queue.next += 1;
    while queue.serving != ticket {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            queue.abandoned.insert(ticket);
            return None;
        }
        queue = TURN_CHANGED
            .wait_timeout(queue, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    Some(Turn { ticket })
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut queue = queue();
        debug_assert_eq!(queue.serving, self.ticket);
        queue.advance();
        drop(queue);
        TURN_CHANGED.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    #[test]
    fn writers_never_overlap_and_all_get_turns() {
        let inside = AtomicBool::new(false);
        let turns = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..200 {
                        let turn = wait_for_turn(Duration::from_secs(30)).expect("a turn");
                        assert!(!inside.swap(true, Ordering::SeqCst), "two writers at once");
                        turns.fetch_add(1, Ordering::SeqCst);
                        inside.store(false, Ordering::SeqCst);
                        drop(turn);
                    }
                });
            }
        });
        assert_eq!(turns.load(Ordering::SeqCst), 1600);
    }

    #[test]
    fn a_writer_that_gives_up_does_not_hold_up_the_next() {
        let first = wait_for_turn(Duration::from_secs(30)).expect("a turn");
        assert!(wait_for_turn(Duration::from_millis(20)).is_none());
        drop(first);
        // The abandoned ticket is skipped: the next writer gets its turn at once.
        let next = wait_for_turn(Duration::from_millis(500));
        assert!(next.is_some());
    }
}
