//! What `braid node` prints: route changes and flow slots as they happen, and every so
//! often the accessibility table, the relayed flows and the counters. Kept here so the
//! CLI only prints the lines.

use std::time::Instant;

use crate::node::{wall_now, Snapshot};

/// Turns successive [`Snapshot`]s into the lines to print: each change once.
#[derive(Debug)]
pub struct Report {
    shown: usize,
    shown_slots: Option<(u32, Vec<Option<String>>)>,
    last_table: Instant,
    table_every_s: f64,
}

impl Report {
    /// A report that prints the table every `table_every_s` seconds (0: never).
    pub fn new(table_every_s: f64) -> Report {
        Report {
            shown: 0,
            shown_slots: None,
            last_table: Instant::now(),
            table_every_s,
        }
    }

    /// The lines `s` adds to what was printed: new route changes, a change of the
    /// flow's slots, and the table when it is due.
    pub fn lines(&mut self, s: &Snapshot) -> Vec<String> {
        let mut out = Vec::new();
        for c in s.changes.iter().skip(self.shown) {
            let paths: Vec<String> = c
                .paths
                .iter()
                .map(|(p, mbps)| format!("{p} ({mbps:.2} Mbit/s)"))
                .collect();
            out.push(format!(
                "route to {}: {} [{}]",
                c.dst,
                paths.join(" + "),
                c.reason
            ));
        }
        self.shown = s.changes.len();
        if let Some(f) = &s.flow {
            let now = Some((f.flow, f.slots.clone()));
            if now != self.shown_slots {
                let slots: Vec<String> = f
                    .slots
                    .iter()
                    .enumerate()
                    .map(|(i, p)| format!("{i}: {}", p.as_deref().unwrap_or("unused")))
                    .collect();
                out.push(format!(
                    "flow {:08x} {}->{}: slots {}",
                    f.flow,
                    f.src,
                    f.dst,
                    slots.join(", ")
                ));
                self.shown_slots = now;
            }
        }
        if self.table_every_s > 0.0 && self.last_table.elapsed().as_secs_f64() >= self.table_every_s
        {
            self.last_table = Instant::now();
            out.extend(table(s));
        }
        out
    }
}

/// The relayed flows, the counters and the accessibility table.
fn table(s: &Snapshot) -> Vec<String> {
    let mut out = vec![format!(
        "relaying {} flow(s): {} DATA datagrams forwarded, {} dropped",
        s.relayed.len(),
        s.stats.forwarded,
        s.stats.data_dropped
    )];
    for e in &s.relayed {
        out.push(format!(
            "relayed flow {:08x} {}->{} slot {}",
            e.flow, e.src, e.dst, e.slot
        ));
    }
    out.push(format!(
        "authentication: {} datagrams refused, {} HELLOs taken, {} sent; flow messages: {} PROVISIONs, {} TEARDOWNs, {} refused",
        s.stats.auth_failures,
        s.stats.hellos,
        s.stats.hellos_sent,
        s.stats.provisions,
        s.stats.teardowns,
        s.stats.flow_refused
    ));
    if let Some(f) = &s.flow {
        out.push(format!(
            "flow {:08x}: sent per slot {:?}, received per slot {:?}",
            f.flow, f.sent, f.received
        ));
    }
    let now = wall_now();
    for from in 0..s.table.nodes() as u16 {
        for to in 0..s.table.nodes() as u16 {
            if let Some(m) = s.table.get(from, to) {
                out.push(format!(
                    "hop {from}->{to}: {:.2} Mbit/s, rtt {:.1} ms, loss {:.2} %, age {} ms",
                    m.throughput_bps / 1e6,
                    m.rtt.as_secs_f64() * 1e3,
                    m.loss * 100.0,
                    (now - m.at).as_micros() / 1000
                ));
            }
        }
    }
    out
}
