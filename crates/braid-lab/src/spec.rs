//! Link specifications: `RATE/DELAY[/LOSS][/jJITTER][/v6]`.
//!
//! * RATE: `100mbit`, `1.5gbit`, `512kbit` (bits per second);
//! * DELAY: one-way propagation delay, `5ms`, `250us`, `0ms`;
//! * LOSS (optional): `1%` random (Bernoulli) loss, or `ge:P%:B` bursty loss from a
//!   two-state good/bad (Gilbert–Elliott) process with average loss `P` % and mean burst
//!   length `B` packets (every packet in the bad state is lost);
//! * JITTER (optional): `j2ms`, extra delay uniform in `[0, 2ms]`; the link stays FIFO.
//! * `v6` (optional): what the bench sends over this link (its braid channel, its flow
//!   of the ceiling, the link alone) uses the link's IPv6 addresses. Every link carries
//!   both families; without `v6` they use IPv4. `50mbit/10ms,50mbit/10ms/v6` is a bond
//!   of an IPv4 and an IPv6 channel.
//!
//! Several links are separated by commas: `100mbit/5ms,50mbit/20ms,20mbit/60ms/1%`.

use std::fmt;
use std::time::Duration;

/// Loss on one link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Loss {
    /// No loss.
    None,
    /// Each packet is lost with this probability.
    Random(f64),
    /// Good/bad two-state process: lost in the bad state; `p_gb` and `p_bg` are the
    /// per-packet probabilities of entering and leaving the bad state.
    GilbertElliott {
        /// Good to bad, per packet.
        p_gb: f64,
        /// Bad to good, per packet.
        p_bg: f64,
    },
}

impl Loss {
    /// Long-run fraction of packets lost.
    pub fn average(&self) -> f64 {
        match *self {
            Loss::None => 0.0,
            Loss::Random(p) => p,
            Loss::GilbertElliott { p_gb, p_bg } => p_gb / (p_gb + p_bg),
        }
    }
}

/// One emulated link.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkSpec {
    /// Rate in bits per second (applied with `tbf`).
    pub rate_bps: u64,
    /// One-way delay, applied in each direction.
    pub delay: Duration,
    /// Extra random delay, uniform in `[0, jitter]`.
    pub jitter: Duration,
    /// Loss process, applied in the forward direction (client to server).
    pub loss: Loss,
    /// The bench's traffic on this link uses IPv6 (`/v6`).
    pub ipv6: bool,
    /// The text it was parsed from.
    pub text: String,
}

/// A link specification that could not be parsed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("link '{spec}': {reason}")]
pub struct SpecError {
    /// The offending link text.
    pub spec: String,
    /// What is wrong.
    pub reason: String,
}

fn err(spec: &str, reason: impl Into<String>) -> SpecError {
    SpecError {
        spec: spec.to_string(),
        reason: reason.into(),
    }
}

/// A link rate: braid's rate spelling ([`braid_proto::units::parse_rate`]), at least
/// 8 kbit/s (tbf's practical floor).
fn parse_rate(s: &str) -> Option<u64> {
    braid_proto::units::parse_rate(s)
        .ok()
        .filter(|&r| r >= 8000)
}

/// A delay or jitter: braid's duration spelling, below 10 000 s.
fn parse_duration(s: &str) -> Option<Duration> {
    braid_proto::units::parse_duration(s)
        .ok()
        .filter(|d| d.as_secs() < 10_000)
}

fn parse_percent(s: &str) -> Option<f64> {
    let p: f64 = s.strip_suffix('%')?.parse().ok()?;
    (0.0..=100.0).contains(&p).then_some(p / 100.0)
}

