//! ECN marking of an IP packet in place (RFC 3168): set the two ECN bits to CE (11) in
//! an IPv4 header (updating its checksum incrementally, RFC 1624) or in an IPv6 traffic
//! class.

/// A packet that is not ECN-capable and shorter than this is never dropped as a
/// congestion signal: a TCP SYN, a pure ACK, a DNS query. Dropping it frees no queue
/// (it carries no bytes to speak of) and costs much: a lost SYN stalls its connection
/// for a second (the initial retransmission timeout). In the lab the tunnel's AQM
/// dropped SYNs and ACKs on the idle return direction, whose one-way delay looked like
/// a queue whenever the link emulator ran late. The signal is then not given at all;
/// the next data packet carries the next one.
pub const SPARE_BELOW: usize = 128;

/// What a congestion signal did to a packet ([`signal`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signalled {
    /// Marked CE (or it already was): deliver it.
    Marked,
    /// An IP packet that cannot be marked: the signal is its drop.
    Dropped,
    /// A small IP packet that cannot be marked ([`SPARE_BELOW`]): delivered, no signal.
    Spared,
    /// Not IP: delivered untouched, no signal.
    NotIp,
}

/// Give `p` a congestion signal, the one rule of the receiver's AQM and the pacer's
/// CoDel: mark it CE if it is ECN-capable, else drop it, unless it is a small packet
/// (spared) or not IP.
pub fn signal(p: &mut [u8]) -> Signalled {
    match mark_ce(p) {
        Ecn::Marked | Ecn::AlreadyCe => Signalled::Marked,
        Ecn::NotEct if p.len() < SPARE_BELOW => Signalled::Spared,
        Ecn::NotEct => Signalled::Dropped,
        Ecn::NotIp => Signalled::NotIp,
    }
}

/// What [`mark_ce`] found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ecn {
    /// The packet was ECN-capable (ECT(0) or ECT(1)) and is now marked CE.
    Marked,
    /// It already carried CE: nothing to do, the signal is there.
    AlreadyCe,
    /// An IP packet that is not ECN-capable: a congestion signal must be a drop.
    NotEct,
    /// Not an IPv4 or IPv6 packet (or too short to be one): left alone.
    NotIp,
}

/// Mark `p` Congestion Experienced if it is an ECN-capable IPv4 or IPv6 packet.
pub fn mark_ce(p: &mut [u8]) -> Ecn {
    match p.first().map(|b| b >> 4) {
        Some(4) if p.len() >= 20 && (p[0] & 0x0f) >= 5 => {
            match p[1] & 0x03 {
                0 => Ecn::NotEct,
                3 => Ecn::AlreadyCe,
                _ => {
                    // The checksum covers the 16-bit word (version/IHL, TOS).
                    let old = u16::from_be_bytes([p[0], p[1]]);
                    p[1] |= 0x03;
                    let new = u16::from_be_bytes([p[0], p[1]]);
                    let hc = u16::from_be_bytes([p[10], p[11]]);
                    // RFC 1624 eq. 3: HC' = ~(~HC + ~m + m')
                    let mut sum = u32::from(!hc) + u32::from(!old) + u32::from(new);
                    while sum > 0xffff {
                        sum = (sum & 0xffff) + (sum >> 16);
                    }
                    let hc2 = !(sum as u16);
                    p[10..12].copy_from_slice(&hc2.to_be_bytes());
                    Ecn::Marked
                }
            }
        }
        Some(6) if p.len() >= 40 => match (p[1] >> 4) & 0x03 {
            0 => Ecn::NotEct,
            3 => Ecn::AlreadyCe,
            _ => {
                p[1] |= 0x30;
                Ecn::Marked
            }
        },
        _ => Ecn::NotIp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The IPv4 header checksum computed from scratch.
    fn checksum(h: &[u8]) -> u16 {
        let mut sum = 0u32;
        for (i, w) in h.chunks(2).enumerate() {
            if i == 5 {
                continue;
            }
            sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    fn ipv4(tos: u8) -> Vec<u8> {
        let mut h = vec![
            0x45, tos, 0x05, 0xdc, 0x1c, 0x46, 0x40, 0x00, 0x40, 0x06, 0, 0, 10, 99, 0, 1, 10, 99,
            0, 2,
        ];
        let c = checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        h.extend_from_slice(&[0xAA; 30]);
        h
    }

    #[test]
    fn ipv4_ect_becomes_ce_with_a_valid_checksum() {
        for (tos, ect) in [
            (0x02u8, true),
            (0x01, true),
            (0xb8 | 0x02, true),
            (0x00, false),
        ] {
            let mut p = ipv4(tos);
            let r = mark_ce(&mut p);
            if ect {
                assert_eq!(r, Ecn::Marked);
                assert_eq!(p[1] & 3, 3);
                assert_eq!(p[1] & 0xfc, tos & 0xfc, "DSCP kept");
            } else {
                assert_eq!(r, Ecn::NotEct);
                assert_eq!(p[1], tos);
            }
            assert_eq!(u16::from_be_bytes([p[10], p[11]]), checksum(&p[..20]));
            assert!(p[20..].iter().all(|&b| b == 0xAA), "payload untouched");
        }
        let mut p = ipv4(0x03);
        assert_eq!(mark_ce(&mut p), Ecn::AlreadyCe);
    }

    #[test]
    fn ipv4_checksum_update_holds_for_every_tos() {
        for tos in 0..=255u8 {
            let mut p = ipv4(tos);
            mark_ce(&mut p);
            assert_eq!(
                u16::from_be_bytes([p[10], p[11]]),
                checksum(&p[..20]),
                "tos {tos:#x}"
            );
        }
    }

    #[test]
    fn ipv6_traffic_class() {
        let mut p = vec![0u8; 48];
        p[0] = 0x6b; // version 6, TC high nibble 0xb
        p[1] = 0xA0; // TC low nibble 0xA: ECN bits 10, ECT(0)
        assert_eq!(mark_ce(&mut p), Ecn::Marked);
        assert_eq!((p[1] >> 4) & 3, 3);
        assert_eq!(p[0], 0x6b);
        let mut q = vec![0u8; 48];
        q[0] = 0x60;
        assert_eq!(mark_ce(&mut q), Ecn::NotEct);
        assert_eq!(q[1], 0);
    }

    #[test]
    fn not_ip_is_left_alone() {
        for mut p in [vec![], vec![0x45; 10], vec![0xB1; 60], vec![0x60; 20]] {
            let before = p.clone();
            assert_eq!(mark_ce(&mut p), Ecn::NotIp);
            assert_eq!(p, before);
        }
    }
}
