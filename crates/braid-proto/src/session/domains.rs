//! Per-flow reorder domains (issue 32, item 2) for the packets that go out as flow
//! datagrams (`session::flows`, `wire::flow`).
//!
//! A flow datagram is delivered as soon as it is opened: it waits for nothing the
//! stripe carries. In domain 0 it is delivered in arrival order, which suits calls
//! and live video (a jitter buffer reorders, a late packet is worth less than a
//! wait). A TCP segment needs its flow's order: one that overtakes another (the first
//! lost on its channel and repaired a round trip later, or still on its way over the
//! channel the flow just left) looks to TCP like a loss. So the sender numbers each
//! TCP flow's segments in a domain of its own ([`domain_of`], [`Numbering`]), and the
//! receiver delivers each domain in order on its own ([`Reorder`]): a gap holds back
//! the packets of its domain, and nothing else, until the missing one comes or the
//! wait runs out (in-bond repair's wait when it is on; [`WAIT_WITHOUT_REPAIR`] when it
//! is off). A loss in one flow never holds back another, and the stripe's flows never
//! hold back these.
//!
//! A flow is put in a domain by a hash of its protocol, addresses and ports, one of
//! [`DOMAINS`]; two flows that share a domain share its order (each still in order,
//! one may wait for the other's gap). The sender's numbers and the receiver's state
//! live as long as the peer's run: a domain's numbers never start again while the
//! receiver may remember them. Held packets are bounded ([`HOLD_MAX`] per domain,
//! [`HELD_MAX_TOTAL`] in all): past the bound the oldest gap is given up.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::IpAddr;

use bytes::Bytes;

use super::flows::FlowStats;
use crate::time::{Duration, Instant};

/// Ordered domains a sender spreads its flows over: 1 to `DOMAINS` (0 is arrival order).
pub const DOMAINS: u16 = 4096;
/// Packets one domain holds behind a gap; one more gives the gap up.
pub const HOLD_MAX: usize = 64;
/// Packets held behind gaps in all domains together; one more gives up the gap of the
/// domain it came in.
pub const HELD_MAX_TOTAL: usize = 1024;
/// How long a packet waits for one its domain misses when in-bond repair is off (a
/// lost one never comes then; one still on its way over a channel the flow left comes
/// within the difference of the two channels' delays).
pub const WAIT_WITHOUT_REPAIR: Duration = Duration::from_millis(50);

/// The ordered domain (1 to [`DOMAINS`]) of the flow with this protocol, addresses and
/// ports: FNV-1a over them. The same on every call, on every machine; only the sender
/// uses it (the receiver keys its state by the number on the wire).
pub fn domain_of(protocol: u8, src: IpAddr, dst: IpAddr, ports: (u16, u16)) -> u16 {
    let mut h: u32 = 0x811c_9dc5;
    let mut eat = |b: &[u8]| {
        for &x in b {
            h = (h ^ u32::from(x)).wrapping_mul(0x0100_0193);
        }
    };
    eat(&[protocol]);
    for a in [src, dst] {
        match a {
            IpAddr::V4(a) => eat(&a.octets()),
            IpAddr::V6(a) => eat(&a.octets()),
        }
    }
    eat(&ports.0.to_be_bytes());
    eat(&ports.1.to_be_bytes());
    1 + (h % u32::from(DOMAINS)) as u16
}

/// The sender's next number in each ordered domain it used.
#[derive(Clone, Debug, Default)]
pub struct Numbering {
    next: HashMap<u16, u64>,
}

impl Numbering {
    /// The number of the next packet in `domain`.
    pub fn take(&mut self, domain: u16) -> u64 {
        let n = self.next.entry(domain).or_insert(0);
        *n += 1;
        *n - 1
    }
}

/// One ordered domain at the receiver.
#[derive(Clone, Debug, Default)]
struct Domain {
    /// The number it delivers next.
    next: u64,
    /// Packets that came before one they follow: by number, with the time their wait
    /// runs out.
    held: BTreeMap<u64, (Bytes, Instant)>,
}

impl Domain {
    /// Deliver the held packets that follow on without a gap.
    fn release(&mut self, out: &mut VecDeque<Bytes>, st: &mut FlowStats) {
        while let Some(e) = self.held.first_entry() {
            if *e.key() != self.next {
                break;
            }
            let (p, _) = e.remove();
            out.push_back(p);
            st.rx_delivered += 1;
            self.next += 1;
        }
    }

