//! Session configuration shared by the striper and the resequencer.
//!
//! Both ends must be built from the same [`StripeConfig`]: the receiver simulates the
//! sender's scheduler, so the scheduler, weights and channel order must agree.

use crate::sched::baseline::BaselineKind;
use crate::sched::SchedulerKind;
use crate::time::Duration;

/// The most channels one session stripes over (channel ids are one byte on the wire;
/// 64 keeps per-packet scans short).
pub const MAX_CHANNELS: usize = 64;

/// How the sender picks channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// A causal scheduler that the receiver can simulate.
    Causal(SchedulerKind),
    /// A non-causal baseline; only receiver mode `none` can be used with it.
    Baseline(BaselineKind),
}

impl Policy {
    /// Short name.
    pub fn name(&self) -> &'static str {
        match self {
            Policy::Causal(k) => k.name(),
            Policy::Baseline(b) => b.name(),
        }
    }
}

/// How the receiver puts packets back in order, and so what the sender adds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Deliver in arrival order. Data travel header-free; no markers are needed.
    None,
    /// Header-free logical reception with marker resynchronization (quasi-FIFO).
    Logical,
    /// A sequence header on every data packet: guaranteed FIFO, exactly once.
    Seq,
    /// Trigger-based SRR: never out of order, loss allowed.
    Trr,
}

impl Mode {
    /// Short name.
    pub fn name(&self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Logical => "logical",
            Mode::Seq => "seq",
            Mode::Trr => "trr",
        }
    }

    /// Parse a short name.
    pub fn from_name(s: &str) -> Option<Mode> {
        Some(match s {
            "none" => Mode::None,
            "logical" => Mode::Logical,
            "seq" => Mode::Seq,
            "trr" => Mode::Trr,
            _ => return None,
        })
    }
}

/// Where in the round the markers of a marker round are sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkerPosition {
    /// Before the first packet of the round.
    Start,
    /// After the last packet of the round, before the next round begins.
    End,
    /// Just before the visit of this channel index.
    Channel(usize),
}

/// Marker settings (seed 000 §5, §6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MarkerConfig {
    /// Send markers on every channel every this many rounds; 0 turns periodic markers off.
    pub every_rounds: u32,
    /// Where in the round.
    pub position: MarkerPosition,
    /// After this long without data, send markers (or triggers in TRR mode) once, so the
    /// receiver does not wait forever for a lost last packet. `None`: never.
    pub idle: Option<Duration>,
    /// While data flows, send markers (or triggers in TRR mode) at least this often:
    /// no data packet waits longer than this for the next marker or trigger after it.
    /// This bounds TRR's added latency and the time to resynchronize after a loss in
    /// time as well as in rounds. `None` (the default, as in the papers): only the
    /// round and packet counts apply.
    pub max_interval: Option<Duration>,
    /// While the peer reports no loss (the session's call, [`crate::Striper::set_quiet`]),
    /// `max_interval` is this instead, and `every_rounds` grows in the same proportion:
    /// fewer markers where nothing needs repair. `None` (the default, as in the papers):
    /// always `max_interval`. Never shorter than `max_interval`; no effect without it.
    pub quiet_interval: Option<Duration>,
    /// Stamp every marker with the sender's clock (8 bytes more per marker), so the
    /// receiver can measure each channel's queueing delay (`aqm`). Off by default, as
    /// in the papers.
    pub timestamps: bool,
}

impl Default for MarkerConfig {
    fn default() -> Self {
        MarkerConfig {
            every_rounds: 8,
            position: MarkerPosition::End,
            idle: Some(Duration::from_millis(20)),
            max_interval: None,
            quiet_interval: None,
            timestamps: false,
        }
    }
}

/// Receiver-side limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceiverConfig {
    /// Packets held per channel between physical and logical reception; arrivals beyond
    /// it force progress and, if still full, are dropped and counted.
    pub buffer_packets: usize,
    /// How long the receiver waits for a missing packet (logical, seq) or a missing
    /// trigger (trr) while other channels hold data, before declaring it lost.
    pub max_wait: Duration,
    /// Delay equalization: hold each channel's datagrams for the difference between
    /// the slowest channel's one-way delay and its own (measured from the arrival
    /// times of markers sent together), so every packet sees the same delay. Makes
    /// TCP's round-trip time steady over channels of different delays; costs nothing
    /// in a steady stream, where logical reception waits for the slowest channel
    /// anyway. Off by default, as in the papers.
    pub equalize: bool,
    /// `seq` mode only: repair losses. A number found missing (every channel has moved
    /// past it) is named in a NAK to the sender, which sends the packet again on every
    /// channel; the receiver waits this long for it before declaring it lost. The
    /// sender keeps the last `buffer_packets` packets for this. `None` (the default):
    /// no repair, as in the papers.
    pub repair: Option<Duration>,
}

impl Default for ReceiverConfig {
    fn default() -> Self {
        ReceiverConfig {
            buffer_packets: 4096,
            max_wait: Duration::from_millis(200),
            equalize: false,
            repair: None,
        }
    }
}

/// Everything both ends of a striping session agree on.
#[derive(Clone, Debug, PartialEq)]
pub struct StripeConfig {
    /// How the sender picks channels.
    pub policy: Policy,
    /// Per-channel weight: the SRR quantum in bytes, the GRR packet count per round, the
    /// random scheduler's relative probability (ignored by RR). Its length is the
    /// number of channels.
    pub weights: Vec<u32>,
    /// The largest packet the session carries, in bytes, as it travels on the channel.
    pub max_packet: u32,
    /// Receiver mode (decides what the sender adds to the stream).
    pub mode: Mode,
    /// Marker settings.
    pub markers: MarkerConfig,
    /// TRR: a trigger on every channel every this many data packets.
    pub trigger_every: u32,
    /// Receiver limits.
    pub receiver: ReceiverConfig,
}

