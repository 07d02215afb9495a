//! A direction that carries little more than the acknowledgements of the peer's flow
//! rides the channel with the shortest round trip alone, and goes back to every
//! channel when that stops being true; delivery stays exact both ways throughout.

use super::*;

/// Run until `until`, B sending one of its packets every `every` (none if zero).
fn run_with_b(p: &mut Pair, until: Instant, every: Duration, next_id: &mut u64) {
    if every == Duration::ZERO {
        p.run_until(until);
        return;
    }
    while p.now < until {
        let t = (p.now + every).min(until);
        p.run_until(t);
        p.b.handle_packet(p.now, packet(*next_id));
        *next_id += 1;
        p.flush();
    }
}

fn cuts(p: &Pair) -> Vec<(Instant, Option<usize>)> {
    p.events_b
        .iter()
        .filter_map(|(t, e)| match e {
            Event::ReturnPath { channel, .. } => Some((*t, *channel)),
            _ => None,
        })
        .collect()
}

fn data_b_between(p: &Pair, c: usize, from: Instant, to: Instant) -> usize {
    p.data_at_b[c]
        .iter()
        .filter(|&&t| t >= from && t < to)
        .count()
}

fn in_order(ids: &[u64]) {
    for w in ids.windows(2) {
        assert_eq!(w[1], w[0] + 1, "delivered out of order or with a gap");
    }
}

/// A sends 1.6 Mbit/s, B one packet every 20 ms (80 kbit/s), over channels whose
/// one-way delays are 30, 5 and 60 ms.
fn acking(mode: Mode) -> (Pair, u64) {
    let mut p = pair_with(3, mode, &[30, 5, 60], |c| {
        c.return_path = Some(ReturnPathConfig::default())
    });
    let mut next = 0;
    run_with_b(&mut p, at_ms(4000), Duration::from_millis(20), &mut next);
    (p, next)
}

#[test]
fn a_return_direction_rides_the_fastest_channel_alone_in_every_mode() {
    for mode in [Mode::Logical, Mode::Seq, Mode::Trr] {
        let (p, sent_b) = acking(mode);
        let c = cuts(&p);
        assert_eq!(c.len(), 1, "{mode:?}: {:?}", p.events_b);
        assert_eq!(c[0].1, Some(1), "{mode:?}: the 5 ms channel");
        // A second of history, then a second of it looking like a return direction.
        assert!(
            c[0].0 >= at_ms(1500) && c[0].0 <= at_ms(2600),
            "{mode:?}: cut at {:?}",
            c[0].0
        );
        // After the epoch switch, B's data goes on channel 1 only; A keeps all three.
        let after = c[0].0 + Duration::from_millis(300);
        assert_eq!(data_b_between(&p, 0, after, at_ms(4000)), 0, "{mode:?}");
        assert_eq!(data_b_between(&p, 2, after, at_ms(4000)), 0, "{mode:?}");
        assert!(data_b_between(&p, 1, after, at_ms(4000)) > 50, "{mode:?}");
        let sb = p.b.stats(p.now);
        assert_eq!(sb.return_path, Some(1));
        assert_eq!(sb.return_path_cuts, 1);
        assert_eq!(
            sb.channels.iter().map(|c| c.in_tx_set).collect::<Vec<_>>(),
            [false, true, false],
            "{mode:?}"
        );
        let sa = p.a.stats(p.now);
        assert_eq!(sa.return_path, None, "{mode:?}: A sends the flow");
        assert!(sa.channels.iter().all(|c| c.in_tx_set), "{mode:?}");
        // Both directions delivered everything, in order, once: A's last 100 ms may
        // still be on their way, and of B's, only what it sent in the last few
        // milliseconds (over the 5 ms channel now, not the 60 ms one).
        in_order(&p.delivered);
        in_order(&p.delivered_a);
        assert!(p.delivered.len() as u64 + 100 > p.next_id, "{mode:?}");
        assert!(
            p.delivered_a.len() as u64 + 2 >= sent_b,
            "{mode:?}: {} of {sent_b} delivered",
            p.delivered_a.len()
        );
    }
}

