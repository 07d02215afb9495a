//! Stream frames: the byte streams of terminated TCP connections ([`crate::stream`]),
//! carried across the bond as payloads of its datagrams, one frame per datagram.
//!
//! # Telling a frame from an inner packet
//!
//! A frame travels in the stripe like an inner IP packet, so its first byte (the frame
//! type) is in `0x01..=0x0F`: its high nibble is 0, which no IPv4 (`0x4_`) or IPv6
//! (`0x6_`) packet and none of braid's control codepoints (`0xB_`) can have. Use
//! [`is_frame`] to route a datagram's payload. Types 8 to 15 are the short DATA frame
//! (its flags in the type's low three bits); type 7 is reserved (a frame of it is
//! malformed). There is no version byte: the session's handshake already refuses a peer
//! of another wire format (handshake version 6 brought the short DATA frame, which an
//! older braid would take for reserved types).
//!
//! # Stream ids without roles
//!
//! Both ends open streams and number their own from 0. A stream is named on the wire by
//! its number and one flag, `O`: set when the stream was opened by the *sender of this
//! frame*, clear when it was opened by its receiver. So the two ends' stream 5 never
//! collide, and neither end needs to be the client ([`WireId`]).
//!
//! # Frames
//!
//! All integers are big-endian. Every frame but the short DATA starts with the same six
//! bytes:
//!
//! ```text
//!  0        1        2        3        4        5
//! +--------+--------+--------+--------+--------+--------+
//! |  type  | flags  |        stream number (u32)        |
//! +--------+--------+--------+--------+--------+--------+
//!  type: 1 OPEN, 2 OPEN_RESULT, 3 DATA, 4 ACK, 5 RESET, 6 RESET_ACK (8 to 15: the
//!        short DATA, below)
//!  flags: 0x80 = O (opened by the sender of this frame); the low bits by type;
//!         every other bit is zero
//! ```
//!
//! **OPEN** (type 1, 24 bytes with two IPv4 addresses, 48 with two IPv6 ones): the
//! opener asks its peer to connect `src` to `dst`. `O` is always set. Sent again until
//! an OPEN_RESULT (or an ACK) answers it.
//!
//! ```text
//!  0: 0x01 | 1: 0x80 | 2..6: stream
//!  6: source family (4 or 6) | 7: destination family (4 or 6)
//!  8..12:  initial credit limit (u32): bytes the acceptor may send before any ACK
//! 12..:    source address (4 or 16 bytes), source port (u16),
//!          then destination address (4 or 16 bytes), destination port (u16)
//! ```
//!
//! **OPEN_RESULT** (type 2, 12 bytes): the answer to an OPEN, sent once per OPEN
//! received (so a lost answer is repaired by the next OPEN). `O` is always clear.
//!
//! ```text
//!  0: 0x02 | 1: 0x00 | 2..6: stream
//!  6: result: 0 accepted, 1 refused, 2 unreachable, 3 not allowed, 4 too many streams
//!  7: zero
//!  8..12:  initial credit limit (u32) for the opener (zero unless accepted)
//! ```
//!
//! **DATA** (type 3, 12 bytes + the stream's bytes): the bytes at `offset` of the
//! stream. An empty DATA without FIN is a probe: its receiver answers with an ACK at
//! once (a sender with no credit asks this way for a credit update that may have been
//! lost). A sender uses it only for a stream numbered 2^24 or above; below, it sends
//! the short DATA.
//!
//! ```text
//!  0        1        2        3        4        5
//! +--------+--------+--------+--------+--------+--------+
//! |  0x03  |O     RF|        stream number (u32)        |
//! +--------+--------+--------+--------+--------+--------+
//! |               offset (u48): of the first byte       |
//! +--------+--------+--------+--------+--------+--------+
//! |  the stream's bytes (zero or more) ...                12..
//!  F 0x01: FIN, the stream ends after these bytes (final size = offset + length)
//!  R 0x02: a retransmission (its receiver tells the sender when it was not needed)
//! ```
//!
//! **Short DATA** (types 8 to 15, 8 bytes + the stream's bytes): the same as a DATA,
//! for a stream numbered below 2^24 and with the offset's low 32 bits only; its flags
//! are the type's low three bits. Four bytes less than a DATA: a full frame on a
//! 1500-byte path carries 1438 bytes of the stream instead of 1434.
//!
//! ```text
//!  0        1        2        3        4        5        6        7
//! +--------+--------+--------+--------+--------+--------+--------+--------+
//! |00001ORF|  stream number (u24)     |  offset, low 32 bits (u32)        |
//! +--------+--------+--------+--------+--------+--------+--------+--------+
//! |  the stream's bytes (zero or more) ...                                    8..
//!  byte 0: 0x08 | O << 2 | R << 1 | F (the high nibble stays 0)
//!  O 0x04: opened by the sender of this frame; R 0x02, F 0x01: as in a DATA
//! ```
//!
//! The receiver takes as the offset the number with these low 32 bits nearest to the
//! stream's cumulative point ([`expand_offset`]; the argument why that is the sender's
//! offset is there). A short DATA whose offset so found plus its length reaches 2^48 is
//! malformed.
//!
//! **ACK** (type 4, 18 + 8 k bytes, k <= [`MAX_SACK`]): what the receiver of a stream
//! holds, and how far its sender may send.
//!
//! ```text
//!  0: 0x04 | 1: O . . . . . S F | 2..6: stream
//!  6..12:  cumulative (u48): every byte below it was received
//! 12..18:  credit limit (u48): the sender may send bytes below it (never decreases)
//! 18..:    k SACK ranges above the cumulative point, lowest first, each
//!          start - cumulative (u32) and length (u32); they do not touch or overlap
//!  F 0x01: the receiver has the FIN (it knows the final size)
//!  S 0x02: a retransmitted DATA arrived whose bytes were all here already
//! ```
//!
//! **RESET** (type 5, 8 bytes): the stream is aborted; its receiver forgets it and
//! answers with a RESET_ACK. Sent again until a RESET_ACK (or the peer's own RESET)
//! comes back, a few times at most.
//!
//! ```text
//!  0: 0x05 | 1: O | 2..6: stream
//!  6: reason: 0 aborted, 1 given up (no answer for too long), 2 no such stream
//!  7: zero
//! ```
//!
//! **RESET_ACK** (type 6, 6 bytes): the common header alone.
//!
//! Offsets, limits and range ends are below 2^48 (256 TiB per stream and direction);
//! a frame with one at or beyond, a range outside `(cumulative, limit]`, a limit below the
//! cumulative point, a reserved flag, result, reason or family, or the wrong length is
//! malformed ([`WireError`]).

