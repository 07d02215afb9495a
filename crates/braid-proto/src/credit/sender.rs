//! The sending end of credit-based flow control (seed 004 §4 and §5).

use super::{extend, MAX_ALLOCATION};
use crate::wire::credit::Repr;
use crate::{Duration, Instant};

/// Settings of a [`CreditSender`]; both ends must agree on `initial_allocation` and
/// `counter_origin` (the session's handshake, or configuration, fixes them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SenderConfig {
    /// N2 + N3 of every unit before its first credit arrives.
    pub initial_allocation: u32,
    /// A credit check (V_s) goes out this often per unit while some of its units are
    /// not yet accounted for by a credit; a unit stalled for this long asks for a credit
    /// back. Make it longer than the round trip.
    pub check_interval: Duration,
    /// Value of V_s at the start; tests start near 2^32 to exercise wrap-around.
    pub counter_origin: u32,
}

/// `try_send` found no credit for the unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no credit for this unit")]
pub struct Stalled;

/// Why a credit was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CreditError {
    /// The unit is not one of ours.
    #[error("unknown unit {0}")]
    UnknownUnit(u32),
    /// V_r is ahead of V_s: the receiver cannot have forwarded what we never sent.
    #[error("V_r ahead of V_s")]
    Ahead,
    /// The allocation is above [`MAX_ALLOCATION`].
    #[error("allocation out of range")]
    Allocation,
    /// A credit check given to the sender.
    #[error("not a credit")]
    NotCredit,
}

/// Counters of a [`CreditSender`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SenderStats {
    /// Data units sent (sum of V_s increments).
    pub sent: u64,
    /// Times a unit went from sendable to blocked for lack of credit.
    pub credit_stalls: u64,
    /// `try_send` calls refused (a driver that polls every slot counts many per stall).
    pub refused_attempts: u64,
    /// Credits that raised a unit's limit.
    pub credits_applied: u64,
    /// Credits that were valid but older than or equal to what we had (idempotent).
    pub credits_stale: u64,
    /// Credits rejected as impossible (see [`CreditError`]).
    pub credits_rejected: u64,
    /// Credit checks emitted.
    pub checks_sent: u64,
    /// Units sent without credit ([`CreditSender::count_unmetered`]).
    pub unmetered: u64,
}

#[derive(Debug, Clone)]
struct Unit {
    /// V_s: data units forwarded over the link, running total.
    vs: u64,
    /// V_r from the newest credit.
    vr: u64,
    /// N2 + N3 from the newest credit.
    allocation: u32,
    /// `V_r + N2 + N3`: V_s may grow up to here.
    limit: u64,
    stalled: bool,
    /// Credits the last refused send wanted to keep ([`CreditSender::try_send_keeping`]).
    keep: u32,
    /// When a stalled unit next asks for a credit back.
    stall_check: Instant,
    next_check: Instant,
    check_due: bool,
    check_stalled: bool,
}

/// The upstream end of credit-based flow control for a set of units.
#[derive(Debug, Clone)]
pub struct CreditSender {
    cfg: SenderConfig,
    units: Vec<Unit>,
    stats: SenderStats,
}

impl CreditSender {
    /// A sender for `units` units, each starting with `initial_allocation` credit.
    pub fn new(units: usize, cfg: SenderConfig) -> CreditSender {
        let origin = cfg.counter_origin as u64;
        let alloc = cfg.initial_allocation.min(MAX_ALLOCATION);
        let unit = Unit {
            vs: origin,
            vr: origin,
            allocation: alloc,
            limit: origin + alloc as u64,
            stalled: false,
            keep: 0,
            stall_check: Instant::ZERO,
            next_check: Instant::ZERO,
            check_due: false,
            check_stalled: false,
        };
        CreditSender {
            cfg,
            units: vec![unit; units],
            stats: SenderStats::default(),
        }
    }

    /// Number of units.
    pub fn units(&self) -> usize {
        self.units.len()
    }

    /// Counters.
    pub fn stats(&self) -> &SenderStats {
        &self.stats
    }

    /// Credit_Balance: `N2 + N3 - (V_s - V_r)` from the newest credit, never below zero.
    pub fn balance(&self, unit: usize) -> u64 {
        let u = &self.units[unit];
        u.limit.saturating_sub(u.vs)
    }

    /// V_s of a unit (64-bit).
    pub fn vs(&self, unit: usize) -> u64 {
        self.units[unit].vs
    }

    /// N2 + N3 from the newest credit of a unit.
    pub fn allocation(&self, unit: usize) -> u32 {
        self.units[unit].allocation
    }

    /// Take one credit to send one data unit now. `Err(Stalled)` means: do not send.
    /// The first refusal after a send counts as one credit stall; a stall that lasts a
    /// whole `check_interval` (longer than a round trip, so credits in flight would
    /// have ended it) sends a check flagged *stalled*, which the receiver answers with a
    /// credit: a lost credit is recovered even when no data is in flight.
    pub fn try_send(&mut self, now: Instant, unit: usize) -> Result<(), Stalled> {
        self.try_send_keeping(now, unit, 0)
    }

