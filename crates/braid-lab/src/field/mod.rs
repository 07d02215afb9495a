//! `braid lab field`: a field deployment in network namespaces, run by the real
//! `braid tunnel` server and clients ([`net`] has the map). One server with a public
//! address of each family serves three clients; each client bonds an IPv4 uplink
//! behind NAT (client 3's behind two: its own router and a carrier's) and an IPv6-only
//! uplink, each channel bound to its uplink (`device` and `local`).
//!
//! While traffic runs through every client's tunnel ([`traffic`]: probes each way
//! every 10 ms, and a checked, resumable TCP block stream from each client), events
//! come at fixed shares of `--duration`:
//!
//! | at | event | client |
//! |---|---|---|
//! | 15 % | `nat_rebind`: the NAT's outside address changes (its mappings go with it) | van |
//! | 30 % | `uplink_down`: the IPv6 uplink's interface goes down (address and routes gone) | home |
//! | 40 % | `uplink_up`: it comes back (up, address and route configured again) | home |
//! | 55 % | `client_restart`: the client's braid is killed (SIGKILL) and started again | cgn |
//! | 70 % | `server_restart`: the server's braid is stopped (SIGTERM; SIGKILL with `crash_server`) and started again | every client |
//!
//! For each, `recovered_ms` is the time until traffic through the client flowed again,
//! read from the probes ([`recovery`]); for `uplink_up` also until the returned
//! uplink's channel was up at both ends and carried the client's data again (the later
//! of the two). After `--duration` the block streams close; the run waits (at most
//! [`GRACE`]) for every event to recover and every stream to arrive whole.
//!
//! Everything is named with the `field-` prefix; [`down`] removes it, also after a
//! crash, and a Ctrl-C during a run removes it before exit.

pub mod net;
pub mod recovery;
pub mod traffic;
pub mod tunnels;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::tools::{self, Tool};
use crate::topo::LabError;
use net::{CLIENTS, NAMES, NS_SERVER};
use traffic::{Errors, ProbeEnd, Probes, Stream, Threads};
use tunnels::Tunnel;

/// How long after `--duration` the run waits at most for recoveries and streams.
pub const GRACE: Duration = Duration::from_secs(30);

/// What the field lab runs besides `ip`.
pub const TOOLS: &[Tool] = &[
    Tool {
        cmd: "ip",
        package: "iproute2",
    },
    Tool {
        cmd: "iptables",
        package: "iptables",
    },
    Tool {
        cmd: "ip6tables",
        package: "iptables",
    },
];

/// Options of one run.
#[derive(Clone, Debug)]
pub struct FieldOptions {
    /// Length of the run (events at fixed shares of it).
    pub duration: Duration,
    /// Each client's block stream, bytes a second.
    pub stream_rate: u64,
    /// The `braid` binary.
    pub exe: PathBuf,
    /// Stop the server with SIGKILL (a crash: it tells no client) instead of SIGTERM.
    pub crash_server: bool,
    /// Copy the tunnels' logs here at the end (every exit).
    pub logs: Option<PathBuf>,
}

/// One event and how long traffic took to flow again.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldEvent {
    /// `nat_rebind`, `uplink_down`, `uplink_up`, `client_restart`, `server_restart`.
    pub what: String,
    /// The client it concerned.
    pub client: String,
    /// When, seconds from the start of the traffic.
    pub at_s: f64,
    /// Until traffic flowed again; `None`: it did not within the run.
    pub recovered_ms: Option<f64>,
}

/// One client's transfer.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldClient {
    /// The client's name.
    pub name: String,
    /// Bytes of the block stream the client sent.
    pub sent_bytes: u64,
    /// Bytes of it the server received, in order, each block checked.
    pub received_bytes: u64,
    /// Every block and probe that arrived was intact and the stream arrived whole.
    pub checksum_ok: bool,
    /// TCP connections the stream took (1 when none broke).
    pub connections: u64,
    /// Probes sent, both ways.
    pub probes_sent: u64,
    /// Probes received, both ways.
    pub probes_received: u64,
}

/// The result of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldResult {
    /// The run's length.
    pub duration_s: f64,
    /// The events, in order.
    pub events: Vec<FieldEvent>,
    /// The clients.
    pub clients: Vec<FieldClient>,
}

impl FieldResult {
    /// As JSON.
    pub fn to_json(&self) -> Value {
        let events: Vec<Value> = self
            .events
            .iter()
            .map(|e| {
                // To the ms and 0.1 ms: finer is noise.
                let at_s = (e.at_s * 1e3).round() / 1e3;
                let ms = e.recovered_ms.map(|m| (m * 10.0).round() / 10.0);
                json!({"what": e.what, "client": e.client, "at_s": at_s, "recovered_ms": ms})
            })
            .collect();
        let clients: Vec<Value> = self
            .clients
            .iter()
            .map(|c| {
                json!({"name": c.name, "sent_bytes": c.sent_bytes, "received_bytes": c.received_bytes,
                       "checksum_ok": c.checksum_ok, "connections": c.connections,
                       "probes_sent": c.probes_sent, "probes_received": c.probes_received})
            })
            .collect();
        json!({"duration_s": self.duration_s, "events": events, "clients": clients})
    }

