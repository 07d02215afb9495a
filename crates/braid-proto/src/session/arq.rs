//! In-bond repair of lost datagrams, per channel, below the resequencer ("link ARQ").
//!
//! Every sealed datagram carries its channel's sealing counter (`wire::secure`): on one
//! channel the counters go up by one, whatever the datagram is (data, marker, hello).
//! A gap in them is a datagram the channel lost. With repair on:
//!
//! * the **sender** keeps its last sealed datagrams per channel, as they went out
//!   ([`TxRing`]);
//! * the **receiver** ([`RxChan`]) holds what arrives on a channel behind a gap, asks
//!   for the missing counters on every channel that is up (a `Resend` session message,
//!   repeated while it waits), and releases the channel's datagrams in counter order as
//!   soon as the gap is filled, or when its wait runs out (then the datagram is lost,
//!   as without repair);
//! * the sender answers by sending the **same sealed bytes** again on its fastest
//!   channel. They are not re-sealed and not wrapped, so a repair is no larger than the
//!   original and needs no room in the MTU. The receiver recognises one when it fails
//!   to open on the channel it came in on but carries a counter it is missing on
//!   another: the channel index is in the AEAD nonce, so it opens there and nowhere else.
//!
//! Because the hole is filled before the datagram reaches the resequencer, this works
//! the same in every mode: logical reception sees its channel's FIFO stream intact (no
//! resync, no misordering), `seq` and `trr` see no loss. It hides random loss from the
//! traffic inside; congestion stays visible through the AQM (`crate::aqm`), which is
//! why the two go together (`docs/tunnel.md`).

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;

use crate::time::{Duration, Instant};
use crate::wire::secure;

/// In-bond repair settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArqConfig {
    /// How long the receiver holds a channel's later datagrams for a missing one before
    /// giving it up.
    pub wait: Duration,
}

impl Default for ArqConfig {
    /// A 200 ms wait: about the slowest channel's round trip plus time to ask twice
    /// more (100 ms gave up more congestion drops in the lab: `docs/lab.md`).
    fn default() -> Self {
        ArqConfig {
            wait: Duration::from_millis(200),
        }
    }
}

/// A gap wider than this is not waited for (a channel that was down, a peer that
/// restarted): the datagrams after it go through at once.
pub(super) const MAX_GAP: u64 = 256;
/// Most datagrams held per channel; beyond, the oldest gap is given up.
const HOLD_MAX: usize = 8192;
/// Most datagrams the sender keeps per channel, and for how long.
const RING_MAX: usize = 8192;
const RING_AGE: Duration = Duration::from_secs(1);

/// The counters of a sealed datagram: (key index, counter), if it is one.
pub(super) fn sealed_id(d: &[u8]) -> Option<(u32, u64)> {
    let h = secure::Header::parse(d).ok()?;
    Some((h.index, h.counter))
}

/// A request repeated within this long of an answer is not answered again (the
/// answer is on its way).
const RESEND_HOLDOFF: Duration = Duration::from_millis(10);

/// The sender's copies of what it sealed on one channel: when, key index, counter,
/// bytes, and when last sent again.
#[derive(Default)]
pub(super) struct TxRing {
    items: VecDeque<(Instant, u32, u64, Bytes, Option<Instant>)>,
}

impl TxRing {
    pub fn push(&mut self, now: Instant, sealed: &Bytes) {
        let Some((key, counter)) = sealed_id(sealed) else {
            return;
        };
        while self.items.len() >= RING_MAX
            || self
                .items
                .front()
                .is_some_and(|(t, ..)| now.saturating_since(*t) > RING_AGE)
        {
            self.items.pop_front();
        }
        self.items
            .push_back((now, key, counter, sealed.clone(), None));
    }

    /// The datagram sealed with key `key` (as its header names it) and `counter`, to
    /// send again at `now`, unless it was sent again only just now.
    pub fn take_for_resend(&mut self, now: Instant, key: u32, counter: u64) -> Option<Bytes> {
        let (_, _, _, b, resent) = self
            .items
            .iter_mut()
            .rev()
            .find(|(_, k, c, ..)| *k == key && *c == counter)?;
        if resent.is_some_and(|t| now.saturating_since(t) < RESEND_HOLDOFF) {
            return None;
        }
        *resent = Some(now);
        Some(b.clone())
    }
}

