//! Channel and traffic models: what a scenario describes, in simulator units
//! (nanoseconds, bytes, bit/s, probabilities).

use crate::rng::Rng;

/// Nanoseconds of simulated time.
pub type Nanos = u64;

/// Nanoseconds per second.
pub const NS_PER_S: f64 = 1e9;

/// Seconds (float) to nanoseconds, rounded.
pub fn secs_to_ns(s: f64) -> Nanos {
    (s * NS_PER_S).round().max(0.0) as Nanos
}

/// How long the two-state loss process stays in a state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durations {
    /// Each stay lasts exactly the mean.
    Deterministic,
    /// Each stay is exponentially distributed with the mean.
    Exponential,
}

/// The two-state (good/bad) bursty loss process of seed 002, Fig. 9: loss with
/// probability `p_good` in the good state and `p_bad` in the bad state; mean state
/// durations `good_ns` and `bad_ns`. The long-run loss rate is
/// `(p_good·d_g + p_bad·d_b) / (d_g + d_b)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gilbert {
    /// Loss probability in the good state.
    pub p_good: f64,
    /// Loss probability in the bad state.
    pub p_bad: f64,
    /// Mean good-state duration.
    pub good_ns: f64,
    /// Mean bad-state duration.
    pub bad_ns: f64,
    /// Deterministic or exponential stays.
    pub durations: Durations,
}

impl Gilbert {
    /// Long-run fraction of time in the bad state.
    pub fn bad_fraction(&self) -> f64 {
        self.bad_ns / (self.good_ns + self.bad_ns)
    }

    /// Long-run loss probability of a packet sent at a uniformly random time.
    pub fn mean_loss(&self) -> f64 {
        let b = self.bad_fraction();
        self.p_good * (1.0 - b) + self.p_bad * b
    }
}

/// The running state of a [`Gilbert`] process, advanced lazily to the query time.
#[derive(Clone, Debug)]
pub struct GilbertState {
    g: Gilbert,
    bad: bool,
    until: f64,
}

impl GilbertState {
    /// Start in the stationary distribution (so no warm-up bias): bad with probability
    /// d_b/(d_g+d_b), with the residual stay of a renewal process.
    pub fn new(g: Gilbert, rng: &mut Rng) -> GilbertState {
        let bad = rng.next_f64() < g.bad_fraction();
        let mean = if bad { g.bad_ns } else { g.good_ns };
        let until = match g.durations {
            Durations::Exponential => rng.exp(mean),
            Durations::Deterministic => rng.next_f64() * mean,
        };
        GilbertState { g, bad, until }
    }

    /// Is the process in the bad state at `t` (non-decreasing across calls)?
    pub fn bad_at(&mut self, t: Nanos, rng: &mut Rng) -> bool {
        let t = t as f64;
        while t >= self.until {
            self.bad = !self.bad;
            let mean = if self.bad {
                self.g.bad_ns
            } else {
                self.g.good_ns
            };
            let stay = match self.g.durations {
                Durations::Exponential => rng.exp(mean),
                Durations::Deterministic => mean,
            };
            // A zero-length stay cannot stall the loop: means are validated > 0, and an
            // exponential draw of exactly 0 only repeats the flip.
            self.until += stay.max(1e-3);
        }
        self.bad
    }

    /// Loss probability at `t`.
    pub fn loss_at(&mut self, t: Nanos, rng: &mut Rng) -> f64 {
        if self.bad_at(t, rng) {
            self.g.p_bad
        } else {
            self.g.p_good
        }
    }
}

/// A scripted loss period on one channel: packets whose transmission starts in
/// `[start, end)` are lost with probability `loss`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossWindow {
    /// Start (inclusive).
    pub start: Nanos,
    /// End (exclusive).
    pub end: Nanos,
    /// Loss probability inside.
    pub loss: f64,
}

