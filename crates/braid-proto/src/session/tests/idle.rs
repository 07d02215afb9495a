//! Idle sessions slow their heartbeat (`session::liveness`): a twentieth of the
//! datagrams while nothing flows, no channel taken for dead meanwhile, and back to
//! the usual heartbeat, and to failure detection within `dead_after`, with the first
//! packet.

use super::*;

/// Datagrams A sent on each channel so far.
fn sent(p: &Pair) -> Vec<u64> {
    p.a.stats(p.now)
        .channels
        .iter()
        .map(|c| c.tx_datagrams)
        .collect()
}

/// Datagrams A sent on each channel since `from` (a [`sent`]).
fn since(p: &Pair, from: &[u64]) -> Vec<u64> {
    sent(p).iter().zip(from).map(|(n, f)| n - f).collect()
}

/// Run the second after `from_ms` (where the pair is now) and check that A sent at
/// least `n` datagrams on every channel in it.
fn busy_second(p: &mut Pair, from_ms: u64, n: u64, what: &str) {
    let from = sent(p);
    p.run_until(at_ms(from_ms + 1000));
    let busy = since(p, &from);
    assert!(
        busy.iter().all(|&k| k >= n),
        "{busy:?} datagrams in the second {what}"
    );
}

fn downs(events: &[(Instant, Event)], after: Instant) -> Vec<(Instant, usize)> {
    events
        .iter()
        .filter(|(t, _)| *t > after)
        .filter_map(|(t, e)| match e {
            Event::ChannelDown { channel, .. } => Some((*t, *channel)),
            _ => None,
        })
        .collect()
}

fn silent(events: &[(Instant, Event)]) -> bool {
    events
        .iter()
        .any(|(_, e)| matches!(e, Event::PeerSilent(_)))
}

#[test]
fn an_idle_session_sends_a_twentieth_and_wakes_with_the_first_packet() {
    let mut p = Pair::new(3, Mode::Logical, &[10, 40, 150]);
    p.run_until(at_ms(1000));
    // No data from here: the usual heartbeat for `idle_after` (2 s), then the idle one.
    p.every = Duration::ZERO;
    p.run_until(at_ms(2000));
    // Hellos, feedback and markers every 50 ms.
    busy_second(&mut p, 2000, 50, "before idle");
    p.run_until(at_ms(4000));
    let from = sent(&p);
    p.run_until(at_ms(14_000));
    let idle = since(&p, &from);
    assert!(
        idle.iter().all(|&n| (10..=40).contains(&n)),
        "{idle:?} datagrams in 10 s while idle"
    );
    // Neither end took a channel, or the peer, for dead.
    assert_eq!(downs(&p.events_a, at_ms(0)), vec![]);
    assert_eq!(downs(&p.events_b, at_ms(0)), vec![]);
    assert!(!silent(&p.events_a) && !silent(&p.events_b));
    for s in [p.a.stats(p.now), p.b.stats(p.now)] {
        assert!(s.channels.iter().all(|c| c.state == LinkState::Up));
        assert!(s.channels.iter().all(|c| c.in_tx_set));
    }
    // The first packet wakes both ends: within a second every channel sends at the
    // usual heartbeat again, and everything sent is delivered, in order.
    let delivered = p.delivered.len();
    p.every = Duration::from_millis(1);
    p.next_send = p.now;
    p.run_until(at_ms(14_500));
    let from = sent(&p);
    let hellos_b = p.a.stats(p.now).channels[0].rx_hellos;
    p.run_until(at_ms(15_500));
    let woken = since(&p, &from);
    assert!(woken.iter().all(|&n| n >= 50), "still idle: {woken:?}");
    assert!(
        p.a.stats(p.now).channels[0].rx_hellos - hellos_b >= 19,
        "B's hellos still slow"
    );
    let new = &p.delivered[delivered..];
    // 1500 sent; the last 150 ms of them are still on the slowest channel.
    assert!(new.len() > 1300, "{} delivered", new.len());
    let gaps: Vec<_> = new.windows(2).filter(|w| w[0] + 1 != w[1]).collect();
    assert!(
        gaps.is_empty(),
        "lost or misordered: {gaps:?} {:?}",
        &p.events_b[p.events_b.len().saturating_sub(12)..]
    );
    assert_eq!(downs(&p.events_a, at_ms(0)), vec![]);
    assert_eq!(downs(&p.events_b, at_ms(0)), vec![]);
}

