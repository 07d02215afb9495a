//! The receiver: the resequencer.
//!
//! Datagrams from the channels go into per-channel buffers (physical reception); the
//! mode's engine takes them out in sender order (logical reception) and queues them for
//! the application. Four modes ([`Mode`]):
//!
//! * `none`: arrival order, the baseline;
//! * `logical`: header-free logical reception with marker resynchronization;
//! * `seq`: guaranteed FIFO, exactly once, with logical reception as the fast path;
//! * `trr`: trigger-verified segments, never out of order, loss allowed.
//!
//! Call order for a driver: [`Resequencer::handle_datagram`] for each datagram, then
//! drain [`Resequencer::poll_deliver`]; arm a timer for [`Resequencer::poll_timeout`]
//! and call [`Resequencer::handle_timeout`] when it fires (then drain again).
//!
//! Memory is bounded by `buffer_packets` per channel: an arrival into a full buffer first
//! forces progress (the awaited packet is declared lost), and is dropped and counted if
//! the buffer is still full.
//!
//! # Structure
//!
//! The [`Resequencer`] is the front end every mode shares: the delay equalizer, parsing
//! and validation, the per-channel receive counters. What is left, a parsed data packet
//! or marker ([`Item`]), goes to the mode's engine, one type per mode, each implementing
//! [`ModeEngine`]: [`Arrival`] here (`none`), `logical::Logical`, `seq::Seq` and
//! `trr::Trr`. Engines hand packets to the application through [`Sink::deliver`], the
//! one place where deliveries are counted.

mod equalize;
mod follow;
mod logical;
mod seq;
mod trr;

use std::collections::VecDeque;

use bytes::Bytes;

use crate::config::{ConfigError, Mode, Policy, StripeConfig};
use crate::sched::{Position, Sched};
use crate::stats::Stats;
use crate::time::{Duration, Instant};
use crate::wire::{self, marker, trigger, Kind};

/// A parsed datagram waiting in a channel buffer.
#[derive(Debug)]
pub(crate) enum Item {
    Data {
        payload: Bytes,
        wire_len: u32,
        /// Extended sequence number (0 unless `sequenced`).
        seq: u64,
        /// The datagram carried a sequence header.
        sequenced: bool,
    },
    /// What the engines use of a marker: the implicit number of the channel's next
    /// packet, and the data packets sent before it. (Only this is kept, so that buffered
    /// items stay small.)
    Marker {
        position: Position,
        sent: u64,
        /// The channel's quantum from here on (adaptive weights), if announced.
        quantum: Option<u32>,
    },
}

/// Where engines put packets for the application, and the counters they update.
pub(crate) struct Sink {
    out: VecDeque<Bytes>,
    pub(crate) stats: Stats,
}

impl Sink {
    /// Hand `payload` to the application (the only place deliveries are counted).
    #[inline]
    pub(crate) fn deliver(&mut self, payload: Bytes) {
        self.stats.delivered_packets += 1;
        self.stats.delivered_bytes += payload.len() as u64;
        self.out.push_back(payload);
    }
}

/// One receiver mode. The front end has parsed, validated and counted the datagram;
/// the engine orders what it is given and delivers through the [`Sink`].
pub(crate) trait ModeEngine {
    /// A data packet or a marker arrived on `channel` (a valid channel index).
    fn accept(&mut self, now: Instant, channel: usize, item: Item, sink: &mut Sink);
    /// When [`ModeEngine::handle_timeout`] wants to be called.
    fn timeout(&self) -> Option<Instant>;
    /// The timer is due: give up on what has been awaited too long.
    fn handle_timeout(&mut self, now: Instant, sink: &mut Sink);
    /// Nothing more arrives: deliver what can be, count the rest as lost, keep nothing.
    fn drain(&mut self, now: Instant, sink: &mut Sink);
    /// Packets held, not yet deliverable.
    fn buffered(&self) -> usize;
    /// Items (data, markers, triggers) from `channel` held, not yet deliverable: what
    /// the channel's credit accounting counts as not yet forwarded.
    fn held_on(&self, channel: usize) -> usize;
    /// The channel whose next packet later data waits for, and since when (modes that
    /// wait for a channel: `logical`, `seq`).
    fn waiting(&self) -> Option<(usize, Instant)> {
        None
    }
}

