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

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;

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
    /// Implicit number of the next packet on this channel.
    pos: Position,
    /// Data packets the sender had sent on this channel at the last accepted trigger.
    count: u64,
    /// Running digest of this channel's packets, as of the last one received.
    digest: u64,
    /// Packets since the last trigger, not yet verified.
    tentative: Vec<(Key, Bytes)>,
    /// Everything on this channel before this key is settled. `None`: left out.
    frontier: Option<Key>,
}

pub(crate) struct Trr {
    srr: Srr,
    chans: Vec<Chan>,
    ready: BTreeMap<Key, Bytes>,
    last: Option<Key>,
    stalled_since: Option<Instant>,
    last_arrival: Vec<Instant>,
    /// Most verified packets held back before the slowest channel is left out.
    ready_limit: usize,
}

impl Trr {
    pub(crate) fn new(srr: Srr, buffer_packets: usize) -> Trr {
        let n = srr.channels();
        let chans = (0..srr.channels())
            .map(|c| {
                let pos = srr.position(c);
                Chan {
                    synced: true,
                    pos,
                    count: 0,
                    digest: 0,
                    tentative: Vec::new(),
                    frontier: Some(key(c, pos)),
                }
            })
            .collect();
        Trr {
            srr,
            chans,
            ready: BTreeMap::new(),
            last: None,
            stalled_since: None,
            last_arrival: vec![Instant::ZERO; n],
            ready_limit: buffer_packets.saturating_mul(n),
        }
    }

    pub(crate) fn buffered(&self) -> usize {
        self.ready.len() + self.chans.iter().map(|c| c.tentative.len()).sum::<usize>()
    }

    pub(crate) fn on_data(
        &mut self,
        now: Instant,
        channel: usize,
        payload: Bytes,
        wire_len: u32,
        limit: usize,
        stats: &mut Stats,
    ) {
        self.last_arrival[channel] = now;
        let cost = self.srr.cost_of(wire_len as usize);
        let q = self.srr.quantum(channel);
        let ch = &mut self.chans[channel];
        if !ch.synced {
            stats.lost += 1;
            return;
        }
        if ch.tentative.len() >= limit {
            // Cannot hold the segment: it can no longer be verified.
            stats.channels[channel].overflow_drops += 1;
            stats.lost += ch.tentative.len() as u64 + 1;
            ch.tentative.clear();
            ch.synced = false;
            return;
        }
        ch.digest = trigger::fold(ch.digest, trigger::fingerprint(wire_len as usize, &payload));
        ch.tentative.push((key(channel, ch.pos), payload));
        let hw = &mut stats.channels[channel].buffer_high_water;
        *hw = (*hw).max(ch.tentative.len() as u64);
        ch.pos.dc -= cost;
        if ch.pos.dc <= 0 {
            ch.pos.round += 1;
            ch.pos.dc += q;
            if ch.pos.dc <= 0 {
                ch.pos.dc = q;
            }
        }
        self.update_stall(now);
    }

    pub(crate) fn on_trigger(
        &mut self,
        now: Instant,
        channel: usize,
        t: &trigger::Repr,
        out: &mut VecDeque<Bytes>,
        stats: &mut Stats,
    ) {
        self.last_arrival[channel] = now;
        let ch = &mut self.chans[channel];
        let received = ch.tentative.len() as u64;
        let verified = ch.synced
            && ch.pos == t.position
            && ch.count + received == t.channel_count
            && ch.digest == t.digest;
        if verified {
            for (k, p) in ch.tentative.drain(..) {
                self.ready.insert(k, p);
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
        ch.pos = t.position;
        ch.count = t.channel_count;
        ch.digest = t.digest;
        ch.frontier = Some(key(channel, t.position));
        self.release(out, stats);
        // Memory bound: a channel that holds back too much verified data is left out.
        while self.ready.len() > self.ready_limit && self.leave_out_slowest(stats).is_some() {
            self.release(out, stats);
        }
        self.update_stall(now);
    }

    /// Deliver every verified packet that no channel can still precede.
    fn release(&mut self, out: &mut VecDeque<Bytes>, stats: &mut Stats) {
        let bound = self.chans.iter().filter_map(|c| c.frontier).min();
        while let Some(entry) = self.ready.first_entry() {
            if bound.is_some_and(|b| *entry.key() >= b) {
                break;
            }
            let (k, p) = entry.remove_entry();
            if self.last.is_some_and(|l| k <= l) {
                stats.lost += 1;
                continue;
            }
            self.last = Some(k);
            stats.delivered_packets += 1;
            stats.delivered_bytes += p.len() as u64;
            out.push_back(p);
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

    /// Due when verified data has waited `max_wait` and the channel holding it back has
    /// been silent for as long.
    pub(crate) fn poll_timeout(&self, max_wait: Duration) -> Option<Instant> {
        let since = self.stalled_since?;
        let quiet = self.slowest().map_or(since, |i| self.last_arrival[i]);
        Some(since.max(quiet) + max_wait)
    }

    /// Nothing more arrives: release every verified packet, drop unverified ones.
    pub(crate) fn drain(&mut self, out: &mut VecDeque<Bytes>, stats: &mut Stats) {
        for ch in &mut self.chans {
            stats.lost += ch.tentative.len() as u64;
            ch.tentative.clear();
            ch.synced = false;
            ch.frontier = None;
        }
        self.release(out, stats);
        self.stalled_since = None;
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

    /// Verified data has waited too long: leave out the channel that holds it back.
    pub(crate) fn handle_timeout(
        &mut self,
        now: Instant,
        out: &mut VecDeque<Bytes>,
        stats: &mut Stats,
    ) {
        if let Some(i) = self.leave_out_slowest(stats) {
            stats.channels[i].wait_timeouts += 1;
        }
        self.release(out, stats);
        self.stalled_since = None;
        self.update_stall(now);
    }
}
