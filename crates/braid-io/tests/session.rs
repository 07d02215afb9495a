//! Two sessions in one process, joined through a loopback relay per channel.

use std::time::Duration;

use braid_io::relay::{Relay, Side};
use braid_io::{ChannelConfig, Session, SessionConfig};
use braid_proto::{Mode, SchedulerKind};
use bytes::Bytes;

fn cfgs(relay: &Relay, n: usize, mode: Mode) -> (SessionConfig, SessionConfig) {
    let any = "127.0.0.1:0".parse().unwrap();
    let a: Vec<_> = (0..n)
        .map(|c| ChannelConfig::new(format!("c{c}"), any, relay.a_side(c)))
        .collect();
    let b: Vec<_> = (0..n)
        .map(|c| ChannelConfig::new(format!("c{c}"), any, relay.b_side(c)))
        .collect();
    let mut ca = SessionConfig::new(a, "a braid-io test key of 32 bytes or more");
    let mut cb = SessionConfig::new(b, "a braid-io test key of 32 bytes or more");
    for c in [&mut ca, &mut cb] {
        c.core.mode = mode;
        c.core.heartbeat = braid_proto::Duration::from_millis(20);
        c.core.dead_after = braid_proto::Duration::from_millis(120);
        c.core.rejoin_after = braid_proto::Duration::from_millis(60);
        c.core.receiver.max_wait = braid_proto::Duration::from_millis(50);
    }
    (ca, cb)
}

async fn pair(n: usize, mode: Mode) -> (Relay, Session, Session) {
    pair_with(n, mode, SchedulerKind::Srr).await
}

async fn pair_with(n: usize, mode: Mode, scheduler: SchedulerKind) -> (Relay, Session, Session) {
    let relay = Relay::new(n).unwrap();
    let (mut ca, mut cb) = cfgs(&relay, n, mode);
    ca.core.scheduler = scheduler;
    cb.core.scheduler = scheduler;
    let mut a = Session::start(ca).await.unwrap();
    let mut b = Session::start(cb).await.unwrap();
    for c in 0..n {
        relay.set_ends(c, a.local_addrs()[c], b.local_addrs()[c]);
    }
    a.wait_for_peer(Duration::from_secs(5)).await.unwrap();
    b.wait_for_peer(Duration::from_secs(5)).await.unwrap();
    (relay, a, b)
}

fn msg(i: u64, size: usize) -> Bytes {
    let mut v = vec![0x45u8; size.max(9)];
    v[1..9].copy_from_slice(&i.to_be_bytes());
    Bytes::from(v)
}

fn id(b: &Bytes) -> u64 {
    u64::from_be_bytes(b[1..9].try_into().unwrap())
}

/// Send `count` messages paced in bursts; collect what arrives.
async fn stream(a: &Session, b: &mut Session, from: u64, count: u64) -> Vec<u64> {
    stream_paced(a, b, from, count, 50).await
}

