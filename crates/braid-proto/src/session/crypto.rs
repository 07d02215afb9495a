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

use super::settings::{Mismatch, Settings};
use crate::time::{Duration, Instant};
use crate::wire::secure::{self, Handshake, Header, ECHO_LEN, HEADER_LEN, TAG_LEN};

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
/// At most one rejection per channel this often (the initiator repeats its initiation
/// every heartbeat on every channel; one answer is enough, and a bound keeps a flood of
/// forged initiations from turning us into a reflector).
const REJECT_EVERY: Duration = Duration::from_millis(250);
/// Handshake failures and mismatches are reported at once the first time, then at
/// most once this often, with the count since the last report.
pub const REPORT_EVERY: Duration = Duration::from_secs(10);
/// Room for a handshake message and its payload (64 channels of settings fit).
const MSG_MAX: usize = 1024;
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
    /// The peer answered it with a rejection or with settings we cannot use: not sent
    /// again; a new one after [`HANDSHAKE_TIMEOUT`].
    refused: bool,
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
    /// Handshake messages that failed (wrong key, corrupted, replayed response), and
    /// rejections of ours that the peer sent back.
    pub failed: u64,
    /// Initiations answered (including copies and replays).
    pub answered: u64,
    /// Rejections the peer sent us (also counted in `failed`).
    pub rejected: u64,
    /// Rejections we sent.
    pub rejections_sent: u64,
    /// Handshakes refused because the peer's settings differ from ours.
    pub mismatched: u64,
    /// Handshake responses received (that named an initiation of ours).
    pub responses: u64,
}

/// Why a handshake failed, in words a person can act on ([`std::fmt::Display`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeFailure {
    /// An initiation from the peer's address did not authenticate with our keys.
    Unauthenticated {
        /// We use static keys (else a pre-shared key only).
        static_keys: bool,
    },
    /// A static-key initiation authenticated, but from a static key that is not the
    /// peer public key configured here.
    UnknownKey {
        /// The initiator's static public key.
        theirs: [u8; KEY_LEN],
        /// The peer public key configured here.
        expected: [u8; KEY_LEN],
    },
    /// An initiation of the other key kind (static keys, or a pre-shared key only).
    KeyKind {
        /// The initiator uses static keys.
        theirs_static: bool,
    },
    /// An initiation authenticated, but its payload is not one we can read.
    Unreadable,
    /// The peer rejected our initiation (a `wire::secure::REJECT_*` reason).
    /// Unauthenticated: it could be forged by whoever sees our initiation.
    Rejected {
        /// Its reason code.
        reason: u8,
        /// We use static keys.
        static_keys: bool,
    },
    /// The peer's response to our initiation did not authenticate.
    ResponseUnauthenticated,
}

fn b64(k: &[u8; KEY_LEN]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(k)
}

const KEYS_DIFFER_PSK: &str = "the two ends have different pre-shared keys \
     (use the same key file at both ends)";
const KEYS_DIFFER_STATIC: &str = "the peer public key configured at one end is not the \
     other end's public key (`braid pubkey < private.key` prints an end's public key)";

impl HandshakeFailure {
    /// Seen by us as the initiator, in answer to our own initiation: the other end
    /// refuses us (as opposed to an initiation of the other end that we refused).
    pub fn is_answer(&self) -> bool {
        matches!(
            self,
            HandshakeFailure::Rejected { .. } | HandshakeFailure::ResponseUnauthenticated
        )
    }
}

