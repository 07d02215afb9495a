//! The call row (`lab bench --call`, issue 32): a VoIP-like flow, a [`SIZE`]-byte UDP
//! datagram every [`EVERY`] (50 a second, G.711's packet every 20 ms), from the
//! client's namespace to the server's, each numbered and stamped with its send time.
//! Sender and receiver are threads of the lab's own process that enter the namespaces
//! (`setns`), so a datagram's one-way delay is its arrival less its send time on one
//! clock (`Instant`, CLOCK_MONOTONIC).
//!
//! Measured twice: over the lowest-delay link alone with nothing else on it (the
//! reference: that link's idle delay), and through the tunnel in each mode beside the
//! mode's single TCP flow, for the flow's whole length. The tunnel's defaults decide
//! the call's policy (a small, slow UDP flow is classified `redundant`).
//!
//! With [`Transport::Tcp`] the same records go over one TCP connection instead
//! (`TCP_NODELAY` at both ends), as a remote shell, a game or a chat sends: an
//! interactive connection beside the bulk one. Through the tunnel it is carried as a
//! stream by default, and its one-way delay is each record's, from its write to the
//! read that completes it.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::field::traffic::enter;
use crate::spec::LinkSpec;
use crate::topo::{self, LabError, NS_CLIENT, NS_SERVER};

/// The call's port at the receiver (RTP's customary 5004).
pub const PORT: u16 = 5004;
/// The TCP call's port at the receiver.
pub const TCP_PORT: u16 = 5005;
/// How long the TCP call's sender tries to connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes of UDP payload in each datagram.
pub const SIZE: usize = 200;
/// One datagram this often (50 a second).
pub const EVERY: Duration = Duration::from_millis(20);
/// How long the receiver waits for late datagrams after the last was sent.
const GRACE: Duration = Duration::from_secs(2);
/// The idle reference's length.
pub const IDLE_LENGTH: Duration = Duration::from_secs(5);
const MAGIC: [u8; 4] = *b"BRC1";

/// What carries the call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// UDP datagrams: a VoIP-like flow.
    #[default]
    Udp,
    /// Records over one TCP connection: an interactive connection.
    Tcp,
}

impl Transport {
    /// Its name in the JSON and the table.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
        }
    }

    /// Read back [`Transport::name`].
    pub fn from_name(s: &str) -> Option<Transport> {
        [Transport::Udp, Transport::Tcp]
            .into_iter()
            .find(|t| t.name() == s)
    }

    /// The receiver's port.
    pub fn port(self) -> u16 {
        match self {
            Transport::Udp => PORT,
            Transport::Tcp => TCP_PORT,
        }
    }
}

/// Cuts a TCP byte stream into the call's records, however the reads split it.
#[derive(Default)]
struct Records {
    partial: Vec<u8>,
}

impl Records {
    /// The records `bytes` completes (number and send time), in order.
    fn push(&mut self, bytes: &[u8]) -> Vec<(u64, u64)> {
        self.partial.extend_from_slice(bytes);
        let whole = self.partial.len() / SIZE * SIZE;
        let out = self.partial[..whole]
            .chunks(SIZE)
            .filter_map(parse)
            .collect();
        self.partial.drain(..whole);
        out
    }
}

/// A call's figures: what was sent, what arrived, and the one-way delay of what
/// arrived (each datagram's first copy).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CallStats {
    /// Datagrams sent.
    pub sent: u64,
    /// Distinct datagrams that arrived.
    pub delivered: u64,
    /// Sent and never arrived.
    pub lost: u64,
    /// Copies of a datagram that had arrived already (the tunnel should deliver none).
    pub duplicates: u64,
    /// Datagrams that arrived after one sent later than them.
    pub reordered: u64,
    /// Median one-way delay, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Largest, ms.
    pub max_ms: f64,
}

/// One datagram as the receiver took it: its number, its send time and its arrival,
/// µs on the lab's clock.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Arrival {
    /// Sequence number.
    pub seq: u64,
    /// Send time written in it.
    pub sent_us: u64,
    /// When it arrived.
    pub at_us: u64,
}

