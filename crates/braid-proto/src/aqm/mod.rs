//! Congestion signals for traffic carried through the bond: CoDel on the channels'
//! queueing delay, signalled with ECN CE marks (or a drop where the packet is not
//! ECN-capable).
//!
//! # Why here, and why on the channels' delay
//!
//! A bond's bottleneck queues are not in braid: they are in the modems, routers and
//! shapers along each channel. A TCP flow striped over the channels fills them until
//! they overflow, and with in-bond repair (`seq` mode's NAKs) those overflow drops are
//! hidden from it too, so it never backs off (measured: `docs/lab.md`). What braid can
//! see is how long each channel's packets queue: every marker carries the sender's
//! clock (`MarkerConfig::timestamps`), and the receiver's arrival time minus that
//! stamp is the one-way delay plus an unknown but constant clock offset. Its minimum
//! over the last seconds is the channel's base delay, and the excess over that minimum
//! is the queue standing in the channel right now, whatever the offset.
//!
//! The bond's queueing delay is the largest over the channels (a striped flow is held
//! back by its most loaded channel). [`Codel`] decides from it, at each packet the
//! receiver delivers, whether that packet carries a congestion signal: an ECN-capable
//! IP packet is marked CE ([`ecn::mark_ce`]), any other IP packet is dropped, and a
//! payload that is not IP passes untouched (counted). The inner TCP then backs off
//! before the channels' queues overflow, and what the channels lose at random can be
//! repaired inside the bond without hiding congestion: repair what the links lose,
//! signal what the bond cannot carry.
//!
//! **Losses that are congestion.** A tail-drop bottleneck with a short buffer can
//! overflow before CoDel's first interval is over (TCP's slow start doubles its rate
//! every round trip). With in-bond repair on, such a drop would be hidden like a
//! random one. So losses the receiver finds on a channel (`errctl::link`) while that
//! channel's queueing delay is above target are taken as congestion: they are
//! repaired all the same, and, when they come as a burst (at least [`LOSS_BURST`]
//! datagrams within [`LOSS_BURST_SPAN`], as an overflowing tail-drop queue loses them),
//! the next packet delivered carries a signal ([`Aqm::on_loss`]; at most one per
//! interval, as TCP reacts once per round trip anyway). A loss on a channel with no
//! standing queue is random loss, repaired without a signal; so is a lone loss
//! behind a queue (a link that loses 1 % at random loses one now and then while TCP's
//! slow start has a queue standing for a moment: taken as congestion, such a loss
//! ended slow start at a fifth of the path, in the lab and in the simulated twins).
//!
//! This is the congestion half of issue 11's design: instead of pacing each channel at
//! an estimated rate (which lags and errs, and made the adaptive weights cost TCP two
//! thirds of its throughput), it lets the inner transport's own control loop do the
//! pacing, as any AQM router does.

mod codel;
pub mod ecn;

pub use codel::Codel;
pub use ecn::{mark_ce, signal, Ecn, Signalled};

use std::collections::VecDeque;

use crate::time::{Duration, Instant};

/// AQM settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AqmConfig {
    /// Queueing delay CoDel tolerates (RFC 8289: 5 ms).
    pub target: Duration,
    /// How long the delay must stay above target before the first signal, and the
    /// base spacing of signals (RFC 8289: 100 ms, a typical round trip).
    pub interval: Duration,
    /// A loss found on a channel whose queue stands is signalled too (at most once
    /// per interval), not only a standing queue: catches a short tail-drop buffer
    /// that overflows before CoDel's first interval is over. See the module docs for
    /// what it costs a single flow with a long round trip.
    pub loss_signal: bool,
    /// Scale `target` and `interval` to the bond's round trip ([`scaled`]): they are
    /// then the floor. Off when they were configured explicitly.
    pub scale_to_rtt: bool,
}

impl Default for AqmConfig {
    fn default() -> Self {
        AqmConfig {
            target: Duration::from_millis(5),
            interval: Duration::from_millis(100),
            loss_signal: true,
            scale_to_rtt: true,
        }
    }
}

