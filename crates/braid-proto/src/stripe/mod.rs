//! The sender: the striper.
//!
//! [`Striper`] takes packets from the application, picks a channel for each with the
//! configured scheduler, and queues [`Transmit`]s for the driver: data (header-free, or
//! behind a sequence header in `seq` mode), markers every K rounds and after idle time,
//! and TRR triggers every N packets.
//!
//! Call order for a driver: [`Striper::handle_packet`] for each packet from the
//! application, then drain [`Striper::poll_transmit`]; arm a timer for
//! [`Striper::poll_timeout`] and call [`Striper::handle_timeout`] when it fires (then
//! drain again).

use std::collections::VecDeque;

use bytes::Bytes;

use crate::arena::Arena;
use crate::config::{ConfigError, MarkerPosition, Mode, Policy, StripeConfig};
use crate::sched::baseline::Baseline;
use crate::sched::Sched;
use crate::stats::Stats;
use crate::time::Duration;
use crate::time::Instant;
use crate::wire::{self, marker, trigger};

/// What a [`Transmit`] carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransmitKind {
    /// An application packet.
    Data,
    /// A marker.
    Marker,
    /// A TRR trigger.
    Trigger,
    /// A data packet sent again after a NAK (`seq` mode with repair).
    Repair,
}

/// One datagram to put on one channel: `header()` followed by `payload`.
#[derive(Clone, Debug)]
pub struct Transmit {
    /// Channel index.
    pub channel: usize,
    /// What it is.
    pub kind: TransmitKind,
    header: [u8; wire::seq::HEADER_LEN],
    header_len: u8,
    /// The bytes after the header (the whole datagram for markers and plain data).
    pub payload: Bytes,
}

impl Transmit {
    /// Bytes to put before the payload (a sequence header or an escape byte; often empty).
    pub fn header(&self) -> &[u8] {
        &self.header[..self.header_len as usize]
    }

    /// Length on the wire.
    pub fn len(&self) -> usize {
        self.header_len as usize + self.payload.len()
    }

    /// Never true: every datagram has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole datagram as one buffer (no copy when there is no header).
    pub fn to_bytes(&self) -> Bytes {
        if self.header_len == 0 {
            self.payload.clone()
        } else {
            let mut v = Vec::with_capacity(self.len());
            v.extend_from_slice(self.header());
            v.extend_from_slice(&self.payload);
            Bytes::from(v)
        }
    }
}

/// Why a packet was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// Empty packets cannot be striped (a datagram needs a first byte).
    #[error("empty packet")]
    Empty,
    /// Larger than `max_packet` once framed.
    #[error("packet of {len} bytes on the wire exceeds max_packet {max}")]
    TooLarge {
        /// Framed length.
        len: usize,
        /// The limit.
        max: u32,
    },
}

enum Chooser {
    Causal(Sched),
    Baseline(Baseline),
}

/// The striping sender. See the module docs for the call order.
pub struct Striper {
    cfg: StripeConfig,
    chooser: Chooser,
    out: VecDeque<Transmit>,
    /// Data packets sent so far (in `seq` mode also the next sequence number).
    sent: u64,
    channel_count: Vec<u64>,
    /// TRR: running digest of each channel's data packets.
    digest: Vec<u64>,
    backlog: Vec<u64>,
    last_marker_round: Option<u64>,
    last_data: Option<Instant>,
    idle_flushed: bool,
    /// When the first data packet since the last markers (or triggers) was sent.
    unmarked_since: Option<Instant>,
    epoch: u32,
    /// Markers/triggers sent together carry the same batch number.
    batch: u32,
    /// `seq` mode with repair: the last packets sent, oldest first, for NAKs.
    sent_ring: VecDeque<(u64, Bytes, bool)>,
    ring_limit: usize,
    /// Adaptive weights: quanta waiting for the next marker batch.
    pending_quanta: Option<Vec<u32>>,
    /// Once the quanta have changed, every marker carries its channel's quantum.
    announce_quanta: bool,
    /// The latest `now` given to us (markers are stamped with it).
    clock: Instant,
    /// The peer has seen no loss for a while: markers at `quiet_interval` (see
    /// [`Striper::set_quiet`]).
    quiet: bool,
    /// Periodic markers in force: every this many rounds (0: none) and at least this
    /// often while data flows ([`marker_schedule`] of the config and `quiet`).
    every_rounds: u32,
    max_interval: Option<Duration>,
    /// Where markers and triggers are written.
    arena: Arena,
    stats: Stats,
}

