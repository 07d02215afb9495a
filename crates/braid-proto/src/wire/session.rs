//! Session messages (hello, epoch end, epoch ack, feedback, resend, probe, probe
//! report, close, MTU probe, MTU ack), first byte `0xB4`, spoken by the session machine ([`crate::session`]).
//! Each is followed on the wire by the authentication trailer of
//! [`crate::session::auth`]. All integers are big-endian.
//!
//! Common header:
//!
//! ```text
//!  0        1        2        3
//! +--------+--------+--------+--------+
//! |  0xB4  |version |  kind  | channel|  kind: 1 hello, 2 epoch end, 3 epoch ack,
//! +--------+--------+--------+--------+  4 feedback, 5 resend, 6 probe, 7 report,
//!                                          8 close, (9 flow datagram: `wire::flow`),
//!                                          10 MTU probe, 11 MTU ack
//!                                          channel: physical index it was sent on
//! ```
//!
//! **Hello** (kind 1, 24 bytes; 28 while the sender is idle), sent on every configured
//! channel every heartbeat:
//!
//! ```text
//!  4: channels (u8) | 5..8: heartbeat number (u24, wrapping; the same on every
//!     channel in one heartbeat): a hello older than one already applied is stale
//!  8..16:  rx mask (u64): bit c set = the sender currently hears us on channel c
//! 16..20:  sender's transmit epoch (u32)
//! 20..24:  sender's receive epoch (u32)
//! 24..28:  only while the sender is idle (`session::liveness`): its next hello comes
//!          within this many microseconds (u32), its idle heartbeat
//! ```
//!
//! A hello of 24 bytes says its sender keeps its usual heartbeat (interval 0).
//!
//! **Epoch end** (kind 2, 40 + 16 n bytes), sent by the data sender on every channel of
//! the old and the new set, after the last data packet of the old epoch, and repeated
//! every heartbeat until acknowledged:
//!
//! ```text
//!  4: n = channels in the old set (u8) | 5..8: zero
//!  8..12:  old epoch (u32)
//! 12..16:  new epoch (u32) = old + 1
//! 16..24:  old channel set (u64 bit mask of physical channels)
//! 24..32:  new channel set (u64 bit mask)
//! 32..40:  data packets sent in the old epoch (u64)
//! 40..:    n entries, one per channel of the old set in increasing physical order:
//!          round (u64), deficit counter (i64): the implicit number the next packet
//!          on that channel would have had (its final marker position)
//! ```
//!
//! **Epoch ack** (kind 3, 24 bytes), sent by the data receiver on every channel once it
//! has switched:
//!
//! ```text
//!  4..8:   zero
//!  8..12:  epoch now in force (u32)
//! 12..16:  zero
//! 16..24:  channel set now in force (u64 bit mask)
//! ```

