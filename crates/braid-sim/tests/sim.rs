//! End-to-end tests of the simulator: scenarios in, measured results out.

use std::path::Path;

use braid_sim::report::run_scenario;
use braid_sim::scenario;

mod common;
use common::{parse, parse_err, run};

const TWO_CHANNELS: &str = r#"
duration_s = 3
[[channel]]
rate_mbps = 6.0
delay_ms = 1.0
queue_packets = 50
[[channel]]
rate_mbps = 6.0
delay_ms = 1.0
queue_packets = 50
[traffic]
source = "backlogged"
sizes = "alternating"
bytes = [1000, 200]
"#;

#[test]
fn same_seed_same_json_other_seed_differs() {
    let text = r#"
duration_s = 1.5
max_packet = 1600
[[channel]]
rate_mbps = 8
delay_ms = 2
jitter_ms = 1
loss = 0.02
[channel.gilbert]
p_bad = 0.5
good_ms = 50
bad_ms = 10
[[channel]]
rate_mbps = 4
delay_ms = 7
jitter_ms = 3
corrupt = 0.01
[[channel.loss_window]]
start_s = 0.5
end_s = 0.7
loss = 0.6
[traffic]
source = "poisson"
rate_mbps = 10
sizes = "imix"
[[run]]
scheduler = "srr"
[[run]]
scheduler = "random"
receiver = "seq"
[[run]]
scheduler = "srr"
receiver = "trr"
"#;
    let sc = parse(text);
    let a = run(&sc, 42).to_json();
    let b = run(&sc, 42).to_json();
    assert_eq!(a, b, "same seed must give identical JSON");
    // The thread count must not matter either.
    let c = run_scenario(&sc, 42, 3, &|_, _| {}).unwrap().to_json();
    assert_eq!(a, c);
    let d = run(&sc, 43).to_json();
    assert_ne!(a, d, "a different seed should change the random processes");
}

#[test]
fn json_has_the_documented_keys() {
    let sc = parse(&format!("{TWO_CHANNELS}\n[[run]]\nscheduler = \"srr\"\n"));
    let json = run(&sc, 1).to_json();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["scenario"], "test");
    assert_eq!(v["seed"], 1);
    let r = &v["runs"][0];
    for k in [
        "label",
        "scheduler",
        "receiver",
        "params",
        "duration_s",
        "goodput_bps",
        "packets_sent",
        "packets_delivered",
        "packets_lost",
        "out_of_order",
        "max_reorder_depth",
        "latency_ms",
        "resync_s",
        "marker_overhead",
        "channels",
    ] {
        assert!(r.get(k).is_some(), "missing key {k} in {r}");
    }
    for k in ["mean", "p50", "p99", "max"] {
        assert!(r["latency_ms"][k].is_f64(), "latency_ms.{k}");
    }
    for k in ["id", "bytes", "packets"] {
        assert!(r["channels"][0][k].is_u64(), "channels[0].{k}");
    }
    assert!(r["resync_s"].is_array());
    assert!(r["params"].is_object());
}

#[test]
fn channel_throughput_matches_its_rate() {
    for (rate, overhead) in [(1.0, 0), (6.0, 0), (100.0, 0), (10.0, 38)] {
        let text = format!(
            r#"
duration_s = 2
[[channel]]
rate_mbps = {rate}
delay_ms = 3
overhead_bytes = {overhead}
[traffic]
sizes = "uniform"
min = 64
max = 1500
[[run]]
scheduler = "srr"
receiver = "none"
"#
        );
        let rep = run(&parse(&text), 1);
        let r = &rep.runs[0];
        let tp = r.channels[0].throughput_bps;
        // Framing overhead takes its share of the line rate.
        let mean = (64.0 + 1500.0) / 2.0;
        let expect = rate * 1e6 * mean / (mean + f64::from(overhead));
        assert!(
            (tp / expect - 1.0).abs() < 0.01,
            "rate {rate} Mbit/s, overhead {overhead}: measured {tp}, expected {expect}"
        );
        // Goodput cannot beat the channel.
        assert!(r.goodput_bps <= rate * 1e6 * 1.001);
        assert!(r.goodput_bps > 0.9 * expect, "{}", r.goodput_bps);
    }
}

