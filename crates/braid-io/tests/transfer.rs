//! `braid_io::transfer` end to end: two sessions in one process on loopback, joined by
//! a forwarder per channel that drops datagrams at random (both ways), or by the test
//! [`Relay`] silencing a channel for a while.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use braid_io::relay::Relay;
use braid_io::transfer::{self, RecvSummary, SendSummary, TransferConfig};
use braid_io::{ChannelConfig, Session, SessionConfig};
use braid_proto::errctl::Tolerance;
use braid_proto::rng::SplitMix64;

/// A loopback forwarder per channel that drops each datagram with probability `loss`,
/// in both directions. End A aims at `a_side`, end B at `b_side`; each side learns its
/// end's address from the first datagram.
struct Lossy {
    a: Vec<SocketAddr>,
    b: Vec<SocketAddr>,
    dropped: Arc<AtomicU64>,
    forwarded: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Lossy {
    fn new(n: usize, loss: f64, seed: u64) -> Lossy {
        let mut l = Lossy {
            a: Vec::new(),
            b: Vec::new(),
            dropped: Arc::default(),
            forwarded: Arc::default(),
            stop: Arc::default(),
        };
        for c in 0..n {
            let sa = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
            let sb = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
            l.a.push(sa.local_addr().unwrap());
            l.b.push(sb.local_addr().unwrap());
            let peers = Arc::new(Mutex::new([None::<SocketAddr>; 2]));
            for (i, (from, to)) in [(sa.clone(), sb.clone()), (sb, sa)].into_iter().enumerate() {
                let (peers, stop) = (peers.clone(), l.stop.clone());
                let (dropped, forwarded) = (l.dropped.clone(), l.forwarded.clone());
                let mut rng = SplitMix64::new(seed ^ (c as u64 * 2 + i as u64));
                from.set_read_timeout(Some(Duration::from_millis(20)))
                    .unwrap();
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 65536];
                    while !stop.load(Ordering::Relaxed) {
                        let Ok((len, src)) = from.recv_from(&mut buf) else {
                            continue;
                        };
                        let dst = {
                            let mut p = peers.lock().unwrap();
                            p[i] = Some(src);
                            p[1 - i]
                        };
                        if (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= loss {
                            dropped.fetch_add(1, Ordering::Relaxed);
                        } else if let Some(d) = dst {
                            let _ = to.send_to(&buf[..len], d);
                            forwarded.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        }
        l
    }
}

impl Drop for Lossy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn config(remotes: &[SocketAddr]) -> SessionConfig {
    let any = "127.0.0.1:0".parse().unwrap();
    let chans = remotes
        .iter()
        .enumerate()
        .map(|(c, r)| ChannelConfig::new(format!("c{c}"), any, *r))
        .collect();
    let mut cfg = SessionConfig::new(chans, "a braid-io test key of 32 bytes or more");
    cfg.core.heartbeat = braid_proto::Duration::from_millis(20);
    cfg.core.dead_after = braid_proto::Duration::from_millis(150);
    cfg.core.rejoin_after = braid_proto::Duration::from_millis(60);
    cfg.core.receiver.max_wait = braid_proto::Duration::from_millis(30);
    cfg
}

async fn sessions_with(
    a: &[SocketAddr],
    b: &[SocketAddr],
    tune: impl Fn(&mut SessionConfig),
) -> (Session, Session) {
    let (mut ca, mut cb) = (config(a), config(b));
    tune(&mut ca);
    tune(&mut cb);
    let mut sa = Session::start(ca).await.unwrap();
    let mut sb = Session::start(cb).await.unwrap();
    sa.wait_for_peer(Duration::from_secs(5)).await.unwrap();
    sb.wait_for_peer(Duration::from_secs(5)).await.unwrap();
    (sa, sb)
}

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut r = SplitMix64::new(seed);
    (0..n.div_ceil(8))
        .flat_map(|_| r.next_u64().to_le_bytes())
        .take(n)
        .collect()
}

/// Run a transfer of `input` from A to B; B's output, both summaries.
async fn transfer(
    a: &mut Session,
    b: &mut Session,
    input: Vec<u8>,
    cfg: &TransferConfig,
) -> (Vec<u8>, SendSummary, RecvSummary) {
    let rcfg = cfg.clone();
    let (out, sent) = tokio::join!(
        async {
            let mut out = Vec::new();
            let r = transfer::recv(b, &mut out, &rcfg, None).await.unwrap();
            (out, r)
        },
        async { transfer::send(a, &input[..], cfg, None).await.unwrap() }
    );
    (out.0, sent, out.1)
}

fn reliable() -> TransferConfig {
    TransferConfig::default()
}

/// Full reliability over two channels that each lose 5 % of datagrams both ways: a
/// 4 MiB file arrives bit-identical, and the repairs are counted at both ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_arrives_bit_identical_over_lossy_channels() {
    let net = Lossy::new(2, 0.05, 42);
    // The transfer's own repair is under test: in-bond repair (on by default) off.
    let (mut a, mut b) = sessions_with(&net.a, &net.b, |c| c.core.arq = None).await;
    let input = random_bytes(4 << 20, 7);
    let t0 = std::time::Instant::now();
    let (out, sent, got) = tokio::time::timeout(
        Duration::from_secs(30),
        transfer(&mut a, &mut b, input.clone(), &reliable()),
    )
    .await
    .expect("transfer finished in time");
    eprintln!(
        "{:.2}s\n{}{}",
        t0.elapsed().as_secs_f64(),
        sent.text(),
        got.text()
    );
    assert_eq!(blake3::hash(&out), blake3::hash(&input));
    assert!(sent.complete && got.complete);
    assert_eq!(
        (got.bytes, sent.bytes),
        (input.len() as u64, input.len() as u64)
    );
    assert_eq!((got.tolerated, got.given_up, got.packets_lost), (0, 0, 0));
    assert!(net.dropped.load(Ordering::Relaxed) > 100);
    assert!(got.repaired > 0 && sent.retransmissions >= got.repaired);
    assert!(got.latency_ms.is_some());
}

/// Tolerance (32, 2, 1) over 5 % loss: every block of the output is in order, no
/// segment lacks more than 2 blocks or 2 in a row, and the summary counts exactly the
/// missing blocks as tolerated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tolerated_gaps_stay_within_the_tolerance() {
    const BLOCK: usize = 1000;
    const BLOCKS: u64 = 3000;
    let net = Lossy::new(2, 0.05, 9);
    // The losses must reach the transfer: in-bond repair (on by default) would
    // resend them below it.
    let (mut a, mut b) = sessions_with(&net.a, &net.b, |c| c.core.arq = None).await;
    let mut input = Vec::new();
    for i in 0..BLOCKS {
        let mut blk = random_bytes(BLOCK, i);
        blk[..8].copy_from_slice(&i.to_be_bytes());
        input.extend_from_slice(&blk);
    }
    let t = Tolerance { w: 32, e: 2, b: 1 };
    let cfg = TransferConfig {
        tolerance: t,
        chunk: BLOCK,
        ..reliable()
    };
    let (out, sent, got) = tokio::time::timeout(
        Duration::from_secs(30),
        transfer(&mut a, &mut b, input.clone(), &cfg),
    )
    .await
    .expect("transfer finished in time");
    eprintln!("{}{}", sent.text(), got.text());
    assert_eq!(out.len() % BLOCK, 0);
    let ids: Vec<u64> = out
        .chunks(BLOCK)
        .map(|c| u64::from_be_bytes(c[..8].try_into().unwrap()))
        .collect();
    let mut present = vec![false; BLOCKS as usize];
    for w in ids.windows(2) {
        assert!(w[0] < w[1], "out of order or duplicated: {w:?}");
    }
    for (k, &i) in ids.iter().enumerate() {
        present[i as usize] = true;
        let start = i as usize * BLOCK;
        assert_eq!(out[k * BLOCK..(k + 1) * BLOCK], input[start..start + BLOCK]);
    }
    for seg in present.chunks(usize::from(t.w)) {
        let lost = seg.iter().filter(|&&p| !p).count();
        let run = seg.split(|&p| p).map(|r| r.len()).max().unwrap_or(0);
        assert!(lost <= 2 && run <= 1, "segment over (32,2,1): {seg:?}");
    }
    let missing = BLOCKS - ids.len() as u64;
    assert!(missing > 0, "5 % loss but nothing tolerated");
    assert_eq!((got.tolerated, got.packets_lost), (missing, missing));
    assert_eq!(
        (got.violations, got.segments_forced, got.given_up),
        (0, 0, 0)
    );
    assert!(got.complete && sent.complete);
}

/// The test relay silences one of two channels for 400 ms in the middle of a transfer
/// (a burst of loss, then failover): the file still arrives bit-identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_survives_a_silenced_channel() {
    let relay = Relay::new(2).unwrap();
    let ra: Vec<_> = (0..2).map(|c| relay.a_side(c)).collect();
    let rb: Vec<_> = (0..2).map(|c| relay.b_side(c)).collect();
    let mut a = Session::start(config(&ra)).await.unwrap();
    let mut b = Session::start(config(&rb)).await.unwrap();
    for c in 0..2 {
        relay.set_ends(c, a.local_addrs()[c], b.local_addrs()[c]);
    }
    a.wait_for_peer(Duration::from_secs(5)).await.unwrap();
    b.wait_for_peer(Duration::from_secs(5)).await.unwrap();
    let input = random_bytes(2 << 20, 3);
    let relay = Arc::new(relay);
    let r2 = relay.clone();
    let flap = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(30)).await;
        r2.silence(1, true);
        tokio::time::sleep(Duration::from_millis(400)).await;
        r2.silence(1, false);
    });
    // Paced so that the transfer is still running when the channel goes silent.
    let slow = paced(&input);
    let cfg = TransferConfig {
        chunk: 1000,
        ..reliable()
    };
    let rcfg = cfg.clone();
    let (got, sent) = tokio::join!(
        async {
            let mut out = Vec::new();
            let r = transfer::recv(&mut b, &mut out, &rcfg, None).await.unwrap();
            (out, r)
        },
        async { transfer::send(&mut a, slow, &cfg, None).await.unwrap() }
    );
    flap.await.unwrap();
    eprintln!("{}{}", sent.text(), got.1.text());
    assert!(relay.counts(1).1 > 0, "nothing was dropped");
    assert_eq!(blake3::hash(&got.0), blake3::hash(&input));
    assert!(got.1.complete && got.1.repaired > 0);
}

