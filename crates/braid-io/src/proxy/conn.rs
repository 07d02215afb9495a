//! One terminated connection: its own smoltcp interface (one socket, fed only the
//! packets of its 4-tuple), and the bookkeeping that turns socket states into events.

use std::collections::VecDeque;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Instant;

use smoltcp::iface::{Config, Interface, PollResult, SocketHandle, SocketSet};
use smoltcp::phy::{Device, DeviceCapabilities, Medium, RxToken, TxToken};
use smoltcp::socket::tcp::{Socket, SocketBuffer, State};
use smoltcp::time::{Duration as SmolDuration, Instant as SmolInstant};
use smoltcp::wire::{HardwareAddress, IpCidr};

use super::{ConnId, ProxyEvent};

/// The interface's own addresses (RFC 7600's IPv4 dummy address and the IPv6 discard
/// prefix of RFC 6666): only the gateways of the any_ip default routes.
const OWN_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 0, 8);
const OWN_V6: Ipv6Addr = Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 1);
/// Keep-alive towards the peer of an idle open connection (also a zero-window probe).
const KEEP_ALIVE: SmolDuration = SmolDuration::from_secs(60);
/// An open connection whose peer sent nothing for this long is reset.
const IDLE_TIMEOUT: SmolDuration = SmolDuration::from_secs(300);
/// Packets one connection may emit per `poll` before the others get their turn.
const EGRESS_BURST: usize = 256;
/// Packets queued for one connection between two polls, at most (more are dropped).
pub(super) const RX_QUEUE_MAX: usize = 512;

/// Which end of the tunnel the connection is terminated at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Side {
    /// The local application connected to us (through the TUN).
    Near,
    /// We connected (through the TUN) on a remote client's behalf.
    Far,
}

/// Why a handshake was given up by us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fail {
    Timeout,
    Unreachable,
}

/// A queue-backed smoltcp device: packets in from the TUN, packets out to it.
pub(super) struct Dev<'a> {
    pub rx: &'a mut VecDeque<Vec<u8>>,
    pub tx: &'a mut VecDeque<Vec<u8>>,
    pub mtu: usize,
}

pub(super) struct Rx(Vec<u8>);
pub(super) struct Tx<'a>(&'a mut VecDeque<Vec<u8>>);

impl RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut buf = vec![0u8; len];
        let r = f(&mut buf);
        self.0.push_back(buf);
        r
    }
}

impl Device for Dev<'_> {
    type RxToken<'b>
        = Rx
    where
        Self: 'b;
    type TxToken<'b>
        = Tx<'b>
    where
        Self: 'b;

    fn receive(&mut self, _: SmolInstant) -> Option<(Rx, Tx<'_>)> {
        let p = self.rx.pop_front()?;
        Some((Rx(p), Tx(self.tx)))
    }

    fn transmit(&mut self, _: SmolInstant) -> Option<Tx<'_>> {
        Some(Tx(self.tx))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ip;
        caps.max_transmission_unit = self.mtu;
        caps
    }
}

/// A connection's TCP machinery.
pub(super) struct Stack {
    iface: Interface,
    sockets: SocketSet<'static>,
    handle: SocketHandle,
    /// Packets from the TUN for this connection, not yet processed.
    pub rx: VecDeque<Vec<u8>>,
    mtu: usize,
}

impl Stack {
    /// An interface in any_ip mode with one TCP socket, not yet listening or connecting.
    pub fn new(seed: u64, mtu: usize, buffer: usize, now: SmolInstant) -> Box<Stack> {
        let (mut rx, mut tx) = (VecDeque::new(), VecDeque::new());
        let mut dev = Dev {
            rx: &mut rx,
            tx: &mut tx,
            mtu,
        };
        let mut config = Config::new(HardwareAddress::Ip);
        config.random_seed = seed;
        let mut iface = Interface::new(config, &mut dev, now);
        iface.set_any_ip(true);
        iface.update_ip_addrs(|a| {
            let _ = a.push(IpCidr::new(OWN_V4.into(), 32));
            let _ = a.push(IpCidr::new(OWN_V6.into(), 128));
        });
        // any_ip accepts a packet for a foreign address only if a route to it goes via
        // one of the interface's own addresses: default routes through them cover all.
        let _ = iface.routes_mut().add_default_ipv4_route(OWN_V4);
        let _ = iface.routes_mut().add_default_ipv6_route(OWN_V6);
        let mut socket = Socket::new(
            SocketBuffer::new(vec![0u8; buffer]),
            SocketBuffer::new(vec![0u8; buffer]),
        );
        socket.set_nagle_enabled(false);
        socket.set_ack_delay(None);
        // Set before listen/connect so that the first keep-alive waits its interval;
        // the idle timeout is longer than any handshake deadline.
        socket.set_keep_alive(Some(KEEP_ALIVE));
        socket.set_timeout(Some(IDLE_TIMEOUT));
        let mut sockets = SocketSet::new(Vec::with_capacity(1));
        let handle = sockets.add(socket);
        Box::new(Stack {
            iface,
            sockets,
            handle,
            rx,
            mtu,
        })
    }

