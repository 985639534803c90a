//! Fault injection for the reliability tests: the server sessions a pool opens, a killer
//! that ends them at random moments, and the operation log that the end state is checked
//! against.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use diesel::r2d2::{CustomizeConnection, Pool};
use diesel_occ::{CheckedManager, Error, PoolConfig};
use serde::{Deserialize, Serialize};

/// The server sessions (PostgreSQL backend pids, MySQL connection ids) a pool opened.
#[derive(Debug, Clone, Default)]
pub struct Sessions(pub Arc<Mutex<Vec<i64>>>);

impl Sessions {
    /// A random session still believed alive, taken out of the list.
    fn take_one(&self) -> Option<i64> {
        let mut ids = self.0.lock().unwrap();
        if ids.is_empty() {
            return None;
        }
        let at = fastrand::usize(..ids.len());
        Some(ids.swap_remove(at))
    }
}

/// A connection customizer that registers each new connection's session id.
struct RegisterSessions<C> {
    sessions: Sessions,
    id_of: fn(&mut C) -> diesel::QueryResult<i64>,
}

impl<C> std::fmt::Debug for RegisterSessions<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisterSessions")
            .field("sessions", &self.sessions)
            .finish()
    }
}

impl<C: Send + 'static> CustomizeConnection<C, diesel::r2d2::Error> for RegisterSessions<C> {
    fn on_acquire(&self, conn: &mut C) -> Result<(), diesel::r2d2::Error> {
        let id = (self.id_of)(conn).map_err(diesel::r2d2::Error::QueryError)?;
        self.sessions.0.lock().unwrap().push(id);
        Ok(())
    }
}

/// A pool on `url` built as diesel-occ builds its pools (a [`CheckedManager`], checked on
/// checkout after `check_after_idle`), whose connections register their session ids.
pub fn pool_with_sessions<C>(
    url: &str,
    max_size: u32,
    id_of: fn(&mut C) -> diesel::QueryResult<i64>,
) -> (Pool<CheckedManager<C>>, Sessions)
where
    C: diesel::r2d2::R2D2Connection + Send + 'static,
{
    let sessions = Sessions::default();
    let config = PoolConfig::default();
    let pool = Pool::builder()
        .max_size(max_size)
        .min_idle(Some(1))
        .connection_timeout(Duration::from_secs(20))
        .test_on_check_out(true)
        .connection_customizer(Box::new(RegisterSessions {
            sessions: sessions.clone(),
            id_of,
        }))
        .build(CheckedManager::new(url, config.check_after_idle))
        .expect("a pool with registered sessions");
    (pool, sessions)
}

/// A thread that kills one of `sessions` every few milliseconds until it is stopped.
pub struct Killer {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<u64>,
}

impl Killer {
    /// Every `pause_ms` (drawn at random from the range), ends a random registered session
    /// with `kill`, which says whether a session was ended (it may have ended already).
    pub fn start(
        sessions: Sessions,
        pause_ms: std::ops::Range<u64>,
        mut kill: impl FnMut(i64) -> bool + Send + 'static,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut kills = 0;
            while !stopped.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(fastrand::u64(pause_ms.clone())));
                if let Some(id) = sessions.take_one() {
                    kills += u64::from(kill(id));
                }
            }
            kills
        });
        Killer { stop, thread }
    }

    /// Stops the killer; the number of sessions it ended.
    pub fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the killer thread")
    }
}

/// What an operation reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// It said it was applied.
    Done,
    /// It said its outcome is unknown ([`Error::Ambiguous`]).
    Ambiguous,
    /// It said it failed; the short class of the error.
    Failed(String),
}

impl Outcome {
    /// The outcome of `result`.
    pub fn of<T>(result: &Result<T, Error>) -> Self {
        match result {
            Ok(_) => Outcome::Done,
            Err(Error::Ambiguous { .. }) => Outcome::Ambiguous,
            Err(e) => Outcome::Failed(class_of(e)),
        }
    }
}

/// A short class of an error, for the tallies: the variant, and for database errors
/// whether the connection was lost.
pub fn class_of(error: &Error) -> String {
    match error {
        Error::Conflict(_) => "conflict".into(),
        Error::InvalidTransition(_) => "invalid transition".into(),
        Error::LockHeld { .. } => "lock held".into(),
        Error::LockLost { .. } => "lock lost".into(),
        Error::RetriesExhausted { last, .. } => format!("retries exhausted ({})", class_of(last)),
        Error::Retryable { reason, .. } => format!("retryable ({reason})"),
        Error::Pool(_) => "no pooled connection".into(),
        Error::Connection(_) => "cannot connect".into(),
        Error::Database(e) => format!("database: {}", first_words(&e.to_string())),
        other => format!("other: {other}"),
    }
}

/// The start of a message, without the parts that vary (ids, times).
fn first_words(message: &str) -> String {
    message
        .split(|c: char| c.is_ascii_digit() || c == ':' || c == '\n')
        .next()
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// One operation of a worker, as the log keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Op {
    /// Unique across processes: the process, the worker and a sequence number.
    pub id: String,
    /// What it did.
    pub kind: Kind,
    /// The row (or lock) it addressed.
    pub target: i64,
    /// What it reported.
    pub outcome: Outcome,
    /// For an acquisition: the fence it was given, or, when ambiguous, whether the lock
    /// row showed this acquisition right after.
    pub fence: Option<i64>,
    pub landed: Option<bool>,
    /// When it returned, in milliseconds since the Unix epoch.
    pub at_ms: u64,
}

/// Now, in milliseconds since the Unix epoch (comparable across processes).
pub fn now_ms() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    since.as_millis() as u64
}

/// The kinds of operations the fault workers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Kind {
    /// Read-merge-write of a JSON document (`merge_json`), retried on conflicts.
    Merge,
    /// `modify_pooled` setting a key of the document: each attempt on a new connection.
    ModifyPooled,
    /// One-statement merge (`merge_json_in_place`).
    MergeInPlace,
    /// A status transition whose hook records it in the history, on one transaction.
    Transition,
    /// `try_lock` of the shared lock, then two renewals and a release.
    Acquire,
    /// A renewal of a held lock.
    Renew,
    /// A release of a held lock.
    Release,
}

/// Counts of outcomes by kind, printed at the end of a run.
#[derive(Debug, Default)]
pub struct Tally(BTreeMap<(Kind, String), u64>);

impl Tally {
    pub fn add(&mut self, ops: &[Op]) {
        for op in ops {
            let outcome = match &op.outcome {
                Outcome::Done => "done".to_string(),
                Outcome::Ambiguous => match op.landed {
                    Some(true) => "ambiguous, then found applied".to_string(),
                    Some(false) => "ambiguous, then found not applied".to_string(),
                    // Renewals and releases: repeating one is harmless, nothing to find.
                    None if matches!(op.kind, Kind::Renew | Kind::Release) => {
                        "ambiguous".to_string()
                    }
                    // An acquisition whose lock row was read too late to tell.
                    None => "ambiguous, unresolved".to_string(),
                },
                Outcome::Failed(class) => format!("failed: {class}"),
            };
            *self.0.entry((op.kind, outcome)).or_default() += 1;
        }
    }

    /// One line per kind and outcome.
    pub fn report(&self) -> String {
        self.0
            .iter()
            .map(|((kind, outcome), n)| format!("  {kind:?}: {outcome}: {n}\n"))
            .collect()
    }
}
