//! TRR trigger packets (seed 001): sent on every channel every N data packets, they name
//! the stripe to read next and carry a high-level sequence number, which lets the
//! receiver verify a whole segment of header-free packets before releasing it in order.
//!
//! ```text
//!  0        1        2        3
//! +--------+--------+--------+--------+
//! |  0xB2  |version | channel|  next  |  next: the channel of the next data packet
//! +--------+--------+--------+--------+
//! |              epoch (u32)          |  4..8
//! +--------+--------+--------+--------+
//! |            round (u64)            |  8..16   implicit number of the next packet
//! |                                   |          on this channel: round ...
//! +--------+--------+--------+--------+
//! |              dc (i64)             | 16..24   ... and deficit counter
//! |                                   |
//! +--------+--------+--------+--------+
//! |              sent (u64)           | 24..32   data packets sent, on all channels,
//! |                                   |          before this trigger
//! +--------+--------+--------+--------+
//! |          channel count (u64)      | 32..40   data packets sent on this channel
//! |                                   |          before this trigger
//! +--------+--------+--------+--------+
//! |             digest (u64)          | 40..48   running digest of the data packets
//! |                                   |          sent on this channel (see below)
//! +--------+--------+--------+--------+
//! |             batch (u32)           | 48..52   the sender's batch counter, shared
//! +--------+--------+--------+--------+          with markers
//! |          send time (u64)          | 52..60   optional: the sender's clock, µs (any
//! |                                   |          origin), as in markers (AQM)
//! +--------+--------+--------+--------+
//! |           quantum (u32)           | last 4   optional: the channel's SRR quantum
//! +--------+--------+--------+--------+          from this trigger on (adaptive weights)
//! ```
//!
//! A trigger is 52 bytes; 60 with the send time; 56 with the quantum; 64 with both (the
//! send time at 52..60, the quantum at 60..64). Its length says which fields follow.
//!
//! The quantum is there once the sender has changed its quanta (adaptive weights), on
//! every trigger from then on, so a lost one is made good by the next. The sender
//! changes a channel's quantum only when it sends a trigger batch; the quantum is added
//! with its new value from the first end of a visit after the trigger, at both ends:
//! the receiver reads the trigger before any data sent after it (channels are FIFO), so
//! its numbering of the channel's packets stays the sender's.
//!
//! The digest lets the receiver tell a segment that lost one packet and had another
//! duplicated (same count, same byte total) from an intact one. It is folded over the
//! channel's data packets in order: `digest = mix(digest ^ fingerprint(packet))`, where
//! the fingerprint mixes the packet's wire length with its first sixteen and last eight
//! payload bytes and `mix` is the SplitMix64 finalizer (see [`fingerprint`] and [`fold`]).

use super::{read_u32, read_u64, WireError, TYPE_TRIGGER, VERSION};
use crate::sched::Position;

/// Length of a trigger.
pub const LEN: usize = 52;
/// Length of a trigger with the send time.
pub const LEN_STAMPED: usize = LEN + 8;
/// Bytes of the optional quantum, at the end.
const QUANTUM_LEN: usize = 4;

/// The fingerprint of one data packet: its wire length and its first sixteen and last
/// eight payload bytes, mixed. (For IP packets the first sixteen bytes hold the length,
/// the identification field and the checksum, which differ between packets.)
#[inline]
pub fn fingerprint(wire_len: usize, payload: &[u8]) -> u64 {
    fn word(b: &[u8]) -> u64 {
        let mut a = [0u8; 8];
        a[..b.len()].copy_from_slice(b);
        u64::from_be_bytes(a)
    }
    let mix = crate::rng::splitmix64;
    let n = payload.len();
    let h0 = word(&payload[..n.min(8)]);
    let h1 = word(&payload[n.min(8)..n.min(16)]);
    let t = word(&payload[n - n.min(8)..]);
    mix(mix(mix(t ^ wire_len as u64) ^ h1) ^ h0)
}

/// Fold one packet's fingerprint into a channel's running digest.
#[inline]
pub fn fold(digest: u64, fingerprint: u64) -> u64 {
    crate::rng::splitmix64(digest ^ fingerprint)
}

