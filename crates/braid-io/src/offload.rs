//! Receive offload for the TUN device: consecutive in-order TCP/IPv4 segments of one
//! flow, as the peer's TUN device read them, written back to the kernel as one large
//! segment with a virtio-net header (`IFF_VNET_HDR`) that marks it GSO: the kernel's
//! receive path then handles one packet instead of up to [`MAX_SEGMENTS`], and skips
//! the per-segment checksum (`NEEDS_CSUM`: the datagrams were authenticated or
//! checksummed on the way). Everything else goes out as it came, one packet per frame
//! with an all-zero header.
//!
//! The merged packet is what the kernel's own GRO would build: the first segment's
//! headers with the total length, a fresh IPv4 header checksum, the TCP checksum field
//! holding the pseudo-header sum, and PSH from the last segment.

/// Bytes of the virtio-net header before every packet on an `IFF_VNET_HDR` device.
pub const VNET_HDR_LEN: usize = 10;
/// Segments merged into one frame, at most.
pub const MAX_SEGMENTS: usize = 64;

const F_NEEDS_CSUM: u8 = 1;
const GSO_TCPV4: u8 = 1;
const TCP_ACK: u8 = 0x10;
const TCP_PSH: u8 = 0x08;
const IP_LIMIT: usize = 65535;

/// The parts of a mergeable segment.
#[derive(Clone, Copy)]
struct Seg {
    /// IPv4 header length (always 20: no options) plus the TCP header length.
    hdr: usize,
    seq: u32,
    payload: usize,
    psh: bool,
}

/// A TCP/IPv4 segment that may start or join a merge: no IP options, not a fragment,
/// lengths consistent, flags ACK or ACK+PSH only, some payload.
fn parse(p: &[u8]) -> Option<Seg> {
    if p.len() < 40 || p[0] != 0x45 || p[9] != 6 {
        return None;
    }
    if usize::from(u16::from_be_bytes([p[2], p[3]])) != p.len() {
        return None;
    }
    // More-fragments flag or a fragment offset.
    if u16::from_be_bytes([p[6], p[7]]) & 0x3fff != 0 {
        return None;
    }
    let t = &p[20..];
    let doff = usize::from(t[12] >> 4) * 4;
    if doff < 20 || t.len() < doff {
        return None;
    }
    let flags = t[13];
    if flags & !TCP_PSH != TCP_ACK {
        return None;
    }
    let payload = t.len() - doff;
    if payload == 0 {
        return None;
    }
    Some(Seg {
        hdr: 20 + doff,
        seq: u32::from_be_bytes([t[4], t[5], t[6], t[7]]),
        payload,
        psh: flags & TCP_PSH != 0,
    })
}

/// Whether `b` continues the flow of `a` with the same headers (except the IPv4 id,
/// length and checksum, the TCP sequence number, checksum and PSH).
fn same_headers(a: &[u8], b: &[u8], hdr: usize) -> bool {
    let ip_same = a[0..2] == b[0..2] && a[6..10] == b[6..10] && a[12..20] == b[12..20];
    let (ta, tb) = (&a[20..hdr], &b[20..hdr]);
    ip_same
        && ta[0..4] == tb[0..4]
        && ta[8..13] == tb[8..13]
        && ta[13] & !TCP_PSH == tb[13] & !TCP_PSH
        && ta[14..16] == tb[14..16]
        && ta[18..] == tb[18..]
}

/// How many packets from the start of `pkts` merge into one frame (at least 1 when
/// `pkts` is not empty).
pub fn run_len<P: AsRef<[u8]>>(pkts: &[P]) -> usize {
    let Some(first) = pkts.first() else { return 0 };
    let a = first.as_ref();
    let Some(s) = parse(a) else { return 1 };
    if s.psh {
        return 1;
    }
    let mut n = 1;
    let mut next = s.seq.wrapping_add(s.payload as u32);
    let mut total = a.len();
    while n < pkts.len() && n < MAX_SEGMENTS {
        let b = pkts[n].as_ref();
        let Some(t) = parse(b) else { break };
        if t.hdr != s.hdr
            || t.seq != next
            || t.payload > s.payload
            || total + t.payload > IP_LIMIT
            || !same_headers(a, b, s.hdr)
        {
            break;
        }
        n += 1;
        total += t.payload;
        next = next.wrapping_add(t.payload as u32);
        if t.payload < s.payload || t.psh {
            break;
        }
    }
    n
}

