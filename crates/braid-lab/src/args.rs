//! The flags of `braid lab`'s subcommands, declared once with clap (the `braid` CLI
//! puts them in its command tree), and their check into the options each lab takes.
//! Errors name the flag at fault.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use braid_proto::units::{parse_duration, parse_mode, parse_rate};

use crate::bench::{BenchOptions, BenchResult, Pace};
use crate::field::FieldOptions;
use crate::overlay::{Matrix, OverlayOptions};
use crate::spec::{Change, LinkSpec};
use crate::stream::{Endpoint, StreamOptions, StreamResult};
use crate::topo;

/// The flags of `braid lab up`.
#[derive(clap::Args, Debug)]
pub struct UpArgs {
    /// Links, comma-separated, each RATE/DELAY[/LOSS][/jJITTER][/v6], e.g.
    /// `100mbit/5ms,50mbit/20ms,20mbit/60ms/1%`. LOSS is `1%` (random) or
    /// `ge:2%:5` (bursty: 2 % average, bursts of 5 packets on average). DELAY is
    /// one-way and applies in both directions; loss applies client to server. Every
    /// link carries IPv4 and IPv6; `v6` makes `lab bench` use its IPv6 addresses
    /// (its channel, its flow alone and in the ceiling).
    #[arg(long)]
    pub links: String,
    /// Seed of the emulator's loss process.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// The flags of `braid lab change`.
#[derive(clap::Args, Debug)]
pub struct ChangeArgs {
    /// Index of the link, from 0.
    pub link: usize,
    /// The new link, as for `lab up` (e.g. 33mbit/5ms/1%), or `down`, or `up`
    /// (back as before `down`).
    pub to: String,
}

/// The flags of `braid lab bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Links, as for `lab up`.
    #[arg(long, default_value = "100mbit/0ms,50mbit/0ms,20mbit/0ms")]
    pub links: String,
    /// Length of each TCP measurement, e.g. 10s.
    #[arg(long, default_value = "10s")]
    pub duration: String,
    /// braid modes to measure, comma-separated.
    #[arg(long, default_value = "logical,seq,trr")]
    pub modes: String,
    /// Skip the MPTCP measurement.
    #[arg(long)]
    pub no_mptcp: bool,
    /// The tunnel's channel weights, comma-separated, one per link (default: each
    /// link's rate in Mbit/s). With adaptive weights they are only the start.
    #[arg(long, value_name = "W1,W2,...")]
    pub weights: Option<String>,
    /// Adaptive weights in the tunnel (`adaptive = true`). Without this or
    /// --static-weights the tunnel's default holds: on when paced (adaptive pacing:
    /// the pace follows a link whose rate drops; the default), off with --pace off
    #[arg(long, conflicts_with = "static_weights")]
    pub adaptive: bool,
    /// Static weights in the tunnel (`adaptive = false`), also with --pace
    #[arg(long)]
    pub static_weights: bool,
    /// The tunnel's AQM (`aqm`): CoDel on the channels' queueing delay, marking ECN
    /// CE. On by default (`--aqm` alone: on); `off` turns it off. While it is on, ECN
    /// is on for TCP in the lab's end hosts.
    #[arg(long, value_name = "on|off", value_parser = parse_on_off, num_args = 0..=1, default_missing_value = "on")]
    pub aqm: Option<bool>,
    /// With the AQM: signal a loss found behind a standing queue too (`on`, the
    /// tunnel's default) or leave congestion to CoDel's delay signal alone (`off`).
    #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
    pub aqm_loss_signal: Option<bool>,
    /// Turn the tunnel's return path off (`return_path = false`; on by default: an
    /// end that sends little more than the acknowledgements of the other end's flow
    /// sends them on the channel with the shortest round trip alone)
    #[arg(long)]
    pub no_return_path: bool,
    /// How the tunnel paces each channel (`pace`): a share of its link's rate
    /// (no burst overfills the link's short queue; CoDel marks what waits in the
    /// tunnel instead), e.g. 0.99; `auto`: the tunnel measures each link's rate
    /// when the channel comes up, which is also its default; `off`: not paced.
    #[arg(long, value_name = "SHARE|auto|off")]
    pub pace: Option<String>,
    /// Pace the tunnel's channels at these rates instead, one per link, e.g.
    /// `100mbit,100mbit,100mbit`: what a user who knows only the links' nominal
    /// rates would configure (with adaptive pacing, the tunnel's default when paced,
    /// a link slower than its pace is followed down). An entry `auto` has that
    /// link measured; then every link is, and paced at most at its measured rate.
    #[arg(long, value_name = "R1,R2,...", conflicts_with = "pace")]
    pub pace_rates: Option<String>,
    /// The tunnel's security mode (`security`): `encrypt` (the default), `auth`
    /// (sealed, body in clear) or `none` (no envelope: 26 bytes more of each
    /// datagram for the inner packet; in-bond repair, --arq, needs a sealing mode).
    #[arg(long, value_name = "MODE")]
    pub security: Option<String>,
    /// In-bond repair in the tunnel, every mode (`arq = DURATION`: how long the
    /// receiver holds a channel for a lost datagram asked for again), e.g. 100ms;
    /// the tunnel's default is 200ms, and 0s turns it off.
    #[arg(long, value_name = "DURATION")]
    pub arq: Option<String>,
    /// Credit-based flow control per channel in the tunnel (`credits = true`): the
    /// receiver lends each channel's sender its buffer, so skewed channels slow
    /// the sender instead of overflowing the receiver.
    #[arg(long)]
    pub credits: bool,
    /// TCP carried as byte streams in the tunnel (`tcp_streams`; default the
    /// tunnel's): each TCP connection is terminated at both ends and its bytes cross
    /// the bond without TCP/IP headers or a slow start of their own. Not given (and
    /// the channels paced, as by default, which turns it on): the same flow is
    /// measured once more with it off, as `tcp_packet_bps` ("the same as packets").
    #[arg(long, value_name = "on|off", value_parser = parse_on_off, num_args = 0..=1, default_missing_value = "on")]
    pub tcp_streams: Option<bool>,
    /// The streams' fast lane in the tunnel (`tcp_streams_fast`; default the
    /// tunnel's, on): a stream that sends little takes the lowest-delay channel past
    /// the stripe. `off` to measure what it gives (with `--call-transport tcp`).
    #[arg(long, value_name = "on|off", value_parser = parse_on_off, num_args = 0..=1, default_missing_value = "on")]
    pub tcp_streams_fast: Option<bool>,
    /// Per-flow order for TCP carried as packets in the tunnel (`flow_order`; default
    /// the tunnel's, on). `off` to measure what it gives (with `--tcp-streams off
    /// --call-transport tcp`).
    #[arg(long, value_name = "on|off", value_parser = parse_on_off, num_args = 0..=1, default_missing_value = "on")]
    pub flow_order: Option<bool>,
    /// The tunnel's receive buffer per channel, packets (`buffer_packets`; default
    /// the tunnel's, 4096). With --credits the window is this less 64.
    #[arg(long, value_name = "PACKETS")]
    pub buffer_packets: Option<usize>,
    /// A scripted link change during every TCP measurement over all links (the
    /// ceiling, braid in each mode, MPTCP), as AT:LINK:WHAT, timed from the start of
    /// the measurement: `5s:0:33mbit/5ms` (link 0 drops to 33 Mbit/s at 5 s),
    /// `3s:1:down`, `6s:1:up`. Repeat for more. The links are put back after each
    /// measurement. (Every run's table and JSON give each TCP flow's goodput second by
    /// second, as its sender and its receiver count it, with or without changes.)
    #[arg(long = "change", value_name = "AT:LINK:WHAT")]
    pub changes: Vec<String>,
    /// Any other `[session]` setting of the tunnel, as KEY=VALUE (repeat for more),
    /// e.g. `--set marker_interval=10ms --set pace_burst=2ms`: a number or `true`/`false`
    /// is written as it is, anything else as a string. The keys are those of
    /// `docs/settings.md`; a key with a flag of its own here is refused (use the flag).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also draw a bar chart (.svg or .png).
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
    /// Seed of the emulator's loss process.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Repeat every measurement this many times (the lab is built once; each run
    /// measures the links, the ceiling, braid in each mode and MPTCP) and report the
    /// median and the range (min-max) of each figure.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub runs: u32,
    /// Also measure this many TCP flows at once through the tunnel in each mode
    /// (after its single flow): their total goodput and Jain's fairness index over
    /// them (`flows_tcp_bps`, `flows_jain`). 1: only the single flow.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub flows: u32,
    /// Also time one download of this size (e.g. 2MB, 2000000), from its SYN to its
    /// last byte: over each link alone (the fastest is reported), through the tunnel
    /// in each mode, and over MPTCP (JSON `download`, and `download_s` per mode).
    #[arg(long, value_name = "BYTES")]
    pub download: Option<String>,
    /// Also open this many TCP connections through the tunnel in each mode (after its
    /// flows), hold them idle and read both ends' memory (`/proc/PID/status`) before
    /// and while they are open (JSON `idle_made`, `idle_open_s`, `idle_rss_bytes`,
    /// `idle_rss_growth_bytes`: the larger end's).
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=30000))]
    pub idle: u32,
    /// Also send a call beside each mode's TCP flow: a 200-byte UDP datagram every
    /// 20 ms through the tunnel, numbered and stamped (the tunnel's defaults classify
    /// it); its loss and one-way delay, and the same over the lowest-delay link alone
    /// and idle for reference (JSON `call` per mode, `call_idle_best_link`).
    #[arg(long)]
    pub call: bool,
    /// What carries the call: `udp` (the VoIP-like flow above) or `tcp` (the same
    /// 200-byte records every 20 ms over one TCP connection with TCP_NODELAY, as a
    /// remote shell or a game sends: an interactive connection beside the bulk one;
    /// through the tunnel it is carried as a stream by default). Implies `--call`;
    /// JSON `call_transport`.
    #[arg(long, value_enum, value_name = "udp|tcp")]
    pub call_transport: Option<crate::bench::call::Transport>,
}

