//! Path MTU discovery between two sessions (`session::pmtu`): a channel whose path
//! carries less than its configured size is found out, the bond's largest packet
//! follows it, and the probes lost on the way count as no loss anywhere.

use super::*;

#[test]
fn a_channel_with_a_smaller_path_mtu_is_found_and_its_lost_probes_are_no_loss() {
    let mut p = pair_with(3, Mode::Logical, &[5, 10, 20], arq_on);
    // Channel 1's path carries sealed datagrams of at most 1372 bytes (a 1400-byte
    // hop under IPv4 and UDP), both ways.
    p.ab[1].mtu = 1372;
    p.ba[1].mtu = 1372;
    assert_eq!(p.a.path_max_packet(), 1472 - ENVELOPE);
    p.run_until(at_ms(10_000));
    p.every = Duration::ZERO;
    p.run_until(at_ms(10_500));
    let s = p.a.stats(p.now);
    let pmtu: Vec<_> = s.channels.iter().map(|c| c.pmtu).collect();
    assert_eq!(pmtu, [Some(1472), Some(1372), Some(1472)]);
    assert_eq!(
        s.channels[1].pmtu_phase,
        Some(crate::session::pmtu::Phase::Settled)
    );
    // The bond's largest packet: the smallest channel's, less the security envelope.
    assert_eq!(p.a.path_max_packet(), 1372 - ENVELOPE);
    assert_eq!(s.path_max_packet, 1372 - ENVELOPE);
    let last = p.events_a.iter().rev().find_map(|(_, e)| match e {
        Event::PathMtu { channel: 1, to, .. } => Some(*to),
        _ => None,
    });
    assert_eq!(last, Some(1372));
    // The other direction found the same.
    assert_eq!(p.b.path_max_packet(), 1372 - ENVELOPE);
    let probes = s.channels[1].pmtu_stats;
    assert!(probes.probes_lost >= 3, "{probes:?}");
    assert!(probes.probes_sent <= 40, "{probes:?}");
    assert_eq!(
        p.b.stats(p.now).channels[1].pmtu_stats.peer_probes,
        probes.probes_acked
    );
    // The lost probes left no gap in the channel's sealing counter: nothing missing
    // for in-bond repair, the feedback or demotion, no request sent.
    let sb = p.b.stats(p.now);
    for c in 0..3 {
        assert_eq!(sb.channels[c].arq.missing, 0, "channel {c}");
        assert_eq!(sb.channels[c].arq.requests, 0, "channel {c}");
        assert_eq!(s.channels[c].demotions, 0, "channel {c}");
        assert_eq!(
            s.channels[c].estimate.loss.unwrap_or(0.0),
            0.0,
            "channel {c}"
        );
    }
    assert_eq!(p.delivered.len() as u64, p.next_id);
    p.assert_no_duplicates();
}

#[test]
fn off_the_bond_carries_the_configured_size_and_no_probe_is_sent() {
    let mut p = pair_with(2, Mode::Logical, &[5, 10], |c| c.pmtu = None);
    p.sent_a = Some(Vec::new());
    p.ab[1].mtu = 1372;
    p.run_until(at_ms(5000));
    assert_eq!(p.a.path_max_packet(), p.a.max_packet());
    let s = p.a.stats(p.now);
    assert_eq!(s.channels[1].pmtu, None);
    let probes = p
        .sent_a
        .as_ref()
        .unwrap()
        .iter()
        .filter(|(_, d)| d[2] == wire::secure::LANE_PROBE)
        .count();
    assert_eq!(probes, 0);
}
