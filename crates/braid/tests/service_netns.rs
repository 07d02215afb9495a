//! `braid tunnel` as a systemd service would run it, on real sockets and TUN devices in
//! a network namespace: readiness (`READY=1` on the notification socket) only once the
//! peer answers, and SIGHUP (`systemctl reload`) re-reading the configuration: new
//! channel weights and log level applied to the running session, the rest named as
//! needing a restart, a broken file refused, the tunnel up throughout. Needs root,
//! /dev/net/tun, `ip` and bash; skips, saying why, without them.

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::{sh, status, write_private, Lab, BIN};

fn skip_reason() -> Option<String> {
    common::netns_skip_reason(
        "a network namespace and TUN devices",
        &[("ip", "iproute2"), ("bash", "bash")],
        None,
    )
}

/// One end: TUN `dev` with `addr`, channels from `ports` to `peer_ports` on loopback.
fn config(
    dev: &str,
    addr: &str,
    ctl: &Path,
    ports: [u16; 2],
    peer: [u16; 2],
    extra: &str,
) -> String {
    let mut s = format!(
        "[tunnel]\nname = \"{dev}\"\naddress = \"{addr}\"\ncontrol = \"{}\"\nlog_interval = \"0s\"\n{extra}\n\
         [session]\nkey = \"AyHDMTOweHmwGSs7vubt5lmmRKjx62UXkWxeQzJRXms=\"\nheartbeat = \"20ms\"\ndead_after = \"200ms\"\n",
        ctl.display()
    );
    for i in 0..2 {
        s += &format!(
            "\n[[channel]]\nname = \"c{i}\"\nlocal = \"127.0.0.1:{}\"\nremote = \"127.0.0.1:{}\"\nweight = {{W{i}}}\npace = \"off\"\n",
            ports[i], peer[i]
        );
    }
    s
}

fn weights(cfg: &str, w: [u32; 2]) -> String {
    cfg.replace("{W0}", &w[0].to_string())
        .replace("{W1}", &w[1].to_string())
}

/// The notification messages that arrive within `wait`.
fn notes(sock: &UnixDatagram, wait: Duration) -> Vec<String> {
    let mut got = Vec::new();
    let until = Instant::now() + wait;
    let mut buf = [0u8; 4096];
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        sock.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        match sock.recv(&mut buf) {
            Ok(n) => got.extend(String::from_utf8_lossy(&buf[..n]).lines().map(String::from)),
            Err(_) => break,
        }
    }
    got
}

