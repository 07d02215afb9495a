//! A closed-loop TCP-like source (`[traffic] source = "tcp"`): one bulk flow whose
//! segments enter the bond as IPv4 packets and whose receiver returns cumulative
//! acknowledgements after a fixed delay.
//!
//! The sender is a window-based machine in the style of Linux TCP, reduced to what
//! decides throughput through a bond:
//!
//! * **Window growth**: slow start from an initial window (10 segments), then
//!   congestion avoidance with CUBIC (RFC 8312: `W(t) = C (t - K)^3 + W_max`,
//!   C = 0.4, β = 0.7, fast convergence, the TCP-friendly region) or Reno AIMD
//!   (+1 segment per window, halve on congestion). CUBIC's slow start ends, as in
//!   Linux, also on HyStart's delay signal: the minimum RTT of a round's first 8
//!   samples exceeding the flow's minimum RTT by `clamp(min_rtt / 8, 4 ms, 16 ms)`.
//! * **Loss detection**: every acknowledgement tells which segment arrived (the
//!   return path is perfect, so this is SACK with nothing lost): a first transmission
//!   with 3 segments above it delivered is lost (fast retransmit on three duplicate
//!   acknowledgements), and any transmission older than the newest delivered one by
//!   more than a reordering window is lost (RACK, RFC 8985: window 0 until reordering
//!   is seen while in recovery or with 3 segments delivered above, else `min_rtt / 4`).
//!   Lost segments are sent again first, while the segments in flight (`pipe`,
//!   RFC 6675) stay below the window.
//! * **Retransmission timeout**: RFC 6298 smoothing, `RTO = SRTT + max(4 RTTVAR,
//!   min_rto)` (Linux's form, `min_rto` 200 ms), 1 s before the first sample, doubled
//!   at each expiry; an expiry marks everything outstanding lost and sets the window
//!   to 1 segment, from which it grows in slow start while the lost data is resent.
//! * **ECN**: segments are ECN-capable (ECT(0)); an acknowledgement of a segment that
//!   arrived marked CE reduces the window like a loss, without sending anything again,
//!   at most once per window of data (RFC 3168's CWR).
//! * **Receive window**: at most `rwnd` segments outstanding, and the congestion window
//!   never grows beyond that.
//!
//! One congestion reduction per window of data: a loss or CE mark before the data
//! outstanding at the last reduction is acknowledged does not reduce again.
//!
//! The receiver accepts segments in any order, hands the in-order prefix to the
//! application (that is the flow's goodput) and acknowledges every segment at once
//! (no delayed ACKs): the cumulative point, the segment that arrived, whether it was
//! CE-marked, and the echo of its send time (TCP timestamps), from which the sender
//! takes its RTT samples.

use std::collections::{BTreeSet, VecDeque};

use bytes::{Bytes, BytesMut};

use crate::metrics::SERIES_BIN;
use crate::model::Nanos;
pub use crate::model::{AckDelay, Cc, TcpSpec, MIN_TCP_PACKET};

/// What the TCP flow did in a run (the JSON `tcp` object).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct TcpResult {
    /// Congestion control used.
    pub cc: String,
    /// Application bytes (segments less `header_bytes`) the receiver got in order
    /// from the flow's start (`start_s`) to the window's end, × 8 / that span.
    pub goodput_bps: f64,
    /// Segments sent again (fast retransmit, RACK, timeout).
    pub retransmits: u64,
    /// Segments that arrived marked CE.
    pub ce_marks_seen: u64,
    /// Window reductions for CE marks.
    pub ecn_reductions: u64,
    /// Window reductions for losses (fast recovery; timeouts counted apart).
    pub loss_reductions: u64,
    /// Retransmission timeouts.
    pub rto_count: u64,
    /// Largest congestion window, segments.
    pub cwnd_max: f64,
    /// Segments sent (first transmissions and retransmissions).
    pub segments_sent: u64,
    /// Segments that arrived more than once at the receiver.
    pub duplicate_segments: u64,
    /// Smallest RTT sample, ms.
    pub min_rtt_ms: f64,
    /// Smoothed RTT at the end, ms.
    pub srtt_ms: f64,
    /// The acknowledgement delay used, ms.
    pub ack_delay_ms: f64,
    /// Goodput in each 100 ms from the start, bit/s.
    pub goodput_series_bps: Vec<f64>,
}