//!
//! **Feedback** (kind 4, 48 bytes), sent by each end on every channel every heartbeat:
//! what it received on that channel, and a timestamp echo for the round-trip time.
//!
//! ```text
//!  4..8:   timestamp (u32): the sender's clock in microseconds, wrapping
//!  8..12:  echo (u32): the latest timestamp heard from the peer on this channel
//! 12..16:  echo delay (u32): microseconds between hearing it and sending this
//! 16..24:  authenticated datagrams received on this channel, this run (u64)
//! 24..32:  their bytes (u64)
//! 32..40:  datagrams the receiver found missing on this channel (u64): gaps in the
//!          channel's sealing counter (a datagram repaired later still counts)
//! 40..48:  of those, the ones found while the channel's queue stood above the AQM's
//!          target (u64): congestion, not a bad link (0 without AQM and repair)
//! ```
//!
//! The counts are cumulative, so a lost feedback message costs one sample, nothing
//! else. An echo of 0 with delay 0 means "nothing heard yet". A 40-byte report (from a
//! braid before the congestion count) is read with that count 0.
//!
//! **Resend** (kind 5, 12 + 8 n bytes, 1 ≤ n ≤ 32), sent by a receiver with in-bond
//! repair on (`errctl::link`) on every channel that is up: sealed datagrams it found
//! missing on one channel, by their sealing counters.
//!
//! ```text
//!  4: lost channel (u8): the channel the datagrams were sealed for
//!  5: n (u8) | 6..8: zero
//!  8..12:  key index (u32) in their sealed header (ours: it names the keys)
//! 12..:    n sealing counters (u64 each)
//! ```
//!
//! The peer answers by sending the same sealed datagrams again, unchanged, on its
//! fastest channel: the receiver recognises them by the counter it is missing.
//!
//! **Probe** (kind 6, at least 12 bytes), one datagram of a *train* the sender sends
//! back to back on one channel to measure its rate (`session::probe`); padded with
//! zeros to the size of the channel's largest datagram:
//!
//! ```text
//!  4..6:   train (u16): the sender's number for the train
//!  6..8:   index (u16) of this datagram in the train, from 0
//!  8..10:  count (u16): datagrams in the train (index < count)
//! 10..12:  zero | 12..: padding (zeros)
//! ```
//!
//! **Probe report** (kind 7, 32 bytes), sent by the receiver of a train on the channel
//! it came on: how fast the train's later half arrived.
//!
//! ```text
//!  4..6:   train (u16)
//!  6..8:   received (u16): datagrams of the train that arrived
//!  8..10:  tail (u16): datagrams timed: of the later half of those received, the
//!          ones the receiver's clock read later than the half's first reading (a
//!          batch read stamps several datagrams at once)
//! 10..12:  readings (u16): distinct clock readings over the later half (0: not
//!          counted, from a braid before this field)
//! 12..20:  tail bytes (u64): their datagrams' bytes on the channel (sealed, as sent)
//! 20..28:  span (u64): microseconds from the half's first clock reading to its last
//! 28..32:  zero
//! ```
//!
//! A train whose later half came in a single clock reading (read in one batch: a link
//! much faster than the train can show) is reported with tail, tail bytes and span 0
//! and readings 1, so the sender knows why it has no rate.
//!
//! **Close** (kind 8, 8 bytes), sent once on every channel by an end that stops on
//! purpose (a transfer done, a tunnel told to stop): the peer then takes the silence
//! that follows for the end of this run, not for failed channels.
//!
//! ```text
//!  4..8:   zero
//! ```
//!
//! A lost close costs only the peer's warnings: it then sees its channels go silent.
//! A peer that restarts is a new run (a new handshake) and is heard as usual.
//!
//! **MTU probe** (kind 10, at least 12 bytes), path MTU discovery
//! (`session::pmtu`): padded with zeros so that the sealed datagram is exactly the
//! size being tried on the channel. It is sealed in the channel's *probe lane*
//! (`wire::secure`, byte 2 of the sealed header = 1): its own counter, so a probe
//! too big for the path leaves no gap in the channel's sealing counter and is never
//! taken for a lost datagram.
//!
//! ```text
//!  4..8:   probe number (u32): the sender's, increasing
//!  8..10:  size (u16): the sealed datagram's length on the wire (UDP payload)
//! 10..12:  zero | 12..: padding (zeros)
//! ```
//!
//! **MTU ack** (kind 11, 12 bytes), sent by the receiver of an MTU probe on the
//! channel it came on (in the ordinary lane):
//!
//! ```text
//!  4..8:   probe number (u32), echoed
//!  8..10:  size (u16): the length of the sealed probe as it arrived
//! 10..12:  zero
//! ```

use super::TYPE_SESSION;

/// Version of these messages.
pub const VERSION: u8 = 1;
/// Kind byte of a hello.
pub const KIND_HELLO: u8 = 1;
/// Kind byte of an epoch end.
pub const KIND_END: u8 = 2;
/// Kind byte of an epoch ack.
pub const KIND_ACK: u8 = 3;
/// Kind byte of a feedback report.
pub const KIND_FEEDBACK: u8 = 4;
/// Kind byte of a resend request.
pub const KIND_RESEND: u8 = 5;
/// Kind byte of a probe (one datagram of a train).
pub const KIND_PROBE: u8 = 6;
/// Kind byte of a probe report.
pub const KIND_PROBE_REPORT: u8 = 7;
/// Kind byte of a close.
pub const KIND_CLOSE: u8 = 8;
/// Kind byte of an MTU probe (path MTU discovery).
pub const KIND_MTU_PROBE: u8 = 10;
/// Kind byte of an MTU ack.
pub const KIND_MTU_ACK: u8 = 11;
/// Bytes of an MTU probe before its padding (its smallest size), and of an MTU ack.
pub const MTU_PROBE_MIN_LEN: usize = 12;
/// Most counters in one resend request.
pub const RESEND_MAX: usize = 32;
/// Bytes of a probe before its padding (its smallest size).
pub const PROBE_MIN_LEN: usize = 12;

/// Why a session message could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CtrlError {
    /// Wrong length for its kind.
    #[error("session message has the wrong length")]
    Length,
    /// Not 0xB4, or an unknown version or kind.
    #[error("unknown session message type, version or kind")]
    Unknown,
    /// A field is impossible (e.g. an entry count that does not match the old set).
    #[error("invalid field in session message")]
    Invalid,
}

/// Heartbeat and liveness report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Channel it was sent on.
    pub channel: u8,
    /// Channels the sender has configured.
    pub channels: u8,
    /// Channels on which the sender currently hears us.
    pub rx_mask: u64,
    /// The sender's transmit epoch.
    pub tx_epoch: u32,
    /// The sender's receive epoch.
    pub rx_epoch: u32,
    /// The sender's heartbeat number, 24 bits, wrapping (`HELLO_SEQ_MASK`).
    pub seq: u32,
    /// While the sender is idle: its next hello comes within this many microseconds
    /// (0: not said, the sender keeps its usual heartbeat; the 24-byte form).
    pub interval_us: u32,
}

