//! What a run measures at the receiver: goodput, order, latency, resynchronization.

use crate::model::Nanos;

/// Bin width of the series of goodput over time (`goodput_series_bps` of a run and of
/// its TCP flow).
pub const SERIES_BIN: Nanos = 100_000_000;

/// A log-linear histogram of nanosecond values: exact below 256 ns, then 128 buckets
/// per power of two (a quantile is reported as its bucket's midpoint, within 0.4 %).
#[derive(Clone, Debug)]
pub struct Histogram {
    counts: Vec<u64>,
    n: u64,
    sum: u128,
    max: u64,
}

const SUB_BITS: u32 = 7;
const SUB: u64 = 1 << SUB_BITS;
const LINEAR: u64 = 2 * SUB;

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new()
    }
}

impl Histogram {
    /// Empty.
    pub fn new() -> Histogram {
        Histogram {
            counts: Vec::new(),
            n: 0,
            sum: 0,
            max: 0,
        }
    }

    #[inline]
    fn bucket(v: u64) -> usize {
        if v < LINEAR {
            return v as usize;
        }
        let e = 63 - v.leading_zeros(); // >= SUB_BITS + 1
        let sub = (v >> (e - SUB_BITS)) & (SUB - 1);
        (LINEAR + u64::from(e - SUB_BITS - 1) * SUB + sub) as usize
    }

    fn bounds(b: usize) -> (u64, u64) {
        let b = b as u64;
        if b < LINEAR {
            return (b, b + 1);
        }
        let k = b - LINEAR;
        let e = k / SUB + u64::from(SUB_BITS) + 1;
        let sub = k % SUB;
        let lo = (SUB + sub) << (e - u64::from(SUB_BITS));
        let width = 1u64 << (e - u64::from(SUB_BITS));
        (lo, lo + width)
    }

    /// Add a value.
    #[inline]
    pub fn record(&mut self, v: u64) {
        let b = Self::bucket(v);
        if b >= self.counts.len() {
            self.counts.resize(b + 1, 0);
        }
        self.counts[b] += 1;
        self.n += 1;
        self.sum += u128::from(v);
        self.max = self.max.max(v);
    }

    /// Add everything from `other`.
    pub fn merge(&mut self, other: &Histogram) {
        if other.counts.len() > self.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.n += other.n;
        self.sum += other.sum;
        self.max = self.max.max(other.max);
    }

    /// Number of values.
    pub fn count(&self) -> u64 {
        self.n
    }

    /// Exact mean (0 when empty).
    pub fn mean(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.sum as f64 / self.n as f64
        }
    }

    /// Exact maximum (0 when empty).
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The `q` quantile (0..=1), as a bucket midpoint, never above the maximum.
    pub fn quantile(&self, q: f64) -> f64 {
        if self.n == 0 {
            return 0.0;
        }
        let rank = ((q * self.n as f64).ceil() as u64).clamp(1, self.n);
        let mut acc = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            acc += c;
            if acc >= rank {
                let (lo, hi) = Self::bounds(b);
                let mid = if hi - lo == 1 {
                    lo as f64
                } else {
                    (lo as f64 + hi as f64 - 1.0) / 2.0
                };
                return mid.min(self.max as f64);
            }
        }
        self.max as f64
    }
}

/// Tracks, per loss episode, when delivery became FIFO again after it ended.
#[derive(Clone, Debug, Default)]
pub struct Resync {
    /// Episodes `[start, end)`, sorted, disjoint.
    episodes: Vec<(Nanos, Nanos)>,
    /// Index of the first episode whose end is after the last delivery seen.
    next: usize,
    /// Per episode: time of the last out-of-order delivery in its recovery span.
    last_ooo: Vec<Option<Nanos>>,
    /// Per episode: an in-order delivery followed the last out-of-order one.
    in_order_after: Vec<bool>,
}

