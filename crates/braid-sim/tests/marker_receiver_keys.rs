//! The `markers.max_interval_ms` and `receiver.equalize` scenario keys: parsed into the
//! session configuration, usable in sweeps and run overrides, rejected when out of
//! range, and visible in the results (so neither can be silently ignored).

use std::path::Path;

use braid_proto::{Duration, StripeConfig};
use braid_sim::report::{run_scenario, Report, RunReport};
use braid_sim::scenario::{self, Scenario};
use braid_sim::Variant;

fn parse(text: &str) -> Scenario {
    scenario::parse(text, "test.toml", Path::new("."), "test")
        .unwrap_or_else(|e| panic!("scenario should parse: {e}"))
}

fn parse_err(text: &str) -> String {
    match scenario::parse(text, "bad.toml", Path::new("."), "bad") {
        Ok(_) => panic!("scenario should be rejected:\n{text}"),
        Err(e) => e.to_string(),
    }
}

fn run(sc: &Scenario) -> Report {
    run_scenario(sc, 1, 1, &|_, _| {}).unwrap_or_else(|e| panic!("run failed: {e}"))
}

fn stripe(sc: &Scenario, job: usize) -> &StripeConfig {
    match &sc.jobs[job].config.variant {
        Variant::Striped(c) => c,
        Variant::SumOfSingles | Variant::Session(_) | Variant::ErrCtl(_) => {
            panic!("job {job} is not a striped run")
        }
    }
}

fn control_packets(r: &RunReport) -> u64 {
    r.channels.iter().map(|c| c.control_packets).sum()
}

const BASE: &str = r#"
duration_s = 1
[[channel]]
rate_mbps = 10
[[channel]]
rate_mbps = 10
[traffic]
"#;

#[test]
fn keys_reach_the_session_config() {
    // Defaults: off.
    let sc = parse(&format!("{BASE}[[run]]\nscheduler = \"srr\"\n"));
    assert_eq!(stripe(&sc, 0).markers.max_interval, None);
    assert!(!stripe(&sc, 0).receiver.equalize);

    let sc = parse(&format!(
        "{BASE}[markers]\nmax_interval_ms = 2.5\n[receiver]\nequalize = true\n\
         [[run]]\nscheduler = \"srr\"\n"
    ));
    assert_eq!(
        stripe(&sc, 0).markers.max_interval,
        Some(Duration::from_micros(2500))
    );
    assert!(stripe(&sc, 0).receiver.equalize);

    // Run overrides and sweeps (a sweep sets numbers: equalize takes 0 and 1).
    let sc = parse(&format!(
        r#"{BASE}
[[run]]
label = "plain"
scheduler = "srr"
[[run]]
label = "eq"
scheduler = "srr"
set = {{ "receiver.equalize" = true, "markers.max_interval_ms" = 7 }}
[[sweep]]
key = "markers.max_interval_ms"
values = [1, 4]
[[sweep]]
key = "receiver.equalize"
values = [0, 1]
"#
    ));
    assert_eq!(sc.jobs.len(), 2 * 2 * 2);
    let got: Vec<(Option<Duration>, bool)> = (0..sc.jobs.len())
        .map(|j| {
            let c = stripe(&sc, j);
            (c.markers.max_interval, c.receiver.equalize)
        })
        .collect();
    let ms = |x| Some(Duration::from_millis(x));
    // The sweep point is applied after the run's `set`.
    assert_eq!(
        got,
        vec![
            (ms(1), false),
            (ms(1), true),
            (ms(4), false),
            (ms(4), true),
            (ms(1), false),
            (ms(1), true),
            (ms(4), false),
            (ms(4), true),
        ]
    );
    let sc = parse(&format!(
        "{BASE}[[run]]\nscheduler = \"srr\"\n\
         set = {{ \"receiver.equalize\" = true, \"markers.max_interval_ms\" = 7 }}\n"
    ));
    assert_eq!(stripe(&sc, 0).markers.max_interval, ms(7));
    assert!(stripe(&sc, 0).receiver.equalize);
}

