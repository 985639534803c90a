//! The socket a connection opens, found from outside the client library.
//!
//! Neither libpq, libmysqlclient nor diesel-async's clients expose a connection's socket
//! through diesel, so the sockets of the process are listed before and after the
//! connection is made: the one that appeared is the connection's. Connections made
//! through this module take turns, blocking and async alike, so they do not take each
//! other's sockets; a socket the rest of the process opened during those milliseconds (an
//! accepted HTTP connection, a connection made without this module) makes the
//! answer ambiguous, and then the connection is not watched rather than watched on the
//! wrong socket (a warning says so with the `tracing` feature). A turn held longer than
//! [`TURN_WAIT`] is not waited for: a connection to a frozen server never ends, and must
//! not hold every other connection of the process back.
//!
//! Linux only (`/proc/self/fd` and `pidfd_getfd`); elsewhere nothing is found. Where a
//! seccomp profile refuses `pidfd_getfd` (Docker's default without `CAP_SYS_PTRACE`),
//! nothing is found either.

use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::OnceLock;

use super::reply_bound::Watch;

/// The sockets of the process when a connection starts, to compare with after it.
pub(crate) struct Before(#[cfg(target_os = "linux")] std::collections::HashSet<u64>);

/// Lists the process' sockets.
pub(crate) fn before() -> Before {
    #[cfg(target_os = "linux")]
    return Before(
        linux::sockets()
            .into_iter()
            .map(|(_, inode)| inode)
            .collect(),
    );
    #[cfg(not(target_os = "linux"))]
    Before()
}

/// Whether connections of backend `B` talk over a socket: not SQLite's, whose file is
/// opened in the process. Looking for one would take any socket the process opened
/// meanwhile (an accepted HTTP connection) for the connection's, and the watch would
/// shut that one down under a slow SQLite statement.
pub(crate) fn has_socket<B: 'static>() -> bool {
    let backend = std::any::TypeId::of::<B>();
    #[cfg(feature = "sqlite")]
    if backend == std::any::TypeId::of::<diesel::sqlite::Sqlite>() {
        return false;
    }
    let _ = backend;
    true
}

/// A watch with `bound` on the one socket opened since `before`, if exactly one was.
pub(crate) fn watch_new_socket(before: &Before, bound: Duration) -> Option<Arc<Watch>> {
    #[cfg(target_os = "linux")]
    let socket = linux::opened_since(&before.0);
    #[cfg(not(target_os = "linux"))]
    let socket: Option<super::reply_bound::Socket> = {
        let _ = before;
        None
    };
    #[cfg(feature = "tracing")]
    if socket.is_none() {
        tracing::warn!(
            target: "diesel_occ",
            "a new connection's socket could not be told apart; it has no reply timeout"
        );
    }
    Watch::start(socket?, bound)
}

/// How long one connection may keep the turn before the others stop waiting for it: a
/// connection to a frozen server never ends, and must not hold every other connection of
/// the process back. A connection quicker than this passes the turn on, and the next one
/// waits again, so a pool filling itself (r2d2 makes its idle connections at once)
/// still connects one at a time.
pub(crate) const TURN_WAIT: Duration = Duration::from_millis(200);

/// How long a connection waits for its turn in all, however quickly the turn passes.
const TURN_WAIT_IN_ALL: Duration = Duration::from_secs(2);

/// How often a connection waiting for its turn looks again.
const TURN_POLL: Duration = Duration::from_millis(2);

/// Who holds the turn to connect, blocking and async alike (a blocking and an async
/// connection made at once would each find two new sockets): 0 when no one does, else
/// when the holder took it, in microseconds since [`epoch`], plus one.
static TURN_TAKEN_AT: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn stamp() -> u64 {
    epoch().elapsed().as_micros() as u64 + 1
}

/// The turn to connect, given back when dropped.
struct Turn;

impl Drop for Turn {
    fn drop(&mut self) {
        TURN_TAKEN_AT.store(0, Ordering::Release);
    }
}

/// What a connection waiting for its turn does next.
enum Next {
    /// Connect with the turn.
    Connect(Turn),
    /// Connect without it: the holder is stuck, or the wait is over.
    ConnectAnyway,
    /// Look again in a moment.
    Wait,
}

/// Takes the turn if it is free; `waiting_since` is when this connection began to wait.
fn next(waiting_since: Instant) -> Next {
    let now = stamp();
    match TURN_TAKEN_AT.compare_exchange(0, now, Ordering::Acquire, Ordering::Relaxed) {
        Ok(_) => Next::Connect(Turn),
        Err(taken_at) if now.saturating_sub(taken_at) > TURN_WAIT.as_micros() as u64 => {
            Next::ConnectAnyway
        }
        Err(_) if waiting_since.elapsed() > TURN_WAIT_IN_ALL => Next::ConnectAnyway,
        Err(_) => Next::Wait,
    }
}

/// Makes connections one at a time in blocking code (see the module's docs).
pub(crate) fn one_at_a_time<T>(connect: impl FnOnce() -> T) -> T {
    let waiting_since = Instant::now();
    let _turn = loop {
        match next(waiting_since) {
            Next::Connect(turn) => break Some(turn),
            Next::ConnectAnyway => break None,
            Next::Wait => std::thread::sleep(TURN_POLL),
        }
    };
    connect()
}

