//! Pacing per channel at a known rate, with CoDel on the queue it builds at the bond's
//! ingress (issue 11, part 2).
//!
//! A channel's bottleneck (a modem, a shaper) usually has a short queue. One TCP flow
//! striped over the bond sends in bursts (slow start doubles its window every round
//! trip, and a window's worth of acknowledgements releases a window's worth of data at
//! once), and a burst striped onto a channel overflows that short queue long before the
//! bond is full. Repair hides the drops, the AQM then signals them, and the flow's slow
//! start ends at a fraction of the bond's capacity (the simulated twins:
//! `docs/reproducing.md`).
//!
//! With pacing, each channel is sent no faster than its rate (a token bucket with a
//! small burst), so its bottleneck queue stays short; what the channels cannot take yet
//! waits in the session's transmit queue, in order (the striper names the channel of
//! the next packet, and the packet waits for that channel's tokens, as it waits for
//! credit). That queue is where the bond's congestion now is, and it is managed like a
//! router's: CoDel on each packet's time in it marks ECN-capable IP packets CE (drops
//! other IP packets) as they leave it, so the inner TCP backs off before the queue
//! overflows.
//!
//! The rates are configured (the links' rates, as a bonding router's SQM is set up).
//! Every datagram on a channel, data, markers, control and repairs, uses its tokens, with
//! `overhead` bytes for the headers below (UDP/IP, link).

use crate::aqm::{signal, AqmConfig, Codel, Signalled};
use crate::time::{Duration, Instant};

/// Pacing settings.
#[derive(Clone, Debug, PartialEq)]
pub struct PacingConfig {
    /// Rate of each physical channel, bit/s on the wire (`overhead` included); 0: not
    /// paced.
    pub rates_bps: Vec<f64>,
    /// Tokens a channel may save up, as time at its rate (at least two datagrams).
    pub burst: Duration,
    /// Bytes below our datagram on the wire (UDP/IP, link framing).
    pub overhead: u32,
    /// Measure each channel's rate with a train of datagrams when it comes up
    /// (`session::probe`): a channel whose rate is 0 is paced at the measured rate
    /// from then on, one with a configured rate at the lower of the two.
    pub probe: bool,
    /// CoDel on the time packets wait in the transmit queue; `None`: no signals there.
    /// Its target and interval follow the bond's round trip unless `scale_to_rtt` is
    /// off ([`crate::aqm::scaled`]).
    pub codel: Option<AqmConfig>,
}

impl PacingConfig {
    /// Pace at these rates (bit/s), a 2 ms burst, 42 bytes of overhead (UDP/IPv4 and
    /// Ethernet), CoDel with RFC 8289's 5 ms and 100 ms scaled to the bond's round trip.
    pub fn new(rates_bps: Vec<f64>) -> PacingConfig {
        PacingConfig {
            rates_bps,
            burst: Duration::from_millis(2),
            overhead: 42,
            probe: false,
            codel: Some(AqmConfig::default()),
        }
    }

    /// Check against `n` channels.
    pub fn validate(&self, n: usize) -> Result<(), String> {
        if self.rates_bps.len() != n {
            return Err(format!(
                "pacing: {} rates for {n} channels",
                self.rates_bps.len()
            ));
        }
        if self.rates_bps.iter().any(|r| !r.is_finite() || *r < 0.0) {
            return Err("pacing: rates must be 0 (not paced) or above".into());
        }
        if self.burst == Duration::ZERO {
            return Err("pacing: the burst must be above zero".into());
        }
        Ok(())
    }
}

/// Counters of the pacer and its queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PacingStats {
    /// Times a packet had to wait for a channel's tokens.
    pub waits: u64,
    /// Packets marked CE for their time in the transmit queue.
    pub ce_marks: u64,
    /// Packets dropped for it (IP, not ECN-capable).
    pub drops: u64,
    /// Signals not given because the packet was a small one that is not ECN-capable
    /// (`aqm::ecn::SPARE_BELOW`: a SYN, a pure ACK).
    pub spared: u64,
}

/// One channel's token bucket.
#[derive(Clone, Debug)]
struct Bucket {
    /// Bytes per microsecond.
    rate: f64,
    /// Most tokens saved up, bytes.
    cap: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn refill(&mut self, now: Instant) {
        self.refill_to(now, self.cap);
    }

