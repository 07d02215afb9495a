//! The lab's network: three namespaces joined by one path per link.
//!
//! ```text
//!  brl-a (client)            brl-r (router)                         brl-b (server)
//!  l0 10.201.0.1 ──veth── a0 10.201.0.2 ─> t0 (emulator) ─> b0 10.202.0.2 ──veth── l0 10.202.0.1
//!  l1 10.201.1.1 ──veth── a1 10.201.1.2 ─> t1 (emulator) ─> b1 10.202.1.2 ──veth── l1 10.202.1.1
//!  ...
//! ```
//!
//! * Rate: `tbf` on the router's `a<i>` and `b<i>` egress (where a real bottleneck queue
//!   sits, not in the end hosts).
//! * Delay, jitter, loss: every packet entering the router on `a<i>` or `b<i>` is policy-
//!   routed into TUN `t<i>`, served by the emulator ([`crate::emu`]), which writes it back
//!   after the link's delay; the kernel then forwards it on by source address, so a packet
//!   from `10.201.<i>.*` always leaves on `b<i>`, whatever its destination. Loss applies to
//!   the client-to-server direction.
//! * Every link carries IPv6 too, routed the same way: `fd00:201:<i>::1` (client),
//!   `fd00:201:<i>::2` and `fd00:202:<i>::2` (router), `fd00:202:<i>::1` (server). A
//!   link whose spec ends in `/v6` carries the bench's traffic over IPv6.
//! * The client routes by source address (`from 10.201.<i>.1` uses link i), which is what
//!   MPTCP subflows and braid's per-channel UDP sockets need; the server answers on the
//!   link the traffic came from.
//!
//! Everything is named with the `brl` prefix; [`down`] removes it all, also after a crash.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::spec::LinkSpec;

/// Client namespace.
pub const NS_CLIENT: &str = "brl-a";
/// Router namespace (runs the emulator).
pub const NS_ROUTER: &str = "brl-r";
/// Server namespace.
pub const NS_SERVER: &str = "brl-b";

/// Write a file only its owner can read (a config that holds a key inline: `braid
/// tunnel` refuses one that others can read).
pub fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // An existing file keeps its mode through open: set it.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(text.as_bytes())
}

/// Where the lab keeps its state (links, emulator pid and counters).
pub fn state_dir() -> PathBuf {
    PathBuf::from("/run/braid-lab")
}

/// Client address of link `i`.
pub fn client_addr(i: usize) -> String {
    format!("10.201.{i}.1")
}

/// Server address of link `i`.
pub fn server_addr(i: usize) -> String {
    format!("10.202.{i}.1")
}

/// Client IPv6 address of link `i`.
pub fn client_addr6(i: usize) -> String {
    format!("fd00:201:{i}::1")
}

/// Server IPv6 address of link `i`.
pub fn server_addr6(i: usize) -> String {
    format!("fd00:202:{i}::1")
}

/// The client's and the server's address of link `i` (`l`), in the family its
/// specification names (IPv6 for `/v6`).
pub fn link_addrs(i: usize, l: &LinkSpec) -> (String, String) {
    if l.ipv6 {
        (client_addr6(i), server_addr6(i))
    } else {
        (client_addr(i), server_addr(i))
    }
}

/// `address:port`, the address in brackets if it is IPv6.
pub fn socket_addr(addr: &str, port: u16) -> String {
    if addr.contains(':') {
        format!("[{addr}]:{port}")
    } else {
        format!("{addr}:{port}")
    }
}

/// A lab command that failed.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A command could not run or failed.
    #[error("`{cmd}` failed: {reason}")]
    Command {
        /// The command line.
        cmd: String,
        /// Its stderr or the spawn error.
        reason: String,
    },
    /// A measurement ran far past its end and was stopped.
    #[error("`{cmd}` was still running {grace_s} s after its end and was stopped (its connection stalled on the emulated links); run the bench again")]
    TimedOut {
        /// What was measured.
        cmd: String,
        /// How long past its end it was given.
        grace_s: u64,
    },
    /// Not root.
    #[error("the lab needs root (CAP_NET_ADMIN) to create network namespaces; run as root")]
    NotRoot,
    /// Outside programs are missing.
    #[error("{0}")]
    MissingTools(String),
    /// The lab is already up.
    #[error("a lab is already up (namespace {0} exists); run `braid lab down` first")]
    AlreadyUp(String),
    /// The emulator did not come up.
    #[error("the link emulator did not start: {0}")]
    Emulator(String),
    /// I/O on the state directory.
    #[error("{path}: {err}")]
    Io {
        /// The path.
        path: String,
        /// The error.
        err: std::io::Error,
    },
}

