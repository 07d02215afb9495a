//! The receiving end: packet-presence maps for the segments in the window, gap
//! detection on shipment numbers, the loss timer, the tolerance checker, SNAKs, PACKs,
//! deadlines, and in-order delivery of segments.

use std::collections::VecDeque;

use bytes::Bytes;

use super::check::{check, exceeds, Slot};
use super::{Config, Stats, MAX_CONTROL_QUEUE};
use crate::time::Instant;
use crate::wire::errctl::{DataKind, DataPacket, DataRepr, PackRepr, SnakRepr, MAX_RANGES};
use crate::wire::seq::extend;

/// A segment handed to the application, in segment order. In live mode
/// ([`Receiver::set_live`]) a segment may come in several pieces, each continuing where
/// the previous one ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Segment number, from 0.
    pub number: u64,
    /// Its packets (in live mode, those of this piece); `None` where a packet was lost
    /// (tolerated, or given up).
    pub packets: Vec<Option<Bytes>>,
    /// Index in the segment of `packets[0]`: 0 unless live mode released the start of
    /// the segment earlier.
    pub first: usize,
    /// This piece ends the segment (always true outside live mode). The fields below
    /// describe the whole segment only on the last piece; earlier pieces have
    /// `accepted_at` = the time they were released, `forced` and `violated` false.
    pub last: bool,
    /// When the receiver accepted it (it may be delivered later, behind an earlier one).
    pub accepted_at: Instant,
    /// Given up at the deadline rather than accepted within the tolerance.
    pub forced: bool,
    /// Its holes break the tolerance (only possible if `forced`).
    pub violated: bool,
}

struct RxSeg {
    slots: Vec<Slot>,
    data: Vec<Option<Bytes>>,
    /// Packets known to have been sent at least once.
    known: usize,
    first_seen: Instant,
    accepted: Option<Instant>,
    forced: bool,
    /// Requests outstanding; the next SNAK may go at this time.
    snak_next: Option<Instant>,
    /// Per packet, the shipment number expected when a SNAK first named it
    /// (`u64::MAX`: never named): a copy shipped from then on is a repair, an older one
    /// a late original.
    requested: Vec<u64>,
}

/// The receiver of an error-controlled stream.
pub struct Receiver {
    cfg: Config,
    /// L: the next segment to deliver; `segs[0]` is segment L.
    next: u64,
    segs: VecDeque<RxSeg>,
    /// One past the last segment, once the end of stream is known.
    end: Option<u64>,
    /// One past the highest shipment number seen.
    expected_ship: u64,
    loss_timer: Option<Instant>,
    pack_due: Option<Instant>,
    /// Packets arrived since the last periodic PACK.
    activity: bool,
    last_accepted: Option<u64>,
    out: VecDeque<Bytes>,
    deliver: VecDeque<Segment>,
    stats: Stats,
    /// Live mode: release packets before their segment is accepted.
    live: bool,
    /// Live mode: packets of the front segment (L) already released.
    released: usize,
}

impl Receiver {
    /// A receiver; `cfg` must pass [`Config::validate`].
    pub fn new(cfg: Config) -> Receiver {
        Receiver {
            cfg,
            next: 0,
            segs: VecDeque::new(),
            end: None,
            expected_ship: 0,
            loss_timer: None,
            pack_due: None,
            activity: false,
            last_accepted: None,
            out: VecDeque::new(),
            deliver: VecDeque::new(),
            stats: Stats::default(),
            live: false,
            released: 0,
        }
    }

    /// Live mode (off by default): hand each packet to the application as soon as every
    /// packet before it in the stream is decided (received, or lost within the
    /// tolerance), rather than when its whole segment is accepted. A segment then comes
    /// out of [`Receiver::poll_deliver`] in pieces (see [`Segment::first`]); the protocol
    /// (requests, acknowledgements, deadlines) is unchanged. A live application waits
    /// for a hole only while it may still be repaired: a segment of W packets no longer
    /// adds W packet times to the delay of its first packet. A copy of a packet whose
    /// place was already released as a hole arrives too late and counts as a duplicate.
    pub fn set_live(&mut self, on: bool) {
        self.live = on;
    }

    /// Counters so far.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The next segment to be delivered (L).
    pub fn next_segment(&self) -> u64 {
        self.next
    }

