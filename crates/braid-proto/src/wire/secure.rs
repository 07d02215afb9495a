//! The security envelope: handshake messages and sealed datagrams.
//!
//! Every datagram of a session in security mode `encrypt` or `auth` travels inside a
//! sealed datagram; in mode `none` only control packets do (data stay bare). The keys come
//! from a Noise handshake (`crate::session::crypto`). All integers are big-endian.
//!
//! **Sealed datagram** (`0xB8` encrypted, `0xB9` authenticated only), 10-byte header,
//! then the body, then a 16-byte Poly1305 tag:
//!
//! ```text
//!  0        1        2                 6                 10
//! +--------+--------+-----------------+-----------------+
//! | B8/B9  |ver|lane| receiver's key  |  counter on this |
//! |        |        |  index (u32)    |  channel (u32)   |
//! +--------+--------+-----------------+-----------------+
//! | body: the inner datagram (a marker, trigger, session message, NAK, or  |  10..
//! | data exactly as it would travel bare), encrypted (B8) or in clear (B9) |
//! +------------------------------------------------------------------------+
//! | tag (16 bytes): ChaCha20-Poly1305 over the header (associated data)    |
//! | and the body; nonce = channel index (u32) || counter (as a u64)        |
//! +------------------------------------------------------------------------+
//! ```
//!
//! Byte 1 holds the envelope's version ([`VERSION`], high nibble) and the lane (low
//! nibble). Version 1 had a 16-byte header (a byte each for version and lane, a zero
//! byte, a u64 counter); a key never seals 2^32 datagrams on one channel
//! (`session::crypto::REJECT_AFTER_COUNT`), so 32 bits of counter carry all of it, and
//! the 6 bytes saved go to the inner packet.
//!
//! Lane: 0 for everything but path MTU probes, which travel in lane 1, the channel's
//! *probe lane* (`session::pmtu`): its own counter and replay window, and the nonce's
//! channel index with its top bit set (`0x8000_0000 | channel`). A probe too big for
//! the path is lost without leaving a gap in lane 0's counter, which the receiver
//! counts as loss (feedback, in-bond repair). Other lanes are refused.
//!
//! The counter is per channel and per key: it protects against replay (a window of
//! 2048 per channel) and is not a stream sequence number, so logical reception stays
//! header-free inside the envelope. The channel index is in the nonce, not on the
//! wire: a datagram moved to another channel fails its tag.
//!
//! **Initiation** (`0xBA`), **response**, **rejection** and **cookie reply** (all three
//! `0xBB`): the two Noise handshake messages, the responder's answer to an initiation it
//! cannot accept, and its answer under load. Handshake messages carry their own version
//! ([`HS_VERSION`]), which changed when the MACs and the timestamp were added:
//!
//! ```text
//! initiation (0xBA), 8 + Noise message 1 + 32 bytes:
//!  0        1        2        3        4                                   8
//! +--------+--------+--------+--------+-----------------------------------+
//! |  0xBA  |hs vers.|key kind|  zero  |   sender's key index (u32)        |
//! +--------+--------+--------+--------+-----------------------------------+
//! |  Noise message 1 (its payload: run identifier, timestamp, settings)   |  8..
//! +------------------------------------------------------------------------+
//! |  mac1 (16): keyed BLAKE2s-128 over everything before it                |
//! +------------------------------------------------------------------------+
//! |  mac2 (16): keyed BLAKE2s-128 with a cookie over everything before it, |
//! |  or zeros without a cookie                                             |
//! +------------------------------------------------------------------------+
//!
//! response (0xBB, kind 0), 12 + Noise message 2 + 16 bytes:
//!  0: 0xBB | 1: hs version | 2: 0 | 3: zero | 4..8: sender's key index (u32)
//!  8..12: receiver's key index (u32) | 12..: Noise message 2 | last 16: mac1
//!
//! rejection (0xBB, kind 1), 28 bytes:
//!  0: 0xBB | 1: hs version | 2: 1 | 3: reason (1 not authenticated, 2 unknown
//!  static key, 3 other key kind, 4 unreadable) | 4..8: zero
//!  8..12: the initiator's key index (u32) | 12..28: the first 16 bytes of the
//!  initiation's Noise message (the initiator's ephemeral public key), echoed
//!
//! cookie reply (0xBB, kind 2), 64 bytes:
//!  0: 0xBB | 1: hs version | 2: 2 | 3: zero | 4..8: the initiator's key index (u32)
//!  8..32: nonce (24 random bytes)
//!  32..64: the cookie (16) sealed with XChaCha20-Poly1305 (16-byte tag), the
//!  initiation's mac1 as associated data
//! ```
//! Key kind: 0 pre-shared key only, 1 static keys.
//!
//! The Noise payload of the initiation is the sender's run identifier (u64), a random
//! number chosen at start (a new one from the peer means it restarted), the initiation's
//! timestamp ([`Timestamp`], 12 bytes, TAI64N), then the sender's settings block
//! (`crate::session::settings`). The response's payload is the run identifier and the
//! settings block. A rejection carries no secret and is not authenticated; see
//! `docs/security.md` for the MACs, the cookie and what each defends.

