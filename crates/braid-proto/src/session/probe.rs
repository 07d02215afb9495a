//! Capacity probes: each channel's rate, measured when it comes up, for pacing
//! (`pace = "auto"`, issue 11).
//!
//! Adaptive pacing follows a link whose rate falls below its pace, but it cannot find a
//! rate nobody configured: an unpaced channel shows a queue only once a flow overfills
//! it, and the first such queue is slow start's overflow, seen while the link still
//! carries a fraction of its rate (`docs/reproducing.md`). A configured rate far above
//! the link's has the same problem: the flow's first bursts overfill the link before
//! the controller has seen a queue, and the flow leaves slow start early.
//!
//! So the sender measures before it needs the rate. When a channel comes up (the peer
//! hears us on it and we hear the peer), it sends a *train*: [`TRAIN_LEN`] datagrams of
//! the channel's largest size, back to back. The link's bottleneck spaces them at its
//! rate once its burst allowance is spent (a token bucket lets the first few through at
//! once), so the receiver times the later half of the datagrams that arrived: the bytes
//! that arrived after the half's first clock reading, over the time to its last. It
//! reports that in a
//! probe report (`wire::session`, kinds 6 and 7), once the train's last datagram arrived
//! or [`REPORT_AFTER`] after the latest one. The sender turns it into a rate on the
//! wire, counting the bytes below each datagram as its pacer does, and paces the
//! channel at [`PACE_SHARE`] of it (or at its configured rate, if that is lower). With
//! adaptive weights the measured rate is also the most the controller probes back up
//! to (`session::adapt`).
//!
//! A train that gets no report within [`RETRY_AFTER`] is sent again, at most
//! [`MAX_TRAINS`] times; then the channel keeps its configured pace (or none). So is a
//! train that cannot be timed: its later half arrived within [`MIN_SPAN`] (or in one
//! clock reading), too short a time for the receiver's clock readings, taken when its
//! reads are scheduled, to time: the span would say how the reads were scheduled, not how
//! fast the link is. That is what a link much faster than a train can show looks like (an
//! unshaped veth pair measured 0.6 or 5.9 Gbit/s or nothing from one run to the next, and
//! the channel was paced at that), and a rate from it would pace the channel at random.
//! The train's datagrams leave one per send ([`super::DatagramKind::Probe`]: not batched
//! into one GSO send, which a shaper passes whole, so the link spaces each datagram and
//! the receiver has one reading per datagram to time, not two or three). Every outcome
//! is an event (measured, capped by the configured pace, failed and why) and the
//! channel's [`ProbeState`] is in its stats. A channel
//! that goes down is measured again when it comes back, and every channel when the
//! peer restarts. A link may also get faster than it was measured: a channel that uses
//! all of its measured rate without a queue (`Adapt::capped` in `session::adapt`) is
//! measured again, at most every [`REMEASURE_AFTER`], and a higher rate only raises
//! what adaptive pacing may probe up to.
//!
//! The train is sized to fit a short bottleneck queue: 48 datagrams are 72 KiB at 1500
//! bytes, less than the lab's 20 Mbit/s link holds (tbf's 32 KiB burst and 20 ms of
//! queue). A train that overflows a queue still measures the link (the queue drains at
//! the link's rate while it drops), but its losses count as the channel's for a moment.
//!
//! A link with jitter (a FIFO that delays each datagram by a varying amount, holding
//! the ones behind a late one and letting them out together) moves a short train's
//! span by up to its jitter. The receiver reports the train's *wobble* with its rate
//! ([`measure`]); a train that wobbled by more than [`WOBBLE_SHARE`] of its span is
//! timed by a line through its arrivals, paces the channel for now at a rate lowered
//! by its wobble, and is followed at once by one long enough for the same wobble to
//! be that share of its span (at least twice as long), up to [`MAX_TRAIN_LEN`] (whose
//! rate stands, wobble or not). Adaptive pacing judges its
//! trial cuts by queue moves larger than the wobble (`session::adapt`).

use super::{LinkState, Role};
use crate::time::{Duration, Instant};
use crate::wire::secure;
use crate::wire::session::{Msg, Probe, ProbeReport};

/// Datagrams in a channel's first train.
pub const TRAIN_LEN: u16 = 48;
/// Most datagrams in a train: a train whose arrival wobbled is followed by a longer
/// one, up to this (see [`WOBBLE_SHARE`]).
pub const MAX_TRAIN_LEN: u16 = 768;
/// A train is trusted when no timed datagram arrived farther from the span's steady
/// rate than this share of the span; otherwise its rate paces the channel for now, and
/// a longer train follows, until one is trusted or [`MAX_TRAIN_LEN`] was sent.
pub const WOBBLE_SHARE: f64 = 0.1;
/// The receiver reports a train this long after its latest datagram, if the train's
/// last one has not arrived.
pub const REPORT_AFTER: Duration = Duration::from_millis(200);
/// The sender sends a train again when no report came this long after it.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);
/// Trains per channel before the sender gives up.
pub const MAX_TRAINS: u32 = 3;
/// A channel paced at its measured rate, using all of it without a queue, is measured
/// again at most this often: its link may have become faster. (A train costs the bond
/// a pause of the train's time on that link, the pacer's tokens for it: every 10 s it
/// cost the twin of the wrong-weights case 0.6 % of its goodput.)
pub const REMEASURE_AFTER: Duration = Duration::from_secs(30);
/// A channel is paced at this share of its measured rate.
pub const PACE_SHARE: f64 = 0.97;
/// Fewest datagrams of a train that must arrive for a measurement.
const MIN_RECEIVED: usize = 8;
/// Shortest time over which a train's later half may arrive for its rate to be taken:
/// the receiver stamps datagrams when its reads run, which may be late by some tens of
/// microseconds (more on a busy host), so a shorter span times the reads rather than
/// the link. With 1500-byte datagrams it lets a train show up to about 570 Mbit/s; a
/// faster link is left as configured.
pub const MIN_SPAN: Duration = Duration::from_micros(500);
/// Least time a whole train must take to be timed whole, when its later half came
/// within [`MIN_SPAN`] (see [`measure`]).
const WHOLE_MIN_SPAN: Duration = Duration::from_millis(4);
/// Most arrivals kept of one train (a peer cannot make us keep more).
const MAX_ARRIVALS: usize = 1024;

