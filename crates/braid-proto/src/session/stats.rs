//! The session's counters and a snapshot of its state.

use super::{bit, LinkState, Session};
use crate::stats::{ChannelStats, Stats};
use crate::time::{Duration, Instant};

/// Session-wide counters that are not the striper's or the resequencer's.
#[derive(Default, Clone, Debug)]
pub(super) struct Counters {
    pub sent_packets: u64,
    pub sent_bytes: u64,
    pub queue_drops: u64,
    pub stray_drops: u64,
    /// Datagrams not sent because there were no keys yet.
    pub unsent: u64,
    /// Hellos older than one already applied, passed over.
    pub stale_hellos: u64,
    pub delivered_bytes_last: u64,
    pub delivered_bps: f64,
}

/// One channel's state and counters, over every epoch so far.
#[derive(Clone, Debug, PartialEq)]
pub struct ChannelInfo {
    /// Do we hear the peer on it?
    pub state: LinkState,
    /// How long `state` has held.
    pub state_since: Duration,
    /// Times `state` changed.
    pub state_changes: u64,
    /// Does the peer report hearing us on it?
    pub peer_hears_us: bool,
    /// Is it in our current transmit set?
    pub in_tx_set: bool,
    /// Is it in our current receive set?
    pub in_rx_set: bool,
    /// Datagrams handed to the driver to send (data and control).
    pub tx_datagrams: u64,
    /// Their bytes.
    pub tx_bytes: u64,
    /// Data packets sent (repairs included).
    pub tx_data_packets: u64,
    /// Markers sent.
    pub tx_markers: u64,
    /// Triggers sent.
    pub tx_triggers: u64,
    /// Datagrams made for the channel and not sent: its uplink was gone, or no
    /// address of the peer was known on it.
    pub tx_discarded: u64,
    /// Datagrams received.
    pub rx_datagrams: u64,
    /// Their bytes.
    pub rx_bytes: u64,
    /// Data packets received.
    pub rx_data_packets: u64,
    /// Markers received and authenticated.
    pub rx_markers: u64,
    /// Triggers received and authenticated.
    pub rx_triggers: u64,
    /// Hellos received and authenticated.
    pub rx_hellos: u64,
    /// Feedback reports received and authenticated.
    pub rx_feedback: u64,
    /// What the peer's feedback says of the channel: round trip, delivery rate, loss.
    pub estimate: super::feedback::Estimate,
    /// Its SRR quantum in bytes (adapted, else set by `set_weights`, else as configured).
    pub quantum: u32,
    /// Its weight in the stripe now: its quantum while it is in our transmit set, 0
    /// while it is out (down, demoted or probing).
    pub weight: u32,
    /// The rate it is paced at (bit/s on the wire), when it is paced: the configured
    /// rate, or below it while adaptive weights have found less on its link.
    pub pace_bps: Option<f64>,
    /// Its rate as a capacity probe measured it (bit/s on the wire), if one did
    /// (`session::probe`, `pace = "auto"`).
    pub measured_bps: Option<f64>,
    /// What adaptive pacing did to it so far, when the channel is paced adaptively.
    pub pace_trace: Option<super::PaceTrace>,
    /// Where its capacity probe stands (`session::probe`).
    pub probe: super::ProbeState,
    /// Its configured pace (bit/s on the wire), if it has one: with a probe, the most
    /// it is paced at.
    pub pace_configured_bps: Option<f64>,
    /// Its place in the bond (`session::demote`): active, demoted or probing.
    pub role: super::Role,
    /// How long `role` has held.
    pub role_since: Duration,
    /// Times it was demoted.
    pub demotions: u64,
    /// Its loss over the demotion window (`demote_after`), when one was measured.
    pub window_loss: Option<f64>,
    /// Sealed datagrams whose tag did not verify (forged, corrupted, other keys).
    pub auth_failures: u64,
    /// Datagrams dropped because they were not sealed (where sealing is required) or
    /// were sealed with keys we do not have.
    pub unauthenticated: u64,
    /// Sealed datagrams replayed (a counter already seen or too old).
    pub replays: u64,
    /// Datagrams that could not be parsed (session and resequencer).
    pub malformed: u64,
    /// The peer's address on this channel (configured or learnt), when the driver
    /// gives addresses.
    pub endpoint: Option<std::net::SocketAddr>,
    /// Times the peer's address on this channel moved (an authenticated datagram from
    /// a new address: roaming, a NAT's new mapping); learning the first one is not
    /// counted.
    pub endpoint_changes: u64,
    /// Handshake messages that failed on this channel (from the peer's address): its
    /// initiations we refused, rejections and unauthenticated responses of ours, and
    /// unparseable or stale handshake messages. Keys that differ show here.
    pub handshake_failures: u64,
    /// Send rate over the last whole second, bit/s.
    pub tx_bps: f64,
    /// Receive rate over the last whole second, bit/s.
    pub rx_bps: f64,
    /// The striper's counters for this channel, every epoch added.
    pub striper: ChannelStats,
    /// The resequencer's counters for this channel, every epoch added.
    pub resequencer: ChannelStats,
    /// In-bond repair of this channel's datagrams (zero when off).
    pub arq: super::ArqChannelStats,
    /// With credits on: the credit left for our data on this channel (packets).
    pub credit_balance: Option<u64>,
    /// Path MTU discovery (`session::pmtu`), when on: the largest datagram (UDP
    /// payload) the channel carries now, its PLPMTU.
    pub pmtu: Option<u32>,
    /// Where its discovery stands (`None`: off).
    pub pmtu_phase: Option<super::pmtu::Phase>,
    /// Its discovery's counters (zero when off).
    pub pmtu_stats: super::pmtu::PmtuStats,
}

