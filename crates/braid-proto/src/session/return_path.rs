//! The return path: a transmit direction that carries little more than the
//! acknowledgements of a flow the other way rides the channel with the shortest round
//! trip alone.
//!
//! A TCP flow through the bond sees one round trip: the data's way (in order, so as slow
//! as the slowest channel that carries any of it) plus its acknowledgements' way back.
//! Striped like data, the acknowledgements wait for the slowest channel too, so the
//! flow's round trip is twice the slowest channel's one-way delay: over 5, 20 and 60 ms
//! links, 150 ms instead of the 65 ms that acknowledgements on the 5 ms link give. The
//! longer round trip halves how fast slow start and CUBIC grow the window and doubles
//! the window the flow needs (`docs/lab.md`). The acknowledgements are about 3 % of
//! the data's bytes, so one channel carries them easily.
//!
//! **When.** Judged every heartbeat over the last second: the direction is a *return
//! direction* while we receive at least [`ReturnPathConfig::min_rx_bps`] of application
//! data, send some, and send at most [`ReturnPathConfig::ratio`]-th of what we receive.
//! Once that has held for [`ReturnPathConfig::hold`], the transmit set is cut to one
//! channel: among the channels that are up, active (not demoted), heard by the peer and
//! not lossy (at most 5 % missing in the peer's reports), the one with the smallest
//! round trip. The cut is an epoch switch ([`super::epoch`]), as demotion's is, so
//! every mode keeps its ordering and logical reception stays exact.
//!
//! **Back to all channels** at once when what waits to be sent (the transmit queue and
//! the streams' unsent bytes, judged whenever [`BACKLOG`] packets wait for the one
//! channel's pacer) would arrive sooner over the whole bond than over the one channel
//! at its rate. The bond must first switch epochs (its end crosses the slowest channel
//! and is acknowledged), and its slowest channel adds its delay. This is a flow of ours
//! that started, as a download right after an upload: a short one (2 MB over 100, 50
//! and 20 Mbit/s links 5, 20 and 60 ms long) is done sooner on the 5 ms link alone, a
//! longer one gets the bond within milliseconds (judged once a second over the last
//! second, below, it waited for a third of a second or more). Also back when we send
//! more than a quarter of what we receive (a flow of our own, or both ways), when what
//! we receive falls below half the minimum (the peer's flow ended: a flow we start next
//! starts over every channel), when the chosen channel goes down, is demoted or stops
//! being heard, or when it loses more than 5 % of our datagrams (too small for what we
//! send, or turned bad). After that the direction waits ten holds before it tries
//! again, so such a channel is not switched to and from every second. Its round trip is
//! no sign of congestion here: it carries the peer's flow the other way, and the queue
//! that flow builds at the channel's bottleneck is in the round trip too (in the lab it
//! cut the return path 50 ms after every start, and each switch cost the flow a round
//! trip's worth of acknowledgements held).
//!
//! An idle tunnel keeps every channel: the set only shrinks while the peer's flow is
//! there to be helped, and a flow of ours that starts after idle starts over the whole
//! bond (its slow start would otherwise leave at the first channel's rate when the set
//! grows and its round trip jumps).

use std::collections::VecDeque;

use super::feedback::Estimate;
use super::{bit, LinkState, Session};
use crate::time::{Duration, Instant};

/// Return-path settings ([`super::Config::return_path`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReturnPathConfig {
    /// We receive at least this many bit/s of application data.
    pub min_rx_bps: f64,
    /// And send at most `1/ratio` of it.
    pub ratio: f64,
    /// For this long before the set is cut (and the rates' window).
    pub hold: Duration,
}

impl Default for ReturnPathConfig {
    fn default() -> Self {
        ReturnPathConfig {
            min_rx_bps: 1e6,
            ratio: 8.0,
            hold: Duration::from_secs(1),
        }
    }
}

