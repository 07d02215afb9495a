//! Credit-based flow control per channel (seed 004 inside the session).
//!
//! Each channel of each direction is one flow-controlled unit of [`crate::credit`]: the
//! receiving end's resequencer buffer for that channel is the paper's VC buffer, and the
//! sending end may put no more on the channel than the receiver has room for. A channel
//! whose packets wait in the receiver for a slower one (skew) then slows its sender
//! down instead of overflowing the receiver: the striper waits, the packets wait in the
//! session's transmit queue, and the receiver never has to drop or force progress.
//!
//! * **Units counted.** Everything the striper sends on a channel (data, markers,
//!   triggers, seq-mode repairs) and everything the resequencer is given from it. Data
//!   needs credit ([`crate::credit::CreditSender::try_send`]); markers, triggers and
//!   repairs do not wait for it (they keep the receiver in sync, and there are few of
//!   them), but they use it up, and the receiver stores them whatever the credit. The
//!   configured window leaves [`MARKER_SLACK`] packets of the receive buffer for them.
//! * **Forwarded.** A unit leaves the receiver's buffer when the resequencer no longer
//!   holds it ([`crate::Resequencer::held_on`]): delivered, found lost, or dropped.
//! * **Messages.** Credits (receiver to sender) and credit checks (sender to receiver)
//!   are `0xB7` messages ([`crate::wire::credit`]), sealed like all control. A check
//!   goes on the channel it is about, so it follows the data it accounts for. A credit
//!   goes on the fastest channel that is up, whichever channel it is about: its values
//!   are absolute, so it may take any path, and the credit loop of a slow channel is
//!   then its one-way delay plus the fastest one's instead of its own round trip,
//!   which halves the window a slow channel needs (seed 004's N3 = B · RTT). Credits
//!   are urgent control for in-bond repair (never held behind a gap); checks are not.
//! * **Epochs.** The counters start over with each epoch of a direction. The unit field
//!   carries the epoch in its upper 24 bits and the channel in the lower 8, so a credit
//!   or check from an older epoch is recognised and ignored.

use crate::credit::{
    Admit, Allocation, CreditReceiver, CreditSender, N2Policy, ReceiverConfig, SenderConfig,
};
use crate::time::{Duration, Instant};
use crate::wire::credit::Repr;

/// Receive-buffer packets a channel's credit window leaves for markers and triggers,
/// which are stored whatever the credit.
pub const MARKER_SLACK: u32 = 64;

/// Markers and triggers the striper may put on a channel just before a data packet
/// (a round's marker and a trr trigger): a data packet is sent only if this much credit
/// is left after it, so that the receiver, which counts them first, never finds the
/// data past its credit.
pub const PRECEDING: u32 = 2;

/// How often a sender with unaccounted units checks, and how long a stalled channel
/// waits before it asks for its credit again (longer than a round trip).
const CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// How often the adaptive pool is divided again.
const ALLOCATION_INTERVAL: Duration = Duration::from_millis(100);

/// Credit settings; both ends must use the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreditConfig {
    /// N2 + N3 of each channel: the packets of the receive buffer a channel's sender may
    /// fill. With a pool, the largest allocation of one channel.
    pub window: u32,
    /// Adaptive allocation (seed 004 §6): this many packets shared by all channels,
    /// divided by measured use every 100 ms. `None`: every channel has `window`.
    pub pool: Option<u32>,
}

