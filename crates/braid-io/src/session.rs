//! The session: one [`Striper`] (our transmit direction) and one [`Resequencer`] (our
//! receive direction) over a set of UDP channels, driven by a real clock on tokio.
//!
//! Both ends are symmetric. Each direction has its own epoch: the data sender chooses
//! the channel set from what the receiver reports hearing, ends the old epoch with an
//! authenticated epoch-end message on every channel (after its last data packet there),
//! holds new data until the receiver acknowledges, then stripes over the new set with a
//! fresh striper. The receiver finishes the old resequencer (final markers for the old
//! channels, then `Resequencer::drain`) before it starts the new one, so
//! nothing is delivered twice and nothing from the old epoch is mixed into the new one.
//! See `docs/tunnel.md` for the full design.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration as StdDuration;

use braid_proto::sched::Position;
use braid_proto::stats::{ChannelStats, Stats};
use braid_proto::wire::{self, marker};
use braid_proto::{Instant, Mode, Resequencer, Striper, TransmitKind};
use bytes::Bytes;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::auth::{new_instance, Auth, AuthError, TRAILER_LEN};
use crate::config::SessionConfig;
use crate::ctrl::{EpochAck, EpochEnd, Hello, Msg, TYPE_SESSION};
use crate::stats::{ChannelSnapshot, SessionStats};

/// Errors of [`Session`].
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The configuration cannot work.
    #[error("invalid session configuration: {0}")]
    Config(String),
    /// A channel socket could not be created or bound.
    #[error("channel {index} ({name}): cannot bind local address {addr}: {error}{hint}")]
    Bind {
        /// Channel index.
        index: usize,
        /// Channel name.
        name: String,
        /// The address.
        addr: SocketAddr,
        /// OS error.
        error: std::io::Error,
        /// What to check.
        hint: &'static str,
    },
    /// SO_BINDTODEVICE failed.
    #[error("channel {index} ({name}): cannot bind to device '{device}': {error} (needs CAP_NET_RAW and an existing interface)")]
    Device {
        /// Channel index.
        index: usize,
        /// Channel name.
        name: String,
        /// The interface.
        device: String,
        /// OS error.
        error: std::io::Error,
    },
    /// Nothing authenticated came from the peer in time.
    #[error("the peer never answered: no authenticated packet within {timeout:?} on any channel ({channels}); is the other end running, with the same key and mirrored addresses?")]
    PeerSilent {
        /// How long we waited.
        timeout: StdDuration,
        /// The channels, `local -> remote`.
        channels: String,
    },
    /// A message larger than the channels can carry.
    #[error("message of {len} bytes is larger than the session carries ({max} bytes)")]
    TooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Empty messages cannot be sent.
    #[error("empty message")]
    Empty,
    /// The session has stopped.
    #[error("session closed")]
    Closed,
}

enum Cmd {
    Stats(oneshot::Sender<SessionStats>),
    Close,
}

/// A striping session over a set of UDP channels.
///
/// ```no_run
/// # async fn demo() -> Result<(), braid_io::SessionError> {
/// use braid_io::{ChannelConfig, Session, SessionConfig};
/// let channels = vec![
///     ChannelConfig::new("a", "127.0.0.1:7001".parse().unwrap(), "127.0.0.1:7101".parse().unwrap()),
///     ChannelConfig::new("b", "127.0.0.1:7002".parse().unwrap(), "127.0.0.1:7102".parse().unwrap()),
/// ];
/// let mut s = Session::start(SessionConfig::new(channels, "pre-shared key")).await?;
/// s.wait_for_peer(std::time::Duration::from_secs(5)).await?;
/// s.send(bytes::Bytes::from_static(b"hello")).await?;
/// while let Some(msg) = s.recv().await {
///     println!("{} bytes, in order", msg.len());
/// }
/// # Ok(()) }
/// ```
///
/// Messages are datagrams: in `logical` mode they arrive in order except after losses
/// (quasi-FIFO), in `seq` mode exactly in order, in `trr` mode never out of order with
/// losses allowed. Nothing is retransmitted.
pub struct Session {
    sender: SessionSender,
    cmd: mpsc::UnboundedSender<Cmd>,
    rx: mpsc::Receiver<Bytes>,
    peer: watch::Receiver<bool>,
    task: Option<JoinHandle<()>>,
    locals: Vec<SocketAddr>,
    describe: String,
}

/// A cloneable handle that sends into a [`Session`].
#[derive(Clone)]
pub struct SessionSender {
    data: mpsc::Sender<Bytes>,
    max_datagram: usize,
    overhead: usize,
}

impl SessionSender {
    fn check(&self, m: &Bytes) -> Result<(), SessionError> {
        if m.is_empty() {
            return Err(SessionError::Empty);
        }
        let esc = usize::from(self.overhead == 0 && wire::needs_escape(m));
        if m.len() + self.overhead + esc > self.max_datagram {
            return Err(SessionError::TooLarge {
                len: m.len(),
                max: self.max_datagram - self.overhead - esc,
            });
        }
        Ok(())
    }

    /// Send one message; waits while the session's input queue is full.
    pub async fn send(&self, m: Bytes) -> Result<(), SessionError> {
        self.check(&m)?;
        self.data.send(m).await.map_err(|_| SessionError::Closed)
    }

    /// Send without waiting; `Ok(false)` if the input queue is full.
    pub fn try_send(&self, m: Bytes) -> Result<bool, SessionError> {
        self.check(&m)?;
        match self.data.try_send(m) {
            Ok(()) => Ok(true),
            Err(mpsc::error::TrySendError::Full(_)) => Ok(false),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(SessionError::Closed),
        }
    }

