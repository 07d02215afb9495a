//! Bad links: a channel whose loss (or, optionally, delay) makes it a net cost to the
//! bond is demoted, carries only probes, and is promoted back when it recovers.
//!
//! **Demoted means out of the transmit set.** The sender takes a demoted channel out
//! of the channel set it stripes over, through the same epoch switch that takes a dead
//! channel out ([`super::epoch`]): the old epoch ends at a position both ends know, the
//! receiver drains it and starts a new resequencer over the rest. Logical reception
//! stays exact because the receiver's simulation of the sender never has to follow a
//! quantum of zero or a shrinking one mid-round; the set just changes at an epoch
//! boundary, as it does for failover. (A minimal quantum instead would keep one packet
//! per round on the bad channel, so every round would wait on it: the in-order delivery
//! of the whole bond would still ride on its losses and its delay.) The receive
//! direction is the peer's business: each end demotes in its own transmit direction,
//! from the peer's feedback, so no message changes and the peer needs no agreement
//! beyond the epoch switch it already handles.
//!
//! **Probes** keep flowing on a demoted channel: hellos and feedback go on every
//! configured channel every heartbeat (down ones too), sealed with the channel's
//! counter, so the peer keeps reporting what arrived and what is missing on it, and the
//! timestamp echo keeps its round trip measured ([`super::feedback`]).
//!
//! **When is a channel a net cost?** Judged every heartbeat, for a channel that is up:
//!
//! * *loss*: over the last `after` (1 s by default; the window is the "sustained" part),
//!   the peer found at least `loss` (20 % by default) of the channel's datagrams missing,
//!   counted from at least [`MIN_DATAGRAMS`] datagrams. That is well above what in-bond
//!   repair or TCP copes with cheaply (1–2 % random loss never comes near it), and it
//!   costs the bond more than the channel adds: every loss stalls in-order delivery for
//!   a repair or a resynchronization. Datagrams the peer found missing while the
//!   channel's queue stood above the AQM's target (reported apart in its feedback,
//!   with `aqm` and in-bond repair on) are congestion, not a bad link, and do not count:
//!   TCP's slow start overflowing a short buffer loses a fifth of a channel's datagrams
//!   for a moment, and took two healthy channels out of the bond in the lab, leaving
//!   the lossy one. Loss is congestion, not a bad link, also while the
//!   channel's round trip shows a standing queue (smoothed above the minimum by a
//!   quarter and 5 ms; the round trip is timed by the reports' arrival, so in-bond
//!   repair's holds do not count). With adaptive weights on, a lossy channel is judged only
//!   once the weights have cut its quantum to an eighth of the largest and it still
//!   loses: loss from a share too large for it is the weights' to correct, and they do;
//! * *delay* (off unless `rtt_ratio` is set): its minimum round trip stays above
//!   `rtt_ratio` times the fastest other active channel's (plus 5 ms) for `after`, while
//!   it carries less than a tenth of what the active channels deliver: in-order
//!   delivery then waits on it far longer than its share of the capacity is worth;
//! * *too slow for the stripe* (with adaptive pacing and measured rates, `pace =
//!   "auto"`): its pace stays under `1 / MAX_RATIO` of the fastest active channel's
//!   for `after` (`Adapt::thin` in `session::adapt`). The stripe gives no quantum under
//!   that share of the largest, so it would be given more than its pacer lets through
//!   and its queue at home would hold the whole bond to `MAX_RATIO` times its pace;
//! * *too far for what it carries* (the same condition of measured rates): its minimum
//!   round trip is over `FAR_RATIO` (2) times the largest of the other members' (and 5
//!   ms more) while its pace stays under `FAR_SHARE` (8 %) of theirs together, for
//!   `after` (`Adapt::far`). In-order delivery waits on the farthest channel, so every
//!   flow's round trip through the bond is its round trip: a flow whose window filled
//!   the bond without it fills a fraction with it, for a few percent more capacity.
//!   Unlike the *delay* criterion this is on by default and compares with the rest's
//!   farthest channel, not the nearest: a channel nearer than some other member never
//!   costs a round trip, however slow it is;
//! * and only while another channel the peer hears us on is active and clearly healthy
//!   (its own loss at most half of `loss`): a bond whose every channel is bad keeps
//!   them all (and the last channel is never taken away).
//!
//! **Promotion, with hysteresis.** A demoted channel is *probing* while its probes show
//! it healthy: loss over the window at most half of `loss` (and, with the delay
//! criterion, its minimum round trip at most three quarters of the demotion threshold).
//! After `promote_after` (3 s by default) of probing without a relapse it is active
//! again and rejoins the transmit set at the next epoch (one demoted for being too slow
//! or too far is first measured again, and rejoins only at a pace of at least twice
//! the stripe's least share and, if still that far, `FAR_REJOIN` (1.5) times
//! `FAR_SHARE` of the rest: see `fast_enough_again`); a relapse puts it back to
//! demoted and the clock starts over. A channel demoted again within ten promotion
//! periods of its promotion waits twice as long next time (up to eight times), so a
//! link that is bad on and off is not switched in and out every few seconds.
//!
//! If every other channel goes down, the demoted ones carry the traffic (a bad channel
//! beats none); they are still demoted and leave the set again when a healthy one
//! returns.

