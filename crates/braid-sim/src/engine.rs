//! The discrete-event engine: one [`Striper`] and one [`Resequencer`] from `braid-proto`,
//! joined by simulated channels, fed by a traffic source, in virtual time.
//!
//! Time is kept in nanoseconds; the protocol core sees microseconds (`now / 1000`).
//! Events sit in a binary heap ordered by (time, insertion number), so simultaneous
//! events run in the order they were scheduled and every run is reproducible bit for
//! bit. Each channel has at most one pending "transmission done" and one pending
//! "arrival" event (its in-flight datagrams wait in a FIFO behind the head), so the
//! heap stays small whatever the load.
//!
//! # The sender
//!
//! The striper's datagrams go into per-channel drop-tail transmit queues, which drain at
//! the channel rate. A backlogged source behaves like a process writing to a kernel
//! interface queue: it offers the next packet only when the channel the scheduler will
//! pick for it has room in its queue, and otherwise sleeps until that queue drains. So a
//! scheduler that overloads one channel slows the whole sender down, and goodput
//! differences come out of the model. Timed sources (constant rate, Poisson, trace) never
//! wait: a datagram that finds its queue full is dropped (drop-tail) and counted.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use braid_proto::sched::baseline::Baseline;
use braid_proto::session::{self, Session};
use braid_proto::{Instant, Mode, Policy, Resequencer, StripeConfig, Striper};
use bytes::{Bytes, BytesMut};

use crate::ends::{Ends, Outgoing, SessionEnds};
pub use crate::metrics::SERIES_BIN;
use crate::metrics::{Receiver, Resync};
use crate::model::{Arrivals, ChannelSpec, Fate, LossModel, Nanos, Rate, SizeGen};
use crate::rng::{streams, Rng};
pub use crate::run::{
    ChannelResult, CreditResult, RunConfig, RunError, RunResult, SessionResult, Variant, MIN_PACKET,
};

/// Event code of the TCP source's acknowledgement arrivals (`Ev::Ack`).
const ACK: u128 = 0x4000;
/// Event code of the TCP source's retransmission timer (`Ev::TcpTimer`).
const TCP_TIMER: u128 = 0x4001;
/// Event code of the VoIP flow's next packet.
const VOIP: u128 = 0x4002;

/// Event codes from this one up are reverse arrivals (`Ev::ArriveBack`), one per
/// channel; forward events use codes 2..=129.
const BACK: u128 = 0x8000;

/// Source and destination address bytes (IPv4 offsets 12..20) of every simulated
/// packet: one flow, 10.0.0.1 to 10.0.0.2.
const ADDRS: [u8; 8] = [10, 0, 0, 1, 10, 0, 0, 2];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ev {
    /// The timed source offers its next packet.
    Source,
    /// The channel finished serializing its current datagram.
    TxDone(u32),
    /// The head of the channel's in-flight FIFO arrives.
    Arrive(u32),
    /// The head of the channel's reverse FIFO (session runs) arrives at the sender.
    ArriveBack(u32),
    /// The measurement window ends; the source stops.
    Stop,
    /// TCP source: the head of the acknowledgement path arrives at the sender.
    Ack,
    /// TCP source: the retransmission timer may be due.
    TcpTimer,
    /// The VoIP flow (`[voip]`) sends its next packet.
    Voip,
}

struct Queued {
    data: Bytes,
    control: bool,
}

struct Chan {
    spec: ChannelSpec,
    ns_per_byte: f64,
    queue: VecDeque<Queued>,
    queued_bytes: u64,
    /// The datagram being serialized, and its fate.
    on_wire: Option<(Queued, Fate)>,
    in_flight: VecDeque<(Nanos, Bytes)>,
    last_arrival: Nanos,
    loss: LossModel,
    jitter_rng: Rng,
    res: ChannelResult,
}

impl Chan {
    /// Serialization time per byte at `now` (the rate may change during a run).
    #[inline]
    fn ns_per_byte(&self, now: Nanos) -> f64 {
        if self.spec.changes.is_empty() {
            self.ns_per_byte
        } else {
            8e9 / self.spec.rate_at(now)
        }
    }
}

/// Packet buffers carved out of large shared allocations.
struct Arena {
    buf: BytesMut,
}

const ARENA_CHUNK: usize = 1 << 20;

impl Arena {
    #[inline]
    fn packet(&mut self, id: u64, sent: Nanos, len: usize) -> Bytes {
        if self.buf.capacity() - self.buf.len() < len {
            self.buf = BytesMut::with_capacity(ARENA_CHUNK.max(len));
        }
        self.buf.extend_from_slice(&[0x45, 0, 0, 0]);
        self.buf.extend_from_slice(&id.to_be_bytes());
        self.buf.extend_from_slice(&ADDRS);
        self.buf.extend_from_slice(&sent.to_be_bytes());
        self.buf.resize(self.buf.len() + len - 28, 0);
        self.buf.split().freeze()
    }
}

