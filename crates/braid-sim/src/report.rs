//! Running a whole scenario, and its results as JSON or as a table.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use braid_proto::{Policy, SchedulerKind};
use serde::Serialize;

use crate::engine::{self, ChannelResult, RunError, RunResult, Variant};
use crate::rng::{mix64, streams};
use crate::scenario::{Job, Scenario};

/// The JSON document `braid sim --json` prints.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// The seed used.
    pub seed: u64,
    /// One entry per job, run-major (each run across the sweep points).
    pub runs: Vec<RunReport>,
}

/// Latency summary in milliseconds.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Latency {
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Maximum.
    pub max: f64,
}

/// One run's results.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RunReport {
    /// Run label.
    pub label: String,
    /// Scheduler.
    pub scheduler: String,
    /// Receiver mode.
    pub receiver: String,
    /// Swept parameters at this point.
    pub params: BTreeMap<String, f64>,
    /// Measurement span, seconds.
    pub duration_s: f64,
    /// Payload bytes delivered in the span, as bit/s (order-agnostic).
    pub goodput_bps: f64,
    /// Data packets accepted by the striper.
    pub packets_sent: u64,
    /// Data packets delivered to the application.
    pub packets_delivered: u64,
    /// Sent minus delivered.
    pub packets_lost: u64,
    /// Deliveries after a packet that was sent later.
    pub out_of_order: u64,
    /// Largest id distance of an out-of-order delivery.
    pub max_reorder_depth: u64,
    /// One-way latency, striper to application.
    pub latency_ms: Latency,
    /// Per loss episode: seconds from its end until delivery is FIFO again.
    pub resync_s: Vec<f64>,
    /// Marker and trigger bytes / all bytes put on the channels.
    pub marker_overhead: f64,
    /// Per channel.
    pub channels: Vec<ChannelResult>,
    /// Goodput counting only packets delivered in order, bit/s.
    pub inorder_goodput_bps: f64,
    /// Per loss episode: in-order delivery resumed after the last misordering.
    pub fifo_restored: Vec<bool>,
    /// Loss episodes (scripted windows and link-down periods, merged), [start, end] s.
    pub loss_episodes_s: Vec<[f64; 2]>,
    /// Data packets lost or corrupted on a channel.
    pub lost_on_channel: u64,
    /// Data packets dropped at the sender (full queue, MTU).
    pub dropped_at_sender: u64,
    /// Packets the striper refused.
    pub send_errors: u64,
    /// Markers or triggers that changed the receiver's state.
    pub receiver_resyncs: u64,
    /// Times the receiver gave up waiting.
    pub receiver_timeouts: u64,
    /// Simulation events processed.
    pub events: u64,
    /// Runs whose links change over time (`[[channel.change]]`): goodput in each 100 ms
    /// from the start, bit/s.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub goodput_series_bps: Vec<f64>,
    /// Session runs only (`[session]`): `failover_ms`, `rejoin_ms` per link-down
    /// episode, `duplicates`, `epoch_changes`, `quanta_changes`, `final_quanta`.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub session: Option<engine::SessionResult>,
    /// Error-control runs only (`[errctl]`): `tolerance` [W, E, B], `window`,
    /// `throughput_efficiency`, `max_delay_ms`, `mean_delay_ms`, the §5.2 analysis,
    /// `violations`, `retransmissions`, `snaks`, `packs` and more.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub errctl: Option<crate::errctl::ErrCtlResult>,
    /// TCP source only (`source = "tcp"`): `goodput_bps`, `retransmits`,
    /// `ce_marks_seen`, `cwnd_max`, `rto_count`, `goodput_series_bps` and more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp: Option<crate::tcp::TcpResult>,
    /// `[voip]` only: the VoIP flow's `sent`, `delivered`, `loss_pct`, `p50_ms`,
    /// `p99_ms`, `max_ms`, `best_link_ms`, `p99_over_best_ms`, `duplicates` and the
    /// sessions' flow counters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub voip: Option<crate::voip::VoipResult>,
}

