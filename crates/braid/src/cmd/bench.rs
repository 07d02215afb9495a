//! `braid bench`: a traffic generator (`send`) and sink (`sink`) over braid channels,
//! without a TUN device and without privileges, plus a raw-UDP pair (`udp-send`,
//! `udp-sink`) with the same payload and report, as the baseline.
//!
//! Each data payload starts with a one-byte type (1), a sequence number (u64) and the
//! sender's wall-clock send time in nanoseconds (u64), big-endian, padded to the chosen
//! size. The end of a run is announced by a type-2 message carrying the count of data
//! messages sent (sent five times). The sink reports goodput, loss, out-of-order
//! arrivals, duplicates and one-way latency (meaningful when both ends share a clock,
//! e.g. on one host or in network namespaces of one host).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use braid_io::{ChannelConfig, FileConfig, Session, SessionConfig, SessionStats};
use braid_proto::units;
use bytes::Bytes;
use serde::Serialize;
use tokio::net::UdpSocket;
use tracing::info;

use super::tunnel::{init_tracing, parse_timeout, runtime, shutdown_signal};

const TYPE_DATA: u8 = 1;
const TYPE_END: u8 = 2;
const HEADER: usize = 17;

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

#[derive(clap::Args, Debug)]
struct SessionArgs {
    /// Configuration file with [session] and [[channel]] (a [tunnel] section is ignored).
    #[arg(long)]
    config: Option<PathBuf>,
    /// A channel as LOCAL_ADDR,REMOTE_ADDR (repeat for each channel, same order at both ends).
    #[arg(long = "channel", value_name = "LOCAL,REMOTE")]
    channels: Vec<String>,
    /// File with the pre-shared key (when not using --config): 32 random bytes, base64
    /// or raw, not readable by others (`braid genkey > k && chmod 600 k`). A file, not
    /// the key itself, so the key does not show in the process list.
    #[arg(long, value_name = "FILE")]
    key_file: Option<PathBuf>,
    /// Receiver mode: logical, seq, trr or none.
    #[arg(long)]
    mode: Option<String>,
    /// Scheduler: srr, rr or grr.
    #[arg(long)]
    scheduler: Option<String>,
    /// Channel weights, comma-separated (relative capacities).
    #[arg(long)]
    weights: Option<String>,
    /// Heartbeat interval (e.g. 50ms).
    #[arg(long)]
    heartbeat: Option<String>,
    /// Declare a channel down after this long without traffic (e.g. 300ms).
    #[arg(long)]
    dead_after: Option<String>,
    /// Control socket for `braid status`.
    #[arg(long)]
    control: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long)]
    metrics: Option<SocketAddr>,
    /// Give up if the peer has not answered within this time.
    #[arg(long, default_value = "10s")]
    peer_timeout: String,
    /// Log a one-line summary this often (0s: never).
    #[arg(long, default_value = "0s")]
    log_interval: String,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
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
    let mut cfg = match (&a.config, a.channels.is_empty()) {
        (Some(_), false) => bail!("give either --config or --channel, not both"),
        (Some(p), true) => FileConfig::load(p)?.session,
        (None, true) => {
            bail!("no channels: give --config FILE or --channel LOCAL,REMOTE (one per channel)")
        }
        (None, false) => {
            let mut chans = Vec::new();
            for (i, c) in a.channels.iter().enumerate() {
                let (l, r) = c
                    .split_once(',')
                    .ok_or_else(|| anyhow!("--channel '{c}': expected LOCAL,REMOTE"))?;
                let local = l
                    .trim()
                    .parse()
                    .map_err(|_| anyhow!("--channel '{c}': '{l}' is not an IP:PORT address"))?;
                let remote = r
                    .trim()
                    .parse()
                    .map_err(|_| anyhow!("--channel '{c}': '{r}' is not an IP:PORT address"))?;
                chans.push(ChannelConfig::new(format!("ch{i}"), local, remote));
            }
            let file = a.key_file.as_ref().ok_or_else(|| {
                anyhow!("--key-file is required with --channel (both ends use the same key)")
            })?;
            let key = braid_io::keys::read_file(file).context("--key-file")?;
            SessionConfig::new(chans, key.to_vec())
        }
    };
    if let Some(m) = &a.mode {
        cfg.mode = units::parse_mode(m).context("--mode")?;
    }
    if let Some(s) = &a.scheduler {
        cfg.scheduler = units::parse_scheduler(s).context("--scheduler")?;
    }
    if let Some(w) = &a.weights {
        let ws: Vec<u32> = w
            .split(',')
            .map(|x| {
                x.trim()
                    .parse::<u32>()
                    .map_err(|_| anyhow!("--weights: '{x}' is not a whole number"))
            })
            .collect::<Result<_>>()?;
        if ws.len() != cfg.channels.len() {
            bail!(
                "--weights: {} weights for {} channels",
                ws.len(),
                cfg.channels.len()
            );
        }
        for (c, w) in cfg.channels.iter_mut().zip(ws) {
            c.weight = w;
        }
    }
    if let Some(h) = &a.heartbeat {
        cfg.heartbeat = units::parse_duration(h).context("--heartbeat")?;
    }
    if let Some(d) = &a.dead_after {
        cfg.dead_after = units::parse_duration(d).context("--dead-after")?;
    }
    cfg.validate()
        .map_err(|e| anyhow!("session configuration: {e}"))?;
    Ok(cfg)
}

fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// A `--rate` in bit/s (braid's one rate parser: `50M`, `100mbit`, ...).
fn parse_rate(s: &str) -> Result<f64> {
    Ok(units::parse_rate(s).context("--rate")? as f64)
}

/// The traffic pattern, resolved.
struct Pattern {
    sizes: Vec<usize>,
    count: Option<u64>,
    duration: Option<Duration>,
    interval: Option<Duration>,
}

impl Pattern {
    fn new(t: &Traffic, max: usize) -> Result<Pattern> {
        let sizes: Vec<usize> = t
            .size
            .split(',')
            .map(|x| {
                x.trim()
                    .parse::<usize>()
                    .map_err(|_| anyhow!("--size: '{x}' is not a whole number"))
            })
            .collect::<Result<_>>()?;
        for &s in &sizes {
            if s < HEADER {
                bail!("--size: {s} is below the {HEADER}-byte bench header");
            }
            if s > max {
                bail!("--size: {s} bytes does not fit: the largest message is {max} bytes");
            }
        }
        let duration = match (&t.duration, t.count) {
            (Some(d), _) => Some(units::parse_duration(d).context("--duration")?),
            (None, None) => Some(Duration::from_secs(5)),
            (None, Some(_)) => None,
        };
        let mean = sizes.iter().sum::<usize>() as f64 / sizes.len() as f64;
        let pps = match (&t.rate, t.pps) {
            (Some(_), Some(_)) => bail!("give --rate or --pps, not both"),
            (Some(r), None) => Some(parse_rate(r)? / (mean * 8.0)),
            (None, Some(p)) if p > 0.0 => Some(p),
            (None, Some(_)) => bail!("--pps: must be above zero"),
            (None, None) => None,
        };
        Ok(Pattern {
            sizes,
            count: t.count,
            duration,
            interval: pps.map(|p| Duration::from_secs_f64(1.0 / p)),
        })
    }

    /// Run the pattern, calling `emit` for each message; returns (messages, bytes, elapsed).
    async fn run<F, Fut>(&self, mut emit: F) -> Result<(u64, u64, Duration)>
    where
        F: FnMut(Bytes) -> Fut,
        Fut: std::future::Future<Output = Result<()>>,
    {
        let start = Instant::now();
        let mut buf = vec![0u8; *self.sizes.iter().max().unwrap_or(&HEADER)];
        let (mut n, mut bytes) = (0u64, 0u64);
        let stop = tokio::time::sleep(self.duration.unwrap_or(Duration::from_secs(u64::MAX / 4)));
        tokio::pin!(stop);
        let sig = shutdown_signal();
        tokio::pin!(sig);
        loop {
            if self.count.is_some_and(|c| n >= c) {
                break;
            }
            if n % 64 == 0 {
                // Check the clock and signals without a syscall per message.
                tokio::select! {
                    biased;
                    _ = &mut stop => break,
                    _ = &mut sig => break,
                    _ = std::future::ready(()) => {}
                }
            }
            if let Some(iv) = self.interval {
                let due = start + iv.mul_f64(n as f64);
                let now = Instant::now();
                if due > now + Duration::from_millis(1) {
                    tokio::time::sleep(due - now).await;
                }
            }
            let size = self.sizes[(n % self.sizes.len() as u64) as usize];
            buf[0] = TYPE_DATA;
            buf[1..9].copy_from_slice(&n.to_be_bytes());
            buf[9..17].copy_from_slice(&wall_ns().to_be_bytes());
            emit(Bytes::copy_from_slice(&buf[..size])).await?;
            n += 1;
            bytes += size as u64;
        }
        Ok((n, bytes, start.elapsed()))
    }
}

