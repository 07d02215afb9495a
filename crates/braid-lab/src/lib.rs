//! # braid-lab
//!
//! The testbed in which braid is measured against single links and Linux MPTCP:
//!
//! * [`args`]: the flags of `braid lab`'s subcommands and their check into options;
//! * [`cmd`]: `braid lab`'s subcommand tree and its run;
//! * [`spec`]: link descriptions such as `100mbit/5ms` or `20mbit/60ms/1%`;
//! * [`emu`]: the user-space link emulator. This kernel has no netem, so delay, jitter
//!   and loss come from a program that reads each packet from a TUN device, holds it for
//!   the link's delay in a FIFO, drops some, and writes the rest back;
//! * [`tools`]: the outside programs it needs, checked first, with their packages;
//! * [`stream`]: `braid lab stream`, a live stream through braid and through SRT;
//! * [`topo`]: the network namespaces, veth pairs, `tbf` shapers and policy routes that
//!   make every packet of link *i* cross emulator *i*, whatever program sent it (plain TCP,
//!   MPTCP subflows, braid's UDP channels).
//!
//! * [`overlay`]: `braid lab overlay`, five `braid node`s (source, three relays,
//!   destination) in their own namespaces with one emulated hop per pair.
//! * [`field`]: `braid lab field`, a `braid tunnel` server and three clients behind
//!   NATs and IPv6-only uplinks, with NAT rebinding, an uplink that goes and comes
//!   back, a client restart and a server restart during checked traffic.
//!
//! Everything the two-link lab creates carries the `brl` prefix, the overlay lab the
//! `bro-` prefix and the field lab `field-`, so `topo::down` and `overlay::down` can remove them also after a crash.

pub mod args;
pub mod bench;
pub mod chart;
pub mod cmd;
pub mod emu;
pub mod field;
pub mod overlay;
pub mod spec;
pub mod stream;
pub mod tools;
pub mod topo;