/// The flags of `braid lab stream`.
#[derive(clap::Args, Debug)]
pub struct StreamArgs {
    /// Links, as for `lab up`.
    #[arg(long, default_value = "100mbit/5ms,50mbit/20ms,20mbit/60ms/1%")]
    pub links: String,
    /// Length of each stream, e.g. 20s.
    #[arg(long, default_value = "20s")]
    pub duration: String,
    /// Stream rate, e.g. 8mbit.
    #[arg(long, default_value = "8mbit")]
    pub rate: String,
    /// Record (packet payload) size in bytes: 1316 = 7 MPEG-TS packets, SRT's live
    /// payload.
    #[arg(long, default_value_t = 1316)]
    pub size: usize,
    /// braid's loss tolerance W,E,B, one braid run each (repeat the option).
    #[arg(long = "tolerance", value_name = "W,E,B", default_values = ["100,0,0", "100,1,1"])]
    pub tolerances: Vec<String>,
    /// braid's segment deadline (`braid send --deadline`), e.g. 200ms; default none.
    #[arg(long)]
    pub deadline: Option<String>,
    /// Skip SRT.
    #[arg(long)]
    pub no_srt: bool,
    /// Skip the extra braid run (first tolerance) over the best link alone, the
    /// path SRT takes, which tells the protocol's part from the paths'.
    #[arg(long)]
    pub no_single: bool,
    /// SRT's latency (default: --srt-rtt-factor × the best link's measured round trip).
    #[arg(long, value_name = "DURATION")]
    pub srt_latency: Option<String>,
    /// SRT's latency as a multiple of the round trip (its guide: 3 to 4 on links with
    /// little loss).
    #[arg(long, default_value_t = 4.0)]
    pub srt_rtt_factor: f64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also draw the latency distributions (.svg or .png).
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
    /// Do not run anything: print the table (and draw --plot) of a saved
    /// `lab stream --json` result.
    #[arg(long, value_name = "JSON")]
    pub from: Option<std::path::PathBuf>,
    /// Seed of the emulator's loss process.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// The flags of `braid lab overlay`.
#[derive(clap::Args, Debug)]
pub struct OverlayArgs {
    /// The direct hop source-destination, RATE/DELAY[/LOSS][/jJITTER] as for `lab
    /// up`. Rate and delay apply both ways, loss from the lower-numbered node to the
    /// higher (the flow's direction).
    #[arg(long, default_value = "4mbit/40ms")]
    pub direct: String,
    /// The hops through relays 1, 2 and 3 (each used for source-relay and
    /// relay-destination), comma-separated.
    #[arg(long, default_value = "10mbit/10ms,8mbit/15ms,6mbit/20ms")]
    pub relays: String,
    /// The hops between two relays (probed, never on a two-hop path of this flow).
    #[arg(long, default_value = "10mbit/10ms")]
    pub between: String,
    /// Length of each of the two plain TCP measurements, e.g. 10s.
    #[arg(long, default_value = "10s")]
    pub duration: String,
    /// Length of the measurement with the relay kill in its middle (0s: none).
    #[arg(long, default_value = "12s")]
    pub kill_duration: String,
    /// Paths per flow, 1 to 3.
    #[arg(long, default_value_t = 3)]
    pub max_paths: usize,
    /// Adaptive weights in the flow's session (`[flow] adaptive = true`): the SRR
    /// quanta follow what each path delivers instead of staying at the shares the
    /// probes measured.
    #[arg(long)]
    pub adaptive: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also draw a chart (.svg or .png).
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
    /// Seed of the emulator's loss process.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// The flags of `braid lab field`.
#[derive(clap::Args, Debug)]
pub struct FieldArgs {
    /// Length of the run; the events come at 15, 30, 40, 55 and 70 % of it (at least
    /// 8s, at most 10m). The run then waits up to 30 s more for the recoveries.
    #[arg(long, default_value = "30s")]
    pub duration: String,
    /// Each client's checked TCP block stream, e.g. 4mbit (at least 128kbit).
    #[arg(long, default_value = "4mbit")]
    pub stream_rate: String,
    /// Stop the server with SIGKILL (a crash: it tells its clients nothing) instead
    /// of SIGTERM (a service restart: it closes every session, telling each client).
    #[arg(long)]
    pub crash_server: bool,
    /// Copy the tunnels' logs to this directory at the end (t0.log the server's,
    /// t1.log..t3.log the clients'), also when the run fails.
    #[arg(long, value_name = "DIR")]
    pub logs: Option<PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

impl FieldArgs {
    /// Check every flag and build the field lab's options.
    pub fn options(&self) -> Result<FieldOptions> {
        let duration = parse_duration(&self.duration)
            .ok()
            .filter(|d| d.as_secs() >= 8 && d.as_secs() <= 600)
            .with_context(|| {
                format!(
                    "--duration '{}': expected e.g. 30s (8s to 10m)",
                    self.duration
                )
            })?;
        let rate = parse_rate(&self.stream_rate)
            .ok()
            .filter(|&r| (128_000..=1_000_000_000).contains(&r))
            .with_context(|| {
                format!(
                    "--stream-rate '{}': expected e.g. 4mbit (128kbit to 1gbit)",
                    self.stream_rate
                )
            })?;
        Ok(FieldOptions {
            duration,
            stream_rate: rate / 8,
            exe: braid_exe()?,
            crash_server: self.crash_server,
            logs: self.logs.clone(),
        })
    }
}

/// The flags of `braid lab stream-gen`.
#[derive(clap::Args, Debug)]
pub struct StreamGenArgs {
    /// Rate, e.g. 8mbit.
    #[arg(long)]
    pub rate: String,
    /// Record size in bytes.
    #[arg(long)]
    pub size: usize,
    /// How long, e.g. 20s.
    #[arg(long)]
    pub duration: String,
    /// - (standard output) or IP:PORT (UDP).
    #[arg(long)]
    pub to: String,
    /// Where to write the report (JSON).
    #[arg(long)]
    pub report: std::path::PathBuf,
}

/// The flags of `braid lab stream-sink`.
#[derive(clap::Args, Debug)]
pub struct StreamSinkArgs {
    /// Record size in bytes.
    #[arg(long)]
    pub size: usize,
    /// - (standard input) or IP:PORT to bind (UDP).
    #[arg(long)]
    pub from: String,
    /// UDP: stop after this long without a record.
    #[arg(long, default_value = "2s")]
    pub idle: String,
    /// UDP: give up if no record comes within this long.
    #[arg(long, default_value = "30s")]
    pub wait: String,
    /// Where to write the report (JSON).
    #[arg(long)]
    pub report: std::path::PathBuf,
}

/// The flags of `braid lab chart`.
#[derive(clap::Args, Debug)]
pub struct ChartArgs {
    /// The JSON written by `braid lab bench --json`.
    #[arg(long)]
    pub from: std::path::PathBuf,
    /// The chart to write (.svg or .png).
    #[arg(long)]
    pub out: std::path::PathBuf,
    /// Chart title.
    #[arg(long, default_value = "braid lab bench")]
    pub title: String,
}

/// The flags of `braid lab emulate`.
#[derive(clap::Args, Debug)]
pub struct EmulateArgs {
    /// The links, as given to `lab up`.
    #[arg(long)]
    pub links: String,
    /// Loss seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where to write counters.
    #[arg(long)]
    pub state_dir: std::path::PathBuf,
}

/// `on` or `off` (also `true`/`false`).
fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err(format!("'{s}': expected on or off")),
    }
}

/// The `braid` binary, which the labs start in their namespaces.
fn braid_exe() -> Result<PathBuf> {
    std::env::current_exe().context("locating the braid binary")
}

/// Check a plot's output path before a run that takes minutes.
pub fn check_plot(flag: &str, p: Option<&Path>) -> Result<()> {
    if let Some(p) = p {
        braid_sim::plot::check_path(flag, p).map_err(anyhow::Error::msg)?;
    }
    Ok(())
}

/// Read a saved `--json` result back with `parse`; `what` names the command that
/// wrote it.
pub fn load_json<T>(
    path: &Path,
    what: &str,
    parse: impl FnOnce(&serde_json::Value) -> Option<T>,
) -> Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    parse(&v).with_context(|| format!("{}: not the output of `{what} --json`", path.display()))
}

