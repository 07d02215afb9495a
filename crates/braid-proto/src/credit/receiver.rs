//! The receiving end of credit-based flow control: CUP counters, credit checks, the
//! shared pool and adaptive allocation (seed 004 §5, §6.3).

use super::alloc::{divide_pool, N2Policy};
use super::{extend, MAX_ALLOCATION};
use crate::wire::credit::Repr;
use crate::{Duration, Instant};

/// How buffer space is given to units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocation {
    /// Every unit has the same fixed N2 and N3 (the plain N23 scheme; N3 = B · RTT for
    /// a targeted bandwidth B).
    Static {
        /// Units forwarded between credits.
        n2: u32,
        /// The rest of the allocation.
        n3: u32,
    },
    /// Receiver-oriented adaptive allocation (§6.3): the pool is re-divided among units
    /// by their measured use every `interval` (the measurement interval, MTI).
    Adaptive {
        /// The measurement interval.
        interval: Duration,
        /// Smallest allocation N2 + N3 (>= 2: N2 >= 1 and N3 >= 1 keep every unit alive,
        /// so no unit is ever blocked for good: freedom from deadlock, §6.1.5).
        min: u32,
        /// Largest allocation of one unit.
        max: u32,
        /// How N2 follows the allocation.
        n2: N2Policy,
        /// Weight of the new target against the previous allocation, percent.
        smoothing_percent: u32,
    },
}

/// Settings of a [`CreditReceiver`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiverConfig {
    /// Buffer units shared by all units (the "pie"). No more than this is ever held.
    pub pool: u32,
    /// N2 + N3 of every unit before the first credit (the sender must use the same).
    pub initial_allocation: u32,
    /// Static or adaptive allocation.
    pub allocation: Allocation,
    /// Value of U_r and V_r at the start (the sender's `counter_origin`).
    pub counter_origin: u32,
}

/// A receiver configuration that cannot work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReceiverConfigError {
    /// The initial allocations (or static N2 + N3) of all units do not fit in the pool.
    #[error("{units} units of {allocation} do not fit in a pool of {pool}")]
    PoolTooSmall {
        /// Units.
        units: usize,
        /// Allocation per unit.
        allocation: u32,
        /// Pool size.
        pool: u32,
    },
    /// An allocation below 2 (no room for N2 >= 1 and N3 >= 1), above
    /// [`MAX_ALLOCATION`], or min above max.
    #[error("allocation bounds out of range")]
    Bounds,
}

/// What to do with an arriving data unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Store it: it is within the credit granted.
    Accept,
    /// Drop it: the sender is past its credit (it ignored credits, or a corrupted credit
    /// went undetected). Counted; the unit is accounted as received and dropped.
    Refuse,
}

/// Counters of a [`CreditReceiver`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReceiverStats {
    /// Data units accepted into the buffer.
    pub accepted: u64,
    /// Data units refused for lack of credit (P1: never stored).
    pub refused: u64,
    /// Units forwarded downstream.
    pub forwarded: u64,
    /// Buffered units the receiver dropped itself.
    pub dropped: u64,
    /// Units found lost by credit checks (`V_s - U_r`).
    pub lost_recovered: u64,
    /// Credit messages emitted.
    pub credits_sent: u64,
    /// Credit checks taken.
    pub checks: u64,
    /// Credit checks rejected (unknown unit, V_s impossible).
    pub checks_rejected: u64,
    /// Calls of `handle_forwarded`/`handle_dropped` for more than was held.
    pub misuse: u64,
    /// Most units held at once, all units together.
    pub max_held: u64,
    /// Reallocation rounds.
    pub reallocations: u64,
    /// Units stored beyond the credit by [`CreditReceiver::handle_unmetered`].
    pub over_grant: u64,
}

#[derive(Debug, Clone, Default)]
struct Unit {
    ur: u64,
    vr: u64,
    /// The highest `V_r + N2 + N3` ever advertised: the sender may reach it, so the
    /// receiver must keep room for it. Never decreases.
    granted: u64,
    allocation: u32,
    n2: u32,
    since_credit: u32,
    /// V_r in the last credit sent.
    credited_vr: u64,
    /// V_s in the last credit check.
    checked_vs: u64,
    forwarded_in_interval: u64,
    credit_due: bool,
    /// The last grant fell short of `V_r + allocation` for lack of pool.
    starved: bool,
}

