//! Two [`Streams`] joined by a deterministic in-memory pipe in virtual time: each frame
//! serialized at the link's rate, then delayed by one of a few fixed delays picked at
//! random (so frames overtake each other by tens of milliseconds, as across the bond's
//! channels), some lost, some duplicated. One seed fixes everything.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use super::*;
use crate::rng::SplitMix64;
use crate::wire::stream::{self as wire, Repr, WireId};

const MS: u64 = 1_000;
const MAX_LEN: usize = 1400;

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// `len` pseudo-random bytes: each transfer's content is its own.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = SplitMix64::stream(seed, 7);
    (0..len).map(|_| r.next_u64() as u8).collect()
}

/// What the pipe does to frames.
#[derive(Clone)]
struct Link {
    loss: f64,
    dup: f64,
    /// One is picked at random for each frame, microseconds.
    delays: Vec<u64>,
    /// Bytes per second; 0: no serialization delay.
    rate: u64,
}

impl Link {
    fn bond(loss: f64) -> Link {
        Link {
            loss,
            dup: 0.01,
            delays: vec![5 * MS, 20 * MS, 60 * MS],
            rate: 12_500_000,
        }
    }
}

/// Bytes to write on a stream, then maybe a FIN.
struct Outgoing {
    data: Vec<u8>,
    at: usize,
    finish: bool,
}

/// An application at one end: accepts (or refuses) what comes, writes what it was
/// given, reads everything unless told not to.
#[derive(Default)]
struct App {
    refuse: Option<Refusal>,
    /// Sent back on every stream it accepts (then FIN).
    answer: Option<Vec<u8>>,
    out: BTreeMap<StreamId, Outgoing>,
    /// Streams to try writing to (new, or Writable since).
    to_write: BTreeSet<StreamId>,
    inp: BTreeMap<StreamId, Vec<u8>>,
    to_read: BTreeSet<StreamId>,
    /// Not read until resumed; readable ones wait in `held`.
    paused: BTreeSet<StreamId>,
    held: BTreeSet<StreamId>,
    events: Vec<StreamEvent>,
}

impl App {
    fn send(&mut self, id: StreamId, data: Vec<u8>, finish: bool) {
        self.out.insert(
            id,
            Outgoing {
                data,
                at: 0,
                finish,
            },
        );
        self.to_write.insert(id);
    }

    fn resume(&mut self) {
        self.paused.clear();
        self.to_read.append(&mut self.held);
    }

    fn step(&mut self, now: Instant, st: &mut Streams) {
        while let Some(e) = st.poll_event() {
            self.on_event(now, st, &e);
            self.events.push(e);
        }
        for id in std::mem::take(&mut self.to_write) {
            let Some(o) = self.out.get_mut(&id) else {
                continue;
            };
            while o.at < o.data.len() {
                let n = st.write(now, id, &o.data[o.at..]);
                if n == 0 {
                    break;
                }
                o.at += n;
            }
            if o.at == o.data.len() {
                if o.finish {
                    st.finish(now, id);
                }
                self.out.remove(&id);
            }
        }
        let mut buf = vec![0u8; 65536];
        for id in std::mem::take(&mut self.to_read) {
            loop {
                let n = st.read(id, &mut buf);
                if n == 0 {
                    break;
                }
                self.inp.entry(id).or_default().extend_from_slice(&buf[..n]);
            }
        }
    }

    fn on_event(&mut self, now: Instant, st: &mut Streams, e: &StreamEvent) {
        match *e {
            StreamEvent::Incoming { id, .. } => match self.refuse {
                Some(why) => st.refuse(now, id, why),
                None => {
                    st.accept(now, id);
                    if let Some(a) = self.answer.clone() {
                        self.send(id, a, true);
                    }
                }
            },
            StreamEvent::Readable { id } if self.paused.contains(&id) => {
                self.held.insert(id);
            }
            StreamEvent::Readable { id } => {
                self.to_read.insert(id);
            }
            StreamEvent::Writable { id } | StreamEvent::Opened { id } => {
                self.to_write.insert(id);
            }
            _ => {}
        }
    }

    fn count(&self, f: impl Fn(&StreamEvent) -> bool) -> usize {
        self.events.iter().filter(|e| f(e)).count()
    }
}

type Frame = Reverse<(Instant, u64, usize, Bytes)>;
/// Assertions run after every step.
type Watch = Box<dyn FnMut(&Pipe)>;

/// Two ends and the frames between them.
struct Pipe {
    now: Instant,
    ends: [Streams; 2],
    apps: [App; 2],
    link: Link,
    rng: SplitMix64,
    q: BinaryHeap<Frame>,
    seq: u64,
    free_at: [Instant; 2],
    /// Drop every frame (a dead path).
    cut: bool,
    /// Frames each end sent, and the copies (for replays).
    sent: [u64; 2],
    log: Option<Vec<(usize, Bytes)>>,
    /// Called after every step (assertions over the run).
    watch: Option<Watch>,
}

impl Pipe {
    fn new(cfg: StreamConfig, link: Link, seed: u64) -> Pipe {
        Pipe {
            now: Instant::ZERO,
            ends: [Streams::new(cfg.clone()), Streams::new(cfg)],
            apps: [App::default(), App::default()],
            link,
            rng: SplitMix64::stream(seed, 1),
            q: BinaryHeap::new(),
            seq: 0,
            free_at: [Instant::ZERO; 2],
            cut: false,
            sent: [0; 2],
            log: None,
            watch: None,
        }
    }

