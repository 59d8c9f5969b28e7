//! A fixed-bucket latency histogram made of single-writer counters.
//!
//! Buckets are log-spaced: bucket `i` (for `i < FINITE_BUCKETS`) counts
//! durations `d` with `BASE_NS · 2^(i-1) < d ≤ BASE_NS · 2^i` (bucket 0 also
//! takes everything down to 0), i.e. Prometheus `le` bounds of 1 µs, 2 µs,
//! 4 µs, … 2^22 µs ≈ 4.19 s; the last bucket ([`OVERFLOW_BUCKET`]) counts the
//! rest (`le="+Inf"` adds it). The bounds never change, so histograms of
//! different threads add up bucket by bucket.
//!
//! Invariants:
//! * Exactly one thread records into a histogram (see [`super::stages`]);
//!   recording is a relaxed load and a relaxed store per touched counter —
//!   the same `mov`/`add`/`mov` as a plain `u64 += n`, no locked
//!   read-modify-write, no fence. The atomics exist only so that the
//!   exporter may read while the owner writes (a plain field would be a data
//!   race): it sees a recent value, never a torn one.
//! * Recording neither allocates nor reads a clock; the caller measures.
//! * The count is not stored: it is the sum of the buckets, so a snapshot's
//!   `+Inf` bucket always equals its count.

use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bound of bucket 0, in nanoseconds (1 µs).
pub const BASE_NS: u64 = 1_000;
/// Buckets with a finite upper bound (`BASE_NS · 2^0 ..= BASE_NS · 2^22`).
pub const FINITE_BUCKETS: usize = 23;
/// Index of the overflow bucket (durations above the largest finite bound).
pub const OVERFLOW_BUCKET: usize = FINITE_BUCKETS;
/// All buckets, the overflow included.
pub const BUCKETS: usize = FINITE_BUCKETS + 1;

/// Upper bound of finite bucket `i`, in nanoseconds.
pub const fn upper_bound_ns(i: usize) -> u64 {
    BASE_NS << i
}

/// The bucket a duration of `ns` nanoseconds falls in.
#[inline]
pub fn bucket_index(ns: u64) -> usize {
    if ns <= BASE_NS {
        return 0;
    }
    // Smallest i with ns ≤ BASE_NS · 2^i: the bit length of ⌈ns / BASE_NS⌉ − 1.
    let q = (ns - 1) / BASE_NS;
    let i = (u64::BITS - q.leading_zeros()) as usize;
    i.min(OVERFLOW_BUCKET)
}

/// A counter written by one thread only (relaxed load + store), read by any.
#[derive(Debug, Default)]
pub struct SingleWriterCounter(AtomicU64);

impl SingleWriterCounter {
    /// Adds `n`. Only the owning thread may call this: two writers would
    /// lose increments (there is no read-modify-write).
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        let v = self.0.load(Ordering::Relaxed);
        self.0.store(v.wrapping_add(n), Ordering::Relaxed);
    }

    /// The current value (any thread).
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A latency histogram (single writer, any reader).
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [SingleWriterCounter; BUCKETS],
    sum_ns: SingleWriterCounter,
}

impl Histogram {
    /// Records one duration of `ns` nanoseconds (owning thread only).
    #[inline]
    pub(crate) fn record_ns(&self, ns: u64) {
        self.buckets[bucket_index(ns)].add(1);
        self.sum_ns.add(ns);
    }

    /// The current counts.
    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: std::array::from_fn(|i| self.buckets[i].get()),
            sum_ns: self.sum_ns.get(),
        }
    }
}

/// A histogram's counts at one moment (plain numbers; may be added up).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HistogramSnapshot {
    /// Per-bucket counts (not cumulative), the overflow bucket last.
    pub buckets: [u64; BUCKETS],
    /// Sum of the recorded durations, in nanoseconds.
    pub sum_ns: u64,
}

impl HistogramSnapshot {
    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Adds another histogram's counts (same fixed bounds).
    pub fn merge(&mut self, other: &HistogramSnapshot) {
        for (a, b) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *a += b;
        }
        self.sum_ns += other.sum_ns;
    }

    /// Cumulative counts per finite bound, as Prometheus `le` buckets:
    /// `(upper bound in seconds, values ≤ it)`; `+Inf` is [`Self::count`].
    pub fn cumulative(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        let mut acc = 0u64;
        (0..FINITE_BUCKETS).map(move |i| {
            acc += self.buckets[i];
            (upper_bound_ns(i) as f64 / 1e9, acc)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_edges_are_inclusive_upper_bounds() {
        assert_eq!(bucket_index(0), 0);
        assert_eq!(bucket_index(1), 0);
        assert_eq!(bucket_index(BASE_NS), 0);
        assert_eq!(bucket_index(BASE_NS + 1), 1);
        assert_eq!(bucket_index(2 * BASE_NS), 1);
        assert_eq!(bucket_index(2 * BASE_NS + 1), 2);
        assert_eq!(bucket_index(4 * BASE_NS), 2);
        for i in 0..FINITE_BUCKETS {
            let bound = upper_bound_ns(i);
            assert_eq!(bucket_index(bound), i, "bound of bucket {i}");
            assert_eq!(bucket_index(bound + 1), i + 1, "just above bucket {i}");
        }
        // 80 ms (one frame) lands in the 2^17 µs ≈ 131 ms bucket.
        assert_eq!(bucket_index(80_000_000), 17);
    }

    #[test]
    fn overflow_bucket_takes_everything_above_the_last_bound() {
        let last = upper_bound_ns(FINITE_BUCKETS - 1);
        assert_eq!(last, 4_194_304_000);
        assert_eq!(bucket_index(last), FINITE_BUCKETS - 1);
        assert_eq!(bucket_index(last + 1), OVERFLOW_BUCKET);
        assert_eq!(bucket_index(u64::MAX), OVERFLOW_BUCKET);
        let h = Histogram::default();
        h.record_ns(u64::MAX / 2);
        h.record_ns(10 * last);
        let s = h.snapshot();
        assert_eq!(s.buckets[OVERFLOW_BUCKET], 2);
        assert_eq!(s.count(), 2);
        // Overflowed values are in +Inf only: every finite cumulative count is 0.
        assert!(s.cumulative().all(|(_, c)| c == 0));
    }

    #[test]
    fn snapshot_counts_sums_and_merges() {
        let h = Histogram::default();
        for ns in [500, 1_000, 1_001, 3_000, 80_000_000] {
            h.record_ns(ns);
        }
        let s = h.snapshot();
        assert_eq!(s.count(), 5);
        assert_eq!(s.sum_ns, 500 + 1_000 + 1_001 + 3_000 + 80_000_000);
        let cum: Vec<(f64, u64)> = s.cumulative().collect();
        assert_eq!(cum.len(), FINITE_BUCKETS);
        assert_eq!(cum[0], (1e-6, 2));
        assert_eq!(cum[1], (2e-6, 3));
        assert_eq!(cum[2], (4e-6, 4));
        assert_eq!(cum[16].1, 4);
        assert_eq!(cum[17].1, 5);
        let mut m = s;
        m.merge(&s);
        assert_eq!(m.count(), 10);
        assert_eq!(m.sum_ns, 2 * s.sum_ns);
        assert_eq!(m.buckets[0], 4);
    }

    #[test]
    fn single_writer_counter_adds() {
        let c = SingleWriterCounter::default();
        c.add(3);
        c.add(4);
        assert_eq!(c.get(), 7);
    }
}
