//! Flows: a policy per inner flow (issue 32, "real-time flows protected").
//!
//! Every packet from the application is classified before it reaches the stripe
//! (`Flows::choose`). Its flow's policy is one of
//!
//! * [`FlowPolicy::Bond`]: striped with everything else (SRR, resequenced in order);
//!   the default, for bulk traffic, and for anything that is not IP;
//! * [`FlowPolicy::Redundant`]: sent as it comes on the `copies` channels with the
//!   lowest measured delay, the first copy to arrive is delivered and the others are
//!   dropped (calls, live audio, game state);
//! * [`FlowPolicy::LowestDelay`]: sent on the one channel with the lowest measured delay
//!   (the smoothed round trip of the peer's feedback), moving when another becomes
//!   clearly faster (interactive video: too much to send twice).
//!
//! A packet of a redundant or lowest-delay flow does not enter the stripe: it goes out
//! at once, sealed, as a flow datagram (`wire::flow`, session message kind 9) with its
//! own sequence number, past the transmit queue, the credits and the pacer's wait (the
//! pacer is charged for its bytes). The receiver delivers it the moment it is opened,
//! ahead of the resequencer and past in-bond repair's hold (a session message other
//! than an epoch end needs no order), and drops a number it has seen ([`Dedupe`]): the
//! seal already refuses a replayed datagram on its channel, the sequence refuses the
//! copies of one packet that came on different channels. Delivery is in arrival order
//! (domain 0 of the wire format), except for TCP: each TCP flow's segments are
//! numbered in an ordered domain of their own and delivered in that order
//! (`session::domains`).
//!
//! Which flows are real-time: rules of the configuration first (`[[session.flow]]`:
//! port, address, protocol, DSCP, first match wins), then, with `flow_auto` (on by
//! default), the DSCP the application set (EF and VOICE-ADMIT: redundant, RFC 4594's
//! real-time interactive and multimedia conferencing classes CS4 and AF4x: lowest
//! delay), then small-packet UDP flows at a low rate: every packet of at most
//! [`AUTO_SMALL`] bytes while the flow stays within [`AUTO_PPS`] packets and
//! [`AUTO_BYTES_PER_S`] bytes a second (token buckets with a burst of
//! [`AUTO_BURST_PACKETS`]); a flow that sends one larger packet or exceeds the rate is
//! bulk for [`AUTO_BULK_HOLD`] after the last time it did. A TCP pure
//! acknowledgement takes the lowest-delay channel; TCP's other segments stay in the
//! bond unless a rule or their DSCP says otherwise, and a TCP flow sent as flow
//! datagrams keeps its order in a domain of its own. Everything else is bonded.
//! `docs/tunnel.md` ("Real-time flows") says why.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use bytes::Bytes;

use super::domains::{self, Numbering, Reorder};
use super::{bit, DatagramKind, LinkState, Role, Session};
use crate::time::{Duration, Instant};
use crate::wire::flow as wf;

/// The lowest-delay channel's pacer may owe at most this for a stream's DATA to take
/// the fast lane (`Session::stream_fast_len`).
pub const FAST_QUEUE: Duration = Duration::from_millis(5);

/// What happens to a flow's packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlowPolicy {
    /// Striped with the bulk (the default).
    Bond,
    /// Sent on the `copies` lowest-delay channels; first copy wins.
    Redundant,
    /// Sent on the channel with the lowest delay.
    LowestDelay,
}

impl FlowPolicy {
    /// The name a configuration uses.
    pub fn name(self) -> &'static str {
        match self {
            FlowPolicy::Bond => "bond",
            FlowPolicy::Redundant => "redundant",
            FlowPolicy::LowestDelay => "lowest-delay",
        }
    }

    /// The policy named `s`.
    pub fn from_name(s: &str) -> Result<FlowPolicy, String> {
        match s.trim() {
            "bond" => Ok(FlowPolicy::Bond),
            "redundant" => Ok(FlowPolicy::Redundant),
            "lowest-delay" => Ok(FlowPolicy::LowestDelay),
            other => Err(format!(
                "unknown flow policy '{other}': expected bond, redundant or lowest-delay"
            )),
        }
    }

    fn wire(self) -> u8 {
        match self {
            FlowPolicy::LowestDelay => wf::POLICY_LOWEST_DELAY,
            _ => wf::POLICY_REDUNDANT,
        }
    }
}

/// One override: the packets it matches get `policy`. Every criterion given must
/// match; a criterion left out matches anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowRule {
    /// The policy of the packets it matches.
    pub policy: FlowPolicy,
    /// The IP protocol (6 TCP, 17 UDP, …).
    pub protocol: Option<u8>,
    /// A port range (inclusive) the source or the destination port is in (TCP and
    /// UDP only).
    pub ports: Option<(u16, u16)>,
    /// A network (address, prefix length) the source or destination address is in.
    pub net: Option<(IpAddr, u8)>,
    /// The DSCP (0 to 63).
    pub dscp: Option<u8>,
}

impl FlowRule {
    fn matches(&self, i: &Inner) -> bool {
        self.protocol.is_none_or(|p| p == i.protocol)
            && self.dscp.is_none_or(|d| d == i.dscp)
            && self.ports.is_none_or(|(lo, hi)| {
                i.ports
                    .is_some_and(|(s, d)| (lo..=hi).contains(&s) || (lo..=hi).contains(&d))
            })
            && self
                .net
                .is_none_or(|(a, len)| in_net(i.src, a, len) || in_net(i.dst, a, len))
    }
}

fn in_net(x: IpAddr, net: IpAddr, len: u8) -> bool {
    match (x, net) {
        (IpAddr::V4(x), IpAddr::V4(n)) => {
            let m = u32::MAX
                .checked_shl(32 - u32::from(len.min(32)))
                .unwrap_or(0);
            u32::from(x) & m == u32::from(n) & m
        }
        (IpAddr::V6(x), IpAddr::V6(n)) => {
            let m = u128::MAX
                .checked_shl(128 - u32::from(len.min(128)))
                .unwrap_or(0);
            u128::from(x) & m == u128::from(n) & m
        }
        _ => false,
    }
}