impl RunReport {
    /// A metric by name (see [`crate::scenario::PLOT_METRICS`]).
    pub fn metric(&self, name: &str) -> Option<f64> {
        Some(match name {
            "goodput_bps" => self.goodput_bps,
            "inorder_goodput_bps" => self.inorder_goodput_bps,
            "out_of_order" => self.out_of_order as f64,
            "max_reorder_depth" => self.max_reorder_depth as f64,
            "packets_lost" => self.packets_lost as f64,
            "latency_mean_ms" => self.latency_ms.mean,
            "latency_p50_ms" => self.latency_ms.p50,
            "latency_p99_ms" => self.latency_ms.p99,
            "latency_max_ms" => self.latency_ms.max,
            "marker_overhead" => self.marker_overhead,
            "resync_max_s" => self.resync_s.iter().copied().fold(0.0, f64::max),
            "throughput_efficiency" => self.errctl.as_ref()?.throughput_efficiency,
            "tcp_goodput_bps" => self.tcp.as_ref()?.goodput_bps,
            "tcp_retransmits" => self.tcp.as_ref()?.retransmits as f64,
            "voip_p99_ms" => self.voip.as_ref()?.p99_ms,
            "voip_loss_pct" => self.voip.as_ref()?.loss_pct,
            _ => return None,
        })
    }
}

fn to_report(job: &Job, r: RunResult) -> RunReport {
    let ms = |ns: f64| ns / 1e6;
    RunReport {
        label: job.label.clone(),
        scheduler: job.scheduler.clone(),
        receiver: job.receiver.clone(),
        params: job.params.iter().cloned().collect(),
        duration_s: r.duration_s,
        goodput_bps: r.goodput_bps,
        packets_sent: r.packets_sent,
        packets_delivered: r.packets_delivered,
        packets_lost: r.packets_lost,
        out_of_order: r.out_of_order,
        max_reorder_depth: r.max_reorder_depth,
        latency_ms: Latency {
            mean: ms(r.latency.mean()),
            p50: ms(r.latency.quantile(0.5)),
            p99: ms(r.latency.quantile(0.99)),
            max: ms(r.latency.max() as f64),
        },
        marker_overhead: r.marker_overhead(),
        resync_s: r.resync_s,
        channels: r.channels.clone(),
        inorder_goodput_bps: r.inorder_goodput_bps,
        fifo_restored: r.fifo_restored,
        loss_episodes_s: r.episodes.iter().map(|&(a, b)| [a, b]).collect(),
        lost_on_channel: r.lost_on_channel,
        dropped_at_sender: r.dropped_at_sender,
        send_errors: r.send_errors,
        receiver_resyncs: r.resyncs,
        receiver_timeouts: r.wait_timeouts,
        events: r.events,
        goodput_series_bps: r.goodput_series_bps.clone(),
        session: r.session,
        errctl: r.errctl,
        tcp: r.tcp,
        voip: r.voip,
    }
}

/// A job that failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("run \"{label}\"{at}: {err}")]
pub struct JobError {
    /// Run label.
    pub label: String,
    /// Sweep point, formatted.
    pub at: String,
    /// What went wrong.
    pub err: RunError,
}

/// The configuration of `job` with `seed` applied.
pub fn seeded(job: &Job, seed: u64) -> engine::RunConfig {
    let mut cfg = job.config.clone();
    cfg.seed = seed;
    if let Variant::Striped(sc) = &mut cfg.variant {
        if let Policy::Causal(SchedulerKind::Random { seed: s }) = &mut sc.policy {
            *s = mix64(seed ^ mix64(streams::SCHEDULER));
        }
    }
    cfg
}

/// Run one job with `seed`: its report, or the error labelled with the run and its
/// sweep point.
fn run_job(job: &Job, seed: u64) -> Result<RunReport, JobError> {
    engine::run(&seeded(job, seed))
        .map(|r| to_report(job, r))
        .map_err(|err| JobError {
            label: job.label.clone(),
            at: sweep_point(job),
            err,
        })
}

/// A job's sweep point for an error message: ` at k = v, ...`, empty when the job
/// sweeps nothing.
fn sweep_point(job: &Job) -> String {
    if job.params.is_empty() {
        return String::new();
    }
    let p: Vec<String> = job
        .params
        .iter()
        .map(|(k, v)| format!("{k} = {v}"))
        .collect();
    format!(" at {}", p.join(", "))
}

