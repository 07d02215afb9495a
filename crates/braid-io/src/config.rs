//! Session configuration: the Rust value ([`SessionConfig`]) and the TOML file format
//! shared by `braid tunnel` and `braid bench` ([`FileConfig`]). The `[session]` keys are
//! the settings schema's (`braid_proto::session::schema`, `docs/settings.md`).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use braid_proto::session::schema::{SessionSettings, SettingError};
use braid_proto::session::SecurityMode;
use braid_proto::units::parse_duration;
use braid_proto::{Mode, StripeConfig};
use serde::Deserialize;

use crate::keys;

/// One channel: a UDP socket bound to `local`, aimed at the peer's `remote` (or, on
/// the end that waits to be reached, at the address the peer's first authenticated
/// datagram on it comes from). Either way the peer's address follows what
/// authenticates: a client behind a NAT whose mapping changes is followed.
#[derive(Clone, Debug, PartialEq)]
pub struct ChannelConfig {
    /// A name for logs and stats.
    pub name: String,
    /// Local address to bind (port 0: any free port; `0.0.0.0:0` for a client behind
    /// NAT).
    pub local: SocketAddr,
    /// The peer's address for this channel to start with; `None`: learnt from the
    /// peer's first authenticated datagram (the end that waits; its `local` needs a
    /// fixed port).
    pub remote: Option<SocketAddr>,
    /// Bind the socket to this interface (SO_BINDTODEVICE; needs CAP_NET_RAW).
    pub device: Option<String>,
    /// Relative capacity (any unit); SRR quanta and GRR counts are proportional to it.
    pub weight: u32,
    /// The path MTU of this channel, in bytes (IP packet size).
    pub mtu: u32,
    /// Pace this channel at this rate, bit/s on the wire (`session::pacing`): set it
    /// a little below the link's rate. `None`: not paced (or measured, `pace_auto`).
    pub pace_bps: Option<u64>,
    /// Measure the channel's rate when it comes up and pace it at that
    /// (`pace = "auto"`, `session::probe`; the configuration file's default, `pace =
    /// "off"` turns it off). When any channel is measured, every channel is, and one
    /// with a configured `pace` is paced at the lower of the two.
    pub pace_auto: bool,
}

impl ChannelConfig {
    /// A channel with weight 1 and MTU 1500.
    pub fn new(name: impl Into<String>, local: SocketAddr, remote: SocketAddr) -> Self {
        ChannelConfig {
            name: name.into(),
            local,
            remote: Some(remote),
            device: None,
            weight: 1,
            mtu: 1500,
            pace_bps: None,
            pace_auto: false,
        }
    }

    /// A channel that waits on `local` (a fixed port) for the peer, whose address it
    /// learns from the peer's first authenticated datagram.
    pub fn waiting(name: impl Into<String>, local: SocketAddr) -> Self {
        ChannelConfig {
            remote: None,
            ..ChannelConfig::new(name, local, local)
        }
    }

    /// Check this channel (number `i`): its MTU and its addresses.
    fn validate(&self, i: usize) -> Result<(), String> {
        let name = &self.name;
        if self.mtu < 576 {
            return Err(format!(
                "channel {i} ({name}): mtu {} is below 576",
                self.mtu
            ));
        }
        match self.remote {
            Some(r) if self.local.is_ipv4() != r.is_ipv4() => Err(format!(
                "channel {i} ({name}): local {} and remote {r} are of different address families",
                self.local
            )),
            Some(r) if r.port() == 0 => Err(format!(
                "channel {i} ({name}): remote {r}: port 0 cannot be a destination"
            )),
            None if self.local.port() == 0 => Err(format!(
                "channel {i} ({name}): no remote and local port 0: the peer could not reach this channel; give a remote, or a fixed local port to wait on"
            )),
            _ => Ok(()),
        }
    }

    /// IP + UDP header bytes for this channel's address family.
    pub fn udp_overhead(&self) -> u32 {
        if self.local.is_ipv4() {
            28
        } else {
            48
        }
    }
}

/// Everything one end of a session needs. Both ends must agree on the channel order,
/// the weights, the scheduler, the mode and the key. Its `Debug` shows no key.
#[derive(Clone, PartialEq)]
pub struct SessionConfig {
    /// The channels, in the same order at both ends.
    pub channels: Vec<ChannelConfig>,
    /// The session machine's settings, from the one schema
    /// ([`braid_proto::session::schema::SessionSettings`]): mode, scheduler, keys,
    /// timers, repair, credits and the rest. Its `channels`, `max_datagram` and
    /// `pacing` (and `pmtu`'s bounds) follow from [`SessionConfig::channels`] and are filled in by
    /// [`SessionConfig::session_config`]; what is set there is not used.
    pub core: braid_proto::session::Config,
    /// SO_RCVBUF / SO_SNDBUF per channel socket, in bytes (0: kernel default).
    pub socket_buffer: usize,
    /// Tokens a paced channel may save up, as time at its rate.
    pub pace_burst: braid_proto::Duration,
    /// CoDel on the pacer's transmit queue.
    pub pace_codel: bool,
    /// `tcp_streams` unset: the streams' configuration, for a driver that terminates
    /// TCP (a TUN device of its own or shared) to take up
    /// ([`SessionConfig::serve_tcp`]). Any other session (packets from an API or
    /// a bench) does not announce streams it could not answer.
    pub tcp_streams_auto: Option<braid_proto::stream::StreamConfig>,
}

impl std::fmt::Debug for SessionConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Everything but the secrets, through the core's own redacting Debug.
        f.debug_struct("SessionConfig")
            .field("channels", &self.channels)
            .field("session", &self.session_config())
            .field("socket_buffer", &self.socket_buffer)
            .finish()
    }
}

impl SessionConfig {
    /// These channels and key with the default settings
    /// ([`SessionSettings::default`], the same as a configuration file that sets
    /// nothing): SRR, logical reception, heartbeat 50 ms, down after 300 ms, rejoin
    /// after 150 ms; adaptive weights when every channel is paced.
    pub fn new(channels: Vec<ChannelConfig>, key: impl Into<Vec<u8>>) -> SessionConfig {
        let mut c = SessionConfig {
            channels,
            core: braid_proto::session::Config::new(Vec::new(), 0, key.into()),
            socket_buffer: 0,
            pace_burst: braid_proto::Duration::ZERO,
            pace_codel: true,
            tcp_streams_auto: None,
        };
        // The defaults are valid for any channels (a unit test checks it).
        let applied = c.apply(&SessionSettings::default());
        debug_assert!(applied.is_ok(), "{applied:?}");
        c
    }

    /// Apply every setting of `s` but the keys (which are files and secrets:
    /// [`FileConfig::parse`] reads them) through the session's one schema.
    pub fn apply(&mut self, s: &SessionSettings) -> Result<(), SettingError> {
        // The schema checks some settings against the channels (a marker position
        // names one), so it sees the whole session.
        let mut core = self.session_config();
        s.apply(&mut core)?;
        // What follows from the channels stays with them (`session_config`).
        let pmtu = core
            .pmtu
            .take()
            .map(|m| braid_proto::session::pmtu::Config {
                bounds: Vec::new(),
                ..m
            });
        self.core = braid_proto::session::Config {
            channels: Vec::new(),
            max_datagram: 0,
            pacing: None,
            // Its per-channel bounds too (a reload compares the rest).
            pmtu,
            ..core
        };
        // Unset, adaptive weights follow whether every channel is paced; a channel
        // with `pace = "off"` beside measured ones looks paced to the core (which
        // measures every channel once one is), so ask the channels themselves.
        let paced = self
            .channels
            .iter()
            .all(|c| c.pace_bps.is_some() || c.pace_auto);
        self.core.adaptive = s.adaptive.unwrap_or(paced);
        // Unset, TCP as streams where every channel is paced (asked of the channels,
        // as above), and only once a driver that terminates TCP takes it up.
        self.tcp_streams_auto = None;
        if s.tcp_streams.is_none() {
            self.tcp_streams_auto = self.core.streams.take().filter(|_| paced);
        }
        self.pace_burst = s.pace_burst.0;
        self.pace_codel = s.pace_codel;
        self.socket_buffer = s.socket_buffer;
        Ok(())
    }

    /// For a driver that terminates TCP on a TUN device: TCP carried as streams if
    /// `tcp_streams` is unset and every channel is paced (`true` already set it).
    pub fn serve_tcp(&mut self) {
        if self.core.streams.is_none() {
            self.core.streams = self.tcp_streams_auto.take();
        }
    }

    /// The interval of hellos and heartbeat markers.
    pub fn heartbeat(&self) -> Duration {
        std_duration(self.core.heartbeat)
    }

    /// How long a channel may deliver nothing before it is declared down.
    pub fn dead_after(&self) -> Duration {
        std_duration(self.core.dead_after)
    }

