//! `braid lab bench`: on the same emulated links, in one run, measure
//!
//! 1. each link alone with TCP (iperf3, cubic): their sum is the bound;
//! 2. all links at once, one TCP flow each: the practical ceiling;
//! 3. TCP through `braid tunnel` in each mode;
//! 4. UDP through the tunnel with `braid bench udp-send/udp-sink`: loss and out-of-order
//!    at the tunnel output;
//! 5. Linux MPTCP with one subflow per link (in-kernel path manager, `mptcpize`).
//!
//! With `--call`, a VoIP-like UDP flow beside each mode's TCP flow, and over the
//! lowest-delay link alone and idle for reference ([`call`]).
//!
//! The lab is built before and removed after, also when a step fails.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use braid_io::traffic::{SendReport, SinkReport};

use crate::spec::LinkSpec;

pub mod call;
mod download;
mod idle;
mod payload;
mod result;

pub use payload::{Payload, INNER_TCP_HEADERS, LINK_MTU, MPTCP_DSS};
pub use result::{BenchResult, LinkResult, ModeResult, Spread};

use crate::tools;
use crate::topo::{self, client_addr, server_addr, LabError, NS_CLIENT, NS_SERVER};

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// The links.
    pub links: Vec<LinkSpec>,
    /// Length of each TCP measurement.
    pub duration: Duration,
    /// braid modes to measure (`logical`, `seq`, `trr`).
    pub modes: Vec<String>,
    /// Measure MPTCP too.
    pub mptcp: bool,
    /// The tunnel's channel weights (default: each link's rate in Mbit/s).
    pub weights: Option<Vec<u32>>,
    /// Adaptive weights in the tunnel (`session.adaptive`); `None`: the tunnel's
    /// default (on when every channel is paced).
    pub adaptive: Option<bool>,
    /// AQM in the tunnel (`session.aqm`; `None`: the tunnel's default, on). While it
    /// is on, ECN is turned on for TCP at both ends.
    pub aqm: Option<bool>,
    /// With the AQM: whether a loss behind a standing queue is signalled too
    /// (`session.aqm_loss_signal`; `None`: the tunnel's default).
    pub aqm_loss_signal: Option<bool>,
    /// The tunnel's pacing (`channel.pace`).
    pub pace: Pace,
    /// The tunnel's security mode (`session.security`); `None`: its default (`encrypt`).
    pub security: Option<String>,
    /// In-bond repair wait (`session.arq`), e.g. `100ms`; `None`: the tunnel's default.
    pub arq: Option<String>,
    /// Credit-based flow control per channel in the tunnel (`session.credits`).
    pub credits: bool,
    /// TCP carried as byte streams in the tunnel (`session.tcp_streams`); `None`: the
    /// tunnel's default.
    pub tcp_streams: Option<bool>,
    /// The streams' fast lane (`session.tcp_streams_fast`); `None`: the tunnel's
    /// default.
    pub tcp_streams_fast: Option<bool>,
    /// Per-flow order in the stripe (`session.flow_order`); `None`: the tunnel's
    /// default.
    pub flow_order: Option<bool>,
    /// The return path in the tunnel (`session.return_path`, on by default).
    pub return_path: bool,
    /// The tunnel's receive buffer per channel (`session.buffer_packets`); `None`: its
    /// default.
    pub buffer_packets: Option<usize>,
    /// Further `[session]` lines (`--set KEY=VALUE`), checked and formatted.
    pub set: Vec<String>,
    /// Scripted link changes, timed from the start of each TCP measurement of all
    /// links (the ceiling, braid in each mode, MPTCP); the links are put back as
    /// configured after each.
    pub changes: Vec<crate::spec::Change>,
    /// How many times to repeat every measurement (at least 1).
    pub runs: usize,
    /// With 2 or more: after each mode's single flow, this many TCP flows at once
    /// through the tunnel (their total and Jain's fairness index).
    pub flows: usize,
    /// Also time one download of this many bytes (from its SYN to its last byte) over
    /// each link alone, through the tunnel in each mode, and over MPTCP.
    pub download: Option<u64>,
    /// With 1 or more: after each mode's flows, this many TCP connections opened
    /// through the tunnel and held idle while both ends' memory is read.
    pub idle: usize,
    /// A call (200-byte UDP datagrams, 50 a second) through the tunnel beside each
    /// mode's single TCP flow, and over the lowest-delay link alone and idle.
    pub call: bool,
    /// What carries the call.
    pub call_transport: call::Transport,
    /// The `braid` binary.
    pub exe: PathBuf,
    /// Emulator seed.
    pub seed: u64,
}

/// How the bench's tunnel paces its channels (`channel.pace`).
#[derive(Clone, Debug, PartialEq)]
pub enum Pace {
    /// No `pace` in the config: the tunnel's default (measured rates, `auto`).
    Default,
    /// `pace = "off"`: not paced.
    Off,
    /// `pace = "auto"` on every channel.
    Auto,
    /// This share of each link's rate.
    Share(f64),
    /// These rates, one per link (bit/s; `None`: `auto`).
    Rates(Vec<Option<u64>>),
}

fn ns_cmd(ns: &str, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).args(args);
    c
}

/// How long an iperf3 client may run past its test's end before it is stopped: a
/// connection whose set-up or final exchange stalls on a lossy emulated link once hung a
/// bench for good (no interval at all, 8 minutes into a 15 s test).
const IPERF_GRACE_S: u64 = 60;
/// `timeout`'s exit status when it stopped the command.
const TIMED_OUT: i32 = 124;