/// CoDel's target and interval for a bond whose slowest channel has the round trip
/// `slowest` (its minimum): the interval twice that round trip, the target 10 % of the
/// interval (when the interval is scaled at all), neither below `floor`'s, the interval
/// at most [`MAX_INTERVAL`]. The interval so scaled spaces the signals; the first still
/// comes once a queue has stood for `floor.interval` (see [`Codel::set_params`]).
///
/// RFC 8289 sets the interval to the worst round trip of the flows through the queue
/// and the target to 5-10 % of it; its defaults (5 ms, 100 ms) assume round trips
/// around 100 ms. A flow through the bond has at least the bond's round trip, and the
/// hosts behind the tunnel add theirs. With the fixed 100 ms, one TCP flow over a bond
/// with a 60 ms link (its round trip 100-150 ms) took CoDel's second signal before its
/// first window cut had reached the queue, cut its window two or three times at the
/// end of slow start, and CUBIC crept back from well below the bond's capacity
/// (`docs/lab.md`). The first signal is not delayed: a slow start that overshoots
/// needs it as soon as RFC 8289 would give it. Bonds whose round trips stay under
/// 50 ms keep RFC 8289's values.
///
/// The target is the top of RFC 8289's range: one TCP flow through a bond is often the
/// only flow, and CUBIC's cut to 0.7 of its window leaves the path idle unless the
/// queue held about 0.4 of the bandwidth-delay product; at 5 % the lab's single flow
/// over 5/20/60 ms got 0.79-0.85 of the ceiling and 0.84-0.96 with 1 % loss, at 10 %
/// 0.85-0.86 and 0.94-0.97 (one run each, `docs/lab.md`).
pub fn scaled(floor: &AqmConfig, slowest: Duration) -> (Duration, Duration) {
    let interval = floor.interval.max(slowest + slowest).min(MAX_INTERVAL);
    if interval <= floor.interval {
        return (floor.target, floor.interval);
    }
    let target = floor
        .target
        .max(Duration::from_micros(interval.as_micros() / 10));
    (target, interval)
}

/// The longest interval scaling gives (a bond with a satellite link in it: signals
/// still come within a few seconds).
pub const MAX_INTERVAL: Duration = Duration::from_secs(1);

/// How long the base (minimum) one-way delay is remembered.
const BASE_WINDOW_BUCKETS: usize = 10;
const BUCKET: Duration = Duration::from_secs(1);

/// One channel's one-way delay samples: a windowed minimum (the base) and the latest
/// queueing delay above it.
#[derive(Clone, Debug, Default)]
struct Owd {
    /// Minimum raw delay per one-second bucket, newest last: (bucket start, min).
    mins: VecDeque<(Instant, i64)>,
    /// Bytes received per [`LOAD_BIN`], newest last: (bin start, bytes).
    load: VecDeque<(Instant, u64)>,
    /// The bins of `load` that are the largest of every bin from them on, oldest (and
    /// largest) first: the fullest bin of any window that ends now is the first of
    /// these inside it. [`Owd::loaded`] runs for every packet delivered; a scan of the
    /// 100 bins was 1.4 % of the tunnel's CPU samples at 5 Gbit/s.
    peaks: VecDeque<(Instant, u64)>,
    /// Losses found behind a standing queue within the last [`LOSS_BURST_SPAN`]:
    /// (when, how many).
    losses: VecDeque<(Instant, u64)>,
    /// The last few queueing delays, µs, newest last.
    recent: VecDeque<u64>,
    /// The queue now: when the latest sample came, and the smallest of
    /// [`Owd::recent`] (a queue that stands shows in each; one marker held up on its
    /// way, by a late scheduler or a jittery link, does not make one).
    last: Option<(Instant, u64)>,
}

/// Samples whose smallest is the channel's queueing delay ([`Owd::recent`]). Markers
/// come every 5 ms while data flows (every heartbeat, 50 ms, when idle), so a standing
/// queue is seen 10 ms later than from the latest alone. In the lab a single late
/// marker (the machine's scheduler held a packet 15-50 ms) counted as a queue for the
/// 50 ms until the next heartbeat's, and CoDel, taking the largest over the channels,
/// marked an idle TCP flow down to under 1 Mbit/s.
const RECENT: usize = 3;

/// Losses behind a standing queue are signalled when at least this many are found on
/// one channel within [`LOSS_BURST_SPAN`]: a tail-drop queue that overflows loses
/// many datagrams in a row (at twice a 100 Mbit/s link's rate, half of 80 in 10 ms),
/// random loss of a few percent almost never four in 10 ms.
pub const LOSS_BURST: u64 = 4;
/// See [`LOSS_BURST`].
pub const LOSS_BURST_SPAN: Duration = Duration::from_millis(10);

