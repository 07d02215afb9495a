//! Keys, the Noise handshake and the sealing of datagrams (wire format:
//! [`crate::wire::secure`]).
//!
//! * **Handshake.** With static keys configured at both ends (`braid genkey`, the peer's
//!   public key in the configuration), `Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s`, the
//!   pattern WireGuard uses, with the pre-shared key if one is configured (zeros
//!   otherwise). With only a pre-shared key, `Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s`:
//!   fresh ephemeral keys at both ends, authenticated by knowledge of the pre-shared key.
//!   Either way every session gets fresh keys, one per direction, and forward secrecy.
//! * **Either end initiates**, at start, on a timer (`rekey_after`) and before a
//!   channel's counter runs out. Both may initiate at once; each completed handshake is a
//!   valid key pair and the newest one is used for sending.
//! * **Key confirmation.** The initiator uses the new keys as soon as the response
//!   arrives. The responder only once the first datagram sealed with them arrives: a
//!   replayed initiation (from an earlier run, or recorded) therefore costs a response
//!   and nothing else, since whoever replays it cannot derive the keys.
//! * **Restarts.** Each end picks a random run identifier at start and sends it inside
//!   the handshake; a confirmed handshake with a new run identifier means the peer
//!   restarted. No clock is involved, so a peer whose clock is behind reconnects like any
//!   other.
//! * **Sealing.** ChaCha20-Poly1305 per datagram with the direction's key; the nonce is
//!   the channel index and a per-channel counter; the receiver keeps a window of 2048
//!   counters per channel and key. Mode `auth` authenticates the body without
//!   encrypting it.
//!
//! Randomness comes from a seed the driver passes in (a deterministic generator keyed by
//! it), so the simulator stays reproducible and the core reads no entropy on its own.

use bytes::Bytes;
use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, CHACHA20_POLY1305};
use snow::params::{CipherChoice, DHChoice, HashChoice};
use snow::resolvers::{CryptoResolver, DefaultResolver};
use snow::types::{Cipher, Dh, Hash, Random};

use crate::time::{Duration, Instant};
use crate::wire::secure::{Handshake, Header, HEADER_LEN, TAG_LEN};

/// What the security layer does to each datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecurityMode {
    /// Every datagram sealed and encrypted (the default).
    Encrypt,
    /// Every datagram sealed, bodies in clear: integrity without confidentiality.
    Auth,
    /// Data travel bare, header-free (for trusted links or payloads that are already
    /// encrypted); control packets are still sealed and encrypted.
    None,
}

impl SecurityMode {
    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            SecurityMode::Encrypt => "encrypt",
            SecurityMode::Auth => "auth",
            SecurityMode::None => "none",
        }
    }

    /// Parse a short name.
    pub fn from_name(s: &str) -> Option<SecurityMode> {
        Some(match s {
            "encrypt" => SecurityMode::Encrypt,
            "auth" => SecurityMode::Auth,
            "none" => SecurityMode::None,
            _ => return None,
        })
    }

    /// Bytes the envelope adds to a data datagram.
    pub fn data_overhead(self) -> usize {
        match self {
            SecurityMode::Encrypt | SecurityMode::Auth => HEADER_LEN + TAG_LEN,
            SecurityMode::None => 0,
        }
    }
}

/// Length of keys (X25519 private and public, pre-shared).
pub const KEY_LEN: usize = 32;
/// The receiver accepts counters up to this far behind the highest seen on a channel.
pub const REPLAY_WINDOW: u64 = 2048;
/// Start a new handshake once a channel's counter passes this.
pub const REKEY_AFTER_COUNT: u64 = 1 << 48;
/// Never seal with a counter at or beyond this (a new handshake is overdue).
pub const REJECT_AFTER_COUNT: u64 = 1 << 60;
/// An initiation not answered within this long is replaced by a new one.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(1);
/// Responder-side handshakes waiting for confirmation, at most.
const MAX_PENDING: usize = 8;
/// Earlier key pairs still accepted for receiving (datagrams in flight, or a peer that
/// switched later), at most.
const MAX_OLDER: usize = 3;
const PROLOGUE: &[u8] = b"braid session v1";

