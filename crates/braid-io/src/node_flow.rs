//! The data plane of `braid node`: one end of a striped overlay flow.
//!
//! The flow is a braid [`Session`] with [`SLOTS`] channels, one per slot of the
//! flow's PROVISION (see [`braid_proto::overlay::flow`]). The session's channel
//! sockets are on loopback and aimed at one *shim* socket per slot; the node puts a
//! DATA header (flow, slot, direction) in front of what a shim receives, seals it for
//! the slot's next hop (a relay, or the other end on the direct path) with the trailer
//! of [`braid_proto::overlay::auth`], and sends it from the node's own UDP socket;
//! DATA arriving for this end from that hop goes, without header and trailer, from the
//! slot's shim to the session's channel. So the session (hellos, liveness, failover,
//! markers, resequencing, its own authentication and encryption) runs unchanged over
//! the overlay's paths, and a reroute only changes where a slot's datagrams go.
//!
//! The application side is a TUN device, as in `braid tunnel` (and with its code), or,
//! for tests, a pair of in-process queues.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use braid_proto::overlay::auth::{NodeAuth, TRAILER_LEN};
use braid_proto::overlay::NodeId;
use braid_proto::wire::overlay::{DataHeader, DATA_HEADER_LEN, MAX_PROVISION_PATHS};
use bytes::Bytes;
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::config::{ChannelConfig, SessionConfig, TunnelConfig};
use crate::session::{Session, SessionError, StatsHandle};

/// Channels of a flow's session (its slots).
pub const SLOTS: usize = MAX_PROVISION_PATHS;

/// Where a flow's packets come from and go to at an end.
pub enum AppSide {
    /// A TUN device (as `braid tunnel`).
    Tun(TunnelConfig),
    /// In-process queues (tests, examples): what arrives is sent on `to_app`, what
    /// comes from `from_app` is striped.
    Queue {
        /// Delivered packets.
        to_app: mpsc::Sender<Bytes>,
        /// Packets to stripe.
        from_app: mpsc::Receiver<Bytes>,
    },
}

/// The `[flow]` section of a node configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct FlowConfig {
    /// Stripe a flow to this node (this node is a source); `None`: only accept flows.
    pub to: Option<braid_proto::overlay::NodeId>,
    /// TUN device name; `None`: no TUN (the application side is given by the program).
    pub tun: Option<String>,
    /// The TUN device's IPv4 address and prefix length.
    pub address: Option<(Ipv4Addr, u8)>,
    /// The path MTU between nodes (IP packet bytes); the TUN MTU follows from it.
    pub path_mtu: u32,
    /// The source waits this long after its first route for the table to fill (or
    /// until it has `max_paths` paths) before it provisions.
    pub settle: braid_proto::Duration,
    /// Adaptive SRR weights in the flow's session (see `docs/tunnel.md`).
    pub adaptive: bool,
    /// The flow's session settings (`[flow.session]`: the settings schema,
    /// `docs/settings.md`; the keys are the nodes' own, so no key settings).
    pub session: braid_proto::session::schema::SessionSettings,
}

/// The next hop of a slot: the node and its address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hop {
    /// The node (DATA is sealed for it, and only DATA sealed by it is taken back).
    pub id: NodeId,
    /// Where it listens.
    pub addr: SocketAddr,
}

/// Counters of one flow end.
#[derive(Debug, Default)]
pub struct EndCounters {
    /// DATA datagrams sent, per slot.
    pub sent: [AtomicU64; SLOTS],
    /// DATA datagrams received, per slot.
    pub received: [AtomicU64; SLOTS],
}

