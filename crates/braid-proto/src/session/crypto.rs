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
//!   arrives. The responder only once the first datagram sealed with them arrives: an
//!   unconfirmed handshake never replaces the keys in use. It waits as the one pending
//!   handshake, which only a newer initiation from the peer (its timestamp) replaces.
//! * **Cheap checks first.** Every initiation and response carries mac1, keyed by the
//!   receiver's static public key (or the pre-shared key), checked before any
//!   public-key work. Under load (see [`LOAD_JOBS`], [`LOAD_RATE`]) the responder answers
//!   initiations without a valid mac2 with a cookie reply (64 bytes, smaller than any
//!   initiation) bound to the channel's peer address, and does public-key work only for
//!   those that carry mac2 over that cookie; the cookie secret changes every
//!   [`COOKIE_ROTATE`]. Public-key work is rate-limited per source ([`SOURCE_RATE`]) and
//!   can run off the data path ([`HandshakeJob`]).
//! * **Replays.** Each initiation carries a timestamp (TAI64N, sealed in the Noise
//!   payload); an initiation is accepted only if its timestamp is newer than the newest
//!   one accepted from the peer, so a recorded initiation is never answered again.
//! * **Restarts.** Each end picks a random run identifier at start and sends it inside
//!   the handshake; a confirmed handshake with a new run identifier means the peer
//!   restarted. The timestamp is the wall clock at start plus the time since, so it
//!   grows within a run whatever the clock does, and a restarted peer's is newer unless
//!   its clock went back past its last initiation (then it is refused until its clock
//!   passes that point, as in WireGuard).
//! * **Timers** (constants, in WireGuard's spirit): a new handshake after `rekey_after`
//!   (configured) or [`REKEY_AFTER_COUNT`] datagrams on a channel; keys older than
//!   [`Crypto::reject_after`] or past [`REJECT_AFTER_COUNT`] are no longer used; a new
//!   handshake when nothing authenticated came from the peer for
//!   [`REHANDSHAKE_AFTER_SILENCE`]; an unanswered initiation is replaced after
//!   [`HANDSHAKE_TIMEOUT`] plus a random jitter of up to [`HANDSHAKE_JITTER`].
//! * **Sealing.** An AEAD per datagram with the direction's key ([`Cipher`]:
//!   AES-256-GCM when both ends ask for it in the handshake, which they do on CPUs with
//!   AES instructions; ChaCha20-Poly1305 otherwise); the nonce is the channel index and
//!   a per-channel counter; the receiver keeps a window of 2048 counters per channel and
//!   key. Mode `auth` authenticates the body without encrypting it.
//!
//! Randomness comes from a seed the driver passes in (a deterministic generator keyed by
//! it), so the simulator stays reproducible and the core reads no entropy on its own.

use blake2::digest::consts::U16;
use blake2::digest::core_api::{Block, Buffer, UpdateCore, VariableOutputCore};
use blake2::digest::Output;
use blake2::digest::{Digest, Mac};
use blake2::{Blake2s256, Blake2sMac, Blake2sVarCore};
use bytes::Bytes;
use chacha20poly1305::aead::{Aead as _, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM, CHACHA20_POLY1305};
use snow::params::{CipherChoice, DHChoice, HashChoice};
use snow::resolvers::{CryptoResolver, DefaultResolver};
use snow::types::{Cipher as NoiseCipher, Dh, Hash, Random};

use std::net::SocketAddr;

use super::settings::{Mismatch, Settings};
use crate::arena::Arena;
use crate::time::{Duration, Instant};
use crate::wire::secure::{
    self, Handshake, Header, Timestamp, COOKIE_NONCE_LEN, COOKIE_SEALED_LEN, ECHO_LEN, HEADER_LEN,
    INIT_HEADER_LEN, LANE_MAIN, LANE_PROBE, MAC_LEN, TAG_LEN, TIMESTAMP_LEN,
};

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

/// The AEAD that seals a session's datagrams. Both have a 32-byte key, a 96-bit nonce
/// and a 16-byte tag, so the wire format and every size are the same with either.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cipher {
    /// ChaCha20-Poly1305 (RFC 8439): fast everywhere, in constant time without special
    /// instructions; the default when either end lacks AES instructions.
    ChaCha20Poly1305,
    /// AES-256-GCM (NIST SP 800-38D): several times faster than ChaCha20-Poly1305 on
    /// CPUs with AES and carry-less multiply instructions (x86-64 AES-NI and PCLMULQDQ,
    /// ARMv8 AES and PMULL); used when both ends ask for it.
    Aes256Gcm,
}

impl Cipher {
    /// Its name, as in the configuration and `braid status`.
    pub fn name(self) -> &'static str {
        match self {
            Cipher::ChaCha20Poly1305 => "chacha20-poly1305",
            Cipher::Aes256Gcm => "aes-256-gcm",
        }
    }

    /// The cipher of a session whose ends ask (`true`) or do not ask for AES-256-GCM.
    pub fn agreed(ours: bool, theirs: bool) -> Cipher {
        if ours && theirs {
            Cipher::Aes256Gcm
        } else {
            Cipher::ChaCha20Poly1305
        }
    }
}

/// Does this CPU have the instructions that make AES-256-GCM faster than
/// ChaCha20-Poly1305 (what `cipher = "auto"` asks the peer for)?
pub fn aes_hardware() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("aes")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("aes")
            && std::arch::is_aarch64_feature_detected!("pmull")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// Length of keys (X25519 private and public, pre-shared).
pub const KEY_LEN: usize = 32;
/// The receiver accepts counters up to this far behind the highest seen on a channel.
pub const REPLAY_WINDOW: u64 = 2048;
/// Keys a session can receive with at once: the pending one, the current one and up to
/// three older ones.
pub const RECEIVING_KEYS: usize = 2 + MAX_OLDER;
/// How far past a window's top a counter may be and still be plausible: a peer's
/// counters on a channel pass the top we accepted only by what it sent there since
/// (lost or in flight). 2^24 datagrams is over 16 s at a million a second, far more than
/// a session survives without hearing anything; a forger who does not see the
/// channel's traffic guesses a counter in range once in 2^32 tries (of 2^56).
pub const PLAUSIBLE_AHEAD: u64 = 1 << 24;

/// Could a sealed datagram with `counter` be accepted by a receive window whose top is
/// `top` (see [`Crypto::receive_windows`])? Not if it is older than the window (the
/// session would refuse it as a replay) or implausibly far ahead of it.
pub fn plausible_counter(top: u64, counter: u64) -> bool {
    counter.saturating_add(REPLAY_WINDOW) >= top && counter < top.saturating_add(PLAUSIBLE_AHEAD)
}

/// Start a new handshake once a channel's counter passes this (about 36 minutes of
/// a channel at a million datagrams a second; `rekey_after` comes long before).
pub const REKEY_AFTER_COUNT: u64 = 1 << 31;
/// With AES-256-GCM, start a new handshake once a key sealed this many datagrams on all
/// channels together: 2^27 datagrams of at most 94 AES blocks (1500 bytes) are 2^33.6
/// blocks, within the 2^34.5 that TLS 1.3 allows an AES-GCM key (RFC 8446, 5.5: a
/// margin of about 2^-57). ChaCha20-Poly1305 needs no such limit. At half a million
/// datagrams a second it is four and a half minutes; `rekey_after` (2 minutes by
/// default) mostly comes first.
pub const AES_GCM_REKEY_AFTER_TOTAL: u64 = 1 << 27;
/// Never seal with a counter at or beyond this (a new handshake is overdue): the
/// envelope carries the counter in 32 bits (`wire::secure`), so no counter a key seals
/// with is ever cut short, and no nonce repeats.
pub const REJECT_AFTER_COUNT: u64 = 1 << 32;
/// An initiation not answered within this long (plus a jitter) is replaced by a new
/// one.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(1);
/// The most random time added to [`HANDSHAKE_TIMEOUT`] (so that the two ends, or many
/// sessions, do not retry in step).
pub const HANDSHAKE_JITTER: Duration = Duration::from_millis(333);
/// Keys are no longer used (for sending or receiving) this long after the latest time
/// either end re-keys them (1.5 × `rekey_after`, see `due`).
pub const REJECT_AFTER_MARGIN: Duration = Duration::from_secs(60);
/// Nothing authenticated from the peer for this long: a new handshake (its keys may be
/// gone, say after a restart whose initiations did not reach us).
pub const REHANDSHAKE_AFTER_SILENCE: Duration = Duration::from_secs(15);
/// The responder's cookie secret is replaced this often; a cookie the initiator holds
/// is used for as long.
pub const COOKIE_ROTATE: Duration = Duration::from_secs(120);
/// Under load when this many handshake jobs are out (handed to the driver, not back).
pub const LOAD_JOBS: usize = 4;
/// Under load when more initiations than this needed public-key work in one second.
pub const LOAD_RATE: u32 = 16;
/// Under load for this long after either.
pub const LOAD_HOLD: Duration = Duration::from_secs(1);
/// Initiations per second one source (channel: its peer address) may have processed
/// with public-key work, after a burst of [`SOURCE_BURST`].
pub const SOURCE_RATE: u64 = 20;
/// See [`SOURCE_RATE`].
pub const SOURCE_BURST: u64 = 5;
/// Cookie replies one source (channel) gets per second at most, after a burst of
/// [`COOKIE_REPLY_BURST`]: a flood of initiations with a valid mac1 (whoever knows the
/// public key can make them) does not turn into as many replies to send. The genuine
/// initiator, sending a copy every heartbeat, still gets one within seconds.
pub const COOKIE_REPLY_RATE: u64 = 1000;
/// See [`COOKIE_REPLY_RATE`].
pub const COOKIE_REPLY_BURST: u64 = 100;
/// Handshake jobs out at most; more initiations are shed (counted).
pub const MAX_JOBS: usize = 32;
/// The mac1 values of initiations already processed that are remembered (a copy or a
/// replay of one costs no public-key work).
const SEEN: usize = 256;
const LABEL_MAC1: &[u8] = b"braid mac1 v2";
const LABEL_COOKIE: &[u8] = b"braid cookie v2";
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
    fn resolve_cipher(&self, choice: &CipherChoice) -> Option<Box<dyn NoiseCipher>> {
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
            (Some(_), Some(_), _) => Some(PATTERN_IK),
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

/// The Noise pattern with static keys at both ends.
const PATTERN_IK: &str = "Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s";

/// BLAKE2s-256 of a label and a key: the keys of mac1 and of the cookie reply.
fn derive(label: &[u8], key: &[u8]) -> [u8; 32] {
    Blake2s256::new()
        .chain_update(label)
        .chain_update(key)
        .finalize()
        .into()
}

/// A run identifier for this end's streams ([`crate::stream::StreamConfig::run`]) from
/// the session's seed: a hash, so that announcing it tells nothing of the seed.
pub(crate) fn streams_run(seed: &[u8; 32]) -> u64 {
    let h = derive(b"braid streams run", seed);
    u64::from_le_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]]).max(1)
}

/// Keyed BLAKE2s-128 of `data`.
fn mac16(key: &[u8], data: &[u8]) -> [u8; MAC_LEN] {
    let mut m = <Blake2sMac<U16> as KeyInit>::new_from_slice(key).expect("keys of 16 to 32 bytes");
    Mac::update(&mut m, data);
    m.finalize().into_bytes().into()
}

/// Does `tag` verify as [`mac16`] of `data` (in constant time)?
#[cfg(test)]
fn mac16_ok(key: &[u8], data: &[u8], tag: &[u8]) -> bool {
    KeyedMac::new(key).verify(data, tag)
}

/// [`mac16`] under one key, its key block compressed once: a message then costs only
/// its own blocks (an initiation's mac1 three compressions instead of four, its mac2
/// likewise). A keyed `Blake2sMac` cannot be reused that way: it keeps the key block
/// in its buffer until data follows, so every clone of it compresses the key again.
#[derive(Clone)]
struct KeyedMac {
    /// BLAKE2s for a 16-byte MAC with this key length, after the key block.
    core: Blake2sVarCore,
    /// The key, for an empty message (the key block is then the last one).
    key: [u8; 32],
    key_len: usize,
}

impl KeyedMac {
    /// For a key of 1 to 32 bytes.
    fn new(key: &[u8]) -> KeyedMac {
        assert!(
            (1..=32).contains(&key.len()),
            "BLAKE2s keys are 1 to 32 bytes"
        );
        let mut core = Blake2sVarCore::new_with_params(&[], &[], key.len(), MAC_LEN);
        let mut block = Block::<Blake2sVarCore>::default();
        block[..key.len()].copy_from_slice(key);
        core.update_blocks(std::slice::from_ref(&block));
        let mut k = [0u8; 32];
        k[..key.len()].copy_from_slice(key);
        KeyedMac {
            core,
            key: k,
            key_len: key.len(),
        }
    }

