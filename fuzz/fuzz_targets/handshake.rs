//! A session end receiving arbitrary datagrams, most of them shaped like handshake
//! messages (initiations, responses and cookie replies with arbitrary contents) or
//! sealed datagrams, its handshake work done at once or handed out as jobs (run, shed):
//! no panic, nothing unauthenticated opens, no handshake completes.
#![no_main]

use braid_proto::session::{ChannelParams, Config, Session};
use braid_proto::{Duration, Instant};
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let channels = (0..2)
        .map(|i| ChannelParams {
            name: format!("c{i}"),
            weight: 1,
        })
        .collect();
    let mut cfg = Config::new(channels, 1472, b"a fuzzing key, thirty-two bytes!".to_vec());
    if data.first().is_some_and(|b| b & 1 == 1) {
        // Static keys instead: the IK pattern.
        cfg.key.clear();
        cfg.private_key = Some([7; 32]);
        cfg.peer_public_key = Some(braid_proto::session::crypto::public_key(&[9; 32]));
    }
    let mut s = Session::new(cfg, [3; 32], Instant::ZERO).unwrap();
    let offload = data.first().is_some_and(|b| b & 2 == 2);
    if offload {
        s.offload_handshakes();
        s.set_channel_address(0, b"192.0.2.1:7000");
    }
    let mut now = Instant::ZERO;
    for chunk in data.get(1..).unwrap_or_default().chunks(130) {
        let Some((&kind, body)) = chunk.split_first() else {
            continue;
        };
        let mut d = match kind % 8 {
            0 => vec![0xBA, 2, 0, 0],
            1 => vec![0xBB, 2, 0, 0],
            2 => vec![0xB8, 1, 0, 0],
            3 => vec![0xBB, 2, 2, 0],
            4 => vec![0xBA, 2, 1, 0],
            _ => vec![],
        };
        d.extend_from_slice(body);
        now = now + Duration::from_millis(u64::from(kind >> 2));
        s.handle_datagram(now, (kind >> 7) as usize, Bytes::from(d));
        let mut shed = kind & 0x40 == 0x40;
        while let Some(job) = s.poll_handshake() {
            if shed {
                s.handshake_shed(job);
            } else {
                s.handle_handshake_done(now, job.run());
            }
            shed = !shed;
        }
        s.handle_timeout(now);
        while s.poll_transmit().is_some() {}
        assert!(s.poll_deliver().is_none(), "something unauthenticated was delivered");
        assert!(!s.peer_seen(), "a handshake completed without the keys");
    }
});
