//! What a run prints and writes: one JSON line per measurement (stdout and
//! `results.jsonl`), a Markdown summary per workload (`summary.md`, also printed at the
//! end), and the W2 chart.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Map, Value};

use crate::measure::Latencies;

/// Counts that must be zero in every measurement that reports them.
pub const EXACTNESS_CHECKS: [&str; 10] = [
    "lost",
    "claimed_twice",
    "claimed_not_done",
    "wrong_owner",
    "wrong_counters",
    "version_drift",
    "violations",
    "overlaps",
    "repeated_fences",
    "rows_with_wrong_version",
];

/// Details the JSON lines carry but the summary leaves out (the case already says them).
const HIDDEN_IN_SUMMARY: [&str; 3] = ["workers", "rows", "attempts"];

/// One measurement: a strategy at one point of a workload.
#[derive(Debug, Clone)]
pub struct Record {
    pub workload: &'static str,
    pub case: String,
    pub strategy: String,
    /// Successful operations, and the wall time they took.
    pub ops: u64,
    pub seconds: f64,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    /// Against the case's baseline; what it divides is the workload's `ratio_meaning`.
    pub ratio: Option<f64>,
    pub extra: Map<String, Value>,
}

impl Record {
    pub fn new(
        workload: &'static str,
        case: impl Into<String>,
        strategy: impl Into<String>,
    ) -> Self {
        Record {
            workload,
            case: case.into(),
            strategy: strategy.into(),
            ops: 0,
            seconds: 0.0,
            p50_us: None,
            p99_us: None,
            ratio: None,
            extra: Map::new(),
        }
    }

    pub fn ops(mut self, ops: u64, elapsed: Duration) -> Self {
        self.ops = ops;
        self.seconds = elapsed.as_secs_f64();
        self
    }

    pub fn latencies(mut self, latencies: &Latencies) -> Self {
        self.p50_us = latencies.p50_us();
        self.p99_us = latencies.p99_us();
        self
    }

