//! `braid send` and `braid recv`: a file or a live stream over the bond with a chosen
//! loss tolerance and deadline (seed 002's error control). The transfer itself is
//! `braid_io::transfer`, the flags and their run `braid_io::args`; this prints the
//! summary (always on stderr: stdout may carry the data).

use anyhow::Result;
pub use braid_io::args::{RecvArgs, SendArgs};

use super::tunnel::{init_tracing, runtime, shutdown_signal};

/// Run `braid send`.
pub fn send(a: SendArgs) -> Result<()> {
    init_tracing();
    let cfg = a.transfer_config()?;
    eprint!("{}", runtime()?.block_on(a.run(&cfg, shutdown_signal()))?);
    Ok(())
}

/// Run `braid recv`.
pub fn recv(a: RecvArgs) -> Result<()> {
    init_tracing();
    let cfg = a.transfer_config()?;
    eprint!("{}", runtime()?.block_on(a.run(&cfg, shutdown_signal()))?);
    Ok(())
}