use std::collections::VecDeque;

use super::{bit, Event, LinkState, Session};
use crate::time::{Duration, Instant};

/// Datagrams a window must count before its loss ratio is believed.
pub const MIN_DATAGRAMS: u64 = 20;
/// With the delay criterion: a slow channel is a net cost only while it carries less
/// than this share of what the active channels deliver.
const SLOW_SHARE: f64 = 0.1;
/// With the delay criterion: the slack added to the fastest channel's round trip times
/// the ratio (so sub-millisecond LAN round trips do not count as "ten times slower").
const SLOW_SLACK: Duration = Duration::from_millis(5);
/// With adaptive weights: a lossy channel is demoted only once its quantum is at most
/// this fraction (1/8) of the largest.
const ADAPT_CUT: u64 = 8;
/// Largest multiple of `promote_after` a repeatedly demoted channel waits.
const MAX_BACKOFF: u32 = 8;
/// How long a channel out of the bond for being too slow waits for the measurement
/// it needs to rejoin (a train and its report; a train on a link of 100 kbit/s takes
/// about 6 s to cross).
const REMEASURE_WAIT: Duration = Duration::from_secs(10);

/// Bad-link demotion settings ([`super::Config::demote`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DemoteConfig {
    /// A channel losing at least this share of its datagrams over `after` is demoted
    /// (0 < loss < 1); it is healthy again at half of it.
    pub loss: f64,
    /// The window over which loss is judged, and how long a channel must be slow
    /// before it is demoted (at least two heartbeats).
    pub after: Duration,
    /// How long a demoted channel must look healthy before it is promoted back.
    pub promote_after: Duration,
    /// Delay criterion: a channel whose minimum round trip stays above this many times
    /// the fastest other active channel's (plus 5 ms), while it carries under a tenth of
    /// the bond, is demoted. 0: off (the default).
    pub rtt_ratio: f64,
}

impl Default for DemoteConfig {
    fn default() -> Self {
        DemoteConfig {
            loss: 0.2,
            after: Duration::from_secs(1),
            promote_after: Duration::from_secs(3),
            rtt_ratio: 0.0,
        }
    }
}

