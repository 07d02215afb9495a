//! The one random generator of braid: SplitMix64.
//!
//! Everything random in braid is deterministic given a seed: the randomized scheduler
//! (both ends draw the same numbers), the trigger digests, the in-memory test harness,
//! the simulator's channels and traffic, and the lab's link emulator. They all use this
//! module. SplitMix64 (Steele, Lea, Flood 2014) is small, fast and good enough for
//! simulation and scheduling; it is not for keys (the session's keys come from the
//! operating system through the driver).

/// The golden-ratio increment of SplitMix64.
pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's finalizer: a bijective mix of 64 bits.
#[inline]
pub fn mix64(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// One SplitMix64 output for state `x`: `mix64(x + GAMMA)`. A stateless hash of a
/// counter (the randomized scheduler draws `splitmix64(seed ^ splitmix64(index))`).
#[inline]
pub fn splitmix64(x: u64) -> u64 {
    mix64(x.wrapping_add(GAMMA))
}

/// A SplitMix64 stream.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// The stream whose first output is `mix64(seed + GAMMA)`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// Stream number `stream` of seed `seed`: independent processes (a channel's loss,
    /// the traffic) draw from their own streams of one scenario seed.
    pub fn stream(seed: u64, stream: u64) -> SplitMix64 {
        SplitMix64 {
            state: mix64(seed ^ mix64(stream.wrapping_add(0x05EE_D0FB_4A1D))),
        }
    }

    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix64(self.state)
    }

    /// Uniform in `[0, 1)`, 53 bits.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `p` (no draw when `p` is 0 or 1).
    #[inline]
    pub fn chance(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            false
        } else if p >= 1.0 {
            true
        } else {
            self.next_f64() < p
        }
    }

    /// Uniform integer in `[0, n]` (inclusive).
    #[inline]
    pub fn upto(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        if n == u64::MAX {
            return self.next_u64();
        }
        // Multiply-shift: bias below 2^-64 * n, irrelevant here.
        ((u128::from(self.next_u64()) * u128::from(n + 1)) >> 64) as u64
    }

    /// Exponentially distributed with this mean.
    #[inline]
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.next_f64()).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_values() {
        // SplitMix64 from state 0: the published first outputs.
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn streams_differ_and_repeat() {
        let draw = |s: u64, k: u64| {
            let mut r = SplitMix64::stream(s, k);
            (0..4).map(|_| r.next_u64()).collect::<Vec<_>>()
        };
        assert_ne!(draw(7, 1), draw(7, 2));
        assert_eq!(draw(7, 1), draw(7, 1));
    }

    #[test]
    fn uniform_mean_and_range() {
        let mut r = SplitMix64::stream(1, 1);
        let n = 200_000;
        let mut sum = 0.0;
        for _ in 0..n {
            let x = r.next_f64();
            assert!((0.0..1.0).contains(&x));
            sum += x;
        }
        assert!((sum / n as f64 - 0.5).abs() < 0.005);
        for _ in 0..1000 {
            assert!(r.upto(3) <= 3);
        }
    }
}
