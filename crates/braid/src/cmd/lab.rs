//! `braid lab`: the namespace testbed with braid's own link emulator.

use anyhow::{bail, Context, Result};
use braid_lab::spec::LinkSpec;
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
    Up {
        /// Links, comma-separated, each RATE/DELAY[/LOSS][/jJITTER], e.g.
        /// `100mbit/5ms,50mbit/20ms,20mbit/60ms/1%`. LOSS is `1%` (random) or
        /// `ge:2%:5` (bursty: 2 % average, bursts of 5 packets on average). DELAY is
        /// one-way and applies in both directions; loss applies client to server.
        #[arg(long)]
        links: String,
        /// Seed of the emulator's loss process.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Remove everything the lab created (also after a crash).
    Down,
    /// In one run on the same links: each link alone with TCP, all at once, TCP and UDP
    /// through `braid tunnel` in each mode, and Linux MPTCP. Builds the lab and removes
    /// it afterwards (needs root, iperf3 and mptcpize).
    Bench {
        /// Links, as for `lab up`.
        #[arg(long, default_value = "100mbit/0ms,50mbit/0ms,20mbit/0ms")]
        links: String,
        /// Length of each TCP measurement, e.g. 10s.
        #[arg(long, default_value = "10s")]
        duration: String,
        /// braid modes to measure, comma-separated.
        #[arg(long, default_value = "logical,seq,trr")]
        modes: String,
        /// Skip the MPTCP measurement.
        #[arg(long)]
        no_mptcp: bool,
        /// The tunnel's channel weights, comma-separated, one per link (default: each
        /// link's rate in Mbit/s). With adaptive weights they are only the start.
        #[arg(long, value_name = "W1,W2,...")]
        weights: Option<String>,
        /// Adaptive weights in the tunnel (`adaptive = true`; off by default, as in the
        /// tunnel).
        #[arg(long)]
        adaptive: bool,
        /// In-tunnel repair in `seq` mode (`repair = DURATION` in the tunnel: how long
        /// the receiver waits for a resent packet), e.g. 100ms. Off by default.
        #[arg(long, value_name = "DURATION")]
        repair: Option<String>,
        /// AQM in the tunnel (`aqm = true`): CoDel on the channels' queueing delay,
        /// marking ECN CE; turns ECN on for TCP in the lab's end hosts.
        #[arg(long)]
        aqm: bool,
        /// In-bond repair in the tunnel, every mode (`arq = DURATION`: how long the
        /// receiver holds a channel for a lost datagram asked for again), e.g. 200ms;
        /// 0s turns it off.
        #[arg(long, value_name = "DURATION")]
        arq: Option<String>,
        /// Credit-based flow control per channel in the tunnel (`credits = true`): the
        /// receiver lends each channel's sender its buffer, so skewed channels slow
        /// the sender instead of overflowing the receiver.
        #[arg(long)]
        credits: bool,
        /// The tunnel's receive buffer per channel, packets (`buffer_packets`; default
        /// the tunnel's, 4096). With --credits the window is this less 64.
        #[arg(long, value_name = "PACKETS")]
        buffer_packets: Option<usize>,
        /// Print one JSON object instead of the table.
        #[arg(long)]
        json: bool,
        /// Also draw a bar chart (.svg or .png).
        #[arg(long)]
        plot: Option<std::path::PathBuf>,
        /// Seed of the emulator's loss process.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Show the links, addresses and emulator counters of the running lab.
    Status,
    /// Print the table and draw the bar chart of a saved `lab bench --json` result.
    Chart {
        /// The JSON written by `braid lab bench --json`.
        #[arg(long)]
        from: std::path::PathBuf,
        /// The chart to write (.svg or .png).
        #[arg(long)]
        out: std::path::PathBuf,
        /// Chart title.
        #[arg(long, default_value = "braid lab bench")]
        title: String,
    },
    /// Run the link emulator (started by `lab up` inside the router namespace).
    #[command(hide = true)]
    Emulate {
        /// The links, as given to `lab up`.
        #[arg(long)]
        links: String,
        /// Loss seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Where to write counters.
        #[arg(long)]
        state_dir: std::path::PathBuf,
    },
}

/// Run `braid lab`.
pub fn run(a: Args) -> Result<()> {
    match a.command {
        LabCommand::Up { links, seed } => {
            let links = LinkSpec::parse_list(&links).context("--links")?;
            let exe = std::env::current_exe().context("locating the braid binary")?;
            topo::up(&links, &exe, seed)?;
            print!("{}", topo::status().unwrap_or_default());
            println!("lab is up; `braid lab down` removes it");
            Ok(())
        }
        LabCommand::Down => {
            let removed = topo::down()?;
            if removed.is_empty() {
                println!("no lab was up");
            } else {
                println!("removed {}", removed.join(" "));
            }
            Ok(())
        }
        LabCommand::Bench {
            links,
            duration,
            modes,
            no_mptcp,
            weights,
            adaptive,
            repair,
            aqm,
            arq,
            credits,
            buffer_packets,
            json,
            plot,
            seed,
        } => {
            if let Some(b) = buffer_packets {
                if b < 1 || (credits && b < 68) {
                    bail!(
                        "--buffer-packets {b}: at least 1, and with --credits at least 68 \
                         (the window is the buffer less 64 packets for markers)"
                    );
                }
            }
            let specs = LinkSpec::parse_list(&links).context("--links")?;
            let weights = match weights {
                None => None,
                Some(w) => {
                    let ws = w
                        .split(',')
                        .map(|x| x.trim().parse::<u32>().ok().filter(|&v| v >= 1))
                        .collect::<Option<Vec<u32>>>()
                        .with_context(|| format!("--weights '{w}': whole numbers >= 1"))?;
                    if ws.len() != specs.len() {
                        bail!("--weights: {} weights for {} links", ws.len(), specs.len());
                    }
                    Some(ws)
                }
            };
            for (flag, v) in [("--repair", &repair), ("--arq", &arq)] {
                if let Some(r) = v {
                    braid_proto::units::parse_duration(r)
                        .with_context(|| format!("{flag} '{r}': expected e.g. 100ms"))?;
                }
            }
            let duration = braid_proto::units::parse_duration(&duration)
                .ok()
                .filter(|d| d.as_secs() >= 1)
                .with_context(|| {
                    format!("--duration '{duration}': expected e.g. 10s (at least 1s)")
                })?;
            let modes: Vec<String> = modes.split(',').map(|m| m.trim().to_string()).collect();
            for m in &modes {
                if braid_proto::units::parse_mode(m).is_err() {
                    bail!("--modes: unknown mode '{m}' (logical, seq, trr, none)");
                }
            }
            if let Some(p) = &plot {
                if braid_sim::plot::Format::from_path(p).is_none() {
                    bail!("--plot {}: must end in .svg or .png", p.display());
                }
            }
            let opt = braid_lab::bench::BenchOptions {
                links: specs,
                duration,
                modes,
                mptcp: !no_mptcp,
                weights,
                adaptive,
                repair,
                aqm,
                arq,
                credits,
                buffer_packets,
                exe: std::env::current_exe().context("locating the braid binary")?,
                seed,
            };
            let r = braid_lab::bench::run(&opt, |line| eprintln!("{line}"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r.to_json())?);
            } else {
                print!("{}", r.table());
            }
            if let Some(p) = plot {
                braid_lab::chart::draw(&r, &format!("braid lab bench: {links}"), &p)
                    .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
                eprintln!("wrote {}", p.display());
            }
            Ok(())
        }
        LabCommand::Chart { from, out, title } => {
            let text = std::fs::read_to_string(&from)
                .with_context(|| format!("reading {}", from.display()))?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{}: not JSON", from.display()))?;
            let r = braid_lab::bench::BenchResult::from_json(&v).with_context(|| {
                format!(
                    "{}: not the output of `braid lab bench --json`",
                    from.display()
                )
            })?;
            print!("{}", r.table());
            braid_lab::chart::draw(&r, &title, &out).map_err(|e| anyhow::anyhow!("plot: {e}"))?;
            eprintln!("wrote {}", out.display());
            Ok(())
        }
        LabCommand::Status => {
            match topo::status() {
                Some(s) => print!("{s}"),
                None => println!("no lab is up"),
            }
            Ok(())
        }
        LabCommand::Emulate {
            links,
            seed,
            state_dir,
        } => emulate(&links, seed, &state_dir),
    }
}

fn emulate(links: &str, seed: u64, dir: &std::path::Path) -> Result<()> {
    let links = LinkSpec::parse_list(links).context("--links")?;
    braid_lab::emu::run_links(&links, seed, dir).map_err(anyhow::Error::msg)?;
    Ok(())
}