impl DemoteConfig {
    /// Check the settings against the heartbeat (the probes' period).
    pub fn validate(&self, heartbeat: Duration) -> Result<(), String> {
        if !(self.loss > 0.0 && self.loss < 1.0) {
            return Err(format!(
                "demote_loss must be above 0 and below 1 (a share of datagrams), not {}",
                self.loss
            ));
        }
        if self.after < heartbeat + heartbeat {
            return Err(format!(
                "demote_after ({} ms) must be at least twice the heartbeat ({} ms): the \
                 loss is judged from the peer's reports, one per heartbeat",
                self.after.as_micros() / 1000,
                heartbeat.as_micros() / 1000
            ));
        }
        if self.promote_after < heartbeat {
            return Err(format!(
                "promote_after ({} ms) must be at least the heartbeat ({} ms)",
                self.promote_after.as_micros() / 1000,
                heartbeat.as_micros() / 1000
            ));
        }
        if !(self.rtt_ratio == 0.0 || (self.rtt_ratio >= 1.5 && self.rtt_ratio <= 1000.0)) {
            return Err(format!(
                "demote_rtt_ratio must be 0 (off) or from 1.5 to 1000, not {}",
                self.rtt_ratio
            ));
        }
        Ok(())
    }
}

/// A channel's place in the bond (for a channel that is up; `braid status` shows
/// `down` or `wait` instead while liveness says so).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// In the transmit set (when the peer hears us on it).
    Active,
    /// A net cost: out of the transmit set, probes only.
    Demoted,
    /// Demoted, and its probes have looked healthy since
    /// [`ChannelInfo::role_since`](super::ChannelInfo::role_since): promoted after
    /// `promote_after`.
    Probing,
}

impl Role {
    /// Short name, as in `braid status`.
    pub fn name(self) -> &'static str {
        match self {
            Role::Active => "active",
            Role::Demoted => "demoted",
            Role::Probing => "probing",
        }
    }
}

/// One channel's demotion state.
#[derive(Clone, Debug)]
pub(super) struct ChanDemote {
    pub role: Role,
    /// When `role` last changed.
    pub since: Instant,
    /// Times demoted.
    pub demotions: u64,
    /// The peer's cumulative (received, missing, missing for congestion) counts at
    /// each judgement, covering the last window.
    samples: VecDeque<(Instant, u64, u64, u64)>,
    /// The latest loss over a whole window, if one was measured.
    pub window_loss: Option<f64>,
    slow_since: Option<Instant>,
    /// Since when adaptive pacing has held the channel too slow for the stripe (or too
    /// far for what it carries).
    thin_since: Option<Instant>,
    /// Out of the bond for being too slow for the stripe, or too far for what it
    /// carries: it rejoins only once measured again ([`super::probe`]) at a pace the
    /// stripe can give and worth its round trip.
    pub thin: bool,
    /// When the train asked for before it may rejoin went out (asked), and when its
    /// measurement came.
    asked_at: Option<Instant>,
    pub measured_at: Option<Instant>,
    promoted_at: Option<Instant>,
    backoff: u32,
}

impl ChanDemote {
    pub fn new(now: Instant) -> ChanDemote {
        ChanDemote {
            role: Role::Active,
            since: now,
            demotions: 0,
            samples: VecDeque::new(),
            window_loss: None,
            slow_since: None,
            thin_since: None,
            thin: false,
            asked_at: None,
            measured_at: None,
            promoted_at: None,
            backoff: 1,
        }
    }

    /// The channel's estimates start over (down, or back up): so does the window.
    pub fn restart_window(&mut self) {
        self.samples.clear();
        self.window_loss = None;
        self.slow_since = None;
        self.thin_since = None;
    }

    /// Record the peer's cumulative counts at `now` and return the loss over the last
    /// `window` that was not congestion: `None` until a whole window with enough
    /// datagrams is covered.
    fn measure(
        &mut self,
        now: Instant,
        (got, missing, congested): (u64, u64, u64),
        window: Duration,
    ) -> Option<f64> {
        if self
            .samples
            .back()
            .is_some_and(|&(_, g, m, k)| got < g || missing < m || congested < k)
        {
            // A new estimator (counts went back): the old samples mean nothing now.
            self.samples.clear();
        }
        self.samples.push_back((now, got, missing, congested));
        // Keep one sample at least `window` old: the window's start.
        while self.samples.len() >= 2 && now.saturating_since(self.samples[1].0) >= window {
            self.samples.pop_front();
        }
        let &(t0, g0, m0, k0) = self.samples.front()?;
        let loss = if now.saturating_since(t0) < window {
            None
        } else {
            let (dg, dm) = (got - g0, missing - m0);
            let dk = (congested - k0).min(dm);
            (dg + dm >= MIN_DATAGRAMS).then(|| (dm - dk) as f64 / (dg + dm) as f64)
        };
        self.window_loss = loss;
        loss
    }