/// The public key for an X25519 private key.
pub fn public_key(private: &[u8; KEY_LEN]) -> [u8; KEY_LEN] {
    let mut dh = DefaultResolver
        .resolve_dh(&DHChoice::Curve25519)
        .expect("the default resolver has X25519");
    dh.set(private);
    let mut p = [0u8; KEY_LEN];
    p.copy_from_slice(dh.pubkey());
    p
}

/// A deterministic random generator: BLAKE3 in keyed XOF mode over a counter.
pub(crate) struct Drbg {
    key: [u8; 32],
    counter: u64,
}

impl Drbg {
    pub fn new(seed: [u8; 32]) -> Drbg {
        Drbg {
            key: seed,
            counter: 0,
        }
    }

    pub fn fill(&mut self, dest: &mut [u8]) {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(&self.counter.to_be_bytes());
        self.counter += 1;
        h.finalize_xof().fill(dest);
    }

    pub fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        self.fill(&mut b);
        u64::from_be_bytes(b)
    }

    fn seed(&mut self) -> [u8; 32] {
        let mut s = [0u8; 32];
        self.fill(&mut s);
        s
    }
}

impl Random for Drbg {
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), snow::Error> {
        self.fill(dest);
        Ok(())
    }
}

/// snow's primitives with our seeded generator.
struct Seeded([u8; 32]);

impl CryptoResolver for Seeded {
    fn resolve_rng(&self) -> Option<Box<dyn Random>> {
        Some(Box::new(Drbg::new(self.0)))
    }
    fn resolve_dh(&self, choice: &DHChoice) -> Option<Box<dyn Dh>> {
        DefaultResolver.resolve_dh(choice)
    }
    fn resolve_hash(&self, choice: &HashChoice) -> Option<Box<dyn Hash>> {
        DefaultResolver.resolve_hash(choice)
    }
    fn resolve_cipher(&self, choice: &CipherChoice) -> Option<Box<dyn Cipher>> {
        DefaultResolver.resolve_cipher(choice)
    }
}

/// Key material, as configured.
#[derive(Clone, PartialEq, Eq)]
pub struct Keys {
    /// Pre-shared key (32 bytes, derived from the configured key material), if any.
    pub psk: Option<[u8; KEY_LEN]>,
    /// Our static X25519 private key, if static keys are used.
    pub private: Option<[u8; KEY_LEN]>,
    /// The peer's static X25519 public key, if static keys are used.
    pub peer_public: Option<[u8; KEY_LEN]>,
}

impl Keys {
    /// The Noise pattern these keys call for; `None` if they cannot authenticate a
    /// handshake (no pre-shared key and not both static keys).
    fn pattern(&self) -> Option<&'static str> {
        match (&self.private, &self.peer_public, &self.psk) {
            (Some(_), Some(_), _) => Some("Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s"),
            (_, _, Some(_)) => Some("Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s"),
            _ => None,
        }
    }

    /// Why these keys cannot be used, if they cannot.
    pub fn check(&self) -> Result<(), String> {
        match (&self.private, &self.peer_public) {
            (Some(_), None) => {
                return Err("a private key is configured but not the peer's public key".into())
            }
            (None, Some(_)) => {
                return Err("the peer's public key is configured but not our private key".into())
            }
            _ => {}
        }
        if self.pattern().is_none() {
            return Err("no key: configure a pre-shared key, or static keys at both ends".into());
        }
        Ok(())
    }
}

/// 2048-counter sliding window (RFC 6479 style).
#[derive(Clone)]
struct Window {
    /// Highest counter accepted + 1 (0: none yet).
    top: u64,
    bits: [u64; (REPLAY_WINDOW / 64) as usize],
}

impl Window {
    fn new() -> Window {
        Window {
            top: 0,
            bits: [0; (REPLAY_WINDOW / 64) as usize],
        }
    }

    fn slot(c: u64) -> (usize, u64) {
        let i = c % REPLAY_WINDOW;
        ((i / 64) as usize, 1u64 << (i % 64))
    }

