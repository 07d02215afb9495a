//! The sending half of a stream: the bytes written and not yet acknowledged, the
//! frames in flight, loss detection (RACK-style, by time) and the retransmission timer.

use std::collections::VecDeque;

use super::rtt::Rtt;
use crate::time::{Duration, Instant};
use crate::wire::stream::Ack;

/// One DATA frame in flight: its bytes `[off, off + len)`, and the FIN if `fin`.
#[derive(Debug, Clone, Copy)]
struct Seg {
    off: u64,
    len: u64,
    fin: bool,
    /// Transmission number of its latest sending (orders frames across retransmits).
    tx: u64,
    /// When it was last sent.
    sent: Instant,
    /// When it was first sent.
    first_sent: Instant,
    /// It was sent more than once.
    rtx: bool,
    /// The receiver holds it above a hole (SACK).
    sacked: bool,
    /// Declared lost, waiting to be sent again.
    lost: bool,
    /// Its latest sending took the fast lane (`stream::lane`): no round-trip sample.
    fast: bool,
}

/// A frame for [`SendSide`] to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Out {
    pub off: u64,
    pub len: u64,
    pub fin: bool,
}

/// What an ACK did.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Acked {
    /// The cumulative point, a SACK or the credit limit moved.
    pub progress: bool,
}

/// The frames one ACK newly covered, as far as loss detection cares.
struct Newly {
    now: Instant,
    /// The RACK reference before this ACK.
    rack: Option<(u64, u64)>,
    /// The newest frame covered (by transmission).
    newest: Option<Seg>,
    /// The largest delay beyond the reference of a frame sent before it.
    reorder: u64,
    /// The smallest round trip seen so far.
    min_rtt: u64,
    /// A retransmission acknowledged sooner than any round trip: not needed.
    spurious: bool,
    /// Round trips of the frames sent once, summed, and their number.
    rtt_sum: u64,
    rtt_n: u64,
}

impl Newly {
    fn new(now: Instant, rack: Option<(u64, u64)>, min_rtt: u64) -> Newly {
        Newly {
            now,
            rack,
            newest: None,
            reorder: 0,
            min_rtt,
            spurious: false,
            rtt_sum: 0,
            rtt_n: 0,
        }
    }

    /// The ACK's round-trip sample: the mean over the frames it covers that were sent
    /// once (one sample per ACK, so a burst does not swamp the variation).
    fn sample(&self) -> Option<u64> {
        (self.rtt_n > 0).then(|| self.rtt_sum / self.rtt_n)
    }

    /// A frame the ACK newly covers.
    fn note(&mut self, s: &Seg) {
        if self.newest.is_none_or(|n| s.tx > n.tx) {
            self.newest = Some(*s);
        }
        let since = |t: Instant| self.now.saturating_since(t).as_micros();
        // Which copy got there: the first, unless the retransmission is known to have.
        let took = if !s.rtx {
            // The shared estimate is the stripe's: a bulk stream's timeout follows it.
            if !s.fast {
                self.rtt_sum += since(s.sent);
                self.rtt_n += 1;
            }
            since(s.sent)
        } else if since(s.sent) < self.min_rtt {
            self.spurious = true;
            since(s.first_sent)
        } else {
            return;
        };
        if let Some((tx, reference)) = self.rack {
            if s.tx < tx || s.rtx {
                self.reorder = self.reorder.max(took.saturating_sub(reference));
            }
        }
    }
}

/// Send state of one stream. The buffer is allocated as bytes are written and given
/// back once all are acknowledged.
#[derive(Debug)]
pub(super) struct SendSide {
    /// Bytes `[una, written)`.
    buf: VecDeque<u8>,
    /// Every byte below this is acknowledged.
    pub una: u64,
    /// The next byte never sent.
    pub nxt: u64,
    /// The end of the bytes written by the application.
    pub written: u64,
    /// The application finished: FIN after the last byte.
    pub fin_wanted: bool,
    pub fin_sent: bool,
    /// Every byte and the FIN are acknowledged.
    pub fin_acked: bool,
    /// The peer's credit limit: bytes below it may be sent.
    pub limit: u64,
    /// Frames in flight, by offset (they never overlap).
    segs: VecDeque<Seg>,
    /// Frames declared lost and not sent again yet.
    pub lost: usize,
    /// Retransmission timeouts in a row.
    pub backoff: u32,
    pub rto_at: Option<Instant>,
    /// When loss detection looks again (a frame still within its reorder allowance).
    pub rack_at: Option<Instant>,
    /// The most recently sent frame acknowledged: its transmission number and round
    /// trip (microseconds).
    rack: Option<(u64, u64)>,
    /// Send a probe (an empty DATA frame): no credit, nothing in flight.
    pub probe_due: bool,
    /// Last sign of life from the peer while we wait for it.
    pub last_progress: Instant,
    /// Waiting for an answer (frames in flight, a probe, an OPEN).
    pub waiting: bool,
    /// `write` took less than offered: tell the application when there is room.
    pub want_writable: bool,
}