/// What the sender knows of one channel's measurement.
#[derive(Clone, Copy, Debug, PartialEq)]
enum TxState {
    /// A train is to be sent as soon as the channel is up both ways. `first`: the
    /// channel's first measurement since it came up, which sets its pace; a later one
    /// only lets adaptive pacing probe higher.
    Due { first: bool },
    /// Train `train` went out at `at`, the `tries`-th.
    Sent {
        train: u16,
        at: Instant,
        tries: u32,
        first: bool,
    },
    /// Measured at `at`.
    Done { at: Instant },
    /// No report after [`MAX_TRAINS`] trains, the last sent at `at`.
    GaveUp { at: Instant },
}

/// Why a channel's measurement failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeFailure {
    /// No report came back for any of the [`MAX_TRAINS`] trains.
    NoReport,
    /// The train arrived too fast to time: its later half within `span_us`
    /// microseconds, less than [`MIN_SPAN`] (0: in one clock reading), in `readings`
    /// distinct readings (0: not counted by the peer); `received` of the train's `sent`
    /// datagrams arrived.
    Untimed {
        /// Microseconds over which the later half arrived.
        span_us: u64,
        /// Distinct clock readings over the later half.
        readings: u16,
        /// Datagrams of the train that arrived.
        received: u16,
        /// Datagrams in the train (a jittery link's trains are longer than
        /// [`TRAIN_LEN`]).
        sent: u16,
    },
}

impl std::fmt::Display for ProbeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeFailure::NoReport => write!(
                f,
                "no report for {MAX_TRAINS} trains (trains or reports lost, or the peer does not answer probes)"
            ),
            ProbeFailure::Untimed {
                span_us,
                readings,
                received,
                sent,
            } => {
                if *span_us == 0 {
                    write!(f, "the peer read the train's later half all at once")?;
                } else {
                    write!(f, "the train's later half arrived within {span_us} us")?;
                    if *readings > 0 {
                        write!(f, " ({readings} reads at the peer)")?;
                    }
                }
                write!(
                    f,
                    " ({received} of {sent} datagrams arrived), under the {} us it takes to time it: \
                     the link is faster than a train can show",
                    MIN_SPAN.as_micros()
                )
            }
        }
    }
}

/// Where a channel's capacity probe stands (our transmit direction).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ProbeState {
    /// We do not measure (no `pace = "auto"`).
    Off,
    /// Its first measurement since it came up is due or under way.
    Measuring,
    /// Measured at `bps` (bit/s on the wire); a later measurement may be under way.
    Measured {
        /// The rate.
        bps: f64,
    },
    /// Gave up after [`MAX_TRAINS`] trains: the channel stays as configured.
    Failed(ProbeFailure),
}

/// The train being received on one channel.
#[derive(Clone, Debug)]
struct RxTrain {
    train: u16,
    count: u16,
    /// Arrival time and bytes on the channel of each datagram, in arrival order.
    arrivals: Vec<(Instant, u64)>,
    reported: bool,
}

/// Counters of the probes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeStats {
    /// Trains sent.
    pub trains_sent: u64,
    /// Reports received for our trains.
    pub reports: u64,
    /// Reports sent for the peer's trains.
    pub reports_sent: u64,
}

/// Both directions' probes of one session end.
#[derive(Clone, Debug)]
pub(crate) struct Probes {
    /// Our trains (`None`: we do not measure).
    tx: Option<Vec<TxState>>,
    /// The latest measurement of each channel (bit/s on the wire).
    last: Vec<Option<f64>>,
    /// Why the channel's latest train failed, while it is measured or since it gave up.
    failure: Vec<Option<ProbeFailure>>,
    /// Channels that gave up since the last [`Probes::take_gave_up`].
    gave_up: Vec<usize>,
    /// Datagrams in each channel's next train (it grows while trains wobble).
    len: Vec<u16>,
    next_train: u16,
    /// The peer's trains, per channel.
    rx: Vec<Option<RxTrain>>,
    pub stats: ProbeStats,
}

impl Probes {
    /// For `n` channels; `measure`: we send trains (the peer's are always answered).
    pub fn new(n: usize, measure: bool) -> Probes {
        Probes {
            tx: measure.then(|| vec![TxState::Due { first: true }; n]),
            last: vec![None; n],
            failure: vec![None; n],
            gave_up: Vec::new(),
            len: vec![TRAIN_LEN; n],
            next_train: 0,
            rx: vec![None; n],
            stats: ProbeStats::default(),
        }
    }

    /// Measure channel `c` again (it came back up; `None`: every channel, the peer
    /// restarted).
    pub fn again(&mut self, c: Option<usize>) {
        if let Some(tx) = &mut self.tx {
            for (i, s) in tx.iter_mut().enumerate() {
                if c.is_none_or(|c| c == i) {
                    *s = TxState::Due { first: true };
                    self.failure[i] = None;
                    self.len[i] = TRAIN_LEN;
                }
            }
        }
    }

    /// Channel `c` uses all of its measured rate without a queue: measure it again if
    /// its last measurement (or attempt) is [`REMEASURE_AFTER`] old. Returns whether a
    /// train is now due.
    pub fn remeasure(&mut self, c: usize, now: Instant) -> bool {
        let old = matches!(
            self.tx.as_ref().and_then(|tx| tx.get(c)),
            Some(TxState::Done { at } | TxState::GaveUp { at })
                if now.saturating_since(*at) >= REMEASURE_AFTER
        );
        old && self.measure_now(c)
    }

