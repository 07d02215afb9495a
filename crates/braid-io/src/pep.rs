//! TCP carried as byte streams: the tunnel's performance-enhancing proxy (RFC 3135).
//!
//! [`Pep`] joins the two halves: the user-space TCP stack on the TUN device
//! ([`crate::proxy::Terminator`]), which ends each TCP connection at this end, and the
//! session's byte streams ([`braid_proto::stream::Streams`]), which carry its bytes
//! across the bond. One connection is one stream.
//!
//! * **Near end** (the application's SYN enters the TUN): the SYN is held, a stream is
//!   opened to the peer with the original addresses; when the peer says the far end
//!   connected, the SYN is answered and bytes flow; when it says refused (or
//!   unreachable, or not allowed), the application gets a reset, so a connection the
//!   far end cannot make is never accepted here.
//! * **Far end** (a stream arrives): the connection is opened from the original source
//!   address to the original destination through the TUN device, so the kernel
//!   forwards it, firewalls it and routes its answers exactly as it would the packets
//!   of the same connection carried as packets; the stream is accepted once it is
//!   established.
//! * Bytes move between a connection and its stream as far as the receiving side has
//!   room: a slow reader at either end holds back its own stream's credit, no one
//!   else's. FIN is a stream's finish (half-close both ways), RST a stream's reset.
//!
//! Everything runs in the session's driver task, at each of its steps
//! ([`Pep::step`]), with no task or lock between the TUN packets, the stack and the
//! session.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::time::Instant as StdInstant;

use braid_proto::session::Session as Machine;
use braid_proto::stream::{Refusal, StreamEvent, StreamId, Streams};
use braid_proto::time::Instant;

use crate::proxy::{ConnId, ProxyEvent, Terminator, TerminatorConfig, Verdict};

/// Bytes moved between a connection and its stream per call, at most.
const CHUNK: usize = 16 * 1024;

/// What the proxy has done, for `braid status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PepCounters {
    /// Connections taken at this end (the application's SYN entered the TUN).
    pub opened: u64,
    /// Connections the far end made for the peer's streams.
    pub connected: u64,
    /// Connections refused: by the far end's destination, or not allowed there.
    pub refused: u64,
    /// Connections reset by either end after they were made.
    pub reset: u64,
    /// Bytes from our connections into streams.
    pub bytes_out: u64,
    /// Bytes from streams into our connections.
    pub bytes_in: u64,
}

/// One connection and its stream, and the bytes read from one not yet taken by the
/// other.
struct Pair {
    conn: ConnId,
    stream: StreamId,
    /// Read from the connection, not yet taken by the stream.
    carry: Vec<u8>,
    /// Read from the stream, not yet taken by the connection.
    carry_in: Vec<u8>,
    /// The connection's bytes were read to its FIN (some may still be in `carry`).
    read_end: bool,
    /// The connection's FIN was passed on as the stream's finish.
    fin_out: bool,
    /// The stack closed the connection cleanly (both FINs): only `carry` and the
    /// finish are left to pass on.
    conn_gone: bool,
    /// The stream's finish was passed on as the connection's FIN.
    fin_in: bool,
    /// The connection is made at both ends: bytes may flow.
    open: bool,
}

/// The proxy: the TCP stack on the TUN and the connection-to-stream table.
pub struct Pep {
    term: Terminator,
    pairs: Vec<Option<Pair>>,
    free: Vec<usize>,
    by_conn: HashMap<ConnId, usize>,
    by_stream: HashMap<StreamId, usize>,
    /// Pairs to move bytes for at the next step.
    dirty: BTreeSet<usize>,
    buf: Vec<u8>,
    /// What it has done.
    pub counters: PepCounters,
}

impl Pep {
    /// A proxy for a TUN device of this MTU, which terminates every TCP connection it
    /// can but those with a port in `except_ports` (ranges, `tcp_streams_except`).
    pub fn new(mtu: usize, except_ports: Vec<(u16, u16)>, now: StdInstant) -> Pep {
        let cfg = TerminatorConfig {
            mtu,
            exclude_ports: except_ports,
            ..TerminatorConfig::default()
        };
        Pep {
            term: Terminator::new(cfg, now),
            pairs: Vec::new(),
            free: Vec::new(),
            by_conn: HashMap::new(),
            by_stream: HashMap::new(),
            dirty: BTreeSet::new(),
            // Grown when the first pair opens: a server's idle peer costs none.
            buf: Vec::new(),
            counters: PepCounters::default(),
        }
    }