/// Hello numbers wrap at 24 bits.
pub const HELLO_SEQ_MASK: u32 = 0x00ff_ffff;

impl Hello {
    /// Was this hello sent before one numbered `last` (within half the number space)?
    pub fn older_than(&self, last: u32) -> bool {
        let d = last.wrapping_sub(self.seq) & HELLO_SEQ_MASK;
        d != 0 && d < HELLO_SEQ_MASK / 2
    }
}

/// The end of a transmit epoch and the proposal of the next channel set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochEnd {
    /// Channel it was sent on.
    pub channel: u8,
    /// Epoch that ends.
    pub old_epoch: u32,
    /// Epoch that begins (old + 1).
    pub new_epoch: u32,
    /// Channels of the old epoch.
    pub old_set: u64,
    /// Channels of the new epoch.
    pub new_set: u64,
    /// Data packets sent in the old epoch.
    pub sent: u64,
    /// Final (round, deficit counter) per channel of the old set, increasing order.
    pub finals: Vec<(u64, i64)>,
}

/// Acknowledgement of an epoch switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochAck {
    /// Channel it was sent on.
    pub channel: u8,
    /// Epoch in force at the receiver.
    pub epoch: u32,
    /// Its channel set.
    pub set: u64,
}

/// What one end received on one channel (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Feedback {
    /// Channel it was sent on (and reports on).
    pub channel: u8,
    /// The sender's clock, microseconds, wrapping.
    pub timestamp: u32,
    /// The latest `timestamp` heard from the peer on this channel.
    pub echo: u32,
    /// Microseconds between hearing `echo` and sending this.
    pub echo_delay: u32,
    /// Authenticated datagrams received on the channel (cumulative).
    pub rx_datagrams: u64,
    /// Their bytes (cumulative).
    pub rx_bytes: u64,
    /// Datagrams found missing on the channel (cumulative).
    pub missing: u64,
    /// Of those, found while the channel's queue stood (congestion; cumulative).
    pub congested: u64,
}

/// Sealed datagrams to send again (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resend {
    /// Channel it was sent on.
    pub channel: u8,
    /// Channel the missing datagrams were sealed for.
    pub lost_channel: u8,
    /// Key index in their sealed header.
    pub key_index: u32,
    /// Their sealing counters (1 to [`RESEND_MAX`]).
    pub counters: Vec<u64>,
}

/// One datagram of a train that measures a channel's rate (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// Channel it was sent on.
    pub channel: u8,
    /// The sender's number for the train.
    pub train: u16,
    /// Its place in the train, from 0.
    pub index: u16,
    /// Datagrams in the train.
    pub count: u16,
    /// Its whole length with padding (at least [`PROBE_MIN_LEN`]).
    pub len: usize,
}

/// How fast a train arrived (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeReport {
    /// Channel it was sent on (the train's).
    pub channel: u8,
    /// The train's number.
    pub train: u16,
    /// Datagrams of the train that arrived.
    pub received: u16,
    /// Datagrams measured (0: the train could not be timed).
    pub tail: u16,
    /// Distinct clock readings over the later half (0: not counted).
    pub readings: u16,
    /// Their bytes.
    pub tail_bytes: u64,
    /// Microseconds over which they arrived.
    pub span_us: u64,
    /// How far, at most, a timed datagram arrived from where a steady rate over the
    /// span would have put it, microseconds (0: not measured): the link's jitter, when
    /// it is a fair share of the span.
    pub wobble_us: u32,
}

/// A datagram of path MTU discovery, or its acknowledgement (see the module docs):
/// both carry the probe's number and a size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MtuProbe {
    /// Channel it was sent on.
    pub channel: u8,
    /// The prober's number for the probe.
    pub id: u32,
    /// In a probe: the sealed datagram's intended length; in an ack: its length on
    /// arrival.
    pub size: u16,
    /// A probe: its whole length with padding (at least [`MTU_PROBE_MIN_LEN`]); an
    /// ack: [`MTU_PROBE_MIN_LEN`].
    pub len: usize,
}

/// Any session message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// Heartbeat.
    Hello(Hello),
    /// Epoch end.
    End(EpochEnd),
    /// Epoch ack.
    Ack(EpochAck),
    /// Per-channel feedback.
    Feedback(Feedback),
    /// Resend request.
    Resend(Resend),
    /// One datagram of a rate-measuring train.
    Probe(Probe),
    /// The rate a train arrived at.
    ProbeReport(ProbeReport),
    /// The sender ends the session on purpose; the field is the channel it was sent on.
    Close(u8),
    /// A path MTU probe, padded.
    MtuProbe(MtuProbe),
    /// The acknowledgement of a path MTU probe.
    MtuAck(MtuProbe),
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

