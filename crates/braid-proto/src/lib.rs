//! # braid-proto
//!
//! The sans-IO protocol core of braid, a multipath striping system: one packet stream is
//! spread over several FIFO channels and put back together, in order, at the receiver.
//!
//! Nothing here does I/O or reads a clock: every input takes `now`, every output is
//! polled, in the style of quinn-proto. Drivers live in `braid-sim` (virtual time) and
//! `braid-io` (real sockets).
//!
//! * [`aqm`]: CoDel on the channels' queueing delay, with ECN marks, for traffic through the bond;
//! * [`sched`]: causal schedulers (SRR, RR, GRR, randomized) and non-causal baselines;
//! * [`stripe`]: the sender, [`Striper`];
//! * [`reseq`]: the receiver, [`Resequencer`], in modes `none`, `logical`, `seq`, `trr`;
//! * [`errctl`]: application-oriented error control with a loss tolerance (W, E, B),
//!   SNAK and PACK (seed 002);
//! * [`wire`]: every packet format;
//! * [`credit`]: credit-based flow control, N23 / CUP / adaptive pools (seed 004);
//! * [`overlay`]: the GALO overlay of seed 003: accessibility table, route engine over
//!   one-relay paths, reroute decision, serial probe schedule (ALCP messages in
//!   [`wire::overlay`]);
//! * [`harness`]: an in-memory sender–channels–receiver loop in virtual time, for tests.
//!
//! The papers this implements are seed 000 (SRR, logical reception, markers) and seed
//! 001 (BRR, SRR, TRR).

#![warn(missing_docs)]

pub mod aqm;
pub(crate) mod arena;
pub mod config;
pub mod credit;
pub mod errctl;
pub mod harness;
pub mod overlay;
pub mod reseq;
pub mod rng;
pub mod room;
pub mod sched;
pub mod session;
pub mod stats;
pub mod stream;
pub mod stripe;
pub mod time;
pub mod units;
pub mod wire;

pub use config::{
    ConfigError, MarkerConfig, MarkerPosition, Mode, Policy, ReceiverConfig, StripeConfig,
};
pub use reseq::Resequencer;
pub use sched::SchedulerKind;
pub use stats::{ChannelStats, Stats};
pub use stripe::{SendError, Striper, Transmit, TransmitKind};
pub use time::{Duration, Instant};
