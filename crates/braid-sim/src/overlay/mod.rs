//! Seed 003 in the simulator: the GALO overlay and Application Layer Striping.
//!
//! A scenario (`kind = "overlay"`) is a full mesh of N nodes with a directed link per
//! ordered pair (available capacity, one-way delay, loss), optional access capacities
//! per node, and one or both of:
//!
//! * **`[gain]`**, the paper's §V experiment: in each of `rounds` rounds a *sampling
//!   block* measures every hop (the capacities drawn around their base values, plus
//!   measurement noise), the route engine ([`braid_proto::overlay::route`]) chooses the
//!   best two and best three paths of every source/destination pair from those
//!   measurements, and a *reroute block* (capacities drawn again: the network moved on)
//!   runs, for every pair, the default (direct) path alone and the stripes over the two
//!   and the three chosen paths. **The stripes are run, not summed**: each path is one
//!   channel of braid's own SRR [`braid_proto::Striper`] with quanta from the *measured*
//!   shares, the destination is braid's logical-reception
//!   [`braid_proto::Resequencer`], in the discrete-event engine ([`crate::engine`]), so a
//!   wrong weight, a lossy path or a slow path costs what it costs. A path's channel has
//!   the sum of its hops' delays (plus `relay_delay_ms` per relay, the application-layer
//!   switching the paper worries about), their combined loss, and as rate its *true*
//!   bottleneck, limited on the shared access links (the source's uplink, the
//!   destination's downlink) to the fraction of the traffic SRR offers it
//!   ([`stripe_channels`]); channels are otherwise independent. The default path is
//!   run the same way, alone.
//!   The gain of a flow is its goodput over the pair's *average* default-path goodput,
//!   the paper's baseline. The report has every flow, the CDF and a summary.
//! * **`[flow]`**, one flow over time with `[[event]]`s (a node killed or revived, a
//!   link's capacity or loss changed): the DCE's serial throughput probes and light
//!   pings, UPDATEs travelling to the source with the links' delays, the source's
//!   [`braid_proto::overlay::Rerouter`] evaluating every `eval_ms` — all in virtual
//!   time, with braid-proto's machines — and the data plane run segment by segment in
//!   the engine. The report gives every reroute, why, and how long after the event that
//!   caused it, and the goodput of every segment.

use std::fmt::Write as _;
use std::path::Path;

use braid_proto::overlay::Metric;
use serde::Serialize;
use toml::{Table, Value};

mod flow;
mod gain;
mod parse;
pub mod plot;

pub use parse::{load, parse, MAX_NODES};

/// One directed link of the mesh.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// Capacity available to the overlay, Mbit/s.
    pub mbps: f64,
    /// One-way delay, ms.
    pub delay_ms: f64,
    /// Loss probability per packet.
    pub loss: f64,
}

/// The `[gain]` experiment.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GainSpec {
    /// Sampling + reroute rounds (each gives one striped flow per pair and path count).
    pub rounds: u32,
    /// Length of each flow in the engine, s.
    pub flow_s: f64,
    /// Each block draws each link's capacity uniformly in base × (1 ± variation).
    pub variation: f64,
    /// Each throughput measurement is off by a uniform factor in 1 ± noise.
    pub noise: f64,
}

/// The `[flow]` run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlowSpec {
    /// Source node index.
    pub src: usize,
    /// Destination node index.
    pub dst: usize,
    /// When the flow starts (the first probe cycle should be over by then), s.
    pub start_s: f64,
    /// When it ends, s.
    pub end_s: f64,
    /// Paths to stripe over, 1..=3.
    pub max_paths: usize,
}

/// The overlay's control timing (`[control]`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Control {
    /// Throughput probe slot, ms (one ordered pair per slot, in series).
    pub slot_ms: u64,
    /// Probe length inside its slot, ms.
    pub probe_ms: u64,
    /// Light-probe (ping) interval, ms.
    pub ping_ms: u64,
    /// UPDATE interval per node, ms.
    pub update_ms: u64,
    /// Reroute evaluation interval at the source, ms.
    pub eval_ms: u64,
    /// A hop unmeasured this long is dead, ms.
    pub dead_after_ms: u64,
    /// Reroute threshold (fraction).
    pub threshold: f64,
    /// Reroute hysteresis: evaluations in a row.
    pub consecutive: u32,
    /// Throughput measurement noise (fraction).
    pub noise: f64,
}

