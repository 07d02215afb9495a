//! TCP MSS clamping (issue 30, path MTU): a TCP SYN that enters the tunnel announces
//! at most the segment size that fits the bond's largest inner packet, so that hosts
//! behind the tunnel with a larger link MTU (a router's LAN) never send segments the
//! bond cannot carry. The locally originated connections already take their MSS from
//! the TUN device's MTU; this covers forwarded ones, as `iptables ... TCPMSS
//! --clamp-mss-to-pmtu` would.

const TCP: u8 = 6;
const SYN: u8 = 0x02;
const OPT_END: u8 = 0;
const OPT_NOP: u8 = 1;
const OPT_MSS: u8 = 2;

/// If `pkt` is a TCP SYN (IPv4 without fragmentation, or IPv6 with TCP as the next
/// header) whose MSS option is larger than fits an `mtu`-byte packet, lower it and
/// fix the TCP checksum (incrementally, RFC 1624). Returns whether it changed.
/// Anything else, or anything malformed, is left alone.
pub fn clamp(pkt: &mut [u8], mtu: usize) -> bool {
    let Some((tcp_at, ip_hdr)) = tcp_offset(pkt) else {
        return false;
    };
    let Some(tcp) = pkt.get_mut(tcp_at..) else {
        return false;
    };
    let Some(doff) = syn_header_len(tcp) else {
        return false;
    };
    let Some(fits) = mtu.checked_sub(ip_hdr + 20) else {
        return false;
    };
    let fits = fits.min(usize::from(u16::MAX)) as u16;
    let Some(i) = find_mss(tcp, doff) else {
        return false;
    };
    let old = u16::from_be_bytes([tcp[i + 2], tcp[i + 3]]);
    if old <= fits {
        return false;
    }
    set_mss(tcp, i, old, fits);
    true
}

/// Where the TCP header of `pkt` starts, and the size of the fixed IP header the MSS
/// must leave room for: `None` unless `pkt` is TCP over IPv4 (not a fragment) or over
/// IPv6 (TCP as the next header).
fn tcp_offset(pkt: &[u8]) -> Option<(usize, usize)> {
    match pkt.first().map(|b| b >> 4) {
        Some(4) if pkt.len() >= 20 => {
            let ihl = usize::from(pkt[0] & 0x0f) * 4;
            let fragment = u16::from_be_bytes([pkt[6], pkt[7]]) & 0x1fff != 0;
            if pkt[9] != TCP || ihl < 20 || fragment {
                return None;
            }
            Some((ihl, 20))
        }
        Some(6) if pkt.len() >= 40 => {
            if pkt[6] != TCP {
                return None;
            }
            Some((40, 40))
        }
        _ => None,
    }
}

/// The length of the TCP header `tcp` (its data offset) if it is a SYN with a sane
/// data offset, else `None`.
fn syn_header_len(tcp: &[u8]) -> Option<usize> {
    if tcp.len() < 20 || tcp[13] & SYN == 0 {
        return None;
    }
    let doff = usize::from(tcp[12] >> 4) * 4;
    if doff < 20 || doff > tcp.len() {
        return None;
    }
    Some(doff)
}

/// Where the 4-byte MSS option starts among the options of the `doff`-byte TCP header
/// `tcp`; `None` if there is none before the end of the options or a malformed one.
fn find_mss(tcp: &[u8], doff: usize) -> Option<usize> {
    let mut i = 20;
    while i < doff {
        match tcp[i] {
            OPT_END => break,
            OPT_NOP => i += 1,
            kind => {
                let Some(&len) = tcp.get(i + 1) else { break };
                let len = usize::from(len);
                if len < 2 || i + len > doff {
                    break;
                }
                if kind == OPT_MSS && len == 4 {
                    return Some(i);
                }
                i += len;
            }
        }
    }
    None
}