impl CallStats {
    /// The figures of a call of `sent` datagrams (numbered 0 to `sent - 1`) from its
    /// arrivals in the order they came: a number seen again is a duplicate (its delay
    /// not counted), one outside the call is ignored.
    pub fn of(sent: u64, arrivals: &[Arrival]) -> CallStats {
        let mut seen = vec![false; sent as usize];
        let (mut duplicates, mut reordered, mut highest) = (0, 0, None::<u64>);
        let mut delays = Vec::with_capacity(arrivals.len());
        for a in arrivals {
            let Some(s) = seen.get_mut(a.seq as usize) else {
                continue;
            };
            if *s {
                duplicates += 1;
                continue;
            }
            *s = true;
            if highest.is_some_and(|h| a.seq < h) {
                reordered += 1;
            }
            highest = highest.max(Some(a.seq));
            delays.push(a.at_us.saturating_sub(a.sent_us));
        }
        let delivered = delays.len() as u64;
        // Nearest-rank quantiles, as the stream row's.
        let l = crate::stream::Latency::of(&delays);
        CallStats {
            sent,
            delivered,
            lost: sent - delivered,
            duplicates,
            reordered,
            p50_ms: l.as_ref().map_or(0.0, |l| l.p50),
            p99_ms: l.as_ref().map_or(0.0, |l| l.p99),
            max_ms: l.as_ref().map_or(0.0, |l| l.max),
        }
    }

    /// Lost, in percent of sent.
    pub fn loss_pct(&self) -> f64 {
        100.0 * self.lost as f64 / self.sent.max(1) as f64
    }

    /// Each figure the median over `runs` (counts rounded); `None` if none.
    pub fn median(runs: &[CallStats]) -> Option<CallStats> {
        let m = |f: &dyn Fn(&CallStats) -> f64| {
            super::Spread::of(&runs.iter().map(f).collect::<Vec<_>>()).map(|s| s.median)
        };
        let n = |f: &dyn Fn(&CallStats) -> u64| m(&|c| f(c) as f64).map(|v| v.round() as u64);
        Some(CallStats {
            sent: n(&|c| c.sent)?,
            delivered: n(&|c| c.delivered)?,
            lost: n(&|c| c.lost)?,
            duplicates: n(&|c| c.duplicates)?,
            reordered: n(&|c| c.reordered)?,
            p50_ms: m(&|c| c.p50_ms)?,
            p99_ms: m(&|c| c.p99_ms)?,
            max_ms: m(&|c| c.max_ms)?,
        })
    }

    /// The JSON object.
    pub fn to_json(&self) -> Value {
        json!({
            "sent": self.sent,
            "delivered": self.delivered,
            "lost": self.lost,
            "loss_pct": self.loss_pct(),
            "duplicates": self.duplicates,
            "reordered": self.reordered,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "max_ms": self.max_ms,
        })
    }

    /// Read back [`CallStats::to_json`].
    pub fn from_json(v: &Value) -> Option<CallStats> {
        Some(CallStats {
            sent: v["sent"].as_u64()?,
            delivered: v["delivered"].as_u64()?,
            lost: v["lost"].as_u64()?,
            duplicates: v["duplicates"].as_u64().unwrap_or(0),
            reordered: v["reordered"].as_u64().unwrap_or(0),
            p50_ms: v["p50_ms"].as_f64()?,
            p99_ms: v["p99_ms"].as_f64()?,
            max_ms: v["max_ms"].as_f64()?,
        })
    }
}

fn datagram(seq: u64, sent_us: u64) -> [u8; SIZE] {
    let mut d = [0u8; SIZE];
    d[..4].copy_from_slice(&MAGIC);
    d[4..12].copy_from_slice(&seq.to_be_bytes());
    d[12..20].copy_from_slice(&sent_us.to_be_bytes());
    d
}

/// A datagram's number and send time, if it is one of the call's.
fn parse(d: &[u8]) -> Option<(u64, u64)> {
    if d.len() != SIZE || d[..4] != MAGIC {
        return None;
    }
    Some((
        u64::from_be_bytes(d[4..12].try_into().ok()?),
        u64::from_be_bytes(d[12..20].try_into().ok()?),
    ))
}

fn fail(reason: impl Into<String>) -> LabError {
    LabError::Command {
        cmd: "the call".into(),
        reason: reason.into(),
    }
}

/// A call under way: its sender and its receiver.
pub struct Call {
    stop: Arc<AtomicBool>,
    sender: Option<JoinHandle<Result<u64, String>>>,
    receiver: Option<JoinHandle<()>>,
    arrivals: Arc<Mutex<Vec<Arrival>>>,
}

/// Microseconds on the lab's clock (one for sender and receiver).
type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// Keep an arrival.
fn note(arrivals: &Mutex<Vec<Arrival>>, seq: u64, sent_us: u64, at_us: u64) {
    arrivals
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Arrival {
            seq,
            sent_us,
            at_us,
        });
}