    fn set_role(&mut self, role: Role, now: Instant) {
        if self.role != role {
            self.role = role;
            self.since = now;
        }
    }
}

impl Session {
    /// Channels out of the transmit set for being a net cost (demoted or probing).
    pub(super) fn demoted_mask(&self) -> u64 {
        self.chans
            .iter()
            .enumerate()
            .filter(|(_, c)| c.demote.role != Role::Active)
            .fold(0, |m, (i, _)| m | bit(i))
    }

    /// The transmit set to ask for, given the channels the peer hears us on: those
    /// less the demoted ones, unless that leaves none.
    pub(super) fn without_demoted(&self, heard: u64) -> u64 {
        let kept = heard & !self.demoted_mask();
        if kept == 0 {
            heard
        } else {
            kept
        }
    }

    /// One judgement of every channel (each heartbeat, before the set is chosen).
    pub(super) fn demote_step(&mut self, now: Instant) {
        let Some(cfg) = self.cfg.demote else {
            return;
        };
        let loss: Vec<Option<f64>> = (0..self.n)
            .map(|c| {
                let ch = &mut self.chans[c];
                let (got, missing) = ch.fb_tx.totals();
                let congested = ch.fb_tx.congested_total();
                ch.demote.measure(now, (got, missing, congested), cfg.after)
            })
            .collect();
        let est: Vec<_> = self.chans.iter().map(|c| c.fb_tx.estimate()).collect();
        let rtts: Vec<_> = est.iter().map(|e| e.rtt_min).collect();
        let cut = self.cut_by_weights();
        for (c, cut) in cut.into_iter().enumerate().take(self.n) {
            if self.chans[c].state != LinkState::Up {
                // Down or never heard: liveness has it; its role waits for its return.
                continue;
            }
            let slow = self.slower_than(c, &est, cfg.rtt_ratio);
            // Too slow for the stripe: judged only where a measurement can tell when
            // it is fast enough again (`pace = "auto"`, the default).
            let (thin, far) = match &self.adapt {
                Some(a) if self.probes.measures() => (
                    a.thin(c, &self.tx.members, 1.0),
                    a.far(c, &self.tx.members, &rtts, 1.0),
                ),
                _ => (None, None),
            };
            let j = Judged {
                loss: &loss,
                est: &est,
                rtts: &rtts,
                slow,
                thin,
                far,
            };
            match self.chans[c].demote.role {
                Role::Active => self.judge_active(c, now, &cfg, &j, cut),
                Role::Demoted | Role::Probing => self.judge_demoted(c, now, &cfg, &j),
            }
        }
    }

    /// With adaptive weights, a channel is judged on loss only once the weights have
    /// cut it to a small share and it still loses: loss from a share too large for it
    /// (congestion) is the weights' to correct, and they do. Per channel: judged on
    /// loss?
    fn cut_by_weights(&self) -> Vec<bool> {
        match &self.adapt {
            None => vec![true; self.n],
            Some(a) => {
                let top = self
                    .tx
                    .members
                    .iter()
                    .map(|&m| a.quanta[m])
                    .max()
                    .unwrap_or(0);
                a.quanta
                    .iter()
                    .map(|&q| u64::from(q) * ADAPT_CUT <= u64::from(top))
                    .collect()
            }
        }
    }

