//! `braid bench peers`: many client sessions from one process against a real server
//! process (`braid tunnel` with one `[[peer]]` per client), over loopback in a network
//! namespace of its own (issue 30, item 7).
//!
//! The server is the real thing: `braid tunnel` with its TUN device, started in the
//! namespace with a generated configuration of N `[[peer]]`s. The clients are braid
//! sessions without a TUN device (the session machine of this crate, as `braid bench
//! send` runs it), each with its own static key and its own sockets, all driven by one
//! runtime of this process that runs inside the namespace. What it measures:
//!
//! * **handshakes**: every client starts at once; the time until the last one is
//!   established gives `handshakes_per_s`, and the server's CPU time over the same
//!   span gives `handshakes_per_cpu_s` (the rate one core of the server sustains; on a
//!   small machine the clients' own public-key work competes with the server's);
//! * **memory**: the server's resident set (`VmRSS`) before any client, and with all N
//!   connected and idle (after a settling pause), and its CPU while they idle;
//! * **forwarding**: K clients send IPv4/UDP packets as fast as their sessions take
//!   them, through the server's TUN device to a UDP socket on the server's inner
//!   address; the bytes that socket receives per second;
//! * **flood** (`--flood RATE`): the same forwarding again while one thread sends
//!   forged initiations with a valid mac1 (the server's public key is public) from
//!   many loopback addresses at RATE per second to the server's ports: the throughput
//!   ratio and what the server counted.
//!
//! Everything is bounded (peers, duration, rates, a timeout for the handshakes) and is
//! removed on every exit path: the server process is stopped and the namespace deleted.

use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use serde::Serialize;

use crate::config::ChannelConfig;
use crate::keys;
use crate::stats::ServerCounters;
use crate::{Session, SessionConfig};

/// The flags of `braid bench peers`.
#[derive(clap::Args, Debug, Clone)]
pub struct PeersArgs {
    /// Client sessions (each its own key and sockets), 1 to 5000.
    #[arg(long, default_value_t = 100)]
    pub peers: usize,
    /// Channels of each client (and ports of the server), 1 to 8.
    #[arg(long, default_value_t = 2)]
    pub channels: usize,
    /// Forwarding phase length (and again under --flood).
    #[arg(long, default_value = "3s")]
    pub duration: String,
    /// Clients that send during the forwarding phase (0: none).
    #[arg(long, default_value_t = 4)]
    pub active: usize,
    /// Hello interval of every session (server and clients); braid's default if unset.
    #[arg(long)]
    pub heartbeat: Option<String>,
    /// Also measure forwarding under a flood of forged initiations at this rate per
    /// second (valid mac1, from many loopback addresses), up to 1000000.
    #[arg(long, value_name = "PER_SECOND")]
    pub flood: Option<u64>,
    /// Give up on clients not established after this long.
    #[arg(long, default_value = "60s")]
    pub timeout: String,
    /// The braid binary to run the server with (default: this one).
    #[arg(long)]
    pub braid: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Forwarding through the server for a while.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Forwarding {
    /// Clients sending.
    pub active: usize,
    /// Seconds measured.
    pub seconds: f64,
    /// Inner packets the clients' sessions took.
    pub sent_packets: u64,
    /// Inner packets the socket behind the server's TUN device received.
    pub received_packets: u64,
    /// UDP payload bytes received per second, in bits.
    pub received_bps: f64,
    /// The server's CPU over the phase, in cores.
    pub server_cpu: f64,
}

/// The flood phase.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Flood {
    /// Initiations per second asked for.
    pub rate: u64,
    /// Initiations sent.
    pub sent: u64,
    /// Initiations per second reached.
    pub sent_per_s: f64,
    /// Forwarding meanwhile.
    pub forwarding: Forwarding,
    /// Its throughput over the one without a flood.
    pub ratio: f64,
    /// The server's counters' growth over the phase.
    pub server_delta: ServerCounters,
    /// A client that was not connected, started during the flood: how long it took to
    /// be established (None: not within the phase).
    pub handshake_ms: Option<f64>,
}