const HELLO_LEN: usize = 24;
/// A hello with the idle sender's interval.
const HELLO_LEN_IDLE: usize = 28;
const ACK_LEN: usize = 24;
const FEEDBACK_LEN: usize = 48;
/// A report from before the congestion count.
const FEEDBACK_LEN_V1: usize = 40;
const END_FIXED: usize = 40;
const END_ENTRY: usize = 16;
const RESEND_FIXED: usize = 12;
const PROBE_REPORT_LEN: usize = 32;
const CLOSE_LEN: usize = 8;

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

impl Msg {
    /// Parse a message (trailer already removed). Never panics.
    pub fn parse(b: &[u8]) -> Result<Msg, CtrlError> {
        if b.len() < 4 {
            return Err(CtrlError::Length);
        }
        if b[0] != TYPE_SESSION || b[1] != VERSION {
            return Err(CtrlError::Unknown);
        }
        let channel = b[3];
        match b[2] {
            KIND_HELLO => parse_hello(b, channel),
            KIND_END => parse_end(b, channel),
            KIND_ACK => parse_ack(b, channel),
            KIND_FEEDBACK => parse_feedback(b, channel),
            KIND_RESEND => parse_resend(b, channel),
            KIND_PROBE => parse_probe(b, channel),
            KIND_PROBE_REPORT => parse_probe_report(b, channel),
            KIND_CLOSE => {
                if b.len() != CLOSE_LEN {
                    return Err(CtrlError::Length);
                }
                Ok(Msg::Close(channel))
            }
            KIND_MTU_PROBE | KIND_MTU_ACK => parse_mtu(b, channel),
            _ => Err(CtrlError::Unknown),
        }
    }

    /// The channel the message says it was sent on.
    pub fn channel(&self) -> u8 {
        match self {
            Msg::Hello(h) => h.channel,
            Msg::End(e) => e.channel,
            Msg::Ack(a) => a.channel,
            Msg::Feedback(f) => f.channel,
            Msg::Resend(r) => r.channel,
            Msg::Probe(p) => p.channel,
            Msg::ProbeReport(r) => r.channel,
            Msg::Close(c) => *c,
            Msg::MtuProbe(p) | Msg::MtuAck(p) => p.channel,
        }
    }

    /// The message's bytes (without trailer).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(64);
        match self {
            Msg::Hello(h) => write_hello(h, &mut v),
            Msg::End(e) => write_end(e, &mut v),
            Msg::Ack(a) => write_ack(a, &mut v),
            Msg::Feedback(f) => write_feedback(f, &mut v),
            Msg::Resend(r) => write_resend(r, &mut v),
            Msg::Probe(p) => write_probe(p, &mut v),
            Msg::ProbeReport(r) => write_probe_report(r, &mut v),
            Msg::Close(c) => {
                v.extend_from_slice(&[TYPE_SESSION, VERSION, KIND_CLOSE, *c]);
                v.extend_from_slice(&[0; 4]);
            }
            Msg::MtuProbe(p) => write_mtu(KIND_MTU_PROBE, p, &mut v),
            Msg::MtuAck(p) => write_mtu(KIND_MTU_ACK, p, &mut v),
        }
        v
    }
}

/// An MTU probe (padded to its length) or ack.
fn write_mtu(kind: u8, p: &MtuProbe, v: &mut Vec<u8>) {
    v.extend_from_slice(&[TYPE_SESSION, VERSION, kind, p.channel]);
    v.extend_from_slice(&p.id.to_be_bytes());
    v.extend_from_slice(&p.size.to_be_bytes());
    v.extend_from_slice(&[0; 2]);
    if kind == KIND_MTU_PROBE {
        v.resize(p.len.max(MTU_PROBE_MIN_LEN), 0);
    }
}

/// An MTU probe (any length from 12) or ack (12 bytes).
fn parse_mtu(b: &[u8], channel: u8) -> Result<Msg, CtrlError> {
    let probe = b[2] == KIND_MTU_PROBE;
    if b.len() < MTU_PROBE_MIN_LEN || (!probe && b.len() != MTU_PROBE_MIN_LEN) {
        return Err(CtrlError::Length);
    }
    let p = MtuProbe {
        channel,
        id: u32_at(b, 4),
        size: u16_at(b, 8),
        len: b.len(),
    };
    Ok(if probe {
        Msg::MtuProbe(p)
    } else {
        Msg::MtuAck(p)
    })
}

/// A hello: 24 bytes, 28 with an interval.
fn write_hello(h: &Hello, v: &mut Vec<u8>) {
    v.extend_from_slice(&[TYPE_SESSION, VERSION, KIND_HELLO, h.channel]);
    let seq = (h.seq & HELLO_SEQ_MASK).to_be_bytes();
    v.extend_from_slice(&[h.channels, seq[1], seq[2], seq[3]]);
    v.extend_from_slice(&h.rx_mask.to_be_bytes());
    v.extend_from_slice(&h.tx_epoch.to_be_bytes());
    v.extend_from_slice(&h.rx_epoch.to_be_bytes());
    if h.interval_us != 0 {
        v.extend_from_slice(&h.interval_us.to_be_bytes());
    }
}

