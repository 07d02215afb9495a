//! TCP carried as byte streams on real sockets (issue 32, item 1): two namespaces
//! joined by two veth pairs, a tunnel at each end with the default settings (every channel paced, so `tcp_streams` is on), and TCP
//! connections from A's applications to B's through it. Each semantic a user relies on
//! has a test: bytes both ways and half-close, a refused connection, a reset, a
//! connection that outlives a channel's failure; and every one of them went as a
//! stream (the ends' counters), not as packets. Needs root, /dev/net/tun, `ip`,
//! `iptables` and python3; without them each test says why it is skipped and passes.

use std::time::Duration;

mod common;
use common::{blackhole, py, status, text, Ends, ECHO_SUM, SEND_SUM};

fn skip_reason() -> Option<String> {
    common::netns_skip_reason(
        "network namespaces, a TUN device and iptables",
        &[("ip", "iproute2"), ("iptables", "iptables")],
        Some("used as the TCP applications"),
    )
}

/// Two tunnel ends with the defaults (`tcp_streams` on); tunnel addresses 10.79.0.1 (A) and
/// 10.79.0.2 (B).
fn up(tag: &str, net: u8) -> Ends {
    // The defaults: every channel is paced, so TCP crosses as streams.
    common::two_ends("st", tag, net, "10.79.0", "")
}

/// The streams counters of both ends went up for `n` connections: taken at A,
/// connected at B.
fn assert_streams(e: &Ends, n: u64) {
    let (a, b) = (status(&e.ca).unwrap(), status(&e.cb).unwrap());
    assert!(a["streams_opened"].as_u64().unwrap() >= n, "A: {a}");
    assert!(b["streams_connected"].as_u64().unwrap() >= n, "B: {b}");
}

#[test]
fn a_connection_crosses_as_a_stream_both_ways_with_half_close() {
    if let Some(why) = skip_reason() {
        common::skip(
            "a_connection_crosses_as_a_stream_both_ways_with_half_close",
            &why,
        );
        return;
    }
    let e = up("h", 204);
    let server = py(&e.nb, ECHO_SUM, &["10.79.0.2"]);
    std::thread::sleep(Duration::from_millis(300));
    let client = py(&e.na, SEND_SUM, &["10.79.0.2", "8000000"])
        .wait_with_output()
        .unwrap();
    let server = server.wait_with_output().unwrap();
    assert_eq!(text(&client), "ok", "server: {}", text(&server));
    // The server saw the client's own address: the far end connected from it.
    assert_eq!(text(&server), "10.79.0.1");
    assert_streams(&e, 1);
}

#[test]
fn a_refused_connection_is_refused_not_accepted_then_reset() {
    if let Some(why) = skip_reason() {
        common::skip(
            "a_refused_connection_is_refused_not_accepted_then_reset",
            &why,
        );
        return;
    }
    let e = up("r", 205);
    // Nothing listens on 5002 at B. A connection accepted at A and reset later would
    // connect first; it must fail in connect().
    let script = r#"
import socket
try:
    socket.create_connection(("10.79.0.2", 5002), timeout=10); print("connected")
except ConnectionRefusedError: print("refused")
except OSError as e: print("error", e)
"#;
    let out = py(&e.na, script, &[]).wait_with_output().unwrap();
    assert_eq!(text(&out), "refused");
    let a = status(&e.ca).unwrap();
    assert!(a["streams_refused"].as_u64().unwrap() >= 1, "A: {a}");
}

#[test]
fn a_reset_at_the_far_end_reaches_the_client_as_a_reset() {
    if let Some(why) = skip_reason() {
        common::skip("a_reset_at_the_far_end_reaches_the_client_as_a_reset", &why);
        return;
    }
    let e = up("x", 206);
    // B reads a little, then closes with SO_LINGER 0: a RST.
    let server = r#"
import socket, struct
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("10.79.0.2", 5003)); l.listen(1); l.settimeout(30)
c, _ = l.accept(); c.recv(100)
c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)); c.close()
print("reset sent")
"#;
    let client = r#"
import socket, time
s = socket.create_connection(("10.79.0.2", 5003), timeout=10)
s.sendall(b"hello")
try:
    t = time.monotonic()
    while time.monotonic() - t < 10:
        if not s.recv(100): print("eof"); break
    else: print("nothing")