impl CreditConfig {
    /// Check against the receive buffer (`buffer_packets` per channel) and the channel
    /// count; the message names what is wrong.
    pub fn validate(&self, buffer_packets: usize, channels: usize) -> Result<(), String> {
        let room = (buffer_packets as u64).saturating_sub(MARKER_SLACK as u64);
        if self.window < 2 + PRECEDING {
            return Err(format!(
                "credit_window must be at least {} packets",
                2 + PRECEDING
            ));
        }
        if self.window as u64 > room {
            return Err(format!(
                "credit_window ({}) must leave {MARKER_SLACK} packets of the receive buffer \
                 (buffer_packets = {buffer_packets}) for markers: at most {room}",
                self.window
            ));
        }
        if self.window > crate::credit::MAX_ALLOCATION {
            return Err(format!(
                "credit_window must be at most {}",
                crate::credit::MAX_ALLOCATION
            ));
        }
        if let Some(pool) = self.pool {
            let min = (2 + PRECEDING) as u64 * channels as u64;
            if (pool as u64) < min {
                return Err(format!(
                    "credit_pool ({pool}) must give each of the {channels} channels at \
                     least {} packets: at least {min}",
                    2 + PRECEDING
                ));
            }
        }
        Ok(())
    }

    fn n2(&self, allocation: u32) -> u32 {
        // A credit after an eighth of the window: few credits, and the sender never
        // waits for one while the rest of the window is in flight.
        N2Policy::Fraction {
            percent: 5,
            max: 1024,
        }
        .n2(allocation)
    }

    fn initial(&self, channels: usize) -> u32 {
        match self.pool {
            None => self.window,
            Some(pool) => (pool / channels.max(1) as u32).clamp(2 + PRECEDING, self.window),
        }
    }

    fn receiver_config(&self, channels: usize) -> ReceiverConfig {
        let initial = self.initial(channels);
        match self.pool {
            None => ReceiverConfig {
                pool: self.window.saturating_mul(channels as u32),
                initial_allocation: initial,
                allocation: Allocation::Static {
                    n2: self.n2(initial),
                    n3: initial - self.n2(initial),
                },
                counter_origin: 0,
            },
            Some(pool) => ReceiverConfig {
                pool,
                initial_allocation: initial,
                allocation: Allocation::Adaptive {
                    interval: ALLOCATION_INTERVAL,
                    min: (2 + PRECEDING).max(initial.min(16)),
                    max: self.window,
                    n2: N2Policy::Fraction {
                        percent: 5,
                        max: 1024,
                    },
                    smoothing_percent: 50,
                },
                counter_origin: 0,
            },
        }
    }
}

/// The unit field of a message about `channel` in `epoch`.
pub fn wire_unit(epoch: u32, channel: usize) -> u32 {
    ((epoch & 0x00FF_FFFF) << 8) | (channel as u32 & 0xFF)
}

/// The epoch (low 24 bits) and channel of a message's unit field.
pub fn split_unit(unit: u32) -> (u32, usize) {
    (unit >> 8, (unit & 0xFF) as usize)
}

/// Counters of both directions' credit machinery, for stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CreditCounters {
    /// Times a channel ran out of credit and the striper waited (sender).
    pub stalls: u64,
    /// Credits taken that raised a limit (sender).
    pub credits_applied: u64,
    /// Credit checks sent (sender).
    pub checks_sent: u64,
    /// Credits sent (receiver).
    pub credits_sent: u64,
    /// Data refused because the sender was past its credit (receiver; 0 with a
    /// well-behaved peer).
    pub refused: u64,
    /// Units found lost by credit checks (receiver).
    pub lost_recovered: u64,
    /// Markers and triggers stored beyond the credit (receiver).
    pub over_grant: u64,
    /// Credits or checks for another epoch, ignored.
    pub stale: u64,
    /// Credits or checks rejected as impossible.
    pub rejected: u64,
}

/// Our transmit direction: one [`CreditSender`] over the physical channels.
pub(crate) struct Tx {
    pub(super) epoch: u32,
    pub(super) send: CreditSender,
}

impl Tx {
    pub(crate) fn new(cfg: &CreditConfig, channels: usize, epoch: u32) -> Tx {
        Tx {
            epoch,
            send: CreditSender::new(
                channels,
                SenderConfig {
                    initial_allocation: cfg.initial(channels),
                    check_interval: CHECK_INTERVAL,
                    counter_origin: 0,
                },
            ),
        }
    }

