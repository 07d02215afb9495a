//! `braid node`: one member of a GALO overlay (seed 003) on a real UDP socket.
//!
//! What runs here: the DCE (light PINGs to every peer every `ping_ms` for RTT, loss and
//! liveness; throughput probes as trains of padded PINGs in the node's own slots of the
//! overlay-wide serial schedule, [`braid_proto::overlay::ProbeSchedule`], the rate taken
//! from the spacing of the PONGs that come back), UPDATEs of the node's measurements to
//! every peer every `update_ms`, and the QRE on this node: an accessibility table fed by
//! its own measurements and the peers' UPDATEs, and a [`Rerouter`] per configured
//! destination choosing up to three paths. Each node has its own static key pair and
//! knows every member's public key; with each peer it agrees on fresh session keys at
//! every start (HELLOs), and every other datagram, DATA included, carries the
//! authentication trailer of [`braid_proto::overlay::auth`] for its next hop; anything
//! that does not verify is counted and dropped.
//!
//! The forwarding engine and the flow: a node with a `[flow] to = D` section stripes a
//! flow to node D over the paths its QRE chose. It sends an authenticated PROVISION to
//! D and to every relay of those paths (again every `update_ms`, as soft state), each
//! relay forwards the flow's DATA datagrams between the two ends
//! ([`braid_proto::overlay::FlowTable`]), and both ends run a braid session whose
//! channels are the paths ([`crate::node_flow`]); a route change moves a path to a
//! new relay without stopping the session. See `docs/overlay.md`.
//!
//! Time is the wall clock in µs since the Unix epoch, so that every node computes the
//! same probe slots (clocks are assumed NTP-synchronized to well within a slot).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use braid_proto::overlay::auth::{AuthError, NodeAuth, TRAILER_LEN};
use braid_proto::overlay::{
    assign_slots, AccessTable, Choice, Decision, FlowTable, Measurement, Metric, NodeId,
    ProbeConfig, ProbeSchedule, RelayEntry, RerouteConfig, Rerouter, Role, RouteConfig,
};
use braid_proto::wire::overlay::{
    DataHeader, ProvisionPath, Repr, UpdateEntry, LOSS_SCALE, MAX_PING_PAD, PING_LEN,
};
use braid_proto::{Duration, Instant};
use serde::Serialize;
use tokio::net::UdpSocket;
use toml::{Table, Value};

use crate::config::TunnelConfig;
use crate::node_flow::{AppSide, Endpoint, FlowConfig, Hop, SLOTS};

/// Largest node id a configuration may use (the table is sized by the largest id).
pub const MAX_NODE_ID: NodeId = 1023;
/// Weight of a new ping outcome in the loss estimate.
const LOSS_EWMA: f64 = 0.1;
/// IPv4 + UDP header bytes, counted in a train's rate.
const IP_UDP: usize = 28;
/// Flows a node relays at most.
pub const MAX_RELAYED_FLOWS: usize = 256;
/// A PROVISION lives this many refresh intervals (`update_ms`) unless repeated.
const PROVISION_LIFETIMES: u64 = 5;

/// A peer of this node.
#[derive(Clone, Debug, PartialEq)]
pub struct Peer {
    /// Its node id.
    pub id: NodeId,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its static X25519 public key: only this key's holder can speak as this node.
    pub public_key: [u8; 32],
}

/// A node's configuration (`braid node --config`; keys in `docs/overlay.md`).
#[derive(Clone, Debug, PartialEq)]
pub struct NodeConfig {
    /// This node's id.
    pub id: NodeId,
    /// Address to bind.
    pub listen: SocketAddr,
    /// Every other node.
    pub peers: Vec<Peer>,
    /// This node's static X25519 private key (`private_key_file`).
    pub private_key: [u8; 32],
    /// Light-probe interval.
    pub ping: Duration,
    /// Throughput-probe slot (one ordered pair of the overlay per slot).
    pub slot: Duration,
    /// PINGs per throughput probe.
    pub train: u16,
    /// Padding of a train's PINGs, bytes.
    pub train_bytes: u16,
    /// UPDATE interval.
    pub update: Duration,
    /// A hop unmeasured this long is dead.
    pub dead_after: Duration,
    /// Reroute evaluation interval.
    pub eval: Duration,
    /// Destinations this node routes to.
    pub routes: Vec<NodeId>,
    /// Route metric.
    pub metric: Metric,
    /// Paths per destination, 1..=3.
    pub max_paths: usize,
    /// Reroute threshold (fraction).
    pub threshold: f64,
    /// Reroute hysteresis (evaluations in a row).
    pub consecutive: u32,
    /// The `[flow]` section: this node is an end of striped flows.
    pub flow: Option<FlowConfig>,
}

/// A bad node configuration.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{file}: {message}")]
pub struct NodeConfigError {
    /// The file.
    pub file: String,
    /// What is wrong.
    pub message: String,
}

fn num(t: &Table, key: &str, default: Option<f64>, lo: f64, hi: f64) -> Result<f64, String> {
    let v = match t.get(key) {
        None => return default.ok_or_else(|| format!("`{key}` is required")),
        Some(Value::Integer(i)) => *i as f64,
        Some(Value::Float(f)) => *f,
        Some(o) => return Err(format!("`{key}`: expected a number, found {o}")),
    };
    if !(lo..=hi).contains(&v) || (v.fract() != 0.0 && hi > 1000.0) {
        return Err(format!(
            "`{key}`: expected a whole number in {lo}..={hi}, found {v}"
        ));
    }
    Ok(v)
}

fn check_keys(t: &Table, at: &str, allowed: &[&str]) -> Result<(), String> {
    match t.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(format!(
            "unknown key `{at}{k}`; expected one of: {}",
            allowed.join(", ")
        )),
        None => Ok(()),
    }
}