    /// A table for people.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{:<16} {:<7} {:>7} {:>13}\n",
            "event", "client", "at", "recovered"
        );
        for e in &self.events {
            let r = e
                .recovered_ms
                .map_or("never".into(), |m| format!("{m:.0} ms"));
            s += &format!(
                "{:<16} {:<7} {:>6.1}s {:>13}\n",
                e.what, e.client, e.at_s, r
            );
        }
        s += &format!(
            "\n{:<7} {:>12} {:>12} {:>10} {:>6} {:>16}\n",
            "client", "sent", "received", "checksums", "conns", "probes rx/tx"
        );
        for c in &self.clients {
            s += &format!(
                "{:<7} {:>10} B {:>10} B {:>10} {:>6} {:>16}\n",
                c.name,
                c.sent_bytes,
                c.received_bytes,
                if c.checksum_ok { "match" } else { "MISMATCH" },
                c.connections,
                format!("{}/{}", c.probes_received, c.probes_sent)
            );
        }
        s
    }
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

fn lab_err(reason: impl Into<String>) -> LabError {
    LabError::Command {
        cmd: "braid lab field".into(),
        reason: reason.into(),
    }
}

fn sleep(d: Duration) -> Result<(), LabError> {
    let end = Instant::now() + d;
    loop {
        if INTERRUPTED.load(Ordering::Relaxed) {
            return Err(lab_err("interrupted; the lab was removed"));
        }
        let now = Instant::now();
        if now >= end {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10).min(end - now));
    }
}

/// Where the field lab keeps its keys, configurations and logs.
pub fn state_dir() -> PathBuf {
    PathBuf::from("/run/braid-lab-field")
}

/// Remove everything the field lab created; safe to run at any time.
pub fn down() -> Result<Vec<String>, LabError> {
    let removed = net::down()?;
    let _ = std::fs::remove_dir_all(state_dir());
    Ok(removed)
}

/// Removes the lab when dropped (errors, panics, Ctrl-C).
struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = down();
    }
}

/// Copies the tunnels' logs (`t0.log` the server's, `t<k>.log` client k's) to a
/// directory when dropped, before [`Cleanup`] removes them.
struct KeepLogs(Option<PathBuf>);

impl Drop for KeepLogs {
    fn drop(&mut self) {
        let Some(to) = &self.0 else { return };
        let _ = std::fs::create_dir_all(to);
        for k in 0..=CLIENTS {
            let f = format!("t{k}.log");
            let _ = std::fs::copy(state_dir().join(&f), to.join(&f));
        }
    }
}

/// Root, the tools, no field lab up.
fn preflight() -> Result<(), LabError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(LabError::NotRoot);
    }
    if let Some(why) = tools::missing(TOOLS) {
        return Err(LabError::MissingTools(why));
    }
    if !Path::new("/dev/net/tun").exists() {
        return Err(lab_err("/dev/net/tun does not exist (modprobe tun)"));
    }
    if let Some(n) = net::existing_namespaces().first() {
        return Err(LabError::AlreadyUp(n.clone()));
    }
    Ok(())
}

/// Everything running: the tunnels, the traffic and what it records.
struct Running {
    opt: FieldOptions,
    dir: PathBuf,
    server: Tunnel,
    clients: Vec<Tunnel>,
    threads: Threads,
    errors: Errors,
    t0: Instant,
    /// Per client: probes client to server, server to client.
    probes: Vec<[Arc<Mutex<Probes>>; 2]>,
    streams: Vec<Arc<Mutex<Stream>>>,
    close: Arc<AtomicBool>,
    events: Vec<(FieldEvent, u64, Option<f64>)>,
}

/// Build the lab, run the traffic and the events, remove the lab. `progress` receives
/// one line per step.
pub fn run(opt: &FieldOptions, mut progress: impl FnMut(&str)) -> Result<FieldResult, LabError> {
    preflight()?;
    INTERRUPTED.store(false, Ordering::Relaxed);
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let _cleanup = Cleanup;
    let _logs = KeepLogs(opt.logs.clone());
    progress("building namespaces field-* (a server, three clients, their NATs and uplinks)");
    net::build()?;
    let dir = state_dir();
    std::fs::create_dir_all(&dir).map_err(|err| LabError::Io {
        path: dir.display().to_string(),
        err,
    })?;
    tunnels::write_configs(&dir)?;
    let mut r = start(opt, dir)?;
    progress("tunnels up, traffic flowing; events follow");
    let result = r.events_and_end(&mut progress);
    r.threads.stop();
    result
}

