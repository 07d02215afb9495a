//! An in-memory test bench: a [`Striper`] and a [`Resequencer`] joined by N simulated
//! channels, each with its own rate, delay, jitter (FIFO kept), loss and duplication,
//! run in virtual time until nothing is left to do.
//!
//! This is the quinn-proto style `drive()` loop used by the property tests. It is small
//! on purpose; the full simulator with scenarios and traffic models is `braid-sim`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use bytes::Bytes;

use crate::config::{ConfigError, StripeConfig};
use crate::reseq::Resequencer;
use crate::stripe::{Striper, TransmitKind};
use crate::time::{Duration, Instant};

/// A FIFO channel model.
#[derive(Clone, Debug, Default)]
pub struct Link {
    /// Serialization rate in bit/s; `None` sends instantly.
    pub rate_bps: Option<u64>,
    /// Propagation delay.
    pub delay: Duration,
    /// Extra random delay, uniform in `[0, jitter]`; arrival order stays FIFO.
    pub jitter: Duration,
    /// Probability that a datagram is lost.
    pub loss: f64,
    /// Loss applies only to datagrams sent in `[start, end)`; `None`: always.
    pub loss_window: Option<(Instant, Instant)>,
    /// Probability that a datagram is delivered twice.
    pub duplicate: f64,
}

/// A datagram the harness put on a channel.
#[derive(Clone, Debug)]
pub struct Sent {
    /// When the striper emitted it.
    pub at: Instant,
    /// Channel index.
    pub channel: usize,
    /// Data, marker or trigger.
    pub kind: TransmitKind,
    /// Data packets sent before it (for markers: the `sent` count they carry).
    pub sent: u64,
    /// When it arrives, or `None` if the channel lost it.
    pub arrival: Option<Instant>,
}

struct LinkState {
    link: Link,
    busy_until: Instant,
    last_arrival: Instant,
}

/// Deterministic generator: braid's one SplitMix64 ([`crate::rng`]).
#[derive(Clone, Debug)]
pub struct Rng(crate::rng::SplitMix64);

impl Rng {
    /// A generator from a seed (the stream that starts at state `seed + GAMMA`, as
    /// this harness always drew).
    pub fn new(seed: u64) -> Rng {
        Rng(crate::rng::SplitMix64::new(
            seed.wrapping_add(crate::rng::GAMMA),
        ))
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        self.0.next_f64()
    }
}

/// Sender, channels and receiver in one loop. See the module docs.
pub struct Harness {
    /// The sender.
    pub striper: Striper,
    /// The receiver.
    pub reseq: Resequencer,
    links: Vec<LinkState>,
    now: Instant,
    arrivals: BinaryHeap<Reverse<(Instant, u64, usize)>>,
    in_flight: std::collections::HashMap<u64, Bytes>,
    order: u64,
    source: BinaryHeap<Reverse<(Instant, u64)>>,
    pending: std::collections::HashMap<u64, Bytes>,
    rng: Rng,
    /// NAKs on their way back to the striper (arrival time, order, bytes).
    naks: BinaryHeap<Reverse<(Instant, u64)>>,
    nak_bytes: std::collections::HashMap<u64, Bytes>,
    /// One-way delay of the reverse path that carries NAKs (`seq` mode with repair).
    pub reverse_delay: Duration,
    /// Every datagram put on a channel, in emission order.
    pub sent: Vec<Sent>,
    /// Every packet delivered to the application, with its time.
    pub delivered: Vec<(Instant, Bytes)>,
}

impl Harness {
    /// Both ends from one configuration, one [`Link`] per channel.
    pub fn new(cfg: StripeConfig, links: Vec<Link>, seed: u64) -> Result<Harness, ConfigError> {
        assert_eq!(links.len(), cfg.channels(), "one link per channel");
        let reseq = Resequencer::new(&cfg)?;
        let striper = Striper::new(cfg)?;
        Ok(Harness {
            striper,
            reseq,
            links: links
                .into_iter()
                .map(|link| LinkState {
                    link,
                    busy_until: Instant::ZERO,
                    last_arrival: Instant::ZERO,
                })
                .collect(),
            now: Instant::ZERO,
            arrivals: BinaryHeap::new(),
            in_flight: Default::default(),
            order: 0,
            source: BinaryHeap::new(),
            pending: Default::default(),
            rng: Rng::new(seed),
            naks: BinaryHeap::new(),
            nak_bytes: Default::default(),
            reverse_delay: Duration::from_millis(1),
            sent: Vec::new(),
            delivered: Vec::new(),
        })
    }

    /// Current virtual time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Have the striper send markers (or triggers) on every channel at `at`, as a
    /// driver's heartbeat does.
    pub fn flush_at(&mut self, at: Instant) {
        self.order += 1;
        self.source.push(Reverse((at, self.order)));
    }

    /// Have the application send `payload` at `at`.
    pub fn send_at(&mut self, at: Instant, payload: Bytes) {
        self.order += 1;
        self.pending.insert(self.order, payload);
        self.source.push(Reverse((at, self.order)));
    }