/// One FIFO channel.
#[derive(Clone, Debug, PartialEq)]
pub struct ChannelSpec {
    /// Serialization rate, bit/s.
    pub rate_bps: f64,
    /// Propagation delay.
    pub delay: Nanos,
    /// Extra delay drawn uniformly in `[0, jitter]`; arrivals never overtake (FIFO).
    pub jitter: Nanos,
    /// Largest datagram the channel carries; larger ones are dropped at the sender.
    pub mtu: u32,
    /// Drop-tail transmit queue: datagrams waiting behind the one on the wire.
    pub queue_packets: usize,
    /// Framing bytes added to every datagram's serialization time (not delivered).
    pub overhead_bytes: u32,
    /// Independent (Bernoulli) loss probability per datagram.
    pub loss: f64,
    /// Probability that a datagram arrives corrupted; treated as a loss (the receiver's
    /// checksum drops it), counted separately.
    pub corrupt: f64,
    /// Bursty two-state loss.
    pub gilbert: Option<Gilbert>,
    /// Scripted loss periods.
    pub loss_windows: Vec<LossWindow>,
    /// Periods in which the link is down: everything sent is lost.
    pub down: Vec<(Nanos, Nanos)>,
    /// Scripted changes of rate and delay, in time order: from `at` on, the link has
    /// the new rate (serializations that start then) and the new delay (datagrams
    /// that leave then; arrivals stay in FIFO order).
    pub changes: Vec<LinkChange>,
}

/// A scripted change of a channel ([`ChannelSpec::changes`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkChange {
    /// When.
    pub at: Nanos,
    /// The new rate, bit/s, if it changes.
    pub rate_bps: Option<f64>,
    /// The new propagation delay, if it changes.
    pub delay: Option<Nanos>,
}

impl ChannelSpec {
    /// The rate in force at `t`.
    pub fn rate_at(&self, t: Nanos) -> f64 {
        self.changes
            .iter()
            .filter(|c| c.at <= t)
            .filter_map(|c| c.rate_bps)
            .next_back()
            .unwrap_or(self.rate_bps)
    }

    /// The propagation delay in force at `t`.
    pub fn delay_at(&self, t: Nanos) -> Nanos {
        self.changes
            .iter()
            .filter(|c| c.at <= t)
            .filter_map(|c| c.delay)
            .next_back()
            .unwrap_or(self.delay)
    }

    /// A lossless channel of `rate_bps` with default settings.
    pub fn new(rate_bps: f64) -> ChannelSpec {
        ChannelSpec {
            rate_bps,
            delay: 0,
            jitter: 0,
            mtu: 65_535,
            queue_packets: 64,
            overhead_bytes: 0,
            loss: 0.0,
            corrupt: 0.0,
            gilbert: None,
            loss_windows: Vec::new(),
            down: Vec::new(),
            changes: Vec::new(),
        }
    }
}

/// Why a datagram did not arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// It arrives.
    Delivered,
    /// Lost on the channel (Bernoulli, Gilbert, scripted window or link down).
    Lost,
    /// Corrupted on the channel (dropped by the receiver's checksum).
    Corrupted,
}

/// Decides the fate of each datagram put on a channel.
#[derive(Clone, Debug)]
pub struct LossModel {
    rng: Rng,
    loss: f64,
    corrupt: f64,
    gilbert: Option<GilbertState>,
    windows: Vec<LossWindow>,
    down: Vec<(Nanos, Nanos)>,
}

impl LossModel {
    /// The model of `spec`, drawing from `rng`.
    pub fn new(spec: &ChannelSpec, mut rng: Rng) -> LossModel {
        let gilbert = spec.gilbert.map(|g| GilbertState::new(g, &mut rng));
        LossModel {
            rng,
            loss: spec.loss,
            corrupt: spec.corrupt,
            gilbert,
            windows: spec.loss_windows.clone(),
            down: spec.down.clone(),
        }
    }

    /// Is the link down at `t`?
    pub fn is_down(&self, t: Nanos) -> bool {
        self.down.iter().any(|&(a, b)| t >= a && t < b)
    }

