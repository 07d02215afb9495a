//! Application-oriented error control (seed 002: Gong & Parulkar, *An Application-Oriented
//! Error Control Scheme for High Speed Networks*, WUCS-92-37).
//!
//! The application cuts its stream into **segments** of W packets and states its
//! **tolerance** (W, E, B): at most E packets lost per segment, in bursts of at most B.
//! The [`Sender`] stamps every datagram, new or sent again, with a **shipment sequence
//! number**; the [`Receiver`] detects losses from gaps in those numbers (and with a
//! **loss timer** for long bursts), runs the paper's tolerance checker over each
//! segment's packet-presence map, and asks for exactly the packets the tolerance needs
//! with a **SNAK** (selective negative acknowledgement, repeated every `ack_interval`
//! until the segment is accepted). Accepted segments are acknowledged with a **PACK**
//! (on acceptance and periodically, carrying the cumulative acknowledgement). The sender
//! keeps each segment in its window (its retransmission buffer) until it is acknowledged,
//! ignores a request for a packet it sent less than one round trip ago (premature), and
//! sends keep-alive and end-of-stream packets when idle so the receiver can see losses at
//! the tail. A segment not accepted within the **deadline** is given up: delivered with
//! its holes, counted, and a violation counted if the holes break the tolerance.
//!
//! The end of stream is acknowledged: end-of-stream packets repeat every keep-alive
//! period until the receiver, once it has every segment, answers with a PACK whose
//! cumulative acknowledgement and segment are both one past the last segment (no PACK
//! for an accepted segment has that shape); it answers every later end-of-stream packet
//! the same way. Then [`Receiver::is_complete`] and [`Sender::is_done`] hold, even if
//! every segment was acknowledged before any end-of-stream packet got through.
//!
//! Both ends are sans-IO like the rest of the crate: `handle_*` for input (with `now`),
//! `poll_*` for output. Call order for a driver:
//!
//! 1. sender: `handle_packet` while `can_accept`, `finish` at the end of the stream;
//!    `poll_transmit` whenever the link can take a datagram; `handle_datagram` for each
//!    SNAK or PACK; `handle_timeout` when `poll_timeout` is reached;
//! 2. receiver: `handle_datagram` for each arrival, `handle_timeout` when `poll_timeout`
//!    is reached, then `poll_transmit` (SNAKs, PACKs) and `poll_deliver` (segments, in
//!    order) until empty.
//!
//! Memory is bounded at both ends by `window` segments of W packets, and the receiver's
//! queue of control datagrams by [`MAX_CONTROL_QUEUE`].
//!
//! Departures from the paper: the enforcement window is the segment (the paper's advice
//! for pipelined applications, §3.1); the premature-request filter is kept per packet
//! rather than per packet group, and with `adaptive_rtt` its round trip is the longer of
//! the configured one and the one measured from acknowledgements, plus one
//! acknowledgement interval (the receiver repeats its SNAKs that often, and without the
//! margin a repeated SNAK reaching the sender just after one round trip got a
//! duplicate over a bond); packet and segment numbers wrap at 2^16 and 2^32 on the
//! wire; flow control (the PACK's window limit) is left out: the receiver holds as many
//! segments as the sender's window.

pub mod analysis;
mod check;
pub mod link;
mod receiver;
mod sender;
mod stats;

pub use check::{check, exceeds, Slot};
pub use receiver::{Receiver, Segment};
pub use sender::{SendError, Sender};
pub use stats::Stats;

use crate::time::{Duration, Instant};

/// The premature-request filter both profiles share (seed 002, §4.2): a request for a
/// packet whose last copy left at `last_sent`, less than one round trip `rtt` before
/// `now`, cannot have seen that copy's fate, so it is not answered; the copy is on its
/// way, and answering would only send a duplicate. Callers add a margin to the round
/// trip for the spacing of repeated requests and for jitter.
pub fn premature(last_sent: Instant, now: Instant, rtt: Duration) -> bool {
    now < last_sent + rtt
}

