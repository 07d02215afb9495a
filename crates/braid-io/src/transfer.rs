//! A byte stream over a [`Session`] with application-oriented error control (seed 002,
//! [`braid_proto::errctl`]): `braid send` and `braid recv`.
//!
//! The sender reads any [`AsyncRead`] (a file, stdin) in chunks; each chunk, stamped
//! with its wall-clock read time, is one packet of the errctl [`Sender`], and every
//! errctl datagram is one application message of the session. The receiver runs the
//! errctl [`Receiver`] on the messages it gets and sends its SNAKs and PACKs back over
//! the same session (a session carries messages both ways). Delivered segments are
//! written, in order, to any [`AsyncWrite`]; a packet lost within the tolerance, or
//! given up at the deadline, is left out of the output.
//!
//! Before the stream, the sender offers its settings (tolerance, window, round trip,
//! deadline) in an offer message, repeated until the receiver accepts: the receiver
//! needs no settings of its own. The stream ends when the receiver has every segment
//! and has acknowledged the end (errctl's end acknowledgement); the receiver then
//! lingers while end-of-stream packets still arrive (its acknowledgement may be lost).
//!
//! [`SessionOptions`] turns command-line style session options (a config file or
//! `LOCAL,REMOTE` channel strings with a key file) into a [`SessionConfig`]; `braid
//! bench` uses it too.

use std::path::PathBuf;
use std::time::{Duration as StdDuration, SystemTime, UNIX_EPOCH};

use braid_proto::errctl::{Config, Receiver, Segment, Sender, Stats, Tolerance};
use braid_proto::wire::errctl::DATA_HEADER_LEN;
use braid_proto::{units, Duration, Instant};
use bytes::Bytes;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::watch;
use tokio::time::Instant as TokioInstant;

use crate::config::{ChannelConfig, FileConfig, SessionConfig};
use crate::session::{Session, SessionError};

/// Errors of a transfer.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// Settings that cannot work.
    #[error("{0}")]
    Config(String),
    /// Reading the input failed.
    #[error("reading the input: {0}")]
    Read(std::io::Error),
    /// Writing the output failed (e.g. the reader of a pipe went away).
    #[error("writing the output: {0}")]
    Write(std::io::Error),
    /// The session failed.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// Nothing came from the peer for too long.
    #[error("{0}")]
    Silent(String),
}

/// Bytes of the send time in front of each chunk.
const STAMP_LEN: usize = 8;
const OFFER: u8 = 0x01;
const ACCEPT: u8 = 0x02;
const MAGIC: [u8; 3] = *b"BX\x01";
const OFFER_LEN: usize = 4 + 6 + 4 + 8 + 8;
/// How often the offer repeats until the receiver accepts.
const OFFER_EVERY: StdDuration = StdDuration::from_millis(200);
/// "No deadline": a year.
const NO_DEADLINE: StdDuration = StdDuration::from_secs(365 * 86_400);

/// Settings of a transfer. The sender's are used at both ends (the receiver learns
/// them from the offer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransferConfig {
    /// (W, E, B): W packets per segment, at most E of them lost, in bursts of at most B.
    pub tolerance: Tolerance,
    /// A segment not accepted this long after it started is given up; `None`: never.
    pub deadline: Option<StdDuration>,
    /// Segments in flight (the retransmission buffer); 0: about 4096 packets' worth.
    pub window: u32,
    /// Round-trip estimate: repair requests for a copy younger than this are ignored;
    /// the errctl timers are fractions of it.
    pub rtt: StdDuration,
    /// Data bytes per packet; 0: as many as a session message carries.
    pub chunk: usize,
    /// Give up when the peer has sent nothing for this long while we wait for it;
    /// `None`: wait forever.
    pub peer_timeout: Option<StdDuration>,
    /// Receiver: once complete, stay while end-of-stream packets keep arriving, until
    /// none has come for this long.
    pub linger: StdDuration,
    /// Live stream. Sender: every packet carries exactly `chunk` bytes (the input is
    /// read until a chunk is full), so a lost packet takes whole records with it, e.g.
    /// 7 MPEG-TS packets of 188 bytes in a chunk of 1316. Receiver: packets are written
    /// as soon as everything before them is decided (errctl's live mode), not when
    /// their segment is complete.
    pub live: bool,
}

impl Default for TransferConfig {
    /// Full reliability with segments of 64 packets, no deadline, a 50 ms round trip.
    fn default() -> Self {
        TransferConfig {
            tolerance: Tolerance::reliable(64),
            deadline: None,
            window: 0,
            rtt: StdDuration::from_millis(50),
            chunk: 0,
            peer_timeout: Some(StdDuration::from_secs(30)),
            linger: StdDuration::from_millis(200),
            live: false,
        }
    }
}

fn us(d: StdDuration) -> Duration {
    Duration::from_micros(d.as_micros().min(u128::from(u64::MAX / 4)) as u64)
}

impl TransferConfig {
    /// The errctl settings both ends run with.
    pub fn errctl(&self) -> Result<Config, TransferError> {
        let mut c = Config::new(
            self.tolerance,
            us(self.rtt.max(StdDuration::from_millis(1))),
        );
        c.window = match self.window {
            0 => (4096 / u32::from(self.tolerance.w.max(1))).max(2),
            w => w,
        };
        c.deadline = us(self.deadline.unwrap_or(NO_DEADLINE));
        // Over a bond the round trip includes the resequencing at both ends, which a
        // ping of the paths (`--rtt`) does not show: measure it (no duplicate repairs).
        c.adaptive_rtt = true;
        c.validate()
            .map_err(|e| TransferError::Config(format!("transfer settings: {e}")))?;
        Ok(c)
    }

    fn offer(&self, c: &Config) -> Vec<u8> {
        let mut v = vec![OFFER];
        v.extend_from_slice(&MAGIC);
        for x in [c.tolerance.w, c.tolerance.e, c.tolerance.b] {
            v.extend_from_slice(&x.to_be_bytes());
        }
        v.extend_from_slice(&c.window.to_be_bytes());
        v.extend_from_slice(&c.rtt.as_micros().to_be_bytes());
        v.extend_from_slice(&c.deadline.as_micros().to_be_bytes());
        v
    }
}

