//! Live statistics of a session: a serializable snapshot, rendered as a table (for
//! `braid status` and the log), as JSON, or in the Prometheus text format.

use std::fmt::Write;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use std::sync::atomic::AtomicU64;

/// Per-channel counters and state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChannelSnapshot {
    /// Physical index (same at both ends).
    pub index: usize,
    /// Name from the configuration.
    pub name: String,
    /// Local address.
    pub local: String,
    /// The peer's address on the channel: configured, or learnt from its
    /// authenticated datagrams (`-`: not known yet).
    pub remote: String,
    /// Times the peer's address on the channel moved (an authenticated datagram from
    /// a new address: a NAT's new mapping, roaming).
    #[serde(default)]
    pub endpoint_changes: u64,
    /// Do we hear the peer on this channel (`up`/`down`)?
    pub state: String,
    /// Seconds since `state` last changed.
    pub state_since_s: f64,
    /// Times `state` changed.
    pub state_changes: u64,
    /// Does the peer report hearing us on this channel?
    pub peer_hears_us: bool,
    /// Is the channel in our current transmit set?
    pub in_tx_set: bool,
    /// Is the channel in our current receive set?
    pub in_rx_set: bool,
    /// Datagrams sent (data and control).
    pub tx_datagrams: u64,
    /// Bytes sent (UDP payload).
    pub tx_bytes: u64,
    /// Data packets sent.
    pub tx_data_packets: u64,
    /// Markers sent.
    pub tx_markers: u64,
    /// Triggers sent.
    pub tx_triggers: u64,
    /// Send errors (e.g. unreachable).
    pub tx_errors: u64,
    /// Datagrams made for the channel and not sent: its uplink was gone, or no address
    /// of the peer was known on it.
    #[serde(default)]
    pub tx_discarded: u64,
    /// Datagrams dropped on arrival because this channel's share of the receive queue
    /// was full (a flood on its port, or a driver that cannot keep up).
    #[serde(default)]
    pub rx_queue_drops: u64,
    /// Datagrams dropped on arrival because they were larger than any channel carries.
    #[serde(default)]
    pub rx_oversize: u64,
    /// Sealed datagrams dropped on arrival because no key of the session could accept
    /// them: an unknown key index, or a counter outside every window (forgeries; see
    /// docs/security.md, "A flood aimed at one peer").
    #[serde(default)]
    pub rx_implausible: u64,
    /// Datagrams received.
    pub rx_datagrams: u64,
    /// Bytes received (UDP payload).
    pub rx_bytes: u64,
    /// Data packets received.
    pub rx_data_packets: u64,
    /// Markers received and authenticated.
    pub rx_markers: u64,
    /// Triggers received and authenticated.
    pub rx_triggers: u64,
    /// Hellos received and authenticated.
    pub rx_hellos: u64,
    /// Markers/triggers that changed the receiver's state.
    pub resyncs: u64,
    /// Times the receiver gave up waiting on this channel.
    pub wait_timeouts: u64,
    /// Arrivals dropped because the receive buffer was full.
    pub overflow_drops: u64,
    /// Sealed datagrams whose tag did not verify (forged, corrupted, wrong key).
    pub auth_failures: u64,
    /// Datagrams dropped because they were not sealed where sealing is required, or
    /// sealed with keys we do not have.
    #[serde(default)]
    pub unauthenticated: u64,
    /// Control packets replayed, reordered or reflected.
    pub replays: u64,
    /// Handshake messages that failed on this channel: the peer's initiations we
    /// refused (other keys), rejections of ours, unauthenticated or stale responses.
    /// Rising while the peer is never heard: the two ends' keys differ (the log says
    /// how).
    #[serde(default)]
    pub handshake_failures: u64,
    /// Datagrams the core could not parse.
    pub malformed: u64,
    /// Send rate over the last second, bit/s.
    pub tx_bps: f64,
    /// Receive rate over the last second, bit/s.
    pub rx_bps: f64,
    /// Feedback reports received from the peer on this channel.
    pub rx_feedback: u64,
    /// Smoothed round-trip time from the peer's feedback, ms (-1: not known yet).
    pub srtt_ms: f64,
    /// Smallest recent round trip, ms (-1: not known yet).
    pub rtt_min_ms: f64,
    /// Rate at which the peer received on this channel, from its feedback, bit/s
    /// (-1: not known yet).
    pub delivery_bps: f64,
    /// Share of our datagrams the peer found missing on this channel, recent reports
    /// (-1: not known yet).
    pub loss_ratio: f64,
    /// SRR quantum in bytes: adapted to what the channel delivers, or as configured.
    pub quantum: u64,
    /// The channel's place in the bond: `active`, `demoted` or `probing` (bad-link
    /// demotion), or `down` / `wait` while the peer is not heard on it.
    #[serde(default)]
    pub role: String,
    /// Its weight in the stripe now: its quantum while in the transmit set, else 0.
    #[serde(default)]
    pub weight: u64,
    /// 1 while demoted or probing (out of the transmit set for being a net cost).
    #[serde(default)]
    pub demoted: bool,
    /// 1 while demoted and probing healthy (promoted after `promote_after`).
    #[serde(default)]
    pub probing: bool,
    /// 1 while it carries our return path alone (the others are out of the transmit
    /// set meanwhile).
    #[serde(default)]
    pub return_path: bool,
    /// Seconds since `role` last changed between active, demoted and probing.
    #[serde(default)]
    pub role_since_s: f64,
    /// Times the channel was demoted.
    #[serde(default)]
    pub demotions: u64,
    /// Loss over the demotion window (`demote_after`) (-1: not measured).
    #[serde(default)]
    pub window_loss_ratio: f64,
    /// Queueing delay the AQM measures on this channel, ms (-1: AQM off or no recent
    /// timestamped marker).
    #[serde(default)]
    pub queue_delay_ms: f64,
    /// In-bond repair: datagrams found missing on this channel.
    #[serde(default)]
    pub arq_missing: u64,
    /// Of those, filled by a repair from the peer.
    #[serde(default)]
    pub arq_repaired: u64,
    /// Of those, given up after the wait.
    #[serde(default)]
    pub arq_given_up: u64,
    /// This channel's datagrams we sent again at the peer's request.
    #[serde(default)]
    pub arq_resent: u64,
    /// Requests for this channel's datagrams not answered: the last copy had left
    /// less than a round trip of the repair path before (the answer was on its way).
    #[serde(default)]
    pub arq_premature: u64,
    /// Requests for datagrams no longer kept (older than a second).
    #[serde(default)]
    pub arq_expired: u64,
    /// Requests for datagrams never sent: rejected (a broken or hostile peer).
    #[serde(default)]
    pub arq_rejected: u64,
    /// Credits on: packets our data may still put into the peer's buffer for this
    /// channel (-1: credits off).
    #[serde(default)]
    pub credit_balance: f64,
    /// The rate the channel is paced at, bit/s on the wire (-1: not paced): its
    /// configured `pace`, or below it while adaptive weights find less on its link.
    #[serde(default)]
    pub pace_bps: f64,
    /// The channel's rate as a capacity probe measured it, bit/s on the wire (-1: not
    /// measured; `pace = "auto"`).
    #[serde(default)]
    pub measured_bps: f64,
    /// Adaptive pacing: cuts of the channel's pace on loss above random loss, with no
    /// standing queue to show its link full (they learn no capacity).
    #[serde(default)]
    pub pace_cuts_on_loss: u64,
    /// Adaptive pacing: cuts on a standing queue on the channel's link (the link was
    /// full: what it delivered is its capacity).
    #[serde(default)]
    pub pace_cuts_on_queue: u64,
    /// Adaptive pacing: cuts that turned out to be the link's jitter (the queue stood
    /// whatever the pace; the rate went back, the delay became the floor).
    #[serde(default)]
    pub pace_jitter: u64,
    /// Adaptive pacing: the capacity the channel's last cut on a queue showed, bit/s
    /// on the wire, which probing holds at before it tries above (-1: none since it
    /// was measured).
    #[serde(default = "minus_one_f64")]
    pub pace_capacity_bps: f64,
    /// Adaptive pacing: the one-way delay above its minimum taken for the link's
    /// jitter, ms (a standing queue is judged above it; -1: not paced adaptively).
    #[serde(default = "minus_one_f64")]
    pub pace_floor_ms: f64,
    /// Its capacity probe (`pace = "auto"`): `off` (not measured), `measuring`,
    /// `measured`, `capped` (measured, paced at its lower configured pace) or `failed`.
    #[serde(default)]
    pub probe: String,
    /// The probe's outcome and how the channel is paced now, in words (why it failed,
    /// when it did).
    #[serde(default)]
    pub probe_detail: String,
    /// Path MTU discovery (`session::pmtu`): the largest datagram the channel carries
    /// now, its PLPMTU, bytes of UDP payload (-1: discovery off).
    #[serde(default = "minus_one_f64")]
    pub plpmtu: f64,
    /// Path MTU discovery: MTU probes sent on the channel.
    #[serde(default)]
    pub pmtu_probes_sent: u64,
    /// Path MTU discovery: MTU probes the peer did not acknowledge in time (too big
    /// for the path, or lost).
    #[serde(default)]
    pub pmtu_probes_lost: u64,
}

