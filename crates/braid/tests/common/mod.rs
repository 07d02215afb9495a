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