    pub fn socket(&self) -> &Socket<'static> {
        self.sockets.get::<Socket>(self.handle)
    }

    pub fn socket_mut(&mut self) -> &mut Socket<'static> {
        self.sockets.get_mut::<Socket>(self.handle)
    }

    /// Starts listening on exactly `local` (the original destination).
    pub fn listen(&mut self, local: SocketAddr) -> bool {
        self.socket_mut().listen(local).is_ok()
    }

    /// Starts connecting from `local` (any address: any_ip) to `remote`.
    pub fn connect(&mut self, local: SocketAddr, remote: SocketAddr) -> bool {
        let socket = self.sockets.get_mut::<Socket>(self.handle);
        socket.connect(self.iface.context(), remote, local).is_ok()
    }

    /// Processes the queued packets and timers, emitting into `tx`; true if it stopped
    /// at the burst limit with more to send.
    pub fn run(&mut self, now: SmolInstant, tx: &mut VecDeque<Vec<u8>>) -> bool {
        let mut dev = Dev {
            rx: &mut self.rx,
            tx,
            mtu: self.mtu,
        };
        self.iface.poll(now, &mut dev, &mut self.sockets);
        for _ in 0..EGRESS_BURST {
            let r = self.iface.poll_egress(now, &mut dev, &mut self.sockets);
            if r == PollResult::None {
                return false;
            }
        }
        true
    }

    /// When smoltcp wants to be polled again.
    pub fn poll_at(&mut self, now: SmolInstant) -> Option<SmolInstant> {
        self.iface.poll_at(now, &self.sockets)
    }

    /// Takes every received byte not yet read.
    fn drain(&mut self) -> Vec<u8> {
        let socket = self.socket_mut();
        let mut out = Vec::with_capacity(socket.recv_queue());
        loop {
            let got = socket.recv(|b| {
                out.extend_from_slice(b);
                (b.len(), b.len())
            });
            if !matches!(got, Ok(n) if n > 0) {
                break;
            }
        }
        out
    }
}

/// A connection as the terminator tracks it.
pub(super) struct Conn {
    /// (source, destination) of the packets that come from the TUN for it.
    pub key: (SocketAddr, SocketAddr),
    pub side: Side,
    /// The SYN held until `accept` or `refuse` (near end).
    pub held: Option<Vec<u8>>,
    pub stack: Option<Box<Stack>>,
    /// When the held SYN expires, or the handshake must be done by.
    pub deadline: Instant,
    /// Handshake complete.
    pub open: bool,
    left_listen: bool,
    pub fail: Option<Fail>,
    pub aborted: bool,
    /// An RST came in among the packets of this poll.
    pub rst_in_batch: bool,
    fin_seen: bool,
    peer_closed_sent: bool,
    /// The caller has read up to the end of a finished stream.
    pub eof_taken: bool,
    pub shutdown: bool,
    closed_sent: bool,
    pub readable_armed: bool,
    pub want_writable: bool,
    /// Bytes received before the socket was freed, not yet read.
    pub leftover: VecDeque<u8>,
    pub dirty: bool,
    pub timer: Option<Instant>,
}

/// What the terminator does with a connection after an update.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Next {
    Keep,
    /// Report `Closed` and free it.
    Finish,
}

impl Conn {
    pub fn new(key: (SocketAddr, SocketAddr), side: Side, deadline: Instant) -> Conn {
        Conn {
            key,
            side,
            held: None,
            stack: None,
            deadline,
            open: false,
            left_listen: false,
            fail: None,
            aborted: false,
            rst_in_batch: false,
            fin_seen: false,
            peer_closed_sent: false,
            eof_taken: false,
            shutdown: false,
            closed_sent: false,
            readable_armed: false,
            want_writable: false,
            leftover: VecDeque::new(),
            dirty: false,
            timer: None,
        }
    }

    /// Bytes `send` would take now.
    pub fn send_room(&self) -> usize {
        match &self.stack {
            Some(s) if !self.shutdown && s.socket().may_send() => {
                let sock = s.socket();
                sock.send_capacity() - sock.send_queue()
            }
            _ => 0,
        }
    }

    /// Whether the peer's FIN was received and every byte before it read.
    pub fn recv_finished(&self) -> bool {
        let queued = self.stack.as_ref().map_or(0, |s| s.socket().recv_queue());
        self.fin_seen && queued == 0 && self.leftover.is_empty()
    }

    /// Reads received bytes into `buf`.
    pub fn recv(&mut self, buf: &mut [u8]) -> usize {
        let n = if !self.leftover.is_empty() {
            let n = buf.len().min(self.leftover.len());
            for (d, s) in buf.iter_mut().zip(self.leftover.drain(..n)) {
                *d = s;
            }
            n
        } else if let Some(s) = &mut self.stack {
            s.socket_mut().recv_slice(buf).unwrap_or(0)
        } else {
            0
        };
        let queued = self.stack.as_ref().map_or(0, |s| s.socket().recv_queue());
        if queued == 0 && self.leftover.is_empty() {
            self.readable_armed = false;
            if self.fin_seen {
                self.eof_taken = true;
            }
        }
        n
    }

