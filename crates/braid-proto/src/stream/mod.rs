//! Reliable byte streams across the bond: TCP connections terminated at both ends of
//! the tunnel, their bytes carried as streams (issue 32, item 1).
//!
//! [`Streams`] is the sans-IO state machine of one end: it opens, accepts and closes
//! streams, turns what the application writes into frames ([`crate::wire::stream`])
//! and the peer's frames back into ordered bytes. The session puts each frame into the
//! stripe like an inner packet; frames may be lost, duplicated or reordered on the way,
//! and the streams repair all three.
//!
//! # What it guarantees
//!
//! * Each stream's bytes and its FIN arrive exactly once and in order, or the stream
//!   ends with [`StreamEvent::Reset`].
//! * **Loss** is detected by time, not by counting duplicate ACKs: the bond stripes
//!   over channels tens of milliseconds apart, so reordering is normal. A frame is
//!   lost when a frame sent after it was acknowledged and its own round trip plus a
//!   reorder allowance has passed (RACK). The allowance is a quarter of the smoothed
//!   round trip (up to a whole one after retransmissions the receiver reports as
//!   unneeded), or the reordering measured on frames acknowledged late (the largest,
//!   slowly forgotten), whichever is larger, plus [`StreamConfig::reorder_slack`]. A
//!   retransmission timeout with backoff catches the tail. The round trip is measured
//!   from ACKs (one sample per ACK, the mean over the frames it newly covers), which
//!   the receiver sends after every second DATA frame, at once for anything out of
//!   order, or [`StreamConfig::ack_delay`] after a lone frame. All streams share the
//!   estimates: they cross the same bond.
//! * **No congestion control**: the bond paces. A sender is limited only by its
//!   peer's credit and by how fast the caller pulls frames ([`Streams::poll_frame`]).
//! * **Flow control** with credits (seed 004, Kung's credit-based flow control for
//!   virtual circuits): every ACK carries the credit limit, the offset below which the
//!   sender may send: the bytes the application read plus the stream's window. A
//!   reader that does not read stops only its own stream's sender. The window is
//!   [`StreamConfig::window`], divided down to the pool's fair share when many
//!   streams receive at once (never below [`StreamConfig::min_window`]; the pool less
//!   `min_window` for each stream not receiving yet, divided among those receiving),
//!   and credit is granted from what is left of [`StreamConfig::pool`], except that
//!   every stream may always have `min_window` of credit unread: the credit
//!   outstanding, and so the bytes held, over all streams never exceed the pool plus
//!   `min_window` per stream. (Without that floor, streams that hold credit unused,
//!   as a connection waiting for another to start does, could leave a new stream
//!   none, and wait for it for ever: found with 24 parallel connections of iperf3.)
//!   A new stream starts with its fair share of credit, but at most an eighth of
//!   what the pool has left and at least `min_window`, and gets its share with the
//!   first ACKs. A credit update goes out on its own
//!   when the limit would grow by a quarter of the window, or by a sixteenth when the
//!   sender is nearly out of credit; a sender that has no credit and nothing in flight
//!   sends an empty probe on the retransmission timer, which the receiver answers with
//!   an ACK: a lost update cannot deadlock a stream.
//! * **Memory** is bounded: an idle stream holds no buffers; a stream holds at most its
//!   send buffer (about the peer's window) and what it granted; forgotten streams
//!   leave a small tombstone for [`StreamConfig::linger`], at most `max_streams` of
//!   them, so late frames get the right answer (see below).
//!
//! # Opening and closing
//!
//! [`Streams::open`] sends an OPEN, again on a timer until the peer answers. The peer
//! reports [`StreamEvent::Incoming`] once, however many copies arrive, and answers
//! [`Streams::accept`] or [`Streams::refuse`] with an OPEN_RESULT; a copy of the OPEN
//! that arrives later gets the same answer. [`Streams::finish`] half-closes (FIN after
//! the bytes written); the stream is closed and forgotten when both directions are
//! finished and acknowledged and the application read everything
//! ([`Streams::is_closed`]). [`Streams::reset`] aborts: a RESET goes out (again until a
//! RESET_ACK or the peer's own RESET comes back, a few times at most) and the state is
//! freed at once. A stream that gets no answer for [`StreamConfig::give_up`] while it
//! waits for one is given up: [`StreamEvent::Reset`]. A DATA frame for a stream this end
//! no longer knows is answered with a RESET (or, for a stream closed cleanly, with the
//! final ACK), at most a bounded number of answers at a time.
//!
//! # Call order
//!
//! After any input (`handle_frame`, `handle_timeout`, or the application's `open`,
//! `accept`, `write`, `read`, `finish`, `reset`): drain [`Streams::poll_event`], pull
//! frames with [`Streams::poll_frame`] while [`Streams::wants_to_send`] and the bond has
//! room, and call [`Streams::handle_timeout`] once `now` reaches
//! [`Streams::poll_timeout`].

