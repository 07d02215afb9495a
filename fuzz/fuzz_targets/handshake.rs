//! A session end receiving arbitrary datagrams, most of them shaped like handshake
//! messages (initiations and responses with arbitrary Noise payloads) or sealed
//! datagrams: no panic, nothing unauthenticated opens, no handshake completes.
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
    let mut now = Instant::ZERO;
    for chunk in data.get(1..).unwrap_or_default().chunks(130) {
        let Some((&kind, body)) = chunk.split_first() else {
            continue;
        };
        let mut d = match kind % 4 {
            0 => vec![0xBA, 1, 0, 0],
            1 => vec![0xBB, 1, 0, 0],
            2 => vec![0xB8, 1, 0, 0],
            _ => vec![],
        };
        d.extend_from_slice(body);
        now = now + Duration::from_millis(u64::from(kind >> 2));
        s.handle_datagram(now, (kind >> 7) as usize, Bytes::from(d));
        s.handle_timeout(now);
        while s.poll_transmit().is_some() {}
        assert!(s.poll_deliver().is_none(), "something unauthenticated was delivered");
        assert!(!s.peer_seen(), "a handshake completed without the keys");
    }
});
