//! Authentication of the datagrams overlay nodes exchange (ALCP, `0xB0`), hop by hop.
//!
//! # Keys
//!
//! Every node has its own static X25519 key pair (`braid genkey`, `braid pubkey`) and
//! knows every member's public key; there is no key shared by the overlay. For each pair
//! of nodes `A`, `B`:
//!
//! * the *static secret* `ss = DH(s_A, S_B)` (only `A` and `B` can compute it) keys the
//!   MAC of their HELLOs (BLAKE3 keyed hash, key derived with context
//!   [`HELLO_CONTEXT`]);
//! * at every start a node draws a fresh ephemeral key pair `e` (the driver gives 32
//!   random bytes) and announces its public half to each peer in a HELLO; once both
//!   ephemerals are known, the pair's *session keys* are
//!   `BLAKE3 derive_key(context, DH(e_A, e_B) | DH(e_A, S_B) | DH(s_A, E_B) | ss | ids |
//!   public keys)`, one key per direction ([`KEY_CONTEXT_LO_HI`], [`KEY_CONTEXT_HI_LO`];
//!   `A` is the lower node id). The ephemeral-static terms make a stolen static key of
//!   `B` useless for impersonating `A` to `B`.
//!
//! Every other datagram, DATA included, carries a 26-byte trailer under the key of the
//! direction from its sender (the previous hop) to its receiver:
//!
//! ```text
//! +----------------------+-------------+---------------+------------------+
//! | ALCP message (0xB0…) | sender (u16)| counter (u64) | tag (16 bytes)   |
//! +----------------------+-------------+---------------+------------------+
//! ```
//!
//! The tag is ChaCha20-Poly1305 over an empty plaintext with everything before it as
//! associated data, nonce `0 0 0 0 | counter`. The counter starts at 0 for every new
//! session key and never wraps (a node stops sending to a peer before it would, and
//! both re-key at the next start). Because a session key depends on both nodes'
//! per-start ephemerals, a key never recurs: no nonce repeats across restarts, whatever
//! the clocks do, and nothing recorded in an earlier run of either node authenticates
//! in this one. A receiver keeps, per peer and key, the highest counter seen and a
//! [`WINDOW`]-wide window below it and drops duplicates and anything older.
//!
//! # HELLO
//!
//! ```text
//! +--------+--------+--------+--------+
//! |  0xB0  |version |   7    | flags  |  flags: bit 0 "ready": I have taken your
//! +--------+--------+--------+--------+         ephemeral `echo` into my keys
//! |  sender (u16)   | receiver (u16)  |  4..8
//! +--------+--------+--------+--------+
//! |  ephemeral public key (32 bytes)  |  8..40   the sender's, this run
//! +-----------------------------------+
//! |  echo (32 bytes)                  |  40..72  the receiver's ephemeral as the sender
//! +-----------------------------------+          last saw it (zeros: none yet)
//! |  MAC (16 bytes)                   |  72..88  keyed by the pair's static secret
//! +-----------------------------------+
//! ```
//!
//! A node takes a peer's ephemeral into its keys only from a HELLO that echoes its own
//! current ephemeral (so the HELLO was made after this node started: a recorded one
//! from an earlier run of either node never passes), and never takes back one it has
//! replaced (a recorded HELLO of the peer's earlier run within this node's run). A
//! HELLO that does not echo its ephemeral, or whose sender is not ready, is answered
//! with the node's own HELLO (at most once per [`REPLY_EVERY`] per peer, and always to
//! the peer's configured address, never to where the datagram came from). A node
//! repeats its HELLO to every peer it has no confirmed keys with (the driver's ping
//! interval). Four HELLOs set up a pair; a restarted node sets up again with each peer.

use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce, Tag};
use snow::params::DHChoice;
use snow::resolvers::{CryptoResolver, DefaultResolver};

use super::NodeId;
use crate::time::{Duration, Instant};
use crate::wire::overlay::KIND_HELLO;
use crate::wire::{TYPE_OVERLAY, VERSION};

