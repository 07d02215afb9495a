//! The TUN tunnel carrying real TCP between two network namespaces joined by two veth
//! pairs (two channels). Needs root, /dev/net/tun, `ip` and python3; without them the
//! test prints why it is skipped and passes. Namespaces are removed on every exit path.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{sh, status, Lab, BIN};

fn skip_reason() -> Option<String> {
    common::netns_skip_reason(
        "network namespaces and a TUN device",
        &[("ip", "iproute2")],
        Some("used as TCP client and server"),
    )
}

fn config(tun_addr: &str, ctl: &Path, chans: &[(String, String)]) -> String {
    let mut s = format!(
        "[tunnel]\nname = \"braidt\"\naddress = \"{tun_addr}\"\ncontrol = \"{}\"\nlog_interval = \"1s\"\n\n[session]\nmode = \"logical\"\nkey = \"AyHDMTOweHmwGSs7vubt5lmmRKjx62UXkWxeQzJRXms=\"\nheartbeat = \"20ms\"\ndead_after = \"200ms\"\n",
        ctl.display()
    );
    for (i, (l, r)) in chans.iter().enumerate() {
        s += &format!("\n[[channel]]\nname = \"v{i}\"\nlocal = \"{l}\"\nremote = \"{r}\"\n");
    }
    s
}

/// Receives three UDP datagrams on 10.77.0.2:5002; prints their sizes and whether their
/// bytes are the client's.
const UDP_SERVER: &str = r#"
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("10.77.0.2", 5002)); s.settimeout(10)
got = [s.recv(65536) for _ in range(3)]
data = bytes(i % 251 for i in range(2500))
print([len(g) for g in got], b"".join(got) == data)
"#;

/// Sends 2500 bytes as one UDP GSO send (UDP_SEGMENT 1000: datagrams of 1000, 1000, 500).
const UDP_CLIENT: &str = r#"
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_UDP, 103, 1000)
s.sendto(bytes(i % 251 for i in range(2500)), ("10.77.0.2", 5002))
"#;

