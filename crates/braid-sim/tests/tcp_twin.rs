//! The closed-loop TCP source (`source = "tcp"`) and the simulated twins of the
//! congestion lab cases.

use std::path::Path;

use braid_sim::scenario::{self, Scenario};

mod common;
use braid_sim::tcp::{Ack, Cc, TcpSender, TcpSpec};
use common::{parse, parse_err, run};

/// One channel, no session: `rate` Mbit/s, 10 ms, a queue of about a BDP.
fn one_channel(rate: f64, extra: &str) -> String {
    format!(
        r#"
duration_s = 6
drain_s = 0.5
[[channel]]
rate_mbps = {rate}
delay_ms = 10
queue_packets = 60
{extra}
[traffic]
source = "tcp"
bytes = 1440
header_bytes = 52
[[run]]
label = "alone"
scheduler = "sum"
"#
    )
}

#[test]
fn tcp_over_one_clean_channel_reaches_its_rate() {
    for cc in ["cubic", "reno"] {
        let text = one_channel(20.0, "").replace(
            "header_bytes = 52",
            &format!("header_bytes = 52\ncc = \"{cc}\""),
        );
        let r = run(&parse(&text), 1);
        let t = r.runs[0].tcp.as_ref().expect("tcp");
        // Payload share of each packet: 1388 of 1440 bytes.
        let max = 20e6 * 1388.0 / 1440.0;
        assert!(
            t.goodput_bps > 0.8 * max,
            "{cc}: {:.2} Mbit/s of {:.2}",
            t.goodput_bps / 1e6,
            max / 1e6
        );
        assert!(t.goodput_bps <= max * 1.001, "{cc}: above the link's rate");
        assert_eq!(t.rto_count, 0, "{cc}: no timeout on a clean link");
        assert_eq!(t.cc, cc);
        // 60 goodput bins of 100 ms.
        assert_eq!(t.goodput_series_bps.len(), 60);
        // A drop-tail queue makes the flow lose when it overfills it (slow start).
        assert!(t.retransmits > 0, "{cc}: never filled the queue?");
    }
}

#[test]
fn rwnd_caps_the_window_and_the_rate() {
    // 20 segments per 20 ms round trip at most: 20 × 1388 × 8 / 0.02 s ≈ 11 Mbit/s.
    let text =
        one_channel(50.0, "").replace("header_bytes = 52", "header_bytes = 52\nrwnd_packets = 20");
    let r = run(&parse(&text), 1);
    let t = r.runs[0].tcp.as_ref().expect("tcp");
    assert!(t.cwnd_max <= 20.0, "cwnd {}", t.cwnd_max);
    assert_eq!(t.retransmits, 0, "never fills the 60-packet queue");
    let cap = 20.0 * 1388.0 * 8.0 / 0.020;
    assert!(
        t.goodput_bps < cap && t.goodput_bps > 0.8 * cap,
        "{:.2} Mbit/s, cap {:.2}",
        t.goodput_bps / 1e6,
        cap / 1e6
    );
}

#[test]
fn a_link_down_longer_than_the_rto_makes_a_timeout_and_the_flow_recovers() {
    let text = one_channel(10.0, "[[channel.down]]\nstart_s = 2\nend_s = 3");
    let r = run(&parse(&text), 1);
    let t = r.runs[0].tcp.as_ref().expect("tcp");
    assert!(t.rto_count >= 2, "timeouts with backoff: {}", t.rto_count);
    let s = &t.goodput_series_bps;
    let after: f64 = s[50..60].iter().sum::<f64>() / 10.0;
    assert!(after > 5e6, "back to speed after the outage: {after}");
    assert!(s[25..30].iter().all(|&x| x == 0.0), "nothing while down");
}

fn acks_for_window(s: &mut TcpSender, now: u64, ce_on: Option<u64>) -> (u64, u64) {
    let mut sent = Vec::new();
    while let Some((seg, retx)) = s.poll_send(0) {
        assert!(!retx);
        sent.push(seg);
    }
    let mut cum = 0;
    for &seg in &sent {
        cum = seg + 1;
        s.on_ack(
            now,
            Ack {
                cum,
                seg,
                ce: ce_on == Some(seg),
                echo: 0,
            },
        );
    }
    (sent.len() as u64, cum)
}

