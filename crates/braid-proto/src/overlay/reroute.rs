//! The reroute decision: when a flow moves to a new set of paths.
//!
//! The paper keeps a flow on its paths "until a threshold has passed, a shorter more
//! direct path with acceptable path quality is found, or another path ... is located
//! with a more desirable path quality". Moving on every small improvement would make a
//! flow flap between paths of equal quality (measurements are noisy) and each move costs
//! a PROVISION round and a resequencer epoch. So a [`Rerouter`] moves a flow only when
//!
//! * a hop of one of its current paths has had no measurement for
//!   [`RerouteConfig::dead_after`] (a dead relay or a cut hop): at once, on the first
//!   evaluation that sees it, to the best set of the paths still measured; or
//! * the best set the engine finds is better than the current one, re-scored with the
//!   same fresh measurements, by at least [`RerouteConfig::threshold`] (a fraction) on
//!   [`RerouteConfig::consecutive`] evaluations in a row (hysteresis: one good sample
//!   is not enough, and a single worse one resets the count).

use crate::time::{Duration, Instant};

use super::route::{self, Choice, Metric, Path, RouteConfig};
use super::table::AccessTable;
use super::NodeId;

/// Reroute settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RerouteConfig {
    /// How much better (as a fraction: 0.1 = 10 %) a new set must be.
    pub threshold: f64,
    /// On how many evaluations in a row.
    pub consecutive: u32,
    /// A hop with no measurement for this long is dead.
    pub dead_after: Duration,
}

impl Default for RerouteConfig {
    fn default() -> Self {
        RerouteConfig {
            threshold: 0.1,
            consecutive: 3,
            dead_after: Duration::from_millis(500),
        }
    }
}

/// Why a flow moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The flow had no paths yet.
    Initial,
    /// The hop `from -> to` of a current path had no fresh measurement.
    Dead {
        /// Hop start.
        from: NodeId,
        /// Hop end.
        to: NodeId,
    },
    /// A better set won on enough evaluations in a row.
    Better,
}

/// The outcome of one evaluation.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Stay on the current paths.
    Keep,
    /// Move to these paths (possibly none, if nothing is usable).
    Switch {
        /// The new paths, best first.
        paths: Vec<Choice>,
        /// Why.
        reason: Reason,
    },
}

/// The reroute state of one flow `src -> dst`.
#[derive(Clone, Debug)]
pub struct Rerouter {
    src: NodeId,
    dst: NodeId,
    route: RouteConfig,
    cfg: RerouteConfig,
    current: Vec<Path>,
    streak: u32,
}

fn is_better(metric: Metric, new: f64, cur: f64, threshold: f64) -> bool {
    match metric {
        Metric::Throughput => new > cur * (1.0 + threshold),
        Metric::Delay | Metric::Loss => new < cur * (1.0 - threshold),
    }
}

impl Rerouter {
    /// A flow with no paths yet. The engine's `max_age` is replaced by
    /// `cfg.dead_after`, so that a dead hop is never chosen again.
    pub fn new(src: NodeId, dst: NodeId, route: RouteConfig, cfg: RerouteConfig) -> Rerouter {
        let route = RouteConfig {
            max_age: cfg.dead_after,
            ..route
        };
        Rerouter {
            src,
            dst,
            route,
            cfg,
            current: Vec::new(),
            streak: 0,
        }
    }

    /// The paths the flow is on.
    pub fn current(&self) -> &[Path] {
        &self.current
    }

    /// Evaluations in a row on which a better set has won so far.
    pub fn streak(&self) -> u32 {
        self.streak
    }

    /// Evaluate at `now` against the table; on [`Decision::Switch`] the flow is on the
    /// new paths from now on.
    pub fn evaluate(&mut self, now: Instant, table: &AccessTable) -> Decision {
        let best = route::choose(table, self.src, self.dst, now, &self.route);
        if self.current.is_empty() {
            self.streak = 0;
            if best.is_empty() {
                return Decision::Keep;
            }
            return self.switch(best, Reason::Initial);
        }
        // A dead hop moves the flow at once.
        for p in &self.current {
            for (from, to) in p.hops() {
                if table.fresh(from, to, now, self.cfg.dead_after).is_none() {
                    return self.switch(best, Reason::Dead { from, to });
                }
            }
        }
        let same = best.len() == self.current.len()
            && best.iter().zip(&self.current).all(|(c, p)| c.path == *p);
        let metric = self.route.metric;
        let scored: Vec<Choice> = route::score_set(table, &self.current, now, &self.route)
            .into_iter()
            .flatten()
            .collect();
        let won = !same
            && match (
                route::set_value(metric, &best),
                route::set_value(metric, &scored),
            ) {
                (Some(new), Some(cur)) => is_better(metric, new, cur, self.cfg.threshold),
                _ => false,
            };
        if !won {
            self.streak = 0;
            return Decision::Keep;
        }
        self.streak += 1;
        if self.streak >= self.cfg.consecutive.max(1) {
            return self.switch(best, Reason::Better);
        }
        Decision::Keep
    }