/// Start the server and the clients, wait for each client to be connected, start the
/// traffic and wait until it flows through every client.
fn start(opt: &FieldOptions, dir: PathBuf) -> Result<Running, LabError> {
    let server = Tunnel::start(&opt.exe, &dir, 0)?;
    let mut clients = Vec::new();
    for k in 1..=CLIENTS {
        clients.push(Tunnel::start(&opt.exe, &dir, k)?);
    }
    let mut r = Running {
        opt: opt.clone(),
        dir,
        server,
        clients,
        threads: Threads::default(),
        errors: Errors::default(),
        t0: Instant::now(),
        probes: Vec::new(),
        streams: Vec::new(),
        close: Arc::new(AtomicBool::new(false)),
        events: Vec::new(),
    };
    r.wait_connected()?;
    r.start_traffic();
    r.wait_flowing()?;
    Ok(r)
}

fn addr(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().expect("a literal address"), port)
}

impl Running {
    /// Every client's tunnel has heard the server (15 s at most).
    fn wait_connected(&mut self) -> Result<(), LabError> {
        let deadline = Instant::now() + Duration::from_secs(15);
        for k in 1..=CLIENTS {
            loop {
                self.check_alive()?;
                let ctl = tunnels::control(&self.dir, k);
                if tunnels::status(&self.opt.exe, &ctl).is_some_and(|s| s["peer_seen"] == true) {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(lab_err(format!(
                        "client {} did not reach the server within 15 s; its log:\n{}\nthe server's:\n{}",
                        NAMES[k - 1],
                        tunnels::log_tail(&self.dir, k),
                        tunnels::log_tail(&self.dir, 0)
                    )));
                }
                sleep(Duration::from_millis(50))?;
            }
        }
        Ok(())
    }

    /// Has a tunnel exited on its own? An error with its log.
    fn check_alive(&mut self) -> Result<(), LabError> {
        let dead = std::iter::once(&mut self.server)
            .chain(self.clients.iter_mut())
            .find_map(|t| t.exited().then(|| t.index()));
        match dead {
            Some(k) => Err(lab_err(format!(
                "the {} tunnel exited; its log:\n{}",
                if k == 0 {
                    "server's".to_string()
                } else {
                    format!("client {}'s", NAMES[k - 1])
                },
                tunnels::log_tail(&self.dir, k)
            ))),
            None => Ok(()),
        }
    }

    /// Probes both ways and a block stream for every client.
    fn start_traffic(&mut self) {
        self.t0 = Instant::now();
        for k in 1..=CLIENTS {
            let (up, dn) = (
                Arc::new(Mutex::new(Probes::default())),
                Arc::new(Mutex::new(Probes::default())),
            );
            let server = addr(tunnels::SERVER_INNER, 9000 + k as u16);
            let client = addr(&tunnels::client_inner(k), 9000);
            let ends = [
                (
                    net::ns_client(k),
                    client,
                    server,
                    0u8,
                    up.clone(),
                    dn.clone(),
                ),
                (
                    NS_SERVER.to_string(),
                    server,
                    client,
                    1u8,
                    dn.clone(),
                    up.clone(),
                ),
            ];
            for (ns, bind, to, dir, tx, rx) in ends {
                let end = ProbeEnd { ns, bind, to, dir };
                traffic::start_probe_end(
                    &mut self.threads,
                    &self.errors,
                    self.t0,
                    k as u8,
                    end,
                    tx,
                    rx,
                );
            }
            let stream = Arc::new(Mutex::new(Stream::default()));
            traffic::start_stream(
                &mut self.threads,
                &self.errors,
                NS_SERVER.to_string(),
                net::ns_client(k),
                addr(tunnels::SERVER_INNER, 9100 + k as u16),
                self.opt.stream_rate,
                self.close.clone(),
                stream.clone(),
            );
            self.probes.push([up, dn]);
            self.streams.push(stream);
        }
    }

    /// Probes arrive both ways through every client (5 s at most).
    fn wait_flowing(&mut self) -> Result<(), LabError> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            self.check_errors()?;
            let quiet = (0..CLIENTS).find(|&i| {
                self.probes[i]
                    .iter()
                    .any(|p| lockp(p).arrived.iter().all(Option::is_none))
            });
            let Some(i) = quiet else {
                return Ok(());
            };
            if Instant::now() > deadline {
                return Err(lab_err(format!(
                    "no traffic through client {}'s tunnel within 5 s of its start",
                    NAMES[i]
                )));
            }
            sleep(Duration::from_millis(20))?;
        }
    }

    fn check_errors(&self) -> Result<(), LabError> {
        let e = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        match e.first() {
            Some(e) => Err(lab_err(format!("traffic: {e}"))),
            None => Ok(()),
        }
    }

    fn now_us(&self) -> u64 {
        self.t0.elapsed().as_micros() as u64
    }
}

fn lockp(p: &Mutex<Probes>) -> std::sync::MutexGuard<'_, Probes> {
    p.lock().unwrap_or_else(|p| p.into_inner())
}

mod run;
pub use run::failures;
