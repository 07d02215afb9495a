//! Issue 30 item 4: IPv6 outside and inside the tunnel. Two namespaces joined by an
//! IPv4 link and an IPv6 link; a bond of one IPv4 and one IPv6 channel (the server
//! end waits on both and learns the client's addresses); the TUN devices carry IPv4
//! and IPv6, each with an address of both families: ping and ping -6 through the
//! tunnel, over both channels. Needs root, /dev/net/tun, `ip` and `ping`; without
//! them the test says why it is skipped. Namespaces are removed on every exit path.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::{ping_until, status, Lab};

fn skip_reason() -> Option<String> {
    common::netns_skip_reason(
        "network namespaces and a TUN device",
        &[("ip", "iproute2"), ("ping", "iputils-ping")],
        None,
    )
}

const KEY: &str = "AyHDMTOweHmwGSs7vubt5lmmRKjx62UXkWxeQzJRXms=";

fn config(tun_addr: &str, ctl: &Path, chans: &str) -> String {
    format!(
        "[tunnel]\nname = \"braid6\"\naddress = \"{tun_addr}\"\ncontrol = \"{}\"\n\n[session]\nkey = \"{KEY}\"\nheartbeat = \"20ms\"\ndead_after = \"200ms\"\n{chans}",
        ctl.display()
    )
}

#[test]
fn a_bond_of_an_ipv4_and_an_ipv6_channel_carries_ipv4_and_ipv6() {
    let test = "a_bond_of_an_ipv4_and_an_ipv6_channel_carries_ipv4_and_ipv6";
    if let Some(why) = skip_reason() {
        common::skip(test, &why);
        return;
    }
    let id = std::process::id() % 100_000;
    let (na, nb) = (format!("b6a{id}field"), format!("b6b{id}field"));
    let dir = std::env::temp_dir().join(format!("braid-v6-field-{id}"));
    let mut lab = Lab::new(dir.clone());
    for n in [&na, &nb] {
        lab.add_ns(n);
    }
    // Link 0 speaks IPv4 only, link 1 IPv6 only (no duplicate address detection:
    // the addresses are usable at once).
    let links = [
        ("10.230.0.1/24", "10.230.0.2/24"),
        ("fd30::1/64", "fd30::2/64"),
    ];
    for (i, (a, b)) in links.iter().enumerate() {
        let (va, vb) = (format!("b6a{id}v{i}"), format!("b6b{id}v{i}"));
        common::veth(&na, &va, a, &nb, &vb, b);
    }
    let (ca, cb) = (dir.join("a.sock"), dir.join("b.sock"));
    let client = "\n[[channel]]\nname = \"dsl4\"\nremote = \"10.230.0.2:7000\"\n\n[[channel]]\nname = \"lte6\"\nlocal = \"[fd30::1]:0\"\nremote = \"[fd30::2]:7000\"\n";
    let server = "\n[[channel]]\nname = \"dsl4\"\nlocal = \"10.230.0.2:7000\"\n\n[[channel]]\nname = \"lte6\"\nlocal = \"[fd30::2]:7000\"\n";
    let addrs = |v4: &str, v6: &str| format!("[\"{v4}\", \"{v6}\"]");
    let cfg =
        |addr: String, ctl: &Path, chans: &str| config("X", ctl, chans).replace("\"X\"", &addr);
    common::write_private(
        &dir.join("a.toml"),
        &cfg(addrs("10.79.0.1/24", "fd79::1/64"), &ca, client),
    );
    common::write_private(
        &dir.join("b.toml"),
        &cfg(addrs("10.79.0.2/24", "fd79::2/64"), &cb, server),
    );
    let tunnel = |n: &str, cfg: &str| common::start_tunnel(n, &dir.join(cfg));
    lab.children.push(tunnel(&nb, "b.toml"));
    lab.children.push(tunnel(&na, "a.toml"));
    let t0 = Instant::now();
    while ![&ca, &cb]
        .iter()
        .all(|c| status(c).is_some_and(|s| s["peer_seen"] == true))
    {
        if t0.elapsed() > Duration::from_secs(10) {
            let logs: Vec<String> = std::mem::take(&mut lab.children)
                .into_iter()
                .map(|mut c| {
                    let _ = c.kill();
                    String::from_utf8_lossy(&c.wait_with_output().unwrap().stderr).into()
                })
                .collect();
            panic!("the tunnels did not come up: {logs:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // The server learns the client's address on each channel, of each family.
    let t0 = Instant::now();
    let s = loop {
        let s = status(&cb).unwrap();
        let known = s["channels"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["remote"] != "-");
        if known || t0.elapsed() > Duration::from_secs(3) {
            break s;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let remote = |s: &Value, i: usize| s["channels"][i]["remote"].as_str().unwrap().to_string();
    assert!(remote(&s, 0).starts_with("10.230.0.1:"), "{s}");
    assert!(remote(&s, 1).starts_with("[fd30::1]:"), "{s}");

    // Both families inside, both ways.
    for (from, to) in [
        (&na, "10.79.0.2"),
        (&na, "fd79::2"),
        (&nb, "10.79.0.1"),
        (&nb, "fd79::1"),
    ] {
        ping_until(from, to, Duration::from_secs(3));
    }
    // Both channels in both directions' sets first: on a loaded machine the IPv6
    // channel's first handshakes can fail (its address still being checked), the
    // other end then stripes without it until it rejoins (seen in CI: 0 of 85 on
    // the IPv6 channel, out of the receive set at one end).
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        let in_sets =
            |ctl| {
                status(ctl).is_some_and(|s| {
                    s["channels"].as_array().unwrap().iter().all(|c| {
                        c["in_rx_set"] == true && c["in_tx_set"] == true && c["state"] == "up"
                    })
                })
            };
        if in_sets(&ca) && in_sets(&cb) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // A burst of each: striped over both channels.
    for to in ["10.79.0.2", "fd79::2"] {
        let family = if to.contains(':') { "-6" } else { "-4" };
        let out = Command::new("ip")
            .args([
                "netns", "exec", &na, "ping", family, "-c", "40", "-i", "0.005",
            ])
            .args(["-s", "1000", "-n", "-q", to])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains(" 0% packet loss"),
            "{text}"
        );
    }
    for ctl in [&ca, &cb] {
        let s = status(ctl).unwrap();
        let channels = s["channels"].as_array().unwrap();
        let data = |c: &Value| c["rx_data_packets"].as_u64().unwrap();
        let total: u64 = channels.iter().map(data).sum();
        assert!(total >= 80, "{total} data packets received in all: {s}");
        for c in channels {
            assert_eq!(c["state"], "up", "{c}");
            // Striped over both: each channel a real share. Not an even one: the
            // weights follow the rates each channel measured at the start, and an
            // unshaped veth measures at whatever the loaded machine gives (19 of 80
            // seen on one channel, 61 on the other).
            assert!(data(c) * 10 >= total, "{} of {total}: {c}", data(c));
        }
        assert_eq!(s["auth_failures"], 0);
    }
}
