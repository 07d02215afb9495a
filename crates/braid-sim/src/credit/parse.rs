//! Credit scenario files (`kind = "credit"`); keys in `docs/scenarios.md`.

use std::path::Path;

use braid_proto::credit::{Allocation, CreditReceiver, N2Policy, ReceiverConfig};
use braid_proto::Duration;
use toml::{Table, Value};

use super::{Control, CreditRun, CreditScenario, UnitSpec};
use crate::scenario::ScenarioError;
use crate::toml_cx::{err, Cx};

const TOP_KEYS: &[&str] = &[
    "kind",
    "name",
    "description",
    "seed",
    "slots",
    "rtt",
    "interval",
    "check_interval",
    "memory",
    "pool",
    "control",
    "data_loss",
    "credit_loss",
    "allocation",
    "unit",
    "run",
];
const RUN_KEYS: &[&str] = &[
    "label",
    "slots",
    "rtt",
    "interval",
    "check_interval",
    "memory",
    "pool",
    "control",
    "data_loss",
    "credit_loss",
    "allocation",
];
const ALLOC_KEYS: &[&str] = &[
    "mode",
    "n2",
    "n3",
    "n2_percent",
    "n2_max",
    "min",
    "max",
    "smoothing_percent",
];
const UNIT_KEYS: &[&str] = &["load", "burst", "downstream", "count"];

/// Load a credit scenario file.
pub fn load(path: &Path) -> Result<CreditScenario, ScenarioError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| err(&file, None, &e.to_string()))?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "credit".into());
    parse(&text, &file, &stem)
}

