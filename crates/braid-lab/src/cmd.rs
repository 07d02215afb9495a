//! `braid lab`: the subcommand tree (each lab's flags are [`crate::args`]) and its run:
//! build, change or remove the testbed, run a lab and write its result to the output the
//! CLI hands in, progress and "wrote FILE" lines to stderr.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::args::*;
use crate::topo;

/// Arguments of `braid lab`.
#[derive(clap::Args, Debug)]
pub struct LabArgs {
    #[command(subcommand)]
    command: LabCommand,
}

#[derive(clap::Subcommand, Debug)]
enum LabCommand {
    /// Build the testbed: namespaces brl-a (client), brl-r (router), brl-b (server), one
    /// path per link, rate from tbf, delay/jitter/loss from braid's link emulator.
    Up(UpArgs),
    /// Remove everything the labs created (brl-*, the overlay's bro-* and the field
    /// lab's field-*; also after a crash).
    Down,
    /// Change one link of the running lab (`lab up`): its rate (tbf), delay, jitter
    /// and loss (the emulator, within about 50 ms), or take it down and up.
    Change(ChangeArgs),
    /// In one run on the same links: each link alone with TCP, all at once, TCP and UDP
    /// through `braid tunnel` in each mode, and Linux MPTCP. Builds the lab and removes
    /// it afterwards (needs root, iperf3 and mptcpize).
    Bench(BenchArgs),
    /// A live-video-like stream (constant bit rate, fixed-size records) through braid
    /// (`send --live`/`recv --live` over every link, once per tolerance, and with the
    /// first tolerance over the best link alone) and through SRT (`srt-live-transmit`
    /// over the best single link), in one run on the same links:
    /// delivered %, latency p50/p99/max (send time to arrival at the receiving
    /// application, pipes included), retransmission overhead (packets sent again /
    /// distinct data packets, from each protocol's own counters), and the loss the
    /// links inflicted. Builds the lab and removes it afterwards (needs root, ping, and
    /// srt-live-transmit from srt-tools unless --no-srt).
    Stream(StreamArgs),
    /// The GALO overlay (seed 003) in five namespaces: source bro-s (node 0), relays
    /// bro-r1..3 (nodes 1-3), destination bro-d (node 4), one hop per node pair through
    /// router bro-x (tbf rate, braid's emulator for delay). One `braid node` per
    /// namespace; the source stripes a flow to the destination over up to three paths
    /// (TUN 10.77.0.1 -> 10.77.0.2). In one run: TCP (iperf3) over the direct hop alone,
    /// TCP through the overlay, and TCP through the overlay while the relay of the best
    /// path is killed. Builds the lab and removes it afterwards, also on Ctrl-C (needs
    /// root and iperf3).
    Overlay(OverlayArgs),
    /// A field deployment in namespaces: one `braid tunnel` server with a public
    /// address of each family, three clients, each with an IPv4 uplink behind NAT (one
    /// behind two NATs in a row, carrier-grade) and an IPv6-only uplink, every channel
    /// bound to its uplink. While probes (every 10 ms each way) and a checked,
    /// resumable TCP block stream run through every client, one client's NAT changes
    /// its address, one uplink goes away and comes back, a client restarts and the
    /// server restarts. Reports per event the time until traffic flowed again and per
    /// client the bytes sent and received and whether every checksum matched; fails
    /// (after the report) if an event did not recover or a stream is not whole.
    /// Builds the lab and removes it afterwards, also on Ctrl-C (needs root,
    /// iproute2 and iptables).
    Field(FieldArgs),
    /// The stream generator of `lab stream`: constant-rate records with sequence
    /// number and send time, to standard output or a UDP address.
    #[command(hide = true)]
    StreamGen(StreamGenArgs),
    /// The stream sink of `lab stream`: records from standard input or a UDP port.
    #[command(hide = true)]
    StreamSink(StreamSinkArgs),
    /// Show the links, addresses and emulator counters of the running lab.
    Status,
    /// Print the table and draw the bar chart of a saved `lab bench --json` result.
    Chart(ChartArgs),
    /// Run the link emulator (started by `lab up` inside the router namespace).
    #[command(hide = true)]
    Emulate(EmulateArgs),
}

