//! The flow run (`[flow]`): one flow over time, the overlay's control plane in virtual
//! time, the data plane segment by segment.
//!
//! Control plane, on a 1 ms tick:
//!
//! * **light probes**: every `ping_ms` every live node pings every peer; the reply comes
//!   back after the two links' delays unless either direction loses it or either node
//!   is dead. A reply refreshes the hop's measurement (its RTT, an EWMA of ping loss,
//!   and the throughput of the last probe); a hop with no throughput probe yet is not
//!   entered.
//! * **throughput probes**: the overlay-wide serial schedule of
//!   [`braid_proto::overlay::ProbeSchedule`] — one ordered pair per `slot_ms`, never two
//!   at once; the probe measures the hop's goodput (capacity less loss) off by a uniform
//!   factor in 1 ± `noise_percent`, and counts if both ends are still alive when it ends.
//! * **UPDATEs**: every `update_ms` every live node sends its measurements to the source
//!   as ALCP bytes ([`braid_proto::wire::overlay`]); they arrive after the link's delay
//!   unless lost, and the source parses them into its accessibility table (a
//!   measurement's time is the arrival less the age it carries).
//! * **the source's rerouter** ([`braid_proto::overlay::Rerouter`]) evaluates every
//!   `eval_ms` from the flow's start.
//!
//! The data plane is run afterwards in the engine, one segment per stretch of time with
//! the same paths and the same network state: backlogged traffic striped with SRR
//! (quanta from the measured shares at the reroute) over one channel per path, the
//! channels' rates the true shares; a path through a dead node is a channel that is
//! down. Each segment starts with empty channels, so a segment's goodput includes the
//! ramp-up of the slowest path's delay.

use std::collections::BTreeMap;

use braid_proto::overlay::{
    self, AccessTable, Choice, Decision, Measurement, Path, ProbeConfig, ProbeSchedule, Reason,
    RerouteConfig, Rerouter, RouteConfig,
};
use braid_proto::wire::overlay::{Repr, UpdateEntry, LOSS_SCALE};
use braid_proto::{Duration, Instant};

use super::{
    path_name, run_stripe, stripe_channels, EventKind, FlowReport, FlowSpec, Net, OverlayScenario,
    Reroute, Segment,
};
use crate::rng::Rng;

const STREAM_PROBE: u64 = 50_000;
const STREAM_PING: u64 = 50_001;
const STREAM_UPDATE: u64 = 50_002;
/// Weight of a new ping outcome in the loss estimate.
const LOSS_EWMA: f64 = 0.1;

enum Pending {
    PingReply { a: usize, b: usize, sent: u64 },
    ProbeDone { a: usize, b: usize, bps: f64 },
    Update { bytes: Vec<u8> },
}

fn us(ms: f64) -> u64 {
    (ms * 1000.0).round().max(0.0) as u64
}

struct Plane {
    n: usize,
    src: usize,
    own: Vec<Option<Measurement>>,
    loss: Vec<f64>,
    table: AccessTable,
}

impl Plane {
    /// Node `a` has a new measurement of `a -> b`; the source's own go straight into
    /// its table.
    fn record(&mut self, a: usize, b: usize, m: Measurement) {
        self.own[a * self.n + b] = Some(m);
        if a == self.src {
            let _ = self.table.update(a as u16, b as u16, m);
        }
    }
}

/// Run the flow.
pub(super) fn run(
    sc: &OverlayScenario,
    f: &FlowSpec,
    seed: u64,
) -> Result<FlowReport, super::OverlayError> {
    let c = sc.control;
    let mut sim = ControlPlane::new(sc, f, seed)?;
    let mut rerouter = Rerouter::new(
        f.src as u16,
        f.dst as u16,
        route_config(sc, f),
        RerouteConfig {
            threshold: c.threshold,
            consecutive: c.consecutive,
            dead_after: Duration::from_millis(c.dead_after_ms),
        },
    );
    let mut switches: Vec<(u64, Reason, Vec<Choice>)> = Vec::new();
    // On the 1 ms tick.
    let start = us(f.start_s * 1000.0).div_ceil(1000) * 1000;
    let end = us(f.end_s * 1000.0);
    let mut t = 0u64;
    while t < end {
        let now = Instant::from_micros(t);
        sim.apply_events(t);
        sim.deliver_due(t, now);
        if t.is_multiple_of(us(c.ping_ms as f64)) {
            sim.send_pings(t);
        }
        if t.is_multiple_of(us(c.slot_ms as f64)) {
            sim.start_probe(t, now);
        }
        if t.is_multiple_of(us(c.update_ms as f64)) {
            sim.send_updates(t, now);
        }
        if t >= start && (t - start).is_multiple_of(us(c.eval_ms as f64)) && sim.net.alive[f.src] {
            if let Decision::Switch { paths, reason } = rerouter.evaluate(now, &sim.plane.table) {
                switches.push((t, reason, paths));
            }
        }
        t += 1000;
    }
    let counts = (sim.pings, sim.probes, sim.updates);
    Ok(report(sc, f, &switches, counts, (start, end), seed)?)
}

