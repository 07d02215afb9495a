//! One parser per unit and name, used by the tunnel configuration, simulator scenarios,
//! lab link specifications and command-line flags alike, so the same spelling works
//! everywhere (`docs/units.md` lists them).
//!
//! | what | spellings |
//! |---|---|
//! | duration | a number and a unit: `ns`, `us`, `ms`, `s`, `m`, `h` (`250us`, `1.5s`, `2m`) |
//! | rate | bits per second: a number and `bit`, `kbit`, `mbit`, `gbit` (as tc), or `bps`, `kbps`, `mbps`, `gbps`, or `K`, `M`, `G`; a bare number is bit/s |
//! | scheduler | `srr`, `rr` (also `brr`, as in seed 001), `grr`, `random`; baselines `sqf`, `hash` |
//! | marker position | `start`, `end`, `channel:N` (also just `N`) |
//! | receiver mode | `none`, `logical`, `seq`, `trr` |

use crate::config::{MarkerPosition, Mode, Policy};
use crate::sched::baseline::BaselineKind;
use crate::sched::SchedulerKind;

/// A value that does not parse: what it should have been, with an example.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{input}' is not {what}: expected {expected}")]
pub struct UnitError {
    /// The text given.
    pub input: String,
    /// What was expected, with an article ("a duration").
    pub what: &'static str,
    /// The accepted forms, with examples.
    pub expected: &'static str,
}

fn error(input: &str, what: &'static str, expected: &'static str) -> UnitError {
    UnitError {
        input: input.to_string(),
        what,
        expected,
    }
}

/// Split `12.5ms` into `12.5` and `ms`.
fn number_and_unit(s: &str) -> Option<(f64, &str)> {
    let i = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (n, u) = s.split_at(i);
    let v: f64 = n.parse().ok()?;
    v.is_finite().then_some((v, u.trim()))
}

const DURATION: &str = "a number and a unit: ns, us, ms, s, m or h (e.g. 250us, 50ms, 1.5s, 2m)";

