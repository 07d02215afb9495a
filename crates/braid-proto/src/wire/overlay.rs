//! ALCP, the overlay's control messages (seed 003: UPDATE, PROVISION, TEARDOWN), first
//! byte `0xB0`.
//!
//! The paper names the Application Layer Communication Protocol but leaves it out "due
//! to space limitations"; these formats are braid's. All integers are big-endian. Every
//! message starts with the same four bytes:
//!
//! ```text
//!  0        1        2        3
//! +--------+--------+--------+--------+
//! |  0xB0  |version |  kind  | flags  |  kind: 1 UPDATE, 2 PROVISION, 3 TEARDOWN,
//! +--------+--------+--------+--------+        4 PING, 5 PONG, 6 DATA, 7 HELLO;
//!                                              flags: 0 (reserved)
//! ```
//!
//! **UPDATE** (kind 1): node `origin`'s latest measurements of its hops to its peers,
//! 12 bytes then 18 bytes per entry:
//!
//! ```text
//! +--------+--------+--------+--------+
//! |  origin (u16)   |  count (u16)    |  4..8
//! +--------+--------+--------+--------+
//! |            seq (u32)              |  8..12  per origin, +1 per UPDATE
//! +--------+--------+--------+--------+
//! |  peer (u16)     | throughput,     |  entry: hop origin -> peer
//! +--------+--------+ kbit/s (u32)    |
//! |                 | rtt, µs (u32)   |
//! +--------+--------+                 |
//! |                 | loss, parts per |
//! +--------+--------+ million (u32)   |
//! |                 | age, ms (u32)   |  how old the measurement is when sent
//! +--------+--------+                 |
//! |                 |
//! +--------+--------+
//! ```
//!
//! **PROVISION** (kind 2): flow `flow` from `src` to `dst` is striped over `count`
//! (1..=3) paths; sent to every node on them. The source stripes with these SRR
//! weights, each relay forwards the flow's datagrams from `src` to `dst`, the
//! destination resequences. 20 bytes then 8 per path:
//!
//! ```text
//! +--------+--------+--------+--------+
//! |            flow (u32)             |  4..8
//! +--------+--------+--------+--------+
//! |   src (u16)     |   dst (u16)     |  8..12
//! +--------+--------+--------+--------+
//! | count  |    reserved (0, 3 B)     | 12..16
//! +--------+--------+--------+--------+
//! |        lifetime, ms (u32)         | 16..20  0: until TEARDOWN
//! +--------+--------+--------+--------+
//! |  relay (u16)    |  slot  |  0     |  path: relay 0xFFFF = direct
//! +--------+--------+--------+--------+
//! |      weight, bytes (u32)          |  the path's SRR quantum, > 0
//! +--------+--------+--------+--------+
//! ```
//!
//! `slot` (0..=2, distinct within a PROVISION) is the channel of the flow's striping
//! session that the path carries: a reroute that replaces one path keeps the others on
//! their channels, and the new path takes the freed slot, so the session at both ends
//! keeps running (the replaced channel goes down and comes back up over the new path).
//!
//! **TEARDOWN** (kind 3): forget flow `flow`, 12 bytes:
//!
//! ```text
//! +--------+--------+--------+--------+
//! |            flow (u32)             |  4..8
//! +--------+--------+--------+--------+
//! |   src (u16)     |   dst (u16)     |  8..12
//! +--------+--------+--------+--------+
//! ```
//!
//! **DATA** (kind 6): a datagram of a provisioned flow's striping session, with an
//! 8-byte header in front. A relay forwards it to the flow's destination (`dir` 0) or
//! source (`dir` 1), if the flow is provisioned through it on that slot and the
//! datagram came from the node before it on the path; an end hands the payload to the
//! session's channel `slot`. Like every ALCP message, DATA carries the authentication
//! trailer of its previous hop (below), which a relay checks and replaces with its own;
//! the payload is a braid session datagram, also authenticated (and by default
//! encrypted) end to end by the session itself.
//!
//! ```text
//! +--------+--------+--------+--------+
//! |  0xB0  |version |   6    |d|0000ss|  d: direction (1 = destination to source)
//! +--------+--------+--------+--------+  ss: slot, 0..=2
//! |            flow (u32)             |  4..8
//! +--------+--------+--------+--------+
//! |  session datagram ...                  8..
//! ```
//!
//! **PING** (kind 4) and **PONG** (kind 5): the DCE's probes. A light probe is one PING
//! without padding; a throughput probe is a train of PINGs padded to a size, sent back to
//! back; the peer answers each PING with a PONG carrying the same `seq` and `train`.
//!
//! ```text
//! +--------+--------+--------+--------+
//! |  sender (u16)   |    seq (u32)    |  4..10   seq: per sender
//! +--------+--------+--------+--------+
//! |        |  train (u16)    | zeros… |  10..12  0: light probe; else index in a train
//! +--------+--------+--------+--------+  PING only: padding, all zero, up to 8192 bytes
//! ```
//!
//! **Authentication.** ALCP messages carry no tag of their own: a node sends each (DATA
//! included) with the trailer of [`crate::overlay::auth`] (sender, counter,
//! ChaCha20-Poly1305 tag under the session key of that pair of nodes and direction,
//! agreed at each start with HELLOs, kind 7, formatted there) and drops any that does
//! not verify or replays a counter. A forged PROVISION would otherwise turn any node
//! into an open relay, a forged UPDATE would steer flows.
//!
//! A parsed message is valid: lengths match the counts exactly, reserved bytes are
//! zero, loss is at most one million ppm, PROVISION paths are 1..=3, distinct, loop
//! free and have non-zero weights.

