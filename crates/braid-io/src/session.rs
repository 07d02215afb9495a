//! The session on real sockets: the sans-IO session machine of
//! [`braid_proto::session`] (hellos, liveness, epochs, failover, authentication,
//! counters) driven by a real clock on tokio over one UDP socket per channel.
//!
//! This file only moves bytes and time: a reader task per socket feeds received
//! datagrams to the machine, the application's messages go in through a queue, and the
//! driver sends what the machine polls out, delivers what it releases, logs its events
//! and sleeps until its next timeout. The protocol itself, and its tests in virtual
//! time, are in braid-proto. See `docs/tunnel.md` for the full design.

use std::io::IoSliceMut;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration as StdDuration;

use braid_proto::session::{
    self as machine, members_of, Cipher, Event, HandshakeFailure, HandshakeStats, Mismatch,
};
use braid_proto::wire;
use braid_proto::Instant;
use bytes::Bytes;
use quinn_udp::{RecvMeta, UdpSocketState};
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use crate::admit::Windows;
use crate::chunks::Chunks;
use crate::config::SessionConfig;
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
    #[error("the peer never answered: no authenticated packet within {timeout:?} on any channel ({channels}); {diagnosis}")]
    PeerSilent {
        /// How long we waited.
        timeout: StdDuration,
        /// The channels, `local -> remote`.
        channels: String,
        /// What the handshake counters say about why, and what to check.
        diagnosis: String,
    },
    /// The peer's settings differ from ours in one both ends must share (learnt,
    /// authenticated, in its answer to our handshake).
    #[error("{mismatch}; no session is possible until the two configurations agree")]
    SettingsMismatch {
        /// The first setting that differs, with both values.
        mismatch: Mismatch,
    },
    /// The peer refused our handshake before we ever heard it (unauthenticated: see
    /// `docs/security.md`).
    #[error("channel {index} ({name}, to {remote}): {failure}")]
    HandshakeRefused {
        /// Channel index.
        index: usize,
        /// Channel name.
        name: String,
        /// The peer's address on it.
        remote: String,
        /// Why (boxed: it may hold two keys).
        failure: Box<HandshakeFailure>,
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
    Weights(Vec<u32>),
    /// From now on the driver writes what it delivers to this TUN device itself
    /// ([`Session::deliver_to_tun`], [`Session::deliver_to_shared_tun`]).
    Tun(Arc<crate::tun::Tun>, Option<TunFilter>),
    /// Channel `.0`'s new addresses or device (a reload): what was done, or why not.
    Channel(
        usize,
        Box<crate::config::ChannelConfig>,
        oneshot::Sender<Result<String, String>>,
    ),
    /// A new channel list (a reload added or removed a channel, or changed one's
    /// name, mtu or pace): a new run of the session over it ([`Driver::change_channels`]).
    Channels(Box<SessionConfig>, oneshot::Sender<Result<String, String>>),
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
/// let key = std::fs::read("braid.key").expect("32 random bytes or more");
/// let mut s = Session::start(SessionConfig::new(channels, key)).await?;
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
/// losses allowed. Nothing is retransmitted unless in-bond repair is on (`arq`, every
/// mode: `braid_proto::errctl::link`) or `receiver.repair` (`seq` mode's NAK repair in
/// the resequencer, which the tunnel's config no longer sets).
pub struct Session {
    sender: SessionSender,
    cmd: mpsc::Sender<Cmd>,
    close: watch::Sender<bool>,
    rx: mpsc::Receiver<Bytes>,
    peer: watch::Receiver<Link>,
    /// Whether a rejection of our handshake ends [`Session::wait_for_peer`].
    rejection_fatal: bool,
    task: Option<JoinHandle<()>>,
    locals: Vec<SocketAddr>,
    describe: String,
    /// The name of each channel.
    channels: Vec<String>,
    /// See [`Refusal`].
    grace: StdDuration,
}

/// What the driver tells the application about reaching the peer.
#[derive(Clone, Debug, Default)]
struct Link {
    /// A handshake completed.
    seen: bool,
    /// The handshake counters.
    handshakes: HandshakeStats,
    /// The peer's settings differ (authenticated, in answer to our initiation).
    mismatch: Option<Mismatch>,
    /// The first refusal of our handshake by the peer before it was heard: channel,
    /// why, and the peer's address on the channel.
    rejected: Option<(usize, HandshakeFailure, String)>,
}

/// Resolves when the session cannot reach its peer ([`Session::refusal`]).
pub struct Refusal {
    link: watch::Receiver<Link>,
    rejection_fatal: bool,
    channels: Vec<String>,
    /// How long to go on after the refusal, so that the peer's own initiations meet
    /// our rejection or our settings and the other end learns it too.
    grace: StdDuration,
}

impl Refusal {
    /// Wait for the refusal; it never comes for a session whose peer answers (or if
    /// the session stops).
    pub async fn wait(&mut self) -> SessionError {
        let fatal = self.rejection_fatal;
        let refused = self
            .link
            .wait_for(|l| l.mismatch.is_some() || (fatal && !l.seen && l.rejected.is_some()))
            .await
            .map(|l| l.clone());
        let Ok(l) = refused else {
            return std::future::pending().await;
        };
        tokio::time::sleep(self.grace).await;
        if let Some(mismatch) = l.mismatch {
            return SessionError::SettingsMismatch { mismatch };
        }
        let (index, failure, remote) = l.rejected.expect("waited for it");
        // A channel a reload added since (`Driver::change_channels`) has no name here.
        let name = self
            .channels
            .get(index)
            .cloned()
            .unwrap_or_else(|| format!("channel {index}"));
        SessionError::HandshakeRefused {
            index,
            name,
            remote,
            failure: Box::new(failure),
        }
    }
}

/// Why the peer may not have answered, from the handshake counters, and what to check.
fn diagnose(l: &Link) -> String {
    let h = &l.handshakes;
    if let Some(m) = &l.mismatch {
        return format!("{m}");
    }
    if let Some((_, f, _)) = &l.rejected {
        return format!("{f}");
    }
    if h.initiated > 0 && h.responses == 0 {
        return format!(
            "we sent {} handshake initiation(s), each on every channel, and no response came \
             back: either nothing runs at the remote addresses (is the other end running, and \
             is each channel's remote address the other end's local one?), or the other end \
             does not accept our keys (then it logs \"handshake from ... refused\" errors): \
             check that both ends use the same key file, or with static keys that each has \
             the other's public key as its peer public key",
            h.initiated
        );
    }
    if h.responses > 0 {
        return "the peer answered our handshake but nothing sealed with the new keys got \
                through: check that traffic passes in both directions on some channel"
            .into();
    }
    "is the other end running, with the same key and mirrored addresses?".into()
}

/// A cloneable handle that sends into a [`Session`].
#[derive(Clone)]
pub struct SessionSender {
    data: AppTx,
    /// The largest datagram (less the security envelope) the session takes.
    max_datagram: usize,
    /// The largest the bond carries now: `max_datagram`, lowered by path MTU
    /// discovery (`session::pmtu`), which the driver follows.
    path_datagram: Arc<AtomicUsize>,
    overhead: usize,
}

impl SessionSender {
    /// Whether the session can take `m`: not empty and not larger than a datagram
    /// carries ([`SessionError::TooLarge`] says how large a message may be).
    pub fn check(&self, m: &Bytes) -> Result<(), SessionError> {
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
        self.data.send(AppMsg::One(m)).await
    }

    /// Send messages in order as one batch: the driver takes them all before it sends,
    /// so each channel's share leaves as long GSO trains (a TUN read's segments). Waits
    /// while the input queue, counted in messages, has no room for them all; a batch
    /// longer than the whole queue goes in pieces. If one message cannot be sent
    /// ([`SessionSender::check`]), none is.
    pub async fn send_batch(&self, mut ms: Vec<Bytes>) -> Result<(), SessionError> {
        for m in &ms {
            self.check(m)?;
        }
        while ms.len() > self.data.cap {
            let rest = ms.split_off(self.data.cap);
            self.data.send(AppMsg::Batch(ms)).await?;
            ms = rest;
        }
        if ms.is_empty() {
            return Ok(());
        }
        self.data.send(AppMsg::Batch(ms)).await
    }

    /// Send without waiting; `Ok(false)` if the input queue is full.
    pub fn try_send(&self, m: Bytes) -> Result<bool, SessionError> {
        self.check(&m)?;
        self.data.try_send(AppMsg::One(m))
    }

    /// Send as many of `ms` as the input queue has room for now, in order, as one batch
    /// ([`SessionSender::send_batch`]) without waiting; they are taken from the front
    /// of `ms` and the rest is left there. Returns how many went. If one message cannot
    /// be sent ([`SessionSender::check`]), none is.
    pub fn try_send_batch(&self, ms: &mut Vec<Bytes>) -> Result<usize, SessionError> {
        for m in ms.iter() {
            self.check(m)?;
        }
        let n = ms
            .len()
            .min(self.data.cap)
            .min(self.data.room.available_permits());
        if n == 0 {
            return Ok(0);
        }
        // Another sender may have taken the room meanwhile: then nothing goes.
        if !self.data.try_reserve(n)? {
            return Ok(0);
        }
        let rest = ms.split_off(n);
        let head = std::mem::replace(ms, rest);
        self.data.send_reserved(AppMsg::Batch(head))?;
        Ok(n)
    }

    /// The largest message that does not start with a byte `0xB0..=0xBF` (those need a
    /// one-byte escape in the header-free modes, so one byte less).
    pub fn max_message(&self) -> usize {
        self.max_datagram - self.overhead
    }

    /// The largest message the bond carries now ([`SessionSender::max_message`], or
    /// less while path MTU discovery finds a channel whose path carries less): what
    /// the tunnel clamps TCP's MSS to, cuts segments to and answers larger packets
    /// with ICMP by. A larger message up to `max_message` is still taken, and may be
    /// lost on that channel's path.
    pub fn path_max_message(&self) -> usize {
        self.path_datagram
            .load(Ordering::Relaxed)
            .min(self.max_datagram)
            .saturating_sub(self.overhead)
    }
}

/// The application's messages on their way to the driver: one, or a batch that the
/// driver takes whole (a TUN read's segments).
enum AppMsg {
    One(Bytes),
    Batch(Vec<Bytes>),
}

impl AppMsg {
    fn len(&self) -> usize {
        match self {
            AppMsg::One(_) => 1,
            AppMsg::Batch(v) => v.len(),
        }
    }
}

/// Messages the application may have queued for the driver, at most (a batch counts
/// as its messages).
const APP_QUEUE: usize = 1024;

/// The sending end of the application's queue to the driver. Bounded in messages, not
/// in batches: a sender takes room for each message of a batch before it queues it,
/// and the driver gives the room back as it takes them.
#[derive(Clone)]
struct AppTx {
    tx: mpsc::UnboundedSender<AppMsg>,
    room: Arc<Semaphore>,
    /// The bound: no batch may be longer.
    cap: usize,
}

/// The driver's end of the application's queue; when it goes, senders see `Closed`.
struct AppRx {
    rx: mpsc::UnboundedReceiver<AppMsg>,
    room: Arc<Semaphore>,
}

/// A queue of at most `cap` messages from the application to the driver.
fn app_queue(cap: usize) -> (AppTx, AppRx) {
    let (tx, rx) = mpsc::unbounded_channel();
    let room = Arc::new(Semaphore::new(cap));
    let rx = AppRx {
        rx,
        room: room.clone(),
    };
    (AppTx { tx, room, cap }, rx)
}

impl AppTx {
    /// Queue `m` (at most `cap` messages), waiting for room.
    async fn send(&self, m: AppMsg) -> Result<(), SessionError> {
        let n = u32::try_from(m.len()).map_err(|_| SessionError::Closed)?;
        let permit = self.room.acquire_many(n).await;
        permit.map_err(|_| SessionError::Closed)?.forget();
        self.tx.send(m).map_err(|_| SessionError::Closed)
    }

    /// Queue `m` if there is room now; `Ok(false)` if not.
    fn try_send(&self, m: AppMsg) -> Result<bool, SessionError> {
        if !self.try_reserve(m.len())? {
            return Ok(false);
        }
        self.send_reserved(m)?;
        Ok(true)
    }

    /// Take room for `n` messages if there is that much now; `Ok(false)` if not.
    fn try_reserve(&self, n: usize) -> Result<bool, SessionError> {
        let n = u32::try_from(n).map_err(|_| SessionError::Closed)?;
        match self.room.try_acquire_many(n) {
            Ok(p) => p.forget(),
            Err(tokio::sync::TryAcquireError::NoPermits) => return Ok(false),
            Err(tokio::sync::TryAcquireError::Closed) => return Err(SessionError::Closed),
        }
        Ok(true)
    }

    /// Queue `m`, whose room [`AppTx::try_reserve`] took.
    fn send_reserved(&self, m: AppMsg) -> Result<(), SessionError> {
        self.tx.send(m).map_err(|_| SessionError::Closed)
    }
}

impl AppRx {
    /// The next message or batch; its room is free again.
    async fn recv(&mut self) -> Option<AppMsg> {
        let m = self.rx.recv().await?;
        self.room.add_permits(m.len());
        Some(m)
    }

    /// The next message or batch if one is waiting.
    fn try_recv(&mut self) -> Option<AppMsg> {
        let m = self.rx.try_recv().ok()?;
        self.room.add_permits(m.len());
        Some(m)
    }
}

impl Drop for AppRx {
    fn drop(&mut self) {
        // Senders waiting for room would otherwise wait for ever.
        self.room.close();
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
    if c.local.is_ipv6() {
        // An IPv6 channel carries IPv6 only ([::] would take IPv4 too, as mapped
        // addresses, and clash with an IPv4 channel on the same port).
        sock.set_only_v6(true).map_err(be)?;
    }
    sock.set_nonblocking(true).map_err(be)?;
    sock.bind(&c.local.into()).map_err(be)?;
    // Not connected: the peer's address may change (a NAT's new mapping, roaming) and
    // is followed from its authenticated datagrams (the session machine decides);
    // each send names the destination.
    UdpSocket::from_std(sock.into()).map_err(be)
}

/// Bind channel `i` of `cfg`: its socket, the socket's batched I/O state, and the
/// address it is bound to.
/// A channel list's new weights (`new`'s, where `run_cfg` has the running ones) set
/// on the new run's `machine`, and what the log says of them: trr's receiver cannot
/// follow quanta that move, so there they wait for a restart (as a reload's weights,
/// `reload::session_changes`).
fn new_weights(
    machine: &mut machine::Session,
    new: &SessionConfig,
    run_cfg: &SessionConfig,
) -> Vec<String> {
    let new_w: Vec<u32> = new.channels.iter().map(|c| c.weight).collect();
    let run_w: Vec<u32> = run_cfg.channels.iter().map(|c| c.weight).collect();
    if new_w == run_w {
        return Vec::new();
    }
    if run_cfg.core.mode == braid_proto::Mode::Trr {
        return vec![format!(
            "channel weights {new_w:?} not applied (trr mode): they wait for a restart"
        )];
    }
    vec![match machine.set_weights(&new_w) {
        Ok(()) => format!("channel weights {new_w:?}"),
        Err(e) => format!("channel weights {new_w:?} not applied ({e}): they wait for a restart"),
    }]
}

/// What a change of the channel list from `old` to `new` did, for the log: the count,
/// the kept channels renamed or with another mtu or pace, those `added` or bound anew,
/// and those removed.
fn channel_changes(old: &SessionConfig, new: &SessionConfig, added: &[String]) -> String {
    let (old_n, new_n) = (old.channels.len(), new.channels.len());
    let kept = old_n.min(new_n);
    let removed: Vec<String> = old.channels[kept..]
        .iter()
        .enumerate()
        .map(|(k, c)| format!("{} ({})", kept + k, c.name))
        .collect();
    let changed: Vec<String> = (0..kept)
        .filter_map(|i| {
            let (o, c) = (&old.channels[i], &new.channels[i]);
            if o.name != c.name {
                Some(format!("{i} ({} -> {})", o.name, c.name))
            } else if o.mtu != c.mtu || o.pace_bps != c.pace_bps || o.pace_auto != c.pace_auto {
                Some(format!("{i} ({}): mtu or pace", c.name))
            } else {
                None
            }
        })
        .collect();
    let mut what = format!("channels {old_n} -> {new_n}");
    if !changed.is_empty() {
        what += &format!(", changed: {}", changed.join(", "));
    }
    if !added.is_empty() {
        what += &format!(", added or bound anew: {}", added.join(", "));
    }
    if !removed.is_empty() {
        what += &format!(", removed: {} (socket closed)", removed.join(", "));
    }
    what
}

fn bind_channel(
    cfg: &SessionConfig,
    i: usize,
) -> Result<(Arc<UdpSocket>, Arc<UdpSocketState>, SocketAddr), SessionError> {
    let c = &cfg.channels[i];
    let s = bind(i, c, cfg.socket_buffer)?;
    // Batched I/O: recvmmsg, UDP GRO on receive and GSO on send where the kernel has
    // them (one datagram per call otherwise).
    let state = UdpSocketState::new((&s).into()).map_err(|error| SessionError::Bind {
        index: i,
        name: c.name.clone(),
        addr: c.local,
        hint: " (setting the socket options for batched I/O)",
        error,
    })?;
    let local = s.local_addr().map_err(|error| SessionError::Bind {
        index: i,
        name: c.name.clone(),
        addr: c.local,
        hint: "",
        error,
    })?;
    Ok((Arc::new(s), Arc::new(state), local))
}

/// A set of bound channel sockets: one session's own (a client), or a server's,
/// shared by every peer's session (each sends on them; the server's readers hand each
/// session what is its).
#[derive(Clone)]
pub(crate) struct Channels {
    pub(crate) socks: Vec<Arc<UdpSocket>>,
    pub(crate) states: Vec<Arc<UdpSocketState>>,
    pub(crate) locals: Vec<SocketAddr>,
}

impl Channels {
    /// Bind every channel of `cfg`.
    pub(crate) fn bind(cfg: &SessionConfig) -> Result<Channels, SessionError> {
        let mut socks = Vec::new();
        let mut states = Vec::new();
        let mut locals = Vec::new();
        for i in 0..cfg.channels.len() {
            let (s, state, local) = bind_channel(cfg, i)?;
            socks.push(s);
            states.push(state);
            locals.push(local);
        }
        Ok(Channels {
            socks,
            states,
            locals,
        })
    }

    /// Each reader's share of a driver's input queue, for `cfg`.
    pub(crate) fn limits(cfg: &SessionConfig) -> (usize, Limits) {
        let n = cfg.channels.len().max(1);
        let share = RX_QUEUE_PACKETS.div_ceil(n).max(64);
        (
            share * n,
            Limits {
                packets: share,
                bytes: RX_QUEUE_BYTES / n,
                datagram: cfg.max_datagram() as usize,
            },
        )
    }
}

/// A session driver's channel sockets: a server's shared ones, or a session's own,
/// where a channel whose device does not exist yet has none (it waits for it).
pub(crate) struct Sockets {
    socks: Vec<Option<Arc<UdpSocket>>>,
    states: Vec<Option<Arc<UdpSocketState>>>,
    locals: Vec<SocketAddr>,
}

impl From<Channels> for Sockets {
    fn from(ch: Channels) -> Sockets {
        Sockets {
            socks: ch.socks.into_iter().map(Some).collect(),
            states: ch.states.into_iter().map(Some).collect(),
            locals: ch.locals,
        }
    }
}

impl Sockets {
    /// Bind every channel of `cfg` for a session of its own. A channel whose `device`
    /// does not exist (yet: a modem not enumerated at boot) gets no socket and starts
    /// out of the bond, waiting for its uplink (`crate::uplink`); any other failure
    /// is the session's.
    fn bind_own(cfg: &SessionConfig) -> Result<Sockets, SessionError> {
        let mut out = Sockets {
            socks: Vec::new(),
            states: Vec::new(),
            locals: Vec::new(),
        };
        for (i, c) in cfg.channels.iter().enumerate() {
            match bind_channel(cfg, i) {
                Ok((s, state, local)) => {
                    out.socks.push(Some(s));
                    out.states.push(Some(state));
                    out.locals.push(local);
                }
                Err(SessionError::Device { error, .. })
                    if error.raw_os_error() == Some(libc::ENODEV) =>
                {
                    out.socks.push(None);
                    out.states.push(None);
                    out.locals.push(c.local);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}

/// The way into a served session (a server's peer): its driver's input queue, which
/// the server's readers fill with the datagrams that are this peer's.
pub(crate) struct Inbox {
    tx: mpsc::Sender<Received>,
    budgets: Vec<Arc<Budget>>,
    limits: Limits,
}

impl Inbox {
    /// Sealed datagrams no key of the session could accept, dropped unqueued (all
    /// channels).
    pub(crate) fn implausible(&self) -> u64 {
        self.budgets
            .iter()
            .map(|b| b.implausible.load(Ordering::Relaxed))
            .sum()
    }

    /// Queue datagrams that arrived on `channel` for the session, each within the
    /// channel's share of the queue (what does not fit is dropped and counted, as on a
    /// session's own readers); never waits, so a slow peer holds up no other.
    pub(crate) fn offer(
        &self,
        channel: usize,
        datagrams: Vec<(std::time::Instant, SocketAddr, Bytes)>,
    ) {
        let Some(budget) = self.budgets.get(channel) else {
            return;
        };
        let mut batch = Vec::with_capacity(datagrams.len());
        for (at, from, d) in datagrams {
            if budget.admit(&self.limits, &d, 0) {
                batch.push((at, from, d));
            }
        }
        if batch.is_empty() {
            return;
        }
        if let Err(e) = self.tx.try_send((channel, batch)) {
            let (_, batch) = match e {
                mpsc::error::TrySendError::Full(b) | mpsc::error::TrySendError::Closed(b) => b,
            };
            for (_, _, d) in &batch {
                budget.release(d.len());
                budget.queue_drops.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Session {
    /// Bind every channel's socket and start the driver. Needs a tokio runtime.
    pub async fn start(cfg: SessionConfig) -> Result<Session, SessionError> {
        cfg.validate().map_err(SessionError::Config)?;
        let ch = Sockets::bind_own(&cfg)?;
        // One queue from the readers to the driver, but each channel may hold only its
        // share of it, in packets and in bytes: flooding one port cannot starve the
        // others, and memory stays bounded whatever arrives.
        let (queue, limits) = Channels::limits(&cfg);
        let (net_tx, net_rx) = mpsc::channel(queue);
        let n = ch.socks.len();
        let budgets = Budget::per_channel(n);
        let mut readers = Vec::new();
        for (i, (s, state)) in ch.socks.iter().zip(&ch.states).enumerate() {
            readers.push(match (s, state) {
                (Some(s), Some(state)) => Some(tokio::spawn(reader(
                    i,
                    s.clone(),
                    state.clone(),
                    net_tx.clone(),
                    budgets[i].clone(),
                    limits,
                ))),
                _ => None,
            });
        }
        let pool = HandshakePool::start(HS_QUEUE, HS_QUEUE)
            .map_err(|e| SessionError::Config(format!("cannot start the handshake thread: {e}")))?;
        // Its own sockets: the driver closes and binds them anew as their uplinks go
        // and come back (`crate::uplink`).
        let own = Own::new(&cfg, net_tx, limits, readers);
        Session::launch(cfg, ch, net_rx, budgets, Some(own), pool, None, None)
    }

    /// A peer's session on a server's shared channels: its driver reads only what the
    /// returned [`Inbox`] is given, its key indices start with `index_prefix`, and its
    /// log lines carry `peer`. Needs a tokio runtime.
    pub(crate) fn start_served(
        cfg: SessionConfig,
        ch: &Channels,
        pool: HandshakePool,
        index_prefix: u16,
        peer: &str,
    ) -> Result<(Session, Inbox), SessionError> {
        cfg.validate().map_err(SessionError::Config)?;
        let mut cfg = cfg;
        // Its driver terminates the peer's TCP connections on the shared TUN device:
        // the server's reader hands it the packets to the peer's addresses, and what
        // its stack sends leaves only with a source inside the peer's allowed IPs.
        cfg.serve_tcp();
        let (queue, limits) = Channels::limits(&cfg);
        let (net_tx, net_rx) = mpsc::channel(queue);
        let budgets = Budget::per_channel(ch.socks.len());
        let inbox = Inbox {
            tx: net_tx,
            budgets: budgets.clone(),
            limits,
        };
        let span = tracing::info_span!("peer", peer = %peer);
        let s = Session::launch(
            cfg,
            Sockets::from(ch.clone()),
            net_rx,
            budgets,
            None,
            pool,
            Some(index_prefix),
            Some(span),
        )?;
        Ok((s, inbox))
    }

    #[allow(clippy::too_many_arguments)]
    fn launch(
        cfg: SessionConfig,
        ch: Sockets,
        net_rx: mpsc::Receiver<Received>,
        budgets: Vec<Arc<Budget>>,
        own: Option<Own>,
        pool: HandshakePool,
        index_prefix: Option<u16>,
        span: Option<tracing::Span>,
    ) -> Result<Session, SessionError> {
        let locals = ch.locals.clone();
        let describe = cfg
            .channels
            .iter()
            .zip(&locals)
            .map(|(c, l)| match c.remote {
                Some(r) => format!("{l} -> {r}"),
                None => format!("{l} (waiting for the peer)"),
            })
            .collect::<Vec<_>>()
            .join(", ");
        // Two heartbeats (the peer initiates every heartbeat), and at least 300 ms.
        let grace = cfg
            .heartbeat()
            .saturating_mul(2)
            .max(StdDuration::from_millis(300));
        let channel_names = cfg.channels.iter().map(|c| c.name.clone()).collect();
        let (data_tx, data_rx) = app_queue(APP_QUEUE);
        let (deliver_tx, deliver_rx) = mpsc::channel(8192);
        let (cmd_tx, cmd_rx) = mpsc::channel(64);
        let (close_tx, close_rx) = watch::channel(false);
        let (peer_tx, peer_rx) = watch::channel(Link::default());
        let path_datagram = Arc::new(AtomicUsize::new(cfg.max_inner() as usize));
        let sender = SessionSender {
            data: data_tx,
            max_datagram: cfg.max_inner() as usize,
            path_datagram: path_datagram.clone(),
            overhead: cfg.data_overhead() as usize,
        };
        // Boxed: the driver (the machine in it, some 8 KB) is moved into the task's
        // future once, as a pointer, instead of being held in it twice (as the async
        // fn's argument and as its local), which doubled every idle peer's task.
        let mut driver = Box::new(Driver::new(
            cfg,
            ch,
            deliver_tx,
            peer_tx,
            budgets,
            pool,
            index_prefix,
        )?);
        driver.own = own;
        driver.path_limit = path_datagram;
        let run = driver.run(net_rx, data_rx, cmd_rx, close_rx);
        let task = match span {
            Some(span) => tokio::spawn(tracing::Instrument::instrument(run, span)),
            None => tokio::spawn(run),
        };
        Ok(Session {
            sender,
            cmd: cmd_tx,
            close: close_tx,
            rx: deliver_rx,
            peer: peer_rx,
            rejection_fatal: true,
            task: Some(task),
            locals,
            describe,
            channels: channel_names,
            grace,
        })
    }

    /// The local address of each channel (useful with port 0).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.locals
    }

    /// Wait until an authenticated packet from the peer has arrived. Fails at once if
    /// the peer's settings differ from ours, or (unless
    /// [`Session::keep_trying_when_rejected`]) if the peer rejects our handshake;
    /// after `timeout` with [`SessionError::PeerSilent`], which says what the
    /// handshake counters suggest.
    pub async fn wait_for_peer(&mut self, timeout: StdDuration) -> Result<(), SessionError> {
        let mut refusal = self.refusal();
        let seen = self.peer.wait_for(|l| l.seen);
        let r = tokio::time::timeout(timeout, async {
            tokio::select! {
                r = seen => r.map(|_| ()).map_err(|_| SessionError::Closed),
                e = refusal.wait() => Err(e),
            }
        })
        .await;
        match r {
            Ok(r) => r,
            Err(_) => Err(self.silent(timeout)),
        }
    }

    /// For a long-running session (the tunnel): a rejection of our handshake by the
    /// peer is only logged, and neither [`Session::wait_for_peer`] nor
    /// [`Refusal::wait`] ends for it. A rejection is not authenticated: whoever sees
    /// our initiation could forge one (`docs/security.md`).
    pub fn keep_trying_when_rejected(&mut self) {
        self.rejection_fatal = false;
    }

    /// A handle that resolves when the session learns it cannot reach its peer: the
    /// peer's settings differ (authenticated), or the peer rejected our handshake
    /// before we ever heard it (see [`Session::keep_trying_when_rejected`]).
    pub fn refusal(&self) -> Refusal {
        Refusal {
            link: self.peer.clone(),
            rejection_fatal: self.rejection_fatal,
            channels: self.channels.clone(),
            grace: self.grace,
        }
    }

    /// The error for "nothing authenticated from the peer within `timeout`", with what
    /// the handshake counters say; `None` once the peer has been heard.
    pub fn never_heard(&self, timeout: StdDuration) -> Option<SessionError> {
        (!self.peer.borrow().seen).then(|| self.silent(timeout))
    }

    fn silent(&self, timeout: StdDuration) -> SessionError {
        SessionError::PeerSilent {
            timeout,
            channels: self.describe.clone(),
            diagnosis: diagnose(&self.peer.borrow()),
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

    /// The next message if one is already waiting.
    pub fn try_recv(&mut self) -> Option<Bytes> {
        self.rx.try_recv().ok()
    }

    /// A snapshot of the counters and channel states.
    pub async fn stats(&self) -> Result<SessionStats, SessionError> {
        let (tx, rx) = oneshot::channel();
        self.cmd
            .send(Cmd::Stats(tx))
            .await
            .map_err(|_| SessionError::Closed)?;
        rx.await.map_err(|_| SessionError::Closed)
    }

    /// From now on the driver writes the packets it delivers to `tun` itself (with
    /// receive offload: `crate::tunnel::write_packets`), in the task that opens them,
    /// instead of queueing them for [`Session::recv`]: a packet from the peer crosses
    /// no task (and no thread) on its way to the device. What was queued before is
    /// still there for `recv`, which yields nothing more until the session ends.
    /// The device's MTU follows the bond's (path MTU discovery).
    pub(crate) async fn deliver_to_tun(
        &self,
        tun: Arc<crate::tun::Tun>,
    ) -> Result<(), SessionError> {
        self.cmd
            .send(Cmd::Tun(tun, None))
            .await
            .map_err(|_| SessionError::Closed)
    }

    /// The same for one of a server's peers, whose sessions share `tun`: only the
    /// packets `filter` keeps of each round's are written (it also counts), and
    /// the device's MTU is left alone (it is the largest any peer's bond carries).
    pub(crate) async fn deliver_to_shared_tun(
        &self,
        tun: Arc<crate::tun::Tun>,
        filter: TunFilter,
    ) -> Result<(), SessionError> {
        self.cmd
            .send(Cmd::Tun(tun, Some(filter)))
            .await
            .map_err(|_| SessionError::Closed)
    }

    /// A handle that reads stats without borrowing the session.
    pub fn stats_handle(&self) -> StatsHandle {
        StatsHandle(Handle::Session(self.cmd.clone()))
    }

    /// End the session on purpose: tell the peer (a close message on every channel,
    /// so it does not take the silence that follows for failed channels), stop the
    /// driver and close the sockets. Dropping the session does the same without
    /// waiting.
    pub async fn close(mut self) {
        self.close.send_replace(true);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.close.send_replace(true);
    }
}

/// Reads a session's (or a server's) stats from another task, and changes what a
/// reload changes.
#[derive(Clone)]
pub struct StatsHandle(Handle);

#[derive(Clone)]
enum Handle {
    Session(mpsc::Sender<Cmd>),
    Server(crate::server::ServerHandle),
}

impl StatsHandle {
    pub(crate) fn server(h: crate::server::ServerHandle) -> StatsHandle {
        StatsHandle(Handle::Server(h))
    }

    /// New relative channel weights (see `braid_proto::session::Session::set_weights`;
    /// one per channel, each > 0), without waiting: `Err(Closed)` if the session has
    /// stopped, `Ok(false)` if its command queue is full. Invalid weights are refused
    /// by the session and logged. On a server: every running peer's session.
    pub fn set_weights(&self, weights: Vec<u32>) -> Result<bool, SessionError> {
        match &self.0 {
            Handle::Session(cmd) => match cmd.try_send(Cmd::Weights(weights)) {
                Ok(()) => Ok(true),
                Err(mpsc::error::TrySendError::Full(_)) => Ok(false),
                Err(mpsc::error::TrySendError::Closed(_)) => Err(SessionError::Closed),
            },
            Handle::Server(s) => s.set_weights(weights),
        }
    }

    /// A reload: channel `i` moves to `c`'s local address, device or remote address
    /// (a new socket where the first two change; no new handshake). What was done, or
    /// why not (a server's shared sockets need a restart).
    pub async fn set_channel(
        &self,
        i: usize,
        c: crate::config::ChannelConfig,
    ) -> Result<String, String> {
        match &self.0 {
            Handle::Session(cmd) => {
                let (tx, rx) = oneshot::channel();
                cmd.send(Cmd::Channel(i, Box::new(c), tx))
                    .await
                    .map_err(|_| "the session has stopped".to_string())?;
                rx.await
                    .map_err(|_| "the session has stopped".to_string())?
            }
            Handle::Server(_) => Err(
                "a server's channel sockets are shared by every peer: a restart applies it".into(),
            ),
        }
    }

    /// A reload that changes the channel list (`cfg` is the running session's settings
    /// with the new channels): the session starts a new run over them, with a new
    /// handshake, in the same process (the TUN device and the kept channels' sockets
    /// stay). What was done, or why not (the running session is then untouched).
    pub async fn set_channels(&self, cfg: SessionConfig) -> Result<String, String> {
        match &self.0 {
            Handle::Session(cmd) => {
                let (tx, rx) = oneshot::channel();
                cmd.send(Cmd::Channels(Box::new(cfg), tx))
                    .await
                    .map_err(|_| "the session has stopped".to_string())?;
                rx.await
                    .map_err(|_| "the session has stopped".to_string())?
            }
            Handle::Server(_) => Err(
                "a server's channel sockets are shared by every peer: a restart applies a new channel list (a server may list more channels than a client has: the client's bond runs over those it has)".into(),
            ),
        }
    }

    /// A server's reload: serve exactly `peers` from now on (added ones start being
    /// served, removed ones are closed, the others keep their sessions); what changed,
    /// in words. `Err(Config)` for a point-to-point tunnel.
    pub async fn set_peers(
        &self,
        peers: Vec<crate::config::PeerConfig>,
    ) -> Result<String, SessionError> {
        match &self.0 {
            Handle::Session(_) => Err(SessionError::Config(
                "this tunnel has one peer ([[peer]] sections need a restart)".into(),
            )),
            Handle::Server(s) => s.set_peers(peers).await,
        }
    }

    /// A server's own counters (not its peers' sessions: cheap with many peers); None
    /// for a point-to-point session.
    pub fn server_counters(&self) -> Option<crate::stats::ServerCounters> {
        match &self.0 {
            Handle::Session(_) => None,
            Handle::Server(s) => Some(s.counters()),
        }
    }

    /// A snapshot, or `Closed`.
    pub async fn get(&self) -> Result<SessionStats, SessionError> {
        match &self.0 {
            Handle::Session(cmd) => {
                let (tx, rx) = oneshot::channel();
                cmd.send(Cmd::Stats(tx))
                    .await
                    .map_err(|_| SessionError::Closed)?;
                rx.await.map_err(|_| SessionError::Closed)
            }
            // Boxed: a server's snapshot asks its peers' sessions (this, again).
            Handle::Server(s) => Ok(Box::pin(s.get()).await),
        }
    }
}

/// The application's messages the driver takes per wake-up, about: it stops taking
/// more once it has this many (a batch is taken whole).
const APP_BURST: usize = 128;

/// Datagrams queued from all readers to the driver, at most (shared out per channel).
const RX_QUEUE_PACKETS: usize = 8192;
/// Bytes queued from all readers to the driver, at most (shared out per channel).
const RX_QUEUE_BYTES: usize = 8 << 20;

/// The most bytes in one GSO train. The kernel allows 64 KiB, but a train leaves back to
/// back, and a link with a shallow queue (a modem, a shaper with a 32 KB burst) drops the
/// tail of a 64 KiB one: the speed branch saw bursts of loss (resyncs) on the lab's
/// 20 Mbit/s link with 65 000. 24 000 bytes (16 datagrams of 1500) keeps most of the
/// saving in system calls.
const GSO_MAX_BYTES: usize = 24_000;

/// How many datagrams from the start of `q` go in one GSO train: equal sizes, the last
/// one possibly shorter, at most `max_segments` and [`GSO_MAX_BYTES`] in all. At least 1
/// when `q` is not empty.
fn gso_run(q: &[Bytes], max_segments: usize) -> usize {
    let Some(first) = q.first() else { return 0 };
    let seg = first.len();
    let mut n = 1;
    let mut total = seg;
    while n < q.len() && n < max_segments && total + q[n].len() <= GSO_MAX_BYTES {
        let l = q[n].len();
        if l > seg || l == 0 {
            break;
        }
        n += 1;
        total += l;
        if l < seg {
            break;
        }
    }
    n
}

/// What one channel's reader may have queued for the driver.
#[derive(Clone, Copy)]
pub(crate) struct Limits {
    packets: usize,
    bytes: usize,
    /// Larger datagrams cannot be ours: dropped before they are copied.
    datagram: usize,
}

/// One channel's share of the reader queue, and what did not fit.
struct Budget {
    channel: usize,
    /// The session's keys, as its driver last published them (one for all channels).
    windows: Arc<Windows>,
    packets: AtomicUsize,
    bytes: AtomicUsize,
    /// Dropped because the channel's share was full (a flood, or a slow driver).
    queue_drops: AtomicU64,
    /// Dropped because larger than any channel carries.
    oversize: AtomicU64,
    /// Dropped because no key of the session could accept them ([`crate::admit`]).
    implausible: AtomicU64,
}

impl Budget {
    /// One budget per channel, sharing one set of published keys.
    fn per_channel(channels: usize) -> Vec<Arc<Budget>> {
        let windows = Arc::new(Windows::new(channels));
        (0..channels)
            .map(|channel| {
                Arc::new(Budget {
                    channel,
                    windows: windows.clone(),
                    packets: AtomicUsize::new(0),
                    bytes: AtomicUsize::new(0),
                    queue_drops: AtomicU64::new(0),
                    oversize: AtomicU64::new(0),
                    implausible: AtomicU64::new(0),
                })
            })
            .collect()
    }

    /// Take `d` (a datagram, or GRO segments of `stride` bytes) into the channel's
    /// share of the queue, if it could be the session's and there is room; what is
    /// refused is counted by why, uncopied.
    fn admit(&self, limits: &Limits, d: &[u8], stride: usize) -> bool {
        if d.len() > limits.datagram || stride > limits.datagram {
            self.oversize.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        if !self.windows.admits(self.channel, d) {
            self.implausible.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let full = self.packets.load(Ordering::Relaxed) >= limits.packets
            || self.bytes.load(Ordering::Relaxed) + d.len() > limits.bytes;
        if full {
            self.queue_drops.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        self.packets.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(d.len(), Ordering::Relaxed);
        true
    }

    fn release(&self, len: usize) {
        self.packets.fetch_sub(1, Ordering::Relaxed);
        self.bytes.fetch_sub(len, Ordering::Relaxed);
    }
}

/// What a reader hands the driver: its channel and each datagram with the time it
/// arrived and its source address.
type Received = (usize, Vec<(std::time::Instant, SocketAddr, Bytes)>);

/// When a datagram arrived on the reader's clock: `read_at` (read at wall-clock `wall`)
/// less the age of its kernel receive timestamp `stamp` (wall clock, since the Unix
/// epoch). Without a stamp, or with one that makes no sense (in the future, or over a
/// second old: the wall clock stepped), the read's own time.
pub(crate) fn arrived_at(
    stamp: Option<StdDuration>,
    wall: std::time::SystemTime,
    read_at: std::time::Instant,
) -> std::time::Instant {
    let age = stamp.and_then(|ts| {
        wall.duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .checked_sub(ts)
    });
    match age {
        Some(age) if age <= StdDuration::from_secs(1) => {
            read_at.checked_sub(age).unwrap_or(read_at)
        }
        _ => read_at,
    }
}

/// Datagrams per receive call without GRO (recvmmsg); with GRO, buffers per call.
const RX_BATCH: usize = 32;
const RX_GRO_BUFFERS: usize = 8;
/// Room for the largest UDP payload, and so for any GRO train.
const GRO_BUFFER: usize = 1 << 16;

/// A channel socket's batched receive (recvmmsg, or GRO trains, through quinn-udp): its
/// buffers and what the kernel said of each. The tunnel's readers and the server's
/// demultiplexers share it.
pub(crate) struct BatchRecv {
    sock: Arc<UdpSocket>,
    state: Arc<UdpSocketState>,
    bufs: Vec<Vec<u8>>,
    metas: Vec<RecvMeta>,
}

impl BatchRecv {
    /// Buffers for datagrams of at most `datagram` bytes. Without GRO: one byte more,
    /// so a longer one fills its buffer and is dropped. With GRO a buffer holds a train
    /// of equal segments.
    pub(crate) fn new(sock: Arc<UdpSocket>, state: Arc<UdpSocketState>, datagram: usize) -> Self {
        let (count, size) = if state.gro_segments() > 1 {
            (RX_GRO_BUFFERS.min(quinn_udp::BATCH_SIZE), GRO_BUFFER)
        } else {
            (RX_BATCH.min(quinn_udp::BATCH_SIZE), datagram + 1)
        };
        BatchRecv {
            sock,
            state,
            bufs: (0..count).map(|_| vec![0u8; size]).collect(),
            metas: vec![RecvMeta::default(); count],
        }
    }

    /// Wait for the next batch and hand each datagram in it to `each`, with when it
    /// arrived, where from, and the stride of its GRO train (its own length outside
    /// one). A receive error (an ICMP error queued on the socket) is logged at debug
    /// level and skipped.
    pub(crate) async fn next(
        &mut self,
        channel: usize,
        mut each: impl FnMut(std::time::Instant, SocketAddr, &[u8], usize),
    ) {
        let r = {
            let mut iovs: Vec<IoSliceMut<'_>> =
                self.bufs.iter_mut().map(|b| IoSliceMut::new(b)).collect();
            let (sock, state, metas) = (&self.sock, &self.state, &mut self.metas);
            sock.async_io(Interest::READABLE, || {
                state.recv((&**sock).into(), &mut iovs, metas)
            })
            .await
        };
        // When they arrived: the kernel's receive timestamp of each (SO_TIMESTAMPNS, on
        // the wall clock), else this read. The driver may take several batches at once,
        // and this read may run late on a busy host: a capacity probe times the arrivals
        // (`session::probe`), and a read that ran 3 ms late measured a 50 Mbit/s link at
        // 33 Mbit/s in the lab.
        let read_at = std::time::Instant::now();
        let wall = std::time::SystemTime::now();
        let n = match r {
            Ok(n) => n,
            Err(e) => {
                debug!(channel, "recv error: {e}");
                tokio::time::sleep(StdDuration::from_millis(1)).await;
                return;
            }
        };
        for (m, buf) in self.metas.iter().zip(&self.bufs).take(n) {
            let at = arrived_at(m.timestamp, wall, read_at);
            let len = m.len.min(buf.len());
            let stride = if m.stride == 0 { len } else { m.stride };
            for d in buf[..len].chunks(stride.max(1)) {
                each(at, m.addr, d, stride);
            }
        }
    }
}

async fn reader(
    channel: usize,
    sock: Arc<UdpSocket>,
    state: Arc<UdpSocketState>,
    out: mpsc::Sender<Received>,
    budget: Arc<Budget>,
    limits: Limits,
) {
    let mut rx = BatchRecv::new(sock, state, limits.datagram);
    let mut chunks = Chunks::default();
    // Sized as the last batch was, so that it is allocated once and not grown.
    let mut size = RX_BATCH;
    loop {
        let mut batch = Vec::with_capacity(size);
        rx.next(channel, |at, from, d, stride| {
            if budget.admit(&limits, d, stride) {
                batch.push((at, from, chunks.copy(d)));
            }
        })
        .await;
        size = batch.len().max(RX_BATCH);
        if !batch.is_empty() && out.send((channel, batch)).await.is_err() {
            return;
        }
    }
}

/// A channel's capacity probe in a word (`ChannelSnapshot::probe`).
fn probe_name(c: &machine::ChannelInfo) -> &'static str {
    match c.probe {
        machine::ProbeState::Off => "off",
        machine::ProbeState::Measuring => "measuring",
        machine::ProbeState::Measured { bps }
            if c.pace_configured_bps
                .is_some_and(|r| r < bps * machine::probe::PACE_SHARE) =>
        {
            "capped"
        }
        machine::ProbeState::Measured { .. } => "measured",
        machine::ProbeState::Failed(_) => "failed",
    }
}

/// A channel's capacity probe and pace in words (`ChannelSnapshot::probe_detail`).
fn probe_detail(c: &machine::ChannelInfo) -> String {
    let mbit = |r: f64| format!("{:.1} Mbit/s", r / 1e6);
    let pace = match c.pace_bps {
        Some(r) => format!("paced at {}", mbit(r)),
        None => "unpaced".into(),
    };
    match c.probe {
        machine::ProbeState::Off => match c.pace_configured_bps {
            Some(r) => format!("paced at {} as configured", mbit(r)),
            None => pace,
        },
        machine::ProbeState::Measuring => format!("measuring; {pace} meanwhile"),
        machine::ProbeState::Measured { bps } => match c.pace_configured_bps {
            Some(r) if r < bps * machine::probe::PACE_SHARE => {
                format!(
                    "measured at {}; {pace} (capped at its configured pace)",
                    mbit(bps)
                )
            }
            _ => format!("measured at {}; {pace}", mbit(bps)),
        },
        machine::ProbeState::Failed(f) => format!("probe failed: {f}; {pace} as configured"),
    }
}

/// The peer restarted, re-keyed, went silent or closed the session.
fn log_peer_event(e: Event) {
    match e {
        Event::PeerRestarted => {
            info!("peer restarted (new run): both directions start over at epoch 0")
        }
        Event::Rekeyed => debug!("new session keys"),
        Event::PeerSilent(d) => {
            warn!("peer silent on every channel for {} ms", d.as_micros() / 1000)
        }
        Event::PeerClosed => info!(
            "peer closed the session: its channels go quiet as meant (a new run of it is accepted)"
        ),
        Event::ChannelCountMismatch { ours, theirs } => info!(
            "the peer's run has {theirs} channels and ours {ours}: the bond runs over the first {}; the others stay out of it until both ends list them (a reload at the other end)",
            ours.min(theirs)
        ),
        _ => {}
    }
}

fn set_str(set: u64) -> String {
    format!("{:?}", members_of(set))
}

/// The tokio side of a session: sockets, clock, queues to the application.
struct Driver {
    machine: machine::Session,
    cfg: SessionConfig,
    origin: std::time::Instant,
    /// Per channel: its socket and its batched I/O state (`None` while its uplink is
    /// gone, or its socket could not be bound anew yet).
    socks: Vec<Option<Arc<UdpSocket>>>,
    states: Vec<Option<Arc<UdpSocketState>>>,
    locals: Vec<SocketAddr>,
    /// The session's own sockets, and their uplinks (not on a server's shared ones).
    own: Option<Own>,
    /// Per channel: the datagrams of one round of transmits, in order.
    outq: Vec<Vec<Bytes>>,
    /// Per channel, for each datagram of `outq`: where it goes.
    dests: Vec<Vec<SocketAddr>>,
    /// Per channel: the source of the last handshake message (for the log).
    hs_source: Vec<Option<SocketAddr>>,
    /// Per channel, for each datagram of `outq`: it goes alone (no GSO train).
    alone: Vec<Vec<bool>>,
    /// One GSO train, reused.
    train: Vec<u8>,
    /// The most the send lists (and the train, in bytes) held lately: the room a
    /// burst (a capacity probe's train) left is given back (`braid_proto::room`).
    lists_room: braid_proto::room::Room,
    train_room: braid_proto::room::Room,
    deliver: mpsc::Sender<Bytes>,
    /// Set: delivered packets go to this TUN device, written by the driver itself.
    tun_out: Option<Box<TunOut>>,
    /// TCP carried as byte streams (`crate::pep`): with a TUN device of its own and
    /// `tcp_streams` on.
    pep: Option<Box<crate::pep::Pep>>,
    peer_seen: watch::Sender<Link>,
    /// Messages dropped because the application did not read fast enough.
    deliver_drops: u64,
    /// Per channel: sends the socket refused.
    tx_errors: Vec<u64>,
    /// What [`SessionSender`] takes now (the largest datagram less the security
    /// envelope): the machine's [`machine::Session::path_max_packet`] plus the mode's
    /// header, set at each [`Event::PathMtu`].
    path_limit: Arc<AtomicUsize>,
    /// The TUN device's MTU when it was set up (`tunnel.mtu`, or the bond's): the
    /// most path MTU discovery gives it back.
    tun_mtu_cap: Option<u32>,
    /// Per channel: the readers' queue shares.
    budgets: Vec<Arc<Budget>>,
    /// Public-key work of handshakes, to the handshake thread (bounded: what does not
    /// fit is shed).
    hs_pool: HandshakePool,
    /// Where its results come back.
    hs_done_tx: HsDone,
    hs_done: Option<mpsc::UnboundedReceiver<Box<machine::HandshakeDone>>>,
}

/// Keeps of a round's delivered packets those a server's peer may write to the shared
/// TUN device (its allowed IPs), in order; called once per round in the driver.
pub(crate) type TunFilter = Arc<dyn Fn(&mut Vec<Bytes>) + Send + Sync>;

/// The TUN device a tunnel's driver writes its deliveries to, a batch at a time, and
/// what it wrote.
struct TunOut {
    tun: Arc<crate::tun::Tun>,
    /// A server's peer: what it may write (the device is shared, and its MTU is not
    /// this session's to set).
    filter: Option<TunFilter>,
    /// One round's deliveries, reused.
    batch: Vec<Bytes>,
    /// One frame (`crate::offload::build`), reused.
    frame: Vec<u8>,
    errors: crate::tunnel::Throttle,
    /// Packets written, and in how many writes.
    packets: u64,
    frames: u64,
}

/// Handshake jobs queued for the handshake thread, at most (beyond, they are shed and
/// counted): a flood of initiations that pass the cheap checks costs the data path
/// nothing but those checks.
const HS_QUEUE: usize = 16;

/// Where a session's handshake results come back (boxed: the channel's first block
/// holds 32 of them, and an unboxed result is some hundred bytes, in every session
/// of a server's thousand peers).
type HsDone = mpsc::UnboundedSender<Box<machine::HandshakeDone>>;

/// The handshake thread's queues: sessions' jobs (handshakes under way), then other
/// work (a server reading whose an initiation is). Each bounded; what does not fit is
/// shed.
#[derive(Default)]
struct HsQueues {
    jobs: std::collections::VecDeque<(Box<machine::HandshakeJob>, HsDone)>,
    runs: std::collections::VecDeque<Box<dyn FnOnce() + Send>>,
    /// Every handle is gone: the thread ends once the queues are empty.
    closed: bool,
}

struct HsShared {
    queues: std::sync::Mutex<HsQueues>,
    wake: std::sync::Condvar,
    max_jobs: usize,
    max_runs: usize,
}

/// Closes the queues when the last handle goes.
struct HsOwner(Arc<HsShared>);

impl Drop for HsOwner {
    fn drop(&mut self) {
        if let Ok(mut q) = self.0.queues.lock() {
            q.closed = true;
        }
        self.0.wake.notify_all();
    }
}

/// The handshake thread: runs the public-key work of handshakes off the data tasks,
/// for one session (a client) or every peer's session of a server, until the last
/// handle goes. Its queues are bounded: what does not fit is shed and counted. A
/// session's job (a handshake under way: on a server, an initiation whose sender was
/// read already) runs before other work (reading whose a new initiation is), so a
/// burst of new initiations never sheds the work of those already read.
#[derive(Clone)]
pub(crate) struct HandshakePool(Arc<HsOwner>);

impl HandshakePool {
    /// One thread, `jobs` sessions' jobs and `runs` other work waiting at most.
    pub(crate) fn start(jobs: usize, runs: usize) -> std::io::Result<HandshakePool> {
        let shared = Arc::new(HsShared {
            queues: std::sync::Mutex::new(HsQueues::default()),
            wake: std::sync::Condvar::new(),
            max_jobs: jobs,
            max_runs: runs,
        });
        let s = shared.clone();
        std::thread::Builder::new()
            .name("braid-handshake".into())
            .spawn(move || loop {
                let work = {
                    let Ok(mut q) = s.queues.lock() else { return };
                    loop {
                        if let Some(j) = q.jobs.pop_front() {
                            break Ok(j);
                        }
                        if let Some(r) = q.runs.pop_front() {
                            break Err(r);
                        }
                        if q.closed {
                            return;
                        }
                        q = match s.wake.wait(q) {
                            Ok(q) => q,
                            Err(_) => return,
                        };
                    }
                };
                // A job that panics (a bug) costs that handshake, not the thread: its
                // initiator tries again, and every other session keeps handshaking.
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match work {
                    Ok((job, done)) => {
                        let _ = done.send(Box::new(job.run()));
                    }
                    Err(f) => f(),
                }));
                if ran.is_err() {
                    error!("a handshake job panicked (a bug, please report it with the message above); the handshake thread goes on");
                }
            })?;
        Ok(HandshakePool(Arc::new(HsOwner(shared))))
    }

    /// Queue a session's job; given back if its queue is full.
    fn submit(
        &self,
        job: machine::HandshakeJob,
        done: &HsDone,
    ) -> Result<(), Box<machine::HandshakeJob>> {
        let s = &self.0 .0;
        let job = Box::new(job);
        let Ok(mut q) = s.queues.lock() else {
            return Err(job);
        };
        if q.jobs.len() >= s.max_jobs {
            return Err(job);
        }
        q.jobs.push_back((job, done.clone()));
        drop(q);
        s.wake.notify_one();
        Ok(())
    }

    /// Run `f` on the thread after the sessions' jobs; false (not run) if its queue is
    /// full.
    pub(crate) fn try_run(&self, f: Box<dyn FnOnce() + Send>) -> bool {
        let s = &self.0 .0;
        let Ok(mut q) = s.queues.lock() else {
            return false;
        };
        if q.runs.len() >= s.max_runs {
            return false;
        }
        q.runs.push_back(f);
        drop(q);
        s.wake.notify_one();
        true
    }
}

/// A session's own channel sockets (not a server's shared ones): what the driver needs
/// to close one and bind it anew as its uplink goes and comes back (`crate::uplink`).
struct Own {
    /// Where each channel's reader hands its datagrams, and its share of the queue.
    net_tx: mpsc::Sender<Received>,
    limits: Limits,
    /// Per channel: its reader, while it has a socket.
    readers: Vec<Option<JoinHandle<()>>>,
    /// Per channel: its uplink, if it has one to watch.
    uplinks: Vec<Option<crate::uplink::Uplink>>,
    /// Per watched channel: the interface index its socket was bound for.
    bound: Vec<Option<u32>>,
    /// Per channel: a failed bind was logged (once per outage).
    bind_warned: Vec<bool>,
    /// The doorbell, until the driver's loop takes it (`None`: nothing to watch).
    watch: Option<crate::uplink::Watch>,
    /// When to look at the interfaces without a notification.
    next_look: tokio::time::Instant,
    /// Not looked at yet: the sockets bound at the start are kept as they are.
    first: bool,
    /// The periodic look's interval while nothing waits.
    idle_look: std::time::Duration,
}

impl Own {
    fn new(
        cfg: &SessionConfig,
        net_tx: mpsc::Sender<Received>,
        limits: Limits,
        readers: Vec<Option<JoinHandle<()>>>,
    ) -> Own {
        let uplinks: Vec<_> = cfg.channels.iter().map(crate::uplink::Uplink::of).collect();
        // Only with an uplink to watch (a session on loopback, as the benches' many
        // clients, opens no netlink socket); one that a reload gives a channel later is
        // looked at every SAFETY_NET.
        let watching = uplinks.iter().any(Option::is_some);
        let watch = watching.then(|| {
            let (w, err) = crate::uplink::Watch::start();
            if let Some(e) = err {
                info!(
                    "no interface notifications ({e}): channels' uplinks are looked at every {} s",
                    crate::uplink::SAFETY_NET.as_secs()
                );
            }
            w
        });
        let idle_look = watch
            .as_ref()
            .map_or(crate::uplink::SAFETY_NET, crate::uplink::Watch::idle_look);
        Own {
            net_tx,
            limits,
            readers,
            bound: vec![None; uplinks.len()],
            bind_warned: vec![false; uplinks.len()],
            uplinks,
            watch,
            next_look: tokio::time::Instant::now(),
            first: true,
            idle_look,
        }
    }

    /// Some channel has an uplink to look at.
    fn watching(&self) -> bool {
        self.uplinks.iter().any(Option::is_some)
    }
}

impl Driver {
    fn new(
        cfg: SessionConfig,
        ch: Sockets,
        deliver: mpsc::Sender<Bytes>,
        peer_seen: watch::Sender<Link>,
        budgets: Vec<Arc<Budget>>,
        hs_pool: HandshakePool,
        index_prefix: Option<u16>,
    ) -> Result<Driver, SessionError> {
        let machine =
            new_machine(&cfg, Instant::ZERO, index_prefix).map_err(SessionError::Config)?;
        let (hs_done_tx, hs_done) = mpsc::unbounded_channel();
        let Sockets {
            socks,
            states,
            locals,
        } = ch;
        Ok(Driver {
            hs_pool,
            hs_done_tx,
            hs_done: Some(hs_done),
            machine,
            origin: std::time::Instant::now(),
            tx_errors: vec![0; socks.len()],
            path_limit: Arc::new(AtomicUsize::new(0)),
            tun_mtu_cap: None,
            outq: vec![Vec::new(); socks.len()],
            dests: vec![Vec::new(); socks.len()],
            hs_source: vec![None; socks.len()],
            alone: vec![Vec::new(); socks.len()],
            // Grown on the first train: an idle served peer holds none.
            train: Vec::new(),
            lists_room: braid_proto::room::Room::new(),
            train_room: braid_proto::room::Room::new(),
            socks,
            states,
            locals,
            own: None,
            deliver,
            tun_out: None,
            pep: None,
            peer_seen,
            deliver_drops: 0,
            budgets,
            cfg,
        })
    }

    fn now(&self) -> Instant {
        Instant::from_micros(self.origin.elapsed().as_micros() as u64)
    }

    /// A reader's clock reading on the machine's clock.
    fn at(&self, t: std::time::Instant) -> Instant {
        Instant::from_micros(t.saturating_duration_since(self.origin).as_micros() as u64)
    }

    /// The driver's loop: wait for what comes first (a command, datagrams, the
    /// application's packets, a finished handshake, the machine's next deadline), hand
    /// it to the machine, then carry out what the machine asks; until the session
    /// closes or the command channel is gone.
    async fn run(
        mut self: Box<Self>,
        mut net: mpsc::Receiver<Received>,
        mut data: AppRx,
        mut cmd: mpsc::Receiver<Cmd>,
        mut close: watch::Receiver<bool>,
    ) {
        let mut app_open = true;
        let mut closing = false;
        let mut hs_done = self.hs_done.take().expect("run once");
        let mut hs_open = true;
        // The interfaces' doorbell, and when to look at them anyway.
        let mut watch = self.own.as_mut().and_then(|o| o.watch.take());
        if self.own.as_ref().is_some_and(Own::watching) {
            self.look_at_uplinks().await;
        }
        loop {
            let at = self.wake_at();
            let look_at = self.own.as_ref().map_or(at, |o| o.next_look);
            let watching = self.own.as_ref().is_some_and(Own::watching);
            let mut look = false;
            let mut change = None;
            let mut resize = None;
            tokio::select! {
                _ = async { watch.as_mut().expect("checked").rung().await }, if watch.is_some() => {
                    look = true;
                }
                _ = tokio::time::sleep_until(look_at), if watching => look = true,
                _ = close.wait_for(|&c| c) => closing = true,
                c = cmd.recv() => match c {
                    Some(Cmd::Channel(i, c, reply)) => change = Some((i, c, reply)),
                    Some(Cmd::Channels(c, reply)) => resize = Some((c, reply)),
                    Some(c) => self.on_cmd(c),
                    None => break,
                },
                d = net.recv() => {
                    let Some((c, batch)) = d else { break };
                    self.take_datagram_burst(c, batch, &mut net);
                }
                m = data.recv(), if app_open => match m {
                    Some(m) => self.take_packet_burst(m, &mut data),
                    None => app_open = false,
                },
                d = hs_done.recv(), if hs_open => match d {
                    Some(d) => self.machine.handle_handshake_done(self.now(), *d),
                    None => {
                        hs_open = false;
                        error!("the handshake thread stopped: no more handshakes are answered");
                    }
                },
                _ = tokio::time::sleep_until(at) => {}
            }
            if closing {
                self.close_now().await;
                break;
            }
            if look {
                // The doorbell may have been given up (see `Watch::rung`).
                if let (Some(w), Some(own)) = (&watch, &mut self.own) {
                    own.idle_look = w.idle_look();
                }
                self.look_at_uplinks().await;
            }
            if let Some((i, c, reply)) = change {
                let r = self.change_channel(i, *c).await;
                let _ = reply.send(r);
            }
            if let Some((c, reply)) = resize {
                // Boxed: its future holds a new session machine across awaits, which
                // every peer's task would otherwise carry all its life.
                let r = Box::pin(self.change_channels(*c, &mut net)).await;
                if r.is_ok() {
                    // The old run's handshake work, still on the handshake thread, is
                    // not the new run's: its results go nowhere.
                    let (tx, rx) = mpsc::unbounded_channel();
                    self.hs_done_tx = tx;
                    hs_done = rx;
                    hs_open = true;
                }
                let _ = reply.send(r);
            }
            self.carry_out().await;
        }
        if let Some(own) = &mut self.own {
            for r in own.readers.iter().flatten() {
                r.abort();
            }
        }
        if let Some(t) = &self.tun_out {
            info!(
                "{} packets written to the TUN device in {} writes",
                t.packets, t.frames
            );
        }
    }

    /// When the machine next needs a timeout, on tokio's clock.
    fn wake_at(&self) -> tokio::time::Instant {
        let deadline = self.machine.poll_timeout();
        let mut at = self.origin + StdDuration::from_micros(deadline.as_micros());
        if let Some(t) = self
            .pep
            .as_ref()
            .and_then(|p| p.poll_at(std::time::Instant::now()))
        {
            at = at.min(t);
        }
        tokio::time::Instant::from_std(at)
    }

    /// Look at the interfaces: a channel whose uplink is gone leaves the bond at once
    /// and its socket is closed; one whose uplink is back (or was made anew: a new
    /// interface index) gets a new socket, bound as configured, and rejoins.
    async fn look_at_uplinks(&mut self) {
        let Some(n) = self.own.as_ref().map(|o| o.uplinks.len()) else {
            return;
        };
        let ifs = match crate::uplink::interfaces() {
            Ok(i) => i,
            Err(e) => {
                debug!("cannot list the interfaces: {e}");
                Vec::new()
            }
        };
        let now = self.now();
        let mut pending = false;
        let first = std::mem::replace(&mut self.own.as_mut().expect("own sockets").first, false);
        for c in 0..n {
            let Some(own) = &mut self.own else { return };
            let Some(u) = &own.uplinks[c] else { continue };
            let name = self.cfg.channels[c].name.clone();
            let gone = self.machine.uplink_gone(c);
            match (u.check(&ifs), own.bound[c]) {
                (Ok(k), Some(b)) if k == b => {}
                // The socket bound at the start is for the uplink there now.
                (Ok(k), None) if first && self.socks[c].is_some() => own.bound[c] = Some(k),
                (Ok(k), bound) => {
                    if let Some(b) = bound {
                        info!(channel = c, "channel {c} ({name}): its uplink was made anew (interface index {b} -> {k}): binding its socket again");
                    }
                    self.close_socket(c).await;
                    match self.rebind(c) {
                        Ok(local) => {
                            let own = self.own.as_mut().expect("own sockets");
                            own.bound[c] = Some(k);
                            own.bind_warned[c] = false;
                            if gone {
                                self.machine.set_uplink(now, c, true);
                                info!(channel = c, "channel {c} ({name}): uplink back, socket bound at {local}: rejoining the bond");
                            }
                        }
                        Err(e) => {
                            pending = true;
                            let own = self.own.as_mut().expect("own sockets");
                            if !std::mem::replace(&mut own.bind_warned[c], true) {
                                warn!(channel = c, "channel {c} ({name}): uplink back but {e}; trying again every {} ms", crate::uplink::RETRY.as_millis());
                            }
                            if !gone {
                                self.machine.set_uplink(now, c, false);
                            }
                        }
                    }
                }
                (Err(why), bound) => {
                    if !gone {
                        self.machine.set_uplink(now, c, false);
                        warn!(channel = c, "channel {c} ({name}): uplink gone ({why}): out of the bond until it is back");
                    }
                    if bound.is_some() {
                        self.close_socket(c).await;
                        self.own.as_mut().expect("own sockets").bound[c] = None;
                    }
                }
            }
        }
        if let Some(own) = &mut self.own {
            let wait = if pending {
                crate::uplink::RETRY
            } else {
                own.idle_look
            };
            own.next_look = tokio::time::Instant::now() + wait;
        }
    }

    /// Close channel `c`'s own socket (its reader stops first).
    async fn close_socket(&mut self, c: usize) {
        if let Some(r) = self.own.as_mut().and_then(|o| o.readers[c].take()) {
            r.abort();
            let _ = r.await;
        }
        self.socks[c] = None;
        self.states[c] = None;
    }

    /// Bind channel `c`'s socket anew, as configured, and start its reader; where it
    /// is bound.
    fn rebind(&mut self, c: usize) -> Result<SocketAddr, SessionError> {
        let (sock, state, local) = bind_channel(&self.cfg, c)?;
        let own = self.own.as_mut().expect("own sockets");
        own.readers[c] = Some(tokio::spawn(reader(
            c,
            sock.clone(),
            state.clone(),
            own.net_tx.clone(),
            self.budgets[c].clone(),
            own.limits,
        )));
        self.socks[c] = Some(sock);
        self.states[c] = Some(state);
        self.locals[c] = local;
        Ok(local)
    }

    /// A command from the session's handle: a statistics snapshot, or new weights.
    fn on_cmd(&mut self, c: Cmd) {
        match c {
            Cmd::Stats(reply) => {
                let _ = reply.send(self.snapshot());
            }
            Cmd::Weights(w) => match self.machine.set_weights(&w) {
                Ok(()) => info!("channel weights now {w:?}"),
                Err(e) => warn!("{e}"),
            },
            Cmd::Channel(_, _, reply) | Cmd::Channels(_, reply) => {
                let _ = reply.send(Err("not here".into()));
            }
            Cmd::Tun(tun, filter) => {
                self.tun_mtu_cap = tun.mtu().ok();
                let mtu = tun_mtu_for(self.machine.path_max_packet() as u32, self.tun_mtu_cap);
                if filter.is_none() && self.tun_mtu_cap.is_some_and(|cap| cap > mtu) {
                    // Path MTU discovery lowered the bond before the device came.
                    if let Err(e) = tun.set_mtu(mtu) {
                        warn!("TUN {}: setting the mtu to {mtu} failed: {e}", tun.name());
                    }
                }
                if let Some(st) = &self.machine.config().streams {
                    let at = std::time::Instant::now();
                    let except = st.except_ports.clone();
                    self.pep = Some(Box::new(crate::pep::Pep::new(mtu as usize, except, at)));
                }
                self.tun_out = Some(Box::new(TunOut {
                    tun,
                    filter,
                    // Grown on the first packets: an idle peer of a server costs no
                    // frame buffer (1000 of them held 64 KiB each).
                    batch: Vec::new(),
                    frame: Vec::new(),
                    errors: crate::tunnel::Throttle::new(StdDuration::from_secs(5)),
                    packets: 0,
                    frames: 0,
                }));
            }
        }
    }

    /// Channel `i` moves to `new`'s local address, device or remote address (a
    /// reload): a new remote is where we send from now on; a new local address or
    /// device gets a new socket, bound as configured (the peer follows its new source
    /// from our next authenticated datagram, as it follows a NAT). No handshake, and
    /// the other channels are not touched. What was done, or why not.
    async fn change_channel(
        &mut self,
        i: usize,
        new: crate::config::ChannelConfig,
    ) -> Result<String, String> {
        let Some(old) = self.cfg.channels.get(i).cloned() else {
            return Err(format!("there is no channel {i}"));
        };
        let mut done = Vec::new();
        if new.remote != old.remote {
            if let Some(r) = new.remote {
                self.machine.set_endpoint(i, Some(r));
                done.push(format!("sends to {r}"));
            }
        }
        let rebind = new.local != old.local || new.device != old.device;
        self.cfg.channels[i].remote = new.remote;
        if !rebind {
            return Ok(done.join(", "));
        }
        if self.own.is_none() {
            return Err("a server's channel sockets are shared by every peer: a restart applies a new local address or device".into());
        }
        self.cfg.channels[i].local = new.local;
        self.cfg.channels[i].device = new.device.clone();
        let uplink = crate::uplink::Uplink::of(&new);
        let watched = uplink.is_some();
        {
            let own = self.own.as_mut().expect("own sockets");
            own.uplinks[i] = uplink;
            own.bound[i] = None;
            own.bind_warned[i] = false;
        }
        self.close_socket(i).await;
        if watched {
            // Bound now if its uplink is there, else it waits for it (gone).
            self.look_at_uplinks().await;
        } else {
            let now = self.now();
            if let Err(e) = self.rebind(i) {
                self.machine.set_uplink(now, i, false);
                return Err(format!("{e}; the channel is out of the bond"));
            }
            // A channel whose uplink was gone, now bound with no uplink to watch: back
            // in the bond (nothing else would put it back).
            if self.machine.uplink_gone(i) {
                self.machine.set_uplink(now, i, true);
            }
        }
        match &self.socks[i] {
            Some(_) => done.push(format!("socket bound anew at {}", self.locals[i])),
            None => done.push("its uplink is not there: out of the bond until it is".into()),
        }
        Ok(done.join(", "))
    }

    /// A new channel list (a reload): channels added, removed, or renamed, or with
    /// another mtu or pace. The channel list is shared by both ends, and the session
    /// machine's channels are fixed for a run, so the session starts a new run over
    /// the new list: a new machine, a new handshake (the peer sees a restart), the
    /// TUN device, the application's queues and the kept channels' sockets as they
    /// are. The peer's run may still have the old list (its reload comes later): the
    /// bond then runs over the channels both have, by position, and the others stay
    /// out of it until the peer has them too (`braid_proto::session`, issue 30).
    ///
    /// Refused, with the running session untouched: on a server's shared sockets, a
    /// list that does not validate, one that changes the bond's largest datagram (the
    /// peer's run must share it), or a new channel whose socket cannot be bound.
    async fn change_channels(
        &mut self,
        new: SessionConfig,
        net: &mut mpsc::Receiver<Received>,
    ) -> Result<String, String> {
        if self.own.is_none() {
            return Err("a server's channel sockets are shared by every peer: a restart applies a new channel list".into());
        }
        new.validate()?;
        if new.max_inner() != self.cfg.max_inner() {
            return Err(format!(
                "the bond's largest datagram would change ({} -> {} bytes, from the channels' mtu): both ends' runs must share it, so this needs a restart at both ends",
                self.cfg.max_inner(),
                new.max_inner()
            ));
        }
        let (old_n, new_n) = (self.cfg.channels.len(), new.channels.len());
        let kept = old_n.min(new_n);
        let run_cfg = self.run_config(&new);
        // Sockets for the channels added and the kept ones moved, before anything is
        // torn down: one that cannot be bound leaves the running session as it is.
        let fresh = self.bind_moved(&run_cfg, kept)?;
        let now = self.now();
        let mut machine = new_machine(&run_cfg, now, None)
            .map_err(|e| format!("{e}; the running channels are kept"))?;
        let mut notes = new_weights(&mut machine, &new, &run_cfg);
        self.stop_readers(net).await;
        let was_gone: Vec<bool> = (0..kept).map(|i| self.machine.uplink_gone(i)).collect();
        self.resize_channels(&run_cfg);
        let added = self.take_fresh(fresh, &run_cfg);
        self.start_readers(&mut machine, now, &was_gone);
        notes.insert(0, channel_changes(&self.cfg, &run_cfg, &added));
        notes.push("a new run of the session with a new handshake (the TUN device stays); the bond runs over the channels both ends have until the peer's list is the same".into());
        self.cfg = run_cfg;
        machine.adopt_streams(self.machine.take_streams());
        self.machine = machine;
        self.sync_path_limit();
        Ok(notes.join("; "))
    }

    /// The configuration a new run with the channel list of `new` starts from. The
    /// kept channels keep the weights this run's handshake carried (the peer's run has
    /// them; the file's weights apply on top, as a reload's weights do), and the new
    /// run carries this run's streams on under the same streams run, so that the peer
    /// keeps its side: the connections outlive the reload.
    fn run_config(&self, new: &SessionConfig) -> SessionConfig {
        let mut run_cfg = new.clone();
        for (c, o) in run_cfg.channels.iter_mut().zip(&self.cfg.channels) {
            c.weight = o.weight;
        }
        if self.machine.config().streams.is_some() {
            run_cfg.serve_tcp();
        }
        if let (Some(st), Some(run)) = (run_cfg.core.streams.as_mut(), self.machine.streams_run()) {
            st.run = run;
        }
        run_cfg
    }

    /// Per channel of `run_cfg`: `None` if it is one of the `kept` first and stays
    /// where it is (same local address and device), else a socket bound for it anew
    /// (`Some(None)`: its device is not there yet, and it waits for its uplink). An
    /// error for a socket that cannot be bound.
    #[allow(clippy::type_complexity)]
    fn bind_moved(
        &self,
        run_cfg: &SessionConfig,
        kept: usize,
    ) -> Result<Vec<Option<Option<(Arc<UdpSocket>, Arc<UdpSocketState>, SocketAddr)>>>, String>
    {
        let moved = |i: usize| {
            i >= kept || {
                let (o, c) = (&self.cfg.channels[i], &run_cfg.channels[i]);
                o.local != c.local || o.device != c.device
            }
        };
        let mut fresh = Vec::new();
        for i in 0..run_cfg.channels.len() {
            if !moved(i) {
                fresh.push(None);
                continue;
            }
            match bind_channel(run_cfg, i) {
                Ok(s) => fresh.push(Some(Some(s))),
                Err(SessionError::Device { error, .. })
                    if error.raw_os_error() == Some(libc::ENODEV) =>
                {
                    fresh.push(Some(None))
                }
                Err(e) => return Err(format!("{e}; the running channels are kept")),
            }
        }
        Ok(fresh)
    }

    /// The channel readers stop (they count into the old run's queue shares and admit
    /// by its keys); what they queued was for the old run's keys, and is dropped.
    async fn stop_readers(&mut self, net: &mut mpsc::Receiver<Received>) {
        if let Some(own) = self.own.as_mut() {
            for r in own.readers.iter_mut() {
                if let Some(r) = r.take() {
                    r.abort();
                    let _ = r.await;
                }
            }
        }
        while net.try_recv().is_ok() {}
    }

    /// The per-channel state sized for `run_cfg`'s channels (a new channel's slots
    /// empty), its queue limits and uplinks in force.
    fn resize_channels(&mut self, run_cfg: &SessionConfig) {
        fn fit<T: Default>(v: &mut Vec<T>, n: usize) {
            v.resize_with(n, T::default);
        }
        let n = run_cfg.channels.len();
        let (_, limits) = Channels::limits(run_cfg);
        self.budgets = Budget::per_channel(n);
        fit(&mut self.socks, n);
        fit(&mut self.states, n);
        self.locals.resize(n, run_cfg.channels[0].local);
        fit(&mut self.outq, n);
        fit(&mut self.dests, n);
        fit(&mut self.hs_source, n);
        fit(&mut self.alone, n);
        fit(&mut self.tx_errors, n);
        let Some(own) = self.own.as_mut() else { return };
        own.limits = limits;
        fit(&mut own.readers, n);
        fit(&mut own.bound, n);
        fit(&mut own.bind_warned, n);
        own.uplinks = run_cfg
            .channels
            .iter()
            .map(crate::uplink::Uplink::of)
            .collect();
    }

    /// The sockets [`Driver::bind_moved`] bound, in their channels' places; what was
    /// done, per channel, for the log.
    #[allow(clippy::type_complexity)]
    fn take_fresh(
        &mut self,
        fresh: Vec<Option<Option<(Arc<UdpSocket>, Arc<UdpSocketState>, SocketAddr)>>>,
        run_cfg: &SessionConfig,
    ) -> Vec<String> {
        let Some(own) = self.own.as_mut() else {
            return Vec::new();
        };
        let ifs = crate::uplink::interfaces().unwrap_or_default();
        let mut added = Vec::new();
        for (i, f) in fresh.into_iter().enumerate() {
            let Some(f) = f else { continue };
            own.bound[i] = None;
            own.bind_warned[i] = false;
            let name = &run_cfg.channels[i].name;
            match f {
                Some((sock, state, local)) => {
                    // Bound for the uplink there now (a later look binds it anew only
                    // if that changes).
                    own.bound[i] = own.uplinks[i].as_ref().and_then(|u| u.check(&ifs).ok());
                    self.socks[i] = Some(sock);
                    self.states[i] = Some(state);
                    self.locals[i] = local;
                    added.push(format!("{i} ({name}) bound at {local}"));
                }
                None => {
                    self.socks[i] = None;
                    self.states[i] = None;
                    self.locals[i] = run_cfg.channels[i].local;
                    added.push(format!("{i} ({name}) waiting for its uplink"));
                }
            }
        }
        added
    }

    /// A reader for every channel with a socket; the others, and those whose uplink
    /// was gone (`was_gone`, by channel), are down in the new `machine`. A channel
    /// waiting for its uplink is looked at at once.
    fn start_readers(&mut self, machine: &mut machine::Session, now: Instant, was_gone: &[bool]) {
        let Some(own) = self.own.as_mut() else { return };
        for i in 0..self.socks.len() {
            match (&self.socks[i], &self.states[i]) {
                (Some(s), Some(state)) => {
                    own.readers[i] = Some(tokio::spawn(reader(
                        i,
                        s.clone(),
                        state.clone(),
                        own.net_tx.clone(),
                        self.budgets[i].clone(),
                        own.limits,
                    )));
                    if was_gone.get(i).copied().unwrap_or(false) {
                        machine.set_uplink(now, i, false);
                    }
                }
                _ => machine.set_uplink(now, i, false),
            }
        }
        own.next_look = tokio::time::Instant::now();
    }

    /// A batch of datagrams from channel `c`'s reader, and what else is already
    /// waiting, up to a few batches.
    fn take_datagram_burst(
        &mut self,
        c: usize,
        batch: Vec<(std::time::Instant, SocketAddr, Bytes)>,
        net: &mut mpsc::Receiver<Received>,
    ) {
        self.take_datagrams(c, batch);
        // Take what else is already waiting, up to a few batches.
        for _ in 0..8 {
            match net.try_recv() {
                Ok((c, batch)) => self.take_datagrams(c, batch),
                Err(_) => break,
            }
        }
    }

    /// A message or batch from the application, and what else is already waiting up to
    /// [`APP_BURST`] messages, all at one reading of the clock: the machine has them
    /// all before the driver polls its transmits, so each channel's share leaves as
    /// GSO trains.
    fn take_packet_burst(&mut self, m: AppMsg, data: &mut AppRx) {
        let now = self.now();
        let mut taken = self.take_app(now, m);
        while taken < APP_BURST {
            match data.try_recv() {
                Some(m) => taken += self.take_app(now, m),
                None => break,
            }
        }
    }

    /// Hand the machine a message or a batch; how many messages that was.
    fn take_app(&mut self, now: Instant, m: AppMsg) -> usize {
        match m {
            AppMsg::One(b) => {
                self.take_packet(now, b);
                1
            }
            AppMsg::Batch(v) => {
                let n = v.len();
                for b in v {
                    self.take_packet(now, b);
                }
                n
            }
        }
    }

    /// One packet from the application: to the TCP proxy if it takes it (a TCP
    /// connection's SYN or segment, `crate::pep`), else to the machine.
    fn take_packet(&mut self, now: Instant, b: Bytes) {
        if let Some(pep) = &mut self.pep {
            let t = self.origin + StdDuration::from_micros(now.as_micros());
            if pep.take_tun_packet(t, &self.machine, &b) {
                return;
            }
        }
        self.machine.handle_packet(now, b);
    }

    /// Close the session and send the peer what the machine has to say.
    async fn close_now(&mut self) {
        // On purpose: the peer is told, so it does not warn of the silence.
        self.machine.close(self.now());
        self.send_out().await;
    }

    /// After an input: run the machine's timers, then carry out what it asks
    /// (handshakes to compute, packets to deliver, events to log, datagrams to send).
    async fn carry_out(&mut self) {
        let now = self.now();
        self.machine.handle_timeout(now);
        if let Some(pep) = &mut self.pep {
            let t = self.origin + StdDuration::from_micros(now.as_micros());
            pep.step(t, now, &mut self.machine);
        }
        self.dispatch_handshakes();
        self.deliver_out().await;
        self.log_events();
        // Before anything is sent: no datagram sealed with a key made just now can
        // come back before the readers know the key.
        self.publish_windows();
        self.send_out().await;
    }

    /// Tell the readers which sealed datagrams the session could accept now.
    fn publish_windows(&self) {
        if let Some(b) = self.budgets.first() {
            b.windows.publish(&self.machine);
        }
    }

    async fn deliver_out(&mut self) {
        if let Some(t) = &mut self.tun_out {
            // Everything delivered, in order, written to the device: in-order TCP
            // segments of one flow as one frame.
            while let Some(b) = self.machine.poll_deliver() {
                t.batch.push(b);
            }
            // The TCP proxy's packets to the applications.
            if let Some(pep) = &mut self.pep {
                while let Some(p) = pep.poll_tun_packet() {
                    t.batch.push(Bytes::from(p));
                }
            }
            if let Some(f) = &t.filter {
                f(&mut t.batch);
            }
            if !t.batch.is_empty() {
                let (p, f) =
                    crate::tunnel::write_packets(&t.tun, &t.batch, &mut t.frame, &mut t.errors)
                        .await;
                t.packets += p;
                t.frames += f;
                t.batch.clear();
            }
        }
        while let Some(b) = self.machine.poll_deliver() {
            match self.deliver.try_send(b) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => self.deliver_drops += 1,
                Err(mpsc::error::TrySendError::Closed(_)) => {}
            }
        }
        let (seen, hs) = (self.machine.peer_seen(), self.machine.handshake_stats());
        self.peer_seen.send_if_modified(|l| {
            let changed = l.seen != seen || l.handshakes != *hs;
            l.seen = seen;
            l.handshakes.clone_from(hs);
            changed
        });
    }

    /// Hand the machine's handshake work to the handshake thread; what does not fit in
    /// its queue is shed (the machine counts it; the initiator tries again).
    fn dispatch_handshakes(&mut self) {
        while let Some(job) = self.machine.poll_handshake() {
            if let Err(job) = self.hs_pool.submit(job, &self.hs_done_tx) {
                self.machine.handshake_shed(*job);
            }
        }
    }

    fn take_datagrams(&mut self, c: usize, batch: Vec<(std::time::Instant, SocketAddr, Bytes)>) {
        for (at, from, d) in batch {
            self.budgets[c].release(d.len());
            if matches!(d.first(), Some(&wire::TYPE_HS_INIT | &wire::TYPE_HS_RESP)) {
                self.hs_source[c] = Some(from);
            }
            self.machine.handle_datagram_from(self.at(at), c, from, d);
        }
    }

    /// Send what the machine has to send: per channel in the machine's order, runs of
    /// equal-size datagrams (the last may be shorter) as one GSO train where the kernel
    /// can, otherwise one datagram per call. A capacity probe's datagrams go one per
    /// call: a shaper passes a GSO train whole, and the probe must see the link space
    /// them (`braid_proto::session::probe`); so does a path MTU probe
    /// (`braid_proto::session::pmtu`). The sockets never fragment (quinn-udp sets
    /// `IP_PMTUDISC_PROBE`, and for IPv6 `IPV6_PMTUDISC_PROBE` and `IPV6_DONTFRAG`):
    /// a probe too big for the path is dropped on the way, or refused at once with
    /// `EMSGSIZE`, which quinn-udp takes as sent: the probe is simply lost.
    async fn send_out(&mut self) {
        while let Some(t) = self.machine.poll_transmit() {
            // The machine gives each a destination once it has set endpoints.
            let Some(to) = t.destination else { continue };
            self.outq[t.channel].push(t.bytes);
            self.dests[t.channel].push(to);
            // A path MTU probe goes alone too: one too big for the link fails its
            // send (EMSGSIZE), which must not take a GSO train's other datagrams
            // with it.
            self.alone[t.channel].push(matches!(
                t.kind,
                machine::DatagramKind::Probe | machine::DatagramKind::MtuProbe
            ));
        }
        for q in &self.outq {
            self.lists_room.note(q.len());
        }
        for c in 0..self.outq.len() {
            if self.outq[c].is_empty() {
                continue;
            }
            let q = std::mem::take(&mut self.outq[c]);
            let alone = std::mem::take(&mut self.alone[c]);
            let dests = std::mem::take(&mut self.dests[c]);
            let Some(max_segments) = self.states[c].as_ref().map(|s| s.max_gso_segments().max(1))
            else {
                // No socket (its uplink is gone): nothing leaves.
                self.tx_errors[c] += q.len() as u64;
                self.give_back(c, q, alone, dests);
                continue;
            };
            let mut i = 0;
            while i < q.len() {
                // Up to the next datagram that goes alone, or elsewhere.
                let batchable = (i..q.len())
                    .position(|j| alone[j] || dests[j] != dests[i])
                    .unwrap_or(q.len() - i);
                let n = if alone[i] {
                    1
                } else {
                    gso_run(&q[i..i + batchable], max_segments)
                };
                let to = dests[i];
                if n == 1 {
                    self.send_train(c, to, &q[i], q[i].len(), 1).await;
                } else {
                    let mut train = std::mem::take(&mut self.train);
                    train.clear();
                    for d in &q[i..i + n] {
                        train.extend_from_slice(d);
                    }
                    let seg = q[i].len();
                    self.train_room.note(train.len());
                    self.send_train(c, to, &train, seg, n).await;
                    self.train = train;
                }
                i += n;
            }
            self.give_back(c, q, alone, dests);
        }
        self.trim_lists();
    }

    /// Give back the room of a burst: the send lists and the train shrink to what they
    /// held lately, once per `braid_proto::room::PERIOD` at most.
    fn trim_lists(&mut self) {
        let now = self.now();
        let most = self.outq.iter().map(Vec::capacity).max().unwrap_or(0);
        if let Some(keep) = self.lists_room.check(now, most) {
            for c in 0..self.outq.len() {
                self.outq[c].shrink_to(keep);
                self.dests[c].shrink_to(keep);
                self.alone[c].shrink_to(keep);
            }
        }
        if let Some(keep) = self.train_room.check(now, self.train.capacity()) {
            self.train.shrink_to(keep);
        }
    }

    /// Channel `c`'s send lists, emptied, back in their places (their room is kept
    /// for the next round).
    fn give_back(
        &mut self,
        c: usize,
        mut q: Vec<Bytes>,
        mut alone: Vec<bool>,
        mut dests: Vec<SocketAddr>,
    ) {
        q.clear();
        alone.clear();
        dests.clear();
        self.outq[c] = q;
        self.alone[c] = alone;
        self.dests[c] = dests;
    }

    /// Send `n` datagrams of `seg` bytes (the last may be shorter) in one call.
    async fn send_train(&mut self, c: usize, to: SocketAddr, bytes: &[u8], seg: usize, n: usize) {
        let (Some(sock), Some(state)) = (&self.socks[c], &self.states[c]) else {
            self.tx_errors[c] += n as u64;
            return;
        };
        let t = quinn_udp::Transmit {
            destination: to,
            ecn: None,
            contents: bytes,
            segment_size: (n > 1).then_some(seg),
            src_ip: None,
        };
        let send = || state.try_send(sock.as_ref().into(), &t);
        let r = match sock.try_io(Interest::WRITABLE, send) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                sock.async_io(Interest::WRITABLE, send).await
            }
            r => r,
        };
        if r.is_err() {
            self.tx_errors[c] += n as u64;
        }
    }

    fn log_events(&mut self) {
        while let Some(e) = self.machine.poll_event() {
            match e {
                Event::HandshakeFailed {
                    channel,
                    failure,
                    count,
                } => self.log_handshake_failed(channel, failure, count),
                Event::SettingsMismatch {
                    mismatch,
                    answer,
                    count,
                } => self.log_settings_mismatch(mismatch, answer, count),
                Event::PeerHeard => info!(
                    "peer heard; {} sealed with {}",
                    match self.cfg.core.security {
                        machine::SecurityMode::None => "control (data bare)",
                        _ => "data",
                    },
                    self.machine.cipher().map_or("?", Cipher::name)
                ),
                e @ (Event::PeerRestarted
                | Event::Rekeyed
                | Event::PeerSilent(_)
                | Event::PeerClosed
                | Event::ChannelCountMismatch { .. }) => log_peer_event(e),
                e @ (Event::ChannelDown { .. }
                | Event::EndpointChanged { .. }
                | Event::ChannelUp { .. }
                | Event::PeerHearsUs { .. }) => self.log_channel_reachability(e),
                e @ (Event::ChannelDemoted { .. }
                | Event::ChannelPromoted { .. }
                | Event::ChannelMeasured { .. }
                | Event::ChannelProbeFailed { .. }) => self.log_channel_role(e),
                Event::PathMtu { channel, from, to } => self.on_path_mtu(channel, from, to),
                e @ (Event::TxSwitchStarted { .. }
                | Event::TxRetarget { .. }
                | Event::TxEpoch { .. }
                | Event::ReturnPath { .. }
                | Event::RxEpochEnding { .. }
                | Event::RxEpoch { .. }) => self.log_epoch_event(e),
            }
        }
    }

    /// Path MTU discovery changed channel `channel`'s largest datagram from `from` to
    /// `to`: the bond's largest packet follows the smallest channel, and so do the
    /// sender's limit (the TUN reader's MSS clamp and ICMP answers read it) and the
    /// TUN device's MTU.
    fn on_path_mtu(&mut self, channel: usize, from: u32, to: u32) {
        let bond = self.machine.path_max_packet();
        let name = &self.cfg.channels[channel].name;
        let udp = self.cfg.channels[channel].udp_overhead();
        info!(
            channel,
            "channel {channel} ({name}): path MTU {} -> {} bytes (datagrams of {from} -> {to}); the bond carries packets of {bond} bytes",
            from + udp,
            to + udp
        );
        self.sync_path_limit();
    }

    /// The TUN reader's limit and the TUN device's MTU follow the machine's path
    /// limit: on each path-MTU change, and when a channel-list reload installs a new
    /// run (whose channels start at their configured size: the old run's lowered
    /// limit must not stay).
    fn sync_path_limit(&mut self) {
        let bond = self.machine.path_max_packet();
        let limit = bond + self.cfg.data_overhead() as usize;
        let before = self.path_limit.swap(limit, Ordering::Relaxed);
        if before == limit {
            return;
        }
        if let Some(t) = self.tun_out.as_ref().filter(|t| t.filter.is_none()) {
            let mtu = tun_mtu_for(bond as u32, self.tun_mtu_cap);
            match t.tun.set_mtu(mtu) {
                Ok(()) => info!(
                    "TUN {}: mtu {mtu} (the bond's, from path MTU discovery)",
                    t.tun.name()
                ),
                Err(e) => warn!("TUN {}: setting the mtu to {mtu} failed: {e}", t.tun.name()),
            }
        }
    }

    /// A handshake on `channel` failed `count` times since the last report: the
    /// peer's answer (a refusal) also tells whoever waits for the peer.
    fn log_handshake_failed(&mut self, channel: usize, failure: HandshakeFailure, count: u64) {
        let c = &self.cfg.channels[channel];
        let times = match count {
            1 => String::new(),
            n => format!(" ({n} times since the last report)"),
        };
        // Where the handshake message came from (not the endpoint: only
        // what authenticates moves that).
        let from = self.hs_source[channel]
            .or(self.machine.endpoint(channel))
            .map_or_else(|| "an unknown address".to_string(), |a| a.to_string());
        if failure.is_answer() {
            error!(
                channel,
                "channel {channel} ({}, peer {from}){times}: {failure}", c.name,
            );
            if !self.machine.peer_seen() {
                self.peer_seen.send_if_modified(|l| {
                    let first = l.rejected.is_none();
                    l.rejected.get_or_insert((channel, failure, from));
                    first
                });
            }
        } else {
            error!(
                channel,
                "channel {channel} ({}): handshake from {from} refused{times}: {failure}", c.name,
            );
        }
    }

    /// The peer's settings differ from ours (`count` handshakes refused).
    fn log_settings_mismatch(&mut self, mismatch: Mismatch, answer: bool, count: u64) {
        let times = match count {
            1 => String::new(),
            n => format!(" ({n} handshakes refused since the last report)"),
        };
        error!("handshake refused{times}: {mismatch}");
        if answer {
            self.peer_seen.send_if_modified(|l| {
                let first = l.mismatch.is_none();
                l.mismatch.get_or_insert(mismatch);
                first
            });
        }
    }

    /// A channel went down or came up, its peer moved, or the peer stopped or started
    /// hearing us on it.
    fn log_channel_reachability(&self, e: Event) {
        let name = |c: usize| self.cfg.channels[c].name.as_str();
        match e {
            Event::ChannelDown { channel, silent } => warn!(
                channel,
                "channel {channel} ({}) down: nothing heard for {} ms",
                name(channel),
                silent.as_micros() / 1000
            ),
            Event::EndpointChanged {
                channel,
                from: Some(from),
                to,
            } => info!(
                channel,
                "channel {channel} ({}): peer moved {from} -> {to}",
                name(channel)
            ),
            Event::EndpointChanged {
                channel,
                from: None,
                to,
            } => info!(
                channel,
                "channel {channel} ({}): peer at {to}",
                name(channel)
            ),
            Event::ChannelUp { channel } => {
                info!(channel, "channel {channel} ({}) up again", name(channel))
            }
            Event::PeerHearsUs {
                channel,
                hears: true,
            } => {
                info!(
                    channel,
                    "peer hears us again on channel {channel} ({})",
                    name(channel)
                )
            }
            Event::PeerHearsUs {
                channel,
                hears: false,
            } => {
                warn!(
                    channel,
                    "peer no longer hears us on channel {channel} ({})",
                    name(channel)
                )
            }
            _ => {}
        }
    }

    /// A channel was demoted or promoted, or its rate measured (or not).
    fn log_channel_role(&self, e: Event) {
        let name = |c: usize| self.cfg.channels[c].name.as_str();
        match e {
            Event::ChannelDemoted { channel, reason } => warn!(
                channel,
                "channel {channel} ({}) demoted: {reason}; it carries only probes until it recovers",
                name(channel)
            ),
            Event::ChannelPromoted { channel } => info!(
                channel,
                "channel {channel} ({}) promoted: healthy again, back in the transmit set",
                name(channel)
            ),
            Event::ChannelMeasured {
                channel,
                bps,
                pace_bps,
                capped,
            } => info!(
                channel,
                "channel {channel} ({}) measured at {:.1} Mbit/s on the wire: paced at {:.1} Mbit/s{}",
                name(channel),
                bps as f64 / 1e6,
                pace_bps as f64 / 1e6,
                if capped { ", its configured pace (lower)" } else { "" }
            ),
            Event::ChannelProbeFailed {
                channel,
                reason,
                pace_bps,
            } => warn!(
                channel,
                "channel {channel} ({}) not measured: {reason}; it stays {}",
                name(channel),
                match pace_bps {
                    Some(r) => format!("paced at its configured {:.1} Mbit/s", r as f64 / 1e6),
                    None => "unpaced".into(),
                }
            ),
            _ => {}
        }
    }

    /// The channel sets' epochs and the return path.
    fn log_epoch_event(&self, e: Event) {
        let name = |c: usize| self.cfg.channels[c].name.as_str();
        match e {
            Event::TxSwitchStarted {
                epoch,
                from,
                to,
                sent,
            } => info!(
                "tx: channel set {} -> {}: ending epoch {epoch} after {sent} packets",
                set_str(from),
                set_str(to)
            ),
            Event::TxRetarget { epoch, to } => {
                info!("tx: retargeting epoch {epoch} to channels {}", set_str(to))
            }
            Event::TxEpoch { epoch, set, held } => info!(
                "tx: epoch {epoch} in force over channels {} ({held} packets were held)",
                set_str(set)
            ),
            Event::ReturnPath {
                channel: Some(c),
                reason,
            } => info!(
                channel = c,
                "tx: return path on channel {c} ({}) alone: {reason}",
                name(c)
            ),
            Event::ReturnPath {
                channel: None,
                reason,
            } => info!("tx: return path back on every channel: {reason}"),
            Event::RxEpochEnding { epoch } => {
                info!("rx: epoch {epoch} ends; waiting for its end on the new channels")
            }
            Event::RxEpoch { epoch, set } => {
                info!("rx: epoch {epoch} in force over channels {}", set_str(set))
            }
            _ => {}
        }
    }

    /// `base` with the TCP proxy's counters (`crate::pep`), if it runs.
    fn streams_stats(&self, base: SessionStats) -> SessionStats {
        let Some(p) = &self.pep else {
            return base;
        };
        let c = &p.counters;
        let retransmitted = self
            .machine
            .streams_ref()
            .map_or(0, |s| s.stats().retransmitted_bytes);
        SessionStats {
            streams_open: p.pairs() as u64,
            streams_opened: c.opened,
            streams_connected: c.connected,
            streams_refused: c.refused,
            streams_reset: c.reset,
            streams_tx_bytes: c.bytes_out,
            streams_rx_bytes: c.bytes_in,
            streams_retransmitted_bytes: retransmitted,
            ..base
        }
    }

    /// The session's statistics now: its peer and epochs, and (each from its helper)
    /// its traffic, handshakes, queueing and pacing, and the sums over its channels.
    fn snapshot(&self) -> SessionStats {
        let s = self.machine.stats(self.now());
        let channels: Vec<ChannelSnapshot> = s
            .channels
            .iter()
            .enumerate()
            .map(|(i, c)| self.channel_snapshot(&s, i, c))
            .collect();
        let base = self.traffic_stats(&s, SessionStats::default());
        let base = self.handshake_stats(&s, base);
        let base = queueing_stats(&s, base);
        let base = crate::stats::with_flows(&s.flows, base);
        let base = self.streams_stats(base);
        let base = channel_totals(&channels, base);
        SessionStats {
            uptime_s: self.origin.elapsed().as_secs_f64(),
            peer_seen: s.peer_seen,
            peer_closed: s.peer_closed,
            idle: s.idle,
            peer_last_heard_s: s.peer_last_heard.map_or(-1.0, |d| d.as_secs_f64()),
            tx_epoch: s.tx_epoch,
            rx_epoch: s.rx_epoch,
            switching: s.switching,
            tx_epoch_changes: s.tx_epoch_changes,
            rx_epoch_changes: s.rx_epoch_changes,
            return_path_channel: s.return_path.map_or(-1, |c| c as i64),
            rx_waiting_channel: s.rx_waiting.map_or(-1, |(c, _)| c as i64),
            rx_waiting_s: s.rx_waiting.map_or(0.0, |(_, d)| d.as_secs_f64()),
            return_path_cuts: s.return_path_cuts,
            channels,
            server: None,
            peers: Vec::new(),
            ..base
        }
    }

    /// `base` with the session's packet and byte counts, drops, delivery rate and
    /// transmit queue filled in.
    fn traffic_stats(&self, s: &machine::SessionStats, base: SessionStats) -> SessionStats {
        SessionStats {
            sent_packets: s.sent_packets,
            sent_bytes: s.sent_bytes,
            delivered_packets: s.receiver.delivered_packets,
            delivered_bytes: s.receiver.delivered_bytes,
            out_of_order: s.receiver.out_of_order,
            lost: s.lost,
            naks_sent: s.receiver.naks_sent,
            repaired: s.receiver.repaired,
            queue_drops: s.queue_drops,
            deliver_drops: self.deliver_drops,
            stray_drops: s.stray_drops,
            delivered_bps: s.delivered_bps,
            quanta_changes: s.quanta_changes,
            tx_queued: s.queued as f64,
            ..base
        }
    }

    /// `base` with the session's security mode and handshake counters filled in.
    fn handshake_stats(&self, s: &machine::SessionStats, base: SessionStats) -> SessionStats {
        SessionStats {
            security: self.cfg.core.security.name().into(),
            cipher: self.machine.cipher().map(|c| c.name().to_string()),
            handshakes: s.handshakes.completed,
            handshake_failures: s.handshakes.failed,
            settings_mismatches: s.handshakes.mismatched,
            handshake_mac1_failures: s.handshakes.mac1_failures,
            cookie_replies_sent: s.handshakes.cookie_replies_sent,
            cookie_replies_received: s.handshakes.cookie_replies_received,
            handshakes_rate_limited: s.handshakes.rate_limited,
            handshakes_shed: s.handshakes.shed,
            handshake_replays: s.handshakes.replays,
            ..base
        }
    }

    /// Channel `i`'s part of [`Driver::snapshot`] (`c`: its part of the machine's
    /// statistics `s`): who and where it is, then (each from its helper) its traffic
    /// and its estimates and scheduling.
    fn channel_snapshot(
        &self,
        s: &machine::SessionStats,
        i: usize,
        c: &machine::ChannelInfo,
    ) -> ChannelSnapshot {
        let base = self.channel_traffic(i, c, ChannelSnapshot::default());
        let base = channel_estimates(s, i, c, base);
        ChannelSnapshot {
            index: i,
            name: self.cfg.channels[i].name.clone(),
            local: self.locals[i].to_string(),
            remote: c
                .endpoint
                .map_or_else(|| "-".to_string(), |a| a.to_string()),
            endpoint_changes: c.endpoint_changes,
            state: c.state.name().into(),
            state_since_s: c.state_since.as_secs_f64(),
            state_changes: c.state_changes,
            peer_hears_us: c.peer_hears_us,
            in_tx_set: c.in_tx_set,
            in_rx_set: c.in_rx_set,
            ..base
        }
    }

    /// `base` with channel `i`'s datagram, byte and packet counts each way, its drops
    /// and errors, and its resequencing and security counters filled in.
    fn channel_traffic(
        &self,
        i: usize,
        c: &machine::ChannelInfo,
        base: ChannelSnapshot,
    ) -> ChannelSnapshot {
        ChannelSnapshot {
            tx_datagrams: c.tx_datagrams - self.tx_errors[i],
            tx_bytes: c.tx_bytes,
            tx_data_packets: c.tx_data_packets,
            tx_markers: c.tx_markers,
            tx_triggers: c.tx_triggers,
            tx_discarded: c.tx_discarded,
            tx_errors: self.tx_errors[i],
            rx_queue_drops: self.budgets[i].queue_drops.load(Ordering::Relaxed),
            rx_oversize: self.budgets[i].oversize.load(Ordering::Relaxed),
            rx_implausible: self.budgets[i].implausible.load(Ordering::Relaxed),
            rx_datagrams: c.rx_datagrams,
            rx_bytes: c.rx_bytes,
            rx_data_packets: c.rx_data_packets,
            rx_markers: c.rx_markers,
            rx_triggers: c.rx_triggers,
            rx_hellos: c.rx_hellos,
            resyncs: c.resequencer.resyncs,
            wait_timeouts: c.resequencer.wait_timeouts,
            overflow_drops: c.resequencer.overflow_drops,
            auth_failures: c.auth_failures,
            unauthenticated: c.unauthenticated,
            replays: c.replays,
            handshake_failures: c.handshake_failures,
            malformed: c.malformed,
            ..base
        }
    }
}

/// A session machine for `cfg`, started at `now`, as the driver runs it (at the start
/// and for each new run of a channel-list reload): handshakes' public-key work off the
/// data task; initiations stamped with the wall clock (the peer accepts only newer
/// ones); a server's key-index prefix; each channel's peer address, configured or
/// learnt (and followed) from the peer's authenticated datagrams, to which cookies are
/// bound.
fn new_machine(
    cfg: &SessionConfig,
    now: Instant,
    index_prefix: Option<u16>,
) -> Result<machine::Session, String> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed)
        .map_err(|e| format!("no randomness from the operating system: {e}"))?;
    let mut machine = machine::Session::new(cfg.session_config(), seed, now).map_err(|e| e.0)?;
    machine.offload_handshakes();
    if let Some(p) = index_prefix {
        machine.set_key_index_prefix(p);
    }
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    machine.set_wall_clock(now, unix);
    for (i, c) in cfg.channels.iter().enumerate() {
        machine.set_endpoint(i, c.remote);
    }
    Ok(machine)
}

/// The TUN device's MTU for a bond that carries packets of `bond` bytes: that, never
/// above the device's configured MTU (`cap`) nor below 1280 (IPv6's minimum: below it
/// the kernel takes the device's IPv6 addresses away). A packet between the bond's
/// size and 1280 is answered or fragmented by braid (`crate::icmp`).
fn tun_mtu_for(bond: u32, cap: Option<u32>) -> u32 {
    let floor = bond.max(IPV6_MIN_MTU);
    cap.map_or(floor, |c| c.min(floor))
}

/// The smallest MTU an IPv6 link may have (RFC 8200).
const IPV6_MIN_MTU: u32 = 1280;

/// `base` with the session's AQM, pacing, probe-train and credit counters filled in.
fn queueing_stats(s: &machine::SessionStats, base: SessionStats) -> SessionStats {
    SessionStats {
        aqm_ce_marks: s.aqm.as_ref().map_or(0, |a| a.ce_marks),
        aqm_drops: s.aqm.as_ref().map_or(0, |a| a.drops),
        aqm_spared: s.aqm.as_ref().map_or(0, |a| a.spared),
        aqm_loss_signals: s.aqm.as_ref().map_or(0, |a| a.loss_signals),
        pacing_waits: s.pacing.map_or(0, |p| p.waits),
        pacing_ce_marks: s.pacing.map_or(0, |p| p.ce_marks),
        pacing_drops: s.pacing.map_or(0, |p| p.drops),
        probe_trains: s.probes.trains_sent,
        probe_reports: s.probes.reports,
        bond_mtu: s.path_max_packet as u64,
        credit_stalls: s.credits.map_or(0, |c| c.stalls),
        credits_sent: s.credits.map_or(0, |c| c.credits_sent),
        credit_refused: s.credits.map_or(0, |c| c.refused),
        ..base
    }
}

/// `base` with the sums over the session's channels (authentication and replay
/// failures, malformed datagrams, resyncs, ARQ) filled in.
fn channel_totals(channels: &[ChannelSnapshot], base: SessionStats) -> SessionStats {
    SessionStats {
        auth_failures: channels.iter().map(|c| c.auth_failures).sum(),
        unauthenticated: channels.iter().map(|c| c.unauthenticated).sum(),
        replays: channels.iter().map(|c| c.replays).sum(),
        malformed: channels.iter().map(|c| c.malformed).sum::<u64>(),
        resyncs: channels.iter().map(|c| c.resyncs).sum(),
        arq_missing: channels.iter().map(|c| c.arq_missing).sum(),
        arq_repaired: channels.iter().map(|c| c.arq_repaired).sum(),
        ..base
    }
}

/// `base` with channel `i`'s rate, delay and loss estimates, its scheduling role and
/// weight, and its ARQ, credit, pacing and probe state filled in.
fn channel_estimates(
    s: &machine::SessionStats,
    i: usize,
    c: &machine::ChannelInfo,
    base: ChannelSnapshot,
) -> ChannelSnapshot {
    ChannelSnapshot {
        tx_bps: c.tx_bps,
        rx_bps: c.rx_bps,
        rx_feedback: c.rx_feedback,
        srtt_ms: c.estimate.srtt.map_or(-1.0, |d| d.as_secs_f64() * 1e3),
        rtt_min_ms: c.estimate.rtt_min.map_or(-1.0, |d| d.as_secs_f64() * 1e3),
        delivery_bps: c.estimate.delivery_bps.unwrap_or(-1.0),
        loss_ratio: c.estimate.loss.unwrap_or(-1.0),
        quantum: u64::from(c.quantum),
        role: match c.state {
            braid_proto::session::LinkState::Up => c.role.name().into(),
            other => other.name().into(),
        },
        weight: u64::from(c.weight),
        demoted: c.role != braid_proto::session::Role::Active,
        probing: c.role == braid_proto::session::Role::Probing,
        return_path: s.return_path == Some(i),
        role_since_s: c.role_since.as_secs_f64(),
        demotions: c.demotions,
        window_loss_ratio: c.window_loss.unwrap_or(-1.0),
        queue_delay_ms: s
            .aqm
            .as_ref()
            .and_then(|a| a.queue_delay_us[i])
            .map_or(-1.0, |us| us as f64 / 1e3),
        arq_missing: c.arq.missing,
        arq_repaired: c.arq.repaired,
        arq_given_up: c.arq.given_up,
        arq_resent: c.arq.resent,
        arq_premature: c.arq.premature,
        arq_expired: c.arq.expired,
        arq_rejected: c.arq.rejected,
        credit_balance: c.credit_balance.map_or(-1.0, |b| b as f64),
        pace_bps: c.pace_bps.unwrap_or(-1.0),
        measured_bps: c.measured_bps.unwrap_or(-1.0),
        pace_cuts_on_loss: c.pace_trace.map_or(0, |t| t.cuts_on_loss),
        pace_cuts_on_queue: c.pace_trace.map_or(0, |t| t.cuts_on_queue),
        pace_jitter: c.pace_trace.map_or(0, |t| t.jitter),
        pace_capacity_bps: c.pace_trace.and_then(|t| t.capacity_bps).unwrap_or(-1.0),
        pace_floor_ms: c.pace_trace.map_or(-1.0, |t| t.floor_us as f64 / 1e3),
        probe: probe_name(c).into(),
        probe_detail: probe_detail(c),
        plpmtu: c.pmtu.map_or(-1.0, f64::from),
        pmtu_probes_sent: c.pmtu_stats.probes_sent,
        pmtu_probes_lost: c.pmtu_stats.probes_lost,
        ..base
    }
}

#[cfg(test)]
mod gso_tests {
    use super::*;

    #[test]
    fn the_tun_mtu_follows_the_bond_between_1280_and_its_configured_mtu() {
        assert_eq!(tun_mtu_for(1340, Some(1440)), 1340);
        assert_eq!(tun_mtu_for(1420, Some(1400)), 1400);
        // Never below IPv6's minimum: the kernel would drop the device's IPv6.
        assert_eq!(tun_mtu_for(1220, Some(1440)), 1280);
        assert_eq!(tun_mtu_for(1220, Some(1200)), 1200);
        assert_eq!(tun_mtu_for(1300, None), 1300);
    }

    fn q(sizes: &[usize]) -> Vec<Bytes> {
        sizes.iter().map(|&n| Bytes::from(vec![0u8; n])).collect()
    }

    #[test]
    fn trains_are_equal_sizes_with_a_shorter_last_and_capped() {
        assert_eq!(gso_run(&q(&[]), 64), 0);
        assert_eq!(gso_run(&q(&[1400, 1400, 1400, 60, 1400]), 64), 4);
        assert_eq!(gso_run(&q(&[60, 1400]), 64), 1);
        assert_eq!(gso_run(&q(&[1400; 10]), 3), 3);
        // At most GSO_MAX_BYTES in one train: 17 of 1400 would be 23 800.
        assert_eq!(gso_run(&q(&[1400; 40]), 64), GSO_MAX_BYTES / 1400);
        assert_eq!(gso_run(&q(&[1500; 40]), 64), 16);
    }
}

#[cfg(test)]
mod reader_tests {
    use super::*;

    /// A reader that runs late (here: started after the datagrams arrived, as on a
    /// busy host) still hands each datagram on with the time it arrived, not the time
    /// it was read: a capacity probe times these arrivals.
    #[tokio::test]
    async fn a_late_read_keeps_each_datagrams_arrival_time() {
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_nonblocking(true).unwrap();
        let addr = rx.local_addr().unwrap();
        let state = Arc::new(UdpSocketState::new((&rx).into()).unwrap());
        let rx = Arc::new(UdpSocket::from_std(rx).unwrap());
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        // The kernel turns its receive timestamps on a moment after the first socket
        // asks (a deferred static key): one datagram first, so the test's are stamped.
        tx.send_to(&[255; 100], addr).unwrap();
        std::thread::sleep(StdDuration::from_millis(50));
        let gap = StdDuration::from_millis(5);
        for i in 0..6u8 {
            tx.send_to(&[i; 100], addr).unwrap();
            std::thread::sleep(gap);
        }
        let (out, mut got) = mpsc::channel(16);
        let limits = Limits {
            packets: 64,
            bytes: 1 << 20,
            datagram: 1500,
        };
        let task = tokio::spawn(reader(
            0,
            rx,
            state,
            out,
            Budget::per_channel(1).remove(0),
            limits,
        ));
        let mut stamps = Vec::new();
        while stamps.len() < 6 {
            let (_, batch) = tokio::time::timeout(StdDuration::from_secs(5), got.recv())
                .await
                .expect("the reader hands the datagrams on")
                .unwrap();
            stamps.extend(
                batch
                    .into_iter()
                    .filter(|(_, _, d)| d[0] != 255)
                    .map(|(at, _, d)| (d[0], at)),
            );
        }
        task.abort();
        let order: Vec<u8> = stamps.iter().map(|(i, _)| *i).collect();
        assert_eq!(order, vec![0, 1, 2, 3, 4, 5]);
        // Read in one go, yet stamped as they arrived: 25 ms or more from the first
        // to the last (five gaps of 5 ms), not a few microseconds.
        let span = stamps[5].1.duration_since(stamps[0].1);
        assert!(
            span >= gap * 5 - StdDuration::from_millis(1),
            "span {span:?}"
        );
        assert!(stamps.windows(2).all(|w| w[1].1 >= w[0].1));
    }

    #[test]
    fn a_stamp_that_makes_no_sense_falls_back_to_the_read() {
        let read_at = std::time::Instant::now();
        let wall = std::time::SystemTime::now();
        let since_epoch = wall.duration_since(std::time::UNIX_EPOCH).unwrap();
        // 2 ms old: 2 ms before the read.
        let at = arrived_at(
            Some(since_epoch - StdDuration::from_millis(2)),
            wall,
            read_at,
        );
        assert_eq!(read_at.duration_since(at), StdDuration::from_millis(2));
        // None, in the future, or too old (the wall clock stepped): the read's time.
        assert_eq!(arrived_at(None, wall, read_at), read_at);
        let future = Some(since_epoch + StdDuration::from_millis(5));
        assert_eq!(arrived_at(future, wall, read_at), read_at);
        let old = Some(since_epoch - StdDuration::from_secs(30));
        assert_eq!(arrived_at(old, wall, read_at), read_at);
    }
}

#[cfg(test)]
mod app_queue_tests {
    use super::*;

    /// A sender into `data` of datagrams up to 100 bytes with a 10-byte envelope.
    fn sender_of(data: AppTx) -> SessionSender {
        SessionSender {
            data,
            max_datagram: 100,
            path_datagram: Arc::new(AtomicUsize::new(100)),
            overhead: 10,
        }
    }

    fn batch(n: usize) -> AppMsg {
        AppMsg::Batch((0..n).map(|i| Bytes::from(vec![i as u8; 1])).collect())
    }

    #[test]
    fn the_bound_counts_a_batch_as_its_messages() {
        let (tx, mut rx) = app_queue(4);
        assert!(tx.try_send(batch(3)).unwrap());
        // One message of room left: a batch of two does not fit, one message does.
        assert!(!tx.try_send(batch(2)).unwrap());
        assert!(tx.try_send(AppMsg::One(Bytes::from_static(b"x"))).unwrap());
        assert!(!tx.try_send(AppMsg::One(Bytes::from_static(b"y"))).unwrap());
        // Taking the batch frees its three.
        assert_eq!(rx.try_recv().map(|m| m.len()), Some(3));
        assert!(tx.try_send(batch(3)).unwrap());
        assert!(!tx.try_send(batch(1)).unwrap());
    }

    #[tokio::test]
    async fn senders_see_closed_when_the_driver_goes() {
        let (tx, rx) = app_queue(2);
        assert!(tx.try_send(batch(2)).unwrap());
        let waiting = tokio::spawn({
            let tx = tx.clone();
            async move { tx.send(batch(1)).await }
        });
        tokio::task::yield_now().await;
        drop(rx);
        assert!(matches!(waiting.await.unwrap(), Err(SessionError::Closed)));
        assert!(matches!(tx.try_send(batch(1)), Err(SessionError::Closed)));
    }

    #[tokio::test]
    async fn a_batch_longer_than_the_queue_goes_in_order_in_pieces() {
        let (data, mut rx) = app_queue(4);
        let sender = sender_of(data);
        let ms: Vec<Bytes> = (0..10u8).map(|i| Bytes::from(vec![i; 5])).collect();
        let send = tokio::spawn(async move { sender.send_batch(ms).await });
        let mut got = Vec::new();
        while got.len() < 10 {
            match rx.recv().await.expect("sender alive") {
                AppMsg::Batch(v) => {
                    assert!(v.len() <= 4, "a piece of {} in a queue of 4", v.len());
                    got.extend(v.iter().map(|b| b[0]));
                }
                AppMsg::One(_) => panic!("a batch arrived as single messages"),
            }
        }
        send.await.unwrap().unwrap();
        assert_eq!(got, (0..10u8).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_batch_with_one_unfit_message_sends_none() {
        let (data, mut rx) = app_queue(4);
        let sender = sender_of(data);
        let ms = vec![Bytes::from_static(b"ok"), Bytes::from(vec![1u8; 91])];
        let r = sender.send_batch(ms).await;
        assert!(
            matches!(r, Err(SessionError::TooLarge { max: 90, .. })),
            "{r:?}"
        );
        assert!(rx.try_recv().is_none());
    }

    #[test]
    fn a_batch_tried_sends_the_head_that_fits_in_order_and_says_how_much() {
        let (data, mut rx) = app_queue(4);
        let sender = sender_of(data);
        let ms = |from: u8, n: u8| -> Vec<Bytes> {
            (from..from + n).map(|i| Bytes::from(vec![i; 5])).collect()
        };
        let mut first = ms(0, 3);
        assert_eq!(sender.try_send_batch(&mut first).unwrap(), 3);
        assert!(first.is_empty());
        // One message of room left: the head of the next batch goes, the rest stays.
        let mut next = ms(3, 3);
        assert_eq!(sender.try_send_batch(&mut next).unwrap(), 1);
        assert_eq!(next.iter().map(|b| b[0]).collect::<Vec<_>>(), vec![4, 5]);
        assert_eq!(sender.try_send_batch(&mut next).unwrap(), 0);
        assert_eq!(next.len(), 2);
        let mut got = Vec::new();
        while let Some(m) = rx.try_recv() {
            match m {
                AppMsg::Batch(v) => got.extend(v.iter().map(|b| b[0])),
                AppMsg::One(_) => panic!("a batch arrived as a single message"),
            }
        }
        assert_eq!(got, vec![0, 1, 2, 3]);
        // A batch with a message the session cannot take sends none of it.
        let mut bad = vec![Bytes::from_static(b"ok"), Bytes::from(vec![1u8; 91])];
        assert!(matches!(
            sender.try_send_batch(&mut bad),
            Err(SessionError::TooLarge { .. })
        ));
        assert!(rx.try_recv().is_none());
    }
}

#[cfg(test)]
mod task_size_tests {
    use super::*;

    /// A session's task holds its driver (and the machine in it, some 8 KB) once, by
    /// a pointer: an async fn holds its arguments in its future, and a driver moved in
    /// by value was held there twice, so every idle peer of a server paid for it
    /// twice (issue 30).
    #[tokio::test]
    async fn the_task_holds_the_driver_by_a_pointer() {
        let any = "127.0.0.1:0".parse().unwrap();
        let channels = (0..2)
            .map(|c| crate::ChannelConfig::new(format!("c{c}"), any, any))
            .collect();
        let cfg = SessionConfig::new(channels, "a braid-io test key of 32 bytes or more");
        let ch = Channels::bind(&cfg).unwrap();
        let pool = HandshakePool::start(HS_QUEUE, HS_QUEUE).unwrap();
        let (_net_tx, net_rx) = mpsc::channel(16);
        let (_data_tx, data_rx) = app_queue(APP_QUEUE);
        let (deliver_tx, _deliver_rx) = mpsc::channel(16);
        let (_cmd_tx, cmd_rx) = mpsc::channel(4);
        let (_close_tx, close_rx) = watch::channel(false);
        let (peer_tx, _peer_rx) = watch::channel(Link::default());
        let budgets = Budget::per_channel(2);
        let driver = Driver::new(
            cfg,
            Sockets::from(ch),
            deliver_tx,
            peer_tx,
            budgets,
            pool,
            Some(1),
        )
        .unwrap();
        let driver_size = std::mem::size_of_val(&driver);
        let task = Box::new(driver).run(net_rx, data_rx, cmd_rx, close_rx);
        let task_size = std::mem::size_of_val(&task);
        // Some 1 KB when written (the driver 7.9 KB); 16.7 KB with the driver by value.
        assert!(
            task_size < driver_size / 4,
            "the task's future is {task_size} bytes, the driver {driver_size}"
        );
    }
}