/// The channel's load is counted in bins of this length...
const LOAD_BIN: Duration = Duration::from_millis(100);
/// ...over this long.
const LOAD_WINDOW: Duration = Duration::from_secs(10);
/// A channel's queueing delay counts only while the channel carries at least this
/// share of the most it carried in a bin over the last [`LOAD_WINDOW`].
///
/// A queue the bond's own traffic builds needs that traffic: once the inner TCP has
/// backed off to a fraction of what the channel carried, a one-way delay that stays
/// above the base is not a queue the AQM can drain by signalling (a jittery link, a
/// late scheduler, someone else's queue on the path), and CoDel, which signals at a
/// growing rate while it lasts, would take the flow down to nothing. In the lab,
/// while the machine's scheduler ran a millisecond late on average, CoDel marked a
/// TCP flow from 60 Mbit/s down to a few kbit/s (102 marks in 15 s). Below half its
/// peak load a channel says nothing; the flow grows back to where its own queue
/// would show.
const LOAD_SHARE: f64 = 0.5;

impl Owd {
    /// `bytes` arrived on the channel at `now`.
    fn carried(&mut self, now: Instant, bytes: u64) {
        let bin = match self.load.back_mut() {
            Some((start, b)) if now.saturating_since(*start) < LOAD_BIN => {
                *b += bytes;
                // The current bin is the newest of `peaks`: it leaves to come back.
                self.peaks.pop_back();
                (*start, *b)
            }
            _ => {
                self.load.push_back((now, bytes));
                self.forget_load(now);
                (now, bytes)
            }
        };
        while self.peaks.back().is_some_and(|&(_, b)| b <= bin.1) {
            self.peaks.pop_back();
        }
        self.peaks.push_back(bin);
    }

    /// Drop the bins that started more than [`LOAD_WINDOW`] before `now`.
    fn forget_load(&mut self, now: Instant) {
        while self
            .load
            .front()
            .is_some_and(|(start, _)| now.saturating_since(*start) > LOAD_WINDOW)
        {
            self.load.pop_front();
        }
        while self
            .peaks
            .front()
            .is_some_and(|(start, _)| now.saturating_since(*start) > LOAD_WINDOW)
        {
            self.peaks.pop_front();
        }
    }

    /// The fullest bin of the [`LOAD_WINDOW`] that ends at `now` (0 if none).
    fn peak(&self, now: Instant) -> u64 {
        self.peaks
            .iter()
            .find(|(start, _)| now.saturating_since(*start) <= LOAD_WINDOW)
            .map_or(0, |&(_, b)| b)
    }

    /// Whether the channel is loaded at `now`: the last whole bin (or the current
    /// one, once it alone reaches it) carried at least [`LOAD_SHARE`] of the fullest
    /// bin of the last [`LOAD_WINDOW`]. Without any count ([`Aqm::on_bytes`] never
    /// called), every channel is.
    fn loaded(&self, now: Instant) -> bool {
        if self.load.is_empty() {
            return true;
        }
        let need = (self.peak(now) as f64 * LOAD_SHARE) as u64;
        let mut bins = self.load.iter().rev();
        match bins.next() {
            // The current bin, still filling.
            Some((start, b)) if now.saturating_since(*start) < LOAD_BIN => {
                *b >= need
                    || bins.next().is_some_and(|(s, b)| {
                        start.saturating_since(*s) <= LOAD_BIN + LOAD_BIN && *b >= need
                    })
            }
            // The last bin is over, and nothing came since: loaded if it was, and if
            // it ended just now.
            Some((start, b)) => now.saturating_since(*start) < LOAD_BIN + LOAD_BIN && *b >= need,
            None => false,
        }
    }

    fn sample(&mut self, now: Instant, raw: i64) -> u64 {
        match self.mins.back_mut() {
            Some((start, m)) if now.saturating_since(*start) < BUCKET => *m = (*m).min(raw),
            _ => {
                self.mins.push_back((now, raw));
                while self.mins.len() > BASE_WINDOW_BUCKETS {
                    self.mins.pop_front();
                }
            }
        }
        let base = self.mins.iter().map(|(_, m)| *m).min().unwrap_or(raw);
        let q = (raw - base).max(0) as u64;
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(q);
        let standing = self.recent.iter().copied().min().unwrap_or(q);
        self.last = Some((now, standing));
        standing
    }
}

