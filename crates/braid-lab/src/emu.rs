//! The user-space link emulator: delay, jitter and loss for every packet that crosses a
//! TUN device, in a FIFO.
//!
//! The lab's policy routes send all transit traffic of link *i* into TUN device *i* of
//! the router namespace. [`Emulator::run`] reads each packet, decides whether the link
//! loses it, and schedules it for `arrival + delay + jitter`, never before the previous
//! packet (the link stays FIFO). When the time comes it writes the packet back into the
//! device; the kernel then forwards it on. The timer is `ppoll` with a nanosecond
//! timeout on the monotonic clock, and the lateness of every release is recorded.

use std::collections::VecDeque;
use std::io::{self, ErrorKind};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::spec::{LinkSpec, Loss};
use braid_io::tun::TunDevice as Tun;

/// Counters of one emulated link.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EmuStats {
    /// Packets read from the device.
    pub packets_in: u64,
    /// Packets written back.
    pub packets_out: u64,
    /// Packets the loss process dropped.
    pub dropped: u64,
    /// Packets dropped because the delay queue was full.
    pub queue_drops: u64,
    /// Lateness of releases (actual minus scheduled), in microseconds: mean.
    pub late_mean_us: f64,
    /// Largest lateness, microseconds.
    pub late_max_us: u64,
    /// Releases more than 1 ms late.
    pub late_over_1ms: u64,
    /// Whether the emulator thread runs under real-time scheduling ([`make_realtime`]).
    pub realtime: bool,
}

impl EmuStats {
    /// One JSON object.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"packets_in\":{},\"packets_out\":{},\"dropped\":{},\"queue_drops\":{},\"late_mean_us\":{:.1},\"late_max_us\":{},\"late_over_1ms\":{},\"realtime\":{}}}",
            self.packets_in,
            self.packets_out,
            self.dropped,
            self.queue_drops,
            self.late_mean_us,
            self.late_max_us,
            self.late_over_1ms,
            self.realtime
        )
    }
}

/// Deterministic per-link random numbers: braid's one SplitMix64.
type Rng = braid_proto::rng::SplitMix64;

/// The loss process of one direction.
struct LossState {
    loss: Loss,
    bad: bool,
}

impl LossState {
    fn lose(&mut self, rng: &mut Rng) -> bool {
        match self.loss {
            Loss::None => false,
            Loss::Random(p) => rng.next_f64() < p,
            Loss::GilbertElliott { p_gb, p_bg } => {
                let flip = if self.bad { p_bg } else { p_gb };
                if rng.next_f64() < flip {
                    self.bad = !self.bad;
                }
                self.bad
            }
        }
    }
}

/// Which packets the loss process applies to.
#[derive(Clone, Copy, Debug)]
pub struct LossFilter {
    /// IPv4 source prefix (network, prefix length) of the forward direction.
    pub forward_src: ([u8; 4], u8),
    /// IPv6 source prefix of the forward direction.
    pub forward_src6: ([u8; 16], u8),
}

