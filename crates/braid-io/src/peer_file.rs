//! `braid peer add` and `braid peer remove`: one `[[peer]]` section added to or removed
//! from a server's configuration file, the rest of the file (comments, order, layout)
//! kept as it is (`toml_edit`), checked before anything is written, and written
//! atomically. The running server then re-reads the file (`reload` on its control
//! socket, as SIGHUP), so the change is in force at once and survives a restart.

use std::io::Write;
use std::path::Path;

use toml_edit::{Array, ArrayOfTables, DocumentMut, Item, Table};

use crate::config::{parse_prefix, PeerConfig};
use crate::{keys, FileConfig};

/// The peers of the server whose file is `path` with text `text`: its `[[peer]]`
/// sections, or why the file is no server's (or does not load).
fn server_peers(path: &Path, text: &str) -> Result<Vec<PeerConfig>, String> {
    let fc = FileConfig::parse(&path.display().to_string(), text, path.parent())
        .map_err(|e| format!("{e} (fix the file first)"))?;
    if fc.peers.is_empty() {
        return Err(format!(
            "{} has no [[peer]] sections: it is a point-to-point tunnel, not a server (a server's file has at least one [[peer]]; turning a tunnel into a server needs a restart)",
            path.display()
        ));
    }
    Ok(fc.peers)
}

/// The `[[peer]]` array of tables of `doc`.
fn peer_tables<'a>(doc: &'a mut DocumentMut, path: &Path) -> Result<&'a mut ArrayOfTables, String> {
    doc.get_mut("peer")
        .and_then(Item::as_array_of_tables_mut)
        .ok_or_else(|| {
            format!(
                "{}: the peers are not written as [[peer]] sections; edit the file by hand",
                path.display()
            )
        })
}

/// The file's text with one more `[[peer]]`: `name`, `public_key` (base64, as `braid
/// pubkey` prints it) and `allowed_ips`. Refused, saying why, for a name or key that
/// another peer has, a bad key, a bad or taken prefix, or a file that is no server's.
pub fn add(
    path: &Path,
    text: &str,
    name: &str,
    public_key: &str,
    allowed_ips: &[String],
) -> Result<String, String> {
    let peers = server_peers(path, text)?;
    let file = path.display();
    if let Some(p) = peers.iter().find(|p| p.name == name) {
        return Err(format!(
            "{file} already has a peer named '{}': remove it first (braid peer remove) or choose another name",
            p.name
        ));
    }
    let key = keys::decode(public_key).map_err(|e| format!("--public-key: {e}"))?;
    if let Some(p) = peers.iter().find(|p| p.public_key == key) {
        return Err(format!(
            "--public-key: {public_key} is already the key of peer '{}' in {file}: each peer has its own key",
            p.name
        ));
    }
    if allowed_ips.is_empty() {
        return Err("--allowed-ips: at least one prefix: the peer's inner addresses".into());
    }
    let mut nets = Vec::new();
    for a in allowed_ips {
        let net = parse_prefix(a.trim()).map_err(|e| format!("--allowed-ips: {e}"))?;
        if let Some(p) = peers.iter().find(|p| p.allowed_ips.contains(&net)) {
            return Err(format!(
                "--allowed-ips: {net} is already peer '{}''s: a prefix belongs to one peer",
                p.name
            ));
        }
        nets.push(net);
    }
    let mut doc: DocumentMut = text.parse().map_err(|e| format!("{file}: not TOML: {e}"))?;
    let mut t = Table::new();
    t["name"] = toml_edit::value(name);
    t["public_key"] = toml_edit::value(keys::encode(&key));
    let mut ips = Array::new();
    for n in &nets {
        ips.push(n.to_string());
    }
    t["allowed_ips"] = toml_edit::value(ips);
    peer_tables(&mut doc, path)?.push(t);
    let out = doc.to_string();
    // Everything else the file says must hold too (the name's form, say).
    FileConfig::parse(&file.to_string(), &out, path.parent())
        .map_err(|e| format!("the peer was not added: {e}"))?;
    Ok(out)
}