/// The errctl settings in an offer, if `m` is a valid one.
fn parse_offer(m: &[u8]) -> Option<Config> {
    if m.len() != OFFER_LEN || m[0] != OFFER || m[1..4] != MAGIC {
        return None;
    }
    let u16_at = |i: usize| u16::from_be_bytes([m[i], m[i + 1]]);
    let u64_at = |i: usize| u64::from_be_bytes(m[i..i + 8].try_into().expect("8 bytes"));
    let t = Tolerance {
        w: u16_at(4),
        e: u16_at(6),
        b: u16_at(8),
    };
    let mut c = Config::new(t, Duration::from_micros(u64_at(14).max(1000)));
    c.window = u32::from_be_bytes(m[10..14].try_into().expect("4 bytes"));
    c.deadline = Duration::from_micros(u64_at(22));
    c.adaptive_rtt = true; // as `TransferConfig::errctl` (only a sender uses it)
    c.validate().ok().map(|_| c)
}

fn accept_msg() -> Bytes {
    let mut v = vec![ACCEPT];
    v.extend_from_slice(&MAGIC);
    Bytes::from(v)
}

/// Parse a tolerance written `W,E,B` (e.g. `64,0,0` for full reliability, `100,1,1`).
pub fn parse_tolerance(s: &str) -> Result<Tolerance, String> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    let bad = || {
        format!("'{s}' is not a tolerance W,E,B (three whole numbers, W from 1 to 65535, e.g. 64,0,0 or 100,1,1)")
    };
    let [w, e, b] = parts.as_slice() else {
        return Err(bad());
    };
    let n = |x: &str| x.parse::<u16>().map_err(|_| bad());
    let t = Tolerance {
        w: n(w)?,
        e: n(e)?,
        b: n(b)?,
    };
    if t.w == 0 {
        return Err(bad());
    }
    if t.e > t.w || t.b > t.w {
        return Err(format!("tolerance {s}: E and B cannot exceed W"));
    }
    Ok(t)
}

/// Microseconds since the Unix epoch (the chunks' stamps; latency assumes both ends
/// read the same clock, or synchronized ones).
fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// errctl time from tokio's clock.
#[derive(Clone, Copy)]
struct Clock(TokioInstant);

impl Clock {
    fn now(&self) -> Instant {
        Instant::from_micros(self.0.elapsed().as_micros() as u64)
    }
    fn at(&self, t: Instant) -> TokioInstant {
        self.0 + StdDuration::from_micros(t.as_micros())
    }
}

/// What a progress line shows, updated while a transfer runs.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Progress {
    /// Data bytes read (sender) or written (receiver).
    pub bytes: u64,
    /// Sender: packets sent again; receiver: requested packets that arrived.
    pub repaired: u64,
    /// Receiver: packets lost within the tolerance or given up at the deadline.
    pub tolerated: u64,
    /// Seconds since the stream started.
    pub elapsed_s: f64,
}

impl Progress {
    /// One line for a terminal.
    pub fn line(&self) -> String {
        let rate = if self.elapsed_s > 0.0 {
            self.bytes as f64 * 8.0 / self.elapsed_s
        } else {
            0.0
        };
        format!(
            "{} {:>9} {:>7.1}s  repaired {}  tolerated {}",
            human_bytes(self.bytes),
            human_rate(rate),
            self.elapsed_s,
            self.repaired,
            self.tolerated
        )
    }
}

/// The progress line a transfer redraws on stderr (at most every 250 ms), when stderr is
/// a terminal or it is `forced`; [`ProgressLine::sender`] feeds it.
pub struct ProgressLine {
    tx: Option<watch::Sender<Progress>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl ProgressLine {
    /// Start redrawing (a task on the current runtime), or nothing when not wanted.
    pub fn start(forced: bool) -> ProgressLine {
        use std::io::IsTerminal;
        if !forced && !std::io::stderr().is_terminal() {
            return ProgressLine {
                tx: None,
                task: None,
            };
        }
        let (tx, mut rx) = watch::channel(Progress::default());
        let task = tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let line = rx.borrow_and_update().line();
                eprint!("\r{line}   ");
                tokio::time::sleep(StdDuration::from_millis(250)).await;
            }
            eprintln!();
        });
        ProgressLine {
            tx: Some(tx),
            task: Some(task),
        }
    }

    /// Where the transfer reports its progress (none when no line is drawn).
    pub fn sender(&self) -> Option<&watch::Sender<Progress>> {
        self.tx.as_ref()
    }

    /// Draw the last state and end the line.
    pub async fn finish(self) {
        drop(self.tx);
        if let Some(t) = self.task {
            let _ = t.await;
        }
    }
}

fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / f64::from(1u32 << 30)),
        b if b >= 1 << 20 => format!("{:.2} MiB", b as f64 / f64::from(1u32 << 20)),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

fn human_rate(bps: f64) -> String {
    if bps >= 1e9 {
        format!("{:.2} Gbit/s", bps / 1e9)
    } else if bps >= 1e6 {
        format!("{:.1} Mbit/s", bps / 1e6)
    } else {
        format!("{:.0} kbit/s", bps / 1e3)
    }
}

/// Publishes [`Progress`] at most every 100 ms.
struct Reporter<'a> {
    tx: Option<&'a watch::Sender<Progress>>,
    start: TokioInstant,
    last: Option<TokioInstant>,
}

impl Reporter<'_> {
    fn update(&mut self, force: bool, f: impl FnOnce() -> Progress) {
        let Some(tx) = self.tx else { return };
        let now = TokioInstant::now();
        if force
            || self
                .last
                .is_none_or(|t| now >= t + StdDuration::from_millis(100))
        {
            self.last = Some(now);
            let mut p = f();
            p.elapsed_s = (now - self.start).as_secs_f64();
            tx.send_replace(p);
        }
    }
}

