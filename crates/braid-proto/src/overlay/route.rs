//! The QRE route engine: for a source and a destination, the direct path and every
//! one-relay path, scored by a metric, up to three chosen.
//!
//! # Why a search over all one-relay candidates, not Dijkstra
//!
//! The paper limits alternate paths to two hops and says a "modified Dijkstra" builds
//! them. With at most two hops the candidate set is tiny and known in advance: the
//! direct path plus one path through each other node, `N - 1` candidates in all. Scoring
//! each of them is O(N) per pair, exact for any metric (bottleneck throughput is not
//! additive, which plain Dijkstra assumes), and gives the k best paths directly, where
//! Dijkstra gives one path per run and would need a hop-limited k-shortest-paths variant
//! to do the same. For the overlays GALO is meant for (a handful to a few dozen nodes)
//! nothing is gained by anything cleverer.
//!
//! # Path metrics
//!
//! * throughput: the smallest hop throughput (the bottleneck);
//! * delay: the sum of the hops' round-trip times (the path's RTT through the relay);
//! * loss: `1 - (1 - p1)(1 - p2)`, independent losses on the two hops.
//!
//! # Paths that share a resource
//!
//! Two distinct candidates of one pair never share an overlay hop: the direct path uses
//! `s -> d`, the path through `r` uses `s -> r` and `r -> d`, and no two relays give the
//! same hop. What they do share is the nodes' access links: every path leaves the source
//! through its uplink and enters the destination through its downlink, and the DCE
//! measures each hop *alone* (its probes run one after another), so the table cannot see
//! that. When the access capacities are known ([`RouteConfig::egress_bps`],
//! [`RouteConfig::ingress_bps`]) the engine picks greedily: it scores every candidate
//! against the *remaining* capacity of the resources it uses (its hops, the source's
//! egress, the relay's ingress and egress, the destination's ingress), picks the best,
//! subtracts the picked path's share from each of those resources, and scores the rest
//! again. A later path is thus credited only with what it can add on top of the earlier
//! ones, so three paths through one saturated uplink are not counted as three times the
//! uplink — which is exactly the error of the paper's synthetic sums (its §V.B says the
//! aggregate is "only valid when both flows are being received simultaneously"). Paths
//! whose share falls below [`RouteConfig::min_share_bps`] are not chosen. Hops used by
//! both directions of two pairs are not modelled: the engine serves one flow at a time.
//!
//! The first path chosen is the best one by the metric on its own, so a one-path choice
//! is plain best-path routing.

use crate::time::{Duration, Instant};

use super::table::AccessTable;
use super::NodeId;

/// Most paths a flow is striped over (the paper: "because of fairness we currently
/// consider a maximum of three").
pub const MAX_PATHS: usize = 3;

/// What "best" means.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Metric {
    /// Highest bottleneck throughput (the paper's only metric; the default).
    #[default]
    Throughput,
    /// Lowest sum of hop RTTs.
    Delay,
    /// Lowest end-to-end loss.
    Loss,
}

impl Metric {
    /// Parse `throughput`, `delay` or `loss`.
    pub fn from_name(s: &str) -> Option<Metric> {
        match s {
            "throughput" => Some(Metric::Throughput),
            "delay" => Some(Metric::Delay),
            "loss" => Some(Metric::Loss),
            _ => None,
        }
    }
}

/// A path of at most two hops: `src -> dst`, or `src -> relay -> dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Path {
    /// Source node.
    pub src: NodeId,
    /// The relay, if any.
    pub relay: Option<NodeId>,
    /// Destination node.
    pub dst: NodeId,
}

impl Path {
    /// The direct path.
    pub fn direct(src: NodeId, dst: NodeId) -> Path {
        Path {
            src,
            relay: None,
            dst,
        }
    }

    /// The path through `relay`.
    pub fn via(src: NodeId, relay: NodeId, dst: NodeId) -> Path {
        Path {
            src,
            relay: Some(relay),
            dst,
        }
    }