/// The flow policies of a session's transmit direction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowConfig {
    /// Automatic classification (DSCP, small-packet UDP flows at a low rate).
    pub auto: bool,
    /// Channels a redundant packet goes on (at least 2; fewer while fewer are up).
    pub copies: usize,
    /// Overrides, first match wins, before the automatic classification.
    pub rules: Vec<FlowRule>,
}

impl Default for FlowConfig {
    fn default() -> Self {
        FlowConfig {
            auto: true,
            copies: 2,
            rules: Vec::new(),
        }
    }
}

impl FlowConfig {
    /// The policy the first rule matching packet `p` gives it, if one does (automatic
    /// classification aside): a TCP connection a rule takes out of the bond is carried
    /// as packets with that policy, not terminated as a stream.
    pub fn rule_for(&self, p: &[u8]) -> Option<FlowPolicy> {
        if self.rules.is_empty() {
            return None;
        }
        let i = parse_inner(p)?;
        self.rules.iter().find(|r| r.matches(&i)).map(|r| r.policy)
    }

    /// Check it; the message names what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if !(2..=crate::config::MAX_CHANNELS).contains(&self.copies) {
            return Err(format!(
                "flow_copies = {}: a redundant packet goes on 2 to {} channels",
                self.copies,
                crate::config::MAX_CHANNELS
            ));
        }
        Ok(())
    }
}

/// DSCP Expedited Forwarding (RFC 3246): telephony.
pub const DSCP_EF: u8 = 46;
/// DSCP VOICE-ADMIT (RFC 5865): admitted telephony.
pub const DSCP_VOICE_ADMIT: u8 = 44;
/// RFC 4594's real-time interactive (CS4) and multimedia conferencing (AF41-43).
pub const DSCP_INTERACTIVE_VIDEO: [u8; 4] = [32, 34, 36, 38];
/// Automatic classification: the largest packet (IP length) a real-time UDP flow
/// sends. Voice codecs send 60 to 240 bytes of IP every 10 to 30 ms (G.711 at 20 ms:
/// 200), game state updates a few hundred.
pub const AUTO_SMALL: usize = 400;
/// Automatic classification: the packet rate a real-time UDP flow stays within.
pub const AUTO_PPS: u64 = 200;
/// Automatic classification: the byte rate a real-time UDP flow stays within (512
/// kbit/s; so that sending it twice costs a bond little).
pub const AUTO_BYTES_PER_S: u64 = 64_000;
/// Automatic classification: the burst (packets) the token buckets allow.
pub const AUTO_BURST_PACKETS: u64 = 50;
/// Automatic classification: a flow found to be bulk stays so this long after it last
/// looked like bulk (no flapping between the two paths, which would reorder it).
pub const AUTO_BULK_HOLD: Duration = Duration::from_secs(5);
/// Automatic classification: UDP flows tracked at once; beyond, a new flow is bonded
/// until an entry idle for [`AUTO_IDLE`] can be forgotten.
pub const AUTO_TABLE: usize = 4096;
/// Automatic classification: a flow silent this long is forgotten.
pub const AUTO_IDLE: Duration = Duration::from_secs(30);
/// The receiver's duplicate window: numbers this far below the highest seen are
/// dropped as stale (80 s of a 50 packets/s call; 0.4 s at 10 000 packets/s).
pub const WINDOW: u64 = 4096;
/// Lowest delay: the pinned channel is left only for one whose round trip is shorter
/// by this much (or by a tenth of the pinned one's, if more).
pub const MOVE_MARGIN: Duration = Duration::from_millis(2);

/// What classification reads from an inner IP packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inner {
    /// The DSCP (traffic class >> 2).
    pub dscp: u8,
    /// The IP protocol (IPv6: the first next header).
    pub protocol: u8,
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// (source, destination) ports of a TCP or UDP packet that carries them.
    pub ports: Option<(u16, u16)>,
    /// A TCP segment that only acknowledges: ACK set, no SYN, FIN or RST, no payload.
    pub pure_ack: bool,
}

/// TCP flags a pure acknowledgement must not carry: FIN, SYN, RST.
const TCP_FIN_SYN_RST: u8 = 0x07;
/// TCP's ACK flag.
const TCP_ACK: u8 = 0x10;

/// Whether TCP segment `l4` (from its header to the end of the IP packet) only
/// acknowledges: an ACK with no payload that neither opens, closes nor resets.
fn is_pure_ack(l4: &[u8]) -> bool {
    if l4.len() < 20 {
        return false;
    }
    let header = usize::from(l4[12] >> 4) * 4;
    let flags = l4[13];
    header >= 20 && header == l4.len() && flags & TCP_ACK != 0 && flags & TCP_FIN_SYN_RST == 0
}

/// The header fields of an IPv4 or IPv6 packet; `None` if `p` is not one whose
/// length fields agree with its length (the simulator's packets and application
/// messages are not).
pub fn parse_inner(p: &[u8]) -> Option<Inner> {
    let (dscp, protocol, src, dst, l4) = match p.first()? >> 4 {
        4 => {
            let ihl = usize::from(p[0] & 0x0f) * 4;
            if ihl < 20 || p.len() < ihl || usize::from(u16::from_be_bytes([p[2], p[3]])) != p.len()
            {
                return None;
            }
            let a = |at: usize| Ipv4Addr::new(p[at], p[at + 1], p[at + 2], p[at + 3]);
            // A fragment after the first carries no ports.
            let first = u16::from_be_bytes([p[6], p[7]]) & 0x1fff == 0;
            let l4 = if first { &p[ihl..] } else { &[][..] };
            (p[1] >> 2, p[9], IpAddr::V4(a(12)), IpAddr::V4(a(16)), l4)
        }
        6 => {
            if p.len() < 40 || usize::from(u16::from_be_bytes([p[4], p[5]])) + 40 != p.len() {
                return None;
            }
            let tc = (p[0] << 4) | (p[1] >> 4);
            let a = |at: usize| {
                let mut b = [0u8; 16];
                b.copy_from_slice(&p[at..at + 16]);
                Ipv6Addr::from(b)
            };
            (tc >> 2, p[6], IpAddr::V6(a(8)), IpAddr::V6(a(24)), &p[40..])
        }
        _ => return None,
    };
    let ports = (matches!(protocol, 6 | 17) && l4.len() >= 4).then(|| {
        (
            u16::from_be_bytes([l4[0], l4[1]]),
            u16::from_be_bytes([l4[2], l4[3]]),
        )
    });
    Some(Inner {
        dscp,
        protocol,
        src,
        dst,
        ports,
        pure_ack: protocol == 6 && is_pure_ack(l4),
    })
}