/// The sender's report.
#[derive(Clone, Debug, Serialize)]
pub struct SendSummary {
    /// `send`.
    pub role: &'static str,
    /// Data bytes read and sent.
    pub bytes: u64,
    /// Packets (chunks).
    pub packets: u64,
    /// Packets sent again after a repair request.
    pub retransmissions: u64,
    /// Segments given up at the deadline before being acknowledged.
    pub segments_expired: u64,
    /// Repair requests not answered because the last copy left less than a round trip
    /// (and an acknowledgement interval) before: the copy was on its way.
    pub premature_requests: u64,
    /// The round trip the sender used at the end, ms: `--rtt`, or the one it measured
    /// from acknowledgements if longer.
    pub rtt_ms: f64,
    /// The receiver acknowledged the whole stream, its end included.
    pub complete: bool,
    /// From the offer's acceptance to the end acknowledgement.
    pub duration_s: f64,
    /// `bytes` × 8 / `duration_s`.
    pub rate_bps: f64,
    /// (W, E, B).
    pub tolerance: [u16; 3],
    /// The deadline, if any.
    pub deadline_ms: Option<f64>,
    /// errctl's counters.
    #[serde(skip)]
    pub errctl: Stats,
}

impl SendSummary {
    /// A few lines for a person.
    pub fn text(&self) -> String {
        format!(
            "sent {} ({} packets) in {:.2}s, {}; tolerance ({},{},{}), deadline {}\n\
             retransmitted {} packets ({:.2} %), {} requests premature (round trip {:.1} ms), {} segments given up at the deadline; {}\n",
            human_bytes(self.bytes),
            self.packets,
            self.duration_s,
            human_rate(self.rate_bps),
            self.tolerance[0],
            self.tolerance[1],
            self.tolerance[2],
            self.deadline_ms
                .map_or("none".to_string(), |d| format!("{d} ms")),
            self.retransmissions,
            pct(self.retransmissions, self.packets),
            self.premature_requests,
            self.rtt_ms,
            self.segments_expired,
            if self.complete {
                "the receiver has everything"
            } else {
                "NOT acknowledged by the receiver"
            }
        )
    }
}

fn pct(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 * 100.0 / b as f64
    }
}

/// Latency quantiles, milliseconds: from reading a chunk at the sender to writing it at
/// the receiver (wall clocks of both ends).
#[derive(Clone, Debug, Serialize)]
pub struct LatencyMs {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Maximum.
    pub max: f64,
}

/// The receiver's report.
#[derive(Clone, Debug, Serialize)]
pub struct RecvSummary {
    /// `recv`.
    pub role: &'static str,
    /// Data bytes written to the output.
    pub bytes: u64,
    /// Packets written.
    pub packets: u64,
    /// Packets missing from the output: `tolerated` + `given_up`.
    pub packets_lost: u64,
    /// Requested (lost) packets that arrived after the request: loss repaired.
    pub repaired: u64,
    /// Packets lost and accepted within the tolerance: loss tolerated.
    pub tolerated: u64,
    /// Packets still missing when their segment's deadline passed.
    pub given_up: u64,
    /// Segments written.
    pub segments: u64,
    /// Segments given up at the deadline.
    pub segments_forced: u64,
    /// Segments written with more holes than the tolerance allows (only at the deadline).
    pub violations: u64,
    /// Copies of packets already received.
    pub duplicates: u64,
    /// The end of the stream was reached (every segment written).
    pub complete: bool,
    /// From the first packet to the last segment written.
    pub duration_s: f64,
    /// `bytes` × 8 / `duration_s`.
    pub rate_bps: f64,
    /// Chunk latency; none if nothing was written.
    pub latency_ms: Option<LatencyMs>,
    /// (W, E, B), as the sender offered.
    pub tolerance: [u16; 3],
    /// The deadline, if any.
    pub deadline_ms: Option<f64>,
    /// errctl's counters.
    #[serde(skip)]
    pub errctl: Stats,
}

impl RecvSummary {
    /// A few lines for a person.
    pub fn text(&self) -> String {
        let lat = self
            .latency_ms
            .as_ref()
            .map_or("latency: none".into(), |l| {
                format!(
                    "latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
                    l.p50, l.p99, l.max
                )
            });
        format!(
            "received {} ({} packets, {} segments) in {:.2}s, {}; {}\n\
             loss repaired {} packets; loss tolerated {} packets ({} within ({},{},{}), {} given up \
             at the deadline in {} segments, {} over the tolerance)\n{}\n",
            human_bytes(self.bytes),
            self.packets,
            self.segments,
            self.duration_s,
            human_rate(self.rate_bps),
            if self.complete {
                "complete"
            } else {
                "INCOMPLETE"
            },
            self.repaired,
            self.packets_lost,
            self.tolerated,
            self.tolerance[0],
            self.tolerance[1],
            self.tolerance[2],
            self.given_up,
            self.segments_forced,
            self.violations,
            lat
        )
    }
}

/// A log-linear latency histogram (64 steps per power of two, about 1.6 %), bounded in
/// memory for streams of any length.
struct Histogram {
    counts: Vec<u64>,
    n: u64,
    max: u64,
}

impl Histogram {
    const SUB: u32 = 6;

    fn new() -> Histogram {
        Histogram {
            counts: vec![0; 64 * 60],
            n: 0,
            max: 0,
        }
    }

    fn bucket(v: u64) -> usize {
        if v < (1 << Self::SUB) {
            return v as usize;
        }
        let k = 63 - v.leading_zeros();
        let sub = (v >> (k - Self::SUB)) & ((1 << Self::SUB) - 1);
        ((k - Self::SUB + 1) as usize) * 64 + sub as usize
    }

    /// The lowest value of bucket `i`.
    fn value(i: usize) -> u64 {
        if i < 64 {
            return i as u64;
        }
        let k = (i / 64) as u32 + Self::SUB - 1;
        (1u64 << k) | ((i % 64) as u64) << (k - Self::SUB)
    }

    fn record(&mut self, v: u64) {
        self.counts[Self::bucket(v).min(64 * 60 - 1)] += 1;
        self.n += 1;
        self.max = self.max.max(v);
    }

    fn quantile(&self, q: f64) -> u64 {
        let rank = ((self.n as f64 * q).ceil() as u64).clamp(1, self.n.max(1));
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::value(i).min(self.max);
            }
        }
        self.max
    }

    fn summary_ms(&self) -> Option<LatencyMs> {
        (self.n > 0).then(|| LatencyMs {
            p50: self.quantile(0.5) as f64 / 1e3,
            p99: self.quantile(0.99) as f64 / 1e3,
            max: self.max as f64 / 1e3,
        })
    }
}