    /// Would `c` be accepted?
    fn fresh(&self, c: u64) -> bool {
        if c >= self.top {
            return true;
        }
        if self.top - c > REPLAY_WINDOW {
            return false;
        }
        let (w, b) = Self::slot(c);
        self.bits[w] & b == 0
    }

    /// Accept `c`. Returns how the number of missing counters below the top changed:
    /// the counters `c` skipped over, or -1 when it fills one that was missing.
    fn mark(&mut self, c: u64) -> i64 {
        let gap = if c >= self.top {
            (c - self.top).min(i64::MAX as u64) as i64
        } else {
            -1
        };
        if c >= self.top {
            if c - self.top >= REPLAY_WINDOW {
                self.bits = [0; (REPLAY_WINDOW / 64) as usize];
            } else {
                for k in self.top..c {
                    let (w, b) = Self::slot(k);
                    self.bits[w] &= !b;
                }
            }
            self.top = c + 1;
        }
        let (w, b) = Self::slot(c);
        self.bits[w] |= b;
        gap
    }
}

/// The keys of one completed handshake.
struct Keypair {
    /// Our index: the peer puts it in the datagrams it seals with these keys.
    local: u32,
    /// The peer's index: we put it in ours.
    remote: u32,
    send: Aead,
    recv: Aead,
    created: Instant,
    /// Next counter per channel.
    counters: Vec<u64>,
    windows: Vec<Window>,
    peer_run: u64,
    /// We initiated the handshake that made it.
    initiator: bool,
}

impl Keypair {
    fn new(
        local: u32,
        remote: u32,
        (send, recv): ([u8; 32], [u8; 32]),
        now: Instant,
        channels: usize,
        peer_run: u64,
        initiator: bool,
    ) -> Keypair {
        Keypair {
            local,
            remote,
            send: Aead::new(&send),
            recv: Aead::new(&recv),
            created: now,
            counters: vec![0; channels],
            windows: vec![Window::new(); channels],
            peer_run,
            initiator,
        }
    }
}

fn nonce(channel: usize, counter: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[..4].copy_from_slice(&(channel as u32).to_be_bytes());
    n[4..].copy_from_slice(&counter.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

/// ChaCha20-Poly1305 (RFC 8439) with a detached tag, in place. ring's implementation:
/// the same bytes as any other, several times faster per datagram than the portable
/// one (see docs/tunnel.md, "Speed").
struct Aead(LessSafeKey);

impl Aead {
    fn new(key: &[u8; 32]) -> Aead {
        let k = UnboundKey::new(&CHACHA20_POLY1305, key).expect("a 32-byte key is valid");
        Aead(LessSafeKey::new(k))
    }

    /// Encrypt `buf` in place, authenticating `aad` with it; the tag.
    fn seal(&self, n: Nonce, aad: &[u8], buf: &mut [u8]) -> [u8; TAG_LEN] {
        let tag = self
            .0
            .seal_in_place_separate_tag(n, Aad::from(aad), buf)
            .expect("datagrams are far below the AEAD's limit");
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(tag.as_ref());
        t
    }

    /// Check `tag` over `aad` and `buf` and decrypt `buf` in place.
    fn open(&self, n: Nonce, aad: &[u8], buf: &mut [u8], tag: &[u8]) -> Result<(), Reject> {
        let tag = Tag::try_from(tag).map_err(|_| Reject::Malformed)?;
        self.0
            .open_in_place_separate_tag(n, Aad::from(aad), tag, buf, 0..)
            .map(|_| ())
            .map_err(|_| Reject::BadTag)
    }
}

/// Our outstanding initiation.
struct Initiation {
    index: u32,
    hs: snow::HandshakeState,
    msg: Bytes,
    started: Instant,
}

/// A handshake we answered, waiting for the initiator's first sealed datagram.
struct Pending {
    keys: Keypair,
    /// The initiation it answered (to answer a copy the same way).
    init: Bytes,
    response: Bytes,
}

/// Why a datagram was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reject {
    /// Not sealed, or sealed with keys we do not have.
    Unauthenticated,
    /// The tag does not verify.
    BadTag,
    /// A counter already seen or too old.
    Replay,
    /// Cannot be parsed.
    Malformed,
}

/// A handshake completed (and confirmed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Established {
    /// The first ever.
    pub first: bool,
    /// The peer's run changed: it restarted.
    pub restart: bool,
}