/// Run every job of `sc` with `seed` on up to `threads` threads. `progress(done, total)`
/// is called after each job. The result does not depend on `threads`.
pub fn run_scenario(
    sc: &Scenario,
    seed: u64,
    threads: usize,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Report, JobError> {
    let n = sc.jobs.len();
    let results: Mutex<Vec<Option<Result<RunReport, JobError>>>> = Mutex::new(vec![None; n]);
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let work = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= n {
            break;
        }
        let r = run_job(&sc.jobs[i], seed);
        let failed = r.is_err();
        if let Ok(mut g) = results.lock() {
            g[i] = Some(r);
        }
        let d = done.fetch_add(1, Ordering::Relaxed) + 1;
        progress(d, n);
        if failed {
            // Stop handing out work; the first error in job order is reported.
            next.store(n, Ordering::Relaxed);
        }
    };
    let threads = threads.clamp(1, n.max(1));
    if threads == 1 {
        work();
    } else {
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(work);
            }
        });
    }
    let results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut runs = Vec::with_capacity(n);
    for r in results.into_iter().flatten() {
        runs.push(r?);
    }
    Ok(Report {
        scenario: sc.name.clone(),
        seed,
        runs,
    })
}

/// The longest of per-episode times in ms, `-` when there were none; `!N` when N
/// episodes never completed (the sender never failed over, or the link never rejoined).
fn worst_ms(v: &[Option<f64>]) -> String {
    if v.is_empty() {
        return "-".into();
    }
    let never = v.iter().filter(|x| x.is_none()).count();
    let worst = v
        .iter()
        .flatten()
        .copied()
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
    match (worst, never) {
        (Some(w), 0) => format!("{w:.1}"),
        (Some(w), n) => format!("{w:.1}!{n}"),
        (None, n) => format!("never!{n}"),
    }
}