/// AQM counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AqmStats {
    /// Packets marked CE.
    pub ce_marks: u64,
    /// Packets dropped as a congestion signal (IP, not ECN-capable).
    pub drops: u64,
    /// Signals not given because the packet was not IP.
    pub not_ip: u64,
    /// Signals not given because the packet was a small one that is not ECN-capable
    /// ([`ecn::SPARE_BELOW`]: a SYN, a pure ACK).
    pub spared: u64,
    /// Timestamped markers seen.
    pub samples: u64,
    /// Losses taken as congestion (found while their channel's queue stood above
    /// target), each signalled on the next packet delivered.
    pub loss_signals: u64,
    /// Latest queueing delay per channel, µs (`None`: no recent sample).
    pub queue_delay_us: Vec<Option<u64>>,
}

/// What to do with a packet about to be delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Deliver it (perhaps now marked CE).
    Deliver,
    /// Drop it: the congestion signal for a packet that cannot be marked.
    Drop,
}

/// The receiver's AQM over `n` channels.
#[derive(Clone, Debug)]
pub struct Aqm {
    /// The settings in force (`target` and `interval` scaled, see [`Aqm::scale`]).
    cfg: AqmConfig,
    /// The settings as configured.
    floor: AqmConfig,
    owd: Vec<Owd>,
    codel: Codel,
    /// A congestion loss was seen: signal on the next packet delivered.
    pending: bool,
    last_loss_signal: Option<Instant>,
    stats: AqmStats,
}

impl Aqm {
    /// AQM for `n` channels.
    pub fn new(cfg: AqmConfig, n: usize) -> Aqm {
        Aqm {
            cfg,
            floor: cfg,
            owd: vec![Owd::default(); n],
            codel: Codel::new(cfg.target, cfg.interval),
            pending: false,
            last_loss_signal: None,
            stats: AqmStats {
                queue_delay_us: vec![None; n],
                ..AqmStats::default()
            },
        }
    }

    /// Scale CoDel to the bond's round trip ([`scaled`]): `slowest` is the slowest
    /// minimum round trip among the channels we receive on. Nothing changes when the
    /// target and interval were configured explicitly.
    pub fn scale(&mut self, slowest: Duration) {
        if self.floor.scale_to_rtt {
            let (target, interval) = scaled(&self.floor, slowest);
            self.cfg.target = target;
            self.cfg.interval = interval;
            self.codel.set_params(target, self.floor.interval, interval);
        }
    }

    /// The peer started a new run: its stamps now count from another origin, so every
    /// delay learnt from the old run is forgotten (else, for up to the base window's
    /// 10 s, the difference between the two origins reads as a standing queue and
    /// CoDel drops the new run's packets), and with it whatever CoDel was doing. The
    /// counters stay.
    pub fn peer_restarted(&mut self) {
        for o in &mut self.owd {
            *o = Owd::default();
        }
        let mut codel = Codel::new(self.cfg.target, self.cfg.interval);
        codel.set_params(self.cfg.target, self.floor.interval, self.cfg.interval);
        self.codel = codel;
        self.pending = false;
        self.last_loss_signal = None;
    }

    /// A marker stamped `stamp_us` by the sender's clock arrived on `channel` at `now`.
    pub fn on_stamp(&mut self, now: Instant, channel: usize, stamp_us: u64) {
        let Some(o) = self.owd.get_mut(channel) else {
            return;
        };
        self.stats.samples += 1;
        let raw = now.as_micros() as i64 - stamp_us as i64;
        o.sample(now, raw);
    }

    /// `bytes` arrived on `channel` at `now` (every datagram the channel brought): how
    /// loaded each channel is ([`LOAD_SHARE`]).
    pub fn on_bytes(&mut self, now: Instant, channel: usize, bytes: usize) {
        if let Some(o) = self.owd.get_mut(channel) {
            o.carried(now, bytes as u64);
        }
    }

    /// The bond's queueing delay at `now`: the largest among loaded channels
    /// ([`LOAD_SHARE`]) with a sample in the last interval (a channel that stopped
    /// sending markers says nothing).
    pub fn queue_delay(&self, now: Instant) -> Duration {
        let fresh = self.cfg.interval;
        // Per packet delivered: the load (a scan of the bins) is looked at only for a
        // channel that shows a queue at all.
        let us = self
            .owd
            .iter()
            .filter_map(|o| {
                o.last
                    .filter(|&(at, q)| q > 0 && now.saturating_since(at) <= fresh)
                    .filter(|_| o.loaded(now))
            })
            .map(|(_, q)| q)
            .max()
            .unwrap_or(0);
        Duration::from_micros(us)
    }

