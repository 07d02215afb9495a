//! Error-control packets ([`crate::errctl`], seed 002, Gong & Parulkar §4.1): data with a
//! shipment sequence number and its place in a segment, keep-alive and end-of-stream
//! packets that give the receiver the context to detect losses, and the receiver's
//! selective negative (SNAK) and periodic positive (PACK) acknowledgements.
//!
//! Data, keep-alive and end-of-stream (sender to receiver), 14 bytes then the payload:
//!
//! ```text
//!  0        1        2        3
//! +--------+--------+--------+--------+
//! |  0xBC  |  kind  | segment length  |  kind 0 data, 1 keep-alive, 2 end of stream
//! +--------+--------+--------+--------+
//! |      shipment sequence (u32)      |  4..8: one per datagram sent, new or again
//! +--------+--------+--------+--------+
//! |       segment number (u32)        |  8..12
//! +--------+--------+--------+--------+
//! |  packet index   |  payload ...       12..14, then data only
//! +--------+--------+-----------------
//! ```
//!
//! The segment length is the sender's W (packets per segment); the packet index is below
//! it. A keep-alive or end-of-stream packet has no payload and names the last data packet
//! first sent (segment number and index). Numbers wrap at 2^32 and are extended by the
//! receiver to the value nearest the one it expects ([`super::seq::extend`]).
//!
//! SNAK (receiver to sender), 12 bytes then 1 to [`MAX_RANGES`] ranges:
//!
//! ```text
//! +--------+--------+--------+--------+
//! |  0xBD  |version |  range count    |
//! +--------+--------+--------+--------+
//! |   cumulative ack: next segment    |  4..8: every segment below it is accepted
//! +--------+--------+--------+--------+
//! |       segment number (u32)        |  8..12: the segment the ranges are in
//! +--------+--------+--------+--------+
//! |  first index    |   last index    |  12..16, one range every 4 bytes, inclusive
//! +--------+--------+--------+--------+
//! ```
//!
//! PACK (receiver to sender), 12 bytes:
//!
//! ```text
//! +--------+--------+--------+--------+
//! |  0xBE  |version |    0    |   0   |
//! +--------+--------+--------+--------+
//! |   cumulative ack: next segment    |
//! +--------+--------+--------+--------+
//! |   accepted segment number (u32)   |
//! +--------+--------+--------+--------+
//! ```

use super::{read_u32, WireError, TYPE_ERRCTL_DATA, TYPE_PACK, TYPE_SNAK, VERSION};

/// Bytes in front of the payload of a data packet.
pub const DATA_HEADER_LEN: usize = 14;
/// Fixed part of a SNAK.
pub const SNAK_FIXED: usize = 12;
/// Length of a PACK.
pub const PACK_LEN: usize = 12;
/// Most ranges in one SNAK.
pub const MAX_RANGES: usize = 64;

/// What a sender-to-receiver packet is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataKind {
    /// Application data.
    Data,
    /// The sender is idle (window full or no data): context for gap detection.
    KeepAlive,
    /// The stream ends after the named packet.
    End,
}

impl DataKind {
    fn code(self) -> u8 {
        match self {
            DataKind::Data => 0,
            DataKind::KeepAlive => 1,
            DataKind::End => 2,
        }
    }
    fn from_code(b: u8) -> Option<DataKind> {
        Some(match b {
            0 => DataKind::Data,
            1 => DataKind::KeepAlive,
            2 => DataKind::End,
            _ => return None,
        })
    }
}

