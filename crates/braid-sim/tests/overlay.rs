//! The shipped overlay scenarios (seed 003): they load, run, and show what
//! docs/reproducing.md says they show.

use std::path::{Path, PathBuf};

use braid_sim::overlay::{self, EventKind};

fn file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scenarios/overlay")
        .join(name)
}

#[test]
fn shipped_overlay_scenarios_load() {
    let mut n = 0;
    for e in std::fs::read_dir(file("")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            assert!(overlay::is_overlay_file(&p), "{}", p.display());
            overlay::load(&p).unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
    }
    assert!(
        n >= 3,
        "expected mesh5, mesh5-static and relay-dies, found {n}"
    );
}

#[test]
fn with_exact_weights_the_stripe_carries_what_its_paths_carry() {
    // mesh5-static: nothing moves between measuring and striping, so SRR's weights are
    // right and the run should deliver close to the sum of the chosen paths' goodputs.
    let sc = overlay::load(&file("mesh5-static.toml")).unwrap();
    let rep = overlay::run_scenario(&sc, 1).unwrap();
    let g = rep.gain.unwrap();
    for f in g.two.iter().chain(&g.three) {
        let r = f.striped_mbps / f.estimated_mbps;
        assert!((0.93..=1.01).contains(&r), "{f:?}: {r}");
        // Never worse than the direct path alone (up to ramp-up and loss noise).
        assert!(f.striped_mbps > 0.97 * f.direct_mbps, "{f:?}");
    }
}

#[test]
fn a_dead_relay_is_routed_around_within_a_second_whatever_the_phase() {
    let base = overlay::load(&file("relay-dies.toml")).unwrap();
    for phase_ms in [0, 17, 33, 50, 71, 99] {
        let mut sc = base.clone();
        for e in &mut sc.events {
            if matches!(e.what, EventKind::Kill(_)) {
                e.at_s += phase_ms as f64 / 1000.0;
            }
        }
        let f = overlay::run_scenario(&sc, 1).unwrap().flow.unwrap();
        let ms = f.routed_around_ms[0].expect("never routed around");
        assert!(ms > 0.0 && ms < 1000.0, "phase {phase_ms} ms: {ms} ms");
        // The last segment is back on the best set, through the revived relay.
        let last = f.segments.last().unwrap();
        assert!(last.paths.iter().any(|p| p.contains("UCLA")), "{last:?}");
        assert_eq!(last.dead_paths, 0);
    }
}
