//! Recovery from any pattern of outages (issue 26): both ends send, a seeded random
//! schedule cuts channels (one direction or both, one channel or all at once, for 50 ms
//! to 4 s) and restores them, with the tunnel's defaults (measured rates, adaptive
//! weights, pacing, delay equalization). Whenever a channel is up both ways, whatever
//! is sent from a second after the last change on is delivered both ways, each packet
//! within `LATE_MS`.
//!
//! Each of three defects failed this before its fix (seeds as they were then):
//! - a logical receiver that ran a round ahead of the sender (it gave up on a packet
//!   that was only late) lifted every later marker's channel to its own round, so it
//!   stayed ahead for good: every packet of a channel waited a whole round for the
//!   others' (seed 8, 264 of 435 packets over 300 ms late);
//! - heartbeat markers on the awaited channel kept its wait alive, so `max_wait`
//!   never ended a wait that was out of step (seed 10, a one-way stall of seconds);
//! - an epoch ack went out only on the receive set's channels: with those cut towards
//!   the peer, its switch waited for ever and nothing it sent was delivered, while
//!   every channel looked healthy (seed 38, one direction dead for good);
//! - with in-bond repair, a repair that came after its wait ran out went on "late" to
//!   whatever resequencer was current, though an epoch switch had passed on its
//!   channel meanwhile: the new `seq` epoch took its old, high number for its own and
//!   dropped every packet of its own as stale (seed 12, seq, one channel cut for 4 s:
//!   135 of 135 packets lost). Such stragglers are dropped now (`errctl::link`'s
//!   fence; `arq_drops_a_straggler_from_before_an_epoch_switch`), and the repair is
//!   asked for on a channel still heard, so here it comes in time.

use super::*;

/// A packet delivered later than this after it was sent counts as lost (the links
/// take at most 30 ms; max_wait is 200 ms).
const LATE_MS: u64 = 300;
/// Seeded schedules run per mode.
const SEEDS: u64 = 40;

/// xorshift64*: a seeded schedule.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) % n
    }
}

/// The tunnel's defaults for pacing: every channel measured, adaptive weights.
fn tunnel_defaults(c: &mut Config) {
    let mut p = PacingConfig::new(vec![0.0; c.channels.len()]);
    p.probe = true;
    c.pacing = Some(p);
    c.adaptive = true;
}

/// One step of the schedule: which directions of which channels are up, how long.
struct Step {
    ab: Vec<bool>,
    ba: Vec<bool>,
    ms: u64,
}

fn schedule(seed: u64, n: usize, steps: usize) -> Vec<Step> {
    let mut r = Rng(seed | 1);
    let mut v: Vec<Step> = (0..steps)
        .map(|_| {
            let (ab, ba) = match r.below(6) {
                0 => (vec![false; n], vec![false; n]),
                1 => (vec![true; n], vec![true; n]),
                // Some channels cut in one direction only.
                2 => ((0..n).map(|_| r.below(2) == 0).collect(), vec![true; n]),
                _ => {
                    let up: Vec<bool> = (0..n).map(|_| r.below(2) == 0).collect();
                    (up.clone(), up)
                }
            };
            let ms = [50, 200, 400, 1000, 2500, 4000][r.below(6) as usize];
            Step { ab, ba, ms }
        })
        .collect();
    v.push(Step {
        ab: vec![true; n],
        ba: vec![true; n],
        ms: 3000,
    });
    v
}

/// One direction's packets: when each was sent and when it was delivered.
#[derive(Default)]
struct Flow {
    sent: Vec<Instant>,
    got_at: std::collections::HashMap<u64, Instant>,
    seen: usize,
}

impl Flow {
    fn record(&mut self, delivered: &[u64], now: Instant, base: u64) {
        for id in &delivered[self.seen..] {
            self.got_at.insert(id - base, now);
        }
        self.seen = delivered.len();
    }

    /// Packets sent in `[from, to)` and not delivered within `LATE_MS`.
    fn late(&self, from: Instant, to: Instant) -> Vec<(u64, Instant)> {
        let late = Duration::from_millis(LATE_MS);
        self.sent
            .iter()
            .enumerate()
            .filter(|(_, &t)| t >= from && t < to)
            .map(|(i, &t)| (i as u64, t))
            .filter(|(i, t)| self.got_at.get(i).is_none_or(|&g| g - *t > late))
            .collect()
    }
}

