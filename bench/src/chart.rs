//! The W2 chart: goodput against workers, one line per strategy, so that the contention
//! curves show at a glance which strategies hold up and which collapse.

use std::collections::BTreeMap;
use std::error::Error;
use std::path::Path;

use plotters::prelude::*;

use crate::report::Record;

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
    let max_workers = lines
        .iter()
        .flat_map(|(_, points)| points.iter().map(|p| p.0))
        .fold(2.0, f64::max);
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
            (0.9..max_workers * 1.1).log_scale(),
            (1.0..max_goodput * 2.0).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("workers on one row")
        .y_desc("merges / s (log)")
        .x_label_formatter(&|x| format!("{x:.0}"))
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
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