/// Write `fits` over the MSS `old` of the option at `i` of the TCP header `tcp`, and
/// fix the TCP checksum incrementally (RFC 1624).
fn set_mss(tcp: &mut [u8], i: usize, old: u16, fits: u16) {
    tcp[i + 2..i + 4].copy_from_slice(&fits.to_be_bytes());
    // The option's word starts at an even offset only if `i` is even;
    // the checksum sums 16-bit words from the header's start.
    let (o, n) = if i.is_multiple_of(2) {
        (old, fits)
    } else {
        (old.rotate_left(8), fits.rotate_left(8))
    };
    let ck = u16::from_be_bytes([tcp[16], tcp[17]]);
    // HC' = ~(~HC + ~m + m'), one's complement.
    let mut sum = u32::from(!ck) + u32::from(!o) + u32::from(n);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    tcp[16..18].copy_from_slice(&(!(sum as u16)).to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum16(data: &[u8]) -> u32 {
        data.chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
            .sum()
    }

    fn fold(mut s: u32) -> u16 {
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        s as u16
    }

    /// The TCP checksum over the pseudo-header verifies.
    fn tcp_ok(p: &[u8]) -> bool {
        let (pseudo, tcp) = if p[0] >> 4 == 4 {
            let mut ph = p[12..20].to_vec();
            ph.extend_from_slice(&[0, TCP]);
            ph.extend_from_slice(&((p.len() - 20) as u16).to_be_bytes());
            (ph, &p[20..])
        } else {
            let mut ph = p[8..40].to_vec();
            ph.extend_from_slice(&((p.len() - 40) as u32).to_be_bytes());
            ph.extend_from_slice(&[0, 0, 0, TCP]);
            (ph, &p[40..])
        };
        fold(sum16(&pseudo) + sum16(tcp)) == 0xffff
    }

    /// A SYN with `opts` (padded to 4 bytes), IPv4 or IPv6, with a valid checksum.
    fn syn(v6: bool, flags: u8, opts: &[u8]) -> Vec<u8> {
        let mut o = opts.to_vec();
        while !o.len().is_multiple_of(4) {
            o.push(OPT_END);
        }
        let tcp_len = 20 + o.len();
        let mut p = if v6 {
            let mut p = vec![0u8; 40];
            p[0] = 0x60;
            p[4..6].copy_from_slice(&(tcp_len as u16).to_be_bytes());
            p[6] = TCP;
            p[7] = 64;
            p[8] = 0xfd;
            p[23] = 1;
            p[24] = 0xfd;
            p[39] = 2;
            p
        } else {
            let mut p = vec![0u8; 20];
            p[0] = 0x45;
            p[2..4].copy_from_slice(&((20 + tcp_len) as u16).to_be_bytes());
            p[6] = 0x40;
            p[8] = 64;
            p[9] = TCP;
            p[12..16].copy_from_slice(&[10, 0, 0, 1]);
            p[16..20].copy_from_slice(&[10, 0, 0, 2]);
            p
        };
        let mut t = vec![0u8; 20];
        t[0..2].copy_from_slice(&40000u16.to_be_bytes());
        t[2..4].copy_from_slice(&443u16.to_be_bytes());
        t[4..8].copy_from_slice(&12345u32.to_be_bytes());
        t[12] = ((tcp_len / 4) as u8) << 4;
        t[13] = flags;
        t[14..16].copy_from_slice(&64240u16.to_be_bytes());
        t.extend_from_slice(&o);
        p.extend_from_slice(&t);
        let at = p.len() - tcp_len;
        let ck = !fold({
            let mut q = p.clone();
            q[at + 16] = 0;
            q[at + 17] = 0;
            // Sum with a zero checksum field.
            let (pseudo, tcp) = if v6 {
                let mut ph = q[8..40].to_vec();
                ph.extend_from_slice(&(tcp_len as u32).to_be_bytes());
                ph.extend_from_slice(&[0, 0, 0, TCP]);
                (ph, q[40..].to_vec())
            } else {
                let mut ph = q[12..20].to_vec();
                ph.extend_from_slice(&[0, TCP]);
                ph.extend_from_slice(&(tcp_len as u16).to_be_bytes());
                (ph, q[20..].to_vec())
            };
            sum16(&pseudo) + sum16(&tcp)
        });
        p[at + 16..at + 18].copy_from_slice(&ck.to_be_bytes());
        assert!(tcp_ok(&p));
        p
    }

    fn mss_of(p: &[u8]) -> Option<u16> {
        let at = if p[0] >> 4 == 4 { 20 } else { 40 };
        let t = &p[at..];
        let doff = usize::from(t[12] >> 4) * 4;
        let mut i = 20;
        while i < doff {
            match t[i] {
                OPT_END => return None,
                OPT_NOP => i += 1,
                OPT_MSS => return Some(u16::from_be_bytes([t[i + 2], t[i + 3]])),
                _ => i += usize::from(t[i + 1]),
            }
        }
        None
    }

    const MSS_1460: [u8; 4] = [OPT_MSS, 4, 0x05, 0xb4];

    #[test]
    fn a_syn_of_either_family_gets_the_mss_that_fits_with_a_valid_checksum() {
        for v6 in [false, true] {
            for flags in [SYN, SYN | 0x10] {
                // MSS first, and after an odd number of NOPs (an odd offset).
                let mut odd = vec![OPT_NOP];
                odd.extend_from_slice(&MSS_1460);
                odd.extend_from_slice(&[4, 2]); // SACK permitted
                for opts in [MSS_1460.to_vec(), odd] {
                    let mut p = syn(v6, flags, &opts);
                    assert!(clamp(&mut p, 1400), "v6 {v6} {opts:?}");
                    let want = if v6 { 1400 - 60 } else { 1400 - 40 };
                    assert_eq!(mss_of(&p), Some(want));
                    assert!(tcp_ok(&p), "checksum after clamping, v6 {v6} {opts:?}");
                }
            }
        }
    }

    #[test]
    fn what_fits_already_or_is_no_syn_or_no_tcp_is_left_alone() {
        let mut p = syn(false, SYN, &MSS_1460);
        let before = p.clone();
        assert!(!clamp(&mut p, 1500));
        assert_eq!(p, before);
        let mut p = syn(false, 0x10, &MSS_1460);
        assert!(!clamp(&mut p, 1000));
        let mut p = syn(true, SYN, &[OPT_NOP, OPT_NOP, 4, 2]);
        assert!(!clamp(&mut p, 1000));
        let mut p = syn(false, SYN, &MSS_1460);
        p[9] = 17;
        assert!(!clamp(&mut p, 1000));
        // Truncated or junk: no panic, no change.
        for n in 0..p.len() {
            let mut q = syn(true, SYN, &MSS_1460)[..n.min(60)].to_vec();
            let _ = clamp(&mut q, 1000);
        }
        let mut bad = syn(false, SYN, &[OPT_MSS, 0, 0, 0]);
        assert!(!clamp(&mut bad, 1000));
        assert!(!clamp(&mut [0x45u8; 3], 1000));
        assert!(!clamp(&mut syn(false, SYN, &MSS_1460), 30));
    }
}
