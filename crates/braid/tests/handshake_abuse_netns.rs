//! Issue 27 on real sockets: handshakes that no one can abuse. Two `braid tunnel`s in
//! two network namespaces joined by two veth pairs (two channels), or through a router
//! namespace that delays them; an attacker spoofs the ends' channel addresses with a
//! raw socket (from the sender's namespace, or from the router on the path):
//!
//! * a full-speed flood of random initiations (both handshake versions, the right
//!   lengths) on one channel must not stop a TCP flow through the tunnel (before: the
//!   responder did the Diffie-Hellman work of every one on the data task, and TCP fell
//!   from hundreds of Mbit/s to a few);
//! * genuine initiations of both ends, recorded on the path (a router that delays
//!   each packet 20 ms each way) and replayed at 1000/s, must cost no ping across
//!   rekeys every second. Before, each replay added an unconfirmed handshake to a list
//!   of 8 that pushed the genuine one out during the round trip before its
//!   confirmation, and one direction was dead until the next rekey: the build before
//!   issue 27 loses pings here (16 and 34 of 600). With the router's delay at 0 ms it
//!   lost none (the confirmation came before 8 replays did), hence the delay.
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
    common::netns_skip_reason(
        "network namespaces, a TUN device, raw sockets",
        &[("ip", "iproute2"), ("ping", "iputils-ping")],
        Some("the attacker and the TCP ends"),
    )
}

/// Namespaces, processes and files of one test; removed on drop.
struct Lab {
    na: String,
    nb: String,
    /// The router between them, if the paths have delay ([`Lab::with_delay`]).
    nr: Option<String>,
    /// The namespaces' removal, the processes and the files.
    net: common::Lab,
}

fn status(ctl: &Path) -> Option<Value> {
    common::status_of(&bin(), ctl)
}

impl Lab {
    /// Namespaces `hsa<id><tag>`/`hsb<id><tag>`, channel c on 10.212.<net+c>.0/24, the
    /// tunnel on 10.80.<net>.0/24, both tunnels up.
    fn new(tag: &str, net: u8) -> Lab {
        let id = std::process::id() % 100_000;
        let (na, nb) = (format!("hsa{id}{tag}"), format!("hsb{id}{tag}"));
        let dir = std::env::temp_dir().join(format!("braid-hsabuse-{id}-{tag}"));
        let mut base = common::Lab::new(dir);
        for n in [&na, &nb] {
            base.add_ns(n);
        }
        for c in 0..2u8 {
            let (va, vb) = (format!("hva{id}{tag}{c}"), format!("hvb{id}{tag}{c}"));
            let sub = net + c;
            common::veth(
                &na,
                &va,
                &format!("10.212.{sub}.1/24"),
                &nb,
                &vb,
                &format!("10.212.{sub}.2/24"),
            );
        }
        Lab {
            na,
            nb,
            nr: None,
            net: base,
        }
    }