impl Default for Control {
    fn default() -> Self {
        Control {
            slot_ms: 100,
            probe_ms: 80,
            ping_ms: 100,
            update_ms: 100,
            eval_ms: 50,
            dead_after_ms: 600,
            threshold: 0.1,
            consecutive: 3,
            noise: 0.05,
        }
    }
}

/// What an event does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EventKind {
    /// The node stops: it answers nothing, forwards nothing, sends no UPDATE.
    Kill(usize),
    /// The node comes back.
    Revive(usize),
    /// A link's capacity and/or loss change.
    Link {
        /// From node.
        from: usize,
        /// To node.
        to: usize,
        /// New capacity, Mbit/s.
        mbps: Option<f64>,
        /// New loss.
        loss: Option<f64>,
    },
}

/// A change of the network at a time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Event {
    /// When, s from the start.
    pub at_s: f64,
    /// What.
    pub what: EventKind,
}

/// A loaded overlay scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct OverlayScenario {
    /// Name.
    pub name: String,
    /// Free text.
    pub description: String,
    /// Seed used when none is given.
    pub seed: u64,
    /// Node names; node ids are their indices.
    pub nodes: Vec<String>,
    /// `links[from * n + to]`, every off-diagonal entry present.
    pub links: Vec<Option<Link>>,
    /// Access uplink per node, bit/s (infinite: unlimited).
    pub egress_bps: Vec<f64>,
    /// Access downlink per node, bit/s.
    pub ingress_bps: Vec<f64>,
    /// Route metric.
    pub metric: Metric,
    /// Data packet size, bytes.
    pub packet_bytes: u32,
    /// Forwarding delay per relay, ms.
    pub relay_delay_ms: f64,
    /// The gain experiment.
    pub gain: Option<GainSpec>,
    /// The flow run.
    pub flow: Option<FlowSpec>,
    /// Control timing of the flow run.
    pub control: Control,
    /// Events of the flow run, in time order.
    pub events: Vec<Event>,
}

/// One striped flow of the gain experiment.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FlowGain {
    /// Source.
    pub src: String,
    /// Destination.
    pub dst: String,
    /// Round.
    pub round: u32,
    /// The direct path's goodput in this round, Mbit/s.
    pub direct_mbps: f64,
    /// Paths chosen, best first.
    pub paths: Vec<String>,
    /// What the measurements promised: the sum of the chosen paths' measured shares,
    /// Mbit/s (the paper's synthetic aggregate).
    pub estimated_mbps: f64,
    /// Goodput of the stripe in the engine, Mbit/s.
    pub striped_mbps: f64,
    /// Gain over the pair's average default-path goodput, %.
    pub gain_percent: f64,
    /// Gain over this round's direct goodput, %.
    pub gain_same_round_percent: f64,
    /// Packets the stripe lost (channel loss and resequencer give-ups).
    pub lost_packets: u64,
}

/// Distribution of the gains of one path count.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct GainSummary {
    /// Paths per flow (2 or 3).
    pub paths: usize,
    /// Flows.
    pub flows: usize,
    /// Fraction of flows with a gain above zero.
    pub gaining: f64,
    /// Fraction with a gain of at least 10 %.
    pub gaining_10: f64,
    /// Fraction with a gain between 10 % and 350 %, the paper's range.
    pub in_paper_range: f64,
    /// Smallest, 10th percentile, median, 90th percentile, largest gain, %.
    pub min: f64,
    /// 10th percentile.
    pub p10: f64,
    /// Median.
    pub median: f64,
    /// 90th percentile.
    pub p90: f64,
    /// Largest.
    pub max: f64,
    /// The CDF: (gain %, fraction of flows with at most that gain), one point per flow.
    pub cdf: Vec<(f64, f64)>,
}