#[test]
fn sending_as_much_as_we_receive_brings_every_channel_back() {
    let (mut p, mut next) = acking(Mode::Logical);
    assert_eq!(cuts(&p).len(), 1);
    // B now sends a packet a millisecond too: a flow of its own.
    run_with_b(&mut p, at_ms(6000), Duration::from_millis(1), &mut next);
    let c = cuts(&p);
    assert_eq!(c.len(), 2, "{:?}", c);
    assert_eq!(c[1].1, None);
    assert!(
        c[1].0 <= at_ms(4000) + Duration::from_millis(600),
        "back at {:?}",
        c[1].0
    );
    let back = c[1].0 + Duration::from_millis(300);
    for ch in [0, 2] {
        assert!(
            data_b_between(&p, ch, back, at_ms(6000)) > 100,
            "channel {ch}"
        );
    }
    assert_eq!(p.b.stats(p.now).return_path, None);
    in_order(&p.delivered_a);
}

#[test]
fn a_backlog_brings_every_channel_back_at_once() {
    // As `acking`, B's channels paced at 2 Mbit/s each: a burst of B's own, more than
    // the one channel takes, queues for its pacer.
    let mut p = pair_with(3, Mode::Logical, &[30, 5, 60], |c| {
        c.return_path = Some(ReturnPathConfig::default())
    });
    p.b = Session::new(
        Config {
            pacing: Some(PacingConfig::new(vec![2e6; 3])),
            ..p.b.config().clone()
        },
        [2; 32],
        Instant::ZERO,
    )
    .unwrap();
    let mut next = 0;
    run_with_b(&mut p, at_ms(4000), Duration::from_millis(20), &mut next);
    assert_eq!(cuts(&p).len(), 1, "{:?}", p.events_b);
    // B sends 8 kB at once: over the 5 ms channel alone in 32 ms, sooner than the bond
    // (65 ms to switch epochs, 11 ms at 6 Mbit/s, and 55 ms more to cross the 60 ms
    // channel). The return path stays.
    let t0 = p.now;
    for _ in 0..40 {
        p.b.handle_packet(t0, packet(next));
        next += 1;
    }
    p.flush();
    assert_eq!(cuts(&p).len(), 1, "{:?}", p.events_b);
    run_with_b(
        &mut p,
        t0 + Duration::from_millis(300),
        Duration::ZERO,
        &mut next,
    );
    // Then a flow of its own: 300 packets at once (240 ms over the one channel, 200 ms
    // over the bond). Back at once.
    let t0 = p.now;
    for _ in 0..300 {
        p.b.handle_packet(t0, packet(next));
        next += 1;
    }
    p.flush();
    let c = cuts(&p);
    assert_eq!(c.len(), 2, "{c:?}");
    assert_eq!(c[1], (t0, None), "back as the queue formed");
    run_with_b(&mut p, at_ms(5000), Duration::from_millis(20), &mut next);
    assert!(
        p.events_b.iter().any(|(_, e)| matches!(e,
        Event::ReturnPath { channel: None, reason } if reason.contains("sooner than one channel")))
    );
    // The burst went over every channel, in order, and all of it arrived.
    for ch in [0, 2] {
        assert!(data_b_between(&p, ch, t0, at_ms(5000)) > 10, "channel {ch}");
    }
    in_order(&p.delivered_a);
    // Everything arrived but what CoDel dropped of the burst (it waited in the queue)
    // and what B sent in the last 60 ms (a packet every 20 ms, over every channel now).
    let drops = p.b.stats(p.now).pacing.unwrap().drops;
    assert!(
        p.delivered_a.len() as u64 + drops + 4 >= next,
        "{} delivered, {drops} dropped of {next}",
        p.delivered_a.len()
    );
}

#[test]
fn a_streams_backlog_brings_every_channel_back_at_once() {
    use crate::stream::{StreamConfig, StreamEvent};
    let mut p = pair_with(3, Mode::Logical, &[30, 5, 60], |c| {
        c.return_path = Some(ReturnPathConfig::default());
        c.pacing = Some(PacingConfig::new(vec![20e6; 3]));
        c.streams = Some(StreamConfig::default());
    });
    let mut next = 0;
    run_with_b(&mut p, at_ms(4000), Duration::from_millis(20), &mut next);
    assert_eq!(cuts(&p).len(), 1, "{:?}", p.events_b);
    // B opens a stream to A, which accepts it.
    let now = p.now;
    let (src, dst) = (
        "10.0.0.2:40000".parse().unwrap(),
        "10.0.0.1:80".parse().unwrap(),
    );
    let id = p.b.streams().unwrap().open(now, src, dst).unwrap();
    let mut opened = false;
    while !opened && p.now < at_ms(4500) {
        p.run_until(p.now + Duration::from_millis(1));
        let now = p.now;
        let sa = p.a.streams().unwrap();
        while let Some(e) = sa.poll_event() {
            if let StreamEvent::Incoming { id, .. } = e {
                sa.accept(now, id);
            }
        }
        p.a.handle_streams(now);
        let sb = p.b.streams().unwrap();
        while let Some(e) = sb.poll_event() {
            opened |= e == (StreamEvent::Opened { id });
        }
        p.b.handle_streams(now);
        p.flush();
    }
    assert!(opened);
    assert_eq!(cuts(&p).len(), 1, "still cut");
    // B writes 3 MB at once: 1.2 s over the 5 ms channel at 20 Mbit/s, 0.4 s plus 120 ms
    // over the bond. The streams hold it, not the transmit queue: their unsent bytes
    // are judged, and the bond is taken at once.
    let t0 = p.now;
    let data = vec![7u8; 3_000_000];
    assert_eq!(p.b.streams().unwrap().write(t0, id, &data), data.len());
    p.b.handle_streams(t0);
    p.flush();
    let c = cuts(&p);
    assert_eq!(c.len(), 2, "{c:?}");
    assert_eq!(c[1], (t0, None));
}