/// One end of a flow, running.
pub struct Endpoint {
    /// The flow id.
    pub flow: u32,
    /// The direction bit of what this end sends (`true` at the destination).
    pub reverse: bool,
    hops: Arc<Mutex<[Option<Hop>; SLOTS]>>,
    shims: Vec<Arc<UdpSocket>>,
    /// Counters.
    pub counters: Arc<EndCounters>,
    control: StatsHandle,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Endpoint {
    /// Aim slot `i` at `hop` (`None`: the slot is unused; its datagrams are dropped).
    pub fn set_hops(&self, hops: [Option<Hop>; SLOTS]) {
        *self.hops.lock().unwrap_or_else(|p| p.into_inner()) = hops;
    }

    /// New channel weights for the flow's session (a slot moved to another path).
    pub fn set_weights(&self, weights: [u32; SLOTS]) {
        if let Err(e) = self.control.set_weights(weights.to_vec()) {
            warn!(flow = self.flow, "weights not set: {e}");
        }
    }

    /// The next hop of every slot.
    pub fn hops(&self) -> [Option<Hop>; SLOTS] {
        *self.hops.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hand a DATA payload that arrived on `slot` to the session (never waits: if the
    /// loopback socket is full the datagram is lost, as on a congested path).
    pub fn deliver(&self, slot: u8, payload: &[u8]) {
        if let Some(s) = self.shims.get(slot as usize) {
            self.counters.received[slot as usize].fetch_add(1, Ordering::Relaxed);
            let _ = s.try_send(payload);
        }
    }
}

/// What starts one end of a flow.
pub struct EndSpec {
    /// The flow id.
    pub flow: u32,
    /// The direction bit of what this end sends (`true` at the destination).
    pub reverse: bool,
    /// The session's channel weights per slot (relative; > 0).
    pub weights: [u32; SLOTS],
    /// The next hop of every slot.
    pub hops: [Option<Hop>; SLOTS],
}

/// Start one end of a flow: the session (keyed with this node's static private key and
/// the other end's public key, `keys`), its shims, and the application side; DATA
/// leaves from `net`, sealed with `auth`.
pub async fn start(
    spec: EndSpec,
    keys: ([u8; 32], [u8; 32]),
    fc: &FlowConfig,
    app: AppSide,
    net: Arc<UdpSocket>,
    auth: Arc<Mutex<NodeAuth>>,
) -> Result<Endpoint, String> {
    let EndSpec {
        flow,
        reverse,
        weights,
        hops,
    } = spec;
    let shims = bind_shims().await?;
    let sc = session_config(&shims, &weights, keys, fc)?;
    let session = Session::start(sc.clone())
        .await
        .map_err(|e| format!("starting the flow's session: {e}"))?;
    for (s, l) in shims.iter().zip(session.local_addrs()) {
        s.connect(l)
            .await
            .map_err(|e| format!("aiming a shim at the session: {e}"))?;
    }
    let control = session.stats_handle();
    let hops = Arc::new(Mutex::new(hops));
    let counters = Arc::new(EndCounters::default());
    let mut tasks = Vec::new();
    for (i, s) in shims.iter().enumerate() {
        tasks.push(tokio::spawn(shim_out(
            DataHeader {
                flow,
                slot: i as u8,
                reverse,
            },
            s.clone(),
            net.clone(),
            hops.clone(),
            counters.clone(),
            auth.clone(),
        )));
    }
    let app_task = start_app_side(app, session, &sc, flow)?;
    tasks.push(app_task);
    info!(flow, reverse, "flow end started");
    Ok(Endpoint {
        flow,
        reverse,
        hops,
        shims,
        counters,
        control,
        tasks,
    })
}

/// One loopback socket per slot: the session's channels end there, and each shim
/// carries its slot's datagrams to and from the slot's real hop.
async fn bind_shims() -> Result<Vec<Arc<UdpSocket>>, String> {
    let lo: SocketAddr = (Ipv4Addr::LOCALHOST, 0).into();
    let mut shims = Vec::new();
    for _ in 0..SLOTS {
        let s = UdpSocket::bind(lo)
            .await
            .map_err(|e| format!("binding a loopback shim socket: {e}"))?;
        shims.push(Arc::new(s));
    }
    Ok(shims)
}

/// The flow's session: a channel per slot from loopback to its shim (weighted, its MTU
/// less the DATA header and the hop's trailer), keyed with `keys`, the flow's
/// `[flow.session]` settings.
fn session_config(
    shims: &[Arc<UdpSocket>],
    weights: &[u32],
    keys: ([u8; 32], [u8; 32]),
    fc: &FlowConfig,
) -> Result<SessionConfig, String> {
    let lo: SocketAddr = (Ipv4Addr::LOCALHOST, 0).into();
    let mut channels = Vec::new();
    for (i, s) in shims.iter().enumerate() {
        let remote = s.local_addr().map_err(|e| e.to_string())?;
        let mut c = ChannelConfig::new(format!("slot{i}"), lo, remote);
        c.weight = weights[i].max(1);
        // The DATA header and the hop's trailer ride with every session datagram on
        // the real path.
        c.mtu = fc
            .path_mtu
            .saturating_sub((DATA_HEADER_LEN + TRAILER_LEN) as u32);
        channels.push(c);
    }
    let mut sc = SessionConfig::new(channels, Vec::new());
    sc.core.private_key = Some(keys.0);
    sc.core.peer_public_key = Some(keys.1);
    sc.apply(&fc.session)
        .map_err(|e| format!("flow.session.{}: {}", e.key, e.reason))?;
    sc.core.adaptive = fc.adaptive;
    sc.socket_buffer = 4 << 20;
    Ok(sc)
}

/// The application side of the flow's session: a TUN device, or queues (tests).
fn start_app_side(
    app: AppSide,
    session: Session,
    sc: &SessionConfig,
    flow: u32,
) -> Result<tokio::task::JoinHandle<()>, String> {
    Ok(match app {
        AppSide::Tun(t) => {
            let tun = crate::tunnel::open_tun(&t, sc).map_err(|e| e.to_string())?;
            tokio::spawn(async move {
                let mut session = session;
                let never = std::future::pending::<&'static str>();
                tokio::pin!(never);
                if let Err(e) =
                    crate::tunnel::forward(Arc::new(tun), &mut session, never.as_mut()).await
                {
                    warn!("flow {flow}: {e}");
                }
                session.close().await;
            })
        }
        AppSide::Queue {
            to_app,
            mut from_app,
        } => tokio::spawn(async move {
            let mut session = session;
            let sender = session.sender();
            loop {
                tokio::select! {
                    m = from_app.recv() => match m {
                        Some(m) => match sender.send(m).await {
                            Ok(()) | Err(SessionError::TooLarge { .. }) | Err(SessionError::Empty) => {}
                            Err(_) => break,
                        },
                        None => break,
                    },
                    m = session.recv() => match m {
                        Some(m) => { let _ = to_app.send(m).await; }
                        None => break,
                    },
                }
            }
            session.close().await;
        }),
    })
}

/// Session datagrams of one slot out to the slot's next hop, with the DATA header,
/// sealed for that hop.
async fn shim_out(
    h: DataHeader,
    shim: Arc<UdpSocket>,
    net: Arc<UdpSocket>,
    hops: Arc<Mutex<[Option<Hop>; SLOTS]>>,
    counters: Arc<EndCounters>,
    auth: Arc<Mutex<NodeAuth>>,
) {
    let mut buf = vec![0u8; 65_536];
    let mut d: Vec<u8> = Vec::with_capacity(65_536 + DATA_HEADER_LEN + TRAILER_LEN);
    loop {
        let n = match shim.recv(&mut buf).await {
            Ok(n) => n,
            Err(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                continue;
            }
        };
        let hop = hops.lock().unwrap_or_else(|p| p.into_inner())[h.slot as usize];
        let Some(to) = hop else { continue };
        d.clear();
        d.extend_from_slice(&h.bytes());
        d.extend_from_slice(&buf[..n]);
        // No keys with the hop yet (its HELLOs are under way): lost, as on a path
        // that is not up.
        if !auth
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .seal_in_place(to.id, &mut d)
        {
            continue;
        }
        if net.send_to(&d, to.addr).await.is_ok() {
            counters.sent[h.slot as usize].fetch_add(1, Ordering::Relaxed);
        }
    }
}