/// The source's route engine settings for the flow.
fn route_config(sc: &OverlayScenario, f: &FlowSpec) -> RouteConfig {
    RouteConfig {
        metric: sc.metric,
        max_paths: f.max_paths,
        max_age: Duration::from_millis(sc.control.dead_after_ms),
        egress_bps: sc.egress_bps.clone(),
        ingress_bps: sc.ingress_bps.clone(),
        min_share_bps: 1000.0,
    }
}

/// The overlay's measurement and dissemination plane during a flow run: every node
/// pings every other, the probe schedule's pair measures its throughput, and every node
/// sends the source UPDATEs of its own measurements; what is in flight waits in
/// `pending` until its arrival time.
struct ControlPlane<'a> {
    sc: &'a OverlayScenario,
    f: &'a FlowSpec,
    n: usize,
    net: Net,
    sched: ProbeSchedule,
    plane: Plane,
    probe_rng: Rng,
    ping_rng: Rng,
    update_rng: Rng,
    /// Arrivals by (time in µs, sequence number).
    pending: BTreeMap<(u64, u64), Pending>,
    seq: u64,
    update_seq: Vec<u32>,
    next_event: usize,
    pings: u64,
    probes: u64,
    updates: u64,
}

impl<'a> ControlPlane<'a> {
    fn new(
        sc: &'a OverlayScenario,
        f: &'a FlowSpec,
        seed: u64,
    ) -> Result<Self, super::OverlayError> {
        let c = sc.control;
        let n = sc.nodes.len();
        let sched = ProbeSchedule::new(
            (0..n as u16).collect(),
            0,
            ProbeConfig {
                slot: Duration::from_millis(c.slot_ms),
                probe: Duration::from_millis(c.probe_ms),
                epoch: Instant::ZERO,
                ping_every: Duration::from_millis(c.ping_ms),
            },
        )?;
        Ok(ControlPlane {
            sc,
            f,
            n,
            net: Net::new(sc),
            sched,
            plane: Plane {
                n,
                src: f.src,
                own: vec![None; n * n],
                loss: vec![0.0; n * n],
                table: AccessTable::new(n),
            },
            probe_rng: Rng::stream(seed, STREAM_PROBE),
            ping_rng: Rng::stream(seed, STREAM_PING),
            update_rng: Rng::stream(seed, STREAM_UPDATE),
            pending: BTreeMap::new(),
            seq: 0,
            update_seq: vec![0u32; n],
            next_event: 0,
            pings: 0,
            probes: 0,
            updates: 0,
        })
    }

    /// Queue `p` to arrive at `at` (µs), after everything already due then.
    fn schedule(&mut self, at: u64, p: Pending) {
        self.seq += 1;
        self.pending.insert((at, self.seq), p);
    }

    /// The scenario's events due by `t`.
    fn apply_events(&mut self, t: u64) {
        let events = &self.sc.events;
        while self.next_event < events.len() && us(events[self.next_event].at_s * 1000.0) <= t {
            self.net.apply(&events[self.next_event].what);
            self.next_event += 1;
        }
    }

    /// Everything that arrives by `t`.
    fn deliver_due(&mut self, t: u64, now: Instant) {
        while let Some(entry) = self.pending.first_entry() {
            if entry.key().0 > t {
                break;
            }
            match entry.remove() {
                Pending::PingReply { a, b, sent } => self.ping_reply(a, b, sent, t, now),
                Pending::ProbeDone { a, b, bps } => self.probe_done(a, b, bps, now),
                Pending::Update { bytes } => self.update(&bytes, t),
            }
        }
    }

    /// A ping `a -> b` came back: the loss estimate decays, the round trip is new.
    fn ping_reply(&mut self, a: usize, b: usize, sent: u64, t: u64, now: Instant) {
        if !self.net.alive[a] {
            return;
        }
        let i = a * self.n + b;
        self.plane.loss[i] *= 1.0 - LOSS_EWMA;
        if let Some(old) = self.plane.own[i] {
            self.plane.record(
                a,
                b,
                Measurement {
                    rtt: Duration::from_micros(t - sent),
                    loss: self.plane.loss[i],
                    at: now,
                    ..old
                },
            );
        }
    }