use super::{read_u32, WireError, TYPE_OVERLAY, VERSION};
use crate::overlay::NodeId;

/// Kind byte of an UPDATE.
pub const KIND_UPDATE: u8 = 1;
/// Kind byte of a PROVISION.
pub const KIND_PROVISION: u8 = 2;
/// Kind byte of a TEARDOWN.
pub const KIND_TEARDOWN: u8 = 3;
/// Kind byte of a PING.
pub const KIND_PING: u8 = 4;
/// Kind byte of a PONG.
pub const KIND_PONG: u8 = 5;
/// Kind byte of a DATA datagram (see [`DataHeader`]).
pub const KIND_DATA: u8 = 6;
/// Kind byte of a HELLO (the key exchange of [`crate::overlay::auth`]).
pub const KIND_HELLO: u8 = 7;
/// The header in front of a DATA datagram's payload.
pub const DATA_HEADER_LEN: usize = 8;
/// A PONG, and a PING without padding.
pub const PING_LEN: usize = 12;
/// Most padding in a PING.
pub const MAX_PING_PAD: usize = 8192;
/// Relay value of a direct path in a PROVISION.
pub const NO_RELAY: u16 = 0xFFFF;
/// Fixed part of an UPDATE.
pub const UPDATE_HEADER_LEN: usize = 12;
/// One UPDATE entry.
pub const UPDATE_ENTRY_LEN: usize = 18;
/// Fixed part of a PROVISION.
pub const PROVISION_HEADER_LEN: usize = 20;
/// One PROVISION path.
pub const PROVISION_PATH_LEN: usize = 8;
/// A TEARDOWN.
pub const TEARDOWN_LEN: usize = 12;
/// Most paths in a PROVISION.
pub const MAX_PROVISION_PATHS: usize = 3;
/// Loss is carried in parts per million.
pub const LOSS_SCALE: u32 = 1_000_000;

fn read_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// One measured hop in an UPDATE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UpdateEntry {
    /// The hop's far end (the near end is the UPDATE's origin).
    pub peer: NodeId,
    /// Throughput, kbit/s.
    pub throughput_kbps: u32,
    /// RTT, µs.
    pub rtt_us: u32,
    /// Loss, parts per million (at most [`LOSS_SCALE`]).
    pub loss_ppm: u32,
    /// Age of the measurement when the UPDATE was sent, ms.
    pub age_ms: u32,
}

