//! Issue 30, item 1: one server, many peers. A server namespace runs `braid tunnel`
//! with two `[[peer]]` sections; two client namespaces each run a client with its own
//! key, two channels each to the server's two ports. Traffic from each client crosses
//! the server's TUN; a packet with an inner source outside the client's allowed IPs is
//! not delivered and is counted; a reload that removes one peer stops it while the
//! other keeps flowing on the same session (no new handshake); a client whose key no
//! `[[peer]]` has gets nowhere and is counted. 8 MiB of TCP cross the server each way
//! intact (the server reads its TUN device with transmit offload: whole super-segments,
//! cut for the peer). Needs root, /dev/net/tun, `ip`, `ping` and python3; without them
//! the test says why it is skipped. Namespaces are removed on
//! every exit path.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use braid_io::keys;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_braid");

mod common;
use common::sh;

fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (network namespaces, TUN devices)".into());
    }
    if !Path::new("/dev/net/tun").exists() {
        return Some("/dev/net/tun does not exist".into());
    }
    common::missing_tool(&[("ip", "iproute2"), ("ping", "iputils-ping")])
        .or_else(|| common::missing_python("the TCP transfers"))
}

/// Namespaces, processes and files of one test; removed on drop.
struct Lab {
    ns: Vec<String>,
    children: Vec<(String, Child)>,
    dir: PathBuf,
}