/// The flows' counters (`SessionStats::flows`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlowStats {
    /// Packets sent redundantly.
    pub tx_redundant: u64,
    /// Packets sent on the lowest-delay channel (TCP's pure acknowledgements included).
    pub tx_lowest_delay: u64,
    /// TCP pure acknowledgements sent on the lowest-delay channel (automatic
    /// classification).
    pub tx_acks: u64,
    /// Flow datagrams sent (every copy).
    pub tx_datagrams: u64,
    /// Real-time packets that went into the bond instead: too large for a flow
    /// datagram, no keys yet, or no channel up.
    pub tx_fallback: u64,
    /// Control frames of TCP carried as streams (all but DATA) sent on the
    /// lowest-delay channel, past the stripe.
    pub tx_stream_control: u64,
    /// DATA frames of streams on the fast lane (streams that send little,
    /// `stream::lane`) sent on the lowest-delay channel, past the stripe.
    pub tx_stream_fast: u64,
    /// Times a lowest-delay flow moved to another channel.
    pub moves: u64,
    /// Flow datagrams delivered (the first copy of each packet).
    pub rx_delivered: u64,
    /// Stream frames received as flow datagrams (the first copy of each): control
    /// frames, and the DATA of streams on the fast lane.
    pub rx_stream_control: u64,
    /// Copies dropped because the packet was delivered already.
    pub rx_duplicates: u64,
    /// Flow datagrams dropped because they were older than the duplicate window.
    pub rx_stale: u64,
    /// Flow datagrams of an ordered domain (a TCP flow's) that came before one they
    /// follow and were held for it.
    pub rx_held: u64,
    /// Numbers of ordered domains given up: not there when the wait ran out (or when
    /// too much was held behind them).
    pub rx_gaps: u64,
    /// Flow datagrams that did not parse (counted malformed on their channel too).
    pub rx_malformed: u64,
    /// TCP segments of the stripe delivered ahead of its order, each continuing its
    /// own flow (`session::order`): what another packet's loss or a slower channel
    /// would have held back.
    pub rx_early: u64,
}

/// The receiver's duplicate filter: a sliding window of [`WINDOW`] sequence numbers
/// below the highest seen.
#[derive(Clone, Debug)]
pub struct Dedupe {
    top: Option<u64>,
    bits: Vec<u64>,
}

impl Default for Dedupe {
    fn default() -> Self {
        Dedupe {
            top: None,
            bits: vec![0; (WINDOW / 64) as usize],
        }
    }
}

/// What [`Dedupe::accept`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// The first time: deliver it.
    New,
    /// Seen already.
    Duplicate,
    /// Too old to tell: dropped.
    Stale,
}

impl Dedupe {
    fn slot(&mut self, s: u64) -> (&mut u64, u64) {
        let i = s % WINDOW;
        (&mut self.bits[(i / 64) as usize], 1u64 << (i % 64))
    }

    /// Number `s` arrived.
    pub fn accept(&mut self, s: u64) -> Seen {
        match self.top {
            Some(top) if s <= top => {
                if top - s >= WINDOW {
                    return Seen::Stale;
                }
                let (w, b) = self.slot(s);
                if *w & b != 0 {
                    return Seen::Duplicate;
                }
                *w |= b;
                Seen::New
            }
            top => {
                // Forget the numbers the window slides past.
                let from = top.map_or(s, |t| t + 1);
                if s - from >= WINDOW {
                    self.bits.iter_mut().for_each(|w| *w = 0);
                } else {
                    for x in from..=s {
                        let (w, b) = self.slot(x);
                        *w &= !b;
                    }
                }
                let (w, b) = self.slot(s);
                *w |= b;
                self.top = Some(s);
                Seen::New
            }
        }
    }
}

/// One UDP flow as automatic classification follows it.
#[derive(Clone, Copy, Debug)]
struct Tracked {
    packets: f64,
    bytes: f64,
    last: Instant,
    bulk_until: Option<Instant>,
}

/// A UDP flow: source and destination address, source and destination port.
type Key = (IpAddr, IpAddr, u16, u16);

/// What [`Flows::choose`] decided for a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Choice {
    policy: FlowPolicy,
    /// Automatic classification chose it because it is a TCP pure acknowledgement.
    ack: bool,
    /// Its ordered domain (a TCP segment that is not a pure acknowledgement), or 0.
    domain: u16,
}

impl Choice {
    fn bond() -> Choice {
        Choice {
            policy: FlowPolicy::Bond,
            ack: false,
            domain: 0,
        }
    }
}

/// A session's flows: classification and sequence numbers of our transmit direction,
/// the duplicate filter of our receive direction.
#[derive(Clone, Debug)]
pub struct Flows {
    cfg: FlowConfig,
    table: HashMap<Key, Tracked>,
    /// When the full table was last swept for idle flows (at most once a second: a
    /// burst of new flows costs one sweep, not one per packet).
    swept: Option<Instant>,
    /// The next number of domain 0.
    next_seq: u64,
    /// The next numbers of the ordered domains.
    numbering: Numbering,
    /// The lowest-delay flows' channel.
    pinned: Option<usize>,
    rx: Dedupe,
    rx_ordered: Reorder,
    /// Counters.
    pub stats: FlowStats,
}

