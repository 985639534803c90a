//! The W2 chart: goodput against workers, one line per strategy, so that the contention
//! curves show at a glance which strategies hold up and which collapse.

use std::collections::BTreeMap;
use std::error::Error;
use std::path::Path;

use plotters::prelude::*;

use crate::report::Record;

/// Draws `w2-<backend>.svg` in `dir` from the W2 lines of a `results.jsonl`.
pub fn redraw(results: &Path, dir: &Path) -> Result<(), Box<dyn Error>> {
    let text = std::fs::read_to_string(results)?;
    let mut backend = String::new();
    let mut records = Vec::new();
    for line in text.lines() {
        let value: serde_json::Value = serde_json::from_str(line)?;
        if value["workload"] != "W2" {
            continue;
        }
        backend = value["backend"].as_str().unwrap_or("unknown").to_string();
        let mut record = Record::new(
            "W2",
            value["case"].as_str().unwrap_or_default(),
            value["strategy"].as_str().unwrap_or_default(),
        )
        .with("workers", value["workers"].clone());
        record.ops = value["ops"].as_u64().unwrap_or(0);
        record.seconds = value["seconds"].as_f64().unwrap_or(0.0);
        records.push(record);
    }
    let path = dir.join(format!("w2-{backend}.svg"));
    draw_w2(&path, &backend, records.iter())?;
    eprintln!("chart: {}", path.display());
    Ok(())
}

/// Draws the W2 chart of `records` into `path`.
pub fn draw_w2<'a>(
    path: &Path,
    backend: &str,
    records: impl Iterator<Item = &'a Record>,
) -> Result<(), Box<dyn Error>> {
    // Strategy -> (workers, goodput), in the order the run measured them.
    let mut lines: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    let mut order = BTreeMap::new();
    for record in records {
        let Some(workers) = record.extra.get("workers").and_then(|w| w.as_f64()) else {
            continue;
        };
        let index = *order.entry(record.strategy.clone()).or_insert_with(|| {
            lines.push((record.strategy.clone(), Vec::new()));
            lines.len() - 1
        });
        lines[index].1.push((workers, record.ops_per_second()));
    }
    // Workers on the x axis at even steps (1, 2, 4, 8, 16 are doublings).
    let mut workers: Vec<f64> = lines
        .iter()
        .flat_map(|(_, points)| points.iter().map(|p| p.0))
        .collect();
    workers.sort_by(f64::total_cmp);
    workers.dedup();
    let step = |w: f64| workers.iter().position(|&x| x == w).unwrap_or(0) as f64;
    let lines: Vec<(String, Vec<(f64, f64)>)> = lines
        .into_iter()
        .map(|(name, points)| {
            (
                name,
                points.into_iter().map(|(w, g)| (step(w), g)).collect(),
            )
        })
        .collect();
    let max_goodput = lines
        .iter()
        .flat_map(|(_, points)| points.iter().map(|p| p.1))
        .fold(1.0, f64::max);

    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("W2 hot-row JSON merge on {backend}: successful merges per second"),
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(
            -0.2..(workers.len().max(2) - 1) as f64 + 0.2,
            0.0..max_goodput * 1.15,
        )?;
    chart
        .configure_mesh()
        .x_desc("workers on one row")
        .y_desc("merges / s")
        .x_labels(workers.len().max(2))
        .x_label_formatter(&|x| {
            let i = x.round();
            match workers.get(i as usize) {
                Some(w) if (x - i).abs() < 0.01 && i >= 0.0 => format!("{w:.0}"),
                _ => String::new(),
            }
        })
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    for (i, (strategy, points)) in lines.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(strategy.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
