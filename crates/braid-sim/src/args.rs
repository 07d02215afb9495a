//! The flags of `braid sim`, declared once with clap (the `braid` CLI puts them in its
//! command tree), and the run of a scenario file of any kind (striping, credit,
//! overlay), written to the output the CLI gives.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use crate::{plot, report, scenario};

/// The flags of `braid sim`.
#[derive(clap::Args, Debug)]
pub struct SimArgs {
    /// Scenario file (TOML; see docs/scenarios.md).
    pub file: PathBuf,
    /// Seed for every random process (default: the scenario's `seed`, else 1).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also draw the scenario's plot to this file (.svg or .png): the swept parameter on
    /// the x axis, one line per run.
    #[arg(long, value_name = "OUT.svg|OUT.png")]
    pub plot: Option<PathBuf>,
    /// Worker threads for the runs (default: the available cores). Results do not depend
    /// on it.
    #[arg(long)]
    pub threads: Option<usize>,
}

/// What a run reports while it goes: (runs done, runs in all).
pub type Progress<'a> = &'a (dyn Fn(usize, usize) + Sync);

impl SimArgs {
    /// Run the file and write its table (or JSON) to `out`; draw the plot if asked.
    pub fn run(&self, out: &mut impl Write, progress: Progress) -> Result<()> {
        let format = match &self.plot {
            None => None,
            Some(p) => Some(plot::check_path("--plot", p).map_err(anyhow::Error::msg)?),
        };
        if crate::overlay::is_overlay_file(&self.file) {
            self.run_overlay(out, format)
        } else if crate::credit::is_credit_file(&self.file) {
            self.run_credit(out)
        } else {
            self.run_scenario(out, format, progress)
        }
    }

    fn text(&self, json: String, table: String) -> String {
        if self.json {
            json + "\n"
        } else {
            table
        }
    }

    /// After the table: say where the plot went (not with JSON, which stays one object).
    fn plot_written(&self, out: &mut impl Write, path: &std::path::Path) -> Result<()> {
        if !self.json {
            writeln!(out, "plot written to {}", path.display())?;
        }
        Ok(())
    }

    fn run_overlay(&self, out: &mut impl Write, format: Option<plot::Format>) -> Result<()> {
        let sc = crate::overlay::load(&self.file)?;
        if self.plot.is_some() && sc.gain.is_none() {
            bail!(
                "--plot: {} has no [gain] experiment, and only its gain CDF is plotted",
                self.file.display()
            );
        }
        let rep = crate::overlay::run_scenario(&sc, self.seed.unwrap_or(sc.seed))
            .with_context(|| format!("{}", self.file.display()))?;
        write!(out, "{}", self.text(rep.to_json(), rep.to_table()))?;
        if let (Some(path), Some(format)) = (&self.plot, format) {
            crate::overlay::plot::draw(&rep, path, format)
                .with_context(|| format!("--plot {}", path.display()))?;
            self.plot_written(out, path)?;
        }
        Ok(())
    }

    fn run_credit(&self, out: &mut impl Write) -> Result<()> {
        let sc = crate::credit::load(&self.file)?;
        let rep = crate::credit::run_scenario(&sc, self.seed.unwrap_or(sc.seed));
        write!(out, "{}", self.text(rep.to_json(), rep.to_table()))?;
        Ok(())
    }

    fn run_scenario(
        &self,
        out: &mut impl Write,
        format: Option<plot::Format>,
        progress: Progress,
    ) -> Result<()> {
        let sc = scenario::load(&self.file)?;
        if self.plot.is_some() && sc.plot.x.is_none() {
            bail!(
                "--plot: {} has no [[sweep]], so there is nothing to put on the x axis",
                self.file.display()
            );
        }
        let seed = self.seed.unwrap_or(sc.seed);
        let threads = self.threads.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        });
        if threads == 0 {
            bail!("--threads must be at least 1");
        }
        let rep = report::run_scenario(&sc, seed, threads, progress)?;
        write!(out, "{}", self.text(rep.to_json(), rep.to_table()))?;
        if let (Some(path), Some(format)) = (&self.plot, format) {
            plot::draw(&sc, &rep, path, format)
                .with_context(|| format!("--plot {}", path.display()))?;
            self.plot_written(out, path)?;
        }
        Ok(())
    }
}
