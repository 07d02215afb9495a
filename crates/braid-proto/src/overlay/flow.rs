//! The forwarding engine's state (FE) and the source's slot assignment.
//!
//! A flow `src -> dst` is striped by one braid session whose channels are *slots*
//! (at most [`MAX_PATHS`]); each slot carries one overlay path, direct or through a
//! relay. The source tells every node on the flow's paths with an authenticated
//! PROVISION which path is on which slot; a relay keeps a [`FlowTable`] entry and
//! forwards the flow's DATA datagrams of that slot, in both directions, between the two
//! ends and nobody else. PROVISIONs are soft state: the source repeats them, an entry
//! not refreshed within its lifetime expires, a TEARDOWN removes it at once.
//!
//! When the route engine moves the flow, [`assign_slots`] keeps every path that stays
//! on its slot and puts new paths on freed slots, so the session keeps running: the
//! channel whose path changed goes down and comes back up over its new path.

use crate::time::{Duration, Instant};
use crate::wire::overlay::{DataHeader, ProvisionPath, Repr, MAX_PROVISION_PATHS};

use super::route::{Choice, Path, MAX_PATHS};
use super::{quanta, NodeId};

/// One provisioned flow as a relay sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RelayEntry {
    /// Flow id.
    pub flow: u32,
    /// Source node.
    pub src: NodeId,
    /// Destination node.
    pub dst: NodeId,
    /// The slot this relay carries.
    pub slot: u8,
    /// When the entry lapses unless refreshed; `None`: until TEARDOWN.
    pub expires: Option<Instant>,
}

/// What a PROVISION means for the node that received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// This node relays slot `slot` of the flow.
    Relay {
        /// The slot.
        slot: u8,
    },
    /// This node is the flow's destination; the paths by slot.
    Destination {
        /// `(slot, relay)` of every path.
        paths: Vec<(u8, Option<NodeId>)>,
    },
    /// This node is on none of the flow's paths (any entry it had is gone).
    NotOnPath,
}

/// Why a PROVISION or TEARDOWN was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FlowError {
    /// Not a PROVISION or TEARDOWN.
    #[error("not a PROVISION or TEARDOWN")]
    NotFlowControl,
    /// Only a flow's source may provision or tear it down.
    #[error("node {sender} provisioned a flow whose source is {src}")]
    NotSource {
        /// Who sent it.
        sender: NodeId,
        /// The flow's source.
        src: NodeId,
    },
    /// The relay table is full.
    #[error("relay table full ({0} flows)")]
    Full(usize),
}

/// The flows a node relays.
#[derive(Clone, Debug)]
pub struct FlowTable {
    me: NodeId,
    max: usize,
    entries: Vec<RelayEntry>,
}

impl FlowTable {
    /// An empty table of node `me` that relays at most `max` flows.
    pub fn new(me: NodeId, max: usize) -> FlowTable {
        FlowTable {
            me,
            max,
            entries: Vec::new(),
        }
    }

    /// The flows relayed now.
    pub fn entries(&self) -> &[RelayEntry] {
        &self.entries
    }

    /// Take an authenticated PROVISION or TEARDOWN from node `sender` (the
    /// authentication trailer's sender) at `now`.
    pub fn handle(&mut self, now: Instant, sender: NodeId, msg: &Repr) -> Result<Role, FlowError> {
        match msg {
            Repr::Provision {
                flow,
                src,
                dst,
                lifetime_ms,
                paths,
            } => {
                if sender != *src {
                    return Err(FlowError::NotSource { sender, src: *src });
                }
                self.remove(*flow, *src);
                if *dst == self.me {
                    return Ok(Role::Destination {
                        paths: paths.iter().map(|p| (p.slot, p.relay)).collect(),
                    });
                }
                let Some(p) = paths.iter().find(|p| p.relay == Some(self.me)) else {
                    return Ok(Role::NotOnPath);
                };
                if self.entries.len() >= self.max {
                    return Err(FlowError::Full(self.max));
                }
                let expires = (*lifetime_ms > 0)
                    .then(|| now + Duration::from_millis(u64::from(*lifetime_ms)));
                self.entries.push(RelayEntry {
                    flow: *flow,
                    src: *src,
                    dst: *dst,
                    slot: p.slot,
                    expires,
                });
                Ok(Role::Relay { slot: p.slot })
            }
            Repr::Teardown { flow, src, .. } => {
                if sender != *src {
                    return Err(FlowError::NotSource { sender, src: *src });
                }
                self.remove(*flow, *src);
                Ok(Role::NotOnPath)
            }
            _ => Err(FlowError::NotFlowControl),
        }
    }