/// The packet id (bytes 4..12) and send time (bytes 20..28, ns) of a simulated packet.
#[inline]
pub fn packet_stamp(p: &[u8]) -> Option<(u64, Nanos)> {
    if p.len() < 28 {
        return None;
    }
    let id = u64::from_be_bytes(p[4..12].try_into().ok()?);
    let t = u64::from_be_bytes(p[20..28].try_into().ok()?);
    Some((id, t))
}

#[derive(Clone, Copy)]
enum SrcKind {
    Backlogged,
    Cbr(Rate),
    Poisson(Rate, f64),
    Trace,
    Tcp,
}

struct Source {
    kind: SrcKind,
    trace: Vec<(Nanos, u32)>,
    base: Nanos,
    sizes: SizeGen,
    rng: Rng,
    next_id: u64,
    trace_idx: usize,
    stopped: bool,
    /// Backlogged: a packet made but not yet accepted (its channel's queue was full).
    pending: Option<(u32, usize)>,
    /// Backlogged: waiting for this channel's queue to drain.
    blocked_on: Option<usize>,
}

struct Sim {
    now: Nanos,
    /// Keys `time << 64 | insertion number << 16 | event code`: one integer compare.
    heap: BinaryHeap<Reverse<u128>>,
    evseq: u64,
    ends: Ends,
    /// Only for non-causal policies: a copy to predict the striper's choice.
    baseline: Option<Baseline>,
    sqf: bool,
    chans: Vec<Chan>,
    src: Source,
    arena: Arena,
    rx: Receiver,
    window_end: Nanos,
    packets_limit: u64,
    send_errors: u64,
    last_timer_fire: Option<Nanos>,
    hard_stop: Option<Nanos>,
    drain: Nanos,
    events: u64,
    /// The TCP source, when the traffic is one.
    tcp: Option<Box<crate::tcp::TcpFlow>>,
    /// The VoIP flow beside the traffic (`[voip]`, session runs).
    voip: Option<(crate::voip::VoipSpec, crate::voip::Voip)>,
}

/// Run one configuration to completion.
pub fn run(cfg: &RunConfig) -> Result<RunResult, RunError> {
    match &cfg.variant {
        Variant::Striped(sc) => run_striped(cfg, sc),
        Variant::Session(sess) => run_session(cfg, sess),
        Variant::ErrCtl(spec) => crate::errctl::run(cfg, spec),
        Variant::SumOfSingles => {
            let mut total: Option<RunResult> = None;
            for (i, ch) in cfg.channels.iter().enumerate() {
                let mut sc = StripeConfig::srr(vec![u32::MAX], 1);
                sc.mode = Mode::None;
                sc.max_packet = u32::MAX;
                let single = RunConfig {
                    channels: vec![ch.clone()],
                    variant: Variant::Striped(sc.clone()),
                    ..cfg.clone()
                };
                let mut r = run_striped(&single, &sc)?;
                if let Some(c) = r.channels.first_mut() {
                    c.id = i;
                }
                total = Some(match total {
                    None => r,
                    Some(t) => merge(t, r),
                });
            }
            Ok(total.unwrap_or_default())
        }
    }
}

fn merge(mut a: RunResult, b: RunResult) -> RunResult {
    a.duration_s = a.duration_s.max(b.duration_s);
    a.goodput_bps += b.goodput_bps;
    a.inorder_goodput_bps += b.inorder_goodput_bps;
    a.packets_sent += b.packets_sent;
    a.packets_delivered += b.packets_delivered;
    a.packets_lost += b.packets_lost;
    a.lost_on_channel += b.lost_on_channel;
    a.dropped_at_sender += b.dropped_at_sender;
    a.send_errors += b.send_errors;
    a.out_of_order += b.out_of_order;
    a.max_reorder_depth = a.max_reorder_depth.max(b.max_reorder_depth);
    a.latency.merge(&b.latency);
    a.resync_s.extend(b.resync_s);
    a.fifo_restored.extend(b.fifo_restored);
    a.episodes.extend(b.episodes);
    a.data_bytes += b.data_bytes;
    a.control_bytes += b.control_bytes;
    a.resyncs += b.resyncs;
    a.wait_timeouts += b.wait_timeouts;
    a.channels.extend(b.channels);
    a.events += b.events;
    a.tcp = match (a.tcp, b.tcp) {
        (Some(mut x), Some(y)) => {
            x.merge(&y);
            Some(x)
        }
        (x, y) => x.or(y),
    };
    a
}

fn run_striped(cfg: &RunConfig, sc: &StripeConfig) -> Result<RunResult, RunError> {
    if cfg.channels.len() != sc.channels() {
        return Err(RunError::ChannelCount {
            channels: cfg.channels.len(),
            weights: sc.channels(),
        });
    }
    if cfg.duration.is_none() && cfg.packets.is_none() {
        return Err(RunError::Unbounded);
    }
    let ends = Ends::Bare {
        striper: Box::new(Striper::new(sc.clone())?),
        reseq: Box::new(Resequencer::new(sc)?),
    };
    let (baseline, sqf) = match sc.policy {
        Policy::Baseline(k) => (
            Some(Baseline::new(k, sc.channels())),
            k == braid_proto::sched::baseline::BaselineKind::ShortestQueue,
        ),
        Policy::Causal(_) => (None, false),
    };
    run_sim(cfg, ends, baseline, sqf)
}

