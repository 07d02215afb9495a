//! Sealed datagrams that no key of the session could accept, dropped before they are
//! queued.
//!
//! A channel's readers hand datagrams to the session's driver through a bounded queue
//! (each channel has its share of it). The key index of a sealed datagram is in clear,
//! so a forger who read it off a peer's traffic could fill that queue with datagrams the
//! session would reject only once it got to them, and crowd out the peer's own (a flood
//! aimed at one peer of a server, or at a point-to-point tunnel's channel).
//!
//! So the driver publishes here, whenever it has fed the session, the key indices the
//! session receives with and, per channel, each key's receive window top; a reader drops
//! a sealed datagram whose index is none of those, or whose counter no window of that
//! key could accept (any channel's: an in-bond repair crosses on another channel than
//! the one it was sealed for) ([`plausible_counter`]: older than the replay window, or more than
//! [`braid_proto::session::PLAUSIBLE_AHEAD`] past the top), uncopied and counted. A
//! forger then has to see the channel's current counters as well; one who can is on the
//! path, where it could drop the traffic anyway.
//!
//! Every datagram that is not sealed (handshakes, cookie replies) passes: the session
//! judges those itself, behind their own limits.
//!
//! What a reader reads may lag the session by one batch, which only makes it more
//! lenient (a top lower than the session's), except for a key the session has just
//! made: the driver publishes before it sends anything, so no datagram sealed with a
//! new key can arrive before its index is here.

use braid_proto::session::{plausible_counter, Session, RECEIVING_KEYS};
use braid_proto::wire::secure::{Header, LANE_PROBE};
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// An index slot that holds no key.
const NO_KEY: u64 = u64::MAX;

/// The session's receive windows, as its readers see them.
pub(crate) struct Windows {
    keys: [Key; RECEIVING_KEYS],
}

/// One key's slot: written by the driver alone, read by the readers.
struct Key {
    /// Odd while the slot is being given to another key (a sequence lock: a reader that
    /// saw it change reads again).
    version: AtomicU64,
    /// The key's local index, or [`NO_KEY`].
    index: AtomicU64,
    /// Per channel, the window's top; then per channel, its probe lane's
    /// (`wire::secure`: path MTU probes have their own counter).
    tops: Box<[AtomicU64]>,
}

impl Windows {
    pub(crate) fn new(channels: usize) -> Windows {
        Windows {
            keys: std::array::from_fn(|_| Key {
                version: AtomicU64::new(0),
                index: AtomicU64::new(NO_KEY),
                tops: (0..2 * channels).map(|_| AtomicU64::new(0)).collect(),
            }),
        }
    }

    /// Publish the session's keys and windows (the driver, after it fed the session
    /// and before it sends). A key already here keeps its slot and only its tops move
    /// (a top only grows within a key); a new one takes the slot of a key the session
    /// no longer has.
    pub(crate) fn publish(&self, session: &Session) {
        self.publish_from(|each| session.receive_windows(each));
    }

    /// [`Windows::publish`] from anything that lists keys as
    /// [`Session::receive_windows`] does.
    fn publish_from(&self, keys: impl Fn(&mut dyn FnMut(u32, &mut dyn Iterator<Item = u64>))) {
        let mut live = [NO_KEY; RECEIVING_KEYS];
        let mut n = 0;
        keys(&mut |index, _| {
            if n < live.len() {
                live[n] = u64::from(index);
                n += 1;
            }
        });
        let live = &live[..n];
        keys(&mut |index, tops| {
            let index = u64::from(index);
            let held = self
                .keys
                .iter()
                .find(|k| k.index.load(Ordering::Relaxed) == index);
            if let Some(k) = held {
                for (t, top) in k.tops.iter().zip(tops) {
                    t.store(top, Ordering::Relaxed);
                }
                return;
            }
            let Some(k) = self
                .keys
                .iter()
                .find(|k| !live.contains(&k.index.load(Ordering::Relaxed)))
            else {
                return;
            };
            let v = k.version.load(Ordering::Relaxed);
            k.version.store(v + 1, Ordering::Relaxed);
            fence(Ordering::Release);
            k.index.store(index, Ordering::Relaxed);
            for (t, top) in k.tops.iter().zip(tops) {
                t.store(top, Ordering::Relaxed);
            }
            k.version.store(v + 2, Ordering::Release);
        });
    }