use super::{read_u32, WireError};
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Type of an OPEN.
pub const TYPE_OPEN: u8 = 0x01;
/// Type of an OPEN_RESULT.
pub const TYPE_OPEN_RESULT: u8 = 0x02;
/// Type of a DATA frame.
pub const TYPE_DATA: u8 = 0x03;
/// Type of a short DATA frame without flags: types `0x08..=0x0F` are short DATA, their
/// low three bits [`SHORT_FLAG_OPENER`], [`FLAG_RTX`] and [`FLAG_FIN`].
pub const TYPE_SHORT_DATA: u8 = 0x08;
/// Type of an ACK.
pub const TYPE_ACK: u8 = 0x04;
/// Type of a RESET.
pub const TYPE_RESET: u8 = 0x05;
/// Type of a RESET_ACK.
pub const TYPE_RESET_ACK: u8 = 0x06;

/// Flag: the stream was opened by the sender of this frame.
pub const FLAG_OPENER: u8 = 0x80;
/// DATA flag: the stream ends after these bytes.
pub const FLAG_FIN: u8 = 0x01;
/// DATA flag: a retransmission.
pub const FLAG_RTX: u8 = 0x02;
/// Short DATA flag (in the type byte): the stream was opened by the sender of this
/// frame.
pub const SHORT_FLAG_OPENER: u8 = 0x04;
/// ACK flag: the receiver knows the final size.
pub const FLAG_ACK_FIN: u8 = 0x01;
/// ACK flag: a retransmission arrived that was not needed.
pub const FLAG_SPURIOUS: u8 = 0x02;

/// Bytes of the header every frame starts with.
pub const COMMON_LEN: usize = 6;
/// Bytes in front of a DATA frame's payload (the long form, type 3).
pub const DATA_HEADER_LEN: usize = 12;
/// Bytes in front of a short DATA frame's payload (types 8 to 15).
pub const SHORT_DATA_HEADER_LEN: usize = 8;
/// Short DATA frames name streams numbered below this (2^24).
pub const SHORT_STREAM_LIMIT: u32 = 1 << 24;
/// Bytes of an ACK without SACK ranges.
pub const ACK_MIN_LEN: usize = 18;
/// Bytes of one SACK range.
pub const SACK_RANGE_LEN: usize = 8;
/// Most SACK ranges in one ACK.
pub const MAX_SACK: usize = 32;
/// Bytes of an OPEN_RESULT.
pub const OPEN_RESULT_LEN: usize = 12;
/// Bytes of a RESET.
pub const RESET_LEN: usize = 8;
/// Bytes of an OPEN before its addresses.
pub const OPEN_FIXED_LEN: usize = 12;
/// The longest control frame (an OPEN between two IPv6 addresses): a `max_len` at
/// least this long fits every frame (an ACK then carries fewer SACK ranges).
pub const MAX_CONTROL_LEN: usize = OPEN_FIXED_LEN + 2 * 18;
/// Offsets, limits and range ends are below this (2^48).
pub const OFFSET_LIMIT: u64 = 1 << 48;

/// Does this datagram payload hold a stream frame (first byte in `0x01..=0x0F`) rather
/// than an inner IP packet or a braid control packet? Reserved types count as frames:
/// [`Repr::parse`] then reports them malformed.
#[inline]
pub fn is_frame(b: &[u8]) -> bool {
    matches!(b.first(), Some(0x01..=0x0F))
}

/// Is this a short DATA frame's type (`0x08..=0x0F`)?
#[inline]
fn is_short_data(ty: u8) -> bool {
    ty & !(SHORT_FLAG_OPENER | FLAG_RTX | FLAG_FIN) == TYPE_SHORT_DATA
}

/// Does this frame (first byte) carry a stream's bytes: a DATA or a short DATA?
#[inline]
pub fn is_data(b: &[u8]) -> bool {
    matches!(b.first(), Some(&t) if t == TYPE_DATA || is_short_data(t))
}

/// Bytes of the DATA header a sender puts in front of stream `id`'s bytes: a short DATA
/// ([`SHORT_DATA_HEADER_LEN`]) if the stream's number is below [`SHORT_STREAM_LIMIT`],
/// else a DATA ([`DATA_HEADER_LEN`]). [`emit_data_header`] writes that form.
#[inline]
pub fn data_header_len(id: WireId) -> usize {
    if id.n < SHORT_STREAM_LIMIT {
        SHORT_DATA_HEADER_LEN
    } else {
        DATA_HEADER_LEN
    }
}

/// The stream offset whose low 32 bits are `low`, for a stream whose cumulative point
/// at the receiver is `cum` (every byte below it received): of the numbers `low` modulo
/// 2^32, the one nearest to `cum` (within `[cum - 2^31, cum + 2^31)`; near 0, the
/// nearest that is not negative). As QUIC recovers packet numbers.
///
/// Why this is the offset the sender meant. The receiver grants credit at most its
/// window beyond what its application read, so every credit limit it sends is at most
/// `W` (the window, [`crate::stream::MAX_WINDOW`] at most: 2^30) above the cumulative
/// point it sends with it, and the sender, which keeps the highest of each, never has a
/// limit more than `W` above the highest cumulative point it heard. It sends only bytes
/// below its limit, so a frame's bytes end at most `W` above the cumulative point the
/// receiver had when the frame left, and that point only grows: on arrival, a frame
/// starts less than `W` above it. Below it, a sender sends nothing older than its own
/// acknowledged point, which was at most `W` below the receiver's when the frame left
/// (the receiver cannot hold bytes the sender had no credit for): a frame starts at
/// most `W` plus however far the stream moved while it was on the way below the
/// cumulative point. With `W` at most 2^30, every frame is read right unless the
/// stream moved on by more than 2^31 - 2^30 = 1 GiB while it was on the way: 0.9 s at
/// 10 Gbit/s, where a frame crossing the bond is late by tens of milliseconds. (TCP's
/// 32-bit sequence numbers rest on the same kind of bound.)
#[inline]
pub fn expand_offset(low: u32, cum: u64) -> u64 {
    // `low - cum` modulo 2^32, as a signed distance in [-2^31, 2^31).
    let d = low.wrapping_sub(cum as u32) as i32 as i64;
    match cum.checked_add_signed(d) {
        Some(v) => v,
        // Below 0 (cum < 2^31): the candidate 2^32 above is the nearest.
        None => (cum as i64 + d + (1 << 32)) as u64,
    }
}

/// The offset of a DATA frame as parsed: a DATA carries all of it, a short DATA its low
/// 32 bits, which its receiver expands ([`DataOffset::resolve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataOffset {
    /// A DATA frame's offset (below 2^48): emitted as a DATA (type 3).
    Full(u64),
    /// A short DATA frame's low 32 bits of the offset: emitted as a short DATA (types
    /// 8 to 15), whose stream number must be below [`SHORT_STREAM_LIMIT`].
    Low32(u32),
}