impl Drop for Lab {
    fn drop(&mut self) {
        for (_, c) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for n in &self.ns {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Lab {
    /// Start `braid tunnel --config dir/cfg` in namespace `ns`.
    fn tunnel(&mut self, ns: &str, cfg: &str) {
        let c = Command::new("ip")
            .args(["netns", "exec", ns, BIN, "tunnel", "--config"])
            .arg(self.dir.join(cfg))
            .args(["--peer-timeout", "0s"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        self.children.push((cfg.to_string(), c));
    }

    /// Stop the tunnel started with `cfg`; its log.
    fn stop(&mut self, cfg: &str) -> String {
        let i = self.children.iter().position(|(n, _)| n == cfg).unwrap();
        let (_, c) = self.children.remove(i);
        sh(&["kill", "-TERM", &c.id().to_string()]);
        String::from_utf8_lossy(&c.wait_with_output().unwrap().stderr).to_string()
    }

    fn pid(&self, cfg: &str) -> u32 {
        self.children.iter().find(|(n, _)| n == cfg).unwrap().1.id()
    }

    fn write(&self, name: &str, text: &str) {
        use std::os::unix::fs::PermissionsExt;
        let p = self.dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
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

/// `count` pings of `size` bytes from namespace `ns` to `to` (from `from`, if given):
/// how many were answered.
fn pings(ns: &str, to: &str, from: Option<&str>, count: u32, size: u32) -> u32 {
    let mut cmd = Command::new("ip");
    cmd.args([
        "netns", "exec", ns, "ping", "-n", "-q", "-i", "0.02", "-W", "1",
    ])
    .args(["-c", &count.to_string(), "-s", &size.to_string()]);
    if let Some(f) = from {
        cmd.args(["-I", f]);
    }
    let out = cmd.arg(to).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // "N packets transmitted, M received"
    text.split(", ")
        .find(|p| p.ends_with(" received"))
        .and_then(|p| p.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Ping until answered (panics after `limit`).
fn ping_until(ns: &str, to: &str, limit: Duration) {
    let t0 = Instant::now();
    while pings(ns, to, None, 1, 56) == 0 {
        assert!(
            t0.elapsed() < limit,
            "no answer from {to} (in {ns}) within {limit:?}"
        );
    }
}

/// Datagrams for each client in [`burst_to_both`].
const BURST: usize = 150;

/// From namespace `from`, [`BURST`] UDP datagrams to each of `to` (the clients'
/// namespaces and tunnel addresses), alternating and as fast as python sends; per
/// client, how many arrived within 5 s and whether in the order sent.
fn burst_to_both(from: &str, ns: [&str; 2], to: [&str; 2]) -> Vec<(usize, bool)> {
    use std::io::BufRead;
    let listen = format!(
        "import socket,sys\n\
         s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.bind((sys.argv[1],9100)); s.settimeout(5)\n\
         print('ready',flush=True)\n\
         got=[]\n\
         try:\n\
         \x20while len(got)<{BURST}: got.append(int(s.recv(2048).split(b' ')[0]))\n\
         except socket.timeout: pass\n\
         print(len(got), int(got==sorted(got)))\n"
    );
    let mut sinks: Vec<_> = ns
        .iter()
        .zip(to)
        .map(|(n, addr)| {
            let mut c = Command::new("ip")
                .args(["netns", "exec", n, "python3", "-c", &listen, addr])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut out = std::io::BufReader::new(c.stdout.take().unwrap());
            let mut line = String::new();
            out.read_line(&mut line).unwrap();
            assert_eq!(line.trim(), "ready");
            (c, out)
        })
        .collect();
    let send = format!(
        "import socket\n\
         s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
         for i in range({BURST}):\n\
         \x20for a in ('{}','{}'): s.sendto(b'%d ' % i + b'x'*200, (a,9100))\n",
        to[0], to[1]
    );
    sh(&["ip", "netns", "exec", from, "python3", "-c", &send]);
    sinks
        .iter_mut()
        .map(|(c, out)| {
            let mut line = String::new();
            out.read_line(&mut line).unwrap();
            c.wait().unwrap();
            let mut it = line.split_whitespace().map(|w| w.parse::<usize>().unwrap());
            (it.next().unwrap(), it.next() == Some(1))
        })
        .collect()
}

fn peer<'a>(s: &'a Value, name: &str) -> &'a Value {
    s["peers"]
        .as_array()
        .unwrap_or_else(|| panic!("no peers in {s}"))
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no peer {name} in {s}"))
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

#[test]
fn a_server_serves_two_clients_routes_by_key_and_drops_what_is_not_theirs() {
    let test = "a_server_serves_two_clients_routes_by_key_and_drops_what_is_not_theirs";
    if let Some(why) = skip_reason() {
        common::skip(test, &why);
        return;
    }
    let id = std::process::id() % 100_000;
    let (ns_s, ns_a, ns_b) = (
        format!("bsv{id}server"),
        format!("bsv{id}clia"),
        format!("bsv{id}clib"),
    );
    let dir = std::env::temp_dir().join(format!("braid-server-{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut lab = Lab {
        ns: vec![],
        children: vec![],
        dir: dir.clone(),
    };
    for n in [&ns_s, &ns_a, &ns_b] {
        sh(&["ip", "netns", "add", n]);
        lab.ns.push(n.clone());
        sh(&["ip", "-n", n, "link", "set", "dev", "lo", "up"]);
    }
    // No IPv6 in the clients: a new interface's router solicitations (from a
    // link-local address, in no allowed IPs) would be counted with the spoofs.
    for n in [&ns_a, &ns_b] {
        for k in ["all", "default"] {
            let key = format!("net.ipv6.conf.{k}.disable_ipv6=1");
            sh(&["ip", "netns", "exec", n, "sysctl", "-qw", &key]);
        }
    }
    // client A 10.231.1.2 -- 10.231.1.1 server 10.231.2.1 -- 10.231.2.2 client B.
    for (c, net) in [(&ns_a, 1), (&ns_b, 2)] {
        let (sv, cv) = (format!("bsv{id}s{net}"), format!("bsv{id}c{net}"));
        sh(&[
            "ip", "link", "add", &sv, "netns", &ns_s, "type", "veth", "peer", "name", &cv, "netns",
            c,
        ]);
        for (n, dev, a) in [
            (&ns_s, &sv, format!("10.231.{net}.1/24")),
            (c, &cv, format!("10.231.{net}.2/24")),
        ] {
            sh(&["ip", "-n", n, "addr", "add", &a, "dev", dev]);
            sh(&["ip", "-n", n, "link", "set", "dev", dev, "up"]);
        }
    }

    let key = || keys::generate().unwrap();
    let (ks, ka, kb, kc) = (key(), key(), key(), key());
    let public = |k: &[u8; 32]| keys::encode(&keys::public_key(k));
    for (f, k) in [
        ("s.key", &ks),
        ("a.key", &ka),
        ("b.key", &kb),
        ("c.key", &kc),
    ] {
        lab.write(f, &keys::encode(k));
    }
    let session = "heartbeat = \"20ms\"\ndead_after = \"200ms\"\n";
    let peer_a = format!(
        "\n[[peer]]\nname = \"site-a\"\npublic_key = \"{}\"\nallowed_ips = [\"10.90.1.0/24\", \"fd90:1::/64\"]\n",
        public(&ka)
    );
    let peer_b = format!(
        "\n[[peer]]\nname = \"site-b\"\npublic_key = \"{}\"\nallowed_ips = [\"10.90.2.0/24\"]\n",
        public(&kb)
    );
    let ctl_s = dir.join("s.sock");
    let server = |peers: &str| {
        format!(
            "[tunnel]\nname = \"bsv{id}\"\naddress = \"10.90.0.1/16\"\ncontrol = \"{}\"\n\n[session]\nprivate_key_file = \"s.key\"\n{session}\n[[channel]]\nname = \"one\"\nlocal = \"0.0.0.0:7100\"\n\n[[channel]]\nname = \"two\"\nlocal = \"0.0.0.0:7101\"\n{peers}",
            ctl_s.display()
        )
    };
    let client = |name: &str, key: &str, addr: &str, net: u8| {
        format!(
            "[tunnel]\nname = \"bsv{id}{name}\"\naddress = \"{addr}\"\ncontrol = \"{}\"\n\n[session]\nprivate_key_file = \"{key}\"\npeer_public_key = \"{}\"\n{session}\n[[channel]]\nname = \"one\"\nremote = \"10.231.{net}.1:7100\"\n\n[[channel]]\nname = \"two\"\nremote = \"10.231.{net}.1:7101\"\n",
            dir.join(format!("{name}.sock")).display(),
            public(&ks)
        )
    };
    lab.write("s.toml", &server(&format!("{peer_a}{peer_b}")));
    lab.write("a.toml", &client("a", "a.key", "10.90.1.2/16", 1));
    lab.write("b.toml", &client("b", "b.key", "10.90.2.2/16", 2));
    lab.write("c.toml", &client("c", "c.key", "10.90.2.2/16", 2));
    let (ctl_a, ctl_b, ctl_c) = (dir.join("a.sock"), dir.join("b.sock"), dir.join("c.sock"));

    lab.tunnel(&ns_s, "s.toml");
    lab.tunnel(&ns_a, "a.toml");
    lab.tunnel(&ns_b, "b.toml");
    let t0 = Instant::now();
    while ![&ctl_a, &ctl_b]
        .iter()
        .all(|c| status(c).is_some_and(|s| s["peer_seen"] == true))
    {
        if t0.elapsed() > Duration::from_secs(10) {
            let st = status(&ctl_s);
            panic!(
                "the clients did not reach the server: server {st:?}\nserver log: {}\nclient A log: {}",
                lab.stop("s.toml"),
                lab.stop("a.toml")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }

    // Each client through the server's TUN (its address answers), both ways, over both
    // channels: every ping of 1200 bytes comes back.
    ping_until(&ns_a, "10.90.0.1", Duration::from_secs(3));
    ping_until(&ns_b, "10.90.0.1", Duration::from_secs(3));
    assert_eq!(pings(&ns_a, "10.90.0.1", None, 50, 1200), 50);
    assert_eq!(pings(&ns_b, "10.90.0.1", None, 50, 1200), 50);
    // A burst from the server to both clients at once, their datagrams alternating:
    // the server's reader gathers what its TUN device holds into batches per peer, and
    // each client gets all of its own, in order.
    for (got, in_order) in burst_to_both(&ns_s, [&ns_a, &ns_b], ["10.90.1.2", "10.90.2.2"]) {
        assert_eq!(
            (got, in_order),
            (BURST, true),
            "a client's share of the burst"
        );
    }
    let s = status(&ctl_s).unwrap();
    assert_eq!(n(&s["server"]["peers_connected"]), 2, "{s}");
    for name in ["site-a", "site-b"] {
        let p = peer(&s, name);
        assert_eq!(p["connected"], true, "{p}");
        assert!(n(&p["to_tun"]) >= 50, "{p}");
        let chans = p["session"]["channels"].as_array().unwrap();
        assert_eq!(chans.len(), 2);
        for c in chans {
            assert_eq!(c["state"], "up", "{name}: {c}");
            assert!(
                n(&c["rx_data_packets"]) > 0,
                "{name}: both channels carry data: {c}"
            );
        }
    }
    // Bulk TCP both ways between client A and the server's own address: from the
    // server, its TUN reads are super-segments (transmit offload) that the server cuts
    // for A's bond; from A, the server's session writes what it opens to the shared
    // device itself, each packet checked against A's allowed IPs.
    for (from, to, addr) in [(&ns_s, &ns_a, "10.90.1.2"), (&ns_a, &ns_s, "10.90.0.1")] {
        let (sent, got) = common::tcp_transfer(from, to, addr);
        assert!(sent.starts_with("8388608 "), "{from} -> {addr}: {sent}");
        assert_eq!(
            sent, got,
            "{from} -> {addr}: what arrived is not what was sent"
        );
    }
    // With the defaults (every channel paced), each connection crossed as a stream:
    // the server terminated A's and connected it to its own address, and terminated
    // its own towards A, whose tunnel connected it.
    let (s, a) = (status(&ctl_s).unwrap(), status(&ctl_a).unwrap());
    let served = &peer(&s, "site-a")["session"];
    assert!(n(&served["streams_connected"]) >= 1, "{served}");
    assert!(n(&served["streams_opened"]) >= 1, "{served}");
    assert!(n(&a["streams_opened"]) >= 1, "{a}");
    assert!(n(&a["streams_connected"]) >= 1, "{a}");
    let net_of = |name: &str| {
        if name == "site-a" {
            "10.231.1.2:"
        } else {
            "10.231.2.2:"
        }
    };
    for name in ["site-a", "site-b"] {
        for c in peer(&s, name)["session"]["channels"].as_array().unwrap() {
            assert!(
                c["remote"].as_str().unwrap().starts_with(net_of(name)),
                "{name}'s channel learnt the wrong endpoint: {c}"
            );
        }
    }

    // A spoofed inner source: client A sends from an address outside its allowed IPs
    // (one of B's, and one of nobody's). Not delivered, counted, logged.
    for a in ["10.90.2.77/32", "10.99.0.5/32"] {
        sh(&[
            "ip",
            "-n",
            &ns_a,
            "addr",
            "add",
            a,
            "dev",
            &format!("bsv{id}a"),
        ]);
    }
    let to_tun = |s: &Value| n(&peer(s, "site-a")["to_tun"]);
    let before = to_tun(&status(&ctl_s).unwrap());
    assert_eq!(pings(&ns_a, "10.90.0.1", Some("10.90.2.77"), 5, 56), 0);
    assert_eq!(pings(&ns_a, "10.90.0.1", Some("10.99.0.5"), 5, 56), 0);
    let s = status(&ctl_s).unwrap();
    // Not one of them reached the server's TUN device.
    assert_eq!(
        to_tun(&s),
        before,
        "spoofed packets were written to the TUN"
    );
    assert_eq!(n(&peer(&s, "site-a")["source_not_allowed"]), 10, "{s}");
    assert_eq!(n(&peer(&s, "site-b")["source_not_allowed"]), 0, "{s}");
    assert_eq!(n(&s["server"]["source_not_allowed"]), 10, "{s}");
    // Packets from the server to nobody's address: no route, counted.
    let no_route = n(&s["server"]["no_route"]);
    assert_eq!(pings(&ns_s, "10.90.7.7", None, 3, 56), 0);
    assert!(n(&status(&ctl_s).unwrap()["server"]["no_route"]) >= no_route + 3);

    // A reload that removes site-b: it stops, site-a flows on without a new handshake.
    let hs_a = |s: &Value| n(&peer(s, "site-a")["session"]["handshakes"]);
    let before = status(&ctl_s).unwrap();
    let client_a_before = n(&status(&ctl_a).unwrap()["handshakes"]);
    lab.write("s.toml", &server(&peer_a));
    sh(&["kill", "-HUP", &lab.pid("s.toml").to_string()]);
    let t0 = Instant::now();
    while status(&ctl_s).unwrap()["peers"].as_array().unwrap().len() != 1 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the reload did not apply"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        pings(&ns_b, "10.90.0.1", None, 5, 56),
        0,
        "a removed peer still flows"
    );
    assert_eq!(pings(&ns_a, "10.90.0.1", None, 50, 1200), 50);
    let after = status(&ctl_s).unwrap();
    assert_eq!(n(&after["server"]["peers_removed"]), 1, "{after}");
    assert_eq!(
        hs_a(&after),
        hs_a(&before),
        "site-a handshook again: {after}"
    );
    assert_eq!(
        n(&status(&ctl_a).unwrap()["handshakes"]),
        client_a_before,
        "client A handshook again"
    );
    assert!(
        peer(&after, "site-a")["session"]["uptime_s"].as_f64()
            > peer(&before, "site-a")["session"]["uptime_s"].as_f64(),
        "site-a's session is the same one, still running"
    );

    // A client whose key no [[peer]] has (in B's place): nothing reaches the server's
    // TUN, no state is made, and its initiations are counted.
    lab.stop("b.toml");
    let unknown0 = n(&status(&ctl_s).unwrap()["server"]["unknown_peer"]);
    lab.tunnel(&ns_b, "c.toml");
    let t0 = Instant::now();
    while n(&status(&ctl_s).unwrap()["server"]["unknown_peer"]) < unknown0 + 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the unknown key's initiations were not counted: {:?}",
            status(&ctl_s)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(pings(&ns_b, "10.90.0.1", None, 3, 56), 0);
    let s = status(&ctl_s).unwrap();
    assert_eq!(s["peers"].as_array().unwrap().len(), 1, "{s}");
    assert_eq!(n(&s["server"]["peers_connected"]), 1, "{s}");
    assert_eq!(status(&ctl_c).unwrap()["peer_seen"], false);
    assert_eq!(pings(&ns_a, "10.90.0.1", None, 10, 56), 10);

    // `braid status` shows each peer, its channels and the drops.
    let out = Command::new(BIN)
        .args(["status", "--control", ctl_s.to_str().unwrap()])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    for want in [
        "1 peers, 1 connected",
        "peer site-a",
        "source not allowed 10",
        "unknown peer ",
    ] {
        assert!(table.contains(want), "{want:?} not in:\n{table}");
    }
    assert!(!table.contains("peer site-b"), "{table}");

    // The server's log names the drops.
    let log = lab.stop("s.toml");
    assert!(log.contains("not in its allowed_ips"), "{log}");
    assert!(log.contains("no [[peer]] has that key"), "{log}");
    assert!(log.contains("removed [site-b]"), "{log}");
}
