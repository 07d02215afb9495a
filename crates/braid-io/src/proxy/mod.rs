//! A user-space TCP terminator on TUN packets: TCP connections end here, at both ends
//! of the tunnel, and their bytes can travel the bond as byte streams.
//!
//! [`Terminator`] is sans-IO: it takes the raw IP packets read from the TUN
//! ([`Terminator::handle_tun_packet`]) and hands back raw IP packets to write to it
//! ([`Terminator::poll_tun_packet`]); no sockets, no clock of its own. The TCP is
//! smoltcp's (0.12, `Medium::Ip`, any_ip), one interface and one socket per
//! connection, fed only the packets of its own 4-tuple, so the cost of a packet does
//! not grow with the number of connections.
//!
//! * Near end: the local application's kernel sends a SYN (no ACK) into the TUN for a
//!   new 4-tuple. It is held and reported ([`ProxyEvent::Incoming`]); SYN
//!   retransmissions are swallowed meanwhile. [`Terminator::accept`] makes a socket
//!   listening on exactly the original destination and feeds it the SYN (SYN-ACK into
//!   the TUN: the application sees its real peer's address); [`Terminator::refuse`]
//!   answers RST|ACK ("connection refused").
//! * Far end: [`Terminator::connect`] sends a SYN from the original client's address
//!   into the TUN; what comes back for that 4-tuple is taken. The outcome is
//!   [`ProxyEvent::Connected`] or [`ProxyEvent::ConnectFailed`] (`refused` for a RST;
//!   not for the connect timeout or an ICMP/ICMPv6 destination unreachable).
//! * Everything else is [`Verdict::Pass`]: not TCP, not a SYN of a new 4-tuple, an
//!   excluded port, over the connection limit, a bad checksum on the SYN, IPv6 with
//!   extension headers, fragments.
//!
//! Events, per connection, in order:
//! * `Readable` is edge-triggered: it comes when bytes (or the end of the stream)
//!   arrive while the caller is not already told; it is told again once a
//!   [`Terminator::recv`] has emptied the buffer. After the last byte of a finished
//!   stream is read, [`Terminator::recv_finished`] is true.
//! * `Writable` comes after a [`Terminator::send`] took less than it was given, once a
//!   quarter of the buffer is free again.
//! * Every connection ends with exactly one `Closed` (after `Reset`,
//!   `ConnectFailed`, `refuse`, `abort`, an expired held SYN, or a clean close in both
//!   directions once the caller has read to the end), after which its [`ConnId`] is
//!   unknown: its calls do nothing and return 0/false.
//!
//! smoltcp on its own: it retransmits (RTO 10 ms to 10 s, no congestion control), sends
//! keep-alives every 60 s on an idle open connection (which also probe a zero window)
//! and resets a connection whose peer is silent for 300 s; a packet for a 4-tuple the
//! socket no longer knows gets a RST. A freed connection's 4-tuple is remembered for
//! 10 s: its stray segments are taken and dropped rather than passed (a new SYN on it
//! is a new connection).

mod conn;
mod packet;
#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use smoltcp::time::Instant as SmolInstant;

use conn::{Conn, Fail, Next, Side, Stack, RX_QUEUE_MAX};
use packet::{Class, Seg};

/// How long a freed connection's 4-tuple swallows stray segments.
const TOMBSTONE_FOR: Duration = Duration::from_secs(10);

/// Settings of a [`Terminator`].
#[derive(Clone, Debug)]
pub struct TerminatorConfig {
    /// Connections at once (held SYNs included); a SYN over it passes.
    pub max_connections: usize,
    /// Bytes of buffer per socket, each direction (4 KiB to 1 GiB).
    pub buffer: usize,
    /// The TUN's MTU: the largest packet sent, and the MSS announced from it.
    pub mtu: usize,
    /// Port ranges (first, last; source or destination) whose SYNs pass instead of
    /// being terminated.
    pub exclude_ports: Vec<(u16, u16)>,
    /// How long a handshake may take: `connect`, and the local application's after
    /// `accept`. A held SYN not accepted or refused within twice that plus 5 s is
    /// dropped (and its connection closed).
    pub connect_timeout: Duration,
}

