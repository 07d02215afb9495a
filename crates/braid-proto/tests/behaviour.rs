//! Behaviour of the striper and resequencer in specific situations.

use braid_proto::harness::{payload, payload_id, Harness, Link};
use braid_proto::sched::baseline::BaselineKind;
use braid_proto::sched::Position;
use braid_proto::*;
use bytes::Bytes;

fn data(len: usize) -> Bytes {
    payload(0, len)
}

fn channels_of(s: &mut Striper, sizes: &[usize]) -> Vec<usize> {
    let mut out = Vec::new();
    for &l in sizes {
        s.handle_packet(Instant::ZERO, data(l)).unwrap();
        while let Some(t) = s.poll_transmit() {
            if t.kind == TransmitKind::Data {
                out.push(t.channel);
            }
        }
    }
    out
}

#[test]
fn srr_matches_the_papers_figure_6() {
    // Quantum 500 on both channels; packets a=550, d=300, e=300, b=200, c=300. The
    // figure's 550-byte packet exceeds its quantum, which braid's configs reject
    // (Quantum_i >= Max), so drive the scheduler directly as the figure does.
    assert!(StripeConfig::srr(vec![500, 500], 550).validate().is_err());
    let mut s = braid_proto::sched::Srr::new(&[500, 500], braid_proto::sched::Cost::Bytes);
    let mut chans = Vec::new();
    for len in [550, 300, 300, 200, 300] {
        chans.push(s.select());
        s.on_sent(len);
    }
    assert_eq!(chans, vec![0, 1, 1, 0, 0]);
    assert_eq!(s.position(0).dc, 500 - 50); // -50 carried as a penalty, then +500
}

#[test]
fn alternating_sizes_srr_shares_bytes_rr_does_not() {
    let sizes: Vec<usize> = (0..1000)
        .map(|i| if i % 2 == 0 { 1000 } else { 200 })
        .collect();
    let mut srr = Striper::new(StripeConfig::srr(vec![1500, 1500], 1500)).unwrap();
    let c = channels_of(&mut srr, &sizes);
    let bytes0: usize = c
        .iter()
        .zip(&sizes)
        .filter(|(c, _)| **c == 0)
        .map(|(_, s)| s)
        .sum();
    let bytes1: usize = c
        .iter()
        .zip(&sizes)
        .filter(|(c, _)| **c == 1)
        .map(|(_, s)| s)
        .sum();
    assert!((bytes0 as i64 - bytes1 as i64).abs() <= 1500 + 2 * 1500);

    let mut cfg = StripeConfig::srr(vec![1, 1], 1500);
    cfg.policy = Policy::Causal(SchedulerKind::Rr);
    let mut rr = Striper::new(cfg).unwrap();
    let c = channels_of(&mut rr, &sizes);
    // All big packets on channel 0, all small ones on channel 1 (seed 000 §2.1).
    assert!(c.iter().zip(&sizes).all(|(c, s)| (*c == 0) == (*s == 1000)));
}

#[test]
fn grr_sends_integer_ratio() {
    let mut cfg = StripeConfig::srr(sched::grr_weights(&[10e6, 5e6]), 1500);
    cfg.policy = Policy::Causal(SchedulerKind::Grr);
    let mut s = Striper::new(cfg).unwrap();
    let c = channels_of(&mut s, &[1000; 9]);
    assert_eq!(c, vec![0, 0, 1, 0, 0, 1, 0, 0, 1]);
}

fn markers_sent(pos: MarkerPosition, every: u32, packets: usize) -> Vec<(usize, usize)> {
    let mut cfg = StripeConfig::srr(vec![1500, 1500, 1500], 1500);
    cfg.markers.every_rounds = every;
    cfg.markers.position = pos;
    let mut s = Striper::new(cfg).unwrap();
    let mut out = Vec::new();
    let mut n = 0;
    for _ in 0..packets {
        s.handle_packet(Instant::ZERO, data(1500)).unwrap();
        while let Some(t) = s.poll_transmit() {
            match t.kind {
                TransmitKind::Data => n += 1,
                _ => out.push((n, t.channel)),
            }
        }
    }
    out
}