/// A session run: two session machines, data one way, control both ways.
fn run_session(cfg: &RunConfig, sc: &session::Config) -> Result<RunResult, RunError> {
    if cfg.channels.len() != sc.channels.len() {
        return Err(RunError::ChannelCount {
            channels: cfg.channels.len(),
            weights: sc.channels.len(),
        });
    }
    if cfg.duration.is_none() && cfg.packets.is_none() {
        return Err(RunError::Unbounded);
    }
    if matches!(cfg.traffic.arrivals, Arrivals::Backlogged) {
        return Err(RunError::SessionBacklogged);
    }
    // Each end's randomness (ephemeral keys, run identifier) from the run's seed.
    let new = |end: u8| {
        let mut h = blake3::Hasher::new();
        h.update(&cfg.seed.to_be_bytes());
        h.update(&[end]);
        Session::new(sc.clone(), *h.finalize().as_bytes(), Instant::ZERO)
            .map_err(|e| RunError::Session(e.0))
    };
    let ends = SessionEnds::new(new(b'a')?, new(b'b')?, cfg.channels.clone());
    run_sim(cfg, Ends::Session(Box::new(ends)), None, false)
}

fn run_sim(
    cfg: &RunConfig,
    ends: Ends,
    baseline: Option<Baseline>,
    sqf: bool,
) -> Result<RunResult, RunError> {
    let window_end = cfg.duration.unwrap_or(u64::MAX);
    let mut sim = Sim {
        now: 0,
        heap: BinaryHeap::with_capacity(4 * cfg.channels.len() + 8),
        evseq: 0,
        ends,
        baseline,
        sqf,
        chans: new_chans(cfg),
        src: Source::new(cfg),
        arena: Arena {
            buf: BytesMut::with_capacity(ARENA_CHUNK),
        },
        rx: new_receiver(cfg),
        window_end,
        packets_limit: cfg.packets.unwrap_or(u64::MAX),
        send_errors: 0,
        last_timer_fire: None,
        hard_stop: None,
        drain: cfg.drain,
        events: 0,
        tcp: tcp_flow(cfg, window_end)?,
        voip: None,
    };
    if matches!(sim.ends, Ends::Session(_)) {
        sim.voip = cfg.voip.clone().map(|v| (v, crate::voip::Voip::default()));
    }
    sim.schedule_start(cfg);
    sim.run_loop()?;
    Ok(sim.finish(cfg))
}

/// The simulated channels, each with its own loss and jitter random streams.
fn new_chans(cfg: &RunConfig) -> Vec<Chan> {
    cfg.channels
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let base = streams::CHANNEL_BASE + 2 * i as u64;
            Chan {
                ns_per_byte: 8e9 / spec.rate_bps,
                queue: VecDeque::with_capacity(spec.queue_packets.min(4096) + 16),
                queued_bytes: 0,
                on_wire: None,
                in_flight: VecDeque::with_capacity(64),
                last_arrival: 0,
                loss: LossModel::new(spec, Rng::stream(cfg.seed, base)),
                jitter_rng: Rng::stream(cfg.seed, base + 1),
                res: ChannelResult {
                    id: i,
                    ..ChannelResult::default()
                },
                spec: spec.clone(),
            }
        })
        .collect()
}

impl Source {
    /// The traffic source of `cfg`, not yet started.
    fn new(cfg: &RunConfig) -> Source {
        Source {
            kind: match &cfg.traffic.arrivals {
                Arrivals::Backlogged => SrcKind::Backlogged,
                Arrivals::Cbr(r) => SrcKind::Cbr(*r),
                Arrivals::Poisson(r) => SrcKind::Poisson(*r, cfg.traffic.sizes.mean()),
                Arrivals::Trace(_) => SrcKind::Trace,
                Arrivals::Tcp(_) => SrcKind::Tcp,
            },
            trace: match &cfg.traffic.arrivals {
                Arrivals::Trace(t) => t.clone(),
                _ => Vec::new(),
            },
            base: cfg.traffic.start,
            sizes: SizeGen::new(cfg.traffic.sizes.clone()),
            rng: Rng::stream(cfg.seed, streams::TRAFFIC),
            next_id: 0,
            trace_idx: 0,
            stopped: false,
            pending: None,
            blocked_on: None,
        }
    }
}

