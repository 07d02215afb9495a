//! `braid schedule`: which channel each packet of a burst takes, and the implicit packet
//! numbers (round, deficit counter) the receiver will reproduce, with no network: the
//! striper of `braid-proto` alone, every packet at once, no channel draining.

use std::fmt::Write as _;

use braid_proto::{Mode, Policy, SchedulerKind, StripeConfig, Striper, TransmitKind};
use bytes::Bytes;

/// `writeln!` into a `String`, which cannot fail.
macro_rules! w {
    ($($t:tt)*) => {
        let _ = writeln!($($t)*);
    };
}

/// Arguments of `braid schedule`.
#[derive(clap::Args, Debug)]
pub struct ScheduleArgs {
    /// Scheduler: srr, rr, grr, random, or the baselines sqf (shortest queue first: the
    /// channel with the fewest bytes queued; here every packet arrives at once and
    /// nothing drains, so the fewest bytes so far) and hash (one flow, one channel).
    #[arg(long, default_value = "srr")]
    pub scheduler: String,
    /// Per-channel weights, comma-separated: SRR quanta in bytes, GRR packets per round,
    /// random relative probabilities.
    #[arg(long, default_value = "1500,1500")]
    pub weights: String,
    /// Packet sizes to stripe, comma-separated; the list is repeated `--repeat` times.
    #[arg(long, default_value = "1000,200")]
    pub sizes: String,
    /// How many times to repeat the size list.
    #[arg(long, default_value_t = 4)]
    pub repeat: usize,
    /// Largest packet, in bytes (SRR quanta must be at least this).
    #[arg(long, default_value_t = 1500)]
    pub max_packet: u32,
    /// Seed for the random scheduler.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

impl ScheduleArgs {
    /// The output of `braid schedule` for these flags (see [`table`]).
    pub fn table(&self) -> Result<String, String> {
        table(
            &self.scheduler,
            &self.weights,
            &self.sizes,
            self.repeat,
            self.max_packet,
            self.seed,
        )
    }
}

fn parse_list(what: &str, s: &str) -> Result<Vec<u32>, String> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<u32>()
                .map_err(|e| format!("--{what}: '{x}' is not a whole number: {e}"))
        })
        .collect()
}

/// The output of `braid schedule`: one line per data packet, then bytes per channel.
pub fn table(
    scheduler: &str,
    weights: &str,
    sizes: &str,
    repeat: usize,
    max_packet: u32,
    seed: u64,
) -> Result<String, String> {
    let mut out = String::new();
    let weights = parse_list("weights", weights)?;
    let sizes = parse_list("sizes", sizes)?;
    if sizes.contains(&0) {
        return Err("--sizes: packet sizes must be at least 1 byte".into());
    }
    let mut s = striper(scheduler, weights, max_packet, seed)?;
    let mut bytes = vec![0u64; s.config().channels()];
    w!(
        out,
        "{:>6} {:>6} {:>8} {:>8} {:>8}",
        "packet",
        "size",
        "channel",
        "round",
        "dc"
    );
    for (i, &size) in sizes.iter().cycle().take(sizes.len() * repeat).enumerate() {
        stripe_packet(&mut s, &mut bytes, i, size, &mut out)?;
    }
    out.push('\n');
    for (c, b) in bytes.iter().enumerate() {
        w!(out, "channel {c}: {b} bytes");
    }
    Ok(out)
}

/// Stripe packet `i` of the burst (`size` bytes): tell the striper each channel's
/// backlog (`bytes`, every byte given to it so far), hand it the packet, add what it sends
/// to `bytes`, and write one row per data transmission with the scheduler's position
/// (round, deficit counter) before the packet, or `-` for a baseline.
fn stripe_packet(
    s: &mut Striper,
    bytes: &mut [u64],
    i: usize,
    size: u32,
    out: &mut String,
) -> Result<(), String> {
    // The packets form one burst and no channel drains: a channel's queue holds
    // every byte given to it so far (what shortest-queue-first reads).
    for (c, b) in bytes.iter().enumerate() {
        s.set_backlog(c, *b);
    }
    let pos = s.scheduler().map(|sch| sch.position(sch.select()));
    let mut p = vec![0u8; size as usize];
    p[0] = 0x45;
    s.handle_packet(braid_proto::Instant::ZERO, Bytes::from(p))
        .map_err(|e| e.to_string())?;
    while let Some(t) = s.poll_transmit() {
        if t.kind != TransmitKind::Data {
            continue;
        }
        bytes[t.channel] += t.len() as u64;
        let (round, dc) = match pos {
            Some(p) => (p.round.to_string(), p.dc.to_string()),
            None => ("-".to_string(), "-".to_string()),
        };
        w!(
            out,
            "{:>6} {:>6} {:>8} {:>8} {:>8}",
            i,
            size,
            t.channel,
            round,
            dc
        );
    }
    Ok(())
}

/// The striper of `braid schedule`: the scheduler (the random one seeded with `seed`)
/// over `weights`, logical reception (arrival order for a baseline), no periodic
/// markers.
fn striper(
    scheduler: &str,
    weights: Vec<u32>,
    max_packet: u32,
    seed: u64,
) -> Result<Striper, String> {
    let policy = match braid_proto::units::parse_policy(scheduler)
        .map_err(|e| format!("--scheduler: {e}"))?
    {
        Policy::Causal(SchedulerKind::Random { .. }) => {
            Policy::Causal(SchedulerKind::Random { seed })
        }
        p => p,
    };
    let mut cfg = StripeConfig::srr(weights, max_packet);
    cfg.policy = policy;
    cfg.mode = if matches!(policy, Policy::Baseline(_)) {
        Mode::None
    } else {
        Mode::Logical
    };
    cfg.markers.every_rounds = 0;
    Striper::new(cfg).map_err(|e| format!("invalid configuration: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_of(scheduler: &str, weights: &str, sizes: &str) -> Result<String, String> {
        table(scheduler, weights, sizes, 4, 1500, 1)
    }

    /// The channel of each packet, from the table.
    fn channels(t: &str) -> Vec<usize> {
        t.lines()
            .skip(1)
            .take_while(|l| !l.is_empty())
            .map(|l| l.split_whitespace().nth(2).unwrap().parse().unwrap())
            .collect()
    }

    /// Shortest queue first reads the channels' backlog: fed the bytes each channel got
    /// so far, it spreads the burst by bytes. Before, nothing set the backlog and every
    /// packet went to channel 0.
    #[test]
    fn sqf_balances_the_burst_by_queued_bytes() {
        let t = table_of("sqf", "1500,1500", "1000,200").unwrap();
        assert_eq!(channels(&t), [0, 1, 1, 0, 0, 1, 1, 0], "{t}");
        assert!(t.contains("channel 0: 2400 bytes") && t.contains("channel 1: 2400 bytes"));
        let t = table_of("sqf", "1500,1500,1500", "1500,64,64,700").unwrap();
        assert_eq!(channels(&t)[..4], [0, 1, 2, 1], "{t}");
        // It differs from the causal schedulers on the same input.
        let srr = table_of("srr", "1500,1500", "1000,200").unwrap();
        assert_ne!(channels(&srr), [0, 1, 1, 0, 0, 1, 1, 0]);
    }
}
