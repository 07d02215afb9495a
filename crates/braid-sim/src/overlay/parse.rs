//! Overlay scenario files (`kind = "overlay"`); keys in `docs/scenarios.md`.

use std::path::Path;

use braid_proto::overlay::Metric;
use toml::{Table, Value};

use super::{Control, Event, EventKind, FlowSpec, GainSpec, Link, OverlayScenario};
use crate::scenario::ScenarioError;
use crate::toml_cx::{err, Cx};

const TOP_KEYS: &[&str] = &[
    "kind",
    "name",
    "description",
    "seed",
    "nodes",
    "metric",
    "packet_bytes",
    "relay_delay_ms",
    "egress_mbps",
    "ingress_mbps",
    "link",
    "gain",
    "flow",
    "control",
    "event",
];
const LINK_KEYS: &[&str] = &["from", "to", "mbps", "delay_ms", "loss", "reverse_mbps"];
const GAIN_KEYS: &[&str] = &["rounds", "flow_s", "variation_percent", "noise_percent"];
const FLOW_KEYS: &[&str] = &["src", "dst", "start_s", "end_s", "max_paths"];
const CONTROL_KEYS: &[&str] = &[
    "slot_ms",
    "probe_ms",
    "ping_ms",
    "update_ms",
    "eval_ms",
    "dead_after_ms",
    "threshold_percent",
    "consecutive",
    "noise_percent",
];
const EVENT_KEYS: &[&str] = &["at_s", "kill", "revive", "from", "to", "mbps", "loss"];

/// Most nodes in an overlay scenario.
pub const MAX_NODES: usize = 32;

/// Load an overlay scenario file.
pub fn load(path: &Path) -> Result<OverlayScenario, ScenarioError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| err(&file, None, &e.to_string()))?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "overlay".into());
    parse(&text, &file, &stem)
}

/// Parse overlay scenario text; `file` names it in errors.
pub fn parse(text: &str, file: &str, stem: &str) -> Result<OverlayScenario, ScenarioError> {
    let root: Table =
        toml::from_str(text).map_err(|e| err(file, None, &format!("not valid TOML: {e}")))?;
    let cx = Cx {
        file,
        at: String::new(),
    };
    cx.check(&root, TOP_KEYS)?;
    if cx.string(&root, "kind")? != Some("overlay") {
        return Err(cx.e("kind", "expected \"overlay\""));
    }
    let name = cx.string(&root, "name")?.unwrap_or(stem).to_string();
    let description = cx.string(&root, "description")?.unwrap_or("").to_string();
    let seed = cx.int(&root, "seed", Some(1), 0, u64::MAX >> 11)?;

    let nodes = parse_nodes(&cx, &root)?;

    let metric = match cx.string(&root, "metric")? {
        None => Metric::Throughput,
        Some(s) => Metric::from_name(s)
            .ok_or_else(|| cx.e("metric", "expected \"throughput\", \"delay\" or \"loss\""))?,
    };
    let packet_bytes = cx.int(&root, "packet_bytes", Some(1400), 64, 9000)? as u32;
    let relay_delay_ms = cx.num(&root, "relay_delay_ms", Some(0.0), 0.0, 1000.0)?;
    let egress_bps = parse_caps(&cx, &root, "egress_mbps", &nodes)?;
    let ingress_bps = parse_caps(&cx, &root, "ingress_mbps", &nodes)?;
    let links = parse_links(&cx, &root, &nodes)?;
    let gain = parse_gain(&cx, &root)?;
    let control = parse_control(&cx, &root)?;
    let flow = parse_flow(&cx, &root, &nodes)?;
    if gain.is_none() && flow.is_none() {
        return Err(cx.e(
            "gain",
            "nothing to run: give a [gain] table (every pair, best 2 and 3 paths) or a [flow] table (one flow over time), or both",
        ));
    }

    let events = parse_events(&cx, &root, &nodes, flow.is_some())?;

    Ok(OverlayScenario {
        name,
        description,
        seed,
        nodes,
        links,
        egress_bps,
        ingress_bps,
        metric,
        packet_bytes,
        relay_delay_ms,
        gain,
        flow,
        control,
        events,
    })
}

