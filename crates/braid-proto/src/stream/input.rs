//! Frames from the peer.

use std::net::SocketAddr;

use super::state::{Ctrl, Phase, Stream, Tomb};
use super::{Refusal, StreamEvent, StreamId, Streams};
use crate::time::Instant;
use crate::wire::stream::{Ack, DataOffset, OpenCode, Repr, ResetReason, WireId};

/// The stream a frame names, as this end names it.
fn local(w: WireId) -> StreamId {
    StreamId {
        ours: !w.opened_by_sender,
        n: w.n,
    }
}

fn frame_id(r: &Repr<'_>) -> WireId {
    match r {
        Repr::Open { id, .. }
        | Repr::OpenResult { id, .. }
        | Repr::Data { id, .. }
        | Repr::Reset { id, .. }
        | Repr::ResetAck { id } => *id,
        Repr::Ack(a) => a.id,
    }
}

impl Streams {
    /// Parse a frame and hand it to its handler.
    pub(super) fn on_frame(&mut self, now: Instant, frame: &[u8]) {
        let Ok(repr) = Repr::parse(frame) else {
            self.stats.malformed += 1;
            return;
        };
        let id = local(frame_id(&repr));
        if id.ours && id.n >= self.next_n {
            // A stream of ours we never opened.
            self.stats.malformed += 1;
            return;
        }
        match repr {
            Repr::Open {
                src, dst, limit, ..
            } => self.on_open(now, id, src, dst, limit),
            Repr::OpenResult { code, limit, .. } => self.on_result(now, id, code, limit),
            Repr::Data {
                offset,
                fin,
                rtx,
                data,
                ..
            } => self.on_data(now, id, offset, fin, rtx, data),
            Repr::Ack(a) => self.on_ack(now, id, &a),
            Repr::Reset { .. } => self.on_reset(id),
            Repr::ResetAck { .. } => self.reset_done(id),
        }
    }

    /// The peer opens a stream: report it once; a copy gets the answer given before.
    fn on_open(
        &mut self,
        now: Instant,
        id: StreamId,
        src: SocketAddr,
        dst: SocketAddr,
        limit: u32,
    ) {
        if let Some(s) = self.map.get(&id) {
            self.stats.duplicate_opens += 1;
            if s.phase == Phase::Open {
                self.reply(Ctrl::Result(id, OpenCode::Accepted));
            }
            return;
        }
        if self.peer_ids.seen(id.n) || self.tombs.contains_key(&id) {
            self.stats.duplicate_opens += 1;
            self.answer_forgotten_open(id);
            return;
        }
        if self.map.len() >= self.cfg.max_streams as usize || self.peer_backlog_full() {
            if !self.peer_backlog_full() {
                self.peer_ids.insert(id.n);
            }
            self.bury(id, Tomb::Refused(Refusal::TooMany));
            self.reply(Ctrl::Result(id, OpenCode::TooMany));
            self.stats.refused += 1;
            return;
        }
        self.peer_ids.insert(id.n);
        self.map.insert(id, Stream::pending(now, limit as u64));
        self.events
            .push_back(StreamEvent::Incoming { id, src, dst });
        self.stats.incoming += 1;
        self.touch(now, id);
    }

    /// A copy of an OPEN for a stream already forgotten.
    fn answer_forgotten_open(&mut self, id: StreamId) {
        match self.tombs.get(&id).copied() {
            Some(Tomb::Refused(why)) => self.reply(Ctrl::Result(id, why.code())),
            // Its opener had its answer: data flowed.
            Some(Tomb::Closed(_)) => {}
            Some(Tomb::Reset) => self.reply(Ctrl::Reset(id, ResetReason::Aborted)),
            None => self.reply(Ctrl::Reset(id, ResetReason::Unknown)),
        }
    }

    /// The answer to our OPEN.
    fn on_result(&mut self, now: Instant, id: StreamId, code: OpenCode, limit: u32) {
        let Some(s) = self.map.get_mut(&id) else {
            self.stats.unknown_stream += 1;
            return;
        };
        match Refusal::from_code(code) {
            None => {
                s.send.limit = s.send.limit.max(limit as u64);
                s.send.last_progress = now;
                s.open = None;
                if s.phase == Phase::Opening {
                    s.phase = Phase::Open;
                    self.events.push_back(StreamEvent::Opened { id });
                    self.stats.opened += 1;
                }
                self.touch(now, id);
            }
            Some(why) if s.phase == Phase::Opening => {
                self.free(id, None);
                self.events.push_back(StreamEvent::Refused { id, why });
                self.stats.refused_by_peer += 1;
            }
            // A refusal of a stream the peer's own data opened: contradictory, ignored.
            Some(_) => self.stats.malformed += 1,
        }
    }