impl TcpResult {
    /// Add another flow's figures (the `sum` pseudo-scheduler: one flow per channel).
    pub fn merge(&mut self, o: &TcpResult) {
        self.goodput_bps += o.goodput_bps;
        self.retransmits += o.retransmits;
        self.ce_marks_seen += o.ce_marks_seen;
        self.ecn_reductions += o.ecn_reductions;
        self.loss_reductions += o.loss_reductions;
        self.rto_count += o.rto_count;
        self.cwnd_max = self.cwnd_max.max(o.cwnd_max);
        self.segments_sent += o.segments_sent;
        self.duplicate_segments += o.duplicate_segments;
        self.min_rtt_ms = self.min_rtt_ms.min(o.min_rtt_ms);
        self.srtt_ms = self.srtt_ms.max(o.srtt_ms);
        self.ack_delay_ms = self.ack_delay_ms.max(o.ack_delay_ms);
        if self.goodput_series_bps.len() < o.goodput_series_bps.len() {
            self.goodput_series_bps
                .resize(o.goodput_series_bps.len(), 0.0);
        }
        for (a, b) in self
            .goodput_series_bps
            .iter_mut()
            .zip(&o.goodput_series_bps)
        {
            *a += b;
        }
    }
}

/// An acknowledgement, receiver to sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ack {
    /// The next segment the receiver expects in order (cumulative).
    pub cum: u64,
    /// The segment whose arrival this acknowledges.
    pub seg: u64,
    /// That segment arrived marked CE.
    pub ce: bool,
    /// Its send time (the timestamp echo).
    pub echo: Nanos,
}

/// What a TCP packet carries, read back at the receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// Transmission id: unique per packet sent, retransmissions included.
    pub tx: u64,
    /// Send time, ns.
    pub sent: Nanos,
    /// Segment number.
    pub seg: u64,
    /// The ECN field says CE.
    pub ce: bool,
}

