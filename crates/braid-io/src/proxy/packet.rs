//! Just enough IPv4/IPv6/TCP/ICMP parsing to route a TUN packet to a connection, and
//! the RST that refuses a held SYN. Every read is bounds-checked: no input panics.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{IpAddress, IpProtocol, IpRepr, TcpControl, TcpPacket, TcpRepr, TcpSeqNumber};

pub(super) const FIN: u8 = 0x01;
pub(super) const SYN: u8 = 0x02;
pub(super) const RST: u8 = 0x04;
pub(super) const ACK: u8 = 0x10;

const PROTO_TCP: u8 = 6;
const PROTO_ICMP: u8 = 1;
const PROTO_ICMPV6: u8 = 58;
const ICMP_UNREACHABLE: u8 = 3;
const ICMPV6_UNREACHABLE: u8 = 1;

/// A TCP segment's addresses and flags, as it travels (source to destination).
#[derive(Clone, Copy, Debug)]
pub(super) struct Seg {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub flags: u8,
}

impl Seg {
    /// A connection request: SYN without ACK, RST or FIN.
    pub fn is_syn(&self) -> bool {
        self.flags & (SYN | ACK | RST | FIN) == SYN
    }
}

/// What a TUN packet is, as far as the terminator cares.
#[derive(Clone, Copy, Debug)]
pub(super) enum Class {
    /// A well-formed TCP segment (checksum not checked).
    Tcp(Seg),
    /// An ICMP/ICMPv6 destination unreachable quoting a TCP segment: its addresses as
    /// the quoted segment travelled (source to destination).
    Unreachable { src: SocketAddr, dst: SocketAddr },
    /// Anything else.
    Other,
}

/// The IP layer of a packet.
struct Ip<'a> {
    src: IpAddr,
    dst: IpAddr,
    proto: u8,
    payload: &'a [u8],
}

fn be16(p: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*p.get(at)?, *p.get(at + 1)?]))
}

/// An IPv4 packet; `quoted` for the truncated copy inside an ICMP error (its total
/// length may exceed what is there; only its first fragment is usable).
fn ipv4(p: &[u8], quoted: bool) -> Option<Ip<'_>> {
    let ihl = usize::from(*p.first()? & 0x0f) * 4;
    if ihl < 20 || p.len() < ihl {
        return None;
    }
    let total = usize::from(be16(p, 2)?);
    if total < ihl || (!quoted && total > p.len()) {
        return None;
    }
    let frag = be16(p, 6)?;
    // A later fragment, or (not quoted) any fragment: no TCP header to read.
    if frag & 0x1fff != 0 || (!quoted && frag & 0x2000 != 0) {
        return None;
    }
    let src: [u8; 4] = p.get(12..16)?.try_into().ok()?;
    let dst: [u8; 4] = p.get(16..20)?.try_into().ok()?;
    Some(Ip {
        src: Ipv4Addr::from(src).into(),
        dst: Ipv4Addr::from(dst).into(),
        proto: p[9],
        payload: p.get(ihl..total.min(p.len()))?,
    })
}

/// An IPv6 packet whose next header is the upper layer (extension headers: `None`).
fn ipv6(p: &[u8], quoted: bool) -> Option<Ip<'_>> {
    if p.len() < 40 {
        return None;
    }
    let end = 40 + usize::from(be16(p, 4)?);
    if !quoted && end > p.len() {
        return None;
    }
    let src: [u8; 16] = p.get(8..24)?.try_into().ok()?;
    let dst: [u8; 16] = p.get(24..40)?.try_into().ok()?;
    Some(Ip {
        src: Ipv6Addr::from(src).into(),
        dst: Ipv6Addr::from(dst).into(),
        proto: p[6],
        payload: p.get(40..end.min(p.len()))?,
    })
}

fn ip(p: &[u8], quoted: bool) -> Option<Ip<'_>> {
    match *p.first()? >> 4 {
        4 => ipv4(p, quoted),
        6 => ipv6(p, quoted),
        _ => None,
    }
}

/// The ports of a TCP header (only its first 4 bytes are needed).
fn ports(t: &[u8]) -> Option<(u16, u16)> {
    Some((be16(t, 0)?, be16(t, 2)?))
}