impl Report {
    /// The JSON document, one line.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// A readable table: a row per run, then the session and tcp columns of the runs
    /// that have them.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "scenario {}  seed {}", self.scenario, self.seed);
        let cols = Columns::new(&self.runs);
        self.runs_table(&mut out, &cols);
        if self.runs.iter().any(|r| r.session.is_some()) {
            self.session_table(&mut out, &cols);
            self.not_delivered_table(&mut out, &cols);
        }
        if self.runs.iter().any(|r| r.tcp.is_some()) {
            self.tcp_table(&mut out, &cols);
        }
        if self.runs.iter().any(|r| r.voip.is_some()) {
            self.voip_table(&mut out, &cols);
        }
        out
    }

    /// The VoIP flow's delay and loss, for the runs that have one.
    fn voip_table(&self, out: &mut String, cols: &Columns) {
        let (lw, pw) = (cols.lw, cols.pw);
        let _ = writeln!(
            out,
            "\n{:<lw$}  {:>pw$}{:>6} {:>6} {:>7} {:>7} {:>7} {:>7} {:>9} {:>5} {:>6} {:>6} {:>6} {:>6}",
            "voip",
            "",
            "sent",
            "lost",
            "loss %",
            "p50 ms",
            "p99 ms",
            "max ms",
            "p99-best",
            "dups",
            "redund",
            "lowest",
            "reord",
            "held",
            pw = if pw > 0 { pw + 2 } else { 0 },
        );
        for (r, p) in self.runs.iter().zip(&cols.params) {
            let Some(v) = &r.voip else {
                continue;
            };
            cols.row_head(out, r, p);
            let _ = writeln!(
                out,
                "{:>6} {:>6} {:>7.3} {:>7.1} {:>7.1} {:>7.1} {:>9.1} {:>5} {:>6} {:>6} {:>6} {:>6}",
                v.sent,
                v.lost,
                v.loss_pct,
                v.p50_ms,
                v.p99_ms,
                v.max_ms,
                v.p99_over_best_ms,
                v.duplicates,
                v.tx_redundant,
                v.tx_lowest_delay,
                v.reordered,
                v.rx_held
            );
        }
    }

    /// Goodput, counts, order, latency, marker overhead and resync, a row per run.
    fn runs_table(&self, out: &mut String, cols: &Columns) {
        let (lw, pw) = (cols.lw, cols.pw);
        let _ = write!(out, "{:<lw$}  ", "run");
        if pw > 0 {
            let _ = write!(out, "{:<pw$}  ", "params");
        }
        let _ = writeln!(
            out,
            "{:>9} {:>9} {:>9} {:>8} {:>8} {:>6} {:>8} {:>8} {:>7} {:>8}",
            "Mbit/s",
            "sent",
            "delivered",
            "lost",
            "ooo",
            "depth",
            "p50 ms",
            "p99 ms",
            "ctl %",
            "resync s"
        );
        for (r, p) in self.runs.iter().zip(&cols.params) {
            cols.row_head(out, r, p);
            let resync = if r.resync_s.is_empty() {
                "-".to_string()
            } else {
                let m = r.resync_s.iter().copied().fold(0.0, f64::max);
                let bad = r.fifo_restored.iter().filter(|x| !**x).count();
                if bad > 0 {
                    format!("{m:.3}!{bad}")
                } else {
                    format!("{m:.3}")
                }
            };
            let _ = writeln!(
                out,
                "{:>9.3} {:>9} {:>9} {:>8} {:>8} {:>6} {:>8.2} {:>8.2} {:>7.3} {:>8}",
                r.goodput_bps / 1e6,
                r.packets_sent,
                r.packets_delivered,
                r.packets_lost,
                r.out_of_order,
                r.max_reorder_depth,
                r.latency_ms.p50,
                r.latency_ms.p99,
                r.marker_overhead * 100.0,
                resync
            );
        }
    }

    /// Failovers, outages, epochs of the `[session]` runs.
    fn session_table(&self, out: &mut String, cols: &Columns) {
        let (lw, pw) = (cols.lw, cols.pw);
        let _ = writeln!(
            out,
            "\n{:<lw$}  {:>pw$}{:>5} {:>8} {:>11} {:>10} {:>9} {:>6} {:>6} {:>5}",
            "session",
            "",
            "downs",
            "outage s",
            "failover ms",
            "rejoin ms",
            "link lost",
            "epochs",
            "quanta",
            "dups",
            pw = if pw > 0 { pw + 2 } else { 0 },
        );
        for (r, p) in self.runs.iter().zip(&cols.params) {
            let Some(s) = &r.session else {
                continue;
            };
            cols.row_head(out, r, p);
            let outage = match r.loss_episodes_s.len() {
                0 => "-".to_string(),
                _ => {
                    let s: f64 = r.loss_episodes_s.iter().map(|[a, b]| b - a).sum();
                    format!("{s:.3}")
                }
            };
            let _ = writeln!(
                out,
                "{:>5} {:>8} {:>11} {:>10} {:>9} {:>6} {:>6} {:>5}",
                s.failover_ms.len(),
                outage,
                worst_ms(&s.failover_ms),
                worst_ms(&s.rejoin_ms),
                r.lost_on_channel,
                s.epoch_changes,
                s.quanta_changes,
                s.duplicates
            );
        }
    }

    /// What the `[session]` runs were offered and did not deliver, by cause (the
    /// JSON's `not_delivered`).
    fn not_delivered_table(&self, out: &mut String, cols: &Columns) {
        let (lw, pw) = (cols.lw, cols.pw);
        let _ = writeln!(
            out,
            "\nnot delivered, by cause (share delivered of what was offered)\n\
             {:<lw$}  {:>pw$}{:>9} {:>9} {:>9} {:>7} {:>7} {:>8} {:>7}",
            "",
            "",
            "offered",
            "delivered",
            "sender q",
            "pacer",
            "rx aqm",
            "gave up",
            "unseen",
            pw = if pw > 0 { pw + 2 } else { 0 },
        );
        for (r, p) in self.runs.iter().zip(&cols.params) {
            let Some(s) = &r.session else {
                continue;
            };
            let n = &s.not_delivered;
            let share = if n.offered == 0 {
                "-".to_string()
            } else {
                format!("{:.4}", r.packets_delivered as f64 / n.offered as f64)
            };
            cols.row_head(out, r, p);
            let _ = writeln!(
                out,
                "{:>9} {:>9} {:>9} {:>7} {:>7} {:>8} {:>7}",
                n.offered,
                share,
                n.sender_queue,
                n.pacer,
                n.receiver_aqm,
                n.receiver_gave_up,
                n.lost_unseen
            );
        }
    }

    /// The tcp source's counters, for the runs that have one.
    fn tcp_table(&self, out: &mut String, cols: &Columns) {
        let (lw, pw) = (cols.lw, cols.pw);
        let _ = writeln!(
            out,
            "\n{:<lw$}  {:>pw$}{:>9} {:>8} {:>8} {:>6} {:>5} {:>8} {:>8}",
            "tcp",
            "",
            "Mbit/s",
            "retrans",
            "ce",
            "ecn-",
            "rto",
            "cwnd_max",
            "srtt ms",
            pw = if pw > 0 { pw + 2 } else { 0 },
        );
        for (r, p) in self.runs.iter().zip(&cols.params) {
            let Some(t) = &r.tcp else {
                continue;
            };
            cols.row_head(out, r, p);
            let _ = writeln!(
                out,
                "{:>9.3} {:>8} {:>8} {:>6} {:>5} {:>8.0} {:>8.1}",
                t.goodput_bps / 1e6,
                t.retransmits,
                t.ce_marks_seen,
                t.ecn_reductions,
                t.rto_count,
                t.cwnd_max,
                t.srtt_ms
            );
        }
    }
}

