//! Session runs: the whole session machine at both ends, failover in virtual time.

use std::path::Path;

use braid_sim::report::run_scenario;
use braid_sim::scenario::{self, Scenario};

mod common;
use common::{parse, parse_err, run};

fn link_down() -> Scenario {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/failover/link-down.toml");
    scenario::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn link_down_fails_over_and_rejoins_without_duplicates() {
    let r = run(&link_down(), 1);
    assert_eq!(r.runs.len(), 2);
    for run in &r.runs {
        let s = run.session.as_ref().expect("a session run");
        assert_eq!(s.failover_ms.len(), 1);
        let f = s.failover_ms[0].expect("the sender must leave the dead channel");
        // dead_after 300 ms, noticed at a heartbeat (50 ms), no later than one more.
        assert!(
            (300.0..=400.0).contains(&f),
            "{}: failover {f} ms",
            run.label
        );
        let j = s.rejoin_ms[0].expect("the channel must carry data again");
        // rejoin_after 150 ms of hearing, then hellos and an epoch switch (round trips
        // of at most 60 ms).
        assert!((150.0..=350.0).contains(&j), "{}: rejoin {j} ms", run.label);
        assert_eq!(s.duplicates, 0, "{}", run.label);
        assert_eq!(s.epoch_changes, 2, "{}", run.label);
        assert_eq!(run.out_of_order, 0, "{}", run.label);
        // Only what was in flight on the dead channel before failover is lost: at most
        // a third of 24 Mbit/s of 1000-byte packets for the failover time.
        let bound = (f / 1000.0 * 3000.0 / 3.0 * 1.2) as u64;
        assert!(
            run.packets_lost <= bound,
            "{}: lost {} > {bound}",
            run.label,
            run.packets_lost
        );
        // The other two channels carry the whole offered load while one is down.
        assert!(
            run.goodput_bps > 23.0e6,
            "{}: {}",
            run.label,
            run.goodput_bps
        );
    }
    // Bit for bit the same with the same seed.
    let again = run(&link_down(), 1);
    assert_eq!(r.to_json(), again.to_json());
}

#[test]
fn json_has_the_session_keys_only_for_session_runs() {
    let j = run(&link_down(), 1).to_json();
    for k in ["\"failover_ms\"", "\"rejoin_ms\"", "\"duplicates\":0"] {
        assert!(j.contains(k), "{k} missing");
    }
    let plain = parse(
        r#"
duration_s = 0.2
[[channel]]
rate_mbps = 5
[traffic]
source = "cbr"
rate_mbps = 1
[[run]]
scheduler = "srr"
"#,
    );
    let j = run(&plain, 1).to_json();
    assert!(!j.contains("failover_ms"), "{j}");
}

#[test]
fn short_dead_after_fails_over_sooner() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/failover/link-down.toml"),
    )
    .unwrap()
    .replace("dead_after = \"300ms\"", "dead_after = \"120ms\"");
    let r = run(&parse(&text), 1);
    let f = r.runs[0].session.as_ref().unwrap().failover_ms[0].unwrap();
    assert!((120.0..=200.0).contains(&f), "failover {f} ms");
}

#[test]
fn session_errors_name_the_key() {
    let base = r#"
duration_s = 1
[[channel]]
rate_mbps = 5
[traffic]
source = "cbr"
rate_mbps = 1
[[run]]
scheduler = "srr"
"#;
    let e = parse_err(&format!("{base}[session]\nheartbeat = \"50 parsecs\"\n"));
    assert!(e.contains("session.heartbeat"), "{e}");
    let e = parse_err(&format!("{base}[session]\nmode = \"seq\"\n"));
    assert!(e.contains("session.mode") && e.contains("[[run]]"), "{e}");
    let e = parse_err(&format!("{base}[session]\nhartbeat = \"50ms\"\n"));
    assert!(e.contains("unknown field `hartbeat`"), "{e}");
    let e = parse_err(&format!(
        "{base}[session]\nheartbeat = \"200ms\"\ndead_after = \"300ms\"\n"
    ));
    assert!(e.contains("twice the heartbeat"), "{e}");
    let backlogged = base.replace("source = \"cbr\"\nrate_mbps = 1", "source = \"backlogged\"");
    let sc = parse(&format!("{backlogged}[session]\n"));
    let e = run_scenario(&sc, 1, 1, &|_, _| {}).unwrap_err().to_string();
    assert!(e.contains("timed traffic"), "{e}");
}

