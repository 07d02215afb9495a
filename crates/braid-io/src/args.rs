//! The flags of the commands that run a session on real sockets (`braid bench`, `braid
//! send`, `braid recv`), declared once with clap (the `braid` CLI puts them in its
//! command tree), and their check into this crate's configurations. Errors name the
//! flag at fault.

use std::fmt::Display;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use braid_proto::units;
use serde::Serialize;

use crate::observe::ControlServer;
use crate::traffic::Pattern;
use crate::transfer::{
    self, ProgressLine, RecvSummary, SendSummary, SessionOptions, TransferConfig,
};
use crate::{Session, SessionConfig};

/// Session options shared by `braid bench`, `braid send` and `braid recv`.
#[derive(clap::Args, Debug)]
pub struct SessionArgs {
    /// Configuration file with [session] and [[channel]] (a [tunnel] section is ignored).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// A channel as LOCAL_ADDR,REMOTE_ADDR (repeat for each channel, same order at both ends).
    #[arg(long = "channel", value_name = "LOCAL,REMOTE")]
    pub channels: Vec<String>,
    /// File with the pre-shared key (when not using --config): 32 random bytes, base64
    /// or raw, not readable by others (`braid genkey > k && chmod 600 k`). A file, not
    /// the key itself, so the key does not show in the process list.
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// Receiver mode: logical, seq, trr or none.
    #[arg(long)]
    pub mode: Option<String>,
    /// Scheduler: srr, rr or grr.
    #[arg(long)]
    pub scheduler: Option<String>,
    /// Channel weights, comma-separated (relative capacities).
    #[arg(long)]
    pub weights: Option<String>,
    /// Heartbeat interval (e.g. 50ms).
    #[arg(long)]
    pub heartbeat: Option<String>,
    /// Declare a channel down after this long without traffic (e.g. 300ms).
    #[arg(long)]
    pub dead_after: Option<String>,
    /// Control socket for `braid status`.
    #[arg(long)]
    pub control: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long)]
    pub metrics: Option<SocketAddr>,
    /// Give up if the peer has not answered within this time.
    #[arg(long, default_value = "10s")]
    pub peer_timeout: String,
    /// Log a one-line summary this often (0s: never).
    #[arg(long, default_value = "0s")]
    pub log_interval: String,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Traffic to generate (`braid bench send`, `udp-send`).
#[derive(clap::Args, Debug, Clone)]
pub struct Traffic {
    /// Payload sizes in bytes, comma-separated, used in turn (at least 17).
    #[arg(long, default_value = "1400")]
    pub size: String,
    /// Send this many messages (default: run for --duration).
    #[arg(long)]
    pub count: Option<u64>,
    /// Send for this long (default 5s when --count is not given).
    #[arg(long)]
    pub duration: Option<String>,
    /// Payload bit rate, e.g. 50M or 1.5G (default: as fast as possible).
    #[arg(long)]
    pub rate: Option<String>,
    /// Messages per second (instead of --rate).
    #[arg(long)]
    pub pps: Option<f64>,
}

/// The flags of `braid bench send`.
#[derive(clap::Args, Debug)]
pub struct BenchSendArgs {
    /// The session.
    #[command(flatten)]
    pub s: SessionArgs,
    /// The traffic.
    #[command(flatten)]
    pub t: Traffic,
}

/// The flags of `braid bench sink`.
#[derive(clap::Args, Debug)]
pub struct BenchSinkArgs {
    /// The session.
    #[command(flatten)]
    pub s: SessionArgs,
    /// Stop when nothing has arrived for this long after the first message.
    #[arg(long, default_value = "3s")]
    pub idle: String,
    /// Stop after this long in any case (0s: no limit).
    #[arg(long, default_value = "0s")]
    pub max_duration: String,
}