mod input;
mod lane;
mod output;
mod recv;
mod rtt;
mod send;
mod state;
#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;

use bytes::Bytes;

pub use self::lane::{Lane, FAST_BACKLOG, FAST_BURST, FAST_RATE};
use self::rtt::Rtt;
use self::state::{Ctrl, PeerIds, Phase, Resetting, Stream, Tomb};
use crate::time::{Duration, Instant};
use crate::wire::stream::{OpenCode, ResetReason};

/// A stream, as this end names it: who opened it, and its number among that end's
/// streams. On the wire the same stream is named from the frame's sender's side
/// ([`crate::wire::stream::WireId`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId {
    /// True if this end opened it.
    pub ours: bool,
    /// Its number among its opener's streams, from 0.
    pub n: u32,
}

/// The largest receive window of a stream (1 GiB, [`StreamConfig::window`]): a short
/// DATA frame carries the low 32 bits of its offset, which its receiver expands to the
/// offset nearest its cumulative point, right as long as no frame is more than 2^31
/// bytes away from it ([`crate::wire::stream::expand_offset`]).
pub const MAX_WINDOW: u32 = 1 << 30;

/// Settings of [`Streams`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamConfig {
    /// Receive window of one stream, bytes (default 8 MiB): the most credit a stream
    /// is granted beyond what its application read. It must cover the bond's rate
    /// times the stream's round trip (the slowest channel's, with its queue and the
    /// resequencing wait): 1 MiB held one flow at 100 Mbit/s on the lab's
    /// 5/20/60 ms links, whose sum is 170. At most [`MAX_WINDOW`] (a larger one is
    /// taken as that).
    pub window: u32,
    /// All streams' receive buffers together, bytes (default 128 MiB).
    pub pool: u64,
    /// Most streams open at once, both ends' together (default 16384).
    pub max_streams: u32,
    /// Smallest window of a stream, however many share the pool (default 64 KiB).
    pub min_window: u32,
    /// Longest wait before a lone DATA frame is acknowledged (default 2 ms).
    pub ack_delay: Duration,
    /// Round trip assumed before the first sample (default 100 ms).
    pub initial_rtt: Duration,
    /// Shortest retransmission timeout (default 20 ms).
    pub min_rto: Duration,
    /// Longest retransmission timeout, after backoff (default 2 s).
    pub max_rto: Duration,
    /// Added to the reorder allowance of loss detection (default 5 ms).
    pub reorder_slack: Duration,
    /// A stream that waits this long for any answer is given up (default 30 s).
    pub give_up: Duration,
    /// How long a forgotten stream's tombstone answers late frames (default 10 s).
    pub linger: Duration,
    /// The destinations (address, prefix length) this end connects the peer's
    /// streams to; empty (the default): any, as for the same connection carried as
    /// packets. The driver refuses the others (`Refusal::NotAllowed`).
    pub allow_to: Vec<(std::net::IpAddr, u8)>,
    /// Port ranges (first, last) whose connections the driver does not terminate
    /// (they pass as packets); empty (the default): none.
    pub except_ports: Vec<(u16, u16)>,
    /// Names this end's streams across the session's runs (announced in the
    /// handshake): a peer that sees the same one after a new run of ours (a reload
    /// that changed the channel list, which keeps the streams) keeps its streams; a
    /// new one (we restarted, and our streams are gone) resets them. 0 (the
    /// default): drawn from the session's seed, so each run has its own.
    pub run: u64,
    /// A stream that sends little takes the fast lane (default true): its DATA goes
    /// on the lowest-delay channel, past the stripe ([`Lane`], `stream::lane`).
    pub fast_lane: bool,
}

