//! Issue 30: a channel's peer address is learnt from authenticated datagrams only. A
//! client behind a NAT (whose mapping may change) talks to a server that knows no
//! client address; only what authenticates, fresh, moves an endpoint.

use std::net::SocketAddr;

use super::*;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A client `a` (whose channels leave through a NAT: the server sees them from
/// `mapped[c]`) and a server `b` that knows no client address. A datagram the
/// server sends to anything but the current mapping is lost, as in a NAT.
struct Nat {
    now: Instant,
    a: Session,
    b: Session,
    /// Per channel: the server's address (where the client sends).
    server: Vec<SocketAddr>,
    /// Per channel: the client's address as the server sees it (the NAT's mapping).
    mapped: Vec<SocketAddr>,
    /// In flight, delivered at the next step: (to the server?, channel, source, bytes).
    wire: Vec<(bool, usize, SocketAddr, Bytes)>,
    /// Datagrams the client sent, per channel, if recording.
    captured: Vec<Vec<Bytes>>,
    /// Server datagrams lost because they went to a stale mapping.
    lost_to_stale: u64,
    events_b: Vec<Event>,
    delivered_b: Vec<u64>,
    delivered_a: Vec<u64>,
    next_id: u64,
    /// No application traffic.
    idle: bool,
    /// When each end last sent on each channel, and the longest silence so far (of
    /// either end, any channel), from `watch_from` on.
    last_tx: [Vec<Instant>; 2],
    longest_silence: Duration,
    watch_from: Instant,
}

impl Nat {
    fn new(n: usize) -> Nat {
        let mut a = Session::new(config(n, Mode::Logical), [1; 32], Instant::ZERO).unwrap();
        let mut b = Session::new(config(n, Mode::Logical), [2; 32], Instant::ZERO).unwrap();
        let server: Vec<SocketAddr> = (0..n)
            .map(|c| addr(&format!("192.0.2.1:{}", 7000 + c)))
            .collect();
        for (c, &s) in server.iter().enumerate() {
            a.set_endpoint(c, Some(s));
            b.set_endpoint(c, None);
        }
        Nat {
            now: Instant::ZERO,
            a,
            b,
            server,
            mapped: (0..n)
                .map(|c| addr(&format!("198.51.100.{}:{}", 10 + c, 40000 + c)))
                .collect(),
            wire: Vec::new(),
            captured: vec![Vec::new(); n],
            lost_to_stale: 0,
            events_b: Vec::new(),
            delivered_b: Vec::new(),
            delivered_a: Vec::new(),
            next_id: 0,
            idle: false,
            last_tx: [vec![Instant::ZERO; n], vec![Instant::ZERO; n]],
            longest_silence: Duration::ZERO,
            watch_from: Instant::ZERO,
        }
    }

    /// One millisecond: deliver what is in flight, send a packet each way, run the
    /// timers, collect what is sent.
    fn step(&mut self) {
        self.now += Duration::from_millis(1);
        let now = self.now;
        for (to_b, c, src, d) in std::mem::take(&mut self.wire) {
            if to_b {
                self.b.handle_datagram_from(now, c, src, d);
            } else {
                self.a.handle_datagram_from(now, c, src, d);
            }
        }
        if self.a.peer_seen() && !self.idle {
            self.a.handle_packet(now, packet(self.next_id));
            self.b.handle_packet(now, packet(self.next_id));
            self.next_id += 1;
        }
        if now >= self.a.poll_timeout() {
            self.a.handle_timeout(now);
        }
        if now >= self.b.poll_timeout() {
            self.b.handle_timeout(now);
        }
        while let Some(t) = self.a.poll_transmit() {
            self.sent(0, t.channel);
            assert_eq!(t.destination, Some(self.server[t.channel]));
            self.captured[t.channel].push(t.bytes.clone());
            let src = self.mapped[t.channel];
            self.wire.push((true, t.channel, src, t.bytes));
        }
        while let Some(t) = self.b.poll_transmit() {
            self.sent(1, t.channel);
            let to = t.destination.expect("a server sends only where it knows");
            if to == self.mapped[t.channel] {
                let src = self.server[t.channel];
                self.wire.push((false, t.channel, src, t.bytes));
            } else {
                self.lost_to_stale += 1;
            }
        }
        while let Some(p) = self.b.poll_deliver() {
            self.delivered_b.push(id_of(&p));
        }
        while let Some(p) = self.a.poll_deliver() {
            self.delivered_a.push(id_of(&p));
        }
        while let Some(e) = self.b.poll_event() {
            self.events_b.push(e);
        }
        while self.a.poll_event().is_some() {}
    }

    fn sent(&mut self, end: usize, c: usize) {
        let last = self.last_tx[end][c].max(self.watch_from);
        self.longest_silence = self.longest_silence.max(self.now.saturating_since(last));
        self.last_tx[end][c] = self.now;
    }

    fn run_ms(&mut self, ms: u64) {
        for _ in 0..ms {
            self.step();
        }
    }

    fn moves(&self) -> Vec<(usize, Option<SocketAddr>, SocketAddr)> {
        self.events_b
            .iter()
            .filter_map(|e| match e {
                Event::EndpointChanged { channel, from, to } => Some((*channel, *from, *to)),
                _ => None,
            })
            .collect()
    }
}

#[test]
fn a_server_learns_a_client_behind_nat_and_follows_a_new_mapping() {
    let mut p = Nat::new(2);
    // Before the client is heard, the server sends nothing (it has nowhere to).
    p.b.handle_timeout(Instant::ZERO);
    assert!(p.b.poll_transmit().is_none());
    p.run_ms(300);
    assert!(p.a.peer_seen() && p.b.peer_seen());
    assert_eq!(p.b.endpoint(0), Some(p.mapped[0]));
    assert_eq!(p.b.endpoint(1), Some(p.mapped[1]));
    assert_eq!(
        p.moves(),
        vec![(0, None, p.mapped[0]), (1, None, p.mapped[1])],
        "each channel learnt once"
    );
    let (to_b, to_a) = (p.delivered_b.len(), p.delivered_a.len());
    assert!(to_b > 200 && to_a > 200, "{to_b} {to_a}");

    // The NAT maps channel 0 anew: the server follows with the next authenticated
    // datagram, and its traffic reaches the new mapping.
    let old = p.mapped[0];
    let new = addr("198.51.100.77:51234");
    p.mapped[0] = new;
    p.lost_to_stale = 0;
    p.run_ms(2);
    assert_eq!(
        p.b.endpoint(0),
        Some(new),
        "moved within the first datagram"
    );
    assert_eq!(p.moves().last(), Some(&(0, Some(old), new)));
    let s = p.b.stats(p.now);
    assert_eq!(s.channels[0].endpoint_changes, 1);
    assert_eq!(s.channels[1].endpoint_changes, 0);
    assert_eq!(s.channels[0].endpoint, Some(new));
    // Only what was sent before the move was lost; nothing is sent to the old one now.
    let stale = p.lost_to_stale;
    p.run_ms(500);
    assert_eq!(p.lost_to_stale, stale);
    let a_stats = p.a.stats(p.now);
    assert!(a_stats.channels.iter().all(|c| c.state == LinkState::Up));
    assert!(p
        .b
        .stats(p.now)
        .channels
        .iter()
        .all(|c| c.state == LinkState::Up));
}

#[test]
fn a_forged_a_replayed_or_a_late_datagram_never_moves_an_endpoint() {
    let mut p = Nat::new(2);
    p.run_ms(300);
    let genuine = p.mapped[1];
    assert_eq!(p.b.endpoint(1), Some(genuine));
    let attacker = addr("203.0.113.66:6666");
    let before = p.b.stats(p.now).channels[1].clone();

    // A replay of the client's own sealed datagrams (from the attacker's address).
    // (Only what the server has taken already: the rest is still on its way.)
    let recorded: Vec<Bytes> = p.captured[1]
        .iter()
        .filter(|d| !p.wire.iter().any(|w| w.3 == **d))
        .rev()
        .take(20)
        .cloned()
        .collect();
    for d in &recorded {
        p.b.handle_datagram_from(p.now, 1, attacker, d.clone());
    }
    // A forgery: a genuine datagram with its tag changed.
    let mut forged = p.captured[1].last().unwrap().to_vec();
    *forged.last_mut().unwrap() ^= 1;
    p.b.handle_datagram_from(p.now, 1, attacker, Bytes::from(forged));
    // A replay of the client's handshake initiation (its first datagram).
    let init = p.captured[1][0].clone();
    assert_eq!(init[0], wire::TYPE_HS_INIT);
    p.b.handle_datagram_from(p.now, 1, attacker, init);
    p.run_ms(20);
    assert_eq!(p.b.endpoint(1), Some(genuine), "moved by an attacker");
    let after = p.b.stats(p.now).channels[1].clone();
    assert_eq!(after.endpoint_changes, 0);
    assert!(after.replays >= before.replays + 20, "{after:?}");
    assert_eq!(after.auth_failures, before.auth_failures + 1);
    assert!(p.moves().iter().all(|m| m.2 != attacker));

    // A late datagram (sealed before ones the server already took) from an address
    // the client left: authentic and new to the server, but not the newest on the
    // channel, so it does not take the endpoint back.
    let held = loop {
        p.step();
        let sealed =
            |w: &(bool, usize, SocketAddr, Bytes)| w.0 && w.1 == 0 && w.3[0] == wire::TYPE_SEALED;
        if let Some(i) = p.wire.iter().position(sealed) {
            break p.wire.remove(i).3;
        }
    };
    // Later ones on the channel arrive first; the held one comes before in-bond
    // repair would send it again (after about a round trip and a few ms).
    let rx = p.b.stats(p.now).channels[0].rx_datagrams;
    p.run_ms(3);
    assert!(p.b.stats(p.now).channels[0].rx_datagrams > rx);
    let replays = p.b.stats(p.now).channels[0].replays;
    let left = addr("198.51.100.99:999");
    let now = p.now;
    p.b.handle_datagram_from(now, 0, left, held);
    assert_eq!(
        p.b.stats(p.now).channels[0].replays,
        replays,
        "it was accepted"
    );
    assert_eq!(p.b.endpoint(0), Some(p.mapped[0]));
    assert_eq!(p.b.stats(p.now).channels[0].endpoint_changes, 0);
}

#[test]
fn an_idle_session_sends_on_every_channel_every_heartbeat_at_both_ends() {
    // The hellos are the keepalives that hold a NAT's mapping open: with no traffic
    // at all, each end still sends on each channel at least once per heartbeat (the
    // idle heartbeat, once nothing has flowed for `idle_after`).
    let mut p = Nat::new(3);
    p.idle = true;
    p.run_ms(300);
    assert!(p.a.peer_seen() && p.b.peer_seen());
    p.watch_from = p.now;
    p.longest_silence = Duration::ZERO;
    p.run_ms(10_000);
    let heartbeat = p.a.config().idle_heartbeat;
    assert!(
        heartbeat < Duration::from_secs(25),
        "NATs forget after 30 s"
    );
    for end in 0..2 {
        for (c, &t) in p.last_tx[end].iter().enumerate() {
            assert!(
                p.now.saturating_since(t) <= heartbeat,
                "end {end} channel {c}"
            );
        }
    }
    assert!(
        p.longest_silence <= heartbeat,
        "a channel was silent for {:?} (heartbeat {heartbeat:?})",
        p.longest_silence
    );
    assert_eq!(p.delivered_b.len() + p.delivered_a.len(), 0);
}

/// A server restarts (a service restart: it closes its sessions, telling each client,
/// and comes back knowing no client address). It cannot reach its clients behind NAT;
/// the client, told its peer ended its run, handshakes again at once instead of after
/// [`crypto::REHANDSHAKE_AFTER_SILENCE`] of silence.
#[test]
fn a_client_handshakes_again_at_once_when_its_server_closes_and_comes_back() {
    let mut p = Nat::new(2);
    p.run_ms(500);
    assert!(p.a.peer_seen() && p.b.peer_seen());
    p.b.close(p.now);
    p.run_ms(5);
    assert!(p.a.stats(p.now).peer_closed);
    // The new run of the server: fresh state, no endpoints.
    let mut b = Session::new(config(2, Mode::Logical), [7; 32], p.now).unwrap();
    for c in 0..2 {
        b.set_endpoint(c, None);
    }
    p.b = b;
    let (back, to_b, to_a) = (p.now, p.delivered_b.len(), p.delivered_a.len());
    let events = p.events_b.len();
    p.run_ms(1000);
    assert!(
        p.events_b[events..].contains(&Event::PeerHeard),
        "the restarted server never heard the client"
    );
    assert!(
        p.delivered_b.len() > to_b + 500 && p.delivered_a.len() > to_a + 500,
        "traffic did not flow again within a second of the server's return at {back:?}: \
         {} to the server, {} to the client",
        p.delivered_b.len() - to_b,
        p.delivered_a.len() - to_a
    );
}
