//! Marker packets (seed 000 §5): the implicit number of the next packet on a channel.
//!
//! ```text
//!  0        1        2        3
//! +--------+--------+--------+--------+
//! |  0xB1  |version | channel| flags  |  flags: 0x01 credits, 0x02 quantum change,
//! +--------+--------+--------+--------+         0x04 send time
//! +--------+--------+--------+--------+
//! |              epoch (u32)          |  4..8    channel-set epoch (0 until failover)
//! +--------+--------+--------+--------+
//! |            round (u64)            |  8..16   round of the next packet on channel
//! |                                   |
//! +--------+--------+--------+--------+
//! |              dc (i64)             | 16..24   its deficit counter, quantum added
//! |                                   |
//! +--------+--------+--------+--------+
//! |              sent (u64)           | 24..32   data packets sent, on all channels,
//! |                                   |          before this marker
//! |                                   |
//! +--------+--------+--------+--------+
//! |             batch (u32)           | 32..36   counts the sender's marker batches:
//! +--------+--------+--------+--------+          the same on every channel for markers
//!                                                 sent together
//! |            credits (u32)          | only if flags & 0x01
//! +--------+--------+--------+--------+
//! |          new quantum (u32)        | only if flags & 0x02: the channel's quantum
//! +--------+--------+--------+--------+ becomes this from round `at_round` on
//! |           at_round (u64)          |
//! |                                   |
//! +--------+--------+--------+--------+
//! |          send time (u64)          | only if flags & 0x04: the sender's clock, µs
//! |                                   | (any origin), when the marker was made; the
//! +--------+--------+--------+--------+ receiver's AQM measures queueing with it
//! ```
//! All integers are big-endian. Unknown flag bits are rejected.

use super::{read_u32, read_u64, WireError, TYPE_MARKER, VERSION};
use crate::sched::Position;

mod field {
    pub const TYPE: usize = 0;
    pub const VERSION: usize = 1;
    pub const CHANNEL: usize = 2;
    pub const FLAGS: usize = 3;
    pub const EPOCH: usize = 4;
    pub const ROUND: usize = 8;
    pub const DC: usize = 16;
    pub const SENT: usize = 24;
    pub const BATCH: usize = 32;
    pub const FIXED_END: usize = 36;
}

/// Flag: a credits field follows.
pub const FLAG_CREDITS: u8 = 0x01;
/// Flag: a quantum change follows.
pub const FLAG_QUANTUM: u8 = 0x02;
/// Flag: the sender's clock follows.
pub const FLAG_STAMP: u8 = 0x04;
const KNOWN_FLAGS: u8 = FLAG_CREDITS | FLAG_QUANTUM | FLAG_STAMP;

/// Length of a marker with no optional fields.
pub const MIN_LEN: usize = field::FIXED_END;

fn expected_len(flags: u8) -> usize {
    let mut n = field::FIXED_END;
    if flags & FLAG_CREDITS != 0 {
        n += 4;
    }
    if flags & FLAG_QUANTUM != 0 {
        n += 12;
    }
    if flags & FLAG_STAMP != 0 {
        n += 8;
    }
    n
}

