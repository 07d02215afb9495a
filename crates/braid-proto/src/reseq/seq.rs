//! `seq` mode: guaranteed FIFO, exactly once. Logical reception predicts the channel of
//! the next packet and the sequence number confirms it; otherwise the expected number is
//! looked for at every channel's head, and declared lost once every channel has moved
//! past it (channels are FIFO). With repair configured, missing numbers are first named
//! in a NAK and waited for.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::logical::Buffered;
use super::{Item, ModeEngine, Sink};
use crate::stats::Stats;
use crate::time::{Duration, Instant};
use crate::wire;

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

impl Repair {
    /// Name `expected..end` in the next NAK and wait for them until `now + wait`.
    fn request(&mut self, expected: u64, end: u64, now: Instant) {
        self.out.extend(expected..end);
        self.naked_until = end;
        self.deadline = Some(now + self.wait);
    }
}

/// What the search for a gap found.
enum Gap {
    /// No gap that can be passed yet.
    None,
    /// The expected number was declared lost: go on.
    Passed,
    /// A repair is awaited.
    Waiting,
}

/// The `seq` mode's engine: buffers and follower, plus what the sequence numbers add.
pub(crate) struct Seq {
    b: Buffered,
    /// Next sequence number to deliver.
    expected: u64,
    /// Per channel, the lowest sequence number that can still arrive on it.
    floor: Vec<u64>,
    /// Loss repair by NAK, if configured.
    repair: Option<Repair>,
    /// Sequence numbers this far or further ahead of `expected` are refused.
    window: u64,
}

impl Seq {
    pub(crate) fn new(b: Buffered, repair_wait: Option<Duration>) -> Seq {
        let n = b.bufs.len();
        let window = (2 * n * b.limit).max(1024) as u64;
        Seq {
            window,
            b,
            expected: 0,
            floor: vec![0; n],
            repair: repair_wait.map(|wait| Repair {
                wait,
                store: BTreeMap::new(),
                naked_until: 0,
                deadline: None,
                out: Vec::new(),
            }),
        }
    }

    /// The next sequence number to deliver.
    pub(crate) fn expected(&self) -> u64 {
        self.expected
    }

    /// Is loss repair configured?
    pub(crate) fn repairs(&self) -> bool {
        self.repair.is_some()
    }

    /// Up to `max` numbers for a NAK, if any are due.
    pub(crate) fn take_nak(&mut self, max: usize) -> Option<Vec<u64>> {
        let r = self.repair.as_mut()?;
        if r.out.is_empty() {
            return None;
        }
        let n = r.out.len().min(max);
        Some(r.out.drain(..n).collect())
    }

    /// A repaired packet arrived (repair is configured: see [`Seq::repairs`]).
    pub(crate) fn on_repair(
        &mut self,
        now: Instant,
        wrapped: u32,
        payload: Bytes,
        sink: &mut Sink,
    ) {
        let Some(r) = self.repair.as_mut() else {
            return;
        };
        let s = wire::seq::extend(wrapped, self.expected);
        if s >= r.naked_until {
            // Never asked for: a forgery (or another run's packet).
            sink.stats.out_of_window += 1;
            return;
        }
        if s < self.expected || r.store.contains_key(&s) || r.store.len() >= self.b.limit {
            sink.stats.stale_dropped += 1;
            return;
        }
        r.store.insert(s, payload);
        self.run(now, sink);
    }

    /// Deliver in order until the expected number is not there.
    fn run(&mut self, now: Instant, sink: &mut Sink) {
        loop {
            if self.deliver_repaired(sink) {
                continue;
            }
            // Fast path: the follower's channel holds the expected number.
            let c = self.b.follow.expected(&mut self.b.bufs, &mut sink.stats);
            if self.head_is_expected(c) {
                self.deliver_head(c, sink);
                sink.stats.fast_path_hits += 1;
                continue;
            }
            // Slow path: look at every channel's head.
            if let Some(i) = self.search_heads(&mut sink.stats) {
                self.deliver_head(i, sink);
                continue;
            }
            match self.pass_gap(now, c, &mut sink.stats) {
                Gap::Passed => continue,
                Gap::Waiting => return,
                Gap::None => {}
            }
            if self.b.any_full() {
                sink.stats.channels[c].wait_timeouts += 1;
                self.skip_to_lowest_buffered(&mut sink.stats);
                continue;
            }
            self.b.note_blocked(c, now);
            return;
        }
    }