/// A channel cut while the tunnel is idle: the peer's `dead_after` is stretched to
/// the idle heartbeat, so it may stay "up" for a while; once data flows, it is down
/// within `dead_after` (and a heartbeat and a round trip), and the channels that
/// work are never taken for dead, however far behind another's their first fast
/// hellos arrive.
#[test]
fn a_channel_cut_while_idle_is_down_soon_after_data_resumes() {
    let mut p = Pair::new(3, Mode::Logical, &[10, 150, 20]);
    p.run_until(at_ms(1000));
    p.every = Duration::ZERO;
    p.run_until(at_ms(6000));
    p.set_up(2, false);
    p.run_until(at_ms(6500));
    p.every = Duration::from_millis(1);
    p.next_send = p.now;
    p.run_until(at_ms(8000));
    for (end, events) in [("A", &p.events_a), ("B", &p.events_b)] {
        let d = downs(events, at_ms(6000));
        assert_eq!(d.len(), 1, "{end}: {d:?}");
        let (t, c) = d[0];
        assert_eq!(c, 2, "{end}");
        assert!(
            t <= at_ms(6500 + 300 + 50 + 2 * 150),
            "{end}: channel 2 down only at {t:?}"
        );
    }
    // A stopped striping onto it, and what it sends arrives.
    let last = *p.data_at[2].last().unwrap();
    assert!(last <= at_ms(6500 + 300 + 50 + 2 * 150), "{last:?}");
    let tail = p
        .delivered
        .iter()
        .filter(|&&id| id >= p.next_id - 700)
        .count();
    assert!(
        tail >= 480,
        "{tail} of the last 700 delivered {:?}",
        downs(&p.events_b, at_ms(0))
    );
}

/// `idle_heartbeat = heartbeat`: the heartbeat never slows (and the hellos never
/// carry an interval).
#[test]
fn an_idle_heartbeat_equal_to_the_heartbeat_keeps_it() {
    let mut p = pair_with(2, Mode::Logical, &[10, 20], |c| {
        c.idle_heartbeat = c.heartbeat;
    });
    p.every = Duration::ZERO;
    p.run_until(at_ms(4000));
    let from = sent(&p);
    p.run_until(at_ms(5000));
    assert!(since(&p, &from).iter().all(|&n| n >= 50));
}

/// A session counts its idle time from its handshake, not from its creation: one
/// whose handshake took longer than `idle_after` (every channel cut for the first
/// 3 s) starts at the usual heartbeat, with its probes and first measurements at
/// full pace, and slows only `idle_after` later.
#[test]
fn a_late_handshake_starts_the_session_busy() {
    let mut p = Pair::new(2, Mode::Logical, &[10, 20]);
    p.every = Duration::ZERO;
    p.set_up(0, false);
    p.set_up(1, false);
    p.run_until(at_ms(3000));
    assert!(!p.a.stats(p.now).idle);
    p.set_up(0, true);
    p.set_up(1, true);
    p.run_until(at_ms(3500));
    assert!(p.a.peer_seen() && p.b.peer_seen());
    busy_second(&mut p, 3500, 20, "after the handshake");
    assert!(!p.a.stats(p.now).idle && !p.b.stats(p.now).idle);
    // Still quiet 2 s later: idle now.
    p.run_until(at_ms(7000));
    assert!(p.a.stats(p.now).idle && p.b.stats(p.now).idle);
}