/// A zero-copy view of a marker.
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

    /// Check the length against the fixed part and the flags.
    pub fn check_len(&self) -> Result<(), WireError> {
        let b = self.buffer.as_ref();
        if b.len() < field::FIXED_END {
            return Err(WireError::Truncated);
        }
        let want = expected_len(b[field::FLAGS] & KNOWN_FLAGS);
        match b.len().cmp(&want) {
            core::cmp::Ordering::Less => Err(WireError::Truncated),
            core::cmp::Ordering::Greater => Err(WireError::Trailing),
            core::cmp::Ordering::Equal => Ok(()),
        }
    }

    /// First byte (0xB1 for a marker).
    pub fn packet_type(&self) -> u8 {
        self.buffer.as_ref()[field::TYPE]
    }
    /// Wire version.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }
    /// Sender's channel number.
    pub fn channel(&self) -> u8 {
        self.buffer.as_ref()[field::CHANNEL]
    }
    /// Flag bits.
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }
    /// Channel-set epoch.
    pub fn epoch(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::EPOCH)
    }
    /// Round of the next packet on this channel.
    pub fn round(&self) -> u64 {
        read_u64(self.buffer.as_ref(), field::ROUND)
    }
    /// Deficit counter of the next packet, quantum included.
    pub fn dc(&self) -> i64 {
        read_u64(self.buffer.as_ref(), field::DC) as i64
    }
    /// Data packets the sender had sent (on all channels) before this marker.
    pub fn sent(&self) -> u64 {
        read_u64(self.buffer.as_ref(), field::SENT)
    }
    /// The sender's batch counter (markers sent together share it).
    pub fn batch(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::BATCH)
    }
    fn optional_at(&self, flag: u8) -> usize {
        let mut at = field::FIXED_END;
        if flag > FLAG_CREDITS && self.flags() & FLAG_CREDITS != 0 {
            at += 4;
        }
        if flag > FLAG_QUANTUM && self.flags() & FLAG_QUANTUM != 0 {
            at += 12;
        }
        at
    }
    /// Credits, if present.
    pub fn credits(&self) -> Option<u32> {
        (self.flags() & FLAG_CREDITS != 0)
            .then(|| read_u32(self.buffer.as_ref(), self.optional_at(FLAG_CREDITS)))
    }
    /// Quantum change `(new quantum, from round)`, if present.
    pub fn quantum_change(&self) -> Option<(u32, u64)> {
        (self.flags() & FLAG_QUANTUM != 0).then(|| {
            let at = self.optional_at(FLAG_QUANTUM);
            let b = self.buffer.as_ref();
            (read_u32(b, at), read_u64(b, at + 4))
        })
    }
    /// The sender's clock when it made the marker (µs, any origin), if present.
    pub fn stamp(&self) -> Option<u64> {
        (self.flags() & FLAG_STAMP != 0)
            .then(|| read_u64(self.buffer.as_ref(), self.optional_at(FLAG_STAMP)))
    }
}

/// A validated marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Sender's channel number.
    pub channel: u8,
    /// Channel-set epoch.
    pub epoch: u32,
    /// Implicit number of the next packet on this channel.
    pub position: Position,
    /// Data packets sent before this marker, on all channels (in `seq` mode: the
    /// sequence number of the next data packet).
    pub sent: u64,
    /// Batch counter: markers sent together on all channels share it.
    pub batch: u32,
    /// Piggybacked credits (seed 000 §6.3, seed 004).
    pub credits: Option<u32>,
    /// `(quantum, at_round)`: the channel's quantum changes from that round on.
    pub quantum_change: Option<(u32, u64)>,
    /// The sender's clock (µs, any origin) when it made the marker.
    pub stamp: Option<u64>,
}

