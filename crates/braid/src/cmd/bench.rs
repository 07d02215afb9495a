//! `braid bench`: the flags and the work are `braid_io::bench`; this runs it and prints
//! the report.

use anyhow::Result;

pub use braid_io::bench::BenchArgs as Args;

use super::tunnel::{init_tracing, runtime, shutdown_signal};

/// Run `braid bench`.
pub fn run(a: Args) -> Result<()> {
    init_tracing();
    let report = runtime()?.block_on(a.run(shutdown_signal()))?;
    print!("{report}");
    Ok(())
}
