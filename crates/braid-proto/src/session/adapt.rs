//! Adaptive weights: the SRR quanta follow what the channels deliver.
//!
//! Configured weights are only a starting point. Every adaptation interval (at least
//! 200 ms, and at least two of the slowest channel's smoothed round trips, so each step
//! sees the effect of the last), the controller looks at the per-channel estimates from
//! the peer's feedback ([`super::feedback`]):
//!
//! * a channel is **congested** when it loses more than 5 % of its datagrams over the
//!   last reports (its bottleneck queue overflows), or its smoothed round trip stands
//!   above its minimum by more than a quarter of the minimum and at least 5 ms (a queue
//!   builds): either way it is given more than it carries. A few percent of random loss
//!   is not congestion: that is for the bond to repair, not to steer around;
//! * when no channel is congested, the weights are left alone (the bond carries what it
//!   is given: nothing to correct, and no reason to churn);
//! * when some are, every channel in the transmit set gets a target rate: a congested
//!   channel what it delivered (its capacity, measured while its queue was full) less a
//!   tenth, so its queue drains; an uncongested one a quarter more than it delivered,
//!   probing for the capacity it has not shown yet. The quanta become proportional to
//!   the targets, the smallest equal to the largest packet, the largest at most
//!   [`MAX_RATIO`] times that.
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
    pub fn new(quanta: Vec<u32>, now: Instant) -> Adapt {
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
        if !members.iter().all(fresh) {
            return None;
        }
        let cong: Vec<bool> = members.iter().map(|&c| congested(&est[c])).collect();
        let targets = targets(members, est, &cong)?;
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

/// Is this channel given more than it carries? Either it loses more than random loss
/// would (its bottleneck queue overflows: this also catches a queue that was full from
/// the start, which the round trip cannot show), or a queue stands at its bottleneck
/// (the round trip is above its recent minimum). A channel's history starts over when
/// it goes down and when it comes back, so an outage is not taken for congestion.
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

/// Is its round trip above its recent minimum by a quarter and 5 ms?
pub(crate) fn standing_queue(e: &Estimate) -> bool {
    match (e.srtt, e.rtt_min) {
        (Some(s), Some(m)) => {
            let standing = s.as_micros().saturating_sub(m.as_micros());
            standing > 5_000 && standing > m.as_micros() / 4
        }
        _ => false,
    }
}

/// A channel that loses more than this share of its datagrams is given more than it
/// carries (a drop-tail queue overflowing); random loss of a few percent is not taken
/// for that.
const MAX_RANDOM_LOSS: f64 = 0.05;

/// Target rates of the members, or `None` when nothing is to be corrected (no channel
/// congested) or a member has no estimate yet.
fn targets(members: &[usize], est: &[Estimate], cong: &[bool]) -> Option<Vec<f64>> {
    if !cong.iter().any(|&x| x) {
        return None;
    }
    members
        .iter()
        .zip(cong)
        .map(|(&c, &congested)| {
            let rate = est[c].delivery_bps?;
            Some(if congested { rate * 0.9 } else { rate * 1.25 })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn est(rate_mbps: f64, srtt_ms: u64, min_ms: u64) -> Estimate {
        Estimate {
            srtt: Some(Duration::from_millis(srtt_ms)),
            rtt_min: Some(Duration::from_millis(min_ms)),
            delivery_bps: Some(rate_mbps * 1e6),
            loss: Some(0.0),
            reported_at: Some(Instant::ZERO),
        }
    }

    #[test]
    fn a_congested_channel_gets_what_it_carries_and_the_others_more() {
        let mut a = Adapt::new(vec![1500, 1500, 1500], Instant::ZERO);
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
        let mut a = Adapt::new(vec![1500, 3000], Instant::ZERO);
        let e = [est(10.0, 10, 10), est(1.0, 50, 45)];
        assert_eq!(a.step(Instant::ZERO, &[0, 1], &e, 1500, SECOND), None);
        // Loss is not congestion.
        let mut lossy = e;
        lossy[1].loss = Some(0.05);
        assert_eq!(a.step(Instant::ZERO, &[0, 1], &lossy, 1500, SECOND), None);
    }

    #[test]
    fn the_ratio_is_capped_and_the_interval_follows_the_round_trip() {
        let mut a = Adapt::new(vec![1500, 1500], Instant::ZERO);
        let e = [est(1000.0, 10, 10), est(0.001, 400, 100)];
        let q = a.step(Instant::ZERO, &[0, 1], &e, 1500, SECOND).unwrap();
        assert_eq!(q, vec![(1500.0 * MAX_RATIO) as u32, 1500]);
        assert_eq!(a.next, Instant::ZERO + Duration::from_millis(800));
    }

    #[test]
    fn a_channel_that_stopped_reporting_freezes_the_weights() {
        let mut a = Adapt::new(vec![1500, 1500], Instant::ZERO);
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
    fn congestion_needs_a_standing_queue_of_5_ms_and_a_quarter() {
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
