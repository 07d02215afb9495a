//! Counters kept by the striper and the resequencer.
//!
//! Both types add up with `+=` (e.g. to total the stats of several epochs): counters
//! add, `buffer_high_water` takes the larger value.

use std::ops::AddAssign;

/// Per-channel counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChannelStats {
    /// Data bytes sent (as on the wire).
    pub bytes_sent: u64,
    /// Data packets sent.
    pub packets_sent: u64,
    /// Markers sent.
    pub markers_sent: u64,
    /// Triggers sent.
    pub triggers_sent: u64,
    /// Data bytes received (as on the wire).
    pub bytes_received: u64,
    /// Data packets received.
    pub packets_received: u64,
    /// Markers received.
    pub markers_received: u64,
    /// Triggers received.
    pub triggers_received: u64,
    /// Markers or triggers that changed the receiver's state (a resynchronization).
    pub resyncs: u64,
    /// Datagrams that could not be parsed.
    pub malformed: u64,
    /// Most packets ever held in this channel's receive buffer.
    pub buffer_high_water: u64,
    /// Arrivals dropped because the buffer was full.
    pub overflow_drops: u64,
    /// Times the receiver gave up waiting on this channel (max_wait expired).
    pub wait_timeouts: u64,
    /// Repaired packets sent on this channel after NAKs.
    pub repairs_sent: u64,
}

/// Counters for a whole session, plus one [`ChannelStats`] per channel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Per channel, in channel order.
    pub channels: Vec<ChannelStats>,
    /// Data packets handed to the application.
    pub delivered_packets: u64,
    /// Payload bytes handed to the application.
    pub delivered_bytes: u64,
    /// Deliveries the core knows to be out of order (only detectable where sequence
    /// numbers exist; header-free modes cannot see their own misorderings).
    pub out_of_order: u64,
    /// Data packets declared lost (seq: missing numbers skipped; trr: packets of
    /// segments that failed verification or arrived too late).
    pub lost: u64,
    /// Sequenced packets dropped because their number was already delivered or skipped.
    pub stale_dropped: u64,
    /// Datagrams that could not be parsed, or named a channel that does not exist.
    pub malformed: u64,
    /// Sequenced deliveries whose channel logical reception predicted correctly.
    pub fast_path_hits: u64,
    /// Sequence numbers named in NAKs (`seq` mode with repair).
    pub naks_sent: u64,
    /// Missing packets delivered thanks to a repair.
    pub repaired: u64,
    /// NAKs the striper ignored because they were for another epoch.
    pub stale_naks: u64,
    /// Sequenced packets dropped because their number was too far ahead of the expected
    /// one to be genuine (forged, or from another run), or repairs of numbers that were
    /// never NAKed.
    pub out_of_window: u64,
    /// Numbers named again in a NAK after they had been repaired once (not repaired
    /// again).
    pub repeat_naks: u64,
}

impl Stats {
    /// Zeroed counters for `channels` channels.
    pub fn new(channels: usize) -> Stats {
        Stats {
            channels: vec![ChannelStats::default(); channels],
            ..Stats::default()
        }
    }

    /// Sum of a per-channel counter.
    pub fn total(&self, f: impl Fn(&ChannelStats) -> u64) -> u64 {
        self.channels.iter().map(f).sum()
    }
}

impl AddAssign<&ChannelStats> for ChannelStats {
    /// Add every counter; `buffer_high_water` becomes the larger of the two.
    fn add_assign(&mut self, rhs: &ChannelStats) {
        // Destructured so that a new field cannot be forgotten here.
        let ChannelStats {
            bytes_sent,
            packets_sent,
            markers_sent,
            triggers_sent,
            bytes_received,
            packets_received,
            markers_received,
            triggers_received,
            resyncs,
            malformed,
            buffer_high_water,
            overflow_drops,
            wait_timeouts,
            repairs_sent,
        } = rhs;
        self.bytes_sent += bytes_sent;
        self.packets_sent += packets_sent;
        self.markers_sent += markers_sent;
        self.triggers_sent += triggers_sent;
        self.bytes_received += bytes_received;
        self.packets_received += packets_received;
        self.markers_received += markers_received;
        self.triggers_received += triggers_received;
        self.resyncs += resyncs;
        self.malformed += malformed;
        self.buffer_high_water = self.buffer_high_water.max(*buffer_high_water);
        self.overflow_drops += overflow_drops;
        self.wait_timeouts += wait_timeouts;
        self.repairs_sent += repairs_sent;
    }
}