    /// Like [`Lab::new`], but channel c runs through a router namespace `hsr<id><tag>`
    /// whose link emulator (`braid lab emulate`, this build's) holds every packet for
    /// `one_way` in each direction: A is 10.212.<net+c>.1, B 10.213.<net+c>.2, the router
    /// .254 on both. The replay test needs the round trip: the window between a
    /// responder's answer and the initiator's first datagram under the new keys is what
    /// replays used to fill.
    fn with_delay(tag: &str, net: u8, one_way: &str) -> Lab {
        let id = std::process::id() % 100_000;
        let (na, nb, nr) = (
            format!("hsa{id}{tag}"),
            format!("hsb{id}{tag}"),
            format!("hsr{id}{tag}"),
        );
        let dir = std::env::temp_dir().join(format!("braid-hsabuse-{id}-{tag}"));
        let mut lab = Lab {
            na: na.clone(),
            nb: nb.clone(),
            nr: Some(nr.clone()),
            net: common::Lab::new(dir),
        };
        for n in [&na, &nb, &nr] {
            lab.net.add_ns(n);
        }
        for v in [
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
        ] {
            sh(&["ip", "netns", "exec", &nr, "sysctl", "-qw", v]);
        }
        let mut links = vec![];
        for c in 0..2u8 {
            let sub = net + c;
            let (va, ra) = (format!("hva{id}{tag}{c}"), format!("hra{id}{tag}{c}"));
            let (rb, vb) = (format!("hrb{id}{tag}{c}"), format!("hvb{id}{tag}{c}"));
            let (a, ar) = (format!("10.212.{sub}.1/24"), format!("10.212.{sub}.254/24"));
            let (br, b) = (format!("10.213.{sub}.254/24"), format!("10.213.{sub}.2/24"));
            common::veth(&na, &va, &a, &nr, &ra, &ar);
            common::veth(&nr, &rb, &br, &nb, &vb, &b);
            let (to_b, to_a) = (format!("10.213.{sub}.0/24"), format!("10.212.{sub}.0/24"));
            let (via_a, via_b) = (format!("10.212.{sub}.254"), format!("10.213.{sub}.254"));
            sh(&["ip", "-n", &na, "route", "add", &to_b, "via", &via_a]);
            sh(&["ip", "-n", &nb, "route", "add", &to_a, "via", &via_b]);
            links.push(format!("10gbit/{one_way}"));
        }
        // The emulator opens t0 and t1 in the router; every packet entering the router
        // on channel c's veths is routed into t<c>, held, written back and forwarded.
        lab.net.children.push(
            Command::new("ip")
                .args(["netns", "exec", &nr, BIN, "lab", "emulate", "--links"])
                .arg(links.join(","))
                .arg("--state-dir")
                .arg(&lab.net.dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let t0 = Instant::now();
        loop {
            let devs = Command::new("ip")
                .args(["-n", &nr, "-o", "link", "show"])
                .output()
                .unwrap();
            let devs = String::from_utf8_lossy(&devs.stdout);
            if devs.contains(": t0:") && devs.contains(": t1:") {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the link emulator's devices did not appear"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        for c in 0..2u8 {
            let (t, table) = (format!("t{c}"), (100 + c).to_string());
            sh(&["ip", "-n", &nr, "link", "set", "dev", &t, "up"]);
            sh(&[
                "ip", "-n", &nr, "route", "add", "default", "dev", &t, "table", &table,
            ]);
            for side in ["hra", "hrb"] {
                let dev = format!("{side}{id}{tag}{c}");
                sh(&[
                    "ip", "-n", &nr, "rule", "add", "iif", &dev, "lookup", &table,
                ]);
            }
            sh(&[
                "ip",
                "netns",
                "exec",
                &nr,
                "sysctl",
                "-qw",
                &format!("net.ipv4.conf.{t}.rp_filter=0"),
            ]);
        }
        lab
    }

    /// End `end`'s address on channel `c` (its subnet `sub`).
    fn addr(&self, end: u8, sub: u8) -> String {
        if self.nr.is_some() && end == 2 {
            format!("10.213.{sub}.2")
        } else {
            format!("10.212.{sub}.{end}")
        }
    }

    fn ctl(&self, end: u8) -> PathBuf {
        self.net.dir.join(format!("t{end}.sock"))
    }

    /// End `end`'s static key pair: (private key file, public key).
    fn static_key(&self, end: u8) -> (PathBuf, String) {
        let path = self.net.dir.join(format!("k{end}.key"));
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
                    "\n[[channel]]\nname = \"c{c}\"\nlocal = \"{}:7000\"\nremote = \"{}:7000\"\n",
                    self.addr(end, sub),
                    self.addr(other, sub)
                );
            }
            let path = self.net.dir.join(format!("t{end}.toml"));
            std::fs::write(&path, cfg).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            let ns = if end == 1 { &self.na } else { &self.nb };
            self.net.children.push(
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
/// process sends them, for `secs` seconds: half in the current handshake version (the
/// fourth argument), half in version 1 (the format before issue 27), static keys, each
/// the right length.
const FLOOD: &str = r#"
import os, socket, struct, sys, time
src, dst, secs, version = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
def pkt(p):
    udp = struct.pack("!HHHH", 7000, 7000, 8 + len(p), 0) + p
    return struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0,
                       socket.inet_aton(src), socket.inet_aton(dst)) + udp
pool = []
for i in range(2048):
    pool.append(pkt(bytes([0xBA, version, 1, 0]) + os.urandom(188)))
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
            &[
                "10.212.10.1".into(),
                "10.212.10.2".into(),
                "5.5".into(),
                braid_proto::wire::secure::HS_VERSION.to_string(),
            ],
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
    // The flooder itself takes a core of the two this runs on, and the tunnel must read
    // some 300 000 flood datagrams a second besides its own: what that leaves depends on
    // the machine's scheduling, not only on braid (on 2026-11-26, with an unchanged
    // braid, 0.10–0.17 of a 2.2–2.7 Gbit/s flow; 0.78–1.02 of a slower one when this
    // test was written). What it guards against is the tunnel stopping: before issue
    // 27, TCP fell to a few Mbit/s, under 0.01 of the flow.
    assert!(
        during >= 0.05 * before,
        "the flood cut TCP through the tunnel from {before:.0} to {during:.0} Mbit/s \
         (per second: {per_s:.0?}); B: {sb}"
    );
    assert_eq!(sb["peer_seen"], true);
}

/// On the path (the router), records the initiations that cross `ifaces` from any of
/// `srcs` (the first `keep` distinct ones, from the start, both directions) and
/// replays them to where they went, spoofed, at `rate` per second in all from the
/// first one recorded, for `secs` seconds; prints how many it sent and how many it
/// recorded. It works on the UDP payload whatever the handshake's version (the build
/// before issue 27 sent version 1 initiations, without mac1).
const REPLAY: &str = r#"
import socket, struct, sys, threading, time
ifaces = sys.argv[1].split(","); srcs = sys.argv[2].split(","); rate = float(sys.argv[3])
secs = float(sys.argv[4]); keep = 200
recorded = []; seen = set(); lock = threading.Lock()
def capture(iface):
    # ETH_P_ALL: a socket for one protocol is not shown the packets the host sends.
    s = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(3))
    s.bind((iface, 0)); s.settimeout(0.2)
    while True:
        try:
            p, addr = s.recvfrom(65536)
        except socket.timeout:
            continue
        if addr[1] != 0x0800:
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
n = 0; i = 0; end = time.time() + secs; t0 = None
while time.time() < end:
    with lock:
        recs = list(recorded)
    if not recs:
        time.sleep(0.002)
        continue
    if t0 is None:
        t0 = time.time()
    due = int((time.time() - t0) * rate)
    while n < due:
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

/// Issue 27 item 2 on real sockets, with the round trip that made it bite: two
/// channels through a router that delays each packet 20 ms each way (40 ms round
/// trip), rekeys every second, and an attacker on the path who records every
/// initiation of both ends and replays them all, spoofed to their original source and
/// destination, at 1000/s in all (most go to the end that answers rekeys: the record
/// holds mostly the other's initiations) while A pings B every 50 ms for 30 s.
///
/// Before issue 27 the responder answered every replay and kept it as one of 8
/// unconfirmed handshakes: tens of replays reach it between its answer to a genuine
/// initiation and the first datagram under the new keys (a 40 ms round trip and up to
/// a heartbeat), so once 9 distinct initiations of the rekeying end are recorded the
/// genuine one is pushed out and its datagrams are dropped until the other end's
/// rekey, half a period later. On that build (`BRAID_TEST_BIN` pointing at it, commit
/// 4a2affc) this test lost 16 and 34 of 600 pings in two runs (outages of 300 ms to
/// 1.35 s, the first about 9 s in; 10 at 3000 replays/s); on this one, 0, with the
/// replays counted as refused.
///
/// Rekeys every second instead of the issue's 20 s over 70 s: what breaks is each
/// rekey's answer-to-confirmation window, which the round trip and the replay rate set
/// and the rekey period does not; a short period gives 20–30 rekeys in 30 s and the
/// recorded set passes 8 distinct initiations per end within 10 s. The outage after a
/// lost rekey scales with the period (half of it), not whether it happens.
#[test]
fn replayed_initiations_lose_no_pings_across_rekeys() {
    let name = "replayed_initiations_lose_no_pings_across_rekeys";
    if let Some(why) = skip_reason() {
        common::skip(name, &why);
        return;
    }
    let mut lab = Lab::with_delay("r", 20, "20ms");
    let id = std::process::id() % 100_000;
    let ifaces = format!("hra{id}r0,hra{id}r1");
    let ends = ["10.212.20.1", "10.212.21.1", "10.213.20.2", "10.213.21.2"].join(",");
    let nr = lab.nr.clone().unwrap();
    let mut replay = lab
        .py(&nr, REPLAY, &[ifaces, ends, "1000".into(), "32".into()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(replay.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    lab.start_tunnels("r", 20, "rekey_after = \"1s\"\n", false);
    let count = 600;
    let ping = Command::new("ip")
        .args([
            "netns", "exec", &lab.na, "ping", "-n", "-i", "0.05", "-W", "1",
        ])
        .args(["-c", &count.to_string(), "10.80.20.2"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&ping.stdout).into_owned();
    let sa = status(&lab.ctl(1)).expect("status of A");
    let sb = status(&lab.ctl(2)).expect("status of B");
    // The replayer stops 32 s after its first record, just after the pings.
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    let _ = replay.wait();
    let (sent, recorded) = line
        .split_once(' ')
        .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.trim().parse::<u64>().ok()?)))
        .unwrap_or_else(|| panic!("the replayer's report: {line:?}"));
    let answered: std::collections::BTreeSet<u64> = text
        .lines()
        .filter_map(|l| l.split("icmp_seq=").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    let lost: Vec<u64> = (1..=count).filter(|s| !answered.contains(s)).collect();
    let mut longest = 0;
    let mut run = 0;
    for s in 1..=count {
        run = if answered.contains(&s) { 0 } else { run + 1 };
        longest = longest.max(run);
    }
    eprintln!(
        "{sent} replays of {recorded} recorded initiations; {} of {count} pings lost \
         ({:.1} %), longest gap {} ms; handshakes A {} B {}; replays refused: A {} B {}; {}",
        lost.len(),
        100.0 * lost.len() as f64 / count as f64,
        longest * 50,
        sa["handshakes"],
        sb["handshakes"],
        sa["handshake_replays"],
        sb["handshake_replays"],
        text.lines().last().unwrap_or("")
    );
    let handshakes = sa["handshakes"].as_u64().unwrap() + sb["handshakes"].as_u64().unwrap();
    assert!(
        handshakes >= 20,
        "too few rekeys to mean anything: A {sa} B {sb}"
    );
    assert!(
        sent >= 25_000 && recorded >= 18,
        "the replays were too few to mean anything: {sent} sent of {recorded} recorded"
    );
    // This build counts the initiations it did not answer (the build before issue 27
    // had no such counter): most replays must have reached the two ends.
    if let (Some(a), Some(b)) = (
        sa["handshake_replays"].as_u64(),
        sb["handshake_replays"].as_u64(),
    ) {
        assert!(
            a + b >= sent / 2,
            "only {} of {sent} replays were refused: did they reach the tunnels?",
            a + b
        );
    }
    assert!(
        lost.is_empty(),
        "{} pings lost while recorded initiations were replayed across rekeys (seq {lost:?}): \
         {text}; A {sa}; B {sb}",
        lost.len()
    );
}