fn gilbert_loss(durations: &str, p_bad: f64, good_ms: f64, bad_ms: f64, seed: u64) -> f64 {
    let text = format!(
        r#"
duration_s = 60
[[channel]]
rate_mbps = 1000
queue_packets = 10000
[channel.gilbert]
p_bad = {p_bad}
good_ms = {good_ms}
bad_ms = {bad_ms}
durations = "{durations}"
[traffic]
source = "cbr"
pps = 20000
sizes = "fixed"
bytes = 100
[[run]]
scheduler = "srr"
receiver = "none"
"#
    );
    let rep = run(&parse(&text), seed);
    let c = &rep.runs[0].channels[0];
    c.lost as f64 / c.packets as f64
}

#[test]
fn gilbert_elliott_loss_converges() {
    for (durations, p_bad, g, b) in [
        ("exponential", 0.5, 40.0, 10.0),
        ("deterministic", 0.5, 40.0, 10.0),
        ("exponential", 0.9, 15.0, 5.0),
        ("deterministic", 1.0, 90.0, 30.0),
    ] {
        let expect = p_bad * b / (g + b);
        let got = gilbert_loss(durations, p_bad, g, b, 7);
        assert!(
            (got - expect).abs() < 0.1 * expect,
            "{durations} p_b={p_bad} d_g={g} d_b={b}: loss {got}, expected {expect}"
        );
    }
}

#[test]
fn alternating_sizes_srr_beats_round_robin() {
    let sc = parse(&format!(
        "{TWO_CHANNELS}\n[[run]]\nscheduler = \"srr\"\n[[run]]\nscheduler = \"grr\"\n[[run]]\nscheduler = \"rr\"\nreceiver = \"none\"\n"
    ));
    let rep = run(&sc, 1);
    let srr = rep.runs[0].goodput_bps;
    let grr = rep.runs[1].goodput_bps;
    let rr_none = &rep.runs[2];
    // SRR fills both 6 Mbit/s channels; RR sends all 1000-byte packets to one.
    assert!(srr > 11.5e6 && srr < 12.0e6, "srr {srr}");
    assert!(grr > 6.9e6 && grr < 7.4e6, "grr {grr}");
    assert_eq!(rep.runs[0].out_of_order, 0);
    assert_eq!(rep.runs[1].out_of_order, 0);
    // Without resequencing the small packets overtake the big ones.
    assert!(rr_none.out_of_order > 1000, "{}", rr_none.out_of_order);
    // Channel 0 carries 5/6 of RR's bytes.
    let ch = &rep.runs[1].channels;
    assert!(ch[0].bytes > 4 * ch[1].bytes);
}

#[test]
fn fifo_restored_after_every_loss_episode() {
    let mut text = String::from("duration_s = 5\n");
    for _ in 0..2 {
        text.push_str(
            r#"
[[channel]]
rate_mbps = 10
delay_ms = 4
[[channel.loss_window]]
start_s = 1.0
end_s = 1.5
loss = 0.0
[[channel.loss_window]]
start_s = 2.5
end_s = 3.0
loss = 0.0
"#,
        );
    }
    text.push_str(
        r#"
[traffic]
sizes = "uniform"
min = 64
max = 1500
[markers]
every_rounds = 4
[[run]]
scheduler = "srr"
[[sweep]]
name = "loss"
keys = ["channel.0.loss_window.0.loss", "channel.0.loss_window.1.loss",
        "channel.1.loss_window.0.loss", "channel.1.loss_window.1.loss"]
values = [0.2, 0.5, 0.8]
"#,
    );
    let rep = run(&parse(&text), 3);
    assert_eq!(rep.runs.len(), 3);
    for r in &rep.runs {
        assert_eq!(r.fifo_restored.len(), 2, "{:?}", r.loss_episodes_s);
        assert!(r.fifo_restored.iter().all(|x| *x), "{:?}", r.params);
        assert!(r.out_of_order > 0, "loss should misorder: {:?}", r.params);
        assert!(r.packets_lost > 0);
        for t in &r.resync_s {
            assert!(*t < 0.2, "resync took {t} s at {:?}", r.params);
        }
    }
}