/// Bytes added to every ALCP datagram but HELLO.
pub const TRAILER_LEN: usize = 2 + 8 + 16;
/// Length of a HELLO.
pub const HELLO_LEN: usize = 88;
/// BLAKE3 key-derivation context of the HELLO MAC key.
pub const HELLO_CONTEXT: &str = "braid 2026 overlay HELLO MAC v2";
/// Context of the session key from the lower node id to the higher.
pub const KEY_CONTEXT_LO_HI: &str = "braid 2026 overlay ALCP key lower->higher v2";
/// Context of the session key from the higher node id to the lower.
pub const KEY_CONTEXT_HI_LO: &str = "braid 2026 overlay ALCP key higher->lower v2";
/// Width of the replay window (datagrams may arrive this far out of order).
pub const WINDOW: u64 = 1024;
/// A node answers a peer's HELLOs at most this often (replayed HELLOs can make it send
/// no more than this).
pub const REPLY_EVERY: Duration = Duration::from_millis(50);
/// Ephemerals of one peer replaced during this run, remembered so that none is taken
/// back; a peer that restarts more often than this within our run is refused until we
/// restart (its keys could otherwise repeat).
pub const MAX_RETIRED: usize = 1024;
/// The last counter a key may use.
const MAX_COUNTER: u64 = u64::MAX - 1;
const MAC_LEN: usize = 16;

/// Why a datagram was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// Shorter than the trailer plus one byte (or not a HELLO's length).
    #[error("datagram too short to carry an authentication trailer")]
    Truncated,
    /// The tag does not verify (another key, altered bytes, or a previous run's key).
    #[error("authentication failed")]
    BadTag,
    /// A counter already seen, or older than the window; or a HELLO with an
    /// ephemeral this node has replaced.
    #[error("replayed or too old")]
    Replay,
    /// A datagram claiming to come from this node itself.
    #[error("datagram claims to come from this node")]
    FromSelf,
    /// The sender is not a member of the overlay.
    #[error("datagram from node {0}, which is not a member")]
    Unknown(NodeId),
    /// No session keys with the sender yet (its HELLO has not arrived, or it
    /// restarted and uses keys this node does not have).
    #[error("no session keys with node {0} yet")]
    NoKeys(NodeId),
    /// A HELLO meant for another node.
    #[error("HELLO addressed to node {0}")]
    NotForMe(NodeId),
    /// The peer restarted more than [`MAX_RETIRED`] times during this run.
    #[error("node {0} restarted too often; restart this node to talk to it again")]
    TooManyRestarts(NodeId),
}

/// A key set that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeySetError {
    /// A peer's public key is this node's own.
    #[error("node {0}'s public key is this node's own public key (each node needs its own key pair: `braid genkey`)")]
    OwnKey(NodeId),
    /// Two peers share a public key.
    #[error("nodes {0} and {1} have the same public key (each node needs its own key pair)")]
    SharedKey(NodeId, NodeId),
    /// A public key no X25519 key pair has (a low-order point).
    #[error("node {0}'s public key is not a usable X25519 public key (`braid pubkey < its private key` prints one)")]
    BadPublic(NodeId),
    /// A peer has this node's id.
    #[error("node {0} is this node's own id")]
    OwnId(NodeId),
}

#[derive(Clone, Copy, Debug)]
struct Window {
    highest: u64,
    any: bool,
    bits: [u64; (WINDOW / 64) as usize],
}

impl Default for Window {
    fn default() -> Window {
        Window {
            highest: 0,
            any: false,
            bits: [0; (WINDOW / 64) as usize],
        }
    }
}

impl Window {
    fn bit(c: u64) -> (usize, u64) {
        let i = c % WINDOW;
        ((i / 64) as usize, 1u64 << (i % 64))
    }

    /// Would `c` be new? (Does not record it.)
    fn fresh(&self, c: u64) -> bool {
        if !self.any || c > self.highest {
            return true;
        }
        if self.highest - c >= WINDOW {
            return false;
        }
        let (w, m) = Window::bit(c);
        self.bits[w] & m == 0
    }

    fn record(&mut self, c: u64) {
        if !self.any {
            *self = Window::default();
            self.any = true;
            self.highest = c;
        } else if c > self.highest {
            if c - self.highest >= WINDOW {
                self.bits = [0; (WINDOW / 64) as usize];
            } else {
                for k in self.highest + 1..c {
                    let (w, m) = Window::bit(k);
                    self.bits[w] &= !m;
                }
            }
            self.highest = c;
        }
        let (w, m) = Window::bit(c);
        self.bits[w] |= m;
    }
}

