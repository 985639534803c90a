//! Latency samples and the statistics the report quotes: medians and high percentiles,
//! never means, since a shared machine's noise comes in bursts.

use std::time::{Duration, Instant};

/// Latencies of one strategy at one point.
#[derive(Debug, Default, Clone)]
pub struct Latencies(Vec<Duration>);

impl Latencies {
    pub fn with_capacity(n: usize) -> Self {
        Latencies(Vec::with_capacity(n))
    }

    pub fn push(&mut self, latency: Duration) {
        self.0.push(latency);
    }

    /// Runs `op` and records how long it took.
    pub fn time<T>(&mut self, op: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let value = op();
        self.0.push(start.elapsed());
        value
    }

    pub fn extend(&mut self, other: Latencies) {
        self.0.extend(other.0);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The `q` quantile (0..=1) in microseconds, nearest rank; `None` without samples.
    pub fn quantile_us(&self, q: f64) -> Option<f64> {
        if self.0.is_empty() {
            return None;
        }
        let mut sorted = self.0.clone();
        sorted.sort_unstable();
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        Some(sorted[rank - 1].as_secs_f64() * 1e6)
    }

    pub fn p50_us(&self) -> Option<f64> {
        self.quantile_us(0.50)
    }

    pub fn p99_us(&self) -> Option<f64> {
        self.quantile_us(0.99)
    }

    /// Every sample in microseconds, in the order recorded.
    pub fn samples_us(&self) -> Vec<f64> {
        self.0.iter().map(|d| d.as_secs_f64() * 1e6).collect()
    }

    pub fn total(&self) -> Duration {
        self.0.iter().sum()
    }
}

/// The median over rounds of `this` round's time ÷ the `baseline`'s time of the same
/// round: ratios from one run, each pair measured back to back.
pub fn median_ratio(this: &Latencies, baseline: &Latencies) -> f64 {
    let ratios: Vec<f64> = this
        .samples_us()
        .iter()
        .zip(baseline.samples_us())
        .map(|(this, base)| this / base)
        .collect();
    median(&ratios)
}

/// The median of `values` (the upper one of an even count); NaN when empty.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let mut l = Latencies::default();
        for us in 1..=100 {
            l.push(Duration::from_micros(us));
        }
        assert_eq!(l.p50_us(), Some(50.0));
        assert_eq!(l.p99_us(), Some(99.0));
        assert_eq!(l.quantile_us(1.0), Some(100.0));
        assert_eq!(Latencies::default().p50_us(), None);
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 3.0);
        assert!(median(&[]).is_nan());
    }
}
