//! Scenario files (TOML): channels, traffic, limits, a list of runs and sweeps over any
//! numeric parameter. `docs/scenarios.md` documents every key, unit and default.
//!
//! A sweep sets a key (a dotted path such as `channel.1.rate_mbps` or
//! `channel[1].rate_mbps`) to each of its values in turn; several sweeps form a grid.
//! A run may override any key the same way with its `set` table. Every error names the
//! file, the key and what was expected.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use braid_proto::sched::{grr_weights, srr_quanta};
use braid_proto::session::schema::SessionSettings;
use braid_proto::units;
use braid_proto::{Duration, MarkerConfig, Mode, Policy, ReceiverConfig, StripeConfig};
use toml::{Table, Value};

use crate::engine::{RunConfig, Variant, MIN_PACKET};
use crate::model::{
    parse_trace, secs_to_ns, Arrivals, ChannelSpec, Durations, Gilbert, LinkChange, LossWindow,
    Nanos, Rate, Sizes, TrafficSpec,
};

/// A scenario that could not be loaded: the file, the key (if one is to blame), and
/// what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScenarioError {
    /// The scenario file as given.
    pub file: String,
    /// The key at fault, as a path like `channel[1].rate_mbps`.
    pub key: Option<String>,
    /// What is wrong and what was expected.
    pub message: String,
}

impl std::fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.key {
            Some(k) => write!(f, "{}: key `{}`: {}", self.file, k, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for ScenarioError {}

/// Metrics a plot can put on the y axis.
pub const PLOT_METRICS: &[&str] = &[
    "goodput_bps",
    "inorder_goodput_bps",
    "out_of_order",
    "max_reorder_depth",
    "packets_lost",
    "latency_mean_ms",
    "latency_p50_ms",
    "latency_p99_ms",
    "latency_max_ms",
    "marker_overhead",
    "resync_max_s",
    "throughput_efficiency",
    "tcp_goodput_bps",
    "tcp_retransmits",
    "voip_p99_ms",
    "voip_loss_pct",
];

/// Plot settings.
#[derive(Clone, Debug, PartialEq)]
pub struct PlotSpec {
    /// Metric on the y axis (one of [`PLOT_METRICS`]).
    pub y: String,
    /// The sweep parameter on the x axis (its name).
    pub x: Option<String>,
    /// Title; default: the scenario name.
    pub title: Option<String>,
    /// X axis label; default: the parameter name.
    pub x_label: Option<String>,
    /// Y axis label; default: derived from the metric.
    pub y_label: Option<String>,
}

/// One simulation to carry out: a run variant at one sweep point.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    /// The run's label.
    pub label: String,
    /// Scheduler name (srr, rr, grr, random, sqf, hash, sum).
    pub scheduler: String,
    /// Receiver mode name (none, logical, seq, trr).
    pub receiver: String,
    /// The swept parameters and their values at this point.
    pub params: Vec<(String, f64)>,
    /// The run itself (its seed is set when the scenario is run).
    pub config: RunConfig,
}

/// A loaded scenario: jobs in run-major order (each run across all sweep points).
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// Name (the `name` key, else the file stem).
    pub name: String,
    /// Free text.
    pub description: String,
    /// Seed used when none is given on the command line.
    pub seed: u64,
    /// Names of the swept parameters, in sweep order.
    pub sweep_names: Vec<String>,
    /// Run labels, in file order.
    pub run_labels: Vec<String>,
    /// What to run.
    pub jobs: Vec<Job>,
    /// Plot settings.
    pub plot: PlotSpec,
}

/// Load a scenario file.
pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ScenarioError {
        file: file.clone(),
        key: None,
        message: format!("cannot read the file: {e}"),
    })?;
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "scenario".into());
    parse(&text, &file, &dir, &stem)
}

/// The keys of a scenario file's top level.
const TOP_KEYS: &[&str] = &[
    "name",
    "description",
    "seed",
    "duration_s",
    "packets",
    "drain_s",
    "max_packet",
    "channel",
    "traffic",
    "markers",
    "trr",
    "receiver",
    "srr",
    "session",
    "errctl",
    "voip",
    "run",
    "sweep",
    "plot",
];

/// Parse scenario text. `file` names it in errors, `dir` resolves relative trace paths,
/// `stem` is the default name.
pub fn parse(text: &str, file: &str, dir: &Path, stem: &str) -> Result<Scenario, ScenarioError> {
    let root: Table = toml::from_str(text).map_err(|e| ScenarioError {
        file: file.into(),
        key: None,
        message: format!("not valid TOML: {}", e.to_string().trim_end()),
    })?;
    let cx = Cx {
        file,
        dir,
        traces: Default::default(),
    };
    let top = Tab::new(&cx, "", &root);
    top.check_keys(TOP_KEYS)?;
    let name = top.str_opt("name")?.unwrap_or(stem).to_string();
    let description = top.str_opt("description")?.unwrap_or("").to_string();
    let seed = top.u64_or("seed", 1, "a whole number >= 0")?;

    // Sweeps.
    let sweeps = parse_sweeps(&top)?;
    // Runs.
    let runs = top.tabs("run")?;
    if runs.is_empty() {
        return Err(cx.err(
            Some("run"),
            "expected at least one [[run]] table (scheduler and receiver to simulate)",
        ));
    }
    let mut run_specs = Vec::new();
    for r in &runs {
        run_specs.push(parse_run_head(r)?);
    }
    let plot = parse_plot(&top, &sweeps)?;

    // The base tree without runs and sweeps; each job applies its overrides to a copy.
    let mut base = root.clone();
    base.remove("run");
    base.remove("sweep");
    base.remove("plot");

    let points = sweep_grid(&sweeps);
    let mut jobs = Vec::new();
    for (ri, rs) in run_specs.iter().enumerate() {
        for point in &points {
            jobs.push(job_at(&cx, &base, ri, rs, &sweeps, point)?);
        }
    }
    Ok(Scenario {
        name,
        description,
        seed,
        sweep_names: sweeps.iter().map(|s| s.name.clone()).collect(),
        run_labels: run_specs.iter().map(|r| r.label.clone()).collect(),
        jobs,
        plot,
    })
}

/// The sweep grid: every combination of the sweeps' values, the first sweep varying
/// slowest; each point a list of (sweep index, value).
fn sweep_grid(sweeps: &[Sweep]) -> Vec<Vec<(usize, f64)>> {
    let mut points: Vec<Vec<(usize, f64)>> = vec![vec![]];
    for (si, s) in sweeps.iter().enumerate() {
        let mut next = Vec::new();
        for p in &points {
            for &v in &s.values {
                let mut q = p.clone();
                q.push((si, v));
                next.push(q);
            }
        }
        points = next;
    }
    points
}

/// The job of run `ri` at one sweep point: the base tree with the run's `set` and the
/// point's values applied, built; errors say at which sweep point.
fn job_at(
    cx: &Cx,
    base: &Table,
    ri: usize,
    rs: &RunHead,
    sweeps: &[Sweep],
    point: &[(usize, f64)],
) -> Result<Job, ScenarioError> {
    let mut tree = base.clone();
    for (k, v) in &rs.set {
        set_path(&mut tree, k, v.clone())
            .map_err(|m| cx.err(Some(&format!("run[{ri}].set.\"{k}\"")), &m))?;
    }
    let mut params = Vec::new();
    for &(si, v) in point {
        let s = &sweeps[si];
        for k in &s.keys {
            set_path(&mut tree, k, number_value(v))
                .map_err(|m| cx.err(Some(&format!("sweep[{si}].key \"{k}\"")), &m))?;
        }
        params.push((s.name.clone(), v));
    }
    let at = if params.is_empty() {
        String::new()
    } else {
        let p: Vec<String> = params.iter().map(|(k, v)| format!("{k} = {v}")).collect();
        format!(" (at sweep point {})", p.join(", "))
    };
    let t = Tab::new(cx, "", &tree);
    build_job(&t, rs, ri, params).map_err(|mut e| {
        e.message.push_str(&at);
        e
    })
}

struct Cx<'a> {
    file: &'a str,
    dir: &'a Path,
    traces: std::cell::RefCell<BTreeMap<PathBuf, Vec<(Nanos, u32)>>>,
}

impl Cx<'_> {
    fn err(&self, key: Option<&str>, msg: &str) -> ScenarioError {
        ScenarioError {
            file: self.file.into(),
            key: key.map(Into::into),
            message: msg.into(),
        }
    }
}

fn describe(v: &Value) -> String {
    match v {
        Value::String(s) => format!("string \"{s}\""),
        Value::Integer(i) => format!("integer {i}"),
        Value::Float(f) => format!("number {f}"),
        Value::Boolean(b) => format!("boolean {b}"),
        Value::Datetime(d) => format!("date {d}"),
        Value::Array(_) => "an array".into(),
        Value::Table(_) => "a table".into(),
    }
}