fn dh(private: &[u8; 32], public: &[u8; 32]) -> [u8; 32] {
    let mut d = DefaultResolver
        .resolve_dh(&DHChoice::Curve25519)
        .expect("the default resolver has X25519");
    d.set(private);
    let mut out = [0u8; 32];
    if d.dh(public, &mut out).is_err() {
        out = [0; 32];
    }
    out
}

fn public_of(private: &[u8; 32]) -> [u8; 32] {
    let mut d = DefaultResolver
        .resolve_dh(&DHChoice::Curve25519)
        .expect("the default resolver has X25519");
    d.set(private);
    let mut p = [0u8; 32];
    p.copy_from_slice(d.pubkey());
    p
}

fn nonce(counter: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_be_bytes());
    *Nonce::from_slice(&n)
}

struct Keys {
    /// The peer's ephemeral these keys were made with.
    peer_e: [u8; 32],
    send: ChaCha20Poly1305,
    counter: u64,
    recv: ChaCha20Poly1305,
    window: Window,
    /// The peer has shown it holds these keys.
    confirmed: bool,
}

struct PeerAuth {
    id: NodeId,
    public: [u8; 32],
    ss: [u8; 32],
    hello_key: [u8; 32],
    /// The peer's ephemeral as last seen in an authentic HELLO (what we echo).
    seen_e: Option<[u8; 32]>,
    keys: Option<Keys>,
    retired: Vec<[u8; 32]>,
    last_reply: Option<Instant>,
}

/// What an authentic HELLO did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelloOutcome {
    /// The peer it came from.
    pub from: NodeId,
    /// New session keys with that peer were made.
    pub rekeyed: bool,
    /// A HELLO to send back to the peer (at its configured address).
    pub reply: Option<Vec<u8>>,
}

/// One node's keys and authentication state towards every member of the overlay.
pub struct NodeAuth {
    me: NodeId,
    private: [u8; 32],
    public: [u8; 32],
    e_private: [u8; 32],
    e_public: [u8; 32],
    peers: Vec<PeerAuth>,
}

impl core::fmt::Debug for NodeAuth {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("NodeAuth")
            .field("me", &self.me)
            .field("peers", &self.peers.len())
            .finish_non_exhaustive()
    }
}

impl NodeAuth {
    /// Node `me` with its static private key, every member's `(id, public key)`, and
    /// 32 fresh random bytes for this run's ephemeral key (never reuse them: they are
    /// what makes this run's keys new).
    pub fn new(
        me: NodeId,
        private: &[u8; 32],
        members: &[(NodeId, [u8; 32])],
        ephemeral: [u8; 32],
    ) -> Result<NodeAuth, KeySetError> {
        let public = public_of(private);
        let mut peers: Vec<PeerAuth> = Vec::with_capacity(members.len());
        for &(id, pk) in members {
            if id == me {
                return Err(KeySetError::OwnId(id));
            }
            if pk == public {
                return Err(KeySetError::OwnKey(id));
            }
            if let Some(o) = peers.iter().find(|p| p.public == pk) {
                return Err(KeySetError::SharedKey(o.id, id));
            }
            let ss = dh(private, &pk);
            if ss == [0; 32] {
                return Err(KeySetError::BadPublic(id));
            }
            let (lo, hi) = if me < id { (public, pk) } else { (pk, public) };
            let mut m = Vec::with_capacity(96);
            m.extend_from_slice(&ss);
            m.extend_from_slice(&lo);
            m.extend_from_slice(&hi);
            peers.push(PeerAuth {
                id,
                public: pk,
                ss,
                hello_key: blake3::derive_key(HELLO_CONTEXT, &m),
                seen_e: None,
                keys: None,
                retired: Vec::new(),
                last_reply: None,
            });
        }
        let e_public = public_of(&ephemeral);
        Ok(NodeAuth {
            me,
            private: *private,
            public,
            e_private: ephemeral,
            e_public,
            peers,
        })
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.me
    }

    /// This node's static public key.
    pub fn public_key(&self) -> [u8; 32] {
        self.public
    }