/// Handshake counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HandshakeStats {
    /// Initiations we sent (copies on several channels count once).
    pub initiated: u64,
    /// Handshakes completed and confirmed.
    pub completed: u64,
    /// Handshake messages that failed (wrong key, corrupted, replayed response).
    pub failed: u64,
    /// Initiations answered (including copies and replays).
    pub answered: u64,
}

/// The security state of one session end.
pub(crate) struct Crypto {
    pub mode: SecurityMode,
    keys: Keys,
    pattern: &'static str,
    rekey_after: Duration,
    channels: usize,
    drbg: Drbg,
    run: u64,
    next_index: u32,
    init: Option<Initiation>,
    pending: Vec<Pending>,
    current: Option<Keypair>,
    older: std::collections::VecDeque<Keypair>,
    peer_run: Option<u64>,
    pub stats: HandshakeStats,
    /// Per channel: sealing counters skipped over when a higher one was accepted (every
    /// key so far). The channels are FIFO, so this counts what the channel lost; one that
    /// turns up later (an in-bond repair, on another channel) is still counted: the
    /// channel lost it, and repairs filling gaps must not hide a lossy channel from the
    /// feedback (and a count that never goes down is one the estimator can difference).
    missing: Vec<u64>,
}

impl Crypto {
    pub fn new(
        mode: SecurityMode,
        keys: Keys,
        rekey_after: Duration,
        channels: usize,
        seed: [u8; 32],
    ) -> Result<Crypto, String> {
        keys.check()?;
        let pattern = keys.pattern().expect("checked");
        let mut drbg = Drbg::new(seed);
        let run = drbg.u64();
        let next_index = drbg.u64() as u32;
        Ok(Crypto {
            mode,
            keys,
            pattern,
            rekey_after,
            channels,
            drbg,
            run,
            next_index,
            init: None,
            pending: Vec::new(),
            current: None,
            older: std::collections::VecDeque::new(),
            peer_run: None,
            stats: HandshakeStats::default(),
            missing: vec![0; channels],
        })
    }

    /// Datagrams missing on channel `c` (see the `missing` field).
    pub fn missing(&self, c: usize) -> u64 {
        self.missing.get(c).copied().unwrap_or(0)
    }

    /// Do we have keys to send with?
    pub fn ready(&self) -> bool {
        self.current.is_some()
    }

    /// Our run identifier.
    pub fn run(&self) -> u64 {
        self.run
    }

