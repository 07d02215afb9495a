//! What `braid lab bench` reports: one run's figures, or with `--runs` the median of
//! each over the runs and its range, as a table and as JSON.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::call::{CallStats, Transport};
use super::Payload;

/// One link alone.
#[derive(Clone, Debug)]
pub struct LinkResult {
    /// Its specification.
    pub spec: String,
    /// TCP goodput alone, bit/s.
    pub tcp_bps: f64,
}

/// braid in one mode.
#[derive(Clone, Debug, Default)]
pub struct ModeResult {
    /// TCP goodput through the tunnel, bit/s.
    pub tcp_bps: f64,
    /// Segments the TCP sender retransmitted (iperf3's count).
    pub tcp_retransmits: u64,
    /// UDP packets delivered out of order at the tunnel output.
    pub udp_out_of_order: u64,
    /// UDP loss ratio at the tunnel output.
    pub udp_loss: f64,
    /// UDP goodput, bit/s, and the offered rate.
    pub udp_goodput_bps: f64,
    /// Offered UDP rate, bit/s.
    pub udp_offered_bps: f64,
    /// The receiving tunnel's counters after the run (its `braid status --json`).
    pub tunnel_status: Value,
    /// The sending tunnel's (the TCP sender's side: its pacer, its return path).
    pub sender_status: Value,
    /// TCP in each second as iperf3's sender counts it (bytes written into the socket:
    /// the first seconds include filling its buffer), bit/s.
    pub tcp_series_bps: Vec<f64>,
    /// TCP in each second as iperf3's receiver counts it (what arrived), bit/s.
    pub tcp_rx_series_bps: Vec<f64>,
    /// The same TCP flow with the stream carriage off (`tcp_streams = false`: TCP as
    /// packets), bit/s; measured when the bench left `tcp_streams` to the defaults.
    pub tcp_packet_bps: Option<f64>,
    /// With `--flows N`: N TCP flows at once through the tunnel, their total, bit/s.
    pub flows_tcp_bps: Option<f64>,
    /// Jain's fairness index over those flows' goodputs.
    pub flows_jain: Option<f64>,
    /// With `--download BYTES`: seconds from the SYN to the last byte through the
    /// tunnel.
    pub download_s: Option<f64>,
    /// With `--idle N`: the idle connections made through the tunnel.
    pub idle_made: Option<f64>,
    /// Seconds to make them.
    pub idle_open_s: Option<f64>,
    /// The larger of the two ends' resident sets while they are open, bytes.
    pub idle_rss_bytes: Option<f64>,
    /// The larger of the two ends' growth in resident set from before they were
    /// opened, bytes.
    pub idle_rss_growth_bytes: Option<f64>,
    /// With `--call`: the call beside the single TCP flow through the tunnel.
    pub call: Option<CallStats>,
}

/// A whole bench: one run, or the medians of several.
#[derive(Clone, Debug)]
pub struct BenchResult {
    /// Each link alone.
    pub links: Vec<LinkResult>,
    /// Sum of the single-link goodputs.
    pub sum_bps: f64,
    /// All links at once, one TCP flow each.
    pub ceiling_bps: f64,
    /// braid per mode.
    pub braid: BTreeMap<String, ModeResult>,
    /// MPTCP, if measured.
    pub mptcp_bps: Option<f64>,
    /// MPTCP in each second, counted as [`ModeResult::tcp_series_bps`], bit/s.
    pub mptcp_series_bps: Vec<f64>,
    /// The same as the receiver counts, bit/s.
    pub mptcp_rx_series_bps: Vec<f64>,
    /// With `--download BYTES`: the bytes of the download.
    pub download_bytes: Option<u64>,
    /// Its seconds over the fastest link alone.
    pub download_best_link_s: Option<f64>,
    /// Its seconds over MPTCP.
    pub download_mptcp_s: Option<f64>,
    /// With `--call`: the lowest-delay link (its index) and the call over it alone,
    /// idle: the reference for the call through the tunnel.
    pub call_idle_best_link: Option<(usize, CallStats)>,
    /// What carried the call (`--call-transport`).
    pub call_transport: Transport,
    /// Per-link emulator counters at the end.
    pub emulator: Vec<Value>,
    /// Inner TCP payload bytes per datagram (computed from the configuration).
    pub payload: Option<Payload>,
    /// With `--runs` above 1, every run; the figures above are then their medians
    /// (series, statuses and emulator counters: the last run's).
    pub per_run: Vec<BenchResult>,
}