impl Flows {
    /// The flows of a session with this configuration.
    pub fn new(cfg: FlowConfig) -> Flows {
        Flows {
            cfg,
            table: HashMap::new(),
            swept: None,
            next_seq: 0,
            numbering: Numbering::default(),
            pinned: None,
            rx: Dedupe::default(),
            rx_ordered: Reorder::default(),
            stats: FlowStats::default(),
        }
    }

    /// The policy of packet `p`, sent at `now` (the tests' view of [`Flows::choose`]).
    #[cfg(test)]
    fn classify(&mut self, now: Instant, p: &[u8]) -> FlowPolicy {
        self.choose(now, p).policy
    }

    /// The policy of packet `p`, whether automatic classification chose it because `p`
    /// is a TCP pure acknowledgement, and its ordered domain.
    fn choose(&mut self, now: Instant, p: &[u8]) -> Choice {
        if !self.cfg.auto && self.cfg.rules.is_empty() {
            return Choice::bond();
        }
        let Some(i) = parse_inner(p) else {
            return Choice::bond();
        };
        // A packet that leaves the stripe: a TCP segment (not a pure acknowledgement)
        // in its flow's ordered domain, anything else in domain 0. (Computed only then:
        // a bonded packet needs no domain.)
        let with = |policy| Choice {
            policy,
            ack: false,
            domain: match (i.protocol, i.ports) {
                (6, Some(ports)) if !i.pure_ack && policy != FlowPolicy::Bond => {
                    domains::domain_of(6, i.src, i.dst, ports)
                }
                _ => 0,
            },
        };
        if let Some(r) = self.cfg.rules.iter().find(|r| r.matches(&i)) {
            return with(r.policy);
        }
        if !self.cfg.auto {
            return Choice::bond();
        }
        if matches!(i.dscp, DSCP_EF | DSCP_VOICE_ADMIT) {
            return with(FlowPolicy::Redundant);
        }
        if DSCP_INTERACTIVE_VIDEO.contains(&i.dscp) {
            return with(FlowPolicy::LowestDelay);
        }
        if i.pure_ack {
            return Choice {
                policy: FlowPolicy::LowestDelay,
                ack: true,
                domain: 0,
            };
        }
        // TCP's data stays in the bond: a connection whose segments took a faster path
        // than its later bulk data would measure its smallest round trip there, and its
        // congestion control would end slow start early (docs/tunnel.md).
        match (i.protocol, i.ports) {
            (17, Some((s, d))) if self.track(now, (i.src, i.dst, s, d), p.len()) => {
                with(FlowPolicy::Redundant)
            }
            _ => Choice::bond(),
        }
    }

    /// Automatic classification of a UDP packet of `len` bytes of flow `k`: whether
    /// it is real-time (small, within the rates, not bulk lately).
    fn track(&mut self, now: Instant, k: Key, len: usize) -> bool {
        if !self.table.contains_key(&k) && self.table.len() >= AUTO_TABLE {
            if self
                .swept
                .is_none_or(|t| now.saturating_since(t) >= Duration::from_secs(1))
            {
                self.swept = Some(now);
                self.table
                    .retain(|_, t| now.saturating_since(t.last) < AUTO_IDLE);
            }
            if self.table.len() >= AUTO_TABLE {
                return false;
            }
        }
        let burst_bytes = (AUTO_BYTES_PER_S / 4) as f64;
        let t = self.table.entry(k).or_insert(Tracked {
            packets: AUTO_BURST_PACKETS as f64,
            bytes: burst_bytes,
            last: now,
            bulk_until: None,
        });
        let dt = now.saturating_since(t.last).as_micros() as f64 / 1e6;
        t.last = now;
        t.packets = (t.packets + dt * AUTO_PPS as f64).min(AUTO_BURST_PACKETS as f64);
        t.bytes = (t.bytes + dt * AUTO_BYTES_PER_S as f64).min(burst_bytes);
        let small = len <= AUTO_SMALL && t.packets >= 1.0 && t.bytes >= len as f64;
        if small {
            t.packets -= 1.0;
            t.bytes -= len as f64;
        } else {
            t.bulk_until = Some(now + AUTO_BULK_HOLD);
        }
        if small && t.bulk_until.is_none_or(|u| now >= u) {
            t.bulk_until = None;
            true
        } else {
            false
        }
    }

    /// The peer started a new run: its numbers start again, and so do ours in the
    /// ordered domains (its new receiver expects each domain to start at 0).
    fn peer_restarted(&mut self) {
        self.rx = Dedupe::default();
        self.rx_ordered = Reorder::default();
        self.numbering = Numbering::default();
    }

    /// When a packet held in an ordered domain stops waiting.
    pub(super) fn next_timeout(&self) -> Option<Instant> {
        self.rx_ordered.next_timeout()
    }
}

/// A channel a flow datagram may take: its index, whether it is active (not demoted)
/// and its smoothed round trip.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Channel index.
    pub channel: usize,
    /// In the bond (not demoted or probing).
    pub active: bool,
    /// Its smoothed round trip, once measured.
    pub srtt: Option<Duration>,
}

impl Candidate {
    fn rank(&self) -> (bool, Duration, usize) {
        (
            !self.active,
            self.srtt.unwrap_or(Duration::from_secs(1)),
            self.channel,
        )
    }
}

/// Order candidates best first: active ones, then by round trip, then by index.
pub fn rank(c: &mut [Candidate]) {
    c.sort_by_key(Candidate::rank);
}