#[test]
fn markers_every_k_rounds_at_the_chosen_position() {
    // 1500-byte packets, quantum 1500: one packet per channel per round, 3 per round.
    let end = markers_sent(MarkerPosition::End, 2, 12);
    assert_eq!(
        end.iter().map(|m| m.0).collect::<Vec<_>>(),
        vec![6, 6, 6, 12, 12, 12]
    );
    let start = markers_sent(MarkerPosition::Start, 2, 12);
    assert_eq!(
        start.iter().map(|m| m.0).collect::<Vec<_>>(),
        vec![0, 0, 0, 6, 6, 6]
    );
    let mid = markers_sent(MarkerPosition::Channel(1), 2, 12);
    assert_eq!(
        mid.iter().map(|m| m.0).collect::<Vec<_>>(),
        vec![1, 1, 1, 7, 7, 7]
    );
    assert_eq!(
        end.iter().map(|m| m.1).collect::<Vec<_>>(),
        vec![0, 1, 2, 0, 1, 2]
    );
}

#[test]
fn idle_markers_after_timeout() {
    let mut cfg = StripeConfig::srr(vec![1500, 1500], 1500);
    cfg.markers.every_rounds = 0;
    cfg.markers.idle = Some(Duration::from_millis(5));
    let mut s = Striper::new(cfg).unwrap();
    assert_eq!(s.poll_timeout(), None);
    s.handle_packet(Instant::from_micros(1000), data(100))
        .unwrap();
    while s.poll_transmit().is_some() {}
    assert_eq!(s.poll_timeout(), Some(Instant::from_micros(6000)));
    s.handle_timeout(Instant::from_micros(5999));
    assert!(s.poll_transmit().is_none());
    s.handle_timeout(Instant::from_micros(6000));
    let kinds: Vec<_> = std::iter::from_fn(|| s.poll_transmit())
        .map(|t| t.kind)
        .collect();
    assert_eq!(kinds, vec![TransmitKind::Marker, TransmitKind::Marker]);
    assert_eq!(s.poll_timeout(), None, "only once per idle period");
}

#[test]
fn oversize_and_empty_packets_are_refused() {
    let mut s = Striper::new(StripeConfig::srr(vec![1500], 1500)).unwrap();
    assert_eq!(
        s.handle_packet(Instant::ZERO, Bytes::new()),
        Err(SendError::Empty)
    );
    assert!(matches!(
        s.handle_packet(Instant::ZERO, data(1501)),
        Err(SendError::TooLarge { len: 1501, .. })
    ));
    // Escaping adds a byte: a 1500-byte payload starting with 0xB1 no longer fits.
    let mut v = vec![0u8; 1500];
    v[0] = wire::TYPE_MARKER;
    assert!(s.handle_packet(Instant::ZERO, Bytes::from(v)).is_err());
}

#[test]
fn escaped_payloads_arrive_intact() {
    let cfg = StripeConfig::srr(vec![1500, 1500], 1500);
    let mut h = Harness::new(cfg, vec![Link::default(), Link::default()], 1).unwrap();
    let msgs: Vec<Bytes> = (0..20u8)
        .map(|i| Bytes::from(vec![0xB0 + (i % 16), i, 7]))
        .collect();
    for (i, m) in msgs.iter().enumerate() {
        h.send_at(Instant::from_micros(i as u64), m.clone());
    }
    h.drive();
    let got: Vec<Bytes> = h.delivered.iter().map(|(_, p)| p.clone()).collect();
    assert_eq!(got, msgs);
}

#[test]
fn baseline_runs_with_mode_none() {
    let mut cfg = StripeConfig::srr(vec![1500, 1500], 1500);
    cfg.policy = Policy::Baseline(BaselineKind::ShortestQueue);
    cfg.mode = Mode::None;
    let mut s = Striper::new(cfg.clone()).unwrap();
    s.set_backlog(0, 10_000);
    s.handle_packet(Instant::ZERO, data(100)).unwrap();
    assert_eq!(s.poll_transmit().unwrap().channel, 1);
    assert!(Resequencer::new(&cfg).is_ok());
    cfg.mode = Mode::Logical;
    assert!(matches!(
        Resequencer::new(&cfg),
        Err(ConfigError::NonCausal { .. })
    ));
}

