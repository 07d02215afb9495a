//! Authentication of control datagrams.
//!
//! Every control datagram (first byte `0xB1` marker, `0xB2` trigger, `0xB4` session
//! message, see [`crate::wire::session`]) leaves a braid end with a 32-byte trailer:
//!
//! ```text
//!  0                   8                  16                                32
//! +-------------------+-------------------+---------------------------------+
//! | sender instance   | channel counter   | tag: BLAKE3 keyed hash,         |
//! | (u64, big-endian) | (u64, big-endian) | first 16 bytes                  |
//! +-------------------+-------------------+---------------------------------+
//! ```
//!
//! `tag = BLAKE3-keyed(K, "braid-ctl-v1" || channel || packet || instance || counter)[..16]`
//! where `K = BLAKE3-derive_key("braid 2026 control mac v1", pre-shared key)` and
//! `channel` is the one-byte index of the channel the datagram travels on, so a packet
//! cannot be replayed onto another channel.
//!
//! * `instance` is chosen by the driver at start (braid-io: microseconds since 1970,
//!   shifted left by 12, with 12 random low bits, so a restarted end has a larger
//!   instance); the core reads no clock.
//! * `counter` counts the control datagrams sent on that channel by that instance,
//!   from 1. Channels are FIFO, so the receiver accepts a counter only if it is larger
//!   than the last one accepted on that channel: a replayed or reordered control packet
//!   is dropped and counted.
//! * A datagram carrying the receiver's own instance is a reflection and is rejected.
//! * A larger instance than the current peer's means the peer restarted: the receiver
//!   adopts it (the session then starts over at epoch 0). A smaller one is stale.
//!
//! Data datagrams carry no trailer and are not authenticated (header-free data).

/// Bytes appended to each control datagram.
pub const TRAILER_LEN: usize = 32;
const TAG_LEN: usize = 16;
const CONTEXT: &str = "braid 2026 control mac v1";
const DOMAIN: &[u8] = b"braid-ctl-v1";

/// Why a control datagram was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// Too short to hold a trailer and a packet.
    #[error("control datagram too short for its trailer")]
    Truncated,
    /// The tag does not match: forged, corrupted, or a different key.
    #[error("bad MAC (forged packet or a different key)")]
    BadTag,
    /// Counter not above the last accepted one on this channel, or an older instance.
    #[error("replayed or reordered control packet")]
    Replay,
    /// The datagram carries our own instance number.
    #[error("reflected control packet (our own instance)")]
    Reflected,
}

/// What [`Auth::open`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// Length of the packet without the trailer.
    pub len: usize,
    /// The sender's instance was not known before (first contact or a restart).
    pub new_peer: bool,
    /// The sender's instance.
    pub instance: u64,
}

/// Keys, counters and replay state for one session.
pub struct Auth {
    key: [u8; 32],
    instance: u64,
    tx_counter: Vec<u64>,
    peer_instance: Option<u64>,
    rx_counter: Vec<u64>,
}

impl Auth {
    /// State for `channels` channels with this pre-shared key and our instance number.
    pub fn new(psk: &[u8], channels: usize, instance: u64) -> Auth {
        Auth {
            key: blake3::derive_key(CONTEXT, psk),
            instance,
            tx_counter: vec![0; channels],
            peer_instance: None,
            rx_counter: vec![0; channels],
        }
    }

    /// Our instance number.
    pub fn instance(&self) -> u64 {
        self.instance
    }

    /// The peer's instance, once known.
    pub fn peer_instance(&self) -> Option<u64> {
        self.peer_instance
    }

    fn tag(&self, channel: u8, packet: &[u8], instance: u64, counter: u64) -> [u8; TAG_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(DOMAIN);
        h.update(&[channel]);
        h.update(packet);
        h.update(&instance.to_be_bytes());
        h.update(&counter.to_be_bytes());
        let full = h.finalize();
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(&full.as_bytes()[..TAG_LEN]);
        t
    }

    /// Append the trailer to a control packet about to be sent on `channel`.
    pub fn seal(&mut self, channel: usize, buf: &mut Vec<u8>) {
        self.tx_counter[channel] += 1;
        let counter = self.tx_counter[channel];
        let tag = self.tag(channel as u8, buf, self.instance, counter);
        buf.extend_from_slice(&self.instance.to_be_bytes());
        buf.extend_from_slice(&counter.to_be_bytes());
        buf.extend_from_slice(&tag);
    }