/// The IPv4 header checksum of `h` (20 bytes, checksum field included as it is).
pub(crate) fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum = 0u32;
    for (i, w) in h.chunks(2).enumerate() {
        if i != 5 {
            sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Build one TCP packet of `len` bytes (at least [`MIN_TCP_PACKET`]): a valid IPv4
/// header (ECT(0) when `ecn`, protocol 253 "experimental", 10.0.0.1 to 10.0.0.2,
/// correct checksum), then transmission id, send time and segment number.
pub fn packet(buf: &mut BytesMut, len: usize, ecn: bool, st: Stamp) -> Bytes {
    let len = len.max(MIN_TCP_PACKET as usize);
    if buf.capacity() - buf.len() < len {
        *buf = BytesMut::with_capacity((1 << 20).max(len));
    }
    let total = (len.min(65_535) as u16).to_be_bytes();
    let id = (st.tx as u16).to_be_bytes();
    let mut h = [
        0x45,
        if ecn { 0x02 } else { 0x00 },
        total[0],
        total[1],
        id[0],
        id[1],
        0x40,
        0x00,
        64,
        253,
        0,
        0,
        10,
        0,
        0,
        1,
        10,
        0,
        0,
        2,
    ];
    let c = ipv4_checksum(&h);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    buf.extend_from_slice(&h);
    buf.extend_from_slice(&st.tx.to_be_bytes());
    buf.extend_from_slice(&st.sent.to_be_bytes());
    buf.extend_from_slice(&st.seg.to_be_bytes());
    buf.resize(buf.len() + len - MIN_TCP_PACKET as usize, 0);
    buf.split().freeze()
}

/// Read a TCP packet back; `None` if it is not one (too short, not IPv4 with a
/// 20-byte header, or its header checksum is wrong).
pub fn stamp(p: &[u8]) -> Option<Stamp> {
    if p.len() < MIN_TCP_PACKET as usize || p[0] != 0x45 {
        return None;
    }
    if ipv4_checksum(&p[..20]) != u16::from_be_bytes([p[10], p[11]]) {
        return None;
    }
    let rd = |o: usize| u64::from_be_bytes(p[o..o + 8].try_into().expect("8 bytes"));
    Some(Stamp {
        tx: rd(20),
        sent: rd(28),
        seg: rd(36),
        ce: p[1] & 3 == 3,
    })
}

#[derive(Clone, Copy, Debug, Default)]
struct Seg {
    sacked: bool,
    /// Declared lost and not sent again since.
    lost: bool,
    retx: u32,
    /// Time of the latest transmission.
    xmit: Nanos,
}

const CUBIC_C: f64 = 0.4;
const CUBIC_BETA: f64 = 0.7;
const DUPTHRESH: u64 = 3;
const INITIAL_RTO: Nanos = 1_000_000_000;
const MAX_RTO: Nanos = 120_000_000_000;
const HYSTART_LOW_WINDOW: f64 = 16.0;
const HYSTART_SAMPLES: u32 = 8;

/// The sending side of the flow (sans-IO: feed it acknowledgements and timeouts, poll
/// it for segments to send).
#[derive(Clone, Debug)]
pub struct TcpSender {
    cc: Cc,
    hystart: bool,
    rwnd: u64,
    min_rto: Nanos,
    /// Per outstanding segment, index `seq - una`.
    segs: VecDeque<Seg>,
    una: u64,
    nxt: u64,
    n_sacked: u64,
    n_lost: u64,
    lost_q: BTreeSet<u64>,
    /// (segment, transmission time) in transmission order, for RACK.
    xmit_q: VecDeque<(u64, Nanos)>,
    /// Dupthresh scan: segments below this were checked.
    fack_scan: u64,
    highest_sacked: Option<u64>,
    rack_xmit: Nanos,
    reordering_seen: bool,
    cwnd: f64,
    ssthresh: f64,
    w_max: f64,
    epoch_start: Option<Nanos>,
    k: f64,
    origin: f64,
    w_est: f64,
    round_end: u64,
    round_min: Nanos,
    round_samples: u32,
    srtt: Option<f64>,
    rttvar: f64,
    min_rtt: Nanos,
    rto: Nanos,
    backoff: u32,
    deadline: Option<Nanos>,
    /// A reduction is in force until `una` reaches this.
    reduce_point: Option<u64>,
    in_recovery: bool,
    /// After a timeout: the window grows in slow start while the lost data is resent
    /// (a fast recovery or CWR holds the window instead).
    loss_state: bool,
    /// Counters.
    pub stats: SenderStats,
}

/// The sender's counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SenderStats {
    /// Segments sent, retransmissions included.
    pub sent: u64,
    /// Retransmissions.
    pub retransmits: u64,
    /// Timeouts.
    pub rto_count: u64,
    /// Acknowledgements that echoed a CE mark.
    pub ce_echoes: u64,
    /// Window reductions for CE.
    pub ecn_reductions: u64,
    /// Window reductions for loss (not counting timeouts).
    pub loss_reductions: u64,
    /// Largest window, segments.
    pub cwnd_max: f64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Signal {
    Loss,
    Ecn,
}

impl TcpSender {
    /// A sender with nothing sent yet.
    pub fn new(spec: &TcpSpec) -> TcpSender {
        let cwnd = f64::from(spec.init_cwnd.max(1)).min(f64::from(spec.rwnd.max(1)));
        TcpSender {
            cc: spec.cc,
            hystart: spec.hystart && spec.cc == Cc::Cubic,
            rwnd: u64::from(spec.rwnd.max(1)),
            min_rto: spec.min_rto,
            segs: VecDeque::new(),
            una: 0,
            nxt: 0,
            n_sacked: 0,
            n_lost: 0,
            lost_q: BTreeSet::new(),
            xmit_q: VecDeque::new(),
            fack_scan: 0,
            highest_sacked: None,
            rack_xmit: 0,
            reordering_seen: false,
            cwnd,
            ssthresh: f64::INFINITY,
            w_max: 0.0,
            epoch_start: None,
            k: 0.0,
            origin: 0.0,
            w_est: 0.0,
            round_end: 0,
            round_min: Nanos::MAX,
            round_samples: 0,
            srtt: None,
            rttvar: 0.0,
            min_rtt: Nanos::MAX,
            rto: INITIAL_RTO,
            backoff: 0,
            deadline: None,
            reduce_point: None,
            in_recovery: false,
            loss_state: false,
            stats: SenderStats {
                cwnd_max: cwnd,
                ..SenderStats::default()
            },
        }
    }

    /// The congestion window, segments.
    pub fn cwnd(&self) -> f64 {
        self.cwnd
    }

    /// The slow-start threshold, segments (infinite before the first reduction).
    pub fn ssthresh(&self) -> f64 {
        self.ssthresh
    }

    /// Segments sent and not yet acknowledged cumulatively.
    pub fn outstanding(&self) -> u64 {
        self.nxt - self.una
    }

    /// Segments in flight (RFC 6675 `pipe`): outstanding, not delivered, not lost.
    pub fn pipe(&self) -> u64 {
        self.outstanding() - self.n_sacked - self.n_lost
    }

    /// The smoothed RTT, ns (`None` before the first sample).
    pub fn srtt(&self) -> Option<f64> {
        self.srtt
    }

    /// The smallest RTT sample, ns (`None` before the first).
    pub fn min_rtt(&self) -> Option<Nanos> {
        (self.min_rtt != Nanos::MAX).then_some(self.min_rtt)
    }

    /// When the retransmission timer expires, if it runs.
    pub fn deadline(&self) -> Option<Nanos> {
        self.deadline
    }

    fn rto_now(&self) -> Nanos {
        (self.rto << self.backoff.min(16)).min(MAX_RTO)
    }

    fn reducing(&self) -> bool {
        self.reduce_point.is_some_and(|p| self.una < p)
    }

    /// The next segment to send at `now`, if the windows allow one: a lost segment
    /// first, else a new one. Returns (segment, is a retransmission).
    pub fn poll_send(&mut self, now: Nanos) -> Option<(u64, bool)> {
        if (self.pipe() as f64) >= self.cwnd.floor().max(1.0) {
            return None;
        }
        let (seq, retx) = if let Some(s) = self.lost_q.pop_first() {
            let g = &mut self.segs[(s - self.una) as usize];
            g.lost = false;
            g.retx += 1;
            g.xmit = now;
            self.n_lost -= 1;
            self.stats.retransmits += 1;
            (s, true)
        } else {
            if self.outstanding() >= self.rwnd {
                return None;
            }
            self.segs.push_back(Seg {
                xmit: now,
                ..Seg::default()
            });
            self.nxt += 1;
            (self.nxt - 1, false)
        };
        self.xmit_q.push_back((seq, now));
        self.stats.sent += 1;
        if self.deadline.is_none() {
            self.deadline = Some(now + self.rto_now());
        }
        Some((seq, retx))
    }

    fn rtt_sample(&mut self, rtt: Nanos) {
        let r = rtt as f64;
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2.0;
            }
            Some(s) => {
                self.rttvar = 0.75 * self.rttvar + 0.25 * (s - r).abs();
                self.srtt = Some(0.875 * s + 0.125 * r);
            }
        }
        let s = self.srtt.unwrap_or(r);
        self.rto = ((s + (4.0 * self.rttvar).max(self.min_rto as f64)).round() as Nanos)
            .clamp(1_000_000, MAX_RTO);
        self.min_rtt = self.min_rtt.min(rtt);
        // HyStart (delay): the minimum of the round's first samples against the flow's
        // minimum RTT.
        if self.hystart && self.cwnd < self.ssthresh && self.round_samples < HYSTART_SAMPLES {
            self.round_min = self.round_min.min(rtt);
            self.round_samples += 1;
            if self.round_samples == HYSTART_SAMPLES && self.cwnd >= HYSTART_LOW_WINDOW {
                let thresh = (self.min_rtt / 8).clamp(4_000_000, 16_000_000);
                if self.round_min >= self.min_rtt + thresh {
                    self.ssthresh = self.cwnd;
                }
            }
        }
    }

    fn reduce(&mut self, sig: Signal) {
        match self.cc {
            Cc::Cubic => {
                self.w_max = if self.cwnd < self.w_max {
                    self.cwnd * (1.0 + CUBIC_BETA) / 2.0
                } else {
                    self.cwnd
                };
                self.ssthresh = (self.cwnd * CUBIC_BETA).max(2.0);
            }
            Cc::Reno => self.ssthresh = (self.cwnd / 2.0).max(2.0),
        }
        self.cwnd = self.ssthresh;
        self.epoch_start = None;
        self.reduce_point = Some(self.nxt);
        match sig {
            Signal::Loss => {
                self.in_recovery = true;
                self.stats.loss_reductions += 1;
            }
            Signal::Ecn => self.stats.ecn_reductions += 1,
        }
    }

    fn grow(&mut self, now: Nanos, acked: u64) {
        let a = acked as f64;
        if self.cwnd < self.ssthresh {
            self.cwnd = (self.cwnd + a).min(self.ssthresh.max(self.cwnd + 1.0));
        } else {
            match self.cc {
                Cc::Reno => self.cwnd += a / self.cwnd,
                Cc::Cubic => {
                    let start = *self.epoch_start.get_or_insert_with(|| {
                        if self.cwnd < self.w_max {
                            self.k = ((self.w_max - self.cwnd) / CUBIC_C).cbrt();
                            self.origin = self.w_max;
                        } else {
                            self.k = 0.0;
                            self.origin = self.cwnd;
                        }
                        self.w_est = self.cwnd;
                        now
                    });
                    let min_rtt = self.min_rtt().unwrap_or(0) as f64 / 1e9;
                    let t = (now - start) as f64 / 1e9 + min_rtt;
                    let target = self.origin + CUBIC_C * (t - self.k).powi(3);
                    // At most 1.5× per round trip, as Linux (one segment per two acked).
                    let per_ack = if target > self.cwnd {
                        ((target - self.cwnd) / self.cwnd).min(0.5)
                    } else {
                        0.01 / self.cwnd
                    };
                    self.w_est += a * 3.0 * (1.0 - CUBIC_BETA) / (1.0 + CUBIC_BETA) / self.cwnd;
                    self.cwnd += per_ack * a;
                    if self.w_est > self.cwnd {
                        self.cwnd = self.w_est;
                    }
                }
            }
        }
        self.cwnd = self.cwnd.min(self.rwnd as f64);
        self.stats.cwnd_max = self.stats.cwnd_max.max(self.cwnd);
    }

    fn mark_lost(&mut self, s: u64) -> bool {
        let g = &mut self.segs[(s - self.una) as usize];
        if g.sacked || g.lost {
            return false;
        }
        g.lost = true;
        self.n_lost += 1;
        self.lost_q.insert(s);
        true
    }

    /// An acknowledgement arrives at `now`.
    pub fn on_ack(&mut self, now: Nanos, ack: Ack) {
        self.rtt_sample(now.saturating_sub(ack.echo));
        // The segment that arrived (a SACK of it), then the cumulative point.
        let mut delivered = self.sack(ack.seg);
        self.rack_xmit = self.rack_xmit.max(ack.echo);
        let advanced = ack.cum > self.una;
        delivered += self.advance_to(ack.cum);
        if advanced {
            self.backoff = 0;
            self.deadline = (self.outstanding() > 0).then(|| now + self.rto_now());
        }
        if !self.reducing() {
            self.in_recovery = false;
            self.loss_state = false;
        }
        // HyStart's rounds: one per window of data.
        if self.una >= self.round_end {
            self.round_end = self.nxt;
            self.round_min = Nanos::MAX;
            self.round_samples = 0;
        }
        let lost = self.detect_losses();
        if ack.ce {
            self.stats.ce_echoes += 1;
            if !self.reducing() {
                self.reduce(Signal::Ecn);
            }
        }
        if lost && !self.reducing() {
            self.reduce(Signal::Loss);
        }
        if lost && !self.in_recovery {
            // A loss inside an ECN reduction: recover without reducing again.
            self.in_recovery = true;
        }
        if delivered > 0 && (!self.reducing() || self.loss_state) {
            self.grow(now, delivered);
        }
    }

    /// Segment `seg` arrived: SACKed (no longer lost; reordering if a later original
    /// was SACKed first). How many segments that delivers (0 or 1).
    fn sack(&mut self, seg: u64) -> u64 {
        let mut delivered = 0;
        if seg >= self.una && seg < self.nxt {
            let g = &mut self.segs[(seg - self.una) as usize];
            if !g.sacked {
                g.sacked = true;
                self.n_sacked += 1;
                if g.lost {
                    g.lost = false;
                    self.n_lost -= 1;
                    self.lost_q.remove(&seg);
                }
                if g.retx == 0 && self.highest_sacked.is_some_and(|h| seg < h) {
                    self.reordering_seen = true;
                }
                delivered += 1;
                self.highest_sacked = Some(self.highest_sacked.map_or(seg, |h| h.max(seg)));
            }
        }
        delivered
    }

    /// Move the cumulative point to `cum`; how many segments that delivers (those not
    /// SACKed before).
    fn advance_to(&mut self, cum: u64) -> u64 {
        let mut delivered = 0;
        while self.una < cum.min(self.nxt) {
            let Some(g) = self.segs.pop_front() else {
                break;
            };
            if g.sacked {
                self.n_sacked -= 1;
            } else {
                delivered += 1;
                if g.lost {
                    self.n_lost -= 1;
                    self.lost_q.remove(&self.una);
                }
            }
            self.una += 1;
        }
        delivered
    }

    /// Loss detection: FACK (DUPTHRESH segments SACKed above an original) and RACK (sent
    /// a reordering window before the latest delivered transmission). Any new loss?
    fn detect_losses(&mut self) -> bool {
        let mut lost = false;
        if let Some(h) = self.highest_sacked {
            self.fack_scan = self.fack_scan.max(self.una);
            while self.fack_scan + DUPTHRESH <= h {
                let s = self.fack_scan;
                self.fack_scan += 1;
                if s >= self.una && self.segs[(s - self.una) as usize].retx == 0 {
                    lost |= self.mark_lost(s);
                }
            }
        }
        let reo_wnd = if !self.reordering_seen && (self.in_recovery || self.n_sacked >= DUPTHRESH) {
            0
        } else {
            self.min_rtt().unwrap_or(0) / 4
        };
        while let Some(&(s, t)) = self.xmit_q.front() {
            if t.saturating_add(reo_wnd) >= self.rack_xmit {
                break;
            }
            self.xmit_q.pop_front();
            if s >= self.una && self.segs[(s - self.una) as usize].xmit == t {
                lost |= self.mark_lost(s);
            }
        }
        while self.xmit_q.front().is_some_and(|&(s, _)| s < self.una) {
            self.xmit_q.pop_front();
        }
        lost
    }

    /// The retransmission timer fires at `now` (nothing happens before the deadline).
    pub fn on_timeout(&mut self, now: Nanos) {
        match self.deadline {
            Some(d) if d <= now => {}
            _ => return,
        }
        if self.outstanding() == 0 {
            self.deadline = None;
            return;
        }
        self.stats.rto_count += 1;
        if self.backoff == 0 {
            match self.cc {
                Cc::Cubic => {
                    self.w_max = self.cwnd;
                    self.ssthresh = (self.cwnd * CUBIC_BETA).max(2.0);
                }
                Cc::Reno => self.ssthresh = (self.cwnd / 2.0).max(2.0),
            }
        }
        self.cwnd = 1.0;
        self.epoch_start = None;
        for s in self.una..self.nxt {
            self.mark_lost(s);
        }
        self.reduce_point = Some(self.nxt);
        self.in_recovery = true;
        self.loss_state = true;
        self.backoff += 1;
        self.deadline = Some(now + self.rto_now());
    }
}