use super::{TYPE_HS_INIT, TYPE_HS_RESP, TYPE_SEALED, TYPE_SIGNED};

/// Version of the envelope (sealed datagrams; 2: the 10-byte header).
pub const VERSION: u8 = 2;
/// Version of the handshake messages (2: mac1, mac2, the cookie reply and the
/// initiation's timestamp; 3: the keys it makes seal with envelope version 2, so two
/// ends that could not read each other's datagrams do not complete a handshake; 4: flow
/// datagrams may carry ordered domains, which an end of version 3 drops as malformed;
/// 5: the settings block may carry the AES-256-GCM feature bit, which an end of version
/// 4 cannot read; 6: streams send the short DATA frame (`wire::stream`, types 8 to 15),
/// which an end of version 5 drops as malformed).
pub const HS_VERSION: u8 = 6;
/// Length of mac1 and mac2.
pub const MAC_LEN: usize = 16;
/// Length of a cookie reply.
pub const COOKIE_REPLY_LEN: usize = 64;
/// Length of a cookie reply's nonce.
pub const COOKIE_NONCE_LEN: usize = 24;
/// Length of a cookie reply's sealed cookie (cookie and tag).
pub const COOKIE_SEALED_LEN: usize = 32;
/// Length of a timestamp (TAI64N).
pub const TIMESTAMP_LEN: usize = 12;
/// Header length of a sealed datagram.
pub const HEADER_LEN: usize = 10;
/// Tag length.
pub const TAG_LEN: usize = 16;
/// Bytes a sealed datagram adds to the inner one.
pub const OVERHEAD: usize = HEADER_LEN + TAG_LEN;
/// Fixed part of an initiation.
pub const INIT_HEADER_LEN: usize = 8;
/// Fixed part of a response.
pub const RESP_HEADER_LEN: usize = 12;
/// Bytes of the initiation a rejection echoes.
pub const ECHO_LEN: usize = 16;
/// Length of a rejection.
pub const REJECT_LEN: usize = RESP_HEADER_LEN + ECHO_LEN;

/// The header of a sealed datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Body encrypted (`0xB8`) or in clear (`0xB9`).
    pub encrypted: bool,
    /// The receiver's key index.
    pub index: u32,
    /// Counter on this channel (in its lane).
    pub counter: u32,
    /// The counter's lane: [`LANE_MAIN`] or [`LANE_PROBE`].
    pub lane: u8,
}

/// The lane of every sealed datagram but path MTU probes.
pub const LANE_MAIN: u8 = 0;
/// The lane of path MTU probes (`session::pmtu`).
pub const LANE_PROBE: u8 = 1;

