//! A candidate of the soak's leader elections, in a process of its own (`occ-bench
//! --soak-candidate URL EPOCH INDEX`), so that the soak can freeze it with SIGSTOP past
//! its lease. While it leads, it writes the election's row under its term's fence every
//! 20 ms, and once more with the same fence after its term ended (a leader that woke up
//! late and wrote before looking): the row must refuse that write once a newer leader
//! wrote.
//!
//! Its calls are relayed to the soak, which records them ([`super::elections`]): a line
//! on standard output before each call, sent only once the soak answered it on standard
//! input (so the recorded start precedes the call), and a line with the answer. Standard
//! input closing ends the candidate.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use diesel::prelude::*;
use diesel_occ::prelude::*;
use diesel_occ::{Candidate, ElectionTiming, Held, Locks};
use serde::{Deserialize, Serialize};

use super::history::What;
use super::locks;
use super::model::{Op, Ret};
use super::outcome::judged;
use super::workload;
use crate::backend::{per_backend, Backend};

/// The lock name of the elections; each epoch's resource is its number.
pub const LEADER: &str = "occ-soak-leader";

/// A 1 s lease, renewed every 200 ms, given up after 700 ms without a renewal.
pub const TIMING: ElectionTiming = ElectionTiming {
    lease: Duration::from_secs(1),
    renew_deadline: Duration::from_millis(700),
    retry_period: Duration::from_millis(200),
};

/// The key of epoch `epoch`'s election in the history (and of its row): below zero, apart
/// from the run's other keys.
pub fn key_of(epoch: u64) -> i64 {
    -(epoch as i64) - 1
}

/// The caller id of candidate `index` in its `generation`.
fn caller(index: u64, generation: u64) -> u64 {
    (1000 + index) << 24 | generation
}

/// One line between a candidate and the soak.
#[derive(Debug, Serialize, Deserialize)]
pub struct Relayed {
    pub caller: u64,
    pub key: i64,
    #[serde(flatten)]
    pub what: What,
}

/// The candidate's side of the relay.
pub struct Relay {
    out: Mutex<std::io::Stdout>,
    acks: Mutex<mpsc::Receiver<()>>,
    generation: Mutex<u64>,
    closed: AtomicBool,
    index: u64,
    /// The API the candidate campaigns on, as the history names it.
    driver: &'static str,
}

impl Relay {
    /// Runs `call` as `op` on `key`, recorded by the soak; nothing when the soak is gone.
    fn call(&self, key: i64, op: Op, call: impl FnOnce() -> Result<Ret, diesel_occ::Error>) {
        if let Some(caller) = self.begin(key, &op) {
            self.end(caller, key, &op, call());
        }
    }

    /// [`call`](Self::call) of a future, from a task of a multi-threaded runtime: the
    /// wait for the soak's answer does not hold up the runtime's other tasks (renewals).
    async fn call_async(
        &self,
        key: i64,
        op: Op,
        call: impl std::future::Future<Output = Result<Ret, diesel_occ::Error>>,
    ) {
        let Some(caller) = tokio::task::block_in_place(|| self.begin(key, &op)) else {
            return;
        };
        // The job's future is dropped at an await when its term ends: the call's outcome
        // is then unknown, and the history must say so.
        let mut pending = Pending {
            relay: self,
            caller,
            key,
            answered: false,
        };
        let answer = call.await;
        pending.answered = true;
        tokio::task::block_in_place(|| self.end(caller, key, &op, answer));
    }

    /// Sends the start of `op` on `key` and waits until the soak recorded it: the
    /// caller id, or `None` when the soak is gone.
    fn begin(&self, key: i64, op: &Op) -> Option<u64> {
        let generation = self.generation.lock().unwrap_or_else(|p| p.into_inner());
        let caller = caller(self.index, *generation);
        let invoke = What::Invoke {
            op: op.clone(),
            driver: self.driver.into(),
        };
        // Closed for good once the soak stopped answering: it did not record the start.
        let acks = self.acks.lock().unwrap_or_else(|p| p.into_inner());
        if self.closed.load(Ordering::SeqCst)
            || !self.send(caller, key, invoke)
            || acks.recv().is_err()
        {
            self.closed.store(true, Ordering::SeqCst);
            return None;
        }
        Some(caller)
    }

    /// Sends the answer of the call `begin` started; an unknown outcome ends the caller's
    /// generation, as a worker's does.
    fn end(&self, caller: u64, key: i64, op: &Op, answer: Result<Ret, diesel_occ::Error>) {
        let what = judged(op, answer, |_| None);
        if matches!(what, What::Unknown { .. }) {
            self.next_generation();
        }
        self.send(caller, key, what);
    }

    /// Ends the caller's generation after an unknown outcome.
    fn next_generation(&self) {
        *self.generation.lock().unwrap_or_else(|p| p.into_inner()) += 1;
    }

    fn send(&self, caller: u64, key: i64, what: What) -> bool {
        let line = serde_json::to_string(&Relayed { caller, key, what }).expect("a line");
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        writeln!(out, "{line}").and_then(|()| out.flush()).is_ok()
    }
}

/// A relayed async call not yet answered: dropped so, it is recorded as dropped.
struct Pending<'r> {
    relay: &'r Relay,
    caller: u64,
    key: i64,
    answered: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.relay.next_generation();
            let dropped = What::Unknown {
                outcome: "dropped".into(),
                error: None,
            };
            self.relay.send(self.caller, self.key, dropped);
        }
    }
}