/// The receiving side: in-order delivery to the application, one acknowledgement per
/// segment.
#[derive(Clone, Debug)]
pub struct TcpReceiver {
    rcv_nxt: u64,
    ooo: BTreeSet<u64>,
    payload: u64,
    window_end: Nanos,
    /// Application bytes delivered in order before the window's end.
    pub goodput_bytes: u64,
    /// The same per 100 ms bin.
    pub series: Vec<u64>,
    /// Segments that arrived marked CE.
    pub ce_seen: u64,
    /// Segments that arrived again.
    pub duplicates: u64,
}

impl TcpReceiver {
    /// A receiver counting `payload` bytes per segment as goodput until `window_end`.
    pub fn new(payload: u64, window_end: Nanos) -> TcpReceiver {
        TcpReceiver {
            rcv_nxt: 0,
            ooo: BTreeSet::new(),
            payload,
            window_end,
            goodput_bytes: 0,
            series: Vec::new(),
            ce_seen: 0,
            duplicates: 0,
        }
    }

    /// The next segment expected in order.
    pub fn rcv_nxt(&self) -> u64 {
        self.rcv_nxt
    }

    /// Segment `st` arrives at `now`; returns the acknowledgement to send.
    pub fn on_segment(&mut self, now: Nanos, st: Stamp) -> Ack {
        self.ce_seen += u64::from(st.ce);
        if st.seg < self.rcv_nxt || !self.ooo.insert(st.seg) {
            self.duplicates += 1;
        } else {
            let before = self.rcv_nxt;
            while self.ooo.remove(&self.rcv_nxt) {
                self.rcv_nxt += 1;
            }
            let n = self.rcv_nxt - before;
            if n > 0 && now < self.window_end {
                let bytes = n * self.payload;
                self.goodput_bytes += bytes;
                let i = (now / SERIES_BIN) as usize;
                if self.series.len() <= i {
                    self.series.resize(i + 1, 0);
                }
                self.series[i] += bytes;
            }
        }
        Ack {
            cum: self.rcv_nxt,
            seg: st.seg,
            ce: st.ce,
            echo: st.sent,
        }
    }
}

