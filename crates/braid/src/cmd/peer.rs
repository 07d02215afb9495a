//! `braid peer add` and `braid peer remove`: one peer of a server added or removed at
//! run time. The configuration file is edited (so the change survives a restart) and
//! the running server re-reads it through its control socket, as on SIGHUP: the other
//! peers keep their sessions. The work is `braid_io::peer_file`.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};
use braid_io::{peer_file, tunnel, FileConfig};

/// Arguments of `braid peer`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Add a [[peer]] section to a server's configuration file and have the running
    /// server serve it at once (the other peers keep their sessions). Refused, with
    /// the file unchanged, for a name or public key another peer has, a bad key, or a
    /// prefix that is malformed or already another peer's.
    Add(AddArgs),
    /// Remove a peer (by name or public key) from a server's configuration file and
    /// have the running server drop it at once: its session is closed, the others keep
    /// theirs. The last peer cannot be removed (a file without [[peer]] sections is a
    /// point-to-point tunnel).
    Remove(RemoveArgs),
}

/// Where the server is.
#[derive(clap::Args, Debug)]
struct Target {
    /// The server's configuration file (with [[peer]] sections), as given to
    /// `braid tunnel --config`; it is edited in place (atomically, its permissions
    /// kept, comments and layout kept).
    #[arg(long)]
    config: PathBuf,
    /// The running server's control socket (default: tunnel.control, else
    /// /run/braid/NAME.sock). If nothing answers there, only the file changes, and
    /// the change applies when the server starts.
    #[arg(long)]
    control: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct AddArgs {
    #[command(flatten)]
    target: Target,
    /// The peer's name, in logs and `braid status` (1 to 64 printable characters).
    #[arg(long)]
    name: String,
    /// The peer's static public key (base64; on the peer: `braid pubkey < its private
    /// key`).
    #[arg(long)]
    public_key: String,
    /// The peer's inner addresses: prefixes of either family, comma-separated or the
    /// flag repeated (e.g. 10.77.1.0/24,fd77:1::/64; a bare address is one host).
    #[arg(long, value_delimiter = ',', required = true)]
    allowed_ips: Vec<String>,
}

#[derive(clap::Args, Debug)]
struct RemoveArgs {
    #[command(flatten)]
    target: Target,
    /// The peer: its name, or its public key.
    peer: String,
}

/// Run `braid peer`.
pub fn run(a: Args) -> Result<()> {
    match a.command {
        Command::Add(a) => {
            let _lock = lock(&a.target)?;
            let text = read(&a.target)?;
            let new = peer_file::add(
                &a.target.config,
                &text,
                &a.name,
                &a.public_key,
                &a.allowed_ips,
            )
            .map_err(|e| anyhow!("peer '{}' not added: {e}", a.name))?;
            apply(&a.target, &new, &format!("peer '{}' added", a.name))
        }
        Command::Remove(a) => {
            let _lock = lock(&a.target)?;
            let text = read(&a.target)?;
            let (new, name) = peer_file::remove(&a.target.config, &text, &a.peer)
                .map_err(|e| anyhow!("peer not removed: {e}"))?;
            apply(&a.target, &new, &format!("peer '{name}' removed"))
        }
    }
}

/// One `braid peer` command at a time edits a file (another waits here).
fn lock(t: &Target) -> Result<peer_file::Lock> {
    peer_file::lock(&t.config).with_context(|| {
        format!(
            "config {}: cannot lock its directory for the edit",
            t.config.display()
        )
    })
}

fn read(t: &Target) -> Result<String> {
    std::fs::read_to_string(&t.config)
        .with_context(|| format!("config {}: cannot read", t.config.display()))
}

/// Write the new file, then ask the running server to re-read it.
fn apply(t: &Target, text: &str, done: &str) -> Result<()> {
    let file = t.config.display();
    peer_file::write(&t.config, text).with_context(|| format!("config {file}: cannot write"))?;
    let fc = FileConfig::parse(&file.to_string(), text, t.config.parent())?;
    let Some(tc) = fc.tunnel else {
        println!("{done} in {file} (it has no [tunnel] section: no running server to tell)");
        return Ok(());
    };
    let ctl = tunnel::control_path(t.control.as_deref(), &tc);
    let rt = crate::cmd::tunnel::runtime()?;
    match rt.block_on(braid_io::observe::request_reload(&ctl)) {
        Ok(what) => {
            println!("{done} in {file}; the running server applied it: {what}");
            Ok(())
        }
        Err(None) => {
            println!(
                "{done} in {file}; no server answers on {} (not running?): it applies when the server starts",
                ctl.display()
            );
            Ok(())
        }
        Err(Some(e)) => bail!(
            "{done} in {file}, but the running server did not apply it: {e} (it re-reads the file on SIGHUP: systemctl reload braid@NAME)"
        ),
    }
}
