//! The overlay's keys on real sockets (issue 27, item 5). Four namespaces on one bridge,
//! nodes 0 (source of a flow to 2), 1 (relay) and 2 (destination) running `braid node`;
//! node 3 is a member whose private key the attacker holds. With the flow provisioned
//! through node 1:
//!
//! * the member 3 claims to be node 0 (a HELLO under its own key, a TEARDOWN whose
//!   trailer names node 0, a TEARDOWN of node 0's flow under its own name): node 1
//!   tears nothing down;
//! * DATA datagrams of the flow spoofed from node 0's address (a raw socket in node 0's
//!   namespace), bare or with a made-up trailer: node 1 forwards none;
//! * node 0's UPDATE, PROVISION and TEARDOWN, recorded on node 1's link, replayed from
//!   node 0's address after node 1 restarted: node 1 takes none.
//!
//! Needs root, `ip` and python3 (the raw socket and the recorder); without them the test
//! says why it is skipped. Namespaces and processes are removed on every exit path.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use braid_io::keys;
use braid_proto::overlay::auth::NodeAuth;
use braid_proto::wire::overlay::Repr;

const BIN: &str = env!("CARGO_BIN_EXE_braid");
const PORT: u16 = 7400;

mod common;
use common::sh;

fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (network namespaces, raw sockets)".into());
    }
    if let Some(why) = common::missing_tool(&[("ip", "iproute2")]) {
        return Some(why);
    }
    if let Some(why) = common::missing_python("sends the spoofed DATA, records the link") {
        return Some(why);
    }
    None
}

