//! `occ-bench`: diesel-occ against hand-written diesel and the other concurrency
//! strategies, side by side in one run, on SQLite, PostgreSQL or MySQL/MariaDB.
//!
//! Workloads (BENCHMARKS.md has the figures and what each one shows):
//! - W1 uncontended guarded update: the price of the library over the same SQL by hand;
//!   W1-async the same on diesel-async connections, against hand-written diesel-async;
//!   W1-telemetry the same with a tracing subscriber or a metrics recorder listening;
//! - W2 hot-row JSON merge: goodput of each strategy as writers pile onto one row;
//!   W2-async the same with tokio tasks on diesel-async connections;
//! - W3 cancel vs ship: guarded status transitions racing on the same orders; W3-async
//!   the same with tokio tasks on diesel-async connections;
//! - W4 locks: acquire + release, alone and with contenders; leader failover time;
//! - W5 batch: guarded updates of many rows as one batch, one by one, and by hand;
//! - W6 task claiming: 8 workers draining a queue of 10,000 or 1,000,000 tasks in
//!   batches, the library's claims against each backend's hand-written queue statements;
//! - W7 inserts and upserts: one row per call, beside diesel's insert, the hand-written
//!   guarded update and the one-statement `ON CONFLICT` upsert.
//!
//! Output: one JSON line per measurement on stdout and in `results.jsonl`, a Markdown
//! summary with the ratios (`summary.md`), and a chart of W2 (`w2-<backend>.svg`), all in
//! `--out`. Nothing here asserts a speed: the figures are for people to read.
//!
//! `--medians-of A/results.jsonl B/results.jsonl ...` folds several runs into medians
//! and ranges.
//!
//! Run: `cargo run --release -p diesel-occ-bench [--features postgres,mysql] -- [--url postgres://...] [--smoke]`
//! (SQLite by default, with nothing to install; each server backend is a feature).

mod backend;
mod chart;
mod doc_blocks;
mod measure;
mod medians;
mod report;
mod soak;
mod w1_uncontended;
mod w2_hot_row;
mod w3_cancel_vs_ship;
mod w4_locks;
mod w5_batch;
mod w6_task_claiming;
mod w7_insert_upsert;

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use backend::Backend;
use report::Report;

/// Command-line options.
#[derive(Debug, Parser)]
#[command(
    name = "occ-bench",
    about = "diesel-occ against hand-written diesel, side by side"
)]
struct Options {
    /// Database URL: `postgres://...`, `mysql://...`, or a SQLite file path. Default: a
    /// fresh SQLite file in the temporary directory. Tables named `bench_*` are dropped
    /// and created. With `--soak`, a cluster's node URLs, comma-separated: its workers and
    /// candidates are spread over them.
    #[arg(long)]
    url: Option<String>,

