//! Real-time flows (`session::flows`): a call beside a bulk flow is delivered at the
//! delay of the fastest channels, exactly once, through loss and a channel cut; a
//! lowest-delay flow follows the channel whose delay is lowest.

use std::collections::HashMap;

use super::*;

/// Ids of the call's packets have this bit (the bulk's count from 0).
const CALL: u64 = 1 << 62;

/// A 200-byte IPv4 UDP packet 10.0.0.1:5004 -> 10.0.0.2:5004 with `id` where the
/// Pair reads it (bytes 24..32, in the UDP header and payload).
fn voip(id: u64) -> Bytes {
    let mut p = crate::session::flows::tests::ipv4(200, 17, 0, 5004, 5004);
    p[24..32].copy_from_slice(&(CALL | id).to_be_bytes());
    Bytes::from(v_checksum(p))
}

fn v_checksum(mut p: Vec<u8>) -> Vec<u8> {
    let mut sum = 0u32;
    for w in p[..20].chunks(2) {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    p[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    p
}

/// A pair whose sender A has these flow settings, over channels of these delays.
fn pair(flows: FlowConfig, delays_ms: &[u64]) -> Pair {
    let mut p = Pair::new(delays_ms.len(), Mode::Logical, delays_ms);
    let mut c = config(delays_ms.len(), Mode::Logical);
    c.flows = flows;
    p.a = Session::new(c, [1; 32], Instant::ZERO).unwrap();
    p
}

/// Run the bulk (one packet a millisecond, the Pair's own) and a call (a packet every
/// 20 ms from 1 s) until `until`; `at(p, t)` is called every 20 ms before the call's
/// packet (to change the links). Returns the call's send times by id.
fn run_call(
    p: &mut Pair,
    until: Instant,
    mut at: impl FnMut(&mut Pair, Instant),
) -> HashMap<u64, Instant> {
    let mut sent = HashMap::new();
    let mut k = 0;
    let mut t = Instant::from_micros(1000 * MS);
    while t < until {
        p.run_until(t);
        at(p, t);
        p.a.handle_packet(t, voip(k));
        sent.insert(CALL | k, t);
        k += 1;
        p.flush();
        t += Duration::from_millis(20);
    }
    p.run_until(until + Duration::from_millis(500));
    sent
}

/// Each call packet's one-way delay (ms), and how many times it was delivered.
fn call_delays(p: &Pair, sent: &HashMap<u64, Instant>) -> (Vec<f64>, HashMap<u64, usize>) {
    let mut delays = Vec::new();
    let mut times = HashMap::new();
    for (&id, &at) in p.delivered.iter().zip(&p.delivered_at) {
        if id & CALL == 0 {
            continue;
        }
        *times.entry(id).or_insert(0) += 1;
        if times[&id] == 1 {
            delays.push(at.saturating_since(sent[&id]).as_micros() as f64 / 1000.0);
        }
    }
    delays.sort_by(f64::total_cmp);
    (delays, times)
}

/// B delivered each of the small flow's packets once (those `sent`), in id order.
fn assert_once_in_order(p: &Pair, sent: &HashMap<u64, Instant>) {
    let order: Vec<u64> = p
        .delivered
        .iter()
        .copied()
        .filter(|i| i & CALL != 0)
        .collect();
    assert_eq!(order.len(), sent.len(), "every segment once");
    assert!(order.windows(2).all(|w| w[0] < w[1]), "in order: {order:?}");
}

fn p99(d: &[f64]) -> f64 {
    d[(d.len() * 99 / 100).min(d.len() - 1)]
}

/// Three channels of 5, 20 and 60 ms; the fastest loses every 20th datagram and is cut
/// for a second in the middle. The call, redundant by the automatic policy (small UDP
/// packets at 50/s), arrives at the fastest live channel's delay, every packet exactly
/// once, while the bulk beside it waits for the slowest channel (delay equalization).
/// Without flow policies the call is bonded and waits with the bulk.
#[test]
fn a_redundant_call_arrives_early_and_once_through_loss_and_a_cut() {
    let run = |flows: FlowConfig| {
        let mut p = pair(flows, &[5, 20, 60]);
        p.ab[0].drop_every = 20;
        let sent = run_call(&mut p, Instant::from_micros(5000 * MS), |p, t| {
            let ms = t.as_micros() / MS;
            p.ab[0].up = !(2500..3500).contains(&ms);
        });
        (p, sent)
    };
    let (p, sent) = run(FlowConfig::default());
    let (delays, times) = call_delays(&p, &sent);
    assert_eq!(times.len(), sent.len(), "every call packet delivered");
    assert!(times.values().all(|&n| n == 1), "each exactly once");
    let f = p.b.stats(p.now).flows;
    assert_eq!(f.rx_delivered, sent.len() as u64);
    assert!(f.rx_duplicates > 0, "{f:?}");
    assert_eq!(p.a.stats(p.now).flows.tx_redundant, sent.len() as u64);
    // The fastest channel's 5 ms, or the second's 20 ms when the fastest lost it; after
    // the cut the fastest is demoted (a net cost for the bulk) and the call takes the
    // next two.
    assert!(p99(&delays) <= 21.0, "p99 {} ms: {delays:?}", p99(&delays));
    let before_cut: Vec<f64> = {
        let mut v: Vec<f64> = p
            .delivered
            .iter()
            .zip(&p.delivered_at)
            .filter(|(id, _)| *id & CALL != 0 && sent[id].as_micros() < 2500 * MS)
            .map(|(id, at)| at.saturating_since(sent[id]).as_micros() as f64 / 1000.0)
            .collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let late = before_cut.iter().filter(|&&d| d > 6.0).count();
    assert!(late * 100 <= before_cut.len() * 12, "{before_cut:?}");

    // The bulk is all there too, in order.
    let bulk: Vec<u64> = p
        .delivered
        .iter()
        .copied()
        .filter(|i| i & CALL == 0)
        .collect();
    assert!(bulk.len() > 4000, "{}", bulk.len());

    // Bonded, the call waits for the slowest channel like the bulk.
    let (p, sent) = run(FlowConfig {
        auto: false,
        ..FlowConfig::default()
    });
    let (delays, _) = call_delays(&p, &sent);
    assert!(
        delays[delays.len() / 2] >= 55.0,
        "median {} ms",
        delays[delays.len() / 2]
    );
    assert_eq!(p.a.stats(p.now).flows.tx_redundant, 0);
}

/// A call pinned to the lowest-delay channel by a rule moves when that channel's delay
/// rises above another's, and comes back to it when it recovers.
#[test]
fn a_lowest_delay_flow_follows_the_fastest_channel() {
    let flows = FlowConfig {
        auto: true,
        copies: 2,
        rules: vec![FlowRule {
            policy: FlowPolicy::LowestDelay,
            protocol: Some(17),
            ports: Some((5004, 5004)),
            net: None,
            dscp: None,
        }],
    };
    let mut p = pair(flows, &[5, 20, 60]);
    let sent = run_call(&mut p, Instant::from_micros(8000 * MS), |p, t| {
        let ms = t.as_micros() / MS;
        // The fastest channel becomes the slowest for three seconds.
        let d = if (3000..6000).contains(&ms) { 100 } else { 5 };
        p.ab[0].delay = Duration::from_millis(d);
        p.ba[0].delay = Duration::from_millis(d);
    });
    let mut by_time: Vec<(Instant, f64)> = p
        .delivered
        .iter()
        .zip(&p.delivered_at)
        .filter(|(id, _)| *id & CALL != 0)
        .map(|(id, at)| {
            let s = sent[id];
            (s, at.saturating_since(s).as_micros() as f64 / 1000.0)
        })
        .collect();
    by_time.sort_by_key(|x| x.0);
    assert_eq!(by_time.len(), sent.len(), "nothing lost, nothing twice");
    let between = |a: u64, b: u64| -> Vec<f64> {
        by_time
            .iter()
            .filter(|(s, _)| (a * MS..b * MS).contains(&s.as_micros()))
            .map(|x| x.1)
            .collect()
    };
    // Before: on the 5 ms channel.
    assert!(between(1500, 3000).iter().all(|&d| d < 6.0));
    // A second after the change: on the 20 ms channel, not the 100 ms one.
    let moved = between(4000, 6000);
    assert!(
        moved.iter().all(|&d| (19.0..22.0).contains(&d)),
        "{moved:?}"
    );
    // Back on the fastest once it is fast again.
    assert!(between(7000, 8000).iter().all(|&d| d < 6.0));
    let f = p.a.stats(p.now).flows;
    assert!(f.moves >= 2, "{f:?}");
    assert_eq!(f.tx_lowest_delay, sent.len() as u64);
    assert_eq!(f.tx_datagrams, sent.len() as u64, "one copy each");
}

/// A TCP pure acknowledgement is counted as one once it leaves as a flow datagram;
/// before the keys are there it goes into the bond, counted as a fallback only.
#[test]
fn pure_acks_are_counted_when_sent_on_the_lowest_delay_channel() {
    let ack = |id: u64| {
        let mut p = crate::session::flows::tests::ipv4(52, 6, 0, 5201, 40000);
        p[24..32].copy_from_slice(&(CALL | id).to_be_bytes());
        p[32] = 8 << 4;
        p[33] = 0x10;
        Bytes::from(v_checksum(p))
    };
    let mut p = pair(FlowConfig::default(), &[5, 20, 60]);
    p.a.handle_packet(Instant::ZERO, ack(0));
    let f = p.a.stats(Instant::ZERO).flows;
    assert_eq!((f.tx_acks, f.tx_lowest_delay, f.tx_fallback), (0, 0, 1));
    let t = Instant::from_micros(1000 * MS);
    p.run_until(t);
    p.a.handle_packet(t, ack(1));
    p.flush();
    p.run_until(t + Duration::from_millis(100));
    let f = p.a.stats(p.now).flows;
    assert_eq!((f.tx_acks, f.tx_lowest_delay, f.tx_fallback), (1, 1, 1));
    let at = p
        .delivered
        .iter()
        .zip(&p.delivered_at)
        .find(|(id, _)| **id == CALL | 1)
        .map(|(_, at)| at.saturating_since(t).as_micros() / MS);
    assert_eq!(at, Some(5), "on the 5 ms channel");
}

/// A 120-byte TCP segment (PSH, ACK) 10.0.0.1:2222 -> 10.0.0.2:40000 of a small flow (a
/// remote shell's keystrokes), with `id` where the Pair reads it.
fn keystroke(id: u64) -> Bytes {
    let mut p = crate::session::flows::tests::ipv4(120, 6, 0, 2222, 40000);
    p[24..32].copy_from_slice(&(CALL | id).to_be_bytes());
    p[32] = 5 << 4;
    p[33] = 0x18;
    Bytes::from(v_checksum(p))
}

/// A small TCP flow beside the bulk that a rule sends `lowest-delay` takes the fastest
/// channel, in its own ordered domain: the fastest channel loses every 40th datagram
/// (repaired by in-bond repair a round trip later) and the flow moves off it and back,
/// yet every segment arrives once and in order, at the fastest channel's delay but for
/// the ones that waited for a repaired one; none waits for the bulk's resequencing.
/// Bonded (the default for TCP), it waits with the bulk for the slow channels.
#[test]
fn a_small_tcp_flow_keeps_its_order_on_the_lowest_delay_channel() {
    let run = |rule: bool| {
        let mut p = Pair::new(3, Mode::Logical, &[5, 20, 60]);
        let mut c = config(3, Mode::Logical);
        c.arq = Some(ArqConfig::default());
        if rule {
            c.flows.rules = vec![FlowRule {
                policy: FlowPolicy::LowestDelay,
                protocol: Some(6),
                ports: Some((2222, 2222)),
                net: None,
                dscp: None,
            }];
        }
        p.a = Session::new(c.clone(), [1; 32], Instant::ZERO).unwrap();
        p.b = Session::new(c, [2; 32], Instant::ZERO).unwrap();
        p.ab[0].drop_every = 40;
        let mut sent = HashMap::new();
        let mut t = Instant::from_micros(1000 * MS);
        let mut k = 0;
        while t < Instant::from_micros(6000 * MS) {
            p.run_until(t);
            // The fastest channel is the slowest from 3 to 4 s: the flow moves to the
            // 20 ms one and back, overtaking what is still on its way.
            let ms = t.as_micros() / MS;
            p.ab[0].delay = Duration::from_millis(if (3000..4000).contains(&ms) { 80 } else { 5 });
            p.a.handle_packet(t, keystroke(k));
            sent.insert(CALL | k, t);
            k += 1;
            p.flush();
            t += Duration::from_millis(10);
        }
        p.run_until(Instant::from_micros(6500 * MS));
        (p, sent)
    };
    let (p, sent) = run(true);
    assert_once_in_order(&p, &sent);
    let f = p.b.stats(p.now).flows;
    assert!(f.rx_held > 0, "some overtook a lost one and waited: {f:?}");
    assert_eq!(f.rx_gaps, 0, "{f:?}");
    let a = p.a.stats(p.now).flows;
    assert_eq!(a.tx_lowest_delay, sent.len() as u64);
    assert!(a.moves >= 2, "{a:?}");
    let (delays, _) = call_delays(&p, &sent);
    assert!(
        delays[delays.len() / 2] <= 6.0,
        "median {} ms",
        delays[delays.len() / 2]
    );

    // Bonded, the default: it waits for the slow channels (striped over all three,
    // resequenced).
    let (p, sent) = run(false);
    let (delays, _) = call_delays(&p, &sent);
    assert!(
        delays[delays.len() / 2] >= 40.0,
        "median {} ms",
        delays[delays.len() / 2]
    );
}

/// A 120-byte TCP segment (PSH, ACK) 10.0.0.1:2222 -> 10.0.0.2:40000 whose sequence
/// number continues the flow (`k` segments of 80 bytes before it); the Pair reads the
/// sequence and acknowledgement numbers as its id, with the `CALL` bit set.
fn segment(k: u64) -> (Bytes, u64) {
    let mut p = crate::session::flows::tests::ipv4(120, 6, 0, 2222, 40000);
    let seq = 0x4000_0000u32 + (k as u32) * 80;
    p[24..28].copy_from_slice(&seq.to_be_bytes());
    p[28..32].copy_from_slice(&[0; 4]);
    p[32] = 5 << 4;
    p[33] = 0x18;
    let id = u64::from_be_bytes(p[24..32].try_into().unwrap());
    (Bytes::from(v_checksum(p)), id)
}

/// Per-flow order in the stripe (`session::order`): a small TCP flow bonded beside the
/// bulk (the defaults: TCP's data stays in the stripe), over 5, 20 and 60 ms channels
/// with in-bond repair. When the slowest channel loses every 40th datagram, the bulk's
/// repairs make the stripe hold everything behind them (and the delay equalizer adds a
/// margin for them); the small flow's segments go on as soon as each continues its
/// flow, in order and each once, and 95 in 100 of them are as fast as with no loss
/// (the others are its own segments lost on that channel, and those behind them,
/// which wait for the repair). With per-flow order off, half of them wait for the
/// bulk's repairs.
#[test]
fn a_bonded_tcp_flow_is_not_held_back_by_another_flows_loss() {
    let run = |order: bool, lossy: bool| {
        let mut p = Pair::new(3, Mode::Logical, &[5, 20, 60]);
        let mut c = config(3, Mode::Logical);
        c.arq = Some(ArqConfig::default());
        c.flow_order = order;
        p.a = Session::new(c.clone(), [1; 32], Instant::ZERO).unwrap();
        p.b = Session::new(c, [2; 32], Instant::ZERO).unwrap();
        if lossy {
            p.ab[2].drop_every = 40;
        }
        let mut sent = HashMap::new();
        let mut t = Instant::from_micros(1000 * MS);
        let mut k = 0;
        while t < Instant::from_micros(6000 * MS) {
            p.run_until(t);
            let (s, id) = segment(k);
            p.a.handle_packet(t, s);
            sent.insert(id, t);
            k += 1;
            p.flush();
            t += Duration::from_millis(10);
        }
        p.run_until(Instant::from_micros(6500 * MS));
        assert_once_in_order(&p, &sent);
        let (d, _) = call_delays(&p, &sent);
        let (p50, p95) = (d[d.len() / 2], d[d.len() * 95 / 100]);
        (p50, p95, p.b.stats(p.now).flows.rx_early)
    };
    let (_, clean, _) = run(true, false);
    let (_, lossy, early) = run(true, true);
    assert!(early > 0, "segments went ahead of the stripe");
    assert!(
        lossy <= clean + 1.0,
        "p95 {lossy} ms with the bulk's losses, {clean} ms without"
    );
    let (off_clean, _, _) = run(false, false);
    let (off_lossy, _, off_early) = run(false, true);
    assert_eq!(off_early, 0);
    assert!(
        off_lossy >= off_clean + 5.0,
        "without per-flow order: median {off_lossy} ms with the losses, {off_clean} ms without"
    );
}
