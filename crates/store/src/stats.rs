//! Counters of the log's storage thread, read by the broker's metrics (`GET /metrics`).
//!
//! Owns: appended records and bytes, write batches (group commits), fsyncs with their
//! latency, and two fixed-bucket histograms (fsync latency, records per batch).
//! Invariants: every field is a relaxed atomic written only by the storage thread (so
//! recording never takes a lock and never blocks an appender); a [`HistogramSnapshot`]'s
//! bucket counts are per bucket (not cumulative) and sum to at most `count` (the rest are
//! above the last bound); a snapshot taken while the thread records may miss the
//! observations of that moment, which Prometheus tolerates.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (seconds) of the fsync latency buckets: 50 µs to 2.5 s.
pub const FSYNC_BUCKETS_S: [f64; 14] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
    2.5,
];

/// Upper bounds of the records-per-write-batch buckets (a batch is one group commit).
pub const BATCH_BUCKETS: [f64; 12] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
];

/// A histogram over fixed upper bounds; observations above the last bound count only in
/// `+Inf` (the total).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Non-cumulative counts, one per bound.
    counts: Vec<AtomicU64>,
    count: AtomicU64,
    /// Sum of the observations, in millionths of the unit (µs for seconds).
    sum_micro: AtomicU64,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending).
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_micro: AtomicU64::new(0),
        }
    }

    /// Records one observation.
    pub fn observe(&self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|b| v <= *b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let micro = (v.max(0.0) * 1e6).round() as u64;
        self.sum_micro.fetch_add(micro, Ordering::Relaxed);
    }

    /// The per-bucket counts, the sum and the count.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut acc = 0;
        let buckets = self
            .bounds
            .iter()
            .zip(&self.counts)
            .map(|(b, c)| {
                let n = c.load(Ordering::Relaxed);
                acc += n;
                (*b, n)
            })
            .collect();
        HistogramSnapshot {
            buckets,
            sum: self.sum_micro.load(Ordering::Relaxed) as f64 / 1e6,
            count: self.count.load(Ordering::Relaxed).max(acc),
        }
    }
}

/// A histogram as read: `(upper bound, observations in that bucket)` pairs (not cumulative),
/// the sum and the count (which includes the observations above the last bound).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistogramSnapshot {
    pub buckets: Vec<(f64, u64)>,
    pub sum: f64,
    pub count: u64,
}

/// What the storage thread did since the store was opened.
#[derive(Debug)]
pub struct LogStats {
    pub appended_records: AtomicU64,
    pub appended_bytes: AtomicU64,
    /// Write batches: each is one `write` (or a few at a segment roll) and at most one fsync.
    pub batches: AtomicU64,
    pub fsyncs: AtomicU64,
    /// Appends that found the submission queue full and waited for the storage thread
    /// (or, non-blocking, were handed back to wait elsewhere): the log was the bottleneck.
    pub append_waits: AtomicU64,
    pub segments_rolled: AtomicU64,
    pub fsync_seconds: Histogram,
    pub batch_records: Histogram,
}

impl Default for LogStats {
    fn default() -> LogStats {
        LogStats {
            appended_records: AtomicU64::new(0),
            appended_bytes: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            fsyncs: AtomicU64::new(0),
            append_waits: AtomicU64::new(0),
            segments_rolled: AtomicU64::new(0),
            fsync_seconds: Histogram::new(&FSYNC_BUCKETS_S),
            batch_records: Histogram::new(&BATCH_BUCKETS),
        }
    }
}

impl LogStats {
    pub(crate) fn fsynced(&self, took: Duration) {
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.fsync_seconds.observe(took.as_secs_f64());
    }

    pub(crate) fn batch(&self, records: u64, bytes: u64) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.appended_records.fetch_add(records, Ordering::Relaxed);
        self.appended_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.batch_records.observe(records as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_count_their_own_observations_and_overflow_only_in_the_total() {
        let h = Histogram::new(&BATCH_BUCKETS);
        for v in [1.0, 1.0, 3.0, 100.0, 10_000.0] {
            h.observe(v);
        }
        let s = h.snapshot();
        assert_eq!(s.count, 5);
        assert_eq!(s.sum, 10_105.0);
        assert_eq!(s.buckets[0], (1.0, 2));
        assert_eq!(s.buckets[2], (4.0, 1));
        assert_eq!(s.buckets[7], (128.0, 1));
        assert_eq!(s.buckets.last(), Some(&(4096.0, 0)));
        assert_eq!(s.buckets.iter().map(|b| b.1).sum::<u64>(), 4);
    }

    #[test]
    fn seconds_keep_microsecond_sums() {
        let st = LogStats::default();
        st.fsynced(Duration::from_micros(300));
        st.fsynced(Duration::from_millis(3));
        let s = st.fsync_seconds.snapshot();
        assert_eq!(s.count, 2);
        assert!((s.sum - 0.0033).abs() < 1e-9, "{}", s.sum);
        assert_eq!(s.buckets[3], (0.000_5, 1));
        assert_eq!(s.buckets[6], (0.005, 1));
        assert_eq!(st.fsyncs.load(Ordering::Relaxed), 2);
    }
}