impl Striper {
    /// A striper for a validated configuration.
    pub fn new(cfg: StripeConfig) -> Result<Striper, ConfigError> {
        cfg.validate()?;
        let n = cfg.channels();
        let chooser = match cfg.policy {
            Policy::Causal(kind) => Chooser::Causal(Sched::new(kind, &cfg.weights)),
            Policy::Baseline(kind) => Chooser::Baseline(Baseline::new(kind, n)),
        };
        Ok(Striper {
            chooser,
            // Grown on the first packets: an idle session holds no room.
            out: VecDeque::new(),
            sent: 0,
            channel_count: vec![0; n],
            digest: vec![0; n],
            backlog: vec![0; n],
            last_marker_round: None,
            last_data: None,
            idle_flushed: true,
            unmarked_since: None,
            quiet: false,
            every_rounds: cfg.markers.every_rounds,
            max_interval: cfg.markers.max_interval,
            epoch: 0,
            batch: 0,
            sent_ring: VecDeque::new(),
            ring_limit: if cfg.mode == Mode::Seq && cfg.receiver.repair.is_some() {
                cfg.receiver.buffer_packets
            } else {
                0
            },
            pending_quanta: None,
            announce_quanta: false,
            clock: Instant::ZERO,
            arena: Arena::new(),
            stats: Stats::new(n),
            cfg,
        })
    }

    /// Change the SRR quanta (adaptive weights), one per channel, each at least
    /// `max_packet`. The change takes effect at the next marker batch (trigger batch
    /// in TRR mode): every channel's marker or trigger then carries its new quantum
    /// (and so does every later one, so a lost one is made good by the next), and each
    /// channel's quantum is added with the new value from the first end of a visit
    /// after it. The receiver reads the marker or trigger before any data sent after it
    /// (channels are FIFO), so its simulation of the sender stays exact. In mode `none`
    /// nobody simulates the sender and the change is immediate.
    ///
    /// Only SRR: RR, GRR and random do not weigh by bytes.
    pub fn set_quanta(&mut self, quanta: &[u32]) -> Result<(), ConfigError> {
        if self.cfg.policy != Policy::Causal(crate::sched::SchedulerKind::Srr) {
            return Err(ConfigError::Quanta("they need the srr scheduler".into()));
        }
        if quanta.len() != self.cfg.channels() {
            return Err(ConfigError::Quanta(format!(
                "{} quanta for {} channels",
                quanta.len(),
                self.cfg.channels()
            )));
        }
        if let Some((c, q)) = quanta
            .iter()
            .enumerate()
            .find(|(_, &q)| q < self.cfg.max_packet)
        {
            return Err(ConfigError::Quanta(format!(
                "quantum {q} of channel {c} is below max_packet {}",
                self.cfg.max_packet
            )));
        }
        self.pending_quanta = Some(quanta.to_vec());
        if !self.markers_on() && self.cfg.mode != Mode::Trr {
            self.apply_quanta();
        }
        Ok(())
    }

    /// The quanta in force (SRR), or `None` for other schedulers.
    pub fn quanta(&self) -> Option<Vec<u32>> {
        match &self.chooser {
            Chooser::Causal(Sched::Srr(s)) => {
                Some((0..s.channels()).map(|c| s.quantum(c) as u32).collect())
            }
            _ => None,
        }
    }

    /// The SRR quantum of channel `k` (its index in the stripe) in force, if SRR.
    pub fn quantum(&self, k: usize) -> Option<u32> {
        match &self.chooser {
            Chooser::Causal(Sched::Srr(s)) if k < s.channels() => {
                Some(s.quantum(k).clamp(0, i64::from(u32::MAX)) as u32)
            }
            _ => None,
        }
    }

    fn apply_quanta(&mut self) {
        let (Some(q), Chooser::Causal(Sched::Srr(s))) =
            (self.pending_quanta.take(), &mut self.chooser)
        else {
            return;
        };
        for (c, &q) in q.iter().enumerate() {
            s.set_quantum(c, q);
        }
        self.announce_quanta = true;
    }