#[test]
fn more_markers_fewer_misorderings() {
    let mut text = String::from("duration_s = 3\n");
    for _ in 0..2 {
        text.push_str("[[channel]]\nrate_mbps = 10\ndelay_ms = 2\nloss = 0.05\n");
    }
    text.push_str(
        r#"
[traffic]
sizes = "uniform"
min = 64
max = 1500
[[run]]
scheduler = "srr"
[[sweep]]
key = "markers.every_rounds"
values = [1, 8, 64]
"#,
    );
    let rep = run(&parse(&text), 5);
    let ooo: Vec<u64> = rep.runs.iter().map(|r| r.out_of_order).collect();
    assert!(ooo[0] < ooo[1] && ooo[1] < ooo[2], "{ooo:?}");
    let ovh: Vec<f64> = rep.runs.iter().map(|r| r.marker_overhead).collect();
    assert!(ovh[0] > ovh[1] && ovh[1] > ovh[2], "{ovh:?}");
}

#[test]
fn trr_never_misorders_under_loss() {
    let text = r#"
duration_s = 2
max_packet = 1600
[[channel]]
rate_mbps = 50
delay_ms = 1
jitter_ms = 0.5
loss = 0.01
[[channel]]
rate_mbps = 50
delay_ms = 3
loss = 0.01
[traffic]
sizes = "imix"
[trr]
trigger_every = 100
[[run]]
scheduler = "srr"
receiver = "trr"
[[run]]
scheduler = "srr"
receiver = "seq"
"#;
    let rep = run(&parse(text), 9);
    for r in &rep.runs {
        assert_eq!(r.out_of_order, 0, "{}", r.label);
        assert!(r.packets_lost > 0, "{}", r.label);
        assert!(r.packets_delivered > 10_000, "{}", r.label);
    }
}

#[test]
fn jitter_keeps_each_channel_fifo() {
    let text = r#"
packets = 20000
[[channel]]
rate_mbps = 20
delay_ms = 5
jitter_ms = 20
[traffic]
source = "cbr"
rate_mbps = 15
sizes = "uniform"
min = 64
max = 1500
[[run]]
scheduler = "srr"
receiver = "none"
"#;
    let r = &run(&parse(text), 2).runs[0];
    assert_eq!(r.packets_delivered, 20_000);
    assert_eq!(r.out_of_order, 0);
    assert!(
        r.latency_ms.max > 15.0,
        "jitter should show: {:?}",
        r.latency_ms
    );
}

