//! Every packet format braid puts on a channel.
//!
//! Each format has a zero-copy view `Packet<T: AsRef<[u8]>>` whose constructor
//! `new_checked` validates the length (after it, no accessor can panic) and a validated
//! representation `Repr` with `parse`, `buffer_len` and `emit`, in the style of smoltcp.
//!
//! # The codepoint rule
//!
//! In `logical` and `trr` modes data packets travel without any header, so control
//! packets need a first byte that data cannot have. Tunnel data are raw IP packets, whose
//! first nibble is the IP version (4 or 6). braid's control packets use first bytes with
//! the high nibble `0xB`, which no IP packet can start with:
//!
//! | first byte | meaning |
//! |---|---|
//! | `0x4_`, `0x6_`, anything else not `0xB_` | header-free data |
//! | `0xB0` | overlay control (ALCP): UPDATE, PROVISION, TEARDOWN, seed 003 ([`overlay`]) |
//! | `0xB1` | marker ([`marker`]) |
//! | `0xB2` | TRR trigger ([`trigger`]) |
//! | `0xB3` | data with a sequence header ([`seq`]) |
//! | `0xB4` | session messages: hello, epoch end, epoch ack, feedback, resend, probe, probe report ([`session`]); flow datagrams, kind 9 ([`flow`]) |
//! | `0xB5` | NAK: sequence numbers to repair ([`nak`]) |
//! | `0xB6` | a repaired (retransmitted) data packet, sequence header ([`seq`]) |
//! | `0xB7` | credit and credit check, seed 004 ([`credit`]) |
//! | `0xB8` | sealed datagram, encrypted ([`secure`]) |
//! | `0xB9` | sealed datagram, authenticated, body in clear ([`secure`]) |
//! | `0xBA` | handshake initiation ([`secure`]) |
//! | `0xBB` | handshake response ([`secure`]) |
//! | `0xBC` | error control: data, keep-alive, end of stream ([`errctl`]) |
//! | `0xBD` | error control: SNAK, packets to send again ([`errctl`]) |
//! | `0xBE` | error control: PACK, segments accepted ([`errctl`]) |
//! | `0xBF` | escaped data: one byte to strip, then data that itself starts with `0xB_` |
//! | other `0xB_` | reserved: counted as malformed |
//!
//! The overlay (ALCP) messages travel between overlay nodes, never on a striped
//! channel, so [`classify`] reports `0xB0` as reserved too.
//!
//! The error-control types travel end to end between [`crate::errctl`] endpoints, not
//! through the resequencer: [`classify`] reports them as reserved.
//!
//! Arbitrary application messages (not IP) that happen to start with `0xB_` are sent
//! with the one-byte `0xBF` escape, so any byte string can be striped.

pub mod credit;
pub mod errctl;
pub mod flow;
pub mod marker;
pub mod nak;
pub mod overlay;
pub mod secure;
pub mod seq;
pub mod session;
pub mod stream;
pub mod trigger;

/// Wire version spoken by this implementation (markers and triggers carry it).
pub const VERSION: u8 = 1;

// The packet type registry: every first byte `0xB0..=0xBF` braid gives a meaning, here
// and nowhere else (the table above says what each one is).

/// High nibble shared by all control codepoints.
pub const CONTROL_NIBBLE: u8 = 0xB;
/// First byte of an overlay control message (ALCP: UPDATE, PROVISION, TEARDOWN;
/// [`overlay`], seed 003).
pub const TYPE_OVERLAY: u8 = 0xB0;
/// First byte of a marker ([`marker`]).
pub const TYPE_MARKER: u8 = 0xB1;
/// First byte of a TRR trigger ([`trigger`]).
pub const TYPE_TRIGGER: u8 = 0xB2;
/// First byte of a data packet behind a sequence header ([`seq`]).
pub const TYPE_SEQ_DATA: u8 = 0xB3;
/// First byte of a session message (hello, epoch end, epoch ack; [`session`]).
pub const TYPE_SESSION: u8 = 0xB4;
/// First byte of a NAK ([`nak`]).
pub const TYPE_NAK: u8 = 0xB5;
/// First byte of a repaired (retransmitted) data packet behind a sequence header
/// ([`seq`]).
pub const TYPE_REPAIR: u8 = 0xB6;
/// First byte of a sealed, encrypted datagram ([`secure`]).
pub const TYPE_SEALED: u8 = 0xB8;
/// First byte of a sealed datagram whose body is in clear ([`secure`]).
pub const TYPE_SIGNED: u8 = 0xB9;
/// First byte of a handshake initiation ([`secure`]).
pub const TYPE_HS_INIT: u8 = 0xBA;
/// First byte of a handshake response ([`secure`]).
pub const TYPE_HS_RESP: u8 = 0xBB;
/// First byte of a credit or credit check ([`credit`], seed 004).
pub const TYPE_CREDIT: u8 = 0xB7;
/// First byte of an error-control data, keep-alive or end-of-stream packet
/// ([`errctl`]).
pub const TYPE_ERRCTL_DATA: u8 = 0xBC;
/// First byte of an error-control SNAK ([`errctl`]).
pub const TYPE_SNAK: u8 = 0xBD;
/// First byte of an error-control PACK ([`errctl`]).
pub const TYPE_PACK: u8 = 0xBE;
/// First byte of escaped data: strip it, the rest is data starting with `0xB_`.
pub const TYPE_ESCAPE: u8 = 0xBF;

