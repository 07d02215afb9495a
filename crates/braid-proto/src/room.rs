//! How much room a queue keeps after a burst (issue 30: idle peers cost little).
//!
//! A queue that is drained and filled again (a session's outgoing datagrams, a
//! driver's send lists) keeps its capacity, so that steady traffic allocates nothing.
//! But one burst (a capacity probe's train, which every new session sends) would then
//! leave a large capacity behind for good, on each of a server's many idle peers.
//! [`Room`] notes the most the queue held; once per [`PERIOD`], a capacity well above
//! that (more than twice, and more than [`KEEP`]) is given back down to it. Under
//! steady traffic the capacity stays (the peak of each period is what it holds); at
//! most one reallocation per period otherwise.

use crate::time::{Duration, Instant};

/// How often the capacity is compared with what was held.
pub const PERIOD: Duration = Duration::from_secs(1);
/// A capacity up to this is always kept.
pub const KEEP: usize = 8;

/// The most a queue held in the current period.
#[derive(Debug, Clone)]
pub struct Room {
    peak: usize,
    since: Instant,
}

impl Default for Room {
    fn default() -> Room {
        Room::new()
    }
}

impl Room {
    /// Nothing held yet; the first period starts at [`Instant::ZERO`].
    pub const fn new() -> Room {
        Room {
            peak: 0,
            since: Instant::ZERO,
        }
    }

    /// The queue holds `len` items now.
    #[inline]
    pub fn note(&mut self, len: usize) {
        self.peak = self.peak.max(len);
    }

    /// At the end of a period (a new one starts): the capacity to shrink the queue to,
    /// if its `capacity` is more than twice the most it held (and more than [`KEEP`]).
    #[inline]
    pub fn check(&mut self, now: Instant, capacity: usize) -> Option<usize> {
        if now.saturating_since(self.since) < PERIOD {
            return None;
        }
        self.since = now;
        let peak = std::mem::take(&mut self.peak).max(KEEP);
        (capacity > 2 * peak).then_some(peak)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_given_back_and_steady_use_is_kept() {
        let at = |ms: u64| Instant::ZERO + Duration::from_millis(ms);
        let mut r = Room::new();
        let mut q: Vec<u32> = Vec::new();
        // A burst of 100, then 2 at a time.
        q.extend(0..100);
        r.note(q.len());
        q.clear();
        assert_eq!(r.check(at(500), q.capacity()), None, "within the period");
        for t in (600..1000).step_by(50) {
            q.extend(0..2);
            r.note(q.len());
            q.clear();
            assert_eq!(r.check(at(t), q.capacity()), None);
        }
        // The period with the burst: its peak was 100, nothing to give back.
        assert_eq!(r.check(at(1000), q.capacity()), None);
        for t in (1050..2000).step_by(50) {
            q.extend(0..2);
            r.note(q.len());
            q.clear();
            assert_eq!(r.check(at(t), q.capacity()), None);
        }
        // A period of 2 at a time: down to KEEP.
        let to = r.check(at(2000), q.capacity()).expect("shrinks");
        assert_eq!(to, KEEP);
        q.shrink_to(to);
        assert!(q.capacity() < 16, "{}", q.capacity());
        // Steady use of 64 keeps its room.
        for t in (2050..4100).step_by(50) {
            q.extend(0..64);
            r.note(q.len());
            q.clear();
            assert_eq!(r.check(at(t), q.capacity()), None);
        }
    }
}
