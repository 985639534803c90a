//! Medians over runs: the `results.jsonl` of several runs of the same workloads, folded
//! into one table per workload whose cells are the median and the range of each
//! measurement, so that a figure quoted from a noisy machine says how much it moved.

use std::collections::BTreeMap;
use std::error::Error;
use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use crate::measure::median;
use crate::report::EXACTNESS_CHECKS;

/// One measurement across the runs: (backend, workload, case, strategy), in first-seen
/// order, and its values per run.
#[derive(Default)]
struct Series {
    ops_per_s: Vec<f64>,
    p99_us: Vec<f64>,
    ratio: Vec<f64>,
    /// Exactness counts, summed over the runs: must stay 0.
    broken: i64,
    /// Other numeric details (`rate_vs_smallest_queue`, ...), per run.
    details: BTreeMap<String, Vec<f64>>,
}

/// Details folded like the figures; everything else in a line is left out.
const DETAILS: [&str; 2] = ["rate_vs_smallest_queue", "statements_per_batch"];

/// The Markdown of the medians of the runs in `results` (each a `results.jsonl`): one
/// table per backend and workload, each with its key (`"<backend> <workload>"`), in the
/// order the runs measured them.
pub fn sections_of_runs(
    results: &[impl AsRef<Path>],
) -> Result<Vec<(String, String)>, Box<dyn Error>> {
    let mut order: Vec<(String, String, String, String)> = Vec::new();
    let mut series: BTreeMap<(String, String, String, String), Series> = BTreeMap::new();
    for path in results {
        for line in std::fs::read_to_string(path)?.lines() {
            let value: Value = serde_json::from_str(line)?;
            let text = |key: &str| value[key].as_str().unwrap_or_default().to_string();
            let key = (
                text("backend"),
                text("workload"),
                text("case"),
                text("strategy"),
            );
            if !series.contains_key(&key) {
                order.push(key.clone());
            }
            let s = series.entry(key).or_default();
            let push = |into: &mut Vec<f64>, field: &str| {
                if let Some(v) = value[field].as_f64() {
                    into.push(v);
                }
            };
            push(&mut s.ops_per_s, "ops_per_s");
            push(&mut s.p99_us, "p99_us");
            push(&mut s.ratio, "ratio");
            for detail in DETAILS {
                if let Some(v) = value[detail].as_f64() {
                    s.details.entry(detail.to_string()).or_default().push(v);
                }
            }
            s.broken += EXACTNESS_CHECKS
                .iter()
                .filter_map(|c| value[*c].as_i64())
                .sum::<i64>();
        }
    }
    let mut sections: Vec<(String, String)> = Vec::new();
    let mut heading = None;
    for key in &order {
        let (backend, workload, case, strategy) = key;
        let s = &series[key];
        if heading.as_ref() != Some(&(backend, workload)) {
            sections.push((format!("{backend} {workload}"), String::new()));
        }
        let out = &mut sections.last_mut().expect("a section per heading").1;
        if heading.as_ref() != Some(&(backend, workload)) {
            writeln!(
                out,
                "\n### {backend} {workload}: medians of {} runs (range)\n",
                s.ops_per_s.len()
            )?;
            writeln!(
                out,
                "| case | strategy | ops/s | p99 µs | ratio | details |"
            )?;
            writeln!(out, "|---|---|---:|---:|---:|---|")?;
            heading = Some((backend, workload));
        }
        let details: Vec<String> = s
            .details
            .iter()
            .map(|(name, values)| format!("{name} {}", spread(values, 2)))
            .chain((s.broken != 0).then(|| format!("**exactness broken: {}**", s.broken)))
            .collect();
        writeln!(
            out,
            "| {case} | {strategy} | {} | {} | {} | {} |",
            spread(&s.ops_per_s, 0),
            spread(&s.p99_us, 0),
            spread(&s.ratio, 2),
            details.join(", ")
        )?;
    }
    Ok(sections)
}

/// `median (min-max)` of `values`, `-` without any.
fn spread(values: &[f64], digits: usize) -> String {
    if values.is_empty() {
        return "-".to_string();
    }
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if values.len() == 1 {
        return format!("{:.digits$}", values[0]);
    }
    format!(
        "{:.digits$} ({min:.digits$}-{max:.digits$})",
        median(values)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_ranges_per_measurement() {
        let dir = std::env::temp_dir().join(format!("occ-bench-medians-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let line = |ops: f64, ratio: f64| {
            format!(
                r#"{{"backend":"sqlite","workload":"W6","case":"N=1","strategy":"library","ops_per_s":{ops},"p99_us":10.0,"ratio":{ratio},"claimed_twice":0}}"#
            )
        };
        let runs: Vec<_> = [(100.0, 0.9), (300.0, 1.1), (200.0, 1.0)]
            .iter()
            .enumerate()
            .map(|(i, (ops, ratio))| {
                let path = dir.join(format!("run{i}.jsonl"));
                std::fs::write(&path, line(*ops, *ratio)).unwrap();
                path
            })
            .collect();
        let sections = sections_of_runs(&runs).unwrap();
        assert_eq!(sections.len(), 1);
        let (key, table) = &sections[0];
        assert_eq!(key, "sqlite W6");
        assert!(table.contains("medians of 3 runs"), "{table}");
        assert!(
            table.contains("| N=1 | library | 200 (100-300) | 10 (10-10) | 1.00 (0.90-1.10) |"),
            "{table}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