    /// The largest message that does not start with a byte `0xB0..=0xBF` (those need a
    /// one-byte escape in the header-free modes, so one byte less).
    pub fn max_message(&self) -> usize {
        self.max_datagram - self.overhead
    }
}

fn bind(
    index: usize,
    c: &crate::config::ChannelConfig,
    bufsize: usize,
) -> Result<UdpSocket, SessionError> {
    use socket2::{Domain, Protocol, Socket, Type};
    let hint_for = |e: &std::io::Error| match e.raw_os_error() {
        Some(libc::EADDRNOTAVAIL) => " (the address is not configured on any local interface)",
        Some(libc::EADDRINUSE) => " (another socket, perhaps another braid, already uses it)",
        Some(libc::EACCES) => " (ports below 1024 need privileges)",
        _ => "",
    };
    let be = |error: std::io::Error| SessionError::Bind {
        index,
        name: c.name.clone(),
        addr: c.local,
        hint: hint_for(&error),
        error,
    };
    let sock = Socket::new(
        Domain::for_address(c.local),
        Type::DGRAM,
        Some(Protocol::UDP),
    )
    .map_err(be)?;
    if let Some(dev) = &c.device {
        sock.bind_device(Some(dev.as_bytes()))
            .map_err(|error| SessionError::Device {
                index,
                name: c.name.clone(),
                device: dev.clone(),
                error,
            })?;
    }
    if bufsize > 0 {
        // Best effort: the kernel caps these at net.core.{r,w}mem_max.
        let _ = sock.set_recv_buffer_size(bufsize);
        let _ = sock.set_send_buffer_size(bufsize);
    }
    sock.set_nonblocking(true).map_err(be)?;
    sock.bind(&c.local.into()).map_err(be)?;
    sock.connect(&c.remote.into())
        .map_err(|error| SessionError::Bind {
            index,
            name: c.name.clone(),
            addr: c.remote,
            hint: " (cannot aim the socket at the remote address)",
            error,
        })?;
    UdpSocket::from_std(sock.into()).map_err(be)
}

impl Session {
    /// Bind every channel's socket and start the driver. Needs a tokio runtime.
    pub async fn start(cfg: SessionConfig) -> Result<Session, SessionError> {
        cfg.validate().map_err(SessionError::Config)?;
        let mut socks = Vec::new();
        let mut locals = Vec::new();
        for (i, c) in cfg.channels.iter().enumerate() {
            let s = bind(i, c, cfg.socket_buffer)?;
            locals.push(s.local_addr().map_err(|error| SessionError::Bind {
                index: i,
                name: c.name.clone(),
                addr: c.local,
                hint: "",
                error,
            })?);
            socks.push(Arc::new(s));
        }
        let describe = cfg
            .channels
            .iter()
            .zip(&locals)
            .map(|(c, l)| format!("{l} -> {}", c.remote))
            .collect::<Vec<_>>()
            .join(", ");
        let (net_tx, net_rx) = mpsc::channel(8192);
        let mut readers = Vec::new();
        for (i, s) in socks.iter().enumerate() {
            readers.push(tokio::spawn(reader(i, s.clone(), net_tx.clone())));
        }
        drop(net_tx);
        let (data_tx, data_rx) = mpsc::channel(1024);
        let (deliver_tx, deliver_rx) = mpsc::channel(8192);
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let (peer_tx, peer_rx) = watch::channel(false);
        let sender = SessionSender {
            data: data_tx,
            max_datagram: cfg.max_datagram() as usize,
            overhead: cfg.data_overhead() as usize,
        };
        let core = Core::new(cfg, socks, deliver_tx, peer_tx).map_err(SessionError::Config)?;
        let task = tokio::spawn(core.run(net_rx, data_rx, cmd_rx, readers));
        Ok(Session {
            sender,
            cmd: cmd_tx,
            rx: deliver_rx,
            peer: peer_rx,
            task: Some(task),
            locals,
            describe,
        })
    }

    /// The local address of each channel (useful with port 0).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.locals
    }

    /// Wait until an authenticated packet from the peer has arrived.
    pub async fn wait_for_peer(&mut self, timeout: StdDuration) -> Result<(), SessionError> {
        let r = tokio::time::timeout(timeout, self.peer.wait_for(|&seen| seen)).await;
        match r {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(SessionError::Closed),
            Err(_) => Err(SessionError::PeerSilent {
                timeout,
                channels: self.describe.clone(),
            }),
        }
    }

    /// A cloneable sending handle.
    pub fn sender(&self) -> SessionSender {
        self.sender.clone()
    }

    /// Send one message (see [`SessionSender::send`]).
    pub async fn send(&self, m: Bytes) -> Result<(), SessionError> {
        self.sender.send(m).await
    }

    /// The next message from the peer, in order; `None` once the session has stopped.
    pub async fn recv(&mut self) -> Option<Bytes> {
        self.rx.recv().await
    }

    /// A snapshot of the counters and channel states.
    pub async fn stats(&self) -> Result<SessionStats, SessionError> {
        let (tx, rx) = oneshot::channel();
        self.cmd
            .send(Cmd::Stats(tx))
            .map_err(|_| SessionError::Closed)?;
        rx.await.map_err(|_| SessionError::Closed)
    }

    /// A handle that reads stats without borrowing the session.
    pub fn stats_handle(&self) -> StatsHandle {
        StatsHandle(self.cmd.clone())
    }

    /// Stop the driver and close the sockets.
    pub async fn close(mut self) {
        let _ = self.cmd.send(Cmd::Close);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.cmd.send(Cmd::Close);
    }
}