impl DataOffset {
    /// The frame's offset, at a receiver whose cumulative point for the stream is `cum`
    /// ([`expand_offset`] for a short DATA). `Err` if the frame's end (the offset plus
    /// `len` bytes) reaches 2^48.
    pub fn resolve(self, cum: u64, len: usize) -> Result<u64, WireError> {
        let off = match self {
            DataOffset::Full(o) => o,
            DataOffset::Low32(l) => expand_offset(l, cum),
        };
        match off.checked_add(len as u64) {
            Some(end) if end < OFFSET_LIMIT => Ok(off),
            _ => Err(WireError::Invalid),
        }
    }
}

/// A stream as named in a frame: its number and who opened it, seen from the frame's
/// sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WireId {
    /// The stream's number among its opener's streams.
    pub n: u32,
    /// True if the sender of the frame opened the stream (flag `O`).
    pub opened_by_sender: bool,
}

/// The result byte of an OPEN_RESULT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenCode {
    /// Accepted: the stream is open.
    Accepted = 0,
    /// Refused by the acceptor's application (e.g. the destination refused the
    /// connection).
    Refused = 1,
    /// The destination could not be reached.
    Unreachable = 2,
    /// The acceptor's policy does not allow this destination.
    NotAllowed = 3,
    /// The acceptor has too many streams.
    TooMany = 4,
}

impl OpenCode {
    fn from_u8(b: u8) -> Option<OpenCode> {
        Some(match b {
            0 => OpenCode::Accepted,
            1 => OpenCode::Refused,
            2 => OpenCode::Unreachable,
            3 => OpenCode::NotAllowed,
            4 => OpenCode::TooMany,
            _ => return None,
        })
    }
}

/// The reason byte of a RESET.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetReason {
    /// The application aborted the stream.
    Aborted = 0,
    /// The sender got no answer for too long and gave the stream up.
    GaveUp = 1,
    /// The sender has no such stream (an answer to a frame for a forgotten stream).
    Unknown = 2,
}

impl ResetReason {
    fn from_u8(b: u8) -> Option<ResetReason> {
        Some(match b {
            0 => ResetReason::Aborted,
            1 => ResetReason::GaveUp,
            2 => ResetReason::Unknown,
            _ => return None,
        })
    }
}

/// The SACK ranges of an ACK: up to [`MAX_SACK`] half-open byte ranges `[start, end)`,
/// in increasing order, without allocation.
#[derive(Clone, Copy)]
pub struct Sack {
    len: u8,
    ranges: [(u64, u64); MAX_SACK],
}

impl Sack {
    /// No ranges.
    pub const fn new() -> Sack {
        Sack {
            len: 0,
            ranges: [(0, 0); MAX_SACK],
        }
    }

    /// Append `[start, end)`; false (and nothing appended) when full.
    pub fn push(&mut self, start: u64, end: u64) -> bool {
        if self.len as usize == MAX_SACK {
            return false;
        }
        self.ranges[self.len as usize] = (start, end);
        self.len += 1;
        true
    }

    /// The ranges.
    pub fn as_slice(&self) -> &[(u64, u64)] {
        &self.ranges[..self.len as usize]
    }

    /// Number of ranges.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// True without ranges.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Default for Sack {
    fn default() -> Sack {
        Sack::new()
    }
}

impl PartialEq for Sack {
    fn eq(&self, other: &Sack) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Sack {}

impl core::fmt::Debug for Sack {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

/// An ACK's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    /// The stream.
    pub id: WireId,
    /// Every byte below this was received.
    pub cum: u64,
    /// The sender may send bytes below this.
    pub limit: u64,
    /// The receiver has the FIN.
    pub fin: bool,
    /// A retransmission arrived that was not needed.
    pub spurious: bool,
    /// Ranges received above `cum`.
    pub sack: Sack,
}

mod field {
    pub const TYPE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const STREAM: usize = 2;
    pub const OFFSET: usize = 6;
    pub const SHORT_STREAM: usize = 1;
    pub const SHORT_OFFSET: usize = 4;
    pub const LIMIT: usize = 12;
    pub const BYTE6: usize = 6;
    pub const BYTE7: usize = 7;
    pub const OPEN_LIMIT: usize = 8;
}

fn read_u48(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a[2..].copy_from_slice(&b[at..at + 6]);
    u64::from_be_bytes(a)
}

fn write_u48(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 6].copy_from_slice(&v.to_be_bytes()[2..]);
}

fn addr_len(family: u8) -> Option<usize> {
    match family {
        4 => Some(6),
        6 => Some(18),
        _ => None,
    }
}

/// The flag bits a frame of this type may carry besides `O`.
fn allowed_flags(ty: u8) -> u8 {
    match ty {
        TYPE_DATA => FLAG_FIN | FLAG_RTX,
        t if is_short_data(t) => FLAG_FIN | FLAG_RTX,
        TYPE_ACK => FLAG_ACK_FIN | FLAG_SPURIOUS,
        _ => 0,
    }
}