/// True if a datagram with this first byte is a control packet that must never travel
/// bare, whatever the security mode (the session seals it): markers, triggers, session
/// messages, NAKs and credits. Data in every form (header-free, escaped, behind a sequence header,
/// repaired) is not, and neither are reserved codepoints.
#[inline]
pub fn is_authenticated_control(first: u8) -> bool {
    matches!(
        first,
        TYPE_MARKER | TYPE_TRIGGER | TYPE_SESSION | TYPE_NAK | TYPE_CREDIT
    )
}

/// Why a byte string could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Shorter than the format's fixed part (or empty).
    #[error("packet truncated")]
    Truncated,
    /// Longer than the format allows.
    #[error("trailing bytes after packet")]
    Trailing,
    /// A version this implementation does not speak.
    #[error("unsupported version {0}")]
    Version(u8),
    /// A reserved codepoint or flag.
    #[error("reserved codepoint or flag 0x{0:02x}")]
    Reserved(u8),
    /// A field holds an impossible value.
    #[error("invalid field value")]
    Invalid,
}

/// What the first byte says a datagram is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Header-free data: the whole datagram is the payload.
    Data,
    /// Escaped data: the payload starts after one byte.
    Escaped,
    /// A marker.
    Marker,
    /// A trigger.
    Trigger,
    /// Data behind a sequence header.
    SeqData,
    /// A NAK (handled by the sender side, not the resequencer).
    Nak,
    /// A repaired data packet behind a sequence header.
    Repair,
}

/// Classify a datagram by its first byte.
#[inline]
pub fn classify(bytes: &[u8]) -> Result<Kind, WireError> {
    let Some(&b) = bytes.first() else {
        return Err(WireError::Truncated);
    };
    if b >> 4 != CONTROL_NIBBLE {
        return Ok(Kind::Data);
    }
    match b {
        TYPE_MARKER => Ok(Kind::Marker),
        TYPE_TRIGGER => Ok(Kind::Trigger),
        TYPE_SEQ_DATA => Ok(Kind::SeqData),
        TYPE_NAK => Ok(Kind::Nak),
        TYPE_REPAIR => Ok(Kind::Repair),
        TYPE_ESCAPE => {
            if bytes.len() < 2 {
                Err(WireError::Truncated)
            } else {
                Ok(Kind::Escaped)
            }
        }
        other => Err(WireError::Reserved(other)),
    }
}

/// True if `payload` must be escaped to travel header-free (it starts with `0xB_`).
#[inline]
pub fn needs_escape(payload: &[u8]) -> bool {
    payload.first().is_some_and(|b| b >> 4 == CONTROL_NIBBLE)
}

pub(crate) fn read_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(crate) fn read_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_packets_are_data() {
        assert_eq!(classify(&[0x45, 0, 0, 20]), Ok(Kind::Data));
        assert_eq!(classify(&[0x60, 0, 0, 0]), Ok(Kind::Data));
        assert!(!needs_escape(&[0x45]));
        assert!(needs_escape(&[0xB1]));
    }

    #[test]
    fn control_codepoints() {
        assert_eq!(classify(&[0xB1]), Ok(Kind::Marker));
        assert_eq!(classify(&[0xB2]), Ok(Kind::Trigger));
        assert_eq!(classify(&[0xB3]), Ok(Kind::SeqData));
        assert_eq!(classify(&[0xBF, 0xB1]), Ok(Kind::Escaped));
        assert_eq!(classify(&[0xBF]), Err(WireError::Truncated));
        assert_eq!(classify(&[0xB7]), Err(WireError::Reserved(0xB7)));
        assert_eq!(classify(&[]), Err(WireError::Truncated));
    }

    #[test]
    fn registry_bytes() {
        // The bytes are the wire format: they must never change.
        let all = [
            (TYPE_OVERLAY, 0xB0),
            (TYPE_MARKER, 0xB1),
            (TYPE_TRIGGER, 0xB2),
            (TYPE_SEQ_DATA, 0xB3),
            (TYPE_SESSION, 0xB4),
            (TYPE_NAK, 0xB5),
            (TYPE_REPAIR, 0xB6),
            (TYPE_CREDIT, 0xB7),
            (TYPE_SEALED, 0xB8),
            (TYPE_SIGNED, 0xB9),
            (TYPE_HS_INIT, 0xBA),
            (TYPE_HS_RESP, 0xBB),
            (TYPE_ERRCTL_DATA, 0xBC),
            (TYPE_SNAK, 0xBD),
            (TYPE_PACK, 0xBE),
            (TYPE_ESCAPE, 0xBF),
        ];
        for (t, b) in all {
            assert_eq!(t, b);
            assert_eq!(t >> 4, CONTROL_NIBBLE);
        }
    }

    #[test]
    fn authenticated_control() {
        for b in [
            TYPE_MARKER,
            TYPE_TRIGGER,
            TYPE_SESSION,
            TYPE_NAK,
            TYPE_CREDIT,
        ] {
            assert!(is_authenticated_control(b), "{b:#x}");
        }
        // Repairs are data behind a sequence header: no trailer.
        for b in [TYPE_SEQ_DATA, TYPE_REPAIR, TYPE_ESCAPE, 0xB0, 0x45, 0x60] {
            assert!(!is_authenticated_control(b), "{b:#x}");
        }
    }
}