fn series(v: &Value) -> Vec<f64> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}

/// The median and the range of one figure over the runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    /// The median (of an even count, the mean of the middle two).
    pub median: f64,
    /// The smallest.
    pub min: f64,
    /// The largest.
    pub max: f64,
}

impl Spread {
    /// The spread of `values`; `None` when there are none.
    pub fn of(values: &[f64]) -> Option<Spread> {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = match n {
            0 => return None,
            _ if n % 2 == 1 => v[n / 2],
            _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        };
        Some(Spread {
            median,
            min: v[0],
            max: v[n - 1],
        })
    }
}

/// The figures of a braid mode that runs are summarized by, with their JSON keys.
const MODE_FIGURES: [&str; 6] = [
    "tcp_bps",
    "tcp_retransmits",
    "udp_out_of_order",
    "udp_loss",
    "udp_goodput_bps",
    "udp_offered_bps",
];

impl ModeResult {
    /// A figure by its JSON key (one of [`MODE_FIGURES`]).
    fn figure(&self, key: &str) -> f64 {
        match key {
            "tcp_bps" => self.tcp_bps,
            "tcp_retransmits" => self.tcp_retransmits as f64,
            "udp_out_of_order" => self.udp_out_of_order as f64,
            "udp_loss" => self.udp_loss,
            "udp_goodput_bps" => self.udp_goodput_bps,
            _ => self.udp_offered_bps,
        }
    }

    fn set_figure(&mut self, key: &str, v: f64) {
        match key {
            "tcp_bps" => self.tcp_bps = v,
            "tcp_retransmits" => self.tcp_retransmits = v.round() as u64,
            "udp_out_of_order" => self.udp_out_of_order = v.round() as u64,
            "udp_loss" => self.udp_loss = v,
            "udp_goodput_bps" => self.udp_goodput_bps = v,
            _ => self.udp_offered_bps = v,
        }
    }
}

/// One figure of a bench, to take its median or range over runs.
type Figure<'a> = &'a dyn Fn(&BenchResult) -> Option<f64>;

impl BenchResult {
    /// The bench of several runs: each figure the median over `runs`, with every run
    /// kept in [`BenchResult::per_run`]. One run is returned as it is; `None` if none.
    pub fn from_runs(mut runs: Vec<BenchResult>) -> Option<BenchResult> {
        if runs.len() <= 1 {
            return runs.pop();
        }
        let mut r = runs.last()?.clone();
        let median = |f: Figure| -> Option<f64> {
            Spread::of(&runs.iter().filter_map(f).collect::<Vec<_>>()).map(|s| s.median)
        };
        for (i, l) in r.links.iter_mut().enumerate() {
            l.tcp_bps = median(&|x| Some(x.links.get(i)?.tcp_bps)).unwrap_or(l.tcp_bps);
        }
        r.sum_bps = median(&|x| Some(x.sum_bps)).unwrap_or(r.sum_bps);
        r.ceiling_bps = median(&|x| Some(x.ceiling_bps)).unwrap_or(r.ceiling_bps);
        for (m, b) in r.braid.iter_mut() {
            for key in MODE_FIGURES {
                if let Some(v) = median(&|x| Some(x.braid.get(m)?.figure(key))) {
                    b.set_figure(key, v);
                }
            }
            b.tcp_packet_bps = median(&|x| x.braid.get(m)?.tcp_packet_bps);
            b.flows_tcp_bps = median(&|x| x.braid.get(m)?.flows_tcp_bps);
            b.flows_jain = median(&|x| x.braid.get(m)?.flows_jain);
            b.download_s = median(&|x| x.braid.get(m)?.download_s);
            b.idle_made = median(&|x| x.braid.get(m)?.idle_made);
            b.idle_open_s = median(&|x| x.braid.get(m)?.idle_open_s);
            b.idle_rss_bytes = median(&|x| x.braid.get(m)?.idle_rss_bytes);
            b.idle_rss_growth_bytes = median(&|x| x.braid.get(m)?.idle_rss_growth_bytes);
            let calls: Vec<CallStats> = runs.iter().filter_map(|x| x.braid.get(m)?.call).collect();
            b.call = CallStats::median(&calls);
        }
        if let Some((i, _)) = r.call_idle_best_link {
            let calls: Vec<CallStats> = runs
                .iter()
                .filter_map(|x| Some(x.call_idle_best_link?.1))
                .collect();
            r.call_idle_best_link = CallStats::median(&calls).map(|c| (i, c));
        }
        r.mptcp_bps = median(&|x| x.mptcp_bps);
        r.download_best_link_s = median(&|x| x.download_best_link_s);
        r.download_mptcp_s = median(&|x| x.download_mptcp_s);
        r.per_run = runs;
        Some(r)
    }