/// A snapshot of a whole session.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionStats {
    /// Have we heard an authenticated packet from the peer?
    pub peer_seen: bool,
    /// Time since the last authenticated packet from the peer.
    pub peer_last_heard: Option<Duration>,
    /// The peer ended its run on purpose (a close message) and no new run has been
    /// heard since.
    pub peer_closed: bool,
    /// No application data has flowed either way for `idle_after`: hellos at the idle
    /// heartbeat (`session::liveness`).
    pub idle: bool,
    /// Transmit epoch.
    pub tx_epoch: u32,
    /// Receive epoch.
    pub rx_epoch: u32,
    /// The physical channel whose next packet the receiver waits for while later data is
    /// held, and for how long so far (up to `max_wait` unless data keeps coming on it).
    pub rx_waiting: Option<(usize, Duration)>,
    /// A transmit epoch switch is waiting for its ack.
    pub switching: bool,
    /// Epoch switches completed as sender.
    pub tx_epoch_changes: u64,
    /// Epoch switches completed as receiver.
    pub rx_epoch_changes: u64,
    /// Packets accepted from the application.
    pub sent_packets: u64,
    /// Their bytes.
    pub sent_bytes: u64,
    /// Packets dropped because the switch queue was full or the striper refused them.
    pub queue_drops: u64,
    /// Data arriving on a channel outside the receive set.
    pub stray_drops: u64,
    /// Datagrams not sent because no handshake had completed yet.
    pub unsent: u64,
    /// Hellos that came after a newer one and were passed over (reordered across
    /// channels, e.g. queued on a link while it was down).
    pub stale_hellos: u64,
    /// Handshake counters.
    pub handshakes: super::HandshakeStats,
    /// The resequencers' session counters, every epoch added (delivered, lost, NAKs …).
    pub receiver: Stats,
    /// Packets left undeliverable at epoch switches (also counted in `lost`).
    pub switch_lost: u64,
    /// Packets the receiver declared lost, plus `switch_lost`.
    pub lost: u64,
    /// Delivery rate over the last whole second, bit/s.
    pub delivered_bps: f64,
    /// Times adaptive weights changed the quanta.
    pub quanta_changes: u64,
    /// The AQM's counters and each channel's queueing delay, when AQM is on.
    pub aqm: Option<crate::aqm::AqmStats>,
    /// Credit-based flow control's counters, when credits are on.
    pub credits: Option<super::CreditCounters>,
    /// Packets waiting in the transmit queue (for credit or an epoch switch).
    pub queued: usize,
    /// Pacing counters (`None`: pacing off).
    pub pacing: Option<super::PacingStats>,
    /// Capacity probes' counters (`session::probe`).
    pub probes: super::probe::ProbeStats,
    /// The channel the return path rides (`session::return_path`), while it is cut
    /// to one.
    pub return_path: Option<usize>,
    /// Times the return path was cut to one channel.
    pub return_path_cuts: u64,
    /// Real-time flows' counters (`session::flows`).
    pub flows: super::FlowStats,
    /// The largest inner packet the bond carries now ([`Session::path_max_packet`]):
    /// with path MTU discovery, from the smallest channel PLPMTU.
    pub path_max_packet: usize,
    /// Per channel.
    pub channels: Vec<ChannelInfo>,
}

