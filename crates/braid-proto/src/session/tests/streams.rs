//! TCP carried as streams through a session pair (`session::streams`): a stream's
//! data frames ride the stripe over a lossy bond (its control frames the lowest-delay
//! channel) and arrive as the bytes written, none of
//! them delivered as a packet; an end opens streams only to a peer that announced them.

use super::*;
use crate::stream::{StreamConfig, StreamEvent, StreamId};

/// Streams on, every channel paced (the streams' rate is the pacer's).
fn streams_on(c: &mut Config) {
    c.pacing = Some(PacingConfig::new(vec![20e6; c.channels.len()]));
    c.streams = Some(StreamConfig::default());
}

fn addr(s: &str) -> std::net::SocketAddr {
    s.parse().unwrap()
}

/// A opens a stream from 10.0.0.1:`port` to 10.0.0.2:80.
fn open_from(p: &mut Pair, port: u16) -> StreamId {
    let src = std::net::SocketAddr::from(([10, 0, 0, 1], port));
    let now = p.now;
    p.a.streams()
        .unwrap()
        .open(now, src, addr("10.0.0.2:80"))
        .unwrap()
}

/// B's side of the transfer: accept the stream A opens, read what arrives.
#[derive(Default)]
struct Reader {
    id: Option<StreamId>,
    got: Vec<u8>,
}

impl Reader {
    fn step(&mut self, p: &mut Pair) {
        let now = p.now;
        let st = p.b.streams().unwrap();
        while let Some(e) = st.poll_event() {
            if let StreamEvent::Incoming { id, src, dst } = e {
                assert_eq!(
                    (src.ip(), dst),
                    (addr("10.0.0.1:1").ip(), addr("10.0.0.2:80"))
                );
                st.accept(now, id);
                self.id = Some(id);
            }
        }
        if let Some(id) = self.id {
            let mut buf = [0u8; 65536];
            loop {
                let n = st.read(id, &mut buf);
                if n == 0 {
                    break;
                }
                self.got.extend_from_slice(&buf[..n]);
            }
        }
        p.b.handle_streams(now);
    }

    fn finished(&self, p: &Pair) -> bool {
        self.id
            .is_some_and(|id| p.b.streams_ref().unwrap().finished(id))
    }
}

#[test]
fn a_stream_crosses_a_lossy_bond_intact_and_no_frame_is_delivered_as_a_packet() {
    let mut p = pair_with(3, Mode::Logical, &[5, 20, 60], |c| {
        streams_on(c);
        c.arq = Some(ArqConfig::default());
    });
    p.every = Duration::ZERO;
    // The slow channel loses one datagram in 40, both ways.
    p.ab[2].drop_every = 40;
    p.ba[2].drop_every = 40;
    p.run_until(at_ms(500));
    assert!(p.a.streams_usable() && p.b.streams_usable());
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let id = open_from(&mut p, 40000);
    let (mut b, mut sent) = (Reader::default(), 0);
    pump_stream(&mut p, &mut b, id, &data, &mut sent, at_ms(20_000), true);
    let t = p.now;
    assert!(b.finished(&p), "the stream ended by {t:?}");
    assert!(
        b.got == data,
        "{} bytes of {} arrived, in order",
        b.got.len(),
        data.len()
    );
    // 3 MB over 3 x 20 Mbit/s in well under the time a packet-level TCP's slow start
    // at the slowest channel's round trip would take to get going.
    assert!(t < at_ms(2500), "{t:?}");
    assert!(p.delivered.is_empty(), "no frame reached the application");
    let s = p.b.stats(p.now);
    assert!(s.channels[2].arq.missing > 0, "the channel did lose");
    assert_eq!(p.b.streams_ref().unwrap().stats().malformed, 0);
}

#[test]
fn control_frames_take_the_lowest_delay_channel_past_the_stripe() {
    let mut p = pair_with(3, Mode::Logical, &[60, 20, 5], streams_on);
    p.every = Duration::ZERO;
    p.run_until(at_ms(1000));
    assert!(p.a.streams_usable() && p.b.streams_usable());
    let t0 = p.now;
    let id = open_from(&mut p, 40000);
    let (mut b, mut opened) = (Reader::default(), None);
    while opened.is_none() && p.now < t0 + Duration::from_millis(500) {
        p.run_until(p.now + Duration::from_millis(1));
        let now = p.now;
        let st = p.a.streams().unwrap();
        while let Some(e) = st.poll_event() {
            if e == (StreamEvent::Opened { id }) {
                opened = Some(now);
            }
        }
        p.a.handle_streams(now);
        b.step(&mut p);
        p.flush();
    }
    // OPEN and OPEN_RESULT each cross the 5 ms channel (whichever channel the stripe
    // would have named next), a round trip of 10 ms, plus the 1 ms steps.
    let took = opened.expect("opened") - t0;
    assert!(took <= Duration::from_millis(13), "{took:?}");
    let (fa, fb) = (&p.a.stats(p.now).flows, &p.b.stats(p.now).flows);
    assert!(fa.tx_stream_control >= 1 && fb.rx_stream_control >= 1);
    assert!(fb.tx_stream_control >= 1 && fa.rx_stream_control >= 1);
    // Not counted as a flow's packets, and nothing reached the application.
    assert_eq!((fa.tx_lowest_delay, fb.rx_delivered), (0, 0));
    assert!(p.delivered.is_empty() && p.delivered_a.is_empty());
}

