//! `braid lab`: the namespace testbed with braid's own link emulator. The subcommands
//! and their run are `braid_lab::cmd`, each lab's flags `braid_lab::args`; this hands
//! them standard output and prints progress on standard error.

use anyhow::Result;

pub use braid_lab::cmd::LabArgs as Args;

/// Run `braid lab`.
pub fn run(a: Args) -> Result<()> {
    a.run(&mut std::io::stdout(), |line| eprintln!("{line}"))
}