/// The gain experiment's results.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct GainReport {
    /// Rounds.
    pub rounds: u32,
    /// Each pair's average direct goodput, Mbit/s: "src->dst" and value.
    pub default_mbps: Vec<(String, f64)>,
    /// Striped over the best two paths.
    pub two: Vec<FlowGain>,
    /// Striped over the best three paths.
    pub three: Vec<FlowGain>,
    /// Summary, two paths.
    pub summary_two: GainSummary,
    /// Summary, three paths.
    pub summary_three: GainSummary,
}

/// A reroute in the flow run.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Reroute {
    /// When, s.
    pub at_s: f64,
    /// `initial`, `dead a->b` or `better`.
    pub reason: String,
    /// The new paths.
    pub paths: Vec<String>,
    /// Time since the last event before it, ms (None if no event came before).
    pub after_event_ms: Option<f64>,
}

/// A stretch of the flow on one set of paths in one network state.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Segment {
    /// Start, s.
    pub from_s: f64,
    /// End, s.
    pub to_s: f64,
    /// Paths in use.
    pub paths: Vec<String>,
    /// Paths in use that cross a dead node.
    pub dead_paths: usize,
    /// Goodput, Mbit/s.
    pub goodput_mbps: f64,
}

/// The flow run's results.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FlowReport {
    /// Source.
    pub src: String,
    /// Destination.
    pub dst: String,
    /// Every reroute.
    pub reroutes: Vec<Reroute>,
    /// For each kill event: ms until the source had moved every path off the dead node
    /// (None: it never did before the flow ended).
    pub routed_around_ms: Vec<Option<f64>>,
    /// The data plane, segment by segment.
    pub segments: Vec<Segment>,
    /// Light probes sent.
    pub pings: u64,
    /// Throughput probes completed.
    pub probes: u64,
    /// UPDATE messages delivered to the source (sent as ALCP bytes, parsed there).
    pub updates: u64,
}

/// The JSON document of an overlay scenario.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// Seed.
    pub seed: u64,
    /// Node names.
    pub nodes: Vec<String>,
    /// Route metric.
    pub metric: String,
    /// The gain experiment.
    pub gain: Option<GainReport>,
    /// The flow run.
    pub flow: Option<FlowReport>,
}

impl Report {
    /// One JSON object.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// A human-readable table.
    pub fn to_table(&self) -> String {
        let mut s = format!(
            "scenario {} (seed {}), {} nodes, metric {}\n",
            self.scenario,
            self.seed,
            self.nodes.len(),
            self.metric
        );
        if let Some(g) = &self.gain {
            gain_table(&mut s, g);
        }
        if let Some(f) = &self.flow {
            flow_table(&mut s, f);
        }
        s
    }
}

/// The gain experiment's summary: a row for two paths, one for three.
fn gain_table(s: &mut String, g: &GainReport) {
    let _ = writeln!(
        s,
        "gain over the average default path, {} rounds x {} pairs:",
        g.rounds,
        g.default_mbps.len()
    );
    let _ = writeln!(
        s,
        "{:>6} {:>6} {:>8} {:>8} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "paths", "flows", "gaining", ">=10%", "10-350%", "min", "p10", "median", "p90", "max"
    );
    for m in [&g.summary_two, &g.summary_three] {
        let _ = writeln!(
            s,
            "{:>6} {:>6} {:>7.0}% {:>7.0}% {:>8.0}% {:>7.0}% {:>7.0}% {:>7.0}% {:>7.0}% {:>7.0}%",
            m.paths,
            m.flows,
            m.gaining * 100.0,
            m.gaining_10 * 100.0,
            m.in_paper_range * 100.0,
            m.min,
            m.p10,
            m.median,
            m.p90,
            m.max
        );
    }
}

/// The flow's reroutes, kills and segments.
fn flow_table(s: &mut String, f: &FlowReport) {
    let _ = writeln!(s, "flow {} -> {}:", f.src, f.dst);
    for r in &f.reroutes {
        let after = r
            .after_event_ms
            .map_or(String::new(), |m| format!(" ({m:.0} ms after the event)"));
        let _ = writeln!(
            s,
            "  {:>7.3} s  {:<12} {}{after}",
            r.at_s,
            r.reason,
            r.paths.join(" + ")
        );
    }
    for (i, m) in f.routed_around_ms.iter().enumerate() {
        let _ = match m {
            Some(ms) => writeln!(s, "  kill {}: routed around in {ms:.0} ms", i + 1),
            None => writeln!(s, "  kill {}: not routed around", i + 1),
        };
    }
    for g in &f.segments {
        let _ = writeln!(
            s,
            "  {:>7.3}-{:<7.3} s {:>8.2} Mbit/s  {}{}",
            g.from_s,
            g.to_s,
            g.goodput_mbps,
            g.paths.join(" + "),
            if g.dead_paths > 0 {
                format!("  ({} through a dead node)", g.dead_paths)
            } else {
                String::new()
            }
        );
    }
}