#[test]
fn a_ce_mark_reduces_the_window_once_per_window_without_retransmitting() {
    for (cc, beta) in [(Cc::Cubic, 0.7), (Cc::Reno, 0.5)] {
        let spec = TcpSpec {
            cc,
            hystart: false,
            ..TcpSpec::default()
        };
        let mut s = TcpSender::new(&spec);
        // Slow start for a few windows: 10, 20, 40 segments.
        for _ in 0..3 {
            acks_for_window(&mut s, 50_000_000, None);
        }
        let before = s.cwnd();
        assert_eq!(before, 80.0, "{cc:?}: slow start doubles");
        // The next window: its first segment arrives marked CE.
        let mut sent = Vec::new();
        while let Some((seg, _)) = s.poll_send(100_000_000) {
            sent.push(seg);
        }
        let first = sent[0];
        s.on_ack(
            150_000_000,
            Ack {
                cum: first + 1,
                seg: first,
                ce: true,
                echo: 100_000_000,
            },
        );
        let after = s.cwnd();
        assert!(
            (after - before * beta).abs() < 1e-9,
            "{cc:?}: {before} -> {after}"
        );
        assert_eq!(s.stats.ecn_reductions, 1);
        // A second mark in the same window of data does not reduce again.
        s.on_ack(
            150_000_000,
            Ack {
                cum: first + 2,
                seg: first + 1,
                ce: true,
                echo: 100_000_000,
            },
        );
        assert_eq!(s.cwnd(), after, "{cc:?}: once per window");
        assert_eq!(s.stats.ecn_reductions, 1);
        assert_eq!(s.stats.ce_echoes, 2);
        // Nothing is sent again: the rest of the window is acknowledged, no loss.
        let mut cum = first + 2;
        for &seg in &sent[2..] {
            cum = seg + 1;
            s.on_ack(
                160_000_000,
                Ack {
                    cum,
                    seg,
                    ce: false,
                    echo: 100_000_000,
                },
            );
        }
        assert_eq!(s.outstanding(), 0);
        while let Some((_, retx)) = s.poll_send(170_000_000) {
            assert!(!retx, "{cc:?}: a CE mark must not cause a retransmission");
        }
        assert_eq!(s.stats.retransmits, 0);
        assert_eq!(s.stats.loss_reductions, 0);
        // After the window, the next mark reduces again.
        let _ = cum;
        let w = s.cwnd();
        s.on_ack(
            200_000_000,
            Ack {
                cum: s.outstanding() + cum,
                seg: cum,
                ce: true,
                echo: 170_000_000,
            },
        );
        assert!(s.cwnd() < w, "{cc:?}: a new window, a new reduction");
    }
}

/// The lab's three links scaled down (100/50/20 Mbit/s → 20/10/4, the same delays, the
/// same 20 ms buffers), 9 s; keys for the last link may follow.
const SCALED_LINKS: &str = r#"
duration_s = 9
drain_s = 0.5
max_packet = 1445
[[channel]]
rate_mbps = 20
delay_ms = 5
queue_packets = 50
overhead_bytes = 42
[[channel]]
rate_mbps = 10
delay_ms = 20
queue_packets = 30
overhead_bytes = 42
[[channel]]
rate_mbps = 4
delay_ms = 60
queue_packets = 20
overhead_bytes = 42
"#;

/// The twins' traffic: one TCP flow from 1 s, its acknowledgements after the fastest
/// channel's delay, markers every 5 ms, delays equalized.
const FAST_ACKS_EQUALIZED: &str = r#"[traffic]
source = "tcp"
bytes = 1440
ack_delay_ms = "fastest"
start_s = 1
[markers]
max_interval_ms = 5
[receiver]
equalize = true
"#;

