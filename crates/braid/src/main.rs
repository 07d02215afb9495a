//! `braid`: multipath striping from the command line.
//!
//! Each subcommand lives in its own module under `cmd/`.

mod cmd;

/// Logging (flags, level, reload): `braid_io::logging`.
pub(crate) use braid_io::logging;

use clap::{CommandFactory, Parser, Subcommand};

/// The exit status, for `--help` and the man page (kept here, next to `main`, which
/// returns it).
const EXIT_STATUS: &str = "\
Exit status:
  0    success (a tunnel, bench or node stopped by SIGINT or SIGTERM also exits 0)
  1    a runtime error: a bad configuration file, a missing key, a network or device
       error, a peer that did not answer in time, a failed check; the message on
       standard error names what failed
  2    a command-line usage error (an unknown flag, a missing or invalid argument)
  101  a bug in braid (a panic): please report it with the message";

/// braid stripes one packet stream over several FIFO channels (links, UDP paths,
/// tunnels) and puts it back together in order at the receiver, at the sum of the
/// channels' speeds. It implements Surplus Round Robin with logical reception and
/// marker resynchronization (Adiseshu, Parulkar, Varghese, SIGCOMM '96),
/// trigger-based SRR (Schrøder, Stormark, Koch), application-oriented error control
/// with a loss tolerance for `send`/`recv` (Gong, Parulkar), and seals every datagram
/// (Noise handshake; AES-256-GCM or ChaCha20-Poly1305, whichever both ends run faster) by default. Docs: README.md and docs/.
#[derive(Parser, Debug)]
#[command(
    name = "braid",
    version = env!("BRAID_LONG_VERSION"),
    propagate_version = true,
    after_long_help = EXIT_STATUS
)]
struct Cli {
    #[command(flatten)]
    log: logging::LogArgs,
    #[command(subcommand)]
    command: Command,
}

/// The command tree, for the man pages and completions.
pub(crate) fn cli_command() -> clap::Command {
    Cli::command()
}

/// The text of the man page's EXIT STATUS section (also in `braid --help`).
pub(crate) fn exit_status_text() -> &'static str {
    EXIT_STATUS
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Check a striping configuration and show the SRR schedule it produces for a
    /// sequence of packet sizes (no network, no privileges).
    Schedule(cmd::schedule::Args),
    /// Run a scenario file in the deterministic simulator: a table of goodput, order,
    /// loss and latency per run, or JSON, and optionally a plot.
    Sim(cmd::sim::Args),
    /// Run the strIPe virtual interface: a TUN device whose IP packets are striped over
    /// the configured UDP channels and resequenced at the peer (needs CAP_NET_ADMIN).
    /// Under systemd (braid@NAME.service) it reports readiness once the peer answers.
    Tunnel(cmd::tunnel::Args),
    /// Traffic generator and sink over braid channels (no TUN, no privileges), and a raw
    /// UDP baseline: goodput, loss, out-of-order, latency.
    Bench(cmd::bench::Args),
    /// Send a file or stdin over braid channels with a loss tolerance and deadline.
    Send(cmd::transfer::SendArgs),
    /// Receive what `braid send` sends into a file or stdout; a summary on stderr.
    Recv(cmd::transfer::RecvArgs),
    /// Show the live state and counters of a running tunnel or bench.
    Status(cmd::status::Args),
    /// Add or remove one peer of a running server: its configuration file is edited
    /// (the change survives a restart) and the server re-reads it at once, without
    /// disturbing the other peers.
    Peer(cmd::peer::Args),
    /// Print a new key (32 random bytes, base64): a pre-shared key for `key_file`, or a
    /// private key for `private_key_file` (tunnel or node). Store it with `chmod 600`;
    /// braid warns on stderr when standard output is a file that group or others can
    /// read.
    Genkey(cmd::keys::GenArgs),
    /// Read a private key on standard input and print its public key (for the peer's
    /// `peer_public_key`, or a `[[peer]] public_key` of `braid node`).
    Pubkey(cmd::keys::PubArgs),
    /// The namespace testbed: links shaped with tbf plus braid's user-space link
    /// emulator for delay, jitter and loss (needs root).
    Lab(cmd::lab::Args),
    /// Run one node of a GALO overlay (seed 003): measure the peers over UDP, exchange
    /// authenticated UPDATEs, choose up to three paths (direct or through one relay) to
    /// the configured destinations and print route changes; relay the flows other nodes
    /// provision through it; with a `[flow]` section, stripe a flow to `flow.to` over
    /// the chosen paths (a TUN device at each end) and move it when a relay dies.
    Node(cmd::node::Args),
    /// Print a shell completion script to standard output (bash, zsh, fish, elvish,
    /// powershell), generated from the same definitions as --help.
    Completions(cmd::docs::CompletionArgs),
    /// Write the man pages (braid.1 and one per subcommand, e.g. braid-tunnel.1) into a
    /// directory, generated from the same definitions as --help.
    Man(cmd::docs::ManArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    braid_io::memory::tune_allocator();
    logging::set_cli(cli.log.clone());
    let result = match cli.command {
        Command::Schedule(a) => cmd::schedule::run(a),
        Command::Sim(a) => cmd::sim::run(a),
        Command::Tunnel(a) => cmd::tunnel::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Send(a) => cmd::transfer::send(a),
        Command::Recv(a) => cmd::transfer::recv(a),
        Command::Status(a) => cmd::status::run(a),
        Command::Peer(a) => cmd::peer::run(a),
        Command::Genkey(a) => cmd::keys::genkey(a),
        Command::Pubkey(a) => cmd::keys::pubkey(a),
        Command::Lab(a) => cmd::lab::run(a),
        Command::Node(a) => cmd::node::run(a),
        Command::Completions(a) => cmd::docs::completions(a),
        Command::Man(a) => cmd::docs::man(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // A reader that went away (`braid status --watch | head`) is not a failure.
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("braid: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