    /// [`CreditSender::try_send`], but only if `keep` credits remain afterwards: for a
    /// caller that may send up to `keep` units without credit
    /// ([`CreditSender::count_unmetered`]) just *before* this one on the wire, which the
    /// receiver counts first.
    pub fn try_send_keeping(
        &mut self,
        now: Instant,
        unit: usize,
        keep: u32,
    ) -> Result<(), Stalled> {
        let interval = self.cfg.check_interval;
        let u = &mut self.units[unit];
        if u.vs + keep as u64 >= u.limit {
            self.stats.refused_attempts += 1;
            u.keep = keep;
            if !u.stalled {
                u.stalled = true;
                u.stall_check = now + interval;
                self.stats.credit_stalls += 1;
            }
            return Err(Stalled);
        }
        u.stalled = false;
        u.vs += 1;
        self.stats.sent += 1;
        Ok(())
    }

    /// A unit sent without asking for credit (in braid: markers, triggers and repairs,
    /// which must not wait). V_s counts it, so it uses up credit like data, and the
    /// receiver's count stays equal to ours.
    pub fn count_unmetered(&mut self, unit: usize) {
        self.units[unit].vs += 1;
        self.stats.sent += 1;
        self.stats.unmetered += 1;
    }

    /// Take a parsed credit message ([`Repr::Credit`]).
    pub fn handle_credit(&mut self, now: Instant, credit: &Repr) -> Result<(), CreditError> {
        let Repr::Credit {
            unit,
            vr,
            allocation,
        } = *credit
        else {
            return Err(CreditError::NotCredit);
        };
        let idx = unit as usize;
        let Some(u) = self.units.get(idx) else {
            self.stats.credits_rejected += 1;
            return Err(CreditError::UnknownUnit(unit));
        };
        if allocation > MAX_ALLOCATION {
            self.stats.credits_rejected += 1;
            return Err(CreditError::Allocation);
        }
        let vr = extend(vr, u.vs);
        if vr > u.vs {
            self.stats.credits_rejected += 1;
            return Err(CreditError::Ahead);
        }
        self.apply(now, idx, vr, allocation);
        Ok(())
    }

    /// Take the credit limit `V_r + N2 + N3` piggybacked in a marker's credit field.
    pub fn handle_limit(
        &mut self,
        now: Instant,
        unit: usize,
        limit: u32,
    ) -> Result<(), CreditError> {
        let Some(u) = self.units.get(unit) else {
            self.stats.credits_rejected += 1;
            return Err(CreditError::UnknownUnit(unit as u32));
        };
        let limit = extend(limit, u.vs);
        if limit > u.vs + MAX_ALLOCATION as u64 {
            self.stats.credits_rejected += 1;
            return Err(CreditError::Allocation);
        }
        // V_r is not known on its own here: keep the newest one, fold the rest into the
        // allocation so that `vr + allocation == limit` still holds.
        let vr = u.vr.min(limit);
        let allocation = (limit - vr).min(MAX_ALLOCATION as u64) as u32;
        self.apply(now, unit, vr, allocation);
        Ok(())
    }

    fn apply(&mut self, _now: Instant, unit: usize, vr: u64, allocation: u32) {
        let u = &mut self.units[unit];
        let limit = vr + allocation as u64;
        if limit > u.limit {
            u.limit = limit;
            u.vr = u.vr.max(vr);
            u.allocation = allocation;
            self.stats.credits_applied += 1;
        } else {
            self.stats.credits_stale += 1;
        }
    }

    /// The next credit check to send, if one is due.
    pub fn poll_check(&mut self) -> Option<Repr> {
        let (i, u) = self
            .units
            .iter_mut()
            .enumerate()
            .find(|(_, u)| u.check_due)?;
        u.check_due = false;
        self.stats.checks_sent += 1;
        Some(Repr::Check {
            unit: i as u32,
            vs: u.vs as u32,
            stalled: core::mem::take(&mut u.check_stalled),
        })
    }

    /// When `handle_timeout` should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let periodic = self
            .units
            .iter()
            .filter(|u| u.vs > u.vr)
            .map(|u| u.next_check);
        let stalls = self
            .units
            .iter()
            .filter(|u| u.stalled)
            .map(|u| u.stall_check);
        periodic.chain(stalls).min()
    }

    /// Queue the credit checks that are due: every `check_interval` for a unit with
    /// units not yet accounted for by a credit (`V_s > V_r`), the paper's periodic check;
    /// and, flagged stalled, every `check_interval` while a unit has been stalled that
    /// long.
    pub fn handle_timeout(&mut self, now: Instant) {
        let interval = self.cfg.check_interval;
        for u in &mut self.units {
            if now >= u.next_check && u.vs > u.vr {
                u.check_due = true;
                u.next_check = now + interval;
            }
            if u.stalled && u.vs + u.keep as u64 >= u.limit && now >= u.stall_check {
                u.check_due = true;
                u.check_stalled = true;
                u.stall_check = now + interval;
            }
        }
    }
}
