use super::Position;

/// Randomized fair queuing turned into load sharing (seed 000 §3.4): packet `n` goes to
/// a channel drawn with probability proportional to its weight.
///
/// The draw for packet `n` is a pure function of `(seed, n)` (a SplitMix64 hash of the
/// counter), so the receiver computes the same channel for the same index without
/// sharing any generator state beyond the seed, and a marker only needs to carry an
/// index to resynchronize.
#[derive(Clone, Debug)]
pub struct RandomFq {
    cumulative: Vec<u64>,
    seed: u64,
    index: u64,
}

use crate::rng::splitmix64;

impl RandomFq {
    /// A fresh scheduler over channels with these weights (0 counts as 1).
    pub fn new(weights: &[u32], seed: u64) -> RandomFq {
        assert!(
            !weights.is_empty(),
            "random scheduler needs at least one channel"
        );
        let mut acc = 0u64;
        let cumulative = weights
            .iter()
            .map(|&w| {
                acc += u64::from(w.max(1));
                acc
            })
            .collect();
        RandomFq {
            cumulative,
            seed,
            index: 0,
        }
    }

    /// Number of channels.
    pub fn channels(&self) -> usize {
        self.cumulative.len()
    }

    /// Global index of the next packet.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The channel that packet `index` is sent on.
    #[inline]
    pub fn channel_of(&self, index: u64) -> usize {
        let total = *self.cumulative.last().expect("non-empty");
        let r = splitmix64(self.seed ^ splitmix64(index)) % total;
        self.cumulative.partition_point(|&c| c <= r)
    }

    /// The channel of the next packet.
    #[inline]
    pub fn select(&self) -> usize {
        self.channel_of(self.index)
    }

    /// One packet was sent.
    #[inline]
    pub fn on_sent(&mut self) {
        self.index += 1;
    }

    /// The index of the next packet on `channel`, searched a bounded distance ahead;
    /// if none is found the current index is a safe lower bound. The deficit counter
    /// has no meaning here and is always 1 (markers require a positive value).
    pub fn position(&self, channel: usize) -> Position {
        let limit = 64 * self.channels() as u64 + 64;
        let round = (self.index..self.index + limit)
            .find(|&i| self.channel_of(i) == channel)
            .unwrap_or(self.index);
        Position { round, dc: 1 }
    }
}
