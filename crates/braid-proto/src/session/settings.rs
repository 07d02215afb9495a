//! The settings both ends of a session must share, carried in the handshake.
//!
//! Each end puts its own in the Noise payload of the handshake message it sends (after
//! its run identifier; wire format in `docs/wire.md`, "Handshake"), so they travel
//! encrypted and authenticated by the keys, and are compared before any key is used:
//! a peer whose settings differ gets no session, and both ends report the first
//! setting that differs with both values ([`Mismatch`]).
//!
//! What must be equal, and why:
//!
//! * **channels**: the channel list is matched by position (hellos, epochs, nonces).
//!   The two ends may have different numbers of channels (a reload adds or removes
//!   one at one end before the other): the bond runs over the channels both have, and
//!   what must match below is compared over those.
//! * **mode**: each end's receiver parses what the other's striper sends (header-free
//!   data with markers, sequence headers, or triggers).
//! * **security**: `encrypt`, `auth` and `none` seal data differently; a datagram of the
//!   other kind is refused.
//! * **scheduler** (with the random scheduler's seed), in every mode but `none`: the
//!   receiver predicts the sender's next channel with it.
//! * **weights** and the **largest datagram** (which the SRR quanta are made from), in
//!   `logical` and `trr` mode: the receiver numbers header-free packets by running the
//!   sender's scheduler with the same quanta. (In `seq` mode the sequence header
//!   confirms every prediction, so other weights cost only speed.)
//! * **credits** (on or off, window, pool): each end lends the other credit and waits
//!   for the other's; one end alone would wait for ever.
//!
//! Everything else is local to one end (timers, buffers, pacing, demotion, the AQM,
//! in-bond repair: an end without it ignores the other's requests), or travels in the
//! messages themselves (marker timestamps, adapted quanta).
//!
//! Two settings are announced but need not match:
//!
//! * **streams** (TCP carried as byte streams, [`crate::stream`]). Each end says
//!   whether it takes them; an end opens a stream only to a peer that takes them, and
//!   carries TCP as packets otherwise. With it goes the end's streams run: the same
//!   after a new run of the session that kept its streams (a reload of the channel
//!   list), so the peer keeps its side too.
//! * **AES-256-GCM** ([`crate::session::Cipher`]): each end says whether it asks for
//!   it (by default, when its CPU has AES instructions); the keys of the handshake seal
//!   with AES-256-GCM when both ask, with ChaCha20-Poly1305 otherwise.

use crate::config::Mode;
use crate::sched::SchedulerKind;
use crate::session::credits::CreditConfig;
use crate::session::SecurityMode;

/// Version of the settings block.
pub const VERSION: u8 = 1;
/// Fixed part of the settings block (before the weights).
pub const FIXED_LEN: usize = 28;

/// The settings an end announces in the handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Receiver mode.
    pub mode: Mode,
    /// Causal scheduler.
    pub scheduler: SchedulerKind,
    /// Security mode.
    pub security: SecurityMode,
    /// The largest datagram the striper makes (the SRR quanta are multiples of it).
    pub max_packet: u32,
    /// Credit settings, if credits are on.
    pub credits: Option<CreditConfig>,
    /// Configured weight of each channel, in order.
    pub weights: Vec<u32>,
    /// This end takes TCP carried as byte streams (announced; need not match): its
    /// streams run ([`crate::stream::StreamConfig::run`]).
    pub streams: Option<u64>,
    /// This end asks for AES-256-GCM (announced; the session uses it when both ask).
    pub aes_gcm: bool,
}

/// Feature bit of [`Settings::streams`] in byte 6 of the settings block.
const FEATURE_STREAMS: u8 = 1;
/// Feature bit of [`Settings::aes_gcm`] in byte 6 of the settings block.
const FEATURE_AES_GCM: u8 = 2;
/// The feature bits this version knows.
const FEATURES: u8 = FEATURE_STREAMS | FEATURE_AES_GCM;

/// The first setting that differs between the two ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// Its name, as in the configuration.
    pub setting: &'static str,
    /// Our value.
    pub ours: String,
    /// The peer's value.
    pub theirs: String,
    /// Why it must match, or what to do (empty, or starting with "; ").
    pub hint: &'static str,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let are = matches!(self.setting, "channel weights" | "credits");
        write!(
            f,
            "the peer's {} {is} {}, ours {is} {}: both ends must use the same {}{}",
            self.setting,
            self.theirs,
            self.ours,
            self.setting,
            self.hint,
            is = if are { "are" } else { "is" },
        )
    }
}

