//! W4, locks: acquire + release of a database lock by one worker alone and by 8
//! contenders waiting for the same lock (with the library's backoff), and how long a
//! standby takes to become leader after the leader stops renewing.
//!
//! Exactness checks: no two contenders inside the lock at once, every acquisition a new,
//! larger fencing token.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel_occ::Locks;
use diesel_occ::RetryPolicy;
use diesel_occ::{Candidate, ElectionTiming, LeaderEvent};

use crate::backend::per_backend;
use crate::measure::Latencies;
use crate::report::{Record, Report};
use crate::Settings;

const CONTENDERS: usize = 8;
const NAME: &str = "occ-bench";
const TTL: Duration = Duration::from_secs(30);

/// The election timing of the failover measurement: a 1 s lease, renewed every 200 ms.
const TIMING: ElectionTiming = ElectionTiming {
    lease: Duration::from_secs(1),
    renew_deadline: Duration::from_millis(700),
    retry_period: Duration::from_millis(200),
};

/// Fences must be unique (each acquisition a new term); how many were not.
fn repeated_fences(mut fences: Vec<i64>) -> usize {
    let all = fences.len();
    fences.sort_unstable();
    fences.dedup();
    all - fences.len()
}

per_backend! {
    pub fn run(settings: &Settings, report: &mut Report) -> Result<(), Box<dyn std::error::Error>> {
        report.section(
            "W4",
            "locks: acquire + release, and leader failover",
            "acquisitions per second ÷ one worker's alone (contention costs the waits)",
        );
        diesel_occ::migrations::run(&mut <Conn as Connection>::establish(&settings.url)?)?;
        let pool = pool(&settings.url, CONTENDERS as u32 + 2)?;
        let bar = report.progress("W4", 2 + settings.failovers as u64);

        // Alone.
        bar.set_message("one worker");
        let locks = Locks::new(pool.clone());
        let mut latencies = Latencies::default();
        let mut fences = Vec::new();
        let began = Instant::now();
        while began.elapsed() < settings.point {
            latencies.time(|| -> Result<(), diesel_occ::Error> {
                let guard = locks.try_lock(NAME, "alone", TTL, Some("bench"))?;
                fences.push(guard.fence());
                guard.release()
            })?;
        }
        let alone = Record::new("W4", "acquire + release", "1 worker")
            .ops(latencies.len() as u64, began.elapsed())
            .latencies(&latencies)
            .ratio(1.0)
            .with("repeated_fences", repeated_fences(fences));
        let base = alone.ops_per_second();
        bar.inc(1);
        bar.suspend(|| report.record(alone))?;

        // Contended.
        bar.set_message(format!("{CONTENDERS} contenders"));
        let inside = AtomicBool::new(false);
        let overlaps = Mutex::new(0_usize);
        let start = Barrier::new(CONTENDERS + 1);
        let policy = RetryPolicy::default();
        let (workers, elapsed) = std::thread::scope(|s| {
            let handles: Vec<_> = (0..CONTENDERS)
                .map(|_| {
                    let (locks, inside, overlaps, start, policy) = (&locks, &inside, &overlaps, &start, &policy);
                    s.spawn(move || -> (Latencies, Vec<i64>, usize) {
                        let (mut latencies, mut fences, mut refused) = (Latencies::default(), Vec::new(), 0);
                        start.wait();
                        let began = Instant::now();
                        while began.elapsed() < settings.point {
                            let t = Instant::now();
                            match locks.lock(NAME, "contended", TTL, Some("bench"), Duration::from_secs(10), policy) {
                                Ok(guard) => {
                                    if inside.swap(true, Ordering::SeqCst) {
                                        *overlaps.lock().unwrap() += 1;
                                    }
                                    fences.push(guard.fence());
                                    inside.store(false, Ordering::SeqCst);
                                    let released = guard.release();
                                    latencies.push(t.elapsed());
                                    if released.is_err() {
                                        refused += 1;
                                    }
                                }
                                Err(_) => refused += 1,
                            }
                        }
                        (latencies, fences, refused)
                    })
                })
                .collect();
            start.wait();
            let began = Instant::now();
            let workers: Vec<_> = handles.into_iter().map(|h| h.join().expect("a contender panicked")).collect();
            (workers, began.elapsed())
        });
        let counts: Vec<usize> = workers.iter().map(|w| w.0.len()).collect();
        let refused: usize = workers.iter().map(|w| w.2).sum();
        let mut latencies = Latencies::default();
        let mut fences = Vec::new();
        for (l, f, _) in workers {
            latencies.extend(l);
            fences.extend(f);
        }
        let contended = Record::new("W4", "acquire + release", format!("{CONTENDERS} contenders, waiting"))
            .ops(latencies.len() as u64, elapsed)
            .latencies(&latencies)
            .with("worker_min", counts.iter().min().copied().unwrap_or(0))
            .with("worker_max", counts.iter().max().copied().unwrap_or(0))
            .with("failed", refused)
            .with("overlaps", *overlaps.lock().unwrap())
            .with("repeated_fences", repeated_fences(fences));
        let ratio = contended.ops_per_second() / base;
        let contended = contended.ratio(ratio);
        bar.inc(1);
        bar.suspend(|| report.record(contended))?;

        // Failover: a leader that stops renewing (as if its process froze), a standby
        // campaigning every retry period.
        let (mut failovers, mut beliefs) = (Latencies::default(), Latencies::default());
        for i in 0..settings.failovers {
            bar.set_message(format!("failover {}", i + 1));
            let resource = format!("leader-{}-{i}", std::process::id());
            let requested = Instant::now();
            let leader = locks.try_lock(NAME, &resource, TIMING.lease, Some("frozen leader"))?;
            // The frozen leader's own belief ends a tenth of the lease early (the safety
            // margin): from then until the standby is elected, nobody acts.
            if let Some(deadline) = leader.deadline() {
                beliefs.push(deadline - requested);
            }
            // Never released, never renewed: its lease must run out by the database's clock.
            std::mem::forget(leader);
            let standby = Candidate::start(Locks::new(pool.clone()), NAME, &resource, "standby", TIMING)?;
            match standby.events().recv_timeout(TIMING.lease * 5) {
                Ok(LeaderEvent::Elected { .. }) => failovers.push(requested.elapsed()),
                other => return Err(format!("the standby was not elected: {other:?}").into()),
            }
            standby.stop();
            bar.inc(1);
        }
        let failover = Record::new("W4", "leader failover", "standby takes over")
            .ops(failovers.len() as u64, failovers.total())
            .latencies(&failovers)
            .with("lease_ms", TIMING.lease.as_millis() as u64)
            .with("frozen_leader_belief_ms", (beliefs.total().as_millis() as u64) / (beliefs.len().max(1) as u64))
            .with("retry_period_ms", TIMING.retry_period.as_millis() as u64);
        bar.suspend(|| report.record(failover))?;
        bar.finish_and_clear();
        Ok(())
    }
}