/// What `braid bench peers` measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PeersReport {
    /// Client sessions started.
    pub peers: usize,
    /// Channels each.
    pub channels: usize,
    /// Clients established (within the timeout).
    pub handshakes_completed: usize,
    /// From starting the first client to the last one established.
    pub establish_s: f64,
    /// `handshakes_completed / establish_s`.
    pub handshakes_per_s: f64,
    /// The server's CPU time over that span, in seconds.
    pub establish_server_cpu_s: f64,
    /// Handshakes per second of the server's CPU (one core).
    pub handshakes_per_cpu_s: f64,
    /// The CPU time of the server's handshake thread (its public-key work) over that
    /// span, in seconds.
    pub establish_handshake_cpu_s: f64,
    /// Handshakes per second of the handshake thread's CPU: the rate its one thread
    /// sustains, whatever else the machine (and the rest of the server, such as the
    /// established peers' heartbeats) does.
    pub handshakes_per_handshake_cpu_s: f64,
    /// The CPU time of this process (the clients: their own public-key work, sockets
    /// and timers) over that span, in seconds: on a small machine they compete with the
    /// server, and the wall-clock rate is the slower of the two.
    pub establish_clients_cpu_s: f64,
    /// Peers the server reports connected.
    pub server_peers_connected: u64,
    /// The server's resident set before any client.
    pub rss_start_bytes: u64,
    /// The server's resident set with the clients connected and idle.
    pub rss_bytes: u64,
    /// `(rss_bytes - rss_start_bytes) / handshakes_completed`.
    pub rss_per_peer_bytes: u64,
    /// The server's CPU while every client idles (hellos only), in cores.
    pub idle_server_cpu: f64,
    /// Forwarding with `active` clients sending.
    pub forwarding: Forwarding,
    /// Forwarding under a flood of forged initiations (`--flood`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flood: Option<Flood>,
    /// The server's counters at the end.
    pub server: ServerCounters,
}

/// The most clients one run starts.
const MAX_PEERS: usize = 5000;
/// The longest forwarding phase.
const MAX_DURATION: Duration = Duration::from_secs(60);
/// The fastest flood.
const MAX_FLOOD: u64 = 1_000_000;
/// The server's first UDP port (one per channel, inside the namespace).
const BASE_PORT: u16 = 7000;
/// The port of the socket behind the server's TUN device.
const SINK_PORT: u16 = 9000;
/// The server's inner address; client i is `10.1.0.0 + i`.
const SERVER_INNER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
/// Pause after the handshakes before the idle measurements.
const SETTLE: Duration = Duration::from_secs(2);

fn dur(s: &str, flag: &str) -> Result<Duration> {
    braid_proto::units::parse_duration(s).with_context(|| flag.to_string())
}

/// The flags, checked.
struct Plan {
    peers: usize,
    channels: usize,
    duration: Duration,
    active: usize,
    heartbeat: Option<String>,
    flood: Option<u64>,
    timeout: Duration,
    braid: PathBuf,
}

impl PeersArgs {
    fn plan(&self) -> Result<Plan> {
        if !(1..=MAX_PEERS).contains(&self.peers) {
            bail!("--peers {}: give 1 to {MAX_PEERS}", self.peers);
        }
        if !(1..=8).contains(&self.channels) {
            bail!("--channels {}: give 1 to 8", self.channels);
        }
        let duration = dur(&self.duration, "--duration")?;
        if duration.is_zero() || duration > MAX_DURATION {
            bail!(
                "--duration {}: give more than 0 and at most 60s",
                self.duration
            );
        }
        if let Some(h) = &self.heartbeat {
            dur(h, "--heartbeat")?;
        }
        let flood = match self.flood {
            Some(r) if r == 0 || r > MAX_FLOOD => bail!("--flood {r}: give 1 to {MAX_FLOOD}"),
            f => f,
        };
        let timeout = dur(&self.timeout, "--timeout")?;
        let braid = match &self.braid {
            Some(b) => b.clone(),
            None => std::env::current_exe().context("the braid binary (give --braid)")?,
        };
        Ok(Plan {
            peers: self.peers,
            channels: self.channels,
            duration,
            active: self.active.min(self.peers),
            heartbeat: self.heartbeat.clone(),
            flood,
            timeout,
            braid,
        })
    }