fn number_value(v: f64) -> Value {
    if v.fract() == 0.0 && v.abs() < 9.0e15 {
        Value::Integer(v as i64)
    } else {
        Value::Float(v)
    }
}

/// A table being read, with its path for error messages.
struct Tab<'a> {
    cx: &'a Cx<'a>,
    path: String,
    t: &'a Table,
}

impl<'a> Tab<'a> {
    fn new(cx: &'a Cx<'a>, path: &str, t: &'a Table) -> Tab<'a> {
        Tab {
            cx,
            path: path.into(),
            t,
        }
    }

    fn key(&self, k: &str) -> String {
        if self.path.is_empty() {
            k.into()
        } else {
            format!("{}.{}", self.path, k)
        }
    }

    fn err(&self, k: &str, msg: &str) -> ScenarioError {
        self.cx.err(Some(&self.key(k)), msg)
    }

    fn expected(&self, k: &str, what: &str, v: &Value) -> ScenarioError {
        self.err(k, &format!("expected {what}, found {}", describe(v)))
    }

    fn check_keys(&self, allowed: &[&str]) -> Result<(), ScenarioError> {
        for k in self.t.keys() {
            if !allowed.contains(&k.as_str()) {
                return Err(self.err(
                    k,
                    &format!("unknown key; expected one of: {}", allowed.join(", ")),
                ));
            }
        }
        Ok(())
    }

    fn str_opt(&self, k: &str) -> Result<Option<&'a str>, ScenarioError> {
        match self.t.get(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.expected(k, "a string", v)),
        }
    }

    fn num_opt(&self, k: &str, what: &str) -> Result<Option<f64>, ScenarioError> {
        match self.t.get(k) {
            None => Ok(None),
            Some(Value::Integer(i)) => Ok(Some(*i as f64)),
            Some(Value::Float(f)) if f.is_finite() => Ok(Some(*f)),
            Some(v) => Err(self.expected(k, what, v)),
        }
    }

    /// A number satisfying `ok`, described by `what` in errors.
    fn f64_req(&self, k: &str, what: &str, ok: fn(f64) -> bool) -> Result<f64, ScenarioError> {
        match self.num_opt(k, what)? {
            Some(x) if ok(x) => Ok(x),
            Some(x) => Err(self.err(k, &format!("expected {what}, found {x}"))),
            None => Err(self.err(k, &format!("missing; expected {what}"))),
        }
    }

    fn f64_or(
        &self,
        k: &str,
        default: f64,
        what: &str,
        ok: fn(f64) -> bool,
    ) -> Result<f64, ScenarioError> {
        if self.t.contains_key(k) {
            self.f64_req(k, what, ok)
        } else {
            Ok(default)
        }
    }

    fn u64_opt(&self, k: &str, what: &str) -> Result<Option<u64>, ScenarioError> {
        match self.t.get(k) {
            None => Ok(None),
            Some(Value::Integer(i)) if *i >= 0 => Ok(Some(*i as u64)),
            Some(Value::Float(f)) if *f >= 0.0 && f.fract() == 0.0 && *f < 9.0e15 => {
                Ok(Some(*f as u64))
            }
            Some(v) => Err(self.expected(k, what, v)),
        }
    }

    fn u64_or(&self, k: &str, default: u64, what: &str) -> Result<u64, ScenarioError> {
        Ok(self.u64_opt(k, what)?.unwrap_or(default))
    }

    fn u32_in(
        &self,
        k: &str,
        default: Option<u32>,
        lo: u32,
        hi: u32,
        what: &str,
    ) -> Result<u32, ScenarioError> {
        match self.u64_opt(k, what)? {
            Some(x) if x >= u64::from(lo) && x <= u64::from(hi) => Ok(x as u32),
            Some(x) => Err(self.err(k, &format!("expected {what}, found {x}"))),
            None => default.ok_or_else(|| self.err(k, &format!("missing; expected {what}"))),
        }
    }

    /// A boolean; a sweep sets numbers, so 0 and 1 are accepted too.
    fn bool_or(&self, k: &str, default: bool) -> Result<bool, ScenarioError> {
        const WHAT: &str = "true or false (or 0 or 1, as a sweep sets it)";
        match self.t.get(k) {
            None => Ok(default),
            Some(Value::Boolean(b)) => Ok(*b),
            Some(Value::Integer(0)) => Ok(false),
            Some(Value::Integer(1)) => Ok(true),
            Some(Value::Float(f)) if *f == 0.0 || *f == 1.0 => Ok(*f == 1.0),
            Some(v) => Err(self.expected(k, WHAT, v)),
        }
    }

    fn table(&self, k: &str) -> Result<Option<Tab<'a>>, ScenarioError> {
        match self.t.get(k) {
            None => Ok(None),
            Some(Value::Table(t)) => Ok(Some(Tab::new(self.cx, &self.key(k), t))),
            Some(v) => Err(self.expected(k, "a table", v)),
        }
    }

    /// An array of tables (`[[k]]`), each with path `k[i]`.
    fn tabs(&self, k: &str) -> Result<Vec<Tab<'a>>, ScenarioError> {
        match self.t.get(k) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::Table(t) => Ok(Tab::new(self.cx, &format!("{}[{i}]", self.key(k)), t)),
                    v => Err(self.cx.err(
                        Some(&format!("{}[{i}]", self.key(k))),
                        &format!("expected a table, found {}", describe(v)),
                    )),
                })
                .collect(),
            Some(v) => Err(self.expected(k, "an array of tables ([[...]])", v)),
        }
    }

    fn num_list(&self, k: &str, what: &str) -> Result<Option<Vec<f64>>, ScenarioError> {
        match self.t.get(k) {
            None => Ok(None),
            Some(Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::Integer(x) => Ok(*x as f64),
                    Value::Float(x) if x.is_finite() => Ok(*x),
                    v => Err(self.cx.err(
                        Some(&format!("{}[{i}]", self.key(k))),
                        &format!("expected {what}, found {}", describe(v)),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(v) => Err(self.expected(k, &format!("an array of {what}"), v)),
        }
    }
}

fn positive(x: f64) -> bool {
    x > 0.0
}
/// Times and delays: up to a million seconds keeps every sum of them far from
/// overflowing the engine's nanosecond clock.
const MAX_SECONDS: f64 = 1e6;
fn time_s(x: f64) -> bool {
    (0.0..=MAX_SECONDS).contains(&x)
}
fn pos_time_s(x: f64) -> bool {
    x > 0.0 && x <= MAX_SECONDS
}
fn time_ms(x: f64) -> bool {
    (0.0..=MAX_SECONDS * 1e3).contains(&x)
}
fn pos_time_ms(x: f64) -> bool {
    x > 0.0 && x <= MAX_SECONDS * 1e3
}
fn rate_mbps(x: f64) -> bool {
    (1e-3..=1e7).contains(&x)
}
fn probability(x: f64) -> bool {
    (0.0..=1.0).contains(&x)
}

struct Sweep {
    name: String,
    keys: Vec<String>,
    values: Vec<f64>,
}

fn parse_sweeps(top: &Tab) -> Result<Vec<Sweep>, ScenarioError> {
    let mut out = Vec::new();
    for s in top.tabs("sweep")? {
        s.check_keys(&["key", "keys", "name", "values", "from", "to", "step"])?;
        let keys = sweep_keys(&s)?;
        let values = sweep_values(&s)?;
        if values.is_empty() {
            return Err(s.err("values", "expected at least one value"));
        }
        let name = s
            .str_opt("name")?
            .map(String::from)
            .unwrap_or_else(|| keys[0].clone());
        out.push(Sweep { name, keys, values });
    }
    Ok(out)
}

/// A sweep's `key` or `keys`: key paths, none into run, sweep or plot settings.
fn sweep_keys(s: &Tab) -> Result<Vec<String>, ScenarioError> {
    let keys: Vec<String> = match (s.t.get("key"), s.t.get("keys")) {
        (Some(Value::String(k)), None) => vec![k.clone()],
        (None, Some(Value::Array(a))) if !a.is_empty() => a
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(k) => Ok(k.clone()),
                v => Err(s.err(
                    &format!("keys[{i}]"),
                    &format!("expected a key path string, found {}", describe(v)),
                )),
            })
            .collect::<Result<_, _>>()?,
        (Some(_), Some(_)) => return Err(s.err("keys", "give either `key` or `keys`, not both")),
        (Some(v), None) => {
            return Err(s.expected(
                "key",
                "a key path string such as \"channel.1.rate_mbps\"",
                v,
            ))
        }
        (None, Some(v)) => {
            return Err(s.expected("keys", "a non-empty array of key path strings", v))
        }
        (None, None) => {
            return Err(s.err(
                "key",
                "missing; expected the key path to sweep, such as \"channel.1.rate_mbps\"",
            ))
        }
    };
    for (i, k) in keys.iter().enumerate() {
        let at = if s.t.contains_key("keys") {
            format!("keys[{i}]")
        } else {
            "key".into()
        };
        parse_path(k).map_err(|m| s.err(&at, &m))?;
        if matches!(
            parse_path(k).ok().as_deref().and_then(|p| p.first()),
            Some(Seg::Key(f)) if f == "run" || f == "sweep" || f == "plot"
        ) {
            return Err(s.err(&at, "cannot sweep run, sweep or plot settings"));
        }
    }
    Ok(keys)
}

