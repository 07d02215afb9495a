//! Logging for the `braid` commands: to stderr (the journal under systemd) with a level
//! from, in this order: the command line (`--log-level`, `-v`, `-q`), `RUST_LOG`, the
//! tunnel configuration's `tunnel.log_level`, else `info`. A running tunnel changes it
//! on reload when it came from the configuration.

use std::sync::OnceLock;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

/// The logging flags, global: they go before or after the subcommand.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LogArgs {
    /// Log level: off, error, warn, info, debug or trace. Default: RUST_LOG if set
    /// (which also takes per-module directives, e.g. braid_io=debug), else the tunnel
    /// configuration's tunnel.log_level, else info. Logs go to standard error.
    #[arg(long, global = true, value_name = "LEVEL", value_parser = LEVELS)]
    pub log_level: Option<String>,
    /// More detail in the log: -v debug, -vv trace.
    #[arg(short, long, global = true, action = clap::ArgAction::Count, conflicts_with_all = ["quiet", "log_level"])]
    pub verbose: u8,
    /// Less: -q warnings and errors only, -qq errors only.
    #[arg(short, long, global = true, action = clap::ArgAction::Count, conflicts_with = "log_level")]
    pub quiet: u8,
}

/// The levels `--log-level` and `tunnel.log_level` accept.
pub const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

impl LogArgs {
    /// The level the command line asks for, if it asks.
    pub fn level(&self) -> Option<&'static str> {
        if let Some(l) = &self.log_level {
            return LEVELS.iter().copied().find(|x| x.eq_ignore_ascii_case(l));
        }
        match (self.verbose, self.quiet) {
            (0, 0) => None,
            (1, _) => Some("debug"),
            (v, _) if v >= 2 => Some("trace"),
            (_, 1) => Some("warn"),
            _ => Some("error"),
        }
    }
}

/// Where the log level came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `--log-level`, `-v` or `-q`.
    CommandLine,
    /// The `RUST_LOG` environment variable.
    Env,
    /// `tunnel.log_level` in the configuration file.
    Config,
    /// Nothing set it: `info`.
    Default,
}

/// The installed logger: its level can change while it runs.
pub struct Logger {
    handle: reload::Handle<EnvFilter, Registry>,
    /// Where the level in force came from.
    pub source: Source,
}

impl Logger {
    /// Set the level from the configuration (`None`: the default, `info`), unless the
    /// command line or RUST_LOG chose it. Returns a message for the log.
    pub fn set_config_level(&mut self, level: Option<&str>) -> Result<String, String> {
        match self.source {
            Source::CommandLine => {
                return Err("tunnel.log_level changed, but the command line's --log-level/-v/-q sets the level; it stays".into())
            }
            Source::Env => {
                return Err("tunnel.log_level changed, but RUST_LOG sets the level; it stays".into())
            }
            Source::Config | Source::Default => {}
        }
        let l = level.unwrap_or("info");
        self.handle
            .reload(EnvFilter::new(l))
            .map_err(|e| format!("changing the log level: {e}"))?;
        self.source = if level.is_some() {
            Source::Config
        } else {
            Source::Default
        };
        Ok(format!("log level now {l}"))
    }
}

static CLI: OnceLock<LogArgs> = OnceLock::new();

/// Remember the command line's logging flags (main, once).
pub fn set_cli(a: LogArgs) {
    let _ = CLI.set(a);
}

/// Start logging to stderr, with `config_level` (a tunnel's `tunnel.log_level`) below
/// the command line and RUST_LOG. `None` if a logger is already installed.
pub fn init(config_level: Option<&str>) -> Option<Logger> {
    let cli = CLI.get().cloned().unwrap_or_default();
    let env = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .and_then(|v| EnvFilter::try_new(v).ok());
    let (filter, source) = if let Some(l) = cli.level() {
        (EnvFilter::new(l), Source::CommandLine)
    } else if let Some(f) = env {
        (f, Source::Env)
    } else if let Some(l) = config_level {
        (EnvFilter::new(l), Source::Config)
    } else {
        (EnvFilter::new("info"), Source::Default)
    };
    let (filter, handle) = reload::Layer::new(filter);
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .try_init()
        .ok()?;
    Some(Logger { handle, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(log_level: Option<&str>, verbose: u8, quiet: u8) -> LogArgs {
        LogArgs {
            log_level: log_level.map(String::from),
            verbose,
            quiet,
        }
    }

    #[test]
    fn flags_map_to_levels() {
        assert_eq!(args(None, 0, 0).level(), None);
        assert_eq!(args(None, 1, 0).level(), Some("debug"));
        assert_eq!(args(None, 3, 0).level(), Some("trace"));
        assert_eq!(args(None, 0, 1).level(), Some("warn"));
        assert_eq!(args(None, 0, 2).level(), Some("error"));
        assert_eq!(args(Some("DEBUG"), 0, 0).level(), Some("debug"));
    }
}
