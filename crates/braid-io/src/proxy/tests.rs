//! The terminator against in-memory "kernels": smoltcp interfaces playing the
//! application's kernel (near end) or the server's (far end) on the other side of the
//! TUN, on a virtual clock.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use smoltcp::iface::{Config, Interface, PollResult, SocketHandle, SocketSet};
use smoltcp::phy::ChecksumCapabilities;
use smoltcp::socket::tcp::{Socket, SocketBuffer, State};
use smoltcp::time::Instant as SmolInstant;
use smoltcp::wire::{HardwareAddress, IpAddress, IpCidr, TcpControl, TcpPacket, TcpRepr};

use super::conn::Dev;
use super::packet::{self, Class, Seg, ACK, FIN, RST, SYN};
use super::*;

const BUF: usize = 256 * 1024;
const TICK: Duration = Duration::from_micros(50);

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Deterministic pseudo-random bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn data(seed: u64, n: usize) -> Vec<u8> {
    Rng(seed | 1).bytes(n)
}

/// A smoltcp interface playing a kernel behind the TUN.
struct Kernel {
    iface: Interface,
    sockets: SocketSet<'static>,
    rx: VecDeque<Vec<u8>>,
    tx: VecDeque<Vec<u8>>,
}

impl Kernel {
    fn new(addrs: &[IpAddr]) -> Kernel {
        let (mut rx, mut tx) = (VecDeque::new(), VecDeque::new());
        let mut dev = Dev {
            rx: &mut rx,
            tx: &mut tx,
            mtu: 1400,
        };
        let mut cfg = Config::new(HardwareAddress::Ip);
        cfg.random_seed = 0x5eed;
        let mut iface = Interface::new(cfg, &mut dev, SmolInstant::from_micros(0));
        iface.update_ip_addrs(|a| {
            for ip in addrs {
                let len = if ip.is_ipv4() { 32 } else { 128 };
                a.push(IpCidr::new((*ip).into(), len)).unwrap();
            }
        });
        let sockets = SocketSet::new(vec![]);
        Kernel {
            iface,
            sockets,
            rx,
            tx,
        }
    }

    fn socket(&mut self) -> SocketHandle {
        let mut s = Socket::new(
            SocketBuffer::new(vec![0; BUF]),
            SocketBuffer::new(vec![0; BUF]),
        );
        s.set_nagle_enabled(false);
        self.sockets.add(s)
    }

    fn sock(&mut self, h: SocketHandle) -> &mut Socket<'static> {
        self.sockets.get_mut::<Socket>(h)
    }

    fn connect(&mut self, local: SocketAddr, remote: SocketAddr) -> SocketHandle {
        let h = self.socket();
        let s = self.sockets.get_mut::<Socket>(h);
        s.connect(self.iface.context(), remote, local).unwrap();
        h
    }

    fn listen(&mut self, local: SocketAddr) -> SocketHandle {
        let h = self.socket();
        self.sock(h).listen(local).unwrap();
        h
    }

    fn poll(&mut self, now: SmolInstant) {
        let mut dev = Dev {
            rx: &mut self.rx,
            tx: &mut self.tx,
            mtu: 1400,
        };
        self.iface.poll(now, &mut dev, &mut self.sockets);
        for _ in 0..10_000 {
            if self.iface.poll_egress(now, &mut dev, &mut self.sockets) == PollResult::None {
                break;
            }
        }
    }
}

/// A terminator and the kernel on its TUN.
struct End {
    term: Terminator,
    kernel: Kernel,
    events: Vec<ProxyEvent>,
    /// Segments the terminator wrote to the TUN, and the kernel's.
    to_kernel: Vec<Seg>,
    from_kernel: Vec<Seg>,
    /// The first packets the terminator wrote (raw).
    raw_to_kernel: Vec<Vec<u8>>,
    passed: Vec<Vec<u8>>,
    /// The terminator's packets vanish.
    black_hole: bool,
}

fn seg_of(p: &[u8]) -> Option<Seg> {
    match packet::classify(p) {
        Class::Tcp(s) => Some(s),
        _ => None,
    }
}

impl End {
    fn new(cfg: TerminatorConfig, addrs: &[IpAddr], now: Instant) -> End {
        End {
            term: Terminator::new(cfg, now),
            kernel: Kernel::new(addrs),
            events: Vec::new(),
            to_kernel: Vec::new(),
            from_kernel: Vec::new(),
            raw_to_kernel: Vec::new(),
            passed: Vec::new(),
            black_hole: false,
        }
    }

    fn step(&mut self, now: Instant, smol: SmolInstant) {
        self.kernel.poll(smol);
        while let Some(p) = self.kernel.tx.pop_front() {
            self.from_kernel.extend(seg_of(&p));
            if self.term.handle_tun_packet(now, &p) == Verdict::Pass {
                self.passed.push(p);
            }
        }
        self.term.poll(now);
        while let Some(p) = self.term.poll_tun_packet() {
            self.to_kernel.extend(seg_of(&p));
            if self.raw_to_kernel.len() < 64 {
                self.raw_to_kernel.push(p.clone());
            }
            if !self.black_hole {
                self.kernel.rx.push_back(p);
            }
        }
        while let Some(e) = self.term.poll_event() {
            self.events.push(e);
        }
    }

    fn has(&self, e: ProxyEvent) -> bool {
        self.events.contains(&e)
    }

    fn state(&mut self, h: SocketHandle) -> State {
        self.kernel.sock(h).state()
    }
}

/// One end on a virtual clock.
struct Net {
    start: Instant,
    now: Instant,
    end: End,
}

