//! DCE probe scheduling: which peer to probe next, and when.
//!
//! The paper's sampling block sends "a probe flow from each source to each destination
//! ... The probe flows run in series as to avoid friendly traffic interference": a
//! throughput probe measures what a hop gives a flow *alone*, so two probes must never
//! share a bottleneck at the same time. [`ProbeSchedule`] gives every ordered pair of
//! the overlay's nodes its own time slot in a cycle of `n (n - 1)` slots; each node
//! computes its own slots from the same node list and the same epoch, so no two probes
//! anywhere in the overlay overlap (up to clock offsets, which the guard time at the
//! end of each slot absorbs). A node's own probes go to its peers one after another.
//!
//! Light probes (RTT and loss) are small and do not disturb each other, so they are not
//! serialized: every node pings every peer each `ping_every`
//! ([`ProbeSchedule::next_ping`]). They are what detects a dead relay quickly; the
//! throughput probes of a cycle can be minutes apart.
//!
//! The schedule is a pure function of time: no state, nothing to lose on restart.

use crate::time::{Duration, Instant};

use super::NodeId;

/// Timing of the probes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProbeConfig {
    /// Length of one pair's slot.
    pub slot: Duration,
    /// How long a throughput probe runs, at the start of its slot; the rest of the slot
    /// is guard time.
    pub probe: Duration,
    /// The instant the first cycle starts (shared by all nodes).
    pub epoch: Instant,
    /// Interval of the light probes.
    pub ping_every: Duration,
}

/// One throughput probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    /// The peer probed.
    pub peer: NodeId,
    /// When to start sending.
    pub start: Instant,
    /// When to stop.
    pub end: Instant,
}

/// Why a schedule could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// Fewer than two distinct nodes.
    #[error("an overlay needs at least two nodes")]
    TooFewNodes,
    /// This node is not in the list.
    #[error("node {0} is not in the node list")]
    NotAMember(NodeId),
    /// A zero slot or ping interval, or a probe longer than its slot.
    #[error("probe must be non-zero and no longer than its slot; slot and ping interval non-zero")]
    Timing,
}

/// The serial probe schedule of one node.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeSchedule {
    nodes: Vec<NodeId>,
    me: NodeId,
    cfg: ProbeConfig,
}

impl ProbeSchedule {
    /// The schedule of node `me` in an overlay of `nodes` (any order; duplicates are
    /// ignored: every node sorts the list the same way).
    pub fn new(
        mut nodes: Vec<NodeId>,
        me: NodeId,
        cfg: ProbeConfig,
    ) -> Result<ProbeSchedule, ScheduleError> {
        nodes.sort_unstable();
        nodes.dedup();
        if nodes.len() < 2 {
            return Err(ScheduleError::TooFewNodes);
        }
        if !nodes.contains(&me) {
            return Err(ScheduleError::NotAMember(me));
        }
        if cfg.slot == Duration::ZERO
            || cfg.probe == Duration::ZERO
            || cfg.probe > cfg.slot
            || cfg.ping_every == Duration::ZERO
        {
            return Err(ScheduleError::Timing);
        }
        Ok(ProbeSchedule { nodes, me, cfg })
    }

    fn slots(&self) -> u64 {
        let n = self.nodes.len() as u64;
        n * (n - 1)
    }

    /// One full cycle: every ordered pair probed once.
    pub fn cycle(&self) -> Duration {
        Duration::from_micros(self.cfg.slot.as_micros().saturating_mul(self.slots()))
    }

    /// The ordered pair `(prober, probed)` of slot `k` of a cycle: sources in node
    /// order, each probing its peers in node order.
    fn pair(&self, k: u64) -> (NodeId, NodeId) {
        let n = self.nodes.len() as u64;
        let a = (k / (n - 1)) as usize;
        let mut b = (k % (n - 1)) as usize;
        if b >= a {
            b += 1;
        }
        (self.nodes[a], self.nodes[b])
    }

    /// Who probes whom at `t` (anywhere in the overlay), if a probe runs then.
    pub fn active_at(&self, t: Instant) -> Option<(NodeId, NodeId)> {
        if t < self.cfg.epoch {
            return None;
        }
        let since = (t - self.cfg.epoch).as_micros();
        let slot = self.cfg.slot.as_micros();
        let k = (since / slot) % self.slots();
        (since % slot < self.cfg.probe.as_micros()).then(|| self.pair(k))
    }

