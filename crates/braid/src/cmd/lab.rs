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
    /// Change one link of the running lab (`lab up`): its rate (tbf), delay, jitter
    /// and loss (the emulator, within about 50 ms), or take it down and up.
    Change {
        /// Index of the link, from 0.
        link: usize,
        /// The new link, as for `lab up` (e.g. 33mbit/5ms/1%), or `down`, or `up`
        /// (back as before `down`).
        to: String,
    },
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
        /// Adaptive weights in the tunnel (`adaptive = true`). Without this or
        /// --static-weights the tunnel's default holds: on when paced (adaptive pacing:
        /// the pace follows a link whose rate drops; the default), off with --pace off
        #[arg(long, conflicts_with = "static_weights")]
        adaptive: bool,
        /// Static weights in the tunnel (`adaptive = false`), also with --pace
        #[arg(long)]
        static_weights: bool,
        /// AQM in the tunnel (`aqm = true`): CoDel on the channels' queueing delay,
        /// marking ECN CE; turns ECN on for TCP in the lab's end hosts.
        #[arg(long)]
        aqm: bool,
        /// With --aqm: signal a loss found behind a standing queue too (`on`, the
        /// tunnel's default) or leave congestion to CoDel's delay signal alone (`off`).
        #[arg(long, value_name = "on|off", value_parser = parse_on_off, requires = "aqm")]
        aqm_loss_signal: Option<bool>,
        /// Turn the tunnel's return path off (`return_path = false`; on by default: an
        /// end that sends little more than the acknowledgements of the other end's flow
        /// sends them on the channel with the shortest round trip alone)
        #[arg(long)]
        no_return_path: bool,
        /// How the tunnel paces each channel (`pace`): a share of its link's rate
        /// (no burst overfills the link's short queue; CoDel marks what waits in the
        /// tunnel instead), e.g. 0.99; `auto`: the tunnel measures each link's rate
        /// when the channel comes up, which is also its default; `off`: not paced.
        #[arg(long, value_name = "SHARE|auto|off")]
        pace: Option<String>,
        /// Pace the tunnel's channels at these rates instead, one per link, e.g.
        /// `100mbit,100mbit,100mbit`: what a user who knows only the links' nominal
        /// rates would configure (with adaptive pacing, the tunnel's default when paced,
        /// a link slower than its pace is followed down). An entry `auto` has that
        /// link measured; then every link is, and paced at most at its measured rate.
        #[arg(long, value_name = "R1,R2,...", conflicts_with = "pace")]
        pace_rates: Option<String>,
        /// The tunnel's security mode (`security`): `encrypt` (the default), `auth`
        /// (sealed, body in clear) or `none` (no envelope: 32 bytes more of each
        /// datagram for the inner packet; in-bond repair, --arq, needs a sealing mode).
        #[arg(long, value_name = "MODE")]
        security: Option<String>,
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
        /// A scripted link change during every TCP measurement over all links (the
        /// ceiling, braid in each mode, MPTCP), as AT:LINK:WHAT, timed from the start of
        /// the measurement: `5s:0:33mbit/5ms` (link 0 drops to 33 Mbit/s at 5 s),
        /// `3s:1:down`, `6s:1:up`. Repeat for more. The links are put back after each
        /// measurement; the table and JSON add TCP goodput second by second.
        #[arg(long = "change", value_name = "AT:LINK:WHAT")]
        changes: Vec<String>,
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
    /// A live-video-like stream (constant bit rate, fixed-size records) through braid
    /// (`send --live`/`recv --live` over every link, once per tolerance, and with the
    /// first tolerance over the best link alone) and through SRT (`srt-live-transmit`
    /// over the best single link), in one run on the same links:
    /// delivered %, latency p50/p99/max (send time to arrival at the receiving
    /// application, pipes included), retransmission overhead (packets sent again /
    /// distinct data packets, from each protocol's own counters), and the loss the
    /// links inflicted. Builds the lab and removes it afterwards (needs root, ping, and
    /// srt-live-transmit from srt-tools unless --no-srt).
    Stream {
        /// Links, as for `lab up`.
        #[arg(long, default_value = "100mbit/5ms,50mbit/20ms,20mbit/60ms/1%")]
        links: String,
        /// Length of each stream, e.g. 20s.
        #[arg(long, default_value = "20s")]
        duration: String,
        /// Stream rate, e.g. 8mbit.
        #[arg(long, default_value = "8mbit")]
        rate: String,
        /// Record (packet payload) size in bytes: 1316 = 7 MPEG-TS packets, SRT's live
        /// payload.
        #[arg(long, default_value_t = 1316)]
        size: usize,
        /// braid's loss tolerance W,E,B, one braid run each (repeat the option).
        #[arg(long = "tolerance", value_name = "W,E,B", default_values = ["100,0,0", "100,1,1"])]
        tolerances: Vec<String>,
        /// braid's segment deadline (`braid send --deadline`), e.g. 200ms; default none.
        #[arg(long)]
        deadline: Option<String>,
        /// Skip SRT.
        #[arg(long)]
        no_srt: bool,
        /// Skip the extra braid run (first tolerance) over the best link alone, the
        /// path SRT takes, which tells the protocol's part from the paths'.
        #[arg(long)]
        no_single: bool,
        /// SRT's latency (default: --srt-rtt-factor × the best link's measured round trip).
        #[arg(long, value_name = "DURATION")]
        srt_latency: Option<String>,
        /// SRT's latency as a multiple of the round trip (its guide: 3 to 4 on links with
        /// little loss).
        #[arg(long, default_value_t = 4.0)]
        srt_rtt_factor: f64,
        /// Print one JSON object instead of the table.
        #[arg(long)]
        json: bool,
        /// Also draw the latency distributions (.svg or .png).
        #[arg(long)]
        plot: Option<std::path::PathBuf>,
        /// Do not run anything: print the table (and draw --plot) of a saved
        /// `lab stream --json` result.
        #[arg(long, value_name = "JSON")]
        from: Option<std::path::PathBuf>,
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
    /// The stream generator of `lab stream`: constant-rate records with sequence
    /// number and send time, to standard output or a UDP address.
    #[command(hide = true)]
    StreamGen {
        /// Rate, e.g. 8mbit.
        #[arg(long)]
        rate: String,
        /// Record size in bytes.
        #[arg(long)]
        size: usize,
        /// How long, e.g. 20s.
        #[arg(long)]
        duration: String,
        /// - (standard output) or IP:PORT (UDP).
        #[arg(long)]
        to: String,
        /// Where to write the report (JSON).
        #[arg(long)]
        report: std::path::PathBuf,
    },
    /// The stream sink of `lab stream`: records from standard input or a UDP port.
    #[command(hide = true)]
    StreamSink {
        /// Record size in bytes.
        #[arg(long)]
        size: usize,
        /// - (standard input) or IP:PORT to bind (UDP).
        #[arg(long)]
        from: String,
        /// UDP: stop after this long without a record.
        #[arg(long, default_value = "2s")]
        idle: String,
        /// UDP: give up if no record comes within this long.
        #[arg(long, default_value = "30s")]
        wait: String,
        /// Where to write the report (JSON).
        #[arg(long)]
        report: std::path::PathBuf,
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
        LabCommand::Change { link, to } => {
            // The links of the running lab, as `lab up` recorded them.
            let Ok(text) = std::fs::read_to_string(topo::state_dir().join("links")) else {
                bail!("no lab is up (braid lab up --links …)");
            };
            let links = LinkSpec::parse_list(text.trim())
                .context("the running lab's links")?
                .len();
            let c = braid_lab::spec::Change::parse(&format!("0s:{link}:{to}"), links)
                .context("lab change")?;
            topo::change(c.link, &c.action)?;
            println!("link {link}: {to}");
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
            static_weights,
            aqm,
            aqm_loss_signal,
            no_return_path,
            pace,
            pace_rates,
            security,
            arq,
            credits,
            buffer_packets,
            changes,
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
            let changes = changes
                .iter()
                .map(|c| braid_lab::spec::Change::parse(c, specs.len()))
                .collect::<Result<Vec<_>, _>>()
                .context("--change")?;
            let secs = braid_proto::units::parse_duration(&duration).unwrap_or_default();
            if let Some(late) = changes.iter().find(|c| c.at >= secs) {
                bail!(
                    "--change {}: at {:?}, not before the end of a {duration} measurement",
                    late.text,
                    late.at
                );
            }
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
            let pace = match (pace.as_deref(), &pace_rates) {
                (None, None) => braid_lab::bench::Pace::Default,
                (Some("auto"), _) => braid_lab::bench::Pace::Auto,
                (Some("off"), _) => braid_lab::bench::Pace::Off,
                (Some(v), _) => braid_lab::bench::Pace::Share(
                    v.parse::<f64>()
                        .ok()
                        .filter(|p| p.is_finite() && *p > 0.0 && *p <= 2.0)
                        .with_context(|| {
                            format!(
                                "--pace {v}: expected a share of the link's rate above 0 \
                                 (at most 2), e.g. 0.99, or auto, or off"
                            )
                        })?,
                ),
                (None, Some(list)) => {
                    let rs = list
                        .split(',')
                        .map(|x| match x.trim() {
                            "auto" => Some(None),
                            r => braid_proto::units::parse_rate(r)
                                .ok()
                                .filter(|&r| r > 0)
                                .map(Some),
                        })
                        .collect::<Option<Vec<Option<u64>>>>()
                        .with_context(|| {
                            format!(
                                "--pace-rates '{list}': rates above 0 or auto, e.g. 100mbit,50mbit"
                            )
                        })?;
                    if rs.len() != specs.len() {
                        bail!("--pace-rates: {} rates for {} links", rs.len(), specs.len());
                    }
                    braid_lab::bench::Pace::Rates(rs)
                }
            };
            for (flag, v) in [("--arq", &arq)] {
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
                super::sim::check_plot("--plot", p)?;
            }
            let opt = braid_lab::bench::BenchOptions {
                links: specs,
                duration,
                modes,
                mptcp: !no_mptcp,
                weights,
                adaptive: match (adaptive, static_weights) {
                    (true, _) => Some(true),
                    (_, true) => Some(false),
                    _ => None,
                },
                aqm,
                aqm_loss_signal,
                pace,
                security,
                arq,
                credits,
                return_path: !no_return_path,
                buffer_packets,
                changes,
                exe: std::env::current_exe().context("locating the braid binary")?,
                seed,
            };
            let r = braid_lab::bench::run(&opt, |line| eprintln!("{line}"))?;
            report(json, r.to_json(), r.table(), plot, |p| {
                braid_lab::chart::draw(&r, &format!("braid lab bench: {links}"), p)
            })
        }
        LabCommand::Chart { from, out, title } => {
            super::sim::check_plot("--out", &out)?;
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
            braid_lab::chart::draw(&r, &title, &out)
                .map_err(|e| anyhow::anyhow!("--out {}: {e}", out.display()))?;
            eprintln!("wrote {}", out.display());
            Ok(())
        }
        LabCommand::Stream {
            links,
            duration,
            rate,
            size,
            tolerances,
            deadline,
            no_srt,
            no_single,
            srt_latency,
            srt_rtt_factor,
            json,
            plot,
            from,
            seed,
        } => {
            if let Some(p) = &plot {
                super::sim::check_plot("--plot", p)?;
            }
            let r = match from {
                Some(f) => {
                    let text = std::fs::read_to_string(&f)
                        .with_context(|| format!("reading {}", f.display()))?;
                    let v: serde_json::Value = serde_json::from_str(&text)
                        .with_context(|| format!("{}: not JSON", f.display()))?;
                    braid_lab::stream::StreamResult::from_json(&v).with_context(|| {
                        format!(
                            "{}: not the output of `braid lab stream --json`",
                            f.display()
                        )
                    })?
                }
                None => {
                    let opt = stream_options(
                        &links,
                        &duration,
                        &rate,
                        size,
                        &tolerances,
                        deadline.as_deref(),
                        !no_srt,
                        !no_single,
                        srt_latency.as_deref(),
                        srt_rtt_factor,
                        seed,
                    )?;
                    braid_lab::stream::run(&opt, |line| eprintln!("{line}"))?
                }
            };
            let title = format!(
                "braid lab stream: {:.0} Mbit/s over {}",
                r.rate_bps as f64 / 1e6,
                r.links.join(",")
            );
            report(json, r.to_json(), r.table(), plot, |p| {
                braid_lab::stream::draw(&r, &title, p)
            })
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
                super::sim::check_plot("--plot", p)?;
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
            report(json, r.to_json(), r.table(), plot, |p| {
                braid_lab::overlay::draw(&r, &format!("braid lab overlay: direct {direct}"), p)
            })
        }
        LabCommand::StreamGen {
            rate,
            size,
            duration,
            to,
            report,
        } => {
            let rate = braid_proto::units::parse_rate(&rate)
                .map_err(|e| anyhow::anyhow!("--rate '{rate}': {e}"))?;
            let duration = braid_proto::units::parse_duration(&duration)
                .with_context(|| format!("--duration '{duration}'"))?;
            let to =
                braid_lab::stream::Endpoint::parse(&to).map_err(|e| anyhow::anyhow!("--to {e}"))?;
            let r = braid_lab::stream::generate(rate, size, duration, to)
                .map_err(|e| anyhow::anyhow!("stream-gen: {e}"))?;
            std::fs::write(&report, r.to_json().to_string())
                .with_context(|| format!("writing {}", report.display()))?;
            Ok(())
        }
        LabCommand::StreamSink {
            size,
            from,
            idle,
            wait,
            report,
        } => {
            let from = braid_lab::stream::Endpoint::parse(&from)
                .map_err(|e| anyhow::anyhow!("--from {e}"))?;
            let idle = braid_proto::units::parse_duration(&idle)
                .with_context(|| format!("--idle '{idle}'"))?;
            let wait = braid_proto::units::parse_duration(&wait)
                .with_context(|| format!("--wait '{wait}'"))?;
            let r = braid_lab::stream::sink(size, from, idle, wait)
                .map_err(|e| anyhow::anyhow!("stream-sink: {e}"))?;
            std::fs::write(&report, r.to_json().to_string())
                .with_context(|| format!("writing {}", report.display()))?;
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

/// Check `lab stream`'s options; errors name the option at fault.
#[allow(clippy::too_many_arguments)]
fn stream_options(
    links: &str,
    duration: &str,
    rate: &str,
    size: usize,
    tolerances: &[String],
    deadline: Option<&str>,
    srt: bool,
    single: bool,
    srt_latency: Option<&str>,
    srt_rtt_factor: f64,
    seed: u64,
) -> Result<braid_lab::stream::StreamOptions> {
    use braid_proto::units::{parse_duration, parse_rate};
    let links = LinkSpec::parse_list(links).context("--links")?;
    let duration = parse_duration(duration)
        .ok()
        .filter(|d| d.as_secs() >= 1 && d.as_secs() <= 3600)
        .with_context(|| format!("--duration '{duration}': expected e.g. 20s (1s to 1h)"))?;
    let rate_bps = parse_rate(rate)
        .ok()
        .filter(|&r| (8_000..=1_000_000_000).contains(&r))
        .with_context(|| format!("--rate '{rate}': expected e.g. 8mbit (8kbit to 1gbit)"))?;
    braid_lab::stream::check_size(size).map_err(|e| anyhow::anyhow!("--size: {e}"))?;
    if size > 1400 {
        bail!("--size {size}: a record must fit one packet of a 1500-byte link (at most 1400)");
    }
    if tolerances.is_empty() {
        bail!("--tolerance: give at least one W,E,B");
    }
    let tolerances = tolerances
        .iter()
        .map(|t| {
            braid_io::transfer::parse_tolerance(t)
                .map(|t| [t.w, t.e, t.b])
                .map_err(|e| anyhow::anyhow!("--tolerance: {e}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let deadline = match deadline {
        Some(d) => Some(parse_duration(d).with_context(|| format!("--deadline '{d}'"))?),
        None => None,
    };
    let srt_latency = match srt_latency {
        Some(d) => Some(
            parse_duration(d)
                .ok()
                .filter(|d| d.as_millis() >= 1)
                .with_context(|| format!("--srt-latency '{d}': expected e.g. 40ms"))?,
        ),
        None => None,
    };
    if !(srt_rtt_factor.is_finite() && srt_rtt_factor > 0.0 && srt_rtt_factor <= 100.0) {
        bail!(
            "--srt-rtt-factor {srt_rtt_factor}: expected a number above 0 (3 to 4 is SRT's advice)"
        );
    }
    Ok(braid_lab::stream::StreamOptions {
        links,
        duration,
        rate_bps,
        size,
        tolerances,
        deadline,
        srt,
        single,
        srt_latency,
        srt_rtt_factor,
        exe: std::env::current_exe().context("locating the braid binary")?,
        seed,
    })
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

/// `on` or `off` (also `true`/`false`).
fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err(format!("'{s}': expected on or off")),
    }
}