/// Why a datagram of this module could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SecureError {
    /// Too short.
    #[error("secure datagram truncated")]
    Truncated,
    /// Wrong type, version or lane (or reserved bytes not zero).
    #[error("unknown secure datagram type or version")]
    Unknown,
}

impl Header {
    /// Parse the header of a sealed datagram (at least header and tag long).
    pub fn parse(b: &[u8]) -> Result<Header, SecureError> {
        if b.len() < OVERHEAD {
            return Err(SecureError::Truncated);
        }
        let encrypted = match b[0] {
            TYPE_SEALED => true,
            TYPE_SIGNED => false,
            _ => return Err(SecureError::Unknown),
        };
        let (version, lane) = (b[1] >> 4, b[1] & 0x0F);
        if version != VERSION || lane > LANE_PROBE {
            return Err(SecureError::Unknown);
        }
        Ok(Header {
            lane,
            encrypted,
            index: u32::from_be_bytes([b[2], b[3], b[4], b[5]]),
            counter: u32::from_be_bytes([b[6], b[7], b[8], b[9]]),
        })
    }

    /// The 10 header bytes.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0] = if self.encrypted {
            TYPE_SEALED
        } else {
            TYPE_SIGNED
        };
        h[1] = (VERSION << 4) | self.lane;
        h[2..6].copy_from_slice(&self.index.to_be_bytes());
        h[6..10].copy_from_slice(&self.counter.to_be_bytes());
        h
    }
}

/// The handshake version of `b` if it is a handshake message of a version other than
/// ours ([`HS_VERSION`]): the peer runs another braid, whose datagrams this one could
/// not read. Unauthenticated (anyone can send one); for a clear log line only.
pub fn other_version(b: &[u8]) -> Option<u8> {
    match b {
        [TYPE_HS_INIT | TYPE_HS_RESP, v, ..] if *v != HS_VERSION && *v != 0 => Some(*v),
        _ => None,
    }
}

/// A handshake message: initiation or response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handshake<'a> {
    /// Noise message 1.
    Init {
        /// The initiator uses static keys (Noise IK), not only a pre-shared key (NN).
        static_keys: bool,
        /// The initiator's key index.
        sender: u32,
        /// The Noise message.
        noise: &'a [u8],
        /// MAC over the bytes before it, keyed by the responder's static public key
        /// (or the pre-shared key).
        mac1: [u8; MAC_LEN],
        /// MAC over the bytes before it, keyed by a cookie of the responder's; zeros
        /// without one.
        mac2: [u8; MAC_LEN],
    },
    /// Noise message 2.
    Resp {
        /// The responder's key index.
        sender: u32,
        /// The initiator's key index it answers.
        receiver: u32,
        /// The Noise message.
        noise: &'a [u8],
        /// MAC over the bytes before it, keyed by the initiator's static public key
        /// (or the pre-shared key).
        mac1: [u8; MAC_LEN],
    },
    /// The responder could not accept the initiation.
    Reject {
        /// Why (a `REJECT_*` code; unknown codes are passed on).
        reason: u8,
        /// The initiator's key index.
        receiver: u32,
        /// The first [`ECHO_LEN`] bytes of the initiation's Noise message.
        echo: [u8; ECHO_LEN],
    },
    /// The responder is under load: a cookie to prove our address with (mac2).
    Cookie {
        /// The initiator's key index.
        receiver: u32,
        /// Random nonce of the sealed cookie.
        nonce: [u8; COOKIE_NONCE_LEN],
        /// The cookie sealed (XChaCha20-Poly1305) with the initiation's mac1 as
        /// associated data.
        sealed: [u8; COOKIE_SEALED_LEN],
    },
}