/// A sweep's `values`, or `from`/`to`/`step`.
fn sweep_values(s: &Tab) -> Result<Vec<f64>, ScenarioError> {
    Ok(match s.num_list("values", "a number")? {
        Some(v) => {
            if s.t.contains_key("from") || s.t.contains_key("to") || s.t.contains_key("step") {
                return Err(s.err(
                    "values",
                    "give either `values` or `from`/`to`/`step`, not both",
                ));
            }
            v
        }
        None => {
            let from = s.f64_req("from", "a number (first value)", |_| true)?;
            let to = s.f64_req("to", "a number (last value)", |_| true)?;
            let step = s.f64_req("step", "a number > 0", positive)?;
            if to < from {
                return Err(s.err(
                    "to",
                    &format!("expected a number >= from ({from}), found {to}"),
                ));
            }
            let n = ((to - from) / step + 1e-9).floor() as u64 + 1;
            if n > 100_000 {
                return Err(s.err(
                    "step",
                    &format!("the sweep would have {n} points; at most 100000"),
                ));
            }
            (0..n)
                .map(|i| {
                    // Round away float noise such as 0.30000000000000004.
                    let v = from + step * i as f64;
                    (v * 1e9).round() / 1e9
                })
                .collect()
        }
    })
}

struct RunHead {
    label: String,
    scheduler: String,
    receiver: Option<String>,
    weights: Option<Vec<u32>>,
    set: Vec<(String, Value)>,
}

const SCHEDULERS: &str = "srr, rr, grr, random, sqf, hash, sum (rr is also spelled brr)";

/// The head of a `[[run]]`: its scheduler, receiver mode, weights, `set` overrides and
/// label, checked in that order (the label defaults to `scheduler+receiver`).
fn parse_run_head(r: &Tab) -> Result<RunHead, ScenarioError> {
    r.check_keys(&["label", "scheduler", "receiver", "weights", "set"])?;
    let scheduler = head_scheduler(r)?;
    let receiver = head_receiver(r)?;
    let weights = head_weights(r)?;
    let set = head_set(r)?;
    let rx = receiver
        .clone()
        .unwrap_or_else(|| default_receiver(scheduler).into());
    let label = r
        .str_opt("label")?
        .map(String::from)
        .unwrap_or_else(|| format!("{scheduler}+{rx}"));
    Ok(RunHead {
        label,
        scheduler: scheduler.into(),
        receiver,
        weights,
        set,
    })
}

/// A run's `scheduler`: required, one of [`SCHEDULERS`].
fn head_scheduler<'a>(r: &Tab<'a>) -> Result<&'a str, ScenarioError> {
    let scheduler = r.str_opt("scheduler")?.ok_or_else(|| {
        r.err(
            "scheduler",
            &format!("missing; expected one of {SCHEDULERS}"),
        )
    })?;
    if scheduler != "sum" && units::parse_policy(scheduler).is_err() {
        return Err(r.err(
            "scheduler",
            &format!("unknown scheduler \"{scheduler}\"; expected one of {SCHEDULERS}"),
        ));
    }
    Ok(scheduler)
}

/// A run's `receiver` mode, if given: a known mode name.
fn head_receiver(r: &Tab) -> Result<Option<String>, ScenarioError> {
    let receiver = r.str_opt("receiver")?.map(String::from);
    if let Some(m) = &receiver {
        if Mode::from_name(m).is_none() {
            return Err(r.err(
                "receiver",
                &format!("unknown receiver mode \"{m}\"; expected one of none, logical, seq, trr"),
            ));
        }
    }
    Ok(receiver)
}

/// A run's `weights`, if given: whole numbers from 1 to `u32::MAX`.
fn head_weights(r: &Tab) -> Result<Option<Vec<u32>>, ScenarioError> {
    let Some(v) = r.num_list("weights", "a whole number >= 1")? else {
        return Ok(None);
    };
    whole_numbers(r, "weights", "a whole number >= 1", &v).map(Some)
}

/// The list `v` of key `key` as whole numbers from 1 to `u32::MAX`; an error names
/// the first that is not (`key[i]`: expected `what`).
fn whole_numbers(t: &Tab, key: &str, what: &str, v: &[f64]) -> Result<Vec<u32>, ScenarioError> {
    v.iter()
        .enumerate()
        .map(|(i, &x)| {
            if x >= 1.0 && x.fract() == 0.0 && x <= f64::from(u32::MAX) {
                Ok(x as u32)
            } else {
                Err(t.err(
                    &format!("{key}[{i}]"),
                    &format!("expected {what}, found {x}"),
                ))
            }
        })
        .collect()
}

/// A run's `set` table: each key a valid settings path, with its value, in file order.
fn head_set(r: &Tab) -> Result<Vec<(String, Value)>, ScenarioError> {
    let mut set = Vec::new();
    if let Some(t) = r.table("set")? {
        for (k, v) in t.t {
            parse_path(k).map_err(|m| t.err(&format!("\"{k}\""), &m))?;
            set.push((k.clone(), v.clone()));
        }
    }
    Ok(set)
}

fn default_receiver(scheduler: &str) -> &'static str {
    match scheduler {
        "sqf" | "hash" | "sum" => "none",
        _ => "logical",
    }
}

fn parse_plot(top: &Tab, sweeps: &[Sweep]) -> Result<PlotSpec, ScenarioError> {
    let mut p = PlotSpec {
        y: "goodput_bps".into(),
        x: sweeps.first().map(|s| s.name.clone()),
        title: None,
        x_label: None,
        y_label: None,
    };
    if let Some(t) = top.table("plot")? {
        t.check_keys(&["y", "x", "title", "x_label", "y_label"])?;
        if let Some(y) = t.str_opt("y")? {
            if !PLOT_METRICS.contains(&y) {
                return Err(t.err(
                    "y",
                    &format!(
                        "unknown metric \"{y}\"; expected one of {}",
                        PLOT_METRICS.join(", ")
                    ),
                ));
            }
            p.y = y.into();
        }
        if let Some(x) = t.str_opt("x")? {
            if !sweeps.iter().any(|s| s.name == x) {
                let names: Vec<&str> = sweeps.iter().map(|s| s.name.as_str()).collect();
                return Err(t.err(
                    "x",
                    &format!(
                        "\"{x}\" is not a swept parameter; expected one of: {}",
                        if names.is_empty() {
                            "(no [[sweep]] in this file)".to_string()
                        } else {
                            names.join(", ")
                        }
                    ),
                ));
            }
            p.x = Some(x.into());
        }
        p.title = t.str_opt("title")?.map(Into::into);
        p.x_label = t.str_opt("x_label")?.map(Into::into);
        p.y_label = t.str_opt("y_label")?.map(Into::into);
    }
    Ok(p)
}

#[derive(Debug, Clone, PartialEq)]
enum Seg {
    Key(String),
    Index(usize),
}

/// `channel.1.rate_mbps`, `channel[1].rate_mbps`, `markers.every_rounds`.
fn parse_path(p: &str) -> Result<Vec<Seg>, String> {
    let bad = || {
        format!("\"{p}\" is not a key path; expected dotted names and indices like \"channel.1.rate_mbps\" or \"channel[1].rate_mbps\"")
    };
    let mut segs = Vec::new();
    for part in p.split('.') {
        let (name, rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if name.is_empty() && rest.is_empty() {
            return Err(bad());
        }
        if !name.is_empty() {
            if let Ok(i) = name.parse::<usize>() {
                segs.push(Seg::Index(i));
            } else if name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                segs.push(Seg::Key(name.into()));
            } else {
                return Err(bad());
            }
        }
        let mut r = rest;
        while !r.is_empty() {
            let close = r.find(']').ok_or_else(bad)?;
            if !r.starts_with('[') {
                return Err(bad());
            }
            let i = r[1..close].parse::<usize>().map_err(|_| bad())?;
            segs.push(Seg::Index(i));
            r = &r[close + 1..];
        }
    }
    if segs.is_empty() || !matches!(segs[0], Seg::Key(_)) {
        return Err(bad());
    }
    Ok(segs)
}

/// Set the value at `path`, creating missing tables on the way. On error `root` is
/// unchanged.
fn set_path(root: &mut Table, path: &str, v: Value) -> Result<(), String> {
    let segs = parse_path(path)?;
    let mut tree = Value::Table(root.clone());
    set_in(&mut tree, &segs, path, v)?;
    if let Value::Table(t) = tree {
        *root = t;
    }
    Ok(())
}

