//! Transmit offload for the TUN device (TSO): with `TUNSETOFFLOAD` the kernel hands the
//! tunnel one large TCP segment per read (up to 64 KiB, with a virtio-net header giving
//! the segment size) and leaves checksums partial; [`Segmenter`] cuts such a frame into
//! packets of at most the bond's MTU, each a complete packet with its own IP and TCP
//! (or UDP) header and full checksums, as the kernel's own software GSO would.
//!
//! Per segment: IPv4 total length, identification (+1 per segment) and header
//! checksum, or the IPv6 payload length; TCP sequence number advanced by the payload
//! before it, FIN and PSH only on the last segment, CWR only on the first; the TCP or
//! UDP checksum computed over the pseudo-header, the header and the payload. A frame
//! without GSO whose checksum the kernel left partial (`NEEDS_CSUM`) is completed.
//! Anything malformed is refused (the caller counts it), never a panic.
//!
//! Packets are cut into one large reused buffer and handed out as [`Bytes`] views of
//! it: no allocation per packet, one per buffer's worth of reads at most.

use bytes::{Bytes, BytesMut};

use crate::offload::VNET_HDR_LEN;

const F_NEEDS_CSUM: u8 = 1;
const GSO_NONE: u8 = 0;
const GSO_TCPV4: u8 = 1;
const GSO_TCPV6: u8 = 4;
const GSO_UDP_L4: u8 = 5;
/// Set with a TCP GSO type when the segment carries CWR (`TUN_F_TSO_ECN`).
const GSO_ECN: u8 = 0x80;
const TCP: u8 = 6;
const UDP: u8 = 17;
const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_CWR: u8 = 0x80;
/// The reused output buffer's size: room for several 64 KiB reads.
const OUT_CHUNK: usize = 256 * 1024;

/// Why a frame read from the TUN device was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused(pub &'static str);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// Where the headers of a packet to segment are.
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// IP header length.
    ip: usize,
    v6: bool,
    udp: bool,
    /// IP plus TCP or UDP header length.
    hdr: usize,
}

/// Cuts frames read from an offloading TUN device into packets; counts what it
/// refused.
pub struct Segmenter {
    out: BytesMut,
    /// Frames refused as malformed (dropped).
    pub refused: u64,
    /// Frames that arrived as one GSO super-segment.
    pub gso_frames: u64,
}

impl Default for Segmenter {
    fn default() -> Self {
        Segmenter::new()
    }
}

impl Segmenter {
    /// A segmenter with an empty output buffer.
    pub fn new() -> Segmenter {
        Segmenter {
            out: BytesMut::with_capacity(OUT_CHUNK),
            refused: 0,
            gso_frames: 0,
        }
    }

    /// Cut `frame` (a virtio-net header and a packet, as read) into packets of at most
    /// `max_len` bytes, appended to `pkts`; each passes through `fix` (e.g. MSS
    /// clamping) before it is handed out. A packet without GSO goes whole, whatever its
    /// size (the caller decides what to do with one too large). A refused frame is
    /// counted and adds nothing.
    pub fn split(
        &mut self,
        frame: &mut [u8],
        max_len: usize,
        pkts: &mut Vec<Bytes>,
        fix: impl Fn(&mut [u8]),
    ) -> Result<(), Refused> {
        let r = self.split_inner(frame, max_len, pkts, &fix);
        if r.is_err() {
            self.refused += 1;
        }
        r
    }