/// The receiving application's counters; loss episodes (loss windows and down periods
/// of every channel) for the resynchronization figures.
fn new_receiver(cfg: &RunConfig) -> Receiver {
    let mut episodes = Vec::new();
    for c in &cfg.channels {
        episodes.extend(c.loss_windows.iter().map(|w| (w.start, w.end)));
        episodes.extend(c.down.iter().copied());
    }
    Receiver {
        resync: Resync::new(episodes),
        // Links that change over time: goodput per 100 ms, to see the change.
        series_bin: cfg
            .channels
            .iter()
            .any(|c| !c.changes.is_empty())
            .then_some(SERIES_BIN),
        ..Receiver::default()
    }
}

/// The TCP source's flow, when the traffic is one; its settings checked.
fn tcp_flow(
    cfg: &RunConfig,
    window_end: Nanos,
) -> Result<Option<Box<crate::tcp::TcpFlow>>, RunError> {
    let Arrivals::Tcp(spec) = &cfg.traffic.arrivals else {
        return Ok(None);
    };
    let crate::model::Sizes::Fixed(seg) = cfg.traffic.sizes else {
        return Err(RunError::Tcp(
            "segments need one fixed size (sizes = \"fixed\")".into(),
        ));
    };
    if seg < crate::tcp::MIN_TCP_PACKET || seg <= spec.header_bytes {
        return Err(RunError::Tcp(format!(
            "segments of {seg} bytes: need at least {} bytes and more than header_bytes ({})",
            crate::tcp::MIN_TCP_PACKET,
            spec.header_bytes
        )));
    }
    if cfg.duration.is_none() {
        return Err(RunError::Tcp(
            "needs duration_s (the flow runs until the window ends)".into(),
        ));
    }
    if cfg.traffic.start >= window_end {
        return Err(RunError::Tcp(
            "the flow starts (start_s) at or after the window's end (duration_s)".into(),
        ));
    }
    let ack_delay = spec.ack_delay.resolve(&cfg.channels);
    let early = (
        crate::tcp::AckDelay::Slowest.resolve(&cfg.channels),
        cfg.traffic.start.saturating_add(spec.ack_slowest_for),
    );
    Ok(Some(Box::new(crate::tcp::TcpFlow::new(
        spec, seg, ack_delay, early, window_end,
    ))))
}

impl Sim {
    /// The first events: the end of the measurement window and the source's first packet.
    fn schedule_start(&mut self, cfg: &RunConfig) {
        if let Some(d) = cfg.duration {
            self.schedule(d, Ev::Stop);
        }
        if let Some((v, _)) = &self.voip {
            self.schedule(v.start, Ev::Voip);
        }
        let start = cfg.traffic.start;
        match &cfg.traffic.arrivals {
            Arrivals::Trace(t) => {
                let first = start.saturating_add(t.first().map_or(0, |x| x.0));
                self.schedule(first, Ev::Source);
            }
            _ => self.schedule(start, Ev::Source),
        }
    }
}

impl Sim {
    #[inline]
    fn schedule(&mut self, t: Nanos, ev: Ev) {
        self.evseq += 1;
        let code: u128 = match ev {
            Ev::Source => 0,
            Ev::Stop => 1,
            Ev::TxDone(c) => 2 + 2 * u128::from(c),
            Ev::Arrive(c) => 3 + 2 * u128::from(c),
            Ev::ArriveBack(c) => BACK + u128::from(c),
            Ev::Ack => ACK,
            Ev::TcpTimer => TCP_TIMER,
            Ev::Voip => VOIP,
        };
        // 48 bits of insertion number: 2.8e14 events before it could wrap.
        let key = (u128::from(t) << 64) | (u128::from(self.evseq & 0xFFFF_FFFF_FFFF) << 16) | code;
        self.heap.push(Reverse(key));
    }

    #[inline]
    fn decode(key: u128) -> (Nanos, Ev) {
        let t = (key >> 64) as Nanos;
        let code = (key & 0xFFFF) as u32;
        let ev = match code {
            0 => Ev::Source,
            1 => Ev::Stop,
            c if c == ACK as u32 => Ev::Ack,
            c if c == TCP_TIMER as u32 => Ev::TcpTimer,
            c if c == VOIP as u32 => Ev::Voip,
            c if c >= BACK as u32 => Ev::ArriveBack(c - BACK as u32),
            c if c % 2 == 0 => Ev::TxDone((c - 2) / 2),
            c => Ev::Arrive((c - 3) / 2),
        };
        (t, ev)
    }

    #[inline]
    fn now_us(&self) -> Instant {
        Instant::from_micros(self.now / 1000)
    }

    /// The earliest protocol timer, in ns, never at or before the last firing (so a timer
    /// that stays due cannot stall time).
    #[inline]
    fn next_timer(&self) -> Option<Nanos> {
        let t = self.ends.poll_timeout()?.as_micros().saturating_mul(1000);
        Some(match self.last_timer_fire {
            Some(last) if t <= last => last + 1000,
            _ => t.max(self.now),
        })
    }