impl ReturnPathConfig {
    /// Check the settings.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.min_rx_bps.is_finite() && self.min_rx_bps > 0.0) {
            return Err("return_path: the minimum receive rate must be above zero".into());
        }
        if !(self.ratio.is_finite() && self.ratio >= 4.0) {
            return Err("return_path: the ratio must be at least 4".into());
        }
        if self.hold == Duration::ZERO {
            return Err("return_path: the hold must be above zero".into());
        }
        Ok(())
    }
}

/// A channel whose peer reports lose more than this is not chosen (and is left).
const MAX_LOSS: f64 = 0.05;
/// After congestion on the chosen channel, wait this many holds before trying again.
const BACKOFF_HOLDS: u64 = 10;
/// Packets waiting in the transmit queue that end the return path at once: a return
/// direction's few packets never wait for the pacer (TCP's pure acknowledgements and
/// the streams' control frames leave the stripe anyway); this many do only when we
/// send more than the one channel carries. As many as the streams' frames may queue
/// ([`super::streams::QUEUE_FRAMES`]), so that their backlog shows.
pub(super) const BACKLOG: usize = super::streams::QUEUE_FRAMES;

/// The return path's state.
#[derive(Clone, Debug, Default)]
pub(crate) struct ReturnPath {
    /// (time, application bytes sent, application bytes delivered), one per heartbeat,
    /// over the last `hold`.
    samples: VecDeque<(Instant, u64, u64)>,
    /// Since when the direction has looked like a return direction.
    light_since: Option<Instant>,
    /// The channel carrying the direction, while cut.
    pub on: Option<usize>,
    /// No new cut before this (after congestion).
    not_before: Option<Instant>,
    /// Times the set was cut to one channel.
    pub cuts: u64,
    /// When the backlog was last judged ([`Session::return_path_backlog`]).
    backlog_judged: Option<Instant>,
}

impl ReturnPath {
    /// A sample `(now, sent bytes, delivered bytes)` into the window, which keeps the
    /// newest sample at least `hold` old and those after it; then our send and receive
    /// rates over the window ([`ReturnPath::rates`]).
    fn sample(&mut self, sample: (Instant, u64, u64), hold: Duration) -> Option<(f64, f64)> {
        let now = sample.0;
        self.samples.push_back(sample);
        while self
            .samples
            .get(1)
            .is_some_and(|s| now.saturating_since(s.0) >= hold)
        {
            self.samples.pop_front();
        }
        self.rates(hold)
    }

    /// Our send and receive rates (bit/s) over the window, once it spans at least half
    /// of `hold`.
    fn rates(&self, hold: Duration) -> Option<(f64, f64)> {
        let (t0, s0, d0) = *self.samples.front()?;
        let (t1, s1, d1) = *self.samples.back()?;
        let span = t1.saturating_since(t0);
        if span.as_micros() * 2 < hold.as_micros() {
            return None;
        }
        let secs = span.as_micros() as f64 / 1e6;
        Some(((s1 - s0) as f64 * 8.0 / secs, (d1 - d0) as f64 * 8.0 / secs))
    }
}

impl Session {
    /// Application bytes delivered to us so far, every epoch.
    fn delivered_bytes(&self) -> u64 {
        self.rx.base_global.delivered_bytes + self.rx.reseq.stats().delivered_bytes
    }

    /// Can channel `c` carry the return direction?
    fn return_candidate(&self, c: usize, est: &Estimate) -> bool {
        self.chans[c].state == LinkState::Up
            && self.chans[c].demote.role == super::Role::Active
            && self.peer.mask & bit(c) != 0
            && est.rtt_min.is_some()
            && est.loss.is_none_or(|l| l <= MAX_LOSS)
    }