    /// Before running the stack: give up a handshake past its deadline, or one an ICMP
    /// error ended.
    pub fn pre_run(&mut self, now: Instant) {
        if self.open {
            return;
        }
        if self.fail.is_none() && now >= self.deadline {
            self.fail = Some(Fail::Timeout);
        }
        if self.fail.is_some() {
            if let Some(s) = &mut self.stack {
                s.socket_mut().abort();
            }
        }
    }

    /// After running the stack: report what changed.
    pub fn update(
        &mut self,
        id: ConnId,
        ev: &mut VecDeque<ProxyEvent>,
        writable_at: usize,
    ) -> Next {
        let Some(stack) = &self.stack else {
            return self.drained_next();
        };
        let state = stack.socket().state();
        let rst = std::mem::take(&mut self.rst_in_batch);
        if !self.open {
            if let Some(next) = self.handshake(id, state, rst, ev) {
                return next;
            }
        }
        self.data_events(id, state, ev, writable_at);
        self.terminal(id, state, rst, ev)
    }

    /// The handshake's progress: `None` once open (go on), else what to do now.
    fn handshake(
        &mut self,
        id: ConnId,
        state: State,
        rst: bool,
        ev: &mut VecDeque<ProxyEvent>,
    ) -> Option<Next> {
        let synced = !matches!(
            state,
            State::Closed | State::Listen | State::SynSent | State::SynReceived
        );
        if synced {
            self.open = true;
            if self.side == Side::Far {
                ev.push_back(ProxyEvent::Connected { conn: id });
            }
            return None;
        }
        if state != State::Listen {
            self.left_listen = true;
        }
        let over = state == State::Closed || (state == State::Listen && (self.left_listen || rst));
        if !over {
            return Some(Next::Keep);
        }
        let ours = self.aborted && self.fail.is_none();
        if !ours {
            ev.push_back(match self.side {
                Side::Far => ProxyEvent::ConnectFailed {
                    conn: id,
                    refused: self.fail.is_none(),
                },
                Side::Near => ProxyEvent::Reset { conn: id },
            });
        }
        Some(Next::Finish)
    }

    /// Readable, PeerClosed, Writable; a pending half-close.
    fn data_events(
        &mut self,
        id: ConnId,
        state: State,
        ev: &mut VecDeque<ProxyEvent>,
        writable_at: usize,
    ) {
        if matches!(
            state,
            State::CloseWait | State::LastAck | State::Closing | State::TimeWait
        ) {
            self.fin_seen = true;
        }
        let Some(stack) = self.stack.as_mut() else {
            return;
        };
        let queued = stack.socket().recv_queue() > 0;
        if (queued || (self.fin_seen && !self.eof_taken)) && !self.readable_armed {
            self.readable_armed = true;
            ev.push_back(ProxyEvent::Readable { conn: id });
        }
        if self.fin_seen && !self.peer_closed_sent {
            self.peer_closed_sent = true;
            ev.push_back(ProxyEvent::PeerClosed { conn: id });
        }
        if self.shutdown
            && !self.closed_sent
            && matches!(state, State::Established | State::CloseWait)
        {
            self.closed_sent = true;
            stack.socket_mut().close();
        }
        if self.want_writable && self.send_room() >= writable_at.max(1) {
            self.want_writable = false;
            ev.push_back(ProxyEvent::Writable { conn: id });
        }
    }

    /// Closed or TIME-WAIT: free the socket (keeping unread bytes), or report a reset.
    fn terminal(
        &mut self,
        id: ConnId,
        state: State,
        rst: bool,
        ev: &mut VecDeque<ProxyEvent>,
    ) -> Next {
        let clean = match state {
            State::TimeWait => true,
            // After LAST-ACK: our FIN (so all our bytes) acknowledged, no RST, not
            // the idle timeout with bytes still unacknowledged.
            State::Closed => {
                let unacked = self.stack.as_ref().map_or(0, |s| s.socket().send_queue());
                self.fin_seen && self.closed_sent && !rst && unacked == 0
            }
            _ => return Next::Keep,
        };
        if self.aborted {
            return Next::Finish;
        }
        if !clean {
            ev.push_back(ProxyEvent::Reset { conn: id });
            return Next::Finish;
        }
        if let Some(mut stack) = self.stack.take() {
            self.leftover.extend(stack.drain());
        }
        self.drained_next()
    }

    /// A cleanly closed connection whose socket is gone: finished once the caller read
    /// everything.
    fn drained_next(&self) -> Next {
        if self.leftover.is_empty() && self.eof_taken {
            Next::Finish
        } else {
            Next::Keep
        }
    }

    /// When this connection wants `poll` again: smoltcp's timers and the deadline.
    pub fn next_poll(
        &mut self,
        now: SmolInstant,
        to_std: impl Fn(SmolInstant) -> Instant,
    ) -> Option<Instant> {
        let handshake = (!self.open).then_some(self.deadline);
        let stack_at = self.stack.as_mut().and_then(|s| s.poll_at(now)).map(to_std);
        match (handshake, stack_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}
