//! The short chaos run (`scripts/chaos.py`, issue 26): in every mode, a checksum-verified
//! TCP transfer and pings both ways through `braid tunnel` between two namespaces over
//! three links, while a seeded schedule takes links down (by interface, address or
//! firewall, one or all, at either end), changes rates, adds loss and restarts either
//! end. Each mode must deliver every byte intact, answer pings both ways within 1 s of
//! each change being undone, never stall over 1 s with a path up, and keep its memory.
//! The long run is the same script with `--duration 600` (docs/tunnel.md).

use std::path::Path;
use std::process::Command;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_braid");

#[test]
fn tunnel_recovers_from_a_seeded_chaos_schedule_in_every_mode() {
    if let Some(why) = common::lab_skip_reason() {
        common::skip(
            "tunnel_recovers_from_a_seeded_chaos_schedule_in_every_mode",
            &why,
        );
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/chaos.py");
    let out = Command::new("python3")
        .arg(&script)
        .args([
            "--braid",
            BIN,
            "--duration",
            "30",
            "--modes",
            "logical,seq,trr",
            // Every change but a restart: the transfer crosses as a stream, the
            // tunnel's default (a restart would reset it, by design).
            "--kinds",
            "link,all,addr,rate,drop,loss",
        ])
        .output()
        .expect("run scripts/chaos.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "chaos run failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let modes: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per mode"))
        .collect();
    assert_eq!(modes.len(), 3, "{stdout}");
    for m in &modes {
        assert_eq!(m["pass"], true, "{m}");
        assert_eq!(m["checksum_match"], true, "{m}");
        assert!(m["bytes_received"].as_u64().unwrap() > 1_000_000, "{m}");
    }
}