    /// A throughput probe `a -> b` ended.
    fn probe_done(&mut self, a: usize, b: usize, bps: f64, now: Instant) {
        if !(self.net.alive[a] && self.net.alive[b]) {
            return;
        }
        self.probes += 1;
        let i = a * self.n + b;
        let net = &self.net;
        let rtt = self.plane.own[i].map_or_else(
            || Duration::from_micros(us(net.link(a, b).delay_ms + net.link(b, a).delay_ms)),
            |m| m.rtt,
        );
        self.plane.record(
            a,
            b,
            Measurement {
                throughput_bps: bps,
                rtt,
                loss: self.plane.loss[i],
                at: now,
            },
        );
    }

    /// An UPDATE reached the source: parsed from the bytes, as a node would.
    fn update(&mut self, bytes: &[u8], t: u64) {
        if !self.net.alive[self.f.src] {
            return;
        }
        let Ok(Repr::Update {
            origin, entries, ..
        }) = Repr::parse(bytes)
        else {
            return;
        };
        self.updates += 1;
        for e in entries {
            let age = Duration::from_millis(e.age_ms as u64);
            let _ = self.plane.table.update(
                origin,
                e.peer,
                Measurement {
                    throughput_bps: e.throughput_kbps as f64 * 1000.0,
                    rtt: Duration::from_micros(e.rtt_us as u64),
                    loss: e.loss_ppm as f64 / LOSS_SCALE as f64,
                    at: Instant::from_micros(t.saturating_sub(age.as_micros())),
                },
            );
        }
    }

    /// Every live node pings every other; a lost ping (either way) or a dead peer
    /// counts as a loss at once.
    fn send_pings(&mut self, t: u64) {
        let n = self.n;
        for a in 0..n {
            if !self.net.alive[a] {
                continue;
            }
            for b in (0..n).filter(|&b| b != a) {
                self.pings += 1;
                let (ab, ba) = (self.net.link(a, b), self.net.link(b, a));
                let lost = self.ping_rng.chance(ab.loss) | self.ping_rng.chance(ba.loss);
                if self.net.alive[b] && !lost {
                    let rtt = us(ab.delay_ms + ba.delay_ms);
                    self.schedule(t + rtt, Pending::PingReply { a, b, sent: t });
                } else {
                    let i = a * n + b;
                    self.plane.loss[i] = self.plane.loss[i] * (1.0 - LOSS_EWMA) + LOSS_EWMA;
                }
            }
        }
    }

    /// The probe schedule's pair of this slot measures its throughput (with noise).
    fn start_probe(&mut self, t: u64, now: Instant) {
        let Some((a, b)) = self.sched.active_at(now) else {
            return;
        };
        let (a, b) = (a as usize, b as usize);
        if !(self.net.alive[a] && self.net.alive[b]) {
            return;
        }
        let c = self.sc.control;
        let l = self.net.link(a, b);
        let noise = 1.0 + c.noise * (2.0 * self.probe_rng.next_f64() - 1.0);
        let bps = l.mbps * 1e6 * (1.0 - l.loss) * noise;
        self.schedule(t + us(c.probe_ms as f64), Pending::ProbeDone { a, b, bps });
    }

    /// Every live node but the source sends the source an UPDATE of its own
    /// measurements (lost with the link's loss).
    fn send_updates(&mut self, t: u64, now: Instant) {
        let (n, src) = (self.n, self.f.src);
        for i in 0..n {
            if i == src || !self.net.alive[i] {
                continue;
            }
            let entries: Vec<UpdateEntry> = (0..n)
                .filter_map(|j| Some(update_entry(j, self.plane.own[i * n + j]?, now)))
                .collect();
            if entries.is_empty() {
                continue;
            }
            self.update_seq[i] = self.update_seq[i].wrapping_add(1);
            let msg = Repr::Update {
                origin: i as u16,
                seq: self.update_seq[i],
                entries,
            };
            let l = self.net.link(i, src);
            if self.update_rng.chance(l.loss) {
                continue;
            }
            if let Ok(bytes) = msg.to_vec() {
                self.schedule(t + us(l.delay_ms), Pending::Update { bytes });
            }
        }
    }
}

/// A node's measurement of its hop to `peer`, as an UPDATE carries it.
fn update_entry(peer: usize, m: Measurement, now: Instant) -> UpdateEntry {
    UpdateEntry {
        peer: peer as u16,
        throughput_kbps: (m.throughput_bps / 1000.0).round().min(u32::MAX as f64) as u32,
        rtt_us: m.rtt.as_micros().min(u32::MAX as u64) as u32,
        loss_ppm: (m.loss * LOSS_SCALE as f64).round() as u32,
        age_ms: ((now - m.at).as_micros() / 1000) as u32,
    }
}