/// The bursty loss part `p` (`ge:P%:B`, `ge` the text after `ge:`) of link `text`: the
/// Gilbert–Elliott process with average loss P % (below 100) and mean burst B packets
/// (at least 1); no loss for 0 %.
fn parse_bursty_loss(text: &str, p: &str, ge: &str) -> Result<Loss, SpecError> {
    let (avg, burst) = ge
        .split_once(':')
        .ok_or_else(|| err(text, format!("bad bursty loss '{p}': expected ge:P%:B")))?;
    let avg = parse_percent(avg)
        .filter(|a| *a < 1.0)
        .ok_or_else(|| err(text, format!("bad average loss '{avg}' in '{p}'")))?;
    let burst: f64 = burst
        .parse()
        .ok()
        .filter(|b: &f64| *b >= 1.0)
        .ok_or_else(|| {
            err(
                text,
                format!("bad mean burst '{burst}' in '{p}' (packets, >= 1)"),
            )
        })?;
    let p_bg = 1.0 / burst;
    let p_gb = avg * p_bg / (1.0 - avg);
    Ok(if avg == 0.0 {
        Loss::None
    } else {
        Loss::GilbertElliott { p_gb, p_bg }
    })
}

impl LinkSpec {
    /// Parse one link.
    pub fn parse(text: &str) -> Result<LinkSpec, SpecError> {
        let text = text.trim();
        let mut parts = text.split('/');
        let rate = parts
            .next()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| err(text, "empty link specification"))?;
        let rate_bps = parse_rate(rate).ok_or_else(|| {
            err(
                text,
                format!(
                    "bad rate '{rate}': expected e.g. 100mbit, 512kbit, 1gbit (at least 8kbit)"
                ),
            )
        })?;
        let delay = match parts.next() {
            Some(d) => parse_duration(d)
                .ok_or_else(|| err(text, format!("bad delay '{d}': expected e.g. 5ms, 250us")))?,
            None => Duration::ZERO,
        };
        let mut loss = Loss::None;
        let mut jitter = Duration::ZERO;
        let mut ipv6 = false;
        for p in parts {
            if p == "v6" {
                ipv6 = true;
            } else if let Some(j) = p.strip_prefix('j') {
                jitter = parse_duration(j)
                    .ok_or_else(|| err(text, format!("bad jitter '{p}': expected e.g. j2ms")))?;
            } else if let Some(ge) = p.strip_prefix("ge:") {
                loss = parse_bursty_loss(text, p, ge)?;
            } else {
                let l = parse_percent(p).ok_or_else(|| {
                    err(text, format!("unknown part '{p}': expected a loss like 1%, ge:2%:5, a jitter like j2ms or v6"))
                })?;
                loss = if l == 0.0 {
                    Loss::None
                } else {
                    Loss::Random(l)
                };
            }
        }
        Ok(LinkSpec {
            rate_bps,
            delay,
            jitter,
            loss,
            ipv6,
            text: text.to_string(),
        })
    }

    /// Parse a comma-separated list of links (1 to 16).
    pub fn parse_list(text: &str) -> Result<Vec<LinkSpec>, SpecError> {
        let links: Vec<LinkSpec> = text
            .split(',')
            .map(LinkSpec::parse)
            .collect::<Result<_, _>>()?;
        if links.len() > 16 {
            return Err(err(text, "at most 16 links"));
        }
        Ok(links)
    }
}

/// What a scripted change does to a link ([`Change`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// From now on the link is this (rate, delay, loss and jitter).
    To(LinkSpec),
    /// The link goes down: everything on it is lost, both ways.
    Down,
    /// The link comes back, as it was before it went down.
    Up,
}

/// A scripted change of one link at a time into a measurement: `AT:LINK:WHAT`, where
/// AT is a time like `5s` or `2500ms`, LINK the link's index, and WHAT a link
/// specification (`33mbit/5ms`), `down` or `up`. Example: `5s:0:33mbit/5ms`.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    /// Time from the start of the measurement.
    pub at: Duration,
    /// Index of the link.
    pub link: usize,
    /// What happens.
    pub action: Action,
    /// The text it was parsed from.
    pub text: String,
}