    /// Workloads to run, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "w1,w1-async,w1-telemetry,w2,w2-async,w3,w3-async,w4,w5,w6,w7"
    )]
    workloads: Vec<Workload>,

    /// Seconds per W2 point (strategy x workers) and per W4 contention run.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,

    /// Worker counts of W2.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    workers: Vec<usize>,

    /// A quick pass with tiny sizes (seconds in all), to check that everything runs.
    #[arg(long)]
    smoke: bool,

    /// W6 queue lengths, in place of the default (or `--smoke`) ones: to measure one point.
    #[arg(long, value_delimiter = ',')]
    queue_sizes: Option<Vec<usize>>,

    /// W6 tasks a worker claims at once, in place of the default (or `--smoke`) ones.
    #[arg(long, value_delimiter = ',')]
    claim_batches: Option<Vec<usize>>,

    /// Run the soak instead of the workloads: this many operations, mixed, with faults,
    /// every call recorded and the history judged by a linearizability checker.
    #[arg(long, value_name = "OPS")]
    soak: Option<u64>,

    /// With `--soak`: end after this many seconds even if operations remain.
    #[arg(long, requires = "soak")]
    soak_seconds: Option<f64>,

    /// With `--soak`: blocking worker threads and async worker tasks.
    #[arg(long, requires = "soak", default_value_t = 4)]
    threads: usize,
    #[arg(long, requires = "soak", default_value_t = 4)]
    tasks: usize,

    /// With `--soak`: no session kills, stalls or dropped calls.
    #[arg(long, requires = "soak")]
    no_faults: bool,

    /// With `--soak`: the kinds of fault to inject.
    #[arg(
        long,
        requires = "soak",
        value_delimiter = ',',
        default_value = "kills,stalls,drops,freezes,exhaustion"
    )]
    faults: Vec<soak::Fault>,

    /// With `--soak`: send guarded updates without their guard, to show that the checker
    /// finds the lost updates.
    #[arg(long, requires = "soak")]
    broken_guard: bool,

    /// Every blocking connection without diesel's prepared-statement cache: what a
    /// connection behind a pooler in transaction mode that keeps no prepared statements
    /// needs (PgBouncer before 1.21).
    #[arg(long)]
    no_statement_cache: bool,

    /// With `--soak`: a shell command run every `--outage-every` seconds, awaited each
    /// time (a server restart, a cluster node killed and started again, a failover).
    #[arg(long, requires = "soak")]
    outage: Option<String>,

    /// With `--outage`: seconds between its runs.
    #[arg(long, requires = "outage", default_value_t = 30.0)]
    outage_every: f64,

    /// With `--outage`: run it at most this many times (a failover happens once).
    #[arg(long, requires = "outage")]
    outage_times: Option<u64>,

    /// Internal: run as candidate INDEX of the soak's election EPOCH on URL, relaying
    /// each call on standard output until standard input closes.
    #[arg(long, num_args = 3, value_names = ["URL", "EPOCH", "INDEX"], hide = true)]
    soak_candidate: Option<Vec<String>>,

    /// Run nothing: judge the history file of an earlier soak.
    #[arg(long, value_name = "HISTORY_JSONL")]
    check_history: Option<PathBuf>,

    /// Where the JSON lines, the summary and the chart go.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,

    /// Measure nothing: draw the W2 chart again from a `results.jsonl` of an earlier run
    /// (into `--out`).
    #[arg(long, value_name = "RESULTS_JSONL")]
    chart_from: Option<PathBuf>,

    /// Measure nothing: fold the `results.jsonl` of several runs into medians and ranges
    /// per measurement (printed, and written to `medians.md` in `--out`).
    #[arg(long, value_name = "RESULTS_JSONL", num_args = 1..)]
    medians_of: Vec<PathBuf>,

    /// With `--medians-of`: also write each backend's and workload's table into this
    /// Markdown file, in place of its block `<!-- medians <backend> <workload> -->` ...
    /// `<!-- /medians -->` (added at the end when missing): BENCHMARKS.md.
    #[arg(long, value_name = "MARKDOWN", requires = "medians_of")]
    into: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Workload {
    W1,
    /// W1 on diesel-async connections.
    W1Async,
    /// W1 with the library's telemetry heard: a tracing subscriber, a metrics recorder.
    W1Telemetry,
    W2,
    /// W2 on diesel-async connections, the workers tokio tasks.
    W2Async,
    W3,
    /// W3 on diesel-async connections, the racers tokio tasks.
    W3Async,
    W4,
    W5,
    W6,
    W7,
}

/// The sizes of one run.
#[derive(Debug, Clone)]
pub struct Settings {
    pub url: String,
    /// W2 and W4: how long each point runs.
    pub point: Duration,
    pub workers: Vec<usize>,
    /// W1: rows in the table and operations per strategy per round.
    pub rows: usize,
    pub ops_per_round: usize,
    pub rounds: usize,
    /// W3: orders raced.
    pub races: usize,
    /// W4: leader failovers measured.
    pub failovers: usize,
    /// W5: batch sizes and how many batches of each strategy.
    pub batch_sizes: Vec<usize>,
    pub batch_rounds: usize,
    /// W6: queue lengths, and the tasks a worker claims at once.
    pub queue_sizes: Vec<usize>,
    pub claim_batches: Vec<usize>,
}

