//! The live status page at the metrics address, loaded in a real headless browser
//! (Chromium) while traffic crosses a tunnel between two ends in a network namespace:
//! the page has polled several times, its charts move, and its numbers agree with
//! `braid status --json`. `BRAID_SCREENSHOT=1` also writes docs/status-page.png. Needs
//! root, /dev/net/tun, `ip`, bash and chromium; skips, saying why, without them.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::{status, Lab, BIN};

fn skip_reason() -> Option<String> {
    if let Some(why) = common::netns_skip_reason(
        "a network namespace and TUN devices",
        &[("ip", "iproute2"), ("bash", "bash")],
        None,
    ) {
        return Some(why);
    }
    browser()
        .is_none()
        .then(|| "chromium is not installed (apt-get install chromium)".into())
}

/// A headless Chromium driven over the DevTools protocol on a pipe (fds 3 and 4,
/// `--remote-debugging-pipe`): JSON messages ended by a NUL byte.
struct Cdp {
    child: Child,
    to: std::fs::File,
    from: std::sync::mpsc::Receiver<Value>,
    next: u64,
}

impl Cdp {
    fn start(ns: &str, profile: &Path) -> Cdp {
        use std::os::fd::FromRawFd;
        use std::os::unix::process::CommandExt;
        let pipe = || {
            let mut fds = [0; 2];
            // Close-on-exec: the browser gets only the copies dup2 makes on 3 and 4.
            // SAFETY: fds has room for the two descriptors pipe2 writes.
            assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
            fds
        };
        let (cmd_r, cmd_w) = {
            let p = pipe();
            (p[0], p[1])
        };
        let (out_r, out_w) = {
            let p = pipe();
            (p[0], p[1])
        };
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, browser().unwrap()])
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
            ])
            .args(["--remote-debugging-pipe", "about:blank"])
            .arg(format!("--user-data-dir={}", profile.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: between fork and exec only fcntl, dup2 and close, which are
        // async-signal-safe. Copies above 10 first: a pipe end may itself be 3 or 4.
        unsafe {
            c.pre_exec(move || {
                let a = libc::fcntl(cmd_r, libc::F_DUPFD, 10);
                let b = libc::fcntl(out_w, libc::F_DUPFD, 10);
                if a < 0 || b < 0 || libc::dup2(a, 3) < 0 || libc::dup2(b, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(a);
                libc::close(b);
                Ok(())
            });
        }
        let child = c.spawn().unwrap();
        // SAFETY: the descriptors are ours and open; each is owned once from here.
        let (to, from_file) = unsafe {
            libc::close(cmd_r);
            libc::close(out_w);
            (
                std::fs::File::from_raw_fd(cmd_w),
                std::fs::File::from_raw_fd(out_r),
            )
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            let mut r = std::io::BufReader::new(from_file);
            loop {
                let mut msg = Vec::new();
                match r.read_until(0, &mut msg) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        msg.pop();
                        if let Ok(v) = serde_json::from_slice::<Value>(&msg) {
                            if tx.send(v).is_err() {
                                return;
                            }
                        }
                    }
                }
            }
        });
        Cdp {
            child,
            to,
            from: rx,
            next: 1,
        }
    }

    /// Call `method` (in `session`, or on the browser) and return its result.
    fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        use std::io::Write;
        let id = self.next;
        self.next += 1;
        let mut msg = serde_json::json!({ "id": id, "method": method, "params": params });
        if let Some(s) = session {
            msg["sessionId"] = s.into();
        }
        let mut bytes = msg.to_string().into_bytes();
        bytes.push(0);
        self.to.write_all(&bytes).unwrap();
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let v = self
                .from
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("{method}: no answer from chromium"));
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// Ask the browser to quit, and wait a little for it (Drop kills what is left).
    fn close(mut self) {
        let _ = std::io::Write::write_all(
            &mut self.to,
            b"{\"id\":999999,\"method\":\"Browser.close\"}\0",
        );
        let t0 = Instant::now();
        while self.child.try_wait().ok().flatten().is_none()
            && t0.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Cdp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn browser() -> Option<&'static str> {
    ["chromium", "chromium-browser"]
        .into_iter()
        .find(|b| braid_lab::tools::find(b).is_some())
}

