//! Hellos and channel liveness: which channels we hear the peer on, which channels the
//! peer hears us on, and the periodic heartbeat.

use super::{bit, Event, Session};
use crate::time::Instant;
use crate::wire::session::{Feedback, Hello, Msg, HELLO_SEQ_MASK};

/// Do we hear the peer on a channel?
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum LinkState {
    /// Never heard the peer yet.
    Waiting,
    /// Heard within `dead_after`.
    Up,
    /// Silent for `dead_after`; up again after `rejoin_after` of continuous hearing.
    Down,
}

impl LinkState {
    /// Short name, as in `braid status`.
    pub fn name(self) -> &'static str {
        match self {
            LinkState::Waiting => "wait",
            LinkState::Up => "up",
            LinkState::Down => "down",
        }
    }
}

/// Per-channel counters the session keeps (the striper and resequencer keep theirs).
#[derive(Default, Clone, Debug)]
pub(super) struct ChanCounters {
    pub tx_datagrams: u64,
    pub tx_bytes: u64,
    pub tx_data: u64,
    pub tx_markers: u64,
    pub tx_triggers: u64,
    pub tx_discarded: u64,
    pub rx_datagrams: u64,
    pub rx_bytes: u64,
    pub rx_data: u64,
    pub rx_markers: u64,
    pub rx_triggers: u64,
    pub rx_hellos: u64,
    pub rx_feedback: u64,
    pub auth_failures: u64,
    pub replays: u64,
    pub unauthenticated: u64,
    pub malformed: u64,
    pub endpoint_changes: u64,
    pub last_tx_bytes: u64,
    pub last_rx_bytes: u64,
    pub tx_bps: f64,
    pub rx_bps: f64,
}

pub(super) struct Chan {
    pub state: LinkState,
    pub since: Instant,
    pub changes: u64,
    pub last_rx: Option<Instant>,
    pub run_start: Option<Instant>,
    pub peer_hears_us: bool,
    pub n: ChanCounters,
    /// What we received on it, for our feedback to the peer.
    pub fb_rx: super::feedback::RxCounts,
    /// What the peer's feedback tells us of it.
    pub fb_tx: super::feedback::Estimator,
    /// Is it a net cost (`super::demote`)?
    pub demote: super::demote::ChanDemote,
}

impl Chan {
    pub fn new(now: Instant) -> Chan {
        Chan {
            state: LinkState::Waiting,
            since: now,
            changes: 0,
            last_rx: None,
            run_start: None,
            peer_hears_us: false,
            n: ChanCounters::default(),
            fb_rx: Default::default(),
            fb_tx: Default::default(),
            demote: super::demote::ChanDemote::new(now),
        }
    }
}

/// What we know of the peer.
pub(super) struct Peer {
    pub seen: bool,
    pub last: Option<Instant>,
    /// Channels the peer last reported hearing us on.
    pub mask: u64,
    pub report_at: Option<Instant>,
    pub silent_warned: bool,
    /// Number of the newest hello applied (stale ones are passed over).
    pub hello_seq: Option<u32>,
    /// The peer said it ends this run (a close message): its silence is no failure.
    /// Until a new run of the peer completes a handshake.
    pub closed: bool,
}

impl Peer {
    pub fn new(all: u64) -> Peer {
        Peer {
            seen: false,
            last: None,
            mask: all,
            report_at: None,
            silent_warned: false,
            hello_seq: None,
            closed: false,
        }
    }
}

impl Session {
    pub(super) fn rx_mask(&self) -> u64 {
        self.chans
            .iter()
            .enumerate()
            .filter(|(_, c)| c.state != LinkState::Down)
            .fold(0, |m, (i, _)| m | bit(i))
    }

    pub(super) fn heartbeat(&mut self, now: Instant) {
        self.liveness(now);
        self.demote_step(now);
        self.return_path_step(now);
        self.scale_codels();
        // A handshake when one is due (no keys yet, or time for fresh ones), on every
        // channel: the first to get through wins.
        if let Some(init) = self.crypto.initiation(now) {
            for c in 0..self.n {
                self.out.push_back(super::Transmit {
                    channel: c,
                    kind: super::DatagramKind::Control,
                    bytes: self.crypto.for_channel(now, c, &init),
                    destination: None,
                });
            }
        }
        if !self.crypto.ready() {
            return;
        }
        self.send_hellos();
        self.send_feedback(now);
        self.probe_step(now);
        self.pmtu_step(now);
        self.send_lingering_end();
        if self.tx.switching.is_some() {
            self.send_end();
        } else {
            // Markers (or triggers) on every channel of the set: heartbeats that also
            // resynchronize the receiver.
            self.tx.striper.flush();
            self.take_transmits();
        }
        if let Some(l) = self.peer.last {
            let silent = now - l;
            if silent > self.cfg.dead_after && !self.peer.silent_warned && !self.peer.closed {
                self.peer.silent_warned = true;
                self.events.push_back(Event::PeerSilent(silent));
            }
        }
        self.maybe_switch(now);
    }

