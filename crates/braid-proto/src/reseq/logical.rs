//! Logical reception (seed 000 §4–5): header-free data, taken out of the channel
//! buffers in the order the receiver's copy of the sender's scheduler names.
//!
//! [`Buffered`], the channel buffers with that follower, is shared with `seq` mode.

use std::collections::VecDeque;

use bytes::Bytes;

use super::follow::Follower;
use super::{Item, ModeEngine, Sink};
use crate::sched::Sched;
use crate::stats::Stats;
use crate::time::{Duration, Instant};

/// Per-channel buffers plus the follower that simulates the sender.
pub(crate) struct Buffered {
    pub(crate) bufs: Vec<VecDeque<Item>>,
    pub(crate) follow: Follower,
    /// Channel we are waiting on, and since when other data has been waiting.
    pub(crate) blocked: Option<(usize, Option<Instant>)>,
    /// Last time data arrived on each channel.
    last_arrival: Vec<Instant>,
    /// Most items per channel buffer.
    pub(crate) limit: usize,
    /// How long a silent channel is waited for while data waits elsewhere.
    max_wait: Duration,
}

impl Buffered {
    pub(crate) fn new(sched: Sched, n: usize, limit: usize, max_wait: Duration) -> Buffered {
        Buffered {
            // Grown on the first data: an idle session's resequencer holds no room.
            bufs: (0..n).map(|_| VecDeque::new()).collect(),
            follow: Follower::new(sched),
            blocked: None,
            last_arrival: vec![Instant::ZERO; n],
            limit,
            max_wait,
        }
    }

    /// Data arrived on `channel`.
    #[inline]
    pub(crate) fn heard(&mut self, channel: usize, now: Instant) {
        self.last_arrival[channel] = now;
    }

    /// Is data held back? (In logical mode the awaited channel is empty, so this is
    /// data on other channels; in seq mode the awaited number may be missing while its
    /// channel holds later ones.) Markers do not count: an idle sender's heartbeat
    /// markers wait at the heads of channels the receiver does not visit, and a wait
    /// for the next packet, which the sender has not sent, must not time out then.
    /// Scans up to the first data item of each buffer (markers queue up only on
    /// channels not visited for a while, at most one per marker interval).
    fn data_waiting(&self) -> bool {
        self.bufs
            .iter()
            .any(|b| b.iter().any(|i| matches!(i, Item::Data { .. })))
    }

    pub(crate) fn any_full(&self) -> bool {
        self.bufs.iter().any(|q| q.len() >= self.limit)
    }

    pub(crate) fn all_empty(&self) -> bool {
        self.bufs.iter().all(|q| q.is_empty())
    }

    pub(crate) fn len(&self) -> usize {
        self.bufs.iter().map(|q| q.len()).sum()
    }

    /// The channel waited for while data is held elsewhere, and since when.
    pub(crate) fn waiting(&self) -> Option<(usize, Instant)> {
        match self.blocked {
            Some((c, Some(since))) => Some((c, since)),
            _ => None,
        }
    }

    pub(crate) fn note_blocked(&mut self, c: usize, now: Instant) {
        let waiting = self.data_waiting();
        let since = match self.blocked {
            Some((bc, since)) if bc == c => since,
            _ => None,
        };
        self.blocked = Some((c, if waiting { since.or(Some(now)) } else { None }));
    }

    /// When a blocked receiver gives up on a channel silent for `max_wait` while data
    /// waits.
    pub(crate) fn silent_due(&self) -> Option<Instant> {
        match self.blocked {
            Some((c, Some(since))) => Some(since.max(self.last_arrival[c]) + self.max_wait),
            _ => None,
        }
    }

    /// Queue `item` on `channel`, keeping the buffer within the limit; an item that
    /// does not fit is dropped and counted. A marker that repeats the one at the
    /// buffer's tail (an idle sender's heartbeat: same position, same count sent, no
    /// quantum change) is not queued: taking it would change nothing, and an idle
    /// session on a channel the receiver does not visit would otherwise hold one more
    /// per heartbeat until the buffer is full (some 200 KiB per idle peer of a server
    /// after a few minutes, and then overflow drops).
    pub(crate) fn push(&mut self, channel: usize, item: Item, stats: &mut Stats) {
        let q = &mut self.bufs[channel];
        if let (
            Item::Marker {
                position,
                sent,
                quantum,
            },
            Some(Item::Marker {
                position: p,
                sent: s,
                quantum: qn,
            }),
        ) = (&item, q.back())
        {
            if (position, sent, quantum) == (p, s, qn) {
                return;
            }
        }
        if q.len() >= self.limit {
            stats.channels[channel].overflow_drops += 1;
            return;
        }
        q.push_back(item);
        let hw = &mut stats.channels[channel].buffer_high_water;
        *hw = (*hw).max(q.len() as u64);
    }