/// The file's text without the peer named `which` (or whose public key it is), and
/// that peer's name. Refused for an unknown peer, the last one, or a file that is no
/// server's.
pub fn remove(path: &Path, text: &str, which: &str) -> Result<(String, String), String> {
    let peers = server_peers(path, text)?;
    let file = path.display();
    let key = keys::decode(which).ok();
    let Some(i) = peers
        .iter()
        .position(|p| p.name == which || Some(p.public_key) == key)
    else {
        let names: Vec<&str> = peers.iter().map(|p| p.name.as_str()).collect();
        return Err(format!(
            "{file} has no peer named '{which}' (nor with that public key); its peers: {}",
            names.join(", ")
        ));
    };
    if peers.len() == 1 {
        return Err(format!(
            "'{}' is the last peer of {file}: a file without [[peer]] sections is a point-to-point tunnel, and a server cannot become one without a restart; edit the file by hand if that is meant",
            peers[i].name
        ));
    }
    let mut doc: DocumentMut = text.parse().map_err(|e| format!("{file}: not TOML: {e}"))?;
    let tables = peer_tables(&mut doc, path)?;
    if tables.len() != peers.len() {
        return Err(format!(
            "{file}: its [[peer]] sections do not match the peers it loads; edit the file by hand"
        ));
    }
    tables.remove(i);
    let out = doc.to_string();
    FileConfig::parse(&file.to_string(), &out, path.parent())
        .map_err(|e| format!("the peer was not removed: {e}"))?;
    Ok((out, peers[i].name.clone()))
}

/// Replace the file at `path` with `text` at once (a new file renamed over it, with the
/// old one's permissions: it may name key files or hold keys). A symbolic link is
/// followed: the file it names is replaced and the link stays (a config kept under
/// version control elsewhere and linked into /etc/braid, say).
pub fn write(path: &Path, text: &str) -> std::io::Result<()> {
    let path = std::fs::canonicalize(path)?;
    let dir = path.parent().unwrap_or(Path::new("/"));
    let perms = std::fs::metadata(&path)?.permissions();
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(text.as_bytes())?;
    tmp.as_file().sync_all()?;
    std::fs::set_permissions(tmp.path(), perms)?;
    tmp.persist(&path).map_err(|e| e.error)?;
    Ok(())
}

/// An exclusive lock on the directory of a configuration file, held while one
/// `braid peer` command reads, edits and writes it, so that two commands at once (a
/// provisioning script adding several sites in parallel) both land instead of the
/// second overwriting the first. The directory is locked, not the file, because the
/// file is replaced by a new one on every write. Released when dropped.
pub struct Lock {
    _dir: std::fs::File,
}

