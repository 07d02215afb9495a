//! TCP carried as streams through a session pair (`session::streams`): a stream's
//! frames ride the stripe over a lossy bond and arrive as the bytes written, none of
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
                assert_eq!((src, dst), (addr("10.0.0.1:40000"), addr("10.0.0.2:80")));
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
    let id =
        p.a.streams()
            .unwrap()
            .open(p.now, addr("10.0.0.1:40000"), addr("10.0.0.2:80"))
            .unwrap();
    let (mut sent, mut fin) = (0, false);
    let mut b = Reader::default();
    let mut t = p.now;
    while t < at_ms(20_000) && !b.finished(&p) {
        t += Duration::from_millis(1);
        p.run_until(t);
        let now = p.now;
        let st = p.a.streams().unwrap();
        while sent < data.len() {
            let n = st.write(now, id, &data[sent..]);
            if n == 0 {
                break;
            }
            sent += n;
        }
        if sent == data.len() && !fin {
            st.finish(now, id);
            fin = true;
        }
        while st.poll_event().is_some() {}
        p.a.handle_streams(now);
        b.step(&mut p);
        p.flush();
    }
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