impl Change {
    /// Parse `AT:LINK:WHAT` for a lab of `links` links.
    pub fn parse(text: &str, links: usize) -> Result<Change, SpecError> {
        let mut parts = text.splitn(3, ':');
        let (Some(at), Some(link), Some(what)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(err(
                text,
                "expected AT:LINK:WHAT, e.g. 5s:0:33mbit/5ms or 5s:1:down",
            ));
        };
        let at = braid_proto::units::parse_duration(at.trim())
            .map_err(|e| err(text, format!("bad time '{at}': {e}")))?;
        let link: usize = link
            .trim()
            .parse()
            .map_err(|_| err(text, format!("bad link index '{link}'")))?;
        if link >= links {
            return Err(err(
                text,
                format!("link {link} does not exist (there are {links}, from 0)"),
            ));
        }
        let action = match what.trim() {
            "down" => Action::Down,
            "up" => Action::Up,
            spec => {
                let to = LinkSpec::parse(spec)?;
                if to.ipv6 {
                    return Err(err(
                        text,
                        "a change keeps the link's address family: drop '/v6'",
                    ));
                }
                Action::To(to)
            }
        };
        Ok(Change {
            at,
            link,
            action,
            text: text.to_string(),
        })
    }
}

impl fmt::Display for LinkSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_parse_and_say_what_is_wrong() {
        let c = Change::parse("5s:1:33mbit/5ms/1%", 3).unwrap();
        assert_eq!((c.at, c.link), (Duration::from_secs(5), 1));
        assert!(matches!(c.action, Action::To(ref l) if l.rate_bps == 33_000_000));
        assert_eq!(
            Change::parse("2500ms:0:down", 1).unwrap().action,
            Action::Down
        );
        assert_eq!(Change::parse("7s:0:up", 1).unwrap().action, Action::Up);
        for (bad, what) in [
            ("5s:3:down", "does not exist"),
            ("5s:x:down", "bad link index"),
            ("soon:0:down", "bad time"),
            ("5s:0", "AT:LINK:WHAT"),
            ("5s:0:fast", "link 'fast'"),
        ] {
            let e = Change::parse(bad, 3).unwrap_err().to_string();
            assert!(e.contains(what), "{bad}: {e}");
        }
    }

    #[test]
    fn parses_the_issue_example() {
        let l = LinkSpec::parse_list("100mbit/5ms,50mbit/20ms,20mbit/60ms/1%").unwrap();
        assert_eq!(l.len(), 3);
        assert_eq!(l[0].rate_bps, 100_000_000);
        assert_eq!(l[1].delay, Duration::from_millis(20));
        assert_eq!(l[2].loss, Loss::Random(0.01));
        assert_eq!(l[0].loss, Loss::None);
    }

    #[test]
    fn bursty_loss_and_jitter() {
        let l = LinkSpec::parse("10mbit/1ms/ge:2%:5/j3ms").unwrap();
        assert!((l.loss.average() - 0.02).abs() < 1e-12);
        assert_eq!(l.jitter, Duration::from_millis(3));
        assert!(!l.ipv6);
    }

    #[test]
    fn v6_marks_a_link_for_ipv6_and_only_in_a_link() {
        let l = LinkSpec::parse_list("50mbit/10ms,50mbit/10ms/v6").unwrap();
        assert!(!l[0].ipv6);
        assert!(l[1].ipv6);
        assert_eq!(l[1].delay, Duration::from_millis(10));
        let e = Change::parse("5s:1:10mbit/10ms/v6", 2).unwrap_err();
        assert!(e.reason.contains("address family"), "{e}");
    }

    #[test]
    fn errors_name_the_link_and_part() {
        let e = LinkSpec::parse_list("100mbit/5ms,fast/1ms").unwrap_err();
        assert!(e.to_string().contains("'fast/1ms'"), "{e}");
        assert!(LinkSpec::parse("10mbit/5parsecs")
            .unwrap_err()
            .reason
            .contains("delay"));
        assert!(LinkSpec::parse("10mbit/5ms/150%").is_err());
        assert!(LinkSpec::parse("").is_err());
    }
}