impl Default for StreamConfig {
    fn default() -> StreamConfig {
        StreamConfig {
            window: 8 << 20,
            pool: 128 << 20,
            max_streams: 16384,
            min_window: 64 << 10,
            ack_delay: Duration::from_millis(2),
            initial_rtt: Duration::from_millis(100),
            min_rto: Duration::from_millis(20),
            max_rto: Duration::from_secs(2),
            reorder_slack: Duration::from_millis(5),
            give_up: Duration::from_secs(30),
            linger: Duration::from_secs(10),
            allow_to: Vec::new(),
            except_ports: Vec::new(),
            run: 0,
            fast_lane: true,
        }
    }
}

/// Why an open failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The destination refused the connection.
    Refused,
    /// The destination could not be reached.
    Unreachable,
    /// Policy does not allow it.
    NotAllowed,
    /// Too many streams.
    TooMany,
}

impl Refusal {
    fn code(self) -> OpenCode {
        match self {
            Refusal::Refused => OpenCode::Refused,
            Refusal::Unreachable => OpenCode::Unreachable,
            Refusal::NotAllowed => OpenCode::NotAllowed,
            Refusal::TooMany => OpenCode::TooMany,
        }
    }

    fn from_code(c: OpenCode) -> Option<Refusal> {
        match c {
            OpenCode::Accepted => None,
            OpenCode::Refused => Some(Refusal::Refused),
            OpenCode::Unreachable => Some(Refusal::Unreachable),
            OpenCode::NotAllowed => Some(Refusal::NotAllowed),
            OpenCode::TooMany => Some(Refusal::TooMany),
        }
    }
}

/// Something the application should know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// The peer opened a stream: call [`Streams::accept`] or [`Streams::refuse`].
    Incoming {
        /// The stream.
        id: StreamId,
        /// The connection's source.
        src: SocketAddr,
        /// The connection's destination.
        dst: SocketAddr,
    },
    /// Our open was accepted.
    Opened {
        /// The stream.
        id: StreamId,
    },
    /// Our open was refused; the stream is gone.
    Refused {
        /// The stream.
        id: StreamId,
        /// Why.
        why: Refusal,
    },
    /// Bytes (or the end) to read. Sent again only after the next `read`.
    Readable {
        /// The stream.
        id: StreamId,
    },
    /// Room to write again after `write` took less than offered.
    Writable {
        /// The stream.
        id: StreamId,
    },
    /// The peer reset the stream, or it was given up: it is gone.
    Reset {
        /// The stream.
        id: StreamId,
    },
}

