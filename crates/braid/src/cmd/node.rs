//! `braid node`: run one member of a GALO overlay (seed 003): measure the peers, exchange
//! authenticated UPDATEs, choose paths to the configured destinations and print every
//! route change; relay provisioned flows; stripe this node's own flow (`[flow]`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use braid_io::node::{Node, NodeConfig};

/// Arguments of `braid node`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Node configuration (TOML; see docs/overlay.md).
    #[arg(long)]
    config: PathBuf,
    /// Print the accessibility table, the relayed flows and the flow, authentication
    /// and HELLO counters this often, in seconds (0: never).
    #[arg(long, default_value_t = 0.0)]
    table_every: f64,
}

/// Run `braid node`.
pub fn run(a: Args) -> Result<()> {
    super::tunnel::init_tracing();
    let cfg = NodeConfig::load(&a.config)?;
    let me = cfg.id;
    let rt = super::tunnel::runtime()?;
    rt.block_on(async move {
        let listen = cfg.listen;
        let node = Node::bind(cfg)
            .await
            .with_context(|| format!("binding {listen}"))?;
        let handle = node.handle();
        eprintln!("node {me} listening on {}", node.local_addr()?);
        let printer = tokio::spawn(async move {
            let mut shown = 0;
            let mut shown_slots: Option<(u32, Vec<Option<String>>)> = None;
            let mut last_table = std::time::Instant::now();
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                let s = handle.snapshot();
                for c in &s.changes[shown..] {
                    let paths: Vec<String> = c
                        .paths
                        .iter()
                        .map(|(p, mbps)| format!("{p} ({mbps:.2} Mbit/s)"))
                        .collect();
                    println!("route to {}: {} [{}]", c.dst, paths.join(" + "), c.reason);
                }
                shown = s.changes.len();
                if let Some(f) = &s.flow {
                    let now = Some((f.flow, f.slots.clone()));
                    if now != shown_slots {
                        let slots: Vec<String> = f
                            .slots
                            .iter()
                            .enumerate()
                            .map(|(i, p)| format!("{i}: {}", p.as_deref().unwrap_or("unused")))
                            .collect();
                        println!(
                            "flow {:08x} {}->{}: slots {}",
                            f.flow,
                            f.src,
                            f.dst,
                            slots.join(", ")
                        );
                        shown_slots = now;
                    }
                }
                if a.table_every > 0.0 && last_table.elapsed().as_secs_f64() >= a.table_every {
                    last_table = std::time::Instant::now();
                    println!(
                        "relaying {} flow(s): {} DATA datagrams forwarded, {} dropped",
                        s.relayed.len(),
                        s.stats.forwarded,
                        s.stats.data_dropped
                    );
                    for e in &s.relayed {
                        println!(
                            "relayed flow {:08x} {}->{} slot {}",
                            e.flow, e.src, e.dst, e.slot
                        );
                    }
                    println!(
                        "authentication: {} datagrams refused, {} HELLOs taken, {} sent; flow messages: {} PROVISIONs, {} TEARDOWNs, {} refused",
                        s.stats.auth_failures,
                        s.stats.hellos,
                        s.stats.hellos_sent,
                        s.stats.provisions,
                        s.stats.teardowns,
                        s.stats.flow_refused
                    );
                    if let Some(f) = &s.flow {
                        println!(
                            "flow {:08x}: sent per slot {:?}, received per slot {:?}",
                            f.flow, f.sent, f.received
                        );
                    }
                    let now = braid_io::node::wall_now();
                    for from in 0..s.table.nodes() as u16 {
                        for to in 0..s.table.nodes() as u16 {
                            if let Some(m) = s.table.get(from, to) {
                                println!(
                                    "hop {from}->{to}: {:.2} Mbit/s, rtt {:.1} ms, loss {:.2} %, age {} ms",
                                    m.throughput_bps / 1e6,
                                    m.rtt.as_secs_f64() * 1e3,
                                    m.loss * 100.0,
                                    (now - m.at).as_micros() / 1000
                                );
                            }
                        }
                    }
                }
            }
        });
        let sig = node
            .run(async {
                let s = super::tunnel::shutdown_signal().await;
                eprintln!("{s}: stopping");
            })
            .await;
        printer.abort();
        sig.context("node stopped")
    })
}
