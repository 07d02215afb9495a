//! Path MTU discovery per channel, datagram-packetization-layer style (RFC 8899).
//!
//! Each channel has a configured `mtu`, but the path it takes may carry less: a
//! tunnel, a PPPoE hop or a mobile carrier's core on the way. A datagram larger than a
//! hop carries is dropped there (the sockets set Don't Fragment), and nothing but its
//! absence tells. So each end finds, for its own transmit direction, the largest
//! datagram each channel delivers (its *PLPMTU*) by sending *MTU probes*
//! (`wire::session`, kind 10): session messages padded so that the sealed datagram is
//! exactly the size tried, which the peer acknowledges (kind 11) on the same channel.
//!
//! Probes are sealed in the channel's *probe lane* (`wire::secure`): a counter of their
//! own, so a probe too big for the path leaves no gap in the channel's sealing counter,
//! and the loss estimates (feedback, bad-link demotion, adaptive weights), in-bond
//! repair and the AQM never see it. They take no credit and are not kept for repair.
//! They are counted per channel ([`PmtuStats`]).
//!
//! # The search
//!
//! Sizes are UDP payloads, between the channel's *base* (1280 bytes of IP packet less
//! the IP and UDP headers, or the configured size if lower: every IPv6 path carries
//! it, and so does about every IPv4 one) and its *max* (the configured `mtu` less the
//! headers). A channel starts at its max (what it was configured to carry) and
//! searches as soon as it is up both ways:
//!
//! 1. The first probe tries the max: on a path that carries it, one probe and one round
//!    trip confirm it.
//! 2. A size is *lost* when [`MAX_PROBES`] probes of it in a row get no ack, each
//!    within [`Chan::timeout`] (three smoothed round trips, at least [`MIN_TIMEOUT`]).
//! 3. Then the base is tried, then the middle between the largest size acknowledged
//!    and the smallest lost, until the two are adjacent: the largest acknowledged is
//!    the channel's PLPMTU. (From 1472 to 1232 bytes, eight steps.)
//!
//! As soon as a size at or below the channel's current PLPMTU is lost and a smaller one
//! acknowledged, the PLPMTU falls to the smaller one at once (and the search goes on
//! upward from it): data of the old size would vanish on the path.
//!
//! # Keeping it current
//!
//! * *Black holes.* Once settled, the current size is confirmed by a probe every
//!   [`CONFIRM_AFTER`], and sooner (at most every [`SUSPECT_EVERY`]) when the peer's
//!   feedback reports datagrams missing on the channel. A confirmation that is lost
//!   starts the search again (the lost size as its upper end): the PLPMTU falls to
//!   what is acknowledged.
//! * *Raising.* A channel settled below its max probes upward again after
//!   [`Config::raise_after`] (10 minutes by default, RFC 8899's PMTU_RAISE_TIMER),
//!   starting at the max.
//! * A channel that goes down stops probing; when it comes back (or the peer
//!   restarts) it searches again from its max.
//!
//! A peer that never acknowledges a probe (a braid from before this feature) leaves
//! the channel as configured: if not even the base is acknowledged and no probe ever
//! was, the channel is *unanswered* and tries again after `raise_after`.
//!
//! The bond's MTU is the smallest PLPMTU of all channels, less the security envelope
//! and the mode's header ([`super::Session::path_max_packet`]); every change is an
//! [`super::Event::PathMtu`], on which a driver resizes its TUN device.

use super::LinkState;
use crate::time::{Duration, Instant};
use crate::wire::secure;
use crate::wire::session::{Msg, MtuProbe, MTU_PROBE_MIN_LEN};