/// A scaled-down twin of the lab's loss case (100/50/20 Mbit/s → 20/10/4, same delays,
/// 1 % loss on link 2) through the session in seq mode, plain and with arq+aqm.
fn scaled_loss_twin() -> Scenario {
    parse(&format!(
        "{SCALED_LINKS}{}",
        r#"loss = 0.01
[traffic]
source = "tcp"
bytes = 1440
ack_delay_ms = "slowest"
start_s = 1
[markers]
max_interval_ms = 5
[receiver]
equalize = true
[session]
security = "auth"
aqm = false
arq = "0s"
pace_probe = false
[[run]]
label = "plain"
scheduler = "srr"
receiver = "seq"
[[run]]
label = "arq+aqm"
scheduler = "srr"
receiver = "seq"
set = { "session.arq" = "100ms", "session.aqm" = true }
"#,
    ))
}

#[test]
fn random_loss_on_one_link_repair_and_aqm_carry_tcp_much_further() {
    let sc = scaled_loss_twin();
    let (mut plain, mut fixed) = (0.0, 0.0);
    for seed in 1..=3 {
        let r = run(&sc, seed);
        let p = r.runs[0].tcp.as_ref().expect("tcp");
        let a = r.runs[1].tcp.as_ref().expect("tcp");
        plain += p.goodput_bps;
        fixed += a.goodput_bps;
        assert!(
            a.goodput_bps > p.goodput_bps,
            "seed {seed}: arq+aqm {:.2} vs plain {:.2} Mbit/s",
            a.goodput_bps / 1e6,
            p.goodput_bps / 1e6
        );
        assert!(p.retransmits >= 20, "seed {seed}: plain TCP sees the loss");
        assert!(
            a.retransmits * 10 < p.retransmits,
            "seed {seed}: repaired inside the bond: {} vs {}",
            a.retransmits,
            p.retransmits
        );
        assert!(
            a.ce_marks_seen > 0,
            "seed {seed}: congestion signalled by CE"
        );
    }
    // Measured: plain 8.10 / 8.92 / 6.53, arq+aqm 20.49 / 9.89 / 14.43 Mbit/s (seeds
    // 1, 2, 3; 1.9 times in all) of the links' 32.4 Mbit/s of payload.
    assert!(
        fixed > 1.5 * plain,
        "arq+aqm {:.2} vs plain {:.2} Mbit/s over three seeds",
        fixed / 1e6,
        plain / 1e6
    );
}

/// A scaled-down twin of the lab's wrong-weights case (100/50/20 Mbit/s → 20/10/4,
/// same delays, weights 20/50/100: the slow link is told it is the fastest), logical
/// mode: static weights, adaptive weights, and adaptive weights with every channel
/// paced at its link's rate.
fn scaled_wrong_weights_twin() -> Scenario {
    parse(&format!(
        "{SCALED_LINKS}{FAST_ACKS_EQUALIZED}{}",
        r#"[[run]]
label = "static"
scheduler = "srr"
receiver = "logical"
weights = [1445, 3613, 7225]
[[run]]
label = "adaptive"
scheduler = "srr"
receiver = "logical"
weights = [1445, 3613, 7225]
set = { "session.adaptive" = true }
[[run]]
label = "paced adaptive"
scheduler = "srr"
receiver = "logical"
weights = [1445, 3613, 7225]
set = { "session.adaptive" = true, "session.pace_mbps" = [20.0, 10.0, 4.0] }
"#,
    ))
}