impl SendSide {
    pub fn new(now: Instant) -> SendSide {
        SendSide {
            buf: VecDeque::new(),
            una: 0,
            nxt: 0,
            written: 0,
            fin_wanted: false,
            fin_sent: false,
            fin_acked: false,
            limit: 0,
            segs: VecDeque::new(),
            lost: 0,
            backoff: 0,
            rto_at: None,
            rack_at: None,
            rack: None,
            probe_due: false,
            last_progress: now,
            waiting: false,
            want_writable: false,
        }
    }

    /// Bytes held (written and not acknowledged).
    pub fn buffered(&self) -> u64 {
        self.written - self.una
    }

    /// How many bytes may be held: the peer's credit beyond what it acknowledged, but
    /// at least `min`.
    pub fn capacity(&self, min: u64) -> u64 {
        self.limit.saturating_sub(self.una).max(min)
    }

    /// Room for more bytes from the application.
    pub fn room(&self, min: u64) -> u64 {
        self.capacity(min).saturating_sub(self.buffered())
    }

    /// Take up to the room of `data`; note when less was taken.
    pub fn write(&mut self, data: &[u8], min: u64) -> usize {
        let n = (self.room(min) as usize).min(data.len());
        self.buf.extend(&data[..n]);
        self.written += n as u64;
        if n < data.len() {
            self.want_writable = true;
        }
        n
    }

    /// Bytes of heap the stream's send side holds (tests: an idle stream holds none).
    #[cfg(test)]
    pub fn allocated(&self) -> usize {
        self.buf.capacity() + self.segs.capacity() * core::mem::size_of::<Seg>()
    }

    /// Frames in flight (sent, not acknowledged).
    pub fn in_flight(&self) -> bool {
        !self.segs.is_empty()
    }

    /// Bytes wait but the peer gave no credit for them, and nothing is in flight that
    /// would bring an ACK.
    pub fn blocked(&self) -> bool {
        self.segs.is_empty() && self.nxt < self.written && self.nxt >= self.limit
    }

    /// A new frame (or a probe) can go out.
    pub fn has_new(&self) -> bool {
        self.probe_due
            || (self.nxt < self.written && self.nxt < self.limit)
            || (self.fin_wanted && !self.fin_sent && self.nxt == self.written)
    }

    /// The next new frame, with at most `room` bytes, sent now as transmission `tx`.
    /// A probe is an empty frame without FIN, not kept in flight.
    /// `fast`: it takes the fast lane.
    pub fn next_new(&mut self, now: Instant, tx: u64, room: u64, fast: bool) -> Option<Out> {
        if self.probe_due {
            self.probe_due = false;
            return Some(Out {
                off: self.nxt,
                len: 0,
                fin: false,
            });
        }
        let len = self
            .written
            .min(self.limit)
            .saturating_sub(self.nxt)
            .min(room);
        let fin = self.fin_wanted && !self.fin_sent && self.nxt + len == self.written;
        if len == 0 && !fin {
            return None;
        }
        let off = self.nxt;
        self.segs.push_back(Seg {
            off,
            len,
            fin,
            tx,
            sent: now,
            first_sent: now,
            rtx: false,
            sacked: false,
            lost: false,
            fast,
        });
        self.nxt += len;
        self.fin_sent |= fin;
        Some(Out { off, len, fin })
    }

    /// The first frame declared lost, cut to `room` bytes, sent again now as `tx`.
    /// `fast`: it takes the fast lane.
    pub fn next_rtx(&mut self, now: Instant, tx: u64, room: u64, fast: bool) -> Option<Out> {
        let i = self.segs.iter().position(|s| s.lost)?;
        let s = &mut self.segs[i];
        if s.len > room {
            if room == 0 {
                return None;
            }
            let tail = Seg {
                off: s.off + room,
                len: s.len - room,
                ..*s
            };
            s.len = room;
            s.fin = false;
            self.segs.insert(i + 1, tail);
            self.lost += 1;
        }
        let s = &mut self.segs[i];
        s.lost = false;
        s.rtx = true;
        s.fast = fast;
        s.tx = tx;
        s.sent = now;
        self.lost -= 1;
        Some(Out {
            off: s.off,
            len: s.len,
            fin: s.fin,
        })
    }

    /// Copy the bytes at `off` into `dst` (they must be held).
    pub fn copy(&self, off: u64, dst: &mut [u8]) {
        let start = (off - self.una) as usize;
        let (a, b) = self.buf.as_slices();
        let mut n = 0;
        if start < a.len() {
            n = (a.len() - start).min(dst.len());
            dst[..n].copy_from_slice(&a[start..start + n]);
        }
        if n < dst.len() {
            let from = start + n - a.len();
            let k = dst.len() - n;
            dst[n..].copy_from_slice(&b[from..from + k]);
        }
    }

