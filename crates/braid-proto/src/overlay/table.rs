//! The accessibility table: the latest measurement of every directed overlay hop.

use crate::time::{Duration, Instant};

use super::NodeId;

/// One measurement of a directed hop `from -> to`, as the DCE at `from` took it (or as an
/// UPDATE from `from` reported it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measurement {
    /// Throughput a probe flow achieved alone on the hop, bit/s.
    pub throughput_bps: f64,
    /// Round-trip time of the light probes.
    pub rtt: Duration,
    /// Fraction of light probes lost, 0..=1.
    pub loss: f64,
    /// When the measurement was taken (the table's clock; an UPDATE carries its age).
    pub at: Instant,
}

impl Measurement {
    /// True if every field is usable: a finite, non-negative throughput and a loss in
    /// `0..=1`.
    pub fn is_valid(&self) -> bool {
        self.throughput_bps.is_finite()
            && self.throughput_bps >= 0.0
            && self.loss.is_finite()
            && (0.0..=1.0).contains(&self.loss)
    }
}

/// Why a measurement was not stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    /// A node id outside `0..nodes`.
    #[error("node {0} is not in the overlay")]
    UnknownNode(NodeId),
    /// A hop from a node to itself.
    #[error("a hop from node {0} to itself")]
    SelfHop(NodeId),
    /// A NaN, infinite or negative throughput, or a loss outside 0..=1.
    #[error("invalid measurement")]
    Invalid,
}

/// The latest measurement of each directed pair of an `n`-node overlay; nodes are
/// numbered `0..n`.
///
/// The QRE keeps one table. A newer measurement replaces an older one; one older than
/// the stored one (a reordered UPDATE) is ignored, so the table only moves forward.
#[derive(Clone, Debug, PartialEq)]
pub struct AccessTable {
    nodes: usize,
    cells: Vec<Option<Measurement>>,
}

impl AccessTable {
    /// An empty table for `nodes` nodes (at most 65 535: ids are 16-bit on the wire).
    pub fn new(nodes: usize) -> AccessTable {
        let nodes = nodes.min(NodeId::MAX as usize);
        AccessTable {
            nodes,
            cells: vec![None; nodes * nodes],
        }
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    fn index(&self, from: NodeId, to: NodeId) -> Result<usize, TableError> {
        for n in [from, to] {
            if n as usize >= self.nodes {
                return Err(TableError::UnknownNode(n));
            }
        }
        if from == to {
            return Err(TableError::SelfHop(from));
        }
        Ok(from as usize * self.nodes + to as usize)
    }

    /// Store a measurement of `from -> to`. Returns `Ok(false)` if the table already
    /// holds a newer one (nothing changes).
    pub fn update(&mut self, from: NodeId, to: NodeId, m: Measurement) -> Result<bool, TableError> {
        let i = self.index(from, to)?;
        if !m.is_valid() {
            return Err(TableError::Invalid);
        }
        if let Some(old) = self.cells[i] {
            if old.at > m.at {
                return Ok(false);
            }
        }
        self.cells[i] = Some(m);
        Ok(true)
    }

    /// Forget the hop `from -> to`.
    pub fn clear(&mut self, from: NodeId, to: NodeId) {
        if let Ok(i) = self.index(from, to) {
            self.cells[i] = None;
        }
    }

    /// The latest measurement of `from -> to`, however old.
    pub fn get(&self, from: NodeId, to: NodeId) -> Option<&Measurement> {
        self.index(from, to)
            .ok()
            .and_then(|i| self.cells[i].as_ref())
    }

    /// How old the latest measurement of `from -> to` is at `now` (None if there is
    /// none).
    pub fn age(&self, from: NodeId, to: NodeId, now: Instant) -> Option<Duration> {
        self.get(from, to).map(|m| now - m.at)
    }

    /// The measurement of `from -> to` if it is at most `max_age` old at `now`.
    pub fn fresh(
        &self,
        from: NodeId,
        to: NodeId,
        now: Instant,
        max_age: Duration,
    ) -> Option<&Measurement> {
        self.get(from, to).filter(|m| now - m.at <= max_age)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(bps: f64, at: u64) -> Measurement {
        Measurement {
            throughput_bps: bps,
            rtt: Duration::from_millis(20),
            loss: 0.0,
            at: Instant::from_micros(at),
        }
    }

    #[test]
    fn newer_replaces_older_is_ignored() {
        let mut t = AccessTable::new(3);
        assert_eq!(t.update(0, 1, m(5.0, 100)), Ok(true));
        assert_eq!(t.update(0, 1, m(7.0, 50)), Ok(false));
        assert_eq!(t.get(0, 1).map(|m| m.throughput_bps), Some(5.0));
        assert_eq!(t.update(0, 1, m(9.0, 200)), Ok(true));
        assert_eq!(t.get(0, 1).map(|m| m.throughput_bps), Some(9.0));
        // Directed: the reverse hop is separate.
        assert_eq!(t.get(1, 0), None);
    }

    #[test]
    fn bad_input_is_refused() {
        let mut t = AccessTable::new(3);
        assert_eq!(t.update(0, 3, m(1.0, 0)), Err(TableError::UnknownNode(3)));
        assert_eq!(t.update(2, 2, m(1.0, 0)), Err(TableError::SelfHop(2)));
        assert_eq!(t.update(0, 1, m(f64::NAN, 0)), Err(TableError::Invalid));
        assert_eq!(t.update(0, 1, m(-1.0, 0)), Err(TableError::Invalid));
        let mut lossy = m(1.0, 0);
        lossy.loss = 1.5;
        assert_eq!(t.update(0, 1, lossy), Err(TableError::Invalid));
        assert_eq!(t.get(5, 0), None);
    }

    #[test]
    fn age_and_freshness() {
        let mut t = AccessTable::new(2);
        t.update(0, 1, m(1.0, 1_000)).unwrap();
        let now = Instant::from_micros(501_000);
        assert_eq!(t.age(0, 1, now), Some(Duration::from_millis(500)));
        assert!(t.fresh(0, 1, now, Duration::from_millis(500)).is_some());
        assert!(t.fresh(0, 1, now, Duration::from_millis(499)).is_none());
        t.clear(0, 1);
        assert_eq!(t.age(0, 1, now), None);
    }
}