impl Session {
    /// A snapshot of the counters and channel states at `now`.
    pub fn stats(&self, now: Instant) -> SessionStats {
        let rs = self.rx.reseq.stats();
        let balances = self.credit_balances();
        let ts = self.tx.striper.stats();
        let mut receiver = self.rx.base_global.clone();
        receiver += rs;
        let channels = (0..self.n)
            .map(|i| self.channel_info(i, now, rs, ts, balances.as_deref()))
            .collect();
        SessionStats {
            peer_seen: self.peer.seen,
            peer_last_heard: self.peer.last.map(|l| now.saturating_since(l)),
            peer_closed: self.peer.closed,
            idle: self.idle,
            tx_epoch: self.tx.epoch,
            rx_epoch: self.rx.epoch,
            rx_waiting: self.rx.reseq.waiting(now).and_then(|(k, d)| {
                let phys = self.rx.index.iter().position(|&i| i == Some(k))?;
                Some((phys, d))
            }),
            switching: self.tx.switching.is_some(),
            tx_epoch_changes: self.tx.changes,
            rx_epoch_changes: self.rx.changes,
            sent_packets: self.counters.sent_packets,
            sent_bytes: self.counters.sent_bytes,
            queue_drops: self.counters.queue_drops,
            stray_drops: self.counters.stray_drops,
            unsent: self.counters.unsent,
            stale_hellos: self.counters.stale_hellos,
            handshakes: self.crypto.stats.clone(),
            lost: receiver.lost + self.rx.switch_lost,
            switch_lost: self.rx.switch_lost,
            receiver,
            delivered_bps: self.counters.delivered_bps,
            quanta_changes: self.adapt.as_ref().map_or(0, |a| a.changes),
            aqm: self.aqm.as_ref().map(|a| a.stats(now)),
            credits: self.credit_counters(),
            path_max_packet: self.path_max_packet(),
            pacing: self.pacer.as_ref().map(|p| p.stats),
            probes: self.probes.stats,
            queued: self.tx.pending.len(),
            return_path: self.return_path.on,
            return_path_cuts: self.return_path.cuts,
            flows: self.flow_stats(),
            channels,
        }
    }