    /// The fate of a datagram whose transmission starts at `t` (non-decreasing).
    #[inline]
    pub fn fate(&mut self, t: Nanos) -> Fate {
        if !self.down.is_empty() && self.is_down(t) {
            return Fate::Lost;
        }
        let mut lost = false;
        for w in &self.windows {
            if t >= w.start && t < w.end && self.rng.chance(w.loss) {
                lost = true;
            }
        }
        if let Some(g) = &mut self.gilbert {
            let p = g.loss_at(t, &mut self.rng);
            if self.rng.chance(p) {
                lost = true;
            }
        }
        if self.rng.chance(self.loss) {
            lost = true;
        }
        if lost {
            return Fate::Lost;
        }
        if self.rng.chance(self.corrupt) {
            return Fate::Corrupted;
        }
        Fate::Delivered
    }
}

/// How packet sizes are drawn (bytes as handed to the striper).
#[derive(Clone, Debug, PartialEq)]
pub enum Sizes {
    /// Always this size.
    Fixed(u32),
    /// Cycle through the list: 1000, 200, 1000, 200, ...
    Cycle(Vec<u32>),
    /// Uniform integer in `[min, max]`.
    Uniform {
        /// Smallest.
        min: u32,
        /// Largest.
        max: u32,
    },
    /// `small` with probability `p_small`, else `large`.
    Bimodal {
        /// Small size.
        small: u32,
        /// Large size.
        large: u32,
        /// Probability of the small size.
        p_small: f64,
    },
    /// Weighted choice among sizes (the "imix" preset is 40/576/1500 bytes at 7:4:1).
    Mix(Vec<(u32, f64)>),
}

impl Sizes {
    /// The simple Internet mix: 40, 576 and 1500 bytes in proportion 7:4:1.
    pub fn imix() -> Sizes {
        Sizes::Mix(vec![(40, 7.0), (576, 4.0), (1500, 1.0)])
    }

    /// Smallest and largest size this can produce.
    pub fn range(&self) -> (u32, u32) {
        match self {
            Sizes::Fixed(s) => (*s, *s),
            Sizes::Cycle(v) => (
                v.iter().copied().min().unwrap_or(0),
                v.iter().copied().max().unwrap_or(0),
            ),
            Sizes::Uniform { min, max } => (*min, *max),
            Sizes::Bimodal { small, large, .. } => (*small.min(large), *small.max(large)),
            Sizes::Mix(v) => (
                v.iter().map(|x| x.0).min().unwrap_or(0),
                v.iter().map(|x| x.0).max().unwrap_or(0),
            ),
        }
    }

    /// Mean size in bytes.
    pub fn mean(&self) -> f64 {
        match self {
            Sizes::Fixed(s) => f64::from(*s),
            Sizes::Cycle(v) => v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64,
            Sizes::Uniform { min, max } => (f64::from(*min) + f64::from(*max)) / 2.0,
            Sizes::Bimodal {
                small,
                large,
                p_small,
            } => p_small * f64::from(*small) + (1.0 - p_small) * f64::from(*large),
            Sizes::Mix(v) => {
                let w: f64 = v.iter().map(|x| x.1).sum();
                v.iter().map(|x| f64::from(x.0) * x.1).sum::<f64>() / w
            }
        }
    }
}

/// A running size generator.
#[derive(Clone, Debug)]
pub struct SizeGen {
    sizes: Sizes,
    idx: usize,
    cum: Vec<f64>,
}

impl SizeGen {
    /// Start generating `sizes`.
    pub fn new(sizes: Sizes) -> SizeGen {
        let cum = match &sizes {
            Sizes::Mix(v) => {
                let total: f64 = v.iter().map(|x| x.1).sum();
                let mut acc = 0.0;
                v.iter()
                    .map(|x| {
                        acc += x.1 / total;
                        acc
                    })
                    .collect()
            }
            _ => Vec::new(),
        };
        SizeGen { sizes, idx: 0, cum }
    }

    /// Mean of the distribution.
    pub fn mean(&self) -> f64 {
        self.sizes.mean()
    }