#[test]
fn adaptive_weights_turn_wrong_weights_round_for_one_tcp_flow() {
    let r = run(&scaled_wrong_weights_twin(), 1);
    let bps = |i: usize| r.runs[i].tcp.as_ref().expect("tcp").goodput_bps;
    let (fixed, adaptive, paced) = (bps(0), bps(1), bps(2));
    // The controller sees the slow link's queue (one-way, in the sending direction)
    // and takes weight off it: it was given 59 % of the bytes. (Measured: quanta
    // 1445 / 3070 / 1520 after 5 steps, 25 % on the slow link; the flow grows into each
    // step slowly, so 8 s do not turn them all the way round.)
    let session = |i: usize| r.runs[i].session.as_ref().expect("session");
    let q = &session(1).final_quanta;
    assert!(session(1).quanta_changes > 0, "no step");
    let share = f64::from(q[2]) / q.iter().map(|&x| f64::from(x)).sum::<f64>();
    assert!(share < 0.35, "quanta {q:?}");
    assert!(
        adaptive > 1.3 * fixed,
        "adaptive {:.2} vs static {:.2} Mbit/s",
        adaptive / 1e6,
        fixed / 1e6
    );
    // Paced, the weights start from the rates: the flow gets most of the links' 32.4
    // Mbit/s of payload. (Measured: static 5.84, adaptive 9.50, paced 27.42 Mbit/s.)
    let q = &session(2).final_quanta;
    assert!(q[0] > 2 * q[2], "quanta {q:?}");
    assert!(
        paced > 2.0 * fixed && paced > 0.7 * 32.4e6,
        "paced {:.2} vs static {:.2} Mbit/s",
        paced / 1e6,
        fixed / 1e6
    );
}

/// The scaled wrong-weights twin paced at rates nobody configured right: measured when
/// the channels come up (`pace = "auto"`), and nominal rates (20 Mbit/s each, twice and
/// five times the slower links') with and without the measurement. Repair and AQM off,
/// as when this was measured: with them (the defaults since issue 28) the measured run
/// gets 23.9 Mbit/s, not 27.4 — repair hides the slow start's overflow drops from the
/// flow (an open item of issue 28).
fn scaled_measured_rates_twin() -> Scenario {
    parse(&format!(
        "{SCALED_LINKS}{FAST_ACKS_EQUALIZED}{}",
        r#"[[run]]
label = "static"
scheduler = "srr"
receiver = "logical"
weights = [1445, 3613, 7225]
[[run]]
label = "measured"
scheduler = "srr"
receiver = "logical"
weights = [1445, 3613, 7225]
set = { "session.arq" = "0s", "session.aqm" = false, "session.adaptive" = true, "session.pace_mbps" = [0.0, 0.0, 0.0], "session.pace_probe" = true }
[[run]]
label = "nominal"
scheduler = "srr"
receiver = "logical"
weights = [1445, 3613, 7225]
set = { "session.arq" = "0s", "session.aqm" = false, "session.adaptive" = true, "session.pace_mbps" = [20.0, 20.0, 20.0] }
[[run]]
label = "nominal, measured"
scheduler = "srr"
receiver = "logical"
weights = [1445, 3613, 7225]
set = { "session.arq" = "0s", "session.aqm" = false, "session.adaptive" = true, "session.pace_mbps" = [20.0, 20.0, 20.0], "session.pace_probe" = true }
"#,
    ))
}

#[test]
fn measured_rates_pace_a_bond_whose_rates_nobody_configured() {
    let r = run(&scaled_measured_rates_twin(), 1);
    let bps = |i: usize| r.runs[i].tcp.as_ref().expect("tcp").goodput_bps;
    let (fixed, measured, nominal, nominal_measured) = (bps(0), bps(1), bps(2), bps(3));
    let q = |i: usize| {
        r.runs[i]
            .session
            .as_ref()
            .expect("session")
            .final_quanta
            .clone()
    };
    // Measured, the quanta start from the links' rates (20 : 10 : 4, the smallest the
    // largest packet) and the flow gets what it gets paced at the configured rates
    // (27.42 Mbit/s above). (Measured: static 5.84, measured 27.43 Mbit/s, quanta
    // 7225 / 3612 / 1445.)
    let m = q(1);
    assert!(
        (f64::from(m[0]) / f64::from(m[2]) - 5.0).abs() < 0.25
            && (f64::from(m[1]) / f64::from(m[2]) - 2.5).abs() < 0.15,
        "quanta {m:?}"
    );
    assert!(
        measured > 4.0 * fixed && measured > 0.8 * 32.4e6,
        "measured {:.2} vs static {:.2} Mbit/s",
        measured / 1e6,
        fixed / 1e6
    );
    // Nominal rates far above the slower links': their queues overflow in the flow's
    // slow start before adaptive pacing has seen them, and the flow leaves it early.
    // Measured too, each channel is paced at the lower of the two from the start.
    // (Measured: nominal 15.96, nominal and measured 27.43 Mbit/s.)
    // (The quanta also follow what each channel sends outside the stripe, measured
    // over each step, so the two runs' may differ by a few bytes.)
    let n = q(3);
    assert!(
        n.iter()
            .zip(&m)
            .all(|(a, b)| (f64::from(*a) / f64::from(*b) - 1.0).abs() < 0.01),
        "the lower of nominal and measured is the measured rate: {n:?} against {m:?}"
    );
    assert!(
        nominal_measured > 1.3 * nominal,
        "nominal {:.2}, measured too {:.2} Mbit/s",
        nominal / 1e6,
        nominal_measured / 1e6
    );
}