/// Rejection reason: the initiation did not authenticate with our keys.
pub const REJECT_UNAUTHENTICATED: u8 = 1;
/// Rejection reason: the initiator's static key is not the peer key configured here.
pub const REJECT_UNKNOWN_KEY: u8 = 2;
/// Rejection reason: the initiator uses the other key kind (static keys or a
/// pre-shared key only).
pub const REJECT_KEY_KIND: u8 = 3;
/// Rejection reason: authenticated, but its payload is not one we can read (another
/// version of braid).
pub const REJECT_UNREADABLE: u8 = 4;

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The mac at `at` in `b` (there are [`MAC_LEN`] bytes from `at`).
fn mac_at(b: &[u8], at: usize) -> [u8; MAC_LEN] {
    let mut m = [0u8; MAC_LEN];
    m.copy_from_slice(&b[at..at + MAC_LEN]);
    m
}

impl<'a> Handshake<'a> {
    /// Parse a handshake message. Never panics.
    pub fn parse(b: &'a [u8]) -> Result<Handshake<'a>, SecureError> {
        if b.len() < INIT_HEADER_LEN {
            return Err(SecureError::Truncated);
        }
        if b[1] != HS_VERSION || b[2] > 2 {
            return Err(SecureError::Unknown);
        }
        match b[0] {
            TYPE_HS_INIT if b[3] == 0 && b[2] <= 1 => Self::parse_init(b),
            TYPE_HS_RESP if b[2] == 1 => Self::parse_reject(b),
            TYPE_HS_RESP if b[2] == 2 && b[3] == 0 => Self::parse_cookie(b),
            TYPE_HS_RESP if b[2] == 0 && b[3] == 0 => Self::parse_resp(b),
            _ => Err(SecureError::Unknown),
        }
    }

    /// An initiation (its header checked): the Noise message between the header and
    /// the two macs.
    fn parse_init(b: &'a [u8]) -> Result<Handshake<'a>, SecureError> {
        if b.len() < INIT_HEADER_LEN + 2 * MAC_LEN {
            return Err(SecureError::Truncated);
        }
        let end = b.len() - 2 * MAC_LEN;
        Ok(Handshake::Init {
            static_keys: b[2] == 1,
            sender: u32_at(b, 4),
            noise: &b[INIT_HEADER_LEN..end],
            mac1: mac_at(b, end),
            mac2: mac_at(b, end + MAC_LEN),
        })
    }

    /// A reject (its header checked): exactly [`REJECT_LEN`] bytes, the reason, the
    /// key index of the initiation rejected and its echoed first bytes.
    fn parse_reject(b: &'a [u8]) -> Result<Handshake<'a>, SecureError> {
        if b.len() != REJECT_LEN || b[4..8] != [0; 4] {
            return Err(SecureError::Truncated);
        }
        let mut echo = [0u8; ECHO_LEN];
        echo.copy_from_slice(&b[RESP_HEADER_LEN..]);
        Ok(Handshake::Reject {
            reason: b[3],
            receiver: u32_at(b, 8),
            echo,
        })
    }

    /// A cookie reply (its header checked): exactly [`COOKIE_REPLY_LEN`] bytes, the
    /// nonce and the sealed cookie.
    fn parse_cookie(b: &'a [u8]) -> Result<Handshake<'a>, SecureError> {
        if b.len() != COOKIE_REPLY_LEN {
            return Err(SecureError::Truncated);
        }
        let mut nonce = [0u8; COOKIE_NONCE_LEN];
        nonce.copy_from_slice(&b[8..8 + COOKIE_NONCE_LEN]);
        let mut sealed = [0u8; COOKIE_SEALED_LEN];
        sealed.copy_from_slice(&b[8 + COOKIE_NONCE_LEN..]);
        Ok(Handshake::Cookie {
            receiver: u32_at(b, 4),
            nonce,
            sealed,
        })
    }

    /// A response (its header checked): the Noise message between the header and the
    /// mac.
    fn parse_resp(b: &'a [u8]) -> Result<Handshake<'a>, SecureError> {
        if b.len() < RESP_HEADER_LEN + MAC_LEN {
            return Err(SecureError::Truncated);
        }
        let end = b.len() - MAC_LEN;
        Ok(Handshake::Resp {
            sender: u32_at(b, 4),
            receiver: u32_at(b, 8),
            noise: &b[RESP_HEADER_LEN..end],
            mac1: mac_at(b, end),
        })
    }

    /// The message's bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        match *self {
            Handshake::Init {
                static_keys,
                sender,
                noise,
                mac1,
                mac2,
            } => {
                let mut v = Vec::with_capacity(INIT_HEADER_LEN + noise.len() + 2 * MAC_LEN);
                v.extend_from_slice(&[TYPE_HS_INIT, HS_VERSION, u8::from(static_keys), 0]);
                v.extend_from_slice(&sender.to_be_bytes());
                v.extend_from_slice(noise);
                v.extend_from_slice(&mac1);
                v.extend_from_slice(&mac2);
                v
            }
            Handshake::Resp {
                sender,
                receiver,
                noise,
                mac1,
            } => {
                let mut v = Vec::with_capacity(RESP_HEADER_LEN + noise.len() + MAC_LEN);
                v.extend_from_slice(&[TYPE_HS_RESP, HS_VERSION, 0, 0]);
                v.extend_from_slice(&sender.to_be_bytes());
                v.extend_from_slice(&receiver.to_be_bytes());
                v.extend_from_slice(noise);
                v.extend_from_slice(&mac1);
                v
            }
            Handshake::Cookie {
                receiver,
                nonce,
                sealed,
            } => {
                let mut v = Vec::with_capacity(COOKIE_REPLY_LEN);
                v.extend_from_slice(&[TYPE_HS_RESP, HS_VERSION, 2, 0]);
                v.extend_from_slice(&receiver.to_be_bytes());
                v.extend_from_slice(&nonce);
                v.extend_from_slice(&sealed);
                v
            }
            Handshake::Reject {
                reason,
                receiver,
                echo,
            } => {
                let mut v = Vec::with_capacity(REJECT_LEN);
                v.extend_from_slice(&[TYPE_HS_RESP, HS_VERSION, 1, reason, 0, 0, 0, 0]);
                v.extend_from_slice(&receiver.to_be_bytes());
                v.extend_from_slice(&echo);
                v
            }
        }
    }
}

/// Where mac1 starts in an initiation or response of `len` bytes (type byte `first`),
/// and where the bytes mac2 covers end (`None` for a response, which has no mac2).
/// `None` if the message is too short to hold them.
pub fn mac_offsets(first: u8, len: usize) -> Option<(usize, Option<usize>)> {
    match first {
        TYPE_HS_INIT if len >= INIT_HEADER_LEN + 2 * MAC_LEN => {
            Some((len - 2 * MAC_LEN, Some(len - MAC_LEN)))
        }
        TYPE_HS_RESP if len >= RESP_HEADER_LEN + MAC_LEN => Some((len - MAC_LEN, None)),
        _ => None,
    }
}

/// A wall-clock instant as TAI64N: seconds since 1970 plus 2^62 (the TAI64 label;
/// leap seconds are not counted, so it is UTC-based like WireGuard's), then
/// nanoseconds. Compared as a whole, big-endian, so a later instant is a larger value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    /// Seconds since 1970-01-01 (UTC, leap seconds not counted).
    pub secs: u64,
    /// Nanoseconds, below 10^9.
    pub nanos: u32,
}

/// The TAI64 label of 1970-01-01.
const TAI64_BASE: u64 = 1 << 62;

impl Timestamp {
    /// From nanoseconds since 1970.
    pub fn from_unix_nanos(n: u128) -> Timestamp {
        Timestamp {
            secs: (n / 1_000_000_000).min(u128::from(u64::MAX >> 2)) as u64,
            nanos: (n % 1_000_000_000) as u32,
        }
    }

    /// The 12 bytes.
    pub fn to_bytes(&self) -> [u8; TIMESTAMP_LEN] {
        let mut b = [0u8; TIMESTAMP_LEN];
        b[..8].copy_from_slice(&(TAI64_BASE + self.secs).to_be_bytes());
        b[8..].copy_from_slice(&self.nanos.to_be_bytes());
        b
    }

    /// Parse 12 bytes of TAI64N. Refuses labels before 1970 or past 2^63 (not TAI64
    /// instants we could have made) and nanoseconds of 10^9 or more. Never panics.
    pub fn parse(b: &[u8]) -> Result<Timestamp, SecureError> {
        if b.len() < TIMESTAMP_LEN {
            return Err(SecureError::Truncated);
        }
        let label = super::read_u64(b, 0);
        let nanos = u32_at(b, 8);
        if !(TAI64_BASE..1 << 63).contains(&label) || nanos >= 1_000_000_000 {
            return Err(SecureError::Unknown);
        }
        Ok(Timestamp {
            secs: label - TAI64_BASE,
            nanos,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_bytes_and_roundtrip() {
        let h = Header {
            encrypted: true,
            index: 0x0102_0304,
            counter: 5,
            lane: LANE_MAIN,
        };
        let b = h.to_bytes();
        assert_eq!(b, [0xB8, 0x20, 1, 2, 3, 4, 0, 0, 0, 5]);
        let mut d = b.to_vec();
        d.extend_from_slice(&[0; TAG_LEN]);
        assert_eq!(Header::parse(&d), Ok(h));
        d[0] = 0xB9;
        assert!(!Header::parse(&d).unwrap().encrypted);
        // The probe lane.
        d[1] = 0x21;
        assert_eq!(Header::parse(&d).unwrap().lane, LANE_PROBE);
        d[1] = 0x22;
        assert_eq!(Header::parse(&d), Err(SecureError::Unknown));
        // Version 1's header (byte 1 = 1) and any other version are refused.
        d[1] = 0x01;
        assert_eq!(Header::parse(&d), Err(SecureError::Unknown));
        d[1] = 0x30;
        assert_eq!(Header::parse(&d), Err(SecureError::Unknown));
        assert_eq!(
            Header::parse(&d[..OVERHEAD - 1]),
            Err(SecureError::Truncated)
        );
    }

    #[test]
    fn handshake_bytes_and_roundtrip() {
        let i = Handshake::Init {
            static_keys: false,
            sender: 7,
            noise: &[9, 9],
            mac1: [1; MAC_LEN],
            mac2: [2; MAC_LEN],
        };
        let b = i.to_vec();
        assert_eq!(b[..10], [0xBA, 6, 0, 0, 0, 0, 0, 7, 9, 9]);
        assert_eq!(b[10..26], [1; 16]);
        assert_eq!(b[26..], [2; 16]);
        assert_eq!(Handshake::parse(&b), Ok(i));
        assert_eq!(mac_offsets(b[0], b.len()), Some((10, Some(26))));
        let i = Handshake::Init {
            static_keys: true,
            sender: 7,
            noise: &[9, 9],
            mac1: [0; MAC_LEN],
            mac2: [0; MAC_LEN],
        };
        assert_eq!(i.to_vec()[2], 1);
        assert_eq!(Handshake::parse(&i.to_vec()), Ok(i));
        // Too short for the two MACs; the old version.
        assert_eq!(
            Handshake::parse(&b[..INIT_HEADER_LEN + 2 * MAC_LEN - 1]),
            Err(SecureError::Truncated)
        );
        let mut old = b.clone();
        old[1] = 1;
        assert_eq!(Handshake::parse(&old), Err(SecureError::Unknown));
        let j = Handshake::Reject {
            reason: REJECT_UNAUTHENTICATED,
            receiver: 0x0A0B_0C0D,
            echo: [5; ECHO_LEN],
        };
        let b = j.to_vec();
        assert_eq!(b.len(), REJECT_LEN);
        assert_eq!(
            &b[..12],
            [0xBB, 6, 1, 1, 0, 0, 0, 0, 0x0A, 0x0B, 0x0C, 0x0D]
        );
        assert_eq!(Handshake::parse(&b), Ok(j));
        assert!(Handshake::parse(&b[..REJECT_LEN - 1]).is_err());
        let r = Handshake::Resp {
            sender: 1,
            receiver: 2,
            noise: &[3],
            mac1: [4; MAC_LEN],
        };
        let b = r.to_vec();
        assert_eq!(b[..13], [0xBB, 6, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 3]);
        assert_eq!(b[13..], [4; 16]);
        assert_eq!(Handshake::parse(&b), Ok(r));
        assert_eq!(mac_offsets(b[0], b.len()), Some((13, None)));
        for n in 0..b.len() {
            let _ = Handshake::parse(&b[..n]);
        }
        assert_eq!(
            Handshake::parse(&[0xBB, 6, 0, 0, 0, 0, 0, 1]),
            Err(SecureError::Truncated)
        );
    }

    #[test]
    fn cookie_reply_bytes_and_roundtrip() {
        let c = Handshake::Cookie {
            receiver: 0x0102_0304,
            nonce: [7; COOKIE_NONCE_LEN],
            sealed: [8; COOKIE_SEALED_LEN],
        };
        let b = c.to_vec();
        assert_eq!(b.len(), COOKIE_REPLY_LEN);
        assert_eq!(b[..8], [0xBB, 6, 2, 0, 1, 2, 3, 4]);
        assert_eq!(b[8..32], [7; 24]);
        assert_eq!(b[32..], [8; 32]);
        assert_eq!(Handshake::parse(&b), Ok(c));
        // Exactly 64 bytes, reserved byte zero.
        assert_eq!(Handshake::parse(&b[..63]), Err(SecureError::Truncated));
        let mut long = b.clone();
        long.push(0);
        assert_eq!(Handshake::parse(&long), Err(SecureError::Truncated));
        let mut bad = b.clone();
        bad[3] = 1;
        assert_eq!(Handshake::parse(&bad), Err(SecureError::Unknown));
        bad[3] = 0;
        bad[2] = 3;
        assert_eq!(Handshake::parse(&bad), Err(SecureError::Unknown));
        // Smaller than the smallest initiation it can answer (pre-shared key only).
        const { assert!(COOKIE_REPLY_LEN < 144) };
    }

    #[test]
    fn timestamps_are_tai64n_and_order_like_time() {
        let t = Timestamp::from_unix_nanos(1_700_000_000_123_456_789);
        assert_eq!((t.secs, t.nanos), (1_700_000_000, 123_456_789));
        let b = t.to_bytes();
        assert_eq!(
            b[..8],
            (0x4000_0000_0000_0000u64 + 1_700_000_000).to_be_bytes()
        );
        assert_eq!(b[8..], 123_456_789u32.to_be_bytes());
        assert_eq!(Timestamp::parse(&b), Ok(t));
        let later = Timestamp::from_unix_nanos(1_700_000_000_123_456_790);
        assert!(later > t && later.to_bytes() > b);
        let next_second = Timestamp::from_unix_nanos(1_700_000_001_000_000_000);
        assert!(next_second > later);
        assert_eq!(Timestamp::parse(&b[..11]), Err(SecureError::Truncated));
        let mut bad = b;
        bad[8..].copy_from_slice(&1_000_000_000u32.to_be_bytes());
        assert_eq!(Timestamp::parse(&bad), Err(SecureError::Unknown));
        let mut bad = b;
        bad[0] = 0x3F;
        assert_eq!(Timestamp::parse(&bad), Err(SecureError::Unknown));
        bad[0] = 0x80;
        assert_eq!(Timestamp::parse(&bad), Err(SecureError::Unknown));
        assert_eq!(
            Timestamp::parse(&Timestamp::from_unix_nanos(0).to_bytes())
                .unwrap()
                .secs,
            0
        );
    }
}
