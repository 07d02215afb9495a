//! Issue 30 item 4: IPv6 outside and inside the tunnel. Two namespaces joined by an
//! IPv4 link and an IPv6 link; a bond of one IPv4 and one IPv6 channel (the server
//! end waits on both and learns the client's addresses); the TUN devices carry IPv4
//! and IPv6, each with an address of both families: ping and ping -6 through the
//! tunnel, over both channels. Needs root, /dev/net/tun, `ip` and `ping`; without
//! them the test says why it is skipped. Namespaces are removed on every exit path.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_braid");

mod common;
use common::sh;

fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (network namespaces and a TUN device)".into());
    }
    if !Path::new("/dev/net/tun").exists() {
        return Some("/dev/net/tun does not exist".into());
    }
    if let Some(why) = common::missing_tool(&[("ip", "iproute2"), ("ping", "iputils-ping")]) {
        return Some(why);
    }
    None
}

/// Namespaces, processes and files of one test; removed on drop.
struct Lab {
    ns: Vec<String>,
    children: Vec<Child>,
    dir: PathBuf,
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for n in &self.ns {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const KEY: &str = "AyHDMTOweHmwGSs7vubt5lmmRKjx62UXkWxeQzJRXms=";

fn config(tun_addr: &str, ctl: &Path, chans: &str) -> String {
    format!(
        "[tunnel]\nname = \"braid6\"\naddress = \"{tun_addr}\"\ncontrol = \"{}\"\n\n[session]\nkey = \"{KEY}\"\nheartbeat = \"20ms\"\ndead_after = \"200ms\"\n{chans}",
        ctl.display()
    )
}

fn status(ctl: &Path) -> Option<Value> {
    let out = Command::new(BIN)
        .args(["status", "--json", "--control", ctl.to_str().unwrap()])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// One ping from namespace `ns` to `to` (IPv4 or IPv6), answered within `wait_ms`?
fn ping(ns: &str, to: &str, wait_ms: u32) -> bool {
    let family = if to.contains(':') { "-6" } else { "-4" };
    Command::new("ip")
        .args(["netns", "exec", ns, "ping", family, "-c", "1", "-n", "-q"])
        .args(["-W", &format!("{:.3}", f64::from(wait_ms) / 1000.0), to])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Ping until answered; how long that took (panics after `limit`).
fn ping_until(ns: &str, to: &str, limit: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        if ping(ns, to, 100) {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < limit,
            "no answer from {to} (in {ns}) within {limit:?}"
        );
    }
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
    std::fs::create_dir_all(&dir).unwrap();
    let mut lab = Lab {
        ns: vec![],
        children: vec![],
        dir: dir.clone(),
    };
    for n in [&na, &nb] {
        sh(&["ip", "netns", "add", n]);
        lab.ns.push(n.clone());
        sh(&["ip", "-n", n, "link", "set", "dev", "lo", "up"]);
    }
    // Link 0 speaks IPv4 only, link 1 IPv6 only (no duplicate address detection:
    // the addresses are usable at once).
    let links = [
        ("10.230.0.1/24", "10.230.0.2/24"),
        ("fd30::1/64", "fd30::2/64"),
    ];
    for (i, (a, b)) in links.iter().enumerate() {
        let (va, vb) = (format!("b6a{id}v{i}"), format!("b6b{id}v{i}"));
        sh(&[
            "ip", "link", "add", &va, "netns", &na, "type", "veth", "peer", "name", &vb, "netns",
            &nb,
        ]);
        for (n, dev, addr) in [(&na, &va, a), (&nb, &vb, b)] {
            let mut cmd = vec!["ip", "-n", n, "addr", "add", addr, "dev", dev];
            if addr.contains(':') {
                cmd.push("nodad");
            }
            sh(&cmd);
            sh(&["ip", "-n", n, "link", "set", "dev", dev, "up"]);
        }
    }
    let (ca, cb) = (dir.join("a.sock"), dir.join("b.sock"));
    let client = "\n[[channel]]\nname = \"dsl4\"\nremote = \"10.230.0.2:7000\"\n\n[[channel]]\nname = \"lte6\"\nlocal = \"[fd30::1]:0\"\nremote = \"[fd30::2]:7000\"\n";
    let server = "\n[[channel]]\nname = \"dsl4\"\nlocal = \"10.230.0.2:7000\"\n\n[[channel]]\nname = \"lte6\"\nlocal = \"[fd30::2]:7000\"\n";
    let addrs = |v4: &str, v6: &str| format!("[\"{v4}\", \"{v6}\"]");
    let cfg =
        |addr: String, ctl: &Path, chans: &str| config("X", ctl, chans).replace("\"X\"", &addr);
    std::fs::write(
        dir.join("a.toml"),
        cfg(addrs("10.79.0.1/24", "fd79::1/64"), &ca, client),
    )
    .unwrap();
    std::fs::write(
        dir.join("b.toml"),
        cfg(addrs("10.79.0.2/24", "fd79::2/64"), &cb, server),
    )
    .unwrap();
    for f in ["a.toml", "b.toml"] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.join(f), std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let tunnel = |n: &str, cfg: &str| {
        Command::new("ip")
            .args(["netns", "exec", n, BIN, "tunnel", "--config"])
            .arg(dir.join(cfg))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
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
        for c in s["channels"].as_array().unwrap() {
            assert_eq!(c["state"], "up", "{c}");
            assert!(c["rx_data_packets"].as_u64().unwrap() >= 20, "{c}");
        }
        assert_eq!(s["auth_failures"], 0);
    }
}