    /// An active channel: demoted when it loses (not behind a standing queue) or has
    /// been slow for `after`, while a healthy channel is there to carry the traffic.
    fn judge_active(&mut self, c: usize, now: Instant, cfg: &DemoteConfig, j: &Judged, cut: bool) {
        // Loss behind a standing queue is congestion, not a bad link: TCP's slow start
        // overflowing the channel's buffer, which the AQM signals and TCP corrects
        // within a round trip. (The round trip is timed by the reports' arrival, so
        // in-bond repair's holds do not inflate it.)
        let queued = super::adapt::standing_queue(&j.est[c]);
        let lossy = j.loss[c].is_some_and(|l| l >= cfg.loss) && !queued && cut;
        let slow = j.slow && self.small_share(c, j.est);
        let d = &mut self.chans[c].demote;
        d.slow_since = if slow {
            Some(d.slow_since.unwrap_or(now))
        } else {
            None
        };
        let slow_long = d
            .slow_since
            .is_some_and(|t| now.saturating_since(t) >= cfg.after);
        d.thin_since = (j.thin.is_some() || j.far.is_some()).then(|| d.thin_since.unwrap_or(now));
        let thin_long = d
            .thin_since
            .is_some_and(|t| now.saturating_since(t) >= cfg.after);
        if !(lossy || slow_long || thin_long) || !self.has_alternative(c, j.loss, cfg.loss / 2.0) {
            return;
        }
        let d = &mut self.chans[c].demote;
        let relapse = d.promoted_at.is_some_and(|t| {
            now.saturating_since(t).as_micros()
                < cfg.promote_after.as_micros() * 10 * u64::from(d.backoff)
        });
        d.backoff = if relapse {
            (d.backoff * 2).min(MAX_BACKOFF)
        } else {
            1
        };
        d.demotions += 1;
        d.slow_since = None;
        d.thin_since = None;
        d.thin = thin_long && !lossy && !slow_long;
        d.asked_at = None;
        d.measured_at = None;
        d.set_role(Role::Demoted, now);
        let reason = j.reason(c, lossy, d.thin, cfg);
        self.events
            .push_back(Event::ChannelDemoted { channel: c, reason });
    }

    /// Is another channel up, active, heard by the peer and losing at most `healthy`?
    fn has_alternative(&self, c: usize, loss: &[Option<f64>], healthy: f64) -> bool {
        (0..self.n).any(|o| {
            o != c
                && self.chans[o].state == LinkState::Up
                && self.chans[o].demote.role == Role::Active
                && self.peer.mask & bit(o) != 0
                && loss[o].is_some_and(|l| l <= healthy)
        })
    }

    /// A demoted or probing channel: probing while it is healthy and not slow, active
    /// again after `promote_after` (times its backoff) of that.
    fn judge_demoted(&mut self, c: usize, now: Instant, cfg: &DemoteConfig, j: &Judged) {
        let healthy = cfg.loss / 2.0;
        let d = &mut self.chans[c].demote;
        let good = j.loss[c].is_some_and(|l| l <= healthy) && !j.slow;
        if !good {
            d.set_role(Role::Demoted, now);
            return;
        }
        d.set_role(Role::Probing, now);
        let hold = cfg.promote_after.as_micros() * u64::from(d.backoff);
        if now.saturating_since(d.since).as_micros() < hold {
            return;
        }
        if d.thin && !self.fast_enough_again(c, now, j.rtts) {
            return;
        }
        let d = &mut self.chans[c].demote;
        d.thin = false;
        d.set_role(Role::Active, now);
        d.promoted_at = Some(now);
        if let Some(a) = &mut self.adapt {
            let mut set = self.tx.members.clone();
            set.push(c);
            set.sort_unstable();
            set.dedup();
            a.requantize(&set);
        }
        self.events.push_back(Event::ChannelPromoted { channel: c });
    }