    /// End the session on purpose: a close message on every channel, so the peer
    /// takes the silence that follows for the end of this run rather than for failed
    /// channels. Call it last, then send what [`Session::poll_transmit`] gives and
    /// stop. Nothing is sent without keys (there is no peer to tell).
    pub fn close(&mut self, now: Instant) {
        self.clock = self.clock.max(now);
        if !self.crypto.ready() {
            return;
        }
        for c in 0..self.n {
            self.send_ctrl(c, &Msg::Close(c as u8));
        }
    }

    /// The peer's close (on any channel; the first one counts).
    pub(super) fn on_close(&mut self) {
        if !self.peer.closed {
            self.peer.closed = true;
            self.crypto.peer_ended();
            self.events.push_back(Event::PeerClosed);
        }
    }

    /// A hello on every configured channel (down ones too, so their return is seen).
    pub(super) fn send_hellos(&mut self) {
        let rx_mask = self.rx_mask();
        self.hello_seq = self.hello_seq.wrapping_add(1) & HELLO_SEQ_MASK;
        for c in 0..self.n {
            let m = Msg::Hello(Hello {
                channel: c as u8,
                channels: self.n as u8,
                rx_mask,
                tx_epoch: self.tx.epoch,
                rx_epoch: self.rx.epoch,
                seq: self.hello_seq,
            });
            self.send_ctrl(c, &m);
        }
    }

    /// On every channel, what we received on it (see [`super::feedback`]).
    fn send_feedback(&mut self, now: Instant) {
        for c in 0..self.n {
            let f = self.chans[c]
                .fb_rx
                .report(c as u8, now, self.crypto.missing(c));
            self.send_ctrl(c, &Msg::Feedback(f));
        }
    }

    /// The peer's feedback on channel `c`.
    ///
    /// A report that came as an in-bond repair (lost, asked for and sent again on
    /// another channel) is passed over: its counts are cumulative, so the next report
    /// carries them, and its timestamps would time the repair too: its echo would give
    /// a round trip longer by the repair's time, echoing its timestamp would give the
    /// peer one (a lossy channel then showed a "standing queue" of 19 ms over its
    /// 40 ms round trip, and was not demoted for its loss), and a repair older than
    /// the latest report would look like counts going back.
    pub(super) fn on_feedback(&mut self, c: usize, f: Feedback, now: Instant, repaired: bool) {
        self.chans[c].n.rx_feedback += 1;
        if repaired {
            return;
        }
        self.chans[c].fb_rx.peer_ts = Some((f.timestamp, now));
        self.chans[c].fb_tx.on_report(now, &f);
        if let Some(m) = self.pmtu.get_mut(c) {
            m.on_feedback(now, f.missing);
        }
    }

    fn liveness(&mut self, now: Instant) {
        let mut went_down = false;
        let dead = self.cfg.dead_after;
        let rejoin = self.cfg.rejoin_after;
        let hb2 = self.cfg.heartbeat + self.cfg.heartbeat;
        let uplink_down = self.uplink_down;
        for (i, c) in self.chans.iter_mut().enumerate() {
            if uplink_down & bit(i) != 0 {
                // Down already, and nothing of it counts until the uplink is back.
                continue;
            }
            match c.state {
                LinkState::Up => {
                    let silent = c.last_rx.map_or(dead + dead, |l| now - l);
                    if silent > dead {
                        c.state = LinkState::Down;
                        c.since = now;
                        c.changes += 1;
                        c.run_start = None;
                        // What it reported before it failed says nothing of it when it
                        // returns (and its last interval spans the outage).
                        c.fb_tx = Default::default();
                        c.demote.restart_window();
                        went_down = true;
                        // After the peer's close, its channels fall silent as meant.
                        if !self.peer.closed {
                            self.events
                                .push_back(Event::ChannelDown { channel: i, silent });
                        }
                    }
                }
                LinkState::Down => {
                    if let (Some(s), Some(l)) = (c.run_start, c.last_rx) {
                        if now - s >= rejoin && now - l <= hb2 {
                            c.state = LinkState::Up;
                            c.since = now;
                            c.changes += 1;
                            // And again now that it is back: the first reports after the
                            // outage count what the outage lost.
                            c.fb_tx = Default::default();
                            c.demote.restart_window();
                            // Its rate may have changed while it was away.
                            self.probes.again(Some(i));
                            self.events.push_back(Event::ChannelUp { channel: i });
                        }
                    }
                }
                LinkState::Waiting => {}
            }
        }
        if went_down {
            // A pending receive switch may have been waiting for the end on it.
            self.rx_maybe_commit(now);
        }
    }

