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
//!   connected (after a settling pause of 2 s, while their capacity probes still run),
//!   and its CPU then; the same again once they have idled (12 s after the last
//!   handshake: no data for `idle_after`, the probes done, freed memory given back);
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
    /// What the flood aims at: `server` (forged initiations from many forged loopback
    /// addresses at the server's ports) or `peer` (at the first client's channels:
    /// forged sealed datagrams carrying its key index, and forged initiations, both
    /// from its own addresses).
    #[arg(long, default_value = "server", value_name = "server|peer")]
    pub flood_at: String,
    /// The active clients' offered rate in all (e.g. 100M, bits per second of UDP
    /// payload), paced; unset: as fast as their sessions take packets. With a rate the
    /// machine carries, a flood's ratio says what the flood cost the server rather than
    /// what the flood's sender took from the clients' CPU.
    #[arg(long)]
    pub rate: Option<String>,
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
    /// Of which from the first client (the one `--flood-at peer` aims at).
    pub first_sent_packets: u64,
    /// Data packets the first client's session put on its channels (its own count):
    /// what it sent that the sink did not receive was lost past the client.
    pub first_wire_packets: u64,
    /// Inner packets from the first client received.
    pub first_received_packets: u64,
    /// The first client's UDP payload bytes received per second, in bits.
    pub first_received_bps: f64,
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
    /// What it aimed at: `server` or `peer` (the first client).
    pub at: String,
    /// The first client's throughput over its own without a flood.
    pub first_ratio: f64,
    /// UDP datagrams the namespace's kernel dropped meanwhile because a socket's receive
    /// buffer was full (`RcvbufErrors` of /proc/net/snmp): the server's channel sockets,
    /// when it does not read as fast as the flood and the clients' traffic arrive.
    pub udp_rcvbuf_errors: u64,
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
    /// The server's CPU 2-4 s after the last handshake (every client idle, their
    /// capacity probes still running), in cores.
    pub idle_server_cpu: f64,
    /// The server's resident set once the clients have idled ([`SETTLED`] after the
    /// last handshake).
    #[serde(default)]
    pub rss_settled_bytes: u64,
    /// The server's CPU over the 2 s that follow, in cores (hellos at the idle
    /// heartbeat).
    #[serde(default)]
    pub settled_server_cpu: f64,
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
/// When the settled figures are read, after the last handshake: the sessions idle
/// after 2 s without data, their capacity probes are over, and a server gives back
/// the memory its sessions' first seconds freed within 10 s of the last start.
const SETTLED: Duration = Duration::from_secs(12);

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
    flood_at_peer: bool,
    rate: Option<u64>,
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
        let flood_at_peer = match self.flood_at.as_str() {
            "server" => false,
            "peer" => true,
            o => bail!("--flood-at {o}: give server or peer"),
        };
        if flood_at_peer && self.active == 0 {
            bail!("--flood-at peer: the first client must send (give --active 1 or more)");
        }
        let rate = match &self.rate {
            Some(r) => match braid_proto::units::parse_rate(r) {
                Ok(0) | Err(_) => bail!("--rate {r}: give a rate such as 100M (bits per second)"),
                Ok(v) => Some(v),
            },
            None => None,
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
            flood_at_peer,
            rate,
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
    // Ctrl-C or SIGTERM ends the run: the measurement is dropped, then the lab (its
    // server stopped, its namespace deleted), as on any other exit.
    let r = rt.block_on(async {
        tokio::select! {
            r = measure(&mut lab, &plan) => r,
            s = stop_signal() => Err(anyhow!("{s}: the server was stopped and the namespace deleted")),
        }
    });
    rt.shutdown_timeout(Duration::from_secs(2));
    r
}

