//! `braid lab`: the namespace testbed with braid's own link emulator. Each lab's flags
//! and their checks are `braid_lab::args`; this runs the lab and prints its result.

use anyhow::Result;
use braid_lab::topo;
use clap::Subcommand;

/// Arguments of `braid lab`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: LabCommand,
}

#[derive(Subcommand, Debug)]
enum LabCommand {
    /// Build the testbed: namespaces brl-a (client), brl-r (router), brl-b (server), one
    /// path per link, rate from tbf, delay/jitter/loss from braid's link emulator.
    Up(braid_lab::args::UpArgs),
    /// Remove everything the labs created (brl-* and the overlay's bro-*; also after a
    /// crash).
    Down,
    /// Change one link of the running lab (`lab up`): its rate (tbf), delay, jitter
    /// and loss (the emulator, within about 50 ms), or take it down and up.
    Change(braid_lab::args::ChangeArgs),
    /// In one run on the same links: each link alone with TCP, all at once, TCP and UDP
    /// through `braid tunnel` in each mode, and Linux MPTCP. Builds the lab and removes
    /// it afterwards (needs root, iperf3 and mptcpize).
    Bench(braid_lab::args::BenchArgs),
    /// A live-video-like stream (constant bit rate, fixed-size records) through braid
    /// (`send --live`/`recv --live` over every link, once per tolerance, and with the
    /// first tolerance over the best link alone) and through SRT (`srt-live-transmit`
    /// over the best single link), in one run on the same links:
    /// delivered %, latency p50/p99/max (send time to arrival at the receiving
    /// application, pipes included), retransmission overhead (packets sent again /
    /// distinct data packets, from each protocol's own counters), and the loss the
    /// links inflicted. Builds the lab and removes it afterwards (needs root, ping, and
    /// srt-live-transmit from srt-tools unless --no-srt).
    Stream(braid_lab::args::StreamArgs),
    /// The GALO overlay (seed 003) in five namespaces: source bro-s (node 0), relays
    /// bro-r1..3 (nodes 1-3), destination bro-d (node 4), one hop per node pair through
    /// router bro-x (tbf rate, braid's emulator for delay). One `braid node` per
    /// namespace; the source stripes a flow to the destination over up to three paths
    /// (TUN 10.77.0.1 -> 10.77.0.2). In one run: TCP (iperf3) over the direct hop alone,
    /// TCP through the overlay, and TCP through the overlay while the relay of the best
    /// path is killed. Builds the lab and removes it afterwards, also on Ctrl-C (needs
    /// root and iperf3).
    Overlay(braid_lab::args::OverlayArgs),
    /// The stream generator of `lab stream`: constant-rate records with sequence
    /// number and send time, to standard output or a UDP address.
    #[command(hide = true)]
    StreamGen(braid_lab::args::StreamGenArgs),
    /// The stream sink of `lab stream`: records from standard input or a UDP port.
    #[command(hide = true)]
    StreamSink(braid_lab::args::StreamSinkArgs),
    /// Show the links, addresses and emulator counters of the running lab.
    Status,
    /// Print the table and draw the bar chart of a saved `lab bench --json` result.
    Chart(braid_lab::args::ChartArgs),
    /// Run the link emulator (started by `lab up` inside the router namespace).
    #[command(hide = true)]
    Emulate(braid_lab::args::EmulateArgs),
}

/// Run `braid lab`.
pub fn run(a: Args) -> Result<()> {
    let progress = |line: &str| eprintln!("{line}");
    match a.command {
        LabCommand::Up(a) => {
            topo::up(&a.links()?, &a.exe()?, a.seed)?;
            print!("{}", topo::status().unwrap_or_default());
            println!("lab is up; `braid lab down` removes it");
        }
        LabCommand::Change(a) => {
            let c = a.change()?;
            topo::change(c.link, &c.action)?;
            println!("link {}: {}", a.link, a.to);
        }
        LabCommand::Down => down()?,
        LabCommand::Bench(a) => {
            let r = braid_lab::bench::run(&a.options()?, progress)?;
            report(a.json, r.to_json(), r.table(), a.plot, |p| {
                braid_lab::chart::draw(&r, &format!("braid lab bench: {}", a.links), p)
            })?;
        }
        LabCommand::Chart(a) => {
            let r = a.load()?;
            print!("{}", r.table());
            braid_lab::chart::draw(&r, &a.title, &a.out)
                .map_err(|e| anyhow::anyhow!("--out {}: {e}", a.out.display()))?;
            eprintln!("wrote {}", a.out.display());
        }
        LabCommand::Stream(a) => {
            let r = match a.saved()? {
                Some(r) => r,
                None => braid_lab::stream::run(&a.options()?, progress)?,
            };
            let title = format!(
                "braid lab stream: {:.0} Mbit/s over {}",
                r.rate_bps as f64 / 1e6,
                r.links.join(",")
            );
            report(a.json, r.to_json(), r.table(), a.plot, |p| {
                braid_lab::stream::draw(&r, &title, p)
            })?;
        }
        LabCommand::Overlay(a) => {
            let r = braid_lab::overlay::run_overlay(&a.options()?, progress)?;
            report(a.json, r.to_json(), r.table(), a.plot, |p| {
                let title = format!("braid lab overlay: direct {}", a.direct);
                braid_lab::overlay::draw(&r, &title, p)
            })?;
        }
        LabCommand::StreamGen(a) => a.run()?,
        LabCommand::StreamSink(a) => a.run()?,
        LabCommand::Status => match topo::status() {
            Some(s) => print!("{s}"),
            None => println!("no lab is up"),
        },
        LabCommand::Emulate(a) => a.run()?,
    }
    Ok(())
}

/// `lab down`: remove both labs' namespaces and say what went.
fn down() -> Result<()> {
    let mut removed = topo::down()?;
    removed.extend(braid_lab::overlay::down()?);
    if removed.is_empty() {
        println!("no lab was up");
    } else {
        println!("removed {}", removed.join(" "));
    }
    Ok(())
}

/// Print a lab run's result as JSON or as a table, and draw its chart to `plot` if
/// asked (with `draw`).
fn report<E: std::fmt::Display>(
    json: bool,
    value: serde_json::Value,
    table: String,
    plot: Option<std::path::PathBuf>,
    draw: impl FnOnce(&std::path::Path) -> std::result::Result<(), E>,
) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print!("{table}");
    }
    if let Some(p) = plot {
        draw(&p).map_err(|e| anyhow::anyhow!("--plot {}: {e}", p.display()))?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}
