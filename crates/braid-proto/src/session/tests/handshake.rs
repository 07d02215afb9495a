//! Issue 26: a key mismatch and a settings mismatch are named at both ends, within a
//! heartbeat or two, instead of looking like a dead network.

use super::*;

/// A pair whose ends run with different tweaks.
fn pair_of(n: usize, mode: Mode, a: impl Fn(&mut Config), b: impl Fn(&mut Config)) -> Pair {
    let mut p = Pair::new(n, mode, &[5]);
    let (mut ca, mut cb) = (config(n, mode), config(n, mode));
    a(&mut ca);
    b(&mut cb);
    p.a = Session::new(ca, [1; 32], Instant::ZERO).unwrap();
    p.b = Session::new(cb, [2; 32], Instant::ZERO).unwrap();
    p.every = Duration::ZERO;
    p
}

fn mismatches(events: &[(Instant, Event)]) -> Vec<(Instant, Mismatch, bool)> {
    events
        .iter()
        .filter_map(|(t, e)| match e {
            Event::SettingsMismatch {
                mismatch, answer, ..
            } => Some((*t, mismatch.clone(), *answer)),
            _ => None,
        })
        .collect()
}

fn failures(events: &[(Instant, Event)]) -> Vec<(Instant, usize, HandshakeFailure, u64)> {
    events
        .iter()
        .filter_map(|(t, e)| match e {
            Event::HandshakeFailed {
                channel,
                failure,
                count,
            } => Some((*t, *channel, *failure, *count)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_mode_mismatch_is_named_with_both_values_at_both_ends() {
    let mut p = pair_of(2, Mode::Logical, |_| {}, |c| c.mode = Mode::Trr);
    p.run_until(at_ms(2000));
    assert!(!p.a.peer_seen() && !p.b.peer_seen(), "no session");
    for (events, ours, theirs) in [
        (&p.events_a, "\"logical\"", "\"trr\""),
        (&p.events_b, "\"trr\"", "\"logical\""),
    ] {
        let m = mismatches(events);
        // Each end learns it in the answer to its own initiation, within a round trip.
        let (t, m, _) = m.iter().find(|(_, _, answer)| *answer).expect("answered");
        assert!(*t <= at_ms(20), "{t:?}");
        assert_eq!(
            (m.setting, m.ours.as_str(), m.theirs.as_str()),
            ("mode", ours, theirs)
        );
        // Reported once (then at most every 10 s), not at every initiation.
        assert!(mismatches(events).len() <= 2, "{:?}", mismatches(events));
    }
    assert!(p.a.handshake_stats().mismatched >= 2);
    assert_eq!(p.delivered, Vec::<u64>::new());
}

#[test]
fn weights_must_match_in_logical_mode_but_not_in_seq_mode() {
    let weights = |c: &mut Config| c.channels[1].weight = 3;
    let mut p = pair_of(2, Mode::Logical, |_| {}, weights);
    p.run_until(at_ms(500));
    let m = mismatches(&p.events_a);
    assert_eq!(m[0].1.setting, "channel weights");
    assert_eq!(
        (m[0].1.ours.as_str(), m[0].1.theirs.as_str()),
        ("[1, 1]", "[1, 3]")
    );
    let mut p = pair_of(2, Mode::Seq, |_| {}, weights);
    p.run_until(at_ms(500));
    assert!(p.a.peer_seen() && mismatches(&p.events_a).is_empty());
}

#[test]
fn a_key_mismatch_is_counted_per_channel_and_reported_at_both_ends() {
    let mut p = pair_of(
        2,
        Mode::Logical,
        |_| {},
        |c| c.key = b"another test key, also 32+ bytes long".to_vec(),
    );
    p.run_until(at_ms(3000));
    assert!(!p.a.peer_seen() && !p.b.peer_seen());
    for (events, stats) in [
        (&p.events_a, p.a.stats(p.now)),
        (&p.events_b, p.b.stats(p.now)),
    ] {
        let f = failures(events);
        // Each end refuses the other's initiations (its own failure) and is told its
        // own were rejected (the answer), at once.
        let refused = f.iter().find(|x| !x.2.is_answer()).expect("refused");
        let rejected = f.iter().find(|x| x.2.is_answer()).expect("rejected");
        assert!(refused.0 <= at_ms(20) && rejected.0 <= at_ms(20), "{f:?}");
        assert_eq!(
            rejected.2,
            HandshakeFailure::Rejected {
                reason: wire::secure::REJECT_UNAUTHENTICATED,
                static_keys: false
            }
        );
        assert!(rejected.2.to_string().contains("keys differ"));
        // Rate-limited: the first of each kind, nothing more within 10 s.
        assert_eq!(f.len(), 2, "{f:?}");
        // Counted on every channel: a new initiation every second (a rejected one is
        // not repeated each heartbeat), refused by the peer, and its rejection.
        for c in &stats.channels {
            assert!(c.handshake_failures >= 3, "{:?}", c.handshake_failures);
        }
        assert!(stats.handshakes.rejected >= 1);
    }
}

#[test]
fn forged_handshake_rejections_do_not_disturb_an_established_session() {
    let mut p = Pair::new(2, Mode::Logical, &[5]);
    p.run_until(at_ms(300));
    assert!(p.a.peer_seen());
    let before = p.delivered.len();
    // Rejections naming every key index, with a wrong echo: nothing happens.
    for i in 0..64u32 {
        let r = wire::secure::Handshake::Reject {
            reason: wire::secure::REJECT_UNAUTHENTICATED,
            receiver: i,
            echo: [0; wire::secure::ECHO_LEN],
        };
        p.a.handle_datagram(p.now, 0, Bytes::from(r.to_vec()));
    }
    p.run_until(at_ms(600));
    assert!(failures(&p.events_a).is_empty());
    assert!(p.delivered.len() > before);
}