    /// Measure channel `c` again now, whenever it was last measured (a channel out of
    /// the bond for being too slow, before it may rejoin: `session::demote`). Returns
    /// whether a train is now due (not while one is out or due already).
    pub fn measure_now(&mut self, c: usize) -> bool {
        let Some(s) = self.tx.as_mut().and_then(|tx| tx.get_mut(c)) else {
            return false;
        };
        match *s {
            TxState::Done { .. } | TxState::GaveUp { .. } => {
                *s = TxState::Due { first: false };
                true
            }
            _ => false,
        }
    }

    /// The channels to send a train on at `now`, given which are up both ways, with
    /// the train's number and its datagrams; each is marked sent.
    pub fn due(&mut self, now: Instant, up: impl Fn(usize) -> bool) -> Vec<(usize, u16, u16)> {
        let mut out = Vec::new();
        let Some(tx) = &mut self.tx else {
            return out;
        };
        for (c, s) in tx.iter_mut().enumerate() {
            let (tries, first) = match *s {
                TxState::Due { first } => (0, first),
                TxState::Sent {
                    at, tries, first, ..
                } if now.saturating_since(at) >= RETRY_AFTER => {
                    if tries >= MAX_TRAINS {
                        *s = TxState::GaveUp { at };
                        // A later measurement that fails leaves the earlier rate.
                        if first {
                            self.failure[c].get_or_insert(ProbeFailure::NoReport);
                            self.gave_up.push(c);
                        }
                        continue;
                    }
                    (tries, first)
                }
                _ => continue,
            };
            if !up(c) {
                continue;
            }
            let train = self.next_train;
            self.next_train = self.next_train.wrapping_add(1);
            *s = TxState::Sent {
                train,
                at: now,
                tries: tries + 1,
                first,
            };
            self.stats.trains_sent += 1;
            out.push((c, train, self.len[c]));
        }
        out
    }

    /// Channels whose first measurement gave up since the last call (each once).
    pub fn take_gave_up(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.gave_up)
    }

    /// Why channel `c`'s measurement failed, if it did.
    pub fn failure(&self, c: usize) -> Option<ProbeFailure> {
        self.failure.get(c).copied().flatten()
    }

    /// Where channel `c`'s measurement stands.
    pub fn state(&self, c: usize) -> ProbeState {
        let Some(s) = self.tx.as_ref().and_then(|tx| tx.get(c)) else {
            return ProbeState::Off;
        };
        match (s, self.measured(c), self.failure(c)) {
            (TxState::Due { first: true } | TxState::Sent { first: true, .. }, _, _) => {
                ProbeState::Measuring
            }
            (_, Some(bps), _) => ProbeState::Measured { bps },
            (TxState::GaveUp { .. }, None, Some(f)) => ProbeState::Failed(f),
            _ => ProbeState::Measuring,
        }
    }

    /// A report on channel `c` at `now` for one of our trains: the rate on the wire
    /// (bit/s), counting `overhead` bytes below each datagram, and whether it is the
    /// channel's first measurement since it came up, if it answers the train we wait
    /// for there and measured something. A train too fast to time (its later half
    /// within [`MIN_SPAN`]) measures nothing: it is sent again after [`RETRY_AFTER`],
    /// as when no report comes, and the failure is kept.
    pub fn on_report(
        &mut self,
        now: Instant,
        c: usize,
        r: &ProbeReport,
        overhead: u32,
    ) -> Option<(f64, bool)> {
        let s = self.tx.as_mut()?.get_mut(c)?;
        let TxState::Sent { train, first, .. } = *s else {
            return None;
        };
        if train != r.train {
            return None;
        }
        self.stats.reports += 1;
        if r.tail == 0 || r.span_us < MIN_SPAN.as_micros() {
            self.failure[c] = Some(ProbeFailure::Untimed {
                span_us: r.span_us,
                readings: r.readings,
                received: r.received,
                sent: self.len[c],
            });
            return None;
        }
        let bytes = r.tail_bytes as f64 + f64::from(r.tail) * f64::from(overhead);
        let bps = bytes * 8e6 / r.span_us as f64;
        // A train whose arrival wobbled by a fair share of its span measured the
        // link's jitter as much as its rate: a longer train follows, whose span the
        // same jitter moves by a smaller share. Until it reports, the rate is taken
        // as low as the wobble may have made it look high (the jitter may have moved
        // each end of the span by the wobble): a pace above the link's rate builds a
        // queue that adaptive pacing then cuts to half, and is slow to win back.
        let wobble = f64::from(r.wobble_us);
        let span = r.span_us as f64;
        let mut bps = bps;
        *s = if wobble > WOBBLE_SHARE * span && self.len[c] < MAX_TRAIN_LEN {
            // Long enough for the same wobble to be a tenth of the span, if the span
            // grows with the train; at least twice as long.
            let factor = (wobble / (WOBBLE_SHARE * span)).ceil().max(2.0);
            self.len[c] = (f64::from(self.len[c]) * factor).min(f64::from(MAX_TRAIN_LEN)) as u16;
            bps *= span / (span + 2.0 * wobble);
            TxState::Due { first }
        } else {
            TxState::Done { at: now }
        };
        self.last[c] = Some(bps);
        self.failure[c] = None;
        Some((bps, first))
    }

    /// Channel `c`'s latest measured rate (bit/s on the wire), if it has one.
    pub fn measured(&self, c: usize) -> Option<f64> {
        self.last.get(c).copied().flatten()
    }

    /// Do we measure our channels?
    pub fn measures(&self) -> bool {
        self.tx.is_some()
    }

    /// Are we still waiting for a measurement of some channel?
    #[cfg(test)]
    pub fn pending(&self) -> bool {
        self.tx.as_ref().is_some_and(|tx| {
            tx.iter()
                .any(|s| matches!(s, TxState::Due { .. } | TxState::Sent { .. }))
        })
    }

    /// A datagram of the peer's train arrived on channel `c` at `at`, `wire_len` bytes
    /// as sent. Returns the report to send now if it was the train's last.
    pub fn on_probe(
        &mut self,
        c: usize,
        p: &Probe,
        at: Instant,
        wire_len: usize,
    ) -> Option<ProbeReport> {
        let slot = self.rx.get_mut(c)?;
        if slot.as_ref().is_none_or(|t| t.train != p.train) {
            *slot = Some(RxTrain {
                train: p.train,
                count: p.count,
                arrivals: Vec::with_capacity(usize::from(p.count).min(MAX_ARRIVALS)),
                reported: false,
            });
        }
        let t = slot.as_mut()?;
        if t.reported || t.arrivals.len() >= MAX_ARRIVALS {
            return None;
        }
        t.arrivals.push((at, wire_len as u64));
        if p.index + 1 == t.count {
            return self.report(c);
        }
        None
    }

    /// Reports due at `now` for trains whose last datagram never came: `(channel,
    /// report)`.
    pub fn overdue(&mut self, now: Instant) -> Vec<(usize, ProbeReport)> {
        let late: Vec<usize> = (0..self.rx.len())
            .filter(|&c| {
                self.rx[c].as_ref().is_some_and(|t| {
                    !t.reported
                        && t.arrivals
                            .last()
                            .is_some_and(|(at, _)| now.saturating_since(*at) >= REPORT_AFTER)
                })
            })
            .collect();
        late.into_iter()
            .filter_map(|c| self.report(c).map(|r| (c, r)))
            .collect()
    }

    /// The report of channel `c`'s train (it is reported once, measured or not).
    fn report(&mut self, c: usize) -> Option<ProbeReport> {
        let t = self.rx.get_mut(c)?.as_mut()?;
        t.reported = true;
        let m = measure(&t.arrivals)?;
        self.stats.reports_sent += 1;
        Some(ProbeReport {
            channel: c as u8,
            train: t.train,
            received: t.arrivals.len() as u16,
            tail: m.tail,
            readings: m.readings,
            tail_bytes: m.tail_bytes,
            span_us: m.span_us,
            wobble_us: m.wobble_us,
        })
    }
}