fn set_in(cur: &mut Value, segs: &[Seg], path: &str, v: Value) -> Result<(), String> {
    let Some((first, rest)) = segs.split_first() else {
        *cur = v;
        return Ok(());
    };
    match first {
        Seg::Key(k) => {
            let Value::Table(t) = cur else {
                return Err(format!(
                    "\"{path}\": the part before \"{k}\" is not a table"
                ));
            };
            if rest.is_empty() {
                t.insert(k.clone(), v);
                return Ok(());
            }
            if !t.contains_key(k) {
                if matches!(rest[0], Seg::Index(_)) {
                    return Err(format!("\"{path}\": there is no array \"{k}\" to index"));
                }
                t.insert(k.clone(), Value::Table(Table::new()));
            }
            set_in(t.get_mut(k).expect("present"), rest, path, v)
        }
        Seg::Index(n) => {
            let Value::Array(a) = cur else {
                return Err(format!(
                    "\"{path}\": index [{n}] applied to something that is not an array"
                ));
            };
            let len = a.len();
            let Some(e) = a.get_mut(*n) else {
                return Err(format!(
                    "\"{path}\": index {n} is out of range (the array has {len} entries, counted from 0)"
                ));
            };
            set_in(e, rest, path, v)
        }
    }
}

fn build_job(
    t: &Tab,
    rh: &RunHead,
    ri: usize,
    params: Vec<(String, f64)>,
) -> Result<Job, ScenarioError> {
    let limits = parse_limits(t)?;
    let channels = parse_channels(t)?;
    let traffic = parse_traffic(t)?;
    check_tcp_source(t, &traffic, &limits)?;
    let mode_name = rh
        .receiver
        .clone()
        .unwrap_or_else(|| default_receiver(&rh.scheduler).into());
    let mode = Mode::from_name(&mode_name).expect("validated");
    check_packet_sizes(t, &traffic, mode, limits.max_packet)?;
    let variant = if rh.scheduler == "sum" {
        if mode != Mode::None {
            return Err(t.cx.err(Some(&format!("run[{ri}].receiver")), "the `sum` pseudo-scheduler runs each channel alone with receiver \"none\"; leave `receiver` out or set it to \"none\""));
        }
        Variant::SumOfSingles
    } else {
        let sc = stripe_config(t, rh, ri, &channels, limits.max_packet, &mode_name)?;
        match (t.table("session")?, t.table("errctl")?) {
            (Some(_), Some(_)) => {
                return Err(t.err(
                    "errctl",
                    "a run is either a [session] run or an [errctl] run, not both",
                ))
            }
            (Some(st), None) => session_variant(&st, sc)?,
            (None, Some(et)) => errctl_variant(&et, &channels, &traffic)?,
            (None, None) => Variant::Striped(sc),
        }
    };
    let voip = parse_voip(t, &variant, limits.max_packet)?;
    Ok(Job {
        label: rh.label.clone(),
        scheduler: rh.scheduler.clone(),
        receiver: mode_name,
        params,
        config: RunConfig {
            channels,
            traffic,
            duration: limits.duration.map(secs_to_ns),
            packets: limits.packets,
            drain: secs_to_ns(limits.drain),
            seed: 0,
            variant,
            voip,
        },
    })
}

/// `[voip]`: a VoIP-like flow beside the traffic, in `[session]` runs: `pps` packets a
/// second (default 50) of `bytes` bytes (IP length, default 200) from `start_s`
/// (default 1), UDP (or `protocol = "tcp"`: TCP) port `port` (default 5004) both ways,
/// DSCP `dscp` (default 0).
fn parse_voip(
    t: &Tab,
    variant: &Variant,
    max_packet: u32,
) -> Result<Option<crate::voip::VoipSpec>, ScenarioError> {
    let Some(v) = t.table("voip")? else {
        return Ok(None);
    };
    v.check_keys(&["pps", "bytes", "start_s", "port", "dscp", "protocol"])?;
    if !matches!(variant, Variant::Session(_)) {
        return Err(t.err(
            "voip",
            "a VoIP flow needs a [session] run (the session's flow policies carry it)",
        ));
    }
    let pps = v.f64_or("pps", 50.0, "packets per second from 0.1 to 100000", |x| {
        (0.1..=100_000.0).contains(&x)
    })?;
    let tcp = match v.str_opt("protocol")? {
        None | Some("udp") => false,
        Some("tcp") => true,
        Some(o) => {
            return Err(v.err(
                "protocol",
                &format!("unknown protocol \"{o}\"; expected \"udp\" or \"tcp\""),
            ))
        }
    };
    let min = if tcp {
        crate::voip::MIN_BYTES_TCP
    } else {
        crate::voip::MIN_BYTES
    };
    let bytes = v.u32_in(
        "bytes",
        Some(200),
        min,
        max_packet.min(65_535),
        &format!(
            "a whole number of bytes from {} to {} (max_packet)",
            min,
            max_packet.min(65_535)
        ),
    )?;
    let start = v.f64_or(
        "start_s",
        1.0,
        "a time in seconds from 0 to 1000000",
        time_s,
    )?;
    let port = v.u32_in("port", Some(5004), 1, 65_535, "a port from 1 to 65535")? as u16;
    let dscp = v.u32_in("dscp", Some(0), 0, 63, "a DSCP from 0 to 63")? as u8;
    Ok(Some(crate::voip::VoipSpec {
        pps,
        bytes,
        start: secs_to_ns(start),
        port,
        dscp,
        tcp,
    }))
}

/// How long a run lasts and how large its packets may be.
struct Limits {
    /// `duration_s`.
    duration: Option<f64>,
    /// `packets`.
    packets: Option<u64>,
    /// `drain_s`.
    drain: f64,
    /// `max_packet`.
    max_packet: u32,
}

/// `duration_s` and/or `packets` (one is needed), `drain_s`, `max_packet`.
fn parse_limits(t: &Tab) -> Result<Limits, ScenarioError> {
    let duration = if t.t.contains_key("duration_s") {
        Some(t.f64_req(
            "duration_s",
            "a number of seconds > 0 and <= 1000000",
            pos_time_s,
        )?)
    } else {
        None
    };
    let packets = t.u64_opt("packets", "a whole number of packets >= 1")?;
    if packets == Some(0) {
        return Err(t.err(
            "packets",
            "expected a whole number of packets >= 1, found 0",
        ));
    }
    if duration.is_none() && packets.is_none() {
        return Err(t.cx.err(
            None,
            "neither `duration_s` nor `packets` is set: the run needs a limit",
        ));
    }
    let drain = t.f64_or(
        "drain_s",
        2.0,
        "a number of seconds from 0 to 1000000",
        time_s,
    )?;
    let max_packet = t.u32_in(
        "max_packet",
        Some(1500),
        MIN_PACKET,
        1 << 20,
        &format!("a whole number of bytes from {MIN_PACKET} to 1048576"),
    )?;
    Ok(Limits {
        duration,
        packets,
        drain,
        max_packet,
    })
}

/// The `[[channel]]` tables: at least one, at most `MAX_CHANNELS`.
fn parse_channels(t: &Tab) -> Result<Vec<ChannelSpec>, ScenarioError> {
    let chans = t.tabs("channel")?;
    if chans.is_empty() {
        return Err(t.err("channel", "expected at least one [[channel]] table"));
    }
    if chans.len() > braid_proto::config::MAX_CHANNELS {
        return Err(t.err(
            "channel",
            &format!(
                "{} channels; at most {}",
                chans.len(),
                braid_proto::config::MAX_CHANNELS
            ),
        ));
    }
    chans.iter().map(parse_channel).collect()
}

/// The tcp source runs for `duration_s` (no `packets`) and needs room in its segments
/// for its own header.
fn check_tcp_source(t: &Tab, traffic: &TrafficSpec, limits: &Limits) -> Result<(), ScenarioError> {
    let Arrivals::Tcp(spec) = &traffic.arrivals else {
        return Ok(());
    };
    if limits.packets.is_some() {
        return Err(t.err(
            "packets",
            "the tcp source runs for `duration_s`; leave `packets` out",
        ));
    }
    if limits.duration.is_none() {
        return Err(t.err("duration_s", "missing; the tcp source needs `duration_s`"));
    }
    let (seg, _) = traffic.sizes.range();
    if seg < crate::tcp::MIN_TCP_PACKET {
        return Err(t.err(
            "traffic.bytes",
            &format!(
                "segments of {seg} bytes are below the tcp source's minimum of {} bytes (IPv4 header, transmission id, send time, segment number)",
                crate::tcp::MIN_TCP_PACKET
            ),
        ));
    }
    if spec.header_bytes >= seg {
        return Err(t.err(
            "traffic.header_bytes",
            &format!(
                "expected fewer header bytes than the segment's {seg}, found {}",
                spec.header_bytes
            ),
        ));
    }
    Ok(())
}

