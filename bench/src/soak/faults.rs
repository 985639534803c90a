//! Faults injected while the workers run, from a connection of their own: a session of
//! the soak killed by the server (PostgreSQL `pg_terminate_backend`, MariaDB `KILL`), and
//! a stall (a transaction that holds a row of the current round, a data row, an order
//! or a lock's row in the lock table, or on SQLite the write lock, for up to 300 ms);
//! and outages, a command run on a schedule (a server restarted, a cluster node killed
//! and started again, a failover). The async workers also drop some of their calls part-way
//! (`workload::async_worker`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;

use super::locks::NAME;
use super::model::Kind;
use super::workload::Plan;
use super::Fault;
use crate::backend::Backend;

/// The application name the soak's sessions carry on PostgreSQL, so that only they are
/// killed.
pub const APPLICATION: &str = "occ-soak";

/// How many faults of each kind were injected.
pub type Injected = BTreeMap<&'static str, u64>;

#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(diesel::QueryableByName)]
struct Session {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    id: i64,
}

/// Injects faults of `kinds` (kills and stalls) every 50-250 ms until `stop`.
pub fn inject(
    backend: Backend,
    url: &str,
    plan: &Plan,
    stop: &AtomicBool,
    kinds: &[Fault],
    seed: u64,
) -> Injected {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut injected = Injected::new();
    let embedded = matches!(backend, Backend::Sqlite { .. });
    let kills = kinds.contains(&Fault::Kills) && !embedded;
    let stalls = kinds.contains(&Fault::Stalls);
    plan.await_start(stop);
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(rng.u64(50..250)));
        let stall_now = stalls && (!kills || rng.bool());
        let kind = if stall_now {
            stall(backend, url, plan, &mut rng)
        } else if kills {
            kill(backend, url)
        } else {
            None
        };
        if let Some(kind) = kind {
            *injected.entry(kind).or_default() += 1;
        }
    }
    injected
}

/// Kills one session of the soak; the kind injected, or `None` when there was none.
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql")),
    allow(unused_variables)
)]
fn kill(backend: Backend, url: &str) -> Option<&'static str> {
    match backend {
        #[cfg(feature = "postgres")]
        Backend::Postgres => {
            let mut conn = crate::backend::establish::<diesel::PgConnection>(url).ok()?;
            let found: Vec<Session> = diesel::sql_query(format!(
                "SELECT pg_terminate_backend(pid)::int::bigint AS id FROM pg_stat_activity \
                 WHERE application_name = '{APPLICATION}' AND pid <> pg_backend_pid() \
                 ORDER BY random() LIMIT 1"
            ))
            .load(&mut conn)
            .ok()?;
            (!found.is_empty()).then_some("session_killed")
        }
        #[cfg(feature = "mysql")]
        Backend::Mysql => {
            let mut conn = crate::backend::establish::<diesel::MysqlConnection>(url).ok()?;
            let found: Vec<Session> = diesel::sql_query(
                "SELECT CAST(id AS SIGNED) AS id FROM information_schema.processlist \
                 WHERE db = DATABASE() AND id <> CONNECTION_ID() ORDER BY RAND() LIMIT 1",
            )
            .load(&mut conn)
            .ok()?;
            let session = found.first()?;
            conn.batch_execute(&format!("KILL {}", session.id)).ok()?;
            Some("session_killed")
        }
        _ => None,
    }
}

/// Holds a row of the current round (SQLite: the write lock) for 20-300 ms.
fn stall(
    backend: Backend,
    url: &str,
    plan: &Plan,
    rng: &mut fastrand::Rng,
) -> Option<&'static str> {
    let keys = plan.current_keys();
    let key = rng.i64(keys);
    let hold = Duration::from_millis(rng.u64(20..300));
    let (begin, lock) = match backend {
        Backend::Sqlite { .. } => ("BEGIN IMMEDIATE", String::new()),
        _ => ("BEGIN", {
            let row = match plan.kind_of(key) {
                Kind::Row => format!("soak_rows WHERE id = {key}"),
                Kind::Order => format!("soak_orders WHERE id = {key}"),
                Kind::Lock => {
                    format!("occ_locks WHERE lock_name = '{NAME}' AND resource = '{key}'")
                }
            };
            format!("SELECT 1 FROM {row} FOR UPDATE")
        }),
    };
    let run = |conn: &mut dyn FnMut(&str) -> QueryResult<()>| -> Option<()> {
        conn(begin).ok()?;
        if !lock.is_empty() {
            conn(&lock).ok()?;
        }
        std::thread::sleep(hold);
        conn("COMMIT").ok()
    };
    let held = match backend {
        #[cfg(feature = "sqlite")]
        Backend::Sqlite { .. } => {
            let mut c = crate::backend::establish::<diesel::SqliteConnection>(url).ok()?;
            c.batch_execute("PRAGMA busy_timeout = 5000").ok()?;
            run(&mut |sql| c.batch_execute(sql))
        }
        #[cfg(feature = "postgres")]
        Backend::Postgres => {
            let mut c = crate::backend::establish::<diesel::PgConnection>(url).ok()?;
            run(&mut |sql| c.batch_execute(sql))
        }
        #[cfg(feature = "mysql")]
        Backend::Mysql => {
            let mut c = crate::backend::establish::<diesel::MysqlConnection>(url).ok()?;
            run(&mut |sql| c.batch_execute(sql))
        }
        #[allow(unreachable_patterns)]
        _ => None,
    };
    held.map(|()| "row_stalled")
}

/// Runs `command` (with `bash -c`) every `every`, at most `times` times, until `stop`,
/// each run awaited: a server restart, a cluster node killed and started again, a
/// failover. A run that fails ends the soak early, and the soak then fails.
pub fn outages(
    command: &str,
    every: Duration,
    times: u64,
    plan: &Plan,
    stop: &AtomicBool,
) -> Injected {
    let mut injected = Injected::new();
    plan.await_start(stop);
    let mut next = std::time::Instant::now() + every;
    let mut runs = 0;
    while !stop.load(Ordering::Relaxed) && runs < times {
        if std::time::Instant::now() < next {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        let ran = std::process::Command::new("bash")
            .args(["-c", command])
            .stdout(std::process::Stdio::null())
            .status();
        let kind = match ran {
            Ok(status) if status.success() => "outage",
            // The bed did not come back: the rest of the run would measure a broken bed
            // (a strict synchronous primary without its standby holds every commit).
            _ => {
                eprintln!("soak: the outage command failed ({ran:?}); the run ends here");
                plan.end_early();
                "outage_failed"
            }
        };
        *injected.entry(kind).or_default() += 1;
        runs += 1;
        next = std::time::Instant::now() + every;
    }
    injected
}