    fn builder(&mut self) -> snow::Builder<'_> {
        let params = self.pattern.parse().expect("a valid pattern");
        let seed = self.drbg.seed();
        let mut b = snow::Builder::with_resolver(params, Box::new(Seeded(seed)))
            .prologue(PROLOGUE)
            .expect("prologue");
        if let Some(p) = &self.keys.private {
            b = b.local_private_key(p).expect("32 bytes");
        }
        b
    }

    fn new_handshake(&mut self, initiator: bool) -> Result<snow::HandshakeState, snow::Error> {
        let psk = self.keys.psk.unwrap_or([0u8; 32]);
        let peer = self.keys.peer_public;
        let at = if self.keys.private.is_some() { 2 } else { 0 };
        let mut b = self.builder();
        b = match &peer {
            Some(p) if initiator => b.remote_public_key(p)?,
            _ => b,
        };
        b = b.psk(at, &psk)?;
        if initiator {
            b.build_initiator()
        } else {
            b.build_responder()
        }
    }

    fn fresh_index(&mut self) -> u32 {
        self.next_index = self.next_index.wrapping_add(1);
        self.next_index
    }

    /// Is a (new) handshake due: no keys, keys older than `rekey_after`, or a counter
    /// near its end? The end that initiated the current keys re-keys on the timer; the
    /// other only half a period later, if that did not happen (so the two ends do not
    /// both re-key at once, each dropping keys the other still uses).
    fn due(&self, now: Instant) -> bool {
        match &self.current {
            None => true,
            Some(k) => {
                let age = now - k.created;
                let limit = if k.initiator {
                    self.rekey_after
                } else {
                    self.rekey_after + Duration::from_micros(self.rekey_after.as_micros() / 2)
                };
                age >= limit || k.counters.iter().any(|&c| c >= REKEY_AFTER_COUNT)
            }
        }
    }

    /// The initiation to send now, if a handshake is due: the outstanding one again
    /// (copies on several channels or a lost one), or a new one if none is outstanding
    /// or it timed out.
    pub fn initiation(&mut self, now: Instant) -> Option<Bytes> {
        if !self.due(now) {
            self.init = None;
            return None;
        }
        if let Some(i) = &self.init {
            if now - i.started < HANDSHAKE_TIMEOUT {
                return Some(i.msg.clone());
            }
        }
        let mut hs = self.new_handshake(true).ok()?;
        let index = self.fresh_index();
        let mut buf = [0u8; 256];
        let n = hs.write_message(&self.run.to_be_bytes(), &mut buf).ok()?;
        let msg = Bytes::from(
            Handshake::Init {
                sender: index,
                noise: &buf[..n],
            }
            .to_vec(),
        );
        self.stats.initiated += 1;
        self.init = Some(Initiation {
            index,
            hs,
            msg: msg.clone(),
            started: now,
        });
        Some(msg)
    }

    /// A handshake message arrived: the response to send back, and whether a handshake
    /// completed.
    pub fn on_handshake(
        &mut self,
        now: Instant,
        datagram: &Bytes,
    ) -> (Option<Bytes>, Option<Established>) {
        match Handshake::parse(datagram) {
            Ok(Handshake::Init { sender, noise }) => {
                (self.on_init(now, datagram, sender, noise), None)
            }
            Ok(Handshake::Resp {
                sender,
                receiver,
                noise,
            }) => (None, self.on_resp(now, sender, receiver, noise)),
            Err(_) => {
                self.stats.failed += 1;
                (None, None)
            }
        }
    }

    fn on_init(
        &mut self,
        now: Instant,
        datagram: &Bytes,
        sender: u32,
        noise: &[u8],
    ) -> Option<Bytes> {
        if let Some(p) = self.pending.iter().find(|p| p.init == *datagram) {
            self.stats.answered += 1;
            return Some(p.response.clone());
        }
        let mut hs = self.new_handshake(false).ok()?;
        let mut payload = [0u8; 64];
        let peer_run = match hs.read_message(noise, &mut payload) {
            Ok(8) => u64::from_be_bytes(payload[..8].try_into().expect("8 bytes")),
            _ => {
                self.stats.failed += 1;
                return None;
            }
        };
        // IK: the initiator's static key travels in the message; it must be the one
        // configured for the peer.
        if let Some(want) = &self.keys.peer_public {
            if hs.get_remote_static() != Some(&want[..]) {
                self.stats.failed += 1;
                return None;
            }
        }
        let index = self.fresh_index();
        let mut buf = [0u8; 256];
        let n = hs.write_message(&self.run.to_be_bytes(), &mut buf).ok()?;
        let response = Bytes::from(
            Handshake::Resp {
                sender: index,
                receiver: sender,
                noise: &buf[..n],
            }
            .to_vec(),
        );
        // Initiator sends with the first key, responder with the second.
        let (i2r, r2i) = hs.dangerously_get_raw_split();
        let keys = Keypair::new(
            index,
            sender,
            (r2i, i2r),
            now,
            self.channels,
            peer_run,
            false,
        );
        if self.pending.len() >= MAX_PENDING {
            self.pending.remove(0);
        }
        self.pending.push(Pending {
            keys,
            init: datagram.clone(),
            response: response.clone(),
        });
        self.stats.answered += 1;
        Some(response)
    }

    fn on_resp(
        &mut self,
        now: Instant,
        sender: u32,
        receiver: u32,
        noise: &[u8],
    ) -> Option<Established> {
        let Some(init) = self.init.as_mut().filter(|i| i.index == receiver) else {
            // A copy of the response we already used (the initiation went out on every
            // channel) is no failure; anything else is.
            if self.current.as_ref().is_none_or(|k| k.local != receiver) {
                self.stats.failed += 1;
            }
            return None;
        };
        let mut payload = [0u8; 64];
        let peer_run = match init.hs.read_message(noise, &mut payload) {
            Ok(8) => u64::from_be_bytes(payload[..8].try_into().expect("8 bytes")),
            _ => {
                self.stats.failed += 1;
                return None;
            }
        };
        let (i2r, r2i) = init.hs.dangerously_get_raw_split();
        let keys = Keypair::new(
            init.index,
            sender,
            (i2r, r2i),
            now,
            self.channels,
            peer_run,
            true,
        );
        self.init = None;
        Some(self.install(keys))
    }

    fn install(&mut self, keys: Keypair) -> Established {
        let e = Established {
            first: self.peer_run.is_none(),
            restart: self.peer_run.is_some_and(|r| r != keys.peer_run),
        };
        self.peer_run = Some(keys.peer_run);
        if let Some(old) = self.current.take() {
            if e.restart {
                // Keys of the peer's earlier run are of no more use.
                self.older.clear();
            } else {
                self.older.push_front(old);
                self.older.truncate(MAX_OLDER);
            }
        }
        self.current = Some(keys);
        self.stats.completed += 1;
        e
    }

    /// Seal `inner` for channel `c` with the current keys; `None` without keys.
    pub fn seal(&mut self, c: usize, inner: &[u8], encrypt: bool) -> Option<Bytes> {
        let k = self.current.as_mut()?;
        let counter = k.counters[c];
        if counter >= REJECT_AFTER_COUNT {
            return None;
        }
        k.counters[c] += 1;
        let header = Header {
            encrypted: encrypt,
            index: k.remote,
            counter,
        }
        .to_bytes();
        let mut v = Vec::with_capacity(HEADER_LEN + inner.len() + TAG_LEN);
        v.extend_from_slice(&header);
        v.extend_from_slice(inner);
        let tag = if encrypt {
            k.send
                .seal(nonce(c, counter), &header, &mut v[HEADER_LEN..])
        } else {
            k.send.seal(nonce(c, counter), &v, &mut [])
        };
        v.extend_from_slice(&tag);
        Some(Bytes::from(v))
    }

    /// Open a sealed datagram received on channel `c`: the inner datagram, and whether
    /// it confirmed a handshake.
    pub fn open(&mut self, c: usize, d: &Bytes) -> Result<(Bytes, Option<Established>), Reject> {
        let h = Header::parse(d).map_err(|_| Reject::Malformed)?;
        if h.encrypted != (self.mode == SecurityMode::Encrypt || self.mode == SecurityMode::None) {
            // Bodies in clear where we encrypt, or the other way round: a peer in
            // another mode (or a forgery). Not accepted either way.
            return Err(Reject::Unauthenticated);
        }
        let body_end = d.len() - TAG_LEN;
        let tag = &d[body_end..];
        let n = nonce(c, h.counter);
        let (slot, k) = self.find(h.index).ok_or(Reject::Unauthenticated)?;
        if c >= k.windows.len() || !k.windows[c].fresh(h.counter) {
            return Err(Reject::Replay);
        }
        let inner = if h.encrypted {
            let mut body = d[HEADER_LEN..body_end].to_vec();
            k.recv.open(n, &d[..HEADER_LEN], &mut body, tag)?;
            Bytes::from(body)
        } else {
            k.recv.open(n, &d[..body_end], &mut [], tag)?;
            d.slice(HEADER_LEN..body_end)
        };
        let gap = k.windows[c].mark(h.counter);
        self.missing[c] = self.missing[c].saturating_add(gap.max(0) as u64);
        let established = match slot {
            Slot::Pending(i) => {
                let p = self.pending.remove(i);
                self.pending.clear();
                Some(self.install(p.keys))
            }
            _ => None,
        };
        Ok((inner, established))
    }

    fn find(&mut self, index: u32) -> Option<(Slot, &mut Keypair)> {
        if self.current.as_ref().is_some_and(|k| k.local == index) {
            return self.current.as_mut().map(|k| (Slot::Current, k));
        }
        if let Some(i) = self.older.iter().position(|k| k.local == index) {
            return Some((Slot::Older, &mut self.older[i]));
        }
        let i = self.pending.iter().position(|p| p.keys.local == index)?;
        Some((Slot::Pending(i), &mut self.pending[i].keys))
    }
}

