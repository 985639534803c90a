//! SQLite writers of this process take turns, and none starves.
//!
//! SQLite lets one connection write at a time; the others wait in its busy handler, which
//! sleeps and polls (1 ms, 2 ms, 5 ms, ... up to 100 ms between tries). A writer that has
//! just committed usually takes the lock again before a sleeper wakes, so under load a few
//! writers win nearly every turn while others starve. Measured with 4 writers on one row:
//! the slowest got under 3 % of the mean writer's turns (BENCHMARKS.md, W2 on SQLite).
//! So the library's writes pass this gate first: its write transactions before `BEGIN
//! IMMEDIATE`, until they end, and its write statements sent outside a transaction (a
//! one-statement merge, a write by key, a save), for the statement alone.
//!
//! The gate is a lock with a queue, fair the way Go's `sync.Mutex` is: a writer that finds
//! it free takes it at once, even past queued writers (so a thread writing in a loop keeps
//! its CPU and its cache, with no thread switch per statement), but a release hands the
//! gate straight to the first queued writer once that one has waited [`STARVING_AFTER`],
//! and keeps handing it down the queue while the next has waited as long. A strict
//! first-come queue was as fair and cost a thread switch per statement: a third of the
//! throughput of one-statement merges with 16 writers on 2 cores. Measured on that
//! machine (W2 on SQLite, BENCHMARKS.md): 1 ms kept the slowest writer at 0.89-0.99 of
//! the mean and 0.70-0.83 of the unfair hand-written statement's goodput, 5 ms at
//! 0.59-0.95 and 0.83-0.93, 2 ms in between.
//!
//! Once every queued writer starves, handing the gate on at each release would pass it
//! round the queue one statement at a time. Each of those statements then starts on a
//! connection whose page cache SQLite has dropped (another connection wrote since), and
//! after a thread switch. So a writer that was handed the gate, or took it, keeps it for
//! its next turns too while they follow each other within [`SLICE`]: the queue is served
//! in slices of up to 2 ms rather than single statements, and no writer waits much longer
//! than a slice per writer queued before it. Measured on 2 cores (`occ-bench --workloads
//! w6 --queue-sizes 1000000 --claim-batches 100`, 8 workers, and W2 at 16 writers): the
//! claim and end of 100 tasks went from 0.85x (median of 3) to 0.98x the hand-written
//! queue's rate, one-statement merges from 0.71x to 0.93x, with the slowest writer still
//! at 0.83-0.94 of the mean; the p99 wait of 16 writers on one row grew from 18 ms to
//! 40 ms.
//!
//! The gate is one per process, for every SQLite file: writers to different files take
//! turns too, which costs only when both are busy at once. A thread that holds a turn
//! and writes again (on another connection, from a transition hook say) goes on at once:
//! that write is part of its turn. A writer that waits longer than [`MAX_WAIT`] (a
//! transaction on another file holding the gate for long, an async write transaction
//! whose task opens a second one) stops waiting and goes on to SQLite, where its busy
//! timeout applies: the gate orders writers, it never blocks one for good. Writers outside the library (and in other processes) do not pass it and
//! wait in SQLite's busy handler as before.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::thread::{Thread, ThreadId};
use std::time::{Duration, Instant};

/// The longest a writer waits for its turn before going on without it.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(1);

/// How long a queued writer waits before releases hand it the gate rather than free it.
pub(crate) const STARVING_AFTER: Duration = Duration::from_millis(2);

/// How long a writer's run of turns, one straight after the other, goes on before a
/// release hands the gate to a starving writer.
pub(crate) const SLICE: Duration = Duration::from_millis(2);

/// A writer in the queue.
struct Waiter {
    ticket: u64,
    arrived: Instant,
    thread: Thread,
}

struct Gate {
    /// Whether a writer holds the gate (or it has been handed to one not yet awake).
    held: bool,
    /// Queued writers, in arrival order.
    queue: VecDeque<Waiter>,
    /// The ticket of the writer the gate was handed to, until it wakes and takes it.
    handed_to: Option<u64>,
    /// The ticket the next queued writer draws.
    next: u64,
    /// Whether a queued writer was woken and has not looked at the gate yet: one woken
    /// writer is enough, more would only switch threads to find the gate taken.
    woken: bool,
    /// The writer whose turns have followed each other since when: the thread that took
    /// the gate last, and when it took it from another.
    run: Option<(ThreadId, Instant)>,
}

static GATE: Mutex<Gate> = Mutex::new(Gate {
    held: false,
    queue: VecDeque::new(),
    handed_to: None,
    next: 0,
    woken: false,
    run: None,
});

