//! Issue 31, item 5: the deployment guide, `docs/deploy.md`, run as written. The test
//! reads the guide, takes its commands out of it and runs them in network namespaces
//! laid out as the guide's picture: a server with a public address behind a router
//! ("the internet"), a site with two uplinks, each behind a modem that masquerades
//! (iptables MASQUERADE), a machine on the site's LAN, and a host on the internet.
//! Then it checks that the site's and the LAN's traffic to that host crosses the bond
//! (both channels up and carrying data, each channel arriving at the server from its
//! own modem's public address) and reaches the host from the server's address, and
//! that the LAN machine's TCP connection took an MSS that fits the bond (braid's
//! clamping). A wrong command in the guide fails the test.
//!
//! How the guide marks what runs (HTML comments, invisible when the guide is read):
//!
//! - `<!-- run: HOST -->` before a ```` ```sh ```` block: run the block on HOST
//!   (`server` or `site`) with `sh -e`, so any failing command fails the test;
//! - `<!-- run: HOST, background -->`: a command that runs until stopped (`iperf3 -s`):
//!   started in the background, stopped at the end;
//! - `<!-- run: HOST, prints: NAME -->`: the last line the block prints is what the
//!   reader copies into the placeholder NAME (a public key) in the files that follow;
//! - `<!-- file: HOST PATH -->` before a fenced block: the reader writes the block to
//!   PATH on HOST.
//!
//! What the test changes, and only that: `/etc/braid` is a directory of its own per
//! host; each host's commands see a `/run/braid` of their own (a bind mount in the
//! command's private mount namespace, so nothing touches the machine's); the
//! placeholders get what the `prints` blocks printed; and `systemctl enable --now
//! braid@NAME` runs the unit's `ExecStart` (from `packaging/systemd/braid@.service`)
//! in the background with a notification socket, returning on `READY=1` as systemctl
//! does. `braid` is the binary under test, first in `PATH`.
//!
//! Needs root, /dev/net/tun, `ip`, `iptables`, `ping`, `iperf3` and `ss`; without them
//! the test says why it is skipped. Namespaces and processes are removed on every exit
//! path.

use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_braid");
const GUIDE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/deploy.md");
const UNIT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../packaging/systemd/braid@.service"
);

mod common;
use common::sh;

fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (network namespaces, TUN devices, iptables, mounts)".into());
    }
    if !Path::new("/dev/net/tun").exists() {
        return Some("/dev/net/tun does not exist".into());
    }
    common::missing_tool(&[
        ("ip", "iproute2"),
        ("ss", "iproute2"),
        ("iptables", "iptables"),
        ("ping", "iputils-ping"),
        ("iperf3", "iperf3"),
        ("curl", "curl"),
    ])
}

/// One marked block of the guide.
#[derive(Debug)]
struct Block {
    /// Line of the marker in the guide (1-based), for messages.
    line: usize,
    host: String,
    kind: Kind,
    text: String,
}

#[derive(Debug, PartialEq)]
enum Kind {
    Run {
        background: bool,
        prints: Option<String>,
    },
    File(String),
}

