//! One stream's state, and the bookkeeping of [`Streams`] around it: the send queues,
//! the timers, the pool's accounting, tombstones of forgotten streams and RESETs
//! waiting for their acknowledgement.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use super::lane::FastLane;
use super::recv::{Pool, RecvSide};
use super::rtt::backoff;
use super::send::SendSide;
use super::{Refusal, StreamEvent, StreamId, Streams, MAX_WINDOW};
use crate::time::{Duration, Instant};
use crate::wire::stream::{OpenCode, ResetReason};

/// Queue flag: the stream is in the ACK queue.
pub(super) const Q_ACK: u8 = 1;
/// Queue flag: the stream is in the retransmission queue.
pub(super) const Q_RTX: u8 = 2;
/// Queue flag: the stream is in the new-data queue.
pub(super) const Q_DATA: u8 = 4;
/// Most answers to the peer's stray frames waiting at once.
pub(super) const REPLY_CAP: usize = 256;
/// A RESET is sent this many times at most.
const RESET_TRIES: u32 = 5;
/// Peer stream numbers seen out of order kept at most, per allowed stream.
const PEER_BACKLOG_PER_STREAM: usize = 2;

/// Where a stream is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// We sent an OPEN and wait for the answer.
    Opening,
    /// The peer opened it; the application has not accepted it yet.
    Pending,
    /// Open (possibly half-closed).
    Open,
}

/// Our OPEN, repeated until answered.
#[derive(Debug)]
pub(super) struct OpenRetx {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub next: Instant,
    pub tries: u32,
}

/// One stream.
#[derive(Debug)]
pub(super) struct Stream {
    pub phase: Phase,
    /// Our OPEN, until an OPEN_RESULT or an ACK answers it.
    pub open: Option<Box<OpenRetx>>,
    pub send: SendSide,
    pub recv: RecvSide,
    /// Whether its DATA takes the fast lane (`stream::lane`).
    pub lane: FastLane,
    /// The instant of its entry in the timer set.
    pub armed: Option<Instant>,
    /// The send queues it is in ([`Q_ACK`], [`Q_RTX`], [`Q_DATA`]).
    pub queued: u8,
    /// Its commitment as counted in [`Streams`]'s total.
    pub committed: u64,
    /// Counted among the receiving streams.
    pub counted: bool,
}

impl Stream {
    /// A stream we open.
    pub fn opening(now: Instant, src: SocketAddr, dst: SocketAddr, next: Instant) -> Stream {
        let mut s = Stream::pending(now, 0);
        s.phase = Phase::Opening;
        s.open = Some(Box::new(OpenRetx {
            src,
            dst,
            next,
            tries: 0,
        }));
        s
    }

    /// A stream the peer opened, allowing us `limit` bytes.
    pub fn pending(now: Instant, limit: u64) -> Stream {
        let mut send = SendSide::new(now);
        send.limit = limit;
        Stream {
            phase: Phase::Pending,
            open: None,
            send,
            recv: RecvSide::default(),
            lane: FastLane::new(now),
            armed: None,
            queued: 0,
            committed: 0,
            counted: false,
        }
    }

    /// New data (or a FIN, or a probe) can go out.
    pub fn can_send_new(&self) -> bool {
        self.phase == Phase::Open && self.send.has_new()
    }

    /// Both directions finished and acknowledged, everything read, no ACK owed.
    fn closable(&self) -> bool {
        self.phase == Phase::Open
            && self.open.is_none()
            && self.send.fin_acked
            && self.recv.finished()
            && !self.recv.ack_pending()
    }

    /// Waiting for an answer from the peer (the give-up clock runs).
    fn waiting(&self) -> bool {
        self.open.is_some() || self.send.in_flight() || self.send.blocked()
    }

    /// The retransmission timer should run: frames in flight, or a probe to send.
    fn needs_rto(&self) -> bool {
        self.phase == Phase::Open
            && self.open.is_none()
            && (self.send.in_flight() || self.send.blocked())
    }

