//! Adaptive credit allocation (seed 004 §6): "dividing a pie".

/// How the receiver splits a unit's allocation N2 + N3 into N2 (units forwarded between
/// two credits) and N3. Only the receiver uses N2, so it may change it at will (§6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum N2Policy {
    /// The same N2 for every unit and every allocation.
    Fixed(u32),
    /// Adaptive N2 (§6.3): `percent` of the allocation, at least 1 and at most `max`, so
    /// only units of large bandwidth get a large N2 (fewer credits) and an idle unit has
    /// N2 = 1.
    Fraction {
        /// Share of the allocation given to N2, in percent (1–100).
        percent: u32,
        /// Largest N2.
        max: u32,
    },
}

impl N2Policy {
    /// N2 for an allocation of `allocation` units: never below 1, and never the whole
    /// allocation when it has room for N3 >= 1.
    pub fn n2(self, allocation: u32) -> u32 {
        let n2 = match self {
            N2Policy::Fixed(n) => n,
            N2Policy::Fraction { percent, max } => {
                ((allocation as u64 * percent as u64 / 100) as u32).min(max)
            }
        };
        n2.min(allocation.saturating_sub(1)).max(1)
    }
}

/// Divide a pool of `pool` buffer units among units by their measured use over the last
/// measurement interval (§6.1.2, Fig. 5): each unit's target is `pool * use / total`,
/// blended with its previous allocation (`smoothing_percent` of the new target: the
/// paper's low-pass filter; 100 = no filter) and clamped to `[min, max]`.
///
/// When the pool is about α times the link's bandwidth-delay product, a unit that is
/// limited only by its credit uses `allocation / RTT` of the link; if the link is full
/// its next allocation is `α · RTT · X / (C + X)`, a factor `α / (C + X)` more than its
/// use: the exponential ramp-up of §6.1.4. With no use measured at all the allocations
/// stay as they are.
pub fn divide_pool(
    pool: u32,
    usage: &[u64],
    previous: &[u32],
    min: u32,
    max: u32,
    smoothing_percent: u32,
) -> Vec<u32> {
    let total: u128 = usage.iter().map(|&u| u as u128).sum();
    if total == 0 {
        return previous.to_vec();
    }
    let s = smoothing_percent.clamp(1, 100) as u128;
    usage
        .iter()
        .zip(previous)
        .map(|(&u, &prev)| {
            let target = pool as u128 * u as u128 / total;
            let blended = (s * target + (100 - s) * prev as u128) / 100;
            (blended.min(u32::MAX as u128) as u32).clamp(min, max.max(min))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figure_5_ratios() {
        // Operating credits 1:2:2 give allocations in the same ratios.
        assert_eq!(
            divide_pool(200, &[10, 20, 20], &[100, 50, 50], 2, 200, 100),
            vec![40, 80, 80]
        );
    }

    #[test]
    fn figure_6_first_round() {
        // 10 %, 10 %, 80 % of a 100-cell RTT with alpha = 2: 20, 20, 160.
        assert_eq!(
            divide_pool(200, &[10, 10, 80], &[66, 66, 66], 2, 200, 100),
            vec![20, 20, 160]
        );
    }

    #[test]
    fn idle_keeps_and_inactive_yield() {
        assert_eq!(divide_pool(200, &[0, 0], &[7, 9], 2, 200, 100), vec![7, 9]);
        assert_eq!(
            divide_pool(200, &[0, 50], &[100, 100], 2, 150, 100),
            vec![2, 150]
        );
        // Smoothing: half the way to the target.
        assert_eq!(
            divide_pool(200, &[1, 1], &[0, 200], 2, 200, 50),
            vec![50, 150]
        );
    }

    #[test]
    fn n2_policies() {
        assert_eq!(N2Policy::Fixed(10).n2(100), 10);
        assert_eq!(N2Policy::Fixed(10).n2(4), 3);
        assert_eq!(N2Policy::Fixed(10).n2(1), 1);
        let f = N2Policy::Fraction {
            percent: 50,
            max: 32,
        };
        assert_eq!(f.n2(2), 1);
        assert_eq!(f.n2(20), 10);
        assert_eq!(f.n2(1000), 32);
    }
}
