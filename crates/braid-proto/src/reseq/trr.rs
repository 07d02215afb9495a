//! TRR reception (seed 001): never out of order, loss allowed.
//!
//! Data packets carry no header. Every N data packets the sender puts a trigger on every
//! channel naming the implicit number (round, deficit counter) of the next packet on that
//! channel and how many data packets it has sent on it. The receiver numbers each
//! arriving packet by running that channel's SRR counter forward from the last trigger;
//! when the next trigger arrives and its number, packet count and digest match, the
//! whole segment is verified (a lost packet changes the byte or packet count and so the
//! number; a loss plus a duplicate changes the digest) and its packets
//! are released in sender order: by round, then channel index, then position in the
//! visit. A segment that fails verification is dropped (loss is allowed; misordering is
//! not). Released packets are delivered once every channel's last trigger is past them,
//! so the added latency is bounded by the trigger interval; a channel that sends no
//! trigger for `max_wait` while verified data waits is left out until its next trigger,
//! and anything it then carries from before the delivered point is dropped.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::{Item, ModeEngine, Sink};
use crate::sched::{Position, Srr};
use crate::stats::Stats;
use crate::time::{Duration, Instant};
use crate::wire::trigger;

/// Sender order of a packet: round, channel, then decreasing deficit counter.
type Key = (u64, usize, i64);

fn key(channel: usize, p: Position) -> Key {
    (p.round, channel, -p.dc)
}

struct Chan {
    /// Numbering is known (a trigger was accepted and nothing dropped since).
    synced: bool,
    /// Data packets the sender had sent on this channel at the last accepted trigger.
    count: u64,
    /// Running digest of this channel's packets, as of the last one received.
    digest: u64,
    /// Packets since the last trigger, not yet verified.
    tentative: Vec<(Key, Bytes)>,
    /// Everything on this channel before this key is settled. `None`: left out.
    frontier: Option<Key>,
}

/// The `trr` mode's engine.
pub(crate) struct Trr {
    /// Per channel, the implicit number of the next packet ([`Srr::position`]), run
    /// forward by the scheduler's own consume step. (Only the positions are used: the
    /// pointer and the global round mean nothing here.)
    srr: Srr,
    chans: Vec<Chan>,
    ready: BTreeMap<Key, Bytes>,
    /// Entries of `ready` per channel (for credit accounting).
    ready_on: Vec<usize>,
    last: Option<Key>,
    stalled_since: Option<Instant>,
    last_arrival: Vec<Instant>,
    /// Most verified packets held back before the slowest channel is left out.
    ready_limit: usize,
    /// Most unverified packets held per channel.
    limit: usize,
    /// How long verified data waits for a silent channel.
    max_wait: Duration,
}

impl Trr {
    pub(crate) fn new(srr: Srr, buffer_packets: usize, max_wait: Duration) -> Trr {
        let n = srr.channels();
        let chans = (0..srr.channels())
            .map(|c| Chan {
                synced: true,
                count: 0,
                digest: 0,
                tentative: Vec::new(),
                frontier: Some(key(c, srr.position(c))),
            })
            .collect();
        Trr {
            srr,
            chans,
            ready: BTreeMap::new(),
            ready_on: vec![0; n],
            last: None,
            stalled_since: None,
            last_arrival: vec![Instant::ZERO; n],
            ready_limit: buffer_packets.saturating_mul(n),
            limit: buffer_packets,
            max_wait,
        }
    }

    fn on_data(
        &mut self,
        now: Instant,
        channel: usize,
        payload: Bytes,
        wire_len: u32,
        stats: &mut Stats,
    ) {
        self.last_arrival[channel] = now;
        let ch = &mut self.chans[channel];
        if !ch.synced {
            stats.lost += 1;
            return;
        }
        if ch.tentative.len() >= self.limit {
            // Cannot hold the segment: it can no longer be verified.
            stats.channels[channel].overflow_drops += 1;
            stats.lost += ch.tentative.len() as u64 + 1;
            ch.tentative.clear();
            ch.synced = false;
            return;
        }
        ch.digest = trigger::fold(ch.digest, trigger::fingerprint(wire_len as usize, &payload));
        ch.tentative
            .push((key(channel, self.srr.position(channel)), payload));
        let hw = &mut stats.channels[channel].buffer_high_water;
        *hw = (*hw).max(ch.tentative.len() as u64);
        let cost = self.srr.cost_of(wire_len as usize);
        self.srr.consume(channel, cost);
        self.update_stall(now);
    }