impl Net {
    fn new(cfg: TerminatorConfig, addrs: &[IpAddr]) -> Net {
        let start = Instant::now();
        Net {
            start,
            now: start,
            end: End::new(cfg, addrs, start),
        }
    }

    fn smol(&self) -> SmolInstant {
        SmolInstant::from_micros((self.now - self.start).as_micros() as i64)
    }

    fn step_by(&mut self, d: Duration) {
        let smol = self.smol();
        self.end.step(self.now, smol);
        self.now += d;
    }

    fn step(&mut self) {
        self.step_by(TICK);
    }

    /// Steps until `f` holds; false if it never did within `max` steps.
    fn until(&mut self, max: usize, mut f: impl FnMut(&mut End) -> bool) -> bool {
        for _ in 0..max {
            self.step();
            if f(&mut self.end) {
                return true;
            }
        }
        false
    }

    /// Lets `d` of virtual time pass in steps of 10 ms.
    fn advance(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            self.step_by(Duration::from_millis(10));
        }
    }
}

const APP: &str = "10.0.0.1:40000";
const DST: &str = "10.1.0.2:80";
const APP6: &str = "[fd00::1]:40000";
const DST6: &str = "[fd00:1::2]:80";

/// The MSS and window scale options of a SYN or SYN-ACK packet.
fn syn_options(p: &[u8]) -> (Option<u16>, Option<u8>) {
    let addr = |r: std::ops::Range<usize>| -> IpAddress {
        match r.len() {
            4 => IpAddress::from(Ipv4Addr::from(<[u8; 4]>::try_from(&p[r]).unwrap())),
            _ => IpAddress::from(Ipv6Addr::from(<[u8; 16]>::try_from(&p[r]).unwrap())),
        }
    };
    let (src, dst, off) = match p[0] >> 4 {
        4 => (addr(12..16), addr(16..20), 20),
        _ => (addr(8..24), addr(24..40), 40),
    };
    let seg = TcpPacket::new_checked(&p[off..]).unwrap();
    let repr = TcpRepr::parse(&seg, &src, &dst, &ChecksumCapabilities::default()).unwrap();
    assert_eq!(repr.control, TcpControl::Syn);
    (repr.max_seg_size, repr.window_scale)
}

/// The application's kernel connecting to `dst` from `app`, before any accept.
fn near(cfg: TerminatorConfig, app: SocketAddr, dst: SocketAddr) -> (Net, SocketHandle) {
    let mut net = Net::new(cfg, &[app.ip()]);
    let h = net.end.kernel.connect(app, dst);
    (net, h)
}

fn incoming_id(end: &End) -> Option<ConnId> {
    end.events.iter().find_map(|e| match e {
        ProxyEvent::Incoming { conn, .. } => Some(*conn),
        _ => None,
    })
}

/// A near connection accepted and established.
fn accepted(app: &str, dst: &str) -> (Net, SocketHandle, ConnId) {
    let (mut net, h) = near(TerminatorConfig::default(), sa(app), sa(dst));
    assert!(net.until(100, |e| incoming_id(e).is_some()));
    let id = incoming_id(&net.end).unwrap();
    assert_eq!(
        net.end.events[0],
        ProxyEvent::Incoming {
            conn: id,
            src: sa(app),
            dst: sa(dst)
        }
    );
    net.end.term.accept(net.now, id);
    assert!(net.until(100, |e| e.state(h) == State::Established));
    // Nothing to tell yet: no bytes, no short send.
    net.until(10, |_| false);
    assert_eq!(net.end.events.len(), 1, "{:?}", net.end.events);
    (net, h, id)
}

/// Moves `up` from the kernel socket to the terminator and `down` the other way, at
/// once; returns what each side received.
fn transfer(
    net: &mut Net,
    h: SocketHandle,
    id: ConnId,
    up: &[u8],
    down: &[u8],
) -> (Vec<u8>, Vec<u8>) {
    let (mut sent_up, mut sent_down) = (0, 0);
    let (mut got_up, mut got_down) = (Vec::new(), Vec::new());
    let mut buf = vec![0u8; 64 * 1024];
    for _ in 0..200_000 {
        let s = net.end.kernel.sock(h);
        if sent_up < up.len() && s.can_send() {
            sent_up += s.send_slice(&up[sent_up..]).unwrap();
        }
        while let Ok(n) = s.recv_slice(&mut buf) {
            if n == 0 {
                break;
            }
            got_down.extend_from_slice(&buf[..n]);
        }
        sent_down += net.end.term.send(id, &down[sent_down..]);
        loop {
            let n = net.end.term.recv(id, &mut buf);
            if n == 0 {
                break;
            }
            got_up.extend_from_slice(&buf[..n]);
        }
        if got_up.len() >= up.len() && got_down.len() >= down.len() {
            break;
        }
        net.step();
    }
    (got_up, got_down)
}