/// The flags of `braid bench udp-send`.
#[derive(clap::Args, Debug)]
pub struct UdpSendArgs {
    /// Destination address.
    #[arg(long)]
    pub to: SocketAddr,
    /// Local address.
    #[arg(long, default_value = "0.0.0.0:0")]
    pub bind: SocketAddr,
    /// The traffic.
    #[command(flatten)]
    pub t: Traffic,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The flags of `braid bench udp-sink`.
#[derive(clap::Args, Debug)]
pub struct UdpSinkArgs {
    /// Address to listen on.
    #[arg(long)]
    pub bind: SocketAddr,
    /// Stop when nothing has arrived for this long after the first message.
    #[arg(long, default_value = "3s")]
    pub idle: String,
    /// Stop after this long in any case (0s: no limit).
    #[arg(long, default_value = "0s")]
    pub max_duration: String,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The flags of `braid send`.
#[derive(clap::Args, Debug)]
pub struct SendArgs {
    /// The session.
    #[command(flatten)]
    pub s: SessionArgs,
    /// The file to send, or - for standard input.
    pub input: String,
    /// Loss tolerance W,E,B: segments of W packets, at most E lost per segment, at most B
    /// in a row (64,0,0: full reliability). The receiver uses the sender's.
    #[arg(long, default_value = "64,0,0")]
    pub tolerance: String,
    /// Give up repairing a segment this long after it started (e.g. 2s; default: never).
    #[arg(long)]
    pub deadline: Option<String>,
    /// Round-trip estimate: repair requests younger than this are ignored.
    #[arg(long, default_value = "50ms")]
    pub rtt: String,
    /// Segments in flight (default: about 4096 packets' worth).
    #[arg(long)]
    pub window: Option<u32>,
    /// Data bytes per packet (default: as many as the channels carry; 1316 with --live).
    #[arg(long)]
    pub chunk: Option<usize>,
    /// A live stream of fixed-size records: every packet carries exactly --chunk bytes
    /// (the input is read until a chunk is full, default 1316 = 7 MPEG-TS packets), so a
    /// packet lost within the tolerance takes whole records with it and the reader
    /// stays aligned. Use `braid recv --live` at the other end for low latency.
    #[arg(long)]
    pub live: bool,
    /// Show a progress line even when stderr is not a terminal.
    #[arg(long)]
    pub progress: bool,
}

/// The flags of `braid recv`.
#[derive(clap::Args, Debug)]
pub struct RecvArgs {
    /// The session.
    #[command(flatten)]
    pub s: SessionArgs,
    /// Where to write the stream, or - for standard output. A file is written to a
    /// temporary file beside it (.OUTPUT.XXXXXX.part), created when the first data
    /// arrives and renamed to OUTPUT when the transfer completes; a failed or
    /// interrupted run removes it and leaves OUTPUT as it was. Standard output and an
    /// existing device or FIFO (/dev/null, a named pipe) are written in place, as the
    /// data comes.
    pub output: String,
    /// Replace OUTPUT if it exists (it is replaced only when the transfer completes).
    /// Without it an existing file is an error and is kept unchanged.
    #[arg(long)]
    pub force: bool,
    /// Write each packet as soon as every packet before it has arrived or is lost within
    /// the tolerance, instead of a whole segment (W packets) at a time: the latency of
    /// a live stream no longer includes the time to fill a segment. The output is the
    /// same bytes in the same order.
    #[arg(long)]
    pub live: bool,
    /// Show a progress line even when stderr is not a terminal.
    #[arg(long)]
    pub progress: bool,
}

/// A duration flag where 0 means none (`--peer-timeout`, `--log-interval`, ...).
pub fn parse_timeout(s: &str, what: &str) -> Result<Option<Duration>> {
    let d = units::parse_duration(s).map_err(|e| anyhow!("{what}: {e}"))?;
    Ok(if d.is_zero() { None } else { Some(d) })
}

/// `--max-duration`: the instant to stop at (0s: never).
pub fn stop_after(s: &str) -> Result<tokio::time::Instant> {
    let d = parse_timeout(s, "--max-duration")?.unwrap_or(Duration::from_secs(u64::MAX / 4));
    Ok(tokio::time::Instant::now() + d)
}

impl SessionArgs {
    /// The session configuration the flags describe.
    pub fn session_config(&self) -> Result<SessionConfig> {
        let o = SessionOptions {
            config: self.config.clone(),
            channels: self.channels.clone(),
            key_file: self.key_file.clone(),
            mode: self.mode.clone(),
            scheduler: self.scheduler.clone(),
            weights: self.weights.clone(),
            heartbeat: self.heartbeat.clone(),
            dead_after: self.dead_after.clone(),
        };
        o.session_config().map_err(|e| anyhow!(e))
    }

    /// Start the session and its observers and wait for the peer: the session, its
    /// control socket (kept while it runs) and the peer timeout.
    pub async fn start(&self) -> Result<(Session, Option<ControlServer>, Duration)> {
        let cfg = self.session_config()?;
        let mut session = Session::start(cfg).await?;
        let observers = crate::tunnel::Observers {
            control: self.control.clone(),
            metrics: self.metrics,
            log_interval: parse_timeout(&self.log_interval, "--log-interval")?.unwrap_or_default(),
            reload: None,
        };
        let ctl = crate::tunnel::start_observers(&observers, session.stats_handle()).await?;
        let timeout = parse_timeout(&self.peer_timeout, "--peer-timeout")?
            .unwrap_or(Duration::from_secs(u64::MAX / 4));
        session.wait_for_peer(timeout).await?;
        Ok((session, ctl, timeout))
    }