/// A zero-copy view of a trigger.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap `buffer` without checks.
    pub fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }
    /// Wrap `buffer` and check its length.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let p = Packet { buffer };
        p.check_len()?;
        Ok(p)
    }
    /// Check the length (52; 60 with the send time; 56 and 64 with the quantum too).
    pub fn check_len(&self) -> Result<(), WireError> {
        const WITH_QUANTUM: usize = LEN + QUANTUM_LEN;
        const ALL: usize = LEN_STAMPED + QUANTUM_LEN;
        match self.buffer.as_ref().len() {
            LEN | WITH_QUANTUM | LEN_STAMPED | ALL => Ok(()),
            n if n < ALL => Err(WireError::Truncated),
            _ => Err(WireError::Trailing),
        }
    }
    fn has_stamp(&self) -> bool {
        self.buffer.as_ref().len() >= LEN_STAMPED
    }
    fn has_quantum(&self) -> bool {
        (self.buffer.as_ref().len() - LEN) % 8 == QUANTUM_LEN
    }
    /// First byte (0xB2).
    pub fn packet_type(&self) -> u8 {
        self.buffer.as_ref()[0]
    }
    /// Wire version.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[1]
    }
    /// Channel this trigger was sent on.
    pub fn channel(&self) -> u8 {
        self.buffer.as_ref()[2]
    }
    /// Channel of the next data packet.
    pub fn next_stripe(&self) -> u8 {
        self.buffer.as_ref()[3]
    }
    /// Channel-set epoch.
    pub fn epoch(&self) -> u32 {
        read_u32(self.buffer.as_ref(), 4)
    }
    /// Round of the next packet on this channel.
    pub fn round(&self) -> u64 {
        read_u64(self.buffer.as_ref(), 8)
    }
    /// Deficit counter of the next packet on this channel.
    pub fn dc(&self) -> i64 {
        read_u64(self.buffer.as_ref(), 16) as i64
    }
    /// Data packets sent, on all channels, before this trigger.
    pub fn sent(&self) -> u64 {
        read_u64(self.buffer.as_ref(), 24)
    }
    /// Data packets sent on this channel before the trigger.
    pub fn channel_count(&self) -> u64 {
        read_u64(self.buffer.as_ref(), 32)
    }
    /// Running digest of this channel's data packets.
    pub fn digest(&self) -> u64 {
        read_u64(self.buffer.as_ref(), 40)
    }
    /// The sender's batch counter.
    pub fn batch(&self) -> u32 {
        read_u32(self.buffer.as_ref(), 48)
    }
    /// The sender's clock when it made the trigger, if present.
    pub fn stamp(&self) -> Option<u64> {
        self.has_stamp()
            .then(|| read_u64(self.buffer.as_ref(), LEN))
    }
    /// The channel's quantum from this trigger on, if present.
    pub fn quantum(&self) -> Option<u32> {
        let b = self.buffer.as_ref();
        self.has_quantum()
            .then(|| read_u32(b, b.len() - QUANTUM_LEN))
    }
}

/// A validated trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Channel the trigger was sent on.
    pub channel: u8,
    /// Channel that carries the next data packet.
    pub next_stripe: u8,
    /// Channel-set epoch.
    pub epoch: u32,
    /// Implicit number of the next packet on this channel.
    pub position: Position,
    /// Data packets sent, on all channels, before this trigger.
    pub sent: u64,
    /// Data packets sent on this channel before the trigger.
    pub channel_count: u64,
    /// Running digest of this channel's data packets.
    pub digest: u64,
    /// The sender's batch counter (triggers sent together share it).
    pub batch: u32,
    /// The sender's clock (µs, any origin) when it made the trigger.
    pub stamp: Option<u64>,
    /// The channel's SRR quantum from this trigger on (present once the sender has
    /// changed its quanta).
    pub quantum: Option<u32>,
}