#[test]
fn streams_go_only_to_a_peer_that_announced_them() {
    let mut p = pair_with(2, Mode::Logical, &[5, 10], streams_on);
    let mut plain = config(2, Mode::Logical);
    plain.pacing = Some(PacingConfig::new(vec![20e6; 2]));
    p.b = Session::new(plain, [2; 32], Instant::ZERO).unwrap();
    p.run_until(at_ms(500));
    assert!(p.a.peer_seen() && p.b.peer_seen());
    // A takes streams, B does not: A must not open any (its driver carries TCP as
    // packets), and B has none to offer.
    assert!(!p.a.streams_usable());
    assert!(p.a.streams_ref().is_some());
    assert!(p.b.streams_ref().is_none() && !p.b.streams_usable());
}

#[test]
fn streams_need_every_channel_paced() {
    let mut c = config(2, Mode::Logical);
    c.streams = Some(StreamConfig::default());
    let e = Session::new(c, [1; 32], Instant::ZERO).err().unwrap();
    assert!(
        e.0.contains("tcp_streams needs every channel paced"),
        "{}",
        e.0
    );
}

/// Move `data` from A's stream `id` to B's reader for 1 ms steps until `until` or
/// until it is all written (`sent` counts it) and, with `finish`, finished.
fn pump_stream(
    p: &mut Pair,
    b: &mut Reader,
    id: StreamId,
    data: &[u8],
    sent: &mut usize,
    until: Instant,
    finish: bool,
) {
    let mut fin = false;
    let mut t = p.now;
    while t < until && !b.finished(p) {
        t += Duration::from_millis(1);
        p.run_until(t);
        let now = p.now;
        let st = p.a.streams().unwrap();
        while *sent < data.len() {
            let n = st.write(now, id, &data[*sent..]);
            if n == 0 {
                break;
            }
            *sent += n;
        }
        if finish && *sent == data.len() && !fin {
            st.finish(now, id);
            fin = true;
        }
        while st.poll_event().is_some() {}
        p.a.handle_streams(now);
        b.step(p);
        p.flush();
    }
}

#[test]
fn a_stream_outlives_a_new_run_that_keeps_it_and_a_restart_resets_it() {
    let mut p = pair_with(2, Mode::Logical, &[5, 20], streams_on);
    p.every = Duration::ZERO;
    p.run_until(at_ms(500));
    assert!(p.a.streams_usable() && p.b.streams_usable());
    let data: Vec<u8> = (0..2_000_000u32).map(|i| (i * 13 % 251) as u8).collect();
    let id = open_from(&mut p, 40000);
    let (mut b, mut sent) = (Reader::default(), 0);
    pump_stream(&mut p, &mut b, id, &data, &mut sent, at_ms(700), false);
    assert!(
        !b.got.is_empty() && b.got.len() < data.len(),
        "{}",
        b.got.len()
    );

    // A's new run (a reload that changed its channel list): a new machine, which
    // carries the streams on under the same streams run.
    let run = p.a.streams_run().unwrap();
    let mut cfg = config(2, Mode::Logical);
    streams_on(&mut cfg);
    cfg.streams.as_mut().unwrap().run = run;
    let mut next = Session::new(cfg.clone(), [9; 32], p.now).unwrap();
    next.adopt_streams(p.a.take_streams());
    p.a = next;
    pump_stream(&mut p, &mut b, id, &data, &mut sent, at_ms(10_000), true);
    assert!(b.finished(&p), "the stream ended");
    assert!(
        b.got == data,
        "{} of {} bytes, in order",
        b.got.len(),
        data.len()
    );
    assert_eq!(p.b.streams_ref().unwrap().stats().resets_received, 0);

    // A restarts (its streams are gone; a new run of its own): B's open stream resets.
    let id2 = open_from(&mut p, 40001);
    let (mut b2, mut sent2) = (Reader::default(), 0);
    let small = vec![7u8; 10_000];
    let until = p.now + Duration::from_millis(200);
    pump_stream(&mut p, &mut b2, id2, &small, &mut sent2, until, false);
    assert!(b2.id.is_some(), "B took the second stream");
    cfg.streams.as_mut().unwrap().run = 0;
    p.a = Session::new(cfg, [10; 32], p.now).unwrap();
    p.run_until(p.now + Duration::from_millis(500));
    assert!(p.a.streams_usable());
    // (The first stream too: B had not finished its own direction.)
    assert!(p.b.streams_ref().unwrap().stats().resets_received >= 1);
}

/// B's side of several streams: accept every one A opens, read each.
#[derive(Default)]
struct Readers {
    got: Vec<(StreamId, Vec<u8>)>,
}