    /// The next size.
    #[inline]
    pub fn next(&mut self, rng: &mut Rng) -> u32 {
        match &self.sizes {
            Sizes::Fixed(s) => *s,
            Sizes::Cycle(v) => {
                let s = v[self.idx];
                self.idx += 1;
                if self.idx == v.len() {
                    self.idx = 0;
                }
                s
            }
            Sizes::Uniform { min, max } => min + rng.upto(u64::from(max - min)) as u32,
            Sizes::Bimodal {
                small,
                large,
                p_small,
            } => {
                if rng.next_f64() < *p_small {
                    *small
                } else {
                    *large
                }
            }
            Sizes::Mix(v) => {
                let u = rng.next_f64();
                let i = self.cum.iter().position(|&c| u < c).unwrap_or(v.len() - 1);
                v[i].0
            }
        }
    }
}

/// When packets are offered to the striper.
#[derive(Clone, Debug, PartialEq)]
pub enum Arrivals {
    /// Always a packet ready: the sender blocks while the channel the scheduler picks
    /// next has a full transmit queue, like a process writing to a kernel interface.
    Backlogged,
    /// Constant rate: `Bits(r)` spaces packets by their own size at `r` bit/s;
    /// `Pps(r)` sends `r` packets per second.
    Cbr(Rate),
    /// Poisson arrivals at this mean rate.
    Poisson(Rate),
    /// Replay of a trace: (time since start, size) per packet, time non-decreasing.
    Trace(Vec<(Nanos, u32)>),
    /// A closed-loop TCP-like flow ([`crate::tcp`]): segments of the fixed size, sent
    /// as its windows allow, acknowledged by the receiver after a delay.
    Tcp(TcpSpec),
}

/// A traffic rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rate {
    /// Bits per second of payload.
    Bits(f64),
    /// Packets per second.
    Pps(f64),
}

/// The traffic source of a scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct TrafficSpec {
    /// Arrival process.
    pub arrivals: Arrivals,
    /// Sizes (ignored for traces, which carry their own).
    pub sizes: Sizes,
    /// When the source starts.
    pub start: Nanos,
}

/// Parse a trace file: one `time_s,size_bytes` per line; blank lines and lines starting
/// with `#` are skipped, and so is a first line that is a header (`time,size`).
pub fn parse_trace(text: &str) -> Result<Vec<(Nanos, u32)>, String> {
    let mut out = Vec::new();
    let mut last = 0;
    for (i, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let mut parts = l.split(',').map(str::trim);
        let (Some(t), Some(s)) = (parts.next(), parts.next()) else {
            return Err(format!(
                "line {}: expected 'time_s,size_bytes', found '{l}'",
                i + 1
            ));
        };
        if parts.next().is_some() {
            return Err(format!(
                "line {}: expected two columns 'time_s,size_bytes', found '{l}'",
                i + 1
            ));
        }
        let tv = t.parse::<f64>();
        let sv = s.parse::<u32>();
        if out.is_empty() && tv.is_err() && sv.is_err() {
            continue; // header
        }
        let tv = tv
            .ok()
            .filter(|x| x.is_finite() && *x >= 0.0)
            .ok_or_else(|| {
                format!(
                    "line {}: time '{t}' is not a non-negative number of seconds",
                    i + 1
                )
            })?;
        let sv =
            sv.map_err(|_| format!("line {}: size '{s}' is not a whole number of bytes", i + 1))?;
        let ns = secs_to_ns(tv);
        if ns < last {
            return Err(format!(
                "line {}: time {tv} s is earlier than the line before; traces must be in time order",
                i + 1
            ));
        }
        last = ns;
        out.push((ns, sv));
    }
    if out.is_empty() {
        return Err("the trace holds no packets".into());
    }
    Ok(out)
}

/// The smallest packet the TCP source can send: a 20-byte IPv4 header, then the
/// transmission id, the send time and the segment number, 8 bytes each.
pub const MIN_TCP_PACKET: u32 = 44;

/// Congestion control.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Cc {
    /// CUBIC (RFC 8312), with HyStart's delay exit from slow start when `hystart`.
    Cubic,
    /// Reno AIMD: +1 segment per window, halve on congestion.
    Reno,
}

impl Cc {
    /// The name as in scenario files.
    pub fn name(self) -> &'static str {
        match self {
            Cc::Cubic => "cubic",
            Cc::Reno => "reno",
        }
    }
}

