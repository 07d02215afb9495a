//! `braid lab overlay`: five `braid node`s in five namespaces (seed 003, GALO).
//!
//! ```text
//!                 bro-r1 (node 1)   bro-r2 (node 2)   bro-r3 (node 3)
//!                        \\   |          |          |   //
//!   bro-s (node 0) ====== bro-x: one emulated, shaped path per node pair ====== bro-d (node 4)
//! ```
//!
//! Every pair of nodes has its own *hop*: a veth from each end into the router
//! namespace `bro-x`, `tbf` on the router's egress towards each end (rate), and braid's
//! user-space emulator on a TUN device in between (delay, jitter, loss; [`crate::emu`]),
//! so a hop is a path of its own as between hosts on the Internet, not a shared
//! segment. The direct hop from source to destination is made worse than the hops
//! through the relays, which is the situation GALO is for.
//!
//! One run: the nodes start and measure each other; the source provisions a flow to
//! the destination over up to three paths, with a TUN device at each end (10.77.0.1
//! and 10.77.0.2); then one TCP flow (iperf3, cubic) over the direct hop alone, one
//! through the overlay, and one through the overlay during which the relay of the best
//! path is killed (SIGKILL): the throughput in 100 ms intervals shows how long the flow
//! stalls and what it gets after.
//!
//! Everything is named with the `bro-` prefix (the two-link lab uses `brl-`); [`down`]
//! removes it, also after a crash, and a Ctrl-C during a run removes it before exit.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::spec::LinkSpec;
use crate::tools;
use crate::topo::{run, sh, LabError};

/// Namespace prefix of the overlay lab.
pub const PREFIX: &str = "bro-";
/// The router namespace (the emulator runs there).
pub const NS_ROUTER: &str = "bro-x";
/// Nodes: 0 source, 1..=3 relays, 4 destination.
pub const NODES: usize = 5;
/// The source's and destination's TUN addresses.
pub const TUN_SRC: &str = "10.77.0.1";
/// See [`TUN_SRC`].
pub const TUN_DST: &str = "10.77.0.2";
const PORT: u16 = 7400;

/// The namespace of node `n`.
pub fn ns(n: usize) -> String {
    match n {
        0 => "bro-s".into(),
        4 => "bro-d".into(),
        r => format!("bro-r{r}"),
    }
}

/// Where the overlay lab keeps its state.
pub fn state_dir() -> PathBuf {
    PathBuf::from("/run/braid-lab-overlay")
}

/// The node pairs, in hop order: `(a, b)` with `a < b`.
pub fn hops() -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    for a in 0..NODES {
        for b in a + 1..NODES {
            v.push((a, b));
        }
    }
    v
}

/// Node `a`'s address on hop `k` (the lower-numbered end).
fn addr_a(k: usize) -> String {
    format!("10.201.{}.1", 50 + k)
}

/// Node `b`'s address on hop `k`.
fn addr_b(k: usize) -> String {
    format!("10.202.{}.1", 50 + k)
}

/// Node `me`'s address on the hop to `peer`, and the peer's.
fn hop_addrs(me: usize, peer: usize) -> (String, String) {
    let k = hops()
        .iter()
        .position(|&(a, b)| (a, b) == (me.min(peer), me.max(peer)))
        .unwrap_or(0);
    if me < peer {
        (addr_a(k), addr_b(k))
    } else {
        (addr_b(k), addr_a(k))
    }
}

/// The overlay lab's shape.
#[derive(Clone, Debug)]
pub struct Matrix {
    /// Source to destination, directly.
    pub direct: LinkSpec,
    /// Source to relay i and relay i to destination (three).
    pub relays: Vec<LinkSpec>,
    /// Between two relays.
    pub between: LinkSpec,
}

impl Matrix {
    /// The spec of every hop, in [`hops`] order.
    pub fn specs(&self) -> Vec<LinkSpec> {
        hops()
            .into_iter()
            .map(|(a, b)| match (a, b) {
                (0, 4) => self.direct.clone(),
                (0, r) | (r, 4) => self.relays[r - 1].clone(),
                _ => self.between.clone(),
            })
            .collect()
    }
}

/// Options of `braid lab overlay`.
#[derive(Clone, Debug)]
pub struct OverlayOptions {
    /// The hops.
    pub matrix: Matrix,
    /// Each TCP measurement.
    pub duration: Duration,
    /// The measurement with a relay kill (the kill is in its middle); zero: none.
    pub kill_duration: Duration,
    /// Paths per flow, 1..=3.
    pub max_paths: usize,
    /// Adaptive SRR weights in the flow's session.
    pub adaptive: bool,
    /// The `braid` binary.
    pub exe: PathBuf,
    /// Emulator seed.
    pub seed: u64,
}

/// One 100 ms interval of the kill run.
#[derive(Clone, Debug, PartialEq)]
pub struct Interval {
    /// Its end, seconds from the start of the run.
    pub end_s: f64,
    /// Goodput in it, bit/s.
    pub bps: f64,
}

