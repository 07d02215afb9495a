//! `braid tunnel --config FILE`: the strIPe virtual interface (seed 000 §6.1). A TUN
//! device below IP; the packets the kernel routes into it are striped over the
//! configured UDP channels, and the peer resequences them and writes them to its own
//! TUN device. See docs/tunnel.md.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use braid_io::args::parse_timeout;
use braid_io::{tunnel, FileConfig, StatsHandle};
use sd_notify::NotifyState;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::oneshot;
use tracing::warn;

/// Arguments of `braid tunnel`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Configuration file (TOML): [tunnel], [session] and one [[channel]] per path;
    /// with [[peer]] sections, a server for those peers. SIGHUP (systemctl reload),
    /// or `reload` on the control socket (`braid peer add`/`remove`), re-reads it: new
    /// channel weights, a channel's local, remote and device (not on a server),
    /// tunnel.log_level and a server's peers apply at once; a channel added or removed
    /// (not on a server) applies with a new handshake, the TUN device staying; the log
    /// names the changes that need a restart.
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

/// Log to stderr at the level of the command line, else RUST_LOG, else `info`
/// (`crate::logging`).
pub(crate) fn init_tracing() {
    let _ = crate::logging::init(None);
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
    let fc = FileConfig::load(&a.config)?;
    let Some(t) = fc.tunnel.clone() else {
        bail!(
            "config {}: tunnel: missing [tunnel] section (name, address) needed by braid tunnel",
            a.config.display()
        );
    };
    let logger = crate::logging::init(t.log_level.as_deref());
    let peer_timeout = parse_timeout(&a.peer_timeout, "--peer-timeout")?;
    // `braid peer add`/`remove` ask for a reload through the control socket.
    let (reload_tx, reload_rx) = tokio::sync::mpsc::channel(4);
    let observers = tunnel::Observers {
        control: Some(tunnel::control_path(a.control.as_deref(), &t)),
        metrics: a.metrics.or(t.metrics),
        log_interval: t.log_interval,
        reload: Some(reload_tx),
    };
    runtime()?.block_on(async {
        // Registered first: SIGHUP's default action would end the tunnel.
        let hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
        let up = Arc::new(AtomicBool::new(false));
        let (handle_tx, handle_rx) = oneshot::channel();
        let hooks = tunnel::Hooks {
            started: Some(Box::new(move |h| {
                let _ = handle_tx.send(h);
            })),
            up: Some(Box::new({
                let up = up.clone();
                let n = fc.session.channels.len();
                move || {
                    up.store(true, Ordering::SeqCst);
                    notify(&[
                        NotifyState::Ready,
                        NotifyState::Status(&format!("forwarding over {n} channels")),
                    ]);
                }
            })),
        };
        notify(&[NotifyState::Status("waiting for the peer")]);
        let reloader = tokio::spawn(reload_on_hangup(
            hup,
            reload_rx,
            handle_rx,
            a.config.clone(),
            fc.clone(),
            logger,
            up,
        ));
        let r = tunnel::run_file(&t, fc, observers, peer_timeout, shutdown_signal(), hooks).await;
        notify(&[NotifyState::Stopping]);
        reloader.abort();
        r.map_err(anyhow::Error::from)
    })
}

/// Tell systemd (when it started us with a notification socket; nothing otherwise).
fn notify(state: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(state) {
        warn!("cannot notify systemd ({e})");
    }
}

/// On each SIGHUP, and each `reload` on the control socket (`braid peer add`, whose
/// answer says what changed): re-read the configuration file, apply what the running
/// tunnel can take (channel weights, a channel's addresses and device, a new channel
/// list, a server's peers, the log level) and log what
/// needs a restart (`braid_io::reload`).
async fn reload_on_hangup(
    mut hup: Signal,
    mut asked: tokio::sync::mpsc::Receiver<oneshot::Sender<Result<String, String>>>,
    handle: oneshot::Receiver<StatsHandle>,
    path: PathBuf,
    mut running: FileConfig,
    mut logger: Option<crate::logging::Logger>,
    up: Arc<AtomicBool>,
) {
    let Ok(stats) = handle.await else { return };
    loop {
        let reply = tokio::select! {
            h = hup.recv() => match h {
                Some(()) => None,
                None => return,
            },
            r = asked.recv() => match r {
                Some(r) => Some(r),
                None => return,
            },
        };
        let is_up = up.load(Ordering::SeqCst);
        if is_up {
            let mut v = vec![NotifyState::Reloading];
            v.extend(NotifyState::monotonic_usec_now());
            notify(&v);
        }
        let mut set_level = |l: Option<&str>| match logger.as_mut() {
            Some(g) => g.set_config_level(l),
            None => Err("tunnel.log_level not applied: the logger was not set up by braid".into()),
        };
        let r = braid_io::reload::apply(&path, &mut running, &stats, Some(&mut set_level)).await;
        if let Some(reply) = reply {
            let _ = reply.send(r);
        }
        if is_up {
            notify(&[NotifyState::Ready]);
        }
    }
}