    /// The directed hops, in order (one or two).
    pub fn hops(&self) -> Vec<(NodeId, NodeId)> {
        match self.relay {
            None => vec![(self.src, self.dst)],
            Some(r) => vec![(self.src, r), (r, self.dst)],
        }
    }

    /// Number of hops.
    pub fn hop_count(&self) -> usize {
        if self.relay.is_some() {
            2
        } else {
            1
        }
    }

    /// True if no node appears twice (no loop, no self hop).
    pub fn is_loop_free(&self) -> bool {
        self.src != self.dst && self.relay.is_none_or(|r| r != self.src && r != self.dst)
    }

    /// Does this path use node `n` as its relay?
    pub fn relays_through(&self, n: NodeId) -> bool {
        self.relay == Some(n)
    }
}

impl core::fmt::Display for Path {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.relay {
            None => write!(f, "{}->{}", self.src, self.dst),
            Some(r) => write!(f, "{}->{}->{}", self.src, r, self.dst),
        }
    }
}

/// A path's quality computed from the table, on its own.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Quality {
    /// Bottleneck throughput, bit/s.
    pub throughput_bps: f64,
    /// Sum of hop RTTs.
    pub delay: Duration,
    /// End-to-end loss probability.
    pub loss: f64,
}

/// A chosen path.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Choice {
    /// The path.
    pub path: Path,
    /// Its quality on its own.
    pub quality: Quality,
    /// The throughput it can add on top of the paths chosen before it (its bottleneck
    /// over the remaining capacities), bit/s: the striping weight to give it.
    pub share_bps: f64,
}

/// How the engine chooses.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteConfig {
    /// The metric.
    pub metric: Metric,
    /// Most paths to choose, 1..=[`MAX_PATHS`].
    pub max_paths: usize,
    /// Measurements older than this are ignored: a hop without a fresh measurement is
    /// not usable (a dead relay stops answering probes and sending UPDATEs).
    pub max_age: Duration,
    /// Access uplink capacity per node, bit/s (index = node id); missing entries are
    /// unlimited.
    pub egress_bps: Vec<f64>,
    /// Access downlink capacity per node, bit/s; missing entries are unlimited.
    pub ingress_bps: Vec<f64>,
    /// A path that would add less than this is not chosen, bit/s.
    pub min_share_bps: f64,
}

impl Default for RouteConfig {
    fn default() -> Self {
        RouteConfig {
            metric: Metric::Throughput,
            max_paths: MAX_PATHS,
            max_age: Duration::from_secs(60),
            egress_bps: Vec::new(),
            ingress_bps: Vec::new(),
            min_share_bps: 1.0,
        }
    }
}

/// The quality of `path` from the table at `now`, if every hop has a measurement at
/// most `max_age` old.
pub fn quality(
    table: &AccessTable,
    path: &Path,
    now: Instant,
    max_age: Duration,
) -> Option<Quality> {
    if !path.is_loop_free() {
        return None;
    }
    let mut q = Quality {
        throughput_bps: f64::INFINITY,
        delay: Duration::ZERO,
        loss: 0.0,
    };
    let mut delivered = 1.0;
    for (a, b) in path.hops() {
        let m = table.fresh(a, b, now, max_age)?;
        q.throughput_bps = q.throughput_bps.min(m.throughput_bps);
        q.delay = q.delay + m.rtt;
        delivered *= 1.0 - m.loss;
    }
    q.loss = 1.0 - delivered;
    Some(q)
}

/// Every usable candidate of `src -> dst`: the direct path first, then one per relay in
/// node order, each with its quality.
pub fn candidates(
    table: &AccessTable,
    src: NodeId,
    dst: NodeId,
    now: Instant,
    max_age: Duration,
) -> Vec<(Path, Quality)> {
    let n = table.nodes();
    if src == dst || src as usize >= n || dst as usize >= n {
        return Vec::new();
    }
    let direct = core::iter::once(Path::direct(src, dst));
    let relays = (0..n as NodeId)
        .filter(|&r| r != src && r != dst)
        .map(|r| Path::via(src, r, dst));
    direct
        .chain(relays)
        .filter_map(|p| quality(table, &p, now, max_age).map(|q| (p, q)))
        .collect()
}