/// The marked blocks of the guide, in order. A marker that does not parse, or is not
/// followed by a fenced block, is an error (a typo would otherwise skip a block).
fn parse_guide(text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i].trim();
        let Some(body) = l
            .strip_prefix("<!--")
            .and_then(|r| r.strip_suffix("-->"))
            .map(str::trim)
        else {
            i += 1;
            continue;
        };
        let line = i + 1;
        let (host, kind) = if let Some(r) = body.strip_prefix("run:") {
            let mut parts = r.split(',').map(str::trim);
            let host = parts.next().unwrap_or_default().to_string();
            let (mut background, mut prints) = (false, None);
            for p in parts {
                if p == "background" {
                    background = true;
                } else if let Some(n) = p.strip_prefix("prints:") {
                    prints = Some(n.trim().to_string());
                } else {
                    panic!("docs/deploy.md:{line}: unknown option {p:?} in {l}");
                }
            }
            (host, Kind::Run { background, prints })
        } else if let Some(r) = body.strip_prefix("file:") {
            let mut parts = r.split_whitespace();
            let host = parts.next().unwrap_or_default().to_string();
            let path = parts
                .next()
                .unwrap_or_else(|| panic!("docs/deploy.md:{line}: no path in {l}"));
            (host, Kind::File(path.to_string()))
        } else {
            panic!("docs/deploy.md:{line}: a comment that is not a run or file marker: {l}");
        };
        assert!(
            host == "server" || host == "site",
            "docs/deploy.md:{line}: unknown host {host:?}"
        );
        i += 1;
        while i < lines.len() && lines[i].trim().is_empty() {
            i += 1;
        }
        let fence = lines.get(i).map(|s| s.trim()).unwrap_or_default();
        assert!(
            fence.starts_with("```"),
            "docs/deploy.md:{line}: the marker is not followed by a fenced block"
        );
        if matches!(kind, Kind::Run { .. }) {
            assert_eq!(fence, "```sh", "docs/deploy.md:{line}: run a ```sh block");
        }
        i += 1;
        let mut body = String::new();
        while i < lines.len() && lines[i].trim() != "```" {
            body.push_str(lines[i]);
            body.push('\n');
            i += 1;
        }
        assert!(i < lines.len(), "docs/deploy.md:{line}: unclosed block");
        blocks.push(Block {
            line,
            host,
            kind,
            text: body,
        });
        i += 1;
    }
    blocks
}

/// One emulated machine: its namespace and its own /etc/braid and /run/braid.
struct Host {
    ns: String,
    etc: PathBuf,
    run: PathBuf,
}

impl Host {
    /// `ip netns exec NS sh -c WRAP`: /run/braid bound to our own directory (in the
    /// private mount namespace `ip netns exec` makes), the tested braid first in PATH,
    /// then `script` (with `sh -ex`, or exec'd `argv`).
    fn command(&self, script: &str) -> Command {
        let bin_dir = Path::new(BIN).parent().unwrap();
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns, "sh", "-c"])
            .arg(
                "mkdir -p /run/braid && mount --bind \"$1\" /run/braid && \
                 PATH=\"$2:$PATH\" && export PATH && exec sh -ex -c \"$3\"",
            )
            .arg("sh")
            .arg(&self.run)
            .arg(bin_dir)
            .arg(script)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .process_group(0);
        c
    }

    /// A guide path as this host sees it: /etc/braid is our directory.
    fn subst(&self, text: &str) -> String {
        text.replace("/etc/braid", self.etc.to_str().unwrap())
    }
}