/// A snapshot of a whole session.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionStats {
    /// Seconds since the session started.
    pub uptime_s: f64,
    /// Have we heard an authenticated packet from the peer?
    pub peer_seen: bool,
    /// The peer closed the session on purpose (and no new run of it has been heard).
    #[serde(default)]
    pub peer_closed: bool,
    /// No data has flowed either way for `idle_after`: hellos at the idle heartbeat.
    #[serde(default)]
    pub idle: bool,
    /// Seconds since the last authenticated packet from the peer (-1: never).
    pub peer_last_heard_s: f64,
    /// Transmit epoch.
    pub tx_epoch: u32,
    /// Receive epoch.
    pub rx_epoch: u32,
    /// A transmit epoch switch is waiting for its ack.
    pub switching: bool,
    /// Epoch switches completed as sender.
    pub tx_epoch_changes: u64,
    /// Epoch switches completed as receiver.
    pub rx_epoch_changes: u64,
    /// Messages accepted from the application.
    pub sent_packets: u64,
    /// Their bytes.
    pub sent_bytes: u64,
    /// Messages delivered to the application.
    pub delivered_packets: u64,
    /// Their bytes.
    pub delivered_bytes: u64,
    /// Out-of-order deliveries the core could see (seq mode only).
    pub out_of_order: u64,
    /// Packets the core declared lost (seq, trr), plus those left undeliverable at an
    /// epoch switch.
    pub lost: u64,
    /// Sequence numbers this end asked the peer to repair (seq mode, NAKs).
    pub naks_sent: u64,
    /// Missing packets delivered thanks to a repair.
    pub repaired: u64,
    /// Messages dropped because the switch queue was full.
    pub queue_drops: u64,
    /// Messages dropped because the application did not read fast enough.
    pub deliver_drops: u64,
    /// Data arriving on a channel outside the receive set.
    pub stray_drops: u64,
    /// Sealed datagrams with a bad tag, all channels.
    pub auth_failures: u64,
    /// Unsealed or unknown-key datagrams dropped, all channels.
    #[serde(default)]
    pub unauthenticated: u64,
    /// Replayed sealed datagrams, all channels.
    pub replays: u64,
    /// Security mode (`encrypt`, `auth`, `none`).
    #[serde(default)]
    pub security: String,
    /// The cipher data are sealed with (`aes-256-gcm`, `chacha20-poly1305`), agreed
    /// in the handshake; absent before the first (and for a server: see its peers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cipher: Option<String>,
    /// Handshakes completed (the first, re-keys, after peer restarts).
    #[serde(default)]
    pub handshakes: u64,
    /// Handshake messages that failed (wrong key, corrupted, stray responses), all
    /// channels.
    #[serde(default)]
    pub handshake_failures: u64,
    /// Handshakes refused because the peer's settings (mode, scheduler, weights,
    /// security, credits) differ from ours (the log names the setting).
    #[serde(default)]
    pub settings_mismatches: u64,
    /// Handshake messages dropped for a wrong mac1, before any public-key work.
    #[serde(default)]
    pub handshake_mac1_failures: u64,
    /// Cookie replies we sent (we were under load), and received (the peer was).
    #[serde(default)]
    pub cookie_replies_sent: u64,
    /// Cookie replies received from the peer.
    #[serde(default)]
    pub cookie_replies_received: u64,
    /// Initiations refused by the per-channel limit on public-key work.
    #[serde(default)]
    pub handshakes_rate_limited: u64,
    /// Handshake jobs shed because the handshake worker's queue was full.
    #[serde(default)]
    pub handshakes_shed: u64,
    /// Initiations not answered: a copy of one already processed, or a timestamp
    /// not newer than the last accepted.
    #[serde(default)]
    pub handshake_replays: u64,
    /// Unparseable datagrams, all channels.
    pub malformed: u64,
    /// Resynchronizations, all channels.
    pub resyncs: u64,
    /// Delivery rate over the last second, bit/s.
    pub delivered_bps: f64,
    /// Times adaptive weights changed the quanta.
    pub quanta_changes: u64,
    /// In-bond repair: datagrams found missing, all channels.
    #[serde(default)]
    pub arq_missing: u64,
    /// Of those, filled by a repair.
    #[serde(default)]
    pub arq_repaired: u64,
    /// AQM: packets delivered with a CE mark.
    #[serde(default)]
    pub aqm_ce_marks: u64,
    /// AQM: packets dropped as a congestion signal (not ECN-capable).
    #[serde(default)]
    pub aqm_drops: u64,
    /// Congestion signals the AQM did not give because the packet was small and not
    /// ECN-capable (a SYN, a pure ACK: dropping it frees no queue).
    #[serde(default)]
    pub aqm_spared: u64,
    /// AQM: losses taken as congestion (their channel's queue stood above target).
    #[serde(default)]
    pub aqm_loss_signals: u64,
    /// Pacing (`pace` on a channel): times a packet waited for a channel's tokens.
    #[serde(default)]
    pub pacing_waits: u64,
    /// Pacing: packets marked CE for their wait in the transmit queue (CoDel).
    #[serde(default)]
    pub pacing_ce_marks: u64,
    /// Pacing: packets dropped for it (not ECN-capable).
    #[serde(default)]
    pub pacing_drops: u64,
    /// Capacity probes (`pace = "auto"`): trains we sent to measure our channels.
    #[serde(default)]
    pub probe_trains: u64,
    /// The largest inner packet the bond carries now, bytes: the TUN device's MTU
    /// (path MTU discovery lowers it to the smallest channel's).
    #[serde(default)]
    pub bond_mtu: u64,
    /// Capacity probes: reports of our trains that came back (channels measured).
    #[serde(default)]
    pub probe_reports: u64,
    /// The channel our return path rides alone (`session::return_path`: we carry
    /// little more than the acknowledgements of the peer's flow), -1 while it uses
    /// every channel.
    #[serde(default = "minus_one")]
    pub return_path_channel: i64,
    /// The channel whose next packet the receiver waits for while later data is held
    /// (-1: none): a wait ends when it comes, or `max_wait` after the channel last
    /// brought data.
    #[serde(default = "minus_one")]
    pub rx_waiting_channel: i64,
    /// How long that wait has lasted, seconds (0 without one).
    #[serde(default)]
    pub rx_waiting_s: f64,
    /// Times the return path was cut to one channel.
    #[serde(default)]
    pub return_path_cuts: u64,
    /// Real-time flows (`docs/tunnel.md`, "Real-time flows"): packets we sent
    /// redundantly.
    #[serde(default)]
    pub flows_tx_redundant: u64,
    /// Packets we sent on the lowest-delay channel.
    #[serde(default)]
    pub flows_tx_lowest_delay: u64,
    /// Of those, TCP pure acknowledgements.
    #[serde(default)]
    pub flows_tx_acks: u64,
    /// Real-time packets that went into the bond instead (too large, no keys yet).
    #[serde(default)]
    pub flows_tx_fallback: u64,
    /// Flow datagrams delivered (the first copy of each packet).
    #[serde(default)]
    pub flows_rx_delivered: u64,
    /// Copies dropped because their packet was delivered already.
    #[serde(default)]
    pub flows_rx_duplicates: u64,
    /// Flow datagrams of a TCP flow held in its ordered domain for one they overtook.
    #[serde(default)]
    pub flows_rx_held: u64,
    /// Packets of ordered domains given up: missing when their wait ran out.
    #[serde(default)]
    pub flows_rx_gaps: u64,
    /// TCP segments of the stripe delivered ahead of its order, each continuing its
    /// own flow (per-flow order, `flow_order`).
    #[serde(default)]
    pub flows_rx_early: u64,
    /// TCP carried as streams: connections open now (being made, or made).
    #[serde(default)]
    pub streams_open: u64,
    /// TCP connections taken at this end and opened as streams to the peer.
    #[serde(default)]
    pub streams_opened: u64,
    /// Connections made at this end for the peer's streams.
    #[serde(default)]
    pub streams_connected: u64,
    /// Connections refused (by the far end's destination, or not allowed there).
    #[serde(default)]
    pub streams_refused: u64,
    /// Connections reset after they were made, by either end.
    #[serde(default)]
    pub streams_reset: u64,
    /// Bytes of our connections sent as stream data, and received as it.
    #[serde(default)]
    pub streams_tx_bytes: u64,
    /// Bytes of the peer's streams written to our connections.
    #[serde(default)]
    pub streams_rx_bytes: u64,
    /// Stream data sent again (lost, or not acknowledged in time).
    #[serde(default)]
    pub streams_retransmitted_bytes: u64,
    /// Stream control frames (all but data) sent past the stripe on the lowest-delay
    /// channel.
    #[serde(default)]
    pub streams_tx_control: u64,
    /// Stream data frames sent that way: streams on the fast lane (they send little).
    #[serde(default)]
    pub streams_tx_fast: u64,
    /// Stream frames received that way (control, and the fast lane's data).
    #[serde(default)]
    pub streams_rx_control: u64,
    /// Packets waiting in the transmit queue (for credit, or an epoch switch).
    #[serde(default)]
    pub tx_queued: f64,
    /// Credits: times a channel ran out of credit and our striper waited.
    #[serde(default)]
    pub credit_stalls: u64,
    /// Credits: credits we sent the peer.
    #[serde(default)]
    pub credits_sent: u64,
    /// Credits: data we refused because the peer was past its credit.
    #[serde(default)]
    pub credit_refused: u64,
    /// Per channel.
    pub channels: Vec<ChannelSnapshot>,
    /// A server's own counters (`None` for a point-to-point tunnel's session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerCounters>,
    /// A server's peers, each with its session's snapshot once it connected.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<PeerStats>,
}

/// A server's counters of what reached no peer (`docs/security.md`, "What a server
/// checks").
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerCounters {
    /// Peers configured.
    pub peers: u64,
    /// Peers whose session runs (they sent a handshake that read).
    pub peers_connected: u64,
    /// Initiations from a static key no `[[peer]]` has: dropped.
    pub unknown_peer: u64,
    /// Initiations that passed mac1 but did not read with our key: dropped.
    pub unreadable_initiations: u64,
    /// Initiations whose mac1 is not ours: dropped before any public-key work.
    pub initiation_mac1_failures: u64,
    /// Initiations not read because the handshake thread was busy (the initiator tries
    /// again).
    pub initiations_shed: u64,
    /// Copies (on the other channels) and replays of initiations already read: passed
    /// on without public-key work.
    #[serde(default)]
    pub initiation_copies: u64,
    /// Cookie replies sent: under load, initiations without a valid mac2 for their
    /// source, not read.
    #[serde(default)]
    pub cookie_replies: u64,
    /// Of those, initiations whose mac2 was over a stale cookie (an old secret, or
    /// another address: the client moved).
    #[serde(default)]
    pub stale_cookies: u64,
    /// Initiations dropped by their source's rate or the cookie replies' rate.
    #[serde(default)]
    pub initiations_rate_limited: u64,
    /// Datagrams larger than the channels carry, dropped.
    #[serde(default)]
    pub oversized: u64,
    /// Sealed datagrams (or handshake answers) whose key index is no running peer's.
    pub unknown_index: u64,
    /// Sealed datagrams for a running peer that no key of its session could accept
    /// (an index of its prefix it does not have, or a counter outside its windows),
    /// dropped before they were queued: forgeries (docs/security.md).
    #[serde(default)]
    pub implausible: u64,
    /// Datagrams that are neither sealed nor a handshake message.
    pub unroutable: u64,
    /// Packets from the TUN whose destination is in no peer's allowed IPs.
    pub no_route: u64,
    /// Packets from a peer whose source is outside its allowed IPs (all peers).
    pub source_not_allowed: u64,
    /// Packets (either way) that are not IPv4 or IPv6.
    pub not_ip: u64,
    /// Peers added by reloads.
    pub peers_added: u64,
    /// Peers removed by reloads.
    pub peers_removed: u64,
    /// The channels' local addresses.
    pub listen: Vec<String>,
}