impl Repr {
    /// Parse and validate a marker.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr, WireError> {
        p.check_len()?;
        if p.packet_type() != TYPE_MARKER {
            return Err(WireError::Invalid);
        }
        if p.version() != VERSION {
            return Err(WireError::Version(p.version()));
        }
        if p.flags() & !KNOWN_FLAGS != 0 {
            return Err(WireError::Reserved(p.flags()));
        }
        if p.dc() <= 0 {
            return Err(WireError::Invalid);
        }
        if let Some((q, _)) = p.quantum_change() {
            if q == 0 {
                return Err(WireError::Invalid);
            }
        }
        Ok(Repr {
            channel: p.channel(),
            epoch: p.epoch(),
            position: Position {
                round: p.round(),
                dc: p.dc(),
            },
            sent: p.sent(),
            batch: p.batch(),
            credits: p.credits(),
            quantum_change: p.quantum_change(),
            stamp: p.stamp(),
        })
    }

    fn flags(&self) -> u8 {
        let mut f = 0;
        if self.credits.is_some() {
            f |= FLAG_CREDITS;
        }
        if self.quantum_change.is_some() {
            f |= FLAG_QUANTUM;
        }
        if self.stamp.is_some() {
            f |= FLAG_STAMP;
        }
        f
    }

    /// Bytes needed by [`Repr::emit`].
    pub fn buffer_len(&self) -> usize {
        expected_len(self.flags())
    }

    /// Write the marker into `buf`, which must be exactly [`Repr::buffer_len`] long.
    pub fn emit(&self, buf: &mut [u8]) {
        let flags = self.flags();
        buf[field::TYPE] = TYPE_MARKER;
        buf[field::VERSION] = VERSION;
        buf[field::CHANNEL] = self.channel;
        buf[field::FLAGS] = flags;
        buf[field::EPOCH..field::EPOCH + 4].copy_from_slice(&self.epoch.to_be_bytes());
        buf[field::ROUND..field::ROUND + 8].copy_from_slice(&self.position.round.to_be_bytes());
        buf[field::DC..field::DC + 8].copy_from_slice(&self.position.dc.to_be_bytes());
        buf[field::SENT..field::SENT + 8].copy_from_slice(&self.sent.to_be_bytes());
        buf[field::BATCH..field::BATCH + 4].copy_from_slice(&self.batch.to_be_bytes());
        let mut at = field::FIXED_END;
        if let Some(c) = self.credits {
            buf[at..at + 4].copy_from_slice(&c.to_be_bytes());
            at += 4;
        }
        if let Some((q, r)) = self.quantum_change {
            buf[at..at + 4].copy_from_slice(&q.to_be_bytes());
            buf[at + 4..at + 12].copy_from_slice(&r.to_be_bytes());
            at += 12;
        }
        if let Some(t) = self.stamp {
            buf[at..at + 8].copy_from_slice(&t.to_be_bytes());
        }
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

    const BYTES: [u8; 36] = [
        0xB1, 0x01, 0x02, 0x00, // type, version, channel 2, no flags
        0x00, 0x00, 0x00, 0x07, // epoch 7
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, // round 256
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, 0xDC, // dc 1500
        0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, // sent 65536
        0x00, 0x00, 0x00, 0x2A, // batch 42
    ];

    fn repr() -> Repr {
        Repr {
            channel: 2,
            epoch: 7,
            position: Position {
                round: 256,
                dc: 1500,
            },
            sent: 65536,
            batch: 42,
            credits: None,
            quantum_change: None,
            stamp: None,
        }
    }

    #[test]
    fn parse_bytes() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap(), repr());
    }

    #[test]
    fn emit_bytes() {
        assert_eq!(repr().to_vec(), BYTES.to_vec());
    }

    #[test]
    fn optional_fields_roundtrip() {
        let r = Repr {
            credits: Some(99),
            quantum_change: Some((3000, 1234)),
            ..repr()
        };
        let v = r.to_vec();
        assert_eq!(v.len(), 52);
        assert_eq!(v[3], 0x03);
        assert_eq!(&v[36..40], &[0, 0, 0, 99]);
        let p = Packet::new_checked(&v[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap(), r);
    }

    #[test]
    fn stamp_goes_last_after_any_other_optional_field() {
        let r = Repr {
            stamp: Some(0x0102_0304_0506_0708),
            ..repr()
        };
        let v = r.to_vec();
        assert_eq!(v.len(), 44);
        assert_eq!(v[3], 0x04);
        assert_eq!(&v[36..44], &[1, 2, 3, 4, 5, 6, 7, 8]);
        let p = Packet::new_checked(&v[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap(), r);
        let all = Repr {
            credits: Some(7),
            quantum_change: Some((3000, 9)),
            stamp: Some(42),
            ..repr()
        };
        let v = all.to_vec();
        assert_eq!(v.len(), 36 + 4 + 12 + 8);
        assert_eq!(v[3], 0x07);
        assert_eq!(&v[52..60], &[0, 0, 0, 0, 0, 0, 0, 42]);
        let p = Packet::new_checked(&v[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap(), all);
        // Flag set but the field missing: truncated.
        let mut short = r.to_vec();
        short.truncate(40);
        assert_eq!(
            Packet::new_checked(&short[..]).unwrap_err(),
            WireError::Truncated
        );
    }

    #[test]
    fn rejects_bad_input() {
        assert_eq!(
            Packet::new_checked(&BYTES[..35]).unwrap_err(),
            WireError::Truncated
        );
        let mut long = BYTES.to_vec();
        long.push(0);
        assert_eq!(
            Packet::new_checked(&long[..]).unwrap_err(),
            WireError::Trailing
        );
        let mut v = BYTES;
        v[1] = 9;
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&v[..])),
            Err(WireError::Version(9))
        );
        let mut v = BYTES;
        v[3] = 0x80;
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&v[..])),
            Err(WireError::Reserved(0x80))
        );
        let mut v = BYTES;
        v[22] = 0;
        v[23] = 0;
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&v[..])),
            Err(WireError::Invalid)
        );
    }
}