impl Repr {
    /// Parse and validate a trigger.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr, WireError> {
        p.check_len()?;
        if p.packet_type() != TYPE_TRIGGER {
            return Err(WireError::Invalid);
        }
        if p.version() != VERSION {
            return Err(WireError::Version(p.version()));
        }
        if p.dc() <= 0 || p.quantum() == Some(0) {
            return Err(WireError::Invalid);
        }
        Ok(Repr {
            channel: p.channel(),
            next_stripe: p.next_stripe(),
            epoch: p.epoch(),
            position: Position {
                round: p.round(),
                dc: p.dc(),
            },
            sent: p.sent(),
            channel_count: p.channel_count(),
            digest: p.digest(),
            batch: p.batch(),
            stamp: p.stamp(),
            quantum: p.quantum(),
        })
    }

    /// Bytes needed by [`Repr::emit`].
    pub fn buffer_len(&self) -> usize {
        let stamp = if self.stamp.is_some() { 8 } else { 0 };
        let quantum = if self.quantum.is_some() {
            QUANTUM_LEN
        } else {
            0
        };
        LEN + stamp + quantum
    }

    /// Write into `buf` (exactly [`Repr::buffer_len`] bytes).
    pub fn emit(&self, buf: &mut [u8]) {
        buf[0] = TYPE_TRIGGER;
        buf[1] = VERSION;
        buf[2] = self.channel;
        buf[3] = self.next_stripe;
        buf[4..8].copy_from_slice(&self.epoch.to_be_bytes());
        buf[8..16].copy_from_slice(&self.position.round.to_be_bytes());
        buf[16..24].copy_from_slice(&self.position.dc.to_be_bytes());
        buf[24..32].copy_from_slice(&self.sent.to_be_bytes());
        buf[32..40].copy_from_slice(&self.channel_count.to_be_bytes());
        buf[40..48].copy_from_slice(&self.digest.to_be_bytes());
        buf[48..52].copy_from_slice(&self.batch.to_be_bytes());
        if let Some(t) = self.stamp {
            buf[LEN..LEN_STAMPED].copy_from_slice(&t.to_be_bytes());
        }
        if let Some(q) = self.quantum {
            let end = buf.len();
            buf[end - QUANTUM_LEN..].copy_from_slice(&q.to_be_bytes());
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

    #[test]
    fn bytes_roundtrip() {
        let r = Repr {
            channel: 1,
            next_stripe: 0,
            epoch: 0,
            position: Position { round: 3, dc: 700 },
            sent: 200,
            channel_count: 99,
            digest: 0x0102_0304_0506_0708,
            batch: 5,
            stamp: None,
            quantum: None,
        };
        let v = r.to_vec();
        let want: [u8; 52] = [
            0xB2, 0x01, 0x01, 0x00, 0, 0, 0, 0, // type, version, channel 1, next 0, epoch
            0, 0, 0, 0, 0, 0, 0, 3, // round 3
            0, 0, 0, 0, 0, 0, 0x02, 0xBC, // dc 700
            0, 0, 0, 0, 0, 0, 0, 200, // sent 200
            0, 0, 0, 0, 0, 0, 0, 99, // channel count 99
            1, 2, 3, 4, 5, 6, 7, 8, // digest
            0, 0, 0, 5, // batch
        ];
        assert_eq!(v, want.to_vec());
        assert_eq!(Repr::parse(&Packet::new_checked(&v[..]).unwrap()), Ok(r));
        // With the send time: 8 more bytes at the end, the rest unchanged.
        let s = Repr {
            stamp: Some(0x1122_3344_5566_7788),
            ..r
        };
        let w = s.to_vec();
        assert_eq!(w.len(), 60);
        assert_eq!(&w[..52], &want[..]);
        assert_eq!(&w[52..], &0x1122_3344_5566_7788u64.to_be_bytes());
        assert_eq!(Repr::parse(&Packet::new_checked(&w[..]).unwrap()), Ok(s));
        // With the quantum: 4 more bytes at the very end.
        for base in [r, s] {
            let q = Repr {
                quantum: Some(3000),
                ..base
            };
            let x = q.to_vec();
            assert_eq!(x.len(), base.to_vec().len() + 4);
            assert_eq!(&x[..x.len() - 4], &base.to_vec()[..]);
            assert_eq!(&x[x.len() - 4..], &3000u32.to_be_bytes());
            assert_eq!(Repr::parse(&Packet::new_checked(&x[..]).unwrap()), Ok(q));
        }
    }

    #[test]
    fn rejects_bad_input() {
        assert_eq!(
            Packet::new_checked(&[0xB2u8; 51][..]).unwrap_err(),
            WireError::Truncated
        );
        assert_eq!(
            Packet::new_checked(&[0xB2u8; 53][..]).unwrap_err(),
            WireError::Truncated
        );
        assert_eq!(
            Packet::new_checked(&[0xB2u8; 61][..]).unwrap_err(),
            WireError::Truncated
        );
        assert_eq!(
            Packet::new_checked(&[0xB2u8; 65][..]).unwrap_err(),
            WireError::Trailing
        );
        // A quantum of 0 is impossible.
        let mut q = [0u8; 56];
        q[0] = 0xB2;
        q[1] = 1;
        q[23] = 1;
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&q[..])),
            Err(WireError::Invalid)
        );
        let mut v = [0u8; 52];
        v[0] = 0xB2;
        v[1] = 1;
        // dc = 0 is impossible
        assert_eq!(
            Repr::parse(&Packet::new_unchecked(&v[..])),
            Err(WireError::Invalid)
        );
    }
}