fn config(dev: &str, addr: &str, ctl: &Path, ports: [u16; 2], peer: [u16; 2]) -> String {
    let mut s = format!(
        "[tunnel]\nname = \"{dev}\"\naddress = \"{addr}\"\ncontrol = \"{}\"\nlog_interval = \"0s\"\n\n\
         [session]\nkey = \"AyHDMTOweHmwGSs7vubt5lmmRKjx62UXkWxeQzJRXms=\"\nheartbeat = \"20ms\"\ndead_after = \"200ms\"\n",
        ctl.display()
    );
    for i in 0..2 {
        s += &format!(
            "\n[[channel]]\nname = \"wan{i}\"\nlocal = \"127.0.0.1:{}\"\nremote = \"127.0.0.1:{}\"\nweight = {}\npace = \"off\"\n",
            ports[i],
            peer[i],
            2 - i
        );
    }
    s
}

/// The value of attribute `attr` in the element that has `id="ID"` in `dom`.
fn attr(dom: &str, id: &str, attr: &str) -> Option<String> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let start = dom[..at].rfind('<')?;
    let tag = &dom[start..start + dom[start..].find('>')?];
    let k = tag.find(&format!(" {attr}=\""))? + attr.len() + 3;
    Some(tag[k..k + tag[k..].find('"')?].to_string())
}

/// The y coordinates of the polyline(s) in the chart with `id`, per series.
fn chart_ys(dom: &str, id: &str) -> Vec<Vec<f64>> {
    let Some(at) = dom.find(&format!("id=\"{id}\"")) else {
        return vec![];
    };
    let body = &dom[at..at + dom[at..].find("</svg>").unwrap()];
    body.split(" points=\"")
        .skip(1)
        .map(|p| {
            p[..p.find('"').unwrap()]
                .split_whitespace()
                .filter_map(|xy| xy.split_once(',').and_then(|(_, y)| y.parse().ok()))
                .collect()
        })
        .collect()
}