/// Namespaces, processes and files of the test; removed on drop.
struct Lab {
    ns: Vec<String>,
    children: BTreeMap<String, Child>,
    dir: PathBuf,
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in self.children.values_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for n in &self.ns {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn addr(k: usize) -> String {
    format!("10.204.0.{}", k + 1)
}

/// What a node's `--table-every` output said last.
#[derive(Debug, Default)]
struct Seen {
    forwarded: u64,
    refused: u64,
    hellos: u64,
    provisions: u64,
    teardowns: u64,
    flow_refused: u64,
    /// (flow, src, dst, slot)
    relayed: Vec<(u32, u16, u16, u8)>,
    /// Rows of the table: (from, to).
    hops: Vec<(u16, u16)>,
}

fn num_after(line: &str, word: &str) -> u64 {
    // "... 12 datagrams refused ...": the number before `word`.
    let toks: Vec<&str> = line.split_whitespace().collect();
    toks.iter()
        .position(|t| t.trim_end_matches([',', ';']) == word)
        .and_then(|i| toks.get(i.wrapping_sub(1)))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The last complete block of `braid node --table-every` output in `file`.
fn seen(file: &Path) -> Option<Seen> {
    let text = std::fs::read_to_string(file).ok()?;
    let blocks: Vec<&str> = text.split("\nrelaying ").collect();
    // The last block may still be being written: take the one before it.
    if blocks.len() < 3 {
        return None;
    }
    let b = blocks[blocks.len() - 2];
    let mut s = Seen::default();
    for line in b.lines() {
        if line.contains("DATA datagrams forwarded") {
            s.forwarded = num_after(line, "DATA");
        } else if let Some(r) = line.strip_prefix("relayed flow ") {
            // "1a2b3c4d 0->2 slot 1"
            let t: Vec<&str> = r.split_whitespace().collect();
            let (src, dst) = t[1].split_once("->")?;
            s.relayed.push((
                u32::from_str_radix(t[0], 16).ok()?,
                src.parse().ok()?,
                dst.parse().ok()?,
                t[3].parse().ok()?,
            ));
        } else if line.starts_with("authentication:") {
            s.refused = num_after(line, "datagrams");
            s.hellos = num_after(line, "HELLOs");
            s.provisions = num_after(line, "PROVISIONs");
            s.teardowns = num_after(line, "TEARDOWNs");
            s.flow_refused = num_after(line, "refused");
            // "refused" appears twice; the flow one is the last.
            s.flow_refused = line
                .rsplit_once(',')
                .map(|(_, r)| num_after(r, "refused"))
                .unwrap_or(s.flow_refused);
        } else if let Some(r) = line.strip_prefix("hop ") {
            let h = r.split(':').next()?;
            let (a, b) = h.split_once("->")?;
            s.hops.push((a.parse().ok()?, b.parse().ok()?));
        }
    }
    Some(s)
}

fn wait_seen(file: &Path, what: &str, secs: u64, ok: impl Fn(&Seen) -> bool) -> Seen {
    let t0 = Instant::now();
    loop {
        if let Some(s) = seen(file) {
            if ok(&s) {
                return s;
            }
        }
        if t0.elapsed() > Duration::from_secs(secs) {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            let tail: String = text
                .lines()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            panic!("timed out waiting for {what}; {}:\n{tail}", file.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn py(ns: &str, code: &str, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, "python3", "-c", code])
        .args(args);
    c
}

/// Records, on the interface argv[1], node 0's ALCP UPDATE (1), PROVISION (2) and
/// TEARDOWN (3) to node 1 (the last of each kind), until the file argv[2] exists;
/// prints `kind hex` lines.
const RECORD: &str = r#"
import os, socket, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(0x0003))
s.bind((sys.argv[1], 0)); s.settimeout(0.1)
src = socket.inet_aton("10.204.0.1"); dst = socket.inet_aton("10.204.0.2")
got = {}
print("ready", flush=True)
while not os.path.exists(sys.argv[2]):
    try:
        p = s.recv(65536)
    except socket.timeout:
        continue
    if len(p) < 28 or p[0] >> 4 != 4 or p[9] != 17 or p[12:16] != src or p[16:20] != dst:
        continue
    ihl = (p[0] & 15) * 4
    u = p[ihl:]
    if int.from_bytes(u[2:4], "big") != 7400:
        continue
    d = u[8:]
    if len(d) > 3 and d[0] == 0xB0 and d[2] in (1, 2, 3):
        got[d[2]] = d.hex()
for k, v in sorted(got.items()):
    print(k, v, flush=True)
"#;

/// Sends argv[1] DATA datagrams of flow argv[2], slot argv[3] from node 0's address to
/// node 1 with a raw socket: half bare (as before per-hop authentication), half with a
/// made-up trailer naming node 0.
const SPOOF_DATA: &str = r#"
import socket, struct, sys, time
def csum(b):
    if len(b) % 2: b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16: s = (s & 0xffff) + (s >> 16)
    return ~s & 0xffff
def udp(src, sport, dst, dport, payload):
    u = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
    h = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(u), 1, 0, 64, 17, 0,
                    socket.inet_aton(src), socket.inet_aton(dst))
    h = h[:10] + struct.pack("!H", csum(h)) + h[12:]
    return h + u
n, flow, slot = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
for i in range(n):
    d = bytes([0xB0, 1, 6, slot]) + struct.pack("!I", flow) + b"SPOOFED" * 40
    if i % 2:
        d += struct.pack("!HQ", 0, 1000 + i) + bytes(16)
    r.sendto(udp("10.204.0.1", 7400, "10.204.0.2", 7400, d), ("10.204.0.2", 0))
    if i % 10 == 9:
        time.sleep(0.002)  # paced, so that a busy host's socket buffer takes them all
print(n, flush=True)
"#;

/// Sends the hex datagrams argv[1:] from node 0's address and port (node 0 is stopped)
/// to node 1, each three times.
const REPLAY: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("10.204.0.1", 7400))
for _ in range(3):
    for h in sys.argv[1:]:
        s.sendto(bytes.fromhex(h), ("10.204.0.2", 7400))
    time.sleep(0.05)
"#;

fn config(k: usize, keys: &[[u8; 32]]) -> String {
    let mut s = format!(
        "id = {k}\nlisten = \"{}:{PORT}\"\nprivate_key_file = \"node{k}.key\"\n\n",
        addr(k)
    );
    for p in (0..keys.len()).filter(|&p| p != k) {
        s += &format!(
            "[[peer]]\nid = {p}\naddr = \"{}:{PORT}\"\npublic_key = \"{}\"\n\n",
            addr(p),
            keys::encode(&keys::public_key(&keys[p]))
        );
    }
    s += "[probe]\nping_ms = 50\nslot_ms = 60\ntrain = 10\ntrain_bytes = 1000\n\
          update_ms = 100\ndead_after_ms = 1500\neval_ms = 50\n\n\
          [route]\nmax_paths = 2\n\n";
    match k {
        0 => s += "[flow]\nto = 2\nsettle_ms = 1500\n",
        2 => s += "[flow]\n",
        _ => {}
    }
    s
}

fn start_node(lab: &mut Lab, k: usize, ns: &str, out: &str) -> PathBuf {
    let file = lab.dir.join(out);
    let child = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            BIN,
            "node",
            "--table-every",
            "0.2",
            "--config",
        ])
        .arg(lab.dir.join(format!("node{k}.toml")))
        .stdout(Stdio::from(std::fs::File::create(&file).unwrap()))
        .stderr(Stdio::from(
            std::fs::File::create(lab.dir.join(format!("{out}.err"))).unwrap(),
        ))
        .spawn()
        .unwrap();
    lab.children.insert(format!("node{k}"), child);
    file
}