    /// Every segment of a finished stream has been delivered.
    pub fn is_complete(&self) -> bool {
        self.end.is_some_and(|e| self.next >= e)
    }

    /// A control datagram for the sender (SNAK or PACK).
    pub fn poll_transmit(&mut self) -> Option<Bytes> {
        self.out.pop_front()
    }

    /// The next segment for the application, in order.
    pub fn poll_deliver(&mut self) -> Option<Segment> {
        self.deliver.pop_front()
    }

    fn push_out(&mut self, b: Vec<u8>) {
        if self.out.len() >= MAX_CONTROL_QUEUE {
            self.stats.control_dropped += 1;
            return;
        }
        self.out.push_back(Bytes::from(b));
    }

    /// A datagram from the sender: data, keep-alive or end of stream.
    pub fn handle_datagram(&mut self, now: Instant, b: &[u8]) {
        let Ok(p) = DataPacket::new_checked(b) else {
            self.stats.malformed += 1;
            return;
        };
        let Ok(r) = DataRepr::parse(&p) else {
            self.stats.malformed += 1;
            return;
        };
        if r.segment_len != self.cfg.tolerance.w {
            self.stats.malformed += 1;
            return;
        }
        let was_complete = self.is_complete();
        if r.kind == DataKind::End && self.end_behind(r.segment) {
            self.ack_end();
            return;
        }
        let seg = extend(r.segment, self.next);
        let ship = extend(r.shipment, self.expected_ship);
        if seg >= self.next + u64::from(self.cfg.window) || self.end.is_some_and(|e| seg >= e) {
            self.stats.out_of_window += 1;
            return;
        }
        let mut gap = false;
        if ship >= self.expected_ship {
            gap = ship > self.expected_ship + u64::from(self.cfg.reorder);
            self.expected_ship = ship + 1;
            self.loss_timer = Some(now + self.cfg.loss_timer);
        }
        self.activity = true;
        self.pack_due.get_or_insert(now + self.cfg.ack_interval);
        if gap {
            self.stats.gaps += 1;
        }
        // Everything below `seg` was sent in full, `seg` up to this index.
        self.learn(now, seg, usize::from(r.index) + 1);
        match r.kind {
            DataKind::Data => self.store(seg, usize::from(r.index), ship, p.payload()),
            DataKind::End => self.set_end(seg, usize::from(r.index) + 1),
            DataKind::KeepAlive => {}
        }
        let last = self.cfg.tolerance.w - 1;
        if gap || r.kind != DataKind::Data {
            self.check_range(now, seg);
        } else if r.index == last || self.complete(seg) {
            self.check_one(now, seg);
        }
        self.deliver_in_order();
        self.release_live(now);
        // Acknowledge the end when the stream becomes complete, and again for every
        // end-of-stream packet after that (the acknowledgement may have been lost).
        if self.is_complete() && (!was_complete || r.kind == DataKind::End) {
            self.ack_end();
        }
    }

    /// An end-of-stream packet naming the last packet of segment `wrapped`, a segment
    /// already delivered (or, for an empty stream, segment −1): the stream ends at L.
    fn end_behind(&mut self, wrapped: u32) -> bool {
        let end = extend(wrapped.wrapping_add(1), self.next);
        if end > self.next {
            return false;
        }
        self.end.get_or_insert(end);
        true
    }

    /// The end acknowledgement: a PACK whose cumulative acknowledgement and segment are
    /// both one past the last segment (no PACK for an accepted segment looks like it).
    fn ack_end(&mut self) {
        let Some(end) = self.end.filter(|_| self.is_complete()) else {
            return;
        };
        self.stats.end_acks_sent += 1;
        let pack = PackRepr {
            cum_ack: end as u32,
            segment: end as u32,
        };
        self.push_out(pack.to_vec());
    }

    /// Create the segments up to `seg`; mark the ones below it fully known and `seg`
    /// known up to `known` packets.
    fn learn(&mut self, now: Instant, seg: u64, known: usize) {
        if seg < self.next {
            return;
        }
        let w = usize::from(self.cfg.tolerance.w);
        while self.next + (self.segs.len() as u64) <= seg {
            self.segs.push_back(RxSeg {
                slots: vec![Slot::Missing; w],
                data: vec![None; w],
                known: 0,
                first_seen: now,
                accepted: None,
                forced: false,
                snak_next: None,
                requested: vec![u64::MAX; w],
            });
        }
        let at = (seg - self.next) as usize;
        for s in self.segs.iter_mut().take(at) {
            s.known = s.slots.len();
        }
        let s = &mut self.segs[at];
        s.known = s.known.max(known.min(s.slots.len()));
    }

