//! The sending end: segments in a window (the retransmission buffer), one transmission
//! queue ordered by (segment, packet) for new and repeated packets alike (§3.3,
//! "Transmission Scheduling"), SNAK and PACK processing, keep-alives.

use std::collections::{BTreeSet, VecDeque};

use bytes::Bytes;

use super::{Config, Stats};
use crate::time::{Duration, Instant};
use crate::wire::errctl::{DataKind, DataRepr, PackRepr, SnakRepr, DATA_HEADER_LEN};
use crate::wire::seq::extend;
use crate::wire::{TYPE_PACK, TYPE_SNAK};

/// Why the sender would not take a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The window is full: wait for acknowledgements.
    #[error("window full")]
    WindowFull,
    /// [`Sender::finish`] was called.
    #[error("stream finished")]
    Finished,
}

/// One segment in the window.
struct TxSeg {
    packets: Vec<Bytes>,
    /// When each packet was last sent.
    sent: Vec<Option<Instant>>,
    /// Packets sent at least once (they go out in order the first time).
    extent: usize,
    first_sent: Option<Instant>,
    /// No more packets will be added.
    closed: bool,
    /// Acknowledged, or given up: its packets are freed.
    done: bool,
    /// A packet of it was sent more than once (its acknowledgement is no round-trip
    /// sample: Karn's rule).
    resent: bool,
    /// Acknowledged: its window slot can be freed once it reaches the front. A segment
    /// given up at the deadline keeps its slot until the receiver acknowledges it too,
    /// so the sender never runs more than a window ahead of the receiver.
    acked: bool,
}

/// The sender of an error-controlled stream.
pub struct Sender {
    cfg: Config,
    /// Segments from `base` on, acknowledged ones included until they reach the front.
    segs: VecDeque<TxSeg>,
    base: u64,
    /// The transmission queue (XMTQ): (segment, packet index).
    xmtq: BTreeSet<(u64, u16)>,
    ship: u64,
    /// The last packet sent for the first time: the context keep-alives carry.
    last_new: Option<(u64, u16)>,
    /// Data went out since the last keep-alive.
    data_since_ctx: bool,
    last_ctx: Option<Instant>,
    finished: bool,
    /// One past the last segment of the stream, once [`Sender::finish`] was called.
    end_seg: Option<u64>,
    /// The receiver acknowledged the end of the stream (it has every segment).
    end_acked: bool,
    /// Smoothed round trip measured from acknowledgements (see [`Sender::rtt`]).
    srtt: Option<Duration>,
    stats: Stats,
}