/// An `AsyncRead` over `data` that yields 64 KiB every 10 ms.
fn paced(data: &[u8]) -> impl tokio::io::AsyncRead + Unpin + '_ {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    struct Paced<'a> {
        data: &'a [u8],
        sleep: Pin<Box<tokio::time::Sleep>>,
        budget: usize,
    }
    impl tokio::io::AsyncRead for Paced<'_> {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            if self.budget == 0 {
                if self.sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let next = tokio::time::Instant::now() + Duration::from_millis(10);
                self.sleep.as_mut().reset(next);
                self.budget = 64 << 10;
            }
            let n = buf.remaining().min(self.data.len()).min(self.budget);
            buf.put_slice(&self.data[..n]);
            self.data = &self.data[n..];
            self.budget -= n;
            Poll::Ready(Ok(()))
        }
    }
    Paced {
        data,
        sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
        budget: 0,
    }
}

/// An `AsyncRead` over `data` that yields at most `piece` bytes per read.
fn in_pieces(data: &[u8], piece: usize) -> impl tokio::io::AsyncRead + Unpin + '_ {
    use std::pin::Pin;
    use std::task::{Context, Poll};
    struct Pieces<'a>(&'a [u8], usize);
    impl tokio::io::AsyncRead for Pieces<'_> {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let n = buf.remaining().min(self.0.len()).min(self.1);
            let (head, rest) = self.0.split_at(n);
            buf.put_slice(head);
            self.0 = rest;
            Poll::Ready(Ok(()))
        }
    }
    Pieces(data, piece)
}