impl NodeConfig {
    /// Load a node configuration; a relative `private_key_file` is relative to the file.
    pub fn load(path: &Path) -> Result<NodeConfig, NodeConfigError> {
        let file = path.display().to_string();
        let e = |message: String| NodeConfigError {
            file: file.clone(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|x| e(x.to_string()))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        Self::parse(&text, dir).map_err(e)
    }

    /// Parse configuration text; `dir` resolves a relative `private_key_file`.
    pub fn parse(text: &str, dir: &Path) -> Result<NodeConfig, String> {
        let root: Table = toml::from_str(text).map_err(|e| format!("not valid TOML: {e}"))?;
        check_keys(&root, "", TOP_KEYS)?;
        let id = num(&root, "id", None, 0.0, MAX_NODE_ID as f64)? as NodeId;
        let listen = parse_listen(&root)?;
        let private_key = parse_private_key(&root, dir)?;
        let own_public = crate::keys::public_key(&private_key);
        let peers = parse_peers(&root, id, &own_public)?;
        let empty = Table::new();
        let probe = sub_table(&root, "probe", &empty)?;
        check_keys(probe, "probe.", PROBE_KEYS)?;
        let ms = |k: &str, d: f64| -> Result<Duration, String> {
            Ok(Duration::from_millis(
                num(probe, k, Some(d), 1.0, 3_600_000.0)? as u64,
            ))
        };
        let route = sub_table(&root, "route", &empty)?;
        check_keys(route, "route.", ROUTE_KEYS)?;
        let mut routes = parse_route_to(route, &peers)?;
        let metric = parse_metric(route)?;
        let flow = parse_flow_table(&root, &peers)?;
        if let Some(d) = flow.as_ref().and_then(|f| f.to) {
            if !routes.contains(&d) {
                routes.push(d);
            }
        }
        // Public keys no X25519 key pair has, and the like.
        NodeAuth::new(id, &private_key, &members(&peers), [1; 32]).map_err(|e| e.to_string())?;
        Ok(NodeConfig {
            flow,
            id,
            listen,
            peers,
            private_key,
            ping: ms("ping_ms", 100.0)?,
            slot: ms("slot_ms", 200.0)?,
            train: num(probe, "train", Some(20.0), 2.0, 1000.0)? as u16,
            train_bytes: num(probe, "train_bytes", Some(1200.0), 0.0, MAX_PING_PAD as f64)? as u16,
            update: ms("update_ms", 200.0)?,
            dead_after: ms("dead_after_ms", 1000.0)?,
            eval: ms("eval_ms", 50.0)?,
            routes,
            metric,
            max_paths: num(route, "max_paths", Some(3.0), 1.0, 3.0)? as usize,
            threshold: num(route, "threshold_percent", Some(10.0), 0.0, 1000.0)? / 100.0,
            consecutive: num(route, "consecutive", Some(3.0), 1.0, 1000.0)? as u32,
        })
    }
}

/// `listen`: the address to bind.
fn parse_listen(root: &Table) -> Result<SocketAddr, String> {
    root.get("listen")
        .and_then(Value::as_str)
        .ok_or("`listen` is required: the address to bind, e.g. \"0.0.0.0:7400\"")?
        .parse::<SocketAddr>()
        .map_err(|e| format!("`listen`: {e}"))
}

/// `private_key_file`: this node's static private key, read from that file (relative
/// to `dir`); the old shared `key_file` / `key` are refused with what to do instead.
fn parse_private_key(root: &Table, dir: &Path) -> Result<[u8; 32], String> {
    if root.contains_key("key_file") || root.contains_key("key") {
        return Err("`key_file` / `key`: the overlay no longer uses one key shared by all nodes (any member could speak for any other); give this node its own key pair instead: `private_key_file = \"node.key\"` (`braid genkey > node.key; chmod 600 node.key`) and, in every [[peer]], `public_key = \"...\"` (`braid pubkey < that node's key`); see docs/overlay.md".into());
    }
    let private_key = match root.get("private_key_file") {
            Some(Value::String(f)) => crate::keys::read_file(&dir.join(f))
                .map_err(|e| format!("`private_key_file`: {e}"))?,
            Some(v) => return Err(format!("`private_key_file`: expected a file name, found {v}")),
            None => return Err("`private_key_file` is required: this node's private key (`braid genkey > node.key; chmod 600 node.key`; give the other nodes `braid pubkey < node.key`)".into()),
        };
    Ok(private_key)
}

/// `route.metric`: what the QRE optimizes (throughput unless given).
fn parse_metric(route: &Table) -> Result<Metric, String> {
    Ok(match route.get("metric").map(|v| v.as_str()) {
        None => Metric::Throughput,
        Some(Some(s)) => Metric::from_name(s)
            .ok_or("route.metric: expected \"throughput\", \"delay\" or \"loss\"")?,
        Some(None) => return Err("route.metric: expected a string".into()),
    })
}

/// The `[flow]` table, if any.
fn parse_flow_table(root: &Table, peers: &[Peer]) -> Result<Option<FlowConfig>, String> {
    Ok(match root.get("flow") {
        None => None,
        Some(Value::Table(t)) => Some(parse_flow(t, peers)?),
        Some(_) => return Err("`flow`: expected a [flow] table".into()),
    })
}

/// The keys of a node configuration, its `[probe]` and its `[route]`.
const TOP_KEYS: &[&str] = &[
    "id",
    "listen",
    "private_key_file",
    "key_file",
    "key",
    "peer",
    "probe",
    "route",
    "flow",
];
const PROBE_KEYS: &[&str] = &[
    "ping_ms",
    "slot_ms",
    "train",
    "train_bytes",
    "update_ms",
    "dead_after_ms",
    "eval_ms",
];
const ROUTE_KEYS: &[&str] = &[
    "to",
    "metric",
    "max_paths",
    "threshold_percent",
    "consecutive",
];

/// The table `[key]`, or `empty` when there is none.
fn sub_table<'a>(root: &'a Table, key: &str, empty: &'a Table) -> Result<&'a Table, String> {
    match root.get(key) {
        None => Ok(empty),
        Some(Value::Table(t)) => Ok(t),
        Some(_) => Err(format!("`{key}`: expected a [{key}] table")),
    }
}

/// The `[[peer]]` tables: at least one, each with its own id, address and public key.
fn parse_peers(root: &Table, id: NodeId, own_public: &[u8; 32]) -> Result<Vec<Peer>, String> {
    let Some(Value::Array(a)) = root.get("peer") else {
        return Err("at least one [[peer]] (id, addr) is required".into());
    };
    let mut peers: Vec<Peer> = Vec::new();
    for (i, v) in a.iter().enumerate() {
        let p = parse_peer(i, v, id, &peers, own_public)?;
        peers.push(p);
    }
    Ok(peers)
}

/// `[[peer]]` number `i`: an id neither ours nor an earlier peer's, its address, and a
/// public key neither ours nor an earlier peer's.
fn parse_peer(
    i: usize,
    v: &Value,
    id: NodeId,
    peers: &[Peer],
    own_public: &[u8; 32],
) -> Result<Peer, String> {
    let t = v.as_table().ok_or("`peer`: expected [[peer]] tables")?;
    check_keys(t, &format!("peer[{i}]."), &["id", "addr", "public_key"])?;
    let pid = num(t, "id", None, 0.0, MAX_NODE_ID as f64).map_err(|m| format!("peer[{i}]: {m}"))?
        as NodeId;
    let addr = t
        .get("addr")
        .and_then(Value::as_str)
        .ok_or(format!("peer[{i}]: `addr` is required"))?
        .parse::<SocketAddr>()
        .map_err(|e| format!("peer[{i}].addr: {e}"))?;
    if pid == id || peers.iter().any(|p| p.id == pid) {
        return Err(format!(
            "peer[{i}]: id {pid} is this node's or another peer's"
        ));
    }
    let public_key = match t.get("public_key") {
        Some(Value::String(k)) => crate::keys::decode(k)
            .map_err(|e| format!("peer[{i}].public_key: {e}"))?,
        Some(v) => return Err(format!("peer[{i}].public_key: expected base64 text, found {v}")),
        None => return Err(format!("peer[{i}]: `public_key` is required: node {pid}'s public key (`braid pubkey < its private key`)")),
    };
    if public_key == *own_public {
        return Err(format!("peer[{i}].public_key: node {pid}'s public key is this node's own (every node needs its own key pair: `braid genkey`)"));
    }
    if let Some(o) = peers.iter().find(|p| p.public_key == public_key) {
        return Err(format!("peer[{i}].public_key: nodes {} and {pid} have the same public key (every node needs its own key pair)", o.id));
    }
    Ok(Peer {
        id: pid,
        addr,
        public_key,
    })
}

/// `route.to`: the destinations to route to, each a peer's id.
fn parse_route_to(route: &Table, peers: &[Peer]) -> Result<Vec<NodeId>, String> {
    Ok(match route.get("to") {
        None => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_integer()
                    .and_then(|i| NodeId::try_from(i).ok())
                    .filter(|d| peers.iter().any(|p| p.id == *d))
                    .ok_or_else(|| format!("route.to: {v} is not a peer's id"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("route.to: expected a list of peer ids".into()),
    })
}

/// `(id, public key)` of every peer.
fn members(peers: &[Peer]) -> Vec<(NodeId, [u8; 32])> {
    peers.iter().map(|p| (p.id, p.public_key)).collect()
}

/// 32 fresh random bytes for this run's ephemeral key.
fn fresh_secret() -> std::io::Result<[u8; 32]> {
    crate::keys::generate().map_err(|e| {
        std::io::Error::other(format!(
            "no random bytes from the operating system for this run's key: {e}"
        ))
    })
}

/// The `[flow]` table: this node is an end of striped flows (to `flow.to`, if given).
fn parse_flow(t: &Table, peers: &[Peer]) -> Result<FlowConfig, String> {
    check_keys(
        t,
        "flow.",
        &[
            "to",
            "tun",
            "address",
            "path_mtu",
            "settle_ms",
            "adaptive",
            "session",
        ],
    )?;
    let to = match t.get("to") {
        None => None,
        Some(v) => Some(
            v.as_integer()
                .and_then(|i| NodeId::try_from(i).ok())
                .filter(|d| peers.iter().any(|p| p.id == *d))
                .ok_or_else(|| format!("flow.to: {v} is not a peer's id"))?,
        ),
    };
    let tun = parse_flow_tun(t)?;
    let address = parse_flow_address(t)?;
    let adaptive = match t.get("adaptive") {
        None => false,
        Some(Value::Boolean(b)) => *b,
        Some(v) => return Err(format!("flow.adaptive: expected true or false, found {v}")),
    };
    let session = flow_session(t.get("session"))?;
    Ok(FlowConfig {
        session,
        to,
        tun,
        address,
        path_mtu: num(t, "path_mtu", Some(1500.0), 576.0, 9000.0)? as u32,
        settle: Duration::from_millis(num(t, "settle_ms", Some(10_000.0), 0.0, 3_600_000.0)? as u64),
        adaptive,
    })
}

/// `flow.tun`: the name of the flow's TUN device, if any.
fn parse_flow_tun(t: &Table) -> Result<Option<String>, String> {
    Ok(match t.get("tun") {
        None => None,
        Some(Value::String(s)) if !s.is_empty() && s.len() < 16 => Some(s.clone()),
        Some(v) => {
            return Err(format!(
                "flow.tun: expected a device name of 1 to 15 characters, found {v}"
            ))
        }
    })
}

/// `flow.address`: the TUN device's IPv4 address and prefix length (`ADDRESS/PREFIX`),
/// if any.
fn parse_flow_address(t: &Table) -> Result<Option<(std::net::Ipv4Addr, u8)>, String> {
    Ok(match t.get("address") {
        None => None,
        Some(Value::String(s)) => {
            let (a, l) = s
                .split_once('/')
                .ok_or_else(|| format!("flow.address: expected ADDRESS/PREFIX, found {s:?}"))?;
            let a = a
                .parse::<std::net::Ipv4Addr>()
                .map_err(|e| format!("flow.address: {e}"))?;
            let l = l
                .parse::<u8>()
                .ok()
                .filter(|l| *l <= 32)
                .ok_or_else(|| format!("flow.address: bad prefix length in {s:?}"))?;
            Some((a, l))
        }
        Some(v) => return Err(format!("flow.address: expected a string, found {v}")),
    })
}

/// `[flow.session]`: the flow's session settings through the one schema (the tunnel's
/// `[session]` keys and defaults), but for the keys: the flow uses the nodes' own.
fn flow_session(
    v: Option<&Value>,
) -> Result<braid_proto::session::schema::SessionSettings, String> {
    let t = match v {
        None => return Ok(Default::default()),
        Some(Value::Table(t)) => t,
        Some(v) => return Err(format!("flow.session: expected a table, found {v}")),
    };
    for k in ["key", "key_file", "private_key_file", "peer_public_key"] {
        if t.contains_key(k) {
            return Err(format!(
                "flow.session.{k}: a flow's session uses the two nodes' own keys \
                 (private_key_file and the peers' public_key)"
            ));
        }
    }
    let s: braid_proto::session::schema::SessionSettings =
        serde_path_to_error::deserialize(Value::Table(t.clone())).map_err(|e| {
            let key = e.path().to_string();
            let why = e.into_inner().to_string();
            format!("flow.session.{key}: {}", why.trim_end())
        })?;
    // The checks that span keys (dead_after against heartbeat, …), now rather than
    // when the first flow starts.
    let slot = braid_proto::session::ChannelParams {
        name: "slot0".into(),
        weight: 1,
    };
    let mut probe = braid_proto::session::Config::new(vec![slot], 1400, Vec::new());
    s.apply(&mut probe)
        .map_err(|e| format!("flow.session.{}: {}", e.key, e.reason))?;
    Ok(s)
}

/// Counters of a running node.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct NodeStats {
    /// Datagrams sent.
    pub sent: u64,
    /// Datagrams received.
    pub received: u64,
    /// Dropped: the trailer did not verify (not sealed by the node it names, or with
    /// keys of another run), replayed a counter, came from a non-member, or a HELLO
    /// that did not verify or was replayed.
    pub auth_failures: u64,
    /// Authentic HELLOs taken.
    pub hellos: u64,
    /// HELLOs sent.
    pub hellos_sent: u64,
    /// Messages not sent: no session keys with that peer yet.
    pub no_keys: u64,
    /// Dropped: authentic but not a valid ALCP message, or from an unknown node.
    pub malformed: u64,
    /// UPDATEs taken into the table.
    pub updates: u64,
    /// Throughput probes that produced a rate.
    pub probes: u64,
    /// PROVISION messages taken.
    pub provisions: u64,
    /// TEARDOWN messages taken.
    pub teardowns: u64,
    /// PROVISIONs and TEARDOWNs refused (not from the flow's source, table full, a
    /// flow to a node without a `[flow]` section).
    pub flow_refused: u64,
    /// DATA datagrams relayed.
    pub forwarded: u64,
    /// DATA datagrams dropped: no provisioned flow, slot or sender matches.
    pub data_dropped: u64,
    /// DATA datagrams handed to this node's own flow end.
    pub data_delivered: u64,
}

/// This node's part in a striped flow.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FlowStatus {
    /// Flow id.
    pub flow: u32,
    /// Source node.
    pub src: NodeId,
    /// Destination node.
    pub dst: NodeId,
    /// The path of every slot (`None`: unused), e.g. `0->2->4`.
    pub slots: Vec<Option<String>>,
    /// DATA datagrams sent per slot by this end.
    pub sent: Vec<u64>,
    /// DATA datagrams received per slot by this end.
    pub received: Vec<u64>,
}

/// A route change of one destination.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RouteChange {
    /// When, µs since the Unix epoch.
    pub at_us: u64,
    /// The destination.
    pub dst: NodeId,
    /// `initial`, `better` or `dead a->b`.
    pub reason: String,
    /// The new paths, e.g. `0->2` or `0->1->2`, with their shares in Mbit/s.
    pub paths: Vec<(String, f64)>,
}

