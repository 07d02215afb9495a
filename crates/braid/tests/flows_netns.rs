//! Real-time flows on real sockets (issue 32, item 3): a call-like UDP flow through the
//! tunnel (200-byte packets, 50 a second, which the automatic flow policy sends
//! `redundant`) between two namespaces joined by two veth pairs; one channel is
//! blackholed (iptables drops it both ways) for the middle of the call. Every packet
//! arrives, and the receiving application sees each one once: the copies that came on
//! both channels were deduplicated. With `flow_auto = false` (the call striped with the
//! bond) the packets on the blackholed channel before it is declared down are lost,
//! which this test would catch. Needs root, /dev/net/tun, `ip`, `iptables` and
//! python3; without them it says why it is skipped and passes. About 10 s.

use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
use common::{blackhole, status, Ends};

fn skip_reason() -> Option<String> {
    common::netns_skip_reason(
        "network namespaces, a TUN device and iptables",
        &[("ip", "iproute2"), ("iptables", "iptables")],
        Some("used as the call's sender and receiver"),
    )
}

/// Receives the call on 10.78.0.2:5004 until 2 s of silence; prints how many packets
/// arrived, how many distinct ones, and the largest number seen.
const RECEIVER: &str = r#"
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("10.78.0.2", 5004)); s.settimeout(15)
seen = set(); n = 0
try:
    while True:
        b = s.recv(2048); n += 1; seen.add(int.from_bytes(b[:4], "big")); s.settimeout(2)
except socket.timeout:
    pass
print(n, len(seen), max(seen) if seen else -1)
"#;

/// Sends the call: 400 packets of 172 bytes of UDP payload (200 bytes of IP), one
/// every 20 ms, numbered from 0.
const SENDER: &str = r#"
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
t = time.monotonic()
for i in range(400):
    s.sendto(i.to_bytes(4, "big") + bytes(168), ("10.78.0.2", 5004))
    t += 0.02
    time.sleep(max(0.0, t - time.monotonic()))
print("sent")
"#;

