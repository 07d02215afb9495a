//! Issue 30: a client behind a NAT (iptables MASQUERADE in a namespace between it and
//! the server) reaches a server that knows no client address; the NAT's outside
//! address changes (as a modem's public address does) and traffic flows again within
//! a second, and a TCP connection open across the change (carried as a stream of the
//! session, the default) goes on and delivers every byte; an attacker's forged and
//! replayed datagrams from another address never move the server's endpoint (issue 32:
//! a connection survives a NAT rebinding). Needs root, /dev/net/tun, `ip`, `iptables`, `ping`
//! and python3; without them the test says why it is skipped. Namespaces are removed
//! on every exit path.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::{ping_until, sh, status, Lab};

fn skip_reason() -> Option<String> {
    common::netns_skip_reason(
        "network namespaces, a TUN device, iptables",
        &[
            ("ip", "iproute2"),
            ("iptables", "iptables"),
            ("ping", "iputils-ping"),
        ],
        Some("captures and replays a datagram"),
    )
}

const KEY: &str = "AyHDMTOweHmwGSs7vubt5lmmRKjx62UXkWxeQzJRXms=";

fn config(tun_addr: &str, ctl: &Path, chans: &str) -> String {
    format!(
        "[tunnel]\nname = \"braidn\"\naddress = \"{tun_addr}\"\ncontrol = \"{}\"\n\n[session]\nkey = \"{KEY}\"\nheartbeat = \"20ms\"\ndead_after = \"200ms\"\n{chans}",
        ctl.display()
    )
}

/// In the NAT's namespace: capture one sealed datagram the client sends to the
/// server's channel port (after the NAT), then, from another port of the NAT's
/// address, replay it 20 times and send a forged sealed datagram and a forged
/// handshake initiation.
const ATTACK: &str = r#"
import os, socket, struct, sys, time
dev, server, port, src = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
# ETH_P_ALL: a socket for one protocol does not see what the NAT sends out.
cap = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003))
cap.bind((dev, 0)); cap.settimeout(5)
end = time.time() + 5
while True:
    if time.time() > end: sys.exit("no sealed datagram to the server seen")
    fr = cap.recv(65535)
    f = fr[14:]
    if fr[12:14] != b"\x08\x00" or f[9] != 17: continue
    u = f[(f[0] & 15) * 4:]
    if struct.unpack("!H", u[2:4])[0] == port and u[8] == 0xB8:
        payload = bytes(u[8:]); break
time.sleep(0.05)  # the genuine one is taken first
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((src, 0))
for _ in range(20):
    s.sendto(payload, (server, port))
# A counter far ahead (not a replay), the tag no longer matching.
forged = bytearray(payload); forged[6:10] = (1 << 30).to_bytes(4, "big"); forged[-1] ^= 1
s.sendto(bytes(forged), (server, port))
s.sendto(bytes([0xBA]) + os.urandom(191), (server, port))
print(s.getsockname()[1])
"#;