    fn store(&mut self, seg: u64, idx: usize, ship: u64, payload: &[u8]) {
        self.stats.packets_received += 1;
        let Some(s) = seg
            .checked_sub(self.next)
            .and_then(|i| self.segs.get_mut(i as usize))
        else {
            self.stats.duplicates += 1;
            return;
        };
        let passed = seg == self.next && idx < self.released;
        if idx >= s.slots.len() || s.slots[idx] == Slot::Present || s.accepted.is_some() || passed {
            self.stats.duplicates += 1;
            return;
        }
        s.slots[idx] = Slot::Present;
        s.data[idx] = Some(Bytes::copy_from_slice(payload));
        if ship >= s.requested[idx] {
            self.stats.packets_repaired += 1;
        } else if s.requested[idx] != u64::MAX {
            self.stats.late_after_request += 1;
        }
    }

    /// The stream ends with packet `len - 1` of segment `seg`.
    fn set_end(&mut self, seg: u64, len: usize) {
        if self.end.is_some() {
            return;
        }
        self.end = Some(seg + 1);
        if let Some(s) = seg
            .checked_sub(self.next)
            .and_then(|i| self.segs.get_mut(i as usize))
        {
            s.slots.truncate(len);
            s.data.truncate(len);
            s.known = len;
        }
        let keep = (seg + 1).saturating_sub(self.next) as usize;
        self.segs.truncate(keep);
    }

    fn complete(&self, seg: u64) -> bool {
        seg.checked_sub(self.next)
            .and_then(|i| self.segs.get(i as usize))
            .is_some_and(|s| s.slots.iter().all(|&x| x == Slot::Present))
    }

    /// Run the checker on every open segment from L to `upto`.
    fn check_range(&mut self, now: Instant, upto: u64) {
        let mut n = self.next;
        while n <= upto && n < self.next + self.segs.len() as u64 {
            self.check_one(now, n);
            n += 1;
        }
    }

    /// Run the tolerance checker on one segment: accept it (and PACK it), or request
    /// what the tolerance needs (SNAK, at most once per `ack_interval`).
    fn check_one(&mut self, now: Instant, seg: u64) {
        let Some(i) = seg.checked_sub(self.next).map(|i| i as usize) else {
            return;
        };
        let tol = self.cfg.tolerance;
        let Some(s) = self.segs.get_mut(i) else {
            return;
        };
        if s.accepted.is_some() {
            return;
        }
        let known = s.known;
        let req = check(tol, &mut s.slots, known);
        if req.is_empty() {
            s.snak_next = None;
            if known == s.slots.len() {
                s.accepted = Some(now);
                self.accepted(seg);
            }
            return;
        }
        if s.snak_next.is_some_and(|t| now < t) {
            return;
        }
        s.snak_next = Some(now + self.cfg.ack_interval);
        let mut ranges = req;
        ranges.truncate(MAX_RANGES);
        let shipped = self.expected_ship;
        for &(a, z) in &ranges {
            for r in &mut s.requested[usize::from(a)..=usize::from(z)] {
                *r = (*r).min(shipped);
            }
        }
        self.stats.snaks_sent += 1;
        let snak = SnakRepr {
            cum_ack: self.next as u32,
            segment: seg as u32,
            ranges,
        };
        self.push_out(snak.to_vec());
    }

    fn accepted(&mut self, seg: u64) {
        self.last_accepted = Some(self.last_accepted.map_or(seg, |a| a.max(seg)));
        self.stats.packs_sent += 1;
        // The cumulative acknowledgement counts this segment if it is next in order.
        let mut cum = self.next;
        while (cum - self.next) < self.segs.len() as u64
            && self.segs[(cum - self.next) as usize].accepted.is_some()
        {
            cum += 1;
        }
        let pack = PackRepr {
            cum_ack: cum as u32,
            segment: seg as u32,
        };
        self.push_out(pack.to_vec());
    }