fn output(mut c: Command, what: &str) -> Result<String, LabError> {
    let out = c
        .stdin(Stdio::null())
        .output()
        .map_err(|e| LabError::Command {
            cmd: what.into(),
            reason: e.to_string(),
        })?;
    stdout_of(out, what)
}

/// A finished command's standard output, or why it failed: stopped by `timeout`
/// ([`LabError::TimedOut`]) or exited with an error (its messages).
fn stdout_of(out: std::process::Output, what: &str) -> Result<String, LabError> {
    if out.status.code() == Some(TIMED_OUT) {
        return Err(LabError::TimedOut {
            cmd: what.into(),
            grace_s: IPERF_GRACE_S,
        });
    }
    if !out.status.success() {
        return Err(LabError::Command {
            cmd: what.into(),
            reason: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stderr).trim(),
                String::from_utf8_lossy(&out.stdout).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn iperf_bps(json_text: &str, what: &str) -> Result<f64, LabError> {
    let v: Value = serde_json::from_str(json_text).map_err(|e| LabError::Command {
        cmd: what.into(),
        reason: format!("iperf3 output is not JSON: {e}"),
    })?;
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .ok_or_else(|| LabError::Command {
            cmd: what.into(),
            reason: format!("no goodput in iperf3 output: {}", v["error"]),
        })
}

/// Goodput in each of iperf3's intervals (one a second) as its client, the sender,
/// counts (what it wrote), bit/s.
fn iperf_series(json_text: &str) -> Vec<f64> {
    serde_json::from_str::<Value>(json_text)
        .map(|v| intervals(&v))
        .unwrap_or_default()
}

/// The same as its server, the receiver, counts (what arrived), from the server's
/// report the client fetched (`--get-server-output`); empty without one.
fn iperf_rx_series(json_text: &str) -> Vec<f64> {
    serde_json::from_str::<Value>(json_text)
        .map(|v| intervals(&v["server_output_json"]))
        .unwrap_or_default()
}

/// The bit rates of an iperf3 report's intervals.
fn intervals(report: &Value) -> Vec<f64> {
    report["intervals"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| i["sum"]["bits_per_second"].as_f64())
                .collect()
        })
        .unwrap_or_default()
}

/// Run `f` while the scripted changes happen at their times from now; afterwards put
/// every changed link back as configured.
fn with_changes<T>(
    opt: &BenchOptions,
    f: impl FnOnce() -> Result<T, LabError>,
) -> Result<T, LabError> {
    if opt.changes.is_empty() {
        return f();
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut changes = opt.changes.clone();
    changes.sort_by_key(|c| c.at);
    let script = {
        let stop = stop.clone();
        std::thread::spawn(move || -> Result<(), LabError> {
            let t0 = Instant::now();
            for c in changes {
                while t0.elapsed() < c.at {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        return Ok(());
                    }
                    std::thread::sleep((c.at - t0.elapsed()).min(Duration::from_millis(20)));
                }
                topo::change(c.link, &c.action)?;
            }
            Ok(())
        })
    };
    let r = f();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let scripted = script.join().unwrap_or(Ok(()));
    let mut links: Vec<usize> = opt.changes.iter().map(|c| c.link).collect();
    links.sort_unstable();
    links.dedup();
    for i in links {
        topo::change(i, &crate::spec::Action::To(opt.links[i].clone()))?;
    }
    scripted?;
    r
}

/// The sender's retransmissions in iperf3's JSON (0 when it does not say).
fn iperf_retransmits(json_text: &str) -> u64 {
    serde_json::from_str::<Value>(json_text)
        .ok()
        .and_then(|v| v["end"]["sum_sent"]["retransmits"].as_u64())
        .unwrap_or(0)
}

/// An iperf3 client of `secs` seconds in namespace `ns` (after the `prefix` command,
/// e.g. `mptcpize run`), stopped [`IPERF_GRACE_S`] after its end (status
/// [`TIMED_OUT`]).
fn tcp_client(
    ns: &str,
    prefix: &[&str],
    dst: &str,
    bind: Option<&str>,
    port: u16,
    secs: u64,
) -> Command {
    let mut args: Vec<String> = vec![
        "timeout".into(),
        "-k".into(),
        "5".into(),
        (secs + IPERF_GRACE_S).to_string(),
    ];
    args.extend(prefix.iter().map(|s| s.to_string()));
    args.extend(
        [
            "iperf3",
            "-J",
            "--get-server-output",
            "-C",
            "cubic",
            "-c",
            dst,
            "-p",
        ]
        .map(String::from),
    );
    args.push(port.to_string());
    args.push("-t".into());
    args.push(secs.to_string());
    if let Some(b) = bind {
        args.push("-B".into());
        args.push(b.into());
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    ns_cmd(ns, &refs)
}

fn start_server(ns: &str, prefix: &[&str], port: u16) -> Result<(), LabError> {
    let mut args: Vec<&str> = prefix.to_vec();
    let p = port.to_string();
    args.extend(["iperf3", "-s", "-D", "-J", "-p", &p]);
    output(ns_cmd(ns, &args), "iperf3 -s")?;
    std::thread::sleep(Duration::from_millis(200));
    Ok(())
}

/// Run the whole bench. `progress` receives one line per step.
pub fn run(opt: &BenchOptions, mut progress: impl FnMut(&str)) -> Result<BenchResult, LabError> {
    let mut need = [tools::LAB_UP, tools::LAB_BENCH].concat();
    if opt.mptcp {
        need.push(tools::MPTCPIZE);
    }
    if let Some(why) = tools::missing(&need) {
        return Err(LabError::MissingTools(why));
    }
    let _ = topo::down();
    topo::up(&opt.links, &opt.exe, opt.seed)?;
    if opt.aqm != Some(false) {
        // The AQM (on by default) signals with ECN: TCP asks for it at both ends (Linux's default only
        // accepts it). The MPTCP run has it too; nothing marks its packets.
        for ns in [NS_CLIENT, NS_SERVER] {
            output(
                ns_cmd(ns, &["sysctl", "-qw", "net.ipv4.tcp_ecn=1"]),
                "sysctl net.ipv4.tcp_ecn",
            )?;
        }
    }
    let result = measure_runs(opt, &mut progress);
    let _ = topo::down();
    result
}

/// Every measurement `opt.runs` times on the same lab; with more than one run, the
/// medians.
fn measure_runs(
    opt: &BenchOptions,
    progress: &mut impl FnMut(&str),
) -> Result<BenchResult, LabError> {
    let payload = Payload::of(opt)?;
    let runs = opt.runs.max(1);
    let mut results = Vec::with_capacity(runs);
    for i in 1..=runs {
        if runs > 1 {
            progress(&format!("run {i} of {runs}"));
        }
        let mut r = measure(opt, progress)?;
        r.payload = Some(payload.clone());
        results.push(r);
    }
    Ok(BenchResult::from_runs(results).expect("at least one run"))
}

/// One run of every measurement: each link alone, the ceiling, braid in each mode, MPTCP
/// (if asked), then the emulator's counters.
fn measure(opt: &BenchOptions, progress: &mut impl FnMut(&str)) -> Result<BenchResult, LabError> {
    let n = opt.links.len();
    let secs = opt.duration.as_secs().max(1);
    let steps = n + 1 + opt.modes.len() + usize::from(opt.mptcp);
    let mut step = 0;
    let mut say = |what: String, progress: &mut dyn FnMut(&str)| {
        step += 1;
        progress(&format!("[{step}/{steps}] {what}"));
    };
    start_servers(n, opt.flows)?;

    let _download_server = match opt.download {
        Some(b) => Some(download::Server::start(&[], download::PORT, b)?),
        None => None,
    };
    let _idle_server = match opt.idle {
        0 => None,
        _ => Some(idle::start_server()?),
    };
    let mut links = Vec::new();
    let mut download_best_link_s: Option<f64> = None;
    for (i, l) in opt.links.iter().enumerate() {
        say(format!("TCP over link {i} alone ({l})"), progress);
        links.push(LinkResult {
            spec: l.text.clone(),
            tcp_bps: link_alone(i, l, secs)?,
        });
        if let Some(b) = opt.download {
            let (client, server) = topo::link_addrs(i, l);
            let t = download::time(&[], &server, download::PORT, Some(&client), b)?;
            download_best_link_s = Some(download_best_link_s.map_or(t, |x| x.min(t)));
        }
    }
    let sum_bps: f64 = links.iter().map(|l| l.tcp_bps).sum();
    let call_idle_best_link = match opt.call {
        true => {
            let i = call::best_link(&opt.links);
            progress(&format!(
                "      a call over link {i} alone, idle ({})",
                opt.links[i].text
            ));
            Some((i, call::over_link(opt.call_transport, i, &opt.links[i])?))
        }
        false => None,
    };

    say("TCP over every link at once (ceiling)".into(), progress);
    let ceiling_bps = with_changes(opt, || ceiling(&opt.links, secs))?;

    let mut braid = BTreeMap::new();
    for mode in &opt.modes {
        let mut then = String::from(match opt.call {
            true => "TCP with a call beside it, UDP",
            false => "TCP, UDP",
        });
        if opt.flows >= 2 {
            then += &format!(", {} TCP flows at once", opt.flows);
        }
        if opt.idle > 0 {
            then += &format!(", {} idle connections", opt.idle);
        }
        if packets_beside(opt) {
            then += ", then TCP as packets";
        }
        say(format!("braid tunnel, mode {mode}: {then}"), progress);
        braid.insert(mode.clone(), tunnel_run(opt, mode, secs, sum_bps)?);
    }

    let (mptcp_bps, mptcp_series_bps, mptcp_rx_series_bps, download_mptcp_s) = if opt.mptcp {
        say("MPTCP, one subflow per link".into(), progress);
        let (b, s, rx, d) = mptcp_run(opt, n, secs)?;
        (Some(b), s, rx, d)
    } else {
        (None, Vec::new(), Vec::new(), None)
    };
    Ok(BenchResult {
        links,
        sum_bps,
        ceiling_bps,
        braid,
        mptcp_bps,
        mptcp_series_bps,
        mptcp_rx_series_bps,
        download_bytes: opt.download,
        download_best_link_s,
        download_mptcp_s,
        call_idle_best_link,
        call_transport: opt.call_transport,
        emulator: emulator_counters(n),
        payload: None,
        per_run: Vec::new(),
    })
}

/// The iperf3 servers in the server's namespace: port 5201 for one flow at a time
/// (each link alone, the tunnel), 5210 + i for link i's flow of the ceiling.
fn start_servers(n: usize, flows: usize) -> Result<(), LabError> {
    start_server(NS_SERVER, &[], 5201)?;
    for i in 0..n {
        start_server(NS_SERVER, &[], 5210 + i as u16)?;
    }
    for j in 0..flow_clients(flows) {
        start_server(NS_SERVER, &[], FLOWS_PORT + j as u16)?;
    }
    Ok(())
}

/// The first iperf3 server port of the many-flows measurement (one per client).
const FLOWS_PORT: u16 = 5240;
/// Flows per iperf3 client at most (iperf3 takes up to 128 parallel streams).
const FLOWS_PER_CLIENT: usize = 100;

/// iperf3 clients that carry `flows` flows (none for a single flow).
fn flow_clients(flows: usize) -> usize {
    if flows < 2 {
        0
    } else {
        flows.div_ceil(FLOWS_PER_CLIENT)
    }
}

/// Jain's fairness index of `x`: 1 when all are equal, 1/n when one has it all.
pub fn jain(x: &[f64]) -> f64 {
    let (sum, sq) = x.iter().fold((0.0, 0.0), |(s, q), v| (s + v, q + v * v));
    if sq <= 0.0 {
        return 0.0;
    }
    sum * sum / (x.len() as f64 * sq)
}

/// `opt.flows` TCP flows at once through the tunnel for `secs`: their total goodput
/// (bit/s, as the receivers count) and Jain's fairness index over the flows.
fn many_flows(opt: &BenchOptions, secs: u64) -> Result<(f64, f64), LabError> {
    let clients = flow_clients(opt.flows);
    let what = "iperf3 through the tunnel, many flows";
    let children: Vec<Child> = (0..clients)
        .map(|j| {
            let m = (opt.flows - j * FLOWS_PER_CLIENT).min(FLOWS_PER_CLIENT);
            let port = FLOWS_PORT + j as u16;
            let mut c = tcp_client(NS_CLIENT, &[], "10.99.0.2", None, port, secs);
            c.args(["-P", &m.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| LabError::Command {
                    cmd: what.into(),
                    reason: e.to_string(),
                })
        })
        .collect::<Result<_, _>>()?;
    let (mut total, mut each) = (0.0, Vec::new());
    for c in children {
        let out = c.wait_with_output().map_err(|e| LabError::Command {
            cmd: what.into(),
            reason: e.to_string(),
        })?;
        let text = stdout_of(out, what)?;
        total += iperf_bps(&text, what)?;
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if let Some(streams) = v["end"]["streams"].as_array() {
            each.extend(
                streams
                    .iter()
                    .filter_map(|s| s["receiver"]["bits_per_second"].as_f64()),
            );
        }
    }
    if each.len() != opt.flows {
        return Err(LabError::Command {
            cmd: what.into(),
            reason: format!("{} flows reported, of {}", each.len(), opt.flows),
        });
    }
    // As after any flow through the tunnel: its FINs cross before the tunnel goes.
    std::thread::sleep(Duration::from_secs(2));
    Ok((total, jain(&each)))
}

/// TCP goodput over link `i` alone for `secs` seconds, bit/s.
fn link_alone(i: usize, l: &LinkSpec, secs: u64) -> Result<f64, LabError> {
    let (client, server) = topo::link_addrs(i, l);
    let c = || tcp_client(NS_CLIENT, &[], &server, Some(&client), 5201, secs);
    // A connection that stalls (TCP alone over a bursty-loss link can, before its
    // first interval) or fails is tried again, up to LINK_TRIES times: nothing else
    // runs on the link, and a whole run should not be lost to its reference. So is
    // one that iperf3 reports as a success having carried next to nothing (a
    // connection whose first segments were lost and whose retransmission timer backed
    // off past the run: 0.0 Mbit/s over a 100 Mbit/s link losing 5 % in bursts, where
    // other tries carry 0.25-0.8 Mbit/s).
    let mut tries = 1;
    loop {
        let r = output(c(), "iperf3 single link")
            .and_then(|json| iperf_bps(&json, "iperf3 single link"))
            .and_then(|bps| match bps < LINK_LEAST_BPS {
                true => Err(LabError::Command {
                    cmd: "iperf3 single link".into(),
                    reason: format!(
                        "carried {:.1} kbit/s: it stalled (under {} kbit/s)",
                        bps / 1e3,
                        LINK_LEAST_BPS / 1e3
                    ),
                }),
                false => Ok(bps),
            });
        match r {
            Err(e) if tries < LINK_TRIES => {
                let why = match e {
                    LabError::TimedOut { .. } => "stalled and stopped".to_string(),
                    e => e.to_string(),
                };
                eprintln!("      ({why}; again)");
                tries += 1;
            }
            r => return r,
        }
    }
}

/// Tries of a link's TCP flow alone before the bench gives up.
const LINK_TRIES: u32 = 3;
/// A link's TCP flow alone that carried less than this (bit/s; under 19 KB in 15 s, a
/// dozen segments) is a failed try (it stalled), not the link's figure. TCP alone over
/// a heavily lossy link carries little but not nothing: 0.25-0.8 Mbit/s over 100
/// Mbit/s losing 5 % in bursts of 5.
const LINK_LEAST_BPS: f64 = 10_000.0;

/// Each link's emulator counters (its `emu-I.json` in the state folder), null where
/// there are none.
fn emulator_counters(n: usize) -> Vec<Value> {
    let dir = topo::state_dir();
    (0..n)
        .map(|i| {
            fs::read_to_string(dir.join(format!("emu-{i}.json")))
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or(Value::Null)
        })
        .collect()
}

/// One TCP flow per link at once (each in its link's address family): the sum of
/// their goodputs.
fn ceiling(links: &[LinkSpec], secs: u64) -> Result<f64, LabError> {
    let children: Vec<Child> = (0..links.len())
        .map(|i| {
            let (client, server) = topo::link_addrs(i, &links[i]);
            tcp_client(
                NS_CLIENT,
                &[],
                &server,
                Some(&client),
                5210 + i as u16,
                secs,
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| LabError::Command {
                cmd: "iperf3".into(),
                reason: e.to_string(),
            })
        })
        .collect::<Result<_, _>>()?;
    let mut ceiling_bps = 0.0;
    for c in children {
        let out = c.wait_with_output().map_err(|e| LabError::Command {
            cmd: "iperf3".into(),
            reason: e.to_string(),
        })?;
        ceiling_bps += iperf_bps(&stdout_of(out, "iperf3 ceiling")?, "iperf3 ceiling")?;
    }
    Ok(ceiling_bps)
}

/// A tunnel config for one end.
fn tunnel_config(opt: &BenchOptions, mode: &str, end_a: bool) -> String {
    let (addr, sock) = if end_a {
        ("10.99.0.1/24", "a")
    } else {
        ("10.99.0.2/24", "b")
    };
    let mut s = format!(
        "[tunnel]\nname = \"brl-tun\"\naddress = \"{addr}\"\ncontrol = \"{}/tun-{sock}.sock\"\nlog_interval = \"0s\"\n\n\
         [session]\nmode = \"{mode}\"\nscheduler = \"srr\"\nkey = \"f1njdwrpfIzRyXbWUPz15DmEK5AHdvKw7LmAZC4M6Rw=\"\n",
        topo::state_dir().display(),
    );
    s += &session_options(opt);
    s += "\n";
    for (i, l) in opt.links.iter().enumerate() {
        s += &channel_config(opt, i, l, end_a);
    }
    s
}

/// The `[session]` settings the bench's options set, one line each; the tunnel's
/// defaults for the rest.
fn session_options(opt: &BenchOptions) -> String {
    let mut s = String::new();
    if let Some(on) = opt.aqm {
        s += &format!("aqm = {on}\n");
    }
    if let Some(a) = opt.adaptive {
        s += &format!("adaptive = {a}\n");
    }
    if let Some(m) = &opt.security {
        s += &format!("security = \"{m}\"\n");
        if m == "none" {
            // The bench asked for it: the tunnel refuses it without the acknowledgement.
            s += "allow_insecure = true\n";
        }
    }
    if let Some(a) = &opt.arq {
        s += &format!("arq = \"{a}\"\n");
    }
    if let (true, Some(on)) = (opt.aqm != Some(false), opt.aqm_loss_signal) {
        s += &format!("aqm_loss_signal = {on}\n");
    }
    if let Some(b) = opt.buffer_packets {
        s += &format!("buffer_packets = {b}\n");
    }
    if opt.credits {
        s += "credits = true\n";
    }
    if let Some(on) = opt.tcp_streams {
        s += &format!("tcp_streams = {on}\n");
    }
    if let Some(on) = opt.tcp_streams_fast {
        s += &format!("tcp_streams_fast = {on}\n");
    }
    if let Some(on) = opt.flow_order {
        s += &format!("flow_order = {on}\n");
    }
    if !opt.return_path {
        s += "return_path = false\n";
    }
    for line in &opt.set {
        s += line;
        s += "\n";
    }
    s
}

/// The `[[channel]]` of link `i` (`l`) at end A (client) or B: its addresses, port
/// 7100 + i, weight (given, else the link's rate in Mbit/s), MTU and pacing.
fn channel_config(opt: &BenchOptions, i: usize, l: &LinkSpec, end_a: bool) -> String {
    let (client, server) = topo::link_addrs(i, l);
    let (local, remote) = if end_a {
        (client, server)
    } else {
        (server, client)
    };
    let port = 7100 + i as u16;
    let (local, remote) = (
        topo::socket_addr(&local, port),
        topo::socket_addr(&remote, port),
    );
    let weight = match &opt.weights {
        Some(w) => u64::from(w[i]),
        None => (l.rate_bps / 1_000_000).max(1),
    };
    let mut s = format!(
        "[[channel]]\nname = \"link{i}\"\nlocal = \"{local}\"\nremote = \"{remote}\"\nweight = {weight}\nmtu = {LINK_MTU}\n"
    );
    match &opt.pace {
        Pace::Default => {}
        Pace::Off => s += "pace = \"off\"\n",
        Pace::Auto => s += "pace = \"auto\"\n",
        Pace::Rates(r) => match r.get(i).copied().flatten() {
            Some(bps) => s += &format!("pace = \"{bps}\"\n"),
            None => s += "pace = \"auto\"\n",
        },
        Pace::Share(share) => {
            // The shaper counts IP bytes; the pacer adds 42 bytes of framing, so
            // `share` of the rate leaves the tbf's queue empty.
            s += &format!(
                "pace = \"{}\"\n",
                (l.rate_bps as f64 * share).round() as u64
            );
        }
    }
    s += "\n";
    s
}

struct Tunnel(Child);

impl Drop for Tunnel {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_tunnel(opt: &BenchOptions, ns: &str, cfg: &Path, log: &Path) -> Result<Tunnel, LabError> {
    let logf = fs::File::create(log).map_err(|err| LabError::Io {
        path: log.display().to_string(),
        err,
    })?;
    let logf2 = logf.try_clone().map_err(|err| LabError::Io {
        path: log.display().to_string(),
        err,
    })?;
    let child = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(&opt.exe)
        .arg("tunnel")
        .arg("--config")
        .arg(cfg)
        .stdin(Stdio::null())
        .stdout(logf)
        .stderr(logf2)
        .spawn()
        .map_err(|e| LabError::Command {
            cmd: "braid tunnel".into(),
            reason: e.to_string(),
        })?;
    Ok(Tunnel(child))
}

fn tunnel_run(
    opt: &BenchOptions,
    mode: &str,
    secs: u64,
    sum_bps: f64,
) -> Result<ModeResult, LabError> {
    let tunnels = start_tunnels(opt, mode)?;
    wait_for_tunnel(opt, mode)?;
    let c = tcp_client(NS_CLIENT, &[], "10.99.0.2", None, 5201, secs);
    // The call runs beside the TCP flow, for as long.
    let call = match opt.call {
        true => Some(call::through_tunnel(
            opt.call_transport,
            Duration::from_secs(secs),
        )?),
        false => None,
    };
    let tcp_json = with_changes(opt, || output(c, "iperf3 through the tunnel"))?;
    let call = call.map(call::Call::finish).transpose()?;
    let tcp_series_bps = iperf_series(&tcp_json);
    let tcp_rx_series_bps = iperf_rx_series(&tcp_json);
    let tcp_bps = iperf_bps(&tcp_json, "iperf3 through the tunnel")?;
    let tcp_retransmits = iperf_retransmits(&tcp_json);
    let download_s = match opt.download {
        Some(b) => Some(download::time(&[], "10.99.0.2", download::PORT, None, b)?),
        None => None,
    };

    let (sent, got) = udp_through_tunnel(opt, sum_bps)?;
    let flows = match opt.flows >= 2 {
        true => Some(with_changes(opt, || many_flows(opt, secs))?),
        false => None,
    };
    let idle = match opt.idle {
        0 => None,
        n => {
            let pids = [tunnels[0].0.id(), tunnels[1].0.id()];
            Some(idle::measure("10.99.0.2", n, pids, Duration::from_secs(2))?)
        }
    };
    let tunnel_status = status_of(opt, NS_SERVER, "tun-b.sock");
    let sender_status = status_of(opt, NS_CLIENT, "tun-a.sock");
    drop(tunnels);
    // With the carriage left to the defaults, the same flow as packets beside it.
    let tcp_packet_bps = match packets_beside(opt) {
        true => Some(tcp_as_packets(opt, mode, secs)?),
        false => None,
    };
    Ok(ModeResult {
        call,
        download_s,
        tcp_packet_bps,
        flows_tcp_bps: flows.map(|f| f.0),
        flows_jain: flows.map(|f| f.1),
        idle_made: idle.map(|i| i.made as f64),
        idle_open_s: idle.map(|i| i.open_s),
        idle_rss_bytes: idle.map(|i| i.rss_open.into_iter().max().unwrap_or(0) as f64),
        idle_rss_growth_bytes: idle.map(|i| i.growth() as f64),
        tcp_bps,
        tcp_retransmits,
        udp_out_of_order: got.out_of_order,
        udp_loss: got.loss_ratio,
        udp_goodput_bps: got.goodput_bps,
        udp_offered_bps: sent.offered_bps,
        tunnel_status,
        sender_status,
        tcp_series_bps,
        tcp_rx_series_bps,
    })
}

/// Is TCP carried as streams by the defaults here (`tcp_streams` not set, the channels
/// paced), so that the same flow as packets is measured beside it?
fn packets_beside(opt: &BenchOptions) -> bool {
    opt.tcp_streams.is_none() && opt.pace != Pace::Off
}

/// One TCP flow through the tunnel in `mode` with `tcp_streams = false` (TCP
/// carried as packets), bit/s.
fn tcp_as_packets(opt: &BenchOptions, mode: &str, secs: u64) -> Result<f64, LabError> {
    let packets = BenchOptions {
        tcp_streams: Some(false),
        ..opt.clone()
    };
    let tunnels = start_tunnels(&packets, mode)?;
    wait_for_tunnel(opt, mode)?;
    let c = tcp_client(NS_CLIENT, &[], "10.99.0.2", None, 5201, secs);
    let json = with_changes(opt, || {
        output(c, "iperf3 through the tunnel, TCP as packets")
    })?;
    // The client's FINs cross the tunnel before it goes: an iperf3 server whose
    // control connection never closes stays busy, and refuses the next test.
    std::thread::sleep(Duration::from_secs(2));
    drop(tunnels);
    iperf_bps(&json, "iperf3 through the tunnel, TCP as packets")
}

/// Both ends of the tunnel in `mode`, each with its configuration and log in the lab's
/// state folder; they stop when dropped.
fn start_tunnels(opt: &BenchOptions, mode: &str) -> Result<Vec<Tunnel>, LabError> {
    let dir = topo::state_dir();
    let mut tunnels = Vec::new();
    for (end_a, ns) in [(true, NS_CLIENT), (false, NS_SERVER)] {
        let tag = if end_a { "a" } else { "b" };
        let cfg = dir.join(format!("tunnel-{tag}-{mode}.toml"));
        topo::write_private(&cfg, &tunnel_config(opt, mode, end_a)).map_err(|err| {
            LabError::Io {
                path: cfg.display().to_string(),
                err,
            }
        })?;
        let log = dir.join(format!("tunnel-{tag}-{mode}.log"));
        tunnels.push(start_tunnel(opt, ns, &cfg, &log)?);
    }
    Ok(tunnels)
}

/// Wait until a ping crosses the tunnel (at most 15 s, then the ends' logs are the
/// error), then a second for it to settle.
fn wait_for_tunnel(opt: &BenchOptions, mode: &str) -> Result<(), LabError> {
    let dir = topo::state_dir();
    // Wait until the tunnel carries traffic.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let ok = ns_cmd(
            NS_CLIENT,
            &["ping", "-q", "-c", "1", "-W", "1", "10.99.0.2"],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
        if ok {
            // Let the tunnel settle before measuring: its heartbeats (every 50 ms)
            // measure the channels' skew for the delay equalizer and their round
            // trips for the repair margin. A flow started at the first ping saw its
            // first round trips unequalized (15 ms, then 155 ms: HyStart leaves slow
            // start at the jump), which a tunnel that has been up for a second does not.
            // And until both ends have measured their channels' rates (`pace =
            // "auto"`, the default): a tunnel measures them once when it starts, and
            // a connection of a tunnel that has been up meets a paced bond.
            wait_for_probes(opt, Duration::from_secs(5));
            std::thread::sleep(Duration::from_secs(1));
            return Ok(());
        }
        if Instant::now() > deadline {
            let log_a =
                fs::read_to_string(dir.join(format!("tunnel-a-{mode}.log"))).unwrap_or_default();
            let log_b =
                fs::read_to_string(dir.join(format!("tunnel-b-{mode}.log"))).unwrap_or_default();
            return Err(LabError::Command {
                cmd: format!("braid tunnel ({mode})"),
                reason: format!(
                    "no ping through the tunnel within 15 s; end A log: {}; end B log: {}",
                    log_a.trim(),
                    log_b.trim()
                ),
            });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// UDP through the tunnel with `braid bench udp-send/udp-sink`: the sender's and the
/// sink's reports.
fn udp_through_tunnel(
    opt: &BenchOptions,
    sum_bps: f64,
) -> Result<(SendReport, SinkReport), LabError> {
    // UDP at 70 % of the sum of the links: below every bottleneck, so any loss or
    // misordering seen is the tunnel's (or the emulated links' own loss).
    let rate = format!("{}", (0.7 * sum_bps) as u64);
    let sink = start_udp_sink(opt)?;
    std::thread::sleep(Duration::from_millis(300));
    // The sender and sink run in other namespaces, so in their own processes; their
    // reports are braid-io's own types, read back whole.
    let sent = udp_send(opt, &rate)?;
    let out = sink.wait_with_output().map_err(|e| LabError::Command {
        cmd: "braid bench udp-sink".into(),
        reason: e.to_string(),
    })?;
    let got: SinkReport = serde_json::from_slice(&out.stdout).map_err(|e| LabError::Command {
        cmd: "braid bench udp-sink".into(),
        reason: format!("{e}: {}", String::from_utf8_lossy(&out.stderr)),
    })?;
    Ok((sent, got))
}

/// `braid bench udp-sink` on the tunnel's far end (10.99.0.2:6000) in the server's
/// namespace, until 2 s without a datagram; its JSON report on its standard output.
fn start_udp_sink(opt: &BenchOptions) -> Result<Child, LabError> {
    ns_cmd(
        NS_SERVER,
        &[
            opt.exe.to_str().unwrap_or("braid"),
            "bench",
            "udp-sink",
            "--bind",
            "10.99.0.2:6000",
            "--idle",
            "2s",
            "--json",
        ],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .map_err(|e| LabError::Command {
        cmd: "braid bench udp-sink".into(),
        reason: e.to_string(),
    })
}

/// `braid bench udp-send` from the client's namespace into the tunnel: 1200-byte
/// datagrams at `rate` bit/s for 5 s to the sink; its report.
fn udp_send(opt: &BenchOptions, rate: &str) -> Result<SendReport, LabError> {
    let send = ns_cmd(
        NS_CLIENT,
        &[
            opt.exe.to_str().unwrap_or("braid"),
            "bench",
            "udp-send",
            "--to",
            "10.99.0.2:6000",
            "--bind",
            "10.99.0.1:0",
            "--size",
            "1200",
            "--rate",
            rate,
            "--duration",
            "5s",
            "--json",
        ],
    );
    serde_json::from_str(&output(send, "braid bench udp-send")?).map_err(|e| LabError::Command {
        cmd: "braid bench udp-send".into(),
        reason: format!("unreadable report: {e}"),
    })
}

/// A tunnel end's counters (its `braid status --json`), or null.
/// Wait (at most `limit`) until no channel of either tunnel end is still measuring
/// its rate.
fn wait_for_probes(opt: &BenchOptions, limit: Duration) {
    let deadline = Instant::now() + limit;
    let measuring = |v: &Value| {
        v["channels"]
            .as_array()
            .is_some_and(|a| a.iter().any(|c| c["probe"] == "measuring"))
    };
    while Instant::now() < deadline {
        let a = status_of(opt, NS_CLIENT, "tun-a.sock");
        let b = status_of(opt, NS_SERVER, "tun-b.sock");
        if !measuring(&a) && !measuring(&b) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn status_of(opt: &BenchOptions, ns: &str, sock: &str) -> Value {
    let sock = topo::state_dir().join(sock);
    let status = ns_cmd(
        ns,
        &[
            opt.exe.to_str().unwrap_or("braid"),
            "status",
            "--control",
            sock.to_str().unwrap_or_default(),
            "--json",
        ],
    );
    output(status, "braid status")
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null)
}

/// One TCP flow over Linux MPTCP (`mptcpize`), a subflow per link: its goodput and
/// per-second series, as its sender and as its receiver count.
/// MPTCP's goodput, its series as the sender and the receiver count, and with
/// `--download` the download's seconds.
type MptcpRun = (f64, Vec<f64>, Vec<f64>, Option<f64>);

fn mptcp_run(opt: &BenchOptions, n: usize, secs: u64) -> Result<MptcpRun, LabError> {
    enable_mptcp(n)?;
    add_subflow_endpoints(n)?;
    start_server(NS_SERVER, &["mptcpize", "run"], 5202)?;
    let c = tcp_client(
        NS_CLIENT,
        &["mptcpize", "run"],
        &server_addr(0),
        Some(&client_addr(0)),
        5202,
        secs,
    );
    let json = with_changes(opt, || output(c, "MPTCP iperf3"))?;
    let download_s = match opt.download {
        Some(b) => {
            let mptcp = ["mptcpize", "run"];
            let _server = download::Server::start(&mptcp, download::MPTCP_PORT, b)?;
            let (dst, src) = (server_addr(0), client_addr(0));
            Some(download::time(
                &mptcp,
                &dst,
                download::MPTCP_PORT,
                Some(&src),
                b,
            )?)
        }
        None => None,
    };
    Ok((
        iperf_bps(&json, "MPTCP iperf3")?,
        iperf_series(&json),
        iperf_rx_series(&json),
        download_s,
    ))
}

/// MPTCP on in both namespaces, with room for `n` subflows and `n` announced addresses.
fn enable_mptcp(n: usize) -> Result<(), LabError> {
    let nn = n.to_string();
    for ns in [NS_CLIENT, NS_SERVER] {
        output(
            ns_cmd(ns, &["sysctl", "-qw", "net.mptcp.enabled=1"]),
            "sysctl net.mptcp.enabled",
        )?;
        output(
            ns_cmd(
                ns,
                &[
                    "ip",
                    "mptcp",
                    "limits",
                    "set",
                    "subflows",
                    &nn,
                    "add_addr_accepted",
                    &nn,
                ],
            ),
            "ip mptcp limits",
        )?;
    }
    Ok(())
}

/// The client's subflow endpoints: one on each link after the first (the flow itself
/// uses link 0).
fn add_subflow_endpoints(n: usize) -> Result<(), LabError> {
    // Each run adds the subflow endpoints anew: those of an earlier run (--runs) go
    // first, or adding them fails as duplicates.
    output(
        ns_cmd(NS_CLIENT, &["ip", "mptcp", "endpoint", "flush"]),
        "ip mptcp endpoint flush",
    )?;
    for i in 1..n {
        let dev = format!("l{i}");
        output(
            ns_cmd(
                NS_CLIENT,
                &[
                    "ip",
                    "mptcp",
                    "endpoint",
                    "add",
                    &client_addr(i),
                    "dev",
                    &dev,
                    "subflow",
                ],
            ),
            "ip mptcp endpoint",
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An iperf3 client runs under `timeout`, a minute past its end; a command that
    /// `timeout` stopped is reported as such, one that failed with its output.
    #[test]
    fn a_stalled_measurement_is_stopped_and_said_so() {
        let c = tcp_client("ns", &["mptcpize", "run"], "10.0.0.2", None, 5201, 15);
        let args: Vec<String> = c
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args[..10],
            ["netns", "exec", "ns", "timeout", "-k", "5", "75", "mptcpize", "run", "iperf3"]
        );
        let mut stopped = Command::new("timeout");
        stopped.args(["-k", "1", "0.1", "sleep", "5"]);
        let e = output(stopped, "iperf3 single link").unwrap_err();
        assert!(matches!(e, LabError::TimedOut { grace_s: 60, .. }), "{e:?}");
        assert!(
            e.to_string().contains("still running 60 s after its end"),
            "{e}"
        );
        let mut failed = Command::new("sh");
        failed.args(["-c", "echo refused >&2; exit 1"]);
        let e = output(failed, "iperf3 single link").unwrap_err();
        assert!(e.to_string().contains("refused"), "{e}");
    }

    /// iperf3 -J --get-server-output: the client's intervals are what it wrote, the
    /// server's report (nested) what arrived; each series reads its own.
    #[test]
    fn the_sender_and_receiver_series_come_from_their_own_reports() {
        let report = r#"{
            "intervals": [{"sum": {"bits_per_second": 22e6}}, {"sum": {"bits_per_second": 238e6}}],
            "end": {"sum_received": {"bits_per_second": 141e6}},
            "server_output_json": {
                "intervals": [{"sum": {"bits_per_second": 15e6}}, {"sum": {"bits_per_second": 150e6}}]
            }
        }"#;
        assert_eq!(iperf_series(report), vec![22e6, 238e6]);
        assert_eq!(iperf_rx_series(report), vec![15e6, 150e6]);
        // An iperf3 that did not send its server's report: no receiver series.
        let plain = r#"{"intervals": [{"sum": {"bits_per_second": 1e6}}]}"#;
        assert_eq!(iperf_series(plain), vec![1e6]);
        assert!(iperf_rx_series(plain).is_empty());
        assert!(iperf_rx_series("not json").is_empty());
    }

    #[test]
    fn jain_is_one_for_equal_shares_and_one_over_n_for_one_taker() {
        assert!((jain(&[5.0; 200]) - 1.0).abs() < 1e-12);
        let mut one = vec![0.0; 4];
        one[2] = 8.0;
        assert!((jain(&one) - 0.25).abs() < 1e-12);
        assert!((jain(&[1.0, 3.0]) - 0.8).abs() < 1e-12);
        assert_eq!(jain(&[]), 0.0);
        assert_eq!(flow_clients(1), 0);
        assert_eq!(flow_clients(200), 2);
        assert_eq!(flow_clients(201), 3);
    }
}
