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
    /// Remove everything the labs created (brl-* and the overlay's bro-*; also after a
    /// crash).
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
    /// The GALO overlay (seed 003) in five namespaces: source bro-s (node 0), relays
    /// bro-r1..3 (nodes 1-3), destination bro-d (node 4), one hop per node pair through
    /// router bro-x (tbf rate, braid's emulator for delay). One `braid node` per
    /// namespace; the source stripes a flow to the destination over up to three paths
    /// (TUN 10.77.0.1 -> 10.77.0.2). In one run: TCP (iperf3) over the direct hop alone,
    /// TCP through the overlay, and TCP through the overlay while the relay of the best
    /// path is killed. Builds the lab and removes it afterwards, also on Ctrl-C (needs
    /// root and iperf3).
    Overlay {
        /// The direct hop source-destination, RATE/DELAY[/LOSS][/jJITTER] as for `lab
        /// up`. Rate and delay apply both ways, loss from the lower-numbered node to the
        /// higher (the flow's direction).
        #[arg(long, default_value = "4mbit/40ms")]
        direct: String,
        /// The hops through relays 1, 2 and 3 (each used for source-relay and
        /// relay-destination), comma-separated.
        #[arg(long, default_value = "10mbit/10ms,8mbit/15ms,6mbit/20ms")]
        relays: String,
        /// The hops between two relays (probed, never on a two-hop path of this flow).
        #[arg(long, default_value = "10mbit/10ms")]
        between: String,
        /// Length of each of the two plain TCP measurements, e.g. 10s.
        #[arg(long, default_value = "10s")]
        duration: String,
        /// Length of the measurement with the relay kill in its middle (0s: none).
        #[arg(long, default_value = "12s")]
        kill_duration: String,
        /// Paths per flow, 1 to 3.
        #[arg(long, default_value_t = 3)]
        max_paths: usize,
        /// Adaptive weights in the flow's session (`[flow] adaptive = true`): the SRR
        /// quanta follow what each path delivers instead of staying at the shares the
        /// probes measured.
        #[arg(long)]
        adaptive: bool,
        /// Print one JSON object instead of the table.
        #[arg(long)]
        json: bool,
        /// Also draw a chart (.svg or .png).
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
            let mut removed = topo::down()?;
            removed.extend(braid_lab::overlay::down()?);
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
            json,
            plot,
            seed,
        } => {
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
        LabCommand::Overlay {
            direct,
            relays,
            between,
            duration,
            kill_duration,
            max_paths,
            adaptive,
            json,
            plot,
            seed,
        } => {
            let spec =
                |flag: &str, v: &str| LinkSpec::parse(v).with_context(|| format!("{flag} '{v}'"));
            let relay_specs = LinkSpec::parse_list(&relays).context("--relays")?;
            if relay_specs.len() != 3 {
                bail!(
                    "--relays: three hop specs, one per relay ({} given)",
                    relay_specs.len()
                );
            }
            let secs = |flag: &str, v: &str, min: u64| {
                braid_proto::units::parse_duration(v)
                    .ok()
                    .filter(|d| d.as_secs() >= min)
                    .with_context(|| format!("{flag} '{v}': expected e.g. 10s (at least {min}s)"))
            };
            if !(1..=3).contains(&max_paths) {
                bail!("--max-paths {max_paths}: 1, 2 or 3");
            }
            if let Some(p) = &plot {
                if braid_sim::plot::Format::from_path(p).is_none() {
                    bail!("--plot {}: must end in .svg or .png", p.display());
                }
            }
            let kill = secs("--kill-duration", &kill_duration, 0)?;
            if !kill.is_zero() && kill.as_secs() < 4 {
                bail!("--kill-duration: 0s, or at least 4s");
            }
            let opt = braid_lab::overlay::OverlayOptions {
                matrix: braid_lab::overlay::Matrix {
                    direct: spec("--direct", &direct)?,
                    relays: relay_specs,
                    between: spec("--between", &between)?,
                },
                duration: secs("--duration", &duration, 1)?,
                kill_duration: kill,
                max_paths,
                adaptive,
                exe: std::env::current_exe().context("locating the braid binary")?,
                seed,
            };
            let r = braid_lab::overlay::run_overlay(&opt, |line| eprintln!("{line}"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r.to_json())?);
            } else {
                print!("{}", r.table());
            }
            if let Some(p) = plot {
                braid_lab::overlay::draw(&r, &format!("braid lab overlay: direct {direct}"), &p)
                    .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
                eprintln!("wrote {}", p.display());
            }
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
