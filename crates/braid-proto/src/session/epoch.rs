//! Epochs: choosing and switching the channel set (failover and rejoin).
//!
//! The data sender ends an epoch with an epoch-end message on every channel of the old
//! and the new set, after its last data packet there, and holds new data until the
//! receiver acknowledges; the receiver ends each old channel at its final position,
//! drains the old resequencer and starts a new one. Message formats:
//! [`crate::wire::session`].
//!
//! **The receiver acknowledges as soon as the end has come on every channel of the new
//! set**, before it has come on the old channels that leave (a channel demoted, or cut
//! by the return path, is alive and still carries the old epoch's last packets). Each
//! channel is FIFO, so whatever arrives on a new channel after its end belongs to the
//! new epoch: the receiver keeps it aside until the old epoch is drained, then feeds
//! it to the new resequencer. The sender so holds its data for the fastest new
//! channel's round trip, not for the slowest old channel's one-way delay (over 5, 20
//! and 60 ms links, 10 ms instead of 65: a TCP flow whose acknowledgements were held
//! 65 ms took the jump for a full queue and left slow start). Since the sender stops
//! sending the end once acknowledged, it sends it again each heartbeat on the old
//! channels until the peer's hellos show the new receive epoch in force (an end lost on
//! a leaving channel would otherwise keep the receiver waiting).

use std::collections::VecDeque;

use bytes::Bytes;

use super::{bit, members_of, Event, Session};
use crate::sched::Position;
use crate::stats::{ChannelStats, Stats};
use crate::time::Instant;
use crate::wire::session::{EpochAck, EpochEnd, Msg};
use crate::{Resequencer, Striper};

/// A transmit epoch switch waiting for its ack.
pub(super) struct Switch {
    pub new_epoch: u32,
    pub new_set: u64,
    /// Every set proposed for `new_epoch` (an ack for any of them completes it).
    pub proposed: Vec<u64>,
    /// Data packets sent in the old epoch.
    pub sent: u64,
    /// Final (round, deficit counter) of each old channel.
    pub finals: Vec<(u64, i64)>,
}

/// Our transmit direction.
pub(super) struct Tx {
    pub epoch: u32,
    pub set: u64,
    /// Physical channel of each striper channel.
    pub members: Vec<usize>,
    pub striper: Striper,
    pub switching: Option<Switch>,
    /// Application packets held (during a switch, or waiting for credit or a
    /// channel's pacing), with when they came.
    pub pending: VecDeque<(Bytes, Instant)>,
    /// The last epoch end, sent again each heartbeat until the peer's hellos show the
    /// new epoch in force at its receiver.
    pub lingering_end: Option<EpochEnd>,
    /// Counters of earlier epochs' stripers, per physical channel.
    pub base: Vec<ChannelStats>,
    pub changes: u64,
}

impl Tx {
    pub fn new(set: u64, members: Vec<usize>, striper: Striper, n: usize) -> Tx {
        Tx {
            epoch: 0,
            set,
            members,
            striper,
            switching: None,
            pending: VecDeque::new(),
            lingering_end: None,
            base: vec![ChannelStats::default(); n],
            changes: 0,
        }
    }

    /// Add the current striper's counters to `base` (before it is replaced).
    fn account(&mut self) {
        for (k, &p) in self.members.iter().enumerate() {
            self.base[p] += &self.striper.stats().channels[k];
        }
    }
}

/// Our receive direction.
pub(super) struct Rx {
    pub epoch: u32,
    pub set: u64,
    /// Resequencer channel of each physical channel in the set.
    pub index: Vec<Option<usize>>,
    pub reseq: Resequencer,
    /// The epoch end received, while we wait for it on every new channel.
    pub pending: Option<EpochEnd>,
    /// Channels on which the pending end arrived.
    pub end_seen: u64,
    /// Old channels already ended in the resequencer.
    pub ended: u64,
    /// The pending switch was acknowledged before the old epoch was drained (the end
    /// came on every new channel first); its new set is then fixed.
    pub early_acked: bool,
    /// What came on a new channel after its end while the old epoch was still being
    /// drained: (channel, packet, arrival), for the new resequencer.
    pub early: VecDeque<(usize, Bytes, Instant)>,
    /// Counters of earlier epochs' resequencers.
    pub base: Vec<ChannelStats>,
    pub base_global: Stats,
    /// Packets left undeliverable at an epoch switch.
    pub switch_lost: u64,
    pub changes: u64,
}

