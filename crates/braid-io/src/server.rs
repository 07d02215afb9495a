//! A tunnel that serves many peers (`[[peer]]` sections): one set of channel sockets,
//! one TUN device, and one session machine per peer, each with its own striping,
//! resequencing, keys and counters (`docs/tunnel.md`, "Server and clients").
//!
//! * **Demultiplexing.** A reader per channel socket hands each datagram to the peer it
//!   is for: a sealed datagram (or a handshake response, rejection or cookie reply) by
//!   the receiver's key index it carries, whose high 16 bits name the peer's session
//!   (each session chooses its indices under its own prefix); an initiation by the
//!   static public key inside it, read on the handshake thread after the cheap mac1
//!   check. An initiation from a key no `[[peer]]` has is dropped and counted and
//!   creates nothing.
//! * **Lazily.** A peer's session (its machine, queues and driver task) starts with its
//!   first initiation that reads; a peer that never connects is a table entry.
//! * **Cryptokey routing** ([`Routes`]): a packet from the TUN goes to the peer whose
//!   allowed IPs hold its destination (longest prefix match); a packet from a peer is
//!   written to the TUN only if its source is in that peer's allowed IPs. Everything
//!   else is dropped, counted and (at most once per period) logged.
//! * **Isolation.** Nothing waits on a peer: the readers and the TUN reader queue
//!   without waiting (a full queue drops, counted for that peer), each peer's driver
//!   and its TUN writer are tasks of their own, and the shared table is only read
//!   under a lock held for a lookup.
//! * **Reload** ([`StatsHandle::set_peers`]): peers added start being served, removed
//!   ones are closed and forgotten, and the others (same public key) keep their
//!   sessions; their allowed IPs and names may change.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use braid_proto::session::{
    address_bytes, index_prefix, receiver_index, InitiationReader, ServerCookies,
};
use braid_proto::wire;
use bytes::Bytes;
use ipnet::IpNet;
use prefix_trie::joint::JointPrefixMap;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use crate::config::{PeerConfig, SessionConfig};
use crate::keys;
use crate::segment::Segmenter;
use crate::session::{
    BatchRecv, Channels, HandshakePool, Inbox, Session, SessionError, SessionSender,
};
use crate::stats::{PeerStats, ServerCounters, SessionStats};
use crate::tun::Tun;
use crate::tunnel::{write_packets, Throttle};

/// The peers' allowed IPs: which peer (its slot) owns the longest prefix holding an
/// address. Both families in one table.
#[derive(Clone, Default)]
pub struct Routes {
    map: JointPrefixMap<IpNet, u16>,
}

impl Routes {
    /// The table of these peers' prefixes, each peer by its slot.
    pub fn new<'a>(peers: impl IntoIterator<Item = (u16, &'a [IpNet])>) -> Routes {
        let mut map = JointPrefixMap::new();
        for (slot, nets) in peers {
            for n in nets {
                map.insert(*n, slot);
            }
        }
        Routes { map }
    }

    /// The slot of the peer whose prefix holding `ip` is the longest.
    pub fn lookup(&self, ip: IpAddr) -> Option<u16> {
        self.map.get_lpm(&IpNet::from(ip)).map(|(_, &slot)| slot)
    }
}

/// The source and destination of an IPv4 or IPv6 packet.
pub fn addresses(pkt: &[u8]) -> Option<(IpAddr, IpAddr)> {
    match pkt.first()? >> 4 {
        4 if pkt.len() >= 20 => {
            let a = |at: usize| -> Option<IpAddr> {
                Some(IpAddr::from(<[u8; 4]>::try_from(&pkt[at..at + 4]).ok()?))
            };
            Some((a(12)?, a(16)?))
        }
        6 if pkt.len() >= 40 => {
            let a = |at: usize| -> Option<IpAddr> {
                Some(IpAddr::from(<[u8; 16]>::try_from(&pkt[at..at + 16]).ok()?))
            };
            Some((a(8)?, a(24)?))
        }
        _ => None,
    }
}

/// A running peer's session, as the others reach it.
struct Running {
    inbox: Inbox,
    sender: SessionSender,
    stats: crate::session::StatsHandle,
    /// Closes the session (its TUN writer owns it).
    stop: watch::Sender<bool>,
}

/// Counters of one peer that are the server's, not its session's.
#[derive(Default)]
struct PeerCounters {
    /// Packets from it whose source is outside its allowed IPs.
    source_not_allowed: AtomicU64,
    /// Packets from the TUN for it while its session was not running.
    not_connected: AtomicU64,
    /// Packets from the TUN for it its session's queue had no room for.
    tx_queue_drops: AtomicU64,
    /// Packets from it written to the TUN.
    to_tun: AtomicU64,
}

/// One configured peer.
struct Peer {
    slot: u16,
    cfg: Mutex<PeerConfig>,
    running: OnceLock<Running>,
    /// Initiations that arrived before its session started (the control task hands
    /// them over once it has): at most [`WAITING`].
    waiting: Mutex<Vec<Arrived>>,
    counters: PeerCounters,
}

impl Peer {
    fn name(&self) -> String {
        self.cfg.lock().map(|c| c.name.clone()).unwrap_or_default()
    }
}

/// Who is served, as every task sees it (replaced whole on a reload).
#[derive(Default)]
struct Table {
    by_slot: HashMap<u16, Arc<Peer>>,
    by_key: HashMap<[u8; 32], Arc<Peer>>,
    routes: Routes,
}

/// The server's own counters (`ServerCounters`).
#[derive(Default)]
struct Counters {
    unknown_peer: AtomicU64,
    unreadable_initiations: AtomicU64,
    initiation_mac1_failures: AtomicU64,
    initiations_shed: AtomicU64,
    initiation_copies: AtomicU64,
    cookie_replies: AtomicU64,
    stale_cookies: AtomicU64,
    initiations_rate_limited: AtomicU64,
    oversized: AtomicU64,
    unknown_index: AtomicU64,
    unroutable: AtomicU64,
    no_route: AtomicU64,
    source_not_allowed: AtomicU64,
    not_ip: AtomicU64,
    peers_added: AtomicU64,
    peers_removed: AtomicU64,
}

/// A peer whose initiation was read while its session does not run: for the control
/// task, which starts it and hands over what waits in [`Peer::waiting`].
type Identified = [u8; 32];

/// Rate-limited warnings shared by the tasks.
struct Logs {
    unknown_peer: Throttle,
    spoofed: Throttle,
    no_route: Throttle,
    load: Throttle,
}

/// What an initiation must pass before its key is read (public-key work), for the
/// whole server: the handshake-security issue's defences, in front of every peer's
/// session (`docs/security.md`, "What a server checks").
struct Gate {
    cookies: ServerCookies,
    /// Initiations asked to be read in the current second, and when it started.
    window: (std::time::Instant, u32),
    /// Under load until then: an initiation needs a mac2 over our cookie.
    load_until: Option<std::time::Instant>,
    /// Per source (channel, address): the GCRA's theoretical arrival time.
    sources: HashMap<(usize, SocketAddr), Option<std::time::Instant>>,
    /// The cookie replies' GCRA.
    replies: Option<std::time::Instant>,
    /// The cookie replies per source, counted in [`REPLY_SLOTS`] slots picked by a
    /// keyed hash of the source (channel, address), each `second << 8 | replies` (the
    /// cookies' clock in whole seconds, its low 24 bits). Empty until the first reply.
    reply_slots: Vec<u32>,
    /// The hash that picks a source's slot, keyed at random (a forger cannot aim at
    /// another source's slot).
    reply_hash: std::collections::hash_map::RandomState,
    /// The cookies' clock starts here.
    epoch: std::time::Instant,
}