impl Unit {
    fn held(&self) -> u64 {
        self.ur - self.vr
    }
    /// Memory this unit may need: what it holds plus what the sender may still send.
    fn committed(&self) -> u64 {
        self.held() + self.granted.saturating_sub(self.ur)
    }
}

/// The downstream end of credit-based flow control for a set of units sharing one
/// buffer pool.
///
/// Invariant (checked by the property tests): the sum over units of
/// `max(committed, floor)` never exceeds the pool, and a unit's held data never exceeds
/// its committed memory, so the buffer never overflows whatever the sender sends (P1),
/// and every unit can always get back to its floor (no deadlock).
#[derive(Debug, Clone)]
pub struct CreditReceiver {
    cfg: ReceiverConfig,
    units: Vec<Unit>,
    committed: u64,
    /// Smallest commitment each unit is always allowed (its minimum allocation).
    floor: u64,
    held: u64,
    next_realloc: Option<Instant>,
    stats: ReceiverStats,
}

impl CreditReceiver {
    /// A receiver for `units` units.
    pub fn new(units: usize, cfg: ReceiverConfig) -> Result<CreditReceiver, ReceiverConfigError> {
        let (initial, n2, floor) = match cfg.allocation {
            Allocation::Static { n2, n3 } => (n2.saturating_add(n3), n2, n2.saturating_add(n3)),
            Allocation::Adaptive { min, max, n2, .. } => {
                let initial = cfg.initial_allocation;
                if min < 2 || min > max || max > MAX_ALLOCATION || initial < min {
                    return Err(ReceiverConfigError::Bounds);
                }
                (initial, n2.n2(initial), min)
            }
        };
        if !(2..=MAX_ALLOCATION).contains(&initial) || n2 == 0 {
            return Err(ReceiverConfigError::Bounds);
        }
        if initial as u64 * units as u64 > cfg.pool as u64 {
            return Err(ReceiverConfigError::PoolTooSmall {
                units,
                allocation: initial,
                pool: cfg.pool,
            });
        }
        let origin = cfg.counter_origin as u64;
        let unit = Unit {
            ur: origin,
            vr: origin,
            granted: origin + initial as u64,
            credited_vr: origin,
            checked_vs: origin,
            allocation: initial,
            n2,
            ..Unit::default()
        };
        let next_realloc = match cfg.allocation {
            Allocation::Adaptive { interval, .. } => Some(Instant::ZERO + interval),
            Allocation::Static { .. } => None,
        };
        Ok(CreditReceiver {
            cfg,
            units: vec![unit; units],
            committed: initial as u64 * units as u64,
            floor: floor as u64,
            held: 0,
            next_realloc,
            stats: ReceiverStats::default(),
        })
    }

    /// Counters.
    pub fn stats(&self) -> &ReceiverStats {
        &self.stats
    }

    /// Number of units.
    pub fn units(&self) -> usize {
        self.units.len()
    }

    /// Units held in the buffer now, all units together (never above the pool).
    pub fn held(&self) -> u64 {
        self.held
    }

    /// Units held by one unit.
    pub fn held_by(&self, unit: usize) -> u64 {
        self.units[unit].held()
    }

    /// Memory committed now (held plus what senders may still send); at most the pool.
    pub fn committed(&self) -> u64 {
        self.committed
    }

    /// The allocation N2 + N3 of a unit.
    pub fn allocation(&self, unit: usize) -> u32 {
        self.units[unit].allocation
    }

    /// N2 of a unit.
    pub fn n2(&self, unit: usize) -> u32 {
        self.units[unit].n2
    }

    /// (U_r, V_r) of a unit, 64-bit.
    pub fn counters(&self, unit: usize) -> (u64, u64) {
        (self.units[unit].ur, self.units[unit].vr)
    }

    /// The credit limit `V_r + N2 + N3` granted to a unit, as a wrap-around value for a
    /// marker's credit field. Reading it grants what the pool allows, like a credit.
    pub fn marker_limit(&mut self, unit: usize) -> u32 {
        self.grant(unit);
        self.units[unit].granted as u32
    }