/// Bytes of data per packet for a session whose messages carry up to `max_message`.
fn chunk_len(cfg: &TransferConfig, max_message: usize) -> Result<usize, TransferError> {
    // errctl datagrams start with 0xBC: one byte of escape in the header-free modes.
    let room = max_message.saturating_sub(1 + DATA_HEADER_LEN + STAMP_LEN);
    if room == 0 {
        return Err(TransferError::Config(format!(
            "session messages of {max_message} bytes leave no room for data"
        )));
    }
    match cfg.chunk {
        0 => Ok(room),
        c if c <= room => Ok(c),
        c => Err(TransferError::Config(format!(
            "chunk of {c} bytes does not fit in a session message (at most {room})"
        ))),
    }
}

fn silent(what: &str, after: StdDuration) -> TransferError {
    TransferError::Silent(format!(
        "nothing from the {what} for {after:?}; is `braid {}` running at the other end?",
        if what == "receiver" { "recv" } else { "send" }
    ))
}

fn far_future() -> TokioInstant {
    TokioInstant::now() + NO_DEADLINE
}

/// Offer the settings until the receiver accepts.
async fn offer(
    session: &mut Session,
    offer: Bytes,
    timeout: Option<StdDuration>,
) -> Result<(), TransferError> {
    let give_up = timeout.map_or_else(far_future, |t| TokioInstant::now() + t);
    // A peer that refuses our handshake (other keys or settings) ends this at once.
    let mut refusal = session.refusal();
    loop {
        session.send(offer.clone()).await?;
        let next = TokioInstant::now() + OFFER_EVERY;
        loop {
            tokio::select! {
                m = session.recv() => match m {
                    Some(m) if m[..] == accept_msg()[..] => return Ok(()),
                    Some(_) => continue,
                    None => return Err(SessionError::Closed.into()),
                },
                e = refusal.wait() => return Err(e.into()),
                _ = tokio::time::sleep_until(next) => break,
            }
        }
        if TokioInstant::now() >= give_up {
            let t = timeout.unwrap_or_default();
            return Err(session
                .never_heard(t)
                .map_or_else(|| silent("receiver", t), Into::into));
        }
    }
}

/// The sending end's state.
struct Tx<'a> {
    ec: Sender,
    clock: Clock,
    buf: Vec<u8>,
    /// Live: data bytes of the chunk being filled.
    filled: usize,
    live: bool,
    eof: bool,
    bytes: u64,
    packets: u64,
    heard: TokioInstant,
    report: Reporter<'a>,
}

impl<'a> Tx<'a> {
    /// A sender of `chunk`-byte chunks (`live`: stamped, sent as they come) starting
    /// at `start`, reporting to `progress`.
    fn new(
        ec: Sender,
        chunk: usize,
        live: bool,
        progress: Option<&'a watch::Sender<Progress>>,
        start: TokioInstant,
    ) -> Tx<'a> {
        Tx {
            ec,
            clock: Clock(start),
            buf: vec![0; STAMP_LEN + chunk],
            filled: 0,
            live,
            eof: false,
            bytes: 0,
            packets: 0,
            heard: start,
            report: Reporter {
                tx: progress,
                start,
                last: None,
            },
        }
    }

    /// The last progress report, and the summary of a transfer that began at `start`.
    fn finish(&mut self, start: TokioInstant, cfg: &TransferConfig) -> SendSummary {
        let duration_s = start.elapsed().as_secs_f64();
        let (bytes, repaired) = (self.bytes, self.ec.stats().retransmissions);
        self.report.update(true, || Progress {
            bytes,
            repaired,
            ..Progress::default()
        });
        let s = self.ec.stats().clone();
        SendSummary {
            role: "send",
            bytes: self.bytes,
            packets: self.packets,
            retransmissions: s.retransmissions,
            segments_expired: s.segments_expired,
            premature_requests: s.premature_requests,
            rtt_ms: self.ec.rtt().as_micros() as f64 / 1e3,
            complete: self.ec.is_done(),
            duration_s,
            rate_bps: rate(self.bytes, duration_s),
            tolerance: [cfg.tolerance.w, cfg.tolerance.e, cfg.tolerance.b],
            deadline_ms: cfg.deadline.map(|d| d.as_secs_f64() * 1e3),
            errctl: s,
        }
    }

    fn on_input(&mut self, r: std::io::Result<usize>) -> Result<(), TransferError> {
        let n = r.map_err(TransferError::Read)?;
        let now = self.clock.now();
        if n == 0 {
            // Live: a partial chunk at the end goes out as it is.
            let rest = std::mem::take(&mut self.filled);
            if rest > 0 {
                self.packet(rest)?;
            }
            self.eof = true;
            self.ec.finish(now);
            self.heard = TokioInstant::now();
            return Ok(());
        }
        if self.live {
            self.filled += n;
            if self.filled < self.buf.len() - STAMP_LEN {
                return Ok(());
            }
            let n = std::mem::take(&mut self.filled);
            return self.packet(n);
        }
        self.packet(n)
    }

    /// Where the next read goes: the rest of the chunk being filled.
    fn space(&mut self) -> &mut [u8] {
        &mut self.buf[STAMP_LEN + self.filled..]
    }

    /// Hand the `n` data bytes in the buffer to errctl as one packet.
    fn packet(&mut self, n: usize) -> Result<(), TransferError> {
        let now = self.clock.now();
        if self.ec.is_idle() {
            // Only silence while something awaits an acknowledgement counts.
            self.heard = TokioInstant::now();
        }
        self.buf[..STAMP_LEN].copy_from_slice(&wall_us().to_be_bytes());
        let p = Bytes::copy_from_slice(&self.buf[..STAMP_LEN + n]);
        self.ec
            .handle_packet(now, p)
            .map_err(|e| TransferError::Config(format!("errctl refused a packet: {e}")))?;
        self.bytes += n as u64;
        self.packets += 1;
        Ok(())
    }

    async fn flush(&mut self, session: &Session) -> Result<(), TransferError> {
        while let Some(d) = self.ec.poll_transmit(self.clock.now()) {
            session.send(d).await?;
        }
        let (bytes, repaired) = (self.bytes, self.ec.stats().retransmissions);
        self.report.update(false, || Progress {
            bytes,
            repaired,
            ..Progress::default()
        });
        Ok(())
    }
}

