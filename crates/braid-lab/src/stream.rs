//! `braid lab stream`: a live-video-like stream over the emulated links, in one run:
//!
//! 1. braid (`braid send --live` / `braid recv --live`) over every link, once per
//!    tolerance (W, E, B), e.g. (100,0,0) and (100,1,1);
//! 2. SRT (`srt-live-transmit`, caller to listener) over the best single link (the
//!    fastest; of equal rates, the shortest delay), with its latency set as SRT's guide
//!    recommends: a multiple (default 4) of that link's measured round trip.
//!
//! The same generator and sink serve both. The generator ([`generate`], `braid lab
//! stream-gen`) sends a constant bit rate of fixed-size records; each record starts with
//! a magic, its sequence number and its send time (wall clock, microseconds; the lab's
//! namespaces share one clock, so one-way latency needs no synchronisation). For braid
//! it writes the records to a pipe into `braid send -` (which puts exactly one record
//! in each packet in live mode); for SRT it sends each as one UDP datagram into
//! `srt-live-transmit`, as a live encoder would. The sink ([`sink`], `braid lab
//! stream-sink`) reads records from `braid recv -` through a pipe or as UDP datagrams
//! from the receiving `srt-live-transmit`, and notes per record the latency at the
//! moment it could be played: send time to arrival at the sink, pipes and both
//! programs' buffers included. From that the lab computes delivered % (distinct records
//! received / records sent), latency quantiles, duplicates, records out of order.
//!
//! Retransmission overhead is packets sent again / distinct data packets sent, from
//! each protocol's own sender counters (braid's summary, SRT's `-statspf json`
//! statistics). The emulator's counters add, per run, the packets its loss process
//! dropped on the links the run used (the loss each protocol had to deal with).
//!
//! The lab is built before and removed after, also when a step fails.

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use braid_sim::plot::{Format, PixelText};
use plotters::prelude::*;
use serde_json::{json, Value};

use crate::spec::LinkSpec;
use crate::tools::{self, Tool};
use crate::topo::{self, client_addr, server_addr, LabError, NS_CLIENT, NS_SERVER};

/// The first bytes of every record.
pub const MAGIC: [u8; 4] = *b"BRS1";
/// Magic, sequence number (8 bytes), send time in µs (8 bytes).
pub const HEADER_LEN: usize = 20;
/// Largest record (one UDP datagram).
pub const MAX_RECORD: usize = 65_507;

/// `srt-live-transmit`, for the SRT run.
pub const SRT: Tool = Tool {
    cmd: "srt-live-transmit",
    package: "srt-tools",
};

/// Microseconds since the Unix epoch.
pub fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Fill the header of `rec` (at least [`HEADER_LEN`] bytes).
pub fn stamp(rec: &mut [u8], seq: u64, sent_us: u64) {
    rec[..4].copy_from_slice(&MAGIC);
    rec[4..12].copy_from_slice(&seq.to_be_bytes());
    rec[12..20].copy_from_slice(&sent_us.to_be_bytes());
}

/// Sequence number and send time of a record, if it starts with the magic.
pub fn parse(rec: &[u8]) -> Option<(u64, u64)> {
    if rec.len() < HEADER_LEN || rec[..4] != MAGIC {
        return None;
    }
    let seq = u64::from_be_bytes(rec[4..12].try_into().ok()?);
    let sent = u64::from_be_bytes(rec[12..20].try_into().ok()?);
    Some((seq, sent))
}

/// Where the generator writes or the sink reads: standard output/input, or UDP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// Standard output (generator) or input (sink).
    Stdio,
    /// UDP: the generator sends to it, the sink binds it.
    Udp(SocketAddr),
}

impl Endpoint {
    /// `-` or `IP:PORT`.
    pub fn parse(s: &str) -> Result<Endpoint, String> {
        if s == "-" {
            return Ok(Endpoint::Stdio);
        }
        s.parse()
            .map(Endpoint::Udp)
            .map_err(|_| format!("'{s}': expected - (standard input/output) or IP:PORT"))
    }
}

/// Check a record size.
pub fn check_size(size: usize) -> Result<(), String> {
    if !(HEADER_LEN..=MAX_RECORD).contains(&size) {
        return Err(format!(
            "record size {size}: must be {HEADER_LEN} to {MAX_RECORD} bytes"
        ));
    }
    Ok(())
}

/// What the generator did.
#[derive(Clone, Debug, PartialEq)]
pub struct GenReport {
    /// Records sent.
    pub records: u64,
    /// Bytes sent.
    pub bytes: u64,
    /// From the first record to the last.
    pub duration_s: f64,
    /// Most a record left after its scheduled time, ms (the generator's own stalls).
    pub late_max_ms: f64,
    /// Records that left more than 10 ms after their scheduled time.
    pub late_over_10ms: u64,
}

impl GenReport {
    /// As JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "records": self.records, "bytes": self.bytes, "duration_s": self.duration_s,
            "late_max_ms": self.late_max_ms, "late_over_10ms": self.late_over_10ms,
        })
    }
    /// Read back [`GenReport::to_json`].
    pub fn from_json(v: &Value) -> Option<GenReport> {
        Some(GenReport {
            records: v["records"].as_u64()?,
            bytes: v["bytes"].as_u64()?,
            duration_s: v["duration_s"].as_f64()?,
            late_max_ms: v["late_max_ms"].as_f64().unwrap_or(0.0),
            late_over_10ms: v["late_over_10ms"].as_u64().unwrap_or(0),
        })
    }
}