/// How a train's later half (or, see [`measure`], the whole train) arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Timing {
    /// Datagrams timed (0: they came in one clock reading).
    tail: u16,
    /// Their bytes.
    tail_bytes: u64,
    /// Microseconds from the first reading to the last (for an unsteady arrival, the
    /// time a line fitted through the arrivals takes for the bytes).
    span_us: u64,
    /// Distinct clock readings.
    readings: u16,
    /// The farthest a timed datagram arrived from where the span's steady rate puts it.
    wobble_us: u32,
}

/// The later half of a train's arrivals, timed; all but the readings 0 when it came in
/// one reading. `None` when too few arrived to say anything. The first half is left out: a token bucket at the bottleneck
/// lets a burst through at once. A receiver may stamp several datagrams with one clock
/// reading, taken after the last of them arrived (a batch read, a GRO buffer): so the
/// clock starts at the half's first reading, and what counts is the datagrams stamped
/// later, over the time to the last reading. (Counting from the half's first datagram
/// instead measured a 100 Mbit/s link at up to 130 in the lab, its datagrams coalesced
/// on arrival; a least-squares fit did no better.)
///
/// The *wobble* says how far to trust the span: each timed datagram is compared with
/// the time the span's rate puts it at (the half's first reading plus its bytes so far
/// at that rate). A link that spaces the train at its rate keeps it within a read
/// batch; a link with jitter, whose FIFO holds datagrams behind a late one and lets
/// them out together, moves it by up to its jitter, and so it moves the span's ends:
/// the sender sends a longer train (`Probes::on_report`).
fn measure(arrivals: &[(Instant, u64)]) -> Option<Timing> {
    if arrivals.len() < MIN_RECEIVED {
        return None;
    }
    let half = time(&arrivals[arrivals.len() / 2..]);
    if half.span_us >= MIN_SPAN.as_micros() {
        return Some(half);
    }
    // A later half that came within MIN_SPAN after a first half that took
    // WHOLE_MIN_SPAN or more: no rate limit spaces a train so (a token bucket lets
    // the first datagrams through at once, not the last), but a link's jitter does,
    // holding the later half behind a late datagram and letting it out at once. It is
    // timed over the whole train, and its wobble asks for a longer one. (A link too
    // fast to time, read in a few batches, brings the whole train within a read's
    // scheduling: hundreds of microseconds.)
    let whole = time(arrivals);
    Some(if whole.span_us >= WHOLE_MIN_SPAN.as_micros() {
        whole
    } else {
        half
    })
}

/// The time `bytes` take at the rate of a least-squares line through `arrivals`
/// (arrival time on the bytes so far, each datagram's included), microseconds; `None`
/// for a line that does not rise.
fn fitted_span(arrivals: &[(Instant, u64)], first: Instant, bytes: u64) -> Option<u64> {
    let mut so_far = 0.0;
    let points: Vec<(f64, f64)> = arrivals
        .iter()
        .map(|(at, b)| {
            so_far += *b as f64;
            (so_far, at.saturating_since(first).as_micros() as f64)
        })
        .collect();
    let n = points.len() as f64;
    let (mx, my) = points
        .iter()
        .fold((0.0, 0.0), |(x, y), p| (x + p.0 / n, y + p.1 / n));
    let (sxy, sxx) = points.iter().fold((0.0, 0.0), |(xy, xx), p| {
        (xy + (p.0 - mx) * (p.1 - my), xx + (p.0 - mx) * (p.0 - mx))
    });
    let us_per_byte = sxy / sxx;
    (us_per_byte > 0.0 && us_per_byte.is_finite())
        .then(|| ((us_per_byte * bytes as f64).round() as u64).max(1))
}

