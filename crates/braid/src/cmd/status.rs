//! `braid status`: read a running tunnel's (or bench's) control socket and print its
//! channels and counters.

use std::path::PathBuf;

use anyhow::{anyhow, Result};
use braid_io::FileConfig;

/// Arguments of `braid status`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The control socket (default: tunnel.control from --config, else /run/braid/NAME.sock).
    #[arg(long)]
    control: Option<PathBuf>,
    /// The tunnel's configuration file, to find its control socket.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print the raw JSON snapshot.
    #[arg(long)]
    json: bool,
}

/// Run `braid status`.
pub fn run(a: Args) -> Result<()> {
    let path = match (&a.control, &a.config) {
        (Some(p), _) => p.clone(),
        (None, Some(c)) => {
            let fc = FileConfig::load(c)?;
            let t = fc
                .tunnel
                .ok_or_else(|| anyhow!("config {}: no [tunnel] section", c.display()))?;
            braid_io::tunnel::control_path(None, &t)
        }
        (None, None) => PathBuf::from("/run/braid/braid0.sock"),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let s = rt
        .block_on(braid_io::observe::query_control(&path))
        .map_err(|e| anyhow!(e))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", s.table());
    }
    Ok(())
}