/// The lowest-delay channel among `c` (ranked), staying on `pinned` unless another is
/// clearly better (by [`MOVE_MARGIN`] or a tenth of its round trip).
pub fn lowest_delay(c: &[Candidate], pinned: Option<usize>) -> Option<usize> {
    let best = c.first()?;
    let Some(p) = pinned.and_then(|p| c.iter().find(|x| x.channel == p)) else {
        return Some(best.channel);
    };
    if p.active != best.active {
        return Some(best.channel);
    }
    match (p.srtt, best.srtt) {
        (Some(ps), Some(bs)) => {
            let margin = MOVE_MARGIN.max(Duration::from_micros(ps.as_micros() / 10));
            Some(if bs + margin < ps {
                best.channel
            } else {
                p.channel
            })
        }
        (None, Some(_)) => Some(best.channel),
        _ => Some(p.channel),
    }
}

impl Session {
    /// The flows stage: a packet of a redundant or lowest-delay flow goes out at once
    /// as flow datagrams (`true`); a bonded one (`false`) goes on to the stripe.
    pub(super) fn flow_out(&mut self, now: Instant, p: &Bytes) -> bool {
        let Choice {
            policy,
            ack,
            domain,
        } = self.flows.choose(now, p);
        if policy == FlowPolicy::Bond {
            return false;
        }
        let Some(chosen) = self.flow_channels(policy, p.len()) else {
            self.flows.stats.tx_fallback += 1;
            return false;
        };
        if policy == FlowPolicy::Redundant {
            self.flows.stats.tx_redundant += 1;
        } else {
            self.flows.stats.tx_lowest_delay += 1;
            self.flows.stats.tx_acks += u64::from(ack);
        }
        self.send_flow(&chosen, policy, domain, p);
        true
    }

    /// A stream's control frame (OPEN, OPEN_RESULT, ACK, RESET, RESET_ACK) goes out at
    /// once on the lowest-delay channel, in domain 0, as a flow datagram (`true`); or
    /// into the stripe (`false`: too large, no keys yet, no channel up). The streams
    /// take frames in any order, and a control frame in the stripe would wait behind
    /// the data queued there and then for the resequencer, at the slowest channel's
    /// delay: a connection's SYN waits for the OPEN's answer, and a sender's loss
    /// detection and credit for the ACKs.
    /// The DATA of a stream on the fast lane goes the same way (`data`).
    pub(super) fn stream_frame_out(&mut self, f: &Bytes, data: bool) -> bool {
        let Some(chosen) = self.flow_channels(FlowPolicy::LowestDelay, f.len()) else {
            return false;
        };
        if data {
            self.flows.stats.tx_stream_fast += 1;
        } else {
            self.flows.stats.tx_stream_control += 1;
        }
        self.send_flow(&chosen, FlowPolicy::LowestDelay, 0, f);
        true
    }

    /// The most bytes a stream frame on the fast lane may have now (`stream::lane`):
    /// what a flow datagram on the lowest-delay channel carries, or 0 when there is
    /// none or its pacer owes more than [`FAST_QUEUE`] (the fast lane does not overrun
    /// the channel it shares with the stripe). The channel is the one the last
    /// control frame took (a stream's OPEN comes first, and its ACKs keep the choice
    /// fresh): no ranking of the channels on each turn.
    pub(super) fn stream_fast_len(&self, now: Instant) -> usize {
        let Some(c) = self.flows.pinned else {
            return 0;
        };
        if !self.crypto.ready() || c >= self.n || !self.flow_may_take(c) {
            return 0;
        }
        let queued = self.pacer.as_ref().and_then(|p| p.backlog_after(now, c, 0));
        if queued.is_some_and(|q| q > FAST_QUEUE) {
            return 0;
        }
        let mtu = self.pmtu.get(c).map_or(self.cfg.max_datagram, |m| m.plpmtu);
        (self.sealed_room(mtu) as usize).saturating_sub(wf::HEADER_LEN)
    }

    /// The channels a flow datagram of `policy` with `len` bytes of payload goes on, or
    /// `None` if it cannot leave the stripe: too large, no keys yet, no channel up.
    fn flow_channels(&mut self, policy: FlowPolicy, len: usize) -> Option<Vec<usize>> {
        let fits = len + wf::HEADER_LEN <= self.cfg.max_inner() as usize;
        let mut cands = self.flow_candidates();
        if !fits || !self.crypto.ready() || cands.is_empty() {
            return None;
        }
        rank(&mut cands);
        Some(match policy {
            FlowPolicy::Redundant => cands
                .iter()
                .take(self.flows.cfg.copies)
                .map(|c| c.channel)
                .collect(),
            _ => {
                let c = lowest_delay(&cands, self.flows.pinned);
                if self.flows.pinned.is_some() && c != self.flows.pinned {
                    self.flows.stats.moves += 1;
                }
                self.flows.pinned = c;
                c.into_iter().collect()
            }
        })
    }

    /// Send `p` as a flow datagram of `policy` in `domain` on each of `chosen`.
    fn send_flow(&mut self, chosen: &[usize], policy: FlowPolicy, domain: u16, p: &Bytes) {
        let seq = if domain == 0 {
            self.flows.next_seq += 1;
            self.flows.next_seq - 1
        } else {
            self.flows.numbering.take(domain)
        };
        for &c in chosen {
            let h = wf::Header {
                channel: c as u8,
                policy: policy.wire(),
                domain,
                seq,
            };
            self.flows.stats.tx_datagrams += 1;
            self.emit_parts(c, DatagramKind::Flow, &h.to_bytes(), p.clone());
        }
    }

    /// The channels a flow datagram may take: up, with an uplink, heard by the peer.
    fn flow_candidates(&self) -> Vec<Candidate> {
        (0..self.n)
            .filter(|&c| self.flow_may_take(c))
            .map(|c| Candidate {
                channel: c,
                active: self.chans[c].demote.role == Role::Active,
                srtt: self.chans[c].fb_tx.srtt(),
            })
            .collect()
    }

    /// Channel `c` may take a flow datagram: up, with an uplink, heard by the peer.
    fn flow_may_take(&self, c: usize) -> bool {
        let ch = &self.chans[c];
        ch.state != LinkState::Down && ch.peer_hears_us && self.uplink_down & bit(c) == 0
    }