impl Settings {
    fn new(options: &Options, url: String) -> Self {
        let seconds = if options.smoke { 0.3 } else { options.seconds };
        Settings {
            url,
            point: Duration::from_secs_f64(seconds.max(0.05)),
            workers: if options.smoke {
                vec![1, 4]
            } else {
                options.workers.clone()
            },
            rows: if options.smoke { 200 } else { 10_000 },
            ops_per_round: if options.smoke { 50 } else { 1_000 },
            rounds: if options.smoke { 2 } else { 7 },
            races: if options.smoke { 40 } else { 500 },
            failovers: if options.smoke { 1 } else { 3 },
            batch_sizes: if options.smoke {
                vec![10]
            } else {
                vec![100, 1_000]
            },
            batch_rounds: if options.smoke { 2 } else { 7 },
            queue_sizes: options.queue_sizes.clone().unwrap_or(if options.smoke {
                vec![300, 3_000]
            } else {
                vec![10_000, 1_000_000]
            }),
            claim_batches: options.claim_batches.clone().unwrap_or(if options.smoke {
                vec![1, 10]
            } else {
                vec![1, 10, 100]
            }),
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = Options::parse();
    if options.no_statement_cache {
        backend::disable_statement_cache();
    }
    if !options.medians_of.is_empty() {
        let sections = medians::sections_of_runs(&options.medians_of)?;
        let table: String = sections.iter().map(|(_, table)| table.as_str()).collect();
        std::fs::create_dir_all(&options.out)?;
        std::fs::write(options.out.join("medians.md"), &table)?;
        if let Some(doc) = &options.into {
            let written = doc_blocks::write_into(&std::fs::read_to_string(doc)?, &sections)?;
            std::fs::write(doc, written)?;
        }
        println!("{table}");
        return Ok(());
    }
    if let Some(results) = &options.chart_from {
        std::fs::create_dir_all(&options.out)?;
        return chart::redraw(results, &options.out);
    }
    if let Some(history) = &options.check_history {
        return soak::judge(history);
    }
    if let Some([url, epoch, index]) = options.soak_candidate.as_deref() {
        let (backend, url) = Backend::from_url(Some(url))?;
        return soak::candidate::run(backend, &url, epoch.parse()?, index.parse()?);
    }
    let (backend, url) = Backend::from_url(options.url.as_deref())?;
    if let Some(ops) = options.soak {
        // A cluster's nodes, comma-separated (not a libpq multi-host URL, whose hosts are
        // one URL).
        let nodes: Vec<String> = url
            .replace(",mysql://", "\nmysql://")
            .replace(",postgres://", "\npostgres://")
            .lines()
            .map(str::to_string)
            .collect();
        let settings = soak::SoakSettings {
            url: nodes[0].clone(),
            nodes,
            ops,
            seconds: options.soak_seconds,
            threads: options.threads,
            tasks: options.tasks,
            keys_per_round: 16,
            ops_per_round: 320,
            faults: if options.no_faults {
                Vec::new()
            } else {
                options.faults.clone()
            },
            broken_guard: options.broken_guard,
            outage: options.outage.clone(),
            outage_every: std::time::Duration::from_secs_f64(options.outage_every),
            outage_times: options.outage_times.unwrap_or(u64::MAX),
            seed: std::process::id() as u64,
            out: options.out.clone(),
        };
        let judged = soak::run(backend, settings);
        backend.clean_up(&url);
        return judged;
    }
    let settings = Settings::new(&options, url);
    std::fs::create_dir_all(&options.out)?;
    let mut report = Report::create(&options.out, backend.name())?;
    eprintln!(
        "occ-bench on {} ({}), {} core(s){}",
        backend.name(),
        backend.describe(&settings.url),
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        if options.smoke { ", smoke sizes" } else { "" }
    );
    for workload in &options.workloads {
        match workload {
            Workload::W1 => backend.run_w1(&settings, &mut report)?,
            Workload::W1Async => backend.run_w1_async(&settings, &mut report)?,
            Workload::W1Telemetry => backend.run_w1_telemetry(&settings, &mut report)?,
            Workload::W2 => backend.run_w2(&settings, &mut report)?,
            Workload::W2Async => backend.run_w2_async(&settings, &mut report)?,
            Workload::W3 => backend.run_w3(&settings, &mut report)?,
            Workload::W3Async => backend.run_w3_async(&settings, &mut report)?,
            Workload::W4 => backend.run_w4(&settings, &mut report)?,
            Workload::W5 => backend.run_w5(&settings, &mut report)?,
            Workload::W6 => backend.run_w6(&settings, &mut report)?,
            Workload::W7 => backend.run_w7(&settings, &mut report)?,
        }
    }
    report.finish()?;
    backend.clean_up(&settings.url);
    Ok(())
}
