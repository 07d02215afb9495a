//! Issue 27 on real sockets: handshakes that no one can abuse. Two `braid tunnel`s in
//! two network namespaces joined by two veth pairs (two channels); an attacker in the
//! sender's namespace spoofs the sender's channel addresses with a raw socket:
//!
//! * a full-speed flood of random initiations (both handshake versions, the right
//!   lengths) on one channel must not stop a TCP flow through the tunnel (before: the
//!   responder did the Diffie-Hellman work of every one on the data task, and TCP fell
//!   from hundreds of Mbit/s to a few);
//! * genuine initiations recorded on the wire and replayed at 3000/s must cost no ping
//!   across rekeys every second (the issue saw each replay add an unconfirmed handshake
//!   that pushed the genuine one out, and one direction dead until the next rekey; on
//!   these namespaces the build before the change also lost no ping, the confirmation
//!   being faster than the eviction, so this one guards rather than reproduces).
//!
//! Needs root, /dev/net/tun, `ip`, `ping` and python3; without them each test says why
//! it is skipped. Namespaces are removed on every exit path.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_braid");

/// The braid under test: this build's, or `BRAID_TEST_BIN` (to run the same tests
/// against another build, say one from before issue 27).
fn bin() -> String {
    std::env::var("BRAID_TEST_BIN").unwrap_or_else(|_| BIN.into())
}

mod common;
use common::sh;

fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (network namespaces, a TUN device, raw sockets)".into());
    }
    if !Path::new("/dev/net/tun").exists() {
        return Some("/dev/net/tun does not exist".into());
    }
    if let Some(why) = common::missing_tool(&[("ip", "iproute2"), ("ping", "iputils-ping")]) {
        return Some(why);
    }
    if let Some(why) = common::missing_python("the attacker and the TCP ends") {
        return Some(why);
    }
    None
}

