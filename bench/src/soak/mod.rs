//! `occ-bench --soak OPS`: a mixed workload against one backend with faults throughout,
//! every call recorded (`history.jsonl`), then judged per key by an independent
//! linearizability checker. RELIABILITY.md has the figures of the long runs and how to
//! run them again (`scripts/soak.sh`).

pub mod candidate;
mod check;
mod elections;
mod faults;
mod history;
mod locks;
mod model;
mod orders;
mod outcome;
mod rows;
mod stall;
mod workload;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use crate::backend::Backend;
use history::{Recorder, What};

/// A kind of fault the soak injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    /// Sessions of the soak killed by the server.
    Kills,
    /// Rows of the current round (SQLite: the write lock) held by another transaction.
    Stalls,
    /// Async calls dropped part-way, as a client that gives up.
    Drops,
    /// A leader's process frozen (SIGSTOP) past its lease, then resumed.
    Freezes,
    /// Every connection of a pool taken and held past the pool's checkout timeout.
    Exhaustion,
}

/// The sizes and switches of one soak run.
#[derive(Debug, Clone)]
pub struct SoakSettings {
    /// The database: prepared, audited, and the one faults hit.
    pub url: String,
    /// The nodes workers and candidates are spread over: `url` alone, or a cluster's.
    pub nodes: Vec<String>,
    /// Operations in all (the run also ends after `seconds`, when given).
    pub ops: u64,
    pub seconds: Option<f64>,
    /// Blocking threads, and tokio tasks on the async API.
    pub threads: usize,
    pub tasks: usize,
    pub keys_per_round: u64,
    pub ops_per_round: u64,
    pub faults: Vec<Fault>,
    /// Guarded updates sent without their guard: the checker must find the damage.
    pub broken_guard: bool,
    /// A shell command run every `outage_every` (a server restarted, a cluster node
    /// killed and started again, a failover), with its answer awaited.
    pub outage: Option<String>,
    pub outage_every: std::time::Duration,
    /// At most this many runs of `outage`.
    pub outage_times: u64,
    pub seed: u64,
    pub out: PathBuf,
}

macro_rules! soak_on {
    ($backend:ident, $settings:expr, $recorder:expr, $plan:expr) => {
        (|| -> Result<(), Box<dyn std::error::Error>> {
            use workload::$backend as on;
            let settings: &SoakSettings = $settings;
            let (recorder, plan) = ($recorder, $plan);
            on::prepare(&settings.url, plan)?;
            let exhaust = settings.faults.contains(&Fault::Exhaustion);
            // Per node (one, off a cluster): an r2d2 pool with a connection per blocking
            // worker, and a bb8 and a deadpool pool with one per two of its async tasks,
            // so that tasks also wait for connections.
            let threads = settings.threads.max(1) as u32;
            let tasks = (settings.tasks as u32 / 4).max(1);
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            let mut pools = Vec::new();
            for url in &settings.nodes {
                let config = diesel_occ::PoolConfig {
                    connection_timeout: workload::CHECKOUT_TIMEOUT,
                    ..crate::backend::pool_config(threads)
                };
                let bb8 = runtime.block_on(on::bb8_pool(url, tasks))?;
                let _entered = runtime.enter();
                pools.push((
                    on::pool_with(url, &config)?,
                    bb8,
                    on::deadpool_pool(url, tasks as usize)?,
                ));
            }
            let node = |worker: usize| &pools[worker % pools.len()];
            std::thread::scope(|s| {
                for id in 0..settings.threads {
                    let mut worker = workload::Worker::new(id as u64, settings.seed);
                    worker.exhaust = (exhaust && id == 0).then_some((3_000, threads as usize));
                    let pool = &node(id).0;
                    s.spawn(move || {
                        on::blocking_worker(worker, pool, plan, recorder, settings.broken_guard)
                    });
                }
                runtime.block_on(async {
                    let drop_one_in = if settings.faults.contains(&Fault::Drops) {
                        50
                    } else {
                        0
                    };
                    let mut all: Vec<
                        std::pin::Pin<Box<dyn std::future::Future<Output = ()> + '_>>,
                    > = Vec::new();
                    for t in 0..settings.tasks {
                        let mut worker =
                            workload::Worker::new((settings.threads + t) as u64, settings.seed);
                        worker.exhaust = (exhaust && t < 2).then_some((3_000, tasks as usize));
                        let (_, bb8, deadpool) = node(t / 2);
                        all.push(if t % 2 == 0 {
                            let pool = bb8.clone();
                            Box::pin(on::async_worker(
                                worker,
                                pool,
                                plan,
                                recorder,
                                drop_one_in,
                                "async-bb8",
                            ))
                        } else {
                            let pool = deadpool.clone();
                            Box::pin(on::async_worker(
                                worker,
                                pool,
                                plan,
                                recorder,
                                drop_one_in,
                                "async-deadpool",
                            ))
                        });
                    }
                    futures_join_all(all).await;
                });
            });
            Ok(())
        })()
    };
}

