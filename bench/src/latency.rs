//! Latency samples and what the report shows of them: percentiles and a
//! percentile curve on a "nines" axis.
//!
//! Every sample is kept (8 bytes each; a run records at most a few
//! million), so percentiles are exact rather than bucketed.

use std::sync::OnceLock;
use std::time::Instant;

static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Nanoseconds since the bench started: the one clock every thread of the
/// bench stamps messages with (monotonic and shared across cores).
pub fn now_ns() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Latency samples in nanoseconds.
#[derive(Clone, Debug, Default)]
pub struct Samples {
    ns: Vec<u64>,
}

impl Samples {
    pub fn push(&mut self, ns: u64) {
        self.ns.push(ns);
    }
    pub fn append(&mut self, other: &mut Samples) {
        self.ns.append(&mut other.ns);
    }

    /// Percentiles and the curve, or None with no samples.
    pub fn summarize(mut self, what: &str) -> Option<Latency> {
        if self.ns.is_empty() {
            return None;
        }
        self.ns.sort_unstable();
        let s = &self.ns;
        Some(Latency {
            what: what.to_string(),
            count: s.len() as u64,
            p50_ns: percentile(s, 0.50),
            p90_ns: percentile(s, 0.90),
            p99_ns: percentile(s, 0.99),
            p999_ns: percentile(s, 0.999),
            max_ns: s[s.len() - 1],
            mean_ns: (s.iter().map(|&v| u128::from(v)).sum::<u128>() / s.len() as u128) as u64,
            curve: nines_curve(s),
        })
    }
}

/// What a run's latency samples came to.
#[derive(Clone, Debug)]
pub struct Latency {
    /// What was measured, in words ("produce request round trip", ...).
    pub what: String,
    pub count: u64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
    pub mean_ns: u64,
    /// (nines, latency ns) points: nines = -log10(1 - percentile/100),
    /// so 1 = p90, 2 = p99, 3 = p99.9; the last point is the maximum.
    pub curve: Vec<(f64, u64)>,
}

/// The sample at quantile `q` of sorted samples (nearest rank).
pub fn percentile(sorted: &[u64], q: f64) -> u64 {
    assert!(!sorted.is_empty(), "percentile of no samples");
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Points every 0.05 nines up to what the sample count resolves (1 in n
/// is the finest quantile n samples can tell), then the maximum there.
fn nines_curve(sorted: &[u64]) -> Vec<(f64, u64)> {
    let n = sorted.len() as f64;
    let top = n.log10().max(0.0);
    let mut points = Vec::new();
    let mut x = 0.0;
    while x < top - 1e-9 {
        points.push((x, percentile(sorted, 1.0 - 10f64.powf(-x))));
        x += 0.05;
    }
    points.push((top, sorted[sorted.len() - 1]));
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let s: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile(&s, 0.5), 500);
        assert_eq!(percentile(&s, 0.99), 990);
        assert_eq!(percentile(&s, 0.999), 999);
        assert_eq!(percentile(&s, 1.0), 1000);
        assert_eq!(percentile(&[7], 0.999), 7);
    }

    #[test]
    fn curve_ends_at_the_maximum_and_never_decreases() {
        let mut s = Samples::default();
        for v in (0..10_000u64).rev() {
            s.push(v * 3);
        }
        let l = s.summarize("x").expect("samples");
        assert_eq!(l.curve.last().map(|p| p.1), Some(29_997));
        assert!((l.curve.last().map_or(0.0, |p| p.0) - 4.0).abs() < 1e-9);
        assert!(l.curve.windows(2).all(|w| w[0].1 <= w[1].1 && w[0].0 < w[1].0));
    }
}
