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

mod equalize;
mod follow;
mod trr;

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;

use crate::config::{ConfigError, Mode, Policy, StripeConfig};
use crate::sched::{Position, Sched};
use crate::stats::Stats;
use crate::time::{Duration, Instant};
use crate::wire::{self, marker, seq, trigger, Kind};
use follow::Follower;

/// A parsed datagram waiting in a channel buffer.
#[derive(Debug)]
pub(crate) enum Item {
    Data {
        payload: Bytes,
        wire_len: u32,
        /// Extended sequence number (seq mode only).
        seq: u64,
    },
    Marker(marker::Repr),
}

/// The receiving side of a striping session.
pub struct Resequencer {
    mode: Mode,
    limit: usize,
    max_wait: Duration,
    engine: Engine,
    out: VecDeque<Bytes>,
    stats: Stats,
    equalizer: Option<equalize::Equalizer>,
    /// Channel-set epoch written into NAKs.
    epoch: u32,
}

enum Engine {
    None { highest_seq: Option<u64> },
    Logical(Buffered),
    Seq(SeqRx),
    Trr(trr::Trr),
}

/// `seq` mode: buffers and follower, plus what the sequence numbers add.
struct SeqRx {
    b: Buffered,
    /// Next sequence number to deliver.
    expected: u64,
    /// Per channel, the lowest sequence number that can still arrive on it.
    floor: Vec<u64>,
    /// Loss repair by NAK, if configured.
    repair: Option<Repair>,
}

impl SeqRx {
    fn run(&mut self, limit: usize, now: Instant, out: &mut VecDeque<Bytes>, stats: &mut Stats) {
        run_seq(
            &mut self.b,
            &mut self.expected,
            &mut self.floor,
            self.repair.as_mut(),
            limit,
            now,
            out,
            stats,
        );
    }
}

/// `seq` mode loss repair: NAK what is missing, wait a while for it.
struct Repair {
    /// How long to wait for a repaired packet.
    wait: Duration,
    /// Repaired packets waiting for their turn.
    store: BTreeMap<u64, Bytes>,
    /// Every number below this has been named in a NAK.
    naked_until: u64,
    /// Until when the current NAK is waited for.
    deadline: Option<Instant>,
    /// Numbers to put in the next NAK.
    out: Vec<u64>,
}

/// Per-channel buffers plus the follower that simulates the sender.
struct Buffered {
    bufs: Vec<VecDeque<Item>>,
    follow: Follower,
    /// Channel we are waiting on, and since when other data has been waiting.
    blocked: Option<(usize, Option<Instant>)>,
    /// Last time anything arrived on each channel.
    last_arrival: Vec<Instant>,
}

impl Buffered {
    /// Is anything held back? (In logical mode the awaited channel is empty, so this is
    /// data on other channels; in seq mode the awaited number may be missing while its
    /// channel holds later ones.) O(channels): a marker waiting at a head counts too.
    fn data_waiting(&self) -> bool {
        self.bufs.iter().any(|b| !b.is_empty())
    }

    fn any_full(&self, limit: usize) -> bool {
        self.bufs.iter().any(|q| q.len() >= limit)
    }