/// One path of a PROVISION.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProvisionPath {
    /// The relay; `None` for the direct path.
    pub relay: Option<NodeId>,
    /// The session channel the path carries, `0..MAX_PROVISION_PATHS`, distinct.
    pub slot: u8,
    /// SRR quantum, bytes (> 0).
    pub weight: u32,
}

/// A validated ALCP message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Repr {
    /// Measurements of `origin`'s hops.
    Update {
        /// The measuring node.
        origin: NodeId,
        /// Sequence number per origin (a receiver keeps the newest).
        seq: u32,
        /// The hops.
        entries: Vec<UpdateEntry>,
    },
    /// Set up a striped flow.
    Provision {
        /// Flow id, chosen by the source.
        flow: u32,
        /// Source node.
        src: NodeId,
        /// Destination node.
        dst: NodeId,
        /// Lifetime in ms; 0 = until TEARDOWN.
        lifetime_ms: u32,
        /// The paths, best first.
        paths: Vec<ProvisionPath>,
    },
    /// A probe.
    Ping {
        /// The prober.
        sender: NodeId,
        /// Sequence number, per sender.
        seq: u32,
        /// 0 for a light probe; the index in a throughput probe's train (from 1).
        train: u16,
        /// Zero bytes after the fixed part.
        pad: u16,
    },
    /// The answer to a PING.
    Pong {
        /// The node answering.
        sender: NodeId,
        /// The PING's sequence number.
        seq: u32,
        /// The PING's train index.
        train: u16,
    },
    /// Forget a flow.
    Teardown {
        /// Flow id.
        flow: u32,
        /// Source node.
        src: NodeId,
        /// Destination node.
        dst: NodeId,
    },
}

/// The header of a DATA datagram (kind 6): which flow, which of its session's
/// channels, which way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataHeader {
    /// The flow, as provisioned.
    pub flow: u32,
    /// The session channel, `0..MAX_PROVISION_PATHS`.
    pub slot: u8,
    /// `false`: source to destination; `true`: destination to source.
    pub reverse: bool,
}

impl DataHeader {
    /// Split a DATA datagram into its header and payload. Never panics.
    pub fn parse(b: &[u8]) -> Result<(DataHeader, &[u8]), WireError> {
        if b.len() < DATA_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if b[0] != TYPE_OVERLAY || b[2] != KIND_DATA {
            return Err(WireError::Invalid);
        }
        if b[1] != VERSION {
            return Err(WireError::Version(b[1]));
        }
        if b[3] & 0x7C != 0 {
            return Err(WireError::Reserved(b[3] & 0x7C));
        }
        let slot = b[3] & 0x03;
        if slot as usize >= MAX_PROVISION_PATHS {
            return Err(WireError::Invalid);
        }
        if b.len() == DATA_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        Ok((
            DataHeader {
                flow: read_u32(b, 4),
                slot,
                reverse: b[3] & 0x80 != 0,
            },
            &b[DATA_HEADER_LEN..],
        ))
    }

    /// Whether `b` is a DATA datagram (its first three bytes), without checking more.
    pub fn is_data(b: &[u8]) -> bool {
        b.len() >= 3 && b[0] == TYPE_OVERLAY && b[2] == KIND_DATA
    }

    /// The 8 header bytes.
    pub fn bytes(&self) -> [u8; DATA_HEADER_LEN] {
        let f = self.flow.to_be_bytes();
        let d = (self.slot & 0x03) | if self.reverse { 0x80 } else { 0 };
        [TYPE_OVERLAY, VERSION, KIND_DATA, d, f[0], f[1], f[2], f[3]]
    }
}

fn exact(len: usize, want: usize) -> Result<(), WireError> {
    match len.cmp(&want) {
        core::cmp::Ordering::Less => Err(WireError::Truncated),
        core::cmp::Ordering::Greater => Err(WireError::Trailing),
        core::cmp::Ordering::Equal => Ok(()),
    }
}

