//! Simulator speed: packet events per second of wall time on one core, for a
//! backlogged 4-channel SRR + logical-reception run.
//!
//! `cargo bench -p braid-sim --bench events` (packets: `BRAID_SIM_BENCH_PACKETS`,
//! default 10 000 000). An event is one step of the engine: a packet offered to the
//! striper, a transmission that ends, an arrival at the receiver, or a protocol timer.

use std::time::Instant;

use braid_proto::sched::srr_quanta;
use braid_proto::StripeConfig;
use braid_sim::model::{Arrivals, ChannelSpec, Sizes, TrafficSpec};
use braid_sim::{run, RunConfig, Variant};

fn main() {
    // `cargo bench` passes --bench; a filter argument that is not ours means "skip".
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args
        .iter()
        .any(|a| !a.starts_with('-') && !"events".contains(a.as_str()))
    {
        return;
    }
    let packets: u64 = std::env::var("BRAID_SIM_BENCH_PACKETS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let rates = [100e6, 200e6, 300e6, 400e6];
    let channels: Vec<ChannelSpec> = rates
        .iter()
        .enumerate()
        .map(|(i, &r)| {
            let mut c = ChannelSpec::new(r);
            c.delay = 1_000_000 * (1 + i as u64);
            c.queue_packets = 64;
            c
        })
        .collect();
    let sc = StripeConfig::srr(srr_quanta(&rates, 1500, 1500), 1500);
    let cfg = RunConfig {
        channels,
        traffic: TrafficSpec {
            arrivals: Arrivals::Backlogged,
            sizes: Sizes::Uniform { min: 64, max: 1500 },
            start: 0,
        },
        duration: None,
        packets: Some(packets),
        drain: 2_000_000_000,
        seed: 1,
        variant: Variant::Striped(sc),
        voip: None,
    };
    let t = Instant::now();
    let r = run(&cfg).expect("bench config is valid");
    let wall = t.elapsed().as_secs_f64();
    assert_eq!(
        r.packets_delivered, packets,
        "lossless run delivers everything"
    );
    println!(
        "events: 4-channel backlogged SRR+logical, {} packets, {} events in {:.3} s wall: \
         {:.2} M events/s, {:.2} M packets/s ({:.1} simulated s, goodput {:.1} Mbit/s)",
        packets,
        r.events,
        wall,
        r.events as f64 / wall / 1e6,
        packets as f64 / wall / 1e6,
        r.duration_s,
        r.goodput_bps / 1e6
    );
}
