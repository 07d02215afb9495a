//! Live statistics of a session: a serializable snapshot, rendered as a table (for
//! `braid status` and the log), as JSON, or in the Prometheus text format.

use std::fmt::Write;

use serde::{Deserialize, Serialize};

/// Per-channel counters and state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChannelSnapshot {
    /// Physical index (same at both ends).
    pub index: usize,
    /// Name from the configuration.
    pub name: String,
    /// Local address.
    pub local: String,
    /// Peer address.
    pub remote: String,
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
    /// Datagrams dropped on arrival because this channel's share of the receive queue
    /// was full (a flood on its port, or a driver that cannot keep up).
    #[serde(default)]
    pub rx_queue_drops: u64,
    /// Datagrams dropped on arrival because they were larger than any channel carries.
    #[serde(default)]
    pub rx_oversize: u64,
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
    /// Datagrams the core could not parse.
    pub malformed: u64,
    /// Send rate over the last second, bit/s.
    pub tx_bps: f64,
    /// Receive rate over the last second, bit/s.
    pub rx_bps: f64,
}

/// A snapshot of a whole session.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionStats {
    /// Seconds since the session started.
    pub uptime_s: f64,
    /// Have we heard an authenticated packet from the peer?
    pub peer_seen: bool,
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
    /// Handshakes completed (the first, re-keys, after peer restarts).
    #[serde(default)]
    pub handshakes: u64,
    /// Handshake messages that failed (wrong key, corrupted, stray responses).
    #[serde(default)]
    pub handshake_failures: u64,
    /// Unparseable datagrams, all channels.
    pub malformed: u64,
    /// Resynchronizations, all channels.
    pub resyncs: u64,
    /// Delivery rate over the last second, bit/s.
    pub delivered_bps: f64,
    /// Per channel.
    pub channels: Vec<ChannelSnapshot>,
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