    /// This run's ephemeral public key.
    pub fn ephemeral_public(&self) -> [u8; 32] {
        self.e_public
    }

    /// Whether `d` is a HELLO (by its first bytes).
    pub fn is_hello(d: &[u8]) -> bool {
        d.len() >= 3 && d[0] == TYPE_OVERLAY && d[2] == KIND_HELLO
    }

    /// Whether this node and `peer` both hold session keys (the peer has shown it).
    pub fn established(&self, peer: NodeId) -> bool {
        self.peer(peer)
            .and_then(|p| p.keys.as_ref())
            .is_some_and(|k| k.confirmed)
    }

    /// Whether this node can send to `peer`.
    pub fn can_send(&self, peer: NodeId) -> bool {
        self.peer(peer).is_some_and(|p| p.keys.is_some())
    }

    /// Members without established keys: send them [`NodeAuth::hello`] now and then.
    pub fn unestablished(&self) -> Vec<NodeId> {
        self.peers
            .iter()
            .filter(|p| !p.keys.as_ref().is_some_and(|k| k.confirmed))
            .map(|p| p.id)
            .collect()
    }

    fn peer(&self, id: NodeId) -> Option<&PeerAuth> {
        self.peers.iter().find(|p| p.id == id)
    }

    /// A HELLO to `peer` (`None`: not a member).
    pub fn hello(&self, peer: NodeId) -> Option<Vec<u8>> {
        let p = self.peer(peer)?;
        let echo = p.seen_e.unwrap_or([0; 32]);
        let ready = p.keys.as_ref().is_some_and(|k| Some(k.peer_e) == p.seen_e);
        let mut v = Vec::with_capacity(HELLO_LEN);
        v.extend_from_slice(&[TYPE_OVERLAY, VERSION, KIND_HELLO, u8::from(ready)]);
        v.extend_from_slice(&self.me.to_be_bytes());
        v.extend_from_slice(&peer.to_be_bytes());
        v.extend_from_slice(&self.e_public);
        v.extend_from_slice(&echo);
        let mac = blake3::keyed_hash(&p.hello_key, &v);
        v.extend_from_slice(&mac.as_bytes()[..MAC_LEN]);
        Some(v)
    }

    /// Take a HELLO (see the module's documentation).
    pub fn on_hello(&mut self, now: Instant, d: &[u8]) -> Result<HelloOutcome, AuthError> {
        let (sender, pi) = self.authenticate_hello(d)?;
        let ready = d[3] & 1 != 0;
        let mut e = [0u8; 32];
        e.copy_from_slice(&d[8..40]);
        let echoes_me = d[40..72] == self.e_public;
        let rekeyed = self.take_ephemeral(pi, sender, e, echoes_me)?;
        let p = &mut self.peers[pi];
        if let Some(k) = &mut p.keys {
            if echoes_me && ready && k.peer_e == e {
                k.confirmed = true;
            }
        }
        let wants_answer = !echoes_me || !ready;
        let reply = self.hello_reply(now, pi, sender, rekeyed, wants_answer);
        Ok(HelloOutcome {
            from: sender,
            rekeyed,
            reply,
        })
    }

    /// A HELLO's checks before its contents are used: its length and form, that a
    /// member other than us sent it to us, and its tag under that member's hello key.
    /// Returns the sender and its index among the peers.
    fn authenticate_hello(&self, d: &[u8]) -> Result<(NodeId, usize), AuthError> {
        if d.len() != HELLO_LEN {
            return Err(AuthError::Truncated);
        }
        if d[1] != VERSION || d[3] & !1 != 0 {
            return Err(AuthError::BadTag);
        }
        let sender = u16::from_be_bytes([d[4], d[5]]);
        let receiver = u16::from_be_bytes([d[6], d[7]]);
        if sender == self.me {
            return Err(AuthError::FromSelf);
        }
        if receiver != self.me {
            return Err(AuthError::NotForMe(receiver));
        }
        let pi = self
            .peers
            .iter()
            .position(|p| p.id == sender)
            .ok_or(AuthError::Unknown(sender))?;
        let p = &self.peers[pi];
        let mac = blake3::keyed_hash(&p.hello_key, &d[..HELLO_LEN - MAC_LEN]);
        // Constant time: blake3's Hash equality is; compare the truncated tags so.
        let mut diff = 0u8;
        for (a, b) in mac.as_bytes()[..MAC_LEN]
            .iter()
            .zip(&d[HELLO_LEN - MAC_LEN..])
        {
            diff |= a ^ b;
        }
        if diff != 0 {
            return Err(AuthError::BadTag);
        }
        Ok((sender, pi))
    }