    fn split_inner(
        &mut self,
        frame: &mut [u8],
        max_len: usize,
        pkts: &mut Vec<Bytes>,
        fix: &impl Fn(&mut [u8]),
    ) -> Result<(), Refused> {
        if frame.len() <= VNET_HDR_LEN {
            return Err(Refused("shorter than a virtio-net header and a packet"));
        }
        let (h, p) = frame.split_at_mut(VNET_HDR_LEN);
        let gso = h[1] & !GSO_ECN;
        if gso == GSO_NONE {
            if h[0] & F_NEEDS_CSUM != 0 {
                let start = usize::from(u16::from_le_bytes([h[6], h[7]]));
                let off = usize::from(u16::from_le_bytes([h[8], h[9]]));
                finish_checksum(p, start, off)?;
            }
            self.reserve(p.len());
            self.out.extend_from_slice(p);
            fix(&mut self.out);
            pkts.push(self.out.split().freeze());
            return Ok(());
        }
        let lay = layout(p)?;
        let want = match gso {
            GSO_TCPV4 => !lay.v6 && !lay.udp,
            GSO_TCPV6 => lay.v6 && !lay.udp,
            GSO_UDP_L4 => lay.udp,
            _ => false,
        };
        if !want {
            return Err(Refused("GSO type unknown or not that of the packet"));
        }
        let gso_size = usize::from(u16::from_le_bytes([h[4], h[5]]));
        if gso_size == 0 {
            return Err(Refused("GSO frame with a segment size of zero"));
        }
        let room = max_len.saturating_sub(lay.hdr);
        // A UDP datagram's size is the application's: never cut finer.
        let mss = if lay.udp {
            gso_size
        } else {
            gso_size.min(room)
        };
        if mss == 0 || (lay.udp && mss > room) {
            return Err(Refused(
                "headers leave no room for a segment within the MTU",
            ));
        }
        self.gso_frames += 1;
        self.cut(p, lay, mss, pkts, fix);
        Ok(())
    }

    fn reserve(&mut self, n: usize) {
        if self.out.capacity() < n {
            self.out.reserve(n.max(OUT_CHUNK));
        }
    }

    /// Cut the checked packet `p` into segments of `mss` payload bytes.
    fn cut(
        &mut self,
        p: &[u8],
        lay: Layout,
        mss: usize,
        pkts: &mut Vec<Bytes>,
        fix: &impl Fn(&mut [u8]),
    ) {
        let payload = p.len() - lay.hdr;
        let count = payload.div_ceil(mss).max(1);
        self.reserve(p.len() + (count - 1) * lay.hdr);
        let (head, body) = p.split_at(lay.hdr);
        for i in 0..count {
            let from = i * mss;
            let to = (from + mss).min(payload);
            self.out.extend_from_slice(head);
            self.out.extend_from_slice(&body[from..to]);
            let seg = Seg {
                index: i,
                offset: from,
                last: i + 1 == count,
            };
            fix_segment(&mut self.out, lay, seg);
            fix(&mut self.out);
            pkts.push(self.out.split().freeze());
        }
    }
}

/// Which segment of a super-segment a packet is.
#[derive(Debug, Clone, Copy)]
struct Seg {
    index: usize,
    /// Payload bytes before it.
    offset: usize,
    last: bool,
}

/// The headers of a packet the kernel handed over as one GSO frame: IPv4 without
/// fragmentation or IPv6 without extension headers, lengths consistent, TCP or UDP.
fn layout(p: &[u8]) -> Result<Layout, Refused> {
    let bad = |why| Err(Refused(why));
    let (ip, proto, v6) = match p.first().map(|b| b >> 4) {
        Some(4) if p.len() >= 20 => {
            let ihl = usize::from(p[0] & 0x0f) * 4;
            if ihl < 20 || p.len() < ihl {
                return bad("IPv4 header length out of range");
            }
            if usize::from(u16::from_be_bytes([p[2], p[3]])) != p.len() {
                return bad("IPv4 total length is not the frame's");
            }
            if u16::from_be_bytes([p[6], p[7]]) & 0x3fff != 0 {
                return bad("IPv4 fragment");
            }
            (ihl, p[9], false)
        }
        Some(6) if p.len() >= 40 => {
            if usize::from(u16::from_be_bytes([p[4], p[5]])) + 40 != p.len() {
                return bad("IPv6 payload length is not the frame's");
            }
            (40, p[6], true)
        }
        _ => return bad("GSO frame that is not an IPv4 or IPv6 packet"),
    };
    let l4 = match proto {
        TCP if p.len() >= ip + 20 => {
            let doff = usize::from(p[ip + 12] >> 4) * 4;
            if doff < 20 || p.len() < ip + doff {
                return bad("TCP header length out of range");
            }
            doff
        }
        UDP if p.len() >= ip + 8 => 8,
        _ => return bad("GSO frame that is not TCP or UDP (or truncated)"),
    };
    Ok(Layout {
        ip,
        v6,
        udp: proto == UDP,
        hdr: ip + l4,
    })
}

