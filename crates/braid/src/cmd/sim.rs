//! `braid sim`: run a scenario file in the deterministic simulator. The flags and the
//! run are `braid_sim::args`; this prints, with a progress bar on a terminal.

use std::io::IsTerminal;

use anyhow::Result;

pub use braid_sim::args::SimArgs as Args;

/// Run `braid sim`.
pub fn run(a: Args) -> Result<()> {
    let tty = std::io::stderr().is_terminal();
    let progress = move |done: usize, total: usize| {
        if tty && total > 1 {
            let width = 30;
            let filled = done * width / total.max(1);
            eprint!(
                "\r[{}{}] {done}/{total} runs",
                "#".repeat(filled),
                " ".repeat(width - filled)
            );
            if done == total {
                eprintln!();
            }
        }
    };
    a.run(&mut std::io::stdout().lock(), &progress)
}