/// The initiations read lately (mac1 -> the initiator's key): the copies a client sends
/// on its other channels, and replays, reach its session without public-key work.
#[derive(Default)]
struct Known {
    keys: HashMap<[u8; 16], [u8; 32]>,
    order: std::collections::VecDeque<[u8; 16]>,
}

impl Known {
    fn get(&self, mac1: &[u8; 16]) -> Option<[u8; 32]> {
        self.keys.get(mac1).copied()
    }

    fn insert(&mut self, mac1: [u8; 16], key: [u8; 32]) {
        if self.keys.insert(mac1, key).is_none() {
            self.order.push_back(mac1);
        }
        while self.order.len() > KNOWN_INITIATIONS {
            if let Some(old) = self.order.pop_front() {
                self.keys.remove(&old);
            }
        }
    }
}

/// The initiations being read (mac1 -> its copies that arrived meanwhile, on other
/// channels): a copy waits for the read instead of being read again (public-key work
/// twice over for every client, with two channels), and is passed on with it.
type Copy = (usize, std::time::Instant, SocketAddr, Bytes);

#[derive(Default)]
struct Pending {
    copies: HashMap<[u8; 16], Vec<Copy>>,
}

/// What every task of the server shares.
pub(crate) struct Shared {
    base: SessionConfig,
    channels: Channels,
    pool: HandshakePool,
    initiations: InitiationReader,
    table: RwLock<Arc<Table>>,
    counters: Counters,
    identified: mpsc::Sender<Identified>,
    /// To the initiation thread (see [`INITIATION_QUEUE`]).
    arrived: mpsc::Sender<Arrived>,
    gate: Mutex<Gate>,
    known: Mutex<Known>,
    pending: Mutex<Pending>,
    logs: Mutex<Logs>,
    started: std::time::Instant,
    tun: Arc<Tun>,
    next_slot: Mutex<u16>,
}

/// Peers waiting for the control task to start their sessions, at most.
const IDENTIFIED_QUEUE: usize = 1024;
/// Initiations held for a peer whose session is being started, at most (one for each
/// channel and source address); beyond, shed.
const WAITING: usize = 16;
/// The handshake thread's queues on a server: every peer's handshake jobs, and (after
/// them) the reading of new initiations. Deep enough for a thousand clients that start
/// at once (each initiation on every channel; the copies wait for the first read, see
/// [`Pending`]): at some 0.3 ms of public-key work per handshake a full queue is
/// worked off in about a third of a second, within the clients' one-second retry. A
/// shallow one (64) shed most of such a burst, and each shed client waited a second.
const SERVER_HS_JOBS: usize = 1024;
const SERVER_HS_READS: usize = 1024;
/// Initiations the channel readers hand to the initiation thread, waiting at most:
/// beyond, dropped (`initiations_shed`). The readers only queue them: checking one
/// (mac1, the gate) and answering it with a cookie reply (sealing it, a send of its
/// own) took a reader some microseconds, and under a flood of 100 000 a second the
/// readers fell behind the socket, whose full buffer then dropped the peers' data with
/// the forgeries (half of it, with 100 peers on this machine).
const INITIATION_QUEUE: usize = 4096;

/// An initiation as it arrived: channel, when, from where, its bytes.
type Arrived = (usize, std::time::Instant, SocketAddr, Bytes);

/// The shared state, and the receiving ends of the initiations read (for the control
/// task) and of those that arrived (for the initiation thread).
type Started = (
    Arc<Shared>,
    mpsc::Receiver<Identified>,
    mpsc::Receiver<Arrived>,
);

/// Copies of one initiation (on other channels) held while it is read, at most.
const PENDING_COPIES: usize = 8;
/// An initiation that waited this long for the handshake thread is not read (counted
/// as shed): its sender has replaced it by now (an initiator sends a new one after a
/// second and a random part of a third, `braid_proto::session::crypto`), and the
/// answer to it would be refused. Under a backlog, reading those only made the next
/// ones wait longer.
const READ_WITHIN: Duration = Duration::from_secs(1);
/// Initiations asked to be read in one second above which the server is under load
/// (about a tenth of what its handshake thread reads in a second).
const LOAD_RATE: u32 = 256;
/// How long the load lasts after the last time it was over.
const LOAD_HOLD: Duration = Duration::from_secs(1);
/// Reads per second one source (channel and address) may ask for, after a burst.
const SOURCE_RATE: u64 = 20;
const SOURCE_BURST: u64 = 5;
/// Sources tracked at most. When full, those whose allowance is whole again are
/// forgotten; if none is, all are (each then starts with a burst again: the load gate's
/// cookies before this bound what that gives), so the map never grows past it and is
/// scanned at most once per this many new sources.
const SOURCES: usize = 16384;
/// Cookie replies per second from the whole server, after a burst: a sanity cap, far
/// above a flood one machine sends. (A reply is cheaper than the initiation it
/// answers, and smaller; a low cap would let a forged flood use it all up, and a
/// genuine client would get no cookie.)
const REPLY_RATE: u64 = 200_000;
const REPLY_BURST: u64 = 10_000;
/// Cookie replies per second to one source (channel and address): a genuine client
/// needs one per new cookie (every 2 minutes, or when its address changed).
const SOURCE_REPLIES: u32 = 20;
/// Slots the per-source reply counts are kept in (4 bytes each, 256 KiB in all,
/// allocated on the first reply).
const REPLY_SLOTS: usize = 65_536;
/// Initiations remembered as read.
const KNOWN_INITIATIONS: usize = 4096;
/// At most one warning per kind this often.
const LOG_EVERY: Duration = Duration::from_secs(5);

impl Shared {
    /// The state every task shares, with the channels bound and the handshake thread
    /// started; the receiving end of the initiations read, for the control task.
    fn new(
        base: SessionConfig,
        peers: &[PeerConfig],
        tun: Arc<Tun>,
    ) -> Result<Started, SessionError> {
        let Some(private) = base.core.private_key else {
            return Err(SessionError::Config(
                "a server needs its static private key (session.private_key_file)".into(),
            ));
        };
        if let Some(p) = peers.first() {
            p.session(&base).validate().map_err(SessionError::Config)?;
        }
        let channels = Channels::bind(&base)?;
        let pool = HandshakePool::start(SERVER_HS_JOBS, SERVER_HS_READS)
            .map_err(|e| SessionError::Config(format!("cannot start the handshake thread: {e}")))?;
        let (identified, identified_rx) = mpsc::channel(IDENTIFIED_QUEUE);
        let (arrived, arrived_rx) = mpsc::channel(INITIATION_QUEUE);
        let logs = Logs {
            unknown_peer: Throttle::new(LOG_EVERY),
            spoofed: Throttle::new(LOG_EVERY),
            no_route: Throttle::new(LOG_EVERY),
            load: Throttle::new(LOG_EVERY),
        };
        let shared = Arc::new(Shared {
            initiations: InitiationReader::new(private),
            gate: Mutex::new(Gate::new(&private)),
            known: Mutex::new(Known::default()),
            pending: Mutex::new(Pending::default()),
            channels,
            pool,
            table: RwLock::new(Arc::new(Table::default())),
            counters: Counters::default(),
            identified,
            arrived,
            logs: Mutex::new(logs),
            started: std::time::Instant::now(),
            tun,
            next_slot: Mutex::new(random_slot()),
            base,
        });
        Ok((shared, identified_rx, arrived_rx))
    }

