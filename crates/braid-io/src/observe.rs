//! Ways to look at a running session from outside: the local control socket read by
//! `braid status`, and a minimal HTTP endpoint: Prometheus metrics, the JSON snapshot
//! and a live status page.
//!
//! Control protocol (Unix stream socket): the client writes one line and reads one
//! JSON document until the server closes the connection: `stats` ([`SessionStats`]),
//! `server` (a server's own counters), or `reload` (re-read the configuration file as
//! on SIGHUP, where the tunnel was started from one: `{"ok":"what changed"}` or
//! `{"error":"why"}`).

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::task::JoinHandle;
use tracing::debug;

use crate::session::StatsHandle;
use crate::stats::SessionStats;

/// The longest control request line, in bytes.
const MAX_REQUEST: u64 = 256;

/// How a control connection asks the running tunnel to re-read its configuration
/// file: the reply says what changed, or why not.
pub type Reloader = tokio::sync::mpsc::Sender<tokio::sync::oneshot::Sender<Result<String, String>>>;

/// How long a `reload` may take before the control socket answers that it did not.
const RELOAD_WAIT: Duration = Duration::from_secs(10);

/// A running control socket; the socket file is removed when this is dropped.
pub struct ControlServer {
    path: PathBuf,
    task: JoinHandle<()>,
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The control socket's answer to one command line.
async fn answer(command: &str, stats: &StatsHandle, reload: Option<&Reloader>) -> String {
    match command {
        "reload" => {
            let json = |k: &str, m: &str| serde_json::json!({ k: m }).to_string();
            let Some(r) = reload else {
                return json(
                    "error",
                    "this process does not reload (only `braid tunnel --config FILE` does)",
                );
            };
            let (tx, rx) = tokio::sync::oneshot::channel();
            if r.send(tx).await.is_err() {
                return json("error", "the tunnel is stopping");
            }
            match tokio::time::timeout(RELOAD_WAIT, rx).await {
                Ok(Ok(Ok(m))) => json("ok", &m),
                Ok(Ok(Err(m))) => json("error", &m),
                Ok(Err(_)) => json("error", "the tunnel is stopping"),
                Err(_) => json("error", "the reload did not finish within 10 s"),
            }
        }
        "stats" => match stats.get().await {
            Ok(s) => serde_json::to_string(&s).unwrap_or_default(),
            Err(e) => format!("{{\"error\":\"{e}\"}}"),
        },
        // A server's own counters only (`stats` asks every peer's session).
        "server" => match stats.server_counters() {
            Some(c) => serde_json::to_string(&c).unwrap_or_default(),
            None => "{\"error\":\"not a server\"}".into(),
        },
        other => format!(
            "{{\"error\":\"unknown command '{}'\"}}",
            other.escape_default()
        ),
    }
}

/// Serve `stats` requests (and, on a server, `server`: its own counters only) on a Unix
/// socket at `path`.
pub fn serve_control(path: &Path, stats: StatsHandle) -> io::Result<ControlServer> {
    serve_control_with(path, stats, None)
}

/// [`serve_control`], and `reload` requests through `reload`.
pub fn serve_control_with(
    path: &Path,
    stats: StatsHandle,
    reload: Option<Reloader>,
) -> io::Result<ControlServer> {
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir)?;
        }
    }
    remove_stale_socket(path)?;
    let listener = UnixListener::bind(path)?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((conn, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(answer_control(conn, stats.clone(), reload.clone()));
        }
    });
    Ok(ControlServer {
        path: path.to_path_buf(),
        task,
    })
}

/// Remove a stale socket file at `path` left by a crashed run; refuse (address in
/// use) if something still answers on it.
fn remove_stale_socket(path: &Path) -> io::Result<()> {
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{} is in use by a running braid", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    Ok(())
}

/// One control connection: read its command line (short, within 2 s), answer it
/// with the stats as JSON or an error document, and close.
async fn answer_control(conn: UnixStream, stats: StatsHandle, reload: Option<Reloader>) {
    let (r, mut w) = conn.into_split();
    let mut line = String::new();
    // One short command line: anything longer is not a command, and must not
    // grow memory.
    let read = tokio::time::timeout(
        Duration::from_secs(2),
        BufReader::new(r.take(MAX_REQUEST)).read_line(&mut line),
    )
    .await;
    if !matches!(read, Ok(Ok(n)) if n > 0 && (line.ends_with('\n') || (n as u64) < MAX_REQUEST)) {
        let _ = w
            .write_all(b"{\"error\":\"request too long or incomplete\"}")
            .await;
        let _ = w.shutdown().await;
        return;
    }
    let reply = answer(line.trim(), &stats, reload.as_ref()).await;
    let _ = w.write_all(reply.as_bytes()).await;
    let _ = w.shutdown().await;
}