/// The same in async code: the turn is held across the connection's awaits, and waited
/// for on tokio's timer.
#[cfg(feature = "async")]
pub(crate) async fn one_at_a_time_async<T>(connect: impl std::future::Future<Output = T>) -> T {
    let waiting_since = Instant::now();
    let _turn = loop {
        match next(waiting_since) {
            Next::Connect(turn) => break Some(turn),
            Next::ConnectAnyway => break None,
            Next::Wait => tokio::time::sleep(TURN_POLL).await,
        }
    };
    connect.await
}

#[cfg(target_os = "linux")]
mod linux {
    use std::os::fd::{AsRawFd, OwnedFd, RawFd};
    use std::sync::OnceLock;

    use rustix::net::sockopt::socket_type;
    use rustix::net::SocketType;
    use rustix::process::{getpid, pidfd_getfd, pidfd_open, PidfdFlags, PidfdGetfdFlags};

    /// The process' sockets: descriptor number and inode.
    pub(super) fn sockets() -> Vec<(RawFd, u64)> {
        let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
            return Vec::new();
        };
        entries
            .filter_map(|entry| {
                let fd: RawFd = entry.ok()?.file_name().to_str()?.parse().ok()?;
                Some((fd, inode_of(fd)?))
            })
            .collect()
    }

    /// The socket inode descriptor `fd` refers to, if it is a socket.
    fn inode_of(fd: RawFd) -> Option<u64> {
        let target = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
        target
            .to_str()?
            .strip_prefix("socket:[")?
            .strip_suffix(']')?
            .parse()
            .ok()
    }

    /// A duplicate of the one stream socket that is not among `before`.
    pub(super) fn opened_since(before: &std::collections::HashSet<u64>) -> Option<OwnedFd> {
        let mut new = sockets()
            .into_iter()
            .filter(|(_, inode)| !before.contains(inode));
        let (fd, inode) = new.next()?;
        if new.next().is_some() {
            return None;
        }
        let socket = pidfd_getfd(own_pidfd()?, fd, PidfdGetfdFlags::empty()).ok()?;
        // The number may have been closed and given to another socket meanwhile.
        (inode_of(socket.as_raw_fd()) == Some(inode)
            && socket_type(&socket).ok() == Some(SocketType::STREAM))
        .then_some(socket)
    }

    /// A handle on this process, through which its descriptors are duplicated.
    fn own_pidfd() -> Option<&'static OwnedFd> {
        static PIDFD: OnceLock<Option<OwnedFd>> = OnceLock::new();
        PIDFD
            .get_or_init(|| pidfd_open(getpid(), PidfdFlags::empty()).ok())
            .as_ref()
    }
}

#[cfg(all(test, feature = "async"))]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    /// A blocking and an async connection made at once would each find two new sockets.
    #[test]
    fn blocking_and_async_connections_take_the_same_turns() {
        use std::sync::atomic::AtomicBool;
        let (inside, waiting) = (AtomicBool::new(false), AtomicBool::new(false));
        let overlapped = AtomicBool::new(true);
        std::thread::scope(|s| {
            one_at_a_time(|| {
                inside.store(true, Ordering::SeqCst);
                s.spawn(|| {
                    waiting.store(true, Ordering::SeqCst);
                    runtime().block_on(one_at_a_time_async(async {
                        overlapped.store(inside.load(Ordering::SeqCst), Ordering::SeqCst)
                    }))
                });
                // Hold the turn until the async one is waiting for it, then a little
                // longer, well within the time a holder is waited for.
                while !waiting.load(Ordering::SeqCst) {
                    std::thread::sleep(TURN_POLL);
                }
                std::thread::sleep(TURN_POLL * 5);
                inside.store(false, Ordering::SeqCst);
            });
        });
        assert!(!overlapped.load(Ordering::SeqCst), "the async one waited");
        a_turn_is_waited_for_a_bounded_time_and_given_back();
    }

    /// A connection that never ends (a frozen server) holds the others back for
    /// [`TURN_WAIT`] at most, and gives its turn back when it ends. (One test with the
    /// one above: the turn is the process's.)
    fn a_turn_is_waited_for_a_bounded_time_and_given_back() {
        let held = loop {
            match next(Instant::now()) {
                Next::Connect(turn) => break turn,
                _ => std::thread::sleep(TURN_POLL),
            }
        };
        let started = std::time::Instant::now();
        one_at_a_time(|| ());
        runtime().block_on(one_at_a_time_async(async {}));
        let waited = started.elapsed();
        assert!(waited >= TURN_WAIT, "{waited:?}");
        assert!(waited < TURN_WAIT_IN_ALL, "{waited:?}");
        drop(held);
        let deadline = std::time::Instant::now() + TURN_WAIT;
        while !matches!(next(Instant::now()), Next::Connect(_)) {
            assert!(std::time::Instant::now() < deadline, "given back");
            std::thread::sleep(TURN_POLL);
        }
    }
}

#[cfg(all(test, feature = "sqlite", feature = "postgres"))]
mod backends {
    /// SQLite opens a file: looking for its socket would take another one.
    #[test]
    fn only_client_server_backends_have_a_socket() {
        assert!(!super::has_socket::<diesel::sqlite::Sqlite>());
        assert!(super::has_socket::<diesel::pg::Pg>());
    }
}
