//! The events of a field run, in order, and the run's end and result.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::net::{self, CLIENTS, NAMES};
use super::recovery;
use super::tunnels::{self, Tunnel};
use super::{lockp, sleep, FieldClient, FieldEvent, FieldResult, Running, GRACE};
use crate::topo::LabError;
use std::sync::atomic::Ordering;

/// The events: share of the duration, what, the client (1-based; 0: every client).
const SCHEDULE: [(f64, &str, usize); 5] = [
    (0.15, "nat_rebind", 2),
    (0.30, "uplink_down", 1),
    (0.40, "uplink_up", 1),
    (0.55, "client_restart", 3),
    (0.70, "server_restart", 0),
];

/// The channel of the uplink that goes away (the IPv6 one).
const FLAPPED_CHANNEL: usize = 1;

impl Running {
    /// Run the events at their times, then end the streams and wait for the
    /// recoveries; the result.
    pub(super) fn events_and_end(
        &mut self,
        progress: &mut impl FnMut(&str),
    ) -> Result<FieldResult, LabError> {
        let d = self.opt.duration;
        for (share, what, k) in SCHEDULE {
            self.wait_until(self.t0 + d.mul_f64(share))?;
            let at = self.now_us();
            let extra = self.apply(what, k)?;
            let ks: Vec<usize> = if k == 0 {
                (1..=CLIENTS).collect()
            } else {
                vec![k]
            };
            for k in ks {
                let e = FieldEvent {
                    what: what.to_string(),
                    client: NAMES[k - 1].to_string(),
                    at_s: at as f64 / 1e6,
                    recovered_ms: None,
                };
                self.events.push((e, at, extra));
            }
            progress(&format!(
                "{:>6.2} s: {what} ({})",
                at as f64 / 1e6,
                if k == 0 { "server" } else { NAMES[k - 1] }
            ));
        }
        self.wait_until(self.t0 + d)?;
        self.close.store(true, Ordering::Relaxed);
        progress("duration over: streams closing, waiting for every recovery");
        let deadline = self.t0 + d + GRACE;
        while !self.finished() && Instant::now() < deadline {
            self.wait_until(Instant::now() + Duration::from_millis(200))?;
        }
        Ok(self.result())
    }

    /// Sleep until `t`, failing early if a tunnel exited or the traffic failed.
    fn wait_until(&mut self, t: Instant) -> Result<(), LabError> {
        loop {
            // First: a Ctrl-C reaches the tunnels too, and they exit.
            sleep(Duration::ZERO)?;
            self.check_alive()?;
            self.check_errors()?;
            let now = Instant::now();
            if now >= t {
                return Ok(());
            }
            sleep(Duration::from_millis(50).min(t - now))?;
        }
    }

    /// Do event `what` to client `k` (0: the server); for `uplink_up` the milliseconds
    /// until its channel was back in use at both ends.
    fn apply(&mut self, what: &str, k: usize) -> Result<Option<f64>, LabError> {
        match what {
            "nat_rebind" => net::move_nat(k)?,
            "uplink_down" => net::uplink_down(k)?,
            "uplink_up" => return self.uplink_up(k),
            "client_restart" => {
                let c = &mut self.clients[k - 1];
                c.stop(libc::SIGKILL);
                *c = Tunnel::start(&self.opt.exe, &self.dir, k)?;
            }
            _ => {
                let sig = if self.opt.crash_server {
                    libc::SIGKILL
                } else {
                    libc::SIGTERM
                };
                self.server.stop(sig);
                self.server = Tunnel::start(&self.opt.exe, &self.dir, 0)?;
            }
        }
        Ok(None)
    }

