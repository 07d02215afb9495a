//! The field lab's traffic through each client's tunnel, from threads of the lab's own
//! process that enter the namespaces (`setns`), so every send and arrival is timed on
//! one clock:
//!
//! * **probes**: a UDP datagram every [`PROBE_EVERY`] each way between the client's
//!   and the server's inner addresses, numbered and stamped, its payload a function of
//!   its number and a checksum over all of it. They time the recoveries
//!   ([`super::recovery`]) at that granularity; a probe that arrives altered is counted.
//! * **a block stream**: TCP from the client to the server, blocks of [`BLOCK`] bytes,
//!   each numbered, its content a function of its number and a checksum in its header,
//!   at a capped rate. The receiver checks every block (number, checksum, content). A
//!   connection that breaks is opened again and the stream resumes at the block the
//!   receiver names, so nothing is skipped or delivered twice; at the end the sender
//!   has sent its last block and the receiver has every block up to it, or the stream
//!   is not whole.

use std::collections::hash_map::DefaultHasher;
use std::hash::Hasher;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One probe each way this often.
pub const PROBE_EVERY: Duration = Duration::from_millis(10);
/// A probe's size (bytes of UDP payload).
pub const PROBE_LEN: usize = 256;
/// A block of the stream (payload bytes; a 16-byte header precedes it).
pub const BLOCK: usize = 16 * 1024;
const MAGIC: [u8; 4] = *b"BRF1";

/// Move the calling thread into network namespace `ns`: sockets it opens from then on
/// are that namespace's.
pub fn enter(ns: &str) -> std::io::Result<()> {
    let f = std::fs::File::open(format!("/run/netns/{ns}"))?;
    // SAFETY: setns on a valid descriptor; it changes only this thread's namespace.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn hash(bytes: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    h.write(bytes);
    h.finish()
}