    /// Bytes of a stream. DATA on a stream we are still opening means the peer
    /// accepted it (its OPEN_RESULT is late or lost; the OPEN goes on until one comes).
    /// A short DATA's offset is expanded around the stream's cumulative point.
    fn on_data(
        &mut self,
        now: Instant,
        id: StreamId,
        off: DataOffset,
        fin: bool,
        rtx: bool,
        data: &[u8],
    ) {
        let Some(s) = self.map.get_mut(&id) else {
            self.stray_data(id);
            return;
        };
        let Ok(off) = off.resolve(s.recv.nxt, data.len()) else {
            self.stats.malformed += 1;
            return;
        };
        match s.phase {
            Phase::Pending => {
                self.stats.malformed += 1;
                return;
            }
            Phase::Opening => {
                s.phase = Phase::Open;
                s.send.last_progress = now;
                self.events.push_back(StreamEvent::Opened { id });
                self.stats.opened += 1;
            }
            Phase::Open => {}
        }
        let Ok(a) = s.recv.on_data(off, data, fin) else {
            self.stats.malformed += 1;
            return;
        };
        self.stats.data_bytes_received += a.new;
        self.stats.duplicate_bytes_received += a.dup;
        self.stats.beyond_credit_bytes += a.beyond;
        let r = &mut s.recv;
        r.unacked += 1;
        r.spurious |= rtx && a.new == 0 && a.dup > 0;
        // At once: a probe, the FIN, anything out of order, a duplicate (its ACK may
        // have been lost), every second frame. Otherwise after `ack_delay`.
        if data.is_empty() || fin || !a.in_order || a.dup > 0 || a.beyond > 0 || r.unacked >= 2 {
            r.ack_now = true;
        } else if r.ack_at.is_none() {
            r.ack_at = Some(now + self.cfg.ack_delay);
        }
        if r.has_news() && !r.notified {
            r.notified = true;
            self.events.push_back(StreamEvent::Readable { id });
        }
        self.touch(now, id);
    }

    /// DATA for a stream this end does not know: the final ACK if it closed cleanly,
    /// a RESET otherwise (bounded).
    fn stray_data(&mut self, id: StreamId) {
        self.stats.unknown_stream += 1;
        match self.tombs.get(&id).copied() {
            Some(Tomb::Closed(f)) => self.reply(Ctrl::Final(id, f)),
            Some(Tomb::Refused(_)) => {}
            Some(Tomb::Reset) => self.reply(Ctrl::Reset(id, ResetReason::Aborted)),
            None => self.reply(Ctrl::Reset(id, ResetReason::Unknown)),
        }
    }

    /// What the peer holds of our bytes, and its credit.
    fn on_ack(&mut self, now: Instant, id: StreamId, a: &Ack) {
        self.stats.acks_received += 1;
        let reorder = self.rtt.reorder_window(&self.cfg);
        let Some(s) = self.map.get_mut(&id) else {
            self.stats.unknown_stream += 1;
            return;
        };
        if s.phase != Phase::Open || s.send.on_ack(now, a, &mut self.rtt, reorder).is_err() {
            self.stats.malformed += 1;
            return;
        }
        // An ACK answers our OPEN as well as an OPEN_RESULT would.
        s.open = None;
        if a.spurious {
            self.rtt.on_spurious(now);
            self.stats.spurious_retransmits += 1;
        }
        self.rtt.decay(now);
        self.touch(now, id);
    }

    /// The peer reset a stream (or answers a frame for one it forgot).
    fn on_reset(&mut self, id: StreamId) {
        if self.map.contains_key(&id) {
            self.free(id, Some(Tomb::Reset));
            self.events.push_back(StreamEvent::Reset { id });
            self.stats.resets_received += 1;
        }
        self.reset_done(id);
        self.reply(Ctrl::ResetAck(id));
    }
}
