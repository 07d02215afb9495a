//! Per-flow order for the TCP segments that cross in the stripe (issue 32, item 2).
//!
//! The stripe puts every packet it carries back in one order, the sender's: a packet
//! lost on one channel (held for in-bond repair) or still on its way over the slowest
//! one holds back every packet sent after it, of every flow. TCP needs only its own
//! flow's order. So the receiver looks at each TCP segment that arrives and, while the
//! stripe holds it, delivers it at once if it *continues its flow exactly*: its
//! sequence number is where the flow's last delivered segment ended. Nothing is added
//! to the wire, and logical reception is untouched: the segment stays in the stripe's
//! buffers and is dropped when the stripe's order reaches it (its *twin*).
//!
//! A segment released early is never released before the time the stripe's delay
//! equalizer would have let it go (its arrival plus the equalizer's hold for its
//! channel): only a wait caused by another packet (a loss being repaired, a slower
//! channel's turn) is cut, never the equal delay that keeps a TCP sender's round
//! trip steady for its slow start.
//!
//! What a flow sees: its segments in the order of their bytes, each once. A segment
//! that does not continue its flow (its own flow lost or reordered one before it)
//! waits for the stripe, as before. SYN and RST segments always wait for the stripe.
//! Other protocols (UDP, the simulator's bulk traffic) keep the stripe's order.
//!
//! Bounds: [`MAX_FLOWS`] flows tracked (beyond, the table starts again: a flow not in
//! it waits for the stripe), [`MAX_HELD`] segments watched, [`MAX_RELEASED`] twins
//! awaited (with that many, segments wait for the stripe), and each forgotten after
//! [`FORGET`].

use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use bytes::Bytes;

use crate::time::{Duration, Instant};

/// Flows whose next sequence number is tracked.
pub const MAX_FLOWS: usize = 16_384;
/// Segments watched while the stripe holds them.
pub const MAX_HELD: usize = 8_192;
/// Segments released early whose twin is still to come.
pub const MAX_RELEASED: usize = 8_192;
/// A watched segment or a twin not seen for this long is forgotten (the stripe gave
/// it up, or an epoch change dropped it).
pub const FORGET: Duration = Duration::from_secs(2);

const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const FIN: u8 = 0x01;

/// The tables' hasher: their keys start with a flow's 64-bit hash already, so mixing in
/// the sequence numbers is enough (a keyed hash per lookup would cost more than the
/// rest of the work per packet). The flow hashes come from the peer's packets, which
/// authenticated; a peer that made many collide would slow only its own session.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(26) ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type Table<K, V> = HashMap<K, V, BuildHasherDefault<KeyHasher>>;

/// One TCP segment's place in its flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The flow: a hash of its addresses and ports (64 bits: two flows that share one
    /// would each see a segment of the other only as not continuing it).
    pub flow: u64,
    /// Sequence number of its first byte.
    pub seq: u32,
    /// Sequence number after it (payload, plus one for SYN and for FIN).
    pub end: u32,
    /// TCP flags.
    pub flags: u8,
}

impl Segment {
    /// The segment in IPv4 or IPv6 packet `p` (TCP directly after the IP header, not a
    /// fragment); `None` for anything else.
    pub fn parse(p: &[u8]) -> Option<Segment> {
        let (addrs, l4) = match p.first()? >> 4 {
            4 => {
                let ihl = usize::from(p[0] & 0x0f) * 4;
                let total = usize::from(u16::from_be_bytes([*p.get(2)?, *p.get(3)?]));
                let fragment = u16::from_be_bytes([*p.get(6)?, *p.get(7)?]) & 0x3fff != 0;
                if ihl < 20 || total != p.len() || p.len() < ihl || fragment || p[9] != 6 {
                    return None;
                }
                (&p[12..20], &p[ihl..])
            }
            6 => {
                if p.len() < 40 || usize::from(u16::from_be_bytes([p[4], p[5]])) + 40 != p.len() {
                    return None;
                }
                if p[6] != 6 {
                    return None;
                }
                (&p[8..40], &p[40..])
            }
            _ => return None,
        };
        if l4.len() < 20 {
            return None;
        }
        let header = usize::from(l4[12] >> 4) * 4;
        if header < 20 || header > l4.len() {
            return None;
        }
        let flags = l4[13];
        let seq = u32::from_be_bytes([l4[4], l4[5], l4[6], l4[7]]);
        let len =
            (l4.len() - header) as u32 + u32::from(flags & SYN != 0) + u32::from(flags & FIN != 0);
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in addrs.iter().chain(&l4[..4]) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        Some(Segment {
            flow: h,
            seq,
            end: seq.wrapping_add(len),
            flags,
        })
    }