/// Awaits every future of `all` on the current task.
async fn futures_join_all(
    mut set: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + '_>>>,
) {
    // Poll them together: each is a worker loop that yields at its awaits.
    std::future::poll_fn(|cx| {
        set.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if set.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await
}

/// Runs the soak on `backend`, then judges its history; an error when the checker finds
/// a key no order explains, or the library answered with a raw error.
pub fn run(backend: Backend, mut settings: SoakSettings) -> Result<(), Box<dyn std::error::Error>> {
    if backend == Backend::Postgres {
        for url in std::iter::once(&mut settings.url).chain(&mut settings.nodes) {
            let separator = if url.contains('?') { '&' } else { '?' };
            *url = format!("{url}{separator}application_name={}", faults::APPLICATION);
        }
    }
    std::fs::create_dir_all(&settings.out)?;
    let path = settings.out.join("history.jsonl");
    let recorder = Recorder::create(&path)?;
    let plan = workload::Plan::new(&settings);
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let (phase, finished) = (stall::Phase::new("the workers"), AtomicBool::new(false));
    let (injected, audit) = std::thread::scope(|s| {
        s.spawn(|| stall::watch(&recorder, &phase, &finished));
        let _finished = stall::Finished(&finished);
        let from_outside = settings
            .faults
            .iter()
            .any(|f| [Fault::Kills, Fault::Stalls].contains(f));
        let elections = {
            let (nodes, plan, recorder, stop) = (&settings.nodes, &plan, &recorder, &stop);
            let freeze = settings.faults.contains(&Fault::Freezes);
            s.spawn(move || {
                elections::run(backend, nodes, plan, recorder, stop, freeze, settings.seed)
            })
        };
        let outages = settings.outage.as_deref().map(|command| {
            let (every, times, plan, stop) =
                (settings.outage_every, settings.outage_times, &plan, &stop);
            s.spawn(move || faults::outages(command, every, times, plan, stop))
        });
        let faults = from_outside.then(|| {
            let (url, plan, stop, kinds) = (&settings.url, &plan, &stop, &settings.faults);
            s.spawn(move || faults::inject(backend, url, plan, stop, kinds, settings.seed))
        });
        let ran = match backend {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite { .. } => soak_on!(sqlite, &settings, &recorder, &plan),
            #[cfg(feature = "postgres")]
            Backend::Postgres => soak_on!(postgres, &settings, &recorder, &plan),
            #[cfg(feature = "mysql")]
            Backend::Mysql => soak_on!(mysql, &settings, &recorder, &plan),
            #[allow(unreachable_patterns)]
            _ => Err("this build does not have the backend".into()),
        };
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        phase.set("the fault thread");
        let mut injected = faults
            .map(|f| f.join().expect("the fault thread ends"))
            .unwrap_or_default();
        phase.set("the elections' candidates to end");
        injected.extend(elections.join().expect("the elections end"));
        if let Some(outages) = outages {
            phase.set("the outage command");
            injected.extend(outages.join().expect("the outages end"));
        }
        // Read once the faults stopped: a killed session would lose the read.
        phase.set("the lock audit's read");
        let audit = ran.and_then(|()| match backend {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite { .. } => workload::sqlite::audit(&settings.url),
            #[cfg(feature = "postgres")]
            Backend::Postgres => workload::postgres::audit(&settings.url),
            #[cfg(feature = "mysql")]
            Backend::Mysql => workload::mysql::audit(&settings.url),
            #[allow(unreachable_patterns)]
            _ => Err("this build does not have the backend".into()),
        });
        audit
            .map(|audit| (injected, audit))
            .map_err(|e| e.to_string())
    })?;
    recorder.flush()?;
    let elapsed = started.elapsed();
    println!(
        "soak on {}: {} operations in {:.1} s ({} blocking threads, {} async tasks), history in {}",
        backend.name(),
        plan.done(),
        elapsed.as_secs_f64(),
        settings.threads,
        settings.tasks,
        path.display()
    );
    let mut injected = injected;
    injected.insert("pool_exhausted", plan.exhaustions());
    injected.retain(|_, n| *n > 0);
    println!("faults injected: {}", describe(&injected));
    let audited = judge_audit(&audit);
    let judged = judge(&path);
    let bed = match injected.get("outage_failed") {
        Some(_) => Err("the outage command failed: the test bed did not come back".into()),
        None => Ok(()),
    };
    audited.and(judged).and(bed)
}

/// Prints what the lock audit table says; an error when a lock had two holders at once
/// or a fence did not follow the one before.
fn judge_audit(audit: &locks::Audit) -> Result<(), Box<dyn std::error::Error>> {
    println!(
        "lock audit (a trigger on the lock table, database clock): {} grants of {} locks, {} after \
         the previous holder's lease ended unreleased; {} while a lease lasted, {} fences out of \
         order",
        audit.grants,
        audit.locks,
        audit.after_lease_end,
        audit.overlapping.len(),
        audit.broken_chain.len()
    );
    for line in audit.overlapping.iter().chain(&audit.broken_chain).take(5) {
        println!("  {line}");
    }
    if audit.passed() {
        Ok(())
    } else {
        Err("the lock audit found two holders at once or fences out of order".into())
    }
}

/// How long the checker may take over a history: a run of this soak takes it about a
/// second; a history it cannot decide in minutes fails the run rather than hold it.
const CHECK_BUDGET: std::time::Duration = std::time::Duration::from_secs(120);

/// Judges the history at `path` and prints the counts and the verdict.
pub fn judge(path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let events = history::read(path)?;
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    let mut raw = Vec::new();
    for event in &events {
        let kind = match &event.what {
            What::Invoke { .. } => continue,
            What::Return { outcome, .. } => outcome.clone(),
            What::Unknown { outcome, .. } => {
                if outcome.starts_with("raw") {
                    raw.push(outcome.clone());
                }
                format!("unknown: {}", outcome.split(':').next().unwrap_or(outcome))
            }
        };
        *outcomes.entry(kind).or_default() += 1;
    }
    println!("outcomes: {}", describe(&outcomes));
    // The soak's table has no trigger, rule or policy: a refusal is a wrong answer.
    let refused = outcomes.get("refused").copied().unwrap_or(0);
    let started = Instant::now();
    let verdict = check::check_within(events, CHECK_BUDGET).map_err(|gave_up| {
        format!(
            "the checker gave up after {} s on key {} ({} of its calls never answered): \
             its history is in {}",
            CHECK_BUDGET.as_secs(),
            gave_up.key,
            gave_up.unanswered,
            path.display()
        )
    })?;
    println!(
        "checker (stateright LinearizabilityTester, per key): {} operations on {} keys in {:.1} s: \
         {} keys not linearizable, {} malformed, {} raw errors",
        verdict.operations,
        verdict.keys,
        started.elapsed().as_secs_f64(),
        verdict.violations.len(),
        verdict.malformed.len(),
        raw.len()
    );
    for (key, events) in verdict.violations.iter().take(3) {
        println!("key {key} has no linearization; its history:");
        for event in events {
            println!("  {}", serde_json::to_string(event)?);
        }
    }
    for (key, why) in verdict.malformed.iter().take(3) {
        println!("key {key}: malformed history: {why}");
    }
    for error in raw.iter().take(5) {
        println!("raw error: {error}");
    }
    if refused > 0 {
        println!("{refused} writes answered Refused, though nothing here refuses a write");
    }
    if verdict.violations.is_empty()
        && verdict.malformed.is_empty()
        && raw.is_empty()
        && refused == 0
    {
        println!("verdict: linearizable");
        Ok(())
    } else {
        Err("verdict: NOT linearizable, or wrong answers: see above".into())
    }
}

fn describe<K: std::fmt::Display>(counts: &BTreeMap<K, u64>) -> String {
    if counts.is_empty() {
        return "none".into();
    }
    counts
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}