/// A dead channel: the receiver waits at most `max_wait` of silence, then carries on.
#[test]
fn dead_channel_is_given_up_after_max_wait() {
    for mode in [Mode::Logical, Mode::Seq, Mode::Trr] {
        let mut cfg = StripeConfig::srr(vec![1500, 1500], 1500);
        cfg.mode = mode;
        cfg.trigger_every = 16;
        cfg.receiver.max_wait = Duration::from_millis(50);
        let mut links = vec![Link::default(), Link::default()];
        links[1].loss = 1.0;
        links[1].loss_window = Some((
            Instant::from_micros(10_000),
            Instant::from_micros(100_000_000),
        ));
        let mut h = Harness::new(cfg, links, 3).unwrap();
        for i in 0..400u64 {
            h.send_at(Instant::from_micros(i * 100), payload(i, 1000));
        }
        h.drive();
        let got: Vec<u64> = h.delivered.iter().map(|(_, p)| payload_id(p)).collect();
        // Channel 0 carries every other packet; most of them must get through.
        let late = got.iter().filter(|&&i| i >= 200).count();
        assert!(
            late >= 90,
            "{mode:?}: only {late} packets after the channel died"
        );
        assert!(h.reseq.stats().channels[1].wait_timeouts > 0, "{mode:?}");
        if mode != Mode::Logical {
            assert!(got.windows(2).all(|w| w[0] < w[1]), "{mode:?} out of order");
        }
    }
}

#[test]
fn buffer_limit_bounds_memory_and_counts_overflow() {
    let mut cfg = StripeConfig::srr(vec![1500, 1500], 1500);
    cfg.receiver.buffer_packets = 8;
    let mut r = Resequencer::new(&cfg).unwrap();
    // Everything arrives on channel 1 while the receiver waits on channel 0.
    for i in 0..100u64 {
        r.handle_datagram(Instant::ZERO, 1, payload(i, 1400));
        while r.poll_deliver().is_some() {}
        assert!(r.buffered() <= 16);
    }
    let st = r.stats();
    assert!(
        st.channels[0].wait_timeouts > 0,
        "forced progress past channel 0"
    );
    assert!(st.channels[1].buffer_high_water <= 8);
}

#[test]
fn malformed_input_is_counted() {
    let cfg = StripeConfig::srr(vec![1500, 1500], 1500);
    let mut r = Resequencer::new(&cfg).unwrap();
    r.handle_datagram(Instant::ZERO, 0, Bytes::new());
    r.handle_datagram(
        Instant::ZERO,
        0,
        Bytes::from_static(&[wire::TYPE_MARKER, 1, 0]),
    );
    r.handle_datagram(Instant::ZERO, 7, data(100));
    r.handle_datagram(Instant::ZERO, 0, Bytes::from_static(&[0xB9, 0]));
    // A valid marker that names channel 1 but arrived on channel 0.
    let m = wire::marker::Repr {
        channel: 1,
        epoch: 0,
        position: sched::Position { round: 0, dc: 1500 },
        sent: 0,
        batch: 0,
        credits: None,
        quantum_change: None,
        stamp: None,
    };
    r.handle_datagram(Instant::ZERO, 0, Bytes::from(m.to_vec()));
    assert_eq!(r.stats().malformed, 5);
    assert_eq!(r.stats().delivered_packets, 0);
}

#[test]
fn max_interval_bounds_the_wait_for_the_next_trigger() {
    let mut cfg = StripeConfig::srr(vec![1500, 1500], 1500);
    cfg.mode = Mode::Trr;
    cfg.trigger_every = 1000;
    cfg.markers.idle = None;
    cfg.markers.max_interval = Some(Duration::from_millis(2));
    let mut s = Striper::new(cfg).unwrap();
    assert_eq!(s.poll_timeout(), None);
    s.handle_packet(Instant::from_micros(100), data(500))
        .unwrap();
    s.handle_packet(Instant::from_micros(900), data(500))
        .unwrap();
    while s.poll_transmit().is_some() {}
    // Measured from the first packet not yet covered by a trigger.
    assert_eq!(s.poll_timeout(), Some(Instant::from_micros(2100)));
    s.handle_timeout(Instant::from_micros(2100));
    let kinds: Vec<_> = std::iter::from_fn(|| s.poll_transmit())
        .map(|t| t.kind)
        .collect();
    assert_eq!(kinds, vec![TransmitKind::Trigger, TransmitKind::Trigger]);
    assert_eq!(s.poll_timeout(), None, "nothing sent since");
}

