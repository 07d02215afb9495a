//! A Linux TUN device (layer 3, no packet-information header) through plain ioctls:
//! the one TUN module of braid.
//!
//! [`TunDevice`] is the open, non-blocking device with plain `recv`/`send` (the lab's
//! link emulator polls it itself); [`Tun`] drives one with tokio's [`AsyncFd`] and adds
//! the interface settings (MTU, address, up) `braid tunnel` needs. Creating a device
//! needs CAP_NET_ADMIN; the errors say so.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use tokio::io::unix::AsyncFd;

const TUNSETIFF: libc::Ioctl = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
/// `_IOW('T', 208, unsigned int)`: which offloads the reader takes.
const TUNSETOFFLOAD: libc::Ioctl = 0x4004_54d0;
const TUN_F_CSUM: libc::c_ulong = 0x01;
const TUN_F_TSO4: libc::c_ulong = 0x02;
const TUN_F_TSO6: libc::c_ulong = 0x04;
const TUN_F_USO4: libc::c_ulong = 0x20;
const TUN_F_USO6: libc::c_ulong = 0x40;

/// What a device made with virtio-net headers hands its reader (see
/// [`crate::segment`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offload {
    /// One packet per read, checksums complete (no `TUNSETOFFLOAD`).
    None,
    /// TCP super-segments (IPv4 and IPv6) with partial checksums.
    Tso,
    /// TCP super-segments and UDP GSO trains (Linux 6.2 and later).
    TsoUso,
}

/// Why a TUN device could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TunError {
    /// Not allowed.
    #[error("creating TUN device '{name}' needs CAP_NET_ADMIN: run braid as root (or give the binary cap_net_admin with setcap): {error}")]
    Permission {
        /// Device name.
        name: String,
        /// OS error.
        error: io::Error,
    },
    /// No /dev/net/tun.
    #[error("cannot open /dev/net/tun ({error}): the kernel has no TUN support or the device node is missing")]
    NoDevice {
        /// OS error.
        error: io::Error,
    },
    /// Any other step.
    #[error("TUN device '{name}': {what}: {error}")]
    Setup {
        /// Device name.
        name: String,
        /// Which step.
        what: &'static str,
        /// OS error.
        error: io::Error,
    },
}

/// An open TUN device, non-blocking, without an event loop.
#[derive(Debug)]
pub struct TunDevice {
    fd: OwnedFd,
    name: String,
    /// Every packet carries a virtio-net header (see [`crate::offload`]).
    vnet: bool,
}

impl AsRawFd for TunDevice {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

/// An open TUN device driven by tokio.
pub struct Tun {
    fd: AsyncFd<TunDevice>,
    name: String,
}

fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut r: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in r.ifr_name.iter_mut().zip(name.bytes().take(15)) {
        *d = s as libc::c_char;
    }
    r
}

