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
//! **Initiation** (`0xBA`) and **response** (`0xBB`), the two Noise handshake messages:
//!
//! ```text
//!  0: 0xBA | 1: version | 2..4: zero | 4..8: sender's key index (u32) | 8..: Noise message 1
//!  0: 0xBB | 1: version | 2..4: zero | 4..8: sender's key index (u32)
//!                                    | 8..12: receiver's key index (u32) | 12..: Noise message 2
//! ```
//!
//! The Noise payload of both messages is the sender's run identifier (u64), a random
//! number chosen at start: a new one from the peer means it restarted.

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
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl<'a> Handshake<'a> {
    /// Parse a handshake message. Never panics.
    pub fn parse(b: &'a [u8]) -> Result<Handshake<'a>, SecureError> {
        if b.len() < INIT_HEADER_LEN {
            return Err(SecureError::Truncated);
        }
        if b[1] != VERSION || b[2] != 0 || b[3] != 0 {
            return Err(SecureError::Unknown);
        }
        match b[0] {
            TYPE_HS_INIT => Ok(Handshake::Init {
                sender: u32_at(b, 4),
                noise: &b[INIT_HEADER_LEN..],
            }),
            TYPE_HS_RESP => {
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
            Handshake::Init { sender, noise } => {
                let mut v = Vec::with_capacity(INIT_HEADER_LEN + noise.len());
                v.extend_from_slice(&[TYPE_HS_INIT, VERSION, 0, 0]);
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
            sender: 7,
            noise: &[9, 9],
        };
        let b = i.to_vec();
        assert_eq!(b, [0xBA, 1, 0, 0, 0, 0, 0, 7, 9, 9]);
        assert_eq!(Handshake::parse(&b), Ok(i));
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