    /// Bring client `k`'s uplink back; poll both ends' status every 20 ms (5 s at
    /// most) until its channel is up at both and the server receives data on it.
    fn uplink_up(&mut self, k: usize) -> Result<Option<f64>, LabError> {
        let base = self.server_rx(k).unwrap_or(u64::MAX);
        let t = Instant::now();
        net::uplink_up(k)?;
        while t.elapsed() < Duration::from_secs(5) {
            let client = tunnels::status(&self.opt.exe, &tunnels::control(&self.dir, k));
            let up = client.is_some_and(|s| s["channels"][FLAPPED_CHANNEL]["state"] == "up");
            let server_up = self.server_channel(k).is_some_and(|c| c["state"] == "up");
            let carrying = self.server_rx(k).is_some_and(|n| n > base);
            if up && server_up && carrying {
                return Ok(Some(t.elapsed().as_secs_f64() * 1e3));
            }
            sleep(Duration::from_millis(20))?;
        }
        Ok(None)
    }

    /// The server's view of client `k`'s flapped channel.
    fn server_channel(&self, k: usize) -> Option<Value> {
        let s = tunnels::status(&self.opt.exe, &tunnels::control(&self.dir, 0))?;
        let peer = s["peers"]
            .as_array()?
            .iter()
            .find(|p| p["name"] == NAMES[k - 1])?
            .clone();
        Some(peer["session"]["channels"][FLAPPED_CHANNEL].clone())
    }

    fn server_rx(&self, k: usize) -> Option<u64> {
        self.server_channel(k)?["rx_data_packets"].as_u64()
    }

    /// Each event's recovery so far, and whether all are known for good.
    fn recoveries(&self) -> (Vec<Option<f64>>, bool) {
        let mut settled = true;
        let mut out = Vec::new();
        for (e, at, extra) in &self.events {
            let k = NAMES.iter().position(|n| *n == e.client).unwrap_or(0);
            let (up, dn) = (lockp(&self.probes[k][0]), lockp(&self.probes[k][1]));
            let r = recovery::recovered_ms(&up, &dn, *at);
            let done = r.is_some_and(|ms| {
                let when = at + (ms * 1000.0) as u64;
                recovery::settled(&up, when) && recovery::settled(&dn, when)
            });
            settled &= done;
            out.push(match (r, e.what.as_str()) {
                (Some(ms), "uplink_up") => extra.map(|x| x.max(ms)),
                (r, _) => r,
            });
        }
        (out, settled)
    }

    /// Every event recovered for good and every stream arrived whole.
    fn finished(&self) -> bool {
        self.recoveries().1
            && self
                .streams
                .iter()
                .all(|s| s.lock().unwrap_or_else(|p| p.into_inner()).complete)
    }

    fn result(&self) -> FieldResult {
        let (rec, _) = self.recoveries();
        let events = self
            .events
            .iter()
            .zip(rec)
            .map(|((e, _, _), r)| FieldEvent {
                recovered_ms: r,
                ..e.clone()
            })
            .collect();
        let clients = (0..CLIENTS).map(|i| self.client_result(i)).collect();
        FieldResult {
            duration_s: self.opt.duration.as_secs_f64(),
            events,
            clients,
        }
    }

    fn client_result(&self, i: usize) -> FieldClient {
        let s = self.streams[i]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let (up, dn) = (lockp(&self.probes[i][0]), lockp(&self.probes[i][1]));
        let count = |p: &super::Probes| p.arrived.iter().flatten().count() as u64;
        let block = super::traffic::BLOCK as u64;
        FieldClient {
            name: NAMES[i].to_string(),
            sent_bytes: s.made * block,
            received_bytes: s.received * block,
            checksum_ok: s.complete
                && s.bad == 0
                && s.received == s.made
                && up.bad == 0
                && dn.bad == 0,
            connections: s.connections,
            probes_sent: (up.sent.len() + dn.sent.len()) as u64,
            probes_received: count(&up) + count(&dn),
        }
    }
}

/// A run that did not meet the lab's own bar: an event not recovered, or a stream
/// not whole. The lab reports it with its result (see `braid lab field`).
pub fn failures(r: &FieldResult) -> Vec<String> {
    let mut v: Vec<String> = r
        .events
        .iter()
        .filter(|e| e.recovered_ms.is_none())
        .map(|e| format!("{} ({}) did not recover", e.what, e.client))
        .collect();
    v.extend(r.clients.iter().filter(|c| !c.checksum_ok).map(|c| {
        format!(
            "client {}: the stream did not arrive whole and intact",
            c.name
        )
    }));
    v
}