/// IP packet size every path is taken to carry (IPv6's minimum link MTU).
pub const BASE_IP: u32 = 1280;
/// Probes of one size sent before the size is taken as lost.
pub const MAX_PROBES: u32 = 3;
/// Shortest wait for a probe's ack.
pub const MIN_TIMEOUT: Duration = Duration::from_millis(200);
/// Longest wait for a probe's ack.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(2);
/// A settled channel confirms its size this often.
pub const CONFIRM_AFTER: Duration = Duration::from_secs(30);
/// A settled channel whose peer reports datagrams missing confirms its size at most
/// this often.
pub const SUSPECT_EVERY: Duration = Duration::from_secs(5);
/// The default of [`Config::raise_after`] (RFC 8899's PMTU_RAISE_TIMER).
pub const RAISE_AFTER: Duration = Duration::from_secs(600);

/// Path MTU discovery's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Per channel: (base, max) sealed datagram sizes (UDP payload bytes). Empty: every
    /// channel from `min(1232, max_datagram)` to the session's `max_datagram`; a
    /// driver sets each channel's from its address family and `mtu`. The search
    /// never goes above the session's `max_datagram` (the smallest channel's max).
    pub bounds: Vec<(u32, u32)>,
    /// A channel settled below its max probes upward again this long after.
    pub raise_after: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            bounds: Vec::new(),
            raise_after: RAISE_AFTER,
        }
    }
}

impl Config {
    /// Check the bounds against `n` channels and the session's largest datagram.
    pub fn validate(&self, n: usize, max_datagram: u32) -> Result<(), String> {
        if !self.bounds.is_empty() && self.bounds.len() != n {
            return Err(format!(
                "path MTU bounds for {} channels, but {n} are configured",
                self.bounds.len()
            ));
        }
        for (c, &(base, max)) in self.bounds.iter().enumerate() {
            if base < MIN_SIZE || base > max || max < max_datagram {
                return Err(format!(
                    "channel {c}: path MTU bounds {base}..{max} are not within {MIN_SIZE}..65535 \
                     with the base at most the max and the max at least the session's \
                     largest datagram ({max_datagram}, which caps the search)"
                ));
            }
        }
        if self.raise_after < Duration::from_secs(1) {
            return Err("the path MTU raise interval must be at least 1 s".into());
        }
        Ok(())
    }

    /// Channel `c`'s (base, max) for a session whose largest datagram is `max_datagram`.
    fn bounds_of(&self, c: usize, max_datagram: u32) -> (u32, u32) {
        self.bounds.get(c).copied().unwrap_or_else(|| {
            let base = (BASE_IP - 48).min(max_datagram).max(MIN_SIZE);
            (base, max_datagram.max(base))
        })
    }
}

/// The smallest probe: a sealed MTU probe without padding.
pub const MIN_SIZE: u32 =
    (crate::wire::secure::OVERHEAD + crate::wire::session::MTU_PROBE_MIN_LEN) as u32;

/// Where a channel's discovery stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Not started: the channel has not been up both ways since the peer was heard.
    Idle,
    /// Probing for its size.
    Search,
    /// Its size is confirmed; it is confirmed again now and then, and raised later if
    /// below the max.
    Settled,
    /// The peer acknowledged no probe, not even of the base size: the channel stays as
    /// configured.
    Unanswered,
}

impl Phase {
    /// Short name, as in `braid status`.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Search => "search",
            Phase::Settled => "settled",
            Phase::Unanswered => "unanswered",
        }
    }
}

/// One channel's discovery counters and state, for stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PmtuStats {
    /// MTU probes sent.
    pub probes_sent: u64,
    /// MTU probes acknowledged.
    pub probes_acked: u64,
    /// MTU probes not acknowledged in time.
    pub probes_lost: u64,
    /// Times a size in use was found lost (a black hole): the PLPMTU fell.
    pub black_holes: u64,
    /// MTU probes of the peer acknowledged.
    pub peer_probes: u64,
}

/// A probe awaiting its ack.
#[derive(Clone, Copy, Debug)]
struct Outstanding {
    id: u32,
    size: u32,
    sent: Instant,
    /// Probes of this size sent in a row, this one included.
    tries: u32,
}