    /// The next credit check to send, with the channel it goes on.
    pub(crate) fn poll_check(&mut self) -> Option<(usize, Repr)> {
        let mut r = self.send.poll_check()?;
        let Repr::Check { unit, .. } = &mut r else {
            return None;
        };
        let c = *unit as usize;
        *unit = wire_unit(self.epoch, c);
        Some((c, r))
    }
}

/// Our receive direction: one [`CreditReceiver`] over the physical channels, and how
/// much of each channel the resequencer has been given and has let go.
pub(crate) struct Rx {
    pub(super) epoch: u32,
    pub(super) recv: CreditReceiver,
    admitted: Vec<u64>,
    released: Vec<u64>,
}

impl Rx {
    pub(crate) fn new(cfg: &CreditConfig, channels: usize, epoch: u32) -> Result<Rx, String> {
        let recv = CreditReceiver::new(channels, cfg.receiver_config(channels))
            .map_err(|e| format!("credits: {e}"))?;
        Ok(Rx {
            epoch,
            recv,
            admitted: vec![0; channels],
            released: vec![0; channels],
        })
    }

    /// An item of the stripe arrived on channel `c`: `true` to give it to the
    /// resequencer. Data beyond the credit is refused; markers and triggers
    /// (`metered == false`) are always stored.
    pub(crate) fn admit(
        &mut self,
        now: Instant,
        c: usize,
        metered: bool,
        n: &mut CreditCounters,
    ) -> bool {
        let ok = if metered {
            self.recv.handle_data(now, c) == Admit::Accept
        } else {
            if !self.recv.handle_unmetered(now, c) {
                n.over_grant += 1;
            }
            true
        };
        if ok {
            self.admitted[c] += 1;
        } else {
            n.refused += 1;
        }
        ok
    }

    /// The resequencer holds `held` items of channel `c`: what it let go since the
    /// last call counts as forwarded.
    pub(crate) fn sync(&mut self, now: Instant, c: usize, held: usize) {
        let gone = self.admitted[c].saturating_sub(held as u64);
        if gone > self.released[c] {
            let n = gone - self.released[c];
            self.released[c] = gone;
            self.recv
                .handle_forwarded(now, c, n.min(u32::MAX as u64) as u32);
        }
    }

    /// The next credit to send, with the channel it goes on.
    pub(crate) fn poll_credit(&mut self) -> Option<(usize, Repr)> {
        let mut r = self.recv.poll_credit()?;
        let Repr::Credit { unit, .. } = &mut r else {
            return None;
        };
        let c = *unit as usize;
        *unit = wire_unit(self.epoch, c);
        Some((c, r))
    }
}

impl CreditCounters {
    /// Add what a sender's and a receiver's counters say (they start over each epoch).
    pub(super) fn fold(&mut self, tx: Option<&Tx>, rx: Option<&Rx>) {
        if let Some(t) = tx {
            let s = t.send.stats();
            self.stalls += s.credit_stalls;
            self.credits_applied += s.credits_applied;
            self.checks_sent += s.checks_sent;
            self.rejected += s.credits_rejected;
        }
        if let Some(r) = rx {
            let s = r.recv.stats();
            self.credits_sent += s.credits_sent;
            self.lost_recovered += s.lost_recovered;
            self.rejected += s.checks_rejected;
        }
    }
}

impl super::Session {
    /// A credit or credit check from the peer, on channel `c`.
    pub(super) fn on_credit(&mut self, now: Instant, c: usize, pkt: &[u8]) {
        let Ok(mut m) = crate::credit::parse(pkt) else {
            self.chans[c].n.malformed += 1;
            return;
        };
        // A check comes on its own channel; a credit on any.
        let own = matches!(m, Repr::Check { .. });
        let (Repr::Credit { unit, .. } | Repr::Check { unit, .. }) = &mut m;
        let (epoch, channel) = split_unit(*unit);
        if channel >= self.n || (own && channel != c) {
            self.chans[c].n.malformed += 1;
            return;
        }
        *unit = channel as u32;
        match m {
            Repr::Credit { .. } => {
                let Some(ct) = &mut self.credit_tx else {
                    return;
                };
                if epoch != ct.epoch & 0x00FF_FFFF {
                    self.credit_n.stale += 1;
                    return;
                }
                if ct.send.handle_credit(now, &m).is_ok() {
                    self.pump(now);
                }
            }
            Repr::Check { .. } => {
                let Some(cr) = &mut self.credit_rx else {
                    return;
                };
                if epoch != cr.epoch & 0x00FF_FFFF {
                    self.credit_n.stale += 1;
                    return;
                }
                cr.recv.handle_check(now, &m);
                self.send_credits();
            }
        }
    }

