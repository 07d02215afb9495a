//! Delay equalization: hold datagrams from fast channels so every channel looks as slow
//! as the slowest one.
//!
//! Logical reception already makes a packet wait for its predecessors on slower
//! channels, so in a steady stream every packet is delivered about one slowest-path
//! delay after it was sent. A sparse stream (TCP in slow start, a ping) sees something
//! else: packets that happen to travel on the fast channel come out early, those on the
//! slow channel late. A TCP sender then sees its round-trip time jump between the
//! channels' delays, and its slow start (HyStart) stops at the first jump, long before
//! the path is full. Holding each channel's datagrams for the difference between the
//! slowest channel's delay and its own makes the delay the same for every packet,
//! whatever the load.
//!
//! No clocks are shared: the striper sends a marker (or trigger) on every channel at
//! the same instant, all carrying the same batch number. The differences between their arrival
//! times are the channels' relative one-way delays, queueing included. Each complete
//! batch gives one sample per channel; the channel's offset is a low percentile (the
//! 20th) of the last second's samples, so that it follows the propagation skew and not
//! the queueing noise (which TCP must keep seeing as it would on one link), and a rare
//! wrong sample does not move it.

use std::collections::VecDeque;

use bytes::Bytes;

use crate::time::{Duration, Instant};

/// A channel whose markers stopped arriving this long ago no longer counts.
const STALE: Duration = Duration::from_secs(1);
/// Batches kept while waiting for their other markers. Markers go out about every 5 ms
/// while data flows (`marker_interval`), so this many cover a skew of over 300 ms
/// between the fastest and the slowest channel. (It was 8: a skew beyond about 40 ms,
/// e.g. 5 and 60 ms paths, was never measured, and the slowest channel was taken for
/// as fast as the next one.)
const BATCHES: usize = 64;
/// A batch whose markers spread over more than this is not a measure of the paths'
/// skew but of a stall (a link whose carrier went off holds what it had queued, and
/// sends it on when it comes back): it is given up. (Taken as a skew, a 1.5 s outage
/// held every other channel's datagrams for 1.5 s once the links were back.) Paths
/// more than this apart are beyond the batch window anyway (`BATCHES`).
const MAX_SKEW: Duration = Duration::from_millis(500);
/// Samples older than this no longer count towards the percentile.
const WINDOW: Duration = Duration::from_secs(1);
/// Most samples kept per channel.
const SAMPLES: usize = 256;

pub(crate) struct Equalizer {
    /// Delay of each channel relative to the batch's earliest arrival, µs: the 20th
    /// percentile of the recent samples.
    offset: Vec<Option<f64>>,
    /// Recent samples per channel: when, and the relative delay in µs.
    samples: Vec<VecDeque<(Instant, f64)>>,
    /// When each channel last delivered a marker.
    last_marker: Vec<Option<Instant>>,
    /// Recent batches: batch number and each channel's arrival time.
    batches: VecDeque<(u32, Vec<Option<Instant>>)>,
    /// Held datagrams per channel: release time, datagram.
    held: Vec<VecDeque<(Instant, Bytes)>>,
    held_total: usize,
    /// Arrival lists of finished batches, to use again (no allocation per marker).
    spare: Vec<Vec<Option<Instant>>>,
    /// Room to sort one channel's samples in.
    scratch: Vec<f64>,
    /// Added to every channel's hold (a playout margin; zero by default).
    margin: Duration,
}

impl Equalizer {
    pub(crate) fn new(n: usize) -> Equalizer {
        Equalizer {
            offset: vec![None; n],
            samples: (0..n).map(|_| VecDeque::new()).collect(),
            last_marker: vec![None; n],
            // Grown as markers come (at most BATCHES).
            batches: VecDeque::new(),
            held: (0..n).map(|_| VecDeque::new()).collect(),
            held_total: 0,
            spare: Vec::new(),
            scratch: Vec::new(),
            margin: Duration::ZERO,
        }
    }

    pub(crate) fn set_margin(&mut self, margin: Duration) {
        self.margin = margin;
    }

    fn active(&self, now: Instant, c: usize) -> bool {
        self.last_marker[c].is_some_and(|t| now.saturating_since(t) < STALE)
    }

