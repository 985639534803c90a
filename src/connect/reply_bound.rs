//! A bound on how long a connection waits for its server's reply.
//!
//! diesel's MySQL client has no read timeout and libpq none for a query, and a server
//! that stops answering without closing the connection (a frozen process, a partition, a
//! virtual machine paused) holds a call until TCP gives up, which it never does while the
//! server's kernel still acknowledges the bytes. A server-side bound (`statement_timeout`,
//! `max_statement_time`) cannot help either: the server is not running.
//!
//! So the connection's socket is watched from outside: the connection's instrumentation
//! marks when a statement is sent and when its reply came, and one watchdog thread shuts
//! the socket down once a statement has waited longer than the bound. The client then
//! reads the end of the stream, reports the connection lost, and the call's usual
//! classification applies: [`Error::Ambiguous`](crate::Error::Ambiguous) where the
//! statement may have taken effect (a `COMMIT`, a write outside a transaction), a
//! retryable loss before the commit otherwise; the pools discard the connection. The
//! same watch serves blocking and diesel-async connections: a tokio-postgres or
//! mysql_async socket ends the same way.
//!
//! The watch holds a duplicate of the connection's socket (taken with `pidfd_getfd`, so
//! without unsafe code and without the race of a file descriptor number reused after
//! the client closed it). It is Linux only; elsewhere connections are not watched.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use diesel::connection::{Instrumentation, InstrumentationEvent};

/// The socket duplicate a watch shuts down.
#[cfg(target_os = "linux")]
pub(crate) type Socket = std::os::fd::OwnedFd;
/// Elsewhere no socket is found, and nothing is watched.
#[cfg(not(target_os = "linux"))]
pub(crate) type Socket = std::convert::Infallible;

/// One connection's watch: when its oldest unanswered statement was sent, and whether
/// the watchdog closed it.
#[derive(Debug)]
pub(crate) struct Watch {
    socket: Socket,
    bound: Duration,
    /// A tighter bound for the call under way, in nanoseconds; 0 when none.
    tighter: AtomicU64,
    /// Nanoseconds since [`epoch`] plus one when a statement was sent; 0 when none waits.
    waiting_since: AtomicU64,
    /// The bound in force when the watchdog closed the connection, in nanoseconds; 0
    /// while it has not.
    cut_after: AtomicU64,
}

impl Watch {
    /// Starts watching `socket` with `bound`, or nothing for a bound of zero.
    pub(crate) fn start(socket: Socket, bound: Duration) -> Option<Arc<Watch>> {
        if bound.is_zero() {
            return None;
        }
        let watch = Arc::new(Watch {
            socket,
            bound,
            tighter: AtomicU64::new(0),
            waiting_since: AtomicU64::new(0),
            cut_after: AtomicU64::new(0),
        });
        watchdog()
            .watched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::downgrade(&watch));
        Some(watch)
    }

    /// The bound, if the watchdog closed the connection for a reply that did not come.
    pub(crate) fn cut_after(&self) -> Option<Duration> {
        match self.cut_after.load(Ordering::Acquire) {
            0 => None,
            nanos => Some(Duration::from_nanos(nanos)),
        }
    }

    /// The bound in force: the connection's, or a call's tighter one.
    fn bound(&self) -> Duration {
        match self.tighter.load(Ordering::Acquire) {
            0 => self.bound,
            tighter => self.bound.min(Duration::from_nanos(tighter)),
        }
    }

    /// Bounds each reply to `limit` (if tighter than the connection's bound) until the
    /// returned value is dropped: a lock's statements, whose answers no longer count once
    /// the lease they compute could have run out.
    #[cfg(feature = "locks")]
    pub(crate) fn tighten(self: &Arc<Self>, limit: Duration) -> Tightened {
        let nanos = nanos_of(limit).max(1);
        let before = self.tighter.swap(nanos, Ordering::AcqRel);
        Tightened {
            watch: self.clone(),
            before,
        }
    }

    /// Follows the connection's events: a statement sent starts the wait, its end
    /// (answered or failed) ends it. A statement sent while another waits restarts it, so
    /// that a diesel-async future dropped before its reply cannot leave a wait that
    /// closes a connection idle in its pool once a later statement ran. The price: of
    /// statements pipelined on one diesel-async PostgreSQL connection (the library sends
    /// none), those still waiting when an earlier one ends are not bounded.
    pub(crate) fn follow(&self, event: &InstrumentationEvent<'_>) {
        match event {
            InstrumentationEvent::StartQuery { .. } => {
                self.waiting_since.store(since_epoch(), Ordering::Release)
            }
            InstrumentationEvent::FinishQuery { .. } => {
                self.waiting_since.store(0, Ordering::Release)
            }
            _ => {}
        }
    }

    /// Closes the connection if its statement has waited past the bound.
    fn check(&self, now: u64) {
        let since = self.waiting_since.load(Ordering::Acquire);
        let bound = nanos_of(self.bound());
        if since == 0 || now.saturating_sub(since) < bound {
            return;
        }
        // Only the wait seen: a reply that ended it meanwhile keeps the connection. A
        // reply that lands between this exchange and the shutdown still loses its
        // connection, and the next statement is told the timeout closed it: a window of
        // microseconds, at the bound's edge.
        if self
            .waiting_since
            .compare_exchange(since, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.cut_after.store(bound.max(1), Ordering::Release);
            shut_down(&self.socket);
        }
    }
}