fn sockaddr_in(a: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(a).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size on Linux; we copy bytes.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

impl TunDevice {
    /// Create (or attach to) the TUN device `name` (1 to 15 bytes), non-blocking.
    pub fn open(name: &str) -> Result<TunDevice, TunError> {
        TunDevice::open_with(name, false)
    }

    /// Like [`TunDevice::open`]; with `vnet`, every packet read or written carries a
    /// virtio-net header (`IFF_VNET_HDR`), so that merged TCP segments can be written.
    pub fn open_with(name: &str, vnet: bool) -> Result<TunDevice, TunError> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ {
            return Err(TunError::Setup {
                name: name.into(),
                what: "the name must be 1 to 15 bytes",
                error: io::Error::from(io::ErrorKind::InvalidInput),
            });
        }
        let path = b"/dev/net/tun\0";
        // SAFETY: a valid NUL-terminated path.
        let raw = unsafe {
            libc::open(
                path.as_ptr() as *const libc::c_char,
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if raw < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EPERM) | Some(libc::EACCES) => TunError::Permission {
                    name: name.into(),
                    error: e,
                },
                _ => TunError::NoDevice { error: e },
            });
        }
        // SAFETY: raw is a freshly opened descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut req = ifreq(name);
        req.ifr_ifru.ifru_flags = IFF_TUN | IFF_NO_PI | if vnet { IFF_VNET_HDR } else { 0 };
        // SAFETY: TUNSETIFF takes a pointer to an ifreq.
        if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF, &mut req) } < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EPERM) | Some(libc::EACCES) => TunError::Permission {
                    name: name.into(),
                    error: e,
                },
                _ => TunError::Setup {
                    name: name.into(),
                    what: "TUNSETIFF (is the name taken by a device of another kind?)",
                    error: e,
                },
            });
        }
        let actual: String = req
            .ifr_name
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8 as char)
            .collect();
        Ok(TunDevice {
            fd,
            name: actual,
            vnet,
        })
    }

    /// The device name the kernel gave.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Read one IP packet; `WouldBlock` when none is waiting.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        if self.vnet {
            return self.recv_vnet(buf);
        }
        self.read(buf)
    }

    /// Read a frame and move its packet to the front of `buf`; frames that are not one
    /// whole packet (never sent while no offload is turned on) read as empty.
    fn recv_vnet(&self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.read(buf)?;
        match crate::offload::finish_read(&mut buf[..n]) {
            Some(r) => {
                let len = r.len();
                buf.copy_within(r, 0);
                Ok(len)
            }
            None => Ok(0),
        }
    }

    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: buf is valid for buf.len() bytes.
        byte_count(unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
            )
        })
    }

    /// Write one frame, `head` then `body`, in one call.
    fn send2(&self, head: &[u8], body: &[u8]) -> io::Result<usize> {
        let iov = [
            libc::iovec {
                iov_base: head.as_ptr() as *mut libc::c_void,
                iov_len: head.len(),
            },
            libc::iovec {
                iov_base: body.as_ptr() as *mut libc::c_void,
                iov_len: body.len(),
            },
        ];
        // SAFETY: both buffers are valid for their lengths for the whole call.
        byte_count(unsafe { libc::writev(self.fd.as_raw_fd(), iov.as_ptr(), 2) })
    }

    /// Write one IP packet; `WouldBlock` when the device queue is full.
    pub fn send(&self, pkt: &[u8]) -> io::Result<usize> {
        if self.vnet {
            return self.send2(&[0; crate::offload::VNET_HDR_LEN], pkt);
        }
        // SAFETY: pkt is valid for pkt.len() bytes.
        byte_count(unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                pkt.as_ptr() as *const libc::c_void,
                pkt.len(),
            )
        })
    }
}

impl TunDevice {
    /// Turn on transmit offloads: TSO for TCP over IPv4 and IPv6 with partial
    /// checksums, and UDP segmentation where the kernel has it (older kernels refuse
    /// `TUN_F_USO*` with `EINVAL`: then without). Only for a device made with `vnet`.
    pub fn set_offload(&self) -> io::Result<Offload> {
        if !self.vnet {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "offloads need a device with virtio-net headers",
            ));
        }
        let tso = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6;
        for (flags, what) in [
            (tso | TUN_F_USO4 | TUN_F_USO6, Offload::TsoUso),
            (tso, Offload::Tso),
        ] {
            // SAFETY: TUNSETOFFLOAD takes its flags by value.
            if unsafe { libc::ioctl(self.fd.as_raw_fd(), TUNSETOFFLOAD, flags) } == 0 {
                return Ok(what);
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINVAL) {
                return Err(e);
            }
        }
        Err(io::Error::from_raw_os_error(libc::EINVAL))
    }

    /// Read one frame: on a device with virtio-net headers as the kernel hands it, on
    /// one without, an all-zero header and the packet.
    pub fn recv_frame(&self, buf: &mut [u8]) -> io::Result<usize> {
        if self.vnet {
            return self.read(buf);
        }
        let hdr = crate::offload::VNET_HDR_LEN.min(buf.len());
        buf[..hdr].fill(0);
        Ok(hdr + self.read(&mut buf[hdr..])?)
    }

    fn send_frame(&self, frame: &[u8]) -> io::Result<usize> {
        let (h, b) = frame.split_at(frame.len().min(crate::offload::VNET_HDR_LEN));
        self.send2(h, b)
    }
}

