//! Negative acknowledgements (`seq` mode with repair): the receiver names sequence
//! numbers it found missing, and the sender sends them again (seed 002's selective
//! retransmission, on top of striping).
//!
//! ```text
//!  0        1        2        3
//! +--------+--------+--------+--------+
//! |  0xB5  |version |   count (u16)   |  1 to 64 sequence numbers follow
//! +--------+--------+--------+--------+
//! |              epoch (u32)          |  4..8
//! +--------+--------+--------+--------+
//! |          sequence number (u64)    |  8..16, then one every 8 bytes
//! |                                   |
//! +--------+--------+--------+--------+
//! ```
//!
//! The repaired packet travels with the five-byte header of [`super::seq`] but first
//! byte `0xB6` (see [`super::TYPE_REPAIR`]), so the receiver does not count it in
//! the channel's SRR schedule.

use super::{read_u32, read_u64, WireError, TYPE_NAK, VERSION};

/// Most sequence numbers in one NAK.
pub const MAX_SEQS: usize = 64;
const FIXED: usize = 8;

/// A validated NAK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repr {
    /// Channel-set epoch.
    pub epoch: u32,
    /// Missing sequence numbers (64-bit, as the receiver extended them).
    pub seqs: Vec<u64>,
}

impl Repr {
    /// Parse and validate a NAK.
    pub fn parse(b: &[u8]) -> Result<Repr, WireError> {
        if b.len() < FIXED {
            return Err(WireError::Truncated);
        }
        if b[0] != TYPE_NAK {
            return Err(WireError::Invalid);
        }
        if b[1] != VERSION {
            return Err(WireError::Version(b[1]));
        }
        let count = u16::from_be_bytes([b[2], b[3]]) as usize;
        if count == 0 || count > MAX_SEQS {
            return Err(WireError::Invalid);
        }
        match b.len().cmp(&(FIXED + 8 * count)) {
            core::cmp::Ordering::Less => return Err(WireError::Truncated),
            core::cmp::Ordering::Greater => return Err(WireError::Trailing),
            core::cmp::Ordering::Equal => {}
        }
        Ok(Repr {
            epoch: read_u32(b, 4),
            seqs: (0..count).map(|i| read_u64(b, FIXED + 8 * i)).collect(),
        })
    }

    /// Encode (at most [`MAX_SEQS`] numbers are written).
    pub fn to_vec(&self) -> Vec<u8> {
        let n = self.seqs.len().min(MAX_SEQS);
        let mut v = Vec::with_capacity(FIXED + 8 * n);
        v.push(TYPE_NAK);
        v.push(VERSION);
        v.extend_from_slice(&(n as u16).to_be_bytes());
        v.extend_from_slice(&self.epoch.to_be_bytes());
        for s in &self.seqs[..n] {
            v.extend_from_slice(&s.to_be_bytes());
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_roundtrip() {
        let r = Repr {
            epoch: 2,
            seqs: vec![5, 0x0102],
        };
        let v = r.to_vec();
        assert_eq!(
            v,
            vec![
                0xB5, 1, 0, 2, 0, 0, 0, 2, // type, version, count 2, epoch 2
                0, 0, 0, 0, 0, 0, 0, 5, // seq 5
                0, 0, 0, 0, 0, 0, 1, 2, // seq 258
            ]
        );
        assert_eq!(Repr::parse(&v), Ok(r));
    }

    #[test]
    fn rejects_bad_input() {
        assert_eq!(Repr::parse(&[0xB5, 1, 0]), Err(WireError::Truncated));
        assert_eq!(
            Repr::parse(&[0xB5, 1, 0, 0, 0, 0, 0, 0]),
            Err(WireError::Invalid)
        );
        let mut v = Repr {
            epoch: 0,
            seqs: vec![1],
        }
        .to_vec();
        v.push(0);
        assert_eq!(Repr::parse(&v), Err(WireError::Trailing));
        v.truncate(12);
        assert_eq!(Repr::parse(&v), Err(WireError::Truncated));
    }
}
