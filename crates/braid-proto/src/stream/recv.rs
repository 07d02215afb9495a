//! The receiving half of a stream: reassembly, the bytes waiting for the application,
//! and the credit limit granted to the peer.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;

use crate::time::Instant;
use crate::wire::stream::Sack;

/// What one DATA frame did.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Arrival {
    /// Bytes not held before.
    pub new: u64,
    /// Bytes held before (or read already).
    pub dup: u64,
    /// Bytes dropped because they lay beyond the credit limit.
    pub beyond: u64,
    /// The frame continued the in-order bytes and left no hole behind.
    pub in_order: bool,
}

/// Receive state of one stream. Buffers are allocated as bytes arrive and given back
/// when they are read, so an idle stream holds none.
#[derive(Debug, Default)]
pub(super) struct RecvSide {
    /// In-order bytes waiting for the application.
    ready: VecDeque<Bytes>,
    ready_len: u64,
    /// Bytes above a hole, by offset; the chunks never overlap.
    ooo: BTreeMap<u64, Bytes>,
    ooo_len: u64,
    /// Bytes handed to the application.
    pub read: u64,
    /// Every byte below this was received (the cumulative point).
    pub nxt: u64,
    /// The end of the highest byte received.
    pub highest: u64,
    /// The stream's length, once a FIN came.
    pub final_size: Option<u64>,
    /// The credit limit granted to the peer (never lowered).
    pub limit: u64,
    /// Some data frame arrived (the stream counts as receiving for the pool).
    pub got_data: bool,
    /// DATA frames since the last ACK.
    pub unacked: u32,
    /// An ACK is due at this time (delayed ACK).
    pub ack_at: Option<Instant>,
    /// An ACK is due now.
    pub ack_now: bool,
    /// A retransmission arrived that was not needed: say so in the next ACK.
    pub spurious: bool,
    /// A Readable event went out since the application last read.
    pub notified: bool,
}

/// The numbers the pool's division needs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pool {
    /// All streams' receive buffers together.
    pub pool: u64,
    /// Credit promised to all streams and not read yet.
    pub committed: u64,
    /// The share of one receiving stream (the window it aims for).
    pub fair: u64,
    /// The credit every stream may always have unread, pool or not.
    pub min: u64,
}

impl RecvSide {
    /// Take the bytes of a DATA frame. `Err` if it contradicts the FIN (bytes past the
    /// final size, or a second, different final size).
    pub fn on_data(&mut self, off: u64, data: &[u8], fin: bool) -> Result<Arrival, ()> {
        let end = off + data.len() as u64;
        if let Some(f) = self.final_size {
            if end > f || (fin && end != f) {
                return Err(());
            }
        }
        if fin && end < self.highest {
            return Err(());
        }
        let mut a = Arrival {
            in_order: off <= self.nxt && self.ooo.is_empty(),
            ..Arrival::default()
        };
        if fin && end <= self.limit {
            self.final_size = Some(end);
        }
        let (s, e) = (off.max(self.nxt), end.min(self.limit));
        a.beyond = end - e.max(off);
        if s < e {
            a.new = self.insert(s, e, off, data);
            self.highest = self.highest.max(e);
        }
        a.dup = data.len() as u64 - a.new - a.beyond;
        self.got_data = true;
        self.advance();
        a.in_order &= self.ooo.is_empty();
        Ok(a)
    }

    /// Store the parts of `[s, e)` not held yet; `data` starts at `off`.
    fn insert(&mut self, s: u64, e: u64, off: u64, data: &[u8]) -> u64 {
        let mut at = s;
        let mut new = 0;
        loop {
            if let Some((&k, v)) = self.ooo.range(..=at).next_back() {
                at = at.max(k + v.len() as u64);
            }
            if at >= e {
                return new;
            }
            let next = self.ooo.range(at..e).next().map_or(e, |(&k, _)| k);
            let chunk = &data[(at - off) as usize..(next - off) as usize];
            self.ooo.insert(at, Bytes::copy_from_slice(chunk));
            new += next - at;
            self.ooo_len += next - at;
            at = next;
        }
    }