impl Repr {
    /// Parse and validate an ALCP datagram. Never panics, whatever the bytes.
    pub fn parse(b: &[u8]) -> Result<Repr, WireError> {
        if b.len() < 4 {
            return Err(WireError::Truncated);
        }
        if b[0] != TYPE_OVERLAY {
            return Err(WireError::Invalid);
        }
        if b[1] != VERSION {
            return Err(WireError::Version(b[1]));
        }
        if b[3] != 0 {
            return Err(WireError::Reserved(b[3]));
        }
        match b[2] {
            KIND_UPDATE => parse_update(b),
            KIND_PROVISION => parse_provision(b),
            KIND_TEARDOWN => {
                exact(b.len(), TEARDOWN_LEN)?;
                let r = Repr::Teardown {
                    flow: read_u32(b, 4),
                    src: read_u16(b, 8),
                    dst: read_u16(b, 10),
                };
                r.validate()?;
                Ok(r)
            }
            KIND_PING | KIND_PONG => parse_ping(b),
            other => Err(WireError::Reserved(other)),
        }
    }

    /// Check the fields `emit` would write: what `parse` would refuse is refused here.
    pub fn validate(&self) -> Result<(), WireError> {
        let node_ok = |n: NodeId| n != NO_RELAY;
        match self {
            Repr::Update {
                origin, entries, ..
            } => {
                if !node_ok(*origin) || entries.len() > u16::MAX as usize {
                    return Err(WireError::Invalid);
                }
                for e in entries {
                    if e.loss_ppm > LOSS_SCALE || e.peer == *origin || !node_ok(e.peer) {
                        return Err(WireError::Invalid);
                    }
                }
                Ok(())
            }
            Repr::Provision {
                src, dst, paths, ..
            } => validate_provision(*src, *dst, paths),
            Repr::Teardown { src, dst, .. } => {
                if !node_ok(*src) || !node_ok(*dst) || src == dst {
                    return Err(WireError::Invalid);
                }
                Ok(())
            }
            Repr::Ping { sender, pad, .. } => {
                if !node_ok(*sender) || *pad as usize > MAX_PING_PAD {
                    return Err(WireError::Invalid);
                }
                Ok(())
            }
            Repr::Pong { sender, .. } => {
                if !node_ok(*sender) {
                    return Err(WireError::Invalid);
                }
                Ok(())
            }
        }
    }

    /// Bytes [`Repr::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        match self {
            Repr::Update { entries, .. } => UPDATE_HEADER_LEN + entries.len() * UPDATE_ENTRY_LEN,
            Repr::Provision { paths, .. } => {
                PROVISION_HEADER_LEN + paths.len() * PROVISION_PATH_LEN
            }
            Repr::Teardown { .. } => TEARDOWN_LEN,
            Repr::Ping { pad, .. } => PING_LEN + *pad as usize,
            Repr::Pong { .. } => PING_LEN,
        }
    }

    /// Write the message into the front of `buf`; returns the bytes written. Fails if
    /// the message is invalid ([`Repr::validate`]) or `buf` is too short.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        self.validate()?;
        let len = self.buffer_len();
        if buf.len() < len {
            return Err(WireError::Truncated);
        }
        let b = &mut buf[..len];
        b.fill(0);
        b[0] = TYPE_OVERLAY;
        b[1] = VERSION;
        match self {
            Repr::Update {
                origin,
                seq,
                entries,
            } => emit_update(b, *origin, *seq, entries),
            Repr::Provision {
                flow,
                src,
                dst,
                lifetime_ms,
                paths,
            } => emit_provision(b, (*flow, *src, *dst, *lifetime_ms), paths),
            Repr::Ping {
                sender, seq, train, ..
            }
            | Repr::Pong {
                sender, seq, train, ..
            } => {
                b[2] = if matches!(self, Repr::Ping { .. }) {
                    KIND_PING
                } else {
                    KIND_PONG
                };
                b[4..6].copy_from_slice(&sender.to_be_bytes());
                b[6..10].copy_from_slice(&seq.to_be_bytes());
                b[10..12].copy_from_slice(&train.to_be_bytes());
            }
            Repr::Teardown { flow, src, dst } => {
                b[2] = KIND_TEARDOWN;
                b[4..8].copy_from_slice(&flow.to_be_bytes());
                b[8..10].copy_from_slice(&src.to_be_bytes());
                b[10..12].copy_from_slice(&dst.to_be_bytes());
            }
        }
        Ok(len)
    }

    /// Emit into a new vector.
    pub fn to_vec(&self) -> Result<Vec<u8>, WireError> {
        let mut v = vec![0; self.buffer_len()];
        self.emit(&mut v)?;
        Ok(v)
    }
}