    /// Deliver the repaired packet whose turn has come, if there is one.
    fn deliver_repaired(&mut self, sink: &mut Sink) -> bool {
        let Some(r) = self.repair.as_mut() else {
            return false;
        };
        while r
            .store
            .first_key_value()
            .is_some_and(|(k, _)| *k < self.expected)
        {
            r.store.pop_first();
            sink.stats.stale_dropped += 1;
        }
        if r.store
            .first_key_value()
            .is_some_and(|(k, _)| *k == self.expected)
        {
            let (_, payload) = r.store.pop_first().expect("first exists");
            self.expected += 1;
            sink.stats.repaired += 1;
            sink.deliver(payload);
            return true;
        }
        if self.expected >= r.naked_until {
            r.deadline = None; // nothing NAKed is still awaited
        }
        false
    }

    #[inline]
    fn head_is_expected(&self, c: usize) -> bool {
        matches!(self.b.bufs[c].front(), Some(Item::Data { seq, .. }) if *seq == self.expected)
    }

    #[inline]
    fn deliver_head(&mut self, c: usize, sink: &mut Sink) {
        self.b.deliver_head(c, sink);
        self.expected += 1;
    }

    /// Apply the markers and drop the stale data at every channel's head; return a
    /// channel whose head is the expected number (the last one, if several are).
    fn search_heads(&mut self, stats: &mut Stats) -> Option<usize> {
        let mut found = None;
        for (i, q) in self.b.bufs.iter_mut().enumerate() {
            loop {
                match q.front() {
                    Some(&Item::Marker {
                        position: pos,
                        quantum,
                        ..
                    }) => {
                        q.pop_front();
                        if self.b.follow.apply_marker(i, pos, quantum) {
                            stats.channels[i].resyncs += 1;
                        }
                    }
                    Some(Item::Data { seq, .. }) if *seq < self.expected => {
                        q.pop_front();
                        stats.stale_dropped += 1;
                    }
                    _ => break,
                }
            }
            if matches!(q.front(), Some(Item::Data { seq, .. }) if *seq == self.expected) {
                found = Some(i);
            }
        }
        found
    }

    /// If every channel has moved past the expected number (channels are FIFO), it is
    /// lost: with repair, NAK the gap and wait for it first. `c` is the channel the
    /// follower expects it on.
    fn pass_gap(&mut self, now: Instant, c: usize, stats: &mut Stats) -> Gap {
        let mut lowest = u64::MAX;
        let mut all_past = true;
        for (i, q) in self.b.bufs.iter().enumerate() {
            let low = match q.front() {
                Some(Item::Data { seq, .. }) => *seq,
                _ => self.floor[i],
            };
            if low <= self.expected {
                all_past = false;
            }
            lowest = lowest.min(low);
        }
        if !all_past || lowest == u64::MAX {
            return Gap::None;
        }
        if let Some(r) = self.repair.as_mut() {
            // A repaired packet may already wait beyond the gap.
            lowest = r
                .store
                .first_key_value()
                .map_or(lowest, |(k, _)| lowest.min(*k));
            if self.expected >= r.naked_until {
                // Name the gap to the sender and wait for it.
                let end = lowest.min(self.expected + wire::nak::MAX_SEQS as u64);
                r.request(self.expected, end, now);
            }
            if r.deadline.is_some_and(|d| now < d) {
                self.b.note_blocked(c, now);
                return Gap::Waiting;
            }
            // The wait is over (or the numbers were NAKed before and expired).
            r.deadline = None;
        }
        stats.lost += lowest - self.expected;
        self.expected = lowest;
        self.b.blocked = None;
        Gap::Passed
    }