    /// A flow datagram opened on (sealed for) channel `c` at `now`: in domain 0
    /// delivered at once unless a copy of it was; in an ordered domain, in its order.
    pub(super) fn on_flow(&mut self, now: Instant, c: usize, inner: Bytes) {
        let h = match wf::Header::parse(&inner) {
            Ok(h) if usize::from(h.channel) == c => h,
            _ => {
                self.chans[c].n.malformed += 1;
                self.flows.stats.rx_malformed += 1;
                return;
            }
        };
        if h.domain != 0 {
            let wait = self
                .cfg
                .arq
                .map_or(domains::WAIT_WITHOUT_REPAIR, |a| a.wait);
            let p = inner.slice(wf::HEADER_LEN..);
            let f = &mut self.flows;
            f.rx_ordered.accept(
                now,
                wait,
                h.domain,
                h.seq,
                p,
                &mut self.deliver,
                &mut f.stats,
            );
            return;
        }
        match self.flows.rx.accept(h.seq) {
            Seen::New => {
                let p = inner.slice(wf::HEADER_LEN..);
                if self.stream_frame_in(now, &p) {
                    self.flows.stats.rx_stream_control += 1;
                } else {
                    self.flows.stats.rx_delivered += 1;
                    self.deliver.push_back(p);
                }
            }
            Seen::Duplicate => self.flows.stats.rx_duplicates += 1,
            Seen::Stale => self.flows.stats.rx_stale += 1,
        }
    }

    /// The peer started a new run (or was first heard): its flow numbers start again.
    pub(super) fn flows_on_new_peer(&mut self) {
        self.flows.peer_restarted();
    }

