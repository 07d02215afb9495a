//! `braid bench`: a traffic generator (`send`) and sink (`sink`) over braid channels,
//! without a TUN device and without privileges, plus a raw-UDP pair (`udp-send`,
//! `udp-sink`) with the same payload and report, as the baseline. The flags are
//! `braid_io::args`, the traffic and its accounting `braid_io::traffic`; this runs them
//! and prints.

use anyhow::{Context, Result};
use braid_io::args::{stop_after, BenchSendArgs, BenchSinkArgs, UdpSendArgs, UdpSinkArgs};
use braid_io::traffic::{self, SendReport, SinkReport};
use braid_proto::units;
use tracing::info;

use super::tunnel::{init_tracing, runtime, shutdown_signal};

/// Arguments of `braid bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
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
}

/// Run `braid bench`.
pub fn run(a: Args) -> Result<()> {
    init_tracing();
    runtime()?.block_on(async move {
        match *a.role {
            Role::Send(x) => send(x).await,
            Role::Sink(x) => sink(x).await,
            Role::UdpSend(x) => udp_send(x).await,
            Role::UdpSink(x) => udp_sink(x).await,
        }
    })
}

fn print_send(r: &SendReport, json: bool) {
    if json {
        println!("{}", serde_json::to_string_pretty(r).unwrap_or_default());
    } else {
        println!("{}", r.summary());
        if let Some(s) = &r.session {
            print!("{}", s.table());
        }
    }
}

fn print_sink(r: &SinkReport, json: bool) {
    if json {
        println!("{}", serde_json::to_string_pretty(r).unwrap_or_default());
    } else {
        print!("{}", r.table());
        if let Some(s) = &r.session {
            print!("{}", s.table());
        }
    }
}

async fn send(a: BenchSendArgs) -> Result<()> {
    let (mut session, _ctl, _) = a.s.start().await?;
    let pattern =
        a.t.pattern(session.sender().max_message().saturating_sub(1))?;
    info!("peer answered; sending");
    let r = traffic::session_send(&mut session, &pattern, shutdown_signal()).await?;
    session.close().await;
    print_send(&r, a.s.json);
    Ok(())
}

async fn sink(a: BenchSinkArgs) -> Result<()> {
    let idle = units::parse_duration(&a.idle).context("--idle")?;
    let deadline = stop_after(&a.max_duration)?;
    let (mut session, _ctl, timeout) = a.s.start().await?;
    info!("peer answered; receiving");
    let r = traffic::session_sink(&mut session, idle, timeout, deadline, shutdown_signal()).await;
    session.close().await;
    print_sink(&r, a.s.json);
    Ok(())
}

async fn udp_send(a: UdpSendArgs) -> Result<()> {
    let pattern = a.t.pattern(65507)?;
    let r = traffic::udp_send(a.to, a.bind, &pattern, shutdown_signal()).await?;
    print_send(&r, a.json);
    Ok(())
}

async fn udp_sink(a: UdpSinkArgs) -> Result<()> {
    let idle = units::parse_duration(&a.idle).context("--idle")?;
    let deadline = stop_after(&a.max_duration)?;
    let r = traffic::udp_sink(a.bind, idle, deadline, shutdown_signal()).await?;
    print_sink(&r, a.json);
    Ok(())
}