    /// After `max_wait`: give up on every number below the lowest one buffered.
    fn skip_to_lowest_buffered(&mut self, stats: &mut Stats) {
        let lowest = self
            .b
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
            if l > self.expected {
                stats.lost += l - self.expected;
                self.expected = l;
            }
        }
    }
}

impl ModeEngine for Seq {
    #[inline]
    fn accept(&mut self, now: Instant, channel: usize, item: Item, sink: &mut Sink) {
        self.b.heard(channel, now);
        match &item {
            Item::Marker { sent, .. } => {
                // The same window for the count a marker carries: a far-ahead count
                // would put the channel past numbers it never carried, and markers on
                // every channel would skip the stream there.
                if *sent > self.expected.saturating_add(self.window) {
                    sink.stats.out_of_window += 1;
                    return;
                }
                self.floor[channel] = self.floor[channel].max(*sent)
            }
            Item::Data { seq, .. } => {
                let seq = *seq;
                // Too far ahead to be genuine: the sender cannot be more than what all
                // the buffers hold (twice, for slack) ahead of what we deliver. A forged
                // far-ahead number would otherwise make every channel look past the
                // expected one and skip everything up to it.
                if seq >= self.expected.saturating_add(self.window) {
                    sink.stats.out_of_window += 1;
                    return;
                }
                // Already delivered or skipped, or not after what this channel gave.
                let stale = seq < self.expected
                    || self.b.bufs[channel]
                        .iter()
                        .rev()
                        .find_map(|it| match it {
                            Item::Data { seq, .. } => Some(*seq),
                            _ => None,
                        })
                        .is_some_and(|last| last >= seq);
                if stale {
                    sink.stats.stale_dropped += 1;
                    return;
                }
                self.floor[channel] = self.floor[channel].max(seq + 1);
            }
        }
        self.b.push(channel, item, &mut sink.stats);
        self.run(now, sink);
    }

    fn timeout(&self) -> Option<Instant> {
        let repair_due = self.repair.as_ref().and_then(|r| r.deadline);
        match (self.b.silent_due(), repair_due) {
            (Some(a), Some(r)) => Some(a.min(r)),
            (a, r) => a.or(r),
        }
    }

    fn handle_timeout(&mut self, now: Instant, sink: &mut Sink) {
        if self.b.silent_due().is_some_and(|t| now >= t) {
            if let Some((c, _)) = self.b.blocked.take() {
                sink.stats.channels[c].wait_timeouts += 1;
                match self.repair.as_mut() {
                    // A silent channel may have lost the packet and everything after
                    // it: ask for what is missing before giving up.
                    Some(r) if self.expected >= r.naked_until => {
                        let known = self.floor.iter().copied().max().unwrap_or(0);
                        let end = known
                            .max(self.expected + 1)
                            .min(self.expected + wire::nak::MAX_SEQS as u64);
                        r.request(self.expected, end, now);
                    }
                    _ => self.skip_to_lowest_buffered(&mut sink.stats),
                }
            }
        }
        self.run(now, sink);
        // An expired wait must not keep the timer armed: the numbers it covered are
        // declared lost when their turn comes.
        if let Some(r) = self.repair.as_mut() {
            if r.deadline.is_some_and(|d| d <= now) {
                r.deadline = None;
            }
        }
    }

    fn drain(&mut self, now: Instant, sink: &mut Sink) {
        loop {
            // Nothing more will come, repairs included: stop waiting for them.
            if let Some(r) = self.repair.as_mut() {
                r.deadline = Some(now);
                r.naked_until = u64::MAX;
            }
            self.run(now, sink);
            if self.b.all_empty() {
                break;
            }
            self.b.blocked = None;
            let before = self.expected;
            self.skip_to_lowest_buffered(&mut sink.stats);
            if self.expected == before {
                // Only markers left: nothing more to deliver.
                self.b.bufs.iter_mut().for_each(|b| b.clear());
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
