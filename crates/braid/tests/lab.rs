//! The namespace testbed end to end: `braid lab up`, traffic across the emulated links,
//! `braid lab down`. Needs root, iproute2, ping and iperf3; says why when it skips.

use std::process::Command;

mod common;

/// The tests of this file share one lab (the `brl-*` namespaces): one at a time.
static LAB: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn lab_lock() -> std::sync::MutexGuard<'static, ()> {
    LAB.lock().unwrap_or_else(|e| e.into_inner())
}

fn braid(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_braid"))
        .args(args)
        .output()
        .expect("run braid")
}

fn skip_reason() -> Option<String> {
    common::lab_skip_reason()
}

fn in_ns(ns: &str, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .output()
        .expect("ip netns exec");
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ping_avg_ms(dst: &str, src: &str) -> f64 {
    let out = in_ns(
        "brl-a",
        &["ping", "-q", "-c", "10", "-i", "0.05", "-I", src, dst],
    );
    // rtt min/avg/max/mdev = 20.4/20.6/21.0/0.1 ms
    let line = out
        .lines()
        .find(|l| l.contains("min/avg/max"))
        .expect("ping summary");
    let nums = line.split('=').nth(1).unwrap().trim();
    nums.split('/').nth(1).unwrap().parse().unwrap()
}

fn iperf(args: &[&str]) -> serde_json::Value {
    let mut v = vec!["iperf3", "-J"];
    v.extend_from_slice(args);
    serde_json::from_str(&in_ns("brl-a", &v)).expect("iperf3 JSON")
}

struct Down;
impl Drop for Down {
    fn drop(&mut self) {
        let _ = braid(&["lab", "down"]);
    }
}

#[test]
fn lab_links_have_their_rate_delay_and_loss() {
    if let Some(why) = skip_reason() {
        common::skip("lab_links_have_their_rate_delay_and_loss", &why);
        return;
    }
    let _one = lab_lock();
    let _ = braid(&["lab", "down"]);
    let up = braid(&["lab", "up", "--links", "40mbit/10ms,20mbit/30ms/ge:5%:3"]);
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let _down = Down;

    // Delay: RTT = 2 × one-way delay, a few ms above it at most (the emulator runs late
    // on a loaded host: 62.9 ms for 60 in a fresh-clone CI run here).
    let rtt0 = ping_avg_ms("10.202.0.1", "10.201.0.1");
    let rtt1 = ping_avg_ms("10.202.1.1", "10.201.1.1");
    assert!(
        (20.0..24.0).contains(&rtt0),
        "link 0 RTT {rtt0} ms, want ~20"
    );
    assert!(
        (60.0..65.0).contains(&rtt1),
        "link 1 RTT {rtt1} ms, want ~60"
    );
    // Routing by source: link 1's address reaches the server's link-0 address over link 1.
    let cross = ping_avg_ms("10.202.0.1", "10.201.1.1");
    assert!(
        (60.0..65.0).contains(&cross),
        "source-routed RTT {cross} ms, want ~60"
    );

    // IPv6: every link carries it too, through the same emulator (delay) and loss.
    // First the neighbours are found (IPv6 neighbour discovery on each hop: the first
    // pings wait for it, 836 ms on average in one CI run), then the delay measured.
    let _ = Command::new("ip")
        .args([
            "netns", "exec", "brl-a", "ping", "-c", "3", "-i", "0.2", "-W", "2",
        ])
        .args(["-I", "fd00:201:1::1", "fd00:202:1::1"])
        .output();
    let rtt6 = ping_avg_ms("fd00:202:1::1", "fd00:201:1::1");
    assert!(
        (60.0..65.0).contains(&rtt6),
        "link 1 RTT over IPv6 {rtt6} ms, want ~60"
    );

    // Rate: TCP on link 0 gets close to its tbf rate.
    let _srv = Command::new("ip")
        .args(["netns", "exec", "brl-b", "iperf3", "-s", "-D", "-p", "5301"])
        .status();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let tcp = iperf(&[
        "-c",
        "10.202.0.1",
        "-B",
        "10.201.0.1",
        "-p",
        "5301",
        "-t",
        "3",
        "-C",
        "cubic",
    ]);
    let bps = tcp["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap();
    // Close to the rate, never above it: 0.85-0.95 of it as a rule. Here it got 0.64-0.84
    // for hours while the host's default congestion control had been set to bbr (which
    // new namespaces inherit); back to cubic it passed again. The bound leaves room.
    assert!(
        bps > 0.65 * 40e6 && bps < 40e6,
        "TCP on a 40 Mbit/s link: {bps}"
    );

    // Loss: bursty 5 % on link 1, client to server, in either family.
    for (dst, src) in [
        ("10.202.1.1", "10.201.1.1"),
        ("fd00:202:1::1", "fd00:201:1::1"),
    ] {
        let udp = iperf(&[
            "-c", dst, "-B", src, "-p", "5301", "-u", "-b", "4M", "-t", "3", "-l", "1000",
        ]);
        let lost = udp["end"]["sum"]["lost_percent"].as_f64().unwrap();
        assert!(
            (2.0..9.0).contains(&lost),
            "UDP loss from {src} on a 5 % link: {lost} %"
        );
    }

    // `lab change`: link 0's delay and rate while the lab runs, then down and up.
    let change = |to: &str| {
        let out = braid(&["lab", "change", "0", to]);
        assert!(
            out.status.success(),
            "lab change 0 {to}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The emulator looks at its control file every 50 ms.
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    change("10mbit/25ms");
    let rtt = ping_avg_ms("10.202.0.1", "10.201.0.1");
    // A few ms more than 50 at most: the emulator runs late on a loaded machine.
    assert!(
        (49.5..57.0).contains(&rtt),
        "changed RTT {rtt} ms, want ~50"
    );
    let tbf = in_ns("brl-r", &["tc", "qdisc", "show", "dev", "a0"]);
    assert!(tbf.contains("rate 10Mbit"), "{tbf}");
    change("down");
    let dead = Command::new("ip")
        .args([
            "netns", "exec", "brl-a", "ping", "-q", "-c", "3", "-i", "0.1",
        ])
        .args(["-W", "1", "-I", "10.201.0.1", "10.202.0.1"])
        .output()
        .unwrap();
    assert!(!dead.status.success(), "a link that is down answers pings");
    change("up");
    let rtt = ping_avg_ms("10.202.0.1", "10.201.0.1");
    assert!(
        (49.5..57.0).contains(&rtt),
        "RTT after up {rtt} ms, want ~50"
    );
    let bad = braid(&["lab", "change", "7", "down"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("does not exist"));

    let status = braid(&["lab", "status"]);
    assert!(String::from_utf8_lossy(&status.stdout).contains("packets_out"));
    drop(_down);
    let after = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&after.stdout).contains("brl-"),
        "lab down left namespaces"
    );
}

/// `braid lab stream` end to end on two lossy links: a 3-second stream through braid
/// (full reliability, both links; then the best link alone) and through SRT (best
/// link). Needs root, iproute2, ping and srt-live-transmit; says why when it skips.
#[test]
fn lab_stream_compares_braid_and_srt() {
    let test = "lab_stream_compares_braid_and_srt";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        common::skip(test, "not root: network namespaces need CAP_NET_ADMIN");
        return;
    }
    if let Some(why) = common::missing_tool(&[
        ("ip", "iproute2"),
        ("tc", "iproute2"),
        ("ping", "iputils-ping"),
        ("srt-live-transmit", "srt-tools"),
    ]) {
        common::skip(test, &why);
        return;
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        common::skip(test, "/dev/net/tun is missing");
        return;
    }
    let _one = lab_lock();
    let _ = braid(&["lab", "down"]);
    let _down = Down;
    let out = braid(&[
        "lab",
        "stream",
        "--links",
        "40mbit/5ms/2%,20mbit/20ms/2%",
        "--duration",
        "3s",
        "--tolerance",
        "50,0,0",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let runs = v["runs"].as_array().expect("runs");
    let names: Vec<&str> = runs.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names[0] == "braid (50,0,0)" && names[1] == "braid (50,0,0), 1 link");
    assert!(names[2].starts_with("SRT, latency "), "{names:?}");
    // 8 Mbit/s of 1316-byte records for 3 s.
    let expect = 8e6 * 3.0 / (1316.0 * 8.0);
    for r in runs {
        let name = r["name"].as_str().unwrap();
        let sent = r["sent"].as_f64().unwrap();
        assert!((sent - expect).abs() < 0.02 * expect, "{name}: sent {sent}");
        assert_eq!(
            (r["duplicates"].as_u64(), r["corrupt"].as_u64()),
            (Some(0), Some(0))
        );
        // Every path has at least 5 ms of one-way delay.
        let lat = &r["latency_ms"];
        let (p50, max) = (lat["p50"].as_f64().unwrap(), lat["max"].as_f64().unwrap());
        assert!(p50 >= 5.0 && max < 3000.0 && p50 <= max, "{name}: {lat}");
        // 2 % loss on every link: each protocol had losses to repair, and did.
        assert!(r["link_drops"].as_u64().unwrap() > 0, "{name}: no loss");
        assert!(r["retransmitted"].as_u64().unwrap() > 0, "{name}: {r}");
    }
    // Full reliability without a deadline: everything, in order.
    for r in &runs[..2] {
        assert_eq!(r["delivered"], r["sent"], "{}", r["name"]);
        assert_eq!(r["reordered"].as_u64(), Some(0));
    }
    // SRT repairs within its latency; a packet whose repairs miss it is dropped.
    let srt = &runs[2];
    assert!(srt["delivered_pct"].as_f64().unwrap() > 98.0, "{srt}");
    let budget = srt["detail"]["latency_ms"].as_f64().unwrap();
    let p50 = srt["latency_ms"]["p50"].as_f64().unwrap();
    assert!(
        p50 >= 0.8 * budget,
        "SRT p50 {p50} ms below its latency {budget} ms"
    );
    drop(_down);
}

/// `braid lab bench` with an IPv6 link (`/v6`): the link alone, the ceiling and the
/// tunnel's channel on it all use IPv6, and the bond of an IPv4 and an IPv6 channel
/// carries one TCP flow over both (issue 30: a bond mixing the two families).
#[test]
fn lab_bench_bonds_an_ipv4_and_an_ipv6_channel() {
    if let Some(why) = skip_reason() {
        common::skip("lab_bench_bonds_an_ipv4_and_an_ipv6_channel", &why);
        return;
    }
    let _one = lab_lock();
    let _ = braid(&["lab", "down"]);
    let out = braid(&[
        "lab",
        "bench",
        "--links",
        "20mbit/5ms,20mbit/5ms/v6",
        "--duration",
        "3s",
        "--modes",
        "seq",
        "--no-mptcp",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bench JSON");
    let alone6 = v["links"][1]["tcp_bps"].as_f64().unwrap();
    assert!(
        alone6 > 0.6 * 20e6,
        "TCP over the IPv6 link alone: {alone6}"
    );
    let sum = v["sum_bps"].as_f64().unwrap();
    let bond = v["braid"]["seq"]["tcp_bps"].as_f64().unwrap();
    // Loose: the machine running the tests is loaded; the figure itself is measured
    // with the full bench (docs/lab.md).
    assert!(bond > 0.5 * sum, "the bond {bond} of a sum of {sum}");
    let channels = v["braid"]["seq"]["sender_status"]["channels"]
        .as_array()
        .expect("the sender's channels");
    assert_eq!(channels[0]["local"], "10.201.0.1:7100");
    assert_eq!(channels[1]["local"], "[fd00:201:1::1]:7101");
    let data = |c: &serde_json::Value| c["tx_data_packets"].as_f64().unwrap();
    let (d0, d1) = (data(&channels[0]), data(&channels[1]));
    assert!(
        d1 > 0.3 * (d0 + d1),
        "the IPv6 channel carried {d1} of {} data packets",
        d0 + d1
    );
}
