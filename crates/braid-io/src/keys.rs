//! Key material: generating keys, reading them from files and configuration, and the
//! rules a key must meet.
//!
//! A braid key (pre-shared or private) is 32 random bytes. In text it is written as
//! base64 (44 characters, what `braid genkey` prints, as WireGuard writes its keys); a
//! key file may also hold the 32 raw bytes (`head -c 32 /dev/urandom > braid.key`).
//! Passphrases are refused: braid does not stretch them, so they would give far less
//! than 32 bytes of entropy. Key files must not be readable by group or others.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

/// Length of every key.
pub const KEY_LEN: usize = 32;

/// A key that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Not base64 of 32 bytes (or raw bytes in a file).
    #[error("not a key: expected 32 random bytes written as base64 (44 characters, as `braid genkey` prints){0}")]
    Format(&'static str),
    /// Obviously not random.
    #[error("this key is not random ({0}); make one with `braid genkey`")]
    Weak(&'static str),
    /// The key file can be read by others.
    #[error("{path} is readable by group or others (mode {mode:o}); run: chmod 600 {path}")]
    Permissions {
        /// The file.
        path: String,
        /// Its mode bits.
        mode: u32,
    },
    /// The key file cannot be read.
    #[error("cannot read {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// The OS error.
        reason: String,
    },
}

/// 32 fresh random bytes from the operating system.
pub fn generate() -> Result<[u8; KEY_LEN], getrandom::Error> {
    let mut k = [0u8; KEY_LEN];
    getrandom::fill(&mut k)?;
    Ok(k)
}

/// The base64 text of a key.
pub fn encode(key: &[u8; KEY_LEN]) -> String {
    STANDARD.encode(key)
}

/// Reject keys no generator would produce: all one byte, or a short repeating pattern.
fn check_random(k: &[u8; KEY_LEN]) -> Result<(), KeyError> {
    if k.iter().all(|&b| b == k[0]) {
        return Err(KeyError::Weak("every byte is the same"));
    }
    for period in [2usize, 4, 8, 16] {
        if k.chunks(period).all(|c| c == &k[..period]) {
            return Err(KeyError::Weak("a short pattern repeated"));
        }
    }
    let distinct = {
        let mut seen = [false; 256];
        k.iter().for_each(|&b| seen[b as usize] = true);
        seen.iter().filter(|&&s| s).count()
    };
    if distinct < 12 {
        return Err(KeyError::Weak("too few distinct bytes"));
    }
    Ok(())
}

/// Parse a key written as base64 text.
pub fn decode(text: &str) -> Result<[u8; KEY_LEN], KeyError> {
    let t = text.trim();
    let v = STANDARD
        .decode(t)
        .map_err(|_| KeyError::Format(" (this is not base64; passphrases are not accepted)"))?;
    let k: [u8; KEY_LEN] = v
        .try_into()
        .map_err(|_| KeyError::Format(" (base64 of the wrong length)"))?;
    check_random(&k)?;
    Ok(k)
}

/// Read a key file: base64 text or 32 raw bytes, not readable by group or others.
pub fn read_file(path: &Path) -> Result<[u8; KEY_LEN], KeyError> {
    let shown = path.display().to_string();
    let read_err = |e: std::io::Error| KeyError::Read {
        path: shown.clone(),
        reason: e.to_string(),
    };
    let meta = std::fs::metadata(path).map_err(read_err)?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyError::Permissions { path: shown, mode });
    }
    let bytes = std::fs::read(path).map_err(read_err)?;
    if bytes.len() == KEY_LEN {
        let k: [u8; KEY_LEN] = bytes.try_into().expect("length checked");
        // 32 bytes of text would be a passphrase (or a truncated base64 key).
        if k.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
            return Err(KeyError::Format(
                " (the file holds 32 characters of text, not a key)",
            ));
        }
        check_random(&k)?;
        return Ok(k);
    }
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| KeyError::Format(" (the file is neither base64 text nor 32 raw bytes)"))?;
    decode(text)
}

/// The public key of a private key (X25519).
pub fn public_key(private: &[u8; KEY_LEN]) -> [u8; KEY_LEN] {
    braid_proto::session::crypto::public_key(private)
}

/// A warning if `fd` is a regular file that group or others may read (the rule
/// [`read_file`] applies to key files), naming it when /proc knows its path.
pub fn exposed_file_warning(fd: std::os::fd::BorrowedFd<'_>) -> Option<String> {
    let meta = std::fs::File::from(fd.try_clone_to_owned().ok()?)
        .metadata()
        .ok()?;
    let mode = meta.permissions().mode() & 0o777;
    if !meta.is_file() || mode & 0o077 == 0 {
        return None;
    }
    let name = std::fs::read_link(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&fd)
    ))
    .map(|p| p.display().to_string())
    .unwrap_or_else(|_| "FILE".into());
    Some(format!(
        "braid: warning: writing the key to {name}, which group or others can read (mode {mode:o}); \
         braid refuses such a key file. Run: chmod 600 {name} (or set `umask 077` before \
         `braid genkey > FILE`)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str, bytes: &[u8], mode: u32) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("braid-keys-{}-{name}", std::process::id()));
        std::fs::write(&p, bytes).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn generated_keys_round_trip_and_are_accepted() {
        let k = generate().unwrap();
        let t = encode(&k);
        assert_eq!(t.len(), 44);
        assert_eq!(decode(&t).unwrap(), k);
        assert_eq!(decode(&format!("  {t}\n")).unwrap(), k);
    }

    #[test]
    fn passphrases_short_and_patterned_keys_are_refused() {
        for bad in [
            "change me: a long shared secret, 32+ bytes",
            "correct horse battery staple",
            "c2hvcnQ=",
        ] {
            assert!(matches!(decode(bad), Err(KeyError::Format(_))), "{bad}");
        }
        assert!(matches!(decode(&encode(&[7; 32])), Err(KeyError::Weak(_))));
        let mut pattern = [0u8; 32];
        pattern
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = (i % 4) as u8);
        assert!(matches!(decode(&encode(&pattern)), Err(KeyError::Weak(_))));
    }

    #[test]
    fn key_files_are_bytes_base64_or_raw_and_private() {
        let k = generate().unwrap();
        let p = tmp("b64", format!("{}\n", encode(&k)).as_bytes(), 0o600);
        assert_eq!(read_file(&p).unwrap(), k);
        let raw = tmp("raw", &k, 0o400);
        assert_eq!(read_file(&raw).unwrap(), k);
        let open = tmp("open", encode(&k).as_bytes(), 0o644);
        let e = read_file(&open).unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{e}");
        let text = tmp("text", b"thirty-two characters of text!!", 0o600);
        assert!(read_file(&text).is_err());
        let latin1 = tmp("latin1", &[0xE9; 40], 0o600);
        assert!(read_file(&latin1).is_err());
        for p in [p, raw, open, text, latin1] {
            let _ = std::fs::remove_file(p);
        }
    }

    /// Only a regular file that group or others can read draws the warning, and the
    /// warning names it; a private file, a pipe or a terminal do not.
    #[test]
    fn genkey_warns_when_its_output_file_is_readable_by_others() {
        use std::os::fd::AsFd;
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