    /// The first of this node's probes that starts at or after `now`.
    pub fn next_probe(&self, now: Instant) -> Probe {
        let slot = self.cfg.slot.as_micros();
        let epoch = self.cfg.epoch.as_micros();
        // First slot starting at or after now.
        let mut k = now.as_micros().saturating_sub(epoch).div_ceil(slot);
        // Within one cycle, one of our slots comes up.
        let me = self.nodes.iter().position(|&n| n == self.me).unwrap_or(0) as u64;
        let per = self.nodes.len() as u64 - 1;
        let cycle = self.slots();
        let in_cycle = k % cycle;
        let first = me * per;
        let last = first + per - 1;
        if in_cycle > last {
            k += cycle - in_cycle + first;
        } else if in_cycle < first {
            k += first - in_cycle;
        }
        let (_, peer) = self.pair(k % cycle);
        let start = Instant::from_micros(epoch + k * slot);
        Probe {
            peer,
            start,
            end: start + self.cfg.probe,
        }
    }

    /// The first light-probe round at or after `now` (every peer is pinged then).
    pub fn next_ping(&self, now: Instant) -> Instant {
        let every = self.cfg.ping_every.as_micros();
        let epoch = self.cfg.epoch.as_micros();
        let k = now.as_micros().saturating_sub(epoch).div_ceil(every);
        Instant::from_micros(epoch + k * every)
    }

    /// The peers this node probes, in its probe order.
    pub fn peers(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes.iter().copied().filter(move |&n| n != self.me)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ProbeConfig {
        ProbeConfig {
            slot: Duration::from_millis(100),
            probe: Duration::from_millis(80),
            epoch: Instant::from_micros(1_000_000),
            ping_every: Duration::from_millis(50),
        }
    }

    #[test]
    fn each_node_probes_each_peer_in_turn() {
        let s = ProbeSchedule::new(vec![7, 3, 5], 5, cfg()).unwrap();
        assert_eq!(s.cycle(), Duration::from_millis(600));
        assert_eq!(s.peers().collect::<Vec<_>>(), [3, 7]);
        // Node order 3, 5, 7: slots 0-1 are node 3's, 2-3 node 5's, 4-5 node 7's.
        let p = s.next_probe(Instant::ZERO);
        assert_eq!(p.peer, 3);
        assert_eq!(p.start, Instant::from_micros(1_200_000));
        assert_eq!(p.end, Instant::from_micros(1_280_000));
        let p = s.next_probe(Instant::from_micros(1_200_001));
        assert_eq!((p.peer, p.start), (7, Instant::from_micros(1_300_000)));
        // After our last slot, the next cycle's first.
        let p = s.next_probe(Instant::from_micros(1_300_001));
        assert_eq!((p.peer, p.start), (3, Instant::from_micros(1_800_000)));
    }

    #[test]
    fn probes_never_overlap_across_nodes() {
        let nodes = vec![0, 1, 2, 3, 4];
        let scheds: Vec<_> = nodes
            .iter()
            .map(|&me| ProbeSchedule::new(nodes.clone(), me, cfg()).unwrap())
            .collect();
        // Collect every node's probes over two cycles; no two intervals intersect and
        // every ordered pair is probed once per cycle.
        let mut all = Vec::new();
        for (i, s) in scheds.iter().enumerate() {
            let mut t = Instant::ZERO;
            loop {
                let p = s.next_probe(t);
                if p.start >= Instant::from_micros(1_000_000) + s.cycle() + s.cycle() {
                    break;
                }
                assert_eq!(s.active_at(p.start), Some((nodes[i], p.peer)));
                all.push((p.start, p.end, nodes[i], p.peer));
                t = p.start + Duration::from_micros(1);
            }
        }
        all.sort();
        assert_eq!(all.len(), 2 * 20);
        for w in all.windows(2) {
            assert!(w[0].1 <= w[1].0, "{w:?}");
        }
        let mut pairs: Vec<_> = all[..20].iter().map(|a| (a.2, a.3)).collect();
        pairs.sort();
        pairs.dedup();
        assert_eq!(pairs.len(), 20);
    }

    #[test]
    fn pings_and_bad_configs() {
        let s = ProbeSchedule::new(vec![0, 1], 0, cfg()).unwrap();
        assert_eq!(s.next_ping(Instant::ZERO), Instant::from_micros(1_000_000));
        assert_eq!(
            s.next_ping(Instant::from_micros(1_000_001)),
            Instant::from_micros(1_050_000)
        );
        assert_eq!(s.active_at(Instant::from_micros(1_090_000)), None);
        assert_eq!(
            ProbeSchedule::new(vec![0, 0], 0, cfg()),
            Err(ScheduleError::TooFewNodes)
        );
        assert_eq!(
            ProbeSchedule::new(vec![0, 1], 2, cfg()),
            Err(ScheduleError::NotAMember(2))
        );
        let long = ProbeConfig {
            probe: Duration::from_millis(200),
            ..cfg()
        };
        assert_eq!(
            ProbeSchedule::new(vec![0, 1], 0, long),
            Err(ScheduleError::Timing)
        );
    }
}
