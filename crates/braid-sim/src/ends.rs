//! The two ends of a simulated run: a bare striper and resequencer (the papers'
//! experiments), or two whole session machines talking both ways (failover runs).

use std::collections::VecDeque;

use braid_proto::session::{DatagramKind, Event, Session};
use braid_proto::{Instant, Resequencer, Striper, TransmitKind};
use bytes::Bytes;

use crate::model::Nanos;
use crate::run::{CreditResult, NotDelivered, SessionResult};

/// One datagram from the sender for a forward channel.
pub(crate) struct Outgoing {
    pub channel: usize,
    pub data: Bytes,
    /// Markers, triggers and session messages (not application data).
    pub control: bool,
}

/// A link-down period of one channel, and what the session did about it.
struct Episode {
    channel: usize,
    start: Nanos,
    end: Nanos,
    failover_at: Option<Nanos>,
    rejoin_at: Option<Nanos>,
}

/// Two session machines and the reverse direction of every channel.
pub(crate) struct SessionEnds {
    pub a: Session,
    pub b: Session,
    /// Per channel: datagrams from B to A in flight, with their arrival times.
    pub back: Vec<VecDeque<(Nanos, Bytes)>>,
    /// The channels, for their (possibly changing) delay on the way back.
    links: Vec<crate::model::ChannelSpec>,
    down: Vec<Vec<(Nanos, Nanos)>>,
    episodes: Vec<Episode>,
    /// Bit per packet id delivered so far.
    seen: Vec<u64>,
    duplicates: u64,
}

impl SessionEnds {
    pub fn new(a: Session, b: Session, links: Vec<crate::model::ChannelSpec>) -> Self {
        let down: Vec<Vec<(Nanos, Nanos)>> = links.iter().map(|c| c.down.clone()).collect();
        let mut episodes: Vec<Episode> = down
            .iter()
            .enumerate()
            .flat_map(|(channel, d)| {
                d.iter().map(move |&(start, end)| Episode {
                    channel,
                    start,
                    end,
                    failover_at: None,
                    rejoin_at: None,
                })
            })
            .collect();
        episodes.sort_by_key(|e| (e.start, e.channel));
        SessionEnds {
            a,
            b,
            back: vec![VecDeque::new(); links.len()],
            links,
            down,
            episodes,
            seen: Vec::new(),
            duplicates: 0,
        }
    }

    /// Is channel `c` down at `t` (both directions)?
    pub fn is_down(&self, c: usize, t: Nanos) -> bool {
        self.down[c].iter().any(|&(a, b)| t >= a && t < b)
    }

    /// The sender's next datagram; notes when data goes on a channel again after a
    /// down period.
    fn poll_forward(&mut self, now: Nanos) -> Option<Outgoing> {
        let t = self.a.poll_transmit()?;
        if t.kind == DatagramKind::Data {
            for e in &mut self.episodes {
                if e.channel == t.channel && e.end <= now && e.rejoin_at.is_none() {
                    e.rejoin_at = Some(now);
                }
            }
        }
        Some(Outgoing {
            channel: t.channel,
            control: !matches!(
                t.kind,
                DatagramKind::Data | DatagramKind::Repair | DatagramKind::Flow
            ),
            data: t.bytes,
        })
    }

    /// Note the sender's events: an epoch end that leaves a down channel out is its
    /// failover.
    fn note_events(&mut self, now: Nanos) {
        while let Some(ev) = self.a.poll_event() {
            if let Event::TxSwitchStarted { to, .. } = ev {
                for e in &mut self.episodes {
                    if e.start <= now && e.failover_at.is_none() && to & (1u64 << e.channel) == 0 {
                        e.failover_at = Some(now);
                    }
                }
            }
        }
        while self.b.poll_event().is_some() {}
    }

    /// Count a delivery of packet `id`; true if it was delivered before.
    pub fn duplicate(&mut self, id: u64) -> bool {
        let (w, b) = ((id / 64) as usize, id % 64);
        if self.seen.len() <= w {
            self.seen.resize(w + 1, 0);
        }
        let dup = self.seen[w] & (1 << b) != 0;
        self.seen[w] |= 1 << b;
        self.duplicates += u64::from(dup);
        dup
    }

    /// The session's figures; `delivered`: packets the receiving end delivered.
    pub fn result(&self, delivered: u64) -> SessionResult {
        let ms = |a: Nanos, b: Option<Nanos>| b.map(|b| (b.saturating_sub(a)) as f64 / 1e6);
        let st = self.a.stats(Instant::ZERO);
        let credits = st.credits.map(|tx| {
            let b = self.b.stats(Instant::ZERO);
            let rx = b.credits.unwrap_or_default();
            CreditResult {
                receiver_overflow: b
                    .channels
                    .iter()
                    .map(|c| c.resequencer.overflow_drops)
                    .sum(),
                receiver_high_water: b
                    .channels
                    .iter()
                    .map(|c| c.resequencer.buffer_high_water)
                    .max()
                    .unwrap_or(0),
                credit_stalls: tx.stalls,
                credits_sent: rx.credits_sent,
                credit_refused: rx.refused,
                sender_queue_drops: st.queue_drops,
            }
        });
        SessionResult {
            credits,
            failover_ms: self
                .episodes
                .iter()
                .map(|e| ms(e.start, e.failover_at))
                .collect(),
            rejoin_ms: self
                .episodes
                .iter()
                .map(|e| ms(e.end, e.rejoin_at))
                .collect(),
            duplicates: self.duplicates,
            epoch_changes: st.tx_epoch_changes,
            quanta_changes: st.quanta_changes,
            final_quanta: st.channels.iter().map(|c| c.quantum).collect(),
            not_delivered: self.not_delivered(&st, delivered),
        }
    }

