//! `braid sim`: run a scenario file in the deterministic simulator.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use braid_sim::{plot, report, scenario};

/// Arguments of `braid sim`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Scenario file (TOML; see docs/scenarios.md).
    file: PathBuf,
    /// Seed for every random process (default: the scenario's `seed`, else 1).
    #[arg(long)]
    seed: Option<u64>,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Also draw the scenario's plot to this file (.svg or .png): the swept parameter on
    /// the x axis, one line per run.
    #[arg(long, value_name = "OUT.svg|OUT.png")]
    plot: Option<PathBuf>,
    /// Worker threads for the runs (default: the available cores). Results do not depend
    /// on it.
    #[arg(long)]
    threads: Option<usize>,
}

/// Check a plot's output path before anything runs.
pub(crate) fn check_plot(flag: &str, p: &Path) -> Result<plot::Format> {
    plot::check_path(flag, p).map_err(anyhow::Error::msg)
}

/// Run `braid sim`.
pub fn run(a: Args) -> Result<()> {
    let format = match &a.plot {
        None => None,
        Some(p) => Some(check_plot("--plot", p)?),
    };
    if braid_sim::overlay::is_overlay_file(&a.file) {
        let sc = braid_sim::overlay::load(&a.file)?;
        if a.plot.is_some() && sc.gain.is_none() {
            bail!(
                "--plot: {} has no [gain] experiment, and only its gain CDF is plotted",
                a.file.display()
            );
        }
        let rep = braid_sim::overlay::run_scenario(&sc, a.seed.unwrap_or(sc.seed))
            .with_context(|| format!("{}", a.file.display()))?;
        print!(
            "{}",
            if a.json {
                rep.to_json() + "\n"
            } else {
                rep.to_table()
            }
        );
        if let (Some(path), Some(format)) = (&a.plot, format) {
            braid_sim::overlay::plot::draw(&rep, path, format)
                .with_context(|| format!("--plot {}", path.display()))?;
            if !a.json {
                println!("plot written to {}", path.display());
            }
        }
        return Ok(());
    }
    if braid_sim::credit::is_credit_file(&a.file) {
        let sc = braid_sim::credit::load(&a.file)?;
        let rep = braid_sim::credit::run_scenario(&sc, a.seed.unwrap_or(sc.seed));
        print!(
            "{}",
            if a.json {
                rep.to_json() + "\n"
            } else {
                rep.to_table()
            }
        );
        return Ok(());
    }
    let sc = scenario::load(&a.file)?;
    if a.plot.is_some() && sc.plot.x.is_none() {
        bail!(
            "--plot: {} has no [[sweep]], so there is nothing to put on the x axis",
            a.file.display()
        );
    }
    let seed = a.seed.unwrap_or(sc.seed);
    let threads = a.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    if threads == 0 {
        bail!("--threads must be at least 1");
    }
    let tty = std::io::stderr().is_terminal() && sc.jobs.len() > 1;
    let progress = move |done: usize, total: usize| {
        if tty {
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
    let rep = report::run_scenario(&sc, seed, threads, &progress)?;
    if a.json {
        println!("{}", rep.to_json());
    } else {
        print!("{}", rep.to_table());
    }
    if let (Some(path), Some(format)) = (&a.plot, format) {
        plot::draw(&sc, &rep, path, format)
            .with_context(|| format!("--plot {}", path.display()))?;
        if !a.json {
            println!("plot written to {}", path.display());
        }
    }
    Ok(())
}