impl Default for TerminatorConfig {
    fn default() -> Self {
        TerminatorConfig {
            max_connections: 16384,
            buffer: 256 * 1024,
            mtu: 1400,
            exclude_ports: Vec::new(),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// What became of a packet read from the TUN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The terminator took it.
    Taken,
    /// Not for the terminator: carry it as a packet, unchanged.
    Pass,
}

/// A terminated connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// What the caller is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyEvent {
    /// A SYN from `src` to `dst` is held: `accept` or `refuse` it.
    Incoming {
        /// The connection.
        conn: ConnId,
        /// The application's address.
        src: SocketAddr,
        /// The address it connects to.
        dst: SocketAddr,
    },
    /// `connect` succeeded.
    Connected {
        /// The connection.
        conn: ConnId,
    },
    /// `connect` failed: a RST (`refused`), the timeout or an ICMP unreachable.
    ConnectFailed {
        /// The connection.
        conn: ConnId,
        /// The destination answered RST.
        refused: bool,
    },
    /// Bytes to `recv`, or the end of the stream.
    Readable {
        /// The connection.
        conn: ConnId,
    },
    /// Send room again after `send` took less than asked.
    Writable {
        /// The connection.
        conn: ConnId,
    },
    /// The local peer sent FIN, and every byte before it was received.
    PeerClosed {
        /// The connection.
        conn: ConnId,
    },
    /// The local peer reset the connection (or stopped answering).
    Reset {
        /// The connection.
        conn: ConnId,
    },
    /// Fully closed; its state is freed.
    Closed {
        /// The connection.
        conn: ConnId,
    },
}

/// The TCP terminator: see the [module documentation](self).
pub struct Terminator {
    cfg: TerminatorConfig,
    epoch: Instant,
    /// The latest time the caller gave.
    now: Instant,
    seed: u64,
    next_id: u64,
    conns: HashMap<ConnId, Conn>,
    /// Connections by (source, destination) of the packets that come from the TUN.
    by_key: HashMap<(SocketAddr, SocketAddr), ConnId>,
    tombstones: HashMap<(SocketAddr, SocketAddr), Instant>,
    tomb_order: VecDeque<((SocketAddr, SocketAddr), Instant)>,
    tx: VecDeque<Vec<u8>>,
    events: VecDeque<ProxyEvent>,
    dirty: Vec<ConnId>,
    timers: BTreeSet<(Instant, ConnId)>,
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The address as packets carry it (an IPv4-mapped IPv6 address as IPv4).
fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

impl Terminator {
    /// A terminator with no connections.
    pub fn new(cfg: TerminatorConfig, now: Instant) -> Terminator {
        let mut cfg = cfg;
        cfg.mtu = cfg.mtu.clamp(256, 65535);
        cfg.buffer = cfg.buffer.clamp(4096, 1 << 30);
        let mut b = [0u8; 8];
        let seed = match getrandom::fill(&mut b) {
            Ok(()) => u64::from_le_bytes(b),
            Err(_) => std::process::id().into(),
        };
        Terminator {
            cfg,
            epoch: now,
            now,
            seed,
            next_id: 1,
            conns: HashMap::new(),
            by_key: HashMap::new(),
            tombstones: HashMap::new(),
            tomb_order: VecDeque::new(),
            tx: VecDeque::new(),
            events: VecDeque::new(),
            dirty: Vec::new(),
            timers: BTreeSet::new(),
        }
    }

    fn smol(&self, now: Instant) -> SmolInstant {
        let us = now.saturating_duration_since(self.epoch).as_micros();
        SmolInstant::from_micros(i64::try_from(us).unwrap_or(i64::MAX))
    }

    fn new_stack(&self, id: ConnId, now: Instant) -> Box<Stack> {
        let seed = splitmix(self.seed ^ splitmix(id.0));
        Stack::new(seed, self.cfg.mtu, self.cfg.buffer, self.smol(now))
    }

