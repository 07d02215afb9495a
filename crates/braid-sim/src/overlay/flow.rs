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
    let n = sc.nodes.len();
    let mut net = Net::new(sc);
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
    let route_cfg = RouteConfig {
        metric: sc.metric,
        max_paths: f.max_paths,
        max_age: Duration::from_millis(c.dead_after_ms),
        egress_bps: sc.egress_bps.clone(),
        ingress_bps: sc.ingress_bps.clone(),
        min_share_bps: 1000.0,
    };
    let mut rerouter = Rerouter::new(
        f.src as u16,
        f.dst as u16,
        route_cfg.clone(),
        RerouteConfig {
            threshold: c.threshold,
            consecutive: c.consecutive,
            dead_after: Duration::from_millis(c.dead_after_ms),
        },
    );
    let mut plane = Plane {
        n,
        src: f.src,
        own: vec![None; n * n],
        loss: vec![0.0; n * n],
        table: AccessTable::new(n),
    };
    let mut probe_rng = Rng::stream(seed, STREAM_PROBE);
    let mut ping_rng = Rng::stream(seed, STREAM_PING);
    let mut update_rng = Rng::stream(seed, STREAM_UPDATE);
    let mut pending: BTreeMap<(u64, u64), Pending> = BTreeMap::new();
    let mut seq = 0u64;
    let mut update_seq = vec![0u32; n];
    let (mut pings, mut probes, mut updates) = (0u64, 0u64, 0u64);
    let mut switches: Vec<(u64, Reason, Vec<Choice>)> = Vec::new();
    let mut next_event = 0;
    // On the 1 ms tick.
    let start = us(f.start_s * 1000.0).div_ceil(1000) * 1000;
    let end = us(f.end_s * 1000.0);

    let mut t = 0u64;
    while t < end {
        let now = Instant::from_micros(t);
        while next_event < sc.events.len() && us(sc.events[next_event].at_s * 1000.0) <= t {
            net.apply(&sc.events[next_event].what);
            next_event += 1;
        }
        // Everything due by now.
        while let Some(entry) = pending.first_entry() {
            if entry.key().0 > t {
                break;
            }
            match entry.remove() {
                Pending::PingReply { a, b, sent } => {
                    if !net.alive[a] {
                        continue;
                    }
                    let i = a * n + b;
                    plane.loss[i] *= 1.0 - LOSS_EWMA;
                    if let Some(old) = plane.own[i] {
                        plane.record(
                            a,
                            b,
                            Measurement {
                                rtt: Duration::from_micros(t - sent),
                                loss: plane.loss[i],
                                at: now,
                                ..old
                            },
                        );
                    }
                }
                Pending::ProbeDone { a, b, bps } => {
                    if !(net.alive[a] && net.alive[b]) {
                        continue;
                    }
                    probes += 1;
                    let i = a * n + b;
                    let rtt = plane.own[i].map_or_else(
                        || {
                            Duration::from_micros(us(
                                net.link(a, b).delay_ms + net.link(b, a).delay_ms
                            ))
                        },
                        |m| m.rtt,
                    );
                    plane.record(
                        a,
                        b,
                        Measurement {
                            throughput_bps: bps,
                            rtt,
                            loss: plane.loss[i],
                            at: now,
                        },
                    );
                }
                Pending::Update { bytes } => {
                    if !net.alive[f.src] {
                        continue;
                    }
                    // Parsed from the bytes, as a node would.
                    if let Ok(Repr::Update {
                        origin, entries, ..
                    }) = Repr::parse(&bytes)
                    {
                        updates += 1;
                        for e in entries {
                            let age = Duration::from_millis(e.age_ms as u64);
                            let _ = plane.table.update(
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
                }
            }
        }
        if t.is_multiple_of(us(c.ping_ms as f64)) {
            for a in (0..n).filter(|&a| net.alive[a]) {
                for b in (0..n).filter(|&b| b != a) {
                    pings += 1;
                    let (ab, ba) = (net.link(a, b), net.link(b, a));
                    let lost = ping_rng.chance(ab.loss) | ping_rng.chance(ba.loss);
                    if net.alive[b] && !lost {
                        seq += 1;
                        pending.insert(
                            (t + us(ab.delay_ms + ba.delay_ms), seq),
                            Pending::PingReply { a, b, sent: t },
                        );
                    } else {
                        let i = a * n + b;
                        plane.loss[i] = plane.loss[i] * (1.0 - LOSS_EWMA) + LOSS_EWMA;
                    }
                }
            }
        }
        if t.is_multiple_of(us(c.slot_ms as f64)) {
            if let Some((a, b)) = sched.active_at(now) {
                let (a, b) = (a as usize, b as usize);
                if net.alive[a] && net.alive[b] {
                    let l = net.link(a, b);
                    let noise = 1.0 + c.noise * (2.0 * probe_rng.next_f64() - 1.0);
                    seq += 1;
                    pending.insert(
                        (t + us(c.probe_ms as f64), seq),
                        Pending::ProbeDone {
                            a,
                            b,
                            bps: l.mbps * 1e6 * (1.0 - l.loss) * noise,
                        },
                    );
                }
            }
        }
        if t.is_multiple_of(us(c.update_ms as f64)) {
            for i in (0..n).filter(|&i| i != f.src && net.alive[i]) {
                let entries: Vec<UpdateEntry> = (0..n)
                    .filter_map(|j| {
                        let m = plane.own[i * n + j]?;
                        Some(UpdateEntry {
                            peer: j as u16,
                            throughput_kbps: (m.throughput_bps / 1000.0)
                                .round()
                                .min(u32::MAX as f64)
                                as u32,
                            rtt_us: m.rtt.as_micros().min(u32::MAX as u64) as u32,
                            loss_ppm: (m.loss * LOSS_SCALE as f64).round() as u32,
                            age_ms: ((now - m.at).as_micros() / 1000) as u32,
                        })
                    })
                    .collect();
                if entries.is_empty() {
                    continue;
                }
                update_seq[i] = update_seq[i].wrapping_add(1);
                let msg = Repr::Update {
                    origin: i as u16,
                    seq: update_seq[i],
                    entries,
                };
                let l = net.link(i, f.src);
                if update_rng.chance(l.loss) {
                    continue;
                }
                if let Ok(bytes) = msg.to_vec() {
                    seq += 1;
                    pending.insert((t + us(l.delay_ms), seq), Pending::Update { bytes });
                }
            }
        }
        if t >= start && (t - start).is_multiple_of(us(c.eval_ms as f64)) && net.alive[f.src] {
            if let Decision::Switch { paths, reason } = rerouter.evaluate(now, &plane.table) {
                switches.push((t, reason, paths));
            }
        }
        t += 1000;
    }

    Ok(report(
        sc, f, switches, pings, probes, updates, start, end, seed,
    )?)
}

#[allow(clippy::too_many_arguments)]
fn report(
    sc: &OverlayScenario,
    f: &FlowSpec,
    switches: Vec<(u64, Reason, Vec<Choice>)>,
    pings: u64,
    probes: u64,
    updates: u64,
    start: u64,
    end: u64,
    seed: u64,
) -> Result<FlowReport, crate::RunError> {
    let name = |i: u16| sc.nodes[i as usize].clone();
    let event_us: Vec<u64> = sc.events.iter().map(|e| us(e.at_s * 1000.0)).collect();
    let reroutes = switches
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
        .collect();
    let set_at = |t: u64| -> Vec<Choice> {
        switches
            .iter()
            .rev()
            .find(|s| s.0 <= t)
            .map(|s| s.2.clone())
            .unwrap_or_default()
    };
    let uses = |set: &[Choice], node: usize| set.iter().any(|c| c.path.relays_through(node as u16));
    let mut routed_around_ms = Vec::new();
    for (e, &te) in sc.events.iter().zip(&event_us) {
        let EventKind::Kill(node) = e.what else {
            continue;
        };
        if te < start || te >= end {
            continue;
        }
        if !uses(&set_at(te), node) {
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

    // Data plane.
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
        for (e, &te) in sc.events.iter().zip(&event_us) {
            if te <= a {
                net.apply(&e.what);
            }
        }
        let set = set_at(a);
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
    Ok(FlowReport {
        src: sc.nodes[f.src].clone(),
        dst: sc.nodes[f.dst].clone(),
        reroutes,
        routed_around_ms,
        segments,
        pings,
        probes,
        updates,
    })
}