/// Send everything `input` yields over `session` (whose peer runs [`recv`]); returns
/// once the receiver has acknowledged the whole stream.
pub async fn send<R: AsyncRead + Unpin>(
    session: &mut Session,
    mut input: R,
    cfg: &TransferConfig,
    progress: Option<&watch::Sender<Progress>>,
) -> Result<SendSummary, TransferError> {
    let ec = cfg.errctl()?;
    let chunk = chunk_len(cfg, session.sender().max_message())?;
    offer(session, Bytes::from(cfg.offer(&ec)), cfg.peer_timeout).await?;
    let start = TokioInstant::now();
    let mut tx = Tx::new(Sender::new(ec), chunk, cfg.live, progress, start);
    loop {
        tx.flush(session).await?;
        if tx.ec.is_done() {
            break;
        }
        let wake = tx.ec.poll_timeout().map(|t| tx.clock.at(t));
        let waiting = !tx.ec.is_idle() || tx.eof;
        let silent_at = match cfg.peer_timeout {
            Some(t) if waiting => tx.heard + t,
            _ => far_future(),
        };
        let reading = !tx.eof && tx.ec.can_accept();
        tokio::select! {
            r = input.read(tx.space()), if reading => tx.on_input(r)?,
            m = session.recv() => match m {
                Some(m) => {
                    tx.heard = TokioInstant::now();
                    tx.ec.handle_datagram(tx.clock.now(), &m);
                }
                None => return Err(SessionError::Closed.into()),
            },
            _ = tokio::time::sleep_until(wake.unwrap_or_else(far_future)), if wake.is_some() => {
                tx.ec.handle_timeout(tx.clock.now());
            }
            _ = tokio::time::sleep_until(silent_at) => {
                return Err(silent("receiver", cfg.peer_timeout.unwrap_or_default()));
            }
        }
    }
    Ok(tx.finish(start, cfg))
}

fn rate(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 * 8.0 / secs
    } else {
        0.0
    }
}

/// Wait for the sender's offer and accept it.
async fn wait_offer(
    session: &mut Session,
    timeout: Option<StdDuration>,
) -> Result<Config, TransferError> {
    let give_up = timeout.map_or_else(far_future, |t| TokioInstant::now() + t);
    // A peer that refuses our handshake (other keys or settings) ends this at once.
    let mut refusal = session.refusal();
    loop {
        tokio::select! {
            m = session.recv() => match m {
                Some(m) => {
                    if let Some(c) = parse_offer(&m) {
                        session.send(accept_msg()).await?;
                        return Ok(c);
                    }
                }
                None => return Err(SessionError::Closed.into()),
            },
            e = refusal.wait() => return Err(e.into()),
            _ = tokio::time::sleep_until(give_up) => {
                let t = timeout.unwrap_or_default();
                return Err(session
                    .never_heard(t)
                    .map_or_else(|| silent("sender", t), Into::into));
            }
        }
    }
}

/// The receiving end's state.
struct Rx<W> {
    ec: Receiver,
    clock: Clock,
    out: Option<BufWriter<W>>,
    bytes: u64,
    packets: u64,
    lost: u64,
    first: Option<TokioInstant>,
    last_write: Option<TokioInstant>,
    latency: Histogram,
}

impl<W: AsyncWrite + Unpin> Rx<W> {
    /// A receiver of the stream `ec` offered (`live`: packets delivered as they
    /// come) starting at `start`, writing to `output`.
    fn new(ec: Config, live: bool, start: TokioInstant, output: W) -> Rx<W> {
        let mut ec = Receiver::new(ec);
        ec.set_live(live);
        Rx {
            ec,
            clock: Clock(start),
            out: Some(BufWriter::with_capacity(1 << 16, output)),
            bytes: 0,
            packets: 0,
            lost: 0,
            first: None,
            last_write: None,
            latency: Histogram::new(),
        }
    }

    async fn write_segment(&mut self, s: Segment) -> Result<(), TransferError> {
        let out = self.out.as_mut().expect("open until complete");
        let now = wall_us();
        for p in s.packets {
            let Some(p) = p.filter(|p| p.len() >= STAMP_LEN) else {
                self.lost += 1;
                continue;
            };
            let sent = u64::from_be_bytes(p[..STAMP_LEN].try_into().expect("8 bytes"));
            self.latency.record(now.saturating_sub(sent));
            out.write_all(&p[STAMP_LEN..])
                .await
                .map_err(TransferError::Write)?;
            self.bytes += (p.len() - STAMP_LEN) as u64;
            self.packets += 1;
        }
        Ok(())
    }

    /// Send control datagrams, write delivered segments; close the output once the
    /// stream is complete.
    async fn flush(&mut self, session: &Session) -> Result<(), TransferError> {
        while let Some(c) = self.ec.poll_transmit() {
            session.send(c).await?;
        }
        let mut wrote = false;
        while let Some(s) = self.ec.poll_deliver() {
            self.write_segment(s).await?;
            wrote = true;
        }
        if let Some(out) = self.out.as_mut() {
            if wrote {
                out.flush().await.map_err(TransferError::Write)?;
                self.last_write = Some(TokioInstant::now());
            }
            if self.ec.is_complete() {
                out.shutdown().await.map_err(TransferError::Write)?;
                self.out = None;
            }
        }
        Ok(())
    }

    fn progress(&self) -> Progress {
        let s = self.ec.stats();
        Progress {
            bytes: self.bytes,
            repaired: s.packets_repaired,
            tolerated: s.packets_tolerated + s.packets_given_up,
            elapsed_s: 0.0,
        }
    }
}