    /// Channel `i` at `now`: its state, counters (those of earlier epochs added) and
    /// estimates; `rs`/`ts` the current resequencer's and striper's counters.
    fn channel_info(
        &self,
        i: usize,
        now: Instant,
        rs: &Stats,
        ts: &Stats,
        balances: Option<&[u64]>,
    ) -> ChannelInfo {
        let (t, r) = self.epoch_counters(i, rs, ts);
        let c = &self.chans[i];
        let quantum = self.quantum(i);
        let in_tx_set = self.tx.set & bit(i) != 0;
        ChannelInfo {
            state: c.state,
            state_since: now.saturating_since(c.since),
            state_changes: c.changes,
            peer_hears_us: c.peer_hears_us,
            in_tx_set,
            in_rx_set: self.rx.set & bit(i) != 0,
            tx_datagrams: c.n.tx_datagrams,
            tx_bytes: c.n.tx_bytes,
            tx_data_packets: c.n.tx_data,
            tx_markers: c.n.tx_markers,
            tx_triggers: c.n.tx_triggers,
            tx_discarded: c.n.tx_discarded,
            rx_datagrams: c.n.rx_datagrams,
            rx_bytes: c.n.rx_bytes,
            rx_data_packets: c.n.rx_data,
            rx_markers: c.n.rx_markers,
            rx_triggers: c.n.rx_triggers,
            rx_hellos: c.n.rx_hellos,
            rx_feedback: c.n.rx_feedback,
            estimate: c.fb_tx.estimate(),
            quantum,
            weight: if in_tx_set { quantum } else { 0 },
            pace_bps: self.pacer.as_ref().and_then(|p| p.rate_bps(i)),
            measured_bps: self.probes.measured(i),
            pace_trace: self.adapt.as_ref().and_then(|a| a.trace(i)),
            probe: self.probes.state(i),
            pace_configured_bps: self.configured_rate(i),
            role: c.demote.role,
            role_since: now.saturating_since(c.demote.since),
            demotions: c.demote.demotions,
            window_loss: c.demote.window_loss,
            auth_failures: c.n.auth_failures,
            unauthenticated: c.n.unauthenticated,
            replays: c.n.replays,
            malformed: c.n.malformed + r.malformed,
            endpoint: self.endpoints[i],
            endpoint_changes: c.n.endpoint_changes,
            handshake_failures: self.crypto.failed_on(i),
            tx_bps: c.n.tx_bps,
            rx_bps: c.n.rx_bps,
            pmtu: self.pmtu.get(i).map(|m| m.plpmtu),
            pmtu_phase: self.pmtu.get(i).map(|m| m.phase),
            pmtu_stats: self.pmtu.get(i).map(|m| m.stats).unwrap_or_default(),
            striper: t,
            resequencer: r,
            arq: self.arq_rx[i].stats.merged(&self.arq_tx[i].stats),
            credit_balance: balances.map(|b| b[i]),
        }
    }

    /// Channel `i`'s striper and resequencer counters over every epoch: those of
    /// earlier epochs, plus the current striper's `ts` and resequencer's `rs` where
    /// `i` is one of their channels.
    fn epoch_counters(&self, i: usize, rs: &Stats, ts: &Stats) -> (ChannelStats, ChannelStats) {
        let mut t = self.tx.base[i].clone();
        if let Some(k) = self.tx.members.iter().position(|&m| m == i) {
            t += &ts.channels[k];
        }
        let mut r = self.rx.base[i].clone();
        if let Some(k) = self.rx.index[i] {
            r += &rs.channels[k];
        }
        (t, r)
    }

    /// Channel `i`'s configured pacing rate (bit/s on the wire), if pacing is on and
    /// one is configured (not learnt by probing).
    fn configured_rate(&self, i: usize) -> Option<f64> {
        self.cfg
            .pacing
            .as_ref()
            .and_then(|p| p.rates_bps.get(i).copied())
            .filter(|r| *r > 0.0)
    }

    /// Channel `i`'s quantum: adapted, else set by `set_weights`, else as configured.
    fn quantum(&self, i: usize) -> u32 {
        match (&self.adapt, &self.set_quanta) {
            (Some(a), _) => a.quanta[i],
            (None, Some(q)) => q[i],
            (None, None) => self.cfg.stripe_config(&[i]).weights[0],
        }
    }
}