/// Mode `none`: deliver in arrival order.
pub(crate) struct Arrival {
    /// Highest sequence number delivered so far, to count misorderings.
    highest_seq: Option<u64>,
}

impl ModeEngine for Arrival {
    #[inline]
    fn accept(&mut self, _: Instant, _: usize, item: Item, sink: &mut Sink) {
        let Item::Data {
            payload,
            seq,
            sequenced,
            ..
        } = item
        else {
            return;
        };
        if sequenced {
            match self.highest_seq {
                Some(h) if seq < h => sink.stats.out_of_order += 1,
                _ => self.highest_seq = Some(seq),
            }
        }
        sink.deliver(payload);
    }
    fn timeout(&self) -> Option<Instant> {
        None
    }
    fn handle_timeout(&mut self, _: Instant, _: &mut Sink) {}
    fn drain(&mut self, _: Instant, _: &mut Sink) {}
    fn buffered(&self) -> usize {
        0
    }
    fn held_on(&self, _: usize) -> usize {
        0
    }
}

/// The mode's engine.
enum Engine {
    None(Arrival),
    Logical(logical::Logical),
    Seq(seq::Seq),
    Trr(trr::Trr),
}

impl Engine {
    fn get(&self) -> &dyn ModeEngine {
        match self {
            Engine::None(e) => e,
            Engine::Logical(e) => e,
            Engine::Seq(e) => e,
            Engine::Trr(e) => e,
        }
    }

    fn get_mut(&mut self) -> &mut dyn ModeEngine {
        match self {
            Engine::None(e) => e,
            Engine::Logical(e) => e,
            Engine::Seq(e) => e,
            Engine::Trr(e) => e,
        }
    }

    /// The per-packet path: dispatched statically, so each engine's `accept` inlines.
    #[inline(always)]
    fn accept(&mut self, now: Instant, channel: usize, item: Item, sink: &mut Sink) {
        match self {
            Engine::None(e) => e.accept(now, channel, item, sink),
            Engine::Logical(e) => e.accept(now, channel, item, sink),
            Engine::Seq(e) => e.accept(now, channel, item, sink),
            Engine::Trr(e) => e.accept(now, channel, item, sink),
        }
    }

    /// The value a wrapped sequence number is extended towards.
    fn seq_reference(&self) -> u64 {
        match self {
            Engine::Seq(q) => q.expected(),
            Engine::None(a) => a.highest_seq.map_or(0, |h| h + 1),
            _ => 0,
        }
    }
}

/// A datagram after parsing and validation.
enum Input {
    /// Data or a marker, for the engine.
    Item(Item),
    /// A TRR trigger.
    Trigger(trigger::Repr),
    /// A repaired packet: wrapped sequence number and payload.
    Repair(u32, Bytes),
}

/// The receiving side of a striping session.
pub struct Resequencer {
    mode: Mode,
    limit: usize,
    engine: Engine,
    sink: Sink,
    equalizer: Option<equalize::Equalizer>,
    /// Channel-set epoch written into NAKs.
    epoch: u32,
}