/// Adaptive weights: with the weights the wrong way round, the static bond carries
/// about half the stream and loses the rest on the overloaded link; the adaptive one
/// finds the right quanta from the peer's feedback within a second and carries nearly
/// what the right static weights carry.
#[test]
fn adaptive_weights_recover_from_weights_the_wrong_way_round() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/adaptive/wrong-weights.toml");
    let sc = scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let r = run(&sc, 1);
    let by = |label: &str| {
        r.runs
            .iter()
            .find(|x| x.label == label)
            .unwrap_or_else(|| panic!("no run {label}"))
    };
    let right = by("right weights, static");
    let wrong = by("static logical");
    assert_eq!(right.packets_lost, 0);
    assert!(
        wrong.packets_lost * 3 > wrong.packets_sent,
        "{}",
        wrong.packets_lost
    );
    for label in ["adaptive logical", "adaptive seq"] {
        let a = by(label);
        let s = a.session.as_ref().unwrap();
        assert!(s.quanta_changes >= 1, "{label}");
        // The slow link ends with the smallest quantum, the fast one with the largest.
        let q = &s.final_quanta;
        assert!(q[0] > q[1] && q[1] > q[2], "{label}: {q:?}");
        // Loss only while it converged: at most a second of the 62 Mbit/s excess.
        let excess_per_s = (62e6 / 8.0 / 1200.0) as u64;
        assert!(
            a.packets_lost < excess_per_s,
            "{label}: lost {}",
            a.packets_lost
        );
        assert!(
            a.goodput_bps > 0.95 * right.goodput_bps,
            "{label}: {} vs {}",
            a.goodput_bps,
            right.goodput_bps
        );
    }
}

/// Adaptive weights must not take a failover for congestion: what an outage lost and
/// the silence of a dead channel are not the channel's capacity. The link-down scenario
/// with adaptive weights keeps its quanta and fails over and rejoins as without.
#[test]
fn adaptive_weights_do_not_react_to_a_failover() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/failover/link-down.toml");
    let text = std::fs::read_to_string(path).unwrap();
    let adaptive = text
        .replace(
            "receiver = \"logical\"",
            "receiver = \"logical\"\nset = { \"session.adaptive\" = true }",
        )
        .replace(
            "receiver = \"seq\"",
            "receiver = \"seq\"\nset = { \"session.adaptive\" = true }",
        );
    assert_ne!(adaptive, text);
    let with = run(&parse(&adaptive), 1);
    let without = run(&link_down(), 1);
    for (a, b) in with.runs.iter().zip(&without.runs) {
        let (sa, sb) = (a.session.as_ref().unwrap(), b.session.as_ref().unwrap());
        assert_eq!(sa.quanta_changes, 0, "{}", a.label);
        assert_eq!(sa.failover_ms, sb.failover_ms, "{}", a.label);
        assert_eq!(sa.rejoin_ms, sb.rejoin_ms, "{}", a.label);
        assert_eq!(a.packets_lost, b.packets_lost, "{}", a.label);
    }
}

#[test]
fn in_bond_repair_hides_random_loss_in_every_mode() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/repair/lossy-link.toml");
    let sc = scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let r = run(&sc, 1);
    assert_eq!(r.runs.len(), 6);
    for pair in r.runs.chunks(2) {
        let (with, without) = (&pair[0], &pair[1]);
        assert!(without.label.ends_with("no repair"), "{}", without.label);
        // 1 % of a third of 37 500 packets are lost on the way without repair ...
        assert!(
            without.packets_lost >= 80,
            "{}: {}",
            without.label,
            without.packets_lost
        );
        // ... and nearly none with it (a few in trr, which drops a segment it cannot
        // verify in time).
        assert!(
            with.packets_lost * 5 <= without.packets_lost / 4,
            "{}: {} lost vs {}",
            with.label,
            with.packets_lost,
            without.packets_lost
        );
        assert_eq!(with.out_of_order, 0, "{}", with.label);
    }
    // Logical reception misorders after each loss without repair, never with it.
    assert!(r.runs[1].out_of_order > 0);
}

