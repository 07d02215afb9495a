//! The session: one end of a striping session as a sans-IO state machine.
//!
//! A [`Session`] owns one [`Striper`] (our transmit direction) and one [`Resequencer`]
//! (our receive direction) over a fixed list of channels, and everything between them
//! and the network: hellos and liveness, epoch changes (failover and rejoin), NAK
//! routing, the security layer (a Noise handshake, then every datagram sealed), and
//! the counters. It does no I/O and
//! reads no clock. The same machine runs on real sockets (`braid-io`) and in the
//! simulator (`braid-sim`), so a failover seen on a real link can be replayed in
//! virtual time.
//!
//! Both ends are symmetric. Each direction has its own epoch: the data sender chooses
//! the channel set from what the receiver reports hearing (hellos), ends the old epoch
//! with an authenticated epoch-end message on every channel (after its last data
//! packet there), holds new data until the receiver acknowledges, then stripes over the
//! new set with a fresh striper. The receiver finishes the old resequencer (each old
//! channel ended at its final position, then [`Resequencer::drain`]) before it starts the
//! new one, so nothing is delivered twice and nothing from the old epoch is mixed into
//! the new one. `docs/tunnel.md` describes the protocol, `docs/wire.md` the messages.
//!
//! # Call order
//!
//! * Input: [`Session::handle_datagram`] for each datagram received on channel `k`,
//!   [`Session::handle_packet`] for each packet from the application, and
//!   [`Session::handle_timeout`] when the time from [`Session::poll_timeout`] has come
//!   (calling it early is harmless).
//! * Output, after any input: drain [`Session::poll_transmit`] (datagrams to send),
//!   [`Session::poll_deliver`] (packets for the application, in order) and
//!   [`Session::poll_event`] (state changes worth logging); then ask
//!   [`Session::poll_timeout`] again.
//! * Handshakes, optionally ([`Session::offload_handshakes`]): drain
//!   [`Session::poll_handshake`] too, run each [`HandshakeJob`] anywhere (a thread, a
//!   blocking task) and give its result to [`Session::handle_handshake_done`], or give
//!   it back with [`Session::handshake_shed`] when the queue is full. Without the call
//!   the public-key work is done inside [`Session::handle_datagram`] (the simulator).
//!   A driver on real sockets also sets [`Session::set_wall_clock`] (initiation
//!   timestamps).
//! * Addresses, on real sockets: [`Session::set_endpoint`] for every channel first (the
//!   peer's configured address, or `None` to learn it), then
//!   [`Session::handle_datagram_from`] with each datagram's source, and each
//!   [`Transmit`] goes to its [`Transmit::destination`]. A channel's endpoint follows
//!   the peer's authenticated datagrams only ([`Event::EndpointChanged`]); cookies are
//!   bound to each handshake message's source. Without these calls (the simulator)
//!   each channel is one fixed path and `destination` is `None`.
//!
//! Every input takes `now`, an [`Instant`] from the driver's origin.

mod adapt;
pub mod credits;
pub mod crypto;
pub mod demote;
pub mod domains;
mod epoch;
pub mod feedback;
pub mod flows;
mod liveness;
pub mod order;
mod pacing;
pub mod pmtu;
pub mod probe;
pub mod return_path;
pub mod schema;
pub mod settings;
mod stats;
mod streams;

use std::collections::VecDeque;
use std::net::SocketAddr;

use bytes::Bytes;

use crate::aqm::{self, Aqm, AqmConfig};
use crate::config::{MarkerConfig, MarkerPosition, Mode, Policy, ReceiverConfig, MAX_CHANNELS};
use crate::sched::SchedulerKind;
use crate::stripe::TransmitKind;
use crate::time::{Duration, Instant};
use crate::wire::{self, marker, session::Msg};
use crate::{Resequencer, StripeConfig, Striper};

use crate::errctl::link as arq;
pub use crate::errctl::link::{ArqChannelStats, ArqConfig};
pub use adapt::PaceTrace;
pub use credits::{CreditConfig, CreditCounters};
pub use crypto::{
    address_bytes, aes_hardware, index_prefix, plausible_counter, receiver_index, Cipher,
    HandshakeDone, HandshakeFailure, HandshakeJob, HandshakeStats, InitiationReader, SecurityMode,
    ServerCookies, KEY_LEN, PLAUSIBLE_AHEAD, RECEIVING_KEYS,
};
use crypto::{Crypto, Established, Keys, Reject};
pub use demote::{DemoteConfig, Role};
pub use flows::{FlowConfig, FlowPolicy, FlowRule, FlowStats};
pub use liveness::LinkState;
pub use pacing::{PacingConfig, PacingStats};
pub use probe::{ProbeFailure, ProbeState, ProbeStats};
pub use return_path::ReturnPathConfig;
pub use settings::{Mismatch, Settings};
pub use stats::{ChannelInfo, SessionStats};

/// One channel as the session sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelParams {
    /// A name for events and stats.
    pub name: String,
    /// Relative capacity (any unit); SRR quanta and GRR counts are proportional to it.
    pub weight: u32,
}

/// Everything one end of a session needs. Both ends must agree on the channel order,
/// the weights, the scheduler, the mode and the key; the handshake compares what must
/// match ([`Config::settings`], `session::settings`) and refuses a peer that differs.
/// The number of channels may differ (one end's reload added or removed one before the
/// other's): the bond runs over the channels both ends have.
#[derive(Clone, PartialEq)]
pub struct Config {
    /// The channels, in the same order at both ends.
    pub channels: Vec<ChannelParams>,
    /// The largest datagram every channel carries (bytes of UDP payload).
    pub max_datagram: u32,
    /// Receiver mode: logical (header-free, markers), seq, trr or none.
    pub mode: Mode,
    /// Causal scheduler.
    pub scheduler: SchedulerKind,
    /// Pre-shared key material (at least 32 bytes, or empty when static keys are
    /// used); it authenticates the handshake.
    pub key: Vec<u8>,
    /// What the security layer does to data (control is always sealed).
    pub security: SecurityMode,
    /// Ask the peer for AES-256-GCM ([`Cipher`]): the session uses it when both ends
    /// ask, ChaCha20-Poly1305 otherwise. The default: whether this CPU has AES
    /// instructions ([`crypto::aes_hardware`]).
    pub aes_gcm: bool,
    /// Our static X25519 private key (with `peer_public_key`: WireGuard-style keys).
    pub private_key: Option<[u8; KEY_LEN]>,
    /// The peer's static X25519 public key.
    pub peer_public_key: Option<[u8; KEY_LEN]>,
    /// A new handshake (fresh keys) this often.
    pub rekey_after: Duration,
    /// Marker settings.
    pub markers: MarkerConfig,
    /// TRR: triggers every this many data packets.
    pub trigger_every: u32,
    /// Receiver buffer, max wait, equalization, repair.
    pub receiver: ReceiverConfig,
    /// Hello and heartbeat-marker interval.
    pub heartbeat: Duration,
    /// The heartbeat while the session is idle (`idle_after` without application data
    /// either way); equal to `heartbeat`: never slower (`session::liveness`).
    pub idle_heartbeat: Duration,
    /// No application data either way for this long: the session is idle.
    pub idle_after: Duration,
    /// A channel that delivers nothing for this long is declared down.
    pub dead_after: Duration,
    /// A down channel must deliver continuously for this long to be declared up again.
    pub rejoin_after: Duration,
    /// Application packets held while an epoch switch waits for its ack.
    pub queue_packets: usize,
    /// Adaptive weights: the SRR quanta follow what the peer's feedback says each
    /// channel delivers (`session::adapt`); the configured weights are the start. Only
    /// with the srr scheduler in `logical`, `seq` or `none` mode; otherwise ignored.
    /// Off by default (it costs TCP throughput when the configured weights are right;
    /// `docs/lab.md`).
    pub adaptive: bool,
    /// Congestion signals for the traffic we deliver (`aqm`): markers carry our clock,
    /// the peer measures each channel's queueing delay from them, and CoDel marks (ECN
    /// CE) or drops the IP packets it delivers while a queue stands. `None`: off.
    pub aqm: Option<AqmConfig>,
    /// In-bond repair (`errctl::link`): lost sealed datagrams are asked for again and
    /// resent on the fastest channel, below the resequencer, in every mode. Needs
    /// security `encrypt` or `auth` (the sealing counter finds the gaps). `None`: off.
    pub arq: Option<ArqConfig>,
    /// Credit-based flow control per channel (`session::credits`, seed 004): the peer's
    /// receive buffer for each channel is lent out as credit, so skewed channels slow
    /// the sender down instead of overflowing the receiver. `None`: off.
    pub credits: Option<CreditConfig>,
    /// Bad-link demotion (`session::demote`): a channel whose loss makes it a net cost
    /// leaves the transmit set (probes only) and comes back when it recovers. Works in
    /// every mode and with every scheduler (it changes the set through an epoch
    /// switch). `None`: off; on by default.
    pub demote: Option<DemoteConfig>,
    /// Pacing per channel at configured rates, with CoDel on the transmit queue it
    /// builds (`session::pacing`). `None`: off (the default).
    pub pacing: Option<PacingConfig>,
    /// The return path (`session::return_path`): while this direction carries little
    /// more than the acknowledgements of the peer's flow, it rides the channel with the
    /// shortest round trip alone. `None`: off; on by default.
    pub return_path: Option<ReturnPathConfig>,
    /// Flow policies of our transmit direction (`session::flows`): which inner
    /// packets go redundantly or on the lowest-delay channel instead of the stripe.
    pub flows: FlowConfig,
    /// Per-flow order for the TCP segments in the stripe (`session::order`): a segment
    /// the stripe holds only for another packet goes on as soon as it continues its
    /// own flow. On by default.
    pub flow_order: bool,
    /// Path MTU discovery per channel (`session::pmtu`). `None`: off (each channel
    /// carries `max_datagram`); on by default.
    pub pmtu: Option<pmtu::Config>,
    /// TCP carried as byte streams ([`crate::stream`]): this end takes streams (it
    /// says so in the handshake) and may open them to a peer that takes them too.
    /// `None`: off.
    pub streams: Option<crate::stream::StreamConfig>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("channels", &self.channels)
            .field("max_datagram", &self.max_datagram)
            .field("mode", &self.mode)
            .field("scheduler", &self.scheduler)
            .field(
                "key",
                &format_args!("<{} bytes, not shown>", self.key.len()),
            )
            .field("security", &self.security)
            .field("aes_gcm", &self.aes_gcm)
            .field(
                "private_key",
                &self.private_key.map(|_| format_args!("<not shown>")),
            )
            .field("peer_public_key", &self.peer_public_key)
            .field("rekey_after", &self.rekey_after)
            .field("markers", &self.markers)
            .field("trigger_every", &self.trigger_every)
            .field("receiver", &self.receiver)
            .field("heartbeat", &self.heartbeat)
            .field("idle_heartbeat", &self.idle_heartbeat)
            .field("idle_after", &self.idle_after)
            .field("dead_after", &self.dead_after)
            .field("rejoin_after", &self.rejoin_after)
            .field("queue_packets", &self.queue_packets)
            .field("adaptive", &self.adaptive)
            .field("aqm", &self.aqm)
            .field("arq", &self.arq)
            .field("credits", &self.credits)
            .field("demote", &self.demote)
            .field("pacing", &self.pacing)
            .field("return_path", &self.return_path)
            .field("flows", &self.flows)
            .field("flow_order", &self.flow_order)
            .field("pmtu", &self.pmtu)
            .field("streams", &self.streams)
            .finish()
    }
}