    /// Its next timer.
    fn deadline(&self, give_up: Duration) -> Option<Instant> {
        let quit = self.send.waiting.then(|| self.send.last_progress + give_up);
        [
            self.open.as_ref().map(|o| o.next),
            self.recv.ack_at,
            self.send.rto_at,
            self.send.rack_at,
            quit,
        ]
        .into_iter()
        .flatten()
        .min()
    }
}

/// What is left of a forgotten stream, to answer late frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tomb {
    /// The peer's open we refused: a copy of the OPEN gets the same answer.
    Refused(Refusal),
    /// Reset (by either end, or given up).
    Reset,
    /// Closed cleanly; the peer's final size, to acknowledge a repeated FIN.
    Closed(u64),
}

/// A RESET waiting for its RESET_ACK.
#[derive(Debug)]
pub(super) struct Resetting {
    pub reason: ResetReason,
    pub next: Instant,
    pub tries: u32,
}

/// A control frame to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ctrl {
    /// Our OPEN (built from the stream's state when sent).
    Open(StreamId),
    /// An OPEN_RESULT.
    Result(StreamId, OpenCode),
    /// A RESET.
    Reset(StreamId, ResetReason),
    /// A RESET_ACK.
    ResetAck(StreamId),
    /// The final ACK of a stream closed cleanly: everything up to the final size, FIN.
    Final(StreamId, u64),
}

/// The peer's stream numbers seen: all below `floor`, and the ones in `above`.
#[derive(Debug, Default)]
pub(super) struct PeerIds {
    floor: u32,
    above: BTreeSet<u32>,
}

impl PeerIds {
    pub fn seen(&self, n: u32) -> bool {
        n < self.floor || self.above.contains(&n)
    }

    pub fn insert(&mut self, n: u32) {
        if n < self.floor {
            return;
        }
        self.above.insert(n);
        while self.above.first() == Some(&self.floor) {
            self.above.pop_first();
            match self.floor.checked_add(1) {
                Some(f) => self.floor = f,
                None => break,
            }
        }
    }

    /// Numbers kept above the floor (seen out of order).
    pub fn backlog(&self) -> usize {
        self.above.len()
    }
}

impl Streams {
    /// Note the time; drop expired tombstones.
    pub(super) fn tick(&mut self, now: Instant) {
        self.now = self.now.max(now);
        while let Some(&(t, id)) = self.tomb_order.front() {
            if t > self.now {
                break;
            }
            self.tomb_order.pop_front();
            self.tombs.remove(&id);
        }
    }

    /// The window of one stream: the configured one, within 1 and [`MAX_WINDOW`].
    pub(super) fn window(&self) -> u64 {
        self.cfg.window.clamp(1, MAX_WINDOW) as u64
    }

    /// The smallest window (never above the window).
    pub(super) fn min_window(&self) -> u64 {
        (self.cfg.min_window as u64).min(self.window())
    }

    /// The pool's numbers now. The fair share divides the pool among the receiving
    /// streams, less `min_window` kept for each stream that does not receive yet.
    pub(super) fn pool(&self) -> Pool {
        let min = self.min_window();
        let window = self.window();
        let idle = (self.map.len() - self.receiving) as u64;
        let rest = self.cfg.pool.saturating_sub(idle.saturating_mul(min));
        let share = rest / self.receiving.max(1) as u64;
        Pool {
            pool: self.cfg.pool,
            committed: self.committed,
            fair: share.clamp(min, window),
            min,
        }
    }

    /// The credit a new stream starts with: its fair share, but at most an eighth of
    /// what the pool has left, and at least `min_window` even when the pool is full
    /// (the floor every stream has: see the module docs).
    /// A stream on a bond with room starts at the bond's rate: with `min_window` only,
    /// its first round trip (the slowest channel's) carried 64 KiB.
    pub(super) fn initial_credit(&self) -> u64 {
        let left = self.cfg.pool.saturating_sub(self.committed);
        self.pool().fair.min(left / 8).max(self.min_window())
    }

    /// Too many of the peer's stream numbers seen out of order to keep more.
    pub(super) fn peer_backlog_full(&self) -> bool {
        self.peer_ids.backlog() >= PEER_BACKLOG_PER_STREAM * self.cfg.max_streams as usize
    }

