//! What one simulation run takes and what it gives: its configuration ([`RunConfig`],
//! [`Variant`]), its results ([`RunResult`] and the parts each kind of run adds) and
//! why it could not be carried out ([`RunError`]). The engine, the session ends and
//! the error-control loop all work on these types, so they sit below all three.

use braid_proto::session;
use braid_proto::StripeConfig;

use crate::metrics::Histogram;
use crate::model::{ChannelSpec, Nanos, TrafficSpec};

/// Smallest packet the simulator can send. Every packet looks like an IPv4 packet of one
/// flow (first byte 0x45, so it travels header-free; addresses 10.0.0.1 to 10.0.0.2 at
/// bytes 12..20) and carries its id in bytes 4..12 and its send time in ns in bytes
/// 20..28 (see [`crate::engine::packet_stamp`]).
pub const MIN_PACKET: u32 = 28;

/// What runs over the channels.
#[derive(Clone, Debug, PartialEq)]
pub enum Variant {
    /// One striping session over all channels.
    Striped(StripeConfig),
    /// The upper bound of seed 000 Fig. 15: the same traffic over each channel alone
    /// (receiver mode `none`), counters added up.
    SumOfSingles,
    /// Two whole session machines ([`braid_proto::session`]), as on real sockets:
    /// hellos, liveness, epoch changes and failover run in virtual time. The sender's
    /// datagrams cross the simulated channels; the receiver's (hellos, acks, markers,
    /// NAKs) come back over each channel with its delay, lost while it is down.
    Session(Box<session::Config>),
    /// Seed 002's error control over one channel ([`crate::errctl`]): a window-limited
    /// sender with (W, E, B) segments, SNAKs and PACKs out of band.
    ErrCtl(Box<ErrCtlSpec>),
}

/// Everything one simulation run needs.
#[derive(Clone, Debug, PartialEq)]
pub struct RunConfig {
    /// The channels, in channel-index order.
    pub channels: Vec<ChannelSpec>,
    /// The traffic.
    pub traffic: TrafficSpec,
    /// The source stops offering packets at this time (the measurement window).
    pub duration: Option<Nanos>,
    /// The source stops after this many packets.
    pub packets: Option<u64>,
    /// After the source stops, run at most this long for packets in flight to arrive.
    pub drain: Nanos,
    /// The seed for every random process.
    pub seed: u64,
    /// The session (or the sum-of-singles bound).
    pub variant: Variant,
    /// A VoIP-like flow beside the traffic (`[voip]`; session runs only).
    pub voip: Option<crate::voip::VoipSpec>,
}

/// Per-channel results. The JSON report shows them as they are, less the fields marked
/// `skip` (used only to compute session-level figures).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ChannelResult {
    /// Channel index.
    pub id: usize,
    /// Bytes put on the channel (data and control, as on the wire).
    pub bytes: u64,
    /// Datagrams put on the channel (data and control).
    pub packets: u64,
    /// Of those, data packets.
    pub data_packets: u64,
    /// Of those, markers and triggers.
    pub control_packets: u64,
    /// Bytes whose transmission ended inside the measurement window, per second.
    pub throughput_bps: f64,
    /// Datagrams lost on the channel.
    pub lost: u64,
    /// Datagrams corrupted on the channel (dropped by the receiver).
    pub corrupted: u64,
    /// Datagrams dropped because the transmit queue was full.
    pub queue_drops: u64,
    /// Datagrams dropped because they exceeded the MTU.
    pub mtu_drops: u64,
    /// Of the bytes, markers and triggers.
    #[serde(skip)]
    pub control_bytes: u64,
    /// Data packets lost or corrupted on the channel.
    #[serde(skip)]
    pub data_lost: u64,
    /// Data packets dropped at the sender (full queue or over the MTU).
    #[serde(skip)]
    pub data_dropped: u64,
}