/// Send records of `size` bytes at `rate_bps` for `duration` to `to`. Records leave on
/// an absolute schedule (record k at start + k × interval), so a late wake-up does not
/// slow the stream down, and each is stamped with its scheduled time, when a live
/// encoder would have produced it: time spent blocked on a full pipe (the transport not
/// reading) counts as latency. A write error (the reader went away) ends the run with an
/// error.
pub fn generate(
    rate_bps: u64,
    size: usize,
    duration: Duration,
    to: Endpoint,
) -> Result<GenReport, String> {
    check_size(size)?;
    if rate_bps == 0 {
        return Err("rate must be above 0".into());
    }
    let interval = Duration::from_secs_f64(size as f64 * 8.0 / rate_bps as f64);
    let total = (duration.as_secs_f64() / interval.as_secs_f64()).ceil() as u64;
    let udp = match to {
        Endpoint::Udp(a) => {
            let bind = if a.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
            let s = UdpSocket::bind(bind).map_err(|e| format!("UDP socket: {e}"))?;
            s.connect(a).map_err(|e| format!("UDP to {a}: {e}"))?;
            Some(s)
        }
        Endpoint::Stdio => None,
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut rec = vec![0u8; size];
    for (i, b) in rec.iter_mut().enumerate().skip(HEADER_LEN) {
        *b = (i % 251) as u8;
    }
    let (start, start_us) = (Instant::now(), wall_us());
    let (mut late_max, mut late_over_10ms) = (Duration::ZERO, 0);
    for k in 0..total {
        let offset = interval.mul_f64(k as f64);
        let at = start + offset;
        let now = Instant::now();
        if at > now {
            std::thread::sleep(at - now);
        }
        let late = Instant::now().saturating_duration_since(at);
        late_max = late_max.max(late);
        late_over_10ms += u64::from(late > Duration::from_millis(10));
        stamp(&mut rec, k, start_us + offset.as_micros() as u64);
        match &udp {
            Some(s) => {
                // A full socket buffer or a refused datagram is loss, as for an encoder.
                let _ = s.send(&rec);
            }
            None => {
                out.write_all(&rec)
                    .and_then(|_| out.flush())
                    .map_err(|e| format!("writing record {k}: {e}"))?;
            }
        }
    }
    Ok(GenReport {
        records: total,
        bytes: total * size as u64,
        duration_s: start.elapsed().as_secs_f64(),
        late_max_ms: late_max.as_secs_f64() * 1e3,
        late_over_10ms,
    })
}

/// What the sink saw.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SinkReport {
    /// Records received, duplicates included.
    pub records: u64,
    /// Distinct records.
    pub unique: u64,
    /// Copies of records already received.
    pub duplicates: u64,
    /// Records that arrived after one with a higher sequence number.
    pub reordered: u64,
    /// Reads that were not a record (wrong magic, short datagram, truncated end).
    pub corrupt: u64,
    /// Per distinct record, in arrival order: latency in microseconds.
    pub latency_us: Vec<u64>,
}

impl SinkReport {
    /// As JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "records": self.records, "unique": self.unique, "duplicates": self.duplicates,
            "reordered": self.reordered, "corrupt": self.corrupt, "latency_us": self.latency_us,
        })
    }
    /// Read back [`SinkReport::to_json`].
    pub fn from_json(v: &Value) -> Option<SinkReport> {
        Some(SinkReport {
            records: v["records"].as_u64()?,
            unique: v["unique"].as_u64()?,
            duplicates: v["duplicates"].as_u64()?,
            reordered: v["reordered"].as_u64()?,
            corrupt: v["corrupt"].as_u64()?,
            latency_us: v["latency_us"]
                .as_array()?
                .iter()
                .map(Value::as_u64)
                .collect::<Option<_>>()?,
        })
    }

    fn record(&mut self, rec: &[u8], seen: &mut Vec<bool>, high: &mut Option<u64>) {
        let now = wall_us();
        let Some((seq, sent)) = parse(rec) else {
            self.corrupt += 1;
            return;
        };
        self.records += 1;
        // The sequence space is bounded by what a generator can send in a run; a
        // corrupt number far out is counted, not allocated for.
        if seq > 1 << 28 {
            self.corrupt += 1;
            return;
        }
        let i = seq as usize;
        if seen.len() <= i {
            seen.resize(i + 1, false);
        }
        if seen[i] {
            self.duplicates += 1;
            return;
        }
        seen[i] = true;
        self.unique += 1;
        if high.is_some_and(|h| seq < h) {
            self.reordered += 1;
        }
        *high = Some(high.map_or(seq, |h| h.max(seq)));
        self.latency_us.push(now.saturating_sub(sent));
    }
}

/// Read records of `size` bytes from `from` until the end of standard input, or (UDP)
/// until nothing has come for `idle` after the first record, or for `wait` before it.
pub fn sink(
    size: usize,
    from: Endpoint,
    idle: Duration,
    wait: Duration,
) -> Result<SinkReport, String> {
    check_size(size)?;
    let mut r = SinkReport::default();
    match from {
        Endpoint::Stdio => read_stdin_records(size, &mut r)?,
        Endpoint::Udp(a) => receive_udp_records(a, size, idle, wait, &mut r)?,
    }
    Ok(r)
}

/// The sink on standard input: records of `size` bytes back to back until the end of
/// the input; a partial record at the end counts as corrupt.
fn read_stdin_records(size: usize, r: &mut SinkReport) -> Result<(), String> {
    let (mut seen, mut high) = (Vec::new(), None);
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut rec = vec![0u8; size];
    loop {
        let mut got = 0;
        while got < size {
            match input.read(&mut rec[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("reading standard input: {e}")),
            }
        }
        if got < size {
            r.corrupt += u64::from(got > 0);
            return Ok(());
        }
        r.record(&rec, &mut seen, &mut high);
    }
}

