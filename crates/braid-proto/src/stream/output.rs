//! Frames to the peer: control frames and answers, ACKs, retransmissions, new data.

use bytes::Bytes;

use super::lane::Lane;
use super::send::{Out, SendSide};
use super::state::{Ctrl, Q_ACK, Q_DATA, Q_RTX};
use super::{StreamId, Streams};
use crate::time::Instant;
use crate::wire::stream::{
    data_header_len, emit_data_header, Ack, OpenCode, Repr, Sack, WireId, ACK_MIN_LEN, MAX_SACK,
    SACK_RANGE_LEN, SHORT_DATA_HEADER_LEN,
};

/// The stream as the frame's receiver will read it (we are the frame's sender).
fn wire(id: StreamId) -> WireId {
    WireId {
        n: id.n,
        opened_by_sender: id.ours,
    }
}

/// An OPEN's or OPEN_RESULT's 32-bit limit (a lower promise than the real one is
/// still true).
fn limit32(l: u64) -> u32 {
    l.min(u32::MAX as u64) as u32
}

/// A DATA frame of `send`'s bytes, short unless the stream's number is too large for
/// it (`wire::stream::data_header_len`).
fn data_frame(id: StreamId, send: &SendSide, out: Out, rtx: bool) -> Bytes {
    let h = data_header_len(wire(id));
    let mut v = vec![0u8; h + out.len as usize];
    emit_data_header(&mut v, wire(id), out.off, out.fin, rtx);
    send.copy(out.off, &mut v[h..]);
    Bytes::from(v)
}

/// Bytes of stream `id`'s data a frame of at most `len` bytes holds; `None` if not
/// even its header fits.
fn data_room(id: StreamId, len: usize) -> Option<u64> {
    len.checked_sub(data_header_len(wire(id))).map(|r| r as u64)
}

impl Streams {
    /// The next frame, by priority, and its lane (DATA on the fast lane at most
    /// `fast_len` bytes).
    pub(super) fn next_frame(
        &mut self,
        now: Instant,
        max_len: usize,
        fast_len: usize,
    ) -> Option<(Bytes, Lane)> {
        if let Some(f) = self.poll_ctrl(max_len) {
            return Some((f, Lane::Fast));
        }
        if let Some(f) = self.poll_ack(now, max_len) {
            return Some((f, Lane::Fast));
        }
        // A fast frame is never larger than a stripe one.
        let fast_len = fast_len.min(max_len);
        let sent = match self.poll_rtx(now, max_len, fast_len) {
            Some(x) => Some(x),
            None => self.poll_new(now, max_len, fast_len),
        };
        let (f, lane) = sent?;
        if lane == Lane::Fast {
            self.stats.fast_frames_sent += 1;
        }
        Some((f, lane))
    }

    /// Our control frames, then answers to stray frames.
    fn poll_ctrl(&mut self, max_len: usize) -> Option<Bytes> {
        loop {
            let (c, ours) = match self.ctrl.front() {
                Some(&c) => (c, true),
                None => (*self.replies.front()?, false),
            };
            let v = self.ctrl_bytes(c);
            if v.as_ref().is_some_and(|v| v.len() > max_len) {
                return None;
            }
            if ours {
                self.ctrl.pop_front();
            } else {
                self.replies.pop_front();
            }
            if let Some(v) = v {
                return Some(Bytes::from(v));
            }
        }
    }

    /// A control frame's bytes; `None` if its stream was forgotten since.
    fn ctrl_bytes(&self, c: Ctrl) -> Option<Vec<u8>> {
        let repr = match c {
            Ctrl::Open(id) => {
                let s = self.map.get(&id)?;
                let o = s.open.as_ref()?;
                Repr::Open {
                    id: wire(id),
                    src: o.src,
                    dst: o.dst,
                    limit: limit32(s.recv.limit),
                }
            }
            Ctrl::Result(id, code) => {
                let limit = match code {
                    OpenCode::Accepted => limit32(self.map.get(&id)?.recv.limit),
                    _ => 0,
                };
                Repr::OpenResult {
                    id: wire(id),
                    code,
                    limit,
                }
            }
            Ctrl::Reset(id, reason) => Repr::Reset {
                id: wire(id),
                reason,
            },
            Ctrl::ResetAck(id) => Repr::ResetAck { id: wire(id) },
            Ctrl::Final(id, f) => Repr::Ack(Box::new(Ack {
                id: wire(id),
                cum: f,
                limit: f,
                fin: true,
                spurious: false,
                sack: Sack::new(),
            })),
        };
        Some(repr.to_vec())
    }