#[derive(Clone, Copy, Debug)]
struct Miss {
    /// When the gap was seen: the datagram's arrival time, had it not been lost (its
    /// successor's), which the delay equalizer uses once it is repaired.
    seen: Instant,
    deadline: Instant,
    ask_at: Instant,
}

/// Repair counters of one channel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArqChannelStats {
    /// Datagrams found missing (gaps in the sealing counter).
    pub missing: u64,
    /// Of those, filled by a repair.
    pub repaired: u64,
    /// Of those, given up after the wait (lost for good).
    pub given_up: u64,
    /// Gaps too wide to wait for (counted once each).
    pub skipped_gaps: u64,
    /// Resend requests sent for this channel's datagrams.
    pub requests: u64,
    /// Datagrams of this channel we sent again for the peer.
    pub resent: u64,
}

/// The receiver's view of one channel.
#[derive(Default)]
pub(super) struct RxChan {
    /// Key index being followed, and the one before (datagrams still in flight under
    /// it go straight through).
    key: Option<u32>,
    prev_key: Option<u32>,
    /// One past the highest counter seen under `key`.
    next: u64,
    /// Datagrams waiting behind a gap, with their arrival times.
    held: BTreeMap<u64, (Bytes, Instant)>,
    missing: BTreeMap<u64, Miss>,
    pub stats: ArqChannelStats,
}

impl RxChan {
    /// Is `counter` under `key` one we are waiting for?
    pub fn is_missing(&self, key: u32, counter: u64) -> bool {
        self.key == Some(key) && self.missing.contains_key(&counter)
    }

    /// An authenticated datagram `inner` (sealed under `key` with `counter`) arrived at
    /// `now`. What can go on, in order, is appended to `out` with its arrival time (a
    /// repaired datagram: when its gap was seen). With `urgent`, `inner` goes on at
    /// once whatever waits before it (control that needs no order: hellos, feedback,
    /// requests; held behind a gap, a resend request would wait for its own repair).
    #[allow(clippy::too_many_arguments)]
    pub fn accept(
        &mut self,
        now: Instant,
        wait: Duration,
        key: u32,
        counter: u64,
        inner: Bytes,
        urgent: bool,
        out: &mut Vec<(Bytes, Instant)>,
    ) {
        if urgent && self.key == Some(key) && counter < self.next {
            if self.missing.remove(&counter).is_some() {
                self.stats.repaired += 1;
            }
            out.push((inner, now));
            self.release(now, out);
            return;
        }
        if urgent && self.key == Some(key) && counter >= self.next && counter - self.next <= MAX_GAP
        {
            self.open_gap(now, wait, counter);
            out.push((inner, now));
            return;
        }
        if self.key != Some(key) {
            if self.prev_key == Some(key) {
                out.push((inner, now)); // late, under the keys before: as it comes
                return;
            }
            // New keys: their counters start at 0. What waits under the old ones goes.
            self.give_up_all(out);
            self.prev_key = self.key;
            self.key = Some(key);
            self.next = 0;
        }
        if counter < self.next {
            if let Some(m) = self.missing.remove(&counter) {
                self.stats.repaired += 1;
                self.held.insert(counter, (inner, m.seen));
                self.release(now, out);
            } else {
                // Given up already (or never waited for): late, but deliver it.
                out.push((inner, now));
            }
            return;
        }
        let gap = counter - self.next;
        if gap == 0 && self.missing.is_empty() {
            self.next = counter + 1;
            out.push((inner, now));
            return;
        }
        if gap > MAX_GAP {
            self.stats.skipped_gaps += 1;
            self.give_up_all(out);
            self.next = counter + 1;
            out.push((inner, now));
            return;
        }
        self.open_gap(now, wait, counter);
        self.held.insert(counter, (inner, now));
        if self.held.len() > HOLD_MAX && self.missing.pop_first().is_some() {
            self.stats.given_up += 1;
        }
        self.release(now, out);
    }

    /// `counter` arrived at `now`: every counter from `next` up to it is missing.
    fn open_gap(&mut self, now: Instant, wait: Duration, counter: u64) {
        for k in self.next..counter {
            self.stats.missing += 1;
            self.missing.insert(
                k,
                Miss {
                    seen: now,
                    deadline: now + wait,
                    ask_at: now,
                },
            );
        }
        self.next = counter + 1;
    }