impl Resync {
    /// Track these episodes (merged and sorted here).
    pub fn new(mut episodes: Vec<(Nanos, Nanos)>) -> Resync {
        episodes.retain(|e| e.1 > e.0);
        episodes.sort_unstable();
        let mut merged: Vec<(Nanos, Nanos)> = Vec::new();
        for (a, b) in episodes {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        let n = merged.len();
        Resync {
            episodes: merged,
            next: 0,
            last_ooo: vec![None; n],
            in_order_after: vec![false; n],
        }
    }

    /// The merged episodes.
    pub fn episodes(&self) -> &[(Nanos, Nanos)] {
        &self.episodes
    }

    /// A delivery at `t` (non-decreasing), out of order or not.
    #[inline]
    pub fn on_delivery(&mut self, t: Nanos, out_of_order: bool) {
        if self.episodes.is_empty() {
            return;
        }
        while self.next < self.episodes.len() && self.episodes[self.next].1 <= t {
            self.next += 1;
        }
        // The recovery span of episode e is [end_e, start_{e+1}).
        let Some(e) = self.next.checked_sub(1) else {
            return;
        };
        if self.next < self.episodes.len() && t >= self.episodes[self.next].0 {
            return; // inside the next episode
        }
        if out_of_order {
            self.last_ooo[e] = Some(t);
            self.in_order_after[e] = false;
        } else {
            self.in_order_after[e] = true;
        }
    }

    /// Per episode: seconds from its end until the last out-of-order delivery of its
    /// recovery span (0 if none), and whether in-order delivery followed.
    pub fn finish(&self) -> (Vec<f64>, Vec<bool>) {
        let mut times = Vec::with_capacity(self.episodes.len());
        let mut ok = Vec::with_capacity(self.episodes.len());
        for (i, &(_, end)) in self.episodes.iter().enumerate() {
            match self.last_ooo[i] {
                None => {
                    times.push(0.0);
                    ok.push(true);
                }
                Some(t) => {
                    times.push((t - end) as f64 / 1e9);
                    ok.push(self.in_order_after[i]);
                }
            }
        }
        (times, ok)
    }
}

/// Receiver-side measurements of one run.
#[derive(Clone, Debug, Default)]
pub struct Receiver {
    /// Packets delivered to the application.
    pub delivered: u64,
    /// Payload bytes delivered.
    pub delivered_bytes: u64,
    /// Payload bytes delivered up to the end of the measurement window.
    pub window_bytes: u64,
    /// Of those, bytes of packets that were delivered in order.
    pub window_inorder_bytes: u64,
    /// Highest packet id delivered so far.
    pub max_id: Option<u64>,
    /// Deliveries of a packet after one that was sent later.
    pub out_of_order: u64,
    /// Largest `max_id - id` over out-of-order deliveries.
    pub max_reorder_depth: u64,
    /// One-way latency, from the striper to the application.
    pub latency: Histogram,
    /// Time of the last delivery.
    pub last_delivery: Nanos,
    /// Loss episodes and recovery.
    pub resync: Resync,
    /// With a bin width: payload bytes delivered in each bin of that width from the
    /// start (for runs whose links change over time).
    pub series_bin: Option<Nanos>,
    /// The bins.
    pub series: Vec<u64>,
}

impl Receiver {
    /// Record the delivery of packet `id` of `bytes` bytes, sent at `sent`, now `t`.
    #[inline]
    pub fn on_delivery(&mut self, t: Nanos, id: u64, sent: Nanos, bytes: u64, window_end: Nanos) {
        self.delivered += 1;
        self.delivered_bytes += bytes;
        let ooo = match self.max_id {
            Some(m) if id < m => {
                self.out_of_order += 1;
                self.max_reorder_depth = self.max_reorder_depth.max(m - id);
                true
            }
            _ => {
                self.max_id = Some(id);
                false
            }
        };
        if t <= window_end {
            self.window_bytes += bytes;
            if !ooo {
                self.window_inorder_bytes += bytes;
            }
        }
        if let Some(w) = self.series_bin {
            let i = (t / w.max(1)) as usize;
            if i < 1 << 20 {
                if self.series.len() <= i {
                    self.series.resize(i + 1, 0);
                }
                self.series[i] += bytes;
            }
        }
        self.latency.record(t.saturating_sub(sent));
        self.last_delivery = t;
        self.resync.on_delivery(t, ooo);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_close() {
        let mut h = Histogram::new();
        for v in 1..=100_000u64 {
            h.record(v * 1000);
        }
        let p50 = h.quantile(0.5);
        let p99 = h.quantile(0.99);
        assert!((p50 / 50_000_000.0 - 1.0).abs() < 0.005, "{p50}");
        assert!((p99 / 99_000_000.0 - 1.0).abs() < 0.005, "{p99}");
        assert_eq!(h.max(), 100_000_000);
        assert!((h.mean() - 50_000_500.0).abs() < 1.0);
        for v in [0u64, 1, 255, 256, 257, 1 << 20, u64::MAX / 3] {
            let (lo, hi) = Histogram::bounds(Histogram::bucket(v));
            assert!(lo <= v && v < hi, "{v} in [{lo},{hi})");
        }
    }

    #[test]
    fn out_of_order_counts_later_sent_first() {
        let mut r = Receiver::default();
        for (i, id) in [0u64, 2, 1, 3, 5, 4].iter().enumerate() {
            r.on_delivery(i as u64, *id, 0, 10, u64::MAX);
        }
        assert_eq!(r.out_of_order, 2);
        assert_eq!(r.max_reorder_depth, 1);
        assert_eq!(r.window_inorder_bytes, 40);
    }

    #[test]
    fn resync_measures_from_episode_end() {
        let mut s = Resync::new(vec![(100, 200), (150, 250), (1000, 1100)]);
        assert_eq!(s.episodes(), &[(100, 250), (1000, 1100)]);
        s.on_delivery(120, true); // inside: ignored
        s.on_delivery(300, true);
        s.on_delivery(400, true);
        s.on_delivery(500, false);
        s.on_delivery(1050, true); // inside the second
        s.on_delivery(1200, true); // never followed by in-order
        let (t, ok) = s.finish();
        assert_eq!(ok, vec![true, false]);
        assert!((t[0] - 150e-9).abs() < 1e-15);
        assert!((t[1] - 100e-9).abs() < 1e-15);
    }
}
