//! Flow datagrams: one inner packet of a real-time flow (policy `redundant` or
//! `lowest-delay`, [`crate::session::flows`]), carried outside the stripe as session
//! message kind 9 (first byte `0xB4`), so it is sealed and replay-checked like every
//! session message and never waits behind the bulk flow's resequencing.
//!
//! ```text
//!  0        1        2        3
//! +--------+--------+--------+--------+
//! |  0xB4  |version |   9    | channel|   channel: the physical channel it was sealed for
//! +--------+--------+--------+--------+
//! | policy |   0    |  domain (u16)   |   policy: 1 redundant, 2 lowest-delay;
//! +--------+--------+--------+--------+   domain: 0 arrival order, 1..: an ordered domain
//! |          sequence (u64)           |   8..16: per direction and domain, from 0, +1 per
//! |                                   |          packet (every copy of a packet has the same)
//! +--------+--------+--------+--------+
//! |  the inner packet (at least 1 byte) ...   16..
//! ```
//!
//! **Domain 0** numbers one sender's flow datagrams of every real-time flow in one space;
//! the receiver delivers a number the first time it arrives and drops every later copy
//! (a window of [`crate::session::flows::WINDOW`] numbers below the highest seen), in
//! arrival order: calls and live video, whose late packets are worth less than a wait.
//! **Domains 1 and up** are per-flow reorder domains: each numbers its own packets from
//! 0, and the receiver delivers them in that order, holding a packet that overtook a
//! missing one until it comes or a wait runs out (`crate::session::flows::Reorder`).
//! The sender puts a TCP flow's segments there (a flow to a domain by a hash of its
//! addresses and ports), so a small TCP flow taken out of the stripe keeps its order
//! and waits for no other flow. Another version, a policy other than 1 or 2, a
//! non-zero byte 5 and an empty packet are malformed.

use super::session::{CtrlError, VERSION};
use super::TYPE_SESSION;

/// Kind byte of a flow datagram (after the session messages' kinds 1 to 8).
pub const KIND_FLOW: u8 = 9;
/// Bytes in front of the inner packet.
pub const HEADER_LEN: usize = 16;
/// Policy byte of a redundant flow's datagram.
pub const POLICY_REDUNDANT: u8 = 1;
/// Policy byte of a lowest-delay flow's datagram.
pub const POLICY_LOWEST_DELAY: u8 = 2;

/// The header of a flow datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The channel it was sealed for.
    pub channel: u8,
    /// [`POLICY_REDUNDANT`] or [`POLICY_LOWEST_DELAY`].
    pub policy: u8,
    /// The reorder domain (0: arrival order; 1 and up: one flow's, delivered in order).
    pub domain: u16,
    /// The packet's number.
    pub seq: u64,
}

/// Is `b` (an opened datagram's contents) a flow datagram? (Its first and third
/// bytes; [`Header::parse`] checks the rest.)
pub fn is_flow(b: &[u8]) -> bool {
    b.first() == Some(&TYPE_SESSION) && b.get(2) == Some(&KIND_FLOW)
}

impl Header {
    /// The header's bytes.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0] = TYPE_SESSION;
        h[1] = VERSION;
        h[2] = KIND_FLOW;
        h[3] = self.channel;
        h[4] = self.policy;
        h[6..8].copy_from_slice(&self.domain.to_be_bytes());
        h[8..16].copy_from_slice(&self.seq.to_be_bytes());
        h
    }

    /// The header of a whole flow datagram `b` (the packet is `b[HEADER_LEN..]`).
    pub fn parse(b: &[u8]) -> Result<Header, CtrlError> {
        if b.len() <= HEADER_LEN {
            return Err(CtrlError::Length);
        }
        if b[0] != TYPE_SESSION || b[1] != VERSION || b[2] != KIND_FLOW {
            return Err(CtrlError::Unknown);
        }
        let policy = b[4];
        let domain = u16::from_be_bytes([b[6], b[7]]);
        if !matches!(policy, POLICY_REDUNDANT | POLICY_LOWEST_DELAY) || b[5] != 0 {
            return Err(CtrlError::Invalid);
        }
        let mut s = [0u8; 8];
        s.copy_from_slice(&b[8..16]);
        Ok(Header {
            channel: b[3],
            policy,
            domain,
            seq: u64::from_be_bytes(s),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_vector() {
        let h = Header {
            channel: 2,
            policy: POLICY_REDUNDANT,
            domain: 0,
            seq: 0x0102_0304_0506_0708,
        };
        let mut b = h.to_bytes().to_vec();
        assert_eq!(
            b,
            [0xB4, 1, 9, 2, 1, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
            "the bytes are the wire format"
        );
        b.extend_from_slice(&[0x45, 0, 0, 20]);
        assert!(is_flow(&b));
        assert_eq!(Header::parse(&b), Ok(h));

        // An ordered domain: bytes 6..8, big-endian.
        let h = Header {
            channel: 0,
            policy: POLICY_LOWEST_DELAY,
            domain: 0x0a0b,
            seq: 3,
        };
        let mut b = h.to_bytes().to_vec();
        assert_eq!(b, [0xB4, 1, 9, 0, 2, 0, 0x0a, 0x0b, 0, 0, 0, 0, 0, 0, 0, 3]);
        b.push(0x45);
        assert_eq!(Header::parse(&b), Ok(h));
    }

    #[test]
    fn malformed_flow_datagrams() {
        let good = {
            let mut b = Header {
                channel: 0,
                policy: POLICY_LOWEST_DELAY,
                domain: 0,
                seq: 7,
            }
            .to_bytes()
            .to_vec();
            b.push(0x45);
            b
        };
        assert!(Header::parse(&good).is_ok());
        // No packet behind the header.
        assert_eq!(Header::parse(&good[..HEADER_LEN]), Err(CtrlError::Length));
        for (at, v, e) in [
            (1, 2, CtrlError::Unknown), // version
            (2, 8, CtrlError::Unknown), // kind
            (4, 0, CtrlError::Invalid), // policy bond: never sent this way
            (4, 3, CtrlError::Invalid), // unknown policy
            (5, 1, CtrlError::Invalid), // reserved byte
        ] {
            let mut b = good.clone();
            b[at] = v;
            assert_eq!(Header::parse(&b), Err(e), "byte {at} = {v}");
        }
        for n in 0..HEADER_LEN {
            assert!(Header::parse(&good[..n]).is_err());
        }
    }
}