impl Config {
    /// These channels with the default settings ([`schema::SessionSettings`]'s, the
    /// same as a configuration file's or a scenario's that sets nothing): SRR, logical
    /// reception with delay equalization, markers at least every 5 ms, heartbeat 50 ms,
    /// down after 300 ms, rejoin after 150 ms; no pacing (the caller sets the channels'
    /// rates).
    pub fn new(channels: Vec<ChannelParams>, max_datagram: u32, key: Vec<u8>) -> Config {
        let mut c = Config {
            channels,
            max_datagram,
            mode: Mode::Logical,
            scheduler: SchedulerKind::Srr,
            key,
            security: SecurityMode::Encrypt,
            aes_gcm: crypto::aes_hardware(),
            private_key: None,
            peer_public_key: None,
            rekey_after: Duration::from_secs(120),
            markers: MarkerConfig::default(),
            trigger_every: 128,
            receiver: ReceiverConfig::default(),
            heartbeat: Duration::from_millis(50),
            idle_heartbeat: Duration::from_secs(1),
            idle_after: Duration::from_secs(2),
            dead_after: Duration::from_millis(300),
            rejoin_after: Duration::from_millis(150),
            queue_packets: 4096,
            adaptive: false,
            aqm: None,
            arq: None,
            credits: None,
            demote: None,
            pacing: None,
            return_path: None,
            flows: FlowConfig::default(),
            flow_order: true,
            pmtu: None,
            streams: None,
        };
        // The defaults are valid for any channel count (a unit test checks it).
        let applied = schema::SessionSettings::default().apply(&mut c);
        debug_assert!(applied.is_ok(), "{applied:?}");
        c
    }

    /// Whether every channel is paced, at a rate or at its measured rate (`probe`
    /// paces a channel without a rate at what it measures).
    pub fn every_channel_paced(&self) -> bool {
        self.pacing
            .as_ref()
            .is_some_and(|p| p.probe || p.rates_bps.iter().all(|&r| r > 0.0))
    }

    /// Whether weights adapt with this configuration (see [`Config::adaptive`]).
    pub fn adapts(&self) -> bool {
        self.adaptive && self.scheduler == SchedulerKind::Srr
    }

    /// Check the configuration; the message names what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        let n = self.channels.len();
        if n == 0 {
            return Err("no channels configured".into());
        }
        if n > MAX_CHANNELS {
            return Err(format!("{n} channels configured; at most {MAX_CHANNELS}"));
        }
        self.check_keys()?;
        self.check_weights()?;
        self.check_arq()?;
        if let Some(c) = &self.credits {
            if self.mode == Mode::None {
                return Err("credits need a resequencing mode (logical, seq or trr)".into());
            }
            c.validate(self.receiver.buffer_packets, n)?;
        }
        if self.heartbeat == Duration::ZERO {
            return Err("heartbeat must be above zero".into());
        }
        if self.streams.is_some() && !self.every_channel_paced() {
            return Err(
                "tcp_streams needs every channel paced (pace = \"auto\", the default, or a rate): \
                 the pacer sets the streams' rate"
                    .into(),
            );
        }
        if let Some(p) = &self.pacing {
            p.validate(self.channels.len())?;
        }
        if let Some(d) = &self.demote {
            d.validate(self.heartbeat)?;
        }
        if let Some(r) = &self.return_path {
            r.validate()?;
        }
        self.flows.validate()?;
        if let Some(m) = &self.pmtu {
            m.validate(n, self.max_datagram)?;
        }
        if self.idle_heartbeat < self.heartbeat {
            return Err(format!(
                "idle_heartbeat ({} ms) must be at least the heartbeat ({} ms)",
                self.idle_heartbeat.as_micros() / 1000,
                self.heartbeat.as_micros() / 1000
            ));
        }
        if self.dead_after < self.heartbeat + self.heartbeat {
            return Err(format!(
                "dead_after ({} ms) must be at least twice the heartbeat ({} ms)",
                self.dead_after.as_micros() / 1000,
                self.heartbeat.as_micros() / 1000
            ));
        }
        self.stripe_config(&(0..n).collect::<Vec<_>>())
            .validate()
            .map_err(|e| e.to_string())
    }

    /// The keying settings: a pre-shared key long enough (or none), the keys the
    /// security mode needs, a rekey interval of at least a second.
    fn check_keys(&self) -> Result<(), String> {
        if !self.key.is_empty() && self.key.len() < KEY_LEN {
            return Err(format!(
                "the pre-shared key has {} bytes; at least {KEY_LEN} random bytes are needed \
                 (`braid genkey` makes one)",
                self.key.len()
            ));
        }
        self.keys().check()?;
        if self.rekey_after < Duration::from_secs(1) {
            return Err("rekey_after must be at least 1 s".into());
        }
        Ok(())
    }

    /// Every channel's weight is at least 1.
    fn check_weights(&self) -> Result<(), String> {
        for (i, c) in self.channels.iter().enumerate() {
            if c.weight == 0 {
                return Err(format!(
                    "channel {i} ({}): weight must be at least 1",
                    c.name
                ));
            }
        }
        Ok(())
    }

    /// In-bond repair, if on: a security mode that seals (it finds losses by the
    /// sealing counter) and a wait above zero.
    fn check_arq(&self) -> Result<(), String> {
        if self.arq.is_some() && self.security == SecurityMode::None {
            return Err(
                "in-bond repair (arq) needs security `encrypt` or `auth`: it finds losses \
                 by the sealing counter"
                    .into(),
            );
        }
        if self.arq.is_some_and(|a| a.wait == Duration::ZERO) {
            return Err("the arq wait must be above zero".into());
        }
        Ok(())
    }

    /// Bytes the mode puts in front of a data packet (5 in seq mode, else 0).
    pub fn data_overhead(&self) -> u32 {
        if self.mode == Mode::Seq {
            wire::seq::HEADER_LEN as u32
        } else {
            0
        }
    }

    /// The largest datagram the striper may make: `max_datagram` less the security
    /// envelope.
    pub fn max_inner(&self) -> u32 {
        self.max_datagram
            .saturating_sub(self.security.data_overhead() as u32)
    }

    /// The key material as the handshake uses it.
    fn keys(&self) -> Keys {
        Keys {
            psk: (!self.key.is_empty())
                .then(|| blake3::derive_key("braid 2026 session pre-shared key v1", &self.key)),
            private: self.private_key,
            peer_public: self.peer_public_key,
        }
    }

    /// The handshake and sealing state for this configuration, seeded with `seed`.
    fn crypto(&self, seed: [u8; 32]) -> Result<Crypto, ConfigError> {
        Crypto::new(
            self.security,
            self.keys(),
            self.rekey_after,
            self.settings(),
            seed,
        )
        .map_err(ConfigError)
    }

    /// The weight adapter, when weights adapt: from the striping configuration `sc`'s
    /// weights and the pacing rates and overhead, if pacing is on.
    fn adapter(&self, sc: &StripeConfig, now: Instant) -> Option<adapt::Adapt> {
        self.adapts().then(|| {
            let rates = self.pacing.as_ref().map_or(&[][..], |p| &p.rates_bps[..]);
            let overhead = self.pacing.as_ref().map_or(0, |p| p.overhead);
            adapt::Adapt::new(sc.weights.clone(), rates, overhead, now)
        })
    }

    /// The settings the peer must share, as the handshake carries them.
    pub fn settings(&self) -> Settings {
        Settings {
            mode: self.mode,
            scheduler: self.scheduler,
            security: self.security,
            aes_gcm: self.aes_gcm,
            max_packet: self.max_inner(),
            credits: self.credits,
            weights: self.channels.iter().map(|c| c.weight).collect(),
            streams: self.streams.as_ref().map(|s| s.run),
        }
    }

    /// The striper/resequencer configuration for an epoch over these channels (indices
    /// into [`Config::channels`], increasing).
    pub fn stripe_config(&self, members: &[usize]) -> StripeConfig {
        self.stripe_config_over(members, self.channels.len())
    }

    /// [`Config::stripe_config`] for a bond over the first `common` channels alone
    /// (those both ends have, when the peer has fewer): the quanta are made from
    /// their weights, as the peer makes them from its own.
    pub fn stripe_config_over(&self, members: &[usize], common: usize) -> StripeConfig {
        let max_packet = self.max_inner();
        let common = common.clamp(1, self.channels.len());
        let all: Vec<u32> = self.channels[..common].iter().map(|c| c.weight).collect();
        let quanta = settings::quanta(self.scheduler, max_packet, &all);
        let weights = members.iter().map(|&i| quanta[i]).collect();
        let mut markers = self.markers;
        markers.timestamps |= self.aqm.is_some();
        if let MarkerPosition::Channel(c) = markers.position {
            if c >= members.len() {
                markers.position = MarkerPosition::End;
            }
        }
        StripeConfig {
            policy: Policy::Causal(self.scheduler),
            weights,
            max_packet,
            mode: self.mode,
            markers,
            trigger_every: self.trigger_every,
            receiver: self.receiver,
        }
    }
}

/// What a datagram from [`Session::poll_transmit`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DatagramKind {
    /// An application packet (header-free or behind a sequence header).
    Data,
    /// A data packet sent again after a NAK.
    Repair,
    /// A marker or trigger.
    Marker,
    /// A hello, epoch end, epoch ack or NAK.
    Control,
    /// One datagram of a capacity probe's train (`session::probe`): send it alone, not
    /// batched with the others into one GSO send, so the link spaces the train.
    Probe,
    /// A path MTU probe (`session::pmtu`): send it alone, with Don't Fragment; if it
    /// is too big for the path (the kernel may say so at once, `EMSGSIZE`), it is
    /// simply lost.
    MtuProbe,
    /// A packet of a redundant or lowest-delay flow (`session::flows`), outside the
    /// stripe; always sealed.
    Flow,
}

/// One datagram to send on one channel.
#[derive(Clone, Debug)]
pub struct Transmit {
    /// Channel index.
    pub channel: usize,
    /// What it is (for counters and tests; the driver just sends the bytes).
    pub kind: DatagramKind,
    /// The whole datagram.
    pub bytes: Bytes,
    /// Where to send it: the channel's endpoint (configured, or learnt from the
    /// peer's authenticated datagrams), or for an answer to a handshake message the
    /// address that message came from. `None` while the driver gives no addresses
    /// (the simulator: each channel is one fixed path).
    pub destination: Option<SocketAddr>,
}

