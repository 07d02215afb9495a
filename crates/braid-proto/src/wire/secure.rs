//! The security envelope: handshake messages and sealed datagrams.
//!
//! Every datagram of a session in security mode `encrypt` or `auth` travels inside a
//! sealed datagram; in mode `none` only control packets do (data stay bare). The keys come
//! from a Noise handshake (`crate::session::crypto`). All integers are big-endian.
//!
//! **Sealed datagram** (`0xB8` encrypted, `0xB9` authenticated only), 16-byte header,
//! then the body, then a 16-byte Poly1305 tag:
//!
//! ```text
//!  0        1        2        3        4                                   8
//! +--------+--------+--------+--------+-----------------------------------+
//! | B8/B9  |version |  zero  |  zero  |   receiver's key index (u32)      |
//! +--------+--------+--------+--------+-----------------------------------+
//! |                 counter on this channel (u64)                          |  8..16
//! +------------------------------------------------------------------------+
//! | body: the inner datagram (a marker, trigger, session message, NAK, or  |  16..
//! | data exactly as it would travel bare), encrypted (B8) or in clear (B9) |
//! +------------------------------------------------------------------------+
//! | tag (16 bytes): ChaCha20-Poly1305 over the header (associated data)    |
//! | and the body; nonce = channel index (u32) || counter (u64)             |
//! +------------------------------------------------------------------------+
//! ```
//!
//! The counter is per channel and per key: it protects against replay (a window of
//! 2048 per channel) and is not a stream sequence number, so logical reception stays
//! header-free inside the envelope. The channel index is in the nonce, not on the
//! wire: a datagram moved to another channel fails its tag.
//!
//! **Initiation** (`0xBA`), **response** and **rejection** (both `0xBB`): the two Noise
//! handshake messages, and the responder's answer to an initiation it cannot accept:
//!
//! ```text
//!  0: 0xBA | 1: version | 2: key kind (0 pre-shared key only, 1 static keys) | 3: zero
//!  4..8: sender's key index (u32) | 8..: Noise message 1
//!
//!  0: 0xBB | 1: version | 2: 0 (response) | 3: zero
//!  4..8: sender's key index (u32) | 8..12: receiver's key index (u32) | 12..: Noise message 2
//!
//!  0: 0xBB | 1: version | 2: 1 (rejection) | 3: reason (1 not authenticated, 2 unknown
//!  static key, 3 other key kind, 4 unreadable) | 4..8: zero
//!  8..12: the initiator's key index (u32) | 12..28: the first 16 bytes of the
//!  initiation's Noise message (the initiator's ephemeral public key), echoed
//! ```
//!
//! The Noise payload of the initiation and the response is the sender's run identifier
//! (u64), a random number chosen at start (a new one from the peer means it restarted),
//! then the sender's settings block (`crate::session::settings`). A rejection carries no
//! secret and is not authenticated; see `docs/security.md` for what it may cause.

use super::{TYPE_HS_INIT, TYPE_HS_RESP, TYPE_SEALED, TYPE_SIGNED};

/// Version of the envelope.
pub const VERSION: u8 = 1;
/// Header length of a sealed datagram.
pub const HEADER_LEN: usize = 16;
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
    /// Counter on this channel.
    pub counter: u64,
}