/// The receiving end, bound at `to` in the namespace it runs in.
enum Receiver {
    Udp(UdpSocket),
    Tcp(TcpListener),
}

impl Receiver {
    fn bind(t: Transport, to: SocketAddr) -> Result<Receiver, String> {
        let e = |e: std::io::Error| format!("binding {to}: {e}");
        Ok(match t {
            Transport::Udp => {
                let s = UdpSocket::bind(to).map_err(e)?;
                s.set_read_timeout(Some(Duration::from_millis(20)))
                    .map_err(|e| e.to_string())?;
                Receiver::Udp(s)
            }
            Transport::Tcp => {
                let l = TcpListener::bind(to).map_err(e)?;
                l.set_nonblocking(true).map_err(|e| e.to_string())?;
                Receiver::Tcp(l)
            }
        })
    }

    /// Take what arrives until `stop`.
    fn run(self, stop: &AtomicBool, clock: &Clock, arrivals: &Mutex<Vec<Arrival>>) {
        let mut buf = [0u8; 4096];
        match self {
            Receiver::Udp(s) => {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(n) = s.recv(&mut buf) else { continue };
                    let at_us = clock();
                    if let Some((seq, sent_us)) = parse(&buf[..n]) {
                        note(arrivals, seq, sent_us, at_us);
                    }
                }
            }
            Receiver::Tcp(l) => {
                let Some(mut c) = accept(&l, stop) else {
                    return;
                };
                let mut records = Records::default();
                while !stop.load(Ordering::Relaxed) {
                    let n = match c.read(&mut buf) {
                        Ok(0) => return,
                        Ok(n) => n,
                        Err(e)
                            if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
                        {
                            continue
                        }
                        Err(_) => return,
                    };
                    let at_us = clock();
                    for (seq, sent_us) in records.push(&buf[..n]) {
                        note(arrivals, seq, sent_us, at_us);
                    }
                }
            }
        }
    }
}

/// The TCP call's connection, once the sender made it (`None` if stopped first).
fn accept(l: &TcpListener, stop: &AtomicBool) -> Option<TcpStream> {
    while !stop.load(Ordering::Relaxed) {
        match l.accept() {
            Ok((c, _)) => {
                let ok = c.set_nonblocking(false).is_ok()
                    && c.set_nodelay(true).is_ok()
                    && c.set_read_timeout(Some(Duration::from_millis(20))).is_ok();
                return ok.then_some(c);
            }
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
    None
}

/// The sending end: a UDP socket bound at `from`, or a TCP connection to `to`.
enum Sender {
    Udp(UdpSocket, SocketAddr),
    Tcp(TcpStream),
}

impl Sender {
    fn open(t: Transport, from: SocketAddr, to: SocketAddr) -> Result<Sender, String> {
        Ok(match t {
            Transport::Udp => {
                let s = UdpSocket::bind(from).map_err(|e| format!("binding {from}: {e}"))?;
                Sender::Udp(s, to)
            }
            Transport::Tcp => {
                let c = TcpStream::connect_timeout(&to, CONNECT_TIMEOUT)
                    .map_err(|e| format!("connecting to {to}: {e}"))?;
                c.set_nodelay(true).map_err(|e| e.to_string())?;
                Sender::Tcp(c)
            }
        })
    }

    /// Send record `seq`; a failed UDP send (no route for a moment) is a lost
    /// datagram, a failed TCP write ends the call.
    fn send(&mut self, seq: u64, sent_us: u64) -> Result<(), String> {
        let d = datagram(seq, sent_us);
        match self {
            Sender::Udp(s, to) => {
                let _ = s.send_to(&d, *to);
                Ok(())
            }
            Sender::Tcp(c) => c
                .write_all(&d)
                .map_err(|e| format!("writing record {seq}: {e}")),
        }
    }
}

/// Send `count` records, one every [`EVERY`] from when the sender is ready; the
/// number sent.
fn send_all(mut s: Sender, count: u64, stop: &AtomicBool, clock: &Clock) -> Result<u64, String> {
    let start = Instant::now();
    for seq in 0..count {
        if stop.load(Ordering::Relaxed) {
            return Ok(seq);
        }
        let at = start + EVERY * seq as u32;
        let now = Instant::now();
        if at > now {
            std::thread::sleep(at - now);
        }
        s.send(seq, clock())?;
    }
    Ok(count)
}

impl Call {
    /// Start a call of `length` over `t` from `from` in namespace `client_ns` to `to`
    /// in `server_ns` (the receiver is bound when this returns).
    pub fn start(
        t: Transport,
        client_ns: &str,
        from: SocketAddr,
        server_ns: &str,
        to: SocketAddr,
        length: Duration,
    ) -> Result<Call, LabError> {
        let t0 = Instant::now();
        let clock: Clock = Arc::new(move || t0.elapsed().as_micros() as u64);
        let stop = Arc::new(AtomicBool::new(false));
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready) = mpsc::channel();
        let receiver = {
            let (ns, stop, arrivals, clock) = (
                server_ns.to_string(),
                stop.clone(),
                arrivals.clone(),
                clock.clone(),
            );
            std::thread::spawn(move || {
                let bound = enter(&ns)
                    .map_err(|e| format!("entering {ns}: {e}"))
                    .and_then(|_| Receiver::bind(t, to));
                let _ = ready_tx.send(bound.as_ref().map(|_| ()).map_err(Clone::clone));
                if let Ok(r) = bound {
                    r.run(&stop, &clock, &arrivals);
                }
            })
        };
        match ready.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(fail(e)),
            Err(_) => return Err(fail("the receiver ended")),
        }
        let count = (length.as_micros() / EVERY.as_micros()).max(1) as u64;
        let sender = {
            let (ns, stop) = (client_ns.to_string(), stop.clone());
            std::thread::spawn(move || -> Result<u64, String> {
                enter(&ns).map_err(|e| format!("entering {ns}: {e}"))?;
                let s = Sender::open(t, from, to)?;
                send_all(s, count, &stop, &clock)
            })
        };
        Ok(Call {
            stop,
            sender: Some(sender),
            receiver: Some(receiver),
            arrivals,
        })
    }

    /// Wait for the last datagram to be sent and [`GRACE`] more for late ones; the
    /// call's figures.
    pub fn finish(mut self) -> Result<CallStats, LabError> {
        let sent = self
            .sender
            .take()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("the sender panicked".into()))
            })
            .unwrap_or(Ok(0))
            .map_err(fail)?;
        std::thread::sleep(GRACE);
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.receiver.take() {
            let _ = h.join();
        }
        let arrivals = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
        Ok(CallStats::of(sent, &arrivals))
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.receiver.take() {
            let _ = h.join();
        }
        if let Some(h) = self.sender.take() {
            let _ = h.join();
        }
    }
}