/// What a node knows, for status output and tests.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The accessibility table.
    pub table: AccessTable,
    /// Current paths per routed destination.
    pub routes: Vec<(NodeId, Vec<Choice>)>,
    /// Every route change so far.
    pub changes: Vec<RouteChange>,
    /// Counters.
    pub stats: NodeStats,
    /// Flows relayed by this node.
    pub relayed: Vec<RelayEntry>,
    /// The flow this node is an end of, if any.
    pub flow: Option<FlowStatus>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Train {
    seq0: u32,
    count: u32,
    first: Option<Instant>,
    last: Option<Instant>,
}

#[derive(Debug, Clone)]
struct PeerState {
    id: NodeId,
    addr: SocketAddr,
    rtt: Option<Duration>,
    loss: f64,
    throughput: Option<f64>,
    outstanding: Option<(u32, Instant)>,
    last_heard: Option<Instant>,
    train: Option<Train>,
}

/// The flow this node sources.
struct SrcFlow {
    dst: NodeId,
    flow: u32,
    /// When routes first existed.
    first_route: Option<Instant>,
    /// The path on every slot; empty until provisioned.
    slots: Vec<Option<Choice>>,
    /// Relays that were sent a PROVISION and may need a TEARDOWN.
    relays: Vec<NodeId>,
    next_provision: Instant,
}

/// The flow this node is the destination of.
struct DstFlow {
    src: NodeId,
    flow: u32,
    paths: Vec<(u8, Option<NodeId>)>,
}

/// What the driver must do with the flow end (it needs to await).
enum FlowCmd {
    Start {
        flow: u32,
        /// The other end of the flow.
        peer: NodeId,
        reverse: bool,
        weights: [u32; SLOTS],
        hops: [Option<Hop>; SLOTS],
    },
    Stop,
}

struct State {
    cfg: NodeConfig,
    flows: FlowTable,
    src_flow: Option<SrcFlow>,
    dst_flow: Option<DstFlow>,
    endpoint: Option<Arc<Endpoint>>,
    cmds: Vec<FlowCmd>,
    /// Shared with the flow end's shim tasks, which seal DATA.
    auth: Arc<Mutex<NodeAuth>>,
    sched: ProbeSchedule,
    peers: Vec<PeerState>,
    table: AccessTable,
    rerouters: Vec<(NodeId, Rerouter, Vec<Choice>)>,
    changes: Vec<RouteChange>,
    stats: NodeStats,
    seq: u32,
    update_seq: u32,
    next_ping: Instant,
    next_update: Instant,
    next_eval: Instant,
    probe: braid_proto::overlay::Probe,
    probe_sent: bool,
    /// When a HELLO that did not verify was last reported.
    last_hello_warning: Option<Instant>,
}

/// A handle to a running node's state.
#[derive(Clone)]
pub struct NodeHandle(Arc<Mutex<State>>);

impl NodeHandle {
    /// A copy of what the node knows now.
    pub fn snapshot(&self) -> Snapshot {
        let s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        Snapshot {
            table: s.table.clone(),
            routes: s
                .rerouters
                .iter()
                .map(|(d, _, c)| (*d, c.clone()))
                .collect(),
            changes: s.changes.clone(),
            stats: s.stats.clone(),
            relayed: s.flows.entries().to_vec(),
            flow: s.flow_status(),
        }
    }
}