/// Make `s` (the super-segment's headers and this segment's payload) a packet of its
/// own: lengths, IPv4 id and header checksum, TCP sequence and flags, checksum.
fn fix_segment(s: &mut [u8], lay: Layout, seg: Seg) {
    let len = s.len();
    let ip = lay.ip;
    if lay.v6 {
        s[4..6].copy_from_slice(&((len - 40) as u16).to_be_bytes());
    } else {
        s[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        let id = u16::from_be_bytes([s[4], s[5]]).wrapping_add(seg.index as u16);
        s[4..6].copy_from_slice(&id.to_be_bytes());
        s[10..12].copy_from_slice(&[0, 0]);
        let ck = !fold(sum(&s[..ip]));
        s[10..12].copy_from_slice(&ck.to_be_bytes());
    }
    let at = if lay.udp {
        s[ip + 4..ip + 6].copy_from_slice(&((len - ip) as u16).to_be_bytes());
        ip + 6
    } else {
        let t = &mut s[ip..];
        let seq = u32::from_be_bytes([t[4], t[5], t[6], t[7]]).wrapping_add(seg.offset as u32);
        t[4..8].copy_from_slice(&seq.to_be_bytes());
        if !seg.last {
            t[13] &= !(TCP_FIN | TCP_PSH);
        }
        if seg.index > 0 {
            t[13] &= !TCP_CWR;
        }
        ip + 16
    };
    s[at..at + 2].copy_from_slice(&[0, 0]);
    let ck = l4_checksum(s, lay);
    s[at..at + 2].copy_from_slice(&ck.to_be_bytes());
}

/// The TCP or UDP checksum of packet `s` (its checksum field zero).
fn l4_checksum(s: &[u8], lay: Layout) -> u16 {
    let addrs = if lay.v6 { &s[8..40] } else { &s[12..20] };
    let proto = if lay.udp { UDP } else { TCP };
    let l4_len = (s.len() - lay.ip) as u64;
    let total = sum(addrs) + u64::from(proto) + l4_len + sum(&s[lay.ip..]);
    // A zero UDP checksum means "none": send its equal, all ones (as the kernel does).
    match !fold(total) {
        0 => 0xffff,
        ck => ck,
    }
}

/// Complete the checksum the kernel left partial: the field at `start + off` holds the
/// pseudo-header sum, the rest from `start` on is summed over it.
fn finish_checksum(p: &mut [u8], start: usize, off: usize) -> Result<(), Refused> {
    let at = start + off;
    if at + 2 > p.len() {
        return Err(Refused("checksum position beyond the packet"));
    }
    let ck = match !fold(sum(&p[start..])) {
        0 => 0xffff,
        ck => ck,
    };
    p[at..at + 2].copy_from_slice(&ck.to_be_bytes());
    Ok(())
}

/// The one's-complement sum of `data` as big-endian 16-bit words (a trailing odd byte
/// padded with zero), not yet folded. Eight bytes at a time: the sum of native-endian
/// words is the byte-swapped sum of big-endian ones (RFC 1071), swapped back at the end.
fn sum(data: &[u8]) -> u64 {
    let mut acc = 0u64;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        acc += (w & 0xffff_ffff) + (w >> 32);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut last = [0u8; 8];
        last[..rest.len()].copy_from_slice(rest);
        let w = u64::from_ne_bytes(last);
        acc += (w & 0xffff_ffff) + (w >> 32);
    }
    u64::from(u16::from_be(fold(acc)))
}