fn end_message(count: u64) -> Bytes {
    let mut v = vec![TYPE_END; HEADER];
    v[1..9].copy_from_slice(&count.to_be_bytes());
    v[9..17].copy_from_slice(&wall_ns().to_be_bytes());
    Bytes::from(v)
}

#[derive(Serialize)]
struct SendReport {
    role: &'static str,
    packets: u64,
    bytes: u64,
    duration_s: f64,
    offered_bps: f64,
    offered_pps: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<SessionStats>,
}

impl SendReport {
    fn print(&self, json: bool) {
        if json {
            println!("{}", serde_json::to_string_pretty(self).unwrap_or_default());
        } else {
            println!(
                "sent {} messages, {} bytes in {:.3} s: {:.1} Mbit/s, {:.1} kpps offered",
                self.packets,
                self.bytes,
                self.duration_s,
                self.offered_bps / 1e6,
                self.offered_pps / 1e3
            );
            if let Some(s) = &self.session {
                print!("{}", s.table());
            }
        }
    }
}

async fn start_session(
    a: &SessionArgs,
) -> Result<(Session, Option<braid_io::observe::ControlServer>)> {
    let cfg = session_config(a)?;
    let session = Session::start(cfg).await?;
    let observers = braid_io::tunnel::Observers {
        control: a.control.clone(),
        metrics: a.metrics,
        log_interval: parse_timeout(&a.log_interval, "--log-interval")?.unwrap_or_default(),
    };
    let ctl = braid_io::tunnel::start_observers(&observers, session.stats_handle()).await?;
    Ok((session, ctl))
}