fn metric_name(m: Metric) -> &'static str {
    match m {
        Metric::Throughput => "throughput",
        Metric::Delay => "delay",
        Metric::Loss => "loss",
    }
}

/// Why an overlay scenario could not be run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OverlayError {
    /// An engine run failed.
    #[error(transparent)]
    Run(#[from] crate::RunError),
    /// The probe schedule could not be built.
    #[error("probe schedule: {0}")]
    Schedule(#[from] braid_proto::overlay::ScheduleError),
}

/// Run a scenario with `seed`.
pub fn run_scenario(sc: &OverlayScenario, seed: u64) -> Result<Report, OverlayError> {
    Ok(Report {
        scenario: sc.name.clone(),
        seed,
        nodes: sc.nodes.clone(),
        metric: metric_name(sc.metric).into(),
        gain: sc.gain.map(|g| gain::run(sc, &g, seed)).transpose()?,
        flow: sc.flow.map(|f| flow::run(sc, &f, seed)).transpose()?,
    })
}

/// Is this scenario file an overlay scenario (`kind = "overlay"`)? Reads the file.
pub fn is_overlay_file(path: &Path) -> bool {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| t.parse::<Table>().ok())
        .and_then(|t| {
            t.get("kind")
                .and_then(Value::as_str)
                .map(|k| k == "overlay")
        })
        .unwrap_or(false)
}

/// `a->b` or `a->r->b` with node names.
fn path_name(sc: &OverlayScenario, p: &braid_proto::overlay::Path) -> String {
    let n = |i: u16| sc.nodes[i as usize].as_str();
    match p.relay {
        None => format!("{}->{}", n(p.src), n(p.dst)),
        Some(r) => format!("{}->{}->{}", n(p.src), n(r), n(p.dst)),
    }
}

/// The link state of the mesh at one time.
#[derive(Clone, Debug, PartialEq)]
struct Net {
    n: usize,
    links: Vec<Link>,
    alive: Vec<bool>,
}

impl Net {
    fn new(sc: &OverlayScenario) -> Net {
        let n = sc.nodes.len();
        let links = sc
            .links
            .iter()
            .map(|l| {
                l.unwrap_or(Link {
                    mbps: 0.0,
                    delay_ms: 0.0,
                    loss: 0.0,
                })
            })
            .collect();
        Net {
            n,
            links,
            alive: vec![true; n],
        }
    }

    fn link(&self, a: usize, b: usize) -> &Link {
        &self.links[a * self.n + b]
    }

    fn apply(&mut self, e: &EventKind) {
        match *e {
            EventKind::Kill(i) => self.alive[i] = false,
            EventKind::Revive(i) => self.alive[i] = true,
            EventKind::Link {
                from,
                to,
                mbps,
                loss,
            } => {
                let l = &mut self.links[from * self.n + to];
                if let Some(m) = mbps {
                    l.mbps = m;
                }
                if let Some(p) = loss {
                    l.loss = p;
                }
            }
        }
    }

    /// The true state as a table: capacity, RTT and loss of every hop between live
    /// nodes, all measured "now".
    fn true_table(&self, now: braid_proto::Instant) -> braid_proto::overlay::AccessTable {
        use braid_proto::overlay::{AccessTable, Measurement};
        let mut t = AccessTable::new(self.n);
        for a in 0..self.n {
            for b in 0..self.n {
                if a == b || !self.alive[a] || !self.alive[b] {
                    continue;
                }
                let l = self.link(a, b);
                let rtt = l.delay_ms + self.link(b, a).delay_ms;
                let _ = t.update(
                    a as u16,
                    b as u16,
                    Measurement {
                        throughput_bps: l.mbps * 1e6,
                        rtt: braid_proto::Duration::from_micros((rtt * 1000.0).round() as u64),
                        loss: l.loss,
                        at: now,
                    },
                );
            }
        }
        t
    }