/// One channel's discovery.
#[derive(Clone, Debug)]
pub(super) struct Chan {
    base: u32,
    max: u32,
    raise_after: Duration,
    /// The size in use.
    pub plpmtu: u32,
    pub phase: Phase,
    /// In a search: the size to try first, the largest size acknowledged (0: none
    /// yet) and the smallest lost (`max + 1`: none yet).
    first: Option<u32>,
    lo: u32,
    hi: u32,
    probe: Option<Outstanding>,
    /// Settled: the next confirmation; settled below the max, or unanswered: the next
    /// try upward.
    confirm_at: Option<Instant>,
    raise_at: Option<Instant>,
    /// When the last confirmation for a suspected black hole was asked for.
    suspected_at: Option<Instant>,
    /// A probe was acknowledged since the peer was last heard anew.
    answered: bool,
    /// The peer's latest count of datagrams missing on the channel.
    missing: u64,
    pub stats: PmtuStats,
}

/// What a step of a channel's discovery asks of the session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Step {
    /// Send a probe: (its number, sealed size).
    pub send: Option<(u32, u32)>,
    /// The PLPMTU changed: (from, to).
    pub changed: Option<(u32, u32)>,
}

impl Chan {
    pub fn new(cfg: &Config, c: usize, max_datagram: u32) -> Chan {
        // Never above the session's largest datagram: the bond carries no more, and a
        // peer's readers drop larger datagrams unread.
        let (base, max) = cfg.bounds_of(c, max_datagram);
        let max = max.min(max_datagram).max(MIN_SIZE);
        let base = base.min(max);
        Chan {
            base,
            max,
            raise_after: cfg.raise_after,
            plpmtu: max,
            phase: Phase::Idle,
            first: None,
            lo: 0,
            hi: max + 1,
            probe: None,
            confirm_at: None,
            raise_at: None,
            suspected_at: None,
            answered: false,
            missing: 0,
            stats: PmtuStats::default(),
        }
    }

    /// Is the channel's size known (settled, or the peer does not answer probes)?
    /// A capacity probe's train waits for it (`session::probe`).
    pub fn known(&self) -> bool {
        matches!(self.phase, Phase::Settled | Phase::Unanswered)
    }

    /// How long to wait for an ack, from the channel's smoothed round trip.
    pub fn timeout(srtt: Option<Duration>) -> Duration {
        srtt.map_or(Duration::from_secs(1), |r| {
            Duration::from_micros(r.as_micros() * 3)
        })
        .max(MIN_TIMEOUT)
        .min(MAX_TIMEOUT)
    }

    /// Start a search: `first` tried first, `lo` known to pass, `hi` known lost.
    fn search(&mut self, first: u32, lo: u32, hi: u32) {
        self.phase = Phase::Search;
        self.first = Some(first);
        self.lo = lo;
        self.hi = hi;
        self.probe = None;
        self.confirm_at = None;
    }

    /// Stop (the channel went down): a search starts again when it is back.
    pub fn stop(&mut self) {
        self.phase = Phase::Idle;
        self.probe = None;
        self.confirm_at = None;
        self.raise_at = None;
    }

    /// The peer was heard anew (it restarted): whether it answers probes is not known.
    pub fn peer_new(&mut self) {
        self.answered = false;
        // The new run's feedback counts from zero.
        self.missing = 0;
        self.suspected_at = None;
        self.stop();
    }

    /// The peer's feedback on the channel counts `missing` datagrams missing: more
    /// than before makes a black hole suspect.
    pub fn on_feedback(&mut self, now: Instant, missing: u64) {
        if missing > self.missing {
            self.suspect(now);
        }
        self.missing = missing;
    }

    /// The peer reported datagrams missing on the channel: a settled channel confirms
    /// its size soon (at most every [`SUSPECT_EVERY`]).
    pub fn suspect(&mut self, now: Instant) {
        if self.phase != Phase::Settled {
            return;
        }
        if self
            .suspected_at
            .is_some_and(|t| now.saturating_since(t) < SUSPECT_EVERY)
        {
            return;
        }
        self.suspected_at = Some(now);
        self.confirm_at = Some(now);
    }