    /// The MAC of `data`: [`mac16`] with this key.
    fn mac(&self, data: &[u8]) -> [u8; MAC_LEN] {
        if data.is_empty() {
            return mac16(&self.key[..self.key_len], data);
        }
        let mut core = self.core.clone();
        let mut buffer = Buffer::<Blake2sVarCore>::default();
        buffer.digest_blocks(data, |blocks| core.update_blocks(blocks));
        let mut full = Output::<Blake2sVarCore>::default();
        core.finalize_variable_core(&mut buffer, &mut full);
        let mut m = [0u8; MAC_LEN];
        m.copy_from_slice(&full[..MAC_LEN]);
        m
    }

    /// Does `tag` verify as the MAC of `data` (compared in constant time)?
    fn verify(&self, data: &[u8], tag: &[u8]) -> bool {
        let m = self.mac(data);
        let diff = m.iter().zip(tag).fold(0u8, |acc, (a, b)| acc | (a ^ b));
        std::hint::black_box(diff) == 0 && tag.len() == MAC_LEN
    }
}

/// The keys of the cheap checks, from the static public keys (or the pre-shared key
/// when static keys are not used): mac1 of a message is keyed by its receiver's key,
/// a cookie reply is sealed with its sender's.
#[derive(Clone)]
struct MacKeys {
    /// mac1 of messages to the peer.
    mac1_out: [u8; 32],
    /// Seals the cookie replies we send.
    cookie_in: [u8; 32],
    /// Opens the cookie replies the peer sends.
    cookie_out: [u8; 32],
    /// mac1 of messages to us: the MAC with its key block compressed.
    mac1_in_keyed: KeyedMac,
}

impl MacKeys {
    fn new(keys: &Keys) -> MacKeys {
        let (ours, theirs) = match (&keys.private, &keys.peer_public, &keys.psk) {
            (Some(p), Some(peer), _) => (public_key(p), *peer),
            (_, _, Some(psk)) => (*psk, *psk),
            _ => ([0; 32], [0; 32]),
        };
        MacKeys {
            mac1_in_keyed: KeyedMac::new(&derive(LABEL_MAC1, &ours)),
            mac1_out: derive(LABEL_MAC1, &theirs),
            cookie_in: derive(LABEL_COOKIE, &ours),
            cookie_out: derive(LABEL_COOKIE, &theirs),
        }
    }
}

/// A Noise handshake state for these keys (`seed` feeds its ephemeral key).
fn build(
    pattern: &'static str,
    keys: &Keys,
    seed: [u8; 32],
    initiator: bool,
) -> Result<snow::HandshakeState, snow::Error> {
    let params = pattern.parse().expect("a valid pattern");
    let mut b = snow::Builder::with_resolver(params, Box::new(Seeded(seed))).prologue(PROLOGUE)?;
    if let Some(p) = &keys.private {
        b = b.local_private_key(p)?;
    }
    if let (Some(p), true) = (&keys.peer_public, initiator) {
        b = b.remote_public_key(p)?;
    }
    let at = if keys.private.is_some() { 2 } else { 0 };
    let psk = keys.psk.unwrap_or([0u8; 32]);
    b = b.psk(at, &psk)?;
    if initiator {
        b.build_initiator()
    } else {
        b.build_responder()
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
    /// Next counter per channel, then per channel's probe lane (`n + c`).
    counters: Vec<u64>,
    /// Receive windows, laid out as `counters`.
    windows: Vec<Window>,
    peer_run: u64,
    /// The peer's number of channels (its settings): the bond runs over the channels
    /// both ends have.
    peer_channels: usize,
    /// The peer's streams run, if it takes TCP carried as streams (its settings).
    peer_streams: Option<u64>,
    /// We initiated the handshake that made it.
    initiator: bool,
    /// The AEAD of `send` and `recv`.
    cipher: Cipher,
}

impl Keypair {
    fn new(
        local: u32,
        remote: u32,
        (send, recv, cipher): ([u8; 32], [u8; 32], Cipher),
        now: Instant,
        channels: usize,
        peer_run: u64,
        initiator: bool,
    ) -> Keypair {
        Keypair {
            local,
            remote,
            send: Aead::new(cipher, &send),
            recv: Aead::new(cipher, &recv),
            created: now,
            // Lane 0 of each channel, then its probe lane (`wire::secure`).
            counters: vec![0; 2 * channels],
            windows: vec![Window::new(); 2 * channels],
            peer_run,
            peer_channels: channels,
            peer_streams: None,
            initiator,
            cipher,
        }
    }
}

/// The slot of channel `c`'s `lane` in a keypair's counters and windows, for `n`
/// channels.
fn lane_slot(n: usize, c: usize, lane: u8) -> usize {
    if lane == LANE_PROBE {
        n + c
    } else {
        c
    }
}

/// The nonce's channel word: the channel index, its top bit set in the probe lane.
fn lane_word(c: usize, lane: u8) -> u32 {
    if lane == LANE_PROBE {
        0x8000_0000 | c as u32
    } else {
        c as u32
    }
}

fn nonce(channel: u32, counter: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[..4].copy_from_slice(&channel.to_be_bytes());
    n[4..].copy_from_slice(&counter.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

/// The session's AEAD ([`Cipher`]) with a detached tag, in place. ring's
/// implementations: the same bytes as any other, several times faster per datagram
/// than the portable ones (see docs/tunnel.md, "Speed"; docs/performance.md, "The
/// cipher").
struct Aead(LessSafeKey);

impl Aead {
    fn new(cipher: Cipher, key: &[u8; 32]) -> Aead {
        let alg = match cipher {
            Cipher::ChaCha20Poly1305 => &CHACHA20_POLY1305,
            Cipher::Aes256Gcm => &AES_256_GCM,
        };
        let k = UnboundKey::new(alg, key).expect("a 32-byte key is valid");
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
    /// Its bytes, mac2 zero.
    msg: Bytes,
    /// Its mac1 (a cookie reply is sealed with it as associated data).
    mac1: [u8; MAC_LEN],
    started: Instant,
    /// Replaced by a new one after this long.
    timeout: Duration,
    /// The peer answered it with a rejection or with settings we cannot use: not sent
    /// again; a new one after its timeout.
    refused: bool,
}

/// The handshake we answered, waiting for the initiator's first sealed datagram.
struct Pending {
    keys: Keypair,
    /// The mac1 of the initiation it answered (to answer a copy the same way).
    mac1: [u8; MAC_LEN],
    response: Bytes,
}

/// What we know of one source of handshakes: a channel, whose socket hears only the
/// peer's address on it.
#[derive(Clone, Default)]
struct Source {
    /// The peer's address on this channel (the driver's bytes; a cookie is bound to it).
    addr: AddressBytes,
    /// Rate limit (GCRA): when the source's allowance is next fully spent.
    tat: Option<Instant>,
    /// The same for its cookie replies.
    cookie_tat: Option<Instant>,
    /// The peer's cookie for us on this channel, and when it came.
    cookie: Option<([u8; MAC_LEN], Instant)>,
    /// Our cookie for this source ([`Crypto::cookie`]), made once per secret and
    /// address: a flood under load checks mac2 without deriving it again each time.
    ours: Option<OurCookie>,
}

/// Our cookie for one source, for the secret made at `secret_made`.
#[derive(Clone)]
struct OurCookie {
    secret_made: Instant,
    cookie: [u8; MAC_LEN],
    /// mac2's key (the cookie), its block compressed.
    keyed: KeyedMac,
}

/// A GCRA rate limit: `rate` per second after a burst of `burst`; true if one more is
/// allowed now (and counted).
fn gcra(tat: &mut Option<Instant>, now: Instant, rate: u64, burst: u64) -> bool {
    let interval = Duration::from_micros(1_000_000 / rate);
    let next = tat.map_or(now, |t| if t > now { t } else { now }) + interval;
    if next - now > Duration::from_micros(interval.as_micros() * burst) {
        return false;
    }
    *tat = Some(next);
    true
}

impl Source {
    /// One public-key operation for this source, if its rate allows.
    fn take(&mut self, now: Instant) -> bool {
        gcra(&mut self.tat, now, SOURCE_RATE, SOURCE_BURST)
    }

    /// One cookie reply to this source, if its rate allows.
    fn take_cookie_reply(&mut self, now: Instant) -> bool {
        gcra(
            &mut self.cookie_tat,
            now,
            COOKIE_REPLY_RATE,
            COOKIE_REPLY_BURST,
        )
    }
}

/// Public-key work of an initiation that passed the cheap checks: read it, check who
/// sent it, write the response. [`HandshakeJob::run`] needs nothing else (no session),
/// so a driver can run it on another thread and hand the [`HandshakeDone`] back
/// (`Session::handle_handshake_done`).
pub struct HandshakeJob {
    channel: usize,
    /// Where the initiation came from (the driver's address, if it gives one).
    source: Option<SocketAddr>,
    /// The initiation.
    init: Bytes,
    mac1: [u8; MAC_LEN],
    sender: u32,
    pattern: &'static str,
    keys: Keys,
    mac1_out: [u8; 32],
    seed: [u8; 32],
    /// Our key index for the response.
    index: u32,
    /// Our response payload.
    payload: Vec<u8>,
}

/// A [`HandshakeJob`] done.
pub struct HandshakeDone {
    channel: usize,
    source: Option<SocketAddr>,
    init: Bytes,
    mac1: [u8; MAC_LEN],
    sender: u32,
    result: Result<Accepted, (HandshakeFailure, u8)>,
}

impl std::fmt::Debug for HandshakeJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HandshakeJob(channel {})", self.channel)
    }
}

impl std::fmt::Debug for HandshakeDone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HandshakeDone(channel {}, ok {})",
            self.channel,
            self.result.is_ok()
        )
    }
}

impl HandshakeDone {
    /// The channel the initiation came on.
    pub fn channel(&self) -> usize {
        self.channel
    }

    /// The address the initiation came from, if the driver gave one: the answer goes
    /// back there, and an accepted initiation makes it the channel's endpoint.
    pub fn source(&self) -> Option<SocketAddr> {
        self.source
    }
}

/// An initiation read and answered (the session then checks its timestamp).
struct Accepted {
    index: u32,
    response: Bytes,
    /// (initiator to responder, responder to initiator) keys.
    split: ([u8; 32], [u8; 32]),
    peer_run: u64,
    timestamp: Timestamp,
    theirs: Settings,
}

impl HandshakeJob {
    /// The channel the initiation came on.
    pub fn channel(&self) -> usize {
        self.channel
    }

    /// Do the public-key work (two to four X25519 operations).
    pub fn run(self) -> HandshakeDone {
        let result = self.work();
        HandshakeDone {
            channel: self.channel,
            source: self.source,
            init: self.init,
            mac1: self.mac1,
            sender: self.sender,
            result,
        }
    }

    fn work(&self) -> Result<Accepted, (HandshakeFailure, u8)> {
        let static_keys = self.keys.private.is_some();
        let unauthenticated = (
            HandshakeFailure::Unauthenticated { static_keys },
            secure::REJECT_UNAUTHENTICATED,
        );
        let mut hs =
            build(self.pattern, &self.keys, self.seed, false).map_err(|_| unauthenticated)?;
        let noise = &self.init[INIT_HEADER_LEN..self.init.len() - 2 * MAC_LEN];
        let mut payload = [0u8; MSG_MAX];
        let len = hs
            .read_message(noise, &mut payload)
            .map_err(|_| unauthenticated)?;
        // IK: the initiator's static key travels in the message; it must be the one
        // configured for the peer.
        if let Some(want) = self.keys.peer_public {
            if hs.get_remote_static() != Some(&want[..]) {
                let mut theirs = [0u8; KEY_LEN];
                if let Some(k) = hs.get_remote_static().filter(|k| k.len() == KEY_LEN) {
                    theirs.copy_from_slice(k);
                }
                return Err((
                    HandshakeFailure::UnknownKey {
                        theirs,
                        expected: want,
                    },
                    secure::REJECT_UNKNOWN_KEY,
                ));
            }
        }
        let (peer_run, timestamp, theirs) = Crypto::read_init_payload(&payload[..len])
            .ok_or((HandshakeFailure::Unreadable, secure::REJECT_UNREADABLE))?;
        let mut buf = [0u8; MSG_MAX];
        let n = hs
            .write_message(&self.payload, &mut buf)
            .map_err(|_| unauthenticated)?;
        let mut response = Handshake::Resp {
            sender: self.index,
            receiver: self.sender,
            noise: &buf[..n],
            mac1: [0; MAC_LEN],
        }
        .to_vec();
        let at = response.len() - MAC_LEN;
        let mac1 = mac16(&self.mac1_out, &response[..at]);
        response[at..].copy_from_slice(&mac1);
        Ok(Accepted {
            index: self.index,
            response: Bytes::from(response),
            split: hs.dangerously_get_raw_split(),
            peer_run,
            timestamp,
            theirs,
        })
    }
}