    fn transmit(&mut self, from: usize, f: Bytes) {
        let ser = match self.link.rate {
            0 => 0,
            r => f.len() as u64 * 1_000_000 / r,
        };
        self.free_at[from] = self.free_at[from].max(self.now) + Duration::from_micros(ser);
        self.sent[from] += 1;
        if let Some(l) = &mut self.log {
            l.push((from, f.clone()));
        }
        if self.cut || self.rng.chance(self.link.loss) {
            return;
        }
        let copies = if self.rng.chance(self.link.dup) { 2 } else { 1 };
        for _ in 0..copies {
            let k = self.rng.upto(self.link.delays.len() as u64 - 1) as usize;
            let at = self.free_at[from] + Duration::from_micros(self.link.delays[k]);
            self.seq += 1;
            self.q.push(Reverse((at, self.seq, 1 - from, f.clone())));
        }
    }

    /// Everything due now: deliveries, timers, frames the links have room for.
    fn pump(&mut self) {
        loop {
            let mut busy = false;
            while let Some(Reverse((t, _, to, _))) = self.q.peek() {
                if *t > self.now {
                    break;
                }
                let to = *to;
                let Some(Reverse((_, _, _, f))) = self.q.pop() else {
                    break;
                };
                self.ends[to].handle_frame(self.now, &f);
                busy = true;
            }
            for e in 0..2 {
                if self.ends[e].poll_timeout().is_some_and(|t| t <= self.now) {
                    self.ends[e].handle_timeout(self.now);
                    assert!(self.ends[e].poll_timeout().is_none_or(|t| t > self.now));
                    busy = true;
                }
                while self.free_at[e] <= self.now {
                    let Some(f) = self.ends[e].poll_frame(self.now, MAX_LEN) else {
                        assert!(!self.ends[e].wants_to_send(), "wants_to_send, no frame");
                        break;
                    };
                    assert!(f.len() <= MAX_LEN && wire::is_frame(&f));
                    self.transmit(e, f);
                    busy = true;
                }
            }
            if !busy {
                return;
            }
        }
    }

    fn step_apps(&mut self) {
        for e in 0..2 {
            self.apps[e].step(self.now, &mut self.ends[e]);
        }
    }

