//! Non-causal load sharing, for comparison only (seed 000 §2.1).
//!
//! These schemes pick a channel from information the receiver does not have (the
//! senders' queue lengths, or the packet's addresses), so the receiver cannot simulate
//! them and logical reception is impossible. They have their own type, [`Baseline`],
//! which the striper accepts and the resequencer does not.

/// A non-causal sender-side scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BaselineKind {
    /// Shortest queue first (the Linux EQL serial-line driver): the channel with the
    /// fewest bytes waiting in its transmit queue.
    ShortestQueue,
    /// Address hashing: a hash of the packet's IP source and destination addresses (or of
    /// its first bytes if it is not an IP packet) picks the channel; one flow stays on one
    /// channel.
    Hash,
}

impl BaselineKind {
    /// Short lowercase name.
    pub fn name(&self) -> &'static str {
        match self {
            BaselineKind::ShortestQueue => "sqf",
            BaselineKind::Hash => "hash",
        }
    }
}

/// A running non-causal scheduler.
#[derive(Clone, Debug)]
pub struct Baseline {
    kind: BaselineKind,
    channels: usize,
}

impl Baseline {
    /// A scheduler of `kind` over `channels` channels.
    pub fn new(kind: BaselineKind, channels: usize) -> Baseline {
        Baseline {
            kind,
            channels: channels.max(1),
        }
    }

    /// Which scheme.
    pub fn kind(&self) -> BaselineKind {
        self.kind
    }

    /// Pick the channel for `packet`, given each channel's queued bytes (only read by
    /// shortest-queue-first; ties go to the lowest index).
    pub fn select(&self, packet: &[u8], queued_bytes: &[u64]) -> usize {
        match self.kind {
            BaselineKind::ShortestQueue => queued_bytes
                .iter()
                .take(self.channels)
                .enumerate()
                .min_by_key(|(i, q)| (**q, *i))
                .map(|(i, _)| i)
                .unwrap_or(0),
            BaselineKind::Hash => (hash_addresses(packet) % self.channels as u64) as usize,
        }
    }
}

/// FNV-1a over the address part of an IP packet (v4: bytes 12..20, v6: 8..40), or over
/// the first 16 bytes of anything else.
fn hash_addresses(packet: &[u8]) -> u64 {
    let key = match packet.first().map(|b| b >> 4) {
        Some(4) if packet.len() >= 20 => &packet[12..20],
        Some(6) if packet.len() >= 40 => &packet[8..40],
        _ => &packet[..packet.len().min(16)],
    };
    key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortest_queue_picks_least_loaded() {
        let b = Baseline::new(BaselineKind::ShortestQueue, 3);
        assert_eq!(b.select(&[], &[500, 100, 300]), 1);
        assert_eq!(b.select(&[], &[0, 0, 0]), 0);
    }

    #[test]
    fn hash_keeps_a_flow_on_one_channel() {
        let b = Baseline::new(BaselineKind::Hash, 4);
        let mut p = vec![0x45u8; 40];
        p[12..20].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        let c = b.select(&p, &[]);
        p[30] = 99; // payload changes, addresses do not
        assert_eq!(b.select(&p, &[]), c);
    }
}