/// Counters of [`Streams`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// Frames handed out by `poll_frame`.
    pub frames_sent: u64,
    /// Frames given to `handle_frame` (malformed ones included).
    pub frames_received: u64,
    /// DATA frames sent (new, retransmitted and probes).
    pub data_frames_sent: u64,
    /// Bytes of stream data sent for the first time.
    pub data_bytes_sent: u64,
    /// DATA frames (new and retransmitted) handed out for the fast lane
    /// ([`Lane::Fast`]).
    pub fast_frames_sent: u64,
    /// DATA frames sent again.
    pub retransmitted_frames: u64,
    /// Bytes of stream data sent again.
    pub retransmitted_bytes: u64,
    /// Bytes of stream data received for the first time.
    pub data_bytes_received: u64,
    /// Bytes of stream data received that were here already.
    pub duplicate_bytes_received: u64,
    /// Bytes dropped because the sender went past its credit.
    pub beyond_credit_bytes: u64,
    /// ACKs sent.
    pub acks_sent: u64,
    /// ACKs received.
    pub acks_received: u64,
    /// Empty DATA frames sent to ask for credit.
    pub probes_sent: u64,
    /// Retransmission timeouts.
    pub timeouts: u64,
    /// Retransmissions the peer reported it did not need.
    pub spurious_retransmits: u64,
    /// Frames that could not be parsed, or contradicted the stream's state.
    pub malformed: u64,
    /// Frames for a stream this end does not know.
    pub unknown_stream: u64,
    /// Streams opened here.
    pub opens: u64,
    /// OPENs sent again.
    pub open_retransmits: u64,
    /// Our opens the peer accepted.
    pub opened: u64,
    /// Our opens the peer refused.
    pub refused_by_peer: u64,
    /// The peer's opens reported as [`StreamEvent::Incoming`].
    pub incoming: u64,
    /// The peer's opens accepted.
    pub accepted: u64,
    /// The peer's opens refused (by the application or for too many streams).
    pub refused: u64,
    /// Copies of an OPEN already answered or waiting for the application.
    pub duplicate_opens: u64,
    /// Streams reset here (by the application or given up).
    pub resets_sent: u64,
    /// Streams the peer reset.
    pub resets_received: u64,
    /// Streams given up.
    pub given_up: u64,
    /// Streams closed cleanly (both directions finished and acknowledged).
    pub closed: u64,
    /// Answers to stray frames not sent because too many were waiting.
    pub replies_dropped: u64,
}

/// The streams of one end: the sans-IO machine of [`crate::stream`].
#[derive(Debug)]
pub struct Streams {
    cfg: StreamConfig,
    map: HashMap<StreamId, Stream>,
    next_n: u32,
    peer_ids: PeerIds,
    tombs: HashMap<StreamId, Tomb>,
    tomb_order: VecDeque<(Instant, StreamId)>,
    resetting: HashMap<StreamId, Resetting>,
    timers: BTreeSet<(Instant, StreamId)>,
    ctrl: VecDeque<Ctrl>,
    /// Answers to the peer's stray frames (bounded).
    replies: VecDeque<Ctrl>,
    ack_q: VecDeque<StreamId>,
    rtx_q: VecDeque<StreamId>,
    data_q: VecDeque<StreamId>,
    events: VecDeque<StreamEvent>,
    rtt: Rtt,
    /// Transmission counter: orders every DATA frame sent.
    tx: u64,
    /// The latest `now` seen.
    now: Instant,
    /// Credit granted by all streams and not read yet (their commitments).
    committed: u64,
    /// Streams receiving data (some came, no FIN yet): they share the pool.
    receiving: usize,
    stats: StreamStats,
}

