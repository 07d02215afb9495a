//! The fast lane: a stream that sends little skips the stripe.
//!
//! A DATA frame in the stripe is paced and resequenced with the bonded traffic, so it
//! reaches the far end at the slowest channel's delay, and waits there behind any loss
//! the bond repairs: right for a bulk transfer, which needs every channel's rate, and
//! wrong for a remote shell, a game or a small request, which needs none of it and
//! waits for all of it (on the lab's 5/20/60 ms links, 80 ms one way instead of 5).
//! The inner TCP is terminated at both ends, so nothing in it measures the path its
//! bytes take: the stream's frames may take any path, in any order ([`crate::stream`]
//! repairs both). So a stream's DATA goes on the lowest-delay channel, past the stripe,
//! as the control frames do, while
//!
//! * what waits to be sent (its backlog) fits in [`FAST_BACKLOG`]: the application
//!   writes little at a time;
//! * its token bucket has the bytes: [`FAST_RATE`], with a burst of [`FAST_BURST`]
//!   (a stream that keeps writing small pieces fast is bulk, and its rate belongs to
//!   the bond);
//! * and the session has a fast channel with room (its caller's `fast_len`).
//!
//! Once a frame of the stream goes into the stripe, the stream stays there until
//! nothing of it is in flight: a frame on the fast channel sent after one in the
//! stripe would arrive first, and the sender's loss detection would take the earlier
//! one for lost. (From the fast lane to the stripe is harmless: the earlier frames
//! arrive first.)
//!
//! Round-trip samples come only from frames in the stripe: all streams share one
//! estimate ([`super::rtt`]), and a bulk stream's timeout must follow the bond's round
//! trip, not the fast channel's.

use super::StreamConfig;
use crate::time::Instant;

/// A stream's backlog (bytes written and not sent yet) at most this for its DATA to
/// take the fast lane: about a dozen full frames, a small request or response.
pub const FAST_BACKLOG: u64 = 16 << 10;
/// A stream's fast-lane rate, bytes a second (2 Mbit/s).
pub const FAST_RATE: u64 = 250_000;
/// Bytes a stream may send on the fast lane at once, its bucket full.
pub const FAST_BURST: u64 = 64 << 10;

/// Which way a frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Into the stripe, with the bonded traffic.
    Stripe,
    /// Past the stripe, on the lowest-delay channel: control frames and ACKs always,
    /// DATA of a stream that sends little.
    Fast,
}

/// One stream's way for its DATA: the fast lane's token bucket and whether it is on
/// the fast lane now.
#[derive(Debug, Clone, Copy)]
pub(super) struct FastLane {
    /// Its DATA takes the fast lane (its frames in flight went that way).
    pub on: bool,
    /// Bytes it may send on the fast lane now.
    tokens: u64,
    /// When the bucket was last filled.
    at: Instant,
}

impl FastLane {
    /// A new stream starts on the fast lane with a full bucket.
    pub fn new(now: Instant) -> FastLane {
        FastLane {
            on: true,
            tokens: FAST_BURST,
            at: now,
        }
    }

    /// May the next new DATA frame (the stream has `backlog` bytes waiting and
    /// `in_flight` frames sent and not acknowledged; a fast frame holds at most
    /// `room` bytes, 0 when the session has no fast lane now) take the fast lane?
    /// Updates [`FastLane::on`].
    pub fn admit(
        &mut self,
        now: Instant,
        cfg: &StreamConfig,
        backlog: u64,
        in_flight: bool,
        room: u64,
    ) -> bool {
        let micros = now.saturating_since(self.at).as_micros();
        let add = micros.saturating_mul(FAST_RATE) / 1_000_000;
        if add > 0 {
            self.tokens = (self.tokens + add).min(FAST_BURST);
            self.at = now;
        }
        let fast = cfg.fast_lane
            && room > 0
            && (self.on || !in_flight)
            && backlog <= FAST_BACKLOG
            && self.tokens >= backlog.min(room);
        self.on = fast;
        fast
    }

    /// `len` bytes went on the fast lane.
    pub fn charge(&mut self, len: u64) {
        self.tokens = self.tokens.saturating_sub(len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Duration;

    fn cfg() -> StreamConfig {
        StreamConfig::default()
    }

    #[test]
    fn small_writes_go_fast_until_the_bucket_is_empty() {
        let t0 = Instant::ZERO;
        let mut l = FastLane::new(t0);
        let mut sent = 0;
        while l.admit(t0, &cfg(), 1000, true, 1400) {
            l.charge(1000);
            sent += 1000;
        }
        assert_eq!(sent, FAST_BURST / 1000 * 1000);
        assert!(!l.on);
        // Back only once nothing is in flight, and the bucket refilled.
        let later = t0 + Duration::from_millis(100);
        assert!(!l.admit(later, &cfg(), 1000, true, 1400));
        assert!(l.admit(later, &cfg(), 1000, false, 1400));
    }

    #[test]
    fn a_large_backlog_or_no_fast_channel_takes_the_stripe() {
        let t0 = Instant::ZERO;
        let mut l = FastLane::new(t0);
        assert!(!l.admit(t0, &cfg(), FAST_BACKLOG + 1, false, 1400));
        assert!(!l.admit(t0, &cfg(), 100, false, 0));
        let off = StreamConfig {
            fast_lane: false,
            ..cfg()
        };
        assert!(!l.admit(t0, &off, 100, false, 1400));
        assert!(l.admit(t0, &cfg(), 100, false, 1400));
    }
}
