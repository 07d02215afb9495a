//! The idle-connections row (`lab bench --idle N`): N TCP connections opened through the
//! tunnel and left open without traffic, and what they cost the tunnel's two ends in
//! memory (each end's resident set, read from `/proc`, before and while they are open).
//! With TCP carried as streams, each of them is a terminated connection at both ends
//! and a stream of the session.

use std::io::{BufRead, BufReader};
use std::process::{ChildStdout, Stdio};
use std::time::{Duration, Instant};

use super::download::Server;
use super::{ns_cmd, NS_CLIENT};
use crate::topo::LabError;

/// The idle server's port.
pub const PORT: u16 = 5302;

/// The server: accept every connection and keep it open, reading what comes (nothing).
const SERVER: &str = r#"
import resource, selectors, socket, sys
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
l = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
l.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("::", int(sys.argv[1]))); l.listen(4096); l.setblocking(False)
sel = selectors.DefaultSelector(); sel.register(l, selectors.EVENT_READ)
while True:
    for k, _ in sel.select():
        if k.fileobj is l:
            try:
                c, _ = l.accept(); c.setblocking(False); sel.register(c, selectors.EVENT_READ)
            except OSError: pass
        elif not k.fileobj.recv(65536):
            sel.unregister(k.fileobj); k.fileobj.close()
"#;

/// The client: open `argv[3]` connections to `argv[1]`:`argv[2]`, at most 256 being
/// made at once (fewer if its open-files limit, raised to the hard limit, runs out);
/// print how many were made and the seconds it took; then hold them until its
/// standard input closes.
const CLIENT: &str = r#"
import resource, selectors, socket, sys, time
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
dst, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sel = selectors.DefaultSelector(); made = []; pending = 0; started = 0; failed = 0
t0 = time.monotonic()
while len(made) + failed < n and time.monotonic() - t0 < 120:
    while pending < 256 and started < n:
        try: s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        except OSError: n = started; break
        s.setblocking(False); s.connect_ex((dst, port)); sel.register(s, selectors.EVENT_WRITE)
        pending += 1; started += 1
    for k, _ in sel.select(timeout=1):
        s = k.fileobj; sel.unregister(s); pending -= 1
        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0: made.append(s)
        else: failed += 1; s.close()
print(len(made), time.monotonic() - t0, flush=True)
sys.stdin.read()
"#;

/// Start the server, in the server's namespace (stopped when dropped): accept and hold
/// connections on [`PORT`].
pub fn start_server() -> Result<Server, LabError> {
    Server::python(&[], SERVER, &[&PORT.to_string()], "the idle server")
}

/// What N idle connections cost.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Idle {
    /// Connections made (of those asked for).
    pub made: u64,
    /// Seconds to make them.
    pub open_s: f64,
    /// Resident set of each end (client's, server's) before, bytes.
    pub rss_before: [u64; 2],
    /// And while the connections are open, bytes.
    pub rss_open: [u64; 2],
}

impl Idle {
    /// The larger of the two ends' growth, bytes.
    pub fn growth(&self) -> u64 {
        (0..2)
            .map(|i| self.rss_open[i].saturating_sub(self.rss_before[i]))
            .max()
            .unwrap_or(0)
    }
}

/// A process's resident set, bytes (`VmRSS` of `/proc/PID/status`).
pub fn rss(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Open `n` connections to `dst` through the tunnel whose ends run as `pids` (client's,
/// server's), hold them while both ends' resident sets are read (after `settle`), then
/// close them.
pub fn measure(dst: &str, n: usize, pids: [u32; 2], settle: Duration) -> Result<Idle, LabError> {
    let what = "the idle client";
    let fail = |reason: String| LabError::Command {
        cmd: what.into(),
        reason,
    };
    let rss_of = |pid| rss(pid).ok_or_else(|| fail(format!("no resident set for {pid}")));
    let rss_before = [rss_of(pids[0])?, rss_of(pids[1])?];
    let (port, count) = (PORT.to_string(), n.to_string());
    let mut child = ns_cmd(NS_CLIENT, &["python3", "-c", CLIENT, dst, &port, &count])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| fail(e.to_string()))?;
    let result = read_made(child.stdout.take(), &fail).and_then(|(made, open_s)| {
        std::thread::sleep(settle);
        Ok(Idle {
            made,
            open_s,
            rss_before,
            rss_open: [rss_of(pids[0])?, rss_of(pids[1])?],
        })
    });
    // Closing its input lets the client end and close every connection.
    drop(child.stdin.take());
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return result;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// The client's report: connections made, seconds.
fn read_made(
    out: Option<ChildStdout>,
    fail: &dyn Fn(String) -> LabError,
) -> Result<(u64, f64), LabError> {
    let out = out.ok_or_else(|| fail("no output".into()))?;
    let mut line = String::new();
    BufReader::new(out)
        .read_line(&mut line)
        .map_err(|e| fail(e.to_string()))?;
    let mut f = line.split_whitespace();
    match (
        f.next().and_then(|v| v.parse().ok()),
        f.next().and_then(|v| v.parse().ok()),
    ) {
        (Some(made), Some(secs)) => Ok((made, secs)),
        _ => Err(fail(format!("unexpected output {line:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_resident_set_is_read() {
        let r = rss(std::process::id()).unwrap();
        assert!(r > 1 << 20, "{r}");
        assert_eq!(rss(u32::MAX), None);
    }

    #[test]
    fn growth_is_the_larger_ends() {
        let i = Idle {
            rss_before: [100, 200],
            rss_open: [150, 180],
            ..Idle::default()
        };
        assert_eq!(i.growth(), 50);
    }
}