    /// The configuration.
    pub fn config(&self) -> &StripeConfig {
        &self.cfg
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Data packets accepted so far.
    pub fn packets_sent(&self) -> u64 {
        self.sent
    }

    /// Tell the striper how many bytes wait in a channel's transmit queue (read only by
    /// the shortest-queue-first baseline).
    pub fn set_backlog(&mut self, channel: usize, bytes: u64) {
        if let Some(b) = self.backlog.get_mut(channel) {
            *b = bytes;
        }
    }

    /// Set the channel-set epoch carried by markers and triggers from now on; NAKs for
    /// any other epoch are ignored.
    pub fn set_epoch(&mut self, epoch: u32) {
        self.epoch = epoch;
    }

    /// The epoch carried by markers and triggers.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// The causal scheduler's state, if the policy is causal.
    pub fn scheduler(&self) -> Option<&Sched> {
        match &self.chooser {
            Chooser::Causal(s) => Some(s),
            Chooser::Baseline(_) => None,
        }
    }

    fn markers_on(&self) -> bool {
        matches!(self.cfg.mode, Mode::Logical | Mode::Seq)
            && matches!(self.chooser, Chooser::Causal(_))
    }

    /// The channel [`Striper::handle_packet`] will put `payload` on if it is the next
    /// packet (credit-based flow control asks before it sends).
    pub fn next_channel(&self, payload: &[u8]) -> usize {
        match &self.chooser {
            Chooser::Causal(s) => s.select(),
            Chooser::Baseline(b) => b.select(payload, &self.backlog),
        }
    }

    /// Stripe one packet from the application.
    pub fn handle_packet(&mut self, now: Instant, payload: Bytes) -> Result<(), SendError> {
        self.clock = self.clock.max(now);
        let (header, header_len) = self.frame(&payload)?;
        let wire_len = header_len + payload.len();
        self.control_before();
        let channel = match &mut self.chooser {
            Chooser::Causal(s) => s.select(),
            Chooser::Baseline(b) => b.select(&payload, &self.backlog),
        };
        let round_before = match &mut self.chooser {
            Chooser::Causal(s) => {
                let r = s.round();
                s.on_sent(wire_len);
                Some(r)
            }
            Chooser::Baseline(_) => None,
        };
        self.account_data(channel, wire_len, &payload);
        self.out.push_back(Transmit {
            channel,
            kind: TransmitKind::Data,
            header,
            header_len: header_len as u8,
            payload,
        });
        self.last_data = Some(now);
        self.idle_flushed = false;
        self.unmarked_since.get_or_insert(now);
        if let Some(before) = round_before {
            self.markers_after(before);
        }
        Ok(())
    }

    /// The header `payload` travels behind (a sequence header in `seq` mode, an escape
    /// byte for data starting with `0xB_`, or nothing) and its length; checks the size.
    fn frame(&self, payload: &[u8]) -> Result<([u8; wire::seq::HEADER_LEN], usize), SendError> {
        if payload.is_empty() {
            return Err(SendError::Empty);
        }
        let mut header = [0u8; wire::seq::HEADER_LEN];
        let header_len = match self.cfg.mode {
            Mode::Seq => {
                wire::seq::Repr {
                    seq: self.sent as u32,
                    repair: false,
                }
                .emit(&mut header);
                wire::seq::HEADER_LEN
            }
            _ if wire::needs_escape(payload) => {
                header[0] = wire::TYPE_ESCAPE;
                1
            }
            _ => 0,
        };
        let wire_len = header_len + payload.len();
        if wire_len > self.cfg.max_packet as usize {
            return Err(SendError::TooLarge {
                len: wire_len,
                max: self.cfg.max_packet,
            });
        }
        Ok((header, header_len))
    }

    /// Markers or triggers that belong before the next data packet.
    fn control_before(&mut self) {
        if self.cfg.mode == Mode::Trr
            && self.sent > 0
            && self.sent.is_multiple_of(u64::from(self.cfg.trigger_every))
        {
            self.emit_triggers();
        }
        let every = self.every_rounds;
        if !self.markers_on() || every == 0 {
            return;
        }
        let Chooser::Causal(s) = &self.chooser else {
            return;
        };
        let at = match self.cfg.markers.position {
            MarkerPosition::Start => 0,
            MarkerPosition::Channel(c) => c,
            MarkerPosition::End => return,
        };
        let round = s.round();
        if s.pointer() == at
            && round.is_multiple_of(u64::from(every))
            && self.last_marker_round != Some(round)
        {
            self.last_marker_round = Some(round);
            self.emit_markers();
        }
    }

    /// Markers at the end of a round: the packet just sent (in round `before`) ended it.
    fn markers_after(&mut self, before: u64) {
        let every = self.every_rounds;
        if !self.markers_on() || every == 0 || self.cfg.markers.position != MarkerPosition::End {
            return;
        }
        if let Chooser::Causal(s) = &self.chooser {
            let round = s.round();
            if round != before && round.is_multiple_of(u64::from(every)) {
                self.last_marker_round = Some(round);
                self.emit_markers();
            }
        }
    }

    /// Count a data packet of `wire_len` bytes sent on `channel` (and keep it for
    /// repair, fold it into the channel's TRR digest).
    fn account_data(&mut self, channel: usize, wire_len: usize, payload: &Bytes) {
        if self.ring_limit > 0 {
            if self.sent_ring.len() == self.ring_limit {
                self.sent_ring.pop_front();
            }
            self.sent_ring
                .push_back((self.sent, payload.clone(), false));
        }
        let st = &mut self.stats.channels[channel];
        st.bytes_sent += wire_len as u64;
        st.packets_sent += 1;
        self.channel_count[channel] += 1;
        if self.cfg.mode == Mode::Trr {
            self.digest[channel] = trigger::fold(
                self.digest[channel],
                trigger::fingerprint(wire_len, payload),
            );
        }
        self.sent += 1;
    }

    /// A NAK arrived from the receiver (`seq` mode with repair): queue every named
    /// packet that is still kept, once on every channel. Each packet is repaired at most
    /// once (NAKs come on several channels; a number named again is counted in
    /// `repeat_naks`), so one lost packet costs one repair per channel, whatever the
    /// number of NAK copies. Returns how many packets were
    /// repaired; a NAK that does not parse, or names packets no longer kept, is ignored.
    /// So is a NAK for another epoch than [`Striper::epoch`] (its numbers count another
    /// epoch's packets); it is counted in `stale_naks`.
    pub fn handle_nak(&mut self, datagram: &[u8]) -> usize {
        let Ok(nak) = wire::nak::Repr::parse(datagram) else {
            return 0;
        };
        if nak.epoch != self.epoch {
            self.stats.stale_naks += 1;
            return 0;
        }
        let Some(&(first, _, _)) = self.sent_ring.front() else {
            return 0;
        };
        let mut repaired = 0;
        for seq in nak.seqs {
            let Some(i) = seq.checked_sub(first) else {
                continue;
            };
            let Some((s, payload, done)) = self.sent_ring.get_mut(i as usize) else {
                continue;
            };
            debug_assert_eq!(*s, seq);
            if *done {
                self.stats.repeat_naks += 1;
                continue;
            }
            *done = true;
            let payload = payload.clone();
            let mut header = [0u8; wire::seq::HEADER_LEN];
            wire::seq::Repr {
                seq: seq as u32,
                repair: true,
            }
            .emit(&mut header);
            for channel in 0..self.cfg.channels() {
                self.stats.channels[channel].repairs_sent += 1;
                self.out.push_back(Transmit {
                    channel,
                    kind: TransmitKind::Repair,
                    header,
                    header_len: wire::seq::HEADER_LEN as u8,
                    payload: payload.clone(),
                });
            }
            repaired += 1;
        }
        repaired
    }

    /// The next datagram to send, if any.
    #[inline]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.out.pop_front()
    }