    /// Take an ACK. `Err` if it acknowledges bytes never sent. `reorder` is the reorder
    /// allowance, microseconds.
    pub fn on_ack(
        &mut self,
        now: Instant,
        a: &Ack,
        rtt: &mut Rtt,
        reorder: u64,
    ) -> Result<Acked, ()> {
        let top = a.sack.as_slice().last().map_or(a.cum, |r| r.1);
        if a.cum > self.nxt || top > self.nxt {
            return Err(());
        }
        let mut out = Acked {
            progress: a.limit > self.limit,
        };
        self.limit = self.limit.max(a.limit);
        let mut n = Newly::new(now, self.rack, rtt.min_rtt());
        self.ack_cumulative(a, &mut n, &mut out);
        self.ack_selective(a, &mut n, &mut out);
        if let Some(r) = n.sample() {
            rtt.sample(r);
        }
        if n.reorder > 0 {
            rtt.on_reorder(n.reorder);
        }
        if n.spurious {
            rtt.on_spurious(now);
        }
        if let Some(s) = n.newest {
            self.on_newest(now, s, rtt);
        }
        self.last_progress = now;
        if out.progress {
            self.backoff = 0;
            self.rto_at = None;
        }
        if self.fin_sent && self.segs.is_empty() && self.una == self.written {
            self.fin_acked = true;
        }
        self.detect_lost(now, reorder);
        Ok(out)
    }

    /// Drop the frames below the cumulative point and the bytes they held.
    fn ack_cumulative(&mut self, a: &Ack, n: &mut Newly, out: &mut Acked) {
        while let Some(s) = self.segs.front().copied() {
            if s.off + s.len > a.cum || (s.fin && !a.fin) {
                break;
            }
            self.segs.pop_front();
            if s.lost {
                self.lost -= 1;
            }
            if !s.sacked {
                n.note(&s);
            }
            out.progress = true;
        }
        if let Some(s) = self.segs.front_mut() {
            if s.off < a.cum {
                s.len -= a.cum - s.off;
                s.off = a.cum;
            }
        }
        if a.cum > self.una {
            self.buf.drain(..(a.cum - self.una) as usize);
            self.una = a.cum;
            out.progress = true;
            if self.buf.is_empty() {
                self.buf = VecDeque::new();
            }
        }
        if self.segs.is_empty() && self.segs.capacity() > 0 {
            self.segs = VecDeque::new();
        }
    }

    /// Mark the frames a SACK range holds (both lists are sorted by offset).
    fn ack_selective(&mut self, a: &Ack, n: &mut Newly, out: &mut Acked) {
        let ranges = a.sack.as_slice();
        let mut ri = 0;
        for s in self.segs.iter_mut() {
            let end = s.off + s.len;
            while ri < ranges.len() && ranges[ri].1 < end {
                ri += 1;
            }
            let Some(&(start, stop)) = ranges.get(ri) else {
                break;
            };
            if s.sacked || s.len == 0 || start > s.off || end > stop || (s.fin && !a.fin) {
                continue;
            }
            s.sacked = true;
            if s.lost {
                s.lost = false;
                self.lost -= 1;
            }
            n.note(s);
            out.progress = true;
        }
    }

    /// The newest frame an ACK covered is the RACK reference point.
    fn on_newest(&mut self, now: Instant, s: Seg, rtt: &Rtt) {
        let sample = now.saturating_since(s.sent).as_micros();
        // A retransmission acknowledged sooner than any round trip: the original got
        // there; it tells nothing about what was sent after it.
        if (!s.rtx || sample >= rtt.min_rtt()) && self.rack.is_none_or(|(tx, _)| s.tx > tx) {
            self.rack = Some((s.tx, sample));
        }
    }

    /// RACK: a frame is lost when one sent after it was acknowledged and its own round
    /// trip plus the reorder allowance has passed. Sets `rack_at` for the frames still
    /// within the allowance.
    pub fn detect_lost(&mut self, now: Instant, reorder: u64) {
        self.rack_at = None;
        let Some((rack_tx, rack_rtt)) = self.rack else {
            return;
        };
        let wait = Duration::from_micros(rack_rtt + reorder);
        for s in self.segs.iter_mut() {
            if s.sacked || s.lost || s.tx >= rack_tx {
                continue;
            }
            let due = s.sent + wait;
            if now >= due {
                s.lost = true;
                self.lost += 1;
            } else if self.rack_at.is_none_or(|t| due < t) {
                self.rack_at = Some(due);
            }
        }
    }

    /// The retransmission timer fired: the first frame in flight not yet declared
    /// lost is (the rest follow by RACK when its ACK comes), or a probe goes out when
    /// the peer gave no credit. True if something is to be sent.
    pub fn on_rto(&mut self) -> bool {
        self.rto_at = None;
        self.backoff += 1;
        if let Some(s) = self.segs.iter_mut().find(|s| !s.sacked && !s.lost) {
            s.lost = true;
            self.lost += 1;
            return true;
        }
        if self.blocked() {
            self.probe_due = true;
            return true;
        }
        false
    }
}
