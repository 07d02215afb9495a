//! Puts the git commit into `braid --version`: `BRAID_LONG_VERSION` is
//! "VERSION (commit HASH)", or "VERSION (commit unknown)" when the sources are not a git
//! checkout (a crates tarball, a package build from an exported tree). `BRAID_COMMIT`
//! in the environment overrides what git says (a packager building from a tarball).

use std::path::PathBuf;
use std::process::Command;

fn manifest_dir() -> PathBuf {
    PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default())
}

/// Rebuild when `path` changes; only existing files (a missing one reruns every build).
fn watch(path: PathBuf) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(manifest_dir())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=BRAID_COMMIT");
    let commit = std::env::var("BRAID_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]));
    // Rebuild when HEAD moves: HEAD itself (a checkout), the branch it names (a commit),
    // and packed-refs. Paths are absolute; git may print them relative to the crate.
    let dir = manifest_dir();
    if let Some(git_dir) = git(&["rev-parse", "--git-dir"]) {
        watch(dir.join(git_dir).join("HEAD"));
    }
    if let (Some(common), Some(head_ref)) = (
        git(&["rev-parse", "--git-common-dir"]),
        git(&["symbolic-ref", "-q", "HEAD"]),
    ) {
        let common = dir.join(common);
        watch(common.join(head_ref));
        watch(common.join("packed-refs"));
    }
    let version = env!("CARGO_PKG_VERSION");
    let long = match commit {
        Some(c) => format!("{version} (commit {c})"),
        None => format!("{version} (commit unknown: not built from a git checkout)"),
    };
    println!("cargo:rustc-env=BRAID_LONG_VERSION={long}");
}