/// Live mode with (32, 2, 1) over 5 % loss, the input read in pieces of 500 bytes: every
/// packet still carries one whole 1316-byte record (a lost packet takes exactly one
/// record), records come out in order, and what is missing is what the summary counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_packets_carry_whole_records() {
    const REC: usize = 1316;
    const RECORDS: u64 = 2000;
    let net = Lossy::new(2, 0.05, 11);
    // The losses must reach the transfer: in-bond repair (on by default) would resend
    // them below it whenever its repair beats the receiver's wait, and then nothing is
    // missing (CI saw this once).
    let (mut a, mut b) = sessions_with(&net.a, &net.b, |c| c.core.arq = None).await;
    let mut input = Vec::new();
    for i in 0..RECORDS {
        let mut r = random_bytes(REC, i + 100);
        r[..8].copy_from_slice(&i.to_be_bytes());
        input.extend_from_slice(&r);
    }
    let cfg = TransferConfig {
        tolerance: Tolerance { w: 32, e: 2, b: 1 },
        chunk: REC,
        live: true,
        ..reliable()
    };
    let rcfg = cfg.clone();
    let (got, sent) = tokio::time::timeout(Duration::from_secs(30), async {
        tokio::join!(
            async {
                let mut out = Vec::new();
                let r = transfer::recv(&mut b, &mut out, &rcfg, None).await.unwrap();
                (out, r)
            },
            async {
                transfer::send(&mut a, in_pieces(&input, 500), &cfg, None)
                    .await
                    .unwrap()
            }
        )
    })
    .await
    .expect("transfer finished in time");
    let (out, got) = got;
    eprintln!("{}{}", sent.text(), got.text());
    assert_eq!(sent.packets, RECORDS);
    assert_eq!(out.len() % REC, 0);
    let mut last = None;
    for rec in out.chunks(REC) {
        let i = u64::from_be_bytes(rec[..8].try_into().unwrap());
        assert!(
            last.is_none_or(|l| l < i),
            "out of order: {last:?} then {i}"
        );
        let start = i as usize * REC;
        assert_eq!(rec, &input[start..start + REC]);
        last = Some(i);
    }
    let missing = RECORDS - (out.len() / REC) as u64;
    assert!(missing > 0, "5 % loss but nothing tolerated");
    assert_eq!(got.packets_lost, missing);
    assert!(got.complete && sent.complete);
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