/// A scaled-down twin of the lab's paced rate drop: link 0 falls from 20 to 6.6 Mbit/s
/// 3 s into the flow; every channel paced at its link's configured rate, static or
/// adaptive.
fn scaled_paced_rate_drop_twin() -> Scenario {
    let links = SCALED_LINKS.replacen(
        "overhead_bytes = 42\n",
        "overhead_bytes = 42\n[[channel.change]]\nat_s = 4.0\nrate_mbps = 6.6\n",
        1,
    );
    parse(&format!(
        "{links}{FAST_ACKS_EQUALIZED}{}",
        r#"[[run]]
label = "paced"
scheduler = "srr"
receiver = "logical"
set = { "session.arq" = "100ms", "session.aqm" = true, "session.adaptive" = false, "session.pace_mbps" = [20.0, 10.0, 4.0] }
[[run]]
label = "paced adaptive"
scheduler = "srr"
receiver = "logical"
set = { "session.arq" = "100ms", "session.aqm" = true, "session.adaptive" = true, "session.pace_mbps" = [20.0, 10.0, 4.0] }
"#,
    ))
}

#[test]
fn adaptive_pacing_follows_a_link_whose_rate_drops() {
    let r = run(&scaled_paced_rate_drop_twin(), 1);
    // Goodput over the flow's last 4 s (the drop came at 4 s, the run ends at 9 s).
    let last = |i: usize| {
        let s = &r.runs[i].tcp.as_ref().expect("tcp").goodput_series_bps;
        let tail = &s[s.len().saturating_sub(40)..];
        tail.iter().sum::<f64>() / tail.len().max(1) as f64
    };
    let (fixed, adaptive) = (last(0), last(1));
    // What is left: 6.6 + 10 + 4 Mbit/s on the wire, about 19 Mbit/s of payload. Paced
    // at 20 Mbit/s, link 0's queue overflows and the stripe still gives it a share
    // proportional to 20: the bond carries about what 4 Mbit/s on link 2 allows for its
    // share. Adaptive pacing finds link 0's new rate and the quanta follow. (Measured:
    // static 12.3, adaptive 17.1 Mbit/s, quanta 2420 / 3613 / 1445; the unpaced
    // controller's steps on the same estimates gave 13.9, quanta 1485 / 2840 / 1445.)
    let q = &r.runs[1].session.as_ref().expect("session").final_quanta;
    assert!(
        f64::from(q[0]) < 0.9 * f64::from(q[1]),
        "link 0 is weighted below link 1 now: quanta {q:?}"
    );
    assert!(
        adaptive > 1.1 * fixed && adaptive > 0.8 * 19e6,
        "last 4 s: adaptive {:.2} vs static {:.2} Mbit/s",
        adaptive / 1e6,
        fixed / 1e6
    );
}

/// The scaled links striped (logical, no session), the acknowledgements as `acks`.
fn scaled_striped_with_acks(acks: &str) -> Scenario {
    parse(&format!(
        r#"{SCALED_LINKS}[traffic]
source = "tcp"
bytes = 1440
{acks}
start_s = 1
[markers]
max_interval_ms = 5
[[run]]
label = "striped"
scheduler = "srr"
receiver = "logical"
"#
    ))
}

