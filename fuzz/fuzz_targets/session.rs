//! Two session ends exchanging genuine traffic in virtual time while the fuzzer
//! injects, towards B, arbitrary datagrams and also control messages sealed with A's
//! real keys (as a holder of the keys could), replays and reorders genuine datagrams:
//! no panic, memory within bounds, and in `seq` mode A's genuine packets stay in
//! order. Some inputs turn on in-bond repair (`arq`) and the AQM (which may mark the
//! packets' ECN bits: the tag and number sit after the IP header's first 20 bytes), and
//! credit-based flow control (credits and checks can be injected sealed).
#![no_main]

use std::collections::VecDeque;

use braid_proto::aqm::AqmConfig;
use braid_proto::session::{ArqConfig, ChannelParams, Config, CreditConfig, Session};
use braid_proto::{Duration, Instant, Mode};
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

const TAG: &[u8; 8] = b"GENUINE!";

fn packet(id: u64) -> Bytes {
    let mut v = vec![0x45u8; 120];
    v[20..28].copy_from_slice(TAG);
    v[28..36].copy_from_slice(&id.to_be_bytes());
    Bytes::from(v)
}

fuzz_target!(|data: &[u8]| {
    let Some((&head, ops)) = data.split_first() else {
        return;
    };
    let mode = [Mode::Logical, Mode::Seq, Mode::Trr, Mode::None][(head & 3) as usize];
    let channels: Vec<ChannelParams> = (0..3)
        .map(|i| ChannelParams {
            name: format!("c{i}"),
            weight: 1,
        })
        .collect();
    let mut cfg = Config::new(channels, 1472, b"a fuzzing key, thirty-two bytes!".to_vec());
    cfg.mode = mode;
    cfg.receiver.buffer_packets = 64;
    cfg.queue_packets = 64;
    if mode == Mode::Seq && head & 4 != 0 {
        cfg.receiver.repair = Some(Duration::from_millis(5));
    }
    if head & 8 != 0 {
        cfg.arq = Some(ArqConfig {
            wait: Duration::from_millis(5),
        });
    }
    if head & 16 != 0 {
        cfg.aqm = Some(AqmConfig::default());
    }
    if head & 32 != 0 && mode != Mode::None {
        // Buffers of 96 leave room for a window of 32 and the markers' slack.
        cfg.receiver.buffer_packets = 96;
        cfg.credits = Some(CreditConfig {
            window: 32,
            pool: (head & 64 != 0).then_some(48),
        });
    }
    let buf = cfg.receiver.buffer_packets;
    let mut a = Session::new(cfg.clone(), [1; 32], Instant::ZERO).unwrap();
    let mut b = Session::new(cfg, [2; 32], Instant::ZERO).unwrap();
    let mut now = Instant::ZERO;
    let mut ab: VecDeque<(usize, Bytes)> = VecDeque::new();
    let mut ba: VecDeque<(usize, Bytes)> = VecDeque::new();
    let mut recorded: Vec<(usize, Bytes)> = Vec::new();
    let mut next_id = 0u64;
    let mut last_genuine: Option<u64> = None;
    for op in ops.chunks(24) {
        let Some((&k, body)) = op.split_first() else {
            continue;
        };
        now = now + Duration::from_micros(u64::from(k & 0x0f) * 700);
        match k >> 4 {
            0..=5 => {
                a.handle_packet(now, packet(next_id));
                next_id += 1;
            }
            6 => b.handle_datagram(now, body.first().map_or(0, |c| *c as usize % 3), Bytes::copy_from_slice(body)),
            7 => {
                // A control message (or anything) sealed with A's keys.
                if let Some(d) = a.seal_for_fuzzing(body.first().map_or(0, |c| *c as usize % 3), body.get(1..).unwrap_or_default()) {
                    b.handle_datagram(now, body.first().map_or(0, |c| *c as usize % 3), d);
                }
            }
            8 => {
                // Replay a recorded genuine datagram, maybe on another channel.
                if !recorded.is_empty() {
                    let i = body.first().map_or(0, |x| *x as usize) % recorded.len();
                    let (c, d) = recorded[i].clone();
                    let c = if body.get(1).is_some_and(|x| x & 1 == 1) { (c + 1) % 3 } else { c };
                    b.handle_datagram(now, c, d);
                }
            }
            9 => {
                // Drop or reorder what is in flight.
                if body.first().is_some_and(|x| x & 1 == 1) {
                    ab.pop_front();
                } else if ab.len() > 1 {
                    ab.swap(0, 1);
                }
            }
            _ => {
                a.handle_timeout(now);
                b.handle_timeout(now);
            }
        }
        // Deliver what is in flight both ways.
        while let Some(t) = a.poll_transmit() {
            if recorded.len() < 256 {
                recorded.push((t.channel, t.bytes.clone()));
            }
            ab.push_back((t.channel, t.bytes));
        }
        while let Some((c, d)) = ab.pop_front() {
            b.handle_datagram(now, c, d);
        }
        while let Some(t) = b.poll_transmit() {
            ba.push_back((t.channel, t.bytes));
        }
        while let Some((c, d)) = ba.pop_front() {
            a.handle_datagram(now, c, d);
        }
        while let Some(t) = a.poll_transmit() {
            ab.push_back((t.channel, t.bytes));
        }
        while let Some(p) = b.poll_deliver() {
            if mode == Mode::Seq && p.len() >= 36 && &p[20..28] == TAG {
                let id = u64::from_be_bytes(p[28..36].try_into().unwrap());
                if id < next_id {
                    assert!(last_genuine.is_none_or(|l| id > l), "seq out of order: {id} after {last_genuine:?}");
                    last_genuine = Some(id);
                }
            }
        }
        while a.poll_deliver().is_some() {}
        assert!(b.buffered() <= 4 * 3 * buf + 64, "B holds {}", b.buffered());
        assert!(a.buffered() <= 4 * 3 * 64 + 64, "A holds {}", a.buffered());
    }
});
