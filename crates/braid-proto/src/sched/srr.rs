use super::Position;

/// What a packet costs against a channel's deficit counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cost {
    /// Its length in bytes (SRR).
    Bytes,
    /// One unit whatever its length (RR, GRR).
    Packets,
}

/// Surplus Round Robin (seed 000 §3.5), sender or receiver side.
///
/// The state keeps, for every channel, the implicit number ([`Position`]) of the next
/// packet on it: the round and the deficit counter with that visit's quantum already
/// added. Sending a packet of cost `L` on the current channel subtracts `L`; once the
/// counter is no longer positive the visit ends, the next visit's quantum is added (the
/// overdraft is carried as a penalty) and the pointer moves on, wrapping into the next
/// round after the last channel.
#[derive(Clone, Debug)]
pub struct Srr {
    quanta: Vec<i64>,
    next: Vec<Position>,
    cur: usize,
    round: u64,
    cost: Cost,
}

impl Srr {
    /// A fresh scheduler: round 0, pointer on channel 0, every counter at its quantum.
    ///
    /// # Panics
    /// If `quanta` is empty (callers validate configs first; see `StripeConfig`).
    pub fn new(quanta: &[u32], cost: Cost) -> Srr {
        assert!(!quanta.is_empty(), "SRR needs at least one channel");
        let quanta: Vec<i64> = quanta.iter().map(|&q| i64::from(q.max(1))).collect();
        let next = quanta
            .iter()
            .map(|&q| Position { round: 0, dc: q })
            .collect();
        Srr {
            quanta,
            next,
            cur: 0,
            round: 0,
            cost,
        }
    }

    /// Number of channels.
    pub fn channels(&self) -> usize {
        self.quanta.len()
    }

    /// Quantum of `channel`, in cost units.
    pub fn quantum(&self, channel: usize) -> i64 {
        self.quanta[channel]
    }

    /// What a packet of `len` bytes costs.
    #[inline]
    pub fn cost_of(&self, len: usize) -> i64 {
        match self.cost {
            Cost::Bytes => len as i64,
            Cost::Packets => 1,
        }
    }

    /// The channel the pointer is on.
    #[inline]
    pub fn select(&self) -> usize {
        self.cur
    }

    /// The global round.
    pub fn round(&self) -> u64 {
        self.round
    }

    /// The implicit number of the next packet on `channel`.
    pub fn position(&self, channel: usize) -> Position {
        self.next[channel]
    }

    /// Account for a packet of `len` bytes sent on the current channel.
    #[inline]
    pub fn on_sent(&mut self, len: usize) {
        let cost = self.cost_of(len);
        self.consume(self.cur, cost);
    }

    /// Subtract `cost` from `channel`'s counter; end the visit when it is no longer
    /// positive. Returns true when the visit ended.
    #[inline]
    pub(crate) fn consume(&mut self, channel: usize, cost: i64) -> bool {
        let p = &mut self.next[channel];
        p.dc -= cost;
        if p.dc <= 0 {
            p.round = p.round.saturating_add(1);
            p.dc += self.quanta[channel];
            // A channel's counter may stay non-positive only if a packet was larger than
            // its quantum (configs forbid it); keep the invariant dc > 0 anyway.
            if p.dc <= 0 {
                p.dc = self.quanta[channel];
            }
            if channel == self.cur {
                self.advance();
            }
            true
        } else {
            false
        }
    }

    /// Move the pointer to the next channel, wrapping into the next round.
    #[inline]
    pub(crate) fn advance(&mut self) {
        self.cur += 1;
        if self.cur == self.quanta.len() {
            self.cur = 0;
            self.round = self.round.saturating_add(1);
        }
    }

    /// Overwrite `channel`'s next implicit number (a marker arrived).
    pub(crate) fn set_position(&mut self, channel: usize, pos: Position) {
        self.next[channel] = pos;
    }

    /// Jump the global round forward to `round`, pointer on channel 0.
    pub(crate) fn jump_to_round(&mut self, round: u64) {
        self.round = round;
        self.cur = 0;
    }

    /// Move the global round back to `round`, pointer on `channel` (a receiver that
    /// ran ahead of the sender, as a marker shows).
    pub(crate) fn rewind(&mut self, round: u64, channel: usize) {
        self.round = round;
        self.cur = channel;
    }

    /// Change `channel`'s quantum (takes effect from its next visit).
    pub fn set_quantum(&mut self, channel: usize, quantum: u32) {
        self.quanta[channel] = i64::from(quantum.max(1));
    }
}