impl UpArgs {
    /// The links to build.
    pub fn links(&self) -> Result<Vec<LinkSpec>> {
        LinkSpec::parse_list(&self.links).context("--links")
    }

    /// The `braid` binary the lab runs its emulators with.
    pub fn exe(&self) -> Result<PathBuf> {
        braid_exe()
    }
}

impl ChangeArgs {
    /// The change, checked against the running lab's links as `lab up` recorded them.
    pub fn change(&self) -> Result<Change> {
        let Ok(text) = std::fs::read_to_string(topo::state_dir().join("links")) else {
            bail!("no lab is up (braid lab up --links …)");
        };
        let links = LinkSpec::parse_list(text.trim())
            .context("the running lab's links")?
            .len();
        Change::parse(&format!("0s:{}:{}", self.link, self.to), links).context("lab change")
    }
}

impl BenchArgs {
    /// Check every flag and build the bench's options.
    pub fn options(&self) -> Result<BenchOptions> {
        self.check_buffer()?;
        let set = session_lines(&self.set)?;
        let links = LinkSpec::parse_list(&self.links).context("--links")?;
        let changes = self.changes(links.len())?;
        let weights = self.weights(links.len())?;
        let pace = self.pace(links.len())?;
        self.check_arq()?;
        let duration = parse_duration(&self.duration)
            .ok()
            .filter(|d| d.as_secs() >= 1)
            .with_context(|| {
                format!(
                    "--duration '{}': expected e.g. 10s (at least 1s)",
                    self.duration
                )
            })?;
        let modes = self.modes()?;
        check_plot("--plot", self.plot.as_deref())?;
        Ok(BenchOptions {
            links,
            duration,
            modes,
            mptcp: !self.no_mptcp,
            weights,
            adaptive: match (self.adaptive, self.static_weights) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            },
            aqm: self.aqm,
            aqm_loss_signal: self.aqm_loss_signal,
            pace,
            security: self.security.clone(),
            arq: self.arq.clone(),
            credits: self.credits,
            tcp_streams: self.tcp_streams,
            tcp_streams_fast: self.tcp_streams_fast,
            flow_order: self.flow_order,
            return_path: !self.no_return_path,
            buffer_packets: self.buffer_packets,
            set,
            changes,
            runs: self.runs as usize,
            flows: self.flows as usize,
            idle: self.idle as usize,
            call: self.call || self.call_transport.is_some(),
            call_transport: self.call_transport.unwrap_or_default(),
            download: self.download_bytes()?,
            exe: braid_exe()?,
            seed: self.seed,
        })
    }

    /// `--download` in bytes.
    fn download_bytes(&self) -> Result<Option<u64>> {
        match &self.download {
            None => Ok(None),
            Some(t) => parse_size(t)
                .map(Some)
                .with_context(|| format!("--download '{t}'")),
        }
    }
}