#[test]
fn trace_replay_and_unloaded_latency() {
    let dir = std::env::temp_dir().join(format!("braid-sim-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut csv = String::from("time_s,size_bytes\n");
    for i in 0..1000 {
        csv.push_str(&format!(
            "{},{}\n",
            f64::from(i) * 0.001,
            100 + (i % 7) * 100
        ));
    }
    std::fs::write(dir.join("t.csv"), csv).unwrap();
    let text = r#"
packets = 1000000
[[channel]]
rate_mbps = 100
delay_ms = 10
[traffic]
source = "trace"
file = "t.csv"
[[run]]
scheduler = "srr"
receiver = "none"
"#;
    let sc = scenario::parse(text, "trace.toml", &dir, "trace").unwrap();
    let r = &run(&sc, 1).runs[0];
    assert_eq!(r.packets_sent, 1000);
    assert_eq!(r.packets_delivered, 1000);
    // Unloaded: delay plus serialization (<= 56 us for 700 bytes at 100 Mbit/s).
    assert!(r.latency_ms.min_ok(10.0, 10.06), "{:?}", r.latency_ms);
    assert!((r.duration_s - 1.009).abs() < 0.01, "{}", r.duration_s);
    let _ = std::fs::remove_dir_all(&dir);
}

trait LatencyCheck {
    fn min_ok(&self, lo: f64, hi: f64) -> bool;
}
impl LatencyCheck for braid_sim::report::Latency {
    fn min_ok(&self, lo: f64, hi: f64) -> bool {
        self.p50 >= lo && self.max <= hi
    }
}

#[test]
fn offered_rates_and_drop_tail() {
    // CBR at 5 Mbit/s over 10 Mbit/s: no drops, goodput = offered load.
    // Poisson at 20 Mbit/s over 10 Mbit/s: the queue overflows and drops.
    let text = r#"
duration_s = 4
[[channel]]
rate_mbps = 10
queue_packets = 20
[traffic]
source = "cbr"
rate_mbps = 5
sizes = "fixed"
bytes = 500
[[run]]
scheduler = "srr"
receiver = "none"
[[sweep]]
key = "traffic.rate_mbps"
values = [5, 20]
"#;
    let mut text = text.to_string();
    let rep = run(&parse(&text), 1);
    let (a, b) = (&rep.runs[0], &rep.runs[1]);
    assert!(
        (a.goodput_bps / 5e6 - 1.0).abs() < 0.01,
        "{}",
        a.goodput_bps
    );
    assert_eq!(a.dropped_at_sender, 0);
    assert!(
        (b.goodput_bps / 10e6 - 1.0).abs() < 0.01,
        "{}",
        b.goodput_bps
    );
    assert!(b.channels[0].queue_drops > 1000);
    assert_eq!(b.packets_lost, b.dropped_at_sender);
    text = text.replace("\"cbr\"", "\"poisson\"");
    let rep = run(&parse(&text), 1);
    let p = &rep.runs[0];
    let sent_rate = p.packets_sent as f64 * 500.0 * 8.0 / 4.0;
    assert!(
        (sent_rate / 5e6 - 1.0).abs() < 0.03,
        "poisson offered {sent_rate}"
    );
}

#[test]
fn link_down_and_mtu() {
    let text = r#"
duration_s = 3
[[channel]]
rate_mbps = 10
delay_ms = 2
[[channel.down]]
start_s = 1.0
end_s = 1.5
[[channel]]
rate_mbps = 10
delay_ms = 2
mtu = 1000
[traffic]
sizes = "bimodal"
small = 200
large = 1400
[[run]]
scheduler = "srr"
receiver = "none"
[[run]]
scheduler = "srr"
receiver = "logical"
"#;
    let rep = run(&parse(text), 4);
    for r in &rep.runs {
        let c0 = &r.channels[0];
        let c1 = &r.channels[1];
        // Half a second of a 10 Mbit/s link is lost while it is down.
        assert!(c0.lost > 300, "{}: lost {}", r.label, c0.lost);
        assert!(
            c1.mtu_drops > 1000,
            "{}: mtu drops {}",
            r.label,
            c1.mtu_drops
        );
        assert_eq!(c1.lost, 0);
        assert_eq!(r.loss_episodes_s, vec![[1.0, 1.5]]);
    }
    assert!(rep.runs[1].fifo_restored.iter().all(|x| *x));
}

#[test]
fn sweep_grid_and_run_overrides() {
    let text = format!(
        r#"{TWO_CHANNELS}
[[run]]
label = "a"
scheduler = "srr"
set = {{ "channel.0.rate_mbps" = 3 }}
[[run]]
label = "b"
scheduler = "rr"
[[sweep]]
key = "channel[1].rate_mbps"
from = 2
to = 6
step = 2
[[sweep]]
key = "channel.0.delay_ms"
name = "d0"
values = [1, 50]
"#
    );
    let sc = parse(&text);
    assert_eq!(sc.jobs.len(), 2 * 3 * 2);
    assert_eq!(sc.sweep_names, vec!["channel[1].rate_mbps", "d0"]);
    let j = &sc.jobs[0];
    assert_eq!(j.label, "a");
    assert_eq!(j.config.channels[0].rate_bps, 3e6);
    assert_eq!(j.config.channels[1].rate_bps, 2e6);
    assert_eq!(j.config.channels[0].delay, 1_000_000);
    let last = &sc.jobs[11];
    assert_eq!(last.label, "b");
    assert_eq!(last.config.channels[0].rate_bps, 6e6);
    assert_eq!(last.config.channels[1].rate_bps, 6e6);
    assert_eq!(last.config.channels[0].delay, 50_000_000);
    assert_eq!(
        last.params,
        vec![
            ("channel[1].rate_mbps".to_string(), 6.0),
            ("d0".to_string(), 50.0)
        ]
    );
}

#[test]
fn scenario_errors_name_file_key_and_expectation() {
    let cases: &[(&str, &[&str])] = &[
        ("duration_s = 1\n[[channel]]\nrate_mbps = \"fast\"\n[traffic]\n[[run]]\nscheduler = \"srr\"\n",
            &["bad.toml", "channel[0].rate_mbps", "expected a rate in Mbit/s", "string \"fast\""]),
        ("duration_s = 1\n[[channel]]\nrate_mbps = -3\n[traffic]\n[[run]]\nscheduler = \"srr\"\n",
            &["channel[0].rate_mbps", "found -3"]),
        ("duration_s = 1\n[[channel]]\nrate_mbps = 1\nrat_mbps = 2\n[traffic]\n[[run]]\nscheduler = \"srr\"\n",
            &["channel[0].rat_mbps", "unknown key", "rate_mbps"]),
        ("duration_s = 1\n[[channel]]\nrate_mbps = 1\n[traffic]\n[[run]]\nscheduler = \"fast\"\n",
            &["run[0].scheduler", "unknown scheduler \"fast\"", "srr, rr, grr"]),
        ("duration_s = 1\n[[channel]]\nrate_mbps = 1\n[traffic]\n",
            &["bad.toml", "key `run`", "at least one [[run]]"]),
        ("duration_s = 1\n[[channel]]\nrate_mbps = 1\nloss = 1.5\n[traffic]\n[[run]]\nscheduler = \"srr\"\n",
            &["channel[0].loss", "probability from 0 to 1", "1.5"]),
        ("duration_s = 1\n[[channel]]\nrate_mbps = 1\n[traffic]\nsizes = \"fixed\"\nbytes = 2000\n[[run]]\nscheduler = \"srr\"\n",
            &["max_packet", "2000 bytes", "max_packet = 1500"]),
        ("duration_s = 1\n[[channel]]\nrate_mbps = 1\n[traffic]\nsizes = \"fixed\"\nbytes = 10\n[[run]]\nscheduler = \"srr\"\n",
            &["traffic", "below the simulator's minimum"]),
        ("[[channel]]\nrate_mbps = 1\n[traffic]\n[[run]]\nscheduler = \"srr\"\n",
            &["neither `duration_s` nor `packets`"]),
        ("duration_s = 1\n[[channel]]\nrate_mbps = 1\n[traffic]\n[[run]]\nscheduler = \"srr\"\n[[sweep]]\nkey = \"channel.4.rate_mbps\"\nvalues = [1]\n",
            &["sweep[0].key", "index 4 is out of range"]),
        ("duration_s = 1\n[[channel]]\nrate_mbps = 1\n[traffic]\n[[run]]\nscheduler = \"srr\"\n[[sweep]]\nkey = \"channel.0.rate_mbps\"\nvalues = [1, -2]\n",
            &["channel[0].rate_mbps", "found -2", "sweep point channel.0.rate_mbps = -2"]),
        ("duration_s = 1\n[[channel]]\nrate_mbps = 1\n[traffic]\n[[run]]\nscheduler = \"sqf\"\nreceiver = \"logical\"\n",
            &["run[0]", "not causal"]),
        ("duration_s = 1\n[[channel]]\nrate_mbps = 1\n[traffic]\nsource = \"poisson\"\n[[run]]\nscheduler = \"srr\"\n",
            &["traffic.rate_mbps", "needs `rate_mbps`"]),
        ("duration_s = 1\n[[channel]]\nrate_mbps = 1\n[traffic]\nsource = \"trace\"\nfile = \"/nonexistent/x.csv\"\n[[run]]\nscheduler = \"srr\"\n",
            &["traffic.file", "cannot read"]),
        ("duration_s = 1\n[[channel]]\nrate_mbps = 1\n[markers]\nposition = \"middle\"\n[traffic]\n[[run]]\nscheduler = \"srr\"\n",
            &["markers.position", "\"channel:N\""]),
        ("duration_s = = 1\n", &["bad.toml", "not valid TOML", "line 1"]),
    ];
    for (text, needles) in cases {
        let e = parse_err(text);
        for n in *needles {
            assert!(e.contains(n), "error {e:?} should contain {n:?}");
        }
    }
}

#[test]
fn shipped_scenarios_load() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
    let mut n = 0;
    for sub in ["striping", "trr"] {
        for e in std::fs::read_dir(root.join(sub)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "toml") {
                let sc = scenario::load(&p).unwrap_or_else(|e| panic!("{e}"));
                assert!(!sc.jobs.is_empty());
                n += 1;
            }
        }
    }
    assert!(n >= 4, "expected the four paper scenarios, found {n}");
}