    /// Refill, saving up at most `cap` bytes.
    fn refill_to(&mut self, now: Instant, cap: f64) {
        self.tokens = self.tokens_at(now, cap);
        self.at = self.at.max(now);
    }

    /// The tokens at `now`, saving up at most `cap` bytes (or what it has already).
    fn tokens_at(&self, now: Instant, cap: f64) -> f64 {
        let dt = now.saturating_since(self.at).as_micros() as f64;
        (self.tokens + dt * self.rate).min(cap.max(self.tokens))
    }
}

/// The pacer of one session end.
pub(crate) struct Pacer {
    buckets: Vec<Option<Bucket>>,
    overhead: f64,
    /// Tokens a bucket may save up, as time at its rate (µs), and never less than
    /// `min_cap` bytes (two datagrams).
    burst_us: f64,
    min_cap: f64,
    codel: Option<Codel>,
    /// CoDel's floor (its configured target and interval), when it scales with the
    /// bond's round trip.
    scale_floor: Option<AqmConfig>,
    pub stats: PacingStats,
}

impl Pacer {
    pub fn new(cfg: &PacingConfig, max_datagram: u32, now: Instant) -> Pacer {
        let mut p = Pacer {
            buckets: Vec::new(),
            overhead: f64::from(cfg.overhead),
            burst_us: cfg.burst.as_micros() as f64,
            min_cap: 2.0 * f64::from(max_datagram + cfg.overhead),
            codel: cfg.codel.map(|c| Codel::new(c.target, c.interval)),
            scale_floor: cfg.codel.filter(|c| c.scale_to_rtt),
            stats: PacingStats::default(),
        };
        p.buckets = vec![None; cfg.rates_bps.len()];
        for (c, &r) in cfg.rates_bps.iter().enumerate() {
            p.start(now, c, r);
        }
        p
    }

    /// The most tokens a bucket of `rate` bytes/µs may save up.
    fn cap(&self, rate: f64) -> f64 {
        (rate * self.burst_us).max(self.min_cap)
    }

    /// Pace channel `c` at `bps` (bit/s on the wire) from `now`, whether it was paced
    /// or not (a measured rate, `session::probe`); it starts with a full burst.
    pub fn start(&mut self, now: Instant, c: usize, bps: f64) {
        if !(bps > 0.0 && bps.is_finite()) {
            return;
        }
        let Some(slot) = self.buckets.get_mut(c) else {
            return;
        };
        if slot.is_some() {
            self.set_rate(now, c, bps);
            return;
        }
        let rate = bps / 8e6;
        let cap = self.cap(rate);
        self.buckets[c] = Some(Bucket {
            rate,
            cap,
            tokens: cap,
            at: now,
        });
    }

    /// May a packet go on channel `c` at `now`, for a channel the stripe gives
    /// `quantum` bytes a round (0: not known)? A channel with tokens left may take one
    /// datagram whatever its size: the bucket goes below zero and refills first. While
    /// the stripe waits on the other channels, a channel saves up tokens for its whole
    /// quantum and a datagram, even beyond its burst. A round lasts the smallest
    /// quantum's time at the slowest channel's pace; with that longer than the burst
    /// (a quantum of 1445 bytes at 2.9 Mbit/s is 4 ms), every channel's tokens
    /// overflowed while it waited its turn, and each carried about half its pace.
    pub fn ready_in_round(&mut self, now: Instant, c: usize, quantum: usize) -> bool {
        let round = quantum as f64 + self.min_cap / 2.0;
        match self.buckets.get_mut(c).and_then(Option::as_mut) {
            None => true,
            Some(b) => {
                b.refill_to(now, b.cap.max(round));
                b.tokens >= 0.0
            }
        }
    }

    /// Channel `c`'s pacing rate (bit/s on the wire), if it is paced.
    pub fn rate_bps(&self, c: usize) -> Option<f64> {
        let b = self.buckets.get(c)?.as_ref()?;
        Some(b.rate * 8e6)
    }

    /// Pace channel `c` at `bps` (bit/s on the wire) from `now`: the tokens saved so
    /// far stay (up to the new cap). A channel that is not paced stays unpaced.
    pub fn set_rate(&mut self, now: Instant, c: usize, bps: f64) {
        if !(bps > 0.0 && bps.is_finite()) {
            return;
        }
        let rate = bps / 8e6;
        let cap = self.cap(rate);
        if let Some(b) = self.buckets.get_mut(c).and_then(Option::as_mut) {
            b.refill(now);
            b.rate = rate;
            b.cap = cap;
            b.tokens = b.tokens.min(cap);
        }
    }

