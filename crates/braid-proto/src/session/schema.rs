//! The settings schema: every key of a `[session]` table, in one typed struct with one
//! set of defaults.
//!
//! The tunnel's configuration file (`braid tunnel`, `braid send`/`recv`), the overlay
//! node's flows and the simulator's scenarios all read their `[session]` table into
//! [`SessionSettings`] and turn it into the session machine's [`Config`] with
//! [`SessionSettings::apply`]: a setting is added here once and reaches all of them.
//! [`Config::new`] starts from [`SessionSettings::default`], so a session built in code
//! runs the same defaults as one read from a file. [`REFERENCE`] documents every key;
//! `docs/settings.md` is generated from it (a test fails when the two disagree).
//!
//! The TOML is flat (`aqm_target`, not `[session.aqm] target`) so that existing files
//! keep working; in code each concern has its own typed configuration, built from the
//! keys that belong to it by one method below ([`SessionSettings::aqm`],
//! [`SessionSettings::demote`], …).

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::flows::{FlowConfig, FlowPolicy, FlowRule};
use super::{ArqConfig, Config, CreditConfig, DemoteConfig, ReturnPathConfig, SecurityMode};
use crate::aqm::AqmConfig;
use crate::config::{MarkerConfig, Mode};
use crate::sched::SchedulerKind;
use crate::time::Duration;
use crate::units;

/// In-bond repair's wait when `arq` is unset: about the slowest channel's round trip
/// on a bond of common links, plus a margin (chosen by measurement, issue 28: with
/// AQM it holds a bond with a lossy link near its ceiling).
pub const ARQ_WAIT: Duration = Duration::from_millis(200);
/// The longest heartbeat: the hellos are each channel's keepalive, and NATs commonly
/// forget an idle UDP mapping after 30 s.
pub const MAX_HEARTBEAT: Duration = Duration::from_secs(25);

/// A duration as a settings file spells it (`50ms`, `2m`; `docs/units.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl Dur {
    fn ms(ms: u64) -> Dur {
        Dur(Duration::from_millis(ms))
    }
}

impl std::fmt::Display for Dur {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let us = self.0.as_micros();
        match us {
            0 => write!(f, "0s"),
            _ if us.is_multiple_of(60_000_000) => write!(f, "{}m", us / 60_000_000),
            _ if us.is_multiple_of(1_000_000) => write!(f, "{}s", us / 1_000_000),
            _ if us.is_multiple_of(1000) => write!(f, "{}ms", us / 1000),
            _ => write!(f, "{us}us"),
        }
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Dur, D::Error> {
        let s = String::deserialize(d)?;
        units::parse_duration_us(&s)
            .map(Dur)
            .map_err(D::Error::custom)
    }
}

/// Serde for the named enums (receiver mode, scheduler, security mode): the names
/// `docs/units.md` lists.
macro_rules! by_name {
    ($module:ident, $ty:ty, $name:expr, $parse:expr) => {
        mod $module {
            use super::*;
            pub fn serialize<S: Serializer>(v: &$ty, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str($name(v))
            }
            pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<$ty, D::Error> {
                let s = String::deserialize(d)?;
                $parse(&s).map_err(D::Error::custom)
            }
        }
    };
}
by_name!(mode_name, Mode, |m: &Mode| m.name(), units::parse_mode);
by_name!(
    scheduler_name,
    SchedulerKind,
    |k: &SchedulerKind| k.name(),
    units::parse_scheduler
);
by_name!(
    security_name,
    SecurityMode,
    |m: &SecurityMode| m.name(),
    |s: &str| SecurityMode::from_name(s.trim())
        .ok_or_else(|| format!("unknown security mode '{s}': expected encrypt, auth or none"))
);

/// Every setting of a session (the `[session]` table). Unknown keys are refused; a
/// key left out takes the default given here, the same in the tunnel, the node and
/// the simulator. `Option` fields without a default value are either secrets and
/// files (which only the tunnel reads) or tunings whose default follows from other
/// settings (said on each).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionSettings {
    // --- keys (the tunnel, send and recv; the simulator uses a fixed key) ---
    /// The pre-shared key, base64 (`braid genkey`), inline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// A file holding the pre-shared key (relative to the configuration file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<String>,
    /// A file holding our static private key (WireGuard-style keys).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub private_key_file: Option<String>,
    /// The peer's static public key, base64.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_public_key: Option<String>,
    // --- security ---
    /// What the security layer does to data.
    #[serde(with = "security_name")]
    pub security: SecurityMode,
    /// The AEAD to ask the peer for: `auto`, `chacha20-poly1305` or `aes-256-gcm`.
    pub cipher: String,
    /// Acknowledges that `security = "none"` is insecure.
    pub allow_insecure: bool,
    /// Fresh keys (a new handshake) this often.
    pub rekey_after: Dur,
    // --- striping (in a scenario these come from the run, [markers] and [receiver]) ---
    /// Receiver mode.
    #[serde(with = "mode_name")]
    pub mode: Mode,
    /// Causal scheduler.
    #[serde(with = "scheduler_name")]
    pub scheduler: SchedulerKind,
    /// Markers every this many rounds (0: no periodic markers).
    pub marker_every_rounds: u32,
    /// Where markers go in the round.
    pub marker_position: String,
    /// Markers once after this long without data (0s: never).
    pub marker_idle: Dur,
    /// Markers at least this often while data flows (0s: rounds only).
    pub marker_interval: Dur,
    /// Markers this often instead while the peer reports no loss (0s: always
    /// `marker_interval`).
    pub marker_interval_quiet: Dur,
    /// TRR: a trigger every this many data packets.
    pub trigger_every: u32,
    /// Delay equalization at the receiver.
    pub equalize: bool,
    /// How long the receiver waits for a missing packet.
    pub max_wait: Dur,
    /// Packets held per channel at the receiver.
    pub buffer_packets: usize,
    // --- liveness ---
    /// Hello and heartbeat-marker interval.
    pub heartbeat: Dur,
    /// The heartbeat of an idle session (equal to `heartbeat`: never slower).
    pub idle_heartbeat: Dur,
    /// No application data either way for this long: the session is idle.
    pub idle_after: Dur,
    /// A channel silent this long is down.
    pub dead_after: Dur,
    /// A down channel must deliver this long to rejoin.
    pub rejoin_after: Dur,
    /// Application packets held while an epoch switch waits for its ack.
    pub queue_packets: usize,
    // --- weights and pacing ---
    /// Adaptive weights; unset: on when every channel is paced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<bool>,
    /// Tokens a paced channel may save up, as time at its rate.
    pub pace_burst: Dur,
    /// CoDel on the pacer's transmit queue.
    pub pace_codel: bool,
    // --- congestion signals (AQM) ---
    /// CoDel on each channel's queueing delay, with ECN marks.
    pub aqm: bool,
    /// CoDel target; unset: 5 ms scaled to the bond's round trip.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aqm_target: Option<Dur>,
    /// CoDel interval; unset: 100 ms scaled to the bond's round trip.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aqm_interval: Option<Dur>,
    /// Drop (rather than only mark) packets that are not ECN-capable.
    pub aqm_loss_signal: bool,
    // --- repair ---
    /// In-bond repair: how long a lost datagram is waited for (0s: off); unset:
    /// [`ARQ_WAIT`], off with security `none`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arq: Option<Dur>,
    /// The old name of `arq`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repair: Option<Dur>,
    // --- credits (seed 004) ---
    /// Credit-based flow control per channel.
    pub credits: bool,
    /// Credits per channel; unset: the receive buffer less the markers' room.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credit_window: Option<u32>,
    /// A shared pool for adaptive allocation; unset: none (static windows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credit_pool: Option<u32>,
    // --- bad links and the return path ---
    /// Bad-link demotion.
    pub demote: bool,
    /// Loss share above which a channel is a net cost.
    pub demote_loss: f64,
    /// How long a channel must be bad before it leaves.
    pub demote_after: Dur,
    /// How long a demoted channel must be good before it returns.
    pub promote_after: Dur,
    /// Round-trip ratio (to the fastest channel) that demotes (0: off).
    pub demote_rtt_ratio: f64,
    /// The return path: acknowledgements ride the fastest channel alone.
    pub return_path: bool,
    /// Path MTU discovery per channel (`session::pmtu`).
    pub pmtu: bool,
    // --- flows (session::flows) ---
    /// Automatic classification of real-time flows.
    pub flow_auto: bool,
    /// Channels a redundant packet goes on.
    pub flow_copies: usize,
    /// Policy overrides by protocol, port, address and DSCP (`[[session.flow]]`).
    pub flow: Vec<FlowRuleSettings>,
    /// Per-flow order for the TCP segments in the stripe (`session::order`).
    pub flow_order: bool,
    /// TCP carried as byte streams (`crate::stream`): the tunnel terminates TCP
    /// connections and carries their bytes, without TCP/IP headers. Unset: on when
    /// every channel is paced (the streams' rate is the pacer's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_streams: Option<bool>,
    /// The destinations (addresses or networks) this end connects the peer's
    /// streams to; empty: any.
    pub tcp_streams_to: Vec<String>,
    /// Ports (or ranges) whose connections are carried as packets, not terminated.
    pub tcp_streams_except: Vec<NumOrName>,
    /// A stream that sends little takes the lowest-delay channel, past the stripe
    /// (`crate::stream::lane`).
    pub tcp_streams_fast: bool,
    // --- sockets (the tunnel) ---
    /// SO_RCVBUF / SO_SNDBUF per channel socket, bytes (0: the kernel's default).
    pub socket_buffer: usize,
}