/// A state change worth telling a person about. Drivers log these; the simulator
/// timestamps them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The first handshake with the peer completed.
    PeerHeard,
    /// The peer restarted (a new run, recognised in a confirmed handshake): both
    /// directions start over at epoch 0.
    PeerRestarted,
    /// New keys (a re-key handshake with the same peer run).
    Rekeyed,
    /// Nothing authenticated from the peer on any channel for this long.
    PeerSilent(Duration),
    /// A handshake failed on this channel (from the peer's address): the keys differ,
    /// most likely. The first at once, then at most one every
    /// [`crypto::REPORT_EVERY`] per kind (ours refused, or ours refused by the peer).
    HandshakeFailed {
        /// Channel index.
        channel: usize,
        /// Why. [`HandshakeFailure::is_answer`]: the peer refused our initiation
        /// (unauthenticated: whoever sees our initiation could forge it).
        failure: HandshakeFailure,
        /// Failures of this kind since the last report (this one included).
        count: u64,
    },
    /// The peer's settings differ from ours in one that must match: no session is
    /// made with it. Reported like [`Event::HandshakeFailed`].
    SettingsMismatch {
        /// The first setting that differs, with both values.
        mismatch: Mismatch,
        /// Seen in the answer to our own initiation (authenticated and fresh); else in
        /// the peer's initiation (authenticated, but it may be a replayed old one).
        answer: bool,
        /// Mismatches of this kind since the last report (this one included).
        count: u64,
    },
    /// The peer ended the session on purpose (a close message, [`Session::close`]):
    /// its channels going silent from now on is no failure, and is not reported.
    PeerClosed,
    /// The peer's run has a different number of channels (a reload added or removed
    /// one at one end and not yet at the other): the bond runs over the first
    /// `min(ours, theirs)`, by position; the others stay out of it until both ends
    /// have them (reported once per run of the peer).
    ChannelCountMismatch {
        /// Ours.
        ours: usize,
        /// The peer's.
        theirs: usize,
    },
    /// We no longer hear the peer on this channel.
    ChannelDown {
        /// Channel index.
        channel: usize,
        /// How long it had been silent.
        silent: Duration,
    },
    /// The peer's address on this channel changed (`from: None`: first learnt): a
    /// datagram that authenticated as the peer's, and is the newest yet on the
    /// channel, came from `to` (`Session::handle_datagram_from`). Only such a datagram
    /// moves an endpoint; one that fails authentication or is a replay never does.
    EndpointChanged {
        /// Channel index.
        channel: usize,
        /// The address before (`None`: none was known).
        from: Option<SocketAddr>,
        /// The address from now on.
        to: SocketAddr,
    },
    /// We hear the peer on this channel again.
    ChannelUp {
        /// Channel index.
        channel: usize,
    },
    /// Transmit direction: the channel is a net cost (`session::demote`); it leaves
    /// the transmit set at the next epoch and carries only probes.
    ChannelDemoted {
        /// Channel index.
        channel: usize,
        /// Why, in words.
        reason: String,
    },
    /// Transmit direction: a demoted channel looked healthy long enough; it rejoins
    /// the transmit set at the next epoch.
    ChannelPromoted {
        /// Channel index.
        channel: usize,
    },
    /// Transmit direction: a capacity probe measured the channel's rate
    /// (`session::probe`); it is paced at `pace_bps` from now on.
    ChannelMeasured {
        /// Channel index.
        channel: usize,
        /// The rate measured, bit/s on the wire.
        bps: u64,
        /// The pacing rate it gets, bit/s on the wire.
        pace_bps: u64,
        /// The configured pace is lower than the measurement's share: it is paced at
        /// that.
        capped: bool,
    },
    /// Transmit direction: the channel's capacity probe gave up (`session::probe`);
    /// it stays as configured: paced at `pace_bps`, or unpaced (`None`).
    ChannelProbeFailed {
        /// Channel index.
        channel: usize,
        /// Why.
        reason: probe::ProbeFailure,
        /// Its pace now, bit/s on the wire.
        pace_bps: Option<u64>,
    },
    /// The peer reports hearing us on this channel (`true`) or no longer (`false`).
    PeerHearsUs {
        /// Channel index.
        channel: usize,
        /// Whether it does.
        hears: bool,
    },
    /// Transmit direction: the old epoch ended; new data is held until the receiver
    /// acknowledges the new set.
    TxSwitchStarted {
        /// The epoch that ends.
        epoch: u32,
        /// Its channel set (bit mask).
        from: u64,
        /// The proposed set.
        to: u64,
        /// Data packets sent in the old epoch.
        sent: u64,
    },
    /// Transmit direction: the pending switch now proposes another set.
    TxRetarget {
        /// The epoch being started.
        epoch: u32,
        /// The new proposal.
        to: u64,
    },
    /// Transmit direction: a new epoch is in force.
    TxEpoch {
        /// The epoch.
        epoch: u32,
        /// Its channel set.
        set: u64,
        /// Packets that were held during the switch.
        held: usize,
    },
    /// Receive direction: the peer ended our receive epoch; waiting for its end on the
    /// new channels.
    RxEpochEnding {
        /// The epoch that ends.
        epoch: u32,
    },
    /// Receive direction: a new epoch is in force.
    RxEpoch {
        /// The epoch.
        epoch: u32,
        /// Its channel set.
        set: u64,
    },
    /// Transmit direction: path MTU discovery (`session::pmtu`) changed the largest
    /// datagram the channel carries; [`Session::path_max_packet`] says what the bond
    /// carries now.
    PathMtu {
        /// Channel index.
        channel: usize,
        /// Its PLPMTU before (sealed datagram bytes, UDP payload).
        from: u32,
        /// Its PLPMTU now.
        to: u32,
    },
    /// Transmit direction: the return path (`session::return_path`) is cut to this
    /// channel alone (`Some`) or back to every channel (`None`), at the next epoch.
    ReturnPath {
        /// The channel, or `None` for all of them again.
        channel: Option<usize>,
        /// Why, in words.
        reason: String,
    },
}

/// The channels of a bit mask, increasing.
pub fn members_of(set: u64) -> Vec<usize> {
    (0..64).filter(|&c| set & bit(c) != 0).collect()
}

fn bit(c: usize) -> u64 {
    1u64 << c
}

/// Why [`Session::new`] refused a configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid session configuration: {0}")]
pub struct ConfigError(pub String);

/// One end of a striping session. See the module docs for the call order.
pub struct Session {
    cfg: Config,
    n: usize,
    all: u64,
    /// The channels the bond runs over: the first `common`, those both ends have
    /// (ours, or fewer when the peer's run has fewer; `Session::on_new_peer`).
    common: usize,
    crypto: Crypto,
    chans: Vec<liveness::Chan>,
    tx: epoch::Tx,
    rx: epoch::Rx,
    peer: liveness::Peer,
    out: VecDeque<Transmit>,
    /// The most `out` held lately: its room after a burst is given back.
    out_room: crate::room::Room,
    deliver: VecDeque<Bytes>,
    events: VecDeque<Event>,
    /// Number of our last heartbeat's hellos (24 bits, wrapping).
    hello_seq: u32,
    counters: stats::Counters,
    adapt: Option<adapt::Adapt>,
    /// Quanta per physical channel set by [`Session::set_weights`], if any.
    set_quanta: Option<Vec<u32>>,
    /// Since when the peer has reported no loss on any channel (`None`: no report
    /// since the striper started): the markers thin out after [`liveness::QUIET_AFTER`].
    loss_free_since: Option<Instant>,
    aqm: Option<Aqm>,
    /// In-bond repair: per channel, what we receive and what we sent.
    arq_rx: Vec<arq::LinkReceiver>,
    /// What the repair receiver released for one datagram (kept empty between them).
    arq_released: Vec<(Bytes, Instant)>,
    /// When in-bond repair last found a datagram missing on any channel.
    last_gap: Option<Instant>,
    /// While the channels have not yet shown that they lose nothing: when the session
    /// started, and per channel the datagrams it brought in order since. `None` once
    /// every channel of the peer's set has brought [`CLEAN_PROOF`] (or after
    /// [`MARGIN_AFTER_GAP`]).
    unproven: Option<(Instant, Vec<u64>)>,
    arq_tx: Vec<arq::LinkSender>,
    /// Credits for our transmit direction (what the peer lends us) and our receive
    /// direction (what we lend the peer), for the current epochs.
    credit_tx: Option<credits::Tx>,
    /// Pacing per channel, if on.
    pacer: Option<pacing::Pacer>,
    /// The return path's state.
    return_path: return_path::ReturnPath,
    /// Flow policies and the real-time packets' numbers (`session::flows`).
    flows: flows::Flows,
    /// Per-flow order of the TCP segments in the stripe, if on.
    order: Option<order::FlowOrder>,
    /// Capacity probes: our trains and the peer's.
    probes: probe::Probes,
    /// Path MTU discovery per channel (empty: off).
    pmtu: Vec<pmtu::Chan>,
    /// The number of our last MTU probe.
    pmtu_id: u32,
    credit_rx: Option<credits::Rx>,
    /// Credit counters of past epochs, and the session's own.
    credit_n: CreditCounters,
    /// Per channel: the peer's address (`Session::set_endpoint`, then learnt).
    endpoints: Vec<Option<SocketAddr>>,
    /// The driver gives addresses: a datagram for a channel whose endpoint is not
    /// known yet is not sent. Off in the simulator.
    addressed: bool,
    /// Channels whose uplink the driver says is gone ([`Session::set_uplink`]): down
    /// at once, out of the transmit set, nothing sent on them.
    uplink_down: u64,
    /// TCP carried as byte streams, if on at this end ([`Config::streams`]).
    streams: Option<crate::stream::Streams>,
    /// The peer's streams run, if it takes streams (its handshake said so).
    peer_streams: Option<u64>,
    /// The streams' unsent bytes when they last put frames into the stripe (they are
    /// out of `streams` while they do): part of the backlog the return path judges.
    streams_unsent: u64,
    /// The latest `now` we were given.
    clock: Instant,
    next_hello: Instant,
    next_rate: Instant,
    /// When application data last went out or came in (`session::liveness`).
    last_active: Instant,
    /// Hellos at the idle heartbeat: nothing has flowed for `idle_after`.
    idle: bool,
}