    fn note_blocked(&mut self, c: usize, now: Instant) {
        let waiting = self.data_waiting();
        let since = match self.blocked {
            Some((bc, since)) if bc == c => since,
            _ => None,
        };
        self.blocked = Some((c, if waiting { since.or(Some(now)) } else { None }));
    }
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
        let buffered = |sched: Sched| Buffered {
            bufs: (0..n).map(|_| VecDeque::with_capacity(64)).collect(),
            follow: Follower::new(sched),
            blocked: None,
            last_arrival: vec![Instant::ZERO; n],
        };
        // validate() guarantees a causal scheduler for every mode but `none`.
        let engine = match (cfg.mode, sched) {
            (Mode::None, _) => Engine::None { highest_seq: None },
            (Mode::Logical, Some(s)) => Engine::Logical(buffered(s)),
            (Mode::Seq, Some(s)) => Engine::Seq(SeqRx {
                b: buffered(s),
                expected: 0,
                floor: vec![0; n],
                repair: cfg.receiver.repair.map(|wait| Repair {
                    wait,
                    store: BTreeMap::new(),
                    naked_until: 0,
                    deadline: None,
                    out: Vec::new(),
                }),
            }),
            (Mode::Trr, Some(Sched::Srr(s))) => {
                Engine::Trr(trr::Trr::new(s, cfg.receiver.buffer_packets))
            }
            _ => return Err(ConfigError::TrrNeedsRoundRobin),
        };
        Ok(Resequencer {
            mode: cfg.mode,
            limit: cfg.receiver.buffer_packets,
            max_wait: cfg.receiver.max_wait,
            engine,
            out: VecDeque::with_capacity(64),
            stats: Stats::new(n),
            equalizer: (cfg.receiver.equalize && cfg.mode != Mode::None)
                .then(|| equalize::Equalizer::new(n)),
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
        &self.stats
    }

    /// The next packet for the application, in order.
    #[inline]
    pub fn poll_deliver(&mut self) -> Option<Bytes> {
        self.out.pop_front()
    }

    /// Packets held in channel buffers (not yet deliverable).
    pub fn buffered(&self) -> usize {
        let engine = match &self.engine {
            Engine::None { .. } => 0,
            Engine::Logical(b) | Engine::Seq(SeqRx { b, .. }) => {
                b.bufs.iter().map(|q| q.len()).sum()
            }
            Engine::Trr(t) => t.buffered(),
        };
        engine + self.equalizer.as_ref().map_or(0, |e| e.held())
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

    /// A datagram arrived on `channel`. Anything that cannot be parsed is counted as
    /// malformed and dropped; this never panics.
    pub fn handle_datagram(&mut self, now: Instant, channel: usize, datagram: Bytes) {
        let Some(eq) = &mut self.equalizer else {
            return self.ingest(now, channel, datagram);
        };
        if channel >= self.stats.channels.len() {
            self.stats.malformed += 1;
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
            eq.on_marker(now, channel, batch);
        }
        let now_through = eq.push(now, channel, datagram, self.limit);
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
        };
        // Through the datagram path, so that it queues behind held data like a marker.
        self.handle_datagram(now, channel, Bytes::from(end.to_vec()));
    }

    fn release_held(&mut self, now: Instant) {
        while let Some((c, d)) = self.equalizer.as_mut().and_then(|e| e.pop_due(now)) {
            self.ingest(now, c, d);
        }
    }

    fn ingest(&mut self, now: Instant, channel: usize, datagram: Bytes) {
        let n = self.stats.channels.len();
        if channel >= n {
            self.stats.malformed += 1;
            return;
        }
        let kind = match wire::classify(&datagram) {
            Ok(k) => k,
            Err(_) => return self.malformed(channel),
        };
        let wire_len = datagram.len() as u32;
        let item = match kind {
            Kind::Data => Item::Data {
                payload: datagram,
                wire_len,
                seq: 0,
            },
            Kind::Escaped => Item::Data {
                payload: datagram.slice(1..),
                wire_len,
                seq: 0,
            },
            Kind::SeqData => {
                let Ok(p) = seq::Packet::new_checked(&datagram[..]) else {
                    return self.malformed(channel);
                };
                let wrapped = p.seq();
                let reference = match &self.engine {
                    Engine::Seq(q) => q.expected,
                    Engine::None { highest_seq } => highest_seq.map_or(0, |h| h + 1),
                    _ => 0,
                };
                Item::Data {
                    payload: datagram.slice(seq::HEADER_LEN..),
                    wire_len,
                    seq: seq::extend(wrapped, reference),
                }
            }
            Kind::Nak => return self.malformed(channel),
            Kind::Repair => {
                let Ok(p) = seq::Packet::new_checked(&datagram[..]) else {
                    return self.malformed(channel);
                };
                let Engine::Seq(q) = &mut self.engine else {
                    return self.malformed(channel);
                };
                let Some(r) = q.repair.as_mut() else {
                    return self.malformed(channel);
                };
                let s = seq::extend(p.seq(), q.expected);
                if s < q.expected || r.store.contains_key(&s) || r.store.len() >= self.limit {
                    self.stats.stale_dropped += 1;
                    return;
                }
                r.store.insert(s, datagram.slice(seq::HEADER_LEN..));
                q.run(self.limit, now, &mut self.out, &mut self.stats);
                return;
            }
            Kind::Marker => {
                let parsed = marker::Packet::new_checked(&datagram[..])
                    .and_then(|p| marker::Repr::parse(&p));
                match parsed {
                    Ok(m) if m.channel as usize == channel => {
                        self.stats.channels[channel].markers_received += 1;
                        Item::Marker(m)
                    }
                    _ => return self.malformed(channel),
                }
            }
            Kind::Trigger => {
                let parsed = trigger::Packet::new_checked(&datagram[..])
                    .and_then(|p| trigger::Repr::parse(&p));
                match parsed {
                    Ok(t) if t.channel as usize == channel => {
                        self.stats.channels[channel].triggers_received += 1;
                        if let Engine::Trr(trr) = &mut self.engine {
                            trr.on_trigger(now, channel, &t, &mut self.out, &mut self.stats);
                        }
                        return;
                    }
                    _ => return self.malformed(channel),
                }
            }
        };
        if let Item::Data { wire_len, .. } = &item {
            let st = &mut self.stats.channels[channel];
            st.packets_received += 1;
            st.bytes_received += u64::from(*wire_len);
        }
        match &mut self.engine {
            Engine::None { highest_seq } => {
                if let Item::Data { payload, seq, .. } = item {
                    if kind == Kind::SeqData {
                        match *highest_seq {
                            Some(h) if seq < h => self.stats.out_of_order += 1,
                            _ => *highest_seq = Some(seq),
                        }
                    }
                    self.stats.delivered_packets += 1;
                    self.stats.delivered_bytes += payload.len() as u64;
                    self.out.push_back(payload);
                }
            }
            Engine::Logical(b) => {
                b.last_arrival[channel] = now;
                // The awaited packet itself: deliver it without queueing it.
                if let (Some((bc, _)), Item::Data { .. }) = (b.blocked, &item) {
                    if bc == channel && b.bufs[channel].is_empty() {
                        let Item::Data {
                            payload, wire_len, ..
                        } = item
                        else {
                            unreachable!()
                        };
                        b.blocked = None;
                        b.follow.delivered(channel, wire_len as usize);
                        deliver(&mut self.out, &mut self.stats, payload);
                        return run_logical(b, self.limit, now, &mut self.out, &mut self.stats);
                    }
                }
                push_bounded(b, channel, item, self.limit, &mut self.stats);
                // Waiting on another channel: this arrival changes nothing but the
                // waiting clock, unless it filled a buffer (the common case under skew).
                if let Some((bc, since)) = b.blocked {
                    if bc != channel && b.bufs[channel].len() < self.limit {
                        if since.is_none() {
                            b.blocked = Some((bc, Some(now)));
                        }
                        return;
                    }
                }
                run_logical(b, self.limit, now, &mut self.out, &mut self.stats);
            }
            Engine::Seq(q) => {
                let SeqRx {
                    b, expected, floor, ..
                } = q;
                b.last_arrival[channel] = now;
                if let Item::Marker(m) = &item {
                    floor[channel] = floor[channel].max(m.sent);
                }
                if let Item::Data { seq, .. } = &item {
                    if *seq < *expected {
                        self.stats.stale_dropped += 1;
                        return;
                    }
                    let last = b.bufs[channel].iter().rev().find_map(|it| match it {
                        Item::Data { seq, .. } => Some(*seq),
                        _ => None,
                    });
                    if last.is_some_and(|l| l >= *seq) {
                        self.stats.stale_dropped += 1;
                        return;
                    }
                    floor[channel] = floor[channel].max(*seq + 1);
                }
                push_bounded(b, channel, item, self.limit, &mut self.stats);
                q.run(self.limit, now, &mut self.out, &mut self.stats);
            }
            Engine::Trr(t) => {
                if let Item::Data {
                    payload, wire_len, ..
                } = item
                {
                    t.on_data(now, channel, payload, wire_len, self.limit, &mut self.stats);
                }
            }
        }
    }

    fn malformed(&mut self, channel: usize) {
        self.stats.malformed += 1;
        self.stats.channels[channel].malformed += 1;
    }

    /// When [`Resequencer::handle_timeout`] wants to be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let held = self.equalizer.as_ref().and_then(|e| e.next_due());
        match (self.engine_timeout(), held) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn engine_timeout(&self) -> Option<Instant> {
        match &self.engine {
            Engine::None { .. } => None,
            // Give up only on a channel that has been silent for max_wait while data
            // waits elsewhere: a slow channel keeps delivering and is waited for.
            Engine::Logical(b) => silent_due(b, self.max_wait),
            Engine::Seq(SeqRx { b, repair, .. }) => {
                let repair_due = repair.as_ref().and_then(|r| r.deadline);
                match (silent_due(b, self.max_wait), repair_due) {
                    (Some(a), Some(r)) => Some(a.min(r)),
                    (a, r) => a.or(r),
                }
            }
            Engine::Trr(t) => t.poll_timeout(self.max_wait),
        }
    }

    /// A NAK to send to the peer's striper (on every channel), if repair found
    /// numbers missing since the last call.
    pub fn poll_nak(&mut self) -> Option<Bytes> {
        let Engine::Seq(SeqRx {
            repair: Some(r), ..
        }) = &mut self.engine
        else {
            return None;
        };
        if r.out.is_empty() {
            return None;
        }
        let n = r.out.len().min(wire::nak::MAX_SEQS);
        let seqs: Vec<u64> = r.out.drain(..n).collect();
        self.stats.naks_sent += seqs.len() as u64;
        Some(Bytes::from(
            wire::nak::Repr {
                epoch: self.epoch,
                seqs,
            }
            .to_vec(),
        ))
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
        match &mut self.engine {
            Engine::None { .. } => {}
            Engine::Logical(b) => loop {
                run_logical(b, self.limit, now, &mut self.out, &mut self.stats);
                if b.bufs.iter().all(|q| q.is_empty()) {
                    break;
                }
                if let Some((c, _)) = b.blocked.take() {
                    b.follow.give_up(c);
                }
            },
            Engine::Seq(q) => loop {
                // Nothing more will come, repairs included: stop waiting for them.
                if let Some(r) = q.repair.as_mut() {
                    r.deadline = Some(now);
                    r.naked_until = u64::MAX;
                }
                q.run(self.limit, now, &mut self.out, &mut self.stats);
                if q.b.bufs.iter().all(|b| b.is_empty()) {
                    break;
                }
                q.b.blocked = None;
                let before = q.expected;
                skip_to_lowest_buffered(&mut q.b, &mut q.expected, &mut self.stats);
                if q.expected == before {
                    // Only markers left: nothing more to deliver.
                    q.b.bufs.iter_mut().for_each(|b| b.clear());
                }
            },
            Engine::Trr(t) => t.drain(&mut self.out, &mut self.stats),
        }
        if let Engine::Logical(b) | Engine::Seq(SeqRx { b, .. }) = &mut self.engine {
            b.blocked = None;
        }
    }

    /// Time passed: releases held datagrams that are due, and gives up on packets
    /// awaited longer than `max_wait`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.release_held(now);
        let Some(due) = self.engine_timeout() else {
            return;
        };
        if now < due {
            return;
        }
        match &mut self.engine {
            Engine::None { .. } => {}
            Engine::Logical(b) => {
                if let Some((c, _)) = b.blocked.take() {
                    self.stats.channels[c].wait_timeouts += 1;
                    b.follow.give_up(c);
                }
                run_logical(b, self.limit, now, &mut self.out, &mut self.stats);
            }
            Engine::Seq(q) => {
                let SeqRx {
                    b,
                    expected,
                    floor,
                    repair,
                } = q;
                if silent_due(b, self.max_wait).is_some_and(|t| now >= t) {
                    if let Some((c, _)) = b.blocked.take() {
                        self.stats.channels[c].wait_timeouts += 1;
                        match repair.as_mut() {
                            // A silent channel may have lost the packet and everything
                            // after it: ask for what is missing before giving up.
                            Some(r) if *expected >= r.naked_until => {
                                let known = floor.iter().copied().max().unwrap_or(0);
                                let end = known
                                    .max(*expected + 1)
                                    .min(*expected + wire::nak::MAX_SEQS as u64);
                                r.out.extend(*expected..end);
                                r.naked_until = end;
                                r.deadline = Some(now + r.wait);
                            }
                            _ => skip_to_lowest_buffered(b, expected, &mut self.stats),
                        }
                    }
                }
                q.run(self.limit, now, &mut self.out, &mut self.stats);
                // An expired wait must not keep the timer armed: the numbers it covered
                // are declared lost when their turn comes.
                if let Some(r) = q.repair.as_mut() {
                    if r.deadline.is_some_and(|d| d <= now) {
                        r.deadline = None;
                    }
                }
            }
            Engine::Trr(t) => t.handle_timeout(now, &mut self.out, &mut self.stats),
        }
    }
}