    /// Peer `pi`'s (node `sender`'s) ephemeral key `e` from an authentic HELLO: a
    /// retired one is a replay; it is the one seen last; when the HELLO echoes ours
    /// (`echoes_me`) and `e` is not the one our keys were made with, the old keys are
    /// retired (a bounded number of restarts) and new ones derived. Returns whether
    /// they were.
    fn take_ephemeral(
        &mut self,
        pi: usize,
        sender: NodeId,
        e: [u8; 32],
        echoes_me: bool,
    ) -> Result<bool, AuthError> {
        let p = &mut self.peers[pi];
        if p.retired.contains(&e) {
            return Err(AuthError::Replay);
        }
        p.seen_e = Some(e);
        if !echoes_me || p.keys.as_ref().map(|k| k.peer_e) == Some(e) {
            return Ok(false);
        }
        if p.retired.len() >= MAX_RETIRED {
            return Err(AuthError::TooManyRestarts(sender));
        }
        if let Some(old) = p.keys.take() {
            p.retired.push(old.peer_e);
        }
        let keys = self.derive(pi, e);
        self.peers[pi].keys = Some(keys);
        Ok(true)
    }

    /// Our HELLO back to peer `pi` (node `sender`), if one is due: always on new keys
    /// (`rekeyed`), else when the peer `wants_answer` (it did not echo us or is not
    /// ready), at most every [`REPLY_EVERY`].
    fn hello_reply(
        &mut self,
        now: Instant,
        pi: usize,
        sender: NodeId,
        rekeyed: bool,
        wants_answer: bool,
    ) -> Option<Vec<u8>> {
        let p = &mut self.peers[pi];
        let may = p.last_reply.is_none_or(|t| now - t >= REPLY_EVERY);
        if rekeyed || (wants_answer && may) {
            if !rekeyed {
                p.last_reply = Some(now);
            }
            self.hello(sender)
        } else {
            None
        }
    }

    fn derive(&self, pi: usize, peer_e: [u8; 32]) -> Keys {
        let p = &self.peers[pi];
        let ee = dh(&self.e_private, &peer_e);
        let e_me_s_peer = dh(&self.e_private, &p.public);
        let s_me_e_peer = dh(&self.private, &peer_e);
        let lo_is_me = self.me < p.id;
        // DH(e_lo, S_hi), DH(s_lo, E_hi), in the same order at both ends.
        let (es, se) = if lo_is_me {
            (e_me_s_peer, s_me_e_peer)
        } else {
            (s_me_e_peer, e_me_s_peer)
        };
        let (id_lo, id_hi) = if lo_is_me {
            (self.me, p.id)
        } else {
            (p.id, self.me)
        };
        let (s_lo, s_hi) = if lo_is_me {
            (self.public, p.public)
        } else {
            (p.public, self.public)
        };
        let (e_lo, e_hi) = if lo_is_me {
            (self.e_public, peer_e)
        } else {
            (peer_e, self.e_public)
        };
        let mut m = Vec::with_capacity(32 * 8 + 4);
        for part in [&ee, &es, &se, &p.ss] {
            m.extend_from_slice(part);
        }
        m.extend_from_slice(&id_lo.to_be_bytes());
        m.extend_from_slice(&id_hi.to_be_bytes());
        for part in [&s_lo, &s_hi, &e_lo, &e_hi] {
            m.extend_from_slice(part);
        }
        let lo_hi = blake3::derive_key(KEY_CONTEXT_LO_HI, &m);
        let hi_lo = blake3::derive_key(KEY_CONTEXT_HI_LO, &m);
        let (send, recv) = if lo_is_me {
            (lo_hi, hi_lo)
        } else {
            (hi_lo, lo_hi)
        };
        Keys {
            peer_e,
            send: ChaCha20Poly1305::new(Key::from_slice(&send)),
            counter: 0,
            recv: ChaCha20Poly1305::new(Key::from_slice(&recv)),
            window: Window::default(),
            confirmed: false,
        }
    }

