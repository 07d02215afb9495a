//! The gain experiment (`[gain]`): the paper's §V, every pair striped over its best two
//! and best three paths against its default path.

use braid_proto::overlay::{self, route, AccessTable, Measurement, Path, RouteConfig};
use braid_proto::{Duration, Instant};

use super::{
    path_name, run_stripe, stripe_channels, FlowGain, GainReport, GainSpec, GainSummary, Net,
    OverlayScenario,
};
use crate::rng::{mix64, Rng};

/// Stream numbers of this experiment (kept apart from the engine's).
const STREAM_CAPACITY: u64 = 30_000;
const STREAM_NOISE: u64 = 40_000;

/// The network of one block: every capacity drawn uniformly in base × (1 ± variation).
fn draw(base: &Net, variation: f64, rng: &mut Rng) -> Net {
    let mut net = base.clone();
    for l in &mut net.links {
        l.mbps *= 1.0 + variation * (2.0 * rng.next_f64() - 1.0);
    }
    net
}

/// What the DCE's serial probes measure in the sampling block: each hop's goodput
/// (capacity less loss), off by a uniform factor in 1 ± noise; RTT and loss exact.
fn measure(net: &Net, noise: f64, rng: &mut Rng) -> AccessTable {
    let mut t = net.true_table(Instant::ZERO);
    for a in 0..net.n {
        for b in 0..net.n {
            if a == b {
                continue;
            }
            let l = net.link(a, b);
            let m = *t.get(a as u16, b as u16).unwrap_or(&Measurement {
                throughput_bps: 0.0,
                rtt: Duration::ZERO,
                loss: 0.0,
                at: Instant::ZERO,
            });
            let f = 1.0 + noise * (2.0 * rng.next_f64() - 1.0);
            let _ = t.update(
                a as u16,
                b as u16,
                Measurement {
                    throughput_bps: l.mbps * 1e6 * (1.0 - l.loss) * f,
                    ..m
                },
            );
        }
    }
    t
}

fn route_cfg(sc: &OverlayScenario, max_paths: usize) -> RouteConfig {
    RouteConfig {
        metric: sc.metric,
        max_paths,
        max_age: Duration::from_secs(3600),
        egress_bps: sc.egress_bps.clone(),
        ingress_bps: sc.ingress_bps.clone(),
        min_share_bps: 1000.0,
    }
}

/// Run the paths chosen from the measurements on `net` (the reroute block): SRR quanta
/// from the measured shares, channels from the true network ([`super::stripe_channels`]).
fn stripe(
    sc: &OverlayScenario,
    net: &Net,
    chosen: &[route::Choice],
    secs: f64,
    seed: u64,
) -> Result<crate::RunResult, crate::RunError> {
    if chosen.is_empty() {
        return Ok(crate::RunResult::default());
    }
    let paths: Vec<Path> = chosen.iter().map(|c| c.path).collect();
    let quanta = overlay::quanta(chosen, sc.packet_bytes);
    let channels = stripe_channels(sc, net, &paths, &quanta);
    run_stripe(channels, quanta, sc.packet_bytes, secs, seed)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn summary(paths: usize, flows: &[FlowGain]) -> GainSummary {
    let mut g: Vec<f64> = flows.iter().map(|f| f.gain_percent).collect();
    g.sort_by(f64::total_cmp);
    let n = g.len().max(1) as f64;
    let frac = |f: &dyn Fn(f64) -> bool| g.iter().filter(|&&x| f(x)).count() as f64 / n;
    GainSummary {
        paths,
        flows: g.len(),
        gaining: frac(&|x| x > 0.0),
        gaining_10: frac(&|x| x >= 10.0),
        in_paper_range: frac(&|x| (10.0..=350.0).contains(&x)),
        min: g.first().copied().unwrap_or(0.0),
        p10: percentile(&g, 0.1),
        median: percentile(&g, 0.5),
        p90: percentile(&g, 0.9),
        max: g.last().copied().unwrap_or(0.0),
        cdf: g
            .iter()
            .enumerate()
            .map(|(i, &x)| (x, (i + 1) as f64 / g.len() as f64))
            .collect(),
    }
}

struct Raw {
    src: usize,
    dst: usize,
    round: u32,
    direct: f64,
    sets: [(Vec<String>, f64, f64, u64); 2],
}

/// Run the gain experiment.
pub(super) fn run(
    sc: &OverlayScenario,
    g: &GainSpec,
    seed: u64,
) -> Result<GainReport, crate::RunError> {
    let base = Net::new(sc);
    let n = base.n;
    let mut raws = Vec::new();
    for round in 0..g.rounds {
        let r = round as u64;
        let mut cap_rng = Rng::stream(seed, STREAM_CAPACITY + 2 * r);
        let sampling = draw(&base, g.variation, &mut cap_rng);
        let mut cap_rng = Rng::stream(seed, STREAM_CAPACITY + 2 * r + 1);
        let rerouting = draw(&base, g.variation, &mut cap_rng);
        let measured = measure(&sampling, g.noise, &mut Rng::stream(seed, STREAM_NOISE + r));
        for src in 0..n {
            for dst in 0..n {
                if src == dst {
                    continue;
                }
                let w = World {
                    sc,
                    g,
                    measured: &measured,
                    rerouting: &rerouting,
                };
                raws.push(run_pair(&w, seed, round, src, dst)?);
            }
        }
    }
    let (default_mbps, avg) = baseline(sc, &raws, n);
    let two = flow_gains(sc, &raws, &avg, 0);
    let three = flow_gains(sc, &raws, &avg, 1);
    Ok(GainReport {
        rounds: g.rounds,
        default_mbps,
        summary_two: summary(2, &two),
        summary_three: summary(3, &three),
        two,
        three,
    })
}

/// What one round's flows see: the table the source measured (on the sampling draw)
/// and the network they run on (the rerouting draw).
struct World<'a> {
    sc: &'a OverlayScenario,
    g: &'a GainSpec,
    measured: &'a AccessTable,
    rerouting: &'a Net,
}