    /// The transfer settings these flags set (the peer timeout).
    pub fn transfer_config(&self) -> Result<TransferConfig> {
        Ok(TransferConfig {
            peer_timeout: parse_timeout(&self.peer_timeout, "--peer-timeout")?,
            ..TransferConfig::default()
        })
    }
}

impl Traffic {
    /// The traffic pattern, messages at most `max` bytes.
    pub fn pattern(&self, max: usize) -> Result<Pattern> {
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

impl SendArgs {
    /// The transfer settings of `braid send`, checked.
    pub fn transfer_config(&self) -> Result<TransferConfig> {
        let mut c = self.s.transfer_config()?;
        c.tolerance =
            transfer::parse_tolerance(&self.tolerance).map_err(|e| anyhow!("--tolerance: {e}"))?;
        c.deadline = match &self.deadline {
            Some(d) => Some(units::parse_duration(d).context("--deadline")?),
            None => None,
        };
        c.rtt = units::parse_duration(&self.rtt).context("--rtt")?;
        c.window = self.window.unwrap_or(0);
        c.chunk = self.chunk.unwrap_or(if self.live { 1316 } else { 0 });
        if c.chunk == 0 && self.chunk.is_some() {
            return Err(anyhow!("--chunk must be at least 1 byte"));
        }
        c.live = self.live;
        c.errctl()?;
        Ok(c)
    }
}

impl RecvArgs {
    /// The transfer settings of `braid recv`.
    pub fn transfer_config(&self) -> Result<TransferConfig> {
        Ok(TransferConfig {
            live: self.live,
            ..self.s.transfer_config()?
        })
    }
}

impl SendArgs {
    /// `braid send`: open the input, start the session, send until done or `stop`
    /// resolves (an error naming the signal). The summary to print on stderr (a text
    /// for a person, or JSON with `--json`), which stays clear of the data.
    pub async fn run(
        &self,
        cfg: &TransferConfig,
        stop: impl Future<Output = impl Display>,
    ) -> Result<String> {
        let input = transfer::open_input(&self.input).await?;
        let (mut session, _ctl, _) = self.s.start().await?;
        let progress = ProgressLine::start(self.progress);
        let r = tokio::select! {
            r = transfer::send(&mut session, input, cfg, progress.sender()) => r,
            sig = stop => return Err(anyhow!("{sig}: transfer interrupted")),
        };
        conclude(r, progress, session, SendSummary::text, self.s.json).await
    }
}

impl RecvArgs {
    /// `braid recv`: check the output, start the session, receive until the sender is
    /// done or `stop` resolves (an error naming the signal; the output stays as it
    /// was). The summary to print on stderr, as [`SendArgs::run`].
    pub async fn run(
        &self,
        cfg: &TransferConfig,
        stop: impl Future<Output = impl Display>,
    ) -> Result<String> {
        // Checks only: nothing on disk changes before data arrives.
        let mut output = transfer::open_output(&self.output, self.force).await?;
        let (mut session, _ctl, _) = self.s.start().await?;
        let progress = ProgressLine::start(self.progress);
        // On failure `output` is dropped, which removes its temporary file.
        let staged = output
            .staged()
            .map(|p| (p.display().to_string(), p.exists()));
        let unchanged = |e: anyhow::Error| match &staged {
            Some((p, true)) => e.context(format!("'{p}' is unchanged")),
            Some((p, false)) => e.context(format!("'{p}' was not created")),
            None => e,
        };
        let r = tokio::select! {
            r = transfer::recv(&mut session, &mut output, cfg, progress.sender()) => r,
            sig = stop => {
                return Err(unchanged(anyhow!("{sig}: transfer interrupted")));
            }
        };
        let r = match r {
            Ok(s) => output.finish().await.map(|()| s),
            Err(e) => Err(e),
        }
        .map_err(|e| unchanged(e.into()));
        conclude(r, progress, session, RecvSummary::text, self.s.json).await
    }
}

/// After a transfer: let the progress line finish, close the session, and render the
/// summary (`text` for a person, or JSON and a newline).
async fn conclude<S: Serialize, E: Into<anyhow::Error>>(
    r: std::result::Result<S, E>,
    progress: ProgressLine,
    session: Session,
    text: fn(&S) -> String,
    json: bool,
) -> Result<String> {
    progress.finish().await;
    let r = r.map_err(Into::into)?;
    session.close().await;
    Ok(if json {
        serde_json::to_string(&r).unwrap_or_default() + "\n"
    } else {
        text(&r)
    })
}
