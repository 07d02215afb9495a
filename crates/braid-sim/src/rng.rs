//! Deterministic random numbers.
//!
//! One scenario seed drives everything. Each random process (a channel's loss, its
//! jitter, the traffic) gets its own stream derived from the seed and a stream number,
//! so that the same seed gives the same packet sizes and the same arrival times to every
//! run variant of a scenario (common random numbers), and so that adding a channel does
//! not shift the numbers another channel draws.

/// SplitMix64 finalizer: a bijective mix of 64 bits.
#[inline]
pub fn mix64(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A SplitMix64 stream: small, fast, and good enough for simulation.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// The stream number `stream` of the scenario seed `seed`.
    pub fn stream(seed: u64, stream: u64) -> Rng {
        Rng {
            state: mix64(seed ^ mix64(stream.wrapping_add(0x05EE_D0FB_4A1D))),
        }
    }

    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
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

/// Stream numbers used by the simulator.
pub mod streams {
    /// Packet sizes and traffic inter-arrival times.
    pub const TRAFFIC: u64 = 1;
    /// The random scheduler's shared seed.
    pub const SCHEDULER: u64 = 2;
    /// Channel `i` uses `CHANNEL_BASE + i`.
    pub const CHANNEL_BASE: u64 = 1000;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_differ_and_repeat() {
        let mut a = Rng::stream(7, 1);
        let mut b = Rng::stream(7, 2);
        let mut c = Rng::stream(7, 1);
        let xa: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        let xb: Vec<u64> = (0..4).map(|_| b.next_u64()).collect();
        let xc: Vec<u64> = (0..4).map(|_| c.next_u64()).collect();
        assert_ne!(xa, xb);
        assert_eq!(xa, xc);
    }

    #[test]
    fn uniform_mean_and_range() {
        let mut r = Rng::stream(1, 1);
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