/// Like `stream`, with a 2 ms pause every `burst` messages.
async fn stream_paced(a: &Session, b: &mut Session, from: u64, count: u64, burst: u64) -> Vec<u64> {
    let tx = a.sender();
    let sizes = [1200usize, 64, 700, 1400, 300];
    let send = tokio::spawn(async move {
        for i in from..from + count {
            tx.send(msg(i, sizes[(i % 5) as usize])).await.unwrap();
            if i % burst == 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    });
    let mut got = Vec::new();
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(500), b.recv()).await {
        got.push(id(&m));
    }
    send.await.unwrap();
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_channels_deliver_everything_in_order() {
    for mode in [Mode::Logical, Mode::Seq, Mode::Trr] {
        let (_relay, a, mut b) = pair(3, mode).await;
        let got = stream(&a, &mut b, 0, 20_000).await;
        assert_eq!(got.len(), 20_000, "{mode:?}: all delivered");
        assert!(
            got.windows(2).all(|w| w[1] == w[0] + 1),
            "{mode:?}: in order"
        );
        let sa = a.stats().await.unwrap();
        let sb = b.stats().await.unwrap();
        assert_eq!(sa.sent_packets, 20_000);
        assert_eq!(sb.delivered_packets, 20_000);
        // Every channel carried a share.
        for c in &sb.channels {
            assert!(c.rx_data_packets > 2_000, "{mode:?}: {c:?}");
            assert_eq!(c.state, "up");
        }
        assert_eq!(sb.auth_failures + sb.replays, 0);
        if mode != Mode::Trr {
            assert!(sb.channels.iter().all(|c| c.rx_markers > 0));
        }
        a.close().await;
        b.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_and_rejoin_without_duplicates() {
    let (relay, a, mut b) = pair(3, Mode::Logical).await;
    let first = stream(&a, &mut b, 0, 3_000).await;
    assert_eq!(first.len(), 3_000);

    relay.silence(1, true);
    // Keep sending through the failure.
    let during = stream_paced(&a, &mut b, 3_000, 6_000, 20).await;
    let sa = a.stats().await.unwrap();
    let sb = b.stats().await.unwrap();
    assert!(sa.tx_epoch >= 1, "a switched epochs: {}", sa.table());
    assert!(
        !sa.channels[1].in_tx_set,
        "channel 1 left the set: {}",
        sa.table()
    );
    assert!(sa.channels[0].in_tx_set && sa.channels[2].in_tx_set);
    assert_eq!(sb.channels[1].state, "down", "{}", sb.table());
    assert!(sb.channels[1].state_changes >= 1);
    assert!(!sa.channels[1].peer_hears_us);
    // No duplicates, nothing out of order, and the tail after the switch all arrived.
    assert!(
        during.windows(2).all(|w| w[1] > w[0]),
        "strictly increasing"
    );
    let tail: Vec<u64> = (8_000..9_000).collect();
    assert!(
        tail.iter().all(|t| during.contains(t)),
        "traffic continues on 2 channels: got {} of 6000, {}",
        during.len(),
        sb.table()
    );

    relay.silence(1, false);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let after = stream(&a, &mut b, 9_000, 3_000).await;
    assert_eq!(after.len(), 3_000, "all delivered after rejoin");
    assert!(after.windows(2).all(|w| w[1] == w[0] + 1));
    let sa = a.stats().await.unwrap();
    let sb = b.stats().await.unwrap();
    assert!(
        sa.channels[1].in_tx_set,
        "channel 1 rejoined: {}",
        sa.table()
    );
    assert!(sa.tx_epoch >= 2);
    assert_eq!(sb.channels[1].state, "up");
    assert!(sb.channels[1].rx_data_packets > 0);
    // Down to a single channel: the session keeps running.
    relay.silence(0, true);
    relay.silence(2, true);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let one = stream_paced(&a, &mut b, 12_000, 2_000, 20).await;
    assert_eq!(
        one.len(),
        2_000,
        "one channel left carries everything: {}\n{}",
        a.stats().await.unwrap().table(),
        b.stats().await.unwrap().table()
    );
    let sa = a.stats().await.unwrap();
    assert_eq!(
        sa.channels.iter().filter(|c| c.in_tx_set).count(),
        1,
        "{}",
        sa.table()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_and_replayed_control_packets_are_dropped_and_counted() {
    let (relay, a, mut b) = pair(2, Mode::Logical).await;
    let first = stream(&a, &mut b, 0, 2_000).await;
    assert_eq!(first.len(), 2_000);
    // A bare marker with an absurd position and a garbage trailer (not sealed), and a
    // recorded sealed datagram played again.
    let mut forged = vec![braid_proto::wire::TYPE_MARKER, 1, 0, 0, 0, 0, 0, 0];
    forged.extend_from_slice(&u64::MAX.to_be_bytes());
    forged.extend_from_slice(&1500i64.to_be_bytes());
    forged.extend_from_slice(&0u64.to_be_bytes());
    forged.extend_from_slice(&[0u8; 32]);
    let replay = relay
        .last_control_from(0, Side::A)
        .expect("saw a control packet");
    for _ in 0..5 {
        relay.inject(0, Side::B, &forged).unwrap();
        relay.inject(0, Side::B, &replay).unwrap();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = stream(&a, &mut b, 2_000, 5_000).await;
    assert_eq!(after.len(), 5_000);
    assert!(
        after.windows(2).all(|w| w[1] == w[0] + 1),
        "not desynchronized"
    );
    let sb = b.stats().await.unwrap();
    assert_eq!(sb.channels[0].unauthenticated, 5, "{}", sb.table());
    assert_eq!(sb.channels[0].replays, 5, "{}", sb.table());
    assert_eq!(sb.tx_epoch, 0);
}

#[tokio::test]
async fn bind_errors_name_the_channel_and_address() {
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let cfg = SessionConfig::new(
        vec![ChannelConfig::new(
            "wan1",
            addr,
            "127.0.0.1:9".parse().unwrap(),
        )],
        "a braid-io test key of 32 bytes or more",
    );
    let e = Session::start(cfg)
        .await
        .err()
        .expect("bind fails")
        .to_string();
    assert!(
        e.contains("wan1") && e.contains(&addr.to_string()) && e.contains("already uses"),
        "{e}"
    );
    let cfg = SessionConfig::new(
        vec![ChannelConfig::new(
            "x",
            "192.0.2.77:7000".parse().unwrap(),
            "127.0.0.1:9".parse().unwrap(),
        )],
        "a braid-io test key of 32 bytes or more",
    );
    let e = Session::start(cfg)
        .await
        .err()
        .expect("bind fails")
        .to_string();
    assert!(e.contains("not configured on any local interface"), "{e}");
}

#[tokio::test]
async fn silent_peer_is_reported() {
    let relay = Relay::new(2).unwrap();
    let (ca, _) = cfgs(&relay, 2, Mode::Logical);
    let mut a = Session::start(ca).await.unwrap();
    let e = a
        .wait_for_peer(Duration::from_millis(300))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("never answered") && e.contains("->"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_closed_on_purpose_tells_the_peer() {
    let (_relay, a, mut b) = pair(2, Mode::Logical).await;
    let got = stream(&a, &mut b, 0, 100).await;
    assert_eq!(got.len(), 100);
    assert!(!b.stats().await.unwrap().peer_closed);
    a.close().await;
    let t0 = std::time::Instant::now();
    while !b.stats().await.unwrap().peer_closed {
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "the close never arrived"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(b
        .stats()
        .await
        .unwrap()
        .table()
        .contains("peer closed the session"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_endpoint_serves_live_counters() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_relay, a, mut b) = pair(2, Mode::Logical).await;
    let got = stream(&a, &mut b, 0, 1_000).await;
    assert_eq!(got.len(), 1_000);
    let (addr, _task) =
        braid_io::observe::serve_metrics("127.0.0.1:0".parse().unwrap(), b.stats_handle())
            .await
            .unwrap();
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).await.unwrap();
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    assert!(
        body.contains("braid_delivered_packets_total 1000"),
        "{body}"
    );
    assert!(
        body.contains("braid_channel_up{channel=\"1\",name=\"c1\"} 1"),
        "{body}"
    );
    // The status page at /, the snapshot it polls at /stats.json, 404 elsewhere.
    let get = |path: &'static str| async move {
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(format!("GET {path} HTTP/1.1\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut body = String::new();
        conn.read_to_string(&mut body).await.unwrap();
        body
    };
    let page = get("/").await;
    assert!(page.starts_with("HTTP/1.1 200 OK"), "{page}");
    assert!(page.contains("Content-Type: text/html") && page.contains("fetch(\"/stats.json\""));
    let json = get("/stats.json").await;
    assert!(json.starts_with("HTTP/1.1 200 OK"), "{json}");
    let snapshot: braid_io::SessionStats =
        serde_json::from_str(json.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(snapshot.delivered_packets, 1000);
    assert!(get("/nothing").await.starts_with("HTTP/1.1 404"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooded_port_does_not_starve_the_others_and_oversize_is_dropped_uncopied() {
    // seq mode: the few genuine datagrams the flood may push out of channel 0's queue
    // are then lost, not misordered (logical mode is quasi-FIFO until the next marker).
    let (relay, a, mut b) = pair(2, Mode::Seq).await;
    let relay = std::sync::Arc::new(relay);
    // Oversize datagrams towards B on channel 1: larger than any channel carries.
    for _ in 0..10 {
        relay.inject(1, Side::B, &[0x45; 3000]).unwrap();
    }
    // A flood of forged datagrams towards B on channel 0, from the relay's address (as
    // a spoofer's would be), while A streams to B over both channels.
    let flood = {
        let relay = relay.clone();
        std::thread::spawn(move || {
            let junk = [0x45u8; 1400];
            let mut sent = 0u64;
            let t0 = std::time::Instant::now();
            while t0.elapsed() < Duration::from_millis(1500) {
                if relay.inject(0, Side::B, &junk).is_ok() {
                    sent += 1;
                }
            }
            sent
        })
    };
    let got = stream_paced(&a, &mut b, 0, 3_000, 20).await;
    let sent = flood.join().unwrap();
    // The stream gets through, in order. The flooded port's reader cannot tell A's
    // datagrams from the flood before they are opened, so some of A's datagrams on
    // channel 0 are dropped with the flood, how many depending on how fast this machine
    // opens datagrams against how fast the flood thread sends them (measured: up to 47
    // of the 1 500 sent on it with two builds running; 336-580 on a slower day of the
    // same 2-core VM, at HEAD before and after the change that found it); the other
    // port loses none. Starved, channel 0 would bring nothing: at least half of it.
    let sb = b.stats().await.unwrap();
    assert!(got.len() >= 2_250, "only {} of 3000 got through", got.len());
    assert!(
        got.windows(2).all(|w| w[1] > w[0]),
        "out of order\n{}",
        sb.table()
    );
    assert_eq!(sb.channels[1].rx_queue_drops, 0, "{}", sb.table());
    let c0 = &sb.channels[0];
    let counted = c0.unauthenticated + c0.rx_queue_drops;
    assert!(
        counted > 0 && counted <= sent,
        "{counted} of {sent} forged datagrams counted\n{}",
        sb.table()
    );
    assert_eq!(sb.channels[1].rx_oversize, 10, "{}", sb.table());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_peer_reconnects_within_a_second() {
    let (relay, a, b) = pair(2, Mode::Seq).await;
    let mut b = b;
    let first = stream(&a, &mut b, 0, 500).await;
    assert_eq!(first.len(), 500);
    // B restarts: a new process would pick new random keys and a new run identifier,
    // and its clock says nothing to A.
    let (_, cb) = cfgs(&relay, 2, Mode::Seq);
    b.close().await;
    let t0 = std::time::Instant::now();
    let mut b = Session::start(cb).await.unwrap();
    for c in 0..2 {
        relay.set_ends(c, a.local_addrs()[c], b.local_addrs()[c]);
    }
    b.wait_for_peer(Duration::from_secs(5)).await.unwrap();
    // A carries on at once: the first message that arrives after the restart.
    let tx = a.sender();
    let mut i = 1_000_000u64;
    let got = loop {
        tx.send(msg(i, 200)).await.unwrap();
        i += 1;
        if let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(5), b.recv()).await {
            break m;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "no delivery after the restart"
        );
    };
    let took = t0.elapsed();
    assert!(id(&got) >= 1_000_000);
    eprintln!("restarted peer: first delivery {took:?} after the restart");
    assert!(took < Duration::from_secs(1), "reconnected after {took:?}");
    let after = stream(&a, &mut b, 2_000_000, 1_000).await;
    assert_eq!(after.len(), 1_000);
    assert!(after.windows(2).all(|w| w[1] == w[0] + 1));
    let sa = a.stats().await.unwrap();
    assert!(sa.handshakes >= 2, "{}", sa.table());
}

/// The random scheduler works in a session: both ends draw from the same seed (0, as
/// the configuration file gives it), in every epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_scheduler_delivers_in_order_and_survives_an_epoch_switch() {
    let random = SchedulerKind::Random { seed: 0 };
    for mode in [Mode::Logical, Mode::Seq] {
        let (relay, a, mut b) = pair_with(3, mode, random).await;
        let got = stream(&a, &mut b, 0, 6_000).await;
        assert_eq!(got.len(), 6_000, "{mode:?}: all delivered");
        assert!(
            got.windows(2).all(|w| w[1] == w[0] + 1),
            "{mode:?}: in order"
        );
        let sb = b.stats().await.unwrap();
        for c in &sb.channels {
            assert!(c.rx_data_packets > 1_000, "{mode:?}: {c:?}");
        }
        // Losing a channel starts a new epoch over the other two.
        relay.silence(1, true);
        let during = stream_paced(&a, &mut b, 6_000, 4_000, 20).await;
        assert!(
            during.windows(2).all(|w| w[1] > w[0]),
            "{mode:?}: strictly increasing"
        );
        let sa = a.stats().await.unwrap();
        assert!(sa.tx_epoch >= 1, "{mode:?}: {}", sa.table());
        assert!(
            (9_000..10_000).all(|t| during.contains(&t)),
            "{mode:?}: the tail after the switch arrived: {} of 4000\n{}",
            during.len(),
            b.stats().await.unwrap().table()
        );
        a.close().await;
        b.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_socket_requests_are_capped() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_relay, a, _b) = pair(1, Mode::Logical).await;
    let path = std::env::temp_dir().join(format!("braid-ctl-cap-{}.sock", std::process::id()));
    let _ctl = braid_io::observe::serve_control(&path, a.stats_handle()).unwrap();
    // A line as long as the limit without its newline is refused with an error.
    let mut c = tokio::net::UnixStream::connect(&path).await.unwrap();
    c.write_all(&[b'x'; 256]).await.unwrap();
    let mut reply = String::new();
    tokio::time::timeout(Duration::from_secs(3), c.read_to_string(&mut reply))
        .await
        .unwrap()
        .unwrap();
    assert!(reply.contains("too long"), "{reply}");
    // Megabytes without a newline are cut off the same way, without being buffered.
    let mut c = tokio::net::UnixStream::connect(&path).await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(3), c.write_all(&vec![b'x'; 4 << 20])).await;
    drop(c);
    // The socket still answers a real request.
    let s = braid_io::observe::query_control(&path).await.unwrap();
    assert!(s.peer_seen);
}

/// Two free loopback ports (bound, read, released).
fn free_ports(n: usize) -> Vec<std::net::SocketAddr> {
    let socks: Vec<_> = (0..n)
        .map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    socks.iter().map(|s| s.local_addr().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pace_auto_on_an_unshaped_link_says_why_it_is_not_measured() {
    // Loopback, directly (no relay): as fast as an unshaped veth pair. A train on it
    // arrives in microseconds; its "rate" was the reader's scheduling, logged nowhere
    // (or not at all, when the receiver read it all at once). Now each channel's
    // probe fails, says why, and the channel stays unpaced.
    //
    // Except on a loaded machine, where the sender's own scheduling can spread a
    // train enough to time it, and the channel is paced at that rate: an open defect
    // (issue 33's closing note; seen in CI with the tests of this file running side
    // by side). Such an attempt is tried again with new sessions, at most three times.
    let mut timed = Vec::new();
    for _ in 0..3 {
        match pace_auto_attempt().await {
            Ok(()) => return,
            Err(e) => timed.push(e),
        }
    }
    panic!("a train on loopback was timed in every attempt: {timed:?}");
}

/// One attempt of [`pace_auto_on_an_unshaped_link_says_why_it_is_not_measured`]:
/// `Err` (with the channels' probe states) when a train was timed.
async fn pace_auto_attempt() -> Result<(), String> {
    let p = free_ports(4);
    let key = "a braid-io test key of 32 bytes or more";
    let mk = |l: &[std::net::SocketAddr], r: &[std::net::SocketAddr]| {
        let chans = (0..2)
            .map(|c| {
                let mut ch = ChannelConfig::new(format!("c{c}"), l[c], r[c]);
                ch.pace_auto = true;
                ch
            })
            .collect();
        let mut cfg = SessionConfig::new(chans, key);
        cfg.core.heartbeat = braid_proto::Duration::from_millis(20);
        cfg.core.dead_after = braid_proto::Duration::from_millis(120);
        cfg.core.rejoin_after = braid_proto::Duration::from_millis(60);
        cfg
    };
    let mut a = Session::start(mk(&p[..2], &p[2..])).await.unwrap();
    let mut b = Session::start(mk(&p[2..], &p[..2])).await.unwrap();
    a.wait_for_peer(Duration::from_secs(5)).await.unwrap();
    b.wait_for_peer(Duration::from_secs(5)).await.unwrap();
    let t0 = std::time::Instant::now();
    loop {
        let s = a.stats().await.unwrap();
        if s.channels.iter().any(|c| c.probe == "measured") {
            let states: Vec<_> = s
                .channels
                .iter()
                .map(|c| (&c.probe, c.measured_bps))
                .collect();
            a.close().await;
            b.close().await;
            return Err(format!("{states:?}"));
        }
        if s.channels.iter().all(|c| c.probe == "failed") {
            for c in &s.channels {
                assert!(c.pace_bps < 0.0, "unpaced: {c:?}");
                assert!(c.measured_bps < 0.0, "no random rate: {c:?}");
                assert!(
                    c.probe_detail.contains("faster than a train can show")
                        && c.probe_detail.contains("unpaced"),
                    "{}",
                    c.probe_detail
                );
            }
            // Three trains per channel (probe::tests checks the count in virtual
            // time); more when a channel went down and up on a loaded machine, which
            // measures it again.
            assert!(
                s.probe_trains >= 6,
                "three trains per channel: {}",
                s.probe_trains
            );
            let t = s.table();
            assert!(t.contains("pacing 0 (c0): probe failed: "), "{t}");
            let m = s.prometheus();
            assert!(
                m.contains(
                    "braid_channel_probe_state{channel=\"1\",name=\"c1\",state=\"failed\"} 1"
                ),
                "{m}"
            );
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(8),
            "probes still {:?}",
            s.channels.iter().map(|c| &c.probe).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.close().await;
    b.close().await;
    Ok(())
}