impl Readers {
    fn step(&mut self, p: &mut Pair) {
        let now = p.now;
        let st = p.b.streams().unwrap();
        while let Some(e) = st.poll_event() {
            if let StreamEvent::Incoming { id, .. } = e {
                st.accept(now, id);
                self.got.push((id, Vec::new()));
            }
        }
        let mut buf = [0u8; 65536];
        for (id, got) in &mut self.got {
            loop {
                let n = st.read(*id, &mut buf);
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
        }
        p.b.handle_streams(now);
    }
}

/// A small stream (a 120-byte message every 20 ms for 2 s, a remote shell's or a
/// game's) over channels of 60, 20 and 5 ms, beside a 3 MB bulk stream if `bulk`
/// (opened first), the 60 ms channel losing one datagram in 40 if `lossy`: each
/// message's one-way delay (from its write to the step B has all of it), what the
/// bulk stream delivered, and A's flow counters.
fn small_beside_bulk(fast: bool, bulk: bool, lossy: bool) -> (Vec<Duration>, Vec<u8>, FlowStats) {
    let mut p = pair_with(3, Mode::Logical, &[60, 20, 5], |c| {
        streams_on(c);
        c.arq = Some(ArqConfig::default());
        c.streams.as_mut().unwrap().fast_lane = fast;
    });
    p.every = Duration::ZERO;
    if lossy {
        p.ab[0].drop_every = 40;
        p.ba[0].drop_every = 40;
    }
    p.run_until(at_ms(1000));
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let big = bulk.then(|| open_from(&mut p, 40001));
    let small = open_from(&mut p, 40002);
    let mut b = Readers::default();
    let (mut sent, mut written, mut wrote_at) = (0, 0, Vec::new());
    let mut delays = Vec::new();
    let start = p.now + Duration::from_millis(200);
    while p.now < start + Duration::from_millis(2500) {
        p.run_until(p.now + Duration::from_millis(1));
        let now = p.now;
        let st = p.a.streams().unwrap();
        while st.poll_event().is_some() {}
        if let Some(id) = big {
            sent += st.write(now, id, &data[sent..]);
        }
        let due = now >= start + Duration::from_millis(20 * written as u64);
        if due && written < 100 {
            assert_eq!(st.write(now, small, &[written as u8; 120]), 120);
            wrote_at.push(now);
            written += 1;
        }
        p.a.handle_streams(now);
        b.step(&mut p);
        p.flush();
        let ours = b.got.iter().find(|(id, _)| id.n == small.n);
        while ours.is_some_and(|(_, g)| g.len() >= 120 * (delays.len() + 1)) {
            delays.push(now - wrote_at[delays.len()]);
        }
    }
    let bulk_got = b.got.iter().find(|(id, _)| Some(id.n) == big.map(|b| b.n));
    let bulk_got = bulk_got.map(|(_, g)| g.clone()).unwrap_or_default();
    assert!(
        data.starts_with(&bulk_got),
        "the bulk stream's bytes in order"
    );
    (delays, bulk_got, p.a.stats(p.now).flows)
}

fn p99(d: &[Duration]) -> Duration {
    let mut d = d.to_vec();
    d.sort();
    d[(d.len() * 99).div_ceil(100) - 1]
}

/// A stream that sends little takes the fast lane: its messages cross the 5 ms
/// channel, not the stripe (whose order follows the 60 ms one); with the fast lane
/// off, they wait for the stripe.
#[test]
fn a_stream_that_sends_little_crosses_the_lowest_delay_channel() {
    let (fast, _, fs) = small_beside_bulk(true, false, false);
    let (slow, _, ss) = small_beside_bulk(false, false, false);
    assert_eq!((fast.len(), slow.len()), (100, 100));
    // 5 ms, and up to 2 ms of the harness's 1 ms steps.
    assert!(p99(&fast) <= Duration::from_millis(8), "{:?}", p99(&fast));
    assert!(p99(&slow) >= Duration::from_millis(55), "{:?}", p99(&slow));
    assert!(fs.tx_stream_fast >= 100, "{fs:?}");
    assert_eq!(ss.tx_stream_fast, 0);
}

/// Beside a bulk stream, with the slow channel losing: the bulk stream stays in the
/// stripe (it delivers all it can, in order) and its losses, repaired inside the bond,
/// never hold back the small stream (a bulk flow's loss holds another back for at
/// most 1 ms: issue 32).
#[test]
fn a_bulk_streams_losses_do_not_hold_back_a_small_one() {
    let (fast, bulk, fs) = small_beside_bulk(true, true, true);
    assert_eq!(fast.len(), 100);
    assert!(p99(&fast) <= Duration::from_millis(8), "{:?}", p99(&fast));
    assert!(bulk.len() >= 2_000_000, "{} bytes of bulk", bulk.len());
    // The bulk stream's data went into the stripe: at most its first frames fast.
    assert!(fs.tx_stream_fast <= 100 + 16, "{fs:?}");
    let (slow, _, _) = small_beside_bulk(false, true, true);
    assert!(p99(&slow) >= Duration::from_millis(55), "{:?}", p99(&slow));
}