    fn run_loop(&mut self) -> Result<(), RunError> {
        loop {
            let next_ev = self.heap.peek().map(|r| (r.0 >> 64) as Nanos);
            let timer = self.next_timer();
            let (t, is_timer) = match (next_ev, timer) {
                (None, None) => return Ok(()),
                (Some(e), Some(tm)) if tm < e => (tm, true),
                (Some(e), _) => (e, false),
                (None, Some(tm)) => (tm, true),
            };
            if self.hard_stop.is_some_and(|h| t > h) {
                return Ok(());
            }
            self.events += 1;
            if is_timer {
                self.now = t;
                self.last_timer_fire = Some(t);
                let now = self.now_us();
                self.ends.sender_timeout(now);
                self.flush_striper(false);
                self.ends.receiver_timeout(now);
                self.drain_deliveries();
                self.flush_back();
                continue;
            }
            let Some(Reverse(key)) = self.heap.pop() else {
                return Ok(());
            };
            let (t, ev) = Self::decode(key);
            self.now = t;
            match ev {
                Ev::TxDone(c) => self.tx_done(c as usize)?,
                Ev::Arrive(c) => self.arrive(c as usize),
                Ev::ArriveBack(c) => self.arrive_back(c as usize),
                Ev::Source => self.source_event()?,
                Ev::Stop => self.stop_source(),
                Ev::Ack => self.tcp_ack(),
                Ev::TcpTimer => self.tcp_timer(),
                Ev::Voip => self.voip_send(),
            }
        }
    }

    fn stop_source(&mut self) {
        if !self.src.stopped {
            self.src.stopped = true;
            self.src.pending = None;
            self.src.blocked_on = None;
            self.hard_stop = Some(self.now.saturating_add(self.drain));
        }
    }

    #[inline]
    fn out_of_packets(&self) -> bool {
        self.src.next_id >= self.packets_limit
    }

    /// Offer one packet of `size` bytes to the striper.
    #[inline]
    fn offer(&mut self, size: u32) {
        let id = self.src.next_id;
        self.src.next_id += 1;
        let p = self.arena.packet(id, self.now, size as usize);
        self.hand_over(p);
        if self.out_of_packets() {
            self.stop_source();
        }
    }

    /// Give one application packet to the sending end.
    #[inline]
    fn hand_over(&mut self, p: Bytes) {
        let now = self.now_us();
        let drop_tail = !matches!(self.src.kind, SrcKind::Backlogged);
        match &mut self.ends {
            Ends::Bare { striper, .. } => {
                if self.sqf {
                    for (i, c) in self.chans.iter().enumerate() {
                        let wire = c.on_wire.as_ref().map_or(0, |w| w.0.data.len() as u64);
                        striper.set_backlog(i, c.queued_bytes + wire);
                    }
                }
                match striper.handle_packet(now, p) {
                    Ok(()) => self.flush_striper(drop_tail),
                    Err(_) => self.send_errors += 1,
                }
            }
            Ends::Session(s) => {
                s.a.handle_packet(now, p);
                self.flush_striper(drop_tail);
            }
        }
    }

    /// The VoIP flow's next packet, and the one after it on the calendar (until the
    /// measurement window ends).
    fn voip_send(&mut self) {
        if self.now >= self.window_end {
            return;
        }
        let now = self.now;
        let Some((spec, v)) = self.voip.as_mut() else {
            return;
        };
        let p = v.packet(spec, now);
        let next = now.saturating_add((1e9 / spec.pps).round().max(1.0) as Nanos);
        self.events += 1;
        self.hand_over(p);
        self.schedule(next, Ev::Voip);
    }

    /// TCP source: send what the windows allow, then make sure the retransmission
    /// timer has an event.
    fn tcp_send(&mut self) {
        if self.src.stopped || self.now >= self.window_end {
            return;
        }
        loop {
            let now = self.now;
            let Some(flow) = self.tcp.as_mut() else {
                return;
            };
            let Some((seg, _)) = flow.snd.poll_send(now) else {
                break;
            };
            let p = flow.packet(now, seg);
            self.events += 1;
            self.hand_over(p);
        }
        self.tcp_arm();
    }

    fn tcp_arm(&mut self) {
        if self.src.stopped {
            return;
        }
        let Some(flow) = self.tcp.as_mut() else {
            return;
        };
        if let Some(d) = flow.snd.deadline() {
            if flow.timer_at.is_none_or(|t| t > d) {
                flow.timer_at = Some(d);
                self.schedule(d, Ev::TcpTimer);
            }
        }
    }

    fn tcp_timer(&mut self) {
        let now = self.now;
        let Some(flow) = self.tcp.as_mut() else {
            return;
        };
        if flow.timer_at == Some(now) {
            flow.timer_at = None;
        }
        if self.src.stopped {
            return;
        }
        flow.snd.on_timeout(now);
        self.tcp_send();
    }

