//! Credit and credit-check messages (seed 004 §5, the Credit Update Protocol), first
//! byte `0xB7`.
//!
//! Credits flow from the receiver of a flow-controlled unit (a channel, or a relayed
//! flow) back to its sender; credit checks flow with the data, from the sender to the
//! receiver, on the same FIFO path as the data they account for. All integers are
//! big-endian. Counters are wrap-around 32-bit values (the paper's footnote 2: "the
//! count need only be large enough to represent several times (N2 + N3)"): each end
//! extends them against its own 64-bit count ([`crate::credit::extend`]).
//!
//! ```text
//!  0        1        2        3
//! +--------+--------+--------+--------+
//! |  0xB7  |version |  kind  | flags  |  kind: 1 credit, 2 credit check
//! +--------+--------+--------+--------+  flags: check only, 0x01 stalled; else 0
//! |              unit (u32)           |  4..8   the flow-controlled unit (channel, flow)
//! +--------+--------+--------+--------+
//! |            counter (u32)          |  8..12  credit: V_r; check: V_s
//! +--------+--------+--------+--------+
//! |          allocation (u32)         | 12..16  credit only: N2 + N3 in force
//! +--------+--------+--------+--------+
//! |            CRC-32C (u32)          | last 4: over every byte before it
//! +--------+--------+--------+--------+
//! ```
//!
//! A credit is 20 bytes, a check 16. A credit's flags byte is zero. The sender's balance after a credit is
//! `allocation - (V_s - V_r)`, the paper's Equation (6). The CRC is the paper's "CRC in
//! each credit cell": property P1 (no overflow) and P3 (a corrupted credit costs only
//! delay) assume corrupted credits are detected. Inside braid's sealed envelope the AEAD
//! tag already does that; the CRC keeps the property in security mode `none`.
//!
//! **In a marker.** A marker's optional credit field ([`super::marker::Repr::credits`])
//! carries one u32: the *credit limit* `V_r + N2 + N3` of the channel the marker travels
//! on, for the *opposite* direction (the marker's sender is the receiver of that
//! direction). The sender's balance is then `limit - V_s`, which is Equation (6) with the
//! allocation folded in: exactly the paper's §6.3 remark that under receiver-oriented
//! adaptation "V_r will increase or decrease in the same way as the credit allocation".

use super::{read_u32, WireError, TYPE_CREDIT, VERSION};

/// Kind byte of a credit.
pub const KIND_CREDIT: u8 = 1;
/// Kind byte of a credit check.
pub const KIND_CHECK: u8 = 2;
/// Check flag: the sender has no credit left for this unit (asks for a credit back).
pub const FLAG_STALLED: u8 = 0x01;
/// Length of a credit.
pub const CREDIT_LEN: usize = 20;
/// Length of a credit check.
pub const CHECK_LEN: usize = 16;

mod field {
    pub const TYPE: usize = 0;
    pub const VERSION: usize = 1;
    pub const KIND: usize = 2;
    pub const FLAGS: usize = 3;
    pub const UNIT: usize = 4;
    pub const COUNTER: usize = 8;
    pub const ALLOCATION: usize = 12;
}

/// CRC-32C (Castagnoli), bitwise: credit messages are rare (one per N2 data units), so
/// a table is not worth its cache lines.
pub fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0x82F6_3B78 & mask);
        }
    }
    !crc
}

fn expected_len(kind: u8) -> Option<usize> {
    match kind {
        KIND_CREDIT => Some(CREDIT_LEN),
        KIND_CHECK => Some(CHECK_LEN),
        _ => None,
    }
}