impl Session {
    /// A session end with this configuration. `seed` feeds every random choice
    /// (ephemeral keys, the run identifier, key indices): 32 bytes from the operating
    /// system on real sockets, from the scenario seed in the simulator. `now` is the
    /// driver's current time.
    pub fn new(mut cfg: Config, seed: [u8; 32], now: Instant) -> Result<Session, ConfigError> {
        cfg.validate().map_err(ConfigError)?;
        if let Some(st) = cfg.streams.as_mut().filter(|s| s.run == 0) {
            st.run = crypto::streams_run(&seed);
        }
        let n = cfg.channels.len();
        let all = if n == 64 { u64::MAX } else { bit(n) - 1 };
        let members: Vec<usize> = (0..n).collect();
        let sc = cfg.stripe_config(&members);
        let striper = Striper::new(sc.clone()).map_err(|e| ConfigError(e.to_string()))?;
        let reseq = Resequencer::new(&sc).map_err(|e| ConfigError(e.to_string()))?;
        let credit_rx = match &cfg.credits {
            Some(c) => Some(credits::Rx::new(c, n, 0).map_err(ConfigError)?),
            None => None,
        };
        let mut s = Session {
            n,
            all,
            common: n,
            crypto: cfg.crypto(seed)?,
            chans: (0..n).map(|_| liveness::Chan::new(now)).collect(),
            tx: epoch::Tx::new(all, members, striper, n),
            rx: epoch::Rx::new(all, reseq, n),
            peer: liveness::Peer::new(all),
            out: VecDeque::new(),
            out_room: crate::room::Room::new(),
            deliver: VecDeque::new(),
            events: VecDeque::new(),
            hello_seq: 0,
            counters: stats::Counters::default(),
            adapt: cfg.adapter(&sc, now),
            set_quanta: None,
            loss_free_since: None,
            aqm: cfg.aqm.map(|a| Aqm::new(a, n)),
            arq_rx: (0..n).map(|_| arq::LinkReceiver::default()).collect(),
            arq_released: Vec::new(),
            last_gap: None,
            // Until the channels have shown they lose nothing, they may: the margin is on.
            unproven: Some((now, vec![0; n])),
            arq_tx: (0..n).map(|_| arq::LinkSender::default()).collect(),
            credit_tx: cfg.credits.map(|c| credits::Tx::new(&c, n, 0)),
            pacer: cfg
                .pacing
                .as_ref()
                .map(|p| pacing::Pacer::new(p, cfg.max_datagram, now)),
            return_path: return_path::ReturnPath::default(),
            flows: flows::Flows::new(cfg.flows.clone()),
            order: cfg.flow_order.then(order::FlowOrder::default),
            probes: probe::Probes::new(n, cfg.pacing.as_ref().is_some_and(|p| p.probe)),
            pmtu: cfg.pmtu.as_ref().map_or_else(Vec::new, |m| {
                (0..n)
                    .map(|c| pmtu::Chan::new(m, c, cfg.max_datagram))
                    .collect()
            }),
            pmtu_id: 0,
            credit_rx,
            credit_n: CreditCounters::default(),
            endpoints: vec![None; n],
            addressed: false,
            uplink_down: 0,
            clock: now,
            next_hello: now,
            next_rate: now + Duration::from_secs(1),
            last_active: now,
            idle: false,
            streams: cfg.streams.clone().map(crate::stream::Streams::new),
            peer_streams: None,
            streams_unsent: 0,
            cfg,
        };
        // Adaptive weights may start elsewhere than the configured ones (from the
        // pacing rates): the striper, like the peer's resequencer, starts from the
        // configured ones and its markers carry the change.
        s.reapply_quanta();
        Ok(s)
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Our run identifier (random; the peer recognises a restart by a new one).
    pub fn run_id(&self) -> u64 {
        self.crypto.run()
    }

    /// Have we completed a handshake with the peer?
    pub fn peer_seen(&self) -> bool {
        self.peer.seen
    }

    /// The handshake counters (cheap; [`Session::stats`] has them too).
    pub fn handshake_stats(&self) -> &HandshakeStats {
        &self.crypto.stats
    }

    /// The cipher of the keys we send with (agreed in the handshake); `None` before
    /// the first handshake.
    pub fn cipher(&self) -> Option<Cipher> {
        self.crypto.cipher()
    }

    /// The largest application packet [`Session::handle_packet`] accepts when it does
    /// not start with a byte `0xB0..=0xBF` (those need a one-byte escape in the
    /// header-free modes, so one byte less).
    pub fn max_packet(&self) -> usize {
        (self.cfg.max_inner() - self.cfg.data_overhead()) as usize
    }

    /// The largest application packet the bond carries now: [`Session::max_packet`],
    /// or with path MTU discovery (`session::pmtu`) the smallest channel PLPMTU less
    /// the same overheads, if lower. It changes with [`Event::PathMtu`]; a driver
    /// sizes its TUN device, clamps TCP's MSS and answers larger packets with ICMP by
    /// it. [`Session::handle_packet`] still takes up to [`Session::max_packet`], but
    /// a larger packet than this may be lost on a channel's path.
    pub fn path_max_packet(&self) -> usize {
        // Over the channels both ends have: one the peer's run lacks carries nothing,
        // whatever size an earlier run left it at.
        let Some(smallest) = self.pmtu.iter().take(self.common).map(|m| m.plpmtu).min() else {
            return self.max_packet();
        };
        self.sealed_room(smallest)
            .saturating_sub(self.cfg.data_overhead()) as usize
    }

    /// The bytes a datagram of at most `mtu` bytes carries inside the security
    /// envelope (before any header of the stripe's or a flow datagram's).
    fn sealed_room(&self, mtu: u32) -> u32 {
        mtu.min(self.cfg.max_datagram)
            .saturating_sub(self.cfg.security.data_overhead() as u32)
    }

    /// A packet from the application. While an epoch switch waits for its ack, up to
    /// `queue_packets` packets are held; beyond that, and for packets the striper
    /// refuses, the packet is dropped and counted (`queue_drops`).
    pub fn handle_packet(&mut self, now: Instant, p: Bytes) {
        self.clock = self.clock.max(now);
        self.counters.sent_packets += 1;
        self.counters.sent_bytes += p.len() as u64;
        self.active(now);
        // Real-time flows leave at once, outside the stripe (`session::flows`).
        if self.flow_out(now, &p) {
            return;
        }
        self.stripe_in(now, p);
    }

    /// The stripe stage: a packet (or a stream frame) for the striper, now or after
    /// the packets held before it.
    fn stripe_in(&mut self, now: Instant, p: Bytes) {
        let gated = self.credit_tx.is_some() || self.pacer.is_some();
        let waiting = gated && !self.tx.pending.is_empty();
        if self.tx.switching.is_some() || !self.crypto.ready() || waiting {
            if self.tx.pending.len() < self.cfg.queue_packets {
                self.tx.pending.push_back((p, now));
            } else {
                self.counters.queue_drops += 1;
            }
            if waiting {
                self.pump(now);
                self.return_path_backlog(now);
            }
            return;
        }
        if !self.take_credit(now, &p) {
            // No credit or no tokens on the channel the striper names next: the packet
            // waits (and everything after it, so the stripe keeps its order).
            self.tx.pending.push_back((p, now));
            self.return_path_backlog(now);
            return;
        }
        if self.tx.striper.handle_packet(now, p).is_err() {
            self.counters.queue_drops += 1;
        }
        self.take_transmits();
    }

    /// Credits on: take one for the channel `p` will go on (`true`: send it now).
    /// Credits off: always `true`.
    fn take_credit(&mut self, now: Instant, p: &Bytes) -> bool {
        if self.credit_tx.is_none() && self.pacer.is_none() {
            return true;
        }
        let k = self.tx.striper.next_channel(p);
        let phys = self.tx.members.get(k).copied().unwrap_or(0);
        if let Some(pc) = &mut self.pacer {
            let quantum = self.tx.striper.quantum(k).unwrap_or(0) as usize;
            if !pc.ready_in_round(now, phys, quantum) {
                pc.stats.waits += 1;
                return false;
            }
        }
        let Some(ct) = &mut self.credit_tx else {
            return true;
        };
        // The striper may put a marker and a trigger on the channel just before the
        // packet; they take their credit after it is counted, so keep room for them.
        ct.send
            .try_send_keeping(now, phys, credits::PRECEDING)
            .is_ok()
    }

    /// Send the held packets the current epoch and the credits allow, in order.
    fn pump(&mut self, now: Instant) {
        if self.tx.switching.is_some() || !self.crypto.ready() {
            return;
        }
        while let Some((p, queued)) = self.tx.pending.front() {
            let (p, queued) = (p.clone(), *queued);
            if !self.take_credit(now, &p) {
                break;
            }
            self.tx.pending.pop_front();
            // Its time in this queue is the bond's congestion: CoDel on it (a copy of
            // the packet only to mark it).
            // (Not on a stream frame: its stream slows down through credits.)
            let signal = self
                .pacer
                .as_mut()
                .is_some_and(|pc| pc.on_dequeue(now, queued))
                && !wire::stream::is_frame(&p);
            let p = match &mut self.pacer {
                Some(pc) if signal => {
                    let mut b = p.to_vec();
                    if !pc.signal(&mut b) {
                        continue;
                    }
                    Bytes::from(b)
                }
                _ => p,
            };
            if self.tx.striper.handle_packet(now, p).is_err() {
                self.counters.queue_drops += 1;
            }
            // Count the markers the striper put before this packet now, before the
            // next packet asks for credit (they use credit up).
            self.take_transmits();
        }
        self.take_transmits();
    }

    /// A datagram received on channel `c` (from the channel's one fixed path: the
    /// simulator; a driver with sockets uses [`Session::handle_datagram_from`]).
    pub fn handle_datagram(&mut self, now: Instant, c: usize, d: Bytes) {
        self.datagram(now, c, None, d);
    }

    /// A datagram received on channel `c` from `source`. If it authenticates as the
    /// peer's (an accepted handshake initiation or response, or a sealed datagram whose
    /// tag verifies, not a replay, the newest yet on the channel) and `source` is not
    /// the channel's endpoint, the endpoint moves there at once
    /// ([`Event::EndpointChanged`]): the peer roamed, or a NAT on the path mapped it
    /// anew. Anything else leaves the endpoint alone; answers to handshake messages
    /// go back to their source.
    pub fn handle_datagram_from(&mut self, now: Instant, c: usize, source: SocketAddr, d: Bytes) {
        self.datagram(now, c, Some(source), d);
    }

    /// The peer's address on channel `c` to start with (`None`: not known; it is
    /// learnt from the first authenticated datagram that comes on the channel, and
    /// nothing is sent on it before). Calling it says the driver gives addresses:
    /// call it for every channel before anything else, and use
    /// [`Session::handle_datagram_from`] and [`Transmit::destination`].
    pub fn set_endpoint(&mut self, c: usize, addr: Option<SocketAddr>) {
        if c >= self.n {
            return;
        }
        self.addressed = true;
        self.endpoints[c] = addr;
        if let Some(a) = addr {
            self.crypto
                .set_channel_address(c, &crypto::address_bytes(a));
        }
    }

    /// The peer's address on channel `c`, if known.
    pub fn endpoint(&self, c: usize) -> Option<SocketAddr> {
        self.endpoints.get(c).copied().flatten()
    }

    /// An authenticated, fresh datagram came on channel `c` from `source`.
    fn learn(&mut self, c: usize, source: Option<SocketAddr>) {
        let Some(to) = source else { return };
        let from = self.endpoints[c];
        if from == Some(to) {
            return;
        }
        self.endpoints[c] = Some(to);
        if from.is_some() {
            self.chans[c].n.endpoint_changes += 1;
        }
        self.events.push_back(Event::EndpointChanged {
            channel: c,
            from,
            to,
        });
    }

    /// A datagram's walk in: counted on its channel, then by its first byte a
    /// handshake message, a sealed one (open → repair → resequence → deliver), a bare
    /// one in mode `none` (resequence → deliver), or refused.
    fn datagram(&mut self, now: Instant, c: usize, source: Option<SocketAddr>, d: Bytes) {
        self.clock = self.clock.max(now);
        let Some(first) = self.count_arrival(c, &d) else {
            return;
        };
        match first {
            wire::TYPE_HS_INIT | wire::TYPE_HS_RESP => self.on_handshake(now, c, source, &d),
            wire::TYPE_SEALED | wire::TYPE_SIGNED => {
                if let Some((sealed_for, inner)) = self.open_sealed(now, c, source, &d) {
                    self.repair(now, c, sealed_for, &d, inner);
                }
            }
            // Mode `none`: data travel bare. They go to the resequencer but do not count
            // as hearing the peer (anyone can send them).
            _ if self.crypto.mode == SecurityMode::None
                && !wire::is_authenticated_control(first) =>
            {
                self.chans[c].n.rx_data += 1;
                self.chans[c].fb_rx.accepted(d.len());
                self.order_arrival(now, c, &d);
                self.resequence(c, d, now, now, false);
            }
            _ => self.chans[c].n.unauthenticated += 1,
        }
        self.order_timeout(now);
        self.handle_streams(now);
    }

    /// Counts a datagram that came on channel `c` and returns its first byte (its
    /// type); `None` when it is not a known channel or the datagram is empty (counted
    /// malformed).
    fn count_arrival(&mut self, c: usize, d: &Bytes) -> Option<u8> {
        if c >= self.n {
            return None;
        }
        let n = &mut self.chans[c].n;
        n.rx_datagrams += 1;
        n.rx_bytes += d.len() as u64;
        let first = d.first().copied();
        if first.is_none() {
            n.malformed += 1;
        }
        first
    }

    /// The open stage: a sealed (or signed) datagram that came on channel `c` from
    /// `source`, opened and checked. Returns the channel it was sealed for and its
    /// contents, after noting what an authentic datagram tells;
    /// `None` when it is refused (counted by why).
    fn open_sealed(
        &mut self,
        now: Instant,
        c: usize,
        source: Option<SocketAddr>,
        d: &Bytes,
    ) -> Option<(usize, Bytes)> {
        match self.open(c, d) {
            Ok((sealed_for, inner, established)) => {
                self.on_authentic(now, c, source, sealed_for, established);
                // A path MTU probe counts for nothing of the channel's traffic.
                if sealed_for == c && self.crypto.lane != wire::secure::LANE_PROBE {
                    self.on_channel_own(now, c, d.len(), &inner);
                }
                Some((sealed_for, inner))
            }
            Err(r) => {
                let n = &mut self.chans[c].n;
                match r {
                    Reject::Unauthenticated => n.unauthenticated += 1,
                    Reject::BadTag => n.auth_failures += 1,
                    Reject::Replay => n.replays += 1,
                    Reject::Malformed => n.malformed += 1,
                }
                None
            }
        }
    }

    /// What an authentic datagram, come on channel `c` from `source` and sealed for
    /// channel `sealed_for`, tells of the peer: where it is, a (re)established
    /// session, that it and the channel are alive.
    fn on_authentic(
        &mut self,
        now: Instant,
        c: usize,
        source: Option<SocketAddr>,
        sealed_for: usize,
        established: Option<Established>,
    ) {
        // Not a repair sealed for another channel, not a late one: where the peer is
        // now.
        if sealed_for == c && self.crypto.newest {
            self.learn(c, source);
        }
        if let Some(e) = established {
            self.on_established(now, e);
        }
        self.peer.last = Some(now);
        self.peer.silent_warned = false;
        self.heard(c, now);
    }

    /// An authentic datagram of `len` bytes sealed for channel `c` came on `c` (not
    /// as a repair): its bytes count for the feedback and the AQM, and a marker's or
    /// trigger's send time is the AQM's sample.
    fn on_channel_own(&mut self, now: Instant, c: usize, len: usize, inner: &Bytes) {
        self.chans[c].fb_rx.accepted(len);
        if let Some(aqm) = &mut self.aqm {
            aqm.on_bytes(now, c, len);
        }
        self.stamp(now, c, inner);
    }

    /// The repair stage: with in-bond repair, the opened datagram `d` (come on channel
    /// `c`, sealed for `sealed_for`) goes through its channel's repair receiver, which
    /// passes on, in counter order, what is no longer held behind a gap; without it (or
    /// when `d` carries no counters) its contents go straight on.
    fn repair(&mut self, now: Instant, c: usize, sealed_for: usize, d: &Bytes, inner: Bytes) {
        if self.crypto.lane == wire::secure::LANE_PROBE {
            // A path MTU probe: its own counter, never repaired (`session::pmtu`).
            self.on_inner(now, now, c, inner, false);
            return;
        }
        self.order_arrival(now, sealed_for, &inner);
        match (self.cfg.arq, sealed_id(d)) {
            (Some(a), Some(id)) => self.repair_in_order(now, c, sealed_for, a, id, inner),
            _ => self.on_inner(now, now, c, inner, false),
        }
    }

    /// In-bond repair of one opened datagram, numbered `(key, counter)` = `id`, come
    /// on channel `c` and sealed for `sealed_for`: held or passed on by the repair
    /// receiver with what it released, gaps it found noted, and requests for missing
    /// datagrams sent.
    fn repair_in_order(
        &mut self,
        now: Instant,
        c: usize,
        sealed_for: usize,
        a: ArqConfig,
        (key, counter): (u32, u64),
        inner: Bytes,
    ) {
        // The list of what was released is kept between datagrams (no allocation).
        let mut out = std::mem::take(&mut self.arq_released);
        let rx = &mut self.arq_rx[sealed_for];
        let (missing, stale) = (rx.stats.missing, rx.stats.stale);
        if inner.first() == Some(&wire::TYPE_SESSION)
            && inner.get(2) == Some(&wire::session::KIND_END)
        {
            rx.fence(key, counter);
        }
        // Control that needs no order is not held behind a gap.
        let urgent = needs_no_order(&inner);
        self.arq_rx[sealed_for].accept(now, a.wait, key, counter, inner, urgent, &mut out);
        let found = self.arq_rx[sealed_for].stats.missing - missing;
        // Sealed before an epoch end that is passed: the old epoch's, too late for it.
        self.counters.stray_drops += self.arq_rx[sealed_for].stats.stale - stale;
        if found > 0 {
            self.on_gaps(now, sealed_for, found);
        } else if let Some((_, seen)) = &mut self.unproven {
            seen[sealed_for] += 1;
        }
        // A repair: it came on another channel than the one it was sealed for.
        // (Feedback is never held behind a gap, so a report in `out` is this
        // datagram's own.)
        let repaired = sealed_for != c;
        for (i, arrived) in out.drain(..) {
            self.on_inner(now, arrived, sealed_for, i, repaired);
        }
        self.arq_released = out;
        self.arq_requests(now);
    }

    /// In-bond repair found `found` datagrams sealed for channel `c` missing.
    fn on_gaps(&mut self, now: Instant, c: usize, found: u64) {
        self.last_gap = Some(now);
        // Repaired or not, a drop behind a standing queue is congestion: the AQM passes
        // it on to the traffic, and the feedback tells the sender (whose bad-link
        // demotion must not take it for a bad link).
        if let Some(aqm) = &mut self.aqm {
            if aqm.on_loss(now, c, found) {
                self.chans[c].fb_rx.congested += found;
            }
        }
    }

    /// A handshake message: answer it on the channel it came on, to its source.
    fn on_handshake(&mut self, now: Instant, c: usize, source: Option<SocketAddr>, d: &Bytes) {
        let o = self.crypto.on_handshake_from(now, c, source, d);
        self.apply(now, c, source, o);
    }

    /// What a handshake message (or its public-key work) from `source` led to.
    fn apply(&mut self, now: Instant, c: usize, source: Option<SocketAddr>, o: crypto::Outcome) {
        if o.authenticated {
            self.learn(c, source);
        }
        if let Some(r) = o.reply {
            self.out.push_back(Transmit {
                channel: c,
                kind: DatagramKind::Control,
                bytes: r,
                destination: source,
            });
        }
        if let Some((failure, count)) = o.failure {
            self.events.push_back(Event::HandshakeFailed {
                channel: c,
                failure,
                count,
            });
        }
        if let Some((mismatch, answer, count)) = o.mismatch {
            self.events.push_back(Event::SettingsMismatch {
                mismatch,
                answer,
                count,
            });
        }
        if let Some(e) = o.established {
            self.on_established(now, e);
            // Hellos at once, sealed with the new keys: they confirm the handshake at
            // the responder.
            self.send_hellos();
        }
    }

    /// Each key a sealed datagram may name now: its local index and, per channel, its
    /// receive window's top, then per channel its probe lane's (`wire::secure`) (see [`crypto::plausible_counter`]). Cheap; a driver that
    /// filters datagrams before queueing them calls it whenever it has fed the session.
    pub fn receive_windows(&self, each: impl FnMut(u32, &mut dyn Iterator<Item = u64>)) {
        self.crypto.receive_windows(each);
    }

    /// Hand the public-key work of initiations to the driver from now on
    /// ([`Session::poll_handshake`]), so that it can run off the data path; without
    /// this call it is done at once, inside [`Session::handle_datagram`].
    pub fn offload_handshakes(&mut self) {
        self.crypto.offload();
    }

    /// Every key index this session chooses from now on has `prefix` as its high 16
    /// bits: a server running one session per peer on shared sockets routes a sealed
    /// datagram (or a response) to its session by the index it carries
    /// ([`receiver_index`], [`index_prefix`]).
    pub fn set_key_index_prefix(&mut self, prefix: u16) {
        self.crypto.set_index_prefix(prefix);
    }

    /// The next public-key work of a handshake to run: [`HandshakeJob::run`] (on any
    /// thread), then [`Session::handle_handshake_done`]. A driver that cannot take it
    /// (its queue is full) gives it back with [`Session::handshake_shed`].
    pub fn poll_handshake(&mut self) -> Option<HandshakeJob> {
        self.crypto.poll_job()
    }

    /// The result of a [`HandshakeJob`].
    pub fn handle_handshake_done(&mut self, now: Instant, done: HandshakeDone) {
        self.clock = self.clock.max(now);
        let (c, source) = (done.channel(), done.source());
        let mut o = crypto::Outcome::default();
        self.crypto.on_done(now, done, &mut o);
        self.apply(now, c, source, o);
    }

    /// A [`HandshakeJob`] the driver could not run: forgotten (counted as shed).
    pub fn handshake_shed(&mut self, job: HandshakeJob) {
        self.crypto.shed(job);
    }

    /// The wall clock: `unix_nanos` nanoseconds since 1970 at `now`. The timestamps of
    /// our initiations are this plus the time since (the peer accepts an initiation
    /// only if it is newer than the last it accepted). Without it they count from
    /// `Instant::ZERO`, which suits the simulator.
    pub fn set_wall_clock(&mut self, now: Instant, unix_nanos: u128) {
        self.crypto.set_wall_clock(now, unix_nanos);
    }

    /// The peer's address on channel `c`, as any bytes that name it (the driver's
    /// socket address): the cookies we give under load are bound to it.
    pub fn set_channel_address(&mut self, c: usize, addr: &[u8]) {
        self.crypto.set_channel_address(c, addr);
    }

    fn on_established(&mut self, now: Instant, e: Established) {
        if e.first || e.restart {
            // Idle time counts from the handshake: one that took longer than
            // `idle_after` must not start the session at the idle heartbeat.
            self.active(now);
            self.on_new_peer(now, e.restart, e.peer_channels);
            self.streams_on_new_peer(e.restart, e.peer_streams);
        } else {
            self.events.push_back(Event::Rekeyed);
        }
        self.pump(now);
    }

    /// An authenticated datagram's contents, by kind: control to its handler, data
    /// (markers, triggers) to the resequence stage; `arrived` is when it came (earlier
    /// than `now` when in-bond repair held it).
    /// `repaired`: it came as an in-bond repair, later than it was sent.
    fn on_inner(&mut self, now: Instant, arrived: Instant, c: usize, inner: Bytes, repaired: bool) {
        match inner.first().copied() {
            Some(wire::TYPE_SESSION) if wire::flow::is_flow(&inner) => {
                self.active(now);
                self.on_flow(now, c, inner)
            }
            Some(wire::TYPE_SESSION) => self.on_ctrl(c, &inner, now, arrived, repaired),
            Some(wire::TYPE_CREDIT) => self.on_credit(now, c, &inner),
            Some(wire::TYPE_NAK) => {
                // The peer's receiver asks our striper for lost packets.
                if self.tx.switching.is_none() {
                    self.tx.striper.handle_nak(&inner);
                    self.take_transmits();
                }
            }
            Some(wire::TYPE_MARKER) => {
                self.chans[c].n.rx_markers += 1;
                self.resequence(c, inner, now, arrived, repaired)
            }
            Some(wire::TYPE_TRIGGER) => {
                self.chans[c].n.rx_triggers += 1;
                self.resequence(c, inner, now, arrived, repaired)
            }
            Some(_) => {
                self.chans[c].n.rx_data += 1;
                self.active(now);
                self.resequence(c, inner, now, arrived, repaired)
            }
            None => self.chans[c].n.malformed += 1,
        }
    }

    /// Open a sealed datagram that arrived on channel `c`: on `c`, or (with in-bond
    /// repair) on the channel whose missing counter it carries, when it is a repair sent
    /// on another channel. Returns the channel it was sealed for.
    fn open(&mut self, c: usize, d: &Bytes) -> Result<(usize, Bytes, Option<Established>), Reject> {
        let first = match self.crypto.open(self.clock, c, d) {
            Ok((inner, e)) => return Ok((c, inner, e)),
            Err(r) => r,
        };
        if self.cfg.arq.is_none() || !matches!(first, Reject::Replay | Reject::BadTag) {
            return Err(first);
        }
        let Some((key, counter)) = sealed_id(d) else {
            return Err(first);
        };
        for other in 0..self.n {
            if other != c && self.arq_rx[other].is_missing(key, counter) {
                if let Ok((inner, e)) = self.crypto.open(self.clock, other, d) {
                    return Ok((other, inner, e));
                }
            }
        }
        Err(first)
    }

    /// The AQM's sample: a marker's (or trigger's) send time, at its arrival on
    /// channel `c`.
    fn stamp(&mut self, now: Instant, c: usize, inner: &Bytes) {
        let Some(aqm) = &mut self.aqm else {
            return;
        };
        let stamp = match inner.first() {
            Some(&wire::TYPE_MARKER) => marker::Packet::new_checked(&inner[..])
                .ok()
                .and_then(|p| p.stamp()),
            Some(&wire::TYPE_TRIGGER) => wire::trigger::Packet::new_checked(&inner[..])
                .ok()
                .and_then(|p| p.stamp()),
            _ => None,
        };
        if let Some(t) = stamp {
            aqm.on_stamp(now, c, t);
        }
    }

    /// The channel that is up with the smallest smoothed round trip (the lowest index
    /// while none is measured), preferring any other than `avoid`.
    fn fastest(&self, avoid: Option<usize>) -> Option<usize> {
        self.fastest_of(avoid, |_| true)
    }

    /// [`Session::fastest`] among the channels `ok` accepts.
    fn fastest_of(&self, avoid: Option<usize>, ok: impl Fn(usize) -> bool) -> Option<usize> {
        (0..self.n)
            .filter(|&c| self.chans[c].state != LinkState::Down && ok(c))
            .min_by_key(|&c| {
                (
                    Some(c) == avoid,
                    self.chans[c].demote.role != Role::Active,
                    self.chans[c].fb_tx.srtt().unwrap_or(Duration::from_secs(1)),
                    c,
                )
            })
    }

    /// In-bond repair: give up what waited too long, pass on what that frees, and ask
    /// for what is missing, on the fastest other channel (asked again after about its
    /// round trip while still missing).
    fn arq_requests(&mut self, now: Instant) {
        if self.cfg.arq.is_none() {
            return;
        }
        for lost in 0..self.n {
            if self.arq_rx[lost].is_quiet() {
                continue;
            }
            // Not on the channel that lost it (its queue may be what overflowed).
            let via = self.repair_path(lost);
            // Its base round trip, not the smoothed one a standing queue inflates; and
            // at least three asks within the wait.
            let wait = self.cfg.arq.map_or(Duration::ZERO, |a| a.wait);
            let every = via
                .and_then(|c| self.chans[c].fb_tx.rtt_min())
                .map_or(Duration::from_millis(50), |r| {
                    Duration::from_micros(r.as_micros() * 3 / 2 + 5_000)
                })
                .min(Duration::from_micros(wait.as_micros() / 3));
            let mut out = Vec::new();
            self.arq_rx[lost].release(now, &mut out);
            for (i, arrived) in out {
                self.on_inner(now, arrived, lost, i, false);
            }
            for (key_index, counters) in
                self.arq_rx[lost].requests(now, every, wire::session::RESEND_MAX)
            {
                let via = via.unwrap_or(lost);
                self.send_ctrl(
                    via,
                    &Msg::Resend(wire::session::Resend {
                        channel: via as u8,
                        lost_channel: lost as u8,
                        key_index,
                        counters,
                    }),
                );
            }
        }
    }

    /// The channel a resend request for channel `lost` takes (and a repair, when no
    /// other channel was heard lately: [`Session::repair_channel`]): the fastest
    /// other channel heard within two heartbeats, else the fastest that is up. A
    /// channel cut a moment ago stays up until `dead_after` (300 ms), longer than the
    /// repair's wait (200 ms): requests and repairs sent on it were lost, and every
    /// loss on the others in that time was given up.
    fn repair_path(&self, lost: usize) -> Option<usize> {
        let recent = Duration::from_micros(self.cfg.heartbeat.as_micros() * 2);
        self.fastest_of(Some(lost), |c| {
            self.chans[c]
                .last_rx
                .is_some_and(|t| self.clock.saturating_since(t) <= recent)
        })
        .or_else(|| self.fastest(Some(lost)))
    }

    /// The channel a repair of `len` bytes for channel `lost` goes on: the one where it
    /// arrives first, counting what the channel's pacer still owes (the repairs sent on
    /// it a moment ago, which bypass the transmit queue) and half its smoothed round
    /// trip, among the other channels heard within two heartbeats. The fastest channel
    /// by round trip alone took every repair: a burst of losses on an 80 Mbit/s link of
    /// a simulated 8-channel bond was resent on a 5 Mbit/s one (the lowest delay), its
    /// pacer then owed a second and more, and the stripe, which waits in order for
    /// each channel's tokens, stalled behind it: 0.62 of the offered load delivered.
    fn repair_channel(&self, lost: usize, len: usize) -> Option<usize> {
        let recent = Duration::from_micros(self.cfg.heartbeat.as_micros() * 2);
        let arrival = |c: usize| {
            let wait = self
                .pacer
                .as_ref()
                .and_then(|pc| pc.backlog_after(self.clock, c, len))
                .unwrap_or(Duration::ZERO);
            let srtt = self.chans[c].fb_tx.srtt().unwrap_or(Duration::from_secs(1));
            wait + Duration::from_micros(srtt.as_micros() / 2)
        };
        (0..self.n)
            .filter(|&c| {
                c != lost
                    && self.chans[c].state != LinkState::Down
                    && self.chans[c]
                        .last_rx
                        .is_some_and(|t| self.clock.saturating_since(t) <= recent)
            })
            .min_by_key(|&c| (self.chans[c].demote.role != Role::Active, arrival(c), c))
            .or_else(|| self.repair_path(lost))
    }

    /// With in-bond repair and delay equalization, the equalizer holds everything a
    /// little longer while the channels lose datagrams: about what a repair takes (the
    /// fastest channel's round trip, plus 5 ms to see the gap), so a repaired loss costs
    /// the traffic no stall and TCP sees a steady round trip (a stall at each repair ends
    /// its slow start early: HyStart).
    ///
    /// Only while the channels lose datagrams: within [`MARGIN_AFTER_GAP`] of the last
    /// datagram found missing (the heartbeats are sealed too, so an idle lossy channel
    /// keeps showing gaps). On channels that lose nothing the margin would only add a
    /// round trip to every packet (a ping over a 40 ms path took 85 ms through a bond
    /// with repair on, 40 without it).
    ///
    /// And from the start, until every channel the peer sends on has brought
    /// [`CLEAN_PROOF`] datagrams in order (at most [`MARGIN_AFTER_GAP`]): in the twin of
    /// the lab's bursty-loss row, TRR made 0.71 of the ceiling when the margin came on
    /// at the first loss, in TCP's slow start, and 1.01 with it on from the start. It
    /// used to stay on for the whole [`MARGIN_AFTER_GAP`] after the start, whatever the
    /// channels showed: every flow of a tunnel's first 30 s paid it, and on short paths
    /// that is most of the round trip (a bond of two 50 Mbit/s, 10 ms links: TCP's
    /// round trip 72 ms instead of 21, and 79 Mbit/s instead of 89 in the lab). A flow
    /// brings the proof within a second; an idle tunnel's heartbeats alone do not
    /// within the 30 s.
    ///
    /// The round trip is the channel's *minimum*, not its smoothed one: the smoothed
    /// one counts the channel's standing queue, which the traffic already waits in, so
    /// the margin grew with every queue TCP's slow start built and TCP saw the queue
    /// twice (in the lab, a round trip rising from 155 to 207 ms at a third of the
    /// bond's rate, and HyStart leaving slow start there). A repair that meets a queue
    /// stalls the traffic for that queue's time instead, which is what TCP would see
    /// on one link.
    fn repair_margin(&mut self) {
        if self.cfg.arq.is_none() || !self.cfg.receiver.equalize {
            return;
        }
        let recent = |t: Instant| self.clock.saturating_since(t) < MARGIN_AFTER_GAP;
        if let Some((start, seen)) = &self.unproven {
            // (An empty set, between epochs, proves nothing.)
            let set = self.rx.set;
            let proven = set != 0
                && (0..self.n)
                    .filter(|&c| set & bit(c) != 0)
                    .all(|c| seen.get(c).is_some_and(|&k| k >= CLEAN_PROOF));
            if proven || !recent(*start) {
                self.unproven = None;
            }
        }
        let lossy = self.last_gap.is_some_and(recent) || self.unproven.is_some();
        if !lossy {
            self.rx.reseq.set_hold_margin(Duration::ZERO);
            return;
        }
        let rtt = self
            .fastest(None)
            .and_then(|c| self.chans[c].fb_tx.rtt_min());
        if let Some(r) = rtt {
            self.rx.reseq.set_hold_margin(r + Duration::from_millis(5));
        }
    }

    /// The peer asks for sealed datagrams again: the same bytes, each on the channel
    /// where it arrives first ([`Session::repair_channel`]).
    fn on_resend(&mut self, r: &wire::session::Resend) {
        let lost = r.lost_channel as usize;
        if self.cfg.arq.is_none() || lost >= self.n {
            return;
        }
        // Each repair on the channel where it arrives first, after the ones before it.
        for &k in &r.counters {
            let len = self.arq_tx[lost].len_of(r.key_index, k).unwrap_or(0);
            let via = self.repair_channel(lost, len).unwrap_or(lost);
            // Once per round trip of the path a repair takes (there on `via`, the
            // request back on the peer's fastest: about `via`'s smoothed round trip,
            // which counts its standing queue): a request repeated sooner has not seen
            // the last copy. A quarter more for jitter: the peer asks again every 1.5
            // base round trips, so its last request before the repair arrived reaches
            // us about a round trip after the repair left.
            let srtt = self.chans[via]
                .fb_tx
                .srtt()
                .unwrap_or(RESEND_HOLDOFF)
                .max(RESEND_HOLDOFF);
            let rtt = srtt + Duration::from_micros(srtt.as_micros() / 4);
            if let Ok(b) = self.arq_tx[lost].take_for_resend(self.clock, r.key_index, k, rtt) {
                if let Some(pc) = &mut self.pacer {
                    pc.charge(self.clock, via, b.len());
                }
                self.out.push_back(Transmit {
                    channel: via,
                    kind: DatagramKind::Repair,
                    bytes: b,
                    destination: None,
                });
                self.out_room.note(self.out.len());
            }
        }
    }

    /// When [`Session::handle_timeout`] wants to be called.
    pub fn poll_timeout(&self) -> Instant {
        let mut d = self.next_hello.min(self.next_rate);
        if let Some(a) = &self.adapt {
            d = d.min(a.next);
        }
        if self.tx.switching.is_none() {
            if let Some(t) = self.tx.striper.poll_timeout() {
                d = d.min(t);
            }
        }
        if let Some(t) = self.rx.reseq.poll_timeout() {
            d = d.min(t);
        }
        for r in &self.arq_rx {
            if let Some(t) = r.next_timeout() {
                d = d.min(t);
            }
        }
        if let Some(t) = self.credit_timeout() {
            d = d.min(t);
        }
        if let Some(t) = self.pacing_timeout() {
            d = d.min(t);
        }
        if let Some(t) = self.flows.next_timeout() {
            d = d.min(t);
        }
        if let Some(t) = self.streams_timeout() {
            d = d.min(t);
        }
        if let Some(t) = self.order.as_ref().and_then(order::FlowOrder::next_timeout) {
            d = d.min(t);
        }
        d
    }

    /// Pacing: when the channel the next held packet goes on has tokens again.
    fn pacing_timeout(&self) -> Option<Instant> {
        let pc = self.pacer.as_ref()?;
        if self.tx.switching.is_some() {
            return None;
        }
        let (p, _) = self.tx.pending.front()?;
        let k = self.tx.striper.next_channel(p);
        pc.ready_at(self.tx.members.get(k).copied()?)
    }

    /// Time passed: markers, receiver timeouts, hellos and liveness that are due.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.clock = self.clock.max(now);
        if self.tx.switching.is_none() {
            self.tx.striper.handle_timeout(now);
            self.take_transmits();
        }
        self.arq_requests(now);
        self.rx.reseq.handle_timeout(now);
        self.flows_expire(now);
        self.drain_deliver(now);
        self.order_timeout(now);
        self.credit_timers(now);
        if self.pacer.is_some() && !self.tx.pending.is_empty() {
            self.pump(now);
        }
        if now >= self.next_hello {
            self.idle = self.quiet(now);
            self.next_hello = now + self.hello_interval();
            self.heartbeat(now);
            self.repair_margin();
        }
        if now >= self.next_rate {
            self.next_rate = now + Duration::from_secs(1);
            self.rates();
        }
        if self.adapt.as_ref().is_some_and(|a| now >= a.next) {
            self.adapt_weights(now);
        }
        self.handle_streams(now);
    }

