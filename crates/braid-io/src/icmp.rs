//! Inner packets too big for the bond (issue 30, path MTU): never a silent drop.
//!
//! The TUN device's MTU is normally the bond's, so the kernel itself answers a host
//! that sends larger packets. A packet larger than the bond carries still reaches the
//! tunnel when `tunnel.mtu` is set above it, or when a router forwards into the tunnel
//! from a link with a larger MTU without looking at the TUN's. What a router would do:
//! - **IPv4 with Don't Fragment** (every TCP segment of a host doing path MTU
//!   discovery): an ICMP "fragmentation needed" (type 3, code 4) naming the bond's MTU,
//!   back to the sender, so its TCP lowers its segment size (RFC 1191);
//! - **IPv4 without it**: the packet is fragmented to fit the bond, as a router must;
//! - **IPv6**: an ICMPv6 "packet too big" (type 2) naming the MTU (RFC 8201).
//!
//! The answers go back into the TUN device, from the packet's destination to its
//! source (as if the far end's router answered). No answer is sent to an ICMP error
//! (no loops of errors) nor to a source that cannot be one (unspecified, multicast,
//! broadcast); such packets are dropped, and counted by the caller.

use std::net::{Ipv4Addr, Ipv6Addr};

use etherparse::{
    icmpv4::DestUnreachableHeader, Icmpv4Type, Icmpv6Type, IpFragOffset, Ipv4Header, PacketBuilder,
};

/// The most an ICMP error carries back of the packet it answers, so that the answer
/// is at most 576 bytes (IPv4, RFC 1812) or 1280 (IPv6, RFC 4443).
const QUOTE_V4: usize = 576 - 20 - 8;
const QUOTE_V6: usize = 1280 - 40 - 8;
/// Hop limit of the answers.
const TTL: u8 = 64;

/// What to do with an inner packet larger than the bond carries.
#[derive(Debug, PartialEq, Eq)]
pub enum TooBig {
    /// Write this ICMP or ICMPv6 error back to the TUN device.
    Answer(Vec<u8>),
    /// Send these fragments in its place (IPv4 without Don't Fragment).
    Fragments(Vec<Vec<u8>>),
    /// Drop it: nothing may answer it (an ICMP error, a source that is no host, or a
    /// packet that is not IP).
    Drop,
}

/// The answer to `pkt`, which is larger than `mtu`, the largest inner packet the bond
/// carries.
pub fn too_big(pkt: &[u8], mtu: usize) -> TooBig {
    match pkt.first().map(|b| b >> 4) {
        Some(4) => v4(pkt, mtu),
        Some(6) => v6(pkt, mtu),
        _ => TooBig::Drop,
    }
}

fn v4(pkt: &[u8], mtu: usize) -> TooBig {
    let Ok((h, _)) = Ipv4Header::from_slice(pkt) else {
        return TooBig::Drop;
    };
    let (src, dst) = (Ipv4Addr::from(h.source), Ipv4Addr::from(h.destination));
    if src.is_unspecified() || src.is_multicast() || src.is_broadcast() {
        return TooBig::Drop;
    }
    if !h.dont_fragment {
        return fragment(pkt, &h, mtu);
    }
    let first = h.fragment_offset.value() == 0;
    if h.protocol.0 == 1 && is_icmp_error(pkt.get(h.header_len()).copied()) && first {
        return TooBig::Drop;
    }
    let next_hop_mtu = u16::try_from(mtu).unwrap_or(u16::MAX);
    let quote = &pkt[..pkt.len().min(QUOTE_V4)];
    let b = PacketBuilder::ipv4(dst.octets(), src.octets(), TTL).icmpv4(
        Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::FragmentationNeeded {
            next_hop_mtu,
        }),
    );
    let mut out = Vec::with_capacity(b.size(quote.len()));
    match b.write(&mut out, quote) {
        Ok(()) => TooBig::Answer(out),
        Err(_) => TooBig::Drop,
    }
}

/// ICMP types that report errors (an answer to them could loop).
fn is_icmp_error(kind: Option<u8>) -> bool {
    matches!(kind, Some(3 | 4 | 5 | 11 | 12))
}

