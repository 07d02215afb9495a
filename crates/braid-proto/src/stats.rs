//! Counters kept by the striper and the resequencer.

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