    pub(crate) fn on_trigger(
        &mut self,
        now: Instant,
        channel: usize,
        t: &trigger::Repr,
        sink: &mut Sink,
    ) {
        self.last_arrival[channel] = now;
        let ch = &mut self.chans[channel];
        let stats = &mut sink.stats;
        let received = ch.tentative.len() as u64;
        let verified = ch.synced
            && self.srr.position(channel) == t.position
            && ch.count + received == t.channel_count
            && ch.digest == t.digest;
        if verified {
            for (k, p) in ch.tentative.drain(..) {
                if self.ready.insert(k, p).is_none() {
                    self.ready_on[channel] += 1;
                }
            }
        } else {
            if ch.synced {
                let expected = t.channel_count.saturating_sub(ch.count);
                stats.lost += expected.max(received);
            }
            ch.tentative.clear();
            stats.channels[channel].resyncs += 1;
        }
        ch.synced = true;
        ch.count = t.channel_count;
        ch.digest = t.digest;
        ch.frontier = Some(key(channel, t.position));
        self.srr.set_position(channel, t.position);
        // The sender's quantum for this channel from this trigger on (adaptive weights).
        if let Some(q) = t.quantum {
            self.srr.set_quantum(channel, q);
        }
        self.release(sink);
        // Memory bound: a channel that holds back too much verified data is left out.
        while self.ready.len() > self.ready_limit
            && self.leave_out_slowest(&mut sink.stats).is_some()
        {
            self.release(sink);
        }
        self.update_stall(now);
    }

    /// Deliver every verified packet that no channel can still precede.
    fn release(&mut self, sink: &mut Sink) {
        let bound = self.chans.iter().filter_map(|c| c.frontier).min();
        while let Some(entry) = self.ready.first_entry() {
            if bound.is_some_and(|b| *entry.key() >= b) {
                break;
            }
            let (k, p) = entry.remove_entry();
            self.ready_on[k.1] -= 1;
            if self.last.is_some_and(|l| k <= l) {
                sink.stats.lost += 1;
                continue;
            }
            self.last = Some(k);
            sink.deliver(p);
        }
    }

    fn update_stall(&mut self, now: Instant) {
        if self.ready.is_empty() {
            self.stalled_since = None;
        } else {
            self.stalled_since.get_or_insert(now);
        }
    }

    /// The channel whose last trigger holds delivery back.
    fn slowest(&self) -> Option<usize> {
        self.chans
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.frontier.map(|f| (f, i)))
            .min()
            .map(|(_, i)| i)
    }

    /// Stop waiting for the channel whose last trigger holds delivery back, until its
    /// next trigger. Returns the channel, or `None` if none is left to leave out.
    fn leave_out_slowest(&mut self, stats: &mut Stats) -> Option<usize> {
        let i = self.slowest()?;
        let ch = &mut self.chans[i];
        stats.lost += ch.tentative.len() as u64;
        ch.tentative.clear();
        ch.synced = false;
        ch.frontier = None;
        Some(i)
    }
}

impl ModeEngine for Trr {
    #[inline]
    fn accept(&mut self, now: Instant, channel: usize, item: Item, sink: &mut Sink) {
        // Markers have no use in TRR.
        if let Item::Data {
            payload, wire_len, ..
        } = item
        {
            self.on_data(now, channel, payload, wire_len, &mut sink.stats);
        }
    }

    /// Due when verified data has waited `max_wait` and the channel holding it back has
    /// been silent for as long.
    fn timeout(&self) -> Option<Instant> {
        let since = self.stalled_since?;
        let quiet = self.slowest().map_or(since, |i| self.last_arrival[i]);
        Some(since.max(quiet) + self.max_wait)
    }

    /// Verified data has waited too long: leave out the channel that holds it back.
    fn handle_timeout(&mut self, now: Instant, sink: &mut Sink) {
        if let Some(i) = self.leave_out_slowest(&mut sink.stats) {
            sink.stats.channels[i].wait_timeouts += 1;
        }
        self.release(sink);
        self.stalled_since = None;
        self.update_stall(now);
    }

    /// Nothing more arrives: release every verified packet, drop unverified ones.
    fn drain(&mut self, _: Instant, sink: &mut Sink) {
        for ch in &mut self.chans {
            sink.stats.lost += ch.tentative.len() as u64;
            ch.tentative.clear();
            ch.synced = false;
            ch.frontier = None;
        }
        self.release(sink);
        self.stalled_since = None;
    }

    fn buffered(&self) -> usize {
        self.ready.len() + self.chans.iter().map(|c| c.tentative.len()).sum::<usize>()
    }
    fn held_on(&self, channel: usize) -> usize {
        self.chans.get(channel).map_or(0, |c| c.tentative.len())
            + self.ready_on.get(channel).copied().unwrap_or(0)
    }
}
