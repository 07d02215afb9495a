//! `braid genkey` and `braid pubkey`: key material for `braid tunnel` and `braid node`.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::PermissionsExt;

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
    if let Some(w) = exposed_file_warning(out.as_fd()) {
        eprintln!("{w}");
    }
    writeln!(out.lock(), "{}", keys::encode(&k))?;
    Ok(())
}

/// A warning if `fd` is a regular file that group or others may read (the rule
/// `braid_io::keys` applies to key files), naming it when /proc knows its path.
fn exposed_file_warning(fd: BorrowedFd<'_>) -> Option<String> {
    let meta = std::fs::File::from(fd.try_clone_to_owned().ok()?)
        .metadata()
        .ok()?;
    let mode = meta.permissions().mode() & 0o777;
    if !meta.is_file() || mode & 0o077 == 0 {
        return None;
    }
    let name = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "FILE".into());
    Some(format!(
        "braid: warning: writing the key to {name}, which group or others can read (mode {mode:o}); \
         braid refuses such a key file. Run: chmod 600 {name} (or set `umask 077` before \
         `braid genkey > FILE`)"
    ))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a regular file that group or others can read draws the warning, and the
    /// warning names it; a private file, a pipe or a terminal do not.
    #[test]
    fn genkey_warns_when_its_output_file_is_readable_by_others() {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = std::env::temp_dir().join(format!("braid-genkey-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let open = |name: &str, mode: u32| {
            let p = dir.join(name);
            let _ = std::fs::remove_file(&p);
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .open(&p)
                .unwrap();
            // Whatever the umask, the mode asked for.
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            (p, f)
        };
        for mode in [0o644, 0o640, 0o604] {
            let (p, f) = open("open.key", mode);
            let w = exposed_file_warning(f.as_fd()).expect("a warning");
            assert!(w.contains(&format!("mode {mode:o}")), "{w}");
            assert!(w.contains(&format!("chmod 600 {}", p.display())), "{w}");
        }
        for mode in [0o600, 0o400] {
            let (_, f) = open("private.key", mode);
            assert_eq!(exposed_file_warning(f.as_fd()), None);
        }
        let (r, w) = std::io::pipe().unwrap();
        assert_eq!(exposed_file_warning(w.as_fd()), None);
        drop(r);
        let _ = std::fs::remove_dir_all(dir);
    }
}