impl Sender {
    /// A sender; `cfg` must pass [`Config::validate`].
    pub fn new(cfg: Config) -> Sender {
        Sender {
            cfg,
            segs: VecDeque::new(),
            base: 0,
            xmtq: BTreeSet::new(),
            ship: 0,
            last_new: None,
            data_since_ctx: false,
            last_ctx: None,
            finished: false,
            end_seg: None,
            end_acked: false,
            srtt: None,
            stats: Stats::default(),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The round trip the premature-request filter uses: the configured one, or with
    /// `adaptive_rtt` the one measured, if longer. The measured one is the time from a segment's last
    /// packet leaving to its acknowledgement (segments sent once only), smoothed; over a
    /// bond it includes the resequencing wait at both ends, which a ping of the paths
    /// does not show, and a filter on too short a round trip answers a repeated request
    /// with a duplicate.
    pub fn rtt(&self) -> Duration {
        match self.srtt {
            Some(m) if self.cfg.adaptive_rtt => m.max(self.cfg.rtt),
            _ => self.cfg.rtt,
        }
    }

    /// The oldest segment not yet acknowledged (or given up).
    pub fn base(&self) -> u64 {
        self.base
    }

    fn w(&self) -> usize {
        usize::from(self.cfg.tolerance.w)
    }

    /// Would [`Sender::handle_packet`] take a packet now?
    pub fn can_accept(&self) -> bool {
        !self.finished
            && (self.segs.back().is_some_and(|s| !s.closed)
                || self.segs.len() < self.cfg.window as usize)
    }

    /// Nothing left to send or to have acknowledged (the end of stream aside: see
    /// [`Sender::is_done`]).
    pub fn is_idle(&self) -> bool {
        self.segs.is_empty()
    }

    /// The stream is finished and the receiver has acknowledged all of it, its end
    /// included: it knows the stream is complete. Until then end-of-stream packets
    /// repeat every keep-alive period, even with every segment acknowledged.
    pub fn is_done(&self) -> bool {
        self.finished && self.end_acked && self.segs.is_empty()
    }

    /// Something still needs an acknowledgement: a segment, or the end of stream.
    fn awaiting_ack(&self) -> bool {
        !self.segs.is_empty() || (self.finished && !self.end_acked)
    }

    /// Queue one application packet; it becomes packet `k` of the open segment.
    pub fn handle_packet(&mut self, _now: Instant, data: Bytes) -> Result<(), SendError> {
        if self.finished {
            return Err(SendError::Finished);
        }
        if !self.can_accept() {
            return Err(SendError::WindowFull);
        }
        if self.segs.back().is_none_or(|s| s.closed) {
            self.segs.push_back(TxSeg {
                packets: Vec::with_capacity(self.w()),
                sent: Vec::with_capacity(self.w()),
                extent: 0,
                first_sent: None,
                closed: false,
                done: false,
                resent: false,
                acked: false,
            });
        }
        let w = self.w();
        let number = self.base + self.segs.len() as u64 - 1;
        let seg = self.segs.back_mut().expect("pushed above");
        let idx = seg.packets.len();
        seg.packets.push(data);
        seg.sent.push(None);
        seg.closed = seg.packets.len() == w;
        self.xmtq.insert((number, idx as u16));
        Ok(())
    }

    /// End of stream: the open segment is closed short, and end-of-stream packets
    /// replace keep-alives.
    pub fn finish(&mut self, _now: Instant) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.end_seg = Some(self.end());
        if let Some(s) = self.segs.back_mut() {
            s.closed = true;
        }
    }

    /// The next datagram for the link: the lowest queued (segment, packet), else a
    /// keep-alive or end-of-stream packet if one is due.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Bytes> {
        while let Some((number, idx)) = self.xmtq.pop_first() {
            let Some(seg) = number
                .checked_sub(self.base)
                .and_then(|i| self.segs.get_mut(i as usize))
            else {
                continue;
            };
            if seg.done {
                continue;
            }
            let i = usize::from(idx);
            let first = seg.sent[i].is_none();
            seg.sent[i] = Some(now);
            seg.first_sent.get_or_insert(now);
            if first {
                seg.extent = seg.extent.max(i + 1);
                self.last_new = Some((number, idx));
                self.stats.packets_sent += 1;
            } else {
                seg.resent = true;
                self.stats.retransmissions += 1;
            }
            let payload = seg.packets[i].clone();
            self.data_since_ctx = true;
            return Some(self.frame(DataKind::Data, number, idx, &payload));
        }
        if self.context_due(now) {
            let end = self.finished && self.all_sent();
            // An empty stream's end names the packet before segment 0: the last one of
            // segment -1 (wrapped), so the receiver's end is 0.
            let (number, idx) = match self.last_new {
                Some(x) => x,
                None if end => (u64::MAX, self.cfg.tolerance.w - 1),
                None => return None,
            };
            self.data_since_ctx = false;
            self.last_ctx = Some(now);
            self.stats.keepalives_sent += 1;
            let kind = if end {
                DataKind::End
            } else {
                DataKind::KeepAlive
            };
            return Some(self.frame(kind, number, idx, &[]));
        }
        None
    }

    fn all_sent(&self) -> bool {
        self.segs
            .iter()
            .all(|s| s.done || (s.closed && s.extent == s.packets.len()))
    }

    /// A keep-alive is due: the queue is empty, something is unacknowledged (the end of
    /// a finished stream included), and data went out since the last one or a
    /// keep-alive period has passed.
    fn context_due(&self, now: Instant) -> bool {
        self.context_armed()
            && (self.data_since_ctx || self.last_ctx.is_none_or(|t| now >= t + self.cfg.keepalive))
    }

    fn context_armed(&self) -> bool {
        self.xmtq.is_empty() && (self.last_new.is_some() || self.finished) && self.awaiting_ack()
    }