/// Receive a stream sent by [`send`] over `session` and write it to `output`; returns
/// once the stream is complete (and the end acknowledged) or the sender fell silent.
pub async fn recv<W: AsyncWrite + Unpin>(
    session: &mut Session,
    output: W,
    cfg: &TransferConfig,
    progress: Option<&watch::Sender<Progress>>,
) -> Result<RecvSummary, TransferError> {
    let ec = wait_offer(session, cfg.peer_timeout).await?;
    let start = TokioInstant::now();
    let tolerance = ec.tolerance;
    let deadline = ec.deadline;
    let mut report = Reporter {
        tx: progress,
        start,
        last: None,
    };
    let mut rx = Rx::new(ec, cfg.live, start, output);
    let mut heard = start;
    loop {
        rx.flush(session).await?;
        report.update(false, || rx.progress());
        let complete = rx.ec.is_complete();
        let wake = rx.ec.poll_timeout().map(|t| rx.clock.at(t));
        let quiet_at = match (complete, cfg.peer_timeout) {
            (true, _) => heard + cfg.linger,
            (false, Some(t)) => heard + t,
            (false, None) => far_future(),
        };
        tokio::select! {
            m = session.recv() => match m {
                Some(m) if parse_offer(&m).is_some() => session.send(accept_msg()).await?,
                Some(m) => {
                    heard = TokioInstant::now();
                    rx.first.get_or_insert(heard);
                    rx.ec.handle_datagram(rx.clock.now(), &m);
                }
                None => return Err(SessionError::Closed.into()),
            },
            _ = tokio::time::sleep_until(wake.unwrap_or_else(far_future)), if wake.is_some() => {
                rx.ec.handle_timeout(rx.clock.now());
            }
            _ = tokio::time::sleep_until(quiet_at) => {
                if complete {
                    break;
                }
                return Err(silent("sender", cfg.peer_timeout.unwrap_or_default()));
            }
        }
    }
    report.update(true, || rx.progress());
    Ok(recv_summary(&rx, tolerance, deadline))
}

fn recv_summary<W>(rx: &Rx<W>, t: Tolerance, deadline: Duration) -> RecvSummary {
    let s = rx.ec.stats().clone();
    let duration_s = match (rx.first, rx.last_write) {
        (Some(a), Some(b)) => (b - a).as_secs_f64(),
        _ => 0.0,
    };
    RecvSummary {
        role: "recv",
        bytes: rx.bytes,
        packets: rx.packets,
        packets_lost: rx.lost,
        repaired: s.packets_repaired,
        tolerated: s.packets_tolerated,
        given_up: s.packets_given_up,
        segments: s.segments_delivered,
        segments_forced: s.segments_forced,
        violations: s.violations,
        duplicates: s.duplicates,
        complete: rx.ec.is_complete(),
        duration_s,
        rate_bps: rate(rx.bytes, duration_s),
        latency_ms: rx.latency.summary_ms(),
        tolerance: [t.w, t.e, t.b],
        deadline_ms: (deadline < us(NO_DEADLINE)).then(|| deadline.as_micros() as f64 / 1e3),
        errctl: s,
    }
}

/// The input of a transfer: the file at `path`, or standard input for `-`.
pub async fn open_input(path: &str) -> Result<Box<dyn AsyncRead + Unpin + Send>, TransferError> {
    if path == "-" {
        return Ok(Box::new(tokio::io::stdin()));
    }
    let bad = |e: std::io::Error| TransferError::Config(format!("cannot open input '{path}': {e}"));
    let f = tokio::fs::File::open(path).await.map_err(bad)?;
    if f.metadata().await.map_err(bad)?.is_dir() {
        return Err(TransferError::Config(format!(
            "input '{path}' is a directory"
        )));
    }
    Ok(Box::new(f))
}

/// The output of a transfer, from [`open_output`]: standard output, a file written
/// through a temporary file beside it, or a device or FIFO written in place.
///
/// Nothing on disk changes until the first byte is written: a file output then creates
/// a temporary file `.NAME.XXXXXX.part` in the folder of NAME, and only
/// [`Output::finish`] (after a successful transfer) renames it over NAME. Dropping the
/// output without `finish` (the transfer failed or was interrupted) removes the
/// temporary file: the destination is as it was before the run.
pub struct Output {
    state: OutState,
}

enum OutState {
    Stdout(tokio::io::Stdout),
    /// A path not yet opened: a temporary file beside `target` (`temp`), or `target`
    /// itself, a device or FIFO.
    Pending(Target),
    Opening(std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<Opened>> + Send>>),
    Open(Opened),
    /// Opening failed; the error was returned once.
    Failed,
}

#[derive(Clone)]
struct Target {
    /// Where the data ends up (symbolic links resolved).
    target: PathBuf,
    /// Through a temporary file renamed over `target` on success; `false` for a device
    /// or FIFO, written in place.
    temp: bool,
    /// Replace `target` if it exists (`--force`).
    overwrite: bool,
    /// The permissions of the file it replaces, kept exactly; else 0666 less the umask.
    mode: Option<std::fs::Permissions>,
}

struct Opened {
    file: tokio::fs::File,
    /// The temporary file, removed on drop unless persisted.
    temp: Option<tempfile::TempPath>,
    target: Target,
}

fn create(t: Target) -> std::io::Result<Opened> {
    use std::os::unix::fs::PermissionsExt;
    if !t.temp {
        let f = std::fs::OpenOptions::new().write(true).open(&t.target)?;
        return Ok(Opened {
            file: tokio::fs::File::from_std(f),
            temp: None,
            target: t,
        });
    }
    let dir = match t.target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    let name = t.target.file_name().unwrap_or_default().to_string_lossy();
    let (file, path) = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".part")
        .permissions(
            t.mode
                .clone()
                .unwrap_or_else(|| std::fs::Permissions::from_mode(0o666)),
        )
        .tempfile_in(dir)?
        .into_parts();
    if let Some(m) = &t.mode {
        // Exactly the replaced file's mode, whatever the umask took away.
        file.set_permissions(m.clone())?;
    }
    Ok(Opened {
        file: tokio::fs::File::from_std(file),
        temp: Some(path),
        target: t,
    })
}

impl Output {
    /// The destination, when it is a file written through a temporary file (left as
    /// it was unless [`Output::finish`] runs).
    pub fn staged(&self) -> Option<&std::path::Path> {
        let t = match &self.state {
            OutState::Pending(t) => t,
            OutState::Open(o) => &o.target,
            _ => return None,
        };
        t.temp.then_some(t.target.as_path())
    }

