//! Copies of received datagrams carved from shared chunks: one allocation per 64 KiB,
//! not one per datagram (issue 33: the hot path allocates nothing per packet).
//!
//! A socket reader receives into buffers it reuses, so what it hands on must be
//! copied out. Each copy is split off the current chunk as its own [`Bytes`] (they
//! share the chunk's allocation, which is freed when the last of them is dropped);
//! a new chunk is allocated when the current one is full.

use bytes::{Bytes, BytesMut};

/// The size of a chunk (a datagram larger than this gets a chunk of its own size).
const CHUNK: usize = 64 * 1024;

/// Where a reader copies the datagrams it hands on.
#[derive(Debug, Default)]
pub(crate) struct Chunks(BytesMut);

impl Chunks {
    /// `d` as its own buffer, in the current chunk.
    pub(crate) fn copy(&mut self, d: &[u8]) -> Bytes {
        if self.0.capacity() < d.len() {
            self.0 = BytesMut::with_capacity(CHUNK.max(d.len()));
        }
        self.0.extend_from_slice(d);
        self.0.split().freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_share_a_chunk_and_outlive_it() {
        let mut c = Chunks::default();
        let a = c.copy(b"first");
        let b = c.copy(b"second");
        assert_eq!(a.as_ptr().wrapping_add(5), b.as_ptr(), "one chunk");
        let big = c.copy(&vec![7u8; CHUNK + 1]);
        assert_eq!(big.len(), CHUNK + 1);
        drop(c);
        assert_eq!((&a[..], &b[..]), (&b"first"[..], &b"second"[..]));
    }
}