    /// How many runs the figures summarize.
    pub fn runs(&self) -> usize {
        self.per_run.len().max(1)
    }

    /// The range of one figure over the runs; `None` for a single run.
    pub fn spread(&self, f: Figure) -> Option<Spread> {
        if self.per_run.len() < 2 {
            return None;
        }
        Spread::of(&self.per_run.iter().filter_map(f).collect::<Vec<_>>())
    }

    /// With several runs, add `KEY_range: [min, max]` beside `key` in `obj`.
    fn add_range(&self, obj: &mut Value, key: &str, f: Figure) {
        if let (Some(s), Some(o)) = (self.spread(f), obj.as_object_mut()) {
            o.insert(format!("{key}_range"), json!([s.min, s.max]));
        }
    }

    fn mode_json(&self, m: &str, r: &ModeResult) -> Value {
        let mut v = json!({
            "tcp_bps": r.tcp_bps,
            "tcp_retransmits": r.tcp_retransmits,
            "udp_out_of_order": r.udp_out_of_order,
            "udp_loss": r.udp_loss,
            "udp_goodput_bps": r.udp_goodput_bps,
            "udp_offered_bps": r.udp_offered_bps,
            "tcp_ratio_to_sum": r.tcp_bps / self.sum_bps.max(1.0),
            "tcp_payload_per_datagram": self.payload.as_ref().and_then(|p| p.braid.get(m)),
            "tunnel_status": r.tunnel_status,
            "sender_status": r.sender_status,
            "tcp_series_bps": r.tcp_series_bps,
            "tcp_rx_series_bps": r.tcp_rx_series_bps,
        });
        for key in MODE_FIGURES {
            self.add_range(&mut v, key, &|x| Some(x.braid.get(m)?.figure(key)));
        }
        let optional: [(&str, Figure); 8] = [
            ("tcp_packet_bps", &|x| x.braid.get(m)?.tcp_packet_bps),
            ("flows_tcp_bps", &|x| x.braid.get(m)?.flows_tcp_bps),
            ("flows_jain", &|x| x.braid.get(m)?.flows_jain),
            ("download_s", &|x| x.braid.get(m)?.download_s),
            ("idle_made", &|x| x.braid.get(m)?.idle_made),
            ("idle_open_s", &|x| x.braid.get(m)?.idle_open_s),
            ("idle_rss_bytes", &|x| x.braid.get(m)?.idle_rss_bytes),
            ("idle_rss_growth_bytes", &|x| {
                x.braid.get(m)?.idle_rss_growth_bytes
            }),
        ];
        for (key, f) in optional {
            if let (Some(b), Some(o)) = (f(self), v.as_object_mut()) {
                o.insert(key.into(), json!(b));
                self.add_range(&mut v, key, f);
            }
        }
        if let Some(c) = &r.call {
            let mut cv = c.to_json();
            cv["p99_over_idle_ms"] = json!(self.call_p99_over_idle(c));
            self.add_range(&mut cv, "p99_ms", &|x| Some(x.braid.get(m)?.call?.p99_ms));
            self.add_range(&mut cv, "loss_pct", &|x| {
                Some(x.braid.get(m)?.call?.loss_pct())
            });
            v["call"] = cv;
        }
        v
    }