/// A zero-copy view of a data, keep-alive or end-of-stream packet.
#[derive(Debug, Clone, Copy)]
pub struct DataPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> DataPacket<T> {
    /// Wrap and check the length.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let p = DataPacket { buffer };
        p.check_len()?;
        Ok(p)
    }
    /// At least the header must be present.
    pub fn check_len(&self) -> Result<(), WireError> {
        if self.buffer.as_ref().len() < DATA_HEADER_LEN {
            Err(WireError::Truncated)
        } else {
            Ok(())
        }
    }
    /// The kind byte.
    pub fn kind_byte(&self) -> u8 {
        self.buffer.as_ref()[1]
    }
    /// Packets per segment.
    pub fn segment_len(&self) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_be_bytes([b[2], b[3]])
    }
    /// Wrapped shipment sequence number.
    pub fn shipment(&self) -> u32 {
        read_u32(self.buffer.as_ref(), 4)
    }
    /// Wrapped segment number.
    pub fn segment(&self) -> u32 {
        read_u32(self.buffer.as_ref(), 8)
    }
    /// Index of the packet in its segment.
    pub fn index(&self) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_be_bytes([b[12], b[13]])
    }
    /// The payload after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[DATA_HEADER_LEN..]
    }
}

/// The data header as a validated value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataRepr {
    /// Data, keep-alive or end of stream.
    pub kind: DataKind,
    /// Packets per segment (W), at least 1.
    pub segment_len: u16,
    /// Wrapped shipment sequence number.
    pub shipment: u32,
    /// Wrapped segment number.
    pub segment: u32,
    /// Packet index, below `segment_len`.
    pub index: u16,
}

impl DataRepr {
    /// Parse and validate a header (the payload is [`DataPacket::payload`]).
    pub fn parse<T: AsRef<[u8]>>(p: &DataPacket<T>) -> Result<DataRepr, WireError> {
        p.check_len()?;
        if p.buffer.as_ref()[0] != TYPE_ERRCTL_DATA {
            return Err(WireError::Invalid);
        }
        let kind = DataKind::from_code(p.kind_byte()).ok_or(WireError::Reserved(p.kind_byte()))?;
        if kind != DataKind::Data && !p.payload().is_empty() {
            return Err(WireError::Trailing);
        }
        let r = DataRepr {
            kind,
            segment_len: p.segment_len(),
            shipment: p.shipment(),
            segment: p.segment(),
            index: p.index(),
        };
        if r.segment_len == 0 || r.index >= r.segment_len {
            return Err(WireError::Invalid);
        }
        Ok(r)
    }
    /// Header bytes.
    pub fn buffer_len(&self) -> usize {
        DATA_HEADER_LEN
    }
    /// Write the header into the first [`DATA_HEADER_LEN`] bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) {
        buf[0] = TYPE_ERRCTL_DATA;
        buf[1] = self.kind.code();
        buf[2..4].copy_from_slice(&self.segment_len.to_be_bytes());
        buf[4..8].copy_from_slice(&self.shipment.to_be_bytes());
        buf[8..12].copy_from_slice(&self.segment.to_be_bytes());
        buf[12..14].copy_from_slice(&self.index.to_be_bytes());
    }
    /// The header followed by `payload`, as one datagram.
    pub fn to_vec(&self, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8; DATA_HEADER_LEN + payload.len()];
        self.emit(&mut v);
        v[DATA_HEADER_LEN..].copy_from_slice(payload);
        v
    }
}

/// A validated SNAK: packets of one segment to send again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnakRepr {
    /// Every segment below this one is accepted (wrapped).
    pub cum_ack: u32,
    /// The segment the ranges are in (wrapped).
    pub segment: u32,
    /// Inclusive packet-index ranges, as sent (the sender validates their meaning).
    pub ranges: Vec<(u16, u16)>,
}