    /// One step of the weight controller (`session::adapt`).
    fn adapt_weights(&mut self, now: Instant) {
        let Some(a) = &mut self.adapt else {
            return;
        };
        let est: Vec<_> = self.chans.iter().map(|c| c.fb_tx.estimate()).collect();
        let max_packet = self.tx.striper.config().max_packet;
        let stale_after = self.cfg.heartbeat + self.cfg.heartbeat + self.cfg.heartbeat;
        let unstriped: Vec<_> = self.chans.iter().map(|c| c.unstriped).collect();
        a.unstriped(now, &unstriped);
        if let Some(q) = a.step(now, &self.tx.members, &est, max_packet, stale_after) {
            if self.tx.switching.is_none() {
                // Refused only if the quanta do not fit the striper: then keep the old.
                let _ = self.tx.striper.set_quanta(&q);
            }
        }
        // Adaptive pacing: the pacer follows the rates the controller set.
        if let (Some(rates), Some(pc)) = (a.pace_rates(), &mut self.pacer) {
            for (c, &r) in rates.iter().enumerate() {
                if pc.rate_bps(c).is_some_and(|old| old != r) {
                    pc.set_rate(now, c, r);
                }
            }
        }
        // A measured channel that uses all it may without a queue: its link may have
        // become faster than it was measured; measure it again (`session::probe`).
        if self.probes.measures() {
            for c in a.capped() {
                self.probes.remeasure(c, now);
            }
        }
    }