/// What a run measured.
#[derive(Clone, Debug, PartialEq)]
pub struct OverlayResult {
    /// Every hop: `a-b` and its spec.
    pub hops: Vec<(String, String)>,
    /// The paths the source chose, with their shares (as `braid node` printed them).
    pub paths: Vec<String>,
    /// TCP over the direct hop alone.
    pub direct_bps: f64,
    /// TCP through `braid node`, striped.
    pub overlay_bps: f64,
    /// TCP retransmissions through the overlay.
    pub overlay_retransmits: u64,
    /// The paths when the relay was killed (the route may have changed since the start).
    pub paths_at_kill: Vec<String>,
    /// The relay killed (node id), if the kill run ran.
    pub killed: Option<usize>,
    /// Seconds into the kill run at which the relay was killed.
    pub kill_at_s: f64,
    /// Mean goodput before the kill.
    pub before_kill_bps: f64,
    /// Mean goodput from 2 s after the kill to the end.
    pub after_kill_bps: f64,
    /// From the kill to the end of the first 0.5 s window (five 100 ms intervals) after
    /// it whose mean is at least half the mean before the kill; `None`: never in the
    /// run.
    pub recovery_ms: Option<f64>,
    /// Longest run of intervals after the kill in which the sender wrote nothing.
    pub stall_ms: f64,
    /// From the kill to the source's route change that drops the dead relay.
    pub reroute_ms: Option<f64>,
    /// The paths after that route change.
    pub paths_after: Vec<String>,
    /// The kill run's intervals.
    pub intervals: Vec<Interval>,
}

impl OverlayResult {
    /// As JSON.
    pub fn to_json(&self) -> Value {
        json!({
            "hops": self.hops.iter().map(|(h, s)| json!({"hop": h, "spec": s})).collect::<Vec<_>>(),
            "paths": self.paths,
            "direct_bps": self.direct_bps,
            "overlay_bps": self.overlay_bps,
            "overlay_retransmits": self.overlay_retransmits,
            "paths_at_kill": self.paths_at_kill,
            "killed": self.killed,
            "kill_at_s": self.kill_at_s,
            "before_kill_bps": self.before_kill_bps,
            "after_kill_bps": self.after_kill_bps,
            "recovery_ms": self.recovery_ms,
            "stall_ms": self.stall_ms,
            "reroute_ms": self.reroute_ms,
            "paths_after": self.paths_after,
            "intervals": self.intervals.iter().map(|i| json!([i.end_s, i.bps])).collect::<Vec<_>>(),
        })
    }

    /// A plain-text table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        s += "hops (a-b: rate/one-way delay, both directions):\n";
        for (h, spec) in &self.hops {
            s += &format!("  {h}: {spec}\n");
        }
        s += &format!("paths chosen: {}\n", self.paths.join(" + "));
        s += &format!("{:<44} {:>10}\n", "TCP flow (iperf3, cubic)", "Mbit/s");
        s += &format!(
            "{:<44} {:>10.2}\n",
            "direct hop 0->4 alone",
            self.direct_bps / 1e6
        );
        s += &format!(
            "{:<44} {:>10.2}   ({} retransmits)\n",
            "braid node, striped over the chosen paths",
            self.overlay_bps / 1e6,
            self.overlay_retransmits
        );
        if let Some(k) = self.killed {
            s += &format!(
                "paths when the relay was killed: {}\n",
                self.paths_at_kill.join(" + ")
            );
            s += &format!(
                "relay {k} killed at {:.1} s: before {:.2} Mbit/s, after {:.2} Mbit/s\n",
                self.kill_at_s,
                self.before_kill_bps / 1e6,
                self.after_kill_bps / 1e6
            );
            s += &format!(
                "  back to half the rate before (0.5 s mean) after: {}\n  longest stall (sender wrote nothing): {:.0} ms\n  source rerouted after: {}\n  paths after: {}\n",
                self.recovery_ms.map_or("never".into(), |m| format!("{m:.0} ms")),
                self.stall_ms,
                self.reroute_ms.map_or("no reroute seen".into(), |m| format!("{m:.0} ms")),
                self.paths_after.join(" + ")
            );
        }
        s
    }
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

fn check_interrupt() -> Result<(), LabError> {
    if INTERRUPTED.load(Ordering::Relaxed) {
        return Err(LabError::Command {
            cmd: "braid lab overlay".into(),
            reason: "interrupted; the lab was removed".into(),
        });
    }
    Ok(())
}

fn sleep(d: Duration) -> Result<(), LabError> {
    let end = Instant::now() + d;
    while Instant::now() < end {
        check_interrupt()?;
        std::thread::sleep(Duration::from_millis(20).min(end - Instant::now()));
    }
    check_interrupt()
}

/// The overlay lab's namespaces that exist now.
pub fn existing_namespaces() -> Vec<String> {
    crate::topo::namespaces_starting_with(PREFIX)
}