/// One peer of a server.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerStats {
    /// Its name (`[[peer]] name`).
    pub name: String,
    /// Its public key (base64).
    pub public_key: String,
    /// Its allowed IPs.
    pub allowed_ips: Vec<String>,
    /// Its session runs (it sent a handshake that read; until a reload removes it).
    pub connected: bool,
    /// Packets from it whose source is outside its allowed IPs: dropped.
    pub source_not_allowed: u64,
    /// Packets from the TUN for it before it connected: dropped.
    pub not_connected: u64,
    /// Packets from the TUN for it that its session's queue had no room for.
    pub tx_queue_drops: u64,
    /// Packets from it written to the TUN device.
    pub to_tun: u64,
    /// Its session (`None` until it connects).
    pub session: Option<SessionStats>,
}

fn si(v: f64) -> String {
    if v >= 1e9 {
        format!("{:.2}G", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// A value that is -1 while not known: `-` then, else `v * scale` with `prec` decimals.
fn known(v: f64, scale: f64, prec: usize) -> String {
    if v < 0.0 {
        "-".into()
    } else {
        format!("{:.prec$}", v * scale)
    }
}

impl SessionStats {
    /// Every packet not delivered, by cause, on one line: those this end did not send
    /// (its transmit queue full, the pacer's CoDel) and those it did not deliver of
    /// the peer's (its AQM's congestion signals, given up as lost, the application too
    /// slow, the channels' receive queues and buffers full). The same counters are in
    /// the JSON and the metrics under their own names (`queue_drops`, `pacing_drops`,
    /// `aqm_drops`, `lost`, `deliver_drops`, `rx_queue_drops`, `overflow_drops`).
    pub fn not_delivered_line(&self) -> String {
        let per_channel = |f: fn(&ChannelSnapshot) -> u64| self.channels.iter().map(f).sum::<u64>();
        format!(
            "not sent: queue full {}  pacer {}    not delivered: aqm {}  given up {}  app too slow {}  receive queue {}  buffer {}",
            self.queue_drops,
            self.pacing_drops,
            self.aqm_drops,
            self.lost,
            self.deliver_drops,
            per_channel(|c| c.rx_queue_drops),
            per_channel(|c| c.overflow_drops),
        )
    }

    /// A multi-line human-readable table.
    pub fn table(&self) -> String {
        if let Some(srv) = &self.server {
            return self.server_table(srv);
        }
        let mut s = String::new();
        self.summary_line(&mut s);
        self.channel_rows(&mut s);
        self.mechanism_lines(&mut s);
        self.event_lines(&mut s);
        let _ = writeln!(s, "{}", self.not_delivered_line());
        s
    }

    /// The first line: uptime, the peer, the epochs, what was delivered and lost.
    fn summary_line(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "uptime {:.1}s  peer {}  tx epoch {}{}  rx epoch {}{}  delivered {} pkts {} B ({}bit/s)  lost {}  ooo {}  auth-fail {}  replays {}{}",
            self.uptime_s,
            if !self.peer_seen {
                "never heard".to_string()
            } else if self.peer_closed {
                format!("closed the session {:.2}s ago", self.peer_last_heard_s)
            } else if self.idle {
                format!(
                    "heard {:.2}s ago (idle: hellos at the idle heartbeat)",
                    self.peer_last_heard_s
                )
            } else {
                format!("heard {:.2}s ago", self.peer_last_heard_s)
            },
            self.tx_epoch,
            if self.switching { " (switching)" } else { "" },
            self.rx_epoch,
            // A wait of a few ms is the channels' skew in steady flow: only a longer
            // one is news.
            if self.rx_waiting_channel >= 0 && self.rx_waiting_s >= 0.05 {
                format!(
                    " (waiting {:.0} ms for channel {})",
                    self.rx_waiting_s * 1e3,
                    self.rx_waiting_channel
                )
            } else {
                String::new()
            },
            self.delivered_packets,
            self.delivered_bytes,
            si(self.delivered_bps),
            self.lost,
            self.out_of_order,
            self.auth_failures,
            self.replays,
            self.cipher
                .as_ref()
                .map_or(String::new(), |c| format!("  cipher {c}")),
        );
    }

    /// The channels' header and one row per channel.
    fn channel_rows(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "{:<3} {:<8} {:<5} {:>8} {:<4} {:<5} {:<7} {:>7} {:>10} {:>10} {:>9} {:>9} {:>9} {:>7} {:>7} {:>6} {:>7} {:>7} {:>7} {:>7} {:>6} {:>6} {:>6}",
            "ch", "name", "state", "since", "peer", "sets", "role", "weight", "tx pkts", "rx pkts", "tx bit/s", "rx bit/s",
            "dlv bit/s", "rtt ms", "min ms", "loss%", "queue ms", "mk tx", "mk rx", "resync", "auth", "replay", "tx err"
        );
        for c in &self.channels {
            let sets = format!(
                "{}{}",
                if c.in_tx_set { "T" } else { "-" },
                if c.in_rx_set { "R" } else { "-" }
            );
            let _ = writeln!(
                s,
                "{:<3} {:<8} {:<5} {:>7.1}s {:<4} {:<5} {:<7} {:>7} {:>10} {:>10} {:>9} {:>9} {:>9} {:>7} {:>7} {:>6} {:>7} {:>7} {:>7} {:>7} {:>6} {:>6} {:>6}",
                c.index,
                c.name,
                c.state,
                c.state_since_s,
                if c.peer_hears_us { "up" } else { "down" },
                sets,
                c.role,
                c.weight,
                c.tx_data_packets,
                c.rx_data_packets,
                si(c.tx_bps),
                si(c.rx_bps),
                if c.delivery_bps < 0.0 { "-".to_string() } else { si(c.delivery_bps) },
                known(c.srtt_ms, 1.0, 1),
                known(c.rtt_min_ms, 1.0, 1),
                known(c.loss_ratio, 100.0, 2),
                known(c.queue_delay_ms, 1.0, 1),
                c.tx_markers + c.tx_triggers,
                c.rx_markers + c.rx_triggers,
                c.resyncs,
                c.auth_failures,
                c.replays,
                c.tx_errors,
            );
        }
    }

    /// Pacing and probes, credits and in-bond repair, each when in use.
    fn mechanism_lines(&self, s: &mut String) {
        self.pacing_lines(s);
        self.pmtu_line(s);
        self.credit_line(s);
        self.repair_line(s);
    }

    /// Path MTU discovery, when it runs: the bond's MTU and each channel's largest
    /// datagram (its PLPMTU) with the probes sent and lost.
    fn pmtu_line(&self, s: &mut String) {
        if self.channels.iter().all(|c| c.plpmtu < 0.0) {
            return;
        }
        let per: Vec<String> = self
            .channels
            .iter()
            .map(|c| {
                format!(
                    "{}={} ({}/{})",
                    c.name,
                    known(c.plpmtu, 1.0, 0),
                    c.pmtu_probes_sent,
                    c.pmtu_probes_lost
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "path mtu: bond {}  datagram bytes (probes sent/lost) {}",
            self.bond_mtu,
            per.join(" ")
        );
    }

    /// Pacing and capacity probes, one line per channel, when any is paced or
    /// measured: what the probe found (or why it failed) and the pace now.
    fn pacing_lines(&self, s: &mut String) {
        if self
            .channels
            .iter()
            .any(|c| c.pace_bps > 0.0 || !matches!(c.probe.as_str(), "" | "off"))
        {
            for c in &self.channels {
                let detail = if c.probe_detail.is_empty() {
                    // A snapshot from a braid before the probe's words.
                    match (c.pace_bps > 0.0, c.measured_bps > 0.0) {
                        (true, true) => format!(
                            "paced at {}bit/s (measured {}bit/s)",
                            si(c.pace_bps),
                            si(c.measured_bps)
                        ),
                        (true, false) => format!("paced at {}bit/s", si(c.pace_bps)),
                        (false, _) => "unpaced".into(),
                    }
                } else {
                    c.probe_detail.clone()
                };
                let _ = writeln!(s, "pacing {} ({}): {detail}", c.index, c.name);
            }
        }
    }

    /// Credits, when the session lends them: each channel's balance and the totals.
    fn credit_line(&self, s: &mut String) {
        if self.channels.iter().any(|c| c.credit_balance >= 0.0) {
            let balances: Vec<String> = self
                .channels
                .iter()
                .map(|c| format!("{}={}", c.name, known(c.credit_balance, 1.0, 0)))
                .collect();
            let _ = writeln!(
                s,
                "credits: balance {}  stalls {}  sent {}  refused {}  queued {:.0}  overflow {}",
                balances.join(" "),
                self.credit_stalls,
                self.credits_sent,
                self.credit_refused,
                self.tx_queued,
                self.channels.iter().map(|c| c.overflow_drops).sum::<u64>(),
            );
        }
    }

    /// In-bond repair, once it had something to do: per channel and in total.
    fn repair_line(&self, s: &mut String) {
        if self
            .channels
            .iter()
            .any(|c| c.arq_missing + c.arq_resent + c.arq_rejected > 0)
        {
            let per: Vec<String> = self
                .channels
                .iter()
                .map(|c| {
                    format!(
                        "{}={}/{}/{}",
                        c.name, c.arq_missing, c.arq_repaired, c.arq_given_up
                    )
                })
                .collect();
            let _ = writeln!(
                s,
                "repair: missing/repaired/given up {}  resent {}  premature {}  expired {}  rejected {}",
                per.join(" "),
                self.channels.iter().map(|c| c.arq_resent).sum::<u64>(),
                self.channels.iter().map(|c| c.arq_premature).sum::<u64>(),
                self.channels.iter().map(|c| c.arq_expired).sum::<u64>(),
                self.channels.iter().map(|c| c.arq_rejected).sum::<u64>(),
            );
        }
    }

    /// Moved endpoints, handshake defence and failures, the return path, once they happened.
    fn event_lines(&self, s: &mut String) {
        // Where the peer is on each channel, once one moved (a NAT's new mapping,
        // roaming).
        if self.channels.iter().any(|c| c.endpoint_changes > 0) {
            let per: Vec<String> = self
                .channels
                .iter()
                .map(|c| format!("{}={} (moved {})", c.name, c.remote, c.endpoint_changes))
                .collect();
            let _ = writeln!(s, "peer endpoints: {}", per.join("  "));
        }
        let defence = [
            self.handshake_mac1_failures,
            self.cookie_replies_sent,
            self.cookie_replies_received,
            self.handshakes_rate_limited,
            self.handshakes_shed,
            self.handshake_replays,
        ];
        if defence.iter().any(|&n| n > 0) {
            let _ = writeln!(
                s,
                "handshake defence: mac1 failures {}  cookie replies sent {} received {}  rate-limited {}  shed {}  replays {}",
                defence[0], defence[1], defence[2], defence[3], defence[4], defence[5]
            );
        }
        if self.handshake_failures + self.settings_mismatches > 0 {
            let per: Vec<String> = self
                .channels
                .iter()
                .map(|c| format!("{}={}", c.name, c.handshake_failures))
                .collect();
            let _ = writeln!(
                s,
                "handshakes: completed {}  failed {} ({})  settings mismatches {}{}",
                self.handshakes,
                self.handshake_failures,
                per.join(" "),
                self.settings_mismatches,
                if self.peer_seen {
                    ""
                } else {
                    "  (peer never heard: the log says why)"
                },
            );
        }
        if self.return_path_cuts > 0 {
            let _ = writeln!(
                s,
                "return path: {} (cut to one channel {} times)",
                match self.channels.iter().find(|c| c.return_path) {
                    Some(c) => format!("channel {} ({}) alone", c.index, c.name),
                    None => "every channel".into(),
                },
                self.return_path_cuts
            );
        }
    }

    /// A server's table: its counters, then each peer and its session's table.
    fn server_table(&self, srv: &ServerCounters) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "server up {:.1}s on {}: {} peers, {} connected",
            self.uptime_s,
            srv.listen.join(", "),
            srv.peers,
            srv.peers_connected
        );
        let _ = writeln!(
            s,
            "dropped: unknown peer {}  unreadable initiation {}  bad mac1 {}  shed {}  unknown key index {}  implausible {}  unroutable {}  no route {}  source not allowed {}  not IP {}",
            srv.unknown_peer,
            srv.unreadable_initiations,
            srv.initiation_mac1_failures,
            srv.initiations_shed,
            srv.unknown_index,
            srv.implausible,
            srv.unroutable,
            srv.no_route,
            srv.source_not_allowed,
            srv.not_ip
        );
        let _ = writeln!(
            s,
            "handshake load: copies {}  cookie replies {}  stale cookies {}  rate-limited {}  oversized {}",
            srv.initiation_copies,
            srv.cookie_replies,
            srv.stale_cookies,
            srv.initiations_rate_limited,
            srv.oversized
        );
        if srv.peers_added + srv.peers_removed > 0 {
            let _ = writeln!(
                s,
                "reloads: {} peers added, {} removed",
                srv.peers_added, srv.peers_removed
            );
        }
        for p in &self.peers {
            p.section(&mut s);
        }
        s
    }

    /// One line for the periodic log.
    pub fn log_line(&self) -> String {
        if let Some(srv) = &self.server {
            let mut s = format!(
                "{} peers, {} connected; dropped: unknown peer {}, source not allowed {}, no route {}",
                srv.peers,
                srv.peers_connected,
                srv.unknown_peer,
                srv.source_not_allowed,
                srv.no_route
            );
            for p in self.peers.iter().filter(|p| p.session.is_some()) {
                let d = p.session.as_ref().map_or(0.0, |x| x.delivered_bps);
                let _ = write!(s, "; {}: {}bit/s to TUN", p.name, si(d));
            }
            return s;
        }
        let mut s = format!(
            "epoch tx {} rx {}; delivered {} pkts ({}bit/s); lost {}; auth-fail {}; channels:",
            self.tx_epoch,
            self.rx_epoch,
            self.delivered_packets,
            si(self.delivered_bps),
            self.lost,
            self.auth_failures
        );
        for c in &self.channels {
            let _ = write!(
                s,
                " {}={} tx {}bit/s rx {}bit/s resync {};",
                c.name,
                if c.state == "up" {
                    c.role.as_str()
                } else {
                    c.state.as_str()
                },
                si(c.tx_bps),
                si(c.rx_bps),
                c.resyncs
            );
        }
        s
    }

    /// The Prometheus text format, built with the `prometheus-client` crate from the
    /// serialized snapshot, so every numeric field is exported: session fields as
    /// `braid_NAME`, per-channel fields as `braid_channel_NAME{channel="I",name="NAME"}`,
    /// each named, described and converted to base units by [`metric_of`] (counters
    /// with `_total`, times in `_seconds`, rates in `_bytes_per_second`); plus
    /// `braid_channel_up` (1 while the channel's state is `up`),
    /// `braid_channel_probe_state{state=...}` (1 for the capacity probe's state) and
    /// `braid_build_info{version,git_commit,profile}` (always 1). See `docs/tunnel.md`.
    pub fn prometheus(&self) -> String {
        if let Some(srv) = &self.server {
            return self.server_prometheus(srv);
        }
        let mut reg = Registry::with_prefix("braid");
        register_build_info(&mut reg);
        for (k, v) in &json_object(self) {
            let Some(x) = metric_value(v) else { continue };
            let m = metric_of(k, false);
            if m.gauge {
                let g = Gauge::<f64, AtomicU64>::default();
                g.set(m.convert(x));
                reg.register(m.name, m.help, g);
            } else {
                let c = Counter::<u64>::default();
                c.inc_by(x as u64);
                reg.register(m.name, m.help, c);
            }
        }
        let labels = |c: &ChannelSnapshot| -> Labels {
            vec![
                ("channel".into(), c.index.to_string()),
                ("name".into(), c.name.clone()),
            ]
        };
        register_channel_up(
            &mut reg,
            self.channels.iter().map(|c| (labels(c), c.state == "up")),
        );
        let probe = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        for c in &self.channels {
            for state in PROBE_STATES {
                let mut l = labels(c);
                l.push(("state".into(), state.into()));
                probe
                    .get_or_create(&l)
                    .set(f64::from(u8::from(c.probe == state)));
            }
        }
        reg.register(
            "channel_probe_state",
            "The channel's capacity probe (pace = auto): 1 for its state (off, measuring, measured, capped: paced at its lower configured pace, failed: stays as configured), 0 for the others",
            probe,
        );
        let rows: Vec<Row> = self
            .channels
            .iter()
            .map(|c| (labels(c), json_object(c)))
            .collect();
        register_fields(&mut reg, &rows, true);
        render(&reg)
    }
}

impl SessionStats {
    /// A server's metrics: `braid_server_NAME` (its counters), `braid_peer_NAME{peer}`
    /// (each peer's server-side counters, `braid_peer_connected`), and each connected
    /// peer's session metrics under the point-to-point names with a `peer` label
    /// (`braid_delivered_packets_total{peer="site-a"}`,
    /// `braid_channel_up{peer,channel,name}`).
    fn server_prometheus(&self, srv: &ServerCounters) -> String {
        let mut reg = Registry::with_prefix("braid");
        register_server_counters(&mut reg, srv);
        let peer = |p: &PeerStats| -> Labels { vec![("peer".into(), p.name.clone())] };
        let connected = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        for p in &self.peers {
            connected
                .get_or_create(&peer(p))
                .set(f64::from(u8::from(p.connected)));
        }
        reg.register(
            "peer_connected",
            "1 once the peer's session runs (it sent a handshake that read), else 0",
            connected,
        );
        for (k, help) in PEER_HELP {
            let fam = Family::<Labels, Counter<u64>>::default();
            for p in &self.peers {
                let v = json_object(p);
                fam.get_or_create(&peer(p))
                    .inc_by(v.get(*k).and_then(metric_value).unwrap_or(0.0) as u64);
            }
            reg.register(format!("peer_{k}"), *help, fam);
        }
        // Each connected peer's session, as a point-to-point tunnel's, with its label.
        let sessions: Vec<Row> = self
            .peers
            .iter()
            .filter_map(|p| Some((peer(p), json_object(p.session.as_ref()?))))
            .collect();
        register_fields(&mut reg, &sessions, false);
        let chans: Vec<(Row, bool)> = self
            .peers
            .iter()
            .flat_map(|p| {
                p.session.iter().flat_map(move |s| {
                    s.channels.iter().map(move |c| {
                        let mut l = peer(p);
                        l.push(("channel".into(), c.index.to_string()));
                        l.push(("name".into(), c.name.clone()));
                        ((l, json_object(c)), c.state == "up")
                    })
                })
            })
            .collect();
        register_channel_up(&mut reg, chans.iter().map(|((l, _), up)| (l.clone(), *up)));
        let rows: Vec<Row> = chans.into_iter().map(|(r, _)| r).collect();
        register_fields(&mut reg, &rows, true);
        render(&reg)
    }
}

impl PeerStats {
    /// This peer's part of a server's table: who it is, its server-side counters,
    /// then its session's table, indented.
    fn section(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\npeer {}  key {}  allowed {}",
            self.name,
            self.public_key,
            if self.allowed_ips.is_empty() {
                "(none)".to_string()
            } else {
                self.allowed_ips.join(", ")
            }
        );
        let _ = writeln!(
            s,
            "  {}  to TUN {}  source not allowed {}  before it connected {}  queue full {}",
            if self.connected {
                "connected"
            } else {
                "never connected"
            },
            self.to_tun,
            self.source_not_allowed,
            self.not_connected,
            self.tx_queue_drops
        );
        if let Some(session) = &self.session {
            for line in session.table().lines() {
                let _ = writeln!(s, "  {line}");
            }
        }
    }
}