/// The table's first two columns: the run's label and its sweep parameters.
struct Columns {
    lw: usize,
    pw: usize,
    params: Vec<String>,
}

impl Columns {
    fn new(runs: &[RunReport]) -> Columns {
        let params: Vec<String> = runs
            .iter()
            .map(|r| {
                r.params
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        let lw = runs.iter().map(|r| r.label.len()).max().unwrap_or(5).max(5);
        let pw = params.iter().map(|p| p.len()).max().unwrap_or(0);
        Columns { lw, pw, params }
    }

    /// A row's label and parameters.
    fn row_head(&self, out: &mut String, r: &RunReport, p: &str) {
        let (lw, pw) = (self.lw, self.pw);
        let _ = write!(out, "{:<lw$}  ", r.label);
        if pw > 0 {
            let _ = write!(out, "{p:<pw$}  ");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The failover scenario's table shows what the session measured for the link-down
    /// period: one down, 2 s of outage, failover and rejoin times, packets lost on the
    /// link, epoch switches and duplicates, the same numbers as the JSON.
    #[test]
    fn session_runs_get_failover_columns() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../scenarios/failover/link-down.toml");
        let sc = crate::scenario::load(&path).unwrap();
        let rep = run_scenario(&sc, sc.seed, 2, &|_, _| {}).unwrap();
        let table = rep.to_table();
        let lines: Vec<&str> = table.lines().collect();
        let head = lines
            .iter()
            .position(|l| l.starts_with("session "))
            .unwrap_or_else(|| panic!("no session block:\n{table}"));
        for col in [
            "downs",
            "outage s",
            "failover ms",
            "rejoin ms",
            "link lost",
            "epochs",
            "dups",
        ] {
            assert!(lines[head].contains(col), "{}", lines[head]);
        }
        for (i, r) in rep.runs.iter().enumerate() {
            let s = r.session.as_ref().unwrap();
            let row: Vec<&str> = lines[head + 1 + i].split_whitespace().collect();
            let fo = s.failover_ms[0].unwrap();
            let rj = s.rejoin_ms[0].unwrap();
            assert!(fo > 0.0 && rj > 0.0);
            assert_eq!(
                row,
                [
                    r.label.clone(),
                    "1".into(),
                    "2.000".into(),
                    format!("{fo:.1}"),
                    format!("{rj:.1}"),
                    r.lost_on_channel.to_string(),
                    s.epoch_changes.to_string(),
                    s.quanta_changes.to_string(),
                    s.duplicates.to_string(),
                ],
                "{table}"
            );
        }
        // The block of what was not delivered, by cause: the JSON's counts, and the
        // five causes add up to what was offered and not delivered.
        let head = lines
            .iter()
            .position(|l| l.starts_with("not delivered, by cause"))
            .unwrap_or_else(|| panic!("no not-delivered block:\n{table}"));
        for (i, r) in rep.runs.iter().enumerate() {
            let n = &r.session.as_ref().unwrap().not_delivered;
            let row: Vec<&str> = lines[head + 2 + i].split_whitespace().collect();
            let share = r.packets_delivered as f64 / n.offered as f64;
            let causes = [
                n.sender_queue,
                n.pacer,
                n.receiver_aqm,
                n.receiver_gave_up,
                n.lost_unseen,
            ];
            assert!(
                causes.iter().sum::<u64>() > 0,
                "the link-down loses some: {n:?}"
            );
            assert_eq!(causes.iter().sum::<u64>(), n.offered - r.packets_delivered);
            let mut want = vec![
                r.label.clone(),
                n.offered.to_string(),
                format!("{share:.4}"),
            ];
            want.extend(causes.iter().map(|c| c.to_string()));
            assert_eq!(row, want, "{table}");
        }
        assert_eq!(worst_ms(&[Some(1.0), None, Some(3.25)]), "3.2!1");
        assert_eq!(worst_ms(&[None]), "never!1");
        assert_eq!(worst_ms(&[]), "-");
    }
}