/// `open_output` only checks; the file appears under its name only at `finish`, the
/// data goes to a temporary file beside it, and dropping the output (a failed
/// transfer) removes that file. An existing file needs `overwrite`, and keeps its mode.
#[tokio::test]
async fn output_file_appears_only_when_finished() {
    use std::os::unix::fs::PermissionsExt;
    use tokio::io::AsyncWriteExt;
    let dir = std::env::temp_dir().join(format!("braid-io-output-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    let out = dir.join("out.bin");
    let path = out.to_str().unwrap();

    // Dropped after writing: nothing left.
    let mut o = transfer::open_output(path, false).await.unwrap();
    assert!(
        names(&dir).is_empty(),
        "open_output created {:?}",
        names(&dir)
    );
    assert_eq!(o.staged(), Some(out.as_path()));
    o.write_all(b"partial").await.unwrap();
    o.flush().await.unwrap();
    let n = names(&dir);
    assert!(
        n.len() == 1 && n[0].starts_with(".out.bin.") && n[0].ends_with(".part"),
        "{n:?}"
    );
    drop(o);
    assert!(names(&dir).is_empty(), "left behind: {:?}", names(&dir));

    // Finished: renamed into place; an empty stream makes an empty file.
    let mut o = transfer::open_output(path, false).await.unwrap();
    o.write_all(b"first").await.unwrap();
    o.finish().await.unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), b"first");
    let empty = dir.join("empty.bin");
    transfer::open_output(empty.to_str().unwrap(), false)
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(std::fs::read(&empty).unwrap(), b"");
    std::fs::remove_file(&empty).unwrap();

    // Existing: refused without overwrite; replaced with it, keeping the mode.
    let e = transfer::open_output(path, false).await.err().unwrap();
    assert!(e.to_string().contains("exists and is kept"), "{e}");
    // Group-writable: a umask of 022 would clear that bit; the replacement keeps it.
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o664)).unwrap();
    let mut o = transfer::open_output(path, true).await.unwrap();
    o.write_all(b"second").await.unwrap();
    assert_eq!(
        std::fs::read(&out).unwrap(),
        b"first",
        "replaced before finish"
    );
    o.finish().await.unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), b"second");
    let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o664);
    assert_eq!(names(&dir), ["out.bin"]);

    // A file appearing meanwhile is kept when overwriting was not asked for.
    let late = dir.join("late.bin");
    let mut o = transfer::open_output(late.to_str().unwrap(), false)
        .await
        .unwrap();
    o.write_all(b"received").await.unwrap();
    std::fs::write(&late, b"someone else's").unwrap();
    let e = o.finish().await.err().unwrap();
    assert!(e.to_string().contains("is kept"), "{e}");
    assert_eq!(std::fs::read(&late).unwrap(), b"someone else's");
    assert_eq!(names(&dir), ["late.bin", "out.bin"]);

    // A folder, or a missing folder, is named; a device is written in place.
    for (p, msg) in [
        (dir.to_str().unwrap().to_string(), "is a folder"),
        (format!("{}/no/x", dir.display()), "/no"),
    ] {
        let e = transfer::open_output(&p, true).await.err().unwrap();
        assert!(e.to_string().contains(msg), "{e}");
    }
    let mut o = transfer::open_output("/dev/null", false).await.unwrap();
    assert_eq!(o.staged(), None);
    o.write_all(b"gone").await.unwrap();
    o.finish().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}