    /// A marker or trigger of batch `batch` arrived on `channel` at `now`.
    pub(crate) fn on_marker(&mut self, now: Instant, channel: usize, batch: u32) {
        let n = self.offset.len();
        self.last_marker[channel] = Some(now);
        self.batches.retain(|(_, arrivals)| {
            arrivals
                .iter()
                .flatten()
                .min()
                .is_none_or(|&first| now.saturating_since(first) <= MAX_SKEW)
        });
        let i = match self.batches.iter().position(|(b, _)| *b == batch) {
            Some(i) => i,
            None => {
                if self.batches.len() == BATCHES {
                    if let Some((_, a)) = self.batches.pop_front() {
                        self.spare.push(a);
                    }
                }
                let mut arrivals = self.spare.pop().unwrap_or_default();
                arrivals.clear();
                arrivals.resize(n, None);
                self.batches.push_back((batch, arrivals));
                self.batches.len() - 1
            }
        };
        if self.batches[i].1[channel].is_some() {
            return; // a duplicate
        }
        self.batches[i].1[channel] = Some(now);
        let arrivals = &self.batches[i].1;
        let complete = (0..n).all(|c| arrivals[c].is_some() || !self.active(now, c));
        if !complete {
            return;
        }
        let (_, arrivals) = self.batches.remove(i).expect("batch exists");
        let Some(first) = arrivals.iter().flatten().min().copied() else {
            self.spare.push(arrivals);
            return;
        };
        for (c, t) in arrivals.iter().enumerate() {
            if let Some(t) = t {
                let sample = t.saturating_since(first).as_micros() as f64;
                let q = &mut self.samples[c];
                q.push_back((now, sample));
                while q.len() > SAMPLES
                    || q.front()
                        .is_some_and(|(at, _)| now.saturating_since(*at) > WINDOW)
                {
                    q.pop_front();
                }
                let v = &mut self.scratch;
                v.clear();
                v.extend(q.iter().map(|(_, v)| *v));
                let k = v.len() / 5;
                let (_, p20, _) = v.select_nth_unstable_by(k, f64::total_cmp);
                self.offset[c] = Some(*p20);
            }
        }
        self.spare.push(arrivals);
    }

    /// How long to hold a datagram arriving now on `channel`.
    pub(crate) fn hold(&self, now: Instant, channel: usize) -> Duration {
        let Some(own) = self.offset[channel] else {
            return self.margin;
        };
        let slowest = (0..self.offset.len())
            .filter(|&c| self.active(now, c))
            .filter_map(|c| self.offset[c])
            .fold(own, f64::max);
        Duration::from_micros((slowest - own).max(0.0) as u64) + self.margin
    }

    /// How long a datagram arriving now on `channel` is held for the channels' skew
    /// alone (its hold without the margin).
    pub(crate) fn skew(&self, now: Instant, channel: usize) -> Duration {
        let hold = self.hold(now, channel).as_micros();
        Duration::from_micros(hold.saturating_sub(self.margin.as_micros()))
    }

    /// Hold `datagram` from `channel`, which arrived at `arrived` (FIFO per channel);
    /// returns it back if it can go through at once. At most `limit` datagrams wait per
    /// channel: beyond that the oldest one is made due at once.
    pub(crate) fn push(
        &mut self,
        now: Instant,
        arrived: Instant,
        channel: usize,
        datagram: Bytes,
        limit: usize,
    ) -> Option<Bytes> {
        let hold = self.hold(now, channel);
        let due = arrived + hold;
        let q = &mut self.held[channel];
        if q.is_empty() && due <= now {
            return Some(datagram);
        }
        if q.len() >= limit {
            if let Some(front) = q.front_mut() {
                front.0 = now;
            }
        }
        let at = due.max(q.back().map_or(now, |b| b.0));
        q.push_back((at, datagram));
        self.held_total += 1;
        None
    }