    fn frame(&mut self, kind: DataKind, number: u64, idx: u16, payload: &[u8]) -> Bytes {
        let r = DataRepr {
            kind,
            segment_len: self.cfg.tolerance.w,
            shipment: self.ship as u32,
            segment: number as u32,
            index: idx,
        };
        self.ship += 1;
        let mut v = vec![0u8; DATA_HEADER_LEN + payload.len()];
        r.emit(&mut v);
        v[DATA_HEADER_LEN..].copy_from_slice(payload);
        Bytes::from(v)
    }

    /// When [`Sender::handle_timeout`] (and then [`Sender::poll_transmit`]) should run
    /// next: a keep-alive or a segment's deadline.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let ka = if self.context_armed() {
            match self.last_ctx {
                Some(t) if !self.data_since_ctx => Some(t + self.cfg.keepalive),
                _ => Some(Instant::ZERO),
            }
        } else {
            None
        };
        let dl = self
            .segs
            .iter()
            .filter(|s| !s.done)
            .filter_map(|s| s.first_sent)
            .map(|t| t + self.cfg.deadline)
            .min();
        [ka, dl].into_iter().flatten().min()
    }

    /// Give up segments whose deadline has passed: no more repairs (their window slots
    /// are freed when the receiver, which gives them up too, acknowledges them).
    pub fn handle_timeout(&mut self, now: Instant) {
        for s in self.segs.iter_mut() {
            if !s.done && s.first_sent.is_some_and(|t| now >= t + self.cfg.deadline) {
                s.done = true;
                s.packets = Vec::new();
                self.stats.segments_expired += 1;
            }
        }
    }

    /// A datagram from the receiver: a SNAK or a PACK. Anything else, or anything
    /// that does not make sense for what was sent, is counted and ignored.
    pub fn handle_datagram(&mut self, now: Instant, b: &[u8]) {
        match b.first() {
            Some(&TYPE_SNAK) => match SnakRepr::parse(b) {
                Ok(s) => self.handle_snak(now, &s),
                Err(_) => self.stats.snaks_rejected += 1,
            },
            Some(&TYPE_PACK) => match PackRepr::parse(b) {
                Ok(p) => self.handle_pack(now, &p),
                Err(_) => self.stats.packs_rejected += 1,
            },
            _ => self.stats.packs_rejected += 1,
        }
    }

    /// One past the highest segment that exists.
    fn end(&self) -> u64 {
        self.base + self.segs.len() as u64
    }

    /// Release every segment below `cum`.
    fn release_below(&mut self, cum: u64) {
        while self.base < cum {
            if self.segs.pop_front().is_none() {
                break;
            }
            self.base += 1;
        }
    }

    fn pop_done(&mut self) {
        while self.segs.front().is_some_and(|s| s.acked) {
            self.segs.pop_front();
            self.base += 1;
        }
    }

    /// The segment is fully sent (so the receiver may have accepted it).
    fn fully_sent(&self, number: u64) -> bool {
        number
            .checked_sub(self.base)
            .and_then(|i| self.segs.get(i as usize))
            .is_some_and(|s| s.done || (s.closed && s.extent == s.packets.len()))
    }

    fn handle_pack(&mut self, now: Instant, p: &PackRepr) {
        let cum = extend(p.cum_ack, self.base);
        let seg = extend(p.segment, self.base);
        // The end acknowledgement: cumulative ack and segment both one past the last
        // segment (a PACK for a segment that exists always names one below `cum`).
        if self.end_seg.is_some_and(|e| cum == e && seg == e) {
            self.stats.packs_received += 1;
            self.end_acked = true;
            self.release_below(cum);
            return;
        }
        let cum_ok = cum <= self.base || self.fully_sent(cum - 1);
        let seg_ok = seg < self.base || self.fully_sent(seg);
        if !cum_ok || !seg_ok || seg >= self.end().max(cum) {
            self.stats.packs_rejected += 1;
            return;
        }
        self.stats.packs_received += 1;
        self.rtt_sample(now, seg);
        self.release_below(cum);
        if let Some(s) = seg
            .checked_sub(self.base)
            .and_then(|i| self.segs.get_mut(i as usize))
        {
            s.done = true;
            s.acked = true;
            s.packets = Vec::new();
        }
        self.pop_done();
    }

    /// The first acknowledgement of segment `seg`, at `now`: a round-trip sample if the
    /// segment went out whole and once.
    fn rtt_sample(&mut self, now: Instant, seg: u64) {
        if !self.cfg.adaptive_rtt {
            return; // [`Sender::rtt`] would not use it
        }
        let Some(s) = seg
            .checked_sub(self.base)
            .and_then(|i| self.segs.get(i as usize))
        else {
            return;
        };
        let whole = s.closed && s.extent == s.packets.len();
        let last = s.sent.iter().flatten().max().copied();
        if let (false, false, true, Some(last)) = (s.done, s.resent, whole, last) {
            let sample = now.saturating_since(last);
            self.srtt = Some(match self.srtt {
                None => sample,
                Some(r) => Duration::from_micros((r.as_micros() * 7 + sample.as_micros()) / 8),
            });
        }
    }

    /// Validate a SNAK against what was sent; on success queue every requested packet
    /// whose last copy left at least one round trip ago.
    fn handle_snak(&mut self, now: Instant, s: &SnakRepr) {
        let Some(seg) = self.snak_segment(s) else {
            return;
        };
        let rtt = self.resend_rtt();
        let Some(t) = seg
            .checked_sub(self.base)
            .and_then(|i| self.segs.get(i as usize))
        else {
            return;
        };
        if t.done {
            self.stats.snaks_stale += 1;
            return;
        }
        for &(a, z) in &s.ranges {
            for idx in a..=z {
                match t.sent[usize::from(idx)] {
                    Some(at) if !super::premature(at, now, rtt) => {
                        self.xmtq.insert((seg, idx));
                    }
                    _ => self.stats.premature_requests += 1,
                }
            }
        }
    }

    /// A SNAK checked against what was sent (counted rejected or stale when it does
    /// not pass), and what its cumulative acknowledgement covers released. Returns the
    /// segment whose packets it asks for, when it is valid and the segment is not
    /// done.
    fn snak_segment(&mut self, s: &SnakRepr) -> Option<u64> {
        let cum = extend(s.cum_ack, self.base);
        let seg = extend(s.segment, self.base);
        if cum > self.base && !self.fully_sent(cum - 1) {
            self.stats.snaks_rejected += 1;
            return None;
        }
        if seg < self.base.max(cum) {
            self.release_below(cum);
            self.pop_done();
            self.stats.snaks_stale += 1;
            return None;
        }
        let Some(t) = self.segs.get((seg - self.base) as usize) else {
            // Not yet sent, or beyond the window.
            self.stats.snaks_rejected += 1;
            return None;
        };
        if !ranges_valid(&s.ranges, t.extent) {
            self.stats.snaks_rejected += 1;
            return None;
        }
        if t.done {
            // Acknowledged (or given up) already, waiting for the ones before it.
            self.release_below(cum);
            self.pop_done();
            self.stats.snaks_stale += 1;
            return None;
        }
        self.stats.snaks_received += 1;
        self.release_below(cum);
        self.pop_done();
        Some(seg)
    }

    /// How long after its last copy left a packet may be sent again on request.
    fn resend_rtt(&self) -> Duration {
        // A round trip and a margin of one acknowledgement interval: the receiver
        // repeats its SNAK every interval until the repair arrives, so the last one it
        // sent before then reaches us up to a round trip after the repair left, later
        // with any jitter; without the margin, about every repair went out twice over
        // a bond (`docs/lab.md`).
        if self.cfg.adaptive_rtt {
            self.rtt() + self.cfg.ack_interval
        } else {
            self.cfg.rtt
        }
    }
}

/// Ranges are valid if each is in order (first ≤ last), they ascend without overlap,
/// and none names a packet not yet sent (index ≥ `extent`).
fn ranges_valid(ranges: &[(u16, u16)], extent: usize) -> bool {
    let mut prev: Option<u16> = None;
    for &(a, z) in ranges {
        if a > z || usize::from(z) >= extent || prev.is_some_and(|p| a <= p) {
            return false;
        }
        prev = Some(z);
    }
    true
}
