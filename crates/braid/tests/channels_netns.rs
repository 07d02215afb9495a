//! Issue 30, item 3: a channel added or removed at run time, by a reload (SIGHUP),
//! without restarting the process. Two cases, each on real sockets in namespaces:
//!
//! * **Point to point.** Two tunnels bond two channels. One end's reload adds a third
//!   channel: its session starts a new run over three (a new handshake; the TUN device
//!   stays), and the bond goes on over the two the peer has. The other end's reload
//!   adds it too: the third joins the bond and carries data both ways (per-channel
//!   counters of `braid status --json`). Then it is removed again, one end after the
//!   other.
//! * **A client of a server.** The server lists three channels; its client starts
//!   with two (it is served over those two), and a reload at the client adds the third,
//!   then removes it: served without touching the server.
//!
//! All the while pings cross the tunnel every 20 ms and a TCP connection carries a
//! stream through it: the connection survives every change, the stream arrives whole,
//! and the pings lost are counted and bounded. Before, a reload that changed the
//! number of channels said it needed a restart and changed nothing (the test fails at
//! the first check that the running end has three channels). Needs root,
//! /dev/net/tun, `ip` and `ping`; without them the test says why it is skipped.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_io::keys;
use serde_json::Value;

mod common;
use common::{sh, status, Lab};

/// Run `f` on a thread in network namespace `ns` (sockets it makes stay there).
fn in_ns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let fd = std::fs::File::open(&path).unwrap();
        // SAFETY: a namespace file descriptor, for this thread alone.
        let r = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    })
}

/// The stream's byte at offset `i`.
fn pattern(i: u64) -> u8 {
    (i % 251) as u8
}

/// What the receiving end of the TCP stream saw: bytes, whether every byte was the
/// one expected, the longest wait between two reads, or the error that ended it.
struct Received {
    bytes: u64,
    whole: bool,
    longest_stall: Duration,
    error: Option<String>,
}

/// A TCP stream through the tunnel, from namespace `from` to `to_addr` (in `to`),
/// about 2 MB/s until `stop`.
struct Stream {
    /// The two namespaces (for the kernels' TCP counters if the stream breaks).
    ns: [String; 2],
    stop: Arc<AtomicBool>,
    sender: std::thread::JoinHandle<Result<u64, String>>,
    receiver: std::thread::JoinHandle<Received>,
}

impl Stream {
    fn start(from: &str, to: &str, to_addr: &str) -> Stream {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let addr = to_addr.to_string();
        let receiver = in_ns(to, move || {
            let l = TcpListener::bind(&addr).unwrap();
            ready_tx.send(()).unwrap();
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut r = Received {
                bytes: 0,
                whole: true,
                longest_stall: Duration::ZERO,
                error: None,
            };
            let mut buf = vec![0u8; 1 << 16];
            let mut last = Instant::now();
            loop {
                match s.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        for (k, b) in buf[..n].iter().enumerate() {
                            r.whole &= *b == pattern(r.bytes + k as u64);
                        }
                        r.bytes += n as u64;
                        r.longest_stall = r.longest_stall.max(last.elapsed());
                        last = Instant::now();
                    }
                    Err(e) => {
                        r.error = Some(e.to_string());
                        break;
                    }
                }
            }
            r
        });
        ready_rx.recv().unwrap();
        let addr = to_addr.to_string();
        let flag = stop.clone();
        let sender = in_ns(from, move || {
            let mut s = TcpStream::connect(&addr).map_err(|e| e.to_string())?;
            s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut sent = 0u64;
            let mut chunk = vec![0u8; 8192];
            while !flag.load(Ordering::Relaxed) {
                for (k, b) in chunk.iter_mut().enumerate() {
                    *b = pattern(sent + k as u64);
                }
                s.write_all(&chunk)
                    .map_err(|e| format!("after {sent} bytes: {e}"))?;
                sent += chunk.len() as u64;
                std::thread::sleep(Duration::from_millis(4));
            }
            s.shutdown(std::net::Shutdown::Write)
                .map_err(|e| e.to_string())?;
            Ok(sent)
        });
        Stream {
            ns: [from.to_string(), to.to_string()],
            stop,
            sender,
            receiver,
        }
    }

    /// Stop and check: every byte sent arrived, in order, with no stall over `limit`.
    fn finish(self, limit: Duration) {
        self.stop.store(true, Ordering::Relaxed);
        let sent = self.sender.join().unwrap();
        let r = self.receiver.join().unwrap();
        let sent = sent.unwrap_or_else(|e| {
            // What each end's kernel counted of resets and aborts.
            let counters: Vec<String> = self
                .ns
                .iter()
                .map(|n| {
                    let out = Command::new("ip")
                        .args(["netns", "exec", n, "nstat", "-az"])
                        .output()
                        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
                        .unwrap_or_default();
                    let lines: Vec<&str> = out
                        .lines()
                        .filter(|l| {
                            (l.contains("Rst") || l.contains("Reset") || l.contains("Abort"))
                                && l.split_whitespace().nth(1).is_none_or(|v| v != "0")
                        })
                        .collect();
                    format!("{n}: {}", lines.join("; "))
                })
                .collect();
            panic!(
                "the TCP stream broke: {e}; the receiver got {} bytes (whole: {}, error: {:?}, longest stall {:?}); TCP counters: {counters:?}",
                r.bytes, r.whole, r.error, r.longest_stall
            )
        });
        assert!(r.error.is_none(), "the TCP stream broke: {:?}", r.error);
        assert_eq!(r.bytes, sent, "bytes received");
        assert!(r.whole, "the stream arrived corrupted");
        eprintln!(
            "TCP stream: {sent} bytes whole across the changes; longest stall {:?}",
            r.longest_stall
        );
        assert!(
            r.longest_stall <= limit,
            "the TCP stream stalled for {:?}",
            r.longest_stall
        );
    }
}

