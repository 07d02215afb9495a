//! The streams stage: TCP carried as byte streams ([`crate::stream`]) through the
//! session.
//!
//! A DATA frame travels in the stripe like an inner packet (its first byte, `0x01` to
//! `0x0F`, is no IP version), so it is paced, weighted, repaired inside the bond and
//! resequenced like the bonded traffic; the receiver hands it to its [`Streams`]
//! instead of delivering it. The other frames (OPEN, OPEN_RESULT, ACK, RESET,
//! RESET_ACK) go past the stripe on the lowest-delay channel, as flow datagrams
//! (`Session::stream_frame_out`): the streams take frames in any order, and in the
//! stripe they would wait behind the queued data and for the resequencer, at the
//! slowest channel's delay. Frames enter the stripe only while the transmit queue is
//! short ([`QUEUE_FRAMES`]): the bond's pacer, not a congestion window, sets the
//! streams' rate, and the queue they wait in stays a millisecond or two long. They are
//! never dropped or marked by the AQM: a stream's sender slows down through its peer's
//! credits, and its losses are the stream's to repair.
//!
//! An end announces in the handshake that it takes streams
//! ([`super::settings::Settings::streams`]); the driver opens one only when
//! [`Session::streams_usable`] says the peer takes them too.

use bytes::Bytes;

use super::Session;
use crate::stream::{Lane, Streams};
use crate::time::Instant;
use crate::wire::stream::{is_data, is_frame};

/// Frames held in the transmit queue at most: more wait in their streams, where a
/// reader's credit still governs them.
pub const QUEUE_FRAMES: usize = 16;
/// Datagrams waiting to be sent at most before frames stop entering the stripe
/// (without pacing, nothing else holds them back).
const OUT_FRAMES: usize = 64;

impl Session {
    /// The streams of TCP carried as byte streams, if this end takes them
    /// ([`super::Config::streams`]). After opening, accepting, writing, reading or
    /// closing streams, call [`Session::handle_streams`] so that their frames go out.
    pub fn streams(&mut self) -> Option<&mut Streams> {
        self.streams.as_mut()
    }

    /// The streams, to look at.
    pub fn streams_ref(&self) -> Option<&Streams> {
        self.streams.as_ref()
    }

    /// Streams can be opened now: this end takes them, the peer said in the handshake
    /// that it does too, and keys are ready.
    pub fn streams_usable(&self) -> bool {
        self.streams.is_some() && self.peer_streams.is_some() && self.crypto.ready()
    }

    /// Put the streams' frames that are ready into the stripe, as far as the transmit
    /// queue has room.
    pub fn handle_streams(&mut self, now: Instant) {
        self.clock = self.clock.max(now);
        let Some(mut st) = self.streams.take() else {
            return;
        };
        if self.crypto.ready() {
            st.handle_timeout(now);
            // Only the return path's backlog rule reads it, and only while a cut is in
            // force: no walk over every stream on each turn otherwise.
            if self.return_path.on.is_some() {
                self.streams_unsent = st.unsent();
            }
            let max = self.path_max_packet();
            let mut fast = self.stream_fast_len(now);
            while st.wants_to_send()
                && self.tx.pending.len() < QUEUE_FRAMES
                && self.out.len() < OUT_FRAMES
            {
                let Some((f, lane)) = st.poll_frame_lane(now, max, fast) else {
                    break;
                };
                self.counters.sent_packets += 1;
                self.counters.sent_bytes += f.len() as u64;
                self.active(now);
                let data = is_data(&f);
                if lane == Lane::Stripe || !self.stream_frame_out(&f, data) {
                    self.stripe_in(now, f);
                } else if data {
                    // Its channel may be full now.
                    fast = self.stream_fast_len(now);
                }
            }
        }
        self.streams = Some(st);
    }

    /// A delivered payload that is a stream frame goes to the streams (`true`).
    pub(super) fn stream_frame_in(&mut self, now: Instant, b: &Bytes) -> bool {
        match &mut self.streams {
            Some(st) if is_frame(b) => {
                st.handle_frame(now, b);
                true
            }
            _ => false,
        }
    }

    /// A new run of the peer (or the first): whether it takes streams; a restarted
    /// peer has none of ours any more.
    /// A new peer, or a new run of it: its streams go on only if it still has them
    /// (it announces the same streams run: a reload that changed its channel list
    /// started the run and kept them, [`Session::adopt_streams`]); else ours are reset.
    pub(super) fn streams_on_new_peer(&mut self, restart: bool, peer_streams: Option<u64>) {
        let kept = peer_streams.is_some() && peer_streams == self.peer_streams;
        self.peer_streams = peer_streams;
        if let Some(st) = &mut self.streams {
            if (restart && !kept) || peer_streams.is_none() {
                st.reset_all();
            }
        }
    }

    /// This end's streams run ([`crate::stream::StreamConfig::run`]), if it takes
    /// streams: a new run of the session that keeps the streams announces it again.
    pub fn streams_run(&self) -> Option<u64> {
        self.config().streams.as_ref().map(|s| s.run)
    }

    /// The streams, taken out: a new run of the session (a reload that changes the
    /// channel list) carries them on with [`Session::adopt_streams`].
    pub fn take_streams(&mut self) -> Option<Streams> {
        self.streams.take()
    }

    /// Carry on `old` streams from this end's earlier run, if this run takes streams.
    /// Give this run the earlier one's streams run
    /// ([`crate::stream::StreamConfig::run`]) so that the peer keeps its side; the
    /// frames lost between the runs are the streams' to repair.
    pub fn adopt_streams(&mut self, old: Option<Streams>) {
        if let (Some(st), Some(old)) = (&mut self.streams, old) {
            *st = old;
        }
    }

    /// When the streams want time.
    pub(super) fn streams_timeout(&self) -> Option<Instant> {
        self.streams.as_ref()?.poll_timeout()
    }
}