impl Tun {
    /// Create (or attach to) the TUN device `name`. Must be called inside a tokio
    /// runtime.
    pub fn create(name: &str) -> Result<Tun, TunError> {
        Tun::create_with(name, false)
    }

    /// Like [`Tun::create`]; with `vnet`, a device with virtio-net headers, to which
    /// [`Tun::send_frame`] can write merged TCP segments.
    pub fn create_with(name: &str, vnet: bool) -> Result<Tun, TunError> {
        let dev = TunDevice::open_with(name, vnet)?;
        let name = dev.name.clone();
        // SAFETY: the TunDevice owns its descriptor and keeps it open for as long as
        // the AsyncFd holds it.
        let fd = unsafe { AsyncFd::register(dev) }.map_err(|e| TunError::Setup {
            name: name.clone(),
            what: "registering with the event loop",
            error: io::Error::from(e),
        })?;
        Ok(Tun { fd, name })
    }

    /// The device name the kernel gave.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn ctl(
        &self,
        what: &'static str,
        req: libc::Ioctl,
        r: &mut libc::ifreq,
    ) -> Result<(), TunError> {
        // SAFETY: plain ioctl on a datagram socket with a valid ifreq.
        unsafe {
            let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
            if s < 0 {
                return Err(TunError::Setup {
                    name: self.name.clone(),
                    what,
                    error: io::Error::last_os_error(),
                });
            }
            let rc = libc::ioctl(s, req, r as *mut libc::ifreq);
            let e = io::Error::last_os_error();
            libc::close(s);
            if rc < 0 {
                return Err(match e.raw_os_error() {
                    Some(libc::EPERM) | Some(libc::EACCES) => TunError::Permission {
                        name: self.name.clone(),
                        error: e,
                    },
                    _ => TunError::Setup {
                        name: self.name.clone(),
                        what,
                        error: e,
                    },
                });
            }
        }
        Ok(())
    }

    /// The device's MTU.
    pub fn mtu(&self) -> Result<u32, TunError> {
        let mut r = ifreq(&self.name);
        self.ctl("reading the MTU", libc::SIOCGIFMTU, &mut r)?;
        // SAFETY: SIOCGIFMTU filled the union's MTU member.
        let mtu = unsafe { r.ifr_ifru.ifru_mtu };
        Ok(u32::try_from(mtu).unwrap_or(0))
    }

    /// Set the device's MTU.
    pub fn set_mtu(&self, mtu: u32) -> Result<(), TunError> {
        let mut r = ifreq(&self.name);
        r.ifr_ifru.ifru_mtu = mtu as libc::c_int;
        self.ctl("setting the MTU", libc::SIOCSIFMTU, &mut r)
    }

    /// Give the device an IPv4 address and prefix.
    pub fn set_ipv4(&self, addr: Ipv4Addr, prefix: u8) -> Result<(), TunError> {
        let mut r = ifreq(&self.name);
        r.ifr_ifru.ifru_addr = sockaddr_in(addr);
        self.ctl("setting the address", libc::SIOCSIFADDR, &mut r)?;
        let mask = if prefix == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(prefix))
        };
        let mut r = ifreq(&self.name);
        r.ifr_ifru.ifru_netmask = sockaddr_in(Ipv4Addr::from(mask));
        self.ctl("setting the netmask", libc::SIOCSIFNETMASK, &mut r)
    }

    /// Give the device an IPv6 address and prefix (the prefix's route comes with it).
    pub fn set_ipv6(&self, addr: Ipv6Addr, prefix: u8) -> Result<(), TunError> {
        let what =
            "setting the IPv6 address (is IPv6 disabled? sysctl net.ipv6.conf.all.disable_ipv6)";
        let setup = |what: &'static str, error: io::Error| match error.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => TunError::Permission {
                name: self.name.clone(),
                error,
            },
            _ => TunError::Setup {
                name: self.name.clone(),
                what,
                error,
            },
        };
        let mut r = ifreq(&self.name);
        self.ctl("reading the interface index", libc::SIOCGIFINDEX, &mut r)?;
        // SAFETY: SIOCGIFINDEX filled ifru_ifindex.
        let index = unsafe { r.ifr_ifru.ifru_ifindex };
        let req = libc::in6_ifreq {
            ifr6_addr: libc::in6_addr {
                s6_addr: addr.octets(),
            },
            ifr6_prefixlen: u32::from(prefix),
            ifr6_ifindex: index,
        };
        // SAFETY: SIOCSIFADDR on an AF_INET6 socket takes a pointer to an in6_ifreq,
        // valid for the call; the socket is closed after it.
        unsafe {
            let s = libc::socket(libc::AF_INET6, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
            if s < 0 {
                return Err(setup(what, io::Error::last_os_error()));
            }
            let rc = libc::ioctl(s, libc::SIOCSIFADDR, &req as *const libc::in6_ifreq);
            let e = io::Error::last_os_error();
            libc::close(s);
            if rc < 0 {
                return Err(setup(what, e));
            }
        }
        Ok(())
    }

    /// Bring the device up.
    pub fn up(&self) -> Result<(), TunError> {
        let mut r = ifreq(&self.name);
        self.ctl("reading flags", libc::SIOCGIFFLAGS, &mut r)?;
        // SAFETY: SIOCGIFFLAGS filled ifru_flags.
        unsafe {
            r.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        }
        self.ctl("bringing it up", libc::SIOCSIFFLAGS, &mut r)
    }

    /// Read one IP packet.
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut g = self.fd.readable().await?;
            let r = g.try_io(|dev| dev.get_ref().recv(buf));
            if let Ok(r) = r {
                return r;
            }
        }
    }

    /// Turn on transmit offloads ([`TunDevice::set_offload`]): from then on a read
    /// ([`Tun::recv_frame`]) may return a TCP super-segment to be cut with
    /// [`crate::segment::Segmenter`].
    pub fn set_offload(&self) -> io::Result<Offload> {
        self.fd.get_ref().set_offload()
    }

    /// Read one frame, a virtio-net header and a packet ([`TunDevice::recv_frame`]).
    pub async fn recv_frame(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut g = self.fd.readable().await?;
            let r = g.try_io(|dev| dev.get_ref().recv_frame(buf));
            if let Ok(r) = r {
                return r;
            }
        }
    }

    /// Read one frame if one is waiting, without waiting: `Ok(None)` when none is.
    pub fn try_recv_frame(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        match self
            .fd
            .try_io(tokio::io::Interest::READABLE, |dev| dev.recv_frame(buf))
        {
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether packets carry virtio-net headers.
    pub fn vnet(&self) -> bool {
        self.fd.get_ref().vnet
    }

    /// Write one frame built by [`crate::offload::build`] (header included) on a
    /// device made with `vnet`.
    pub async fn send_frame(&self, frame: &[u8]) -> io::Result<usize> {
        loop {
            let mut g = self.fd.writable().await?;
            let r = g.try_io(|dev| dev.get_ref().send_frame(frame));
            if let Ok(r) = r {
                return r;
            }
        }
    }

    /// Write one IP packet.
    pub async fn send(&self, pkt: &[u8]) -> io::Result<usize> {
        loop {
            let mut g = self.fd.writable().await?;
            let r = g.try_io(|dev| dev.get_ref().send(pkt));
            if let Ok(r) = r {
                return r;
            }
        }
    }
}

/// A read(2)/write(2) result as a byte count or the OS error.
fn byte_count(n: isize) -> io::Result<usize> {
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}