    fn next_time(&self) -> Option<Instant> {
        let mut t = self.q.peek().map(|Reverse((t, ..))| *t);
        for e in 0..2 {
            let mut c = self.ends[e].poll_timeout();
            if self.ends[e].wants_to_send() {
                c = Some(c.map_or(self.free_at[e], |x| x.min(self.free_at[e])));
            }
            t = match (t, c) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        t.map(|t| t.max(self.now))
    }

    /// Run until `done` or `limit` of virtual time; false on timeout or when nothing
    /// is left to happen.
    fn run(&mut self, limit: Duration, mut done: impl FnMut(&mut Pipe) -> bool) -> bool {
        let end = self.now + limit;
        for i in 0..10_000_000u64 {
            self.step_apps();
            self.pump();
            self.step_apps();
            if let Some(mut w) = self.watch.take() {
                w(self);
                self.watch = Some(w);
            }
            if i % 64 == 0 {
                check(&self.ends[0]);
                check(&self.ends[1]);
            }
            if done(self) {
                return true;
            }
            match self.next_time() {
                Some(t) if t <= end => self.now = t,
                _ => return false,
            }
        }
        panic!("no progress in virtual time");
    }

    /// Run until nothing is left to do (or `limit`).
    fn settle(&mut self, limit: Duration) {
        let end = self.now + limit;
        self.run(limit, |p| p.now >= end);
    }
}

/// The machine's own bookkeeping agrees with its streams.
fn check(st: &Streams) {
    let committed: u64 = st.map.values().map(|s| s.committed).sum();
    assert_eq!(committed, st.committed);
    // The pool, and `min_window` that every stream may always have (a stream left
    // without credit by streams that hold theirs unused would wait for ever).
    let bound = st.cfg.pool + st.map.len() as u64 * st.min_window();
    assert!(committed <= bound, "{committed} committed");
    let receiving = st.map.values().filter(|s| s.counted).count();
    assert_eq!(receiving, st.receiving);
    let armed = st.map.values().filter(|s| s.armed.is_some()).count();
    assert_eq!(armed + st.resetting.len(), st.timers.len());
    for (id, s) in &st.map {
        assert!(s.recv.buffered() <= s.recv.limit - s.recv.read, "{id:?}");
        if let Some(t) = s.armed {
            assert!(st.timers.contains(&(t, *id)));
        }
    }
}

fn recv_buffered(st: &Streams, id: StreamId) -> u64 {
    st.map.get(&id).map_or(0, |s| s.recv.buffered())
}

fn ours(n: u32) -> StreamId {
    StreamId { ours: true, n }
}

fn theirs(n: u32) -> StreamId {
    StreamId { ours: false, n }
}

/// A opens one stream; each end sends `len` bytes and a FIN.
fn transfer_both_ways(loss: f64, seed: u64, len: usize) -> Pipe {
    let mut p = Pipe::new(StreamConfig::default(), Link::bond(loss), seed);
    let (a, b) = (pattern(seed, len), pattern(seed + 1, len));
    let id = p.ends[0]
        .open(p.now, addr("10.0.0.1:1000"), addr("10.9.9.9:80"))
        .unwrap();
    p.apps[0].send(id, a.clone(), true);
    p.apps[1].answer = Some(b.clone());
    let done = p.run(Duration::from_secs(60), |p| {
        p.ends[0].is_closed(id) && p.ends[1].is_closed(theirs(0))
    });
    assert!(done, "not closed by {:?}: {:?}", p.now, p.ends[0].stats());
    assert!(p.apps[1].inp[&theirs(0)] == a, "A -> B differs");
    assert!(p.apps[0].inp[&id] == b, "B -> A differs");
    assert_eq!(
        p.apps[0].count(|e| matches!(e, StreamEvent::Opened { .. })),
        1
    );
    assert_eq!(
        p.apps[1].count(|e| matches!(e, StreamEvent::Incoming { .. })),
        1
    );
    for e in &p.ends {
        assert_eq!(e.stats().data_bytes_received, len as u64);
        assert_eq!(e.buffered(), 0);
        assert_eq!(e.open_streams(), 0);
    }
    p
}

#[test]
fn five_megabytes_each_way_with_1pct_loss() {
    let p = transfer_both_ways(0.01, 1, 5_000_000);
    let s = p.ends[0].stats();
    assert!(s.retransmitted_bytes > 0, "{s:?}");
    // Repairs stay near what was lost (1 %): reordering alone triggers few.
    assert!(s.retransmitted_bytes < 5_000_000 / 20, "{s:?}");
    assert!(p.now < Instant::from_micros(5_000_000), "{:?}", p.now);
}

#[test]
fn five_megabytes_each_way_with_5pct_loss() {
    let p = transfer_both_ways(0.05, 2, 5_000_000);
    let s = p.ends[1].stats();
    assert!(s.retransmitted_bytes > 5_000_000 / 50, "{s:?}");
    assert!(s.retransmitted_bytes < 5_000_000 / 5, "{s:?}");
}

#[test]
fn reordering_alone_costs_few_retransmissions() {
    let len = 2_000_000;
    let p = transfer_both_ways(0.0, 3, len);
    for e in &p.ends {
        let s = e.stats();
        // Only while the reordering is being learnt, in the first round trips.
        assert!(s.retransmitted_bytes < len as u64 * 3 / 100, "{s:?}");
    }
}

#[test]
fn half_close_keeps_the_other_direction() {
    let mut p = Pipe::new(StreamConfig::default(), Link::bond(0.02), 4);
    let id = p.ends[0]
        .open(p.now, addr("10.0.0.1:1"), addr("10.0.0.2:2"))
        .unwrap();
    let short = pattern(40, 100_000);
    p.apps[0].send(id, short.clone(), true);
    // B reads A's whole stream and its end, while still open the other way.
    assert!(p.run(Duration::from_secs(10), |p| p.ends[1].finished(theirs(0))));
    assert_eq!(p.apps[1].inp[&theirs(0)], short);
    assert!(!p.ends[0].is_closed(id) && !p.ends[1].is_closed(theirs(0)));
    assert!(!p.ends[0].finished(id));
    // Now B sends a megabyte, then its FIN.
    let long = pattern(41, 1_000_000);
    p.apps[1].send(theirs(0), long.clone(), true);
    assert!(p.run(Duration::from_secs(20), |p| p.ends[0].is_closed(id)
        && p.ends[1].is_closed(theirs(0))));
    assert_eq!(p.apps[0].inp[&id], long);
    // A repeated FIN after the close is answered with the final ACK.
    assert!(p.ends[1].finished(theirs(0)));
}

#[test]
fn refused_open_reports_why_and_frees_both_ends() {
    let mut p = Pipe::new(StreamConfig::default(), Link::bond(0.05), 5);
    p.apps[1].refuse = Some(Refusal::NotAllowed);
    let id = p.ends[0]
        .open(p.now, addr("10.0.0.1:1"), addr("10.0.0.2:2"))
        .unwrap();
    // Bytes written before the answer wait, and are dropped with the stream.
    assert!(p.ends[0].write(p.now, id, &[1; 1000]) > 0);
    assert!(p.run(Duration::from_secs(10), |p| p.ends[0].is_closed(id)));
    let refused = |e: &StreamEvent| {
        matches!(
            e,
            StreamEvent::Refused {
                why: Refusal::NotAllowed,
                ..
            }
        )
    };
    assert_eq!(p.apps[0].count(refused), 1);
    assert_eq!(p.ends[1].open_streams(), 0);
    p.settle(Duration::from_secs(2));
    assert_eq!(p.apps[0].events.len(), 1, "{:?}", p.apps[0].events);
    assert_eq!(
        p.apps[1].count(|e| matches!(e, StreamEvent::Incoming { .. })),
        1
    );
    assert_eq!(p.ends[0].buffered(), 0);
}

#[test]
fn reset_by_the_opener_mid_transfer() {
    reset_mid_transfer(0, 6);
}

#[test]
fn reset_by_the_acceptor_mid_transfer() {
    reset_mid_transfer(1, 7);
}

fn reset_mid_transfer(who: usize, seed: u64) {
    let mut p = Pipe::new(StreamConfig::default(), Link::bond(0.02), seed);
    let id = p.ends[0]
        .open(p.now, addr("10.0.0.1:1"), addr("10.0.0.2:2"))
        .unwrap();
    p.apps[0].send(id, pattern(1, 3_000_000), true);
    p.apps[1].answer = Some(pattern(2, 3_000_000));
    assert!(p.run(Duration::from_secs(10), |p| {
        p.apps[1]
            .inp
            .get(&theirs(0))
            .is_some_and(|v| v.len() > 500_000)
            && p.apps[0].inp.get(&id).is_some_and(|v| v.len() > 500_000)
    }));
    let ids = [id, theirs(0)];
    p.ends[who].reset(p.now, ids[who]);
    p.apps[who].out.clear();
    assert!(p.ends[who].is_closed(ids[who]));
    let other = 1 - who;
    assert!(p.run(Duration::from_secs(10), |p| p.ends[other]
        .is_closed(ids[other])));
    assert_eq!(
        p.apps[other].count(|e| matches!(e, StreamEvent::Reset { .. })),
        1
    );
    assert_eq!(
        p.apps[who].count(|e| matches!(e, StreamEvent::Reset { .. })),
        0
    );
    p.settle(Duration::from_secs(5));
    for e in 0..2 {
        assert_eq!(p.ends[e].open_streams(), 0);
        assert_eq!(p.ends[e].buffered(), 0);
        // The RESET was acknowledged, nothing is left to repeat.
        assert!(p.ends[e].resetting.is_empty());
        assert_eq!(p.ends[e].poll_timeout(), None);
    }
    assert_eq!(p.ends[who].stats().resets_sent, 1);
    assert_eq!(p.ends[other].stats().resets_received, 1);
}

#[test]
fn late_frames_after_a_reset_are_ignored() {
    let mut p = Pipe::new(StreamConfig::default(), Link::bond(0.0), 8);
    p.log = Some(Vec::new());
    let id = p.ends[0]
        .open(p.now, addr("10.0.0.1:1"), addr("10.0.0.2:2"))
        .unwrap();
    p.apps[0].send(id, pattern(1, 200_000), false);
    assert!(p.run(Duration::from_secs(10), |p| {
        p.apps[1]
            .inp
            .get(&theirs(0))
            .is_some_and(|v| v.len() == 200_000)
    }));
    p.ends[0].reset(p.now, id);
    assert!(p.run(Duration::from_secs(10), |p| p.ends[1].is_closed(theirs(0))));
    p.settle(Duration::from_secs(1));
    // Replay everything A sent (OPEN, DATA) to B: no second Incoming, no data, and the
    // answers (RESETs) stay few.
    let replay: Vec<Bytes> = p
        .log
        .take()
        .unwrap()
        .into_iter()
        .filter(|f| f.0 == 0)
        .map(|f| f.1)
        .collect();
    let before = p.ends[1].stats().clone();
    for f in &replay {
        p.ends[1].handle_frame(p.now, f);
    }
    assert_eq!(
        p.ends[1].stats().data_bytes_received,
        before.data_bytes_received
    );
    assert_eq!(p.ends[1].open_streams(), 0);
    assert!(p.ends[1].replies.len() <= state::REPLY_CAP);
    p.settle(Duration::from_secs(2));
    assert_eq!(
        p.apps[1].count(|e| matches!(e, StreamEvent::Incoming { .. })),
        1
    );
    assert_eq!(p.ends[0].open_streams() + p.ends[1].open_streams(), 0);
    assert!(p.apps[0]
        .events
        .iter()
        .all(|e| !matches!(e, StreamEvent::Reset { .. })));
}

#[test]
fn slow_reader_stops_only_its_own_stream() {
    let len = 4_000_000;
    // A window well under the transfer: the stalled stream takes a window's worth of
    // the link at the start and nothing after.
    let cfg = StreamConfig {
        window: 1 << 20,
        ..StreamConfig::default()
    };
    // Alone: how long the fast stream takes.
    let alone = {
        let mut p = Pipe::new(cfg.clone(), Link::bond(0.01), 9);
        let fast = p.ends[0]
            .open(p.now, addr("10.0.0.1:1"), addr("10.0.0.2:2"))
            .unwrap();
        p.apps[0].send(fast, pattern(1, len), true);
        assert!(p.run(Duration::from_secs(30), |p| p.ends[1].finished(theirs(0))));
        p.now
    };
    let mut p = Pipe::new(cfg.clone(), Link::bond(0.01), 9);
    let fast = p.ends[0]
        .open(p.now, addr("10.0.0.1:1"), addr("10.0.0.2:2"))
        .unwrap();
    let slow = p.ends[0]
        .open(p.now, addr("10.0.0.1:3"), addr("10.0.0.2:4"))
        .unwrap();
    p.apps[0].send(fast, pattern(1, len), true);
    p.apps[0].send(slow, pattern(2, len), true);
    p.apps[1].paused.insert(theirs(slow.n));
    p.watch = Some(Box::new(move |p: &Pipe| {
        let held = recv_buffered(&p.ends[1], theirs(1));
        assert!(held <= cfg.window as u64, "{held} held");
    }));
    assert!(p.run(Duration::from_secs(30), |p| p.ends[1].finished(theirs(0))));
    let with = p.now;
    // The slow stream took about a window of the link at the start, nothing after.
    assert!(
        with.as_micros() < alone.as_micros() * 5 / 4 + 100 * MS,
        "alone {alone:?}, next to a stalled stream {with:?}"
    );
    let held = recv_buffered(&p.ends[1], theirs(1));
    assert!(held > 0 && held <= cfg.window as u64);
    // Stalled for seconds (credit updates and probes keep it alive), then read.
    p.settle(Duration::from_secs(10));
    assert!(!p.ends[0].is_closed(slow));
    assert!(recv_buffered(&p.ends[1], theirs(1)) <= cfg.window as u64);
    p.apps[1].resume();
    assert!(p.run(Duration::from_secs(30), |p| p.ends[1].finished(theirs(1))));
    assert!(p.apps[1].inp[&theirs(1)] == pattern(2, len));
    assert_eq!(p.ends[0].stats().given_up, 0);
}

#[test]
fn many_streams_stay_within_the_pool() {
    let cfg = StreamConfig {
        pool: 16 << 20,
        min_window: 16 << 10,
        ..StreamConfig::default()
    };
    let mut p = Pipe::new(cfg.clone(), Link::bond(0.01), 10);
    p.link.rate = 125_000_000;
    let n = 1000;
    let each = 32_000;
    for i in 0..n {
        let id = p.ends[0]
            .open(p.now, addr("10.0.0.1:1"), addr("10.0.0.2:2"))
            .unwrap();
        p.apps[0].send(id, pattern(i as u64, each), true);
        p.apps[1].paused.insert(theirs(i));
    }
    let peak = std::rc::Rc::new(std::cell::Cell::new(0usize));
    let seen = peak.clone();
    let mut steps = 0u64;
    p.watch = Some(Box::new(move |p: &Pipe| {
        steps += 1;
        if steps.is_multiple_of(16) {
            let b = p.ends[1].buffered();
            let c = p.ends[1].committed;
            let bound = cfg.pool + p.ends[1].open_streams() as u64 * u64::from(cfg.min_window);
            assert!(b as u64 <= bound, "{b} held, {c} committed");
            seen.set(seen.get().max(b));
        }
    }));
    // Nobody reads: the pool fills, and stays within its size (and each stream's
    // `min_window`).
    p.settle(Duration::from_secs(5));
    assert!(peak.get() as u64 > cfg.pool / 2, "peak {}", peak.get());
    assert_eq!(p.ends[1].open_streams(), n as usize);
    // Now everything is read, every stream ends intact.
    p.apps[1].resume();
    let total = (n as usize * each) as u64;
    assert!(p.run(Duration::from_secs(60), |p| {
        p.ends[1].stats().data_bytes_received == total && p.ends[1].buffered() == 0
    }));
    for i in 0..n {
        assert!(
            p.apps[1].inp[&theirs(i)] == pattern(i as u64, each),
            "stream {i}"
        );
        assert!(p.ends[1].finished(theirs(i)));
    }
}

#[test]
fn duplicate_open_gives_one_incoming_and_the_same_answer() {
    let cfg = StreamConfig::default();
    let (mut a, mut b) = (Streams::new(cfg.clone()), Streams::new(cfg));
    let now = Instant::ZERO;
    let id = a
        .open(now, addr("[2001:db8::1]:5000"), addr("[2001:db8::2]:22"))
        .unwrap();
    let open = a.poll_frame(now, MAX_LEN).unwrap();
    assert_eq!(open[0], wire::TYPE_OPEN);
    for _ in 0..3 {
        b.handle_frame(now, &open);
    }
    assert_eq!(
        b.poll_event(),
        Some(StreamEvent::Incoming {
            id: theirs(0),
            src: addr("[2001:db8::1]:5000"),
            dst: addr("[2001:db8::2]:22"),
        })
    );
    assert_eq!(b.poll_event(), None);
    assert_eq!(b.stats().duplicate_opens, 2);
    // Not answered until the application decides.
    assert!(!b.wants_to_send());
    b.accept(now, theirs(0));
    let answer = b.poll_frame(now, MAX_LEN).unwrap();
    // The OPEN again: the same answer, no event.
    b.handle_frame(now, &open);
    assert_eq!(b.poll_frame(now, MAX_LEN).unwrap(), answer);
    assert_eq!(b.poll_event(), None);
    a.handle_frame(now, &answer);
    a.handle_frame(now, &answer);
    assert_eq!(a.poll_event(), Some(StreamEvent::Opened { id }));
    assert_eq!(a.poll_event(), None);

    // A refused open: its copies are refused the same way, reported once.
    let id2 = a.open(now, addr("10.0.0.1:1"), addr("10.0.0.2:2")).unwrap();
    let open2 = a.poll_frame(now, MAX_LEN).unwrap();
    b.handle_frame(now, &open2);
    assert!(matches!(b.poll_event(), Some(StreamEvent::Incoming { .. })));
    b.refuse(now, theirs(1), Refusal::Unreachable);
    let no = b.poll_frame(now, MAX_LEN).unwrap();
    b.handle_frame(now, &open2);
    assert_eq!(b.poll_frame(now, MAX_LEN).unwrap(), no);
    assert_eq!(b.poll_event(), None);
    a.handle_frame(now, &no);
    a.handle_frame(now, &no);
    let why = Refusal::Unreachable;
    assert_eq!(a.poll_event(), Some(StreamEvent::Refused { id: id2, why }));
    assert_eq!(a.poll_event(), None);
    assert!(a.is_closed(id2));
}

#[test]
fn too_many_streams() {
    let cfg = StreamConfig {
        max_streams: 2,
        ..StreamConfig::default()
    };
    let (mut a, mut b) = (Streams::new(cfg), Streams::new(StreamConfig::default()));
    let now = Instant::ZERO;
    a.open(now, addr("10.0.0.1:1"), addr("10.0.0.2:2")).unwrap();
    a.open(now, addr("10.0.0.1:1"), addr("10.0.0.2:2")).unwrap();
    let err = a.open(now, addr("10.0.0.1:1"), addr("10.0.0.2:2"));
    assert_eq!(err, Err(Refusal::TooMany));
    // A is full with its own two: all three of B's are refused for too many.
    for _ in 0..3 {
        b.open(now, addr("10.0.0.3:1"), addr("10.0.0.4:2")).unwrap();
    }
    while let Some(f) = b.poll_frame(now, MAX_LEN) {
        a.handle_frame(now, &f);
    }
    while let Some(f) = a.poll_frame(now, MAX_LEN) {
        b.handle_frame(now, &f);
    }
    let why = Refusal::TooMany;
    let refused: Vec<StreamEvent> = std::iter::from_fn(|| b.poll_event())
        .filter(|e| matches!(e, StreamEvent::Refused { .. }))
        .collect();
    let want: Vec<StreamEvent> = (0..3)
        .map(|n| StreamEvent::Refused { id: ours(n), why })
        .collect();
    assert_eq!(refused, want);
    assert_eq!(a.stats().refused, 3);
    assert_eq!(a.open_streams(), 2);
}

#[test]
fn random_frames_never_panic() {
    // A pipe with streams in every state, then garbage, then real frames bit-flipped.
    let mut p = Pipe::new(StreamConfig::default(), Link::bond(0.0), 11);
    p.log = Some(Vec::new());
    let id = p.ends[0]
        .open(p.now, addr("10.0.0.1:1"), addr("10.0.0.2:2"))
        .unwrap();
    p.apps[0].send(id, pattern(1, 300_000), false);
    p.apps[1].answer = Some(pattern(2, 300_000));
    assert!(p.run(Duration::from_secs(10), |p| {
        p.apps[1]
            .inp
            .get(&theirs(0))
            .is_some_and(|v| v.len() == 300_000)
    }));
    let log = p.log.take().unwrap();
    let mut rng = SplitMix64::stream(11, 2);
    let now = p.now;
    for i in 0..100_000u64 {
        let f = if i % 2 == 0 {
            let len = rng.upto(80) as usize;
            let mut f: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            if let Some(b) = f.first_mut() {
                *b = 1 + (rng.upto(14) as u8);
            }
            // A stream that exists (or nearly): numbered 0 or 1.
            let n = rng.upto(2) as u8;
            match f.first() {
                Some(&t) if t >= wire::TYPE_SHORT_DATA && f.len() > 3 => {
                    f[1..4].copy_from_slice(&[0, 0, n]);
                }
                Some(_) if f.len() > 5 => f[2..6].copy_from_slice(&[0, 0, 0, n]),
                _ => {}
            }
            f
        } else {
            let (_, g) = &log[rng.upto(log.len() as u64 - 1) as usize];
            let mut f = g.to_vec();
            let bit = rng.upto(f.len() as u64 * 8 - 1) as usize;
            f[bit / 8] ^= 1 << (bit % 8);
            f
        };
        p.ends[(i % 4 / 2) as usize].handle_frame(now, &f);
        if i % 1000 == 0 {
            check(&p.ends[0]);
            check(&p.ends[1]);
        }
    }
    assert!(p.ends[0].stats().malformed > 1000);
    // Still a working machine: whatever survived is bounded and can be driven.
    for e in 0..2 {
        while p.ends[e].poll_frame(now, MAX_LEN).is_some() {}
        while p.ends[e].poll_event().is_some() {}
        assert!(p.ends[e].replies.len() <= state::REPLY_CAP);
        check(&p.ends[e]);
    }
}

#[test]
fn reset_all_ends_every_stream() {
    let mut p = Pipe::new(StreamConfig::default(), Link::bond(0.0), 12);
    for i in 0..3 {
        let id = p.ends[0]
            .open(p.now, addr("10.0.0.1:1"), addr("10.0.0.2:2"))
            .unwrap();
        p.apps[0].send(id, pattern(i, 2_000_000), true);
    }
    p.apps[1].answer = Some(pattern(9, 2_000_000));
    assert!(p.run(Duration::from_secs(10), |p| {
        p.apps[1].inp.values().filter(|v| v.len() > 100_000).count() == 3
    }));
    // A's peer "restarted" (from A's point of view B is new): every stream ends.
    p.ends[0].reset_all();
    p.apps[0].out.clear();
    let resets: Vec<StreamEvent> = std::iter::from_fn(|| p.ends[0].poll_event())
        .filter(|e| matches!(e, StreamEvent::Reset { .. }))
        .collect();
    let want: Vec<StreamEvent> = (0..3).map(|n| StreamEvent::Reset { id: ours(n) }).collect();
    assert_eq!(resets, want);
    assert_eq!((p.ends[0].open_streams(), p.ends[0].buffered()), (0, 0));
    assert_eq!(p.ends[0].poll_timeout(), None);
    // B's streams learn it from A's answers to their frames.
    assert!(p.run(Duration::from_secs(30), |p| p.ends[1].open_streams() == 0));
    assert_eq!(
        p.apps[1].count(|e| matches!(e, StreamEvent::Reset { .. })),
        3
    );
    // And new streams work.
    let id = p.ends[0]
        .open(p.now, addr("10.0.0.1:1"), addr("10.0.0.2:2"))
        .unwrap();
    p.apps[0].send(id, pattern(5, 10_000), true);
    p.apps[1].answer = Some(Vec::new());
    assert!(p.run(Duration::from_secs(10), |p| p.ends[0].is_closed(id)));
}

#[test]
fn gives_up_when_the_peer_goes_silent() {
    let cfg = StreamConfig {
        give_up: Duration::from_secs(3),
        ..StreamConfig::default()
    };
    let mut p = Pipe::new(cfg, Link::bond(0.0), 13);
    let id = p.ends[0]
        .open(p.now, addr("10.0.0.1:1"), addr("10.0.0.2:2"))
        .unwrap();
    p.apps[0].send(id, pattern(1, 2_000_000), true);
    assert!(p.run(Duration::from_secs(10), |p| {
        p.apps[1]
            .inp
            .get(&theirs(0))
            .is_some_and(|v| v.len() > 200_000)
    }));
    p.cut = true;
    let cut_at = p.now;
    assert!(p.run(Duration::from_secs(10), |p| p.ends[0].is_closed(id)));
    let waited = p.now.saturating_since(cut_at);
    assert!(
        waited >= Duration::from_secs(2) && waited <= Duration::from_secs(4),
        "{waited:?}"
    );
    assert_eq!(p.apps[0].count(|e| *e == StreamEvent::Reset { id }), 1);
    assert_eq!(p.ends[0].stats().given_up, 1);
    assert_eq!(p.ends[0].buffered(), 0);
    // Its RESET is repeated a few times, then forgotten too.
    p.settle(Duration::from_secs(30));
    assert_eq!(p.ends[0].poll_timeout(), None);

    // An open into silence is given up as well.
    let id = p.ends[0]
        .open(p.now, addr("10.0.0.1:1"), addr("10.0.0.2:2"))
        .unwrap();
    assert!(p.run(Duration::from_secs(10), |p| p.ends[0].is_closed(id)));
    assert_eq!(p.apps[0].count(|e| *e == StreamEvent::Reset { id }), 1);
    assert!(p.ends[0].stats().open_retransmits >= 3);
}

#[test]
fn both_ends_open_at_once_without_collision() {
    let mut p = Pipe::new(StreamConfig::default(), Link::bond(0.02), 14);
    let a = p.ends[0]
        .open(p.now, addr("10.0.0.1:1"), addr("10.0.0.2:2"))
        .unwrap();
    let b = p.ends[1]
        .open(p.now, addr("10.0.0.2:3"), addr("10.0.0.1:4"))
        .unwrap();
    assert_eq!((a, b), (ours(0), ours(0)));
    p.apps[0].send(a, pattern(1, 300_000), true);
    p.apps[1].send(b, pattern(2, 300_000), true);
    p.apps[0].answer = Some(pattern(3, 300_000));
    p.apps[1].answer = Some(pattern(4, 300_000));
    assert!(p.run(Duration::from_secs(20), |p| {
        p.ends[0].open_streams() == 0 && p.ends[1].open_streams() == 0
    }));
    assert!(p.apps[1].inp[&theirs(0)] == pattern(1, 300_000));
    assert!(p.apps[0].inp[&theirs(0)] == pattern(2, 300_000));
    assert!(p.apps[0].inp[&ours(0)] == pattern(4, 300_000));
    assert!(p.apps[1].inp[&ours(0)] == pattern(3, 300_000));
}

#[test]
fn idle_streams_hold_no_buffers() {
    let mut p = Pipe::new(StreamConfig::default(), Link::bond(0.01), 15);
    let id = p.ends[0]
        .open(p.now, addr("10.0.0.1:1"), addr("10.0.0.2:2"))
        .unwrap();
    p.apps[0].send(id, pattern(1, 500_000), false);
    p.apps[1].answer = Some(pattern(2, 500_000));
    assert!(p.run(Duration::from_secs(10), |p| {
        p.apps[1]
            .inp
            .get(&theirs(0))
            .is_some_and(|v| v.len() == 500_000)
            && p.apps[0].inp.get(&id).is_some_and(|v| v.len() == 500_000)
    }));
    p.settle(Duration::from_secs(2));
    for (e, sid) in [(0, id), (1, theirs(0))] {
        let s = &p.ends[e].map[&sid];
        assert_eq!((s.send.allocated(), s.recv.allocated()), (0, 0), "end {e}");
        assert_eq!(p.ends[e].buffered(), 0);
    }
    // An idle stream wants no timer (B's side finished its half, A still waits for
    // nothing: neither has anything in flight).
    assert_eq!(p.ends[0].poll_timeout(), None);
}

#[test]
fn lost_credit_updates_do_not_deadlock() {
    // A tiny window, a reader that reads in small bites, heavy loss: credit updates
    // are lost often; probes and the next updates must keep the stream going.
    let cfg = StreamConfig {
        window: 16 << 10,
        min_window: 4 << 10,
        ..StreamConfig::default()
    };
    let mut p = Pipe::new(cfg, Link::bond(0.2), 16);
    let id = p.ends[0]
        .open(p.now, addr("10.0.0.1:1"), addr("10.0.0.2:2"))
        .unwrap();
    let data = pattern(1, 300_000);
    p.apps[0].send(id, data.clone(), true);
    assert!(p.run(Duration::from_secs(120), |p| p.ends[1].finished(theirs(0))));
    assert!(p.apps[1].inp[&theirs(0)] == data);
    assert!(p.ends[0].stats().beyond_credit_bytes + p.ends[1].stats().beyond_credit_bytes == 0);
}

#[test]
fn frames_fit_max_len() {
    let cfg = StreamConfig::default();
    let (mut a, mut b) = (Streams::new(cfg.clone()), Streams::new(cfg));
    let now = Instant::ZERO;
    let id = a.open(now, addr("10.0.0.1:1"), addr("10.0.0.2:2")).unwrap();
    let f = a.poll_frame(now, 100).unwrap();
    b.handle_frame(now, &f);
    b.accept(now, theirs(0));
    let f = b.poll_frame(now, 100).unwrap();
    a.handle_frame(now, &f);
    assert_eq!(a.write(now, id, &[7; 5000]), 5000);
    let mut got = 0;
    while let Some(f) = a.poll_frame(now, 100) {
        assert!(f.len() <= 100);
        match Repr::parse(&f).unwrap() {
            Repr::Data {
                data,
                id: w,
                offset,
                ..
            } => {
                assert_eq!(
                    w,
                    WireId {
                        n: 0,
                        opened_by_sender: true
                    }
                );
                // Short DATA, full but for the last: 100 bytes less its 8.
                assert_eq!(offset, wire::DataOffset::Low32(got as u32));
                assert_eq!(data.len(), (5000 - got).min(92));
                got += data.len();
            }
            r => panic!("{r:?}"),
        }
    }
    assert_eq!(got, 5000);
    // Too small for any frame: nothing, and nothing lost.
    assert!(a.write(now, id, &[8; 10]) == 10);
    assert_eq!(a.poll_frame(now, wire::SHORT_DATA_HEADER_LEN), None);
    assert!(a.wants_to_send());
    // One byte more: a frame of one byte.
    let f = a.poll_frame(now, wire::SHORT_DATA_HEADER_LEN + 1).unwrap();
    assert_eq!(f[..], [0x0c, 0, 0, 0, 0, 0, 0x13, 0x88, 8]);
}

#[test]
fn random_workloads_arrive_intact() {
    // Many seeds: loss from 0 to 24 %, tiny and large windows, a small pool, streams
    // opened by both ends, each answered.
    for seed in 0..30u64 {
        let loss = (seed % 5) as f64 * 0.06;
        let small = seed % 3 == 0;
        let cfg = StreamConfig {
            window: if small { 8 << 10 } else { 1 << 20 },
            min_window: if small { 2 << 10 } else { 64 << 10 },
            pool: if seed % 2 == 0 { 1 << 20 } else { 64 << 20 },
            ..StreamConfig::default()
        };
        let mut p = Pipe::new(cfg, Link::bond(loss), seed);
        let mut r = SplitMix64::stream(seed, 99);
        let mut want = Vec::new();
        for k in 0..4u64 {
            let e = (k % 2) as usize;
            let id = p.ends[e]
                .open(p.now, addr("10.0.0.1:1"), addr("10.0.0.2:2"))
                .unwrap();
            let data = pattern(seed * 10 + k, r.upto(200_000) as usize);
            p.apps[e].send(id, data.clone(), true);
            want.push((1 - e, theirs(id.n), data));
        }
        p.apps[0].answer = Some(pattern(seed, 50_000));
        p.apps[1].answer = Some(pattern(seed + 1, 70_000));
        let ok = p.run(Duration::from_secs(300), |p| {
            p.ends[0].open_streams() + p.ends[1].open_streams() == 0
        });
        let stats = (p.ends[0].stats(), p.ends[1].stats());
        assert!(ok, "seed {seed}, loss {loss}: {stats:?}");
        for (e, id, data) in want {
            let got = p.apps[e].inp.get(&id);
            assert!(got.map_or(data.is_empty(), |v| *v == data), "seed {seed}");
            let answer = &p.apps[1 - e].inp[&ours(id.n)];
            assert_eq!(answer.len(), [50_000, 70_000][e], "seed {seed}");
        }
    }
}

/// Start stream `id` (open at both ends, nothing written to it yet) at offset `base`
/// in both directions, as if `base` bytes had crossed each way, been acknowledged and
/// read: a transfer then reaches offsets that would take gigabytes to reach.
fn start_at(p: &mut Pipe, id: StreamId, base: u64) {
    for (e, sid) in [(0, id), (1, theirs(id.n))] {
        let s = p.ends[e].map.get_mut(&sid).unwrap();
        assert_eq!((s.send.written, s.recv.highest), (0, 0), "end {e}");
        let (send, recv) = (&mut s.send, &mut s.recv);
        (send.una, send.nxt, send.written) = (base, base, base);
        send.limit += base;
        (recv.read, recv.nxt, recv.highest) = (base, base, base);
        recv.limit += base;
    }
}

/// Short DATA frames carry an offset's low 32 bits: transfers whose offsets cross a
/// multiple of 2^32 (and one near the top of the offset space), with loss, duplicates
/// and reordering, arrive intact in both directions, every DATA frame short.
#[test]
fn offsets_past_2_32_arrive_in_order() {
    const G: u64 = 1 << 32;
    let len = 2_000_000;
    for (seed, base) in [
        (20, G - 700_000),
        (21, 5 * G - 1_300_000),
        // The credit limit stays below 2^48 too (the window is 8 MiB).
        (22, wire::OFFSET_LIMIT - (12 << 20)),
    ] {
        let mut p = Pipe::new(StreamConfig::default(), Link::bond(0.02), seed);
        p.log = Some(Vec::new());
        let id = p.ends[0]
            .open(p.now, addr("10.0.0.1:1"), addr("10.0.0.2:2"))
            .unwrap();
        let opened = |p: &mut Pipe| p.apps[0].count(|e| *e == StreamEvent::Opened { id }) == 1;
        assert!(p.run(Duration::from_secs(5), opened));
        start_at(&mut p, id, base);
        let (a, b) = (pattern(seed, len), pattern(seed + 100, len));
        p.apps[0].send(id, a.clone(), true);
        p.apps[1].send(theirs(0), b.clone(), true);
        let done = p.run(Duration::from_secs(60), |p| {
            p.ends[0].is_closed(id) && p.ends[1].is_closed(theirs(0))
        });
        let stats = (p.ends[0].stats(), p.ends[1].stats());
        assert!(done, "base {base:#x}: {stats:?}");
        assert!(
            p.apps[1].inp[&theirs(0)] == a,
            "base {base:#x}: A -> B differs"
        );
        assert!(p.apps[0].inp[&id] == b, "base {base:#x}: B -> A differs");
        // Repairs stay near what was lost (2 %): no frame beyond a boundary was taken
        // for one 2^32 bytes off (a duplicate, or beyond the credit) and sent again.
        for e in &p.ends {
            let s = e.stats();
            assert_eq!(s.data_bytes_received, len as u64);
            assert!(s.retransmitted_bytes > 0, "{s:?}");
            assert!(s.retransmitted_bytes < len as u64 / 10, "{s:?}");
            assert!(s.duplicate_bytes_received < len as u64 / 10, "{s:?}");
            assert_eq!((s.beyond_credit_bytes, s.malformed), (0, 0), "{s:?}");
        }
        // Every DATA frame was short, and their offsets went round 2^32 where the
        // transfer crossed a multiple of it.
        let log = p.log.take().unwrap();
        let lows: Vec<u32> = log
            .iter()
            .filter(|(_, f)| wire::is_data(f))
            .map(|(_, f)| match Repr::parse(f) {
                Ok(Repr::Data {
                    offset: wire::DataOffset::Low32(l),
                    ..
                }) => l,
                r => panic!("not a short DATA: {r:?}"),
            })
            .collect();
        assert!(lows.len() as u64 > 2 * len as u64 / 1400);
        let crosses = base / G != (base + len as u64) / G;
        let wrapped = lows.iter().any(|&l| l < 1 << 20) && lows.iter().any(|&l| l > !0 - (1 << 20));
        assert_eq!(wrapped, crosses, "base {base:#x}");
    }
}
