//! Two `braid bench` processes on loopback, three channels through a relay that can
//! silence a channel: delivery, order and stats; failover reported by `braid status`.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use braid_io::relay::Relay;
use serde_json::Value;

mod loopback;
use loopback::{tmp, BIN};

struct Ends {
    relay: Relay,
    a_args: Vec<String>,
    b_args: Vec<String>,
}

/// Both ends over `n` channels, with a 20 ms heartbeat and channels down after 150 ms.
fn ends(n: usize) -> Ends {
    let (relay, mut a_args, mut b_args) = loopback::ends(n);
    for v in [&mut a_args, &mut b_args] {
        v.extend(["--heartbeat", "20ms", "--dead-after", "150ms"].map(String::from));
    }
    Ends {
        relay,
        a_args,
        b_args,
    }
}

fn spawn(role: &str, args: &[String], extra: &[&str]) -> Child {
    Command::new(BIN)
        .arg("bench")
        .arg(role)
        .args(args)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start braid")
}

fn finish(c: Child, what: &str) -> (Value, String) {
    let out: Output = c.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{what} failed: {err}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{what}: bad JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    (v, err)
}

#[test]
fn bench_three_channels_delivers_in_order_with_stats() {
    for mode in ["logical", "seq", "trr"] {
        let e = ends(3);
        let sink = spawn(
            "sink",
            &e.b_args,
            &["--json", "--mode", mode, "--max-duration", "30s"],
        );
        let send = spawn(
            "send",
            &e.a_args,
            &[
                "--json",
                "--mode",
                mode,
                "--size",
                "1400,200,800",
                "--count",
                "30000",
                "--rate",
                "150M",
            ],
        );
        let (s, send_log) = finish(send, "sender");
        let (r, sink_log) = finish(sink, "sink");
        // The sink stops at the end of the run and closes on purpose: the sender,
        // which lingers longer than dead_after, hears it and does not warn.
        assert!(send_log.contains("peer closed the session"), "{send_log}");
        assert!(
            !send_log.contains("WARN") && !sink_log.contains("WARN"),
            "{mode}: {send_log}\n{sink_log}"
        );
        assert_eq!(s["packets"], 30000);
        assert_eq!(r["packets"], 30000, "{mode}: {r}");
        assert_eq!(r["lost"], 0, "{mode}");
        assert_eq!(r["out_of_order"], 0, "{mode}");
        assert_eq!(r["duplicates"], 0, "{mode}");
        assert_eq!(r["end_seen"], true);
        assert_eq!(r["bytes"], 30000 / 3 * (1400 + 200 + 800));
        assert!(r["goodput_bps"].as_f64().unwrap() > 1e6);
        assert!(r["latency_us"]["p50"].as_f64().unwrap() > 0.0);
        let chans = r["session"]["channels"].as_array().unwrap();
        assert_eq!(chans.len(), 3);
        for c in chans {
            assert!(c["rx_data_packets"].as_u64().unwrap() > 5000, "{mode}: {c}");
            assert_eq!(c["state"], "up");
            assert_eq!(c["auth_failures"], 0);
            if mode != "trr" {
                assert!(c["rx_markers"].as_u64().unwrap() > 0);
            } else {
                assert!(c["rx_triggers"].as_u64().unwrap() > 0);
            }
        }
        // The session delivered the data plus at least one of the five end messages.
        let delivered = r["session"]["delivered_packets"].as_u64().unwrap();
        assert!((30001..=30005).contains(&delivered), "{mode}: {delivered}");
        for c in 0..3 {
            assert!(e.relay.counts(c).0 > 5000);
        }
    }
}

#[test]
fn bench_failover_is_reported_and_traffic_continues() {
    let e = ends(3);
    let ctl = tmp("failover.sock");
    let ctl_s = ctl.to_str().unwrap().to_string();
    let sink = spawn(
        "sink",
        &e.b_args,
        &[
            "--json",
            "--control",
            &ctl_s,
            "--max-duration",
            "30s",
            "--idle",
            "2s",
        ],
    );
    let send = spawn(
        "send",
        &e.a_args,
        &[
            "--json",
            "--size",
            "1000",
            "--duration",
            "3s",
            "--rate",
            "40M",
        ],
    );
    // Wait for the control socket and traffic, then silence channel 1.
    let t0 = Instant::now();
    while !ctl.exists() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(1000));
    e.relay.silence(1, true);
    std::thread::sleep(Duration::from_millis(800));
    let st = Command::new(BIN)
        .args(["status", "--json", "--control", &ctl_s])
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let st: Value = serde_json::from_slice(&st.stdout).unwrap();
    let table = Command::new(BIN)
        .args(["status", "--control", &ctl_s])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout).to_string();
    assert!(table.contains("down"), "{table}");
    let c1 = &st["channels"][1];
    assert_eq!(c1["state"], "down", "{table}");
    assert_eq!(c1["in_rx_set"], false, "{table}");
    assert!(c1["state_changes"].as_u64().unwrap() >= 1);
    assert!(st["rx_epoch"].as_u64().unwrap() >= 1, "{table}");
    assert_eq!(st["channels"][0]["state"], "up");

    let (s, send_log) = finish(send, "sender");
    let (r, sink_log) = finish(sink, "sink");
    let sent = s["packets"].as_u64().unwrap();
    let got = r["packets"].as_u64().unwrap();
    assert_eq!(
        r["end_seen"], true,
        "the end of the run arrived after the failure"
    );
    assert_eq!(r["duplicates"], 0);
    assert_eq!(r["out_of_order"], 0);
    // Only what was on channel 1 between the failure and the switch may be lost.
    assert!(got * 10 > sent * 9, "got {got} of {sent}");
    assert!(sink_log.contains("channel 1 (ch1) down"), "{sink_log}");
    assert!(send_log.contains("-> [0, 2]"), "{send_log}");
    assert!(!ctl.exists(), "control socket removed at exit");
}

#[test]
fn silent_peer_and_bad_config_errors_are_clear() {
    let e = ends(2);
    let out = Command::new(BIN)
        .arg("bench")
        .arg("send")
        .args(&e.a_args)
        .args(["--peer-timeout", "300ms", "--count", "10"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("never answered") && err.contains("same key"),
        "{err}"
    );

    let cfg = tmp("bad.toml");
    std::fs::write(
        &cfg,
        "[session]\nkey = \"0X9vg6gGoIsuUnuVh9Q41C0d5zENqadrCWYNpq6589U=\"\ndead_after = \"10ms\"\n[[channel]]\nlocal = \"127.0.0.1:1\"\nremote = \"127.0.0.1:2\"\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["bench", "send", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(cfg.to_str().unwrap()) && err.contains("session.dead_after"),
        "{err}"
    );
    let _ = std::fs::remove_file(&cfg);
}