    fn not_delivered(
        &self,
        st: &braid_proto::session::SessionStats,
        delivered: u64,
    ) -> NotDelivered {
        let b = self.b.stats(Instant::ZERO);
        let mut n = NotDelivered {
            offered: st.sent_packets,
            sender_queue: st.queue_drops,
            pacer: st.pacing.map_or(0, |p| p.drops),
            receiver_aqm: b.aqm.as_ref().map_or(0, |a| a.drops),
            receiver_gave_up: b.lost,
            lost_unseen: 0,
        };
        let counted = delivered + n.sender_queue + n.pacer + n.receiver_aqm + n.receiver_gave_up;
        n.lost_unseen = n.offered.saturating_sub(counted);
        n
    }

    /// Reverse datagrams from B, with the time each arrives at A (`None`: lost because
    /// the channel is down).
    fn poll_back(&mut self, now: Nanos) -> Option<(usize, Option<Nanos>, Bytes)> {
        let t = self.b.poll_transmit()?;
        let c = t.channel;
        let last = self.back[c].back().map_or(0, |x| x.0);
        let at = (!self.is_down(c, now)).then(|| (now + self.links[c].delay_at(now)).max(last));
        Some((t.channel, at, t.bytes))
    }
}

/// What runs at the two ends.
pub(crate) enum Ends {
    /// One striper, one resequencer, one direction (the papers' experiments).
    Bare {
        striper: Box<Striper>,
        reseq: Box<Resequencer>,
    },
    /// Two session machines.
    Session(Box<SessionEnds>),
}

impl Ends {
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self {
            Ends::Bare { striper, reseq } => match (striper.poll_timeout(), reseq.poll_timeout()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            Ends::Session(s) => Some(s.a.poll_timeout().min(s.b.poll_timeout())),
        }
    }

    /// Timers of the sender side (markers, hellos). The receiver's fire in
    /// [`Ends::receiver_timeout`], after the sender's datagrams have been queued.
    pub fn sender_timeout(&mut self, now: Instant) {
        match self {
            Ends::Bare { striper, .. } => striper.handle_timeout(now),
            Ends::Session(s) => {
                if now >= s.a.poll_timeout() {
                    s.a.handle_timeout(now);
                }
            }
        }
    }

    pub fn receiver_timeout(&mut self, now: Instant) {
        match self {
            Ends::Bare { reseq, .. } => reseq.handle_timeout(now),
            Ends::Session(s) => {
                if now >= s.b.poll_timeout() {
                    s.b.handle_timeout(now);
                }
            }
        }
    }

    /// The sender's next datagram for a forward channel.
    #[inline]
    pub fn poll_forward(&mut self, now: Nanos) -> Option<Outgoing> {
        match self {
            Ends::Bare { striper, .. } => {
                let t = striper.poll_transmit()?;
                let control = t.kind != TransmitKind::Data;
                // Header-free datagrams move without touching the reference count.
                let data = if t.header().is_empty() {
                    t.payload
                } else {
                    t.to_bytes()
                };
                Some(Outgoing {
                    channel: t.channel,
                    data,
                    control,
                })
            }
            Ends::Session(s) => {
                s.note_events(now);
                s.poll_forward(now)
            }
        }
    }

    /// The receiver's next datagram for the reverse direction (session runs only).
    pub fn poll_back(&mut self, now: Nanos) -> Option<(usize, Option<Nanos>, Bytes)> {
        match self {
            Ends::Bare { .. } => None,
            Ends::Session(s) => {
                s.note_events(now);
                s.poll_back(now)
            }
        }
    }

    /// A datagram arrives at the receiver on forward channel `ch`.
    #[inline]
    pub fn arrive(&mut self, now: Instant, ch: usize, data: Bytes) {
        match self {
            Ends::Bare { reseq, .. } => reseq.handle_datagram(now, ch, data),
            Ends::Session(s) => s.b.handle_datagram(now, ch, data),
        }
    }

    /// The next packet for the receiving application.
    #[inline]
    pub fn poll_deliver(&mut self) -> Option<Bytes> {
        match self {
            Ends::Bare { reseq, .. } => reseq.poll_deliver(),
            Ends::Session(s) => s.b.poll_deliver(),
        }
    }
}