/// Run `f` on a thread inside namespace `ns` (its sockets are that namespace's).
fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        use std::os::fd::AsRawFd;
        let fd = std::fs::File::open(&path).unwrap();
        // SAFETY: setns on an open namespace file; affects this thread only.
        let r = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .unwrap()
}

/// Member 3, holding only its own private key, tries to act as node 0 towards node 1.
/// Returns what it managed to send.
fn impersonate(m_private: [u8; 32], r_public: [u8; 32], flow: u32) -> usize {
    let sock = std::net::UdpSocket::bind(format!("{}:{PORT}", addr(3))).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let r = format!("{}:{PORT}", addr(1));
    let mut e = [0u8; 32];
    e.copy_from_slice(&keys::generate().unwrap());
    let teardown = Repr::Teardown {
        flow,
        src: 0,
        dst: 2,
    }
    .to_vec()
    .unwrap();
    // 1. A HELLO as node 0, made with member 3's key: node 1 cannot verify it as 0's.
    let fake0 = NodeAuth::new(0, &m_private, &[(1, r_public)], e).unwrap();
    for _ in 0..5 {
        sock.send_to(&fake0.hello(1).unwrap(), &r).unwrap();
    }
    // 2. As itself (a genuine member), keys with node 1.
    let mut me = NodeAuth::new(3, &m_private, &[(1, r_public)], keys::generate().unwrap()).unwrap();
    let mut buf = [0u8; 2048];
    let t0 = Instant::now();
    while !me.established(1) {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "member 3 got no keys with node 1"
        );
        sock.send_to(&me.hello(1).unwrap(), &r).unwrap();
        while let Ok((n, _)) = sock.recv_from(&mut buf) {
            if NodeAuth::is_hello(&buf[..n]) {
                if let Ok(o) = me.on_hello(braid_proto::Instant::ZERO, &buf[..n]) {
                    if let Some(reply) = o.reply {
                        sock.send_to(&reply, &r).unwrap();
                    }
                }
            } else {
                // Node 1's PINGs and UPDATEs prove it holds the keys.
                let _ = me.open(&buf[..n]);
            }
            if me.established(1) {
                break;
            }
        }
    }
    let mut sent = 0;
    for _ in 0..5 {
        // 3. Sealed by 3, the trailer rewritten to name node 0.
        let mut d = me.seal(1, &teardown).unwrap();
        let at = d.len() - 26;
        d[at..at + 2].copy_from_slice(&0u16.to_be_bytes());
        sock.send_to(&d, &r).unwrap();
        // 4. Sealed by 3 under its own name, for node 0's flow.
        sock.send_to(&me.seal(1, &teardown).unwrap(), &r).unwrap();
        sent += 2;
    }
    sent
}

