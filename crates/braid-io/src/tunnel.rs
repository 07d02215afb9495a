//! The strIPe virtual interface (seed 000 §6.1): a TUN device below IP whose packets are
//! striped over a [`Session`]'s channels, and the peer's packets written back to it.
//! `braid tunnel` is this plus argument parsing.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::{debug, error, info, warn};

use crate::config::{SessionConfig, TunnelConfig};
use crate::icmp::TooBig;
use crate::observe::{serve_control_with, serve_metrics, ControlServer};
use crate::offload;
use crate::segment::Segmenter;
use crate::session::{Session, SessionError, SessionSender, StatsHandle};
use crate::tun::{Tun, TunError};

/// Why a tunnel could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    /// The TUN device.
    #[error(transparent)]
    Tun(#[from] TunError),
    /// The session.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The control socket or metrics endpoint.
    #[error("{what}: {err}")]
    Observer {
        /// Which, and where.
        what: String,
        /// The error.
        err: std::io::Error,
    },
    /// Reading the TUN device failed: the tunnel would be receive-only, so it stops.
    #[error("reading the TUN device {device} failed: {err}; the tunnel stops rather than run receive-only")]
    TunRead {
        /// The device.
        device: String,
        /// The error.
        err: std::io::Error,
    },
}

/// Where to publish the tunnel's state.
#[derive(Debug, Clone, Default)]
pub struct Observers {
    /// Unix socket for `braid status`.
    pub control: Option<PathBuf>,
    /// Prometheus endpoint.
    pub metrics: Option<SocketAddr>,
    /// A one-line summary in the log this often (zero: never).
    pub log_interval: Duration,
    /// Where the control socket's `reload` requests go (`braid peer add`/`remove`):
    /// the process that re-reads the configuration file, if any.
    pub reload: Option<crate::observe::Reloader>,
}

/// Start the control socket and metrics endpoint, and the periodic summary. The control
/// socket lives as long as the returned value.
pub async fn start_observers(
    o: &Observers,
    stats: StatsHandle,
) -> Result<Option<ControlServer>, TunnelError> {
    let ctl = match &o.control {
        Some(p) => {
            let s = serve_control_with(p, stats.clone(), o.reload.clone()).map_err(|err| {
                TunnelError::Observer {
                    what: format!("control socket {}", p.display()),
                    err,
                }
            })?;
            info!(
                "control socket at {} (braid status --control {})",
                p.display(),
                p.display()
            );
            Some(s)
        }
        None => None,
    };
    if let Some(addr) = o.metrics {
        let (local, _task) =
            serve_metrics(addr, stats.clone())
                .await
                .map_err(|err| TunnelError::Observer {
                    what: format!("metrics endpoint: cannot listen on {addr}"),
                    err,
                })?;
        info!("Prometheus metrics at http://{local}/metrics");
    }
    spawn_summary(stats, o.log_interval);
    Ok(ctl)
}

