//! Credit-based flow control experiments (seed 004) on the paper's own model: a slotted
//! link that carries one cell per cell time from a sender to a receiver, with the same
//! one-way delay both ways (RTT in cell times), per-unit sources upstream and per-unit
//! forwarding rates downstream.
//!
//! This is a dedicated runner rather than braid's channel engine: the paper's results
//! are about cells, credit round trips and a shared buffer, not about striping packets
//! over channels, and a slotted model gives the paper's numbers directly (RTT = 100
//! cell times, bandwidths as fractions of the link). It drives the very
//! [`braid_proto::credit`] machines, and every credit and check crosses the link as
//! bytes in the `wire::credit` format.
//!
//! A scenario file says `kind = "credit"`; `docs/scenarios.md` documents the keys.

use std::fmt::Write as _;
use std::path::Path;

use braid_proto::credit::{Allocation, CreditReceiver, CreditSender, ReceiverConfig, SenderConfig};
use braid_proto::{Duration, Instant};
use serde::Serialize;
use toml::{Table, Value};

/// One unit's traffic and forwarding.
#[derive(Clone, Debug, PartialEq)]
pub struct UnitSpec {
    /// `(from slot, offered load as a fraction of the link)`, in slot order.
    pub load: Vec<(u64, f64)>,
    /// Cells per burst; 0 for smooth (fluid) arrivals at the offered load.
    pub burst: u32,
    /// Cells the receiver can forward downstream per slot (1 = not congested).
    pub downstream: f64,
}

/// How buffer space is given out in a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Control {
    /// No flow control at all: the sender sends whatever it has.
    None,
    /// Credits with this allocation.
    Credit(Allocation),
}

/// One run of a credit scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct CreditRun {
    /// Label.
    pub label: String,
    /// Slots to simulate.
    pub slots: u64,
    /// Round-trip time in slots (the one-way delay is half of it).
    pub rtt: u64,
    /// Timeline bucket, slots (and the measurement interval of adaptive allocation).
    pub interval: u64,
    /// Credit-check interval, slots.
    pub check_interval: u64,
    /// Receiver memory in cells; a cell arriving when it is full overflows.
    pub memory: u64,
    /// The credit pool (ignored without flow control).
    pub pool: u32,
    /// Flow control.
    pub control: Control,
    /// Probability that a data cell is lost on the link.
    pub data_loss: f64,
    /// Probability that a credit message is lost.
    pub credit_loss: f64,
    /// The units.
    pub units: Vec<UnitSpec>,
}

/// A loaded credit scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct CreditScenario {
    /// Name.
    pub name: String,
    /// Free text.
    pub description: String,
    /// Seed used when none is given.
    pub seed: u64,
    /// The runs.
    pub runs: Vec<CreditRun>,
}

/// One unit's results.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct UnitReport {
    /// Allocation N2 + N3 at the end of each interval (null without flow control).
    pub allocation: Vec<Option<u32>>,
    /// Cells forwarded downstream in each interval, as a fraction of the link.
    pub throughput: Vec<f64>,
    /// Cells forwarded over the whole run, as a fraction of the link.
    pub mean_throughput: f64,
    /// Cells offered by the source over the whole run.
    pub offered: u64,
    /// Cells forwarded downstream.
    pub forwarded: u64,
}

/// One run's results.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RunReport {
    /// The run's label.
    pub label: String,
    /// Cells that arrived when the receiver's memory was full (dropped).
    pub receiver_overflow: u64,
    /// Times a unit went from sendable to blocked for lack of credit.
    pub credit_stalls: u64,
    /// Cells refused by the receiver as beyond their credit.
    pub refused: u64,
    /// Most cells held in the receiver's memory at once.
    pub max_memory: u64,
    /// Cells lost on the link (data loss).
    pub data_lost: u64,
    /// Lost cells found by credit checks.
    pub lost_recovered: u64,
    /// Credit messages sent by the receiver.
    pub credits_sent: u64,
    /// Credit messages lost on the way.
    pub credits_lost: u64,
    /// Credit checks sent.
    pub checks_sent: u64,
    /// Forwarded cells per slot, all units, over the whole run.
    pub throughput: f64,
    /// Mean cell times a cell waits at the sender before it is sent (Little's law over
    /// the source queues): how fast bursts clear.
    pub mean_wait: f64,
    /// The P5 bound (N2 + N3) / (RTT + N2) per unit, for static allocations.
    pub p5_bound: Option<f64>,
    /// Per unit.
    pub units: Vec<UnitReport>,
}

/// The JSON document for a credit scenario.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// Seed.
    pub seed: u64,
    /// One entry per run.
    pub runs: Vec<RunReport>,
}

impl Report {
    /// One JSON object.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// A table, one line per run.
    pub fn to_table(&self) -> String {
        let mut s = format!("scenario {} (seed {})\n", self.scenario, self.seed);
        let _ = writeln!(
            s,
            "{:<28} {:>10} {:>8} {:>8} {:>8} {:>9} {:>8} {:>9}",
            "run",
            "throughput",
            "overflow",
            "stalls",
            "refused",
            "max_mem",
            "P5 bound",
            "mean_wait"
        );
        for r in &self.runs {
            let bound = r.p5_bound.map_or("-".into(), |b| format!("{b:.3}"));
            let _ = writeln!(
                s,
                "{:<28} {:>10.3} {:>8} {:>8} {:>8} {:>9} {:>8} {:>9.1}",
                r.label,
                r.throughput,
                r.receiver_overflow,
                r.credit_stalls,
                r.refused,
                r.max_memory,
                bound,
                r.mean_wait
            );
        }
        s
    }
}

mod parse;
mod sim;

pub use parse::{load, parse};
pub use sim::run;

/// Run every run of a scenario with `seed`.
pub fn run_scenario(sc: &CreditScenario, seed: u64) -> Report {
    Report {
        scenario: sc.name.clone(),
        seed,
        runs: sc.runs.iter().map(|r| run(r, seed)).collect(),
    }
}

/// Is this scenario file a credit scenario (`kind = "credit"`)? Reads the file.
pub fn is_credit_file(path: &Path) -> bool {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| t.parse::<Table>().ok())
        .and_then(|t| t.get("kind").and_then(Value::as_str).map(|k| k == "credit"))
        .unwrap_or(false)
}

/// Build the sender and receiver machines of a run (None without flow control).
fn machines(r: &CreditRun) -> Option<(CreditSender, CreditReceiver)> {
    let Control::Credit(allocation) = r.control else {
        return None;
    };
    let n = r.units.len();
    let initial = match allocation {
        Allocation::Static { n2, n3 } => n2 + n3,
        Allocation::Adaptive { .. } => (r.pool / n as u32).max(2),
    };
    let rcfg = ReceiverConfig {
        pool: r.pool,
        initial_allocation: initial,
        allocation,
        counter_origin: 0,
    };
    let scfg = SenderConfig {
        initial_allocation: initial,
        check_interval: Duration::from_micros(r.check_interval),
        counter_origin: 0,
    };
    // Validated when the scenario was parsed.
    let rx = CreditReceiver::new(n, rcfg).ok()?;
    Some((CreditSender::new(n, scfg), rx))
}

fn slot(t: u64) -> Instant {
    Instant::from_micros(t)
}