/// Markers a striper sends while `n` packets of 1000 bytes go out one every 100 µs
/// (two channels of quantum 1500: a round every 3 packets).
fn markers_timed(s: &mut Striper, n: u64) -> usize {
    let mut markers = 0;
    for i in 0..n {
        let now = Instant::from_micros(100 * i);
        s.handle_timeout(now);
        s.handle_packet(now, payload(i, 1000)).unwrap();
        markers += std::iter::from_fn(|| s.poll_transmit())
            .filter(|t| t.kind == TransmitKind::Marker)
            .count();
    }
    markers
}

/// While quiet, markers come `quiet_interval / max_interval` times less often, by time
/// and by rounds alike; not quiet (the start), as configured; without a
/// `quiet_interval`, `set_quiet` changes nothing.
#[test]
fn quiet_markers_thin_out_by_time_and_by_rounds() {
    let mut cfg = StripeConfig::srr(vec![1500, 1500], 1500);
    cfg.markers.idle = None;
    cfg.markers.max_interval = Some(Duration::from_millis(5));
    cfg.markers.quiet_interval = Some(Duration::from_millis(20));
    // By rounds: a round every 300 µs, markers every 8 rounds (2.4 ms) before 5 ms.
    let dense = markers_timed(&mut Striper::new(cfg.clone()).unwrap(), 3000);
    let mut s = Striper::new(cfg.clone()).unwrap();
    s.set_quiet(true);
    let quiet = markers_timed(&mut s, 3000);
    // 1000 rounds in 300 ms: every 8 → 125 batches; every 32 → 31 (two channels each).
    assert_eq!(dense, 2 * 125);
    assert_eq!(quiet, 2 * 31);
    // By time alone: round markers off, 300 ms of data.
    cfg.markers.every_rounds = 0;
    let dense = markers_timed(&mut Striper::new(cfg.clone()).unwrap(), 3000);
    let mut s = Striper::new(cfg.clone()).unwrap();
    s.set_quiet(true);
    let quiet = markers_timed(&mut s, 3000);
    assert!((2 * 58..=2 * 60).contains(&dense), "{dense}");
    assert!((2 * 14..=2 * 15).contains(&quiet), "{quiet}");
    // Without a quiet interval nothing changes.
    cfg.markers.quiet_interval = None;
    let mut s = Striper::new(cfg.clone()).unwrap();
    s.set_quiet(true);
    assert_eq!(markers_timed(&mut s, 3000), dense);
}

/// TRR's triggers release the receiver's data: quiet leaves their interval alone.
#[test]
fn quiet_leaves_trr_triggers_alone() {
    let mut cfg = StripeConfig::srr(vec![1500, 1500], 1500);
    cfg.mode = Mode::Trr;
    cfg.trigger_every = 1000;
    cfg.markers.idle = None;
    cfg.markers.max_interval = Some(Duration::from_millis(2));
    cfg.markers.quiet_interval = Some(Duration::from_millis(20));
    let mut s = Striper::new(cfg).unwrap();
    s.set_quiet(true);
    s.handle_packet(Instant::from_micros(100), data(500))
        .unwrap();
    while s.poll_transmit().is_some() {}
    assert_eq!(s.poll_timeout(), Some(Instant::from_micros(2100)));
}