#[test]
fn the_peer_flow_ending_brings_every_channel_back_and_idle_cuts_nothing() {
    let (mut p, mut next) = acking(Mode::Seq);
    assert_eq!(cuts(&p).len(), 1);
    // A stops; B goes on with its trickle: nothing to return, so every channel again.
    p.every = Duration::ZERO;
    run_with_b(&mut p, at_ms(6000), Duration::from_millis(20), &mut next);
    let c = cuts(&p);
    assert_eq!(c.len(), 2, "{:?}", c);
    assert_eq!(c[1].1, None);
    assert!(c[1].0 <= at_ms(5200), "back at {:?}", c[1].0);
    // Then a long idle stretch (B silent too): no cut.
    run_with_b(&mut p, at_ms(9000), Duration::ZERO, &mut next);
    assert_eq!(cuts(&p).len(), 2);
    assert!(p.b.stats(p.now).channels.iter().all(|c| c.in_tx_set));
}

#[test]
fn loss_on_the_chosen_channel_brings_every_channel_back_for_a_while() {
    let (mut p, mut next) = acking(Mode::Logical);
    assert_eq!(cuts(&p), vec![(cuts(&p)[0].0, Some(1))]);
    // Channel 1 loses a tenth of what B sends on it.
    p.ba[1].loss = 0.1;
    run_with_b(&mut p, at_ms(8000), Duration::from_millis(20), &mut next);
    let c = cuts(&p);
    assert!(c.len() >= 2, "{:?}", c);
    assert_eq!(c[1].1, None);
    assert!(c[1].0 <= at_ms(5000), "back at {:?}", c[1].0);
    // Ten holds (10 s) before it tries again.
    assert_eq!(c.len(), 2, "{:?}", c);
}

#[test]
fn a_queue_on_the_chosen_channel_is_not_taken_for_congestion() {
    let (mut p, mut next) = acking(Mode::Logical);
    assert_eq!(cuts(&p).len(), 1);
    // The peer's flow builds a queue on channel 1 (its round trip goes from 10 to
    // 60 ms): that is in the round trip B measures, but not in B's way.
    p.ab[1].delay = Duration::from_millis(55);
    run_with_b(&mut p, at_ms(8000), Duration::from_millis(20), &mut next);
    assert_eq!(cuts(&p).len(), 1, "{:?}", p.events_b);
    in_order(&p.delivered_a);
}

#[test]
fn off_keeps_every_channel() {
    let mut p = pair_with(3, Mode::Logical, &[30, 5, 60], |c| c.return_path = None);
    let mut next = 0;
    run_with_b(&mut p, at_ms(4000), Duration::from_millis(20), &mut next);
    assert!(cuts(&p).is_empty());
    assert!(p.b.stats(p.now).channels.iter().all(|c| c.in_tx_set));
}

fn event_at(events: &[(Instant, Event)], f: impl Fn(&Event) -> bool) -> Option<Instant> {
    events.iter().find(|(_, e)| f(e)).map(|(t, _)| *t)
}

