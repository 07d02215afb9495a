//! Error control inside the bond: the in-bond profile of this module ("link ARQ").
//!
//! The tunnel repairs what its channels lose with the same scheme as the application
//! profile ([`super::Sender`], [`super::Receiver`]), cut down to what a bond's channel
//! needs, and below the resequencer so that every striping mode profits:
//!
//! | seed 002 | here |
//! |---|---|
//! | tolerance (W, E, B) | (W, 0, 0) per channel: every loss is repaired, within the deadline |
//! | shipment sequence number | the channel's sealing counter (`wire::secure`): one per datagram, data or control, new numbers for nothing else, so **no header is added** |
//! | gap detection | a counter above the next expected one (a channel is FIFO: reorder distance 0) |
//! | loss timer, SNAK repeated every interval | [`LinkReceiver::requests`]: the missing counters, asked for again while missing |
//! | selective retransmission from the sender's buffer | [`LinkSender::take_for_resend`]: the same sealed bytes, once per round trip of the repair path (the premature-request filter, [`super::premature`]) |
//! | requests for packets never sent are rejected and counted | the same ([`ArqChannelStats::rejected`]) |
//! | deadline, then the packet is given up | [`ArqConfig::wait`]; counted ([`ArqChannelStats::given_up`]) |
//! | PACK | none: the sender's buffer is bounded by age and count instead (a channel carries hundreds of thousands of datagrams a second; acknowledging them would cost more than it saves) |
//!
//! How the session uses it (`session::Session`, with `arq` set):
//!
//! * the **sender** keeps its last sealed datagrams per channel, as they went out
//!   ([`LinkSender`]);
//! * the **receiver** ([`LinkReceiver`]) holds what arrives on a channel behind a gap,
//!   asks for the missing counters on the fastest other channel that is up and heard
//!   lately (a `Resend` session message, `wire::session`), and releases the channel's
//!   datagrams in counter order as soon as the gap is filled, or when the wait runs
//!   out (then the datagram is lost, as without repair);
//! * the sender answers on the channel where the repair arrives first (its round trip
//!   and its pacer's debt) with the **same sealed bytes**: not
//!   re-sealed and not wrapped, so a repair is no larger than the original and needs no
//!   room in the MTU. The receiver recognises one when it fails to open on the channel
//!   it came in on but carries a counter it is missing on another: the channel index is
//!   in the AEAD nonce, so it opens there and nowhere else.
//!
//! Because the hole is filled before the datagram reaches the resequencer, this works
//! the same in every mode: logical reception sees its channel's FIFO stream intact (no
//! resync, no misordering), `seq` and `trr` see no loss. It hides random loss from the
//! traffic inside; congestion stays visible through the AQM (`crate::aqm`), which is
//! why the two go together (`docs/tunnel.md`).

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;

use crate::time::{Duration, Instant};

/// In-bond repair settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArqConfig {
    /// How long the receiver holds a channel's later datagrams for a missing one before
    /// giving it up (the deadline).
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
pub const MAX_GAP: u64 = 256;
/// Most datagrams held per channel; beyond, the oldest gap is given up.
const HOLD_MAX: usize = 8192;
/// Most datagrams the sender keeps per channel, and for how long.
const RING_MAX: usize = 8192;
const RING_AGE: Duration = Duration::from_secs(1);

/// Why a requested datagram is not sent again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotResent {
    /// Its last copy left less than a round trip of the repair path ago: the request
    /// cannot have seen it (counted in [`ArqChannelStats::premature`]).
    Premature,
    /// No longer kept (older than the buffer): counted in [`ArqChannelStats::expired`].
    Expired,
    /// Never sent: a counter above the highest sealed under that key, or a key never
    /// used. Counted in [`ArqChannelStats::rejected`]; a peer asking for it is broken or
    /// hostile, and is not answered.
    Rejected,
}