/// Runs candidate `index` of election `epoch` until standard input closes.
pub fn run(
    backend: Backend,
    url: &str,
    epoch: u64,
    index: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let (ack, acks) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            if line.is_err() || ack.send(()).is_err() {
                break;
            }
        }
        stopping.store(true, Ordering::SeqCst);
    });
    let relay = Arc::new(Relay {
        out: Mutex::new(std::io::stdout()),
        acks: Mutex::new(acks),
        generation: Mutex::new(0),
        closed: AtomicBool::new(false),
        index,
        // Every other candidate on the async API: the two kinds compete in one election.
        // Without diesel's statement cache (a pooler that keeps no prepared statements),
        // all on the blocking API: diesel-async names every statement it prepares.
        driver: if index % 2 == 0 || !crate::backend::statement_cache() {
            "candidate"
        } else {
            "async-candidate"
        },
    });
    match backend {
        #[cfg(feature = "sqlite")]
        Backend::Sqlite { .. } => sqlite::campaign(url, epoch, index, relay, &stop),
        #[cfg(feature = "postgres")]
        Backend::Postgres => postgres::campaign(url, epoch, index, relay, &stop),
        #[cfg(feature = "mysql")]
        Backend::Mysql => mysql::campaign(url, epoch, index, relay, &stop),
        #[allow(unreachable_patterns)]
        _ => Err("this build does not have the backend".into()),
    }
}

per_backend! {
    uses(locks, workload)

    /// A leader's term: a fenced write every 20 ms while it leads, one more after.
    fn term(relay: &Relay, pool: &Pool, key: i64, held: &Held) {
        let fence = held.fence();
        let mut value = 0;
        let write = |value: i64| {
            let op = Op::FencedWrite { fence, value };
            relay.call(key, op, || {
                let mut conn = pool.get().map_err(|e| diesel_occ::Error::Pool(Box::new(e)))?;
                locks::SoakFenced::write_fenced(&mut conn, &key, locks::soak_fenced::last_fence, fence, locks::soak_fenced::value.eq(value))?;
                Ok(Ret::Done)
            })
        };
        while held.is_held() {
            value += 1;
            write(value);
            std::thread::sleep(Duration::from_millis(20));
        }
        write(value + 1);
    }

    /// A leader's term on the async API: a fenced write every 20 ms while it leads. The
    /// job is dropped at an await when the term ends, so no write follows it; a write in
    /// flight when the process was frozen arrives late, under the old fence.
    async fn term_async(relay: Arc<Relay>, pool: workload::Bb8Pool, key: i64, held: Held) {
        use diesel_occ::asynchronous::{AsyncConnectionSource, AsyncFencedWrite};
        let fence = held.fence();
        let mut value = 0;
        while held.is_held() {
            value += 1;
            let write = async {
                let mut conn = pool.checkout().await?;
                <locks::SoakFenced as AsyncFencedWrite>::write_fenced(&mut *conn, &key, locks::soak_fenced::last_fence, fence, locks::soak_fenced::value.eq(value)).await?;
                Ok(Ret::Done)
            };
            relay.call_async(key, Op::FencedWrite { fence, value }, write).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Campaigns on the async API (an `AsyncCandidate` on a bb8 pool) until `stop`.
    fn campaign_async(url: &str, epoch: u64, label: &str, relay: Arc<Relay>, stop: &AtomicBool) -> Result<(), Box<dyn std::error::Error>> {
        use diesel_occ::asynchronous::{AsyncCandidate, AsyncLocks};
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
        runtime.block_on(async {
            let pool = workload::bb8_pool(url, 3).await?;
            let (job_pool, key) = (pool.clone(), key_of(epoch));
            let job = move |held: Held| term_async(relay.clone(), job_pool.clone(), key, held);
            let candidate = AsyncCandidate::start_with_job(AsyncLocks::new(pool), LEADER, &epoch.to_string(), label, TIMING, job)?;
            while !stop.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            candidate.stop().await;
            Ok(())
        })
    }

    pub fn campaign(url: &str, epoch: u64, index: u64, relay: Arc<Relay>, stop: &AtomicBool) -> Result<(), Box<dyn std::error::Error>> {
        let pool = pool(url, 3)?;
        let key = key_of(epoch);
        // The election's row, as every candidate of the epoch finds it before it writes;
        // tried again while its node is not ready (restarted, rejoining a cluster) or
        // another node's insert of the same row won.
        let row = locks::SoakFenced { id: key, version: 0, last_fence: 0, value: 0 };
        let mut tries = 0;
        loop {
            let inserted = pool.get().map_err(|e| e.to_string()).and_then(|mut conn| {
                diesel::insert_into(locks::soak_fenced::table).values(&row).execute(&mut conn).map_err(|e| match e {
                    diesel::result::Error::DatabaseError(diesel::result::DatabaseErrorKind::UniqueViolation, _) => String::new(),
                    e => e.to_string(),
                })
            });
            match inserted {
                Ok(_) => break,
                Err(e) if e.is_empty() => break,
                Err(e) if tries == 100 => return Err(e.into()),
                Err(_) => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        let label = format!("candidate {index} pid {}", std::process::id());
        if relay.driver == "async-candidate" {
            return campaign_async(url, epoch, &label, relay, stop);
        }
        let job_pool = pool.clone();
        let candidate = Candidate::start_with_job(Locks::new(pool), LEADER, &epoch.to_string(), &label, TIMING, move |held: &Held| {
            term(&relay, &job_pool, key, held)
        })?;
        while !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
        candidate.stop();
        Ok(())
    }
}