    /// The next ACK due, with the credit granted now and as many SACK ranges as fit.
    fn poll_ack(&mut self, now: Instant, max_len: usize) -> Option<Bytes> {
        if max_len < ACK_MIN_LEN {
            return None;
        }
        let ranges = ((max_len - ACK_MIN_LEN) / SACK_RANGE_LEN).min(MAX_SACK);
        while let Some(id) = self.ack_q.pop_front() {
            let pool = self.pool();
            let Some(s) = self.map.get_mut(&id) else {
                continue;
            };
            s.queued &= !Q_ACK;
            if !s.recv.ack_now {
                continue;
            }
            let r = &mut s.recv;
            r.limit = r.grant(pool);
            let ack = Ack {
                id: wire(id),
                cum: r.nxt,
                limit: r.limit,
                fin: r.final_size.is_some(),
                spurious: r.spurious,
                sack: r.sack(ranges),
            };
            r.ack_sent();
            self.stats.acks_sent += 1;
            self.touch(now, id);
            return Some(Bytes::from(Repr::Ack(Box::new(ack)).to_vec()));
        }
        None
    }

    /// The next retransmission, round robin over the streams with frames lost; on
    /// the fast lane (a frame of at most `fast_len` bytes) if its stream is on it.
    fn poll_rtx(&mut self, now: Instant, max_len: usize, fast_len: usize) -> Option<(Bytes, Lane)> {
        if max_len < SHORT_DATA_HEADER_LEN {
            return None;
        }
        for _ in 0..self.rtx_q.len() {
            let id = self.rtx_q.pop_front()?;
            let Some(s) = self.map.get_mut(&id) else {
                continue;
            };
            s.queued &= !Q_RTX;
            let Some(room) = data_room(id, max_len) else {
                self.touch(now, id);
                continue;
            };
            let fast_room = data_room(id, fast_len).unwrap_or(0);
            let fast = s.lane.on && fast_room > 0;
            let room = if fast { fast_room } else { room };
            let Some(out) = s.send.next_rtx(now, self.tx, room, fast) else {
                self.touch(now, id);
                continue;
            };
            self.tx += 1;
            let f = data_frame(id, &s.send, out, true);
            self.stats.data_frames_sent += 1;
            self.stats.retransmitted_frames += 1;
            self.stats.retransmitted_bytes += out.len;
            self.touch(now, id);
            return Some((f, lane_of(fast)));
        }
        None
    }

    /// The next new data (or FIN, or probe), round robin over the streams; on the
    /// fast lane (a frame of at most `fast_len` bytes) if its stream sends little.
    fn poll_new(&mut self, now: Instant, max_len: usize, fast_len: usize) -> Option<(Bytes, Lane)> {
        if max_len < SHORT_DATA_HEADER_LEN {
            return None;
        }
        for _ in 0..self.data_q.len() {
            let id = self.data_q.pop_front()?;
            let Some(s) = self.map.get_mut(&id) else {
                continue;
            };
            s.queued &= !Q_DATA;
            let Some(room) = data_room(id, max_len) else {
                self.touch(now, id);
                continue;
            };
            let fast_room = data_room(id, fast_len).unwrap_or(0);
            let mut fast = false;
            let out = if s.can_send_new() {
                let backlog = s.send.written - s.send.nxt;
                let busy = s.send.in_flight();
                fast = s.lane.admit(now, &self.cfg, backlog, busy, fast_room);
                let room = if fast { fast_room } else { room };
                s.send.next_new(now, self.tx, room, fast)
            } else {
                None
            };
            let Some(out) = out else {
                self.touch(now, id);
                continue;
            };
            self.tx += 1;
            let f = data_frame(id, &s.send, out, false);
            self.stats.data_frames_sent += 1;
            self.stats.data_bytes_sent += out.len;
            if out.len == 0 && !out.fin {
                self.stats.probes_sent += 1;
            }
            if fast {
                s.lane.charge(out.len);
            }
            self.touch(now, id);
            return Some((f, lane_of(fast)));
        }
        None
    }
}

fn lane_of(fast: bool) -> Lane {
    if fast {
        Lane::Fast
    } else {
        Lane::Stripe
    }
}
