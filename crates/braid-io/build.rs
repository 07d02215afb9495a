//! The git commit this braid-io is built from, for `braid_build_info` (the Prometheus
//! metrics): `BRAID_GIT_COMMIT`, the short hash of the checked-out commit (changes not
//! yet committed are not marked), or unset outside a git checkout.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    // Built again when HEAD moves (a commit, a checkout).
    if let Some(path) = git(&["rev-parse", "--git-path", "HEAD"]) {
        println!("cargo:rerun-if-changed={path}");
    }
    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
        if let Some(path) = git(&["rev-parse", "--git-path", &r]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let Some(commit) = git(&["rev-parse", "--short=12", "HEAD"]) else {
        return;
    };
    println!("cargo:rustc-env=BRAID_GIT_COMMIT={commit}");
}