#[test]
fn accept_carries_a_megabyte_each_way_then_half_closes_app_first() {
    let (mut net, h, id) = accepted(APP, DST);
    // The application's peer is the original destination (any_ip).
    assert_eq!(
        net.end.kernel.sock(h).remote_endpoint().unwrap(),
        sa(DST).into()
    );
    // MSS from the MTU, window scaling for the 256 KiB buffer.
    let (mss, scale) = syn_options(&net.end.raw_to_kernel[0]);
    assert_eq!((mss, scale), (Some(1400 - 40), Some(3)));
    let synack = net.end.to_kernel[0];
    assert_eq!(
        (synack.src, synack.dst, synack.flags & (SYN | ACK)),
        (sa(DST), sa(APP), SYN | ACK)
    );
    let (up, down) = (data(1, 1 << 20), data(2, 1 << 20));
    let (got_up, got_down) = transfer(&mut net, h, id, &up, &down);
    assert!(got_up == up && got_down == down, "bytes differ");

    // The application half-closes: PeerClosed, the end is readable; we still send.
    net.end.kernel.sock(h).close();
    assert!(net.until(1000, |e| e.has(ProxyEvent::PeerClosed { conn: id })));
    assert!(net.end.has(ProxyEvent::Readable { conn: id }));
    assert_eq!(net.end.term.recv(id, &mut [0u8; 16]), 0);
    assert!(net.end.term.recv_finished(id));
    let more = data(3, 100_000);
    let (_, got) = transfer(&mut net, h, id, &[], &more);
    assert!(got == more);
    assert!(!net.end.has(ProxyEvent::Closed { conn: id }));

    // Our half-close: the application reads the end, the connection is freed.
    net.end.term.shutdown(id);
    assert!(net.until(1000, |e| e.has(ProxyEvent::Closed { conn: id })));
    assert_eq!(net.end.term.connections(), 0);
    assert!(net.until(100, |e| e.state(h) == State::TimeWait));
    assert!(!net.end.kernel.sock(h).may_recv());
    assert!(!net.end.has(ProxyEvent::Reset { conn: id }));
    assert_eq!(
        net.end.term.send(id, b"x"),
        0,
        "a freed connection is unknown"
    );
    assert!(net.end.passed.is_empty());
}

#[test]
fn accept_half_closes_terminator_first() {
    let (mut net, h, id) = accepted(APP, DST);
    let down = data(4, 300_000);
    let (_, got) = transfer(&mut net, h, id, &[], &down);
    assert!(got == down);
    net.end.term.shutdown(id);
    assert!(net.until(1000, |e| e.state(h) == State::CloseWait));
    assert_eq!(
        net.end.term.send(id, b"late"),
        0,
        "no sending after shutdown"
    );
    // The application's direction stays open.
    let up = data(5, 500_000);
    let (got, _) = transfer(&mut net, h, id, &up, &[]);
    assert!(got == up);
    net.end.kernel.sock(h).close();
    assert!(net.until(1000, |e| e.has(ProxyEvent::PeerClosed { conn: id })));
    // Not freed before the caller has read to the end.
    net.advance(Duration::from_millis(100));
    assert_eq!(net.end.term.connections(), 1);
    assert_eq!(net.end.term.recv(id, &mut [0u8; 16]), 0);
    assert!(net.end.term.recv_finished(id));
    assert!(net.until(1000, |e| e.has(ProxyEvent::Closed { conn: id })));
    assert_eq!(net.end.term.connections(), 0);
    assert!(net.until(1000, |e| e.state(h) == State::Closed));
    assert!(!net.end.has(ProxyEvent::Reset { conn: id }));
}

#[test]
fn unread_bytes_survive_the_close() {
    let (mut net, h, id) = accepted(APP, DST);
    let up = data(6, 100_000);
    assert_eq!(net.end.kernel.sock(h).send_slice(&up).unwrap(), up.len());
    net.end.kernel.sock(h).close();
    net.end.term.shutdown(id);
    // Both FINs exchanged while the bytes sit unread.
    assert!(net.until(2000, |e| e.state(h) == State::Closed
        || e.state(h) == State::TimeWait));
    net.advance(Duration::from_secs(1));
    assert_eq!(net.end.term.connections(), 1);
    let mut got = Vec::new();
    let mut buf = vec![0u8; 7000];
    loop {
        let n = net.end.term.recv(id, &mut buf);
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got == up);
    assert!(net.end.term.recv_finished(id));
    assert!(net.until(10, |e| e.has(ProxyEvent::Closed { conn: id })));
}

#[test]
fn refuse_answers_rst_and_no_synack() {
    let (mut net, h) = near(TerminatorConfig::default(), sa(APP), sa(DST));
    assert!(net.until(100, |e| incoming_id(e).is_some()));
    let id = incoming_id(&net.end).unwrap();
    assert!(net.end.to_kernel.is_empty(), "nothing answers a held SYN");
    net.end.term.refuse(id);
    assert!(net.until(100, |e| e.state(h) == State::Closed));
    assert_eq!(net.end.to_kernel.len(), 1);
    let rst = net.end.to_kernel[0];
    assert_eq!((rst.src, rst.dst), (sa(DST), sa(APP)));
    assert_eq!(rst.flags & (RST | SYN | ACK), RST | ACK);
    assert!(net.end.has(ProxyEvent::Closed { conn: id }));
    assert_eq!(net.end.term.connections(), 0);
}

#[test]
fn held_syn_retransmissions_are_swallowed() {
    let (mut net, h) = near(TerminatorConfig::default(), sa(APP), sa(DST));
    assert!(net.until(100, |e| incoming_id(e).is_some()));
    net.advance(Duration::from_secs(4));
    let syns = net.end.from_kernel.iter().filter(|s| s.is_syn()).count();
    assert!(syns >= 3, "the kernel retransmitted its SYN ({syns})");
    let incoming = net
        .end
        .events
        .iter()
        .filter(|e| matches!(e, ProxyEvent::Incoming { .. }));
    assert_eq!(incoming.count(), 1);
    assert!(net.end.passed.is_empty() && net.end.to_kernel.is_empty());
    let id = incoming_id(&net.end).unwrap();
    net.end.term.accept(net.now, id);
    assert!(net.until(100, |e| e.state(h) == State::Established));
}