#[test]
fn extreme_values_are_errors_or_results_never_panics() {
    let bad = [
        ("rate_mbps = 1e-300", "channel[0].rate_mbps"),
        ("rate_mbps = 1\ndelay_ms = 1e300", "channel[0].delay_ms"),
        (
            "rate_mbps = 1\nqueue_packets = 0",
            "channel[0].queue_packets",
        ),
        ("rate_mbps = 1\nmtu = -1", "channel[0].mtu"),
        (
            "rate_mbps = 1\n[channel.gilbert]\np_bad = 0.5\ngood_ms = 0\nbad_ms = 1",
            "channel[0].gilbert.good_ms",
        ),
        (
            "rate_mbps = 1\n[[channel.loss_window]]\nstart_s = 2\nend_s = 1",
            "channel[0].loss_window[0].end_s",
        ),
    ];
    for (chan, key) in bad {
        let text = format!(
            "duration_s = 1\n[[channel]]\n{chan}\n[traffic]\n[[run]]\nscheduler = \"srr\"\n"
        );
        let e = parse_err(&text);
        assert!(e.contains(key), "{e:?} should name {key}");
    }
    // Legal but extreme: a tiny rate, a huge delay and a channel whose MTU drops
    // everything still finish with numbers.
    let text = r#"
duration_s = 0.5
drain_s = 0.1
[[channel]]
rate_mbps = 0.001
delay_ms = 1000000
[[channel]]
rate_mbps = 10000
mtu = 100
[traffic]
source = "cbr"
pps = 0.001
[[run]]
scheduler = "srr"
[[run]]
scheduler = "sqf"
"#;
    let rep = run(&parse(text), 1);
    assert_eq!(rep.runs.len(), 2);
    for r in &rep.runs {
        assert_eq!(r.packets_delivered, 0);
        assert_eq!(r.goodput_bps, 0.0);
    }
}