    /// Run the benchmark (needs root: a network namespace and a TUN device); the report
    /// as text to print (a table, or JSON with `--json`).
    pub async fn run(self) -> Result<String> {
        let plan = self.plan()?;
        let json = self.json;
        let (tx, rx) = tokio::sync::oneshot::channel();
        // The clients run on a runtime of their own, on a thread that entered the
        // namespace (its threads, and so every socket they open, are inside it).
        std::thread::Builder::new()
            .name("braid-peers-bench".into())
            .spawn(move || {
                let _ = tx.send(run_blocking(plan));
            })
            .context("cannot start the benchmark's thread")?;
        let report = rx
            .await
            .map_err(|_| anyhow!("the benchmark's thread failed"))??;
        Ok(render(&report, json))
    }
}

/// The namespace, the server process and the files of one run; removed on drop.
struct Lab {
    ns: String,
    dir: tempfile::TempDir,
    server: Option<Child>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            // SAFETY: kill has no memory preconditions; the pid is our child's.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("cannot run `ip` (install iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl Lab {
    fn new() -> Result<Lab> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            bail!("braid bench peers needs root (a network namespace and a TUN device)");
        }
        let ns = format!("braid-peers-{}", std::process::id());
        ip(&["netns", "add", &ns])?;
        let lab = Lab {
            ns,
            dir: tempfile::tempdir().context("a temporary directory")?,
            server: None,
        };
        ip(&["-n", &lab.ns, "link", "set", "lo", "up"])?;
        Ok(lab)
    }

    /// Enter the namespace on this thread (and the threads it starts).
    fn enter(&self) -> Result<()> {
        use std::os::fd::AsRawFd;
        let f = std::fs::File::open(format!("/run/netns/{}", self.ns))
            .with_context(|| format!("cannot open namespace {}", self.ns))?;
        // SAFETY: a valid namespace descriptor; setns changes only this thread.
        if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            bail!(
                "cannot enter namespace {}: {}",
                self.ns,
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    }

    fn write(&self, name: &str, text: &str) -> Result<PathBuf> {
        use std::os::unix::fs::OpenOptionsExt;
        let p = self.dir.path().join(name);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&p)
            .with_context(|| format!("cannot write {}", p.display()))?;
        f.write_all(text.as_bytes())?;
        Ok(p)
    }

    fn control(&self) -> PathBuf {
        self.dir.path().join("server.ctl")
    }

    fn server_pid(&self) -> u32 {
        self.server.as_ref().map_or(0, |c| c.id())
    }
}

/// Client `i`'s inner address.
fn client_inner(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 1, 0, 0)) + i as u32)
}

/// The server's configuration for these client keys.
fn server_config(plan: &Plan, key_file: &Path, ctl: &Path, clients: &[[u8; 32]]) -> String {
    let mut s = format!(
        "[tunnel]\nname = \"bpeers{}\"\naddress = \"{SERVER_INNER}/8\"\ncontrol = \"{}\"\nlog_interval = \"0s\"\n\n[session]\nprivate_key_file = \"{}\"\n",
        std::process::id() % 1_000_000,
        ctl.display(),
        key_file.display()
    );
    if let Some(h) = &plan.heartbeat {
        // dead_after as the clients have it: six heartbeats, at least the default.
        let hb = dur(h, "--heartbeat").unwrap_or_default();
        let dead = (hb * 6).max(Duration::from_millis(300));
        s += &format!(
            "heartbeat = \"{h}\"\ndead_after = \"{}ms\"\n",
            dead.as_millis()
        );
    }
    for c in 0..plan.channels {
        s += &format!(
            "\n[[channel]]\nname = \"c{c}\"\nlocal = \"127.0.0.1:{}\"\n",
            BASE_PORT + c as u16
        );
    }
    for (i, k) in clients.iter().enumerate() {
        s += &format!(
            "\n[[peer]]\nname = \"p{i}\"\npublic_key = \"{}\"\nallowed_ips = [\"{}/32\"]\n",
            keys::encode(&keys::public_key(k)),
            client_inner(i)
        );
    }
    s
}