    /// Whether it carries anything of the flow's sequence (data, SYN or FIN).
    fn occupies(&self) -> bool {
        self.end != self.seq
    }
}

/// A segment the stripe holds, watched.
#[derive(Debug)]
struct Held {
    end: u32,
    /// When the stripe's equalizer would let it go.
    due: Instant,
    packet: Bytes,
}

/// Counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OrderStats {
    /// Segments delivered ahead of the stripe's order.
    pub released: u64,
    /// Their twins, dropped when the stripe's order reached them.
    pub twins: u64,
}

/// The receiver's per-flow order for TCP in the stripe.
#[derive(Debug, Default)]
pub struct FlowOrder {
    /// Per flow, where its last delivered segment ended.
    next: Table<u64, u32>,
    /// Segments the stripe holds, by flow and first sequence number.
    held: Table<(u64, u32), Held>,
    /// When each watched segment is due, earliest first (entries of segments already
    /// gone are skipped when they come up).
    due: BinaryHeap<Reverse<(Instant, u64, u32)>>,
    /// Segments released early (flow, seq, end), whose twin is still to come.
    released: Table<(u64, u32, u32), Instant>,
    /// When twins not seen for [`FORGET`] were last forgotten (once a second).
    swept: Instant,
    /// Packets released early, for the application.
    out: VecDeque<Bytes>,
    /// Its counters.
    pub stats: OrderStats,
}

impl FlowOrder {
    /// A data packet arrived (the bytes of `datagram` from `at` on, past a sequence
    /// header); the stripe's equalizer would let it go at `due`. A TCP segment is
    /// watched until the stripe delivers it. (Anything else costs no allocation.)
    pub fn on_arrival(&mut self, now: Instant, due: Instant, datagram: &Bytes, at: usize) {
        let Some(s) = datagram.get(at..).and_then(Segment::parse) else {
            return;
        };
        if !s.occupies() || s.flags & (SYN | RST) != 0 || self.held.len() >= MAX_HELD {
            return;
        }
        if self.held.contains_key(&(s.flow, s.seq)) {
            return;
        }
        let due = due.max(now);
        self.held.insert(
            (s.flow, s.seq),
            Held {
                end: s.end,
                due,
                packet: datagram.slice(at..),
            },
        );
        self.due.push(Reverse((due, s.flow, s.seq)));
    }

    /// The stripe delivers `packet` now: `false` if it is the twin of one released
    /// early (drop it). Segments of its flow that now continue it and are due go too.
    pub fn on_delivered(&mut self, now: Instant, packet: &[u8]) -> bool {
        let Some(s) = Segment::parse(packet) else {
            return true;
        };
        if self.released.remove(&(s.flow, s.seq, s.end)).is_some() {
            self.stats.twins += 1;
            return false;
        }
        if let Entry::Occupied(h) = self.held.entry((s.flow, s.seq)) {
            if h.get().end == s.end {
                h.remove();
            }
        }
        if s.flags & RST != 0 {
            self.next.remove(&s.flow);
            return true;
        }
        if s.occupies() {
            self.advance(s.flow, s.end);
            self.chain(now, s.flow);
        }
        true
    }

    /// Record that flow `flow`'s delivered bytes end at `end`.
    fn advance(&mut self, flow: u64, end: u32) {
        if self.next.len() >= MAX_FLOWS && !self.next.contains_key(&flow) {
            self.next.clear();
        }
        self.next.insert(flow, end);
    }

    /// Release, one after another, the due segments that continue `flow`.
    fn chain(&mut self, now: Instant, flow: u64) {
        while let Some(&at) = self.next.get(&flow) {
            match self.held.get(&(flow, at)) {
                // With as many twins awaited as allowed, it waits for the stripe.
                Some(h) if h.due <= now && self.released.len() < MAX_RELEASED => {
                    let h = self.held.remove(&(flow, at)).expect("just seen");
                    self.release(now, (flow, at, h.end), h.packet);
                    self.advance(flow, h.end);
                }
                _ => return,
            }
        }
    }

