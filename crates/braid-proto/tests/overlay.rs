//! Property tests for the overlay core (seed 003): whatever the accessibility table, the
//! route engine returns valid paths (at most two hops, distinct, loop free, complete
//! fresh measurements), the best one by the metric first, and shares that respect every
//! access capacity; ALCP messages survive emit and parse, and arbitrary bytes never make
//! the parser panic.

use braid_proto::overlay::{
    choose, route, AccessTable, Measurement, Metric, NodeId, Path, RouteConfig,
};
use braid_proto::wire::overlay::{ProvisionPath, Repr, UpdateEntry};
use braid_proto::{Duration, Instant};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Case {
    nodes: usize,
    /// Per directed pair: None (no measurement) or (Mbit/s, rtt ms, loss, age ms).
    hops: Vec<Option<(f64, u64, f64, u64)>>,
    metric: Metric,
    max_paths: usize,
    egress: Vec<f64>,
    ingress: Vec<f64>,
    src: NodeId,
    dst: NodeId,
}

fn case() -> impl Strategy<Value = Case> {
    (3usize..8).prop_flat_map(|n| {
        let hop = prop::option::weighted(0.8, (0.0f64..100.0, 1u64..300, 0.0f64..0.2, 0u64..2_000));
        (
            Just(n),
            prop::collection::vec(hop, n * n),
            prop_oneof![
                Just(Metric::Throughput),
                Just(Metric::Delay),
                Just(Metric::Loss)
            ],
            1usize..=3,
            prop::collection::vec(1.0f64..200.0, 0..=n),
            prop::collection::vec(1.0f64..200.0, 0..=n),
            0..n as NodeId,
            0..n as NodeId,
        )
            .prop_map(
                |(nodes, hops, metric, max_paths, egress, ingress, src, dst)| Case {
                    nodes,
                    hops,
                    metric,
                    max_paths,
                    egress: egress.into_iter().map(|m| m * 1e6).collect(),
                    ingress: ingress.into_iter().map(|m| m * 1e6).collect(),
                    src,
                    dst,
                },
            )
    })
}

const NOW: Instant = Instant::from_micros(10_000_000);
const MAX_AGE: Duration = Duration::from_millis(1_000);

fn build(c: &Case) -> AccessTable {
    let mut t = AccessTable::new(c.nodes);
    for a in 0..c.nodes {
        for b in 0..c.nodes {
            if a == b {
                continue;
            }
            if let Some((mbps, rtt, loss, age)) = c.hops[a * c.nodes + b] {
                t.update(
                    a as NodeId,
                    b as NodeId,
                    Measurement {
                        throughput_bps: mbps * 1e6,
                        rtt: Duration::from_millis(rtt),
                        loss,
                        at: Instant::from_micros(NOW.as_micros() - age * 1000),
                    },
                )
                .unwrap();
            }
        }
    }
    t
}

fn cap(v: &[f64], i: NodeId) -> f64 {
    v.get(i as usize).copied().unwrap_or(f64::INFINITY)
}