/// Fragments of an IPv4 packet without Don't Fragment, each at most `mtu` bytes (RFC
/// 791): the payload cut at multiples of 8 bytes, every fragment with the packet's
/// header (its offset and More Fragments set, options only in the first unless they
/// say to be copied; a packet with options is answered by fragments without them
/// after the first).
fn fragment(pkt: &[u8], h: &Ipv4Header, mtu: usize) -> TooBig {
    let hlen = h.header_len();
    let total = usize::from(h.total_len).min(pkt.len());
    let Some(payload) = pkt.get(hlen..total) else {
        return TooBig::Drop;
    };
    let mut rest_header = h.clone();
    // Options are rare on the wire; copying only the "copied" ones needs parsing them.
    // Fragments after the first go without any (allowed: only the copied ones must be
    // repeated, and a receiver reassembles by the first fragment's).
    rest_header.options = Default::default();
    let mut out = Vec::new();
    let mut at = 0;
    while at < payload.len() {
        let header = if at == 0 { h } else { &rest_header };
        let room = mtu.saturating_sub(header.header_len()) & !7;
        if room == 0 {
            return TooBig::Drop;
        }
        let end = (at + room).min(payload.len());
        let mut f = header.clone();
        let offset = h.fragment_offset.value() + (at / 8) as u16;
        let Ok(offset) = IpFragOffset::try_new(offset) else {
            return TooBig::Drop;
        };
        f.fragment_offset = offset;
        f.more_fragments = end < payload.len() || h.more_fragments;
        if f.set_payload_len(end - at).is_err() {
            return TooBig::Drop;
        }
        let mut bytes = Vec::with_capacity(f.header_len() + end - at);
        if f.write(&mut bytes).is_err() {
            return TooBig::Drop;
        }
        bytes.extend_from_slice(&payload[at..end]);
        out.push(bytes);
        at = end;
    }
    TooBig::Fragments(out)
}

