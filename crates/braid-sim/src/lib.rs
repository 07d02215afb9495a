//! # braid-sim
//!
//! A deterministic discrete-event simulator for braid. It drives the very state machines
//! of `braid-proto` (the [`braid_proto::Striper`] and the [`braid_proto::Resequencer`])
//! and only supplies virtual time, channels and traffic:
//!
//! * [`model`]: channel models (rate, delay, FIFO jitter, MTU, drop-tail queue, Bernoulli,
//!   Gilbert–Elliott and scripted loss, link down/up, corruption) and traffic sources
//!   (backlogged, constant rate, Poisson, trace replay, a closed-loop TCP-like flow
//!   ([`tcp`]); fixed, alternating, uniform,
//!   bimodal and Internet-mix sizes);
//! * [`args`]: the flags of `braid sim` and the run of a scenario file of any kind;
//! * [`run`]: what one run takes and gives (configuration, results, errors);
//! * [`engine`]: the event loop for one run;
//! * [`errctl`]: seed 002's error control over one channel (`[errctl]` runs);
//! * [`schedule`]: `braid schedule`'s table, the striper alone on one burst;
//! * [`scenario`]: TOML scenario files with runs and sweeps;
//! * [`report`]: JSON and table output;
//! * [`plot`]: SVG and PNG plots;
//! * [`credit`]: credit-based flow control on a slotted link (seed 004);
//! * [`overlay`]: the GALO overlay and Application Layer Striping (seed 003): gain of
//!   striping over the best two and three overlay paths, rerouting around a dead relay.
//!
//! One seed drives every random process; the same seed and scenario give the same
//! results bit for bit.

#![warn(missing_docs)]

pub mod args;
pub mod credit;
mod ends;
pub mod engine;
pub mod errctl;
pub mod metrics;
pub mod model;
pub mod overlay;
pub mod plot;
pub mod report;
pub mod rng;
pub mod run;
pub mod scenario;
pub mod schedule;
pub mod tcp;
mod toml_cx;
pub mod voip;

pub use engine::{run, ChannelResult, RunConfig, RunError, RunResult, Variant};