/// A path's throughput on its own, capped by the access links it uses.
fn alone(c: &Case, p: &Path, q: &route::Quality) -> f64 {
    p.hops().iter().fold(q.throughput_bps, |s, &(a, b)| {
        s.min(cap(&c.egress, a)).min(cap(&c.ingress, b))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn chosen_paths_are_valid_and_best_first(c in case()) {
        let t = build(&c);
        let cfg = RouteConfig {
            metric: c.metric,
            max_paths: c.max_paths,
            max_age: MAX_AGE,
            egress_bps: c.egress.clone(),
            ingress_bps: c.ingress.clone(),
            min_share_bps: 1.0,
        };
        let got = choose(&t, c.src, c.dst, NOW, &cfg);
        prop_assert!(got.len() <= c.max_paths);
        if c.src == c.dst {
            prop_assert!(got.is_empty());
            return Ok(());
        }
        for (i, ch) in got.iter().enumerate() {
            let p = ch.path;
            prop_assert_eq!((p.src, p.dst), (c.src, c.dst));
            prop_assert!(p.hop_count() <= 2);
            prop_assert!(p.is_loop_free());
            prop_assert!(got[..i].iter().all(|o| o.path != p), "duplicate {}", p);
            for (a, b) in p.hops() {
                prop_assert!(t.fresh(a, b, NOW, MAX_AGE).is_some());
            }
            prop_assert!(ch.share_bps >= 1.0);
            prop_assert!(ch.share_bps <= ch.quality.throughput_bps + 1e-6);
        }
        // Shares never exceed an access link.
        let total: f64 = got.iter().map(|c| c.share_bps).sum();
        prop_assert!(total <= cap(&c.egress, c.src) * (1.0 + 1e-9));
        prop_assert!(total <= cap(&c.ingress, c.dst) * (1.0 + 1e-9));
        // The first is the best of every usable candidate by the metric.
        let cands = route::candidates(&t, c.src, c.dst, NOW, MAX_AGE);
        let usable: Vec<_> = cands
            .iter()
            .filter(|(p, q)| alone(&c, p, q) >= 1.0)
            .collect();
        prop_assert_eq!(got.is_empty(), usable.is_empty());
        if let Some(first) = got.first() {
            for (p, q) in &usable {
                match c.metric {
                    Metric::Throughput => prop_assert!(first.share_bps >= alone(&c, p, q)),
                    Metric::Delay => prop_assert!(first.quality.delay <= q.delay),
                    Metric::Loss => prop_assert!(first.quality.loss <= q.loss),
                }
            }
        }
    }

    #[test]
    fn alcp_roundtrip(
        origin in 0u16..0xFFFF,
        seq in any::<u32>(),
        entries in prop::collection::vec(
            (0u16..0xFFFF, any::<u32>(), any::<u32>(), 0u32..=1_000_000, any::<u32>()), 0..40),
        flow in any::<u32>(),
        relays in prop::collection::btree_set(0u16..20, 0..3),
        direct in any::<bool>(),
        weights in prop::collection::vec(1u32..100_000, 4),
    ) {
        let entries: Vec<UpdateEntry> = entries
            .into_iter()
            .filter(|e| e.0 != origin)
            .map(|(peer, throughput_kbps, rtt_us, loss_ppm, age_ms)| UpdateEntry {
                peer, throughput_kbps, rtt_us, loss_ppm, age_ms,
            })
            .collect();
        let u = Repr::Update { origin, seq, entries };
        let bytes = u.to_vec().unwrap();
        prop_assert_eq!(Repr::parse(&bytes), Ok(u));

        let mut paths: Vec<ProvisionPath> = relays
            .iter()
            .enumerate()
            .map(|(i, &r)| ProvisionPath { relay: Some(r + 100), slot: i as u8 % 3, weight: 0 })
            .collect();
        if direct || paths.is_empty() {
            paths.insert(0, ProvisionPath { relay: None, slot: 0, weight: 0 });
        }
        paths.truncate(3);
        for (i, p) in paths.iter_mut().enumerate() {
            p.slot = (2 - i) as u8;
        }
        for (p, w) in paths.iter_mut().zip(&weights) {
            p.weight = *w;
        }
        let pr = Repr::Provision { flow, src: 1, dst: 2, lifetime_ms: seq, paths };
        let bytes = pr.to_vec().unwrap();
        prop_assert_eq!(Repr::parse(&bytes), Ok(pr));
    }

    #[test]
    fn alcp_parse_never_panics(mut bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        // Often a plausible header, so the body checks run too.
        if bytes.len() >= 4 && bytes[0] & 1 == 0 {
            bytes[0] = 0xB0;
            bytes[1] = 1;
            bytes[2] = 1 + bytes[2] % 3;
            bytes[3] = 0;
        }
        if let Ok(r) = Repr::parse(&bytes) {
            // Whatever parses emits back to the same bytes.
            prop_assert_eq!(r.to_vec().unwrap(), bytes);
        }
    }

    #[test]
    fn hello_and_trailer_checks_never_panic(mut bytes in prop::collection::vec(any::<u8>(), 0..200), ids in (0u16..4, 0u16..4)) {
        use braid_proto::overlay::auth::{AuthError, NodeAuth, HELLO_LEN};
        // Node 1 with members 0, 2, 3 (fixed keys); often a HELLO's length and header,
        // or a plausible trailer naming a member.
        let key = |s: u8| -> [u8; 32] { core::array::from_fn(|i| s.wrapping_mul(37) ^ (i as u8 * 11 + 1)) };
        let pk = |s: u8| NodeAuth::new(9, &key(s), &[], [7; 32]).unwrap().public_key();
        let mut me = NodeAuth::new(1, &key(1), &[(0, pk(0)), (2, pk(2)), (3, pk(3))], [5; 32]).unwrap();
        if bytes.len() > 3 && bytes[0] % 3 == 0 {
            bytes.resize(HELLO_LEN, 0);
            let ready = bytes[3] & 1;
            bytes[..4].copy_from_slice(&[0xB0, 1, 7, ready]);
            bytes[4..6].copy_from_slice(&ids.0.to_be_bytes());
            bytes[6..8].copy_from_slice(&ids.1.to_be_bytes());
        } else if bytes.len() > 26 && bytes[0] % 3 == 1 {
            let at = bytes.len() - 26;
            bytes[at..at + 2].copy_from_slice(&ids.0.to_be_bytes());
        }
        if NodeAuth::is_hello(&bytes) {
            // Nothing made without the pair's static secret is taken.
            prop_assert!(me.on_hello(braid_proto::Instant::ZERO, &bytes).is_err());
        }
        // No keys yet with anyone: nothing opens.
        prop_assert!(me.open(&bytes).is_err());
        if let Err(AuthError::NoKeys(id)) = me.open(&bytes) {
            prop_assert!(id == 0 || id == 2 || id == 3);
        }
    }
}