#[test]
fn held_syn_expires() {
    let cfg = TerminatorConfig {
        connect_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let (mut net, _h) = near(cfg, sa(APP), sa(DST));
    assert!(net.until(100, |e| incoming_id(e).is_some()));
    let id = incoming_id(&net.end).unwrap();
    net.advance(Duration::from_secs(6));
    assert!(!net.end.has(ProxyEvent::Closed { conn: id }));
    net.advance(Duration::from_secs(2));
    assert!(net.end.has(ProxyEvent::Closed { conn: id }));
    assert_eq!(net.end.term.connections(), 0);
}

/// A far end: the server's kernel listening on `server`.
fn far(cfg: TerminatorConfig, server: SocketAddr) -> (Net, SocketHandle) {
    let mut net = Net::new(cfg, &[server.ip()]);
    let h = net.end.kernel.listen(server);
    (net, h)
}

const SERVER: &str = "10.2.0.2:80";
const SERVER6: &str = "[fd00:2::2]:80";

fn connect_and_talk(client: &str, server: &str) {
    let (mut net, h) = far(TerminatorConfig::default(), sa(server));
    let id = net
        .end
        .term
        .connect(net.now, sa(client), sa(server))
        .unwrap();
    assert!(net.until(100, |e| e.has(ProxyEvent::Connected { conn: id })));
    let syn = net.end.to_kernel[0];
    assert!(syn.is_syn());
    assert_eq!((syn.src, syn.dst), (sa(client), sa(server)));
    let ip_hdr = if syn.src.is_ipv4() { 20 } else { 40 };
    let (mss, scale) = syn_options(&net.end.raw_to_kernel[0]);
    assert_eq!((mss, scale), (Some((1400 - ip_hdr - 20) as u16), Some(3)));
    assert!(net.until(100, |e| e.state(h) == State::Established));
    assert_eq!(
        net.end.kernel.sock(h).remote_endpoint().unwrap(),
        sa(client).into()
    );
    let (up, down) = (data(7, 200_000), data(8, 200_000));
    let (got_up, got_down) = transfer(&mut net, h, id, &up, &down);
    assert!(got_up == up && got_down == down);
    net.end.term.shutdown(id);
    assert!(net.until(1000, |e| e.state(h) == State::CloseWait));
    net.end.kernel.sock(h).close();
    assert!(net.until(1000, |e| e.has(ProxyEvent::PeerClosed { conn: id })));
    assert_eq!(net.end.term.recv(id, &mut [0u8; 4]), 0);
    assert!(net.until(1000, |e| e.has(ProxyEvent::Closed { conn: id })));
    assert_eq!(net.end.term.connections(), 0);
    assert!(net.end.passed.is_empty());
}

#[test]
fn connect_reaches_the_server_from_the_client_address() {
    connect_and_talk("10.0.0.1:40000", SERVER);
}

#[test]
fn connect_to_a_closed_port_is_refused() {
    let (mut net, _h) = far(TerminatorConfig::default(), sa(SERVER));
    let id = net
        .end
        .term
        .connect(net.now, sa(APP), sa("10.2.0.2:81"))
        .unwrap();
    let failed = ProxyEvent::ConnectFailed {
        conn: id,
        refused: true,
    };
    assert!(net.until(100, |e| e.has(failed)));
    assert!(net.end.has(ProxyEvent::Closed { conn: id }));
    assert!(!net.end.has(ProxyEvent::Connected { conn: id }));
    assert_eq!(net.end.term.connections(), 0);
}

#[test]
fn connect_times_out() {
    let cfg = TerminatorConfig {
        connect_timeout: Duration::from_secs(3),
        ..Default::default()
    };
    let (mut net, _h) = far(cfg, sa(SERVER));
    net.end.black_hole = true;
    let id = net.end.term.connect(net.now, sa(APP), sa(SERVER)).unwrap();
    net.advance(Duration::from_millis(2900));
    assert!(net.end.events.is_empty());
    assert!(
        net.end.to_kernel.iter().filter(|s| s.is_syn()).count() >= 2,
        "SYN retransmitted"
    );
    net.advance(Duration::from_millis(200));
    let failed = ProxyEvent::ConnectFailed {
        conn: id,
        refused: false,
    };
    assert_eq!(
        net.end.events,
        vec![failed, ProxyEvent::Closed { conn: id }]
    );
    assert_eq!(net.end.term.connections(), 0);
}

/// An ICMP (v4: type 3, v6: type 1) destination unreachable quoting `pkt`.
fn unreachable_for(pkt: &[u8], v6: bool) -> Vec<u8> {
    let quoted = &pkt[..pkt.len().min(if v6 { 60 } else { 28 })];
    let mut icmp = vec![if v6 { 1 } else { 3 }, 1, 0, 0, 0, 0, 0, 0];
    icmp.extend_from_slice(quoted);
    let mut p = if v6 {
        let mut h = vec![0x60, 0, 0, 0, 0, 0, 58, 64];
        h[4..6].copy_from_slice(&(icmp.len() as u16).to_be_bytes());
        h.extend_from_slice(&[0xfd, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9]);
        h.extend_from_slice(&pkt[8..24]); // to the quoted packet's source
        h
    } else {
        let mut h = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 1, 0, 0, 10, 9, 9, 9];
        h[2..4].copy_from_slice(&((20 + icmp.len()) as u16).to_be_bytes());
        h.extend_from_slice(&pkt[12..16]);
        h
    };
    p.extend_from_slice(&icmp);
    p
}

