//! Seed 002: the error-control simulation against the paper's §5.2 analysis, on the
//! paper's link (100 Mbit/s, 60 ms round trip, 1024-byte packets, 256-packet segments).

use std::path::Path;

use braid_sim::engine;
use braid_sim::report::seeded;
use braid_sim::scenario;

/// Run `[errctl]` with `window` segments at loss `p` over `packets` packets.
fn run(window: u32, p: f64, packets: u64) -> braid_sim::errctl::ErrCtlResult {
    let text = format!(
        r#"
packets = {packets}
[[channel]]
rate_mbps = 100.0
delay_ms = 30.0
loss = {p}
[traffic]
source = "backlogged"
sizes = "fixed"
bytes = 1024
[errctl]
tolerance = [256, 0, 0]
window = {window}
ack_interval_ms = 15.0
loss_timer_ms = 60.0
deadline_ms = 60000.0
[[run]]
scheduler = "srr"
"#
    );
    let sc = scenario::parse(&text, "test", Path::new("."), "test").unwrap();
    let r = engine::run(&seeded(&sc.jobs[0], 7)).unwrap();
    r.errctl.unwrap()
}

/// Where the analysis' assumptions hold — a window that limits the sender (W ≤ 1 + w_a,
/// here 1 to 3 with w_a = 2.87) or one that never does (W ≥ 2 w_a + 1, here 8), and at
/// most one retransmission per packet (p ≤ 1e-3) — the simulated efficiency is within
/// 5 % of the analysis. 200 segments at p = 1e-3 give about 45 segments with a loss, so
/// the loss-driven part of the efficiency (at most a few tenths) is known to about 15 %
/// of itself: a few percent of the total. The mean delay is within 5 % of D_r up to
/// p = 1e-2. Every packet is delivered, none given up.
#[test]
fn simulation_matches_the_analysis() {
    for (w, p) in [(1, 1e-3), (2, 1e-3), (3, 1e-4), (8, 1e-3)] {
        let r = run(w, p, 51_200);
        let a = r.analysis_efficiency.unwrap();
        let rel = (r.throughput_efficiency - a).abs() / a;
        assert!(
            rel < 0.05,
            "W = {w}, p = {p}: simulated {} vs analysis {a}",
            r.throughput_efficiency
        );
        assert_eq!((r.segments, r.forced, r.violations), (200, 0, 0));
    }
    // 400 segments: the delay's spread comes from the few segments that need two rounds.
    let r = run(8, 1e-2, 102_400);
    let d = r.analysis_mean_delay_ms.unwrap();
    assert!(
        (r.mean_delay_ms - d).abs() / d < 0.05,
        "{} vs {d}",
        r.mean_delay_ms
    );
    // About one retransmission per lost packet (no spurious repeats).
    let lost = 102_400.0 * 1e-2;
    assert!(
        (r.retransmissions as f64 - lost).abs() < 0.25 * lost,
        "{r:?}"
    );
}