impl Rx {
    pub fn new(set: u64, reseq: Resequencer, n: usize) -> Rx {
        Rx {
            epoch: 0,
            set,
            index: (0..n).map(Some).collect(),
            reseq,
            pending: None,
            end_seen: 0,
            ended: 0,
            early_acked: false,
            early: VecDeque::new(),
            base: vec![ChannelStats::default(); n],
            base_global: Stats::new(0),
            switch_lost: 0,
            changes: 0,
        }
    }

    /// Add the current resequencer's counters to the bases (before it is replaced).
    fn account(&mut self) {
        let s = self.reseq.stats();
        for (p, k) in self.index.iter().enumerate() {
            if let Some(k) = *k {
                self.base[p] += &s.channels[k];
            }
        }
        self.base_global += s;
    }
}

impl Session {
    /// The channels both ends have, as a set (every channel unless the peer's run
    /// has fewer).
    pub(super) fn common_set(&self) -> u64 {
        if self.common >= self.n {
            self.all
        } else {
            bit(self.common) - 1
        }
    }

    /// The striper/resequencer configuration for an epoch over `members` (of the
    /// common channels).
    fn stripe(&self, members: &[usize]) -> crate::StripeConfig {
        self.cfg.stripe_config_over(members, self.common)
    }

    /// The peer restarted (or its run has another channel list): both directions start
    /// over at epoch 0 over every channel both ends have.
    pub(super) fn reset_epochs(&mut self, now: Instant) {
        let members: Vec<usize> = (0..self.common).collect();
        let set = self.common_set();
        let sc = self.stripe(&members);
        self.tx.account();
        self.tx.striper = Striper::new(sc.clone()).expect("validated");
        self.loss_free_since = None;
        self.tx.epoch = 0;
        self.tx.set = set;
        self.tx.members = members;
        self.tx.switching = None;
        self.tx.lingering_end = None;
        self.reapply_quanta();
        self.rx.account();
        self.rx.reseq = Resequencer::new(&sc).expect("validated");
        // The new resequencer holds with the same repair margin as the old one.
        self.repair_margin();
        self.rx.epoch = 0;
        self.rx.set = set;
        let common = self.common;
        self.rx.index = (0..self.n).map(|i| (i < common).then_some(i)).collect();
        self.rx.pending = None;
        self.rx.end_seen = 0;
        self.rx.ended = 0;
        self.rx.early_acked = false;
        self.rx.early.clear();
        self.credit_new_tx(0);
        self.credit_new_rx(0);
        self.pump(now);
    }

    // ---- transmit direction: choosing and switching the channel set ----

    pub(super) fn maybe_switch(&mut self, now: Instant) {
        let reported = self
            .peer
            .report_at
            .is_some_and(|at| now - at <= self.dead_after_now());
        // Without a fresh report from the peer, only to take out channels whose uplink
        // is gone (we know that ourselves): right after a handshake the set is every
        // channel, and what it striped onto a gone one until the peer's first hello
        // was lost.
        let gone_in_set = self.peer.seen && self.uplink_down & self.tx.set != 0;
        if !reported && !gone_in_set {
            return;
        }
        // Demoted channels stay out while another channel is there (`super::demote`);
        // a return direction rides one channel (`super::return_path`).
        // Nor do channels whose uplink is gone (`Session::set_uplink`), though the peer
        // still hears us on them until its `dead_after`.
        // Nor channels the peer's run does not have (`Session::on_new_peer`).
        let heard = self.peer.mask & self.common_set() & !self.uplink_down;
        let desired = self.with_return_path(self.without_demoted(heard));
        if desired == 0 {
            return;
        }
        if let Some(sw) = &mut self.tx.switching {
            if desired != sw.new_set {
                self.events.push_back(Event::TxRetarget {
                    epoch: sw.new_epoch,
                    to: desired,
                });
                sw.new_set = desired;
                if !sw.proposed.contains(&desired) {
                    sw.proposed.push(desired);
                }
                self.send_end();
            }
            return;
        }
        if desired != self.tx.set {
            self.start_switch(desired);
        }
    }

    fn start_switch(&mut self, new_set: u64) {
        // Final markers/triggers of the old epoch on its channels.
        self.tx.striper.flush();
        self.take_transmits();
        let k = self.tx.members.len();
        let finals = match self.tx.striper.scheduler() {
            Some(s) => (0..k)
                .map(|i| {
                    let p = s.position(i);
                    (p.round, p.dc)
                })
                .collect(),
            None => vec![(0, 1); k],
        };
        let sw = Switch {
            new_epoch: self.tx.epoch.wrapping_add(1),
            new_set,
            proposed: vec![new_set],
            sent: self.tx.striper.packets_sent(),
            finals,
        };
        self.events.push_back(Event::TxSwitchStarted {
            epoch: self.tx.epoch,
            from: self.tx.set,
            to: new_set,
            sent: sw.sent,
        });
        self.tx.switching = Some(sw);
        self.send_end();
    }

