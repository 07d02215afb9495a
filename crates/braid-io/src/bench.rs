//! `braid bench`: a traffic generator (`send`) and sink (`sink`) over braid channels,
//! without a TUN device and without privileges, plus a raw-UDP pair (`udp-send`,
//! `udp-sink`) with the same payload and report, as the baseline. The flags are
//! [`crate::args`], the traffic and its accounting [`crate::traffic`]; this runs a role
//! and renders its report for the CLI to print.

use std::future::Future;

use anyhow::{Context, Result};
use braid_proto::units;
use tracing::info;

use crate::args::{stop_after, BenchSendArgs, BenchSinkArgs, UdpSendArgs, UdpSinkArgs};
use crate::traffic::{self, SendReport, SinkReport};

/// Arguments of `braid bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    role: Box<Role>,
}

#[derive(clap::Subcommand, Debug)]
enum Role {
    /// Generate traffic over braid channels.
    Send(BenchSendArgs),
    /// Receive traffic over braid channels and report.
    Sink(BenchSinkArgs),
    /// Baseline: generate the same traffic on one plain UDP socket.
    UdpSend(UdpSendArgs),
    /// Baseline: receive plain UDP and report.
    UdpSink(UdpSinkArgs),
    /// Many client sessions against a real server process (`braid tunnel` with a
    /// `[[peer]]` each), over loopback in a namespace of its own: handshakes per
    /// second, the server's memory with every peer connected, forwarding (root).
    Peers(crate::peers_bench::PeersArgs),
}

impl BenchArgs {
    /// Run the role until it ends or `stop` resolves (SIGINT/SIGTERM); the report as
    /// the text to print on standard output (a table, or JSON with `--json`).
    pub async fn run(self, stop: impl Future) -> Result<String> {
        match *self.role {
            Role::Send(a) => send(a, stop).await,
            Role::Sink(a) => sink(a, stop).await,
            Role::UdpSend(a) => {
                let pattern = a.t.pattern(65507)?;
                let r = traffic::udp_send(a.to, a.bind, &pattern, stop).await?;
                Ok(render_send(&r, a.json))
            }
            Role::Peers(a) => a.run().await,
            Role::UdpSink(a) => {
                let idle = units::parse_duration(&a.idle).context("--idle")?;
                let deadline = stop_after(&a.max_duration)?;
                let r = traffic::udp_sink(a.bind, idle, deadline, stop).await?;
                Ok(render_sink(&r, a.json))
            }
        }
    }
}

async fn send(a: BenchSendArgs, stop: impl Future) -> Result<String> {
    let (mut session, _ctl, _) = a.s.start().await?;
    let pattern =
        a.t.pattern(session.sender().max_message().saturating_sub(1))?;
    info!("peer answered; sending");
    let r = traffic::session_send(&mut session, &pattern, stop).await?;
    session.close().await;
    Ok(render_send(&r, a.s.json))
}

async fn sink(a: BenchSinkArgs, stop: impl Future) -> Result<String> {
    let idle = units::parse_duration(&a.idle).context("--idle")?;
    let deadline = stop_after(&a.max_duration)?;
    let (mut session, _ctl, timeout) = a.s.start().await?;
    info!("peer answered; receiving");
    let r = traffic::session_sink(&mut session, idle, timeout, deadline, stop).await;
    session.close().await;
    Ok(render_sink(&r, a.s.json))
}

fn render_send(r: &SendReport, json: bool) -> String {
    if json {
        return serde_json::to_string_pretty(r).unwrap_or_default() + "\n";
    }
    let mut s = r.summary() + "\n";
    if let Some(t) = &r.session {
        s += &t.table();
    }
    s
}

fn render_sink(r: &SinkReport, json: bool) -> String {
    if json {
        return serde_json::to_string_pretty(r).unwrap_or_default() + "\n";
    }
    let mut s = r.table();
    if let Some(t) = &r.session {
        s += &t.table();
    }
    s
}