impl SessionStats {
    /// A multi-line human-readable table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "uptime {:.1}s  peer {}  tx epoch {}{}  rx epoch {}  delivered {} pkts {} B ({}bit/s)  lost {}  ooo {}  auth-fail {}  replays {}",
            self.uptime_s,
            if !self.peer_seen {
                "never heard".to_string()
            } else {
                format!("heard {:.2}s ago", self.peer_last_heard_s)
            },
            self.tx_epoch,
            if self.switching { " (switching)" } else { "" },
            self.rx_epoch,
            self.delivered_packets,
            self.delivered_bytes,
            si(self.delivered_bps),
            self.lost,
            self.out_of_order,
            self.auth_failures,
            self.replays,
        );
        let _ = writeln!(
            s,
            "{:<3} {:<8} {:<5} {:>8} {:<4} {:<5} {:>10} {:>10} {:>9} {:>9} {:>7} {:>7} {:>7} {:>6} {:>6}",
            "ch", "name", "state", "since", "peer", "sets", "tx pkts", "rx pkts", "tx bit/s", "rx bit/s",
            "mk tx", "mk rx", "resync", "auth", "replay"
        );
        for c in &self.channels {
            let sets = format!(
                "{}{}",
                if c.in_tx_set { "T" } else { "-" },
                if c.in_rx_set { "R" } else { "-" }
            );
            let _ = writeln!(
                s,
                "{:<3} {:<8} {:<5} {:>7.1}s {:<4} {:<5} {:>10} {:>10} {:>9} {:>9} {:>7} {:>7} {:>7} {:>6} {:>6}",
                c.index,
                c.name,
                c.state,
                c.state_since_s,
                if c.peer_hears_us { "up" } else { "down" },
                sets,
                c.tx_data_packets,
                c.rx_data_packets,
                si(c.tx_bps),
                si(c.rx_bps),
                c.tx_markers + c.tx_triggers,
                c.rx_markers + c.rx_triggers,
                c.resyncs,
                c.auth_failures,
                c.replays,
            );
        }
        s
    }

    /// One line for the periodic log.
    pub fn log_line(&self) -> String {
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
                c.state,
                si(c.tx_bps),
                si(c.rx_bps),
                c.resyncs
            );
        }
        s
    }

    /// Prometheus text exposition format (version 0.0.4).
    pub fn prometheus(&self) -> String {
        let mut s = String::new();
        let mut g = |name: &str, help: &str, kind: &str, v: f64| {
            let _ = writeln!(
                s,
                "# HELP braid_{name} {help}\n# TYPE braid_{name} {kind}\nbraid_{name} {v}"
            );
        };
        g(
            "uptime_seconds",
            "Seconds since the session started.",
            "gauge",
            self.uptime_s,
        );
        g(
            "peer_seen",
            "1 once the peer has been heard.",
            "gauge",
            self.peer_seen as u8 as f64,
        );
        g("tx_epoch", "Transmit epoch.", "gauge", self.tx_epoch as f64);
        g("rx_epoch", "Receive epoch.", "gauge", self.rx_epoch as f64);
        g(
            "epoch_changes_total",
            "Epoch switches as sender.",
            "counter",
            self.tx_epoch_changes as f64,
        );
        g(
            "sent_packets_total",
            "Messages accepted from the application.",
            "counter",
            self.sent_packets as f64,
        );
        g(
            "sent_bytes_total",
            "Bytes accepted from the application.",
            "counter",
            self.sent_bytes as f64,
        );
        g(
            "delivered_packets_total",
            "Messages delivered in order.",
            "counter",
            self.delivered_packets as f64,
        );
        g(
            "delivered_bytes_total",
            "Bytes delivered in order.",
            "counter",
            self.delivered_bytes as f64,
        );
        g(
            "out_of_order_total",
            "Out-of-order deliveries seen (seq mode).",
            "counter",
            self.out_of_order as f64,
        );
        g(
            "lost_total",
            "Packets declared lost.",
            "counter",
            self.lost as f64,
        );
        g(
            "queue_drops_total",
            "Messages dropped while a switch was pending.",
            "counter",
            self.queue_drops as f64,
        );
        g(
            "deliver_drops_total",
            "Messages dropped: application too slow.",
            "counter",
            self.deliver_drops as f64,
        );
        type Metric = (
            &'static str,
            &'static str,
            &'static str,
            fn(&ChannelSnapshot) -> f64,
        );
        let per: [Metric; 14] = [
            (
                "channel_up",
                "1 if the peer is heard on the channel.",
                "gauge",
                |c| (c.state == "up") as u8 as f64,
            ),
            (
                "channel_in_tx_set",
                "1 if the channel is in the transmit set.",
                "gauge",
                |c| c.in_tx_set as u8 as f64,
            ),
            (
                "channel_state_changes_total",
                "Up/down transitions.",
                "counter",
                |c| c.state_changes as f64,
            ),
            (
                "channel_tx_bytes_total",
                "UDP payload bytes sent.",
                "counter",
                |c| c.tx_bytes as f64,
            ),
            (
                "channel_rx_bytes_total",
                "UDP payload bytes received.",
                "counter",
                |c| c.rx_bytes as f64,
            ),
            (
                "channel_tx_packets_total",
                "Data packets sent.",
                "counter",
                |c| c.tx_data_packets as f64,
            ),
            (
                "channel_rx_packets_total",
                "Data packets received.",
                "counter",
                |c| c.rx_data_packets as f64,
            ),
            (
                "channel_tx_markers_total",
                "Markers and triggers sent.",
                "counter",
                |c| (c.tx_markers + c.tx_triggers) as f64,
            ),
            (
                "channel_rx_markers_total",
                "Markers and triggers received.",
                "counter",
                |c| (c.rx_markers + c.rx_triggers) as f64,
            ),
            (
                "channel_resyncs_total",
                "Marker resynchronizations.",
                "counter",
                |c| c.resyncs as f64,
            ),
            (
                "channel_wait_timeouts_total",
                "Receiver gave up waiting on the channel.",
                "counter",
                |c| c.wait_timeouts as f64,
            ),
            (
                "channel_auth_failures_total",
                "Control packets with a bad MAC.",
                "counter",
                |c| c.auth_failures as f64,
            ),
            (
                "channel_replays_total",
                "Replayed or reordered control packets.",
                "counter",
                |c| c.replays as f64,
            ),
            (
                "channel_rx_bits_per_second",
                "Receive rate over the last second.",
                "gauge",
                |c| c.rx_bps,
            ),
        ];
        for (name, help, kind, f) in per {
            let _ = writeln!(s, "# HELP braid_{name} {help}\n# TYPE braid_{name} {kind}");
            for c in &self.channels {
                let _ = writeln!(
                    s,
                    "braid_{name}{{channel=\"{}\",name=\"{}\"}} {}",
                    c.index,
                    c.name.replace(['"', '\\', '\n'], "_"),
                    f(c)
                );
            }
        }
        s
    }
}