    /// The next size to try in a search: the one to try first, then the base, then
    /// halves; `None`: the search is over.
    fn next_size(&self) -> Option<u32> {
        if let Some(f) = self.first {
            return Some(f);
        }
        if self.lo == 0 {
            return (self.base < self.hi).then_some(self.base);
        }
        (self.hi > self.lo + 1).then(|| self.lo + (self.hi - self.lo) / 2)
    }

    /// Send a probe of `size`, the `tries`th of that size in a row.
    fn send(&mut self, now: Instant, size: u32, tries: u32, id: &mut u32) -> Option<(u32, u32)> {
        *id = id.wrapping_add(1);
        self.probe = Some(Outstanding {
            id: *id,
            size,
            sent: now,
            tries,
        });
        self.stats.probes_sent += 1;
        Some((*id, size))
    }

    /// One step at `now`, the channel up both ways (`up`), an ack awaited `timeout`;
    /// `id` numbers the probes (of every channel).
    pub fn step(&mut self, now: Instant, up: bool, timeout: Duration, id: &mut u32) -> Step {
        let mut out = Step::default();
        if !up {
            if self.phase != Phase::Idle {
                self.stop();
            }
            return out;
        }
        let due = |t: Option<Instant>| t.is_some_and(|t| now >= t);
        match self.phase {
            Phase::Idle => self.search(self.max, 0, self.max + 1),
            Phase::Unanswered if due(self.raise_at) => {
                self.raise_at = None;
                self.search(self.max, 0, self.max + 1)
            }
            Phase::Settled if due(self.raise_at) => {
                self.raise_at = None;
                self.search(self.max, self.plpmtu, self.max + 1)
            }
            // Confirm the size in use: if lost, search down from it.
            Phase::Settled if due(self.confirm_at) => self.search(self.plpmtu, 0, self.plpmtu + 1),
            Phase::Settled | Phase::Unanswered => return out,
            Phase::Search => {}
        }
        if let Some(p) = self.probe {
            if now.saturating_since(p.sent) < timeout {
                return out;
            }
            self.stats.probes_lost += 1;
            if p.tries < MAX_PROBES {
                out.send = self.send(now, p.size, p.tries + 1, id);
                return out;
            }
            // The size is lost.
            self.probe = None;
            if self.first == Some(p.size) {
                self.first = None;
            }
            self.hi = self.hi.min(p.size);
            out.changed = self.fall();
        }
        match self.next_size() {
            Some(size) => out.send = self.send(now, size, 1, id),
            None => out.changed = self.settle(now).or(out.changed),
        }
        out
    }

    /// After a loss or an ack: if a size at or below the one in use was lost and a
    /// smaller one acknowledged, use that one at once.
    fn fall(&mut self) -> Option<(u32, u32)> {
        if self.hi <= self.plpmtu && self.lo > 0 && self.lo < self.plpmtu {
            let from = self.plpmtu;
            self.plpmtu = self.lo;
            self.stats.black_holes += 1;
            return Some((from, self.lo));
        }
        None
    }

    /// The search is over: use the largest size acknowledged.
    fn settle(&mut self, now: Instant) -> Option<(u32, u32)> {
        self.probe = None;
        self.first = None;
        if self.lo == 0 && !self.answered {
            // Nothing acknowledged, ever: a peer that does not answer probes; leave
            // the channel as it is, and ask again later.
            self.phase = Phase::Unanswered;
            self.raise_at = Some(now + self.raise_after);
            self.confirm_at = None;
            return None;
        }
        // The peer answers; if not even the base passes, use the base.
        let size = if self.lo == 0 { self.base } else { self.lo };
        self.phase = Phase::Settled;
        let from = self.plpmtu;
        self.plpmtu = size;
        self.confirm_at = Some(now + CONFIRM_AFTER);
        // A confirmation does not put the next raise off.
        self.raise_at = (size < self.max).then(|| self.raise_at.unwrap_or(now + self.raise_after));
        if from > size {
            self.stats.black_holes += 1;
        }
        (from != size).then_some((from, size))
    }

