//! When traffic flowed again after an event, read from the probes themselves: the
//! arrival of the first probe sent at or after the event from which on every probe
//! sent within a window arrived. An event that disturbs nothing recovers with the
//! first probe sent after it (a few ms: the path's delay); one that cuts the path
//! recovers when the first probe gets through that is followed by no loss.

use super::traffic::Probes;

/// How long the stream must stay whole after a probe for it to count as recovered.
pub const WHOLE_FOR_US: u64 = 500_000;

/// When (µs since the start) the probes of one direction flowed again after an event
/// at `at`: the arrival of the first probe sent at or after `at` that arrived and was
/// followed by every probe sent in the next [`WHOLE_FOR_US`] (as far as probes were
/// sent). `None` if that never happened.
pub fn recovered_at(p: &Probes, at: u64) -> Option<u64> {
    let first = p.sent.partition_point(|&s| s < at);
    let arrived = |i: usize| p.arrived.get(i).copied().flatten();
    let mut i = first;
    while i < p.sent.len() {
        let Some(t) = arrived(i) else {
            i += 1;
            continue;
        };
        let until = p.sent[i] + WHOLE_FOR_US;
        let hole = (i + 1..p.sent.len())
            .take_while(|&j| p.sent[j] <= until)
            .find(|&j| arrived(j).is_none());
        match hole {
            None => return Some(t),
            Some(j) => i = j + 1,
        }
    }
    None
}

/// Milliseconds from an event at `at` until both directions flowed again (`None`: one
/// did not).
pub fn recovered_ms(up: &Probes, down: &Probes, at: u64) -> Option<f64> {
    let a = recovered_at(up, at)?;
    let b = recovered_at(down, at)?;
    Some(a.max(b).saturating_sub(at) as f64 / 1000.0)
}

/// Has every probe sent in `[at, at + WHOLE_FOR_US]` of the last recovery been
/// seen through (so the run may end)? True when the last probe sent is more than
/// the window past `when`.
pub fn settled(p: &Probes, when: u64) -> bool {
    p.sent.last().is_some_and(|&l| l > when + WHOLE_FOR_US)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A probe every 10 ms for `n`, arriving 2 ms later unless lost.
    fn probes(n: usize, lost: impl Fn(usize) -> bool) -> Probes {
        Probes {
            sent: (0..n).map(|i| i as u64 * 10_000).collect(),
            arrived: (0..n)
                .map(|i| (!lost(i)).then_some(i as u64 * 10_000 + 2_000))
                .collect(),
            bad: 0,
        }
    }

    #[test]
    fn an_outage_recovers_at_the_first_probe_after_it_that_stays_whole() {
        // Lost from 1.00 s to 1.30 s, and one stray arrival inside (1.15 s).
        let p = probes(300, |i| (100..130).contains(&i) && i != 115);
        assert_eq!(recovered_at(&p, 1_000_000), Some(1_302_000));
        // An event that disturbed nothing: the next probe.
        assert_eq!(recovered_at(&p, 2_000_000), Some(2_002_000));
        // Every other probe lost for 300 ms (one of two channels), then none: the
        // first probe after the last loss (129) is the recovery.
        let p = probes(300, |i| (100..130).contains(&i) && i % 2 == 0);
        assert_eq!(recovered_at(&p, 1_000_000), Some(1_292_000));
        let q = probes(300, |_| false);
        assert_eq!(recovered_ms(&q, &p, 1_000_000), Some(292.0));
        assert_eq!(
            recovered_ms(&p, &q, 1_000_000),
            Some(292.0),
            "either direction"
        );
    }

    #[test]
    fn never_whole_again_is_none() {
        let p = probes(300, |i| i >= 100);
        assert_eq!(recovered_at(&p, 1_000_000), None);
        let q = probes(300, |_| false);
        assert_eq!(recovered_ms(&q, &p, 1_000_000), None);
        assert!(settled(&q, 2_000_000));
        assert!(!settled(&q, 2_500_000));
    }
}