impl LossFilter {
    /// The lab's: packets from the client's side (`10.201.0.0/16`, `fd00:201::/32`).
    pub const LAB: LossFilter = LossFilter {
        forward_src: ([10, 201, 0, 0], 16),
        forward_src6: (
            [0xfd, 0, 0x02, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            32,
        ),
    };

    fn matches(&self, packet: &[u8]) -> bool {
        match packet.first().map(|b| b >> 4) {
            Some(4) if packet.len() >= 20 => {
                let (net, len) = self.forward_src;
                in_prefix(&packet[12..16], &net, len)
            }
            Some(6) if packet.len() >= 40 => {
                let (net, len) = self.forward_src6;
                in_prefix(&packet[8..24], &net, len)
            }
            _ => false,
        }
    }
}

/// Whether address `addr` lies in `net`/`len` (same length as `addr`).
fn in_prefix(addr: &[u8], net: &[u8], len: u8) -> bool {
    let len = usize::from(len).min(addr.len() * 8);
    let (whole, rest) = (len / 8, len % 8);
    if addr[..whole] != net[..whole] {
        return false;
    }
    rest == 0 || {
        let mask = 0xffu8 << (8 - rest);
        addr[whole] & mask == net[whole] & mask
    }
}

/// One emulated link over one TUN device.
pub struct Emulator {
    tun: Tun,
    delay: Duration,
    jitter: Duration,
    loss: LossState,
    filter: Option<LossFilter>,
    rng: Rng,
    queue: VecDeque<(Instant, Vec<u8>)>,
    queue_limit: usize,
    stats: EmuStats,
    late_sum_us: f64,
    /// While down, every packet is lost (`braid lab change … down`).
    down: bool,
    /// A file whose contents change the link while it runs ([`control_path`]).
    control: Option<std::path::PathBuf>,
    /// The control file's contents last applied (or found at the start). Compared by
    /// contents, not modification time: two changes within one tick of the file
    /// system's clock (`down`, then `up` a moment later) have the same time.
    control_seen: Option<String>,
}

/// The control file of link `i` in the lab's state directory: `braid lab change`
/// writes a link specification (new delay, jitter, loss), `down` or `up` into it, and
/// the emulator of that link applies it within about 50 ms. (The rate is tbf's, which
/// `lab change` sets itself.)
pub fn control_path(dir: &std::path::Path, i: usize) -> std::path::PathBuf {
    dir.join(format!("emu-{i}.ctl"))
}

impl Emulator {
    /// An emulator for `spec` on `tun`. Loss applies to packets matching `filter`
    /// (all packets if `None`); `seed` makes the loss pattern repeatable.
    pub fn new(tun: Tun, spec: &LinkSpec, filter: Option<LossFilter>, seed: u64) -> Emulator {
        Emulator {
            tun,
            delay: spec.delay,
            jitter: spec.jitter,
            loss: LossState {
                loss: spec.loss,
                bad: false,
            },
            filter,
            rng: Rng::new(seed),
            queue: VecDeque::with_capacity(4096),
            // Far more than any tbf queue in front of or behind it: the emulator adds
            // delay, it must not be the bottleneck.
            queue_limit: 200_000,
            stats: EmuStats::default(),
            late_sum_us: 0.0,
            down: false,
            control: None,
            control_seen: None,
        }
    }

    /// Watch `path` for changes ([`control_path`]).
    pub fn with_control(mut self, path: std::path::PathBuf) -> Emulator {
        self.control_seen = std::fs::read_to_string(&path).ok();
        self.control = Some(path);
        self
    }

    /// Apply the control file if it changed since we last read it.
    fn poll_control(&mut self) {
        let Some(path) = &self.control else { return };
        let Ok(text) = std::fs::read_to_string(path) else {
            return;
        };
        if self.control_seen.as_ref() == Some(&text) {
            return;
        }
        self.apply(text.trim());
        self.control_seen = Some(text);
    }