/// An epoch end: the fixed part, then each old channel's final position.
fn write_end(e: &EpochEnd, v: &mut Vec<u8>) {
    v.extend_from_slice(&[TYPE_SESSION, VERSION, KIND_END, e.channel]);
    v.extend_from_slice(&[e.finals.len() as u8, 0, 0, 0]);
    v.extend_from_slice(&e.old_epoch.to_be_bytes());
    v.extend_from_slice(&e.new_epoch.to_be_bytes());
    v.extend_from_slice(&e.old_set.to_be_bytes());
    v.extend_from_slice(&e.new_set.to_be_bytes());
    v.extend_from_slice(&e.sent.to_be_bytes());
    for (round, dc) in &e.finals {
        v.extend_from_slice(&round.to_be_bytes());
        v.extend_from_slice(&dc.to_be_bytes());
    }
}

/// An epoch acknowledgement.
fn write_ack(a: &EpochAck, v: &mut Vec<u8>) {
    v.extend_from_slice(&[TYPE_SESSION, VERSION, KIND_ACK, a.channel]);
    v.extend_from_slice(&[0; 4]);
    v.extend_from_slice(&a.epoch.to_be_bytes());
    v.extend_from_slice(&[0; 4]);
    v.extend_from_slice(&a.set.to_be_bytes());
}

/// A feedback report (version 2, with the congestion count).
fn write_feedback(f: &Feedback, v: &mut Vec<u8>) {
    v.extend_from_slice(&[TYPE_SESSION, VERSION, KIND_FEEDBACK, f.channel]);
    v.extend_from_slice(&f.timestamp.to_be_bytes());
    v.extend_from_slice(&f.echo.to_be_bytes());
    v.extend_from_slice(&f.echo_delay.to_be_bytes());
    v.extend_from_slice(&f.rx_datagrams.to_be_bytes());
    v.extend_from_slice(&f.rx_bytes.to_be_bytes());
    v.extend_from_slice(&f.missing.to_be_bytes());
    v.extend_from_slice(&f.congested.to_be_bytes());
}

/// A repair request and its counters.
fn write_resend(r: &Resend, v: &mut Vec<u8>) {
    v.extend_from_slice(&[TYPE_SESSION, VERSION, KIND_RESEND, r.channel]);
    v.extend_from_slice(&[r.lost_channel, r.counters.len() as u8, 0, 0]);
    v.extend_from_slice(&r.key_index.to_be_bytes());
    for c in &r.counters {
        v.extend_from_slice(&c.to_be_bytes());
    }
}

/// A probe, padded to its length.
fn write_probe(p: &Probe, v: &mut Vec<u8>) {
    v.extend_from_slice(&[TYPE_SESSION, VERSION, KIND_PROBE, p.channel]);
    v.extend_from_slice(&p.train.to_be_bytes());
    v.extend_from_slice(&p.index.to_be_bytes());
    v.extend_from_slice(&p.count.to_be_bytes());
    v.resize(p.len.max(PROBE_MIN_LEN), 0);
}

/// The report on a probe train.
fn write_probe_report(r: &ProbeReport, v: &mut Vec<u8>) {
    v.extend_from_slice(&[TYPE_SESSION, VERSION, KIND_PROBE_REPORT, r.channel]);
    v.extend_from_slice(&r.train.to_be_bytes());
    v.extend_from_slice(&r.received.to_be_bytes());
    v.extend_from_slice(&r.tail.to_be_bytes());
    v.extend_from_slice(&r.readings.to_be_bytes());
    v.extend_from_slice(&r.tail_bytes.to_be_bytes());
    v.extend_from_slice(&r.span_us.to_be_bytes());
    v.extend_from_slice(&r.wobble_us.to_be_bytes());
}

/// A hello (fixed length).
fn parse_hello(b: &[u8], channel: u8) -> Result<Msg, CtrlError> {
    if b.len() != HELLO_LEN && b.len() != HELLO_LEN_IDLE {
        return Err(CtrlError::Length);
    }
    Ok(Msg::Hello(Hello {
        channel,
        channels: b[4],
        rx_mask: u64_at(b, 8),
        tx_epoch: u32_at(b, 16),
        rx_epoch: u32_at(b, 20),
        seq: u32::from_be_bytes([0, b[5], b[6], b[7]]),
        interval_us: if b.len() == HELLO_LEN_IDLE {
            u32_at(b, 24)
        } else {
            0
        },
    }))
}