impl StripeConfig {
    /// SRR with these byte quanta, logical reception and default markers.
    pub fn srr(quanta: Vec<u32>, max_packet: u32) -> StripeConfig {
        StripeConfig {
            policy: Policy::Causal(SchedulerKind::Srr),
            weights: quanta,
            max_packet,
            mode: Mode::Logical,
            markers: MarkerConfig::default(),
            trigger_every: 128,
            receiver: ReceiverConfig::default(),
        }
    }

    /// Number of channels.
    pub fn channels(&self) -> usize {
        self.weights.len()
    }

    /// Check the configuration; every error names what is wrong.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let n = self.weights.len();
        if n == 0 {
            return Err(ConfigError::NoChannels);
        }
        if n > MAX_CHANNELS {
            return Err(ConfigError::TooManyChannels(n));
        }
        if self.max_packet == 0 {
            return Err(ConfigError::MaxPacketZero);
        }
        for (channel, &w) in self.weights.iter().enumerate() {
            if w == 0 {
                return Err(ConfigError::ZeroWeight { channel });
            }
            if self.policy == Policy::Causal(SchedulerKind::Srr) && w < self.max_packet {
                return Err(ConfigError::QuantumTooSmall {
                    channel,
                    quantum: w,
                    max_packet: self.max_packet,
                });
            }
        }
        match (self.policy, self.mode) {
            (Policy::Baseline(b), m) if m != Mode::None => {
                return Err(ConfigError::NonCausal {
                    scheduler: b.name(),
                    mode: m.name(),
                })
            }
            (Policy::Causal(SchedulerKind::Random { .. }), Mode::Trr) => {
                return Err(ConfigError::TrrNeedsRoundRobin)
            }
            _ => {}
        }
        if self.mode == Mode::Trr && self.trigger_every == 0 {
            return Err(ConfigError::TriggerEveryZero);
        }
        if let MarkerPosition::Channel(c) = self.markers.position {
            if c >= n {
                return Err(ConfigError::MarkerChannel {
                    channel: c,
                    channels: n,
                });
            }
        }
        if self.mode != Mode::None && self.receiver.buffer_packets == 0 {
            return Err(ConfigError::ZeroBuffer);
        }
        Ok(())
    }
}

/// A configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// No channels at all.
    #[error("no channels configured")]
    NoChannels,
    /// More than [`MAX_CHANNELS`].
    #[error("{0} channels configured; at most {MAX_CHANNELS} are supported")]
    TooManyChannels(usize),
    /// `max_packet` is 0.
    #[error("max_packet must be at least 1 byte")]
    MaxPacketZero,
    /// A weight of 0.
    #[error("channel {channel}: weight/quantum must be at least 1")]
    ZeroWeight {
        /// Channel index.
        channel: usize,
    },
    /// SRR quantum below the largest packet (seed 000 assumes Quantum_i >= Max).
    #[error(
        "channel {channel}: SRR quantum {quantum} bytes is smaller than the largest packet \
         ({max_packet} bytes); every quantum must be at least max_packet"
    )]
    QuantumTooSmall {
        /// Channel index.
        channel: usize,
        /// Its quantum.
        quantum: u32,
        /// The largest packet.
        max_packet: u32,
    },
    /// A receiver mode that needs to simulate a non-causal sender.
    #[error(
        "scheduler '{scheduler}' is not causal: the receiver cannot simulate it, so receiver \
         mode '{mode}' is impossible; use mode 'none' or a causal scheduler (srr, rr, grr, random)"
    )]
    NonCausal {
        /// Scheduler name.
        scheduler: &'static str,
        /// Mode name.
        mode: &'static str,
    },
    /// TRR with the random scheduler.
    #[error("receiver mode 'trr' needs a round-robin scheduler (srr, rr or grr)")]
    TrrNeedsRoundRobin,
    /// `trigger_every` is 0 in TRR mode.
    #[error("trigger_every must be at least 1 packet in trr mode")]
    TriggerEveryZero,
    /// Marker position names a channel that does not exist.
    #[error("marker position: channel {channel} does not exist ({channels} channels)")]
    MarkerChannel {
        /// The named channel.
        channel: usize,
        /// How many there are.
        channels: usize,
    },
    /// Receiver buffer of zero packets.
    #[error("receiver buffer must hold at least 1 packet per channel")]
    ZeroBuffer,
    /// New quanta (adaptive weights) that cannot be used.
    #[error("adaptive weights: {0}")]
    Quanta(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantum_below_max_names_the_channel() {
        let c = StripeConfig::srr(vec![1500, 1000], 1500);
        let e = c.validate().unwrap_err();
        assert_eq!(
            e,
            ConfigError::QuantumTooSmall {
                channel: 1,
                quantum: 1000,
                max_packet: 1500
            }
        );
        assert!(e.to_string().contains("channel 1"));
    }

    #[test]
    fn baseline_with_logical_is_rejected() {
        let mut c = StripeConfig::srr(vec![1500, 1500], 1500);
        c.policy = Policy::Baseline(BaselineKind::ShortestQueue);
        assert!(matches!(c.validate(), Err(ConfigError::NonCausal { .. })));
        c.mode = Mode::None;
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn empty_and_zero_configs() {
        assert_eq!(
            StripeConfig::srr(vec![], 1500).validate(),
            Err(ConfigError::NoChannels)
        );
        let mut c = StripeConfig::srr(vec![1500], 1500);
        c.markers.position = MarkerPosition::Channel(3);
        assert!(matches!(
            c.validate(),
            Err(ConfigError::MarkerChannel { .. })
        ));
    }
}