fn lock_gate() -> MutexGuard<'static, Gate> {
    // Every change keeps the gate consistent, so a panic elsewhere cannot break it.
    GATE.lock().unwrap_or_else(|e| e.into_inner())
}

thread_local! {
    /// The turns this thread holds through [`wait_for_turn`]: while it holds one, its
    /// other writes (on another connection, say from a transition hook) are part of that
    /// turn, and do not queue behind it.
    static HELD_HERE: Cell<usize> = const { Cell::new(0) };
}

/// A writer's turn: the gate passes on when it is dropped.
#[must_use = "the turn ends when this is dropped"]
pub(crate) struct Turn(Held);

enum Held {
    /// Taken by [`wait_for_turn`]: dropped on the thread that took it.
    Here,
    /// A write of a thread that already holds a turn: dropping it releases nothing.
    Nested,
    /// Taken by [`wait_for_turn_to_send`]: may be dropped on any thread.
    #[cfg_attr(not(all(feature = "async", feature = "sqlite")), allow(dead_code))]
    // the async SQLite path's
    Anywhere,
}

/// Waits for this thread's turn, at most `max_wait`; `None` when the wait ran out. The
/// turn must be dropped on this thread; a thread that already holds one gets its turn
/// at once.
pub(crate) fn wait_for_turn(max_wait: Duration) -> Option<Turn> {
    let held_here = HELD_HERE.get();
    let held = if held_here > 0 {
        Held::Nested
    } else {
        take_gate(max_wait)?;
        Held::Here
    };
    HELD_HERE.set(held_here + 1);
    Some(Turn(held))
}

/// [`wait_for_turn`] for a turn that may end on another thread (an async write
/// transaction, whose future moves between threads). Such a turn does not count as this
/// thread's.
#[cfg_attr(not(all(feature = "async", feature = "sqlite")), allow(dead_code))] // the async SQLite path's
pub(crate) fn wait_for_turn_to_send(max_wait: Duration) -> Option<Turn> {
    take_gate(max_wait)?;
    Some(Turn(Held::Anywhere))
}

/// Takes the gate, waiting at most `max_wait`; `None` when the wait ran out.
fn take_gate(max_wait: Duration) -> Option<()> {
    let mut gate = lock_gate();
    if !gate.held {
        gate.held = true;
        gate.taken_here();
        return Some(());
    }
    let arrived = Instant::now();
    // Computed before queueing: a writer must never leave the queue by a panic, or the
    // gate could be handed to it and never taken.
    let deadline = arrived.checked_add(max_wait).unwrap_or(arrived + MAX_WAIT);
    let ticket = gate.next;
    gate.next += 1;
    gate.queue.push_back(Waiter {
        ticket,
        arrived,
        thread: std::thread::current(),
    });
    loop {
        drop(gate);
        // Woken by a release (or spuriously); the gate's state says which.
        std::thread::park_timeout(deadline.saturating_duration_since(Instant::now()));
        gate = lock_gate();
        gate.woken = false;
        if gate.handed_to == Some(ticket) {
            gate.handed_to = None;
            gate.taken_here();
            return Some(());
        }
        if !gate.held {
            gate.held = true;
            gate.taken_here();
            gate.queue.retain(|waiter| waiter.ticket != ticket);
            return Some(());
        }
        if Instant::now() >= deadline {
            gate.queue.retain(|waiter| waiter.ticket != ticket);
            return None;
        }
    }
}

impl Gate {
    /// Notes that this thread took the gate: its run of turns goes on, or begins.
    fn taken_here(&mut self) {
        let me = std::thread::current().id();
        if self.run.is_none_or(|(writer, _)| writer != me) {
            self.run = Some((me, Instant::now()));
        }
    }

    /// Whether a release now hands the gate to the first queued writer.
    fn hands_over(&self) -> bool {
        let first_waited = self.queue.front().map(|first| first.arrived.elapsed());
        let run_lasted = self.run.map(|(_, began)| began.elapsed());
        hands_over(first_waited, run_lasted)
    }
}

/// The release policy: hand over to a queued writer that starves, unless the writer
/// releasing is still within its slice.
fn hands_over(first_waited: Option<Duration>, run_lasted: Option<Duration>) -> bool {
    first_waited.is_some_and(|waited| waited >= STARVING_AFTER)
        && run_lasted.is_none_or(|lasted| lasted >= SLICE)
}