    pub fn ratio(mut self, ratio: f64) -> Self {
        self.ratio = Some(ratio);
        self
    }

    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.extra.insert(key.to_string(), value.into());
        self
    }

    pub fn ops_per_second(&self) -> f64 {
        if self.seconds > 0.0 {
            self.ops as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// A workload's heading in the summary.
struct Section {
    workload: &'static str,
    title: String,
    ratio_meaning: String,
    /// Text printed after the table as is (query plans).
    notes: Vec<String>,
}

pub struct Report {
    dir: PathBuf,
    backend: &'static str,
    lines: File,
    sections: Vec<Section>,
    records: Vec<(Record, Value)>,
}

impl Report {
    pub fn create(dir: &Path, backend: &'static str) -> std::io::Result<Self> {
        Ok(Report {
            dir: dir.to_path_buf(),
            backend,
            lines: File::create(dir.join("results.jsonl"))?,
            sections: Vec::new(),
            records: Vec::new(),
        })
    }

    /// Starts a workload's section of the summary; `ratio_meaning` says what its ratio
    /// column divides by what.
    pub fn section(&mut self, workload: &'static str, title: &str, ratio_meaning: &str) {
        self.sections.push(Section {
            workload,
            title: title.to_string(),
            ratio_meaning: ratio_meaning.to_string(),
            notes: Vec::new(),
        });
    }

    /// Adds `text` after the table of `workload`'s section, as a preformatted block.
    pub fn note(&mut self, workload: &str, text: &str) {
        if let Some(section) = self.sections.iter_mut().find(|s| s.workload == workload) {
            section.notes.push(text.to_string());
        }
    }

    /// A progress bar of `len` steps for a workload (drawn on stderr when it is a
    /// terminal, hidden otherwise).
    pub fn progress(&self, workload: &str, len: u64) -> ProgressBar {
        let bar = ProgressBar::new(len);
        bar.set_style(
            ProgressStyle::with_template("{prefix} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
                .expect("a valid template"),
        );
        bar.set_prefix(format!("{} {workload}", self.backend));
        bar
    }

    /// Prints and writes the JSON line of `record`, and keeps it for the summary.
    pub fn record(&mut self, record: Record) -> std::io::Result<()> {
        let mut line = json!({
            "backend": self.backend,
            "workload": record.workload,
            "case": record.case,
            "strategy": record.strategy,
            "ops": record.ops,
            "seconds": round(record.seconds, 4),
            "ops_per_s": round(record.ops_per_second(), 1),
            "p50_us": record.p50_us.map(|v| round(v, 1)),
            "p99_us": record.p99_us.map(|v| round(v, 1)),
            "ratio": record.ratio.map(|v| round(v, 3)),
        });
        line.as_object_mut()
            .expect("an object")
            .extend(record.extra.clone());
        println!("{line}");
        writeln!(self.lines, "{line}")?;
        self.records.push((record, line));
        Ok(())
    }

    pub fn records<'a>(&'a self, workload: &'a str) -> impl Iterator<Item = &'a Record> + 'a {
        self.records
            .iter()
            .map(|(r, _)| r)
            .filter(move |r| r.workload == workload)
    }

    /// Writes `summary.md` and the chart, and prints the summary. Fails when any
    /// measurement broke an exactness check (a lost or doubled update, two lock holders at
    /// once, a race without exactly one winner): those are bugs, whatever the speed.
    pub fn finish(self) -> Result<(), Box<dyn std::error::Error>> {
        let summary = self.markdown();
        std::fs::write(self.dir.join("summary.md"), &summary)?;
        println!("\n{summary}");
        if self.records("W2").next().is_some() {
            let path = self.dir.join(format!("w2-{}.svg", self.backend));
            match crate::chart::draw_w2(&path, self.backend, self.records("W2")) {
                Ok(()) => eprintln!("chart: {}", path.display()),
                Err(e) => eprintln!("chart not drawn: {e}"),
            }
        }
        eprintln!("results: {}", self.dir.display());
        let broken: Vec<String> = self
            .records
            .iter()
            .flat_map(|(record, _)| {
                EXACTNESS_CHECKS.iter().filter_map(move |&check| {
                    let value = record.extra.get(check)?.as_i64()?;
                    (value != 0).then(|| {
                        format!(
                            "{} {} {}: {check} {value}",
                            record.workload, record.case, record.strategy
                        )
                    })
                })
            })
            .collect();
        if broken.is_empty() {
            Ok(())
        } else {
            Err(format!("exactness checks failed:\n  {}", broken.join("\n  ")).into())
        }
    }

    fn markdown(&self) -> String {
        let mut out = String::new();
        for section in &self.sections {
            out.push_str(&format!(
                "### {} {}: {}\n\n",
                self.backend, section.workload, section.title
            ));
            out.push_str("| case | strategy | ops/s | p50 µs | p99 µs | ratio | details |\n");
            out.push_str("|---|---|---:|---:|---:|---:|---|\n");
            for record in self.records(section.workload) {
                let mut details: Vec<String> = record
                    .extra
                    .iter()
                    .filter(|(k, _)| !HIDDEN_IN_SUMMARY.contains(&k.as_str()))
                    .filter(|(k, v)| {
                        !EXACTNESS_CHECKS.contains(&k.as_str()) || v.as_i64() != Some(0)
                    })
                    .map(|(k, v)| format!("{k} {}", plain(v)))
                    .collect();
                let checked = EXACTNESS_CHECKS
                    .iter()
                    .any(|k| record.extra.contains_key(*k));
                if checked
                    && !EXACTNESS_CHECKS.iter().any(|k| {
                        record
                            .extra
                            .get(*k)
                            .and_then(Value::as_i64)
                            .is_some_and(|v| v != 0)
                    })
                {
                    details.push("exact ✓".to_string());
                }
                out.push_str(&format!(
                    "| {} | {} | {:.0} | {} | {} | {} | {} |\n",
                    record.case,
                    record.strategy,
                    record.ops_per_second(),
                    cell(record.p50_us, 0),
                    cell(record.p99_us, 0),
                    cell(record.ratio, 2),
                    details.join(", ")
                ));
            }
            out.push_str(&format!("\nratio: {}\n\n", section.ratio_meaning));
            for note in &section.notes {
                out.push_str(&format!("```text\n{}```\n\n", note));
            }
        }
        out
    }
}

fn round(value: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (value * scale).round() / scale
}

fn cell(value: Option<f64>, digits: usize) -> String {
    value.map_or_else(|| "-".to_string(), |v| format!("{v:.digits$}"))
}

/// A JSON value as a table cell: strings without quotes, cut at 60 characters (the JSON
/// line has them whole).
fn plain(value: &Value) -> String {
    match value {
        Value::String(s) if s.chars().count() > 60 => {
            format!("{}…", s.chars().take(60).collect::<String>())
        }
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
