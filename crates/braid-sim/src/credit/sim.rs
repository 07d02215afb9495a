//! The slotted-link loop of a credit run.

use std::collections::VecDeque;

use braid_proto::credit::{Admit, Allocation, CreditReceiver, CreditSender};
use braid_proto::wire::credit::Repr;

use super::{machines, slot, Control, CreditRun, RunReport, UnitReport, UnitSpec};
use crate::rng::{mix64, Rng};

/// A source upstream of the sender: smooth (fluid) or bursty on/off arrivals.
struct Source {
    queue: u64,
    fluid: f64,
    next_burst: f64,
    offered: u64,
}

impl Source {
    fn load_at(spec: &UnitSpec, t: u64) -> f64 {
        spec.load
            .iter()
            .take_while(|(from, _)| *from <= t)
            .last()
            .map_or(0.0, |&(_, l)| l)
    }

    /// New cells at slot `t`.
    fn arrive(&mut self, spec: &UnitSpec, t: u64, rng: &mut Rng) {
        let load = Self::load_at(spec, t);
        if load <= 0.0 {
            return;
        }
        let n = if spec.burst == 0 {
            self.fluid += load;
            let n = self.fluid.floor();
            self.fluid -= n;
            n as u64
        } else {
            let mut n = 0;
            while self.next_burst <= t as f64 {
                n += spec.burst as u64;
                self.next_burst += rng.exp(spec.burst as f64 / load);
            }
            n
        };
        self.queue += n;
        self.offered += n;
    }
}

/// Per-unit state at the receiver and the counters of the timeline.
#[derive(Default)]
struct Downstream {
    held: u64,
    tokens: f64,
    forwarded: u64,
    bucket: u64,
}

struct World {
    tx: Option<(CreditSender, CreditReceiver)>,
    /// Data cells (unit) and checks (bytes) in flight to the receiver, FIFO.
    to_rx: VecDeque<(u64, Result<usize, Vec<u8>>)>,
    /// Credits in flight to the sender.
    to_tx: VecDeque<(u64, Vec<u8>)>,
    sources: Vec<Source>,
    down: Vec<Downstream>,
    held: u64,
    /// Sum over slots of the cells waiting at the sender.
    waiting: u128,
    rep: RunReport,
    rr: usize,
    rng: Rng,
}

/// Simulate one run.
pub fn run(r: &CreditRun, seed: u64) -> RunReport {
    let n = r.units.len();
    let mut rng = Rng::new(mix64(seed));
    let sources = r
        .units
        .iter()
        .map(|u| Source {
            queue: 0,
            fluid: 0.0,
            next_burst: if u.burst > 0 {
                rng.exp(u.burst as f64 / Source::load_at(u, 0).max(1e-9))
            } else {
                0.0
            },
            offered: 0,
        })
        .collect();
    let mut w = World {
        tx: machines(r),
        to_rx: VecDeque::new(),
        to_tx: VecDeque::new(),
        sources,
        down: (0..n).map(|_| Downstream::default()).collect(),
        held: 0,
        waiting: 0,
        rep: empty_report(r),
        rr: 0,
        rng,
    };
    for t in 0..r.slots {
        step(r, &mut w, t);
        if (t + 1) % r.interval == 0 {
            close_bucket(r, &mut w);
        }
    }
    finish(r, w)
}

fn empty_report(r: &CreditRun) -> RunReport {
    let p5_bound = match r.control {
        Control::Credit(Allocation::Static { n2, n3 }) => {
            Some((n2 + n3) as f64 / (r.rtt + n2 as u64) as f64)
        }
        _ => None,
    };
    RunReport {
        label: r.label.clone(),
        receiver_overflow: 0,
        credit_stalls: 0,
        refused: 0,
        max_memory: 0,
        data_lost: 0,
        lost_recovered: 0,
        credits_sent: 0,
        credits_lost: 0,
        checks_sent: 0,
        throughput: 0.0,
        mean_wait: 0.0,
        p5_bound,
        units: r
            .units
            .iter()
            .map(|_| UnitReport {
                allocation: vec![],
                throughput: vec![],
                mean_throughput: 0.0,
                offered: 0,
                forwarded: 0,
            })
            .collect(),
    }
}