/// Log a one-line summary every `every` (never if zero).
fn spawn_summary(stats: StatsHandle, every: Duration) {
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

/// At most one warning per `every` for a repeated failure; counts the rest.
pub(crate) struct Throttle {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttle {
    pub(crate) fn new(every: Duration) -> Throttle {
        Throttle {
            every,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(n)`: warn now, `n` similar events were not logged since the last warning.
    pub(crate) fn allow(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self.last.is_some_and(|l| now - l < self.every) {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// The TUN device's MTU: `tunnel.mtu`, else the largest inner packet a datagram
/// carries (the smallest channel MTU less IP and UDP, the security envelope and the
/// mode's header).
pub fn tun_mtu(t: &TunnelConfig, s: &SessionConfig) -> u32 {
    t.mtu.unwrap_or(s.max_inner() - s.data_overhead())
}

/// Create and configure the TUN device for this session.
pub fn open_tun(t: &TunnelConfig, s: &SessionConfig) -> Result<Tun, TunnelError> {
    let mtu = tun_mtu(t, s);
    // Virtio-net headers, to write merged TCP segments (crate::offload).
    let tun = Tun::create_with(&t.name, true)?;
    tun.set_mtu(mtu)?;
    if let Some((addr, len)) = t.address {
        tun.set_ipv4(addr, len)?;
    }
    tun.up()?;
    // After up: the kernel adds the prefix's route to a running device.
    if let Some((addr, len)) = t.address6 {
        tun.set_ipv6(addr, len)?;
    }
    info!(
        "TUN {} up, mtu {mtu}, mode {}, security {}, {} channels",
        tun.name(),
        s.core.mode.name(),
        s.core.security.name(),
        s.channels.len()
    );
    if s.core.security == braid_proto::session::SecurityMode::None {
        warn!("security = \"none\" (allow_insecure): data crosses every channel in clear and forged packets from anyone who can reach a channel's port are delivered into the tunnel");
    }
    Ok(tun)
}

/// The default control socket of a TUN device.
pub fn default_control(device: &str) -> PathBuf {
    PathBuf::from(format!("/run/braid/{device}.sock"))
}

/// Run a tunnel until `shutdown` resolves (it names the reason, e.g. a signal) or the
/// TUN device fails. `peer_timeout`: give up if the peer has not answered by then.
pub async fn run(
    t: &TunnelConfig,
    s: SessionConfig,
    observers: Observers,
    peer_timeout: Option<Duration>,
    shutdown: impl std::future::Future<Output = &'static str>,
) -> Result<(), TunnelError> {
    run_with_hooks(t, s, observers, peer_timeout, shutdown, Hooks::default()).await
}

/// Told of a running tunnel's progress (the CLI's systemd notifications and reload).
#[derive(Default)]
pub struct Hooks {
    /// The session has started (the TUN device is up; the peer may not have answered):
    /// its handle, to read stats and change weights while it runs.
    pub started: Option<Box<dyn FnOnce(StatsHandle) + Send>>,
    /// The peer answered: packets flow.
    pub up: Option<Box<dyn FnOnce() + Send>>,
}

/// [`run`], calling `hooks` as the tunnel starts and comes up.
pub async fn run_with_hooks(
    t: &TunnelConfig,
    s: SessionConfig,
    observers: Observers,
    peer_timeout: Option<Duration>,
    shutdown: impl std::future::Future<Output = &'static str>,
    mut hooks: Hooks,
) -> Result<(), TunnelError> {
    let tun = open_tun(t, &s)?;
    let mut s = s;
    s.serve_tcp();
    let mut session = Session::start(s).await?;
    // A rejection of our handshake is unauthenticated: logged, never a reason to stop.
    session.keep_trying_when_rejected();
    let stats = session.stats_handle();
    if let Some(f) = hooks.started.take() {
        f(stats.clone());
    }
    let _ctl = start_observers(&observers, stats).await?;
    tokio::pin!(shutdown);
    info!("waiting for the peer...");
    let wait = session.wait_for_peer(peer_timeout.unwrap_or(Duration::from_secs(u64::MAX / 4)));
    tokio::select! {
        r = wait => r?,
        why = &mut shutdown => {
            info!("{why}: shutting down before the peer answered");
            return Ok(());
        }
    }
    info!("peer answered; forwarding");
    if let Some(f) = hooks.up.take() {
        f();
    }
    let result = forward(Arc::new(tun), &mut session, shutdown).await;
    if let Ok(st) = session.stats().await {
        info!("final: {}", st.log_line());
    }
    session.close().await;
    result
}

/// Run the tunnel a configuration file describes: a point-to-point tunnel
/// ([`run_with_hooks`]), or with `[[peer]]` sections a server ([`serve`];
/// `peer_timeout` does not apply: a server waits for its peers).
pub async fn run_file(
    t: &TunnelConfig,
    fc: crate::FileConfig,
    observers: Observers,
    peer_timeout: Option<Duration>,
    shutdown: impl std::future::Future<Output = &'static str>,
    hooks: Hooks,
) -> Result<(), TunnelError> {
    if fc.peers.is_empty() {
        run_with_hooks(t, fc.session, observers, peer_timeout, shutdown, hooks).await
    } else {
        serve(t, fc.session, &fc.peers, observers, shutdown, hooks).await
    }
}

/// Serve `peers` (`crate::server`) until `shutdown` resolves or the TUN device fails.
/// The hooks' `up` is called once the channels listen.
pub async fn serve(
    t: &TunnelConfig,
    s: SessionConfig,
    peers: &[crate::PeerConfig],
    observers: Observers,
    shutdown: impl std::future::Future<Output = &'static str>,
    mut hooks: Hooks,
) -> Result<(), TunnelError> {
    let tun = Arc::new(open_tun(t, &s)?);
    let mut server = crate::server::Server::start(s, peers, tun.clone())?;
    let handle = server.handle();
    if let Some(f) = hooks.started.take() {
        f(handle.clone());
    }
    let _ctl = start_observers(&observers, handle).await?;
    if let Some(f) = hooks.up.take() {
        f();
    }
    tokio::pin!(shutdown);
    let result = tokio::select! {
        r = server.wait() => {
            let err = r.err().unwrap_or_else(|| std::io::Error::other("the TUN reader stopped"));
            error!("reading the TUN device {}: {err}", tun.name());
            Err(TunnelError::TunRead { device: tun.name().to_string(), err })
        }
        why = &mut shutdown => {
            info!("{why}: shutting down");
            Ok(())
        }
    };
    server.close().await;
    result
}

/// TUN → session and session → TUN until shutdown, the session's end, or a TUN read
/// error (returned: a tunnel that cannot read its device would silently go
/// receive-only). A reader task cuts the device's reads and hands them to the session;
/// the session's driver writes what it opens to the device itself
/// ([`Session::deliver_to_tun`]).
pub(crate) async fn forward(
    tun: Arc<Tun>,
    session: &mut Session,
    shutdown: std::pin::Pin<&mut impl std::future::Future<Output = &'static str>>,
) -> Result<(), TunnelError> {
    let counts = Arc::new(ReadCounts::default());
    let mut reader = tokio::spawn(read_tun(tun.clone(), session.sender(), counts.clone()));
    // The driver writes what it opens to the device itself: no task between them,
    // and no thread (this loop runs where it is called: `braid tunnel` calls it on
    // the runtime's main thread, which each delivery had to wake). What it queued
    // before is written below.
    if session.deliver_to_tun(tun.clone()).await.is_err() {
        reader.abort();
        info!("session end: shutting down");
        return Ok(());
    }
    let mut write_errors = Throttle::new(Duration::from_secs(5));
    let mut shutdown = shutdown;
    let mut batch: Vec<Bytes> = Vec::with_capacity(offload::MAX_SEGMENTS);
    let mut frame = Vec::new();
    // Packets written to the TUN device, and in how many frames, before the driver
    // took it.
    let (mut packets, mut frames) = (0u64, 0u64);
    let outcome = loop {
        tokio::select! {
            m = session.recv() => match m {
                Some(p) => {
                    // What else is waiting, in order: in-order TCP segments of one flow
                    // go to the kernel as one frame.
                    batch.push(p);
                    while batch.len() < offload::MAX_SEGMENTS {
                        match session.try_recv() {
                            Some(p) => batch.push(p),
                            None => break,
                        }
                    }
                    let (p, f) = write_packets(&tun, &batch, &mut frame, &mut write_errors).await;
                    packets += p;
                    frames += f;
                    batch.clear();
                }
                None => break Ok("session end"),
            },
            r = &mut reader => {
                let err = match r {
                    Ok(Err(e)) => e,
                    Ok(Ok(())) => break Ok("session closed"),
                    Err(join) => std::io::Error::other(join.to_string()),
                };
                error!("reading the TUN device {}: {err}", tun.name());
                break Err(TunnelError::TunRead { device: tun.name().to_string(), err });
            }
            why = &mut shutdown => break Ok(why),
        }
    };
    reader.abort();
    if packets > 0 {
        info!("{packets} packets written to the TUN device in {frames} writes before the session's driver took it");
    }
    info!("{}", counts.line());
    let why = outcome?;
    info!("{why}: shutting down");
    Ok(())
}

/// What the TUN reader has done, for the log at the end.
#[derive(Default)]
struct ReadCounts {
    reads: AtomicU64,
    gso: AtomicU64,
    packets: AtomicU64,
    refused: AtomicU64,
}

impl ReadCounts {
    fn line(&self) -> String {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "{} packets read from the TUN device in {} reads ({} of them TCP/UDP super-segments cut by braid, {} malformed reads dropped)",
            get(&self.packets),
            get(&self.reads),
            get(&self.gso),
            get(&self.refused)
        )
    }
}

/// The TUN device's reader: each read (with transmit offload, up to 64 KiB of one TCP
/// flow) cut into packets that fit the bond (`crate::segment`), MSS-clamped, and handed
/// to the session as one batch with the reads the device held at the same moment (up
/// to [`BATCH`] reads or packets), so that the driver takes them all before
/// it sends and each channel's share leaves as GSO trains. Returns on a read error or
/// when the session closes.
async fn read_tun(
    tun: Arc<Tun>,
    sender: SessionSender,
    counts: Arc<ReadCounts>,
) -> std::io::Result<()> {
    turn_on_offload(&tun);
    let mut buf = vec![0u8; READ_BUF];
    let mut seg = Segmenter::new();
    let mut pkts: Vec<Bytes> = Vec::with_capacity(64);
    let mut unfit: Vec<Bytes> = Vec::new();
    let mut too_big = TooBigCounts::default();
    let mut refused = Throttle::new(Duration::from_secs(10));
    loop {
        let first = tun.recv_frame(&mut buf).await?;
        // The largest inner packet the bond carries now (path MTU discovery may lower
        // or raise it at any time): TCP SYNs entering the tunnel announce no larger a
        // segment (crate::mss), super-segments are cut to it, and larger packets are
        // answered with ICMP (crate::icmp).
        let bond_mtu = sender.path_max_message();
        let clamp = |p: &mut [u8]| {
            crate::mss::clamp(p, bond_mtu);
        };
        // What else the device holds now goes in the same batch (one hand-over, one
        // wake-up of the driver, longer trains per channel), up to a batch's worth.
        let mut next = Some(first);
        let mut reads = 0;
        while let Some(n) = next {
            reads += 1;
            counts.reads.fetch_add(1, Ordering::Relaxed);
            if let Err(why) = seg.split(&mut buf[..n], bond_mtu, &mut pkts, clamp) {
                counts.refused.fetch_add(1, Ordering::Relaxed);
                if let Some(more) = refused.allow() {
                    warn!(
                        "TUN {}: read of {n} bytes dropped: {why} ({more} more not shown)",
                        tun.name()
                    );
                }
            }
            if reads >= BATCH || pkts.len() >= BATCH {
                break;
            }
            next = tun.try_recv_frame(&mut buf)?;
        }
        if pkts.is_empty() {
            continue;
        }
        counts.gso.store(seg.gso_frames, Ordering::Relaxed);
        counts
            .packets
            .fetch_add(pkts.len() as u64, Ordering::Relaxed);
        if !hand_over(&sender, &mut pkts, &mut unfit, bond_mtu).await {
            return Ok(());
        }
        // Answered, fragmented or dropped after the rest.
        for p in unfit.drain(..) {
            too_big.handle(&tun, &sender, &p, bond_mtu).await;
        }
    }
}

/// Reads, and packets, gathered into one batch for the session, at most (a batch is
/// handed over once either count reaches it; the read that crosses it goes whole).
/// Below a TCP super-segment's 45 packets: a read that is one already goes alone, as
/// before gathering (a bigger batch made the server's downstream slower: its reader's
/// next read no longer overlapped the driver's sending); single packets, UDP datagrams
/// or a TCP flow's acknowledgements, gather.
pub(crate) const BATCH: usize = 32;

/// Turn on the TUN device's transmit offload (whole super-segments per read) and log
/// whether it took.
pub(crate) fn turn_on_offload(tun: &Tun) {
    match tun.set_offload() {
        Ok(o) => info!("TUN {}: transmit offload {o:?}", tun.name()),
        Err(e) => info!(
            "TUN {}: no transmit offload ({e}): one packet per read",
            tun.name()
        ),
    }
}

/// Hand a batch of reads' packets to the session at once (the driver takes it whole
/// before it sends); those the bond cannot carry as they are (not TCP segments braid
/// cut: those fit) are moved to `unfit`. `path_max` is what the bond carries now (path
/// MTU discovery), read once per batch so that the cut, this check and the answer to a
/// packet too big all use the same value. False once the session has closed.
async fn hand_over(
    sender: &SessionSender,
    pkts: &mut Vec<Bytes>,
    unfit: &mut Vec<Bytes>,
    path_max: usize,
) -> bool {
    pkts.retain(|p| {
        // (IP packets never start with 0xB_: no escape byte to count.)
        let fits = sender.check(p).is_ok() && p.len() <= path_max;
        if !fits {
            unfit.push(p.clone());
        }
        fits
    });
    if pkts.is_empty() {
        return true;
    }
    // One allocation per read, not per packet.
    let batch = std::mem::replace(pkts, Vec::with_capacity(64));
    match sender.send_batch(batch).await {
        Ok(()) => true,
        Err(SessionError::Closed) => false,
        Err(e) => {
            debug!("packets not sent: {e}");
            true
        }
    }
}

/// A read's buffer: a virtio-net header and the largest super-segment (64 KiB), with
/// room to spare.
pub(crate) const READ_BUF: usize = 1 << 17;

/// Inner packets larger than the bond carries (`crate::icmp`): answered, fragmented or
/// dropped, counted, and logged at most every 10 s.
#[derive(Default)]
pub(crate) struct TooBigCounts {
    answered: u64,
    fragmented: u64,
    dropped: u64,
    logged: Option<Instant>,
}

impl TooBigCounts {
    pub(crate) async fn handle(
        &mut self,
        tun: &Tun,
        sender: &SessionSender,
        pkt: &[u8],
        mtu: usize,
    ) {
        match crate::icmp::too_big(pkt, mtu) {
            TooBig::Answer(a) => {
                self.answered += 1;
                if let Err(e) = tun.send(&a).await {
                    debug!("writing an ICMP answer to the TUN device: {e}");
                }
            }
            TooBig::Fragments(fs) => {
                self.fragmented += 1;
                for f in fs {
                    if let Err(e) = sender.send(Bytes::from(f)).await {
                        debug!("fragment not sent: {e}");
                    }
                }
            }
            TooBig::Drop => self.dropped += 1,
        }
        if self
            .logged
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(10))
        {
            self.logged = Some(Instant::now());
            info!(
                "inner packets larger than the bond's {mtu} bytes (of {} just now): {} answered with ICMP too big, {} fragmented, {} dropped (an ICMP error or no host to answer); lower the TUN device's MTU to the bond's to avoid them",
                pkt.len(),
                self.answered,
                self.fragmented,
                self.dropped
            );
        }
    }
}

/// Write packets to the TUN device, in order: with virtio-net headers, runs of
/// in-order TCP segments of one flow as one frame. Write errors are logged at most once
/// per `errors`' period. Returns (packets, writes).
pub(crate) async fn write_packets(
    tun: &Tun,
    batch: &[Bytes],
    frame: &mut Vec<u8>,
    errors: &mut Throttle,
) -> (u64, u64) {
    let (mut packets, mut frames) = (0u64, 0u64);
    let mut i = 0;
    while i < batch.len() {
        let n = if tun.vnet() {
            offload::run_len(&batch[i..])
        } else {
            1
        };
        let r = if tun.vnet() {
            offload::build(&batch[i..i + n], frame);
            tun.send_frame(frame).await
        } else {
            tun.send(&batch[i]).await
        };
        if let Err(e) = r {
            if let Some(more) = errors.allow() {
                warn!("writing {n} packets to the TUN device: {e} ({more} more write errors not shown)");
            }
        }
        i += n;
        packets += n as u64;
        frames += 1;
    }
    (packets, frames)
}

/// The control socket to use: the flag, else the configuration, else the default.
pub fn control_path(flag: Option<&Path>, t: &TunnelConfig) -> PathBuf {
    flag.map(Path::to_path_buf)
        .or(t.control.clone())
        .unwrap_or_else(|| default_control(&t.name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_lets_one_through_per_period_and_counts_the_rest() {
        let mut t = Throttle::new(Duration::from_secs(3600));
        assert_eq!(t.allow(), Some(0));
        assert_eq!(t.allow(), None);
        assert_eq!(t.allow(), None);
        t.last = Some(Instant::now() - Duration::from_secs(7200));
        assert_eq!(t.allow(), Some(2));
    }
}
