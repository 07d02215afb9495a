//! Test traffic: a generator and a sink with the same payload and report over a braid
//! [`Session`] or a plain UDP socket (the baseline). `braid bench` is these plus argument
//! parsing; the lab reads their reports as [`SendReport`] and [`SinkReport`].
//!
//! Each data payload starts with a one-byte type (1), a sequence number (u64) and the
//! sender's wall-clock send time in nanoseconds (u64), big-endian, padded to the chosen
//! size. The end of a run is announced by a type-2 message carrying the count of data
//! messages sent (sent five times). The sink reports goodput, loss, out-of-order
//! arrivals, duplicates and one-way latency (meaningful when both ends share a clock,
//! e.g. on one host or in network namespaces of one host).

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::net::UdpSocket;

use crate::session::{Session, SessionError};
use crate::stats::SessionStats;

/// First byte of a data message.
pub const TYPE_DATA: u8 = 1;
/// First byte of the end-of-run message.
pub const TYPE_END: u8 = 2;
/// Bytes of the header every message starts with.
pub const HEADER: usize = 17;
/// Highest sequence number the sink tracks (its bitmap would otherwise grow with a
/// forged number: 2^32 messages is far beyond any run).
const MAX_SEQ: u64 = 1 << 32;

/// Why a pattern or a run is refused.
#[derive(Debug, thiserror::Error)]
pub enum TrafficError {
    /// A bad pattern.
    #[error("{0}")]
    Pattern(String),
    /// The session failed.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// A socket failed.
    #[error("{what}: {err}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        err: std::io::Error,
    },
}

fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// What to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Pattern {
    /// Message sizes, used in turn.
    pub sizes: Vec<usize>,
    /// Stop after this many messages.
    pub count: Option<u64>,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// One message every this long (none: as fast as possible).
    pub interval: Option<Duration>,
}

impl Pattern {
    /// A pattern of these sizes (each at least [`HEADER`], at most `max`), at `rate`
    /// bit/s or `pps` messages/s if given, for `count` messages or `duration` (5 s if
    /// neither is given).
    pub fn new(
        sizes: Vec<usize>,
        count: Option<u64>,
        duration: Option<Duration>,
        rate_bps: Option<f64>,
        pps: Option<f64>,
        max: usize,
    ) -> Result<Pattern, TrafficError> {
        let bad = |m: String| Err(TrafficError::Pattern(m));
        if sizes.is_empty() {
            return bad("--size: no sizes given".into());
        }
        for &s in &sizes {
            if s < HEADER {
                return bad(format!(
                    "--size: {s} is below the {HEADER}-byte bench header"
                ));
            }
            if s > max {
                return bad(format!(
                    "--size: {s} bytes does not fit: the largest message is {max} bytes"
                ));
            }
        }
        let duration = match (duration, count) {
            (Some(d), _) => Some(d),
            (None, None) => Some(Duration::from_secs(5)),
            (None, Some(_)) => None,
        };
        let mean = sizes.iter().sum::<usize>() as f64 / sizes.len() as f64;
        let pps = match (rate_bps, pps) {
            (Some(_), Some(_)) => return bad("give --rate or --pps, not both".into()),
            (Some(r), None) => Some(r / (mean * 8.0)),
            (None, Some(p)) if p > 0.0 && p.is_finite() => Some(p),
            (None, Some(_)) => return bad("--pps: must be above zero".into()),
            (None, None) => None,
        };
        Ok(Pattern {
            sizes,
            count,
            duration,
            interval: pps.map(|p| Duration::from_secs_f64(1.0 / p)),
        })
    }

