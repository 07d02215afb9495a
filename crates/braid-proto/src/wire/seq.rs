//! The compact sequence header of `seq` mode: five bytes in front of each data packet.
//!
//! ```text
//!  0        1        2        3        4
//! +--------+--------+--------+--------+--------+-------------
//! |  type  |        sequence number (u32)      |  payload ...
//! +--------+--------+--------+--------+--------+-------------
//! ```
//! The type is `0xB3` for data sent the first time and `0xB6` for a repair (the same
//! packet sent again after a NAK, see [`super::nak`]).
//! The sequence number counts data packets from 0 and wraps at 2^32; the receiver extends
//! it to 64 bits as the value nearest to the one it expects next. There is no version
//! byte, to keep the per-packet cost at five bytes: the version is the one of the markers
//! on the same channels.

use super::{read_u32, WireError, TYPE_REPAIR, TYPE_SEQ_DATA};

/// Header length.
pub const HEADER_LEN: usize = 5;

/// A zero-copy view of a sequenced data packet.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap and check the length.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let p = Packet { buffer };
        p.check_len()?;
        Ok(p)
    }
    /// At least the header must be present.
    pub fn check_len(&self) -> Result<(), WireError> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(WireError::Truncated)
        } else {
            Ok(())
        }
    }
    /// Wrapped sequence number.
    pub fn seq(&self) -> u32 {
        read_u32(self.buffer.as_ref(), 1)
    }
    /// The payload after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

/// The header as a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Wrapped sequence number.
    pub seq: u32,
    /// A repair (first byte `0xB6`) rather than data sent the first time (`0xB3`).
    pub repair: bool,
}

impl Repr {
    /// Parse a header.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr, WireError> {
        p.check_len()?;
        let repair = match p.buffer.as_ref()[0] {
            TYPE_SEQ_DATA => false,
            TYPE_REPAIR => true,
            _ => return Err(WireError::Invalid),
        };
        Ok(Repr {
            seq: p.seq(),
            repair,
        })
    }
    /// Header bytes.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
    /// Write the header, type byte included, into the first five bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) {
        buf[0] = if self.repair {
            TYPE_REPAIR
        } else {
            TYPE_SEQ_DATA
        };
        buf[1..5].copy_from_slice(&self.seq.to_be_bytes());
    }
}

/// Extend a wrapped 32-bit sequence number to the 64-bit value nearest `expected`.
pub fn extend(wrapped: u32, expected: u64) -> u64 {
    let delta = wrapped.wrapping_sub(expected as u32) as i32 as i64;
    (expected as i64).wrapping_add(delta).max(0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_bytes() {
        let mut b = [0u8; 7];
        let data = Repr {
            seq: 0x0102_0304,
            repair: false,
        };
        data.emit(&mut b);
        assert_eq!(b[..5], [0xB3, 1, 2, 3, 4]);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(Repr::parse(&p), Ok(data));
        assert_eq!(p.payload().len(), 2);
        assert_eq!(
            Packet::new_checked(&b[..4]).unwrap_err(),
            WireError::Truncated
        );
    }

    #[test]
    fn repair_header_bytes() {
        let mut b = [0u8; 5];
        let r = Repr {
            seq: 7,
            repair: true,
        };
        r.emit(&mut b);
        assert_eq!(b, [0xB6, 0, 0, 0, 7]);
        assert_eq!(Repr::parse(&Packet::new_checked(&b[..]).unwrap()), Ok(r));
        b[0] = 0xB1;
        assert_eq!(
            Repr::parse(&Packet::new_checked(&b[..]).unwrap()),
            Err(WireError::Invalid)
        );
    }

    #[test]
    fn extension_crosses_the_wrap() {
        assert_eq!(extend(5, 3), 5);
        assert_eq!(extend(2, 10), 2);
        let e = (1u64 << 32) - 2;
        assert_eq!(extend(1, e), (1u64 << 32) + 1);
        assert_eq!(extend(u32::MAX, 1u64 << 32), (1u64 << 32) - 1);
        assert_eq!(extend(u32::MAX, 0), 0);
    }
}