    fn switch(&mut self, paths: Vec<Choice>, reason: Reason) -> Decision {
        self.streak = 0;
        self.current = paths.iter().map(|c| c.path).collect();
        Decision::Switch { paths, reason }
    }
}

#[cfg(test)]
mod tests {
    use super::super::table::Measurement;
    use super::*;

    fn put(t: &mut AccessTable, a: NodeId, b: NodeId, mbps: f64, at_ms: u64) {
        t.update(
            a,
            b,
            Measurement {
                throughput_bps: mbps * 1e6,
                rtt: Duration::from_millis(10),
                loss: 0.0,
                at: Instant::from_micros(at_ms * 1000),
            },
        )
        .unwrap();
    }

    fn ms(v: u64) -> Instant {
        Instant::from_micros(v * 1000)
    }

    /// 0 -> 2 direct (5) and through 1 (4 and 6).
    fn triangle(at: u64) -> AccessTable {
        let mut t = AccessTable::new(3);
        put(&mut t, 0, 2, 5.0, at);
        put(&mut t, 0, 1, 4.0, at);
        put(&mut t, 1, 2, 6.0, at);
        t
    }

    fn one_path() -> RouteConfig {
        RouteConfig {
            max_paths: 1,
            ..RouteConfig::default()
        }
    }

    #[test]
    fn initial_then_keep() {
        let mut r = Rerouter::new(0, 2, one_path(), RerouteConfig::default());
        assert_eq!(r.evaluate(ms(0), &AccessTable::new(3)), Decision::Keep);
        let t = triangle(0);
        match r.evaluate(ms(0), &t) {
            Decision::Switch { paths, reason } => {
                assert_eq!(reason, Reason::Initial);
                assert_eq!(paths[0].path, Path::direct(0, 2));
            }
            d => panic!("{d:?}"),
        }
        assert_eq!(r.evaluate(ms(100), &t), Decision::Keep);
    }

    #[test]
    fn hysteresis_needs_consecutive_wins() {
        let cfg = RerouteConfig {
            threshold: 0.2,
            consecutive: 3,
            dead_after: Duration::from_secs(10),
        };
        let mut r = Rerouter::new(0, 2, one_path(), cfg);
        let mut t = triangle(0);
        r.evaluate(ms(0), &t);
        assert_eq!(r.current(), &[Path::direct(0, 2)]);
        // The relay path becomes 5.5: better, but by less than 20 %.
        put(&mut t, 0, 1, 5.5, 10);
        put(&mut t, 1, 2, 5.5, 10);
        for i in 0..5 {
            assert_eq!(r.evaluate(ms(20 + i), &t), Decision::Keep);
        }
        // Now 7: 40 % better. Two wins, a relapse, then three wins.
        put(&mut t, 0, 1, 7.0, 30);
        put(&mut t, 1, 2, 7.0, 30);
        assert_eq!(r.evaluate(ms(40), &t), Decision::Keep);
        assert_eq!(r.evaluate(ms(41), &t), Decision::Keep);
        assert_eq!(r.streak(), 2);
        put(&mut t, 0, 1, 5.0, 50);
        assert_eq!(r.evaluate(ms(51), &t), Decision::Keep);
        assert_eq!(r.streak(), 0);
        put(&mut t, 0, 1, 7.0, 60);
        assert_eq!(r.evaluate(ms(61), &t), Decision::Keep);
        assert_eq!(r.evaluate(ms(62), &t), Decision::Keep);
        match r.evaluate(ms(63), &t) {
            Decision::Switch { paths, reason } => {
                assert_eq!(reason, Reason::Better);
                assert_eq!(paths[0].path, Path::via(0, 1, 2));
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn dead_relay_is_dropped_at_once() {
        let cfg = RerouteConfig {
            threshold: 0.5,
            consecutive: 10,
            dead_after: Duration::from_millis(300),
        };
        let mut r = Rerouter::new(0, 2, RouteConfig::default(), cfg);
        let t = triangle(0);
        r.evaluate(ms(0), &t);
        assert_eq!(r.current().len(), 2);
        // Everything but the relay's hops is refreshed; at 400 ms relay 1 is dead.
        let mut t2 = t.clone();
        put(&mut t2, 0, 2, 5.0, 350);
        assert_eq!(r.evaluate(ms(250), &t2), Decision::Keep);
        match r.evaluate(ms(400), &t2) {
            Decision::Switch { paths, reason } => {
                assert_eq!(reason, Reason::Dead { from: 0, to: 1 });
                assert_eq!(paths.len(), 1);
                assert_eq!(paths[0].path, Path::direct(0, 2));
            }
            d => panic!("{d:?}"),
        }
    }
}
