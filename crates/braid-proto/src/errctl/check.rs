//! The paper's tolerance checker (§4.2, "Checking Application Tolerance").

use super::Tolerance;

/// The state of one packet of a segment at the receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// Not received (yet).
    Missing,
    /// Received.
    Present,
    /// Not received, and accepted as lost within the tolerance: never requested.
    Tolerated,
}

/// Check `slots[..known]` (the packets known to have been sent) against `t`. A missing
/// packet that keeps the segment within (E, B) is marked [`Slot::Tolerated`]; at the
/// first one that would not, the whole run of missing packets from it on is requested
/// (fewer retransmission rounds matter more than fewer packets, §3.3), and checking
/// resumes after the run. Returns the requested packets as inclusive index ranges.
pub fn check(t: Tolerance, slots: &mut [Slot], known: usize) -> Vec<(u16, u16)> {
    let known = known.min(slots.len());
    let mut req = Vec::new();
    if t.tolerates_all() {
        for s in slots[..known].iter_mut() {
            if *s == Slot::Missing {
                *s = Slot::Tolerated;
            }
        }
        return req;
    }
    // Tolerated holes anywhere in the segment count against E, and a hole joins the
    // tolerated run on its right: a packet requested earlier may be tolerated on a later
    // check (once packets around it arrived) only if the segment still fits.
    let mut lost = slots.iter().filter(|&&s| s == Slot::Tolerated).count() as u32;
    let mut burst = 0u32;
    let mut j = 0;
    while j < known {
        match slots[j] {
            Slot::Present => burst = 0,
            Slot::Tolerated => burst += 1,
            Slot::Missing => {
                let right = slots[j + 1..]
                    .iter()
                    .take_while(|&&s| s == Slot::Tolerated)
                    .count() as u32;
                let fits = !t.full_recovery()
                    && lost < u32::from(t.e)
                    && burst + 1 + right <= u32::from(t.b);
                if fits {
                    slots[j] = Slot::Tolerated;
                    lost += 1;
                    burst += 1;
                } else {
                    let start = j;
                    while j + 1 < known && slots[j + 1] == Slot::Missing {
                        j += 1;
                    }
                    req.push((start as u16, j as u16));
                    burst = 0;
                }
            }
        }
        j += 1;
    }
    req
}

/// Do the holes in `slots` (anything not present) break the tolerance: more than E, or
/// a run longer than B?
pub fn exceeds(t: Tolerance, slots: &[Slot]) -> bool {
    let (mut lost, mut burst, mut worst) = (0u32, 0u32, 0u32);
    for s in slots {
        if *s == Slot::Present {
            burst = 0;
        } else {
            lost += 1;
            burst += 1;
            worst = worst.max(burst);
        }
    }
    lost > u32::from(t.e) || worst > u32::from(t.b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Slot::{Missing as M, Present as P, Tolerated as T};

    fn tol(w: u16, e: u16, b: u16) -> Tolerance {
        Tolerance { w, e, b }
    }

    #[test]
    fn full_recovery_requests_every_run() {
        let mut s = [P, M, M, P, M, P];
        assert_eq!(check(tol(6, 0, 0), &mut s, 6), vec![(1, 2), (4, 4)]);
        assert_eq!(s, [P, M, M, P, M, P]);
        // Only what is known to be sent is checked.
        let mut s = [P, M, M, P, M, M];
        assert_eq!(check(tol(6, 0, 0), &mut s, 4), vec![(1, 2)]);
    }

    #[test]
    fn partial_tolerance_requests_from_the_violation() {
        // (8, 2, 1): the first isolated loss is tolerated; in the burst of two, the first
        // would make a run of one (fits), the second a run of two (does not): it and the
        // rest of the burst are requested.
        let mut s = [P, M, P, M, M, P, M, P];
        let req = check(tol(8, 2, 1), &mut s, 8);
        assert_eq!(req, vec![(4, 4), (6, 6)]);
        assert_eq!(s, [P, T, P, T, M, P, M, P]);
        assert!(!exceeds(tol(8, 2, 1), &[P, T, P, T, P, P, P, P]));
        // Checking again gives the same answer.
        assert_eq!(check(tol(8, 2, 1), &mut s, 8), vec![(4, 4), (6, 6)]);
    }

    #[test]
    fn a_later_check_never_overfills_the_segment() {
        // (6, 2, 1): 0 tolerated, 1..=2 requested (a burst), 5 tolerated.
        let t = tol(6, 2, 1);
        let mut s = [M, M, M, P, P, M];
        assert_eq!(check(t, &mut s, 6), vec![(1, 2)]);
        assert_eq!(s, [T, M, M, P, P, T]);
        // Packet 1 arrives; 2 must still be requested (E is used up by 0 and 5).
        s[1] = P;
        assert_eq!(check(t, &mut s, 6), vec![(2, 2)]);
        // And a hole next to a tolerated one on its right must not lengthen the run.
        let mut s = [P, M, T, P];
        assert_eq!(check(tol(4, 3, 1), &mut s, 4), vec![(1, 1)]);
    }

    #[test]
    fn tolerate_all() {
        let mut s = [M, M, M];
        assert!(check(tol(3, 3, 3), &mut s, 3).is_empty());
        assert_eq!(s, [T, T, T]);
    }

    #[test]
    fn exceeds_counts_runs_and_totals() {
        assert!(exceeds(tol(4, 1, 1), &[M, P, M, P]));
        assert!(exceeds(tol(4, 2, 1), &[M, M, P, P]));
        assert!(!exceeds(tol(4, 2, 2), &[M, M, P, P]));
        assert!(!exceeds(tol(4, 0, 0), &[P, P, P, P]));
    }
}