async fn send(a: SendArgs) -> Result<()> {
    let (mut session, _ctl) = start_session(&a.s).await?;
    let timeout = parse_timeout(&a.s.peer_timeout, "--peer-timeout")?
        .unwrap_or(Duration::from_secs(u64::MAX / 4));
    session.wait_for_peer(timeout).await?;
    let sender = session.sender();
    let pattern = Pattern::new(&a.t, sender.max_message().saturating_sub(1))?;
    info!("peer answered; sending");
    let (n, bytes, elapsed) = pattern
        .run(|m| {
            let s = sender.clone();
            async move { s.send(m).await.map_err(anyhow::Error::from) }
        })
        .await?;
    for _ in 0..5 {
        sender.send(end_message(n)).await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let markers and idle flushes go out.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stats = session.stats().await.ok();
    session.close().await;
    let secs = elapsed.as_secs_f64().max(1e-9);
    SendReport {
        role: "send",
        packets: n,
        bytes,
        duration_s: secs,
        offered_bps: bytes as f64 * 8.0 / secs,
        offered_pps: n as f64 / secs,
        session: stats,
    }
    .print(a.s.json);
    Ok(())
}

/// Sink-side accounting.
#[derive(Default)]
struct Acc {
    first: Option<Instant>,
    last: Option<Instant>,
    packets: u64,
    bytes: u64,
    highest: Option<u64>,
    out_of_order: u64,
    duplicates: u64,
    seen: Vec<u64>,
    latency_ns: Vec<u64>,
    end_count: Option<u64>,
    malformed: u64,
}

#[derive(Serialize)]
struct Latency {
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
}

#[derive(Serialize)]
struct SinkReport {
    role: &'static str,
    packets: u64,
    bytes: u64,
    expected: u64,
    lost: u64,
    loss_ratio: f64,
    out_of_order: u64,
    duplicates: u64,
    malformed: u64,
    duration_s: f64,
    goodput_bps: f64,
    pps: f64,
    end_seen: bool,
    latency_us: Option<Latency>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<SessionStats>,
}

impl Acc {
    /// Account one message; true once the end message has arrived.
    fn on_msg(&mut self, m: &[u8], now: Instant) -> bool {
        if m.len() < HEADER {
            self.malformed += 1;
            return false;
        }
        let seq = u64::from_be_bytes(m[1..9].try_into().expect("8 bytes"));
        match m[0] {
            TYPE_END => {
                self.end_count = Some(seq);
                return true;
            }
            TYPE_DATA => {}
            _ => {
                self.malformed += 1;
                return false;
            }
        }
        let (w, b) = ((seq / 64) as usize, seq % 64);
        if w >= self.seen.len() {
            if w > 1 << 26 {
                self.malformed += 1;
                return false;
            }
            self.seen.resize(w + 1, 0);
        }
        if self.seen[w] & (1 << b) != 0 {
            self.duplicates += 1;
            return false;
        }
        self.seen[w] |= 1 << b;
        self.first.get_or_insert(now);
        self.last = Some(now);
        self.packets += 1;
        self.bytes += m.len() as u64;
        match self.highest {
            Some(h) if seq < h => self.out_of_order += 1,
            _ => self.highest = Some(seq),
        }
        if self.latency_ns.len() < 4_000_000 {
            let sent = u64::from_be_bytes(m[9..17].try_into().expect("8 bytes"));
            self.latency_ns.push(wall_ns().saturating_sub(sent));
        }
        false
    }

    fn report(mut self, session: Option<SessionStats>) -> SinkReport {
        let expected = self
            .end_count
            .unwrap_or_else(|| self.highest.map_or(0, |h| h + 1));
        let lost = expected.saturating_sub(self.packets);
        let dur = match (self.first, self.last) {
            (Some(f), Some(l)) => (l - f).as_secs_f64(),
            _ => 0.0,
        };
        let latency_us = if self.latency_ns.is_empty() {
            None
        } else {
            self.latency_ns.sort_unstable();
            let q = |p: f64| {
                let i = ((self.latency_ns.len() - 1) as f64 * p).round() as usize;
                self.latency_ns[i] as f64 / 1e3
            };
            Some(Latency {
                p50: q(0.5),
                p90: q(0.9),
                p99: q(0.99),
                max: q(1.0),
            })
        };
        let d = dur.max(1e-9);
        SinkReport {
            role: "sink",
            packets: self.packets,
            bytes: self.bytes,
            expected,
            lost,
            loss_ratio: if expected == 0 {
                0.0
            } else {
                lost as f64 / expected as f64
            },
            out_of_order: self.out_of_order,
            duplicates: self.duplicates,
            malformed: self.malformed,
            duration_s: dur,
            goodput_bps: if dur > 0.0 {
                self.bytes as f64 * 8.0 / d
            } else {
                0.0
            },
            pps: if dur > 0.0 {
                self.packets as f64 / d
            } else {
                0.0
            },
            end_seen: self.end_count.is_some(),
            latency_us,
            session,
        }
    }
}

impl SinkReport {
    fn print(&self, json: bool) {
        if json {
            println!("{}", serde_json::to_string_pretty(self).unwrap_or_default());
            return;
        }
        println!(
            "{:<14} {:>12} {:>10} {:>8} {:>10} {:>8} {:>12} {:>10} {:>9} {:>9} {:>9}",
            "",
            "packets",
            "lost",
            "loss %",
            "out-order",
            "dups",
            "goodput",
            "kpps",
            "lat p50",
            "lat p99",
            "lat max"
        );
        let (p50, p99, max) = self
            .latency_us
            .as_ref()
            .map_or((f64::NAN, f64::NAN, f64::NAN), |l| (l.p50, l.p99, l.max));
        println!(
            "{:<14} {:>12} {:>10} {:>8.3} {:>10} {:>8} {:>7.1} Mb/s {:>10.1} {:>7.0}us {:>7.0}us {:>7.0}us",
            "received",
            self.packets,
            self.lost,
            self.loss_ratio * 100.0,
            self.out_of_order,
            self.duplicates,
            self.goodput_bps / 1e6,
            self.pps / 1e3,
            p50,
            p99,
            max
        );
        if !self.end_seen {
            println!(
                "(no end-of-run message seen: expected count is the highest sequence number + 1)"
            );
        }
        if let Some(s) = &self.session {
            print!("{}", s.table());
        }
    }
}

fn stop_after(s: &str) -> Result<Duration> {
    Ok(parse_timeout(s, "--max-duration")?.unwrap_or(Duration::from_secs(u64::MAX / 4)))
}

async fn sink(a: SinkArgs) -> Result<()> {
    let (mut session, _ctl) = start_session(&a.s).await?;
    let idle = units::parse_duration(&a.idle).context("--idle")?;
    let deadline = tokio::time::Instant::now() + stop_after(&a.max_duration)?;
    let timeout = parse_timeout(&a.s.peer_timeout, "--peer-timeout")?
        .unwrap_or(Duration::from_secs(u64::MAX / 4));
    session.wait_for_peer(timeout).await?;
    info!("peer answered; receiving");
    let mut acc = Acc::default();
    let sig = shutdown_signal();
    tokio::pin!(sig);
    loop {
        let wait = if acc.first.is_some() { idle } else { timeout };
        tokio::select! {
            m = tokio::time::timeout(wait, session.recv()) => match m {
                Ok(Some(m)) => {
                    if acc.on_msg(&m, Instant::now()) {
                        break;
                    }
                }
                Ok(None) => break,
                Err(_) => break,
            },
            _ = tokio::time::sleep_until(deadline) => break,
            _ = &mut sig => break,
        }
    }
    let stats = session.stats().await.ok();
    session.close().await;
    acc.report(stats).print(a.s.json);
    Ok(())
}

async fn udp_send(a: UdpSendArgs) -> Result<()> {
    let sock = UdpSocket::bind(a.bind)
        .await
        .with_context(|| format!("cannot bind {}", a.bind))?;
    sock.connect(a.to)
        .await
        .with_context(|| format!("cannot aim at {}", a.to))?;
    let pattern = Pattern::new(&a.t, 65507)?;
    let sock = std::sync::Arc::new(sock);
    let (n, bytes, elapsed) = pattern
        .run(|m| {
            let s = sock.clone();
            async move {
                // The peer's socket may not exist yet (ICMP refusals): not fatal.
                let _ = s.send(&m).await;
                Ok(())
            }
        })
        .await?;
    for _ in 0..5 {
        let _ = sock.send(&end_message(n)).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs = elapsed.as_secs_f64().max(1e-9);
    SendReport {
        role: "udp-send",
        packets: n,
        bytes,
        duration_s: secs,
        offered_bps: bytes as f64 * 8.0 / secs,
        offered_pps: n as f64 / secs,
        session: None,
    }
    .print(a.json);
    Ok(())
}

async fn udp_sink(a: UdpSinkArgs) -> Result<()> {
    let sock = {
        use socket2::{Domain, Protocol, Socket, Type};
        let s = Socket::new(
            Domain::for_address(a.bind),
            Type::DGRAM,
            Some(Protocol::UDP),
        )?;
        let _ = s.set_recv_buffer_size(4 << 20);
        s.set_nonblocking(true)?;
        s.bind(&a.bind.into())
            .with_context(|| format!("cannot bind {}", a.bind))?;
        UdpSocket::from_std(s.into())?
    };
    let idle = units::parse_duration(&a.idle).context("--idle")?;
    let deadline = tokio::time::Instant::now() + stop_after(&a.max_duration)?;
    let mut acc = Acc::default();
    let mut buf = vec![0u8; 65536];
    let sig = shutdown_signal();
    tokio::pin!(sig);
    loop {
        let wait = if acc.first.is_some() {
            idle
        } else {
            Duration::from_secs(u64::MAX / 4)
        };
        tokio::select! {
            r = tokio::time::timeout(wait, sock.recv(&mut buf)) => match r {
                Ok(Ok(n)) => {
                    if acc.on_msg(&buf[..n], Instant::now()) {
                        break;
                    }
                }
                Ok(Err(_)) => continue,
                Err(_) => break,
            },
            _ = tokio::time::sleep_until(deadline) => break,
            _ = &mut sig => break,
        }
    }
    let mut r = acc.report(None);
    r.role = "udp-sink";
    r.print(a.json);
    Ok(())
}