    fn new_id(&mut self) -> ConnId {
        let id = ConnId(self.next_id);
        self.next_id += 1;
        id
    }

    fn mark_dirty(&mut self, id: ConnId) {
        if let Some(c) = self.conns.get_mut(&id) {
            if !c.dirty {
                c.dirty = true;
                self.dirty.push(id);
            }
        }
    }

    /// Looks at a packet read from the TUN: takes it (for a connection, or a SYN it
    /// holds) or lets it pass.
    pub fn handle_tun_packet(&mut self, now: Instant, pkt: &[u8]) -> Verdict {
        self.now = now;
        match packet::classify(pkt) {
            Class::Tcp(seg) => self.tcp_packet(now, seg, pkt),
            Class::Unreachable { src, dst } => self.unreachable(src, dst),
            Class::Other => Verdict::Pass,
        }
    }

    fn tcp_packet(&mut self, now: Instant, seg: Seg, pkt: &[u8]) -> Verdict {
        let key = (seg.src, seg.dst);
        if let Some(&id) = self.by_key.get(&key) {
            self.feed(id, seg, pkt);
            return Verdict::Taken;
        }
        if seg.is_syn() {
            return self.incoming(now, seg, pkt);
        }
        match self.tombstones.get(&key) {
            Some(&until) if now < until => Verdict::Taken,
            _ => Verdict::Pass,
        }
    }

    /// Queues a packet for its connection (swallowed while the SYN is held, dropped
    /// after the socket is gone).
    fn feed(&mut self, id: ConnId, seg: Seg, pkt: &[u8]) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.held.is_some() {
            return;
        }
        let Some(stack) = c.stack.as_mut() else {
            return;
        };
        if stack.rx.len() >= RX_QUEUE_MAX {
            return;
        }
        if seg.flags & packet::RST != 0 {
            c.rst_in_batch = true;
        }
        stack.rx.push_back(pkt.to_vec());
        self.mark_dirty(id);
    }

    /// A SYN for a new 4-tuple: held and reported, or passed.
    fn incoming(&mut self, now: Instant, seg: Seg, pkt: &[u8]) -> Verdict {
        let excluded = |p: u16| {
            self.cfg
                .exclude_ports
                .iter()
                .any(|&(lo, hi)| (lo..=hi).contains(&p))
        };
        if excluded(seg.src.port())
            || excluded(seg.dst.port())
            || !packet::usable(&seg.src)
            || !packet::usable(&seg.dst)
            || self.conns.len() >= self.cfg.max_connections
            || self.by_key.contains_key(&(seg.dst, seg.src))
            || !packet::tcp_checksum_ok(pkt)
        {
            return Verdict::Pass;
        }
        let key = (seg.src, seg.dst);
        self.tombstones.remove(&key);
        let id = self.new_id();
        let hold = self.cfg.connect_timeout.saturating_mul(2) + Duration::from_secs(5);
        let mut c = Conn::new(key, Side::Near, now + hold);
        c.held = Some(pkt.to_vec());
        self.conns.insert(id, c);
        self.by_key.insert(key, id);
        self.schedule(id, Some(now + hold));
        self.events.push_back(ProxyEvent::Incoming {
            conn: id,
            src: seg.src,
            dst: seg.dst,
        });
        Verdict::Taken
    }

    /// An ICMP error quoting a segment that went `src` to `dst`: ends a connect still
    /// in its handshake; taken (and otherwise ignored) for any connection.
    fn unreachable(&mut self, src: SocketAddr, dst: SocketAddr) -> Verdict {
        let Some(&id) = self.by_key.get(&(dst, src)) else {
            return Verdict::Pass;
        };
        if let Some(c) = self.conns.get_mut(&id) {
            if c.side == Side::Far && !c.open && c.fail.is_none() {
                c.fail = Some(Fail::Unreachable);
                self.mark_dirty(id);
            }
        }
        Verdict::Taken
    }