    /// One judgement (each heartbeat, before the set is chosen): with our send and
    /// receive rates over the window, the return path in force is kept or ended, or
    /// one is chosen.
    pub(super) fn return_path_step(&mut self, now: Instant) {
        let Some(cfg) = self.cfg.return_path else {
            return;
        };
        let sample = (now, self.counters.sent_bytes, self.delivered_bytes());
        let Some((tx, rx)) = self.return_path.sample(sample, cfg.hold) else {
            return;
        };
        let est: Vec<_> = self.chans.iter().map(|c| c.fb_tx.estimate()).collect();
        if let Some(c) = self.return_path.on {
            self.return_path_review(now, &cfg, c, &est, (tx, rx));
        } else {
            self.return_path_choose(now, &cfg, &est, (tx, rx));
        }
    }

    /// The return path is on channel `c` (estimates `est`, our send and receive rates
    /// `tx`, `rx`): it ends, with an event that says why, on congestion on it (and
    /// none is chosen again for a while), when `c` is no longer usable, when we send
    /// more than a quarter of what we receive, or when the peer's flow ended.
    fn return_path_review(
        &mut self,
        now: Instant,
        cfg: &ReturnPathConfig,
        c: usize,
        est: &[Estimate],
        (tx, rx): (f64, f64),
    ) {
        let congested = est[c].loss.is_some_and(|l| l > MAX_LOSS);
        let gone = !self.return_candidate(c, &est[c]) && !congested;
        let heavy = tx * 4.0 > rx;
        let ended = rx < cfg.min_rx_bps / 2.0;
        if !(congested || gone || heavy || ended) {
            return;
        }
        let rp = &mut self.return_path;
        rp.on = None;
        rp.light_since = None;
        if congested {
            rp.not_before = Some(now + Duration::from_micros(cfg.hold.as_micros() * BACKOFF_HOLDS));
        }
        let why = if congested {
            "congestion on it"
        } else if gone {
            "it is no longer usable"
        } else if heavy {
            "we send more than a quarter of what we receive"
        } else {
            "the peer's flow ended"
        };
        self.events.push_back(super::Event::ReturnPath {
            channel: None,
            reason: format!(
                "{why} (sending {:.2} Mbit/s, receiving {:.2} Mbit/s)",
                tx / 1e6,
                rx / 1e6
            ),
        });
    }

    /// No return path is in force (estimates `est`, our send and receive rates `tx`,
    /// `rx`): once our direction has been light for the hold, the usable channel with
    /// the smallest round trip becomes it, with an event.
    fn return_path_choose(
        &mut self,
        now: Instant,
        cfg: &ReturnPathConfig,
        est: &[Estimate],
        (tx, rx): (f64, f64),
    ) {
        let light = self.n >= 2 && rx >= cfg.min_rx_bps && tx > 0.0 && tx * cfg.ratio <= rx;
        let rp = &mut self.return_path;
        if !light || rp.not_before.is_some_and(|t| now < t) {
            rp.light_since = None;
            return;
        }
        let since = *rp.light_since.get_or_insert(now);
        if now.saturating_since(since) < cfg.hold {
            return;
        }
        let best = (0..self.n)
            .filter(|&c| self.return_candidate(c, &est[c]))
            .min_by_key(|&c| est[c].rtt_min);
        let Some(best) = best else {
            return;
        };
        let rp = &mut self.return_path;
        rp.on = Some(best);
        rp.cuts += 1;
        self.events.push_back(super::Event::ReturnPath {
            channel: Some(best),
            reason: format!(
                "sending {:.2} Mbit/s, receiving {:.2} Mbit/s; its round trip is {} ms",
                tx / 1e6,
                rx / 1e6,
                est[best].rtt_min.map_or(0, |r| r.as_micros() / 1000)
            ),
        });
    }