impl LabArgs {
    /// Run the subcommand; results go to `out`, progress lines to `progress`.
    pub fn run(self, out: &mut impl Write, progress: impl Fn(&str)) -> Result<()> {
        match self.command {
            LabCommand::Up(a) => {
                topo::up(&a.links()?, &a.exe()?, a.seed)?;
                write!(out, "{}", topo::status().unwrap_or_default())?;
                writeln!(out, "lab is up; `braid lab down` removes it")?;
            }
            LabCommand::Change(a) => {
                let c = a.change()?;
                topo::change(c.link, &c.action)?;
                writeln!(out, "link {}: {}", a.link, a.to)?;
            }
            LabCommand::Down => down(out)?,
            LabCommand::Bench(a) => {
                let r = crate::bench::run(&a.options()?, progress)?;
                report(out, a.json, r.to_json(), r.table(), a.plot, |p| {
                    crate::chart::draw(&r, &format!("braid lab bench: {}", a.links), p)
                })?;
            }
            LabCommand::Chart(a) => {
                let r = a.load()?;
                write!(out, "{}", r.table())?;
                crate::chart::draw(&r, &a.title, &a.out)
                    .map_err(|e| anyhow::anyhow!("--out {}: {e}", a.out.display()))?;
                eprintln!("wrote {}", a.out.display());
            }
            LabCommand::Stream(a) => stream(out, a, progress)?,
            LabCommand::Overlay(a) => {
                let r = crate::overlay::run_overlay(&a.options()?, progress)?;
                report(out, a.json, r.to_json(), r.table(), a.plot, |p| {
                    let title = format!("braid lab overlay: direct {}", a.direct);
                    crate::overlay::draw(&r, &title, p)
                })?;
            }
            LabCommand::Field(a) => field(out, a, progress)?,
            LabCommand::StreamGen(a) => a.run()?,
            LabCommand::StreamSink(a) => a.run()?,
            LabCommand::Status => match topo::status() {
                Some(s) => write!(out, "{s}")?,
                None => writeln!(out, "no lab is up")?,
            },
            LabCommand::Emulate(a) => a.run()?,
        }
        Ok(())
    }
}

/// `lab stream`: run it (or load a saved result) and report.
fn stream(out: &mut impl Write, a: StreamArgs, progress: impl Fn(&str)) -> Result<()> {
    let r = match a.saved()? {
        Some(r) => r,
        None => crate::stream::run(&a.options()?, progress)?,
    };
    let title = format!(
        "braid lab stream: {:.0} Mbit/s over {}",
        r.rate_bps as f64 / 1e6,
        r.links.join(",")
    );
    report(out, a.json, r.to_json(), r.table(), a.plot, |p| {
        crate::stream::draw(&r, &title, p)
    })
}

/// `lab field`: run it, report, and fail if an event did not recover or a stream is
/// not whole.
fn field(out: &mut impl Write, a: FieldArgs, progress: impl Fn(&str)) -> Result<()> {
    let r = crate::field::run(&a.options()?, progress)?;
    report(out, a.json, r.to_json(), r.table(), None, |_| {
        Ok::<(), String>(())
    })?;
    let failed = crate::field::failures(&r);
    if !failed.is_empty() {
        anyhow::bail!("braid lab field: {}", failed.join("; "));
    }
    Ok(())
}

/// `lab down`: remove every lab's namespaces and say what went.
fn down(out: &mut impl Write) -> Result<()> {
    let mut removed = topo::down()?;
    removed.extend(crate::overlay::down()?);
    removed.extend(crate::field::down()?);
    if removed.is_empty() {
        writeln!(out, "no lab was up")?;
    } else {
        writeln!(out, "removed {}", removed.join(" "))?;
    }
    Ok(())
}

/// Write a lab run's result as JSON or as a table, and draw its chart to `plot` if
/// asked (with `draw`).
fn report<E: std::fmt::Display>(
    out: &mut impl Write,
    json: bool,
    value: serde_json::Value,
    table: String,
    plot: Option<PathBuf>,
    draw: impl FnOnce(&Path) -> std::result::Result<(), E>,
) -> Result<()> {
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&value)?)?;
    } else {
        write!(out, "{table}")?;
    }
    if let Some(p) = plot {
        draw(&p).map_err(|e| anyhow::anyhow!("--plot {}: {e}", p.display()))?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}