impl AddAssign<&Stats> for Stats {
    /// Add every session-wide counter. The per-channel counters are added channel by
    /// channel when both sides have the same number of channels; otherwise channel `i`
    /// of one need not be channel `i` of the other, and they are left as they are (add
    /// the [`ChannelStats`] yourself with the right mapping).
    fn add_assign(&mut self, rhs: &Stats) {
        let Stats {
            channels,
            delivered_packets,
            delivered_bytes,
            out_of_order,
            lost,
            stale_dropped,
            malformed,
            fast_path_hits,
            naks_sent,
            repaired,
            stale_naks,
            out_of_window,
            repeat_naks,
        } = rhs;
        if self.channels.len() == channels.len() {
            for (a, b) in self.channels.iter_mut().zip(channels) {
                *a += b;
            }
        }
        self.delivered_packets += delivered_packets;
        self.delivered_bytes += delivered_bytes;
        self.out_of_order += out_of_order;
        self.lost += lost;
        self.stale_dropped += stale_dropped;
        self.malformed += malformed;
        self.fast_path_hits += fast_path_hits;
        self.naks_sent += naks_sent;
        self.repaired += repaired;
        self.stale_naks += stale_naks;
        self.out_of_window += out_of_window;
        self.repeat_naks += repeat_naks;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field distinct and non-zero. The struct literals have no `..`: a new field
    /// does not compile until it is given a value here.
    fn channel(k: u64) -> ChannelStats {
        ChannelStats {
            bytes_sent: k + 1,
            packets_sent: k + 2,
            markers_sent: k + 3,
            triggers_sent: k + 4,
            bytes_received: k + 5,
            packets_received: k + 6,
            markers_received: k + 7,
            triggers_received: k + 8,
            resyncs: k + 9,
            malformed: k + 10,
            buffer_high_water: k + 11,
            overflow_drops: k + 12,
            wait_timeouts: k + 13,
            repairs_sent: k + 14,
        }
    }

    fn stats(k: u64) -> Stats {
        Stats {
            channels: vec![channel(k), channel(k + 100)],
            delivered_packets: k + 21,
            delivered_bytes: k + 22,
            out_of_order: k + 23,
            lost: k + 24,
            stale_dropped: k + 25,
            malformed: k + 26,
            fast_path_hits: k + 27,
            naks_sent: k + 28,
            repaired: k + 29,
            stale_naks: k + 30,
            out_of_window: k + 31,
            repeat_naks: k + 32,
        }
    }

    /// `sum` is `a += b`: every counter must be the sum, the high water the maximum.
    fn check_channel(sum: &ChannelStats, a: &ChannelStats, b: &ChannelStats) {
        // Exhaustive destructuring: a new field must be checked here too.
        let ChannelStats {
            bytes_sent,
            packets_sent,
            markers_sent,
            triggers_sent,
            bytes_received,
            packets_received,
            markers_received,
            triggers_received,
            resyncs,
            malformed,
            buffer_high_water,
            overflow_drops,
            wait_timeouts,
            repairs_sent,
        } = sum.clone();
        let counters = [
            (bytes_sent, a.bytes_sent + b.bytes_sent),
            (packets_sent, a.packets_sent + b.packets_sent),
            (markers_sent, a.markers_sent + b.markers_sent),
            (triggers_sent, a.triggers_sent + b.triggers_sent),
            (bytes_received, a.bytes_received + b.bytes_received),
            (packets_received, a.packets_received + b.packets_received),
            (markers_received, a.markers_received + b.markers_received),
            (triggers_received, a.triggers_received + b.triggers_received),
            (resyncs, a.resyncs + b.resyncs),
            (malformed, a.malformed + b.malformed),
            (overflow_drops, a.overflow_drops + b.overflow_drops),
            (wait_timeouts, a.wait_timeouts + b.wait_timeouts),
            (repairs_sent, a.repairs_sent + b.repairs_sent),
        ];
        for (i, (got, want)) in counters.into_iter().enumerate() {
            assert_eq!(got, want, "channel counter #{i}");
        }
        assert_eq!(
            buffer_high_water,
            a.buffer_high_water.max(b.buffer_high_water)
        );
    }

    #[test]
    fn channel_stats_add_every_field() {
        let (a, b) = (channel(1000), channel(7));
        let mut sum = a.clone();
        sum += &b;
        check_channel(&sum, &a, &b);
        // The high water is a maximum whichever side holds it.
        let mut sum = b.clone();
        sum += &a;
        check_channel(&sum, &b, &a);
    }

    #[test]
    fn stats_add_every_field() {
        let (a, b) = (stats(1000), stats(7));
        let mut sum = a.clone();
        sum += &b;
        let Stats {
            channels,
            delivered_packets,
            delivered_bytes,
            out_of_order,
            lost,
            stale_dropped,
            malformed,
            fast_path_hits,
            naks_sent,
            repaired,
            stale_naks,
            out_of_window,
            repeat_naks,
        } = sum;
        let counters = [
            (delivered_packets, a.delivered_packets + b.delivered_packets),
            (delivered_bytes, a.delivered_bytes + b.delivered_bytes),
            (out_of_order, a.out_of_order + b.out_of_order),
            (lost, a.lost + b.lost),
            (stale_dropped, a.stale_dropped + b.stale_dropped),
            (malformed, a.malformed + b.malformed),
            (fast_path_hits, a.fast_path_hits + b.fast_path_hits),
            (naks_sent, a.naks_sent + b.naks_sent),
            (repaired, a.repaired + b.repaired),
            (stale_naks, a.stale_naks + b.stale_naks),
            (out_of_window, a.out_of_window + b.out_of_window),
            (repeat_naks, a.repeat_naks + b.repeat_naks),
        ];
        for (i, (got, want)) in counters.into_iter().enumerate() {
            assert_eq!(got, want, "session counter #{i}");
        }
        assert_eq!(channels.len(), 2);
        for ((sum, a), b) in channels.iter().zip(&a.channels).zip(&b.channels) {
            check_channel(sum, a, b);
        }
    }

    #[test]
    fn stats_with_other_channels_add_session_counters_only() {
        let a = stats(1000);
        let mut b = stats(7);
        b.channels.push(channel(5));
        let mut sum = a.clone();
        sum += &b;
        assert_eq!(sum.channels, a.channels);
        assert_eq!(sum.lost, a.lost + b.lost);
        assert_eq!(sum.repaired, a.repaired + b.repaired);
    }
}
