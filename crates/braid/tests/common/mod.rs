//! Shared by the integration tests that need root, namespaces or outside tools.

use std::io::Write;

/// Record that `test` cannot run here and why: printed, and appended to the file named
/// by `BRAID_SKIP_LOG` (set by `scripts/test.sh`, whose closing line then counts the
/// test as skipped, not passed).
pub fn skip(test: &str, why: &str) {
    eprintln!("SKIPPED {test}: {why}");
    if let Ok(path) = std::env::var("BRAID_SKIP_LOG") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{test}: {why}");
        }
    }
}

/// The first of `tools` (command, Debian package) that is not installed, as a reason.
pub fn missing_tool(tools: &[(&str, &str)]) -> Option<String> {
    tools.iter().find_map(|(cmd, pkg)| {
        braid_lab::tools::find(cmd)
            .is_none()
            .then(|| format!("`{cmd}` is not installed (apt-get install {pkg})"))
    })
}

/// Why a namespace lab test cannot run here (root, iproute2, ping, iperf3, /dev/net/tun),
/// or `None`.
#[allow(dead_code)] // not every test binary that includes `common` runs a lab
pub fn lab_skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root: network namespaces need CAP_NET_ADMIN".into());
    }
    if let Some(why) = missing_tool(&[
        ("ip", "iproute2"),
        ("tc", "iproute2"),
        ("ping", "iputils-ping"),
        ("iperf3", "iperf3"),
    ]) {
        return Some(why);
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Some("/dev/net/tun is missing".into());
    }
    None
}

/// Run a command and assert that it succeeded (its stderr in the failure).
#[allow(dead_code)] // not every test binary that includes `common` runs commands
pub fn sh(args: &[&str]) {
    let out = std::process::Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{:?} failed: {}",
        args,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `python3` missing (needed here for `purpose`), as a reason; `None` if it runs.
#[allow(dead_code)] // not every test binary that includes `common` drives python
pub fn missing_python(purpose: &str) -> Option<String> {
    let runs = std::process::Command::new("python3")
        .args(["-c", "pass"])
        .output()
        .is_ok_and(|o| o.status.success());
    (!runs).then(|| format!("python3 is not available ({purpose})"))
}