/// A PROVISION's fields as [`Repr::validate`] checks them: two distinct nodes, one to
/// [`MAX_PROVISION_PATHS`] paths, each with a weight, a relay other than the two ends
/// (or none) and a slot in range, no two with the same relay or slot.
fn validate_provision(src: NodeId, dst: NodeId, paths: &[ProvisionPath]) -> Result<(), WireError> {
    if src == NO_RELAY || dst == NO_RELAY || src == dst {
        return Err(WireError::Invalid);
    }
    if paths.is_empty() || paths.len() > MAX_PROVISION_PATHS {
        return Err(WireError::Invalid);
    }
    for (i, p) in paths.iter().enumerate() {
        if p.weight == 0 || p.relay.is_some_and(|r| r == src || r == dst) {
            return Err(WireError::Invalid);
        }
        if p.slot as usize >= MAX_PROVISION_PATHS {
            return Err(WireError::Invalid);
        }
        if paths[..i]
            .iter()
            .any(|q| q.relay == p.relay || q.slot == p.slot)
        {
            return Err(WireError::Invalid);
        }
    }
    Ok(())
}

/// An UPDATE's kind, header and entries into `b` (zeroed, of the right length).
fn emit_update(b: &mut [u8], origin: NodeId, seq: u32, entries: &[UpdateEntry]) {
    b[2] = KIND_UPDATE;
    b[4..6].copy_from_slice(&origin.to_be_bytes());
    b[6..8].copy_from_slice(&(entries.len() as u16).to_be_bytes());
    b[8..12].copy_from_slice(&seq.to_be_bytes());
    for (i, e) in entries.iter().enumerate() {
        let at = UPDATE_HEADER_LEN + i * UPDATE_ENTRY_LEN;
        b[at..at + 2].copy_from_slice(&e.peer.to_be_bytes());
        b[at + 2..at + 6].copy_from_slice(&e.throughput_kbps.to_be_bytes());
        b[at + 6..at + 10].copy_from_slice(&e.rtt_us.to_be_bytes());
        b[at + 10..at + 14].copy_from_slice(&e.loss_ppm.to_be_bytes());
        b[at + 14..at + 18].copy_from_slice(&e.age_ms.to_be_bytes());
    }
}

/// A PROVISION's kind, header (flow, source, destination, lifetime) and paths into `b`
/// (zeroed, of the right length).
fn emit_provision(
    b: &mut [u8],
    (flow, src, dst, lifetime_ms): (u32, NodeId, NodeId, u32),
    paths: &[ProvisionPath],
) {
    b[2] = KIND_PROVISION;
    b[4..8].copy_from_slice(&flow.to_be_bytes());
    b[8..10].copy_from_slice(&src.to_be_bytes());
    b[10..12].copy_from_slice(&dst.to_be_bytes());
    b[12] = paths.len() as u8;
    b[16..20].copy_from_slice(&lifetime_ms.to_be_bytes());
    for (i, p) in paths.iter().enumerate() {
        let at = PROVISION_HEADER_LEN + i * PROVISION_PATH_LEN;
        b[at..at + 2].copy_from_slice(&p.relay.unwrap_or(NO_RELAY).to_be_bytes());
        b[at + 2] = p.slot;
        b[at + 4..at + 8].copy_from_slice(&p.weight.to_be_bytes());
    }
}