/// A metric's labels, as `prometheus-client` takes them.
type Labels = Vec<(String, String)>;
/// One labelled series' source: its labels and the serialized snapshot it reads.
type Row = (Labels, serde_json::Map<String, serde_json::Value>);

/// A snapshot's fields by name (empty if it does not serialize to an object).
fn json_object<T: Serialize + ?Sized>(v: &T) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    }
}

/// `braid_build_info{version,git_commit,profile}`, always 1.
fn register_build_info(reg: &mut Registry) {
    let info = Family::<Labels, Gauge<f64, AtomicU64>>::default();
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    info.get_or_create(&vec![
        ("version".into(), env!("CARGO_PKG_VERSION").into()),
        (
            "git_commit".into(),
            option_env!("BRAID_GIT_COMMIT").unwrap_or("unknown").into(),
        ),
        ("profile".into(), profile.into()),
    ])
    .set(1.0);
    reg.register(
        "build_info",
        "The braid build serving these metrics (value 1): its version, git commit and build profile",
        info,
    );
}

/// A server's own counters as `braid_server_NAME` (the peer counts as gauges).
fn register_server_counters(reg: &mut Registry, srv: &ServerCounters) {
    for (k, v) in json_object(srv) {
        let Some(x) = metric_value(&v) else { continue };
        let help = SERVER_HELP
            .iter()
            .find(|(f, _)| *f == k)
            .map_or("server counter", |(_, h)| h);
        if k == "peers" || k == "peers_connected" {
            let g = Gauge::<f64, AtomicU64>::default();
            g.set(x);
            reg.register(format!("server_{k}"), help, g);
        } else {
            let c = Counter::<u64>::default();
            c.inc_by(x as u64);
            reg.register(format!("server_{k}"), help, c);
        }
    }
}

