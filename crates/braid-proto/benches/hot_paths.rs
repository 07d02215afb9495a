//! Per-packet cost of the hot paths: the SRR striper's choose-and-update, and the
//! logical-reception receiver per delivered packet, on 2, 4 and 8 channels.
//!
//! Run: `cargo bench -p braid-proto --bench hot_paths`

use std::hint::black_box;

use braid_proto::sched::{Cost, Srr};
use braid_proto::{Instant, Mode, Resequencer, StripeConfig, Striper};
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

const MAX: u32 = 1500;

/// Packet sizes of a realistic mix (40 % small, 20 % medium, 40 % full).
fn sizes(n: usize) -> Vec<usize> {
    (0..n)
        .map(|i| match (i * 7919) % 10 {
            0..=3 => 64,
            4..=5 => 576,
            _ => 1500,
        })
        .collect()
}

fn config(channels: usize, mode: Mode) -> StripeConfig {
    let mut cfg = StripeConfig::srr(vec![MAX * 2; channels], MAX);
    cfg.mode = mode;
    cfg
}

fn striper(c: &mut Criterion) {
    let mut g = c.benchmark_group("srr_choose_update");
    let sz = sizes(4096);
    for n in [2usize, 4, 8] {
        g.throughput(Throughput::Elements(sz.len() as u64));
        g.bench_function(format!("{n}ch"), |b| {
            let mut s = Srr::new(&vec![MAX * 2; n], Cost::Bytes);
            b.iter(|| {
                let mut acc = 0usize;
                for &len in &sz {
                    acc += s.select();
                    s.on_sent(black_box(len));
                }
                black_box(acc)
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("striper_packet");
    let packets: Vec<Bytes> = sz
        .iter()
        .map(|&l| {
            let mut v = vec![0u8; l];
            v[0] = 0x45;
            Bytes::from(v)
        })
        .collect();
    for n in [2usize, 4, 8] {
        g.throughput(Throughput::Elements(packets.len() as u64));
        g.bench_function(format!("{n}ch"), |b| {
            let mut s = Striper::new(config(n, Mode::Logical)).unwrap();
            b.iter(|| {
                let mut acc = 0usize;
                for p in &packets {
                    s.handle_packet(Instant::ZERO, p.clone()).unwrap();
                    while let Some(t) = s.poll_transmit() {
                        acc += t.channel;
                    }
                }
                black_box(acc)
            })
        });
    }
    g.finish();
}

/// Datagrams of a striped stream in an arrival order where channel `c` lags `4c`
/// datagrams behind (skew), with markers in band. `len` fixes the packet size (the
/// receiver's work does not depend on it, but the memory the test touches does).
fn arrivals(n: usize, mode: Mode, count: usize, len: Option<usize>) -> Vec<(usize, Bytes)> {
    let mut s = Striper::new(config(n, mode)).unwrap();
    let mut out = Vec::new();
    let sizes: Vec<usize> = match len {
        Some(l) => vec![l; count],
        None => sizes(count),
    };
    for (i, &len) in sizes.iter().enumerate() {
        let mut v = vec![0u8; len];
        v[0] = 0x45;
        s.handle_packet(Instant::ZERO, Bytes::from(v)).unwrap();
        while let Some(t) = s.poll_transmit() {
            out.push((i + 4 * t.channel, t.channel, t.to_bytes()));
        }
    }
    out.sort_by_key(|(k, _, _)| *k);
    out.into_iter().map(|(_, c, b)| (c, b)).collect()
}

fn receiver(c: &mut Criterion) {
    // Packets of the realistic mix (8 MB touched), and 128-byte packets, which stay in
    // cache as a datagram just received does.
    for (group, len) in [
        ("logical_receiver_packet", None),
        ("logical_receiver_packet_hot", Some(128)),
    ] {
        receiver_group(c, group, len);
    }
}

fn receiver_group(c: &mut Criterion, group: &str, len: Option<usize>) {
    let mut g = c.benchmark_group(group);
    const COUNT: usize = 8_192;
    for n in [2usize, 4, 8] {
        let input = arrivals(n, Mode::Logical, COUNT, len);
        g.throughput(Throughput::Elements(COUNT as u64));
        g.bench_function(format!("{n}ch"), |b| {
            // Datagrams are handed over owned and unshared, as a driver does after a
            // receive: the copies are made in the untimed setup, and the delivered
            // packets are dropped after the measurement (criterion drops the routine's
            // output outside the timed section), so this is the receiver's own cost.
            b.iter_batched(
                || {
                    let fresh: Vec<(usize, Bytes)> = input
                        .iter()
                        .map(|(c, d)| (*c, Bytes::from(d.to_vec())))
                        .collect();
                    let r = Resequencer::new(&config(n, Mode::Logical)).unwrap();
                    (r, fresh, Vec::with_capacity(COUNT))
                },
                |(mut r, input, mut delivered)| {
                    for (ch, d) in input {
                        r.handle_datagram(Instant::ZERO, ch, d);
                        while let Some(p) = r.poll_deliver() {
                            delivered.push(p);
                        }
                    }
                    assert_eq!(delivered.len(), COUNT);
                    (r, delivered)
                },
                BatchSize::LargeInput,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, striper, receiver);
criterion_main!(benches);