    /// A data unit of `unit` arrived. Store it only on [`Admit::Accept`].
    pub fn handle_data(&mut self, _now: Instant, unit: usize) -> Admit {
        let u = &mut self.units[unit];
        u.ur += 1;
        if u.ur <= u.granted {
            self.held += 1;
            self.stats.accepted += 1;
            self.stats.max_held = self.stats.max_held.max(self.held);
            Admit::Accept
        } else {
            // Received and dropped at once: V_r counts it, so the sender's balance stays
            // honest (V_s - V_r is what is in flight or held).
            u.vr += 1;
            self.stats.refused += 1;
            Admit::Refuse
        }
    }

    /// A unit that is stored whatever the credit (in braid: a marker or trigger, which
    /// keeps the receiver in step with the sender). It is counted as received and held
    /// like data and uses up credit; the result says whether it was within the credit
    /// granted. Such units beyond the credit can take the buffer past the pool, so a
    /// user of this keeps room for them.
    pub fn handle_unmetered(&mut self, _now: Instant, unit: usize) -> bool {
        let u = &mut self.units[unit];
        let before = u.committed();
        u.ur += 1;
        let within = u.ur <= u.granted;
        let after = u.committed();
        self.committed = self.committed - before + after;
        self.held += 1;
        if within {
            self.stats.accepted += 1;
        } else {
            self.stats.over_grant += 1;
        }
        self.stats.max_held = self.stats.max_held.max(self.held);
        within
    }

    /// `n` buffered units of `unit` left downstream. After every N2 of them a credit is
    /// due (the N23 scheme); freed memory may also unblock units waiting for the pool.
    pub fn handle_forwarded(&mut self, _now: Instant, unit: usize, n: u32) {
        let n = self.release(unit, n);
        self.stats.forwarded += n as u64;
        let u = &mut self.units[unit];
        u.forwarded_in_interval += n as u64;
        u.since_credit += n;
        if u.since_credit >= u.n2 {
            u.credit_due = true;
        }
        self.wake_starved();
    }

    /// The receiver discarded `n` buffered units of `unit` itself (a fault path).
    pub fn handle_dropped(&mut self, _now: Instant, unit: usize, n: u32) {
        let n = self.release(unit, n);
        self.stats.dropped += n as u64;
        self.units[unit].since_credit += n;
        self.wake_starved();
    }

    fn release(&mut self, unit: usize, n: u32) -> u32 {
        let u = &mut self.units[unit];
        let n = if n as u64 > u.held() {
            self.stats.misuse += 1;
            u.held() as u32
        } else {
            n
        };
        u.vr += n as u64;
        self.held -= n as u64;
        self.committed -= n as u64;
        n
    }

    /// A unit whose allocation is above what it was granted (the pool was short) gets a
    /// credit as soon as the pool has room for N2 of it (or all it wants).
    fn wake_starved(&mut self) {
        let room = self.room();
        for u in &mut self.units {
            let want = (u.vr + u.allocation as u64).saturating_sub(u.granted);
            if u.starved
                && !u.credit_due
                && Self::avail(u, self.floor, room) >= want.min(u.n2 as u64)
            {
                u.credit_due = true;
            }
        }
    }

    /// Pool not yet promised, counting every unit as committing at least its floor.
    fn room(&self) -> u64 {
        let reserved: u64 = self
            .units
            .iter()
            .map(|u| u.committed().max(self.floor))
            .sum();
        (self.cfg.pool as u64).saturating_sub(reserved)
    }

    /// How far a unit's commitment may grow: up to its floor always, beyond it only into
    /// the room nobody else's floor needs (§6.1.5: a minimum allocation for every unit,
    /// so none is ever blocked for good by the others' grants).
    fn avail(u: &Unit, floor: u64, room: u64) -> u64 {
        let c = u.committed();
        c.max(floor) - c + room
    }

