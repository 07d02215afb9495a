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

/// `braid recv ARGS.. OUT` at `b`, then `braid send SRC` at `a`: both outputs.
fn send_file(
    a: &[String],
    src: &std::path::Path,
    b: &[String],
    recv_args: &[&str],
    out: &std::path::Path,
) -> (std::process::Output, std::process::Output) {
    let recv = Command::new(BIN)
        .arg("recv")
        .args(b)
        .args(recv_args)
        .arg(out)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let send = Command::new(BIN)
        .arg("send")
        .args(a)
        .arg(src)
        .output()
        .unwrap();
    (send, recv.wait_with_output().unwrap())
}

#[test]
fn file_to_file() {
    let (_relay, a, b) = ends(2);
    let (src, dst) = (tmp("in.bin"), tmp("out.bin"));
    let input = data(3 << 20);
    std::fs::write(&src, &input).unwrap();
    let t0 = Instant::now();
    // With the progress line, the receiver outlives the sender by more than the
    // channels' dead_after: it used to warn of them going down.
    let (send, recv) = send_file(&a, &src, &b, &["--progress"], &dst);
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
    // A clean end at both ends: the sender closed on purpose and said so.
    assert!(re.contains("peer closed the session"), "{re}");
    assert!(!re.contains("WARN") && !se.contains("WARN"), "{se}\n{re}");
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

/// A fresh, empty folder for one test's output files.
fn folder(name: &str) -> std::path::PathBuf {
    let d = tmp(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir(&d).unwrap();
    d
}

/// The names in a folder, sorted.
fn names(d: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// `braid recv OUT` checks before it touches OUT: an existing file is kept unless
/// --force is given, and a run that fails before any data arrives (no sender, port in
/// use, missing key) leaves the folder exactly as it was, with an error naming what
/// failed. Before the fix OUT was truncated (or created empty) first.
#[test]
fn recv_changes_nothing_on_disk_when_it_fails_early() {
    let (_relay, _, b) = ends(1);
    let dir = folder("recv-early");
    let out = dir.join("out.bin");
    std::fs::write(&out, b"precious").unwrap();
    let recv = |args: &[&str], target: &std::path::Path| {
        let o = Command::new(BIN)
            .arg("recv")
            .args(args)
            .arg(target)
            .output()
            .unwrap();
        assert!(!o.status.success());
        let e = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(!e.contains("panicked"), "{e}");
        e
    };
    let b: Vec<&str> = b.iter().map(String::as_str).collect();
    let quick = [&b[..], &["--peer-timeout", "300ms"]].concat();

    let e = recv(&quick, &out);
    assert!(
        e.contains("exists and is kept") && e.contains("--force"),
        "{e}"
    );
    let e = recv(&[&quick[..], &["--force"]].concat(), &out);
    assert!(e.contains("the peer never answered"), "{e}");
    let e = recv(&quick, &dir.join("new.bin"));
    assert!(e.contains("the peer never answered"), "{e}");
    let e = recv(
        &[
            "--channel",
            "127.0.0.1:1,127.0.0.1:2",
            "--key-file",
            "/nonexistent/key",
        ],
        &dir.join("new.bin"),
    );
    assert!(
        e.contains("--key-file") && e.contains("/nonexistent/key"),
        "{e}"
    );
    let busy = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let ch = format!("{},127.0.0.1:9", busy.local_addr().unwrap());
    let key = b[b.iter().position(|x| *x == "--key-file").unwrap() + 1];
    let e = recv(&["--channel", &ch, "--key-file", key, "--force"], &out);
    assert!(e.contains("cannot bind") && e.contains("already"), "{e}");
    let e = recv(&quick, &dir.join("nowhere/new.bin"));
    assert!(e.contains("nowhere"), "{e}");

    assert_eq!(names(&dir), ["out.bin"], "a failed run left files behind");
    assert_eq!(std::fs::read(&out).unwrap(), b"precious");
    let _ = std::fs::remove_dir_all(dir);
}

/// With --force an existing file is replaced, by the whole stream, and no temporary
/// file stays beside it.
#[test]
fn recv_force_replaces_a_file_when_complete() {
    let (_relay, a, b) = ends(2);
    let dir = folder("recv-force");
    let (src, out) = (tmp("force-in.bin"), dir.join("out.bin"));
    let input = data(1 << 20);
    std::fs::write(&src, &input).unwrap();
    std::fs::write(&out, b"old contents").unwrap();
    let (send, recv) = send_file(&a, &src, &b, &["--force"], &out);
    assert!(
        send.status.success() && recv.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&send.stderr),
        String::from_utf8_lossy(&recv.stderr)
    );
    assert!(
        std::fs::read(&out).unwrap() == input,
        "output differs from input"
    );
    assert_eq!(names(&dir), ["out.bin"]);
    let _ = std::fs::remove_file(src);
    let _ = std::fs::remove_dir_all(dir);
}

/// A transfer that fails after data arrived (the sender is killed mid-stream) leaves
/// neither OUT nor the temporary file it was writing: the data went to
/// `.out.bin.XXXXXX.part` beside OUT, never to OUT itself.
#[test]
fn recv_failed_midway_leaves_no_partial_file() {
    let (_relay, a, b) = ends(2);
    let dir = folder("recv-midway");
    let out = dir.join("out.bin");
    let recv = Command::new(BIN)
        .arg("recv")
        .args(&b)
        .args(["--peer-timeout", "1s"])
        .arg(&out)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut send = Command::new(BIN)
        .arg("send")
        .args(&a)
        .arg("-")
        .stdin(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = send.stdin.take().unwrap();
    stdin.write_all(&data(1 << 20)).unwrap();
    // Wait until the receiver is writing (its temporary file holds data), then kill
    // the sender with the stream unfinished (its stdin is still open).
    let t0 = Instant::now();
    let part = loop {
        let part = names(&dir).into_iter().find(|n| n.ends_with(".part"));
        if let Some(p) = part.filter(|p| std::fs::metadata(dir.join(p)).unwrap().len() > 0) {
            break p;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no data arrived");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(part.starts_with(".out.bin."), "{part}");
    assert!(!out.exists(), "OUT written before the transfer completed");
    send.kill().unwrap();
    send.wait().unwrap();
    drop(stdin);
    let recv = recv.wait_with_output().unwrap();
    let re = String::from_utf8_lossy(&recv.stderr);
    assert!(!recv.status.success(), "{re}");
    assert!(
        re.contains("was not created") && re.contains("sender"),
        "{re}"
    );
    assert!(names(&dir).is_empty(), "left behind: {:?}", names(&dir));
    let _ = std::fs::remove_dir_all(dir);
}