impl std::fmt::Display for HandshakeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use HandshakeFailure as F;
        match *self {
            F::Unauthenticated { static_keys: false } => write!(
                f,
                "it does not authenticate with our pre-shared key: {KEYS_DIFFER_PSK}"
            ),
            F::Unauthenticated { static_keys: true } => write!(
                f,
                "it does not authenticate with our static key: the peer public key \
                 configured at the other end is not our public key (`braid pubkey < \
                 private.key` prints an end's public key)"
            ),
            F::UnknownKey { theirs, expected } => write!(
                f,
                "it comes from static key {}, but the peer public key configured \
                 here is {}: one end has the wrong peer public key",
                b64(&theirs),
                b64(&expected)
            ),
            F::KeyKind { theirs_static } => write!(
                f,
                "it uses {}, we use {}: both ends must use the same kind of key",
                if theirs_static {
                    "static keys"
                } else {
                    "a pre-shared key only"
                },
                if theirs_static {
                    "a pre-shared key only"
                } else {
                    "static keys"
                }
            ),
            F::Unreadable => write!(
                f,
                "it authenticates but carries settings we cannot read: the two \
                 ends run different versions of braid"
            ),
            F::Rejected {
                reason,
                static_keys,
            } => {
                write!(f, "the peer rejected our handshake")?;
                match reason {
                    secure::REJECT_UNAUTHENTICATED if static_keys => write!(
                        f,
                        ", which does not authenticate with its static key: the keys \
                         differ; the peer public key configured here is not the other \
                         end's public key (`braid pubkey < private.key` at the other end \
                         prints it)"
                    ),
                    secure::REJECT_UNAUTHENTICATED => write!(
                        f,
                        ", which does not authenticate with its keys: the keys differ; \
                         {KEYS_DIFFER_PSK}"
                    ),
                    secure::REJECT_UNKNOWN_KEY => write!(
                        f,
                        ": our public key is not the peer public key configured there: the \
                         keys differ; {KEYS_DIFFER_STATIC}"
                    ),
                    secure::REJECT_KEY_KIND => write!(
                        f,
                        ": it uses {}: both ends must use the same kind of key",
                        if static_keys {
                            "a pre-shared key only, we use static keys"
                        } else {
                            "static keys, we use a pre-shared key only"
                        }
                    ),
                    secure::REJECT_UNREADABLE => write!(
                        f,
                        ": it cannot read our settings: the two ends run different versions \
                         of braid"
                    ),
                    r => write!(f, " (reason {r}, unknown to this version of braid)"),
                }
            }
            F::ResponseUnauthenticated => write!(
                f,
                "the peer's handshake response does not authenticate with our keys: the keys \
                 differ; {KEYS_DIFFER_PSK}"
            ),
        }
    }
}

/// What a handshake message led to.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// To send back on the channel it came on.
    pub reply: Option<Bytes>,
    /// A handshake completed.
    pub established: Option<Established>,
    /// It failed: why, and the failures of this kind since the last report, when one
    /// is due (see [`REPORT_EVERY`]).
    pub failure: Option<(HandshakeFailure, u64)>,
    /// The peer's settings differ from ours: the first difference, whether it came in
    /// answer to our own initiation (else in an initiation, possibly a replayed one),
    /// and the count since the last report, when one is due.
    pub mismatch: Option<(Mismatch, bool, u64)>,
}

/// The first report at once, then at most one per [`REPORT_EVERY`].
#[derive(Default)]
struct Throttle {
    last: Option<Instant>,
    count: u64,
}