/// Wait for the [`Lock`] of the configuration file at `path`.
pub fn lock(path: &Path) -> std::io::Result<Lock> {
    use std::os::fd::AsRawFd;
    let path = std::fs::canonicalize(path)?;
    let dir = std::fs::File::open(path.parent().unwrap_or(Path::new("/")))?;
    loop {
        // SAFETY: flock on a descriptor this function owns; no memory is passed.
        if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(Lock { _dir: dir });
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn public(n: u8) -> String {
        keys::encode(&keys::public_key(&[n; 32]))
    }

    /// A server's file in a directory with its key file.
    fn server() -> (tempfile::TempDir, std::path::PathBuf, String) {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("s.key");
        std::fs::write(&key, keys::encode(&keys::generate().unwrap())).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let text = format!(
            "# the server\n[tunnel]\nname = \"srv\"\n\n[session]\nprivate_key_file = \"s.key\"\n\n[[channel]]\nlocal = \"0.0.0.0:7100\"\n\n# site A, on the LTE router\n[[peer]]\nname = \"site-a\"\npublic_key = \"{}\"\nallowed_ips = [\"10.1.0.0/16\"]\n",
            public(1)
        );
        let path = dir.path().join("server.toml");
        (dir, path, text)
    }

    fn ips(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn peers(path: &Path, text: &str) -> Vec<PeerConfig> {
        FileConfig::parse("t", text, path.parent()).unwrap().peers
    }

    #[test]
    fn a_peer_is_added_and_removed_and_the_rest_of_the_file_is_kept() {
        let (_dir, path, text) = server();
        let path = path.as_path();
        let two = ips(&["10.2.0.0/16", "fd00:2::/64"]);
        let added = add(path, &text, "site-b", &public(2), &two).unwrap();
        assert!(added.starts_with(&text), "{added}");
        let p = peers(path, &added);
        assert_eq!(p.len(), 2);
        assert_eq!(p[1].name, "site-b");
        assert_eq!(p[1].allowed_ips.len(), 2);
        // By name, or by key.
        let (back, name) = remove(path, &added, "site-b").unwrap();
        assert_eq!(name, "site-b");
        assert_eq!(back, text);
        let (rest, name) = remove(path, &added, &public(1)).unwrap();
        assert_eq!(name, "site-a");
        assert!(rest.contains("# the server"), "{rest}");
        assert_eq!(peers(path, &rest)[0].name, "site-b");
    }

    #[test]
    fn the_file_is_replaced_with_its_permissions() {
        use std::os::unix::fs::PermissionsExt;
        let (_dir, path, text) = server();
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        write(&path, &text).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o640);
    }

    #[test]
    fn a_linked_file_is_written_through_its_link() {
        let (dir, path, text) = server();
        std::fs::write(&path, "old").unwrap();
        let link = dir.path().join("link.toml");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        write(&link, &text).unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    }

    #[test]
    fn a_second_command_waits_for_the_first_ones_lock() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let (_dir, path, text) = server();
        std::fs::write(&path, &text).unwrap();
        let first = lock(&path).unwrap();
        let got = std::sync::Arc::new(AtomicBool::new(false));
        let second = {
            let (path, got) = (path.clone(), got.clone());
            std::thread::spawn(move || {
                let _l = lock(&path).unwrap();
                got.store(true, Ordering::SeqCst);
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(150));
        assert!(
            !got.load(Ordering::SeqCst),
            "the second lock was taken while the first was held"
        );
        drop(first);
        second.join().unwrap();
        assert!(got.load(Ordering::SeqCst));
    }

    #[test]
    fn bad_additions_and_removals_say_why() {
        let (_dir, path, text) = server();
        let path = path.as_path();
        let b = ips(&["10.2.0.0/16"]);
        let e = add(path, &text, "site-a", &public(2), &b).unwrap_err();
        assert!(e.contains("already has a peer named 'site-a'"), "{e}");
        let e = add(path, &text, "site-b", &public(1), &b).unwrap_err();
        assert!(e.contains("already the key of peer 'site-a'"), "{e}");
        let e = add(path, &text, "site-b", "not a key", &b).unwrap_err();
        assert!(e.starts_with("--public-key: "), "{e}");
        let e = add(path, &text, "site-b", &public(2), &ips(&["10.2.0.300/16"])).unwrap_err();
        assert!(
            e.starts_with("--allowed-ips: ") && e.contains("10.2.0.300/16"),
            "{e}"
        );
        let e = add(path, &text, "site-b", &public(2), &ips(&["10.2.0.1/16"])).unwrap_err();
        assert!(e.contains("did you mean 10.2.0.0/16"), "{e}");
        let e = add(path, &text, "site-b", &public(2), &ips(&["10.1.0.0/16"])).unwrap_err();
        assert!(e.contains("already peer 'site-a''s"), "{e}");
        let e = add(path, &text, "site-b", &public(2), &[]).unwrap_err();
        assert!(e.contains("at least one prefix"), "{e}");
        let e = add(path, &text, "", &public(2), &b).unwrap_err();
        assert!(e.contains("peer[1].name"), "{e}");
        let e = remove(path, &text, "site-z").unwrap_err();
        assert!(
            e.contains("no peer named 'site-z'") && e.contains("site-a"),
            "{e}"
        );
        let e = remove(path, &text, "site-a").unwrap_err();
        assert!(e.contains("last peer"), "{e}");
        // A point-to-point tunnel's file.
        let p2p = text
            .split("# site A")
            .next()
            .unwrap()
            .replace(
                "0.0.0.0:7100\"",
                "0.0.0.0:7100\"\nremote = \"192.0.2.1:7100\"",
            )
            .replace(
                "private_key_file",
                &format!("peer_public_key = \"{}\"\nprivate_key_file", public(3)),
            );
        let e = add(path, &p2p, "site-b", &public(2), &b).unwrap_err();
        assert!(e.contains("no [[peer]] sections"), "{e}");
    }
}