enum Slot {
    Current,
    Older,
    Pending(usize),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn psk_keys() -> Keys {
        Keys {
            psk: Some([7; 32]),
            private: None,
            peer_public: None,
        }
    }

    fn pair(keys_a: Keys, keys_b: Keys) -> (Crypto, Crypto) {
        let s = Duration::from_secs(120);
        (
            Crypto::new(SecurityMode::Encrypt, keys_a, s, 2, [1; 32]).unwrap(),
            Crypto::new(SecurityMode::Encrypt, keys_b, s, 2, [2; 32]).unwrap(),
        )
    }

    fn handshake(a: &mut Crypto, b: &mut Crypto, now: Instant) {
        let init = a.initiation(now).unwrap();
        // The sizes docs/wire.md gives.
        let ik = a.keys.private.is_some();
        assert_eq!(init.len(), if ik { 112 } else { 64 });
        let (resp, e) = b.on_handshake(now, &init);
        assert_eq!(resp.as_ref().unwrap().len(), 68);
        assert!(e.is_none());
        let (none, e) = a.on_handshake(now, &resp.unwrap());
        assert!(none.is_none());
        assert!(e.unwrap().first || e.unwrap().restart || !e.unwrap().first);
        // B confirms on A's first sealed datagram.
        let d = a.seal(0, b"hello", true).unwrap();
        let (inner, e) = b.open(0, &d).unwrap();
        assert_eq!(&inner[..], b"hello");
        assert!(e.is_some());
    }

