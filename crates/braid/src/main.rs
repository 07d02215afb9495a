//! `braid`: multipath striping from the command line.
//!
//! Each subcommand lives in its own module under `cmd/`.

mod cmd;

use clap::{Parser, Subcommand};

/// braid stripes one packet stream over several FIFO channels (links, UDP paths,
/// tunnels) and puts it back together in order at the receiver, at the sum of the
/// channels' speeds. It implements Surplus Round Robin with logical reception and
/// marker resynchronization (Adiseshu, Parulkar, Varghese, SIGCOMM '96) and
/// trigger-based SRR (Schrøder, Stormark, Koch).
#[derive(Parser, Debug)]
#[command(name = "braid", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Check a striping configuration and show the SRR schedule it produces for a
    /// sequence of packet sizes (no network, no privileges).
    Schedule(cmd::schedule::Args),
    /// Run a scenario file in the deterministic simulator: a table of goodput, order,
    /// loss and latency per run, or JSON, and optionally a plot.
    Sim(cmd::sim::Args),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Schedule(a) => cmd::schedule::run(a),
        Command::Sim(a) => cmd::sim::run(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("braid: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
