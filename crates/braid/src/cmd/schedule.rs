//! `braid schedule`: show which channel each packet takes, and the implicit packet
//! numbers (round, deficit counter) the receiver will reproduce.

use anyhow::{bail, Context, Result};
use braid_proto::{Mode, Policy, SchedulerKind, StripeConfig, Striper, TransmitKind};
use bytes::Bytes;

/// Arguments of `braid schedule`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Scheduler: srr, rr, grr, random, sqf (shortest queue first) or hash.
    #[arg(long, default_value = "srr")]
    scheduler: String,
    /// Per-channel weights, comma-separated: SRR quanta in bytes, GRR packets per round,
    /// random relative probabilities.
    #[arg(long, default_value = "1500,1500")]
    weights: String,
    /// Packet sizes to stripe, comma-separated; the list is repeated `--repeat` times.
    #[arg(long, default_value = "1000,200")]
    sizes: String,
    /// How many times to repeat the size list.
    #[arg(long, default_value_t = 4)]
    repeat: usize,
    /// Largest packet, in bytes (SRR quanta must be at least this).
    #[arg(long, default_value_t = 1500)]
    max_packet: u32,
    /// Seed for the random scheduler.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn parse_list(what: &str, s: &str) -> Result<Vec<u32>> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<u32>()
                .with_context(|| format!("--{what}: '{x}' is not a whole number"))
        })
        .collect()
}

/// Run `braid schedule`.
pub fn run(a: Args) -> Result<()> {
    let weights = parse_list("weights", &a.weights)?;
    let sizes = parse_list("sizes", &a.sizes)?;
    if sizes.contains(&0) {
        bail!("--sizes: packet sizes must be at least 1 byte");
    }
    let policy = match braid_proto::units::parse_policy(&a.scheduler).context("--scheduler")? {
        Policy::Causal(SchedulerKind::Random { .. }) => {
            Policy::Causal(SchedulerKind::Random { seed: a.seed })
        }
        p => p,
    };
    let mut cfg = StripeConfig::srr(weights, a.max_packet);
    cfg.policy = policy;
    cfg.mode = if matches!(policy, Policy::Baseline(_)) {
        Mode::None
    } else {
        Mode::Logical
    };
    cfg.markers.every_rounds = 0;
    let n = cfg.channels();
    let mut s = Striper::new(cfg).context("invalid configuration")?;
    let mut bytes = vec![0u64; n];
    println!(
        "{:>6} {:>6} {:>8} {:>8} {:>8}",
        "packet", "size", "channel", "round", "dc"
    );
    let now = braid_proto::Instant::ZERO;
    for (i, &size) in sizes
        .iter()
        .cycle()
        .take(sizes.len() * a.repeat)
        .enumerate()
    {
        let pos = s.scheduler().map(|sch| sch.position(sch.select()));
        let mut p = vec![0u8; size as usize];
        p[0] = 0x45;
        s.handle_packet(now, Bytes::from(p))?;
        while let Some(t) = s.poll_transmit() {
            if t.kind != TransmitKind::Data {
                continue;
            }
            bytes[t.channel] += t.len() as u64;
            match pos {
                Some(p) => println!(
                    "{:>6} {:>6} {:>8} {:>8} {:>8}",
                    i, size, t.channel, p.round, p.dc
                ),
                None => println!(
                    "{:>6} {:>6} {:>8} {:>8} {:>8}",
                    i, size, t.channel, "-", "-"
                ),
            }
        }
    }
    println!();
    for (c, b) in bytes.iter().enumerate() {
        println!("channel {c}: {b} bytes");
    }
    Ok(())
}