    fn release(&mut self, now: Instant, key: (u64, u32, u32), packet: Bytes) {
        self.released.insert(key, now);
        self.out.push_back(packet);
        self.stats.released += 1;
    }

    /// Time passed: the watched segments now due that continue their flows go; what
    /// was watched too long is forgotten.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&Reverse((at, flow, seq))) = self.due.peek() {
            if at > now {
                break;
            }
            self.due.pop();
            let Some(h) = self.held.get(&(flow, seq)) else {
                continue;
            };
            let forget = h.due + FORGET;
            if self.next.get(&flow) == Some(&seq) {
                self.chain(now, flow);
            } else if forget <= now {
                self.held.remove(&(flow, seq));
            } else if at < forget {
                // Not (yet) its flow's next: looked at again when the flow moves on,
                // and forgotten after a while.
                self.due.push(Reverse((forget, flow, seq)));
            }
        }
        if now >= self.swept + Duration::from_secs(1) {
            self.swept = now;
            self.released.retain(|_, at| *at + FORGET > now);
        }
    }

    /// When [`FlowOrder::handle_timeout`] wants to be called.
    pub fn next_timeout(&self) -> Option<Instant> {
        self.due.peek().map(|Reverse((t, _, _))| *t)
    }

    /// The next packet released early.
    pub fn poll_release(&mut self) -> Option<Bytes> {
        self.out.pop_front()
    }

    /// Segments watched now.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(x: u64) -> Instant {
        Instant::from_micros(x * 1000)
    }

    /// An IPv4 TCP segment 10.0.0.1:`sport` -> 10.0.0.2:80 with `len` payload bytes.
    fn tcp4(sport: u16, seq: u32, len: usize, flags: u8) -> Bytes {
        let total = 40 + len;
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[9] = 6;
        p[12..16].copy_from_slice(&[10, 0, 0, 1]);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        p[20..22].copy_from_slice(&sport.to_be_bytes());
        p[22..24].copy_from_slice(&80u16.to_be_bytes());
        p[24..28].copy_from_slice(&seq.to_be_bytes());
        p[32] = 5 << 4;
        p[33] = flags;
        Bytes::from(p)
    }

    const ACK: u8 = 0x10;

    #[test]
    fn segments_parse_and_other_packets_do_not() {
        let s = Segment::parse(&tcp4(1, 100, 50, ACK)).unwrap();
        assert_eq!((s.seq, s.end), (100, 150));
        let syn = Segment::parse(&tcp4(1, u32::MAX, 0, SYN)).unwrap();
        assert_eq!(syn.end, 0, "SYN takes one number, wrapping");
        let fin = Segment::parse(&tcp4(1, 7, 3, FIN | ACK)).unwrap();
        assert_eq!(fin.end, 11);
        assert_ne!(s.flow, Segment::parse(&tcp4(2, 100, 50, ACK)).unwrap().flow);
        // UDP, a fragment, a wrong length, a short header: not segments.
        let mut udp = tcp4(1, 0, 10, 0).to_vec();
        udp[9] = 17;
        assert!(Segment::parse(&udp).is_none());
        let mut frag = tcp4(1, 0, 10, 0).to_vec();
        frag[6] = 0x20;
        assert!(Segment::parse(&frag).is_none());
        assert!(Segment::parse(&tcp4(1, 0, 10, 0)[..45]).is_none());
        assert!(Segment::parse(&[0x45; 30]).is_none());
        // IPv6.
        let mut v6 = vec![0u8; 60];
        v6[0] = 0x60;
        v6[4..6].copy_from_slice(&20u16.to_be_bytes());
        v6[6] = 6;
        v6[44..48].copy_from_slice(&9u32.to_be_bytes());
        v6[52] = 5 << 4;
        v6[53] = FIN;
        let s6 = Segment::parse(&v6).unwrap();
        assert_eq!((s6.seq, s6.end), (9, 10));
    }

    /// Segments 0..100, 100..200, 200..300 of a flow whose bytes up to 0 were
    /// delivered: the stripe holds them (another flow's loss); each goes at its due
    /// time once the one before it went, and its twin is dropped later.
    #[test]
    fn a_held_segment_that_continues_its_flow_goes_at_its_due_time() {
        let mut o = FlowOrder::default();
        assert!(o.on_delivered(ms(0), &tcp4(1, 0, 0, SYN)));
        let segs: Vec<Bytes> = (0..3).map(|i| tcp4(1, 1 + 100 * i, 100, ACK)).collect();
        // Arrive out of order, the first one not due before 10 ms.
        o.on_arrival(ms(1), ms(5), &segs[2], 0);
        o.on_arrival(ms(1), ms(5), &segs[1], 0);
        o.on_arrival(ms(2), ms(10), &segs[0], 0);
        o.handle_timeout(ms(5));
        assert!(
            o.poll_release().is_none(),
            "the first is not due, the others wait"
        );
        assert_eq!(o.next_timeout(), Some(ms(10)));
        o.handle_timeout(ms(10));
        let out: Vec<Bytes> = std::iter::from_fn(|| o.poll_release()).collect();
        assert_eq!(out, segs, "in the flow's order");
        assert_eq!(o.stats.released, 3);
        // The stripe's order reaches them: twins, dropped; the next one passes.
        for s in &segs {
            assert!(!o.on_delivered(ms(40), s));
        }
        assert_eq!(o.stats.twins, 3);
        assert!(o.on_delivered(ms(41), &tcp4(1, 301, 100, ACK)));
        assert_eq!(o.held(), 0);
    }

    /// A segment that does not continue its flow (its own flow's one before it is
    /// missing) is not released; the stripe delivers it. SYN and RST segments always
    /// wait; after a RST the flow is forgotten.
    #[test]
    fn what_does_not_continue_its_flow_waits_for_the_stripe() {
        let mut o = FlowOrder::default();
        assert!(o.on_delivered(ms(0), &tcp4(1, 0, 100, ACK)));
        let gap = tcp4(1, 200, 100, ACK);
        o.on_arrival(ms(1), ms(1), &gap, 0);
        o.handle_timeout(ms(1));
        assert!(o.poll_release().is_none());
        let syn = tcp4(2, 0, 0, SYN);
        o.on_arrival(ms(1), ms(1), &syn, 0);
        assert_eq!(o.held(), 1, "a SYN is not watched");
        // The stripe delivers the missing one, then the held one itself (no twin).
        assert!(o.on_delivered(ms(20), &tcp4(1, 100, 100, ACK)));
        let released: Vec<Bytes> = std::iter::from_fn(|| o.poll_release()).collect();
        assert_eq!(released, vec![gap.clone()], "it continues the flow now");
        assert!(!o.on_delivered(ms(30), &gap));
        assert!(o.on_delivered(ms(31), &tcp4(1, 300, 0, RST | ACK)));
        let after = tcp4(1, 300, 100, ACK);
        o.on_arrival(ms(32), ms(32), &after, 0);
        o.handle_timeout(ms(32));
        assert!(o.poll_release().is_none(), "a reset flow is not tracked");
        // Packets that are not TCP segments pass untouched.
        assert!(o.on_delivered(ms(33), &[0x45; 30]));
    }

    /// A watched segment the stripe never delivers, and a twin that never comes, are
    /// forgotten after `FORGET`.
    #[test]
    fn what_never_comes_is_forgotten() {
        let mut o = FlowOrder::default();
        assert!(o.on_delivered(ms(0), &tcp4(1, 0, 100, ACK)));
        o.on_arrival(ms(1), ms(1), &tcp4(1, 500, 100, ACK), 0);
        o.on_arrival(ms(1), ms(1), &tcp4(1, 100, 100, ACK), 0);
        o.handle_timeout(ms(1));
        assert_eq!(o.poll_release(), Some(tcp4(1, 100, 100, ACK)));
        assert_eq!(o.held(), 1);
        let later = ms(1) + FORGET + Duration::from_millis(1);
        while o.next_timeout().is_some_and(|t| t <= later) {
            o.handle_timeout(later);
        }
        assert_eq!(o.held(), 0);
        assert_eq!(o.next_timeout(), None);
        // The twin's record is gone: the same segment again is delivered.
        assert!(o.on_delivered(later, &tcp4(1, 100, 100, ACK)));
    }
}
