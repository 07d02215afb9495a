//! A VoIP-like flow beside a run's traffic (`[voip]`, session runs only): small IPv4
//! UDP packets at a steady rate (or TCP segments, `protocol = "tcp"`: a remote shell's
//! or a game's connection), which the session classifies by its flow policies like
//! any inner packet (`braid_proto::session::flows`), and their one-way delay, loss and
//! order measured on their own.

use bytes::Bytes;

use crate::model::Nanos;

/// The flow (`[voip]`).
#[derive(Clone, Debug, PartialEq)]
pub struct VoipSpec {
    /// Packets per second.
    pub pps: f64,
    /// Bytes of each packet (IP length).
    pub bytes: u32,
    /// When the first is sent.
    pub start: Nanos,
    /// UDP source and destination port.
    pub port: u16,
    /// The DSCP in the IP header.
    pub dscp: u8,
    /// TCP segments (PSH, ACK; 20-byte header) instead of UDP datagrams.
    pub tcp: bool,
}

/// Smallest VoIP packet: IPv4 and UDP headers, the tag, the id and the send time.
pub const MIN_BYTES: u32 = 48;
/// Smallest packet of a TCP flow: IPv4 and TCP headers, the tag, the id and the time.
pub const MIN_BYTES_TCP: u32 = 60;
const TAG: &[u8; 4] = b"VOIP";

/// What the VoIP flow measured (`voip` in the JSON).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct VoipResult {
    /// Packets sent.
    pub sent: u64,
    /// Packets delivered (once each).
    pub delivered: u64,
    /// `sent - delivered`.
    pub lost: u64,
    /// `lost / sent`, percent.
    pub loss_pct: f64,
    /// Deliveries of a packet delivered already.
    pub duplicates: u64,
    /// Packets delivered after one sent later than them (out of the flow's order).
    pub reordered: u64,
    /// One-way delay, sender's session to receiver's application, ms: median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
    /// The lowest propagation delay of the channels (the best link idle), ms.
    pub best_link_ms: f64,
    /// `p99_ms - best_link_ms`.
    pub p99_over_best_ms: f64,
    /// The sender's flow counters: packets sent redundantly, on the lowest-delay
    /// channel, datagrams (every copy), fallbacks into the bond.
    pub tx_redundant: u64,
    /// See `tx_redundant`.
    pub tx_lowest_delay: u64,
    /// See `tx_redundant`.
    pub tx_datagrams: u64,
    /// Copies the receiving session dropped as duplicates.
    pub rx_copies_dropped: u64,
    /// Packets the receiving session held in their ordered domain (TCP) for one they
    /// had overtaken.
    pub rx_held: u64,
}

/// The flow's state in a run.
#[derive(Clone, Debug, Default)]
pub struct Voip {
    next_id: u64,
    seen: Vec<u64>,
    delays: Vec<Nanos>,
    duplicates: u64,
    /// The highest id delivered so far, and the deliveries below it.
    top: Option<u64>,
    reordered: u64,
}

/// Where the tag, id and send time start in a packet of IP protocol `protocol`.
fn payload_at(protocol: u8) -> usize {
    if protocol == 6 {
        40
    } else {
        28
    }
}