    /// TCP source: the acknowledgement at the head of the return path arrives.
    fn tcp_ack(&mut self) {
        let now = self.now;
        let Some(flow) = self.tcp.as_mut() else {
            return;
        };
        let Some((_, ack)) = flow.acks.pop_front() else {
            return;
        };
        let next = flow.acks.front().map(|a| a.0);
        flow.snd.on_ack(now, ack);
        if let Some(t) = next {
            self.schedule(t, Ev::Ack);
        }
        self.tcp_send();
    }

    /// The channel the striper will pick for `size` bytes (id-independent: baselines
    /// hash addresses, which the simulator's packets do not vary).
    #[inline]
    fn predict(&self) -> usize {
        match &self.baseline {
            None => match &self.ends {
                Ends::Bare { striper, .. } => striper.scheduler().map_or(0, |s| s.select()),
                // Session runs take timed traffic only (see `run_session`).
                Ends::Session(_) => 0,
            },
            Some(b) => {
                let backlog: Vec<u64> = self
                    .chans
                    .iter()
                    .map(|c| {
                        c.queued_bytes + c.on_wire.as_ref().map_or(0, |w| w.0.data.len() as u64)
                    })
                    .collect();
                let mut probe = [0u8; 28];
                probe[0] = 0x45;
                probe[12..20].copy_from_slice(&ADDRS);
                b.select(&probe, &backlog)
            }
        }
    }

    /// Backlogged source: offer packets until the chosen channel's queue is full.
    fn pump_backlogged(&mut self) -> Result<(), RunError> {
        let mut offered = 0u64;
        while !self.src.stopped {
            let size = match self.src.pending.take() {
                Some((s, _)) => s,
                None => self.src.sizes.next(&mut self.src.rng),
            };
            let ch = self.predict();
            let c = &self.chans[ch];
            if c.queue.len() >= c.spec.queue_packets {
                self.src.pending = Some((size, ch));
                self.src.blocked_on = Some(ch);
                return Ok(());
            }
            self.events += 1;
            self.offer(size);
            offered += 1;
            if offered > 10_000_000 {
                return Err(RunError::NoProgress(offered));
            }
        }
        Ok(())
    }

    fn source_event(&mut self) -> Result<(), RunError> {
        if self.src.stopped || self.now >= self.window_end {
            return Ok(());
        }
        match self.src.kind {
            SrcKind::Backlogged => return self.pump_backlogged(),
            SrcKind::Tcp => self.tcp_send(),
            SrcKind::Cbr(rate) => {
                let size = self.src.sizes.next(&mut self.src.rng);
                self.offer(size);
                let gap = match rate {
                    Rate::Bits(bps) => f64::from(size) * 8e9 / bps,
                    Rate::Pps(pps) => 1e9 / pps,
                };
                let next = self.now.saturating_add(gap.round().max(1.0) as Nanos);
                self.schedule(next, Ev::Source);
            }
            SrcKind::Poisson(rate, mean_size) => {
                let size = self.src.sizes.next(&mut self.src.rng);
                self.offer(size);
                let mean_gap = match rate {
                    Rate::Bits(bps) => mean_size * 8e9 / bps,
                    Rate::Pps(pps) => 1e9 / pps,
                };
                let gap = self.src.rng.exp(mean_gap);
                let next = self.now.saturating_add(gap.round().max(1.0) as Nanos);
                self.schedule(next, Ev::Source);
            }
            SrcKind::Trace => {
                // Offer every packet stamped at this instant.
                while self.src.trace_idx < self.src.trace.len()
                    && self
                        .src
                        .base
                        .saturating_add(self.src.trace[self.src.trace_idx].0)
                        <= self.now
                {
                    let size = self.src.trace[self.src.trace_idx].1;
                    self.src.trace_idx += 1;
                    self.offer(size);
                    if self.src.stopped {
                        return Ok(());
                    }
                }
                match self.src.trace.get(self.src.trace_idx) {
                    Some(&(t, _)) => self.schedule(self.src.base.saturating_add(t), Ev::Source),
                    None => self.stop_source(),
                }
            }
        }
        Ok(())
    }

    /// Move the striper's datagrams into the channel queues.
    #[inline]
    fn flush_striper(&mut self, drop_tail: bool) {
        while let Some(Outgoing {
            channel,
            data,
            control,
        }) = self.ends.poll_forward(self.now)
        {
            let c = &mut self.chans[channel];
            let len = data.len() as u64;
            if len > u64::from(c.spec.mtu) {
                c.res.mtu_drops += 1;
                c.res.data_dropped += u64::from(!control);
                continue;
            }
            if drop_tail && c.queue.len() >= c.spec.queue_packets {
                c.res.queue_drops += 1;
                c.res.data_dropped += u64::from(!control);
                continue;
            }
            c.queued_bytes += len;
            c.queue.push_back(Queued { data, control });
            if c.on_wire.is_none() {
                self.start_tx(channel);
            }
        }
    }