/// `--set KEY=VALUE` as `[session]` lines: the key must be a session setting without a
/// flag of its own in `lab bench`; the value is written bare if TOML reads it as a
/// number or a boolean, else quoted.
fn session_lines(set: &[String]) -> Result<Vec<String>> {
    /// Keys `lab bench` writes itself or has a flag for.
    const OWN: &[&str] = &[
        "key",
        "mode",
        "scheduler",
        "aqm",
        "aqm_loss_signal",
        "adaptive",
        "security",
        "allow_insecure",
        "arq",
        "buffer_packets",
        "credits",
        "tcp_streams",
        "tcp_streams_fast",
        "flow_order",
        "return_path",
    ];
    let known = braid_proto::session::schema::REFERENCE;
    let mut lines = Vec::new();
    for kv in set {
        let Some((key, value)) = kv.split_once('=') else {
            bail!("--set '{kv}': expected KEY=VALUE, e.g. marker_interval=10ms");
        };
        let (key, value) = (key.trim(), value.trim());
        if OWN.contains(&key) {
            bail!("--set {key}: lab bench sets this itself or has a flag for it (see --help)");
        }
        if !known.iter().any(|d| d.key == key) {
            bail!("--set {key}: not a [session] setting (the keys are in docs/settings.md)");
        }
        if lines
            .iter()
            .any(|l: &String| l.starts_with(&format!("{key} = ")))
        {
            bail!("--set {key}: given twice");
        }
        let bare = value == "true"
            || value == "false"
            || value.parse::<i64>().is_ok()
            || value.parse::<f64>().is_ok_and(f64::is_finite);
        let value = if bare {
            value.to_string()
        } else {
            format!("{value:?}")
        };
        lines.push(format!("{key} = {value}"));
    }
    Ok(lines)
}