/// Run python script `b_script` in namespace `nb`, then (300 ms later) `a_script` in
/// `na`; `before` seconds after, blackhole the channel of veth pair `dev` (A's, B's)
/// both ways for `during` seconds. Returns the two scripts' output (A's, B's).
fn across_a_blackhole(
    na: &str,
    nb: &str,
    dev: &(String, String),
    a_script: &str,
    b_script: &str,
    before: u64,
    during: u64,
) -> (std::process::Output, std::process::Output) {
    let py = |ns: &str, script: &str| {
        Command::new("ip")
            .args(["netns", "exec", ns, "python3", "-c", script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let b = py(nb, b_script);
    std::thread::sleep(Duration::from_millis(300));
    let a = py(na, a_script);
    std::thread::sleep(Duration::from_secs(before));
    blackhole(nb, &dev.1, "-A");
    blackhole(na, &dev.0, "-A");
    std::thread::sleep(Duration::from_secs(during));
    blackhole(nb, &dev.1, "-D");
    blackhole(na, &dev.0, "-D");
    (a.wait_with_output().unwrap(), b.wait_with_output().unwrap())
}

/// Two tunnel ends (tunnel addresses 10.78.0.1 and 10.78.0.2); `rules` goes into both
/// ends' `[session]` (`[[session.flow]]` tables).
fn up(tag: &str, rules: &str) -> Ends {
    let net = if tag.is_empty() { 202 } else { 203 };
    common::two_ends("flows", tag, net, "10.78.0", rules)
}

#[test]
fn a_redundant_call_survives_a_blackholed_channel_and_arrives_once() {
    if let Some(why) = skip_reason() {
        common::skip(
            "a_redundant_call_survives_a_blackholed_channel_and_arrives_once",
            &why,
        );
        return;
    }
    let Ends {
        _lab,
        na,
        nb,
        ca,
        cb,
        devs,
    } = up("", "");
    // From 2 s to 6 s of the 8 s call, channel 0 is a black hole both ways.
    let (sent, got) = across_a_blackhole(&na, &nb, &devs[0], SENDER, RECEIVER, 2, 4);
    assert!(
        sent.status.success(),
        "sender: {}",
        String::from_utf8_lossy(&sent.stderr)
    );
    let out = String::from_utf8_lossy(&got.stdout).trim().to_string();
    let n: Vec<i64> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
    assert_eq!(
        n,
        [400, 400, 399],
        "packets received, distinct, highest number: every packet once ({})",
        String::from_utf8_lossy(&got.stderr)
    );
    // Channel 0 went down while it was blackholed (so the call had to survive on the
    // other copy), and both ends are healthy after.
    for ctl in [&ca, &cb] {
        let s = status(ctl).unwrap();
        assert_eq!(s["auth_failures"], 0, "{s}");
        let c0 = &s["channels"][0];
        assert!(c0["state_changes"].as_u64().unwrap_or(0) >= 1, "{c0}");
    }
    // The call went redundant, and the receiving end dropped the second copies: those
    // of the packets sent while both channels carried them (before and after the black
    // hole, about 200 of the 400).
    let (a, b) = (status(&ca).unwrap(), status(&cb).unwrap());
    assert!(a["flows_tx_redundant"].as_u64().unwrap() >= 400, "{a}");
    assert!(b["flows_rx_delivered"].as_u64().unwrap() >= 400, "{b}");
    let dups = b["flows_rx_duplicates"].as_u64().unwrap();
    assert!((100..400).contains(&dups), "{b}");
}

/// Echoes on 10.78.0.2:2222 whatever one connection sends, until it closes.
const ECHO: &str = r#"
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.78.0.2", 2222)); s.listen(1); s.settimeout(15)
c, _ = s.accept(); c.settimeout(15)
while True:
    b = c.recv(4096)
    if not b:
        break
    c.sendall(b)
c.close()
print("done")
"#;

/// A remote shell's pattern: 300 messages of 40 bytes, one every 20 ms, each echoed
/// before the next; prints how many echoes matched.
const TYPIST: &str = r#"
import socket, time
c = socket.create_connection(("10.78.0.2", 2222), timeout=15)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
ok = 0
for i in range(300):
    m = i.to_bytes(4, "big") + bytes(36)
    c.sendall(m)
    got = b""
    while len(got) < len(m):
        got += c.recv(len(m) - len(got))
    ok += got == m
    time.sleep(0.02)
c.close()
print(ok)
"#;

/// A small TCP flow (a remote shell's keystrokes and echoes) that a rule sends
/// `lowest-delay` goes on the lowest-delay channel in its own ordered domain, both
/// ways, handshake and close included, while channel 0 is blackholed for two seconds in
/// the middle: every echo comes back right, and both ends sent it as flow datagrams.
#[test]
fn a_small_tcp_flow_crosses_on_the_lowest_delay_channel_through_a_blackhole() {
    if let Some(why) = skip_reason() {
        common::skip(
            "a_small_tcp_flow_crosses_on_the_lowest_delay_channel_through_a_blackhole",
            &why,
        );
        return;
    }
    let rule = "[[session.flow]]\npolicy = \"lowest-delay\"\nprotocol = \"tcp\"\nport = 2222\n";
    let Ends {
        _lab,
        na,
        nb,
        ca,
        cb,
        devs,
    } = up("t", rule);
    let (typed, echoed) = across_a_blackhole(&na, &nb, &devs[0], TYPIST, ECHO, 2, 2);
    assert_eq!(
        String::from_utf8_lossy(&typed.stdout).trim(),
        "300",
        "every echo right: {} {}",
        String::from_utf8_lossy(&typed.stderr),
        String::from_utf8_lossy(&echoed.stderr)
    );
    let (a, b) = (status(&ca).unwrap(), status(&cb).unwrap());
    for s in [&a, &b] {
        // 300 messages each way, plus the handshake and the close.
        assert!(s["flows_tx_lowest_delay"].as_u64().unwrap() >= 300, "{s}");
        assert!(s["flows_rx_delivered"].as_u64().unwrap() >= 300, "{s}");
        assert_eq!(s["flows_tx_redundant"], 0, "{s}");
    }
}
