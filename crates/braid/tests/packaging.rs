//! What a user installs: the systemd unit (checked with `systemd-analyze verify` and
//! `security`; its command line run against the built binary) and the Debian package
//! built by `scripts/package.sh` (its contents listed with `dpkg-deb`, its binary run).
//! Each test skips, saying why, when its tool is missing.

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_braid");

mod common;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("braid-pkg-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn unit() -> String {
    std::fs::read_to_string(repo().join("packaging/systemd/braid@.service")).unwrap()
}

fn run(c: &mut Command) -> std::process::Output {
    c.output().unwrap_or_else(|e| panic!("{c:?}: {e}"))
}

/// `systemd-analyze verify` of `file` (man pages looked up in `man`): its complaints,
/// empty when the unit is clean. It exits 0 on many problems it only warns about, so
/// its output is the verdict.
fn verify(file: &Path, man: &Path) -> String {
    let out = run(Command::new("systemd-analyze")
        .arg("verify")
        .arg(file)
        .env("MANPATH", man)
        .env("SYSTEMD_LOG_COLOR", "0"));
    let mut s = String::from_utf8_lossy(&out.stderr).to_string();
    s += &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        s += &format!("\n(exit {:?})", out.status.code());
    }
    s
}

#[test]
fn the_systemd_unit_verifies_and_runs_braid_as_documented() {
    let u = unit();
    for line in [
        "Type=notify",
        "ExecStart=/usr/bin/braid tunnel --config /etc/braid/%i.toml",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "CapabilityBoundingSet=CAP_NET_ADMIN CAP_NET_RAW",
        "AmbientCapabilities=CAP_NET_ADMIN CAP_NET_RAW",
        "ProtectSystem=strict",
        "PrivateTmp=yes",
        "NoNewPrivileges=yes",
        "DeviceAllow=/dev/net/tun rw",
        "RuntimeDirectory=braid",
        "ReadWritePaths=-/run/braid",
    ] {
        assert!(u.lines().any(|l| l == line), "braid@.service lacks {line}");
    }
    // The command line the unit runs is one braid accepts: with a missing file it is a
    // runtime error naming the file (1), not a usage error (2).
    let exec = u
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart=/usr/bin/braid "))
        .unwrap()
        .replace("/etc/braid/%i.toml", "/nonexistent/braid-site.toml");
    let out = run(Command::new(BIN).args(exec.split_whitespace()));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/braid-site.toml"));

    if let Some(why) = common::missing_tool(&[("systemd-analyze", "systemd")]) {
        common::skip(
            "the_systemd_unit_verifies_and_runs_braid_as_documented",
            &why,
        );
        return;
    }
    // The unit as installed, but naming the binary just built (verify checks that
    // ExecStart exists) and with the man pages of its Documentation= line.
    let dir = tmp("unit");
    let man = dir.join("man");
    let out = run(Command::new(BIN).arg("man").arg(man.join("man1")));
    assert!(out.status.success(), "{out:?}");
    let local = u.replace("/usr/bin/braid", BIN);
    for name in ["braid@.service", "braid@site.service"] {
        std::fs::write(dir.join(name), &local).unwrap();
        let v = verify(&dir.join(name), &man);
        assert!(v.trim().is_empty(), "systemd-analyze verify {name}:\n{v}");
    }
    // The check sees a fault (a bad setting is only a warning to systemd).
    std::fs::write(
        dir.join("braid@bad.service"),
        local.replace("Type=notify", "Type=notifyy"),
    )
    .unwrap();
    let v = verify(&dir.join("braid@bad.service"), &man);
    assert!(v.contains("notifyy"), "{v}");
    // Hardened: systemd's exposure score at most 3.0 ("OK"; 10 is an unconfined root
    // service). --offline needs systemd 250.
    let out = run(Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--threshold=30", "--no-pager"])
        .arg(dir.join("braid@site.service")));
    let text = String::from_utf8_lossy(&out.stdout);
    if !String::from_utf8_lossy(&out.stderr).contains("--offline") {
        assert!(out.status.success(), "exposure above 3.0:\n{text}");
        assert!(
            text.contains("Overall exposure level for braid@site.service"),
            "{text}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_debian_package_holds_the_binary_unit_man_pages_completions_and_examples() {
    const NAME: &str =
        "the_debian_package_holds_the_binary_unit_man_pages_completions_and_examples";
    let cargo_deb = Command::new("cargo")
        .args(["deb", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !cargo_deb {
        common::skip(
            NAME,
            "cargo-deb is not installed (cargo install cargo-deb --locked; .ci/run does)",
        );
        return;
    }
    if let Some(why) = common::missing_tool(&[("dpkg-deb", "dpkg"), ("gzip", "gzip")]) {
        common::skip(NAME, &why);
        return;
    }
    // Package the binary this test runs with (no second build): it must be a release
    // build, as the package's is.
    let bin = Path::new(BIN);
    let profile_dir = bin.parent().unwrap();
    if profile_dir.file_name().unwrap() != "release" {
        common::skip(
            NAME,
            "the package holds a release build: run the tests with --release",
        );
        return;
    }
    let target = profile_dir.parent().unwrap();
    let out_dir = tmp("deb");
    let out = run(Command::new(repo().join("scripts/package.sh"))
        .args(["--fast", "--output"])
        .arg(&out_dir)
        .env("CARGO_TARGET_DIR", target)
        .env("BRAID_PACKAGE_NO_BUILD", "1"));
    assert!(
        out.status.success(),
        "scripts/package.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deb = std::fs::read_dir(&out_dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .expect("a .deb in the output directory");
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        deb.file_name().unwrap().to_string_lossy(),
        format!("braid_{version}-1_amd64.deb").replace("amd64", &arch())
    );

    let list = String::from_utf8(run(Command::new("dpkg-deb").arg("-c").arg(&deb)).stdout).unwrap();
    let has = |path: &str| list.lines().any(|l| l.ends_with(&format!(" .{path}")));
    for path in [
        "/usr/bin/braid",
        "/lib/systemd/system/braid@.service",
        "/etc/braid/README",
        "/usr/share/man/man1/braid.1.gz",
        "/usr/share/man/man1/braid-tunnel.1.gz",
        "/usr/share/man/man1/braid-status.1.gz",
        "/usr/share/bash-completion/completions/braid",
        "/usr/share/zsh/vendor-completions/_braid",
        "/usr/share/fish/vendor_completions.d/braid.fish",
        "/usr/share/doc/braid/install.md",
        "/usr/share/doc/braid/copyright",
    ] {
        assert!(has(path), "{path} not in the package:\n{list}");
    }
    // Every example config, and a man page for every subcommand.
    for e in std::fs::read_dir(repo().join("examples")).unwrap() {
        let n = e.unwrap().file_name().to_string_lossy().to_string();
        if n.ends_with(".toml") {
            assert!(
                has(&format!("/usr/share/doc/braid/examples/{n}")),
                "{n}:\n{list}"
            );
        }
    }
    let man = tmp("man");
    assert!(run(Command::new(BIN).arg("man").arg(&man)).status.success());
    for e in std::fs::read_dir(&man).unwrap() {
        let n = e.unwrap().file_name().to_string_lossy().to_string();
        assert!(
            has(&format!("/usr/share/man/man1/{n}.gz")),
            "{n}.gz:\n{list}"
        );
    }
    assert!(
        list.contains("-rwxr-xr-x 0/0"),
        "the binary is executable, owned by root"
    );

    let info = String::from_utf8(run(Command::new("dpkg-deb").arg("-I").arg(&deb)).stdout).unwrap();
    for want in [
        "Package: braid",
        &format!("Version: {version}-1"),
        "Section: net",
        "Depends: libc6",
        "postinst",
        "prerm",
        "postrm",
        "conffiles",
    ] {
        assert!(info.contains(want), "{want} not in dpkg-deb -I:\n{info}");
    }

    // What is inside: the binary runs and is the one built here; the unit is the
    // repository's; the completions and man page are those the binary makes.
    let x = tmp("extract");
    assert!(run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&x))
        .status
        .success());
    let v = run(Command::new(x.join("usr/bin/braid")).arg("--version"));
    assert!(v.status.success(), "{v:?}");
    let ours = run(Command::new(BIN).arg("--version")).stdout;
    assert_eq!(
        String::from_utf8_lossy(&v.stdout),
        String::from_utf8_lossy(&ours)
    );
    assert_eq!(
        std::fs::read_to_string(x.join("lib/systemd/system/braid@.service")).unwrap(),
        unit()
    );
    let bash = run(Command::new(BIN).args(["completions", "bash"])).stdout;
    assert_eq!(
        std::fs::read(x.join("usr/share/bash-completion/completions/braid")).unwrap(),
        bash
    );
    let page = run(Command::new("gzip")
        .arg("-dc")
        .arg(x.join("usr/share/man/man1/braid.1.gz")))
    .stdout;
    assert_eq!(page, std::fs::read(man.join("braid.1")).unwrap());
    for d in [out_dir, man, x] {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// dpkg's name for this machine's architecture.
fn arch() -> String {
    Command::new("dpkg")
        .arg("--print-architecture")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "amd64".into())
}
