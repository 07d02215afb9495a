//! Adaptive weights: the SRR quanta follow what the channels can carry.
//!
//! Configured weights are only a starting point. Every adaptation interval (at least
//! 200 ms, and at least two of the slowest channel's smoothed round trips, so each step
//! sees the effect of the last), the controller looks at the per-channel estimates from
//! the peer's feedback ([`super::feedback`]):
//!
//! * a channel is **congested** when it loses more than 5 % of its datagrams over the
//!   last reports (its bottleneck queue overflows), or a queue stands on it in our
//!   sending direction (the one-way delay of our reports above its minimum by more than
//!   5 ms and a tenth of the round trip): either way it is given more than it carries.
//!   A few percent of random loss is not congestion: that is for the bond to repair, not
//!   to steer around. Channels are judged only while the bond carries at least 1 Mbit/s
//!   (an idle direction, or one that carries only acknowledgements, learns nothing);
//! * when no channel is congested, the weights are left alone (the bond carries what it
//!   is given: nothing to correct, and no reason to churn);
//! * when some are, every channel in the transmit set gets a target rate: a congested
//!   channel what it carries (its capacity, measured while its queue was full: the
//!   delivery rate of the last ~100 ms, or of the last ~400 ms if higher) less a tenth,
//!   so its queue drains; an uncongested one a quarter more than it delivered, probing
//!   for the capacity it has not shown yet. The quanta become proportional to the
//!   targets, the smallest equal to the largest packet, the largest at most
//!   [`MAX_RATIO`] times that;
//! * with every channel paced, the controller starts from quanta proportional to the
//!   configured rates, not the configured weights: the pacer holds each channel to its
//!   rate and the queue builds at home, so no channel's queue would ever show that the
//!   weights do not match the rates. From there congestion steers as above (a rate that
//!   drops below its configured one shows a queue).
//!
//! Why the one-way delay: the round trip counts the peer's traffic's queue on the way
//! back, so it had to be above its minimum by a quarter to mean anything, and then a
//! 20 ms buffer on a 60 ms link (a queue of a sixth of its round trip) never showed:
//! in the simulated twin of the lab's wrong-weights case the controller made no step
//! at all in 15 s. A queue must also stand ~300 ms ([`Estimate::queue`]): slow start's
//! bursts build queues of a few milliseconds that come and go, on a channel carrying a
//! fraction of its rate.
//!
//! A step changes the quanta only if one moves by more than a tenth. The striper applies
//! them at its next marker batch; markers carry them to the receiver
//! ([`crate::Striper::set_quanta`]).

use crate::time::{Duration, Instant};

use super::feedback::Estimate;

/// Largest quantum, in multiples of the smallest.
pub const MAX_RATIO: f64 = 64.0;
/// Shortest adaptation interval.
const MIN_INTERVAL: Duration = Duration::from_millis(200);
/// Channels are judged only while the bond delivers at least this (bit/s).
const MIN_LOAD_BPS: f64 = 1e6;
/// A congested channel's target, as a share of what it delivers.
const DRAIN: f64 = 0.9;
/// An uncongested channel's target, while another is congested, as a multiple of what
/// it delivers.
const PROBE: f64 = 1.25;

/// The controller's state.
#[derive(Clone, Debug)]
pub(crate) struct Adapt {
    pub next: Instant,
    /// Quanta in force per physical channel (bytes), as last set.
    pub quanta: Vec<u32>,
    /// Steps that changed the quanta.
    pub changes: u64,
}

impl Adapt {
    /// A controller starting from these quanta (one per physical channel), or, when
    /// every channel's rate is configured (`rates_bps`, pacing; 0: not known), from
    /// quanta proportional to those rates (the smallest kept, the largest at most
    /// [`MAX_RATIO`] times it).
    pub fn new(mut quanta: Vec<u32>, rates_bps: &[f64], now: Instant) -> Adapt {
        if rates_bps.len() == quanta.len() && rates_bps.iter().all(|r| *r > 0.0) {
            let least = quanta.iter().copied().min().unwrap_or(1);
            let low = rates_bps.iter().copied().fold(f64::MAX, f64::min);
            quanta = rates_bps
                .iter()
                .map(|r| (f64::from(least) * (r / low).min(MAX_RATIO)).round() as u32)
                .collect();
        }
        Adapt {
            next: now + MIN_INTERVAL,
            quanta,
            changes: 0,
        }
    }