/// When a blocked receiver gives up on a channel silent for `max_wait` while data waits.
fn silent_due(b: &Buffered, max_wait: Duration) -> Option<Instant> {
    match b.blocked {
        Some((c, Some(since))) => Some(since.max(b.last_arrival[c]) + max_wait),
        _ => None,
    }
}

/// Queue `item` on `channel`, keeping the buffer within `limit`. Returns false if the
/// item had to be dropped.
fn push_bounded(
    b: &mut Buffered,
    channel: usize,
    item: Item,
    limit: usize,
    stats: &mut Stats,
) -> bool {
    let q = &mut b.bufs[channel];
    if q.len() >= limit {
        stats.channels[channel].overflow_drops += 1;
        return false;
    }
    q.push_back(item);
    let hw = &mut stats.channels[channel].buffer_high_water;
    *hw = (*hw).max(q.len() as u64);
    true
}

#[inline]
fn deliver(out: &mut VecDeque<Bytes>, stats: &mut Stats, payload: Bytes) {
    stats.delivered_packets += 1;
    stats.delivered_bytes += payload.len() as u64;
    out.push_back(payload);
}

/// Logical reception: take packets from the channel the follower names until it names
/// an empty one.
fn run_logical(
    b: &mut Buffered,
    limit: usize,
    now: Instant,
    out: &mut VecDeque<Bytes>,
    stats: &mut Stats,
) {
    loop {
        let c = b.follow.expected(&mut b.bufs, stats);
        match b.bufs[c].pop_front() {
            Some(Item::Data {
                payload, wire_len, ..
            }) => {
                b.follow.delivered(c, wire_len as usize);
                deliver(out, stats, payload);
            }
            Some(Item::Marker(_)) => unreachable!("expected() consumes head markers"),
            None => {
                b.note_blocked(c, now);
                // A full buffer elsewhere while we wait: the awaited packet is lost.
                if b.any_full(limit) {
                    stats.channels[c].wait_timeouts += 1;
                    b.follow.give_up(c);
                    continue;
                }
                return;
            }
        }
    }
}

