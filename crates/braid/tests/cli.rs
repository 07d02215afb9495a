//! The command line's conventions: `--version` names the commit, exit statuses (0, 1,
//! 2), man pages and shell completions generated from the clap definitions, the log
//! flags, and `braid status --watch` printing successive snapshots when its output is
//! not a terminal.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_braid");

fn braid(args: &[&str]) -> std::process::Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("braid-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    let _ = std::fs::remove_file(&d);
    d
}

#[test]
fn version_names_the_commit() {
    let out = braid(&["--version"]);
    assert!(out.status.success());
    let v = String::from_utf8(out.stdout).unwrap();
    assert!(
        v.starts_with(&format!("braid {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{v}"
    );
    // In a git checkout: the commit the binary was built from (BRAID_COMMIT overrides).
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output();
    match (std::env::var("BRAID_COMMIT"), head) {
        (Ok(c), _) if !c.trim().is_empty() => assert!(v.contains(&format!("(commit {c})")), "{v}"),
        (_, Ok(h)) if h.status.success() => {
            let h = String::from_utf8(h.stdout).unwrap();
            assert!(
                v.contains(&format!("(commit {})", h.trim())),
                "{v} vs HEAD {h}"
            );
        }
        _ => assert!(v.contains("(commit unknown"), "{v}"),
    }
    // Every subcommand says the same.
    let sub = braid(&["tunnel", "--version"]);
    assert!(String::from_utf8_lossy(&sub.stdout).contains("(commit "));
}

#[test]
fn exit_status_is_0_ok_1_runtime_error_2_usage_error() {
    assert_eq!(braid(&["genkey"]).status.code(), Some(0));
    // Usage errors (clap): an unknown subcommand, an unknown flag, a bad value.
    for args in [
        &["bogus"][..],
        &["status", "--bogus"],
        &["status", "--log-level", "loud"],
        &["-v", "-q", "status"],
    ] {
        let out = braid(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    }
    // A runtime error: a control socket nobody serves, a missing configuration file.
    let missing = tmp("nobody.sock");
    let out = braid(&["status", "--control", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("braid: error: cannot connect to"), "{err}");
    let out = braid(&["tunnel", "--config", "/nonexistent/braid.toml"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    // --help documents them.
    let help = String::from_utf8(braid(&["--help"]).stdout).unwrap();
    assert!(
        help.contains("Exit status:") && help.contains("  2    a command-line usage error"),
        "{help}"
    );
}

#[test]
fn man_pages_come_from_the_clap_definitions() {
    let dir = tmp("man");
    let out = braid(&["man", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let page =
        |n: &str| std::fs::read_to_string(dir.join(n)).unwrap_or_else(|e| panic!("{n}: {e}"));
    let top = page("braid.1");
    assert!(
        top.starts_with(".ie \\n(.g .ds Aq"),
        "roff: {}",
        &top[..80.min(top.len())]
    );
    for s in ["tunnel", "status", "completions", "man", "lab"] {
        assert!(
            top.contains(&format!("braid\\-{s}(1)")),
            "braid.1 lists {s}"
        );
    }
    assert!(top.contains(".SH \"EXIT STATUS\""), "{top}");
    assert!(top.contains("a command\\-line usage error"), "{top}");
    assert!(top.contains("\\-\\-log\\-level"), "the global flags: {top}");
    // One page per subcommand, with its flags as in --help.
    let status = page("braid-status.1");
    assert!(status.contains("\\-\\-watch"), "{status}");
    let tunnel = page("braid-tunnel.1");
    assert!(tunnel.contains("\\-\\-config"), "{tunnel}");
    assert!(dir.join("braid-lab-bench.1").exists());
    // Every subcommand in `braid --help` has its page.
    let help = String::from_utf8(braid(&["--help"]).stdout).unwrap();
    let subs: Vec<&str> = help
        .split("Commands:")
        .nth(1)
        .unwrap()
        .split("Options:")
        .next()
        .unwrap()
        .lines()
        .filter_map(|l| {
            l.strip_prefix("  ")
                .and_then(|l| l.split_whitespace().next())
        })
        .filter(|s| *s != "help")
        .collect();
    assert!(subs.len() >= 12, "{subs:?}");
    for s in subs {
        assert!(dir.join(format!("braid-{s}.1")).exists(), "no page for {s}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    // A directory that cannot be made: exit 1, naming it.
    let out = braid(&["man", "/proc/braid-man"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/proc/braid-man"));
}

#[test]
fn completions_for_bash_zsh_and_fish_know_the_subcommands_and_flags() {
    for (shell, marker) in [
        ("bash", "complete -F _braid"),
        ("zsh", "#compdef braid"),
        ("fish", "complete -c braid"),
    ] {
        let out = braid(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {out:?}");
        let s = String::from_utf8(out.stdout).unwrap();
        assert!(s.contains(marker), "{shell}");
        for word in ["tunnel", "status", "watch", "log-level", "peer-timeout"] {
            assert!(s.contains(word), "{shell} completion lacks {word}");
        }
    }
    // A reader that goes away early is not an error.
    let mut c = Command::new(BIN)
        .args(["completions", "zsh"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(c.stdout.take());
    let out = c.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A control socket that answers each `stats` request with a snapshot whose uptime
/// counts the requests; returns the socket's path.
fn fake_control(name: &str) -> PathBuf {
    let path = tmp(name);
    let l = UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        for (n, conn) in l.incoming().enumerate() {
            let Ok(mut conn) = conn else { return };
            let mut line = String::new();
            let _ = BufReader::new(&mut conn).read_line(&mut line);
            let s = braid_io::SessionStats {
                uptime_s: n as f64 + 1.0,
                ..Default::default()
            };
            let _ = conn.write_all(serde_json::to_string(&s).unwrap().as_bytes());
        }
    });
    path
}

#[test]
fn status_watch_prints_successive_snapshots_to_a_pipe() {
    let ctl = fake_control("watch.sock");
    let mut c = Command::new(BIN)
        .args([
            "status",
            "--watch",
            "0.1",
            "--json",
            "--control",
            ctl.to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(c.stdout.take().unwrap()).lines();
    let mut uptimes = Vec::new();
    let t0 = Instant::now();
    while uptimes.len() < 4 && t0.elapsed() < Duration::from_secs(10) {
        let l = lines.next().unwrap().unwrap();
        let v: serde_json::Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"));
        uptimes.push(v["uptime_s"].as_f64().unwrap());
    }
    assert_eq!(uptimes, [1.0, 2.0, 3.0, 4.0], "one snapshot a refresh");
    // Ctrl-C ends it, with status 0.
    // SAFETY: kill with a valid pid and signal.
    unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
    let st = c.wait().unwrap();
    assert_eq!(st.code(), Some(0), "{st:?}");

    // The table, each snapshot headed by the time, no terminal escapes in a pipe.
    let mut c = Command::new(BIN)
        .args([
            "status",
            "--watch",
            "0.1",
            "--control",
            ctl.to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(450));
    // SAFETY: as above.
    unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
    let mut text = String::new();
    c.stdout.take().unwrap().read_to_string(&mut text).unwrap();
    assert!(c.wait().unwrap().success());
    let heads = text.matches("Every 0.1s: braid status --control ").count();
    assert!(heads >= 2, "{text}");
    assert!(!text.contains('\x1b'), "{text:?}");

    // A socket nobody serves: an error at once, exit 1.
    let out = braid(&[
        "status",
        "--watch",
        "--control",
        tmp("none.sock").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let _ = std::fs::remove_file(&ctl);
}