impl BenchArgs {
    fn check_buffer(&self) -> Result<()> {
        if let Some(b) = self.buffer_packets {
            if b < 1 || (self.credits && b < 68) {
                bail!(
                    "--buffer-packets {b}: at least 1, and with --credits at least 68 \
                     (the window is the buffer less 64 packets for markers)"
                );
            }
        }
        Ok(())
    }

    /// The scripted changes, each before the end of a measurement.
    fn changes(&self, links: usize) -> Result<Vec<Change>> {
        let changes = self
            .changes
            .iter()
            .map(|c| Change::parse(c, links))
            .collect::<Result<Vec<_>, _>>()
            .context("--change")?;
        let secs = parse_duration(&self.duration).unwrap_or_default();
        if let Some(late) = changes.iter().find(|c| c.at >= secs) {
            bail!(
                "--change {}: at {:?}, not before the end of a {} measurement",
                late.text,
                late.at,
                self.duration
            );
        }
        Ok(changes)
    }

    fn weights(&self, links: usize) -> Result<Option<Vec<u32>>> {
        let Some(w) = &self.weights else {
            return Ok(None);
        };
        let ws = w
            .split(',')
            .map(|x| x.trim().parse::<u32>().ok().filter(|&v| v >= 1))
            .collect::<Option<Vec<u32>>>()
            .with_context(|| format!("--weights '{w}': whole numbers >= 1"))?;
        if ws.len() != links {
            bail!("--weights: {} weights for {} links", ws.len(), links);
        }
        Ok(Some(ws))
    }