    /// Take a change: a link specification, `down` or `up`. Anything else is ignored
    /// (the writer, `lab change`, checked it).
    pub fn apply(&mut self, what: &str) {
        match what {
            "down" => self.down = true,
            "up" => self.down = false,
            spec => {
                if let Ok(l) = LinkSpec::parse(spec) {
                    self.delay = l.delay;
                    self.jitter = l.jitter;
                    self.loss = LossState {
                        loss: l.loss,
                        bad: false,
                    };
                    self.down = false;
                }
            }
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> &EmuStats {
        &self.stats
    }

    /// Run until `stop` is set; `report` is called about once a second with the
    /// counters.
    pub fn run(&mut self, stop: &AtomicBool, mut report: impl FnMut(&EmuStats)) -> io::Result<()> {
        let mut buf = vec![0u8; 65_536];
        let mut last_report = Instant::now();
        let mut last_release = Instant::now();
        let mut last_control = Instant::now();
        // With a control file, wake at least this often to look at it.
        let idle = if self.control.is_some() {
            Duration::from_millis(50)
        } else {
            Duration::from_millis(200)
        };
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now.duration_since(last_control) >= Duration::from_millis(50) {
                last_control = now;
                self.poll_control();
            }
            let timeout = match self.queue.front() {
                Some((at, _)) => at.saturating_duration_since(now).min(idle),
                None => idle,
            };
            wait_readable(self.tun.as_raw_fd(), timeout)?;
            self.read_arrivals(&mut buf, &mut last_release)?;
            self.release_due();
            if last_report.elapsed() >= Duration::from_secs(1) {
                last_report = Instant::now();
                report(&self.stats);
            }
        }
        report(&self.stats);
        Ok(())
    }

    /// Read every packet waiting on the device and [`admit`](Self::admit) each, until
    /// the device has no more.
    fn read_arrivals(&mut self, buf: &mut [u8], last_release: &mut Instant) -> io::Result<()> {
        loop {
            match self.tun.recv(buf) {
                Ok(0) => return Ok(()),
                Ok(n) => self.admit(&buf[..n], last_release),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// One packet that arrived: drop it if the link is down or the loss process (for
    /// packets the filter matches) loses it, or if the queue is full; else queue it for
    /// now + delay + jitter, never before the previous packet (`last_release`, which
    /// it then becomes).
    fn admit(&mut self, pkt: &[u8], last_release: &mut Instant) {
        self.stats.packets_in += 1;
        let applies = self.filter.is_none_or(|f| f.matches(pkt));
        if self.down || (applies && self.loss.lose(&mut self.rng)) {
            self.stats.dropped += 1;
            return;
        }
        if self.queue.len() >= self.queue_limit {
            self.stats.queue_drops += 1;
            return;
        }
        let now = Instant::now();
        let extra = if self.jitter > Duration::ZERO {
            self.jitter.mul_f64(self.rng.next_f64())
        } else {
            Duration::ZERO
        };
        let at = (now + self.delay + extra).max(*last_release);
        *last_release = at;
        self.queue.push_back((at, pkt.to_vec()));
    }

    /// Write back every queued packet that is due, recording how late each release is.
    fn release_due(&mut self) {
        let now = Instant::now();
        while let Some((at, _)) = self.queue.front() {
            if *at > now {
                break;
            }
            let (at, pkt) = self.queue.pop_front().expect("front exists");
            let late = now.saturating_duration_since(at).as_micros() as u64;
            self.late_sum_us += late as f64;
            self.stats.late_max_us = self.stats.late_max_us.max(late);
            if late > 1000 {
                self.stats.late_over_1ms += 1;
            }
            match self.tun.send(&pkt) {
                Ok(_) => self.stats.packets_out += 1,
                // The kernel refuses a packet (e.g. no route while the lab is being
                // torn down): count it as lost, keep going.
                Err(_) => self.stats.queue_drops += 1,
            }
        }
        if self.stats.packets_out > 0 {
            self.stats.late_mean_us = self.late_sum_us / self.stats.packets_out as f64;
        }
    }
}

/// Block until `fd` is readable or `timeout` passes (nanosecond resolution).
fn wait_readable(fd: i32, timeout: Duration) -> io::Result<()> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: one valid pollfd, a valid timespec, no signal mask.
    let rc = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// Run one emulator per link on the TUN devices `t0`, `t1`, ... until SIGTERM or
/// SIGINT (this is `braid lab emulate`, started by `lab up` in the router namespace);
/// each writes its counters to `dir/emu-I.json` as it goes.
pub fn run_links(links: &[LinkSpec], seed: u64, dir: &std::path::Path) -> Result<(), String> {
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    install_stop_handler(stop.clone());
    let mut threads = Vec::new();
    for (i, l) in links.iter().enumerate() {
        let tun = Tun::open(&format!("t{i}")).map_err(|e| e.to_string())?;
        let mut emu = Emulator::new(tun, l, Some(LossFilter::LAB), seed.wrapping_add(i as u64))
            .with_control(control_path(dir, i));
        let stop = stop.clone();
        let path = dir.join(format!("emu-{i}.json"));
        let tmp = dir.join(format!("emu-{i}.json.tmp"));
        threads.push(std::thread::spawn(move || {
            emu.stats.realtime = make_realtime();
            emu.run(&stop, |s| {
                // Written aside and renamed over: a reader never sees a half-written
                // file (it read one as "no counters", and a lab test saw no loss).
                if std::fs::write(&tmp, s.to_json()).is_ok() {
                    let _ = std::fs::rename(&tmp, &path);
                }
            })
        }));
    }
    let mut failed = None;
    for (i, t) in threads.into_iter().enumerate() {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failed = Some(format!("link {i}: {e}")),
            Err(_) => failed = Some(format!("link {i}: emulator thread panicked")),
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Put the calling thread under `SCHED_FIFO` at a middle priority, with no timer slack,
/// so a packet's release is not held up by the tunnel ends, iperf3 and the kernel's
/// other work competing for the machine's few cores (kernel netem runs in softirq
/// context for the same reason). The emulator sleeps in `ppoll` between packets, so it
/// takes the CPU only for what it does; the kernel's real-time throttling keeps a
/// runaway from starving the rest. Returns whether it took (it needs root or
/// `CAP_SYS_NICE`); the lab runs either way, and the JSON says which.
pub fn make_realtime() -> bool {
    let param = libc::sched_param { sched_priority: 50 };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if rc != 0 {
        return false;
    }
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument (nanoseconds).
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    true
}

static STOP: std::sync::OnceLock<std::sync::Arc<AtomicBool>> = std::sync::OnceLock::new();

extern "C" fn on_signal(_: libc::c_int) {
    if let Some(s) = STOP.get() {
        s.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

fn install_stop_handler(stop: std::sync::Arc<AtomicBool>) {
    let _ = STOP.set(stop);
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gilbert_elliott_converges_to_its_average() {
        let mut st = LossState {
            loss: Loss::GilbertElliott {
                p_gb: 0.01,
                p_bg: 0.2,
            },
            bad: false,
        };
        let mut rng = Rng::new(42);
        let n = 200_000;
        let lost = (0..n).filter(|_| st.lose(&mut rng)).count();
        let rate = lost as f64 / n as f64;
        let want = 0.01 / 0.21;
        assert!((rate - want).abs() < 0.005, "rate {rate} want {want}");
    }

    #[test]
    fn changes_apply_delay_loss_and_down() {
        // No device is needed to check the state a change leaves.
        let l = LinkSpec::parse("10mbit/5ms").unwrap();
        let mut st = (
            l.delay,
            LossState {
                loss: l.loss,
                bad: false,
            },
        );
        assert_eq!(st.0, Duration::from_millis(5));
        let l2 = LinkSpec::parse("10mbit/40ms/2%").unwrap();
        st = (
            l2.delay,
            LossState {
                loss: l2.loss,
                bad: false,
            },
        );
        assert_eq!(st.0, Duration::from_millis(40));
        assert!(matches!(st.1.loss, Loss::Random(p) if (p - 0.02).abs() < 1e-12));
    }

    #[test]
    fn loss_filter_matches_the_forward_prefix() {
        let f = LossFilter::LAB;
        let mut p = vec![0u8; 20];
        p[0] = 0x45;
        p[12..16].copy_from_slice(&[10, 201, 3, 1]);
        assert!(f.matches(&p));
        p[12..16].copy_from_slice(&[10, 202, 3, 1]);
        assert!(!f.matches(&p));
        assert!(!f.matches(&p[..10]));
        let mut p6 = vec![0u8; 40];
        p6[0] = 0x60;
        let client: std::net::Ipv6Addr = "fd00:201:3::1".parse().unwrap();
        let server: std::net::Ipv6Addr = "fd00:202:3::1".parse().unwrap();
        p6[8..24].copy_from_slice(&client.octets());
        assert!(f.matches(&p6));
        p6[8..24].copy_from_slice(&server.octets());
        assert!(!f.matches(&p6));
        assert!(!f.matches(&p6[..30]));
    }
}
