//! Shared by the integration tests that need root, namespaces or outside tools.

use std::io::Write;

/// Record that `test` cannot run here and why: printed, and appended to the file named
/// by `BRAID_SKIP_LOG` (set by `scripts/test.sh`, whose closing line then counts the
/// test as skipped, not passed).
pub fn skip(test: &str, why: &str) {
    eprintln!("SKIPPED {test}: {why}");
    if let Ok(path) = std::env::var("BRAID_SKIP_LOG") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{test}: {why}");
        }
    }
}

/// The first of `tools` (command, Debian package) that is not installed, as a reason.
pub fn missing_tool(tools: &[(&str, &str)]) -> Option<String> {
    tools.iter().find_map(|(cmd, pkg)| {
        braid_lab::tools::find(cmd)
            .is_none()
            .then(|| format!("`{cmd}` is not installed (apt-get install {pkg})"))
    })
}

/// Why a namespace lab test cannot run here (root, iproute2, ping, iperf3, /dev/net/tun),
/// or `None`.
#[allow(dead_code)] // not every test binary that includes `common` runs a lab
pub fn lab_skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root: network namespaces need CAP_NET_ADMIN".into());
    }
    if let Some(why) = missing_tool(&[
        ("ip", "iproute2"),
        ("tc", "iproute2"),
        ("ping", "iputils-ping"),
        ("iperf3", "iperf3"),
    ]) {
        return Some(why);
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Some("/dev/net/tun is missing".into());
    }
    None
}

/// Run a command and assert that it succeeded (its stderr in the failure).
#[allow(dead_code)] // not every test binary that includes `common` runs commands
pub fn sh(args: &[&str]) {
    let out = std::process::Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{:?} failed: {}",
        args,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `python3` missing (needed here for `purpose`), as a reason; `None` if it runs.
#[allow(dead_code)] // not every test binary that includes `common` drives python
pub fn missing_python(purpose: &str) -> Option<String> {
    let runs = std::process::Command::new("python3")
        .args(["-c", "pass"])
        .output()
        .is_ok_and(|o| o.status.success());
    (!runs).then(|| format!("python3 is not available ({purpose})"))
}

// ---- The namespace tests' shared set-up (nat, ipv6, service, status page, tunnel,
// spoof, handshake abuse): skip reasons, namespaces and veth pairs, the tunnels'
// processes, `braid status`, ping. Not every test binary uses every item.

/// The braid binary under test.
#[allow(dead_code)]
pub const BIN: &str = env!("CARGO_BIN_EXE_braid");

/// Why a test that needs network namespaces and TUN devices cannot run here: not root
/// (`root_for`: what the test needs root for), no /dev/net/tun, one of `tools` missing,
/// or python3 missing (`python_for`: what the test uses it for, if it does); `None` if
/// it can run.
#[allow(dead_code)]
pub fn netns_skip_reason(
    root_for: &str,
    tools: &[(&str, &str)],
    python_for: Option<&str>,
) -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some(format!("needs root ({root_for})"));
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Some("/dev/net/tun does not exist".into());
    }
    if let Some(why) = missing_tool(tools) {
        return Some(why);
    }
    python_for.and_then(missing_python)
}

/// Namespaces, processes and files of one test; all removed on drop (every exit path,
/// a failed assertion included): the processes killed first, then the namespaces
/// deleted, then the directory.
#[allow(dead_code)]
pub struct Lab {
    pub ns: Vec<String>,
    pub children: Vec<std::process::Child>,
    pub dir: std::path::PathBuf,
}

#[allow(dead_code)]
impl Lab {
    /// A lab whose files go in `dir` (created).
    pub fn new(dir: std::path::PathBuf) -> Lab {
        std::fs::create_dir_all(&dir).unwrap();
        Lab {
            ns: vec![],
            children: vec![],
            dir,
        }
    }