    /// Run the pattern, calling `emit` for each message, until its count or duration
    /// or until `stop` resolves; returns (messages, bytes, elapsed).
    pub async fn run<F, Fut>(
        &self,
        mut emit: F,
        stop: impl Future,
    ) -> Result<(u64, u64, Duration), TrafficError>
    where
        F: FnMut(Bytes) -> Fut,
        Fut: Future<Output = Result<(), TrafficError>>,
    {
        let start = Instant::now();
        let mut buf = vec![0u8; *self.sizes.iter().max().unwrap_or(&HEADER)];
        let (mut n, mut bytes) = (0u64, 0u64);
        let end = tokio::time::sleep(self.duration.unwrap_or(Duration::from_secs(u64::MAX / 4)));
        tokio::pin!(end);
        tokio::pin!(stop);
        loop {
            if self.count.is_some_and(|c| n >= c) {
                break;
            }
            if n % 64 == 0 {
                // Check the clock and the stop signal without a syscall per message.
                tokio::select! {
                    biased;
                    _ = &mut end => break,
                    _ = &mut stop => break,
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

/// The end-of-run message for `count` data messages.
pub fn end_message(count: u64) -> Bytes {
    let mut v = vec![TYPE_END; HEADER];
    v[1..9].copy_from_slice(&count.to_be_bytes());
    v[9..17].copy_from_slice(&wall_ns().to_be_bytes());
    Bytes::from(v)
}

/// What a sender did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SendReport {
    /// `send` or `udp-send`.
    pub role: String,
    /// Data messages sent.
    pub packets: u64,
    /// Their bytes.
    pub bytes: u64,
    /// How long sending took.
    pub duration_s: f64,
    /// `bytes` × 8 / `duration_s`.
    pub offered_bps: f64,
    /// `packets` / `duration_s`.
    pub offered_pps: f64,
    /// The session's state at the end (braid only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub session: Option<SessionStats>,
}

impl SendReport {
    fn new(role: &str, packets: u64, bytes: u64, elapsed: Duration) -> SendReport {
        let secs = elapsed.as_secs_f64().max(1e-9);
        SendReport {
            role: role.into(),
            packets,
            bytes,
            duration_s: secs,
            offered_bps: bytes as f64 * 8.0 / secs,
            offered_pps: packets as f64 / secs,
            session: None,
        }
    }

    /// One line for a person.
    pub fn summary(&self) -> String {
        format!(
            "sent {} messages, {} bytes in {:.3} s: {:.1} Mbit/s, {:.1} kpps offered",
            self.packets,
            self.bytes,
            self.duration_s,
            self.offered_bps / 1e6,
            self.offered_pps / 1e3
        )
    }
}

/// One-way latency quantiles, microseconds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Latency {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Maximum.
    pub max: f64,
}

/// What a sink received.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SinkReport {
    /// `sink` or `udp-sink`.
    pub role: String,
    /// Distinct data messages received.
    pub packets: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Messages the sender said it sent (or the highest number seen + 1).
    pub expected: u64,
    /// `expected − packets`.
    pub lost: u64,
    /// `lost / expected`.
    pub loss_ratio: f64,
    /// Arrivals of a number below the highest seen.
    pub out_of_order: u64,
    /// Arrivals of a number already seen.
    pub duplicates: u64,
    /// Messages that are not bench messages.
    pub malformed: u64,
    /// From the first to the last arrival.
    pub duration_s: f64,
    /// `bytes` × 8 / `duration_s`.
    pub goodput_bps: f64,
    /// `packets` / `duration_s`.
    pub pps: f64,
    /// The end-of-run message arrived.
    pub end_seen: bool,
    /// One-way latency.
    pub latency_us: Option<Latency>,
    /// The session's state at the end (braid only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub session: Option<SessionStats>,
}

impl SinkReport {
    /// A table for a person.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{:<14} {:>12} {:>10} {:>8} {:>10} {:>8} {:>12} {:>10} {:>9} {:>9} {:>9}\n",
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
        s += &format!(
            "{:<14} {:>12} {:>10} {:>8.3} {:>10} {:>8} {:>7.1} Mb/s {:>10.1} {:>7.0}us {:>7.0}us {:>7.0}us\n",
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
            s +=
                "(no end-of-run message seen: expected count is the highest sequence number + 1)\n";
        }
        s
    }
}

/// Sink-side accounting.
#[derive(Default)]
pub struct Tally {
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

impl Tally {
    /// Has anything arrived yet?
    pub fn started(&self) -> bool {
        self.first.is_some()
    }