impl SnakRepr {
    /// Parse a SNAK. Only the framing is checked here; whether the ranges are ordered
    /// and name packets that were sent is the sender's check (it knows what it sent).
    pub fn parse(b: &[u8]) -> Result<SnakRepr, WireError> {
        if b.len() < SNAK_FIXED {
            return Err(WireError::Truncated);
        }
        if b[0] != TYPE_SNAK {
            return Err(WireError::Invalid);
        }
        if b[1] != VERSION {
            return Err(WireError::Version(b[1]));
        }
        let count = u16::from_be_bytes([b[2], b[3]]) as usize;
        if count == 0 || count > MAX_RANGES {
            return Err(WireError::Invalid);
        }
        match b.len().cmp(&(SNAK_FIXED + 4 * count)) {
            core::cmp::Ordering::Less => return Err(WireError::Truncated),
            core::cmp::Ordering::Greater => return Err(WireError::Trailing),
            core::cmp::Ordering::Equal => {}
        }
        let ranges = (0..count)
            .map(|i| {
                let at = SNAK_FIXED + 4 * i;
                (
                    u16::from_be_bytes([b[at], b[at + 1]]),
                    u16::from_be_bytes([b[at + 2], b[at + 3]]),
                )
            })
            .collect();
        Ok(SnakRepr {
            cum_ack: read_u32(b, 4),
            segment: read_u32(b, 8),
            ranges,
        })
    }
    /// Encoded length.
    pub fn buffer_len(&self) -> usize {
        SNAK_FIXED + 4 * self.ranges.len().min(MAX_RANGES)
    }
    /// Encode (at most [`MAX_RANGES`] ranges are written).
    pub fn to_vec(&self) -> Vec<u8> {
        let n = self.ranges.len().min(MAX_RANGES);
        let mut v = Vec::with_capacity(self.buffer_len());
        v.push(TYPE_SNAK);
        v.push(VERSION);
        v.extend_from_slice(&(n as u16).to_be_bytes());
        v.extend_from_slice(&self.cum_ack.to_be_bytes());
        v.extend_from_slice(&self.segment.to_be_bytes());
        for (a, z) in &self.ranges[..n] {
            v.extend_from_slice(&a.to_be_bytes());
            v.extend_from_slice(&z.to_be_bytes());
        }
        v
    }
}

/// A validated PACK: one segment accepted, and every one below `cum_ack`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackRepr {
    /// Every segment below this one is accepted (wrapped).
    pub cum_ack: u32,
    /// A segment accepted (possibly above `cum_ack`, out of order).
    pub segment: u32,
}

impl PackRepr {
    /// Parse a PACK.
    pub fn parse(b: &[u8]) -> Result<PackRepr, WireError> {
        match b.len().cmp(&PACK_LEN) {
            core::cmp::Ordering::Less => return Err(WireError::Truncated),
            core::cmp::Ordering::Greater => return Err(WireError::Trailing),
            core::cmp::Ordering::Equal => {}
        }
        if b[0] != TYPE_PACK {
            return Err(WireError::Invalid);
        }
        if b[1] != VERSION {
            return Err(WireError::Version(b[1]));
        }
        if b[2] != 0 || b[3] != 0 {
            return Err(WireError::Reserved(b[2] | b[3]));
        }
        Ok(PackRepr {
            cum_ack: read_u32(b, 4),
            segment: read_u32(b, 8),
        })
    }
    /// Encoded length.
    pub fn buffer_len(&self) -> usize {
        PACK_LEN
    }
    /// Encode.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(PACK_LEN);
        v.extend_from_slice(&[TYPE_PACK, VERSION, 0, 0]);
        v.extend_from_slice(&self.cum_ack.to_be_bytes());
        v.extend_from_slice(&self.segment.to_be_bytes());
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_vector() {
        let r = DataRepr {
            kind: DataKind::Data,
            segment_len: 256,
            shipment: 0x0102_0304,
            segment: 7,
            index: 255,
        };
        let v = r.to_vec(b"hi");
        assert_eq!(
            v,
            vec![
                0xBC, 0, 1, 0, // type, data, W = 256
                1, 2, 3, 4, // shipment
                0, 0, 0, 7, // segment 7
                0, 255, b'h', b'i', // index 255, payload
            ]
        );
        let p = DataPacket::new_checked(&v[..]).unwrap();
        assert_eq!(DataRepr::parse(&p), Ok(r));
        assert_eq!(p.payload(), b"hi");
    }