/// An UPDATE: the origin's measurements of its hops, none to itself.
fn parse_update(b: &[u8]) -> Result<Repr, WireError> {
    if b.len() < UPDATE_HEADER_LEN {
        return Err(WireError::Truncated);
    }
    let origin = read_u16(b, 4);
    let count = read_u16(b, 6) as usize;
    exact(b.len(), UPDATE_HEADER_LEN + count * UPDATE_ENTRY_LEN)?;
    let seq = read_u32(b, 8);
    let mut entries = Vec::with_capacity(count);
    for i in 0..count {
        let at = UPDATE_HEADER_LEN + i * UPDATE_ENTRY_LEN;
        let e = UpdateEntry {
            peer: read_u16(b, at),
            throughput_kbps: read_u32(b, at + 2),
            rtt_us: read_u32(b, at + 6),
            loss_ppm: read_u32(b, at + 10),
            age_ms: read_u32(b, at + 14),
        };
        if e.loss_ppm > LOSS_SCALE || e.peer == origin || e.peer == NO_RELAY {
            return Err(WireError::Invalid);
        }
        entries.push(e);
    }
    if origin == NO_RELAY {
        return Err(WireError::Invalid);
    }
    Ok(Repr::Update {
        origin,
        seq,
        entries,
    })
}

/// A PROVISION: a flow's 1 to MAX_PROVISION_PATHS paths.
fn parse_provision(b: &[u8]) -> Result<Repr, WireError> {
    if b.len() < PROVISION_HEADER_LEN {
        return Err(WireError::Truncated);
    }
    let count = b[12] as usize;
    if count == 0 || count > MAX_PROVISION_PATHS {
        return Err(WireError::Invalid);
    }
    if b[13..16] != [0, 0, 0] {
        return Err(WireError::Reserved(b[13] | b[14] | b[15]));
    }
    exact(b.len(), PROVISION_HEADER_LEN + count * PROVISION_PATH_LEN)?;
    let mut paths = Vec::with_capacity(count);
    for i in 0..count {
        let at = PROVISION_HEADER_LEN + i * PROVISION_PATH_LEN;
        let relay = read_u16(b, at);
        if b[at + 3] != 0 {
            return Err(WireError::Reserved(b[at + 3]));
        }
        paths.push(ProvisionPath {
            relay: (relay != NO_RELAY).then_some(relay),
            slot: b[at + 2],
            weight: read_u32(b, at + 4),
        });
    }
    let r = Repr::Provision {
        flow: read_u32(b, 4),
        src: read_u16(b, 8),
        dst: read_u16(b, 10),
        lifetime_ms: read_u32(b, 16),
        paths,
    };
    r.validate()?;
    Ok(r)
}