    /// Could the session accept `d`, received on `channel`? Not a sealed datagram whose
    /// key index it does not have, or whose counter no window of that key could take.
    pub(crate) fn admits(&self, channel: usize, d: &[u8]) -> bool {
        let Ok(h) = Header::parse(d) else {
            return true;
        };
        let index = u64::from(h.index);
        for k in &self.keys {
            let v = k.version.load(Ordering::Acquire);
            if k.index.load(Ordering::Relaxed) != index {
                continue;
            }
            // Any channel's window: an in-bond repair is the same sealed datagram sent
            // again on another channel, its counter that of the channel it was
            // sealed for (the session opens it with that channel's nonce).
            // A probe's counter is its channel's probe lane's (never repaired).
            let n = k.tops.len() / 2;
            let counter = u64::from(h.counter);
            let plausible = channel < n
                && if h.lane == LANE_PROBE {
                    plausible_counter(k.tops[n + channel].load(Ordering::Relaxed), counter)
                } else {
                    k.tops[..n]
                        .iter()
                        .any(|t| plausible_counter(t.load(Ordering::Relaxed), counter))
                };
            fence(Ordering::Acquire);
            if v & 1 == 1 || k.version.load(Ordering::Relaxed) != v {
                // Being given to another key right now: let the session judge.
                return true;
            }
            return plausible;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_proto::session::PLAUSIBLE_AHEAD;
    use braid_proto::wire::secure::OVERHEAD;

    fn sealed(index: u32, counter: u64) -> Vec<u8> {
        let h = Header {
            encrypted: true,
            index,
            counter: u32::try_from(counter).expect("a counter of 32 bits"),
            lane: braid_proto::wire::secure::LANE_MAIN,
        };
        let mut d = h.to_bytes().to_vec();
        d.resize(OVERHEAD + 100, 0);
        d
    }

    /// Publish keys given as (index, tops per channel).
    fn publish(w: &Windows, keys: &[(u32, &[u64])]) {
        w.publish_from(|each| {
            for (index, tops) in keys {
                each(*index, &mut tops.iter().copied());
            }
        });
    }

    #[test]
    fn with_no_key_only_what_is_not_sealed_passes() {
        let w = Windows::new(2);
        assert!(!w.admits(0, &sealed(7, 0)));
        let init = [
            braid_proto::wire::TYPE_HS_INIT,
            braid_proto::wire::secure::HS_VERSION,
            1,
            0,
            0,
            0,
            0,
            0,
        ];
        assert!(w.admits(0, &init));
        // Too short to be sealed: the session judges it.
        assert!(w.admits(0, &[braid_proto::wire::TYPE_SEALED, 2]));
    }

    #[test]
    fn a_counter_is_plausible_within_the_window_and_not_far_ahead_of_it() {
        let w = Windows::new(2);
        publish(&w, &[(7, &[5000, 100_000_000])]);
        assert!(w.admits(0, &sealed(7, 5000)));
        assert!(w.admits(0, &sealed(7, 4000)));
        // The oldest the replay window still takes, and one older.
        assert!(w.admits(0, &sealed(7, 5000 - 2048)));
        assert!(!w.admits(0, &sealed(7, 5000 - 2049)));
        assert!(w.admits(0, &sealed(7, 5000 + PLAUSIBLE_AHEAD - 1)));
        assert!(!w.admits(0, &sealed(7, 5000 + PLAUSIBLE_AHEAD)));
        // Any channel's window will do: an in-bond repair of channel 0's datagram
        // arrives on channel 1 with channel 0's counter, and the other way round.
        assert!(w.admits(1, &sealed(7, 4000)));
        assert!(w.admits(0, &sealed(7, 100_000_000)));
        assert!(!w.admits(1, &sealed(7, 100_000_000 - 2049)));
        // A random counter, as a forger who knows only the index would send.
        assert!(!w.admits(0, &sealed(7, 0xabcd_ef01)));
        // Another index, and a channel the session does not have.
        assert!(!w.admits(0, &sealed(8, 5000)));
        assert!(!w.admits(2, &sealed(7, 5000)));
    }

    #[test]
    fn a_probe_lane_counter_is_judged_by_its_own_window() {
        let w = Windows::new(2);
        // Lane 0 of each channel far along, the probe lanes near their start.
        publish(&w, &[(7, &[100_000, 100_000, 3, 0])]);
        let probe = |c: u64| {
            let mut d = sealed(7, c);
            d[1] = (braid_proto::wire::secure::VERSION << 4) | LANE_PROBE;
            d
        };
        assert!(w.admits(0, &probe(3)));
        assert!(w.admits(1, &probe(0)));
        // Not by lane 0's windows: a probe counter near those is implausible.
        assert!(!w.admits(0, &probe(100_000 + PLAUSIBLE_AHEAD)));
        assert!(!w.admits(0, &sealed(7, 3)));
    }

    #[test]
    fn keys_keep_their_slots_and_a_new_key_takes_a_gone_ones() {
        let w = Windows::new(1);
        publish(&w, &[(7, &[100])]);
        publish(&w, &[(9, &[0]), (7, &[200])]);
        assert!(w.admits(0, &sealed(9, 1)));
        assert!(w.admits(0, &sealed(7, 200)));
        // 7's top moved: a counter the old top made implausible is plausible now.
        assert!(w.admits(0, &sealed(7, 100 + PLAUSIBLE_AHEAD)));
        // Every slot taken by keys that come and go, then only 11 and 9 are live.
        for k in 20..20 + RECEIVING_KEYS as u32 {
            publish(&w, &[(9, &[0]), (k, &[0])]);
        }
        publish(&w, &[(11, &[0]), (9, &[3])]);
        assert!(w.admits(0, &sealed(11, 0)));
        assert!(w.admits(0, &sealed(9, 3)));
        assert!(!w.admits(0, &sealed(7, 200)));
    }
}