/// One cell time: sources, credits in, one cell out, arrivals, forwarding, credits out.
fn step(r: &CreditRun, w: &mut World, t: u64) {
    let now = slot(t);
    let delay = r.rtt / 2;
    for (src, spec) in w.sources.iter_mut().zip(&r.units) {
        src.arrive(spec, t, &mut w.rng);
    }
    while w.to_tx.front().is_some_and(|(at, _)| *at <= t) {
        let (_, bytes) = w.to_tx.pop_front().unwrap_or_default();
        if let (Some((tx, _)), Ok(c)) = (w.tx.as_mut(), Repr::parse_bytes(&bytes)) {
            let _ = tx.handle_credit(now, &c);
        }
    }
    send_one(r, w, t, delay);
    w.waiting += w.sources.iter().map(|s| s.queue as u128).sum::<u128>();
    if let Some((tx, _)) = w.tx.as_mut() {
        tx.handle_timeout(now);
        while let Some(c) = tx.poll_check() {
            w.to_rx.push_back((t + delay, Err(c.to_vec())));
        }
    }
    while w.to_rx.front().is_some_and(|(at, _)| *at <= t) {
        if let Some((_, msg)) = w.to_rx.pop_front() {
            arrive(r, w, t, msg);
        }
    }
    forward(r, w, t);
    if let Some((_, rx)) = w.tx.as_mut() {
        rx.handle_timeout(now);
        while let Some(c) = rx.poll_credit() {
            w.rep.credits_sent += 1;
            if w.rng.chance(r.credit_loss) {
                w.rep.credits_lost += 1;
            } else {
                w.to_tx.push_back((t + delay, c.to_vec()));
            }
        }
    }
}

/// The link scheduler: round robin over units with a cell and credit for it.
fn send_one(r: &CreditRun, w: &mut World, t: u64, delay: u64) {
    let n = r.units.len();
    for k in 0..n {
        let unit = (w.rr + k) % n;
        if w.sources[unit].queue == 0 {
            continue;
        }
        if let Some((tx, _)) = w.tx.as_mut() {
            if tx.try_send(slot(t), unit).is_err() {
                continue;
            }
        }
        w.sources[unit].queue -= 1;
        w.rr = unit + 1;
        if w.rng.chance(r.data_loss) {
            w.rep.data_lost += 1;
        } else {
            w.to_rx.push_back((t + delay, Ok(unit)));
        }
        return;
    }
}

/// A data cell or a check reaches the receiver.
fn arrive(r: &CreditRun, w: &mut World, t: u64, msg: Result<usize, Vec<u8>>) {
    let now = slot(t);
    let unit = match msg {
        Ok(unit) => unit,
        Err(bytes) => {
            if let (Some((_, rx)), Ok(c)) = (w.tx.as_mut(), Repr::parse_bytes(&bytes)) {
                rx.handle_check(now, &c);
            }
            return;
        }
    };
    if let Some((_, rx)) = w.tx.as_mut() {
        if rx.handle_data(now, unit) == Admit::Refuse {
            return;
        }
    }
    if w.held >= r.memory {
        w.rep.receiver_overflow += 1;
        if let Some((_, rx)) = w.tx.as_mut() {
            rx.handle_dropped(now, unit, 1);
        }
        return;
    }
    w.held += 1;
    w.down[unit].held += 1;
    w.rep.max_memory = w.rep.max_memory.max(w.held);
}

/// Each unit forwards downstream at its own rate.
fn forward(r: &CreditRun, w: &mut World, t: u64) {
    for (unit, (d, spec)) in w.down.iter_mut().zip(&r.units).enumerate() {
        d.tokens = (d.tokens + spec.downstream).min(spec.downstream.max(1.0));
        let mut n = 0;
        while d.held > 0 && d.tokens >= 1.0 {
            d.held -= 1;
            d.tokens -= 1.0;
            n += 1;
        }
        if n > 0 {
            w.held -= n;
            d.forwarded += n;
            d.bucket += n;
            if let Some((_, rx)) = w.tx.as_mut() {
                rx.handle_forwarded(slot(t), unit, n as u32);
            }
        }
    }
}

fn close_bucket(r: &CreditRun, w: &mut World) {
    for (k, d) in w.down.iter_mut().enumerate() {
        let u = &mut w.rep.units[k];
        u.throughput.push(d.bucket as f64 / r.interval as f64);
        u.allocation
            .push(w.tx.as_ref().map(|(_, rx)| rx.allocation(k)));
        d.bucket = 0;
    }
}

fn finish(r: &CreditRun, mut w: World) -> RunReport {
    let mut total = 0;
    for (k, d) in w.down.iter().enumerate() {
        let u = &mut w.rep.units[k];
        u.forwarded = d.forwarded;
        u.offered = w.sources[k].offered;
        u.mean_throughput = d.forwarded as f64 / r.slots as f64;
        total += d.forwarded;
    }
    w.rep.throughput = total as f64 / r.slots as f64;
    let offered: u64 = w.sources.iter().map(|s| s.offered).sum();
    w.rep.mean_wait = w.waiting as f64 / offered.max(1) as f64;
    if let Some((tx, rx)) = &w.tx {
        w.rep.credit_stalls = tx.stats().credit_stalls;
        w.rep.checks_sent = tx.stats().checks_sent;
        w.rep.refused = rx.stats().refused;
        w.rep.lost_recovered = rx.stats().lost_recovered;
    }
    w.rep
}