/// The wall clock as a braid `Instant` (µs since the Unix epoch).
pub fn wall_now() -> Instant {
    let us = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0);
    Instant::from_micros(us)
}

/// A node bound to its socket, ready to run.
pub struct Node {
    socket: Arc<UdpSocket>,
    state: Arc<Mutex<State>>,
    app: Option<AppSide>,
}

fn path_text(c: &Choice) -> String {
    match c.path.relay {
        None => format!("{}->{}", c.path.src, c.path.dst),
        Some(r) => format!("{}->{}->{}", c.path.src, r, c.path.dst),
    }
}

impl Node {
    /// Bind `cfg.listen`.
    pub async fn bind(cfg: NodeConfig) -> std::io::Result<Node> {
        let socket = UdpSocket::bind(cfg.listen).await?;
        Node::with_socket(cfg, socket)
    }

    /// Use an already bound socket (tests bind first to learn the ports).
    pub fn with_socket(cfg: NodeConfig, socket: UdpSocket) -> std::io::Result<Node> {
        let app = cfg.flow.as_ref().and_then(|f| {
            f.tun.as_ref().map(|name| {
                AppSide::Tun(TunnelConfig {
                    name: name.clone(),
                    address: f.address,
                    address6: None,
                    mtu: None,
                    control: None,
                    metrics: None,
                    log_interval: std::time::Duration::ZERO,
                    log_level: None,
                })
            })
        });
        let state = State::new(cfg, wall_now(), fresh_secret()?)?;
        Ok(Node {
            socket: Arc::new(socket),
            state: Arc::new(Mutex::new(state)),
            app,
        })
    }

    /// Use in-process queues instead of a TUN device as the application side of this
    /// node's flow end (tests and examples).
    pub fn set_app(&mut self, app: AppSide) {
        self.app = Some(app);
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// A handle for snapshots while the node runs.
    pub fn handle(&self) -> NodeHandle {
        NodeHandle(self.state.clone())
    }

    /// Run until `shutdown` completes. A source sends TEARDOWNs on the way out.
    pub async fn run(
        mut self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> std::io::Result<()> {
        tokio::pin!(shutdown);
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(5));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut buf = vec![0u8; 65_536];
        let mut out: Vec<(SocketAddr, Vec<u8>)> = Vec::new();
        loop {
            tokio::select! {
                _ = &mut shutdown => {
                    {
                        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
                        s.teardown_all(&mut out);
                        s.endpoint = None;
                    }
                    for (to, d) in out.drain(..) {
                        let _ = self.socket.send_to(&d, to).await;
                    }
                    return Ok(());
                }
                r = self.socket.recv_from(&mut buf) => {
                    let (n, from) = match r {
                        Ok(x) => x,
                        // ICMP port unreachable from a dead peer and the like.
                        Err(_) => continue,
                    };
                    let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
                    s.on_datagram(wall_now(), from, &buf[..n], &mut out);
                }
                _ = tick.tick() => {
                    let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
                    s.on_tick(wall_now(), &mut out);
                }
            }
            let cmds = {
                let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
                std::mem::take(&mut s.cmds)
            };
            for c in cmds {
                self.flow_cmd(c).await;
            }
            let count = out.len() as u64;
            for (to, d) in out.drain(..) {
                // A peer that is down is not an error of ours.
                let _ = self.socket.send_to(&d, to).await;
            }
            if count > 0 {
                let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
                s.stats.sent += count;
            }
        }
    }
}

impl Node {
    /// Carry out what the state asked of the flow end: stop it, or (re)start it.
    async fn flow_cmd(&mut self, c: FlowCmd) {
        match c {
            FlowCmd::Stop => self.stop_flow_end(),
            FlowCmd::Start {
                flow,
                peer,
                reverse,
                weights,
                hops,
            } => {
                let spec = crate::node_flow::EndSpec {
                    flow,
                    reverse,
                    weights,
                    hops,
                };
                self.start_flow_end(peer, spec).await;
            }
        }
    }

    /// Drop the running flow end, if any.
    fn stop_flow_end(&mut self) {
        let e = self
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .endpoint
            .take();
        if let Some(e) = e {
            tracing::info!(flow = e.flow, "flow end stopped");
        }
    }

    /// Start this node's end of the flow `spec` with the node `peer` at its other end,
    /// replacing the running end if any; errors are logged, not returned.
    async fn start_flow_end(&mut self, peer: NodeId, spec: crate::node_flow::EndSpec) {
        let flow = spec.flow;
        let EndInputs {
            keys,
            auth,
            fc,
            replaced,
        } = self.take_endpoint(peer);
        let Some(keys) = keys else { return };
        if replaced {
            // A new flow (the source restarted): the old end's tasks were
            // aborted; let them close its TUN device before it is made again.
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        let Some(fc) = fc else { return };
        let Some(app) = self.take_app(flow) else {
            return;
        };
        match crate::node_flow::start(spec, keys, &fc, app, self.socket.clone(), auth).await {
            Ok(e) => {
                self.state
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .endpoint = Some(Arc::new(e));
            }
            Err(e) => tracing::error!(flow, "flow end not started: {e}"),
        }
    }

    /// Take the running flow end out of the state, and what a new end with `peer`
    /// needs from it.
    fn take_endpoint(&self, peer: NodeId) -> EndInputs {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let old = s.endpoint.take();
        let peer_public = s
            .cfg
            .peers
            .iter()
            .find(|p| p.id == peer)
            .map(|p| p.public_key);
        EndInputs {
            keys: peer_public.map(|pk| (s.cfg.private_key, pk)),
            auth: s.auth.clone(),
            fc: s.cfg.flow.clone(),
            replaced: old.is_some(),
        }
    }

    /// The application side for a new end of `flow`, or `None` (logged) if there is
    /// none; a TUN device is kept so that a later flow can open it again.
    fn take_app(&mut self, flow: u32) -> Option<AppSide> {
        let Some(app) = self.app.take() else {
            tracing::warn!(
                flow,
                "flow not started: this node has no application side (no [flow] tun, or its queues were used by an earlier flow)"
            );
            return None;
        };
        // A TUN device can be opened again for a later flow.
        if let AppSide::Tun(t) = &app {
            self.app = Some(AppSide::Tun(t.clone()));
        }
        Some(app)
    }
}

/// What a new flow end needs from the node's state ([`Node::take_endpoint`]).
struct EndInputs {
    /// Our private key and the peer's public key; `None` for an unknown peer.
    keys: Option<([u8; 32], [u8; 32])>,
    /// The authenticator shared with the end's tasks.
    auth: Arc<Mutex<NodeAuth>>,
    /// The `[flow]` config.
    fc: Option<FlowConfig>,
    /// Whether an end was running (and was taken out).
    replaced: bool,
}

/// A random flow id (it only has to differ from the last run's).
fn flow_id() -> u32 {
    let mut b = [0u8; 4];
    if getrandom::fill(&mut b).is_err() {
        return (wall_now().as_micros() as u32) | 1;
    }
    u32::from_be_bytes(b)
}

/// Session channel weights for a slot assignment: SRR quanta from the paths' shares;
/// an unused slot gets the smallest.
fn slot_weights(slots: &[Option<Choice>]) -> [u32; SLOTS] {
    let set: Vec<Choice> = slots.iter().flatten().copied().collect();
    let q = braid_proto::overlay::quanta(&set, 1400);
    let min = q.iter().copied().min().unwrap_or(1400);
    let mut weights = [min; SLOTS];
    let mut qi = q.into_iter();
    for (k, c) in slots.iter().enumerate().take(SLOTS) {
        if c.is_some() {
            weights[k] = qi.next().unwrap_or(min);
        }
    }
    weights
}

fn slot_path(c: &Option<Choice>) -> Option<String> {
    c.as_ref().map(path_text)
}

/// The weight of every slot a PROVISION names; slots it does not name get its
/// smallest weight.
fn provision_weights(paths: &[ProvisionPath]) -> [u32; SLOTS] {
    let min = paths.iter().map(|p| p.weight).min().unwrap_or(1);
    let mut weights = [min; SLOTS];
    for p in paths {
        if let Some(w) = weights.get_mut(p.slot as usize) {
            *w = p.weight;
        }
    }
    weights
}

impl State {
    /// A node's state at `now` (the wall clock), with 32 fresh random bytes for this
    /// run's ephemeral key.
    fn new(cfg: NodeConfig, now: Instant, ephemeral: [u8; 32]) -> std::io::Result<State> {
        let (sched, nodes) = probe_schedule(&cfg)?;
        let rerouters = rerouters(&cfg);
        let peers = peer_states(&cfg.peers);
        let probe = sched.next_probe(now);
        let src_flow = src_flow(&cfg, now);
        let auth = NodeAuth::new(cfg.id, &cfg.private_key, &members(&cfg.peers), ephemeral)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        Ok(State {
            flows: FlowTable::new(cfg.id, MAX_RELAYED_FLOWS),
            src_flow,
            dst_flow: None,
            endpoint: None,
            cmds: Vec::new(),
            auth: Arc::new(Mutex::new(auth)),
            sched,
            peers,
            table: AccessTable::new(nodes),
            rerouters,
            changes: Vec::new(),
            stats: NodeStats::default(),
            seq: 0,
            update_seq: 0,
            next_ping: now,
            next_update: now,
            next_eval: now,
            probe,
            probe_sent: false,
            last_hello_warning: None,
            cfg,
        })
    }
}

/// The overlay-wide probe schedule over this node and its peers, and the size of the
/// accessibility table (one past the largest node id).
fn probe_schedule(cfg: &NodeConfig) -> std::io::Result<(ProbeSchedule, usize)> {
    let mut ids: Vec<NodeId> = cfg.peers.iter().map(|p| p.id).collect();
    ids.push(cfg.id);
    let nodes = *ids.iter().max().unwrap_or(&0) as usize + 1;
    let sched = ProbeSchedule::new(
        ids,
        cfg.id,
        ProbeConfig {
            slot: cfg.slot,
            probe: cfg.slot,
            epoch: Instant::ZERO,
            ping_every: cfg.ping,
        },
    )
    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
    Ok((sched, nodes))
}

/// A [`Rerouter`] for every configured destination, with no current paths yet.
fn rerouters(cfg: &NodeConfig) -> Vec<(NodeId, Rerouter, Vec<Choice>)> {
    let route_cfg = RouteConfig {
        metric: cfg.metric,
        max_paths: cfg.max_paths,
        max_age: cfg.dead_after,
        ..RouteConfig::default()
    };
    let reroute = RerouteConfig {
        threshold: cfg.threshold,
        consecutive: cfg.consecutive,
        dead_after: cfg.dead_after,
    };
    cfg.routes
        .iter()
        .map(|&d| {
            (
                d,
                Rerouter::new(cfg.id, d, route_cfg.clone(), reroute),
                Vec::new(),
            )
        })
        .collect()
}

/// Every configured peer, with nothing measured or heard yet.
fn peer_states(peers: &[Peer]) -> Vec<PeerState> {
    peers
        .iter()
        .map(|p| PeerState {
            id: p.id,
            addr: p.addr,
            rtt: None,
            loss: 0.0,
            throughput: None,
            outstanding: None,
            last_heard: None,
            train: None,
        })
        .collect()
}

/// The flow this node sources, if its config has `[flow] to = D`: a fresh flow id, not
/// provisioned yet, the first PROVISION due at `now`.
fn src_flow(cfg: &NodeConfig, now: Instant) -> Option<SrcFlow> {
    cfg.flow.as_ref().and_then(|f| f.to).map(|dst| SrcFlow {
        dst,
        flow: flow_id(),
        first_route: None,
        slots: Vec::new(),
        relays: Vec::new(),
        next_provision: now,
    })
}

impl State {
    fn peer_addr(&self, id: NodeId) -> Option<SocketAddr> {
        self.peers.iter().find(|p| p.id == id).map(|p| p.addr)
    }