    /// A channel out of the bond for being too slow for the stripe (or too far for
    /// what it carries), healthy for its hold: is it fast enough to rejoin? It is
    /// measured again first (a train, asked for here); it rejoins once measured at
    /// twice the least pace the stripe can give, and at 1.5 times the share a far one
    /// needs to stay (hysteresis). Measured still too slow, or with no measurement within
    /// [`REMEASURE_WAIT`], it stays out and waits twice as long before the next try.
    fn fast_enough_again(&mut self, c: usize, now: Instant, rtts: &[Option<Duration>]) -> bool {
        let d = &mut self.chans[c].demote;
        let Some(asked) = d.asked_at else {
            d.asked_at = Some(now);
            d.measured_at = None;
            self.probes.measure_now(c);
            return false;
        };
        let measured = d.measured_at.is_some_and(|t| t >= asked);
        if !measured && now.saturating_since(asked) < REMEASURE_WAIT {
            return false;
        }
        let fast = measured
            && self.adapt.as_ref().is_some_and(|a| {
                a.thin(c, &self.tx.members, 2.0).is_none()
                    && a.far(c, &self.tx.members, rtts, super::adapt::FAR_REJOIN)
                        .is_none()
            });
        if !fast {
            let d = &mut self.chans[c].demote;
            d.asked_at = None;
            d.backoff = (d.backoff * 2).min(MAX_BACKOFF);
            d.set_role(Role::Demoted, now);
        }
        fast
    }

    /// With the delay criterion on: is channel `c`'s minimum round trip above the
    /// threshold (demotion) for an active channel, or above three quarters of it
    /// (no promotion yet) for a demoted one? Compared with the fastest other active
    /// channel that is up; `false` without a comparison.
    fn slower_than(&self, c: usize, est: &[super::feedback::Estimate], ratio: f64) -> bool {
        if ratio == 0.0 {
            return false;
        }
        let fastest = (0..self.n)
            .filter(|&o| {
                o != c
                    && self.chans[o].state == LinkState::Up
                    && self.chans[o].demote.role == Role::Active
            })
            .filter_map(|o| est[o].rtt_min)
            .min();
        let (Some(mine), Some(best)) = (est[c].rtt_min, fastest) else {
            return false;
        };
        let mut limit = best.as_micros() as f64 * ratio + SLOW_SLACK.as_micros() as f64;
        if self.chans[c].demote.role != Role::Active {
            limit *= 0.75;
        }
        mine.as_micros() as f64 > limit
    }

    /// Does channel `c` deliver less than [`SLOW_SHARE`] of what the active channels
    /// deliver together? `false` while a rate is not known.
    fn small_share(&self, c: usize, est: &[super::feedback::Estimate]) -> bool {
        let Some(mine) = est[c].delivery_bps else {
            return false;
        };
        let total: f64 = (0..self.n)
            .filter(|&o| {
                self.chans[o].state == LinkState::Up && self.chans[o].demote.role == Role::Active
            })
            .filter_map(|o| est[o].delivery_bps)
            .sum();
        total > 0.0 && mine < SLOW_SHARE * total
    }
}

/// What one judgement sees of every channel: its loss over the last `after`, its
/// estimate, and whether the channel judged is slower than the rest.
struct Judged<'a> {
    loss: &'a [Option<f64>],
    est: &'a [super::feedback::Estimate],
    /// Each channel's minimum round trip (`est`'s, as [`super::adapt::Adapt::far`]
    /// takes them).
    rtts: &'a [Option<Duration>],
    slow: bool,
    /// Adaptive pacing holds the channel too slow for the stripe: its pace and the
    /// fastest member's ([`super::adapt::Adapt::thin`]).
    thin: Option<(f64, f64)>,
    /// Adaptive pacing holds the channel too far for what it carries
    /// ([`super::adapt::Adapt::far`]).
    far: Option<super::adapt::Far>,
}