/// `drain` delivers what can be delivered, in order, and empties the buffers.
#[test]
fn drain_flushes_every_mode_in_order() {
    for mode in [Mode::Logical, Mode::Seq, Mode::Trr] {
        let mut cfg = StripeConfig::srr(vec![1500, 1500], 1500);
        cfg.mode = mode;
        cfg.trigger_every = 4;
        cfg.markers.every_rounds = 1;
        let mut s = Striper::new(cfg.clone()).unwrap();
        let mut r = Resequencer::new(&cfg).unwrap();
        let mut sent = Vec::new();
        for i in 0..40u64 {
            s.handle_packet(Instant::ZERO, payload(i, 1000)).unwrap();
        }
        s.flush();
        while let Some(t) = s.poll_transmit() {
            sent.push(t);
        }
        // Channel 1 loses its first data packet and everything is buffered behind it.
        let mut dropped = false;
        for t in sent.iter().filter(|t| t.channel == 0) {
            r.handle_datagram(Instant::ZERO, 0, t.to_bytes());
        }
        for t in sent.iter().filter(|t| t.channel == 1) {
            if !dropped && t.kind == TransmitKind::Data {
                dropped = true;
                continue;
            }
            r.handle_datagram(Instant::ZERO, 1, t.to_bytes());
        }
        r.drain(Instant::ZERO);
        assert_eq!(r.buffered(), 0, "{mode:?}");
        let got: Vec<u64> = std::iter::from_fn(|| r.poll_deliver())
            .map(|p| payload_id(&p))
            .collect();
        assert!(got.len() >= 30, "{mode:?}: {}", got.len());
        if mode != Mode::Logical {
            assert!(got.windows(2).all(|w| w[0] < w[1]), "{mode:?}: {got:?}");
        }
    }
}

#[test]
fn markers_carry_the_epoch() {
    let mut s = Striper::new(StripeConfig::srr(vec![1500], 1500)).unwrap();
    s.set_epoch(7);
    s.flush();
    let t = s.poll_transmit().unwrap();
    let m = wire::marker::Packet::new_checked(&t.payload[..]).unwrap();
    assert_eq!(m.epoch(), 7);
}

/// Delay equalization: over channels of 5, 20 and 60 ms, a sparse stream comes out with
/// the same delay for every packet (the slowest channel's), not the channel's own.
#[test]
fn equalization_gives_every_packet_the_slowest_delay() {
    let mut cfg = StripeConfig::srr(vec![1500, 1500, 1500], 1500);
    cfg.markers.every_rounds = 1;
    cfg.receiver.equalize = true;
    let links: Vec<Link> = [5u64, 20, 60]
        .iter()
        .map(|&ms| Link {
            delay: Duration::from_millis(ms),
            ..Link::default()
        })
        .collect();
    let mut h = Harness::new(cfg, links, 1).unwrap();
    // One packet every 10 ms: without equalization those on channel 0 would take 5 ms.
    for i in 0..300u64 {
        h.send_at(Instant::from_micros(i * 10_000), payload(i, 1500));
    }
    h.drive();
    let delays: Vec<u64> = h
        .delivered
        .iter()
        .map(|(t, p)| t.as_micros() - payload_id(p) * 10_000)
        .collect();
    assert_eq!(delays.len(), 300);
    // After the first marker batches have measured the skew:
    for (i, d) in delays.iter().enumerate().skip(30) {
        assert!((59_000..=61_000).contains(d), "packet {i}: delay {d} us");
    }
}

/// `seq` mode with repair, packets 0..6 of 1000 bytes; packet 0 is lost. Returns the
/// striper and the resequencer after the arrivals, with the NAK they produced.
fn lose_first_packet(tx_epoch: u32, rx_epoch: u32) -> (Striper, Resequencer, Bytes) {
    let mut cfg = StripeConfig::srr(vec![1500, 1500], 1500);
    cfg.mode = Mode::Seq;
    cfg.receiver.repair = Some(Duration::from_millis(10));
    let mut s = Striper::new(cfg.clone()).unwrap();
    let mut r = Resequencer::new(&cfg).unwrap();
    s.set_epoch(tx_epoch);
    r.set_epoch(rx_epoch);
    let mut first = true;
    for i in 0..6 {
        s.handle_packet(Instant::ZERO, payload(i, 1000)).unwrap();
        while let Some(t) = s.poll_transmit() {
            if t.kind == TransmitKind::Data && std::mem::take(&mut first) {
                continue;
            }
            r.handle_datagram(Instant::ZERO, t.channel, t.to_bytes());
        }
    }
    let nak = r.poll_nak().expect("packet 0 is missing on every channel");
    (s, r, nak)
}

