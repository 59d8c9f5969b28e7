//! Nearest-rank percentiles and latency summaries, shared by the load
//! generator and the other bench tools.
//!
//! Invariants: percentiles use the nearest-rank definition and are taken
//! from exact sorted samples; an empty set has none.

/// The nearest-rank percentile `q` (0–100) of `sorted` (ascending): the
/// smallest value such that at least `q` % of the values are at most it.
/// `None` for an empty slice.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len();
    let rank = ((q / 100.0) * n as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, n) - 1])
}

/// Summary of a set of latencies, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Summary {
    pub count: usize,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// Sorts `values` and summarises them; `None` when empty.
pub fn summarize(values: &mut [f64]) -> Option<Summary> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let p = |q| percentile(values, q).unwrap_or(f64::NAN);
    Some(Summary {
        count: values.len(),
        mean: values.iter().sum::<f64>() / values.len() as f64,
        p50: p(50.0),
        p90: p(90.0),
        p99: p(99.0),
        max: values[values.len() - 1],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 90.0), Some(90.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
        // 10 values: p99 is the largest, p50 the 5th.
        let w: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&w, 99.0), Some(10.0));
        assert_eq!(percentile(&w, 50.0), Some(5.0));
    }

    #[test]
    fn summary_sorts_and_summarises() {
        let mut v = vec![3.0, 1.0, 2.0, 4.0];
        let s = summarize(&mut v).unwrap();
        assert_eq!((s.count, s.p50, s.max, s.mean), (4, 2.0, 4.0, 2.5));
        assert!(summarize(&mut []).is_none());
    }
}