/// Sequence mode: logical reception predicts the channel, the sequence number confirms;
/// otherwise find the expected number on any channel, and declare it lost once every
/// channel has moved past it.
#[allow(clippy::too_many_arguments)]
fn run_seq(
    b: &mut Buffered,
    expected: &mut u64,
    floor: &mut [u64],
    mut repair: Option<&mut Repair>,
    limit: usize,
    now: Instant,
    out: &mut VecDeque<Bytes>,
    stats: &mut Stats,
) {
    loop {
        // A repaired packet whose turn has come.
        if let Some(r) = repair.as_deref_mut() {
            while r
                .store
                .first_key_value()
                .is_some_and(|(k, _)| *k < *expected)
            {
                r.store.pop_first();
                stats.stale_dropped += 1;
            }
            if r.store
                .first_key_value()
                .is_some_and(|(k, _)| *k == *expected)
            {
                let (_, payload) = r.store.pop_first().expect("first exists");
                *expected += 1;
                stats.repaired += 1;
                deliver(out, stats, payload);
                continue;
            }
            if *expected >= r.naked_until {
                r.deadline = None; // nothing NAKed is still awaited
            }
        }
        // Fast path: the follower's channel holds the expected number.
        let c = b.follow.expected(&mut b.bufs, stats);
        if let Some(Item::Data { seq, .. }) = b.bufs[c].front() {
            if *seq == *expected {
                let Some(Item::Data {
                    payload, wire_len, ..
                }) = b.bufs[c].pop_front()
                else {
                    unreachable!()
                };
                b.follow.delivered(c, wire_len as usize);
                *expected += 1;
                stats.fast_path_hits += 1;
                deliver(out, stats, payload);
                continue;
            }
        }
        // Slow path: look at every channel's head.
        let mut found = None;
        for (i, q) in b.bufs.iter_mut().enumerate() {
            loop {
                match q.front() {
                    Some(Item::Marker(m)) => {
                        let pos = m.position;
                        q.pop_front();
                        if b.follow.apply_marker(i, pos) {
                            stats.channels[i].resyncs += 1;
                        }
                    }
                    Some(Item::Data { seq, .. }) if *seq < *expected => {
                        q.pop_front();
                        stats.stale_dropped += 1;
                    }
                    _ => break,
                }
            }
            if let Some(Item::Data { seq, .. }) = q.front() {
                if *seq == *expected {
                    found = Some(i);
                }
            }
        }
        if let Some(i) = found {
            let Some(Item::Data {
                payload, wire_len, ..
            }) = b.bufs[i].pop_front()
            else {
                unreachable!()
            };
            b.follow.delivered(i, wire_len as usize);
            *expected += 1;
            deliver(out, stats, payload);
            continue;
        }
        // Has every channel moved past `expected`? Channels are FIFO, so then it is lost.
        let mut lowest = u64::MAX;
        let mut all_past = true;
        for (i, q) in b.bufs.iter().enumerate() {
            let low = match q.front() {
                Some(Item::Data { seq, .. }) => *seq,
                _ => floor[i],
            };
            if low <= *expected {
                all_past = false;
            }
            lowest = lowest.min(low);
        }
        if all_past && lowest != u64::MAX {
            if let Some(r) = repair.as_deref_mut() {
                // A repaired packet may already wait beyond the gap.
                let lowest = r
                    .store
                    .first_key_value()
                    .map_or(lowest, |(k, _)| lowest.min(*k));
                if *expected >= r.naked_until {
                    // Name the gap to the sender and wait for it.
                    let end = lowest.min(*expected + wire::nak::MAX_SEQS as u64);
                    r.out.extend(*expected..end);
                    r.naked_until = end;
                    r.deadline = Some(now + r.wait);
                }
                if r.deadline.is_some_and(|d| now < d) {
                    b.note_blocked(c, now);
                    return;
                }
                // The wait is over (or the numbers were NAKed before and expired).
                r.deadline = None;
                stats.lost += lowest - *expected;
                *expected = lowest;
                b.blocked = None;
                continue;
            }
            stats.lost += lowest - *expected;
            *expected = lowest;
            b.blocked = None;
            continue;
        }
        if b.any_full(limit) {
            stats.channels[c].wait_timeouts += 1;
            skip_to_lowest_buffered(b, expected, stats);
            continue;
        }
        b.note_blocked(c, now);
        return;
    }
}

/// After `max_wait`: give up on every number below the lowest one buffered.
fn skip_to_lowest_buffered(b: &mut Buffered, expected: &mut u64, stats: &mut Stats) {
    let lowest = b
        .bufs
        .iter()
        .filter_map(|q| {
            q.iter().find_map(|it| match it {
                Item::Data { seq, .. } => Some(*seq),
                _ => None,
            })
        })
        .min();
    if let Some(l) = lowest {
        if l > *expected {
            stats.lost += l - *expected;
            *expected = l;
        }
    }
}