    /// One step at `now` for the channels in `members` (physical indices) with these
    /// estimates (indexed by physical channel). Returns the new quanta of the members,
    /// in member order, when they should change.
    pub fn step(
        &mut self,
        now: Instant,
        members: &[usize],
        est: &[Estimate],
        max_packet: u32,
        stale_after: Duration,
    ) -> Option<Vec<u32>> {
        let slowest = members
            .iter()
            .filter_map(|&c| est[c].srtt)
            .max()
            .unwrap_or(Duration::ZERO);
        self.next = now + MIN_INTERVAL.max(slowest + slowest);
        // A member that stopped reporting (failing, about to be declared down) shows a
        // shortfall that is no congestion: change nothing until the set is settled.
        let fresh = |c: &usize| {
            est[*c]
                .reported_at
                .is_some_and(|t| now.saturating_since(t) <= stale_after)
        };
        if members.is_empty() || !members.iter().all(fresh) {
            return None;
        }
        let rate = |c: usize| est[c].delivery_bps;
        let load: f64 = members.iter().filter_map(|&c| rate(c)).sum();
        let cong: Vec<bool> = members
            .iter()
            .map(|&c| load >= MIN_LOAD_BPS && congested(&est[c]))
            .collect();
        if !cong.iter().any(|&x| x) {
            return None;
        }
        let targets = members
            .iter()
            .zip(&cong)
            .map(|(&c, &congested)| {
                Some(if congested {
                    full(&est[c])? * DRAIN
                } else {
                    rate(c)? * PROBE
                })
            })
            .collect::<Option<Vec<f64>>>()?;
        let top = targets.iter().copied().fold(0.0, f64::max);
        if top <= 0.0 {
            return None;
        }
        let floor = top / MAX_RATIO;
        let low = targets
            .iter()
            .map(|t| t.max(floor))
            .fold(f64::MAX, f64::min);
        let new: Vec<u32> = targets
            .iter()
            .map(|t| (f64::from(max_packet) * t.max(floor) / low).round() as u32)
            .map(|q| q.max(max_packet))
            .collect();
        let moved = members.iter().zip(&new).any(|(&c, &q)| {
            let old = f64::from(self.quanta[c].max(1));
            (f64::from(q) - old).abs() > old / 10.0
        });
        if !moved {
            return None;
        }
        for (&c, &q) in members.iter().zip(&new) {
            self.quanta[c] = q;
        }
        self.changes += 1;
        Some(new)
    }

    /// The quanta in force for these members.
    pub fn of(&self, members: &[usize]) -> Vec<u32> {
        members.iter().map(|&c| self.quanta[c]).collect()
    }
}

/// What a congested channel carries: its recent delivery rate (its queue is full), or
/// the longer average if that is higher (a queue that only just drained).
fn full(e: &Estimate) -> Option<f64> {
    match (e.recent_bps, e.delivery_bps) {
        (Some(r), Some(d)) => Some(r.max(d)),
        (r, d) => r.or(d),
    }
}

/// Is this channel given more than it carries? Either it loses more than random loss
/// would (its bottleneck queue overflows: this also catches a queue that was full from
/// the start, which the delay cannot show), or a queue stands at its bottleneck. A
/// channel's history starts over when it goes down and when it comes back, so an outage
/// is not taken for congestion.
pub(crate) fn congested(e: &Estimate) -> bool {
    shortfall(e) || standing_queue(e)
}