/// Namespaces, processes and files of one run; removed on drop.
struct Lab {
    ns: Vec<String>,
    children: Vec<Child>,
    dir: PathBuf,
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &mut self.children {
            // Each child leads its own process group: end it and what it started.
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(-(c.id() as i32), libc::SIGTERM) };
        }
        let t0 = Instant::now();
        for c in &mut self.children {
            while c.try_wait().ok().flatten().is_none() && t0.elapsed() < Duration::from_secs(2) {
                std::thread::sleep(Duration::from_millis(20));
            }
            // SAFETY: as above.
            unsafe { libc::kill(-(c.id() as i32), libc::SIGKILL) };
            let _ = c.wait();
        }
        for n in &self.ns {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ns_sh(ns: &str, args: &[&str]) {
    let mut v = vec!["ip", "netns", "exec", ns];
    v.extend_from_slice(args);
    sh(&v);
}

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// How many TCP sockets listen in namespace `ns`.
fn listeners(ns: &str) -> usize {
    let o = Command::new("ip")
        .args(["netns", "exec", ns, "ss", "-Hltn"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).lines().count()
}

fn status(ctl: &Path) -> Value {
    let o = Command::new(BIN)
        .args(["status", "--json", "--control", ctl.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "braid status: {}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Run `c` to its end, but for at most 20 s (then it and what it started are killed
/// and the test fails): its output.
fn run_bounded(c: &mut Command, dir: &Path, line: usize) -> Output {
    let (out, err) = (dir.join("block.out"), dir.join("block.err"));
    let mut child = c
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            panic!(
                "docs/deploy.md:{line}: the block did not finish within 20 s:\n{}",
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: std::fs::read(&out).unwrap(),
        stderr: std::fs::read(&err).unwrap(),
    }
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// `systemctl enable --now braid@NAME`, as systemd would do it: the unit's ExecStart
/// with `%i` = NAME, a notification socket, and back on READY=1.
fn start_service(lab: &mut Lab, host: &Host, name: &str, line: usize) {
    let unit = std::fs::read_to_string(UNIT).unwrap();
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart= in braid@.service");
    let exec = exec.replace("%i", name).replace("/usr/bin/braid", "braid");
    let notify_path = lab.dir.join(format!("{name}.notify"));
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    let log_path = lab.dir.join(format!("{name}.log"));
    let child = host
        .command(&format!("exec {}", host.subst(&exec)))
        .env("NOTIFY_SOCKET", &notify_path)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    lab.children.push(child);
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let until = Instant::now() + Duration::from_secs(15);
    let mut buf = [0u8; 4096];
    loop {
        let left = until
            .checked_duration_since(Instant::now())
            .unwrap_or_else(|| {
                panic!(
                    "docs/deploy.md:{line}: braid@{name} was not ready within 15 s:\n{}",
                    log()
                )
            });
        notify
            .set_read_timeout(Some(left.min(Duration::from_millis(200))))
            .unwrap();
        if let Ok(k) = notify.recv(&mut buf) {
            if String::from_utf8_lossy(&buf[..k])
                .lines()
                .any(|l| l == "READY=1")
            {
                return;
            }
        }
        let c = lab.children.last_mut().unwrap();
        if let Some(st) = c.try_wait().unwrap() {
            panic!(
                "docs/deploy.md:{line}: braid@{name} exited ({st}) before it was ready:\n{}",
                log()
            );
        }
    }
}

/// Run the guide's blocks in order on their hosts.
fn run_guide(lab: &mut Lab, server: &Host, site: &Host, blocks: &[Block]) {
    let declared: Vec<String> = blocks
        .iter()
        .filter_map(|b| match &b.kind {
            Kind::Run { prints, .. } => prints.clone(),
            _ => None,
        })
        .collect();
    let mut filled: Vec<(String, String)> = Vec::new();
    let fill = |t: &str, filled: &[(String, String)], line: usize| {
        let mut t = t.to_string();
        for (k, v) in filled {
            t = t.replace(k.as_str(), v);
        }
        for k in &declared {
            assert!(
                !t.contains(k.as_str()),
                "docs/deploy.md:{line}: {k} is used before a block prints it"
            );
        }
        t
    };
    for b in blocks {
        let host = if b.host == "server" { server } else { site };
        let body = fill(&host.subst(&b.text), &filled, b.line);
        match &b.kind {
            Kind::File(path) => {
                use std::os::unix::fs::PermissionsExt;
                let p = PathBuf::from(host.subst(path));
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(&p, &body).unwrap();
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
            }
            Kind::Run {
                background: true, ..
            } => {
                let before = listeners(&host.ns);
                let child = host
                    .command(&body)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap();
                lab.children.push(child);
                // A server of some kind: ready when it listens.
                let t0 = Instant::now();
                while listeners(&host.ns) <= before {
                    assert!(
                        t0.elapsed() < Duration::from_secs(5),
                        "docs/deploy.md:{}: the background command does not listen",
                        b.line
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            Kind::Run {
                background: false,
                prints,
            } => {
                // Plain commands run as a script; `systemctl` lines run the service.
                let mut stdout = String::new();
                let mut segment = String::new();
                let lines: Vec<&str> = body.lines().collect();
                for (k, l) in lines.iter().enumerate() {
                    let service = l.trim().starts_with("systemctl ");
                    if !service {
                        segment.push_str(l);
                        segment.push('\n');
                    }
                    if (service || k + 1 == lines.len()) && !segment.trim().is_empty() {
                        let o = run_bounded(&mut host.command(&segment), &lab.dir, b.line);
                        assert!(
                            o.status.success(),
                            "docs/deploy.md:{}: a command failed on the {}:\n{segment}\n{}",
                            b.line,
                            b.host,
                            text(&o)
                        );
                        stdout.push_str(&String::from_utf8_lossy(&o.stdout));
                        segment.clear();
                    }
                    if service {
                        let name = l
                            .trim()
                            .strip_prefix("systemctl enable --now braid@")
                            .unwrap_or_else(|| {
                                panic!(
                                    "docs/deploy.md:{}: the test runs only `systemctl enable --now braid@NAME`, not {l:?}",
                                    b.line
                                )
                            });
                        start_service(lab, host, name.trim(), b.line);
                    }
                }
                if let Some(name) = prints {
                    let v = stdout
                        .lines()
                        .rev()
                        .find(|l| !l.trim().is_empty())
                        .unwrap_or_else(|| {
                            panic!("docs/deploy.md:{}: the block printed nothing", b.line)
                        })
                        .trim()
                        .to_string();
                    filled.push((name.clone(), v));
                }
            }
        }
    }
}

#[test]
fn the_deployment_guide_bonds_a_site_to_a_server_as_written() {
    let test = "the_deployment_guide_bonds_a_site_to_a_server_as_written";
    if let Some(why) = skip_reason() {
        common::skip(test, &why);
        return;
    }
    let t_start = Instant::now();
    let blocks = parse_guide(&std::fs::read_to_string(GUIDE).unwrap());
    // The guide's shape: both ends configured and started, checks run at the site.
    for (host, what) in [
        ("server", "braid@server"),
        ("site", "braid@site"),
        ("site", "braid status"),
        ("site", "iperf3 -c"),
    ] {
        assert!(
            blocks
                .iter()
                .any(|b| b.host == host && b.text.contains(what)),
            "docs/deploy.md runs no `{what}` on the {host}"
        );
    }

    let id = std::process::id() % 100_000;
    let dir = std::env::temp_dir().join(format!("braid-guide-{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut lab = Lab {
        ns: vec![],
        children: vec![],
        dir: dir.clone(),
    };
    let name = |r: &str| format!("guide{id}{r}");
    let (inet, srv, m1, m2, site, inhost, lan) = (
        name("inet"),
        name("server"),
        name("modem1"),
        name("modem2"),
        name("site"),
        name("host"),
        name("lan"),
    );
    for n in [&inet, &srv, &m1, &m2, &site, &inhost, &lan] {
        sh(&["ip", "netns", "add", n]);
        lab.ns.push(n.clone());
        sh(&["ip", "-n", n, "link", "set", "dev", "lo", "up"]);
        // No IPv6 (its router solicitations would only add noise to the counters).
        for k in ["all", "default"] {
            ns_sh(
                n,
                &[
                    "sysctl",
                    "-qw",
                    &format!("net.ipv6.conf.{k}.disable_ipv6=1"),
                ],
            );
        }
    }
    // A veth pair between (ns_a, dev_a, addr_a) and (ns_b, dev_b, addr_b): made with
    // names of our own, then renamed inside the namespaces to the guide's names.
    let mut k = 0;
    let mut link = |a: (&str, &str, &str), b: (&str, &str, &str)| {
        k += 1;
        let (ta, tb) = (format!("guide{id}v{k}a"), format!("guide{id}v{k}b"));
        sh(&[
            "ip", "link", "add", &ta, "netns", a.0, "type", "veth", "peer", "name", &tb, "netns",
            b.0,
        ]);
        for ((ns, dev, addr), t) in [(a, &ta), (b, &tb)] {
            sh(&["ip", "-n", ns, "link", "set", "dev", t, "name", dev]);
            sh(&["ip", "-n", ns, "addr", "add", addr, "dev", dev]);
            sh(&["ip", "-n", ns, "link", "set", "dev", dev, "up"]);
        }
    };
    // The internet: a router joining the server, the modems' public sides and a host.
    link(
        (&srv, "eth0", "203.0.113.7/24"),
        (&inet, "srv", "203.0.113.1/24"),
    );
    link(
        (&m1, "out", "198.51.100.20/24"),
        (&inet, "m1", "198.51.100.1/24"),
    );
    link((&m2, "out", "192.0.2.30/24"), (&inet, "m2", "192.0.2.1/24"));
    link(
        (&inhost, "eth0", "198.18.0.10/24"),
        (&inet, "host", "198.18.0.1/24"),
    );
    // The site's uplinks, each to its modem's LAN side.
    link(
        (&site, "wan1", "192.168.1.2/24"),
        (&m1, "lan", "192.168.1.1/24"),
    );
    link(
        (&site, "wan2", "192.168.2.2/24"),
        (&m2, "lan", "192.168.2.1/24"),
    );
    // A machine on the site's LAN.
    link(
        (&lan, "eth0", "192.168.50.10/24"),
        (&site, "lan0", "192.168.50.1/24"),
    );
    ns_sh(&inet, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    for (ns, gw) in [
        (&srv, "203.0.113.1"),
        (&m1, "198.51.100.1"),
        (&m2, "192.0.2.1"),
        (&inhost, "198.18.0.1"),
        (&site, "192.168.1.1"),
        (&lan, "192.168.50.1"),
    ] {
        sh(&["ip", "-n", ns, "route", "add", "default", "via", gw]);
    }
    // The modems: forward and masquerade (the internet has no route to 192.168.x).
    for m in [&m1, &m2] {
        ns_sh(m, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        ns_sh(
            m,
            &[
                "iptables",
                "-t",
                "nat",
                "-A",
                "POSTROUTING",
                "-o",
                "out",
                "-j",
                "MASQUERADE",
            ],
        );
    }
    // The site does not forward yet (the guide turns it on for its LAN).
    ns_sh(&site, &["sysctl", "-qw", "net.ipv4.ip_forward=0"]);
    // The server as a fresh VPS with a firewall: no forwarding, and INPUT and FORWARD
    // dropped but for loopback and answers, so the guide's rules must open them.
    ns_sh(&srv, &["sysctl", "-qw", "net.ipv4.ip_forward=0"]);
    ns_sh(&srv, &["iptables", "-P", "INPUT", "DROP"]);
    ns_sh(&srv, &["iptables", "-P", "FORWARD", "DROP"]);
    ns_sh(
        &srv,
        &["iptables", "-A", "INPUT", "-i", "lo", "-j", "ACCEPT"],
    );
    ns_sh(
        &srv,
        &[
            "iptables",
            "-A",
            "INPUT",
            "-m",
            "conntrack",
            "--ctstate",
            "RELATED,ESTABLISHED",
            "-j",
            "ACCEPT",
        ],
    );

    let host = |ns: &str, h: &str| {
        let (etc, run) = (dir.join(h).join("etc-braid"), dir.join(h).join("run-braid"));
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::create_dir_all(&run).unwrap();
        Host {
            ns: ns.to_string(),
            etc,
            run,
        }
    };
    let (server_h, site_h) = (host(&srv, "server"), host(&site, "site"));

    run_guide(&mut lab, &server_h, &site_h, &blocks);

    // Both ends as the guide left them.
    let ctl_site = site_h.run.join("braid-site.sock");
    let ctl_srv = server_h.run.join("braid-srv.sock");
    let before = status(&ctl_site);

    // Traffic to a host on the internet, from the site and from a machine on its LAN:
    // through the bond, masqueraded by the server. The host's iperf3 reports whom it
    // served.
    let mut iperf_host = Command::new("ip")
        .args(["netns", "exec", &inhost, "iperf3", "-s", "-1", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while listeners(&inhost) == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "iperf3 -s did not listen"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let ping = |ns: &str| {
        Command::new("ip")
            .args([
                "netns", "exec", ns, "ping", "-c", "5", "-i", "0.1", "-W", "1",
            ])
            .arg("198.18.0.10")
            .output()
            .unwrap()
    };
    let (ping_site, ping_lan) = (ping(&site), ping(&lan));
    let client = Command::new("ip")
        .args([
            "netns",
            "exec",
            &lan,
            "timeout",
            "15",
            "iperf3",
            "-c",
            "198.18.0.10",
        ])
        .args(["-t", "2", "--connect-timeout", "3000", "--json"])
        .output()
        .unwrap();
    let served = if client.status.success() {
        iperf_host.wait_with_output().unwrap()
    } else {
        let _ = iperf_host.kill();
        let _ = iperf_host.wait();
        panic!(
            "iperf3 from the site's LAN to the internet host: {}",
            text(&client)
        );
    };
    for (who, p) in [("the site", ping_site), ("the site's LAN", ping_lan)] {
        assert!(
            p.status.success(),
            "ping from {who} to the internet host: {}",
            text(&p)
        );
    }
    let served: Value = serde_json::from_slice(&served.stdout).unwrap();
    let sender: Value = serde_json::from_slice(&client.stdout).unwrap();
    // The LAN machine's link has an MTU of 1500, the bond 1446: its connection took an
    // MSS that fits the bond, not the 1460 the internet host offered (the guide's MTU
    // section). Carried as a stream (the default), the site's own TCP stack answered
    // the SYN with 1446 - 40 (and no timestamps); carried as packets, braid clamps the
    // host's SYN-ACK to it (less 12 of timestamps as the socket reports it).
    let mss = n(&sender["start"]["tcp_mss_default"]);
    assert!(
        mss <= 1406,
        "the LAN machine's TCP MSS {mss} does not fit the bond (1446 - 40)"
    );
    let from = &served["start"]["connected"][0]["remote_host"];
    assert_eq!(
        from, "203.0.113.7",
        "the internet host should see the server's address, not an uplink's"
    );
    let received = served["end"]["sum_received"]["bytes"].as_f64().unwrap();
    assert!(received > 1e6, "only {received} bytes reached the host");

    // The site's bond: both channels up, both carrying that traffic, each from its
    // own uplink's address.
    let after = status(&ctl_site);
    let chans = after["channels"].as_array().unwrap();
    assert_eq!(chans.len(), 2, "{after}");
    let (mut sent, mut got) = (0, 0);
    for (i, c) in chans.iter().enumerate() {
        assert_eq!(c["state"], "up", "{c}");
        let b = &before["channels"][i];
        assert!(
            n(&c["tx_data_packets"]) > n(&b["tx_data_packets"]) + 100,
            "channel {i} did not carry the transfer: {c}"
        );
        sent += n(&c["tx_bytes"]) - n(&b["tx_bytes"]);
        got += n(&c["rx_data_packets"]) - n(&b["rx_data_packets"]);
    }
    // The acknowledgements came back through the tunnel too: as flow datagrams on the
    // lowest-delay channel (pure TCP acknowledgements, docs/tunnel.md "Real-time
    // flows", or a stream's ACKs with TCP carried as streams, docs/streams.md), or
    // striped.
    got += n(&after["flows_rx_delivered"]) - n(&before["flows_rx_delivered"]);
    got += n(&after["streams_rx_control"]) - n(&before["streams_rx_control"]);
    assert!(got > 100, "the tunnel carried {got} packets back: {after}");
    assert!(
        sent as f64 > received,
        "the bond sent {sent} bytes, less than the host received ({received})"
    );
    // The site's live status page (the guide's `metrics` address) shows the same
    // traffic: its /stats.json, which the page polls, counts the transfer on both
    // channels.
    let page = Command::new("ip")
        .args(["netns", "exec", &site, "curl", "-s", "--max-time", "5"])
        .arg("http://127.0.0.1:9477/stats.json")
        .output()
        .unwrap();
    assert!(page.status.success(), "the status page: {}", text(&page));
    let live: Value = serde_json::from_slice(&page.stdout)
        .unwrap_or_else(|e| panic!("/stats.json is not JSON ({e}): {}", text(&page)));
    for (i, b) in before["channels"].as_array().unwrap().iter().enumerate() {
        let c = &live["channels"][i];
        assert!(
            n(&c["tx_data_packets"]) > n(&b["tx_data_packets"]) + 100,
            "the status page's channel {i} does not show the transfer: {c}"
        );
    }
    // The server saw each channel arrive from its own modem's public address: each
    // channel left by its own uplink.
    let s = status(&ctl_srv);
    let peer = &s["peers"][0];
    assert_eq!(peer["connected"], true, "{s}");
    for (i, public) in ["198.51.100.20:", "192.0.2.30:"].iter().enumerate() {
        let c = &peer["session"]["channels"][i];
        assert!(
            c["remote"].as_str().unwrap_or_default().starts_with(public),
            "the server's channel {i} should come from {public}: {c}"
        );
    }
    drop(lab);
    assert!(
        t_start.elapsed() < Duration::from_secs(60),
        "the guide's run took {:?}",
        t_start.elapsed()
    );
}