/// The receiver's key index a datagram carries, if it carries one: a sealed datagram
/// or a handshake message other than an initiation (a response, rejection or cookie
/// reply). A server finds the session it is for by it (see
/// [`Crypto::set_index_prefix`]); `None` for an initiation and anything else.
pub fn receiver_index(datagram: &[u8]) -> Option<u32> {
    match datagram.first()? {
        &crate::wire::TYPE_SEALED | &crate::wire::TYPE_SIGNED => {
            Header::parse(datagram).ok().map(|h| h.index)
        }
        &crate::wire::TYPE_HS_RESP => match Handshake::parse(datagram).ok()? {
            Handshake::Resp { receiver, .. }
            | Handshake::Reject { receiver, .. }
            | Handshake::Cookie { receiver, .. } => Some(receiver),
            Handshake::Init { .. } => None,
        },
        _ => None,
    }
}

/// The high 16 bits of a key index: the session it belongs to on a server
/// ([`Crypto::set_index_prefix`]).
pub fn index_prefix(index: u32) -> u16 {
    (index >> 16) as u16
}

/// Reads who sent an initiation, for a server with many peers: the static public key
/// inside it tells which peer's session it is for. The cheap check first
/// ([`InitiationReader::mac1_ok`], keyed by our public key, as every session of ours
/// checks it), then [`InitiationReader::initiator`]: the public-key work of reading
/// Noise message 1 (two X25519 operations); nothing is answered and no state is kept.
pub struct InitiationReader {
    keys: Keys,
    mac1_in: KeyedMac,
}

impl InitiationReader {
    /// For our static private key. (The pre-shared key, if any, is mixed in after
    /// message 1: reading it needs none.)
    pub fn new(private: [u8; KEY_LEN]) -> InitiationReader {
        InitiationReader {
            mac1_in: KeyedMac::new(&derive(LABEL_MAC1, &public_key(&private))),
            keys: Keys {
                psk: None,
                private: Some(private),
                peer_public: None,
            },
        }
    }

    /// Is `datagram` an initiation with static keys whose mac1 is ours? (One keyed
    /// BLAKE2s over it: cheap.)
    pub fn mac1_ok(&self, datagram: &[u8]) -> bool {
        match Handshake::parse(datagram) {
            Ok(Handshake::Init {
                static_keys: true,
                mac1,
                ..
            }) => {
                let at = datagram.len() - 2 * MAC_LEN;
                self.mac1_in.verify(&datagram[..at], &mac1)
            }
            _ => false,
        }
    }

    /// The initiator's static public key, if `datagram` is an initiation to us that
    /// reads (its sender proved it holds that key's private half only once the whole
    /// handshake completes: the peer's session does that).
    pub fn initiator(&self, datagram: &[u8]) -> Option<[u8; KEY_LEN]> {
        let Ok(Handshake::Init {
            static_keys: true,
            noise,
            ..
        }) = Handshake::parse(datagram)
        else {
            return None;
        };
        // The peer's key is what we read: our keys alone are not a pattern.
        let mut hs = build(PATTERN_IK, &self.keys, [0; 32], false).ok()?;
        let mut payload = [0u8; MSG_MAX];
        hs.read_message(noise, &mut payload).ok()?;
        let k = hs.get_remote_static()?;
        let mut key = [0u8; KEY_LEN];
        (k.len() == KEY_LEN).then(|| {
            key.copy_from_slice(k);
            key
        })
    }
}

/// A server's cookies, checked before an initiation's key is read (the step
/// [`InitiationReader::initiator`] makes, with public-key work): under load, an
/// initiation must carry a mac2 over a cookie bound to its source (the channel and the
/// address it came from), as a session asks of its peer (`docs/security.md`); one
/// without it gets a cookie reply instead, which the initiator opens and answers as any
/// session's (the same format and keys: the reply is sealed under a key from the
/// server's public key, with the initiation's mac1 as associated data). A forged
/// source never receives its cookie, so it gets no public-key work.
pub struct ServerCookies {
    /// Seals the cookie replies.
    seal: [u8; 32],
    /// The secret and when it was made; replaced after [`COOKIE_ROTATE`].
    secret: Option<([u8; 32], Instant)>,
    drbg: Drbg,
}

impl ServerCookies {
    /// For the server's static private key; `seed` feeds the secrets and nonces.
    pub fn new(private: &[u8; KEY_LEN], seed: [u8; 32]) -> ServerCookies {
        ServerCookies {
            seal: derive(LABEL_COOKIE, &public_key(private)),
            secret: None,
            drbg: Drbg::new(seed),
        }
    }

    /// The cookie for this source now (a new secret every [`COOKIE_ROTATE`]).
    fn cookie(&mut self, now: Instant, channel: usize, addr: &[u8]) -> [u8; MAC_LEN] {
        let secret = match self.secret {
            Some((s, t)) if now - t < COOKIE_ROTATE => s,
            _ => {
                let s = self.drbg.seed();
                self.secret = Some((s, now));
                s
            }
        };
        cookie_for(&secret, channel, addr)
    }

    /// Does the initiation `datagram` from `addr` ([`address_bytes`]) on `channel`
    /// carry a mac2 over our current cookie for that source?
    pub fn mac2_ok(&mut self, now: Instant, channel: usize, addr: &[u8], datagram: &[u8]) -> bool {
        let Ok(Handshake::Init { mac2, .. }) = Handshake::parse(datagram) else {
            return false;
        };
        let cookie = self.cookie(now, channel, addr);
        KeyedMac::new(&cookie).verify(&datagram[..datagram.len() - MAC_LEN], &mac2)
    }

    /// The cookie reply to the initiation `datagram` from that source (64 bytes,
    /// smaller than the initiation), or None if it is no initiation.
    pub fn reply(
        &mut self,
        now: Instant,
        channel: usize,
        addr: &[u8],
        datagram: &[u8],
    ) -> Option<Bytes> {
        let Ok(Handshake::Init { sender, mac1, .. }) = Handshake::parse(datagram) else {
            return None;
        };
        let cookie = self.cookie(now, channel, addr);
        let mut nonce = [0u8; COOKIE_NONCE_LEN];
        self.drbg.fill(&mut nonce);
        let payload = Payload {
            msg: &cookie,
            aad: &mac1,
        };
        let v = XChaCha20Poly1305::new(&self.seal.into())
            .encrypt(XNonce::from_slice(&nonce), payload)
            .ok()?;
        let mut sealed = [0u8; COOKIE_SEALED_LEN];
        sealed.copy_from_slice(&v);
        let reply = Handshake::Cookie {
            receiver: sender,
            nonce,
            sealed,
        };
        Some(Bytes::from(reply.to_vec()))
    }
}

/// An address as the bytes a cookie is bound to: the IP address's octets, then the
/// port (6 or 18 bytes, held in place: a server computes one for every initiation it
/// checks under a flood).
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct AddressBytes {
    bytes: [u8; 18],
    len: u8,
}

impl AddressBytes {
    /// The first 18 of `b` (any bytes a driver names an address with).
    pub fn from_slice(b: &[u8]) -> AddressBytes {
        let mut a = AddressBytes::default();
        let n = b.len().min(a.bytes.len());
        a.bytes[..n].copy_from_slice(&b[..n]);
        a.len = n as u8;
        a
    }
}

impl std::ops::Deref for AddressBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// [`AddressBytes`] of `a`.
pub fn address_bytes(a: SocketAddr) -> AddressBytes {
    let mut v = [0u8; 18];
    let n = match a.ip() {
        std::net::IpAddr::V4(ip) => {
            v[..4].copy_from_slice(&ip.octets());
            4
        }
        std::net::IpAddr::V6(ip) => {
            v[..16].copy_from_slice(&ip.octets());
            16
        }
    };
    v[n..n + 2].copy_from_slice(&a.port().to_be_bytes());
    AddressBytes::from_slice(&v[..n + 2])
}

/// The cookie for `addr` ([`AddressBytes`]) on `channel` under `secret`: a MAC over
/// the channel's index (one byte), then the address, built without allocating.
fn cookie_for(secret: &[u8; 32], channel: usize, addr: &[u8]) -> [u8; MAC_LEN] {
    let a = AddressBytes::from_slice(addr);
    let mut id = [0u8; 19];
    id[0] = channel as u8;
    id[1..1 + a.len()].copy_from_slice(&a);
    mac16(secret, &id[..1 + a.len()])
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
    /// The peer's number of channels (fixed for a run).
    pub peer_channels: usize,
    /// The peer's streams run, if it takes TCP carried as streams.
    pub peer_streams: Option<u64>,
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
    /// Handshake messages whose mac1 did not verify (counted in `failed` too).
    pub mac1_failures: u64,
    /// Cookie replies we sent (under load, to initiations without a valid mac2).
    pub cookie_replies_sent: u64,
    /// Cookie replies from the peer that we could open.
    pub cookie_replies_received: u64,
    /// Initiations not processed because their source's rate (of public-key work, or
    /// under load of cookie replies) was spent.
    pub rate_limited: u64,
    /// Initiations not processed because too many were waiting for public-key work.
    pub shed: u64,
    /// Initiations refused as replays: a copy of one already processed, or one whose
    /// timestamp is not newer than the newest accepted from the peer.
    pub replays: u64,
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
    /// A handshake message of another version (`wire::secure::HS_VERSION`): the peer
    /// runs a braid whose datagrams this one cannot read. Unauthenticated.
    OtherVersion {
        /// Its version.
        theirs: u8,
        /// It is a response (an answer to our initiation), not an initiation.
        answer: bool,
    },
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
            HandshakeFailure::Rejected { .. }
                | HandshakeFailure::ResponseUnauthenticated
                | HandshakeFailure::OtherVersion { answer: true, .. }
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
            } => fmt_rejected(f, reason, static_keys),
            F::ResponseUnauthenticated => write!(
                f,
                "the peer's handshake response does not authenticate with our keys: the keys \
                 differ; {KEYS_DIFFER_PSK}"
            ),
            F::OtherVersion { theirs, .. } => write!(
                f,
                "it speaks handshake version {theirs}, this braid speaks {}: the two ends \
                 run versions of braid that cannot read each other's datagrams (upgrade \
                 the older end)",
                secure::HS_VERSION
            ),
        }
    }
}

/// [`HandshakeFailure::Rejected`] in words: the peer rejected our handshake, and why
/// by its `reason` code (`static_keys`: we use static keys).
fn fmt_rejected(
    f: &mut std::fmt::Formatter<'_>,
    reason: u8,
    static_keys: bool,
) -> std::fmt::Result {
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

/// A handshake initiation as it came: the datagram and its parsed fields.
struct InitMsg<'a> {
    /// The whole datagram (its macs cover its bytes before them).
    datagram: &'a Bytes,
    /// The initiator uses static keys (else a pre-shared key only).
    static_keys: bool,
    /// The initiator's key index.
    sender: u32,
    /// The Noise handshake message.
    noise: &'a [u8],
    mac1: [u8; MAC_LEN],
    mac2: [u8; MAC_LEN],
}

/// What a handshake message led to.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// To send back on the channel it came on (to the address it came from).
    pub reply: Option<Bytes>,
    /// It authenticated as the peer's and is fresh: an initiation accepted (its
    /// timestamp newer than any before), or the response to our outstanding
    /// initiation. Its source may become the channel's endpoint.
    pub authenticated: bool,
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

/// When the responder counts as under load.
#[derive(Default)]
struct Load {
    /// Start of the current one-second window, and the initiations that needed
    /// public-key work in it.
    window: Option<Instant>,
    count: u32,
    /// Under load until then.
    until: Option<Instant>,
}