    #[inline]
    fn start_tx(&mut self, ch: usize) {
        let now = self.now;
        let c = &mut self.chans[ch];
        let Some(q) = c.queue.pop_front() else {
            return;
        };
        let len = q.data.len() as u64;
        c.queued_bytes -= len;
        let fate = c.loss.fate(now);
        c.res.bytes += len;
        c.res.packets += 1;
        if q.control {
            c.res.control_packets += 1;
            c.res.control_bytes += len;
        } else {
            c.res.data_packets += 1;
            if fate != Fate::Delivered {
                c.res.data_lost += 1;
            }
        }
        match fate {
            Fate::Lost => c.res.lost += 1,
            Fate::Corrupted => c.res.corrupted += 1,
            Fate::Delivered => {}
        }
        let ser =
            ((len + u64::from(c.spec.overhead_bytes)) as f64 * c.ns_per_byte(now)).round() as Nanos;
        let done = now.saturating_add(ser.max(1));
        if done <= self.window_end {
            // Throughput counts bytes whose serialization ends inside the window.
            c.res.throughput_bps += len as f64;
        }
        c.on_wire = Some((q, fate));
        self.schedule(done, Ev::TxDone(ch as u32));
    }

    fn tx_done(&mut self, ch: usize) -> Result<(), RunError> {
        let now = self.now;
        let c = &mut self.chans[ch];
        if let Some((q, fate)) = c.on_wire.take() {
            if fate == Fate::Delivered {
                let jitter = if c.spec.jitter > 0 {
                    c.jitter_rng.upto(c.spec.jitter)
                } else {
                    0
                };
                let at = now
                    .saturating_add(c.spec.delay_at(now))
                    .saturating_add(jitter)
                    .max(c.last_arrival);
                c.last_arrival = at;
                c.in_flight.push_back((at, q.data));
                if c.in_flight.len() == 1 {
                    self.schedule(at, Ev::Arrive(ch as u32));
                }
            }
        }
        if !self.chans[ch].queue.is_empty() {
            self.start_tx(ch);
        }
        if self.src.blocked_on == Some(ch) {
            self.src.blocked_on = None;
            self.pump_backlogged()?;
        }
        Ok(())
    }

    fn arrive(&mut self, ch: usize) {
        let c = &mut self.chans[ch];
        let Some((_, data)) = c.in_flight.pop_front() else {
            return;
        };
        if let Some(&(next, _)) = c.in_flight.front() {
            self.schedule(next, Ev::Arrive(ch as u32));
        }
        let now = self.now_us();
        self.ends.arrive(now, ch, data);
        self.drain_deliveries();
        self.flush_back();
    }

    /// Session runs: put the receiver's datagrams on the reverse links.
    fn flush_back(&mut self) {
        while let Some((ch, at, data)) = self.ends.poll_back(self.now) {
            let Ends::Session(s) = &mut self.ends else {
                return;
            };
            if let Some(at) = at {
                s.back[ch].push_back((at, data));
                if s.back[ch].len() == 1 {
                    self.schedule(at, Ev::ArriveBack(ch as u32));
                }
            }
        }
    }

    /// Session runs: the head of channel `ch`'s reverse FIFO reaches the sender.
    fn arrive_back(&mut self, ch: usize) {
        let now = self.now_us();
        let Ends::Session(s) = &mut self.ends else {
            return;
        };
        let Some((_, data)) = s.back[ch].pop_front() else {
            return;
        };
        let next = s.back[ch].front().map(|x| x.0);
        s.a.handle_datagram(now, ch, data);
        if let Some(next) = next {
            self.schedule(next, Ev::ArriveBack(ch as u32));
        }
        self.flush_striper(true);
    }

    #[inline]
    fn drain_deliveries(&mut self) {
        while let Some(p) = self.ends.poll_deliver() {
            if let Some((_, v)) = &mut self.voip {
                if v.on_delivery(self.now, &p) {
                    continue;
                }
            }
            if self.tcp.is_some() {
                self.tcp_deliver(&p);
                continue;
            }
            if let Some((id, sent)) = packet_stamp(&p) {
                if let Ends::Session(s) = &mut self.ends {
                    if s.duplicate(id) {
                        continue;
                    }
                }
                self.rx
                    .on_delivery(self.now, id, sent, p.len() as u64, self.window_end);
            }
        }
    }

    /// TCP source: a packet reaches the receiving host; its acknowledgement starts back.
    fn tcp_deliver(&mut self, p: &[u8]) {
        let Some(st) = crate::tcp::stamp(p) else {
            return;
        };
        if let Ends::Session(s) = &mut self.ends {
            if s.duplicate(st.tx) {
                return;
            }
        }
        self.rx
            .on_delivery(self.now, st.tx, st.sent, p.len() as u64, self.window_end);
        let now = self.now;
        let Some(flow) = self.tcp.as_mut() else {
            return;
        };
        let ack = flow.rcv.on_segment(now, st);
        let at = flow.ack_arrival(now);
        flow.acks.push_back((at, ack));
        if flow.acks.len() == 1 {
            self.schedule(at, Ev::Ack);
        }
    }