impl Resequencer {
    /// A resequencer for a validated configuration.
    pub fn new(cfg: &StripeConfig) -> Result<Resequencer, ConfigError> {
        cfg.validate()?;
        let n = cfg.channels();
        let sched = match cfg.policy {
            Policy::Causal(kind) => Some(Sched::new(kind, &cfg.weights)),
            Policy::Baseline(_) => None,
        };
        let rx = &cfg.receiver;
        let buffered = |s| logical::Buffered::new(s, n, rx.buffer_packets, rx.max_wait);
        // validate() guarantees a causal scheduler for every mode but `none`.
        let engine = match (cfg.mode, sched) {
            (Mode::None, _) => Engine::None(Arrival { highest_seq: None }),
            (Mode::Logical, Some(s)) => Engine::Logical(logical::Logical::new(buffered(s))),
            (Mode::Seq, Some(s)) => Engine::Seq(seq::Seq::new(buffered(s), rx.repair)),
            (Mode::Trr, Some(Sched::Srr(s))) => {
                Engine::Trr(trr::Trr::new(s, rx.buffer_packets, rx.max_wait))
            }
            _ => return Err(ConfigError::TrrNeedsRoundRobin),
        };
        Ok(Resequencer {
            mode: cfg.mode,
            limit: rx.buffer_packets,
            engine,
            sink: Sink {
                // Grown on the first data: an idle session holds no room.
                out: VecDeque::new(),
                stats: Stats::new(n),
            },
            equalizer: (rx.equalize && cfg.mode != Mode::None).then(|| equalize::Equalizer::new(n)),
            epoch: 0,
        })
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Set the channel-set epoch this resequencer receives (0 at first). It goes into
    /// every NAK, so that the peer's striper (see `Striper::set_epoch`) can ignore NAKs
    /// for an epoch it has left.
    pub fn set_epoch(&mut self, epoch: u32) {
        self.epoch = epoch;
    }

    /// The epoch written into NAKs.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.sink.stats
    }

    /// The next packet for the application, in order.
    #[inline]
    pub fn poll_deliver(&mut self) -> Option<Bytes> {
        self.sink.out.pop_front()
    }

    /// Packets held in channel buffers (not yet deliverable).
    pub fn buffered(&self) -> usize {
        self.engine.get().buffered() + self.equalizer.as_ref().map_or(0, |e| e.held())
    }

    /// The channel whose next packet the receiver waits for while later data is held,
    /// and for how long so far (`None`: nothing held back waits for a channel).
    pub fn waiting(&self, now: Instant) -> Option<(usize, Duration)> {
        self.engine
            .get()
            .waiting()
            .map(|(c, since)| (c, now.saturating_since(since)))
    }

    /// Datagrams from `channel` held in the delay equalizer and the channel's buffer:
    /// what credit-based flow control counts as not yet forwarded (seq mode's repair
    /// store, bounded on its own, is not counted). 0 for an unknown channel.
    pub fn held_on(&self, channel: usize) -> usize {
        self.engine.get().held_on(channel)
            + self.equalizer.as_ref().map_or(0, |e| e.held_on(channel))
    }

    /// With delay equalization on, how long each channel's datagrams are held now.
    pub fn equalizer_holds(&self, now: Instant) -> Option<Vec<Duration>> {
        self.equalizer.as_ref().map(|e| {
            e.holds_us(now)
                .into_iter()
                .map(Duration::from_micros)
                .collect()
        })
    }

    /// How long the delay equalizer holds a datagram arriving now on `channel` for the
    /// channels' skew alone (without the margin of [`Resequencer::set_hold_margin`]);
    /// zero with equalization off or for an unknown channel.
    pub fn equalizer_skew(&self, now: Instant, channel: usize) -> Duration {
        match &self.equalizer {
            Some(e) if channel < self.sink.stats.channels.len() => e.skew(now, channel),
            _ => Duration::ZERO,
        }
    }

    /// Hold every channel this much longer in the delay equalizer (when it is on): a
    /// playout margin that absorbs short holds before the resequencer, such as in-bond
    /// repair's, so the traffic sees a steady delay instead of a stall at each repair.
    pub fn set_hold_margin(&mut self, margin: Duration) {
        if let Some(e) = &mut self.equalizer {
            e.set_margin(margin);
        }
    }

    /// A datagram arrived on `channel`. Anything that cannot be parsed is counted as
    /// malformed and dropped; this never panics.
    pub fn handle_datagram(&mut self, now: Instant, channel: usize, datagram: Bytes) {
        self.handle_datagram_at(now, now, channel, datagram)
    }