/// Times `arrivals` from their first clock reading (see [`measure`]).
fn time(arrivals: &[(Instant, u64)]) -> Timing {
    let first = arrivals[0].0;
    let last = arrivals[arrivals.len() - 1].0;
    let readings = 1 + arrivals.windows(2).filter(|w| w[1].0 != w[0].0).count() as u16;
    let later: Vec<(Instant, u64)> = arrivals
        .iter()
        .filter(|(at, _)| *at > first)
        .copied()
        .collect();
    let span = last.saturating_since(first).as_micros();
    if later.is_empty() || span == 0 {
        return Timing {
            tail: 0,
            tail_bytes: 0,
            span_us: 0,
            readings: 1,
            wobble_us: 0,
        };
    }
    let tail_bytes: u64 = later.iter().map(|(_, b)| b).sum();
    let mut so_far = 0u64;
    let mut wobble = 0u64;
    for (at, b) in &later {
        so_far += b;
        let due = (span as u128 * u128::from(so_far) / u128::from(tail_bytes)) as u64;
        let off = at.saturating_since(first).as_micros();
        wobble = wobble.max(off.abs_diff(due));
    }
    // An unsteady arrival is timed by a line through all of it rather than by its
    // ends, which the jitter moves most: the span becomes the time the fit's rate
    // takes for the bytes timed.
    let span = if wobble as f64 > WOBBLE_SHARE * span as f64 {
        fitted_span(arrivals, first, tail_bytes).unwrap_or(span)
    } else {
        span
    };
    Timing {
        tail: later.len() as u16,
        tail_bytes,
        span_us: span,
        readings,
        wobble_us: u32::try_from(wobble).unwrap_or(u32::MAX),
    }
}

impl super::Session {
    /// Every heartbeat, once we have keys: send the trains that are due, on channels
    /// up both ways, and the reports of the peer's trains whose end never came.
    pub(super) fn probe_step(&mut self, now: Instant) {
        for (c, r) in self.probes.overdue(now) {
            self.send_ctrl(c, &Msg::ProbeReport(r));
        }
        let chans = &self.chans;
        let pmtu = &self.pmtu;
        // With path MTU discovery, not before the channel's size is known: a train of
        // datagrams too big for the path would be lost whole.
        let due = self.probes.due(now, |c| {
            chans[c].state == LinkState::Up
                && chans[c].peer_hears_us
                && pmtu.get(c).is_none_or(super::pmtu::Chan::known)
        });
        for c in self.probes.take_gave_up() {
            let reason = self.probes.failure(c).unwrap_or(ProbeFailure::NoReport);
            self.events.push_back(super::Event::ChannelProbeFailed {
                channel: c,
                reason,
                pace_bps: self
                    .pacer
                    .as_ref()
                    .and_then(|p| p.rate_bps(c))
                    .map(|r| r.round() as u64),
            });
        }
        for (c, train, count) in due {
            // Control messages are always sealed: the train's datagrams are the largest
            // the channel carries (its path MTU, with discovery on).
            let largest = self.pmtu.get(c).map_or(self.cfg.max_datagram, |m| {
                m.plpmtu.min(self.cfg.max_datagram)
            });
            let len = (largest as usize).saturating_sub(secure::OVERHEAD);
            for index in 0..count {
                let p = Probe {
                    channel: c as u8,
                    train,
                    index,
                    count,
                    len,
                };
                // One datagram per send, so the link spaces them (see the module docs).
                let b = bytes::Bytes::from(Msg::Probe(p).to_vec());
                self.emit(c, super::DatagramKind::Probe, b);
            }
            // The train's chunks go with its datagrams, once sent: they are not kept
            // by the heartbeats that follow (a server's thousand new sessions each
            // held 64-128 KiB for a second or more).
            self.crypto.arena.detach();
        }
    }

    /// A datagram of the peer's train on channel `c`, `len` bytes before sealing. A
    /// repaired one (sent again on another channel) is no sample of this channel.
    pub(super) fn on_probe(&mut self, c: usize, p: &Probe, arrived: Instant, repaired: bool) {
        // Opened into the session's arena and dropped once timed: the next datagram
        // is not put in (and does not keep) the chunk the train grew.
        self.crypto.arena.detach();
        if repaired {
            return;
        }
        if let Some(r) = self
            .probes
            .on_probe(c, p, arrived, p.len + secure::OVERHEAD)
        {
            self.send_ctrl(c, &Msg::ProbeReport(r));
        }
    }

