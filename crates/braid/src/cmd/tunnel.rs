//! `braid tunnel --config FILE`: the strIPe virtual interface (seed 000 §6.1). A TUN
//! device below IP; the packets the kernel routes into it are striped over the
//! configured UDP channels, and the peer resequences them and writes them to its own
//! TUN device. See docs/tunnel.md.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use braid_io::observe::{serve_control, serve_metrics, ControlServer};
use braid_io::tun::Tun;
use braid_io::{FileConfig, Session, SessionError, StatsHandle};
use bytes::Bytes;
use tracing::{debug, error, info, warn};

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

/// Start the optional control socket and metrics endpoint.
pub(crate) async fn observers(
    control: Option<&Path>,
    metrics: Option<SocketAddr>,
    stats: StatsHandle,
) -> Result<Option<ControlServer>> {
    let ctl = match control {
        Some(p) => {
            let s = serve_control(p, stats.clone())
                .with_context(|| format!("control socket {}", p.display()))?;
            info!(
                "control socket at {} (braid status --control {})",
                p.display(),
                p.display()
            );
            Some(s)
        }
        None => None,
    };
    if let Some(addr) = metrics {
        let (local, _task) = serve_metrics(addr, stats)
            .await
            .with_context(|| format!("metrics endpoint: cannot listen on {addr}"))?;
        info!("Prometheus metrics at http://{local}/metrics");
    }
    Ok(ctl)
}

/// Log a one-line summary every `every` (never if zero).
pub(crate) fn spawn_summary(stats: StatsHandle, every: Duration) {
    if every.is_zero() {
        return;
    }
    tokio::spawn(async move {
        let mut t = tokio::time::interval(every);
        t.tick().await;
        loop {
            t.tick().await;
            match stats.get().await {
                Ok(s) => info!("{}", s.log_line()),
                Err(_) => return,
            }
        }
    });
}

pub(crate) fn parse_timeout(s: &str, what: &str) -> Result<Option<Duration>> {
    let d = braid_proto::units::parse_duration(s).map_err(|e| anyhow!("{what}: {e}"))?;
    Ok(if d.is_zero() { None } else { Some(d) })
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
    let rt = runtime()?;
    rt.block_on(async move {
        let s = &fc.session;
        let mtu = t.mtu.unwrap_or(s.max_inner() - s.data_overhead());
        let tun = Tun::create(&t.name)?;
        tun.set_mtu(mtu)?;
        if let Some((addr, len)) = t.address {
            tun.set_ipv4(addr, len)?;
        }
        tun.up()?;
        info!(
            "TUN {} up, mtu {mtu}, mode {}, {} channels",
            tun.name(),
            s.mode.name(),
            s.channels.len()
        );
        let mut session = Session::start(fc.session.clone()).await?;
        let stats = session.stats_handle();
        let control = a
            .control
            .clone()
            .or(t.control.clone())
            .unwrap_or_else(|| PathBuf::from(format!("/run/braid/{}.sock", tun.name())));
        let _ctl = observers(Some(&control), a.metrics.or(t.metrics), stats.clone()).await?;
        spawn_summary(stats.clone(), t.log_interval);

        info!("waiting for the peer...");
        let wait = async {
            match peer_timeout {
                Some(d) => session.wait_for_peer(d).await,
                None => {
                    session
                        .wait_for_peer(Duration::from_secs(u64::MAX / 4))
                        .await
                }
            }
        };
        tokio::select! {
            r = wait => r?,
            sig = shutdown_signal() => {
                info!("{sig}: shutting down before the peer answered");
                return Ok(());
            }
        }
        info!("peer answered; forwarding");

        let tun = std::sync::Arc::new(tun);
        let sender = session.sender();
        let reader = {
            let tun = tun.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                loop {
                    let n = match tun.recv(&mut buf).await {
                        Ok(n) => n,
                        Err(e) => {
                            error!("reading the TUN device: {e}");
                            return;
                        }
                    };
                    match sender.send(Bytes::copy_from_slice(&buf[..n])).await {
                        Ok(()) => {}
                        Err(SessionError::Closed) => return,
                        Err(e) => debug!("packet not sent: {e}"),
                    }
                }
            })
        };
        let sig_fut = shutdown_signal();
        tokio::pin!(sig_fut);
        let sig = loop {
            tokio::select! {
                m = session.recv() => match m {
                    Some(p) => {
                        if let Err(e) = tun.send(&p).await {
                            warn!("writing {} bytes to the TUN device: {e}", p.len());
                        }
                    }
                    None => break "session end",
                },
                sig = &mut sig_fut => break sig,
            }
        };
        info!("{sig}: shutting down");
        reader.abort();
        if let Ok(s) = session.stats().await {
            info!("final: {}", s.log_line());
        }
        session.close().await;
        Ok::<(), anyhow::Error>(())
    })
}