    /// `count` datagrams sent on `channel` were found lost at `now`. If the channel's
    /// queue stands above target, that is congestion, and a burst of it ([`LOSS_BURST`])
    /// is signalled on the next packet delivered (at most one such signal per
    /// interval). Returns whether the losses were taken for congestion.
    pub fn on_loss(&mut self, now: Instant, channel: usize, count: u64) -> bool {
        let interval = self.cfg.interval;
        let target = self.cfg.target;
        let Some(o) = self.owd.get_mut(channel) else {
            return false;
        };
        let queued = o.loaded(now)
            && o.last.is_some_and(|(at, q)| {
                now.saturating_since(at) <= interval && Duration::from_micros(q) >= target
            });
        if !queued {
            return false;
        }
        o.losses.push_back((now, count));
        while o
            .losses
            .front()
            .is_some_and(|(at, _)| now.saturating_since(*at) > LOSS_BURST_SPAN)
        {
            o.losses.pop_front();
        }
        let burst = o.losses.iter().map(|(_, k)| k).sum::<u64>() >= LOSS_BURST;
        let spaced = self
            .last_loss_signal
            .is_none_or(|t| now.saturating_since(t) >= self.cfg.interval);
        if burst && spaced && self.cfg.loss_signal {
            self.pending = true;
            self.last_loss_signal = Some(now);
            self.stats.loss_signals += 1;
        }
        queued
    }

    /// `p` is about to be delivered at `now`: mark it CE if CoDel says so (in place),
    /// or tell the caller to drop it.
    pub fn on_deliver(&mut self, now: Instant, p: &mut [u8]) -> Verdict {
        if self.signals(now) {
            self.signal(p)
        } else {
            Verdict::Deliver
        }
    }

    /// A packet is about to be delivered at `now`: whether CoDel signals congestion on
    /// it ([`Aqm::signal`] then marks or drops it). Most packets are passed untouched,
    /// so the caller need not make them writable first.
    pub fn signals(&mut self, now: Instant) -> bool {
        let delay = self.queue_delay(now);
        let codel = self.codel.on_dequeue(now, delay);
        if !codel && !std::mem::take(&mut self.pending) {
            return false;
        }
        self.pending = false;
        true
    }

    /// Signal congestion on `p`, which [`Aqm::signals`] chose: marked CE in place if
    /// it is ECN-capable, else dropped.
    pub fn signal(&mut self, p: &mut [u8]) -> Verdict {
        match ecn::signal(p) {
            Signalled::Marked => {
                self.stats.ce_marks += 1;
                Verdict::Deliver
            }
            Signalled::Spared => {
                self.stats.spared += 1;
                Verdict::Deliver
            }
            Signalled::Dropped => {
                self.stats.drops += 1;
                Verdict::Drop
            }
            Signalled::NotIp => {
                self.stats.not_ip += 1;
                Verdict::Deliver
            }
        }
    }

