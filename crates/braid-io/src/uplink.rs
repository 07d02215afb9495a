//! Uplinks that come and go: whether each channel's own uplink (its `device`, its
//! `local` address) is there, and a doorbell that rings when the host's interfaces or
//! addresses change (`docs/tunnel.md`, "Uplinks that come and go").
//!
//! The session driver owns the sockets: on a change it looks at the interfaces again
//! ([`interfaces`], one `getifaddrs`), takes a channel whose uplink is gone out of the
//! bond at once (`braid_proto::session::Session::set_uplink`) and closes its socket,
//! and binds a new socket when the uplink is back: a socket bound to a device
//! (SO_BINDTODEVICE) keeps the interface index it was bound to, and a device deleted
//! and created again (a modem re-enumerated, a VPN or veth re-made) has a new one, so
//! the old socket would never carry anything again.
//!
//! The doorbell is a netlink socket subscribed to the kernel's link and address
//! notifications (`netlink-sys`; nothing in the messages is read, they only say "look
//! again"), so a change is seen within a scheduling delay; a slow periodic look
//! ([`Watch::tick`]) covers notifications lost to a full socket buffer, and retries a
//! bind that failed (an IPv6 address still in duplicate address detection).

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tracing::warn;

use crate::config::ChannelConfig;

/// One network interface as `getifaddrs` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Iface {
    pub name: String,
    pub index: u32,
    /// Administratively up (IFF_UP).
    pub up: bool,
    /// Has a carrier (IFF_RUNNING).
    pub running: bool,
    pub addrs: Vec<IpAddr>,
}

/// The host's interfaces and their addresses, now.
pub(crate) fn interfaces() -> io::Result<Vec<Iface>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list it allocates into `head`; freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out: Vec<Iface> = Vec::new();
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `p` is an element of the list getifaddrs made, not yet freed.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a NUL-terminated name in the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) };
        let i = match out
            .iter()
            .position(|x| x.name.as_bytes() == name.to_bytes())
        {
            Some(i) => i,
            None => {
                // SAFETY: a NUL-terminated name.
                let index = unsafe { libc::if_nametoindex(ifa.ifa_name) };
                let flags = ifa.ifa_flags as libc::c_int;
                out.push(Iface {
                    name: name.to_string_lossy().into_owned(),
                    index,
                    up: flags & libc::IFF_UP != 0,
                    running: flags & libc::IFF_RUNNING != 0,
                    addrs: Vec::new(),
                });
                out.len() - 1
            }
        };
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: a socket address of the family it names.
        let addr = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let a = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr))))
                }
                libc::AF_INET6 => {
                    let a = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    Some(IpAddr::V6(Ipv6Addr::from(a.sin6_addr.s6_addr)))
                }
                _ => None,
            }
        };
        out[i].addrs.extend(addr);
    }
    // SAFETY: the list getifaddrs made, freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// What a channel's uplink is: its device, its own local address, or both. A channel
/// with neither (any address, no device) follows the routing table and is not
/// watched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Uplink {
    pub device: Option<String>,
    pub address: Option<IpAddr>,
}

impl Uplink {
    /// Channel `c`'s uplink, if it has one to watch.
    pub(crate) fn of(c: &ChannelConfig) -> Option<Uplink> {
        // The loopback interface does not come and go.
        let address = Some(c.local.ip()).filter(|a| !a.is_unspecified() && !a.is_loopback());
        (c.device.is_some() || address.is_some()).then(|| Uplink {
            device: c.device.clone(),
            address,
        })
    }

    /// Is it there (`Ok`: the index of the interface it is, its identity: a device
    /// made anew has a new one), or why not.
    pub(crate) fn check(&self, ifs: &[Iface]) -> Result<u32, String> {
        let usable = |i: &Iface, what: &str| -> Result<u32, String> {
            if !i.up {
                Err(format!("{what} is down"))
            } else if !i.running {
                Err(format!("{what} has no carrier"))
            } else {
                Ok(i.index)
            }
        };
        let dev = match &self.device {
            Some(d) => {
                let i = ifs
                    .iter()
                    .find(|i| &i.name == d)
                    .ok_or_else(|| format!("device {d} does not exist"))?;
                Some(usable(i, &format!("device {d}"))?)
            }
            None => None,
        };
        if let Some(a) = self.address {
            let i = ifs
                .iter()
                .find(|i| i.addrs.contains(&a))
                .ok_or_else(|| format!("address {a} is not configured on any interface"))?;
            let at = usable(i, &format!("the interface of address {a} ({})", i.name))?;
            return Ok(dev.unwrap_or(at));
        }
        dev.ok_or_else(|| "nothing to watch".into())
    }
}

/// How often the interfaces are looked at without a notification: while a channel
/// waits for its socket (a bind that failed), without notifications, and with them
/// (in case one was lost without the socket saying so).
pub(crate) const RETRY: Duration = Duration::from_millis(250);
pub(crate) const SAFETY_NET: Duration = Duration::from_secs(2);
pub(crate) const SUBSCRIBED: Duration = Duration::from_secs(30);

/// The kernel's link and address notifications, as a doorbell.
pub(crate) struct Watch {
    sock: Option<AsyncFd<netlink_sys::Socket>>,
    buf: Vec<u8>,
}

impl Watch {
    /// Subscribe to the notifications; without them (no netlink here), the periodic
    /// look alone (the error says why).
    pub(crate) fn start() -> (Watch, Option<io::Error>) {
        match subscribe() {
            Ok(s) => (
                Watch {
                    sock: Some(s),
                    buf: Vec::with_capacity(1 << 16),
                },
                None,
            ),
            Err(e) => (
                Watch {
                    sock: None,
                    buf: Vec::new(),
                },
                Some(e),
            ),
        }
    }