    fn give_up_all(&mut self, out: &mut Vec<(Bytes, Instant)>) {
        self.stats.given_up += self.missing.len() as u64;
        self.missing.clear();
        out.extend(std::mem::take(&mut self.held).into_values());
    }

    /// Give up what waited too long; append what can go on to `out`.
    pub fn release(&mut self, now: Instant, out: &mut Vec<(Bytes, Instant)>) {
        let before = self.missing.len();
        self.missing.retain(|_, m| m.deadline > now);
        self.stats.given_up += (before - self.missing.len()) as u64;
        let bound = self.missing.keys().next().copied().unwrap_or(u64::MAX);
        while let Some(e) = self.held.first_entry() {
            if *e.key() >= bound {
                break;
            }
            out.push(e.remove());
        }
    }

    /// Counters to ask for now (at most `max` per request), each asked again
    /// `every` later while still missing: `(key, counters)`.
    pub fn requests(&mut self, now: Instant, every: Duration, max: usize) -> Vec<(u32, Vec<u64>)> {
        let Some(key) = self.key else {
            return Vec::new();
        };
        let mut due = Vec::new();
        for (k, m) in self.missing.iter_mut() {
            if m.ask_at <= now {
                m.ask_at = now + every;
                due.push(*k);
            }
        }
        due.chunks(max.max(1))
            .map(|c| {
                self.stats.requests += 1;
                (key, c.to_vec())
            })
            .collect()
    }

    /// The next deadline or request time.
    pub fn next_timeout(&self) -> Option<Instant> {
        self.missing
            .values()
            .map(|m| m.deadline.min(m.ask_at))
            .min()
    }