impl Judged<'_> {
    /// Why channel `c` is demoted, for the log: it lost (`lossy`), is too slow for the
    /// stripe or too far for what it carries (`thin`), or else the delay criterion.
    fn reason(&self, c: usize, lossy: bool, thin: bool, cfg: &DemoteConfig) -> String {
        match (self.loss[c], self.thin, self.far) {
            (Some(l), _, _) if lossy => format!(
                "{:.1} % of its datagrams lost over the last {} ms",
                l * 100.0,
                cfg.after.as_micros() / 1000
            ),
            (_, Some((mine, top)), _) if thin => format!(
                "paced at {:.2} Mbit/s, under 1/{} of the fastest channel's {:.1}: too slow \
                 for the stripe, which would give it more than that and hold the bond to its pace",
                mine / 1e6,
                super::adapt::MAX_RATIO,
                top / 1e6
            ),
            (_, _, Some(f)) if thin => format!(
                "its round trip ({} ms) is over {} times the rest of the bond's ({} ms) and it \
                 is paced at {:.2} Mbit/s, under {:.0} % of the rest's {:.1}: every flow would \
                 wait on it for little capacity",
                f.rtt.as_micros() / 1000,
                super::adapt::FAR_RATIO,
                f.rest_rtt.as_micros() / 1000,
                f.mine / 1e6,
                super::adapt::FAR_SHARE * 100.0,
                f.rest / 1e6
            ),
            _ => format!(
                "its round trip ({} ms) is over {} times the fastest channel's",
                self.est[c].rtt_min.map_or(0, |r| r.as_micros() / 1000),
                cfg.rtt_ratio
            ),
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
    fn the_window_needs_its_whole_length_and_enough_datagrams() {
        let mut d = ChanDemote::new(Instant::ZERO);
        let w = Duration::from_secs(1);
        // Per 50 ms report, 3 datagrams received and 1 missing: a quarter lost.
        for k in 0..=20u64 {
            let l = d.measure(at(50 * k), (3 * k, k, 0), w);
            if k < 20 {
                assert_eq!(l, None, "{k}: not a whole window yet");
            } else {
                assert!((l.unwrap() - 0.25).abs() < 1e-9, "{l:?}");
            }
        }
        // The window slides: only its last second counts.
        let l = d.measure(at(1500), (60 + 40, 20, 0), w).unwrap();
        assert!((l - 0.0).abs() < 1e-9 || l < 0.25, "{l}");
        // Counts that go back (a new estimator) start the window over.
        assert_eq!(d.measure(at(1100), (1, 0, 0), w), None);
        assert_eq!(d.samples.len(), 1);
        // Too few datagrams in a whole window: no verdict.
        assert_eq!(d.measure(at(2200), (10, 5, 0), w), None);
    }

    #[test]
    fn loss_the_peer_found_behind_a_standing_queue_does_not_count() {
        let mut d = ChanDemote::new(Instant::ZERO);
        let w = Duration::from_secs(1);
        // Per report, 3 received and 1 missing; all of it congestion, then half.
        for k in 0..=20u64 {
            d.measure(at(50 * k), (3 * k, k, k), w);
        }
        assert_eq!(d.window_loss, Some(0.0));
        for k in 21..=40u64 {
            d.measure(at(50 * k), (3 * k, k, 20 + (k - 20) / 2), w);
        }
        let l = d.window_loss.unwrap();
        assert!((l - 0.125).abs() < 0.02, "{l}");
    }

    #[test]
    fn settings_are_checked() {
        let hb = Duration::from_millis(50);
        assert!(DemoteConfig::default().validate(hb).is_ok());
        for bad in [
            DemoteConfig {
                loss: 0.0,
                ..Default::default()
            },
            DemoteConfig {
                loss: 1.0,
                ..Default::default()
            },
            DemoteConfig {
                loss: f64::NAN,
                ..Default::default()
            },
            DemoteConfig {
                after: Duration::from_millis(60),
                ..Default::default()
            },
            DemoteConfig {
                promote_after: Duration::from_millis(10),
                ..Default::default()
            },
            DemoteConfig {
                rtt_ratio: 1.2,
                ..Default::default()
            },
            DemoteConfig {
                rtt_ratio: f64::INFINITY,
                ..Default::default()
            },
        ] {
            assert!(bad.validate(hb).is_err(), "{bad:?}");
        }
    }
}
