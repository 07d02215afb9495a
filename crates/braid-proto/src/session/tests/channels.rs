//! Issue 30: a channel added or removed at run time (a reload). The end that reloads
//! starts a new run with its new channel list; the peer's run may still have the old
//! one: the bond runs over the channels both have, by position, and the others stay
//! out of it until both ends have them.

use super::*;

/// Channels with these weights.
fn weighted(weights: &[u32], mode: Mode) -> Config {
    let mut c = config(weights.len(), mode);
    for (ch, &w) in c.channels.iter_mut().zip(weights) {
        ch.weight = w;
    }
    c
}

/// A pair whose links have room for three channels, each end running `a` and `b`.
fn pair(a: Config, b: Config) -> Pair {
    let mut p = Pair::new(3, a.mode, &[10, 15, 20]);
    p.a = Session::new(a, [41; 32], Instant::ZERO).unwrap();
    p.b = Session::new(b, [42; 32], Instant::ZERO).unwrap();
    p
}

/// A restarts (a reload) with configuration `c`.
fn reload_a(p: &mut Pair, c: Config, seed: u8) {
    p.a = Session::new(c, [seed; 32], p.now).unwrap();
}

fn reload_b(p: &mut Pair, c: Config, seed: u8) {
    p.b = Session::new(c, [seed; 32], p.now).unwrap();
}

/// Packets A sent from `from_id` on that B did not deliver.
fn lost_since(p: &Pair, from_id: u64) -> u64 {
    let got = p.delivered.iter().filter(|&&id| id >= from_id).count() as u64;
    p.next_id - from_id - got
}

/// A adds a third channel; B still runs with two: the bond goes on over the two
/// (after one new handshake), the third stays out of it and carries no data. Then B
/// adds it too: it joins, and data goes over all three. Then A removes it again.
#[test]
fn a_channel_added_at_one_end_joins_once_the_other_has_it_and_leaves_when_removed() {
    let two = || weighted(&[1, 1], Mode::Logical);
    let three = || weighted(&[1, 1, 1], Mode::Logical);
    let mut p = pair(two(), two());
    p.run_until(at_ms(1000));
    assert!(p.delivered.len() > 900);

    // A reloads with three channels.
    let t1 = p.now;
    let first = p.next_id;
    reload_a(&mut p, three(), 43);
    p.run_until(at_ms(2500));
    assert!(
        p.events_a
            .iter()
            .any(|(t, e)| *t >= t1 && *e == Event::ChannelCountMismatch { ours: 3, theirs: 2 }),
        "{:?}",
        p.events_a
    );
    assert!(p
        .events_b
        .iter()
        .any(|(t, e)| *t >= t1 && *e == Event::PeerRestarted));
    let a = p.a.stats(p.now);
    assert!(a.channels[0].in_tx_set && a.channels[1].in_tx_set, "{a:?}");
    assert!(
        !a.channels[2].in_tx_set && !a.channels[2].in_rx_set,
        "{a:?}"
    );
    assert_eq!(a.channels[2].state, LinkState::Down);
    assert!(p.data_at[2].is_empty(), "data on a channel the peer lacks");
    // What was in flight when A's old run ended, and what was sent under the old
    // keys until the new handshake: well under 100 ms of 1 ms packets (the slowest
    // channel's one-way delay, a handshake's round trip and the receiver's hold).
    let lost = lost_since(&p, first);
    assert!(lost <= 100, "{lost} packets lost across A's reload");
    assert!(p.delivered.windows(2).all(|w| w[0] < w[1]), "out of order");

    // B reloads with three channels too: the third joins the bond.
    let t2 = p.now;
    let second = p.next_id;
    reload_b(&mut p, three(), 44);
    p.run_until(at_ms(4000));
    assert!(p
        .events_a
        .iter()
        .any(|(t, e)| *t >= t2 && *e == Event::PeerRestarted));
    let (a, b) = (p.a.stats(p.now), p.b.stats(p.now));
    assert!(a.channels.iter().all(|c| c.in_tx_set), "{a:?}");
    assert!(b.channels.iter().all(|c| c.in_rx_set), "{b:?}");
    assert!(!p.data_at[2].is_empty(), "no data on the added channel");
    assert!(b.channels[2].rx_data_packets > 100, "{b:?}");
    let lost = lost_since(&p, second);
    assert!(lost <= 100, "{lost} packets lost across B's reload");

    // A removes it again: the bond goes on over the first two; B's third is out.
    let t3 = p.now;
    let third = p.next_id;
    reload_a(&mut p, two(), 45);
    p.run_until(at_ms(5500));
    let data_on_2 = p.data_at[2].len();
    p.run_until(at_ms(6500));
    assert_eq!(p.data_at[2].len(), data_on_2, "data on the removed channel");
    let b = p.b.stats(p.now);
    assert!(
        !b.channels[2].in_tx_set && !b.channels[2].in_rx_set,
        "{b:?}"
    );
    assert!(b.channels[0].in_rx_set && b.channels[1].in_rx_set, "{b:?}");
    assert!(p
        .events_b
        .iter()
        .any(|(t, e)| *t >= t3 && *e == Event::ChannelCountMismatch { ours: 3, theirs: 2 }));
    let lost = lost_since(&p, third);
    assert!(lost <= 100, "{lost} packets lost across the removal");
    assert!(p.delivered.windows(2).all(|w| w[0] < w[1]), "out of order");
    p.assert_no_duplicates();
}