    fn pace(&self, links: usize) -> Result<Pace> {
        Ok(match (self.pace.as_deref(), &self.pace_rates) {
            (None, None) => Pace::Default,
            (Some("auto"), _) => Pace::Auto,
            (Some("off"), _) => Pace::Off,
            (Some(v), _) => Pace::Share(
                v.parse::<f64>()
                    .ok()
                    .filter(|p| p.is_finite() && *p > 0.0 && *p <= 2.0)
                    .with_context(|| {
                        format!(
                            "--pace {v}: expected a share of the link's rate above 0 \
                             (at most 2), e.g. 0.99, or auto, or off"
                        )
                    })?,
            ),
            (None, Some(list)) => Pace::Rates(pace_rates(list, links)?),
        })
    }

    fn check_arq(&self) -> Result<()> {
        if let Some(r) = &self.arq {
            parse_duration(r).with_context(|| format!("--arq '{r}': expected e.g. 100ms"))?;
        }
        Ok(())
    }

    fn modes(&self) -> Result<Vec<String>> {
        let modes: Vec<String> = self
            .modes
            .split(',')
            .map(|m| m.trim().to_string())
            .collect();
        for m in &modes {
            if parse_mode(m).is_err() {
                bail!("--modes: unknown mode '{m}' (logical, seq, trr, none)");
            }
        }
        Ok(modes)
    }
}

/// `--pace-rates`: one rate (or `auto`) per link.
fn pace_rates(list: &str, links: usize) -> Result<Vec<Option<u64>>> {
    let rs = list
        .split(',')
        .map(|x| match x.trim() {
            "auto" => Some(None),
            r => parse_rate(r).ok().filter(|&r| r > 0).map(Some),
        })
        .collect::<Option<Vec<Option<u64>>>>()
        .with_context(|| {
            format!("--pace-rates '{list}': rates above 0 or auto, e.g. 100mbit,50mbit")
        })?;
    if rs.len() != links {
        bail!("--pace-rates: {} rates for {} links", rs.len(), links);
    }
    Ok(rs)
}

