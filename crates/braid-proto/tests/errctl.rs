//! Property tests of the error-control engine (seed 002): a sender and a receiver joined
//! by one lossy FIFO link in virtual time, data one way, SNAKs and PACKs the other.

use std::collections::VecDeque;

use braid_proto::errctl::{exceeds, Config, Receiver, Segment, Sender, Slot, Stats, Tolerance};
use braid_proto::rng::SplitMix64;
use braid_proto::wire::errctl::{PackRepr, SnakRepr};
use braid_proto::{Duration, Instant};
use bytes::Bytes;
use proptest::prelude::*;

/// The link: one packet every `tx_us`, `delay_us` one way, independent losses.
struct Net {
    tx_us: u64,
    delay_us: u64,
    loss: f64,
    back_loss: f64,
    /// Drop every end-of-stream packet sent before this time.
    drop_end_until_us: u64,
    /// The receiver releases packets in live mode.
    live: bool,
}

struct Outcome {
    segments: Vec<Segment>,
    sent: Stats,
    recv: Stats,
    /// Everything delivered, the receiver knows the stream is complete and the sender
    /// has its acknowledgement of the end.
    finished: bool,
}

fn is_end(d: &[u8]) -> bool {
    use braid_proto::wire::errctl::{DataKind, DataPacket, DataRepr};
    DataPacket::new_checked(d)
        .ok()
        .and_then(|p| DataRepr::parse(&p).ok())
        .is_some_and(|r| r.kind == DataKind::End)
}

fn payload(i: u64) -> Bytes {
    Bytes::from(i.to_be_bytes().to_vec())
}