#[test]
fn the_status_page_shows_live_charts_that_match_braid_status() {
    if let Some(why) = skip_reason() {
        common::skip(
            "the_status_page_shows_live_charts_that_match_braid_status",
            &why,
        );
        return;
    }
    let id = std::process::id() % 100_000;
    let ns = format!("braid-ops-page{id}");
    let dir = std::env::temp_dir().join(format!("braid-ops-page-{id}"));
    let mut lab = Lab::new(dir.clone());
    lab.add_ns(&ns);
    let (ca, cb) = (dir.join("a.sock"), dir.join("b.sock"));
    let base = 7600 + (id % 100) as u16 * 4;
    let files = [
        (
            "a.toml",
            config(
                "opspa0",
                "10.204.1.1/30",
                &ca,
                [base, base + 1],
                [base + 2, base + 3],
            ),
        ),
        (
            "b.toml",
            config(
                "opspb0",
                "10.204.2.1/30",
                &cb,
                [base + 2, base + 3],
                [base, base + 1],
            ),
        ),
    ];
    for (f, text) in &files {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(dir.join(f), text).unwrap();
        std::fs::set_permissions(dir.join(f), std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let metrics = format!("127.0.0.1:{}", 9600 + id % 300);
    for (f, extra) in [("a.toml", Some(metrics.as_str())), ("b.toml", None)] {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &ns, BIN, "tunnel", "--config"])
            .arg(dir.join(f))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(m) = extra {
            c.args(["--metrics", m]);
        }
        lab.children.push(c.spawn().unwrap());
    }
    let t0 = Instant::now();
    while !status(&ca).is_some_and(|s| s["peer_seen"] == true) {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "tunnel A did not come up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Traffic into A's TUN device: about a second of bursts, then two seconds of quiet,
    // so the rate charts, which the page polls once a second, rise and fall. (Bursts
    // alone, ten a second, average to a flat line at one poll a second.)
    lab.children.push(
        Command::new("ip")
            .args(["netns", "exec", &ns, "bash", "-c"])
            .arg("while :; do for k in $(seq 8); do for i in $(seq 300); do echo payload-payload-payload; done > /dev/udp/10.204.1.2/9; sleep 0.1; done; sleep 2; done")
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_secs(2));

    // The page in a headless Chromium in the namespace, read after it has run for six
    // seconds of real time (DevTools protocol over a pipe).
    let url = format!("http://{metrics}/");
    let mut cdp = Cdp::start(&ns, &dir.join("chromium"));
    let target = cdp.call(
        None,
        "Target.createTarget",
        serde_json::json!({ "url": url }),
    );
    let target = target["targetId"].as_str().unwrap().to_string();
    let session = cdp.call(
        None,
        "Target.attachToTarget",
        serde_json::json!({ "targetId": target, "flatten": true }),
    );
    let session = session["sessionId"].as_str().unwrap().to_string();
    cdp.call(
        Some(&session),
        "Emulation.setDeviceMetricsOverride",
        serde_json::json!({ "width": 1100, "height": 720, "deviceScaleFactor": 1, "mobile": false }),
    );
    // Longer for the screenshot kept in docs/, so its charts have a history.
    let screenshot = std::env::var_os("BRAID_SCREENSHOT").is_some();
    std::thread::sleep(Duration::from_secs(if screenshot { 40 } else { 6 }));
    let dom = cdp.call(
        Some(&session),
        "Runtime.evaluate",
        serde_json::json!({ "expression": "document.documentElement.outerHTML", "returnByValue": true }),
    );
    let dom = dom["result"]["value"].as_str().unwrap().to_string();
    let st = status(&ca).expect("status after the page");
    assert!(dom.contains("<title>braid status</title>"), "{dom}");

    // Polled several times, no error shown.
    let polls: u32 = dom
        .split("data-polls=\"")
        .nth(1)
        .and_then(|s| s[..s.find('"')?].parse().ok())
        .unwrap_or(0);
    assert!(polls >= 3, "polls: {polls}\n{dom}");
    assert!(dom.contains("<div id=\"error\"></div>"), "{dom}");
    // Each channel: its name, state and weight as braid status says; its counter no
    // ahead of the later status; the rate chart moves (points at different heights).
    for i in 0..2 {
        let ch = &st["channels"][i];
        let row = format!("ch{i}");
        assert_eq!(
            attr(&dom, &row, "data-name").as_deref(),
            ch["name"].as_str(),
            "{dom}"
        );
        assert_eq!(
            attr(&dom, &row, "data-state").as_deref(),
            ch["state"].as_str()
        );
        assert_eq!(
            attr(&dom, &row, "data-weight"),
            Some(ch["weight"].to_string())
        );
        let shown: u64 = attr(&dom, &row, "data-tx-packets")
            .unwrap()
            .parse()
            .unwrap();
        let now = ch["tx_data_packets"].as_u64().unwrap();
        assert!(shown > 0 && shown <= now, "page {shown}, status {now}");
        let ys = chart_ys(&dom, &format!("ch{i}-rate"));
        assert_eq!(ys.len(), 2, "tx and rx series");
        assert!(ys[0].len() >= 3, "{ys:?}");
        assert!(
            ys[0].iter().any(|&y| (y - ys[0][0]).abs() > 0.5),
            "the tx chart is flat: {ys:?}"
        );
        for chart in ["rtt", "loss", "weight"] {
            assert!(
                !chart_ys(&dom, &format!("ch{i}-{chart}")).is_empty(),
                "ch{i}-{chart}"
            );
        }
    }
    // Weights 2:1 as configured.
    let w = |i: usize| st["channels"][i]["weight"].as_u64().unwrap();
    assert_eq!(w(0), 2 * w(1));
    assert!(dom.contains("first snapshot: 2 channels"), "events: {dom}");
    // Nothing fetched from elsewhere: no external script, style, image or font.
    let page = dom.to_lowercase();
    for fetch in ["<script src", "<link", "<img", "@import", "url(", "<iframe"] {
        assert!(!page.contains(fetch), "the page loads something: {fetch}");
    }

    let shot = cdp.call(
        Some(&session),
        "Page.captureScreenshot",
        serde_json::json!({ "format": "png" }),
    );
    use base64::Engine;
    let png = base64::engine::general_purpose::STANDARD
        .decode(shot["data"].as_str().unwrap())
        .unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
    cdp.close();
    if screenshot {
        std::fs::write(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/status-page.png"),
            png,
        )
        .unwrap();
    }
}