/// The sender's copies of what it sealed on one channel: when, key index, counter,
/// bytes, and when last sent again.
#[derive(Default)]
pub struct LinkSender {
    items: VecDeque<(Instant, u32, u64, Bytes, Option<Instant>)>,
    /// The most `items` held lately: a second's worth of a busy channel is given back
    /// once it idles (a server's idle peers each kept the room of their first seconds,
    /// 3-4 KiB per channel, for good).
    room: crate::room::Room,
    /// Highest counter sealed per key index (the current and the one before).
    highest: [(u32, Option<u64>); 2],
    /// Sender-side counters (the receiver-side ones stay zero).
    pub stats: ArqChannelStats,
}

impl LinkSender {
    /// Keep `sealed`, sealed at `now` under key `key` with `counter`.
    pub fn push(&mut self, now: Instant, key: u32, counter: u64, sealed: &Bytes) {
        self.sealed(now, key, counter);
        self.items
            .push_back((now, key, counter, sealed.clone(), None));
        self.room.note(self.items.len());
        if let Some(keep) = self.room.check(now, self.items.capacity()) {
            self.items.shrink_to(keep);
        }
    }

    /// A datagram sealed at `now` under key `key` with `counter` that is not kept (a
    /// request for it is answered as for one no longer kept, [`NotResent::Expired`]):
    /// one whose repair the receiver would not use, such as a capacity probe's.
    pub fn sealed_unkept(&mut self, now: Instant, key: u32, counter: u64) {
        self.sealed(now, key, counter);
    }

    /// Bytes of the datagrams kept.
    pub fn kept_bytes(&self) -> usize {
        self.items.iter().map(|(.., b, _)| b.len()).sum()
    }

    /// Forget what is too old (or too many), and note `counter` as sealed under `key`.
    fn sealed(&mut self, now: Instant, key: u32, counter: u64) {
        while self.items.len() >= RING_MAX
            || self
                .items
                .front()
                .is_some_and(|(t, ..)| now.saturating_since(*t) > RING_AGE)
        {
            self.items.pop_front();
        }
        match self
            .highest
            .iter_mut()
            .find(|(k, h)| *k == key && h.is_some())
        {
            Some((_, h)) => *h = Some(h.unwrap_or(0).max(counter)),
            None => {
                self.highest[1] = self.highest[0];
                self.highest[0] = (key, Some(counter));
            }
        }
    }

    /// The length of the datagram sealed with key `key` and `counter`, if it is kept.
    pub fn len_of(&self, key: u32, counter: u64) -> Option<usize> {
        self.items
            .iter()
            .rev()
            .find(|(_, k, c, ..)| *k == key && *c == counter)
            .map(|(_, _, _, b, _)| b.len())
    }