#[test]
fn repair_and_aqm_keys_are_checked() {
    let base = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/repair/lossy-link.toml"),
    )
    .unwrap();
    // The scenario pins aqm off; these cases set it themselves.
    let base = base.replace("\naqm = false\n", "\n");
    let key = "\narq = \"100ms\"\n";
    let e = parse_err(&base.replace(key, "\narq = \"soon\"\n"));
    assert!(e.contains("session.arq"), "{e}");
    let e = parse_err(&base.replace(
        key,
        "\narq = \"100ms\"\nsecurity = \"none\"\nallow_insecure = true\n",
    ));
    assert!(e.contains("arq"), "{e}");
    let sc = parse(&base.replace(key, "\narq = \"100ms\"\naqm = true\n"));
    assert_eq!(sc.jobs.len(), 6);
    let sc = parse(&base.replace(
        key,
        "\narq = \"100ms\"\naqm = true\naqm_target = \"10ms\"\naqm_interval = \"200ms\"\n",
    ));
    assert_eq!(sc.jobs.len(), 6);
    for (extra, k) in [
        ("aqm = false\naqm_target = \"10ms\"\n", "session.aqm_target"),
        (
            "aqm = true\naqm_interval = \"0s\"\n",
            "session.aqm_interval",
        ),
        ("aqm = true\naqm_target = \"soon\"\n", "session.aqm_target"),
    ] {
        let e = parse_err(&base.replace(key, &format!("{key}{extra}")));
        assert!(e.contains(k), "{extra}: {e}");
    }
}

/// `scenarios/credit/skewed-channels.toml`: the claims of docs/reproducing.md.
#[test]
fn credits_keep_skewed_channels_from_overflowing_the_receiver() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/credit/skewed-channels.toml");
    let sc = scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let r = run(&sc, sc.seed);
    let by = |label: &str| {
        r.runs
            .iter()
            .find(|x| x.label == label)
            .unwrap_or_else(|| panic!("no run {label}"))
    };
    for mode in ["logical", "seq", "trr"] {
        let on = by(&format!("{mode}, credits"));
        let c = on
            .session
            .as_ref()
            .and_then(|s| s.credits.as_ref())
            .expect("credit counters");
        assert_eq!(c.receiver_overflow, 0, "{mode}");
        assert_eq!(c.credit_refused, 0, "{mode}");
        assert!(c.receiver_high_water <= 192, "{mode}: {c:?}");
        assert!(c.credit_stalls > 0 && c.credits_sent > 0, "{mode}: {c:?}");
        assert_eq!((on.packets_lost, on.out_of_order), (0, 0), "{mode}");
        // No credit counters without credits.
        let off = by(&format!("{mode}, no credits"));
        assert!(off.session.as_ref().unwrap().credits.is_none());
    }
    // Without credits the full buffers cost misordering (logical) and loss (seq).
    assert!(by("logical, no credits").out_of_order > 10_000);
    assert!(by("seq, no credits").packets_lost > 10_000);
}

/// `scenarios/congestion/rate-drop.toml`: a link's rate changes mid-run, the goodput
/// series shows it, and adaptive weights recover most of what the links can carry.
#[test]
fn a_rate_change_mid_run_shows_in_the_series_and_adaptive_weights_follow_it() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/congestion/rate-drop.toml");
    let sc = scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let r = run(&sc, sc.seed);
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64 / 1e6;
    for run in &r.runs {
        let s = &run.goodput_series_bps;
        assert!(s.len() >= 120, "{}: {} bins", run.label, s.len());
        // 100 Mbit/s offered, 120 available before the change at 5 s, 80 after.
        assert!(mean(&s[20..50]) > 97.0, "{}", run.label);
        let after = mean(&s[70..120]);
        assert!(after < 81.0, "{}: {after}", run.label);
        if run.label.starts_with("adaptive") {
            assert!(after > 74.0, "{}: {after}", run.label);
        } else {
            assert!(after < 72.0, "{}: {after}", run.label);
        }
    }
}

#[test]
fn channel_changes_are_checked() {
    let base = |change: &str| {
        format!(
            "name = \"t\"\nduration_s = 1\n[[channel]]\nrate_mbps = 10.0\n{change}\n\
             [traffic]\nsource = \"cbr\"\nrate_mbps = 5.0\n[[run]]\nscheduler = \"srr\"\n\
             receiver = \"logical\"\n"
        )
    };
    let e = parse_err(&base("[[channel.change]]\nat_s = 1.0"));
    assert!(e.contains("rate_mbps or delay_ms"), "{e}");
    let e = parse_err(&base(
        "[[channel.change]]\nat_s = 2.0\nrate_mbps = 5.0\n[[channel.change]]\nat_s = 1.0\ndelay_ms = 3.0",
    ));
    assert!(e.contains("time order"), "{e}");
    let e = parse_err(&base("[[channel.change]]\nat_s = 1.0\nrate_mbps = -1.0"));
    assert!(e.contains("rate_mbps"), "{e}");
    let sc = parse(&base(
        "[[channel.change]]\nat_s = 0.5\nrate_mbps = 5.0\ndelay_ms = 10.0",
    ));
    let r = run(&sc, 1);
    assert!(!r.runs[0].goodput_series_bps.is_empty());
}