fn connect_unreachable(client: &str, server: &str, v6: bool) {
    let (mut net, _h) = far(TerminatorConfig::default(), sa(server));
    net.end.black_hole = true;
    let id = net
        .end
        .term
        .connect(net.now, sa(client), sa(server))
        .unwrap();
    net.step();
    let icmp = unreachable_for(&net.end.raw_to_kernel[0], v6);
    assert_eq!(
        net.end.term.handle_tun_packet(net.now, &icmp),
        Verdict::Taken
    );
    net.step();
    let failed = ProxyEvent::ConnectFailed {
        conn: id,
        refused: false,
    };
    assert_eq!(
        net.end.events,
        vec![failed, ProxyEvent::Closed { conn: id }]
    );
    // An unrelated ICMP error passes.
    let mut other = net.end.raw_to_kernel[0].clone();
    other[if v6 { 41 } else { 21 }] ^= 1; // another source port
    let icmp = unreachable_for(&other, v6);
    assert_eq!(
        net.end.term.handle_tun_packet(net.now, &icmp),
        Verdict::Pass
    );
}

#[test]
fn connect_fails_on_icmp_unreachable() {
    connect_unreachable(APP, SERVER, false);
    connect_unreachable(APP6, SERVER6, true);
}

#[test]
fn connect_refuses_a_tuple_in_use_and_over_the_limit() {
    let cfg = TerminatorConfig {
        max_connections: 2,
        ..Default::default()
    };
    let (mut net, _h) = far(cfg, sa(SERVER));
    let t = &mut net.end.term;
    assert!(t.connect(net.now, sa(APP), sa(SERVER)).is_some());
    assert!(
        t.connect(net.now, sa(APP), sa(SERVER)).is_none(),
        "same tuple"
    );
    assert!(
        t.connect(net.now, sa(SERVER), sa(APP)).is_none(),
        "reversed tuple"
    );
    assert!(
        t.connect(net.now, sa(APP), sa(APP6)).is_none(),
        "mixed families"
    );
    assert!(
        t.connect(net.now, sa("10.0.0.1:0"), sa(SERVER)).is_none(),
        "port 0"
    );
    assert!(t.connect(net.now, sa("10.0.0.1:1"), sa(SERVER)).is_some());
    assert!(
        t.connect(net.now, sa("10.0.0.1:2"), sa(SERVER)).is_none(),
        "limit"
    );
    assert_eq!(t.connections(), 2);
}

#[test]
fn abort_resets_the_application() {
    let (mut net, h, id) = accepted(APP, DST);
    net.end.term.abort(id);
    assert!(net.until(100, |e| e.state(h) == State::Closed));
    assert!(net.end.to_kernel.last().unwrap().flags & RST != 0);
    assert!(net.end.has(ProxyEvent::Closed { conn: id }));
    assert!(
        !net.end.has(ProxyEvent::Reset { conn: id }),
        "our own abort is no Reset"
    );
    assert_eq!(net.end.term.connections(), 0);
}

#[test]
fn application_reset_is_reported() {
    let (mut net, h, id) = accepted(APP, DST);
    net.end.kernel.sock(h).abort();
    assert!(net.until(100, |e| e.has(ProxyEvent::Closed { conn: id })));
    let pos = |ev: ProxyEvent| net.end.events.iter().position(|e| *e == ev).unwrap();
    assert!(pos(ProxyEvent::Reset { conn: id }) < pos(ProxyEvent::Closed { conn: id }));
    assert_eq!(net.end.term.connections(), 0);
}

#[test]
fn ipv6_accept_and_connect() {
    let (mut net, h, id) = accepted(APP6, DST6);
    let (up, down) = (data(9, 100_000), data(10, 100_000));
    let (got_up, got_down) = transfer(&mut net, h, id, &up, &down);
    assert!(got_up == up && got_down == down);
    net.end.kernel.sock(h).close();
    net.end.term.shutdown(id);
    assert!(net.until(1000, |e| e.has(ProxyEvent::PeerClosed { conn: id })));
    assert_eq!(net.end.term.recv(id, &mut [0u8; 4]), 0);
    assert!(net.until(1000, |e| e.has(ProxyEvent::Closed { conn: id })));
    connect_and_talk(APP6, SERVER6);
}

#[test]
fn writable_after_a_short_send() {
    let (mut net, h, id) = accepted(APP, DST);
    let big = data(11, 3 * BUF);
    let n = net.end.term.send(id, &big);
    assert!(n <= BUF && n > 0);
    net.advance(Duration::from_millis(50));
    // The application reads nothing: its window and our buffer fill up.
    let mut sent = n;
    for _ in 0..10 {
        sent += net.end.term.send(id, &big[sent..]);
        net.advance(Duration::from_millis(20));
    }
    assert!(sent < big.len());
    assert_eq!(net.end.term.send_room(id), 0);
    // Stalled: no Writable while the application reads nothing.
    net.end.events.clear();
    net.advance(Duration::from_millis(200));
    assert!(!net.end.has(ProxyEvent::Writable { conn: id }));
    let mut got = Vec::new();
    let mut buf = vec![0u8; 65536];
    for _ in 0..2000 {
        while let Ok(k) = net.end.kernel.sock(h).recv_slice(&mut buf) {
            if k == 0 {
                break;
            }
            got.extend_from_slice(&buf[..k]);
        }
        net.step();
        if net.end.has(ProxyEvent::Writable { conn: id }) {
            break;
        }
    }
    assert!(net.end.has(ProxyEvent::Writable { conn: id }));
    assert!(net.end.term.send_room(id) >= BUF / 4);
    assert!(got[..] == big[..got.len()]);
}

/// A raw IPv4 packet (`proto`, `payload`) from APP to DST's address.
fn ipv4(proto: u8, payload: &[u8]) -> Vec<u8> {
    let mut p = vec![
        0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, proto, 0, 0, 10, 0, 0, 1, 10, 1, 0, 2,
    ];
    p[2..4].copy_from_slice(&((20 + payload.len()) as u16).to_be_bytes());
    p.extend_from_slice(payload);
    p
}