    /// What the resequencer let go of each channel since the last call is forwarded;
    /// send the credits that are due.
    pub(super) fn credit_sync(&mut self, now: Instant) {
        let Some(cr) = &mut self.credit_rx else {
            return;
        };
        for (c, k) in self.rx.index.iter().enumerate() {
            if let Some(k) = *k {
                cr.sync(now, c, self.rx.reseq.held_on(k));
            }
        }
        self.send_credits();
    }

    fn send_credits(&mut self) {
        while let Some((c, r)) = self.credit_rx.as_mut().and_then(Rx::poll_credit) {
            let via = self.fastest(None).unwrap_or(c);
            self.emit_credit(via, &r);
        }
    }

    fn emit_credit(&mut self, c: usize, r: &Repr) {
        self.emit(
            c,
            super::DatagramKind::Control,
            bytes::Bytes::from(r.to_vec()),
        );
    }

    /// When the credit machinery wants `handle_timeout`.
    pub(super) fn credit_timeout(&self) -> Option<Instant> {
        let tx = self.credit_tx.as_ref().and_then(|t| t.send.poll_timeout());
        let rx = self.credit_rx.as_ref().and_then(|r| r.recv.poll_timeout());
        match (tx, rx) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Credit checks and adaptive allocation that are due.
    pub(super) fn credit_timers(&mut self, now: Instant) {
        if let Some(cr) = &mut self.credit_rx {
            if cr.recv.poll_timeout().is_some_and(|t| now >= t) {
                cr.recv.handle_timeout(now);
            }
        }
        self.send_credits();
        let Some(ct) = &mut self.credit_tx else {
            return;
        };
        if ct.send.poll_timeout().is_some_and(|t| now >= t) {
            ct.send.handle_timeout(now);
        }
        while let Some((c, r)) = self.credit_tx.as_mut().and_then(Tx::poll_check) {
            self.emit_credit(c, &r);
        }
    }

    /// A new transmit epoch: the peer's receiver starts its credit over.
    pub(super) fn credit_new_tx(&mut self, epoch: u32) {
        if let Some(cfg) = self.cfg.credits {
            self.credit_n.fold(self.credit_tx.as_ref(), None);
            self.credit_tx = Some(Tx::new(&cfg, self.n, epoch));
        }
    }

    /// A new receive epoch: our credit starts over.
    pub(super) fn credit_new_rx(&mut self, epoch: u32) {
        if let Some(cfg) = self.cfg.credits {
            self.credit_n.fold(None, self.credit_rx.as_ref());
            // Validated with the configuration, so this cannot fail; keep the old one
            // (and count nothing twice) if it did.
            if let Ok(r) = Rx::new(&cfg, self.n, epoch) {
                self.credit_rx = Some(r);
            }
        }
    }

    /// Credit counters over every epoch (`None` when credits are off).
    pub fn credit_counters(&self) -> Option<CreditCounters> {
        self.cfg.credits?;
        let mut n = self.credit_n;
        n.fold(self.credit_tx.as_ref(), self.credit_rx.as_ref());
        Some(n)
    }

    /// The credit left on each channel of our transmit direction (`None` when off).
    pub fn credit_balances(&self) -> Option<Vec<u64>> {
        let ct = self.credit_tx.as_ref()?;
        Some((0..self.n).map(|c| ct.send.balance(c)).collect())
    }
}