impl ChartArgs {
    /// The saved bench result, once the chart's path is checked.
    pub fn load(&self) -> Result<BenchResult> {
        braid_sim::plot::check_path("--out", &self.out).map_err(anyhow::Error::msg)?;
        load_json(&self.from, "braid lab bench", BenchResult::from_json)
    }
}

impl StreamArgs {
    /// A saved result to show (`--from`), if any.
    pub fn saved(&self) -> Result<Option<StreamResult>> {
        check_plot("--plot", self.plot.as_deref())?;
        self.from
            .as_deref()
            .map(|f| load_json(f, "braid lab stream", StreamResult::from_json))
            .transpose()
    }

    /// Check every flag and build the stream lab's options.
    pub fn options(&self) -> Result<StreamOptions> {
        let links = LinkSpec::parse_list(&self.links).context("--links")?;
        let duration = parse_duration(&self.duration)
            .ok()
            .filter(|d| d.as_secs() >= 1 && d.as_secs() <= 3600)
            .with_context(|| {
                format!(
                    "--duration '{}': expected e.g. 20s (1s to 1h)",
                    self.duration
                )
            })?;
        let rate_bps = parse_rate(&self.rate)
            .ok()
            .filter(|&r| (8_000..=1_000_000_000).contains(&r))
            .with_context(|| {
                format!(
                    "--rate '{}': expected e.g. 8mbit (8kbit to 1gbit)",
                    self.rate
                )
            })?;
        self.check_size()?;
        let tolerances = self.tolerances()?;
        let deadline = match &self.deadline {
            Some(d) => Some(parse_duration(d).with_context(|| format!("--deadline '{d}'"))?),
            None => None,
        };
        let srt_latency = self.srt_latency()?;
        Ok(StreamOptions {
            links,
            duration,
            rate_bps,
            size: self.size,
            tolerances,
            deadline,
            srt: !self.no_srt,
            single: !self.no_single,
            srt_latency,
            srt_rtt_factor: self.srt_rtt_factor,
            exe: braid_exe()?,
            seed: self.seed,
        })
    }

    fn check_size(&self) -> Result<()> {
        let size = self.size;
        crate::stream::check_size(size).map_err(|e| anyhow::anyhow!("--size: {e}"))?;
        if size > 1400 {
            bail!("--size {size}: a record must fit one packet of a 1500-byte link (at most 1400)");
        }
        Ok(())
    }

    fn tolerances(&self) -> Result<Vec<[u16; 3]>> {
        if self.tolerances.is_empty() {
            bail!("--tolerance: give at least one W,E,B");
        }
        self.tolerances
            .iter()
            .map(|t| {
                braid_io::transfer::parse_tolerance(t)
                    .map(|t| [t.w, t.e, t.b])
                    .map_err(|e| anyhow::anyhow!("--tolerance: {e}"))
            })
            .collect()
    }

    fn srt_latency(&self) -> Result<Option<std::time::Duration>> {
        let f = self.srt_rtt_factor;
        let latency = match &self.srt_latency {
            Some(d) => Some(
                parse_duration(d)
                    .ok()
                    .filter(|d| d.as_millis() >= 1)
                    .with_context(|| format!("--srt-latency '{d}': expected e.g. 40ms"))?,
            ),
            None => None,
        };
        if !(f.is_finite() && f > 0.0 && f <= 100.0) {
            bail!("--srt-rtt-factor {f}: expected a number above 0 (3 to 4 is SRT's advice)");
        }
        Ok(latency)
    }
}

impl OverlayArgs {
    /// Check every flag and build the overlay lab's options.
    pub fn options(&self) -> Result<OverlayOptions> {
        let spec =
            |flag: &str, v: &str| LinkSpec::parse(v).with_context(|| format!("{flag} '{v}'"));
        let relays = LinkSpec::parse_list(&self.relays).context("--relays")?;
        if relays.len() != 3 {
            bail!(
                "--relays: three hop specs, one per relay ({} given)",
                relays.len()
            );
        }
        let secs = |flag: &str, v: &str, min: u64| {
            parse_duration(v)
                .ok()
                .filter(|d| d.as_secs() >= min)
                .with_context(|| format!("{flag} '{v}': expected e.g. 10s (at least {min}s)"))
        };
        let max_paths = self.max_paths;
        if !(1..=3).contains(&max_paths) {
            bail!("--max-paths {max_paths}: 1, 2 or 3");
        }
        check_plot("--plot", self.plot.as_deref())?;
        let kill = secs("--kill-duration", &self.kill_duration, 0)?;
        if !kill.is_zero() && kill.as_secs() < 4 {
            bail!("--kill-duration: 0s, or at least 4s");
        }
        Ok(OverlayOptions {
            matrix: Matrix {
                direct: spec("--direct", &self.direct)?,
                relays,
                between: spec("--between", &self.between)?,
            },
            duration: secs("--duration", &self.duration, 1)?,
            kill_duration: kill,
            max_paths,
            adaptive: self.adaptive,
            exe: braid_exe()?,
            seed: self.seed,
        })
    }
}

