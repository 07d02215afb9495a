//! Per-channel feedback: what each end received on each channel, reported back every
//! heartbeat ([`wire::session::Feedback`]), and the sender's estimates made from those
//! reports: round-trip time (smoothed and minimum), delivery rate and loss.
//!
//! The receiver's side ([`RxCounts`]) counts authenticated datagrams and bytes per
//! channel, and the datagrams missing from the channel's sealing counter (each channel
//! is FIFO and every sealed datagram takes the next counter, so a gap is a loss unless
//! the datagram turns up late, which undoes it). The sender's side ([`Estimator`]) turns
//! consecutive reports into samples: the receiver's timestamps give the interval over
//! which bytes arrived, so the delivery rate does not depend on how the reports travel
//! back; the timestamp echo gives the round trip without synchronised clocks. The same
//! echo, read with the peer's timestamp, gives the one-way delay of our reports to the
//! peer, up to the clocks' offset: above its recent minimum, it is the queue that stands
//! on the channel in our sending direction only (a round trip also counts the queue of
//! the peer's traffic on the way back).
//!
//! In security mode `none` data datagrams are not sealed, so only control datagrams
//! carry counters: the loss estimate then rests on far fewer datagrams (hellos, markers).
//!
//! These estimates are what adaptive weights and per-channel pacing (the congestion
//! issue) are built on; today they are reported in the session's statistics.

use std::collections::VecDeque;

use crate::time::{Duration, Instant};
use crate::wire::session::Feedback;

/// Round-trip samples kept for the minimum (about 3 s at the default 50 ms heartbeat).
const RTT_WINDOW: usize = 64;
/// Reports over which a queue must stand (about 300 ms at 50 ms).
const QUEUE_WINDOW: usize = 6;
/// Reports over which the delivery rate is averaged (about 400 ms at 50 ms).
const RATE_WINDOW: usize = 8;
/// Reports over which the recent delivery rate is averaged.
const RECENT_WINDOW: usize = 2;
/// Rates are given only from this many intervals on: right after a channel starts
/// carrying data, what arrives lags what is sent by the one-way delay, a large share of
/// one short interval.
const MIN_INTERVALS: usize = 4;
/// Reports over which the loss ratio is counted (about 400 ms at 50 ms: recent enough
/// for the weight controller to see the effect of its last step).
const LOSS_WINDOW: usize = 8;

/// The receiver's counts for one channel, reported in its feedback.
#[derive(Clone, Debug, Default)]
pub(crate) struct RxCounts {
    /// Authenticated datagrams received (bare data too in mode `none`).
    pub datagrams: u64,
    /// Their bytes.
    pub bytes: u64,
    /// The latest peer timestamp heard on the channel, and when.
    pub peer_ts: Option<(u32, Instant)>,
    /// Datagrams found missing on the channel while its queue stood above the AQM's
    /// target (congestion).
    pub congested: u64,
}

impl RxCounts {
    /// A datagram of `len` bytes was accepted.
    pub fn accepted(&mut self, len: usize) {
        self.datagrams += 1;
        self.bytes += len as u64;
    }

    /// The report to send at `now` on `channel`; `missing` is the security layer's
    /// count of counters missing on it.
    pub fn report(&self, channel: u8, now: Instant, missing: u64) -> Feedback {
        let (echo, echo_delay) = match self.peer_ts {
            Some((ts, at)) => (ts, clamp_u32(now.saturating_since(at).as_micros())),
            None => (0, 0),
        };
        Feedback {
            channel,
            timestamp: timestamp(now),
            echo,
            echo_delay,
            rx_datagrams: self.datagrams,
            rx_bytes: self.bytes,
            missing,
            congested: self.congested.min(missing),
        }
    }
}

/// Our clock as carried in feedback: microseconds, wrapping at 2^32 (71 minutes). Zero
/// is skipped so that an echo of 0 always means "nothing heard".
pub(crate) fn timestamp(now: Instant) -> u32 {
    (now.as_micros() as u32).max(1)
}