/// Packet sizes must fit the session and the simulator: at least `MIN_PACKET`, at most
/// `max_packet` with the sequence header of mode `seq`.
fn check_packet_sizes(
    t: &Tab,
    traffic: &TrafficSpec,
    mode: Mode,
    max_packet: u32,
) -> Result<(), ScenarioError> {
    let (smin, smax) = match &traffic.arrivals {
        Arrivals::Trace(tr) => (
            tr.iter().map(|x| x.1).min().unwrap_or(0),
            tr.iter().map(|x| x.1).max().unwrap_or(0),
        ),
        _ => traffic.sizes.range(),
    };
    if smin < MIN_PACKET {
        return Err(t.err("traffic", &format!("packet size {smin} bytes is below the simulator's minimum of {MIN_PACKET} bytes (each packet carries its id and send time)")));
    }
    let framing = if mode == Mode::Seq {
        braid_proto::wire::seq::HEADER_LEN as u32
    } else {
        0
    };
    if smax + framing > max_packet {
        return Err(t.err("max_packet", &format!(
            "packets of {smax} bytes{} do not fit max_packet = {max_packet}; raise max_packet or lower the sizes",
            if framing > 0 { format!(" plus the {framing}-byte sequence header") } else { String::new() }
        )));
    }
    Ok(())
}

/// The striper's configuration of a run: its scheduler and weights (`[srr]`), markers
/// (`[markers]`), triggers (`[trr]`) and receiver (`[receiver]`), validated together.
fn stripe_config(
    t: &Tab,
    rh: &RunHead,
    ri: usize,
    channels: &[ChannelSpec],
    max_packet: u32,
    mode_name: &str,
) -> Result<StripeConfig, ScenarioError> {
    let mode = Mode::from_name(mode_name).expect("validated");
    let quantum = parse_srr_quantum(t, max_packet)?;
    let policy = units::parse_policy(&rh.scheduler).expect("validated");
    let weights = run_weights(t, rh, ri, channels, quantum, max_packet)?;
    let markers = parse_markers(t, channels.len())?;
    let trigger_every = match t.table("trr")? {
        Some(tr) => {
            tr.check_keys(&["trigger_every"])?;
            tr.u32_in(
                "trigger_every",
                Some(128),
                1,
                u32::MAX,
                "a whole number of packets >= 1",
            )?
        }
        None => 128,
    };
    let receiver = parse_receiver(t)?;
    let sc = StripeConfig {
        policy,
        weights,
        max_packet,
        mode,
        markers,
        trigger_every,
        receiver,
    };
    sc.validate().map_err(|e| {
        t.cx.err(
            Some(&format!("run[{ri}]")),
            &format!(
                "{e} (scheduler \"{}\", receiver \"{mode_name}\")",
                rh.scheduler
            ),
        )
    })?;
    Ok(sc)
}

/// `[srr] quantum_bytes`: the quantum of the fastest channel (default `max_packet`).
fn parse_srr_quantum(t: &Tab, max_packet: u32) -> Result<u32, ScenarioError> {
    let quantum = match t.table("srr")? {
        Some(s) => {
            s.check_keys(&["quantum_bytes"])?;
            s.u32_in(
                "quantum_bytes",
                Some(max_packet),
                1,
                u32::MAX,
                "a whole number of bytes >= max_packet",
            )?
        }
        None => max_packet,
    };
    if quantum < max_packet {
        return Err(t.err(
            "srr.quantum_bytes",
            &format!(
                "expected a whole number of bytes >= max_packet ({max_packet}), found {quantum}"
            ),
        ));
    }
    Ok(quantum)
}

/// The run's `weights`, one per channel, or the scheduler's from the channels' rates.
fn run_weights(
    t: &Tab,
    rh: &RunHead,
    ri: usize,
    channels: &[ChannelSpec],
    quantum: u32,
    max_packet: u32,
) -> Result<Vec<u32>, ScenarioError> {
    if let Some(w) = &rh.weights {
        if w.len() != channels.len() {
            return Err(t.cx.err(
                Some(&format!("run[{ri}].weights")),
                &format!(
                    "expected {} weights (one per channel), found {}",
                    channels.len(),
                    w.len()
                ),
            ));
        }
        return Ok(w.clone());
    }
    let rates: Vec<f64> = channels.iter().map(|c| c.rate_bps).collect();
    Ok(match rh.scheduler.as_str() {
        "srr" | "random" => srr_quanta(&rates, quantum, max_packet),
        "grr" => grr_weights(&rates),
        _ => vec![1; channels.len()],
    })
}

/// `[markers]`: periodic markers, their position, idle and maximum interval.
fn parse_markers(t: &Tab, n_channels: usize) -> Result<MarkerConfig, ScenarioError> {
    let mut markers = MarkerConfig::default();
    let Some(m) = t.table("markers")? else {
        return Ok(markers);
    };
    m.check_keys(&["every_rounds", "position", "idle_ms", "max_interval_ms"])?;
    markers.every_rounds = m.u32_in(
        "every_rounds",
        Some(markers.every_rounds),
        0,
        u32::MAX,
        "a whole number of rounds >= 0 (0: no periodic markers)",
    )?;
    if let Some(p) = m.str_opt("position")? {
        markers.position = units::parse_marker_position(p, n_channels).map_err(|_| {
            m.err(
                "position",
                &format!(
                    "expected \"start\", \"end\" or \"channel:N\" with N below {n_channels}, found \"{p}\""
                ),
            )
        })?;
    }
    let idle = m.f64_or(
        "idle_ms",
        20.0,
        "a number of milliseconds from 0 to 1e9 (0: never)",
        time_ms,
    )?;
    markers.idle = if idle > 0.0 {
        Some(Duration::from_micros((idle * 1000.0).round() as u64))
    } else {
        None
    };
    if m.t.contains_key("max_interval_ms") {
        let iv = m.f64_req(
            "max_interval_ms",
            "a number of milliseconds > 0 (at most 1e9; leave the key out for none)",
            pos_time_ms,
        )?;
        markers.max_interval = Some(Duration::from_micros((iv * 1000.0).round().max(1.0) as u64));
    }
    Ok(markers)
}

/// `[receiver]`: buffer, maximum wait and delay equalization.
fn parse_receiver(t: &Tab) -> Result<ReceiverConfig, ScenarioError> {
    let mut receiver = ReceiverConfig::default();
    let Some(r) = t.table("receiver")? else {
        return Ok(receiver);
    };
    r.check_keys(&["buffer_packets", "max_wait_ms", "equalize"])?;
    receiver.buffer_packets = r.u32_in(
        "buffer_packets",
        Some(4096),
        1,
        1 << 24,
        "a whole number of packets from 1 to 16777216",
    )? as usize;
    let w = r.f64_or(
        "max_wait_ms",
        200.0,
        "a number of milliseconds > 0 (at most 1e9)",
        pos_time_ms,
    )?;
    receiver.max_wait = Duration::from_micros((w * 1000.0).round().max(1.0) as u64);
    receiver.equalize = r.bool_or("equalize", false)?;
    Ok(receiver)
}

/// `[session]`: run the whole session machine at both ends (hellos, liveness,
/// failover) with the tunnel's settings schema (`braid_proto::session::schema`): the
/// same keys, spellings and defaults as a tunnel configuration's `[session]`. The mode,
/// scheduler, markers and receiver come from the run as for every other run; channel
/// weights are relative, the smallest quantum equal to `max_packet`, as in the tunnel.
/// Pacing, per channel in the tunnel, is `pace_mbps` here (one rate per channel, 0:
/// not paced) with `pace_probe` (measure the channels, as the tunnel's `auto`).
fn session_variant(st: &Tab, sc: StripeConfig) -> Result<Variant, ScenarioError> {
    let Policy::Causal(scheduler) = sc.policy else {
        return Err(st.cx.err(
            Some("session"),
            "a session run needs a causal scheduler (srr, rr, grr or random)",
        ));
    };
    let settings = session_settings(st)?;
    let params = sc
        .weights
        .iter()
        .enumerate()
        .map(|(i, &weight)| braid_proto::session::ChannelParams {
            name: format!("ch{i}"),
            weight,
        })
        .collect();
    // max_packet stays the largest packet the striper makes; sealed datagrams are the
    // envelope's bytes larger on the channel.
    let mut cfg = braid_proto::session::Config::new(
        params,
        sc.max_packet + settings.security.data_overhead() as u32,
        b"a simulated pre-shared key of 32 bytes or more".to_vec(),
    );
    cfg.pacing = session_pacing(st, sc.weights.len())?;
    settings
        .apply(&mut cfg)
        .map_err(|e| st.err(e.key, &e.reason))?;
    // The simulator's links carry datagrams of any size: path MTU discovery
    // (`session::pmtu`) would only confirm the configured size with a probe now and
    // then, which moves every later datagram's timing. It is off here, so the runs
    // stay as they were; the session's unit tests cover it over links with an MTU.
    cfg.pmtu = None;
    // The simulator's traffic is packets from its sources, with no TCP stack on a
    // device to terminate: no end would open a stream, so streams are not announced
    // and the runs stay as they were (`docs/streams.md` is measured in the lab).
    cfg.streams = None;
    // The striping settings are the run's.
    cfg.mode = sc.mode;
    cfg.scheduler = scheduler;
    cfg.markers = sc.markers;
    cfg.trigger_every = sc.trigger_every;
    cfg.receiver = sc.receiver;
    cfg.credits = settings
        .credits(cfg.receiver.buffer_packets)
        .map_err(|e| st.err(e.key, &e.reason))?;
    cfg.validate().map_err(|e| st.cx.err(Some("session"), &e))?;
    Ok(Variant::Session(Box::new(cfg)))
}