    /// A credit check: the sender's V_s. Units it sent that never arrived (`V_s - U_r`)
    /// are counted as received and dropped, so lost data does not leak credit, and a
    /// credit goes back (§5). A credit also goes back when the sender says it is
    /// stalled: that is the paper's background audit, which repairs a lost credit even
    /// when no data is in flight to trigger the next one; and when two checks in a row
    /// carry the same V_s, all of it forwarded but not yet credited (a burst ended).
    /// Other checks send nothing, so credits stay one per N2 units forwarded (P4, P5).
    ///
    /// Returns the number of units found lost, or `None` if the check was rejected
    /// (not a check, unknown unit, impossible V_s; counted).
    pub fn handle_check(&mut self, _now: Instant, check: &Repr) -> Option<u64> {
        let Repr::Check { unit, vs, stalled } = *check else {
            self.stats.checks_rejected += 1;
            return None;
        };
        let Some(u) = self.units.get_mut(unit as usize) else {
            self.stats.checks_rejected += 1;
            return None;
        };
        let vs = extend(vs, u.ur);
        // V_s can be behind U_r only if the check is stale; it can be ahead by at most
        // what the sender could have sent past our count.
        if vs > u.ur + MAX_ALLOCATION as u64 {
            self.stats.checks_rejected += 1;
            return None;
        }
        self.stats.checks += 1;
        let lost = vs.saturating_sub(u.ur);
        let before = u.committed();
        u.ur += lost;
        u.vr += lost;
        // The sender sent nothing for a whole check interval (a burst ended) and all it
        // sent is accounted for, but the last few units were never credited: close.
        let settled = vs == u.checked_vs && vs == u.vr && u.vr != u.credited_vr;
        u.checked_vs = vs;
        u.credit_due |= lost > 0 || stalled || settled;
        let after = u.committed();
        self.committed = self.committed - before + after;
        self.stats.lost_recovered += lost;
        Some(lost)
    }

    /// Raise a unit's grant towards `V_r + allocation`, as far as the pool allows.
    fn grant(&mut self, unit: usize) {
        let room = self.room();
        let floor = self.floor;
        let u = &mut self.units[unit];
        let want = (u.vr + u.allocation as u64).saturating_sub(u.granted);
        let before = u.committed();
        let avail = Self::avail(u, floor, room);
        u.starved = want > avail;
        u.granted += want.min(avail);
        let after = u.committed();
        self.committed = self.committed - before + after;
    }

    /// The next credit to send, if one is due.
    pub fn poll_credit(&mut self) -> Option<Repr> {
        let unit = self.units.iter().position(|u| u.credit_due)?;
        self.grant(unit);
        let u = &mut self.units[unit];
        u.credit_due = false;
        u.since_credit = 0;
        u.credited_vr = u.vr;
        self.stats.credits_sent += 1;
        // `granted - vr` is the allocation in force for the sender: the new one once the
        // pool had room, or what is left of an older, larger grant while a decrease
        // takes effect (§6.1.5).
        let allocation = u.granted.saturating_sub(u.vr).min(MAX_ALLOCATION as u64) as u32;
        Some(Repr::Credit {
            unit: unit as u32,
            vr: u.vr as u32,
            allocation,
        })
    }

    /// When `handle_timeout` should next be called (adaptive allocation only).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.next_realloc
    }

    /// At the end of each measurement interval, re-divide the pool by measured use.
    pub fn handle_timeout(&mut self, now: Instant) {
        let Allocation::Adaptive {
            interval,
            min,
            max,
            n2,
            smoothing_percent,
        } = self.cfg.allocation
        else {
            return;
        };
        let Some(at) = self.next_realloc else { return };
        if now < at {
            return;
        }
        self.next_realloc = Some(now + interval);
        let usage: Vec<u64> = self.units.iter().map(|u| u.forwarded_in_interval).collect();
        let previous: Vec<u32> = self.units.iter().map(|u| u.allocation).collect();
        let next = divide_pool(
            self.cfg.pool,
            &usage,
            &previous,
            min,
            max,
            smoothing_percent,
        );
        for (u, a) in self.units.iter_mut().zip(next) {
            if a > u.allocation {
                u.credit_due = true;
            }
            u.allocation = a;
            u.n2 = n2.n2(a);
            u.forwarded_in_interval = 0;
        }
        self.stats.reallocations += 1;
    }
}