/// Run `n` packets through; stop when every segment is delivered and the sender is
/// idle, or at `limit_us`.
fn run(cfg: &Config, net: &Net, n: u64, seed: u64, limit_us: u64) -> Outcome {
    let mut rng = SplitMix64::new(seed);
    let mut draw = move || (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    let mut tx = Sender::new(cfg.clone());
    let mut rx = Receiver::new(cfg.clone());
    rx.set_live(net.live);
    let mut fwd: VecDeque<(u64, Bytes)> = VecDeque::new();
    let mut back: VecDeque<(u64, Bytes)> = VecDeque::new();
    let mut segments = Vec::new();
    let (mut now, mut offered, mut tx_free) = (0u64, 0u64, 0u64);
    let mut blocked = false;
    loop {
        let t = Instant::from_micros(now);
        while offered < n && tx.can_accept() {
            tx.handle_packet(t, payload(offered)).unwrap();
            offered += 1;
            blocked = false;
        }
        if offered == n {
            tx.finish(t);
        }
        while fwd.front().is_some_and(|x| x.0 <= now) {
            let (_, d) = fwd.pop_front().unwrap();
            rx.handle_datagram(t, &d);
        }
        while back.front().is_some_and(|x| x.0 <= now) {
            let (_, d) = back.pop_front().unwrap();
            tx.handle_datagram(t, &d);
            blocked = false;
        }
        if tx.poll_timeout().is_some_and(|x| x <= t) {
            tx.handle_timeout(t);
            blocked = false;
        }
        if rx.poll_timeout().is_some_and(|x| x <= t) {
            rx.handle_timeout(t);
        }
        while let Some(c) = rx.poll_transmit() {
            if draw() >= net.back_loss {
                back.push_back((now + net.delay_us, c));
            }
        }
        while let Some(s) = rx.poll_deliver() {
            segments.push(s);
        }
        if now >= tx_free && !blocked {
            match tx.poll_transmit(t) {
                Some(d) => {
                    tx_free = now + net.tx_us;
                    let end_dropped = now < net.drop_end_until_us && is_end(&d);
                    if draw() >= net.loss && !end_dropped {
                        fwd.push_back((tx_free + net.delay_us, d));
                    }
                }
                None => blocked = true,
            }
        }
        let delivered: u64 = segments
            .iter()
            .map(|s: &Segment| s.packets.len() as u64)
            .sum();
        let done = delivered == n && tx.is_done() && rx.is_complete();
        if done || now >= limit_us {
            break;
        }
        let next = [
            fwd.front().map(|x| x.0),
            back.front().map(|x| x.0),
            tx.poll_timeout().map(|x| x.as_micros().max(tx_free)),
            rx.poll_timeout().map(|x| x.as_micros()),
            (!blocked).then_some(tx_free),
            (offered < n && tx.can_accept()).then_some(now),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(next) = next else { break };
        now = next.max(now + 1);
    }
    let delivered: u64 = segments.iter().map(|s| s.packets.len() as u64).sum();
    Outcome {
        finished: delivered == n && tx.is_done() && rx.is_complete(),
        segments,
        sent: tx.stats().clone(),
        recv: rx.stats().clone(),
    }
}

fn config(t: Tolerance, window: u32, deadline_ms: u64) -> Config {
    let mut c = Config::new(t, Duration::from_micros(2 * 1000 + 200));
    c.window = window;
    c.deadline = Duration::from_millis(deadline_ms);
    c
}

fn net(loss: f64, back_loss: f64) -> Net {
    Net {
        tx_us: 100,
        delay_us: 1000,
        loss,
        back_loss,
        drop_end_until_us: 0,
        live: false,
    }
}

fn slots(s: &Segment) -> Vec<Slot> {
    s.packets
        .iter()
        .map(|p| {
            if p.is_some() {
                Slot::Present
            } else {
                Slot::Missing
            }
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// (W, 0, 0) with any loss below 100 % both ways and a long deadline: everything
    /// arrives, exactly once, in order.
    #[test]
    fn full_recovery_delivers_everything_in_order(
        w in 1u16..12, window in 1u32..6, n in 1u64..150,
        loss in 0.0f64..0.7, back_loss in 0.0f64..0.7, seed in any::<u64>(),
    ) {
        let cfg = config(Tolerance::reliable(w), window, 3_600_000);
        let out = run(&cfg, &net(loss, back_loss), n, seed, 3_000_000_000);
        prop_assert!(out.finished, "did not finish: {:?} {:?}", out.sent, out.recv);
        let mut expect = 0u64;
        for (k, s) in out.segments.iter().enumerate() {
            prop_assert_eq!(s.number, k as u64);
            prop_assert!(!s.forced && !s.violated);
            for p in &s.packets {
                prop_assert_eq!(p.as_ref(), Some(&payload(expect)));
                expect += 1;
            }
        }
        prop_assert_eq!(expect, n);
        prop_assert_eq!(out.recv.violations, 0);
        prop_assert_eq!(out.recv.packets_tolerated, 0);
        prop_assert!(out.recv.packets_repaired <= out.sent.retransmissions);
        if loss == 0.0 {
            prop_assert_eq!(out.sent.retransmissions, 0);
            prop_assert_eq!(out.recv.packets_repaired, 0);
        }
    }

    /// (W, E, B): no delivered segment breaks the tolerance unless the deadline forced
    /// it, and every such segment is counted.
    #[test]
    fn tolerance_holds_unless_forced(
        w in 1u16..24, e in 0u16..6, b in 0u16..4, window in 1u32..5, n in 1u64..200,
        loss in 0.0f64..0.6, back_loss in 0.0f64..0.5, deadline_ms in 3u64..40,
        seed in any::<u64>(),
    ) {
        let t = Tolerance { w, e, b };
        let cfg = config(t, window, deadline_ms);
        let out = run(&cfg, &net(loss, back_loss), n, seed, 600_000_000);
        prop_assert!(out.finished, "did not finish: {:?} {:?}", out.sent, out.recv);
        let (mut forced, mut violated) = (0, 0);
        let mut total = 0u64;
        for (k, s) in out.segments.iter().enumerate() {
            prop_assert_eq!(s.number, k as u64);
            let broken = exceeds(t, &slots(s));
            prop_assert_eq!(broken, s.violated);
            prop_assert!(!broken || s.forced, "segment {} breaks {:?} unforced", k, t);
            forced += u64::from(s.forced);
            violated += u64::from(s.violated);
            for (j, p) in s.packets.iter().enumerate() {
                if let Some(p) = p {
                    prop_assert_eq!(p, &payload(total + j as u64));
                }
            }
            total += s.packets.len() as u64;
        }
        prop_assert_eq!(total, n);
        prop_assert_eq!(out.recv.segments_forced, forced);
        prop_assert_eq!(out.recv.violations, violated);
    }

    /// Live mode: the same guarantees, with segments in pieces that continue each other;
    /// with (W, 0, 0) every packet, in order.
    #[test]
    fn live_pieces_continue_each_other(
        w in 1u16..24, e in 0u16..6, b in 0u16..4, window in 1u32..5, n in 1u64..200,
        loss in 0.0f64..0.5, back_loss in 0.0f64..0.5, deadline_ms in 3u64..40,
        seed in any::<u64>(),
    ) {
        let t = Tolerance { w, e, b };
        let cfg = config(t, window, deadline_ms);
        let mut lossy = net(loss, back_loss);
        lossy.live = true;
        let out = run(&cfg, &lossy, n, seed, 600_000_000);
        prop_assert!(out.finished, "did not finish: {:?} {:?}", out.sent, out.recv);
        let (mut seg, mut at, mut total) = (0u64, 0usize, 0u64);
        let mut forced = 0;
        for s in &out.segments {
            prop_assert_eq!(s.number, seg);
            prop_assert_eq!(s.first, at, "piece of segment {} does not continue", seg);
            for (j, p) in s.packets.iter().enumerate() {
                if let Some(p) = p {
                    prop_assert_eq!(p, &payload(total + j as u64));
                } else {
                    prop_assert!(!t.full_recovery() || s.forced, "hole in (W,0,0) unforced");
                }
            }
            total += s.packets.len() as u64;
            at += s.packets.len();
            if s.last {
                forced += u64::from(s.forced);
                seg += 1;
                at = 0;
            } else {
                prop_assert!(!s.forced && !s.violated);
            }
        }
        prop_assert_eq!(total, n);
        prop_assert_eq!(at, 0, "the last segment did not end");
        prop_assert_eq!(out.recv.segments_forced, forced);
    }

    /// Garbage and forged SNAKs and PACKs never panic the sender, and each is counted
    /// exactly once (accepted, stale or rejected).
    #[test]
    fn garbage_control_is_counted(
        junk in proptest::collection::vec(
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..40),
                (any::<u32>(), 0u32..8, proptest::collection::vec((0u16..20, 0u16..20), 1..6))
                    .prop_map(|(c, s, r)| SnakRepr { cum_ack: c % 8, segment: s, ranges: r }.to_vec()),
                (0u32..8, 0u32..8).prop_map(|(c, s)| PackRepr { cum_ack: c, segment: s }.to_vec()),
            ],
            1..40),
        sent in 0u64..40,
    ) {
        let cfg = config(Tolerance { w: 8, e: 1, b: 1 }, 4, 1000);
        let mut tx = Sender::new(cfg.clone());
        let mut rx = Receiver::new(cfg);
        let mut t = 0u64;
        for i in 0..sent {
            if tx.can_accept() {
                tx.handle_packet(Instant::from_micros(t), payload(i)).unwrap();
            }
        }
        for d in &junk {
            t += 10_000;
            let now = Instant::from_micros(t);
            while let Some(p) = tx.poll_transmit(now) {
                rx.handle_datagram(now, &p);
            }
            let before = tx.stats().clone();
            tx.handle_datagram(now, d);
            let a = tx.stats();
            let counted = (a.snaks_received - before.snaks_received)
                + (a.snaks_rejected - before.snaks_rejected)
                + (a.snaks_stale - before.snaks_stale)
                + (a.packs_received - before.packs_received)
                + (a.packs_rejected - before.packs_rejected);
            prop_assert_eq!(counted, 1);
            // The receiver takes the same bytes without panicking; anything not an
            // error-control data packet is counted as malformed.
            let rb = rx.stats().clone();
            rx.handle_datagram(now, d);
            if d.first() != Some(&0xBC) {
                prop_assert_eq!(rx.stats().malformed, rb.malformed + 1);
            }
        }
    }
}

/// A SNAK naming packets not yet sent, reversed ranges, overlapping ranges, or a
/// segment beyond what was sent is rejected; a well-formed one is accepted and repaired.
#[test]
fn snak_validation() {
    let cfg = config(Tolerance::reliable(8), 4, 1000);
    let mut tx = Sender::new(cfg);
    let t0 = Instant::ZERO;
    for i in 0..12 {
        tx.handle_packet(t0, payload(i)).unwrap();
    }
    for _ in 0..10 {
        tx.poll_transmit(t0).unwrap(); // segment 0 whole, segment 1 packets 0 and 1
    }
    let later = Instant::from_micros(1_000_000);
    let snak = |segment, ranges: Vec<(u16, u16)>| {
        SnakRepr {
            cum_ack: 0,
            segment,
            ranges,
        }
        .to_vec()
    };
    for bad in [
        snak(1, vec![(0, 2)]),         // packet 2 of segment 1 not yet sent
        snak(0, vec![(3, 1)]),         // reversed
        snak(0, vec![(1, 3), (3, 4)]), // overlapping
        snak(0, vec![(4, 5), (1, 2)]), // not ascending
        snak(2, vec![(0, 0)]),         // segment not yet sent
        snak(9, vec![(0, 0)]),         // beyond the window
        snak(0, vec![(0, 8)]),         // beyond the segment
    ] {
        tx.handle_datagram(later, &bad);
    }
    assert_eq!(tx.stats().snaks_rejected, 7);
    assert_eq!(tx.stats().snaks_received, 0);
    tx.handle_datagram(later, &snak(0, vec![(1, 2), (5, 5)]));
    assert_eq!(tx.stats().snaks_received, 1);
    // The repairs go first (lower segment), then segment 1 continues.
    let mut order = Vec::new();
    while let Some(d) = tx.poll_transmit(later) {
        let p = braid_proto::wire::errctl::DataPacket::new_checked(&d[..]).unwrap();
        let r = braid_proto::wire::errctl::DataRepr::parse(&p).unwrap();
        order.push((r.segment, r.index, r.kind));
    }
    use braid_proto::wire::errctl::DataKind::{Data, KeepAlive};
    assert_eq!(
        order,
        vec![
            (0, 1, Data),
            (0, 2, Data),
            (0, 5, Data),
            (1, 2, Data),
            (1, 3, Data),
            (1, 3, KeepAlive)
        ]
    );
    assert_eq!(tx.stats().retransmissions, 3);
    assert_eq!(tx.stats().packets_sent, 12);
    // A request arriving less than one round trip after the repair is premature.
    tx.handle_datagram(later, &snak(0, vec![(1, 1)]));
    assert_eq!(tx.stats().premature_requests, 1);
    assert!(tx.poll_transmit(later).is_none());
}

/// The end of stream is acknowledged even when every end-of-stream packet sent in the
/// first 50 ms is lost, whatever the length of the last segment, for an empty stream
/// too: the receiver learns that the stream is complete and the sender that it knows.
#[test]
fn end_of_stream_survives_losing_every_end_packet() {
    for n in [0u64, 1, 7, 8, 16, 17, 64] {
        let cfg = config(Tolerance::reliable(8), 4, 1000);
        let mut lossy = net(0.0, 0.0);
        lossy.drop_end_until_us = 50_000;
        let out = run(&cfg, &lossy, n, 7, 10_000_000);
        assert!(out.finished, "n = {n}: {:?} {:?}", out.sent, out.recv);
        let delivered: usize = out.segments.iter().map(|s| s.packets.len()).sum();
        assert_eq!(delivered as u64, n);
        assert!(out.recv.end_acks_sent >= 1, "n = {n}");
        // End packets kept coming after the 50 ms: more than one was sent.
        assert!(out.sent.keepalives_sent >= 2, "n = {n}: {:?}", out.sent);
    }
}

/// Without the end acknowledgement the sender is never done: with every end packet
/// lost it keeps sending them (and is idle, every segment acknowledged, but not done).
#[test]
fn sender_is_not_done_without_the_end_acknowledgement() {
    let cfg = config(Tolerance::reliable(8), 4, 1000);
    let mut lossy = net(0.0, 0.0);
    lossy.drop_end_until_us = u64::MAX;
    let out = run(&cfg, &lossy, 16, 1, 2_000_000);
    assert!(!out.finished);
    assert_eq!(out.segments.len(), 2);
    assert_eq!(out.recv.end_acks_sent, 0);
    // One end packet per keep-alive period (1.1 ms) for about two seconds.
    assert!(out.sent.keepalives_sent > 1000, "{:?}", out.sent);
}

/// A SNAK's packets are counted as repaired when they arrive.
#[test]
fn repairs_are_counted_at_the_receiver() {
    let cfg = config(Tolerance::reliable(16), 4, 100_000);
    let out = run(&cfg, &net(0.2, 0.0), 400, 3, 60_000_000);
    assert!(out.finished);
    assert!(out.recv.packets_repaired > 40, "{:?}", out.recv);
    assert!(out.recv.packets_repaired <= out.sent.retransmissions);
}

/// Live mode releases the decided start of a segment at once: received packets and a
/// hole the tolerance accepts; outside live mode nothing comes before the segment ends.
#[test]
fn live_mode_releases_before_the_segment_ends() {
    for live in [false, true] {
        let cfg = config(Tolerance { w: 10, e: 1, b: 1 }, 4, 1000);
        let mut tx = Sender::new(cfg.clone());
        let mut rx = Receiver::new(cfg);
        rx.set_live(live);
        let t = Instant::from_micros(1000);
        for i in 0..4 {
            tx.handle_packet(t, payload(i)).unwrap();
        }
        let mut k = 0;
        while let Some(d) = tx.poll_transmit(t) {
            if k != 1 {
                rx.handle_datagram(t, &d);
            }
            k += 1;
        }
        let got: Vec<Segment> = std::iter::from_fn(|| rx.poll_deliver()).collect();
        if !live {
            assert!(got.is_empty(), "{got:?}");
            continue;
        }
        let packets: Vec<Option<Bytes>> = got.iter().flat_map(|s| s.packets.clone()).collect();
        assert_eq!(
            packets,
            vec![Some(payload(0)), None, Some(payload(2)), Some(payload(3))]
        );
        assert!(got.iter().all(|s| s.number == 0 && !s.last));
        assert_eq!(got[0].first, 0);
    }
}

/// The round trip the premature-request filter uses grows to the one acknowledgements
/// show (over a bond: the paths plus the resequencing waits), so a request repeated
/// within it gets no duplicate; segments with a packet sent twice give no sample.
#[test]
fn the_sender_measures_the_round_trip_from_acknowledgements() {
    let mut cfg = config(Tolerance::reliable(4), 4, 10_000);
    cfg.adaptive_rtt = true;
    let configured = cfg.rtt;
    let mut tx = Sender::new(cfg);
    let ms = |x: u64| Instant::from_micros(x * 1000);
    for i in 0..8 {
        tx.handle_packet(ms(0), payload(i)).unwrap();
    }
    for _ in 0..8 {
        tx.poll_transmit(ms(0)).unwrap(); // segments 0 and 1, whole
    }
    assert_eq!(tx.rtt(), configured);
    let pack = |cum_ack, segment| PackRepr { cum_ack, segment }.to_vec();
    let snak = |segment, ranges: Vec<(u16, u16)>| {
        SnakRepr {
            cum_ack: 0,
            segment,
            ranges,
        }
        .to_vec()
    };
    // Segment 1 loses packet 2: asked for at 100 ms and sent again.
    tx.handle_datagram(ms(100), &snak(1, vec![(2, 2)]));
    assert!(tx.poll_transmit(ms(100)).is_some());
    // Segment 0 is acknowledged 120 ms after its last packet left: the sample.
    tx.handle_datagram(ms(120), &pack(1, 0));
    assert_eq!(tx.rtt(), Duration::from_millis(120));
    // The request repeated 60 ms after the repair left is premature now (it was not
    // with the configured 2.2 ms).
    tx.handle_datagram(ms(160), &snak(1, vec![(2, 2)]));
    assert_eq!(tx.stats().premature_requests, 1);
    while tx.poll_transmit(ms(160)).is_some() {} // keep-alives only
    assert_eq!(tx.stats().retransmissions, 1);
    // Segment 1's acknowledgement, 400 ms after its repair, is no sample (Karn).
    tx.handle_datagram(ms(500), &pack(2, 1));
    assert_eq!(tx.rtt(), Duration::from_millis(120));

    // Without adaptive_rtt (the paper's filter, on the configured round trip only) the
    // same repeated request is answered.
    let mut tx = Sender::new(config(Tolerance::reliable(4), 4, 10_000));
    for i in 0..8 {
        tx.handle_packet(ms(0), payload(i)).unwrap();
    }
    for _ in 0..8 {
        tx.poll_transmit(ms(0)).unwrap();
    }
    tx.handle_datagram(ms(100), &snak(1, vec![(2, 2)]));
    assert!(tx.poll_transmit(ms(100)).is_some());
    tx.handle_datagram(ms(120), &pack(1, 0));
    assert_eq!(tx.rtt(), configured);
    tx.handle_datagram(ms(160), &snak(1, vec![(2, 2)]));
    while tx.poll_transmit(ms(160)).is_some() {}
    assert_eq!(tx.stats().retransmissions, 2);
    assert_eq!(tx.stats().premature_requests, 0);
}