/// A zero-copy view of a credit or credit check.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap `buffer` without checks.
    pub fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wrap `buffer` and check that every accessor is in bounds.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let p = Packet { buffer };
        p.check_len()?;
        Ok(p)
    }

    /// Check the length against the kind byte.
    pub fn check_len(&self) -> Result<(), WireError> {
        let b = self.buffer.as_ref();
        if b.len() < CHECK_LEN {
            return Err(WireError::Truncated);
        }
        let want = expected_len(b[field::KIND]).ok_or(WireError::Reserved(b[field::KIND]))?;
        match b.len().cmp(&want) {
            core::cmp::Ordering::Less => Err(WireError::Truncated),
            core::cmp::Ordering::Greater => Err(WireError::Trailing),
            core::cmp::Ordering::Equal => Ok(()),
        }
    }

    /// First byte (0xB7).
    pub fn packet_type(&self) -> u8 {
        self.buffer.as_ref()[field::TYPE]
    }
    /// Wire version.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }
    /// Kind: [`KIND_CREDIT`] or [`KIND_CHECK`].
    pub fn kind(&self) -> u8 {
        self.buffer.as_ref()[field::KIND]
    }
    /// The flags byte (zero in a credit; [`FLAG_STALLED`] or zero in a check).
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }
    /// The flow-controlled unit.
    pub fn unit(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::UNIT)
    }
    /// V_r in a credit, V_s in a check (wrap-around).
    pub fn counter(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::COUNTER)
    }
    /// N2 + N3 in force (credits only).
    pub fn allocation(&self) -> Option<u32> {
        (self.kind() == KIND_CREDIT).then(|| read_u32(self.buffer.as_ref(), field::ALLOCATION))
    }
    /// The CRC field.
    pub fn crc(&self) -> u32 {
        let b = self.buffer.as_ref();
        read_u32(b, b.len() - 4)
    }
    /// The CRC computed over the bytes before the CRC field.
    pub fn computed_crc(&self) -> u32 {
        let b = self.buffer.as_ref();
        crc32c(&b[..b.len() - 4])
    }
}

/// A validated credit message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repr {
    /// From the receiver: V_r and the allocation N2 + N3 for `unit`.
    Credit {
        /// The flow-controlled unit.
        unit: u32,
        /// Running total of units forwarded or dropped by the receiver (wraps).
        vr: u32,
        /// N2 + N3 in force for this unit.
        allocation: u32,
    },
    /// From the sender: its V_s for `unit`, so the receiver can account for lost data.
    Check {
        /// The flow-controlled unit.
        unit: u32,
        /// Running total of units forwarded by the sender (wraps).
        vs: u32,
        /// The sender has no credit left: the receiver answers with a credit (the
        /// paper's background audit, which repairs a lost credit when no data flows).
        stalled: bool,
    },
}

