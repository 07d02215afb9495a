//! `braid schedule`: show which channel each packet takes, and the implicit packet
//! numbers (round, deficit counter) the receiver will reproduce. The flags and the
//! table are `braid_sim::schedule`.

use anyhow::Result;

pub use braid_sim::schedule::ScheduleArgs as Args;

/// Run `braid schedule`.
pub fn run(a: Args) -> Result<()> {
    print!("{}", a.table().map_err(anyhow::Error::msg)?);
    Ok(())
}