/// A whole flow inside the engine: sender, receiver, the acknowledgement path.
pub(crate) struct TcpFlow {
    pub snd: TcpSender,
    pub rcv: TcpReceiver,
    pub acks: VecDeque<(Nanos, Ack)>,
    pub ack_delay: Nanos,
    /// Until this time the acknowledgements take `ack_delay_early` instead.
    early_until: Nanos,
    ack_delay_early: Nanos,
    /// The time of the earliest timer event in the engine's queue, if any.
    pub timer_at: Option<Nanos>,
    pub seg_bytes: u32,
    pub ecn: bool,
    pub next_tx: u64,
    pub buf: BytesMut,
    cc: Cc,
}

impl TcpFlow {
    /// A flow whose acknowledgements take `ack_delay`, or `early.0` until `early.1`.
    pub fn new(
        spec: &TcpSpec,
        seg_bytes: u32,
        ack_delay: Nanos,
        early: (Nanos, Nanos),
        window_end: Nanos,
    ) -> TcpFlow {
        TcpFlow {
            snd: TcpSender::new(spec),
            rcv: TcpReceiver::new(
                u64::from(seg_bytes.saturating_sub(spec.header_bytes)),
                window_end,
            ),
            acks: VecDeque::new(),
            ack_delay,
            ack_delay_early: early.0,
            early_until: early.1,
            timer_at: None,
            seg_bytes,
            ecn: spec.ecn,
            next_tx: 0,
            buf: BytesMut::with_capacity(1 << 20),
            cc: spec.cc,
        }
    }