    /// Pacing from the channels' `pace` (rates, `auto`), with the pacer's tunings.
    fn pacing(&self) -> Option<braid_proto::session::PacingConfig> {
        let paced = self
            .channels
            .iter()
            .any(|c| c.pace_bps.is_some() || c.pace_auto);
        paced.then(|| {
            let mut p = braid_proto::session::PacingConfig {
                probe: self.channels.iter().any(|c| c.pace_auto),
                burst: self.pace_burst,
                ..braid_proto::session::PacingConfig::new(
                    self.channels
                        .iter()
                        .map(|c| c.pace_bps.unwrap_or(0) as f64)
                        .collect(),
                )
            };
            if !self.pace_codel {
                p.codel = None;
            }
            p
        })
    }

    /// The largest datagram any channel carries: the smallest channel MTU less the IP and
    /// UDP headers.
    pub fn max_datagram(&self) -> u32 {
        self.channels
            .iter()
            .map(|c| c.mtu.saturating_sub(c.udp_overhead()))
            .min()
            .unwrap_or(0)
    }

    /// Bytes the mode puts in front of a data packet (5 in seq mode, else 0).
    pub fn data_overhead(&self) -> u32 {
        if self.core.mode == Mode::Seq {
            braid_proto::wire::seq::HEADER_LEN as u32
        } else {
            0
        }
    }

    /// The largest message [`crate::Session::send`] accepts: what remains of the
    /// smallest datagram after the mode's header and a possible one-byte escape.
    pub fn max_message(&self) -> usize {
        (self.max_inner().saturating_sub(self.data_overhead()) as usize).saturating_sub(1)
    }

    /// The largest datagram before the security envelope: what the striper may make.
    pub fn max_inner(&self) -> u32 {
        self.max_datagram()
            .saturating_sub(self.core.security.data_overhead() as u32)
    }

    /// Check the configuration: the session machine's rules (channel count and
    /// weights, keys, timers, striping), then each channel's addresses and MTU.
    pub fn validate(&self) -> Result<(), String> {
        self.session_config().validate()?;
        for (i, c) in self.channels.iter().enumerate() {
            c.validate(i)?;
            for (j, d) in self.channels.iter().enumerate().take(i) {
                if d.local == c.local && c.local.port() != 0 {
                    return Err(format!(
                        "channels {j} and {i} both bind {}: each channel needs its own local address",
                        c.local
                    ));
                }
            }
        }
        Ok(())
    }

    /// The session machine's configuration (everything but addresses and sockets).
    pub fn session_config(&self) -> braid_proto::session::Config {
        braid_proto::session::Config {
            channels: self
                .channels
                .iter()
                .map(|c| braid_proto::session::ChannelParams {
                    name: c.name.clone(),
                    weight: c.weight,
                })
                .collect(),
            max_datagram: self.max_datagram(),
            pacing: self.pacing(),
            pmtu: self.pmtu(),
            ..self.core.clone()
        }
    }

    /// Path MTU discovery, if on: each channel searched from 1280 bytes of IP packet
    /// (or its `mtu`, if lower) to its `mtu`, less its IP and UDP headers.
    fn pmtu(&self) -> Option<braid_proto::session::pmtu::Config> {
        let mut m = self.core.pmtu.clone()?;
        m.bounds = self
            .channels
            .iter()
            .map(|c| {
                let max = c.mtu.saturating_sub(c.udp_overhead());
                let base = braid_proto::session::pmtu::BASE_IP
                    .min(c.mtu)
                    .saturating_sub(c.udp_overhead())
                    .max(braid_proto::session::pmtu::MIN_SIZE);
                (base.min(max), max)
            })
            .collect();
        Some(m)
    }

    /// The braid-proto configuration for an epoch over these physical channels.
    pub fn stripe_config(&self, members: &[usize]) -> StripeConfig {
        self.session_config().stripe_config(members)
    }
}

/// The session core's time as the standard library's.
pub fn std_duration(d: braid_proto::Duration) -> Duration {
    Duration::from_micros(d.as_micros())
}

/// A bad configuration file: which file, which key, why.
#[derive(Debug, thiserror::Error)]
#[error("config {file}: {}{reason}", if key.is_empty() { String::new() } else { format!("{key}: ") })]
pub struct ConfigFileError {
    /// The file.
    pub file: String,
    /// The key (dotted path, e.g. `channel[1].weight`), `line N` for a TOML syntax
    /// error, empty when the file cannot be read.
    pub key: String,
    /// What is wrong.
    pub reason: String,
}

/// The `[tunnel]` section.
#[derive(Clone, Debug, PartialEq)]
pub struct TunnelConfig {
    /// TUN device name.
    pub name: String,
    /// IPv4 address and prefix length for the device.
    pub address: Option<(Ipv4Addr, u8)>,
    /// IPv6 address and prefix length for the device (the tunnel carries IPv4 and
    /// IPv6 packets either way; this is the device's own address).
    pub address6: Option<(Ipv6Addr, u8)>,
    /// MTU of the device; `None`: the largest that fits every channel.
    pub mtu: Option<u32>,
    /// Unix socket for `braid status`. From a file: `tunnel.control`, else
    /// `/run/braid/NAME.sock` after the device name (never `None`).
    pub control: Option<PathBuf>,
    /// Prometheus endpoint address.
    pub metrics: Option<SocketAddr>,
    /// Period of the one-line log summary (zero: off).
    pub log_interval: Duration,
    /// Log level (`off`, `error`, `warn`, `info`, `debug`, `trace`); `None`: the
    /// command line's, RUST_LOG, else `info`. A reload applies it.
    pub log_level: Option<String>,
}

/// A parsed configuration file.
#[derive(Clone, Debug, PartialEq)]
pub struct FileConfig {
    /// The session. On a server (with `peers`) its `peer_public_key` is `None`: each
    /// peer's session takes the peer's key ([`PeerConfig::session`]).
    pub session: SessionConfig,
    /// The `[tunnel]` section, if present.
    pub tunnel: Option<TunnelConfig>,
    /// The `[[peer]]` sections: empty for a point-to-point tunnel (one peer, named by
    /// `session.peer_public_key`); a server serves each of these on its channels.
    pub peers: Vec<PeerConfig>,
}

/// One `[[peer]]` of a server: who it is and which inner addresses are its
/// (cryptokey routing: packets to them go to this peer, and only packets from them are
/// accepted from it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerConfig {
    /// A name for logs and status (default `peerN`, N its position).
    pub name: String,
    /// Its static public key.
    pub public_key: [u8; 32],
    /// Its inner address prefixes (IPv4 and IPv6).
    pub allowed_ips: Vec<ipnet::IpNet>,
}