    /// Hand accepted segments at the front to the application.
    fn deliver_in_order(&mut self) {
        let tol = self.cfg.tolerance;
        while let Some(at) = self.segs.front().and_then(|s| s.accepted) {
            let s = self.segs.pop_front().expect("front exists");
            let tolerated = s.slots.iter().filter(|&&x| x != Slot::Present).count();
            let violated = s.forced && exceeds(tol, &s.slots);
            if s.forced {
                self.stats.segments_forced += 1;
            } else {
                self.stats.packets_tolerated += tolerated as u64;
            }
            self.stats.violations += u64::from(violated);
            self.stats.segments_delivered += 1;
            let first = std::mem::take(&mut self.released).min(s.data.len());
            let mut packets = s.data;
            packets.drain(..first);
            self.deliver.push_back(Segment {
                number: self.next,
                packets,
                first,
                last: true,
                accepted_at: at,
                forced: s.forced,
                violated,
            });
            self.next += 1;
        }
    }

    /// Live mode: release the decided prefix of the front segment (packets received,
    /// holes tolerated) as a piece.
    fn release_live(&mut self, now: Instant) {
        if !self.live {
            return;
        }
        let Some(s) = self.segs.front() else {
            return;
        };
        let from = self.released;
        let mut to = from;
        while to < s.known.min(s.slots.len()) && s.slots[to] != Slot::Missing {
            to += 1;
        }
        if to == from {
            return;
        }
        let packets = (from..to)
            .map(|i| match s.slots[i] {
                Slot::Present => s.data[i].clone(),
                _ => None,
            })
            .collect();
        self.released = to;
        self.deliver.push_back(Segment {
            number: self.next,
            packets,
            first: from,
            last: false,
            accepted_at: now,
            forced: false,
            violated: false,
        });
    }

    /// When [`Receiver::handle_timeout`] should run next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let pack = if self.activity { self.pack_due } else { None };
        let per_seg = self
            .segs
            .iter()
            .filter(|s| s.accepted.is_none())
            .filter_map(|s| {
                let dl = (s.known == s.slots.len()).then_some(s.first_seen + self.cfg.deadline);
                [dl, s.snak_next].into_iter().flatten().min()
            })
            .min();
        [self.loss_timer, pack, per_seg].into_iter().flatten().min()
    }

    /// Timers: the loss timer (check every open segment), SNAK repeats, deadlines
    /// (give up a segment known to be sent in full), the periodic PACK.
    pub fn handle_timeout(&mut self, now: Instant) {
        let was_complete = self.is_complete();
        if self.loss_timer.is_some_and(|t| now >= t) {
            self.loss_timer = None;
            self.stats.loss_timeouts += 1;
            let hi = self.next + self.segs.len() as u64;
            self.check_range(now, hi.saturating_sub(1));
        }
        for i in 0..self.segs.len() {
            let s = &self.segs[i];
            if s.accepted.is_some() {
                continue;
            }
            let seg = self.next + i as u64;
            // Only a segment known to be sent in full is given up: the rest of a segment
            // the application has not filled yet is not lost.
            if s.known == s.slots.len() && now >= s.first_seen + self.cfg.deadline {
                self.give_up(now, i);
                self.accepted(seg);
            } else if s.snak_next.is_some_and(|t| now >= t) {
                self.check_one(now, seg);
            }
        }
        if self.pack_due.is_some_and(|t| now >= t) {
            self.pack_due = None;
            if self.activity {
                self.activity = false;
                self.pack_due = Some(now + self.cfg.ack_interval);
                if let Some(seg) = self.last_accepted {
                    self.stats.packs_sent += 1;
                    let pack = PackRepr {
                        cum_ack: self.next as u32,
                        segment: seg as u32,
                    };
                    self.push_out(pack.to_vec());
                }
            }
        }
        self.deliver_in_order();
        self.release_live(now);
        if !was_complete && self.is_complete() {
            self.ack_end();
        }
    }

    fn give_up(&mut self, now: Instant, i: usize) {
        let s = &mut self.segs[i];
        let missing = s.slots.iter().filter(|&&x| x != Slot::Present).count();
        self.stats.packets_given_up += missing as u64;
        s.accepted = Some(now);
        s.forced = true;
        s.snak_next = None;
    }
}