/// Client `i`'s session configuration.
fn client_config(plan: &Plan, private: [u8; 32], server: [u8; 32]) -> Result<SessionConfig> {
    let channels = (0..plan.channels)
        .map(|c| {
            ChannelConfig::new(
                format!("c{c}"),
                SocketAddr::from(([127, 0, 0, 1], 0)),
                SocketAddr::from(([127, 0, 0, 1], BASE_PORT + c as u16)),
            )
        })
        .collect();
    let mut cfg = SessionConfig::new(channels, Vec::new());
    cfg.core.private_key = Some(private);
    cfg.core.peer_public_key = Some(server);
    if let Some(h) = &plan.heartbeat {
        let heartbeat = dur(h, "--heartbeat")?;
        let us = |d: Duration| braid_proto::Duration::from_micros(d.as_micros() as u64);
        cfg.core.heartbeat = us(heartbeat);
        cfg.core.dead_after = us((heartbeat * 6).max(Duration::from_millis(300)));
    }
    cfg.validate().map_err(|e| anyhow!("client session: {e}"))?;
    Ok(cfg)
}

/// Start the server process in the namespace and wait until it answers.
fn start_server(lab: &mut Lab, plan: &Plan, clients: &[[u8; 32]]) -> Result<[u8; 32]> {
    let key = keys::generate().map_err(|e| anyhow!("no random key: {e}"))?;
    let key_file = lab.write("server.key", &keys::encode(&key))?;
    let cfg = server_config(plan, &key_file, &lab.control(), clients);
    let cfg_file = lab.write("server.toml", &cfg)?;
    let log = std::fs::File::create(lab.dir.path().join("server.log"))?;
    let child = Command::new("ip")
        .args(["netns", "exec", &lab.ns])
        .arg(&plan.braid)
        .args(["tunnel", "--peer-timeout", "0s", "--config"])
        .arg(&cfg_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot start {}", plan.braid.display()))?;
    lab.server = Some(child);
    Ok(keys::public_key(&key))
}

/// The server's log so far (for an error).
fn server_log(lab: &Lab) -> String {
    let log = std::fs::read_to_string(lab.dir.path().join("server.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}

/// The server's counters, once it answers (within 10 s).
async fn server_up(lab: &mut Lab) -> Result<ServerCounters> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(Ok(Some(st))) = lab.server.as_mut().map(|c| c.try_wait()) {
            bail!("the server exited ({st}):\n{}", server_log(lab));
        }
        if let Ok(s) = crate::observe::query_control(&lab.control()).await {
            return s
                .server
                .ok_or_else(|| anyhow!("the server is not serving [[peer]]s"));
        }
        if Instant::now() > deadline {
            bail!(
                "the server did not answer within 10 s:\n{}",
                server_log(lab)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The server's counters (the control socket's `server` command: the whole snapshot
/// asks every peer's session, which with a thousand peers takes longer than
/// `braid status` waits).
async fn server_counters(lab: &Lab) -> Result<ServerCounters> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let path = lab.control();
    let ask = async {
        let mut conn = tokio::net::UnixStream::connect(&path).await?;
        conn.write_all(b"server\n").await?;
        let mut buf = String::new();
        conn.read_to_string(&mut buf).await?;
        Ok::<_, std::io::Error>(buf)
    };
    let text = tokio::time::timeout(Duration::from_secs(30), ask)
        .await
        .map_err(|_| anyhow!("server status ({}): no answer within 30 s", path.display()))?
        .with_context(|| format!("server status ({})", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("server status: {}", text.trim()))
}

/// `VmRSS` of a process, in bytes.
pub fn rss_bytes(pid: u32) -> Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read /proc/{pid}/status"))?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| anyhow!("no VmRSS in /proc/{pid}/status"))
}

/// The name of the server's handshake thread (`session::HandshakePool`).
const HANDSHAKE_THREAD: &str = "braid-handshake";

/// CPU time (user and system) a process used, in seconds.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    stat_cpu_seconds(&format!("/proc/{pid}/stat"))
}

/// CPU time (user and system) of a process's threads named `name`, in seconds.
pub fn thread_cpu_seconds(pid: u32, name: &str) -> Result<f64> {
    let dir = format!("/proc/{pid}/task");
    let mut sum = 0.0;
    for t in std::fs::read_dir(&dir).with_context(|| format!("cannot read {dir}"))? {
        let t = t?.path();
        let comm = std::fs::read_to_string(t.join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            sum += stat_cpu_seconds(&t.join("stat").to_string_lossy())?;
        }
    }
    Ok(sum)
}

/// The CPU time (user and system) in a `stat` file of /proc, in seconds.
fn stat_cpu_seconds(path: &str) -> Result<f64> {
    let s = std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))?;
    // Fields after the command (which may hold spaces) in parentheses.
    let rest = s.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15: 12 and 13 after the state.
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok((ticks(11) + ticks(12)) as f64 / hz)
}

fn raise_fd_limit() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: r is a valid rlimit for the call to fill and read.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// The whole run, on the benchmark's thread.
fn run_blocking(plan: Plan) -> Result<PeersReport> {
    raise_fd_limit();
    let mut lab = Lab::new()?;
    lab.enter()?;
    // The clients log only warnings (hundreds of sessions at INFO drown the report).
    let quiet = tracing::Dispatch::new(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_writer(std::io::stderr)
            .finish(),
    );
    let _quiet = tracing::dispatcher::set_default(&quiet);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .on_thread_start(move || std::mem::forget(tracing::dispatcher::set_default(&quiet)))
        .enable_all()
        .build()
        .context("cannot start the clients' runtime")?;
    let r = rt.block_on(measure(&mut lab, &plan));
    rt.shutdown_timeout(Duration::from_secs(2));
    r
}

/// The clients, started and established.
struct Clients {
    sessions: Vec<Session>,
    completed: usize,
    establish_s: f64,
}

/// Start every client at once; wait until each is established (or the timeout).
async fn establish(plan: &Plan, keys: &[[u8; 32]], server: [u8; 32]) -> Result<Clients> {
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for (i, k) in keys.iter().enumerate() {
        let mut s = Session::start(client_config(plan, *k, server)?)
            .await
            .with_context(|| format!("client {i}"))?;
        s.keep_trying_when_rejected();
        let timeout = plan.timeout.saturating_sub(start.elapsed());
        set.spawn(async move {
            let ok = s.wait_for_peer(timeout).await.is_ok();
            (i, s, ok.then(Instant::now))
        });
    }
    let mut sessions = Vec::with_capacity(keys.len());
    let mut last = start;
    let mut completed = 0;
    while let Some(r) = set.join_next().await {
        let (i, s, at) = r.context("a client's task failed")?;
        if let Some(at) = at {
            completed += 1;
            last = last.max(at);
        }
        sessions.push((i, s));
    }
    // Client i sends from its own inner address: in key order.
    sessions.sort_by_key(|(i, _)| *i);
    let sessions = sessions.into_iter().map(|(_, s)| s).collect();
    Ok(Clients {
        sessions,
        completed,
        establish_s: (last - start).as_secs_f64(),
    })
}

/// Set up, measure every phase, tear down.
async fn measure(lab: &mut Lab, plan: &Plan) -> Result<PeersReport> {
    // With a flood, one more peer: the client that connects during it.
    let n = plan.peers + usize::from(plan.flood.is_some());
    let keys: Vec<[u8; 32]> = (0..n)
        .map(|_| keys::generate().map_err(|e| anyhow!("no random key: {e}")))
        .collect::<Result<_>>()?;
    let server = start_server(lab, plan, &keys)?;
    server_up(lab).await?;
    let pid = lab.server_pid();
    let mut r = PeersReport {
        peers: plan.peers,
        channels: plan.channels,
        rss_start_bytes: rss_bytes(pid)?,
        ..PeersReport::default()
    };
    let cpu0 = cpu_seconds(pid)?;
    let hs0 = thread_cpu_seconds(pid, HANDSHAKE_THREAD)?;
    let me0 = cpu_seconds(std::process::id())?;
    let clients = establish(plan, &keys[..plan.peers], server).await?;
    r.establish_server_cpu_s = cpu_seconds(pid)? - cpu0;
    r.establish_handshake_cpu_s = thread_cpu_seconds(pid, HANDSHAKE_THREAD)? - hs0;
    r.establish_clients_cpu_s = cpu_seconds(std::process::id())? - me0;
    r.handshakes_per_handshake_cpu_s = per(clients.completed as f64, r.establish_handshake_cpu_s);
    r.handshakes_completed = clients.completed;
    r.establish_s = clients.establish_s;
    r.handshakes_per_s = per(clients.completed as f64, clients.establish_s);
    r.handshakes_per_cpu_s = per(clients.completed as f64, r.establish_server_cpu_s);
    tokio::time::sleep(SETTLE).await;
    let cpu1 = cpu_seconds(pid)?;
    tokio::time::sleep(SETTLE).await;
    r.idle_server_cpu = (cpu_seconds(pid)? - cpu1) / SETTLE.as_secs_f64();
    r.rss_bytes = rss_bytes(pid)?;
    r.rss_per_peer_bytes =
        r.rss_bytes.saturating_sub(r.rss_start_bytes) / (clients.completed.max(1) as u64);
    r.server_peers_connected = server_counters(lab).await?.peers_connected;
    let active = &clients.sessions[..plan.active];
    if !active.is_empty() {
        r.forwarding = forward(active, plan.duration, pid).await?;
        if let Some(rate) = plan.flood {
            let late = (keys[plan.peers], server);
            r.flood = Some(flooded(lab, active, plan, late, rate, &r.forwarding).await?);
        }
    }
    r.server = server_counters(lab).await?;
    for s in clients.sessions {
        drop(s);
    }
    Ok(r)
}

fn per(n: f64, secs: f64) -> f64 {
    if secs > 0.0 {
        n / secs
    } else {
        0.0
    }
}

/// An IPv4/UDP packet from client `i` to the socket behind the server's TUN device.
fn inner_packet(i: usize, payload: usize) -> Bytes {
    let b = etherparse::PacketBuilder::ipv4(client_inner(i).octets(), SERVER_INNER.octets(), 64)
        .udp(40000, SINK_PORT);
    let mut v = Vec::with_capacity(b.size(payload));
    b.write(&mut v, &vec![0x5a; payload])
        .expect("writing to a vector");
    Bytes::from(v)
}

/// The socket behind the server's TUN device (on its inner address), with a large
/// buffer.
fn sink_socket() -> Result<UdpSocket> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
    let _ = s.set_recv_buffer_size(16 << 20);
    s.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, SINK_PORT)).into())
        .context("the sink socket")?;
    s.set_read_timeout(Some(Duration::from_millis(50)))?;
    Ok(s.into())
}