    /// Append the trailer for `to` to `buf` (which holds the message); `false` (and
    /// `buf` unchanged) when there are no keys with `to` yet.
    pub fn seal_in_place(&mut self, to: NodeId, buf: &mut Vec<u8>) -> bool {
        let me = self.me;
        let Some(k) = self
            .peers
            .iter_mut()
            .find(|p| p.id == to)
            .and_then(|p| p.keys.as_mut())
        else {
            return false;
        };
        if k.counter > MAX_COUNTER {
            return false;
        }
        let c = k.counter;
        k.counter += 1;
        buf.extend_from_slice(&me.to_be_bytes());
        buf.extend_from_slice(&c.to_be_bytes());
        // Encrypting an empty buffer cannot fail.
        let tag = k
            .send
            .encrypt_in_place_detached(&nonce(c), buf, &mut [])
            .map(|t| t.to_vec())
            .unwrap_or_else(|_| vec![0; 16]);
        buf.extend_from_slice(&tag);
        true
    }

    /// `msg` with the trailer for `to` appended; `None` without keys with `to` yet.
    pub fn seal(&mut self, to: NodeId, msg: &[u8]) -> Option<Vec<u8>> {
        let mut v = Vec::with_capacity(msg.len() + TRAILER_LEN);
        v.extend_from_slice(msg);
        self.seal_in_place(to, &mut v).then_some(v)
    }

