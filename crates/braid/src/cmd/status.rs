//! `braid status`: the flags and the work are `braid_io::status`; this hands it
//! standard output.

use std::io::IsTerminal;

use anyhow::Result;

pub use braid_io::status::StatusArgs as Args;

/// Run `braid status`.
pub fn run(a: Args) -> Result<()> {
    let out = std::io::stdout();
    a.run(&mut out.lock(), out.is_terminal())
}