impl Streams {
    /// No streams yet.
    pub fn new(cfg: StreamConfig) -> Streams {
        Streams {
            rtt: Rtt::new(&cfg),
            cfg,
            map: HashMap::new(),
            next_n: 0,
            peer_ids: PeerIds::default(),
            tombs: HashMap::new(),
            tomb_order: VecDeque::new(),
            resetting: HashMap::new(),
            timers: BTreeSet::new(),
            ctrl: VecDeque::new(),
            replies: VecDeque::new(),
            ack_q: VecDeque::new(),
            rtx_q: VecDeque::new(),
            data_q: VecDeque::new(),
            events: VecDeque::new(),
            tx: 0,
            now: Instant::ZERO,
            committed: 0,
            receiving: 0,
            stats: StreamStats::default(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &StreamConfig {
        &self.cfg
    }

    /// Open a stream from `src` to `dst`: an OPEN goes to the peer, and
    /// [`StreamEvent::Opened`] or [`StreamEvent::Refused`] follows. Bytes written before
    /// it is opened wait (up to `min_window` of them). `TooMany` at `max_streams`.
    pub fn open(
        &mut self,
        now: Instant,
        src: SocketAddr,
        dst: SocketAddr,
    ) -> Result<StreamId, Refusal> {
        self.tick(now);
        if self.map.len() >= self.cfg.max_streams as usize || self.next_n == u32::MAX {
            return Err(Refusal::TooMany);
        }
        let id = StreamId {
            ours: true,
            n: self.next_n,
        };
        self.next_n += 1;
        let next = now + Duration::from_micros(self.rtt.rto(&self.cfg));
        let mut s = Stream::opening(now, src, dst, next);
        s.recv.limit = self.initial_credit();
        self.map.insert(id, s);
        self.ctrl.push_back(Ctrl::Open(id));
        self.stats.opens += 1;
        self.touch(now, id);
        Ok(id)
    }

    /// Accept the peer's stream `id` (after [`StreamEvent::Incoming`]).
    pub fn accept(&mut self, now: Instant, id: StreamId) {
        self.tick(now);
        let credit = self.initial_credit();
        let Some(s) = self.map.get_mut(&id) else {
            return;
        };
        if s.phase != Phase::Pending {
            return;
        }
        s.phase = Phase::Open;
        s.recv.limit = credit;
        self.ctrl.push_back(Ctrl::Result(id, OpenCode::Accepted));
        self.stats.accepted += 1;
        self.touch(now, id);
    }

    /// Refuse the peer's stream `id` (after [`StreamEvent::Incoming`]); it is forgotten.
    pub fn refuse(&mut self, now: Instant, id: StreamId, why: Refusal) {
        self.tick(now);
        if self.map.get(&id).is_none_or(|s| s.phase != Phase::Pending) {
            return;
        }
        self.free(id, Some(Tomb::Refused(why)));
        self.ctrl.push_back(Ctrl::Result(id, why.code()));
        self.stats.refused += 1;
    }

    /// Write bytes to stream `id`; returns how many were taken (0 if the stream is
    /// unknown, not accepted yet, or finished). The send buffer holds about the peer's
    /// window; when it took less than offered, [`StreamEvent::Writable`] follows once
    /// there is room.
    pub fn write(&mut self, now: Instant, id: StreamId, data: &[u8]) -> usize {
        self.tick(now);
        let min = self.min_window();
        let Some(s) = self.map.get_mut(&id) else {
            return 0;
        };
        if s.phase == Phase::Pending || s.send.fin_wanted {
            return 0;
        }
        let n = s.send.write(data, min);
        self.touch(now, id);
        n
    }

    /// Read in-order bytes of stream `id` into `buf`; returns how many. Reading gives
    /// credit back to the peer.
    pub fn read(&mut self, id: StreamId, buf: &mut [u8]) -> usize {
        let Some(s) = self.map.get_mut(&id) else {
            return 0;
        };
        let n = s.recv.read(buf);
        if n > 0 {
            // The pool as it is after this read: is a credit update worth a frame?
            self.account(id);
            let pool = self.pool();
            if let Some(s) = self.map.get_mut(&id) {
                s.recv.ack_now |= s.recv.update_due(pool);
            }
        }
        let now = self.now;
        self.touch(now, id);
        n
    }

    /// In-order bytes of stream `id` waiting to be read.
    pub fn readable(&self, id: StreamId) -> usize {
        self.map.get(&id).map_or(0, |s| s.recv.readable() as usize)
    }

    /// The peer's FIN came and every byte before it was read (also true for a while
    /// after a stream closed cleanly and was forgotten).
    pub fn finished(&self, id: StreamId) -> bool {
        match self.map.get(&id) {
            Some(s) => s.recv.finished(),
            None => matches!(self.tombs.get(&id), Some(Tomb::Closed(_))),
        }
    }

    /// Half-close stream `id`: a FIN follows the bytes written.
    pub fn finish(&mut self, now: Instant, id: StreamId) {
        self.tick(now);
        if let Some(s) = self.map.get_mut(&id) {
            s.send.fin_wanted = true;
            self.touch(now, id);
        }
    }

    /// Abort stream `id`: the peer is told, the state is freed now, no event follows.
    pub fn reset(&mut self, now: Instant, id: StreamId) {
        self.tick(now);
        if self.map.contains_key(&id) {
            self.free(id, Some(Tomb::Reset));
            self.start_reset(now, id, ResetReason::Aborted);
        }
    }

    /// True once stream `id` holds no state: both directions finished and
    /// acknowledged, refused, or reset (true also for an id never used).
    pub fn is_closed(&self, id: StreamId) -> bool {
        !self.map.contains_key(&id)
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<StreamEvent> {
        self.events.pop_front()
    }

    /// A frame is ready now: a control frame or ACK, a retransmission, or new data
    /// within the peer's credit.
    pub fn wants_to_send(&self) -> bool {
        let live = |id: &StreamId| self.map.get(id);
        self.ctrl.iter().any(|c| self.ctrl_live(c))
            || !self.replies.is_empty()
            || self
                .ack_q
                .iter()
                .any(|id| live(id).is_some_and(|s| s.recv.ack_now))
            || self
                .rtx_q
                .iter()
                .any(|id| live(id).is_some_and(|s| s.send.lost > 0))
            || self
                .data_q
                .iter()
                .any(|id| live(id).is_some_and(Stream::can_send_new))
    }

    /// The next frame, at most `max_len` bytes: control frames and ACKs first, then
    /// retransmissions, then new data, each round robin over the streams. `None` when
    /// nothing is ready (or nothing fits: give at least
    /// [`crate::wire::stream::MAX_CONTROL_LEN`] bytes).
    pub fn poll_frame(&mut self, now: Instant, max_len: usize) -> Option<Bytes> {
        self.poll_frame_lane(now, max_len, 0).map(|(f, _)| f)
    }

    /// The next frame as [`Streams::poll_frame`], and the lane it takes: control
    /// frames and ACKs [`Lane::Fast`], DATA [`Lane::Fast`] (at most `fast_len` bytes)
    /// when its stream sends little (`stream::lane`), else [`Lane::Stripe`]. A
    /// `fast_len` of 0: no DATA takes the fast lane now.
    pub fn poll_frame_lane(
        &mut self,
        now: Instant,
        max_len: usize,
        fast_len: usize,
    ) -> Option<(Bytes, Lane)> {
        self.tick(now);
        let f = self.next_frame(now, max_len, fast_len)?;
        self.stats.frames_sent += 1;
        Some(f)
    }

    /// A frame from the peer. Malformed frames are counted and dropped.
    pub fn handle_frame(&mut self, now: Instant, frame: &[u8]) {
        self.tick(now);
        self.stats.frames_received += 1;
        self.on_frame(now, frame);
    }

    /// When [`Streams::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.first().map(|&(t, _)| t)
    }

    /// Run the timers due at `now` (delayed ACKs, loss detection, retransmission,
    /// OPEN and RESET repeats, giving up).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.tick(now);
        while let Some(&(t, id)) = self.timers.first() {
            if t > now {
                break;
            }
            self.timers.pop_first();
            if let Some(s) = self.map.get_mut(&id) {
                s.armed = None;
                self.on_stream_timer(now, id);
                self.touch(now, id);
            } else {
                self.on_reset_timer(now, id);
            }
        }
    }

    /// The peer restarted: every stream ends with [`StreamEvent::Reset`] and all state
    /// goes, the peer's stream numbers included (it counts from 0 again).
    pub fn reset_all(&mut self) {
        let mut ids: Vec<StreamId> = self.map.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            self.events.push_back(StreamEvent::Reset { id });
        }
        self.stats.resets_received += self.map.len() as u64;
        self.map.clear();
        self.peer_ids = PeerIds::default();
        self.tombs.clear();
        self.tomb_order.clear();
        self.resetting.clear();
        self.timers.clear();
        self.ctrl.clear();
        self.replies.clear();
        self.ack_q.clear();
        self.rtx_q.clear();
        self.data_q.clear();
        self.committed = 0;
        self.receiving = 0;
    }

    /// Streams open (being opened, waiting for `accept`, or open).
    pub fn open_streams(&self) -> usize {
        self.map.len()
    }

    /// Bytes held, sent and not acknowledged or received and not read.
    pub fn buffered(&self) -> usize {
        let b: u64 = self
            .map
            .values()
            .map(|s| s.send.buffered() + s.recv.buffered())
            .sum();
        b as usize
    }

    /// Bytes written and not sent yet, over all streams.
    pub fn unsent(&self) -> u64 {
        self.map.values().map(|s| s.send.written - s.send.nxt).sum()
    }

    /// The counters.
    pub fn stats(&self) -> &StreamStats {
        &self.stats
    }
}