    #[test]
    fn data_rejects_bad_input() {
        assert_eq!(
            DataPacket::new_checked(&[0xBC, 0, 1][..]).err(),
            Some(WireError::Truncated)
        );
        let ok = DataRepr {
            kind: DataKind::KeepAlive,
            segment_len: 4,
            shipment: 1,
            segment: 1,
            index: 3,
        }
        .to_vec(&[]);
        let parse = |b: &[u8]| DataRepr::parse(&DataPacket::new_checked(b)?);
        assert!(parse(&ok).is_ok());
        let mut bad = ok.clone();
        bad[1] = 3; // unknown kind
        assert_eq!(parse(&bad), Err(WireError::Reserved(3)));
        let mut bad = ok.clone();
        bad[13] = 4; // index == W
        assert_eq!(parse(&bad), Err(WireError::Invalid));
        let mut bad = ok.clone();
        bad[2] = 0;
        bad[3] = 0; // W = 0
        assert_eq!(parse(&bad), Err(WireError::Invalid));
        let mut bad = ok.clone();
        bad.push(9); // a keep-alive with a payload
        assert_eq!(parse(&bad), Err(WireError::Trailing));
        let mut bad = ok;
        bad[0] = 0xB3;
        assert_eq!(parse(&bad), Err(WireError::Invalid));
    }

    #[test]
    fn snak_vector() {
        let r = SnakRepr {
            cum_ack: 3,
            segment: 5,
            ranges: vec![(0, 2), (10, 10)],
        };
        let v = r.to_vec();
        assert_eq!(
            v,
            vec![
                0xBD, 1, 0, 2, // type, version, 2 ranges
                0, 0, 0, 3, // cumulative ack
                0, 0, 0, 5, // segment
                0, 0, 0, 2, // 0..=2
                0, 10, 0, 10, // 10..=10
            ]
        );
        assert_eq!(v.len(), r.buffer_len());
        assert_eq!(SnakRepr::parse(&v), Ok(r));
    }

    #[test]
    fn snak_rejects_bad_input() {
        assert_eq!(SnakRepr::parse(&[0xBD, 1, 0]), Err(WireError::Truncated));
        let mut zero = vec![0xBD, 1, 0, 0];
        zero.extend_from_slice(&[0; 8]);
        assert_eq!(SnakRepr::parse(&zero), Err(WireError::Invalid));
        let mut many = vec![0xBD, 1, 0, 65];
        many.extend_from_slice(&[0; 8 + 4 * 65]);
        assert_eq!(SnakRepr::parse(&many), Err(WireError::Invalid));
        let mut v = SnakRepr {
            cum_ack: 0,
            segment: 0,
            ranges: vec![(1, 1)],
        }
        .to_vec();
        v.push(0);
        assert_eq!(SnakRepr::parse(&v), Err(WireError::Trailing));
        v.truncate(14);
        assert_eq!(SnakRepr::parse(&v), Err(WireError::Truncated));
        let mut v2 = SnakRepr {
            cum_ack: 0,
            segment: 0,
            ranges: vec![(1, 1)],
        }
        .to_vec();
        v2[1] = 9;
        assert_eq!(SnakRepr::parse(&v2), Err(WireError::Version(9)));
    }

    #[test]
    fn pack_vector() {
        let r = PackRepr {
            cum_ack: 0x0A0B_0C0D,
            segment: 0x0A0B_0C0E,
        };
        let v = r.to_vec();
        assert_eq!(v, vec![0xBE, 1, 0, 0, 10, 11, 12, 13, 10, 11, 12, 14]);
        assert_eq!(PackRepr::parse(&v), Ok(r));
        assert_eq!(PackRepr::parse(&v[..11]), Err(WireError::Truncated));
        let mut bad = v.clone();
        bad.push(0);
        assert_eq!(PackRepr::parse(&bad), Err(WireError::Trailing));
        let mut bad = v.clone();
        bad[3] = 1;
        assert_eq!(PackRepr::parse(&bad), Err(WireError::Reserved(1)));
        let mut bad = v;
        bad[0] = 0xBD;
        assert_eq!(PackRepr::parse(&bad), Err(WireError::Invalid));
    }
}
