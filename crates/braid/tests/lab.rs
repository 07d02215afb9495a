//! The namespace testbed end to end: `braid lab up`, traffic across the emulated links,
//! `braid lab down`. Needs root, iproute2, ping and iperf3; says why when it skips.

use std::process::Command;

mod common;

fn braid(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_braid"))
        .args(args)
        .output()
        .expect("run braid")
}

fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root: network namespaces need CAP_NET_ADMIN".into());
    }
    if let Some(why) = common::missing_tool(&[
        ("ip", "iproute2"),
        ("tc", "iproute2"),
        ("ping", "iputils-ping"),
        ("iperf3", "iperf3"),
    ]) {
        return Some(why);
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Some("/dev/net/tun is missing".into());
    }
    None
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
    let _ = braid(&["lab", "down"]);
    let up = braid(&["lab", "up", "--links", "40mbit/10ms,20mbit/30ms/ge:5%:3"]);
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let _down = Down;

    // Delay: RTT = 2 × one-way delay, within about a millisecond.
    let rtt0 = ping_avg_ms("10.202.0.1", "10.201.0.1");
    let rtt1 = ping_avg_ms("10.202.1.1", "10.201.1.1");
    assert!(
        (20.0..22.0).contains(&rtt0),
        "link 0 RTT {rtt0} ms, want ~20"
    );
    assert!(
        (60.0..62.5).contains(&rtt1),
        "link 1 RTT {rtt1} ms, want ~60"
    );
    // Routing by source: link 1's address reaches the server's link-0 address over link 1.
    let cross = ping_avg_ms("10.202.0.1", "10.201.1.1");
    assert!(
        (60.0..62.5).contains(&cross),
        "source-routed RTT {cross} ms, want ~60"
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
    assert!(
        bps > 0.85 * 40e6 && bps < 40e6,
        "TCP on a 40 Mbit/s link: {bps}"
    );

    // Loss: bursty 5 % on link 1, client to server.
    let udp = iperf(&[
        "-c",
        "10.202.1.1",
        "-B",
        "10.201.1.1",
        "-p",
        "5301",
        "-u",
        "-b",
        "4M",
        "-t",
        "3",
        "-l",
        "1000",
    ]);
    let lost = udp["end"]["sum"]["lost_percent"].as_f64().unwrap();
    assert!(
        (2.0..9.0).contains(&lost),
        "UDP loss on a 5 % link: {lost} %"
    );

    let status = braid(&["lab", "status"]);
    assert!(String::from_utf8_lossy(&status.stdout).contains("packets_out"));
    drop(_down);
    let after = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&after.stdout).contains("brl-"),
        "lab down left namespaces"
    );
}