    /// The peer's report of our train on channel `c`: pace the channel at
    /// [`PACE_SHARE`] of the measured rate, or at its configured rate if that is
    /// lower, and tell adaptive pacing the most it may probe up to.
    pub(super) fn on_probe_report(&mut self, now: Instant, c: usize, r: &ProbeReport) {
        let Some(pc) = &mut self.pacer else {
            return;
        };
        let overhead = self.cfg.pacing.as_ref().map_or(0, |p| p.overhead);
        let Some((bps, first)) = self.probes.on_report(now, c, r, overhead) else {
            return;
        };
        // A configured rate is the most the channel is paced at.
        let configured = self
            .cfg
            .pacing
            .as_ref()
            .and_then(|p| p.rates_bps.get(c).copied())
            .filter(|r| *r > 0.0);
        let capped = |x: f64| configured.map_or(x, |r| r.min(x));
        // A first measurement sets the pace. A later one (taken while the channel used
        // all of its rate) leaves it: adaptive pacing may now probe up to the new rate,
        // if higher (a lower one, with the channel calm at its pace, is taken for the
        // train's noise or a moment's cross traffic).
        // A channel out of the bond for being too slow for the stripe is paced at
        // what this measurement says, whatever it was before (`session::demote`
        // decides whether it may rejoin).
        let d = &self.chans[c].demote;
        let thin = !first && d.thin && d.role != Role::Active;
        let pace = if first || thin {
            let rate = capped(bps * PACE_SHARE);
            pc.start(now, c, rate);
            rate
        } else {
            pc.rate_bps(c).unwrap_or(0.0)
        };
        self.events.push_back(super::Event::ChannelMeasured {
            channel: c,
            bps: bps.round() as u64,
            pace_bps: pace.round() as u64,
            capped: first && configured.is_some_and(|r| r < bps * PACE_SHARE),
        });
        if thin {
            if let Some(a) = &mut self.adapt {
                a.remeasured(c, pace, capped(bps));
            }
            self.chans[c].demote.measured_at = Some(now);
            return;
        }
        if let Some(a) = &mut self.adapt {
            a.wobble(c, r.wobble_us);
            if !first {
                a.raise(c, capped(bps));
            } else if a.learn(c, pace, capped(bps)) && self.tx.switching.is_none() {
                // (During an epoch switch the new striper takes them up when it starts.)
                self.reapply_quanta();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(t: u64) -> Instant {
        Instant::ZERO + Duration::from_micros(t)
    }

    fn probe(train: u16, index: u16) -> Probe {
        Probe {
            channel: 0,
            train,
            index,
            count: TRAIN_LEN,
            len: 1472,
        }
    }

    #[test]
    fn the_later_half_gives_the_rate_after_the_burst() {
        // 48 datagrams of 1500 bytes: the first 20 at once (a token bucket's burst),
        // then one every 120 us (100 Mbit/s).
        let mut p = Probes::new(1, false);
        let mut report = None;
        for i in 0..TRAIN_LEN {
            let t = if i < 20 {
                10
            } else {
                10 + 120 * u64::from(i - 19)
            };
            report = p.on_probe(0, &probe(5, i), us(t), 1500);
        }
        let r = report.expect("reported at the last datagram");
        assert_eq!((r.train, r.received, r.tail), (5, 48, 23));
        assert_eq!(r.tail_bytes, 23 * 1500);
        assert_eq!(r.span_us, 23 * 120);
        // The sender counts 42 bytes below each datagram: 1542 bytes per 120 us.
        let mut s = Probes::new(1, true);
        let due = s.due(us(0), |_| true);
        assert_eq!(due, vec![(0, 0, TRAIN_LEN)]);
        let r = ProbeReport { train: 0, ..r };
        assert_eq!(r.readings, 24);
        let (bps, fresh) = s.on_report(us(5), 0, &r, 42).expect("a rate");
        assert!(fresh);
        assert!((bps - 1542.0 * 8.0 / 120e-6).abs() < 1.0, "{bps}");
        assert_eq!(s.measured(0), Some(bps));
        assert!(!s.pending());
    }

    /// A train of `count` 1500-byte datagrams, sent at once at `sent_us`, over a FIFO
    /// link of 100 Mbit/s (120 us each) that adds a jitter drawn in `[0, jitter_us]`
    /// to each (arrivals never overtake, as the simulator's links): the report.
    fn jittery_train(
        rx: &mut Probes,
        train: u16,
        count: u16,
        jitter_us: u64,
        seed: &mut u64,
    ) -> ProbeReport {
        let mut last = 0;
        let mut report = None;
        for i in 0..count {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let jitter = (*seed >> 33) % (jitter_us + 1);
            let at = (120 * u64::from(i + 1) + jitter).max(last);
            last = at;
            let p = Probe {
                count,
                ..probe(train, i)
            };
            report = rx.on_probe(0, &p, us(at), 1500);
        }
        report.expect("reported at the last datagram")
    }

    #[test]
    fn a_jittery_link_is_measured_with_longer_trains() {
        // 100 Mbit/s with up to 30 ms of jitter: 48 datagrams take 6 ms, and their
        // span is the jitter's as much as the link's.
        let (mut rx, mut tx) = (Probes::new(1, false), Probes::new(1, true));
        let mut seed = 7;
        let truth = 1500.0 * 8.0 / 120e-6;
        let mut lens = Vec::new();
        let mut now = us(0);
        let mut last = None;
        while let Some(&(c, train, count)) = tx.due(now, |_| true).first() {
            assert_eq!(c, 0);
            lens.push(count);
            let r = jittery_train(&mut rx, train, count, 30_000, &mut seed);
            assert_eq!(r.received, count);
            let (bps, first) = tx.on_report(now, 0, &r, 0).expect("a rate");
            assert!(first, "each train of the run sets the pace");
            let wobbled = f64::from(r.wobble_us) > WOBBLE_SHARE * r.span_us as f64;
            let raw = r.tail_bytes as f64 * 8e6 / r.span_us as f64;
            if wobbled && count < MAX_TRAIN_LEN {
                // Taken as low as the wobble may have made it look high, and a
                // longer train is due.
                assert!(bps < raw, "{bps} {raw}");
            } else {
                assert_eq!(bps, raw);
            }
            last = Some(bps);
            now += Duration::from_millis(300);
        }
        // Each train at least twice as long as the last, sized for its wobble to be a
        // tenth of its span, until one is trusted (or the longest was sent).
        assert!(lens.len() >= 2, "{lens:?}");
        assert_eq!(lens[0], TRAIN_LEN);
        assert!(lens.windows(2).all(|w| w[1] >= 2 * w[0]), "{lens:?}");
        assert!(lens.iter().all(|n| *n <= MAX_TRAIN_LEN), "{lens:?}");
        let bps = last.unwrap();
        assert!((bps / truth - 1.0).abs() < 0.1, "{bps}");
        assert!(!tx.pending());
        // The same link without jitter: one train, timed by its ends, trusted.
        let (mut rx, mut tx) = (Probes::new(1, false), Probes::new(1, true));
        let due = tx.due(us(0), |_| true);
        assert_eq!(due, vec![(0, 0, TRAIN_LEN)]);
        let r = jittery_train(&mut rx, 0, TRAIN_LEN, 0, &mut seed);
        assert_eq!(r.wobble_us, 0);
        let (bps, _) = tx.on_report(us(10), 0, &r, 0).expect("a rate");
        assert!((bps / truth - 1.0).abs() < 1e-6, "{bps}");
        assert!(tx.due(us(20), |_| true).is_empty());
        // Measured again when the channel comes back: from a short train.
        tx.again(Some(0));
        assert_eq!(tx.due(us(30), |_| true), vec![(0, 1, TRAIN_LEN)]);
    }

    #[test]
    fn a_later_half_let_out_at_once_after_a_slow_first_half_is_timed_whole() {
        // The first 24 datagrams one every 250 us, the last 24 in one reading (held
        // behind a late one): no rate limit does that; the whole train is timed.
        let mut rx = Probes::new(1, false);
        let mut report = None;
        for i in 0..TRAIN_LEN {
            let at = 250 * u64::from(i.min(24));
            report = rx.on_probe(0, &probe(1, i), us(at), 1500);
        }
        let r = report.unwrap();
        assert_eq!(r.tail, 47);
        assert!(
            f64::from(r.wobble_us) > WOBBLE_SHARE * r.span_us as f64,
            "{r:?}"
        );
        // Unsteady: timed by a line through it, not by its ends (6 ms).
        assert!(r.span_us != 6_000 && r.span_us > 5_000, "{r:?}");
        // The same later half after a first half of 2 ms: a link too fast to time.
        let mut report = None;
        for i in 0..TRAIN_LEN {
            let at = 80 * u64::from(i.min(24));
            report = rx.on_probe(0, &probe(2, i), us(at), 1500);
        }
        assert_eq!(report.unwrap().tail, 0);
    }

    #[test]
    fn a_train_whose_end_is_lost_is_reported_late_and_once() {
        let mut p = Probes::new(2, false);
        for i in 0..30 {
            assert_eq!(
                p.on_probe(1, &probe(9, i), us(1000 * u64::from(i)), 1000),
                None
            );
        }
        assert!(p.overdue(us(29_000 + 199_000)).is_empty());
        let late = p.overdue(us(29_000 + 200_000));
        assert_eq!(late.len(), 1);
        assert_eq!(late[0].0, 1);
        assert_eq!((late[0].1.received, late[0].1.tail), (30, 14));
        assert_eq!(late[0].1.span_us, 14_000);
        assert!(p.overdue(us(400_000)).is_empty());
        // A late datagram of a reported train changes nothing; a new train starts over.
        assert_eq!(p.on_probe(1, &probe(9, 47), us(500_000), 1000), None);
        assert_eq!(p.on_probe(1, &probe(10, 0), us(600_000), 1000), None);
        assert!(
            p.overdue(us(900_000)).is_empty(),
            "one arrival measures nothing"
        );
        assert_eq!(p.stats.reports_sent, 1);
    }

    #[test]
    fn no_report_means_another_train_then_giving_up() {
        let mut s = Probes::new(2, true);
        // Channel 1 is not up yet: only channel 0 gets a train.
        assert_eq!(s.due(us(0), |c| c == 0), vec![(0, 0, TRAIN_LEN)]);
        assert_eq!(s.due(us(500_000), |_| true), vec![(1, 1, TRAIN_LEN)]);
        // No report: again a second after each, three trains in all.
        assert_eq!(s.due(us(1_000_000), |_| true), vec![(0, 2, TRAIN_LEN)]);
        let r = ProbeReport {
            channel: 1,
            train: 1,
            received: 40,
            tail: 19,
            readings: 20,
            tail_bytes: 19_000,
            span_us: 1_000,
            wobble_us: 0,
        };
        // A report for another train does not count; for the current one it does.
        assert_eq!(
            s.on_report(us(0), 1, &ProbeReport { train: 0, ..r }, 0),
            None
        );
        let (bps, _) = s.on_report(us(1_100_000), 1, &r, 0).unwrap();
        assert!((bps - 152e6).abs() < 1.0);
        assert_eq!(s.due(us(2_000_000), |_| true), vec![(0, 3, TRAIN_LEN)]);
        assert!(s.pending());
        assert!(s.due(us(3_000_000), |_| true).is_empty());
        assert!(!s.pending(), "channel 0 gave up, channel 1 is measured");
        assert_eq!(s.measured(0), None);
        assert_eq!(s.measured(1), Some(bps));
        // Channel 0 comes back: measured again.
        s.again(Some(0));
        assert!(s.pending());
        assert_eq!(s.due(us(9_000_000), |_| true), vec![(0, 4, TRAIN_LEN)]);
    }

    #[test]
    fn a_channel_at_its_measured_rate_is_measured_again_at_most_every_thirty_seconds() {
        let mut s = Probes::new(1, true);
        assert_eq!(s.due(us(0), |_| true), vec![(0, 0, TRAIN_LEN)]);
        let r = ProbeReport {
            channel: 0,
            train: 0,
            received: 48,
            tail: 23,
            readings: 24,
            tail_bytes: 23_000,
            span_us: 1_000,
            wobble_us: 0,
        };
        let (_, fresh) = s.on_report(us(100_000), 0, &r, 0).unwrap();
        assert!(fresh, "the first measurement sets the pace");
        assert!(!s.remeasure(0, us(30_099_999)));
        assert!(s.remeasure(0, us(30_100_000)));
        assert!(!s.remeasure(0, us(30_200_000)), "already due");
        assert_eq!(s.due(us(30_200_000), |_| true), vec![(0, 1, TRAIN_LEN)]);
        let (bps, fresh) = s
            .on_report(us(30_300_000), 0, &ProbeReport { train: 1, ..r }, 0)
            .unwrap();
        assert!(
            !fresh,
            "a later one only raises what adaptive pacing may reach"
        );
        assert_eq!(s.measured(0), Some(bps));
        // Down and up again: the next measurement is a first one again.
        s.again(Some(0));
        assert_eq!(s.due(us(30_400_000), |_| true), vec![(0, 2, TRAIN_LEN)]);
        let (_, fresh) = s
            .on_report(us(30_500_000), 0, &ProbeReport { train: 2, ..r }, 0)
            .unwrap();
        assert!(fresh);
    }

    #[test]
    fn a_side_that_does_not_measure_sends_no_trains_and_takes_no_reports() {
        let mut s = Probes::new(1, false);
        assert!(s.due(us(0), |_| true).is_empty());
        assert!(!s.pending());
        let r = ProbeReport {
            channel: 0,
            train: 0,
            received: 40,
            tail: 19,
            readings: 20,
            tail_bytes: 19_000,
            span_us: 1_000,
            wobble_us: 0,
        };
        assert_eq!(s.on_report(us(0), 0, &r, 0), None);
        assert!(!s.measures());
        assert!(!s.remeasure(0, us(60_000_000)));
    }

    #[test]
    fn batched_clock_readings_still_give_the_rate() {
        // One datagram of 1000 bytes every 100 us (80 Mbit/s), but the receiver reads
        // them four at a time, each batch stamped when it was read (the last one's
        // arrival): counted from the half's first datagram, the rate would be off by
        // the three others stamped with it.
        let mut p = Probes::new(1, false);
        let mut report = None;
        for i in 0..TRAIN_LEN {
            let arrived = 100 * u64::from(i);
            let read = (arrived / 400) * 400 + 300;
            report = p.on_probe(0, &probe(1, i), us(read), 1000);
        }
        let r = report.unwrap();
        let bps = r.tail_bytes as f64 * 8e6 / r.span_us as f64;
        assert!((bps - 80e6).abs() < 80e6 * 0.03, "{bps}");
    }

    #[test]
    fn too_few_or_simultaneous_arrivals_measure_nothing() {
        assert_eq!(measure(&[(us(0), 1500); 7]), None);
        // Arrived, in one reading: reported as such (so the sender knows why).
        assert_eq!(
            measure(&[(us(5), 1500); 20]),
            Some(Timing {
                tail: 0,
                tail_bytes: 0,
                span_us: 0,
                readings: 1,
                wobble_us: 0
            })
        );
    }

    /// What an unshaped veth pair did to a train: it left in GSO sends of 16 datagrams
    /// and each arrived as one GRO read, so the later half was two readings a few
    /// microseconds apart, and its "rate" the reader's scheduling.
    fn gro_train(p: &mut Probes, train: u16, gap_us: u64) -> ProbeReport {
        let mut report = None;
        for i in 0..TRAIN_LEN {
            let read = 100 + gap_us * u64::from(i / 16);
            report = p.on_probe(0, &probe(train, i), us(read), 1500);
        }
        report.expect("reported at the last datagram")
    }

    #[test]
    fn a_train_read_in_a_few_batches_is_no_measurement_and_says_why() {
        let mut rx = Probes::new(1, false);
        let mut tx = Probes::new(1, true);
        assert_eq!(tx.state(0), ProbeState::Measuring);
        // Three runs with the reads 300, 3 and 0 us apart: before, 0.64 and 64 Gbit/s
        // or no report at all; now never a rate.
        for (k, gap) in [300u64, 3, 0].into_iter().enumerate() {
            let now = us(1_000_000 * k as u64);
            let due = tx.due(now, |_| true);
            assert_eq!(due.len(), 1, "train {k} sent");
            let r = gro_train(&mut rx, due[0].1, gap);
            assert!(r.span_us < MIN_SPAN.as_micros(), "{r:?}");
            assert_eq!(
                tx.on_report(now + Duration::from_millis(500), 0, &r, 42),
                None
            );
            assert_eq!(tx.state(0), ProbeState::Measuring, "tries again");
        }
        // After the third: given up, once, with the reason.
        assert!(tx.due(us(3_000_000), |_| true).is_empty());
        assert_eq!(tx.take_gave_up(), vec![0]);
        assert!(tx.take_gave_up().is_empty());
        let f = ProbeFailure::Untimed {
            span_us: 0,
            readings: 1,
            received: 48,
            sent: 48,
        };
        assert_eq!(tx.state(0), ProbeState::Failed(f));
        assert_eq!(tx.measured(0), None);
        assert!(
            f.to_string()
                .contains("read the train's later half all at once"),
            "{f}"
        );
        let f = ProbeFailure::Untimed {
            span_us: 300,
            readings: 2,
            received: 90,
            sent: 96,
        };
        assert!(f.to_string().contains("within 300 us (2 reads"), "{f}");
        assert!(
            f.to_string().contains("(90 of 96 datagrams arrived)"),
            "{f}"
        );
        assert_eq!(tx.stats.reports, 3);
        // Back up later: measured again, the failure forgotten.
        tx.again(Some(0));
        assert_eq!(tx.state(0), ProbeState::Measuring);
        assert_eq!(tx.failure(0), None);
    }

    #[test]
    fn a_train_is_timed_from_half_a_millisecond() {
        let mut tx = Probes::new(1, true);
        let r = |train, span_us| ProbeReport {
            channel: 0,
            train,
            received: 48,
            tail: 23,
            readings: 24,
            tail_bytes: 23 * 1500,
            span_us,
            wobble_us: 0,
        };
        tx.due(us(0), |_| true);
        assert_eq!(tx.on_report(us(1), 0, &r(0, 499), 0), None);
        tx.due(us(1_000_000), |_| true);
        let (bps, _) = tx.on_report(us(1_000_001), 0, &r(1, 500), 0).unwrap();
        assert!((bps - 552e6).abs() < 1e6, "{bps}");
        assert_eq!(tx.failure(0), None);
    }

    #[test]
    fn no_report_at_all_fails_as_such_and_a_report_from_an_older_braid_still_counts() {
        let mut tx = Probes::new(2, true);
        for k in 0..MAX_TRAINS {
            let due = tx.due(us(1_000_000 * u64::from(k)), |c| c == 0);
            assert_eq!(due.len(), 1);
        }
        assert!(tx.due(us(3_000_000), |c| c == 0).is_empty());
        assert_eq!(tx.take_gave_up(), vec![0]);
        assert_eq!(tx.state(0), ProbeState::Failed(ProbeFailure::NoReport));
        assert_eq!(tx.state(1), ProbeState::Measuring);
        // Readings 0: not counted by the peer; its rate is taken.
        let due = tx.due(us(3_000_000), |_| true);
        assert_eq!(due, vec![(1, 3, TRAIN_LEN)]);
        let r = ProbeReport {
            channel: 1,
            train: 3,
            received: 48,
            tail: 23,
            readings: 0,
            tail_bytes: 23_000,
            span_us: 1_000,
            wobble_us: 0,
        };
        let (bps, _) = tx.on_report(us(3_100_000), 1, &r, 0).unwrap();
        assert_eq!(tx.state(1), ProbeState::Measured { bps });
        assert_eq!(ProbeState::Off, Probes::new(1, false).state(0));
    }
}