/// The first SIGINT or SIGTERM to arrive, by name.
async fn stop_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut int), Ok(mut term)) => tokio::select! {
            _ = int.recv() => "interrupted",
            _ = term.recv() => "terminated",
        },
        // No handler: the default (the process ends) stands.
        _ => std::future::pending().await,
    }
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
    let established = std::time::Instant::now();
    tokio::time::sleep(SETTLE).await;
    let cpu1 = cpu_seconds(pid)?;
    tokio::time::sleep(SETTLE).await;
    r.idle_server_cpu = (cpu_seconds(pid)? - cpu1) / SETTLE.as_secs_f64();
    r.rss_bytes = rss_bytes(pid)?;
    tokio::time::sleep(SETTLED.saturating_sub(established.elapsed())).await;
    r.rss_settled_bytes = rss_bytes(pid)?;
    let cpu2 = cpu_seconds(pid)?;
    tokio::time::sleep(SETTLE).await;
    r.settled_server_cpu = (cpu_seconds(pid)? - cpu2) / SETTLE.as_secs_f64();
    r.rss_per_peer_bytes =
        r.rss_bytes.saturating_sub(r.rss_start_bytes) / (clients.completed.max(1) as u64);
    r.server_peers_connected = server_counters(lab).await?.peers_connected;
    let active = &clients.sessions[..plan.active];
    if !active.is_empty() {
        r.forwarding = forward(active, plan.duration, pid, plan.rate).await?;
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

/// Datagrams and bytes `sink` receives until `until`: in all, and from the first
/// client.
fn count(sink: &UdpSocket, until: Instant) -> [(u64, u64); 2] {
    let (mut all, mut first) = ((0u64, 0u64), (0u64, 0u64));
    let mut buf = vec![0u8; 65536];
    let first_ip = std::net::IpAddr::V4(client_inner(0));
    while Instant::now() < until {
        if let Ok((n, from)) = sink.recv_from(&mut buf) {
            all.0 += 1;
            all.1 += n as u64;
            if from.ip() == first_ip {
                first.0 += 1;
                first.1 += n as u64;
            }
        }
    }
    [all, first]
}

/// `sessions` send for `d`, as fast as they are taken or each at its share of `rate`
/// (bits per second of UDP payload); what the sink behind the server's TUN device
/// received.
async fn forward(
    sessions: &[Session],
    d: Duration,
    pid: u32,
    rate: Option<u64>,
) -> Result<Forwarding> {
    let sink = sink_socket()?;
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let first_sent = Arc::new(AtomicU64::new(0));
    let mut senders = Vec::new();
    let start = Instant::now();
    for (i, s) in sessions.iter().enumerate() {
        let tx = s.sender();
        let payload = tx.max_message().min(1400).saturating_sub(28);
        let pkt = inner_packet(i, payload);
        // Packets per second of this sender (None: unpaced).
        let pps = rate.map(|r| r as f64 / 8.0 / payload.max(1) as f64 / sessions.len() as f64);
        let (stop, sent) = (stop.clone(), sent.clone());
        let first_sent = (i == 0).then(|| first_sent.clone());
        senders.push(tokio::spawn(async move {
            let mut mine = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if let Some(pps) = pps {
                    let due = (start.elapsed().as_secs_f64() * pps) as u64;
                    if mine >= due {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                }
                if tx.send(pkt.clone()).await.is_err() {
                    break;
                }
                mine += 1;
                sent.fetch_add(1, Ordering::Relaxed);
                if let Some(f) = &first_sent {
                    f.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let wire = |st: Option<crate::stats::SessionStats>| {
        st.map_or(0, |st| {
            st.channels.iter().map(|c| c.tx_data_packets).sum::<u64>()
        })
    };
    let wire0 = wire(sessions[0].stats().await.ok());
    let cpu0 = cpu_seconds(pid)?;
    let counted = std::thread::spawn(move || count(&sink, start + d));
    tokio::time::sleep(d.saturating_sub(start.elapsed())).await;
    let [(packets, bytes), (first_packets, first_bytes)] = counted
        .join()
        .map_err(|_| anyhow!("the sink's thread failed"))?;
    let seconds = start.elapsed().as_secs_f64();
    let server_cpu = (cpu_seconds(pid)? - cpu0) / seconds;
    let first_wire_packets = wire(sessions[0].stats().await.ok()).saturating_sub(wire0);
    stop.store(true, Ordering::Relaxed);
    for t in senders {
        let _ = t.await;
    }
    Ok(Forwarding {
        first_wire_packets,
        active: sessions.len(),
        seconds,
        sent_packets: sent.load(Ordering::Relaxed),
        received_packets: packets,
        received_bps: per(bytes as f64 * 8.0, seconds),
        first_sent_packets: first_sent.load(Ordering::Relaxed),
        first_received_packets: first_packets,
        first_received_bps: per(first_bytes as f64 * 8.0, seconds),
        server_cpu,
    })
}

/// Forwarding again, under a flood: of forged initiations at the server's ports, or
/// aimed at the first client's channels.
async fn flooded(
    lab: &Lab,
    sessions: &[Session],
    plan: &Plan,
    (late, server): ([u8; 32], [u8; 32]),
    rate: u64,
    calm: &Forwarding,
) -> Result<Flood> {
    let ports: Vec<u16> = (0..plan.channels).map(|c| BASE_PORT + c as u16).collect();
    let packets = if plan.flood_at_peer {
        let target = &sessions[0];
        let locals: Vec<u16> = target.local_addrs().iter().map(|a| a.port()).collect();
        let index = tokio::task::spawn_blocking(move || {
            captured_index(&locals, Duration::from_secs(5)).map(|i| (i, locals))
        })
        .await
        .map_err(|_| anyhow!("the capture's task failed"))??;
        aimed_at_peer(server, index.0, &index.1, &ports)?
    } else {
        at_server(server, &ports)?
    };
    let before = server_counters(lab).await?;
    let drops0 = udp_rcvbuf_errors()?;
    let stop = Arc::new(AtomicBool::new(false));
    let flooder = {
        let stop = stop.clone();
        // Started from this (namespaced) thread's runtime: inside the namespace too.
        std::thread::Builder::new()
            .name("braid-flood".into())
            .spawn(move || flood(&packets, rate, &stop))
            .context("cannot start the flood's thread")?
    };
    let start = Instant::now();
    let late = tokio::spawn(late_client(
        client_config(plan, late, server)?,
        plan.duration,
    ));
    let forwarding = forward(sessions, plan.duration, lab.server_pid(), plan.rate).await;
    stop.store(true, Ordering::Relaxed);
    let handshake_ms = late.await.ok().flatten();
    let sent = flooder
        .join()
        .map_err(|_| anyhow!("the flood's thread failed"))??;
    let seconds = start.elapsed().as_secs_f64();
    let forwarding = forwarding?;
    let after = server_counters(lab).await?;
    let udp_rcvbuf_errors = udp_rcvbuf_errors()?.saturating_sub(drops0);
    Ok(Flood {
        udp_rcvbuf_errors,
        rate,
        sent,
        sent_per_s: per(sent as f64, seconds),
        ratio: per(forwarding.received_bps, calm.received_bps),
        at: if plan.flood_at_peer { "peer" } else { "server" }.into(),
        first_ratio: per(forwarding.first_received_bps, calm.first_received_bps),
        forwarding,
        server_delta: delta(&before, &after),
        handshake_ms,
    })
}

/// `RcvbufErrors` of UDP in this thread's network namespace.
fn udp_rcvbuf_errors() -> Result<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/net/snmp")
        .context("cannot read /proc/thread-self/net/snmp")?;
    let mut udp = s.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(names), Some(values)) = (udp.next(), udp.next()) else {
        bail!("no Udp lines in /proc/net/snmp");
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "RcvbufErrors")
        .and_then(|(_, v)| v.parse().ok())
        .ok_or_else(|| anyhow!("no Udp RcvbufErrors in /proc/net/snmp"))
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
        implausible: d(a.implausible, b.implausible),
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
    let mut v = vec![
        braid_proto::wire::TYPE_HS_INIT,
        braid_proto::wire::secure::HS_VERSION,
        1,
        0,
    ];
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
/// Distinct forged datagrams a flood cycles through.
const FLOOD_POOL: usize = 4096;
/// Datagrams per sendmmsg call.
const FLOOD_BATCH: usize = 64;

/// A flood's datagrams: whole IPv4/UDP packets (forged sources), for a raw socket.
struct FloodPackets(Vec<Vec<u8>>);

fn random_bytes(n: usize) -> Result<Vec<u8>> {
    let mut v = vec![0u8; n];
    getrandom::fill(&mut v).map_err(|e| anyhow!("no random bytes: {e}"))?;
    Ok(v)
}

fn udp_packet(from: (Ipv4Addr, u16), to_port: u16, payload: &[u8]) -> Vec<u8> {
    let b = etherparse::PacketBuilder::ipv4(from.0.octets(), Ipv4Addr::LOCALHOST.octets(), 64)
        .udp(from.1, to_port);
    let mut v = Vec::with_capacity(b.size(payload.len()));
    b.write(&mut v, payload).expect("writing to a vector");
    v
}

/// Forged initiations with a valid mac1, from many forged loopback addresses, to the
/// server's ports in turn.
fn at_server(public: [u8; 32], ports: &[u16]) -> Result<FloodPackets> {
    let r = random_bytes(FLOOD_POOL * 8 + 64)?;
    let mut v = Vec::with_capacity(FLOOD_POOL);
    for i in 0..FLOOD_POOL {
        let x = &r[i * 8..i * 8 + 8];
        let from = Ipv4Addr::new(127, 100 + x[0] % 100, x[1], x[2].max(2));
        let port = 1024 + u16::from_le_bytes([x[3], x[4]]) % 60000;
        let d = forged_initiation(&public, &r[i * 8..i * 8 + 64]);
        v.push(udp_packet((from, port), ports[i % ports.len()], &d));
    }
    Ok(FloodPackets(v))
}

/// Aimed at one established peer, from its own addresses (`locals`, one per channel)
/// to the server's port of the same channel: forged sealed datagrams carrying its key
/// index `index` (random counters and bodies: they fail authentication), and forged
/// initiations with a valid mac1 (which only the peer's key could make read).
fn aimed_at_peer(
    public: [u8; 32],
    index: u32,
    locals: &[u16],
    ports: &[u16],
) -> Result<FloodPackets> {
    let mut v = Vec::with_capacity(FLOOD_POOL);
    for i in 0..FLOOD_POOL {
        let c = i % ports.len().min(locals.len());
        let from = (Ipv4Addr::LOCALHOST, locals[c]);
        let r = random_bytes(1200)?;
        let d = if i % 2 == 0 {
            // Any of the envelope's 32 bits: one in 256 lands in the plausible range.
            let counter = u32::from_le_bytes(r[..4].try_into().expect("4 bytes"));
            let h = braid_proto::wire::secure::Header {
                encrypted: true,
                index,
                counter,
                lane: braid_proto::wire::secure::LANE_MAIN,
            };
            let mut d = h.to_bytes().to_vec();
            d.extend_from_slice(&r[8..]);
            d
        } else {
            forged_initiation(&public, &r[..64])
        };
        v.push(udp_packet(from, ports[c], &d));
    }
    Ok(FloodPackets(v))
}

/// The key index the server gave the client whose channels use the ports `locals`: read
/// off a sealed datagram it sends (as anyone who sees its traffic could), with a packet
/// socket in the namespace. Within `within`.
fn captured_index(locals: &[u16], within: Duration) -> Result<u32> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let proto = (libc::ETH_P_IP as u16).to_be() as i32;
    // SAFETY: socket has no memory preconditions; the descriptor is owned below.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM, proto) };
    if fd < 0 {
        bail!(
            "cannot open a packet socket (to read the first client's key index): {}",
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: fd is a new descriptor of ours.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 100_000,
    };
    // SAFETY: tv is a valid timeval for the length given.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    let deadline = Instant::now() + within;
    let mut buf = vec![0u8; 65536];
    while Instant::now() < deadline {
        // SAFETY: buf is valid for writes of its length.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        let Ok(n) = usize::try_from(n) else { continue };
        let Ok(p) = etherparse::SlicedPacket::from_ip(&buf[..n]) else {
            continue;
        };
        let Some(etherparse::TransportSlice::Udp(u)) = p.transport else {
            continue;
        };
        let d = u.payload();
        if locals.contains(&u.source_port())
            && (BASE_PORT..BASE_PORT + 8).contains(&u.destination_port())
            && d.first() == Some(&braid_proto::wire::TYPE_SEALED)
        {
            if let Some(i) = braid_proto::session::receiver_index(d) {
                return Ok(i);
            }
        }
    }
    bail!("no sealed datagram from the first client within {within:?}")
}

/// Send `packets` in turn at `rate` per second until `stop`, through a raw socket
/// (their forged sources as they are), in batches of one sendmmsg call each: how many
/// were sent. The thread's own cost is the kernel's, not the forging's (made before).
fn flood(packets: &FloodPackets, rate: u64, stop: &AtomicBool) -> Result<u64> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: socket has no memory preconditions; the descriptor is owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
    if fd < 0 {
        bail!(
            "cannot open a raw socket for the flood: {}",
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: fd is a new descriptor of ours.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let to = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(Ipv4Addr::LOCALHOST).to_be(),
        },
        sin_zero: [0; 8],
    };
    let start = Instant::now();
    let mut sent = 0u64;
    let pool = &packets.0;
    while !stop.load(Ordering::Relaxed) {
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        if sent >= due {
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        let n = ((due - sent) as usize).min(FLOOD_BATCH);
        let mut iov: Vec<libc::iovec> = (0..n)
            .map(|k| {
                let p = &pool[(sent as usize + k) % pool.len()];
                libc::iovec {
                    iov_base: p.as_ptr() as *mut libc::c_void,
                    iov_len: p.len(),
                }
            })
            .collect();
        let mut msgs: Vec<libc::mmsghdr> = iov
            .iter_mut()
            .map(|v| {
                // SAFETY: an all-zero msghdr is valid; the fields set point into
                // `iov` and `to`, which outlive the call.
                let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
                h.msg_name = (&to as *const libc::sockaddr_in as *mut libc::sockaddr_in).cast();
                h.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
                h.msg_iov = v;
                h.msg_iovlen = 1;
                libc::mmsghdr {
                    msg_hdr: h,
                    msg_len: 0,
                }
            })
            .collect();
        // SAFETY: msgs holds n valid headers whose buffers live until the call returns.
        let r = unsafe { libc::sendmmsg(sock.as_raw_fd(), msgs.as_mut_ptr(), n as u32, 0) };
        // A full socket buffer drops the rest of the batch: counted as sent (a flood
        // does not wait), as the datagrams a loaded link loses.
        let _ = r;
        sent += n as u64;
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
    s += &format!(
        "settled ({} s after the last handshake, the peers idle): resident {:.1} MiB; CPU {:.2} cores\n",
        SETTLED.as_secs(),
        mib(r.rss_settled_bytes),
        r.settled_server_cpu
    );
    let fwd = |f: &Forwarding| {
        format!(
            "{} active for {:.1} s: sent {} received {} packets, {:.1} Mbit/s, server CPU {:.2} cores",
            f.active, f.seconds, f.sent_packets, f.received_packets, f.received_bps / 1e6, f.server_cpu
        )
    };
    s += &format!("forwarding: {}\n", fwd(&r.forwarding));
    if let Some(f) = &r.flood {
        let what = if f.at == "peer" {
            "forged datagrams/s at the first client's channels (sealed with its key index, and initiations)"
        } else {
            "forged initiations/s at the server's ports"
        };
        s += &format!(
            "flood of {} {what} (reached {:.0}/s, {} sent): {}; ratio {:.3} (the first client's {:.3})\n",
            f.rate,
            f.sent_per_s,
            f.sent,
            fwd(&f.forwarding),
            f.ratio,
            f.first_ratio
        );
        let d = &f.server_delta;
        s += &format!(
            "  server meanwhile: unreadable_initiations {} (public-key work on forgeries) initiations_shed {} cookie_replies {} rate-limited {}; UDP receive-buffer drops {}\n",
            d.unreadable_initiations, d.initiations_shed, d.cookie_replies, d.initiations_rate_limited,
            f.udp_rcvbuf_errors
        );
        match f.handshake_ms {
            Some(ms) => s += &format!("  a new client meanwhile: established in {ms:.0} ms\n"),
            None => s += "  a new client meanwhile: NOT established\n",
        }
    }
    s
}