    fn control_on(&self) -> bool {
        self.markers_on() || self.cfg.mode == Mode::Trr
    }

    fn idle_due(&self) -> Option<Instant> {
        if self.idle_flushed || !self.control_on() {
            return None;
        }
        Some(self.last_data? + self.cfg.markers.idle?)
    }

    fn interval_due(&self) -> Option<Instant> {
        if !self.control_on() {
            return None;
        }
        Some(self.unmarked_since? + self.max_interval?)
    }

    /// Thin the periodic markers out while the peer loses nothing (`quiet`), or send
    /// them as configured (not quiet, the start). A marker resynchronizes the receiver
    /// after a loss; on a channel that loses nothing it is overhead, 112 bytes on the
    /// wire a channel every interval whatever the channel's rate. The session decides
    /// from the peer's loss reports. Idle markers and TRR triggers are unchanged.
    pub fn set_quiet(&mut self, quiet: bool) {
        self.quiet = quiet;
        (self.every_rounds, self.max_interval) = marker_schedule(&self.cfg, quiet);
    }

    /// Whether markers are thinned out ([`Striper::set_quiet`]).
    pub fn quiet(&self) -> bool {
        self.quiet
    }

    /// When [`Striper::handle_timeout`] wants to be called (idle markers, and markers
    /// due by `max_interval`).
    pub fn poll_timeout(&self) -> Option<Instant> {
        match (self.idle_due(), self.interval_due()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Time passed: sends the markers (or triggers) that are due.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.clock = self.clock.max(now);
        let idle = self.idle_due().is_some_and(|t| now >= t);
        let interval = self.interval_due().is_some_and(|t| now >= t);
        if idle {
            self.idle_flushed = true;
        }
        if idle || interval {
            self.flush();
        }
    }

    /// Send markers (or triggers in TRR mode) on every channel now, e.g. as heartbeats.
    pub fn flush(&mut self) {
        match self.cfg.mode {
            Mode::Trr => self.emit_triggers(),
            _ if self.markers_on() => self.emit_markers(),
            _ => {}
        }
    }

    fn emit_markers(&mut self) {
        self.apply_quanta();
        let Chooser::Causal(s) = &self.chooser else {
            return;
        };
        self.unmarked_since = None;
        self.batch = self.batch.wrapping_add(1);
        for c in 0..self.cfg.channels() {
            let position = s.position(c);
            let quantum_change = match s {
                Sched::Srr(srr) if self.announce_quanta => {
                    Some((srr.quantum(c) as u32, position.round))
                }
                _ => None,
            };
            let repr = marker::Repr {
                channel: c as u8,
                epoch: self.epoch,
                position,
                sent: self.sent,
                batch: self.batch,
                credits: None,
                quantum_change,
                // No stamp before we have been told the time (a new epoch's striper).
                stamp: (self.cfg.markers.timestamps && self.clock > Instant::ZERO)
                    .then(|| self.clock.as_micros()),
            };
            self.stats.channels[c].markers_sent += 1;
            self.out.push_back(Transmit {
                channel: c,
                kind: TransmitKind::Marker,
                header: [0; wire::seq::HEADER_LEN],
                header_len: 0,
                payload: self
                    .arena
                    .fill(self.clock, repr.buffer_len(), |b| repr.emit(b)),
            });
        }
    }

    fn emit_triggers(&mut self) {
        self.apply_quanta();
        let Chooser::Causal(s) = &self.chooser else {
            return;
        };
        self.unmarked_since = None;
        self.batch = self.batch.wrapping_add(1);
        let next = s.select() as u8;
        for c in 0..self.cfg.channels() {
            let repr = trigger::Repr {
                channel: c as u8,
                next_stripe: next,
                epoch: self.epoch,
                position: s.position(c),
                sent: self.sent,
                channel_count: self.channel_count[c],
                digest: self.digest[c],
                batch: self.batch,
                stamp: (self.cfg.markers.timestamps && self.clock > Instant::ZERO)
                    .then(|| self.clock.as_micros()),
                quantum: match s {
                    Sched::Srr(srr) if self.announce_quanta => Some(srr.quantum(c) as u32),
                    _ => None,
                },
            };
            self.stats.channels[c].triggers_sent += 1;
            self.out.push_back(Transmit {
                channel: c,
                kind: TransmitKind::Trigger,
                header: [0; wire::seq::HEADER_LEN],
                header_len: 0,
                payload: self
                    .arena
                    .fill(self.clock, repr.buffer_len(), |b| repr.emit(b)),
            });
        }
    }
}

/// The periodic markers of `cfg`, quiet or not: every `every_rounds` rounds and at
/// least every `max_interval`, or while quiet every `quiet_interval` (never for TRR's
/// triggers, which release the receiver's data) and every `every_rounds` times
/// `quiet_interval / max_interval` (rounded), so rounds and time thin out alike.
fn marker_schedule(cfg: &StripeConfig, quiet: bool) -> (u32, Option<Duration>) {
    let m = &cfg.markers;
    match (
        quiet && cfg.mode != Mode::Trr,
        m.max_interval,
        m.quiet_interval,
    ) {
        (true, Some(iv), Some(q)) if q > iv => {
            let times = (q.as_secs_f64() / iv.as_secs_f64()).round() as u32;
            (m.every_rounds.saturating_mul(times.max(1)), Some(q))
        }
        _ => (m.every_rounds, m.max_interval),
    }
}