#[test]
fn naks_carry_the_receivers_epoch() {
    let (_, _, nak) = lose_first_packet(3, 3);
    let parsed = wire::nak::Repr::parse(&nak).unwrap();
    assert_eq!(parsed.epoch, 3);
    assert_eq!(parsed.seqs, vec![0]);
}

#[test]
fn naks_for_the_current_epoch_are_repaired() {
    let (mut s, mut r, nak) = lose_first_packet(3, 3);
    assert_eq!(s.handle_nak(&nak), 1);
    assert_eq!(s.stats().stale_naks, 0);
    while let Some(t) = s.poll_transmit() {
        assert_eq!(t.kind, TransmitKind::Repair);
        assert_eq!(t.header()[0], wire::TYPE_REPAIR);
        r.handle_datagram(Instant::ZERO, t.channel, t.to_bytes());
    }
    let ids: Vec<u64> = std::iter::from_fn(|| r.poll_deliver())
        .map(|p| payload_id(&p))
        .collect();
    assert_eq!(ids, (0..6).collect::<Vec<_>>());
    assert_eq!(r.stats().repaired, 1);
}

#[test]
fn naks_for_another_epoch_are_ignored_and_counted() {
    // The receiver is still in epoch 2 while the striper has moved on to 3.
    let (mut s, _, nak) = lose_first_packet(3, 2);
    assert_eq!(s.handle_nak(&nak), 0);
    assert!(s.poll_transmit().is_none());
    assert_eq!(s.stats().stale_naks, 1);
    // The same numbers for the striper's own epoch are repaired.
    let current = wire::nak::Repr {
        epoch: 3,
        seqs: vec![0],
    };
    assert_eq!(s.handle_nak(&current.to_vec()), 1);
    assert_eq!(s.stats().stale_naks, 1);
}

/// What a driver does when it learns that channel 1 ends at `next` (`sent` packets).
type EndAction = fn(&mut Resequencer, Instant, Position, u64);

/// A run's deliveries (with their times) and the receiver's state (stats, buffered,
/// timer) right after the end and after a final drain.
type Trace = (Vec<(Instant, Bytes)>, Vec<(Stats, usize, Option<Instant>)>);

/// 48 packets of 700 bytes, one every 200 µs, on two channels, a marker batch every
/// round; channel 0 is 2 ms slower than channel 1 (so with equalization on, channel 1's
/// datagrams are held), and channel 1 loses everything sent with the packets in `lost`
/// (`30..34`: it comes back; `30..48`: it stays dark, as a channel that ends does). After
/// packet 33 the receiver is told, by `end`, where channel 1's next packet is.
fn channel_one_ends(cfg: &StripeConfig, lost: std::ops::Range<u64>, end: EndAction) -> Trace {
    let mut s = Striper::new(cfg.clone()).unwrap();
    // (arrival, order, channel and datagram, or None for the end)
    type Event = (Instant, u64, Option<(usize, Bytes)>);
    let mut events: Vec<Event> = Vec::new();
    let mut order = 0;
    let mut ending = None;
    for i in 0..48u64 {
        let now = Instant::from_micros(i * 200);
        s.handle_packet(now, payload(i, 700)).unwrap();
        while let Some(t) = s.poll_transmit() {
            order += 1;
            if t.channel == 1 && lost.contains(&i) {
                continue;
            }
            let delay = Duration::from_micros(if t.channel == 0 { 2_000 } else { 0 });
            events.push((now + delay, order, Some((t.channel, t.to_bytes()))));
        }
        if i == 33 {
            order += 1;
            events.push((now, order, None));
            ending = Some((s.scheduler().unwrap().position(1), s.packets_sent()));
        }
    }
    let (next, sent) = ending.unwrap();
    events.sort_by_key(|(t, o, _)| (*t, *o));
    let mut r = Resequencer::new(cfg).unwrap();
    let (mut out, mut states) = (Vec::new(), Vec::new());
    let mut last = Instant::ZERO;
    for (at, _, ev) in events {
        for _ in 0..100 {
            match r.poll_timeout() {
                Some(t) if t <= at => r.handle_timeout(t),
                _ => break,
            }
        }
        match ev {
            Some((c, d)) => r.handle_datagram(at, c, d),
            None => {
                end(&mut r, at, next, sent);
                states.push((r.stats().clone(), r.buffered(), r.poll_timeout()));
            }
        }
        out.extend(std::iter::from_fn(|| r.poll_deliver()).map(|p| (at, p)));
        last = at;
    }
    r.drain(last);
    out.extend(std::iter::from_fn(|| r.poll_deliver()).map(|p| (last, p)));
    states.push((r.stats().clone(), r.buffered(), r.poll_timeout()));
    (out, states)
}