/// Most control datagrams the receiver queues before the driver polls them.
pub const MAX_CONTROL_QUEUE: usize = 1024;
/// Largest window, in segments.
pub const MAX_WINDOW: u32 = 1 << 16;

/// The application's loss tolerance (W, E, B).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tolerance {
    /// Packets per segment: the window over which losses are counted.
    pub w: u16,
    /// Most packets that may be lost per segment.
    pub e: u16,
    /// Longest run of lost packets allowed.
    pub b: u16,
}

impl Tolerance {
    /// (W, 0, 0): every packet must arrive.
    pub fn reliable(w: u16) -> Tolerance {
        Tolerance { w, e: 0, b: 0 }
    }
    /// Every loss must be repaired (E = 0 or B = 0).
    pub fn full_recovery(&self) -> bool {
        self.e == 0 || self.b == 0
    }
    /// Every loss is acceptable (E ≥ W and B ≥ W).
    pub fn tolerates_all(&self) -> bool {
        self.e >= self.w && self.b >= self.w
    }
}

/// Settings shared by both ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The tolerance; its W is the segment length in packets.
    pub tolerance: Tolerance,
    /// Segments the sender may have unacknowledged (its retransmission buffer), and the
    /// receiver may hold.
    pub window: u32,
    /// Round-trip time: the sender ignores a request for a packet it sent less than
    /// this long ago (the request cannot have seen that copy).
    pub rtt: Duration,
    /// Receiver: with no new shipment for this long, check every open segment.
    pub loss_timer: Duration,
    /// Receiver: SNAKs repeat at this interval until their segment is accepted, and a
    /// PACK with the cumulative acknowledgement goes out at this interval while packets
    /// arrive.
    pub ack_interval: Duration,
    /// Sender: keep-alive (or end-of-stream) period while idle with data unacknowledged.
    pub keepalive: Duration,
    /// A segment not accepted this long after the receiver learnt of it (at the sender:
    /// after its first packet was sent) is given up.
    pub deadline: Duration,
    /// The network's maximum resequencing distance m, in shipments: a gap larger than
    /// this means loss (0 on one FIFO channel).
    pub reorder: u32,
    /// Sender: the premature-request filter uses the longer of `rtt` and the round
    /// trip measured from acknowledgements, plus one `ack_interval` ([`Sender::rtt`]).
    /// Off, it uses `rtt` alone, as the paper does (its analysis and the simulator's
    /// reproduction assume that); on, for paths whose round trip is not known well or
    /// varies, such as a bond's (`braid send` turns it on).
    pub adaptive_rtt: bool,
}

impl Config {
    /// Defaults for tolerance `t` and a round trip of `rtt`: a window of 4 segments, the
    /// loss timer and keep-alive at `rtt / 2`, acknowledgements every `rtt / 4`, no
    /// reordering, a deadline of 60 round trips.
    pub fn new(t: Tolerance, rtt: Duration) -> Config {
        let r = rtt.as_micros().max(4);
        Config {
            tolerance: t,
            window: 4,
            rtt,
            loss_timer: Duration::from_micros(r / 2),
            ack_interval: Duration::from_micros(r / 4),
            keepalive: Duration::from_micros(r / 2),
            deadline: Duration::from_micros(r * 60),
            reorder: 0,
            adaptive_rtt: false,
        }
    }

    /// Check the settings: W ≥ 1, a window from 1 to [`MAX_WINDOW`], timers > 0.
    pub fn validate(&self) -> Result<(), String> {
        if self.tolerance.w == 0 {
            return Err("the tolerance's W (packets per segment) must be at least 1".into());
        }
        if self.window == 0 || self.window > MAX_WINDOW {
            return Err(format!("window must be 1 to {MAX_WINDOW} segments"));
        }
        for (name, d) in [
            ("loss_timer", self.loss_timer),
            ("ack_interval", self.ack_interval),
            ("keepalive", self.keepalive),
            ("deadline", self.deadline),
        ] {
            if d == Duration::ZERO {
                return Err(format!("{name} must be longer than zero"));
            }
        }
        Ok(())
    }
}
