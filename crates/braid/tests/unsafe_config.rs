//! Issue 27, item 3, on the real binary: `braid tunnel` refuses what is unsafe unless
//! the config says so in words. `security = "none"` (no authentication: anyone who
//! can send to a channel can inject packets) needs `allow_insecure = true` and then
//! warns at every start; an inline `key` in a file that others can read is refused,
//! as a readable `key_file` is. The tunnel is refused before it opens a TUN device or
//! a socket, so no root is needed. `BRAID_TEST_BIN` runs the same checks against
//! another build (the build before issue 27 accepted both with an INFO line).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_braid");

mod common;

fn braid() -> String {
    std::env::var("BRAID_TEST_BIN").unwrap_or_else(|_| BIN.into())
}

const KEY: &str = "f1njdwrpfIzRyXbWUPz15DmEK5AHdvKw7LmAZC4M6Rw=";

/// A one-channel config whose TUN device is `name` (each test its own: a build that
/// does not refuse starts the tunnel).
fn config(name: &str, session: &str) -> String {
    format!(
        "[tunnel]\nname = \"{name}\"\naddress = \"10.98.0.1/24\"\n\n\
         [session]\n{session}\n\n\
         [[channel]]\nname = \"c0\"\nlocal = \"127.0.0.1:0\"\nremote = \"127.0.0.1:9\"\n"
    )
}

fn write(dir: &Path, name: &str, text: &str, mode: u32) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p
}

/// Runs `braid tunnel --config PATH` for at most 5 s: (exited with, stderr+stdout).
fn tunnel(cfg: &Path) -> (Option<i32>, String) {
    let out_path = cfg.with_extension("log");
    let log = std::fs::File::create(&out_path).unwrap();
    let mut child = Command::new(braid())
        .args(["tunnel", "--config"])
        .arg(cfg)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("run braid");
    let deadline = Instant::now() + Duration::from_secs(5);
    let code = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (code, std::fs::read_to_string(&out_path).unwrap_or_default())
}

#[test]
fn security_none_without_the_acknowledgement_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(
        dir.path(),
        "none.toml",
        &config(
            "brt-unsafe1",
            &format!("key = \"{KEY}\"\nsecurity = \"none\""),
        ),
        0o600,
    );
    let (code, out) = tunnel(&cfg);
    assert_eq!(code, Some(1), "refused at once, exit status 1: {out}");
    assert!(
        out.contains("allow_insecure = true"),
        "says what to write: {out}"
    );
}

#[test]
fn an_inline_key_in_a_file_others_can_read_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(
        dir.path(),
        "readable.toml",
        &config("brt-unsafe2", &format!("key = \"{KEY}\"")),
        0o644,
    );
    let (code, out) = tunnel(&cfg);
    assert_eq!(code, Some(1), "refused at once, exit status 1: {out}");
    assert!(
        out.contains("readable") && out.contains("chmod"),
        "says why and what to do: {out}"
    );
}

/// With the acknowledgement the tunnel runs, and says at its start what it gives up
/// (a WARN line, not the INFO line of before). Needs root and /dev/net/tun: it opens
/// the TUN device, in a namespace of its own.
#[test]
fn security_none_with_the_acknowledgement_warns_at_start() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/net/tun").exists() {
        common::skip(
            "security_none_with_the_acknowledgement_warns_at_start",
            "needs root and /dev/net/tun",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = write(
        dir.path(),
        "none-ack.toml",
        &config(
            "brt-unsafe3",
            &format!("key = \"{KEY}\"\nsecurity = \"none\"\nallow_insecure = true"),
        ),
        0o600,
    );
    let ns = "brt-unsafe";
    let _ = Command::new("ip").args(["netns", "del", ns]).status();
    assert!(Command::new("ip")
        .args(["netns", "add", ns])
        .status()
        .unwrap()
        .success());
    let _ = Command::new("ip")
        .args(["netns", "exec", ns, "ip", "link", "set", "lo", "up"])
        .status();
    let log_path = dir.path().join("none-ack.out");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(braid())
        .args(["tunnel", "--config"])
        .arg(&cfg)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("run braid");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut out = String::new();
    while Instant::now() < deadline {
        out = std::fs::read_to_string(&log_path).unwrap_or_default();
        if out.contains("WARN") && out.contains("security = \"none\"") {
            break;
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let running = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    let _ = Command::new("ip").args(["netns", "del", ns]).status();
    assert!(running, "the tunnel runs with the acknowledgement: {out}");
    let warn = out
        .lines()
        .find(|l| l.contains("security = \"none\""))
        .unwrap_or_default();
    assert!(warn.contains("WARN"), "a warning, not INFO: {out}");
    assert!(warn.contains("forged"), "says what it gives up: {warn}");
}