fn recovers(mode: Mode, seed: u64) {
    const B_BASE: u64 = 1 << 40;
    let n = 2;
    let mut p = pair_with(n, mode, &[5, 30], tunnel_defaults);
    for (l, r) in [(0, 40e6), (1, 10e6)] {
        p.ab[l].rate_bps = r;
        p.ba[l].rate_bps = r;
    }
    p.every = Duration::ZERO;
    let every = Duration::from_millis(20);
    let (mut fa, mut fb) = (Flow::default(), Flow::default());
    let steps = schedule(seed, n, 40);
    for (k, s) in steps.iter().enumerate() {
        for c in 0..n {
            p.ab[c].up = s.ab[c];
            p.ba[c].up = s.ba[c];
            if !s.ab[c] {
                p.ab[c].queue.clear();
            }
            if !s.ba[c] {
                p.ba[c].queue.clear();
            }
        }
        let start = p.now;
        let end = start + Duration::from_millis(s.ms);
        while p.now < end {
            p.run_until((p.now + every).min(end));
            p.a.handle_packet(p.now, packet(fa.sent.len() as u64));
            fa.sent.push(p.now);
            p.b.handle_packet(p.now, packet(B_BASE + fb.sent.len() as u64));
            fb.sent.push(p.now);
            p.flush();
            fa.record(&p.delivered, p.now, 0);
            fb.record(&p.delivered_a, p.now, B_BASE);
        }
        // Every change may cut the channel in use (found only after `dead_after`), so
        // the second of grace runs from each step's start.
        if !(0..n).any(|c| s.ab[c] && s.ba[c]) {
            continue;
        }
        let from = start + Duration::from_millis(1000);
        let to = Instant::from_micros(end.as_micros().saturating_sub(LATE_MS * MS));
        for (dir, f) in [("A->B", &fa), ("B->A", &fb)] {
            let late = f.late(from, to);
            assert!(
                late.is_empty(),
                "{mode:?}, seed {seed}, step {k} ({} ms from {start:?}, a->b up {:?}, \
                 b->a up {:?}): {dir}: {} packets sent from {from:?} on were lost or \
                 later than {LATE_MS} ms, the first sent at {:?}",
                s.ms,
                s.ab,
                s.ba,
                late.len(),
                late[0].1,
            );
        }
    }
    p.assert_no_duplicates();
    if mode != Mode::Logical {
        // Seq and TRR never deliver out of order.
        assert!(p.delivered.windows(2).all(|w| w[0] < w[1]), "{mode:?}");
    }
}

#[test]
fn datagrams_queued_through_an_outage_do_not_skew_the_equalizer() {
    // Every link's carrier goes off for 1.5 s; what is sent meanwhile waits in a queue
    // in front of it (a qdisc), tail-dropped beyond a few datagrams that differ per
    // link, and goes out when the carrier comes back. The markers of a batch are then
    // spread over the outage: one sent just before the cut came at once, its batch
    // mates 1.5 s later. Taken as a skew, that held every other channel's datagrams for
    // 1.5 s (a ping stall of 1.5 s in the chaos run).
    let mut p = pair_with(3, Mode::Logical, &[5, 20, 40], tunnel_defaults);
    for (l, r) in [(0, 20e6), (1, 50e6), (2, 100e6)] {
        p.ab[l].rate_bps = r;
        p.ba[l].rate_bps = r;
    }
    p.every = Duration::from_millis(2);
    p.run_until(at_ms(3000));
    for (c, limit) in [(0, 3), (1, 8), (2, 20)] {
        p.pause(c, limit);
    }
    p.run_until(at_ms(4500));
    for c in 0..3 {
        p.resume(c);
    }
    let from = p.delivered_at.len();
    p.run_until(at_ms(7000));
    // Packets sent from 300 ms after the links came back are delivered within the
    // slowest link's delay and a margin.
    let sent_from = 4800 / 2;
    let worst = p.delivered[from..]
        .iter()
        .zip(&p.delivered_at[from..])
        .filter(|(&id, _)| id >= sent_from)
        .map(|(&id, &at)| at - at_ms(id * 2))
        .max()
        .unwrap();
    assert!(
        worst < Duration::from_millis(120),
        "a packet took {worst:?} after the links came back"
    );
}

#[test]
fn traffic_flows_both_ways_within_a_second_of_a_path_coming_back() {
    for mode in [Mode::Logical, Mode::Seq, Mode::Trr] {
        for seed in 1..=SEEDS {
            recovers(mode, seed);
        }
    }
}
