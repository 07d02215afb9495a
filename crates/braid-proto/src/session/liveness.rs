//! Hellos and channel liveness: which channels we hear the peer on, which channels the
//! peer hears us on, and the periodic heartbeat.
//!
//! **Idle sessions slow down.** After `idle_after` (2 s) without application data
//! either way, the heartbeat goes from `heartbeat` (50 ms) to `idle_heartbeat` (1 s),
//! and back at once with the first packet sent or received (hellos go out then). An
//! idle tunnel costs a twentieth of the datagrams (a server's thousand idle peers
//! had kept most of a core busy with 40 000 hellos a second each way, and a cellular
//! uplink paid for them), and its hellos still hold every NAT mapping open. An idle
//! end's hellos say when the next comes (`Hello::interval_us`), and the peer stretches its
//! `dead_after` by as much as that interval exceeds its own heartbeat (a channel is
//! down after 6 s of silence at the defaults while the peer is idle). When the peer
//! speeds up again, the silence of its channels counts from the first fast hello, so
//! a channel whose fast hellos are a moment behind another's is not taken for dead,
//! and one that died while the tunnel was idle is down within `dead_after` of the
//! tunnel's first data. Never idle without keys, while a handshake is due, while an
//! epoch switch waits for its ack, or while a down channel that is heard again
//! rejoins (its return wakes the heartbeat at once).

use super::{bit, Event, Session};
use crate::time::{Duration, Instant};
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
    /// Bytes and datagrams sent on it outside the stripe's quanta (markers, control,
    /// repairs, flow datagrams, probes): adaptive pacing gives the stripe the rest of
    /// its rate (`session::adapt`).
    pub unstriped: (u64, u64),
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
            unstriped: (0, 0),
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
    /// The peer's next hello comes within this (its latest hello said, while it is
    /// idle; zero: not said, its usual heartbeat).
    pub interval: Duration,
    /// When the peer's hellos last sped up: silence counts from there.
    pub faster_at: Option<Instant>,
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
            interval: Duration::ZERO,
            faster_at: None,
        }
    }
}

/// How long the peer must report no loss before the markers thin out
/// ([`Session::markers_follow_loss`]).
pub(super) const QUIET_AFTER: Duration = Duration::from_secs(2);

impl Session {
    /// Application data went out or came in: the session is active; if it was idle,
    /// hellos go out now, saying the heartbeat is fast again.
    #[inline]
    pub(super) fn active(&mut self, now: Instant) {
        self.last_active = now;
        if self.idle {
            self.idle = false;
            self.next_hello = self.clock;
        }
    }

    /// Should the heartbeat that starts now be the idle one?
    pub(super) fn quiet(&self, now: Instant) -> bool {
        self.cfg.idle_heartbeat > self.cfg.heartbeat
            && now.saturating_since(self.last_active) >= self.cfg.idle_after
            && self.crypto.ready()
            && !self.crypto.handshaking()
            && self.tx.switching.is_none()
            && !self.rejoining()
    }

    /// Is a down channel being heard again (a rejoin under way)?
    fn rejoining(&self) -> bool {
        self.chans
            .iter()
            .any(|c| c.state == LinkState::Down && c.run_start.is_some())
    }

    /// The time to the next heartbeat.
    pub(super) fn hello_interval(&self) -> Duration {
        if self.idle {
            self.cfg.idle_heartbeat
        } else {
            self.cfg.heartbeat
        }
    }

    /// `dead_after`, stretched by as much as the peer's hellos (while it is idle) come
    /// slower than our heartbeat.
    pub(super) fn dead_after_now(&self) -> Duration {
        let (hb, theirs) = (self.cfg.heartbeat, self.peer.interval);
        if theirs <= hb {
            return self.cfg.dead_after;
        }
        let us = u128::from(self.cfg.dead_after.as_micros()) * u128::from(theirs.as_micros())
            / u128::from(hb.as_micros().max(1));
        Duration::from_micros(u64::try_from(us).unwrap_or(u64::MAX))
    }

    /// How long channel `c` (last heard at `last`) has been silent: since the peer's
    /// hellos last sped up, if that is later.
    fn silent_since(&self, last: Instant, now: Instant) -> Duration {
        now - self.peer.faster_at.map_or(last, |f| f.max(last))
    }

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
            let silent = self.silent_since(l, now);
            if silent > self.dead_after_now() && !self.peer.silent_warned && !self.peer.closed {
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
                // Said only while idle: the usual hello stays 24 bytes.
                interval_us: if self.idle {
                    u32::try_from(self.hello_interval().as_micros()).unwrap_or(u32::MAX)
                } else {
                    0
                },
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
        let (_, missing) = self.chans[c].fb_tx.totals();
        self.chans[c].fb_tx.on_report(now, &f);
        let lost = self.chans[c].fb_tx.totals().1 > missing;
        self.markers_follow_loss(now, lost);
        if let Some(m) = self.pmtu.get_mut(c) {
            m.on_feedback(now, f.missing);
        }
    }

    /// Thin the markers out once the peer has reported no loss on any channel for
    /// [`QUIET_AFTER`], and back as configured at the first loss it reports
    /// ([`crate::Striper::set_quiet`]). Not with credits, which markers carry.
    fn markers_follow_loss(&mut self, now: Instant, lost: bool) {
        let since = match self.loss_free_since {
            Some(t) if !lost => t,
            _ => *self.loss_free_since.insert(now),
        };
        let quiet = self.cfg.markers.quiet_interval.is_some()
            && self.credit_tx.is_none()
            && now - since >= QUIET_AFTER;
        if quiet != self.tx.striper.quiet() {
            self.tx.striper.set_quiet(quiet);
        }
    }

    fn liveness(&mut self, now: Instant) {
        let mut went_down = false;
        let dead = self.dead_after_now();
        let rejoin = self.cfg.rejoin_after;
        let slowest = self.cfg.heartbeat.max(self.peer.interval);
        let hb2 = slowest + slowest;
        let uplink_down = self.uplink_down;
        let faster_at = self.peer.faster_at;
        for (i, c) in self.chans.iter_mut().enumerate() {
            if uplink_down & bit(i) != 0 {
                // Down already, and nothing of it counts until the uplink is back.
                continue;
            }
            match c.state {
                LinkState::Up => {
                    let silent = c
                        .last_rx
                        .map_or(dead + dead, |l| now - faster_at.map_or(l, |f| f.max(l)));
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
        let dead = self.dead_after_now();
        let ch = &mut self.chans[c];
        let mut back = false;
        if ch.state == LinkState::Down {
            let gap = ch.last_rx.is_none_or(|l| now - l > dead);
            if ch.run_start.is_none() || gap {
                back = ch.run_start.is_none();
                ch.run_start = Some(now);
            }
        }
        ch.last_rx = Some(now);
        // A down channel heard again while idle: the usual heartbeat until it has
        // rejoined (hellos now), so an idle tunnel takes it back as soon as a busy one.
        if back && self.idle {
            self.idle = false;
            self.next_hello = self.clock;
        }
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
        let interval = Duration::from_micros(u64::from(h.interval_us));
        if interval < self.peer.interval {
            self.peer.faster_at = Some(now);
        }
        self.peer.interval = interval;
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
