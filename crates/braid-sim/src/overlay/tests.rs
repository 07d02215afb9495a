use super::*;

/// Three nodes: A -> C direct is slow (2 Mbit/s), through B it is fast (8 and 6).
const TRIANGLE: &str = r#"
kind = "overlay"
nodes = ["A", "B", "C"]
packet_bytes = 1000

[[link]]
from = "A"
to = "C"
mbps = 2
delay_ms = 20
reverse_mbps = 2

[[link]]
from = "A"
to = "B"
mbps = 8
delay_ms = 10
reverse_mbps = 8

[[link]]
from = "B"
to = "C"
mbps = 6
delay_ms = 10
reverse_mbps = 6
"#;

fn sc(extra: &str) -> Result<OverlayScenario, crate::scenario::ScenarioError> {
    parse(&format!("{TRIANGLE}\n{extra}"), "t.toml", "t")
}

#[test]
fn bad_files_get_clear_errors() {
    let cases = [
        ("[gain]\nrounds = 0", "gain.rounds"),
        ("[gain]\nwat = 1", "gain.wat"),
        ("[flow]\nsrc = \"A\"\ndst = \"Z\"\nstart_s = 1\nend_s = 2", "flow.dst"),
        ("[flow]\nsrc = \"A\"\ndst = \"A\"\nstart_s = 1\nend_s = 2", "flow.dst"),
        ("[flow]\nsrc = \"A\"\ndst = \"C\"\nstart_s = 3\nend_s = 2", "flow.end_s"),
        (
            "[gain]\n[control]\nslot_ms = 10\nprobe_ms = 20",
            "control.probe_ms",
        ),
        ("[gain]\n[[event]]\nat_s = 1\nkill = \"B\"", "event"),
        (
            "[flow]\nsrc = \"A\"\ndst = \"C\"\nstart_s = 1\nend_s = 2\n[[event]]\nat_s = 1\nkill = \"B\"\nrevive = \"B\"",
            "event[0].kill",
        ),
        (
            "[flow]\nsrc = \"A\"\ndst = \"C\"\nstart_s = 1\nend_s = 2\n[[event]]\nat_s = 1\nfrom = \"A\"\nto = \"B\"",
            "event[0].mbps",
        ),
        ("", "gain"),
        ("[gain]\n[[link]]\nfrom = \"A\"\nto = \"C\"\nmbps = 1\ndelay_ms = 1", "link[3].from"),
        ("[gain]\n[egress_mbps]\nQ = 5", "egress_mbps.Q"),
    ];
    for (extra, key) in cases {
        let e = sc(extra).expect_err(extra);
        assert_eq!(e.key.as_deref(), Some(key), "{extra}: {e}");
    }
    let e = parse(
        &format!("metric = \"jitter\"\n{TRIANGLE}\n[gain]"),
        "t.toml",
        "t",
    )
    .unwrap_err();
    assert_eq!(e.key.as_deref(), Some("metric"), "{e}");
    // A missing link names the pair.
    let e = parse(
        "kind = \"overlay\"\nnodes = [\"A\", \"B\", \"C\"]\n[gain]\n[[link]]\nfrom = \"A\"\nto = \"B\"\nmbps = 1\ndelay_ms = 1",
        "t.toml",
        "t",
    )
    .unwrap_err();
    assert!(e.message.contains("B -> A"), "{e}");
    assert!(parse("kind = \"credit\"", "t.toml", "t").is_err());
    assert!(parse("not toml [", "t.toml", "t").is_err());
}

#[test]
fn striping_over_the_relay_beats_the_slow_direct_path() {
    let s = sc("[gain]\nrounds = 1\nflow_s = 0.5").unwrap();
    let rep = run_scenario(&s, 1).unwrap();
    let g = rep.gain.unwrap();
    assert_eq!(g.two.len(), 6);
    let ac = g.two.iter().find(|f| f.src == "A" && f.dst == "C").unwrap();
    assert_eq!(ac.paths, ["A->B->C", "A->C"]);
    // Direct 2 Mbit/s; over both paths the stripe should carry close to 6 + 2.
    assert!((1.8..2.05).contains(&ac.direct_mbps), "{ac:?}");
    assert!(ac.striped_mbps > 7.0 && ac.striped_mbps < 8.05, "{ac:?}");
    assert!(ac.gain_percent > 250.0, "{ac:?}");
    // A -> B: direct is the best path (8); the relay path adds min(2, 6) = 2.
    let ab = g.two.iter().find(|f| f.src == "A" && f.dst == "B").unwrap();
    assert_eq!(ab.paths[0], "A->B");
    assert!(ab.gain_percent > 15.0 && ab.gain_percent < 30.0, "{ab:?}");
    // With three nodes there are only two paths per pair.
    assert!(g.three.iter().all(|f| f.paths.len() == 2));
    assert_eq!(g.summary_two.cdf.len(), 6);
    assert!(g.summary_two.cdf.windows(2).all(|w| w[0].0 <= w[1].0));
}

