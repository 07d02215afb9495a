//! `braid genkey` and `braid pubkey`: key material for `braid tunnel` and `braid node`.

use std::io::{Read, Write};
use std::os::fd::AsFd;

use anyhow::{Context, Result};
use braid_io::keys;

/// Arguments of `braid genkey`.
#[derive(clap::Args, Debug)]
pub struct GenArgs {}

/// Arguments of `braid pubkey`.
#[derive(clap::Args, Debug)]
pub struct PubArgs {}

/// Print 32 fresh random bytes as base64: a pre-shared key or a private key. When
/// standard output is a file that group or others can read (`braid genkey > k` with the
/// usual umask 022), warn on stderr, as `wg genkey` does: braid refuses such a key file.
pub fn genkey(_: GenArgs) -> Result<()> {
    let k = keys::generate().context("no randomness from the operating system")?;
    let out = std::io::stdout();
    if let Some(w) = keys::exposed_file_warning(out.as_fd()) {
        eprintln!("{w}");
    }
    writeln!(out.lock(), "{}", keys::encode(&k))?;
    Ok(())
}

/// Read a private key (base64) on standard input, print its public key.
pub fn pubkey(_: PubArgs) -> Result<()> {
    let mut text = String::new();
    std::io::stdin()
        .take(4096)
        .read_to_string(&mut text)
        .context("reading the private key from standard input")?;
    let private = keys::decode(&text).context("standard input")?;
    writeln!(
        std::io::stdout(),
        "{}",
        keys::encode(&keys::public_key(&private))
    )?;
    Ok(())
}