impl PeerConfig {
    /// The session configuration for this peer on a server with `server`'s settings.
    pub fn session(&self, server: &SessionConfig) -> SessionConfig {
        let mut s = server.clone();
        s.core.peer_public_key = Some(self.public_key);
        s
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    tunnel: Option<RawTunnel>,
    session: Option<SessionSettings>,
    #[serde(default)]
    channel: Vec<RawChannel>,
    #[serde(default)]
    peer: Vec<RawPeer>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPeer {
    name: Option<String>,
    public_key: Option<String>,
    #[serde(default)]
    allowed_ips: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTunnel {
    name: Option<String>,
    address: Option<Addresses>,
    mtu: Option<u32>,
    control: Option<String>,
    metrics: Option<String>,
    log_interval: Option<String>,
    log_level: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawChannel {
    name: Option<String>,
    local: Option<String>,
    remote: Option<String>,
    device: Option<String>,
    weight: Option<u32>,
    mtu: Option<u32>,
    pace: Option<String>,
}

/// `tunnel.address`: one `ADDRESS/PREFIX`, or a list of them (at most one IPv4 and
/// one IPv6).
#[derive(Deserialize)]
#[serde(untagged)]
enum Addresses {
    One(String),
    Many(Vec<String>),
}

/// Parse `X:Y::Z/len` (IPv6).
pub fn parse_cidr6(s: &str) -> Result<(Ipv6Addr, u8), String> {
    let (a, l) = s
        .split_once('/')
        .ok_or_else(|| format!("'{s}' is not ADDRESS/PREFIX (e.g. fd77::1/64)"))?;
    let addr: Ipv6Addr = a
        .parse()
        .map_err(|_| format!("'{a}' is not an IPv6 address"))?;
    let len: u8 = l
        .parse()
        .ok()
        .filter(|&n| n <= 128)
        .ok_or_else(|| format!("'{l}' is not a prefix length 0..=128"))?;
    Ok((addr, len))
}

/// The device's addresses from `tunnel.address`: at most one of each family.
type TunAddresses = (Option<(Ipv4Addr, u8)>, Option<(Ipv6Addr, u8)>);

fn parse_addresses(a: &Addresses) -> Result<TunAddresses, String> {
    let list = match a {
        Addresses::One(s) => std::slice::from_ref(s),
        Addresses::Many(v) => &v[..],
    };
    let (mut v4, mut v6) = (None, None);
    for s in list {
        if s.split_once('/').is_some_and(|(a, _)| a.contains(':')) {
            if v6.replace(parse_cidr6(s)?).is_some() {
                return Err(format!(
                    "'{s}': two IPv6 addresses; give at most one of each family"
                ));
            }
        } else if v4.replace(parse_cidr(s)?).is_some() {
            return Err(format!(
                "'{s}': two IPv4 addresses; give at most one of each family"
            ));
        }
    }
    Ok((v4, v6))
}

/// Parse `A.B.C.D/len`.
pub fn parse_cidr(s: &str) -> Result<(Ipv4Addr, u8), String> {
    let (a, l) = s
        .split_once('/')
        .ok_or_else(|| format!("'{s}' is not ADDRESS/PREFIX (e.g. 10.77.0.1/24)"))?;
    let addr: Ipv4Addr = a
        .parse()
        .map_err(|_| format!("'{a}' is not an IPv4 address"))?;
    let len: u8 = l
        .parse()
        .ok()
        .filter(|&n| n <= 32)
        .ok_or_else(|| format!("'{l}' is not a prefix length 0..=32"))?;
    Ok((addr, len))
}

/// A file that holds a key inline (`session.key`) must be as private as a key file:
/// readable by its owner only (the key is read as text, so check the file itself).
fn inline_key_private(path: &Path, text: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let inline = toml::from_str::<toml::Table>(text)
        .ok()
        .and_then(|t| t.get("session")?.get("key").cloned())
        .is_some();
    if !inline {
        return Ok(());
    }
    let mode = std::fs::metadata(path)
        .map_err(|e| format!("cannot check the file's permissions: {e}"))?
        .permissions()
        .mode()
        & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "the key is inline and {} is readable by group or others (mode {mode:o}): run chmod 600 {}, or move the key to a private key_file",
            path.display(),
            path.display()
        ));
    }
    Ok(())
}

/// Deserialize TOML text; on error, the key at fault as a dotted path (e.g.
/// `channel[1].weight`; for an unknown key, the key itself, `session.hartbeat`) and
/// toml's report of it,
/// which shows the line and column. A syntax error belongs to no key: its key is the
/// line (`line 3`).
fn parse_toml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, (String, String)> {
    serde_path_to_error::deserialize(toml::Deserializer::new(text)).map_err(|e| {
        let mut path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            let line = inner
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
            path = line.map_or("the file".into(), |l| format!("line {l}"));
        }
        let reason = inner.to_string().trim_end().replace('\n', "\n    ");
        (path, reason)
    })
}

impl FileConfig {
    /// Read and check a configuration file.
    pub fn load(path: &Path) -> Result<FileConfig, ConfigFileError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigFileError {
            file: file.clone(),
            key: String::new(),
            reason: format!("cannot read: {e}"),
        })?;
        let cfg = FileConfig::parse(&file, &text, path.parent())?;
        inline_key_private(path, &text).map_err(|reason| ConfigFileError {
            file,
            key: "session.key".into(),
            reason,
        })?;
        Ok(cfg)
    }

    /// Parse configuration text; `file` names it in errors, `dir` resolves `key_file`.
    pub fn parse(
        file: &str,
        text: &str,
        dir: Option<&Path>,
    ) -> Result<FileConfig, ConfigFileError> {
        let err = |(key, reason): Fault| ConfigFileError {
            file: file.to_string(),
            key,
            reason,
        };
        let raw: RawFile = parse_toml(text).map_err(err)?;
        let s = raw.session.unwrap_or_default();
        let channels = parse_channels(&raw.channel).map_err(err)?;
        let peers = parse_peers(&raw.peer).map_err(err)?;
        let (key, private_key, peer_public_key) = if peers.is_empty() {
            read_keys(&s, dir).map_err(err)?
        } else {
            server_keys(&s, dir, &channels).map_err(err)?
        };
        let mut cfg = SessionConfig::new(channels, key);
        cfg.core.private_key = private_key;
        cfg.core.peer_public_key = peer_public_key;
        // Every other setting, through the session's one schema.
        cfg.apply(&s)
            .map_err(|e| err((format!("session.{}", e.key), e.reason)))?;
        match peers.first() {
            None => cfg.validate(),
            // A server: what each peer's session will run with.
            Some(p) => p.session(&cfg).validate(),
        }
        .map_err(|r| err(("session".into(), r)))?;
        if !peers.is_empty() && cfg.core.security == SecurityMode::None {
            return Err(err(fault(
                "session.security",
                "\"none\" cannot serve [[peer]] sections: a server finds each datagram's peer by its sealed envelope; use encrypt or auth",
            )));
        }
        if let Some(me) = cfg.core.private_key.map(|k| keys::public_key(&k)) {
            if let Some(i) = peers.iter().position(|p| p.public_key == me) {
                return Err(err(fault(
                    &format!("peer[{i}].public_key"),
                    "is this server's own public key: each peer has its own key pair",
                )));
            }
        }
        let tunnel = match raw.tunnel {
            None => None,
            Some(t) => Some(parse_tunnel(t, &cfg).map_err(err)?),
        };
        Ok(FileConfig {
            session: cfg,
            tunnel,
            peers,
        })
    }
}

/// A key at fault (dotted path) and why.
type Fault = (String, String);

fn fault(key: &str, reason: impl Into<String>) -> Fault {
    (key.to_string(), reason.into())
}

/// The `[[channel]]` entries.
fn parse_channels(raw: &[RawChannel]) -> Result<Vec<ChannelConfig>, Fault> {
    if raw.is_empty() {
        return Err(fault(
            "channel",
            "no [[channel]] entries: at least one channel is needed",
        ));
    }
    raw.iter()
        .enumerate()
        .map(|(i, c)| parse_channel(i, c))
        .collect()
}

/// A channel's local and remote address: a client's local may be left out (any
/// free port, on the remote's family); an end without a remote waits on a fixed port.
fn parse_channel_addresses(
    i: usize,
    c: &RawChannel,
) -> Result<(SocketAddr, Option<SocketAddr>), Fault> {
    let k = |f: &str| format!("channel[{i}].{f}");
    let addr = |f: &str, v: &str| -> Result<SocketAddr, Fault> {
        v.parse()
            .map_err(|_| (k(f), format!("'{v}' is not an IP:PORT address")))
    };
    let remote = match &c.remote {
        Some(r) => Some(addr("remote", r)?),
        None => None,
    };
    if remote.is_some_and(|r| r.port() == 0) {
        return Err((k("remote"), "port 0 cannot be a destination".into()));
    }
    let local = match (&c.local, remote) {
        (Some(l), _) => addr("local", l)?,
        // A client: any free port, on the remote's address family.
        (None, Some(r)) if r.is_ipv4() => SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, 0)),
        (None, Some(_)) => SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0)),
        (None, None) => {
            return Err((
                k("local"),
                "neither local nor remote: give remote (the peer's address; local may then be left out), or local with a fixed port to wait for the peer on".into(),
            ))
        }
    };
    if remote.is_none() && local.port() == 0 {
        return Err((
            k("remote"),
            format!("missing, and local {local} has no fixed port: the peer could not reach this channel; give remote, or a fixed local port to wait on"),
        ));
    }
    Ok((local, remote))
}

/// A channel's `pace`: measured (`auto`, the default), `off`, or a rate.
fn parse_pace(i: usize, pace: Option<&str>) -> Result<(Option<u64>, bool), Fault> {
    Ok(match pace {
        None | Some("auto") => (None, true),
        Some("off") => (None, false),
        Some(v) => (
            Some(braid_proto::units::parse_rate(v).map_err(|e| {
                (
                    format!("channel[{i}].pace"),
                    format!("{e} (or \"auto\": measure the link; \"off\": no pacing)"),
                )
            })?),
            false,
        ),
    })
}

/// `[[channel]]` number `i`: its addresses, weight, MTU and pace, each checked.
fn parse_channel(i: usize, c: &RawChannel) -> Result<ChannelConfig, Fault> {
    let k = |f: &str| format!("channel[{i}].{f}");
    let (local, remote) = parse_channel_addresses(i, c)?;
    let weight = c.weight.unwrap_or(1);
    if weight == 0 {
        return Err((k("weight"), "must be at least 1".into()));
    }
    let mtu = c.mtu.unwrap_or(1500);
    if !(576..=65535).contains(&mtu) {
        return Err((k("mtu"), format!("{mtu} is outside 576..=65535")));
    }
    let (pace_bps, pace_auto) = parse_pace(i, c.pace.as_deref())?;
    Ok(ChannelConfig {
        name: c.name.clone().unwrap_or_else(|| format!("ch{i}")),
        local,
        remote,
        device: c.device.clone(),
        weight,
        mtu,
        pace_bps,
        pace_auto,
    })
}