/// The security state of one session end.
pub(crate) struct Crypto {
    pub mode: SecurityMode,
    /// Where sealed and opened datagrams are written (no allocation per packet).
    pub arena: Arena,
    keys: Keys,
    macs: MacKeys,
    pattern: &'static str,
    rekey_after: Duration,
    channels: usize,
    drbg: Drbg,
    run: u64,
    next_index: u32,
    /// The high 16 bits of every key index we choose ([`Crypto::set_index_prefix`]).
    index_prefix: Option<u16>,
    // Boxed, as both are there only during a handshake: an established session (each
    // of a server's idle peers) holds two pointers instead of some 2 KB.
    init: Option<Box<Initiation>>,
    pending: Option<Box<Pending>>,
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
    /// Nanoseconds since 1970 at `Instant::ZERO` (our timestamps: this plus `now`).
    wall_base: u128,
    /// The newest timestamp of an initiation accepted from the peer.
    newest_ts: Option<Timestamp>,
    /// Per channel: rate limit, address, the peer's cookie.
    sources: Vec<Source>,
    /// Our cookie secret and when it was made.
    cookie_secret: Option<([u8; 32], Instant)>,
    load: Load,
    /// The mac1 of initiations processed or being processed.
    seen: std::collections::VecDeque<[u8; MAC_LEN]>,
    /// Jobs handed out and not back yet, and their mac1.
    inflight: Vec<[u8; MAC_LEN]>,
    /// Hand public-key work out ([`Crypto::poll_job`]) instead of doing it at once.
    offload: bool,
    jobs: std::collections::VecDeque<HandshakeJob>,
    /// When an authenticated datagram last came from the peer.
    last_heard: Option<Instant>,
    /// The peer said it ends its run (a close message): its keys are of no more use,
    /// and a new handshake is due until one completes ([`Crypto::peer_ended`]).
    peer_ended: bool,
    /// The source of the handshake message being handled, if the driver gave one.
    source: Option<SocketAddr>,
    /// The last datagram [`Crypto::open`] accepted was the newest yet on its channel
    /// under the current (or pending) keys: not a late one, not under older keys.
    pub newest: bool,
    /// The lane of the last datagram [`Crypto::open`] accepted (`wire::secure`).
    pub lane: u8,
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
            arena: Arena::new(),
            macs: MacKeys::new(&keys),
            keys,
            pattern,
            rekey_after,
            channels,
            drbg,
            run,
            next_index,
            index_prefix: None,
            init: None,
            pending: None,
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
            wall_base: 0,
            newest_ts: None,
            sources: vec![Source::default(); channels],
            cookie_secret: None,
            load: Load::default(),
            // Grown as initiations come (at most SEEN): an idle peer has seen one or two.
            seen: std::collections::VecDeque::new(),
            inflight: Vec::new(),
            offload: false,
            jobs: std::collections::VecDeque::new(),
            last_heard: None,
            peer_ended: false,
            source: None,
            newest: false,
            lane: LANE_MAIN,
        })
    }

    /// The wall clock: `unix_nanos` nanoseconds since 1970 at `now`. Our initiations'
    /// timestamps are this plus the time since (without it: the time since
    /// `Instant::ZERO`).
    pub fn set_wall_clock(&mut self, now: Instant, unix_nanos: u128) {
        self.wall_base = unix_nanos.saturating_sub(u128::from(now.as_micros()) * 1000);
    }

    /// The peer's address on channel `c` (any bytes that name it): cookies are bound
    /// to it.
    pub fn set_channel_address(&mut self, c: usize, addr: &[u8]) {
        if let Some(s) = self.sources.get_mut(c) {
            if *s.addr != *addr {
                s.addr = AddressBytes::from_slice(addr);
                s.ours = None;
            }
        }
    }

    /// Hand public-key work to the driver ([`Crypto::poll_job`]) from now on.
    pub fn offload(&mut self) {
        self.offload = true;
    }

    /// The next public-key work to do.
    pub fn poll_job(&mut self) -> Option<HandshakeJob> {
        self.jobs.pop_front()
    }

    /// A job the driver could not run (its queue was full): forgotten, counted.
    pub fn shed(&mut self, job: HandshakeJob) {
        self.inflight.retain(|m| *m != job.mac1);
        self.forget_seen(&job.mac1);
        self.stats.shed += 1;
    }

    fn forget_seen(&mut self, mac1: &[u8; MAC_LEN]) {
        if let Some(i) = self.seen.iter().position(|m| m == mac1) {
            self.seen.remove(i);
        }
    }

    /// Keys are not used past this age.
    pub fn reject_after(&self) -> Duration {
        let r = self.rekey_after.as_micros();
        Duration::from_micros(r + r / 2) + REJECT_AFTER_MARGIN
    }

    /// Datagrams missing on channel `c` (see the `missing` field).
    pub fn missing(&self, c: usize) -> u64 {
        self.missing.get(c).copied().unwrap_or(0)
    }

    /// Handshake failures seen on channel `c`.
    pub fn failed_on(&self, c: usize) -> u64 {
        self.failed_on.get(c).copied().unwrap_or(0)
    }

    /// Is a handshake due or under way (our initiation outstanding)?
    pub fn handshaking(&self) -> bool {
        self.init.is_some()
    }

    /// Do we have keys to send with?
    pub fn ready(&self) -> bool {
        self.current.is_some()
    }

    /// The cipher of the keys we send with, once there are any.
    pub fn cipher(&self) -> Option<Cipher> {
        self.current.as_ref().map(|k| k.cipher)
    }

    /// Our run identifier.
    pub fn run(&self) -> u64 {
        self.run
    }

    fn fresh_index(&mut self) -> u32 {
        self.next_index = match self.index_prefix {
            // The prefix stays; the low half counts on (wrapping inside it).
            Some(p) => (u32::from(p) << 16) | (self.next_index.wrapping_add(1) & 0xFFFF),
            None => self.next_index.wrapping_add(1),
        };
        self.next_index
    }

    /// Our key indices from now on all start with `prefix` (their high 16 bits): a
    /// server that drives one session per peer over shared sockets finds a sealed
    /// datagram's session by the index it carries ([`index_prefix`]).
    pub fn set_index_prefix(&mut self, prefix: u16) {
        self.index_prefix = Some(prefix);
    }

    /// The receive windows of every key a sealed datagram may name now (the pending,
    /// current and older keys, at most [`RECEIVING_KEYS`]): for each, its local index
    /// and, per channel, the window's top (highest counter accepted + 1; 0: none yet),
    /// then the same for every channel's probe lane (`wire::secure`): `2 n` tops.
    /// A driver that queues datagrams before the session opens them can drop, unopened,
    /// those no key could accept ([`plausible_counter`]).
    pub fn receive_windows(&self, mut each: impl FnMut(u32, &mut dyn Iterator<Item = u64>)) {
        let keys = self
            .pending
            .as_ref()
            .map(|p| &p.keys)
            .into_iter()
            .chain(self.current.as_ref())
            .chain(self.older.iter());
        for k in keys {
            // Lane 0 of every channel, then every channel's probe lane.
            each(k.local, &mut k.windows.iter().map(|w| w.top));
        }
    }

    /// The peer closed its session (an authenticated close message): handshake again
    /// at once, and until it works, rather than after
    /// [`REHANDSHAKE_AFTER_SILENCE`]. A server that restarts knows no client address
    /// (behind NAT it could not reach one anyway), so its clients must initiate; its
    /// new run answers the first initiation that reaches it.
    pub fn peer_ended(&mut self) {
        self.peer_ended = true;
    }

    /// Is a (new) handshake due: no keys, the peer ended its run, keys older than
    /// `rekey_after`, a counter near its end, or the peer silent for [`REHANDSHAKE_AFTER_SILENCE`] (and the
    /// keys at least that old)? The end that initiated the current keys re-keys on the
    /// timer; the other only half a period later, if that did not happen (so the two
    /// ends do not both re-key at once, each dropping keys the other still uses).
    fn due(&self, now: Instant) -> bool {
        match &self.current {
            None => true,
            Some(_) if self.peer_ended => true,
            Some(k) => {
                let age = now - k.created;
                let limit = if k.initiator {
                    self.rekey_after
                } else {
                    self.rekey_after + Duration::from_micros(self.rekey_after.as_micros() / 2)
                };
                let silent = self
                    .last_heard
                    .is_some_and(|l| now - l >= REHANDSHAKE_AFTER_SILENCE)
                    && age >= REHANDSHAKE_AFTER_SILENCE;
                let worn = match k.cipher {
                    Cipher::Aes256Gcm => {
                        k.counters.iter().sum::<u64>() >= AES_GCM_REKEY_AFTER_TOTAL
                    }
                    Cipher::ChaCha20Poly1305 => false,
                };
                age >= limit || silent || worn || k.counters.iter().any(|&c| c >= REKEY_AFTER_COUNT)
            }
        }
    }

    /// Our timestamp now.
    fn timestamp(&self, now: Instant) -> Timestamp {
        Timestamp::from_unix_nanos(self.wall_base + u128::from(now.as_micros()) * 1000)
    }

    /// The initiation to send now, if a handshake is due: the outstanding one again
    /// (copies on several channels or a lost one), or a new one if none is outstanding
    /// or it timed out. Its mac2 is zero: [`Crypto::for_channel`] adds it.
    pub fn initiation(&mut self, now: Instant) -> Option<Bytes> {
        if !self.due(now) {
            self.init = None;
            return None;
        }
        if let Some(i) = &self.init {
            if now - i.started < i.timeout {
                return (!i.refused).then(|| i.msg.clone());
            }
        }
        let seed = self.drbg.seed();
        let mut hs = build(self.pattern, &self.keys, seed, true).ok()?;
        let index = self.fresh_index();
        let mut buf = [0u8; MSG_MAX];
        let n = hs.write_message(&self.init_payload(now), &mut buf).ok()?;
        let mut msg = Handshake::Init {
            static_keys: self.keys.private.is_some(),
            sender: index,
            noise: &buf[..n],
            mac1: [0; MAC_LEN],
            mac2: [0; MAC_LEN],
        }
        .to_vec();
        let at = msg.len() - 2 * MAC_LEN;
        let mac1 = mac16(&self.macs.mac1_out, &msg[..at]);
        msg[at..at + MAC_LEN].copy_from_slice(&mac1);
        let msg = Bytes::from(msg);
        let jitter = self.drbg.u64() % (HANDSHAKE_JITTER.as_micros() + 1);
        self.stats.initiated += 1;
        self.init = Some(Box::new(Initiation {
            index,
            hs,
            msg: msg.clone(),
            mac1,
            started: now,
            timeout: HANDSHAKE_TIMEOUT + Duration::from_micros(jitter),
            refused: false,
        }));
        Some(msg)
    }

    /// An initiation as it goes on channel `c`: with mac2 if we hold a cookie of the
    /// peer's for that channel.
    pub fn for_channel(&self, now: Instant, c: usize, msg: &Bytes) -> Bytes {
        let cookie = self
            .sources
            .get(c)
            .and_then(|s| s.cookie)
            .filter(|(_, t)| now - *t < COOKIE_ROTATE);
        let Some((cookie, _)) = cookie else {
            return msg.clone();
        };
        let mut v = msg.to_vec();
        let at = v.len() - MAC_LEN;
        let mac2 = mac16(&cookie, &v[..at]);
        v[at..].copy_from_slice(&mac2);
        Bytes::from(v)
    }

    /// The Noise payload of our initiation: run identifier, timestamp, settings.
    fn init_payload(&self, now: Instant) -> Vec<u8> {
        let mut p = self.run.to_be_bytes().to_vec();
        p.extend_from_slice(&self.timestamp(now).to_bytes());
        p.extend_from_slice(&self.settings.to_vec());
        p
    }

    /// The Noise payload of our response: run identifier, settings.
    fn payload(&self) -> Vec<u8> {
        let mut p = self.run.to_be_bytes().to_vec();
        p.extend_from_slice(&self.settings.to_vec());
        p
    }

    /// A failure seen on channel `c`: counted, and reported when due.
    fn fail(&mut self, now: Instant, c: usize, f: HandshakeFailure, out: &mut Outcome) {
        self.count_failure(c);
        let t = usize::from(f.is_answer());
        if let Some(count) = self.throttles[t].hit(now) {
            out.failure = Some((f, count));
        }
    }

    /// One more handshake failure, in all and on channel `c`.
    fn count_failure(&mut self, c: usize) {
        self.stats.failed += 1;
        if let Some(n) = self.failed_on.get_mut(c) {
            *n += 1;
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

    /// The peer's run identifier and settings from a response's payload.
    fn read_payload(p: &[u8]) -> Option<(u64, Settings)> {
        let run = u64::from_be_bytes(p.get(..8)?.try_into().ok()?);
        Some((run, Settings::parse(&p[8..])?))
    }

    /// The peer's run identifier, timestamp and settings from an initiation's payload.
    fn read_init_payload(p: &[u8]) -> Option<(u64, Timestamp, Settings)> {
        let run = u64::from_be_bytes(p.get(..8)?.try_into().ok()?);
        let ts = Timestamp::parse(p.get(8..8 + TIMESTAMP_LEN)?).ok()?;
        Some((run, ts, Settings::parse(&p[8 + TIMESTAMP_LEN..])?))
    }

    /// A handshake message arrived on channel `c`: what to send back, whether a
    /// handshake completed, and what went wrong.
    #[cfg(test)]
    pub fn on_handshake(&mut self, now: Instant, c: usize, datagram: &Bytes) -> Outcome {
        self.on_handshake_from(now, c, None, datagram)
    }

    /// [`Crypto::on_handshake`] for a message from `source` (the driver's address of
    /// its sender): a cookie we give is bound to that address, and a job carries it.
    pub fn on_handshake_from(
        &mut self,
        now: Instant,
        c: usize,
        source: Option<SocketAddr>,
        datagram: &Bytes,
    ) -> Outcome {
        self.source = source;
        if let (Some(a), Some(s)) = (source, self.sources.get_mut(c)) {
            s.addr = address_bytes(a);
        }
        let mut out = Outcome::default();
        match Handshake::parse(datagram) {
            Ok(Handshake::Init {
                static_keys,
                sender,
                noise,
                mac1,
                mac2,
            }) => {
                let init = InitMsg {
                    datagram,
                    static_keys,
                    sender,
                    noise,
                    mac1,
                    mac2,
                };
                self.on_init(now, c, &init, &mut out)
            }
            Ok(Handshake::Resp {
                sender,
                receiver,
                noise,
                mac1,
            }) => self.on_resp(now, c, datagram, sender, receiver, noise, mac1, &mut out),
            Ok(Handshake::Reject {
                reason,
                receiver,
                echo,
            }) => self.on_reject(now, c, reason, receiver, echo, &mut out),
            Ok(Handshake::Cookie {
                receiver,
                nonce,
                sealed,
            }) => self.on_cookie(now, c, receiver, nonce, sealed, &mut out),
            Err(_) => match secure::other_version(datagram) {
                Some(theirs) => {
                    let answer = datagram[0] == crate::wire::TYPE_HS_RESP;
                    let f = HandshakeFailure::OtherVersion { theirs, answer };
                    self.fail(now, c, f, &mut out);
                }
                None => self.count_failure(c),
            },
        }
        out
    }

    /// Under load now (see [`LOAD_JOBS`], [`LOAD_RATE`])?
    pub fn under_load(&self, now: Instant) -> bool {
        self.inflight.len() >= LOAD_JOBS || self.load.until.is_some_and(|u| now < u)
    }

    /// One more initiation that needs public-key work.
    fn count_work(&mut self, now: Instant) {
        if self
            .load
            .window
            .is_none_or(|w| now - w >= Duration::from_secs(1))
        {
            self.load.window = Some(now);
            self.load.count = 0;
        }
        self.load.count += 1;
        if self.load.count > LOAD_RATE || self.inflight.len() >= LOAD_JOBS {
            self.load.until = Some(now + LOAD_HOLD);
        }
    }

    /// Our cookie for the peer's address on channel `c` (a new secret when the one we
    /// have is [`COOKIE_ROTATE`] old), derived once per secret and address.
    fn cookie(&mut self, now: Instant, c: usize) -> &OurCookie {
        let (secret, made) = match self.cookie_secret {
            Some((s, t)) if now - t < COOKIE_ROTATE => (s, t),
            _ => {
                let s = self.drbg.seed();
                self.cookie_secret = Some((s, now));
                (s, now)
            }
        };
        let src = &mut self.sources[c];
        if src.ours.as_ref().is_none_or(|o| o.secret_made != made) {
            let cookie = cookie_for(&secret, c, &src.addr);
            src.ours = Some(OurCookie {
                secret_made: made,
                cookie,
                keyed: KeyedMac::new(&cookie),
            });
        }
        src.ours.as_ref().expect("made above")
    }

    /// The cookie reply to an initiation from key index `sender` with this mac1.
    fn cookie_reply(&mut self, now: Instant, c: usize, sender: u32, mac1: &[u8]) -> Bytes {
        let cookie = self.cookie(now, c).cookie;
        let mut nonce = [0u8; COOKIE_NONCE_LEN];
        self.drbg.fill(&mut nonce);
        let aead = XChaCha20Poly1305::new(&self.macs.cookie_in.into());
        let v = aead
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: &cookie,
                    aad: mac1,
                },
            )
            .expect("16 bytes seal");
        let mut sealed = [0u8; COOKIE_SEALED_LEN];
        sealed.copy_from_slice(&v);
        self.stats.cookie_replies_sent += 1;
        Bytes::from(
            Handshake::Cookie {
                receiver: sender,
                nonce,
                sealed,
            }
            .to_vec(),
        )
    }

    /// An initiation: the cheap checks (key kind, mac1, copies and replays of what we
    /// processed, mac2 under load, the source's rate), then the public-key work, now or
    /// by the driver.
    fn on_init(&mut self, now: Instant, c: usize, m: &InitMsg, out: &mut Outcome) {
        if c >= self.sources.len() {
            return;
        }
        if self.init_refused(now, c, m, out)
            || self.init_copy(&m.mac1, out)
            || !self.init_admitted(now, c, m, out)
        {
            return;
        }
        self.start_work(now, c, m, out);
    }

    /// Whether the initiation `m` on channel `c` is refused, and the peer told so by a
    /// reject (rate-limited): it uses the other key kind, or its mac1 is not made with
    /// our key (or it is junk), which needs no public-key work to see.
    fn init_refused(&mut self, now: Instant, c: usize, m: &InitMsg, out: &mut Outcome) -> bool {
        let ours_static = self.keys.private.is_some();
        if m.static_keys != ours_static {
            let f = HandshakeFailure::KeyKind {
                theirs_static: m.static_keys,
            };
            self.fail(now, c, f, out);
            out.reply = self.reject(now, c, m.sender, m.noise, secure::REJECT_KEY_KIND);
            return true;
        }
        let at = m.datagram.len() - 2 * MAC_LEN;
        if !self.macs.mac1_in_keyed.verify(&m.datagram[..at], &m.mac1) {
            // Not made with our key (or junk): no public-key work. Rejected (rate-limited,
            // smaller than the message) so that a peer with other keys is told.
            self.stats.mac1_failures += 1;
            let f = HandshakeFailure::Unauthenticated {
                static_keys: ours_static,
            };
            self.fail(now, c, f, out);
            out.reply = self.reject(now, c, m.sender, m.noise, secure::REJECT_UNAUTHENTICATED);
            return true;
        }
        false
    }

    /// Whether the initiation with this `mac1` is a copy of one answered, being
    /// processed or processed already (a copy on another channel, or a replay); a copy
    /// of the one we answered last gets the same answer again.
    fn init_copy(&mut self, mac1: &[u8; MAC_LEN], out: &mut Outcome) -> bool {
        // A copy of the initiation we answered last: the same answer (smaller than it).
        if let Some(p) = self.pending.as_ref().filter(|p| p.mac1 == *mac1) {
            self.stats.answered += 1;
            out.reply = Some(p.response.clone());
            return true;
        }
        if self.inflight.contains(mac1) {
            // A copy (on another channel) of one being processed.
            return true;
        }
        if self.seen.contains(mac1) {
            // Processed already (or being processed): a copy on another channel, or a
            // replay.
            self.stats.replays += 1;
            return true;
        }
        false
    }

    /// Whether the public-key work of the initiation `m` on channel `c` may be done:
    /// under load only with a valid mac2 (else a cookie reply, rate-limited), within
    /// the source's rate and the bound on work in flight.
    fn init_admitted(&mut self, now: Instant, c: usize, m: &InitMsg, out: &mut Outcome) -> bool {
        self.count_work(now);
        if self.under_load(now) {
            let at = m.datagram.len() - MAC_LEN;
            if !self.cookie(now, c).keyed.verify(&m.datagram[..at], &m.mac2) {
                if self.sources[c].take_cookie_reply(now) {
                    out.reply = Some(self.cookie_reply(now, c, m.sender, &m.mac1));
                } else {
                    self.stats.rate_limited += 1;
                }
                return false;
            }
        }
        if !self.sources[c].take(now) {
            self.stats.rate_limited += 1;
            return false;
        }
        if self.inflight.len() >= MAX_JOBS {
            self.stats.shed += 1;
            return false;
        }
        true
    }

    /// The public-key work of the initiation `m` on channel `c`, remembered as seen
    /// and in flight: a job the driver runs (offloaded), or run now.
    fn start_work(&mut self, now: Instant, c: usize, m: &InitMsg, out: &mut Outcome) {
        if self.seen.len() >= SEEN {
            self.seen.pop_front();
        }
        self.seen.push_back(m.mac1);
        self.inflight.push(m.mac1);
        let job = HandshakeJob {
            channel: c,
            source: self.source,
            init: m.datagram.clone(),
            mac1: m.mac1,
            sender: m.sender,
            pattern: self.pattern,
            keys: self.keys.clone(),
            mac1_out: self.macs.mac1_out,
            seed: self.drbg.seed(),
            index: self.fresh_index(),
            payload: self.payload(),
        };
        if self.offload {
            self.jobs.push_back(job);
        } else {
            let done = job.run();
            self.on_done(now, done, out);
        }
    }

    /// Public-key work done: the timestamp decides, then the answer and the pending
    /// handshake.
    pub fn on_done(&mut self, now: Instant, d: HandshakeDone, out: &mut Outcome) {
        self.inflight.retain(|m| *m != d.mac1);
        let c = d.channel;
        let a = match d.result {
            Err((f, reason)) => {
                self.fail(now, c, f, out);
                let noise = &d.init[INIT_HEADER_LEN..d.init.len() - 2 * MAC_LEN];
                out.reply = self.reject(now, c, d.sender, noise, reason);
                return;
            }
            Ok(a) => a,
        };
        if self.newest_ts.is_some_and(|t| a.timestamp <= t) {
            // A replay (or a copy overtaken by a newer initiation): never answered, and
            // it displaces nothing.
            self.stats.replays += 1;
            return;
        }
        self.newest_ts = Some(a.timestamp);
        self.stats.answered += 1;
        out.reply = Some(a.response.clone());
        out.authenticated = true;
        if let Some(m) = self.settings.mismatch(&a.theirs) {
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
        let (i2r, r2i) = a.split;
        let mut keys = Keypair::new(
            a.index,
            d.sender,
            (
                r2i,
                i2r,
                Cipher::agreed(self.settings.aes_gcm, a.theirs.aes_gcm),
            ),
            now,
            self.channels,
            a.peer_run,
            false,
        );
        keys.peer_channels = a.theirs.weights.len();
        keys.peer_streams = a.theirs.streams;
        // The newest initiation replaces the pending one: its initiator gave that up.
        self.pending = Some(Box::new(Pending {
            keys,
            mac1: d.mac1,
            response: a.response,
        }));
    }

    #[allow(clippy::too_many_arguments)]
    fn on_resp(
        &mut self,
        now: Instant,
        c: usize,
        datagram: &Bytes,
        sender: u32,
        receiver: u32,
        noise: &[u8],
        mac1: [u8; MAC_LEN],
        out: &mut Outcome,
    ) {
        let at = datagram.len() - MAC_LEN;
        let Some(init) = self
            .init
            .as_mut()
            .filter(|i| i.index == receiver && !i.refused)
            .filter(|_| self.macs.mac1_in_keyed.verify(&datagram[..at], &mac1))
        else {
            self.on_other_resp(c, &datagram[..at], receiver, &mac1);
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
        let mut keys = Keypair::new(
            init.index,
            sender,
            (
                i2r,
                r2i,
                Cipher::agreed(self.settings.aes_gcm, theirs.aes_gcm),
            ),
            now,
            self.channels,
            peer_run,
            true,
        );
        keys.peer_channels = theirs.weights.len();
        keys.peer_streams = theirs.streams;
        self.init = None;
        out.authenticated = true;
        out.established = Some(self.install(keys));
    }

    /// A response on channel `c` (its bytes before the mac `signed`) that is not an
    /// answer to our outstanding initiation from key index `receiver`: a copy of the
    /// response we already used (the initiation went out on every channel), or of one
    /// we refused, is no failure; anything else is counted one.
    fn on_other_resp(&mut self, c: usize, signed: &[u8], receiver: u32, mac1: &[u8; MAC_LEN]) {
        let ours = self.current.as_ref().is_some_and(|k| k.local == receiver)
            || self.init.as_ref().is_some_and(|i| i.index == receiver);
        if !ours || !self.macs.mac1_in_keyed.verify(signed, mac1) {
            self.count_failure(c);
            if ours {
                self.stats.mac1_failures += 1;
            }
        }
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

    /// The peer is under load and sent a cookie for our address on channel `c`: kept
    /// for that channel, and our initiation sent again on it at once with mac2 (once
    /// per new cookie: a replayed cookie reply makes us send nothing).
    fn on_cookie(
        &mut self,
        now: Instant,
        c: usize,
        receiver: u32,
        nonce: [u8; COOKIE_NONCE_LEN],
        sealed: [u8; COOKIE_SEALED_LEN],
        out: &mut Outcome,
    ) {
        let Some(init) = self
            .init
            .as_ref()
            .filter(|i| i.index == receiver && !i.refused)
        else {
            return;
        };
        let aead = XChaCha20Poly1305::new(&self.macs.cookie_out.into());
        let opened = aead.decrypt(
            XNonce::from_slice(&nonce),
            Payload {
                msg: &sealed,
                aad: &init.mac1,
            },
        );
        let Some(cookie) = opened.ok().and_then(|v| <[u8; MAC_LEN]>::try_from(v).ok()) else {
            self.stats.failed += 1;
            return;
        };
        let msg = init.msg.clone();
        self.stats.cookie_replies_received += 1;
        let Some(src) = self.sources.get_mut(c) else {
            return;
        };
        let new = src.cookie.is_none_or(|(k, _)| k != cookie);
        src.cookie = Some((cookie, now));
        if new {
            out.reply = Some(self.for_channel(now, c, &msg));
        }
    }

    fn install(&mut self, keys: Keypair) -> Established {
        let e = Established {
            first: self.peer_run.is_none(),
            restart: self.peer_run.is_some_and(|r| r != keys.peer_run),
            peer_channels: keys.peer_channels,
            peer_streams: keys.peer_streams,
        };
        self.peer_run = Some(keys.peer_run);
        self.peer_ended = false;
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

    /// Seal `parts` (one after the other: the inner datagram) for channel `c` with
    /// the current keys; `None` without keys, or with keys past their reject-after age
    /// or count.
    pub fn seal(
        &mut self,
        now: Instant,
        c: usize,
        parts: &[&[u8]],
        encrypt: bool,
    ) -> Option<Bytes> {
        self.seal_lane(now, c, LANE_MAIN, parts, encrypt)
    }

    /// [`Crypto::seal`] in channel `c`'s `lane` ([`LANE_PROBE`]: path MTU probes,
    /// with their own counter).
    pub fn seal_lane(
        &mut self,
        now: Instant,
        c: usize,
        lane: u8,
        parts: &[&[u8]],
        encrypt: bool,
    ) -> Option<Bytes> {
        let reject_after = self.reject_after();
        let k = self.current.as_mut()?;
        let i = lane_slot(k.counters.len() / 2, c, lane);
        let counter = k.counters[i];
        if counter >= REJECT_AFTER_COUNT || now - k.created >= reject_after {
            return None;
        }
        k.counters[i] += 1;
        let c = lane_word(c, lane);
        let header = Header {
            encrypted: encrypt,
            index: k.remote,
            // Below REJECT_AFTER_COUNT = 2^32: it fits.
            counter: counter as u32,
            lane,
        }
        .to_bytes();
        let inner_len: usize = parts.iter().map(|p| p.len()).sum();
        let v = self.arena.start(now, HEADER_LEN + inner_len + TAG_LEN);
        v.extend_from_slice(&header);
        for p in parts {
            v.extend_from_slice(p);
        }
        let tag = if encrypt {
            k.send
                .seal(nonce(c, counter), &header, &mut v[HEADER_LEN..])
        } else {
            k.send.seal(nonce(c, counter), v, &mut [])
        };
        v.extend_from_slice(&tag);
        Some(self.arena.finish())
    }

    /// Open a sealed datagram received on channel `c`: the inner datagram, and whether
    /// it confirmed a handshake.
    pub fn open(
        &mut self,
        now: Instant,
        c: usize,
        d: &Bytes,
    ) -> Result<(Bytes, Option<Established>), Reject> {
        let h = Header::parse(d).map_err(|_| Reject::Malformed)?;
        if h.encrypted != (self.mode == SecurityMode::Encrypt || self.mode == SecurityMode::None) {
            // Bodies in clear where we encrypt, or the other way round: a peer in
            // another mode (or a forgery). Not accepted either way.
            return Err(Reject::Unauthenticated);
        }
        let body_end = d.len() - TAG_LEN;
        let tag = &d[body_end..];
        let counter = u64::from(h.counter);
        let n = nonce(lane_word(c, h.lane), counter);
        let reject_after = self.reject_after();
        let (slot, k) = Self::find(
            &mut self.current,
            &mut self.older,
            &mut self.pending,
            h.index,
        )
        .ok_or(Reject::Unauthenticated)?;
        if now - k.created >= reject_after {
            return Err(Reject::Unauthenticated);
        }
        let w = lane_slot(k.windows.len() / 2, c, h.lane);
        if c >= k.windows.len() / 2 || !k.windows[w].fresh(counter) {
            return Err(Reject::Replay);
        }
        let inner = if h.encrypted {
            let body = &d[HEADER_LEN..body_end];
            let v = self.arena.start(now, body.len());
            v.extend_from_slice(body);
            if let Err(e) = k.recv.open(n, &d[..HEADER_LEN], v, tag) {
                self.arena.abandon();
                return Err(e);
            }
            self.arena.finish()
        } else {
            k.recv.open(n, &d[..body_end], &mut [], tag)?;
            d.slice(HEADER_LEN..body_end)
        };
        let gap = k.windows[w].mark(counter);
        self.lane = h.lane;
        if h.lane == LANE_PROBE {
            // A probe's lane is its own: a lost probe is no lost datagram, and a probe
            // moves no endpoint.
            self.newest = false;
        } else {
            self.newest = gap >= 0 && !matches!(slot, Slot::Older);
            self.missing[c] = self.missing[c].saturating_add(gap.max(0) as u64);
        }
        self.last_heard = Some(now);
        let established = match slot {
            Slot::Pending => self.pending.take().map(|p| self.install(p.keys)),
            _ => None,
        };
        Ok((inner, established))
    }

    /// The keys whose local index is `index`, and which they are (a function of the
    /// three fields, not of `self`, so that the arena stays free to use beside them).
    fn find<'a>(
        current: &'a mut Option<Keypair>,
        older: &'a mut std::collections::VecDeque<Keypair>,
        pending: &'a mut Option<Box<Pending>>,
        index: u32,
    ) -> Option<(Slot, &'a mut Keypair)> {
        if current.as_ref().is_some_and(|k| k.local == index) {
            return current.as_mut().map(|k| (Slot::Current, k));
        }
        if let Some(i) = older.iter().position(|k| k.local == index) {
            return Some((Slot::Older, &mut older[i]));
        }
        let p = pending.as_mut().filter(|p| p.keys.local == index)?;
        Some((Slot::Pending, &mut p.keys))
    }
}

enum Slot {
    Current,
    Older,
    Pending,
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
            streams: None,
            aes_gcm: false,
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
        assert_eq!(init.len(), if ik { 192 } else { 144 });
        let o = b.on_handshake(now, 0, &init);
        let resp = o.reply.unwrap();
        assert_eq!(resp.len(), 120);
        assert!(o.established.is_none());
        let o = a.on_handshake(now, 0, &resp);
        assert!(o.reply.is_none() && o.failure.is_none() && o.mismatch.is_none());
        assert!(o.established.is_some());
        // B confirms on A's first sealed datagram.
        let d = a.seal(Instant::ZERO, 0, &[b"hello"], true).unwrap();
        let (inner, e) = b.open(Instant::ZERO, 0, &d).unwrap();
        assert_eq!(&inner[..], b"hello");
        assert!(e.is_some());
    }

    #[test]
    fn the_cipher_is_aes_gcm_only_when_both_ends_ask_for_it() {
        let s = Duration::from_secs(120);
        let end = |aes: bool, seed: u8| {
            let mut set = settings(2);
            set.aes_gcm = aes;
            Crypto::new(SecurityMode::Encrypt, psk_keys(), s, set, [seed; 32]).unwrap()
        };
        for (ask_a, ask_b, want) in [
            (true, true, Cipher::Aes256Gcm),
            (true, false, Cipher::ChaCha20Poly1305),
            (false, true, Cipher::ChaCha20Poly1305),
            (false, false, Cipher::ChaCha20Poly1305),
        ] {
            let (mut a, mut b) = (end(ask_a, 1), end(ask_b, 2));
            assert_eq!(a.cipher(), None, "no keys yet");
            handshake(&mut a, &mut b, Instant::ZERO);
            assert_eq!((a.cipher(), b.cipher()), (Some(want), Some(want)));
            // Both directions work, and what one cipher sealed the other does not open.
            let d = b.seal(Instant::ZERO, 1, &[b"back"], true).unwrap();
            assert_eq!(&a.open(Instant::ZERO, 1, &d).unwrap().0[..], b"back");
            let other = match want {
                Cipher::Aes256Gcm => Cipher::ChaCha20Poly1305,
                Cipher::ChaCha20Poly1305 => Cipher::Aes256Gcm,
            };
            let mut buf = *b"same bytes";
            let key = [4u8; 32];
            let tag = Aead::new(want, &key).seal(nonce(0, 1), b"h", &mut buf);
            assert_eq!(
                Aead::new(other, &key).open(nonce(0, 1), b"h", &mut buf.clone(), &tag),
                Err(Reject::BadTag)
            );
            Aead::new(want, &key)
                .open(nonce(0, 1), b"h", &mut buf, &tag)
                .unwrap();
            assert_eq!(&buf, b"same bytes");
        }
    }

    #[test]
    fn a_servers_cookie_reply_is_taken_and_its_mac2_holds_for_that_source_only() {
        let server = [9u8; 32];
        let client = Keys {
            psk: None,
            private: Some([3; 32]),
            peer_public: Some(public_key(&server)),
        };
        let ours = Keys {
            psk: None,
            private: Some(server),
            peer_public: Some(public_key(&[3; 32])),
        };
        let (mut a, _b) = pair(client, ours);
        let mut jar = ServerCookies::new(&server, [5; 32]);
        let here = address_bytes("192.0.2.1:4000".parse().unwrap());
        let there = address_bytes("192.0.2.9:4000".parse().unwrap());
        let t = Instant::ZERO;
        let init = a.initiation(t).unwrap();
        assert!(!jar.mac2_ok(t, 0, &here, &init), "no cookie yet");
        let reply = jar.reply(t, 0, &here, &init).unwrap();
        assert_eq!(reply.len(), secure::COOKIE_REPLY_LEN);
        assert!(reply.len() < init.len());
        // The client opens it as any session's and sends its initiation again, with mac2.
        let again = a
            .on_handshake(t, 0, &reply)
            .reply
            .expect("sent again at once");
        assert!(jar.mac2_ok(t, 0, &here, &again));
        // Another address, another channel, or after the secret rotates: no.
        assert!(!jar.mac2_ok(t, 0, &there, &again));
        assert!(!jar.mac2_ok(t, 1, &here, &again));
        let later = t + COOKIE_ROTATE + Duration::from_secs(1);
        assert!(!jar.mac2_ok(later, 0, &here, &again));
        // A reply for another server's key does not open: the client sends nothing.
        let mut other = ServerCookies::new(&[8; 32], [5; 32]);
        let init2 = a.initiation(later).unwrap();
        let forged = other.reply(later, 0, &here, &init2).unwrap();
        assert!(a.on_handshake(later, 0, &forged).reply.is_none());
    }

    #[test]
    fn a_server_reads_the_initiators_key_and_routes_by_its_index_prefix() {
        let server = [9u8; 32];
        let keys = |private: [u8; 32]| Keys {
            psk: None,
            private: Some(private),
            peer_public: Some(public_key(&server)),
        };
        let ours = Keys {
            psk: None,
            private: Some(server),
            peer_public: Some(public_key(&[3; 32])),
        };
        let reader = InitiationReader::new(server);
        let (mut a, mut b) = pair(keys([3; 32]), ours);
        b.set_index_prefix(0xBEEF);
        let init = a.initiation(Instant::ZERO).unwrap();
        assert!(reader.mac1_ok(&init));
        assert_eq!(reader.initiator(&init), Some(public_key(&[3; 32])));
        assert_eq!(
            receiver_index(&init),
            None,
            "an initiation carries no receiver index"
        );
        // For another server (mac1 keyed by its key), or garbled: refused.
        let other = InitiationReader::new([8; 32]);
        assert!(!other.mac1_ok(&init));
        assert_eq!(other.initiator(&init), None);
        let mut bad = init.to_vec();
        bad[20] ^= 1;
        assert!(!reader.mac1_ok(&bad));
        assert_eq!(reader.initiator(&bad), None);
        // The response and everything sealed to B carry B's index: its prefix.
        let resp = b.on_handshake(Instant::ZERO, 0, &init).reply.unwrap();
        // The response goes to A: it carries A's index (the initiation's sender).
        let a_index = u32::from_be_bytes([init[4], init[5], init[6], init[7]]);
        assert_eq!(receiver_index(&resp), Some(a_index));
        assert!(a
            .on_handshake(Instant::ZERO, 0, &resp)
            .established
            .is_some());
        let d = a.seal(Instant::ZERO, 0, &[b"hi"], true).unwrap();
        assert_eq!(receiver_index(&d).map(index_prefix), Some(0xBEEF));
        b.open(Instant::ZERO, 0, &d).unwrap();
        let back = b.seal(Instant::ZERO, 0, &[b"ho"], true).unwrap();
        assert_eq!(receiver_index(&back), Some(a_index));
        // Many indices later the prefix still holds.
        for _ in 0..70_000 {
            b.fresh_index();
        }
        assert_eq!(index_prefix(b.fresh_index()), 0xBEEF);
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
        let d = b.seal(Instant::ZERO, 1, &[b"back"], true).unwrap();
        assert_eq!(&a.open(Instant::ZERO, 1, &d).unwrap().0[..], b"back");
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
        assert!(a
            .initiation(Instant::ZERO + HANDSHAKE_TIMEOUT + HANDSHAKE_JITTER)
            .is_some());

        let (mut a, mut b) = pair(psk_keys(), psk_keys());
        handshake(&mut a, &mut b, Instant::ZERO);
        let d = a.seal(Instant::ZERO, 0, &[b"payload"], true).unwrap();
        assert_eq!(b.open(Instant::ZERO, 1, &d), Err(Reject::BadTag));
        let mut t = d.to_vec();
        t[HEADER_LEN] ^= 1;
        assert_eq!(
            b.open(Instant::ZERO, 0, &Bytes::from(t)),
            Err(Reject::BadTag)
        );
        assert!(b.open(Instant::ZERO, 0, &d).is_ok());
        assert_eq!(b.open(Instant::ZERO, 0, &d), Err(Reject::Replay));
        // Encrypted: the body is not in clear.
        let d = a.seal(Instant::ZERO, 0, &[b"secret words"], true).unwrap();
        assert!(!d.windows(12).any(|w| w == b"secret words"));
    }

    #[test]
    fn a_handshake_of_another_version_is_named_at_both_ends() {
        // An older braid's initiation (handshake version 2, whose keys sealed with a
        // 16-byte header; version 5, before the short stream DATA frame): refused, and
        // said so in words, not only counted.
        for old in [2, 5] {
            let (mut a, mut b) = pair(psk_keys(), psk_keys());
            let mut init = a.initiation(Instant::ZERO).unwrap().to_vec();
            init[1] = old;
            let o = b.on_handshake(Instant::ZERO, 0, &Bytes::from(init));
            assert!(o.established.is_none() && o.reply.is_none());
            let (f, count) = o.failure.unwrap();
            assert_eq!(
                (f, count),
                (
                    HandshakeFailure::OtherVersion {
                        theirs: old,
                        answer: false
                    },
                    1
                )
            );
            assert!(!f.is_answer());
            let said = f.to_string();
            assert!(
                said.contains(&format!("version {old}, this braid speaks 6"))
                    && said.contains("upgrade"),
                "{said}"
            );
            assert_eq!(b.failed_on(0), 1);
        }
        // A response of another version reaches the initiator as an answer.
        let (mut a, mut b) = pair(psk_keys(), psk_keys());
        let init = a.initiation(Instant::ZERO).unwrap();
        let mut resp = b
            .on_handshake(Instant::ZERO, 0, &init)
            .reply
            .unwrap()
            .to_vec();
        resp[1] = secure::HS_VERSION + 1;
        let o = a.on_handshake(Instant::ZERO, 0, &Bytes::from(resp));
        assert!(o.established.is_none());
        assert!(o.failure.unwrap().0.is_answer());
        // A version byte of 0 is no version: junk, counted without a word.
        let mut junk = init.to_vec();
        junk[1] = 0;
        assert!(b
            .on_handshake(Instant::ZERO, 0, &Bytes::from(junk))
            .failure
            .is_none());
    }

    #[test]
    fn a_key_seals_no_counter_beyond_32_bits() {
        // The envelope carries 32 bits of counter: the last one a key seals with is
        // 2^32 - 1, and it opens; then the key seals nothing more (a new handshake is
        // overdue), so no nonce is ever used twice.
        let (mut a, mut b) = pair(psk_keys(), psk_keys());
        handshake(&mut a, &mut b, Instant::ZERO);
        let last = REJECT_AFTER_COUNT - 1;
        a.current.as_mut().unwrap().counters[0] = last;
        b.current.as_mut().unwrap().windows[0].top = last - 1;
        let d = a.seal(Instant::ZERO, 0, &[b"last"], true).unwrap();
        assert_eq!(Header::parse(&d).unwrap().counter, u32::MAX);
        assert_eq!(&b.open(Instant::ZERO, 0, &d).unwrap().0[..], b"last");
        assert!(a.seal(Instant::ZERO, 0, &[b"more"], true).is_none());
        // Another channel's counter is its own.
        assert!(a.seal(Instant::ZERO, 1, &[b"other"], true).is_some());
        assert!(
            a.due(Instant::ZERO),
            "past REKEY_AFTER_COUNT: a new handshake is due"
        );
    }

    #[test]
    fn an_aes_gcm_key_is_replaced_after_its_total_count_a_chacha_key_is_not() {
        for (aes, want) in [(true, true), (false, false)] {
            let s = Duration::from_secs(120);
            let end = |seed: u8| {
                let mut set = settings(2);
                set.aes_gcm = aes;
                Crypto::new(SecurityMode::Encrypt, psk_keys(), s, set, [seed; 32]).unwrap()
            };
            let (mut a, mut b) = (end(1), end(2));
            handshake(&mut a, &mut b, Instant::ZERO);
            assert!(!a.due(Instant::ZERO));
            // Half on each channel: neither is near REKEY_AFTER_COUNT.
            let k = a.current.as_mut().unwrap();
            k.counters[0] = AES_GCM_REKEY_AFTER_TOTAL / 2;
            k.counters[1] = AES_GCM_REKEY_AFTER_TOTAL / 2 - 1;
            assert!(!a.due(Instant::ZERO));
            a.current.as_mut().unwrap().counters[1] += 1;
            assert_eq!(a.due(Instant::ZERO), want, "AES-256-GCM: {aes}");
        }
    }

    fn at(ms: u64) -> Instant {
        Instant::ZERO + Duration::from_millis(ms)
    }

    /// A new initiation of `a`'s at `now` (the outstanding one dropped).
    fn fresh_init(a: &mut Crypto, now: Instant) -> Bytes {
        a.init = None;
        a.initiation(now).unwrap()
    }

    #[test]
    fn replayed_initiations_are_not_answered_and_displace_nothing() {
        let (mut a, mut b) = pair(psk_keys(), psk_keys());
        handshake(&mut a, &mut b, Instant::ZERO);
        let recorded = a.init.as_ref().map(|i| i.msg.clone());
        assert!(recorded.is_none(), "used up");
        // A rekey (rekey_after is 120 s): A's new initiation, answered; B holds it pending.
        let genuine = fresh_init(&mut a, at(120_000));
        let resp = b.on_handshake(at(120_000), 0, &genuine).reply.unwrap();
        let pending = b.pending.as_ref().unwrap().keys.local;
        // Older initiations of A's (recorded earlier, here: made with earlier clocks)
        // replayed many times: never answered, the pending one stays, no report.
        let mut a_old = Crypto::new(
            SecurityMode::Encrypt,
            psk_keys(),
            Duration::from_secs(120),
            settings(2),
            [9; 32],
        )
        .unwrap();
        let olds: Vec<Bytes> = (0..12)
            .map(|i| fresh_init(&mut a_old, at(i * 1000)))
            .collect();
        for _ in 0..50 {
            for o in &olds {
                let out = b.on_handshake(at(120_001), 1, o);
                // At this rate B is under load: at most a cookie reply, smaller.
                assert!(out.failure.is_none());
                assert!(out
                    .reply
                    .is_none_or(|r| r.len() == secure::COOKIE_REPLY_LEN));
            }
        }
        assert_eq!(b.pending.as_ref().unwrap().keys.local, pending);
        // None answered: each old one cost public-key work at most once (rate-limited,
        // then cookie replies under load); the rest were known replays.
        let st = &b.stats;
        assert_eq!(st.answered, 2, "{st:?}");
        assert_eq!(
            st.replays + st.cookie_replies_sent + st.rate_limited,
            12 * 50
        );
        assert!(st.replays >= 12 * 10, "{st:?}");
        // A copy of the genuine one is answered the same way (no new keys).
        assert_eq!(
            b.on_handshake(at(120_002), 1, &genuine).reply,
            Some(resp.clone())
        );
        // The genuine handshake completes; B's keys were never disturbed meanwhile.
        let d = a.seal(at(120_002), 0, &[b"old keys"], true).unwrap();
        assert_eq!(b.open(at(120_002), 0, &d).unwrap().1, None);
        assert!(a.on_handshake(at(120_003), 0, &resp).established.is_some());
        let d = a.seal(at(120_003), 0, &[b"new keys"], true).unwrap();
        assert!(b.open(at(120_003), 0, &d).unwrap().1.is_some());
        assert_eq!(b.stats.completed, 2);
        // Replaying the genuine initiation now: nothing.
        assert!(b.on_handshake(at(120_004), 0, &genuine).reply.is_none());
        assert!(b.pending.is_none());
    }

    #[test]
    fn only_a_newer_initiation_replaces_the_pending_one() {
        let (mut a, mut b) = pair(psk_keys(), psk_keys());
        let first = fresh_init(&mut a, at(1000));
        let second = fresh_init(&mut a, at(2000));
        // The newer one first: the older one, arriving late, is a replay.
        assert!(b.on_handshake(at(2000), 0, &second).reply.is_some());
        let p = b.pending.as_ref().unwrap().keys.local;
        assert!(b.on_handshake(at(2001), 0, &first).reply.is_none());
        assert_eq!(b.pending.as_ref().unwrap().keys.local, p);
        let third = fresh_init(&mut a, at(3000));
        assert!(b.on_handshake(at(3000), 0, &third).reply.is_some());
        assert_ne!(b.pending.as_ref().unwrap().keys.local, p);
    }

    #[test]
    fn a_bad_mac1_costs_no_public_key_work_and_is_rejected_cheaply() {
        let (mut a, mut b) = pair(psk_keys(), psk_keys());
        b.offload();
        let init = a.initiation(Instant::ZERO).unwrap();
        let mut forged = init.to_vec();
        forged[20] ^= 1;
        let o = b.on_handshake(Instant::ZERO, 0, &Bytes::from(forged.clone()));
        assert!(b.poll_job().is_none(), "no public-key work");
        assert_eq!((b.stats.mac1_failures, b.stats.failed), (1, 1));
        let r = o.reply.unwrap();
        assert!(r.len() < forged.len());
        assert!(matches!(
            Handshake::parse(&r),
            Ok(Handshake::Reject {
                reason: secure::REJECT_UNAUTHENTICATED,
                ..
            })
        ));
        // Random bytes of an initiation's length: the same.
        let mut junk = vec![0x5Au8; init.len()];
        junk[..4].copy_from_slice(&[0xBA, secure::HS_VERSION, 0, 0]);
        b.on_handshake(Instant::ZERO, 0, &Bytes::from(junk));
        assert!(b.poll_job().is_none());
        assert_eq!(b.stats.mac1_failures, 2);
        // The genuine one passes and becomes a job; its copies wait for it.
        b.on_handshake(Instant::ZERO, 0, &init);
        b.on_handshake(Instant::ZERO, 1, &init);
        let job = b.poll_job().unwrap();
        assert!(b.poll_job().is_none(), "one job for the copies");
        let mut o = Outcome::default();
        b.on_done(Instant::ZERO, job.run(), &mut o);
        let resp = o.reply.unwrap();
        assert!(a
            .on_handshake(Instant::ZERO, 0, &resp)
            .established
            .is_some());
        // A response with a bad mac1 is not read.
        let mut a2 = pair(psk_keys(), psk_keys()).0;
        let i2 = a2.initiation(Instant::ZERO).unwrap();
        let mut o = b.on_handshake(at(5000), 0, &i2);
        if let Some(j) = b.poll_job() {
            b.on_done(at(5000), j.run(), &mut o);
        }
        let mut r = o.reply.unwrap().to_vec();
        let last = r.len() - 1;
        r[last] ^= 1;
        let before = a2.stats.responses;
        assert!(a2
            .on_handshake(at(5000), 0, &Bytes::from(r))
            .established
            .is_none());
        assert_eq!(a2.stats.responses, before);
        assert_eq!(a2.stats.mac1_failures, 1);
    }

    #[test]
    fn mac1_is_keyed_by_the_responders_static_public_key() {
        let (pa, pb) = ([3u8; 32], [4u8; 32]);
        let ka = Keys {
            psk: Some([1; 32]),
            private: Some(pa),
            peer_public: Some(public_key(&pb)),
        };
        let kb = Keys {
            psk: Some([1; 32]),
            private: Some(pb),
            peer_public: Some(public_key(&pa)),
        };
        let (mut a, mut b) = pair(ka.clone(), kb.clone());
        handshake(&mut a, &mut b, Instant::ZERO);
        // An initiator aiming at another public key: its mac1 fails at B.
        let mut wrong = ka;
        wrong.peer_public = Some(public_key(&[6; 32]));
        let (mut c, _) = pair(wrong, kb);
        let init = c.initiation(Instant::ZERO).unwrap();
        b.on_handshake(Instant::ZERO, 0, &init);
        assert_eq!(b.stats.mac1_failures, 1);
        let at = init.len() - 2 * MAC_LEN;
        assert!(mac16_ok(
            &derive(LABEL_MAC1, &public_key(&[6; 32])),
            &init[..at],
            &init[at..at + MAC_LEN]
        ));
    }

    /// B under load (LOAD_RATE initiations needing work in a second).
    fn load(b: &mut Crypto, now: Instant) {
        let mut x = pair(psk_keys(), psk_keys()).0;
        // On the last channel (the tests look at channel 0).
        let c = b.channels - 1;
        for i in 0..=LOAD_RATE as u64 {
            let init = fresh_init(&mut x, Instant::ZERO + Duration::from_micros(i));
            b.on_handshake(now, c, &init);
        }
        assert!(b.under_load(now));
    }

    #[test]
    fn keyed_mac_is_keyed_blake2s_128() {
        // The key block compressed once, then any message: the same MAC as BLAKE2s-128
        // keyed the usual way, for every key length and message length around the
        // block boundaries (an empty message too, whose last block is the key's).
        let data: Vec<u8> = (0..300u32).map(|i| (i * 131 + 7) as u8).collect();
        for key_len in [1, 16, 31, 32] {
            let key: Vec<u8> = (0..key_len as u8).map(|i| i ^ 0x5a).collect();
            let k = KeyedMac::new(&key);
            for n in 0..=data.len() {
                let want = mac16(&key, &data[..n]);
                assert_eq!(k.mac(&data[..n]), want, "key {key_len} bytes, message {n}");
                assert!(k.verify(&data[..n], &want));
                let mut bad = want;
                bad[n % MAC_LEN] ^= 1;
                assert!(!k.verify(&data[..n], &bad));
                assert!(!k.verify(&data[..n], &want[..MAC_LEN - 1]));
            }
        }
    }

    #[test]
    fn a_cookie_covers_the_channel_byte_then_the_address() {
        // The bytes a cookie is bound to, pinned: IPv4 octets and port, IPv6 likewise.
        let v4 = address_bytes("192.0.2.1:4000".parse().unwrap());
        assert_eq!(&*v4, &[192, 0, 2, 1, 0x0f, 0xa0]);
        let v6 = address_bytes("[2001:db8::1]:7100".parse().unwrap());
        assert_eq!(v6.len(), 18);
        assert_eq!(&v6[16..], &7100u16.to_be_bytes());
        let secret = [7u8; 32];
        let mut id = vec![3u8];
        id.extend_from_slice(&v6);
        assert_eq!(cookie_for(&secret, 3, &v6), mac16(&secret, &id));
    }

    #[test]
    fn a_cookie_holds_only_for_the_address_it_was_made_for() {
        // The responder derives its cookie once per secret and address: when the
        // peer's address on a channel changes (a NAT rebinding), mac2 made with the
        // cookie for the old one must no longer hold.
        let (mut a, mut b) = pair(psk_keys(), psk_keys());
        b.set_channel_address(0, b"10.0.0.1:7000");
        b.offload();
        let t = at(10_000);
        load(&mut b, t);
        while b.poll_job().is_some() {}
        let init = fresh_init(&mut a, t);
        let cookie = b.on_handshake(t, 0, &init).reply.unwrap();
        assert_eq!(cookie.len(), secure::COOKIE_REPLY_LEN);
        assert!(a.on_handshake(t, 0, &cookie).reply.is_some());
        let with_mac2 = |a: &mut Crypto, ms| {
            let i = fresh_init(a, at(ms));
            a.for_channel(t, 0, &i)
        };
        // With mac2 for this address: public-key work.
        let i = with_mac2(&mut a, 10_001);
        assert!(b.on_handshake(t, 0, &i).reply.is_none());
        assert!(b.poll_job().is_some());
        // The same address set again changes nothing.
        b.set_channel_address(0, b"10.0.0.1:7000");
        let i = with_mac2(&mut a, 10_002);
        b.on_handshake(t, 0, &i);
        assert!(b.poll_job().is_some());
        // The peer now comes from another address: the old cookie gets a cookie reply.
        b.set_channel_address(0, b"10.0.0.9:7000");
        let i = with_mac2(&mut a, 10_003);
        let o = b.on_handshake(t, 0, &i);
        assert!(
            b.poll_job().is_none(),
            "no public-key work with a stale cookie"
        );
        let reply = o.reply.expect("a cookie reply for the new address");
        assert_eq!(reply.len(), secure::COOKIE_REPLY_LEN);
        // That new cookie holds.
        assert!(a.on_handshake(t, 0, &reply).reply.is_some());
        let i = with_mac2(&mut a, 10_004);
        b.on_handshake(t, 0, &i);
        assert!(b.poll_job().is_some());
    }

    #[test]
    fn under_load_initiations_need_a_cookie_bound_to_the_address() {
        let mut s4 = settings(4);
        s4.weights = vec![1; 4];
        let dur = Duration::from_secs(120);
        let mut a =
            Crypto::new(SecurityMode::Encrypt, psk_keys(), dur, s4.clone(), [1; 32]).unwrap();
        let mut b = Crypto::new(SecurityMode::Encrypt, psk_keys(), dur, s4, [2; 32]).unwrap();
        for c in 0..4 {
            b.set_channel_address(c, format!("10.0.0.1:700{c}").as_bytes());
        }
        b.offload();
        let t = at(10_000);
        load(&mut b, t);
        while b.poll_job().is_some() {}
        let init = fresh_init(&mut a, t);
        let sent = b.stats.cookie_replies_sent;
        let o = b.on_handshake(t, 0, &init);
        assert!(b.poll_job().is_none(), "no public-key work without mac2");
        let cookie = o.reply.unwrap();
        assert_eq!(cookie.len(), secure::COOKIE_REPLY_LEN);
        assert!(cookie.len() < init.len());
        assert_eq!(b.stats.cookie_replies_sent, sent + 1);
        // A takes the cookie and sends its initiation again on that channel, with mac2.
        let o = a.on_handshake(t, 0, &cookie);
        let with_mac2 = o.reply.unwrap();
        assert_eq!(
            with_mac2[..init.len() - MAC_LEN],
            init[..init.len() - MAC_LEN]
        );
        assert_ne!(with_mac2, init);
        assert_eq!(a.for_channel(t, 0, &init), with_mac2);
        assert_eq!(a.for_channel(t, 1, &init), init, "no cookie for channel 1");
        // The same cookie reply again (replayed): A sends nothing more.
        assert!(a.on_handshake(t, 0, &cookie).reply.is_none());
        // On another channel (another address) the cookie does not hold.
        let o = b.on_handshake(t, 1, &with_mac2);
        assert!(b.poll_job().is_none());
        assert!(o.reply.is_some_and(|r| r.len() == secure::COOKIE_REPLY_LEN));
        // On its own channel it does: public-key work, then the response.
        b.on_handshake(t, 0, &with_mac2);
        let job = b.poll_job().expect("mac2 valid");
        let mut o = Outcome::default();
        b.on_done(t, job.run(), &mut o);
        assert!(a
            .on_handshake(t, 0, &o.reply.unwrap())
            .established
            .is_some());
        // A cookie reply that does not open (another key, or not for our initiation) is
        // ignored.
        let mut a3 = pair(psk_keys(), psk_keys()).0;
        let init = fresh_init(&mut a3, at(20_000));
        let forged = Handshake::Cookie {
            receiver: a3.init.as_ref().unwrap().index,
            nonce: [0; COOKIE_NONCE_LEN],
            sealed: [0; COOKIE_SEALED_LEN],
        };
        assert!(a3
            .on_handshake(at(20_000), 0, &Bytes::from(forged.to_vec()))
            .reply
            .is_none());
        assert_eq!(a3.stats.cookie_replies_received, 0);
        // Nor is a genuine one for another initiation.
        assert!(a3.on_handshake(at(20_000), 0, &cookie).reply.is_none());
        // After COOKIE_ROTATE B's secret is new: A's cookie no longer holds.
        let later = t + COOKIE_ROTATE;
        load(&mut b, later);
        while b.poll_job().is_some() {}
        let init2 = fresh_init(&mut a, later);
        let mut stale = init2.to_vec();
        let n = stale.len();
        let cookie0 = a.sources[0].cookie.unwrap().0;
        let m = mac16(&cookie0, &stale[..n - MAC_LEN]);
        stale[n - MAC_LEN..].copy_from_slice(&m);
        let o = b.on_handshake(later, 0, &Bytes::from(stale));
        assert!(b.poll_job().is_none());
        assert!(o.reply.is_some_and(|r| r.len() == secure::COOKIE_REPLY_LEN));
        let _ = init;
    }

    #[test]
    fn public_key_work_is_rate_limited_per_source() {
        let (mut a, mut b) = pair(psk_keys(), psk_keys());
        b.offload();
        let mut jobs = 0;
        // 12 distinct genuine initiations on channel 0 at once (not enough for load): a
        // burst of SOURCE_BURST.
        for i in 0..12 {
            let init = fresh_init(&mut a, at(i));
            b.on_handshake(at(100), 0, &init);
            while let Some(j) = b.poll_job() {
                b.shed(j);
                jobs += 1;
            }
        }
        assert_eq!(jobs, SOURCE_BURST as usize);
        assert_eq!(b.stats.rate_limited, 12 - SOURCE_BURST);
        // Channel 1 has its own allowance, and channel 0 gets more in time.
        let init = fresh_init(&mut a, at(50));
        b.on_handshake(at(100), 1, &init);
        assert!(b.poll_job().is_some());
        let init = fresh_init(&mut a, at(60));
        b.on_handshake(
            at(100) + Duration::from_millis(1000 / SOURCE_RATE),
            0,
            &init,
        );
        assert!(b.poll_job().is_some());
    }

    #[test]
    fn jobs_out_put_the_responder_under_load_and_the_rest_is_shed() {
        let (mut a, mut b) = pair(psk_keys(), psk_keys());
        b.offload();
        for i in 0..LOAD_JOBS as u64 {
            let init = fresh_init(&mut a, at(i));
            b.on_handshake(at(100), (i % 2) as usize, &init);
        }
        assert!(b.under_load(at(100)));
        let mut jobs: Vec<_> = std::iter::from_fn(|| b.poll_job()).collect();
        assert_eq!(jobs.len(), LOAD_JOBS);
        // Done (in any order): no longer loaded once LOAD_HOLD has passed.
        let last = jobs.pop().unwrap();
        let mut o = Outcome::default();
        b.on_done(at(100), last.run(), &mut o);
        for j in jobs {
            b.on_done(at(100), j.run(), &mut o);
        }
        assert!(!b.under_load(at(100) + LOAD_HOLD));
        // The newest was accepted first, so the others were replays.
        assert_eq!(b.stats.replays, LOAD_JOBS as u64 - 1);
    }

    #[test]
    fn timers_reject_old_keys_rehandshake_after_silence_and_jitter_retries() {
        let (mut a, mut b) = pair(psk_keys(), psk_keys());
        handshake(&mut a, &mut b, Instant::ZERO);
        let r = a.reject_after();
        assert_eq!(r, Duration::from_secs(180 + 60));
        let r = Instant::ZERO + r;
        let before = Instant::from_micros(r.as_micros() - 1);
        assert!(a.seal(before, 0, &[b"x"], true).is_some());
        assert!(a.seal(r, 0, &[b"x"], true).is_none());
        let d = b.seal(at(1), 0, &[b"y"], true).unwrap();
        assert_eq!(a.open(r, 0, &d), Err(Reject::Unauthenticated));
        // Silence: B heard A at time 0; after REHANDSHAKE_AFTER_SILENCE, B initiates
        // although its keys are far from rekey_after.
        assert!(b.initiation(at(1000)).is_none());
        assert!(b
            .initiation(Instant::ZERO + REHANDSHAKE_AFTER_SILENCE)
            .is_some());
        // Retries: each after HANDSHAKE_TIMEOUT plus a jitter within HANDSHAKE_JITTER,
        // not all the same.
        let mut c = pair(psk_keys(), psk_keys()).0;
        let mut timeouts = std::collections::BTreeSet::new();
        for i in 0..20 {
            c.init = None;
            c.initiation(at(i * 10_000)).unwrap();
            let t = c.init.as_ref().unwrap().timeout;
            assert!(t >= HANDSHAKE_TIMEOUT && t <= HANDSHAKE_TIMEOUT + HANDSHAKE_JITTER);
            timeouts.insert(t.as_micros());
        }
        assert!(timeouts.len() > 10);
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
        // Restarted later: its timestamps are newer.
        let init = a2.initiation(at(5000)).unwrap();
        let resp = b.on_handshake(Instant::ZERO, 0, &init).reply;
        a2.on_handshake(Instant::ZERO, 0, &resp.unwrap());
        let d = a2.seal(Instant::ZERO, 0, &[b"x"], true).unwrap();
        let e = b.open(Instant::ZERO, 0, &d).unwrap().1.unwrap();
        assert!(e.restart && !e.first);
    }

    #[test]
    fn auth_mode_leaves_the_body_readable_and_protects_it() {
        // With either cipher (AES-256-GCM: GMAC over the whole datagram).
        for aes in [false, true] {
            let s = Duration::from_secs(120);
            let mut set = settings(1);
            set.aes_gcm = aes;
            let mut a =
                Crypto::new(SecurityMode::Auth, psk_keys(), s, set.clone(), [1; 32]).unwrap();
            let mut b = Crypto::new(SecurityMode::Auth, psk_keys(), s, set, [2; 32]).unwrap();
            let init = a.initiation(Instant::ZERO).unwrap();
            let resp = b.on_handshake(Instant::ZERO, 0, &init).reply.unwrap();
            a.on_handshake(Instant::ZERO, 0, &resp);
            assert_eq!(a.cipher().unwrap() == Cipher::Aes256Gcm, aes);
            let d = a.seal(Instant::ZERO, 0, &[b"visible text"], false).unwrap();
            assert_eq!(&d[HEADER_LEN..HEADER_LEN + 12], b"visible text");
            let mut t = d.to_vec();
            t[HEADER_LEN] ^= 1;
            assert_eq!(
                b.open(Instant::ZERO, 0, &Bytes::from(t)),
                Err(Reject::BadTag)
            );
            assert_eq!(
                &b.open(Instant::ZERO, 0, &d).unwrap().0[..],
                b"visible text"
            );
        }
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
        let t1 = Instant::ZERO + HANDSHAKE_TIMEOUT + HANDSHAKE_JITTER;
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
