//! Deterministic random numbers.
//!
//! One scenario seed drives everything. Each random process (a channel's loss, its
//! jitter, the traffic) gets its own stream derived from the seed and a stream number,
//! so that the same seed gives the same packet sizes and the same arrival times to every
//! run variant of a scenario (common random numbers), and so that adding a channel does
//! not shift the numbers another channel draws.

pub use braid_proto::rng::mix64;

/// The simulator's generator: braid's one SplitMix64 ([`braid_proto::rng`]).
pub type Rng = braid_proto::rng::SplitMix64;

/// Stream numbers used by the simulator.
pub mod streams {
    /// Packet sizes and traffic inter-arrival times.
    pub const TRAFFIC: u64 = 1;
    /// The random scheduler's shared seed.
    pub const SCHEDULER: u64 = 2;
    /// Channel `i` uses `CHANNEL_BASE + i`.
    pub const CHANNEL_BASE: u64 = 1000;
}