/// `nodes`: 3 to `MAX_NODES` distinct, non-empty names.
fn parse_nodes(cx: &Cx, root: &Table) -> Result<Vec<String>, ScenarioError> {
    let nodes: Vec<String> = match root.get("nodes") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| cx.e("nodes", "expected a list of node names (strings)"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(cx.e("nodes", "expected a list of node names (strings)")),
        None => return Err(cx.e("nodes", "required: the list of node names")),
    };
    if nodes.len() < 3 || nodes.len() > MAX_NODES {
        return Err(cx.e(
            "nodes",
            &format!(
                "expected 3 to {MAX_NODES} nodes (a relay needs a third), found {}",
                nodes.len()
            ),
        ));
    }
    for (i, n) in nodes.iter().enumerate() {
        if n.is_empty() || nodes[..i].contains(n) {
            return Err(cx.e(
                "nodes",
                &format!("node names must be non-empty and distinct: \"{n}\""),
            ));
        }
    }
    Ok(nodes)
}

/// `egress_mbps` or `ingress_mbps`: a cap per named node (in bit/s; infinite when not named).
fn parse_caps(
    cx: &Cx,
    root: &Table,
    key: &str,
    nodes: &[String],
) -> Result<Vec<f64>, ScenarioError> {
    let mut v = vec![f64::INFINITY; nodes.len()];
    if let Some(t) = cx.table(root, key)? {
        let c = cx.sub(&format!("{key}."));
        for (k, _) in t.iter() {
            let i = nodes.iter().position(|x| x == k).ok_or_else(|| {
                c.e(
                    k,
                    &format!("unknown node; the nodes are: {}", nodes.join(", ")),
                )
            })?;
            v[i] = c.num(t, k, None, 0.001, 1e6)? * 1e6;
        }
    }
    Ok(v)
}

/// `[[link]]`: one per ordered pair of nodes (a full mesh), `reverse_mbps` giving the
/// way back.
fn parse_links(
    cx: &Cx,
    root: &Table,
    nodes: &[String],
) -> Result<Vec<Option<Link>>, ScenarioError> {
    let n = nodes.len();
    let mut links: Vec<Option<Link>> = vec![None; n * n];
    for (i, lt) in cx.tables(root, "link")?.into_iter().enumerate() {
        let c = cx.sub(&format!("link[{i}]."));
        c.check(lt, LINK_KEYS)?;
        let from = c.node(lt, "from", nodes)?;
        let to = c.node(lt, "to", nodes)?;
        if from == to {
            return Err(c.e("to", "a link from a node to itself"));
        }
        let mbps = c.num(lt, "mbps", None, 0.001, 1e6)?;
        let delay_ms = c.num(lt, "delay_ms", None, 0.0, 10_000.0)?;
        let loss = c.num(lt, "loss", Some(0.0), 0.0, 0.5)?;
        let mut put = |a: usize, b: usize, mbps: f64| {
            if links[a * n + b].is_some() {
                return Err(c.e(
                    "from",
                    &format!("a second link {} -> {}", nodes[a], nodes[b]),
                ));
            }
            links[a * n + b] = Some(Link {
                mbps,
                delay_ms,
                loss,
            });
            Ok(())
        };
        put(from, to, mbps)?;
        if lt.contains_key("reverse_mbps") {
            let back = c.num(lt, "reverse_mbps", None, 0.001, 1e6)?;
            put(to, from, back)?;
        }
    }
    let mut missing = Vec::new();
    for a in 0..n {
        for b in 0..n {
            if a != b && links[a * n + b].is_none() {
                missing.push(format!("{} -> {}", nodes[a], nodes[b]));
            }
        }
    }
    if !missing.is_empty() {
        return Err(cx.e(
            "link",
            &format!(
                "every ordered pair of nodes needs a link (the overlay is a full mesh of Internet paths); missing: {}",
                missing.join(", ")
            ),
        ));
    }
    Ok(links)
}

/// `[gain]`: every pair's gain from two and three paths.
fn parse_gain(cx: &Cx, root: &Table) -> Result<Option<GainSpec>, ScenarioError> {
    Ok(match cx.table(root, "gain")? {
        None => None,
        Some(t) => {
            let c = cx.sub("gain.");
            c.check(t, GAIN_KEYS)?;
            Some(GainSpec {
                rounds: c.int(t, "rounds", Some(5), 1, 1000)? as u32,
                flow_s: c.num(t, "flow_s", Some(2.0), 0.1, 600.0)?,
                variation: c.num(t, "variation_percent", Some(0.0), 0.0, 90.0)? / 100.0,
                noise: c.num(t, "noise_percent", Some(0.0), 0.0, 90.0)? / 100.0,
            })
        }
    })
}