    fn table(&self) -> Arc<Table> {
        self.table.read().map(|t| t.clone()).unwrap_or_default()
    }

    fn warn_unknown_peer(&self, key: &[u8; 32], from: SocketAddr) {
        let allow = self
            .logs
            .lock()
            .ok()
            .and_then(|mut l| l.unknown_peer.allow());
        if let Some(more) = allow {
            warn!(
                "handshake from {from} with public key {} dropped: no [[peer]] has that key ({more} more not shown)",
                keys::encode(key)
            );
        }
    }

    /// A fresh slot (the high 16 bits of a peer's key indices): not in use, and not
    /// used again soon (counting on, so datagrams for a removed peer's old session
    /// find nobody).
    fn slot(&self, in_use: impl Fn(u16) -> bool) -> Option<u16> {
        let mut next = self.next_slot.lock().ok()?;
        for _ in 0..=u16::MAX as usize {
            let s = *next;
            *next = next.wrapping_add(1);
            if !in_use(s) {
                return Some(s);
            }
        }
        None
    }
}

/// Build the table for `peers`, keeping the entries (and so the sessions) of the peers
/// `old` already has by public key.
fn build_table(shared: &Shared, old: &Table, peers: &[PeerConfig]) -> (Table, Vec<Arc<Peer>>) {
    let mut t = Table::default();
    for p in peers {
        let peer = match old.by_key.get(&p.public_key) {
            Some(kept) => {
                if let Ok(mut c) = kept.cfg.lock() {
                    *c = p.clone();
                }
                kept.clone()
            }
            None => {
                let in_use = |s: u16| old.by_slot.contains_key(&s) || t.by_slot.contains_key(&s);
                let Some(slot) = shared.slot(in_use) else {
                    error!("peer {}: no free slot (65536 peers): not served", p.name);
                    continue;
                };
                Arc::new(Peer {
                    slot,
                    cfg: Mutex::new(p.clone()),
                    running: OnceLock::new(),
                    waiting: Mutex::new(Vec::new()),
                    counters: PeerCounters::default(),
                })
            }
        };
        t.by_key.insert(p.public_key, peer.clone());
        t.by_slot.insert(peer.slot, peer);
    }
    t.routes = Routes::new(
        peers
            .iter()
            .filter_map(|p| Some((t.by_key.get(&p.public_key)?.slot, &p.allowed_ips[..]))),
    );
    let removed = old
        .by_key
        .iter()
        .filter(|(k, _)| !t.by_key.contains_key(*k))
        .map(|(_, p)| p.clone())
        .collect();
    (t, removed)
}

/// Commands to the control task.
enum Ctl {
    SetPeers(Vec<PeerConfig>, oneshot::Sender<String>),
}

/// A running server: its tasks stop when this is dropped.
pub(crate) struct Server {
    shared: Arc<Shared>,
    ctl: mpsc::Sender<Ctl>,
    tasks: Vec<JoinHandle<()>>,
    tun_reader: JoinHandle<std::io::Result<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        self.tun_reader.abort();
    }
}

impl Server {
    /// Bind the channels and start serving `peers` on them, reading packets from and
    /// writing them to `tun`.
    pub(crate) fn start(
        base: SessionConfig,
        peers: &[PeerConfig],
        tun: Arc<Tun>,
    ) -> Result<Server, SessionError> {
        let (shared, identified_rx, arrived_rx) = Shared::new(base, peers, tun)?;
        let weak = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("braid-initiations".into())
            .spawn(move || initiations(weak, arrived_rx))
            .map_err(|e| {
                SessionError::Config(format!("cannot start the initiation thread: {e}"))
            })?;
        let (table, _) = build_table(&shared, &Table::default(), peers);
        *shared.table.write().expect("not poisoned") = Arc::new(table);
        let mut tasks = Vec::new();
        for c in 0..shared.channels.socks.len() {
            tasks.push(tokio::spawn(demux(c, shared.clone())));
        }
        let (ctl, ctl_rx) = mpsc::channel(8);
        tasks.push(tokio::spawn(control(shared.clone(), identified_rx, ctl_rx)));
        let tun_reader = tokio::spawn(route_from_tun(shared.clone()));
        let listen: Vec<String> = shared
            .channels
            .locals
            .iter()
            .map(|a| a.to_string())
            .collect();
        info!("serving {} peers on {}", peers.len(), listen.join(", "));
        Ok(Server {
            shared,
            ctl,
            tasks,
            tun_reader,
        })
    }

    /// A handle for stats and reloads.
    pub(crate) fn handle(&self) -> crate::session::StatsHandle {
        crate::session::StatsHandle::server(ServerHandle {
            shared: self.shared.clone(),
            ctl: self.ctl.clone(),
        })
    }

    /// Until the TUN device cannot be read (the error) or the reader stops.
    pub(crate) async fn wait(&mut self) -> std::io::Result<()> {
        match (&mut self.tun_reader).await {
            Ok(r) => r,
            Err(e) => Err(std::io::Error::other(e.to_string())),
        }
    }