/// The TCP source's settings (`[traffic]` keys of `source = "tcp"`).
#[derive(Clone, Debug, PartialEq)]
pub struct TcpSpec {
    /// Congestion control.
    pub cc: Cc,
    /// Bytes of each packet that are headers (IP + TCP + options), not goodput.
    pub header_bytes: u32,
    /// Delay of the acknowledgements from receiver to sender.
    pub ack_delay: AckDelay,
    /// For this long from the flow's start the acknowledgements take the slowest
    /// channel's delay instead (the tunnel's return path cuts over only after its hold).
    pub ack_slowest_for: Nanos,
    /// Receive window, segments.
    pub rwnd: u32,
    /// Initial congestion window, segments.
    pub init_cwnd: u32,
    /// Lower bound of the retransmission timeout's variance term.
    pub min_rto: Nanos,
    /// CUBIC only: HyStart's delay exit from slow start.
    pub hystart: bool,
    /// Send ECN-capable packets (ECT(0)). Without, the AQM drops instead of marking.
    pub ecn: bool,
}

impl Default for TcpSpec {
    fn default() -> Self {
        TcpSpec {
            cc: Cc::Cubic,
            header_bytes: 52,
            ack_delay: AckDelay::Fastest,
            ack_slowest_for: 0,
            rwnd: 4096,
            init_cwnd: 10,
            min_rto: 200_000_000,
            hystart: true,
            ecn: true,
        }
    }
}

/// How long an acknowledgement takes from the receiver back to the sender (a fixed
/// delay, no loss, no queue).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckDelay {
    /// The smallest one-way delay of the run's channels at the start (the default: a
    /// return path as good as the best link).
    Fastest,
    /// The largest (a return path through a bond whose receiver equalizes delays).
    Slowest,
    /// This delay.
    Fixed(Nanos),
}

impl AckDelay {
    /// The delay for a run over `channels`.
    pub fn resolve(self, channels: &[ChannelSpec]) -> Nanos {
        let d = channels.iter().map(|c| c.delay);
        match self {
            AckDelay::Fastest => d.min().unwrap_or(0),
            AckDelay::Slowest => d.max().unwrap_or(0),
            AckDelay::Fixed(n) => n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycle_alternates() {
        let mut g = SizeGen::new(Sizes::Cycle(vec![1000, 200]));
        let mut r = Rng::stream(1, 1);
        let v: Vec<u32> = (0..5).map(|_| g.next(&mut r)).collect();
        assert_eq!(v, vec![1000, 200, 1000, 200, 1000]);
    }

    #[test]
    fn imix_mean_matches_draws() {
        let s = Sizes::imix();
        let mut g = SizeGen::new(s.clone());
        let mut r = Rng::stream(3, 1);
        let n = 200_000;
        let sum: f64 = (0..n).map(|_| f64::from(g.next(&mut r))).sum();
        let m = sum / n as f64;
        assert!(
            (m - s.mean()).abs() / s.mean() < 0.01,
            "{m} vs {}",
            s.mean()
        );
    }

    #[test]
    fn trace_parsing() {
        let t = parse_trace("time,size\n0.0,100\n# c\n0.5, 200\n").unwrap();
        assert_eq!(t, vec![(0, 100), (500_000_000, 200)]);
        assert!(parse_trace("0.5,100\n0.1,100")
            .unwrap_err()
            .contains("line 2"));
        assert!(parse_trace("0.5,abc").unwrap_err().contains("size 'abc'"));
        assert!(parse_trace("").is_err());
    }

    #[test]
    fn scripted_window_only_inside() {
        let mut c = ChannelSpec::new(1e6);
        c.loss_windows.push(LossWindow {
            start: 100,
            end: 200,
            loss: 1.0,
        });
        let mut m = LossModel::new(&c, Rng::stream(1, 1));
        assert_eq!(m.fate(99), Fate::Delivered);
        assert_eq!(m.fate(100), Fate::Lost);
        assert_eq!(m.fate(199), Fate::Lost);
        assert_eq!(m.fate(200), Fate::Delivered);
    }
}
