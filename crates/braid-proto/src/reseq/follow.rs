//! The receiver's copy of the sender's scheduler (logical reception, seed 000 §4–5).
//!
//! [`Follower`] answers one question: which channel's buffer holds the next packet in
//! sender order? It applies markers found at the head of a channel buffer, and enforces
//! the two conditions of §5: C2 (visit channels in the sender's order, guaranteed by
//! sharing the channel numbering) and C1 (never deliver a higher round before a lower
//! one: a channel whose next round `r_c` is above the global round `G` is skipped).

use std::collections::VecDeque;

use super::Item;
use crate::sched::{Position, RandomFq, Sched, Srr};
use crate::stats::Stats;

pub(crate) enum Follower {
    Srr(Srr),
    Random {
        rfq: RandomFq,
        /// Global index `G` of the next packet to deliver.
        g: u64,
        /// Lowest index the next packet on each channel can have.
        next: Vec<u64>,
    },
}

impl Follower {
    pub(crate) fn new(sched: Sched) -> Follower {
        match sched {
            Sched::Srr(s) => Follower::Srr(s),
            Sched::Random(rfq) => {
                let n = rfq.channels();
                Follower::Random {
                    rfq,
                    g: 0,
                    next: vec![0; n],
                }
            }
        }
    }

    /// Adopt a marker's number for `channel`, and its quantum if it announces one (the
    /// sender adds it from the next end of a visit on; so do we). Returns true if the
    /// position changed.
    pub(crate) fn apply_marker(
        &mut self,
        channel: usize,
        pos: Position,
        quantum: Option<u32>,
    ) -> bool {
        match self {
            Follower::Srr(s) => {
                let changed = s.position(channel) != pos;
                s.set_position(channel, pos);
                if let Some(q) = quantum {
                    s.set_quantum(channel, q);
                }
                changed
            }
            Follower::Random { next, .. } => {
                let changed = next[channel] != pos.round;
                next[channel] = pos.round;
                changed
            }
        }
    }

    /// The channel whose buffer should hold the next packet in sender order. Markers at
    /// the heads of the channels it passes are consumed and applied (counted as resyncs
    /// when they change the state); channels that are ahead (C1) are skipped.
    pub(crate) fn expected(&mut self, bufs: &mut [VecDeque<Item>], stats: &mut Stats) -> usize {
        let n = bufs.len();
        let mut skips = 0usize;
        loop {
            let c = match self {
                Follower::Srr(s) => s.select(),
                Follower::Random { rfq, g, .. } => rfq.channel_of(*g),
            };
            self.take_markers(c, &mut bufs[c], stats);
            let ahead = match self {
                Follower::Srr(s) => srr_skips(s, c, n, &mut skips),
                Follower::Random { g, next, .. } => random_skips(g, next, c, n, &mut skips),
            };
            if !ahead {
                return c;
            }
        }
    }

    /// Consumes and applies the markers at the head of channel `c`'s buffer `buf`,
    /// counting a resync for each that changes the state.
    fn take_markers(&mut self, c: usize, buf: &mut VecDeque<Item>, stats: &mut Stats) {
        while let Some(&Item::Marker {
            position: pos,
            quantum,
            ..
        }) = buf.front()
        {
            buf.pop_front();
            if self.apply_marker(c, pos, quantum) {
                stats.channels[c].resyncs += 1;
            }
        }
    }

    /// A packet of `wire_len` bytes was taken from `channel` as the expected one.
    #[inline]
    pub(crate) fn delivered(&mut self, channel: usize, wire_len: usize) {
        match self {
            Follower::Srr(s) => {
                let cost = s.cost_of(wire_len);
                s.consume(channel, cost);
            }
            Follower::Random { g, next, .. } => {
                next[channel] = g.saturating_add(1);
                *g = g.saturating_add(1);
            }
        }
    }