/// `braid_channel_up`: 1 for each (labels, up) whose channel is up, else 0.
fn register_channel_up(reg: &mut Registry, channels: impl Iterator<Item = (Labels, bool)>) {
    let up = Family::<Labels, Gauge<f64, AtomicU64>>::default();
    for (l, is_up) in channels {
        up.get_or_create(&l).set(f64::from(u8::from(is_up)));
    }
    reg.register(
        "channel_up",
        "1 while the peer is heard on the channel (state up), else 0",
        up,
    );
}

/// Every numeric field of the rows' snapshots (the first row's names) as one
/// family with a series per row: `braid_NAME`, or `braid_channel_NAME` for channel
/// snapshots (whose `index` is a label, not a metric); a gauge in base units or a
/// counter, as [`metric_of`] says.
fn register_fields(reg: &mut Registry, rows: &[Row], channel: bool) {
    let Some((_, first)) = rows.first() else {
        return;
    };
    for (k, v) in first {
        if (channel && k == "index") || metric_value(v).is_none() {
            continue;
        }
        let m = metric_of(k, channel);
        let name = if channel {
            format!("channel_{}", m.name)
        } else {
            m.name.clone()
        };
        let value = |j: &serde_json::Map<String, serde_json::Value>| {
            j.get(k).and_then(metric_value).unwrap_or(0.0)
        };
        if m.gauge {
            let fam = Family::<Labels, Gauge<f64, AtomicU64>>::default();
            for (l, j) in rows {
                fam.get_or_create(l).set(m.convert(value(j)));
            }
            reg.register(name, m.help, fam);
        } else {
            let fam = Family::<Labels, Counter<u64>>::default();
            for (l, j) in rows {
                fam.get_or_create(l).inc_by(value(j) as u64);
            }
            reg.register(name, m.help, fam);
        }
    }
}

/// What each server counter means (`braid_server_NAME`).
const SERVER_HELP: &[(&str, &str)] = &[
    ("peers", "Peers configured ([[peer]] sections)"),
    ("peers_connected", "Peers whose session runs"),
    (
        "unknown_peer",
        "Handshake initiations from a static key no [[peer]] has, dropped",
    ),
    (
        "unreadable_initiations",
        "Handshake initiations with our mac1 that did not read with our key, dropped",
    ),
    (
        "initiation_mac1_failures",
        "Handshake initiations whose mac1 is not ours, dropped before any public-key work",
    ),
    (
        "initiations_shed",
        "Handshake initiations not read because the handshake thread was busy",
    ),
    (
        "unknown_index",
        "Sealed datagrams or handshake answers whose key index is no running peer's, dropped",
    ),
    (
        "initiation_copies",
        "Copies and replays of initiations already read, passed on without public-key work",
    ),
    (
        "cookie_replies",
        "Cookie replies sent under load to initiations without a valid mac2, not read",
    ),
    (
        "stale_cookies",
        "Initiations under load whose mac2 was over a stale cookie (old secret or address)",
    ),
    (
        "initiations_rate_limited",
        "Initiations dropped by their source's rate or the cookie replies' rate",
    ),
    (
        "oversized",
        "Datagrams larger than the channels carry, dropped",
    ),
    (
        "implausible",
        "Sealed datagrams for a running peer that no key of its session could accept, dropped unqueued",
    ),
    (
        "unroutable",
        "Datagrams neither sealed nor a handshake message, dropped",
    ),
    (
        "no_route",
        "Packets from the TUN device whose destination is in no peer's allowed IPs, dropped",
    ),
    (
        "source_not_allowed",
        "Packets from a peer whose source is outside its allowed IPs, dropped",
    ),
    ("not_ip", "Packets that are not IPv4 or IPv6, dropped"),
    ("peers_added", "Peers added by reloads"),
    ("peers_removed", "Peers removed by reloads"),
];

/// What each peer's server-side counter means (`braid_peer_NAME_total{peer}`).
const PEER_HELP: &[(&str, &str)] = &[
    (
        "source_not_allowed",
        "Packets from the peer whose source is outside its allowed IPs, dropped",
    ),
    (
        "not_connected",
        "Packets from the TUN device for the peer before it connected, dropped",
    ),
    (
        "tx_queue_drops",
        "Packets from the TUN device for the peer that its session's queue had no room for",
    ),
    ("to_tun", "Packets from the peer written to the TUN device"),
];

/// The values of `ChannelSnapshot::probe`, as `braid_channel_probe_state` labels.
const PROBE_STATES: [&str; 5] = ["off", "measuring", "measured", "capped", "failed"];

/// How one snapshot field is exported.
struct Metric {
    /// Its name after `braid_` (or `braid_channel_`); counters get `_total` on export.
    name: String,
    /// What it means, with its unit.
    help: String,
    /// A gauge (else a counter).
    gauge: bool,
    /// What the field's value is multiplied by (to base units); -1 ("not known")
    /// stays -1.
    scale: f64,
}

impl Metric {
    fn convert(&self, x: f64) -> f64 {
        if x < 0.0 {
            x
        } else {
            x * self.scale
        }
    }
}