    /// Close every peer's session (each peer is told).
    pub(crate) async fn close(self) {
        let table = self.shared.table();
        for p in table.by_slot.values() {
            if let Some(r) = p.running.get() {
                r.stop.send_replace(true);
            }
        }
        // The TUN writers close their sessions; give them a moment.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn random_slot() -> u16 {
    let mut b = [0u8; 2];
    let _ = getrandom::fill(&mut b);
    u16::from_be_bytes(b)
}

/// Every future's output, in order, the futures polled together (not spawned).
async fn all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futures.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *o = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

/// What `braid status` shows of one peer.
fn peer_stats(p: &Peer, session: Option<SessionStats>) -> PeerStats {
    let cfg = p.cfg.lock().map(|c| c.clone()).ok();
    let c = &p.counters;
    PeerStats {
        name: cfg.as_ref().map(|c| c.name.clone()).unwrap_or_default(),
        public_key: cfg
            .as_ref()
            .map(|c| keys::encode(&c.public_key))
            .unwrap_or_default(),
        allowed_ips: cfg
            .map(|c| c.allowed_ips.iter().map(|n| n.to_string()).collect())
            .unwrap_or_default(),
        connected: p.running.get().is_some(),
        source_not_allowed: c.source_not_allowed.load(Ordering::Relaxed),
        not_connected: c.not_connected.load(Ordering::Relaxed),
        tx_queue_drops: c.tx_queue_drops.load(Ordering::Relaxed),
        to_tun: c.to_tun.load(Ordering::Relaxed),
        session,
    }
}

/// Reads and stats of a running server (inside [`crate::session::StatsHandle`]).
#[derive(Clone)]
pub(crate) struct ServerHandle {
    shared: Arc<Shared>,
    ctl: mpsc::Sender<Ctl>,
}

impl ServerHandle {
    /// The server's snapshot: its counters and each peer's session.
    pub(crate) async fn get(&self) -> SessionStats {
        let s = &self.shared;
        let table = s.table();
        let mut peers: Vec<Arc<Peer>> = table.by_slot.values().cloned().collect();
        peers.sort_by_key(|p| p.name());
        // Every running session is asked at once: one after the other, a thousand
        // peers took longer than `braid status` waits.
        let asked = peers.iter().map(|p| {
            let h = p.running.get().map(|r| r.stats.clone());
            async move {
                match h {
                    Some(h) => h.get().await.ok(),
                    None => None,
                }
            }
        });
        let sessions = all(asked.collect()).await;
        let out: Vec<PeerStats> = peers
            .iter()
            .zip(sessions)
            .map(|(p, session)| peer_stats(p, session))
            .collect();
        SessionStats {
            uptime_s: s.started.elapsed().as_secs_f64(),
            security: s.base.core.security.name().into(),
            server: Some(self.counters()),
            peers: out,
            ..SessionStats::default()
        }
    }

    /// The server's own counters, without asking the peers' sessions (cheap with any
    /// number of peers).
    pub(crate) fn counters(&self) -> ServerCounters {
        let s = &self.shared;
        let table = s.table();
        let k = &s.counters;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ServerCounters {
            peers: table.by_slot.len() as u64,
            peers_connected: table
                .by_slot
                .values()
                .filter(|p| p.running.get().is_some())
                .count() as u64,
            unknown_peer: n(&k.unknown_peer),
            unreadable_initiations: n(&k.unreadable_initiations),
            initiation_mac1_failures: n(&k.initiation_mac1_failures),
            initiations_shed: n(&k.initiations_shed),
            initiation_copies: n(&k.initiation_copies),
            cookie_replies: n(&k.cookie_replies),
            stale_cookies: n(&k.stale_cookies),
            initiations_rate_limited: n(&k.initiations_rate_limited),
            oversized: n(&k.oversized),
            unknown_index: n(&k.unknown_index),
            implausible: table
                .by_slot
                .values()
                .filter_map(|p| p.running.get())
                .map(|r| r.inbox.implausible())
                .sum(),
            unroutable: n(&k.unroutable),
            no_route: n(&k.no_route),
            source_not_allowed: n(&k.source_not_allowed),
            not_ip: n(&k.not_ip),
            peers_added: n(&k.peers_added),
            peers_removed: n(&k.peers_removed),
            listen: s.channels.locals.iter().map(|a| a.to_string()).collect(),
        }
    }

    /// New weights for every running peer's session.
    pub(crate) fn set_weights(&self, w: Vec<u32>) -> Result<bool, SessionError> {
        let table = self.shared.table();
        let mut all = true;
        for p in table.by_slot.values() {
            if let Some(r) = p.running.get() {
                all &= r.stats.set_weights(w.clone()).unwrap_or(true);
            }
        }
        Ok(all)
    }