    /// A packet read from the TUN device: `true` if the proxy took it (a connection's
    /// SYN or segment), `false` if it goes on as a packet. Only while the peer takes
    /// streams.
    pub fn take_tun_packet(&mut self, now: StdInstant, m: &Machine, p: &[u8]) -> bool {
        // The segments of connections taken before still go to the stack (a new SYN
        // meanwhile is refused at once, below).
        if !m.streams_usable() && self.by_conn.is_empty() {
            return false;
        }
        // A connection a `[[session.flow]]` rule sends `redundant` or `lowest-delay`
        // crosses as packets with that policy (its SYN passes, so it is never taken).
        let rule = m.config().flows.rule_for(p);
        if rule.is_some_and(|r| r != braid_proto::session::FlowPolicy::Bond) {
            return false;
        }
        matches!(self.term.handle_tun_packet(now, p), Verdict::Taken)
    }

    /// The next packet the stack has for the TUN device.
    pub fn poll_tun_packet(&mut self) -> Option<Vec<u8>> {
        self.term.poll_tun_packet()
    }

    /// When [`Pep::step`] wants to run again.
    pub fn poll_at(&self, now: StdInstant) -> Option<StdInstant> {
        // Pairs left with bytes to move (a step stops after a few rounds): at once.
        if !self.dirty.is_empty() {
            return Some(now);
        }
        self.term.poll_at(now)
    }

    /// One step: the stack's timers and input, the events of both sides, bytes moved
    /// where they can go, and the streams' frames handed to the session.
    pub fn step(&mut self, now: StdInstant, pnow: Instant, m: &mut Machine) {
        self.term.poll(now);
        let usable = m.streams_usable();
        let Some(st) = m.streams() else {
            return;
        };
        for _ in 0..4 {
            let mut any = false;
            while let Some(e) = self.term.poll_event() {
                any = true;
                self.on_proxy_event(pnow, st, e, usable);
            }
            while let Some(e) = st.poll_event() {
                any = true;
                self.on_stream_event(now, pnow, st, e);
            }
            let dirty = std::mem::take(&mut self.dirty);
            for i in dirty {
                any = true;
                self.pump(pnow, st, i);
            }
            self.term.poll(now);
            if !any {
                break;
            }
        }
        m.handle_streams(pnow);
    }

    fn on_proxy_event(&mut self, pnow: Instant, st: &mut Streams, e: ProxyEvent, usable: bool) {
        match e {
            ProxyEvent::Incoming { conn, src, dst } => match st.open(pnow, src, dst) {
                Ok(stream) if usable => {
                    self.counters.opened += 1;
                    self.insert(conn, stream, false);
                }
                Ok(stream) => {
                    // The peer stopped taking streams (it restarted without them).
                    st.reset(pnow, stream);
                    self.term.refuse(conn);
                }
                Err(_) => self.term.refuse(conn),
            },
            ProxyEvent::Connected { conn } => {
                if let Some(i) = self.by_conn.get(&conn).copied() {
                    let p = self.pair(i);
                    p.open = true;
                    let stream = p.stream;
                    self.counters.connected += 1;
                    st.accept(pnow, stream);
                    self.dirty.insert(i);
                }
            }
            ProxyEvent::ConnectFailed { conn, refused } => {
                if let Some(i) = self.by_conn.get(&conn).copied() {
                    let stream = self.pair(i).stream;
                    let why = if refused {
                        Refusal::Refused
                    } else {
                        Refusal::Unreachable
                    };
                    self.counters.refused += 1;
                    st.refuse(pnow, stream, why);
                    self.remove(i);
                }
            }
            ProxyEvent::Readable { conn }
            | ProxyEvent::Writable { conn }
            | ProxyEvent::PeerClosed { conn } => self.mark(conn),
            ProxyEvent::Reset { conn } => {
                if let Some(i) = self.by_conn.get(&conn).copied() {
                    let stream = self.pair(i).stream;
                    self.counters.reset += 1;
                    st.reset(pnow, stream);
                    self.remove(i);
                }
            }
            ProxyEvent::Closed { conn } => {
                if let Some(i) = self.by_conn.get(&conn).copied() {
                    let p = self.pair(i);
                    let stream = p.stream;
                    if p.fin_in && p.read_end {
                        // Closed cleanly: what was read and its FIN still go into the
                        // stream, which then finishes on its own.
                        p.conn_gone = true;
                        self.by_conn.remove(&conn);
                        self.pump(pnow, st, i);
                    } else {
                        // Nothing more can reach the application: the peer is told.
                        if !st.is_closed(stream) {
                            self.counters.reset += 1;
                            st.reset(pnow, stream);
                        }
                        self.remove(i);
                    }
                }
            }
        }
    }

