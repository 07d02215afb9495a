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

/// Check a plot's output path before anything runs (a lab run takes minutes): the name
/// ends in .svg or .png, and its folder exists. A missing folder is an error naming it,
/// not created: a mistyped path would otherwise scatter folders, and the plot is one
/// file like any other output (`>` and `braid recv` do not create folders either).
pub(crate) fn check_plot(flag: &str, p: &Path) -> Result<plot::Format> {
    let format = plot::Format::from_path(p).with_context(|| {
        format!(
            "{flag} {}: the file name must end in .svg or .png",
            p.display()
        )
    })?;
    if p.is_dir() {
        bail!(
            "{flag} {}: is a folder; give a file name ending in .svg or .png",
            p.display()
        );
    }
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(format),
        Ok(_) => bail!("{flag} {}: '{}' is not a folder", p.display(), dir.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "{flag} {}: the folder '{}' does not exist; create it first (mkdir -p {}) or choose another path",
            p.display(),
            dir.display(),
            dir.display()
        ),
        Err(e) => bail!("{flag} {}: folder '{}': {e}", p.display(), dir.display()),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plot_paths_are_checked_and_a_missing_folder_is_named() {
        let dir = std::env::temp_dir().join(format!("braid-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = |p: &Path| check_plot("--plot", p).unwrap_err().to_string();
        let missing = dir.join("results/fig.svg");
        let m = e(&missing);
        assert!(
            m.contains(&format!(
                "the folder '{}' does not exist",
                dir.join("results").display()
            )) && m.contains("mkdir -p"),
            "{m}"
        );
        assert!(!dir.join("results").exists(), "the folder was created");
        assert!(e(&dir.join("fig.pdf")).contains("must end in .svg or .png"));
        let file = dir.join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(e(&file.join("fig.svg")).contains("is not a folder"));
        let folder = dir.join("looks.svg");
        std::fs::create_dir_all(&folder).unwrap();
        assert!(e(&folder).contains("is a folder"));
        assert!(matches!(
            check_plot("--plot", &dir.join("fig.PNG")),
            Ok(plot::Format::Png)
        ));
        assert!(matches!(
            check_plot("--plot", Path::new("fig.svg")),
            Ok(plot::Format::Svg)
        ));
        let _ = std::fs::remove_dir_all(dir);
    }
}
