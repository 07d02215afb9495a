//! The Grafana dashboard in contrib/grafana/braid.json asks only for metrics braid
//! exports: every `braid_*` name in its queries is in the Prometheus text of a snapshot
//! with a channel, so a renamed metric cannot leave the dashboard blank unnoticed.

use std::path::Path;

#[test]
fn the_grafana_dashboard_queries_metrics_braid_exports() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/grafana/braid.json");
    let d: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).expect("valid JSON");
    let stats = braid_io::SessionStats {
        channels: vec![braid_io::ChannelSnapshot {
            name: "wan0".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let text = stats.prometheus();
    let exported: std::collections::HashSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let panels = d["panels"].as_array().expect("panels");
    assert!(panels.len() >= 6);
    let mut names = 0;
    for p in panels {
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{}", p["title"]);
        for t in targets {
            let expr = t["expr"].as_str().unwrap();
            let mut rest = expr;
            while let Some(i) = rest.find("braid_") {
                let name: String = rest[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                assert!(
                    exported.contains(name.as_str()),
                    "{name} (in {expr}) is not exported"
                );
                names += 1;
                rest = &rest[i + name.len()..];
            }
        }
    }
    assert!(names >= 10, "{names}");
    // Per channel: rate, RTT, loss, weight and state.
    for m in [
        "braid_channel_tx_bytes_per_second",
        "braid_channel_srtt_seconds",
        "braid_channel_loss_ratio",
        "braid_channel_weight_bytes",
        "braid_channel_up",
    ] {
        assert!(d.to_string().contains(m), "{m}");
    }
}