/// One pair's flow in one round: over the direct path, and striped over the best two
/// and three paths the measured table gives.
fn run_pair(
    w: &World,
    seed: u64,
    round: u32,
    src: usize,
    dst: usize,
) -> Result<Raw, crate::RunError> {
    let (sc, g, measured, rerouting) = (w.sc, w.g, w.measured, w.rerouting);
    let r = round as u64;
    let run_seed = mix64(seed ^ mix64((r << 32) | ((src as u64) << 16) | dst as u64));
    let direct = Path::direct(src as u16, dst as u16);
    let d = run_stripe(
        stripe_channels(sc, rerouting, &[direct], &[sc.packet_bytes]),
        vec![sc.packet_bytes],
        sc.packet_bytes,
        g.flow_s,
        run_seed,
    )?;
    let mut sets: [(Vec<String>, f64, f64, u64); 2] = Default::default();
    for (k, count) in [2usize, 3].into_iter().enumerate() {
        let chosen = route::choose(
            measured,
            src as u16,
            dst as u16,
            Instant::ZERO,
            &route_cfg(sc, count),
        );
        let names = chosen.iter().map(|c| path_name(sc, &c.path)).collect();
        let estimated = chosen.iter().map(|c| c.share_bps).sum::<f64>() / 1e6;
        let res = stripe(sc, rerouting, &chosen, g.flow_s, run_seed)?;
        sets[k] = (names, estimated, res.goodput_bps / 1e6, res.packets_lost);
    }
    Ok(Raw {
        src,
        dst,
        round,
        direct: d.goodput_bps / 1e6,
        sets,
    })
}

/// The paper's baseline: each pair's average default-path throughput, by name and by
/// `src * n + dst`.
fn baseline(sc: &OverlayScenario, raws: &[Raw], n: usize) -> (Vec<(String, f64)>, Vec<f64>) {
    let mut default_mbps = Vec::new();
    let mut avg = vec![0.0; n * n];
    for src in 0..n {
        for dst in 0..n {
            if src == dst {
                continue;
            }
            let v: Vec<f64> = raws
                .iter()
                .filter(|r| r.src == src && r.dst == dst)
                .map(|r| r.direct)
                .collect();
            let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
            avg[src * n + dst] = mean;
            default_mbps.push((format!("{}->{}", sc.nodes[src], sc.nodes[dst]), mean));
        }
    }
    (default_mbps, avg)
}

/// Every flow's gain with the best two (`k` 0) or three (`k` 1) paths, against its
/// pair's average and against the same round's direct path.
fn flow_gains(sc: &OverlayScenario, raws: &[Raw], avg: &[f64], k: usize) -> Vec<FlowGain> {
    let n = sc.nodes.len();
    let gain = |x: f64, base: f64| {
        if base > 0.0 {
            (x / base - 1.0) * 100.0
        } else {
            0.0
        }
    };
    raws.iter()
        .map(|r| {
            let (paths, estimated, striped, lost) = &r.sets[k];
            FlowGain {
                src: sc.nodes[r.src].clone(),
                dst: sc.nodes[r.dst].clone(),
                round: r.round,
                direct_mbps: r.direct,
                paths: paths.clone(),
                estimated_mbps: *estimated,
                striped_mbps: *striped,
                gain_percent: gain(*striped, avg[r.src * n + r.dst]),
                gain_same_round_percent: gain(*striped, r.direct),
                lost_packets: *lost,
            }
        })
        .collect()
}