    /// Accepts a held SYN: the connection's handshake with the local application starts
    /// at the next [`poll`](Self::poll).
    pub fn accept(&mut self, now: Instant, conn: ConnId) {
        self.now = now;
        let mut stack = self.new_stack(conn, now);
        let timeout = self.cfg.connect_timeout;
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let Some(syn) = c.held.take() else {
            return;
        };
        // The destination was checked usable (port not 0), so listening cannot fail.
        let _ = stack.listen(c.key.1);
        stack.rx.push_back(syn);
        c.stack = Some(stack);
        c.deadline = now + timeout;
        self.mark_dirty(conn);
    }

    /// Refuses a held SYN: RST|ACK to the application, and the connection is closed.
    /// On a connection already accepted or connected, the same as [`abort`](Self::abort).
    pub fn refuse(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        match c.held.take() {
            Some(syn) => {
                self.tx.extend(packet::rst_for_syn(&syn));
                self.finish(conn);
            }
            None => self.abort(conn),
        }
    }

    /// Connects from `src` (the original client, any address) to `dst` through the
    /// TUN; `None` over the connection limit, for an unusable address or a 4-tuple in
    /// use. The SYN goes out at the next [`poll`](Self::poll).
    pub fn connect(&mut self, now: Instant, src: SocketAddr, dst: SocketAddr) -> Option<ConnId> {
        self.now = now;
        let (src, dst) = (canonical(src), canonical(dst));
        if !packet::usable(&src)
            || !packet::usable(&dst)
            || src.is_ipv4() != dst.is_ipv4()
            || self.conns.len() >= self.cfg.max_connections
        {
            return None;
        }
        let key = (dst, src);
        if self.by_key.contains_key(&key) || self.by_key.contains_key(&(src, dst)) {
            return None;
        }
        let id = self.new_id();
        let mut stack = self.new_stack(id, now);
        if !stack.connect(src, dst) {
            return None;
        }
        self.tombstones.remove(&key);
        let mut c = Conn::new(key, Side::Far, now + self.cfg.connect_timeout);
        c.stack = Some(stack);
        self.conns.insert(id, c);
        self.by_key.insert(key, id);
        self.mark_dirty(id);
        Some(id)
    }

    /// Queues bytes to send to the local peer; how many were taken (0 before the
    /// handshake is done, after `shutdown`, or with a full buffer).
    pub fn send(&mut self, conn: ConnId, data: &[u8]) -> usize {
        let Some(c) = self.conns.get_mut(&conn) else {
            return 0;
        };
        let n = if c.send_room() > 0 {
            let stack = c.stack.as_mut().map(|s| s.socket_mut());
            stack.map_or(0, |s| s.send_slice(data).unwrap_or(0))
        } else {
            0
        };
        if n < data.len() {
            c.want_writable = true;
        }
        if n > 0 {
            self.mark_dirty(conn);
        }
        n
    }

    /// Bytes [`send`](Self::send) would take now.
    pub fn send_room(&self, conn: ConnId) -> usize {
        self.conns.get(&conn).map_or(0, Conn::send_room)
    }

    /// Reads received bytes; 0 when there are none (see
    /// [`recv_finished`](Self::recv_finished) for the end).
    pub fn recv(&mut self, conn: ConnId, buf: &mut [u8]) -> usize {
        let Some(c) = self.conns.get_mut(&conn) else {
            return 0;
        };
        let had_eof = c.eof_taken;
        let n = c.recv(buf);
        if n > 0 || c.eof_taken != had_eof {
            self.mark_dirty(conn);
        }
        n
    }

    /// The local peer's FIN was received and every byte before it read.
    pub fn recv_finished(&self, conn: ConnId) -> bool {
        self.conns.get(&conn).is_some_and(Conn::recv_finished)
    }

    /// Sends FIN after the bytes already queued (half-close); deferred until the
    /// handshake is done.
    pub fn shutdown(&mut self, conn: ConnId) {
        if let Some(c) = self.conns.get_mut(&conn) {
            if c.held.is_none() {
                c.shutdown = true;
                self.mark_dirty(conn);
            }
        }
    }