/// Parse credit scenario text; `file` names it in errors.
pub fn parse(text: &str, file: &str, stem: &str) -> Result<CreditScenario, ScenarioError> {
    let root: Table =
        toml::from_str(text).map_err(|e| err(file, None, &format!("not valid TOML: {e}")))?;
    let cx = Cx {
        file,
        at: String::new(),
    };
    cx.check(&root, TOP_KEYS)?;
    if root.get("kind").and_then(Value::as_str) != Some("credit") {
        return Err(cx.e("kind", "expected \"credit\""));
    }
    let name = root
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or(stem)
        .to_string();
    let description = root
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let seed = cx.int(&root, "seed", Some(1), 0, u64::MAX >> 11)?;
    let units = parse_units(&cx, &root)?;
    let runs_spec = match root.get("run") {
        None => vec![Table::new()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_table()
                    .cloned()
                    .ok_or_else(|| cx.e("run", "expected [[run]] tables"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(cx.e("run", "expected [[run]] tables")),
    };
    let mut runs = Vec::new();
    for (i, over) in runs_spec.iter().enumerate() {
        let rcx = Cx {
            file,
            at: format!("run[{i}]."),
        };
        rcx.check(over, RUN_KEYS)?;
        let merged = merge(&root, over);
        let label = over
            .get("label")
            .and_then(Value::as_str)
            .unwrap_or(&name)
            .to_string();
        runs.push(parse_run(&rcx, &merged, label, units.clone())?);
    }
    Ok(CreditScenario {
        name,
        description,
        seed,
        runs,
    })
}

/// The top level with a run's keys put over it (tables merged one level deep).
fn merge(root: &Table, over: &Table) -> Table {
    let mut t = root.clone();
    for (k, v) in over {
        match (t.get_mut(k), v) {
            (Some(Value::Table(base)), Value::Table(o)) => {
                for (kk, vv) in o {
                    base.insert(kk.clone(), vv.clone());
                }
            }
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
    t
}

fn parse_units(cx: &Cx, root: &Table) -> Result<Vec<UnitSpec>, ScenarioError> {
    let Some(Value::Array(list)) = root.get("unit") else {
        return Err(cx.e("unit", "expected at least one [[unit]] table"));
    };
    let mut units = Vec::new();
    for (i, v) in list.iter().enumerate() {
        let ucx = Cx {
            file: cx.file,
            at: format!("unit[{i}]."),
        };
        let t = v
            .as_table()
            .ok_or_else(|| cx.e("unit", "expected [[unit]] tables"))?;
        ucx.check(t, UNIT_KEYS)?;
        let load = match t.get("load") {
            Some(Value::Array(a)) => a
                .iter()
                .map(|p| match p.as_array().map(|x| x.as_slice()) {
                    Some([s, l]) => Some((
                        s.as_integer()? as u64,
                        l.as_float().or(l.as_integer().map(|i| i as f64))?,
                    )),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()
                .filter(|v| {
                    v.windows(2).all(|w| w[0].0 < w[1].0)
                        && v.iter().all(|p| (0.0..=1.0).contains(&p.1))
                })
                .ok_or_else(|| {
                    ucx.e(
                        "load",
                        "expected [[slot, load], ...] with slots increasing and loads in 0..=1",
                    )
                })?,
            _ => vec![(0, ucx.num(t, "load", None, 0.0, 1.0)?)],
        };
        let spec = UnitSpec {
            load,
            burst: ucx.int(t, "burst", Some(0), 0, 1 << 20)? as u32,
            downstream: ucx.num(t, "downstream", Some(1.0), 0.0, 1.0)?,
        };
        let count = ucx.int(t, "count", Some(1), 1, 10_000)?;
        units.extend(std::iter::repeat_n(spec, count as usize));
    }
    Ok(units)
}

fn parse_run(
    cx: &Cx,
    t: &Table,
    label: String,
    units: Vec<UnitSpec>,
) -> Result<CreditRun, ScenarioError> {
    let rtt = cx.int(t, "rtt", None, 2, 1 << 30)?;
    let interval = cx.int(t, "interval", Some(rtt), 1, 1 << 30)?;
    let control = match t.get("control").and_then(Value::as_str).unwrap_or("credit") {
        "none" => Control::None,
        "credit" => Control::Credit(parse_allocation(cx, t, interval)?),
        other => {
            return Err(cx.e(
                "control",
                &format!("expected \"credit\" or \"none\", found {other:?}"),
            ))
        }
    };
    let pool = match control {
        Control::Credit(Allocation::Static { n2, n3 }) if !t.contains_key("pool") => {
            (n2 + n3) * units.len() as u32
        }
        _ => cx.int(t, "pool", None, 2, 1 << 24)? as u32,
    };
    let run = CreditRun {
        label,
        slots: cx.int(t, "slots", None, 1, 1 << 32)?,
        rtt,
        interval,
        check_interval: cx.int(t, "check_interval", Some(2 * rtt), 1, 1 << 30)?,
        memory: cx.int(t, "memory", Some(pool as u64), 1, 1 << 32)?,
        pool,
        control,
        data_loss: cx.num(t, "data_loss", Some(0.0), 0.0, 1.0)?,
        credit_loss: cx.num(t, "credit_loss", Some(0.0), 0.0, 1.0)?,
        units,
    };
    if let Control::Credit(a) = control {
        let initial = match a {
            Allocation::Static { n2, n3 } => n2 + n3,
            Allocation::Adaptive { .. } => (pool / run.units.len() as u32).max(2),
        };
        let cfg = ReceiverConfig {
            pool,
            initial_allocation: initial,
            allocation: a,
            counter_origin: 0,
        };
        CreditReceiver::new(run.units.len(), cfg)
            .map_err(|e| cx.e("allocation", &e.to_string()))?;
    }
    Ok(run)
}

fn parse_allocation(cx: &Cx, t: &Table, interval: u64) -> Result<Allocation, ScenarioError> {
    let empty = Table::new();
    let a = match t.get("allocation") {
        Some(Value::Table(a)) => a,
        None => &empty,
        Some(_) => return Err(cx.e("allocation", "expected a table")),
    };
    let acx = Cx {
        file: cx.file,
        at: format!("{}allocation.", cx.at),
    };
    acx.check(a, ALLOC_KEYS)?;
    let big = 1 << 24;
    match a.get("mode").and_then(Value::as_str).unwrap_or("static") {
        "static" => Ok(Allocation::Static {
            n2: acx.int(a, "n2", Some(10), 1, big)? as u32,
            n3: acx.int(a, "n3", None, 1, big)? as u32,
        }),
        "adaptive" => {
            let n2 = match a.get("n2_percent") {
                Some(_) => N2Policy::Fraction {
                    percent: acx.int(a, "n2_percent", None, 1, 100)? as u32,
                    max: acx.int(a, "n2_max", Some(big), 1, big)? as u32,
                },
                None => N2Policy::Fixed(acx.int(a, "n2", Some(1), 1, big)? as u32),
            };
            Ok(Allocation::Adaptive {
                interval: Duration::from_micros(interval),
                min: acx.int(a, "min", Some(2), 2, big)? as u32,
                max: acx.int(a, "max", Some(big), 2, big)? as u32,
                n2,
                smoothing_percent: acx.int(a, "smoothing_percent", Some(100), 1, 100)? as u32,
            })
        }
        other => Err(acx.e(
            "mode",
            &format!("expected \"static\" or \"adaptive\", found {other:?}"),
        )),
    }
}