#[test]
fn overlay_nodes_refuse_impersonation_spoofed_data_and_replays_after_restart() {
    let name = "overlay_nodes_refuse_impersonation_spoofed_data_and_replays_after_restart";
    if let Some(why) = skip_reason() {
        common::skip(name, &why);
        return;
    }
    let id = std::process::id() % 100_000;
    let dir = std::env::temp_dir().join(format!("braid-ovl-keys-{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut lab = Lab {
        ns: vec![],
        children: BTreeMap::new(),
        dir: dir.clone(),
    };
    // A hub namespace with a bridge; one namespace per node on it.
    let hub = format!("bovh{id}");
    sh(&["ip", "netns", "add", &hub]);
    lab.ns.push(hub.clone());
    sh(&["ip", "-n", &hub, "link", "add", "br0", "type", "bridge"]);
    sh(&["ip", "-n", &hub, "link", "set", "br0", "up"]);
    let ns: Vec<String> = (0..4).map(|k| format!("bov{k}n{id}")).collect();
    for (k, n) in ns.iter().enumerate() {
        sh(&["ip", "netns", "add", n]);
        lab.ns.push(n.clone());
        let (a, b) = (format!("bo{k}a{id}"), format!("bo{k}b{id}"));
        sh(&[
            "ip", "link", "add", &a, "netns", n, "type", "veth", "peer", "name", &b, "netns", &hub,
        ]);
        sh(&["ip", "-n", &hub, "link", "set", &b, "master", "br0", "up"]);
        sh(&[
            "ip",
            "-n",
            n,
            "addr",
            "add",
            &format!("{}/24", addr(k)),
            "dev",
            &a,
        ]);
        sh(&["ip", "-n", n, "link", "set", &a, "up"]);
        sh(&["ip", "-n", n, "link", "set", "lo", "up"]);
    }
    let keys: Vec<[u8; 32]> = (0..4).map(|_| keys::generate().unwrap()).collect();
    for (k, key) in keys.iter().enumerate() {
        let kf = dir.join(format!("node{k}.key"));
        std::fs::write(&kf, keys::encode(key) + "\n").unwrap();
        std::fs::set_permissions(&kf, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(dir.join(format!("node{k}.toml")), config(k, &keys)).unwrap();
    }
    // Record node 0's datagrams on node 1's link from the start.
    let stop_rec = dir.join("stop-recording");
    let mut rec = py(
        &ns[1],
        RECORD,
        &[&format!("bo1a{id}"), stop_rec.to_str().unwrap()],
    )
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut rec_out = std::io::BufReader::new(rec.stdout.take().unwrap());
    lab.children.insert("recorder".into(), rec);
    let mut line = String::new();
    std::io::BufRead::read_line(&mut rec_out, &mut line).unwrap();
    assert_eq!(line.trim(), "ready");

    let out0 = start_node(&mut lab, 0, &ns[0], "node0.out");
    let out1 = start_node(&mut lab, 1, &ns[1], "node1.out");
    let _out2 = start_node(&mut lab, 2, &ns[2], "node2.out");
    let _ = out0;
    let s = wait_seen(&out1, "node 0's flow relayed by node 1", 20, |s| {
        s.relayed.iter().any(|r| r.1 == 0 && r.2 == 2)
    });
    let &(flow, _, _, slot) = s.relayed.iter().find(|r| r.1 == 0).unwrap();
    eprintln!("flow {flow:08x} relayed by node 1 on slot {slot}: {s:?}");
    assert_eq!(s.teardowns, 0);

    // 1. Member 3 claims to be node 0.
    let (m, r) = (keys[3], keys::public_key(&keys[1]));
    let sent = in_netns(&ns[3], move || impersonate(m, r, flow));
    std::thread::sleep(Duration::from_millis(700));
    let after = wait_seen(&out1, "node 1's counters after the impersonation", 5, |x| {
        x.flow_refused >= 1
    });
    assert_eq!(
        after.teardowns, 0,
        "node 1 took a TEARDOWN of node 0's flow from member 3 ({sent} sent): {after:?}"
    );
    assert!(
        after.relayed.iter().any(|r| r.0 == flow),
        "node 1 no longer relays the flow: {after:?}"
    );
    assert!(after.refused >= s.refused + 5, "{after:?}");

    // 2. DATA of the flow spoofed from node 0's address.
    std::thread::sleep(Duration::from_millis(500));
    let before = seen(&out1).unwrap();
    let spoof = py(
        &ns[0],
        SPOOF_DATA,
        &["200", &flow.to_string(), &slot.to_string()],
    )
    .output()
    .unwrap();
    assert!(
        spoof.status.success(),
        "{}",
        String::from_utf8_lossy(&spoof.stderr)
    );
    // Nine in ten counted as refused (a loaded host may drop some from the socket
    // buffer), none forwarded.
    let data = wait_seen(&out1, "node 1 counting the spoofed DATA", 5, |x| {
        x.refused >= before.refused + 180 || x.forwarded > 0
    });
    std::thread::sleep(Duration::from_millis(500));
    let data = seen(&out1).unwrap_or(data);
    assert_eq!(data.forwarded, 0, "node 1 forwarded spoofed DATA: {data:?}");

    // 3. Node 0 stops (its TEARDOWN is taken), node 1 restarts, node 0's recorded
    // UPDATE, PROVISION and TEARDOWN are replayed from its address.
    let mut n0 = lab.children.remove("node0").unwrap();
    // SAFETY: kill with a pid of our own child.
    unsafe { libc::kill(n0.id() as i32, libc::SIGTERM) };
    let _ = n0.wait();
    let down = wait_seen(&out1, "node 0's TEARDOWN at node 1", 5, |x| {
        x.teardowns >= 1
    });
    assert!(down.relayed.is_empty(), "{down:?}");
    std::fs::write(&stop_rec, b"").unwrap();
    let mut recorded: Vec<(u8, String)> = Vec::new();
    loop {
        line.clear();
        if std::io::BufRead::read_line(&mut rec_out, &mut line).unwrap() == 0 {
            break;
        }
        if let Some((k, h)) = line.trim().split_once(' ') {
            recorded.push((k.parse().unwrap(), h.to_string()));
        }
    }
    let kinds: Vec<u8> = recorded.iter().map(|r| r.0).collect();
    assert_eq!(kinds, [1, 2, 3], "recorded kinds");
    let mut n1 = lab.children.remove("node1").unwrap();
    let _ = n1.kill();
    let _ = n1.wait();
    let out1b = start_node(&mut lab, 1, &ns[1], "node1-restarted.out");
    // The restarted node 1 has new keys with node 2 and measures again.
    let fresh = wait_seen(
        &out1b,
        "the restarted node 1 running with node 2",
        10,
        |x| x.hellos >= 1 && x.hops.contains(&(2, 1)),
    );
    let hexes: Vec<&str> = recorded.iter().map(|r| r.1.as_str()).collect();
    let replay = py(&ns[0], REPLAY, &hexes).output().unwrap();
    assert!(
        replay.status.success(),
        "{}",
        String::from_utf8_lossy(&replay.stderr)
    );
    std::thread::sleep(Duration::from_millis(1000));
    let after = wait_seen(&out1b, "node 1 counting the replays", 5, |x| {
        x.refused >= fresh.refused + 3 || x.provisions > 0 || x.teardowns > 0
    });
    assert_eq!(
        (after.provisions, after.teardowns),
        (0, 0),
        "the restarted node 1 took a recorded PROVISION or TEARDOWN: {after:?}"
    );
    assert!(after.relayed.is_empty(), "{after:?}");
    assert!(
        !after.hops.iter().any(|h| h.0 == 0),
        "the restarted node 1 took a recorded UPDATE of node 0: {after:?}"
    );
    eprintln!(
        "impersonation: {sent} TEARDOWNs, 0 taken; spoofed DATA: 200 sent, 0 forwarded; \
         replay after restart: {} datagrams, 0 taken ({} refused)",
        3 * hexes.len(),
        after.refused - fresh.refused
    );
}