fn clamp_u32(v: u64) -> u32 {
    v.min(u64::from(u32::MAX)) as u32
}

/// One interval between two consecutive reports.
#[derive(Clone, Copy, Debug)]
struct Interval {
    /// Receiver-clock microseconds it covers.
    us: u64,
    bytes: u64,
    datagrams: u64,
    missing: u64,
}

/// What the sender knows of one channel, from the peer's reports.
#[derive(Clone, Debug, Default)]
pub(crate) struct Estimator {
    srtt: Option<Duration>,
    rtts: VecDeque<Duration>,
    /// One-way delays to the peer (its clock less ours, microseconds: the clocks'
    /// offset is in every sample alike).
    owds: VecDeque<i64>,
    /// Smoothed queue in our sending direction (one-way delay above its minimum), the
    /// last values.
    queues: VecDeque<u64>,
    last: Option<Feedback>,
    intervals: VecDeque<Interval>,
    last_at: Option<Instant>,
    /// Reports accepted.
    pub reports: u64,
    /// Reports ignored: counts that went backwards (a restarted peer) or a timestamp
    /// that did not move.
    pub stale: u64,
    /// Datagrams received and found missing over every accepted interval (the long-run
    /// counts bad-link demotion differences over its own window, `super::demote`).
    got_total: u64,
    missing_total: u64,
    congested_total: u64,
}

/// The estimates for one channel, as reported in statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Estimate {
    /// Smoothed round-trip time (RFC 6298's 1/8 gain).
    pub srtt: Option<Duration>,
    /// Smallest round trip among the last samples.
    pub rtt_min: Option<Duration>,
    /// Queue standing on the channel in our sending direction: the one-way delay of our
    /// reports above its minimum among the last samples, smoothed with a gain of 1/4, at
    /// its lowest over the last [`QUEUE_WINDOW`] reports: a queue that stood that long,
    /// as CoDel's standing queue (slow start's bursts build queues of a few milliseconds
    /// that come and go, at a fraction of the channel's rate).
    pub queue: Option<Duration>,
    /// Bytes the peer received on the channel per second, averaged over the last
    /// reports, in bit/s.
    pub delivery_bps: Option<f64>,
    /// The same over the last two reports only (about 100 ms at 50 ms): what a channel
    /// whose queue is full carries, where the longer average still counts the ramp of
    /// a flow's slow start.
    pub recent_bps: Option<f64>,
    /// Mean size of the datagrams the peer received on the channel over the last
    /// reports, bytes (the rates above count these bytes; a pacer's rate counts the
    /// headers below them too).
    pub datagram_bytes: Option<f64>,
    /// Fraction of datagrams missing over the last reports.
    pub loss: Option<f64>,
    /// Datagrams missing over the same reports (what `loss` counts).
    pub missing: u64,
    /// When the last report arrived: estimates of a channel that stopped reporting
    /// (down, or cut) are stale.
    pub reported_at: Option<Instant>,
}

impl Estimator {
    /// A report from the peer arrived at `now`.
    pub fn on_report(&mut self, now: Instant, f: &Feedback) {
        self.last_at = Some(now);
        if f.echo != 0 {
            // Our timestamp came back: the round trip less the time the peer held it.
            let ours = timestamp(now);
            let rtt = u64::from(ours.wrapping_sub(f.echo).wrapping_sub(f.echo_delay));
            // A wrapped (negative) result means a bogus echo: skip it.
            if rtt < u64::from(u32::MAX / 2) {
                self.rtt_sample(Duration::from_micros(rtt));
                // When the peer heard our timestamp, by its clock, less when we sent it:
                // the one-way delay plus the clocks' offset (wrapping, as a signed
                // difference).
                let heard = f.timestamp.wrapping_sub(f.echo_delay);
                self.owd_sample(i64::from(heard.wrapping_sub(f.echo) as i32));
            }
        }
        if let Some(prev) = self.last {
            let us = u64::from(f.timestamp.wrapping_sub(prev.timestamp));
            let back = f.rx_datagrams < prev.rx_datagrams
                || f.rx_bytes < prev.rx_bytes
                || f.missing < prev.missing
                || f.congested < prev.congested;
            if back || us == 0 || us >= u64::from(u32::MAX / 2) {
                self.stale += 1;
                self.intervals.clear();
            } else {
                self.got_total += f.rx_datagrams - prev.rx_datagrams;
                self.missing_total += f.missing - prev.missing;
                self.congested_total += f.congested - prev.congested;
                push_bounded(
                    &mut self.intervals,
                    Interval {
                        us,
                        bytes: f.rx_bytes - prev.rx_bytes,
                        datagrams: f.rx_datagrams - prev.rx_datagrams,
                        missing: f.missing - prev.missing,
                    },
                    LOSS_WINDOW,
                );
            }
        }
        self.reports += 1;
        self.last = Some(*f);
    }

