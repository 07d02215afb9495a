//! Authentication of the datagrams overlay nodes exchange (ALCP, `0xB0`).
//!
//! Every node of an overlay holds the same pre-shared key (a braid key file). A node
//! sends an ALCP message with a 26-byte trailer:
//!
//! ```text
//! +----------------------+-------------+---------------+------------------+
//! | ALCP message (0xB0…) | sender (u16)| counter (u64) | tag (16 bytes)   |
//! +----------------------+-------------+---------------+------------------+
//! ```
//!
//! The tag is ChaCha20-Poly1305 (the AEAD of braid's sealed envelope) over an empty
//! plaintext with everything before it as associated data, under a key derived from the
//! pre-shared key for this purpose only (BLAKE3 `derive_key`, context
//! [`KEY_CONTEXT`]), with the nonce `sender (2 bytes) | 0 0 | counter (8 bytes)`. The
//! counter increases with every datagram a node sends and starts from a value the driver
//! gives (the wall clock in µs), so it does not repeat across restarts; a receiver keeps,
//! per sender, the highest counter seen and a 64-wide window below it and drops
//! duplicates and anything older (replays). Messages are in clear: the overlay's
//! measurements and routes are not secret, but a forged PROVISION or UPDATE must not be
//! accepted.

use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce, Tag};

use super::NodeId;

/// Bytes added to every ALCP datagram.
pub const TRAILER_LEN: usize = 2 + 8 + 16;
/// BLAKE3 key-derivation context of the overlay key.
pub const KEY_CONTEXT: &str = "braid 2026 overlay ALCP authentication v1";
/// Width of the replay window.
pub const WINDOW: u64 = 64;

/// Why a datagram was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// Shorter than the trailer plus one byte.
    #[error("datagram too short to carry an authentication trailer")]
    Truncated,
    /// The tag does not verify (wrong key, or altered bytes).
    #[error("authentication failed")]
    BadTag,
    /// A counter already seen, or older than the window.
    #[error("replayed or too old")]
    Replay,
    /// A datagram claiming to come from this node itself.
    #[error("datagram claims to come from this node")]
    FromSelf,
}

#[derive(Clone, Copy, Debug, Default)]
struct Window {
    highest: u64,
    seen: u64,
    any: bool,
}

impl Window {
    /// Would `c` be new? (Does not record it.)
    fn fresh(&self, c: u64) -> bool {
        if !self.any || c > self.highest {
            return true;
        }
        let back = self.highest - c;
        back < WINDOW && self.seen & (1u64 << back) == 0
    }

    fn record(&mut self, c: u64) {
        if !self.any {
            *self = Window {
                highest: c,
                seen: 1,
                any: true,
            };
        } else if c > self.highest {
            let shift = c - self.highest;
            self.seen = if shift >= WINDOW {
                0
            } else {
                self.seen << shift
            } | 1;
            self.highest = c;
        } else {
            self.seen |= 1u64 << (self.highest - c);
        }
    }
}

/// One node's sealing and opening state.
pub struct NodeAuth {
    cipher: ChaCha20Poly1305,
    me: NodeId,
    counter: u64,
    windows: Vec<(NodeId, Window)>,
}

impl core::fmt::Debug for NodeAuth {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("NodeAuth")
            .field("me", &self.me)
            .field("counter", &self.counter)
            .finish_non_exhaustive()
    }
}

fn nonce(sender: NodeId, counter: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[..2].copy_from_slice(&sender.to_be_bytes());
    n[4..].copy_from_slice(&counter.to_be_bytes());
    *Nonce::from_slice(&n)
}

impl NodeAuth {
    /// Node `me` with the overlay's pre-shared key; its first datagram carries
    /// `counter_origin` (give the wall clock in µs so a restart never reuses a counter).
    pub fn new(psk: &[u8; 32], me: NodeId, counter_origin: u64) -> NodeAuth {
        let key = blake3::derive_key(KEY_CONTEXT, psk);
        NodeAuth {
            cipher: ChaCha20Poly1305::new(Key::from_slice(&key)),
            me,
            counter: counter_origin,
            windows: Vec::new(),
        }
    }