/// The sink on UDP: bind `a` and take each datagram of `size` bytes as a record (any
/// other size is corrupt), until nothing has come for `idle` after the first datagram,
/// or for `wait` before it.
fn receive_udp_records(
    a: SocketAddr,
    size: usize,
    idle: Duration,
    wait: Duration,
    r: &mut SinkReport,
) -> Result<(), String> {
    let (mut seen, mut high) = (Vec::new(), None);
    let s = UdpSocket::bind(a).map_err(|e| format!("binding {a}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_millis(50)))
        .map_err(|e| format!("{a}: {e}"))?;
    let mut buf = vec![0u8; MAX_RECORD + 1];
    let start = Instant::now();
    let mut last: Option<Instant> = None;
    loop {
        match s.recv(&mut buf) {
            Ok(n) if n == size => {
                last = Some(Instant::now());
                r.record(&buf[..n], &mut seen, &mut high);
            }
            Ok(_) => {
                last = Some(Instant::now());
                r.corrupt += 1;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(format!("receiving on {a}: {e}")),
        }
        let quiet = match last {
            Some(t) => t.elapsed() >= idle,
            None => start.elapsed() >= wait,
        };
        if quiet {
            return Ok(());
        }
    }
}

/// Latency quantiles in milliseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Latency {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Maximum.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

/// The value of rank ⌈q·n⌉ (nearest rank) of sorted `v`.
fn nearest_rank(v: &[u64], q: f64) -> u64 {
    let n = v.len();
    let rank = ((n as f64 * q).ceil() as usize).clamp(1, n);
    v[rank - 1]
}

impl Latency {
    /// Quantiles of `us` (microseconds, any order); `None` if empty.
    pub fn of(us: &[u64]) -> Option<Latency> {
        if us.is_empty() {
            return None;
        }
        let mut v = us.to_vec();
        v.sort_unstable();
        let ms = |x: u64| x as f64 / 1e3;
        Some(Latency {
            p50: ms(nearest_rank(&v, 0.5)),
            p99: ms(nearest_rank(&v, 0.99)),
            max: ms(v[v.len() - 1]),
            mean: v.iter().sum::<u64>() as f64 / v.len() as f64 / 1e3,
        })
    }
}

/// The latency distribution as 1001 points: the latency (ms) within which 0 ‰, 1 ‰,
/// …, 1000 ‰ of the delivered records arrived.
pub fn cdf_ms(us: &[u64]) -> Vec<f64> {
    if us.is_empty() {
        return Vec::new();
    }
    let mut v = us.to_vec();
    v.sort_unstable();
    (0..=1000)
        .map(|p| {
            if p == 0 {
                v[0] as f64 / 1e3
            } else {
                nearest_rank(&v, f64::from(p) / 1000.0) as f64 / 1e3
            }
        })
        .collect()
}

/// What to run.
#[derive(Clone, Debug)]
pub struct StreamOptions {
    /// The links.
    pub links: Vec<LinkSpec>,
    /// Length of each stream.
    pub duration: Duration,
    /// Stream rate, bit/s.
    pub rate_bps: u64,
    /// Record (packet payload) size.
    pub size: usize,
    /// braid tolerances, one run each.
    pub tolerances: Vec<[u16; 3]>,
    /// braid's segment deadline (`braid send --deadline`), if any.
    pub deadline: Option<Duration>,
    /// Run SRT too.
    pub srt: bool,
    /// Also run braid with the first tolerance over the best link alone (SRT's path), to
    /// tell the protocol from the paths.
    pub single: bool,
    /// SRT latency; `None`: `srt_rtt_factor` × the best link's round trip.
    pub srt_latency: Option<Duration>,
    /// Multiple of the round trip for SRT's latency.
    pub srt_rtt_factor: f64,
    /// The `braid` binary.
    pub exe: PathBuf,
    /// Emulator seed.
    pub seed: u64,
}

/// One contender's run.
#[derive(Clone, Debug, PartialEq)]
pub struct RunResult {
    /// `braid (100,0,0)` or `SRT, latency 40 ms`.
    pub name: String,
    /// `braid` or `srt`.
    pub kind: String,
    /// The links it used, e.g. `all 3 links` or `link 0 (100mbit/5ms)`.
    pub path: String,
    /// Records the generator sent.
    pub sent: u64,
    /// Distinct records delivered.
    pub delivered: u64,
    /// Copies delivered twice or more.
    pub duplicates: u64,
    /// Records out of order at the sink.
    pub reordered: u64,
    /// Reads at the sink that were not a record.
    pub corrupt: u64,
    /// Latency of the delivered records.
    pub latency: Option<Latency>,
    /// [`cdf_ms`] of the delivered records.
    pub cdf_ms: Vec<f64>,
    /// Data packets sent again (the protocol's own counter).
    pub retransmitted: u64,
    /// Distinct data packets the protocol sent.
    pub data_packets: u64,
    /// Packets the emulator's loss process dropped on the links during the run.
    pub link_drops: u64,
    /// The protocol's own reports (braid's send and recv summaries, SRT's statistics).
    pub detail: Value,
}

impl RunResult {
    /// What the generator (`sent`) and the sink (`got`) measured of run `name` over
    /// `path`; the protocol's own counters zero and no detail, for the caller to fill.
    fn delivery(
        name: String,
        kind: &str,
        path: String,
        sent: &GenReport,
        got: &SinkReport,
    ) -> RunResult {
        RunResult {
            name,
            kind: kind.into(),
            path,
            sent: sent.records,
            delivered: got.unique,
            duplicates: got.duplicates,
            reordered: got.reordered,
            corrupt: got.corrupt,
            latency: Latency::of(&got.latency_us),
            cdf_ms: cdf_ms(&got.latency_us),
            retransmitted: 0,
            data_packets: 0,
            link_drops: 0,
            detail: Value::Null,
        }
    }

    /// Delivered, in % of sent.
    pub fn delivered_pct(&self) -> f64 {
        100.0 * self.delivered as f64 / self.sent.max(1) as f64
    }
    /// Retransmission overhead: packets sent again / distinct data packets sent.
    pub fn overhead(&self) -> f64 {
        self.retransmitted as f64 / self.data_packets.max(1) as f64
    }

    fn to_json(&self) -> Value {
        json!({
            "name": self.name, "kind": self.kind, "path": self.path,
            "sent": self.sent, "delivered": self.delivered,
            "delivered_pct": self.delivered_pct(),
            "duplicates": self.duplicates, "reordered": self.reordered, "corrupt": self.corrupt,
            "latency_ms": self.latency.as_ref().map(|l| json!({"p50": l.p50, "p99": l.p99, "max": l.max, "mean": l.mean})),
            "cdf_ms": self.cdf_ms,
            "retransmitted": self.retransmitted, "data_packets": self.data_packets,
            "retransmission_overhead": self.overhead(),
            "link_drops": self.link_drops,
            "detail": self.detail,
        })
    }

    fn from_json(v: &Value) -> Option<RunResult> {
        let lat = &v["latency_ms"];
        Some(RunResult {
            name: v["name"].as_str()?.into(),
            kind: v["kind"].as_str()?.into(),
            path: v["path"].as_str().unwrap_or_default().into(),
            sent: v["sent"].as_u64()?,
            delivered: v["delivered"].as_u64()?,
            duplicates: v["duplicates"].as_u64().unwrap_or(0),
            reordered: v["reordered"].as_u64().unwrap_or(0),
            corrupt: v["corrupt"].as_u64().unwrap_or(0),
            latency: lat.is_object().then(|| Latency {
                p50: lat["p50"].as_f64().unwrap_or(0.0),
                p99: lat["p99"].as_f64().unwrap_or(0.0),
                max: lat["max"].as_f64().unwrap_or(0.0),
                mean: lat["mean"].as_f64().unwrap_or(0.0),
            }),
            cdf_ms: v["cdf_ms"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_f64).collect())
                .unwrap_or_default(),
            retransmitted: v["retransmitted"].as_u64().unwrap_or(0),
            data_packets: v["data_packets"].as_u64().unwrap_or(0),
            link_drops: v["link_drops"].as_u64().unwrap_or(0),
            detail: v["detail"].clone(),
        })
    }
}

/// A whole run.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamResult {
    /// The links, as given.
    pub links: Vec<String>,
    /// Measured round trip of each link (ping), ms.
    pub rtt_ms: Vec<f64>,
    /// Stream rate, bit/s.
    pub rate_bps: u64,
    /// Record size.
    pub size: usize,
    /// Length of each stream, s.
    pub duration_s: f64,
    /// The contenders, in the order run.
    pub runs: Vec<RunResult>,
}

impl StreamResult {
    /// One JSON object.
    pub fn to_json(&self) -> Value {
        json!({
            "links": self.links,
            "rtt_ms": self.rtt_ms,
            "rate_bps": self.rate_bps,
            "record_bytes": self.size,
            "duration_s": self.duration_s,
            "runs": self.runs.iter().map(RunResult::to_json).collect::<Vec<_>>(),
        })
    }

    /// Read back [`StreamResult::to_json`] (to redraw the table or chart).
    pub fn from_json(v: &Value) -> Option<StreamResult> {
        Some(StreamResult {
            links: v["links"]
                .as_array()?
                .iter()
                .map(|l| l.as_str().map(String::from))
                .collect::<Option<_>>()?,
            rtt_ms: v["rtt_ms"]
                .as_array()?
                .iter()
                .filter_map(Value::as_f64)
                .collect(),
            rate_bps: v["rate_bps"].as_u64()?,
            size: v["record_bytes"].as_u64()? as usize,
            duration_s: v["duration_s"].as_f64()?,
            runs: v["runs"]
                .as_array()?
                .iter()
                .map(RunResult::from_json)
                .collect::<Option<_>>()?,
        })
    }

    /// A readable table.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{:.1} Mbit/s of {}-byte records for {:.0} s over {}; round trips {} ms\n",
            self.rate_bps as f64 / 1e6,
            self.size,
            self.duration_s,
            self.links.join(","),
            self.rtt_ms
                .iter()
                .map(|r| format!("{r:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        s += &format!(
            "{:<28} {:>10} {:>8} {:>8} {:>8} {:>8} {:>6} {:>9}  {}\n",
            "what",
            "delivered",
            "p50 ms",
            "p99 ms",
            "max ms",
            "retrans",
            "dups",
            "link loss",
            "path"
        );
        for r in &self.runs {
            let (p50, p99, max) =
                r.latency
                    .as_ref()
                    .map_or(("-".into(), "-".into(), "-".into()), |l| {
                        (
                            format!("{:.1}", l.p50),
                            format!("{:.1}", l.p99),
                            format!("{:.1}", l.max),
                        )
                    });
            s += &format!(
                "{:<28} {:>9.3}% {:>8} {:>8} {:>8} {:>7.2}% {:>6} {:>9}  {}\n",
                r.name,
                r.delivered_pct(),
                p50,
                p99,
                max,
                100.0 * r.overhead(),
                r.duplicates,
                r.link_drops,
                r.path
            );
        }
        s
    }
}

fn ns_cmd(ns: &str, exe: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(exe).args(args);
    c
}

fn spawn(mut c: Command, what: &str) -> Result<Child, LabError> {
    c.spawn().map_err(|e| LabError::Command {
        cmd: what.into(),
        reason: e.to_string(),
    })
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> LabError + '_ {
    move |err| LabError::Io {
        path: path.display().to_string(),
        err,
    }
}

/// A child that is stopped (SIGTERM, then SIGKILL) when dropped.
struct Proc {
    child: Child,
    what: String,
}

impl Proc {
    fn new(c: Command, what: &str) -> Result<Proc, LabError> {
        Ok(Proc {
            child: spawn(c, what)?,
            what: what.into(),
        })
    }

    /// Wait until it exits or `deadline` passes (then stop it and fail).
    fn wait_until(&mut self, deadline: Instant) -> Result<ExitStatus, LabError> {
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) => return Ok(s),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) => {
                    self.stop();
                    return Err(LabError::Command {
                        cmd: self.what.clone(),
                        reason: "did not finish in time; stopped".into(),
                    });
                }
                Err(e) => {
                    return Err(LabError::Command {
                        cmd: self.what.clone(),
                        reason: e.to_string(),
                    })
                }
            }
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child (`ip netns exec` execs the program, so this
        // is the program itself).
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// SIGINT (srt-live-transmit's clean exit), then SIGTERM, then SIGKILL.
    fn stop(&mut self) {
        for (sig, wait_ms) in [(libc::SIGINT, 1000), (libc::SIGTERM, 1000)] {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            self.signal(sig);
            let until = Instant::now() + Duration::from_millis(wait_ms);
            while Instant::now() < until {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

fn read_json(path: &Path, what: &str) -> Result<Value, LabError> {
    let text = fs::read_to_string(path).map_err(|e| LabError::Command {
        cmd: what.into(),
        reason: format!("no report at {}: {e}", path.display()),
    })?;
    serde_json::from_str(&text).map_err(|e| LabError::Command {
        cmd: what.into(),
        reason: format!("{}: not JSON: {e}", path.display()),
    })
}

/// The last line of `text` that is a JSON object (braid's summary on stderr, after any
/// log lines; SRT's last statistics line).
fn last_json_line(text: &str) -> Option<Value> {
    text.lines()
        .rev()
        .filter(|l| l.trim_start().starts_with('{'))
        .find_map(|l| serde_json::from_str(l).ok())
}

/// Round trip of each link, ms (the mean of 5 pings).
fn ping_rtts(n: usize) -> Result<Vec<f64>, LabError> {
    (0..n)
        .map(|i| {
            let out = topo::run(&[
                "ip",
                "netns",
                "exec",
                NS_CLIENT,
                "ping",
                "-q",
                "-c",
                "5",
                "-i",
                "0.2",
                "-I",
                &client_addr(i),
                &server_addr(i),
            ])?;
            out.lines()
                .find(|l| l.contains("min/avg/max"))
                .and_then(|l| l.split('=').nth(1))
                .and_then(|v| v.trim().split('/').nth(1))
                .and_then(|v| v.parse::<f64>().ok())
                .ok_or_else(|| LabError::Command {
                    cmd: format!("ping over link {i}"),
                    reason: format!("no round trip in: {}", out.trim()),
                })
        })
        .collect()
}

/// Emulator counters: packets dropped by the loss process, per link.
fn link_drops(n: usize) -> Vec<u64> {
    let dir = topo::state_dir();
    (0..n)
        .map(|i| {
            fs::read_to_string(dir.join(format!("emu-{i}.json")))
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .and_then(|v| v["dropped"].as_u64())
                .unwrap_or(0)
        })
        .collect()
}

/// The best single link: the fastest, of equal rates the shortest delay.
pub fn best_link(links: &[LinkSpec]) -> usize {
    let mut best = 0;
    for (i, l) in links.iter().enumerate() {
        let b = &links[best];
        if l.rate_bps > b.rate_bps || (l.rate_bps == b.rate_bps && l.delay < b.delay) {
            best = i;
        }
    }
    best
}

/// Run the whole comparison. `progress` receives one line per step.
pub fn run(opt: &StreamOptions, mut progress: impl FnMut(&str)) -> Result<StreamResult, LabError> {
    check_size(opt.size).map_err(|reason| LabError::Command {
        cmd: "braid lab stream".into(),
        reason,
    })?;
    let mut need = [tools::LAB_UP, &tools::LAB_BENCH[..1]].concat();
    if opt.srt {
        need.push(SRT);
    }
    if let Some(why) = tools::missing(&need) {
        return Err(LabError::MissingTools(why));
    }
    let _ = topo::down();
    topo::up(&opt.links, &opt.exe, opt.seed)?;
    let result = measure(opt, &mut progress);
    let _ = topo::down();
    result
}

fn measure(opt: &StreamOptions, progress: &mut impl FnMut(&str)) -> Result<StreamResult, LabError> {
    let n = opt.links.len();
    let single = opt.single && n > 1;
    let steps = 1 + opt.tolerances.len() + usize::from(opt.srt) + usize::from(single);
    let mut step = 0;
    let t0 = Instant::now();
    let mut say = |what: String, progress: &mut dyn FnMut(&str)| {
        step += 1;
        let at = t0.elapsed().as_secs_f64();
        progress(&format!("[{step}/{steps}, {at:.0} s] {what}"));
    };
    say("round trip of each link (ping)".into(), progress);
    let rtt_ms = ping_rtts(n)?;
    let mut runs = Vec::new();
    for t in &opt.tolerances {
        say(
            format!(
                "braid send/recv --live, tolerance ({},{},{}), over all {n} links",
                t[0], t[1], t[2]
            ),
            progress,
        );
        let all: Vec<usize> = (0..n).collect();
        runs.push(braid_run(opt, *t, &all, &rtt_ms)?);
    }
    let b = best_link(&opt.links);
    if single {
        let t = opt.tolerances[0];
        say(
            format!(
                "braid send/recv --live, tolerance ({},{},{}), over link {b} alone ({})",
                t[0], t[1], t[2], opt.links[b].text
            ),
            progress,
        );
        runs.push(braid_run(opt, t, &[b], &rtt_ms)?);
    }
    if opt.srt {
        let latency_ms = srt_latency_ms(opt, rtt_ms[b]);
        say(
            format!(
                "SRT over link {b} ({}), latency {latency_ms} ms",
                opt.links[b].text
            ),
            progress,
        );
        runs.push(srt_run(opt, b, latency_ms)?);
    }
    Ok(StreamResult {
        links: opt.links.iter().map(|l| l.text.clone()).collect(),
        rtt_ms,
        rate_bps: opt.rate_bps,
        size: opt.size,
        duration_s: opt.duration.as_secs_f64(),
        runs,
    })
}

/// SRT's latency in whole milliseconds (its option's unit), at least 1: the one given,
/// else `srt_rtt_factor` × `rtt_ms`, the round trip of the link SRT uses.
fn srt_latency_ms(opt: &StreamOptions, rtt_ms: f64) -> u64 {
    let latency = opt
        .srt_latency
        .unwrap_or_else(|| Duration::from_secs_f64(rtt_ms * opt.srt_rtt_factor / 1e3));
    (latency.as_secs_f64() * 1e3).ceil().max(1.0) as u64
}

/// `[session]` and `[[channel]]` for one end of `braid send`/`recv`.
fn session_config(links: &[LinkSpec], used: &[usize], end_a: bool) -> String {
    let mut s = String::from(
        "[session]\nmode = \"logical\"\nscheduler = \"srr\"\n\
         key = \"f1njdwrpfIzRyXbWUPz15DmEK5AHdvKw7LmAZC4M6Rw=\"\n\n",
    );
    for &i in used {
        let l = &links[i];
        let (local, remote) = if end_a {
            (client_addr(i), server_addr(i))
        } else {
            (server_addr(i), client_addr(i))
        };
        let port = 7300 + i;
        let weight = (l.rate_bps / 1_000_000).max(1);
        s += &format!(
            "[[channel]]\nname = \"link{i}\"\nlocal = \"{local}:{port}\"\nremote = \"{remote}:{port}\"\nweight = {weight}\nmtu = 1500\n\n"
        );
    }
    s
}

fn gen_args(opt: &StreamOptions, to: &str, report: &Path) -> Vec<String> {
    vec![
        "lab".into(),
        "stream-gen".into(),
        "--rate".into(),
        opt.rate_bps.to_string(),
        "--size".into(),
        opt.size.to_string(),
        "--duration".into(),
        format!("{}ms", opt.duration.as_millis()),
        "--to".into(),
        to.into(),
        "--report".into(),
        report.display().to_string(),
    ]
}

fn sink_args(opt: &StreamOptions, from: &str, report: &Path, wait: Duration) -> Vec<String> {
    vec![
        "lab".into(),
        "stream-sink".into(),
        "--size".into(),
        opt.size.to_string(),
        "--from".into(),
        from.into(),
        "--idle".into(),
        "2s".into(),
        "--wait".into(),
        format!("{}ms", wait.as_millis()),
        "--report".into(),
        report.display().to_string(),
    ]
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// braid with tolerance `t` over the links `used`.
fn braid_run(
    opt: &StreamOptions,
    t: [u16; 3],
    used: &[usize],
    rtt_ms: &[f64],
) -> Result<RunResult, LabError> {
    let tag = format!("{}-{}-{}-{}", t[0], t[1], t[2], used.len());
    let f = BraidFiles::new(opt, used, &tag)?;
    // errctl's round trip: the slowest link's, since a packet and its repair request
    // may each take any link.
    let rtt = used.iter().map(|&i| rtt_ms[i]).fold(1.0, f64::max);
    let drops_before = link_drops(opt.links.len());
    let tol = format!("{},{},{}", t[0], t[1], t[2]);
    let mut procs = start_braid_stream(opt, &f, &tol, rtt)?;
    procs.wait(opt, &f, &tol)?;
    let (sent, got) = read_reports(&f.gen_report, &f.sink_report)?;
    let send_sum = json_summary(&f.send_log, "braid send")?;
    let recv_sum = json_summary(&f.recv_log, "braid recv")?;
    let drops = link_drops_since(&drops_before);
    let (name, path) = braid_run_name(opt, &tol, used);
    Ok(RunResult {
        retransmitted: send_sum["retransmissions"].as_u64().unwrap_or(0),
        data_packets: send_sum["packets"].as_u64().unwrap_or(0),
        link_drops: drops,
        detail: json!({"send": send_sum, "recv": recv_sum, "generator": sent.to_json()}),
        ..RunResult::delivery(name, "braid", path, &sent, &got)
    })
}

/// The processes of one braid run, stopped when dropped in field order: the generator,
/// `braid send`, the sink, `braid recv`.
struct BraidStream {
    gen: Proc,
    send: Proc,
    sink: Proc,
    recv: Proc,
}

/// Start a braid run: the receiving end (`braid recv` into the sink), then `braid send`
/// reading a pipe, then, once the session is up, the generator writing into that pipe.
fn start_braid_stream(
    opt: &StreamOptions,
    f: &BraidFiles,
    tol: &str,
    rtt: f64,
) -> Result<BraidStream, LabError> {
    let (recv, sink) = start_braid_receiver(opt, f)?;
    let (pipe_out, pipe_in) = std::io::pipe().map_err(|e| LabError::Command {
        cmd: "pipe".into(),
        reason: e.to_string(),
    })?;
    let send = start_braid_sender(opt, f, tol, rtt, pipe_out)?;
    // The stream starts once the session is up (a few round trips; the slowest link's
    // is at most a few hundred ms here), as a live source joins a running transport.
    std::thread::sleep(Duration::from_millis(1500));
    let mut gen = ns_cmd(
        NS_CLIENT,
        &opt.exe,
        &refs(&gen_args(opt, "-", &f.gen_report)),
    );
    gen.stdin(Stdio::null())
        .stdout(Stdio::from(pipe_in))
        .stderr(Stdio::inherit());
    let gen = Proc::new(gen, "braid lab stream-gen")?;
    Ok(BraidStream {
        gen,
        send,
        sink,
        recv,
    })
}

impl BraidStream {
    /// Wait for all four to end (at most the stream's length plus 40 s); an error names
    /// the first that failed, with the tail of its log (`braid send`, `braid recv`).
    fn wait(&mut self, opt: &StreamOptions, f: &BraidFiles, tol: &str) -> Result<(), LabError> {
        let until = Instant::now() + opt.duration + Duration::from_secs(40);
        let gs = self.gen.wait_until(until)?;
        let ss = self.send.wait_until(until)?;
        let rs = self.recv.wait_until(until)?;
        let ks = self.sink.wait_until(until)?;
        for (ok, what, log) in [
            (ss.success(), "braid send", Some(&f.send_log)),
            (rs.success(), "braid recv", Some(&f.recv_log)),
            (gs.success(), "braid lab stream-gen", None),
            (ks.success(), "braid lab stream-sink", None),
        ] {
            if !ok {
                return Err(LabError::Command {
                    cmd: format!("{what} (tolerance {tol})"),
                    reason: log.map_or("failed (see above)".into(), |l| log_tail(l)),
                });
            }
        }
        Ok(())
    }
}

/// The JSON summary `what` (`braid send` or `recv`) wrote last to its log `p`.
fn json_summary(p: &Path, what: &str) -> Result<Value, LabError> {
    last_json_line(&fs::read_to_string(p).unwrap_or_default()).ok_or_else(|| LabError::Command {
        cmd: what.into(),
        reason: format!("no JSON summary: {}", log_tail(p)),
    })
}

/// Packets the emulator's loss process dropped, over all links, since it counted
/// `before` (from [`link_drops`]). Waits 1.2 s first for the emulator to write its
/// counters (once a second).
fn link_drops_since(before: &[u64]) -> u64 {
    std::thread::sleep(Duration::from_millis(1200));
    link_drops(before.len())
        .iter()
        .zip(before)
        .map(|(a, b)| a.saturating_sub(*b))
        .sum()
}

/// The last five lines of a log, joined, for an error.
fn log_tail(p: &Path) -> String {
    let t = fs::read_to_string(p).unwrap_or_default();
    t.lines().rev().take(5).collect::<Vec<_>>().join(" / ")
}

/// The files of one braid run, in the state directory: the two ends' configurations
/// (written here), the generator's and sink's reports, the send and recv logs.
struct BraidFiles {
    cfg_a: PathBuf,
    cfg_b: PathBuf,
    gen_report: PathBuf,
    sink_report: PathBuf,
    send_log: PathBuf,
    recv_log: PathBuf,
}

impl BraidFiles {
    fn new(opt: &StreamOptions, used: &[usize], tag: &str) -> Result<BraidFiles, LabError> {
        let dir = topo::state_dir();
        let mut cfgs = Vec::new();
        for (end_a, side) in [(true, "a"), (false, "b")] {
            let p = dir.join(format!("stream-{side}-{tag}.toml"));
            crate::topo::write_private(&p, &session_config(&opt.links, used, end_a))
                .map_err(io_err(&p))?;
            cfgs.push(p);
        }
        let cfg_b = cfgs.pop().expect("two");
        let cfg_a = cfgs.pop().expect("two");
        Ok(BraidFiles {
            cfg_a,
            cfg_b,
            gen_report: dir.join(format!("stream-gen-{tag}.json")),
            sink_report: dir.join(format!("stream-sink-{tag}.json")),
            send_log: dir.join(format!("stream-send-{tag}.log")),
            recv_log: dir.join(format!("stream-recv-{tag}.log")),
        })
    }
}

/// In the server's namespace: `braid recv --live` piped into the stream sink.
fn start_braid_receiver(opt: &StreamOptions, f: &BraidFiles) -> Result<(Proc, Proc), LabError> {
    let file = |p: &Path| fs::File::create(p).map_err(io_err(p));
    let mut recv = ns_cmd(
        NS_SERVER,
        &opt.exe,
        &[
            "recv",
            "-",
            "--live",
            "--json",
            "--peer-timeout",
            "20s",
            "--config",
            &f.cfg_b.display().to_string(),
        ],
    );
    recv.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(file(&f.recv_log)?);
    let mut recv = Proc::new(recv, "braid recv")?;
    let recv_out = recv.child.stdout.take().expect("piped");
    let wait = opt.duration + Duration::from_secs(30);
    let mut sink = ns_cmd(
        NS_SERVER,
        &opt.exe,
        &refs(&sink_args(opt, "-", &f.sink_report, wait)),
    );
    sink.stdin(Stdio::from(recv_out))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let sink = Proc::new(sink, "braid lab stream-sink")?;
    Ok((recv, sink))
}

/// In the client's namespace: `braid send --live` of what comes through `input`, with
/// tolerance `tol` and round trip `rtt_ms`.
fn start_braid_sender(
    opt: &StreamOptions,
    f: &BraidFiles,
    tol: &str,
    rtt_ms: f64,
    input: std::io::PipeReader,
) -> Result<Proc, LabError> {
    let rtt_arg = format!("{}ms", rtt_ms.ceil() as u64);
    let chunk = opt.size.to_string();
    let mut send_args = vec![
        "send",
        "-",
        "--live",
        "--json",
        "--chunk",
        &chunk,
        "--tolerance",
        tol,
        "--rtt",
        &rtt_arg,
        "--peer-timeout",
        "20s",
    ];
    let deadline_arg = opt.deadline.map(|d| format!("{}ms", d.as_millis()));
    if let Some(d) = &deadline_arg {
        send_args.extend(["--deadline", d]);
    }
    let cfg_a = f.cfg_a.display().to_string();
    send_args.extend(["--config", &cfg_a]);
    let mut send = ns_cmd(NS_CLIENT, &opt.exe, &send_args);
    send.stdin(Stdio::from(input))
        .stdout(Stdio::null())
        .stderr(fs::File::create(&f.send_log).map_err(io_err(&f.send_log))?);
    Proc::new(send, "braid send")
}

/// A braid run's name and the links it used, for the table.
fn braid_run_name(opt: &StreamOptions, tol: &str, used: &[usize]) -> (String, String) {
    match used {
        [i] => (
            format!("braid ({tol}), 1 link"),
            format!("link {i} ({})", opt.links[*i].text),
        ),
        _ if used.len() == opt.links.len() => (
            format!("braid ({tol})"),
            format!("all {} links", used.len()),
        ),
        _ => (format!("braid ({tol})"), format!("links {used:?}")),
    }
}

/// SRT with latency `latency_ms` over link `b`: the sink, both srt-live-transmit ends,
/// then the generator; the counters from the caller's (sender's) last statistics.
fn srt_run(opt: &StreamOptions, b: usize, latency_ms: u64) -> Result<RunResult, LabError> {
    let dir = topo::state_dir();
    let gen_report = dir.join("stream-gen-srt.json");
    let sink_report = dir.join("stream-sink-srt.json");
    let stats_tx = dir.join("srt-send-stats.json");
    let stats_rx = dir.join("srt-recv-stats.json");
    let drops_before = link_drops(opt.links.len());
    let wait = opt.duration + Duration::from_secs(30);
    let sink_argv = sink_args(opt, "127.0.0.1:9100", &sink_report, wait);
    let mut sink = start_helper(opt, NS_SERVER, &sink_argv, "braid lab stream-sink (SRT)")?;
    let (mut rx, mut tx) = start_srt(opt, b, latency_ms, &stats_tx, &stats_rx)?;
    let gen_argv = gen_args(opt, "127.0.0.1:9200", &gen_report);
    let mut gen = start_helper(opt, NS_CLIENT, &gen_argv, "braid lab stream-gen (SRT)")?;
    let until = Instant::now() + opt.duration + Duration::from_secs(40);
    let gs = gen.wait_until(until)?;
    let ks = sink.wait_until(until)?;
    // The sink has seen 2 s of silence: SRT delivered all it would.
    tx.stop();
    rx.stop();
    if !gs.success() || !ks.success() {
        return Err(LabError::Command {
            cmd: "SRT stream".into(),
            reason: "the generator or the sink failed (see above)".into(),
        });
    }
    let (sent, got) = read_reports(&gen_report, &sink_report)?;
    let stats = |p: &Path| last_json_line(&fs::read_to_string(p).unwrap_or_default());
    let (st_tx, st_rx) = (stats(&stats_tx), stats(&stats_rx));
    let Some(st_tx) = st_tx else {
        return Err(LabError::Command {
            cmd: "srt-live-transmit (caller)".into(),
            reason: format!("no statistics in {}", stats_tx.display()),
        });
    };
    let drops = link_drops_since(&drops_before);
    let name = format!("SRT, latency {latency_ms} ms");
    let path = format!("link {b} ({})", opt.links[b].text);
    Ok(RunResult {
        retransmitted: st_tx["send"]["packetsRetransmitted"].as_u64().unwrap_or(0),
        data_packets: st_tx["send"]["packetsUnique"].as_u64().unwrap_or(0),
        link_drops: drops,
        detail: json!({
            "latency_ms": latency_ms,
            "generator": sent.to_json(),
            "send": st_tx["send"], "link": st_tx["link"],
            "recv": st_rx.map(|v| v["recv"].clone()).unwrap_or(Value::Null),
            "note": "SRT statistics are written every 100 packets: the last line may miss up to 99",
        }),
        ..RunResult::delivery(name, "srt", path, &sent, &got)
    })
}

/// `braid lab ARGS` (the stream's generator or sink) in namespace `ns`, with no standard
/// input or output and its errors on ours; `what` names it in errors.
fn start_helper(
    opt: &StreamOptions,
    ns: &str,
    args: &[String],
    what: &str,
) -> Result<Proc, LabError> {
    let mut c = ns_cmd(ns, &opt.exe, &refs(args));
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    Proc::new(c, what)
}

/// srt-live-transmit at both ends of link `b`: the listener in the server's namespace
/// (to the sink at 127.0.0.1:9100), then the caller in the client's (from the
/// generator at 127.0.0.1:9200), each writing its statistics; returns once the caller
/// has had a second to connect.
fn start_srt(
    opt: &StreamOptions,
    b: usize,
    latency_ms: u64,
    stats_tx: &Path,
    stats_rx: &Path,
) -> Result<(Proc, Proc), LabError> {
    let srt = tools::find(SRT.cmd).unwrap_or_else(|| PathBuf::from(SRT.cmd));
    let srt_cmd = |ns: &str, stats: &Path, from: &str, to: &str| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns])
            .arg(&srt)
            .args(["-q", "-s:100", "-pf:json", "-f"])
            .arg(format!("-statsout:{}", stats.display()))
            .args([from, to])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    };
    let port = 9000;
    let listener = format!(
        "srt://{}:{port}?mode=listener&latency={latency_ms}",
        server_addr(b)
    );
    let rx = Proc::new(
        srt_cmd(NS_SERVER, stats_rx, &listener, "udp://127.0.0.1:9100"),
        "srt-live-transmit (listener)",
    )?;
    std::thread::sleep(Duration::from_millis(300));
    let caller = format!(
        "srt://{}:{port}?mode=caller&latency={latency_ms}",
        server_addr(b)
    );
    let chunk = format!("-chunk:{}", opt.size);
    let mut tx_cmd = srt_cmd(NS_CLIENT, stats_tx, "udp://127.0.0.1:9200", &caller);
    tx_cmd.arg(&chunk);
    let mut tx = Proc::new(tx_cmd, "srt-live-transmit (caller)")?;
    // Connected when the listener's statistics appear or after a short wait; the
    // generator starts after the SRT handshake so that none of its records fall into
    // the connection set-up.
    std::thread::sleep(Duration::from_millis(1000));
    if let Ok(Some(s)) = tx.child.try_wait() {
        return Err(LabError::Command {
            cmd: "srt-live-transmit (caller)".into(),
            reason: format!("exited at once ({s})"),
        });
    }
    Ok((rx, tx))
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
];

/// Draw the latency distributions of `r` into `path` (`.svg` or `.png`): for each run,
/// the share of the records sent that arrived within x ms. A curve ends at its
/// delivered %; the y axis starts at 90 % to show the tail.
pub fn draw(r: &StreamResult, title: &str, path: &Path) -> Result<(), String> {
    let format = Format::from_path(path)
        .ok_or_else(|| format!("{}: the plot must end in .svg or .png", path.display()))?;
    let size = (1024, 640);
    match format {
        Format::Svg => render(r, title, SVGBackend::new(path, size).into_drawing_area()),
        Format::Png => render(
            r,
            title,
            PixelText(BitMapBackend::new(path, size)).into_drawing_area(),
        ),
    }
}

fn render<DB: DrawingBackend>(
    r: &StreamResult,
    title: &str,
    root: DrawingArea<DB, plotters::coord::Shift>,
) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let xmax = r
        .runs
        .iter()
        .filter_map(|x| x.cdf_ms.last().copied())
        .fold(1.0, f64::max)
        * 1.05;
    let ymin = 90.0;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..xmax, ymin..100.5f64)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("latency: send time to arrival at the sink (ms)")
        .y_desc("% of the records sent, arrived within x")
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 15))
        .draw()
        .map_err(e)?;
    for (i, run) in r.runs.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let share = run.delivered_pct() / 100.0;
        let n = run.cdf_ms.len().saturating_sub(1).max(1) as f64;
        let pts: Vec<(f64, f64)> = run
            .cdf_ms
            .iter()
            .enumerate()
            .map(|(k, &x)| (x, (100.0 * share * k as f64 / n).max(ymin)))
            .collect();
        let label = format!("{}: {:.2} % delivered", run.name, run.delivered_pct());
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(2)))
            .map_err(e)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