    /// An ack of probe `id` of `size` bytes: the next probe goes at the next step.
    pub fn on_ack(&mut self, now: Instant, id: u32, size: u32) -> Step {
        let mut out = Step::default();
        let Some(p) = self.probe else {
            return out;
        };
        if p.id != id || p.size != size {
            return out;
        }
        self.stats.probes_acked += 1;
        self.answered = true;
        self.probe = None;
        if self.first == Some(size) {
            self.first = None;
        }
        self.lo = self.lo.max(size);
        out.changed = self.fall();
        if self.next_size().is_none() {
            out.changed = self.settle(now).or(out.changed);
        }
        out
    }
}

impl super::Session {
    /// Every heartbeat, once we have keys: each channel's discovery steps (a probe
    /// sent, lost or the search over), on channels up both ways.
    pub(super) fn pmtu_step(&mut self, now: Instant) {
        for c in 0..self.pmtu.len() {
            let ch = &self.chans[c];
            let up = ch.state == LinkState::Up
                && ch.peer_hears_us
                && self.uplink_down & super::bit(c) == 0;
            let timeout = Chan::timeout(ch.fb_tx.srtt());
            let step = self.pmtu[c].step(now, up, timeout, &mut self.pmtu_id);
            self.pmtu_apply(c, step);
        }
    }

    /// What a step asked for: a probe sent, a change told.
    fn pmtu_apply(&mut self, c: usize, step: Step) {
        if let Some((from, to)) = step.changed {
            self.events.push_back(super::Event::PathMtu {
                channel: c,
                from,
                to,
            });
        }
        let Some((id, size)) = step.send else {
            return;
        };
        let len = (size as usize).saturating_sub(secure::OVERHEAD);
        let m = Msg::MtuProbe(MtuProbe {
            channel: c as u8,
            id,
            size: u16::try_from(size).unwrap_or(u16::MAX),
            len,
        });
        if self.uplink_down & super::bit(c) != 0 {
            return;
        }
        let encrypt = self.crypto.mode != super::SecurityMode::Auth;
        let Some(bytes) =
            self.crypto
                .seal_lane(self.clock, c, secure::LANE_PROBE, &[&m.to_vec()], encrypt)
        else {
            self.counters.unsent += 1;
            return;
        };
        // Not kept by the arena's chunk for the heartbeats that follow.
        self.crypto.arena.detach();
        if let Some(pc) = &mut self.pacer {
            pc.charge(self.clock, c, bytes.len());
        }
        self.out.push_back(super::Transmit {
            channel: c,
            kind: super::DatagramKind::MtuProbe,
            bytes,
            destination: None,
        });
    }

    /// The peer's MTU probe on channel `c`: acknowledge it there, with the size it
    /// arrived at (control is always sealed).
    pub(super) fn on_mtu_probe(&mut self, c: usize, p: &MtuProbe) {
        self.crypto.arena.detach();
        if let Some(m) = self.pmtu.get_mut(c) {
            m.stats.peer_probes += 1;
        }
        let size = p.len + secure::OVERHEAD;
        self.send_ctrl(
            c,
            &Msg::MtuAck(MtuProbe {
                channel: c as u8,
                id: p.id,
                size: u16::try_from(size).unwrap_or(u16::MAX),
                len: MTU_PROBE_MIN_LEN,
            }),
        );
    }