    /// Serve exactly `peers` from now on (a reload): what changed, in words.
    pub(crate) async fn set_peers(&self, peers: Vec<PeerConfig>) -> Result<String, SessionError> {
        let (tx, rx) = oneshot::channel();
        self.ctl
            .send(Ctl::SetPeers(peers, tx))
            .await
            .map_err(|_| SessionError::Closed)?;
        rx.await.map_err(|_| SessionError::Closed)
    }
}

/// The control task: starts a peer's session at its first initiation that reads, and
/// applies reloads. The only writer of the table.
async fn control(
    shared: Arc<Shared>,
    mut identified: mpsc::Receiver<Identified>,
    mut ctl: mpsc::Receiver<Ctl>,
) {
    let mut trim = tokio::time::interval(TRIM_EVERY);
    trim.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_start: Option<std::time::Instant> = None;
    loop {
        tokio::select! {
            _ = trim.tick() => {
                if last_start.is_some_and(|t| t.elapsed() <= TRIM_AFTER_STARTS) {
                    // Off the runtime's threads: it walks the allocator's free lists.
                    tokio::task::spawn_blocking(crate::memory::give_back_freed);
                }
            }
            key = identified.recv() => {
                let Some(key) = key else { return };
                // Removed meanwhile: what waited goes with it.
                let Some(peer) = shared.table().by_key.get(&key).cloned() else {
                    continue;
                };
                if peer.running.get().is_none() {
                    start_peer(&shared, &peer);
                    last_start = Some(std::time::Instant::now());
                }
                let waiting = match peer.waiting.lock() {
                    Ok(mut w) => std::mem::take(&mut *w),
                    Err(_) => continue,
                };
                if let Some(r) = peer.running.get() {
                    for (channel, at, from, d) in waiting {
                        r.inbox.offer(channel, vec![(at, from, d)]);
                    }
                }
            }
            c = ctl.recv() => match c {
                Some(Ctl::SetPeers(peers, reply)) => {
                    let old = shared.table();
                    let (table, removed) = build_table(&shared, &old, &peers);
                    let added: Vec<String> = table
                        .by_key
                        .iter()
                        .filter(|(k, _)| !old.by_key.contains_key(*k))
                        .map(|(_, p)| p.name())
                        .collect();
                    *shared.table.write().expect("not poisoned") = Arc::new(table);
                    for p in &removed {
                        if let Some(r) = p.running.get() {
                            r.stop.send_replace(true);
                        }
                    }
                    let c = &shared.counters;
                    c.peers_added.fetch_add(added.len() as u64, Ordering::Relaxed);
                    c.peers_removed.fetch_add(removed.len() as u64, Ordering::Relaxed);
                    let removed: Vec<String> = removed.iter().map(|p| p.name()).collect();
                    let _ = reply.send(format!(
                        "{} peers: added [{}], removed [{}], the others kept",
                        peers.len(),
                        added.join(", "),
                        removed.join(", ")
                    ));
                }
                None => return,
            },
        }
    }
}

/// While peers start (and for [`TRIM_AFTER_STARTS`] after the last), the memory freed
/// is given back to the system this often ([`crate::memory`]).
const TRIM_EVERY: Duration = Duration::from_secs(1);
/// See [`TRIM_EVERY`]: a new session's first seconds (its handshake, its capacity
/// probes' trains) allocate and free the most.
const TRIM_AFTER_STARTS: Duration = Duration::from_secs(10);

/// Start `peer`'s session and its TUN writer.
fn start_peer(shared: &Arc<Shared>, peer: &Arc<Peer>) {
    let Ok(cfg) = peer.cfg.lock().map(|c| c.clone()) else {
        return;
    };
    let started = Session::start_served(
        cfg.session(&shared.base),
        &shared.channels,
        shared.pool.clone(),
        peer.slot,
        &cfg.name,
    );
    let (mut session, inbox) = match started {
        Ok(s) => s,
        Err(e) => {
            error!("peer {}: cannot start its session: {e}", cfg.name);
            return;
        }
    };
    session.keep_trying_when_rejected();
    let (stop, stopped) = watch::channel(false);
    let running = Running {
        inbox,
        sender: session.sender(),
        stats: session.stats_handle(),
        stop,
    };
    if peer.running.set(running).is_err() {
        return;
    }
    info!("peer {}: handshake received, its session starts", cfg.name);
    tokio::spawn(to_tun(shared.clone(), peer.clone(), session, stopped));
}

/// One peer's packets to the TUN device, each only if its source is in the peer's
/// allowed IPs, until its session is closed (a reload removed it, or the server
/// stops). The session's driver writes them itself, in the task that opens them
/// ([`Session::deliver_to_shared_tun`]); this task writes what was delivered before
/// that, and owns the session until it is to close.
async fn to_tun(
    shared: Arc<Shared>,
    peer: Arc<Peer>,
    mut session: Session,
    mut stop: watch::Receiver<bool>,
) {
    let tun = shared.tun.clone();
    let filter: crate::session::TunFilter = {
        let (shared, peer) = (shared.clone(), peer.clone());
        Arc::new(move |batch: &mut Vec<Bytes>| {
            let table = shared.table();
            batch.retain(|p| from_allowed(&shared, &table, &peer, p));
            peer.counters
                .to_tun
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
        })
    };
    // (Refused only by a session that has ended: then `recv` ends the loop.)
    let _ = session
        .deliver_to_shared_tun(tun.clone(), filter.clone())
        .await;
    // Grown on the first packets: an idle peer costs no frame buffer.
    let mut batch: Vec<Bytes> = Vec::new();
    let mut frame = Vec::new();
    let mut write_errors = Throttle::new(LOG_EVERY);
    loop {
        tokio::select! {
            m = session.recv() => {
                let Some(p) = m else { break };
                batch.push(p);
                while batch.len() < crate::offload::MAX_SEGMENTS {
                    match session.try_recv() {
                        Some(p) => batch.push(p),
                        None => break,
                    }
                }
                filter(&mut batch);
                write_packets(&tun, &batch, &mut frame, &mut write_errors).await;
                batch.clear();
            }
            // It only ever turns true (or its sender goes with the table entry).
            _ = stop.changed() => break,
        }
    }
    info!("peer {}: session closed", peer.name());
    session.close().await;
}

/// Is `pkt`'s source address inside `peer`'s allowed IPs? Counted and (rate-limited)
/// logged when not.
fn from_allowed(shared: &Shared, table: &Table, peer: &Peer, pkt: &[u8]) -> bool {
    let Some((src, _)) = addresses(pkt) else {
        shared.counters.not_ip.fetch_add(1, Ordering::Relaxed);
        return false;
    };
    if table.routes.lookup(src) == Some(peer.slot) {
        return true;
    }
    peer.counters
        .source_not_allowed
        .fetch_add(1, Ordering::Relaxed);
    shared
        .counters
        .source_not_allowed
        .fetch_add(1, Ordering::Relaxed);
    if link_scoped(src) {
        // A client's own link traffic (IPv6 router solicitations and MLD reports from
        // its fe80:: address, say): never routed among peers, and no sign of a
        // spoofer, so not worth a warning.
        debug!(
            "peer {}: link-scoped packet from {src} dropped (a server does not route it)",
            peer.name()
        );
        return false;
    }
    let allow = shared.logs.lock().ok().and_then(|mut l| l.spoofed.allow());
    if let Some(more) = allow {
        warn!(
            "peer {}: packet from {src} dropped: not in its allowed_ips ({more} more not shown)",
            peer.name()
        );
    }
    false
}

/// A source address that is only meaningful on one link: IPv4 link-local
/// (169.254/16) or unspecified, IPv6 link-local (fe80::/10) or unspecified.
fn link_scoped(a: std::net::IpAddr) -> bool {
    match a {
        std::net::IpAddr::V4(v4) => v4.is_link_local() || v4.is_unspecified(),
        std::net::IpAddr::V6(v6) => v6.is_unicast_link_local() || v6.is_unspecified(),
    }
}

/// Packets from the TUN device to the peer that owns their destination. With transmit
/// offload a read is a whole TCP super-segment (up to 64 KiB of one flow, so of one
/// destination) or one packet: it is cut to that peer's bond (`crate::segment`),
/// MSS-clamped, and queued for the peer. Consecutive reads for one peer, as many as
/// the device holds at the moment (up to a batch's worth, as `braid tunnel`'s reader
/// gathers them), go as one batch, so that its driver takes them whole and each
/// channel's share leaves as GSO trains. Waits for room in a peer's queue at most
/// [`PEER_WAIT`]; what does not fit by then is dropped and counted (`tx_queue_drops`),
/// so a stalled peer does not hold up the others.
async fn route_from_tun(shared: Arc<Shared>) -> std::io::Result<()> {
    crate::tunnel::turn_on_offload(&shared.tun);
    let mut buf = vec![0u8; crate::tunnel::READ_BUF];
    let mut seg = Segmenter::new();
    let mut pkts: Vec<Bytes> = Vec::with_capacity(64);
    let mut too_big = crate::tunnel::TooBigCounts::default();
    let mut refused = Throttle::new(LOG_EVERY);
    loop {
        let mut next = Some(shared.tun.recv_frame(&mut buf).await?);
        let mut reads = 0;
        // The peer the packets in `pkts` go to.
        let mut to: Option<Arc<Peer>> = None;
        while let Some(n) = next {
            reads += 1;
            'read: {
                let Some(peer) = buf
                    .get(crate::offload::VNET_HDR_LEN..n)
                    .filter(|p| !p.is_empty())
                    .and_then(|p| peer_of(&shared, p))
                else {
                    break 'read;
                };
                let Some(r) = peer.running.get() else {
                    peer.counters.not_connected.fetch_add(1, Ordering::Relaxed);
                    break 'read;
                };
                if to.as_ref().is_some_and(|t| !Arc::ptr_eq(t, &peer)) {
                    hand_batch(&mut to, &mut pkts).await;
                }
                // This peer's bond, as its path MTU discovery finds it (the shared TUN
                // device keeps the largest any peer's configuration carries): SYNs
                // announce no larger a segment, super-segments are cut to it, and a
                // larger packet is answered with ICMP (or fragmented) as the client's
                // tunnel does, not sent to be lost on the path.
                let mtu = r.sender.path_max_message();
                let clamp = |p: &mut [u8]| {
                    crate::mss::clamp(p, mtu);
                };
                let before = pkts.len();
                match seg.split(&mut buf[..n], mtu, &mut pkts, clamp) {
                    Err(why) => {
                        if let Some(more) = refused.allow() {
                            warn!(
                                "TUN {}: read of {n} bytes dropped: {why} ({more} more not shown)",
                                shared.tun.name()
                            );
                        }
                    }
                    // Only a packet that came whole can be too big (braid cut the
                    // others to fit); it is answered after the packets read before it.
                    Ok(()) if pkts.len() == before + 1 && pkts[before].len() > mtu => {
                        let p = pkts.pop().unwrap_or_default();
                        hand_batch(&mut to, &mut pkts).await;
                        too_big.handle(&shared.tun, &r.sender, &p, mtu).await;
                    }
                    Ok(()) => to = Some(peer),
                }
            }
            if reads >= crate::tunnel::BATCH || pkts.len() >= crate::tunnel::BATCH {
                break;
            }
            next = shared.tun.try_recv_frame(&mut buf)?;
        }
        hand_batch(&mut to, &mut pkts).await;
    }
}