#[test]
fn bad_values_name_file_and_key() {
    let run = "[[run]]\nscheduler = \"srr\"\n";
    let cases: &[(&str, &[&str])] = &[
        (
            "[markers]\nmax_interval_ms = 0\n",
            &[
                "bad.toml",
                "markers.max_interval_ms",
                "milliseconds > 0",
                "found 0",
            ],
        ),
        (
            "[markers]\nmax_interval_ms = -3\n",
            &["markers.max_interval_ms", "found -3"],
        ),
        (
            "[markers]\nmax_interval_ms = 2e9\n",
            &["markers.max_interval_ms", "at most 1e9"],
        ),
        (
            "[markers]\nmax_interval_ms = \"5ms\"\n",
            &["markers.max_interval_ms", "string \"5ms\""],
        ),
        (
            "[receiver]\nequalize = \"yes\"\n",
            &[
                "bad.toml",
                "receiver.equalize",
                "true or false",
                "string \"yes\"",
            ],
        ),
        (
            "[receiver]\nequalize = 2\n",
            &["receiver.equalize", "integer 2"],
        ),
        (
            "[receiver]\nequalise = true\n",
            &["receiver.equalise", "unknown key", "equalize"],
        ),
        (
            "[markers]\nmax_interval = 5\n",
            &["markers.max_interval", "unknown key", "max_interval_ms"],
        ),
    ];
    for (extra, needles) in cases {
        let e = parse_err(&format!("{BASE}{extra}{run}"));
        for n in *needles {
            assert!(e.contains(n), "error {e:?} should contain {n:?}");
        }
    }
    // In a sweep the error names the point.
    let e = parse_err(&format!(
        "{BASE}{run}[[sweep]]\nkey = \"receiver.equalize\"\nvalues = [0, 3]\n"
    ));
    assert!(
        e.contains("receiver.equalize") && e.contains("sweep point receiver.equalize = 3"),
        "{e}"
    );
}

/// A sparse stream over a fast and a slow channel: without equalization packets on the
/// fast channel arrive 20 ms earlier than those on the slow one; with it, every packet
/// sees about the slow channel's delay.
#[test]
fn equalize_evens_out_latency_over_unequal_delays() {
    let text = r#"
duration_s = 4
[[channel]]
rate_mbps = 10
delay_ms = 1
[[channel]]
rate_mbps = 10
delay_ms = 21
[traffic]
source = "cbr"
pps = 20
sizes = "fixed"
bytes = 500
[[run]]
label = "off"
scheduler = "rr"
[[run]]
label = "on"
scheduler = "rr"
set = { "receiver.equalize" = true }
"#;
    let rep = run(&parse(text));
    let (off, on) = (&rep.runs[0], &rep.runs[1]);
    for r in [off, on] {
        assert_eq!(r.packets_lost, 0, "{}", r.label);
        assert_eq!(r.out_of_order, 0, "{}", r.label);
    }
    let spread = |r: &RunReport| r.latency_ms.max - r.latency_ms.mean;
    // Off: half the packets take ~1 ms, half ~21 ms.
    assert!(off.latency_ms.mean < 14.0, "{:?}", off.latency_ms);
    assert!(spread(off) > 7.0, "{:?}", off.latency_ms);
    // On: all but the packets before the first marker batch take ~21 ms.
    assert!(on.latency_ms.mean > 19.0, "{:?}", on.latency_ms);
    assert!(on.latency_ms.p50 > 20.0, "{:?}", on.latency_ms);
    assert!(spread(on) < 2.0, "{:?}", on.latency_ms);
    assert!(on.latency_ms.max < 23.0, "{:?}", on.latency_ms);
}

/// A slow sender sends few rounds, so markers every 8 rounds are rare; a maximum
/// interval makes them follow the data within that time.
#[test]
fn max_interval_raises_marker_count_for_a_slow_sender() {
    let text = r#"
duration_s = 4
[[channel]]
rate_mbps = 10
delay_ms = 2
[[channel]]
rate_mbps = 10
delay_ms = 2
[traffic]
source = "cbr"
pps = 100
sizes = "fixed"
bytes = 500
[markers]
idle_ms = 0
[[run]]
scheduler = "srr"
[[run]]
scheduler = "srr"
receiver = "trr"
[[sweep]]
key = "markers.max_interval_ms"
values = [1000000, 5]
"#;
    let rep = run(&parse(text));
    assert_eq!(rep.runs.len(), 4);
    for pair in rep.runs.chunks(2) {
        let (off, on) = (&pair[0], &pair[1]);
        assert_eq!(off.packets_sent, on.packets_sent);
        let (a, b) = (control_packets(off), control_packets(on));
        // 400 packets, 10 ms apart: with a 5 ms bound nearly every packet is followed
        // by a marker (trigger) on each channel.
        assert!(
            b > 5 * a.max(1),
            "{}: {a} -> {b} control packets",
            off.label
        );
        assert!(b >= 2 * 300, "{}: {b} control packets", off.label);
        assert!(on.marker_overhead > off.marker_overhead, "{}", off.label);
        assert_eq!(on.packets_lost, 0, "{}", off.label);
    }
    // TRR waits for the next trigger before delivering; the bound caps that wait.
    let (trr_off, trr_on) = (&rep.runs[2], &rep.runs[3]);
    assert!(
        trr_on.latency_ms.max < 10.0 && trr_on.latency_ms.max < trr_off.latency_ms.max,
        "{:?} vs {:?}",
        trr_off.latency_ms,
        trr_on.latency_ms
    );
}