/// The quanta of a bond over fewer channels than one end has are made from the
/// common channels' weights, as the peer makes them: an added channel lighter than
/// the others (here 1 next to 2 and 2) must not change the others' quanta while the
/// peer does not have it, or logical reception mispredicts the sender's scheduler.
#[test]
fn the_common_channels_keep_their_quanta_when_a_lighter_channel_is_added() {
    let mut p = pair(
        weighted(&[2, 2, 1], Mode::Logical),
        weighted(&[2, 2], Mode::Logical),
    );
    p.run_until(at_ms(3000));
    assert!(p.a.stats(p.now).peer_seen);
    // Every packet but those still on their way, in order.
    p.every = Duration::ZERO;
    p.run_until(at_ms(3500));
    assert!(p.delivered.windows(2).all(|w| w[0] < w[1]), "out of order");
    let lost = p.next_id - p.delivered.len() as u64;
    assert!(lost <= 5, "{lost} of {} lost", p.next_id);
    assert!(p.data_at[2].is_empty());
    // Both common channels carry data.
    assert!(!p.data_at[0].is_empty() && !p.data_at[1].is_empty());
}

/// Within the channels both ends have, weights in other ratios are still refused in
/// logical mode (the handshake names them), whatever the number of channels.
#[test]
fn other_weights_on_the_common_channels_are_still_refused() {
    let mut p = pair(
        weighted(&[1, 3, 1], Mode::Logical),
        weighted(&[1, 1], Mode::Logical),
    );
    p.run_until(at_ms(1500));
    assert!(!p.a.stats(p.now).peer_seen);
    assert!(p.events_a.iter().any(|(_, e)| matches!(
        e,
        Event::SettingsMismatch { mismatch, .. } if mismatch.setting == "channel weights"
    )));
    assert!(p.delivered.is_empty());
}

/// Path MTU over a channel the peer's run no longer has: A's third channel settled
/// on a smaller path, then B reloads with two channels. The bond's largest packet is
/// the common channels' again, not the size the lost channel was left at.
#[test]
fn a_channel_the_peer_dropped_no_longer_sets_the_bonds_size() {
    let two = || weighted(&[1, 1], Mode::Logical);
    let three = || weighted(&[1, 1, 1], Mode::Logical);
    let mut p = pair(three(), three());
    p.ab[2].mtu = 1372;
    p.ba[2].mtu = 1372;
    p.run_until(at_ms(6000));
    assert_eq!(
        p.a.path_max_packet(),
        1372 - ENVELOPE,
        "channel 2's path found"
    );
    reload_b(&mut p, two(), 44);
    p.run_until(at_ms(8000));
    assert!(p
        .events_a
        .iter()
        .any(|(_, e)| *e == Event::ChannelCountMismatch { ours: 3, theirs: 2 }));
    assert_eq!(p.a.path_max_packet(), 1472 - ENVELOPE);
}