    /// When channel `c` will be ready, if it is not.
    pub fn ready_at(&self, c: usize) -> Option<Instant> {
        let b = self.buckets.get(c)?.as_ref()?;
        if b.tokens >= 0.0 {
            return None;
        }
        let us = (-b.tokens / b.rate).ceil() as u64;
        Some(b.at + Duration::from_micros(us.max(1)))
    }

    /// How long after `now` a datagram of `len` bytes charged to channel `c` now would
    /// have left, at the channel's rate, behind the tokens it owes already: the wait a
    /// packet sent past the queue (a repair) puts on the channel. `None`: not paced.
    pub fn backlog_after(&self, now: Instant, c: usize, len: usize) -> Option<Duration> {
        let b = self.buckets.get(c)?.as_ref()?;
        let tokens = b.tokens_at(now, b.cap) - (len as f64 + self.overhead);
        let us = (-tokens / b.rate).max(0.0).ceil() as u64;
        Some(Duration::from_micros(us))
    }

    /// Scale CoDel to the bond's round trip: the slowest round trip (minimum) of the
    /// channels we stripe over is `slowest`.
    pub fn scale(&mut self, slowest: Duration) {
        if let (Some(codel), Some(floor)) = (self.codel.as_mut(), &self.scale_floor) {
            let (target, interval) = crate::aqm::scaled(floor, slowest);
            codel.set_params(target, floor.interval, interval);
        }
    }

    /// A datagram of `len` bytes went out on channel `c`.
    pub fn charge(&mut self, now: Instant, c: usize, len: usize) {
        if let Some(b) = self.buckets.get_mut(c).and_then(Option::as_mut) {
            b.refill(now);
            b.tokens -= len as f64 + self.overhead;
        }
    }

    /// A packet leaves the transmit queue at `now` after waiting since `queued`: does
    /// CoDel signal congestion on it? (Then [`Pacer::signal`] it.)
    pub fn on_dequeue(&mut self, now: Instant, queued: Instant) -> bool {
        self.codel
            .as_mut()
            .is_some_and(|c| c.on_dequeue(now, now.saturating_since(queued)))
    }