#[test]
fn a_cut_holds_data_only_for_the_new_channels_round_trip() {
    for mode in [Mode::Logical, Mode::Seq, Mode::Trr] {
        let (p, _) = acking(mode);
        let started = event_at(&p.events_b, |e| matches!(e, Event::TxSwitchStarted { .. }));
        let in_force = event_at(&p.events_b, |e| matches!(e, Event::TxEpoch { .. }));
        let drained = event_at(&p.events_a, |e| matches!(e, Event::RxEpoch { .. }));
        let (started, in_force, drained) = (started.unwrap(), in_force.unwrap(), drained.unwrap());
        // B waits for the 5 ms channel's round trip, not for the 60 ms channel's end.
        assert!(
            in_force - started <= Duration::from_millis(15),
            "{mode:?}: held {:?}",
            in_force - started
        );
        // A drains the old epoch when the end comes over the 60 ms channel.
        assert!(
            drained - started >= Duration::from_millis(55),
            "{mode:?}: drained after {:?}",
            drained - started
        );
        in_order(&p.delivered_a);
    }
}

#[test]
fn an_end_lost_on_a_leaving_channel_is_sent_again() {
    let mut p = pair_with(3, Mode::Logical, &[30, 5, 60], |c| {
        c.return_path = Some(ReturnPathConfig::default())
    });
    let mut next = 0;
    // Step by a millisecond until B starts the cut, then lose what it just sent on
    // channel 2: the epoch end there.
    let mut t = 0;
    while !p
        .events_b
        .iter()
        .any(|(_, e)| matches!(e, Event::TxSwitchStarted { .. }))
    {
        t += 1;
        assert!(t < 4000, "no cut");
        p.run_until(at_ms(t));
        if t % 20 == 0 {
            p.b.handle_packet(p.now, packet(next));
            next += 1;
            p.flush();
        }
    }
    assert!(p.ba[2].queue.pop_back().is_some());
    run_with_b(
        &mut p,
        at_ms(t + 2000),
        Duration::from_millis(20),
        &mut next,
    );
    let started = at_ms(t);
    let drained = event_at(&p.events_a, |e| matches!(e, Event::RxEpoch { .. }))
        .expect("A's receiver reached the new epoch");
    // Sent again at the next heartbeat (50 ms), 60 ms on the way.
    assert!(
        drained - started <= Duration::from_millis(200),
        "{:?}",
        drained - started
    );
    in_order(&p.delivered_a);
    assert!(p.delivered_a.len() as u64 + 2 >= next);
}

/// The cut's new epoch holds B's packets at A with the same repair margin as the old
/// one, from its first packet: none comes out sooner than those that follow it. (The
/// new epoch's resequencer ran without the margin until A's next heartbeat: packets in
/// that gap came out 15 ms sooner, and a TCP flow in slow start took the round trip's
/// return to its level for a queue: HyStart ended slow start.)
#[test]
fn a_cut_keeps_the_repair_margin_from_its_first_packet() {
    for mode in [Mode::Logical, Mode::Seq, Mode::Trr] {
        let mut p = pair_with(3, mode, &[30, 5, 60], |c| {
            c.return_path = Some(ReturnPathConfig::default());
            arq_on(c);
            c.receiver.equalize = true;
        });
        // B sends one packet every 10 ms (A 1.6 Mbit/s, B a tenth of that); each
        // packet's delay from B to A's delivery, stepping by 1 ms.
        let mut sent_at = Vec::new();
        let mut lat = Vec::new();
        for t in 1..=3500u64 {
            p.run_until(at_ms(t));
            if t % 10 == 0 {
                p.b.handle_packet(p.now, packet(sent_at.len() as u64));
                sent_at.push(p.now);
                p.flush();
            }
            while lat.len() < p.delivered_a.len() {
                let id = p.delivered_a[lat.len()] as usize;
                lat.push((sent_at[id], p.now.saturating_since(sent_at[id])));
            }
        }
        let c = cuts(&p);
        assert_eq!(c.len(), 1, "{mode:?}: {:?}", p.events_b);
        let in_force = event_at(&p.events_a, |e| matches!(e, Event::RxEpoch { .. }))
            .expect("A's receiver reached the new epoch");
        // Over the 5 ms channel alone, held for the margin (its round trip and 5 ms;
        // TRR a little longer).
        let after: Vec<u64> = lat
            .iter()
            .filter(|(sent, _)| *sent >= in_force)
            .map(|(_, l)| l.as_micros() / 1000)
            .collect();
        assert!(after.len() > 50, "{mode:?}: {after:?}");
        let steady = *after.last().unwrap();
        assert!((19..=26).contains(&steady), "{mode:?}: {after:?}");
        assert!(
            after.iter().all(|&ms| ms + 1 >= steady),
            "{mode:?}: sooner than the margin after the cut: {after:?}"
        );
        in_order(&p.delivered_a);
    }
}