/// The scenario's own pacing keys: `pace_mbps` (a rate per channel, Mbit/s on the
/// wire, 0: not paced) and `pace_probe` (measure the channels, as `pace = "auto"`).
const PACE_KEYS: [&str; 2] = ["pace_mbps", "pace_probe"];

/// The `[session]` table through the schema, but for the keys a scenario sets
/// elsewhere (said in the error) and its pacing keys.
fn session_settings(st: &Tab) -> Result<SessionSettings, ScenarioError> {
    let mut t = st.t.clone();
    for k in PACE_KEYS {
        t.remove(k);
    }
    if let Some(k) = t
        .keys()
        .find(|k| braid_proto::session::schema::simulator_source(k).is_some())
    {
        let from = braid_proto::session::schema::simulator_source(k).unwrap_or_default();
        return Err(st.err(k, &format!("not a [session] key in a scenario: {from}")));
    }
    // A sweep sets numbers: 0 and 1 stand for false and true where the schema has a
    // switch (its default is a boolean; `adaptive`'s and `tcp_streams`' are unset, "follow the
    // pacing").
    let defaults = Value::try_from(SessionSettings::default()).ok();
    for (k, v) in t.iter_mut() {
        let switch = k == "adaptive"
            || k == "tcp_streams"
            || defaults
                .as_ref()
                .and_then(|d| d.get(k))
                .is_some_and(Value::is_bool);
        match v {
            Value::Integer(i @ (0 | 1)) if switch => *v = Value::Boolean(*i == 1),
            Value::Float(f) if switch && (*f == 0.0 || *f == 1.0) => *v = Value::Boolean(*f == 1.0),
            _ => {}
        }
    }
    serde_path_to_error::deserialize(Value::Table(t)).map_err(|e| {
        let key = e.path().to_string();
        st.err(&key, e.into_inner().to_string().trim_end())
    })
}

/// Pacing at `pace_mbps`, measured with `pace_probe`. Without `pace_mbps`, the
/// tunnel's default: every channel measured and paced at what it measures (`pace =
/// "auto"`), unless `pace_probe = false` (the tunnel's `pace = "off"`: no pacing).
fn session_pacing(
    st: &Tab,
    channels: usize,
) -> Result<Option<braid_proto::session::PacingConfig>, ScenarioError> {
    let rates = st.num_list("pace_mbps", "a rate in Mbit/s >= 0, one per channel")?;
    let probe = st.bool_or("pace_probe", rates.is_none())?;
    let p = match rates {
        Some(r) => braid_proto::session::PacingConfig::new(r.iter().map(|x| x * 1e6).collect()),
        None if probe => braid_proto::session::PacingConfig::new(vec![0.0; channels]),
        None => return Ok(None),
    };
    // Capacity probes: a channel at 0 is paced at its measured rate, one with a rate
    // at the lower of the two.
    let p = braid_proto::session::PacingConfig { probe, ..p };
    p.validate(channels).map_err(|e| st.err("pace_mbps", &e))?;
    Ok(Some(p))
}

/// `[errctl]`: seed 002's error control over the one channel (see
/// [`crate::errctl`]). Durations in ms; the round trip defaults to twice the channel's
/// delay plus three packet times (the paper's t_a), the other timers to
/// [`braid_proto::errctl::Config::new`]'s fractions of it.
fn errctl_variant(
    et: &Tab,
    channels: &[ChannelSpec],
    traffic: &TrafficSpec,
) -> Result<Variant, ScenarioError> {
    use braid_proto::errctl::Config;
    et.check_keys(&[
        "tolerance",
        "window",
        "rtt_ms",
        "loss_timer_ms",
        "ack_interval_ms",
        "keepalive_ms",
        "deadline_ms",
        "reorder",
    ])?;
    let smax = errctl_packet_size(et, channels, traffic)?;
    let t = parse_tolerance(et)?;
    let ch = &channels[0];
    let t_p = f64::from(smax) * 8e9 / ch.rate_bps;
    let rtt_default = (2 * ch.delay) as f64 + 3.0 * t_p;
    let dur = |k: &str, default_ns: f64| -> Result<braid_proto::Duration, ScenarioError> {
        let v = et.f64_or(
            k,
            default_ns / 1e6,
            "a number of milliseconds > 0",
            pos_time_ms,
        )?;
        Ok(braid_proto::Duration::from_micros(
            (v * 1000.0).round().max(1.0) as u64,
        ))
    };
    let rtt = dur("rtt_ms", rtt_default)?;
    let mut cfg = Config::new(t, rtt);
    cfg.window = et.u32_in(
        "window",
        Some(4),
        1,
        braid_proto::errctl::MAX_WINDOW,
        "a whole number of segments from 1 to 65536",
    )?;
    cfg.loss_timer = dur("loss_timer_ms", cfg.loss_timer.as_micros() as f64 * 1e3)?;
    cfg.ack_interval = dur("ack_interval_ms", cfg.ack_interval.as_micros() as f64 * 1e3)?;
    cfg.keepalive = dur("keepalive_ms", cfg.keepalive.as_micros() as f64 * 1e3)?;
    cfg.deadline = dur("deadline_ms", cfg.deadline.as_micros() as f64 * 1e3)?;
    cfg.reorder = et.u32_in(
        "reorder",
        Some(0),
        0,
        u32::MAX,
        "a whole number of shipments >= 0",
    )?;
    cfg.validate().map_err(|e| et.err("tolerance", &e))?;
    Ok(Variant::ErrCtl(Box::new(crate::errctl::ErrCtlSpec {
        config: cfg,
        packet_bytes: smax,
    })))
}

/// An [errctl] run has one channel and a backlogged source of one packet size, which
/// this returns.
fn errctl_packet_size(
    et: &Tab,
    channels: &[ChannelSpec],
    traffic: &TrafficSpec,
) -> Result<u32, ScenarioError> {
    if channels.len() != 1 {
        return Err(et.err("tolerance", "an [errctl] run needs exactly one [[channel]]"));
    }
    let (smin, smax) = traffic.sizes.range();
    let header = braid_proto::wire::errctl::DATA_HEADER_LEN as u32;
    if smin != smax || smin <= header || !matches!(traffic.arrivals, Arrivals::Backlogged) {
        return Err(et.err(
            "tolerance",
            &format!("an [errctl] run needs a backlogged source of one fixed packet size above {header} bytes (the error-control header)"),
        ));
    }
    Ok(smax)
}

/// `[errctl] tolerance`: [W, E, B] (default [256, 0, 0], full reliability).
fn parse_tolerance(et: &Tab) -> Result<braid_proto::errctl::Tolerance, ScenarioError> {
    let tol = et
        .num_list("tolerance", "[W, E, B], whole numbers with 1 <= W <= 65535")?
        .unwrap_or_else(|| vec![256.0, 0.0, 0.0]);
    let ok = tol.len() == 3
        && tol
            .iter()
            .all(|x| x.fract() == 0.0 && (0.0..=65535.0).contains(x));
    if !ok || tol[0] < 1.0 {
        return Err(et.err(
            "tolerance",
            "expected [W, E, B], whole numbers with 1 <= W <= 65535 and E, B <= 65535",
        ));
    }
    Ok(braid_proto::errctl::Tolerance {
        w: tol[0] as u16,
        e: tol[1] as u16,
        b: tol[2] as u16,
    })
}

fn ms(x: f64) -> Nanos {
    (x * 1e6).round().max(0.0) as Nanos
}

fn parse_channel(c: &Tab) -> Result<ChannelSpec, ScenarioError> {
    c.check_keys(&[
        "rate_mbps",
        "delay_ms",
        "jitter_ms",
        "mtu",
        "queue_packets",
        "overhead_bytes",
        "loss",
        "corrupt",
        "gilbert",
        "loss_window",
        "down",
        "change",
    ])?;
    let mut s = ChannelSpec::new(
        c.f64_req(
            "rate_mbps",
            "a rate in Mbit/s from 0.001 to 10000000",
            rate_mbps,
        )? * 1e6,
    );
    s.delay = ms(c.f64_or("delay_ms", 0.0, "a delay in ms from 0 to 1e9", time_ms)?);
    s.jitter = ms(c.f64_or("jitter_ms", 0.0, "a jitter in ms from 0 to 1e9", time_ms)?);
    s.mtu = c.u32_in(
        "mtu",
        Some(65_535),
        1,
        u32::MAX,
        "a whole number of bytes >= 1",
    )?;
    s.queue_packets = c.u32_in(
        "queue_packets",
        Some(64),
        1,
        1 << 24,
        "a whole number of packets from 1 to 16777216",
    )? as usize;
    s.overhead_bytes = c.u32_in(
        "overhead_bytes",
        Some(0),
        0,
        1 << 20,
        "a whole number of bytes >= 0",
    )?;
    s.loss = c.f64_or("loss", 0.0, "a probability from 0 to 1", probability)?;
    s.corrupt = c.f64_or("corrupt", 0.0, "a probability from 0 to 1", probability)?;
    if let Some(g) = c.table("gilbert")? {
        s.gilbert = Some(parse_gilbert(&g)?);
    }
    s.loss_windows = parse_loss_windows(c)?;
    s.down = parse_down(c)?;
    s.changes = parse_changes(c)?;
    Ok(s)
}