    /// The packet for segment `seg`, sent at `now`.
    pub fn packet(&mut self, now: Nanos, seg: u64) -> Bytes {
        let st = Stamp {
            tx: self.next_tx,
            sent: now,
            seg,
            ce: false,
        };
        self.next_tx += 1;
        packet(&mut self.buf, self.seg_bytes as usize, self.ecn, st)
    }

    /// When an acknowledgement sent at `now` arrives: after the delay in force, and
    /// never before the one sent before it (the path is FIFO).
    pub fn ack_arrival(&self, now: Nanos) -> Nanos {
        let d = if now < self.early_until {
            self.ack_delay_early
        } else {
            self.ack_delay
        };
        let last = self.acks.back().map_or(0, |a| a.0);
        now.saturating_add(d).max(last)
    }

    /// The figures, `span_s` being the flow's time (start to the window's end).
    pub fn result(&self, span_s: f64) -> TcpResult {
        let s = &self.snd.stats;
        let bin_s = SERIES_BIN as f64 / 1e9;
        TcpResult {
            cc: self.cc.name().into(),
            goodput_bps: self.rcv.goodput_bytes as f64 * 8.0 / span_s.max(1e-9),
            retransmits: s.retransmits,
            ce_marks_seen: self.rcv.ce_seen,
            ecn_reductions: s.ecn_reductions,
            loss_reductions: s.loss_reductions,
            rto_count: s.rto_count,
            cwnd_max: s.cwnd_max,
            segments_sent: s.sent,
            duplicate_segments: self.rcv.duplicates,
            min_rtt_ms: self.snd.min_rtt().map_or(0.0, |r| r as f64 / 1e6),
            srtt_ms: self.snd.srtt().map_or(0.0, |r| r / 1e6),
            ack_delay_ms: self.ack_delay as f64 / 1e6,
            goodput_series_bps: self
                .rcv
                .series
                .iter()
                .map(|&b| b as f64 * 8.0 / bin_s)
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_round_trip_and_take_a_ce_mark() {
        let mut buf = BytesMut::new();
        let st = Stamp {
            tx: 77,
            sent: 123_456,
            seg: 9,
            ce: false,
        };
        let p = packet(&mut buf, 1448, true, st);
        assert_eq!(p.len(), 1448);
        assert_eq!(stamp(&p), Some(st));
        let mut m = p.to_vec();
        assert_eq!(
            braid_proto::aqm::mark_ce(&mut m),
            braid_proto::aqm::Ecn::Marked
        );
        assert_eq!(
            stamp(&m),
            Some(Stamp { ce: true, ..st }),
            "checksum still valid"
        );
        let q = packet(&mut buf, 100, false, st);
        let mut m = q.to_vec();
        assert_eq!(
            braid_proto::aqm::mark_ce(&mut m),
            braid_proto::aqm::Ecn::NotEct
        );
        let mut bad = p.to_vec();
        bad[15] ^= 1;
        assert_eq!(stamp(&bad), None);
    }

    #[test]
    fn three_later_segments_make_a_fast_retransmit() {
        let spec = TcpSpec {
            hystart: false,
            ..TcpSpec::default()
        };
        let mut s = TcpSender::new(&spec);
        let mut sent = Vec::new();
        while let Some(x) = s.poll_send(0) {
            sent.push(x);
        }
        assert_eq!(sent.len(), 10);
        // Segment 2 lost; 0, 1 and 3.. arrive.
        let mut cum = 0;
        for seg in [0u64, 1, 3, 4, 5] {
            if seg == cum {
                cum += 1;
            }
            s.on_ack(
                10_000_000,
                Ack {
                    cum,
                    seg,
                    ce: false,
                    echo: 0,
                },
            );
        }
        assert_eq!(s.stats.loss_reductions, 1);
        let mut retx = Vec::new();
        while let Some(x) = s.poll_send(10_000_000) {
            retx.push(x);
        }
        assert_eq!(retx.first(), Some(&(2, true)));
        assert_eq!(s.stats.retransmits, 1);
    }
}