    /// After any change to stream `id`: free it if it is done, update the pool's
    /// accounting, its place in the send queues, its events and its timer.
    pub(super) fn touch(&mut self, now: Instant, id: StreamId) {
        let Some(s) = self.map.get(&id) else {
            return;
        };
        if s.closable() {
            let f = s.recv.final_size.unwrap_or(0);
            self.stats.closed += 1;
            self.free(id, Some(Tomb::Closed(f)));
            return;
        }
        self.account(id);
        self.enqueue(id);
        self.arm(now, id);
    }

    /// Keep the total commitment and the count of receiving streams up to date.
    pub(super) fn account(&mut self, id: StreamId) {
        let Some(s) = self.map.get_mut(&id) else {
            return;
        };
        let c = s.recv.commitment();
        self.committed = self.committed - s.committed + c;
        s.committed = c;
        let receiving = s.recv.got_data && s.recv.final_size.is_none();
        if receiving != s.counted {
            s.counted = receiving;
            if receiving {
                self.receiving += 1;
            } else {
                self.receiving -= 1;
            }
        }
    }

    /// Put the stream in the send queues it belongs in; tell the application when
    /// there is room to write again.
    fn enqueue(&mut self, id: StreamId) {
        let min = self.min_window();
        let Some(s) = self.map.get_mut(&id) else {
            return;
        };
        if s.recv.ack_now && s.queued & Q_ACK == 0 {
            s.queued |= Q_ACK;
            self.ack_q.push_back(id);
        }
        if s.send.lost > 0 && s.queued & Q_RTX == 0 {
            s.queued |= Q_RTX;
            self.rtx_q.push_back(id);
        }
        if s.can_send_new() && s.queued & Q_DATA == 0 {
            s.queued |= Q_DATA;
            self.data_q.push_back(id);
        }
        if s.send.want_writable
            && s.phase == Phase::Open
            && s.send.room(min) * 4 >= s.send.capacity(min)
        {
            s.send.want_writable = false;
            self.events.push_back(StreamEvent::Writable { id });
        }
    }

    /// Start the give-up clock when a wait begins, run the retransmission timer when
    /// needed, and put the stream's next deadline in the timer set.
    fn arm(&mut self, now: Instant, id: StreamId) {
        let rto = self.rtt.rto(&self.cfg);
        let max = self.cfg.max_rto.as_micros();
        let give_up = self.cfg.give_up;
        let Some(s) = self.map.get_mut(&id) else {
            return;
        };
        let waiting = s.waiting();
        if waiting && !s.send.waiting {
            s.send.last_progress = now;
        }
        s.send.waiting = waiting;
        if !s.needs_rto() {
            s.send.rto_at = None;
        } else if s.send.rto_at.is_none() {
            let t = backoff(rto, s.send.backoff, max);
            s.send.rto_at = Some(now + Duration::from_micros(t));
        }
        let d = s.deadline(give_up);
        if d != s.armed {
            if let Some(t) = s.armed {
                self.timers.remove(&(t, id));
            }
            if let Some(t) = d {
                self.timers.insert((t, id));
            }
            s.armed = d;
        }
    }

    /// Forget stream `id`, leaving `tomb` behind.
    pub(super) fn free(&mut self, id: StreamId, tomb: Option<Tomb>) {
        let Some(s) = self.map.remove(&id) else {
            return;
        };
        if let Some(t) = s.armed {
            self.timers.remove(&(t, id));
        }
        self.committed -= s.committed;
        if s.counted {
            self.receiving -= 1;
        }
        if s.queued & Q_ACK != 0 {
            self.ack_q.retain(|x| *x != id);
        }
        if s.queued & Q_RTX != 0 {
            self.rtx_q.retain(|x| *x != id);
        }
        if s.queued & Q_DATA != 0 {
            self.data_q.retain(|x| *x != id);
        }
        if let Some(t) = tomb {
            self.bury(id, t);
        }
    }

    /// Leave a tombstone for `linger`; the oldest go first beyond `max_streams`.
    pub(super) fn bury(&mut self, id: StreamId, t: Tomb) {
        let cap = self.cfg.max_streams.max(1) as usize;
        while self.tombs.len() >= cap {
            let Some((_, old)) = self.tomb_order.pop_front() else {
                break;
            };
            self.tombs.remove(&old);
        }
        if self.tombs.insert(id, t).is_none() {
            self.tomb_order.push_back((self.now + self.cfg.linger, id));
        }
    }