    /// Resets the connection (RST to the local peer at the next poll; a held SYN is
    /// refused); `Closed` follows.
    pub fn abort(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if c.held.is_some() {
            return self.refuse(conn);
        }
        match c.stack.as_mut() {
            Some(s) => {
                s.socket_mut().abort();
                c.aborted = true;
                self.mark_dirty(conn);
            }
            None => self.finish(conn),
        }
    }

    /// Runs what is due: the packets fed since, the connections the caller touched,
    /// expired timers. Then [`poll_tun_packet`](Self::poll_tun_packet) and
    /// [`poll_event`](Self::poll_event) have the results.
    pub fn poll(&mut self, now: Instant) {
        self.now = now;
        self.prune_tombstones(now);
        while let Some(&(t, id)) = self.timers.first() {
            if t > now {
                break;
            }
            self.timers.pop_first();
            if let Some(c) = self.conns.get_mut(&id) {
                c.timer = None;
            }
            self.mark_dirty(id);
        }
        for id in std::mem::take(&mut self.dirty) {
            self.poll_conn(now, id);
        }
    }

    fn poll_conn(&mut self, now: Instant, id: ConnId) {
        let (smol_now, epoch) = (self.smol(now), self.epoch);
        let writable_at = self.cfg.buffer / 4;
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.dirty = false;
        if c.held.is_some() {
            if now >= c.deadline {
                self.finish(id);
            }
            return;
        }
        c.pre_run(now);
        let more = c
            .stack
            .as_mut()
            .is_some_and(|s| s.run(smol_now, &mut self.tx));
        if c.update(id, &mut self.events, writable_at) == Next::Finish {
            return self.finish(id);
        }
        let to_std = |t: SmolInstant| {
            epoch + Duration::from_micros(u64::try_from(t.total_micros()).unwrap_or(0))
        };
        // smoltcp never needs "now" again right after it ran dry: no busy loop.
        let at = c
            .next_poll(smol_now, to_std)
            .map(|t| t.max(now + Duration::from_millis(1)));
        self.schedule(id, at);
        if more {
            self.mark_dirty(id);
        }
    }

    fn schedule(&mut self, id: ConnId, at: Option<Instant>) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if let Some(old) = c.timer.take() {
            self.timers.remove(&(old, id));
        }
        if let Some(t) = at {
            c.timer = Some(t);
            self.timers.insert((t, id));
        }
    }

    /// Reports `Closed` and frees the connection; its 4-tuple becomes a tombstone.
    fn finish(&mut self, id: ConnId) {
        let Some(c) = self.conns.remove(&id) else {
            return;
        };
        if let Some(t) = c.timer {
            self.timers.remove(&(t, id));
        }
        self.by_key.remove(&c.key);
        let until = self.now + TOMBSTONE_FOR;
        self.tombstones.insert(c.key, until);
        self.tomb_order.push_back((c.key, until));
        self.events.push_back(ProxyEvent::Closed { conn: id });
    }

    fn prune_tombstones(&mut self, now: Instant) {
        let cap = self.cfg.max_connections.saturating_mul(4).max(1024);
        while let Some(&(key, until)) = self.tomb_order.front() {
            if until > now && self.tomb_order.len() <= cap {
                break;
            }
            self.tomb_order.pop_front();
            if self.tombstones.get(&key) == Some(&until) {
                self.tombstones.remove(&key);
            }
        }
    }

    /// The next packet to write to the TUN.
    pub fn poll_tun_packet(&mut self) -> Option<Vec<u8>> {
        self.tx.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<ProxyEvent> {
        self.events.pop_front()
    }

    /// When [`poll`](Self::poll) is due next (`now` if something waits already).
    pub fn poll_at(&self, now: Instant) -> Option<Instant> {
        if !self.dirty.is_empty() {
            return Some(now);
        }
        self.timers.first().map(|&(t, _)| t)
    }

    /// Connections tracked: held SYNs, handshakes, open ones, closed ones whose bytes
    /// the caller has not read yet.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }
}