    fn on_stream_event(
        &mut self,
        now: StdInstant,
        pnow: Instant,
        st: &mut Streams,
        e: StreamEvent,
    ) {
        match e {
            StreamEvent::Incoming { id, src, dst } => {
                if !allowed(src, dst, &st.config().allow_to) {
                    self.counters.refused += 1;
                    st.refuse(pnow, id, Refusal::NotAllowed);
                    return;
                }
                match self.term.connect(now, src, dst) {
                    Some(conn) => self.insert(conn, id, false),
                    None => st.refuse(pnow, id, Refusal::TooMany),
                }
            }
            StreamEvent::Opened { id } => {
                if let Some(i) = self.by_stream.get(&id).copied() {
                    let p = self.pair(i);
                    p.open = true;
                    let conn = p.conn;
                    self.term.accept(now, conn);
                    self.dirty.insert(i);
                }
            }
            StreamEvent::Refused { id, .. } => {
                if let Some(i) = self.by_stream.get(&id).copied() {
                    let conn = self.pair(i).conn;
                    self.counters.refused += 1;
                    self.term.refuse(conn);
                    self.remove(i);
                }
            }
            StreamEvent::Readable { id } | StreamEvent::Writable { id } => {
                if let Some(i) = self.by_stream.get(&id).copied() {
                    self.dirty.insert(i);
                }
            }
            StreamEvent::Reset { id } => {
                if let Some(i) = self.by_stream.get(&id).copied() {
                    let conn = self.pair(i).conn;
                    self.counters.reset += 1;
                    self.term.abort(conn);
                    self.remove(i);
                }
            }
        }
    }

    /// Move bytes both ways for pair `i`, as far as each side has room, and pass on
    /// each direction's end.
    fn pump(&mut self, pnow: Instant, st: &mut Streams, i: usize) {
        let Some(p) = self.pairs.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        if !p.open {
            return;
        }
        if self.buf.is_empty() {
            self.buf.resize(CHUNK, 0);
        }
        let (conn, stream) = (p.conn, p.stream);
        // Connection -> stream.
        loop {
            if p.carry.is_empty() {
                let n = if p.conn_gone {
                    0
                } else {
                    self.term.recv(conn, &mut self.buf)
                };
                if n == 0 {
                    break;
                }
                p.carry.extend_from_slice(&self.buf[..n]);
            }
            let n = st.write(pnow, stream, &p.carry);
            self.counters.bytes_out += n as u64;
            p.carry.drain(..n);
            if !p.carry.is_empty() {
                break;
            }
        }
        // (Known only while the stack has the connection: it forgets it once closed.)
        p.read_end |= !p.conn_gone && self.term.recv_finished(conn);
        if p.carry.is_empty() && !p.fin_out && p.read_end {
            p.fin_out = true;
            st.finish(pnow, stream);
        }
        if p.conn_gone {
            if p.fin_out {
                self.remove(i);
            }
            return;
        }
        // Stream -> connection. (What the connection does not take waits here: its
        // short send is what brings the connection's `Writable`.)
        loop {
            if p.carry_in.is_empty() {
                let n = st.read(stream, &mut self.buf);
                if n == 0 {
                    break;
                }
                p.carry_in.extend_from_slice(&self.buf[..n]);
            }
            let n = self.term.send(conn, &p.carry_in);
            self.counters.bytes_in += n as u64;
            p.carry_in.drain(..n);
            if !p.carry_in.is_empty() {
                break;
            }
        }
        if p.carry_in.is_empty() && !p.fin_in && st.finished(stream) {
            p.fin_in = true;
            self.term.shutdown(conn);
        }
    }

    fn mark(&mut self, conn: ConnId) {
        if let Some(i) = self.by_conn.get(&conn).copied() {
            self.dirty.insert(i);
        }
    }