    /// The datagram sealed with key `key` and `counter`, to send again at `now`, unless
    /// a repair of it left less than `rtt` ago (the round trip of the path the repair
    /// takes) or it is not (or no longer) kept. Counted either way. The first request
    /// is always answered, however soon after the original: the receiver asks only for
    /// a gap, and a gap on a FIFO channel is a loss (its channel may be much faster than
    /// the repair path, so its loss is known well within the repair path's round trip).
    pub fn take_for_resend(
        &mut self,
        now: Instant,
        key: u32,
        counter: u64,
        rtt: Duration,
    ) -> Result<Bytes, NotResent> {
        let sent = self
            .highest
            .iter()
            .any(|&(k, h)| k == key && h.is_some_and(|h| counter <= h));
        if !sent {
            self.stats.rejected += 1;
            return Err(NotResent::Rejected);
        }
        let Some((_, _, _, b, resent)) = self
            .items
            .iter_mut()
            .rev()
            .find(|(_, k, c, ..)| *k == key && *c == counter)
        else {
            self.stats.expired += 1;
            return Err(NotResent::Expired);
        };
        if resent.is_some_and(|r| super::premature(r, now, rtt)) {
            self.stats.premature += 1;
            return Err(NotResent::Premature);
        }
        *resent = Some(now);
        self.stats.resent += 1;
        Ok(b.clone())
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
    /// Requests of the peer for this channel not answered because the last copy had
    /// left less than a round trip of the repair path before (the answer is on its way).
    pub premature: u64,
    /// Requests for datagrams no longer kept.
    pub expired: u64,
    /// Requests for datagrams never sent (rejected; a broken or hostile peer).
    pub rejected: u64,
    /// Datagrams that came after their counter was given up (or under the keys
    /// before) and were sealed before the channel's last epoch end
    /// ([`LinkReceiver::fence`]): dropped, since the new epoch's resequencer would take
    /// the old epoch's numbers for its own.
    pub stale: u64,
}

impl ArqChannelStats {
    /// Receiver-side and sender-side counters of one channel together (each side
    /// fills its own fields).
    pub fn merged(&self, tx: &ArqChannelStats) -> ArqChannelStats {
        ArqChannelStats {
            resent: self.resent + tx.resent,
            premature: self.premature + tx.premature,
            expired: self.expired + tx.expired,
            rejected: self.rejected + tx.rejected,
            ..*self
        }
    }
}

/// The receiver's view of one channel: gap detection, held datagrams, requests.
#[derive(Default)]
pub struct LinkReceiver {
    /// Key index being followed, and the one before (datagrams still in flight under
    /// it go straight through).
    key: Option<u32>,
    prev_key: Option<u32>,
    /// One past the highest counter seen under `key`.
    next: u64,
    /// Datagrams waiting behind a gap, with their arrival times.
    held: BTreeMap<u64, (Bytes, Instant)>,
    missing: BTreeMap<u64, Miss>,
    /// The key index and counter of the last epoch end on this channel: what was
    /// sealed before it belongs to an epoch that ended here.
    fence: Option<(u32, u64)>,
    /// Receiver-side counters (the sender-side ones stay zero).
    pub stats: ArqChannelStats,
}

impl LinkReceiver {
    /// Is `counter` under `key` one we are waiting for?
    pub fn is_missing(&self, key: u32, counter: u64) -> bool {
        self.key == Some(key) && self.missing.contains_key(&counter)
    }

    /// An epoch end sealed under `key` with `counter` arrived on this channel.
    ///
    /// What was sealed before it and is still held or missing goes on in counter
    /// order, before the end, as a FIFO channel would have carried it. But a datagram
    /// that comes after its counter was given up (a repair or a straggler past the
    /// wait), or under the keys before, goes on as it comes, out of order: once the end
    /// is passed, it would reach the next epoch's resequencer, which takes its number
    /// for one of its own (in `seq` mode, a number far ahead: every packet of the new
    /// epoch then looks stale). Such a datagram is dropped and counted
    /// ([`ArqChannelStats::stale`]).
    pub fn fence(&mut self, key: u32, counter: u64) {
        match self.fence {
            Some((k, c)) if k == key && c >= counter => {}
            Some((k, _)) if k != key && self.prev_key == Some(key) => {}
            _ => self.fence = Some((key, counter)),
        }
    }

    /// Was the datagram under `key` with `counter` sealed before the last epoch end?
    fn before_fence(&self, key: u32, counter: u64) -> bool {
        match self.fence {
            Some((k, c)) if k == key => counter < c,
            // Sealed under the keys before those of the end.
            Some((k, _)) => self.key == Some(k) && self.prev_key == Some(key),
            None => false,
        }
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
        if urgent
            && self.key == Some(key)
            && (counter < self.next || counter - self.next <= MAX_GAP)
        {
            self.pass_urgent(now, wait, counter, inner, out);
            return;
        }
        if self.key != Some(key) {
            if self.prev_key == Some(key) {
                if self.before_fence(key, counter) {
                    self.stats.stale += 1;
                } else {
                    out.push((inner, now)); // late, under the keys before: as it comes
                }
                return;
            }
            self.take_new_key(key, out);
        }
        if counter < self.next {
            self.accept_behind(now, key, counter, inner, out);
        } else {
            self.accept_ahead(now, wait, counter, inner, out);
        }
    }