    /// Counters, with each channel's latest queueing delay at `now`.
    pub fn stats(&self, now: Instant) -> AqmStats {
        let mut s = self.stats.clone();
        s.queue_delay_us = self
            .owd
            .iter()
            .map(|o| {
                o.last
                    .filter(|(at, _)| now.saturating_since(*at) <= self.cfg.interval)
                    .map(|(_, q)| q)
            })
            .collect();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(x: u64) -> Instant {
        Instant::from_micros(x * 1000)
    }

    /// A full-size IPv4 packet, ECT(0).
    fn ect_packet() -> Vec<u8> {
        let mut p = vec![0u8; 1400];
        p[0] = 0x45;
        p[1] = 0x02;
        p
    }

    #[test]
    fn clock_offset_does_not_matter_only_the_excess() {
        let mut a = Aqm::new(AqmConfig::default(), 2);
        // Sender's clock 1 hour ahead; base delays 5 and 60 ms.
        let off = 3_600_000_000u64;
        for t in (0..200).step_by(5) {
            a.on_stamp(ms(t + 5), 0, t * 1000 + off);
            a.on_stamp(ms(t + 60), 1, t * 1000 + off);
        }
        assert_eq!(a.queue_delay(ms(260)), Duration::ZERO);
        // Channel 1 now queues 30 ms: one late marker is not a queue, three are.
        a.on_stamp(ms(290 + 90), 1, 290 * 1000 + off);
        assert_eq!(a.queue_delay(ms(380)), Duration::ZERO);
        a.on_stamp(ms(295 + 90), 1, 295 * 1000 + off);
        a.on_stamp(ms(300 + 90), 1, 300 * 1000 + off);
        assert_eq!(a.queue_delay(ms(390)), Duration::from_millis(30));
        assert_eq!(a.stats(ms(390)).queue_delay_us, vec![None, Some(30_000)]);
    }

    /// A restarted peer's stamps count from a new origin: 5 s less for the same
    /// moment, so each sample reads 5 s more than the old run's base.
    #[test]
    fn a_restarted_peers_new_clock_is_not_a_queue() {
        let run = |forget: bool| {
            let mut a = Aqm::new(AqmConfig::default(), 1);
            for t in (0..2000).step_by(5) {
                a.on_bytes(ms(t), 0, 1400);
                a.on_stamp(ms(t + 10), 0, t * 1000 + 5_000_000);
            }
            if forget {
                a.peer_restarted();
            }
            let mut dropped = 0;
            for t in (2000..3000).step_by(5) {
                a.on_bytes(ms(t), 0, 1400);
                a.on_stamp(ms(t + 10), 0, t * 1000);
                let mut p = ect_packet();
                p[1] = 0; // not ECT: a signal is a drop
                if a.on_deliver(ms(t + 10), &mut p) == Verdict::Drop {
                    dropped += 1;
                }
            }
            (a.queue_delay(ms(3005)), dropped)
        };
        assert_eq!(run(true), (Duration::ZERO, 0));
        // The old run's base kept: 5 s of "queue", and drops.
        let (queue, dropped) = run(false);
        assert!(
            queue >= Duration::from_secs(4) && dropped > 0,
            "{queue:?} {dropped}"
        );
    }

    #[test]
    fn standing_queue_marks_ect_and_drops_not_ect() {
        let mut a = Aqm::new(AqmConfig::default(), 1);
        a.on_stamp(ms(40), 0, 30_000); // base 10 ms
        let mut marks = 0;
        let mut drops = 0;
        for t in 41..600u64 {
            // 20 ms of queue from now on, sampled every ms.
            a.on_stamp(ms(t), 0, (t - 30) * 1000);
            let mut p = ect_packet();
            if t % 2 == 0 {
                p[1] = 0; // not ECT
            }
            match a.on_deliver(ms(t), &mut p) {
                Verdict::Drop => {
                    assert_eq!(p[1] & 3, 0);
                    drops += 1
                }
                Verdict::Deliver if p[1] & 3 == 3 => marks += 1,
                Verdict::Deliver => {}
            }
        }
        assert!(marks >= 2 && drops >= 2, "{marks} + {drops}");
        assert_eq!(a.stats(ms(600)).ce_marks, marks);
        assert_eq!(a.stats(ms(600)).drops, drops);
    }

    #[test]
    fn scaling_follows_the_slowest_round_trip_within_bounds() {
        let d = AqmConfig::default();
        let ms = Duration::from_millis;
        // Short bonds keep RFC 8289's values.
        assert_eq!(scaled(&d, ms(10)), (ms(5), ms(100)));
        assert_eq!(scaled(&d, ms(50)), (ms(5), ms(100)));
        // 5/20/60 ms one way: the 60 ms link's round trip is 120 ms.
        assert_eq!(scaled(&d, ms(120)), (ms(24), ms(240)));
        // A satellite link: at most a second.
        assert_eq!(scaled(&d, ms(700)), (ms(100), ms(1000)));
        // A configured floor above the scaled values wins.
        let f = AqmConfig {
            target: ms(20),
            interval: ms(300),
            ..d
        };
        assert_eq!(scaled(&f, ms(120)), (ms(20), ms(300)));
    }

    /// 10 ms of standing queue on a channel (base 10 ms), a packet a millisecond from
    /// 41 to 600 ms: the CE marks.
    fn marks_of_a_10ms_queue(a: &mut Aqm) -> u64 {
        a.on_stamp(ms(40), 0, 30_000);
        for t in 41..600u64 {
            a.on_stamp(ms(t), 0, (t - 20) * 1000);
            let mut p = ect_packet();
            a.on_deliver(ms(t), &mut p);
        }
        a.stats(ms(600)).ce_marks
    }

    #[test]
    fn a_long_bond_tolerates_a_queue_a_short_one_signals() {
        // RFC 8289's 5 ms: a 10 ms queue is signalled.
        let mut short = Aqm::new(AqmConfig::default(), 1);
        short.scale(Duration::from_millis(10));
        assert!(marks_of_a_10ms_queue(&mut short) >= 2);
        // A bond with a 120 ms round trip: the target is 24 ms.
        let mut long = Aqm::new(AqmConfig::default(), 1);
        long.scale(Duration::from_millis(120));
        assert_eq!(marks_of_a_10ms_queue(&mut long), 0);
        // Unless the target was configured: then it is used as it is.
        let mut fixed = Aqm::new(
            AqmConfig {
                scale_to_rtt: false,
                ..AqmConfig::default()
            },
            1,
        );
        fixed.scale(Duration::from_millis(120));
        assert!(marks_of_a_10ms_queue(&mut fixed) >= 2);
    }

    /// One second of 1 500 bytes a millisecond (12 Mbit/s) on channel 0, no queue.
    fn loaded_second() -> Aqm {
        let mut a = Aqm::new(AqmConfig::default(), 1);
        a.on_stamp(ms(0), 0, 0);
        for t in 1..1000u64 {
            a.on_bytes(ms(t), 0, 1500);
            a.on_stamp(ms(t), 0, t * 1000);
        }
        a
    }

    /// From `from` to `to` ms: 1 500 bytes every `every` ms on channel 0, its one-way
    /// delay 20 ms above the base, a packet delivered each ms; the CE marks from
    /// `count_from` on.
    fn queued(a: &mut Aqm, from: u64, to: u64, every: u64, count_from: u64) -> u32 {
        let mut signals = 0;
        for t in from..to {
            if t % every == 0 {
                a.on_bytes(ms(t), 0, 1500);
            }
            a.on_stamp(ms(t), 0, (t - 20) * 1000);
            let mut p = ect_packet();
            a.on_deliver(ms(t), &mut p);
            if t >= count_from {
                signals += u32::from(p[1] & 3 == 3);
            }
        }
        signals
    }

    #[test]
    fn a_delay_that_outlasts_the_load_is_not_a_queue() {
        let mut a = loaded_second();
        // The flow backs off to a tenth while the one-way delay stays 20 ms up (a
        // jittery path, not our queue): once the last full bin is past, no signal,
        // however long it lasts.
        assert_eq!(queued(&mut a, 1000, 3000, 10, 1200), 0);
        assert!(!a.on_loss(ms(3000), 0, 10));
        // Back at full load with the delay still up: a standing queue, signalled.
        assert!(queued(&mut a, 3000, 3500, 1, 3000) > 0);
    }

    #[test]
    fn an_old_peak_load_is_forgotten() {
        let mut a = loaded_second();
        // Long after, a flow at a fifth of that with a standing queue: after the
        // window the old peak no longer silences it.
        assert!(queued(&mut a, 12_000, 13_000, 5, 12_000) > 0);
    }

    #[test]
    fn small_packets_that_cannot_be_marked_are_not_dropped() {
        let mut a = Aqm::new(AqmConfig::default(), 1);
        a.on_stamp(ms(40), 0, 30_000);
        let (mut spared, mut dropped) = (0, 0);
        for t in 41..600u64 {
            a.on_stamp(ms(t), 0, (t - 30) * 1000);
            // A pure ACK without ECN: 40 bytes of IPv4 and TCP headers.
            let mut ack = vec![0u8; 40];
            ack[0] = 0x45;
            if a.on_deliver(ms(t), &mut ack) == Verdict::Drop {
                dropped += 1;
            }
            assert_eq!(ack[1] & 3, 0, "not marked either");
            spared = a.stats(ms(t)).spared;
        }
        assert_eq!(dropped, 0);
        assert!(
            spared >= 5,
            "the queue stood: CoDel signalled {spared} times"
        );
        // A full-size packet that cannot be marked is still dropped.
        let mut big = ect_packet();
        big[1] = 0;
        a.on_stamp(ms(600), 0, 570_000);
        let mut drops = 0;
        for t in 600..700u64 {
            a.on_stamp(ms(t), 0, (t - 30) * 1000);
            let mut p = big.clone();
            drops += u32::from(a.on_deliver(ms(t), &mut p) == Verdict::Drop);
        }
        assert!(drops > 0);
    }

    #[test]
    fn no_queue_no_signal_and_stale_channels_are_ignored() {
        let mut a = Aqm::new(AqmConfig::default(), 2);
        a.on_stamp(ms(0), 0, 0);
        a.on_stamp(ms(0), 1, 0);
        a.on_stamp(ms(100), 1, 50_000); // 50 ms of queue on channel 1 ...
                                        // ... but it says nothing after an interval of silence.
        assert_eq!(a.queue_delay(ms(201)), Duration::ZERO);
        for t in 0..1000 {
            a.on_stamp(ms(t), 0, t * 1000);
            let mut p = ect_packet();
            assert_eq!(a.on_deliver(ms(t), &mut p), Verdict::Deliver);
            if t > 200 {
                assert_eq!(p[1], 0x02);
            }
        }
    }

    #[test]
    fn a_loss_is_congestion_only_while_its_channel_queues() {
        let mut a = Aqm::new(AqmConfig::default(), 2);
        a.on_stamp(ms(0), 0, 0);
        a.on_stamp(ms(0), 1, 0);
        for t in [40, 45, 50] {
            a.on_stamp(ms(t), 1, (t - 20) * 1000); // channel 1: 20 ms of queue
        }
        a.on_stamp(ms(50), 0, 50_000); // channel 0: none
                                       // A random loss on channel 0: no signal.
        assert!(!a.on_loss(ms(51), 0, 5));
        let mut p = ect_packet();
        assert_eq!(a.on_deliver(ms(51), &mut p), Verdict::Deliver);
        assert_eq!(p[1] & 3, 2);
        // Lone losses on channel 1 while it queues: congestion, but no burst (the
        // 12 ms between the first and the third is more than the span).
        assert!(a.on_loss(ms(40), 1, 1));
        assert!(a.on_loss(ms(46), 1, 2));
        assert!(a.on_loss(ms(52), 1, 1));
        a.on_deliver(ms(52), &mut p);
        assert_eq!(p[1] & 3, 2);
        // A burst (4 within 10 ms): the next packet is marked, once.
        assert!(a.on_loss(ms(52), 1, 1));
        assert!(
            a.on_loss(ms(53), 1, 4),
            "still congestion, but no second signal"
        );
        let mut p = ect_packet();
        a.on_deliver(ms(53), &mut p);
        assert_eq!(p[1] & 3, 3);
        let mut q = ect_packet();
        a.on_deliver(ms(54), &mut q);
        assert_eq!(q[1] & 3, 2);
        assert_eq!(a.stats(ms(54)).loss_signals, 1);
        assert_eq!(a.stats(ms(54)).ce_marks, 1);
    }

    /// The window's peak as [`Owd::loaded`] once found it: a scan of every bin.
    fn peak_by_scan(o: &Owd, now: Instant) -> u64 {
        o.load
            .iter()
            .filter(|(start, _)| now.saturating_since(*start) <= LOAD_WINDOW)
            .map(|(_, b)| *b)
            .max()
            .unwrap_or(0)
    }

    #[test]
    fn the_kept_peaks_give_what_a_scan_of_the_bins_gives() {
        // Bursts, pauses longer than the window, rising and falling loads: the answer
        // at every step (and between arrivals) is the scan's.
        let mut o = Owd::default();
        let mut x = 12345u64;
        let mut t = 0u64;
        let mut loaded = 0;
        for step in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            t += match x % 1000 {
                0 => 11_000_000,   // quiet for longer than the window
                1..=20 => 150_000, // a bin or more without data
                _ => x % 700,
            };
            let phase = (step / 20_000) % 4;
            let bytes = 100 + (x >> 20) % (500 * (phase + 1));
            o.carried(Instant::from_micros(t), bytes);
            for later in [0, 120_000, 250_000] {
                let now = Instant::from_micros(t + later);
                assert_eq!(o.peak(now), peak_by_scan(&o, now), "step {step}");
                loaded += usize::from(o.loaded(now));
            }
            assert!(o.peaks.len() <= o.load.len());
        }
        assert!(loaded > 1000, "the test saw loaded channels");
    }

    #[test]
    fn base_follows_a_route_change_within_the_window() {
        let mut o = Owd::default();
        o.sample(ms(0), 5_000);
        // The path gets 40 ms longer for good: seen as queue until the old minimum
        // leaves the window, then as the new base.
        let mut last = 0;
        for t in 1..=12_000u64 {
            last = o.sample(ms(t), 45_000);
        }
        assert_eq!(last, 0);
    }
}