/// The result of one run.
#[derive(Clone, Debug, Default)]
pub struct RunResult {
    /// The measurement span in seconds: the configured duration, or for a packet-count
    /// run the time of the last delivery.
    pub duration_s: f64,
    /// Payload bytes delivered inside the span, per second, times 8.
    pub goodput_bps: f64,
    /// The same, counting only packets delivered in order.
    pub inorder_goodput_bps: f64,
    /// Links that change over time: goodput per [`crate::metrics::SERIES_BIN`] from the start, bit/s.
    pub goodput_series_bps: Vec<f64>,
    /// Data packets accepted by the striper.
    pub packets_sent: u64,
    /// Data packets delivered to the application.
    pub packets_delivered: u64,
    /// `packets_sent - packets_delivered`.
    pub packets_lost: u64,
    /// Data packets lost or corrupted on a channel.
    pub lost_on_channel: u64,
    /// Data packets dropped at a full transmit queue or over the MTU.
    pub dropped_at_sender: u64,
    /// Packets the striper refused (larger than max_packet once framed).
    pub send_errors: u64,
    /// Deliveries of a packet after a packet that was sent later.
    pub out_of_order: u64,
    /// Largest (highest id delivered so far − id) over out-of-order deliveries.
    pub max_reorder_depth: u64,
    /// One-way latency, striper to application, ns.
    pub latency: Histogram,
    /// Per loss episode: seconds from its end until the last out-of-order delivery.
    pub resync_s: Vec<f64>,
    /// Per loss episode: in-order delivery resumed before the next episode (or the end).
    pub fifo_restored: Vec<bool>,
    /// Loss episodes as (start, end) seconds.
    pub episodes: Vec<(f64, f64)>,
    /// Data bytes put on the channels.
    pub data_bytes: u64,
    /// Marker and trigger bytes put on the channels.
    pub control_bytes: u64,
    /// Receiver resynchronizations (markers or triggers that changed its state).
    pub resyncs: u64,
    /// Times the receiver gave up waiting for a packet.
    pub wait_timeouts: u64,
    /// Per channel.
    pub channels: Vec<ChannelResult>,
    /// Events processed (packets offered, transmissions ended, arrivals, timers).
    pub events: u64,
    /// Session runs only: failover and rejoin times, duplicates.
    pub session: Option<SessionResult>,
    /// Error-control runs only: efficiency, segment delays, repairs.
    pub errctl: Option<ErrCtlResult>,
    /// TCP source only: what the flow did.
    pub tcp: Option<crate::tcp::TcpResult>,
    /// `[voip]` only: the VoIP flow's delay and loss.
    pub voip: Option<crate::voip::VoipResult>,
}

/// What a session run measures beyond the striping figures.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct SessionResult {
    /// Per link-down episode (in the order of `loss_episodes_s`' down periods): ms from
    /// the link going down until the sender stopped putting data on it (it ended the
    /// epoch that used it); `None` if it never did.
    pub failover_ms: Vec<Option<f64>>,
    /// Per link-down episode: ms from the link coming back until it carried data again;
    /// `None` if it never did before the run ended.
    pub rejoin_ms: Vec<Option<f64>>,
    /// Deliveries of a packet that had already been delivered.
    pub duplicates: u64,
    /// Epoch switches completed by the sender.
    pub epoch_changes: u64,
    /// Times adaptive weights changed the sender's quanta.
    pub quanta_changes: u64,
    /// The sender's quantum per channel at the end (bytes).
    pub final_quanta: Vec<u32>,
    /// Every packet the source offered and the receiving end did not deliver, by cause.
    pub not_delivered: NotDelivered,
    /// With `credits` on (otherwise left out of the JSON): what flow control did.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub credits: Option<CreditResult>,
}

/// What became of the packets the source offered that were not delivered, by cause,
/// in a session run: `offered` less the packets delivered is the sum of the other
/// fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct NotDelivered {
    /// Packets the source handed to the sending end.
    pub offered: u64,
    /// Dropped by the sending end: its transmit queue was full (the bond carries less
    /// than is offered) or, during an epoch switch, its switch queue.
    pub sender_queue: u64,
    /// Dropped by the pacer's CoDel for their time in the sending end's queue (IP and
    /// not ECN-capable; ECN-capable ones are marked instead).
    pub pacer: u64,
    /// Dropped by the receiving end's AQM as a congestion signal.
    pub receiver_aqm: u64,
    /// Given up by the receiving end, which counted them: lost on a link (its queue
    /// overflowed, or the link lost them) and not repaired in time, or left
    /// undeliverable at an epoch switch. (The link-level counts are the channels'
    /// `lost` and `queue_drops`; a repaired loss is counted there but delivered.)
    pub receiver_gave_up: u64,
    /// Lost in the bond where the receiving end cannot count them (logical reception
    /// has no sequence numbers: a lost packet leaves no gap it can see), or still in
    /// flight when the run stopped.
    pub lost_unseen: u64,
}

