//! `braid send` and `braid recv` as processes on loopback, two channels through the
//! test relay: a file arrives bit-identical, and a stdin-to-stdout pipe does too, with
//! the JSON summary on stderr; bad arguments fail with a clear message. Outputs are
//! compared byte for byte with the inputs.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod loopback;
use loopback::{ends, tmp, BIN};

fn data(n: usize) -> Vec<u8> {
    let mut r = braid_proto::rng::SplitMix64::new(n as u64);
    (0..n).map(|_| r.next_u64() as u8).collect()
}

#[test]
fn file_to_file() {
    let (_relay, a, b) = ends(2);
    let (src, dst) = (tmp("in.bin"), tmp("out.bin"));
    let input = data(3 << 20);
    std::fs::write(&src, &input).unwrap();
    let t0 = Instant::now();
    let recv = Command::new(BIN)
        .arg("recv")
        .args(&b)
        .arg(&dst)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let send = Command::new(BIN)
        .arg("send")
        .args(&a)
        .arg(&src)
        .output()
        .unwrap();
    let recv = recv.wait_with_output().unwrap();
    let (se, re) = (
        String::from_utf8_lossy(&send.stderr),
        String::from_utf8_lossy(&recv.stderr),
    );
    assert!(send.status.success() && recv.status.success(), "{se}\n{re}");
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert!(
        std::fs::read(&dst).unwrap() == input,
        "output differs from input"
    );
    assert!(se.contains("the receiver has everything"), "{se}");
    assert!(
        re.contains("complete") && re.contains("latency p50"),
        "{re}"
    );
    let _ = std::fs::remove_file(src);
    let _ = std::fs::remove_file(dst);
}

#[test]
fn stdin_to_stdout_with_json_summary() {
    let (_relay, a, b) = ends(2);
    let input = data(1 << 20);
    let recv = Command::new(BIN)
        .arg("recv")
        .args(&b)
        .args(["--json", "-"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut send = Command::new(BIN)
        .arg("send")
        .args(&a)
        .args(["--tolerance", "100,0,0", "--deadline", "5s", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Drain the receiver's stdout while feeding the sender's stdin.
    let recv = std::thread::spawn(move || recv.wait_with_output().unwrap());
    let mut stdin = send.stdin.take().unwrap();
    // Written in pieces with pauses, like a live source.
    for piece in input.chunks(64 << 10) {
        stdin.write_all(piece).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(stdin);
    let send = send.wait_with_output().unwrap();
    let recv = recv.join().unwrap();
    let re = String::from_utf8_lossy(&recv.stderr);
    assert!(
        send.status.success(),
        "{}",
        String::from_utf8_lossy(&send.stderr)
    );
    assert!(recv.status.success(), "{re}");
    assert!(recv.stdout == input, "stdout differs from stdin");
    let line = re
        .lines()
        .rfind(|l| l.starts_with('{'))
        .expect("JSON summary");
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["bytes"], input.len() as u64);
    assert_eq!(v["complete"], true);
    assert_eq!(v["tolerance"], serde_json::json!([100, 0, 0]));
    assert_eq!(v["deadline_ms"], 5000.0);
    assert!(v["latency_ms"]["p99"].as_f64().unwrap() > 0.0);
}

#[test]
fn bad_arguments_fail_clearly() {
    let (_relay, a, _) = ends(2);
    let run = |extra: &[&str]| {
        let out = Command::new(BIN)
            .arg("send")
            .args(&a)
            .args(extra)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    assert!(run(&["--tolerance", "8,1", "-"]).contains("--tolerance: '8,1' is not a tolerance"));
    assert!(run(&["--tolerance", "8,9,1", "-"]).contains("cannot exceed W"));
    assert!(run(&["--deadline", "soon", "-"]).contains("--deadline"));
    assert!(run(&["/nonexistent/file"]).contains("cannot open input '/nonexistent/file'"));
    let e = run(&["--peer-timeout", "300ms", "/dev/null"]);
    assert!(e.contains("the peer never answered"), "{e}");
    assert!(!e.contains("panicked"));
}