/// Queue the batch `pkts` for the peer `to` (taken), counting what does not fit as
/// dropped; `pkts` is left empty.
async fn hand_batch(to: &mut Option<Arc<Peer>>, pkts: &mut Vec<Bytes>) {
    if let Some(peer) = to.take() {
        if let Some(r) = peer.running.get() {
            let len = pkts.len();
            let sent = hand_to_peer(&peer, &r.sender, pkts).await;
            if sent < len {
                peer.counters
                    .tx_queue_drops
                    .fetch_add((len - sent) as u64, Ordering::Relaxed);
            }
        }
    }
    pkts.clear();
}

/// How long the TUN reader waits for room in one peer's queue before it drops what
/// does not fit: long enough for the peer's driver, busy on the same cores, to take a
/// batch (a drop is a loss its TCP flows must repair), short enough that a peer whose
/// driver has stalled costs the others at most this per read.
const PEER_WAIT: Duration = Duration::from_millis(2);

/// Queue a read's packets for `peer` in order: what fits now at once, the rest once
/// there is room, waiting at most [`PEER_WAIT`]. Returns how many went (the rest are
/// the caller's to count as dropped).
async fn hand_to_peer(peer: &Peer, sender: &SessionSender, pkts: &mut Vec<Bytes>) -> usize {
    let now = match sender.try_send_batch(pkts) {
        Ok(k) => k,
        Err(SessionError::Closed) => return 0,
        Err(e) => {
            debug!("peer {}: packets not sent: {e}", peer.name());
            return 0;
        }
    };
    if pkts.is_empty() {
        return now;
    }
    // (A batch is far smaller than the queue: it goes at once or not.)
    let later = pkts.len();
    match tokio::time::timeout(PEER_WAIT, sender.send_batch(std::mem::take(pkts))).await {
        Ok(Ok(())) => now + later,
        _ => now,
    }
}

/// The peer whose allowed IPs hold `pkt`'s destination; `None` (counted, and logged
/// at most every few seconds) if it is not an IP packet or no peer's do.
fn peer_of(shared: &Shared, pkt: &[u8]) -> Option<Arc<Peer>> {
    let Some((_, dst)) = addresses(pkt) else {
        shared.counters.not_ip.fetch_add(1, Ordering::Relaxed);
        return None;
    };
    let table = shared.table();
    let peer = table
        .routes
        .lookup(dst)
        .and_then(|slot| table.by_slot.get(&slot));
    if peer.is_none() {
        shared.counters.no_route.fetch_add(1, Ordering::Relaxed);
        let allow = shared.logs.lock().ok().and_then(|mut l| l.no_route.allow());
        if let Some(more) = allow {
            debug!(
                "packet to {dst} dropped: no peer's allowed_ips hold it ({more} more not shown)"
            );
        }
    }
    peer.cloned()
}

/// A channel socket's reader: each datagram to its peer's session.
async fn demux(channel: usize, shared: Arc<Shared>) {
    let datagram = shared.base.max_datagram() as usize;
    let mut rx = BatchRecv::new(
        shared.channels.socks[channel].clone(),
        shared.channels.states[channel].clone(),
        datagram,
    );
    type Batch = Vec<(std::time::Instant, SocketAddr, Bytes)>;
    let mut per_peer: Vec<(u16, Batch)> = Vec::new();
    // Data datagrams are copied out of the reused receive buffers into shared chunks
    // (one allocation per 64 KiB, whichever peers they are for), not one each.
    let mut chunks = crate::chunks::Chunks::default();
    loop {
        // The peer table as it is when the batch has arrived (a reload may swap it).
        let mut current: Option<Arc<Table>> = None;
        rx.next(channel, |at, from, d, _| {
            let table = current.get_or_insert_with(|| shared.table());
            if d.len() > datagram {
                shared.counters.oversized.fetch_add(1, Ordering::Relaxed);
                return;
            }
            if d.first() == Some(&wire::TYPE_HS_INIT) {
                let a = (channel, at, from, Bytes::copy_from_slice(d));
                if shared.arrived.try_send(a).is_err() {
                    shared
                        .counters
                        .initiations_shed
                        .fetch_add(1, Ordering::Relaxed);
                }
                return;
            }
            let Some(slot) = receiver_index(d).map(index_prefix) else {
                shared.counters.unroutable.fetch_add(1, Ordering::Relaxed);
                return;
            };
            if table
                .by_slot
                .get(&slot)
                .is_none_or(|p| p.running.get().is_none())
            {
                shared
                    .counters
                    .unknown_index
                    .fetch_add(1, Ordering::Relaxed);
                return;
            }
            let item = (at, from, chunks.copy(d));
            match per_peer.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, b)) => b.push(item),
                None => per_peer.push((slot, vec![item])),
            }
        })
        .await;
        let Some(table) = current else {
            continue;
        };
        for (slot, batch) in per_peer.drain(..) {
            if let Some(r) = table.by_slot.get(&slot).and_then(|p| p.running.get()) {
                r.inbox.offer(channel, batch);
            }
        }
    }
}

/// The initiation thread: each initiation the readers queued, checked and passed on
/// ([`initiation`]), until the server is gone (it holds only a weak reference, so
/// the queue's sender, in [`Shared`], goes with the server).
fn initiations(shared: std::sync::Weak<Shared>, mut arrived: mpsc::Receiver<Arrived>) {
    while let Some((channel, at, from, d)) = arrived.blocking_recv() {
        let Some(s) = shared.upgrade() else { return };
        initiation(&s, channel, at, from, &d);
    }
}

/// What the gate says of an initiation.
enum Verdict {
    /// Read its key (public-key work).
    Read,
    /// Send this cookie reply to its source instead.
    Reply(Bytes),
    /// Nothing (counted).
    Drop,
}

/// A GCRA rate limit: `rate` per second after a burst of `burst`; true if one more is
/// allowed now (and counted).
fn gcra(
    tat: &mut Option<std::time::Instant>,
    now: std::time::Instant,
    rate: u64,
    burst: u64,
) -> bool {
    let interval = Duration::from_micros(1_000_000 / rate);
    let next = tat.map_or(now, |t| t.max(now)) + interval;
    if next.duration_since(now) > interval * burst as u32 {
        return false;
    }
    *tat = Some(next);
    true
}