    /// Carry the congestion signal on `p`: marked CE in place, or `false` to drop it
    /// (an IP packet that is not ECN-capable).
    pub fn signal(&mut self, p: &mut [u8]) -> bool {
        match signal(p) {
            Signalled::Marked => {
                self.stats.ce_marks += 1;
                true
            }
            Signalled::Spared => {
                self.stats.spared += 1;
                true
            }
            Signalled::Dropped => {
                self.stats.drops += 1;
                false
            }
            Signalled::NotIp => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(x: u64) -> Instant {
        Instant::from_micros(x)
    }

    #[test]
    fn a_paced_channel_goes_at_its_rate_after_its_burst() {
        // 8 Mbit/s = 1 byte/µs; a 2 ms burst = 2000 bytes (above two 958-byte datagrams).
        let cfg = PacingConfig {
            overhead: 0,
            ..PacingConfig::new(vec![8e6, 0.0])
        };
        let mut p = Pacer::new(&cfg, 958, us(0));
        let mut sent = 0u64;
        let mut t = 0u64;
        while t <= 100_000 {
            if p.ready_in_round(us(t), 0, 0) {
                p.charge(us(t), 0, 1000);
                sent += 1000;
            }
            t += 10;
        }
        // 100 ms at 1 byte/µs, plus the burst, plus the one datagram that may overdraw.
        assert!((100_000..=103_000).contains(&sent), "{sent}");
        // Channel 1 is not paced.
        for _ in 0..1000 {
            assert!(p.ready_in_round(us(t), 1, 0));
            p.charge(us(t), 1, 1500);
        }
        assert_eq!(p.ready_at(1), None);
    }

    #[test]
    fn ready_at_is_when_the_tokens_are_back() {
        let cfg = PacingConfig {
            overhead: 0,
            ..PacingConfig::new(vec![8e6])
        };
        let mut p = Pacer::new(&cfg, 500, us(0));
        p.charge(us(0), 0, 5000); // 2000 - 5000 = -3000 bytes
        assert!(!p.ready_in_round(us(0), 0, 0));
        assert_eq!(p.ready_at(0), Some(us(3000)));
        assert!(!p.ready_in_round(us(2999), 0, 0));
        assert!(p.ready_in_round(us(3000), 0, 0));
    }

    #[test]
    fn a_channel_waiting_its_turn_saves_up_its_quantum() {
        // 8 Mbit/s = 1 byte/µs: a 2 ms burst is 2000 bytes (two 958-byte datagrams).
        let cfg = PacingConfig {
            overhead: 0,
            ..PacingConfig::new(vec![8e6])
        };
        let sendable = |quantum: usize| {
            let mut p = Pacer::new(&cfg, 958, us(0));
            // Spent, then 10 ms waiting for the other channels.
            p.charge(us(0), 0, 2000);
            let mut sent = 0;
            while p.ready_in_round(us(10_000), 0, quantum) {
                p.charge(us(10_000), 0, 500);
                sent += 500;
            }
            sent
        };
        // Without a quantum the burst caps what it saved: 2000 bytes and one more
        // datagram's overdraw.
        assert_eq!(sendable(0), 2500);
        // A 6000-byte quantum: that and a datagram (958), and the overdraw.
        assert_eq!(sendable(6000), 7000);
        // Never more than the 10 ms at its rate (and the overdraw).
        assert_eq!(sendable(50_000), 10_500);
    }

    #[test]
    fn the_backlog_is_the_debt_at_the_channels_rate() {
        let cfg = PacingConfig {
            overhead: 0,
            ..PacingConfig::new(vec![8e6, 0.0])
        };
        // 1 byte/µs, a 2 ms burst = 2000 bytes of tokens.
        let mut p = Pacer::new(&cfg, 500, us(0));
        assert_eq!(p.backlog_after(us(0), 0, 1500), Some(Duration::ZERO));
        assert_eq!(
            p.backlog_after(us(0), 0, 5000),
            Some(Duration::from_micros(3000))
        );
        p.charge(us(0), 0, 5000);
        // 3000 bytes owed, 1000 paid back by 1 ms: 2000 more and 1000 for the datagram.
        assert_eq!(
            p.backlog_after(us(1000), 0, 1000),
            Some(Duration::from_micros(3000))
        );
        assert_eq!(p.backlog_after(us(0), 1, 1500), None);
    }

    #[test]
    fn the_queue_marks_ect_packets_once_they_wait_too_long() {
        let mut p = Pacer::new(&PacingConfig::new(vec![8e6]), 1000, us(0));
        // A full-size packet (small ones that cannot be marked are never dropped).
        let mut pkt = vec![0u8; 1400];
        pkt[0] = 0x45;
        pkt[1] = 0x02; // ECT(0)
                       // A short wait: nothing.
        assert!(!p.on_dequeue(us(10_000), us(9_000)));
        // 20 ms of waiting for more than an interval: CE.
        let mut marked = false;
        for k in 0..300u64 {
            let now = us(20_000 + k * 1_000);
            let mut q = pkt.clone();
            if p.on_dequeue(now, us(k * 1_000)) {
                assert!(p.signal(&mut q));
            }
            marked |= q[1] & 0x03 == 0x03;
        }
        assert!(marked && p.stats.ce_marks > 0, "{:?}", p.stats);
        // Not ECN-capable: dropped while CoDel signals.
        let mut plain = pkt.clone();
        plain[1] = 0;
        let mut dropped = false;
        for k in 300..600u64 {
            let mut q = plain.clone();
            dropped |= p.on_dequeue(us(20_000 + k * 1_000), us(k * 1_000)) && !p.signal(&mut q);
        }
        assert!(dropped && p.stats.drops > 0);
    }

    #[test]
    fn settings_are_checked() {
        assert!(PacingConfig::new(vec![1e6, 2e6]).validate(2).is_ok());
        assert!(PacingConfig::new(vec![1e6]).validate(2).is_err());
        assert!(PacingConfig::new(vec![f64::NAN, 0.0]).validate(2).is_err());
        let mut c = PacingConfig::new(vec![1e6]);
        c.burst = Duration::ZERO;
        assert!(c.validate(1).is_err());
    }
}