/// `[control]`: the overlay's timers and rerouting threshold.
fn parse_control(cx: &Cx, root: &Table) -> Result<Control, ScenarioError> {
    Ok(match cx.table(root, "control")? {
        None => Control::default(),
        Some(t) => {
            let c = cx.sub("control.");
            c.check(t, CONTROL_KEYS)?;
            let d = Control::default();
            let ctl = Control {
                slot_ms: c.int(t, "slot_ms", Some(d.slot_ms), 1, 600_000)?,
                probe_ms: c.int(t, "probe_ms", Some(d.probe_ms), 1, 600_000)?,
                ping_ms: c.int(t, "ping_ms", Some(d.ping_ms), 1, 600_000)?,
                update_ms: c.int(t, "update_ms", Some(d.update_ms), 1, 600_000)?,
                eval_ms: c.int(t, "eval_ms", Some(d.eval_ms), 1, 600_000)?,
                dead_after_ms: c.int(t, "dead_after_ms", Some(d.dead_after_ms), 1, 600_000)?,
                threshold: c.num(
                    t,
                    "threshold_percent",
                    Some(d.threshold * 100.0),
                    0.0,
                    1000.0,
                )? / 100.0,
                consecutive: c.int(t, "consecutive", Some(d.consecutive as u64), 1, 1000)? as u32,
                noise: c.num(t, "noise_percent", Some(d.noise * 100.0), 0.0, 90.0)? / 100.0,
            };
            if ctl.probe_ms > ctl.slot_ms {
                return Err(c.e(
                    "probe_ms",
                    "a probe must fit in its slot (probe_ms <= slot_ms)",
                ));
            }
            ctl
        }
    })
}

/// `[flow]`: one flow over time.
fn parse_flow(cx: &Cx, root: &Table, nodes: &[String]) -> Result<Option<FlowSpec>, ScenarioError> {
    Ok(match cx.table(root, "flow")? {
        None => None,
        Some(t) => {
            let c = cx.sub("flow.");
            c.check(t, FLOW_KEYS)?;
            let src = c.node(t, "src", nodes)?;
            let dst = c.node(t, "dst", nodes)?;
            if src == dst {
                return Err(c.e("dst", "the flow's source and destination must differ"));
            }
            let start_s = c.num(t, "start_s", None, 0.0, 3600.0)?;
            let end_s = c.num(t, "end_s", None, 0.0, 3600.0)?;
            if end_s <= start_s {
                return Err(c.e("end_s", "must be after start_s"));
            }
            Some(FlowSpec {
                src,
                dst,
                start_s,
                end_s,
                max_paths: c.int(t, "max_paths", Some(3), 1, 3)? as usize,
            })
        }
    })
}

/// `[[event]]`: kills, revivals and link changes during a `[flow]` run, in time order.
fn parse_events(
    cx: &Cx,
    root: &Table,
    nodes: &[String],
    has_flow: bool,
) -> Result<Vec<Event>, ScenarioError> {
    let mut events = Vec::new();
    for (i, et) in cx.tables(root, "event")?.into_iter().enumerate() {
        let c = cx.sub(&format!("event[{i}]."));
        c.check(et, EVENT_KEYS)?;
        let at_s = c.num(et, "at_s", None, 0.0, 3600.0)?;
        let what = match (et.contains_key("kill"), et.contains_key("revive"), et.contains_key("from")) {
            (true, false, false) => EventKind::Kill(c.node(et, "kill", nodes)?),
            (false, true, false) => EventKind::Revive(c.node(et, "revive", nodes)?),
            (false, false, true) => {
                let from = c.node(et, "from", nodes)?;
                let to = c.node(et, "to", nodes)?;
                if from == to {
                    return Err(c.e("to", "a link from a node to itself"));
                }
                let mbps = et
                    .contains_key("mbps")
                    .then(|| c.num(et, "mbps", None, 0.001, 1e6))
                    .transpose()?;
                let loss = et
                    .contains_key("loss")
                    .then(|| c.num(et, "loss", None, 0.0, 0.5))
                    .transpose()?;
                if mbps.is_none() && loss.is_none() {
                    return Err(c.e("mbps", "a link event changes mbps, loss or both"));
                }
                EventKind::Link {
                    from,
                    to,
                    mbps,
                    loss,
                }
            }
            _ => {
                return Err(c.e(
                    "kill",
                    "an event is exactly one of: kill = \"node\", revive = \"node\", or from/to with mbps and/or loss",
                ))
            }
        };
        events.push(Event { at_s, what });
    }
    events.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    if !events.is_empty() && !has_flow {
        return Err(cx.e(
            "event",
            "events change the network during a [flow] run; add a [flow] table",
        ));
    }
    Ok(events)
}
