//! The round-trip estimate all streams share (they all cross the same bond), the
//! retransmission timeout and the reorder allowance of loss detection.

use super::StreamConfig;
use crate::time::Instant;

/// Most multiples of a quarter round trip in the reorder allowance.
const MAX_REORDER_QUARTERS: u64 = 4;

/// RFC 6298-style smoothed round trip and variation, in microseconds, with the
/// smallest sample, and how much reordering to allow before calling a frame lost.
#[derive(Debug, Clone)]
pub(super) struct Rtt {
    srtt: u64,
    rttvar: u64,
    min: u64,
    sampled: bool,
    /// Reorder allowance in quarters of the smoothed round trip (1 to 4): grows when a
    /// retransmission turns out not to have been needed, shrinks again slowly.
    quarters: u64,
    last_spurious: Instant,
    /// How much later than the frames around it a frame was acknowledged (its round
    /// trip beyond the reference of loss detection), microseconds: the largest seen,
    /// slowly forgotten.
    reorder: u64,
}

impl Rtt {
    pub fn new(cfg: &StreamConfig) -> Rtt {
        let r = cfg.initial_rtt.as_micros().max(1);
        Rtt {
            srtt: r,
            rttvar: r / 2,
            min: u64::MAX,
            sampled: false,
            quarters: 1,
            last_spurious: Instant::ZERO,
            // Until reordering is measured, allow half the assumed round trip.
            reorder: r / 2,
        }
    }

    /// One round-trip sample, microseconds.
    pub fn sample(&mut self, r: u64) {
        if self.sampled {
            let d = self.srtt.abs_diff(r);
            self.rttvar = (3 * self.rttvar + d) / 4;
            self.srtt = (7 * self.srtt + r) / 8;
        } else {
            self.srtt = r;
            self.rttvar = r / 2;
            self.sampled = true;
        }
        self.min = self.min.min(r);
    }

    /// The smallest sample so far (0 before any).
    pub fn min_rtt(&self) -> u64 {
        if self.sampled {
            self.min
        } else {
            0
        }
    }

    /// The retransmission timeout before any backoff, microseconds.
    pub fn rto(&self, cfg: &StreamConfig) -> u64 {
        let r = self.srtt + (4 * self.rttvar).max(1_000) + cfg.ack_delay.as_micros();
        r.clamp(cfg.min_rto.as_micros(), cfg.max_rto.as_micros().max(1))
    }

    /// How long after a later-sent frame was acknowledged an earlier one still counts
    /// as reordered rather than lost, microseconds: a quarter of the round trip (more
    /// after spurious retransmissions, up to a whole one), or the reordering measured,
    /// whichever is larger, plus the slack.
    pub fn reorder_window(&self, cfg: &StreamConfig) -> u64 {
        let quarters = (self.quarters * self.srtt / 4).min(self.srtt);
        quarters.max(self.reorder) + cfg.reorder_slack.as_micros()
    }

    /// A frame was acknowledged `extra` microseconds later than loss detection's
    /// reference round trip, though a frame sent after it had been acknowledged: that
    /// much reordering is normal here. The largest such delay counts, and fades by
    /// 1/256 per sample.
    pub fn on_reorder(&mut self, extra: u64) {
        self.reorder = extra.max(self.reorder - self.reorder / 256);
    }

    /// The peer saw a retransmission it did not need: allow more reordering.
    pub fn on_spurious(&mut self, now: Instant) {
        self.quarters = (self.quarters + 1).min(MAX_REORDER_QUARTERS);
        self.last_spurious = now;
    }

    /// Shrink the allowance by a quarter after 16 round trips without a spurious
    /// retransmission.
    pub fn decay(&mut self, now: Instant) {
        if self.quarters > 1
            && now.saturating_since(self.last_spurious).as_micros() > 16 * self.srtt
        {
            self.quarters -= 1;
            self.last_spurious = now;
        }
    }
}

/// `base` doubled `n` times, at most `max`.
pub(super) fn backoff(base: u64, n: u32, max: u64) -> u64 {
    base.saturating_mul(1 << n.min(20)).min(max.max(base))
}