impl StreamGenArgs {
    /// Generate the stream and write its report.
    pub fn run(&self) -> Result<()> {
        let rate =
            parse_rate(&self.rate).map_err(|e| anyhow::anyhow!("--rate '{}': {e}", self.rate))?;
        let duration = parse_duration(&self.duration)
            .with_context(|| format!("--duration '{}'", self.duration))?;
        let to = Endpoint::parse(&self.to).map_err(|e| anyhow::anyhow!("--to {e}"))?;
        let r = crate::stream::generate(rate, self.size, duration, to)
            .map_err(|e| anyhow::anyhow!("stream-gen: {e}"))?;
        write_report(&self.report, &r.to_json())
    }
}

impl StreamSinkArgs {
    /// Receive the stream and write its report.
    pub fn run(&self) -> Result<()> {
        let from = Endpoint::parse(&self.from).map_err(|e| anyhow::anyhow!("--from {e}"))?;
        let idle = parse_duration(&self.idle).with_context(|| format!("--idle '{}'", self.idle))?;
        let wait = parse_duration(&self.wait).with_context(|| format!("--wait '{}'", self.wait))?;
        let r = crate::stream::sink(self.size, from, idle, wait)
            .map_err(|e| anyhow::anyhow!("stream-sink: {e}"))?;
        write_report(&self.report, &r.to_json())
    }
}

fn write_report(path: &Path, v: &serde_json::Value) -> Result<()> {
    std::fs::write(path, v.to_string()).with_context(|| format!("writing {}", path.display()))
}

impl EmulateArgs {
    /// Run the link emulator until it is stopped.
    pub fn run(&self) -> Result<()> {
        let links = LinkSpec::parse_list(&self.links).context("--links")?;
        crate::emu::run_links(&links, self.seed, &self.state_dir).map_err(anyhow::Error::msg)?;
        Ok(())
    }
}

/// A size in bytes: `2MB`, `512KB`, `2000000` (1000 per k), from 1 KB to 1 GB.
fn parse_size(t: &str) -> Result<u64> {
    let bad = || anyhow::anyhow!("expected a size such as 2MB, 512KB or 2000000 (1 KB to 1 GB)");
    let lower = t.trim().to_ascii_lowercase();
    let (num, unit) = match lower.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => lower.split_at(i),
        None => (lower.as_str(), ""),
    };
    let n: f64 = num.parse().map_err(|_| bad())?;
    let scale = match unit.trim() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        _ => return Err(bad()),
    };
    let bytes = (n * scale).round();
    if !(1e3..=1e9).contains(&bytes) {
        return Err(bad());
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::{parse_size, session_lines};

    #[test]
    fn set_writes_session_lines_and_refuses_what_it_cannot() {
        let set = |v: &[&str]| session_lines(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            set(&[
                "marker_interval=10ms",
                "trigger_every = 64",
                "equalize=false"
            ])
            .unwrap(),
            [
                "marker_interval = \"10ms\"",
                "trigger_every = 64",
                "equalize = false"
            ]
        );
        for (bad, says) in [
            (&["marker_interval"][..], "KEY=VALUE"),
            (&["no_such_key=1"], "not a [session] setting"),
            (&["aqm=false"], "has a flag"),
            (&["trigger_every=1", "trigger_every=2"], "given twice"),
        ] {
            let e = set(bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn sizes_take_units_and_refuse_the_rest() {
        assert_eq!(parse_size("2MB").unwrap(), 2_000_000);
        assert_eq!(parse_size("2mb").unwrap(), 2_000_000);
        assert_eq!(parse_size("512KB").unwrap(), 512_000);
        assert_eq!(parse_size("1.5M").unwrap(), 1_500_000);
        assert_eq!(parse_size("2000000").unwrap(), 2_000_000);
        for bad in ["", "MB", "2XB", "12", "2GB", "-1MB", "two"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