impl Gate {
    fn new(private: &[u8; 32]) -> Gate {
        let mut seed = [0u8; 32];
        let _ = getrandom::fill(&mut seed);
        let now = std::time::Instant::now();
        Gate {
            cookies: ServerCookies::new(private, seed),
            epoch: now,
            window: (now, 0),
            load_until: None,
            sources: HashMap::new(),
            replies: None,
            reply_slots: Vec::new(),
            reply_hash: Default::default(),
        }
    }

    /// Count one more initiation asking to be read; true if the server is under load
    /// (and whether it just went under load).
    fn under_load(&mut self, now: std::time::Instant) -> (bool, bool) {
        let (start, n) = &mut self.window;
        if now.saturating_duration_since(*start) >= Duration::from_secs(1) {
            *start = now;
            *n = 0;
        }
        *n += 1;
        let was = self.load_until.is_some_and(|t| now < t);
        if *n > LOAD_RATE {
            self.load_until = Some(now + LOAD_HOLD);
        }
        let is = self.load_until.is_some_and(|t| now < t);
        (is, is && !was)
    }

    /// May source (`channel`, `from`) have one more cookie reply in this `second` of
    /// the cookies' clock? At most [`SOURCE_REPLIES`] a second each: an initiation
    /// forged with a victim's address (one of our own peers', or anyone's) is
    /// answered to that address, and the server must not pour its replies there.
    /// Sources share a slot now and then; a forged flood from random addresses puts
    /// about rate / [`REPLY_SLOTS`] a second in each (under 2 at 100 000/s), leaving a
    /// genuine source's slot its replies.
    fn reply_to(&mut self, channel: usize, from: SocketAddr, second: u64) -> bool {
        use std::hash::BuildHasher;
        if self.reply_slots.is_empty() {
            self.reply_slots = vec![0; REPLY_SLOTS];
        }
        let slot = self.reply_hash.hash_one((channel, from)) as usize % REPLY_SLOTS;
        let stamp = (second as u32 & 0xff_ffff) << 8;
        let v = &mut self.reply_slots[slot];
        if *v & !0xff != stamp {
            *v = stamp;
        }
        if *v & 0xff >= SOURCE_REPLIES {
            return false;
        }
        *v += 1;
        true
    }

    /// Under load, the initiation needs a mac2 over our cookie for its source (else a
    /// cookie reply, rate-limited per source and in all); then its source's rate.
    fn check(
        &mut self,
        now: std::time::Instant,
        channel: usize,
        from: SocketAddr,
        d: &[u8],
        c: &Counters,
    ) -> Verdict {
        let n = |a: &AtomicU64| {
            a.fetch_add(1, Ordering::Relaxed);
        };
        if self.under_load(now).0 {
            let t = braid_proto::time::Instant::ZERO
                + braid_proto::time::Duration::from_micros(
                    now.saturating_duration_since(self.epoch).as_micros() as u64,
                );
            let addr = address_bytes(from);
            if !self.cookies.mac2_ok(t, channel, &addr, d) {
                if d.len() >= 16 && d[d.len() - 16..] != [0; 16] {
                    n(&c.stale_cookies);
                }
                let second = now.saturating_duration_since(self.epoch).as_secs();
                if !self.reply_to(channel, from, second)
                    || !gcra(&mut self.replies, now, REPLY_RATE, REPLY_BURST)
                {
                    n(&c.initiations_rate_limited);
                    return Verdict::Drop;
                }
                n(&c.cookie_replies);
                return self
                    .cookies
                    .reply(t, channel, &addr, d)
                    .map_or(Verdict::Drop, Verdict::Reply);
            }
        }
        if self.sources.len() >= SOURCES && !self.sources.contains_key(&(channel, from)) {
            self.sources.retain(|_, tat| tat.is_some_and(|t| t > now));
            if self.sources.len() >= SOURCES {
                self.sources.clear();
            }
        }
        let tat = self.sources.entry((channel, from)).or_default();
        if !gcra(tat, now, SOURCE_RATE, SOURCE_BURST) {
            n(&c.initiations_rate_limited);
            return Verdict::Drop;
        }
        Verdict::Read
    }
}