/// Does it lose more than a random-loss link would? The loss ratio comes from gaps in
/// the channel's sealing counters, so it needs no alignment of what was sent with what
/// arrived. (A comparison of the delivery rate with the send rate, tried first, took
/// the lag of a channel that starts carrying data for a shortfall.)
fn shortfall(e: &Estimate) -> bool {
    e.loss.is_some_and(|l| l > MAX_RANDOM_LOSS)
}

/// Does a queue stand on it in our sending direction: the one-way delay of our reports
/// above its recent minimum by 5 ms and a tenth of the minimum round trip? (Without a
/// one-way measure yet, the smoothed round trip above its minimum by as much.) The
/// one-way delay leaves out the queue of the peer's traffic on the way back, which a
/// round trip counts: a tenth of it was too little for the round trip to tell the two
/// apart, and a quarter let a 20 ms buffer on a 60 ms link go unseen.
pub(crate) fn standing_queue(e: &Estimate) -> bool {
    let Some(m) = e.rtt_min else {
        return false;
    };
    let standing = match (e.queue, e.srtt) {
        (Some(q), _) => q.as_micros(),
        (None, Some(s)) => s.as_micros().saturating_sub(m.as_micros()),
        (None, None) => return false,
    };
    standing > 5_000 && standing > m.as_micros() / 10
}

/// A channel that loses more than this share of its datagrams is given more than it
/// carries (a drop-tail queue overflowing); random loss of a few percent is not taken
/// for that.
const MAX_RANDOM_LOSS: f64 = 0.05;

#[cfg(test)]
mod tests {
    use super::*;

    fn est(rate_mbps: f64, srtt_ms: u64, min_ms: u64) -> Estimate {
        Estimate {
            srtt: Some(Duration::from_millis(srtt_ms)),
            rtt_min: Some(Duration::from_millis(min_ms)),
            queue: None,
            delivery_bps: Some(rate_mbps * 1e6),
            recent_bps: Some(rate_mbps * 1e6),
            loss: Some(0.0),
            reported_at: Some(Instant::ZERO),
        }
    }

    #[test]
    fn a_congested_channel_gets_what_it_carries_and_the_others_more() {
        let mut a = Adapt::new(vec![1500, 1500, 1500], &[], Instant::ZERO);
        // Channel 2 is given a third but carries 20 Mbit/s with a queue; 0 and 1 carry
        // 40 Mbit/s each without one.
        let e = [est(40.0, 10, 10), est(40.0, 40, 40), est(20.0, 150, 60)];
        let q = a
            .step(Instant::ZERO, &[0, 1, 2], &e, 1500, SECOND)
            .expect("a change");
        // Targets 50, 50, 18 Mbit/s: the smallest quantum is channel 2's.
        assert_eq!(q[2], 1500);
        assert_eq!(q[0], q[1]);
        assert_eq!(q[0], (1500.0 * 50.0 / 18.0_f64).round() as u32);
        assert_eq!(a.changes, 1);
        // The same again moves nothing.
        assert_eq!(a.step(Instant::ZERO, &[0, 1, 2], &e, 1500, SECOND), None);
    }

    #[test]
    fn nothing_congested_leaves_the_weights_alone() {
        let mut a = Adapt::new(vec![1500, 3000], &[], Instant::ZERO);
        let e = [est(10.0, 10, 10), est(1.0, 50, 45)];
        assert_eq!(a.step(Instant::ZERO, &[0, 1], &e, 1500, SECOND), None);
        // Loss is not congestion.
        let mut lossy = e;
        lossy[1].loss = Some(0.05);
        assert_eq!(a.step(Instant::ZERO, &[0, 1], &lossy, 1500, SECOND), None);
    }

    #[test]
    fn the_ratio_is_capped_and_the_interval_follows_the_round_trip() {
        let mut a = Adapt::new(vec![1500, 1500], &[], Instant::ZERO);
        let e = [est(1000.0, 10, 10), est(0.001, 400, 100)];
        let q = a.step(Instant::ZERO, &[0, 1], &e, 1500, SECOND).unwrap();
        assert_eq!(q, vec![(1500.0 * MAX_RATIO) as u32, 1500]);
        assert_eq!(a.next, Instant::ZERO + Duration::from_millis(800));
    }