#[test]
fn acknowledgements_take_the_slowest_delay_for_the_first_stretch() {
    let tcp = |acks: &str| {
        let r = run(&scaled_striped_with_acks(acks), 1);
        r.runs[0].tcp.clone().expect("tcp")
    };
    let slowest = tcp("ack_delay_ms = \"slowest\"");
    let fastest = tcp("ack_delay_ms = \"fastest\"");
    // Slow for longer than the run: the same flow as "slowest" throughout.
    let always = tcp("ack_delay_ms = \"fastest\"\nack_slowest_for_ms = 60000");
    assert_eq!(always.goodput_bps, slowest.goodput_bps);
    assert_eq!(always.retransmits, slowest.retransmits);
    // Slow for the first second (the tunnel's return path cuts over after its hold):
    // the round trip falls to the fast path's afterwards, and the flow is neither.
    let first = tcp("ack_delay_ms = \"fastest\"\nack_slowest_for_ms = 1000");
    assert!(
        first.min_rtt_ms < slowest.min_rtt_ms,
        "min rtt {} vs {}",
        first.min_rtt_ms,
        slowest.min_rtt_ms
    );
    assert_ne!(first.goodput_bps, fastest.goodput_bps);
    assert_ne!(first.goodput_bps, slowest.goodput_bps);
    let e = parse_err(&one_channel(10.0, "").replace(
        "header_bytes = 52",
        "header_bytes = 52\nack_slowest_for_ms = -1",
    ));
    assert!(e.contains("traffic.ack_slowest_for_ms"), "{e}");
}

#[test]
fn same_seed_same_result_other_seed_other_losses() {
    let sc = parse(&one_channel(10.0, "loss = 0.005"));
    let a = run(&sc, 7);
    let b = run(&sc, 7);
    assert_eq!(a.to_json(), b.to_json());
    let c = run(&sc, 8);
    assert_ne!(
        a.runs[0].tcp.as_ref().map(|t| t.retransmits),
        None,
        "a tcp run"
    );
    assert_ne!(a.to_json(), c.to_json(), "another seed draws other losses");
}

#[test]
fn bad_tcp_keys_are_named() {
    let base = one_channel(10.0, "");
    let e = parse_err(&base.replace("bytes = 1440", "bytes = 1440\ncc = \"vegas\""));
    assert!(e.contains("traffic.cc") && e.contains("vegas"), "{e}");
    let e = parse_err(&base.replace("bytes = 1440", "bytes = 40"));
    assert!(e.contains("traffic.bytes") && e.contains("44"), "{e}");
    let e = parse_err(&base.replace("header_bytes = 52", "header_bytes = 1440"));
    assert!(e.contains("traffic.header_bytes"), "{e}");
    let e = parse_err(&base.replace("bytes = 1440", "bytes = 1440\nack_delay_ms = \"soon\""));
    assert!(e.contains("traffic.ack_delay_ms"), "{e}");
    let e = parse_err(&base.replace("bytes = 1440", "bytes = 1440\nrwnd_packets = 0"));
    assert!(e.contains("traffic.rwnd_packets"), "{e}");
    let e = parse_err(&base.replace("source = \"tcp\"", "source = \"tcp\"\nsizes = \"imix\""));
    assert!(e.contains("traffic.sizes"), "{e}");
    let e = parse_err(&base.replace("duration_s = 6", "packets = 100"));
    assert!(e.contains("packets"), "{e}");
    // TCP keys on another source.
    let e = parse_err(
        &base
            .replace("source = \"tcp\"", "source = \"cbr\"\nrate_mbps = 1")
            .replace("header_bytes = 52", "rwnd_packets = 10"),
    );
    assert!(
        e.contains("traffic.rwnd_packets") && e.contains("only for source"),
        "{e}"
    );
}

#[test]
fn the_congestion_twins_load() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/congestion");
    for f in [
        "tcp-nodelay.toml",
        "tcp-delay.toml",
        "tcp-loss.toml",
        "tcp-rate-drop.toml",
        "tcp-wrong-weights.toml",
    ] {
        let sc = scenario::load(&dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(sc.jobs.len() >= 5, "{f}");
    }
}