    /// Datagrams held.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(x: u8) -> Bytes {
        Bytes::from(vec![x])
    }
    fn bytes(out: &[(Bytes, Instant)]) -> Vec<Bytes> {
        out.iter().map(|(b, _)| b.clone()).collect()
    }
    fn ms(x: u64) -> Instant {
        Instant::from_micros(x * 1000)
    }
    const W: Duration = Duration::from_millis(100);

    #[test]
    fn in_order_goes_straight_through() {
        let mut r = RxChan::default();
        let mut out = vec![];
        for k in 0..5 {
            r.accept(ms(k), W, 7, k, b(k as u8), false, &mut out);
        }
        assert_eq!(bytes(&out), (0..5).map(b).collect::<Vec<_>>());
        assert_eq!(r.stats, ArqChannelStats::default());
    }

    #[test]
    fn a_gap_holds_later_datagrams_until_repaired_then_releases_in_order() {
        let mut r = RxChan::default();
        let mut out = vec![];
        r.accept(ms(0), W, 7, 0, b(0), false, &mut out);
        r.accept(ms(1), W, 7, 3, b(3), false, &mut out); // 1, 2 missing
        r.accept(ms(2), W, 7, 4, b(4), false, &mut out);
        assert_eq!(bytes(&out), vec![b(0)]);
        assert!(r.is_missing(7, 1) && r.is_missing(7, 2));
        assert!(!r.is_missing(8, 1));
        let req = r.requests(ms(2), Duration::from_millis(20), 32);
        assert_eq!(req, vec![(7, vec![1, 2])]);
        assert!(r.requests(ms(10), Duration::from_millis(20), 32).is_empty());
        assert_eq!(
            r.requests(ms(22), Duration::from_millis(20), 32),
            vec![(7, vec![1, 2])]
        );
        r.accept(ms(30), W, 7, 2, b(2), false, &mut out);
        assert_eq!(bytes(&out), vec![b(0)], "1 still missing");
        r.accept(ms(31), W, 7, 1, b(1), false, &mut out);
        assert_eq!(bytes(&out), (0..5).map(b).collect::<Vec<_>>());
        // The repaired ones count as arrived when their gap was seen; the held ones
        // when they came.
        let at: Vec<Instant> = out.iter().map(|(_, t)| *t).collect();
        assert_eq!(at, vec![ms(0), ms(1), ms(1), ms(1), ms(2)]);
        assert_eq!(r.stats.missing, 2);
        assert_eq!(r.stats.repaired, 2);
        assert_eq!(r.held(), 0);
    }

    #[test]
    fn a_datagram_not_repaired_in_time_is_given_up() {
        let mut r = RxChan::default();
        let mut out = vec![];
        r.accept(ms(0), W, 7, 0, b(0), false, &mut out);
        r.accept(ms(1), W, 7, 2, b(2), false, &mut out);
        assert_eq!(r.next_timeout(), Some(ms(1)));
        r.requests(ms(1), Duration::from_millis(20), 32);
        r.release(ms(100), &mut out);
        assert_eq!(bytes(&out), vec![b(0)]);
        r.release(ms(101), &mut out);
        assert_eq!(bytes(&out), vec![b(0), b(2)]);
        assert_eq!(r.stats.given_up, 1);
        // It turns up after all: delivered late rather than dropped.
        r.accept(ms(150), W, 7, 1, b(1), false, &mut out);
        assert_eq!(bytes(&out), vec![b(0), b(2), b(1)]);
    }

    #[test]
    fn urgent_control_is_not_held_but_fills_or_opens_gaps() {
        let mut r = RxChan::default();
        let mut out = vec![];
        r.accept(ms(0), W, 7, 0, b(0), false, &mut out);
        r.accept(ms(1), W, 7, 2, b(2), false, &mut out); // 1 missing, 2 held
        r.accept(ms(2), W, 7, 4, b(4), true, &mut out); // urgent: through; 3 missing
        assert_eq!(bytes(&out), vec![b(0), b(4)]);
        assert!(r.is_missing(7, 1) && r.is_missing(7, 3));
        r.accept(ms(3), W, 7, 1, b(1), true, &mut out); // urgent repair of 1
        assert_eq!(bytes(&out), vec![b(0), b(4), b(1), b(2)]);
        r.accept(ms(4), W, 7, 3, b(3), false, &mut out);
        assert_eq!(bytes(&out), vec![b(0), b(4), b(1), b(2), b(3)]);
        assert_eq!(r.stats.missing, 2);
        assert_eq!(r.stats.repaired, 2);
    }

    #[test]
    fn wide_gaps_and_new_keys_are_not_waited_for() {
        let mut r = RxChan::default();
        let mut out = vec![];
        r.accept(ms(0), W, 7, 0, b(0), false, &mut out);
        r.accept(ms(1), W, 7, 2 + MAX_GAP, b(1), false, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(r.stats.skipped_gaps, 1);
        assert_eq!(r.next_timeout(), None);
        // New keys: counters start over; the old ones still in flight pass.
        r.accept(ms(2), W, 7, 5 + MAX_GAP, b(2), false, &mut out); // gap of 2 under key 7
        assert_eq!(out.len(), 2);
        r.accept(ms(3), W, 9, 0, b(3), false, &mut out);
        assert_eq!(out.len(), 4, "held datagram released when the keys change");
        r.accept(ms(4), W, 7, 3 + MAX_GAP, b(4), false, &mut out);
        assert_eq!(out.len(), 5);
        r.accept(ms(5), W, 9, 1, b(5), false, &mut out);
        assert_eq!(out.len(), 6);
    }

    #[test]
    fn ring_finds_by_key_and_counter_and_forgets_old() {
        let mut t = TxRing::default();
        let sealed = |key: u32, c: u64| {
            let mut v = vec![0xB8, 1, 0, 0];
            v.extend_from_slice(&key.to_be_bytes());
            v.extend_from_slice(&c.to_be_bytes());
            v.extend_from_slice(&[0; 20]);
            Bytes::from(v)
        };
        t.push(ms(0), &sealed(1, 0));
        t.push(ms(1), &sealed(1, 1));
        t.push(ms(2), &sealed(2, 0));
        assert_eq!(t.take_for_resend(ms(3), 1, 1), Some(sealed(1, 1)));
        assert_eq!(t.take_for_resend(ms(3), 2, 0), Some(sealed(2, 0)));
        assert_eq!(t.take_for_resend(ms(3), 2, 1), None);
        // Asked again within the hold-off: not sent again yet.
        assert!(t.take_for_resend(ms(5), 1, 1).is_none());
        assert!(t.take_for_resend(ms(14), 1, 1).is_some());
        t.push(ms(1500), &sealed(2, 1));
        assert_eq!(
            t.take_for_resend(ms(1500), 1, 0),
            None,
            "older than a second"
        );
        t.push(ms(1500), &Bytes::from_static(b"not sealed"));
        assert_eq!(t.items.len(), 1);
    }
}