/// Content that is a function of `seq` (xorshift from it).
fn fill(seq: u64, out: &mut [u8]) {
    let mut x = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

/// Microseconds since `t0`.
fn us(t0: Instant) -> u64 {
    t0.elapsed().as_micros() as u64
}

/// One direction of one client's probes: when each was sent and when (if) it arrived,
/// in µs since the lab's start, by number.
#[derive(Debug, Default, Clone)]
pub struct Probes {
    /// Send time of probe `i`.
    pub sent: Vec<u64>,
    /// Arrival time of probe `i`.
    pub arrived: Vec<Option<u64>>,
    /// Probes that arrived altered (checksum or content) or twice.
    pub bad: u64,
}

fn probe(dir: u8, k: u8, seq: u64, sent: u64) -> [u8; PROBE_LEN] {
    let mut p = [0u8; PROBE_LEN];
    p[..4].copy_from_slice(&MAGIC);
    p[4] = dir;
    p[5] = k;
    p[6..14].copy_from_slice(&seq.to_be_bytes());
    p[14..22].copy_from_slice(&sent.to_be_bytes());
    fill(seq, &mut p[22..PROBE_LEN - 8]);
    let h = hash(&p[..PROBE_LEN - 8]);
    p[PROBE_LEN - 8..].copy_from_slice(&h.to_be_bytes());
    p
}

/// The number of a probe from `dir` of client `k`, if it is whole and right.
fn check_probe(p: &[u8], dir: u8, k: u8) -> Option<u64> {
    if p.len() != PROBE_LEN || p[..4] != MAGIC || p[4] != dir || p[5] != k {
        return None;
    }
    let seq = u64::from_be_bytes(p[6..14].try_into().ok()?);
    let sent = u64::from_be_bytes(p[14..22].try_into().ok()?);
    (probe(dir, k, seq, sent)[..] == *p).then_some(seq)
}

/// Threads of one run; stopped with [`Threads::stop`].
#[derive(Default)]
pub struct Threads {
    handles: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl Threads {
    /// Start `f` in a thread inside namespace `ns`; a failure to enter it or to bind
    /// is reported through `errors`.
    fn spawn(
        &mut self,
        ns: String,
        errors: &Errors,
        f: impl FnOnce(Arc<AtomicBool>) -> Result<(), String> + Send + 'static,
    ) {
        let stop = self.stop.clone();
        let errors = errors.clone();
        self.handles.push(std::thread::spawn(move || {
            let r = enter(&ns)
                .map_err(|e| format!("entering {ns}: {e}"))
                .and_then(|_| f(stop));
            if let Err(e) = r {
                errors.lock().unwrap_or_else(|p| p.into_inner()).push(e);
            }
        }));
    }

    /// Stop every thread and wait for it.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

impl Drop for Threads {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Errors of the traffic threads.
pub type Errors = Arc<Mutex<Vec<String>>>;

/// One end of a probe stream: a socket bound at `bind` in `ns` that sends probes of
/// direction `dir` to `to` and takes those of the other direction into `rx`.
pub struct ProbeEnd {
    /// Namespace.
    pub ns: String,
    /// Local address.
    pub bind: SocketAddr,
    /// The other end.
    pub to: SocketAddr,
    /// The direction this end sends (0: client to server, 1: server to client).
    pub dir: u8,
}

/// Start both threads of one end of client `k`'s probes.
pub fn start_probe_end(
    th: &mut Threads,
    errors: &Errors,
    t0: Instant,
    k: u8,
    end: ProbeEnd,
    tx: Arc<Mutex<Probes>>,
    rx: Arc<Mutex<Probes>>,
) {
    let (bind, to, dir) = (end.bind, end.to, end.dir);
    // The receiving thread binds the socket and hands the sender a clone of it.
    let sock_tx = Arc::new(Mutex::new(None::<UdpSocket>));
    let shared = sock_tx.clone();
    th.spawn(end.ns.clone(), errors, move |stop| {
        let s = UdpSocket::bind(bind).map_err(|e| format!("probe socket {bind}: {e}"))?;
        s.set_read_timeout(Some(Duration::from_millis(50)))
            .map_err(|e| e.to_string())?;
        *shared.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(s.try_clone().map_err(|e| e.to_string())?);
        receive_probes(&s, &stop, t0, 1 - dir, k, &rx);
        Ok(())
    });
    th.spawn(end.ns, errors, move |stop| {
        let s = loop {
            if let Some(s) = sock_tx.lock().unwrap_or_else(|p| p.into_inner()).take() {
                break s;
            }
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        send_probes(&s, to, &stop, t0, dir, k, &tx);
        Ok(())
    });
}

fn send_probes(
    s: &UdpSocket,
    to: SocketAddr,
    stop: &AtomicBool,
    t0: Instant,
    dir: u8,
    k: u8,
    log: &Mutex<Probes>,
) {
    let start = Instant::now();
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let at = start + PROBE_EVERY * seq as u32;
        let now = Instant::now();
        if at > now {
            std::thread::sleep(at - now);
        }
        let sent = us(t0);
        log.lock()
            .unwrap_or_else(|p| p.into_inner())
            .sent
            .push(sent);
        // A failed send (no route while an uplink or a tunnel is away) is a lost probe.
        let _ = s.send_to(&probe(dir, k, seq, sent), to);
        seq += 1;
    }
}

fn receive_probes(
    s: &UdpSocket,
    stop: &AtomicBool,
    t0: Instant,
    dir: u8,
    k: u8,
    log: &Mutex<Probes>,
) {
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        let Ok(n) = s.recv(&mut buf) else { continue };
        let at = us(t0);
        let mut l = log.lock().unwrap_or_else(|p| p.into_inner());
        match check_probe(&buf[..n], dir, k) {
            Some(seq) => {
                let i = seq as usize;
                if l.arrived.len() <= i {
                    l.arrived.resize(i + 1, None);
                }
                if l.arrived[i].is_some() {
                    l.bad += 1;
                } else {
                    l.arrived[i] = Some(at);
                }
            }
            None => l.bad += 1,
        }
    }
}

/// One client's block stream, as both ends saw it.
#[derive(Debug, Default, Clone)]
pub struct Stream {
    /// Blocks the sender made (the stream's length once it stopped).
    pub made: u64,
    /// The sender stopped making blocks (the run is over).
    pub closed: bool,
    /// The receiver confirmed every block up to `made` after the sender closed.
    pub complete: bool,
    /// Blocks the receiver took, in order, each checked.
    pub received: u64,
    /// Blocks that arrived with a wrong number, checksum or content.
    pub bad: u64,
    /// Connections the receiver accepted (1 when none broke).
    pub connections: u64,
}

/// Start client `k`'s block stream: a receiver listening at `at` in `server_ns`, a
/// sender in `client_ns` at `rate` bytes a second until `close` is set, then until
/// the receiver has it all (or the threads stop).
#[allow(clippy::too_many_arguments)]
pub fn start_stream(
    th: &mut Threads,
    errors: &Errors,
    server_ns: String,
    client_ns: String,
    at: SocketAddr,
    rate: u64,
    close: Arc<AtomicBool>,
    state: Arc<Mutex<Stream>>,
) {
    let listening = Arc::new(AtomicBool::new(false));
    let (l2, s2) = (listening.clone(), state.clone());
    th.spawn(server_ns, errors, move |stop| {
        let l = TcpListener::bind(at).map_err(|e| format!("stream listener {at}: {e}"))?;
        l.set_nonblocking(true).map_err(|e| e.to_string())?;
        l2.store(true, Ordering::Relaxed);
        receive_stream(&l, &stop, &s2);
        Ok(())
    });
    th.spawn(client_ns, errors, move |stop| {
        while !listening.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(5));
        }
        send_stream(at, rate, &stop, &close, &state);
        Ok(())
    });
}

fn block(seq: u64) -> Vec<u8> {
    let mut b = vec![0u8; 16 + BLOCK];
    fill(seq, &mut b[16..]);
    let h = hash(&b[16..]);
    b[..8].copy_from_slice(&seq.to_be_bytes());
    b[8..16].copy_from_slice(&h.to_be_bytes());
    b
}

fn lock(s: &Mutex<Stream>) -> std::sync::MutexGuard<'_, Stream> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

/// The sender: connect (again after a break), resume where the receiver says, send
/// at `rate` until closed, then the rest, and take the receiver's final count.
fn send_stream(
    at: SocketAddr,
    rate: u64,
    stop: &AtomicBool,
    close: &AtomicBool,
    state: &Mutex<Stream>,
) {
    let mut pace = Pace::new(rate);
    while !stop.load(Ordering::Relaxed) && !lock(state).complete {
        let Ok(mut c) = TcpStream::connect_timeout(&at, Duration::from_millis(500)) else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let _ = c.set_read_timeout(Some(Duration::from_millis(200)));
        let _ = c.set_write_timeout(Some(Duration::from_millis(200)));
        let _ = c.set_nodelay(true);
        let Some(mut next) = read_u64(&mut c, stop) else {
            continue;
        };
        if send_blocks(&mut c, &mut next, &mut pace, stop, close, state).is_some() {
            finish(&mut c, stop, state);
        }
    }
}

/// A token bucket for new blocks: `rate` bytes a second, at most 8 blocks ahead.
struct Pace {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl Pace {
    fn new(rate: u64) -> Pace {
        Pace {
            rate: rate as f64,
            tokens: 1.0,
            last: Instant::now(),
        }
    }

    /// Wait (briefly) for one block's tokens; true when it may go.
    fn take(&mut self) -> bool {
        let now = Instant::now();
        let dt = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.rate / BLOCK as f64).min(8.0);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
        false
    }
}

/// Send blocks from `next` on: new ones at the pace until `close`, then up to the
/// last one made. `Some` when every block made is written, `None` if the connection
/// broke or the threads stop.
fn send_blocks(
    c: &mut TcpStream,
    next: &mut u64,
    pace: &mut Pace,
    stop: &AtomicBool,
    close: &AtomicBool,
    state: &Mutex<Stream>,
) -> Option<()> {
    loop {
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        let made = {
            let mut s = lock(state);
            if close.load(Ordering::Relaxed) {
                s.closed = true;
            }
            if s.closed && *next >= s.made {
                return Some(());
            }
            s.made
        };
        if *next >= made {
            if !pace.take() || close.load(Ordering::Relaxed) {
                continue;
            }
            lock(state).made = *next + 1;
        }
        write_all(c, &block(*next), stop)?;
        *next += 1;
    }
}

/// Write all of `b`, waiting out a stalled path; `None` if the connection broke.
fn write_all(c: &mut TcpStream, b: &[u8], stop: &AtomicBool) -> Option<()> {
    until_done(b.len(), stop, |off| c.write(&b[off..]))
}

fn read_u64(c: &mut TcpStream, stop: &AtomicBool) -> Option<u64> {
    let mut b = [0u8; 8];
    until_done(b.len(), stop, |off| c.read(&mut b[off..]))?;
    Some(u64::from_be_bytes(b))
}

/// Call `io` (from the offset reached so far) until `len` bytes are done, waiting out
/// timeouts and interruptions; `None` if the connection broke or `stop` was set.
fn until_done(
    len: usize,
    stop: &AtomicBool,
    mut io: impl FnMut(usize) -> std::io::Result<usize>,
) -> Option<()> {
    let mut off = 0;
    while off < len {
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        match io(off) {
            Ok(0) => return None,
            Ok(n) => off += n,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => return None,
        }
    }
    Some(())
}

/// The stream is all written: close our side and take the receiver's count.
fn finish(c: &mut TcpStream, stop: &AtomicBool, state: &Mutex<Stream>) {
    let _ = c.shutdown(Shutdown::Write);
    if let Some(n) = read_u64(c, stop) {
        let mut s = lock(state);
        if n == s.made {
            s.complete = true;
        }
    }
}

/// The receiver: the newest connection wins (the sender opens one only when it gave
/// up on the last); it is told the next block wanted, and every block is checked.
fn receive_stream(l: &TcpListener, stop: &AtomicBool, state: &Mutex<Stream>) {
    let mut conn: Option<(TcpStream, Vec<u8>)> = None;
    let mut buf = vec![0u8; 64 * 1024];
    while !stop.load(Ordering::Relaxed) {
        if let Ok((mut c, _)) = l.accept() {
            let _ = c.set_nonblocking(false);
            let _ = c.set_read_timeout(Some(Duration::from_millis(50)));
            let next = {
                let mut s = lock(state);
                s.connections += 1;
                s.received
            };
            conn = c
                .write_all(&next.to_be_bytes())
                .is_ok()
                .then_some((c, Vec::new()));
        }
        let Some((c, pending)) = conn.as_mut() else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        match c.read(&mut buf) {
            Ok(0) => {
                let n = lock(state).received;
                let _ = c.write_all(&n.to_be_bytes());
                conn = None;
            }
            Ok(n) => {
                pending.extend_from_slice(&buf[..n]);
                take_blocks(pending, state);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => conn = None,
        }
    }
}

/// Check and count every whole block at the front of `pending`.
fn take_blocks(pending: &mut Vec<u8>, state: &Mutex<Stream>) {
    let mut used = 0;
    while pending.len() - used >= 16 + BLOCK {
        let b = &pending[used..used + 16 + BLOCK];
        let seq = u64::from_be_bytes(b[..8].try_into().unwrap_or_default());
        let mut s = lock(state);
        if seq == s.received && b == block(seq).as_slice() {
            s.received += 1;
        } else {
            s.bad += 1;
        }
        used += 16 + BLOCK;
    }
    pending.drain(..used);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_is_checked_whole() {
        let p = probe(1, 2, 77, 123_456);
        assert_eq!(check_probe(&p, 1, 2), Some(77));
        assert_eq!(check_probe(&p, 0, 2), None, "other direction");
        assert_eq!(check_probe(&p, 1, 3), None, "other client");
        for i in [0, 5, 10, 30, PROBE_LEN - 1] {
            let mut q = p;
            q[i] ^= 0x40;
            assert_eq!(check_probe(&q, 1, 2), None, "byte {i} altered");
        }
        assert_eq!(check_probe(&p[..PROBE_LEN - 1], 1, 2), None);
    }

    #[test]
    fn blocks_are_counted_in_order_and_altered_ones_are_caught() {
        let s = Mutex::new(Stream::default());
        let mut pending = [block(0), block(1)].concat();
        pending.extend_from_slice(&block(2)[..100]);
        take_blocks(&mut pending, &s);
        let counts = |s: &Mutex<Stream>| {
            let s = lock(s);
            (s.received, s.bad)
        };
        assert_eq!(counts(&s), (2, 0));
        assert_eq!(pending.len(), 100, "a partial block waits");
        let mut bad = block(2);
        bad[16 + 5000] ^= 1;
        let mut pending = bad;
        pending.extend_from_slice(&block(4));
        take_blocks(&mut pending, &s);
        assert_eq!(counts(&s), (2, 2), "altered, then out of order");
    }
}