    /// A packet was queued for the pacer: with [`BACKLOG`] of them waiting while the
    /// return path is in force, what waits is judged (at most once a millisecond, and
    /// whenever the queue's length doubles, so that a burst is judged whole); if
    /// the bond would deliver it sooner than the one channel, the return path ends
    /// (with an event) and the set grows back now.
    pub(super) fn return_path_backlog(&mut self, now: Instant) {
        let Some(c) = self.return_path.on else {
            return;
        };
        let rp = &mut self.return_path;
        let waiting = self.tx.pending.len();
        let judged_lately = rp
            .backlog_judged
            .is_some_and(|t| now.saturating_since(t) < Duration::from_millis(1));
        if waiting < BACKLOG || (judged_lately && !waiting.is_power_of_two()) {
            return;
        }
        rp.backlog_judged = Some(now);
        let queued: usize = self.tx.pending.iter().map(|(p, _)| p.len()).sum();
        let bytes = queued as u64 + self.streams_unsent;
        if !self.bond_sooner(c, bytes) {
            return;
        }
        let rp = &mut self.return_path;
        rp.on = None;
        rp.light_since = None;
        self.events.push_back(super::Event::ReturnPath {
            channel: None,
            reason: format!(
                "{bytes} bytes wait to be sent: the bond delivers them sooner than one channel"
            ),
        });
        self.maybe_switch(now);
    }

    /// Would every usable channel deliver `bytes` sooner than channel `c` alone? Alone:
    /// at its pacing rate. The bond: first the epoch switch, which holds new data until
    /// the end of the old epoch has crossed the slowest channel and its ack came back
    /// (that one-way delay plus `c`'s: each is half the channel's smallest round trip);
    /// then the sum of the rates; and then how much longer the slowest channel's one-way
    /// delay is than `c`'s. Without pacing rates or round trips to go by: yes.
    fn bond_sooner(&self, c: usize, bytes: u64) -> bool {
        let usable = self.without_demoted(self.peer.mask & self.common_set() & !self.uplink_down);
        let rate = |i: usize| self.pacer.as_ref().and_then(|p| p.rate_bps(i));
        let delay = |i: usize| {
            self.chans[i]
                .fb_tx
                .estimate()
                .rtt_min
                .map(|r| r.as_micros() / 2)
        };
        let (Some(rc), Some(dc)) = (rate(c), delay(c)) else {
            return true;
        };
        let (mut sum, mut slowest) = (0.0, dc);
        for i in (0..self.n).filter(|&i| usable & bit(i) != 0) {
            let (Some(r), Some(d)) = (rate(i), delay(i)) else {
                return true;
            };
            sum += r;
            slowest = slowest.max(d);
        }
        let bits = bytes as f64 * 8.0;
        let switch_and_spread = ((slowest + dc) + (slowest - dc)) as f64 / 1e6;
        sum > rc && switch_and_spread + bits / sum < bits / rc
    }

    /// The transmit set to ask for, given the set without demoted channels: the return
    /// path's channel alone while it is in force and in the set.
    pub(super) fn with_return_path(&self, set: u64) -> u64 {
        match self.return_path.on {
            Some(c) if set & bit(c) != 0 => bit(c),
            _ => set,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::from_micros(ms * 1000)
    }

    #[test]
    fn rates_need_half_the_window() {
        let mut rp = ReturnPath::default();
        let hold = Duration::from_secs(1);
        rp.samples.push_back((at(0), 0, 0));
        rp.samples.push_back((at(400), 1000, 100_000));
        assert_eq!(rp.rates(hold), None);
        rp.samples.push_back((at(500), 1250, 125_000));
        let (tx, rx) = rp.rates(hold).unwrap();
        assert!((tx - 20_000.0).abs() < 1e-6, "{tx}");
        assert!((rx - 2_000_000.0).abs() < 1e-6, "{rx}");
    }

    #[test]
    fn settings_are_checked() {
        assert!(ReturnPathConfig::default().validate().is_ok());
        let bad = |f: fn(&mut ReturnPathConfig)| {
            let mut c = ReturnPathConfig::default();
            f(&mut c);
            c.validate().is_err()
        };
        assert!(bad(|c| c.min_rx_bps = 0.0));
        assert!(bad(|c| c.ratio = 2.0));
        assert!(bad(|c| c.hold = Duration::ZERO));
    }
}