/// A duration such as `50ms`, `1.5s`, `250us`, `2m`. Zero is allowed (`0s`); callers
/// that need more say so.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, UnitError> {
    let t = s.trim();
    let bad = || error(t, "a duration", DURATION);
    let (v, unit) = number_and_unit(t).ok_or_else(bad)?;
    let secs_per_unit = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err(bad()),
    };
    let secs = v * secs_per_unit;
    // Anything longer than a year is a mistake (and would overflow the core's clock
    // arithmetic far later than that).
    if !(0.0..=3.2e7).contains(&secs) {
        return Err(bad());
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

/// The same, in the core's microseconds.
pub fn parse_duration_us(s: &str) -> Result<crate::time::Duration, UnitError> {
    let d = parse_duration(s)?;
    Ok(crate::time::Duration::from_micros(d.as_micros() as u64))
}

const RATE: &str = "bits per second: a number and bit, kbit, mbit, gbit (as tc), kbps, mbps, gbps, or K, M, G (e.g. 100mbit, 50M, 1.5gbit)";

/// A rate in bits per second, such as `100mbit` (tc's spelling), `50M`, `1.5gbps`. A
/// bare number is bit/s. Must be above zero.
pub fn parse_rate(s: &str) -> Result<u64, UnitError> {
    let t = s.trim();
    let bad = || error(t, "a rate", RATE);
    let (v, unit) = number_and_unit(t).ok_or_else(bad)?;
    let mult = match unit.to_ascii_lowercase().as_str() {
        "" | "bit" | "bps" => 1.0,
        "k" | "kbit" | "kbps" => 1e3,
        "m" | "mbit" | "mbps" => 1e6,
        "g" | "gbit" | "gbps" => 1e9,
        _ => return Err(bad()),
    };
    let bps = v * mult;
    if !(1.0..1e15).contains(&bps) {
        return Err(bad());
    }
    Ok(bps.round() as u64)
}

const SCHEDULER: &str = "srr, rr (or brr), grr or random";

/// A causal scheduler: `srr`, `rr` (or `brr`), `grr`, `random` (seed 0: set it where the
/// ends share one).
pub fn parse_scheduler(s: &str) -> Result<SchedulerKind, UnitError> {
    match parse_policy(s) {
        Ok(Policy::Causal(k)) => Ok(k),
        // The baselines pick channels from what only the sender knows: no receiver can
        // follow them, so a session (tunnel, bench, send/recv) cannot use them.
        Ok(Policy::Baseline(_)) => Err(error(
            s.trim(),
            "a causal scheduler",
            "srr, rr (or brr), grr or random; sqf and hash are baselines for `braid sim` and `braid schedule` only (their choices depend on what only the sender knows, so the receiver cannot resequence them)",
        )),
        _ => Err(error(s.trim(), "a causal scheduler", SCHEDULER)),
    }
}

/// A scheduler, causal or a non-causal baseline (`sqf`, `hash`; receiver mode `none`
/// only).
pub fn parse_policy(s: &str) -> Result<Policy, UnitError> {
    Ok(match s.trim() {
        "srr" => Policy::Causal(SchedulerKind::Srr),
        "rr" | "brr" => Policy::Causal(SchedulerKind::Rr),
        "grr" => Policy::Causal(SchedulerKind::Grr),
        "random" => Policy::Causal(SchedulerKind::Random { seed: 0 }),
        "sqf" => Policy::Baseline(BaselineKind::ShortestQueue),
        "hash" => Policy::Baseline(BaselineKind::Hash),
        t => {
            return Err(error(
                t,
                "a scheduler",
                "srr, rr (or brr), grr, random, or the baselines sqf and hash",
            ))
        }
    })
}

/// Where markers go in the round: `start`, `end`, or `channel:N` / `N` (just before
/// channel N's visit; N below `channels`).
pub fn parse_marker_position(s: &str, channels: usize) -> Result<MarkerPosition, UnitError> {
    let t = s.trim();
    let bad = || {
        error(
            t,
            "a marker position",
            "start, end, or channel:N with N a channel index (e.g. channel:1)",
        )
    };
    match t {
        "start" => Ok(MarkerPosition::Start),
        "end" => Ok(MarkerPosition::End),
        _ => {
            let n = t.strip_prefix("channel:").unwrap_or(t);
            match n.parse::<usize>() {
                Ok(c) if c < channels => Ok(MarkerPosition::Channel(c)),
                _ => Err(bad()),
            }
        }
    }
}

/// A receiver mode: `none`, `logical`, `seq`, `trr`.
pub fn parse_mode(s: &str) -> Result<Mode, UnitError> {
    Mode::from_name(s.trim())
        .ok_or_else(|| error(s.trim(), "a receiver mode", "none, logical, seq or trr"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration(" 2m "), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("500ns"), Ok(Duration::from_nanos(500)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["50", "ms", "5 parsecs", "-1s", "1e400s", "NaNs", "", "2y"] {
            let e = parse_duration(bad).unwrap_err().to_string();
            assert!(e.contains("a duration") && e.contains("50ms"), "{bad}: {e}");
        }
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("100mbit"), Ok(100_000_000));
        assert_eq!(parse_rate("100Mbit"), Ok(100_000_000));
        assert_eq!(parse_rate("50M"), Ok(50_000_000));
        assert_eq!(parse_rate("1.5gbps"), Ok(1_500_000_000));
        assert_eq!(parse_rate("512kbit"), Ok(512_000));
        assert_eq!(parse_rate("9600"), Ok(9600));
        for bad in ["fast", "0mbit", "-5M", "10 furlongs", "", "1e30gbit"] {
            let e = parse_rate(bad).unwrap_err().to_string();
            assert!(e.contains("a rate") && e.contains("100mbit"), "{bad}: {e}");
        }
    }

    #[test]
    fn schedulers_positions_modes() {
        assert_eq!(parse_scheduler("brr"), Ok(SchedulerKind::Rr));
        assert_eq!(
            parse_scheduler("random"),
            Ok(SchedulerKind::Random { seed: 0 })
        );
        for b in ["sqf", "hash"] {
            let e = parse_scheduler(b).unwrap_err().to_string();
            assert!(e.contains("causal") && e.contains("braid sim"), "{e}");
        }
        assert!(!parse_scheduler("fifo")
            .unwrap_err()
            .to_string()
            .contains("braid sim"));
        assert_eq!(
            parse_policy("hash"),
            Ok(Policy::Baseline(BaselineKind::Hash))
        );
        assert!(parse_policy("fifo").is_err());
        assert_eq!(parse_marker_position("end", 2), Ok(MarkerPosition::End));
        assert_eq!(
            parse_marker_position("channel:1", 2),
            Ok(MarkerPosition::Channel(1))
        );
        assert_eq!(
            parse_marker_position("1", 2),
            Ok(MarkerPosition::Channel(1))
        );
        let e = parse_marker_position("channel:2", 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("channel:N"), "{e}");
        assert_eq!(parse_mode("seq"), Ok(Mode::Seq));
        assert!(parse_mode("fast")
            .unwrap_err()
            .to_string()
            .contains("logical"));
    }
}