    fn transmit_all(&mut self) {
        while let Some(t) = self.striper.poll_transmit() {
            let st = &mut self.links[t.channel];
            let len = t.len() as u64;
            let start = self.now.max(st.busy_until);
            let tx = st.link.rate_bps.map_or(Duration::ZERO, |r| {
                Duration::from_micros(len * 8 * 1_000_000 / r.max(1))
            });
            st.busy_until = start + tx;
            let in_window = st
                .link
                .loss_window
                .is_none_or(|(a, b)| self.now >= a && self.now < b);
            let lost = in_window && st.link.loss > 0.0 && self.rng.next_f64() < st.link.loss;
            let sent = match t.kind {
                TransmitKind::Marker => crate::wire::marker::Packet::new_checked(&t.payload[..])
                    .map(|p| p.sent())
                    .unwrap_or(0),
                _ => self.striper.packets_sent(),
            };
            let mut arrival = None;
            if !lost {
                let jitter = if st.link.jitter > Duration::ZERO {
                    Duration::from_micros(self.rng.next_u64() % (st.link.jitter.as_micros() + 1))
                } else {
                    Duration::ZERO
                };
                let at = (st.busy_until + st.link.delay + jitter).max(st.last_arrival);
                st.last_arrival = at;
                arrival = Some(at);
                let copies = if st.link.duplicate > 0.0 && self.rng.next_f64() < st.link.duplicate {
                    2
                } else {
                    1
                };
                for _ in 0..copies {
                    self.order += 1;
                    self.in_flight.insert(self.order, t.to_bytes());
                    self.arrivals.push(Reverse((at, self.order, t.channel)));
                }
            }
            self.sent.push(Sent {
                at: self.now,
                channel: t.channel,
                kind: t.kind,
                sent,
                arrival,
            });
        }
    }

    fn drain_deliveries(&mut self) {
        while let Some(p) = self.reseq.poll_deliver() {
            self.delivered.push((self.now, p));
        }
        while let Some(n) = self.reseq.poll_nak() {
            self.order += 1;
            self.nak_bytes.insert(self.order, n);
            self.naks
                .push(Reverse((self.now + self.reverse_delay, self.order)));
        }
    }

    /// Inject a raw datagram on `channel` now (fault injection).
    pub fn inject(&mut self, channel: usize, datagram: Bytes) {
        self.reseq.handle_datagram(self.now, channel, datagram);
        self.drain_deliveries();
    }

    /// Run until no packet is in flight, none is waiting to be sent, and no timer is
    /// armed. Returns the final virtual time.
    pub fn drive(&mut self) -> Instant {
        loop {
            let next_source = self.source.peek().map(|Reverse((t, _))| *t);
            let next_arrival = self.arrivals.peek().map(|Reverse((t, _, _))| *t);
            let next_nak = self.naks.peek().map(|Reverse((t, _))| *t);
            let next = [
                next_source,
                next_arrival,
                next_nak,
                self.striper.poll_timeout(),
                self.reseq.poll_timeout(),
            ]
            .into_iter()
            .flatten()
            .min();
            let Some(next) = next else {
                return self.now;
            };
            self.now = self.now.max(next);
            while let Some(Reverse((t, id))) = self.source.peek().copied() {
                if t > self.now {
                    break;
                }
                self.source.pop();
                match self.pending.remove(&id) {
                    Some(p) => self
                        .striper
                        .handle_packet(self.now, p)
                        .expect("harness payloads fit max_packet"),
                    None => self.striper.flush(),
                }
                self.transmit_all();
            }
            while let Some(Reverse((t, id, ch))) = self.arrivals.peek().copied() {
                if t > self.now {
                    break;
                }
                self.arrivals.pop();
                let d = self.in_flight.remove(&id).expect("in-flight datagram");
                self.reseq.handle_datagram(self.now, ch, d);
                self.drain_deliveries();
            }
            while let Some(Reverse((t, id))) = self.naks.peek().copied() {
                if t > self.now {
                    break;
                }
                self.naks.pop();
                let n = self.nak_bytes.remove(&id).expect("nak bytes");
                self.striper.handle_nak(&n);
                self.transmit_all();
            }
            self.striper.handle_timeout(self.now);
            self.transmit_all();
            self.reseq.handle_timeout(self.now);
            self.drain_deliveries();
        }
    }
}

/// A test payload of `len` bytes (at least 9) carrying `id` in bytes 1..9; the first byte
/// is 0x45 so it looks like IPv4 and travels header-free.
pub fn payload(id: u64, len: usize) -> Bytes {
    let mut v = vec![0u8; len.max(9)];
    v[0] = 0x45;
    v[1..9].copy_from_slice(&id.to_be_bytes());
    Bytes::from(v)
}

/// The id written by [`payload`].
pub fn payload_id(p: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&p[1..9]);
    u64::from_be_bytes(a)
}