    /// Every empty channel is presumed lost up to where data waits (the receiver is
    /// draining, or a full buffer forced progress): move the empty channels, and the
    /// global position, straight to the lowest position that holds data. Giving them up
    /// one round at a time would cost one loop per round, and a marker that names a round
    /// far ahead (forged, or after a long outage) would stall the receiver for as long.
    pub(crate) fn skip_empty_to_data(&mut self, bufs: &[VecDeque<Item>]) {
        let has_data = |c: &usize| !bufs[*c].is_empty();
        let n = bufs.len();
        match self {
            Follower::Srr(s) => {
                let Some(min) = (0..n).filter(has_data).map(|c| s.position(c).round).min() else {
                    return;
                };
                for e in (0..n).filter(|c| bufs[*c].is_empty()) {
                    if s.position(e).round < min {
                        let dc = s.quantum(e);
                        s.set_position(e, Position { round: min, dc });
                    }
                }
                if s.round() < min {
                    s.jump_to_round(min);
                }
            }
            Follower::Random { g, next, .. } => {
                let Some(min) = (0..n).filter(has_data).map(|c| next[c]).min() else {
                    return;
                };
                for e in (0..n).filter(|c| bufs[*c].is_empty()) {
                    next[e] = next[e].max(min);
                }
                *g = (*g).max(min);
            }
        }
    }

    /// Give up on the packet expected on `channel` (it is presumed lost): end the
    /// visit and move on.
    pub(crate) fn give_up(&mut self, channel: usize) {
        match self {
            Follower::Srr(s) => {
                let q = s.quantum(channel);
                let r = s.round();
                s.set_position(
                    channel,
                    Position {
                        round: r.saturating_add(1),
                        dc: q,
                    },
                );
                if s.select() == channel {
                    s.advance();
                }
            }
            Follower::Random { g, next, .. } => {
                next[channel] = g.saturating_add(1);
                *g = g.saturating_add(1);
            }
        }
    }
}

/// SRR following, at channel `c` (of `n`) as the scheduler selects it: whether `c` is
/// ahead of the global round (C1), so the scheduler moved past it (after `n` skips in
/// a row, every channel is ahead: the round jumps to the lowest); else `c` is the
/// expected channel, the scheduler rewound to its round if it was below.
fn srr_skips(s: &mut Srr, c: usize, n: usize, skips: &mut usize) -> bool {
    let p = s.position(c);
    let g = s.round();
    if p.round > g {
        s.advance();
        *skips += 1;
        if *skips >= n {
            // A full scan found every channel ahead: jump to the lowest.
            let min = (0..n).map(|i| s.position(i).round).min().unwrap_or(g);
            if min > s.round() {
                s.jump_to_round(min);
            }
            *skips = 0;
        }
        return true;
    }
    if p.round < g {
        // Only a marker puts a channel below the global round: the sender's channel
        // rounds are never below its own (the visited channel and those after it are
        // at the global round, those before it one above). So the sender is still in
        // round `p.round` here and we ran ahead of it (we gave up on packets that were
        // only late, or skipped past a channel whose round a loss hid). Go back to that
        // round at this channel. (Lifting the channel to our round instead kept us a
        // round ahead for good: every later marker was undone, and each of this
        // channel's packets waited a whole round for the others'.)
        s.rewind(p.round, c);
    }
    false
}

/// Random fair queueing following, at channel `c` (of `n`) for global index `g`:
/// whether `c`'s next packet is above `g`, so `g` moves on (after more than `n` skips
/// in a row, to the lowest next index); else `c` is the expected channel.
fn random_skips(g: &mut u64, next: &[u64], c: usize, n: usize, skips: &mut usize) -> bool {
    if next[c] > *g {
        *g = g.saturating_add(1);
        *skips += 1;
        if *skips > n {
            let min = next.iter().copied().min().unwrap_or(*g);
            *g = (*g).max(min);
            *skips = 0;
        }
        return true;
    }
    false
}