/// Our keys: the pre-shared key (inline or from a file), our static private key and
/// the peer's public key; at least one way to authenticate the handshake.
type Keys = (Vec<u8>, Option<[u8; 32]>, Option<[u8; 32]>);

fn read_keys(s: &SessionSettings, dir: Option<&Path>) -> Result<Keys, Fault> {
    read_keys_for(s, dir, false)
}

/// [`read_keys`]; a `server`'s peers' public keys are in their `[[peer]]` sections.
fn read_keys_for(s: &SessionSettings, dir: Option<&Path>, server: bool) -> Result<Keys, Fault> {
    let file_path = |f: &str| match dir {
        Some(d) if Path::new(f).is_relative() => d.join(f),
        _ => PathBuf::from(f),
    };
    let e = |key: &'static str| move |e: keys::KeyError| fault(key, e.to_string());
    let key = match (&s.key, &s.key_file) {
        (Some(_), Some(_)) => {
            return Err(fault(
                "session.key_file",
                "give either key or key_file, not both",
            ))
        }
        (Some(k), None) => keys::decode(k).map_err(e("session.key"))?.to_vec(),
        (None, Some(f)) => keys::read_file(&file_path(f))
            .map_err(e("session.key_file"))?
            .to_vec(),
        (None, None) => Vec::new(),
    };
    let private_key = match &s.private_key_file {
        Some(f) => Some(keys::read_file(&file_path(f)).map_err(e("session.private_key_file"))?),
        None => None,
    };
    let peer_public_key = match &s.peer_public_key {
        Some(k) => Some(keys::decode(k).map_err(e("session.peer_public_key"))?),
        None => None,
    };
    match (key.is_empty(), private_key.is_some(), peer_public_key.is_some()) {
        (true, false, false) => Err(fault(
            "session.key",
            "missing: a pre-shared key (key_file = \"braid.key\", made with `braid genkey > braid.key`), or static keys (private_key_file and peer_public_key), authenticates the handshake",
        )),
        (_, true, false) if server => Ok((key, private_key, None)),
        (_, true, false) => Err(fault("session.peer_public_key", "missing: private_key_file is set, so the peer's public key (`braid pubkey < its private key`) is needed too")),
        (_, false, true) => Err(fault("session.private_key_file", "missing: peer_public_key is set, so our own private key is needed too")),
        _ => Ok((key, private_key, peer_public_key)),
    }
}

/// The `[[peer]]` sections: each a public key and its allowed IPs; no key, name or
/// prefix twice.
fn parse_peers(raw: &[RawPeer]) -> Result<Vec<PeerConfig>, Fault> {
    let mut peers: Vec<PeerConfig> = Vec::with_capacity(raw.len());
    let mut owner: std::collections::HashMap<ipnet::IpNet, usize> = Default::default();
    for (i, p) in raw.iter().enumerate() {
        let k = |f: &str| format!("peer[{i}].{f}");
        let name = p.name.clone().unwrap_or_else(|| format!("peer{i}"));
        if name.is_empty() || name.len() > 64 || name.chars().any(|c| c.is_control()) {
            return Err((
                k("name"),
                format!(
                    "'{}' must be 1 to 64 printable characters",
                    name.escape_default()
                ),
            ));
        }
        let text = p.public_key.as_deref().ok_or_else(|| {
            (
                k("public_key"),
                "missing: the peer's static public key (`braid pubkey < its private key`)"
                    .to_string(),
            )
        })?;
        let public_key = keys::decode(text).map_err(|e| (k("public_key"), e.to_string()))?;
        if let Some(j) = peers.iter().position(|q| q.name == name) {
            return Err((k("name"), format!("'{name}' is also peer[{j}]'s name")));
        }
        if let Some(j) = peers.iter().position(|q| q.public_key == public_key) {
            return Err((
                k("public_key"),
                format!(
                    "also peer[{j}]'s ({}): each peer has its own key",
                    peers[j].name
                ),
            ));
        }
        let mut allowed_ips = Vec::with_capacity(p.allowed_ips.len());
        for a in &p.allowed_ips {
            let net = parse_prefix(a).map_err(|r| (k("allowed_ips"), r))?;
            if let Some(&j) = owner.get(&net) {
                return Err((
                    k("allowed_ips"),
                    format!(
                        "{net} is also in peer[{j}]'s ({}): a prefix belongs to one peer",
                        peers.get(j).map_or(name.as_str(), |q| q.name.as_str())
                    ),
                ));
            }
            owner.insert(net, i);
            allowed_ips.push(net);
        }
        peers.push(PeerConfig {
            name,
            public_key,
            allowed_ips,
        });
    }
    Ok(peers)
}

/// An allowed-IPs entry: `ADDRESS/PREFIX` of either family, or a bare address (one
/// host); no bits set past the prefix.
pub fn parse_prefix(s: &str) -> Result<ipnet::IpNet, String> {
    let net: ipnet::IpNet = match s.parse() {
        Ok(n) => n,
        Err(_) => match s.parse::<std::net::IpAddr>() {
            Ok(a) => ipnet::IpNet::from(a),
            Err(_) => {
                return Err(format!(
                    "'{s}' is not ADDRESS/PREFIX (e.g. 10.77.1.0/24 or fd77:1::/64) or an address"
                ))
            }
        },
    };
    if net.trunc() != net {
        return Err(format!(
            "'{s}' has bits set past its prefix length: did you mean {}?",
            net.trunc()
        ));
    }
    Ok(net)
}

/// A server's keys: our static private key (and the pre-shared key mixed into every
/// handshake, if set); each peer's public key is in its `[[peer]]`. Its channels wait
/// on fixed ports for the peers.
fn server_keys(
    s: &SessionSettings,
    dir: Option<&Path>,
    channels: &[ChannelConfig],
) -> Result<Keys, Fault> {
    if s.peer_public_key.is_some() {
        return Err(fault(
            "session.peer_public_key",
            "a server ([[peer]] sections) takes each peer's key from its [[peer]] public_key; remove this one",
        ));
    }
    if s.private_key_file.is_none() {
        return Err(fault(
            "session.private_key_file",
            "missing: a server ([[peer]] sections) needs its static private key (`braid genkey > server.key`); each peer has the server's public key as its peer_public_key",
        ));
    }
    for (i, c) in channels.iter().enumerate() {
        if c.remote.is_some() {
            return Err((
                format!("channel[{i}].remote"),
                "a server ([[peer]] sections) learns each peer's address on each channel from its authenticated datagrams: leave remote out and give local a fixed port".into(),
            ));
        }
    }
    read_keys_for(s, dir, true)
}

/// The `[tunnel]` section, checked against the session (the device MTU must fit).
/// A `tunnel.mtu` must fit the channels and be at least 576.
fn check_tunnel_mtu(m: u32, cfg: &SessionConfig) -> Result<(), Fault> {
    let auto = cfg.max_inner() - cfg.data_overhead();
    if m > auto {
        return Err(fault(
            "tunnel.mtu",
            format!("{m} does not fit the channels: at most {auto} (smallest channel mtu less IP/UDP headers, the security envelope and the mode's header)"),
        ));
    }
    if m < 576 {
        return Err(fault("tunnel.mtu", format!("{m} is below 576")));
    }
    Ok(())
}

/// A `tunnel.log_level`: one of tracing's levels or `off`, in any case.
fn parse_log_level(l: &str) -> Result<String, Fault> {
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    LEVELS
        .iter()
        .find(|x| x.eq_ignore_ascii_case(l))
        .map(|x| x.to_string())
        .ok_or_else(|| {
            fault(
                "tunnel.log_level",
                format!("'{l}' is not one of {}", LEVELS.join(", ")),
            )
        })
}

/// The `[tunnel]` section: device name, addresses, MTU, control and metrics
/// sockets, log interval and level, each checked.
fn parse_tunnel(t: RawTunnel, cfg: &SessionConfig) -> Result<TunnelConfig, Fault> {
    let name = t.name.unwrap_or_else(|| "braid0".into());
    if name.is_empty() || name.len() > 15 {
        return Err(fault(
            "tunnel.name",
            format!("'{name}' must be 1 to 15 bytes long"),
        ));
    }
    let (address, address6) = match &t.address {
        None => (None, None),
        Some(a) => parse_addresses(a).map_err(|r| fault("tunnel.address", r))?,
    };
    if let Some(m) = t.mtu {
        check_tunnel_mtu(m, cfg)?;
    }
    let metrics = match &t.metrics {
        None => None,
        Some(m) => Some(
            m.parse()
                .map_err(|_| fault("tunnel.metrics", format!("'{m}' is not an IP:PORT address")))?,
        ),
    };
    // Default: named after the device, so that two tunnels on one host (two
    // namespaces share /run) do not take each other's socket.
    let control = Some(
        t.control
            .map(PathBuf::from)
            .unwrap_or_else(|| crate::tunnel::default_control(&name)),
    );
    let log_interval = match &t.log_interval {
        None => Duration::from_secs(10),
        Some(v) => parse_duration(v).map_err(|r| fault("tunnel.log_interval", r.to_string()))?,
    };
    let log_level = match &t.log_level {
        None => None,
        Some(l) => Some(parse_log_level(l)?),
    };
    Ok(TunnelConfig {
        name,
        address,
        address6,
        mtu: t.mtu,
        control,
        metrics,
        log_interval,
        log_level,
    })
}