    fn remove(&mut self, flow: u32, src: NodeId) {
        self.entries.retain(|e| !(e.flow == flow && e.src == src));
    }

    /// Drop entries whose lifetime has passed; returns how many.
    pub fn expire(&mut self, now: Instant) -> usize {
        let before = self.entries.len();
        self.entries.retain(|e| e.expires.is_none_or(|t| now < t));
        before - self.entries.len()
    }

    /// Where a DATA datagram with header `h` that came from node `from` goes next:
    /// the flow's destination if it came from the source on a slot this node relays,
    /// the source if it came back from the destination; `None` (drop) otherwise.
    pub fn next_hop(&self, now: Instant, from: NodeId, h: &DataHeader) -> Option<NodeId> {
        let e = self.entries.iter().find(|e| {
            e.flow == h.flow
                && e.slot == h.slot
                && e.expires.is_none_or(|t| now < t)
                && if h.reverse {
                    e.dst == from
                } else {
                    e.src == from
                }
        })?;
        Some(if h.reverse { e.src } else { e.dst })
    }
}

/// Put the chosen paths on `slots` session channels: a path already on a slot keeps
/// it; the others take free slots, best first; what does not fit is left out. Returns
/// the path of every slot (`None`: unused).
pub fn assign_slots(
    current: &[Option<Path>],
    chosen: &[Choice],
    slots: usize,
) -> Vec<Option<Choice>> {
    let slots = slots.min(MAX_PATHS);
    let mut out: Vec<Option<Choice>> = vec![None; slots];
    let mut rest = Vec::new();
    for c in chosen {
        match current.iter().take(slots).position(|p| *p == Some(c.path)) {
            Some(i) if out[i].is_none() => out[i] = Some(*c),
            _ => rest.push(*c),
        }
    }
    for c in rest {
        if let Some(i) = out.iter().position(|o| o.is_none()) {
            out[i] = Some(c);
        }
    }
    out
}