    /// Start creating the file if it is not open yet; ready when it is.
    fn poll_open(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        loop {
            match &mut self.state {
                OutState::Stdout(_) | OutState::Open(_) => return Poll::Ready(Ok(())),
                OutState::Failed => {
                    return Poll::Ready(Err(std::io::Error::other(
                        "the output could not be opened",
                    )))
                }
                OutState::Pending(t) => {
                    let t = t.clone();
                    self.state = OutState::Opening(Box::pin(async move {
                        let what = if t.temp {
                            format!(
                                "cannot create a temporary file beside '{}'",
                                t.target.display()
                            )
                        } else {
                            format!("cannot open '{}'", t.target.display())
                        };
                        tokio::task::spawn_blocking(move || create(t))
                            .await
                            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
                            .map_err(|e| std::io::Error::new(e.kind(), format!("{what}: {e}")))
                    }));
                }
                OutState::Opening(f) => match f.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(o)) => self.state = OutState::Open(o),
                    Poll::Ready(Err(e)) => {
                        self.state = OutState::Failed;
                        return Poll::Ready(Err(e));
                    }
                },
            }
        }
    }

    /// After a successful transfer: flush, and put a file in place (renamed over the
    /// destination; an empty stream makes an empty file). Without `overwrite`, a file
    /// that appeared at the destination meanwhile is kept and this fails.
    pub async fn finish(mut self) -> Result<(), TransferError> {
        std::future::poll_fn(|cx| self.poll_open(cx))
            .await
            .map_err(TransferError::Write)?;
        let OutState::Open(mut o) = std::mem::replace(&mut self.state, OutState::Failed) else {
            if let OutState::Stdout(mut s) = std::mem::replace(&mut self.state, OutState::Failed) {
                s.flush().await.map_err(TransferError::Write)?;
            }
            return Ok(());
        };
        o.file.flush().await.map_err(TransferError::Write)?;
        let Some(temp) = o.temp else {
            return Ok(());
        };
        // The data is on disk before the name points at it.
        o.file.sync_all().await.map_err(TransferError::Write)?;
        let target = o.target.target.clone();
        let overwrite = o.target.overwrite;
        let r = tokio::task::spawn_blocking(move || {
            if overwrite {
                temp.persist(&target)
            } else {
                temp.persist_noclobber(&target)
            }
        })
        .await
        .map_err(|e| TransferError::Write(std::io::Error::other(e)))?;
        r.map_err(|e| {
            let t = o.target.target.display();
            if e.error.kind() == std::io::ErrorKind::AlreadyExists {
                TransferError::Config(format!(
                    "output '{t}' appeared during the transfer and is kept; the data received is discarded (use --force to replace it)"
                ))
            } else {
                TransferError::Write(std::io::Error::new(
                    e.error.kind(),
                    format!("cannot rename the received file to '{t}': {}", e.error),
                ))
            }
        })
        // On error the temporary file (`e.path`) is dropped, hence removed.
    }
}

impl AsyncWrite for Output {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::ready!(self.poll_open(cx))?;
        match &mut self.state {
            OutState::Stdout(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            OutState::Open(o) => std::pin::Pin::new(&mut o.file).poll_write(cx, buf),
            _ => unreachable!("poll_open leaves the output open"),
        }
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match &mut self.state {
            OutState::Stdout(s) => std::pin::Pin::new(s).poll_flush(cx),
            OutState::Open(o) => std::pin::Pin::new(&mut o.file).poll_flush(cx),
            // Nothing written yet: nothing to flush (and nothing to create yet).
            _ => std::task::Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match &mut self.state {
            OutState::Stdout(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            OutState::Open(o) => std::pin::Pin::new(&mut o.file).poll_shutdown(cx),
            _ => std::task::Poll::Ready(Ok(())),
        }
    }
}

/// The output of a transfer: standard output for `-`, else the file at `path`. Only
/// checks, and changes nothing on disk (see [`Output`]): a folder, a missing folder or an
/// existing file without `overwrite` is an error naming the path. An existing device
/// or FIFO (e.g. `/dev/null`, `/dev/stdout`) is written in place.
pub async fn open_output(path: &str, overwrite: bool) -> Result<Output, TransferError> {
    if path == "-" {
        return Ok(Output {
            state: OutState::Stdout(tokio::io::stdout()),
        });
    }
    let p = PathBuf::from(path);
    let bad = |e: std::io::Error| TransferError::Config(format!("output '{path}': {e}"));
    let state = match tokio::fs::metadata(&p).await {
        Ok(m) if m.is_dir() => {
            return Err(TransferError::Config(format!(
                "output '{path}' is a folder; give a file name"
            )))
        }
        Ok(m) if m.is_file() && !overwrite => {
            return Err(TransferError::Config(format!(
                "output '{path}' exists and is kept; choose another name, or give --force to replace it"
            )))
        }
        Ok(m) if m.is_file() => Target {
            // Replace the file a symbolic link points at, not the link.
            target: tokio::fs::canonicalize(&p).await.map_err(bad)?,
            temp: true,
            overwrite,
            mode: Some(m.permissions()),
        },
        Ok(_) => Target {
            target: p,
            temp: false,
            overwrite,
            mode: None,
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            new_file_target(path, p, overwrite).await?
        }
        Err(e) => return Err(bad(e)),
    };
    Ok(Output {
        state: OutState::Pending(state),
    })
}

/// The target for `p` (given as `path`), a file that does not exist yet: written
/// through a temporary file, once its folder is checked to exist and be a folder.
async fn new_file_target(path: &str, p: PathBuf, overwrite: bool) -> Result<Target, TransferError> {
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    match tokio::fs::metadata(&dir).await {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(TransferError::Config(format!(
                "output '{path}': '{}' is not a folder",
                dir.display()
            )))
        }
        Err(e) => {
            return Err(TransferError::Config(format!(
                "output '{path}': folder '{}': {e}",
                dir.display()
            )))
        }
    }
    Ok(Target {
        target: p,
        temp: true,
        overwrite,
        mode: None,
    })
}

/// Session options as a command line gives them: a config file, or channels as
/// `LOCAL,REMOTE` with a key file, plus overrides. Shared by `braid bench`, `braid
/// send` and `braid recv`.
#[derive(Clone, Debug, Default)]
pub struct SessionOptions {
    /// A file with `[session]` and `[[channel]]` (a `[tunnel]` section is ignored).
    pub config: Option<PathBuf>,
    /// Channels as `LOCAL_ADDR,REMOTE_ADDR`, in the same order at both ends.
    pub channels: Vec<String>,
    /// The pre-shared key file (with `channels`).
    pub key_file: Option<PathBuf>,
    /// Receiver mode.
    pub mode: Option<String>,
    /// Scheduler.
    pub scheduler: Option<String>,
    /// Channel weights, comma-separated.
    pub weights: Option<String>,
    /// Heartbeat interval.
    pub heartbeat: Option<String>,
    /// Down after this long without traffic.
    pub dead_after: Option<String>,
}

impl SessionOptions {
    /// The session configuration, checked; errors name the option at fault.
    pub fn session_config(&self) -> Result<SessionConfig, String> {
        let mut cfg = match (&self.config, self.channels.is_empty()) {
            (Some(_), false) => return Err("give either --config or --channel, not both".into()),
            (Some(p), true) => FileConfig::load(p).map_err(|e| e.to_string())?.session,
            (None, true) => {
                return Err(
                    "no channels: give --config FILE or --channel LOCAL,REMOTE (one per channel)"
                        .into(),
                )
            }
            (None, false) => self.channels_config()?,
        };
        // A transfer carries its own error control (seed 002: loss tolerance,
        // deadlines, selective retransmission end to end) and a byte stream, not IP
        // packets. In-bond repair would hold data below it past its deadlines and hide
        // the losses its tolerance is about; AQM's signals are for an inner TCP, and a
        // chunk that happened to look like an IP header must be neither marked nor
        // dropped. Both tunnel defaults are off here.
        cfg.core.arq = None;
        cfg.core.aqm = None;
        if let Some(m) = &self.mode {
            cfg.core.mode = units::parse_mode(m).map_err(|e| format!("--mode: {e}"))?;
        }
        if let Some(s) = &self.scheduler {
            cfg.core.scheduler =
                units::parse_scheduler(s).map_err(|e| format!("--scheduler: {e}"))?;
        }
        if let Some(w) = &self.weights {
            let ws = w
                .split(',')
                .map(|x| {
                    x.trim()
                        .parse::<u32>()
                        .map_err(|_| format!("--weights: '{x}' is not a whole number"))
                })
                .collect::<Result<Vec<u32>, String>>()?;
            if ws.len() != cfg.channels.len() {
                let n = cfg.channels.len();
                return Err(format!("--weights: {} weights for {n} channels", ws.len()));
            }
            for (c, w) in cfg.channels.iter_mut().zip(ws) {
                c.weight = w;
            }
        }
        if let Some(h) = &self.heartbeat {
            cfg.core.heartbeat =
                units::parse_duration_us(h).map_err(|e| format!("--heartbeat: {e}"))?;
        }
        if let Some(d) = &self.dead_after {
            cfg.core.dead_after =
                units::parse_duration_us(d).map_err(|e| format!("--dead-after: {e}"))?;
        }
        cfg.validate()
            .map_err(|e| format!("session configuration: {e}"))?;
        Ok(cfg)
    }