/// The quanta (SRR: bytes, GRR: packets per round, otherwise the weights) the
/// scheduler runs with for these weights.
pub(crate) fn quanta(scheduler: SchedulerKind, max_packet: u32, weights: &[u32]) -> Vec<u32> {
    let min_w = weights.iter().copied().min().unwrap_or(1).max(1) as u64;
    weights
        .iter()
        .map(|&w| {
            let w = w as u64;
            match scheduler {
                // Quantum proportional to capacity, the smallest equal to max_packet.
                SchedulerKind::Srr => ((max_packet as u64 * w).div_ceil(min_w)) as u32,
                SchedulerKind::Grr => (w / min_w).max(1) as u32,
                _ => w as u32,
            }
        })
        .collect()
}

fn mode_code(m: Mode) -> u8 {
    match m {
        Mode::Logical => 1,
        Mode::Seq => 2,
        Mode::Trr => 3,
        Mode::None => 4,
    }
}

fn mode_of(c: u8) -> Option<Mode> {
    Some(match c {
        1 => Mode::Logical,
        2 => Mode::Seq,
        3 => Mode::Trr,
        4 => Mode::None,
        _ => return None,
    })
}

fn security_code(s: SecurityMode) -> u8 {
    match s {
        SecurityMode::Encrypt => 1,
        SecurityMode::Auth => 2,
        SecurityMode::None => 3,
    }
}

fn security_of(c: u8) -> Option<SecurityMode> {
    Some(match c {
        1 => SecurityMode::Encrypt,
        2 => SecurityMode::Auth,
        3 => SecurityMode::None,
        _ => return None,
    })
}

fn quote(s: &str) -> String {
    format!("\"{s}\"")
}

fn list(v: &[u32]) -> String {
    let s: Vec<String> = v.iter().map(u32::to_string).collect();
    format!("[{}]", s.join(", "))
}

fn credits_str(c: &Option<CreditConfig>) -> String {
    match c {
        None => "off".into(),
        Some(c) => match c.pool {
            None => format!("on (window {})", c.window),
            Some(p) => format!("on (window {}, pool {p})", c.window),
        },
    }
}

