//! `braid completions SHELL` and `braid man DIR`: shell completions and man pages
//! generated from the clap definitions that also make `--help`, so they cannot drift
//! from it. `scripts/package.sh` runs both for the Debian package.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap_complete::Shell;

/// Arguments of `braid completions`.
#[derive(clap::Args, Debug)]
pub struct CompletionArgs {
    /// The shell: bash, zsh, fish, elvish or powershell. Install, e.g.:
    /// `braid completions bash > /etc/bash_completion.d/braid`,
    /// `braid completions zsh > /usr/local/share/zsh/site-functions/_braid`,
    /// `braid completions fish > ~/.config/fish/completions/braid.fish`.
    #[arg(value_enum)]
    shell: Shell,
}

/// Arguments of `braid man`.
#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// Directory to write the pages into (created if missing); view one with
    /// `man DIR/braid.1`.
    dir: PathBuf,
}

/// Print the completion script.
pub fn completions(a: CompletionArgs) -> Result<()> {
    let mut cmd = crate::cli_command();
    let mut buf = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "braid", &mut buf);
    std::io::stdout()
        .lock()
        .write_all(&buf)
        .context("writing the completion script to standard output")
}

/// Write braid.1 and a page per subcommand into `a.dir`.
pub fn man(a: ManArgs) -> Result<()> {
    std::fs::create_dir_all(&a.dir)
        .with_context(|| format!("creating the directory {}", a.dir.display()))?;
    let cmd = crate::cli_command();
    // One page per subcommand (braid-tunnel.1, braid-lab-bench.1, ...), and braid.1.
    clap_mangen::generate_to(cmd.clone(), &a.dir)
        .with_context(|| format!("writing man pages into {}", a.dir.display()))?;
    // braid.1 again with an EXIT STATUS section in place of the generic EXTRA one.
    let top = a.dir.join("braid.1");
    let mut page = Vec::new();
    render_top(cmd, &mut page).context("rendering braid.1")?;
    std::fs::write(&top, page).with_context(|| format!("writing {}", top.display()))?;
    let n = std::fs::read_dir(&a.dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "1"))
        .count();
    eprintln!("wrote {n} man pages into {}", a.dir.display());
    Ok(())
}

/// The top page: clap_mangen's sections, then EXIT STATUS from the text `--help` shows.
fn render_top(mut cmd: clap::Command, w: &mut Vec<u8>) -> std::io::Result<()> {
    cmd.build();
    let man = clap_mangen::Man::new(cmd);
    man.render_title(w)?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    man.render_description_section(w)?;
    man.render_options_section(w)?;
    man.render_subcommands_section(w)?;
    writeln!(w, ".SH \"EXIT STATUS\"")?;
    for line in crate::exit_status_text().lines().skip(1) {
        let line = line.trim_start();
        if let Some((code, text)) = line
            .split_once(' ')
            .filter(|(c, _)| !c.is_empty() && c.chars().all(|ch| ch.is_ascii_digit()))
        {
            writeln!(w, ".TP\n.B {code}")?;
            writeln!(w, "{}", escape(text.trim_start()))?;
        } else {
            writeln!(w, "{}", escape(line))?;
        }
    }
    writeln!(w, ".SH FILES")?;
    writeln!(w, ".TP\n/etc/braid/NAME.toml")?;
    writeln!(
        w,
        "The configuration of the systemd service braid@NAME (braid tunnel \\-\\-config /etc/braid/NAME.toml)."
    )?;
    writeln!(w, ".TP\n/usr/share/doc/braid/examples/")?;
    writeln!(w, "Example configurations of the two ends of a tunnel.")?;
    man.render_version_section(w)?;
    Ok(())
}

/// Text safe in a roff line: backslashes and hyphens escaped, no leading dot or quote.
fn escape(s: &str) -> String {
    let s = s.replace('\\', "\\\\").replace('-', "\\-");
    if s.starts_with('.') || s.starts_with('\'') {
        format!("\\&{s}")
    } else {
        s
    }
}
