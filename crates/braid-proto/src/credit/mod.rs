//! Credit-based flow control: the N23 scheme, the Credit Update Protocol (CUP), credit
//! checks and adaptive credit allocation (seed 004: Kung, Blackwell and Chapman,
//! *Credit-Based Flow Control for ATM Networks*, SIGCOMM '94).
//!
//! A *unit* is what the paper calls a VC: one flow-controlled stream over one link. In
//! braid a unit is a channel (the resequencer's per-channel buffer is the VC buffer) or
//! a flow relayed hop by hop. Both ends are sans-IO machines like the [`crate::Striper`]
//! and the [`crate::Resequencer`]: every input takes `now`, every output is polled.
//!
//! * [`CreditSender`] (upstream): keeps V_s, the running total of units it forwarded, and
//!   the credit limit from the last credit. Its balance is the paper's Equation (6),
//!   `N2 + N3 - (V_s - V_r)`. It sends nothing without credit ([`CreditSender::try_send`])
//!   and sends a credit check (its V_s) every `check_interval` while it is active or
//!   stalled.
//! * [`CreditReceiver`] (downstream): keeps per unit U_r (received), V_r (forwarded or
//!   dropped) and the credit it has granted, sends a credit after every N2 units it
//!   forwards, answers credit checks (recovering `V_s - U_r` lost units into U_r and
//!   V_r), and *refuses* any unit beyond the credit it granted, whatever the sender does:
//!   its buffer cannot overflow (property P1). With [`Allocation::Adaptive`] all units
//!   share one pool, re-divided every measurement interval by measured use (§6).
//!
//! # Call order
//!
//! Sender: `try_send(now, unit)` before each data unit (send only on `Ok`);
//! `handle_credit` / `handle_limit` for credits from the peer; drain `poll_check()`; call
//! `handle_timeout(now)` once `now >= poll_timeout()`.
//!
//! Receiver: `handle_data(now, unit)` for each data unit (store it only on
//! [`Admit::Accept`]); `handle_forwarded(now, unit, n)` when units leave the buffer
//! downstream, `handle_dropped` when the receiver discards buffered units itself;
//! `handle_check` for credit checks; drain `poll_credit()`; `handle_timeout(now)` once
//! `now >= poll_timeout()` (adaptive allocation).
//!
//! # Counters
//!
//! Inside, counters are 64-bit and never wrap. On the wire they are 32-bit wrap-around
//! values (`wire::credit`); [`extend`] turns one back into the 64-bit value nearest the
//! local count. Because credits carry absolute values, a lost or corrupted credit is
//! repaired by the next one that arrives (property P3), and duplicates are harmless.

mod alloc;
mod receiver;
mod sender;

pub use alloc::{divide_pool, N2Policy};
pub use receiver::{
    Admit, Allocation, CreditReceiver, ReceiverConfig, ReceiverConfigError, ReceiverStats,
};
pub use sender::{CreditError, CreditSender, SenderConfig, SenderStats, Stalled};

use crate::wire::credit::Repr;

/// The 64-bit value congruent to `wire` modulo 2^32 that is nearest to `near`.
///
/// Values more than 2^31 away cannot be told apart, which is why the paper asks for
/// counters "several times (N2 + N3)" wide: allocations here are capped far below 2^31.
pub fn extend(wire: u32, near: u64) -> u64 {
    let delta = wire.wrapping_sub(near as u32) as i32 as i64;
    (near as i64).wrapping_add(delta) as u64
}

/// Largest allocation (N2 + N3) either end accepts: far below 2^31 so that wrap-around
/// counters stay unambiguous.
pub const MAX_ALLOCATION: u32 = 1 << 24;

/// Parse a credit-protocol datagram (`0xB7`) into its [`Repr`].
pub fn parse(bytes: &[u8]) -> Result<Repr, crate::wire::WireError> {
    Repr::parse_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extend_across_wrap() {
        assert_eq!(extend(5, 10), 5);
        assert_eq!(extend(3, (1 << 32) - 2), (1 << 32) + 3);
        assert_eq!(extend(u32::MAX, 1 << 32), (1 << 32) - 1);
        assert_eq!(extend(7, 7), 7);
    }
}