/// Reads a session's stats from another task.
#[derive(Clone)]
pub struct StatsHandle(mpsc::UnboundedSender<Cmd>);

impl StatsHandle {
    /// A snapshot, or `Closed`.
    pub async fn get(&self) -> Result<SessionStats, SessionError> {
        let (tx, rx) = oneshot::channel();
        self.0
            .send(Cmd::Stats(tx))
            .map_err(|_| SessionError::Closed)?;
        rx.await.map_err(|_| SessionError::Closed)
    }
}

async fn reader(channel: usize, sock: Arc<UdpSocket>, out: mpsc::Sender<(usize, Bytes)>) {
    let mut buf = vec![0u8; 65536];
    loop {
        match sock.recv(&mut buf).await {
            Ok(n) => {
                if out
                    .send((channel, Bytes::copy_from_slice(&buf[..n])))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            // ICMP errors from a connected UDP socket (peer not running yet): ignore.
            Err(e) => {
                debug!(channel, "recv error: {e}");
                tokio::time::sleep(StdDuration::from_millis(1)).await;
            }
        }
    }
}

fn bit(c: usize) -> u64 {
    1u64 << c
}

fn members_of(set: u64) -> Vec<usize> {
    (0..64).filter(|&c| set & bit(c) != 0).collect()
}

fn set_str(set: u64) -> String {
    format!("{:?}", members_of(set))
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum LinkState {
    /// Never heard the peer yet.
    Waiting,
    Up,
    Down,
}

#[derive(Default)]
struct ChanCounters {
    tx_datagrams: u64,
    tx_bytes: u64,
    tx_data: u64,
    tx_markers: u64,
    tx_triggers: u64,
    tx_errors: u64,
    rx_datagrams: u64,
    rx_bytes: u64,
    rx_data: u64,
    rx_markers: u64,
    rx_triggers: u64,
    rx_hellos: u64,
    auth_failures: u64,
    replays: u64,
    malformed: u64,
    last_tx_bytes: u64,
    last_rx_bytes: u64,
    tx_bps: f64,
    rx_bps: f64,
}

struct Chan {
    state: LinkState,
    since: Instant,
    changes: u64,
    last_rx: Option<Instant>,
    run_start: Option<Instant>,
    peer_hears_us: bool,
    n: ChanCounters,
}

struct Switch {
    new_epoch: u32,
    new_set: u64,
    proposed: Vec<u64>,
    seq: u64,
    finals: Vec<(u64, i64)>,
}

struct Tx {
    epoch: u32,
    set: u64,
    members: Vec<usize>,
    striper: Striper,
    switching: Option<Switch>,
    pending: VecDeque<Bytes>,
    base: Vec<ChannelStats>,
    changes: u64,
}

struct Rx {
    epoch: u32,
    set: u64,
    index: Vec<Option<usize>>,
    reseq: Resequencer,
    pending: Option<EpochEnd>,
    end_seen: u64,
    injected: u64,
    base: Vec<ChannelStats>,
    base_global: Stats,
    switch_lost: u64,
    changes: u64,
}

struct Core {
    cfg: SessionConfig,
    n: usize,
    all: u64,
    origin: std::time::Instant,
    socks: Vec<Arc<UdpSocket>>,
    auth: Auth,
    chans: Vec<Chan>,
    tx: Tx,
    rx: Rx,
    outq: Vec<(usize, Bytes)>,
    deliver: mpsc::Sender<Bytes>,
    peer_seen: watch::Sender<bool>,
    last_peer: Option<Instant>,
    peer_mask: u64,
    peer_report_at: Option<Instant>,
    peer_silent_warned: bool,
    mismatch_warned: bool,
    sent_packets: u64,
    sent_bytes: u64,
    queue_drops: u64,
    deliver_drops: u64,
    stray_drops: u64,
    delivered_bytes_last: u64,
    delivered_bps: f64,
    next_hello: Instant,
    next_rate: Instant,
}

fn add_stats(into: &mut ChannelStats, s: &ChannelStats) {
    into.bytes_sent += s.bytes_sent;
    into.packets_sent += s.packets_sent;
    into.markers_sent += s.markers_sent;
    into.triggers_sent += s.triggers_sent;
    into.bytes_received += s.bytes_received;
    into.packets_received += s.packets_received;
    into.markers_received += s.markers_received;
    into.triggers_received += s.triggers_received;
    into.resyncs += s.resyncs;
    into.malformed += s.malformed;
    into.buffer_high_water = into.buffer_high_water.max(s.buffer_high_water);
    into.overflow_drops += s.overflow_drops;
    into.wait_timeouts += s.wait_timeouts;
}

fn add_global(into: &mut Stats, s: &Stats) {
    into.delivered_packets += s.delivered_packets;
    into.delivered_bytes += s.delivered_bytes;
    into.out_of_order += s.out_of_order;
    into.lost += s.lost;
    into.stale_dropped += s.stale_dropped;
    into.malformed += s.malformed;
    into.fast_path_hits += s.fast_path_hits;
    into.naks_sent += s.naks_sent;
    into.repaired += s.repaired;
}

impl Core {
    fn new(
        cfg: SessionConfig,
        socks: Vec<Arc<UdpSocket>>,
        deliver: mpsc::Sender<Bytes>,
        peer_seen: watch::Sender<bool>,
    ) -> Result<Core, String> {
        let n = cfg.channels.len();
        let all = if n == 64 { u64::MAX } else { bit(n) - 1 };
        let members: Vec<usize> = (0..n).collect();
        let sc = cfg.stripe_config(&members);
        let striper = Striper::new(sc.clone()).map_err(|e| e.to_string())?;
        let reseq = Resequencer::new(&sc).map_err(|e| e.to_string())?;
        let auth = Auth::new(&cfg.key, n, new_instance());
        let now = Instant::ZERO;
        Ok(Core {
            n,
            all,
            origin: std::time::Instant::now(),
            socks,
            auth,
            chans: (0..n)
                .map(|_| Chan {
                    state: LinkState::Waiting,
                    since: now,
                    changes: 0,
                    last_rx: None,
                    run_start: None,
                    peer_hears_us: false,
                    n: ChanCounters::default(),
                })
                .collect(),
            tx: Tx {
                epoch: 0,
                set: all,
                members: members.clone(),
                striper,
                switching: None,
                pending: VecDeque::new(),
                base: vec![ChannelStats::default(); n],
                changes: 0,
            },
            rx: Rx {
                epoch: 0,
                set: all,
                index: (0..n).map(Some).collect(),
                reseq,
                pending: None,
                end_seen: 0,
                injected: 0,
                base: vec![ChannelStats::default(); n],
                base_global: Stats::new(0),
                switch_lost: 0,
                changes: 0,
            },
            outq: Vec::with_capacity(256),
            deliver,
            peer_seen,
            last_peer: None,
            peer_mask: all,
            peer_report_at: None,
            peer_silent_warned: false,
            mismatch_warned: false,
            sent_packets: 0,
            sent_bytes: 0,
            queue_drops: 0,
            deliver_drops: 0,
            stray_drops: 0,
            delivered_bytes_last: 0,
            delivered_bps: 0.0,
            next_hello: now,
            next_rate: now + braid_proto::Duration::from_secs(1),
            cfg,
        })
    }

    fn now(&self) -> Instant {
        Instant::from_micros(self.origin.elapsed().as_micros() as u64)
    }

    fn hb(&self) -> braid_proto::Duration {
        braid_proto::Duration::from_micros(self.cfg.heartbeat.as_micros() as u64)
    }

    fn dead_after(&self) -> braid_proto::Duration {
        braid_proto::Duration::from_micros(self.cfg.dead_after.as_micros() as u64)
    }

    async fn run(
        mut self,
        mut net: mpsc::Receiver<(usize, Bytes)>,
        mut data: mpsc::Receiver<Bytes>,
        mut cmd: mpsc::UnboundedReceiver<Cmd>,
        readers: Vec<JoinHandle<()>>,
    ) {
        let mut app_open = true;
        loop {
            let deadline = self.next_deadline();
            let at = tokio::time::Instant::from_std(
                self.origin + StdDuration::from_micros(deadline.as_micros()),
            );
            tokio::select! {
                c = cmd.recv() => match c {
                    Some(Cmd::Stats(reply)) => { let _ = reply.send(self.snapshot()); }
                    Some(Cmd::Close) | None => break,
                },
                d = net.recv() => {
                    let Some((c, d)) = d else { break };
                    let now = self.now();
                    self.on_datagram(c, d, now);
                    // Take what else is already waiting, up to a batch.
                    for _ in 0..64 {
                        match net.try_recv() {
                            Ok((c, d)) => self.on_datagram(c, d, now),
                            Err(_) => break,
                        }
                    }
                }
                m = data.recv(), if app_open => match m {
                    Some(m) => {
                        let now = self.now();
                        self.on_app(m, now);
                        for _ in 0..64 {
                            match data.try_recv() {
                                Ok(m) => self.on_app(m, now),
                                Err(_) => break,
                            }
                        }
                    }
                    None => app_open = false,
                },
                _ = tokio::time::sleep_until(at) => {}
            }
            let now = self.now();
            self.on_timers(now);
            self.send_out().await;
        }
        for r in readers {
            r.abort();
        }
    }

    fn next_deadline(&self) -> Instant {
        let mut d = self.next_hello.min(self.next_rate);
        if self.tx.switching.is_none() {
            if let Some(t) = self.tx.striper.poll_timeout() {
                d = d.min(t);
            }
        }
        if let Some(t) = self.rx.reseq.poll_timeout() {
            d = d.min(t);
        }
        d
    }

    async fn send_out(&mut self) {
        for (c, b) in self.outq.drain(..) {
            let sock = &self.socks[c];
            let r = match sock.try_send(&b) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => sock.send(&b).await,
                r => r,
            };
            let n = &mut self.chans[c].n;
            match r {
                Ok(_) => {
                    n.tx_datagrams += 1;
                    n.tx_bytes += b.len() as u64;
                }
                Err(_) => n.tx_errors += 1,
            }
        }
    }

    fn on_timers(&mut self, now: Instant) {
        if self.tx.switching.is_none() {
            self.tx.striper.handle_timeout(now);
            self.take_transmits();
        }
        self.rx.reseq.handle_timeout(now);
        self.drain_deliver();
        if now >= self.next_hello {
            self.next_hello = now + self.hb();
            self.heartbeat(now);
        }
        if now >= self.next_rate {
            self.next_rate = now + braid_proto::Duration::from_secs(1);
            self.rates();
        }
    }

    fn rates(&mut self) {
        for c in &mut self.chans {
            c.n.tx_bps = (c.n.tx_bytes - c.n.last_tx_bytes) as f64 * 8.0;
            c.n.rx_bps = (c.n.rx_bytes - c.n.last_rx_bytes) as f64 * 8.0;
            c.n.last_tx_bytes = c.n.tx_bytes;
            c.n.last_rx_bytes = c.n.rx_bytes;
        }
        let d = self.rx.base_global.delivered_bytes + self.rx.reseq.stats().delivered_bytes;
        self.delivered_bps = (d - self.delivered_bytes_last) as f64 * 8.0;
        self.delivered_bytes_last = d;
    }

    fn rx_mask(&self) -> u64 {
        self.chans
            .iter()
            .enumerate()
            .filter(|(_, c)| c.state != LinkState::Down)
            .fold(0, |m, (i, _)| m | bit(i))
    }

    fn heartbeat(&mut self, now: Instant) {
        self.liveness(now);
        let rx_mask = self.rx_mask();
        for c in 0..self.n {
            let m = Msg::Hello(Hello {
                channel: c as u8,
                channels: self.n as u8,
                rx_mask,
                tx_epoch: self.tx.epoch,
                rx_epoch: self.rx.epoch,
            });
            self.send_ctrl(c, &m);
        }
        if self.tx.switching.is_some() {
            self.send_end();
        } else {
            // Markers (or triggers) on every channel of the set: heartbeats that also
            // resynchronize the receiver.
            self.tx.striper.flush();
            self.take_transmits();
        }
        if let Some(l) = self.last_peer {
            let silent = now - l;
            if silent > self.dead_after() && !self.peer_silent_warned {
                self.peer_silent_warned = true;
                warn!(
                    "peer silent on every channel for {} ms",
                    silent.as_micros() / 1000
                );
            }
        }
        self.maybe_switch(now);
    }

    fn liveness(&mut self, now: Instant) {
        let dead = self.dead_after();
        let rejoin = braid_proto::Duration::from_micros(self.cfg.rejoin_after.as_micros() as u64);
        let hb2 = self.hb() + self.hb();
        for (i, c) in self.chans.iter_mut().enumerate() {
            let name = &self.cfg.channels[i].name;
            match c.state {
                LinkState::Up => {
                    let silent = c.last_rx.map_or(dead + dead, |l| now - l);
                    if silent > dead {
                        c.state = LinkState::Down;
                        c.since = now;
                        c.changes += 1;
                        c.run_start = None;
                        warn!(
                            channel = i,
                            "channel {i} ({name}) down: nothing heard for {} ms",
                            silent.as_micros() / 1000
                        );
                    }
                }
                LinkState::Down => {
                    if let (Some(s), Some(l)) = (c.run_start, c.last_rx) {
                        if now - s >= rejoin && now - l <= hb2 {
                            c.state = LinkState::Up;
                            c.since = now;
                            c.changes += 1;
                            info!(channel = i, "channel {i} ({name}) up again");
                        }
                    }
                }
                LinkState::Waiting => {}
            }
        }
    }

    fn heard(&mut self, c: usize, now: Instant) {
        let dead = self.dead_after();
        let ch = &mut self.chans[c];
        if ch.state == LinkState::Down {
            let gap = ch.last_rx.is_none_or(|l| now - l > dead);
            if ch.run_start.is_none() || gap {
                ch.run_start = Some(now);
            }
        }
        ch.last_rx = Some(now);
    }

    fn send_ctrl(&mut self, c: usize, m: &Msg) {
        let mut v = m.to_vec();
        self.auth.seal(c, &mut v);
        self.outq.push((c, Bytes::from(v)));
    }

    fn take_transmits(&mut self) {
        while let Some(t) = self.tx.striper.poll_transmit() {
            let phys = self.tx.members[t.channel];
            let n = &mut self.chans[phys].n;
            let bytes = match t.kind {
                // Repairs (seq mode) are data with a sequence header: no trailer.
                TransmitKind::Data | TransmitKind::Repair => {
                    n.tx_data += 1;
                    t.to_bytes()
                }
                TransmitKind::Marker | TransmitKind::Trigger => {
                    if t.kind == TransmitKind::Marker {
                        n.tx_markers += 1;
                    } else {
                        n.tx_triggers += 1;
                    }
                    let mut v = Vec::with_capacity(t.len() + TRAILER_LEN);
                    v.extend_from_slice(t.header());
                    v.extend_from_slice(&t.payload);
                    self.auth.seal(phys, &mut v);
                    Bytes::from(v)
                }
            };
            self.outq.push((phys, bytes));
        }
    }

    fn on_app(&mut self, m: Bytes, now: Instant) {
        self.sent_packets += 1;
        self.sent_bytes += m.len() as u64;
        if self.tx.switching.is_some() {
            if self.tx.pending.len() < self.cfg.queue_packets {
                self.tx.pending.push_back(m);
            } else {
                self.queue_drops += 1;
            }
            return;
        }
        if self.tx.striper.handle_packet(now, m).is_err() {
            self.queue_drops += 1;
        }
        self.take_transmits();
    }

    fn drain_deliver(&mut self) {
        while let Some(b) = self.rx.reseq.poll_deliver() {
            match self.deliver.try_send(b) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => self.deliver_drops += 1,
                Err(mpsc::error::TrySendError::Closed(_)) => {}
            }
        }
        // Losses to repair (seq mode): the NAK goes to the peer's striper on every
        // channel that is not down, so the fastest one gets it there first.
        while let Some(nak) = self.rx.reseq.poll_nak() {
            for c in 0..self.n {
                if self.chans[c].state == LinkState::Down {
                    continue;
                }
                let mut v = nak.to_vec();
                self.auth.seal(c, &mut v);
                self.outq.push((c, Bytes::from(v)));
            }
        }
    }

    fn on_datagram(&mut self, c: usize, d: Bytes, now: Instant) {
        let n = &mut self.chans[c].n;
        n.rx_datagrams += 1;
        n.rx_bytes += d.len() as u64;
        let Some(&first) = d.first() else {
            n.malformed += 1;
            return;
        };
        if matches!(
            first,
            wire::TYPE_MARKER | wire::TYPE_TRIGGER | TYPE_SESSION | wire::TYPE_NAK
        ) {
            let opened = match self.auth.open(c, &d) {
                Ok(o) => o,
                Err(e) => {
                    let n = &mut self.chans[c].n;
                    match e {
                        AuthError::BadTag | AuthError::Truncated => n.auth_failures += 1,
                        AuthError::Replay | AuthError::Reflected => n.replays += 1,
                    }
                    debug!(channel = c, "control packet dropped: {e}");
                    return;
                }
            };
            if opened.new_peer {
                self.on_new_peer(now);
            }
            self.last_peer = Some(now);
            self.peer_silent_warned = false;
            self.heard(c, now);
            let pkt = d.slice(..opened.len);
            match first {
                TYPE_SESSION => self.on_ctrl(c, &pkt, now),
                wire::TYPE_NAK => {
                    // The peer's receiver asks our striper for lost packets.
                    if self.tx.switching.is_none() {
                        self.tx.striper.handle_nak(&pkt);
                        self.take_transmits();
                    }
                }
                wire::TYPE_MARKER => {
                    self.chans[c].n.rx_markers += 1;
                    self.rx_core(c, pkt, now)
                }
                _ => {
                    self.chans[c].n.rx_triggers += 1;
                    self.rx_core(c, pkt, now)
                }
            }
        } else {
            self.heard(c, now);
            self.chans[c].n.rx_data += 1;
            self.rx_core(c, d, now);
        }
    }

    fn rx_core(&mut self, c: usize, pkt: Bytes, now: Instant) {
        if self.rx.pending.is_some() && self.rx.end_seen & bit(c) != 0 {
            self.stray_drops += 1;
            return;
        }
        match self.rx.index[c] {
            Some(k) => {
                self.rx.reseq.handle_datagram(now, k, pkt);
                self.drain_deliver();
            }
            None => self.stray_drops += 1,
        }
    }

    fn on_new_peer(&mut self, now: Instant) {
        let restarted = *self.peer_seen.borrow();
        if restarted {
            info!("peer restarted (new instance): both directions start over at epoch 0");
            self.reset_epochs(now);
        } else {
            info!("peer heard");
        }
        for c in &mut self.chans {
            c.state = LinkState::Up;
            c.since = now;
            c.last_rx = Some(now);
            c.run_start = None;
            c.peer_hears_us = true;
        }
        self.peer_mask = self.all;
        self.peer_report_at = None;
        self.peer_seen.send_replace(true);
    }

    fn reset_epochs(&mut self, now: Instant) {
        let members: Vec<usize> = (0..self.n).collect();
        let sc = self.cfg.stripe_config(&members);
        // Tx: account the old striper, start fresh over every channel.
        for (k, &p) in self.tx.members.iter().enumerate() {
            add_stats(&mut self.tx.base[p], &self.tx.striper.stats().channels[k]);
        }
        self.tx.striper = Striper::new(sc.clone()).expect("validated");
        self.tx.epoch = 0;
        self.tx.set = self.all;
        self.tx.members = members.clone();
        self.tx.switching = None;
        // Rx.
        self.account_rx();
        self.rx.reseq = Resequencer::new(&sc).expect("validated");
        self.rx.epoch = 0;
        self.rx.set = self.all;
        self.rx.index = (0..self.n).map(Some).collect();
        self.rx.pending = None;
        self.rx.end_seen = 0;
        self.rx.injected = 0;
        let pending: Vec<Bytes> = self.tx.pending.drain(..).collect();
        for m in pending {
            let _ = self.tx.striper.handle_packet(now, m);
        }
        self.take_transmits();
    }

    fn account_rx(&mut self) {
        let s = self.rx.reseq.stats();
        for (p, k) in self.rx.index.iter().enumerate() {
            if let Some(k) = *k {
                add_stats(&mut self.rx.base[p], &s.channels[k]);
            }
        }
        add_global(&mut self.rx.base_global, s);
    }

    fn on_ctrl(&mut self, c: usize, pkt: &[u8], now: Instant) {
        let m = match Msg::parse(pkt) {
            Ok(m) => m,
            Err(e) => {
                self.chans[c].n.malformed += 1;
                debug!(channel = c, "bad session message: {e}");
                return;
            }
        };
        let sent_on = match &m {
            Msg::Hello(h) => h.channel,
            Msg::End(e) => e.channel,
            Msg::Ack(a) => a.channel,
        } as usize;
        if sent_on != c {
            self.chans[c].n.malformed += 1;
            return;
        }
        match m {
            Msg::Hello(h) => {
                self.chans[c].n.rx_hellos += 1;
                if h.channels as usize != self.n {
                    if !self.mismatch_warned {
                        self.mismatch_warned = true;
                        warn!(
                            "the peer has {} channels configured and we have {}: hellos ignored; both ends need the same channel list",
                            h.channels, self.n
                        );
                    }
                    return;
                }
                let mask = h.rx_mask & self.all;
                for i in 0..self.n {
                    let hears = mask & bit(i) != 0;
                    if self.chans[i].peer_hears_us != hears {
                        self.chans[i].peer_hears_us = hears;
                        let name = &self.cfg.channels[i].name;
                        if hears {
                            info!(channel = i, "peer hears us again on channel {i} ({name})");
                        } else {
                            warn!(
                                channel = i,
                                "peer no longer hears us on channel {i} ({name})"
                            );
                        }
                    }
                }
                self.peer_mask = mask;
                self.peer_report_at = Some(now);
                self.maybe_switch(now);
            }
            Msg::End(e) => self.rx_on_end(c, e, now),
            Msg::Ack(a) => self.tx_on_ack(a, now),
        }
    }

    // ---- transmit direction: choosing and switching the channel set ----

    fn maybe_switch(&mut self, now: Instant) {
        let Some(at) = self.peer_report_at else {
            return;
        };
        if now - at > self.dead_after() {
            return;
        }
        let desired = self.peer_mask & self.all;
        if desired == 0 {
            return;
        }
        if let Some(sw) = &mut self.tx.switching {
            if desired != sw.new_set {
                info!(
                    "tx: retargeting epoch {} to channels {}",
                    sw.new_epoch,
                    set_str(desired)
                );
                sw.new_set = desired;
                if !sw.proposed.contains(&desired) {
                    sw.proposed.push(desired);
                }
                self.send_end();
            }
            return;
        }
        if desired != self.tx.set {
            self.start_switch(desired);
        }
    }

    fn start_switch(&mut self, new_set: u64) {
        // Final markers/triggers of the old epoch on its channels.
        self.tx.striper.flush();
        self.take_transmits();
        let k = self.tx.members.len();
        let finals = match self.tx.striper.scheduler() {
            Some(s) => (0..k)
                .map(|i| {
                    let p = s.position(i);
                    (p.round, p.dc)
                })
                .collect(),
            None => vec![(0, 1); k],
        };
        let sw = Switch {
            new_epoch: self.tx.epoch.wrapping_add(1),
            new_set,
            proposed: vec![new_set],
            seq: self.tx.striper.packets_sent(),
            finals,
        };
        info!(
            "tx: channel set {} -> {}: ending epoch {} after {} packets",
            set_str(self.tx.set),
            set_str(new_set),
            self.tx.epoch,
            sw.seq
        );
        self.tx.switching = Some(sw);
        self.send_end();
    }

    fn send_end(&mut self) {
        let Some(sw) = &self.tx.switching else {
            return;
        };
        let base = EpochEnd {
            channel: 0,
            old_epoch: self.tx.epoch,
            new_epoch: sw.new_epoch,
            old_set: self.tx.set,
            new_set: sw.new_set,
            seq: sw.seq,
            finals: sw.finals.clone(),
        };
        for c in members_of(self.tx.set | sw.new_set) {
            let mut e = base.clone();
            e.channel = c as u8;
            self.send_ctrl(c, &Msg::End(e));
        }
    }

    fn tx_on_ack(&mut self, a: EpochAck, now: Instant) {
        let Some(sw) = &self.tx.switching else {
            return;
        };
        if a.epoch != sw.new_epoch || !sw.proposed.contains(&a.set) || a.set == 0 {
            return;
        }
        for (k, &p) in self.tx.members.iter().enumerate() {
            add_stats(&mut self.tx.base[p], &self.tx.striper.stats().channels[k]);
        }
        let members = members_of(a.set & self.all);
        self.tx.striper = Striper::new(self.cfg.stripe_config(&members)).expect("validated");
        self.tx.striper.set_epoch(sw.new_epoch);
        self.tx.epoch = sw.new_epoch;
        self.tx.set = a.set;
        self.tx.members = members;
        self.tx.switching = None;
        self.tx.changes += 1;
        info!(
            "tx: epoch {} in force over channels {} ({} packets were held)",
            self.tx.epoch,
            set_str(a.set),
            self.tx.pending.len()
        );
        while let Some(m) = self.tx.pending.pop_front() {
            if self.tx.striper.handle_packet(now, m).is_err() {
                self.queue_drops += 1;
            }
        }
        self.take_transmits();
        self.maybe_switch(now);
    }

    // ---- receive direction ----

    fn send_ack_all(&mut self) {
        for c in members_of(self.rx.set) {
            let m = Msg::Ack(EpochAck {
                channel: c as u8,
                epoch: self.rx.epoch,
                set: self.rx.set,
            });
            self.send_ctrl(c, &m);
        }
    }

    fn rx_on_end(&mut self, c: usize, e: EpochEnd, now: Instant) {
        if e.new_epoch == self.rx.epoch {
            // A retransmission after we switched (our ack was lost or crossed a
            // retarget): acknowledge what is in force.
            self.send_ack_all();
            return;
        }
        let members = self.rx.index.iter().filter(|k| k.is_some()).count();
        if e.old_epoch != self.rx.epoch
            || e.old_set != self.rx.set
            || e.finals.len() != members
            || e.new_set & !self.all != 0
        {
            debug!(
                "epoch end for epoch {} ignored (we are at {})",
                e.old_epoch, self.rx.epoch
            );
            return;
        }
        let first = self.rx.pending.is_none();
        self.rx.pending = Some(e);
        if first {
            info!(
                "rx: epoch {} ends; waiting for its end on the new channels",
                self.rx.epoch
            );
        }
        if self.rx.end_seen & bit(c) == 0 {
            self.rx.end_seen |= bit(c);
            if self.rx.set & bit(c) != 0 {
                self.inject_final(c, now);
            }
        }
        let new_set = self.rx.pending.as_ref().map_or(0, |p| p.new_set);
        if new_set & !self.rx.end_seen == 0 {
            self.commit_rx(now);
        }
    }

    /// Put the old epoch's final marker for channel `c` behind its last data, so the
    /// resequencer knows nothing more comes on it in this epoch.
    fn inject_final(&mut self, c: usize, now: Instant) {
        if self.rx.injected & bit(c) != 0 {
            return;
        }
        self.rx.injected |= bit(c);
        let (Some(k), Some(p)) = (self.rx.index[c], &self.rx.pending) else {
            return;
        };
        if !matches!(self.cfg.mode, Mode::Logical | Mode::Seq) {
            return;
        }
        let (round, dc) = p.finals[k];
        if dc <= 0 {
            return;
        }
        let m = marker::Repr {
            channel: k as u8,
            epoch: self.rx.epoch,
            position: Position { round, dc },
            sent: p.seq,
            batch: 0,
            credits: None,
            quantum_change: None,
        };
        self.rx
            .reseq
            .handle_datagram(now, k, Bytes::from(m.to_vec()));
        self.drain_deliver();
    }

    fn commit_rx(&mut self, now: Instant) {
        let Some(p) = self.rx.pending.clone() else {
            return;
        };
        for c in members_of(self.rx.set) {
            self.inject_final(c, now);
        }
        // Nothing more arrives for the old epoch: deliver what it can, in order, and
        // give up on whatever the dead channels took with them.
        self.rx.reseq.drain(now);
        self.drain_deliver();
        self.rx.switch_lost += self.rx.reseq.buffered() as u64;
        self.account_rx();
        let members = members_of(p.new_set);
        self.rx.reseq = Resequencer::new(&self.cfg.stripe_config(&members)).expect("validated");
        self.rx.reseq.set_epoch(p.new_epoch);
        self.rx.index = vec![None; self.n];
        for (k, &m) in members.iter().enumerate() {
            self.rx.index[m] = Some(k);
        }
        self.rx.epoch = p.new_epoch;
        self.rx.set = p.new_set;
        self.rx.pending = None;
        self.rx.end_seen = 0;
        self.rx.injected = 0;
        self.rx.changes += 1;
        info!(
            "rx: epoch {} in force over channels {}",
            self.rx.epoch,
            set_str(p.new_set)
        );
        self.send_ack_all();
    }

    fn snapshot(&self) -> SessionStats {
        let now = self.now();
        let rs = self.rx.reseq.stats();
        let ts = self.tx.striper.stats();
        let mut g = self.rx.base_global.clone();
        add_global(&mut g, rs);
        let mut channels = Vec::new();
        for i in 0..self.n {
            let mut t = self.tx.base[i].clone();
            if let Some(k) = self.tx.members.iter().position(|&m| m == i) {
                add_stats(&mut t, &ts.channels[k]);
            }
            let mut r = self.rx.base[i].clone();
            if let Some(k) = self.rx.index[i] {
                add_stats(&mut r, &rs.channels[k]);
            }
            let c = &self.chans[i];
            let cc = &self.cfg.channels[i];
            channels.push(ChannelSnapshot {
                index: i,
                name: cc.name.clone(),
                local: self.socks[i]
                    .local_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_default(),
                remote: cc.remote.to_string(),
                state: match c.state {
                    LinkState::Waiting => "wait",
                    LinkState::Up => "up",
                    LinkState::Down => "down",
                }
                .into(),
                state_since_s: (now - c.since).as_secs_f64(),
                state_changes: c.changes,
                peer_hears_us: c.peer_hears_us,
                in_tx_set: self.tx.set & bit(i) != 0,
                in_rx_set: self.rx.set & bit(i) != 0,
                tx_datagrams: c.n.tx_datagrams,
                tx_bytes: c.n.tx_bytes,
                tx_data_packets: c.n.tx_data,
                tx_markers: c.n.tx_markers,
                tx_triggers: c.n.tx_triggers,
                tx_errors: c.n.tx_errors,
                rx_datagrams: c.n.rx_datagrams,
                rx_bytes: c.n.rx_bytes,
                rx_data_packets: c.n.rx_data,
                rx_markers: c.n.rx_markers,
                rx_triggers: c.n.rx_triggers,
                rx_hellos: c.n.rx_hellos,
                resyncs: r.resyncs,
                wait_timeouts: r.wait_timeouts,
                overflow_drops: r.overflow_drops,
                auth_failures: c.n.auth_failures,
                replays: c.n.replays,
                malformed: c.n.malformed + r.malformed,
                tx_bps: c.n.tx_bps,
                rx_bps: c.n.rx_bps,
            });
        }
        SessionStats {
            uptime_s: self.origin.elapsed().as_secs_f64(),
            peer_seen: *self.peer_seen.borrow(),
            peer_last_heard_s: self.last_peer.map_or(-1.0, |l| (now - l).as_secs_f64()),
            tx_epoch: self.tx.epoch,
            rx_epoch: self.rx.epoch,
            switching: self.tx.switching.is_some(),
            tx_epoch_changes: self.tx.changes,
            rx_epoch_changes: self.rx.changes,
            sent_packets: self.sent_packets,
            sent_bytes: self.sent_bytes,
            delivered_packets: g.delivered_packets,
            delivered_bytes: g.delivered_bytes,
            out_of_order: g.out_of_order,
            lost: g.lost + self.rx.switch_lost,
            naks_sent: g.naks_sent,
            repaired: g.repaired,
            queue_drops: self.queue_drops,
            deliver_drops: self.deliver_drops,
            stray_drops: self.stray_drops,
            auth_failures: channels.iter().map(|c| c.auth_failures).sum(),
            replays: channels.iter().map(|c| c.replays).sum(),
            malformed: channels.iter().map(|c| c.malformed).sum::<u64>(),
            resyncs: channels.iter().map(|c| c.resyncs).sum(),
            delivered_bps: self.delivered_bps,
            channels,
        }
    }
}