except ConnectionResetError: print("reset")
"#;
    let server = py(&e.nb, server, &[]);
    std::thread::sleep(Duration::from_millis(300));
    let out = py(&e.na, client, &[]).wait_with_output().unwrap();
    let server = server.wait_with_output().unwrap();
    assert_eq!(text(&out), "reset", "server: {}", text(&server));
    assert_streams(&e, 1);
}

#[test]
fn a_connection_outlives_a_channel_failure() {
    if let Some(why) = skip_reason() {
        common::skip("a_connection_outlives_a_channel_failure", &why);
        return;
    }
    let e = up("f", 207);
    let server = py(&e.nb, ECHO_SUM, &["10.79.0.2"]);
    std::thread::sleep(Duration::from_millis(300));
    // 6 MB at 1 MB/s; channel 0 a black hole both ways from 1.5 s to 4 s.
    let client = py(&e.na, SEND_SUM, &["10.79.0.2", "6000000", "1000000"]);
    std::thread::sleep(Duration::from_millis(1500));
    let dev = &e.devs[0];
    blackhole(&e.nb, &dev.1, "-A");
    blackhole(&e.na, &dev.0, "-A");
    std::thread::sleep(Duration::from_millis(2500));
    blackhole(&e.nb, &dev.1, "-D");
    blackhole(&e.na, &dev.0, "-D");
    let client = client.wait_with_output().unwrap();
    let server = server.wait_with_output().unwrap();
    assert_eq!(text(&client), "ok", "server: {}", text(&server));
    assert_streams(&e, 1);
    let a = status(&e.ca).unwrap();
    assert!(
        a["channels"][0]["state_changes"].as_u64().unwrap_or(0) >= 1,
        "channel 0 went down while blackholed: {a}"
    );
}

#[test]
fn a_destination_the_far_end_does_not_allow_is_refused() {
    if let Some(why) = skip_reason() {
        common::skip("a_destination_the_far_end_does_not_allow_is_refused", &why);
        return;
    }
    // B connects the peer's streams only to 192.0.2.0/24: its own 10.79.0.2:5001,
    // where a server listens, is not allowed.
    let e = common::two_ends(
        "st",
        "n",
        208,
        "10.79.0",
        "tcp_streams = true\ntcp_streams_to = [\"192.0.2.0/24\"]\n",
    );
    let mut server = py(&e.nb, ECHO_SUM, &["10.79.0.2"]);
    std::thread::sleep(Duration::from_millis(300));
    let script = r#"
import socket
try:
    socket.create_connection(("10.79.0.2", 5001), timeout=10); print("connected")
except ConnectionRefusedError: print("refused")
except OSError as e: print("error", e)
"#;
    let out = py(&e.na, script, &[]).wait_with_output().unwrap();
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(text(&out), "refused");
    let (a, b) = (status(&e.ca).unwrap(), status(&e.cb).unwrap());
    assert!(b["streams_refused"].as_u64().unwrap() >= 1, "B: {b}");
    assert_eq!(b["streams_connected"], 0, "B: {b}");
    assert!(a["streams_refused"].as_u64().unwrap() >= 1, "A: {a}");
}

#[test]
fn a_port_in_tcp_streams_except_crosses_as_packets() {
    if let Some(why) = skip_reason() {
        common::skip("a_port_in_tcp_streams_except_crosses_as_packets", &why);
        return;
    }
    // A does not terminate connections to or from port 5001 (B's server's): the
    // connection crosses as packets, intact, and no stream is opened.
    let e = common::two_ends(
        "st",
        "e",
        209,
        "10.79.0",
        "tcp_streams_except = [22, \"5000-5010\"]\n",
    );
    let server = py(&e.nb, ECHO_SUM, &["10.79.0.2"]);
    std::thread::sleep(Duration::from_millis(300));
    let client = py(&e.na, SEND_SUM, &["10.79.0.2", "2000000"])
        .wait_with_output()
        .unwrap();
    let server = server.wait_with_output().unwrap();
    assert_eq!(text(&client), "ok", "server: {}", text(&server));
    let (a, b) = (status(&e.ca).unwrap(), status(&e.cb).unwrap());
    assert_eq!(a["streams_opened"], 0, "A: {a}");
    assert_eq!(b["streams_connected"], 0, "B: {b}");
    assert!(a["delivered_packets"].as_u64().unwrap() > 100, "A: {a}");
}
