//! The resequencer in every mode, fed arbitrary datagrams on arbitrary channels at
//! arbitrary times: no panic, memory within its bound.
#![no_main]

use braid_proto::{Duration, Instant, Mode, Resequencer, StripeConfig};
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&head, mut rest)) = data.split_first() else {
        return;
    };
    let mode = [Mode::None, Mode::Logical, Mode::Seq, Mode::Trr][(head & 3) as usize];
    let channels = 1 + (head >> 2 & 3) as usize;
    let mut cfg = StripeConfig::srr(vec![1500; channels], 1500);
    cfg.mode = mode;
    cfg.receiver.buffer_packets = 64;
    cfg.receiver.equalize = head & 0x10 != 0;
    if mode == Mode::Seq && head & 0x20 != 0 {
        cfg.receiver.repair = Some(Duration::from_millis(5));
    }
    let Ok(mut r) = Resequencer::new(&cfg) else {
        return;
    };
    let mut now = Instant::ZERO;
    // Records: [channel, time step (100 us units), length, bytes...].
    while rest.len() >= 3 {
        let (c, step, len) = (rest[0] as usize % channels, rest[1], rest[2] as usize);
        rest = &rest[3..];
        let n = len.min(rest.len());
        now = now + Duration::from_micros(u64::from(step) * 100);
        if step == 255 {
            r.handle_timeout(now);
        } else {
            r.handle_datagram(now, c, Bytes::copy_from_slice(&rest[..n]));
        }
        rest = &rest[n..];
        while r.poll_deliver().is_some() {}
        while r.poll_nak().is_some() {}
        // Per-channel buffers, the equalizer's holds and repairs: all bounded by the
        // buffer size per channel (twice, for the hold queue).
        assert!(r.buffered() <= 3 * channels * 64 + 64, "{}", r.buffered());
    }
    r.drain(now);
    while r.poll_deliver().is_some() {}
});