    /// A datagram that arrived on `channel` at `arrived` (at or before `now`) and was
    /// held since, e.g. behind a loss that in-bond repair filled. The delay equalizer
    /// times it from `arrived`, so a hold shorter than its margin
    /// ([`Resequencer::set_hold_margin`]) costs no extra delay.
    pub fn handle_datagram_at(
        &mut self,
        now: Instant,
        arrived: Instant,
        channel: usize,
        datagram: Bytes,
    ) {
        let arrived = arrived.min(now);
        let Some(eq) = &mut self.equalizer else {
            return self.ingest(now, channel, datagram);
        };
        if channel >= self.sink.stats.channels.len() {
            self.sink.stats.malformed += 1;
            return;
        }
        if datagram.first() == Some(&wire::TYPE_REPAIR) {
            // Repairs are late by nature: no hold.
            return self.ingest(now, channel, datagram);
        }
        let batch = match datagram.first() {
            Some(&wire::TYPE_MARKER) => marker::Packet::new_checked(&datagram[..])
                .ok()
                .map(|p| p.batch()),
            Some(&wire::TYPE_TRIGGER) => trigger::Packet::new_checked(&datagram[..])
                .ok()
                .map(|p| p.batch()),
            _ => None,
        };
        if let Some(batch) = batch {
            eq.on_marker(arrived, channel, batch);
        }
        let now_through = eq.push(now, arrived, channel, datagram, self.limit);
        if let Some(d) = now_through {
            self.ingest(now, channel, d);
        }
        self.release_held(now);
    }

    /// Nothing more comes on `channel` in this epoch: its next packet would have been
    /// number `next` (round and deficit counter, as a marker says), and the sender had
    /// sent `sent` data packets on all channels by then. The receiver then delivers what
    /// it holds from the other channels in order instead of waiting for this one.
    ///
    /// This has exactly the effect of a marker `(next, sent)` arriving on `channel`
    /// behind everything received on it so far (it is queued behind data the delay
    /// equalizer still holds, and counted in `markers_received`), which is what it
    /// stands for. Only modes `logical` and `seq` use markers: in the others, and when
    /// `next.dc <= 0` (no valid position), this does nothing.
    pub fn end_channel(&mut self, now: Instant, channel: usize, next: Position, sent: u64) {
        if !matches!(self.mode, Mode::Logical | Mode::Seq) || next.dc <= 0 {
            return;
        }
        let end = marker::Repr {
            channel: channel as u8,
            epoch: self.epoch,
            position: next,
            sent,
            batch: 0,
            credits: None,
            quantum_change: None,
            stamp: None,
        };
        // Through the datagram path, so that it queues behind held data like a marker.
        self.handle_datagram(now, channel, Bytes::from(end.to_vec()));
    }

    fn release_held(&mut self, now: Instant) {
        while let Some((c, d)) = self.equalizer.as_mut().and_then(|e| e.pop_due(now)) {
            self.ingest(now, c, d);
        }
    }

    /// Parse, validate and count a datagram, and hand it to the engine.
    #[inline]
    fn ingest(&mut self, now: Instant, channel: usize, datagram: Bytes) {
        if channel >= self.sink.stats.channels.len() {
            self.sink.stats.malformed += 1;
            return;
        }
        let Some(input) = self.parse(channel, datagram) else {
            self.sink.stats.malformed += 1;
            self.sink.stats.channels[channel].malformed += 1;
            return;
        };
        let st = &mut self.sink.stats.channels[channel];
        match input {
            Input::Item(item) => {
                match &item {
                    Item::Data { wire_len, .. } => {
                        st.packets_received += 1;
                        st.bytes_received += u64::from(*wire_len);
                    }
                    Item::Marker { .. } => st.markers_received += 1,
                }
                self.engine.accept(now, channel, item, &mut self.sink);
            }
            Input::Trigger(t) => {
                st.triggers_received += 1;
                if let Engine::Trr(trr) = &mut self.engine {
                    trr.on_trigger(now, channel, &t, &mut self.sink);
                }
            }
            Input::Repair(wrapped, payload) => {
                let Engine::Seq(q) = &mut self.engine else {
                    unreachable!("parse() accepts repairs only in seq mode with repair")
                };
                q.on_repair(now, wrapped, payload, &mut self.sink);
            }
        }
    }