    #[test]
    fn window_accepts_each_counter_once_and_nothing_too_old() {
        let mut w = Window::new();
        for c in [5u64, 3, 4, 2100, 2099, 60] {
            assert!(w.fresh(c), "{c}");
            w.mark(c);
            assert!(!w.fresh(c), "{c} twice");
        }
        assert!(!w.fresh(51), "more than 2048 behind 2100");
        assert!(w.fresh(53));
        w.mark(1_000_000);
        assert!(!w.fresh(2099));
        assert!(w.fresh(999_999));
    }

    #[test]
    fn psk_and_static_handshakes_give_working_keys_both_ways() {
        let (mut a, mut b) = pair(psk_keys(), psk_keys());
        handshake(&mut a, &mut b, Instant::ZERO);
        let d = b.seal(1, b"back", true).unwrap();
        assert_eq!(&a.open(1, &d).unwrap().0[..], b"back");
        let (pa, pb) = ([3u8; 32], [4u8; 32]);
        let ka = Keys {
            psk: None,
            private: Some(pa),
            peer_public: Some(public_key(&pb)),
        };
        let kb = Keys {
            psk: None,
            private: Some(pb),
            peer_public: Some(public_key(&pa)),
        };
        let (mut a, mut b) = pair(ka.clone(), kb.clone());
        handshake(&mut a, &mut b, Instant::ZERO);
        // A third party with the wrong static key cannot complete a handshake with B.
        let kc = Keys {
            psk: None,
            private: Some([5; 32]),
            peer_public: Some(public_key(&pb)),
        };
        let (mut c, mut b2) = pair(kc, kb);
        let init = c.initiation(Instant::ZERO).unwrap();
        let (resp, _) = b2.on_handshake(Instant::ZERO, &init);
        assert!(resp.is_none());
        assert_eq!(b2.stats.failed, 1);
    }