/// Classifies a packet read from the TUN.
pub(super) fn classify(p: &[u8]) -> Class {
    classify_opt(p).unwrap_or(Class::Other)
}

fn classify_opt(p: &[u8]) -> Option<Class> {
    let ip = ip(p, false)?;
    match (ip.src, ip.proto) {
        (_, PROTO_TCP) => {
            let t = ip.payload;
            let doff = usize::from(*t.get(12)? >> 4) * 4;
            if doff < 20 || t.len() < doff {
                return None;
            }
            let (sp, dp) = ports(t)?;
            Some(Class::Tcp(Seg {
                src: SocketAddr::new(ip.src, sp),
                dst: SocketAddr::new(ip.dst, dp),
                flags: t[13],
            }))
        }
        (IpAddr::V4(_), PROTO_ICMP) => quoted_tcp(ip.payload, ICMP_UNREACHABLE),
        (IpAddr::V6(_), PROTO_ICMPV6) => quoted_tcp(ip.payload, ICMPV6_UNREACHABLE),
        _ => None,
    }
}

/// The TCP segment quoted by an ICMP error of type `unreachable`.
fn quoted_tcp(icmp: &[u8], unreachable: u8) -> Option<Class> {
    if *icmp.first()? != unreachable {
        return None;
    }
    let inner = ip(icmp.get(8..)?, true)?;
    if inner.proto != PROTO_TCP {
        return None;
    }
    let (sp, dp) = ports(inner.payload)?;
    Some(Class::Unreachable {
        src: SocketAddr::new(inner.src, sp),
        dst: SocketAddr::new(inner.dst, dp),
    })
}

/// An address a connection may use: unicast, and not IPv4 broadcast.
pub(super) fn usable(a: &SocketAddr) -> bool {
    let ip_ok = match a.ip() {
        IpAddr::V4(v) => !(v.is_unspecified() || v.is_multicast() || v.is_broadcast()),
        IpAddr::V6(v) => !(v.is_unspecified() || v.is_multicast()),
    };
    ip_ok && a.port() != 0
}

/// The TCP header and payload of a well-formed IP packet, with its addresses.
fn tcp_of(p: &[u8]) -> Option<(IpAddr, IpAddr, &[u8])> {
    let ip = ip(p, false)?;
    (ip.proto == PROTO_TCP).then_some((ip.src, ip.dst, ip.payload))
}

/// Whether the TCP checksum of a TCP packet is right.
pub(super) fn tcp_checksum_ok(p: &[u8]) -> bool {
    let Some((src, dst, t)) = tcp_of(p) else {
        return false;
    };
    match TcpPacket::new_checked(t) {
        Ok(seg) => seg.verify_checksum(&IpAddress::from(src), &IpAddress::from(dst)),
        Err(_) => false,
    }
}

/// The RST|ACK answering a SYN packet (what a closed port answers), or `None` if `syn`
/// is not a TCP packet.
pub(super) fn rst_for_syn(syn: &[u8]) -> Option<Vec<u8>> {
    let (src, dst, t) = tcp_of(syn)?;
    let seg = TcpPacket::new_checked(t).ok()?;
    let len = seg.payload().len() + usize::from(seg.syn()) + usize::from(seg.fin());
    let tcp = TcpRepr {
        src_port: seg.dst_port(),
        dst_port: seg.src_port(),
        control: TcpControl::Rst,
        seq_number: TcpSeqNumber(0),
        ack_number: Some(seg.seq_number() + len),
        window_len: 0,
        window_scale: None,
        max_seg_size: None,
        sack_permitted: false,
        sack_ranges: [None, None, None],
        timestamp: None,
        payload: &[],
    };
    let (from, to) = (IpAddress::from(dst), IpAddress::from(src));
    let ip = IpRepr::new(from, to, IpProtocol::Tcp, tcp.buffer_len(), 64);
    let caps = ChecksumCapabilities::default();
    let mut out = vec![0u8; ip.buffer_len()];
    ip.emit(&mut out[..], &caps);
    let hl = ip.header_len();
    tcp.emit(
        &mut TcpPacket::new_unchecked(&mut out[hl..]),
        &from,
        &to,
        &caps,
    );
    Some(out)
}