/// Why a datagram of this module could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SecureError {
    /// Too short.
    #[error("secure datagram truncated")]
    Truncated,
    /// Wrong type or version, or non-zero reserved bytes.
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
        if b[1] != VERSION || b[2] != 0 || b[3] != 0 {
            return Err(SecureError::Unknown);
        }
        Ok(Header {
            encrypted,
            index: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            counter: super::read_u64(b, 8),
        })
    }

    /// The 16 header bytes.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0] = if self.encrypted {
            TYPE_SEALED
        } else {
            TYPE_SIGNED
        };
        h[1] = VERSION;
        h[4..8].copy_from_slice(&self.index.to_be_bytes());
        h[8..16].copy_from_slice(&self.counter.to_be_bytes());
        h
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
    },
    /// Noise message 2.
    Resp {
        /// The responder's key index.
        sender: u32,
        /// The initiator's key index it answers.
        receiver: u32,
        /// The Noise message.
        noise: &'a [u8],
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

impl<'a> Handshake<'a> {
    /// Parse a handshake message. Never panics.
    pub fn parse(b: &'a [u8]) -> Result<Handshake<'a>, SecureError> {
        if b.len() < INIT_HEADER_LEN {
            return Err(SecureError::Truncated);
        }
        if b[1] != VERSION || b[2] > 1 {
            return Err(SecureError::Unknown);
        }
        match b[0] {
            TYPE_HS_INIT if b[3] == 0 => Ok(Handshake::Init {
                static_keys: b[2] == 1,
                sender: u32_at(b, 4),
                noise: &b[INIT_HEADER_LEN..],
            }),
            TYPE_HS_RESP if b[2] == 1 => {
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
            TYPE_HS_RESP if b[3] == 0 => {
                if b.len() < RESP_HEADER_LEN {
                    return Err(SecureError::Truncated);
                }
                Ok(Handshake::Resp {
                    sender: u32_at(b, 4),
                    receiver: u32_at(b, 8),
                    noise: &b[RESP_HEADER_LEN..],
                })
            }
            _ => Err(SecureError::Unknown),
        }
    }

    /// The message's bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        match *self {
            Handshake::Init {
                static_keys,
                sender,
                noise,
            } => {
                let mut v = Vec::with_capacity(INIT_HEADER_LEN + noise.len());
                v.extend_from_slice(&[TYPE_HS_INIT, VERSION, u8::from(static_keys), 0]);
                v.extend_from_slice(&sender.to_be_bytes());
                v.extend_from_slice(noise);
                v
            }
            Handshake::Resp {
                sender,
                receiver,
                noise,
            } => {
                let mut v = Vec::with_capacity(RESP_HEADER_LEN + noise.len());
                v.extend_from_slice(&[TYPE_HS_RESP, VERSION, 0, 0]);
                v.extend_from_slice(&sender.to_be_bytes());
                v.extend_from_slice(&receiver.to_be_bytes());
                v.extend_from_slice(noise);
                v
            }
            Handshake::Reject {
                reason,
                receiver,
                echo,
            } => {
                let mut v = Vec::with_capacity(REJECT_LEN);
                v.extend_from_slice(&[TYPE_HS_RESP, VERSION, 1, reason, 0, 0, 0, 0]);
                v.extend_from_slice(&receiver.to_be_bytes());
                v.extend_from_slice(&echo);
                v
            }
        }
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
        };
        let b = h.to_bytes();
        assert_eq!(b, [0xB8, 1, 0, 0, 1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 5]);
        let mut d = b.to_vec();
        d.extend_from_slice(&[0; TAG_LEN]);
        assert_eq!(Header::parse(&d), Ok(h));
        d[0] = 0xB9;
        assert!(!Header::parse(&d).unwrap().encrypted);
        d[2] = 1;
        assert_eq!(Header::parse(&d), Err(SecureError::Unknown));
        assert_eq!(Header::parse(&d[..31]), Err(SecureError::Truncated));
    }

    #[test]
    fn handshake_bytes_and_roundtrip() {
        let i = Handshake::Init {
            static_keys: false,
            sender: 7,
            noise: &[9, 9],
        };
        let b = i.to_vec();
        assert_eq!(b, [0xBA, 1, 0, 0, 0, 0, 0, 7, 9, 9]);
        assert_eq!(Handshake::parse(&b), Ok(i));
        let i = Handshake::Init {
            static_keys: true,
            sender: 7,
            noise: &[9, 9],
        };
        assert_eq!(i.to_vec()[2], 1);
        assert_eq!(Handshake::parse(&i.to_vec()), Ok(i));
        let j = Handshake::Reject {
            reason: REJECT_UNAUTHENTICATED,
            receiver: 0x0A0B_0C0D,
            echo: [5; ECHO_LEN],
        };
        let b = j.to_vec();
        assert_eq!(b.len(), REJECT_LEN);
        assert_eq!(
            &b[..12],
            [0xBB, 1, 1, 1, 0, 0, 0, 0, 0x0A, 0x0B, 0x0C, 0x0D]
        );
        assert_eq!(Handshake::parse(&b), Ok(j));
        assert!(Handshake::parse(&b[..REJECT_LEN - 1]).is_err());
        let r = Handshake::Resp {
            sender: 1,
            receiver: 2,
            noise: &[3],
        };
        let b = r.to_vec();
        assert_eq!(b, [0xBB, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 3]);
        assert_eq!(Handshake::parse(&b), Ok(r));
        for n in 0..b.len() {
            let _ = Handshake::parse(&b[..n]);
        }
        assert_eq!(
            Handshake::parse(&[0xBB, 1, 0, 0, 0, 0, 0, 1]),
            Err(SecureError::Truncated)
        );
    }
}