    fn owd_sample(&mut self, owd: i64) {
        push_bounded(&mut self.owds, owd, RTT_WINDOW);
        let min = self.owds.iter().copied().min().unwrap_or(owd);
        let q = (owd - min).max(0) as u64;
        let smoothed = match self.queues.back() {
            None => q,
            Some(s) => (3 * s + q) / 4,
        };
        push_bounded(&mut self.queues, smoothed, QUEUE_WINDOW);
    }

    fn rtt_sample(&mut self, rtt: Duration) {
        self.srtt = Some(match self.srtt {
            None => rtt,
            Some(s) => Duration::from_micros((7 * s.as_micros() + rtt.as_micros()) / 8),
        });
        push_bounded(&mut self.rtts, rtt, RTT_WINDOW);
    }

    /// Datagrams the peer received on the channel and found missing on it, summed over
    /// every interval accepted since this estimator started (cumulative; they start over
    /// with a new estimator, when the channel goes down or comes back).
    pub fn totals(&self) -> (u64, u64) {
        (self.got_total, self.missing_total)
    }

    /// Of [`Estimator::totals`]' missing datagrams, those the peer found while the
    /// channel's queue stood (congestion), summed the same way.
    pub fn congested_total(&self) -> u64 {
        self.congested_total
    }

    /// The delivery rate over the last `n` intervals (bit/s), once there are enough.
    fn rate_over(&self, n: usize) -> Option<f64> {
        let (us, bytes) = self
            .intervals
            .iter()
            .rev()
            .take(n)
            .fold((0u64, 0u64), |(u, b), i| (u + i.us, b + i.bytes));
        (us > 0 && self.intervals.len() >= MIN_INTERVALS).then(|| bytes as f64 * 8e6 / us as f64)
    }

    /// The smoothed round trip alone (`estimate().srtt`, without the rest's work).
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt
    }

    /// The base round trip alone (`estimate().rtt_min`, without the rest's work).
    pub fn rtt_min(&self) -> Option<Duration> {
        self.rtts.iter().min().copied()
    }

    /// The current estimates.
    pub fn estimate(&self) -> Estimate {
        let (got, missing, bytes) = self
            .intervals
            .iter()
            .fold((0u64, 0u64, 0u64), |(g, m, b), i| {
                (g + i.datagrams, m + i.missing, b + i.bytes)
            });
        Estimate {
            reported_at: self.last_at,
            srtt: self.srtt,
            rtt_min: self.rtt_min(),
            queue: self.queues.iter().min().map(|&q| Duration::from_micros(q)),
            delivery_bps: self.rate_over(RATE_WINDOW),
            recent_bps: self.rate_over(RECENT_WINDOW),
            datagram_bytes: (got > 0).then(|| bytes as f64 / got as f64),
            loss: (got + missing > 0).then(|| missing as f64 / (got + missing) as f64),
            missing,
        }
    }
}

