//! An attacker who can spoof the peer's channel address (here: a raw socket in the
//! sender's namespace, as anyone on the path could) sends forged datagrams into a
//! running `braid tunnel`: IP packets as header-free data, bare markers and hellos,
//! sequence headers far ahead, sealed-looking junk. Nothing of it may reach the
//! receiver's TUN device, in every receiver mode, and the tunnel must keep working.
//! Needs root, /dev/net/tun, `ip` and python3; without them the test says why it is
//! skipped. Namespaces are removed on every exit path.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{status, Lab, BIN};

fn skip_reason() -> Option<String> {
    common::netns_skip_reason(
        "network namespaces, a TUN device, raw sockets",
        &[("ip", "iproute2")],
        Some("sends the forgeries, counts the TUN"),
    )
}

/// Counts, on the TUN device `braids`, the packets carrying a tag, for `secs` seconds.
const CAPTURE: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(0x0003))
s.bind(("braids", 0)); s.settimeout(0.2)
end = time.time() + float(sys.argv[1]); spoof = genuine = 0
print("ready", flush=True)
while time.time() < end:
    try:
        p = s.recv(65536)
    except socket.timeout:
        continue
    spoof += b"SPOOFED" in p
    genuine += b"GENUINE" in p
print(spoof, genuine, flush=True)
"#;

/// Sends forged datagrams from 10.202.0.1:7000 (A's channel address) to B's channel
/// with a raw socket, then genuine UDP through the tunnel.
const ATTACK: &str = r#"
import socket, struct, sys
def csum(b):
    if len(b) % 2: b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16: s = (s & 0xffff) + (s >> 16)
    return ~s & 0xffff
def ip(src, dst, proto, payload):
    h = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 1, 0, 64, proto, 0,
                    socket.inet_aton(src), socket.inet_aton(dst))
    h = h[:10] + struct.pack("!H", csum(h)) + h[12:]
    return h + payload
def udp(src, sport, dst, dport, payload):
    return ip(src, dst, 17, struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload)
inner = udp("10.78.0.1", 4000, "10.78.0.2", 5555, b"SPOOFED" * 20)
forged = [
    inner,                                                        # header-free data
    b"\xb1\x01" + b"\x00" * 6 + b"\x00" * 7 + b"\x05" + b"\x00" * 16,  # bare marker
    b"\xb3\x7f\xff\xff\xff" + inner,                              # seq far ahead
    b"\xb6\x00\x00\x00\x01" + inner,                              # unasked repair
    b"\xb4\x01\x01\x00\x01" + b"\x00" * 19,                       # bare hello
    b"\xb8\x20\x00\x00\x00\x01" + b"\x00" * 4 + inner + b"\x00" * 16,  # junk sealed
    b"\xba\x01\x00\x00\x00\x00\x00\x07" + b"\x11" * 96,           # junk initiation
]
r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
n = 0
for i in range(300):
    for f in forged:
        r.sendto(udp("10.202.0.1", 7000, "10.202.0.2", 7000, f), ("10.202.0.2", 0)); n += 1
print(n, flush=True)
"#;

const GENUINE: &str = r#"
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(20):
    s.sendto(b"GENUINE" * 10, ("10.78.0.2", 5555)); time.sleep(0.02)
"#;

fn py(ns: &str, code: &str, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, "python3", "-c", code])
        .args(args);
    c
}

fn run_mode(mode: &str) {
    let id = std::process::id() % 100_000;
    let (na, nb) = (format!("bspa{id}"), format!("bspb{id}"));
    let dir = std::env::temp_dir().join(format!("braid-spoof-{id}-{mode}"));
    let mut lab = Lab::new(dir.clone());
    for n in [&na, &nb] {
        lab.add_ns(n);
    }
    let (va, vb) = (format!("bsa{id}"), format!("bsb{id}"));
    common::veth(&na, &va, "10.202.0.1/24", &nb, &vb, "10.202.0.2/24");
    let cfg = |addr: &str, ctl: &Path, l: &str, r: &str| {
        format!(
            "[tunnel]\nname = \"braids\"\naddress = \"{addr}\"\ncontrol = \"{}\"\n\n[session]\nmode = \"{mode}\"\nkey = \"1TmZIScY3/OtqxxyGcnv8N4FGBZHviUHPzrxwu6fHx4=\"\nheartbeat = \"20ms\"\ndead_after = \"200ms\"\n\n[[channel]]\nname = \"v0\"\nlocal = \"{l}\"\nremote = \"{r}\"\n",
            ctl.display()
        )
    };
    let (ca, cb) = (dir.join("a.sock"), dir.join("b.sock"));
    // Configs that hold the key inline must be private (as a key file).
    common::write_private(
        &dir.join("a.toml"),
        &cfg("10.78.0.1/24", &ca, "10.202.0.1:7000", "10.202.0.2:7000"),
    );
    common::write_private(
        &dir.join("b.toml"),
        &cfg("10.78.0.2/24", &cb, "10.202.0.2:7000", "10.202.0.1:7000"),
    );
    for (ns, file) in [(&na, "a.toml"), (&nb, "b.toml")] {
        lab.children.push(
            Command::new("ip")
                .args(["netns", "exec", ns, BIN, "tunnel", "--config"])
                .arg(dir.join(file))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
    }
    let t0 = Instant::now();
    while ![&ca, &cb]
        .iter()
        .all(|c| status(c).is_some_and(|s| s["peer_seen"] == true))
    {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "{mode}: tunnels did not come up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut capture = py(&nb, CAPTURE, &["4"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(capture.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let attack = py(&na, ATTACK, &[]).output().unwrap();
    assert!(
        attack.status.success(),
        "{}",
        String::from_utf8_lossy(&attack.stderr)
    );
    let sent: u64 = String::from_utf8_lossy(&attack.stdout)
        .trim()
        .parse()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let genuine = py(&na, GENUINE, &[]).output().unwrap();
    assert!(genuine.status.success());
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    let _ = capture.wait();
    let counts: Vec<u64> = line
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    let sb = status(&cb).expect("status of B");
    assert_eq!(
        counts[0], 0,
        "{mode}: forged packets reached the TUN; B's status: {sb}"
    );
    assert!(
        counts[1] >= 15,
        "{mode}: the tunnel stopped carrying genuine traffic after the attack ({} of 20); {sb}",
        counts[1]
    );
    let c0 = &sb["channels"][0];
    let dropped = c0["unauthenticated"].as_u64().unwrap()
        + c0["auth_failures"].as_u64().unwrap()
        + c0["rx_queue_drops"].as_u64().unwrap()
        + c0["rx_implausible"].as_u64().unwrap()
        + sb["handshake_failures"].as_u64().unwrap();
    assert!(
        dropped * 10 >= sent * 9,
        "{mode}: only {dropped} of {sent} forgeries counted; {sb}"
    );
    eprintln!("{mode}: {sent} forged datagrams, 0 reached the TUN, {dropped} counted as dropped, {} genuine arrived", counts[1]);
}

#[test]
fn spoofed_channel_datagrams_never_reach_the_tun_in_any_mode() {
    if let Some(why) = skip_reason() {
        common::skip(
            "spoofed_channel_datagrams_never_reach_the_tun_in_any_mode",
            &why,
        );
        return;
    }
    for mode in ["logical", "seq", "trr"] {
        run_mode(mode);
    }
}