impl Repr {
    /// Parse and validate: type, version, kind, reserved byte, length and CRC.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr, WireError> {
        p.check_len()?;
        if p.packet_type() != TYPE_CREDIT {
            return Err(WireError::Invalid);
        }
        if p.version() != VERSION {
            return Err(WireError::Version(p.version()));
        }
        let allowed = if p.kind() == KIND_CHECK {
            FLAG_STALLED
        } else {
            0
        };
        if p.flags() & !allowed != 0 {
            return Err(WireError::Reserved(p.flags()));
        }
        if p.crc() != p.computed_crc() {
            return Err(WireError::Invalid);
        }
        Ok(match p.allocation() {
            Some(allocation) => Repr::Credit {
                unit: p.unit(),
                vr: p.counter(),
                allocation,
            },
            None => Repr::Check {
                unit: p.unit(),
                vs: p.counter(),
                stalled: p.flags() & FLAG_STALLED != 0,
            },
        })
    }

    /// Parse a byte string.
    pub fn parse_bytes(bytes: &[u8]) -> Result<Repr, WireError> {
        Repr::parse(&Packet::new_checked(bytes)?)
    }

    /// Bytes needed by [`Repr::emit`].
    pub fn buffer_len(&self) -> usize {
        match self {
            Repr::Credit { .. } => CREDIT_LEN,
            Repr::Check { .. } => CHECK_LEN,
        }
    }

    /// Write the message into `buf`, which must be exactly [`Repr::buffer_len`] long.
    pub fn emit(&self, buf: &mut [u8]) {
        let (kind, flags, unit, counter) = match *self {
            Repr::Credit { unit, vr, .. } => (KIND_CREDIT, 0, unit, vr),
            Repr::Check { unit, vs, stalled } => (KIND_CHECK, stalled as u8, unit, vs),
        };
        buf[field::TYPE] = TYPE_CREDIT;
        buf[field::VERSION] = VERSION;
        buf[field::KIND] = kind;
        buf[field::FLAGS] = flags;
        buf[field::UNIT..field::UNIT + 4].copy_from_slice(&unit.to_be_bytes());
        buf[field::COUNTER..field::COUNTER + 4].copy_from_slice(&counter.to_be_bytes());
        if let Repr::Credit { allocation, .. } = *self {
            buf[field::ALLOCATION..field::ALLOCATION + 4]
                .copy_from_slice(&allocation.to_be_bytes());
        }
        let end = buf.len() - 4;
        let crc = crc32c(&buf[..end]);
        buf[end..].copy_from_slice(&crc.to_be_bytes());
    }

    /// Emit into a fresh vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.buffer_len()];
        self.emit(&mut v);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_check_value() {
        // The standard check value of CRC-32C (RFC 3720, appendix B.4).
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
    }

    const CREDIT: [u8; 20] = [
        0xB7, 0x01, 0x01, 0x00, // type, version, kind credit, reserved
        0x00, 0x00, 0x00, 0x02, // unit 2
        0xFF, 0xFF, 0xFF, 0xF0, // V_r 2^32 - 16 (about to wrap)
        0x00, 0x00, 0x00, 0x14, // allocation 20
        0x0B, 0xCD, 0x00, 0x3D, // CRC-32C of the 16 bytes before (computed independently)
    ];

    #[test]
    fn credit_bytes() {
        let r = Repr::Credit {
            unit: 2,
            vr: 0xFFFF_FFF0,
            allocation: 20,
        };
        let v = r.to_vec();
        assert_eq!(&v[..16], &CREDIT[..16]);
        assert_eq!(crc32c(&v[..16]).to_be_bytes(), v[16..20]);
        assert_eq!(v, CREDIT.to_vec());
        assert_eq!(Repr::parse_bytes(&CREDIT), Ok(r));
    }

    #[test]
    fn check_bytes() {
        let r = Repr::Check {
            unit: 7,
            vs: 300,
            stalled: true,
        };
        let v = r.to_vec();
        assert_eq!(&v[..12], &[0xB7, 1, 2, 1, 0, 0, 0, 7, 0, 0, 0x01, 0x2C][..]);
        assert_eq!(v.len(), CHECK_LEN);
        assert_eq!(Repr::parse_bytes(&v), Ok(r));
        let mut bad = v.clone();
        bad[3] = 0x02;
        let crc = crc32c(&bad[..12]);
        bad[12..].copy_from_slice(&crc.to_be_bytes());
        assert_eq!(Repr::parse_bytes(&bad), Err(WireError::Reserved(2)));
    }

    #[test]
    fn rejects_bad_input() {
        assert_eq!(Repr::parse_bytes(&CREDIT[..15]), Err(WireError::Truncated));
        assert_eq!(Repr::parse_bytes(&CREDIT[..19]), Err(WireError::Truncated));
        let mut long = CREDIT.to_vec();
        long.push(0);
        assert_eq!(Repr::parse_bytes(&long), Err(WireError::Trailing));
        let mut v = CREDIT;
        v[1] = 9;
        assert_eq!(Repr::parse_bytes(&v), Err(WireError::Version(9)));
        let mut v = CREDIT;
        v[2] = 3;
        assert_eq!(Repr::parse_bytes(&v), Err(WireError::Reserved(3)));
        let mut v = CREDIT;
        v[3] = 1;
        assert_eq!(Repr::parse_bytes(&v), Err(WireError::Reserved(1)));
        let mut v = CREDIT;
        v[0] = 0xB1;
        assert_eq!(Repr::parse_bytes(&v), Err(WireError::Invalid));
    }

    #[test]
    fn every_bit_flip_is_detected() {
        for bytes in [
            CREDIT.to_vec(),
            Repr::Check {
                unit: 1,
                vs: 5,
                stalled: false,
            }
            .to_vec(),
        ] {
            for bit in 0..bytes.len() * 8 {
                let mut v = bytes.clone();
                v[bit / 8] ^= 1 << (bit % 8);
                assert!(Repr::parse_bytes(&v).is_err(), "bit {bit} flipped");
            }
        }
    }
}