impl Throttle {
    /// One more; `Some(count since the last report)` when a report is due.
    fn hit(&mut self, now: Instant) -> Option<u64> {
        self.count += 1;
        if self.last.is_some_and(|l| now - l < REPORT_EVERY) {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.count))
    }
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
    /// Our settings block (after the run identifier in the handshake payload).
    settings: Settings,
    /// Per channel: handshake failures seen on it (both roles).
    failed_on: Vec<u64>,
    /// Per channel: when we may send the next rejection.
    next_reject: Vec<Option<Instant>>,
    /// Reports of: failures as responder, failures as initiator, mismatches.
    throttles: [Throttle; 3],
    /// A mismatch in answer to our initiation was reported (the first one always is).
    answer_reported: bool,
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
        settings: Settings,
        seed: [u8; 32],
    ) -> Result<Crypto, String> {
        let channels = settings.weights.len();
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
            settings,
            failed_on: vec![0; channels],
            next_reject: vec![None; channels],
            throttles: Default::default(),
            answer_reported: false,
        })
    }

    /// Datagrams missing on channel `c` (see the `missing` field).
    pub fn missing(&self, c: usize) -> u64 {
        self.missing.get(c).copied().unwrap_or(0)
    }

    /// Handshake failures seen on channel `c`.
    pub fn failed_on(&self, c: usize) -> u64 {
        self.failed_on.get(c).copied().unwrap_or(0)
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
                return (!i.refused).then(|| i.msg.clone());
            }
        }
        let mut hs = self.new_handshake(true).ok()?;
        let index = self.fresh_index();
        let mut buf = [0u8; MSG_MAX];
        let n = hs.write_message(&self.payload(), &mut buf).ok()?;
        let msg = Bytes::from(
            Handshake::Init {
                static_keys: self.keys.private.is_some(),
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
            refused: false,
        });
        Some(msg)
    }

    /// The Noise payload of our handshake messages: run identifier, settings.
    fn payload(&self) -> Vec<u8> {
        let mut p = self.run.to_be_bytes().to_vec();
        p.extend_from_slice(&self.settings.to_vec());
        p
    }

    /// A failure seen on channel `c`: counted, and reported when due.
    fn fail(&mut self, now: Instant, c: usize, f: HandshakeFailure, out: &mut Outcome) {
        self.stats.failed += 1;
        if let Some(n) = self.failed_on.get_mut(c) {
            *n += 1;
        }
        let t = usize::from(f.is_answer());
        if let Some(count) = self.throttles[t].hit(now) {
            out.failure = Some((f, count));
        }
    }

    /// A rejection of the initiation `noise` from key index `sender`, if one may be
    /// sent on channel `c` now.
    fn reject(
        &mut self,
        now: Instant,
        c: usize,
        sender: u32,
        noise: &[u8],
        reason: u8,
    ) -> Option<Bytes> {
        let next = self.next_reject.get_mut(c)?;
        if next.is_some_and(|t| now < t) || noise.len() < ECHO_LEN {
            return None;
        }
        *next = Some(now + REJECT_EVERY);
        let mut echo = [0u8; ECHO_LEN];
        echo.copy_from_slice(&noise[..ECHO_LEN]);
        self.stats.rejections_sent += 1;
        Some(Bytes::from(
            Handshake::Reject {
                reason,
                receiver: sender,
                echo,
            }
            .to_vec(),
        ))
    }

    /// The peer's run identifier and settings from a handshake payload.
    fn read_payload(p: &[u8]) -> Option<(u64, Settings)> {
        let run = u64::from_be_bytes(p.get(..8)?.try_into().ok()?);
        Some((run, Settings::parse(&p[8..])?))
    }

    /// A handshake message arrived on channel `c`: what to send back, whether a
    /// handshake completed, and what went wrong.
    pub fn on_handshake(&mut self, now: Instant, c: usize, datagram: &Bytes) -> Outcome {
        let mut out = Outcome::default();
        match Handshake::parse(datagram) {
            Ok(Handshake::Init {
                static_keys,
                sender,
                noise,
            }) => self.on_init(now, c, datagram, static_keys, sender, noise, &mut out),
            Ok(Handshake::Resp {
                sender,
                receiver,
                noise,
            }) => self.on_resp(now, c, sender, receiver, noise, &mut out),
            Ok(Handshake::Reject {
                reason,
                receiver,
                echo,
            }) => self.on_reject(now, c, reason, receiver, echo, &mut out),
            Err(_) => {
                self.stats.failed += 1;
                if let Some(n) = self.failed_on.get_mut(c) {
                    *n += 1;
                }
            }
        }
        out
    }

    #[allow(clippy::too_many_arguments)]
    fn on_init(
        &mut self,
        now: Instant,
        c: usize,
        datagram: &Bytes,
        static_keys: bool,
        sender: u32,
        noise: &[u8],
        out: &mut Outcome,
    ) {
        if let Some(p) = self.pending.iter().find(|p| p.init == *datagram) {
            self.stats.answered += 1;
            out.reply = Some(p.response.clone());
            return;
        }
        let ours_static = self.keys.private.is_some();
        if static_keys != ours_static {
            let f = HandshakeFailure::KeyKind {
                theirs_static: static_keys,
            };
            self.fail(now, c, f, out);
            out.reply = self.reject(now, c, sender, noise, secure::REJECT_KEY_KIND);
            return;
        }
        let Ok(mut hs) = self.new_handshake(false) else {
            return;
        };
        let mut payload = [0u8; MSG_MAX];
        let read = hs.read_message(noise, &mut payload);
        let Ok(len) = read else {
            let f = HandshakeFailure::Unauthenticated {
                static_keys: ours_static,
            };
            self.fail(now, c, f, out);
            out.reply = self.reject(now, c, sender, noise, secure::REJECT_UNAUTHENTICATED);
            return;
        };
        // IK: the initiator's static key travels in the message; it must be the one
        // configured for the peer.
        if let Some(want) = self.keys.peer_public {
            if hs.get_remote_static() != Some(&want[..]) {
                let mut theirs = [0u8; KEY_LEN];
                if let Some(k) = hs.get_remote_static().filter(|k| k.len() == KEY_LEN) {
                    theirs.copy_from_slice(k);
                }
                let f = HandshakeFailure::UnknownKey {
                    theirs,
                    expected: want,
                };
                self.fail(now, c, f, out);
                out.reply = self.reject(now, c, sender, noise, secure::REJECT_UNKNOWN_KEY);
                return;
            }
        }
        let Some((peer_run, theirs)) = Self::read_payload(&payload[..len]) else {
            self.fail(now, c, HandshakeFailure::Unreadable, out);
            out.reply = self.reject(now, c, sender, noise, secure::REJECT_UNREADABLE);
            return;
        };
        let mismatch = self.settings.mismatch(&theirs);
        let index = self.fresh_index();
        let mut buf = [0u8; MSG_MAX];
        let Ok(n) = hs.write_message(&self.payload(), &mut buf) else {
            return;
        };
        let response = Bytes::from(
            Handshake::Resp {
                sender: index,
                receiver: sender,
                noise: &buf[..n],
            }
            .to_vec(),
        );
        self.stats.answered += 1;
        out.reply = Some(response.clone());
        if let Some(m) = mismatch {
            // Answered (our settings in it tell the initiator what differs), but no
            // keys are kept: the initiator cannot confirm this handshake.
            // Without keys we initiate ourselves every heartbeat and learn it from the
            // peer's answer: reported here only when an established peer comes back
            // with other settings (a restart), where nothing else would tell.
            self.stats.mismatched += 1;
            if self.current.is_some() {
                if let Some(count) = self.throttles[2].hit(now) {
                    out.mismatch = Some((m, false, count));
                }
            }
            return;
        }
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
            response,
        });
    }

    fn on_resp(
        &mut self,
        now: Instant,
        c: usize,
        sender: u32,
        receiver: u32,
        noise: &[u8],
        out: &mut Outcome,
    ) {
        let Some(init) = self
            .init
            .as_mut()
            .filter(|i| i.index == receiver && !i.refused)
        else {
            // A copy of the response we already used (the initiation went out on every
            // channel), or of one we refused, is no failure; anything else is.
            let ours = self.current.as_ref().is_some_and(|k| k.local == receiver)
                || self.init.as_ref().is_some_and(|i| i.index == receiver);
            if !ours {
                self.stats.failed += 1;
                if let Some(n) = self.failed_on.get_mut(c) {
                    *n += 1;
                }
            }
            return;
        };
        self.stats.responses += 1;
        let mut payload = [0u8; MSG_MAX];
        let read = init
            .hs
            .read_message(noise, &mut payload)
            .ok()
            .and_then(|n| Self::read_payload(&payload[..n]));
        let Some((peer_run, theirs)) = read else {
            init.refused = true;
            self.fail(now, c, HandshakeFailure::ResponseUnauthenticated, out);
            return;
        };
        if let Some(m) = self.settings.mismatch(&theirs) {
            // The answer to our own initiation: authenticated and fresh.
            init.refused = true;
            self.stats.mismatched += 1;
            let due = self.throttles[2].hit(now);
            if due.is_some() || !self.answer_reported {
                self.answer_reported = true;
                out.mismatch = Some((m, true, due.unwrap_or(1)));
            }
            return;
        }
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
        out.established = Some(self.install(keys));
    }

    /// The peer rejected an initiation: ours if it names our outstanding one and
    /// echoes its first bytes (only who saw it can), anything else is ignored.
    fn on_reject(
        &mut self,
        now: Instant,
        c: usize,
        reason: u8,
        receiver: u32,
        echo: [u8; ECHO_LEN],
        out: &mut Outcome,
    ) {
        let start = secure::INIT_HEADER_LEN;
        let Some(init) = self.init.as_mut().filter(|i| {
            i.index == receiver && i.msg.get(start..start + ECHO_LEN) == Some(&echo[..])
        }) else {
            return;
        };
        init.refused = true;
        self.stats.rejected += 1;
        let f = HandshakeFailure::Rejected {
            reason,
            static_keys: self.keys.private.is_some(),
        };
        self.fail(now, c, f, out);
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
    use crate::config::Mode;
    use crate::sched::SchedulerKind;

    fn settings(n: usize) -> Settings {
        Settings {
            mode: Mode::Logical,
            scheduler: SchedulerKind::Srr,
            security: SecurityMode::Encrypt,
            max_packet: 1400,
            credits: None,
            weights: vec![1; n],
        }
    }

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
            Crypto::new(SecurityMode::Encrypt, keys_a, s, settings(2), [1; 32]).unwrap(),
            Crypto::new(SecurityMode::Encrypt, keys_b, s, settings(2), [2; 32]).unwrap(),
        )
    }

    fn handshake(a: &mut Crypto, b: &mut Crypto, now: Instant) {
        let init = a.initiation(now).unwrap();
        // The sizes docs/wire.md gives.
        let ik = a.keys.private.is_some();
        assert_eq!(init.len(), if ik { 148 } else { 100 });
        let o = b.on_handshake(now, 0, &init);
        let resp = o.reply.unwrap();
        assert_eq!(resp.len(), 104);
        assert!(o.established.is_none());
        let o = a.on_handshake(now, 0, &resp);
        assert!(o.reply.is_none() && o.failure.is_none() && o.mismatch.is_none());
        assert!(o.established.is_some());
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
        let o = b2.on_handshake(Instant::ZERO, 1, &init);
        assert!(o.established.is_none());
        assert_eq!(b2.stats.failed, 1);
        assert_eq!(b2.failed_on(1), 1);
        // B says which key it saw, and answers with a rejection, not a response.
        let (f, count) = o.failure.unwrap();
        assert_eq!(count, 1);
        assert!(
            matches!(f, HandshakeFailure::UnknownKey { theirs, .. } if theirs == public_key(&[5; 32]))
        );
        assert!(f.to_string().contains("wrong peer public key"), "{f}");
        let o = c.on_handshake(Instant::ZERO, 1, &o.reply.unwrap());
        let (f, _) = o.failure.unwrap();
        assert_eq!(
            f,
            HandshakeFailure::Rejected {
                reason: secure::REJECT_UNKNOWN_KEY,
                static_keys: true
            }
        );
        assert!(f.to_string().contains("keys differ"), "{f}");
        assert_eq!(c.stats.rejected, 1);
    }

    #[test]
    fn wrong_psk_fails_and_tampering_replay_and_channel_moves_are_rejected() {
        let mut other = psk_keys();
        other.psk = Some([8; 32]);
        let (mut a, mut b) = pair(psk_keys(), other);
        let init = a.initiation(Instant::ZERO).unwrap();
        let o = b.on_handshake(Instant::ZERO, 0, &init);
        assert!(o.established.is_none());
        assert!(matches!(
            o.failure,
            Some((HandshakeFailure::Unauthenticated { static_keys: false }, 1))
        ));
        let reject = o.reply.unwrap();
        assert!(
            reject.len() < init.len(),
            "never larger than what it answers"
        );
        // A is told at once, and stops sending that initiation.
        let o = a.on_handshake(Instant::ZERO, 0, &reject);
        assert!(o.failure.unwrap().0.is_answer());
        assert_eq!(a.initiation(Instant::ZERO), None);
        assert!(a.initiation(Instant::ZERO + HANDSHAKE_TIMEOUT).is_some());

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
                settings(2),
                [9; 32],
            )
            .unwrap();
            a2.initiation(Instant::ZERO).unwrap()
        };
        // Replayed many times: answered from the cache, keys unchanged.
        for _ in 0..20 {
            assert!(b.on_handshake(Instant::ZERO, 0, &old_init).reply.is_some());
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
            settings(2),
            [10; 32],
        )
        .unwrap();
        let init = a2.initiation(Instant::ZERO).unwrap();
        let resp = b.on_handshake(Instant::ZERO, 0, &init).reply;
        a2.on_handshake(Instant::ZERO, 0, &resp.unwrap());
        let d = a2.seal(0, b"x", true).unwrap();
        let e = b.open(0, &d).unwrap().1.unwrap();
        assert!(e.restart && !e.first);
    }

    #[test]
    fn auth_mode_leaves_the_body_readable_and_protects_it() {
        let s = Duration::from_secs(120);
        let mut a = Crypto::new(SecurityMode::Auth, psk_keys(), s, settings(1), [1; 32]).unwrap();
        let mut b = Crypto::new(SecurityMode::Auth, psk_keys(), s, settings(1), [2; 32]).unwrap();
        let init = a.initiation(Instant::ZERO).unwrap();
        let resp = b.on_handshake(Instant::ZERO, 0, &init).reply.unwrap();
        a.on_handshake(Instant::ZERO, 0, &resp);
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

    #[test]
    fn other_settings_are_refused_and_named_at_both_ends() {
        let s = Duration::from_secs(120);
        let mut a =
            Crypto::new(SecurityMode::Encrypt, psk_keys(), s, settings(2), [1; 32]).unwrap();
        let mut trr = settings(2);
        trr.mode = Mode::Trr;
        let mut b =
            Crypto::new(SecurityMode::Encrypt, psk_keys(), s, trr.clone(), [2; 32]).unwrap();
        let init = a.initiation(Instant::ZERO).unwrap();
        // B answers (its settings are in the answer) but keeps no keys. Without keys it
        // initiates itself and learns the difference from A's answer: no report here.
        let o = b.on_handshake(Instant::ZERO, 0, &init);
        assert!(o.mismatch.is_none() && b.stats.mismatched == 1);
        // A learns it from the answer to its own initiation, and uses no keys.
        let o = a.on_handshake(Instant::ZERO, 0, &o.reply.unwrap());
        assert!(o.established.is_none());
        let (m, answer, _) = o.mismatch.unwrap();
        assert!(answer);
        assert_eq!(
            (m.setting, m.ours.as_str(), m.theirs.as_str()),
            ("mode", "\"logical\"", "\"trr\"")
        );
        assert_eq!(
            m.to_string(),
            "the peer's mode is \"trr\", ours is \"logical\": both ends must use the same mode"
        );
        assert!(!a.ready() && !b.ready());
        // The refused initiation is not sent again; a new one after the timeout, whose
        // answer is counted but reported only after REPORT_EVERY (with the count).
        assert_eq!(a.initiation(Instant::ZERO), None);
        let t1 = Instant::ZERO + HANDSHAKE_TIMEOUT;
        let again = a.initiation(t1).unwrap();
        let r = b.on_handshake(t1, 0, &again).reply.unwrap();
        assert!(a.on_handshake(t1, 0, &r).mismatch.is_none());
        let t2 = Instant::ZERO + REPORT_EVERY;
        let again = a.initiation(t2).unwrap();
        let r = b.on_handshake(t2, 0, &again).reply.unwrap();
        assert_eq!(a.on_handshake(t2, 0, &r).mismatch.unwrap().2, 2);
        // An established end whose peer comes back with other settings reports the
        // initiation itself (it is not initiating).
        let (mut a, mut b) = pair(psk_keys(), psk_keys());
        handshake(&mut a, &mut b, Instant::ZERO);
        let mut b2 = Crypto::new(SecurityMode::Encrypt, psk_keys(), s, trr, [3; 32]).unwrap();
        let init = b2.initiation(Instant::ZERO).unwrap();
        let (m, answer, _) = a.on_handshake(Instant::ZERO, 0, &init).mismatch.unwrap();
        assert!(!answer && m.setting == "mode");
        assert!(a.ready(), "the established keys are kept");
    }

    #[test]
    fn rejections_are_rate_limited_and_forged_ones_ignored() {
        let mut other = psk_keys();
        other.psk = Some([8; 32]);
        let (mut a, mut b) = pair(psk_keys(), other);
        let init = a.initiation(Instant::ZERO).unwrap();
        assert!(b.on_handshake(Instant::ZERO, 0, &init).reply.is_some());
        // The same initiation again on channel 0 within REJECT_EVERY: counted, no answer;
        // on channel 1: answered.
        let o = b.on_handshake(Instant::ZERO, 0, &init);
        assert!(o.reply.is_none() && o.failure.is_none());
        assert!(b.on_handshake(Instant::ZERO, 1, &init).reply.is_some());
        assert_eq!((b.failed_on(0), b.failed_on(1)), (2, 1));
        assert!(b
            .on_handshake(Instant::ZERO + REJECT_EVERY, 0, &init)
            .reply
            .is_some());
        // A rejection that does not echo our initiation is not ours.
        let forged = Handshake::Reject {
            reason: secure::REJECT_UNAUTHENTICATED,
            receiver: u32::from_be_bytes(init[4..8].try_into().unwrap()),
            echo: [0; ECHO_LEN],
        };
        let o = a.on_handshake(Instant::ZERO, 0, &Bytes::from(forged.to_vec()));
        assert!(o.failure.is_none());
        assert_eq!(a.stats.rejected, 0);
        assert!(a.initiation(Instant::ZERO).is_some(), "still sent");
    }
}