    /// The end of the current epoch that `sw` proposes, towards `new_set`.
    fn epoch_end(&self, sw: &Switch, new_set: u64) -> EpochEnd {
        EpochEnd {
            channel: 0,
            old_epoch: self.tx.epoch,
            new_epoch: sw.new_epoch,
            old_set: self.tx.set,
            new_set,
            sent: sw.sent,
            finals: sw.finals.clone(),
        }
    }

    pub(super) fn send_end(&mut self) {
        let Some(sw) = &self.tx.switching else {
            return;
        };
        let base = self.epoch_end(sw, sw.new_set);
        self.send_end_msg(&base);
    }

    fn send_end_msg(&mut self, base: &EpochEnd) {
        for c in members_of(base.old_set | base.new_set) {
            let mut e = base.clone();
            e.channel = c as u8;
            self.send_ctrl(c, &Msg::End(e));
        }
    }

    /// Each heartbeat: the last epoch's end again, until the peer's receiver is past it.
    pub(super) fn send_lingering_end(&mut self) {
        if let Some(e) = self.tx.lingering_end.clone() {
            self.send_end_msg(&e);
        }
    }

    /// The peer's hello says its receive epoch is `rx_epoch`.
    pub(super) fn peer_rx_epoch(&mut self, rx_epoch: u32) {
        let past = self
            .tx
            .lingering_end
            .as_ref()
            .is_some_and(|e| rx_epoch.wrapping_sub(e.new_epoch) < u32::MAX / 2);
        if past {
            self.tx.lingering_end = None;
        }
    }

    pub(super) fn tx_on_ack(&mut self, a: EpochAck, now: Instant) {
        let Some(sw) = &self.tx.switching else {
            return;
        };
        if a.epoch != sw.new_epoch || !sw.proposed.contains(&a.set) || a.set == 0 {
            return;
        }
        let new_epoch = sw.new_epoch;
        self.tx.lingering_end = Some(self.epoch_end(sw, a.set));
        self.tx.account();
        let members = members_of(a.set & self.common_set());
        self.tx.striper = Striper::new(self.stripe(&members)).expect("validated");
        self.loss_free_since = None;
        self.tx.striper.set_epoch(new_epoch);
        self.tx.epoch = new_epoch;
        self.tx.set = a.set;
        self.tx.members = members;
        self.reapply_quanta();
        self.tx.switching = None;
        self.tx.changes += 1;
        self.credit_new_tx(new_epoch);
        self.events.push_back(Event::TxEpoch {
            epoch: new_epoch,
            set: a.set,
            held: self.tx.pending.len(),
        });
        self.pump(now);
        self.maybe_switch(now);
    }

    // ---- receive direction ----

    /// Acknowledge the receive epoch in force on every channel: the peer may hear us on
    /// a channel we do not hear it on (a link cut in one direction), and an ack sent only
    /// on the receive set's channels was lost for good when those were cut towards the
    /// peer: its switch then waited for ever, and nothing it sent was delivered.
    fn send_ack_all(&mut self) {
        for c in 0..self.n {
            let m = Msg::Ack(EpochAck {
                channel: c as u8,
                epoch: self.rx.epoch,
                set: self.rx.set,
            });
            self.send_ctrl(c, &m);
        }
    }

    pub(super) fn rx_on_end(&mut self, c: usize, e: EpochEnd, now: Instant) {
        if e.new_epoch == self.rx.epoch {
            // A retransmission after we switched (our ack was lost or crossed a
            // retarget): acknowledge what is in force.
            self.send_ack_all();
            return;
        }
        let members = self.rx.index.iter().filter(|k| k.is_some()).count();
        if e.old_epoch != self.rx.epoch
            || e.old_set != self.rx.set
            || e.finals.len() != members
            || e.new_set & !self.common_set() != 0
        {
            return;
        }
        if self.rx.pending.is_none() {
            self.events.push_back(Event::RxEpochEnding {
                epoch: self.rx.epoch,
            });
        }
        let mut e = e;
        if let (true, Some(p)) = (self.rx.early_acked, &self.rx.pending) {
            // Acknowledged already: a retarget that crossed our ack changes nothing
            // (the sender takes any set it proposed), and the ack may have been lost.
            e.new_set = p.new_set;
            self.send_early_ack(&e);
        }
        self.rx.pending = Some(e);
        if self.rx.end_seen & bit(c) == 0 {
            self.rx.end_seen |= bit(c);
            if self.rx.set & bit(c) != 0 {
                self.end_channel(c, now);
            }
        }
        self.rx_maybe_commit(now);
    }

