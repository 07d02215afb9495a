//! `braid send` and `braid recv`: a file or a live stream over the bond with a chosen
//! loss tolerance and deadline (seed 002's error control). The transfer itself is
//! `braid_io::transfer`, the flags `braid_io::args`; this opens the input and output, shows
//! progress and prints the summary (always on stderr: stdout may carry the data).

use anyhow::{anyhow, Result};
pub use braid_io::args::{RecvArgs, SendArgs};
use braid_io::transfer::{self, ProgressLine, RecvSummary, SendSummary};
use braid_io::Session;
use serde::Serialize;

use super::tunnel::{init_tracing, runtime, shutdown_signal};

/// After a transfer: let the progress line finish, close the session, and print the
/// summary (`text` for a person, or JSON) on stderr, which stays clear of the data.
async fn conclude<S: Serialize, E: Into<anyhow::Error>>(
    r: std::result::Result<S, E>,
    progress: ProgressLine,
    session: Session,
    text: fn(&S) -> String,
    json: bool,
) -> Result<()> {
    progress.finish().await;
    let r = r.map_err(Into::into)?;
    session.close().await;
    if json {
        eprintln!("{}", serde_json::to_string(&r).unwrap_or_default());
    } else {
        eprint!("{}", text(&r));
    }
    Ok(())
}

/// Run `braid send`.
pub fn send(a: SendArgs) -> Result<()> {
    init_tracing();
    let cfg = a.transfer_config()?;
    runtime()?.block_on(async move {
        let input = transfer::open_input(&a.input).await?;
        let (mut session, _ctl, _) = a.s.start().await?;
        let progress = ProgressLine::start(a.progress);
        let r = tokio::select! {
            r = transfer::send(&mut session, input, &cfg, progress.sender()) => r,
            sig = shutdown_signal() => return Err(anyhow!("{sig}: transfer interrupted")),
        };
        conclude(r, progress, session, SendSummary::text, a.s.json).await
    })
}

/// Run `braid recv`.
pub fn recv(a: RecvArgs) -> Result<()> {
    init_tracing();
    let cfg = a.transfer_config()?;
    runtime()?.block_on(async move {
        // Checks only: nothing on disk changes before data arrives.
        let mut output = transfer::open_output(&a.output, a.force).await?;
        let (mut session, _ctl, _) = a.s.start().await?;
        let progress = ProgressLine::start(a.progress);
        // On failure `output` is dropped, which removes its temporary file.
        let staged = output
            .staged()
            .map(|p| (p.display().to_string(), p.exists()));
        let unchanged = |e: anyhow::Error| match &staged {
            Some((p, true)) => e.context(format!("'{p}' is unchanged")),
            Some((p, false)) => e.context(format!("'{p}' was not created")),
            None => e,
        };
        let r = tokio::select! {
            r = transfer::recv(&mut session, &mut output, &cfg, progress.sender()) => r,
            sig = shutdown_signal() => {
                return Err(unchanged(anyhow!("{sig}: transfer interrupted")));
            }
        };
        let r = match r {
            Ok(s) => output.finish().await.map(|()| s),
            Err(e) => Err(e),
        }
        .map_err(|e| unchanged(e.into()));
        conclude(r, progress, session, RecvSummary::text, a.s.json).await
    })
}