/// The PROVISION of flow `flow` for a slot assignment; weights are SRR quanta from the
/// paths' shares ([`quanta`]). `None` if no slot is used.
pub fn provision(
    flow: u32,
    src: NodeId,
    dst: NodeId,
    lifetime: Duration,
    slots: &[Option<Choice>],
    max_packet: u32,
) -> Option<Repr> {
    let used: Vec<(usize, Choice)> = slots
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.map(|c| (i, c)))
        .take(MAX_PROVISION_PATHS)
        .collect();
    if used.is_empty() {
        return None;
    }
    let set: Vec<Choice> = used.iter().map(|(_, c)| *c).collect();
    let q = quanta(&set, max_packet.max(1));
    Some(Repr::Provision {
        flow,
        src,
        dst,
        lifetime_ms: (lifetime.as_micros() / 1000).min(u32::MAX as u64) as u32,
        paths: used
            .iter()
            .zip(q)
            .map(|((i, c), w)| ProvisionPath {
                relay: c.path.relay,
                slot: *i as u8,
                weight: w,
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::route::Quality;
    use super::*;

    fn choice(p: Path, mbps: f64) -> Choice {
        Choice {
            path: p,
            quality: Quality {
                throughput_bps: mbps * 1e6,
                delay: Duration::ZERO,
                loss: 0.0,
            },
            share_bps: mbps * 1e6,
        }
    }

    fn prov(flow: u32, paths: &[(Option<NodeId>, u8)], lifetime_ms: u32) -> Repr {
        Repr::Provision {
            flow,
            src: 0,
            dst: 4,
            lifetime_ms,
            paths: paths
                .iter()
                .map(|&(relay, slot)| ProvisionPath {
                    relay,
                    slot,
                    weight: 1500,
                })
                .collect(),
        }
    }

    fn h(flow: u32, slot: u8, reverse: bool) -> DataHeader {
        DataHeader {
            flow,
            slot,
            reverse,
        }
    }

    #[test]
    fn relay_forwards_only_its_slot_between_the_ends() {
        let mut t = FlowTable::new(2, 8);
        let now = Instant::ZERO;
        let p = prov(9, &[(Some(1), 0), (Some(2), 1), (None, 2)], 0);
        assert_eq!(t.handle(now, 0, &p), Ok(Role::Relay { slot: 1 }));
        assert_eq!(t.next_hop(now, 0, &h(9, 1, false)), Some(4));
        assert_eq!(t.next_hop(now, 4, &h(9, 1, true)), Some(0));
        // Wrong slot, wrong flow, wrong sender for the direction, a stranger.
        assert_eq!(t.next_hop(now, 0, &h(9, 0, false)), None);
        assert_eq!(t.next_hop(now, 0, &h(8, 1, false)), None);
        assert_eq!(t.next_hop(now, 4, &h(9, 1, false)), None);
        assert_eq!(t.next_hop(now, 3, &h(9, 1, true)), None);
        // Only the source may provision or tear down.
        assert_eq!(
            t.handle(
                now,
                3,
                &Repr::Teardown {
                    flow: 9,
                    src: 0,
                    dst: 4
                }
            ),
            Err(FlowError::NotSource { sender: 3, src: 0 })
        );
        assert_eq!(t.entries().len(), 1);
        assert_eq!(
            t.handle(
                now,
                0,
                &Repr::Teardown {
                    flow: 9,
                    src: 0,
                    dst: 4
                }
            ),
            Ok(Role::NotOnPath)
        );
        assert_eq!(t.next_hop(now, 0, &h(9, 1, false)), None);
    }

    #[test]
    fn reprovision_moves_and_lifetime_expires() {
        let mut t = FlowTable::new(2, 8);
        let ms = |v: u64| Instant::from_micros(v * 1000);
        t.handle(ms(0), 0, &prov(9, &[(Some(2), 1)], 500)).unwrap();
        // Moved to slot 0: the old slot no longer forwards.
        t.handle(ms(100), 0, &prov(9, &[(Some(2), 0)], 500))
            .unwrap();
        assert_eq!(t.entries().len(), 1);
        assert_eq!(t.next_hop(ms(100), 0, &h(9, 1, false)), None);
        assert_eq!(t.next_hop(ms(100), 0, &h(9, 0, false)), Some(4));
        // Not refreshed: gone after 500 ms.
        assert_eq!(t.next_hop(ms(601), 0, &h(9, 0, false)), None);
        assert_eq!(t.expire(ms(601)), 1);
        // A PROVISION without this node removes it.
        t.handle(ms(700), 0, &prov(9, &[(Some(2), 0)], 0)).unwrap();
        assert_eq!(
            t.handle(ms(800), 0, &prov(9, &[(Some(1), 0)], 0)),
            Ok(Role::NotOnPath)
        );
        assert!(t.entries().is_empty());
        // The destination learns the slots.
        let mut d = FlowTable::new(4, 8);
        assert_eq!(
            d.handle(ms(0), 0, &prov(9, &[(Some(1), 2), (None, 0)], 0)),
            Ok(Role::Destination {
                paths: vec![(2, Some(1)), (0, None)]
            })
        );
        // Full.
        let mut f = FlowTable::new(2, 1);
        f.handle(ms(0), 0, &prov(1, &[(Some(2), 0)], 0)).unwrap();
        assert_eq!(
            f.handle(ms(0), 0, &prov(2, &[(Some(2), 0)], 0)),
            Err(FlowError::Full(1))
        );
    }

    #[test]
    fn slots_keep_surviving_paths() {
        let a = choice(Path::via(0, 1, 4), 6.0);
        let b = choice(Path::via(0, 2, 4), 5.0);
        let c = choice(Path::via(0, 3, 4), 4.0);
        let d = choice(Path::direct(0, 4), 2.0);
        let first = assign_slots(&[], &[a, b, c], 3);
        assert_eq!(first, vec![Some(a), Some(b), Some(c)]);
        // Relay 2 dies: the direct path takes its slot, the others stay.
        let cur: Vec<Option<Path>> = first.iter().map(|o| o.map(|c| c.path)).collect();
        let next = assign_slots(&cur, &[a, c, d], 3);
        assert_eq!(next, vec![Some(a), Some(d), Some(c)]);
        // Fewer paths than slots: a slot stays empty; more: the worst is left out.
        assert_eq!(assign_slots(&cur, &[c], 3), vec![None, None, Some(c)]);
        assert_eq!(assign_slots(&[], &[a, b, c], 2), vec![Some(a), Some(b)]);
        let p = provision(5, 0, 4, Duration::from_millis(1000), &next, 1400).unwrap();
        match p {
            Repr::Provision {
                paths, lifetime_ms, ..
            } => {
                assert_eq!(lifetime_ms, 1000);
                let got: Vec<(Option<NodeId>, u8, u32)> =
                    paths.iter().map(|p| (p.relay, p.slot, p.weight)).collect();
                assert_eq!(
                    got,
                    vec![(Some(1), 0, 4200), (None, 1, 1400), (Some(3), 2, 2800)]
                );
            }
            o => panic!("{o:?}"),
        }
        assert!(p_valid(&next));
        assert_eq!(
            provision(5, 0, 4, Duration::ZERO, &[None, None], 1400),
            None
        );
    }

    fn p_valid(slots: &[Option<Choice>]) -> bool {
        provision(1, 0, 4, Duration::ZERO, slots, 1400)
            .and_then(|r| r.to_vec().ok())
            .is_some()
    }
}
