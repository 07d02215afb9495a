//! Error-control counters. Each end fills its own part; `+=` totals them.

use std::ops::AddAssign;

/// Counters of a [`super::Sender`] or a [`super::Receiver`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Sender: data packets sent for the first time.
    pub packets_sent: u64,
    /// Sender: data packets sent again after a SNAK.
    pub retransmissions: u64,
    /// Sender: keep-alive and end-of-stream packets sent.
    pub keepalives_sent: u64,
    /// Sender: SNAKs accepted.
    pub snaks_received: u64,
    /// Sender: SNAKs rejected: unparsable, ranges reversed, overlapping, naming packets
    /// not yet sent, or a segment not yet sent or beyond the window.
    pub snaks_rejected: u64,
    /// Sender: SNAKs for segments already released or given up (harmless, ignored).
    pub snaks_stale: u64,
    /// Sender: requested packets not sent again because their last copy left less than
    /// one round trip ago.
    pub premature_requests: u64,
    /// Sender: PACKs accepted.
    pub packs_received: u64,
    /// Sender: PACKs rejected (acknowledging segments not yet sent, or unparsable).
    pub packs_rejected: u64,
    /// Sender: segments given up at the deadline before being acknowledged.
    pub segments_expired: u64,
    /// Receiver: data packets received (duplicates included).
    pub packets_received: u64,
    /// Receiver: data packets that were already present or delivered.
    pub duplicates: u64,
    /// Receiver: packets for segments beyond the window or after the end of stream.
    pub out_of_window: u64,
    /// Receiver: datagrams that could not be parsed, or with another segment length.
    pub malformed: u64,
    /// Receiver: shipment gaps larger than the resequencing distance.
    pub gaps: u64,
    /// Receiver: loss timer expiries.
    pub loss_timeouts: u64,
    /// Receiver: SNAKs sent.
    pub snaks_sent: u64,
    /// Receiver: PACKs sent.
    pub packs_sent: u64,
    /// Receiver: control datagrams dropped because the driver did not poll them.
    pub control_dropped: u64,
    /// Receiver: end-of-stream acknowledgements sent (see [`super::Sender::is_done`]).
    pub end_acks_sent: u64,
    /// Receiver: losses repaired: packets a SNAK requested that arrived in a copy
    /// shipped after the request.
    pub packets_repaired: u64,
    /// Receiver: packets a SNAK requested whose original copy arrived late (reordered,
    /// not lost).
    pub late_after_request: u64,
    /// Receiver: segments delivered to the application.
    pub segments_delivered: u64,
    /// Receiver: packets lost but accepted within the tolerance.
    pub packets_tolerated: u64,
    /// Receiver: packets still missing when their segment's deadline passed.
    pub packets_given_up: u64,
    /// Receiver: segments given up at the deadline.
    pub segments_forced: u64,
    /// Receiver: segments delivered with more holes than the tolerance allows (only
    /// possible for segments given up at the deadline).
    pub violations: u64,
}

impl AddAssign<&Stats> for Stats {
    /// Add every counter.
    fn add_assign(&mut self, rhs: &Stats) {
        // Destructured so that a new field cannot be forgotten here.
        let Stats {
            packets_sent,
            retransmissions,
            keepalives_sent,
            snaks_received,
            snaks_rejected,
            snaks_stale,
            premature_requests,
            packs_received,
            packs_rejected,
            segments_expired,
            packets_received,
            duplicates,
            out_of_window,
            malformed,
            gaps,
            loss_timeouts,
            snaks_sent,
            packs_sent,
            control_dropped,
            end_acks_sent,
            packets_repaired,
            late_after_request,
            segments_delivered,
            packets_tolerated,
            packets_given_up,
            segments_forced,
            violations,
        } = rhs;
        self.packets_sent += packets_sent;
        self.retransmissions += retransmissions;
        self.keepalives_sent += keepalives_sent;
        self.snaks_received += snaks_received;
        self.snaks_rejected += snaks_rejected;
        self.snaks_stale += snaks_stale;
        self.premature_requests += premature_requests;
        self.packs_received += packs_received;
        self.packs_rejected += packs_rejected;
        self.segments_expired += segments_expired;
        self.packets_received += packets_received;
        self.duplicates += duplicates;
        self.out_of_window += out_of_window;
        self.malformed += malformed;
        self.gaps += gaps;
        self.loss_timeouts += loss_timeouts;
        self.snaks_sent += snaks_sent;
        self.packs_sent += packs_sent;
        self.control_dropped += control_dropped;
        self.end_acks_sent += end_acks_sent;
        self.packets_repaired += packets_repaired;
        self.late_after_request += late_after_request;
        self.segments_delivered += segments_delivered;
        self.packets_tolerated += packets_tolerated;
        self.packets_given_up += packets_given_up;
        self.segments_forced += segments_forced;
        self.violations += violations;
    }
}

impl AddAssign for Stats {
    fn add_assign(&mut self, rhs: Stats) {
        *self += &rhs;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_up() {
        let mut a = Stats {
            retransmissions: 2,
            violations: 1,
            ..Stats::default()
        };
        a += Stats {
            retransmissions: 3,
            snaks_sent: 4,
            ..Stats::default()
        };
        assert_eq!(a.retransmissions, 5);
        assert_eq!(a.snaks_sent, 4);
        assert_eq!(a.violations, 1);
    }
}