    /// The driver saw channel `c`'s uplink (its device, or its local address) go away
    /// (`present` false) or come back. Gone: the channel is down at once (not after
    /// `dead_after`), our next hellos tell the peer we no longer hear it there (the
    /// peer takes it out of its transmit set within a heartbeat), it leaves our
    /// transmit set at the next switch, and nothing is sent on it (nor sealed: what
    /// would have been is counted as `tx_discarded`). Back: it rejoins as
    /// any down channel does, once the peer has been heard on it for `rejoin_after`;
    /// hellos go out on it at once. No event: the driver knows and says why.
    pub fn set_uplink(&mut self, now: Instant, c: usize, present: bool) {
        if c >= self.n || (self.uplink_down & bit(c) == 0) == present {
            return;
        }
        self.clock = self.clock.max(now);
        if present {
            self.uplink_down &= !bit(c);
            self.chans[c].run_start = None;
            self.chans[c].last_rx = None;
            // Hellos now: the peer hears the channel again a heartbeat sooner.
            self.next_hello = self.clock;
            return;
        }
        self.uplink_down |= bit(c);
        let ch = &mut self.chans[c];
        if ch.state != LinkState::Down {
            ch.state = LinkState::Down;
            ch.since = now;
            ch.changes += 1;
            ch.fb_tx = Default::default();
            ch.demote.restart_window();
        }
        ch.run_start = None;
        // A pending receive switch may have been waiting for the end on it; our own
        // transmit set leaves it; the peer learns it from our next hellos, now.
        self.rx_maybe_commit(now);
        self.maybe_switch(now);
        self.next_hello = self.clock;
    }

    /// Is channel `c`'s uplink gone ([`Session::set_uplink`])?
    pub fn uplink_gone(&self, c: usize) -> bool {
        self.uplink_down & bit(c) != 0
    }

    /// Something arrived on channel `c`: it counts towards liveness.
    pub(super) fn heard(&mut self, c: usize, now: Instant) {
        if self.uplink_down & bit(c) != 0 {
            // Queued before the uplink went: says nothing of it now.
            return;
        }
        let dead = self.cfg.dead_after;
        let ch = &mut self.chans[c];
        if ch.state == LinkState::Down {
            let gap = ch.last_rx.is_none_or(|l| now - l > dead);
            if ch.run_start.is_none() || gap {
                ch.run_start = Some(now);
            }
        }
        ch.last_rx = Some(now);
    }

    pub(super) fn on_hello(&mut self, c: usize, h: Hello, now: Instant) {
        self.chans[c].n.rx_hellos += 1;
        // Hellos of one heartbeat go out on every channel at once, so after an outage
        // the ones queued on a channel that was down arrive among newer ones from the
        // others: applying a stale one reported channels lost that the peer hears again,
        // and a rejoin took three epoch switches in 150 ms. Only newer reports count.
        if self.peer.hello_seq.is_some_and(|last| h.older_than(last)) {
            self.counters.stale_hellos += 1;
            return;
        }
        self.peer.hello_seq = Some(h.seq);
        // Only the channels both ends have count (another number of channels is the
        // handshake's to see: `Session::on_new_peer`).
        let mask = h.rx_mask & self.common_set();
        for i in 0..self.n {
            let hears = mask & bit(i) != 0;
            if self.chans[i].peer_hears_us != hears {
                self.chans[i].peer_hears_us = hears;
                self.events
                    .push_back(Event::PeerHearsUs { channel: i, hears });
            }
        }
        self.peer.mask = mask;
        self.peer.report_at = Some(now);
        self.peer_rx_epoch(h.rx_epoch);
        self.maybe_switch(now);
    }

    /// CoDel follows the bond's round trip (`aqm::scaled`): the pacer's, from the
    /// slowest minimum round trip among the channels we stripe over, the receiver's
    /// AQM's, among those we receive on.
    fn scale_codels(&mut self) {
        let slowest = |set: &mut dyn Iterator<Item = usize>| {
            set.filter_map(|c| self.chans[c].fb_tx.rtt_min()).max()
        };
        let tx = slowest(&mut self.tx.members.iter().copied());
        let rx = slowest(&mut super::members_of(self.rx.set).into_iter());
        if let (Some(p), Some(s)) = (&mut self.pacer, tx) {
            p.scale(s);
        }
        if let (Some(a), Some(s)) = (&mut self.aqm, rx) {
            a.scale(s);
        }
    }

    pub(super) fn rates(&mut self) {
        for c in &mut self.chans {
            c.n.tx_bps = (c.n.tx_bytes - c.n.last_tx_bytes) as f64 * 8.0;
            c.n.rx_bps = (c.n.rx_bytes - c.n.last_rx_bytes) as f64 * 8.0;
            c.n.last_tx_bytes = c.n.tx_bytes;
            c.n.last_rx_bytes = c.n.rx_bytes;
        }
        let d = self.rx.base_global.delivered_bytes + self.rx.reseq.stats().delivered_bytes;
        self.counters.delivered_bps = (d - self.counters.delivered_bytes_last) as f64 * 8.0;
        self.counters.delivered_bytes_last = d;
    }
}