/// A zero-copy view of a frame. After [`Packet::new_checked`] every accessor that
/// belongs to the frame's type is in bounds.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap `buffer` without checks.
    pub fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wrap `buffer` and check its length against its type.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let p = Packet { buffer };
        p.check_len()?;
        Ok(p)
    }

    /// Check the length against the type (and, for an OPEN, its address families).
    pub fn check_len(&self) -> Result<(), WireError> {
        let b = self.buffer.as_ref();
        if b.len() < COMMON_LEN {
            return Err(WireError::Truncated);
        }
        let exact = |want: usize| match b.len().cmp(&want) {
            core::cmp::Ordering::Less => Err(WireError::Truncated),
            core::cmp::Ordering::Greater => Err(WireError::Trailing),
            core::cmp::Ordering::Equal => Ok(()),
        };
        match b[field::TYPE] {
            TYPE_OPEN => {
                if b.len() < OPEN_FIXED_LEN {
                    return Err(WireError::Truncated);
                }
                let src = addr_len(b[field::BYTE6]).ok_or(WireError::Reserved(b[6]))?;
                let dst = addr_len(b[field::BYTE7]).ok_or(WireError::Reserved(b[7]))?;
                exact(OPEN_FIXED_LEN + src + dst)
            }
            TYPE_OPEN_RESULT => exact(OPEN_RESULT_LEN),
            TYPE_DATA if b.len() < DATA_HEADER_LEN => Err(WireError::Truncated),
            TYPE_DATA => Ok(()),
            t if is_short_data(t) && b.len() < SHORT_DATA_HEADER_LEN => Err(WireError::Truncated),
            t if is_short_data(t) => Ok(()),
            TYPE_ACK if b.len() < ACK_MIN_LEN => Err(WireError::Truncated),
            TYPE_ACK if !(b.len() - ACK_MIN_LEN).is_multiple_of(SACK_RANGE_LEN) => {
                Err(WireError::Trailing)
            }
            TYPE_ACK if self.sack_count() > MAX_SACK => Err(WireError::Trailing),
            TYPE_ACK => Ok(()),
            TYPE_RESET => exact(RESET_LEN),
            TYPE_RESET_ACK => exact(COMMON_LEN),
            other => Err(WireError::Reserved(other)),
        }
    }

    /// The frame type.
    pub fn frame_type(&self) -> u8 {
        self.buffer.as_ref()[field::TYPE]
    }
    /// The flags byte; of a short DATA, the flags in its type byte as a DATA's flags
    /// byte would have them (`O` as [`FLAG_OPENER`]).
    pub fn flags(&self) -> u8 {
        let b = self.buffer.as_ref();
        let ty = b[field::TYPE];
        if is_short_data(ty) {
            let o = if ty & SHORT_FLAG_OPENER != 0 {
                FLAG_OPENER
            } else {
                0
            };
            return o | ty & (FLAG_RTX | FLAG_FIN);
        }
        b[field::FLAGS]
    }
    /// The stream, as named by the frame's sender.
    pub fn id(&self) -> WireId {
        let b = self.buffer.as_ref();
        let n = if is_short_data(b[field::TYPE]) {
            let at = field::SHORT_STREAM;
            u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
        } else {
            read_u32(b, field::STREAM)
        };
        WireId {
            n,
            opened_by_sender: self.flags() & FLAG_OPENER != 0,
        }
    }
    /// Byte 6 (OPEN: source family; OPEN_RESULT: result; RESET: reason).
    pub fn byte6(&self) -> u8 {
        self.buffer.as_ref()[field::BYTE6]
    }
    /// Byte 7 (OPEN: destination family; zero in OPEN_RESULT and RESET).
    pub fn byte7(&self) -> u8 {
        self.buffer.as_ref()[field::BYTE7]
    }
    /// OPEN, OPEN_RESULT: the initial credit limit.
    pub fn open_limit(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::OPEN_LIMIT)
    }
    /// DATA (type 3): offset; ACK: cumulative point.
    pub fn offset(&self) -> u64 {
        read_u48(self.buffer.as_ref(), field::OFFSET)
    }
    /// Short DATA: the offset's low 32 bits.
    pub fn low_offset(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::SHORT_OFFSET)
    }
    /// ACK: the credit limit.
    pub fn limit(&self) -> u64 {
        read_u48(self.buffer.as_ref(), field::LIMIT)
    }
    /// DATA, short DATA: the stream's bytes.
    pub fn payload(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        match is_short_data(b[field::TYPE]) {
            true => &b[SHORT_DATA_HEADER_LEN..],
            false => &b[DATA_HEADER_LEN..],
        }
    }
    /// ACK: number of SACK ranges.
    pub fn sack_count(&self) -> usize {
        (self.buffer.as_ref().len() - ACK_MIN_LEN) / SACK_RANGE_LEN
    }
    /// ACK: range `i` as (start - cumulative, length).
    pub fn sack_raw(&self, i: usize) -> (u32, u32) {
        let b = self.buffer.as_ref();
        let at = ACK_MIN_LEN + i * SACK_RANGE_LEN;
        (read_u32(b, at), read_u32(b, at + 4))
    }
    /// OPEN: the source and destination addresses.
    pub fn addresses(&self) -> (SocketAddr, SocketAddr) {
        let b = self.buffer.as_ref();
        let (src, n) = read_addr(b, OPEN_FIXED_LEN, self.byte6());
        let (dst, _) = read_addr(b, OPEN_FIXED_LEN + n, self.byte7());
        (src, dst)
    }
}

fn read_addr(b: &[u8], at: usize, family: u8) -> (SocketAddr, usize) {
    if family == 4 {
        let ip = Ipv4Addr::new(b[at], b[at + 1], b[at + 2], b[at + 3]);
        let port = u16::from_be_bytes([b[at + 4], b[at + 5]]);
        (SocketAddr::new(IpAddr::V4(ip), port), 6)
    } else {
        let mut o = [0u8; 16];
        o.copy_from_slice(&b[at..at + 16]);
        let port = u16::from_be_bytes([b[at + 16], b[at + 17]]);
        (SocketAddr::new(IpAddr::V6(Ipv6Addr::from(o)), port), 18)
    }
}

fn write_addr(b: &mut [u8], at: usize, a: &SocketAddr) -> usize {
    match a.ip() {
        IpAddr::V4(ip) => {
            b[at..at + 4].copy_from_slice(&ip.octets());
            b[at + 4..at + 6].copy_from_slice(&a.port().to_be_bytes());
            6
        }
        IpAddr::V6(ip) => {
            b[at..at + 16].copy_from_slice(&ip.octets());
            b[at + 16..at + 18].copy_from_slice(&a.port().to_be_bytes());
            18
        }
    }
}

fn family(a: &SocketAddr) -> u8 {
    if a.is_ipv4() {
        4
    } else {
        6
    }
}

/// A validated frame. DATA borrows its bytes from the buffer it was parsed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Repr<'a> {
    /// Open a stream from `src` to `dst`.
    Open {
        /// The stream (always opened by the frame's sender).
        id: WireId,
        /// The connection's source.
        src: SocketAddr,
        /// The connection's destination.
        dst: SocketAddr,
        /// Bytes the acceptor may send before any ACK.
        limit: u32,
    },
    /// The answer to an OPEN.
    OpenResult {
        /// The stream (always opened by the frame's receiver).
        id: WireId,
        /// Accepted, or why not.
        code: OpenCode,
        /// Bytes the opener may send before any ACK (zero unless accepted).
        limit: u32,
    },
    /// Bytes of a stream: a DATA or a short DATA, as `offset` says.
    Data {
        /// The stream.
        id: WireId,
        /// Offset of the first byte: all of it (a DATA), or its low 32 bits (a short
        /// DATA), which the receiver expands ([`DataOffset::resolve`]).
        offset: DataOffset,
        /// The stream ends after these bytes.
        fin: bool,
        /// A retransmission.
        rtx: bool,
        /// The bytes (empty without FIN: a probe).
        data: &'a [u8],
    },
    /// What the receiver holds and how far the sender may go (boxed: its SACK ranges
    /// make it ten times the size of the other frames).
    Ack(Box<Ack>),
    /// The stream is aborted.
    Reset {
        /// The stream.
        id: WireId,
        /// Why.
        reason: ResetReason,
    },
    /// The answer to a RESET.
    ResetAck {
        /// The stream.
        id: WireId,
    },
}