    /// A call's p99 one-way delay less the lowest-delay link's idle median, ms
    /// (`None` without the reference).
    pub fn call_p99_over_idle(&self, c: &CallStats) -> Option<f64> {
        self.call_idle_best_link
            .map(|(_, idle)| c.p99_ms - idle.p50_ms)
    }

    /// The JSON object: every figure under its key (with several runs the median, and
    /// `KEY_range: [min, max]` beside it, and each run whole in `per_run`).
    pub fn to_json(&self) -> Value {
        let braid: Map<String, Value> = self
            .braid
            .iter()
            .map(|(m, r)| (m.clone(), self.mode_json(m, r)))
            .collect();
        let links: Vec<Value> = self
            .links
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let mut v = json!({"spec": l.spec, "tcp_bps": l.tcp_bps});
                self.add_range(&mut v, "tcp_bps", &|x| Some(x.links.get(i)?.tcp_bps));
                v
            })
            .collect();
        let mut v = json!({
            "runs": self.runs(),
            "links": links,
            "sum_bps": self.sum_bps,
            "ceiling_bps": self.ceiling_bps,
            "braid": braid,
            "mptcp_bps": self.mptcp_bps,
            "mptcp_series_bps": self.mptcp_series_bps,
            "mptcp_rx_series_bps": self.mptcp_rx_series_bps,
            "tcp_payload_per_datagram": self.payload.as_ref().map(Payload::to_json),
            "emulator": self.emulator,
        });
        self.add_range(&mut v, "sum_bps", &|x| Some(x.sum_bps));
        self.add_range(&mut v, "ceiling_bps", &|x| Some(x.ceiling_bps));
        self.add_range(&mut v, "mptcp_bps", &|x| x.mptcp_bps);
        if let Some(bytes) = self.download_bytes {
            let mut d = json!({
                "bytes": bytes,
                "best_link_s": self.download_best_link_s,
                "mptcp_s": self.download_mptcp_s,
            });
            self.add_range(&mut d, "best_link_s", &|x| x.download_best_link_s);
            self.add_range(&mut d, "mptcp_s", &|x| x.download_mptcp_s);
            v["download"] = d;
        }
        if let Some((i, c)) = &self.call_idle_best_link {
            let mut cv = c.to_json();
            cv["link"] = json!(i);
            cv["spec"] = json!(self.links.get(*i).map(|l| l.spec.clone()));
            self.add_range(&mut cv, "p50_ms", &|x| {
                Some(x.call_idle_best_link?.1.p50_ms)
            });
            v["call_idle_best_link"] = cv;
            v["call_transport"] = json!(self.call_transport.name());
        }
        if self.per_run.len() > 1 {
            v["per_run"] = self.per_run.iter().map(BenchResult::to_json).collect();
        }
        v
    }

    /// Read back what [`BenchResult::to_json`] wrote (to redraw a chart or table).
    pub fn from_json(v: &Value) -> Option<BenchResult> {
        let links = v["links"]
            .as_array()?
            .iter()
            .map(|l| {
                Some(LinkResult {
                    spec: l["spec"].as_str()?.to_string(),
                    tcp_bps: l["tcp_bps"].as_f64()?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        let braid = v["braid"]
            .as_object()?
            .iter()
            .map(|(m, r)| Some((m.clone(), mode_from_json(r)?)))
            .collect::<Option<BTreeMap<_, _>>>()?;
        let per_run = match v["per_run"].as_array() {
            Some(a) => a
                .iter()
                .map(BenchResult::from_json)
                .collect::<Option<_>>()?,
            None => Vec::new(),
        };
        Some(BenchResult {
            links,
            sum_bps: v["sum_bps"].as_f64()?,
            ceiling_bps: v["ceiling_bps"].as_f64().unwrap_or(0.0),
            braid,
            mptcp_bps: v["mptcp_bps"].as_f64(),
            mptcp_series_bps: series(&v["mptcp_series_bps"]),
            mptcp_rx_series_bps: series(&v["mptcp_rx_series_bps"]),
            download_bytes: v["download"]["bytes"].as_u64(),
            download_best_link_s: v["download"]["best_link_s"].as_f64(),
            download_mptcp_s: v["download"]["mptcp_s"].as_f64(),
            call_idle_best_link: v["call_idle_best_link"]["link"]
                .as_u64()
                .zip(CallStats::from_json(&v["call_idle_best_link"]))
                .map(|(i, c)| (i as usize, c)),
            call_transport: v["call_transport"]
                .as_str()
                .and_then(Transport::from_name)
                .unwrap_or_default(),
            emulator: v["emulator"].as_array().cloned().unwrap_or_default(),
            payload: Payload::from_json(&v["tcp_payload_per_datagram"]),
            per_run,
        })
    }

    /// A readable table: Mbit/s (with several runs the median and the range), share of
    /// the sum, inner TCP payload bytes per datagram.
    pub fn table(&self) -> String {
        let multi = self.per_run.len() > 1;
        let mut s = if multi {
            format!(
                "{} runs: the median of each figure and its range (min-max)\n{:<34} {:>8} {:>13} {:>8} {:>8}\n",
                self.runs(),
                "what",
                "Mbit/s",
                "min-max",
                "of sum",
                "B/dgram"
            )
        } else {
            format!(
                "{:<34} {:>8} {:>8} {:>8}\n",
                "what", "Mbit/s", "of sum", "B/dgram"
            )
        };
        s += &self.rows();
        s += &self.download_lines();
        s += &self.call_lines();
        s += &self.series_lines();
        s
    }

    /// With `--download`: each contender's time for the one download.
    fn download_lines(&self) -> String {
        let Some(bytes) = self.download_bytes else {
            return String::new();
        };
        let secs = |v: Option<f64>| v.map_or("-".to_string(), |s| format!("{s:.3} s"));
        let mut s = format!(
            "One download of {bytes} bytes, from its SYN to its last byte:\n  {:<32} {}\n",
            "the fastest link alone",
            secs(self.download_best_link_s)
        );
        for (m, r) in &self.braid {
            s += &format!("  {:<32} {}\n", format!("braid {m}"), secs(r.download_s));
        }
        if self.download_mptcp_s.is_some() {
            s += &format!("  {:<32} {}\n", "MPTCP", secs(self.download_mptcp_s));
        }
        s
    }

    /// With `--call`: the call over the best link alone and idle, and through the
    /// tunnel beside the TCP flow in each mode.
    fn call_lines(&self) -> String {
        let Some((i, idle)) = &self.call_idle_best_link else {
            return String::new();
        };
        let line = |what: &str, c: &CallStats, over: Option<f64>| {
            let over = over.map_or(String::new(), |o| format!(" {o:>9.1}"));
            format!(
                "  {what:<42} {:>5} {:>5} {:>7.2} {:>7.1} {:>7.1} {:>7.1}{over}\n",
                c.sent,
                c.lost,
                c.loss_pct(),
                c.p50_ms,
                c.p99_ms,
                c.max_ms
            )
        };
        let spec = self.links.get(*i).map_or("", |l| l.spec.as_str());
        let what = match self.call_transport {
            Transport::Udp => "A call (%B bytes of UDP every %T ms)",
            Transport::Tcp => "An interactive TCP connection (%B-byte records every %T ms)",
        };
        let what = what
            .replace("%B", &super::call::SIZE.to_string())
            .replace("%T", &super::call::EVERY.as_millis().to_string());
        let mut s = format!(
            "{what}, one-way delay in ms:\n  {:<42} {:>5} {:>5} {:>7} {:>7} {:>7} {:>7} {:>9}\n",
            "", "sent", "lost", "loss %", "p50", "p99", "max", "p99-idle"
        );
        s += &line(&format!("link {i} alone, idle ({spec})"), idle, None);
        for (m, r) in &self.braid {
            if let Some(c) = &r.call {
                let what = format!("braid {m}, beside the TCP flow");
                s += &line(&what, c, self.call_p99_over_idle(c));
            }
        }
        s
    }

    /// One table row: `bps` and its range under `f`, the payload, `extra`.
    fn row(&self, what: &str, f: Figure, payload: Option<u32>, extra: &str) -> String {
        let bps = f(self).unwrap_or(0.0);
        let range = match self.spread(f) {
            Some(r) => format!(" {:>13}", format!("{:.1}-{:.1}", r.min / 1e6, r.max / 1e6)),
            None if self.per_run.len() > 1 => format!(" {:>13}", ""),
            None => String::new(),
        };
        let payload = payload.map(|p| p.to_string()).unwrap_or_default();
        let line = format!(
            "{what:<34} {:8.1}{range} {:7.1}% {payload:>8}{extra}",
            bps / 1e6,
            100.0 * bps / self.sum_bps.max(1.0)
        );
        format!("{}\n", line.trim_end())
    }

    fn rows(&self) -> String {
        let p = self.payload.as_ref();
        let tcp = p.map(|p| p.tcp);
        let mut s = String::new();
        for (i, l) in self.links.iter().enumerate() {
            let what = format!("link {i} alone ({})", l.spec);
            s += &self.row(&what, &|x| Some(x.links.get(i)?.tcp_bps), tcp, "");
        }
        s += &self.row("sum of links (the bound)", &|x| Some(x.sum_bps), None, "");
        s += &self.row(
            "all links at once (ceiling)",
            &|x| Some(x.ceiling_bps),
            tcp,
            "",
        );
        for (m, r) in &self.braid {
            let fig = |key: &'static str, digits: usize| {
                let v = format!("{:.*}", digits, r.figure(key));
                match self.spread(&|x| Some(x.braid.get(m)?.figure(key))) {
                    Some(sp) => format!("{v} ({:.*}-{:.*})", digits, sp.min, digits, sp.max),
                    None => v,
                }
            };
            let extra = format!(
                "   TCP retransmits {}; UDP loss {}, out of order {}",
                fig("tcp_retransmits", 0),
                fig("udp_loss", 4),
                fig("udp_out_of_order", 0)
            );
            let payload = p.and_then(|p| p.braid.get(m).copied());
            let f = |x: &BenchResult| Some(x.braid.get(m)?.tcp_bps);
            s += &self.row(&format!("braid {m}, TCP"), &f, payload, &extra);
            if r.tcp_packet_bps.is_some() {
                let f = |x: &BenchResult| x.braid.get(m)?.tcp_packet_bps;
                s += &self.row("  the same as packets", &f, None, "");
            }
            if let Some(j) = r.flows_jain {
                let f = |x: &BenchResult| x.braid.get(m)?.flows_tcp_bps;
                let extra = format!("   Jain's fairness {j:.3}");
                s += &self.row("  many flows at once, total", &f, None, &extra);
            }
            if let (Some(made), Some(open_s), Some(rss), Some(growth)) = (
                r.idle_made,
                r.idle_open_s,
                r.idle_rss_bytes,
                r.idle_rss_growth_bytes,
            ) {
                let mib = |b: f64| b / f64::from(1u32 << 20);
                s += &format!(
                    "  {made:.0} idle connections (made in {open_s:.1} s): the larger end \
                     holds {:.1} MiB, {:.1} MiB more than before\n",
                    mib(rss),
                    mib(growth)
                );
            }
        }
        if self.mptcp_bps.is_some() {
            let what = "MPTCP, one subflow per link";
            s += &self.row(what, &|x| x.mptcp_bps, p.map(|p| p.mptcp), "");
        }
        s
    }

    /// Each TCP run second by second (the last run's).
    fn series_lines(&self) -> String {
        let line = |what: &str, v: &[f64]| {
            let secs: Vec<String> = v.iter().map(|b| format!("{:.0}", b / 1e6)).collect();
            format!("  {what:<18} {}\n", secs.join(" "))
        };
        let mut series = String::new();
        for (m, r) in &self.braid {
            if !r.tcp_series_bps.is_empty() {
                series += &line(&format!("braid {m}"), &r.tcp_series_bps);
            }
            if !r.tcp_rx_series_bps.is_empty() {
                series += &line("  received", &r.tcp_rx_series_bps);
            }
        }
        if !self.mptcp_series_bps.is_empty() {
            series += &line("MPTCP", &self.mptcp_series_bps);
        }
        if !self.mptcp_rx_series_bps.is_empty() {
            series += &line("  received", &self.mptcp_rx_series_bps);
        }
        if series.is_empty() {
            return series;
        }
        let which = if self.per_run.len() > 1 {
            " (last run)"
        } else {
            ""
        };
        format!("TCP in each second{which} (Mbit/s, as iperf3's sender counts: the first seconds fill its buffer; \"received\": as its receiver counts):\n{series}")
    }
}

fn mode_from_json(r: &Value) -> Option<ModeResult> {
    Some(ModeResult {
        tcp_bps: r["tcp_bps"].as_f64()?,
        tcp_retransmits: r["tcp_retransmits"].as_u64().unwrap_or(0),
        udp_out_of_order: r["udp_out_of_order"].as_u64().unwrap_or(0),
        udp_loss: r["udp_loss"].as_f64().unwrap_or(0.0),
        udp_goodput_bps: r["udp_goodput_bps"].as_f64().unwrap_or(0.0),
        udp_offered_bps: r["udp_offered_bps"].as_f64().unwrap_or(0.0),
        tunnel_status: r["tunnel_status"].clone(),
        sender_status: r["sender_status"].clone(),
        tcp_series_bps: series(&r["tcp_series_bps"]),
        tcp_rx_series_bps: series(&r["tcp_rx_series_bps"]),
        tcp_packet_bps: r["tcp_packet_bps"].as_f64(),
        flows_tcp_bps: r["flows_tcp_bps"].as_f64(),
        flows_jain: r["flows_jain"].as_f64(),
        download_s: r["download_s"].as_f64(),
        idle_made: r["idle_made"].as_f64(),
        idle_open_s: r["idle_open_s"].as_f64(),
        idle_rss_bytes: r["idle_rss_bytes"].as_f64(),
        idle_rss_growth_bytes: r["idle_rss_growth_bytes"].as_f64(),
        call: CallStats::from_json(&r["call"]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(scale: f64, retransmits: u64) -> BenchResult {
        let mode = ModeResult {
            tcp_bps: 100e6 * scale,
            tcp_retransmits: retransmits,
            udp_loss: 0.01 * scale,
            tcp_packet_bps: Some(70e6 * scale),
            download_s: Some(0.3 * scale),
            call: Some(CallStats {
                sent: 750,
                delivered: 750,
                p50_ms: 5.0 * scale,
                p99_ms: 10.0 * scale,
                max_ms: 20.0 * scale,
                ..CallStats::default()
            }),
            ..ModeResult::default()
        };
        BenchResult {
            links: vec![LinkResult {
                spec: "100mbit/0ms".into(),
                tcp_bps: 90e6 * scale,
            }],
            sum_bps: 90e6 * scale,
            ceiling_bps: 95e6 * scale,
            braid: BTreeMap::from([("logical".to_string(), mode)]),
            mptcp_bps: Some(80e6 * scale),
            mptcp_series_bps: vec![80e6 * scale],
            mptcp_rx_series_bps: vec![79e6 * scale],
            download_bytes: Some(2_000_000),
            download_best_link_s: Some(0.5 * scale),
            download_mptcp_s: Some(0.4 * scale),
            call_idle_best_link: Some((
                0,
                CallStats {
                    sent: 250,
                    delivered: 250,
                    p50_ms: 5.0,
                    p99_ms: 5.5,
                    max_ms: 6.0,
                    ..CallStats::default()
                },
            )),
            call_transport: Transport::Udp,
            emulator: Vec::new(),
            payload: None,
            per_run: Vec::new(),
        }
    }

    #[test]
    fn spread_is_the_median_and_the_extremes() {
        let s = Spread::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(Spread::of(&[4.0, 1.0, 2.0, 3.0]).unwrap().median, 2.5);
        assert_eq!(Spread::of(&[]), None);
    }

    /// Three runs: every figure is the median, its range is beside it in the JSON and
    /// the table, every run is kept, and the JSON reads back the same.
    #[test]
    fn runs_report_the_median_and_the_range_of_each_figure() {
        let r = BenchResult::from_runs(vec![run(1.0, 5), run(0.5, 9), run(1.2, 1)]).unwrap();
        assert_eq!(r.runs(), 3);
        assert_eq!(r.braid["logical"].tcp_bps, 100e6);
        assert_eq!(r.braid["logical"].tcp_retransmits, 5);
        assert_eq!(r.mptcp_bps, Some(80e6));
        let v = r.to_json();
        assert_eq!(v["runs"], 3);
        assert_eq!(v["braid"]["logical"]["tcp_bps"], 100e6);
        assert_eq!(v["braid"]["logical"]["tcp_bps_range"], json!([50e6, 120e6]));
        assert_eq!(
            v["braid"]["logical"]["tcp_retransmits_range"],
            json!([1.0, 9.0])
        );
        assert_eq!(v["ceiling_bps_range"], json!([47.5e6, 114e6]));
        assert_eq!(v["links"][0]["tcp_bps_range"], json!([45e6, 108e6]));
        assert_eq!(v["per_run"].as_array().unwrap().len(), 3);
        assert_eq!(v["braid"]["logical"]["tcp_packet_bps"], 70e6);
        assert_eq!(v["braid"]["logical"]["download_s"], 0.3);
        assert_eq!(v["download"]["bytes"], 2_000_000);
        assert_eq!(v["download"]["mptcp_s"], 0.4);
        assert_eq!(v["download"]["best_link_s_range"], json!([0.25, 0.6]));
        assert_eq!(
            v["braid"]["logical"]["tcp_packet_bps_range"],
            json!([35e6, 84e6])
        );
        // The call: the median of each figure, and its p99 over the idle best link's
        // median.
        assert_eq!(v["braid"]["logical"]["call"]["p99_ms"], 10.0);
        assert_eq!(v["braid"]["logical"]["call"]["p99_over_idle_ms"], 5.0);
        assert_eq!(
            v["braid"]["logical"]["call"]["p99_ms_range"],
            json!([5.0, 12.0])
        );
        assert_eq!(v["call_idle_best_link"]["link"], 0);
        assert_eq!(v["call_idle_best_link"]["spec"], "100mbit/0ms");
        assert_eq!(v["call_idle_best_link"]["p50_ms"], 5.0);
        let t = r.table();
        assert!(t.contains("link 0 alone, idle (100mbit/0ms)"), "{t}");
        assert!(
            t.contains("braid logical, beside the TCP flow           750     0    0.00     5.0    10.0    20.0       5.0"),
            "{t}"
        );
        assert!(t.contains("the same as packets"), "{t}");
        assert!(t.contains("One download of 2000000 bytes"), "{t}");
        assert!(t.contains("3 runs"), "{t}");
        assert!(
            t.contains("50.0-120.0") && t.contains("TCP retransmits 5 (1-9)"),
            "{t}"
        );
        let back = BenchResult::from_json(&v).unwrap();
        assert_eq!(back.to_json(), v);
    }

    /// One run: no ranges, no per-run copies; the figures as measured.
    #[test]
    fn a_single_run_keeps_its_figures_and_has_no_ranges() {
        let r = BenchResult::from_runs(vec![run(1.0, 5)]).unwrap();
        let v = r.to_json();
        assert_eq!(v["runs"], 1);
        assert!(v.get("per_run").is_none() && v.get("ceiling_bps_range").is_none());
        assert!(v["braid"]["logical"].get("tcp_bps_range").is_none());
        assert!(!r.table().contains("min-max"));
        // MPTCP's seconds as its sender and as its receiver counted them.
        let t = r.table();
        assert!(t.contains("  MPTCP              80\n"), "{t}");
        assert!(t.contains("    received         79\n"), "{t}");
    }
}