/// Datagrams and bytes `sink` receives until `until`.
fn count(sink: &UdpSocket, until: Instant) -> (u64, u64) {
    let (mut packets, mut bytes) = (0u64, 0u64);
    let mut buf = vec![0u8; 65536];
    while Instant::now() < until {
        if let Ok(n) = sink.recv(&mut buf) {
            packets += 1;
            bytes += n as u64;
        }
    }
    (packets, bytes)
}

/// `sessions` send as fast as they are taken for `d`; what the sink behind the server's
/// TUN device received.
async fn forward(sessions: &[Session], d: Duration, pid: u32) -> Result<Forwarding> {
    let sink = sink_socket()?;
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let mut senders = Vec::new();
    for (i, s) in sessions.iter().enumerate() {
        let tx = s.sender();
        let payload = tx.max_message().min(1400).saturating_sub(28);
        let pkt = inner_packet(i, payload);
        let (stop, sent) = (stop.clone(), sent.clone());
        senders.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if tx.send(pkt.clone()).await.is_err() {
                    break;
                }
                sent.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let cpu0 = cpu_seconds(pid)?;
    let start = Instant::now();
    let counted = std::thread::spawn(move || count(&sink, start + d));
    tokio::time::sleep(d).await;
    let (packets, bytes) = counted
        .join()
        .map_err(|_| anyhow!("the sink's thread failed"))?;
    let seconds = start.elapsed().as_secs_f64();
    let server_cpu = (cpu_seconds(pid)? - cpu0) / seconds;
    stop.store(true, Ordering::Relaxed);
    for t in senders {
        let _ = t.await;
    }
    Ok(Forwarding {
        active: sessions.len(),
        seconds,
        sent_packets: sent.load(Ordering::Relaxed),
        received_packets: packets,
        received_bps: per(bytes as f64 * 8.0, seconds),
        server_cpu,
    })
}

/// Forwarding again, under a flood of forged initiations.
async fn flooded(
    lab: &Lab,
    sessions: &[Session],
    plan: &Plan,
    (late, server): ([u8; 32], [u8; 32]),
    rate: u64,
    calm: &Forwarding,
) -> Result<Flood> {
    let before = server_counters(lab).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let ports: Vec<u16> = (0..plan.channels).map(|c| BASE_PORT + c as u16).collect();
    let flooder = {
        let stop = stop.clone();
        // Started from this (namespaced) thread's runtime: inside the namespace too.
        std::thread::Builder::new()
            .name("braid-flood".into())
            .spawn(move || flood(server, &ports, rate, &stop))
            .context("cannot start the flood's thread")?
    };
    let start = Instant::now();
    let late = tokio::spawn(late_client(
        client_config(plan, late, server)?,
        plan.duration,
    ));
    let forwarding = forward(sessions, plan.duration, lab.server_pid()).await;
    stop.store(true, Ordering::Relaxed);
    let handshake_ms = late.await.ok().flatten();
    let sent = flooder
        .join()
        .map_err(|_| anyhow!("the flood's thread failed"))??;
    let seconds = start.elapsed().as_secs_f64();
    let forwarding = forwarding?;
    let after = server_counters(lab).await?;
    Ok(Flood {
        rate,
        sent,
        sent_per_s: per(sent as f64, seconds),
        ratio: per(forwarding.received_bps, calm.received_bps),
        forwarding,
        server_delta: delta(&before, &after),
        handshake_ms,
    })
}

/// A client started a moment into the flood: how long until it is established.
async fn late_client(cfg: SessionConfig, within: Duration) -> Option<f64> {
    tokio::time::sleep(Duration::from_millis(200)).await;
    let start = Instant::now();
    let mut s = Session::start(cfg).await.ok()?;
    s.keep_trying_when_rejected();
    let ok = s.wait_for_peer(within).await.is_ok();
    ok.then(|| start.elapsed().as_secs_f64() * 1000.0)
}

fn delta(a: &ServerCounters, b: &ServerCounters) -> ServerCounters {
    let d = |x: u64, y: u64| y.saturating_sub(x);
    ServerCounters {
        peers: b.peers,
        peers_connected: b.peers_connected,
        unknown_peer: d(a.unknown_peer, b.unknown_peer),
        unreadable_initiations: d(a.unreadable_initiations, b.unreadable_initiations),
        initiation_mac1_failures: d(a.initiation_mac1_failures, b.initiation_mac1_failures),
        initiations_shed: d(a.initiations_shed, b.initiations_shed),
        unknown_index: d(a.unknown_index, b.unknown_index),
        unroutable: d(a.unroutable, b.unroutable),
        no_route: d(a.no_route, b.no_route),
        source_not_allowed: d(a.source_not_allowed, b.source_not_allowed),
        not_ip: d(a.not_ip, b.not_ip),
        initiation_copies: d(a.initiation_copies, b.initiation_copies),
        cookie_replies: d(a.cookie_replies, b.cookie_replies),
        stale_cookies: d(a.stale_cookies, b.stale_cookies),
        initiations_rate_limited: d(a.initiations_rate_limited, b.initiations_rate_limited),
        oversized: d(a.oversized, b.oversized),
        ..b.clone()
    }
}

/// The bytes of a forged initiation to the holder of `public`: the right type, version,
/// key kind and length, random bytes for the Noise message, and a valid mac1 (anyone
/// can make one: the key is public) — it passes the cheap check and fails only when
/// read with the private key.
pub fn forged_initiation(public: &[u8; 32], random: &[u8]) -> Vec<u8> {
    use blake2::digest::{consts::U16, Mac};
    use blake2::Digest;
    let mut v = vec![braid_proto::wire::TYPE_HS_INIT, 2, 1, 0];
    v.extend_from_slice(&random[..4.min(random.len())]);
    v.resize(INIT_LEN_STATIC - 32, 0);
    for (i, b) in v[8..].iter_mut().enumerate() {
        *b = random
            .get((4 + i) % random.len().max(1))
            .copied()
            .unwrap_or(i as u8);
    }
    let key: [u8; 32] = blake2::Blake2s256::new()
        .chain_update(b"braid mac1 v2")
        .chain_update(public)
        .finalize()
        .into();
    let mut m = <blake2::Blake2sMac<U16> as blake2::digest::KeyInit>::new_from_slice(&key)
        .expect("a 32-byte key");
    m.update(&v);
    v.extend_from_slice(&m.finalize().into_bytes());
    v.extend_from_slice(&[0; 16]);
    v
}

/// An initiation with static keys, in bytes (`docs/wire.md`).
const INIT_LEN_STATIC: usize = 192;
/// Forged sources: this many sockets on random loopback addresses.
const FLOOD_SOURCES: usize = 64;

/// Send forged initiations at `rate` per second until `stop`, each from one of many
/// loopback addresses, to the ports in turn; how many were sent.
fn flood(public: [u8; 32], ports: &[u16], rate: u64, stop: &AtomicBool) -> Result<u64> {
    let mut seed = [0u8; 64];
    getrandom::fill(&mut seed).map_err(|e| anyhow!("no random bytes: {e}"))?;
    let mut socks = Vec::new();
    for i in 0..FLOOD_SOURCES {
        let a = Ipv4Addr::new(
            127,
            100 + seed[i % 64] % 100,
            seed[(i + 7) % 64],
            2 + i as u8,
        );
        socks.push(UdpSocket::bind((a, 0)).with_context(|| format!("flood source {a}"))?);
    }
    // Distinct datagrams: a counter in the random bytes of each.
    let start = Instant::now();
    let mut sent = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        if sent >= due {
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        for _ in 0..(due - sent).min(256) {
            seed[..8].copy_from_slice(&sent.to_le_bytes());
            let d = forged_initiation(&public, &seed);
            let s = &socks[sent as usize % socks.len()];
            let port = ports[(sent as usize / socks.len()) % ports.len()];
            let _ = s.send_to(&d, (Ipv4Addr::LOCALHOST, port));
            sent += 1;
        }
    }
    Ok(sent)
}

/// The report as a table, or JSON.
pub fn render(r: &PeersReport, json: bool) -> String {
    if json {
        return serde_json::to_string_pretty(r).unwrap_or_default() + "\n";
    }
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let mut s = format!(
        "peers {} x {} channels: {} established in {:.2} s: {:.0} handshakes/s ({:.0} per server CPU-second, {:.2} s of CPU; {:.0} per CPU-second of its handshake thread, {:.2} s; the clients used {:.2} s)\n",
        r.peers, r.channels, r.handshakes_completed, r.establish_s, r.handshakes_per_s,
        r.handshakes_per_cpu_s, r.establish_server_cpu_s, r.handshakes_per_handshake_cpu_s,
        r.establish_handshake_cpu_s, r.establish_clients_cpu_s
    );
    s += &format!(
        "server: {} peers connected; resident {:.1} MiB ({:.1} MiB before any client, {:.1} KiB per peer); idle CPU {:.2} cores\n",
        r.server_peers_connected, mib(r.rss_bytes), mib(r.rss_start_bytes),
        r.rss_per_peer_bytes as f64 / 1024.0, r.idle_server_cpu
    );
    let fwd = |f: &Forwarding| {
        format!(
            "{} active for {:.1} s: sent {} received {} packets, {:.1} Mbit/s, server CPU {:.2} cores",
            f.active, f.seconds, f.sent_packets, f.received_packets, f.received_bps / 1e6, f.server_cpu
        )
    };
    s += &format!("forwarding: {}\n", fwd(&r.forwarding));
    if let Some(f) = &r.flood {
        s += &format!(
            "flood of {} forged initiations/s (reached {:.0}/s, {} sent): {}; ratio {:.3}\n",
            f.rate,
            f.sent_per_s,
            f.sent,
            fwd(&f.forwarding),
            f.ratio
        );
        let d = &f.server_delta;
        s += &format!(
            "  server meanwhile: unreadable_initiations {} (public-key work on forgeries) initiations_shed {} cookie_replies {} rate-limited {}\n",
            d.unreadable_initiations, d.initiations_shed, d.cookie_replies, d.initiations_rate_limited
        );
        match f.handshake_ms {
            Some(ms) => s += &format!("  a new client meanwhile: established in {ms:.0} ms\n"),
            None => s += "  a new client meanwhile: NOT established\n",
        }
    }
    s
}
