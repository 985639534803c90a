//! The soak's leader elections: every 8 s a new election (an epoch) among three candidate
//! processes ([`super::candidate`]), whose calls are relayed into the history; with the
//! `freezes` fault, the leader's process is stopped with SIGSTOP for longer than its
//! lease, then resumed, so that another candidate takes over while it sleeps and its
//! writes after waking meet a newer fence.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use diesel::prelude::*;

use super::candidate::{Relayed, LEADER, TIMING};
use super::faults::Injected;
use super::history::{Recorder, What};
use super::workload::Plan;
use crate::backend::{per_backend, Backend};

/// Candidates per election.
const CANDIDATES: u64 = 3;

/// How long each election lasts.
const EPOCH: Duration = Duration::from_secs(8);

/// Runs elections among candidates spread over `nodes`, one after the other, from the
/// first operation of `plan` until `stop`;
/// with `freeze`, freezes each one's leader once. What was injected.
pub fn run(
    backend: Backend,
    nodes: &[String],
    plan: &Plan,
    recorder: &Recorder,
    stop: &AtomicBool,
    freeze: bool,
    seed: u64,
) -> Injected {
    let mut injected = Injected::new();
    plan.await_start(stop);
    let mut rng = fastrand::Rng::with_seed(seed.rotate_left(17));
    let mut epoch = 0;
    while !stop.load(Ordering::Relaxed) {
        match election(backend, nodes, recorder, stop, freeze, epoch, &mut rng) {
            Ok(frozen) => {
                *injected.entry("elections").or_default() += 1;
                *injected.entry("leader_frozen").or_default() += frozen;
            }
            Err(e) => {
                eprintln!("election {epoch}: {e}");
                *injected.entry("election_not_run").or_default() += 1;
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        epoch += 1;
    }
    injected.retain(|_, n| *n > 0);
    injected
}

/// One election: its candidates started, relayed, the leader frozen once (with `freeze`),
/// and all stopped at the end of the epoch. How many leaders were frozen.
fn election(
    backend: Backend,
    nodes: &[String],
    recorder: &Recorder,
    stop: &AtomicBool,
    freeze: bool,
    epoch: u64,
    rng: &mut fastrand::Rng,
) -> Result<u64, Box<dyn std::error::Error>> {
    let began = Instant::now();
    let mut children: Vec<Child> = Vec::new();
    let url = &nodes[0];
    for index in 0..CANDIDATES {
        let node = &nodes[index as usize % nodes.len()];
        let child = Command::new(std::env::current_exe()?)
            .args([
                "--soak-candidate",
                node,
                &epoch.to_string(),
                &index.to_string(),
            ])
            .args((!crate::backend::statement_cache()).then_some("--no-statement-cache"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        children.push(child);
    }
    let inputs: Vec<Mutex<Option<ChildStdin>>> = children
        .iter_mut()
        .map(|c| Mutex::new(c.stdin.take()))
        .collect();
    let outputs: Vec<_> = children.iter_mut().map(|c| c.stdout.take()).collect();
    let frozen = std::thread::scope(|s| {
        for (output, input) in outputs.into_iter().zip(&inputs) {
            let Some(output) = output else { continue };
            s.spawn(move || relay(output, input, recorder));
        }
        let until = |at: Duration| {
            while began.elapsed() < at && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        until(Duration::from_secs(2));
        let mut frozen = 0;
        if freeze && !stop.load(Ordering::Relaxed) {
            if let Some(pid) = leader_pid(backend, url, epoch) {
                let nap = TIMING.lease + Duration::from_millis(rng.u64(300..1500));
                if signal("STOP", pid) {
                    std::thread::sleep(nap);
                    signal("CONT", pid);
                    frozen = 1;
                }
            }
        }
        until(EPOCH);
        // Each candidate steps down and ends once its input closes.
        for input in &inputs {
            input.lock().unwrap_or_else(|p| p.into_inner()).take();
        }
        frozen
    });
    for mut child in children {
        child.wait()?;
    }
    Ok(frozen)
}

/// Records the calls a candidate relays; answers each start once it is recorded. Once
/// its input is closed, a start is neither recorded nor answered: the candidate then
/// does not make the call.
fn relay(output: impl std::io::Read, input: &Mutex<Option<ChildStdin>>, recorder: &Recorder) {
    for line in BufReader::new(output).lines() {
        let Ok(line) = line else { break };
        let Ok(relayed) = serde_json::from_str::<Relayed>(&line) else {
            eprintln!("a candidate said: {line}");
            continue;
        };
        if !matches!(relayed.what, What::Invoke { .. }) {
            recorder.record(relayed.caller, relayed.key, relayed.what);
            continue;
        }
        let mut input = input.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(to_candidate) = input.as_mut() {
            recorder.record(relayed.caller, relayed.key, relayed.what);
            if writeln!(to_candidate)
                .and_then(|()| to_candidate.flush())
                .is_err()
            {
                *input = None;
            }
        }
    }
}

/// Sends signal `name` to process `pid` with the system's `kill`.
fn signal(name: &str, pid: u32) -> bool {
    Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// The process of election `epoch`'s leader, from its label in the lock table.
fn leader_pid(backend: Backend, url: &str, epoch: u64) -> Option<u32> {
    let label = match backend {
        #[cfg(feature = "sqlite")]
        Backend::Sqlite { .. } => sqlite::leader_label(url, epoch),
        #[cfg(feature = "postgres")]
        Backend::Postgres => postgres::leader_label(url, epoch),
        #[cfg(feature = "mysql")]
        Backend::Mysql => mysql::leader_label(url, epoch),
        #[allow(unreachable_patterns)]
        _ => None,
    }?;
    label.rsplit(' ').next()?.parse().ok()
}

per_backend! {
    pub fn leader_label(url: &str, epoch: u64) -> Option<String> {
        use diesel_occ::occ_locks::dsl as l;
        let mut conn = crate::backend::establish::<Conn>(url).ok()?;
        l::occ_locks
            .filter(l::lock_name.eq(LEADER).and(l::resource.eq(epoch.to_string())).and(l::holder.is_not_null()))
            .select(l::label)
            .first::<Option<String>>(&mut conn)
            .ok()
            .flatten()
    }
}