    #[test]
    fn a_channel_that_stopped_reporting_freezes_the_weights() {
        let mut a = Adapt::new(vec![1500, 1500], &[], Instant::ZERO);
        let mut e = [est(40.0, 10, 10), est(20.0, 150, 60)];
        let later = Instant::ZERO + Duration::from_secs(2);
        e[0].reported_at = Some(later);
        // Channel 1 looks congested, but its last report is 2 s old.
        assert_eq!(a.step(later, &[0, 1], &e, 1500, SECOND), None);
        e[1].reported_at = Some(later);
        assert!(a.step(later, &[0, 1], &e, 1500, SECOND).is_some());
    }

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn configured_rates_are_the_start() {
        // Paced at 100, 50 and 20 Mbit/s, weighted the wrong way round.
        let a = Adapt::new(vec![1500, 3750, 7500], &[100e6, 50e6, 20e6], Instant::ZERO);
        assert_eq!(a.of(&[0, 1, 2]), vec![7500, 3750, 1500]);
        // Not every channel paced: the weights stay.
        let b = Adapt::new(vec![1500, 3750, 7500], &[100e6, 0.0, 20e6], Instant::ZERO);
        assert_eq!(b.of(&[0, 1, 2]), vec![1500, 3750, 7500]);
    }

    #[test]
    fn an_idle_direction_is_not_judged() {
        // Acknowledgements only (0.6 Mbit/s in all), with a round trip far above its
        // minimum: the queue is the peer's data on the way back.
        let mut a = Adapt::new(vec![1500, 1500], &[], Instant::ZERO);
        let e = [est(0.4, 10, 10), est(0.2, 150, 60)];
        assert_eq!(a.step(Instant::ZERO, &[0, 1], &e, 1500, SECOND), None);
    }

    #[test]
    fn the_one_way_queue_decides_when_it_is_known() {
        // The round trip stands 90 ms above its minimum, but none of it is in our
        // direction: not congested.
        let mut back = est(20.0, 150, 60);
        back.queue = Some(Duration::ZERO);
        assert!(!congested(&back));
        // 8 ms standing on a 60 ms round trip: congested (a tenth of it, and 5 ms).
        let mut ours = est(20.0, 60, 60);
        ours.queue = Some(Duration::from_millis(8));
        assert!(congested(&ours));
        ours.queue = Some(Duration::from_millis(5));
        assert!(!congested(&ours));
    }

    #[test]
    fn a_congested_channel_is_measured_on_its_recent_rate() {
        // Its average still counts a ramp (12 Mbit/s); the last 100 ms show 20.
        let mut a = Adapt::new(vec![1500, 1500], &[], Instant::ZERO);
        let mut full = est(12.0, 150, 60);
        full.recent_bps = Some(20e6);
        let e = [est(40.0, 10, 10), full];
        let q = a.step(Instant::ZERO, &[0, 1], &e, 1500, SECOND).unwrap();
        // Targets 50 and 18 Mbit/s.
        assert_eq!(q, vec![(1500.0 * 50.0 / 18.0_f64).round() as u32, 1500]);
    }

    #[test]
    fn congestion_needs_a_standing_queue_of_5_ms_and_a_tenth() {
        assert!(!congested(&est(1.0, 14, 10)));
        assert!(!congested(&est(1.0, 104, 100)));
        assert!(congested(&est(1.0, 16, 10)));
        assert!(congested(&est(1.0, 126, 100)));
        assert!(!congested(&Estimate::default()));
        // Given 80 Mbit/s, it carries 20 and drops the rest: congested whatever the
        // round trip says.
        let mut full = est(20.0, 100, 100);
        full.loss = Some(0.75);
        assert!(congested(&full));
        // 3 % random loss is not congestion.
        full.loss = Some(0.03);
        assert!(!congested(&full));
    }
}