impl Settings {
    /// The settings block: [`FIXED_LEN`] bytes, then one weight (u32) per channel,
    /// then with the streams bit the streams run (u64).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(FIXED_LEN + 4 * self.weights.len() + 8);
        let (sched, seed) = match self.scheduler {
            SchedulerKind::Srr => (1, 0),
            SchedulerKind::Rr => (2, 0),
            SchedulerKind::Grr => (3, 0),
            SchedulerKind::Random { seed } => (4, seed),
        };
        v.extend_from_slice(&[
            VERSION,
            mode_code(self.mode),
            sched,
            security_code(self.security),
            self.weights.len().min(255) as u8,
            u8::from(self.credits.is_some()),
            if self.streams.is_some() {
                FEATURE_STREAMS
            } else {
                0
            } | if self.aes_gcm { FEATURE_AES_GCM } else { 0 },
            0,
        ]);
        v.extend_from_slice(&self.max_packet.to_be_bytes());
        v.extend_from_slice(&self.credits.map_or(0, |c| c.window).to_be_bytes());
        let pool = self.credits.and_then(|c| c.pool).unwrap_or(0);
        v.extend_from_slice(&pool.to_be_bytes());
        v.extend_from_slice(&seed.to_be_bytes());
        for w in &self.weights {
            v.extend_from_slice(&w.to_be_bytes());
        }
        if let Some(run) = self.streams {
            v.extend_from_slice(&run.to_be_bytes());
        }
        v
    }

    /// Parse a settings block; `None` if it is not one this version reads.
    pub fn parse(b: &[u8]) -> Option<Settings> {
        if b.len() < FIXED_LEN || b[0] != VERSION || b[6] & !FEATURES != 0 || b[7] != 0 {
            return None;
        }
        let n = b[4] as usize;
        let streams = b[6] & FEATURE_STREAMS != 0;
        let end = FIXED_LEN + 4 * n;
        if n == 0 || b.len() != end + if streams { 8 } else { 0 } || b[5] > 1 {
            return None;
        }
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let seed = u64::from_be_bytes(b[20..28].try_into().ok()?);
        let scheduler = match (b[2], seed) {
            (1, 0) => SchedulerKind::Srr,
            (2, 0) => SchedulerKind::Rr,
            (3, 0) => SchedulerKind::Grr,
            (4, seed) => SchedulerKind::Random { seed },
            _ => return None,
        };
        let (window, pool) = (u32_at(12), u32_at(16));
        let credits = match b[5] {
            1 => Some(CreditConfig {
                window,
                pool: (pool != 0).then_some(pool),
            }),
            _ if window == 0 && pool == 0 => None,
            _ => return None,
        };
        Some(Settings {
            mode: mode_of(b[1])?,
            scheduler,
            security: security_of(b[3])?,
            max_packet: u32_at(8),
            credits,
            weights: (0..n).map(|i| u32_at(FIXED_LEN + 4 * i)).collect(),
            streams: match streams {
                true => Some(u64::from_be_bytes(b[end..end + 8].try_into().ok()?)),
                false => None,
            },
            aes_gcm: b[6] & FEATURE_AES_GCM != 0,
        })
    }

    /// The first setting in which `theirs` differs from ours in a way the session
    /// cannot work with (see the module docs), with both values.
    pub fn mismatch(&self, theirs: &Settings) -> Option<Mismatch> {
        self.setting_mismatch(theirs)
            .or_else(|| self.quanta_mismatch(theirs))
    }

    /// The first of the settings that must be equal at both ends (mode, security, the scheduler when the mode resequences, credits) in
    /// which `theirs` differs from ours.
    fn setting_mismatch(&self, theirs: &Settings) -> Option<Mismatch> {
        if self.mode != theirs.mode {
            return differs("mode", quote(self.mode.name()), quote(theirs.mode.name()));
        }
        if self.security != theirs.security {
            return differs(
                "security",
                quote(self.security.name()),
                quote(theirs.security.name()),
            );
        }
        if self.mode != Mode::None && self.scheduler != theirs.scheduler {
            let name = |s: SchedulerKind| match s {
                SchedulerKind::Random { seed } => format!("\"random\" (seed {seed})"),
                s => quote(s.name()),
            };
            return differs("scheduler", name(self.scheduler), name(theirs.scheduler));
        }
        if self.credits != theirs.credits {
            return differs(
                "credits",
                credits_str(&self.credits),
                credits_str(&theirs.credits),
            );
        }
        None
    }

    /// In a mode whose receiver follows the sender's scheduler (logical, trr): the
    /// quanta must be the same at both ends; if they are not, what makes them differ
    /// (the largest datagram when the weights have the same ratios, else the weights).
    fn quanta_mismatch(&self, theirs: &Settings) -> Option<Mismatch> {
        if !matches!(self.mode, Mode::Logical | Mode::Trr) {
            return None;
        }
        // Over the channels both ends have (the bond runs over those alone).
        let common = self.weights.len().min(theirs.weights.len());
        let q = |s: &Settings| quanta(s.scheduler, s.max_packet, &s.weights[..common]);
        if q(self) == q(theirs) {
            return None;
        }
        let hint = |hint, m: Option<Mismatch>| m.map(|m| Mismatch { hint, ..m });
        // Same quanta from other weights is no mismatch (2:4 is 1:2); name what makes
        // them differ.
        let same_ratio = quanta(SchedulerKind::Srr, 1 << 16, &self.weights[..common])
            == quanta(SchedulerKind::Srr, 1 << 16, &theirs.weights[..common]);
        if same_ratio && self.max_packet != theirs.max_packet {
            return hint(
                " (the channels' smallest mtu, less the IP/UDP headers and the \
                 security envelope): the SRR quanta are multiples of it, and in this \
                 mode the receiver follows the sender's scheduler with them",
                differs(
                    "largest datagram",
                    format!("{} bytes", self.max_packet),
                    format!("{} bytes", theirs.max_packet),
                ),
            );
        }
        hint(
            " (in the same ratios): in this mode the receiver follows the sender's \
             scheduler with them",
            differs(
                "channel weights",
                list(&self.weights),
                list(&theirs.weights),
            ),
        )
    }
}

