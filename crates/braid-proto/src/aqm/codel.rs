//! The CoDel control law (Nichols & Jacobson; RFC 8289), driven by a measured queueing
//! delay instead of a packet's sojourn in a local queue.
//!
//! CoDel signals congestion when the queueing delay has stayed above `target` for at
//! least `interval`; it then signals once, and again after `interval / sqrt(count)`
//! while the delay stays above target, so the signal rate rises until the senders slow
//! down. One short burst above target (a packet train, a scheduling hiccup) is never
//! signalled: the queue must *stand*.

use crate::time::{Duration, Instant};

/// CoDel's state.
#[derive(Clone, Debug)]
pub struct Codel {
    target: Duration,
    /// How long the delay must stay above target before the first signal.
    first: Duration,
    /// The spacing of signals while it stays there (divided by the root of their
    /// count).
    interval: Duration,
    /// When the delay will have been above target for `first`.
    first_above: Option<Instant>,
    dropping: bool,
    /// Signals in the current dropping state.
    count: u32,
    /// `count` when the last dropping state began.
    last_count: u32,
    /// The next signal, while dropping.
    next: Instant,
}

impl Codel {
    /// CoDel with this target delay and interval (RFC 8289: 5 ms and 100 ms).
    pub fn new(target: Duration, interval: Duration) -> Codel {
        Codel {
            target,
            first: interval,
            interval,
            first_above: None,
            dropping: false,
            count: 0,
            last_count: 0,
            next: Instant::ZERO,
        }
    }

    /// Change the target, how long a queue must stand before the first signal
    /// (`first`) and the spacing of the next ones (`interval`; RFC 8289 uses its
    /// interval for both). The state carries on: a standing queue stays one, and a
    /// signal already scheduled keeps its time.
    pub fn set_params(&mut self, target: Duration, first: Duration, interval: Duration) {
        self.target = target;
        self.first = first;
        self.interval = interval;
    }

    fn control_law(&self, t: Instant) -> Instant {
        let step = self.interval.as_micros() as f64 / f64::from(self.count.max(1)).sqrt();
        t + Duration::from_micros(step as u64)
    }

    /// A packet leaves at `now` while the queueing delay is `delay`: should it carry a
    /// congestion signal (a CE mark, or a drop)?
    pub fn on_dequeue(&mut self, now: Instant, delay: Duration) -> bool {
        let ok_to_signal = if delay < self.target {
            self.first_above = None;
            false
        } else {
            match self.first_above {
                None => {
                    self.first_above = Some(now + self.first);
                    false
                }
                Some(t) => now >= t,
            }
        };
        if self.dropping {
            if !ok_to_signal {
                self.dropping = false;
                return false;
            }
            if now >= self.next {
                self.count = self.count.saturating_add(1);
                self.next = self.control_law(self.next);
                return true;
            }
            return false;
        }
        if !ok_to_signal {
            return false;
        }
        self.dropping = true;
        // Start near the last rate if the last dropping state ended recently (RFC 8289
        // §5.5): the senders had slowed down only just enough.
        let delta = self.count.saturating_sub(self.last_count);
        let recent =
            now.saturating_since(self.next) < Duration::from_micros(16 * self.interval.as_micros());
        self.count = if delta > 1 && recent { delta } else { 1 };
        self.last_count = self.count;
        self.next = self.control_law(now);
        true
    }

    /// Is CoDel in its signalling state?
    pub fn dropping(&self) -> bool {
        self.dropping
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(x: u64) -> Instant {
        Instant::from_micros(x * 1000)
    }

    #[test]
    fn a_short_burst_is_not_signalled() {
        let mut c = Codel::new(Duration::from_millis(5), Duration::from_millis(100));
        // 90 ms above target, then below: nothing.
        for t in 0..90 {
            assert!(!c.on_dequeue(ms(t), Duration::from_millis(20)));
        }
        assert!(!c.on_dequeue(ms(90), Duration::from_millis(1)));
        for t in 91..300 {
            assert!(!c.on_dequeue(ms(t), Duration::from_millis(1)));
        }
    }

    #[test]
    fn a_standing_queue_is_signalled_ever_more_often() {
        let mut c = Codel::new(Duration::from_millis(5), Duration::from_millis(100));
        let mut signals = vec![];
        for t in 0..1000 {
            if c.on_dequeue(ms(t), Duration::from_millis(10)) {
                signals.push(t);
            }
        }
        // First after one interval, then at interval/sqrt(n): 100, 200, 270, 328, ...
        assert_eq!(signals[0], 100);
        assert_eq!(signals[1], 200);
        assert!((270..=271).contains(&signals[2]), "{signals:?}");
        let gaps: Vec<u64> = signals.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            gaps.windows(2).all(|g| g[1] <= g[0]),
            "gaps shrink: {gaps:?}"
        );
        assert!(c.dropping());
        // The queue drains: signalling stops at once.
        assert!(!c.on_dequeue(ms(1000), Duration::from_millis(2)));
        assert!(!c.dropping());
    }

    #[test]
    fn re_entering_soon_resumes_near_the_last_rate() {
        let mut c = Codel::new(Duration::from_millis(5), Duration::from_millis(100));
        let mut t = 0;
        let mut n = 0;
        while t < 2000 {
            n += c.on_dequeue(ms(t), Duration::from_millis(10)) as u32;
            t += 1;
        }
        assert!(n > 5);
        c.on_dequeue(ms(t), Duration::from_millis(1));
        // Above target again for an interval: the first gap is short, not 100 ms.
        let mut first = vec![];
        for u in t + 1..t + 400 {
            if c.on_dequeue(ms(u), Duration::from_millis(10)) {
                first.push(u);
            }
        }
        assert!(first.len() >= 3);
        assert!(first[1] - first[0] < 100, "{first:?}");
    }
}