/// Run a command, failing with its stderr.
pub fn run(args: &[&str]) -> Result<String, LabError> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| LabError::Command {
            cmd: args.join(" "),
            reason: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(LabError::Command {
            cmd: args.join(" "),
            reason: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Run `cmd` (words separated by spaces; none of the lab's arguments contain one)
/// inside namespace `ns`, or in the current namespace if `ns` is empty. The labs
/// (this one, the overlay's and the field's) all run their commands through it.
pub fn sh(ns: &str, cmd: &str) -> Result<String, LabError> {
    let mut v: Vec<&str> = if ns.is_empty() {
        Vec::new()
    } else {
        vec!["ip", "netns", "exec", ns]
    };
    v.extend(cmd.split_whitespace());
    run(&v)
}

/// Change link `i` of the running lab: the rate with `tc qdisc change` on the router's
/// tbf (both directions), delay, jitter and loss through the emulator's control file
/// ([`crate::emu::control_path`]), applied within about 50 ms. `Up` restores the link
/// as it was before `Down`.
pub fn change(i: usize, action: &crate::spec::Action) -> Result<(), LabError> {
    use crate::spec::Action;
    let ctl = crate::emu::control_path(&state_dir(), i);
    let text = match action {
        Action::To(l) => {
            for dev in ["a", "b"] {
                sh(
                    NS_ROUTER,
                    &format!(
                        "tc qdisc change dev {dev}{i} root tbf rate {}bit burst 32kb latency 20ms",
                        l.rate_bps
                    ),
                )?;
            }
            l.text.clone()
        }
        Action::Down => "down".into(),
        Action::Up => "up".into(),
    };
    // Written whole and renamed into place: the emulator, which reads the file every
    // 50 ms, never sees it empty or half written.
    let tmp = ctl.with_extension("ctl.tmp");
    std::fs::write(&tmp, text)
        .and_then(|_| std::fs::rename(&tmp, &ctl))
        .map_err(|e| LabError::Command {
            cmd: format!("write {}", ctl.display()),
            reason: e.to_string(),
        })
}

/// Start `braid lab emulate` for `links` (comma-separated specs) in namespace `ns`, its
/// output to `log`, its counters and control files in `dir`. The caller detaches it.
pub fn spawn_emulator(
    exe: &Path,
    ns: &str,
    links: &str,
    seed: u64,
    dir: &Path,
    log: fs::File,
) -> Result<std::process::Child, LabError> {
    let log2 = log.try_clone().map_err(|err| LabError::Io {
        path: dir.join("emulator.log").display().to_string(),
        err,
    })?;
    Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(exe)
        .args([
            "lab",
            "emulate",
            "--links",
            links,
            "--seed",
            &seed.to_string(),
        ])
        .arg("--state-dir")
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        .spawn()
        .map_err(|e| LabError::Emulator(e.to_string()))
}

/// Namespaces of the lab that exist now.
pub fn existing_namespaces() -> Vec<String> {
    namespaces_starting_with("brl-")
}

/// The network namespaces that exist now whose names start with `prefix` (each lab
/// names its own with a prefix of its own).
pub fn namespaces_starting_with(prefix: &str) -> Vec<String> {
    run(&["ip", "netns", "list"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(str::to_string)
        .collect()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Build the lab for `links`. `exe` is the `braid` binary, started in the router
/// namespace as `braid lab emulate`.
pub fn up(links: &[LinkSpec], exe: &Path, seed: u64) -> Result<(), LabError> {
    if !is_root() {
        return Err(LabError::NotRoot);
    }
    if let Some(why) = crate::tools::missing(crate::tools::LAB_UP) {
        return Err(LabError::MissingTools(why));
    }
    if let Some(n) = existing_namespaces().first() {
        return Err(LabError::AlreadyUp(n.clone()));
    }
    let result = build(links, exe, seed);
    if result.is_err() {
        let _ = down();
    }
    result
}

fn build(links: &[LinkSpec], exe: &Path, seed: u64) -> Result<(), LabError> {
    let dir = state_dir();
    fs::create_dir_all(&dir).map_err(|err| LabError::Io {
        path: dir.display().to_string(),
        err,
    })?;
    let spec_text: Vec<String> = links.iter().map(|l| l.text.clone()).collect();
    let spec_text = spec_text.join(",");
    write_state(&dir.join("links"), &spec_text)?;
    for n in [NS_CLIENT, NS_ROUTER, NS_SERVER] {
        add_namespace(n)?;
    }
    sh(NS_ROUTER, "sysctl -qw net.ipv4.ip_forward=1")?;
    sh(NS_ROUTER, "sysctl -qw net.ipv6.conf.all.forwarding=1")?;
    for (i, l) in links.iter().enumerate() {
        add_link(i, l)?;
    }
    start_emulator(exe, &spec_text, seed, &dir, links.len())?;
    for i in 0..links.len() {
        route_through_emulator(i)?;
    }
    Ok(())
}

/// Namespace `n`: loopback up, no reverse-path filter, fresh TCP metrics and buffers
/// for a long fat pipe.
fn add_namespace(n: &str) -> Result<(), LabError> {
    run(&["ip", "netns", "add", n])?;
    sh(n, "ip link set dev lo up")?;
    sh(n, "sysctl -qw net.ipv4.conf.all.rp_filter=0")?;
    sh(n, "sysctl -qw net.ipv4.conf.default.rp_filter=0")?;
    // Every TCP measurement starts from scratch: by default Linux keeps a finished
    // connection's ssthresh per destination and starts the next one with it, and
    // the braid modes all measure towards the same tunnel address, one after
    // the other.
    sh(n, "sysctl -qw net.ipv4.tcp_no_metrics_save=1")?;
    // Room for one TCP flow to fill the whole bond: 170 Mbit/s at a 155 ms round
    // trip is 3.3 MB in flight, and Linux's default send buffer (4 MiB, about
    // 2 MB of payload once the kernel's per-packet overhead is counted) held a
    // single flow through the tunnel at 2 MB in flight, some 105 Mbit/s, where the
    // ceiling's three flows have a buffer each. 32 MiB, as for any long fat pipe.
    for v in [
        "net.ipv4.tcp_wmem=4096 16384 33554432",
        "net.ipv4.tcp_rmem=4096 131072 33554432",
    ] {
        run(&["ip", "netns", "exec", n, "sysctl", "-qw", v])?;
    }
    Ok(())
}

/// Link `i`: client l<i> -- a<i> router b<i> -- l<i> server, shaped by tbf at the
/// link's rate, with the client's and server's policy routes over it.
fn add_link(i: usize, l: &LinkSpec) -> Result<(), LabError> {
    let (ca, sa) = (client_addr(i), server_addr(i));
    sh(
        "",
        &format!("ip link add l{i} netns {NS_CLIENT} type veth peer name a{i} netns {NS_ROUTER}"),
    )?;
    sh(
        "",
        &format!("ip link add b{i} netns {NS_ROUTER} type veth peer name l{i} netns {NS_SERVER}"),
    )?;
    sh(NS_CLIENT, &format!("ip addr add {ca}/24 dev l{i}"))?;
    sh(NS_ROUTER, &format!("ip addr add 10.201.{i}.2/24 dev a{i}"))?;
    sh(NS_ROUTER, &format!("ip addr add 10.202.{i}.2/24 dev b{i}"))?;
    sh(NS_SERVER, &format!("ip addr add {sa}/24 dev l{i}"))?;
    sh(NS_CLIENT, &format!("ip link set dev l{i} up"))?;
    sh(NS_ROUTER, &format!("ip link set dev a{i} up"))?;
    sh(NS_ROUTER, &format!("ip link set dev b{i} up"))?;
    sh(NS_SERVER, &format!("ip link set dev l{i} up"))?;
    // Rate: tbf on the router's egress in both directions.
    for dev in ["a", "b"] {
        sh(
            NS_ROUTER,
            &format!(
                "tc qdisc add dev {dev}{i} root tbf rate {}bit burst 32kb latency 20ms",
                l.rate_bps
            ),
        )?;
    }
    // Client: traffic from link i's address uses link i; the server's link-i
    // subnet is reached over link i.
    let table = 10 + i;
    sh(
        NS_CLIENT,
        &format!("ip rule add from {ca} table {table} pref {}", 100 + i),
    )?;
    sh(
        NS_CLIENT,
        &format!("ip route add default via 10.201.{i}.2 dev l{i} table {table}"),
    )?;
    sh(
        NS_CLIENT,
        &format!("ip route add 10.202.{i}.0/24 via 10.201.{i}.2 dev l{i}"),
    )?;
    // Server: answers go back over the link they came from.
    sh(
        NS_SERVER,
        &format!("ip route add 10.201.{i}.0/24 via 10.202.{i}.2 dev l{i}"),
    )?;
    add_link_v6(i)
}

/// Link `i`'s IPv6 addresses and routes, as [`add_link`]'s IPv4 ones (no duplicate
/// address detection, so they are usable at once).
fn add_link_v6(i: usize) -> Result<(), LabError> {
    let (ca, sa) = (client_addr6(i), server_addr6(i));
    sh(NS_CLIENT, &format!("ip -6 addr add {ca}/64 dev l{i} nodad"))?;
    sh(
        NS_ROUTER,
        &format!("ip -6 addr add fd00:201:{i}::2/64 dev a{i} nodad"),
    )?;
    sh(
        NS_ROUTER,
        &format!("ip -6 addr add fd00:202:{i}::2/64 dev b{i} nodad"),
    )?;
    sh(NS_SERVER, &format!("ip -6 addr add {sa}/64 dev l{i} nodad"))?;
    let table = 10 + i;
    sh(
        NS_CLIENT,
        &format!("ip -6 rule add from {ca} table {table} pref {}", 100 + i),
    )?;
    sh(
        NS_CLIENT,
        &format!("ip -6 route add default via fd00:201:{i}::2 dev l{i} table {table}"),
    )?;
    sh(
        NS_CLIENT,
        &format!("ip -6 route add fd00:202:{i}::/64 via fd00:201:{i}::2 dev l{i}"),
    )?;
    sh(
        NS_SERVER,
        &format!("ip -6 route add fd00:201:{i}::/64 via fd00:202:{i}::2 dev l{i}"),
    )?;
    Ok(())
}

/// The emulator, detached in the router namespace (its pid in the state directory);
/// waits (up to 5 s) for its TUN devices t0..t<n-1>.
fn start_emulator(
    exe: &Path,
    spec_text: &str,
    seed: u64,
    dir: &Path,
    n: usize,
) -> Result<(), LabError> {
    // The emulator creates t0..tN in the router namespace.
    let log = fs::File::create(dir.join("emulator.log")).map_err(|err| LabError::Io {
        path: dir.join("emulator.log").display().to_string(),
        err,
    })?;
    let child = spawn_emulator(exe, NS_ROUTER, spec_text, seed, dir, log)?;
    write_state(&dir.join("emulator.pid"), &child.id().to_string())?;
    // Detach: the emulator outlives this command.
    std::mem::forget(child);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let devs = sh(NS_ROUTER, "ip -o link show").unwrap_or_default();
        let ready = (0..n).all(|i| devs.contains(&format!(": t{i}:")));
        if ready {
            break;
        }
        if Instant::now() > deadline {
            let log = fs::read_to_string(dir.join("emulator.log")).unwrap_or_default();
            return Err(LabError::Emulator(format!(
                "its TUN devices did not appear within 5 s; its log says: {}",
                log.trim()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Every packet entering the router on a<i> or b<i> goes through t<i> (the emulator);
/// what comes back out of t<i> from the client side leaves on b<i>.
fn route_through_emulator(i: usize) -> Result<(), LabError> {
    let (delay_table, out_table) = (100 + i, 200 + i);
    sh(NS_ROUTER, &format!("ip link set dev t{i} up"))?;
    sh(
        NS_ROUTER,
        &format!("ip route add default dev t{i} table {delay_table}"),
    )?;
    sh(
        NS_ROUTER,
        &format!(
            "ip rule add iif a{i} lookup {delay_table} pref {}",
            1000 + i
        ),
    )?;
    sh(
        NS_ROUTER,
        &format!(
            "ip rule add iif b{i} lookup {delay_table} pref {}",
            1100 + i
        ),
    )?;
    sh(
        NS_ROUTER,
        &format!(
            "ip rule add from 10.201.{i}.0/24 iif t{i} lookup {out_table} pref {}",
            2000 + i
        ),
    )?;
    sh(
        NS_ROUTER,
        &format!("ip route add 10.202.0.0/16 via 10.202.{i}.1 dev b{i} table {out_table}"),
    )?;
    sh(
        NS_ROUTER,
        &format!("sysctl -qw net.ipv4.conf.t{i}.rp_filter=0"),
    )?;
    // The same for IPv6.
    sh(
        NS_ROUTER,
        &format!("ip -6 route add default dev t{i} table {delay_table}"),
    )?;
    for (dev, pref) in [("a", 1000 + i), ("b", 1100 + i)] {
        sh(
            NS_ROUTER,
            &format!("ip -6 rule add iif {dev}{i} lookup {delay_table} pref {pref}"),
        )?;
    }
    sh(
        NS_ROUTER,
        &format!(
            "ip -6 rule add from fd00:201:{i}::/64 iif t{i} lookup {out_table} pref {}",
            2000 + i
        ),
    )?;
    sh(
        NS_ROUTER,
        &format!("ip -6 route add fd00:202::/32 via fd00:202:{i}::1 dev b{i} table {out_table}"),
    )?;
    Ok(())
}

fn write_state(path: &Path, text: &str) -> Result<(), LabError> {
    fs::write(path, text).map_err(|err| LabError::Io {
        path: path.display().to_string(),
        err,
    })
}

/// Remove everything the lab created: processes in its namespaces, the namespaces (and
/// with them every veth, TUN and qdisc), the state directory. Safe to run any time.
pub fn down() -> Result<Vec<String>, LabError> {
    let mut removed = Vec::new();
    let dir = state_dir();
    if let Ok(pid) = fs::read_to_string(dir.join("emulator.pid")) {
        if let Ok(pid) = pid.trim().parse::<i32>() {
            // SAFETY: sending a signal has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
    }
    for n in existing_namespaces() {
        // Anything still running inside (emulator, iperf3, braid tunnels).
        if let Ok(pids) = run(&["ip", "netns", "pids", &n]) {
            for p in pids
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
            {
                // SAFETY: as above.
                unsafe { libc::kill(p, libc::SIGTERM) };
            }
        }
        std::thread::sleep(Duration::from_millis(50));
        if let Ok(pids) = run(&["ip", "netns", "pids", &n]) {
            for p in pids
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
            {
                // SAFETY: as above.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
        }
        run(&["ip", "netns", "del", &n])?;
        removed.push(n);
    }
    let _ = fs::remove_dir_all(&dir);
    Ok(removed)
}

/// A human-readable description of the running lab, or `None` if none is up.
pub fn status() -> Option<String> {
    let names = existing_namespaces();
    if names.is_empty() {
        return None;
    }
    let dir = state_dir();
    let links = fs::read_to_string(dir.join("links")).unwrap_or_default();
    let mut s = format!("namespaces: {}\n", names.join(" "));
    for (i, l) in links.split(',').filter(|l| !l.is_empty()).enumerate() {
        let stats =
            fs::read_to_string(dir.join(format!("emu-{i}.json"))).unwrap_or_else(|_| "{}".into());
        s += &format!(
            "link {i}: {l:<24} client {} -> server {}  emulator {}\n",
            client_addr(i),
            server_addr(i),
            stats.trim()
        );
    }
    Some(s)
}