    /// Add namespace `name` (removed with the lab) with its loopback up.
    pub fn add_ns(&mut self, name: &str) {
        sh(&["ip", "netns", "add", name]);
        self.ns.push(name.to_string());
        sh(&["ip", "-n", name, "link", "set", "dev", "lo", "up"]);
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for n in &self.ns {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", n])
                .output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A veth pair `va` (in namespace `na`, address `aa`, with prefix length) to `vb` (in
/// `nb`, address `ab`), both ends up. IPv6 addresses skip duplicate address detection,
/// so they are usable at once.
#[allow(dead_code)]
pub fn veth(na: &str, va: &str, aa: &str, nb: &str, vb: &str, ab: &str) {
    sh(&[
        "ip", "link", "add", va, "netns", na, "type", "veth", "peer", "name", vb, "netns", nb,
    ]);
    for (n, dev, addr) in [(na, va, aa), (nb, vb, ab)] {
        let mut cmd = vec!["ip", "-n", n, "addr", "add", addr, "dev", dev];
        if addr.contains(':') {
            cmd.push("nodad");
        }
        sh(&cmd);
        sh(&["ip", "-n", n, "link", "set", "dev", dev, "up"]);
    }
}

/// Start `braid tunnel --config CFG` in namespace `ns` (its log on a pipe).
#[allow(dead_code)]
pub fn start_tunnel(ns: &str, cfg: &std::path::Path) -> std::process::Child {
    std::process::Command::new("ip")
        .args(["netns", "exec", ns, BIN, "tunnel", "--config"])
        .arg(cfg)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Write a file only its owner can read (a configuration that holds a key inline).
#[allow(dead_code)]
pub fn write_private(path: &std::path::Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// `braid status --json` of the tunnel whose control socket is `ctl`, run by `bin`;
/// `None` while it does not answer.
#[allow(dead_code)]
pub fn status_of(bin: &str, ctl: &std::path::Path) -> Option<serde_json::Value> {
    let out = std::process::Command::new(bin)
        .args(["status", "--json", "--control", ctl.to_str().unwrap()])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// `braid status --json` by this build's braid (see [`status_of`]).
#[allow(dead_code)]
pub fn status(ctl: &std::path::Path) -> Option<serde_json::Value> {
    status_of(BIN, ctl)
}

/// One ping from namespace `ns` to `to` (IPv4 or IPv6), answered within `wait_ms`?
#[allow(dead_code)]
pub fn ping(ns: &str, to: &str, wait_ms: u32) -> bool {
    let family = if to.contains(':') { "-6" } else { "-4" };
    std::process::Command::new("ip")
        .args(["netns", "exec", ns, "ping", family, "-c", "1", "-n", "-q"])
        .args(["-W", &format!("{:.3}", f64::from(wait_ms) / 1000.0), to])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Ping until answered; how long that took (panics after `limit`).
#[allow(dead_code)]
pub fn ping_until(ns: &str, to: &str, limit: std::time::Duration) -> std::time::Duration {
    let t0 = std::time::Instant::now();
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

/// Receives one TCP connection on `argv[1]`:5003 and prints its length and SHA-256.
#[allow(dead_code)]
const TCP_SINK: &str = r#"
import socket, hashlib, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5003)); s.listen(1); s.settimeout(30)
c, _ = s.accept(); c.settimeout(30)
h = hashlib.sha256(); n = 0
while True:
    b = c.recv(65536)
    if not b: break
    h.update(b); n += len(b)
print(n, h.hexdigest())
"#;

/// Sends 8 MiB to `argv[1]`:5003 in large writes; prints their length and SHA-256.
#[allow(dead_code)]
const TCP_SOURCE: &str = r#"
import socket, hashlib, random, sys, time
data = random.Random(7).randbytes(8 * 1024 * 1024)
for i in range(100):
    try:
        s = socket.create_connection((sys.argv[1], 5003), timeout=30); break
    except OSError:
        time.sleep(0.1)
s.sendall(data); s.close()
print(len(data), hashlib.sha256(data).hexdigest())
"#;

/// 8 MiB over one TCP connection from namespace `from` to `addr` in namespace `to`
/// (python3 at both ends): what was sent and what arrived, each as "length sha256",
/// or the side's error output if it failed.
#[allow(dead_code)]
pub fn tcp_transfer(from: &str, to: &str, addr: &str) -> (String, String) {
    use std::process::{Command, Stdio};
    let sink = Command::new("ip")
        .args(["netns", "exec", to, "python3", "-c", TCP_SINK, addr])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let source = Command::new("ip")
        .args(["netns", "exec", from, "python3", "-c", TCP_SOURCE, addr])
        .output()
        .unwrap();
    let got = sink.wait_with_output().unwrap();
    (text(&source), text(&got))
}

/// Two tunnel ends in their namespaces, joined by two veth pairs, up and measured
/// (`two_ends`).
#[allow(dead_code)]
pub struct Ends {
    /// The namespaces and tunnels (cleaned up when dropped).
    pub _lab: Lab,
    pub na: String,
    pub nb: String,
    /// Control sockets.
    pub ca: std::path::PathBuf,
    pub cb: std::path::PathBuf,
    /// The veth devices (A's, B's) of each channel.
    pub devs: Vec<(String, String)>,
}

/// Two namespaces joined by two veth pairs (`10.<net>.<i>.1` at A, `.2` at B), a
/// tunnel at each end with one channel per pair, both up, and a second for the
/// channels' round trips to be measured. `name` names the namespaces, devices and TUN
/// devices (a few letters), `tag` keeps two tests' apart; the tunnels' addresses are
/// `<inner>.1/24` (A) and `<inner>.2/24` (B); `session` goes into both ends'
/// `[session]` after the key.
#[allow(dead_code)]
pub fn two_ends(name: &str, tag: &str, net: u8, inner: &str, session: &str) -> Ends {
    let id = std::process::id() % 100_000;
    let (na, nb) = (format!("br{name}a{tag}{id}"), format!("br{name}b{tag}{id}"));
    let dir = std::env::temp_dir().join(format!("braid-{name}-netns-{tag}{id}"));
    let mut lab = Lab::new(dir.clone());
    for n in [&na, &nb] {
        lab.add_ns(n);
    }
    let (mut a_ch, mut b_ch, mut devs) = (Vec::new(), Vec::new(), Vec::new());
    let short = &name[..1];
    for i in 0..2 {
        let (va, vb) = (
            format!("b{short}a{tag}{id}v{i}"),
            format!("b{short}b{tag}{id}v{i}"),
        );
        let (aa, ab) = (format!("10.{net}.{i}.1"), format!("10.{net}.{i}.2"));
        veth(&na, &va, &format!("{aa}/24"), &nb, &vb, &format!("{ab}/24"));
        a_ch.push((format!("{aa}:7100"), format!("{ab}:7100")));
        b_ch.push((format!("{ab}:7100"), format!("{aa}:7100")));
        devs.push((va, vb));
    }
    let (ca, cb) = (dir.join("a.sock"), dir.join("b.sock"));
    let config = |addr: &str, ctl: &std::path::Path, chans: &[(String, String)]| {
        let mut s = format!(
            "[tunnel]\nname = \"br{name}\"\naddress = \"{addr}\"\ncontrol = \"{}\"\nlog_interval = \"1s\"\n\n[session]\nkey = \"AyHDMTOweHmwGSs7vubt5lmmRKjx62UXkWxeQzJRXms=\"\n{session}",
            ctl.display()
        );
        for (i, (l, r)) in chans.iter().enumerate() {
            s += &format!("\n[[channel]]\nname = \"v{i}\"\nlocal = \"{l}\"\nremote = \"{r}\"\n");
        }
        s
    };
    write_private(
        &dir.join("a.toml"),
        &config(&format!("{inner}.1/24"), &ca, &a_ch),
    );
    write_private(
        &dir.join("b.toml"),
        &config(&format!("{inner}.2/24"), &cb, &b_ch),
    );
    lab.children.push(start_tunnel(&na, &dir.join("a.toml")));
    lab.children.push(start_tunnel(&nb, &dir.join("b.toml")));
    let t0 = std::time::Instant::now();
    while ![&ca, &cb]
        .iter()
        .all(|c| status(c).is_some_and(|s| s["peer_seen"] == true))
    {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(15),
            "tunnels did not come up"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_secs(1));
    Ends {
        _lab: lab,
        na,
        nb,
        ca,
        cb,
        devs,
    }
}

/// Drop (`-A`) or pass again (`-D`) the channel's UDP arriving on `dev` in `ns`.
#[allow(dead_code)]
pub fn blackhole(ns: &str, dev: &str, op: &str) {
    sh(&[
        "ip", "netns", "exec", ns, "iptables", op, "INPUT", "-i", dev, "-p", "udp", "-j", "DROP",
    ]);
}

/// A server on `argv[1]`, port 5001: reads to the end (the client's half-close), then
/// answers with the length and SHA-256 of what it read and 1 MiB of its own, and
/// closes.
#[allow(dead_code)]
pub const ECHO_SUM: &str = r#"
import socket, hashlib, random, sys
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind((sys.argv[1], 5001)); l.listen(1); l.settimeout(30)
c, peer = l.accept(); c.settimeout(30)
h = hashlib.sha256(); n = 0
while True:
    b = c.recv(65536)
    if not b: break
    h.update(b); n += len(b)
c.sendall(("%d %s\n" % (n, h.hexdigest())).encode() + random.Random(3).randbytes(1 << 20))
c.close()
print(peer[0])
"#;

/// A client of `ECHO_SUM` at `argv[1]`: sends `argv[2]` bytes (paced to `argv[3]` bytes
/// a second if given), half-closes, and checks the answer: prints `ok`, or what was wrong.
#[allow(dead_code)]
pub const SEND_SUM: &str = r#"
import socket, hashlib, random, sys, time
n = int(sys.argv[2]); rate = float(sys.argv[3]) if len(sys.argv) > 3 else 0
data = random.Random(7).randbytes(n)
s = socket.create_connection((sys.argv[1], 5001), timeout=30)
t0 = time.monotonic(); i = 0
while i < n:
    s.sendall(data[i:i + 65536]); i += 65536
    if rate: time.sleep(max(0.0, t0 + i / rate - time.monotonic()))
s.shutdown(socket.SHUT_WR)
got = b""
while True:
    b = s.recv(65536)
    if not b: break
    got += b
line, _, rest = got.partition(b"\n")
want = "%d %s" % (n, hashlib.sha256(data).hexdigest())
if line.decode() != want: print("sum", line, want)
elif rest != random.Random(3).randbytes(1 << 20): print("answer", len(rest))
else: print("ok")
"#;

/// Runs python3 `script` with `args` in namespace `ns`, its output piped.
#[allow(dead_code)]
pub fn py(ns: &str, script: &str, args: &[&str]) -> std::process::Child {
    std::process::Command::new("ip")
        .args(["netns", "exec", ns, "python3", "-c", script])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// A finished child's standard output and error, trimmed, one after the other.
#[allow(dead_code)]
pub fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout).trim(),
        String::from_utf8_lossy(&o.stderr).trim()
    )
}