    /// Move the chunks that continue the in-order bytes to the ready queue.
    fn advance(&mut self) {
        while let Some(entry) = self.ooo.first_entry() {
            if *entry.key() != self.nxt {
                break;
            }
            let b = entry.remove();
            let n = b.len() as u64;
            self.nxt += n;
            self.ooo_len -= n;
            self.ready_len += n;
            self.ready.push_back(b);
        }
    }

    /// Copy in-order bytes into `buf`.
    pub fn read(&mut self, buf: &mut [u8]) -> usize {
        let mut n = 0;
        while n < buf.len() {
            let Some(front) = self.ready.front_mut() else {
                break;
            };
            let k = front.len().min(buf.len() - n);
            buf[n..n + k].copy_from_slice(&front[..k]);
            if k == front.len() {
                self.ready.pop_front();
            } else {
                *front = front.slice(k..);
            }
            n += k;
        }
        self.ready_len -= n as u64;
        self.read += n as u64;
        self.notified = false;
        if self.ready.is_empty() && self.ready.capacity() > 0 {
            self.ready = VecDeque::new();
        }
        n
    }

    /// In-order bytes waiting for the application.
    pub fn readable(&self) -> u64 {
        self.ready_len
    }

    /// Bytes held (waiting in order, or above a hole).
    pub fn buffered(&self) -> u64 {
        self.ready_len + self.ooo_len
    }

    /// Buffers the receive side holds (tests: an idle stream holds none).
    #[cfg(test)]
    pub fn allocated(&self) -> usize {
        self.ready.capacity() + self.ooo.len()
    }

    /// Every byte and the FIN are here (the application may still have bytes to read).
    pub fn complete(&self) -> bool {
        self.final_size == Some(self.nxt)
    }

    /// The FIN came and the application read every byte.
    pub fn finished(&self) -> bool {
        self.final_size == Some(self.read)
    }

    /// Something to tell the application: bytes, or the end.
    pub fn has_news(&self) -> bool {
        self.ready_len > 0 || self.complete()
    }

    /// An ACK is waiting to go out.
    pub fn ack_pending(&self) -> bool {
        self.ack_now || self.ack_at.is_some()
    }

    /// An ACK went out.
    pub fn ack_sent(&mut self) {
        self.ack_now = false;
        self.ack_at = None;
        self.unacked = 0;
        self.spurious = false;
    }

    /// Bytes this stream may still have to hold: the credit not yet read (up to the
    /// final size, once known).
    pub fn commitment(&self) -> u64 {
        let end = self.final_size.map_or(self.limit, |f| f.min(self.limit));
        end.saturating_sub(self.read)
    }

    /// The credit limit to grant now: up to `read + fair`, as far as the pool has
    /// room, and at least `read + min` whatever the pool holds. Never below the
    /// current limit.
    pub fn grant(&self, p: Pool) -> u64 {
        if self.final_size.is_some() {
            return self.limit;
        }
        let cur = self.limit - self.read;
        if cur >= p.fair {
            return self.limit;
        }
        let free = p.pool.saturating_sub(p.committed);
        (self.read + cur.saturating_add(free).min(p.fair)).max(self.read + p.min)
    }

    /// A credit update is worth its own ACK: the limit would grow by a quarter of the
    /// window, or the peer is nearly out of credit and it would grow by a sixteenth.
    pub fn update_due(&self, p: Pool) -> bool {
        if self.final_size.is_some() {
            return false;
        }
        let growth = self.grant(p) - self.limit;
        let remaining = self.limit.saturating_sub(self.highest);
        growth * 4 >= p.fair || (remaining * 4 < p.fair && growth * 16 >= p.fair)
    }

    /// The ranges held above the cumulative point, lowest first, at most `max`.
    pub fn sack(&self, max: usize) -> Sack {
        let mut s = Sack::new();
        let mut cur: Option<(u64, u64)> = None;
        for (&k, v) in &self.ooo {
            let end = k + v.len() as u64;
            match cur {
                Some((a, b)) if b == k => cur = Some((a, end)),
                Some((a, b)) => {
                    if s.len() >= max || !s.push(a, b) {
                        return s;
                    }
                    cur = Some((k, end));
                }
                None => cur = Some((k, end)),
            }
        }
        if let Some((a, b)) = cur {
            if s.len() < max {
                s.push(a, b);
            }
        }
        s
    }
}