    /// A path as one engine channel: its rate (given), the sum of its hop delays plus
    /// the relay's forwarding delay, the combined loss; down if it crosses a dead node.
    fn channel(
        &self,
        p: &braid_proto::overlay::Path,
        rate_bps: f64,
        relay_delay_ms: f64,
    ) -> crate::model::ChannelSpec {
        let mut delay_ms = 0.0;
        let mut delivered = 1.0;
        for (a, b) in p.hops() {
            let l = self.link(a as usize, b as usize);
            delay_ms += l.delay_ms;
            delivered *= 1.0 - l.loss;
        }
        if p.relay.is_some() {
            delay_ms += relay_delay_ms;
        }
        let mut ch = crate::model::ChannelSpec::new(rate_bps.max(1000.0));
        ch.delay = crate::model::secs_to_ns(delay_ms / 1000.0);
        ch.loss = 1.0 - delivered;
        if !self.path_alive(p) {
            ch.down = vec![(0, u64::MAX)];
        }
        ch
    }

    fn path_alive(&self, p: &braid_proto::overlay::Path) -> bool {
        self.alive[p.src as usize]
            && self.alive[p.dst as usize]
            && p.relay.is_none_or(|r| self.alive[r as usize])
    }
}

/// The channels of a stripe over `paths` with SRR `quanta` on the network `net`.
///
/// A path's own capacity is its bottleneck hop (and its relay's access links, which no
/// other path of the flow uses). The source's uplink and the destination's downlink are
/// shared by all of the flow's paths; SRR offers each path its quantum's fraction `w`
/// of the traffic, and a shared FIFO access link serves each path in proportion to what
/// it is offered, so a path gets at most `w` of each shared access link. Hence a
/// path's channel rate is `min(own capacity, w × egress(src), w × ingress(dst))`: with
/// weights that match the paths the stripe fills the shared link; with wrong weights
/// the path that is offered too much holds the whole stripe back, as it would.
fn stripe_channels(
    sc: &OverlayScenario,
    net: &Net,
    paths: &[braid_proto::overlay::Path],
    quanta: &[u32],
) -> Vec<crate::model::ChannelSpec> {
    let total: f64 = quanta.iter().map(|&q| q as f64).sum::<f64>().max(1.0);
    paths
        .iter()
        .zip(quanta)
        .map(|(p, &q)| {
            let w = q as f64 / total;
            let mut rate = f64::INFINITY;
            for (a, b) in p.hops() {
                rate = rate.min(net.link(a as usize, b as usize).mbps * 1e6);
            }
            if let Some(r) = p.relay {
                let r = r as usize;
                rate = rate.min(sc.ingress_bps[r]).min(sc.egress_bps[r]);
            }
            rate = rate
                .min(w * sc.egress_bps[p.src as usize])
                .min(w * sc.ingress_bps[p.dst as usize]);
            net.channel(p, rate, sc.relay_delay_ms)
        })
        .collect()
}

/// Goodput of backlogged traffic striped over `channels` with SRR `quanta` (one channel:
/// the default path, no striping), for `secs`.
fn run_stripe(
    channels: Vec<crate::model::ChannelSpec>,
    quanta: Vec<u32>,
    packet: u32,
    secs: f64,
    seed: u64,
) -> Result<crate::RunResult, crate::RunError> {
    use braid_proto::{Mode, StripeConfig};
    let mut sc = StripeConfig::srr(quanta, packet);
    if channels.len() == 1 {
        sc.mode = Mode::None;
    }
    let cfg = crate::RunConfig {
        channels,
        traffic: crate::model::TrafficSpec {
            arrivals: crate::model::Arrivals::Backlogged,
            sizes: crate::model::Sizes::Fixed(packet),
            start: 0,
        },
        duration: Some(crate::model::secs_to_ns(secs)),
        packets: None,
        drain: crate::model::secs_to_ns(1.0),
        seed,
        variant: crate::Variant::Striped(sc),
        voip: None,
    };
    crate::run(&cfg)
}

#[cfg(test)]
mod tests;
