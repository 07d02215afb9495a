//! # braid-io
//!
//! braid on real sockets: a tokio driver for the sans-IO state machines of
//! [`braid_proto`] with a real clock, one UDP socket per channel.
//!
//! * [`Session`]: stripe your own messages over several UDP paths. Start it with a
//!   [`SessionConfig`] (the channels, each a local and a remote address, plus a
//!   pre-shared key), then [`Session::send`] messages, [`Session::recv`] them in order
//!   at the other end, and read [`Session::stats`]. Both ends run the same code.
//! * Channel liveness and failover: hellos every heartbeat on every channel and the
//!   striper's markers reveal which channels deliver; a channel silent for
//!   `dead_after` is declared down and the sender moves to a new channel set at an
//!   epoch boundary both ends agree on; it rejoins the same way.
//! * Every control packet (markers, triggers, session messages) is authenticated with a
//!   keyed BLAKE3 MAC and a per-channel replay counter. Data stay header-free in
//!   `logical` and `trr` modes.
//! * All of that protocol is the sans-IO machine [`braid_proto::session`]; this crate
//!   supplies sockets, the clock and the queues to the application.
//! * [`tun`]: a Linux TUN device, for `braid tunnel`.
//! * [`observe`]: the `braid status` control socket and the Prometheus endpoint.
//!
//! The design, the wire formats and every configuration key are in `docs/tunnel.md`.
//! A runnable example: `cargo run -p braid-io --example pair`.

#![warn(missing_docs)]

mod admit;
pub mod args;
pub mod bench;
mod chunks;
pub mod config;
pub mod icmp;
pub mod keys;
pub mod logging;
pub mod memory;
pub mod mss;
pub mod node;
pub mod node_flow;
pub mod node_report;
pub mod observe;
pub mod offload;
pub mod peer_file;
pub mod peers_bench;
pub mod pep;
pub mod proxy;
pub mod relay;
pub mod reload;
pub mod segment;
pub mod server;
pub mod session;
pub mod stats;
pub mod status;
pub mod traffic;
pub mod transfer;
pub mod tun;
pub mod tunnel;
pub(crate) mod uplink;

pub use config::{
    ChannelConfig, ConfigFileError, FileConfig, PeerConfig, SessionConfig, TunnelConfig,
};
pub use session::{Refusal, Session, SessionError, SessionSender, StatsHandle};
pub use stats::{ChannelSnapshot, PeerStats, ServerCounters, SessionStats};
