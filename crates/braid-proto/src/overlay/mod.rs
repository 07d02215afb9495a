//! The GALO overlay and Application Layer Striping (seed 003: Beyah, Sivakumar and
//! Copeland, *Application Layer Striping*).
//!
//! Cooperating nodes measure the quality of the overlay hops between them, a route
//! engine builds alternate paths of at most two hops (direct, or through one relay) and
//! a flow is striped over up to three of them. This module is the sans-IO core of that;
//! like the rest of the crate it reads no clock (every input takes `now`) and does no
//! I/O:
//!
//! * [`table`]: the QRE's accessibility table, the latest measurement (throughput, RTT,
//!   loss, when) of every directed node pair;
//! * [`route`]: the route engine: candidates, metrics, choosing up to three paths with
//!   shared access links taken into account;
//! * [`reroute`]: when a flow moves (threshold with hysteresis; a dead relay at once);
//! * [`dce`]: the DCE's serial probe schedule;
//! * [`flow`]: the FE's relay table (PROVISION, TEARDOWN, where a DATA datagram goes
//!   next) and the source's assignment of paths to session channels;
//! * [`auth`]: per-node keys, the HELLO key exchange, and the trailer that authenticates
//!   every datagram between nodes, hop by hop;
//! * the ALCP messages (UPDATE, PROVISION, TEARDOWN, PING, PONG) are in
//!   [`crate::wire::overlay`].
//!
//! # Where the QRE runs
//!
//! The paper centralizes the QRE on a separate host. Here the engine is a pure function
//! of the table, so it can run anywhere; braid's design runs it on every node for the
//! flows that node sources: every node floods its UPDATEs to all others, the table is
//! only `N²` entries, and a central QRE would be a single point of failure and one more
//! round trip between a relay's death and the reroute.
//!
//! # How a chosen set becomes a stripe
//!
//! Each chosen path is one channel of a braid [`crate::Striper`] (DESIGN: "the overlay is
//! channels through relays"); its SRR quantum is proportional to the path's
//! [`route::Choice::share_bps`], and the destination resequences as on any bond.
//! `braid-sim`'s overlay scenarios do exactly that in virtual time.

pub mod auth;
pub mod dce;
pub mod flow;
pub mod reroute;
pub mod route;
pub mod table;

pub use dce::{Probe, ProbeConfig, ProbeSchedule, ScheduleError};
pub use flow::{assign_slots, FlowError, FlowTable, RelayEntry, Role};
pub use reroute::{Decision, Reason, RerouteConfig, Rerouter};
pub use route::{choose, Choice, Metric, Path, Quality, RouteConfig, MAX_PATHS};
pub use table::{AccessTable, Measurement, TableError};

/// A node of the overlay: `0..=0xFFFE` (`0xFFFF` means "no relay" on the wire).
pub type NodeId = u16;

/// SRR byte quanta for a chosen set: proportional to each path's share, the smallest
/// equal to `max_packet` (every quantum must be at least the largest packet, seed 000's
/// `Quantum_i >= Max`). Shares that are zero or not finite get `max_packet`.
pub fn quanta(set: &[Choice], max_packet: u32) -> Vec<u32> {
    let min = set
        .iter()
        .map(|c| c.share_bps)
        .filter(|s| s.is_finite() && *s > 0.0)
        .fold(f64::INFINITY, f64::min);
    set.iter()
        .map(|c| {
            if !min.is_finite() || !c.share_bps.is_finite() || c.share_bps <= 0.0 {
                return max_packet;
            }
            let q = (c.share_bps / min * max_packet as f64).round();
            q.clamp(max_packet as f64, u32::MAX as f64) as u32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Duration;

    fn choice(share: f64) -> Choice {
        Choice {
            path: Path::direct(0, 1),
            quality: Quality {
                throughput_bps: share,
                delay: Duration::ZERO,
                loss: 0.0,
            },
            share_bps: share,
        }
    }

    #[test]
    fn quanta_follow_shares() {
        let q = quanta(&[choice(6e6), choice(3e6), choice(1.5e6)], 1500);
        assert_eq!(q, [6000, 3000, 1500]);
        assert_eq!(quanta(&[choice(0.0), choice(f64::NAN)], 1500), [1500, 1500]);
        assert!(quanta(&[], 1500).is_empty());
    }
}