impl<'a> Repr<'a> {
    /// Parse and validate a frame.
    pub fn parse(bytes: &'a [u8]) -> Result<Repr<'a>, WireError> {
        let p = Packet::new_checked(bytes)?;
        let ty = p.frame_type();
        if p.flags() & !(FLAG_OPENER | allowed_flags(ty)) != 0 {
            return Err(WireError::Reserved(p.flags()));
        }
        let id = p.id();
        match ty {
            TYPE_OPEN => Self::parse_open(&p),
            TYPE_OPEN_RESULT => Self::parse_result(&p),
            TYPE_DATA => Self::parse_data(bytes),
            t if is_short_data(t) => Ok(Self::parse_short_data(bytes)),
            TYPE_ACK => Self::parse_ack(&p).map(|a| Repr::Ack(Box::new(a))),
            TYPE_RESET => {
                let reason = ResetReason::from_u8(p.byte6()).ok_or(WireError::Invalid)?;
                if p.byte7() != 0 {
                    return Err(WireError::Reserved(p.byte7()));
                }
                Ok(Repr::Reset { id, reason })
            }
            _ => Ok(Repr::ResetAck { id }),
        }
    }

    fn parse_open<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr<'a>, WireError> {
        let id = p.id();
        if !id.opened_by_sender {
            return Err(WireError::Invalid);
        }
        let (src, dst) = p.addresses();
        let limit = p.open_limit();
        Ok(Repr::Open {
            id,
            src,
            dst,
            limit,
        })
    }

    fn parse_result<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Repr<'a>, WireError> {
        let id = p.id();
        let code = OpenCode::from_u8(p.byte6()).ok_or(WireError::Invalid)?;
        if id.opened_by_sender || p.byte7() != 0 {
            return Err(WireError::Invalid);
        }
        let limit = p.open_limit();
        if code != OpenCode::Accepted && limit != 0 {
            return Err(WireError::Invalid);
        }
        Ok(Repr::OpenResult { id, code, limit })
    }

    fn parse_data(bytes: &'a [u8]) -> Result<Repr<'a>, WireError> {
        let p = Packet::new_unchecked(bytes);
        let offset = p.offset();
        let data = &bytes[DATA_HEADER_LEN..];
        if offset + data.len() as u64 >= OFFSET_LIMIT {
            return Err(WireError::Invalid);
        }
        Ok(Repr::Data {
            id: p.id(),
            offset: DataOffset::Full(offset),
            fin: p.flags() & FLAG_FIN != 0,
            rtx: p.flags() & FLAG_RTX != 0,
            data,
        })
    }

    /// A short DATA: every value of its fields is valid (the offset is checked once
    /// expanded, [`DataOffset::resolve`]).
    fn parse_short_data(bytes: &'a [u8]) -> Repr<'a> {
        let p = Packet::new_unchecked(bytes);
        Repr::Data {
            id: p.id(),
            offset: DataOffset::Low32(p.low_offset()),
            fin: p.flags() & FLAG_FIN != 0,
            rtx: p.flags() & FLAG_RTX != 0,
            data: &bytes[SHORT_DATA_HEADER_LEN..],
        }
    }

    fn parse_ack<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Ack, WireError> {
        let (cum, limit) = (p.offset(), p.limit());
        if limit < cum || limit >= OFFSET_LIMIT {
            return Err(WireError::Invalid);
        }
        let mut sack = Sack::new();
        let mut floor = cum;
        for i in 0..p.sack_count() {
            let (rel, len) = p.sack_raw(i);
            let start = cum + rel as u64;
            let end = start + len as u64;
            if start <= floor || len == 0 || end > limit {
                return Err(WireError::Invalid);
            }
            sack.push(start, end);
            floor = end;
        }
        Ok(Ack {
            id: p.id(),
            cum,
            limit,
            fin: p.flags() & FLAG_ACK_FIN != 0,
            spurious: p.flags() & FLAG_SPURIOUS != 0,
            sack,
        })
    }

    /// Bytes needed by [`Repr::emit`].
    pub fn buffer_len(&self) -> usize {
        match self {
            Repr::Open { src, dst, .. } => {
                OPEN_FIXED_LEN
                    + addr_len(family(src)).unwrap_or(18)
                    + addr_len(family(dst)).unwrap_or(18)
            }
            Repr::OpenResult { .. } => OPEN_RESULT_LEN,
            Repr::Data {
                offset: DataOffset::Full(_),
                data,
                ..
            } => DATA_HEADER_LEN + data.len(),
            Repr::Data {
                offset: DataOffset::Low32(_),
                data,
                ..
            } => SHORT_DATA_HEADER_LEN + data.len(),
            Repr::Ack(a) => ACK_MIN_LEN + a.sack.len() * SACK_RANGE_LEN,
            Repr::Reset { .. } => RESET_LEN,
            Repr::ResetAck { .. } => COMMON_LEN,
        }
    }

    /// Write the frame into `buf`, which must be exactly [`Repr::buffer_len`] long.
    /// Offsets and limits must be below [`OFFSET_LIMIT`], SACK ranges as [`Ack`]
    /// describes them. Panics on a short DATA of a stream numbered 2^24 or above, which
    /// it cannot name.
    pub fn emit(&self, buf: &mut [u8]) {
        match self {
            Repr::Open {
                id,
                src,
                dst,
                limit,
            } => {
                emit_common(buf, TYPE_OPEN, 0, *id);
                buf[field::BYTE6] = family(src);
                buf[field::BYTE7] = family(dst);
                buf[field::OPEN_LIMIT..OPEN_FIXED_LEN].copy_from_slice(&limit.to_be_bytes());
                let n = write_addr(buf, OPEN_FIXED_LEN, src);
                write_addr(buf, OPEN_FIXED_LEN + n, dst);
            }
            Repr::OpenResult { id, code, limit } => {
                emit_common(buf, TYPE_OPEN_RESULT, 0, *id);
                buf[field::BYTE6] = *code as u8;
                buf[field::BYTE7] = 0;
                buf[field::OPEN_LIMIT..OPEN_RESULT_LEN].copy_from_slice(&limit.to_be_bytes());
            }
            Repr::Data {
                id,
                offset,
                fin,
                rtx,
                data,
            } => {
                let h = match *offset {
                    DataOffset::Full(o) => emit_long_data_header(buf, *id, o, *fin, *rtx),
                    DataOffset::Low32(l) => emit_short_data_header(buf, *id, l, *fin, *rtx),
                };
                buf[h..].copy_from_slice(data);
            }
            Repr::Ack(a) => emit_ack(buf, a),
            Repr::Reset { id, reason } => {
                emit_common(buf, TYPE_RESET, 0, *id);
                buf[field::BYTE6] = *reason as u8;
                buf[field::BYTE7] = 0;
            }
            Repr::ResetAck { id } => emit_common(buf, TYPE_RESET_ACK, 0, *id),
        }
    }

    /// Emit into a fresh vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.buffer_len()];
        self.emit(&mut v);
        v
    }
}