/// The link with the shortest delay (of equal ones, the fastest; then the first).
pub fn best_link(links: &[LinkSpec]) -> usize {
    (0..links.len())
        .min_by_key(|&i| (links[i].delay, std::cmp::Reverse(links[i].rate_bps), i))
        .unwrap_or(0)
}

fn addr(text: &str, port: u16) -> Result<SocketAddr, LabError> {
    topo::socket_addr(text, port)
        .parse()
        .map_err(|e| fail(format!("address {text}: {e}")))
}

/// The reference: the call over link `i` alone, nothing else on it, for
/// [`IDLE_LENGTH`].
pub fn over_link(t: Transport, i: usize, l: &LinkSpec) -> Result<CallStats, LabError> {
    let (client, server) = topo::link_addrs(i, l);
    let call = Call::start(
        t,
        NS_CLIENT,
        addr(&client, 0)?,
        NS_SERVER,
        addr(&server, t.port())?,
        IDLE_LENGTH,
    )?;
    call.finish()
}

/// The call through the tunnel (its inner addresses), `length` long, started now.
pub fn through_tunnel(t: Transport, length: Duration) -> Result<Call, LabError> {
    Call::start(
        t,
        NS_CLIENT,
        addr("10.99.0.1", 0)?,
        NS_SERVER,
        addr("10.99.0.2", t.port())?,
        length,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(seq: u64, delay_ms: u64) -> Arrival {
        let sent_us = seq * 20_000;
        Arrival {
            seq,
            sent_us,
            at_us: sent_us + delay_ms * 1000,
        }
    }

    #[test]
    fn quantiles_are_by_nearest_rank() {
        // Datagram k took `ms[k]` milliseconds.
        let stats = |ms: &[u64]| {
            let a: Vec<Arrival> = (0..ms.len() as u64)
                .map(|k| Arrival {
                    seq: k,
                    sent_us: 0,
                    at_us: ms[k as usize] * 1000,
                })
                .collect();
            CallStats::of(ms.len() as u64, &a)
        };
        let v: Vec<u64> = (1..=100).collect();
        let c = stats(&v);
        assert_eq!((c.p50_ms, c.p99_ms, c.max_ms), (50.0, 99.0, 100.0));
        assert_eq!(stats(&[7]).p99_ms, 7.0);
        assert_eq!(stats(&[1, 2, 3]).p50_ms, 2.0);
        let none = CallStats::of(3, &[]);
        assert_eq!(
            (none.p50_ms, none.p99_ms, none.max_ms, none.lost),
            (0.0, 0.0, 0.0, 3)
        );
    }

    /// 200 sent; 197 distinct arrive, one twice, two out of order, one from no call of
    /// ours; the slowest two are the tail.
    #[test]
    fn loss_counts_distinct_datagrams_and_delays_their_first_copies() {
        let mut arr: Vec<Arrival> = (0..200)
            .filter(|s| ![10, 11, 150].contains(s))
            .map(|s| a(s, 5))
            .collect();
        // 61 and 62 overtaken by 63: they come after it, 62 slowest of all.
        let i = arr.iter().position(|x| x.seq == 61).unwrap();
        let (x61, x62) = (arr[i], arr[i + 1]);
        arr.remove(i);
        arr.remove(i);
        arr.insert(
            i + 1,
            Arrival {
                at_us: x61.sent_us + 40_000,
                ..x61
            },
        );
        arr.insert(
            i + 2,
            Arrival {
                at_us: x62.sent_us + 90_000,
                ..x62
            },
        );
        // A second copy of 5, much later (its delay must not count), and a stray.
        arr.push(a(5, 500));
        arr.push(a(900, 1));
        let c = CallStats::of(200, &arr);
        assert_eq!((c.sent, c.delivered, c.lost), (200, 197, 3));
        assert_eq!((c.duplicates, c.reordered), (1, 2));
        assert!((c.loss_pct() - 1.5).abs() < 1e-12);
        assert_eq!(c.p50_ms, 5.0);
        // 197 delays: rank ceil(0.99 × 197) = 196, the second largest.
        assert_eq!(c.p99_ms, 40.0);
        assert_eq!(c.max_ms, 90.0);
        let back = CallStats::from_json(&c.to_json()).unwrap();
        assert_eq!(back, c);
        assert_eq!(c.to_json()["loss_pct"], 1.5);
    }

    #[test]
    fn nothing_arrived_is_all_lost() {
        let c = CallStats::of(50, &[]);
        assert_eq!((c.delivered, c.lost, c.p99_ms), (0, 50, 0.0));
        assert_eq!(c.loss_pct(), 100.0);
    }

    /// A TCP stream cut anywhere gives back the records whole, in order, each once.
    #[test]
    fn records_are_cut_from_a_stream_however_it_is_split() {
        let stream: Vec<u8> = (0..5).flat_map(|s| datagram(s, 1000 + s)).collect();
        for cut in [1, 7, SIZE - 1, SIZE, SIZE + 1, 333, stream.len()] {
            let mut r = Records::default();
            let got: Vec<_> = stream.chunks(cut).flat_map(|c| r.push(c)).collect();
            let want: Vec<_> = (0..5).map(|s| (s, 1000 + s)).collect();
            assert_eq!(got, want, "cut every {cut} bytes");
            assert!(r.partial.is_empty());
        }
        // A record not complete yet is held, not parsed.
        let mut r = Records::default();
        assert!(r.push(&stream[..SIZE + 10]).len() == 1 && r.partial.len() == 10);
        assert_eq!(Transport::from_name("tcp"), Some(Transport::Tcp));
        assert_eq!(
            Transport::from_name(Transport::Udp.name()),
            Some(Transport::Udp)
        );
    }

    #[test]
    fn datagrams_carry_their_number_and_send_time() {
        let d = datagram(7, 123_456);
        assert_eq!(parse(&d), Some((7, 123_456)));
        assert_eq!(parse(&d[..SIZE - 1]), None);
        let mut other = d;
        other[0] = b'X';
        assert_eq!(parse(&other), None);
    }

    #[test]
    fn the_median_of_runs_is_per_figure() {
        let c = |lost, p99_ms| CallStats {
            sent: 750,
            delivered: 750 - lost,
            lost,
            p99_ms,
            ..CallStats::default()
        };
        let m = CallStats::median(&[c(0, 6.0), c(4, 30.0), c(1, 7.0)]).unwrap();
        assert_eq!((m.lost, m.delivered, m.p99_ms), (1, 749, 7.0));
        assert_eq!(CallStats::median(&[]), None);
    }

    #[test]
    fn the_best_link_is_the_lowest_delay() {
        let l = LinkSpec::parse_list("20mbit/60ms,100mbit/5ms,50mbit/5ms").unwrap();
        assert_eq!(best_link(&l), 1);
    }
}