impl Default for SessionSettings {
    fn default() -> Self {
        let markers = MarkerConfig::default();
        let demote = DemoteConfig::default();
        let aqm = AqmConfig::default();
        let receiver = crate::config::ReceiverConfig::default();
        SessionSettings {
            key: None,
            key_file: None,
            private_key_file: None,
            peer_public_key: None,
            security: SecurityMode::Encrypt,
            cipher: "auto".into(),
            allow_insecure: false,
            rekey_after: Dur(Duration::from_secs(120)),
            mode: Mode::Logical,
            scheduler: SchedulerKind::Srr,
            marker_every_rounds: markers.every_rounds,
            marker_position: "end".into(),
            marker_idle: Dur(markers.idle.unwrap_or(Duration::ZERO)),
            marker_interval: Dur::ms(5),
            marker_interval_quiet: Dur::ms(20),
            trigger_every: 128,
            equalize: true,
            max_wait: Dur(receiver.max_wait),
            buffer_packets: receiver.buffer_packets,
            heartbeat: Dur::ms(50),
            idle_heartbeat: Dur::ms(1000),
            idle_after: Dur::ms(2000),
            dead_after: Dur::ms(300),
            rejoin_after: Dur::ms(150),
            queue_packets: 4096,
            adaptive: None,
            pace_burst: Dur::ms(2),
            pace_codel: true,
            // Chosen by measurement (`braid lab bench`, issue 28): with 1 % loss on one
            // link of three, in-bond repair (`arq`, ARQ_WAIT) with AQM keeps 0.81-0.88
            // of the ceiling where the bond without them fell under a tenth; on clean
            // links the modes stay within noise of themselves without (docs/lab.md).
            aqm: true,
            aqm_target: None,
            aqm_interval: None,
            aqm_loss_signal: aqm.loss_signal,
            arq: None,
            repair: None,
            credits: false,
            credit_window: None,
            credit_pool: None,
            demote: true,
            demote_loss: demote.loss,
            demote_after: Dur(demote.after),
            promote_after: Dur(demote.promote_after),
            demote_rtt_ratio: demote.rtt_ratio,
            return_path: true,
            pmtu: true,
            flow_auto: true,
            flow_copies: 2,
            flow: Vec::new(),
            flow_order: true,
            tcp_streams: None,
            tcp_streams_to: Vec::new(),
            tcp_streams_except: Vec::new(),
            tcp_streams_fast: true,
            socket_buffer: 4 << 20,
        }
    }
}

/// A setting that is wrong: its key (as in the file, without the table's name) and
/// why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettingError {
    /// The key, e.g. `dead_after`.
    pub key: &'static str,
    /// What is wrong and what would be right.
    pub reason: String,
}

impl std::fmt::Display for SettingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.reason)
    }
}

fn bad(key: &'static str, reason: impl Into<String>) -> SettingError {
    SettingError {
        key,
        reason: reason.into(),
    }
}

fn opt(d: Dur) -> Option<Duration> {
    (d.0 > Duration::ZERO).then_some(d.0)
}

impl SessionSettings {
    /// Whether this end asks the peer for AES-256-GCM (`cipher`).
    fn asks_for_aes(&self) -> Result<bool, SettingError> {
        match self.cipher.trim() {
            "auto" => Ok(super::crypto::aes_hardware()),
            "chacha20-poly1305" => Ok(false),
            "aes-256-gcm" => Ok(true),
            other => Err(bad(
                "cipher",
                format!(
                    "unknown cipher '{other}': expected auto, chacha20-poly1305 or aes-256-gcm"
                ),
            )),
        }
    }

    /// Apply every setting but the keys to `cfg` (whose channels, datagram size and
    /// pacing rates are set): the values, then each concern's configuration, then the
    /// session's own checks. `cfg.pacing` must already say which channels are paced:
    /// adaptive weights follow it when `adaptive` is unset.
    pub fn apply(&self, cfg: &mut Config) -> Result<(), SettingError> {
        if self.security == SecurityMode::None && !self.allow_insecure {
            return Err(bad(
                "security",
                "\"none\" sends data in clear and delivers forged packets (anyone who can reach a channel's port can inject into the tunnel); set allow_insecure = true beside it to run so anyway, or use \"encrypt\" (the default) or \"auth\" (docs/security.md)",
            ));
        }
        cfg.security = self.security;
        cfg.aes_gcm = self.asks_for_aes()?;
        if self.rekey_after.0 < Duration::from_secs(1) {
            return Err(bad("rekey_after", "must be at least 1s"));
        }
        cfg.rekey_after = self.rekey_after.0;
        cfg.mode = self.mode;
        cfg.scheduler = self.scheduler;
        cfg.markers = self.markers(cfg.channels.len())?;
        if self.trigger_every == 0 {
            return Err(bad("trigger_every", "must be at least 1"));
        }
        cfg.trigger_every = self.trigger_every;
        if self.buffer_packets == 0 {
            return Err(bad("buffer_packets", "must be at least 1"));
        }
        cfg.receiver.equalize = self.equalize;
        cfg.receiver.max_wait = self.max_wait.0;
        cfg.receiver.buffer_packets = self.buffer_packets;
        self.liveness(cfg)?;
        cfg.queue_packets = self.queue_packets;
        self.pacing(cfg)?;
        cfg.adaptive = self.adaptive.unwrap_or_else(|| cfg.every_channel_paced());
        cfg.aqm = self.aqm()?;
        cfg.arq = self.arq()?;
        cfg.credits = self.credits(cfg.receiver.buffer_packets)?;
        cfg.demote = self.demote()?;
        cfg.return_path = self.return_path.then(ReturnPathConfig::default);
        // The bounds a driver set (per channel) stay.
        cfg.pmtu = match (self.pmtu, cfg.pmtu.take()) {
            (false, _) => None,
            (true, Some(m)) => Some(m),
            (true, None) => Some(super::pmtu::Config::default()),
        };
        cfg.flows = self.flows()?;
        cfg.flow_order = self.flow_order;
        let allow_to = self
            .tcp_streams_to
            .iter()
            .map(|a| parse_net(a).map_err(|e| bad("tcp_streams_to", e)))
            .collect::<Result<Vec<_>, _>>()?;
        let streams = self
            .tcp_streams
            .unwrap_or_else(|| cfg.every_channel_paced());
        let except_ports = self
            .tcp_streams_except
            .iter()
            .map(|p| parse_ports(p).map_err(|e| bad("tcp_streams_except", e)))
            .collect::<Result<Vec<_>, _>>()?;
        cfg.streams = streams.then(|| crate::stream::StreamConfig {
            allow_to,
            except_ports,
            fast_lane: self.tcp_streams_fast,
            ..crate::stream::StreamConfig::default()
        });
        Ok(())
    }