/// The generator's and the sink's JSON reports of one contender.
fn read_reports(
    gen_report: &Path,
    sink_report: &Path,
) -> Result<(GenReport, SinkReport), LabError> {
    let unreadable = |cmd: &str| LabError::Command {
        cmd: cmd.into(),
        reason: "unreadable report".into(),
    };
    let sent = GenReport::from_json(&read_json(gen_report, "stream-gen")?)
        .ok_or_else(|| unreadable("stream-gen"))?;
    let got = SinkReport::from_json(&read_json(sink_report, "stream-sink")?)
        .ok_or_else(|| unreadable("stream-sink"))?;
    Ok((sent, got))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_junk_is_refused() {
        let mut r = vec![0u8; 1316];
        stamp(&mut r, 42, 1_700_000_000_000_000);
        assert_eq!(parse(&r), Some((42, 1_700_000_000_000_000)));
        assert_eq!(parse(&r[..19]), None);
        r[0] = b'X';
        assert_eq!(parse(&r), None);
        assert!(check_size(19).is_err() && check_size(1316).is_ok());
        assert!(check_size(MAX_RECORD + 1).is_err());
        assert_eq!(Endpoint::parse("-"), Ok(Endpoint::Stdio));
        assert!(Endpoint::parse("10.0.0.1:9").is_ok());
        assert!(Endpoint::parse("nowhere").is_err());
    }

    #[test]
    fn sink_counts_duplicates_reordering_and_junk() {
        let mut s = SinkReport::default();
        let (mut seen, mut high) = (Vec::new(), None);
        let now = wall_us();
        for seq in [0u64, 2, 1, 2, 3] {
            let mut r = vec![0u8; 64];
            stamp(&mut r, seq, now - 5_000);
            s.record(&r, &mut seen, &mut high);
        }
        s.record(&[0u8; 64], &mut seen, &mut high);
        assert_eq!((s.records, s.unique, s.duplicates), (5, 4, 1));
        assert_eq!((s.reordered, s.corrupt), (1, 1));
        assert!(s
            .latency_us
            .iter()
            .all(|&l| (5_000..5_000_000).contains(&l)));
        assert_eq!(SinkReport::from_json(&s.to_json()), Some(s));
    }

    /// The generator and the sink over loopback UDP: every record, in order, on time.
    #[test]
    fn generator_and_sink_over_udp() {
        let port = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let sink = std::thread::spawn(move || {
            sink(
                100,
                Endpoint::Udp(addr),
                Duration::from_millis(300),
                Duration::from_secs(5),
            )
        });
        std::thread::sleep(Duration::from_millis(100));
        // 1 Mbit/s of 100-byte records for 0.3 s: 375 records, one every 0.8 ms.
        let g = generate(
            1_000_000,
            100,
            Duration::from_millis(300),
            Endpoint::Udp(addr),
        )
        .unwrap();
        assert_eq!((g.records, g.bytes), (375, 37_500));
        assert!(g.duration_s >= 0.29 && g.duration_s < 5.0, "{g:?}");
        let r = sink.join().unwrap().unwrap();
        assert_eq!((r.unique, r.duplicates, r.corrupt), (375, 0, 0), "{r:?}");
        assert_eq!(r.reordered, 0);
        let l = Latency::of(&r.latency_us).unwrap();
        assert!(l.max < 1000.0, "{l:?}");
        assert!(generate(0, 100, Duration::from_secs(1), Endpoint::Udp(addr)).is_err());
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let us: Vec<u64> = (1..=1000).rev().map(|x| x * 1000).collect();
        let l = Latency::of(&us).unwrap();
        assert_eq!((l.p50, l.p99, l.max), (500.0, 990.0, 1000.0));
        assert!((l.mean - 500.5).abs() < 1e-9);
        let c = cdf_ms(&us);
        assert_eq!((c.len(), c[0], c[500], c[1000]), (1001, 1.0, 500.0, 1000.0));
        assert!(c.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(Latency::of(&[]), None);
        assert!(cdf_ms(&[]).is_empty());
    }

    #[test]
    fn best_link_is_the_fastest_then_the_nearest() {
        let l = LinkSpec::parse_list("50mbit/5ms,100mbit/20ms,100mbit/5ms/1%").unwrap();
        assert_eq!(best_link(&l), 2);
        let l = LinkSpec::parse_list("100mbit/5ms,50mbit/20ms,20mbit/60ms/1%").unwrap();
        assert_eq!(best_link(&l), 0);
    }

    #[test]
    fn results_round_trip_through_json() {
        let r = StreamResult {
            links: vec!["100mbit/5ms".into()],
            rtt_ms: vec![10.5],
            rate_bps: 8_000_000,
            size: 1316,
            duration_s: 20.0,
            runs: vec![RunResult {
                name: "braid (100,0,0)".into(),
                kind: "braid".into(),
                path: "all 1 links".into(),
                sent: 100,
                delivered: 99,
                duplicates: 0,
                reordered: 0,
                corrupt: 0,
                latency: Latency::of(&[1000, 2000, 3000]),
                cdf_ms: cdf_ms(&[1000, 2000, 3000]),
                retransmitted: 3,
                data_packets: 100,
                link_drops: 2,
                detail: json!({"x": 1}),
            }],
        };
        assert_eq!(StreamResult::from_json(&r.to_json()), Some(r.clone()));
        let svg = std::env::temp_dir().join(format!("braid-stream-{}.svg", std::process::id()));
        draw(&r, "test", &svg).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        let _ = std::fs::remove_file(&svg);
        assert!(text.contains("<svg") && text.contains("braid (100,0,0)"));
        assert!(draw(&r, "test", Path::new("x.pdf")).is_err());
        let t = r.table();
        assert!(t.contains("braid (100,0,0)") && t.contains("99.000%") && t.contains("3.00%"));
    }
}