    fn pair(&mut self, i: usize) -> &mut Pair {
        self.pairs[i].as_mut().expect("a live pair's index")
    }

    fn insert(&mut self, conn: ConnId, stream: StreamId, open: bool) {
        let p = Pair {
            conn,
            stream,
            carry: Vec::new(),
            carry_in: Vec::new(),
            read_end: false,
            fin_out: false,
            conn_gone: false,
            fin_in: false,
            open,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.pairs[i] = Some(p);
                i
            }
            None => {
                self.pairs.push(Some(p));
                self.pairs.len() - 1
            }
        };
        self.by_conn.insert(conn, i);
        self.by_stream.insert(stream, i);
    }

    fn remove(&mut self, i: usize) {
        if let Some(p) = self.pairs.get_mut(i).and_then(Option::take) {
            if self.by_conn.get(&p.conn) == Some(&i) {
                self.by_conn.remove(&p.conn);
            }
            self.by_stream.remove(&p.stream);
            self.dirty.remove(&i);
            self.free.push(i);
        }
    }

    /// Pairs in the table (connections being made or open).
    pub fn pairs(&self) -> usize {
        self.by_conn.len()
    }
}

/// Whether the far end may open a connection for the peer from `src` to `dst`: the
/// same families, a destination a packet could go to (not unspecified, multicast or
/// broadcast), and inside one of `allow_to` (`tcp_streams_to`; empty: anywhere).
/// Everything else is the kernel's to decide, as for the same connection carried as
/// packets: the connection enters the TUN device with the peer's source address, so
/// forwarding, the firewall and routes apply to it alike.
fn allowed(src: SocketAddr, dst: SocketAddr, allow_to: &[(IpAddr, u8)]) -> bool {
    let ip = dst.ip();
    src.is_ipv4() == dst.is_ipv4()
        && dst.port() != 0
        && !ip.is_unspecified()
        && !ip.is_multicast()
        && !matches!(ip, IpAddr::V4(v4) if v4.is_broadcast())
        && (allow_to.is_empty() || allow_to.iter().any(|&(net, len)| within(ip, net, len)))
}

/// Whether `ip` is in the network `net`/`len` (of the same family).
fn within(ip: IpAddr, net: IpAddr, len: u8) -> bool {
    let (a, b, bits) = match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(b)) => (u128::from(u32::from(a)), u128::from(u32::from(b)), 32),
        (IpAddr::V6(a), IpAddr::V6(b)) => (u128::from(a), u128::from(b), 128),
        _ => return false,
    };
    let len = u32::from(len).min(bits);
    if len == 0 {
        return true;
    }
    let shift = bits - len;
    a >> shift == b >> shift
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn destinations_outside_tcp_streams_to_are_not_allowed() {
        let (src, dst) = (sa("10.0.0.1:4000"), sa("10.1.2.3:80"));
        assert!(allowed(src, dst, &[]));
        let net = |s: &str, l| (s.parse::<IpAddr>().unwrap(), l);
        assert!(allowed(src, dst, &[net("10.1.0.0", 16)]));
        assert!(!allowed(src, dst, &[net("10.2.0.0", 16)]));
        assert!(allowed(src, dst, &[net("10.2.0.0", 16), net("0.0.0.0", 0)]));
        assert!(!allowed(src, dst, &[net("::", 0)]), "another family");
        assert!(allowed(src, dst, &[net("10.1.2.3", 32)]));
        assert!(!allowed(src, dst, &[net("10.1.2.4", 32)]));
        let v6 = (sa("[2001:db8::1]:4000"), sa("[2001:db8:1::5]:443"));
        assert!(allowed(v6.0, v6.1, &[net("2001:db8::", 32)]));
        assert!(!allowed(v6.0, v6.1, &[net("2001:db8::", 48)]));
        // Never a broadcast, multicast, unspecified or port-0 destination, or one of
        // the other family.
        assert!(!allowed(src, sa("255.255.255.255:80"), &[]));
        assert!(!allowed(src, sa("224.0.0.1:80"), &[]));
        assert!(!allowed(src, sa("0.0.0.0:80"), &[]));
        assert!(!allowed(src, sa("10.1.2.3:0"), &[]));
        assert!(!allowed(src, v6.1, &[]));
    }
}
