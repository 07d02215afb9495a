//! Issue 30, item 1: `braid peer add` and `braid peer remove` on a running server. The
//! server namespace serves one client (site-a); a second client (site-b) is added with
//! `braid peer add`, connects and pings through the server, and is removed with `braid
//! peer remove`, which stops it; site-a's session runs on throughout with no new
//! handshake. Bad requests (a taken key, a bad prefix, an unknown peer) fail with a
//! clear message and leave the file as it was. Needs root, /dev/net/tun, `ip` and
//! `ping`; without them the test says why it is skipped.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use braid_io::keys;
use serde_json::Value;

mod common;
use common::{sh, status, Lab, BIN};

fn braid(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

fn peer<'a>(s: &'a Value, name: &str) -> Option<&'a Value> {
    s["peers"].as_array()?.iter().find(|p| p["name"] == name)
}

#[test]
fn peers_are_added_and_removed_at_run_time_without_disturbing_the_others() {
    let test = "peers_are_added_and_removed_at_run_time_without_disturbing_the_others";
    if let Some(why) = common::netns_skip_reason(
        "network namespaces, TUN devices",
        &[("ip", "iproute2"), ("ping", "iputils-ping")],
        None,
    ) {
        common::skip(test, &why);
        return;
    }
    let id = std::process::id() % 100_000;
    let (ns_s, ns_a, ns_b) = (
        format!("bpe{id}srv"),
        format!("bpe{id}a"),
        format!("bpe{id}b"),
    );
    let mut lab = Lab::new(std::env::temp_dir().join(format!("braid-peer-{id}")));
    for ns in [&ns_s, &ns_a, &ns_b] {
        lab.add_ns(ns);
        for k in ["all", "default"] {
            let key = format!("net.ipv6.conf.{k}.disable_ipv6=1");
            sh(&["ip", "netns", "exec", ns, "sysctl", "-qw", &key]);
        }
    }
    for (ns, k) in [(&ns_a, 1), (&ns_b, 2)] {
        common::veth(
            &ns_s,
            &format!("bpe{id}s{k}"),
            &format!("10.234.{k}.1/24"),
            ns,
            &format!("bpe{id}c{k}"),
            &format!("10.234.{k}.2/24"),
        );
    }
    let (ks, ka, kb) = (
        keys::generate().unwrap(),
        keys::generate().unwrap(),
        keys::generate().unwrap(),
    );
    let public = |k: &[u8; 32]| keys::encode(&keys::public_key(k));
    for (f, k) in [("s.key", &ks), ("a.key", &ka), ("b.key", &kb)] {
        common::write_private(&lab.dir.join(f), &keys::encode(k));
    }
    let ctl = |n: &str| lab.dir.join(format!("{n}.sock"));
    let (ctl_s, ctl_a, ctl_b) = (ctl("s"), ctl("a"), ctl("b"));
    let session = "heartbeat = \"20ms\"\ndead_after = \"200ms\"\n";
    let server = format!(
        "# the server\n[tunnel]\nname = \"bpe{id}s\"\naddress = \"10.93.0.1/16\"\ncontrol = \"{}\"\n\n[session]\nprivate_key_file = \"s.key\"\n{session}\n[[channel]]\nname = \"one\"\nlocal = \"0.0.0.0:7100\"\n\n[[channel]]\nname = \"two\"\nlocal = \"0.0.0.0:7101\"\n\n# the first site\n[[peer]]\nname = \"site-a\"\npublic_key = \"{}\"\nallowed_ips = [\"10.93.1.0/24\"]\n",
        ctl_s.display(),
        public(&ka)
    );
    let client = |name: &str, key: &str, k: u8| {
        format!(
            "[tunnel]\nname = \"bpe{id}{name}\"\naddress = \"10.93.{k}.2/16\"\ncontrol = \"{}\"\n\n[session]\nprivate_key_file = \"{key}\"\npeer_public_key = \"{}\"\n{session}\n[[channel]]\nname = \"one\"\nremote = \"10.234.{k}.1:7100\"\n\n[[channel]]\nname = \"two\"\nremote = \"10.234.{k}.1:7101\"\n",
            ctl(name).display(),
            public(&ks)
        )
    };
    let cfg_s = lab.dir.join("s.toml");
    common::write_private(&cfg_s, &server);
    common::write_private(&lab.dir.join("a.toml"), &client("a", "a.key", 1));
    common::write_private(&lab.dir.join("b.toml"), &client("b", "b.key", 2));
    for (ns, f) in [(&ns_s, "s.toml"), (&ns_a, "a.toml"), (&ns_b, "b.toml")] {
        let c = common::start_tunnel(ns, &lab.dir.join(f));
        lab.children.push(c);
    }
    let seen = |c: &std::path::Path| status(c).is_some_and(|s| s["peer_seen"] == true);
    let t0 = Instant::now();
    while !seen(&ctl_a) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "site-a never connected"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    common::ping_until(&ns_a, "10.93.0.1", Duration::from_secs(3));
    assert!(!seen(&ctl_b), "site-b connected before it was added");
    let a_before = status(&ctl_a).unwrap();
    let s_before = status(&ctl_s).unwrap();
    let hs = |s: &Value| n(&peer(s, "site-a").expect("site-a")["session"]["handshakes"]);
    let cfg = cfg_s.to_str().unwrap();

    // Bad requests: refused, said why, the file unchanged.
    let pub_a = public(&ka);
    let pub_b = public(&kb);
    for (args, want) in [
        (
            vec![
                "--name",
                "site-b",
                "--public-key",
                &pub_a,
                "--allowed-ips",
                "10.93.2.0/24",
            ],
            "already the key of peer 'site-a'",
        ),
        (
            vec![
                "--name",
                "site-b",
                "--public-key",
                &pub_b,
                "--allowed-ips",
                "10.93.2.0/33",
            ],
            "--allowed-ips: '10.93.2.0/33'",
        ),
        (
            vec![
                "--name",
                "site-a",
                "--public-key",
                &pub_b,
                "--allowed-ips",
                "10.93.2.0/24",
            ],
            "already has a peer named 'site-a'",
        ),
    ] {
        let mut all = vec!["peer", "add", "--config", cfg];
        all.extend(args);
        let out = braid(&all);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(text(&out).contains(want), "{want:?} not in: {}", text(&out));
    }
    let out = braid(&["peer", "remove", "--config", cfg, "site-z"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("no peer named 'site-z'"),
        "{}",
        text(&out)
    );
    assert_eq!(std::fs::read_to_string(&cfg_s).unwrap(), server);

    // Added: site-b connects and flows; site-a is not disturbed.
    let out = braid(&[
        "peer",
        "add",
        "--config",
        cfg,
        "--name",
        "site-b",
        "--public-key",
        &pub_b,
        "--allowed-ips",
        "10.93.2.0/24",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("the running server applied it")
            && text(&out).contains("added [site-b]"),
        "{}",
        text(&out)
    );
    let t0 = Instant::now();
    while !seen(&ctl_b) {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "site-b did not connect after it was added: {:?}",
            status(&ctl_s)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("site-b connected {:?} after braid peer add", t0.elapsed());
    common::ping_until(&ns_b, "10.93.0.1", Duration::from_secs(3));
    assert!(common::ping(&ns_a, "10.93.0.1", 1000));
    let file = std::fs::read_to_string(&cfg_s).unwrap();
    assert!(
        file.starts_with(&server),
        "the rest of the file changed:\n{file}"
    );
    assert!(file.contains("name = \"site-b\""), "{file}");

    // Removed: site-b stops; site-a still on its first handshake.
    let out = braid(&["peer", "remove", "--config", cfg, "site-b"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("removed [site-b]"), "{}", text(&out));
    let s = status(&ctl_s).unwrap();
    assert!(peer(&s, "site-b").is_none(), "{s}");
    assert!(
        !common::ping(&ns_b, "10.93.0.1", 500),
        "a removed peer still flows"
    );
    assert!(common::ping(&ns_a, "10.93.0.1", 1000));
    assert_eq!(std::fs::read_to_string(&cfg_s).unwrap(), server);
    let a_after = status(&ctl_a).unwrap();
    assert_eq!(
        n(&a_after["handshakes"]),
        n(&a_before["handshakes"]),
        "site-a handshook again: {a_after}"
    );
    assert_eq!(
        hs(&s),
        hs(&s_before),
        "the server's site-a handshook again: {s}"
    );
    assert!(a_after["uptime_s"].as_f64() > a_before["uptime_s"].as_f64());
    assert_eq!(n(&s["server"]["peers_added"]), 1, "{s}");
    assert_eq!(n(&s["server"]["peers_removed"]), 1, "{s}");
}