#[test]
fn a_wrong_weight_costs_the_stripe() {
    // The measurements say A->C carries 2 Mbit/s but the reroute block finds it at a
    // fraction of that: the SRR weights send too much to it and the stripe falls short
    // of what the paths could carry together.
    let s = sc("[gain]\nrounds = 1\nflow_s = 0.5\nnoise_percent = 0").unwrap();
    let mut slow = s.clone();
    // Only the reroute-block network changes: emulate it by a huge variation on one
    // run and compare the stripe with its estimate.
    slow.gain = Some(GainSpec {
        variation: 0.8,
        ..s.gain.unwrap()
    });
    let rep = run_scenario(&slow, 3).unwrap();
    let g = rep.gain.unwrap();
    let worst = g
        .two
        .iter()
        .map(|f| f.striped_mbps / f.estimated_mbps)
        .fold(f64::INFINITY, f64::min);
    assert!(worst < 0.9, "no flow fell short of its estimate: {worst}");
}

#[test]
fn a_dead_relay_is_routed_around_within_a_second() {
    let s = sc("[flow]\nsrc = \"A\"\ndst = \"C\"\nstart_s = 1\nend_s = 4\n\
         [[event]]\nat_s = 2\nkill = \"B\"")
    .unwrap();
    let rep = run_scenario(&s, 1).unwrap();
    let f = rep.flow.unwrap();
    assert_eq!(f.reroutes[0].reason, "initial");
    assert_eq!(f.reroutes[0].paths, ["A->B->C", "A->C"]);
    let ms = f.routed_around_ms[0].expect("never routed around");
    assert!(ms > 0.0 && ms < 1000.0, "{ms} ms");
    let moved = f
        .reroutes
        .iter()
        .find(|r| r.reason.starts_with("dead"))
        .unwrap();
    assert_eq!(moved.paths, ["A->C"]);
    // Before the kill both paths carry data; between the kill and the reroute the
    // stripe loses the dead path's share and more; after it, the direct path alone.
    let seg = |t: f64| {
        f.segments
            .iter()
            .find(|g| g.from_s <= t && t < g.to_s)
            .unwrap()
    };
    assert!(seg(1.5).goodput_mbps > 6.5, "{:?}", seg(1.5));
    assert_eq!(seg(2.0 + ms / 2000.0).dead_paths, 1);
    assert!(seg(2.0 + ms / 2000.0).goodput_mbps < 2.0);
    let last = f.segments.last().unwrap();
    assert!((1.5..2.05).contains(&last.goodput_mbps), "{last:?}");
    assert!(f.updates > 0 && f.probes > 0 && f.pings > 0);
}

#[test]
fn a_better_path_needs_consecutive_wins() {
    // A->C over one path: direct (2) until the relay path becomes far better at 2 s;
    // the move comes after `consecutive` evaluations of the new measurements.
    let s = sc(
        "[flow]\nsrc = \"A\"\ndst = \"C\"\nstart_s = 1\nend_s = 5\nmax_paths = 1\n\
         [control]\nconsecutive = 4\neval_ms = 50\n\
         [[event]]\nat_s = 0\nfrom = \"B\"\nto = \"C\"\nmbps = 1\n\
         [[event]]\nat_s = 2\nfrom = \"B\"\nto = \"C\"\nmbps = 6",
    )
    .unwrap();
    let f = run_scenario(&s, 1).unwrap().flow.unwrap();
    assert_eq!(f.reroutes[0].paths, ["A->C"]);
    let better = f.reroutes.iter().find(|r| r.reason == "better").unwrap();
    assert_eq!(better.paths, ["A->B->C"]);
    // Not before the B->C probe that sees the change, plus 3 more evaluations.
    assert!(better.at_s > 2.0 + 0.15, "{better:?}");
}

#[test]
fn file_kind_detection() {
    let dir = std::env::temp_dir().join(format!("braid-overlay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("o.toml");
    std::fs::write(&p, TRIANGLE).unwrap();
    assert!(is_overlay_file(&p));
    std::fs::write(&p, "kind = \"credit\"").unwrap();
    assert!(!is_overlay_file(&p));
    assert!(!is_overlay_file(&dir.join("missing.toml")));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn same_seed_same_report() {
    let s =
        sc("[gain]\nrounds = 2\nflow_s = 0.2\nvariation_percent = 30\nnoise_percent = 10").unwrap();
    let a = run_scenario(&s, 7).unwrap();
    let b = run_scenario(&s, 7).unwrap();
    assert_eq!(a, b);
    assert_ne!(a, run_scenario(&s, 8).unwrap());
}