    fn hop(&self, id: NodeId) -> Option<Hop> {
        self.peer_addr(id).map(|addr| Hop { id, addr })
    }

    fn auth(&self) -> std::sync::MutexGuard<'_, NodeAuth> {
        self.auth.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn flow_status(&self) -> Option<FlowStatus> {
        let counts =
            |f: fn(&crate::node_flow::EndCounters) -> &[std::sync::atomic::AtomicU64; SLOTS]| {
                self.endpoint.as_ref().map_or(vec![0; SLOTS], |e| {
                    f(&e.counters)
                        .iter()
                        .map(|a| a.load(std::sync::atomic::Ordering::Relaxed))
                        .collect()
                })
            };
        if let Some(f) = &self.src_flow {
            return Some(FlowStatus {
                flow: f.flow,
                src: self.cfg.id,
                dst: f.dst,
                slots: f.slots.iter().map(slot_path).collect(),
                sent: counts(|c| &c.sent),
                received: counts(|c| &c.received),
            });
        }
        self.dst_flow.as_ref().map(|f| FlowStatus {
            flow: f.flow,
            src: f.src,
            dst: self.cfg.id,
            slots: (0..SLOTS as u8)
                .map(|k| {
                    f.paths.iter().find(|p| p.0 == k).map(|p| match p.1 {
                        None => format!("{}->{}", f.src, self.cfg.id),
                        Some(r) => format!("{}->{}->{}", f.src, r, self.cfg.id),
                    })
                })
                .collect(),
            sent: counts(|c| &c.sent),
            received: counts(|c| &c.received),
        })
    }

    /// Next hop of every slot of the flow we source.
    fn src_hops(&self, f: &SrcFlow) -> [Option<Hop>; SLOTS] {
        let mut h = [None; SLOTS];
        for (k, c) in f.slots.iter().enumerate().take(SLOTS) {
            h[k] = c.and_then(|c| self.hop(c.path.relay.unwrap_or(f.dst)));
        }
        h
    }

    /// Send the source's PROVISION to the destination and every relay of its paths, and
    /// a TEARDOWN to relays no longer on them.
    fn provision(&mut self, now: Instant, out: &mut Vec<(SocketAddr, Vec<u8>)>) {
        let Some(f) = self.src_flow.take() else {
            return;
        };
        let lifetime = Duration::from_micros(self.cfg.update.as_micros() * PROVISION_LIFETIMES);
        let mut f = f;
        if let Some(msg) = braid_proto::overlay::flow::provision(
            f.flow,
            self.cfg.id,
            f.dst,
            lifetime,
            &f.slots,
            1400,
        ) {
            let relays: Vec<NodeId> = f
                .slots
                .iter()
                .flatten()
                .filter_map(|c| c.path.relay)
                .collect();
            let gone: Vec<NodeId> = f
                .relays
                .iter()
                .copied()
                .filter(|r| !relays.contains(r))
                .collect();
            let td = Repr::Teardown {
                flow: f.flow,
                src: self.cfg.id,
                dst: f.dst,
            };
            for r in gone {
                self.send(r, &td, out);
            }
            for n in relays.iter().copied().chain([f.dst]) {
                self.send(n, &msg, out);
            }
            f.relays = relays;
        }
        f.next_provision = now + self.cfg.update;
        self.src_flow = Some(f);
    }

    /// TEARDOWN of the flow we source, to everyone on it.
    fn teardown_all(&mut self, out: &mut Vec<(SocketAddr, Vec<u8>)>) {
        let Some(f) = self.src_flow.take() else {
            return;
        };
        if !f.slots.is_empty() {
            let td = Repr::Teardown {
                flow: f.flow,
                src: self.cfg.id,
                dst: f.dst,
            };
            for n in f.relays.iter().copied().chain([f.dst]) {
                self.send(n, &td, out);
            }
        }
        self.src_flow = Some(f);
    }