impl Voip {
    /// The next packet of `spec`, sent at `now`.
    pub fn packet(&mut self, spec: &VoipSpec, now: Nanos) -> Bytes {
        let min = if spec.tcp { MIN_BYTES_TCP } else { MIN_BYTES };
        let len = spec.bytes.max(min) as usize;
        let protocol = if spec.tcp { 6 } else { 17 };
        let mut p = vec![0u8; len];
        p[0] = 0x45;
        p[1] = spec.dscp << 2;
        p[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        p[8] = 64;
        p[9] = protocol;
        p[12..16].copy_from_slice(&[10, 0, 0, 1]);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        let sum = crate::tcp::ipv4_checksum(&p[..20]);
        p[10..12].copy_from_slice(&sum.to_be_bytes());
        p[20..22].copy_from_slice(&spec.port.to_be_bytes());
        p[22..24].copy_from_slice(&spec.port.to_be_bytes());
        if spec.tcp {
            // The sequence number of its first byte: the flow's segments follow each
            // other (per-flow order in the receiver looks at it). Data offset 5 (no
            // options), PSH and ACK: a segment with data.
            let seq = (self.next_id as u32).wrapping_mul((len - 40) as u32);
            p[24..28].copy_from_slice(&seq.to_be_bytes());
            p[32] = 5 << 4;
            p[33] = 0x18;
        } else {
            p[24..26].copy_from_slice(&((len - 20) as u16).to_be_bytes());
        }
        let at = payload_at(protocol);
        p[at..at + 4].copy_from_slice(TAG);
        p[at + 4..at + 12].copy_from_slice(&self.next_id.to_be_bytes());
        p[at + 12..at + 20].copy_from_slice(&now.to_be_bytes());
        self.next_id += 1;
        Bytes::from(p)
    }

    /// A delivered packet: `true` if it is one of the flow's (recorded).
    pub fn on_delivery(&mut self, now: Nanos, p: &[u8]) -> bool {
        if p.len() < MIN_BYTES as usize || p[0] != 0x45 || !matches!(p[9], 6 | 17) {
            return false;
        }
        let at = payload_at(p[9]);
        if p.len() < at + 20 || &p[at..at + 4] != TAG {
            return false;
        }
        let rd = |o: usize| u64::from_be_bytes(p[o..o + 8].try_into().expect("8 bytes"));
        let (id, sent) = (rd(at + 4), rd(at + 12));
        let (w, b) = ((id / 64) as usize, id % 64);
        if self.seen.len() <= w {
            self.seen.resize(w + 1, 0);
        }
        if self.seen[w] & (1 << b) != 0 {
            self.duplicates += 1;
        } else {
            self.seen[w] |= 1 << b;
            self.delays.push(now.saturating_sub(sent));
            if self.top.is_some_and(|t| id < t) {
                self.reordered += 1;
            }
            self.top = self.top.max(Some(id));
        }
        true
    }

    /// Packets delivered once.
    pub fn delivered(&self) -> u64 {
        self.delays.len() as u64
    }

    /// Packets sent.
    pub fn sent(&self) -> u64 {
        self.next_id
    }

    /// The figures, with the best link's delay and the sessions' flow counters.
    pub fn result(
        &self,
        best_link: Nanos,
        tx: &braid_proto::session::FlowStats,
        rx: &braid_proto::session::FlowStats,
    ) -> VoipResult {
        let mut d = self.delays.clone();
        d.sort_unstable();
        let q = |f: f64| -> f64 {
            if d.is_empty() {
                return 0.0;
            }
            let i = ((d.len() as f64 * f).ceil() as usize).clamp(1, d.len()) - 1;
            d[i] as f64 / 1e6
        };
        let sent = self.next_id;
        let delivered = self.delivered();
        let p99 = q(0.99);
        let best = best_link as f64 / 1e6;
        VoipResult {
            sent,
            delivered,
            lost: sent.saturating_sub(delivered),
            loss_pct: if sent == 0 {
                0.0
            } else {
                sent.saturating_sub(delivered) as f64 * 100.0 / sent as f64
            },
            duplicates: self.duplicates,
            reordered: self.reordered,
            p50_ms: q(0.5),
            p99_ms: p99,
            max_ms: d.last().map_or(0.0, |&x| x as f64 / 1e6),
            best_link_ms: best,
            p99_over_best_ms: p99 - best,
            tx_redundant: tx.tx_redundant,
            tx_lowest_delay: tx.tx_lowest_delay,
            tx_datagrams: tx.tx_datagrams,
            rx_copies_dropped: rx.rx_duplicates,
            rx_held: rx.rx_held,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_are_udp_and_come_back_with_their_delay() {
        let spec = VoipSpec {
            pps: 50.0,
            bytes: 200,
            start: 0,
            port: 5004,
            dscp: 46,
            tcp: false,
        };
        let mut v = Voip::default();
        let p = v.packet(&spec, 1_000_000);
        let i = braid_proto::session::flows::parse_inner(&p).unwrap();
        assert_eq!((i.protocol, i.dscp, i.ports), (17, 46, Some((5004, 5004))));
        assert!(v.on_delivery(6_000_000, &p));
        assert!(v.on_delivery(7_000_000, &p));
        let tx = braid_proto::session::FlowStats::default();
        let r = v.result(5_000_000, &tx, &tx);
        assert_eq!((r.sent, r.delivered, r.duplicates, r.lost), (1, 1, 1, 0));
        assert_eq!(r.p99_ms, 5.0);
        assert_eq!(r.p99_over_best_ms, 0.0);
        // The simulator's other packets are not the flow's.
        let mut other = vec![0u8; 200];
        other[0] = 0x45;
        other[9] = 17;
        assert!(!v.on_delivery(0, &other));
    }

    /// TCP segments of a small flow: classified as TCP with data (not a pure
    /// acknowledgement), and one delivered after a later one is counted out of order.
    #[test]
    fn tcp_segments_come_back_in_or_out_of_order() {
        let spec = VoipSpec {
            pps: 50.0,
            bytes: 120,
            start: 0,
            port: 2222,
            dscp: 0,
            tcp: true,
        };
        let mut v = Voip::default();
        let p: Vec<Bytes> = (0..3).map(|k| v.packet(&spec, k * 1_000_000)).collect();
        let i = braid_proto::session::flows::parse_inner(&p[0]).unwrap();
        assert_eq!(
            (i.protocol, i.ports, i.pure_ack),
            (6, Some((2222, 2222)), false)
        );
        assert_eq!(p[0].len(), 120);
        for k in [0, 2, 1] {
            assert!(v.on_delivery(10_000_000, &p[k]));
        }
        let tx = braid_proto::session::FlowStats::default();
        let r = v.result(5_000_000, &tx, &tx);
        assert_eq!((r.sent, r.delivered, r.reordered, r.lost), (3, 3, 1, 0));
        assert_eq!(r.p50_ms, 9.0);
    }
}
