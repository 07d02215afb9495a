//! Datagram buffers carved from shared chunks, so that sealing and opening a datagram
//! (and writing a marker) allocate nothing per packet (issue 33).
//!
//! A sealed or opened datagram is written at the end of the current chunk and split off
//! as its own [`Bytes`]: the datagrams of one chunk share its allocation (each holds a
//! reference; the chunk is freed when the last is dropped), and cloning one (the repair
//! ring keeps a copy) only counts a reference. A new chunk is allocated when the
//! current one is full.
//!
//! The chunk size follows the traffic, so that an idle session (a server's many
//! peers, each sending a heartbeat) holds little: it doubles, up to 64 KiB, when a
//! chunk filled in under 20 ms, and halves, down to 512 bytes, when one lasted over 1 s
//! (then at once: a chunk is not kept until it is full).

use bytes::{Bytes, BytesMut};

use crate::time::{Duration, Instant};

/// The smallest chunk: a few hellos (a larger datagram gets a chunk of its size). An
/// idle session's chunk lasts while its heartbeats fill it, so this is what each of a
/// server's many idle peers holds per arena (issue 30).
const MIN_CHUNK: usize = 512;
/// The largest chunk.
const MAX_CHUNK: usize = 64 * 1024;
/// A chunk filled faster than this: the next is twice as large.
const FAST: Duration = Duration::from_millis(20);
/// A chunk that lasted longer than this: the next is half as large.
const SLOW: Duration = Duration::from_secs(1);

/// Where the session writes the datagrams it seals and opens.
#[derive(Debug)]
pub(crate) struct Arena {
    /// The unused end of the current chunk (empty between two datagrams).
    buf: BytesMut,
    /// The size of the next chunk.
    chunk: usize,
    /// When the current chunk was allocated.
    since: Instant,
    /// Detached: the next chunk is `chunk` as it is, whatever the last one did.
    fresh: bool,
}

impl Arena {
    pub fn new() -> Arena {
        Arena {
            buf: BytesMut::new(),
            chunk: MIN_CHUNK,
            since: Instant::ZERO,
            fresh: false,
        }
    }

    /// An empty buffer with room for `len` bytes without allocating: write the
    /// datagram into it, then [`Arena::finish`] it (or [`Arena::abandon`] it).
    pub fn start(&mut self, now: Instant, len: usize) -> &mut BytesMut {
        debug_assert!(
            self.buf.is_empty(),
            "a datagram was neither finished nor abandoned"
        );
        let lasted = now.saturating_since(self.since);
        // A chunk that lasts long is given up for a smaller one at once, not when it
        // is full: a burst (a capacity probe's train) leaves no large chunk behind
        // for an idle session to fill for minutes.
        let stale = lasted > SLOW && self.chunk > MIN_CHUNK;
        if self.buf.capacity() < len || stale {
            if std::mem::take(&mut self.fresh) {
                // Detached: the smallest chunk, not grown from the burst before.
            } else if lasted < FAST {
                self.chunk = (self.chunk * 2).min(MAX_CHUNK);
            } else if lasted > SLOW {
                self.chunk = (self.chunk / 2).max(MIN_CHUNK);
            }
            self.buf = BytesMut::with_capacity(self.chunk.max(len));
            self.since = now;
        }
        &mut self.buf
    }

    /// The datagram written since [`Arena::start`], as its own buffer.
    pub fn finish(&mut self) -> Bytes {
        self.buf.split().freeze()
    }

    /// Forget what was written since [`Arena::start`] (the room is used again).
    pub fn abandon(&mut self) {
        self.buf.clear();
    }

    /// Start afresh with the smallest chunk, after a burst that is not traffic (a
    /// capacity probe's train): the current chunk is left to the datagrams already in
    /// it and freed with the last of them, instead of being kept, and grown from, by
    /// what comes next.
    pub fn detach(&mut self) {
        self.buf = BytesMut::new();
        self.chunk = MIN_CHUNK;
        self.fresh = true;
    }

    /// `len` bytes written by `write` (into zeroes), as one buffer.
    pub fn fill(&mut self, now: Instant, len: usize, write: impl FnOnce(&mut [u8])) -> Bytes {
        let b = self.start(now, len);
        b.resize(len, 0);
        write(&mut b[..]);
        self.finish()
    }

    /// `parts` one after the other, as one buffer.
    pub fn join(&mut self, now: Instant, parts: &[&[u8]]) -> Bytes {
        let b = self.start(now, parts.iter().map(|p| p.len()).sum());
        for p in parts {
            b.extend_from_slice(p);
        }
        self.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at_ms(ms: u64) -> Instant {
        Instant::ZERO + Duration::from_millis(ms)
    }

    #[test]
    fn datagrams_share_a_chunk_and_keep_their_bytes() {
        let mut a = Arena::new();
        let x = a.join(at_ms(0), &[b"abc", b"de"]);
        let y = a.join(at_ms(0), &[b"fgh"]);
        assert_eq!(&x[..], b"abcde");
        assert_eq!(&y[..], b"fgh");
        // One chunk: y starts where x ends.
        assert_eq!(x.as_ptr().wrapping_add(5), y.as_ptr());
        // An abandoned datagram leaves nothing behind.
        a.start(at_ms(0), 4).extend_from_slice(b"junk");
        a.abandon();
        let z = a.join(at_ms(0), &[b"z"]);
        assert_eq!(y.as_ptr().wrapping_add(3), z.as_ptr());
        drop((x, y));
        assert_eq!(&z[..], b"z");
    }

    #[test]
    fn the_chunk_grows_under_load_and_shrinks_when_idle() {
        let mut a = Arena::new();
        let d = [0u8; 1500];
        // Busy: every chunk fills at once, so they grow to the largest.
        for _ in 0..200 {
            a.join(at_ms(0), &[&d]);
        }
        assert_eq!(a.chunk, MAX_CHUNK);
        // After the burst, small datagrams now and then: the large chunk is given up
        // within seconds, long before it is full.
        let mut t = 0;
        for _ in 0..8 {
            t += 1100;
            a.join(at_ms(t), &[b"hello"]);
        }
        assert_eq!(a.chunk, MIN_CHUNK);
        // Idle: a datagram every 2 s; each chunk lasts long, so they shrink.
        for _ in 0..400 {
            t += 2000;
            a.join(at_ms(t), &[&d]);
        }
        assert_eq!(a.chunk, MIN_CHUNK);
        // After a detach, the next datagram starts a new, smallest chunk.
        let x = a.join(at_ms(t), &[b"x"]);
        a.detach();
        let y = a.join(at_ms(t), &[b"y"]);
        assert_ne!(x.as_ptr().wrapping_add(1), y.as_ptr());
        assert_eq!(a.chunk, MIN_CHUNK);
        // A datagram larger than any chunk still fits.
        assert_eq!(a.join(at_ms(t), &[&[1u8; 100_000]]).len(), 100_000);
    }
}