/// Ask the tunnel behind a control socket to re-read its configuration file: what
/// changed, or why not. `Err(None)`: nothing answers on `path` (no tunnel runs with
/// it); `Err(Some(why))`: it answered that the reload failed, or the socket failed.
pub async fn request_reload(path: &Path) -> Result<String, Option<String>> {
    let mut conn = match UnixStream::connect(path).await {
        Ok(c) => c,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Err(None)
        }
        Err(e) => return Err(Some(format!("cannot connect to {}: {e}", path.display()))),
    };
    let fail = |e: String| Some(format!("{}: {e}", path.display()));
    conn.write_all(b"reload\n")
        .await
        .map_err(|e| fail(e.to_string()))?;
    let mut buf = String::new();
    tokio::time::timeout(
        RELOAD_WAIT + Duration::from_secs(2),
        conn.read_to_string(&mut buf),
    )
    .await
    .map_err(|_| fail("no answer to the reload".into()))?
    .map_err(|e| fail(e.to_string()))?;
    let v: serde_json::Value =
        serde_json::from_str(&buf).map_err(|e| fail(format!("bad answer ({e}): {buf}")))?;
    match (v["ok"].as_str(), v["error"].as_str()) {
        (Some(m), _) => Ok(m.to_string()),
        (_, Some(e)) => Err(Some(e.to_string())),
        _ => Err(fail(format!("bad answer: {buf}"))),
    }
}

/// Ask a control socket for stats.
pub async fn query_control(path: &Path) -> Result<SessionStats, String> {
    let mut conn = UnixStream::connect(path).await.map_err(|e| {
        format!(
            "cannot connect to {}: {e} (is a braid tunnel or bench running with this control socket?)",
            path.display()
        )
    })?;
    conn.write_all(b"stats\n")
        .await
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut buf = String::new();
    tokio::time::timeout(Duration::from_secs(5), conn.read_to_string(&mut buf))
        .await
        .map_err(|_| format!("{}: no answer within 5 s", path.display()))?
        .map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&buf).map_err(|e| format!("{}: bad answer ({e}): {buf}", path.display()))
}

/// The live status page served at `/`: it polls `/stats.json` and draws the last five
/// minutes per channel (rate, RTT, loss, weight, state) and the events; self-contained.
const STATUS_PAGE: &str = include_str!("status_page.html");

/// Serve the Prometheus text format at `http://ADDR/metrics`, the snapshot `braid status
/// --json` prints at `/stats.json`, and a live status page at `/`. Returns the bound
/// address (useful with port 0) and the task.
pub async fn serve_metrics(
    addr: SocketAddr,
    stats: StatsHandle,
) -> io::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((conn, peer)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(answer_http(conn, peer, stats.clone()));
        }
    });
    Ok((local, task))
}

/// One HTTP connection: read the request head (within 2 s, at most about 8 KiB),
/// answer its request line, and close.
async fn answer_http(mut conn: TcpStream, peer: SocketAddr, stats: StatsHandle) {
    let Some(req) = read_head(&mut conn).await else {
        debug!(%peer, "metrics: incomplete request");
        return;
    };
    let first = String::from_utf8_lossy(&req);
    let first = first.lines().next().unwrap_or("");
    let mut parts = first.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, body, ctype) = http_reply(method, target, &stats).await;
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = conn.write_all(resp.as_bytes()).await;
    let _ = conn.shutdown().await;
}

/// An HTTP request's head (up to its blank line, or past 8 KiB), or `None` if the
/// connection closed or failed first or it took over 2 s.
async fn read_head(conn: &mut TcpStream) -> Option<Vec<u8>> {
    let mut req = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let head = tokio::time::timeout(Duration::from_secs(2), async {
        while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 8192 {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => req.extend_from_slice(&buf[..n]),
            }
        }
        true
    })
    .await;
    matches!(head, Ok(true)).then_some(req)
}

/// The status line, body and content type answering `method` `target`: the metrics,
/// the JSON snapshot, the status page, or an error.
async fn http_reply(
    method: &str,
    target: &str,
    stats: &StatsHandle,
) -> (&'static str, String, &'static str) {
    if method != "GET" {
        (
            "405 Method Not Allowed",
            "only GET\n".to_string(),
            "text/plain",
        )
    } else if target == "/metrics" {
        match stats.get().await {
            Ok(s) => ("200 OK", s.prometheus(), "text/plain; version=0.0.4"),
            Err(e) => ("503 Service Unavailable", format!("{e}\n"), "text/plain"),
        }
    } else if target == "/stats.json" {
        match stats.get().await {
            Ok(s) => (
                "200 OK",
                serde_json::to_string(&s).unwrap_or_default(),
                "application/json",
            ),
            Err(e) => ("503 Service Unavailable", format!("{e}\n"), "text/plain"),
        }
    } else if target == "/" {
        (
            "200 OK",
            STATUS_PAGE.to_string(),
            "text/html; charset=utf-8",
        )
    } else {
        (
            "404 Not Found",
            "try / (the status page), /metrics or /stats.json\n".to_string(),
            "text/plain",
        )
    }
}