fn emit_common(buf: &mut [u8], ty: u8, flags: u8, id: WireId) {
    buf[field::TYPE] = ty;
    buf[field::FLAGS] = flags | if id.opened_by_sender { FLAG_OPENER } else { 0 };
    buf[field::STREAM..field::STREAM + 4].copy_from_slice(&id.n.to_be_bytes());
}

/// Write the header of a frame of stream `id`'s bytes at `offset` into the start of
/// `buf`, in the form a sender uses: a short DATA if the stream's number is below
/// [`SHORT_STREAM_LIMIT`], else a DATA. Returns its length, [`data_header_len`]; the
/// sender copies the bytes behind it itself, from wherever they are.
pub fn emit_data_header(buf: &mut [u8], id: WireId, offset: u64, fin: bool, rtx: bool) -> usize {
    if id.n < SHORT_STREAM_LIMIT {
        emit_short_data_header(buf, id, offset as u32, fin, rtx)
    } else {
        emit_long_data_header(buf, id, offset, fin, rtx)
    }
}

fn data_flags(fin: bool, rtx: bool) -> u8 {
    let fin = if fin { FLAG_FIN } else { 0 };
    fin | if rtx { FLAG_RTX } else { 0 }
}

/// A DATA header (type 3) into `buf[..DATA_HEADER_LEN]`.
fn emit_long_data_header(buf: &mut [u8], id: WireId, offset: u64, fin: bool, rtx: bool) -> usize {
    emit_common(buf, TYPE_DATA, data_flags(fin, rtx), id);
    write_u48(buf, field::OFFSET, offset);
    DATA_HEADER_LEN
}

/// A short DATA header into `buf[..SHORT_DATA_HEADER_LEN]`: the offset's low 32 bits.
fn emit_short_data_header(buf: &mut [u8], id: WireId, low: u32, fin: bool, rtx: bool) -> usize {
    assert!(
        id.n < SHORT_STREAM_LIMIT,
        "stream {} has no short DATA",
        id.n
    );
    let o = if id.opened_by_sender {
        SHORT_FLAG_OPENER
    } else {
        0
    };
    buf[field::TYPE] = TYPE_SHORT_DATA | o | data_flags(fin, rtx);
    buf[field::SHORT_STREAM..field::SHORT_OFFSET].copy_from_slice(&id.n.to_be_bytes()[1..]);
    buf[field::SHORT_OFFSET..SHORT_DATA_HEADER_LEN].copy_from_slice(&low.to_be_bytes());
    SHORT_DATA_HEADER_LEN
}

