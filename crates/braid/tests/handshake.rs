//! Issue 26 on real sockets: `braid send` and `braid recv` on loopback whose keys, or
//! whose modes, differ both exit within seconds with an error that says so (before,
//! they waited the whole `--peer-timeout` and blamed a silent peer).

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod loopback;
use loopback::{ends, tmp, BIN};

/// Run `recv` with `b` and `send` with `a` (each plus `extra_*`) against each other and
/// return both outputs and how long the slower took. `--peer-timeout 60s`, so an exit
/// within seconds is not the timeout.
fn run(
    a: &[String],
    b: &[String],
    extra_a: &[&str],
    extra_b: &[&str],
) -> (Output, Output, Duration) {
    let src = tmp(&format!("hs-in-{}", extra_a.join("")));
    std::fs::write(&src, vec![7u8; 100_000]).unwrap();
    let dst = tmp(&format!("hs-out-{}", extra_b.join("")));
    let t0 = Instant::now();
    let recv = Command::new(BIN)
        .arg("recv")
        .args(b)
        .args(extra_b)
        .args(["--peer-timeout", "60s"])
        .arg(&dst)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let send = Command::new(BIN)
        .arg("send")
        .args(a)
        .args(extra_a)
        .args(["--peer-timeout", "60s"])
        .arg(&src)
        .output()
        .unwrap();
    let recv = recv.wait_with_output().unwrap();
    let took = t0.elapsed();
    let _ = std::fs::remove_file(src);
    let _ = std::fs::remove_file(dst);
    (send, recv, took)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The line `braid: error: ...` (the process's final error).
fn error_line(o: &Output) -> String {
    stderr(o)
        .lines()
        .find(|l| l.starts_with("braid: error:"))
        .unwrap_or_default()
        .to_string()
}

#[test]
fn different_keys_fail_at_both_ends_within_seconds_naming_the_keys() {
    let (_relay, a, mut b) = ends(2);
    // Another key for the receiver.
    let other = tmp("hs-other-key");
    let out = Command::new(BIN).arg("genkey").output().unwrap();
    std::fs::write(&other, &out.stdout).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let k = b.iter().position(|x| x == "--key-file").unwrap();
    b[k + 1] = other.to_str().unwrap().to_string();
    let (send, recv, took) = run(&a, &b, &[], &[]);
    let _ = std::fs::remove_file(&other);
    let (se, re) = (stderr(&send), stderr(&recv));
    assert!(
        !send.status.success() && !recv.status.success(),
        "{se}\n{re}"
    );
    assert!(took < Duration::from_secs(8), "took {took:?}\n{se}\n{re}");
    for (who, o) in [("send", &send), ("recv", &recv)] {
        let e = error_line(o);
        assert!(
            e.contains("the peer rejected our handshake") && e.contains("the keys differ"),
            "{who}: {e}\n{}",
            stderr(o)
        );
        assert!(e.contains("pre-shared key"), "{who}: {e}");
    }
    // The refusing end logged the source and the reason.
    assert!(
        re.contains("handshake from 127.0.0.1:") && re.contains("refused"),
        "{re}"
    );
}

#[test]
fn different_modes_fail_at_both_ends_naming_the_mode_and_both_values() {
    let (_relay, a, b) = ends(2);
    let (send, recv, took) = run(&a, &b, &["--mode", "trr"], &["--mode", "logical"]);
    let (se, re) = (stderr(&send), stderr(&recv));
    assert!(
        !send.status.success() && !recv.status.success(),
        "{se}\n{re}"
    );
    assert!(took < Duration::from_secs(8), "took {took:?}\n{se}\n{re}");
    assert!(
        error_line(&send).contains(
            "the peer's mode is \"logical\", ours is \"trr\": both ends must use the same mode"
        ),
        "{se}"
    );
    assert!(
        error_line(&recv).contains(
            "the peer's mode is \"trr\", ours is \"logical\": both ends must use the same mode"
        ),
        "{re}"
    );
}

#[test]
fn matching_ends_still_connect() {
    let (_relay, a, b) = ends(2);
    let (send, recv, _) = run(&a, &b, &["--mode", "seq"], &["--mode", "seq"]);
    assert!(
        send.status.success() && recv.status.success(),
        "{}\n{}",
        stderr(&send),
        stderr(&recv)
    );
}

/// A `--config` file for one end: its `--channel` pairs and `--key-file` from `args`,
/// and `cipher`.
fn config_with_cipher(args: &[String], cipher: &str, name: &str) -> std::path::PathBuf {
    let at = |flag: &str| {
        args.iter()
            .enumerate()
            .filter(|(_, x)| *x == flag)
            .map(|(i, _)| args[i + 1].clone())
            .collect::<Vec<_>>()
    };
    let mut toml = format!(
        "[session]\nkey_file = \"{}\"\ncipher = \"{cipher}\"\n",
        at("--key-file")[0]
    );
    for (i, ch) in at("--channel").iter().enumerate() {
        let (local, remote) = ch.split_once(',').unwrap();
        toml +=
            &format!("[[channel]]\nname = \"c{i}\"\nlocal = \"{local}\"\nremote = \"{remote}\"\n");
    }
    let p = tmp(&format!("hs-cipher-{name}.toml"));
    std::fs::write(&p, toml).unwrap();
    p
}

#[test]
fn the_ends_agree_on_aes_gcm_only_when_both_ask_and_say_which_they_use() {
    for (ours, theirs, want) in [
        ("aes-256-gcm", "aes-256-gcm", "aes-256-gcm"),
        ("aes-256-gcm", "chacha20-poly1305", "chacha20-poly1305"),
        ("chacha20-poly1305", "aes-256-gcm", "chacha20-poly1305"),
    ] {
        let (_relay, a, b) = ends(1);
        let ca = config_with_cipher(&a, ours, &format!("a-{ours}-{theirs}"));
        let cb = config_with_cipher(&b, theirs, &format!("b-{ours}-{theirs}"));
        let arg = |p: &std::path::PathBuf| vec!["--config".to_string(), p.display().to_string()];
        let (send, recv, _) = run(&arg(&ca), &arg(&cb), &[], &[]);
        let _ = (std::fs::remove_file(ca), std::fs::remove_file(cb));
        let (se, re) = (stderr(&send), stderr(&recv));
        assert!(
            send.status.success() && recv.status.success(),
            "{ours}/{theirs}:\n{se}\n{re}"
        );
        for (who, e) in [("send", &se), ("recv", &re)] {
            assert!(
                e.contains(&format!("peer heard; data sealed with {want}")),
                "{ours}/{theirs}, {who}:\n{e}"
            );
        }
    }
}