fn v6(pkt: &[u8], mtu: usize) -> TooBig {
    if pkt.len() < 40 {
        return TooBig::Drop;
    }
    let addr = |at: usize| {
        let mut a = [0u8; 16];
        a.copy_from_slice(&pkt[at..at + 16]);
        Ipv6Addr::from(a)
    };
    let (src, dst) = (addr(8), addr(24));
    if src.is_unspecified() || src.is_multicast() {
        return TooBig::Drop;
    }
    // An ICMPv6 error (types below 128) is never answered.
    if pkt[6] == 58 && pkt.get(40).is_some_and(|t| *t < 128) {
        return TooBig::Drop;
    }
    let quote = &pkt[..pkt.len().min(QUOTE_V6)];
    let b = PacketBuilder::ipv6(dst.octets(), src.octets(), TTL).icmpv6(Icmpv6Type::PacketTooBig {
        mtu: u32::try_from(mtu).unwrap_or(u32::MAX),
    });
    let mut out = Vec::with_capacity(b.size(quote.len()));
    match b.write(&mut out, quote) {
        Ok(()) => TooBig::Answer(out),
        Err(_) => TooBig::Drop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::{NetSlice, SlicedPacket, TransportSlice};

    fn sum16(b: &[u8]) -> u16 {
        let mut s: u32 = b
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
            .sum();
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        s as u16
    }

    fn udp4(len: usize, df: bool) -> Vec<u8> {
        let b = PacketBuilder::ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64).udp(1000, 2000);
        let payload: Vec<u8> = (0..len - 28).map(|i| i as u8).collect();
        let mut out = Vec::new();
        b.write(&mut out, &payload).unwrap();
        // The builder sets Don't Fragment; clear it (and fix the checksum) if asked.
        let (mut h, rest) = Ipv4Header::from_slice(&out).unwrap();
        h.dont_fragment = df;
        let mut pkt = Vec::new();
        h.write(&mut pkt).unwrap();
        pkt.extend_from_slice(rest);
        pkt
    }

    fn udp6(len: usize) -> Vec<u8> {
        let a: Ipv6Addr = "fd79::1".parse().unwrap();
        let z: Ipv6Addr = "fd79::2".parse().unwrap();
        let b = PacketBuilder::ipv6(a.octets(), z.octets(), 64).udp(1000, 2000);
        let mut out = Vec::new();
        b.write(&mut out, &vec![7u8; len - 48]).unwrap();
        out
    }

    #[test]
    fn ipv4_with_dont_fragment_gets_fragmentation_needed_with_the_mtu() {
        let pkt = udp4(1500, true);
        let TooBig::Answer(a) = too_big(&pkt, 1400) else {
            panic!("no answer");
        };
        let s = SlicedPacket::from_ip(&a).unwrap();
        let Some(NetSlice::Ipv4(ip)) = &s.net else {
            panic!("not IPv4");
        };
        // From the packet's destination back to its source, with a valid header.
        assert_eq!(ip.header().source(), [10, 0, 0, 2]);
        assert_eq!(ip.header().destination(), [10, 0, 0, 1]);
        let h = ip.header().to_header();
        assert_eq!(h.header_checksum, h.calc_header_checksum());
        let Some(TransportSlice::Icmpv4(icmp)) = &s.transport else {
            panic!("not ICMP");
        };
        assert_eq!(
            icmp.icmp_type(),
            Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::FragmentationNeeded {
                next_hop_mtu: 1400
            })
        );
        // The ICMP message sums to 0xffff with its checksum (RFC 792).
        assert_eq!(sum16(icmp.slice()), 0xffff);
        // It quotes the start of the packet, and stays within 576 bytes.
        assert_eq!(icmp.payload(), &pkt[..548]);
        assert_eq!(a.len(), 576);
    }

    #[test]
    fn ipv4_without_dont_fragment_is_fragmented_to_fit() {
        let pkt = udp4(3000, false);
        let TooBig::Fragments(fs) = too_big(&pkt, 1400) else {
            panic!("not fragmented");
        };
        assert_eq!(fs.len(), 3);
        let mut payload = Vec::new();
        for (i, f) in fs.iter().enumerate() {
            assert!(f.len() <= 1400);
            let (h, rest) = Ipv4Header::from_slice(f).unwrap();
            assert_eq!(h.header_checksum, h.calc_header_checksum());
            assert_eq!(usize::from(h.fragment_offset.value()) * 8, payload.len());
            assert_eq!(h.more_fragments, i + 1 < fs.len());
            assert_eq!(
                h.identification,
                Ipv4Header::from_slice(&pkt).unwrap().0.identification
            );
            payload.extend_from_slice(rest);
        }
        // Put back together, the payload is the packet's.
        assert_eq!(payload, &pkt[20..]);
    }

    #[test]
    fn ipv6_gets_packet_too_big_with_the_mtu() {
        let pkt = udp6(1500);
        let TooBig::Answer(a) = too_big(&pkt, 1400) else {
            panic!("no answer");
        };
        let s = SlicedPacket::from_ip(&a).unwrap();
        let Some(NetSlice::Ipv6(ip)) = &s.net else {
            panic!("not IPv6");
        };
        assert_eq!(
            ip.header().source_addr(),
            "fd79::2".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(
            ip.header().destination_addr(),
            "fd79::1".parse::<Ipv6Addr>().unwrap()
        );
        let Some(TransportSlice::Icmpv6(icmp)) = &s.transport else {
            panic!("not ICMPv6");
        };
        assert_eq!(icmp.icmp_type(), Icmpv6Type::PacketTooBig { mtu: 1400 });
        assert!(icmp.is_checksum_valid(ip.header().source(), ip.header().destination()));
        assert_eq!(a.len(), 1280);
    }

    #[test]
    fn errors_and_impossible_sources_are_not_answered() {
        // An ICMPv6 error (type 1, unreachable) that is too big.
        let mut e6 = udp6(1500);
        e6[6] = 58;
        e6[40] = 1;
        assert_eq!(too_big(&e6, 1400), TooBig::Drop);
        // An ICMP error (type 3) with Don't Fragment.
        let mut e4 = udp4(1500, true);
        e4[9] = 1;
        e4[20] = 3;
        let (h, _) = Ipv4Header::from_slice(&e4).unwrap();
        let mut fixed = Vec::new();
        h.write(&mut fixed).unwrap();
        e4[..20].copy_from_slice(&fixed);
        assert_eq!(too_big(&e4, 1400), TooBig::Drop);
        // A multicast source; not IP at all.
        let mut m = udp6(1500);
        m[8] = 0xff;
        assert_eq!(too_big(&m, 1400), TooBig::Drop);
        assert_eq!(too_big(&[0x45; 10], 1400), TooBig::Drop);
        assert_eq!(too_big(&[0xb1; 1500], 1400), TooBig::Drop);
    }
}