#[test]
fn end_channel_equals_the_final_marker() {
    let by_api: EndAction = |r, now, next, sent| r.end_channel(now, 1, next, sent);
    let by_marker: EndAction = |r, now, next, sent| {
        let m = wire::marker::Repr {
            channel: 1,
            epoch: 0,
            position: next,
            sent,
            batch: 0,
            credits: None,
            quantum_change: None,
            stamp: None,
        };
        r.handle_datagram(now, 1, Bytes::from(m.to_vec()));
    };
    let nothing: EndAction = |_, _, _, _| {};
    for mode in [Mode::Logical, Mode::Seq] {
        for equalize in [false, true] {
            let mut cfg = StripeConfig::srr(vec![1500, 1500], 1500);
            cfg.mode = mode;
            cfg.markers.every_rounds = 1;
            cfg.receiver.equalize = equalize;
            for lost in [30..34, 30..48] {
                let what = format!("{mode:?}, equalize {equalize}, lost {lost:?}");
                let api = channel_one_ends(&cfg, lost.clone(), by_api);
                let marker = channel_one_ends(&cfg, lost.clone(), by_marker);
                assert_eq!(api, marker, "{what}");
                // The end is not a no-op: it changes what the receiver does.
                assert_ne!(api, channel_one_ends(&cfg, lost, nothing), "{what}");
            }
        }
    }
}

#[test]
fn end_channel_is_a_no_op_without_markers_or_position() {
    let mut cfg = StripeConfig::srr(vec![1500, 1500], 1500);
    for mode in [Mode::None, Mode::Trr, Mode::Logical] {
        cfg.mode = mode;
        let mut s = Striper::new(cfg.clone()).unwrap();
        let mut r = Resequencer::new(&cfg).unwrap();
        for i in 0..20 {
            s.handle_packet(Instant::ZERO, payload(i, 700)).unwrap();
            while let Some(t) = s.poll_transmit() {
                if t.channel == 0 {
                    r.handle_datagram(Instant::ZERO, 0, t.to_bytes());
                }
            }
        }
        while r.poll_deliver().is_some() {}
        let (next, sent) = (s.scheduler().unwrap().position(1), s.packets_sent());
        let before = (r.stats().clone(), r.buffered(), r.poll_timeout());
        let next = match mode {
            // A position with no valid counter means nothing in any mode.
            Mode::Logical => Position {
                round: next.round,
                dc: 0,
            },
            _ => next,
        };
        r.end_channel(Instant::from_micros(5_000), 1, next, sent);
        assert!(r.poll_deliver().is_none(), "{mode:?}");
        assert_eq!(r.stats().channels[1].markers_received, 0, "{mode:?}");
        assert_eq!(
            (r.stats().clone(), r.buffered(), r.poll_timeout()),
            before,
            "{mode:?}"
        );
    }
}

/// A sequenced data datagram (or a repair) carrying `payload(id)` under number `seq`.
fn seq_datagram(seq: u32, id: u64, repair: bool) -> Bytes {
    let mut h = [0u8; wire::seq::HEADER_LEN];
    wire::seq::Repr { seq, repair }.emit(&mut h);
    let mut v = h.to_vec();
    v.extend_from_slice(&payload(id, 200));
    Bytes::from(v)
}

