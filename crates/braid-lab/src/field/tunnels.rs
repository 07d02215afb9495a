//! The field lab's `braid tunnel`s: keys, the server's and clients' configurations
//! (the tunnel's defaults for everything that is not an address), their processes,
//! and their `braid status`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::net::{self, CLIENTS, NAMES, NS_SERVER, SERVER_V4, SERVER_V6};
use crate::topo::{write_private, LabError};

/// The channels' ports on the server: IPv4, IPv6.
pub const PORTS: [u16; 2] = [7000, 7001];
/// The server's inner (TUN) address.
pub const SERVER_INNER: &str = "10.77.0.1";

/// Client `k`'s inner (TUN) address.
pub fn client_inner(k: usize) -> String {
    format!("10.77.{k}.1")
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> LabError + '_ {
    move |err| LabError::Io {
        path: path.display().to_string(),
        err,
    }
}

fn key_err(e: impl std::fmt::Display) -> LabError {
    LabError::Command {
        cmd: "generating a key".into(),
        reason: e.to_string(),
    }
}

/// Control socket of the server (`k` = 0) or of client `k`.
pub fn control(dir: &Path, k: usize) -> PathBuf {
    dir.join(format!("t{k}.sock"))
}

/// Write a key pair for the server (0) and each client, and each one's configuration.
pub fn write_configs(dir: &Path) -> Result<(), LabError> {
    let mut publics = Vec::new();
    for k in 0..=CLIENTS {
        let key = braid_io::keys::generate().map_err(key_err)?;
        publics.push(braid_io::keys::encode(&braid_io::keys::public_key(&key)));
        let p = dir.join(format!("t{k}.key"));
        write_private(&p, &(braid_io::keys::encode(&key) + "\n")).map_err(io_err(&p))?;
    }
    let p = dir.join("t0.toml");
    write_private(&p, &server_config(dir, &publics)).map_err(io_err(&p))?;
    for k in 1..=CLIENTS {
        let p = dir.join(format!("t{k}.toml"));
        write_private(&p, &client_config(dir, k, &publics[0])).map_err(io_err(&p))?;
    }
    Ok(())
}

/// The server: the channels' fixed ports on its public addresses, one `[[peer]]` per
/// client with the client's inner /24.
fn server_config(dir: &Path, publics: &[String]) -> String {
    let mut s = format!(
        "[tunnel]\nname = \"fldsrv\"\naddress = \"{SERVER_INNER}/16\"\ncontrol = \"{}\"\n\n\
         [session]\nprivate_key_file = \"{}\"\n\n\
         [[channel]]\nname = \"wan4\"\nlocal = \"{SERVER_V4}:{}\"\n\n\
         [[channel]]\nname = \"wan6\"\nlocal = \"[{SERVER_V6}]:{}\"\n",
        control(dir, 0).display(),
        dir.join("t0.key").display(),
        PORTS[0],
        PORTS[1]
    );
    for k in 1..=CLIENTS {
        s += &format!(
            "\n[[peer]]\nname = \"{}\"\npublic_key = \"{}\"\nallowed_ips = [\"10.77.{k}.0/24\"]\n",
            NAMES[k - 1],
            publics[k]
        );
    }
    s
}

/// Client `k`: each channel bound to its uplink (`device` and the uplink's address,
/// any port), naming the server's public address of that family.
fn client_config(dir: &Path, k: usize, server_public: &str) -> String {
    format!(
        "[tunnel]\nname = \"fld{k}\"\naddress = \"{}/16\"\ncontrol = \"{}\"\n\n\
         [session]\nprivate_key_file = \"{}\"\npeer_public_key = \"{server_public}\"\n\n\
         [[channel]]\nname = \"wan4\"\nlocal = \"{}:0\"\nremote = \"{SERVER_V4}:{}\"\ndevice = \"up4\"\n\n\
         [[channel]]\nname = \"wan6\"\nlocal = \"[{}]:0\"\nremote = \"[{SERVER_V6}]:{}\"\ndevice = \"up6\"\n",
        client_inner(k),
        control(dir, k).display(),
        dir.join(format!("t{k}.key")).display(),
        net::client_v4(k),
        PORTS[0],
        net::client_v6(k),
        PORTS[1],
    )
}

/// The namespace of tunnel `k` (0: the server).
fn ns_of(k: usize) -> String {
    if k == 0 {
        NS_SERVER.to_string()
    } else {
        net::ns_client(k)
    }
}

/// A running `braid tunnel` (the server, `k` = 0, or client `k`), its log appended to
/// `t<k>.log` (each start adds to it).
pub struct Tunnel {
    child: Option<Child>,
    k: usize,
}

impl Tunnel {
    /// Start tunnel `k`.
    pub fn start(exe: &Path, dir: &Path, k: usize) -> Result<Tunnel, LabError> {
        let log = dir.join(format!("t{k}.log"));
        let f = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(io_err(&log))?;
        // `ip netns exec` runs the program itself (exec): the child's pid is braid's.
        let child = Command::new("ip")
            .args(["netns", "exec", &ns_of(k)])
            .arg(exe)
            .args(["tunnel", "--peer-timeout", "0s", "--config"])
            .arg(dir.join(format!("t{k}.toml")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(f)
            .spawn()
            .map_err(|e| LabError::Command {
                cmd: format!("{} tunnel (in {})", exe.display(), ns_of(k)),
                reason: e.to_string(),
            })?;
        Ok(Tunnel {
            child: Some(child),
            k,
        })
    }

    /// Stop it with `sig` (SIGTERM: a service restart; SIGKILL: a crash) and wait
    /// for it to go (SIGKILL after 3 s).
    pub fn stop(&mut self, sig: libc::c_int) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        // SAFETY: signalling our own child.
        unsafe { libc::kill(c.id() as i32, sig) };
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = c.kill();
        let _ = c.wait();
    }

    /// Has it exited (a failure: nothing here stops it but [`Tunnel::stop`])?
    pub fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| !matches!(c.try_wait(), Ok(None)))
    }

    /// Which tunnel this is.
    pub fn index(&self) -> usize {
        self.k
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        self.stop(libc::SIGTERM);
    }
}

/// `braid status --json` of the tunnel whose control socket is `ctl`; `None` while it
/// does not answer.
pub fn status(exe: &Path, ctl: &Path) -> Option<Value> {
    let out = Command::new(exe)
        .arg("status")
        .arg("--json")
        .arg("--control")
        .arg(ctl)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// The last lines of tunnel `k`'s log, for an error message.
pub fn log_tail(dir: &Path, k: usize) -> String {
    let text = fs::read_to_string(dir.join(format!("t{k}.log"))).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}