    /// Account one message; true once the end message has arrived.
    pub fn on_msg(&mut self, m: &[u8], now: Instant) -> bool {
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
            TYPE_DATA if seq < MAX_SEQ => {}
            _ => {
                self.malformed += 1;
                return false;
            }
        }
        let (w, b) = ((seq / 64) as usize, seq % 64);
        if w >= self.seen.len() {
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

    /// The report.
    pub fn report(mut self, role: &str, session: Option<SessionStats>) -> SinkReport {
        let expected = self
            .end_count
            .unwrap_or_else(|| self.highest.map_or(0, |h| h + 1));
        let lost = expected.saturating_sub(self.packets);
        let dur = match (self.first, self.last) {
            (Some(f), Some(l)) => (l - f).as_secs_f64(),
            _ => 0.0,
        };
        let latency_us = (!self.latency_ns.is_empty()).then(|| {
            self.latency_ns.sort_unstable();
            let q = |p: f64| {
                let i = ((self.latency_ns.len() - 1) as f64 * p).round() as usize;
                self.latency_ns[i] as f64 / 1e3
            };
            Latency {
                p50: q(0.5),
                p90: q(0.9),
                p99: q(0.99),
                max: q(1.0),
            }
        });
        let per_s = |x: f64| if dur > 0.0 { x / dur } else { 0.0 };
        SinkReport {
            role: role.into(),
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
            goodput_bps: per_s(self.bytes as f64 * 8.0),
            pps: per_s(self.packets as f64),
            end_seen: self.end_count.is_some(),
            latency_us,
            session,
        }
    }
}

/// Send `pattern` over a session whose peer has answered, then the end message.
pub async fn session_send(
    session: &mut Session,
    pattern: &Pattern,
    stop: impl Future,
) -> Result<SendReport, TrafficError> {
    let sender = session.sender();
    let (n, bytes, elapsed) = pattern
        .run(
            |m| {
                let s = sender.clone();
                async move { s.send(m).await.map_err(TrafficError::from) }
            },
            stop,
        )
        .await?;
    for _ in 0..5 {
        sender.send(end_message(n)).await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let markers and idle flushes go out.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut r = SendReport::new("send", n, bytes, elapsed);
    r.session = session.stats().await.ok();
    Ok(r)
}

/// Receive over a session until the end message, `idle` without traffic after the
/// first message (`first_wait` before it), `deadline`, or `stop`.
pub async fn session_sink(
    session: &mut Session,
    idle: Duration,
    first_wait: Duration,
    deadline: tokio::time::Instant,
    stop: impl Future,
) -> SinkReport {
    let mut tally = Tally::default();
    tokio::pin!(stop);
    loop {
        let wait = if tally.started() { idle } else { first_wait };
        tokio::select! {
            m = tokio::time::timeout(wait, session.recv()) => match m {
                Ok(Some(m)) => {
                    if tally.on_msg(&m, Instant::now()) {
                        break;
                    }
                }
                Ok(None) | Err(_) => break,
            },
            _ = tokio::time::sleep_until(deadline) => break,
            _ = &mut stop => break,
        }
    }
    let stats = session.stats().await.ok();
    tally.report("sink", stats)
}

/// Send `pattern` on one plain UDP socket from `bind` to `to`, then the end message.
pub async fn udp_send(
    to: SocketAddr,
    bind: SocketAddr,
    pattern: &Pattern,
    stop: impl Future,
) -> Result<SendReport, TrafficError> {
    let io = |what: String| move |err| TrafficError::Io { what, err };
    let sock = UdpSocket::bind(bind)
        .await
        .map_err(io(format!("cannot bind {bind}")))?;
    sock.connect(to)
        .await
        .map_err(io(format!("cannot aim at {to}")))?;
    let sock = std::sync::Arc::new(sock);
    let (n, bytes, elapsed) = pattern
        .run(
            |m| {
                let s = sock.clone();
                async move {
                    // The peer's socket may not exist yet (ICMP refusals): not fatal.
                    let _ = s.send(&m).await;
                    Ok(())
                }
            },
            stop,
        )
        .await?;
    for _ in 0..5 {
        let _ = sock.send(&end_message(n)).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(SendReport::new("udp-send", n, bytes, elapsed))
}

/// Receive plain UDP on `bind` until the end message, `idle` without traffic after
/// the first message, `deadline`, or `stop`.
pub async fn udp_sink(
    bind: SocketAddr,
    idle: Duration,
    deadline: tokio::time::Instant,
    stop: impl Future,
) -> Result<SinkReport, TrafficError> {
    let io = |what: String| move |err| TrafficError::Io { what, err };
    let sock = {
        use socket2::{Domain, Protocol, Socket, Type};
        let s = Socket::new(Domain::for_address(bind), Type::DGRAM, Some(Protocol::UDP))
            .map_err(io("socket".into()))?;
        let _ = s.set_recv_buffer_size(4 << 20);
        s.set_nonblocking(true).map_err(io("socket".into()))?;
        s.bind(&bind.into())
            .map_err(io(format!("cannot bind {bind}")))?;
        UdpSocket::from_std(s.into()).map_err(io("socket".into()))?
    };
    let mut tally = Tally::default();
    let mut buf = vec![0u8; 65536];
    tokio::pin!(stop);
    loop {
        let wait = if tally.started() {
            idle
        } else {
            Duration::from_secs(u64::MAX / 4)
        };
        tokio::select! {
            r = tokio::time::timeout(wait, sock.recv(&mut buf)) => match r {
                Ok(Ok(n)) => {
                    if tally.on_msg(&buf[..n], Instant::now()) {
                        break;
                    }
                }
                Ok(Err(_)) => continue,
                Err(_) => break,
            },
            _ = tokio::time::sleep_until(deadline) => break,
            _ = &mut stop => break,
        }
    }
    Ok(tally.report("udp-sink", None))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(seq: u64, size: usize) -> Vec<u8> {
        let mut v = vec![0u8; size];
        v[0] = TYPE_DATA;
        v[1..9].copy_from_slice(&seq.to_be_bytes());
        v[9..17].copy_from_slice(&wall_ns().to_be_bytes());
        v
    }

    #[test]
    fn tally_counts_loss_reorder_duplicates_and_garbage() {
        let mut t = Tally::default();
        let now = Instant::now();
        for s in [0u64, 1, 3, 2, 3, 5] {
            assert!(!t.on_msg(&msg(s, 100), now));
        }
        assert!(!t.on_msg(b"short", now));
        assert!(
            !t.on_msg(&msg(u64::MAX, 100), now),
            "a forged number is refused"
        );
        assert!(t.on_msg(&end_message(7), now));
        let r = t.report("sink", None);
        assert_eq!((r.packets, r.expected, r.lost), (5, 7, 2));
        assert_eq!((r.out_of_order, r.duplicates, r.malformed), (1, 1, 2));
        assert!(r.end_seen && r.latency_us.is_some());
        let back: SinkReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back.lost, 2);
    }

    #[test]
    fn patterns_check_sizes_and_rates() {
        assert!(Pattern::new(vec![10], None, None, None, None, 1500).is_err());
        assert!(Pattern::new(vec![2000], None, None, None, None, 1500).is_err());
        assert!(Pattern::new(vec![100], None, None, Some(1e6), Some(5.0), 1500).is_err());
        let p = Pattern::new(vec![1000], None, None, Some(8e6), None, 1500).unwrap();
        assert_eq!(p.interval, Some(Duration::from_millis(1)));
        assert_eq!(p.duration, Some(Duration::from_secs(5)));
        let p = Pattern::new(vec![100], Some(10), None, None, None, 1500).unwrap();
        assert_eq!(p.duration, None);
    }

    #[tokio::test]
    async fn udp_pair_delivers_a_counted_run() {
        let probe = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let at = probe.local_addr().unwrap();
        drop(probe);
        let sink = tokio::spawn(udp_sink(
            at,
            Duration::from_millis(500),
            tokio::time::Instant::now() + Duration::from_secs(10),
            std::future::pending::<()>(),
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let p = Pattern::new(vec![100, 300], Some(500), None, None, Some(20_000.0), 1500).unwrap();
        let s = udp_send(
            at,
            "127.0.0.1:0".parse().unwrap(),
            &p,
            std::future::pending::<()>(),
        )
        .await
        .unwrap();
        assert_eq!(s.packets, 500);
        let r = sink.await.unwrap().unwrap();
        assert!(r.end_seen);
        assert_eq!(r.expected, 500);
        assert!(r.packets >= 490, "{} of 500 on loopback", r.packets);
    }
}