/// Counters: (field, what it counts), per session (`channel` false) or per channel.
const COUNTERS: &[(bool, &str, &str)] = &[
    (false, "tx_epoch_changes", "Transmit epoch switches completed (the transmit channel set changed)"),
    (false, "rx_epoch_changes", "Receive epoch switches completed"),
    (false, "sent_packets", "Packets accepted from the application for the peer"),
    (false, "sent_bytes", "Bytes of the packets accepted from the application"),
    (false, "delivered_packets", "Packets delivered to the application"),
    (false, "delivered_bytes", "Bytes of the packets delivered to the application"),
    (false, "out_of_order", "Packets delivered out of order (seq mode only)"),
    (false, "lost", "Packets the receiver declared lost, and those left undeliverable at an epoch switch"),
    (false, "naks_sent", "Sequence numbers asked of the peer again (seq mode NAK repair)"),
    (false, "repaired", "Missing packets delivered thanks to a repair"),
    (false, "queue_drops", "Packets dropped because the transmit queue was full"),
    (false, "deliver_drops", "Packets dropped because the application did not read fast enough"),
    (false, "stray_drops", "Data packets that arrived on a channel outside the receive set"),
    (false, "auth_failures", "Sealed datagrams whose tag did not verify, all channels (forged, corrupted, wrong key)"),
    (false, "unauthenticated", "Datagrams dropped for not being sealed where required, or sealed with unknown keys, all channels"),
    (false, "replays", "Sealed datagrams replayed, reordered too far or reflected, all channels"),
    (false, "handshakes", "Handshakes completed (the first, re-keys, after peer restarts)"),
    (false, "handshake_failures", "Handshake messages that failed (wrong key, corrupted, stray responses)"),
    (false, "settings_mismatches", "Handshakes refused because the peer's settings (mode, scheduler, weights, security, credits) differ from ours"),
    (false, "handshake_mac1_failures", "Handshake messages dropped for a wrong mac1, before any public-key work"),
    (false, "cookie_replies_sent", "Cookie replies sent: we were under handshake load"),
    (false, "cookie_replies_received", "Cookie replies received: the peer was under handshake load"),
    (false, "handshakes_rate_limited", "Initiations refused by the per-channel limit on public-key work"),
    (false, "handshakes_shed", "Handshake jobs shed: the handshake worker's queue was full"),
    (false, "handshake_replays", "Initiations not answered: copies of one already processed, or timestamps not newer than the last accepted"),
    (false, "malformed", "Datagrams that could not be parsed, all channels"),
    (false, "resyncs", "Receiver resynchronizations on markers or triggers, all channels"),
    (false, "quanta_changes", "Times adaptive weights changed the SRR quanta"),
    (false, "arq_missing", "In-bond repair: sealed datagrams found missing, all channels"),
    (false, "arq_repaired", "In-bond repair: missing datagrams filled by a repair, all channels"),
    (false, "aqm_ce_marks", "AQM: packets delivered with an ECN CE mark"),
    (false, "aqm_drops", "AQM: packets dropped as a congestion signal (not ECN-capable)"),
    (false, "aqm_spared", "AQM: congestion signals not given because the packet was small and not ECN-capable"),
    (false, "aqm_loss_signals", "AQM: losses taken as congestion (their channel's queue stood above target)"),
    (false, "pacing_waits", "Pacing: times a packet waited for a channel's tokens"),
    (false, "pacing_ce_marks", "Pacing: packets marked CE for their wait in the transmit queue (CoDel)"),
    (false, "pacing_drops", "Pacing: packets dropped for their wait in the transmit queue (not ECN-capable)"),
    (false, "probe_trains", "Capacity probes: trains sent to measure our channels"),
    (false, "probe_reports", "Capacity probes: reports of our trains received from the peer"),
    (false, "return_path_cuts", "Times the return path was cut to one channel"),
    (false, "flows_tx_redundant", "Real-time flows: packets sent redundantly"),
    (false, "flows_tx_lowest_delay", "Real-time flows: packets sent on the lowest-delay channel"),
    (false, "flows_tx_acks", "Real-time flows: TCP pure acknowledgements sent on the lowest-delay channel"),
    (false, "flows_tx_fallback", "Real-time flows: packets bonded instead (too large for a flow datagram, no keys yet)"),
    (false, "flows_rx_delivered", "Real-time flows: packets delivered (the first copy)"),
    (false, "flows_rx_duplicates", "Real-time flows: copies dropped as duplicates"),
    (false, "flows_rx_held", "Real-time flows: TCP segments held in their flow's order for one they overtook"),
    (false, "flows_rx_gaps", "Real-time flows: TCP segments given up (missing when the wait for them ran out)"),
    (false, "flows_rx_early", "Per-flow order: TCP segments of the stripe delivered ahead of its order, each continuing its own flow"),
    (false, "streams_open", "TCP streams: connections open now"),
    (false, "streams_opened", "TCP streams: connections taken at this end and opened as streams"),
    (false, "streams_connected", "TCP streams: connections made at this end for the peer's streams"),
    (false, "streams_refused", "TCP streams: connections refused (by the destination, or not allowed)"),
    (false, "streams_reset", "TCP streams: connections reset after they were made"),
    (false, "streams_tx_bytes", "TCP streams: bytes of our connections sent as stream data"),
    (false, "streams_rx_bytes", "TCP streams: bytes of the peer's streams written to our connections"),
    (false, "streams_retransmitted_bytes", "TCP streams: stream data sent again"),
    (false, "streams_tx_control", "TCP streams: control frames (all but data) sent on the lowest-delay channel"),
    (false, "streams_tx_fast", "TCP streams: data frames of streams that send little, sent on the lowest-delay channel"),
    (false, "streams_rx_control", "TCP streams: frames received on the lowest-delay channel (control, and the fast lane's data)"),
    (false, "credit_stalls", "Credits: times a channel ran out of credit and the striper waited"),
    (false, "credits_sent", "Credits: credits sent to the peer"),
    (false, "credit_refused", "Credits: data refused because the peer was past its credit"),
    (true, "pmtu_probes_sent", "Path MTU discovery: MTU probes sent on the channel"),
    (true, "pmtu_probes_lost", "Path MTU discovery: MTU probes the peer did not acknowledge in time (too big for the path, or lost)"),
    (true, "state_changes", "Times the channel's state (wait, up, down) changed"),
    (true, "endpoint_changes", "Times the peer's address on the channel moved (an authenticated datagram from a new address: a NAT's new mapping, roaming)"),
    (true, "handshake_failures", "Handshake messages that failed on the channel: the peer's initiations we refused, rejections of ours, unauthenticated or stale responses"),
    (true, "tx_datagrams", "Datagrams sent on the channel (data and control)"),
    (true, "tx_bytes", "Bytes sent on the channel (UDP payload)"),
    (true, "tx_data_packets", "Data packets sent on the channel (repairs included)"),
    (true, "tx_markers", "Markers sent on the channel"),
    (true, "tx_triggers", "Triggers sent on the channel"),
    (true, "tx_errors", "Datagrams the channel's socket refused to send (e.g. unreachable, no route)"),
    (true, "tx_discarded", "Datagrams made for the channel and not sent: its uplink was gone, or no address of the peer was known on it"),
    (true, "rx_queue_drops", "Datagrams dropped on arrival: the channel's share of the receive queue was full"),
    (true, "rx_oversize", "Datagrams dropped on arrival: larger than any channel carries"),
    (true, "rx_implausible", "Sealed datagrams dropped on arrival: no key of the session could accept them (unknown key index, or a counter outside its windows)"),
    (true, "rx_datagrams", "Datagrams received on the channel"),
    (true, "rx_bytes", "Bytes received on the channel (UDP payload)"),
    (true, "rx_data_packets", "Data packets received on the channel"),
    (true, "rx_markers", "Markers received and authenticated on the channel"),
    (true, "rx_triggers", "Triggers received and authenticated on the channel"),
    (true, "rx_hellos", "Hellos received and authenticated on the channel"),
    (true, "rx_feedback", "Feedback reports received from the peer on the channel"),
    (true, "resyncs", "Markers or triggers on the channel that changed the receiver's state"),
    (true, "wait_timeouts", "Times the receiver gave up waiting for the channel"),
    (true, "overflow_drops", "Arrivals on the channel dropped because its receive buffer was full"),
    (true, "auth_failures", "Sealed datagrams on the channel whose tag did not verify"),
    (true, "unauthenticated", "Datagrams on the channel dropped for not being sealed, or sealed with unknown keys"),
    (true, "replays", "Sealed datagrams on the channel replayed, reordered too far or reflected"),
    (true, "malformed", "Datagrams on the channel that could not be parsed"),
    (true, "demotions", "Times the channel was demoted for being a net cost"),
    (true, "arq_missing", "In-bond repair: the channel's datagrams found missing"),
    (true, "arq_repaired", "In-bond repair: of those, filled by a repair"),
    (true, "arq_given_up", "In-bond repair: of those, given up after the wait"),
    (true, "arq_resent", "In-bond repair: the channel's datagrams sent again at the peer's request"),
    (true, "arq_premature", "In-bond repair: requests not answered because the last copy was less than a round trip old"),
    (true, "arq_expired", "In-bond repair: requests for datagrams no longer kept"),
    (true, "arq_rejected", "In-bond repair: requests for datagrams never sent (a broken or hostile peer)"),
    (true, "pace_cuts_on_loss", "Adaptive pacing: cuts of the channel's pace on loss alone (no standing queue; no capacity learnt)"),
    (true, "pace_cuts_on_queue", "Adaptive pacing: cuts of the channel's pace on a standing queue (its link full)"),
    (true, "pace_jitter", "Adaptive pacing: cuts that turned out to be the link's jitter (the rate went back)"),
];

/// Gauges: (per channel, field, name, what it is with its unit, scale to base units).
const GAUGES: &[(bool, &str, &str, &str, f64)] = &[
    (false, "uptime_s", "uptime_seconds", "Seconds since the session started", 1.0),
    (false, "peer_seen", "peer_seen", "1 once an authenticated packet from the peer has arrived", 1.0),
    (false, "peer_closed", "peer_closed", "1 while the peer has closed the session on purpose (until a new run of it is heard)", 1.0),
    (false, "idle", "idle", "1 while no data has flowed either way for idle_after (hellos at the idle heartbeat)", 1.0),
    (false, "peer_last_heard_s", "peer_last_heard_seconds", "Seconds since the last authenticated packet from the peer (-1: never)", 1.0),
    (false, "tx_epoch", "tx_epoch", "The transmit epoch in force (a number; it changes with the transmit channel set)", 1.0),
    (false, "rx_epoch", "rx_epoch", "The receive epoch in force (a number)", 1.0),
    (false, "switching", "switching", "1 while a transmit epoch switch waits for the peer's acknowledgement", 1.0),
    (false, "delivered_bps", "delivered_bytes_per_second", "Delivery rate to the application over the last second, bytes per second", 0.125),
    (false, "return_path_channel", "return_path_channel", "The channel the return path rides alone (-1: every channel)", 1.0),
    (false, "rx_waiting_channel", "rx_waiting_channel", "The channel whose next packet the receiver waits for while later data is held (-1: none)", 1.0),
    (false, "rx_waiting_s", "rx_waiting_seconds", "How long the receiver has waited for that channel's next packet, seconds (0: no wait)", 1.0),
    (false, "bond_mtu", "bond_mtu_bytes", "The largest inner packet the bond carries now, bytes (the TUN device's MTU; path MTU discovery follows the smallest channel)", 1.0),
    (false, "tx_queued", "tx_queued_packets", "Packets waiting in the transmit queue (for pacing, credit or an epoch switch)", 1.0),
    (true, "state_since_s", "state_since_seconds", "Seconds since the channel's state last changed", 1.0),
    (true, "peer_hears_us", "peer_hears_us", "1 while the peer reports hearing us on the channel", 1.0),
    (true, "in_tx_set", "in_tx_set", "1 while the channel is in our transmit set", 1.0),
    (true, "in_rx_set", "in_rx_set", "1 while the channel is in our receive set", 1.0),
    (true, "tx_bps", "tx_bytes_per_second", "Send rate on the channel over the last second, bytes per second (UDP payload)", 0.125),
    (true, "rx_bps", "rx_bytes_per_second", "Receive rate on the channel over the last second, bytes per second (UDP payload)", 0.125),
    (true, "srtt_ms", "srtt_seconds", "Smoothed round-trip time from the peer's feedback, seconds (-1: not known yet)", 1e-3),
    (true, "rtt_min_ms", "rtt_min_seconds", "Smallest recent round-trip time, seconds (-1: not known yet)", 1e-3),
    (true, "delivery_bps", "delivery_bytes_per_second", "Rate at which the peer receives on the channel, from its feedback, bytes per second (-1: not known yet)", 0.125),
    (true, "loss_ratio", "loss_ratio", "Share of our datagrams the peer found missing on the channel, recent reports, 0 to 1 (-1: not known yet)", 1.0),
    (true, "quantum", "quantum_bytes", "The channel's SRR quantum, bytes (adapted, or as configured)", 1.0),
    (true, "weight", "weight_bytes", "The channel's weight in the stripe now: its quantum in bytes while in the transmit set, else 0", 1.0),
    (true, "demoted", "demoted", "1 while the channel is demoted or probing (out of the transmit set for being a net cost)", 1.0),
    (true, "probing", "probing", "1 while the demoted channel probes healthy", 1.0),
    (true, "return_path", "return_path", "1 while the channel carries our return path alone", 1.0),
    (true, "role_since_s", "role_since_seconds", "Seconds since the channel's role (active, demoted, probing) last changed", 1.0),
    (true, "window_loss_ratio", "window_loss_ratio", "Loss over the demotion window, 0 to 1 (-1: not measured)", 1.0),
    (true, "queue_delay_ms", "queue_delay_seconds", "Queueing delay the AQM measures on the channel, seconds (-1: AQM off or no recent sample)", 1e-3),
    (true, "credit_balance", "credit_balance_packets", "Packets our data may still put into the peer's buffer for the channel (-1: credits off)", 1.0),
    (true, "pace_bps", "pace_bytes_per_second", "The rate the channel is paced at, bytes per second on the wire (-1: not paced)", 0.125),
    (true, "plpmtu", "plpmtu_bytes", "Path MTU discovery: the largest datagram the channel carries now, bytes of UDP payload (-1: discovery off)", 1.0),
    (true, "measured_bps", "measured_bytes_per_second", "The channel's rate as its capacity probe measured it, bytes per second on the wire (-1: not measured)", 0.125),
    (true, "pace_capacity_bps", "pace_capacity_bytes_per_second", "Adaptive pacing: the capacity the channel's last cut on a queue showed, bytes per second on the wire (-1: none)", 0.125),
    (true, "pace_floor_ms", "pace_floor_seconds", "Adaptive pacing: the one-way delay above its minimum taken for the link's jitter, seconds (-1: not paced adaptively)", 1e-3),
];