/// The reference of every `[session]` key (`docs/settings.md`), made from the schema
/// (`braid_proto::session::schema`): its keys, their defaults and what they do.
pub fn settings_reference() -> String {
    use braid_proto::session::schema::{simulator_source, REFERENCE};
    let defaults = toml::Value::try_from(SessionSettings::default()).ok();
    let mut out = String::from(
        "# Session settings\n\n\
         <!-- Generated from crates/braid-proto/src/session/schema.rs by \
         `BRAID_BLESS=1 cargo test -p braid-io settings_reference`; do not edit. -->\n\n\
         Every key of a `[session]` table, with one set of defaults: the same in a tunnel \
         configuration (`braid tunnel`, `braid send`/`recv`, `docs/tunnel.md`), an overlay \
         node's flows and a simulator scenario (`docs/scenarios.md`). Unknown keys are \
         errors; every error names the file, the key and the reason. Durations are \
         strings with a unit (`250us`, `50ms`, `1.5s`, `2m`; `docs/units.md`). Sections \
         named below (\"Pacing\", \"Credits\", …) are in `docs/tunnel.md`.\n\n\
         A scenario sets the striping keys in its runs, `[markers]` and `[receiver]` \
         (the *scenario* column says where), and paces with `pace_mbps` (a rate per \
         channel, 0: not paced) and `pace_probe` (measure, as the tunnel's per-channel \
         `pace = \"auto\"`) where the tunnel has `pace` on each `[[channel]]`.\n\n\
         | key | default | scenario | meaning |\n|---|---|---|---|\n",
    );
    for d in REFERENCE {
        let default = match defaults.as_ref().and_then(|t| t.get(d.key)) {
            Some(v) => format!("`{v}`"),
            None => "unset".into(),
        };
        let sim = simulator_source(d.key).unwrap_or("`[session]`");
        out += &format!("| `{}` | {default} | {sim} | {} |\n", d.key, d.doc);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/settings.md` is the schema's reference; `BRAID_BLESS=1` rewrites it.
    #[test]
    fn settings_reference_matches_docs() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/settings.md");
        let made = settings_reference();
        if std::env::var_os("BRAID_BLESS").is_some() {
            std::fs::write(&path, &made).unwrap();
        }
        let docs = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            docs == made,
            "docs/settings.md differs from the settings schema: run \
             BRAID_BLESS=1 cargo test -p braid-io settings_reference"
        );
    }
    use braid_proto::config::MarkerPosition;

    const GOOD: &str = r#"
[tunnel]
name = "braid0"
address = "10.77.0.1/24"

[session]
mode = "logical"
key = "0X9vg6gGoIsuUnuVh9Q41C0d5zENqadrCWYNpq6589U="
heartbeat = "20ms"

[[channel]]
local = "127.0.0.1:7001"
remote = "127.0.0.1:7101"
weight = 2

[[channel]]
local = "127.0.0.1:7002"
remote = "127.0.0.1:7102"
"#;

    /// A server's file: its private key beside it, two peers.
    fn server_file(peers: &str) -> (tempfile::TempDir, String) {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("s.key");
        std::fs::write(&key, keys::encode(&keys::generate().unwrap())).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let text = format!(
            "[tunnel]\nname = \"srv\"\naddress = \"10.90.0.1/16\"\n\n[session]\nprivate_key_file = \"s.key\"\n\n[[channel]]\nlocal = \"0.0.0.0:7100\"\n\n[[channel]]\nlocal = \"0.0.0.0:7101\"\n{peers}"
        );
        (dir, text)
    }

    fn public(n: u8) -> String {
        keys::encode(&keys::public_key(&[n; 32]))
    }

    fn peers2() -> String {
        format!(
            "\n[[peer]]\nname = \"a\"\npublic_key = \"{}\"\nallowed_ips = [\"10.90.1.0/24\", \"fd90:1::/64\", \"10.90.9.9\"]\n\n[[peer]]\npublic_key = \"{}\"\nallowed_ips = [\"10.90.2.0/24\"]\n",
            public(1),
            public(2)
        )
    }

    #[test]
    fn a_server_config_names_each_peer_its_key_and_allowed_ips() {
        let (dir, text) = server_file(&peers2());
        let c = FileConfig::parse("s.toml", &text, Some(dir.path())).unwrap();
        assert_eq!(c.peers.len(), 2);
        assert_eq!(c.peers[0].name, "a");
        assert_eq!(c.peers[1].name, "peer1", "the default name is the position");
        assert_eq!(
            c.peers[0].allowed_ips,
            vec![
                "10.90.1.0/24".parse::<ipnet::IpNet>().unwrap(),
                "fd90:1::/64".parse().unwrap(),
                "10.90.9.9/32".parse().unwrap()
            ]
        );
        assert_eq!(c.peers[1].public_key, keys::public_key(&[2; 32]));
        assert!(c.session.core.private_key.is_some());
        assert_eq!(c.session.core.peer_public_key, None);
        // Each peer's session: the server's settings, the peer's key.
        let s = c.peers[1].session(&c.session);
        assert_eq!(s.core.peer_public_key, Some(keys::public_key(&[2; 32])));
        assert_eq!(s.channels, c.session.channels);
        s.validate().unwrap();
        // Without [[peer]], the same file is a point-to-point end: it needs the peer.
        let (dir, text) = server_file("");
        let e = FileConfig::parse("s.toml", &text, Some(dir.path())).unwrap_err();
        assert_eq!(e.key, "session.peer_public_key", "{e}");
    }

    #[test]
    fn a_server_config_refuses_what_would_route_ambiguously_or_not_at_all() {
        let bad = |peers: String, edit: &dyn Fn(String) -> String| {
            let (dir, text) = server_file(&peers);
            FileConfig::parse("s.toml", &edit(text), Some(dir.path())).unwrap_err()
        };
        let same = |t: String| t;
        let e = bad(peers2().replace("10.90.2.0/24", "10.90.1.0/24"), &same);
        assert_eq!(e.key, "peer[1].allowed_ips");
        assert!(e.reason.contains("also in peer[0]'s (a)"), "{e}");
        let e = bad(peers2().replace(&public(2), &public(1)), &same);
        assert_eq!(e.key, "peer[1].public_key");
        let e = bad(peers2().replace("10.90.2.0/24", "10.90.2.1/24"), &same);
        assert!(e.reason.contains("did you mean 10.90.2.0/24"), "{e}");
        let e = bad(peers2().replace("10.90.2.0/24", "banana"), &same);
        assert_eq!(e.key, "peer[1].allowed_ips");
        let e = bad(
            peers2().replace(&format!("public_key = \"{}\"\n", public(2)), ""),
            &same,
        );
        assert_eq!(e.key, "peer[1].public_key");
        assert!(e.reason.contains("missing"), "{e}");
        let e = bad(peers2().replace("name = \"a\"", "name = \"peer1\""), &same);
        assert_eq!(e.key, "peer[1].name");
        let e = bad(peers2().replace("allowed_ips", "allowed_ip"), &same);
        assert!(e.key.contains("allowed_ip"), "{e}");
        // The server's own keys and channels.
        let e = bad(peers2(), &|t| {
            t.replace(
                "[session]\n",
                &format!("[session]\npeer_public_key = \"{}\"\n", public(3)),
            )
        });
        assert_eq!(e.key, "session.peer_public_key");
        let e = bad(peers2(), &|t| {
            t.replace(
                "private_key_file = \"s.key\"",
                "key = \"0X9vg6gGoIsuUnuVh9Q41C0d5zENqadrCWYNpq6589U=\"",
            )
        });
        assert_eq!(e.key, "session.private_key_file");
        let e = bad(peers2(), &|t| {
            t.replace(
                "local = \"0.0.0.0:7101\"",
                "local = \"0.0.0.0:7101\"\nremote = \"10.0.0.1:7101\"",
            )
        });
        assert_eq!(e.key, "channel[1].remote");
        let e = bad(peers2(), &|t| {
            t.replace(
                "[session]\n",
                "[session]\nsecurity = \"none\"\nallow_insecure = true\n",
            )
        });
        assert_eq!(e.key, "session.security", "{e}");
    }

    #[test]
    fn a_server_channel_may_leave_out_remote_and_a_client_channel_local() {
        // The end that waits: a fixed local port, the peer's address learnt.
        let server = GOOD.replace("remote = \"127.0.0.1:7101\"\n", "");
        let c = FileConfig::parse("t.toml", &server, None).unwrap();
        assert_eq!(c.session.channels[0].remote, None);
        assert_eq!(
            c.session.channels[0].local,
            "127.0.0.1:7001".parse().unwrap()
        );
        // A client behind NAT: no local (any port, the remote's family).
        let client = GOOD
            .replace("local = \"127.0.0.1:7001\"\n", "")
            .replace("local = \"127.0.0.1:7002\"", "local = \"0.0.0.0:0\"")
            .replace("127.0.0.1:7102", "[2001:db8::1]:7102");
        let e = FileConfig::parse("t.toml", &client, None).unwrap_err();
        assert!(e.to_string().contains("different address families"), "{e}");
        let client = client.replace("local = \"0.0.0.0:0\"", "local = \"[::]:0\"");
        let c = FileConfig::parse("t.toml", &client, None).unwrap();
        assert_eq!(c.session.channels[0].local, "0.0.0.0:0".parse().unwrap());
        assert_eq!(c.session.channels[1].local, "[::]:0".parse().unwrap());
        assert_eq!(
            c.session.channels[1].remote,
            Some("[2001:db8::1]:7102".parse().unwrap())
        );
        assert_eq!(c.session.channels[1].udp_overhead(), 48);
        // Neither, or no remote and no fixed port to wait on: nobody could reach it.
        let neither = server.replace("local = \"127.0.0.1:7001\"\n", "");
        let e = FileConfig::parse("t.toml", &neither, None).unwrap_err();
        assert_eq!(e.key, "channel[0].local");
        assert!(e.reason.contains("neither local nor remote"), "{e}");
        let no_port = server.replace("127.0.0.1:7001", "0.0.0.0:0");
        let e = FileConfig::parse("t.toml", &no_port, None).unwrap_err();
        assert_eq!(e.key, "channel[0].remote");
        assert!(e.reason.contains("no fixed port"), "{e}");
    }

    #[test]
    fn the_tunnel_takes_an_ipv4_and_an_ipv6_address_and_channels_of_either_family() {
        let both = GOOD
            .replace(
                "address = \"10.77.0.1/24\"",
                "address = [\"10.77.0.1/24\", \"fd77::1/64\"]",
            )
            .replace("127.0.0.1:7002", "[::1]:7002")
            .replace("127.0.0.1:7102", "[::1]:7102");
        let c = FileConfig::parse("t.toml", &both, None).unwrap();
        let t = c.tunnel.unwrap();
        assert_eq!(t.address, Some((Ipv4Addr::new(10, 77, 0, 1), 24)));
        assert_eq!(t.address6, Some(("fd77::1".parse().unwrap(), 64)));
        // A bond of an IPv4 and an IPv6 channel: the IPv6 one's headers are larger.
        let ch = &c.session.channels;
        assert_eq!((ch[0].udp_overhead(), ch[1].udp_overhead()), (28, 48));
        let v6 = GOOD.replace("10.77.0.1/24", "fd77::1/64");
        let t = FileConfig::parse("t.toml", &v6, None)
            .unwrap()
            .tunnel
            .unwrap();
        assert_eq!((t.address, t.address6.map(|a| a.1)), (None, Some(64)));
        let e = |text: &str| FileConfig::parse("t.toml", text, None).unwrap_err();
        let x = e(&GOOD.replace("\"10.77.0.1/24\"", "[\"10.77.0.1/24\", \"10.78.0.1/24\"]"));
        assert_eq!(x.key, "tunnel.address");
        assert!(x.reason.contains("two IPv4 addresses"), "{x}");
        let x = e(&GOOD.replace("10.77.0.1/24", "fd77::1/129"));
        assert!(x.reason.contains("0..=128"), "{x}");
        let x = e(&GOOD.replace("10.77.0.1/24", "fd77::g/64"));
        assert!(x.reason.contains("not an IPv6 address"), "{x}");
    }

    #[test]
    fn good_file_parses() {
        let c = FileConfig::parse("t.toml", GOOD, None).unwrap();
        assert_eq!(c.session.channels.len(), 2);
        assert_eq!(c.session.heartbeat(), Duration::from_millis(20));
        let t = c.tunnel.unwrap();
        assert_eq!(t.address, Some((Ipv4Addr::new(10, 77, 0, 1), 24)));
        // SRR quanta proportional to weight, the smallest = the largest inner datagram:
        // 1500 - 28 (IP and UDP) - 26 (the security envelope of the default `encrypt`).
        let sc = c.session.stripe_config(&[0, 1]);
        assert_eq!(sc.weights, vec![2892, 1446]);
        assert_eq!(sc.max_packet, 1446);
        let mut none = c.session.clone();
        none.core.security = SecurityMode::None;
        let sc = none.stripe_config(&[0, 1]);
        assert_eq!(sc.weights, vec![2944, 1472]);
        assert_eq!(sc.max_packet, 1472);
    }

    #[test]
    fn keys_must_be_random_32_bytes_and_files_private() {
        let with = |line: &str| {
            GOOD.replace(
                "key = \"0X9vg6gGoIsuUnuVh9Q41C0d5zENqadrCWYNpq6589U=\"",
                line,
            )
        };
        for bad in [
            "key = \"correct horse battery\"",
            "key = \"change me: a long shared secret, 32+ bytes\"",
            "key = \"c2hvcnQ=\"",
        ] {
            let e = FileConfig::parse("t.toml", &with(bad), None)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("session.key") && e.contains("braid genkey"),
                "{bad}: {e}"
            );
        }
        let e = FileConfig::parse("t.toml", &with(""), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("session.key") && e.contains("missing"), "{e}");
        // A key file readable by others is refused; made private, it is read as bytes.
        let dir = std::env::temp_dir().join(format!("braid-cfg-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("braid.key");
        std::fs::write(&f, "AyHDMTOweHmwGSs7vubt5lmmRKjx62UXkWxeQzJRXms=\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let text = with("key_file = \"braid.key\"");
        let e = FileConfig::parse("t.toml", &text, Some(&dir))
            .unwrap_err()
            .to_string();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = FileConfig::parse("t.toml", &text, Some(&dir)).unwrap();
        assert_eq!(c.session.core.key.len(), 32);
        // Static keys, and the security mode.
        std::fs::write(&f, "1TmZIScY3/OtqxxyGcnv8N4FGBZHviUHPzrxwu6fHx4=").unwrap();
        let text = with(
            "private_key_file = \"braid.key\"\npeer_public_key = \"f1njdwrpfIzRyXbWUPz15DmEK5AHdvKw7LmAZC4M6Rw=\"\nsecurity = \"auth\"\nrekey_after = \"30s\"",
        );
        let c = FileConfig::parse("t.toml", &text, Some(&dir)).unwrap();
        assert!(c.session.core.key.is_empty() && c.session.core.private_key.is_some());
        assert_eq!(c.session.core.security, SecurityMode::Auth);
        assert_eq!(
            c.session.core.rekey_after,
            braid_proto::Duration::from_secs(30)
        );
        let half = with("private_key_file = \"braid.key\"");
        let e = FileConfig::parse("t.toml", &half, Some(&dir))
            .unwrap_err()
            .to_string();
        assert!(e.contains("peer_public_key"), "{e}");
        // Debug never shows key material.
        let dbg = format!("{:?}", c.session);
        assert!(!dbg.contains("1TmZ") && !dbg.contains("[214"), "{dbg}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn errors_name_file_key_and_reason() {
        let bad = GOOD.replace("weight = 2", "weight = 0");
        let e = FileConfig::parse("t.toml", &bad, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("t.toml") && e.contains("channel[0].weight"),
            "{e}"
        );
        let bad = GOOD.replace("\"20ms\"", "\"20 parsecs\"");
        let e = FileConfig::parse("t.toml", &bad, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("session.heartbeat") && e.contains("unit"), "{e}");
        let bad = GOOD.replace("mode = \"logical\"", "mode = \"fast\"");
        let e = FileConfig::parse("t.toml", &bad, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("session.mode"), "{e}");
        let bad = GOOD.replace("key = \"0X9vg6gGoIsuUnuVh9Q41C0d5zENqadrCWYNpq6589U=\"", "");
        let e = FileConfig::parse("t.toml", &bad, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("session.key") && e.contains("missing"), "{e}");
        let bad = GOOD.replace("heartbeat", "hartbeat");
        let e = FileConfig::parse("t.toml", &bad, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("hartbeat"), "{e}");
        let bad = GOOD.replace("127.0.0.1:7101", "nowhere");
        let e = FileConfig::parse("t.toml", &bad, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("channel[0].remote"), "{e}");
        let bad = GOOD.replace("10.77.0.1/24", "10.77.0.1");
        let e = FileConfig::parse("t.toml", &bad, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("tunnel.address"), "{e}");
    }

    #[test]
    fn repair_and_aqm_keys() {
        let with = |extra: &str| {
            GOOD.replace(
                "heartbeat = \"20ms\"",
                &format!("heartbeat = \"20ms\"\n{extra}"),
            )
        };
        let c = FileConfig::parse(
            "t.toml",
            &with("arq = \"150ms\"\naqm = true\naqm_target = \"10ms\""),
            None,
        )
        .unwrap();
        let s = c.session.session_config();
        assert_eq!(s.arq.unwrap().wait, braid_proto::Duration::from_millis(150));
        let a = s.aqm.unwrap();
        assert!(a.loss_signal, "on by default");
        assert_eq!(a.target, braid_proto::Duration::from_millis(10));
        assert_eq!(a.interval, braid_proto::Duration::from_millis(100));
        assert!(!a.scale_to_rtt, "a configured target is used as it is");
        let c = FileConfig::parse("t.toml", &with("aqm = true"), None).unwrap();
        assert!(c.session.session_config().aqm.unwrap().scale_to_rtt);
        // The return path is on unless turned off.
        assert!(c.session.session_config().return_path.is_some());
        let c = FileConfig::parse("t.toml", &with("return_path = false"), None).unwrap();
        assert!(c.session.session_config().return_path.is_none());
        // Markers carry the send time only when the AQM needs it.
        assert!(s.stripe_config(&[0, 1]).markers.timestamps);
        let c = FileConfig::parse("t.toml", &with("arq = \"0s\""), None).unwrap();
        assert!(c.session.session_config().arq.is_none());
        // `repair`, the old name, turns on the same in-bond repair (every mode), not
        // the resequencer's NAK repair.
        let c = FileConfig::parse("t.toml", &with("repair = \"120ms\""), None).unwrap();
        let s = c.session.session_config();
        assert_eq!(s.arq.unwrap().wait, braid_proto::Duration::from_millis(120));
        assert_eq!(s.receiver.repair, None);
        let c = FileConfig::parse("t.toml", &with("repair = \"0s\""), None).unwrap();
        assert!(c.session.session_config().arq.is_none());
        // Repair and AQM are on by default (issue 28); markers then carry the time.
        let c = FileConfig::parse("t.toml", GOOD, None).unwrap();
        let s = c.session.session_config();
        assert_eq!(s.arq.unwrap().wait, braid_proto::Duration::from_millis(200));
        assert!(s.aqm.is_some() && s.stripe_config(&[0, 1]).markers.timestamps);
        let c = FileConfig::parse("t.toml", &with("aqm = false"), None).unwrap();
        assert!(!c.session.stripe_config(&[0, 1]).markers.timestamps);
        // With security "none" repair cannot find gaps: off unless asked for, and
        // then refused.
        let none = "security = \"none\"\nallow_insecure = true";
        let c = FileConfig::parse("t.toml", &with(none), None).unwrap();
        assert!(c.session.session_config().arq.is_none());
        let e = FileConfig::parse("t.toml", &with(&format!("{none}\narq = \"200ms\"")), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("arq"), "{e}");
        for (extra, key) in [
            ("aqm = false\naqm_target = \"10ms\"", "session.aqm_target"),
            ("aqm = true\naqm_interval = \"0s\"", "session.aqm_interval"),
            (
                "aqm = false\naqm_loss_signal = false",
                "session.aqm_loss_signal",
            ),
            ("arq = \"soon\"", "session.arq"),
            ("arq = \"100ms\"\nrepair = \"100ms\"", "session.repair"),
        ] {
            let e = FileConfig::parse("t.toml", &with(extra), None)
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{extra}: {e}");
        }
        // Pacing: per channel; by default each channel's rate is measured (`auto`), and
        // with every channel paced adaptive weights are on.
        let session = |text: &str| {
            FileConfig::parse("t.toml", text, None)
                .unwrap()
                .session
                .session_config()
        };
        let pacing = |text: &str| session(text).pacing;
        let adaptive = |text: &str| session(text).adaptive;
        let pc = pacing(GOOD).expect("pacing on by default");
        assert_eq!(pc.rates_bps, vec![0.0, 0.0]);
        assert!(pc.probe);
        assert!(adaptive(GOOD));
        // A rate on one channel: it is paced at most at that; the other is measured,
        // and so is the paced one (at the lower of the two).
        let one = GOOD.replacen("weight = 2", "weight = 2\npace = \"95mbit\"", 1);
        let pc = pacing(&one).unwrap();
        assert_eq!(pc.rates_bps, vec![95e6, 0.0]);
        assert!(pc.probe);
        assert!(adaptive(&one));
        // Rates on both: nothing measured.
        let both = one.replace(
            "remote = \"127.0.0.1:7102\"",
            "remote = \"127.0.0.1:7102\"\npace = \"45mbit\"",
        );
        let pc = pacing(&both).unwrap();
        assert_eq!(pc.rates_bps, vec![95e6, 45e6]);
        assert!(!pc.probe, "rates only: nothing measured");
        assert!(adaptive(&both));
        // `off` on every channel: not paced, and adaptive weights off by default; on
        // one channel, that one is not paced (nor measured), and adaptive weights are
        // off by default (not every channel is paced).
        let off_one = GOOD.replacen("weight = 2", "weight = 2\npace = \"off\"", 1);
        let pc = pacing(&off_one).unwrap();
        assert!(pc.probe);
        assert!(!adaptive(&off_one), "one channel of two unpaced");
        let off_both = off_one.replace(
            "remote = \"127.0.0.1:7102\"",
            "remote = \"127.0.0.1:7102\"\npace = \"off\"",
        );
        assert!(pacing(&off_both).is_none());
        assert!(!adaptive(&off_both));
        let auto = off_one.replacen("pace = \"off\"", "pace = \"auto\"", 1);
        assert_eq!(pacing(&auto).unwrap().rates_bps, vec![0.0, 0.0]);
        // `adaptive` said: as said.
        let set = |text: &str, v: bool| {
            text.replacen(
                "heartbeat = \"20ms\"",
                &format!("heartbeat = \"20ms\"\nadaptive = {v}"),
                1,
            )
        };
        assert!(!adaptive(&set(GOOD, false)));
        assert!(adaptive(&set(&off_both, true)));
        let bad = GOOD.replacen("weight = 2", "weight = 2\npace = \"fast\"", 1);
        let e = FileConfig::parse("t.toml", &bad, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("channel[0].pace") && e.contains("auto") && e.contains("off"),
            "{e}"
        );
        // Bad-link demotion: on by default, with these keys.
        let c = FileConfig::parse("t.toml", &with(""), None).unwrap();
        assert_eq!(
            c.session.session_config().demote,
            Some(braid_proto::session::DemoteConfig::default())
        );
        let c = FileConfig::parse(
            "t.toml",
            &with(
                "demote_loss = 0.3\ndemote_after = \"2s\"\npromote_after = \"10s\"\n\
                 demote_rtt_ratio = 8.0",
            ),
            None,
        )
        .unwrap();
        let d = c.session.session_config().demote.unwrap();
        assert_eq!(d.loss, 0.3);
        assert_eq!(d.after, braid_proto::Duration::from_secs(2));
        assert_eq!(d.promote_after, braid_proto::Duration::from_secs(10));
        assert_eq!(d.rtt_ratio, 8.0);
        let c = FileConfig::parse("t.toml", &with("demote = false"), None).unwrap();
        assert!(c.session.session_config().demote.is_none());
        for (extra, key) in [
            ("demote = false\ndemote_loss = 0.3", "session.demote"),
            ("demote_loss = 1.5", "session.demote_loss"),
            ("demote_loss = 0.0", "session.demote_loss"),
            ("demote_after = \"later\"", "session.demote_after"),
            ("demote_after = \"30ms\"", "demote_after"),
            ("promote_after = \"0s\"", "promote_after"),
            ("demote_rtt_ratio = 1.1", "session.demote_rtt_ratio"),
        ] {
            let e = FileConfig::parse("t.toml", &with(extra), None)
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{extra}: {e}");
        }
        // Credits: the window defaults to the receive buffer less the markers' room.
        let c = FileConfig::parse(
            "t.toml",
            &with("credits = true\nbuffer_packets = 1000"),
            None,
        )
        .unwrap();
        let cc = c.session.session_config().credits.unwrap();
        assert_eq!((cc.window, cc.pool), (936, None));
        let c = FileConfig::parse(
            "t.toml",
            &with("credits = true\ncredit_window = 200\ncredit_pool = 300"),
            None,
        )
        .unwrap();
        let cc = c.session.session_config().credits.unwrap();
        assert_eq!((cc.window, cc.pool), (200, Some(300)));
        for (extra, key) in [
            ("credit_window = 100", "session.credit_window"),
            ("credit_pool = 100", "session.credit_pool"),
            (
                "credits = true\nbuffer_packets = 100\ncredit_window = 90",
                "leave 64 packets",
            ),
        ] {
            let e = FileConfig::parse("t.toml", &with(extra), None)
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{extra}: {e}");
        }
        // Repair needs a sealing counter.
        let e = FileConfig::parse(
            "t.toml",
            &with("arq = \"100ms\"\nsecurity = \"none\"\nallow_insecure = true"),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("arq") && e.contains("security"), "{e}");
    }

    #[test]
    fn the_default_control_socket_follows_the_device_name() {
        let control = |text: &str| {
            FileConfig::parse("t.toml", text, None)
                .unwrap()
                .tunnel
                .unwrap()
                .control
        };
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(control(GOOD), p("/run/braid/braid0.sock"));
        let other = GOOD.replace("name = \"braid0\"", "name = \"wan-b\"");
        assert_eq!(control(&other), p("/run/braid/wan-b.sock"));
        let unnamed = GOOD.replace("name = \"braid0\"\n", "");
        assert_eq!(control(&unnamed), p("/run/braid/braid0.sock"));
        let set = GOOD.replace("[tunnel]\n", "[tunnel]\ncontrol = \"/tmp/x.sock\"\n");
        assert_eq!(control(&set), p("/tmp/x.sock"));
    }

    #[test]
    fn parse_errors_name_the_key_and_the_line() {
        let e = |text: &str| FileConfig::parse("t.toml", text, None).unwrap_err();
        // Unknown key, wrong type, in a section and in the second of an array of tables.
        let x = e(&GOOD.replace("heartbeat", "hartbeat"));
        assert_eq!(x.key, "session.hartbeat");
        assert!(
            x.reason.contains("line 9") && x.reason.contains("unknown field"),
            "{x}"
        );
        let x = e(&GOOD.replace("\"20ms\"", "20"));
        assert_eq!(x.key, "session.heartbeat");
        assert!(
            x.reason.contains("line 9") && x.reason.contains("invalid type"),
            "{x}"
        );
        let x = e(&GOOD.replace("\"127.0.0.1:7102\"", "7102"));
        assert_eq!(x.key, "channel[1].remote");
        assert!(x.reason.contains("line 18"), "{x}");
        let x = e(&format!("bogus = 1\n{GOOD}"));
        assert_eq!(x.key, "bogus");
        // A syntax error belongs to no key: its line stands in for one.
        let x = e(&GOOD.replace("[session]", "[session"));
        assert_eq!(x.key, "line 6");
        assert!(x.reason.contains("line 6, column 9"), "{x}");
        assert!(x.to_string().starts_with("config t.toml: line 6: "), "{x}");
        let x = FileConfig::load(Path::new("/nonexistent/t.toml")).unwrap_err();
        assert_eq!(
            x.to_string(),
            "config /nonexistent/t.toml: cannot read: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn tunnel_log_level_is_one_of_the_levels() {
        let p = |t: &str| FileConfig::parse("t.toml", t, None);
        assert_eq!(p(GOOD).unwrap().tunnel.unwrap().log_level, None);
        let with =
            |l: &str| GOOD.replacen("[session]", &format!("log_level = \"{l}\"\n\n[session]"), 1);
        let t = p(&with("Debug")).unwrap().tunnel.unwrap();
        assert_eq!(t.log_level.as_deref(), Some("debug"));
        let e = p(&with("loud")).unwrap_err();
        assert_eq!(e.key, "tunnel.log_level");
        assert!(e.reason.contains("'loud' is not one of off, error"), "{e}");
    }

    #[test]
    fn shipped_examples_load_with_a_key_file_beside_them() {
        use std::os::unix::fs::PermissionsExt;
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let dir = std::env::temp_dir().join(format!("braid-examples-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("braid.key");
        std::fs::write(&key, crate::keys::encode(&crate::keys::generate().unwrap())).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut tunnels = Vec::new();
        for f in ["tunnel-a.toml", "tunnel-b.toml"] {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
            let c = FileConfig::load(&dir.join(f)).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                c.session.core.scheduler,
                braid_proto::SchedulerKind::Srr,
                "{f}"
            );
            assert_eq!(c.session.core.markers.position, MarkerPosition::End, "{f}");
            assert_eq!(c.session.heartbeat(), Duration::from_millis(50), "{f}");
            assert_eq!(c.session.core.security, SecurityMode::Encrypt, "{f}");
            assert_eq!(c.session.core.key.len(), 32, "{f}");
            let t = c.tunnel.unwrap();
            assert_eq!(t.log_interval, Duration::from_secs(10), "{f}");
            tunnels.push(t);
        }
        // Both ends can run on one host (in two namespaces, which share /run): their
        // devices and control sockets differ, and each socket is named after its device.
        let [a, b] = &tunnels[..] else { panic!() };
        assert_ne!(a.name, b.name);
        assert_ne!(a.control, b.control);
        for t in [a, b] {
            let want = PathBuf::from(format!("/run/braid/{}.sock", t.name));
            assert_eq!(t.control.as_ref(), Some(&want));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_server_and_client_examples_load_and_match() {
        use std::os::unix::fs::PermissionsExt;
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let dir = tempfile::tempdir().unwrap();
        for k in ["server.key", "client.key"] {
            let p = dir.path().join(k);
            std::fs::write(&p, crate::keys::encode(&crate::keys::generate().unwrap())).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let load = |f: &str| {
            std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
            FileConfig::load(&dir.path().join(f)).unwrap_or_else(|e| panic!("{e}"))
        };
        let server = load("server.toml");
        let client = load("client.toml");
        assert_eq!(server.peers.len(), 2);
        assert!(client.peers.is_empty());
        assert_eq!(server.session.channels.len(), client.session.channels.len());
        for (s, c) in server.session.channels.iter().zip(&client.session.channels) {
            assert_eq!(s.name, c.name);
            assert_eq!(s.remote, None);
            assert_eq!(c.remote.map(|r| r.port()), Some(s.local.port()));
        }
        // The client's inner address is inside its [[peer]]'s allowed IPs.
        let (addr, _) = client.tunnel.unwrap().address.unwrap();
        assert!(server.peers[0]
            .allowed_ips
            .iter()
            .any(|n| n.contains(&std::net::IpAddr::from(addr))));
    }

    #[test]
    fn security_none_needs_allow_insecure_and_an_inline_key_a_private_file() {
        // Issue 27, items 3 and 4.
        let with = |extra: &str| GOOD.replace("[session]\n", &format!("[session]\n{extra}\n"));
        let e = FileConfig::parse("t.toml", &with("security = \"none\""), None).unwrap_err();
        assert_eq!(e.key, "session.security");
        assert!(e.reason.contains("allow_insecure = true"), "{e}");
        let c = FileConfig::parse(
            "t.toml",
            &with("security = \"none\"\nallow_insecure = true"),
            None,
        )
        .unwrap();
        assert_eq!(c.session.core.security, SecurityMode::None);

        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("braid-cfg-inline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.toml");
        std::fs::write(&path, GOOD).unwrap();
        assert!(GOOD.contains("\nkey = "), "GOOD holds an inline key");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = FileConfig::load(&path).unwrap_err();
        assert_eq!(e.key, "session.key");
        assert!(e.reason.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        FileConfig::load(&path).unwrap();
        // Without an inline key the file's mode is not the key's business.
        let dir_key = dir.join("braid.key");
        std::fs::write(&dir_key, "AyHDMTOweHmwGSs7vubt5lmmRKjx62UXkWxeQzJRXms=").unwrap();
        std::fs::set_permissions(&dir_key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let keyless = GOOD
            .lines()
            .map(|l| {
                if l.starts_with("key = ") {
                    "key_file = \"braid.key\""
                } else {
                    l
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(&path, keyless).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        FileConfig::load(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn shared_spellings_work_here_too() {
        // The units module's spellings: `random`, `brr`, `channel:N`, `h`.
        let c = FileConfig::parse(
            "t.toml",
            &GOOD.replace(
                "heartbeat = \"20ms\"",
                "heartbeat = \"20ms\"\nscheduler = \"random\"\nmarker_position = \"channel:1\"\nrekey_after = \"1h\"",
            ),
            None,
        )
        .unwrap();
        assert_eq!(
            c.session.core.scheduler,
            braid_proto::SchedulerKind::Random { seed: 0 }
        );
        assert_eq!(c.session.core.markers.position, MarkerPosition::Channel(1));
        assert_eq!(
            c.session.core.rekey_after,
            braid_proto::Duration::from_secs(3600)
        );
        let c = FileConfig::parse(
            "t.toml",
            &GOOD.replace(
                "mode = \"logical\"",
                "mode = \"logical\"\nscheduler = \"brr\"\nmarker_position = \"1\"",
            ),
            None,
        )
        .unwrap();
        assert_eq!(c.session.core.scheduler, braid_proto::SchedulerKind::Rr);
        assert_eq!(c.session.core.markers.position, MarkerPosition::Channel(1));
    }
}