    /// Give up every missing number up to held number `s`: deliver the held packets up
    /// to it in order, and what follows on.
    fn skip_through(&mut self, s: u64, out: &mut VecDeque<Bytes>, st: &mut FlowStats) {
        while let Some(e) = self.held.first_entry() {
            let k = *e.key();
            if k > s {
                break;
            }
            let (p, _) = e.remove();
            st.rx_gaps += k - self.next;
            self.next = k + 1;
            out.push_back(p);
            st.rx_delivered += 1;
        }
        self.release(out, st);
    }
}

/// The receiver's ordered domains.
#[derive(Clone, Debug, Default)]
pub struct Reorder {
    domains: HashMap<u16, Domain>,
    /// Domains holding packets.
    waiting: Vec<u16>,
    /// Packets held in all domains.
    held: usize,
}

impl Reorder {
    /// Packet `p`, number `seq` of `domain` (not 0), opened at `now`: delivered into
    /// `out` with whatever it lets follow, held if it overtook one, or dropped as a
    /// copy of one delivered, held or given up. A held packet waits until `now + wait`.
    #[allow(clippy::too_many_arguments)]
    pub fn accept(
        &mut self,
        now: Instant,
        wait: Duration,
        domain: u16,
        seq: u64,
        p: Bytes,
        out: &mut VecDeque<Bytes>,
        st: &mut FlowStats,
    ) {
        let d = self.domains.entry(domain).or_default();
        let before = d.held.len();
        if seq < d.next || d.held.contains_key(&seq) {
            st.rx_duplicates += 1;
            return;
        }
        if seq == d.next {
            out.push_back(p);
            st.rx_delivered += 1;
            d.next += 1;
            d.release(out, st);
        } else {
            d.held.insert(seq, (p, now + wait));
            st.rx_held += 1;
            if d.held.len() > HOLD_MAX || self.held + 1 > HELD_MAX_TOTAL {
                let first = *d.held.keys().next().expect("one was just held");
                d.skip_through(first, out, st);
            }
        }
        let after = d.held.len();
        self.held = self.held + after - before;
        if before == 0 && after > 0 {
            self.waiting.push(domain);
        } else if before > 0 && after == 0 {
            self.waiting.retain(|&x| x != domain);
        }
    }

    /// When the first held packet's wait runs out.
    pub fn next_timeout(&self) -> Option<Instant> {
        self.waiting
            .iter()
            .filter_map(|k| self.domains.get(k))
            .flat_map(|d| d.held.values().map(|(_, t)| *t))
            .min()
    }