/// The resources a path draws on, each with its remaining capacity.
struct Residual {
    hops: Vec<((NodeId, NodeId), f64)>,
    egress: Vec<f64>,
    ingress: Vec<f64>,
}

impl Residual {
    fn new(cfg: &RouteConfig, table: &AccessTable, cands: &[(Path, Quality)]) -> Residual {
        let cap = |v: &Vec<f64>, i: usize| v.get(i).copied().unwrap_or(f64::INFINITY);
        let mut hops = Vec::new();
        for (p, _) in cands {
            for h in p.hops() {
                if !hops.iter().any(|&(k, _)| k == h) {
                    // A hop's capacity is its own measured throughput.
                    let c = table.get(h.0, h.1).map_or(0.0, |m| m.throughput_bps);
                    hops.push((h, c));
                }
            }
        }
        let nodes = table.nodes();
        Residual {
            hops,
            egress: (0..nodes).map(|i| cap(&cfg.egress_bps, i)).collect(),
            ingress: (0..nodes).map(|i| cap(&cfg.ingress_bps, i)).collect(),
        }
    }

    fn hop(&self, h: (NodeId, NodeId)) -> f64 {
        self.hops
            .iter()
            .find(|&&(k, _)| k == h)
            .map_or(f64::INFINITY, |&(_, c)| c)
    }

    /// What `path` can carry on top of what is already taken: its own bottleneck, less
    /// what earlier paths took of each resource it uses.
    fn share(&self, path: &Path, q: &Quality) -> f64 {
        let mut s = q.throughput_bps;
        for (a, b) in path.hops() {
            s = s
                .min(self.hop((a, b)))
                .min(self.egress[a as usize])
                .min(self.ingress[b as usize]);
        }
        s.max(0.0)
    }

    fn take(&mut self, path: &Path, amount: f64) {
        for (a, b) in path.hops() {
            if let Some((_, c)) = self.hops.iter_mut().find(|(k, _)| *k == (a, b)) {
                *c -= amount;
            }
            self.egress[a as usize] -= amount;
            self.ingress[b as usize] -= amount;
        }
    }
}

/// Is `a` better than `b` by `metric`? Ties go to more throughput, then to fewer hops,
/// then to the lower relay id, so the choice is deterministic.
fn better(metric: Metric, a: (&Path, &Quality, f64), b: (&Path, &Quality, f64)) -> bool {
    use core::cmp::Ordering::*;
    let primary = match metric {
        Metric::Throughput => a.2.total_cmp(&b.2),
        Metric::Delay => b.1.delay.cmp(&a.1.delay),
        Metric::Loss => b.1.loss.total_cmp(&a.1.loss),
    };
    let ord = primary
        .then(a.2.total_cmp(&b.2))
        .then(b.0.hop_count().cmp(&a.0.hop_count()))
        .then(b.0.relay.cmp(&a.0.relay));
    ord == Greater
}

/// Choose up to `cfg.max_paths` paths for `src -> dst` from the table at `now`, best
/// first (see the module documentation for the greedy treatment of shared resources).
/// Empty if no candidate has fresh measurements or all shares are below
/// `cfg.min_share_bps`.
pub fn choose(
    table: &AccessTable,
    src: NodeId,
    dst: NodeId,
    now: Instant,
    cfg: &RouteConfig,
) -> Vec<Choice> {
    let cands = candidates(table, src, dst, now, cfg.max_age);
    pick(table, &cands, cfg, cfg.max_paths.clamp(1, MAX_PATHS))
}

/// Score a fixed set of paths in the given order with the same greedy contention model:
/// each path's share on top of the ones before it. A path without fresh measurements
/// gets `None`.
pub fn score_set(
    table: &AccessTable,
    paths: &[Path],
    now: Instant,
    cfg: &RouteConfig,
) -> Vec<Option<Choice>> {
    let cands: Vec<(Path, Quality)> = paths
        .iter()
        .filter_map(|p| quality(table, p, now, cfg.max_age).map(|q| (*p, q)))
        .collect();
    let mut res = Residual::new(cfg, table, &cands);
    paths
        .iter()
        .map(|p| {
            let q = quality(table, p, now, cfg.max_age)?;
            if p.src as usize >= table.nodes() || p.dst as usize >= table.nodes() {
                return None;
            }
            let share = res.share(p, &q);
            res.take(p, share);
            Some(Choice {
                path: *p,
                quality: q,
                share_bps: share,
            })
        })
        .collect()
}