/// How snapshot field `field` (of a channel, or of the session) is exported. A field
/// not listed (none should be: a test checks) keeps its own name and a generic help.
fn metric_of(field: &str, channel: bool) -> Metric {
    if let Some((_, _, help)) = COUNTERS
        .iter()
        .find(|(ch, f, _)| *ch == channel && *f == field)
    {
        return Metric {
            name: field.into(),
            help: (*help).into(),
            gauge: false,
            scale: 1.0,
        };
    }
    if let Some((_, _, name, help, scale)) = GAUGES
        .iter()
        .find(|(ch, f, ..)| *ch == channel && *f == field)
    {
        return Metric {
            name: (*name).into(),
            help: (*help).into(),
            gauge: true,
            scale: *scale,
        };
    }
    Metric {
        name: field.into(),
        help: format!(
            "{} field {field}",
            if channel { "channel" } else { "session" }
        ),
        gauge: field.ends_with("_ratio") || field.ends_with("_bps") || field.ends_with("_s"),
        scale: 1.0,
    }
}

/// A JSON value as a metric: numbers, and booleans as 0/1.
fn metric_value(v: &serde_json::Value) -> Option<f64> {
    match v {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::Bool(b) => Some(f64::from(u8::from(*b))),
        _ => None,
    }
}

/// The registry in the Prometheus text format.
fn render(reg: &Registry) -> String {
    let mut out = String::new();
    let _ = prometheus_client::encoding::text::encode(&mut out, reg);
    out
}

fn minus_one_f64() -> f64 {
    -1.0
}

fn minus_one() -> i64 {
    -1
}