    /// A new striper (new epoch): it starts from the configured weights, as the peer's
    /// new resequencer does; the adapted (or [`Session::set_weights`]) quanta follow at
    /// its first marker batch.
    fn reapply_quanta(&mut self) {
        let q = match (&self.adapt, &self.set_quanta) {
            (Some(a), _) => a.of(&self.tx.members),
            (None, Some(w)) => self.tx.members.iter().map(|&c| w[c]).collect(),
            (None, None) => return,
        };
        if self.tx.striper.quanta().as_ref() != Some(&q) {
            let _ = self.tx.striper.set_quanta(&q);
        }
    }

    /// New relative weights of the channels (one per configured channel, each > 0), in
    /// place of the configured ones, from now on: the SRR quanta become proportional
    /// to them (the smallest equal to the largest packet), in this epoch from the
    /// striper's next marker batch (the markers carry them to the peer) and in every
    /// later epoch. With adaptive weights they are the controller's new start. Only
    /// the srr scheduler in `logical`, `seq` or `none` mode, like adaptive weights.
    /// (The overlay moves a channel to another path with this.)
    pub fn set_weights(&mut self, weights: &[u32]) -> Result<(), ConfigError> {
        if weights.len() != self.n || weights.contains(&0) {
            return Err(ConfigError(format!(
                "set_weights: {} weights for {} channels, each at least 1",
                weights.len(),
                self.n
            )));
        }
        if self.cfg.scheduler != SchedulerKind::Srr {
            return Err(ConfigError(
                "set_weights: only with the srr scheduler".into(),
            ));
        }
        let max_packet = u64::from(self.tx.striper.config().max_packet);
        let min = u64::from(*weights.iter().min().unwrap_or(&1));
        let q: Vec<u32> = weights
            .iter()
            .map(|&w| {
                (max_packet * u64::from(w))
                    .div_ceil(min)
                    .min(u64::from(u32::MAX)) as u32
            })
            .collect();
        if let Some(a) = &mut self.adapt {
            a.quanta = q.clone();
        }
        self.set_quanta = Some(q);
        if self.tx.switching.is_none() {
            self.reapply_quanta();
        }
        Ok(())
    }