/// A mismatch in `setting`, with our value and the peer's, and no hint.
fn differs(setting: &'static str, ours: String, theirs: String) -> Option<Mismatch> {
    Some(Mismatch {
        setting,
        ours,
        theirs,
        hint: "",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Settings {
        Settings {
            mode: Mode::Logical,
            scheduler: SchedulerKind::Srr,
            security: SecurityMode::Encrypt,
            max_packet: 1440,
            credits: None,
            weights: vec![1, 2],
            streams: None,
            aes_gcm: false,
        }
    }

    #[test]
    fn block_round_trips_and_junk_is_refused() {
        let mut s = base();
        let b = s.to_vec();
        assert_eq!(b.len(), FIXED_LEN + 8);
        assert_eq!(Settings::parse(&b), Some(s.clone()));
        s.scheduler = SchedulerKind::Random { seed: 99 };
        s.credits = Some(CreditConfig {
            window: 100,
            pool: Some(300),
        });
        s.mode = Mode::Trr;
        s.security = SecurityMode::None;
        assert_eq!(Settings::parse(&s.to_vec()), Some(s.clone()));
        for n in 0..b.len() {
            assert_eq!(Settings::parse(&b[..n]), None);
        }
        let mut bad = b.clone();
        bad[0] = 2;
        assert_eq!(Settings::parse(&bad), None);
        let mut bad = b.clone();
        bad[1] = 9;
        assert_eq!(Settings::parse(&bad), None);
        // The streams feature bit and its run round-trip; other feature bits are
        // refused, and so is the bit without the run or the run without the bit.
        s.streams = Some(0x0102_0304_0506_0708);
        let with = s.to_vec();
        assert_eq!(with[6], FEATURE_STREAMS);
        assert_eq!(with.len(), b.len() + 8);
        assert_eq!(Settings::parse(&with), Some(s.clone()));
        let mut bad = with.clone();
        bad[6] |= 4;
        assert_eq!(Settings::parse(&bad), None);
        // The AES-256-GCM bit: a flag, nothing after it.
        s.aes_gcm = true;
        let aes = s.to_vec();
        assert_eq!(aes[6], FEATURE_STREAMS | FEATURE_AES_GCM);
        assert_eq!(aes.len(), with.len());
        assert_eq!(Settings::parse(&aes), Some(s.clone()));
        s.aes_gcm = false;
        assert_eq!(Settings::parse(&with[..with.len() - 8]), None);
        let mut bad = with.clone();
        bad[6] = 0;
        assert_eq!(Settings::parse(&bad), None);
    }

    #[test]
    fn streams_and_aes_are_announced_and_need_not_match() {
        let ours = base();
        let mut theirs = base();
        theirs.streams = Some(7);
        theirs.aes_gcm = true;
        assert_eq!(ours.mismatch(&theirs), None);
    }

    #[test]
    fn mismatches_name_the_setting_and_both_values() {
        let ours = base();
        let mut theirs = base();
        assert_eq!(ours.mismatch(&theirs), None);
        theirs.mode = Mode::Trr;
        let m = ours.mismatch(&theirs).unwrap();
        assert_eq!(
            m.to_string(),
            "the peer's mode is \"trr\", ours is \"logical\": both ends must use the same mode"
        );
        let mut theirs = base();
        theirs.weights = vec![2, 4];
        assert_eq!(ours.mismatch(&theirs), None, "the same ratio");
        theirs.weights = vec![1, 1];
        let m = ours.mismatch(&theirs).unwrap();
        assert_eq!(m.setting, "channel weights");
        assert_eq!((m.ours.as_str(), m.theirs.as_str()), ("[1, 2]", "[1, 1]"));
        let mut theirs = base();
        theirs.max_packet = 1412;
        assert_eq!(ours.mismatch(&theirs).unwrap().setting, "largest datagram");
        // Seq mode: the sequence header confirms; weights may differ.
        let (mut a, mut b) = (base(), base());
        a.mode = Mode::Seq;
        b.mode = Mode::Seq;
        b.weights = vec![1, 1];
        assert_eq!(a.mismatch(&b), None);
        b.security = SecurityMode::Auth;
        assert_eq!(a.mismatch(&b).unwrap().setting, "security");
        // Another number of channels is no mismatch: the bond runs over the channels
        // both ends have, and their quanta must agree (a reload adds or removes a
        // channel at one end before the other).
        let mut theirs = base();
        theirs.weights = vec![1, 2, 3];
        assert_eq!(ours.mismatch(&theirs), None);
        theirs.weights = vec![2, 4, 1];
        assert_eq!(
            ours.mismatch(&theirs),
            None,
            "the common two in the same ratio"
        );
        theirs.weights = vec![1, 1, 3];
        assert_eq!(ours.mismatch(&theirs).unwrap().setting, "channel weights");
        theirs.weights = vec![1];
        assert_eq!(ours.mismatch(&theirs), None);
        let mut theirs = base();
        theirs.credits = Some(CreditConfig {
            window: 64,
            pool: None,
        });
        let m = ours.mismatch(&theirs).unwrap();
        assert_eq!(
            (m.ours.as_str(), m.theirs.as_str()),
            ("off", "on (window 64)")
        );
    }
}