#[test]
fn a_client_behind_nat_is_followed_when_its_mapping_changes_and_spoofs_do_not_move_it() {
    let test = "a_client_behind_nat_is_followed_when_its_mapping_changes_and_spoofs_do_not_move_it";
    if let Some(why) = skip_reason() {
        common::skip(test, &why);
        return;
    }
    let id = std::process::id() % 100_000;
    let (nc, nn, ns) = (
        format!("bfc{id}field"),
        format!("bfn{id}field"),
        format!("bfs{id}field"),
    );
    let dir = std::env::temp_dir().join(format!("braid-nat-field-{id}"));
    let mut lab = Lab::new(dir.clone());
    for n in [&nc, &nn, &ns] {
        lab.add_ns(n);
    }
    // client 10.210.0.2 -- 10.210.0.1 NAT 10.220.0.1 -- 10.220.0.2 server. The
    // server has no route to the client's network: only the NAT's address reaches it.
    let (ci, ni) = (format!("bfc{id}i"), format!("bfn{id}i"));
    let (no, so) = (format!("bfn{id}o"), format!("bfs{id}o"));
    common::veth(&nc, &ci, "10.210.0.2/24", &nn, &ni, "10.210.0.1/24");
    common::veth(&nn, &no, "10.220.0.1/24", &ns, &so, "10.220.0.2/24");
    sh(&[
        "ip",
        "-n",
        &nc,
        "route",
        "add",
        "default",
        "via",
        "10.210.0.1",
    ]);
    sh(&[
        "ip",
        "netns",
        "exec",
        &nn,
        "sysctl",
        "-qw",
        "net.ipv4.ip_forward=1",
    ]);
    sh(&[
        "ip",
        "netns",
        "exec",
        &nn,
        "iptables",
        "-t",
        "nat",
        "-A",
        "POSTROUTING",
        "-o",
        &no,
        "-j",
        "MASQUERADE",
    ]);

    // The server waits on fixed ports and knows no client address; the client
    // names the server and no local address (one channel leaves it out, the other
    // gives 0.0.0.0:0).
    let (cc, cs) = (dir.join("c.sock"), dir.join("s.sock"));
    let server_chans = "\n[[channel]]\nname = \"lte\"\nlocal = \"10.220.0.2:7000\"\n\n[[channel]]\nname = \"dsl\"\nlocal = \"10.220.0.2:7001\"\n";
    let client_chans = "\n[[channel]]\nname = \"lte\"\nremote = \"10.220.0.2:7000\"\n\n[[channel]]\nname = \"dsl\"\nlocal = \"0.0.0.0:0\"\nremote = \"10.220.0.2:7001\"\n";
    common::write_private(
        &dir.join("c.toml"),
        &config("10.78.0.1/24", &cc, client_chans),
    );
    common::write_private(
        &dir.join("s.toml"),
        &config("10.78.0.2/24", &cs, server_chans),
    );
    let tunnel = |n: &str, cfg: &str| common::start_tunnel(n, &dir.join(cfg));
    lab.children.push(tunnel(&ns, "s.toml"));
    lab.children.push(tunnel(&nc, "c.toml"));

    let t0 = Instant::now();
    while ![&cc, &cs]
        .iter()
        .all(|c| status(c).is_some_and(|s| s["peer_seen"] == true))
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the tunnels did not come up: server {:?}",
            status(&cs)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The server learnt each channel's NAT mapping.
    let remotes = |s: &Value| -> Vec<String> {
        s["channels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["remote"].as_str().unwrap().to_string())
            .collect()
    };
    let s = status(&cs).unwrap();
    let before = remotes(&s);
    for r in &before {
        assert!(r.starts_with("10.220.0.1:"), "{before:?}");
    }
    // Both ways through the tunnel, the server's way only through the mapping.
    ping_until(&nc, "10.78.0.2", Duration::from_secs(3));
    ping_until(&ns, "10.78.0.1", Duration::from_secs(3));

    // A TCP connection from the client's side to a server behind the server's tunnel
    // address runs across the change: 4 MB at 1 MB/s, checked end to end.
    let sink = common::py(&ns, common::ECHO_SUM, &["10.78.0.2"]);
    std::thread::sleep(Duration::from_millis(300));
    let source = common::py(&nc, common::SEND_SUM, &["10.78.0.2", "4000000", "1000000"]);
    std::thread::sleep(Duration::from_millis(1000));

    // The NAT's outside address changes: its old mappings go (MASQUERADE forgets
    // them with the address) and the client's next datagrams leave from the new one.
    sh(&["ip", "-n", &nn, "addr", "del", "10.220.0.1/24", "dev", &no]);
    sh(&["ip", "-n", &nn, "addr", "add", "10.220.0.3/24", "dev", &no]);
    let back = ping_until(&ns, "10.78.0.1", Duration::from_secs(5));
    assert!(
        back < Duration::from_secs(1),
        "traffic from the server flowed again only {back:?} after the NAT's address changed"
    );
    ping_until(&nc, "10.78.0.2", Duration::from_secs(1));
    let s = status(&cs).unwrap();
    let after = remotes(&s);
    for (i, c) in s["channels"].as_array().unwrap().iter().enumerate() {
        assert!(after[i].starts_with("10.220.0.3:"), "{after:?}");
        assert_eq!(c["endpoint_changes"], 1, "{c}");
        assert_eq!(c["state"], "up", "{c}");
    }

    // The connection went on: every byte arrived, both ways, over one stream.
    let source = source.wait_with_output().unwrap();
    let sink = sink.wait_with_output().unwrap();
    assert_eq!(
        common::text(&source),
        "ok",
        "server: {}",
        common::text(&sink)
    );
    assert_eq!(common::text(&sink), "10.78.0.1");
    let c = status(&cc).unwrap();
    assert_eq!(c["streams_opened"], 1, "{c}");
    assert_eq!(c["streams_reset"], 0, "{c}");

    // An attacker at the NAT's address (another port) replays a captured datagram,
    // forges one and forges a handshake initiation: the endpoint stays.
    let replays0 = s["channels"][0]["replays"].as_u64().unwrap();
    let implausible0 = s["channels"][0]["rx_implausible"].as_u64().unwrap();
    let attack = Command::new("ip")
        .args(["netns", "exec", &nn, "python3", "-c", ATTACK, &no])
        .args(["10.220.0.2", "7000", "10.220.0.3"])
        .output()
        .unwrap();
    assert!(
        attack.status.success(),
        "attacker: {}",
        String::from_utf8_lossy(&attack.stderr)
    );
    let port = String::from_utf8_lossy(&attack.stdout).trim().to_string();
    std::thread::sleep(Duration::from_millis(200));
    let s = status(&cs).unwrap();
    let c0 = &s["channels"][0];
    assert_eq!(
        remotes(&s),
        after,
        "an unauthenticated datagram moved the endpoint"
    );
    assert!(!after[0].ends_with(&format!(":{port}")));
    assert_eq!(c0["endpoint_changes"], 1, "{c0}");
    assert!(c0["replays"].as_u64().unwrap() >= replays0 + 20, "{c0}");
    // The forgery's counter is far ahead of the window: dropped before it is queued.
    assert!(
        c0["rx_implausible"].as_u64().unwrap() > implausible0,
        "{c0}"
    );
    ping_until(&ns, "10.78.0.1", Duration::from_secs(1));

    // The move is in the server's log.
    let server = lab.children.remove(0);
    sh(&["kill", "-TERM", &server.id().to_string()]);
    let log = String::from_utf8_lossy(&server.wait_with_output().unwrap().stderr).to_string();
    assert!(
        log.contains(&format!(
            "channel 0 (lte): peer moved {} -> {}",
            before[0], after[0]
        )),
        "{log}"
    );
}