    /// Check a control datagram received on `channel`; on success the packet is
    /// `datagram[..opened.len]`.
    pub fn open(&mut self, channel: usize, datagram: &[u8]) -> Result<Opened, AuthError> {
        if datagram.len() <= TRAILER_LEN || channel >= self.rx_counter.len() {
            return Err(AuthError::Truncated);
        }
        let len = datagram.len() - TRAILER_LEN;
        let (packet, trailer) = datagram.split_at(len);
        let instance = u64::from_be_bytes(trailer[0..8].try_into().expect("8 bytes"));
        let counter = u64::from_be_bytes(trailer[8..16].try_into().expect("8 bytes"));
        let want = self.tag(channel as u8, packet, instance, counter);
        // Constant-time comparison.
        let diff = want
            .iter()
            .zip(&trailer[16..32])
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if diff != 0 {
            return Err(AuthError::BadTag);
        }
        if instance == self.instance {
            return Err(AuthError::Reflected);
        }
        let mut new_peer = false;
        match self.peer_instance {
            Some(p) if instance < p => return Err(AuthError::Replay),
            Some(p) if instance == p => {
                if counter <= self.rx_counter[channel] {
                    return Err(AuthError::Replay);
                }
            }
            _ => {
                self.peer_instance = Some(instance);
                self.rx_counter.iter_mut().for_each(|c| *c = 0);
                new_peer = true;
            }
        }
        self.rx_counter[channel] = counter;
        Ok(Opened {
            len,
            new_peer,
            instance,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Auth, Auth) {
        (Auth::new(b"secret", 3, 1000), Auth::new(b"secret", 3, 2000))
    }

    #[test]
    fn seal_open_roundtrip_and_trailer_layout() {
        let (mut a, mut b) = pair();
        let mut p = vec![0xB4, 1, 1, 0];
        a.seal(0, &mut p);
        assert_eq!(p.len(), 4 + TRAILER_LEN);
        assert_eq!(&p[4..12], &1000u64.to_be_bytes());
        assert_eq!(&p[12..20], &1u64.to_be_bytes());
        let o = b.open(0, &p).unwrap();
        assert_eq!(o.len, 4);
        assert!(o.new_peer);
        assert_eq!(b.peer_instance(), Some(1000));
    }

    #[test]
    fn replay_wrong_channel_forgery_and_reflection_are_rejected() {
        let (mut a, mut b) = pair();
        let mut p1 = vec![0xB1; 32];
        a.seal(1, &mut p1);
        let mut p2 = vec![0xB1; 32];
        a.seal(1, &mut p2);
        assert!(b.open(1, &p2).is_ok());
        // Older counter on the same channel: replay.
        assert_eq!(b.open(1, &p1), Err(AuthError::Replay));
        assert_eq!(b.open(1, &p2), Err(AuthError::Replay));
        // Same packet on another channel: the channel is in the MAC.
        let mut p3 = vec![0xB1; 32];
        a.seal(1, &mut p3);
        assert_eq!(b.open(2, &p3), Err(AuthError::BadTag));
        // One flipped bit.
        let mut p4 = p3.clone();
        p4[5] ^= 1;
        assert_eq!(b.open(1, &p4), Err(AuthError::BadTag));
        // A different key.
        let mut c = Auth::new(b"other", 3, 3000);
        let mut p5 = vec![0xB4; 8];
        c.seal(0, &mut p5);
        assert_eq!(b.open(0, &p5), Err(AuthError::BadTag));
        // b's own packet sent back to it.
        let mut p6 = vec![0xB4; 8];
        b.seal(0, &mut p6);
        assert_eq!(b.open(0, &p6), Err(AuthError::Reflected));
        assert_eq!(b.open(0, &[0xB4; 10]), Err(AuthError::Truncated));
    }

    #[test]
    fn restart_is_adopted_and_old_instance_is_stale() {
        let (mut a, mut b) = pair();
        let mut old = vec![0xB4; 8];
        a.seal(0, &mut old);
        assert!(b.open(0, &old).unwrap().new_peer);
        let mut a2 = Auth::new(b"secret", 3, 1500);
        let mut p = vec![0xB4; 8];
        a2.seal(0, &mut p);
        let o = b.open(0, &p).unwrap();
        assert!(o.new_peer);
        let mut old2 = vec![0xB4; 8];
        a.seal(0, &mut old2);
        assert_eq!(b.open(0, &old2), Err(AuthError::Replay));
    }
}