fn pick(
    table: &AccessTable,
    cands: &[(Path, Quality)],
    cfg: &RouteConfig,
    max: usize,
) -> Vec<Choice> {
    let mut res = Residual::new(cfg, table, cands);
    let mut used = vec![false; cands.len()];
    let mut out = Vec::new();
    while out.len() < max {
        let mut best: Option<(usize, f64)> = None;
        for (i, (p, q)) in cands.iter().enumerate() {
            if used[i] {
                continue;
            }
            let share = res.share(p, q);
            if share < cfg.min_share_bps || share <= 0.0 {
                continue;
            }
            let take = match best {
                None => true,
                Some((j, s)) => better(cfg.metric, (p, q, share), (&cands[j].0, &cands[j].1, s)),
            };
            if take {
                best = Some((i, share));
            }
        }
        let Some((i, share)) = best else { break };
        used[i] = true;
        let (p, q) = cands[i];
        res.take(&p, share);
        out.push(Choice {
            path: p,
            quality: q,
            share_bps: share,
        });
    }
    out
}

/// The value of a chosen set under `metric`, for comparing two sets: the sum of shares
/// for throughput (what the stripe can carry); the largest path delay for delay (the
/// resequencer waits for the slowest path); the share-weighted mean loss for loss (the
/// fraction of the striped stream lost). Higher is better for throughput, lower for the
/// others. `None` for an empty set.
pub fn set_value(metric: Metric, set: &[Choice]) -> Option<f64> {
    if set.is_empty() {
        return None;
    }
    Some(match metric {
        Metric::Throughput => set.iter().map(|c| c.share_bps).sum(),
        Metric::Delay => set
            .iter()
            .map(|c| c.quality.delay.as_secs_f64())
            .fold(0.0, f64::max),
        Metric::Loss => {
            let total: f64 = set.iter().map(|c| c.share_bps).sum();
            if total <= 0.0 {
                set.iter().map(|c| c.quality.loss).fold(0.0, f64::max)
            } else {
                set.iter()
                    .map(|c| c.quality.loss * c.share_bps)
                    .sum::<f64>()
                    / total
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::super::table::Measurement;
    use super::*;

    fn table(n: usize, links: &[(NodeId, NodeId, f64, u64, f64)]) -> AccessTable {
        let mut t = AccessTable::new(n);
        for &(a, b, mbps, rtt_ms, loss) in links {
            t.update(
                a,
                b,
                Measurement {
                    throughput_bps: mbps * 1e6,
                    rtt: Duration::from_millis(rtt_ms),
                    loss,
                    at: Instant::ZERO,
                },
            )
            .unwrap();
        }
        t
    }

    fn paths(c: &[Choice]) -> Vec<String> {
        c.iter().map(|c| c.path.to_string()).collect()
    }

    /// 0 -> 3 direct is slow; through 1 and 2 it is faster.
    fn diamond() -> AccessTable {
        table(
            4,
            &[
                (0, 3, 2.0, 80, 0.0),
                (0, 1, 10.0, 20, 0.01),
                (1, 3, 6.0, 30, 0.01),
                (0, 2, 4.0, 10, 0.0),
                (2, 3, 8.0, 10, 0.0),
            ],
        )
    }

    #[test]
    fn throughput_picks_bottlenecks_in_order() {
        let t = diamond();
        let c = choose(&t, 0, 3, Instant::ZERO, &RouteConfig::default());
        assert_eq!(paths(&c), ["0->1->3", "0->2->3", "0->3"]);
        assert_eq!(c[0].quality.throughput_bps, 6e6);
        assert_eq!(c[1].quality.throughput_bps, 4e6);
        assert_eq!(c[0].quality.delay, Duration::from_millis(50));
        assert!((c[0].quality.loss - (1.0 - 0.99 * 0.99)).abs() < 1e-12);
    }

    #[test]
    fn delay_and_loss_metrics() {
        let t = diamond();
        let mut cfg = RouteConfig {
            metric: Metric::Delay,
            ..RouteConfig::default()
        };
        assert_eq!(
            paths(&choose(&t, 0, 3, Instant::ZERO, &cfg)),
            ["0->2->3", "0->1->3", "0->3"]
        );
        cfg.metric = Metric::Loss;
        cfg.max_paths = 2;
        // 0->3 and 0->2->3 are both lossless; 0->2->3 carries more.
        assert_eq!(
            paths(&choose(&t, 0, 3, Instant::ZERO, &cfg)),
            ["0->2->3", "0->3"]
        );
    }

    #[test]
    fn shared_uplink_limits_later_paths() {
        let t = diamond();
        // The source's uplink carries 9 Mbit/s: the first path takes 6, the second can
        // add only 3 of its 4, the third (direct, 2) nothing.
        let cfg = RouteConfig {
            egress_bps: vec![9e6],
            ..RouteConfig::default()
        };
        let c = choose(&t, 0, 3, Instant::ZERO, &cfg);
        assert_eq!(paths(&c), ["0->1->3", "0->2->3"]);
        assert_eq!(c[0].share_bps, 6e6);
        assert_eq!(c[1].share_bps, 3e6);
        assert_eq!(set_value(Metric::Throughput, &c), Some(9e6));
    }

    #[test]
    fn stale_hops_are_not_used() {
        let mut t = diamond();
        // Relay 1's outgoing hop is refreshed late; the others stay at time 0.
        let m = *t.get(1, 3).unwrap();
        t.update(
            1,
            3,
            Measurement {
                at: Instant::from_micros(5_000_000),
                ..m
            },
        )
        .unwrap();
        let cfg = RouteConfig {
            max_age: Duration::from_secs(1),
            ..RouteConfig::default()
        };
        // At 5.5 s only 1->3 is fresh: no complete path.
        assert!(choose(&t, 0, 3, Instant::from_micros(5_500_000), &cfg).is_empty());
        // At 0.5 s everything but 1->3 (newer than now: age 0) is fresh.
        assert_eq!(
            choose(&t, 0, 3, Instant::from_micros(500_000), &cfg).len(),
            3
        );
    }

    #[test]
    fn no_candidates_for_bad_pairs() {
        let t = diamond();
        let cfg = RouteConfig::default();
        assert!(choose(&t, 0, 0, Instant::ZERO, &cfg).is_empty());
        assert!(choose(&t, 0, 9, Instant::ZERO, &cfg).is_empty());
        // 3 -> 0 has no measurements at all.
        assert!(choose(&t, 3, 0, Instant::ZERO, &cfg).is_empty());
    }

    #[test]
    fn score_set_in_given_order() {
        let t = diamond();
        let cfg = RouteConfig {
            egress_bps: vec![9e6],
            ..RouteConfig::default()
        };
        let s = score_set(
            &t,
            &[Path::direct(0, 3), Path::via(0, 1, 3), Path::via(0, 9, 3)],
            Instant::ZERO,
            &cfg,
        );
        assert_eq!(s[0].map(|c| c.share_bps), Some(2e6));
        assert_eq!(s[1].map(|c| c.share_bps), Some(6e6));
        assert_eq!(s[2], None);
    }

    #[test]
    fn path_shape() {
        assert!(Path::via(0, 1, 2).is_loop_free());
        assert!(!Path::via(0, 0, 2).is_loop_free());
        assert!(!Path::via(0, 2, 2).is_loop_free());
        assert!(!Path::direct(1, 1).is_loop_free());
        assert_eq!(Path::via(0, 1, 2).hops(), vec![(0, 1), (1, 2)]);
        assert_eq!(Metric::from_name("delay"), Some(Metric::Delay));
        assert_eq!(Metric::from_name("jitter"), None);
    }
}
