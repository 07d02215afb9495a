//! `braid tunnel --config FILE`: the strIPe virtual interface (seed 000 §6.1). A TUN
//! device below IP; the packets the kernel routes into it are striped over the
//! configured UDP channels, and the peer resequences them and writes them to its own
//! TUN device. See docs/tunnel.md.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use braid_io::args::parse_timeout;
use braid_io::{tunnel, FileConfig};

/// Arguments of `braid tunnel`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Configuration file (TOML): [tunnel], [session] and one [[channel]] per path.
    #[arg(long)]
    config: PathBuf,
    /// Serve Prometheus metrics at http://ADDR/metrics (overrides tunnel.metrics).
    #[arg(long)]
    metrics: Option<SocketAddr>,
    /// Control socket for `braid status` (overrides tunnel.control).
    #[arg(long)]
    control: Option<PathBuf>,
    /// Give up if the peer has not answered within this time (0: wait forever).
    #[arg(long, default_value = "60s")]
    peer_timeout: String,
}

/// Log to stderr; RUST_LOG overrides the default level `info`.
pub(crate) fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// A tokio runtime with two workers (the sockets' readers and the driver).
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Resolves when SIGINT or SIGTERM arrives.
pub(crate) async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return "SIGINT";
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}

/// Run `braid tunnel`.
pub fn run(a: Args) -> Result<()> {
    init_tracing();
    let fc = FileConfig::load(&a.config)?;
    let Some(t) = fc.tunnel.clone() else {
        bail!(
            "config {}: tunnel: missing [tunnel] section (name, address) needed by braid tunnel",
            a.config.display()
        );
    };
    let peer_timeout = parse_timeout(&a.peer_timeout, "--peer-timeout")?;
    let observers = tunnel::Observers {
        control: Some(tunnel::control_path(a.control.as_deref(), &t)),
        metrics: a.metrics.or(t.metrics),
        log_interval: t.log_interval,
    };
    runtime()?.block_on(tunnel::run(
        &t,
        fc.session,
        observers,
        peer_timeout,
        shutdown_signal(),
    ))?;
    Ok(())
}