    /// Resyncs and wait timeouts at the receiver, packets the sender sent, and the
    /// session's result (a session run; `delivered` at the receiver).
    fn end_counts(
        ends: &Ends,
        now: Nanos,
        delivered: u64,
    ) -> (u64, u64, u64, Option<SessionResult>) {
        match ends {
            Ends::Bare { striper, reseq } => {
                let rs = reseq.stats();
                (
                    rs.total(|c| c.resyncs),
                    rs.total(|c| c.wait_timeouts),
                    striper.packets_sent(),
                    None,
                )
            }
            Ends::Session(s) => {
                let now = Instant::from_micros(now / 1000);
                let b = s.b.stats(now);
                let a = s.a.stats(now);
                (
                    b.channels.iter().map(|c| c.resequencer.resyncs).sum(),
                    b.channels.iter().map(|c| c.resequencer.wait_timeouts).sum(),
                    a.sent_packets - a.queue_drops,
                    Some(s.result(delivered)),
                )
            }
        }
    }

    fn finish(self, cfg: &RunConfig) -> RunResult {
        let rx = self.rx;
        // The VoIP flow's packets count with the others in sent and delivered; its
        // own figures are in `voip`.
        let voip_delivered = self.voip.as_ref().map_or(0, |(_, v)| v.delivered());
        let voip = match (&self.voip, &self.ends) {
            (Some((_, v)), Ends::Session(s)) => {
                let at = Instant::from_micros(self.now / 1000);
                let best = cfg
                    .channels
                    .iter()
                    .map(|c| c.delay_at(0))
                    .min()
                    .unwrap_or(0);
                Some(v.result(best, &s.a.stats(at).flows, &s.b.stats(at).flows))
            }
            _ => None,
        };
        let duration_ns = match cfg.duration {
            Some(d) => d,
            None => rx.last_delivery.max(1),
        };
        let dur_s = duration_ns as f64 / 1e9;
        let (goodput_bytes, inorder_bytes) = match cfg.duration {
            Some(_) => (rx.window_bytes, rx.window_inorder_bytes),
            None => (rx.delivered_bytes, rx.window_inorder_bytes),
        };
        let (resync_s, fifo_restored) = rx.resync.finish();
        let episodes = rx
            .resync
            .episodes()
            .iter()
            .map(|&(a, b)| (a as f64 / 1e9, b as f64 / 1e9))
            .collect();
        let (resyncs, wait_timeouts, sent, session) =
            Self::end_counts(&self.ends, self.now, rx.delivered + voip_delivered);
        let totals = ChannelTotals::of(self.chans, dur_s);
        RunResult {
            duration_s: dur_s,
            goodput_bps: goodput_bytes as f64 * 8.0 / dur_s,
            inorder_goodput_bps: inorder_bytes as f64 * 8.0 / dur_s,
            goodput_series_bps: rx
                .series
                .iter()
                .map(|&b| b as f64 * 8.0 / (SERIES_BIN as f64 / 1e9))
                .collect(),
            packets_sent: sent,
            packets_delivered: rx.delivered + voip_delivered,
            packets_lost: sent.saturating_sub(rx.delivered + voip_delivered),
            lost_on_channel: totals.lost_on_channel,
            dropped_at_sender: totals.dropped_at_sender,
            send_errors: self.send_errors,
            out_of_order: rx.out_of_order,
            max_reorder_depth: rx.max_reorder_depth,
            latency: rx.latency,
            resync_s,
            fifo_restored,
            episodes,
            data_bytes: totals.data_bytes,
            control_bytes: totals.control_bytes,
            resyncs,
            wait_timeouts,
            channels: totals.channels,
            events: self.events,
            session,
            errctl: None,
            voip,
            tcp: self
                .tcp
                .as_ref()
                .map(|f| f.result(duration_ns.saturating_sub(cfg.traffic.start) as f64 / 1e9)),
        }
    }
}
/// The channels' results (throughput over the run's `dur_s`) and their sums.
struct ChannelTotals {
    channels: Vec<ChannelResult>,
    data_bytes: u64,
    control_bytes: u64,
    lost_on_channel: u64,
    dropped_at_sender: u64,
}

impl ChannelTotals {
    fn of(chans: Vec<Chan>, dur_s: f64) -> ChannelTotals {
        let mut data_bytes = 0;
        let mut control_bytes = 0;
        let mut lost_on_channel = 0;
        let mut dropped_at_sender = 0;
        let mut channels = Vec::with_capacity(chans.len());
        for c in chans {
            let mut r = c.res;
            data_bytes += r.bytes - r.control_bytes;
            control_bytes += r.control_bytes;
            lost_on_channel += r.data_lost;
            dropped_at_sender += r.data_dropped;
            r.throughput_bps = r.throughput_bps * 8.0 / dur_s;
            channels.push(r);
        }
        ChannelTotals {
            channels,
            data_bytes,
            control_bytes,
            lost_on_channel,
            dropped_at_sender,
        }
    }
}