#[test]
fn plots_svg_and_png() {
    let text = format!(
        "{TWO_CHANNELS}\n[[run]]\nscheduler = \"srr\"\n[[run]]\nscheduler = \"rr\"\n[[run]]\nlabel = \"bound\"\nscheduler = \"sum\"\n[[sweep]]\nkey = \"channel.1.rate_mbps\"\nname = \"ch1 rate\"\nvalues = [3, 6]\n[plot]\nx_label = \"rate of channel 1 (Mbit/s)\"\n"
    );
    let sc = parse(&text.replace("duration_s = 3", "duration_s = 0.5"));
    let rep = run(&sc, 1);
    let lines = braid_sim::plot::series(&sc, &rep).unwrap();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0].name, "srr+logical");
    assert_eq!(lines[0].points.len(), 2);
    assert!(lines[0].points[0].0 < lines[0].points[1].0);
    // Goodput is drawn in Mbit/s; the bound is the two channels added up.
    assert!((lines[2].points[1].1 - 12.0).abs() < 0.1, "{:?}", lines[2]);
    let dir = std::env::temp_dir().join(format!("braid-sim-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("p.svg");
    let png = dir.join("p.png");
    braid_sim::plot::draw(&sc, &rep, &svg, braid_sim::plot::Format::Svg).unwrap();
    braid_sim::plot::draw(&sc, &rep, &png, braid_sim::plot::Format::Png).unwrap();
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.starts_with("<svg"));
    for needle in [
        "rate of channel 1 (Mbit/s)",
        "goodput (Mbit/s)",
        "srr+logical",
        "bound",
    ] {
        assert!(s.contains(needle), "svg lacks {needle}");
    }
    let p = std::fs::read(&png).unwrap();
    assert_eq!(&p[..8], b"\x89PNG\r\n\x1a\n");
    // Without a sweep there is nothing for the x axis.
    let flat = parse(&format!("{TWO_CHANNELS}\n[[run]]\nscheduler = \"srr\"\n"));
    let e = braid_sim::plot::draw(&flat, &rep, &svg, braid_sim::plot::Format::Svg).unwrap_err();
    assert!(e.to_string().contains("no [[sweep]]"));
    let _ = std::fs::remove_dir_all(&dir);
}