/// What credit-based flow control did in a session run (`[session] credits = true`).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct CreditResult {
    /// Datagrams the receiver's channel buffers had no room for (overflow drops).
    pub receiver_overflow: u64,
    /// Most datagrams one channel buffer held at once.
    pub receiver_high_water: u64,
    /// Times a channel ran out of credit and the sender's striper waited.
    pub credit_stalls: u64,
    /// Credits the receiver sent.
    pub credits_sent: u64,
    /// Data the receiver refused for lack of credit (0 unless the sender misbehaves).
    pub credit_refused: u64,
    /// Packets the sender dropped because its transmit queue was full (what waits for
    /// credit waits there).
    pub sender_queue_drops: u64,
}

impl RunResult {
    /// Control bytes as a fraction of everything put on the channels.
    pub fn marker_overhead(&self) -> f64 {
        let total = self.data_bytes + self.control_bytes;
        if total == 0 {
            0.0
        } else {
            self.control_bytes as f64 / total as f64
        }
    }
}

/// Why a run could not be carried out.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RunError {
    /// The stripe configuration is invalid.
    #[error("invalid striping configuration: {0}")]
    Config(#[from] braid_proto::ConfigError),
    /// A channel's count differs between the channels and the configuration.
    #[error("{channels} channels but the striping configuration has {weights} weights")]
    ChannelCount {
        /// Channel specs.
        channels: usize,
        /// Weights.
        weights: usize,
    },
    /// Neither a duration nor a packet count: the run would never end.
    #[error("the run has neither a duration nor a packet count")]
    Unbounded,
    /// A backlogged sender made no progress in time.
    #[error(
        "the backlogged source offered {0} packets without simulated time advancing: every \
         packet is dropped before it reaches a queue (is every channel's mtu below the packet sizes?)"
    )]
    NoProgress(u64),
    /// The session configuration is invalid.
    #[error("invalid session configuration: {0}")]
    Session(String),
    /// Session runs need timed traffic.
    #[error(
        "a session run needs timed traffic (cbr, poisson or trace): a backlogged source \
         would be held for the whole of each epoch switch"
    )]
    SessionBacklogged,
    /// The error-control run cannot be carried out.
    #[error("[errctl]: {0}")]
    ErrCtl(String),
    /// The TCP source's settings cannot be used.
    #[error("tcp source: {0}")]
    Tcp(String),
    /// A packet size below the simulator's minimum.
    #[error("packet size {0} bytes is below the simulator's minimum of {MIN_PACKET} bytes")]
    PacketTooSmall(u32),
}

/// What an error-control run measures (flattened into the run's JSON).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ErrCtlResult {
    /// The tolerance [W, E, B]; W is the segment length in packets.
    pub tolerance: [u16; 3],
    /// The sender's window, in segments.
    pub window: u32,
    /// Ideal segment transmitting time / measured time per accepted segment.
    pub throughput_efficiency: f64,
    /// The §5.2 analysis for this link, window and loss probability (100 % recovery
    /// and Bernoulli loss only; `null` otherwise).
    pub analysis_efficiency: Option<f64>,
    /// Largest segment delay, first packet sent to acceptance, ms.
    pub max_delay_ms: f64,
    /// Mean segment delay, ms.
    pub mean_delay_ms: f64,
    /// The §5.2 analysis of the mean delay from the receiver's view, D_r, ms (same
    /// conditions as `analysis_efficiency`).
    pub analysis_mean_delay_ms: Option<f64>,
    /// Segments delivered.
    pub segments: u64,
    /// Segments delivered with more losses than the tolerance allows (deadline).
    pub violations: u64,
    /// Segments given up at the deadline.
    pub forced: u64,
    /// Packets lost and accepted within the tolerance.
    pub packets_tolerated: u64,
    /// Data packets sent again.
    pub retransmissions: u64,
    /// SNAKs sent by the receiver.
    pub snaks: u64,
    /// PACKs sent by the receiver.
    pub packs: u64,
}

/// The `[errctl]` settings of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct ErrCtlSpec {
    /// The protocol configuration (both ends).
    pub config: braid_proto::errctl::Config,
    /// Bytes of each data packet on the wire (header included).
    pub packet_bytes: u32,
}
