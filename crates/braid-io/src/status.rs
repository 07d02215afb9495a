//! `braid status`: read a running tunnel's (or bench's) control socket and print its
//! channels and counters; with `--watch`, again and again. The flags and the work; the
//! CLI hands in standard output.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

use crate::{FileConfig, SessionStats};

/// Arguments of `braid status`.
#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// The control socket (default: tunnel.control from --config, else /run/braid/NAME.sock).
    #[arg(long)]
    control: Option<PathBuf>,
    /// The tunnel's configuration file, to find its control socket.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print the raw JSON snapshot (with --watch: one compact JSON document a line).
    #[arg(long)]
    json: bool,
    /// Refresh every SECS seconds (default 1) until Ctrl-C: on a terminal the screen is
    /// redrawn in place, like `watch wg show`; otherwise successive snapshots are
    /// printed one after the other, each headed by the time.
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "1")]
    watch: Option<f64>,
}

impl StatusArgs {
    /// Query the control socket once (or every `--watch` period until Ctrl-C) and write
    /// the snapshot to `out`; `tty`: `out` is a terminal (redraw in place).
    pub fn run(&self, out: &mut impl Write, tty: bool) -> Result<()> {
        let path = self.control_path()?;
        let every = self.period()?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let Some(every) = every else {
            let s = rt.block_on(query(&path))?;
            return write_once(out, &s, self.json);
        };
        rt.block_on(watch(out, &path, every, self.json, tty))
    }

    /// `--control`, else the configuration's control socket, else the default.
    fn control_path(&self) -> Result<PathBuf> {
        Ok(match (&self.control, &self.config) {
            (Some(p), _) => p.clone(),
            (None, Some(c)) => {
                let fc = FileConfig::load(c)?;
                let t = fc
                    .tunnel
                    .ok_or_else(|| anyhow!("config {}: no [tunnel] section", c.display()))?;
                crate::tunnel::control_path(None, &t)
            }
            (None, None) => PathBuf::from("/run/braid/braid0.sock"),
        })
    }

    /// The `--watch` period, checked.
    fn period(&self) -> Result<Option<Duration>> {
        Ok(match self.watch {
            None => None,
            Some(s) if (0.05..=86_400.0).contains(&s) => Some(Duration::from_secs_f64(s)),
            Some(s) => bail!("--watch {s}: the period must be between 0.05 and 86400 seconds"),
        })
    }
}

async fn query(path: &Path) -> Result<SessionStats> {
    crate::observe::query_control(path)
        .await
        .map_err(|e| anyhow!(e))
}

fn write_once(out: &mut impl Write, s: &SessionStats, json: bool) -> Result<()> {
    let text = if json {
        serde_json::to_string_pretty(s)? + "\n"
    } else {
        s.table()
    };
    out.write_all(text.as_bytes())
        .context("writing to standard output")
}

/// Redraw (terminal) or append (anything else) a snapshot every `every` until Ctrl-C.
/// The first query must succeed (a wrong socket is an error at once); later failures
/// are shown and the watch goes on, so a restarting tunnel comes back on screen.
async fn watch(
    out: &mut impl Write,
    path: &Path,
    every: Duration,
    json: bool,
    tty: bool,
) -> Result<()> {
    let mut first = true;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = &mut ctrl_c => return Ok(()),
        }
        let r = query(path).await;
        if first {
            r.as_ref().map_err(|e| anyhow!("{e:#}"))?;
            first = false;
        }
        let body = match (&r, json) {
            (Ok(s), true) => serde_json::to_string(s)? + "\n",
            (Ok(s), false) => s.table(),
            (Err(e), true) => serde_json::json!({ "error": format!("{e:#}") }).to_string() + "\n",
            (Err(e), false) => format!("braid status: {e:#}\n"),
        };
        let frame = frame(&body, path, every, json, tty);
        out.write_all(frame.as_bytes())
            .and_then(|()| out.flush())
            .context("writing to standard output")?;
    }
}
/// One refresh. On a terminal: cursor home, a header, each line cleared to its end, the
/// rest of the screen cleared (a redraw without flicker). Otherwise: the header (unless
/// JSON, one document a line) and the snapshot, after a blank line.
fn frame(body: &str, path: &Path, every: Duration, json: bool, tty: bool) -> String {
    let now = humantime_now();
    let header = format!(
        "Every {:.1}s: braid status --control {}    {now}",
        every.as_secs_f64(),
        path.display()
    );
    if tty {
        let mut s = String::from("\x1b[H");
        for line in std::iter::once(header.as_str())
            .chain(std::iter::once(""))
            .chain(body.lines())
        {
            s.push_str(line);
            s.push_str("\x1b[K\n");
        }
        s.push_str("\x1b[J");
        s
    } else if json {
        body.to_string()
    } else {
        format!("{header}\n\n{body}\n")
    }
}

/// The wall-clock time, UTC, as HH:MM:SS.
fn humantime_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let d = secs % 86_400;
    format!("{:02}:{:02}:{:02} UTC", d / 3600, d / 60 % 60, d % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminal_frame_redraws_in_place_and_a_pipe_gets_snapshots() {
        let p = Path::new("/run/braid/x.sock");
        let t = frame("a\nb\n", p, Duration::from_secs(2), false, true);
        assert!(
            t.starts_with("\x1b[HEvery 2.0s: braid status --control /run/braid/x.sock"),
            "{t:?}"
        );
        assert!(t.contains("\x1b[K\na\x1b[K\nb\x1b[K\n"), "{t:?}");
        assert!(t.ends_with("\x1b[J"), "{t:?}");
        let f = frame("a\nb\n", p, Duration::from_secs(2), false, false);
        assert!(!f.contains('\x1b'), "{f:?}");
        assert!(
            f.starts_with("Every 2.0s: ") && f.ends_with("\n\na\nb\n\n"),
            "{f:?}"
        );
        assert_eq!(
            frame("{}\n", p, Duration::from_secs(2), true, false),
            "{}\n"
        );
    }
}