/// `scenarios/defaults/eight-channels.toml` with the runs `keep` accepts (by label and
/// offered load, Mbit/s).
fn eight_channels(keep: impl Fn(&str, f64) -> bool) -> scenario::Scenario {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/defaults/eight-channels.toml");
    let mut sc = scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
    sc.jobs
        .retain(|j| j.params.iter().any(|(_, v)| keep(&j.label, *v)));
    sc
}

/// Every packet offered and not delivered has a cause in the JSON (issue 28): in seq
/// mode the receiver counts what it gave up, so nothing is left unexplained, and what
/// the sending end dropped is what it never sent.
#[test]
fn every_undelivered_packet_is_counted_by_cause() {
    // One run: seq, offered more than the bond carries (the sweep's 90 %).
    let sc = eight_channels(|label, offered| label == "seq" && offered == 279.0);
    assert_eq!(sc.jobs.len(), 1);
    let r = run(&sc, 1);
    let run = &r.runs[0];
    let n = run.session.as_ref().expect("a session run").not_delivered;
    assert!(n.sender_queue > 0, "{n:?}");
    assert_eq!(n.offered - n.sender_queue, run.packets_sent, "{n:?}");
    assert_eq!(
        n.offered - run.packets_delivered,
        n.sender_queue + n.pacer + n.receiver_aqm + n.receiver_gave_up + n.lost_unseen,
        "{n:?}"
    );
    assert_eq!(n.lost_unseen, 0, "seq counts its losses: {n:?}");
    // The link-down run in seq mode: the packets in flight on the dead link are given
    // up by the receiver, every one of them counted.
    let r = run_seq_link_down();
    let n = r.session.as_ref().unwrap().not_delivered;
    assert!(n.receiver_gave_up > 0, "{n:?}");
    assert_eq!(n.lost_unseen, 0, "{n:?}");
    assert_eq!(n.offered - r.packets_delivered, n.receiver_gave_up, "{n:?}");
}

/// Issue 28's simulated case, with the tunnel's defaults: 8 channels spanning 20x in
/// rate, 1-80 ms with jitter up to 50 ms, equal weights, 64-1400-byte packets, loaded to
/// 70 % and 90 % of what they carry on the wire, over the seeds 1-8 (the scenario's and
/// seven more, each drawing other jitter and packet sizes). At 70 % every mode
/// delivers at least 0.99 of what is offered with every seed; at 90 % at least 0.97
/// (the goal) with every seed and 0.985 on average; seq misorders nothing. Before a
/// channel carrying far less than its pace was left uncut on a queue that held still
/// (its link's jitter when traffic began), seed 1 gave 0.965 in logical and seed 8 the
/// same in trr (a 40 ms-jitter 80 Mbit/s channel halved as the flow's first packets
/// reached it, and 3.5 % of the traffic waited at the sender). Before the probe trains grew on
/// jittery links (a 48-datagram train is shorter than the links' jitter, and the rate
/// it measured capped the pace for 30 s) the seeds gave 0.72-1.0 at 70 % and 0.56-0.98
/// at 90 %; before repairs went to the channel where they arrive first, seed 1 gave
/// 0.91 at 90 % in logical (every repair went to the 5 Mbit/s channel with the lowest
/// delay, and the stripe stalled behind it).
#[test]
fn eight_dissimilar_channels_carry_what_is_offered() {
    let sc = eight_channels(|_, offered| offered == 199.0 || offered == 255.0);
    let mut at_90: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    for seed in 1..=8 {
        let r = run_scenario(&sc, seed, 2, &|_, _| {}).unwrap_or_else(|e| panic!("{e}"));
        for run in &r.runs {
            let n = run.session.as_ref().expect("a session run").not_delivered;
            let share = run.packets_delivered as f64 / n.offered as f64;
            let full = run.params.iter().any(|(_, v)| *v == 255.0);
            let least = if full { 0.97 } else { 0.99 };
            let what = format!(
                "seed {seed} {} {:?}: {share:.4} {n:?}",
                run.label, run.params
            );
            assert!(share >= least, "{what}");
            if full {
                at_90.entry(run.label.clone()).or_default().push(share);
            }
            if run.label == "seq" {
                assert_eq!(run.out_of_order, 0, "{what}");
            }
        }
    }
    for (label, shares) in &at_90 {
        let mean = shares.iter().sum::<f64>() / shares.len() as f64;
        assert!(mean >= 0.985, "{label}: {shares:?}");
    }
    assert_eq!(at_90.len(), 3);
}

fn run_seq_link_down() -> braid_sim::report::RunReport {
    let mut sc = link_down();
    sc.jobs.retain(|j| j.label == "seq");
    assert_eq!(sc.jobs.len(), 1);
    run(&sc, 1).runs.remove(0)
}