    /// What `datagram`, received on `channel`, is; `None` if it is malformed (or, like
    /// a NAK or a repair without repair configured, has no business here).
    #[inline]
    fn parse(&self, channel: usize, datagram: Bytes) -> Option<Input> {
        let kind = wire::classify(&datagram).ok()?;
        let wire_len = datagram.len() as u32;
        let data = |payload, seq, sequenced| {
            Some(Input::Item(Item::Data {
                payload,
                wire_len,
                seq,
                sequenced,
            }))
        };
        match kind {
            Kind::Data => data(datagram, 0, false),
            Kind::Escaped => data(datagram.slice(1..), 0, false),
            Kind::SeqData => {
                let wrapped = wire::seq::Packet::new_checked(&datagram[..]).ok()?.seq();
                let seq = wire::seq::extend(wrapped, self.engine.seq_reference());
                data(datagram.slice(wire::seq::HEADER_LEN..), seq, true)
            }
            Kind::Repair => {
                let wrapped = wire::seq::Packet::new_checked(&datagram[..]).ok()?.seq();
                let repairing = matches!(&self.engine, Engine::Seq(q) if q.repairs());
                repairing.then(|| Input::Repair(wrapped, datagram.slice(wire::seq::HEADER_LEN..)))
            }
            Kind::Marker => {
                let p = marker::Packet::new_checked(&datagram[..]).ok()?;
                let m = marker::Repr::parse(&p).ok()?;
                let item = Item::Marker {
                    position: m.position,
                    sent: m.sent,
                    quantum: m.quantum_change.map(|(q, _)| q),
                };
                (m.channel as usize == channel).then_some(Input::Item(item))
            }
            Kind::Trigger => {
                let p = trigger::Packet::new_checked(&datagram[..]).ok()?;
                let t = trigger::Repr::parse(&p).ok()?;
                (t.channel as usize == channel).then_some(Input::Trigger(t))
            }
            Kind::Nak => None,
        }
    }

    /// When [`Resequencer::handle_timeout`] wants to be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let held = self.equalizer.as_ref().and_then(|e| e.next_due());
        match (self.engine.get().timeout(), held) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A NAK to send to the peer's striper (on every channel), if repair found
    /// numbers missing since the last call. It carries [`Resequencer::epoch`].
    pub fn poll_nak(&mut self) -> Option<Bytes> {
        let Engine::Seq(q) = &mut self.engine else {
            return None;
        };
        let seqs = q.take_nak(wire::nak::MAX_SEQS)?;
        self.sink.stats.naks_sent += seqs.len() as u64;
        let nak = wire::nak::Repr {
            epoch: self.epoch,
            seqs,
        };
        Some(Bytes::from(nak.to_vec()))
    }

    /// No more datagrams will arrive (the channel set is being replaced, or the session
    /// ends): deliver everything still deliverable, in order, and count the rest as
    /// lost. Afterwards the buffers are empty. In `trr` mode, packets of segments that no
    /// trigger verified are dropped (their order cannot be known).
    pub fn drain(&mut self, now: Instant) {
        if let Some(e) = &mut self.equalizer {
            for (c, d) in e.take_all() {
                self.ingest(now, c, d);
            }
        }
        self.engine.get_mut().drain(now, &mut self.sink);
    }

    /// Time passed: releases held datagrams that are due, and gives up on packets
    /// awaited longer than `max_wait`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.release_held(now);
        let engine = self.engine.get_mut();
        if engine.timeout().is_some_and(|due| now >= due) {
            engine.handle_timeout(now, &mut self.sink);
        }
    }
}
