//! Two `braid` processes joined over loopback through the test relay, shared by the
//! CLI tests of `bench` and `send`/`recv`.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use braid_io::relay::Relay;

pub const BIN: &str = env!("CARGO_BIN_EXE_braid");

/// A path in the temporary directory, unique to this test process.
pub fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("braid-test-{}-{name}", std::process::id()))
}

/// `n` loopback UDP ports that were free a moment ago.
fn ports(n: usize) -> Vec<u16> {
    let socks: Vec<_> = (0..n)
        .map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    socks
        .iter()
        .map(|s| s.local_addr().unwrap().port())
        .collect()
}

/// A fresh key file for one pair of ends. Each call gets its own file: the tests run in
/// parallel threads of one process, and a shared path let one test overwrite the key
/// between the two ends of another (their handshake then never completed).
fn key_file() -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let p = tmp(&format!("key-{}", NEXT.fetch_add(1, Ordering::Relaxed)));
    let out = Command::new(BIN).arg("genkey").output().unwrap();
    assert!(out.status.success());
    std::fs::write(&p, &out.stdout).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// The relay over `n` channels and each end's session arguments (`--channel` per
/// channel and `--key-file`).
pub fn ends(n: usize) -> (Relay, Vec<String>, Vec<String>) {
    let relay = Relay::new(n).unwrap();
    let (pa, pb) = (ports(n), ports(n));
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for c in 0..n {
        let la = format!("127.0.0.1:{}", pa[c]).parse().unwrap();
        let lb = format!("127.0.0.1:{}", pb[c]).parse().unwrap();
        relay.set_ends(c, la, lb);
        a.extend(["--channel".into(), format!("{la},{}", relay.a_side(c))]);
        b.extend(["--channel".into(), format!("{lb},{}", relay.b_side(c))]);
    }
    let key = key_file();
    for v in [&mut a, &mut b] {
        v.extend(["--key-file".into(), key.to_str().unwrap().to_string()]);
    }
    (relay, a, b)
}