/// One's-complement sum of `data` (big-endian 16-bit words) added to `sum`.
fn sum16(mut sum: u32, data: &[u8]) -> u32 {
    let mut c = data.chunks_exact(2);
    for w in &mut c {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [b] = c.remainder() {
        sum += u32::from(*b) << 8;
    }
    sum
}

fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Build the frame for `pkts` (a run from [`run_len`]) into `frame`: the virtio-net
/// header, then the packet (merged if there are several).
pub fn build<P: AsRef<[u8]>>(pkts: &[P], frame: &mut Vec<u8>) {
    frame.clear();
    frame.resize(VNET_HDR_LEN, 0);
    let Some(first) = pkts.first() else { return };
    let a = first.as_ref();
    if pkts.len() == 1 {
        frame.extend_from_slice(a);
        return;
    }
    let Some(s) = parse(a) else {
        // Not reachable through run_len; send the first packet alone rather than panic.
        frame.extend_from_slice(a);
        return;
    };
    frame.extend_from_slice(a);
    let mut psh = false;
    for p in &pkts[1..] {
        let p = p.as_ref();
        frame.extend_from_slice(&p[s.hdr..]);
        psh |= p[33] & TCP_PSH != 0;
    }
    let ip = VNET_HDR_LEN;
    let total = frame.len() - ip;
    frame[ip + 2..ip + 4].copy_from_slice(&(total as u16).to_be_bytes());
    frame[ip + 10..ip + 12].copy_from_slice(&[0, 0]);
    let ck = !fold(sum16(0, &frame[ip..ip + 20]));
    frame[ip + 10..ip + 12].copy_from_slice(&ck.to_be_bytes());
    if psh {
        frame[ip + 33] |= TCP_PSH;
    }
    // Pseudo-header sum (not complemented) in the TCP checksum field: the kernel
    // finishes it (NEEDS_CSUM) if the packet leaves again, per segment.
    let tcp_len = (total - 20) as u32;
    let mut ph = sum16(0, &frame[ip + 12..ip + 20]);
    ph += 6 + tcp_len;
    frame[ip + 36..ip + 38].copy_from_slice(&fold(ph).to_be_bytes());
    let h = &mut frame[..VNET_HDR_LEN];
    h[0] = F_NEEDS_CSUM;
    h[1] = GSO_TCPV4;
    h[2..4].copy_from_slice(&(s.hdr as u16).to_le_bytes());
    h[4..6].copy_from_slice(&(s.payload as u16).to_le_bytes());
    h[6..8].copy_from_slice(&20u16.to_le_bytes());
    h[8..10].copy_from_slice(&16u16.to_le_bytes());
}

/// A packet read with its virtio-net header: the packet's range in `frame`, with its
/// checksum completed if the kernel left it partial (`NEEDS_CSUM`); `None` for a
/// frame that is not one whole packet (GSO, or too short).
pub fn finish_read(frame: &mut [u8]) -> Option<std::ops::Range<usize>> {
    if frame.len() <= VNET_HDR_LEN || frame[1] != 0 {
        return None;
    }
    if frame[0] & F_NEEDS_CSUM != 0 {
        let start = usize::from(u16::from_le_bytes([frame[6], frame[7]]));
        let off = usize::from(u16::from_le_bytes([frame[8], frame[9]]));
        let p = &mut frame[VNET_HDR_LEN..];
        if start + off + 2 > p.len() {
            return None;
        }
        // The field holds the pseudo-header sum; sum the rest over it.
        let ck = !fold(sum16(0, &p[start..]));
        p[start + off..start + off + 2].copy_from_slice(&ck.to_be_bytes());
    }
    Some(VNET_HDR_LEN..frame.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TCP/IPv4 segment 10.0.0.1:1000 -> 10.0.0.2:2000 with valid checksums.
    fn seg(seq: u32, payload: &[u8], flags: u8, id: u16) -> Vec<u8> {
        let total = 20 + 32 + payload.len();
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[4..6].copy_from_slice(&id.to_be_bytes());
        p[6] = 0x40; // DF
        p[8] = 64;
        p[9] = 6;
        p[12..16].copy_from_slice(&[10, 0, 0, 1]);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        let ck = !fold(sum16(0, &p[..20]));
        p[10..12].copy_from_slice(&ck.to_be_bytes());
        let t = &mut p[20..];
        t[0..2].copy_from_slice(&1000u16.to_be_bytes());
        t[2..4].copy_from_slice(&2000u16.to_be_bytes());
        t[4..8].copy_from_slice(&seq.to_be_bytes());
        t[8..12].copy_from_slice(&77u32.to_be_bytes());
        t[12] = 8 << 4;
        t[13] = flags;
        t[14..16].copy_from_slice(&512u16.to_be_bytes());
        // Timestamp option (NOP NOP TS).
        t[20..24].copy_from_slice(&[1, 1, 8, 10]);
        t[24..28].copy_from_slice(&5u32.to_be_bytes());
        t[32..].copy_from_slice(payload);
        let ck = tcp_check(&p);
        p[36..38].copy_from_slice(&ck.to_be_bytes());
        p
    }

    fn tcp_check(p: &[u8]) -> u16 {
        let mut s = sum16(0, &p[12..20]);
        s += 6 + (p.len() - 20) as u32;
        let mut q = p[20..].to_vec();
        q[16] = 0;
        q[17] = 0;
        !fold(sum16(s, &q))
    }

    #[test]
    fn a_train_of_segments_merges_into_one_valid_gso_frame() {
        let pkts: Vec<Vec<u8>> = (0..4u32)
            .map(|i| {
                let len = if i == 3 { 50 } else { 100 };
                let flags = if i == 3 { TCP_ACK | TCP_PSH } else { TCP_ACK };
                seg(1000 + i * 100, &vec![i as u8; len], flags, i as u16)
            })
            .collect();
        assert_eq!(run_len(&pkts), 4);
        let mut f = Vec::new();
        build(&pkts, &mut f);
        assert_eq!(f[0], F_NEEDS_CSUM);
        assert_eq!(f[1], GSO_TCPV4);
        assert_eq!(u16::from_le_bytes([f[2], f[3]]), 52);
        assert_eq!(u16::from_le_bytes([f[4], f[5]]), 100);
        let p = &f[VNET_HDR_LEN..];
        assert_eq!(p.len(), 52 + 350);
        assert_eq!(usize::from(u16::from_be_bytes([p[2], p[3]])), p.len());
        assert_eq!(fold(sum16(0, &p[..20])), 0xffff, "IPv4 header checksum");
        assert_eq!(p[33], TCP_ACK | TCP_PSH);
        // Completing the partial checksum gives the checksum of the merged segment.
        let mut done = f.clone();
        done[1] = 0;
        let n = done.len();
        assert_eq!(finish_read(&mut done), Some(VNET_HDR_LEN..n));
        let q = &done[VNET_HDR_LEN..];
        assert_eq!(u16::from_be_bytes([q[36], q[37]]), tcp_check(q));
        assert_eq!(&q[52..152], &[0u8; 100][..]);
        assert_eq!(&q[352..], &[3u8; 50][..]);
    }

    #[test]
    fn gaps_other_flows_flags_and_odd_packets_stop_a_run() {
        let a = seg(1000, &[1; 100], TCP_ACK, 1);
        // A gap in sequence numbers.
        assert_eq!(run_len(&[a.clone(), seg(1200, &[1; 100], TCP_ACK, 2)]), 1);
        // Another ack number.
        let mut b = seg(1100, &[1; 100], TCP_ACK, 2);
        b[28] ^= 1;
        assert_eq!(run_len(&[a.clone(), b]), 1);
        // A larger segment after the first.
        assert_eq!(run_len(&[a.clone(), seg(1100, &[1; 200], TCP_ACK, 2)]), 1);
        // FIN, SYN, pure ACKs and PSH on the first do not merge.
        assert_eq!(
            run_len(&[
                seg(1000, &[1; 100], TCP_ACK | 1, 1),
                seg(1100, &[1; 100], TCP_ACK, 2)
            ]),
            1
        );
        assert_eq!(
            run_len(&[seg(1000, &[], TCP_ACK, 1), seg(1000, &[], TCP_ACK, 2)]),
            1
        );
        assert_eq!(
            run_len(&[
                seg(1000, &[1; 100], TCP_ACK | TCP_PSH, 1),
                seg(1100, &[1; 100], TCP_ACK, 2)
            ]),
            1
        );
        // A shorter segment ends the run.
        let c = seg(1100, &[1; 50], TCP_ACK, 2);
        let d = seg(1150, &[1; 100], TCP_ACK, 3);
        assert_eq!(run_len(&[a.clone(), c, d]), 2);
        // Not IPv4/TCP, truncated, wrong lengths: alone, no panic.
        for bad in [vec![0x60; 60], vec![0x45; 10], a[..50].to_vec(), vec![]] {
            assert!(run_len(&[bad.clone(), a.clone()]) <= 1);
            let mut f = Vec::new();
            build(std::slice::from_ref(&bad), &mut f);
            assert_eq!(&f[VNET_HDR_LEN..], &bad[..]);
        }
        let mut f = Vec::new();
        build(std::slice::from_ref(&a), &mut f);
        assert_eq!(&f[..VNET_HDR_LEN], &[0; VNET_HDR_LEN]);
    }

    #[test]
    fn reads_with_gso_or_short_frames_are_refused() {
        assert!(finish_read(&mut [0u8; 5]).is_none());
        let mut f = vec![0u8; 40];
        f[1] = GSO_TCPV4;
        assert!(finish_read(&mut f).is_none());
        let mut f = vec![0u8; 40];
        f[0] = F_NEEDS_CSUM;
        f[6] = 200;
        assert!(finish_read(&mut f).is_none());
    }

    /// A TCP/IPv6 segment fd00::1 -> fd00::2 carrying `payload`, sequence `seq`.
    fn seg6(seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; 40 + 20 + payload.len()];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&((20 + payload.len()) as u16).to_be_bytes());
        p[6] = 6;
        p[7] = 64;
        p[8] = 0xfd;
        p[23] = 1;
        p[24] = 0xfd;
        p[39] = 2;
        let t = &mut p[40..];
        t[4..8].copy_from_slice(&seq.to_be_bytes());
        t[12] = 5 << 4;
        t[13] = TCP_ACK;
        t[20..].copy_from_slice(payload);
        p
    }

    #[test]
    fn ipv6_packets_go_to_the_device_one_per_frame_unchanged() {
        // The tunnel carries IPv6: not merged (only TCP/IPv4 is), written whole with
        // an all-zero header, and read back (with a checksum to finish) whatever the
        // family.
        let pkts: Vec<Vec<u8>> = (0..4).map(|i| seg6(1 + i * 1000, &[7; 1000])).collect();
        assert_eq!(run_len(&pkts), 1);
        let mut f = Vec::new();
        build(&pkts[..1], &mut f);
        assert_eq!(&f[..VNET_HDR_LEN], &[0; VNET_HDR_LEN]);
        assert_eq!(&f[VNET_HDR_LEN..], &pkts[0][..]);
        let mut frame = vec![0u8; VNET_HDR_LEN];
        frame.extend_from_slice(&pkts[1]);
        frame[0] = F_NEEDS_CSUM;
        frame[6..8].copy_from_slice(&40u16.to_le_bytes());
        frame[8..10].copy_from_slice(&16u16.to_le_bytes());
        let r = finish_read(&mut frame).unwrap();
        let p = &frame[r];
        assert_eq!(p.len(), pkts[1].len());
        // The TCP checksum field now makes the segment sum to zero (from where the
        // kernel left the pseudo-header sum, here zero).
        assert_eq!(fold(sum16(0, &p[40..])), 0xffff);
    }
}
