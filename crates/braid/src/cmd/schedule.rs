//! `braid schedule`: show which channel each packet takes, and the implicit packet
//! numbers (round, deficit counter) the receiver will reproduce.

use anyhow::Result;

/// Arguments of `braid schedule`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Scheduler: srr, rr, grr, random, or the baselines sqf (shortest queue first: the
    /// channel with the fewest bytes queued; here every packet arrives at once and
    /// nothing drains, so the fewest bytes so far) and hash (one flow, one channel).
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

/// Run `braid schedule`.
pub fn run(a: Args) -> Result<()> {
    let t = braid_sim::schedule::table(
        &a.scheduler,
        &a.weights,
        &a.sizes,
        a.repeat,
        a.max_packet,
        a.seed,
    )
    .map_err(anyhow::Error::msg)?;
    print!("{t}");
    Ok(())
}