    /// Give up the gaps before every held packet whose wait ran out by `now`, and
    /// deliver what that releases into `out`.
    pub fn expire(&mut self, now: Instant, out: &mut VecDeque<Bytes>, st: &mut FlowStats) {
        if self.waiting.is_empty() {
            return;
        }
        for k in std::mem::take(&mut self.waiting) {
            let Some(d) = self.domains.get_mut(&k) else {
                continue;
            };
            let before = d.held.len();
            let due = d
                .held
                .iter()
                .filter(|(_, (_, t))| *t <= now)
                .map(|(s, _)| *s)
                .max();
            if let Some(s) = due {
                d.skip_through(s, out, st);
            }
            self.held -= before - d.held.len();
            if !d.held.is_empty() {
                self.waiting.push(k);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::from_micros(ms * 1000)
    }

    fn pkt(n: u8) -> Bytes {
        Bytes::from(vec![n])
    }

    /// What `out` holds, as the packets' first bytes.
    fn taken(out: &mut VecDeque<Bytes>) -> Vec<u8> {
        out.drain(..).map(|p| p[0]).collect()
    }

    #[test]
    fn a_flow_has_one_domain_and_flows_spread_over_many() {
        let a = IpAddr::from([10, 0, 0, 1]);
        let b = IpAddr::from([10, 0, 0, 2]);
        let d = domain_of(6, a, b, (40000, 22));
        assert_eq!(d, domain_of(6, a, b, (40000, 22)));
        assert!((1..=DOMAINS).contains(&d));
        let mut seen = std::collections::HashSet::new();
        for port in 40000..40100 {
            seen.insert(domain_of(6, a, b, (port, 22)));
        }
        assert!(seen.len() >= 95, "{} domains for 100 flows", seen.len());
        assert_ne!(domain_of(6, a, b, (1, 2)), domain_of(17, a, b, (1, 2)));
        let mut n = Numbering::default();
        assert_eq!((n.take(5), n.take(5), n.take(7), n.take(5)), (0, 1, 0, 2));
    }

    /// In order at once; one that overtakes waits for the one it passed, and nothing of
    /// another domain waits with it; copies are dropped.
    #[test]
    fn each_domain_is_delivered_in_order_on_its_own() {
        let mut r = Reorder::default();
        let mut st = FlowStats::default();
        let mut out = VecDeque::new();
        let w = Duration::from_millis(200);
        r.accept(at(0), w, 1, 0, pkt(10), &mut out, &mut st);
        assert_eq!(taken(&mut out), [10]);
        // Number 1 of domain 1 is missing: 2 and 3 wait, domain 2 does not.
        r.accept(at(1), w, 1, 2, pkt(12), &mut out, &mut st);
        r.accept(at(2), w, 1, 3, pkt(13), &mut out, &mut st);
        r.accept(at(2), w, 2, 0, pkt(20), &mut out, &mut st);
        assert_eq!(taken(&mut out), [20]);
        assert_eq!(r.next_timeout(), Some(at(201)));
        // A copy of a held one and of a delivered one.
        r.accept(at(3), w, 1, 2, pkt(12), &mut out, &mut st);
        r.accept(at(3), w, 1, 0, pkt(10), &mut out, &mut st);
        assert_eq!(st.rx_duplicates, 2);
        // The missing one comes: all three, in order.
        r.accept(at(40), w, 1, 1, pkt(11), &mut out, &mut st);
        assert_eq!(taken(&mut out), [11, 12, 13]);
        assert_eq!(r.next_timeout(), None);
        assert_eq!((st.rx_delivered, st.rx_held, st.rx_gaps), (5, 2, 0));
        assert_eq!(r.held, 0);
        // Late now: a copy.
        r.accept(at(41), w, 1, 1, pkt(11), &mut out, &mut st);
        assert!(out.is_empty());
        assert_eq!(st.rx_duplicates, 3);
    }

    /// A gap that is not filled within the wait is given up: what waited behind it is
    /// delivered, in order, and the missing number is counted; one that comes after is
    /// dropped (its place is taken).
    #[test]
    fn a_gap_is_given_up_when_its_wait_runs_out() {
        let mut r = Reorder::default();
        let mut st = FlowStats::default();
        let mut out = VecDeque::new();
        let w = Duration::from_millis(50);
        r.accept(at(0), w, 9, 2, pkt(2), &mut out, &mut st);
        r.accept(at(30), w, 9, 4, pkt(4), &mut out, &mut st);
        assert!(out.is_empty());
        assert_eq!(r.next_timeout(), Some(at(50)));
        r.expire(at(49), &mut out, &mut st);
        assert!(out.is_empty());
        // Number 2's wait ran out: 0 and 1 are given up; 4 still waits for 3.
        r.expire(at(50), &mut out, &mut st);
        assert_eq!(taken(&mut out), [2]);
        assert_eq!(st.rx_gaps, 2);
        assert_eq!(r.next_timeout(), Some(at(80)));
        r.expire(at(80), &mut out, &mut st);
        assert_eq!(taken(&mut out), [4]);
        assert_eq!(st.rx_gaps, 3);
        assert_eq!(r.next_timeout(), None);
        r.accept(at(81), w, 9, 3, pkt(3), &mut out, &mut st);
        assert!(out.is_empty());
        r.accept(at(81), w, 9, 5, pkt(5), &mut out, &mut st);
        assert_eq!(taken(&mut out), [5]);
    }

    /// A domain holds at most HOLD_MAX packets and all domains HELD_MAX_TOTAL: one more
    /// gives up the domain's first gap at once.
    #[test]
    fn what_is_held_is_bounded() {
        let mut r = Reorder::default();
        let mut st = FlowStats::default();
        let mut out = VecDeque::new();
        let w = Duration::from_secs(1);
        for s in 1..=HOLD_MAX as u64 {
            r.accept(at(0), w, 1, s, pkt(s as u8), &mut out, &mut st);
        }
        assert!(out.is_empty());
        r.accept(at(0), w, 1, HOLD_MAX as u64 + 1, pkt(0), &mut out, &mut st);
        assert_eq!(out.len(), HOLD_MAX + 1, "the gap at 0 given up");
        assert_eq!((st.rx_gaps, r.held), (1, 0));
        out.clear();
        // Across domains: 1 packet held in each of HELD_MAX_TOTAL domains, one more.
        for d in 0..HELD_MAX_TOTAL as u16 {
            r.accept(at(0), w, 100 + d, 1, pkt(1), &mut out, &mut st);
        }
        assert!(out.is_empty());
        assert_eq!(r.held, HELD_MAX_TOTAL);
        r.accept(at(0), w, 99, 1, pkt(7), &mut out, &mut st);
        assert_eq!(taken(&mut out), [7]);
        assert_eq!(r.held, HELD_MAX_TOTAL);
        r.expire(at(1000), &mut out, &mut st);
        assert_eq!(out.len(), HELD_MAX_TOTAL);
        assert_eq!((r.held, r.next_timeout()), (0, None));
    }
}