/// Remove everything the overlay lab created; safe to run any time.
pub fn down() -> Result<Vec<String>, LabError> {
    let mut removed = Vec::new();
    for n in existing_namespaces() {
        for sig in [libc::SIGTERM, libc::SIGKILL] {
            if let Ok(pids) = run(&["ip", "netns", "pids", &n]) {
                for p in pids
                    .split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok())
                {
                    // SAFETY: sending a signal has no memory-safety preconditions.
                    unsafe { libc::kill(p, sig) };
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        run(&["ip", "netns", "del", &n])?;
        removed.push(n);
    }
    let _ = fs::remove_dir_all(state_dir());
    Ok(removed)
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> LabError + '_ {
    move |err| LabError::Io {
        path: path.display().to_string(),
        err,
    }
}

/// Build the namespaces, hops and emulator.
fn build(m: &Matrix, exe: &Path, seed: u64) -> Result<(), LabError> {
    let dir = state_dir();
    fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    let mut names: Vec<String> = (0..NODES).map(ns).collect();
    names.push(NS_ROUTER.into());
    for n in &names {
        run(&["ip", "netns", "add", n])?;
        sh(n, "ip link set dev lo up")?;
        sh(n, "sysctl -qw net.ipv4.conf.all.rp_filter=0")?;
        sh(n, "sysctl -qw net.ipv4.conf.default.rp_filter=0")?;
    }
    sh(NS_ROUTER, "sysctl -qw net.ipv4.ip_forward=1")?;
    let specs = m.specs();
    for (k, &(a, b)) in hops().iter().enumerate() {
        add_hop(k, a, b, specs[k].rate_bps)?;
    }
    start_emulator(exe, &specs, seed, &dir)?;
    for k in 0..specs.len() {
        route_through_emulator(k)?;
    }
    Ok(())
}

/// Hop `k` between nodes `a` and `b`: a veth pair from each into the router, host
/// routes to each other through it, a tbf shaper at `rate_bps` on the router's ends.
fn add_hop(k: usize, a: usize, b: usize, rate_bps: u64) -> Result<(), LabError> {
    let (na, nb) = (ns(a), ns(b));
    add_hop_veth(k, &na, "xa")?;
    add_hop_veth(k, &nb, "xb")?;
    address_hop(k, &na, &nb)?;
    shape_hop(k, rate_bps)
}

/// One end of hop `k`: a veth pair from `h{k}` in namespace `node` to `{peer}{k}` in
/// the router's (`peer` is `xa` for the hop's lower-numbered node, `xb` for the other).
fn add_hop_veth(k: usize, node: &str, peer: &str) -> Result<(), LabError> {
    run(&[
        "ip",
        "link",
        "add",
        &format!("h{k}"),
        "netns",
        node,
        "type",
        "veth",
        "peer",
        "name",
        &format!("{peer}{k}"),
        "netns",
        NS_ROUTER,
    ])?;
    Ok(())
}

/// Hop `k`'s addresses (nodes `na` and `nb` [`addr_a`] and [`addr_b`], the router .254
/// on each side), its four interfaces up, and each node's host route to the other
/// through the router.
fn address_hop(k: usize, na: &str, nb: &str) -> Result<(), LabError> {
    let (aa, ab) = (addr_a(k), addr_b(k));
    let (ra, rb) = (
        format!("10.201.{}.254", 50 + k),
        format!("10.202.{}.254", 50 + k),
    );
    sh(na, &format!("ip addr add {aa}/24 dev h{k}"))?;
    sh(nb, &format!("ip addr add {ab}/24 dev h{k}"))?;
    sh(NS_ROUTER, &format!("ip addr add {ra}/24 dev xa{k}"))?;
    sh(NS_ROUTER, &format!("ip addr add {rb}/24 dev xb{k}"))?;
    for (n, d) in [(na, format!("h{k}")), (nb, format!("h{k}"))] {
        sh(n, &format!("ip link set dev {d} up"))?;
    }
    sh(NS_ROUTER, &format!("ip link set dev xa{k} up"))?;
    sh(NS_ROUTER, &format!("ip link set dev xb{k} up"))?;
    sh(
        na,
        &format!("ip route add {ab}/32 via {ra} dev h{k} src {aa}"),
    )?;
    sh(
        nb,
        &format!("ip route add {aa}/32 via {rb} dev h{k} src {ab}"),
    )?;
    Ok(())
}

/// Hop `k`'s rate: a tbf shaper at `rate_bps` on both of the router's ends.
fn shape_hop(k: usize, rate_bps: u64) -> Result<(), LabError> {
    for dev in ["xa", "xb"] {
        sh(
            NS_ROUTER,
            &format!(
                "tc qdisc add dev {dev}{k} root tbf rate {rate_bps}bit burst 16kb latency 30ms",
            ),
        )?;
    }
    Ok(())
}

/// The emulator in the router's namespace, detached, with a TUN device per hop; waits
/// (up to 5 s) for the devices.
fn start_emulator(exe: &Path, specs: &[LinkSpec], seed: u64, dir: &Path) -> Result<(), LabError> {
    let spec_text = specs
        .iter()
        .map(|l| l.text.clone())
        .collect::<Vec<_>>()
        .join(",");
    let log = dir.join("emulator.log");
    let logf = fs::File::create(&log).map_err(io_err(&log))?;
    let child = crate::topo::spawn_emulator(exe, NS_ROUTER, &spec_text, seed, dir, logf)?;
    // Detached: `down` ends it with the namespace's other processes.
    std::mem::forget(child);
    let n = specs.len();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let devs = sh(NS_ROUTER, "ip -o link show").unwrap_or_default();
        if (0..n).all(|i| devs.contains(&format!(": t{i}:"))) {
            break;
        }
        if Instant::now() > deadline {
            return Err(LabError::Emulator(format!(
                "its TUN devices did not appear within 5 s; its log says: {}",
                fs::read_to_string(&log).unwrap_or_default().trim()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Whatever enters the router from hop `k` leaves through the emulator's device `t{k}`.
fn route_through_emulator(k: usize) -> Result<(), LabError> {
    sh(NS_ROUTER, &format!("ip link set dev t{k} up"))?;
    sh(
        NS_ROUTER,
        &format!("sysctl -qw net.ipv4.conf.t{k}.rp_filter=0"),
    )?;
    sh(
        NS_ROUTER,
        &format!("ip route add default dev t{k} table {}", 100 + k),
    )?;
    for (side, pref) in [("xa", 1000), ("xb", 1100)] {
        sh(
            NS_ROUTER,
            &format!(
                "ip rule add iif {side}{k} lookup {} pref {}",
                100 + k,
                pref + k
            ),
        )?;
    }
    Ok(())
}

/// The configuration of node `me`, whose private key is in `node{me}.key`; `publics`
/// holds every node's public key.
pub fn node_config(
    me: usize,
    max_paths: usize,
    adaptive: bool,
    publics: &[[u8; 32]; NODES],
) -> String {
    let mut s =
        format!("id = {me}\nlisten = \"0.0.0.0:{PORT}\"\nprivate_key_file = \"node{me}.key\"\n\n");
    for p in (0..NODES).filter(|&p| p != me) {
        let (_, theirs) = hop_addrs(me, p);
        s += &format!(
            "[[peer]]\nid = {p}\naddr = \"{theirs}:{PORT}\"\npublic_key = \"{}\"\n\n",
            braid_io::keys::encode(&publics[p])
        );
    }
    s += "[probe]\nping_ms = 100\nslot_ms = 150\ntrain = 40\ntrain_bytes = 1200\nupdate_ms = 200\ndead_after_ms = 600\neval_ms = 50\n\n";
    s += &format!(
        "[route]\nmetric = \"throughput\"\nmax_paths = {max_paths}\nthreshold_percent = 30\nconsecutive = 40\n\n"
    );
    match me {
        0 => {
            s += &format!(
                "[flow]\nto = 4\ntun = \"bro0\"\naddress = \"{TUN_SRC}/24\"\nsettle_ms = 10000\nadaptive = {adaptive}\n"
            )
        }
        4 => s += &format!("[flow]\ntun = \"bro0\"\naddress = \"{TUN_DST}/24\"\nadaptive = {adaptive}\n"),
        _ => {}
    }
    s
}

/// A `braid node` process, with its output lines timestamped.
struct NodeProc {
    child: Child,
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_node(exe: &Path, me: usize, dir: &Path) -> Result<NodeProc, LabError> {
    let cfg = dir.join(format!("node{me}.toml"));
    let log = dir.join(format!("node{me}.log"));
    let logf = fs::File::create(&log).map_err(io_err(&log))?;
    // `ip netns exec` runs the program itself (exec), so the child's pid is the node's.
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns(me)])
        .arg(exe)
        .arg("node")
        .arg("--config")
        .arg(&cfg)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(logf)
        .spawn()
        .map_err(|e| LabError::Command {
            cmd: format!("braid node (node {me})"),
            reason: e.to_string(),
        })?;
    let lines = Arc::new(Mutex::new(Vec::new()));
    if let Some(out) = child.stdout.take() {
        let lines = lines.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { return };
                lines
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((Instant::now(), l));
            }
        });
    }
    Ok(NodeProc { child, lines })
}

fn iperf_client(dst: &str, bind: Option<&str>, secs: f64, interval: bool) -> Command {
    let mut c = Command::new("ip");
    c.args([
        "netns",
        "exec",
        &ns(0),
        "iperf3",
        "-J",
        "-C",
        "cubic",
        "-c",
        dst,
    ]);
    c.args(["-t", &format!("{secs}")]);
    if let Some(b) = bind {
        c.args(["-B", b]);
    }
    if interval {
        // Small writes, so the 100 ms intervals are not whole 128 KB blocks.
        c.args(["-i", "0.1", "-l", "16K"]);
    }
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn iperf_json(out: std::process::Output, what: &str) -> Result<Value, LabError> {
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| LabError::Command {
        cmd: what.into(),
        reason: format!(
            "iperf3 output is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    })?;
    if v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .is_none()
    {
        return Err(LabError::Command {
            cmd: what.into(),
            reason: format!("no goodput in iperf3 output: {}", v["error"]),
        });
    }
    Ok(v)
}

fn wait_child(mut c: Command, what: &str) -> Result<Value, LabError> {
    let mut child = c.spawn().map_err(|e| LabError::Command {
        cmd: what.into(),
        reason: e.to_string(),
    })?;
    loop {
        if INTERRUPTED.load(Ordering::Relaxed) {
            let _ = child.kill();
            let _ = child.wait();
            check_interrupt()?;
        }
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().map_err(|e| LabError::Command {
        cmd: what.into(),
        reason: e.to_string(),
    })?;
    iperf_json(out, what)
}

/// The paths of the last `route to 4:` line of the source before `until`.
fn route_line(lines: &[(Instant, String)], until: Option<Instant>) -> Option<(Instant, String)> {
    lines
        .iter()
        .rev()
        .find(|(t, l)| l.starts_with("route to 4:") && until.is_none_or(|u| *t <= u))
        .cloned()
}

fn split_paths(line: &str) -> Vec<String> {
    let body = line.trim_start_matches("route to 4:");
    let body = body.split(" [").next().unwrap_or(body);
    body.split(" + ").map(|p| p.trim().to_string()).collect()
}

/// The relay of the first (best) path that has one.
fn best_relay(paths: &[String]) -> Option<usize> {
    paths.iter().find_map(|p| {
        let hops: Vec<&str> = p.split_whitespace().next()?.split("->").collect();
        (hops.len() == 3).then(|| hops[1].parse().ok()).flatten()
    })
}

/// The sender's intervals of an iperf3 `-i 0.1` run (bytes written into the
/// connection: bursty at 100 ms, zero while TCP waits for a timeout).
fn intervals(v: &Value) -> Vec<Interval> {
    v["intervals"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| {
                    Some(Interval {
                        end_s: i["sum"]["end"].as_f64()?,
                        bps: i["sum"]["bits_per_second"].as_f64()?,
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Recovery after a kill at `at` s: (recovery ms, longest stall ms, mean before, mean
/// from 2 s after).
pub fn recovery(iv: &[Interval], at: f64) -> (Option<f64>, f64, f64, f64) {
    let mean = |v: Vec<f64>| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    // Skip the first second (slow start) for the mean before.
    let before = mean(
        iv.iter()
            .filter(|i| i.end_s > 1.0 && i.end_s <= at)
            .map(|i| i.bps)
            .collect(),
    );
    let after = mean(
        iv.iter()
            .filter(|i| i.end_s > at + 2.0)
            .map(|i| i.bps)
            .collect(),
    );
    // The interval containing the kill counts as after it. The sender's 100 ms
    // intervals are bursty, so recovery is judged on 0.5 s windows: recovered at the
    // end of the first window after the kill whose mean is at least half the mean
    // before it. A stall is a run of intervals in which the sender wrote nothing
    // (TCP waiting for acknowledgements or a retransmission timeout).
    let post: Vec<&Interval> = iv.iter().filter(|i| i.end_s > at).collect();
    let rec = post
        .windows(5)
        .find(|w| w.iter().map(|i| i.bps).sum::<f64>() / 5.0 >= 0.5 * before)
        .map(|w| ((w[4].end_s - at) * 1e3).max(0.0));
    let mut stall: f64 = 0.0;
    let mut run: f64 = 0.0;
    let mut prev_end = at;
    for i in post {
        if i.bps < 1.0 {
            run += (i.end_s - prev_end) * 1e3;
            stall = stall.max(run);
        } else {
            run = 0.0;
        }
        prev_end = i.end_s;
    }
    (rec, stall, before, after)
}

/// Removes the lab when dropped (errors, panics, Ctrl-C).
struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = down();
    }
}

/// Build the lab, measure, remove the lab. `progress` receives one line per step.
pub fn run_overlay(
    opt: &OverlayOptions,
    mut progress: impl FnMut(&str),
) -> Result<OverlayResult, LabError> {
    preflight(opt)?;
    INTERRUPTED.store(false, Ordering::Relaxed);
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let _cleanup = Cleanup;
    progress("building namespaces bro-s, bro-r1..3, bro-d, bro-x and ten emulated hops");
    build(&opt.matrix, &opt.exe, opt.seed)?;
    let dir = state_dir();
    write_node_files(opt, &dir)?;
    let mut nodes: Vec<Option<NodeProc>> = Vec::new();
    for me in 0..NODES {
        nodes.push(Some(start_node(&opt.exe, me, &dir)?));
    }
    progress("nodes started; waiting for measurements, routes and the flow's PROVISION");
    wait_for_flow(&dir)?;
    let src_lines = nodes[0]
        .as_ref()
        .map(|n| n.lines.clone())
        .unwrap_or_default();
    let paths = route_line(&src_lines.lock().unwrap_or_else(|p| p.into_inner()), None)
        .map(|(_, l)| split_paths(&l))
        .unwrap_or_default();
    progress(&format!("flow up over {}", paths.join(" + ")));
    start_iperf_server()?;
    let mut r = measure_tcp(opt, paths.clone(), &mut progress)?;
    if opt.kill_duration.as_secs_f64() > 0.0 {
        let now_paths = route_line(&src_lines.lock().unwrap_or_else(|p| p.into_inner()), None)
            .map(|(_, l)| split_paths(&l))
            .unwrap_or(paths);
        kill_run(
            opt,
            &mut nodes,
            &src_lines,
            now_paths,
            &mut r,
            &mut progress,
        )?;
    }
    drop(nodes);
    Ok(r)
}

/// Root, the tools, no overlay lab up yet, three relay hops.
fn preflight(opt: &OverlayOptions) -> Result<(), LabError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(LabError::NotRoot);
    }
    if let Some(why) = tools::missing(&[tools::LAB_UP, tools::LAB_BENCH].concat()) {
        return Err(LabError::MissingTools(why));
    }
    if let Some(n) = existing_namespaces().first() {
        return Err(LabError::AlreadyUp(n.clone()));
    }
    if opt.matrix.relays.len() != 3 {
        return Err(LabError::Command {
            cmd: "braid lab overlay".into(),
            reason: format!(
                "three relay hop specs needed, {} given",
                opt.matrix.relays.len()
            ),
        });
    }
    Ok(())
}

/// Every node its own key pair (`nodeN.key`, mode 600) and a configuration
/// (`nodeN.toml`) that lists the others' public keys.
fn write_node_files(opt: &OverlayOptions, dir: &Path) -> Result<(), LabError> {
    let mut publics = [[0u8; 32]; NODES];
    for (me, public) in publics.iter_mut().enumerate() {
        let key = braid_io::keys::generate().map_err(|e| LabError::Command {
            cmd: "key".into(),
            reason: e.to_string(),
        })?;
        *public = braid_io::keys::public_key(&key);
        let kf = dir.join(format!("node{me}.key"));
        fs::write(&kf, braid_io::keys::encode(&key) + "\n").map_err(io_err(&kf))?;
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&kf, fs::Permissions::from_mode(0o600)).map_err(io_err(&kf))?;
    }
    for me in 0..NODES {
        let p = dir.join(format!("node{me}.toml"));
        fs::write(&p, node_config(me, opt.max_paths, opt.adaptive, &publics))
            .map_err(io_err(&p))?;
    }
    Ok(())
}

/// Wait (up to 60 s) until a ping crosses the flow's TUN from source to destination.
fn wait_for_flow(dir: &Path) -> Result<(), LabError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        check_interrupt()?;
        let ok = Command::new("ip")
            .args([
                "netns",
                "exec",
                &ns(0),
                "ping",
                "-c",
                "1",
                "-W",
                "1",
                TUN_DST,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(LabError::Command {
                cmd: "braid node".into(),
                reason: format!(
                    "no packet crossed the overlay within 60 s; see the node logs in {} (removed with the lab: rerun with RUST_LOG=debug to see more)",
                    dir.display()
                ),
            });
        }
        sleep(Duration::from_millis(500))?;
    }
}

/// An iperf3 server (daemon) in the destination's namespace.
fn start_iperf_server() -> Result<(), LabError> {
    let srv = Command::new("ip")
        .args(["netns", "exec", &ns(4), "iperf3", "-s", "-D"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| LabError::Command {
            cmd: "iperf3 -s".into(),
            reason: e.to_string(),
        })?;
    if !srv.status.success() {
        return Err(LabError::Command {
            cmd: "iperf3 -s".into(),
            reason: String::from_utf8_lossy(&srv.stderr).into(),
        });
    }
    sleep(Duration::from_millis(300))
}

/// TCP over the direct hop alone, then through the overlay: the result without the
/// kill run.
fn measure_tcp(
    opt: &OverlayOptions,
    paths: Vec<String>,
    progress: &mut impl FnMut(&str),
) -> Result<OverlayResult, LabError> {
    let secs = opt.duration.as_secs_f64();
    let (mine, theirs) = hop_addrs(0, 4);
    progress(&format!("TCP over the direct hop alone, {secs} s"));
    let d = wait_child(
        iperf_client(&theirs, Some(&mine), secs, false),
        "iperf3 direct",
    )?;
    let direct_bps = d["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or(0.0);
    progress(&format!("TCP through braid node, {secs} s"));
    let o = wait_child(iperf_client(TUN_DST, None, secs, false), "iperf3 overlay")?;
    let overlay_bps = o["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or(0.0);
    let overlay_retransmits = o["end"]["sum_sent"]["retransmits"].as_u64().unwrap_or(0);
    Ok(OverlayResult {
        hops: hops()
            .iter()
            .zip(opt.matrix.specs())
            .map(|(&(a, b), s)| (format!("{a}-{b}"), s.text))
            .collect(),
        paths,
        direct_bps,
        overlay_bps,
        overlay_retransmits,
        paths_at_kill: Vec::new(),
        killed: None,
        kill_at_s: 0.0,
        before_kill_bps: 0.0,
        after_kill_bps: 0.0,
        recovery_ms: None,
        stall_ms: 0.0,
        reroute_ms: None,
        paths_after: Vec::new(),
        intervals: Vec::new(),
    })
}

/// TCP through the overlay while the relay of the best path (of `now_paths`) is killed
/// halfway: the stall, the recovery and the source's reroute, into `r`.
fn kill_run(
    opt: &OverlayOptions,
    nodes: &mut [Option<NodeProc>],
    src_lines: &Mutex<Vec<(Instant, String)>>,
    now_paths: Vec<String>,
    r: &mut OverlayResult,
    progress: &mut impl FnMut(&str),
) -> Result<(), LabError> {
    let ksecs = opt.kill_duration.as_secs_f64();
    let victim = best_relay(&now_paths).ok_or_else(|| LabError::Command {
        cmd: "braid lab overlay".into(),
        reason: format!("no path through a relay to kill: {}", now_paths.join(" + ")),
    })?;
    progress(&format!(
        "TCP through braid node, {ksecs} s, relay {victim} killed after {:.1} s",
        ksecs / 2.0
    ));
    let (started, killed_at, v) = iperf_with_relay_kill(nodes, victim, ksecs)?;
    let iv = intervals(&v);
    // iperf3's intervals start after its connection set-up: align on its own end.
    let total = iv.last().map_or(ksecs, |i| i.end_s);
    let wall = started.elapsed().as_secs_f64();
    let at = (killed_at - started).as_secs_f64() - (wall - total).max(0.0);
    let (rec, stall, before, after) = recovery(&iv, at);
    let dead = dead_route_after(src_lines, killed_at);
    r.killed = Some(victim);
    r.paths_at_kill = now_paths;
    r.kill_at_s = at;
    r.before_kill_bps = before;
    r.after_kill_bps = after;
    r.recovery_ms = rec;
    r.stall_ms = stall;
    r.reroute_ms = dead
        .as_ref()
        .map(|(t, _)| (*t - killed_at).as_secs_f64() * 1e3);
    r.paths_after = dead.map(|(_, l)| split_paths(&l)).unwrap_or_default();
    r.intervals = iv;
    Ok(())
}

/// The kill run's flow: iperf3 through the overlay for `ksecs` seconds in 100 ms
/// intervals, with relay `victim` killed (SIGKILL) halfway. Returns when the flow
/// started, when the relay was killed, and iperf3's JSON report.
fn iperf_with_relay_kill(
    nodes: &mut [Option<NodeProc>],
    victim: usize,
    ksecs: f64,
) -> Result<(Instant, Instant, Value), LabError> {
    let mut child = iperf_client(TUN_DST, None, ksecs, true)
        .spawn()
        .map_err(|e| LabError::Command {
            cmd: "iperf3 kill run".into(),
            reason: e.to_string(),
        })?;
    let started = Instant::now();
    // iperf3 connects first; its clock starts about when the process does.
    let res = sleep(Duration::from_secs_f64(ksecs / 2.0));
    if let Err(e) = res {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    let killed_at = Instant::now();
    if let Some(n) = nodes[victim].as_mut() {
        let _ = n.child.kill();
        let _ = n.child.wait();
    }
    nodes[victim] = None;
    let out = child.wait_with_output().map_err(|e| LabError::Command {
        cmd: "iperf3 kill run".into(),
        reason: e.to_string(),
    })?;
    let v = iperf_json(out, "iperf3 kill run")?;
    Ok((started, killed_at, v))
}

/// The source's first route line at or after `killed_at` that marks a path dead: when
/// it came and its text.
fn dead_route_after(
    src_lines: &Mutex<Vec<(Instant, String)>>,
    killed_at: Instant,
) -> Option<(Instant, String)> {
    let lines = src_lines.lock().unwrap_or_else(|p| p.into_inner());
    lines
        .iter()
        .find(|(t, l)| *t >= killed_at && l.starts_with("route to 4:") && l.contains("[dead"))
        .cloned()
}

/// Draw the result: the two TCP flows as bars, the kill run over time.
pub fn draw(r: &OverlayResult, title: &str, path: &Path) -> Result<(), String> {
    use braid_sim::plot::{Format, PixelText};
    use plotters::prelude::*;
    let format = Format::from_path(path)
        .ok_or_else(|| format!("{}: the plot must end in .svg or .png", path.display()))?;
    let size = (1100, 520);
    match format {
        Format::Svg => render(r, title, SVGBackend::new(path, size).into_drawing_area()),
        Format::Png => render(
            r,
            title,
            PixelText(BitMapBackend::new(path, size)).into_drawing_area(),
        ),
    }
}

/// The figure: the two TCP flows' goodput as bars on the left, the kill run's goodput
/// over time on the right, under `title`.
fn render<DB: plotters::prelude::DrawingBackend>(
    r: &OverlayResult,
    title: &str,
    root: plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
) -> Result<(), String> {
    use plotters::prelude::*;
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let root = root.titled(title, ("sans-serif", 20)).map_err(e)?;
    let (left, right) = root.split_horizontally(360);
    draw_goodput_bars(r, &left)?;
    draw_kill_run(r, &right)?;
    root.present().map_err(e)?;
    Ok(())
}

/// Bars of the TCP goodput over the direct hop and through `braid node`, each labelled
/// with its Mbit/s.
fn draw_goodput_bars<DB: plotters::prelude::DrawingBackend>(
    r: &OverlayResult,
    area: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
) -> Result<(), String> {
    use plotters::prelude::*;
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let bars = [
        ("direct", r.direct_bps, RGBColor(150, 150, 150)),
        ("braid node", r.overlay_bps, RGBColor(31, 119, 180)),
    ];
    let ymax = bars.iter().map(|b| b.1 / 1e6).fold(1.0, f64::max) * 1.2;
    let mut c = ChartBuilder::on(area)
        .margin(16)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..2f64, 0f64..ymax)
        .map_err(e)?;
    c.configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("TCP goodput, Mbit/s")
        .draw()
        .map_err(e)?;
    for (i, (name, bps, col)) in bars.iter().enumerate() {
        let x = i as f64;
        c.draw_series(std::iter::once(Rectangle::new(
            [(x + 0.15, 0.0), (x + 0.85, bps / 1e6)],
            col.filled(),
        )))
        .map_err(e)?;
        c.draw_series(std::iter::once(Text::new(
            format!("{name} {:.1}", bps / 1e6),
            (x + 0.15, bps / 1e6 + ymax * 0.03),
            ("sans-serif", 14),
        )))
        .map_err(e)?;
    }
    Ok(())
}

/// The kill run's goodput per 100 ms over time, with a vertical line at the kill.
fn draw_kill_run<DB: plotters::prelude::DrawingBackend>(
    r: &OverlayResult,
    area: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
) -> Result<(), String> {
    use plotters::prelude::*;
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let tmax = r.intervals.last().map_or(1.0, |i| i.end_s);
    let ymax2 = r.intervals.iter().map(|i| i.bps / 1e6).fold(1.0, f64::max) * 1.15;
    let mut c2 = ChartBuilder::on(area)
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .caption(
            match r.killed {
                Some(k) => format!("relay {k} killed at {:.1} s", r.kill_at_s),
                None => "no relay killed".into(),
            },
            ("sans-serif", 16),
        )
        .build_cartesian_2d(0f64..tmax, 0f64..ymax2)
        .map_err(e)?;
    c2.configure_mesh()
        .x_desc("s")
        .y_desc("Mbit/s per 100 ms")
        .draw()
        .map_err(e)?;
    c2.draw_series(LineSeries::new(
        r.intervals.iter().map(|i| (i.end_s, i.bps / 1e6)),
        RGBColor(31, 119, 180).stroke_width(2),
    ))
    .map_err(e)?;
    if r.killed.is_some() {
        c2.draw_series(std::iter::once(PathElement::new(
            vec![(r.kill_at_s, 0.0), (r.kill_at_s, ymax2)],
            RGBColor(214, 39, 40).stroke_width(2),
        )))
        .map_err(e)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hops_and_addresses() {
        assert_eq!(hops().len(), 10);
        assert_eq!(
            hop_addrs(0, 4),
            ("10.201.53.1".into(), "10.202.53.1".into())
        );
        assert_eq!(
            hop_addrs(4, 0),
            ("10.202.53.1".into(), "10.201.53.1".into())
        );
        let keys: Vec<[u8; 32]> = (0..NODES)
            .map(|_| braid_io::keys::generate().unwrap())
            .collect();
        let mut publics = [[0u8; 32]; NODES];
        for (p, k) in publics.iter_mut().zip(&keys) {
            *p = braid_io::keys::public_key(k);
        }
        let cfg = node_config(2, 3, false, &publics);
        assert!(cfg.contains("addr = \"10.201.51.1:7400\""), "{cfg}");
        let dir = std::env::temp_dir().join(format!("braid-lab-ovl-cfg-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let kf = dir.join("node2.key");
        fs::write(&kf, braid_io::keys::encode(&keys[2])).unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&kf, fs::Permissions::from_mode(0o600)).unwrap();
        let parsed = braid_io::node::NodeConfig::parse(&cfg, &dir);
        let _ = fs::remove_dir_all(&dir);
        let parsed = parsed.unwrap();
        assert_eq!(parsed.peers[0].public_key, publics[0]);
        let m = Matrix {
            direct: LinkSpec::parse("4mbit/40ms").unwrap(),
            relays: ["10mbit/10ms", "8mbit/10ms", "6mbit/10ms"]
                .iter()
                .map(|s| LinkSpec::parse(s).unwrap())
                .collect(),
            between: LinkSpec::parse("10mbit/5ms").unwrap(),
        };
        let s = m.specs();
        assert_eq!(s[3].text, "4mbit/40ms");
        assert_eq!(s[1].text, "8mbit/10ms");
        assert_eq!(s[8].text, "8mbit/10ms"); // 2-4
        assert_eq!(s[4].text, "10mbit/5ms"); // 1-2
    }

    #[test]
    fn recovery_and_paths() {
        let iv: Vec<Interval> = (1..=60)
            .map(|i| Interval {
                end_s: i as f64 / 10.0,
                bps: if (31..=36).contains(&i) { 0.0 } else { 10e6 },
            })
            .collect();
        let (rec, stall, before, after) = recovery(&iv, 3.0);
        assert_eq!(before, 10e6);
        assert_eq!(after, 10e6);
        // Windows 3.0-3.5 .. : the first with mean >= 5e6 ends at 3.9 (3 of 5 good).
        assert!((rec.unwrap() - 900.0).abs() < 1e-6, "{rec:?}");
        assert!((stall - 600.0).abs() < 1e-6, "{stall}");
        let p = split_paths("route to 4: 0->2->4 (8.00 Mbit/s) + 0->4 (3.00 Mbit/s) [initial]");
        assert_eq!(p, vec!["0->2->4 (8.00 Mbit/s)", "0->4 (3.00 Mbit/s)"]);
        assert_eq!(best_relay(&p), Some(2));
        assert_eq!(best_relay(&p[1..]), None);
    }
}