/// A call's tighter bound on a watch, lifted when dropped.
#[cfg(feature = "locks")]
pub(crate) struct Tightened {
    watch: Arc<Watch>,
    before: u64,
}

#[cfg(feature = "locks")]
impl Drop for Tightened {
    fn drop(&mut self) {
        self.watch.tighter.store(self.before, Ordering::Release);
    }
}

/// The watch of a connection whose instrumentation is the library's (a connection of
/// its pools, or made by `establish_with_reply_timeout`), if it is watched.
pub(crate) fn watch_of(instrumentation: &mut dyn Instrumentation) -> Option<Arc<Watch>> {
    if let Some(watched) = instrumentation.downcast_ref::<Watched>() {
        return watched.watch.clone();
    }
    crate::connect::pool::watch_of(instrumentation)
}

/// Bounds each reply on the connection of `instrumentation` to `limit` while the returned
/// value lives (nothing if the connection is not watched).
#[cfg(feature = "locks")]
pub(crate) fn tighten(
    instrumentation: &mut dyn Instrumentation,
    limit: Duration,
) -> Option<Tightened> {
    watch_of(instrumentation).map(|watch| watch.tighten(limit))
}

/// `error` said as the reply timeout it was, if the watchdog closed the connection of
/// `instrumentation` (the client only saw its connection end).
pub(crate) fn name_the_cut(
    instrumentation: &mut dyn Instrumentation,
    error: diesel::result::Error,
) -> diesel::result::Error {
    use diesel::result::{DatabaseErrorKind, Error as DieselError};
    let cut = watch_of(instrumentation).and_then(|watch| watch.cut_after());
    match (cut, &error) {
        (Some(bound), DieselError::DatabaseError(_, info))
            if crate::error::connection_lost(&error) =>
        {
            DieselError::DatabaseError(
                DatabaseErrorKind::ClosedConnection,
                Box::new(format!(
                    "no reply from the server within {bound:?} (the connection's reply \
                     timeout), so the connection was closed; the client then said: {}",
                    info.message()
                )),
            )
        }
        _ => error,
    }
}

/// Ends both directions of the socket: the client blocked on it reads the end of the
/// stream at once (a shutdown, unlike a close, reaches every descriptor of the socket).
#[cfg(target_os = "linux")]
fn shut_down(socket: &Socket) {
    // An error means the socket is already shut down or gone: nothing more to do.
    let _ = rustix::net::shutdown(socket, rustix::net::Shutdown::Both);
}

#[cfg(not(target_os = "linux"))]
fn shut_down(socket: &Socket) {
    match *socket {}
}

/// The instant all watches count from.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn since_epoch() -> u64 {
    nanos_of(epoch().elapsed()).saturating_add(1)
}

/// `duration` in nanoseconds, a bound beyond 584 years taken as for ever.
fn nanos_of(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// The watches, checked by one thread.
struct Watchdog {
    watched: Mutex<Vec<Weak<Watch>>>,
}

static WATCHDOG: OnceLock<Watchdog> = OnceLock::new();

/// The watchdog, its thread started by the first watch.
fn watchdog() -> &'static Watchdog {
    WATCHDOG.get_or_init(|| {
        epoch();
        std::thread::Builder::new()
            .name("diesel-occ reply bound".into())
            .spawn(|| loop {
                std::thread::sleep(patrol());
            })
            .expect("the reply bound's watchdog thread starts");
        Watchdog {
            watched: Mutex::new(Vec::new()),
        }
    })
}

/// Checks every watch once (dropping those of closed connections) and says how long to
/// sleep: a tenth of the smallest bound, between 5 ms and 100 ms, so a call returns
/// within about a tenth past its bound.
fn patrol() -> Duration {
    let Some(dog) = WATCHDOG.get() else {
        return Duration::from_millis(5);
    };
    let now = since_epoch();
    let mut smallest = Duration::from_secs(1);
    let mut watched = dog.watched.lock().unwrap_or_else(|e| e.into_inner());
    watched.retain(|watch| match watch.upgrade() {
        Some(watch) => {
            watch.check(now);
            smallest = smallest.min(watch.bound());
            true
        }
        None => false,
    });
    (smallest / 10).clamp(Duration::from_millis(5), Duration::from_millis(100))
}

/// An instrumentation that keeps a connection's watch (when its socket was found) and
/// whether it met a read-only server, and passes every event on to the user's
/// instrumentation, if any. Set on diesel-async connections, whose pools take no other
/// instrumentation of the library's.
pub(crate) struct Watched {
    pub(crate) watch: Option<Arc<Watch>>,
    pub(crate) met_read_only: bool,
    pub(crate) user: Option<Box<dyn Instrumentation>>,
}

impl Instrumentation for Watched {
    fn on_connection_event(&mut self, event: InstrumentationEvent<'_>) {
        if let Some(watch) = &self.watch {
            watch.follow(&event);
        }
        if let InstrumentationEvent::FinishQuery {
            error: Some(error), ..
        } = &event
        {
            self.met_read_only |= crate::error::read_only_refusal(error);
        }
        if let Some(user) = &mut self.user {
            user.on_connection_event(event);
        }
    }
}