    /// Urgent control `inner` with `counter` under the current keys, behind `next` or
    /// at most [`MAX_GAP`] ahead: it goes on at once. Behind, it may fill a gap (and
    /// release what waited for it); ahead, the counters it skips are missing.
    fn pass_urgent(
        &mut self,
        now: Instant,
        wait: Duration,
        counter: u64,
        inner: Bytes,
        out: &mut Vec<(Bytes, Instant)>,
    ) {
        if counter < self.next {
            if self.missing.remove(&counter).is_some() {
                self.stats.repaired += 1;
            }
            out.push((inner, now));
            self.release(now, out);
        } else {
            self.open_gap(now, wait, counter);
            out.push((inner, now));
        }
    }

    /// New keys (index `key`): their counters start at 0. What waits under the old
    /// ones goes on; the old ones become the keys before.
    fn take_new_key(&mut self, key: u32, out: &mut Vec<(Bytes, Instant)>) {
        self.give_up_all(out);
        self.prev_key = self.key;
        self.key = Some(key);
        self.next = 0;
    }

    /// A datagram `inner` with `counter` under the current keys (index `key`), behind
    /// `next`: a repair of a missing one is held in its place (and what it unblocks
    /// released); one sealed before the epoch end is stale; else it is late (given up
    /// already, or never waited for) and goes on as it comes.
    fn accept_behind(
        &mut self,
        now: Instant,
        key: u32,
        counter: u64,
        inner: Bytes,
        out: &mut Vec<(Bytes, Instant)>,
    ) {
        if let Some(m) = self.missing.remove(&counter) {
            self.stats.repaired += 1;
            self.held.insert(counter, (inner, m.seen));
            self.release(now, out);
        } else if self.before_fence(key, counter) {
            self.stats.stale += 1;
        } else {
            // Given up already (or never waited for): late, but deliver it.
            out.push((inner, now));
        }
    }