    /// `msg` with the trailer appended.
    pub fn seal(&mut self, msg: &[u8]) -> Vec<u8> {
        let c = self.counter;
        self.counter = self.counter.wrapping_add(1);
        let mut v = Vec::with_capacity(msg.len() + TRAILER_LEN);
        v.extend_from_slice(msg);
        v.extend_from_slice(&self.me.to_be_bytes());
        v.extend_from_slice(&c.to_be_bytes());
        // Encrypting an empty buffer cannot fail.
        let tag = self
            .cipher
            .encrypt_in_place_detached(&nonce(self.me, c), &v, &mut [])
            .map(|t| t.to_vec())
            .unwrap_or_else(|_| vec![0; 16]);
        v.extend_from_slice(&tag);
        v
    }

    /// Check a datagram; on success the sender and the message without the trailer.
    pub fn open<'a>(&mut self, d: &'a [u8]) -> Result<(NodeId, &'a [u8]), AuthError> {
        if d.len() <= TRAILER_LEN {
            return Err(AuthError::Truncated);
        }
        let body_end = d.len() - 16;
        let msg_end = d.len() - TRAILER_LEN;
        let sender = u16::from_be_bytes([d[msg_end], d[msg_end + 1]]);
        let mut c = [0u8; 8];
        c.copy_from_slice(&d[msg_end + 2..body_end]);
        let counter = u64::from_be_bytes(c);
        if sender == self.me {
            return Err(AuthError::FromSelf);
        }
        let w = self
            .windows
            .iter()
            .find(|(s, _)| *s == sender)
            .map(|(_, w)| *w)
            .unwrap_or_default();
        if !w.fresh(counter) {
            return Err(AuthError::Replay);
        }
        self.cipher
            .decrypt_in_place_detached(
                &nonce(sender, counter),
                &d[..body_end],
                &mut [],
                Tag::from_slice(&d[body_end..]),
            )
            .map_err(|_| AuthError::BadTag)?;
        match self.windows.iter_mut().find(|(s, _)| *s == sender) {
            Some((_, w)) => w.record(counter),
            None => {
                let mut w = Window::default();
                w.record(counter);
                self.windows.push((sender, w));
            }
        }
        Ok((sender, &d[..msg_end]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_open_and_reject() {
        let key = [7u8; 32];
        let mut a = NodeAuth::new(&key, 1, 1000);
        let mut b = NodeAuth::new(&key, 2, 5);
        let d1 = a.seal(b"\xB0hello");
        let d2 = a.seal(b"\xB0world");
        assert_eq!(d1.len(), 6 + TRAILER_LEN);
        // Out of order within the window is fine; a replay is not.
        assert_eq!(b.open(&d2), Ok((1, &b"\xB0world"[..])));
        assert_eq!(b.open(&d1), Ok((1, &b"\xB0hello"[..])));
        assert_eq!(b.open(&d1), Err(AuthError::Replay));
        // One flipped bit anywhere fails.
        for i in 0..d1.len() {
            let mut x = a.seal(b"\xB0bits!");
            x[i] ^= 0x10;
            assert!(b.open(&x).is_err(), "byte {i}");
        }
        // Another key fails; our own datagrams are refused.
        let mut evil = NodeAuth::new(&[8u8; 32], 1, 1_000_000);
        assert_eq!(b.open(&evil.seal(b"\xB0forged")), Err(AuthError::BadTag));
        let mut twin = NodeAuth::new(&key, 2, 0);
        assert_eq!(b.open(&twin.seal(b"\xB0me")), Err(AuthError::FromSelf));
        assert_eq!(b.open(&[0xB0; TRAILER_LEN]), Err(AuthError::Truncated));
    }

    #[test]
    fn window_slides() {
        let key = [3u8; 32];
        let mut a = NodeAuth::new(&key, 1, 0);
        let mut b = NodeAuth::new(&key, 2, 0);
        let old = a.seal(b"\xB0old");
        let mut last = Vec::new();
        for _ in 0..WINDOW + 1 {
            last = a.seal(b"\xB0x");
        }
        assert!(b.open(&last).is_ok());
        // More than the window behind the newest: dropped as too old.
        assert_eq!(b.open(&old), Err(AuthError::Replay));
    }
}