/// Wait until `f` holds of A's status, or fail with `what`.
fn wait_status(ctl: &Path, log: &Path, what: &str, f: impl Fn(&Value) -> bool) -> Value {
    let t0 = Instant::now();
    loop {
        if let Some(s) = status(ctl) {
            if f(&s) {
                return s;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{what}: {s:#}\nlog:\n{}",
                log_of(log)
            );
        } else {
            assert!(t0.elapsed() < Duration::from_secs(10), "{what}: no status");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn quanta(s: &Value) -> (u64, u64) {
    let w = |i: usize| s["channels"][i]["weight"].as_u64().unwrap_or(0);
    (w(0), w(1))
}

fn log_of(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn wait_log(path: &Path, needle: &str) {
    let t0 = Instant::now();
    while !log_of(path).contains(needle) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "'{needle}' not in the log:\n{}",
            log_of(path)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn service_is_ready_when_the_peer_answers_and_reload_applies_weights_and_log_level() {
    if let Some(why) = skip_reason() {
        common::skip(
            "service_is_ready_when_the_peer_answers_and_reload_applies_weights_and_log_level",
            &why,
        );
        return;
    }
    let id = std::process::id() % 100_000;
    let ns = format!("braid-ops-svc{id}");
    let dir = std::env::temp_dir().join(format!("braid-ops-svc-{id}"));
    let mut lab = Lab::new(dir.clone());
    lab.add_ns(&ns);

    let (ca, cb) = (dir.join("a.sock"), dir.join("b.sock"));
    let base = 7400 + (id % 100) as u16 * 4;
    let a_cfg = config(
        "opsa0",
        "10.203.1.1/30",
        &ca,
        [base, base + 1],
        [base + 2, base + 3],
        "",
    );
    let b_cfg = config(
        "opsb0",
        "10.203.2.1/30",
        &cb,
        [base + 2, base + 3],
        [base, base + 1],
        "",
    );
    let (a_toml, b_toml) = (dir.join("a.toml"), dir.join("b.toml"));
    write_private(&a_toml, &weights(&a_cfg, [1, 1]));
    write_private(&b_toml, &weights(&b_cfg, [1, 1]));

    let notify_path = dir.join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    let a_log = dir.join("a.log");
    let spawn = |cfg: &Path, log: &Path, notify: Option<&Path>| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &ns, BIN, "tunnel", "--config"])
            .arg(cfg)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .env_remove("RUST_LOG");
        if let Some(n) = notify {
            c.env("NOTIFY_SOCKET", n);
        }
        c.spawn().unwrap()
    };
    // A alone: it says it waits, and is not ready while the peer is silent.
    lab.children
        .push(spawn(&a_toml, &a_log, Some(&notify_path)));
    let first = notes(&notify, Duration::from_millis(1500));
    assert!(
        first.iter().any(|n| n == "STATUS=waiting for the peer"),
        "{first:?}\n{}",
        log_of(&a_log)
    );
    assert!(
        !first.iter().any(|n| n == "READY=1"),
        "ready before the peer answered: {first:?}"
    );
    // B comes: now A is ready.
    lab.children.push(spawn(&b_toml, &dir.join("b.log"), None));
    let up = notes(&notify, Duration::from_secs(5));
    assert!(
        up.iter().any(|n| n == "READY=1"),
        "{up:?}\n{}",
        log_of(&a_log)
    );
    assert!(
        up.iter().any(|n| n == "STATUS=forwarding over 2 channels"),
        "{up:?}"
    );
    let s = wait_status(&ca, &a_log, "both channels up, equal quanta", |s| {
        let (q0, q1) = quanta(s);
        s["peer_seen"] == true && q0 > 0 && q0 == q1
    });
    let handshakes = s["handshakes"].clone();
    // Traffic into A's TUN device, bursts of 200 small datagrams: new quanta take effect
    // at the striper's next marker batch, and markers go with data.
    lab.children.push(
        Command::new("ip")
            .args(["netns", "exec", &ns, "bash", "-c"])
            .arg("while :; do for i in $(seq 200); do echo x; done > /dev/udp/10.203.1.2/9; sleep 0.05; done")
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );

    // New weights, a log level, and a setting that needs a restart; then SIGHUP.
    let pid = lab.children[0].id().to_string();
    let changed = weights(&a_cfg, [3, 1]).replace(
        "log_interval = \"0s\"",
        "log_interval = \"5s\"\nlog_level = \"warn\"",
    );
    write_private(&a_toml, &changed);
    sh(&["kill", "-HUP", &pid]);
    let reload = notes(&notify, Duration::from_secs(2));
    assert!(reload.iter().any(|n| n == "RELOADING=1"), "{reload:?}");
    assert!(
        reload.iter().any(|n| n.starts_with("MONOTONIC_USEC=")),
        "{reload:?}"
    );
    assert!(reload.iter().any(|n| n == "READY=1"), "{reload:?}");
    wait_log(&a_log, "reload: channel weights [1, 1] -> [3, 1]");
    wait_log(&a_log, "reload: changing the log level to warn");
    wait_log(&a_log, "reload: tunnel.log_interval changed; the running tunnel keeps the old value until it restarts");
    wait_status(&ca, &a_log, "quanta 3:1 after the reload", |s| {
        let (q0, q1) = quanta(s);
        q1 > 0 && q0 == 3 * q1
    });
    // And the stripe follows: channel 0 now carries three times what channel 1 does.
    let sent = |s: &Value, i: usize| s["channels"][i]["tx_data_packets"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let s1 = status(&ca).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let s2 = status(&ca).unwrap();
    let (d0, d1) = (sent(&s2, 0) - sent(&s1, 0), sent(&s2, 1) - sent(&s1, 1));
    let ratio = d0 as f64 / d1.max(1) as f64;
    assert!(
        d1 > 10 && (2.3..3.7).contains(&ratio),
        "{d0}:{d1} packets after 3:1"
    );
    let s = s2;
    // The same session: no new handshake, both channels still up.
    assert_eq!(s["handshakes"], handshakes, "{s:#}");
    for c in 0..2 {
        assert_eq!(s["channels"][c]["state"], "up", "{s:#}");
    }

    // A broken file is refused; the tunnel keeps its settings and runs on.
    write_private(&a_toml, "[tunnel\n");
    sh(&["kill", "-HUP", &pid]);
    wait_log(&a_log, "the tunnel keeps running with the settings it has");
    // Logged at warn now: the INFO line that opens a reload is not.
    assert_eq!(
        log_of(&a_log).matches("reload: reading").count(),
        1,
        "{}",
        log_of(&a_log)
    );
    assert!(
        lab.children[0].try_wait().unwrap().is_none(),
        "A exited:\n{}",
        log_of(&a_log)
    );
    let s = status(&ca).expect("A answers after a bad reload");
    let (q0, q1) = quanta(&s);
    assert_eq!(q0, 3 * q1, "{s:#}");

    // SIGTERM: STOPPING=1, exit status 0.
    sh(&["kill", "-TERM", &pid]);
    let st = lab.children[0].wait().unwrap();
    assert!(st.success(), "{st:?}\n{}", log_of(&a_log));
    let stop = notes(&notify, Duration::from_millis(500));
    assert!(stop.iter().any(|n| n == "STOPPING=1"), "{stop:?}");
}