/// An epoch end: the old and new sets and the final position of each old channel.
fn parse_end(b: &[u8], channel: u8) -> Result<Msg, CtrlError> {
    if b.len() < END_FIXED {
        return Err(CtrlError::Length);
    }
    let n = b[4] as usize;
    if b.len() != END_FIXED + n * END_ENTRY {
        return Err(CtrlError::Length);
    }
    let old_set = u64_at(b, 16);
    if old_set.count_ones() as usize != n {
        return Err(CtrlError::Invalid);
    }
    let old_epoch = u32_at(b, 8);
    let new_epoch = u32_at(b, 12);
    if new_epoch != old_epoch.wrapping_add(1) || u64_at(b, 24) == 0 {
        return Err(CtrlError::Invalid);
    }
    let finals = (0..n)
        .map(|i| {
            let at = END_FIXED + i * END_ENTRY;
            (u64_at(b, at), u64_at(b, at + 8) as i64)
        })
        .collect();
    Ok(Msg::End(EpochEnd {
        channel,
        old_epoch,
        new_epoch,
        old_set,
        new_set: u64_at(b, 24),
        sent: u64_at(b, 32),
        finals,
    }))
}

/// An epoch acknowledgement.
fn parse_ack(b: &[u8], channel: u8) -> Result<Msg, CtrlError> {
    if b.len() != ACK_LEN {
        return Err(CtrlError::Length);
    }
    Ok(Msg::Ack(EpochAck {
        channel,
        epoch: u32_at(b, 8),
        set: u64_at(b, 16),
    }))
}

/// A feedback report (with or without the congestion count of version 1).
fn parse_feedback(b: &[u8], channel: u8) -> Result<Msg, CtrlError> {
    if b.len() != FEEDBACK_LEN && b.len() != FEEDBACK_LEN_V1 {
        return Err(CtrlError::Length);
    }
    Ok(Msg::Feedback(Feedback {
        channel,
        timestamp: u32_at(b, 4),
        echo: u32_at(b, 8),
        echo_delay: u32_at(b, 12),
        rx_datagrams: u64_at(b, 16),
        rx_bytes: u64_at(b, 24),
        missing: u64_at(b, 32),
        congested: if b.len() == FEEDBACK_LEN {
            u64_at(b, 40)
        } else {
            0
        },
    }))
}

/// A repair request: 1 to RESEND_MAX counters.
fn parse_resend(b: &[u8], channel: u8) -> Result<Msg, CtrlError> {
    if b.len() < RESEND_FIXED {
        return Err(CtrlError::Length);
    }
    let n = b[5] as usize;
    if b.len() != RESEND_FIXED + 8 * n {
        return Err(CtrlError::Length);
    }
    if n == 0 || n > RESEND_MAX {
        return Err(CtrlError::Invalid);
    }
    Ok(Msg::Resend(Resend {
        channel,
        lost_channel: b[4],
        key_index: u32_at(b, 8),
        counters: (0..n).map(|i| u64_at(b, RESEND_FIXED + 8 * i)).collect(),
    }))
}

/// One datagram of a probe train.
fn parse_probe(b: &[u8], channel: u8) -> Result<Msg, CtrlError> {
    if b.len() < PROBE_MIN_LEN {
        return Err(CtrlError::Length);
    }
    let (train, index, count) = (u16_at(b, 4), u16_at(b, 6), u16_at(b, 8));
    if index >= count {
        return Err(CtrlError::Invalid);
    }
    Ok(Msg::Probe(Probe {
        channel,
        train,
        index,
        count,
        len: b.len(),
    }))
}

