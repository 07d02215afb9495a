//! `braid send` and `braid recv`: a file or a live stream over the bond with a chosen
//! loss tolerance and deadline (seed 002's error control). The transfer itself is
//! `braid_io::transfer`; this parses arguments, opens the input and output, shows
//! progress and prints the summary (always on stderr: stdout may carry the data).

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use braid_io::transfer::{self, Progress, RecvSummary, SendSummary, TransferConfig};
use braid_io::Session;
use braid_proto::units;
use serde::Serialize;
use tokio::sync::watch;

use super::bench::{start_session, SessionArgs};
use super::tunnel::{init_tracing, parse_timeout, runtime, shutdown_signal};

/// Arguments of `braid send`.
#[derive(clap::Args, Debug)]
pub struct SendArgs {
    #[command(flatten)]
    s: SessionArgs,
    /// The file to send, or - for standard input.
    input: String,
    /// Loss tolerance W,E,B: segments of W packets, at most E lost per segment, at most B
    /// in a row (64,0,0: full reliability). The receiver uses the sender's.
    #[arg(long, default_value = "64,0,0")]
    tolerance: String,
    /// Give up repairing a segment this long after it started (e.g. 2s; default: never).
    #[arg(long)]
    deadline: Option<String>,
    /// Round-trip estimate: repair requests younger than this are ignored.
    #[arg(long, default_value = "50ms")]
    rtt: String,
    /// Segments in flight (default: about 4096 packets' worth).
    #[arg(long)]
    window: Option<u32>,
    /// Data bytes per packet (default: as many as the channels carry; 1316 with --live).
    #[arg(long)]
    chunk: Option<usize>,
    /// A live stream of fixed-size records: every packet carries exactly --chunk bytes
    /// (the input is read until a chunk is full, default 1316 = 7 MPEG-TS packets), so a
    /// packet lost within the tolerance takes whole records with it and the reader
    /// stays aligned. Use `braid recv --live` at the other end for low latency.
    #[arg(long)]
    live: bool,
    /// Show a progress line even when stderr is not a terminal.
    #[arg(long)]
    progress: bool,
}

/// Arguments of `braid recv`.
#[derive(clap::Args, Debug)]
pub struct RecvArgs {
    #[command(flatten)]
    s: SessionArgs,
    /// Where to write the stream, or - for standard output. A file is written to a
    /// temporary file beside it (.OUTPUT.XXXXXX.part), created when the first data
    /// arrives and renamed to OUTPUT when the transfer completes; a failed or
    /// interrupted run removes it and leaves OUTPUT as it was. Standard output and an
    /// existing device or FIFO (/dev/null, a named pipe) are written in place, as the
    /// data comes.
    output: String,
    /// Replace OUTPUT if it exists (it is replaced only when the transfer completes).
    /// Without it an existing file is an error and is kept unchanged.
    #[arg(long)]
    force: bool,
    /// Write each packet as soon as every packet before it has arrived or is lost within
    /// the tolerance, instead of a whole segment (W packets) at a time: the latency of
    /// a live stream no longer includes the time to fill a segment. The output is the
    /// same bytes in the same order.
    #[arg(long)]
    live: bool,
    /// Show a progress line even when stderr is not a terminal.
    #[arg(long)]
    progress: bool,
}

fn transfer_config(a: &SessionArgs) -> Result<TransferConfig> {
    Ok(TransferConfig {
        peer_timeout: parse_timeout(&a.peer_timeout, "--peer-timeout")?,
        ..TransferConfig::default()
    })
}

fn send_config(a: &SendArgs) -> Result<TransferConfig> {
    let mut c = transfer_config(&a.s)?;
    c.tolerance =
        transfer::parse_tolerance(&a.tolerance).map_err(|e| anyhow!("--tolerance: {e}"))?;
    c.deadline = match &a.deadline {
        Some(d) => Some(units::parse_duration(d).context("--deadline")?),
        None => None,
    };
    c.rtt = units::parse_duration(&a.rtt).context("--rtt")?;
    c.window = a.window.unwrap_or(0);
    c.chunk = a.chunk.unwrap_or(if a.live { 1316 } else { 0 });
    if c.chunk == 0 && a.chunk.is_some() {
        return Err(anyhow!("--chunk must be at least 1 byte"));
    }
    c.live = a.live;
    c.errctl()?;
    Ok(c)
}

/// A task that redraws the progress line on stderr, when wanted.
fn progress_line(
    forced: bool,
) -> (
    Option<watch::Sender<Progress>>,
    Option<tokio::task::JoinHandle<()>>,
) {
    if !forced && !std::io::stderr().is_terminal() {
        return (None, None);
    }
    let (tx, mut rx) = watch::channel(Progress::default());
    let task = tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            let line = rx.borrow_and_update().line();
            eprint!("\r{line}   ");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        eprintln!();
    });
    (Some(tx), Some(task))
}

/// After a transfer: let the progress line finish, close the session, and print the
/// summary (`text` for a person, or JSON) on stderr, which stays clear of the data.
async fn conclude<S: Serialize, E: Into<anyhow::Error>>(
    r: std::result::Result<S, E>,
    progress: (
        Option<watch::Sender<Progress>>,
        Option<tokio::task::JoinHandle<()>>,
    ),
    session: Session,
    text: fn(&S) -> String,
    json: bool,
) -> Result<()> {
    let (tx, task) = progress;
    drop(tx);
    if let Some(t) = task {
        let _ = t.await;
    }
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
    let cfg = send_config(&a)?;
    runtime()?.block_on(async move {
        let input = transfer::open_input(&a.input).await?;
        let (mut session, _ctl, _) = start_session(&a.s).await?;
        let progress = progress_line(a.progress);
        let r = tokio::select! {
            r = transfer::send(&mut session, input, &cfg, progress.0.as_ref()) => r,
            sig = shutdown_signal() => return Err(anyhow!("{sig}: transfer interrupted")),
        };
        conclude(r, progress, session, SendSummary::text, a.s.json).await
    })
}

/// Run `braid recv`.
pub fn recv(a: RecvArgs) -> Result<()> {
    init_tracing();
    let cfg = TransferConfig {
        live: a.live,
        ..transfer_config(&a.s)?
    };
    runtime()?.block_on(async move {
        // Checks only: nothing on disk changes before data arrives.
        let mut output = transfer::open_output(&a.output, a.force).await?;
        let (mut session, _ctl, _) = start_session(&a.s).await?;
        let progress = progress_line(a.progress);
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
            r = transfer::recv(&mut session, &mut output, &cfg, progress.0.as_ref()) => r,
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