    /// The flow policies: `flow_auto`, `flow_copies` and the `flow` rules.
    pub fn flows(&self) -> Result<FlowConfig, SettingError> {
        let rules = self
            .flow
            .iter()
            .enumerate()
            .map(|(i, r)| {
                r.rule()
                    .map_err(|e| bad("flow", format!("[[session.flow]] number {}: {e}", i + 1)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let f = FlowConfig {
            auto: self.flow_auto,
            copies: self.flow_copies,
            rules,
        };
        f.validate().map_err(|e| bad("flow_copies", e))?;
        Ok(f)
    }

    /// The markers' configuration.
    pub fn markers(&self, channels: usize) -> Result<MarkerConfig, SettingError> {
        Ok(MarkerConfig {
            every_rounds: self.marker_every_rounds,
            position: units::parse_marker_position(&self.marker_position, channels)
                .map_err(|e| bad("marker_position", e.to_string()))?,
            idle: opt(self.marker_idle),
            max_interval: opt(self.marker_interval),
            quiet_interval: opt(self.marker_interval_quiet),
            timestamps: false,
        })
    }

    fn liveness(&self, cfg: &mut Config) -> Result<(), SettingError> {
        /// A hello interval that a NAT outlasts.
        fn keepalive(key: &'static str, every: Dur) -> Result<(), SettingError> {
            if every.0 <= MAX_HEARTBEAT {
                return Ok(());
            }
            Err(bad(
                key,
                format!(
                    "{every} is more than {}: the hellos are each channel's keepalive, and a NAT forgets an idle UDP mapping after 30 s or so",
                    Dur(MAX_HEARTBEAT)
                ),
            ))
        }
        if self.heartbeat.0 < Duration::from_millis(1) {
            return Err(bad("heartbeat", "must be at least 1ms"));
        }
        keepalive("heartbeat", self.heartbeat)?;
        keepalive("idle_heartbeat", self.idle_heartbeat)?;
        if self.dead_after.0 < self.heartbeat.0 + self.heartbeat.0 {
            return Err(bad(
                "dead_after",
                format!(
                    "{} is less than twice the heartbeat ({}): healthy channels would flap",
                    self.dead_after, self.heartbeat
                ),
            ));
        }
        cfg.heartbeat = self.heartbeat.0;
        // Never faster than the heartbeat: a configuration that slows the heartbeat
        // itself needs no idle setting of its own.
        cfg.idle_heartbeat = self.idle_heartbeat.0.max(self.heartbeat.0);
        cfg.idle_after = self.idle_after.0;
        cfg.dead_after = self.dead_after.0;
        cfg.rejoin_after = self.rejoin_after.0;
        Ok(())
    }

    /// The pacer's burst and CoDel, on the rates `cfg.pacing` already holds.
    fn pacing(&self, cfg: &mut Config) -> Result<(), SettingError> {
        let defaults = SessionSettings::default();
        let Some(p) = &mut cfg.pacing else {
            if self.pace_burst != defaults.pace_burst || self.pace_codel != defaults.pace_codel {
                let key = if self.pace_burst != defaults.pace_burst {
                    "pace_burst"
                } else {
                    "pace_codel"
                };
                return Err(bad(key, "no channel is paced"));
            }
            return Ok(());
        };
        p.burst = self.pace_burst.0;
        if !self.pace_codel {
            p.codel = None;
        }
        Ok(())
    }

    /// Congestion signals: CoDel on the channels' queueing delay, or `None`.
    pub fn aqm(&self) -> Result<Option<AqmConfig>, SettingError> {
        if !self.aqm {
            for (key, set) in [
                ("aqm_target", self.aqm_target.is_some()),
                ("aqm_interval", self.aqm_interval.is_some()),
                (
                    "aqm_loss_signal",
                    self.aqm_loss_signal != AqmConfig::default().loss_signal,
                ),
            ] {
                if set {
                    return Err(bad(key, "needs `aqm = true`"));
                }
            }
            return Ok(None);
        }
        let mut a = AqmConfig {
            loss_signal: self.aqm_loss_signal,
            ..AqmConfig::default()
        };
        for (key, v, slot) in [
            ("aqm_target", self.aqm_target, &mut a.target),
            ("aqm_interval", self.aqm_interval, &mut a.interval),
        ] {
            if let Some(d) = v {
                if d.0 == Duration::ZERO {
                    return Err(bad(key, "must be above zero"));
                }
                *slot = d.0;
            }
        }
        // Configured values are used as they are, not scaled to the round trip.
        a.scale_to_rtt = self.aqm_target.is_none() && self.aqm_interval.is_none();
        Ok(Some(a))
    }

    /// In-bond repair, or `None` (`arq = "0s"`).
    pub fn arq(&self) -> Result<Option<ArqConfig>, SettingError> {
        let wait = match (self.repair, self.arq) {
            // `repair` is the old name of `arq`: the tunnel's repair is the
            // error-control module's in-bond profile now, in every mode.
            (Some(_), Some(_)) => {
                return Err(bad(
                    "repair",
                    "`repair` is the old name of `arq`: set only `arq`",
                ))
            }
            (Some(w), None) | (None, Some(w)) => w,
            // Repair finds losses by the sealing counter: with no seal it is off
            // unless asked for (and then the session's check refuses it).
            (None, None) if self.security == SecurityMode::None => Dur(Duration::ZERO),
            (None, None) => Dur(ARQ_WAIT),
        };
        Ok(opt(wait).map(|wait| ArqConfig { wait }))
    }

    /// Credits per channel, or `None`.
    pub fn credits(&self, buffer_packets: usize) -> Result<Option<CreditConfig>, SettingError> {
        if !self.credits {
            return match (self.credit_window, self.credit_pool) {
                (None, None) => Ok(None),
                (Some(_), _) => Err(bad("credit_window", "needs `credits = true`")),
                (None, Some(_)) => Err(bad("credit_pool", "needs `credits = true`")),
            };
        }
        // The window defaults to the receive buffer less the markers' room.
        let room = (buffer_packets as u64)
            .saturating_sub(super::credits::MARKER_SLACK as u64)
            .min(u32::MAX as u64) as u32;
        Ok(Some(CreditConfig {
            window: self.credit_window.unwrap_or(room),
            pool: self.credit_pool,
        }))
    }

    /// Bad-link demotion, or `None`.
    pub fn demote(&self) -> Result<Option<DemoteConfig>, SettingError> {
        let d = DemoteConfig {
            loss: self.demote_loss,
            after: self.demote_after.0,
            promote_after: self.promote_after.0,
            rtt_ratio: self.demote_rtt_ratio,
        };
        if !self.demote {
            if d != DemoteConfig::default() {
                return Err(bad(
                    "demote",
                    "is false: demote_loss, demote_after, promote_after and demote_rtt_ratio need it on",
                ));
            }
            return Ok(None);
        }
        if !(d.loss > 0.0 && d.loss < 1.0) {
            return Err(bad(
                "demote_loss",
                format!(
                    "{}: expected a share of datagrams above 0 and below 1",
                    d.loss
                ),
            ));
        }
        if !(d.rtt_ratio == 0.0 || (1.5..=1000.0).contains(&d.rtt_ratio)) {
            return Err(bad(
                "demote_rtt_ratio",
                format!(
                    "{}: expected 0 (off) or a ratio from 1.5 to 1000",
                    d.rtt_ratio
                ),
            ));
        }
        Ok(Some(d))
    }

    /// The names of every key, in the struct's order (from serde's own list, so it
    /// cannot drift from the struct).
    pub fn keys() -> &'static [&'static str] {
        field_names::<SessionSettings>()
    }
}

/// One line of the reference: a key, where it applies and what it does.
#[derive(Clone, Copy, Debug)]
pub struct KeyDoc {
    /// The key.
    pub key: &'static str,
    /// What it does, for a person (Markdown).
    pub doc: &'static str,
}

/// Where the simulator takes a setting from instead of `[session]`, if elsewhere.
pub fn simulator_source(key: &str) -> Option<&'static str> {
    Some(match key {
        "key" | "key_file" | "private_key_file" | "peer_public_key" => {
            "not used: the simulator seals with a fixed key"
        }
        "socket_buffer" => "not used: no sockets",
        "mode" | "scheduler" => "each `[[run]]`",
        "marker_every_rounds" | "marker_position" | "marker_idle" | "marker_interval" => {
            "`[markers]`"
        }
        "marker_interval_quiet" => {
            "not used: a scenario's markers follow `[markers]` (the papers' schedule) throughout"
        }
        "trigger_every" => "`[markers]` (`trigger_every`)",
        "equalize" | "max_wait" | "buffer_packets" => "`[receiver]`",
        _ => return None,
    })
}

/// Every key of [`SessionSettings`], documented; `docs/settings.md` is made from this.
pub const REFERENCE: &[KeyDoc] = &[
    KeyDoc {
        key: "key",
        doc: "pre-shared key: 32 random bytes as base64 (`braid genkey`); authenticates the handshake. Passphrases and patterned keys are refused. Prefer `key_file` (a key in the config file is as readable as the file)",
    },
    KeyDoc {
        key: "key_file",
        doc: "the pre-shared key from a file (relative to the config file): base64 text or 32 raw bytes, read as bytes; refused if readable by group or others (`chmod 600`)",
    },
    KeyDoc {
        key: "private_key_file",
        doc: "static keys, WireGuard style: our X25519 private key (`braid genkey > private.key`); same file rules. With `peer_public_key`, the handshake is `Noise_IKpsk2` (the pre-shared key, if also set, is mixed in)",
    },
    KeyDoc {
        key: "peer_public_key",
        doc: "the peer's public key, base64 (`braid pubkey < its private.key`)",
    },
    KeyDoc {
        key: "security",
        doc: "`encrypt`: every datagram sealed and encrypted; `auth`: sealed, bodies in clear (integrity, no confidentiality); `none`: data travel bare and unauthenticated (trusted links, or payloads already encrypted such as WireGuard), control is still sealed; it is refused unless `allow_insecure = true` stands beside it, and the tunnel logs a warning at every start. Both ends must agree. See `docs/security.md`",
    },
    KeyDoc {
        key: "cipher",
        doc: "the AEAD that seals data (and control), agreed in the handshake: AES-256-GCM when both ends ask for it, ChaCha20-Poly1305 otherwise; the two need not match. `auto`: ask for AES-256-GCM when this CPU has AES instructions (x86-64 AES-NI with PCLMULQDQ, ARMv8 AES with PMULL), where it costs a third of ChaCha20-Poly1305's time per datagram (`docs/performance.md`, \"The cipher\"); `chacha20-poly1305`: never ask (the session uses ChaCha20-Poly1305); `aes-256-gcm`: ask even without the instructions. `braid status` shows the cipher in use. Both are 256-bit AEADs with a 16-byte tag: the wire format and the overhead are the same",
    },
    KeyDoc {
        key: "allow_insecure",
        doc: "the acknowledgement `security = \"none\"` needs: anyone who can reach a channel's port can then inject packets into the tunnel",
    },
    KeyDoc {
        key: "rekey_after",
        doc: "a fresh handshake (new keys) this often",
    },
    KeyDoc {
        key: "mode",
        doc: "receiver mode: `logical` (header-free data, markers in band, quasi-FIFO), `seq` (5-byte sequence header, exact FIFO), `trr` (header-free, triggers, never out of order, loss allowed), `none` (arrival order)",
    },
    KeyDoc {
        key: "scheduler",
        doc: "`srr` (quanta in bytes ∝ weight), `rr` (or `brr`), `grr` (packets per round ∝ weight), `random` (weighted random, seed 0 at both ends)",
    },
    KeyDoc {
        key: "marker_every_rounds",
        doc: "periodic markers every K SRR rounds (0: off; heartbeats still send them)",
    },
    KeyDoc {
        key: "marker_position",
        doc: "`start`, `end` or `channel:N` (or just `N`): where in the round markers go",
    },
    KeyDoc {
        key: "marker_idle",
        doc: "markers after this long without data (`0s`: off)",
    },
    KeyDoc {
        key: "marker_interval",
        doc: "while data flows, markers (triggers in `trr`) at least this often, so a loss is repaired and a TRR segment released within this time whatever the rate (`0s`: rounds and packet counts only). Costs one marker per channel per interval: raise it on very slow links",
    },
    KeyDoc {
        key: "marker_interval_quiet",
        doc: "while the peer reports no loss on any channel (for 2 s), markers only this often, and the round markers thinned out in the same proportion; the first loss reported brings `marker_interval` back at once. A marker only matters after a loss (it resynchronizes logical reception); on a bond that loses nothing each costs 112 bytes per channel per interval whatever the channel's rate (0.4 % of a clean 100/50/20 Mbit/s bond at 5 ms, 3.6 % of a 5 Mbit/s link). Not with `trr` (its triggers release data) or `credits` (markers carry them). `0s`: always `marker_interval`",
    },
    KeyDoc {
        key: "trigger_every",
        doc: "`trr`: triggers on every channel every N data packets",
    },
    KeyDoc {
        key: "equalize",
        doc: "delay equalization: hold each channel's datagrams for the difference between the slowest channel's one-way delay and its own (measured from markers sent together), so every packet sees the same delay and TCP a steady round-trip time over paths of different delays (see `docs/architecture.md`)",
    },
    KeyDoc {
        key: "max_wait",
        doc: "the receiver gives up on a missing packet after this (while others wait)",
    },
    KeyDoc {
        key: "buffer_packets",
        doc: "receiver buffer per channel",
    },
    KeyDoc {
        key: "heartbeat",
        doc: "hellos on every channel, and markers (triggers in `trr`) on every channel of the transmit set; the hellos are also the keepalives that hold each channel's NAT mapping open (at most 25s)",
    },
    KeyDoc {
        key: "idle_heartbeat",
        doc: "the heartbeat while the session is idle (no application data either way for `idle_after`): hellos and markers this often instead, back to `heartbeat` with the first packet. Each hello says when the next comes, so the peer waits for it before it declares a channel down (`dead_after` stretched in proportion: 6 s at the defaults while idle). An idle tunnel sends a twentieth of the datagrams (what a cellular uplink pays for, and a server with many peers spends its CPU on) and still holds every NAT mapping open; a channel that fails while idle is found within `dead_after` of the first data. Never faster than `heartbeat`; set it to `heartbeat` to keep the heartbeat when idle; at most 25s",
    },
    KeyDoc {
        key: "idle_after",
        doc: "no application data sent or received for this long (counted from the handshake): the session is idle (`idle_heartbeat`)",
    },
    KeyDoc {
        key: "dead_after",
        doc: "a channel from which nothing arrives for this long is declared down; at least 2 × heartbeat",
    },
    KeyDoc {
        key: "rejoin_after",
        doc: "a down channel must deliver continuously this long before it is up again",
    },
    KeyDoc {
        key: "queue_packets",
        doc: "packets held while an epoch switch waits for its ack; beyond: dropped and counted",
    },
    KeyDoc {
        key: "adaptive",
        doc: "adaptive weights: the SRR quanta follow what each channel delivers, from the peer's feedback; the configured `weight`s are only the start (srr with `logical`, `seq` or `none`; ignored otherwise). With every channel paced it also lowers a channel's pace while its link carries less (adaptive pacing), so it is on by default there; unpaced it is off by default: it rescues wrong weights but, with right ones, takes one TCP flow's slow-start queues for changes of the links (measured, `docs/lab.md`). See \"Adaptive weights\" below",
    },
    KeyDoc {
        key: "pace_burst",
        doc: "Tokens a paced channel may save up, as time at its rate.",
    },
    KeyDoc {
        key: "pace_codel",
        doc: "CoDel on the pacer's transmit queue (marks or drops while a queue stands).",
    },
    KeyDoc {
        key: "aqm",
        doc: "CoDel on the channels' queueing delay (markers carry the sender's clock; the receiver measures each channel's one-way delay above its 10 s minimum) with ECN: while a queue stands above `aqm_target` for `aqm_interval`, delivered ECN-capable IP packets are marked CE (others dropped, except small ones under 128 bytes: SYNs and pure ACKs, whose drop frees no queue and stalls a connection), and a burst of losses found on a channel whose queue stands is signalled too. A channel's delay counts only while it carries at least half of the most it carried in 100 ms over the last 10 s (a delay that outlasts the load, a jittery path, is not a queue TCP can drain), and only as the smallest of its last three samples (one late marker is not a queue). On by default (with `arq`); without ECN at the end hosts, CoDel drops instead of marking. See \"In-bond repair and AQM\" below",
    },
    KeyDoc {
        key: "aqm_target",
        doc: "CoDel's target queueing delay (needs `aqm = true`). Unset, it follows the bond's round trip: 10 % of the interval once the interval is scaled above 100 ms, at least 5 ms (see \"Pacing\" below); set, it is used as it is",
    },
    KeyDoc {
        key: "aqm_interval",
        doc: "CoDel's interval (needs `aqm = true`). Unset, twice the slowest minimum round trip among the channels received on, from 100 ms to 1 s; set (either key), both are used as they are",
    },
    KeyDoc {
        key: "aqm_loss_signal",
        doc: "with `aqm`: a burst of losses (4 or more within 10 ms) found on a channel while its queue stands is signalled too (at most once per `aqm_interval`), catching a short tail-drop buffer that overflows within CoDel's first interval. A lone loss is not signalled: random loss of a link now and then meets a queue standing for a moment, and signalling it ended a long-round-trip flow's slow start early (lab and simulated twins). `false` leaves congestion to CoDel's delay signal",
    },
    KeyDoc {
        key: "arq",
        doc: "unset: `200ms` (off with `security = \"none\"`). In-bond repair, every mode: a sealed datagram found missing on a channel (a gap in its sealing counter) is asked for again (`Resend`, session message kind 5, on the fastest channel) and the peer sends the same sealed bytes again on the channel where they arrive first (its round trip and what its pacer still owes); the receiver holds that channel's later datagrams up to this long (e.g. `200ms`, about the slowest channel's round trip plus a margin) for it, then gives it up. Works below the resequencer, so logical reception sees no resync and `seq`/`trr` no loss. Needs `security` `encrypt` or `auth` (off by default with `none`). On by default with `aqm`, which keeps congestion visible to TCP: together they hold a lossy link's bond near its ceiling (see \"In-bond repair and AQM\" below); `0s` turns it off",
    },
    KeyDoc {
        key: "repair",
        doc: "the old name of `arq`, kept so that old configurations work: it turns on the same in-bond repair, in every mode (setting both is an error). It used to turn on `seq` mode's NAK repair in the resequencer (`0xB5`/`0xB6`), which hid congestion losses from TCP and is no longer used by the tunnel; the simulator keeps it as a comparison point (`scenarios/repair/`)",
    },
    KeyDoc {
        key: "credits",
        doc: "credit-based flow control per channel (seed 004's N23 and Credit Update Protocol): the receiver lends each channel's sender room in its buffer for that channel, and the sender puts no data on a channel beyond its credit. Skewed channels (one much slower to arrive than another) then slow the sender down instead of overflowing the receiver, which otherwise forces progress (losses, resyncs, misordering). What waits for credit waits in the transmit queue (`queue_packets`, dropped and counted beyond). The rate of a channel is at most `credit_window` packets per credit loop (its one-way delay, plus the fastest channel's for the credit back, plus the time its packets wait in the receiver): size the buffer for it. Not in mode `none`. Both ends must agree. See \"Credits\" below",
    },
    KeyDoc {
        key: "credit_window",
        doc: "packets of a channel's receive buffer its sender may fill (N2 + N3); at most `buffer_packets - 64` (64 are kept for markers, which do not wait for credit). A credit goes back after 5 % of it is forwarded",
    },
    KeyDoc {
        key: "credit_pool",
        doc: "adaptive allocation (seed 004 §6): this many packets shared by all channels, divided every 100 ms by what each forwarded; `credit_window` is then one channel's maximum",
    },
    KeyDoc {
        key: "demote",
        doc: "bad-link demotion: a channel that loses `demote_loss` of its datagrams over `demote_after` (while a healthy channel is there) leaves the transmit set and carries only probes; it comes back after `promote_after` of looking healthy. Every mode and scheduler. See \"Bad links: demotion\" below",
    },
    KeyDoc {
        key: "demote_loss",
        doc: "loss share (0 < x < 1) at which a channel is demoted; it counts as healthy again at half of it",
    },
    KeyDoc {
        key: "demote_after",
        doc: "the window over which loss is judged (at least two heartbeats); also how long the delay criterion must hold",
    },
    KeyDoc {
        key: "promote_after",
        doc: "how long a demoted channel must look healthy (state `probing`) before it is promoted; doubled (up to 8×) for a channel demoted again soon after a promotion",
    },
    KeyDoc {
        key: "demote_rtt_ratio",
        doc: "delay criterion: demote a channel whose minimum round trip stays above this many times the fastest active channel's (plus 5 ms) while it carries under a tenth of the bond; from 1.5 to 1000",
    },
    KeyDoc {
        key: "return_path",
        doc: "the return path: while this end sends little more than the acknowledgements of the peer's flow, its data rides the channel with the shortest round trip alone (see \"The return path\" below)",
    },
    KeyDoc {
        key: "pmtu",
        doc: "path MTU discovery per channel (RFC 8899 style, see \"Path MTU\" in `docs/tunnel.md`): each end probes the largest datagram each channel's path carries, between 1280 bytes of IP packet and the channel's `mtu`, confirms it every 30 s (and when the peer reports losses), falls back when it stops passing and probes upward again every 10 minutes; the bond's MTU (the TUN device's, the MSS clamp's) follows the smallest. A few probe datagrams per channel; `false`: every channel carries its `mtu` as configured",
    },
    KeyDoc {
        key: "flow_auto",
        doc: "automatic flow policies (`docs/tunnel.md`, \"Real-time flows\"): packets marked DSCP EF (46) or VOICE-ADMIT (44) go `redundant`, CS4 and AF41-43 (interactive video) `lowest-delay`, and a UDP flow of packets of at most 400 bytes within 200 packets/s and 512 kbit/s (calls, games, DNS) goes `redundant`; a UDP flow that sends a larger packet or more is bonded, and stays so until 5 s after it last did. TCP's pure acknowledgements go `lowest-delay` (in arrival order); everything else (TCP's other segments, bulk UDP, anything not IP) is bonded. `false`: only the `flow` rules",
    },
    KeyDoc {
        key: "flow_copies",
        doc: "channels a `redundant` packet is sent on (2 to 64; those with the shortest round trips; fewer while fewer are up): the first copy to arrive is delivered, the others are dropped",
    },
    KeyDoc {
        key: "flow",
        doc: "policy overrides, tried in order before `flow_auto`: `[[session.flow]]` tables with `policy` (`redundant`, `lowest-delay` or `bond`) and at least one of `protocol` (`udp`, `tcp`, `icmp` or a number), `port` (`5060` or a range `\"10000-20000\"`: the source or destination port), `address` (an address or network, `10.1.0.0/16`, `2001:db8::/32`: the source or destination) and `dscp` (0 to 63, or `ef`, `cs0`-`cs7`, `af11`-`af43`); a packet gets the policy of the first rule whose every criterion it matches. A real-time packet too large for a flow datagram (16 bytes of header) is bonded. A TCP flow a rule sends `redundant` or `lowest-delay` keeps its order (a reorder domain of its own); name only ports whose connections stay small (a game server, a remote console): a connection that measured its round trip on the fast path and then carries bulk data through the bond ends its slow start early (`docs/tunnel.md`)",
    },
    KeyDoc {
        key: "flow_order",
        doc: "per-flow order for the TCP segments that cross in the stripe (TCP carried as packets: `tcp_streams = false`, or a connection that is not terminated): the receiver delivers a segment the stripe still holds (behind another packet's loss being repaired, or a slower channel's turn) as soon as it continues its own connection's bytes exactly, no earlier than the delay equalizer would for the channels' skew; so one flow's loss holds back that flow alone. Nothing is added on the wire; other protocols keep the stripe's order. `false`: every packet waits for the stripe's order (`docs/tunnel.md`, \"Per-flow order in the stripe\")",
    },
    KeyDoc {
        key: "tcp_streams",
        doc: "TCP carried as byte streams (`docs/streams.md`): the tunnel terminates each TCP connection that enters it in a user-space TCP stack on the TUN device and carries its bytes across the bond as a reliable stream (no TCP/IP headers, no slow start across the bond, per-stream credits); the far end opens the connection to the original destination from the original source address. Used with a peer that announces it in the handshake (it need not match); connections beyond the limits pass as packets. Unset (the default): on when every channel is paced (`pace = \"auto\"`, the default, or a rate), since the pacer sets the streams' rate; `false` carries TCP as packets",
    },
    KeyDoc {
        key: "tcp_streams_to",
        doc: "with `tcp_streams`: the destinations this end connects the peer's streams to, as addresses or networks (`[\"10.0.0.0/8\", \"2001:db8::/32\"]`); a stream to any other is refused, and the peer's application sees its connection refused. Empty (the default): any destination, the same as for the connection carried as packets (the far end opens it through its TUN device from the peer's address, so its forwarding and firewall apply alike)",
    },
    KeyDoc {
        key: "tcp_streams_except",
        doc: "with `tcp_streams`: ports, or ranges (`[22, \"5060-5070\"]`), whose TCP connections this end does not terminate: a SYN entering the tunnel with one of them as its source or destination port passes as a packet, and the connection crosses as packets end to end (for an application that must see its peer's own TCP: its window, timestamps or options). Empty (the default): every connection that can be terminated is",
    },
    KeyDoc {
        key: "tcp_streams_fast",
        doc: "with `tcp_streams`: a stream that sends little (at most 16 KiB waiting to be sent, within 2 Mbit/s with a burst of 64 KiB: a remote shell, a game, a small request or answer) sends its data on the lowest-delay channel, past the stripe, as it does its control frames: one way in that channel's delay instead of the slowest channel's, and never held back by another flow's loss the bond repairs. A stream that writes more goes into the stripe and stays there until all it sent is acknowledged. Only the streams' own sender measures what path the bytes took, so no TCP connection sees its round trip change (`docs/streams.md`). `false`: every stream's data in the stripe",
    },
    KeyDoc {
        key: "socket_buffer",
        doc: "SO_RCVBUF/SO_SNDBUF per channel socket (capped by `net.core.*mem_max`)",
    },
];

/// The field names serde's derive gives a struct, read by asking it to deserialize
/// from a deserializer that only records the list.
fn field_names<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    struct Names(Option<&'static [&'static str]>);
    #[derive(Debug)]
    struct Stop;
    impl std::fmt::Display for Stop {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("stop")
        }
    }
    impl std::error::Error for Stop {}
    impl serde::de::Error for Stop {
        fn custom<M: std::fmt::Display>(_: M) -> Self {
            Stop
        }
    }
    impl<'de> Deserializer<'de> for &mut Names {
        type Error = Stop;
        fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }
        fn deserialize_struct<V: serde::de::Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Stop> {
            self.0 = Some(fields);
            Err(Stop)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }
    let mut n = Names(None);
    let _ = T::deserialize(&mut n);
    n.0.unwrap_or(&[])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::ChannelParams;

    pub(super) fn channels(n: usize) -> Vec<ChannelParams> {
        (0..n)
            .map(|i| ChannelParams {
                name: format!("ch{i}"),
                weight: 1,
            })
            .collect()
    }

    #[test]
    fn every_key_is_documented_once_in_the_structs_order() {
        let keys: Vec<&str> = REFERENCE.iter().map(|d| d.key).collect();
        assert_eq!(keys, SessionSettings::keys());
    }

    #[test]
    fn config_new_runs_the_default_settings() {
        let mut c = Config::new(channels(2), 1400, vec![7; 32]);
        let built = c.clone();
        SessionSettings::default().apply(&mut c).unwrap();
        assert_eq!(c, built);
    }

    #[test]
    fn durations_print_as_they_are_spelled() {
        for s in ["0s", "250us", "50ms", "2s", "2m"] {
            let d = Dur(units::parse_duration_us(s).unwrap());
            assert_eq!(d.to_string(), s);
        }
    }

    #[test]
    fn settings_that_need_another_say_which() {
        let s = SessionSettings {
            aqm: false,
            aqm_target: Some(Dur::ms(3)),
            ..SessionSettings::default()
        };
        let mut c = Config::new(channels(2), 1400, vec![7; 32]);
        assert_eq!(s.apply(&mut c).unwrap_err().key, "aqm_target");
        let s = SessionSettings {
            dead_after: Dur::ms(60),
            ..SessionSettings::default()
        };
        let e = s.apply(&mut c).unwrap_err();
        assert_eq!(e.key, "dead_after");
        assert!(e.reason.contains("twice the heartbeat (50ms)"), "{e}");
        // The hellos keep NAT mappings open: a heartbeat slower than NATs forget.
        let s = SessionSettings {
            heartbeat: Dur::ms(26_000),
            dead_after: Dur::ms(60_000),
            ..SessionSettings::default()
        };
        let e = s.apply(&mut c).unwrap_err();
        assert_eq!(e.key, "heartbeat");
        assert!(e.reason.contains("keepalive"), "{e}");
        // The idle heartbeat too.
        let s = SessionSettings {
            idle_heartbeat: Dur::ms(26_000),
            ..SessionSettings::default()
        };
        let e = s.apply(&mut c).unwrap_err();
        assert_eq!(e.key, "idle_heartbeat");
        assert!(e.reason.contains("keepalive"), "{e}");
        // A heartbeat slower than the default idle one: idle, it stays as it is.
        let s = SessionSettings {
            heartbeat: Dur::ms(2_000),
            dead_after: Dur::ms(6_000),
            ..SessionSettings::default()
        };
        s.apply(&mut c).unwrap();
        assert_eq!(c.idle_heartbeat, Duration::from_secs(2));
        assert_eq!(SessionSettings::default().idle_heartbeat, Dur::ms(1000));
    }
}