    /// Packets held in the session's receive buffers and its switch queue: what it
    /// holds in memory for the peer's traffic and the application's.
    pub fn buffered(&self) -> usize {
        self.rx.reseq.buffered()
            + self.tx.pending.len()
            + self
                .arq_rx
                .iter()
                .map(arq::LinkReceiver::held)
                .sum::<usize>()
    }

    /// Fuzzing only: seal `inner` for channel `c` with our current keys, as if we had
    /// sent it (the peer will take it as authentic). `None` without keys.
    #[cfg(feature = "fuzz")]
    pub fn seal_for_fuzzing(&mut self, c: usize, inner: &[u8]) -> Option<Bytes> {
        let encrypt = self.crypto.mode != SecurityMode::Auth;
        self.crypto
            .seal(self.clock, c.min(self.n - 1), &[inner], encrypt)
    }

    /// The next datagram to send. With addresses ([`Session::set_endpoint`]), what
    /// is for a channel whose endpoint is not known yet is dropped (a server waits to
    /// be reached).
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        let Some(mut t) = self.out.pop_front() else {
            // Drained: the room of a burst (a probe's train) is not kept for good.
            if let Some(keep) = self.out_room.check(self.clock, self.out.capacity()) {
                self.out.shrink_to(keep);
            }
            return None;
        };
        loop {
            // A channel whose uplink is gone sends nothing (`Session::set_uplink`), nor
            // one with no address of the peer to send to.
            let gone = self.uplink_down & bit(t.channel) != 0;
            if !gone && self.addressed {
                t.destination = t.destination.or(self.endpoints[t.channel]);
            }
            if !gone && (!self.addressed || t.destination.is_some()) {
                break;
            }
            self.chans[t.channel].n.tx_discarded += 1;
            t = self.out.pop_front()?;
        }
        let n = &mut self.chans[t.channel].n;
        n.tx_datagrams += 1;
        n.tx_bytes += t.bytes.len() as u64;
        Some(t)
    }

    /// The next packet for the application, in order.
    pub fn poll_deliver(&mut self) -> Option<Bytes> {
        self.deliver.pop_front()
    }

    /// The next state change.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Put a datagram on channel `c` through the security layer: sealed, or bare for
    /// data in mode `none`. Without keys yet, it is not sent (counted).
    fn emit(&mut self, c: usize, kind: DatagramKind, inner: Bytes) {
        self.emit_parts(c, kind, &[], inner);
    }

    /// [`Session::emit`] of the datagram `header` then `payload`, sealed from the two
    /// parts (no copy of them joined first).
    fn emit_parts(&mut self, c: usize, kind: DatagramKind, header: &[u8], payload: Bytes) {
        if self.uplink_down & bit(c) != 0 {
            // Not sealed either: a counter used on a datagram that never leaves is a
            // gap the peer's repair would wait for when the channel is back.
            self.chans[c].n.tx_discarded += 1;
            return;
        }
        let bytes = match (self.crypto.mode, kind) {
            (SecurityMode::None, DatagramKind::Data | DatagramKind::Repair) => {
                if header.is_empty() {
                    payload
                } else {
                    self.crypto.arena.join(self.clock, &[header, &payload])
                }
            }
            (mode, _) => match self.crypto.seal(
                self.clock,
                c,
                &[header, &payload],
                mode != SecurityMode::Auth,
            ) {
                Some(b) => b,
                None => {
                    self.counters.unsent += 1;
                    return;
                }
            },
        };
        if self.cfg.arq.is_some() && self.crypto.mode != SecurityMode::None {
            if let Some((key, counter)) = sealed_id(&bytes) {
                // A probe's datagram is not kept for repair: the receiver times only
                // the datagrams that arrived and ignores a repaired one (`on_probe`),
                // and a train is 48 of the channel's largest datagrams, which every
                // new session (and every channel that comes back) sends.
                if kind == DatagramKind::Probe {
                    self.arq_tx[c].sealed_unkept(self.clock, key, counter);
                } else {
                    self.arq_tx[c].push(self.clock, key, counter, &bytes);
                }
            }
        }
        if let Some(pc) = &mut self.pacer {
            pc.charge(self.clock, c, bytes.len());
        }
        if kind != DatagramKind::Data {
            let u = &mut self.chans[c].unstriped;
            *u = (u.0 + bytes.len() as u64, u.1 + 1);
        }
        self.out.push_back(Transmit {
            channel: c,
            kind,
            bytes,
            destination: None,
        });
        self.out_room.note(self.out.len());
    }

    fn send_ctrl(&mut self, c: usize, m: &Msg) {
        self.emit(c, DatagramKind::Control, Bytes::from(m.to_vec()));
    }

    fn take_transmits(&mut self) {
        while let Some(mut t) = self.tx.striper.poll_transmit() {
            let phys = self.tx.members[t.channel];
            let n = &mut self.chans[phys].n;
            let kind = match t.kind {
                TransmitKind::Data => DatagramKind::Data,
                TransmitKind::Repair => DatagramKind::Repair,
                TransmitKind::Marker | TransmitKind::Trigger => DatagramKind::Marker,
            };
            match t.kind {
                TransmitKind::Data | TransmitKind::Repair => n.tx_data += 1,
                TransmitKind::Marker => n.tx_markers += 1,
                TransmitKind::Trigger => n.tx_triggers += 1,
            }
            if t.kind != TransmitKind::Data {
                // Data took its credit before it was striped; the rest does not wait.
                if let Some(ct) = &mut self.credit_tx {
                    ct.send.count_unmetered(phys);
                }
            }
            let payload = std::mem::take(&mut t.payload);
            self.emit_parts(phys, kind, t.header(), payload);
        }
    }

    /// The deliver stage: what the resequencer has put in order goes to the
    /// application (past the AQM, which may mark or drop it), the credits that are
    /// due go out, and so do NAKs for the losses it asks to have repaired.
    fn drain_deliver(&mut self, now: Instant) {
        while let Some(b) = self.rx.reseq.poll_deliver() {
            if self.stream_frame_in(now, &b) {
                continue;
            }
            if let Some(o) = &mut self.order {
                if !o.on_delivered(now, &b) {
                    // Its twin went ahead (per-flow order).
                    continue;
                }
            }
            self.hand_to_app(now, b);
            // What it let go of its flow follows it at once, before anything the
            // stripe delivers next.
            self.order_flush(now);
        }
        self.credit_sync(now);
        // Losses to repair (seq mode): the NAK goes to the peer's striper on every
        // channel that is not down, so the fastest one gets it there first.
        while let Some(nak) = self.rx.reseq.poll_nak() {
            for c in 0..self.n {
                if self.chans[c].state != LinkState::Down {
                    self.emit(c, DatagramKind::Control, nak.clone());
                }
            }
        }
    }

    /// A packet in order for the application, past the AQM (which may mark or drop it).
    fn hand_to_app(&mut self, now: Instant, b: Bytes) {
        match &mut self.aqm {
            None => self.deliver.push_back(b),
            Some(aqm) => {
                if !aqm.signals(now) {
                    self.deliver.push_back(b);
                    return;
                }
                // CoDel marks the packet CE in place: take it back as owned bytes
                // (a copy when others share its buffer, as opened datagrams do).
                let mut m = bytes::BytesMut::from(b);
                if aqm.signal(&mut m) == aqm::Verdict::Deliver {
                    self.deliver.push_back(m.freeze());
                }
            }
        }
    }

    /// Per-flow order (`session::order`): a data packet `inner`, sealed for channel
    /// `c`, arrived and is about to enter in-bond repair and the stripe; a TCP segment
    /// among them is watched, to go ahead of the stripe's order when it continues its
    /// flow, no earlier than the delay equalizer would let it go for the channels'
    /// skew.
    fn order_arrival(&mut self, now: Instant, c: usize, inner: &Bytes) {
        let Some(o) = &mut self.order else {
            return;
        };
        // The packet past a sequence header, if any.
        let at = match inner.first() {
            Some(b) if matches!(b >> 4, 4 | 6) => 0,
            Some(&(wire::TYPE_SEQ_DATA | wire::TYPE_REPAIR)) => 5,
            _ => return,
        };
        let Some(k) = self.rx.index.get(c).copied().flatten() else {
            return;
        };
        let skew = self.rx.reseq.equalizer_skew(now, k);
        o.on_arrival(now, now + skew, inner, at);
    }

    /// Per-flow order: the watched segments now due that continue their flows go to
    /// the application.
    fn order_timeout(&mut self, now: Instant) {
        if let Some(o) = &mut self.order {
            if o.next_timeout().is_some_and(|t| t <= now) {
                o.handle_timeout(now);
                self.order_flush(now);
            }
        }
    }

    /// What per-flow order released goes to the application.
    fn order_flush(&mut self, now: Instant) {
        while let Some(b) = self.order.as_mut().and_then(order::FlowOrder::poll_release) {
            self.hand_to_app(now, b);
        }
    }

    /// The flows' counters, with per-flow order's.
    pub(crate) fn flow_stats(&self) -> FlowStats {
        let mut f = self.flows.stats.clone();
        if let Some(o) = &self.order {
            f.rx_early = o.stats.released;
        }
        f
    }

    /// The resequence stage: a packet for the resequencer (then the deliver stage,
    /// [`Session::drain_deliver`]); `repaired`: it came as an in-bond repair (after
    /// the datagrams sent after it, so no FIFO order tells its epoch).
    fn resequence(&mut self, c: usize, pkt: Bytes, now: Instant, arrived: Instant, repaired: bool) {
        if self.rx.pending.is_some() && self.rx.end_seen & bit(c) != 0 {
            // After the old epoch's end on `c`: the new epoch's, once acknowledged (a
            // late repair is the old epoch's, too late for it).
            if repaired || !self.keep_early(c, pkt, arrived) {
                self.counters.stray_drops += 1;
            }
            return;
        }
        match self.rx.index[c] {
            Some(k) => {
                if let Some(cr) = &mut self.credit_rx {
                    // Markers and triggers are stored whatever the credit.
                    let metered =
                        !matches!(pkt.first(), Some(&(wire::TYPE_MARKER | wire::TYPE_TRIGGER)));
                    if !cr.admit(now, c, metered, &mut self.credit_n) {
                        return;
                    }
                }
                self.rx.reseq.handle_datagram_at(now, arrived, k, pkt);
                self.drain_deliver(now);
            }
            None => self.counters.stray_drops += 1,
        }
    }

    fn on_new_peer(&mut self, now: Instant, restart: bool, peer_channels: usize) {
        self.flows_on_new_peer();
        for m in &mut self.pmtu {
            m.peer_new();
        }
        // A run of the peer with another channel list (a reload added or removed a
        // channel at one end): the bond runs over the channels both have.
        let common = self.n.min(peer_channels.max(1));
        let resized = common != self.common;
        self.common = common;
        if peer_channels != self.n {
            self.events.push_back(Event::ChannelCountMismatch {
                ours: self.n,
                theirs: peer_channels,
            });
        }
        if restart {
            self.events.push_back(Event::PeerRestarted);
            self.reset_epochs(now);
            self.probes.again(None);
            if let Some(aqm) = &mut self.aqm {
                aqm.peer_restarted();
            }
        } else {
            self.events.push_back(Event::PeerHeard);
            if resized {
                // Nothing was striped yet: both directions start over the common
                // channels.
                self.reset_epochs(now);
            }
        }
        let gone = self.uplink_down;
        for (i, c) in self.chans.iter_mut().enumerate() {
            if i >= common {
                // The peer has no such channel (yet): out of the bond, nothing heard.
                if c.state != LinkState::Down {
                    c.state = LinkState::Down;
                    c.since = now;
                }
                c.last_rx = None;
                c.run_start = None;
                c.peer_hears_us = false;
                continue;
            }
            if gone & bit(i) != 0 {
                // Its uplink is gone (`Session::set_uplink`): it stays down.
                continue;
            }
            c.state = LinkState::Up;
            c.since = now;
            c.last_rx = Some(now);
            c.run_start = None;
            c.peer_hears_us = true;
        }
        self.peer.mask = self.common_set();
        self.peer.report_at = None;
        self.peer.seen = true;
        // A new run numbers its hellos from the start.
        self.peer.hello_seq = None;
        self.peer.interval = Duration::ZERO;
        self.peer.faster_at = None;
        self.peer.closed = false;
        // The set is every channel again: those whose uplink is gone leave it now.
        self.maybe_switch(now);
    }

    /// A session message; `arrived` and `repaired` as for [`Session::on_inner`].
    fn on_ctrl(&mut self, c: usize, pkt: &[u8], now: Instant, arrived: Instant, repaired: bool) {
        let Ok(m) = Msg::parse(pkt) else {
            self.chans[c].n.malformed += 1;
            return;
        };
        if m.channel() as usize != c {
            self.chans[c].n.malformed += 1;
            return;
        }
        match m {
            Msg::Hello(h) => self.on_hello(c, h, now),
            Msg::End(e) => self.rx_on_end(c, e, now),
            Msg::Ack(a) => self.tx_on_ack(a, now),
            // Timed by its arrival, not by when it is processed: the same instant
            // unless in-bond repair held it (it holds no report behind a gap of the
            // current keys), and a repaired report is passed over.
            Msg::Feedback(f) => self.on_feedback(c, f, arrived, repaired),
            Msg::Resend(r) => self.on_resend(&r),
            Msg::Probe(p) => self.on_probe(c, &p, arrived, repaired),
            Msg::ProbeReport(r) => self.on_probe_report(now, c, &r),
            Msg::Close(_) => self.on_close(),
            Msg::MtuProbe(p) => self.on_mtu_probe(c, &p),
            Msg::MtuAck(a) => self.on_mtu_ack(now, c, &a),
        }
    }
}