/// A PING (zero padding up to MAX_PING_PAD) or a PONG (no padding).
fn parse_ping(b: &[u8]) -> Result<Repr, WireError> {
    if b.len() < PING_LEN {
        return Err(WireError::Truncated);
    }
    let sender = read_u16(b, 4);
    let seq = read_u32(b, 6);
    let train = read_u16(b, 10);
    if sender == NO_RELAY {
        return Err(WireError::Invalid);
    }
    if b[2] == KIND_PONG {
        exact(b.len(), PING_LEN)?;
        return Ok(Repr::Pong { sender, seq, train });
    }
    let pad = b.len() - PING_LEN;
    if pad > MAX_PING_PAD {
        return Err(WireError::Trailing);
    }
    if b[PING_LEN..].iter().any(|&x| x != 0) {
        return Err(WireError::Invalid);
    }
    Ok(Repr::Ping {
        sender,
        seq,
        train,
        pad: pad as u16,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update() -> Repr {
        Repr::Update {
            origin: 2,
            seq: 0x0102_0304,
            entries: vec![UpdateEntry {
                peer: 5,
                throughput_kbps: 10_000,
                rtt_us: 40_000,
                loss_ppm: 2_500,
                age_ms: 300,
            }],
        }
    }

    fn provision() -> Repr {
        Repr::Provision {
            flow: 7,
            src: 0,
            dst: 4,
            lifetime_ms: 0,
            paths: vec![
                ProvisionPath {
                    relay: Some(2),
                    slot: 0,
                    weight: 6000,
                },
                ProvisionPath {
                    relay: None,
                    slot: 2,
                    weight: 1500,
                },
            ],
        }
    }

    #[test]
    fn update_vector() {
        let bytes = update().to_vec().unwrap();
        #[rustfmt::skip]
        let want = [
            0xB0, 0x01, 0x01, 0x00,
            0x00, 0x02, 0x00, 0x01,
            0x01, 0x02, 0x03, 0x04,
            0x00, 0x05,
            0x00, 0x00, 0x27, 0x10,
            0x00, 0x00, 0x9C, 0x40,
            0x00, 0x00, 0x09, 0xC4,
            0x00, 0x00, 0x01, 0x2C,
        ];
        assert_eq!(bytes, want);
        assert_eq!(Repr::parse(&bytes), Ok(update()));
    }

    #[test]
    fn provision_vector() {
        let bytes = provision().to_vec().unwrap();
        #[rustfmt::skip]
        let want = [
            0xB0, 0x01, 0x02, 0x00,
            0x00, 0x00, 0x00, 0x07,
            0x00, 0x00, 0x00, 0x04,
            0x02, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00,
            0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x17, 0x70,
            0xFF, 0xFF, 0x02, 0x00, 0x00, 0x00, 0x05, 0xDC,
        ];
        assert_eq!(bytes, want);
        assert_eq!(Repr::parse(&bytes), Ok(provision()));
    }

    #[test]
    fn data_vector() {
        let h = DataHeader {
            flow: 0x0102_0304,
            slot: 2,
            reverse: true,
        };
        let mut d = h.bytes().to_vec();
        assert_eq!(d, [0xB0, 1, 6, 0x82, 1, 2, 3, 4]);
        assert_eq!(DataHeader::parse(&d), Err(WireError::Truncated));
        d.extend_from_slice(b"xy");
        assert!(DataHeader::is_data(&d));
        assert_eq!(DataHeader::parse(&d), Ok((h, &b"xy"[..])));
        let mut b = d.clone();
        b[3] = 0x03;
        assert_eq!(DataHeader::parse(&b), Err(WireError::Invalid));
        let mut b = d.clone();
        b[3] = 0x42;
        assert_eq!(DataHeader::parse(&b), Err(WireError::Reserved(0x40)));
        let mut b = d.clone();
        b[2] = KIND_PING;
        assert!(!DataHeader::is_data(&b));
        assert_eq!(DataHeader::parse(&b), Err(WireError::Invalid));
        // Not an ALCP message.
        assert!(Repr::parse(&d).is_err());
    }

    #[test]
    fn teardown_vector() {
        let t = Repr::Teardown {
            flow: 0xDEAD_BEEF,
            src: 1,
            dst: 3,
        };
        let bytes = t.to_vec().unwrap();
        assert_eq!(bytes, [0xB0, 1, 3, 0, 0xDE, 0xAD, 0xBE, 0xEF, 0, 1, 0, 3]);
        assert_eq!(Repr::parse(&bytes), Ok(t));
    }

    #[test]
    fn malformed_is_rejected() {
        let good = provision().to_vec().unwrap();
        assert_eq!(Repr::parse(&[]), Err(WireError::Truncated));
        assert_eq!(Repr::parse(&good[..3]), Err(WireError::Truncated));
        assert_eq!(
            Repr::parse(&good[..good.len() - 1]),
            Err(WireError::Truncated)
        );
        let mut long = good.clone();
        long.push(0);
        assert_eq!(Repr::parse(&long), Err(WireError::Trailing));
        let mut b = good.clone();
        b[0] = 0xB1;
        assert_eq!(Repr::parse(&b), Err(WireError::Invalid));
        let mut b = good.clone();
        b[1] = 9;
        assert_eq!(Repr::parse(&b), Err(WireError::Version(9)));
        let mut b = good.clone();
        b[2] = 9;
        assert_eq!(Repr::parse(&b), Err(WireError::Reserved(9)));
        let mut b = good.clone();
        b[3] = 1;
        assert_eq!(Repr::parse(&b), Err(WireError::Reserved(1)));
        // Path count 0 and 4.
        for c in [0u8, 4] {
            let mut b = good.clone();
            b[12] = c;
            assert_eq!(Repr::parse(&b), Err(WireError::Invalid));
        }
        // A relay that is the destination (a loop), a zero weight, a duplicate path.
        let mut b = good.clone();
        b[21] = 4;
        assert_eq!(Repr::parse(&b), Err(WireError::Invalid));
        let mut b = good.clone();
        b[24..28].fill(0);
        assert_eq!(Repr::parse(&b), Err(WireError::Invalid));
        let mut b = good.clone();
        b[28..30].copy_from_slice(&[0, 2]);
        assert_eq!(Repr::parse(&b), Err(WireError::Invalid));
        // A slot out of range, a slot used twice, the byte after the slot not zero.
        let mut b = good.clone();
        b[30] = 3;
        assert_eq!(Repr::parse(&b), Err(WireError::Invalid));
        let mut b = good.clone();
        b[30] = 0;
        assert_eq!(Repr::parse(&b), Err(WireError::Invalid));
        let mut b = good.clone();
        b[31] = 1;
        assert_eq!(Repr::parse(&b), Err(WireError::Reserved(1)));
        // UPDATE: loss above one, count that does not match, peer = origin.
        let u = update().to_vec().unwrap();
        let mut b = u.clone();
        b[22..26].copy_from_slice(&1_000_001u32.to_be_bytes());
        assert_eq!(Repr::parse(&b), Err(WireError::Invalid));
        let mut b = u.clone();
        b[7] = 2;
        assert_eq!(Repr::parse(&b), Err(WireError::Truncated));
        let mut b = u.clone();
        b[13] = 2;
        assert_eq!(Repr::parse(&b), Err(WireError::Invalid));
        // TEARDOWN from a node to itself.
        assert_eq!(
            Repr::parse(&[0xB0, 1, 3, 0, 0, 0, 0, 1, 0, 2, 0, 2]),
            Err(WireError::Invalid)
        );
    }

    #[test]
    fn ping_pong_vectors() {
        let p = Repr::Ping {
            sender: 3,
            seq: 0x0A0B_0C0D,
            train: 2,
            pad: 4,
        };
        let bytes = p.to_vec().unwrap();
        assert_eq!(
            bytes,
            [0xB0, 1, 4, 0, 0, 3, 0x0A, 0x0B, 0x0C, 0x0D, 0, 2, 0, 0, 0, 0]
        );
        assert_eq!(Repr::parse(&bytes), Ok(p.clone()));
        let q = Repr::Pong {
            sender: 4,
            seq: 9,
            train: 0,
        };
        let bytes = q.to_vec().unwrap();
        assert_eq!(bytes, [0xB0, 1, 5, 0, 0, 4, 0, 0, 0, 9, 0, 0]);
        assert_eq!(Repr::parse(&bytes), Ok(q.clone()));
        // Non-zero padding, padding on a PONG, a short PING.
        let mut b = p.to_vec().unwrap();
        b[15] = 1;
        assert_eq!(Repr::parse(&b), Err(WireError::Invalid));
        let mut b = q.to_vec().unwrap();
        b.push(0);
        assert_eq!(Repr::parse(&b), Err(WireError::Trailing));
        assert_eq!(Repr::parse(&bytes[..11]), Err(WireError::Truncated));
    }

    #[test]
    fn emit_refuses_what_parse_would() {
        let bad = Repr::Provision {
            flow: 1,
            src: 0,
            dst: 0,
            lifetime_ms: 0,
            paths: vec![ProvisionPath {
                relay: None,
                slot: 0,
                weight: 1,
            }],
        };
        assert_eq!(bad.to_vec(), Err(WireError::Invalid));
        let mut short = [0u8; 4];
        assert_eq!(update().emit(&mut short), Err(WireError::Truncated));
    }
}