/// The flow's report: its reroutes, how soon it routed around each killed relay, and
/// the goodput of each segment between reroutes and events.
fn report(
    sc: &OverlayScenario,
    f: &FlowSpec,
    switches: &[(u64, Reason, Vec<Choice>)],
    (pings, probes, updates): (u64, u64, u64),
    (start, end): (u64, u64),
    seed: u64,
) -> Result<FlowReport, crate::RunError> {
    let event_us: Vec<u64> = sc.events.iter().map(|e| us(e.at_s * 1000.0)).collect();
    Ok(FlowReport {
        src: sc.nodes[f.src].clone(),
        dst: sc.nodes[f.dst].clone(),
        reroutes: reroutes(sc, switches, &event_us),
        routed_around_ms: routed_around(sc, switches, &event_us, (start, end)),
        segments: segments(sc, switches, &event_us, (start, end), seed)?,
        pings,
        probes,
        updates,
    })
}

/// The path set in force at `t`.
fn set_at(switches: &[(u64, Reason, Vec<Choice>)], t: u64) -> Vec<Choice> {
    switches
        .iter()
        .rev()
        .find(|s| s.0 <= t)
        .map(|s| s.2.clone())
        .unwrap_or_default()
}

/// Each switch of path set: when, why, the paths, and how long after the last event.
fn reroutes(
    sc: &OverlayScenario,
    switches: &[(u64, Reason, Vec<Choice>)],
    event_us: &[u64],
) -> Vec<Reroute> {
    let name = |i: u16| sc.nodes[i as usize].clone();
    switches
        .iter()
        .map(|(t, reason, paths)| Reroute {
            at_s: *t as f64 / 1e6,
            reason: match reason {
                Reason::Initial => "initial".into(),
                Reason::Better => "better".into(),
                Reason::Dead { from, to } => format!("dead {}->{}", name(*from), name(*to)),
            },
            paths: paths.iter().map(|c| path_name(sc, &c.path)).collect(),
            after_event_ms: event_us
                .iter()
                .filter(|&&e| e <= *t)
                .max()
                .map(|&e| (*t - e) as f64 / 1000.0),
        })
        .collect()
}

/// For each node killed during the flow: how long until no path relayed through it (0
/// if none did; `None` if one still did at the end).
fn routed_around(
    sc: &OverlayScenario,
    switches: &[(u64, Reason, Vec<Choice>)],
    event_us: &[u64],
    (start, end): (u64, u64),
) -> Vec<Option<f64>> {
    let uses = |set: &[Choice], node: usize| set.iter().any(|c| c.path.relays_through(node as u16));
    let mut routed_around_ms = Vec::new();
    for (e, &te) in sc.events.iter().zip(event_us) {
        let EventKind::Kill(node) = e.what else {
            continue;
        };
        if te < start || te >= end {
            continue;
        }
        if !uses(&set_at(switches, te), node) {
            routed_around_ms.push(Some(0.0));
            continue;
        }
        routed_around_ms.push(
            switches
                .iter()
                .find(|s| s.0 > te && !uses(&s.2, node))
                .map(|s| (s.0 - te) as f64 / 1000.0),
        );
    }
    routed_around_ms
}

/// The data plane: the flow cut at every switch and event, each piece striped over
/// the path set then in force on the network as it then was.
fn segments(
    sc: &OverlayScenario,
    switches: &[(u64, Reason, Vec<Choice>)],
    event_us: &[u64],
    (start, end): (u64, u64),
    seed: u64,
) -> Result<Vec<Segment>, crate::RunError> {
    let mut cuts: Vec<u64> = vec![start, end];
    cuts.extend(
        switches
            .iter()
            .map(|s| s.0)
            .filter(|&t| t > start && t < end),
    );
    cuts.extend(event_us.iter().copied().filter(|&t| t > start && t < end));
    cuts.sort_unstable();
    cuts.dedup();
    let mut segments = Vec::new();
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        let mut net = Net::new(sc);
        for (e, &te) in sc.events.iter().zip(event_us) {
            if te <= a {
                net.apply(&e.what);
            }
        }
        let set = set_at(switches, a);
        let paths: Vec<Path> = set.iter().map(|c| c.path).collect();
        let dead = paths.iter().filter(|p| !net.path_alive(p)).count();
        let goodput = if set.is_empty() {
            0.0
        } else {
            let quanta = overlay::quanta(&set, sc.packet_bytes);
            let channels = stripe_channels(sc, &net, &paths, &quanta);
            let r = run_stripe(
                channels,
                quanta,
                sc.packet_bytes,
                (b - a) as f64 / 1e6,
                seed ^ a,
            )?;
            r.goodput_bps / 1e6
        };
        segments.push(Segment {
            from_s: a as f64 / 1e6,
            to_s: b as f64 / 1e6,
            paths: paths.iter().map(|p| path_name(sc, p)).collect(),
            dead_paths: dead,
            goodput_mbps: goodput,
        });
    }
    Ok(segments)
}
