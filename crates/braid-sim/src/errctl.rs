//! Error-control runs (`[errctl]`, seed 002 §5): one [`braid_proto::errctl::Sender`] and
//! one [`braid_proto::errctl::Receiver`] over one simulated channel, in the paper's
//! simulation model (Fig. 8): the data connection has a rate, a one-way delay and a loss
//! process (Bernoulli or the Gilbert good/bad model of Fig. 9); the sender is never
//! short of data (its window is the only limit); control packets (SNAK, PACK) travel
//! "out of band": they take the channel's one-way delay back, use no data bandwidth and
//! are never lost. Keep-alive and end-of-stream packets do use the data channel.
//!
//! Measures, as the paper defines them (§5.1): the **throughput efficiency** (ideal
//! segment transmitting time over the actual time per segment, measured as the rate at
//! which segments were accepted between the first and the last acceptance) and the
//! **end-to-end delay** of a segment (from the start of transmission of its first packet
//! to its acceptance at the receiver).

use std::collections::VecDeque;

use braid_proto::errctl::{analysis, Receiver, Sender};
use braid_proto::wire::errctl::{DataKind, DataPacket, DataRepr, DATA_HEADER_LEN};
use braid_proto::Instant;
use bytes::Bytes;

use crate::metrics::Histogram;
use crate::model::{Fate, LossModel, Nanos};
use crate::rng::{streams, Rng};
use crate::run::{ChannelResult, RunConfig, RunError, RunResult};
pub use crate::run::{ErrCtlResult, ErrCtlSpec};

struct Loop<'a> {
    cfg: &'a RunConfig,
    spec: &'a ErrCtlSpec,
    now: Nanos,
    tx: Sender,
    rx: Receiver,
    loss: LossModel,
    fwd: VecDeque<(Nanos, Bytes)>,
    back: VecDeque<(Nanos, Bytes)>,
    tx_free: Nanos,
    blocked: bool,
    offered: u64,
    payload: Bytes,
    /// Per segment: when its first packet started transmission.
    first_tx: Vec<Nanos>,
    delays: Histogram,
    accept_first: Option<Nanos>,
    accept_last: Nanos,
    delivered_packets: u64,
    lost_packets: u64,
    segments: u64,
    chan: ChannelResult,
    events: u64,
}

/// Run one error-control configuration to completion (every packet delivered or
/// given up and the sender idle, or the run's duration plus drain).
pub fn run(cfg: &RunConfig, spec: &ErrCtlSpec) -> Result<RunResult, RunError> {
    if cfg.channels.len() != 1 {
        return Err(RunError::ErrCtl(
            "an [errctl] run needs exactly one channel".into(),
        ));
    }
    if cfg.packets.is_none() {
        return Err(RunError::ErrCtl("an [errctl] run needs `packets`".into()));
    }
    spec.config.validate().map_err(RunError::ErrCtl)?;
    let ch = &cfg.channels[0];
    let mut l = Loop {
        cfg,
        spec,
        now: 0,
        tx: Sender::new(spec.config.clone()),
        rx: Receiver::new(spec.config.clone()),
        loss: LossModel::new(ch, Rng::stream(cfg.seed, streams::CHANNEL_BASE)),
        fwd: VecDeque::new(),
        back: VecDeque::new(),
        tx_free: 0,
        blocked: false,
        offered: 0,
        payload: Bytes::from(vec![0u8; spec.packet_bytes as usize - DATA_HEADER_LEN]),
        first_tx: Vec::new(),
        delays: Histogram::new(),
        accept_first: None,
        accept_last: 0,
        delivered_packets: 0,
        lost_packets: 0,
        segments: 0,
        chan: ChannelResult::default(),
        events: 0,
    };
    l.run_loop();
    Ok(l.finish())
}

