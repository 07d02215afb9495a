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
        let mut report = braid_io::node_report::Report::new(a.table_every);
        let printer = tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                for line in report.lines(&handle.snapshot()) {
                    println!("{line}");
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