    #[test]
    fn wrong_psk_fails_and_tampering_replay_and_channel_moves_are_rejected() {
        let mut other = psk_keys();
        other.psk = Some([8; 32]);
        let (mut a, mut b) = pair(psk_keys(), other);
        let init = a.initiation(Instant::ZERO).unwrap();
        assert!(b.on_handshake(Instant::ZERO, &init).0.is_none());

        let (mut a, mut b) = pair(psk_keys(), psk_keys());
        handshake(&mut a, &mut b, Instant::ZERO);
        let d = a.seal(0, b"payload", true).unwrap();
        assert_eq!(b.open(1, &d), Err(Reject::BadTag));
        let mut t = d.to_vec();
        t[HEADER_LEN] ^= 1;
        assert_eq!(b.open(0, &Bytes::from(t)), Err(Reject::BadTag));
        assert!(b.open(0, &d).is_ok());
        assert_eq!(b.open(0, &d), Err(Reject::Replay));
        // Encrypted: the body is not in clear.
        let d = a.seal(0, b"secret words", true).unwrap();
        assert!(!d.windows(12).any(|w| w == b"secret words"));
    }

    #[test]
    fn replayed_initiation_is_answered_but_never_confirmed() {
        let (mut a, mut b) = pair(psk_keys(), psk_keys());
        handshake(&mut a, &mut b, Instant::ZERO);
        let old_init = {
            let mut a2 = Crypto::new(
                SecurityMode::Encrypt,
                psk_keys(),
                Duration::from_secs(120),
                2,
                [9; 32],
            )
            .unwrap();
            a2.initiation(Instant::ZERO).unwrap()
        };
        // Replayed many times: answered from the cache, keys unchanged.
        for _ in 0..20 {
            assert!(b.on_handshake(Instant::ZERO, &old_init).0.is_some());
        }
        let d = a.seal(0, b"still", true).unwrap();
        assert_eq!(b.open(0, &d).unwrap().1, None);
        assert_eq!(b.stats.completed, 1);
    }

    #[test]
    fn restart_is_recognised_by_the_run_identifier() {
        let (mut a, mut b) = pair(psk_keys(), psk_keys());
        handshake(&mut a, &mut b, Instant::ZERO);
        let mut a2 = Crypto::new(
            SecurityMode::Encrypt,
            psk_keys(),
            Duration::from_secs(120),
            2,
            [10; 32],
        )
        .unwrap();
        let init = a2.initiation(Instant::ZERO).unwrap();
        let (resp, _) = b.on_handshake(Instant::ZERO, &init);
        a2.on_handshake(Instant::ZERO, &resp.unwrap());
        let d = a2.seal(0, b"x", true).unwrap();
        let e = b.open(0, &d).unwrap().1.unwrap();
        assert!(e.restart && !e.first);
    }

    #[test]
    fn auth_mode_leaves_the_body_readable_and_protects_it() {
        let s = Duration::from_secs(120);
        let mut a = Crypto::new(SecurityMode::Auth, psk_keys(), s, 1, [1; 32]).unwrap();
        let mut b = Crypto::new(SecurityMode::Auth, psk_keys(), s, 1, [2; 32]).unwrap();
        let init = a.initiation(Instant::ZERO).unwrap();
        let resp = b.on_handshake(Instant::ZERO, &init).0.unwrap();
        a.on_handshake(Instant::ZERO, &resp);
        let d = a.seal(0, b"visible text", false).unwrap();
        assert_eq!(&d[HEADER_LEN..HEADER_LEN + 12], b"visible text");
        let mut t = d.to_vec();
        t[HEADER_LEN] ^= 1;
        assert_eq!(b.open(0, &Bytes::from(t)), Err(Reject::BadTag));
        assert_eq!(&b.open(0, &d).unwrap().0[..], b"visible text");
    }

    #[test]
    fn keys_need_a_psk_or_both_static_keys() {
        let none = Keys {
            psk: None,
            private: None,
            peer_public: None,
        };
        assert!(none.check().is_err());
        let half = Keys {
            psk: Some([1; 32]),
            private: Some([1; 32]),
            peer_public: None,
        };
        assert!(half.check().unwrap_err().contains("peer's public key"));
    }
}