/// The counters of a sealed datagram: (key index, counter), if it is one. In-bond
/// repair numbers datagrams by them (`errctl::link`).
fn sealed_id(d: &[u8]) -> Option<(u32, u64)> {
    let h = wire::secure::Header::parse(d).ok()?;
    Some((h.index, u64::from(h.counter)))
}

/// Whether a datagram's contents `inner` are control that needs no order, so in-bond
/// repair does not hold them behind a gap: a NAK, a session message other than an
/// epoch end, a credit (not a check: a check counts the data before it).
fn needs_no_order(inner: &[u8]) -> bool {
    match inner.first() {
        Some(&wire::TYPE_NAK) => true,
        Some(&wire::TYPE_SESSION) => inner.get(2) != Some(&wire::session::KIND_END),
        Some(&wire::TYPE_CREDIT) => inner.get(2) == Some(&wire::credit::KIND_CREDIT),
        _ => false,
    }
}

/// Least spacing of the answers to requests for one datagram, while the repair path's
/// round trip is not measured (and its floor).
const RESEND_HOLDOFF: Duration = Duration::from_millis(10);

/// How long after in-bond repair last found a datagram missing (or after the session
/// started) the equalizer keeps its repair margin (`Session::repair_margin`).
pub const MARGIN_AFTER_GAP: Duration = Duration::from_secs(30);

/// Datagrams each channel brings in order, from the start, before the equalizer's repair
/// margin comes off (`Session::repair_margin`). A link losing 1 % at random shows a gap
/// in that many with a probability of 1 − 0.99^1000 (all but certain); one losing 2 %
/// in bursts of 5 (a burst every 250 datagrams) with 0.98. A flow at 20 Mbit/s brings
/// them in 0.6 s.
pub const CLEAN_PROOF: u64 = 1000;

#[cfg(test)]
mod tests;
