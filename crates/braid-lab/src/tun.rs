//! A minimal TUN device: open `/dev/net/tun`, attach to a named interface, read and
//! write raw IP packets (no packet-information header).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// An open TUN device.
#[derive(Debug)]
pub struct Tun {
    file: File,
    name: String,
}

impl Tun {
    /// Create (or attach to) TUN interface `name`, non-blocking.
    pub fn open(name: &str) -> io::Result<Tun> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("interface name '{name}' must be 1 to 15 bytes"),
            ));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/net/tun")
            .map_err(|e| io::Error::new(e.kind(), format!("/dev/net/tun: {e}")))?;
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            flags: IFF_TUN | IFF_NO_PI,
            _pad: [0; 22],
        };
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: TUNSETIFF reads and writes a struct ifreq, which IfReq lays out.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF as _, &mut req) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("TUNSETIFF {name}: {e} (creating a TUN device needs CAP_NET_ADMIN)"),
            ));
        }
        Ok(Tun {
            file,
            name: name.to_string(),
        })
    }

    /// Interface name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Read one packet; `WouldBlock` when none is waiting.
    pub fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.file.read(buf)
    }

    /// Write one packet.
    pub fn send(&mut self, packet: &[u8]) -> io::Result<usize> {
        self.file.write(packet)
    }
}

impl AsRawFd for Tun {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}