/// `base` with the real-time flows' counters of the session machine's `f`.
pub fn with_flows(f: &braid_proto::session::FlowStats, base: SessionStats) -> SessionStats {
    SessionStats {
        flows_tx_redundant: f.tx_redundant,
        flows_tx_lowest_delay: f.tx_lowest_delay,
        flows_tx_acks: f.tx_acks,
        flows_tx_fallback: f.tx_fallback,
        flows_rx_delivered: f.rx_delivered,
        flows_rx_duplicates: f.rx_duplicates,
        flows_rx_held: f.rx_held,
        flows_rx_gaps: f.rx_gaps,
        flows_rx_early: f.rx_early,
        streams_tx_control: f.tx_stream_control,
        streams_tx_fast: f.tx_stream_fast,
        streams_rx_control: f.rx_stream_control,
        ..base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every numeric or boolean field, set to a distinct non-zero value through serde
    /// (so a new field is covered without editing this test).
    fn filled<T: Serialize + serde::de::DeserializeOwned>(v: &T, base: u64) -> T {
        let mut j = serde_json::to_value(v).unwrap();
        let mut k = base;
        if let serde_json::Value::Object(m) = &mut j {
            for (_, x) in m.iter_mut() {
                k += 1;
                match x {
                    serde_json::Value::Number(_) => *x = serde_json::json!(k),
                    serde_json::Value::Bool(_) => *x = serde_json::json!(true),
                    _ => {}
                }
            }
        }
        serde_json::from_value(j).unwrap()
    }

    #[test]
    fn a_servers_snapshot_shows_each_peer_and_what_was_dropped() {
        let mut c = filled(&ChannelSnapshot::default(), 1000);
        c.index = 0;
        c.name = "one".into();
        c.state = "up".into();
        let mut session = filled(&SessionStats::default(), 100);
        session.channels = vec![c];
        let s = SessionStats {
            uptime_s: 5.0,
            server: Some(ServerCounters {
                peers: 2,
                peers_connected: 1,
                unknown_peer: 3,
                no_route: 4,
                source_not_allowed: 2,
                listen: vec!["0.0.0.0:7100".into()],
                ..ServerCounters::default()
            }),
            peers: vec![
                PeerStats {
                    name: "site-a".into(),
                    public_key: "KEY-A".into(),
                    allowed_ips: vec!["10.90.1.0/24".into()],
                    connected: true,
                    source_not_allowed: 2,
                    to_tun: 7,
                    session: Some(session),
                    ..PeerStats::default()
                },
                PeerStats {
                    name: "site-b".into(),
                    public_key: "KEY-B".into(),
                    not_connected: 9,
                    ..PeerStats::default()
                },
            ],
            ..SessionStats::default()
        };
        let t = s.table();
        for want in [
            "2 peers, 1 connected",
            "unknown peer 3",
            "no route 4",
            "source not allowed 2",
            "peer site-a  key KEY-A  allowed 10.90.1.0/24",
            "peer site-b  key KEY-B  allowed (none)",
            "never connected",
            "before it connected 9",
        ] {
            assert!(t.contains(want), "{want:?} not in:\n{t}");
        }
        // The peer's own session table, indented under it.
        assert!(t.contains("\n  uptime "), "{t}");
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<SessionStats>(&json).unwrap(), s);
        let m = s.prometheus();
        for want in [
            "braid_server_unknown_peer_total 3\n",
            "braid_server_no_route_total 4\n",
            "braid_server_peers_connected 1",
            "braid_peer_connected{peer=\"site-b\"} 0",
            "braid_peer_source_not_allowed_total{peer=\"site-a\"} 2\n",
            "braid_peer_not_connected_total{peer=\"site-b\"} 9\n",
            "braid_delivered_packets_total{peer=\"site-a\"} ",
            "braid_channel_up{peer=\"site-a\",channel=\"0\",name=\"one\"} 1",
            "braid_channel_rx_datagrams_total{peer=\"site-a\",channel=\"0\",name=\"one\"} ",
        ] {
            assert!(m.contains(want), "{want:?} not in:\n{m}");
        }
        for line in m.lines().filter(|l| l.starts_with("# HELP braid_server")) {
            assert!(!line.ends_with("server counter."), "undescribed: {line}");
        }
        assert!(
            s.log_line().contains("2 peers, 1 connected"),
            "{}",
            s.log_line()
        );
    }

    #[test]
    fn every_numeric_field_is_exported_described_and_in_base_units() {
        let mut s = filled(&SessionStats::default(), 100);
        let mut c = filled(&ChannelSnapshot::default(), 1000);
        c.index = 2;
        c.name = "wan".into();
        c.state = "up".into();
        c.probe = "failed".into();
        c.srtt_ms = 25.0;
        c.pace_bps = 80e6;
        s.channels = vec![c];
        let text = s.prometheus();
        let mut exported = Vec::new();
        let top = serde_json::to_value(&s).unwrap();
        for (k, v) in top.as_object().unwrap() {
            if v.is_number() || v.is_boolean() {
                exported.push((false, k.clone()));
            }
        }
        let ch = serde_json::to_value(&s.channels[0]).unwrap();
        for (k, v) in ch.as_object().unwrap() {
            if (v.is_number() || v.is_boolean()) && k != "index" {
                exported.push((true, k.clone()));
            }
        }
        for (channel, k) in &exported {
            let m = metric_of(k, *channel);
            // Every field says what it means (not its Rust name), in base units.
            assert!(
                !m.help.contains(" field "),
                "{k} has no description: add it to COUNTERS or GAUGES"
            );
            assert!(
                !m.name.ends_with("_ms") && !m.name.ends_with("_bps") && !m.name.ends_with("_s"),
                "{k}: not in base units ({})",
                m.name
            );
            let full = format!(
                "braid_{}{}{}",
                if *channel { "channel_" } else { "" },
                m.name,
                if m.gauge { "" } else { "_total" }
            );
            let sample = text.lines().find(|l| {
                l.starts_with(&format!("{full} ")) || l.starts_with(&format!("{full}{{"))
            });
            let sample = sample.unwrap_or_else(|| panic!("{k} missing as {full}:\n{text}"));
            if *channel {
                assert!(sample.contains("channel=\"2\",name=\"wan\""), "{sample}");
            }
            let kind = if m.gauge { "gauge" } else { "counter" };
            let base = full.trim_end_matches("_total");
            assert!(
                text.contains(&format!("# HELP {base} {}.\n", m.help)),
                "{full}: no HELP:\n{text}"
            );
            assert!(
                text.contains(&format!("# TYPE {base} {kind}")),
                "{base} is no {kind}:\n{text}"
            );
        }
        // Converted: 25 ms is 0.025 s, 80 Mbit/s is 10 MB/s.
        assert!(
            text.contains("braid_channel_srtt_seconds{channel=\"2\",name=\"wan\"} 0.025"),
            "{text}"
        );
        assert!(
            text.contains(
                "braid_channel_pace_bytes_per_second{channel=\"2\",name=\"wan\"} 10000000.0"
            ),
            "{text}"
        );
        // The build, and the probe's state as one series per state.
        let info = text
            .lines()
            .find(|l| l.starts_with("braid_build_info{"))
            .unwrap_or_else(|| panic!("no build info:\n{text}"));
        assert!(
            info.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION")))
                && info.contains("git_commit=\"")
                && info.contains("profile=\"")
                && info.ends_with("} 1.0"),
            "{info}"
        );
        assert!(text.contains(
            "braid_channel_probe_state{channel=\"2\",name=\"wan\",state=\"failed\"} 1.0"
        ));
        assert!(text.contains(
            "braid_channel_probe_state{channel=\"2\",name=\"wan\",state=\"measured\"} 0.0"
        ));
        // Names a dashboard may rely on.
        for name in [
            "braid_naks_sent_total",
            "braid_repaired_total",
            "braid_delivered_packets_total",
            "braid_tx_epoch ",
            "braid_channel_up{",
            "braid_channel_tx_errors_total{",
            "braid_channel_rx_queue_drops_total{",
            "braid_channel_weight_bytes{",
            "braid_channel_demoted{",
            "braid_channel_probing{",
            "braid_channel_demotions_total{",
            "braid_channel_srtt_seconds{",
            "braid_channel_rtt_min_seconds{",
            "braid_channel_delivery_bytes_per_second{",
            "braid_channel_loss_ratio{",
            "braid_channel_window_loss_ratio{",
        ] {
            assert!(text.contains(name), "{name} missing:\n{text}");
        }
        // No HELP line is a Rust name.
        assert!(!text.contains("SessionStats.") && !text.contains("ChannelSnapshot."));
    }

    #[test]
    fn the_table_says_when_the_session_is_idle() {
        let mut s = SessionStats {
            peer_seen: true,
            peer_last_heard_s: 0.5,
            ..Default::default()
        };
        assert!(!s.table().contains("idle heartbeat"));
        s.idle = true;
        assert!(s
            .table()
            .contains("peer heard 0.50s ago (idle: hellos at the idle heartbeat)"));
    }

    #[test]
    fn the_table_and_the_json_name_the_cipher_once_agreed() {
        let mut s = SessionStats::default();
        assert!(!s.table().contains("cipher"));
        assert!(!serde_json::to_string(&s).unwrap().contains("cipher"));
        s.cipher = Some("aes-256-gcm".into());
        assert!(s
            .table()
            .lines()
            .next()
            .unwrap()
            .ends_with("  cipher aes-256-gcm"));
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.contains("\"cipher\":\"aes-256-gcm\""), "{json}");
        let back: SessionStats = serde_json::from_str(&json).unwrap();
        assert_eq!(back.cipher.as_deref(), Some("aes-256-gcm"));
    }

    #[test]
    fn the_table_shows_send_errors_the_peers_close_and_each_channels_pacing() {
        let mut s = SessionStats {
            peer_seen: true,
            peer_closed: true,
            peer_last_heard_s: 0.5,
            ..Default::default()
        };
        let c = ChannelSnapshot {
            name: "wan1".into(),
            state: "up".into(),
            tx_errors: 37,
            probe: "failed".into(),
            probe_detail: "probe failed: no report for 3 trains; unpaced as configured".into(),
            pace_bps: -1.0,
            ..Default::default()
        };
        s.channels = vec![c];
        let t = s.table();
        assert!(
            t.lines()
                .next()
                .unwrap()
                .contains("peer closed the session 0.50s ago"),
            "{t}"
        );
        let header = t.lines().nth(1).unwrap();
        assert!(header.trim_end().ends_with("tx err"), "{t}");
        // The channel's row right under the header, the pacing line after it.
        let row = t.lines().nth(2).unwrap();
        assert!(
            row.starts_with("0   wan1") && row.trim_end().ends_with(" 37"),
            "{t}"
        );
        assert!(
            t.lines().nth(3).unwrap().starts_with("pacing 0 (wan1)"),
            "{t}"
        );
        assert!(
            t.contains(
                "pacing 0 (wan1): probe failed: no report for 3 trains; unpaced as configured"
            ),
            "{t}"
        );
        // Nothing paced or measured: no pacing lines.
        s.channels[0].probe = "off".into();
        assert!(!s.table().contains("pacing"), "{}", s.table());
    }

    #[test]
    fn the_table_ends_with_every_packet_not_delivered_by_cause() {
        let s = SessionStats {
            queue_drops: 1,
            pacing_drops: 2,
            aqm_drops: 3,
            lost: 4,
            deliver_drops: 5,
            channels: vec![
                ChannelSnapshot {
                    rx_queue_drops: 6,
                    overflow_drops: 7,
                    ..Default::default()
                },
                ChannelSnapshot {
                    rx_queue_drops: 10,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let t = s.table();
        assert_eq!(
            t.lines().last().unwrap(),
            "not sent: queue full 1  pacer 2    not delivered: aqm 3  given up 4  app too slow 5  receive queue 16  buffer 7",
            "{t}"
        );
    }

    #[test]
    fn the_table_shows_in_bond_repair_only_when_it_did_something() {
        let mut s = SessionStats::default();
        let mut c = ChannelSnapshot {
            name: "lte".into(),
            state: "up".into(),
            ..Default::default()
        };
        s.channels = vec![c.clone()];
        assert!(!s.table().contains("repair:"), "{}", s.table());
        c.arq_missing = 7;
        c.arq_repaired = 6;
        c.arq_given_up = 1;
        c.arq_resent = 3;
        c.arq_premature = 2;
        c.arq_rejected = 4;
        s.channels = vec![c];
        let t = s.table();
        assert!(
            t.contains("repair: missing/repaired/given up lte=7/6/1  resent 3  premature 2  expired 0  rejected 4"),
            "{t}"
        );
    }

    #[test]
    fn the_table_shows_path_mtu_when_discovery_runs() {
        let mut s = SessionStats::default();
        let mut c = ChannelSnapshot {
            name: "dsl".into(),
            state: "up".into(),
            plpmtu: -1.0,
            ..Default::default()
        };
        s.channels = vec![c.clone()];
        assert!(!s.table().contains("path mtu"), "{}", s.table());
        c.plpmtu = 1452.0;
        c.pmtu_probes_sent = 5;
        c.pmtu_probes_lost = 3;
        let mut lte = c.clone();
        lte.name = "lte".into();
        lte.plpmtu = 1472.0;
        lte.pmtu_probes_lost = 0;
        s.channels = vec![c, lte];
        s.bond_mtu = 1420;
        let t = s.table();
        assert!(
            t.contains("path mtu: bond 1420  datagram bytes (probes sent/lost) dsl=1452 (5/3) lte=1472 (5/0)"),
            "{t}"
        );
    }

    #[test]
    fn a_moved_peer_endpoint_shows_in_the_table_the_json_and_the_metrics() {
        let mut s = SessionStats::default();
        let c = |name: &str, remote: &str, n| ChannelSnapshot {
            name: name.into(),
            remote: remote.into(),
            state: "up".into(),
            endpoint_changes: n,
            ..Default::default()
        };
        s.channels = vec![
            c("lte", "10.0.0.2:4000", 0),
            c("dsl", "[2001:db8::9]:7000", 0),
        ];
        assert!(!s.table().contains("peer endpoints"), "{}", s.table());
        s.channels[0] = c("lte", "10.0.0.9:5123", 2);
        let t = s.table();
        assert!(
            t.contains(
                "peer endpoints: lte=10.0.0.9:5123 (moved 2)  dsl=[2001:db8::9]:7000 (moved 0)"
            ),
            "{t}"
        );
        let j = serde_json::to_value(&s).unwrap();
        assert_eq!(j["channels"][0]["endpoint_changes"], 2);
        assert_eq!(j["channels"][0]["remote"], "10.0.0.9:5123");
        let p = s.prometheus();
        assert!(
            p.contains("braid_channel_endpoint_changes_total{channel=\"0\",name=\"lte\"} 2"),
            "{p}"
        );
    }

    #[test]
    fn handshake_failures_show_per_channel_in_the_table_and_the_metrics() {
        let mut s = SessionStats::default();
        let c = |name: &str, n| ChannelSnapshot {
            name: name.into(),
            state: "down".into(),
            handshake_failures: n,
            ..Default::default()
        };
        s.channels = vec![c("a", 0)];
        assert!(!s.table().contains("handshakes:"), "{}", s.table());
        s.channels = vec![c("a", 158), c("b", 3)];
        s.handshake_failures = 161;
        let t = s.table();
        assert!(
            t.contains("handshakes: completed 0  failed 161 (a=158 b=3)  settings mismatches 0  (peer never heard"),
            "{t}"
        );
        let p = s.prometheus();
        assert!(
            p.contains("braid_channel_handshake_failures_total{channel=\"0\",name=\"a\"} 158"),
            "{p}"
        );
        assert!(p.contains("braid_settings_mismatches_total 0"), "{p}");
        // Under a flood: what the handshake's defences did, in the table and metrics.
        assert!(!t.contains("handshake defence"), "{t}");
        s.cookie_replies_sent = 1200;
        s.handshakes_rate_limited = 7;
        let t = s.table();
        assert!(
            t.contains("handshake defence: mac1 failures 0  cookie replies sent 1200 received 0  rate-limited 7"),
            "{t}"
        );
        let p = s.prometheus();
        assert!(p.contains("braid_cookie_replies_sent_total 1200"), "{p}");
        assert!(p.contains("braid_handshakes_rate_limited_total 7"), "{p}");
    }
}