    /// The source's flow after an evaluation: start it once the table has settled,
    /// move its slots when the paths changed.
    fn drive_src_flow(
        &mut self,
        now: Instant,
        changed: bool,
        out: &mut Vec<(SocketAddr, Vec<u8>)>,
    ) {
        let Some(mut f) = self.src_flow.take() else {
            return;
        };
        let paths: Vec<Choice> = self
            .rerouters
            .iter()
            .find(|r| r.0 == f.dst)
            .map(|r| r.2.clone())
            .unwrap_or_default();
        let mut send = false;
        if f.slots.is_empty() {
            if !paths.is_empty() {
                f.slots = assign_slots(&[], &paths, SLOTS);
                let weights = slot_weights(&f.slots);
                tracing::info!(
                    flow = f.flow,
                    slots = ?f.slots.iter().map(slot_path).collect::<Vec<_>>(),
                    ?weights,
                    "provisioning the flow"
                );
                let hops = self.src_hops(&f);
                self.cmds.push(FlowCmd::Start {
                    flow: f.flow,
                    peer: f.dst,
                    reverse: false,
                    weights,
                    hops,
                });
                send = true;
            }
        } else if changed {
            let cur: Vec<_> = f.slots.iter().map(|c| c.map(|c| c.path)).collect();
            f.slots = assign_slots(&cur, &paths, SLOTS);
            tracing::info!(
                flow = f.flow,
                slots = ?f.slots.iter().map(slot_path).collect::<Vec<_>>(),
                "flow moved"
            );
            let hops = self.src_hops(&f);
            if let Some(e) = &self.endpoint {
                e.set_hops(hops);
                // The moved slot gets its new path's weight.
                e.set_weights(slot_weights(&f.slots));
            }
            send = true;
        }
        let due = !f.slots.is_empty() && (send || now >= f.next_provision);
        self.src_flow = Some(f);
        if due {
            self.provision(now, out);
        }
    }

    /// A DATA datagram: ours to deliver, or to relay.
    /// A DATA datagram whose trailer verified: `sender` is the previous hop, `msg`
    /// the header and payload.
    fn on_data(
        &mut self,
        now: Instant,
        sender: NodeId,
        msg: &[u8],
        out: &mut Vec<(SocketAddr, Vec<u8>)>,
    ) {
        let Ok((h, payload)) = DataHeader::parse(msg) else {
            self.stats.data_dropped += 1;
            return;
        };
        if let Some(e) = &self.endpoint {
            if e.flow == h.flow && e.reverse != h.reverse {
                // Only from the node this end's slot goes through.
                if e.hops()[h.slot as usize % SLOTS].is_some_and(|hop| hop.id == sender) {
                    e.deliver(h.slot, payload);
                    self.stats.data_delivered += 1;
                } else {
                    self.stats.data_dropped += 1;
                }
                return;
            }
        }
        let Some(next) = self.flows.next_hop(now, sender, &h) else {
            self.stats.data_dropped += 1;
            return;
        };
        let Some(to) = self.peer_addr(next) else {
            self.stats.data_dropped += 1;
            return;
        };
        let mut v = Vec::with_capacity(msg.len() + TRAILER_LEN);
        v.extend_from_slice(msg);
        if self.auth().seal_in_place(next, &mut v) {
            self.stats.forwarded += 1;
            out.push((to, v));
        } else {
            self.stats.no_keys += 1;
            self.stats.data_dropped += 1;
        }
    }

    /// An authenticated PROVISION or TEARDOWN.
    fn on_flow_control(&mut self, now: Instant, sender: NodeId, r: &Repr) {
        let Some(role) = self.accept_flow_control(now, sender, r) else {
            return;
        };
        match (r, role) {
            (
                Repr::Provision {
                    flow, src, paths, ..
                },
                Role::Destination { paths: slots },
            ) => self.on_provision_to_us(*flow, *src, paths, slots),
            (Repr::Teardown { flow, src, .. }, _)
                if self
                    .dst_flow
                    .as_ref()
                    .is_some_and(|f| f.flow == *flow && f.src == *src) =>
            {
                tracing::info!(flow, src, "flow torn down");
                self.dst_flow = None;
                self.cmds.push(FlowCmd::Stop);
            }
            _ => {}
        }
    }

    /// Hand a PROVISION or TEARDOWN to the flow table and count it: this node's role in
    /// the flow, or `None` (counted as refused) if the table refused the message.
    fn accept_flow_control(&mut self, now: Instant, sender: NodeId, r: &Repr) -> Option<Role> {
        let role = match self.flows.handle(now, sender, r) {
            Ok(role) => role,
            Err(e) => {
                tracing::debug!("flow message refused: {e}");
                self.stats.flow_refused += 1;
                return None;
            }
        };
        match r {
            Repr::Provision { .. } => self.stats.provisions += 1,
            _ => self.stats.teardowns += 1,
        }
        Some(role)
    }

    /// A PROVISION of flow `flow` from `src` with this node as its destination: refused
    /// without a `[flow]` section; for the flow already running, its paths (and, if
    /// they moved, its weights) are updated in place; otherwise its end is started.
    fn on_provision_to_us(
        &mut self,
        flow: u32,
        src: NodeId,
        paths: &[ProvisionPath],
        slots: Vec<(u8, Option<NodeId>)>,
    ) {
        if self.cfg.flow.is_none() {
            self.stats.flow_refused += 1;
            return;
        }
        let hops = self.slot_hops(src, &slots);
        let same = self
            .dst_flow
            .as_ref()
            .is_some_and(|f| f.flow == flow && f.src == src);
        let weights = provision_weights(paths);
        if same {
            if let Some(e) = &self.endpoint {
                e.set_hops(hops);
                let moved = self.dst_flow.as_ref().is_some_and(|f| f.paths != slots);
                if moved {
                    e.set_weights(weights);
                }
            }
        } else {
            tracing::info!(flow, src, "flow arriving; starting its end");
            self.cmds.push(FlowCmd::Start {
                flow,
                peer: src,
                reverse: true,
                weights,
                hops,
            });
        }
        self.dst_flow = Some(DstFlow {
            src,
            flow,
            paths: slots,
        });
    }

    /// The previous hop of every `(slot, relay)` path of a flow from `src`: the relay,
    /// or `src` itself for a direct path.
    fn slot_hops(&self, src: NodeId, slots: &[(u8, Option<NodeId>)]) -> [Option<Hop>; SLOTS] {
        let mut hops = [None; SLOTS];
        for (slot, relay) in slots {
            if let Some(h) = hops.get_mut(*slot as usize) {
                *h = self.hop(relay.unwrap_or(src));
            }
        }
        hops
    }

    /// Seal `r` for peer `to` and queue it to the peer's configured address.
    fn send(&mut self, to: NodeId, r: &Repr, out: &mut Vec<(SocketAddr, Vec<u8>)>) {
        if let Some(addr) = self.peer_addr(to) {
            self.send_to(to, addr, r, out);
        }
    }

    /// Seal `r` for peer `to` and queue it to `addr`; nothing without keys with `to`
    /// yet (its HELLOs are under way).
    fn send_to(
        &mut self,
        to: NodeId,
        addr: SocketAddr,
        r: &Repr,
        out: &mut Vec<(SocketAddr, Vec<u8>)>,
    ) {
        if let Ok(mut v) = r.to_vec() {
            if self.auth().seal_in_place(to, &mut v) {
                out.push((addr, v));
            } else {
                self.stats.no_keys += 1;
            }
        }
    }