    /// `payload` (`wire_len` bytes on the wire) is the next packet in sender order and
    /// came from `channel`: move the follower on and deliver it.
    #[inline]
    pub(crate) fn deliver(
        &mut self,
        channel: usize,
        payload: Bytes,
        wire_len: u32,
        sink: &mut Sink,
    ) {
        self.follow.delivered(channel, wire_len as usize);
        sink.deliver(payload);
    }

    /// Forced progress (a full buffer elsewhere, or a drain): the packet awaited on the
    /// empty `channel` is lost, and so is everything the other empty channels would
    /// carry before the lowest position that holds data.
    pub(crate) fn force_past(&mut self, channel: usize) {
        self.follow.give_up(channel);
        self.follow.skip_empty_to_data(&self.bufs);
    }

    /// Deliver the data packet at the head of `channel`'s buffer.
    #[inline(always)]
    pub(crate) fn deliver_head(&mut self, channel: usize, sink: &mut Sink) {
        match self.bufs[channel].pop_front() {
            Some(Item::Data {
                payload, wire_len, ..
            }) => self.deliver(channel, payload, wire_len, sink),
            _ => unreachable!("callers check that the head is data"),
        }
    }
}

/// The `logical` mode's engine.
pub(crate) struct Logical {
    b: Buffered,
}

impl Logical {
    pub(crate) fn new(b: Buffered) -> Logical {
        Logical { b }
    }

    /// Take packets from the channel the follower names until it names an empty one.
    fn run(&mut self, now: Instant, sink: &mut Sink) {
        let b = &mut self.b;
        loop {
            let c = b.follow.expected(&mut b.bufs, &mut sink.stats);
            match b.bufs[c].pop_front() {
                Some(Item::Data {
                    payload, wire_len, ..
                }) => {
                    b.deliver(c, payload, wire_len, sink);
                    continue;
                }
                Some(Item::Marker { .. }) => unreachable!("expected() consumes head markers"),
                None => {}
            }
            b.note_blocked(c, now);
            // A full buffer elsewhere while we wait: the awaited packet is lost.
            if b.any_full() {
                sink.stats.channels[c].wait_timeouts += 1;
                b.force_past(c);
                continue;
            }
            return;
        }
    }
}

impl ModeEngine for Logical {
    #[inline]
    fn accept(&mut self, now: Instant, channel: usize, item: Item, sink: &mut Sink) {
        let b = &mut self.b;
        // Only data keeps a wait going: a channel that brings nothing but markers while
        // data waits elsewhere is not delivering what we wait for. (In step with the
        // sender that cannot last: whatever waits elsewhere was sent after the awaited
        // packet, so that packet is on its way. Counting markers, a receiver that had
        // run out of step waited for good on a channel whose heartbeat markers kept
        // coming, and max_wait never ended the wait.)
        if matches!(item, Item::Data { .. }) {
            b.heard(channel, now);
        }
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
                b.deliver(channel, payload, wire_len, sink);
                return self.run(now, sink);
            }
        }
        let data = matches!(item, Item::Data { .. });
        b.push(channel, item, &mut sink.stats);
        // Waiting on another channel: this arrival changes nothing but the waiting
        // clock, unless it filled a buffer (the common case under skew). Only data
        // starts the clock: an idle sender's heartbeat markers on the other channels
        // are nothing waiting, and with heartbeats further apart than `max_wait` (an
        // idle session's) they gave up on the awaited channel: the receiver then ran
        // out of step with the sender and misordered the first packets after the idle.
        if let Some((bc, since)) = b.blocked {
            if bc != channel && b.bufs[channel].len() < b.limit {
                if since.is_none() && data {
                    b.blocked = Some((bc, Some(now)));
                }
                return;
            }
        }
        self.run(now, sink);
    }

    // Give up only on a channel that has been silent for max_wait while data waits
    // elsewhere: a slow channel keeps delivering and is waited for.
    fn timeout(&self) -> Option<Instant> {
        self.b.silent_due()
    }

    fn handle_timeout(&mut self, now: Instant, sink: &mut Sink) {
        if let Some((c, _)) = self.b.blocked.take() {
            sink.stats.channels[c].wait_timeouts += 1;
            self.b.follow.give_up(c);
        }
        self.run(now, sink);
    }

    fn drain(&mut self, now: Instant, sink: &mut Sink) {
        loop {
            self.run(now, sink);
            if self.b.all_empty() {
                break;
            }
            if let Some((c, _)) = self.b.blocked.take() {
                self.b.force_past(c);
            }
        }
        self.b.blocked = None;
    }

    fn buffered(&self) -> usize {
        self.b.len()
    }
    fn held_on(&self, channel: usize) -> usize {
        self.b.bufs.get(channel).map_or(0, |q| q.len())
    }
    fn waiting(&self) -> Option<(usize, Instant)> {
        self.b.waiting()
    }
}