/// The report on a probe train.
fn parse_probe_report(b: &[u8], channel: u8) -> Result<Msg, CtrlError> {
    if b.len() != PROBE_REPORT_LEN {
        return Err(CtrlError::Length);
    }
    let (received, tail) = (u16_at(b, 6), u16_at(b, 8));
    let span_us = u64_at(b, 20);
    // Something timed over some time, or nothing timed at all.
    if tail >= received || (tail == 0) != (span_us == 0) {
        return Err(CtrlError::Invalid);
    }
    Ok(Msg::ProbeReport(ProbeReport {
        channel,
        train: u16_at(b, 4),
        received,
        tail,
        readings: u16_at(b, 10),
        tail_bytes: u64_at(b, 12),
        span_us,
        wobble_us: u32_at(b, 28),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_probe_and_ack_bytes() {
        let p = MtuProbe {
            channel: 1,
            id: 0x0102_0304,
            size: 1400,
            len: 20,
        };
        let b = Msg::MtuProbe(p).to_vec();
        assert_eq!(
            b,
            [0xB4, 1, 10, 1, 1, 2, 3, 4, 0x05, 0x78, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(Msg::parse(&b), Ok(Msg::MtuProbe(p)));
        let a = MtuProbe { len: 12, ..p };
        let b = Msg::MtuAck(a).to_vec();
        assert_eq!(b, [0xB4, 1, 11, 1, 1, 2, 3, 4, 0x05, 0x78, 0, 0]);
        assert_eq!(Msg::parse(&b), Ok(Msg::MtuAck(a)));
        // An ack is 12 bytes exactly; a probe at least 12.
        assert_eq!(Msg::parse(&[&b[..], &[0]].concat()), Err(CtrlError::Length));
        assert_eq!(Msg::parse(&b[..11]), Err(CtrlError::Length));
    }

    #[test]
    fn hello_bytes() {
        let h = Msg::Hello(Hello {
            channel: 2,
            channels: 3,
            rx_mask: 0b101,
            tx_epoch: 7,
            rx_epoch: 9,
            seq: 0x01_0203,
            interval_us: 50_000,
        });
        let b = h.to_vec();
        assert_eq!(
            b,
            [
                0xB4, 1, 1, 2, 3, 1, 2, 3, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 7, 0, 0, 0, 9, 0, 0,
                0xC3, 0x50
            ]
        );
        assert_eq!(Msg::parse(&b), Ok(h.clone()));
        // Without an interval (the sender is not idle): the 24-byte form.
        let Msg::Hello(usual) = Msg::parse(&b[..24]).unwrap() else {
            panic!("not a hello");
        };
        assert_eq!(usual.interval_us, 0);
        let Msg::Hello(h) = h else { unreachable!() };
        assert_eq!(Msg::Hello(usual).to_vec(), b[..24]);
        assert_eq!(
            Msg::Hello(Hello {
                interval_us: 0,
                ..h
            })
            .to_vec(),
            b[..24]
        );
        assert_eq!(Msg::parse(&b[..25]), Err(CtrlError::Length));
    }

    #[test]
    fn end_and_ack_roundtrip_and_bytes() {
        let e = Msg::End(EpochEnd {
            channel: 0,
            old_epoch: 4,
            new_epoch: 5,
            old_set: 0b011,
            new_set: 0b001,
            sent: 1000,
            finals: vec![(10, 1500), (11, -3i64 + 1503)],
        });
        let b = e.to_vec();
        assert_eq!(b.len(), 40 + 32);
        assert_eq!(&b[..5], &[0xB4, 1, 2, 0, 2]);
        assert_eq!(&b[8..16], &[0, 0, 0, 4, 0, 0, 0, 5]);
        assert_eq!(&b[40..48], &10u64.to_be_bytes());
        assert_eq!(Msg::parse(&b), Ok(e));
        let a = Msg::Ack(EpochAck {
            channel: 1,
            epoch: 5,
            set: 0b110,
        });
        let b = a.to_vec();
        assert_eq!(
            b,
            [0xB4, 1, 3, 1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 6]
        );
        assert_eq!(Msg::parse(&b), Ok(a));
    }

    #[test]
    fn feedback_bytes() {
        let f = Msg::Feedback(Feedback {
            channel: 1,
            timestamp: 0x0102_0304,
            echo: 0x0506_0708,
            echo_delay: 250,
            rx_datagrams: 9,
            rx_bytes: 0x0A0B,
            missing: 2,
            congested: 1,
        });
        let b = f.to_vec();
        assert_eq!(b.len(), 48);
        assert_eq!(
            &b[..16],
            &[0xB4, 1, 4, 1, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 250]
        );
        assert_eq!(&b[16..24], &9u64.to_be_bytes());
        assert_eq!(&b[24..32], &[0, 0, 0, 0, 0, 0, 0x0A, 0x0B]);
        assert_eq!(&b[32..40], &2u64.to_be_bytes());
        assert_eq!(&b[40..48], &1u64.to_be_bytes());
        assert_eq!(Msg::parse(&b), Ok(f.clone()));
        // A report from before the congestion count: the count is 0.
        let Msg::Feedback(mut old) = Msg::parse(&b[..40]).unwrap() else {
            panic!("a feedback message")
        };
        assert_eq!(old.congested, 0);
        old.congested = 1;
        assert_eq!(Msg::Feedback(old), f);
        for n in (0..b.len()).filter(|&n| n != 40) {
            assert!(Msg::parse(&b[..n]).is_err());
        }
        let mut long = b.clone();
        long.push(0);
        assert_eq!(Msg::parse(&long), Err(CtrlError::Length));
    }

    #[test]
    fn resend_bytes_and_limits() {
        let r = Msg::Resend(Resend {
            channel: 0,
            lost_channel: 2,
            key_index: 0x0A0B_0C0D,
            counters: vec![5, 0x0102],
        });
        let b = r.to_vec();
        assert_eq!(b.len(), 28);
        assert_eq!(
            &b[..12],
            &[0xB4, 1, 5, 0, 2, 2, 0, 0, 0x0A, 0x0B, 0x0C, 0x0D]
        );
        assert_eq!(&b[20..28], &0x0102u64.to_be_bytes());
        assert_eq!(Msg::parse(&b), Ok(r));
        for n in 0..b.len() {
            assert!(Msg::parse(&b[..n]).is_err());
        }
        // n = 0 and n > 32 are invalid even with a matching length.
        let mut z = b[..12].to_vec();
        z[5] = 0;
        assert_eq!(Msg::parse(&z), Err(CtrlError::Invalid));
        let mut big = b[..12].to_vec();
        big[5] = 33;
        big.extend(std::iter::repeat_n(0u8, 33 * 8));
        assert_eq!(Msg::parse(&big), Err(CtrlError::Invalid));
    }

    #[test]
    fn probe_bytes_padding_and_limits() {
        let p = Probe {
            channel: 2,
            train: 0x0102,
            index: 3,
            count: 48,
            len: 20,
        };
        let b = Msg::Probe(p).to_vec();
        assert_eq!(
            b,
            [0xB4, 1, 6, 2, 1, 2, 0, 3, 0, 48, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(Msg::parse(&b), Ok(Msg::Probe(p)));
        // Any padding parses, none is too short; an index past the count is invalid.
        assert_eq!(Msg::parse(&b[..12]), Ok(Msg::Probe(Probe { len: 12, ..p })));
        assert_eq!(Msg::parse(&b[..11]), Err(CtrlError::Length));
        let mut bad = b.clone();
        bad[7] = 48;
        assert_eq!(Msg::parse(&bad), Err(CtrlError::Invalid));
        // A probe asked for shorter than its header still carries the header.
        assert_eq!(Msg::Probe(Probe { len: 0, ..p }).to_vec().len(), 12);
    }

    #[test]
    fn probe_report_bytes_and_limits() {
        let r = ProbeReport {
            channel: 1,
            train: 7,
            received: 48,
            tail: 23,
            readings: 9,
            tail_bytes: 34_500,
            span_us: 2_760,
            wobble_us: 410,
        };
        let b = Msg::ProbeReport(r).to_vec();
        assert_eq!(b.len(), 32);
        assert_eq!(&b[..12], &[0xB4, 1, 7, 1, 0, 7, 0, 48, 0, 23, 0, 9]);
        assert_eq!(&b[12..20], &34_500u64.to_be_bytes());
        assert_eq!(&b[20..28], &2_760u64.to_be_bytes());
        assert_eq!(&b[28..32], &410u32.to_be_bytes());
        assert_eq!(Msg::parse(&b), Ok(Msg::ProbeReport(r)));
        assert_eq!(Msg::parse(&b[..31]), Err(CtrlError::Length));
        // Datagrams timed over no time, or more timed than received: invalid.
        let mut bad = b.clone();
        bad[9] = 0;
        assert_eq!(Msg::parse(&bad), Err(CtrlError::Invalid));
        bad[9] = 48;
        assert_eq!(Msg::parse(&bad), Err(CtrlError::Invalid));
        // A train that could not be timed: nothing timed, over no time.
        let none = ProbeReport {
            tail: 0,
            readings: 1,
            tail_bytes: 0,
            span_us: 0,
            wobble_us: 0,
            ..r
        };
        assert_eq!(
            Msg::parse(&Msg::ProbeReport(none).to_vec()),
            Ok(Msg::ProbeReport(none))
        );
    }

    #[test]
    fn close_bytes() {
        let b = Msg::Close(3).to_vec();
        assert_eq!(b, [0xB4, 1, 8, 3, 0, 0, 0, 0]);
        assert_eq!(Msg::parse(&b), Ok(Msg::Close(3)));
        assert_eq!(Msg::Close(3).channel(), 3);
        assert_eq!(Msg::parse(&b[..7]), Err(CtrlError::Length));
        assert_eq!(Msg::parse(&[&b[..], &[0]].concat()), Err(CtrlError::Length));
    }

    #[test]
    fn malformed_is_rejected_without_panic() {
        assert_eq!(Msg::parse(&[]), Err(CtrlError::Length));
        assert_eq!(Msg::parse(&[0xB4, 2, 1, 0]), Err(CtrlError::Unknown));
        assert_eq!(Msg::parse(&[0xB4, 1, 9, 0]), Err(CtrlError::Unknown));
        assert_eq!(Msg::parse(&[0xB4, 1, 8, 0]), Err(CtrlError::Length));
        assert_eq!(Msg::parse(&[0xB4, 1, 1, 0, 0]), Err(CtrlError::Length));
        // End with a count that does not match the old set.
        let mut b = Msg::End(EpochEnd {
            channel: 0,
            old_epoch: 1,
            new_epoch: 2,
            old_set: 0b11,
            new_set: 0b1,
            sent: 0,
            finals: vec![(0, 1), (0, 1)],
        })
        .to_vec();
        b[23] = 0b111;
        assert_eq!(Msg::parse(&b), Err(CtrlError::Invalid));
        // Every truncation of a valid end fails cleanly.
        let good = Msg::End(EpochEnd {
            channel: 0,
            old_epoch: 1,
            new_epoch: 2,
            old_set: 0b1,
            new_set: 0b1,
            sent: 0,
            finals: vec![(0, 1)],
        })
        .to_vec();
        for n in 0..good.len() {
            assert!(Msg::parse(&good[..n]).is_err());
        }
    }
}