/// One UDP GSO send from `na` arrives at `nb` through the tunnel as its three datagrams,
/// whole and in order.
fn udp_gso_send_arrives_as_datagrams(na: &str, nb: &str) {
    let server = Command::new("ip")
        .args(["netns", "exec", nb, "python3", "-c", UDP_SERVER])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let client = Command::new("ip")
        .args(["netns", "exec", na, "python3", "-c", UDP_CLIENT])
        .output()
        .unwrap();
    // With UDP segmentation offload on the TUN device (Linux 6.2 and later) the kernel
    // hands this send to braid as one GSO frame, cut in crate::segment; the receiving
    // kernel checks each datagram's checksum (a bad one is dropped: no third datagram).
    assert!(
        client.status.success(),
        "UDP GSO send into the tunnel: {}",
        String::from_utf8_lossy(&client.stderr)
    );
    let out = server.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "[1000, 1000, 500] True",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// From a tunnel's log: how many reads of its TUN device were super-segments it cut.
fn super_segments_cut(log: &str) -> u64 {
    let line = log
        .lines()
        .find(|l| l.contains("packets read from the TUN device in"))
        .unwrap_or_else(|| panic!("no read summary in the log: {log}"));
    let (_, rest) = line.split_once(" reads (").unwrap();
    rest.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn tunnel_carries_tcp_between_namespaces() {
    if let Some(why) = skip_reason() {
        common::skip("tunnel_carries_tcp_between_namespaces", &why);
        return;
    }
    let id = std::process::id() % 100_000;
    let (na, nb) = (format!("brta{id}"), format!("brtb{id}"));
    let dir = std::env::temp_dir().join(format!("braid-netns-{id}"));
    let mut lab = Lab::new(dir.clone());
    for n in [&na, &nb] {
        lab.add_ns(n);
    }
    let mut a_ch = Vec::new();
    let mut b_ch = Vec::new();
    for i in 0..2 {
        let (va, vb) = (format!("bta{id}v{i}"), format!("btb{id}v{i}"));
        let (aa, ab) = (format!("10.201.{i}.1"), format!("10.201.{i}.2"));
        common::veth(&na, &va, &format!("{aa}/24"), &nb, &vb, &format!("{ab}/24"));
        a_ch.push((format!("{aa}:7000"), format!("{ab}:7000")));
        b_ch.push((format!("{ab}:7000"), format!("{aa}:7000")));
    }
    let (ca, cb) = (dir.join("a.sock"), dir.join("b.sock"));
    // Configs that hold the key inline must be private (as a key file).
    common::write_private(&dir.join("a.toml"), &config("10.77.0.1/24", &ca, &a_ch));
    common::write_private(&dir.join("b.toml"), &config("10.77.0.2/24", &cb, &b_ch));
    let tunnel = |ns: &str, cfg: &str| common::start_tunnel(ns, &dir.join(cfg));
    lab.children.push(tunnel(&na, "a.toml"));
    lab.children.push(tunnel(&nb, "b.toml"));

    let t0 = Instant::now();
    loop {
        let up = [&ca, &cb]
            .iter()
            .all(|c| status(c).is_some_and(|s| s["peer_seen"] == true));
        if up {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "tunnels did not come up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let (sent, got) = common::tcp_transfer(&na, &nb, "10.77.0.2");
    assert!(sent.starts_with("8388608 "), "{sent}");
    assert_eq!(sent, got, "TCP stream intact through the tunnel");
    udp_gso_send_arrives_as_datagrams(&na, &nb);

    // Both channels carried the stream's data, and the ACKs came back. The receiving
    // end hands in-order segments to its kernel merged (crate offload), so the kernel
    // acknowledges far less often than once per two segments; and pure ACKs go as flow
    // datagrams on the lowest-delay channel (docs/tunnel.md, "Real-time flows"), as do
    // a stream's ACKs with TCP carried as streams (docs/streams.md), so the ACK
    // direction's channels need not each carry striped packets.
    let mut striped_on_every_channel = 0;
    for ctl in [&ca, &cb] {
        let s = status(ctl).unwrap();
        let chans = s["channels"].as_array().unwrap();
        let mut total =
            s["flows_rx_delivered"].as_u64().unwrap() + s["streams_rx_control"].as_u64().unwrap();
        for c in chans {
            total += c["rx_data_packets"].as_u64().unwrap();
            assert_eq!(c["state"], "up");
        }
        if chans
            .iter()
            .all(|c| c["rx_data_packets"].as_u64().unwrap() > 20)
        {
            striped_on_every_channel += 1;
        }
        assert!(total > 20, "{s}");
        assert_eq!(s["auth_failures"], 0);
    }
    assert!(striped_on_every_channel >= 1, "the data was not striped");

    // Clean shutdown on SIGTERM: exit status 0 and the control socket removed.
    for c in &lab.children {
        sh(&["kill", "-TERM", &c.id().to_string()]);
    }
    let mut cut = 0;
    for c in std::mem::take(&mut lab.children) {
        let out = c.wait_with_output().unwrap();
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "tunnel exit: {log}");
        assert!(log.contains("SIGTERM: shutting down"), "{log}");
        cut += super_segments_cut(&log);
    }
    // The sending end's kernel handed its TUN reader whole TCP super-segments (transmit
    // offload), which braid cut into packets: the stream above went through that path.
    assert!(cut > 0, "no TCP super-segment read from the TUN device");
    assert!(!ca.exists() && !cb.exists());

    // Without CAP_NET_ADMIN the error says what is missing.
    if Command::new("setpriv")
        .arg("--help")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        // A copy of the config that user nobody owns: private (it holds the key
        // inline), and readable by the user the tunnel runs as.
        let own = dir.join("nobody.toml");
        std::fs::copy(dir.join("a.toml"), &own).unwrap();
        std::os::unix::fs::chown(&own, Some(65534), Some(65534)).unwrap();
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &na,
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
                BIN,
                "tunnel",
                "--config",
            ])
            .arg(&own)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        if err.contains("failed to execute") {
            eprintln!("permission check skipped: user nobody cannot execute {BIN}");
        } else {
            assert!(err.contains("needs CAP_NET_ADMIN"), "{err}");
        }
    }
}