/// `[channel.gilbert]`: bursty loss, a two-state Gilbert-Elliott chain.
fn parse_gilbert(g: &Tab) -> Result<Gilbert, ScenarioError> {
    g.check_keys(&["p_bad", "p_good", "good_ms", "bad_ms", "durations"])?;
    let durations = match g.str_opt("durations")?.unwrap_or("exponential") {
        "exponential" => Durations::Exponential,
        "deterministic" => Durations::Deterministic,
        other => {
            return Err(g.err(
                "durations",
                &format!("expected \"exponential\" or \"deterministic\", found \"{other}\""),
            ))
        }
    };
    Ok(Gilbert {
        p_bad: g.f64_req("p_bad", "a probability from 0 to 1", probability)?,
        p_good: g.f64_or("p_good", 0.0, "a probability from 0 to 1", probability)?,
        good_ns: g.f64_req(
            "good_ms",
            "a mean duration in ms > 0 (at most 1e9)",
            pos_time_ms,
        )? * 1e6,
        bad_ns: g.f64_req(
            "bad_ms",
            "a mean duration in ms > 0 (at most 1e9)",
            pos_time_ms,
        )? * 1e6,
        durations,
    })
}

/// `[[channel.loss_window]]`: a loss rate between two times.
fn parse_loss_windows(c: &Tab) -> Result<Vec<LossWindow>, ScenarioError> {
    let mut windows = Vec::new();
    for w in c.tabs("loss_window")? {
        w.check_keys(&["start_s", "end_s", "loss"])?;
        let start = w.f64_req("start_s", "a time in seconds from 0 to 1000000", time_s)?;
        let end = w.f64_req("end_s", "a time in seconds from 0 to 1000000", time_s)?;
        if end <= start {
            return Err(w.err(
                "end_s",
                &format!("expected a time after start_s ({start}), found {end}"),
            ));
        }
        windows.push(LossWindow {
            start: secs_to_ns(start),
            end: secs_to_ns(end),
            loss: w.f64_or("loss", 1.0, "a probability from 0 to 1", probability)?,
        });
    }
    Ok(windows)
}

/// `[[channel.down]]`: periods in which the channel carries nothing.
fn parse_down(c: &Tab) -> Result<Vec<(Nanos, Nanos)>, ScenarioError> {
    let mut down = Vec::new();
    for d in c.tabs("down")? {
        d.check_keys(&["start_s", "end_s"])?;
        let start = d.f64_req("start_s", "a time in seconds from 0 to 1000000", time_s)?;
        let end = d.f64_req("end_s", "a time in seconds from 0 to 1000000", time_s)?;
        if end <= start {
            return Err(d.err(
                "end_s",
                &format!("expected a time after start_s ({start}), found {end}"),
            ));
        }
        down.push((secs_to_ns(start), secs_to_ns(end)));
    }
    Ok(down)
}

/// `[[channel.change]]`: a new rate and/or delay from a time on, in time order.
fn parse_changes(c: &Tab) -> Result<Vec<LinkChange>, ScenarioError> {
    let mut changes: Vec<LinkChange> = Vec::new();
    for ch in c.tabs("change")? {
        ch.check_keys(&["at_s", "rate_mbps", "delay_ms"])?;
        let at = ch.f64_req("at_s", "a time in seconds from 0 to 1000000", time_s)?;
        let rate = ch
            .num_opt("rate_mbps", "a rate in Mbit/s from 0.001 to 10000000")?
            .map(|_| {
                ch.f64_req(
                    "rate_mbps",
                    "a rate in Mbit/s from 0.001 to 10000000",
                    rate_mbps,
                )
            })
            .transpose()?;
        let delay = ch
            .num_opt("delay_ms", "a delay in ms from 0 to 1e9")?
            .map(|_| ch.f64_req("delay_ms", "a delay in ms from 0 to 1e9", time_ms))
            .transpose()?;
        if rate.is_none() && delay.is_none() {
            return Err(ch.err("at_s", "a change needs rate_mbps or delay_ms (or both)"));
        }
        let at = secs_to_ns(at);
        if changes.last().is_some_and(|l| l.at > at) {
            return Err(ch.err("at_s", "changes must be in time order"));
        }
        changes.push(LinkChange {
            at,
            rate_bps: rate.map(|r| r * 1e6),
            delay: delay.map(ms),
        });
    }
    Ok(changes)
}

/// `[traffic]` keys that only the `tcp` source takes.
const TCP_KEYS: &[&str] = &[
    "cc",
    "header_bytes",
    "ack_delay_ms",
    "ack_slowest_for_ms",
    "rwnd_packets",
    "init_cwnd",
    "min_rto_ms",
    "hystart",
    "ecn",
];

/// `ack_delay_ms` of the tcp source: milliseconds, "fastest" (default) or "slowest".
fn parse_ack_delay(tr: &Tab) -> Result<crate::tcp::AckDelay, ScenarioError> {
    use crate::tcp::AckDelay;
    Ok(match tr.t.get("ack_delay_ms") {
        None => AckDelay::Fastest,
        Some(Value::String(v)) if v == "fastest" => AckDelay::Fastest,
        Some(Value::String(v)) if v == "slowest" => AckDelay::Slowest,
        Some(Value::String(v)) => {
            return Err(tr.err(
                "ack_delay_ms",
                &format!("expected milliseconds >= 0, \"fastest\" or \"slowest\", found \"{v}\""),
            ))
        }
        Some(_) => AckDelay::Fixed(ms(tr.f64_req(
            "ack_delay_ms",
            "milliseconds from 0 to 1e9, \"fastest\" or \"slowest\"",
            time_ms,
        )?)),
    })
}

/// The `tcp` source's keys (`crate::tcp`).
fn parse_tcp(tr: &Tab) -> Result<crate::tcp::TcpSpec, ScenarioError> {
    use crate::tcp::{Cc, TcpSpec};
    let d = TcpSpec::default();
    let cc = match tr.str_opt("cc")? {
        None | Some("cubic") => Cc::Cubic,
        Some("reno") => Cc::Reno,
        Some(o) => {
            return Err(tr.err(
                "cc",
                &format!("unknown congestion control \"{o}\"; expected \"cubic\" or \"reno\""),
            ))
        }
    };
    let header_bytes = tr.u32_in(
        "header_bytes",
        Some(d.header_bytes),
        0,
        65_535,
        "a whole number of bytes from 0 to 65535",
    )?;
    let ack_delay = parse_ack_delay(tr)?;
    let rwnd = tr.u32_in(
        "rwnd_packets",
        Some(d.rwnd),
        1,
        1 << 24,
        "a whole number of segments from 1 to 16777216",
    )?;
    let init_cwnd = tr.u32_in(
        "init_cwnd",
        Some(d.init_cwnd),
        1,
        1 << 16,
        "a whole number of segments from 1 to 65536",
    )?;
    let min_rto = ms(tr.f64_or(
        "min_rto_ms",
        200.0,
        "a number of milliseconds > 0 (at most 1e9)",
        pos_time_ms,
    )?);
    let ack_slowest_for = ms(tr.f64_or(
        "ack_slowest_for_ms",
        0.0,
        "milliseconds from 0 to 1e9",
        time_ms,
    )?);
    Ok(TcpSpec {
        cc,
        header_bytes,
        ack_delay,
        ack_slowest_for,
        rwnd,
        init_cwnd,
        min_rto,
        hystart: tr.bool_or("hystart", d.hystart)?,
        ecn: tr.bool_or("ecn", d.ecn)?,
    })
}