    /// The periodic look's interval when nothing waits (see [`RETRY`]).
    pub(crate) fn idle_look(&self) -> Duration {
        if self.sock.is_some() {
            SUBSCRIBED
        } else {
            SAFETY_NET
        }
    }

    /// Resolves when a link or address changed (what the notifications said is
    /// dropped: the caller looks again). Pending for ever without the subscription.
    /// A socket that fails otherwise is given up (the caller looks now, and from then
    /// on every [`SAFETY_NET`]: see [`Watch::idle_look`]); it would stay readable and
    /// spin.
    pub(crate) async fn rung(&mut self) {
        let Some(sock) = &self.sock else {
            return std::future::pending().await;
        };
        let mut broken = None;
        loop {
            let Ok(mut guard) = sock.readable().await else {
                return std::future::pending().await;
            };
            let mut any = false;
            // Drain what is queued: one look for a burst of notifications.
            loop {
                self.buf.clear();
                match guard.try_io(|s| s.get_ref().recv(&mut self.buf, 0)) {
                    Ok(Ok(_)) => any = true,
                    // ENOBUFS: notifications were lost; a look sees the outcome.
                    Ok(Err(e)) if e.raw_os_error() == Some(libc::ENOBUFS) => any = true,
                    Ok(Err(e)) => {
                        broken = Some(e);
                        break;
                    }
                    // Drained (readiness cleared).
                    Err(_) => break,
                }
            }
            if any || broken.is_some() {
                break;
            }
        }
        if let Some(e) = broken {
            warn!(
                "interface notifications failed ({e}): channels' uplinks are looked at every {} s instead",
                SAFETY_NET.as_secs()
            );
            self.sock = None;
        }
    }
}

fn subscribe() -> io::Result<AsyncFd<netlink_sys::Socket>> {
    use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
    const GROUPS: u32 =
        (libc::RTMGRP_LINK | libc::RTMGRP_IPV4_IFADDR | libc::RTMGRP_IPV6_IFADDR) as u32;
    let mut s = Socket::new(NETLINK_ROUTE)?;
    s.bind(&SocketAddr::new(0, GROUPS))?;
    s.set_non_blocking(true)?;
    // SAFETY: the socket owns its descriptor and closes it only when dropped, with the
    // AsyncFd that holds it.
    Ok(unsafe { AsyncFd::register(s) }?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(name: &str, index: u32, up: bool, running: bool, addrs: &[&str]) -> Iface {
        Iface {
            name: name.into(),
            index,
            up,
            running,
            addrs: addrs.iter().map(|a| a.parse().unwrap()).collect(),
        }
    }

    #[test]
    fn an_uplink_is_there_while_its_device_and_address_are_usable() {
        let dev = Uplink {
            device: Some("wan1".into()),
            address: None,
        };
        let addr = Uplink {
            device: None,
            address: Some("192.0.2.1".parse().unwrap()),
        };
        let ifs = [
            iface("lo", 1, true, true, &["127.0.0.1"]),
            iface("wan1", 7, true, true, &["192.0.2.1"]),
        ];
        assert_eq!(dev.check(&ifs), Ok(7));
        assert_eq!(addr.check(&ifs), Ok(7));
        // Made anew: a new index.
        let ifs = [iface("wan1", 9, true, true, &["192.0.2.1"])];
        assert_eq!(dev.check(&ifs), Ok(9));
        let e = dev.check(&[iface("lo", 1, true, true, &[])]).unwrap_err();
        assert_eq!(e, "device wan1 does not exist");
        let e = dev
            .check(&[iface("wan1", 7, false, false, &[])])
            .unwrap_err();
        assert_eq!(e, "device wan1 is down");
        let e = dev
            .check(&[iface("wan1", 7, true, false, &[])])
            .unwrap_err();
        assert_eq!(e, "device wan1 has no carrier");
        let e = addr
            .check(&[iface("wan1", 7, true, true, &["192.0.2.9"])])
            .unwrap_err();
        assert_eq!(e, "address 192.0.2.1 is not configured on any interface");
        // Both: the device's index.
        let both = Uplink {
            device: Some("wan1".into()),
            address: Some("192.0.2.1".parse().unwrap()),
        };
        assert_eq!(both.check(&ifs), Ok(9));
        assert!(both.check(&[iface("wan1", 9, true, true, &[])]).is_err());
    }

    #[test]
    fn only_channels_with_a_device_or_an_address_are_watched() {
        let mut c = ChannelConfig::new(
            "x",
            "0.0.0.0:0".parse().unwrap(),
            "192.0.2.1:7000".parse().unwrap(),
        );
        assert_eq!(Uplink::of(&c), None);
        c.device = Some("wwan0".into());
        assert!(Uplink::of(&c).is_some_and(|u| u.address.is_none()));
        c.device = None;
        c.local = "[2001:db8::2]:7000".parse().unwrap();
        assert!(Uplink::of(&c).is_some_and(|u| u.address.is_some()));
        c.local = "127.0.0.1:7000".parse().unwrap();
        assert_eq!(Uplink::of(&c), None, "loopback does not come and go");
    }

    #[test]
    fn the_loopback_interface_is_listed() {
        let ifs = interfaces().unwrap();
        let lo = ifs.iter().find(|i| i.name == "lo").expect("lo");
        assert!(lo.index > 0);
        let u = Uplink {
            device: Some("lo".into()),
            address: None,
        };
        // Up where the test runs (a fresh network namespace has it down).
        assert_eq!(u.check(&ifs).is_ok(), lo.up && lo.running);
    }
}
