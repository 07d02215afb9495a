//! The download row (`lab bench --download BYTES`): how long one TCP connection takes,
//! from its SYN to its last byte, to fetch BYTES from the server's namespace: over each
//! link alone (the best of them is the bar), through the tunnel in each mode, and over
//! MPTCP. A short transfer is where a connection's slow start at the path's round trip
//! shows, and where TCP carried as streams (which starts at the bond's rate) helps most.

use std::process::{Child, Stdio};
use std::time::Duration;

use super::{ns_cmd, output, NS_CLIENT, NS_SERVER};
use crate::topo::LabError;

/// The plain server's port (the links alone and the tunnel).
pub const PORT: u16 = 5300;
/// The MPTCP server's port (started under `mptcpize` once MPTCP is on).
pub const MPTCP_PORT: u16 = 5301;

/// The server: for each connection, `argv[2]` bytes, then its half of the close.
/// Dual-stack, so the links' IPv6 addresses reach it too.
const SERVER: &str = r#"
import socket, sys
n = int(sys.argv[2]); chunk = b"\0" * 65536
l = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
l.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("::", int(sys.argv[1]))); l.listen(16)
while True:
    c, _ = l.accept()
    left = n
    try:
        while left > 0:
            left -= c.send(chunk[:min(left, len(chunk))])
        c.shutdown(socket.SHUT_WR)
        while c.recv(65536): pass
    except OSError: pass
    c.close()
"#;

/// The client: connect to `argv[1]`:`argv[2]` (from `argv[4]` if given), read to the
/// end; print the bytes and the seconds from before the SYN to the last byte.
const CLIENT: &str = r#"
import socket, sys, time
dst, port, want = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
src = (sys.argv[4], 0) if len(sys.argv) > 4 else None
t0 = time.monotonic()
s = socket.create_connection((dst, port), timeout=60, source_address=src)
got = 0
while True:
    b = s.recv(1 << 20)
    if not b: break
    got += len(b)
dt = time.monotonic() - t0
s.close()
print(got, dt)
"#;

/// A python script serving in the server's namespace; stopped when dropped.
pub struct Server(Child);

impl Server {
    /// Serve `bytes` per connection on `port`, under `prefix` (e.g. `mptcpize run`).
    pub fn start(prefix: &[&str], port: u16, bytes: u64) -> Result<Server, LabError> {
        let (p, n) = (port.to_string(), bytes.to_string());
        Server::python(prefix, SERVER, &[&p, &n], "the download server")
    }

    /// Run `script` with `args` under `prefix` in the server's namespace (`what` names
    /// it in an error), and give it 300 ms to listen.
    pub fn python(
        prefix: &[&str],
        script: &str,
        args: &[&str],
        what: &str,
    ) -> Result<Server, LabError> {
        let mut argv: Vec<&str> = prefix.to_vec();
        argv.extend(["python3", "-c", script]);
        argv.extend(args);
        let child = ns_cmd(NS_SERVER, &argv)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| LabError::Command {
                cmd: what.into(),
                reason: e.to_string(),
            })?;
        std::thread::sleep(Duration::from_millis(300));
        Ok(Server(child))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Seconds to download `bytes` from `dst`:`port` (from `src`, if given), under
/// `prefix`; an error if fewer bytes arrived.
pub fn time(
    prefix: &[&str],
    dst: &str,
    port: u16,
    src: Option<&str>,
    bytes: u64,
) -> Result<f64, LabError> {
    let what = "the download client";
    let (p, n) = (port.to_string(), bytes.to_string());
    let mut args: Vec<&str> = vec!["timeout", "90"];
    args.extend(prefix);
    args.extend(["python3", "-c", CLIENT, dst, &p, &n]);
    args.extend(src);
    let out = output(ns_cmd(NS_CLIENT, &args), what)?;
    let mut f = out.split_whitespace();
    let got: u64 = f.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    let secs: f64 = f.next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
    if got != bytes || secs <= 0.0 {
        return Err(LabError::Command {
            cmd: what.into(),
            reason: format!("{got} bytes of {bytes} arrived ({out:?})"),
        });
    }
    Ok(secs)
}