/// A TCP packet APP -> DST with `flags` and a right checksum (unless `bad_sum`).
fn tcp(dport: u16, flags: u8, bad_sum: bool) -> Vec<u8> {
    let mut t = vec![0u8; 20];
    t[0..2].copy_from_slice(&40000u16.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t[4..8].copy_from_slice(&1234u32.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = flags;
    t[14] = 0xff;
    let mut p = ipv4(6, &t);
    let (src, dst) = (sa(APP).ip(), sa(DST).ip());
    let mut seg = TcpPacket::new_unchecked(&mut p[20..]);
    seg.fill_checksum(&IpAddress::from(src), &IpAddress::from(dst));
    if bad_sum {
        p[37] ^= 0x55;
    }
    p
}

#[test]
fn what_is_not_terminated_passes() {
    let cfg = TerminatorConfig {
        exclude_ports: vec![(22, 22)],
        max_connections: 1,
        ..Default::default()
    };
    let now = Instant::now();
    let mut t = Terminator::new(cfg, now);
    let udp = ipv4(17, &[0x9c, 0x40, 0, 53, 0, 8, 0, 0]);
    let ping = ipv4(1, &[8, 0, 0, 0, 0, 1, 0, 1]);
    for p in [
        udp,
        ping,
        tcp(80, ACK, false),
        tcp(80, SYN | ACK, false),
        tcp(80, RST, false),
    ] {
        assert_eq!(t.handle_tun_packet(now, &p), Verdict::Pass);
    }
    assert_eq!(
        t.handle_tun_packet(now, &tcp(22, SYN, false)),
        Verdict::Pass,
        "excluded"
    );
    assert_eq!(
        t.handle_tun_packet(now, &tcp(80, SYN, true)),
        Verdict::Pass,
        "bad sum"
    );
    assert_eq!(
        t.handle_tun_packet(now, &tcp(80, SYN | FIN, false)),
        Verdict::Pass
    );
    for junk in [&[][..], &[0x45], &[0x60; 39], &[0x45; 60]] {
        assert_eq!(t.handle_tun_packet(now, junk), Verdict::Pass);
    }
    assert_eq!(
        t.handle_tun_packet(now, &tcp(80, SYN, false)),
        Verdict::Taken
    );
    assert_eq!(
        t.handle_tun_packet(now, &tcp(80, SYN, false)),
        Verdict::Taken,
        "held"
    );
    // Over the limit (1): another 4-tuple passes.
    assert_eq!(
        t.handle_tun_packet(now, &tcp(81, SYN, false)),
        Verdict::Pass
    );
    assert_eq!(t.connections(), 1);
    t.poll(now);
    assert!(t.poll_tun_packet().is_none());
    assert!(matches!(t.poll_event(), Some(ProxyEvent::Incoming { .. })));
    assert_eq!(t.poll_event(), None);
}

#[test]
fn a_freed_tuple_swallows_strays_for_a_while() {
    let (mut net, h, id) = accepted(APP, DST);
    net.end.term.abort(id);
    assert!(net.until(100, |e| e.has(ProxyEvent::Closed { conn: id })));
    let _ = h;
    let stray = tcp(80, ACK, false);
    assert_eq!(
        net.end.term.handle_tun_packet(net.now, &stray),
        Verdict::Taken
    );
    net.advance(Duration::from_secs(11));
    assert_eq!(
        net.end.term.handle_tun_packet(net.now, &stray),
        Verdict::Pass
    );
}

/// `p` with random bytes changed, truncated or extended.
fn mutate(rng: &mut Rng, p: &[u8]) -> Vec<u8> {
    let mut q = p.to_vec();
    for _ in 0..1 + rng.below(4) {
        if !q.is_empty() {
            let i = rng.below(q.len());
            q[i] = rng.next() as u8;
        }
    }
    match rng.below(4) {
        0 => q.truncate(rng.below(q.len() + 1)),
        1 => {
            let n = rng.below(64);
            q.extend(rng.bytes(n))
        }
        _ => {}
    }
    q
}

/// A TCP packet of a known 4-tuple with random header fields and a right checksum.
fn random_segment(rng: &mut Rng, p: &[u8]) -> Vec<u8> {
    let mut q = p.to_vec();
    let Some((ip_len, src, dst)) = (match q.first().map(|b| b >> 4) {
        Some(4) if q.len() >= 40 => Some((20, sa(APP).ip(), sa(DST).ip())),
        _ => None,
    }) else {
        return q;
    };
    for i in [4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 18, 19] {
        q[ip_len + i] = rng.next() as u8;
    }
    let mut seg = TcpPacket::new_unchecked(&mut q[ip_len..]);
    seg.fill_checksum(&IpAddress::from(src), &IpAddress::from(dst));
    q
}

#[test]
fn random_bytes_never_panic() {
    let (mut net, h, id) = accepted(APP, DST);
    let (up, down) = (data(12, 50_000), data(13, 50_000));
    let mut samples: Vec<Vec<u8>> = Vec::new();
    let (_, _) = transfer(&mut net, h, id, &up, &down);
    for p in net.end.raw_to_kernel.iter() {
        samples.push(p.clone());
    }
    samples.push(tcp(80, ACK | 0x08, false));
    samples.push(tcp(80, SYN, false));
    samples.push(unreachable_for(&tcp(80, SYN, false), false));
    let mut rng = Rng(0x1234_5678);
    let _far = net
        .end
        .term
        .connect(net.now, sa("10.9.0.1:1000"), sa("10.9.0.2:2000"));
    for i in 0..30_000 {
        let p = match rng.below(4) {
            0 => {
                let n = rng.below(100);
                rng.bytes(n)
            }
            1 => {
                let n = 20 + rng.below(80);
                let mut b = rng.bytes(n);
                b[0] = if rng.below(2) == 0 { 0x45 } else { 0x60 };
                b
            }
            2 => random_segment(&mut rng, &tcp(80, ACK, false)),
            _ => {
                let k = rng.below(samples.len());
                mutate(&mut rng, &samples[k])
            }
        };
        let _ = net.end.term.handle_tun_packet(net.now, &p);
        if i % 16 == 0 {
            net.step_by(Duration::from_millis(3));
            let _ = net.end.term.recv(id, &mut [0u8; 256]);
        }
    }
    net.advance(Duration::from_secs(1));
    assert!(net.end.term.connections() <= 1 + net.end.events.len());
}

/// Near end, relay, far end: the application's kernel to the server's, as the tunnel
/// driver would wire two terminators.
struct Chain {
    a: Net,
    b: End,
    near: Option<ConnId>,
    far: Option<ConnId>,
    /// Bytes taken from one terminator, not yet given to the other.
    up: Vec<u8>,
    down: Vec<u8>,
    shut_up: bool,
    shut_down: bool,
    /// Events of each end already acted on.
    seen: (usize, usize),
}

impl Chain {
    fn new(
        client: SocketAddr,
        server: SocketAddr,
        listen: bool,
    ) -> (Chain, SocketHandle, Option<SocketHandle>) {
        let (a, h) = near(TerminatorConfig::default(), client, server);
        let mut b = End::new(TerminatorConfig::default(), &[server.ip()], a.now);
        let sh = listen.then(|| b.kernel.listen(server));
        let c = Chain {
            a,
            b,
            near: None,
            far: None,
            up: Vec::new(),
            down: Vec::new(),
            shut_up: false,
            shut_down: false,
            seen: (0, 0),
        };
        (c, h, sh)
    }

    fn step(&mut self) {
        let (now, smol) = (self.a.now, self.a.smol());
        self.b.step(now, smol);
        self.a.step();
        for e in self.a.end.events[self.seen.0..].iter().copied() {
            if let ProxyEvent::Incoming { conn, src, dst } = e {
                self.near = Some(conn);
                self.far = self.b.term.connect(now, src, dst);
            }
        }
        for e in self.b.events[self.seen.1..].iter().copied() {
            match (e, self.near) {
                (ProxyEvent::Connected { .. }, Some(n)) => self.a.end.term.accept(now, n),
                (ProxyEvent::ConnectFailed { .. }, Some(n)) => self.a.end.term.refuse(n),
                _ => {}
            }
        }
        self.seen = (self.a.end.events.len(), self.b.events.len());
        self.relay();
    }

    fn relay(&mut self) {
        let (Some(n), Some(f)) = (self.near, self.far) else {
            return;
        };
        let (na, fb) = (&mut self.a.end.term, &mut self.b.term);
        let mut buf = vec![0u8; 65536];
        pipe(na, n, fb, f, &mut self.up, &mut self.shut_up, &mut buf);
        pipe(fb, f, na, n, &mut self.down, &mut self.shut_down, &mut buf);
    }
}

/// Moves bytes (and the end) from `from`'s connection to `to`'s.
fn pipe(
    from: &mut Terminator,
    fc: ConnId,
    to: &mut Terminator,
    tc: ConnId,
    pending: &mut Vec<u8>,
    shut: &mut bool,
    buf: &mut [u8],
) {
    loop {
        if !pending.is_empty() {
            let n = to.send(tc, pending);
            pending.drain(..n);
            if !pending.is_empty() {
                return;
            }
        }
        let n = from.recv(fc, buf);
        if n == 0 {
            break;
        }
        pending.extend_from_slice(&buf[..n]);
    }
    if !*shut && from.recv_finished(fc) {
        *shut = true;
        to.shutdown(tc);
    }
}

fn chain_transfer(
    c: &mut Chain,
    h: SocketHandle,
    sh: SocketHandle,
    up: &[u8],
    down: &[u8],
) -> (Vec<u8>, Vec<u8>) {
    let (mut su, mut sd, mut gu, mut gd) = (0, 0, Vec::new(), Vec::new());
    let mut buf = vec![0u8; 65536];
    for _ in 0..1_000_000 {
        let k = &mut c.a.end.kernel;
        su += k.sock(h).send_slice(&up[su..]).unwrap_or(0);
        while let Ok(n @ 1..) = k.sock(h).recv_slice(&mut buf) {
            gd.extend_from_slice(&buf[..n]);
        }
        let s = c.b.kernel.sock(sh);
        sd += s.send_slice(&down[sd..]).unwrap_or(0);
        while let Ok(n @ 1..) = s.recv_slice(&mut buf) {
            gu.extend_from_slice(&buf[..n]);
        }
        if gu.len() >= up.len() && gd.len() >= down.len() {
            break;
        }
        c.step();
    }
    (gu, gd)
}

#[test]
fn chain_carries_a_connection_end_to_end() {
    let (mut c, h, sh) = Chain::new(sa(APP), sa(SERVER), true);
    let sh = sh.unwrap();
    for _ in 0..200 {
        c.step();
    }
    assert_eq!(c.a.end.state(h), State::Established);
    assert_eq!(
        c.b.kernel.sock(sh).remote_endpoint().unwrap(),
        sa(APP).into()
    );
    let (up, down) = (data(14, 1 << 20), data(15, 1 << 20));
    let (gu, gd) = chain_transfer(&mut c, h, sh, &up, &down);
    assert!(gu == up && gd == down, "bytes differ end to end");
    c.a.end.kernel.sock(h).close();
    for _ in 0..2000 {
        c.step();
    }
    assert_eq!(
        c.b.kernel.sock(sh).state(),
        State::CloseWait,
        "the FIN went through"
    );
    c.b.kernel.sock(sh).close();
    for _ in 0..2000 {
        c.step();
    }
    assert_eq!((c.a.end.term.connections(), c.b.term.connections()), (0, 0));
    assert!(c.a.end.has(ProxyEvent::Closed {
        conn: c.near.unwrap()
    }));
    assert!(c.b.has(ProxyEvent::Closed {
        conn: c.far.unwrap()
    }));
    assert!(matches!(c.a.end.state(h), State::TimeWait | State::Closed));
}

#[test]
fn chain_refuses_when_the_server_does() {
    let (mut c, h, _) = Chain::new(sa(APP), sa(SERVER), false);
    for _ in 0..200 {
        c.step();
    }
    assert_eq!(c.a.end.state(h), State::Closed);
    assert!(
        c.a.end.to_kernel.iter().all(|s| s.flags & SYN == 0),
        "never a SYN-ACK"
    );
    assert!(c.a.end.to_kernel.iter().any(|s| s.flags & RST != 0));
    assert_eq!((c.a.end.term.connections(), c.b.term.connections()), (0, 0));
}

/// Throughput of one connection through near terminator, relay and far terminator,
/// both kernels smoltcp too (`BRAID_PROXY_MB` megabytes, default 8; run it with
/// `--release --nocapture` for a meaningful figure).
#[test]
fn chain_throughput() {
    let mb: usize = std::env::var("BRAID_PROXY_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let (mut c, h, sh) = Chain::new(sa(APP), sa(SERVER), true);
    let sh = sh.unwrap();
    for _ in 0..200 {
        c.step();
    }
    let up = data(16, mb << 20);
    let t0 = Instant::now();
    let (gu, _) = chain_transfer(&mut c, h, sh, &up, &[]);
    let secs = t0.elapsed().as_secs_f64();
    assert!(gu == up);
    eprintln!(
        "chain_throughput: {mb} MiB in {secs:.3} s = {:.0} Mbit/s",
        (mb << 20) as f64 * 8.0 / secs / 1e6
    );
}

#[test]
fn send_before_the_handshake_gets_writable_after_it() {
    let (mut net, h) = near(TerminatorConfig::default(), sa(APP), sa(DST));
    assert!(net.until(100, |e| incoming_id(e).is_some()));
    let id = incoming_id(&net.end).unwrap();
    net.end.term.accept(net.now, id);
    assert_eq!(net.end.term.send(id, b"early"), 0);
    assert_eq!(net.end.term.send_room(id), 0);
    assert!(net.until(100, |e| e.has(ProxyEvent::Writable { conn: id })));
    assert_eq!(net.end.state(h), State::Established);
    assert_eq!(net.end.term.send(id, b"early"), 5);
}

#[test]
fn application_that_never_completes_the_handshake_is_reset() {
    let cfg = TerminatorConfig {
        connect_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let (mut net, _h) = near(cfg, sa(APP), sa(DST));
    assert!(net.until(100, |e| incoming_id(e).is_some()));
    let id = incoming_id(&net.end).unwrap();
    net.end.black_hole = true;
    net.end.term.accept(net.now, id);
    net.advance(Duration::from_millis(1900));
    assert!(
        net.end
            .to_kernel
            .iter()
            .filter(|s| s.flags & SYN != 0)
            .count()
            >= 2
    );
    assert!(!net.end.has(ProxyEvent::Closed { conn: id }));
    net.advance(Duration::from_millis(200));
    assert!(net.end.has(ProxyEvent::Reset { conn: id }));
    assert!(net.end.has(ProxyEvent::Closed { conn: id }));
}

#[test]
fn abort_during_connect_just_closes() {
    let (mut net, _h) = far(TerminatorConfig::default(), sa(SERVER));
    net.end.black_hole = true;
    let id = net.end.term.connect(net.now, sa(APP), sa(SERVER)).unwrap();
    net.step();
    net.end.term.abort(id);
    net.step();
    assert_eq!(net.end.events, vec![ProxyEvent::Closed { conn: id }]);
}

#[test]
fn idle_connection_lives_on_keepalives_and_dies_with_its_peer() {
    let (mut net, h, id) = accepted(APP, DST);
    let now = net.now;
    let next = net.end.term.poll_at(now).unwrap();
    assert!(
        next > now + Duration::from_secs(50),
        "idle: next poll for the keep-alive, not in {:?}",
        next - now
    );
    let step = |net: &mut Net, secs: u64| {
        for _ in 0..secs * 10 {
            net.step_by(Duration::from_millis(100));
        }
    };
    step(&mut net, 400);
    assert_eq!(net.end.state(h), State::Established);
    assert!(net.end.to_kernel.len() > 5, "keep-alives went out");
    assert!(!net.end.has(ProxyEvent::Reset { conn: id }));
    // The peer goes silent: reset 300 s after its last answer (to a keep-alive at
    // most 60 s before).
    net.end.black_hole = true;
    step(&mut net, 230);
    assert!(!net.end.has(ProxyEvent::Reset { conn: id }));
    step(&mut net, 80);
    assert!(net.end.has(ProxyEvent::Reset { conn: id }));
    assert!(net.end.has(ProxyEvent::Closed { conn: id }));
}