    /// Send a RESET for the forgotten stream `id`, and again until acknowledged.
    pub(super) fn start_reset(&mut self, now: Instant, id: StreamId, reason: ResetReason) {
        self.ctrl.push_back(Ctrl::Reset(id, reason));
        self.stats.resets_sent += 1;
        if self.resetting.len() >= self.cfg.max_streams as usize || self.resetting.contains_key(&id)
        {
            return;
        }
        let next = now + Duration::from_micros(self.rtt.rto(&self.cfg));
        self.resetting.insert(
            id,
            Resetting {
                reason,
                next,
                tries: 1,
            },
        );
        self.timers.insert((next, id));
    }

    /// The RESET of `id` was acknowledged (or crossed the peer's).
    pub(super) fn reset_done(&mut self, id: StreamId) {
        if let Some(r) = self.resetting.remove(&id) {
            self.timers.remove(&(r.next, id));
        }
    }

    /// A RESET's repeat timer.
    pub(super) fn on_reset_timer(&mut self, now: Instant, id: StreamId) {
        let rto = self.rtt.rto(&self.cfg);
        let max = self.cfg.max_rto.as_micros();
        let Some(r) = self.resetting.get_mut(&id) else {
            return;
        };
        if r.tries >= RESET_TRIES {
            self.resetting.remove(&id);
            return;
        }
        r.next = now + Duration::from_micros(backoff(rto, r.tries, max));
        r.tries += 1;
        self.timers.insert((r.next, id));
        self.ctrl.push_back(Ctrl::Reset(id, r.reason));
    }

    /// Stream `id`'s timer: OPEN repeat, delayed ACK, loss detection, retransmission
    /// timeout, giving up.
    pub(super) fn on_stream_timer(&mut self, now: Instant, id: StreamId) {
        let rto = self.rtt.rto(&self.cfg);
        let max = self.cfg.max_rto.as_micros();
        let reorder = self.rtt.reorder_window(&self.cfg);
        let give_up = self.cfg.give_up;
        let Some(s) = self.map.get_mut(&id) else {
            return;
        };
        if let Some(o) = s.open.as_mut().filter(|o| o.next <= now) {
            o.tries += 1;
            o.next = now + Duration::from_micros(backoff(rto, o.tries, max));
            self.ctrl.push_back(Ctrl::Open(id));
            self.stats.open_retransmits += 1;
        }
        if s.recv.ack_at.is_some_and(|t| t <= now) {
            s.recv.ack_at = None;
            s.recv.ack_now = true;
        }
        if s.send.rack_at.is_some_and(|t| t <= now) {
            s.send.detect_lost(now, reorder);
        }
        if s.send.rto_at.is_some_and(|t| t <= now) {
            s.send.on_rto();
            self.stats.timeouts += 1;
        }
        if s.send.waiting && now >= s.send.last_progress + give_up {
            self.give_up(now, id);
        }
    }

    /// No answer for too long: the stream ends.
    fn give_up(&mut self, now: Instant, id: StreamId) {
        self.free(id, Some(Tomb::Reset));
        self.start_reset(now, id, ResetReason::GaveUp);
        self.events.push_back(StreamEvent::Reset { id });
        self.stats.given_up += 1;
    }

    /// Queue an answer to a stray frame, unless too many wait.
    pub(super) fn reply(&mut self, c: Ctrl) {
        if self.replies.len() < REPLY_CAP {
            self.replies.push_back(c);
        } else {
            self.stats.replies_dropped += 1;
        }
    }

    /// The control frame still means something (its stream was not forgotten since).
    pub(super) fn ctrl_live(&self, c: &Ctrl) -> bool {
        match c {
            Ctrl::Open(id) => self.map.get(id).is_some_and(|s| s.open.is_some()),
            Ctrl::Result(id, OpenCode::Accepted) => self.map.contains_key(id),
            _ => true,
        }
    }
}