    fn channels_config(&self) -> Result<SessionConfig, String> {
        let mut chans = Vec::new();
        for (i, c) in self.channels.iter().enumerate() {
            let (l, r) = c
                .split_once(',')
                .ok_or_else(|| format!("--channel '{c}': expected LOCAL,REMOTE"))?;
            let addr = |x: &str| {
                x.trim()
                    .parse()
                    .map_err(|_| format!("--channel '{c}': '{x}' is not an IP:PORT address"))
            };
            chans.push(ChannelConfig::new(format!("ch{i}"), addr(l)?, addr(r)?));
        }
        let file = self.key_file.as_ref().ok_or_else(|| {
            "--key-file is required with --channel (both ends use the same key)".to_string()
        })?;
        let key = crate::keys::read_file(file).map_err(|e| format!("--key-file: {e}"))?;
        Ok(SessionConfig::new(chans, key.to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerances_parse_or_explain() {
        assert_eq!(parse_tolerance("64,0,0"), Ok(Tolerance::reliable(64)));
        assert_eq!(
            parse_tolerance(" 100, 1,1"),
            Ok(Tolerance { w: 100, e: 1, b: 1 })
        );
        for bad in ["", "64", "64,0", "0,0,0", "a,b,c", "64,0,0,0", "70000,0,0"] {
            assert!(parse_tolerance(bad).is_err(), "{bad}");
        }
        assert!(parse_tolerance("8,9,1")
            .unwrap_err()
            .contains("cannot exceed"));
    }

    #[test]
    fn offers_round_trip_and_reject_junk() {
        let cfg = TransferConfig {
            tolerance: Tolerance { w: 100, e: 2, b: 1 },
            deadline: Some(StdDuration::from_millis(1500)),
            ..TransferConfig::default()
        };
        let ec = cfg.errctl().unwrap();
        let m = cfg.offer(&ec);
        assert_eq!(parse_offer(&m), Some(ec));
        assert_eq!(parse_offer(&m[..m.len() - 1]), None);
        let mut zero_w = m.clone();
        zero_w[4..6].copy_from_slice(&[0, 0]);
        assert_eq!(parse_offer(&zero_w), None);
        assert_eq!(parse_offer(&accept_msg()), None);
    }

    #[test]
    fn histogram_quantiles_within_two_percent() {
        let mut h = Histogram::new();
        for v in 1..=100_000u64 {
            h.record(v);
        }
        let close = |a: u64, b: u64| (a as f64 - b as f64).abs() <= b as f64 * 0.02;
        assert!(close(h.quantile(0.5), 50_000), "{}", h.quantile(0.5));
        assert!(close(h.quantile(0.99), 99_000), "{}", h.quantile(0.99));
        assert_eq!(h.max, 100_000);
        for v in [0u64, 1, 63, 64, 65, 1000, 123_456_789] {
            let b = Histogram::bucket(v);
            assert!(Histogram::value(b) <= v && v - Histogram::value(b) <= v / 64);
        }
    }
}