impl Loop<'_> {
    fn us(&self) -> Instant {
        Instant::from_micros(self.now / 1000)
    }

    fn limit(&self) -> u64 {
        self.cfg.packets.unwrap_or(0)
    }

    fn run_loop(&mut self) {
        let hard = self
            .cfg
            .duration
            .map_or(u64::MAX, |d| d.saturating_add(self.cfg.drain));
        loop {
            self.events += 1;
            self.step();
            let done = self.delivered_packets + self.lost_packets >= self.limit();
            if (done && self.tx.is_idle()) || self.now >= hard {
                return;
            }
            let Some(next) = self.next_event() else {
                return;
            };
            self.now = next.max(self.now + 1);
        }
    }

    /// Everything due at `now`, in a fixed order.
    fn step(&mut self) {
        let t = self.us();
        while self.offered < self.limit() && self.tx.can_accept() {
            let _ = self.tx.handle_packet(t, self.payload.clone());
            self.offered += 1;
            self.blocked = false;
        }
        if self.offered == self.limit() {
            self.tx.finish(t);
        }
        while self.fwd.front().is_some_and(|x| x.0 <= self.now) {
            let (_, d) = self.fwd.pop_front().expect("front exists");
            self.rx.handle_datagram(t, &d);
        }
        while self.back.front().is_some_and(|x| x.0 <= self.now) {
            let (_, d) = self.back.pop_front().expect("front exists");
            self.tx.handle_datagram(t, &d);
            self.blocked = false;
        }
        if self.tx.poll_timeout().is_some_and(|x| x <= t) {
            self.tx.handle_timeout(t);
            self.blocked = false;
        }
        if self.rx.poll_timeout().is_some_and(|x| x <= t) {
            self.rx.handle_timeout(t);
        }
        let delay = self.cfg.channels[0].delay;
        while let Some(c) = self.rx.poll_transmit() {
            self.back.push_back((self.now + delay, c));
        }
        self.collect();
        if self.now >= self.tx_free && !self.blocked {
            match self.tx.poll_transmit(t) {
                Some(d) => self.send(d),
                None => self.blocked = true,
            }
        }
    }

    /// Put one datagram on the channel.
    fn send(&mut self, d: Bytes) {
        let ch = &self.cfg.channels[0];
        let len = d.len() as u64;
        let ser =
            ((len + u64::from(ch.overhead_bytes)) as f64 * 8e9 / ch.rate_bps).round() as Nanos;
        if let Ok(p) = DataPacket::new_checked(&d[..]) {
            if let Ok(r) = DataRepr::parse(&p) {
                if r.kind == DataKind::Data {
                    let seg = r.segment as usize;
                    if self.first_tx.len() <= seg {
                        self.first_tx.resize(seg + 1, self.now);
                    }
                } else {
                    self.chan.control_packets += 1;
                }
            }
        }
        self.chan.packets += 1;
        self.chan.bytes += len;
        self.tx_free = self.now + ser.max(1);
        match self.loss.fate(self.now) {
            Fate::Delivered => self.fwd.push_back((self.tx_free + ch.delay, d)),
            _ => self.chan.lost += 1,
        }
    }

    /// Segments delivered: delays and acceptance times.
    fn collect(&mut self) {
        while let Some(s) = self.rx.poll_deliver() {
            let accepted = s.accepted_at.as_micros() * 1000;
            let first = self
                .first_tx
                .get(s.number as usize)
                .copied()
                .unwrap_or(accepted);
            self.delays.record(accepted.saturating_sub(first));
            self.accept_first = Some(self.accept_first.map_or(accepted, |a| a.min(accepted)));
            self.accept_last = self.accept_last.max(accepted);
            let present = s.packets.iter().filter(|p| p.is_some()).count() as u64;
            self.delivered_packets += present;
            self.lost_packets += s.packets.len() as u64 - present;
            self.segments += 1;
        }
    }

    fn next_event(&self) -> Option<Nanos> {
        let ns = |i: Instant| i.as_micros() * 1000;
        [
            self.fwd.front().map(|x| x.0),
            self.back.front().map(|x| x.0),
            self.tx.poll_timeout().map(|x| ns(x).max(self.tx_free)),
            self.rx.poll_timeout().map(ns),
            (!self.blocked).then_some(self.tx_free),
            (self.offered < self.limit() && self.tx.can_accept()).then_some(self.now),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn finish(self) -> RunResult {
        let ch = &self.cfg.channels[0];
        let c = &self.spec.config;
        let t = c.tolerance;
        let link = analysis::Link {
            packet_bytes: f64::from(self.spec.packet_bytes),
            segment_packets: f64::from(t.w),
            rate_bps: ch.rate_bps,
            rtd_s: 2.0 * ch.delay as f64 / 1e9,
        };
        let t_s_ns = link.t_s() * 1e9;
        let efficiency = match self.accept_first {
            Some(a) if self.segments > 1 && self.accept_last > a => {
                (self.segments - 1) as f64 * t_s_ns / (self.accept_last - a) as f64
            }
            _ => 0.0,
        };
        let bernoulli = ch.gilbert.is_none() && ch.loss_windows.is_empty() && ch.corrupt == 0.0;
        let analysable = t.full_recovery() && bernoulli;
        let rs = self.rx.stats();
        let ss = self.tx.stats();
        let ec = ErrCtlResult {
            tolerance: [t.w, t.e, t.b],
            window: c.window,
            throughput_efficiency: efficiency,
            analysis_efficiency: analysable.then(|| link.efficiency(f64::from(c.window), ch.loss)),
            max_delay_ms: self.delays.max() as f64 / 1e6,
            mean_delay_ms: self.delays.mean() / 1e6,
            analysis_mean_delay_ms: analysable.then(|| link.delay_receiver(ch.loss) * 1e3),
            segments: self.segments,
            violations: rs.violations,
            forced: rs.segments_forced,
            packets_tolerated: rs.packets_tolerated,
            retransmissions: ss.retransmissions,
            snaks: rs.snaks_sent,
            packs: rs.packs_sent,
        };
        let dur_s = self.accept_last.max(1) as f64 / 1e9;
        let payload = (self.spec.packet_bytes as usize - DATA_HEADER_LEN) as f64;
        let mut chan = self.chan;
        chan.data_packets = chan.packets - chan.control_packets;
        chan.throughput_bps = chan.bytes as f64 * 8.0 / dur_s;
        RunResult {
            duration_s: dur_s,
            goodput_bps: self.delivered_packets as f64 * payload * 8.0 / dur_s,
            inorder_goodput_bps: self.delivered_packets as f64 * payload * 8.0 / dur_s,
            packets_sent: ss.packets_sent,
            packets_delivered: self.delivered_packets,
            packets_lost: ss.packets_sent.saturating_sub(self.delivered_packets),
            lost_on_channel: chan.lost,
            latency: self.delays,
            data_bytes: chan.bytes,
            channels: vec![chan],
            events: self.events,
            errctl: Some(ec),
            ..RunResult::default()
        }
    }
}