    /// A datagram `inner` with `counter` at or past `next` under the current keys: the
    /// next one with nothing missing goes on; a gap over [`MAX_GAP`] gives up what
    /// waits and goes on; else the counters skipped are missing and it is held (the
    /// oldest gap given up when too much is held).
    fn accept_ahead(
        &mut self,
        now: Instant,
        wait: Duration,
        counter: u64,
        inner: Bytes,
        out: &mut Vec<(Bytes, Instant)>,
    ) {
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

    /// Nothing missing and nothing held: [`LinkReceiver::release`] and
    /// [`LinkReceiver::requests`] have nothing to do (the common case, checked for
    /// every datagram received).
    pub fn is_quiet(&self) -> bool {
        self.missing.is_empty() && self.held.is_empty()
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
        let mut r = LinkReceiver::default();
        let mut out = vec![];
        for k in 0..5 {
            r.accept(ms(k), W, 7, k, b(k as u8), false, &mut out);
        }
        assert_eq!(bytes(&out), (0..5).map(b).collect::<Vec<_>>());
        assert_eq!(r.stats, ArqChannelStats::default());
    }

    #[test]
    fn a_gap_holds_later_datagrams_until_repaired_then_releases_in_order() {
        let mut r = LinkReceiver::default();
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
        let mut r = LinkReceiver::default();
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
    fn a_straggler_from_before_an_epoch_end_is_dropped_not_passed_on() {
        let mut r = LinkReceiver::default();
        let mut out = vec![];
        r.accept(ms(0), W, 7, 0, b(0), false, &mut out);
        r.accept(ms(1), W, 7, 2, b(2), false, &mut out); // 1 missing
        r.release(ms(101), &mut out); // given up: 2 goes on
                                      // The epoch ends on this channel (counter 3), then the next epoch's data.
        r.fence(7, 3);
        r.accept(ms(102), W, 7, 3, b(3), false, &mut out);
        r.accept(ms(103), W, 7, 4, b(4), false, &mut out);
        assert_eq!(bytes(&out), vec![b(0), b(2), b(3), b(4)]);
        // 1 turns up (a repair past the wait): it is the old epoch's, and would reach
        // the new epoch's resequencer out of order.
        r.accept(ms(150), W, 7, 1, b(1), false, &mut out);
        assert_eq!(out.len(), 4);
        assert_eq!(r.stats.stale, 1);
        // A straggler sealed after the end still goes on, late.
        r.accept(ms(151), W, 7, 6, b(6), false, &mut out); // 5 missing
        r.release(ms(300), &mut out);
        r.accept(ms(301), W, 7, 5, b(5), false, &mut out);
        assert_eq!(bytes(&out), vec![b(0), b(2), b(3), b(4), b(6), b(5)]);
        // New keys, and an epoch end under them: what comes late under the keys
        // before was sealed before that end.
        r.accept(ms(302), W, 9, 0, b(10), false, &mut out);
        r.fence(9, 1);
        r.accept(ms(303), W, 9, 1, b(11), false, &mut out);
        r.accept(ms(304), W, 7, 7, b(7), false, &mut out);
        assert_eq!(out.len(), 8);
        assert_eq!(r.stats.stale, 2);
        // An older end does not move the fence back.
        r.fence(7, 2);
        r.accept(ms(305), W, 7, 8, b(8), false, &mut out);
        assert_eq!(r.stats.stale, 3);
    }

    #[test]
    fn urgent_control_is_not_held_but_fills_or_opens_gaps() {
        let mut r = LinkReceiver::default();
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
        let mut r = LinkReceiver::default();
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
    fn sender_answers_once_per_round_trip_and_rejects_what_it_never_sent() {
        let mut t = LinkSender::default();
        let sealed = |key: u32, c: u64| Bytes::from(vec![key as u8, c as u8]);
        let rtt = Duration::from_millis(10);
        t.push(ms(0), 1, 0, &sealed(1, 0));
        t.push(ms(1), 1, 1, &sealed(1, 1));
        t.push(ms(2), 2, 0, &sealed(2, 0));
        assert_eq!(t.take_for_resend(ms(20), 1, 1, rtt), Ok(sealed(1, 1)));
        assert_eq!(t.take_for_resend(ms(20), 2, 0, rtt), Ok(sealed(2, 0)));
        // Never sent: above the highest counter of the key, or a key never used.
        assert_eq!(
            t.take_for_resend(ms(20), 2, 1, rtt),
            Err(NotResent::Rejected)
        );
        assert_eq!(
            t.take_for_resend(ms(20), 9, 0, rtt),
            Err(NotResent::Rejected)
        );
        // Asked again within a round trip of the repair: not sent again yet.
        assert_eq!(
            t.take_for_resend(ms(25), 1, 1, rtt),
            Err(NotResent::Premature)
        );
        assert!(t.take_for_resend(ms(30), 1, 1, rtt).is_ok());
        // The first request for a datagram sent less than a round trip ago is answered
        // (its gap proves it lost); a second within the repair's round trip is not.
        t.push(ms(40), 2, 1, &sealed(2, 1));
        assert!(t.take_for_resend(ms(45), 2, 1, rtt).is_ok());
        assert_eq!(
            t.take_for_resend(ms(46), 2, 1, rtt),
            Err(NotResent::Premature)
        );
        t.push(ms(1500), 2, 2, &sealed(2, 2));
        assert_eq!(
            t.take_for_resend(ms(1500), 1, 0, rtt),
            Err(NotResent::Expired),
            "older than a second"
        );
        assert_eq!(t.items.len(), 1);
        let s = t.stats;
        assert_eq!(
            (s.resent, s.rejected, s.premature, s.expired),
            (4, 2, 2, 1),
            "{s:?}"
        );
    }
}