    /// The next held datagram due at `now`, with its channel.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<(usize, Bytes)> {
        if self.held_total == 0 {
            return None;
        }
        let (c, _) = self
            .held
            .iter()
            .enumerate()
            .filter_map(|(c, q)| q.front().map(|(t, _)| (c, *t)))
            .filter(|(_, t)| *t <= now)
            .min_by_key(|(_, t)| *t)?;
        let (_, d) = self.held[c].pop_front().expect("front exists");
        self.held_total -= 1;
        Some((c, d))
    }

    /// When the next held datagram is due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        if self.held_total == 0 {
            return None;
        }
        self.held
            .iter()
            .filter_map(|q| q.front().map(|f| f.0))
            .min()
    }

    /// Datagrams of `channel` held.
    pub(crate) fn held_on(&self, channel: usize) -> usize {
        self.held.get(channel).map_or(0, |q| q.len())
    }

    /// Datagrams held.
    pub(crate) fn held(&self) -> usize {
        self.held_total
    }

    /// Everything held, in release order (for a drain).
    pub(crate) fn take_all(&mut self) -> Vec<(usize, Bytes)> {
        let mut all: Vec<(Instant, usize, Bytes)> = Vec::with_capacity(self.held_total);
        for (c, q) in self.held.iter_mut().enumerate() {
            all.extend(q.drain(..).map(|(t, d)| (t, c, d)));
        }
        self.held_total = 0;
        all.sort_by_key(|(t, c, _)| (*t, *c));
        all.into_iter().map(|(_, c, d)| (c, d)).collect()
    }

    /// Current hold of each channel, µs (for stats).
    pub(crate) fn holds_us(&self, now: Instant) -> Vec<u64> {
        (0..self.offset.len())
            .map(|c| self.hold(now, c).as_micros())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(us: u64) -> Instant {
        Instant::from_micros(us)
    }

    #[test]
    fn holds_fast_channels_by_the_skew() {
        let mut e = Equalizer::new(3);
        // Channel delays 5, 20, 60 ms: batch sent at 0, arrivals at those times.
        for k in 0..20u32 {
            let base = u64::from(k) * 10_000;
            e.on_marker(t(base + 5_000), 0, k);
            e.on_marker(t(base + 20_000), 1, k);
            e.on_marker(t(base + 60_000), 2, k);
        }
        let now = t(300_000);
        assert_eq!(e.hold(now, 2), Duration::ZERO);
        assert_eq!(e.hold(now, 1).as_micros(), 40_000);
        assert_eq!(e.hold(now, 0).as_micros(), 55_000);
        // FIFO per channel, released in time order.
        assert!(e.push(now, now, 2, Bytes::from_static(b"c"), 100).is_some());
        assert!(e.push(now, now, 0, Bytes::from_static(b"a"), 100).is_none());
        assert!(e
            .push(t(310_000), t(310_000), 1, Bytes::from_static(b"b"), 100)
            .is_none());
        assert_eq!(e.next_due(), Some(t(350_000)));
        assert!(e.pop_due(t(349_999)).is_none());
        assert_eq!(e.pop_due(t(350_000)).unwrap().0, 1);
        assert_eq!(e.pop_due(t(355_000)).unwrap().0, 0);
        assert_eq!(e.held(), 0);
    }

    #[test]
    fn a_margin_absorbs_a_hold_before_the_equalizer() {
        let mut e = Equalizer::new(2);
        for k in 0..4u32 {
            e.on_marker(t(u64::from(k) * 1000 + 100), 0, k);
            e.on_marker(t(u64::from(k) * 1000 + 900), 1, k);
        }
        e.set_margin(Duration::from_millis(20));
        let now = t(10_000);
        assert_eq!(e.hold(now, 1).as_micros(), 20_000);
        assert_eq!(e.hold(now, 0).as_micros(), 20_800);
        // Channel 1's datagram arrived at 10 ms but was held 15 ms before the
        // equalizer (a repair): it is still due at 30 ms, not 45.
        assert!(e
            .push(t(25_000), now, 1, Bytes::from_static(b"x"), 100)
            .is_none());
        assert_eq!(e.next_due(), Some(t(30_000)));
        // Held longer than the margin: through at once.
        assert!(e
            .push(t(40_000), t(15_000), 0, Bytes::from_static(b"y"), 100)
            .is_some());
    }

    #[test]
    fn a_skew_of_many_marker_intervals_is_measured() {
        // Markers every 5 ms; the slow channel is 55 ms behind the fast one: eleven
        // batches are in flight before the slow channel's marker of the first arrives.
        let mut e = Equalizer::new(3);
        let mut arrivals: Vec<(u64, usize, u32)> = (0..200u32)
            .flat_map(|k| {
                let sent = u64::from(k) * 5_000;
                [
                    (sent + 5_000, 0, k),
                    (sent + 20_000, 1, k),
                    (sent + 60_000, 2, k),
                ]
            })
            .collect();
        arrivals.sort();
        for (at, c, k) in arrivals {
            e.on_marker(t(at), c, k);
        }
        let now = t(1_000_000);
        assert_eq!(e.hold(now, 2), Duration::ZERO);
        assert_eq!(e.hold(now, 1).as_micros(), 40_000);
        assert_eq!(e.hold(now, 0).as_micros(), 55_000);
    }

    #[test]
    fn silent_channels_stop_counting() {
        let mut e = Equalizer::new(2);
        for k in 0..4u32 {
            e.on_marker(t(u64::from(k) * 1000 + 100), 0, k);
            e.on_marker(t(u64::from(k) * 1000 + 900), 1, k);
        }
        assert_eq!(e.hold(t(5_000), 0).as_micros(), 800);
        // Channel 1 goes silent: after a second its delay no longer holds channel 0.
        e.on_marker(t(2_000_000), 0, 10);
        assert_eq!(e.hold(t(2_000_000), 0), Duration::ZERO);
    }
}