impl Shared {
    /// An initiation whose sender's key is known: straight to the peer's session if it
    /// runs; else it waits with the peer, and the control task is asked once to start
    /// the session (an unknown key is counted and dropped). When a few hundred clients
    /// start at once, each sends copies on every channel until answered: queued one
    /// by one for the control task, behind the sessions being started, they filled its
    /// queue on a slower machine and were shed.
    fn pass_on(
        &self,
        key: [u8; 32],
        channel: usize,
        at: std::time::Instant,
        from: SocketAddr,
        datagram: Bytes,
    ) {
        let table = self.table();
        let Some(peer) = table.by_key.get(&key) else {
            self.counters.unknown_peer.fetch_add(1, Ordering::Relaxed);
            self.warn_unknown_peer(&key, from);
            return;
        };
        if let Some(r) = peer.running.get() {
            r.inbox.offer(channel, vec![(at, from, datagram)]);
            return;
        }
        let Ok(mut waiting) = peer.waiting.lock() else {
            return;
        };
        // The control task hands over all that waits when it takes the request, so an
        // empty list means no request is queued (or it was taken before this lock).
        let ask = waiting.is_empty();
        // The initiator sends its outstanding initiation again every heartbeat until
        // answered: the latest from a channel and address replaces the one before.
        if let Some(w) = waiting
            .iter_mut()
            .find(|(c, _, f, _)| *c == channel && *f == from)
        {
            *w = (channel, at, from, datagram);
            return;
        }
        if waiting.len() >= WAITING {
            self.counters
                .initiations_shed
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        waiting.push((channel, at, from, datagram));
        if ask && self.identified.try_send(key).is_err() {
            waiting.clear();
            self.counters
                .initiations_shed
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    fn warn_load(&self, channel: usize) {
        let allow = self.logs.lock().ok().and_then(|mut l| l.load.allow());
        if let Some(more) = allow {
            warn!(
                "channel {channel}: over {LOAD_RATE} handshake initiations in a second: under load, each now needs a cookie for its address (proof of address) ({more} more not shown)"
            );
        }
    }
}

/// An initiation: the cheap check (mac1), a copy of one already read passed on at once,
/// then the gate (under load, a cookie for the source; the source's rate), then whose
/// it is on the handshake thread (public-key work), then to the control task.
fn initiation(
    shared: &Arc<Shared>,
    channel: usize,
    at: std::time::Instant,
    from: SocketAddr,
    d: &[u8],
) {
    if !shared.initiations.mac1_ok(d) {
        shared
            .counters
            .initiation_mac1_failures
            .fetch_add(1, Ordering::Relaxed);
        return;
    }
    let mut mac1 = [0u8; 16];
    mac1.copy_from_slice(&d[d.len() - 32..d.len() - 16]);
    if let Some(key) = shared.known.lock().ok().and_then(|k| k.get(&mac1)) {
        shared
            .counters
            .initiation_copies
            .fetch_add(1, Ordering::Relaxed);
        shared.pass_on(key, channel, at, from, Bytes::copy_from_slice(d));
        return;
    }
    if let Ok(mut p) = shared.pending.lock() {
        if let Some(copies) = p.copies.get_mut(&mac1) {
            // Being read: passed on with it, without reading it again.
            shared
                .counters
                .initiation_copies
                .fetch_add(1, Ordering::Relaxed);
            if copies.len() < PENDING_COPIES {
                copies.push((channel, at, from, Bytes::copy_from_slice(d)));
            }
            return;
        }
    }
    // The gate's clock is now, not the datagram's arrival: the two channels' readers
    // take their batches at different moments, and a rate limit that saw time go back
    // by a batch's wait refused everything until it caught up.
    let now = std::time::Instant::now();
    let (verdict, loaded) = match shared.gate.lock() {
        Ok(mut g) => {
            let loaded = g.load_until.is_some_and(|t| now < t);
            (g.check(now, channel, from, d, &shared.counters), loaded)
        }
        Err(_) => (Verdict::Drop, false),
    };
    match verdict {
        Verdict::Read => read_key(shared, channel, at, from, d, mac1),
        Verdict::Reply(r) => {
            if !loaded {
                shared.warn_load(channel);
            }
            let _ = shared.channels.socks[channel].try_send_to(&r, from);
        }
        Verdict::Drop => {}
    }
}

/// Read the initiator's key on the handshake thread (shed, counted, when its queue is
/// full), remember it, and pass the initiation on.
fn read_key(
    shared: &Arc<Shared>,
    channel: usize,
    at: std::time::Instant,
    from: SocketAddr,
    d: &[u8],
    mac1: [u8; 16],
) {
    let datagram = Bytes::copy_from_slice(d);
    let s = shared.clone();
    // At most one entry per read queued (removed when it has run, or not queued).
    if let Ok(mut p) = shared.pending.lock() {
        p.copies.insert(mac1, Vec::new());
    }
    let queued = shared.pool.try_run(Box::new(move || {
        if at.elapsed() > READ_WITHIN {
            if let Ok(mut p) = s.pending.lock() {
                p.copies.remove(&mac1);
            }
            s.counters.initiations_shed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let key = s.initiations.initiator(&datagram);
        if let Some(key) = key {
            if let Ok(mut k) = s.known.lock() {
                k.insert(mac1, key);
            }
        }
        let copies = s
            .pending
            .lock()
            .ok()
            .and_then(|mut p| p.copies.remove(&mac1))
            .unwrap_or_default();
        let Some(key) = key else {
            s.counters
                .unreadable_initiations
                .fetch_add(1, Ordering::Relaxed);
            return;
        };
        s.pass_on(key, channel, at, from, datagram);
        for (channel, at, from, d) in copies {
            s.pass_on(key, channel, at, from, d);
        }
    }));
    if !queued {
        if let Ok(mut p) = shared.pending.lock() {
            p.copies.remove(&mac1);
        }
        shared
            .counters
            .initiations_shed
            .fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookie_replies_to_one_source_are_limited_per_second() {
        let mut g = Gate::new(&[7; 32]);
        let victim: SocketAddr = "192.0.2.1:4000".parse().unwrap();
        let other: SocketAddr = "192.0.2.2:4000".parse().unwrap();
        // A flood forged with the victim's address: 20 replies in a second, no more.
        let sent = (0..1000).filter(|_| g.reply_to(0, victim, 5)).count();
        assert_eq!(sent, SOURCE_REPLIES as usize);
        // Another source, or the victim on another channel, has its own allowance. (The
        // hash is keyed at random: either shares the victim's slot with one key in
        // 65 536, both at once never in practice.)
        let others = (0..30).filter(|_| g.reply_to(0, other, 5)).count();
        let channel = (0..30).filter(|_| g.reply_to(1, victim, 5)).count();
        let full = SOURCE_REPLIES as usize;
        assert!(others == full || channel == full, "{others} {channel}");
        // The next second: the victim's allowance again.
        assert!(g.reply_to(0, victim, 6));
        // A flood from 100 000 random sources in one second leaves a genuine
        // source most of its replies: slots are shared by a couple of forgers at most.
        let mut g = Gate::new(&[7; 32]);
        for i in 0..100_000u32 {
            let a = std::net::Ipv4Addr::from(0x0a00_0000 | i);
            g.reply_to(0, SocketAddr::from((a, 9)), 9);
        }
        let genuine = (0..5).filter(|_| g.reply_to(0, victim, 9)).count();
        assert_eq!(genuine, 5);
    }

    fn nets(v: &[&str]) -> Vec<IpNet> {
        v.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn link_scoped_sources_are_told_apart_from_spoofed_ones() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        for a in ["fe80::1", "169.254.3.4", "::", "0.0.0.0"] {
            assert!(link_scoped(ip(a)), "{a}");
        }
        for a in ["10.77.1.5", "fd77:1::5", "2001:db8::1"] {
            assert!(!link_scoped(ip(a)), "{a}");
        }
    }

    #[test]
    fn routes_take_the_longest_prefix_of_either_family() {
        let a = nets(&["10.77.1.0/24", "fd77:1::/64"]);
        let b = nets(&["10.77.1.128/25", "10.0.0.0/8"]);
        let c = nets(&["0.0.0.0/0"]);
        let r = Routes::new([(1, &a[..]), (2, &b[..])]);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(r.lookup(ip("10.77.1.5")), Some(1));
        assert_eq!(r.lookup(ip("10.77.1.200")), Some(2), "the /25 is longer");
        assert_eq!(r.lookup(ip("10.9.9.9")), Some(2));
        assert_eq!(r.lookup(ip("fd77:1::9")), Some(1));
        assert_eq!(r.lookup(ip("fd77:2::9")), None);
        assert_eq!(r.lookup(ip("192.168.1.1")), None);
        // A default route catches the rest, and never beats a longer prefix.
        let r = Routes::new([(1, &a[..]), (2, &b[..]), (3, &c[..])]);
        assert_eq!(r.lookup(ip("192.168.1.1")), Some(3));
        assert_eq!(r.lookup(ip("10.77.1.5")), Some(1));
        assert_eq!(r.lookup(ip("fd77:1::9")), Some(1));
        assert_eq!(r.lookup(ip("fd77:2::9")), None, "0.0.0.0/0 is IPv4 only");
    }

    #[test]
    fn addresses_of_ipv4_and_ipv6_packets() {
        let mut v4 = vec![0u8; 20];
        v4[0] = 0x45;
        v4[12..16].copy_from_slice(&[10, 0, 0, 1]);
        v4[16..20].copy_from_slice(&[10, 0, 0, 2]);
        assert_eq!(
            addresses(&v4),
            Some(("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()))
        );
        let mut v6 = vec![0u8; 40];
        v6[0] = 0x60;
        v6[23] = 1;
        v6[39] = 2;
        assert_eq!(
            addresses(&v6),
            Some(("::1".parse().unwrap(), "::2".parse().unwrap()))
        );
        assert_eq!(addresses(&v4[..19]), None);
        assert_eq!(addresses(&[0x20; 40]), None);
        assert_eq!(addresses(&[]), None);
    }
}