/// Fold a one's-complement sum to 16 bits.
fn fold(mut s: u64) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain reference: big-endian 16-bit words, one at a time.
    fn ref_sum(data: &[u8]) -> u32 {
        let mut s = 0u32;
        for (i, b) in data.iter().enumerate() {
            s += if i % 2 == 0 {
                u32::from(*b) << 8
            } else {
                u32::from(*b)
            };
        }
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        s
    }

    /// Whether the packet's IPv4 header checksum (if any) and TCP/UDP checksum verify.
    fn verifies(p: &[u8]) -> bool {
        let (ip, v6) = if p[0] >> 4 == 6 {
            (40, true)
        } else {
            (20, false)
        };
        if !v6 && ref_sum(&p[..20]) != 0xffff {
            return false;
        }
        let proto = if v6 { p[6] } else { p[9] };
        let addrs = if v6 { &p[8..40] } else { &p[12..20] };
        let mut s = ref_sum(addrs) + u32::from(proto) + (p.len() - ip) as u32;
        s += ref_sum(&p[ip..]);
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        s == 0xffff
    }

    fn payload(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// A TCP/IPv4 packet 10.0.0.1:1000 -> 10.0.0.2:2000 (timestamps option), the
    /// checksum field left as garbage.
    fn tcp4(seq: u32, flags: u8, data: &[u8]) -> Vec<u8> {
        let total = 20 + 32 + data.len();
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[4..6].copy_from_slice(&0xfffeu16.to_be_bytes());
        p[6] = 0x40;
        p[8] = 64;
        p[9] = TCP;
        p[12..16].copy_from_slice(&[10, 0, 0, 1]);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        let ck = !fold(u64::from(ref_sum(&p[..20])));
        p[10..12].copy_from_slice(&ck.to_be_bytes());
        let t = &mut p[20..];
        t[0..2].copy_from_slice(&1000u16.to_be_bytes());
        t[2..4].copy_from_slice(&2000u16.to_be_bytes());
        t[4..8].copy_from_slice(&seq.to_be_bytes());
        t[8..12].copy_from_slice(&77u32.to_be_bytes());
        t[12] = 8 << 4;
        t[13] = flags;
        t[14..16].copy_from_slice(&512u16.to_be_bytes());
        t[16..18].copy_from_slice(&[0xde, 0xad]);
        t[20..24].copy_from_slice(&[1, 1, 8, 10]);
        t[32..].copy_from_slice(data);
        p
    }

    /// A TCP/IPv6 packet fd00::1 -> fd00::2, no options.
    fn tcp6(seq: u32, flags: u8, data: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; 60 + data.len()];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&((20 + data.len()) as u16).to_be_bytes());
        p[6] = TCP;
        p[7] = 64;
        p[8] = 0xfd;
        p[23] = 1;
        p[24] = 0xfd;
        p[39] = 2;
        let t = &mut p[40..];
        t[4..8].copy_from_slice(&seq.to_be_bytes());
        t[12] = 5 << 4;
        t[13] = flags;
        t[16..18].copy_from_slice(&[0xbe, 0xef]);
        t[20..].copy_from_slice(data);
        p
    }

    fn frame(gso: u8, gso_size: u16, csum: Option<(u16, u16)>, p: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; VNET_HDR_LEN];
        f[1] = gso;
        f[4..6].copy_from_slice(&gso_size.to_le_bytes());
        if let Some((start, off)) = csum {
            f[0] = F_NEEDS_CSUM;
            f[6..8].copy_from_slice(&start.to_le_bytes());
            f[8..10].copy_from_slice(&off.to_le_bytes());
        }
        f.extend_from_slice(p);
        f
    }

    fn split(f: &mut [u8], max_len: usize) -> (Segmenter, Result<(), Refused>, Vec<Bytes>) {
        let mut s = Segmenter::new();
        let mut pkts = Vec::new();
        let r = s.split(f, max_len, &mut pkts, |_| {});
        (s, r, pkts)
    }

    const ACK: u8 = 0x10;

    #[test]
    fn the_checksum_matches_a_plain_reference_at_every_length_and_offset() {
        let d = payload(300);
        for from in 0..9 {
            for len in 0..200 {
                let x = &d[from * 2..from * 2 + len];
                assert_eq!(u32::from(fold(sum(x))), ref_sum(x), "{from} {len}");
            }
        }
    }

    #[test]
    fn a_tcp_ipv4_super_segment_becomes_valid_packets_with_the_right_headers() {
        let data = payload(3500);
        let flags = ACK | TCP_PSH | TCP_FIN | TCP_CWR;
        let mut f = frame(
            GSO_TCPV4,
            1000,
            Some((20, 16)),
            &tcp4(0xffff_fe00, flags, &data),
        );
        let (s, r, pkts) = split(&mut f, 1500);
        assert_eq!(r, Ok(()));
        assert_eq!((s.gso_frames, s.refused), (1, 0));
        let sizes: Vec<usize> = pkts.iter().map(|p| p.len() - 52).collect();
        assert_eq!(
            sizes,
            [1000, 1000, 1000, 500],
            "the last segment is shorter"
        );
        let mut joined = Vec::new();
        for (i, p) in pkts.iter().enumerate() {
            assert!(verifies(p), "segment {i}: checksums");
            assert_eq!(usize::from(u16::from_be_bytes([p[2], p[3]])), p.len());
            let id = u16::from_be_bytes([p[4], p[5]]);
            assert_eq!(id, 0xfffeu16.wrapping_add(i as u16), "IPv4 id per segment");
            let seq = u32::from_be_bytes([p[24], p[25], p[26], p[27]]);
            assert_eq!(seq, 0xffff_fe00u32.wrapping_add(1000 * i as u32), "wraps");
            let want = match i {
                0 => ACK | TCP_CWR,
                3 => ACK | TCP_PSH | TCP_FIN,
                _ => ACK,
            };
            assert_eq!(p[33], want, "segment {i}: flags");
            assert_eq!(&p[..2], &[0x45, 0]);
            assert_eq!(&p[38..52], &tcp4(0, 0, &[])[38..52], "options copied");
            joined.extend_from_slice(&p[52..]);
        }
        assert_eq!(joined, data);
        // Views of one buffer: no allocation per packet.
        for w in pkts.windows(2) {
            assert_eq!(w[0].as_ptr().wrapping_add(w[0].len()), w[1].as_ptr());
        }
    }

    #[test]
    fn segments_are_cut_finer_when_the_mtu_is_below_the_gso_size() {
        let data = payload(2000);
        let mut f = frame(GSO_TCPV4, 1448, Some((20, 16)), &tcp4(1, ACK, &data));
        let (_, r, pkts) = split(&mut f, 600);
        assert_eq!(r, Ok(()));
        assert!(pkts.iter().all(|p| p.len() <= 600 && verifies(p)));
        assert_eq!(pkts.len(), 2000usize.div_ceil(548));
        let total: usize = pkts.iter().map(|p| p.len() - 52).sum();
        assert_eq!(total, 2000);
    }

    #[test]
    fn a_tcp_ipv6_super_segment_becomes_valid_packets() {
        let data = payload(4001);
        let mut f = frame(
            GSO_TCPV6,
            1400,
            Some((40, 16)),
            &tcp6(5, ACK | TCP_PSH, &data),
        );
        let (_, r, pkts) = split(&mut f, 1500);
        assert_eq!(r, Ok(()));
        assert_eq!(pkts.len(), 3);
        for (i, p) in pkts.iter().enumerate() {
            assert!(verifies(p), "segment {i}");
            assert_eq!(usize::from(u16::from_be_bytes([p[4], p[5]])) + 40, p.len());
            let seq = u32::from_be_bytes([p[44], p[45], p[46], p[47]]);
            assert_eq!(seq, 5 + 1400 * i as u32);
            assert_eq!(p[53] & TCP_PSH != 0, i == 2, "PSH only on the last");
        }
        assert_eq!(pkts[2].len(), 60 + 4001 - 2800, "odd-sized last segment");
    }

    #[test]
    fn a_udp_gso_frame_becomes_datagrams_with_their_own_lengths_and_checksums() {
        let data = payload(2500);
        let mut p = tcp6(0, 0, &[]);
        p.truncate(40);
        p[6] = UDP;
        p.extend_from_slice(&[0x1f, 0x90, 0x23, 0x28, 0, 0, 0, 0]);
        p.extend_from_slice(&data);
        let plen = (p.len() - 40) as u16;
        p[4..6].copy_from_slice(&plen.to_be_bytes());
        let mut f = frame(GSO_UDP_L4, 1000, Some((40, 6)), &p);
        let (_, r, pkts) = split(&mut f, 1500);
        assert_eq!(r, Ok(()));
        assert_eq!(pkts.len(), 3);
        for d in &pkts {
            assert!(verifies(d));
            assert_eq!(
                usize::from(u16::from_be_bytes([d[44], d[45]])),
                d.len() - 40
            );
        }
        // Datagrams are the application's: never cut finer than gso_size.
        let mut f = frame(GSO_UDP_L4, 1000, None, &p);
        assert!(split(&mut f, 900).1.is_err());
    }

    #[test]
    fn a_single_packet_gets_its_partial_checksum_completed() {
        let mut p = tcp4(9, ACK | TCP_PSH, &payload(777));
        // As the kernel leaves it: the pseudo-header sum in the field.
        let ph = ref_sum(&p[12..20]) + 6 + (p.len() - 20) as u32;
        p[36..38].copy_from_slice(&fold(u64::from(ph)).to_be_bytes());
        let mut f = frame(GSO_NONE, 0, Some((20, 16)), &p);
        let (s, r, pkts) = split(&mut f, 1500);
        assert_eq!((r, s.gso_frames), (Ok(()), 0));
        assert_eq!(pkts.len(), 1);
        assert!(verifies(&pkts[0]));
        assert_eq!(&pkts[0][..36], &p[..36]);
        // Without NEEDS_CSUM the packet goes as it is, even if larger than max_len.
        let mut f = frame(GSO_NONE, 0, None, &p);
        let (_, r, pkts) = split(&mut f, 100);
        assert_eq!((r, &pkts[0][..]), (Ok(()), &p[..]));
    }

    #[test]
    fn every_packet_passes_through_the_fix_hook() {
        let mut f = frame(GSO_TCPV4, 500, None, &tcp4(1, ACK, &payload(1200)));
        let mut s = Segmenter::new();
        let mut pkts = Vec::new();
        s.split(&mut f, 1500, &mut pkts, |p| p[8] = 7).unwrap();
        assert!(pkts.len() == 3 && pkts.iter().all(|p| p[8] == 7));
    }

    #[test]
    fn malformed_frames_are_refused_and_counted_never_a_panic() {
        let good = tcp4(1, ACK, &payload(3000));
        let mut cases: Vec<Vec<u8>> = vec![
            vec![],
            vec![0; VNET_HDR_LEN],
            frame(GSO_TCPV6, 1000, None, &good), // family mismatch
            frame(3, 1000, None, &good),         // UFO: not offered
            frame(GSO_TCPV4, 0, None, &good),    // no segment size
            frame(GSO_TCPV4, 1000, None, &good[..60]), // total length mismatch
            frame(GSO_TCPV4, 1000, None, &[0x45; 30]),
            frame(GSO_TCPV4, 1000, None, &[0x99; 80]),
            frame(GSO_NONE, 0, Some((20, 3100)), &good),
            frame(GSO_NONE, 0, Some((u16::MAX, u16::MAX)), &good),
        ];
        let mut frag = good.clone();
        frag[6] = 0x20;
        cases.push(frame(GSO_TCPV4, 1000, None, &frag));
        let mut bad_doff = good.clone();
        bad_doff[32] = 0x40;
        cases.push(frame(GSO_TCPV4, 1000, None, &bad_doff));
        let n = cases.len() as u64;
        let mut s = Segmenter::new();
        let mut pkts = Vec::new();
        for (i, c) in cases.iter_mut().enumerate() {
            assert!(s.split(c, 1500, &mut pkts, |_| {}).is_err(), "case {i}");
        }
        // Headers larger than the MTU: nothing fits.
        let mut f = frame(GSO_TCPV4, 1000, None, &good);
        assert!(s.split(&mut f, 52, &mut pkts, |_| {}).is_err());
        assert_eq!(s.refused, n + 1);
        assert!(pkts.is_empty());
        // Random headers over random bytes: whatever happens, no panic, and every
        // packet handed out fits.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 300) as usize;
            let mut f: Vec<u8> = (0..len).map(|i| (x >> (i % 56)) as u8).collect();
            if len > 12 {
                f[1] = [GSO_NONE, GSO_TCPV4, GSO_TCPV6, GSO_UDP_L4][(x >> 8) as usize % 4];
                f[VNET_HDR_LEN] = [0x45, 0x46, 0x60][(x >> 12) as usize % 3];
            }
            pkts.clear();
            if s.split(&mut f, 200, &mut pkts, |_| {}).is_ok() && f[1] != GSO_NONE {
                assert!(pkts.iter().all(|p| p.len() <= 200));
            }
        }
    }
}
