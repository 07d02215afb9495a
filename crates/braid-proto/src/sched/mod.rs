//! Load-sharing schedulers, written as causal fair queuing (seed 000 §3).
//!
//! A causal scheduler is a state `s`, a choice `f(s)` of the channel for the next packet
//! and an update `g(s, p)` once packet `p` was sent. Because `f` depends only on packets
//! already sent, the receiver can run the same state machine and know, before a packet
//! arrives, which channel it will come on: that is *logical reception* (§4).
//!
//! * [`Srr`] is Surplus Round Robin (§3.5). Round robin (the BRR of seed 001) and GRR
//!   (generalized round robin, §6.2) are SRR that counts packets instead of bytes, with a
//!   quantum of one packet (RR) or of the channel's integer rate ratio (GRR).
//! * [`RandomFq`] is randomized fair queuing: packet `n` goes to a channel drawn with
//!   probability proportional to its weight from a counter-based generator seeded by
//!   both ends alike, so the receiver can draw the same numbers.
//! * [`baseline`] holds the non-causal schemes (shortest queue first, address hashing).
//!   They have a different type: a receiver cannot be built from them.

pub mod baseline;
pub(crate) mod random;
mod srr;

pub use random::RandomFq;
pub use srr::{Cost, Srr};

/// The implicit number of a packet on its channel (seed 000 §5): the round in which it is
/// sent and the channel's deficit counter just before it is sent, with that visit's
/// quantum already added (so `dc > 0` for every packet that is sent).
///
/// For [`RandomFq`] the number is the packet's global index in `round`, and `dc` is 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Position {
    /// Round number (SRR) or global packet index (random).
    pub round: u64,
    /// Deficit counter before the packet, quantum included (SRR); 1 for random.
    pub dc: i64,
}

/// The causal schedulers that both ends can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchedulerKind {
    /// Surplus Round Robin: quanta in bytes, proportional to channel capacity.
    Srr,
    /// Plain round robin (BRR): one packet per channel per round.
    Rr,
    /// Generalized round robin: an integer number of packets per channel per round,
    /// the closest integer ratio of the channel rates.
    Grr,
    /// Randomized fair queuing, weighted by the channel quanta, with a shared seed.
    Random {
        /// Seed shared by sender and receiver.
        seed: u64,
    },
}

impl SchedulerKind {
    /// Short lowercase name used in configs, JSON and tables.
    pub fn name(&self) -> &'static str {
        match self {
            SchedulerKind::Srr => "srr",
            SchedulerKind::Rr => "rr",
            SchedulerKind::Grr => "grr",
            SchedulerKind::Random { .. } => "random",
        }
    }
}

/// A running causal scheduler: the state `s` with `f` ([`Sched::select`]) and `g`
/// ([`Sched::on_sent`]).
#[derive(Clone, Debug)]
pub enum Sched {
    /// SRR, RR or GRR.
    Srr(Srr),
    /// Randomized fair queuing.
    Random(RandomFq),
}

impl Sched {
    /// Build the scheduler for `kind` over channels with these weights. For SRR the
    /// weights are byte quanta; for GRR packet counts per round; RR ignores them;
    /// random uses them as relative probabilities.
    pub fn new(kind: SchedulerKind, weights: &[u32]) -> Sched {
        match kind {
            SchedulerKind::Srr => Sched::Srr(Srr::new(weights, Cost::Bytes)),
            SchedulerKind::Rr => Sched::Srr(Srr::new(&vec![1; weights.len()], Cost::Packets)),
            SchedulerKind::Grr => Sched::Srr(Srr::new(weights, Cost::Packets)),
            SchedulerKind::Random { seed } => Sched::Random(RandomFq::new(weights, seed)),
        }
    }

    /// Number of channels.
    pub fn channels(&self) -> usize {
        match self {
            Sched::Srr(s) => s.channels(),
            Sched::Random(r) => r.channels(),
        }
    }

    /// `f(s)`: the channel of the next packet.
    #[inline]
    pub fn select(&self) -> usize {
        match self {
            Sched::Srr(s) => s.select(),
            Sched::Random(r) => r.select(),
        }
    }

    /// `g(s, p)`: account for a packet of `len` bytes sent on [`Sched::select`].
    #[inline]
    pub fn on_sent(&mut self, len: usize) {
        match self {
            Sched::Srr(s) => s.on_sent(len),
            Sched::Random(r) => r.on_sent(),
        }
    }

    /// The implicit number of the next packet that will be sent on `channel`.
    pub fn position(&self, channel: usize) -> Position {
        match self {
            Sched::Srr(s) => s.position(channel),
            Sched::Random(r) => r.position(channel),
        }
    }

    /// The global round (SRR) or, for random, the packet index divided by the channel
    /// count, so that "every K rounds" means about K packets per channel for both.
    pub fn round(&self) -> u64 {
        match self {
            Sched::Srr(s) => s.round(),
            Sched::Random(r) => r.index() / r.channels() as u64,
        }
    }

    /// Index of the channel the round-robin pointer is on; for random, the packet
    /// index modulo the channel count (a position within its pseudo-round).
    pub fn pointer(&self) -> usize {
        match self {
            Sched::Srr(s) => s.select(),
            Sched::Random(r) => (r.index() % r.channels() as u64) as usize,
        }
    }
}

/// GRR weights: the closest integer ratio of the channel rates, i.e. each rate divided
/// by the smallest one, rounded, at least 1.
pub fn grr_weights(rates_bps: &[f64]) -> Vec<u32> {
    let min = rates_bps
        .iter()
        .copied()
        .filter(|r| *r > 0.0)
        .fold(f64::INFINITY, f64::min);
    rates_bps
        .iter()
        .map(|r| {
            if min.is_finite() && *r > 0.0 {
                ((r / min).round() as u32).max(1)
            } else {
                1
            }
        })
        .collect()
}

/// SRR quanta in bytes proportional to the channel rates, the smallest being
/// `base` bytes, and never below `max_packet` (seed 000 §5 assumes Quantum_i >= Max).
pub fn srr_quanta(rates_bps: &[f64], base: u32, max_packet: u32) -> Vec<u32> {
    let min = rates_bps
        .iter()
        .copied()
        .filter(|r| *r > 0.0)
        .fold(f64::INFINITY, f64::min);
    let base = base.max(max_packet);
    rates_bps
        .iter()
        .map(|r| {
            let q = if min.is_finite() && *r > 0.0 {
                (base as f64 * r / min).round()
            } else {
                base as f64
            };
            (q.min(u32::MAX as f64) as u32).max(max_packet)
        })
        .collect()
}