impl Drop for Turn {
    fn drop(&mut self) {
        if matches!(self.0, Held::Here | Held::Nested) {
            HELD_HERE.set(HELD_HERE.get().saturating_sub(1));
        }
        if matches!(self.0, Held::Nested) {
            return;
        }
        let mut gate = lock_gate();
        let wake = if gate.hands_over() {
            // Handed over: the gate stays held, so no one arriving now can take it first.
            let first = gate.queue.pop_front().expect("a queued writer");
            gate.handed_to = Some(first.ticket);
            Some(first.thread)
        } else {
            gate.held = false;
            match gate.queue.front() {
                Some(first) if !gate.woken => {
                    let thread = first.thread.clone();
                    gate.woken = true;
                    Some(thread)
                }
                _ => None,
            }
        };
        // Woken after the gate's lock is let go, so that the writer woken does not
        // find it still held and sleep once more.
        drop(gate);
        if let Some(thread) = wake {
            thread.unpark();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// The gate is the process's: these tests take turns with each other.
    static ONE_TEST: Mutex<()> = Mutex::new(());

    fn alone() -> MutexGuard<'static, ()> {
        ONE_TEST.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[test]
    fn writers_never_overlap_and_all_get_turns() {
        let _alone = alone();
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
        let _alone = alone();
        let first = wait_for_turn(Duration::from_secs(30)).expect("a turn");
        let other = std::thread::spawn(|| wait_for_turn(Duration::from_millis(20)).is_none());
        assert!(
            other.join().unwrap(),
            "another thread got a turn while this one held it"
        );
        drop(first);
        // The writer that gave up left the queue: the next one gets its turn at once.
        let next = wait_for_turn(Duration::from_millis(500));
        assert!(next.is_some());
    }

    /// A thread that holds a turn writes again at once; the gate passes on only when its
    /// outer turn ends, and a turn taken to be sent does not count as the thread's.
    #[test]
    fn a_thread_holding_a_turn_writes_again_at_once() {
        let _alone = alone();
        let others_wait = || {
            std::thread::spawn(|| wait_for_turn(Duration::from_millis(20)).is_none())
                .join()
                .unwrap()
        };
        let outer = wait_for_turn(Duration::from_secs(30)).expect("a turn");
        let inner = wait_for_turn(Duration::from_millis(1)).expect("the same thread's turn");
        assert!(others_wait());
        drop(inner);
        assert!(others_wait(), "the inner turn released the gate");
        drop(outer);
        let sent = wait_for_turn_to_send(Duration::from_secs(30)).expect("a turn");
        assert!(others_wait());
        assert!(
            wait_for_turn(Duration::from_millis(20)).is_none(),
            "a sent turn counted as this thread's"
        );
        std::thread::spawn(move || drop(sent)).join().unwrap();
        assert!(wait_for_turn(Duration::from_millis(500)).is_some());
    }

    /// A release hands the gate over only to a writer that starves, and only once the
    /// writer releasing has had its slice.
    #[test]
    fn a_release_hands_over_to_a_starving_writer_after_a_slice() {
        let ms = Duration::from_millis;
        assert!(!hands_over(None, Some(ms(50))), "no one is queued");
        assert!(
            !hands_over(Some(ms(1)), Some(ms(50))),
            "the first queued does not starve yet"
        );
        assert!(
            !hands_over(Some(ms(50)), Some(ms(1))),
            "the run is within its slice"
        );
        assert!(hands_over(Some(ms(50)), Some(ms(50))));
        assert!(hands_over(Some(STARVING_AFTER), Some(SLICE)));
        assert!(hands_over(Some(ms(50)), None), "no run known");
    }

    /// A writer queued past the starving time gets the next turn once the holder's slice
    /// is over: the holder, releasing and coming straight back, finds the gate handed
    /// over and has to queue behind it.
    #[test]
    fn a_starving_writer_is_handed_the_next_turn() {
        let _alone = alone();
        let first = wait_for_turn(Duration::from_secs(30)).expect("a turn");
        let order = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            let queued = s.spawn(|| {
                let turn = wait_for_turn(Duration::from_secs(30)).expect("a turn");
                order.lock().unwrap().push("queued");
                drop(turn);
            });
            // Until the queued writer is in the queue and has waited long enough, and
            // this thread's run of turns has lasted its slice.
            while !lock_gate().hands_over() {
                std::thread::yield_now();
            }
            drop(first);
            let again = wait_for_turn(Duration::from_secs(30)).expect("a turn");
            order.lock().unwrap().push("holder again");
            drop(again);
            queued.join().unwrap();
        });
        assert_eq!(*order.lock().unwrap(), ["queued", "holder again"]);
    }
}