/// Namespaces, processes and files of one test; removed on drop.
struct Lab {
    na: String,
    nb: String,
    children: Vec<Child>,
    dir: PathBuf,
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for n in [&self.na, &self.nb] {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn status(ctl: &Path) -> Option<Value> {
    let out = Command::new(bin())
        .args(["status", "--json", "--control", ctl.to_str().unwrap()])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

impl Lab {
    /// Namespaces `hsa<id><tag>`/`hsb<id><tag>`, channel c on 10.212.<net+c>.0/24, the
    /// tunnel on 10.80.<net>.0/24, both tunnels up.
    fn new(tag: &str, net: u8) -> Lab {
        let id = std::process::id() % 100_000;
        let (na, nb) = (format!("hsa{id}{tag}"), format!("hsb{id}{tag}"));
        let dir = std::env::temp_dir().join(format!("braid-hsabuse-{id}-{tag}"));
        std::fs::create_dir_all(&dir).unwrap();
        let lab = Lab {
            na: na.clone(),
            nb: nb.clone(),
            children: vec![],
            dir,
        };
        for n in [&na, &nb] {
            sh(&["ip", "netns", "add", n]);
            sh(&["ip", "-n", n, "link", "set", "dev", "lo", "up"]);
        }
        for c in 0..2u8 {
            let (va, vb) = (format!("hva{id}{tag}{c}"), format!("hvb{id}{tag}{c}"));
            sh(&[
                "ip", "link", "add", &va, "netns", &na, "type", "veth", "peer", "name", &vb,
                "netns", &nb,
            ]);
            let sub = net + c;
            sh(&[
                "ip",
                "-n",
                &na,
                "addr",
                "add",
                &format!("10.212.{sub}.1/24"),
                "dev",
                &va,
            ]);
            sh(&[
                "ip",
                "-n",
                &nb,
                "addr",
                "add",
                &format!("10.212.{sub}.2/24"),
                "dev",
                &vb,
            ]);
            sh(&["ip", "-n", &na, "link", "set", "dev", &va, "up"]);
            sh(&["ip", "-n", &nb, "link", "set", "dev", &vb, "up"]);
        }
        lab
    }

    fn ctl(&self, end: u8) -> PathBuf {
        self.dir.join(format!("t{end}.sock"))
    }

    /// End `end`'s static key pair: (private key file, public key).
    fn static_key(&self, end: u8) -> (PathBuf, String) {
        let path = self.dir.join(format!("k{end}.key"));
        if !path.exists() {
            let k = Command::new(bin()).arg("genkey").output().unwrap();
            assert!(k.status.success());
            std::fs::write(&path, &k.stdout).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let mut p = Command::new(bin())
            .arg("pubkey")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        p.stdin
            .take()
            .unwrap()
            .write_all(&std::fs::read(&path).unwrap())
            .unwrap();
        let out = p.wait_with_output().unwrap();
        (
            path,
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        )
    }

    /// Both tunnels, with static keys (the handshake of WireGuard: public-key work on
    /// every initiation) or a pre-shared key, `extra` in their [session].
    fn start_tunnels(&mut self, tag: &str, net: u8, extra: &str, static_keys: bool) {
        for end in [1u8, 2] {
            let other = 3 - end;
            let keys = if static_keys {
                let (private, _) = self.static_key(end);
                let (_, peer_public) = self.static_key(other);
                format!(
                    "private_key_file = \"{}\"\npeer_public_key = \"{peer_public}\"\n",
                    private.display()
                )
            } else {
                "key = \"AyHDMTOweHmwGSs7vubt5lmmRKjx62UXkWxeQzJRXms=\"\n".into()
            };
            let mut cfg = format!(
                "[tunnel]\nname = \"hst{tag}{end}\"\naddress = \"10.80.{net}.{end}/24\"\ncontrol = \"{}\"\nlog_interval = \"0s\"\n\n[session]\n{keys}{extra}",
                self.ctl(end).display(),
            );
            for c in 0..2u8 {
                let sub = net + c;
                cfg += &format!(
                    "\n[[channel]]\nname = \"c{c}\"\nlocal = \"10.212.{sub}.{end}:7000\"\nremote = \"10.212.{sub}.{other}:7000\"\n"
                );
            }
            let path = self.dir.join(format!("t{end}.toml"));
            std::fs::write(&path, cfg).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            let ns = if end == 1 { &self.na } else { &self.nb };
            self.children.push(
                Command::new("ip")
                    .args(["netns", "exec", ns, &bin(), "tunnel", "--config"])
                    .arg(&path)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
        }
        let t0 = Instant::now();
        while ![self.ctl(1), self.ctl(2)]
            .iter()
            .all(|c| status(c).is_some_and(|s| s["peer_seen"] == true))
        {
            assert!(
                t0.elapsed() < Duration::from_secs(15),
                "the tunnels did not come up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn py(&self, ns: &str, code: &str, args: &[String]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, "python3", "-c", code])
            .args(args);
        c
    }
}

/// TCP sink: counts the bytes it receives per second, for `secs` seconds; prints them.
const SINK: &str = r#"
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5001)); s.listen(1); s.settimeout(30)
print("ready", flush=True)
c, _ = s.accept(); c.settimeout(2)
secs = int(sys.argv[2]); counts = [0] * secs; t0 = time.time()
while True:
    try:
        b = c.recv(1 << 20)
    except socket.timeout:
        b = b"x"[:0] if time.time() - t0 >= secs else None
        if b is None: continue
    if not b: break
    i = int(time.time() - t0)
    if i >= secs: break
    counts[i] += len(b)
print(" ".join(map(str, counts)), flush=True)
"#;

/// TCP source: sends as fast as it can for `secs` seconds.
const SOURCE: &str = r#"
import socket, sys, time
for i in range(100):
    try:
        s = socket.create_connection((sys.argv[1], 5001), timeout=10); break
    except OSError:
        time.sleep(0.1)
buf = b"\x5a" * (1 << 16); end = time.time() + float(sys.argv[2])
s.settimeout(5)
try:
    while time.time() < end:
        s.sendall(buf)
except OSError:
    pass
s.close()
"#;

/// Random initiations, spoofed from A's channel-0 address to B's, as fast as one
/// process sends them, for `secs` seconds: half in the current handshake version, half
/// in version 1 (the format before issue 27), static keys, each the right length.
const FLOOD: &str = r#"
import os, socket, struct, sys, time
src, dst, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
def pkt(p):
    udp = struct.pack("!HHHH", 7000, 7000, 8 + len(p), 0) + p
    return struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0,
                       socket.inet_aton(src), socket.inet_aton(dst)) + udp
pool = []
for i in range(2048):
    pool.append(pkt(bytes([0xBA, 2, 1, 0]) + os.urandom(188)))
    pool.append(pkt(bytes([0xBA, 1, 1, 0]) + os.urandom(144)))
r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
n = 0; end = time.time() + secs
while time.time() < end:
    for p in pool:
        try:
            r.sendto(p, (dst, 0))
        except OSError:
            pass
    n += len(pool)
print(n, flush=True)
"#;

/// Sends TCP for `secs` through the tunnel; bytes received per second at B.
fn tcp_seconds(lab: &mut Lab, dst: &str, secs: u32) -> (Child, Child) {
    let mut sink = lab
        .py(&lab.nb, SINK, &[dst.into(), secs.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut out = std::io::BufReader::new(sink.stdout.take().unwrap());
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    sink.stdout = Some(out.into_inner());
    let source = lab
        .py(&lab.na, SOURCE, &[dst.into(), (secs + 1).to_string()])
        .spawn()
        .unwrap();
    (sink, source)
}

#[test]
fn a_flood_of_spoofed_initiations_does_not_stop_traffic() {
    if let Some(why) = skip_reason() {
        common::skip("a_flood_of_spoofed_initiations_does_not_stop_traffic", &why);
        return;
    }
    let mut lab = Lab::new("f", 10);
    lab.start_tunnels("f", 10, "", true);
    // 10 s of TCP: 4 s alone, then 6 s with the flood on channel 0.
    let (sink, mut source) = tcp_seconds(&mut lab, "10.80.10.2", 10);
    std::thread::sleep(Duration::from_millis(4200));
    let flood = lab
        .py(
            &lab.na,
            FLOOD,
            &["10.212.10.1".into(), "10.212.10.2".into(), "5.5".into()],
        )
        .output()
        .unwrap();
    assert!(
        flood.status.success(),
        "{}",
        String::from_utf8_lossy(&flood.stderr)
    );
    let sent: u64 = String::from_utf8_lossy(&flood.stdout)
        .trim()
        .parse()
        .unwrap();
    let out = sink.wait_with_output().unwrap();
    let _ = source.wait();
    let per_s: Vec<f64> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|x| x.parse::<f64>().unwrap() * 8.0 / 1e6)
        .collect();
    assert_eq!(per_s.len(), 10, "{per_s:?}");
    // Seconds 1..4 without the flood, 5..9 with it (the first of each left out).
    let before = per_s[1..4].iter().sum::<f64>() / 3.0;
    let during = per_s[5..10].iter().sum::<f64>() / 5.0;
    let sb = status(&lab.ctl(2)).expect("status of B");
    eprintln!(
        "{sent} spoofed initiations in 5.5 s; TCP {before:.0} Mbit/s before, {during:.0} during \
         (per second: {per_s:.0?}); B: handshake_failures {}, handshakes {}",
        sb["handshake_failures"], sb["handshakes"]
    );
    assert!(
        sent > 20_000,
        "the flood was too slow to mean anything: {sent}"
    );
    // The flooder itself takes a core of the two this runs on; what the tunnel does with
    // the flood must not cost much more (before: TCP fell to a few Mbit/s).
    assert!(
        during >= 0.25 * before,
        "the flood cut TCP through the tunnel from {before:.0} to {during:.0} Mbit/s \
         (per second: {per_s:.0?}); B: {sb}"
    );
    assert_eq!(sb["peer_seen"], true);
}

/// Records the initiations A sends on its two veths (the first `keep` distinct ones,
/// from the start) and replays them to where they went, spoofed, at `rate` per second
/// for `secs` seconds; prints how many it sent and how many it recorded.
const REPLAY: &str = r#"
import socket, struct, sys, threading, time
ifaces = sys.argv[1].split(","); srcs = sys.argv[2].split(","); rate = float(sys.argv[3])
secs = float(sys.argv[4]); keep = 64
recorded = []; seen = set(); lock = threading.Lock()
def capture(iface):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(0x0800))
    s.bind((iface, 0)); s.settimeout(0.2)
    while True:
        try:
            p = s.recv(65536)
        except socket.timeout:
            continue
        if len(p) < 29 or p[9] != 17 or socket.inet_ntoa(p[12:16]) not in srcs:
            continue
        hl = (p[0] & 15) * 4
        payload = p[hl + 8:]
        if not payload or payload[0] != 0xBA:
            continue
        with lock:
            if payload in seen or len(recorded) >= keep:
                continue
            seen.add(payload)
            recorded.append((p[12:16], p[16:20], payload))
for i in ifaces:
    threading.Thread(target=capture, args=(i,), daemon=True).start()
print("ready", flush=True)
r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
n = 0; t0 = time.time(); i = 0
while time.time() - t0 < secs:
    with lock:
        recs = list(recorded)
    due = int((time.time() - t0) * rate)
    while recs and n < due:
        s4, d4, payload = recs[i % len(recs)]; i += 1
        udp = struct.pack("!HHHH", 7000, 7000, 8 + len(payload), 0) + payload
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0, s4, d4)
        try:
            r.sendto(ip + udp, (socket.inet_ntoa(d4), 0))
        except OSError:
            pass
        n += 1
    time.sleep(0.002)
with lock:
    print(n, len(recorded), flush=True)
"#;

#[test]
fn replayed_initiations_lose_no_pings_across_rekeys() {
    if let Some(why) = skip_reason() {
        common::skip("replayed_initiations_lose_no_pings_across_rekeys", &why);
        return;
    }
    let mut lab = Lab::new("r", 20);
    let id = std::process::id() % 100_000;
    let ifaces = format!("hva{id}r0,hva{id}r1");
    let mut replay = lab
        .py(
            &lab.na,
            REPLAY,
            &[
                ifaces,
                "10.212.20.1,10.212.21.1".into(),
                "3000".into(),
                "30".into(),
            ],
        )
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(replay.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    lab.start_tunnels("r", 20, "rekey_after = \"1s\"\n", false);
    // 25 s of pings every 50 ms: a rekey every second, so that more initiations are
    // recorded than the 8 unconfirmed handshakes the responder used to keep.
    let ping = Command::new("ip")
        .args(["netns", "exec", &lab.na, "ping", "-n", "-q", "-i", "0.05"])
        .args(["-W", "1", "-c", "500", "10.80.20.2"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&ping.stdout).into_owned();
    let sa = status(&lab.ctl(1)).expect("status of A");
    let sb = status(&lab.ctl(2)).expect("status of B");
    let _ = replay.kill();
    let _ = replay.wait();
    let received: u64 = text
        .split(',')
        .find_map(|p| p.trim().strip_suffix(" received")?.parse().ok())
        .unwrap_or(0);
    eprintln!(
        "{received} of 500 pings; handshakes A {} B {}; {}",
        sa["handshakes"],
        sb["handshakes"],
        text.lines().last().unwrap_or("")
    );
    let handshakes = sa["handshakes"].as_u64().unwrap() + sb["handshakes"].as_u64().unwrap();
    assert!(
        handshakes >= 30,
        "too few rekeys to mean anything: A {sa} B {sb}"
    );
    assert_eq!(
        received, 500,
        "pings lost while recorded initiations were replayed across rekeys: {text}; A {sa}; B {sb}"
    );
}