/// Pings from `ns` to `to` every 20 ms, until stopped: (sent, answered).
struct Pings(Child);

impl Pings {
    fn start(ns: &str, to: &str) -> Pings {
        Pings(
            Command::new("ip")
                .args([
                    "netns", "exec", ns, "ping", "-n", "-q", "-i", "0.02", "-W", "1",
                ])
                .args(["-s", "1000", to])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }

    fn finish(self) -> (u32, u32) {
        // SIGINT: ping prints its summary.
        sh(&["kill", "-INT", &self.0.id().to_string()]);
        let out = self.0.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let num = |suffix: &str| -> u32 {
            text.split(", ")
                .flat_map(|p| p.split('\n'))
                .find(|p| p.ends_with(suffix))
                .and_then(|p| p.split_whitespace().next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no `{suffix}` in ping's summary: {text}"))
        };
        (num(" packets transmitted"), num(" received"))
    }
}

fn chan(s: &Value, i: usize) -> &Value {
    &s["channels"][i]
}

fn count(s: &Value) -> usize {
    s["channels"].as_array().map_or(0, Vec::len)
}

/// Poll `ctl`'s status until `done` holds; how long that took, or `None` after
/// `limit`.
fn until(
    ctl: &std::path::Path,
    limit: Duration,
    done: impl Fn(&Value) -> bool,
) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if status(ctl).is_some_and(|s| done(&s)) {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// The first `n` channels up, the others not (the peer lacks them, or they are gone).
fn up(s: &Value, n: usize) -> bool {
    (0..count(s)).all(|i| (chan(s, i)["state"] == "up") == (i < n))
}

/// Sending over exactly the first `n` channels (the direction of the TCP stream; the
/// other direction, which carries its acknowledgements, may ride one channel alone:
/// the return path).
fn sends_over(s: &Value, n: usize) -> bool {
    up(s, n) && (0..count(s)).all(|i| chan(s, i)["in_tx_set"] == (i < n))
}

/// Receiving over exactly the first `n` channels.
fn receives_over(s: &Value, n: usize) -> bool {
    up(s, n) && (0..count(s)).all(|i| chan(s, i)["in_rx_set"] == (i < n))
}

fn data_packets(s: &Value, i: usize) -> (u64, u64) {
    let c = chan(s, i);
    (
        c["tx_data_packets"].as_u64().unwrap_or(0),
        c["rx_data_packets"].as_u64().unwrap_or(0),
    )
}

/// Rewrite `file` as `text` and reload the tunnel `child` (SIGHUP).
fn reload(file: &std::path::Path, text: &str, child: &Child) {
    common::write_private(file, text);
    sh(&["kill", "-HUP", &child.id().to_string()]);
}

fn skip_reason() -> Option<String> {
    common::netns_skip_reason(
        "network namespaces, TUN devices",
        &[("ip", "iproute2"), ("ping", "iputils-ping")],
        None,
    )
}

/// Two namespaces joined by one veth pair (10.235.0.1 and .2), IPv6 off.
fn two_namespaces(lab: &mut Lab, a: &str, b: &str, id: u32) {
    lab.add_ns(a);
    lab.add_ns(b);
    for n in [a, b] {
        for k in ["all", "default"] {
            let key = format!("net.ipv6.conf.{k}.disable_ipv6=1");
            sh(&["ip", "netns", "exec", n, "sysctl", "-qw", &key]);
        }
    }
    common::veth(
        a,
        &format!("chanset{id}a"),
        "10.235.0.1/24",
        b,
        &format!("chanset{id}b"),
        "10.235.0.2/24",
    );
}

/// The interface index of device `dev` in namespace `ns`.
fn tun_index(ns: &str, dev: &str) -> String {
    let out = Command::new("ip")
        .args(["-n", ns, "-o", "link", "show", "dev", dev])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let index = text.split(':').next().unwrap_or("").trim().to_string();
    assert!(!index.is_empty(), "no device {dev} in {ns}: {text}");
    index
}

/// Stop a tunnel with SIGTERM and return its log.
fn log_of(mut child: Child) -> String {
    sh(&["kill", "-TERM", &child.id().to_string()]);
    let _ = child.try_wait();
    String::from_utf8_lossy(&child.wait_with_output().unwrap().stderr).to_string()
}

/// Pings lost across the changes: each of the `changes` reloads costs at most a
/// new handshake (a round trip on the veth) and what was in flight; 5 pings (100 ms)
/// each is far above what it costs and far below a restart's.
const LOST_PER_CHANGE: u32 = 5;

#[test]
fn a_channel_added_and_removed_by_reloads_at_both_ends_of_a_tunnel() {
    let test = "a_channel_added_and_removed_by_reloads_at_both_ends_of_a_tunnel";
    if let Some(why) = skip_reason() {
        common::skip(test, &why);
        return;
    }
    let id = std::process::id() % 10_000;
    let (ns_a, ns_b) = (format!("chanset{id}pa"), format!("chanset{id}pb"));
    let mut lab = Lab::new(std::env::temp_dir().join(format!("braid-chanset-p2p-{id}")));
    two_namespaces(&mut lab, &ns_a, &ns_b, id);
    let (ctl_a, ctl_b) = (lab.dir.join("a.sock"), lab.dir.join("b.sock"));
    let (file_a, file_b) = (lab.dir.join("a.toml"), lab.dir.join("b.toml"));
    // End `end` (0: a, 1: b) with `n` channels; channel k on ports 7001+k (a) and
    // 7101+k (b).
    let config = |end: usize, n: usize| {
        let (me, peer) = if end == 0 { (1, 2) } else { (2, 1) };
        let ctl = if end == 0 { &ctl_a } else { &ctl_b };
        let mut s = format!(
            "[tunnel]\nname = \"chanset{id}t{end}\"\naddress = \"10.94.0.{me}/24\"\ncontrol = \"{}\"\n\n[session]\nkey = \"AyHDMTOweHmwGSs7vubt5lmmRKjx62UXkWxeQzJRXms=\"\n",
            ctl.display()
        );
        let port = |e: usize, k: usize| if e == 0 { 7001 + k } else { 7101 + k };
        for k in 0..n {
            s += &format!(
                "\n[[channel]]\nname = \"c{k}\"\nlocal = \"10.235.0.{me}:{}\"\nremote = \"10.235.0.{peer}:{}\"\n",
                port(end, k),
                port(1 - end, k)
            );
        }
        s
    };
    common::write_private(&file_a, &config(0, 2));
    common::write_private(&file_b, &config(1, 2));
    lab.children.push(common::start_tunnel(&ns_a, &file_a));
    lab.children.push(common::start_tunnel(&ns_b, &file_b));
    let started = until(&ctl_a, Duration::from_secs(10), |s| up(s, 2)).and(until(
        &ctl_b,
        Duration::from_secs(5),
        |s| up(s, 2),
    ));
    assert!(
        started.is_some(),
        "the bond did not come up: {:?}",
        status(&ctl_a)
    );
    common::ping_until(&ns_a, "10.94.0.2", Duration::from_secs(3));

    let tun_a = tun_index(&ns_a, &format!("chanset{id}t0"));
    let tun_b = tun_index(&ns_b, &format!("chanset{id}t1"));
    let pings = Pings::start(&ns_a, "10.94.0.2");
    let stream = Stream::start(&ns_a, &ns_b, "10.94.0.2:5001");
    std::thread::sleep(Duration::from_millis(500));

    // A reload whose new channel cannot be bound (an address not configured here)
    // changes nothing, and says why.
    let bad = config(0, 3).replace("10.235.0.1:7003", "10.235.9.1:7003");
    reload(&file_a, &bad, &lab.children[0]);
    std::thread::sleep(Duration::from_millis(300));
    let a = status(&ctl_a).unwrap();
    assert!(count(&a) == 2 && sends_over(&a, 2), "{a}");

    // A adds a third channel; B has two: the bond goes on over two.
    reload(&file_a, &config(0, 3), &lab.children[0]);
    let t0 = Instant::now();
    let three = until(&ctl_a, Duration::from_secs(3), |s| {
        count(s) == 3 && s["peer_seen"] == true
    });
    assert!(
        three.is_some(),
        "A did not take a third channel by a reload: {:?}",
        status(&ctl_a)
    );
    let over_two = until(&ctl_a, Duration::from_secs(3), |s| sends_over(s, 2)).and(until(
        &ctl_b,
        Duration::from_secs(3),
        |s| receives_over(s, 2),
    ));
    assert!(over_two.is_some(), "{:?}", status(&ctl_a));
    eprintln!(
        "A's reload to three channels: bonded over the two both have after {:?}",
        t0.elapsed()
    );
    std::thread::sleep(Duration::from_millis(500));
    let a = status(&ctl_a).unwrap();
    assert_eq!(
        data_packets(&a, 2),
        (0, 0),
        "data on the channel B lacks: {a}"
    );

    // B adds it too: all three carry data.
    reload(&file_b, &config(1, 3), &lab.children[1]);
    let t0 = Instant::now();
    let joined = until(&ctl_a, Duration::from_secs(5), |s| sends_over(s, 3)).and(until(
        &ctl_b,
        Duration::from_secs(2),
        |s| receives_over(s, 3),
    ));
    assert!(
        joined.is_some(),
        "the third channel did not join: A {:?}\nB {:?}",
        status(&ctl_a),
        status(&ctl_b)
    );
    eprintln!(
        "B's reload to three channels: all three in both ends' sets after {:?}",
        t0.elapsed()
    );
    std::thread::sleep(Duration::from_secs(1));
    let (a, b) = (status(&ctl_a).unwrap(), status(&ctl_b).unwrap());
    for i in 0..3 {
        let (tx_a, rx_a) = data_packets(&a, i);
        let (tx_b, rx_b) = data_packets(&b, i);
        eprintln!("channel {i}: A sent {tx_a} data packets, received {rx_a}; B sent {tx_b}, received {rx_b}");
        assert!(
            tx_a > 50 && rx_b > 50,
            "channel {i} carries little of A's traffic: A {a}\nB {b}"
        );
    }

    // Removed again: A first, then B.
    reload(&file_a, &config(0, 2), &lab.children[0]);
    let two = until(&ctl_a, Duration::from_secs(3), |s| {
        count(s) == 2 && sends_over(s, 2)
    });
    assert!(two.is_some(), "{:?}", status(&ctl_a));
    let b_two = until(&ctl_b, Duration::from_secs(3), |s| {
        receives_over(s, 2) && chan(s, 2)["in_tx_set"] == false
    });
    assert!(
        b_two.is_some(),
        "B still stripes on the removed channel: {:?}",
        status(&ctl_b)
    );
    std::thread::sleep(Duration::from_millis(500));
    reload(&file_b, &config(1, 2), &lab.children[1]);
    let b_two = until(&ctl_b, Duration::from_secs(3), |s| {
        count(s) == 2 && receives_over(s, 2)
    });
    assert!(b_two.is_some(), "{:?}", status(&ctl_b));
    assert!(until(&ctl_a, Duration::from_secs(3), |s| sends_over(s, 2)).is_some());
    std::thread::sleep(Duration::from_millis(500));
    let (a, b) = (status(&ctl_a).unwrap(), status(&ctl_b).unwrap());
    for i in 0..2 {
        assert!(
            data_packets(&a, i).0 > 0 && data_packets(&b, i).1 > 0,
            "A {a}\nB {b}"
        );
    }

    // A channel renamed (a name is local to each end): the same way, a new run.
    reload(
        &file_a,
        &config(0, 2).replace("name = \"c1\"", "name = \"lte\""),
        &lab.children[0],
    );
    let renamed = until(&ctl_a, Duration::from_secs(3), |s| {
        chan(s, 1)["name"] == "lte" && sends_over(s, 2)
    });
    assert!(renamed.is_some(), "{:?}", status(&ctl_a));
    std::thread::sleep(Duration::from_millis(300));

    // The TUN devices stayed (the same interfaces, not ones made anew).
    assert_eq!(
        tun_a,
        tun_index(&ns_a, &format!("chanset{id}t0")),
        "A's TUN device"
    );
    assert_eq!(
        tun_b,
        tun_index(&ns_b, &format!("chanset{id}t1")),
        "B's TUN device"
    );
    let (sent, answered) = pings.finish();
    stream.finish(Duration::from_millis(1500));
    let lost = sent - answered;
    eprintln!("pings: {answered} of {sent} answered across five reloads");
    assert!(sent > 150, "{sent} pings sent");
    assert!(lost <= 5 * LOST_PER_CHANGE, "{lost} of {sent} pings lost");

    // The logs say what each reload did, and the TUN device stayed.
    let log_b = log_of(lab.children.pop().unwrap());
    let log_a = log_of(lab.children.pop().unwrap());
    for (log, who) in [(&log_a, "A"), (&log_b, "B")] {
        assert!(
            log.contains("reload: channels 2 -> 3, added or bound anew: 2 (c2) bound at 10.235.0."),
            "{who}: {log}"
        );
        assert!(
            log.contains("reload: channels 3 -> 2, removed: 2 (c2) (socket closed)"),
            "{who}: {log}"
        );
        assert!(!log.contains("panicked"), "{who}: {log}");
    }
    assert!(
        log_a.contains("the peer's run has 2 channels and ours 3"),
        "{log_a}"
    );
    assert!(
        log_a.contains("reload: channels 2 -> 2, changed: 1 (c1 -> lte)"),
        "{log_a}"
    );
    assert!(
        log_a.contains("reload: the channel list was not changed: channel 2 (c2): cannot bind local address 10.235.9.1:7003"),
        "{log_a}"
    );
}

#[test]
fn a_client_adds_and_removes_a_channel_by_a_reload_and_its_server_serves_it() {
    let test = "a_client_adds_and_removes_a_channel_by_a_reload_and_its_server_serves_it";
    if let Some(why) = skip_reason() {
        common::skip(test, &why);
        return;
    }
    let id = std::process::id() % 10_000;
    let (ns_s, ns_c) = (format!("chanset{id}ss"), format!("chanset{id}sc"));
    let mut lab = Lab::new(std::env::temp_dir().join(format!("braid-chanset-srv-{id}")));
    two_namespaces(&mut lab, &ns_s, &ns_c, id);
    let (ks, kc) = (keys::generate().unwrap(), keys::generate().unwrap());
    let public = |k: &[u8; 32]| keys::encode(&keys::public_key(k));
    common::write_private(&lab.dir.join("s.key"), &keys::encode(&ks));
    common::write_private(&lab.dir.join("c.key"), &keys::encode(&kc));
    let (ctl_s, ctl_c) = (lab.dir.join("s.sock"), lab.dir.join("c.sock"));
    let (file_s, file_c) = (lab.dir.join("s.toml"), lab.dir.join("c.toml"));
    // The server lists three channels; its clients may have fewer.
    let mut server = format!(
        "[tunnel]\nname = \"chanset{id}ts\"\naddress = \"10.95.0.1/16\"\ncontrol = \"{}\"\n\n[session]\nprivate_key_file = \"s.key\"\n",
        ctl_s.display()
    );
    for k in 0..3 {
        server += &format!(
            "\n[[channel]]\nname = \"c{k}\"\nlocal = \"0.0.0.0:{}\"\n",
            7100 + k
        );
    }
    server += &format!(
        "\n[[peer]]\nname = \"site\"\npublic_key = \"{}\"\nallowed_ips = [\"10.95.1.0/24\"]\n",
        public(&kc)
    );
    let client = |n: usize| {
        let mut s = format!(
            "[tunnel]\nname = \"chanset{id}tc\"\naddress = \"10.95.1.2/16\"\ncontrol = \"{}\"\n\n[session]\nprivate_key_file = \"c.key\"\npeer_public_key = \"{}\"\n",
            ctl_c.display(),
            public(&ks)
        );
        for k in 0..n {
            s += &format!(
                "\n[[channel]]\nname = \"c{k}\"\nremote = \"10.235.0.1:{}\"\n",
                7100 + k
            );
        }
        s
    };
    common::write_private(&file_s, &server);
    common::write_private(&file_c, &client(2));
    lab.children.push(common::start_tunnel(&ns_s, &file_s));
    lab.children.push(common::start_tunnel(&ns_c, &file_c));
    let served = |s: &Value| s["peers"][0]["session"].clone();
    let started = until(&ctl_c, Duration::from_secs(10), |s| up(s, 2)).and(until(
        &ctl_s,
        Duration::from_secs(5),
        |s| up(&served(s), 2),
    ));
    assert!(
        started.is_some(),
        "a two-channel client of a three-channel server did not come up: client {:?}\nserver {:?}",
        status(&ctl_c),
        status(&ctl_s)
    );
    common::ping_until(&ns_c, "10.95.0.1", Duration::from_secs(3));
    let pings = Pings::start(&ns_c, "10.95.0.1");
    let stream = Stream::start(&ns_c, &ns_s, "10.95.0.1:5002");
    std::thread::sleep(Duration::from_millis(500));

    // The client adds its third channel, and in the same reload gives its first twice
    // the weight: the new run's handshake carries the weights the server's session
    // has, and the new one applies on top (the server follows through the markers).
    let heavier = client(3).replacen("name = \"c0\"\n", "name = \"c0\"\nweight = 2\n", 1);
    reload(&file_c, &heavier, &lab.children[1]);
    let t0 = Instant::now();
    let joined = until(&ctl_c, Duration::from_secs(5), |s| {
        count(s) == 3 && sends_over(s, 3)
    })
    .and(until(&ctl_s, Duration::from_secs(3), |s| {
        receives_over(&served(s), 3)
    }));
    assert!(
        joined.is_some(),
        "the client's third channel was not served: client {:?}\nserver {:?}",
        status(&ctl_c),
        status(&ctl_s)
    );
    eprintln!(
        "the client's reload to three channels: all three in both ends' sets after {:?}",
        t0.elapsed()
    );
    std::thread::sleep(Duration::from_secs(1));
    let (c, s) = (status(&ctl_c).unwrap(), served(&status(&ctl_s).unwrap()));
    for i in 0..3 {
        let (tx_c, rx_c) = data_packets(&c, i);
        let (tx_s, rx_s) = data_packets(&s, i);
        eprintln!("channel {i}: the client sent {tx_c} data packets, received {rx_c}; the server sent {tx_s}, received {rx_s}");
        assert!(
            tx_c > 50 && rx_s > 50,
            "channel {i}: client {c}\nserver {s}"
        );
    }
    let quantum = |i: usize| chan(&c, i)["quantum"].as_u64().unwrap_or(0);
    assert_eq!(quantum(0), 2 * quantum(1), "{c}");

    // And removes it.
    reload(&file_c, &client(2), &lab.children[1]);
    let two = until(&ctl_c, Duration::from_secs(3), |s| {
        count(s) == 2 && sends_over(s, 2)
    })
    .and(until(&ctl_s, Duration::from_secs(3), |s| {
        receives_over(&served(s), 2)
    }));
    assert!(
        two.is_some(),
        "client {:?}\nserver {:?}",
        status(&ctl_c),
        status(&ctl_s)
    );
    std::thread::sleep(Duration::from_millis(500));

    let (sent, answered) = pings.finish();
    stream.finish(Duration::from_millis(1500));
    let lost = sent - answered;
    eprintln!("pings: {answered} of {sent} answered across two reloads");
    assert!(sent > 80, "{sent} pings sent");
    assert!(lost <= 2 * LOST_PER_CHANGE, "{lost} of {sent} pings lost");
    let log_c = log_of(lab.children.pop().unwrap());
    assert!(log_c.contains("reload: channels 2 -> 3"), "{log_c}");
    assert!(log_c.contains("; channel weights [2, 1, 1]; "), "{log_c}");
    assert!(log_c.contains("reload: channels 3 -> 2"), "{log_c}");
    let log_s = log_of(lab.children.pop().unwrap());
    assert!(
        !log_s.contains("panicked") && !log_c.contains("panicked"),
        "{log_s}"
    );
}
