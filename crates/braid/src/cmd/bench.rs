//! `braid bench`: a traffic generator (`send`) and sink (`sink`) over braid channels,
//! without a TUN device and without privileges, plus a raw-UDP pair (`udp-send`,
//! `udp-sink`) with the same payload and report, as the baseline. The traffic and its
//! accounting are `braid_io::traffic`; this parses arguments and prints.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use braid_io::traffic::{self, Pattern, SendReport, SinkReport};
use braid_io::{Session, SessionConfig};
use braid_proto::units;
use tracing::info;

use super::tunnel::{init_tracing, parse_timeout, runtime, shutdown_signal};

/// Arguments of `braid bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    role: Box<Role>,
}

#[derive(clap::Subcommand, Debug)]
enum Role {
    /// Generate traffic over braid channels.
    Send(SendArgs),
    /// Receive traffic over braid channels and report.
    Sink(SinkArgs),
    /// Baseline: generate the same traffic on one plain UDP socket.
    UdpSend(UdpSendArgs),
    /// Baseline: receive plain UDP and report.
    UdpSink(UdpSinkArgs),
}

/// Session options shared by `braid bench`, `braid send` and `braid recv`.
#[derive(clap::Args, Debug)]
pub(crate) struct SessionArgs {
    /// Configuration file with [session] and [[channel]] (a [tunnel] section is ignored).
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// A channel as LOCAL_ADDR,REMOTE_ADDR (repeat for each channel, same order at both ends).
    #[arg(long = "channel", value_name = "LOCAL,REMOTE")]
    pub(crate) channels: Vec<String>,
    /// File with the pre-shared key (when not using --config): 32 random bytes, base64
    /// or raw, not readable by others (`braid genkey > k && chmod 600 k`). A file, not
    /// the key itself, so the key does not show in the process list.
    #[arg(long, value_name = "FILE")]
    pub(crate) key_file: Option<PathBuf>,
    /// Receiver mode: logical, seq, trr or none.
    #[arg(long)]
    pub(crate) mode: Option<String>,
    /// Scheduler: srr, rr or grr.
    #[arg(long)]
    pub(crate) scheduler: Option<String>,
    /// Channel weights, comma-separated (relative capacities).
    #[arg(long)]
    pub(crate) weights: Option<String>,
    /// Heartbeat interval (e.g. 50ms).
    #[arg(long)]
    pub(crate) heartbeat: Option<String>,
    /// Declare a channel down after this long without traffic (e.g. 300ms).
    #[arg(long)]
    pub(crate) dead_after: Option<String>,
    /// Control socket for `braid status`.
    #[arg(long)]
    pub(crate) control: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long)]
    pub(crate) metrics: Option<SocketAddr>,
    /// Give up if the peer has not answered within this time.
    #[arg(long, default_value = "10s")]
    pub(crate) peer_timeout: String,
    /// Log a one-line summary this often (0s: never).
    #[arg(long, default_value = "0s")]
    pub(crate) log_interval: String,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(clap::Args, Debug, Clone)]
struct Traffic {
    /// Payload sizes in bytes, comma-separated, used in turn (at least 17).
    #[arg(long, default_value = "1400")]
    size: String,
    /// Send this many messages (default: run for --duration).
    #[arg(long)]
    count: Option<u64>,
    /// Send for this long (default 5s when --count is not given).
    #[arg(long)]
    duration: Option<String>,
    /// Payload bit rate, e.g. 50M or 1.5G (default: as fast as possible).
    #[arg(long)]
    rate: Option<String>,
    /// Messages per second (instead of --rate).
    #[arg(long)]
    pps: Option<f64>,
}

#[derive(clap::Args, Debug)]
struct SendArgs {
    #[command(flatten)]
    s: SessionArgs,
    #[command(flatten)]
    t: Traffic,
}

#[derive(clap::Args, Debug)]
struct SinkArgs {
    #[command(flatten)]
    s: SessionArgs,
    /// Stop when nothing has arrived for this long after the first message.
    #[arg(long, default_value = "3s")]
    idle: String,
    /// Stop after this long in any case (0s: no limit).
    #[arg(long, default_value = "0s")]
    max_duration: String,
}