/// A seq-mode stream of 200 packets over two channels with `forged(i, channel)` sent
/// before every genuine packet on both channels: every forgery is refused as out of
/// window, and the stream arrives whole and in order.
fn seq_stream_survives(forged: impl Fn(u64, usize) -> Bytes) {
    let mut cfg = StripeConfig::srr(vec![1500, 1500], 1500);
    cfg.mode = Mode::Seq;
    let mut s = Striper::new(cfg.clone()).unwrap();
    let mut r = Resequencer::new(&cfg).unwrap();
    let mut delivered = Vec::new();
    for i in 0..200u64 {
        for c in 0..2 {
            r.handle_datagram(Instant::ZERO, c, forged(i, c));
        }
        s.handle_packet(Instant::ZERO, payload(i, 200)).unwrap();
        while let Some(t) = s.poll_transmit() {
            r.handle_datagram(Instant::ZERO, t.channel, t.to_bytes());
        }
        delivered.extend(std::iter::from_fn(|| r.poll_deliver()).map(|p| payload_id(&p)));
    }
    assert_eq!(delivered, (0..200).collect::<Vec<_>>());
    assert_eq!(r.stats().out_of_window, 400);
    assert_eq!(r.stats().lost, 0);
}

#[test]
fn seq_refuses_numbers_far_ahead_so_a_forgery_cannot_skip_the_stream() {
    seq_stream_survives(|i, _| seq_datagram(0x4000_0000 + i as u32, 9_999, false));
}

#[test]
fn repairs_are_accepted_only_for_naked_numbers_and_made_once() {
    let (mut s, mut r, nak) = lose_first_packet(0, 0);
    // A "repair" of a number nobody asked for is refused.
    r.handle_datagram(Instant::ZERO, 0, seq_datagram(4, 777, true));
    assert_eq!(r.stats().out_of_window, 1);
    // The NAK arrives on both channels: the packet is repaired once per channel, not
    // once per channel per copy.
    assert_eq!(s.handle_nak(&nak), 1);
    assert_eq!(s.handle_nak(&nak), 0);
    assert_eq!(s.stats().repeat_naks, 1);
    let repairs = std::iter::from_fn(|| s.poll_transmit()).count();
    assert_eq!(repairs, 2);
}

/// A marker that names a round far ahead (forged with security off, or sent after a
/// very long outage) must not make forced progress or a drain walk there one round at
/// a time: both used to spin for ~2^40 rounds (found by the `reseq` fuzz target).
#[test]
fn a_marker_far_ahead_costs_no_spin_in_forced_progress_or_drain() {
    for random in [false, true] {
        let mut cfg = StripeConfig::srr(vec![1500, 1500, 1500], 1500);
        if random {
            cfg.policy = Policy::Causal(SchedulerKind::Random { seed: 7 });
        }
        cfg.receiver.buffer_packets = 8;
        let mut r = Resequencer::new(&cfg).unwrap();
        let far = 1u64 << 40;
        let m = wire::marker::Repr {
            channel: 2,
            epoch: 0,
            position: sched::Position {
                round: far,
                dc: 1500,
            },
            sent: 0,
            batch: 0,
            credits: None,
            quantum_change: None,
            stamp: None,
        };
        r.handle_datagram(Instant::ZERO, 2, Bytes::from(m.to_vec()));
        // Channel 2's buffer fills while channels 0 and 1 stay silent: forced progress.
        for i in 0..20u64 {
            r.handle_datagram(Instant::ZERO, 2, payload(i, 100));
        }
        let mut got = 0;
        while r.poll_deliver().is_some() {
            got += 1;
        }
        r.handle_datagram(Instant::ZERO, 2, payload(99, 100));
        r.drain(Instant::ZERO);
        while r.poll_deliver().is_some() {
            got += 1;
        }
        assert!(
            got > 0,
            "data behind the far marker is delivered (random: {random})"
        );
        assert_eq!(r.buffered(), 0);
    }
}

/// The same window for a marker's count of packets sent: markers on every channel
/// claiming a count far ahead would otherwise put every channel past numbers it never
/// carried and skip the stream (found by the `reseq` fuzz target as an overflow).
#[test]
fn seq_refuses_markers_whose_count_is_far_ahead() {
    seq_stream_survives(|i, c| {
        let forged = wire::marker::Repr {
            channel: c as u8,
            epoch: 0,
            position: sched::Position { round: i, dc: 1500 },
            sent: if i == 7 { u64::MAX / 2 } else { 1 << 40 },
            batch: 0,
            credits: None,
            quantum_change: None,
            stamp: None,
        };
        Bytes::from(forged.to_vec())
    });
}