fn parse_traffic(t: &Tab) -> Result<TrafficSpec, ScenarioError> {
    let Some(tr) = t.table("traffic")? else {
        return Err(t.err(
            "traffic",
            "missing; expected a [traffic] table (source and sizes)",
        ));
    };
    tr.check_keys(
        &[
            "source",
            "rate_mbps",
            "pps",
            "file",
            "sizes",
            "bytes",
            "min",
            "max",
            "small",
            "large",
            "p_small",
            "mix",
            "start_s",
        ]
        .iter()
        .chain(TCP_KEYS)
        .copied()
        .collect::<Vec<_>>(),
    )?;
    let source = tr.str_opt("source")?.unwrap_or("backlogged");
    if source != "tcp" {
        for k in TCP_KEYS {
            if tr.t.contains_key(*k) {
                return Err(tr.err(
                    k,
                    &format!("only for source \"tcp\" (the source is \"{source}\")"),
                ));
            }
        }
    }
    let arrivals = parse_arrivals(t, &tr, source)?;
    let sizes = parse_sizes(&tr, source)?;
    let start = tr.f64_or(
        "start_s",
        0.0,
        "a time in seconds from 0 to 1000000",
        time_s,
    )?;
    Ok(TrafficSpec {
        arrivals,
        sizes,
        start: secs_to_ns(start),
    })
}

/// `traffic.source` and its keys: when packets arrive.
fn parse_arrivals(t: &Tab, tr: &Tab, source: &str) -> Result<Arrivals, ScenarioError> {
    Ok(match source {
        "backlogged" => Arrivals::Backlogged,
        "cbr" => Arrivals::Cbr(parse_rate(tr, source)?),
        "poisson" => Arrivals::Poisson(parse_rate(tr, source)?),
        "trace" => Arrivals::Trace(load_trace(t, tr)?),
        "tcp" => Arrivals::Tcp(parse_tcp(tr)?),
        other => {
            return Err(tr.err(
                "source",
                &format!(
                    "unknown source \"{other}\"; expected backlogged, cbr, poisson, trace or tcp"
                ),
            ))
        }
    })
}

/// `rate_mbps` or `pps` (one of them) of a cbr or poisson source.
fn parse_rate(tr: &Tab, source: &str) -> Result<Rate, ScenarioError> {
    match (tr.t.contains_key("rate_mbps"), tr.t.contains_key("pps")) {
        (true, false) => Ok(Rate::Bits(
            tr.f64_req(
                "rate_mbps",
                "a rate in Mbit/s from 0.001 to 10000000",
                rate_mbps,
            )? * 1e6,
        )),
        (false, true) => Ok(Rate::Pps(tr.f64_req(
            "pps",
            "a packet rate from 0.001 to 1e9 per second",
            |x| (1e-3..=1e9).contains(&x),
        )?)),
        (true, true) => Err(tr.err("pps", "give either `rate_mbps` or `pps`, not both")),
        (false, false) => Err(tr.err(
            "rate_mbps",
            &format!(
                "missing; source \"{source}\" needs `rate_mbps` (Mbit/s) or `pps` (packets/s)"
            ),
        )),
    }
}

/// `traffic.file` of a trace source, read once per scenario file (cached).
fn load_trace(t: &Tab, tr: &Tab) -> Result<Vec<(Nanos, u32)>, ScenarioError> {
    let f = tr.str_opt("file")?.ok_or_else(|| {
        tr.err(
            "file",
            "missing; source \"trace\" needs `file`, a CSV of time_s,size_bytes",
        )
    })?;
    let path = t.cx.dir.join(f);
    let mut cache = t.cx.traces.borrow_mut();
    let entries = match cache.get(&path) {
        Some(e) => e.clone(),
        None => {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| tr.err("file", &format!("cannot read {}: {e}", path.display())))?;
            let e = parse_trace(&text)
                .map_err(|m| tr.err("file", &format!("{}: {m}", path.display())))?;
            cache.insert(path.clone(), e.clone());
            e
        }
    };
    Ok(entries)
}

/// `traffic.sizes` and its keys: the packets' sizes.
fn parse_sizes(tr: &Tab, source: &str) -> Result<Sizes, ScenarioError> {
    let one = |k: &str| tr.u32_in(k, None, 1, u32::MAX, SIZE_WHAT);
    let kind = tr.str_opt("sizes")?.unwrap_or("fixed");
    if source == "tcp" && kind != "fixed" {
        return Err(tr.err(
            "sizes",
            &format!(
                "source \"tcp\" sends segments of one size: expected \"fixed\", found \"{kind}\""
            ),
        ));
    }
    Ok(match kind {
        "fixed" => Sizes::Fixed(match tr.t.get("bytes") {
            None if source == "tcp" => 1448,
            None => 1000,
            Some(_) => one("bytes")?,
        }),
        "alternating" => Sizes::Cycle(parse_alternating(tr)?),
        "uniform" => {
            let min = one("min")?;
            let max = one("max")?;
            if max < min {
                return Err(tr.err("max", &format!("expected a size >= min ({min}), found {max}")));
            }
            Sizes::Uniform { min, max }
        }
        "bimodal" => Sizes::Bimodal {
            small: one("small")?,
            large: one("large")?,
            p_small: tr.f64_or("p_small", 0.5, "a probability from 0 to 1", probability)?,
        },
        "imix" => Sizes::imix(),
        "mix" => Sizes::Mix(parse_mix(tr)?),
        other => return Err(tr.err("sizes", &format!("unknown size distribution \"{other}\"; expected fixed, alternating, uniform, bimodal, imix or mix"))),
    })
}

/// What a packet size must be, for errors.
const SIZE_WHAT: &str = "a whole number of bytes";

/// `bytes` of sizes "alternating": a non-empty list of sizes, cycled through.
fn parse_alternating(tr: &Tab) -> Result<Vec<u32>, ScenarioError> {
    let v = tr.num_list("bytes", SIZE_WHAT)?.ok_or_else(|| {
        tr.err(
            "bytes",
            "missing; sizes \"alternating\" needs `bytes`, a list such as [1000, 200]",
        )
    })?;
    if v.is_empty() {
        return Err(tr.err("bytes", "expected a non-empty list of sizes"));
    }
    whole_numbers(tr, "bytes", SIZE_WHAT, &v)
}

/// `mix` of sizes "mix": [size_bytes, weight] pairs, at least one.
fn parse_mix(tr: &Tab) -> Result<Vec<(u32, f64)>, ScenarioError> {
    let Some(v) = tr.t.get("mix") else {
        return Err(tr.err(
            "mix",
            "missing; sizes \"mix\" needs `mix`, a list of [size_bytes, weight] pairs",
        ));
    };
    let Value::Array(a) = v else {
        return Err(tr.expected("mix", "a list of [size_bytes, weight] pairs", v));
    };
    let mut out = Vec::new();
    for (i, e) in a.iter().enumerate() {
        let pair = match e {
            Value::Array(p) if p.len() == 2 => p,
            e => {
                return Err(tr.err(
                    &format!("mix[{i}]"),
                    &format!(
                        "expected a pair [size_bytes, weight], found {}",
                        describe(e)
                    ),
                ))
            }
        };
        let size = match &pair[0] {
            Value::Integer(s) if *s >= 1 && *s <= i64::from(u32::MAX) => *s as u32,
            v => {
                return Err(tr.err(
                    &format!("mix[{i}][0]"),
                    &format!("expected {SIZE_WHAT}, found {}", describe(v)),
                ))
            }
        };
        let w = match &pair[1] {
            Value::Integer(w) if *w > 0 => *w as f64,
            Value::Float(w) if *w > 0.0 && w.is_finite() => *w,
            v => {
                return Err(tr.err(
                    &format!("mix[{i}][1]"),
                    &format!("expected a weight > 0, found {}", describe(v)),
                ))
            }
        };
        out.push((size, w));
    }
    if out.is_empty() {
        return Err(tr.err("mix", "expected at least one [size_bytes, weight] pair"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(
            parse_path("channel.1.rate_mbps").unwrap(),
            vec![
                Seg::Key("channel".into()),
                Seg::Index(1),
                Seg::Key("rate_mbps".into())
            ]
        );
        assert_eq!(
            parse_path("channel[1].loss_window[0].loss").unwrap(),
            vec![
                Seg::Key("channel".into()),
                Seg::Index(1),
                Seg::Key("loss_window".into()),
                Seg::Index(0),
                Seg::Key("loss".into())
            ]
        );
        assert!(parse_path("").is_err());
        assert!(parse_path("1.x").is_err());
        assert!(parse_path("a[x]").is_err());
        assert!(parse_path("a b").is_err());
    }

    #[test]
    fn set_path_creates_tables_and_checks_indices() {
        let mut t: Table = toml::from_str("[[channel]]\nrate_mbps = 1\n").unwrap();
        set_path(&mut t, "markers.every_rounds", Value::Integer(3)).unwrap();
        assert_eq!(t["markers"]["every_rounds"].as_integer(), Some(3));
        set_path(&mut t, "channel.0.rate_mbps", Value::Float(2.5)).unwrap();
        assert_eq!(t["channel"][0]["rate_mbps"].as_float(), Some(2.5));
        let e = set_path(&mut t, "channel.3.rate_mbps", Value::Float(1.0)).unwrap_err();
        assert!(e.contains("out of range"), "{e}");
        // The tree survives an error.
        assert_eq!(t["channel"][0]["rate_mbps"].as_float(), Some(2.5));
    }
}