/// A number or a name in a settings file (`port = 5060` or `port = "5000-5100"`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NumOrName {
    /// A whole number.
    Num(i64),
    /// A string.
    Name(String),
}

impl std::fmt::Display for NumOrName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NumOrName::Num(n) => write!(f, "{n}"),
            NumOrName::Name(s) => write!(f, "\"{s}\""),
        }
    }
}

impl Serialize for NumOrName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            NumOrName::Num(n) => s.serialize_i64(*n),
            NumOrName::Name(n) => s.serialize_str(n),
        }
    }
}

impl<'de> Deserialize<'de> for NumOrName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<NumOrName, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = NumOrName;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a whole number or a string")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<NumOrName, E> {
                Ok(NumOrName::Num(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<NumOrName, E> {
                i64::try_from(v)
                    .map(NumOrName::Num)
                    .map_err(|_| E::custom(format!("{v} is too large")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<NumOrName, E> {
                Ok(NumOrName::Name(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// One `[[session.flow]]` table: a policy for the packets it matches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowRuleSettings {
    /// `redundant`, `lowest-delay` or `bond`.
    pub policy: String,
    /// `udp`, `tcp`, `icmp` or a protocol number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<NumOrName>,
    /// A port or a range `"lo-hi"`: the source or destination port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<NumOrName>,
    /// An address or a network `a/len`: the source or destination.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// 0 to 63, or a name (`ef`, `af41`, `cs5`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dscp: Option<NumOrName>,
}

impl FlowRuleSettings {
    /// The rule, or what is wrong with it.
    pub fn rule(&self) -> Result<FlowRule, String> {
        let policy = FlowPolicy::from_name(&self.policy)?;
        if self.protocol.is_none()
            && self.port.is_none()
            && self.address.is_none()
            && self.dscp.is_none()
        {
            return Err("names no protocol, port, address or dscp: it would match every packet (`flow_auto = false` turns the automatic policies off)".into());
        }
        let protocol = match &self.protocol {
            None => None,
            Some(NumOrName::Num(n)) => Some(u8::try_from(*n).map_err(|_| {
                format!("protocol = {n}: expected udp, tcp, icmp or a number from 0 to 255")
            })?),
            Some(NumOrName::Name(s)) => Some(match s.trim().to_ascii_lowercase().as_str() {
                "tcp" => 6,
                "udp" => 17,
                "icmp" => 1,
                "icmpv6" => 58,
                _ => {
                    return Err(format!(
                    "protocol = \"{s}\": expected udp, tcp, icmp, icmpv6 or a number from 0 to 255"
                ))
                }
            }),
        };
        let ports = match &self.port {
            None => None,
            Some(p) => Some(parse_ports(p)?),
        };
        if ports.is_some() && protocol.is_some_and(|p| p != 6 && p != 17) {
            return Err("a port needs protocol tcp or udp (or no protocol)".into());
        }
        let net = match &self.address {
            None => None,
            Some(a) => Some(parse_net(a)?),
        };
        let dscp = match &self.dscp {
            None => None,
            Some(d) => Some(parse_dscp(d)?),
        };
        Ok(FlowRule {
            policy,
            protocol,
            ports,
            net,
            dscp,
        })
    }
}

fn parse_ports(p: &NumOrName) -> Result<(u16, u16), String> {
    let one = |s: &str| -> Result<u16, String> {
        s.trim()
            .parse::<u16>()
            .map_err(|_| format!("port {p}: expected a port from 0 to 65535 or a range \"lo-hi\""))
    };
    match p {
        NumOrName::Num(n) => {
            let v = u16::try_from(*n)
                .map_err(|_| format!("port = {n}: expected a port from 0 to 65535"))?;
            Ok((v, v))
        }
        NumOrName::Name(s) => {
            let (lo, hi) = match s.split_once('-') {
                Some((a, b)) => (one(a)?, one(b)?),
                None => {
                    let v = one(s)?;
                    (v, v)
                }
            };
            if lo > hi {
                return Err(format!(
                    "port = \"{s}\": the range's first port is above its last"
                ));
            }
            Ok((lo, hi))
        }
    }
}

fn parse_net(a: &str) -> Result<(std::net::IpAddr, u8), String> {
    let (addr, len) = match a.split_once('/') {
        Some((x, l)) => (x, Some(l)),
        None => (a, None),
    };
    let ip: std::net::IpAddr = addr.trim().parse().map_err(|_| {
        format!(
            "address = \"{a}\": expected an IPv4 or IPv6 address, or a network such as 10.1.0.0/16"
        )
    })?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len = match len {
        None => max,
        Some(l) => l
            .trim()
            .parse::<u8>()
            .ok()
            .filter(|&l| l <= max)
            .ok_or_else(|| format!("address = \"{a}\": the prefix length must be 0 to {max}"))?,
    };
    Ok((ip, len))
}

fn parse_dscp(d: &NumOrName) -> Result<u8, String> {
    let err = || format!("dscp = {d}: expected 0 to 63, or ef, va, cs0 to cs7, af11 to af43");
    match d {
        NumOrName::Num(n) => u8::try_from(*n).ok().filter(|&v| v < 64).ok_or_else(err),
        NumOrName::Name(s) => {
            let s = s.trim().to_ascii_lowercase();
            if s == "ef" {
                return Ok(46);
            }
            if s == "va" {
                return Ok(44);
            }
            if let Some(c) = s.strip_prefix("cs") {
                return c
                    .parse::<u8>()
                    .ok()
                    .filter(|&c| c <= 7)
                    .map(|c| c << 3)
                    .ok_or_else(err);
            }
            if let Some(af) = s.strip_prefix("af") {
                let b = af.as_bytes();
                if b.len() == 2 && (b'1'..=b'4').contains(&b[0]) && (b'1'..=b'3').contains(&b[1]) {
                    return Ok(((b[0] - b'0') << 3) | ((b[1] - b'0') << 1));
                }
            }
            Err(err())
        }
    }
}

#[cfg(test)]
mod flow_tests {
    use super::tests::channels;
    use super::*;
    use crate::session::ChannelParams;

    fn apply(toml_rules: Vec<FlowRuleSettings>) -> Result<Config, SettingError> {
        let mut c = Config::new(
            vec![
                ChannelParams {
                    name: "a".into(),
                    weight: 1,
                };
                2
            ],
            1400,
            vec![7; 32],
        );
        SessionSettings {
            flow: toml_rules,
            ..SessionSettings::default()
        }
        .apply(&mut c)?;
        Ok(c)
    }

    fn rule(policy: &str) -> FlowRuleSettings {
        FlowRuleSettings {
            policy: policy.into(),
            protocol: None,
            port: None,
            address: None,
            dscp: None,
        }
    }

    #[test]
    fn flow_rules_are_read() {
        let c = apply(vec![
            FlowRuleSettings {
                port: Some(NumOrName::Num(5060)),
                protocol: Some(NumOrName::Name("udp".into())),
                ..rule("redundant")
            },
            FlowRuleSettings {
                port: Some(NumOrName::Name("10000-20000".into())),
                address: Some("2001:db8::/32".into()),
                ..rule("lowest-delay")
            },
            FlowRuleSettings {
                dscp: Some(NumOrName::Name("AF41".into())),
                ..rule("bond")
            },
        ])
        .unwrap();
        let r = &c.flows.rules;
        assert_eq!(r[0].policy, FlowPolicy::Redundant);
        assert_eq!((r[0].protocol, r[0].ports), (Some(17), Some((5060, 5060))));
        assert_eq!(r[1].ports, Some((10000, 20000)));
        assert_eq!(r[1].net, Some(("2001:db8::".parse().unwrap(), 32)));
        assert_eq!(r[2].dscp, Some(34));
        assert_eq!(parse_dscp(&NumOrName::Name("ef".into())), Ok(46));
        assert_eq!(parse_dscp(&NumOrName::Name("cs5".into())), Ok(40));
        assert_eq!(parse_dscp(&NumOrName::Name("af11".into())), Ok(10));
    }

    #[test]
    fn bad_flow_rules_say_what_is_wrong() {
        for (r, says) in [
            (rule("fast"), "unknown flow policy 'fast'"),
            (
                rule("redundant"),
                "names no protocol, port, address or dscp",
            ),
            (
                FlowRuleSettings {
                    port: Some(NumOrName::Num(70000)),
                    ..rule("redundant")
                },
                "port = 70000",
            ),
            (
                FlowRuleSettings {
                    port: Some(NumOrName::Name("20-10".into())),
                    ..rule("redundant")
                },
                "first port is above its last",
            ),
            (
                FlowRuleSettings {
                    address: Some("10.0.0.0/33".into()),
                    ..rule("redundant")
                },
                "prefix length must be 0 to 32",
            ),
            (
                FlowRuleSettings {
                    address: Some("example.com".into()),
                    ..rule("redundant")
                },
                "expected an IPv4 or IPv6 address",
            ),
            (
                FlowRuleSettings {
                    dscp: Some(NumOrName::Num(64)),
                    ..rule("redundant")
                },
                "dscp = 64",
            ),
            (
                FlowRuleSettings {
                    protocol: Some(NumOrName::Name("icmp".into())),
                    port: Some(NumOrName::Num(5)),
                    ..rule("redundant")
                },
                "a port needs protocol tcp or udp",
            ),
        ] {
            let e = apply(vec![r]).unwrap_err();
            assert_eq!(e.key, "flow");
            assert!(e.reason.contains(says), "{e}");
            assert!(e.reason.starts_with("[[session.flow]] number 1: "), "{e}");
        }
        let s = SessionSettings {
            flow_copies: 1,
            ..SessionSettings::default()
        };
        let mut c = Config::new(
            vec![ChannelParams {
                name: "a".into(),
                weight: 1,
            }],
            1400,
            vec![7; 32],
        );
        assert_eq!(s.apply(&mut c).unwrap_err().key, "flow_copies");
    }

    #[test]
    fn tcp_streams_unset_follows_the_pacing() {
        let mut c = Config::new(channels(1), 1400, vec![7; 32]);
        SessionSettings::default().apply(&mut c).unwrap();
        assert!(c.streams.is_none(), "not paced: TCP as packets");
        let mut c = Config::new(channels(1), 1400, vec![7; 32]);
        c.pacing = Some(crate::session::PacingConfig::new(vec![50e6]));
        SessionSettings::default().apply(&mut c).unwrap();
        assert!(c.streams.is_some(), "paced: TCP as streams");
        let off = SessionSettings {
            tcp_streams: Some(false),
            ..SessionSettings::default()
        };
        off.apply(&mut c).unwrap();
        assert!(c.streams.is_none());
    }

    #[test]
    fn tcp_streams_to_takes_networks_and_names_a_bad_one() {
        let mut c = Config::new(channels(1), 1400, vec![7; 32]);
        let s = SessionSettings {
            tcp_streams: Some(true),
            tcp_streams_to: vec!["10.0.0.0/8".into(), "2001:db8::1".into()],
            ..SessionSettings::default()
        };
        s.apply(&mut c).unwrap();
        let allow = &c.streams.as_ref().unwrap().allow_to;
        assert_eq!(
            allow,
            &[
                ("10.0.0.0".parse().unwrap(), 8),
                ("2001:db8::1".parse().unwrap(), 128)
            ]
        );
        let s = SessionSettings {
            tcp_streams: Some(true),
            tcp_streams_to: vec!["10.0.0.0/33".into()],
            ..SessionSettings::default()
        };
        let e = s.apply(&mut c).unwrap_err();
        assert_eq!(e.key, "tcp_streams_to");
        assert!(e.reason.contains("prefix length"), "{e}");
        let s = SessionSettings {
            tcp_streams: Some(true),
            tcp_streams_except: vec![NumOrName::Num(22), NumOrName::Name("5060-5070".into())],
            ..SessionSettings::default()
        };
        s.apply(&mut c).unwrap();
        let except = &c.streams.as_ref().unwrap().except_ports;
        assert_eq!(except, &[(22, 22), (5060, 5070)]);
        let s = SessionSettings {
            tcp_streams: Some(true),
            tcp_streams_except: vec![NumOrName::Name("70000".into())],
            ..SessionSettings::default()
        };
        assert_eq!(s.apply(&mut c).unwrap_err().key, "tcp_streams_except");
    }
}