    /// Check a datagram; on success the sender (the previous hop) and the message
    /// without the trailer.
    pub fn open<'a>(&mut self, d: &'a [u8]) -> Result<(NodeId, &'a [u8]), AuthError> {
        if d.len() <= TRAILER_LEN {
            return Err(AuthError::Truncated);
        }
        let body_end = d.len() - 16;
        let msg_end = d.len() - TRAILER_LEN;
        let sender = u16::from_be_bytes([d[msg_end], d[msg_end + 1]]);
        let mut c = [0u8; 8];
        c.copy_from_slice(&d[msg_end + 2..body_end]);
        let counter = u64::from_be_bytes(c);
        if sender == self.me {
            return Err(AuthError::FromSelf);
        }
        let p = self
            .peers
            .iter_mut()
            .find(|p| p.id == sender)
            .ok_or(AuthError::Unknown(sender))?;
        let k = p.keys.as_mut().ok_or(AuthError::NoKeys(sender))?;
        if !k.window.fresh(counter) {
            return Err(AuthError::Replay);
        }
        k.recv
            .decrypt_in_place_detached(
                &nonce(counter),
                &d[..body_end],
                &mut [],
                Tag::from_slice(&d[body_end..]),
            )
            .map_err(|_| AuthError::BadTag)?;
        k.window.record(counter);
        // Only the peer could seal under these keys: it holds them.
        k.confirmed = true;
        Ok((sender, &d[..msg_end]))
    }

    /// The static public key of member `peer`.
    pub fn member_key(&self, peer: NodeId) -> Option<[u8; 32]> {
        self.peer(peer).map(|p| p.public)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(seed: u8) -> [u8; 32] {
        let mut k = [0u8; 32];
        for (i, b) in k.iter_mut().enumerate() {
            *b = seed.wrapping_mul(31).wrapping_add(i as u8 * 7) ^ 0x5A;
        }
        k
    }

    /// Nodes `ids` with static keys `key(id)`, every one a member of every other's set,
    /// run `run` (its ephemerals differ per run).
    fn nodes(ids: &[NodeId], run: u8) -> Vec<NodeAuth> {
        ids.iter()
            .map(|&me| {
                let members: Vec<(NodeId, [u8; 32])> = ids
                    .iter()
                    .filter(|&&i| i != me)
                    .map(|&i| (i, public_of(&key(i as u8))))
                    .collect();
                let mut e = key(200 + me as u8);
                e[31] = run;
                NodeAuth::new(me, &key(me as u8), &members, e).unwrap()
            })
            .collect()
    }

    /// Exchange HELLOs between `a` and `b` until neither has anything to say.
    fn handshake(a: &mut NodeAuth, b: &mut NodeAuth, now: Instant) -> usize {
        let mut queue: Vec<(bool, Vec<u8>)> = vec![(true, a.hello(b.id()).unwrap())];
        let mut n = 0;
        while let Some((to_b, d)) = queue.pop() {
            n += 1;
            assert!(n < 20, "HELLOs do not converge");
            let (rx, _) = if to_b {
                (&mut *b, &mut *a)
            } else {
                (&mut *a, &mut *b)
            };
            if let Ok(o) = rx.on_hello(now, &d) {
                if let Some(r) = o.reply {
                    queue.push((!to_b, r));
                }
            }
        }
        n
    }

    fn ms(v: u64) -> Instant {
        Instant::from_micros(v * 1000)
    }

    #[test]
    fn hellos_set_up_keys_then_seal_and_open() {
        let mut v = nodes(&[1, 2], 0);
        let (a, b) = v.split_at_mut(1);
        let (a, b) = (&mut a[0], &mut b[0]);
        assert_eq!(a.seal(2, b"\xB0x"), None, "no keys before HELLOs");
        let n = handshake(a, b, ms(0));
        assert!(n <= 4, "{n} HELLOs");
        assert!(a.established(2) && b.established(1));
        assert!(a.unestablished().is_empty());
        let d1 = a.seal(2, b"\xB0hello").unwrap();
        let d2 = a.seal(2, b"\xB0world").unwrap();
        assert_eq!(d1.len(), 6 + TRAILER_LEN);
        // Out of order within the window is fine; a replay is not.
        assert_eq!(b.open(&d2), Ok((1, &b"\xB0world"[..])));
        assert_eq!(b.open(&d1), Ok((1, &b"\xB0hello"[..])));
        assert_eq!(b.open(&d1), Err(AuthError::Replay));
        // The other direction has its own key.
        let back = b.seal(1, b"\xB0back").unwrap();
        assert_eq!(a.open(&back), Ok((2, &b"\xB0back"[..])));
        // One flipped bit anywhere fails.
        for i in 0..d1.len() {
            let mut x = a.seal(2, b"\xB0bits!").unwrap();
            x[i] ^= 0x10;
            assert!(b.open(&x).is_err(), "byte {i}");
        }
        assert_eq!(b.open(&[0xB0; TRAILER_LEN]), Err(AuthError::Truncated));
    }

    #[test]
    fn a_member_cannot_speak_for_another() {
        // 1, 2, 3 are members; 3 holds its own private key and tries to be 1 towards 2.
        let mut v = nodes(&[1, 2, 3], 0);
        let mut c = v.pop().unwrap();
        let mut b = v.pop().unwrap();
        let mut a = v.pop().unwrap();
        handshake(&mut a, &mut b, ms(0));
        handshake(&mut c, &mut b, ms(0));
        // 3's keys with 2, but the trailer claims sender 1.
        let mut d = c.seal(2, b"\xB0td").unwrap();
        let at = d.len() - TRAILER_LEN;
        d[at..at + 2].copy_from_slice(&1u16.to_be_bytes());
        assert_eq!(b.open(&d), Err(AuthError::BadTag));
        // A HELLO claiming to be from 1, made with 3's key material: refused.
        let members = [(2, public_of(&key(2)))];
        let fake = NodeAuth::new(1, &key(3), &members, key(99)).unwrap();
        assert_eq!(
            b.on_hello(ms(1), &fake.hello(2).unwrap()),
            Err(AuthError::BadTag)
        );
        // A node outside the member list is unknown.
        let stranger = NodeAuth::new(9, &key(9), &members, key(98)).unwrap();
        assert_eq!(
            b.on_hello(ms(1), &stranger.hello(2).unwrap()),
            Err(AuthError::Unknown(9))
        );
        // And 1's genuine traffic still passes.
        let ok = a.seal(2, b"\xB0ok").unwrap();
        assert_eq!(b.open(&ok), Ok((1, &b"\xB0ok"[..])));
    }

    #[test]
    fn recorded_datagrams_fail_after_the_receiver_restarts() {
        let mut v = nodes(&[1, 2], 0);
        let mut b = v.pop().unwrap();
        let mut a = v.pop().unwrap();
        let mut hellos: Vec<Vec<u8>> = Vec::new();
        // Record the HELLOs too.
        let mut queue = vec![(true, a.hello(2).unwrap())];
        while let Some((to_b, d)) = queue.pop() {
            hellos.push(d.clone());
            let rx = if to_b { &mut b } else { &mut a };
            if let Some(r) = rx.on_hello(ms(0), &d).unwrap().reply {
                queue.push((!to_b, r));
            }
        }
        let recorded = a.seal(2, b"\xB0\x01\x02provision").unwrap();
        assert!(b.open(&recorded).is_ok());
        // 2 restarts: a new ephemeral. Replayed HELLOs of 1 set up nothing.
        let mut b2 = nodes(&[1, 2], 1).pop().unwrap();
        for h in &hellos {
            if let Ok(o) = b2.on_hello(ms(10), h) {
                assert!(!o.rekeyed, "a recorded HELLO made keys");
            }
        }
        assert_eq!(b2.open(&recorded), Err(AuthError::NoKeys(1)));
        // Once 1 and the restarted 2 have new keys, the recording still fails.
        handshake(&mut a, &mut b2, ms(100));
        assert!(a.established(2) && b2.established(1));
        assert_eq!(b2.open(&recorded), Err(AuthError::BadTag));
        let fresh = a.seal(2, b"\xB0now").unwrap();
        assert!(b2.open(&fresh).is_ok());
        // The old run's HELLOs, replayed into the new pair, change nothing.
        for h in &hellos {
            let _ = b2.on_hello(ms(200), h);
        }
        let fresh = a.seal(2, b"\xB0still").unwrap();
        assert!(b2.open(&fresh).is_ok());
    }

    #[test]
    fn a_peers_earlier_run_is_not_taken_back() {
        let mut v = nodes(&[1, 2], 0);
        let mut b = v.pop().unwrap();
        let mut a = v.pop().unwrap();
        // Record a HELLO of 1's first run that echoes 2's ephemeral.
        handshake(&mut a, &mut b, ms(0));
        let old = a.hello(2).unwrap();
        // 1 restarts and sets up again with 2 (2 keeps running).
        let mut a2 = nodes(&[1, 2], 1).remove(0);
        handshake(&mut a2, &mut b, ms(100));
        assert!(b.established(1));
        assert_eq!(b.on_hello(ms(300), &old), Err(AuthError::Replay));
        let d = a2.seal(2, b"\xB0x").unwrap();
        assert!(b.open(&d).is_ok());
    }

    #[test]
    fn replies_are_rate_limited() {
        let mut v = nodes(&[1, 2], 0);
        let mut b = v.pop().unwrap();
        let a = v.pop().unwrap();
        let h = a.hello(2).unwrap();
        assert!(b.on_hello(ms(0), &h).unwrap().reply.is_some());
        assert!(b.on_hello(ms(10), &h).unwrap().reply.is_none());
        assert!(b.on_hello(ms(60), &h).unwrap().reply.is_some());
    }

    #[test]
    fn bad_key_sets_are_refused() {
        let own = public_of(&key(1));
        assert_eq!(
            NodeAuth::new(1, &key(1), &[(2, own)], key(5)).err(),
            Some(KeySetError::OwnKey(2))
        );
        let p = public_of(&key(2));
        assert_eq!(
            NodeAuth::new(1, &key(1), &[(2, p), (3, p)], key(5)).err(),
            Some(KeySetError::SharedKey(2, 3))
        );
        assert_eq!(
            NodeAuth::new(1, &key(1), &[(2, [0; 32])], key(5)).err(),
            Some(KeySetError::BadPublic(2))
        );
    }

    #[test]
    fn window_slides() {
        let mut w = Window::default();
        w.record(5);
        assert!(!w.fresh(5) && w.fresh(4) && w.fresh(6));
        w.record(5 + WINDOW);
        assert!(!w.fresh(5), "more than the window behind the newest");
        assert!(w.fresh(6 + 1) && w.fresh(5 + WINDOW - 1));
        w.record(7);
        assert!(!w.fresh(7));
        w.record(5 + 3 * WINDOW);
        assert!(w.fresh(5 + 3 * WINDOW - 1) && !w.fresh(5 + 3 * WINDOW));
    }
}