fn emit_ack(buf: &mut [u8], a: &Ack) {
    let flags = if a.fin { FLAG_ACK_FIN } else { 0 } | if a.spurious { FLAG_SPURIOUS } else { 0 };
    emit_common(buf, TYPE_ACK, flags, a.id);
    write_u48(buf, field::OFFSET, a.cum);
    write_u48(buf, field::LIMIT, a.limit);
    for (i, &(start, end)) in a.sack.as_slice().iter().enumerate() {
        let at = ACK_MIN_LEN + i * SACK_RANGE_LEN;
        let rel = (start - a.cum) as u32;
        buf[at..at + 4].copy_from_slice(&rel.to_be_bytes());
        buf[at + 4..at + 8].copy_from_slice(&((end - start) as u32).to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u32, o: bool) -> WireId {
        WireId {
            n,
            opened_by_sender: o,
        }
    }

    fn round_trip(r: Repr<'_>) -> Vec<u8> {
        let v = r.to_vec();
        assert_eq!(v.len(), r.buffer_len());
        assert!(is_frame(&v));
        assert_eq!(Repr::parse(&v), Ok(r.clone()));
        for n in 0..v.len() {
            // A cut ACK may be a shorter valid ACK, never the same frame.
            assert_ne!(Repr::parse(&v[..n]), Ok(r.clone()), "{r:?} cut at {n}");
        }
        v
    }

    #[test]
    fn open_bytes() {
        let r = Repr::Open {
            id: id(7, true),
            src: "10.0.0.1:40000".parse().unwrap(),
            dst: "192.168.1.2:443".parse().unwrap(),
            limit: 0x0001_0000,
        };
        let v = round_trip(r);
        assert_eq!(
            v,
            [
                0x01, 0x80, 0, 0, 0, 7, 4, 4, 0, 1, 0, 0, // header, families, limit
                10, 0, 0, 1, 0x9c, 0x40, // source
                192, 168, 1, 2, 0x01, 0xbb, // destination
            ]
        );
        let r6 = Repr::Open {
            id: id(1, true),
            src: "[2001:db8::1]:5".parse().unwrap(),
            dst: "10.1.2.3:80".parse().unwrap(),
            limit: 9,
        };
        assert_eq!(round_trip(r6).len(), 12 + 18 + 6);
        let both6 = Repr::Open {
            id: id(1, true),
            src: "[::1]:5".parse().unwrap(),
            dst: "[fe80::2]:6".parse().unwrap(),
            limit: 0,
        };
        assert_eq!(round_trip(both6).len(), MAX_CONTROL_LEN);
        // An OPEN names a stream its sender opened.
        let mut bad = v.clone();
        bad[1] = 0;
        assert_eq!(Repr::parse(&bad), Err(WireError::Invalid));
        let mut bad = v;
        bad[6] = 5;
        assert_eq!(Repr::parse(&bad), Err(WireError::Reserved(5)));
    }

    #[test]
    fn open_result_bytes() {
        let r = Repr::OpenResult {
            id: id(3, false),
            code: OpenCode::Accepted,
            limit: 65536,
        };
        assert_eq!(round_trip(r), [0x02, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0]);
        for code in [
            OpenCode::Refused,
            OpenCode::Unreachable,
            OpenCode::NotAllowed,
            OpenCode::TooMany,
        ] {
            let v = round_trip(Repr::OpenResult {
                id: id(3, false),
                code,
                limit: 0,
            });
            assert_eq!(v[6], code as u8);
        }
        let mut bad = Repr::OpenResult {
            id: id(3, false),
            code: OpenCode::Refused,
            limit: 0,
        }
        .to_vec();
        bad[6] = 5;
        assert_eq!(Repr::parse(&bad), Err(WireError::Invalid));
    }

    #[test]
    fn data_bytes() {
        let r = Repr::Data {
            id: id(0x0102_0304, true),
            offset: DataOffset::Full(0x0000_a0b0_c0d0_e0f0),
            fin: true,
            rtx: false,
            data: b"hi",
        };
        let v = r.to_vec();
        assert_eq!(
            v,
            [3, 0x81, 1, 2, 3, 4, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0, b'h', b'i']
        );
        assert_eq!(Repr::parse(&v), Ok(r));
        let probe = Repr::Data {
            id: id(1, false),
            offset: DataOffset::Full(5),
            fin: false,
            rtx: true,
            data: b"",
        };
        assert_eq!(round_trip(probe)[1], FLAG_RTX);
        // Past 2^48.
        let mut far = v.clone();
        far[6..12].copy_from_slice(&[0xff; 6]);
        assert_eq!(Repr::parse(&far), Err(WireError::Invalid));
        let mut flags = v;
        flags[1] |= 0x04;
        assert_eq!(Repr::parse(&flags), Err(WireError::Reserved(0x85)));
    }

    #[test]
    fn short_data_bytes() {
        let r = Repr::Data {
            id: id(0x00ab_cdef, true),
            offset: DataOffset::Low32(0x1234_5678),
            fin: true,
            rtx: false,
            data: b"hi",
        };
        assert_eq!(r.buffer_len(), SHORT_DATA_HEADER_LEN + 2);
        assert_eq!(
            round_trip(r),
            [0x0d, 0xab, 0xcd, 0xef, 0x12, 0x34, 0x56, 0x78, b'h', b'i']
        );
        // Every flag, in the type byte: 0x08 | O << 2 | R << 1 | F.
        for bits in 0..8u8 {
            let (o, rtx, fin) = (bits & 4 != 0, bits & 2 != 0, bits & 1 != 0);
            let r = Repr::Data {
                id: id(0, o),
                offset: DataOffset::Low32(0),
                fin,
                rtx,
                data: b"x",
            };
            let v = round_trip(r);
            assert_eq!(v, [0x08 | bits, 0, 0, 0, 0, 0, 0, 0, b'x']);
            assert!(is_frame(&v) && is_data(&v));
            assert_eq!(Packet::new_checked(&v[..]).unwrap().payload(), b"x");
        }
        // The largest stream number, and a probe (the header alone).
        let top = Repr::Data {
            id: id(SHORT_STREAM_LIMIT - 1, false),
            offset: DataOffset::Low32(u32::MAX),
            fin: false,
            rtx: true,
            data: b"",
        };
        assert_eq!(
            round_trip(top),
            [0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]
        );
        // Shorter than its header: truncated, whatever its type.
        for ty in 0x08..=0x0F {
            for n in 1..SHORT_DATA_HEADER_LEN {
                let mut b = vec![0u8; n];
                b[0] = ty;
                assert_eq!(Repr::parse(&b), Err(WireError::Truncated), "{ty} {n}");
            }
        }
        // Type 7 stays reserved.
        assert_eq!(
            Repr::parse(&[0x07, 0, 0, 0, 0, 0, 0, 0]),
            Err(WireError::Reserved(7))
        );
    }

    #[test]
    fn the_sender_writes_short_data_below_stream_2_24() {
        let mut buf = [0xAAu8; DATA_HEADER_LEN];
        let short = id(SHORT_STREAM_LIMIT - 1, true);
        assert_eq!(data_header_len(short), SHORT_DATA_HEADER_LEN);
        // The offset's low 32 bits only.
        let n = emit_data_header(&mut buf, short, 0x0001_0000_0002, true, true);
        assert_eq!(n, SHORT_DATA_HEADER_LEN);
        assert_eq!(buf[..n], [0x0f, 0xff, 0xff, 0xff, 0, 0, 0, 2]);
        assert_eq!(buf[n..], [0xAA; 4]);
        assert_eq!(
            Repr::parse(&buf[..n]),
            Ok(Repr::Data {
                id: short,
                offset: DataOffset::Low32(2),
                fin: true,
                rtx: true,
                data: b"",
            })
        );
        // Stream 2^24 does not fit: a DATA, with the whole offset.
        let long = id(SHORT_STREAM_LIMIT, false);
        assert_eq!(data_header_len(long), DATA_HEADER_LEN);
        let n = emit_data_header(&mut buf, long, 0x0001_0000_0002, false, false);
        assert_eq!(n, DATA_HEADER_LEN);
        assert_eq!(buf, [3, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 2]);
        assert!(is_data(&buf));
        let r = Repr::parse(&buf).unwrap();
        let want = DataOffset::Full(0x0001_0000_0002);
        assert!(matches!(r, Repr::Data { offset, id, .. } if offset == want && id == long));
        // Stream 0.
        let n = emit_data_header(&mut buf, id(0, false), 7, false, false);
        assert_eq!(buf[..n], [0x08, 0, 0, 0, 0, 0, 0, 7]);
        // Not DATA.
        assert!(!is_data(&[TYPE_ACK]) && !is_data(&[0x07]) && !is_data(&[]));
    }

    #[test]
    #[should_panic(expected = "has no short DATA")]
    fn a_stream_from_2_24_has_no_short_data() {
        Repr::Data {
            id: id(SHORT_STREAM_LIMIT, true),
            offset: DataOffset::Low32(0),
            fin: false,
            rtx: false,
            data: b"",
        }
        .to_vec();
    }

    const G: u64 = 1 << 32;

    #[test]
    fn short_offsets_expand_around_the_cumulative_point() {
        // Within the cumulative point's block of 2^32.
        assert_eq!(expand_offset(0, 0), 0);
        assert_eq!(expand_offset(100, 0), 100);
        assert_eq!(expand_offset(100, 3 * G + 50), 3 * G + 100);
        // Near 0 nothing is negative: what would lie below 0 is the candidate above.
        assert_eq!(expand_offset(u32::MAX, 0), G - 1);
        assert_eq!(expand_offset(0xFFFF_FF00, 10), 0xFFFF_FF00);
        assert_eq!(expand_offset(0x8000_0000, 0), 0x8000_0000);
        // Up across a boundary: the cumulative point below it, the bytes above.
        assert_eq!(expand_offset(5, G - 10), G + 5);
        assert_eq!(expand_offset(5, 3 * G - 1), 3 * G + 5);
        assert_eq!(expand_offset(0, G - 1), G);
        // Down across one: a late copy from below it, the cumulative point above.
        assert_eq!(expand_offset(u32::MAX - 4, G + 10), G - 5);
        assert_eq!(expand_offset(u32::MAX, 7 * G), 7 * G - 1);
        // Up to 2^31 - 1 ahead and 2^31 behind; one further ahead is taken as behind.
        let cum = 5 * G + 12_345;
        let half = 1u64 << 31;
        assert_eq!(expand_offset((cum + half - 1) as u32, cum), cum + half - 1);
        assert_eq!(expand_offset((cum - half) as u32, cum), cum - half);
        assert_eq!(expand_offset((cum + half) as u32, cum), cum - half);
        // Near 2^48: 2^48 itself is 0 modulo 2^32.
        let top = OFFSET_LIMIT - 10;
        assert_eq!(expand_offset((top - 1000) as u32, top), top - 1000);
        assert_eq!(
            expand_offset((OFFSET_LIMIT - 1) as u32, top),
            OFFSET_LIMIT - 1
        );
        assert_eq!(expand_offset(5, top), OFFSET_LIMIT + 5);
        // Every offset within the span around a cumulative point comes back.
        let points = [
            0,
            1,
            half - 1,
            half,
            G - 1,
            G,
            G + 1,
            3 * G + half,
            OFFSET_LIMIT - 1,
        ];
        let deltas = [
            -(half as i64),
            1 - half as i64,
            -1500,
            -1,
            0,
            1,
            1438,
            half as i64 - 1,
        ];
        for cum in points {
            for d in deltas {
                let Some(off) = cum.checked_add_signed(d) else {
                    continue;
                };
                assert_eq!(expand_offset(off as u32, cum), off, "{cum} {d}");
            }
        }
    }

    #[test]
    fn a_short_data_ends_below_2_48() {
        let top = OFFSET_LIMIT - 10;
        let low = |o: u64| DataOffset::Low32(o as u32);
        assert_eq!(low(top - 5).resolve(top, 4), Ok(top - 5));
        assert_eq!(low(top).resolve(top, 9), Ok(top)); // ends at 2^48 - 1
        assert_eq!(low(top).resolve(top, 10), Err(WireError::Invalid)); // at 2^48
        assert_eq!(low(5).resolve(top, 0), Err(WireError::Invalid)); // 2^48 + 5
        assert_eq!(low(7).resolve(3 * G + 1, 1438), Ok(3 * G + 7));
        // A DATA's offset needs no cumulative point.
        assert_eq!(DataOffset::Full(7).resolve(top, 3), Ok(7));
        assert_eq!(
            DataOffset::Full(top).resolve(0, 10),
            Err(WireError::Invalid)
        );
    }

    #[test]
    fn ack_bytes() {
        let mut sack = Sack::new();
        sack.push(1010, 1020);
        sack.push(2000, 2500);
        let r = Repr::Ack(Box::new(Ack {
            id: id(9, false),
            cum: 1000,
            limit: 5000,
            fin: false,
            spurious: true,
            sack,
        }));
        let v = round_trip(r);
        assert_eq!(
            v,
            [
                4, 0x02, 0, 0, 0, 9, 0, 0, 0, 0, 0x03, 0xe8, 0, 0, 0, 0, 0x13, 0x88, // fixed
                0, 0, 0, 10, 0, 0, 0, 10, // 1010..1020
                0, 0, 0x03, 0xe8, 0, 0, 0x01, 0xf4, // 2000..2500
            ]
        );
        let plain = Repr::Ack(Box::new(Ack {
            id: id(9, true),
            cum: 0,
            limit: 0,
            fin: true,
            spurious: false,
            sack: Sack::new(),
        }));
        assert_eq!(round_trip(plain).len(), ACK_MIN_LEN);
        // Overlapping or touching ranges, a range at the cumulative point, a range past
        // the limit, a limit below the cumulative point: all malformed.
        let bad = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = v.clone();
            f(&mut b);
            Repr::parse(&b).map(|_| ())
        };
        let second =
            |start: u16| move |b: &mut Vec<u8>| b[28..30].copy_from_slice(&start.to_be_bytes());
        assert_eq!(bad(&second(10)), Err(WireError::Invalid)); // 1010 again
        assert_eq!(bad(&second(20)), Err(WireError::Invalid)); // touches 1010..1020
        assert_eq!(bad(&second(21)), Ok(()));
        assert_eq!(bad(&|b| b[21] = 0), Err(WireError::Invalid)); // start = cum
        assert_eq!(bad(&|b| b[25] = 0), Err(WireError::Invalid)); // empty
        assert_eq!(bad(&|b| b[16] = 0), Err(WireError::Invalid)); // limit 136 < cum
        let limit = |l: u16| move |b: &mut Vec<u8>| b[16..18].copy_from_slice(&l.to_be_bytes());
        assert_eq!(bad(&limit(2499)), Err(WireError::Invalid)); // range end 2500 > limit
        assert_eq!(bad(&limit(2500)), Ok(()));
        assert_eq!(bad(&|b| b.push(0)), Err(WireError::Trailing));
    }

    #[test]
    fn ack_range_count_is_bounded() {
        let mut sack = Sack::new();
        for i in 0..MAX_SACK as u64 {
            assert!(sack.push(10 + 10 * i, 15 + 10 * i));
        }
        assert!(!sack.push(1000, 1001));
        let r = Repr::Ack(Box::new(Ack {
            id: id(1, true),
            cum: 0,
            limit: 1000,
            fin: false,
            spurious: false,
            sack,
        }));
        let mut v = round_trip(r);
        v.extend_from_slice(&[0, 0, 1, 0, 0, 0, 0, 1]);
        assert_eq!(Repr::parse(&v), Err(WireError::Trailing));
    }

    #[test]
    fn reset_bytes() {
        let r = Repr::Reset {
            id: id(2, true),
            reason: ResetReason::GaveUp,
        };
        assert_eq!(round_trip(r), [5, 0x80, 0, 0, 0, 2, 1, 0]);
        let u = Repr::Reset {
            id: id(2, false),
            reason: ResetReason::Unknown,
        };
        assert_eq!(round_trip(u)[6], 2);
        let a = Repr::ResetAck { id: id(2, false) };
        assert_eq!(round_trip(a), [6, 0, 0, 0, 0, 2]);
        assert_eq!(
            Repr::parse(&[5, 0x80, 0, 0, 0, 2, 3, 0]),
            Err(WireError::Invalid)
        );
    }

    #[test]
    fn frames_are_not_ip() {
        assert!(!is_frame(&[0x45, 0]));
        assert!(!is_frame(&[0x60, 0]));
        assert!(!is_frame(&[0xB4, 0]));
        assert!(!is_frame(&[0x00]));
        assert!(!is_frame(&[]));
        assert!(is_frame(&[0x0F]) && is_frame(&[0x08]));
        assert_eq!(
            Repr::parse(&[0x07, 0, 0, 0, 0, 0]),
            Err(WireError::Reserved(7))
        );
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut rng = crate::rng::SplitMix64::stream(32, 1);
        let mut ok = 0;
        for i in 0..200_000u32 {
            let len = rng.upto(60) as usize;
            let mut b: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            if let Some(f) = b.first_mut() {
                *f = 1 + (i % 15) as u8; // mostly known types, so the bodies get parsed
            }
            if let Ok(r) = Repr::parse(&b) {
                ok += 1;
                // What parses, emits to the same bytes.
                assert_eq!(r.to_vec(), b, "{r:?}");
            }
        }
        assert!(ok > 200, "{ok} parsed");
    }
}