    /// The peer acknowledged our MTU probe on channel `c`.
    pub(super) fn on_mtu_ack(&mut self, now: Instant, c: usize, a: &MtuProbe) {
        let Some(m) = self.pmtu.get_mut(c) else {
            return;
        };
        let step = m.on_ack(now, a.id, u32::from(a.size));
        self.pmtu_apply(c, step);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1000;

    /// One channel's discovery against a path that carries `path` bytes: a probe that
    /// fits is acknowledged one round trip (`rtt`) later, a larger one is lost.
    struct Path {
        ch: Chan,
        path: u32,
        now: Instant,
        id: u32,
        /// In flight: (ack time, id, size).
        acks: Vec<(Instant, u32, u32)>,
        changes: Vec<(Instant, u32, u32)>,
        /// The peer answers probes.
        answers: bool,
    }

    const RTT: Duration = Duration::from_millis(20);

    impl Path {
        fn new(path: u32) -> Path {
            let cfg = Config {
                bounds: vec![(1232, 1472)],
                raise_after: RAISE_AFTER,
            };
            Path {
                ch: Chan::new(&cfg, 0, 1472),
                path,
                now: Instant::ZERO,
                id: 0,
                acks: Vec::new(),
                changes: Vec::new(),
                answers: true,
            }
        }

        fn apply(&mut self, s: Step) {
            if let Some((from, to)) = s.changed {
                self.changes.push((self.now, from, to));
            }
            if let Some((id, size)) = s.send {
                if self.answers && size <= self.path {
                    self.acks.push((self.now + RTT, id, size));
                }
            }
        }

        /// Run in 10 ms steps (heartbeats every 50 ms) until `until`.
        fn run_until(&mut self, until: Instant) {
            while self.now < until {
                self.now += Duration::from_millis(10);
                let now = self.now;
                let due: Vec<_> = self.acks.iter().filter(|a| a.0 <= now).copied().collect();
                self.acks.retain(|a| a.0 > now);
                for (_, id, size) in due {
                    let s = self.ch.on_ack(now, id, size);
                    self.apply(s);
                }
                if now.as_micros().is_multiple_of(50 * MS) {
                    let s = self
                        .ch
                        .step(now, true, Chan::timeout(Some(RTT)), &mut self.id);
                    self.apply(s);
                }
            }
        }
    }

    fn at(ms: u64) -> Instant {
        Instant::from_micros(ms * MS)
    }

    #[test]
    fn the_search_stays_within_the_sessions_largest_datagram() {
        // A channel configured larger than the bond's smallest (an IPv4 channel next
        // to an IPv6 one): its peer's readers drop anything above the session's size.
        let cfg = Config {
            bounds: vec![(1252, 1472)],
            raise_after: RAISE_AFTER,
        };
        let mut ch = Chan::new(&cfg, 0, 1452);
        assert_eq!(ch.plpmtu, 1452);
        let mut id = 0;
        let s = ch.step(Instant::ZERO, true, MIN_TIMEOUT, &mut id);
        assert_eq!(s.send, Some((1, 1452)));
    }

    #[test]
    fn a_path_that_carries_the_max_is_confirmed_with_one_probe() {
        let mut p = Path::new(1472);
        p.run_until(at(1000));
        assert_eq!(p.ch.phase, Phase::Settled);
        assert_eq!(p.ch.plpmtu, 1472);
        assert_eq!(p.ch.stats.probes_sent, 1);
        assert_eq!(p.ch.stats.probes_acked, 1);
        assert!(p.changes.is_empty());
    }

    #[test]
    fn the_search_finds_the_largest_size_the_path_carries() {
        let mut p = Path::new(1372);
        p.run_until(at(10_000));
        assert_eq!(p.ch.phase, Phase::Settled, "{:?}", p.ch);
        assert_eq!(p.ch.plpmtu, 1372);
        // The max lost (three probes), then down to the base at once, then up to the
        // path's size.
        assert_eq!(p.changes.first().map(|c| (c.1, c.2)), Some((1472, 1232)));
        assert_eq!(p.changes.last().map(|c| (c.1, c.2)), Some((1232, 1372)));
        // Within a few seconds: three timeouts of the max, and a binary search.
        assert!(p.changes.last().unwrap().0 < at(5_000), "{:?}", p.changes);
        assert!(p.ch.stats.probes_sent <= 3 + 1 + 8 * 3, "{:?}", p.ch.stats);
        // Settled: only a confirmation every CONFIRM_AFTER from now on.
        let sent = p.ch.stats.probes_sent;
        p.run_until(at(10_000) + CONFIRM_AFTER);
        assert_eq!(p.ch.stats.probes_sent, sent + 1);
        assert_eq!(p.ch.plpmtu, 1372);
    }

    #[test]
    fn a_black_hole_is_found_by_the_confirmation_and_the_size_falls() {
        let mut p = Path::new(1472);
        p.run_until(at(1000));
        assert_eq!(p.ch.plpmtu, 1472);
        // The path now carries less (a route change): the next confirmation is lost.
        p.path = 1300;
        p.run_until(at(1000) + CONFIRM_AFTER + Duration::from_secs(10));
        assert_eq!(p.ch.plpmtu, 1300, "{:?}", p.changes);
        assert_eq!(p.ch.phase, Phase::Settled);
        assert!(p.ch.stats.black_holes >= 1);
        let (t, from, to) = p.changes[0];
        assert_eq!((from, to), (1472, 1232));
        assert!(
            t <= at(1000) + CONFIRM_AFTER + Duration::from_secs(3),
            "{t:?}"
        );
    }

    #[test]
    fn missing_datagrams_make_the_confirmation_come_sooner() {
        let mut p = Path::new(1472);
        p.run_until(at(1000));
        p.path = 1300;
        p.ch.on_feedback(p.now, 0);
        p.run_until(at(2000));
        assert_eq!(p.ch.plpmtu, 1472, "nothing suspect yet");
        // The peer reports losses: the size is confirmed now, not in 30 s.
        p.ch.on_feedback(p.now, 5);
        p.run_until(at(8000));
        assert_eq!(p.ch.plpmtu, 1300, "{:?}", p.changes);
    }

    #[test]
    fn after_a_peer_restart_its_first_missing_datagrams_still_count() {
        let mut p = Path::new(1472);
        p.run_until(at(1000));
        // The old run's feedback had counted 50 missing.
        p.ch.on_feedback(p.now, 50);
        p.run_until(at(5000));
        assert_eq!(p.ch.plpmtu, 1472);
        // The peer restarts; its new run counts from zero. The path shrank: the new
        // run's first losses (5, fewer than the old run's 50) must make the size
        // suspect as they would have before.
        p.ch.peer_new();
        p.run_until(at(7000));
        assert_eq!(
            p.ch.phase,
            Phase::Settled,
            "searched again after the restart"
        );
        p.path = 1300;
        p.ch.on_feedback(p.now, 5);
        p.run_until(at(13_000));
        assert_eq!(p.ch.plpmtu, 1300, "{:?}", p.changes);
    }

    #[test]
    fn a_channel_below_its_max_probes_upward_again_after_the_raise_interval() {
        let mut p = Path::new(1372);
        p.run_until(at(10_000));
        assert_eq!(p.ch.plpmtu, 1372);
        // The path carries the max again; nothing changes before the raise time.
        p.path = 1472;
        p.run_until(at(10_000 - 10_000) + RAISE_AFTER);
        assert_eq!(p.ch.plpmtu, 1372);
        p.run_until(at(10_000) + RAISE_AFTER + Duration::from_secs(1));
        assert_eq!(p.ch.plpmtu, 1472, "{:?}", p.changes);
    }

    #[test]
    fn a_peer_that_answers_no_probe_leaves_the_channel_as_configured() {
        let mut p = Path::new(1472);
        p.answers = false;
        p.run_until(at(10_000));
        assert_eq!(p.ch.phase, Phase::Unanswered);
        assert_eq!(p.ch.plpmtu, 1472);
        assert!(p.changes.is_empty());
        // The max and the base, three probes each.
        assert_eq!(p.ch.stats.probes_sent, 6);
    }

    #[test]
    fn a_channel_that_goes_down_stops_and_searches_again_when_back() {
        let mut p = Path::new(1472);
        p.run_until(at(1000));
        let s = p.ch.step(p.now, false, MIN_TIMEOUT, &mut p.id);
        assert_eq!(s, Step::default());
        assert_eq!(p.ch.phase, Phase::Idle);
        p.run_until(at(2000));
        assert_eq!(p.ch.phase, Phase::Settled);
        assert_eq!(p.ch.stats.probes_sent, 2);
    }
}