    /// HELLOs to every peer without established keys.
    fn hellos(&mut self, out: &mut Vec<(SocketAddr, Vec<u8>)>) {
        let auth = self.auth();
        let due: Vec<(SocketAddr, Vec<u8>)> = auth
            .unestablished()
            .into_iter()
            .filter_map(|id| Some((self.peer_addr(id)?, auth.hello(id)?)))
            .collect();
        drop(auth);
        self.stats.hellos_sent += due.len() as u64;
        out.extend(due);
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn on_tick(&mut self, now: Instant, out: &mut Vec<(SocketAddr, Vec<u8>)>) {
        if now >= self.next_ping {
            self.hellos(out);
            self.ping_peers(now, out);
            self.next_ping = self.sched.next_ping(now + Duration::from_micros(1));
        }
        // Our throughput probe: a train at the start of our slot, its rate at the end.
        if !self.probe_sent && now >= self.probe.start && now < self.probe.end {
            self.send_probe_train(out);
            self.probe_sent = true;
        }
        if now >= self.probe.end {
            self.finish_probe(now);
        }
        self.record_own_hops();
        if now >= self.next_update {
            self.send_update(now, out);
            self.next_update = now + self.cfg.update;
        }
        if now >= self.next_eval {
            self.evaluate_routes(now, out);
        }
    }

    /// A ping to every peer we may send to; one still unanswered counts as lost.
    fn ping_peers(&mut self, now: Instant, out: &mut Vec<(SocketAddr, Vec<u8>)>) {
        let me = self.cfg.id;
        for i in 0..self.peers.len() {
            let id = self.peers[i].id;
            if !self.auth().can_send(id) {
                continue;
            }
            if self.peers[i].outstanding.is_some() {
                self.peers[i].loss = self.peers[i].loss * (1.0 - LOSS_EWMA) + LOSS_EWMA;
            }
            let seq = self.next_seq();
            self.peers[i].outstanding = Some((seq, now));
            self.send(
                id,
                &Repr::Ping {
                    sender: me,
                    seq,
                    train: 0,
                    pad: 0,
                },
                out,
            );
        }
    }

    /// The train of padded pings to the peer of our probe slot.
    fn send_probe_train(&mut self, out: &mut Vec<(SocketAddr, Vec<u8>)>) {
        let me = self.cfg.id;
        let Some(i) = self.peers.iter().position(|p| p.id == self.probe.peer) else {
            return;
        };
        let id = self.peers[i].id;
        let seq0 = self.seq.wrapping_add(1);
        for k in 1..=self.cfg.train {
            let seq = self.next_seq();
            let pad = self.cfg.train_bytes;
            self.send(
                id,
                &Repr::Ping {
                    sender: me,
                    seq,
                    train: k,
                    pad,
                },
                out,
            );
        }
        self.peers[i].train = Some(Train {
            seq0,
            ..Train::default()
        });
    }

    /// At the end of our probe slot: the peer's throughput from the train's echoes, and
    /// the next slot.
    fn finish_probe(&mut self, now: Instant) {
        if let Some(i) = self.peers.iter().position(|p| p.id == self.probe.peer) {
            if let Some(t) = self.peers[i].train.take() {
                if let (Some(a), Some(b)) = (t.first, t.last) {
                    let span = (b - a).as_secs_f64();
                    if t.count >= 2 && span > 0.0 {
                        let bytes = PING_LEN + self.cfg.train_bytes as usize + TRAILER_LEN + IP_UDP;
                        self.peers[i].throughput =
                            Some((t.count - 1) as f64 * bytes as f64 * 8.0 / span);
                        self.stats.probes += 1;
                    }
                }
            }
        }
        // From the end of this slot, not from now: our next slot may start right where
        // this one ends, and `now` is already a tick past it.
        let next = self.sched.next_probe(self.probe.end);
        // After a long stall, do not replay missed slots.
        self.probe = if next.end <= now {
            self.sched.next_probe(now)
        } else {
            next
        };
        self.probe_sent = false;
    }

    /// Our own hops into our table.
    fn record_own_hops(&mut self) {
        let me = self.cfg.id;
        for p in &self.peers {
            if let (Some(tp), Some(rtt), Some(at)) = (p.throughput, p.rtt, p.last_heard) {
                let _ = self.table.update(
                    me,
                    p.id,
                    Measurement {
                        throughput_bps: tp,
                        rtt,
                        loss: p.loss.clamp(0.0, 1.0),
                        at,
                    },
                );
            }
        }
    }

    /// An UPDATE of our own hops to every peer.
    fn send_update(&mut self, now: Instant, out: &mut Vec<(SocketAddr, Vec<u8>)>) {
        let me = self.cfg.id;
        let entries: Vec<UpdateEntry> = self
            .peers
            .iter()
            .filter_map(|p| {
                let m = self.table.get(me, p.id)?;
                Some(UpdateEntry {
                    peer: p.id,
                    throughput_kbps: (m.throughput_bps / 1000.0).min(u32::MAX as f64) as u32,
                    rtt_us: m.rtt.as_micros().min(u32::MAX as u64) as u32,
                    loss_ppm: (m.loss * LOSS_SCALE as f64).round() as u32,
                    age_ms: ((now - m.at).as_micros() / 1000).min(u32::MAX as u64) as u32,
                })
            })
            .collect();
        if entries.is_empty() {
            return;
        }
        self.update_seq = self.update_seq.wrapping_add(1);
        let msg = Repr::Update {
            origin: me,
            seq: self.update_seq,
            entries,
        };
        let ids: Vec<NodeId> = self.peers.iter().map(|p| p.id).collect();
        for id in ids {
            self.send(id, &msg, out);
        }
    }

    /// Every rerouter's evaluation (the flow's held while it settles), then the flow
    /// follows its route and relayed flows expire.
    fn evaluate_routes(&mut self, now: Instant, out: &mut Vec<(SocketAddr, Vec<u8>)>) {
        let flow_dst = self.src_flow.as_ref().map(|f| f.dst);
        let hold = self.flow_route_on_hold(now);
        let mut flow_moved = false;
        for (dst, r, cur) in &mut self.rerouters {
            if hold && Some(*dst) == flow_dst {
                continue;
            }
            if let Decision::Switch { paths, reason } = r.evaluate(now, &self.table) {
                let reason = match reason {
                    braid_proto::overlay::Reason::Initial => "initial".to_string(),
                    braid_proto::overlay::Reason::Better => "better".to_string(),
                    braid_proto::overlay::Reason::Dead { from, to } => {
                        format!("dead {from}->{to}")
                    }
                };
                tracing::info!(dst = *dst, %reason, paths = ?paths.iter().map(path_text).collect::<Vec<_>>(), "route change");
                self.changes.push(RouteChange {
                    at_us: now.as_micros(),
                    dst: *dst,
                    reason,
                    paths: paths
                        .iter()
                        .map(|c| (path_text(c), c.share_bps / 1e6))
                        .collect(),
                });
                flow_moved |= Some(*dst) == flow_dst;
                *cur = paths;
            }
        }
        self.next_eval = now + self.cfg.eval;
        self.drive_src_flow(now, flow_moved, out);
        self.flows.expire(now);
    }

    /// Before the flow is provisioned, its route waits until the engine finds
    /// `max_paths` paths or `settle` has passed: the throughput probes fill the table
    /// one hop at a time, and the first choice should not be made on the first hop
    /// measured.
    fn flow_route_on_hold(&mut self, now: Instant) -> bool {
        let me = self.cfg.id;
        match &mut self.src_flow {
            Some(f) if f.slots.is_empty() => {
                let found = braid_proto::overlay::choose(
                    &self.table,
                    me,
                    f.dst,
                    now,
                    &RouteConfig {
                        metric: self.cfg.metric,
                        max_paths: self.cfg.max_paths,
                        max_age: self.cfg.dead_after,
                        ..RouteConfig::default()
                    },
                )
                .len();
                let first = if found > 0 {
                    Some(*f.first_route.get_or_insert(now))
                } else {
                    None
                };
                let settle = self.cfg.flow.as_ref().map_or(Duration::ZERO, |c| c.settle);
                found < self.cfg.max_paths && first.is_none_or(|t| now - t < settle)
            }
            _ => false,
        }
    }

    fn on_datagram(
        &mut self,
        now: Instant,
        from: SocketAddr,
        d: &[u8],
        out: &mut Vec<(SocketAddr, Vec<u8>)>,
    ) {
        self.stats.received += 1;
        if NodeAuth::is_hello(d) {
            self.on_hello(now, from, d, out);
            return;
        }
        let opened = self.auth().open(d);
        let (sender, msg) = match opened {
            Ok(x) => x,
            Err(e) => {
                tracing::trace!(%from, "datagram refused: {e}");
                self.stats.auth_failures += 1;
                return;
            }
        };
        if DataHeader::is_data(msg) {
            self.on_data(now, sender, msg, out);
            return;
        }
        let Ok(r) = Repr::parse(msg) else {
            self.stats.malformed += 1;
            return;
        };
        let Some(pi) = self.peers.iter().position(|p| p.id == sender) else {
            self.stats.malformed += 1;
            return;
        };
        match r {
            Repr::Ping { seq, train, .. } => {
                let me = self.cfg.id;
                self.send_to(
                    sender,
                    from,
                    &Repr::Pong {
                        sender: me,
                        seq,
                        train,
                    },
                    out,
                );
            }
            Repr::Pong { seq, train, .. } => self.on_pong(now, pi, seq, train),
            Repr::Update {
                origin, entries, ..
            } => self.on_update(now, sender, origin, entries),
            Repr::Provision { .. } | Repr::Teardown { .. } => self.on_flow_control(now, sender, &r),
        }
    }

    /// A HELLO: the handshake's answer goes to the peer's configured address (never a
    /// reflector); one that does not verify is counted, and named once in a while when
    /// it comes from a member's address.
    fn on_hello(
        &mut self,
        now: Instant,
        from: SocketAddr,
        d: &[u8],
        out: &mut Vec<(SocketAddr, Vec<u8>)>,
    ) {
        let r = self.auth().on_hello(now, d);
        match r {
            Ok(o) => {
                self.stats.hellos += 1;
                if o.rekeyed {
                    tracing::info!(peer = o.from, "new session keys with peer");
                }
                // Always to the peer's configured address: never a reflector.
                if let (Some(reply), Some(addr)) = (o.reply, self.peer_addr(o.from)) {
                    self.stats.hellos_sent += 1;
                    out.push((addr, reply));
                }
            }
            Err(e) => {
                self.stats.auth_failures += 1;
                // From a member's address but not verifying: most likely a public key
                // that is wrong in one of the two configurations. Say so, at once the
                // first time, then at most every 10 s.
                let member = self.peers.iter().find(|p| p.addr == from).map(|p| p.id);
                match (e, member) {
                    (AuthError::BadTag, Some(id))
                        if self
                            .last_hello_warning
                            .is_none_or(|t| now - t >= Duration::from_secs(10)) =>
                    {
                        self.last_hello_warning = Some(now);
                        tracing::warn!(
                            "a HELLO from node {id}'s address {from} does not verify: node {id}'s \
                             public_key in this node's configuration, or this node's public key in \
                             node {id}'s (`braid pubkey < this node's private key`), is wrong \
                             (or someone else sends from that address)"
                        );
                    }
                    _ => tracing::debug!(%from, "HELLO refused: {e}"),
                }
            }
        }
    }

    /// A PONG from peer `pi`: a round trip (train 0), or an echo of our probe train.
    fn on_pong(&mut self, now: Instant, pi: usize, seq: u32, train: u16) {
        let p = &mut self.peers[pi];
        p.last_heard = Some(now);
        if train == 0 {
            if let Some((s, sent)) = p.outstanding {
                if s == seq {
                    p.rtt = Some(now - sent);
                    p.loss *= 1.0 - LOSS_EWMA;
                    p.outstanding = None;
                }
            }
        } else if let Some(t) = &mut p.train {
            if seq.wrapping_sub(t.seq0) < u16::MAX as u32 {
                t.count += 1;
                t.first.get_or_insert(now);
                t.last = Some(now);
            }
        }
    }

    /// An UPDATE: the sender's measurements of its own hops into our table.
    fn on_update(
        &mut self,
        now: Instant,
        sender: NodeId,
        origin: NodeId,
        entries: Vec<UpdateEntry>,
    ) {
        if origin != sender {
            self.stats.malformed += 1;
            return;
        }
        self.stats.updates += 1;
        for e in entries {
            let _ = self.table.update(
                origin,
                e.peer,
                Measurement {
                    throughput_bps: e.throughput_kbps as f64 * 1000.0,
                    rtt: Duration::from_micros(e.rtt_us as u64),
                    loss: e.loss_ppm as f64 / LOSS_SCALE as f64,
                    at: Instant::from_micros(
                        now.as_micros().saturating_sub(e.age_ms as u64 * 1000),
                    ),
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_proto::overlay::auth::HELLO_LEN;

    fn config(id: NodeId, keys: &[[u8; 32]], addrs: &[SocketAddr]) -> NodeConfig {
        NodeConfig {
            id,
            listen: addrs[id as usize],
            peers: (0..addrs.len() as NodeId)
                .filter(|&p| p != id)
                .map(|p| Peer {
                    id: p,
                    addr: addrs[p as usize],
                    public_key: crate::keys::public_key(&keys[p as usize]),
                })
                .collect(),
            private_key: keys[id as usize],
            ping: Duration::from_millis(50),
            slot: Duration::from_millis(40),
            train: 4,
            train_bytes: 100,
            update: Duration::from_millis(50),
            dead_after: Duration::from_millis(400),
            eval: Duration::from_millis(25),
            routes: Vec::new(),
            metric: Metric::Throughput,
            max_paths: 2,
            threshold: 0.5,
            consecutive: 3,
            flow: None,
        }
    }

    /// Run nodes `a` and `b` (at `addrs[0]`, `addrs[1]`) for `ticks` ticks of 5 ms from
    /// `a_at` (a's clock) and `b_at` (b's), delivering everything at once; returns what
    /// `a` sent to `b`.
    fn run(
        a: &mut State,
        b: &mut State,
        addrs: &[SocketAddr],
        a_at: Instant,
        b_at: Instant,
        ticks: u64,
    ) -> Vec<Vec<u8>> {
        let mut sent = Vec::new();
        for k in 0..ticks {
            let step = Duration::from_millis(5 * k);
            let (ta, tb) = (a_at + step, b_at + step);
            let mut out_a = Vec::new();
            let mut out_b = Vec::new();
            a.on_tick(ta, &mut out_a);
            b.on_tick(tb, &mut out_b);
            // A few rounds, so that answers to answers (HELLOs) go through in a tick.
            for _ in 0..4 {
                let mut next_a = Vec::new();
                let mut next_b = Vec::new();
                for (to, d) in out_a.drain(..) {
                    assert_eq!(to, addrs[1]);
                    sent.push(d.clone());
                    b.on_datagram(tb, addrs[0], &d, &mut next_b);
                }
                for (to, d) in out_b.drain(..) {
                    assert_eq!(to, addrs[0]);
                    a.on_datagram(ta, addrs[1], &d, &mut next_a);
                }
                out_a = next_a;
                out_b = next_b;
            }
        }
        sent
    }

    /// Node 0 restarts with its clock stepped back to the instant its first run started
    /// (node 1 runs on): the old design took its counters from the clock under one
    /// shared key, so both runs sealed their first PINGs with the same nonce and key
    /// (byte-identical datagrams). Now no sealed datagram of the second run shares
    /// (key, nonce) with one of the first: where message and counter are equal, the
    /// tags differ. And node 1 refuses the first run's datagrams replayed.
    #[test]
    fn no_nonce_repeats_after_a_restart_with_the_clock_stepped_back() {
        let keys: Vec<[u8; 32]> = (0..2).map(|_| crate::keys::generate().unwrap()).collect();
        let addrs: Vec<SocketAddr> = vec![
            "127.0.0.1:7400".parse().unwrap(),
            "127.0.0.1:7401".parse().unwrap(),
        ];
        let t0 = Instant::from_micros(1_800_000_000_000_000);
        let fresh = || fresh_secret().unwrap();
        let mut b = State::new(config(1, &keys, &addrs), t0, fresh()).unwrap();
        let mut a1 = State::new(config(0, &keys, &addrs), t0, fresh()).unwrap();
        let first = run(&mut a1, &mut b, &addrs, t0, t0, 100);
        // Node 1 heard node 0's PINGs (and node 0 its PONGs).
        assert!(
            b.stats.hellos > 0 && b.stats.auth_failures == 0,
            "{:?}",
            b.stats
        );
        assert!(a1.peers[0].rtt.is_some(), "{:?}", a1.stats);
        // Restart at the same clock reading; node 1 is 0.5 s further on.
        let b_at = t0 + Duration::from_millis(500);
        let mut a2 = State::new(config(0, &keys, &addrs), t0, fresh()).unwrap();
        let second = run(&mut a2, &mut b, &addrs, t0, b_at, 100);
        assert!(a2.peers[0].rtt.is_some(), "{:?}", a2.stats);
        let sealed = |v: &[Vec<u8>]| -> Vec<Vec<u8>> {
            v.iter()
                .filter(|d| !(d.len() == HELLO_LEN && NodeAuth::is_hello(d)))
                .cloned()
                .collect()
        };
        let (first, second) = (sealed(&first), sealed(&second));
        let mut same_nonce_and_message = 0;
        for d2 in &second {
            let (ad2, tag2) = d2.split_at(d2.len() - 16);
            for d1 in &first {
                let (ad1, tag1) = d1.split_at(d1.len() - 16);
                if ad1 == ad2 {
                    same_nonce_and_message += 1;
                    assert_ne!(tag1, tag2, "the same key and nonce sealed twice");
                }
            }
        }
        assert!(
            same_nonce_and_message > 0,
            "the runs sent nothing alike: the test proves nothing"
        );
        // The first run's datagrams, replayed to node 1: none is taken.
        let before = b.stats.clone();
        let mut out = Vec::new();
        for d in &first {
            b.on_datagram(b_at + Duration::from_secs(1), addrs[0], d, &mut out);
        }
        assert_eq!(
            b.stats.auth_failures - before.auth_failures,
            first.len() as u64
        );
    }
}