#[derive(clap::Args, Debug)]
struct UdpSendArgs {
    /// Destination address.
    #[arg(long)]
    to: SocketAddr,
    /// Local address.
    #[arg(long, default_value = "0.0.0.0:0")]
    bind: SocketAddr,
    #[command(flatten)]
    t: Traffic,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
struct UdpSinkArgs {
    /// Address to listen on.
    #[arg(long)]
    bind: SocketAddr,
    /// Stop when nothing has arrived for this long after the first message.
    #[arg(long, default_value = "3s")]
    idle: String,
    /// Stop after this long in any case (0s: no limit).
    #[arg(long, default_value = "0s")]
    max_duration: String,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Run `braid bench`.
pub fn run(a: Args) -> Result<()> {
    init_tracing();
    let rt = runtime()?;
    rt.block_on(async move {
        match *a.role {
            Role::Send(x) => send(x).await,
            Role::Sink(x) => sink(x).await,
            Role::UdpSend(x) => udp_send(x).await,
            Role::UdpSink(x) => udp_sink(x).await,
        }
    })
}

fn session_config(a: &SessionArgs) -> Result<SessionConfig> {
    let o = braid_io::transfer::SessionOptions {
        config: a.config.clone(),
        channels: a.channels.clone(),
        key_file: a.key_file.clone(),
        mode: a.mode.clone(),
        scheduler: a.scheduler.clone(),
        weights: a.weights.clone(),
        heartbeat: a.heartbeat.clone(),
        dead_after: a.dead_after.clone(),
    };
    o.session_config().map_err(|e| anyhow!(e))
}

impl Traffic {
    fn pattern(&self, max: usize) -> Result<Pattern> {
        let sizes = self
            .size
            .split(',')
            .map(|x| {
                x.trim()
                    .parse::<usize>()
                    .map_err(|_| anyhow!("--size: '{x}' is not a whole number"))
            })
            .collect::<Result<Vec<_>>>()?;
        let duration = match &self.duration {
            Some(d) => Some(units::parse_duration(d).context("--duration")?),
            None => None,
        };
        let rate = match &self.rate {
            Some(r) => Some(units::parse_rate(r).context("--rate")? as f64),
            None => None,
        };
        Ok(Pattern::new(
            sizes, self.count, duration, rate, self.pps, max,
        )?)
    }
}

fn print_send(r: &SendReport, json: bool) {
    if json {
        println!("{}", serde_json::to_string_pretty(r).unwrap_or_default());
    } else {
        println!("{}", r.summary());
        if let Some(s) = &r.session {
            print!("{}", s.table());
        }
    }
}

fn print_sink(r: &SinkReport, json: bool) {
    if json {
        println!("{}", serde_json::to_string_pretty(r).unwrap_or_default());
    } else {
        print!("{}", r.table());
        if let Some(s) = &r.session {
            print!("{}", s.table());
        }
    }
}

pub(crate) async fn start_session(
    a: &SessionArgs,
) -> Result<(Session, Option<braid_io::observe::ControlServer>, Duration)> {
    let cfg = session_config(a)?;
    let mut session = Session::start(cfg).await?;
    let observers = braid_io::tunnel::Observers {
        control: a.control.clone(),
        metrics: a.metrics,
        log_interval: parse_timeout(&a.log_interval, "--log-interval")?.unwrap_or_default(),
    };
    let ctl = braid_io::tunnel::start_observers(&observers, session.stats_handle()).await?;
    let timeout = parse_timeout(&a.peer_timeout, "--peer-timeout")?
        .unwrap_or(Duration::from_secs(u64::MAX / 4));
    session.wait_for_peer(timeout).await?;
    Ok((session, ctl, timeout))
}

async fn send(a: SendArgs) -> Result<()> {
    let (mut session, _ctl, _) = start_session(&a.s).await?;
    let pattern =
        a.t.pattern(session.sender().max_message().saturating_sub(1))?;
    info!("peer answered; sending");
    let r = traffic::session_send(&mut session, &pattern, shutdown_signal()).await?;
    session.close().await;
    print_send(&r, a.s.json);
    Ok(())
}

fn stop_after(s: &str) -> Result<tokio::time::Instant> {
    let d = parse_timeout(s, "--max-duration")?.unwrap_or(Duration::from_secs(u64::MAX / 4));
    Ok(tokio::time::Instant::now() + d)
}

async fn sink(a: SinkArgs) -> Result<()> {
    let idle = units::parse_duration(&a.idle).context("--idle")?;
    let deadline = stop_after(&a.max_duration)?;
    let (mut session, _ctl, timeout) = start_session(&a.s).await?;
    info!("peer answered; receiving");
    let r = traffic::session_sink(&mut session, idle, timeout, deadline, shutdown_signal()).await;
    session.close().await;
    print_sink(&r, a.s.json);
    Ok(())
}

async fn udp_send(a: UdpSendArgs) -> Result<()> {
    let pattern = a.t.pattern(65507)?;
    let r = traffic::udp_send(a.to, a.bind, &pattern, shutdown_signal()).await?;
    print_send(&r, a.json);
    Ok(())
}

async fn udp_sink(a: UdpSinkArgs) -> Result<()> {
    let idle = units::parse_duration(&a.idle).context("--idle")?;
    let r = traffic::udp_sink(
        a.bind,
        idle,
        stop_after(&a.max_duration)?,
        shutdown_signal(),
    )
    .await?;
    print_sink(&r, a.json);
    Ok(())
}