    /// Packets held in ordered domains whose wait ran out by `now` are delivered, the
    /// gaps before them given up.
    pub(super) fn flows_expire(&mut self, now: Instant) {
        let f = &mut self.flows;
        f.rx_ordered.expire(now, &mut self.deliver, &mut f.stats);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An IPv4 packet of `len` bytes (zeros after the header) from 10.0.0.1 to
    /// 10.0.0.2 with this protocol and DSCP, and the ports `sport` and `dport`.
    pub(crate) fn ipv4(len: usize, protocol: u8, dscp: u8, sport: u16, dport: u16) -> Vec<u8> {
        let mut p = vec![0u8; len];
        p[0] = 0x45;
        p[1] = dscp << 2;
        p[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        p[8] = 64;
        p[9] = protocol;
        p[12..16].copy_from_slice(&[10, 0, 0, 1]);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        p[20..22].copy_from_slice(&sport.to_be_bytes());
        p[22..24].copy_from_slice(&dport.to_be_bytes());
        p
    }

    /// An IPv4 UDP packet of `len` bytes from 10.0.0.1:`sport` to 10.0.0.2:`dport`.
    pub(crate) fn udp4(len: usize, sport: u16, dport: u16, dscp: u8) -> Vec<u8> {
        ipv4(len, 17, dscp, sport, dport)
    }

    fn tcp6(len: usize, dport: u16, dscp: u8) -> Vec<u8> {
        let mut p = vec![0u8; len];
        let tc = dscp << 2;
        p[0] = 0x60 | (tc >> 4);
        p[1] = tc << 4;
        p[4..6].copy_from_slice(&((len - 40) as u16).to_be_bytes());
        p[6] = 6;
        p[7] = 64;
        p[8] = 0x20;
        p[9] = 0x01;
        p[24] = 0xfd;
        p[40..42].copy_from_slice(&40000u16.to_be_bytes());
        p[42..44].copy_from_slice(&dport.to_be_bytes());
        p
    }

    fn at(ms: u64) -> Instant {
        Instant::from_micros(ms * 1000)
    }

    #[test]
    fn headers_are_read_and_bad_lengths_refused() {
        let i = parse_inner(&udp4(200, 5004, 6000, 46)).unwrap();
        assert_eq!(i.protocol, 17);
        assert_eq!(i.dscp, 46);
        assert_eq!(i.ports, Some((5004, 6000)));
        let i = parse_inner(&tcp6(100, 443, 34)).unwrap();
        assert_eq!((i.protocol, i.dscp, i.ports), (6, 34, Some((40000, 443))));
        // The simulator's packets: first byte 0x45, total length 0.
        let mut sim = vec![0u8; 200];
        sim[0] = 0x45;
        assert_eq!(parse_inner(&sim), None);
        let mut short = udp4(200, 1, 2, 0);
        short.truncate(150);
        assert_eq!(parse_inner(&short), None);
        assert_eq!(parse_inner(&[]), None);
        assert_eq!(parse_inner(&[0x45]), None);
        // A later fragment has no ports.
        let mut frag = udp4(200, 1, 2, 0);
        frag[7] = 10;
        assert_eq!(parse_inner(&frag).unwrap().ports, None);
    }

    /// An IPv4 TCP segment from port 5201 with `payload` bytes after a 32-byte TCP
    /// header (with timestamps) and these flags.
    fn tcp4(payload: usize, flags: u8) -> Vec<u8> {
        tcp4_from(5201, payload, flags)
    }

    /// The same from source port `sport` (another flow).
    fn tcp4_from(sport: u16, payload: usize, flags: u8) -> Vec<u8> {
        let mut p = ipv4(20 + 32 + payload, 6, 0, sport, 40000);
        p[32] = 8 << 4;
        p[33] = flags;
        p
    }

    /// The choice for a segment of the flow from `sport`, in its ordered domain.
    fn lowest_in_domain(sport: u16) -> Choice {
        Choice {
            policy: FlowPolicy::LowestDelay,
            ack: false,
            domain: domains::domain_of(
                6,
                IpAddr::from([10, 0, 0, 1]),
                IpAddr::from([10, 0, 0, 2]),
                (sport, 40000),
            ),
        }
    }

    #[test]
    fn pure_tcp_acks_take_the_lowest_delay_channel_and_data_stays_bonded_unless_a_rule_says() {
        let mut f = Flows::new(FlowConfig::default());
        let ack = 0x10;
        let pure_ack = Choice {
            policy: FlowPolicy::LowestDelay,
            ack: true,
            domain: 0,
        };
        assert_eq!(f.choose(at(0), &tcp4(0, ack)), pure_ack);
        // With PSH or ECE/CWR, still only an acknowledgement.
        assert_eq!(f.choose(at(0), &tcp4(0, ack | 0x08 | 0xc0)), pure_ack);
        // Data, and segments that open, close or reset, small or not, keep the bond's
        // order: the connection's round trip stays the bond's.
        for (payload, flags) in [(0, 0x02), (0, ack | 0x02), (1, ack), (300, ack | 0x08)] {
            assert_eq!(f.choose(at(1), &tcp4(payload, flags)), Choice::bond());
        }
        for flags in [ack | 0x01, ack | 0x04, 0] {
            assert_eq!(f.choose(at(1), &tcp4(0, flags)), Choice::bond());
        }
        assert_eq!(f.choose(at(1), &tcp4(1400, ack)), Choice::bond());
        // Counted by the session once sent, not here.
        assert_eq!(f.stats.tx_acks, 0);
        // A rule comes first: its policy, in the flow's own ordered domain (another
        // flow, another domain: the hash of its ports); a pure acknowledgement it
        // matches too, in arrival order. Without auto, everything is bonded.
        let rule = |policy| FlowRule {
            policy,
            protocol: Some(6),
            ports: Some((2222, 2222)),
            net: None,
            dscp: None,
        };
        let mut f = Flows::new(FlowConfig {
            rules: vec![rule(FlowPolicy::LowestDelay)],
            ..FlowConfig::default()
        });
        let small = lowest_in_domain(2222);
        assert_ne!(small.domain, 0);
        for (payload, flags) in [(0, 0x02), (1, ack), (1400, ack), (0, ack | 0x01)] {
            assert_eq!(f.choose(at(1), &tcp4_from(2222, payload, flags)), small);
        }
        assert_eq!(
            f.choose(at(1), &tcp4_from(2222, 0, ack)),
            Choice { domain: 0, ..small }
        );
        assert_ne!(
            Flows::new(FlowConfig {
                rules: vec![FlowRule {
                    ports: Some((2223, 2223)),
                    ..rule(FlowPolicy::LowestDelay)
                }],
                ..FlowConfig::default()
            })
            .choose(at(1), &tcp4_from(2223, 1, ack))
            .domain,
            small.domain
        );
        let mut f = Flows::new(FlowConfig {
            rules: vec![FlowRule {
                policy: FlowPolicy::Bond,
                protocol: Some(6),
                ports: None,
                net: None,
                dscp: None,
            }],
            ..FlowConfig::default()
        });
        assert_eq!(f.classify(at(0), &tcp4(0, ack)), FlowPolicy::Bond);
        assert_eq!(f.classify(at(0), &tcp4(1, ack)), FlowPolicy::Bond);
        let mut f = Flows::new(FlowConfig {
            rules: vec![FlowRule {
                policy: FlowPolicy::Redundant,
                protocol: Some(6),
                ports: None,
                net: None,
                dscp: None,
            }],
            ..FlowConfig::default()
        });
        assert_eq!(
            f.choose(at(0), &tcp4(1400, ack)),
            Choice {
                policy: FlowPolicy::Redundant,
                ..lowest_in_domain(5201)
            }
        );
        let mut f = Flows::new(FlowConfig {
            auto: false,
            ..FlowConfig::default()
        });
        assert_eq!(f.choose(at(0), &tcp4(0, ack)), Choice::bond());
        assert_eq!(f.choose(at(0), &tcp4(1, ack)), Choice::bond());
    }

    #[test]
    fn auto_takes_voice_and_leaves_bulk_in_the_bond() {
        let mut f = Flows::new(FlowConfig::default());
        // A call: 200-byte packets every 20 ms, for 20 s.
        for k in 0..1000 {
            assert_eq!(
                f.classify(at(20 * k), &udp4(200, 5004, 6000, 0)),
                FlowPolicy::Redundant,
                "packet {k}"
            );
        }
        // Full-size UDP (QUIC, a VPN inside the tunnel): bond from its first packet.
        assert_eq!(
            f.classify(at(0), &udp4(1400, 443, 50000, 0)),
            FlowPolicy::Bond
        );
        // Small packets at a high rate: real-time for the burst, then bond, and still
        // bond for the hold after it slows down.
        let mut policies = Vec::new();
        for k in 0..400u64 {
            policies.push(f.classify(at(k), &udp4(120, 7000, 7001, 0)));
        }
        let rt = policies
            .iter()
            .filter(|&&p| p == FlowPolicy::Redundant)
            .count();
        assert!((50..=70).contains(&rt), "{rt} packets real-time");
        assert_eq!(policies[399], FlowPolicy::Bond);
        assert_eq!(
            f.classify(at(2000), &udp4(120, 7000, 7001, 0)),
            FlowPolicy::Bond
        );
        assert_eq!(
            f.classify(at(6000), &udp4(120, 7000, 7001, 0)),
            FlowPolicy::Redundant
        );
        // TCP is bonded unless its DSCP says otherwise; EF is voice, AF41 video.
        assert_eq!(f.classify(at(0), &tcp6(80, 22, 0)), FlowPolicy::Bond);
        assert_eq!(f.classify(at(0), &tcp6(80, 22, 46)), FlowPolicy::Redundant);
        assert_eq!(
            f.classify(at(0), &tcp6(1200, 443, 34)),
            FlowPolicy::LowestDelay
        );
        // Without auto, nothing is real-time.
        let mut off = Flows::new(FlowConfig {
            auto: false,
            ..FlowConfig::default()
        });
        assert_eq!(
            off.classify(at(0), &udp4(200, 5004, 6000, 46)),
            FlowPolicy::Bond
        );
    }

    #[test]
    fn the_flow_table_is_bounded_and_forgets_idle_flows() {
        let mut f = Flows::new(FlowConfig::default());
        for k in 0..AUTO_TABLE {
            let p = udp4(100, (k / 60_000) as u16 + 1, (k % 60_000) as u16, 0);
            assert_eq!(f.classify(at(0), &p), FlowPolicy::Redundant);
        }
        // Full: a new flow is bonded, a known one keeps its policy.
        let new = udp4(100, 9, 9, 0);
        assert_eq!(f.classify(at(1000), &new), FlowPolicy::Bond);
        assert_eq!(
            f.classify(at(1000), &udp4(100, 1, 5, 0)),
            FlowPolicy::Redundant
        );
        // Once the others are idle for AUTO_IDLE they are forgotten.
        assert_eq!(f.classify(at(31_000), &new), FlowPolicy::Redundant);
        assert!(f.table.len() <= 2, "{}", f.table.len());
    }

    #[test]
    fn rules_come_first_and_match_every_criterion() {
        let rule = |policy, protocol, ports, net: Option<(&str, u8)>, dscp| FlowRule {
            policy,
            protocol,
            ports,
            net: net.map(|(a, l)| (a.parse().unwrap(), l)),
            dscp,
        };
        let mut f = Flows::new(FlowConfig {
            auto: true,
            copies: 2,
            rules: vec![
                rule(FlowPolicy::Bond, Some(17), Some((5004, 5004)), None, None),
                rule(
                    FlowPolicy::LowestDelay,
                    None,
                    Some((3478, 3481)),
                    Some(("10.0.0.0", 24)),
                    None,
                ),
                rule(
                    FlowPolicy::Redundant,
                    None,
                    None,
                    Some(("2001::", 16)),
                    Some(10),
                ),
            ],
        });
        // The rule keeps a call in the bond that auto would have taken.
        assert_eq!(
            f.classify(at(0), &udp4(200, 5004, 6000, 46)),
            FlowPolicy::Bond
        );
        assert_eq!(
            f.classify(at(0), &udp4(1200, 50000, 3480, 0)),
            FlowPolicy::LowestDelay
        );
        assert_eq!(
            f.classify(at(0), &tcp6(1200, 443, 10)),
            FlowPolicy::Redundant
        );
        // Not the DSCP the rule names: auto (bulk TCP).
        assert_eq!(f.classify(at(0), &tcp6(1200, 443, 12)), FlowPolicy::Bond);
        // The rules alone, as the TCP terminator asks: no rule, no policy.
        let cfg = &f.cfg;
        assert_eq!(
            cfg.rule_for(&udp4(200, 5004, 6000, 46)),
            Some(FlowPolicy::Bond)
        );
        assert_eq!(
            cfg.rule_for(&tcp6(1200, 443, 10)),
            Some(FlowPolicy::Redundant)
        );
        assert_eq!(cfg.rule_for(&tcp6(1200, 443, 12)), None);
        assert_eq!(cfg.rule_for(b"not a packet"), None);
        assert!(in_net(
            "10.0.0.9".parse().unwrap(),
            "10.0.0.0".parse().unwrap(),
            24
        ));
        assert!(!in_net(
            "10.0.1.9".parse().unwrap(),
            "10.0.0.0".parse().unwrap(),
            24
        ));
        assert!(in_net(
            "10.0.1.9".parse().unwrap(),
            "0.0.0.0".parse().unwrap(),
            0
        ));
    }

    #[test]
    fn the_window_drops_copies_and_stale_numbers() {
        let mut d = Dedupe::default();
        assert_eq!(d.accept(5), Seen::New);
        assert_eq!(d.accept(5), Seen::Duplicate);
        assert_eq!(d.accept(3), Seen::New);
        assert_eq!(d.accept(3), Seen::Duplicate);
        assert_eq!(d.accept(6), Seen::New);
        assert_eq!(d.accept(4), Seen::New);
        assert_eq!(d.accept(6 + WINDOW), Seen::New);
        assert_eq!(d.accept(6), Seen::Stale);
        assert_eq!(d.accept(7), Seen::New, "inside the window, not seen");
        assert_eq!(d.accept(7), Seen::Duplicate);
        // A jump beyond the window forgets everything below it.
        assert_eq!(d.accept(10 * WINDOW), Seen::New);
        assert_eq!(d.accept(10 * WINDOW - 1), Seen::New);
        assert_eq!(d.accept(10 * WINDOW - 1), Seen::Duplicate);
        assert_eq!(d.accept(9 * WINDOW + 5), Seen::New);
    }

    #[test]
    fn lowest_delay_moves_only_for_a_clear_gain() {
        let c = |channel, ms: u64| Candidate {
            channel,
            active: true,
            srtt: Some(Duration::from_millis(ms)),
        };
        let mut v = vec![c(0, 30), c(1, 20), c(2, 60)];
        rank(&mut v);
        assert_eq!(v[0].channel, 1);
        assert_eq!(lowest_delay(&v, None), Some(1));
        // 21 ms against 20: stay.
        let mut v = vec![c(0, 20), c(1, 21)];
        rank(&mut v);
        assert_eq!(lowest_delay(&v, Some(1)), Some(1));
        // 30 against 20: move.
        let mut v = vec![c(0, 20), c(1, 30)];
        rank(&mut v);
        assert_eq!(lowest_delay(&v, Some(1)), Some(0));
        // The pinned channel went away.
        assert_eq!(lowest_delay(&v, Some(7)), Some(0));
        // A demoted channel is left for an active one however fast it is.
        let mut v = vec![
            Candidate {
                active: false,
                ..c(0, 5)
            },
            c(1, 50),
        ];
        rank(&mut v);
        assert_eq!(lowest_delay(&v, Some(0)), Some(1));
    }
}