    /// Commit the pending switch once its end has come on every channel of the new set,
    /// and on every old channel we still hear the peer on: a channel that left the set
    /// for being a net cost (`super::demote`) still carries the old epoch's last data,
    /// which must reach the old resequencer before it is drained. (A channel that left
    /// because it died is down here too: nothing more comes on it, nothing waits.)
    pub(super) fn rx_maybe_commit(&mut self, now: Instant) {
        let Some(p) = &self.rx.pending else {
            return;
        };
        let up = self
            .chans
            .iter()
            .enumerate()
            .filter(|(_, c)| c.state == super::LinkState::Up)
            .fold(0, |m, (i, _)| m | bit(i));
        let wait_for = p.new_set | (p.old_set & up);
        if wait_for & !self.rx.end_seen == 0 {
            self.commit_rx(now);
        } else if p.new_set & !self.rx.end_seen == 0 && !self.rx.early_acked {
            // The end came on every new channel: what comes on them next is the new
            // epoch's, and can wait here for the old one to drain (module docs).
            let p = p.clone();
            self.rx.early_acked = true;
            self.send_early_ack(&p);
        }
    }

    /// Acknowledge the pending switch before the old epoch is drained, on every channel
    /// (as `send_ack_all`).
    fn send_early_ack(&mut self, p: &EpochEnd) {
        for c in 0..self.n {
            let m = Msg::Ack(EpochAck {
                channel: c as u8,
                epoch: p.new_epoch,
                set: p.new_set,
            });
            self.send_ctrl(c, &m);
        }
    }

    /// A packet that came on channel `c` after the pending end did there: the new
    /// epoch's, kept for the new resequencer once acknowledged (`false`: not ours to
    /// keep).
    pub(super) fn keep_early(&mut self, c: usize, pkt: Bytes, arrived: Instant) -> bool {
        let set = match &self.rx.pending {
            Some(p) if self.rx.early_acked => p.new_set,
            _ => return false,
        };
        if set & bit(c) == 0 {
            return false;
        }
        let room = self.cfg.receiver.buffer_packets * set.count_ones() as usize;
        if self.rx.early.len() < room {
            self.rx.early.push_back((c, pkt, arrived));
        } else {
            self.rx.switch_lost += 1;
        }
        true
    }

    /// Tell the resequencer that nothing more comes on old channel `c` in this epoch:
    /// its next packet would have had the final position named in the epoch end.
    fn end_channel(&mut self, c: usize, now: Instant) {
        if self.rx.ended & bit(c) != 0 {
            return;
        }
        self.rx.ended |= bit(c);
        let (Some(k), Some(p)) = (self.rx.index[c], &self.rx.pending) else {
            return;
        };
        let (round, dc) = p.finals[k];
        let sent = p.sent;
        self.rx
            .reseq
            .end_channel(now, k, Position { round, dc }, sent);
        self.drain_deliver(now);
    }

    fn commit_rx(&mut self, now: Instant) {
        let Some(p) = self.rx.pending.clone() else {
            return;
        };
        for c in members_of(self.rx.set) {
            self.end_channel(c, now);
        }
        // Nothing more arrives for the old epoch: deliver what it can, in order, and
        // give up on whatever the dead channels took with them.
        self.rx.reseq.drain(now);
        self.drain_deliver(now);
        self.rx.switch_lost += self.rx.reseq.buffered() as u64;
        self.rx.account();
        let members = members_of(p.new_set);
        self.rx.reseq = Resequencer::new(&self.stripe(&members)).expect("validated");
        self.rx.reseq.set_epoch(p.new_epoch);
        // The new resequencer holds with the old one's repair margin from its first
        // datagram, not from the next heartbeat: until then the traffic would come out
        // the margin sooner, and the flow's round trip dip and come back (a TCP flow in
        // slow start took the come-back for a queue: HyStart).
        self.repair_margin();
        self.rx.index = vec![None; self.n];
        for (k, &m) in members.iter().enumerate() {
            self.rx.index[m] = Some(k);
        }
        self.rx.epoch = p.new_epoch;
        self.rx.set = p.new_set;
        self.credit_new_rx(p.new_epoch);
        self.rx.pending = None;
        self.rx.end_seen = 0;
        self.rx.ended = 0;
        self.rx.early_acked = false;
        self.rx.changes += 1;
        self.events.push_back(Event::RxEpoch {
            epoch: p.new_epoch,
            set: p.new_set,
        });
        self.send_ack_all();
        // What the new epoch sent while the old one drained, in arrival order.
        for (c, pkt, arrived) in std::mem::take(&mut self.rx.early) {
            self.resequence(c, pkt, now, arrived, false);
        }
    }
}
