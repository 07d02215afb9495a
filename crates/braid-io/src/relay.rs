//! A UDP relay for tests and demos: it sits in the middle of each channel on loopback
//! and can silence a channel (drop everything, both directions), so failover can be
//! exercised without privileges. It can also inject raw datagrams towards either end
//! and keeps the last control datagram it forwarded, for replay tests.
//!
//! Each relayed channel has two sockets: `a_side` (end A aims its channel there) and
//! `b_side` (end B aims its channel there). The relay learns each end's address from
//! the first datagram it receives from it.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use braid_proto::wire;

struct Half {
    sock: UdpSocket,
    learned: Mutex<Option<SocketAddr>>,
    last_ctrl: Mutex<Option<Vec<u8>>>,
}

struct Chan {
    a: Half,
    b: Half,
    silenced: AtomicBool,
    forwarded: AtomicU64,
    dropped: AtomicU64,
}

/// One end of a channel: a socket on 127.0.0.1 with an ephemeral port, large buffers
/// and a short read timeout (so that its thread sees `stop`).
fn bind_half() -> std::io::Result<Half> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
    // Large buffers: the relay thread must not be the bottleneck in tests.
    let _ = s.set_recv_buffer_size(8 << 20);
    let _ = s.set_send_buffer_size(8 << 20);
    s.bind(&"127.0.0.1:0".parse::<SocketAddr>().expect("addr").into())?;
    let sock: UdpSocket = s.into();
    sock.set_read_timeout(Some(Duration::from_millis(20)))?;
    Ok(Half {
        sock,
        learned: Mutex::new(None),
        last_ctrl: Mutex::new(None),
    })
}

/// A forwarding thread's loop until `stop`: each datagram to channel `ch`'s end A
/// (`from_a`) or B goes out of the other end to the address last heard there, unless
/// the channel is silenced (then it is counted and dropped); the last sealed or
/// control datagram from each side is kept for replays.
fn forward(ch: &Chan, from_a: bool, stop: &AtomicBool) {
    let mut buf = vec![0u8; 65536];
    let (src, dst) = if from_a {
        (&ch.a, &ch.b)
    } else {
        (&ch.b, &ch.a)
    };
    while !stop.load(Ordering::Relaxed) {
        let Ok((n, from)) = src.sock.recv_from(&mut buf) else {
            continue;
        };
        *src.learned.lock().unwrap() = Some(from);
        if ch.silenced.load(Ordering::Relaxed) {
            ch.dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        // Sealed datagrams (any, in modes encrypt and auth), or bare
        // control; never bare data (repairs, 0xB6, are data).
        if n > 0
            && (wire::is_authenticated_control(buf[0])
                || matches!(buf[0], wire::TYPE_SEALED | wire::TYPE_SIGNED))
        {
            *src.last_ctrl.lock().unwrap() = Some(buf[..n].to_vec());
        }
        let to = *dst.learned.lock().unwrap();
        if let Some(to) = to {
            if dst.sock.send_to(&buf[..n], to).is_ok() {
                ch.forwarded.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// A running relay; stops when dropped.
pub struct Relay {
    chans: Vec<Arc<Chan>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

/// Which end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// End A.
    A,
    /// End B.
    B,
}

impl Relay {
    /// A relay for `n` channels on 127.0.0.1 with ephemeral ports.
    pub fn new(n: usize) -> std::io::Result<Relay> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut chans = Vec::new();
        let mut threads = Vec::new();
        for _ in 0..n {
            let ch = Arc::new(Chan {
                a: bind_half()?,
                b: bind_half()?,
                silenced: AtomicBool::new(false),
                forwarded: AtomicU64::new(0),
                dropped: AtomicU64::new(0),
            });
            for from_a in [true, false] {
                let ch = ch.clone();
                let stop = stop.clone();
                threads.push(std::thread::spawn(move || forward(&ch, from_a, &stop)));
            }
            chans.push(ch);
        }
        Ok(Relay {
            chans,
            stop,
            threads,
        })
    }

    /// Where end A must aim channel `c`.
    pub fn a_side(&self, c: usize) -> SocketAddr {
        self.chans[c].a.sock.local_addr().expect("bound")
    }

    /// Where end B must aim channel `c`.
    pub fn b_side(&self, c: usize) -> SocketAddr {
        self.chans[c].b.sock.local_addr().expect("bound")
    }

    /// Tell the relay where end A's and end B's channel `c` sockets are, so it can
    /// forward before it has heard from them.
    pub fn set_ends(&self, c: usize, a: SocketAddr, b: SocketAddr) {
        *self.chans[c].a.learned.lock().unwrap() = Some(a);
        *self.chans[c].b.learned.lock().unwrap() = Some(b);
    }

    /// Drop everything on channel `c` (both directions) while `on`.
    pub fn silence(&self, c: usize, on: bool) {
        self.chans[c].silenced.store(on, Ordering::Relaxed);
    }

    /// Datagrams forwarded and dropped on channel `c`.
    pub fn counts(&self, c: usize) -> (u64, u64) {
        let ch = &self.chans[c];
        (
            ch.forwarded.load(Ordering::Relaxed),
            ch.dropped.load(Ordering::Relaxed),
        )
    }

    /// Send raw bytes to end `to` on channel `c`, as if they came over the channel.
    pub fn inject(&self, c: usize, to: Side, bytes: &[u8]) -> std::io::Result<()> {
        let ch = &self.chans[c];
        let (from, dst) = match to {
            Side::B => (&ch.b, &ch.b),
            Side::A => (&ch.a, &ch.a),
        };
        let addr = dst
            .learned
            .lock()
            .unwrap()
            .ok_or_else(|| std::io::Error::other("end not known yet"))?;
        from.sock.send_to(bytes, addr).map(|_| ())
    }

    /// The last sealed datagram, or bare control datagram (marker, trigger, session
    /// message or NAK: see [`wire::is_authenticated_control`]), that end `from` sent
    /// on channel `c`.
    pub fn last_control_from(&self, c: usize, from: Side) -> Option<Vec<u8>> {
        let ch = &self.chans[c];
        match from {
            Side::A => ch.a.last_ctrl.lock().unwrap().clone(),
            Side::B => ch.b.last_ctrl.lock().unwrap().clone(),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repairs_are_data_not_control() {
        let relay = Relay::new(1).unwrap();
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        relay.set_ends(0, a.local_addr().unwrap(), b.local_addr().unwrap());
        let mut buf = [0u8; 64];
        // A repair: sequence header 0xB6, then data. Forwarded, not kept as control.
        let repair = [wire::TYPE_REPAIR, 0, 0, 0, 1, 0x45, 0];
        a.send_to(&repair, relay.a_side(0)).unwrap();
        let n = b.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], &repair);
        assert_eq!(relay.last_control_from(0, Side::A), None);
        // A NAK is control (authenticated by braid-io): kept for replay tests.
        let nak = [wire::TYPE_NAK, 1, 0, 1, 0, 0, 0, 0];
        a.send_to(&nak, relay.a_side(0)).unwrap();
        let n = b.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], &nak);
        assert_eq!(
            relay.last_control_from(0, Side::A).as_deref(),
            Some(&nak[..])
        );
    }
}