fn push_bounded<T>(q: &mut VecDeque<T>, v: T, max: usize) {
    if q.len() == max {
        q.pop_front();
    }
    q.push_back(v);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::from_micros(ms * 1000)
    }

    #[test]
    fn echo_gives_the_round_trip_less_the_peers_hold() {
        // The peer heard our timestamp of t=100 ms at its t=130 ms and reports at 140.
        let rx = RxCounts {
            peer_ts: Some((timestamp(at(100)), at(130))),
            ..Default::default()
        };
        let f = rx.report(0, at(140), 0);
        assert_eq!(f.echo_delay, 10_000);
        let mut e = Estimator::default();
        // Back with us at t=160: 60 ms elapsed, 10 of them at the peer.
        e.on_report(at(160), &f);
        assert_eq!(e.estimate().srtt, Some(Duration::from_millis(50)));
        assert_eq!(e.estimate().rtt_min, Some(Duration::from_millis(50)));
    }

    #[test]
    fn rate_and_loss_come_from_count_differences() {
        let mut e = Estimator::default();
        let report = |ts_ms: u64, n: u64, missing: u64| Feedback {
            channel: 0,
            timestamp: timestamp(at(ts_ms)),
            echo: 0,
            echo_delay: 0,
            rx_datagrams: n,
            rx_bytes: n * 1000,
            missing,
            congested: 0,
        };
        e.on_report(at(0), &report(10, 100, 0));
        assert_eq!(e.estimate().delivery_bps, None, "one report is no interval");
        // Every 50 ms the peer has 450 more datagrams (450 kB: 72 Mbit/s) and 50 more
        // missing.
        for k in 1..=MIN_INTERVALS as u64 {
            assert_eq!(e.estimate().delivery_bps, None, "too few intervals");
            e.on_report(at(50 * k), &report(10 + 50 * k, 100 + 450 * k, 50 * k));
        }
        let est = e.estimate();
        assert!((est.delivery_bps.unwrap() - 72e6).abs() < 1.0);
        assert!((est.loss.unwrap() - 0.1).abs() < 1e-9);
        let k = MIN_INTERVALS as u64;
        assert_eq!(e.totals(), (450 * k, 50 * k));
        // A restarted peer's counts go back: the interval is dropped, not negative.
        e.on_report(at(1000), &report(1010, 3, 0));
        assert_eq!(e.stale, 1);
        assert_eq!(e.estimate().delivery_bps, None);
    }

    #[test]
    fn the_queue_is_the_one_way_delay_above_its_minimum() {
        // The peer's clock runs 7 s ahead of ours. Our reports take 20 ms to reach it at
        // first, then 40 (a queue of 20 ms in our direction); its reports come back in
        // 5 ms and it holds our timestamp 10 ms before answering.
        let mut e = Estimator::default();
        let offset = 7_000;
        let report = |e: &mut Estimator, sent_ms: u64, owd_ms: u64| {
            let heard = sent_ms + owd_ms;
            let f = Feedback {
                channel: 0,
                timestamp: timestamp(at(heard + 10 + offset)),
                echo: timestamp(at(sent_ms)),
                echo_delay: 10_000,
                rx_datagrams: 0,
                rx_bytes: 0,
                missing: 0,
                congested: 0,
            };
            e.on_report(at(heard + 15), &f);
        };
        for k in 0..4 {
            report(&mut e, 1000 + 50 * k, 20);
        }
        assert_eq!(e.estimate().queue, Some(Duration::ZERO));
        for k in 4..40 {
            report(&mut e, 1000 + 50 * k, 40);
        }
        let q = e.estimate().queue.unwrap().as_micros();
        assert!((19_000..=20_000).contains(&q), "{q}");
        // The round trip counts the way back too, which carries no queue here.
        assert_eq!(e.estimate().rtt_min, Some(Duration::from_millis(25)));
    }

    #[test]
    fn bogus_echo_is_ignored() {
        let mut e = Estimator::default();
        let f = Feedback {
            channel: 0,
            timestamp: 5,
            // An echo from our future.
            echo: timestamp(at(500)),
            echo_delay: 0,
            rx_datagrams: 0,
            rx_bytes: 0,
            missing: 0,
            congested: 0,
        };
        e.on_report(at(100), &f);
        assert_eq!(e.estimate().srtt, None);
    }
}
