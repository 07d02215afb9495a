//! The field lab's network: one server with a public address of each family, three
//! clients, each uplink through its own edge namespace (the modem or the ISP's box).
//!
//! ```text
//!  field-c1 (home)  up4 192.168.1.2 ── field-c1-e4 (NAT)            10.250.1.2 ─┐
//!                   up6 2001:db8:1::2 ── field-c1-e6 (routed)    2001:db8:ff01::2 ─┤
//!  field-c2 (van)   up4 192.168.2.2 ── field-c2-e4 (NAT)            10.250.2.2 ─┤ field-srv
//!                   up6 2001:db8:2::2 ── field-c2-e6 (NAT66)     2001:db8:ff02::2 ─┤ 198.51.100.1
//!  field-c3 (cgn)   up4 192.168.3.2 ── field-c3-cpe (NAT) 100.64.3.2 ──           │ 2001:db8:100::1
//!                                      field-c3-e4 (carrier NAT)    10.250.3.2 ─┤
//!                   up6 2001:db8:3::2 ── field-c3-e6 (routed)    2001:db8:ff03::2 ─┘
//! ```
//!
//! Every IPv4 uplink is masqueraded by iptables in its edge (client 3's twice: its own
//! router, then the carrier's); IPv6 uplinks are routed (client 2's is masqueraded by
//! ip6tables, a NAT66). The server reaches every edge on a link of its own and holds its
//! public addresses on its loopback.

use std::time::Duration;

use crate::topo::{run, sh, LabError};

/// Every namespace of the field lab starts with this.
pub const PREFIX: &str = "field-";
/// The server's namespace.
pub const NS_SERVER: &str = "field-srv";
/// The server's public IPv4 address.
pub const SERVER_V4: &str = "198.51.100.1";
/// The server's public IPv6 address.
pub const SERVER_V6: &str = "2001:db8:100::1";
/// Number of clients.
pub const CLIENTS: usize = 3;
/// The clients' names, client `k` (1-based) at `k - 1`.
pub const NAMES: [&str; CLIENTS] = ["home", "van", "cgn"];

/// Client `k`'s namespace (1-based).
pub fn ns_client(k: usize) -> String {
    format!("field-c{k}")
}

/// The namespace of client `k`'s IPv4 edge (the carrier's NAT for client 3).
pub fn ns_edge4(k: usize) -> String {
    format!("field-c{k}-e4")
}

/// The namespace of client `k`'s IPv6 edge.
pub fn ns_edge6(k: usize) -> String {
    format!("field-c{k}-e6")
}

/// Client 3's own router, the first of its two NATs.
pub const NS_CPE: &str = "field-c3-cpe";

/// The outside address of client `k`'s IPv4 edge; `moved`: after its change.
pub fn edge4_outside(k: usize, moved: bool) -> String {
    format!("10.250.{k}.{}", if moved { 3 } else { 2 })
}

/// Client `k`'s address on its IPv4 uplink.
pub fn client_v4(k: usize) -> String {
    format!("192.168.{k}.2")
}

/// Client `k`'s address on its IPv6 uplink.
pub fn client_v6(k: usize) -> String {
    format!("2001:db8:{k}::2")
}

/// Every namespace, in the order built.
pub fn namespaces() -> Vec<String> {
    let mut v = vec![NS_SERVER.to_string()];
    for k in 1..=CLIENTS {
        v.extend([ns_client(k), ns_edge4(k), ns_edge6(k)]);
    }
    v.push(NS_CPE.to_string());
    v
}

/// The field lab's namespaces that exist now.
pub fn existing_namespaces() -> Vec<String> {
    crate::topo::namespaces_starting_with(PREFIX)
}

/// Namespace `n` with its loopback up, forwarding on (IPv4 and IPv6), no
/// reverse-path filter.
fn add_namespace(n: &str) -> Result<(), LabError> {
    run(&["ip", "netns", "add", n])?;
    sh(n, "ip link set dev lo up")?;
    for s in [
        "net.ipv4.ip_forward=1",
        "net.ipv6.conf.all.forwarding=1",
        "net.ipv4.conf.all.rp_filter=0",
        "net.ipv4.conf.default.rp_filter=0",
    ] {
        sh(n, &format!("sysctl -qw {s}"))?;
    }
    Ok(())
}

/// A veth pair: `da` in `na` with address `aa`, `db` in `nb` with `ab` (prefix
/// lengths included), both up. IPv6 addresses skip duplicate address detection.
fn veth(na: &str, da: &str, aa: &str, nb: &str, db: &str, ab: &str) -> Result<(), LabError> {
    run(&[
        "ip", "link", "add", da, "netns", na, "type", "veth", "peer", "name", db, "netns", nb,
    ])?;
    for (n, d, a) in [(na, da, aa), (nb, db, ab)] {
        let nodad = if a.contains(':') { " nodad" } else { "" };
        sh(n, &format!("ip addr add {a} dev {d}{nodad}"))?;
        sh(n, &format!("ip link set dev {d} up"))?;
    }
    Ok(())
}

/// Build every namespace and link.
pub fn build() -> Result<(), LabError> {
    for n in namespaces() {
        add_namespace(&n)?;
    }
    sh(NS_SERVER, &format!("ip addr add {SERVER_V4}/32 dev lo"))?;
    sh(
        NS_SERVER,
        &format!("ip addr add {SERVER_V6}/128 dev lo nodad"),
    )?;
    for k in 1..=CLIENTS {
        build_v4(k)?;
        build_v6(k)?;
    }
    Ok(())
}

/// Client `k`'s IPv4 uplink through its NAT (two NATs for client 3).
fn build_v4(k: usize) -> Result<(), LabError> {
    let (c, e) = (ns_client(k), ns_edge4(k));
    let out = edge4_outside(k, false);
    let first = if k == 3 {
        NS_CPE.to_string()
    } else {
        e.clone()
    };
    veth(
        &c,
        "up4",
        &format!("{}/24", client_v4(k)),
        &first,
        "lan",
        &format!("192.168.{k}.1/24"),
    )?;
    sh(
        &c,
        &format!("ip route add default via 192.168.{k}.1 dev up4"),
    )?;
    if k == 3 {
        veth(NS_CPE, "wan", "100.64.3.2/24", &e, "lan", "100.64.3.1/24")?;
        sh(NS_CPE, "ip route add default via 100.64.3.1 dev wan")?;
        masquerade(NS_CPE, "iptables")?;
    }
    veth(
        &e,
        "wan",
        &format!("{out}/24"),
        NS_SERVER,
        &format!("e{k}v4"),
        &format!("10.250.{k}.1/24"),
    )?;
    sh(
        &e,
        &format!("ip route add default via 10.250.{k}.1 dev wan"),
    )?;
    masquerade(&e, "iptables")
}

/// Client `k`'s IPv6-only uplink, routed (client 2's behind a NAT66).
fn build_v6(k: usize) -> Result<(), LabError> {
    let (c, e) = (ns_client(k), ns_edge6(k));
    veth(
        &c,
        "up6",
        &format!("{}/64", client_v6(k)),
        &e,
        "lan",
        &format!("2001:db8:{k}::1/64"),
    )?;
    add_v6_default(k)?;
    veth(
        &e,
        "wan",
        &format!("2001:db8:ff0{k}::2/64"),
        NS_SERVER,
        &format!("e{k}v6"),
        &format!("2001:db8:ff0{k}::1/64"),
    )?;
    sh(
        &e,
        &format!("ip -6 route add default via 2001:db8:ff0{k}::1 dev wan"),
    )?;
    if k == 2 {
        masquerade(&e, "ip6tables")
    } else {
        sh(
            NS_SERVER,
            &format!("ip -6 route add 2001:db8:{k}::/64 via 2001:db8:ff0{k}::2"),
        )?;
        Ok(())
    }
}

fn add_v6_default(k: usize) -> Result<(), LabError> {
    sh(
        &ns_client(k),
        &format!("ip -6 route replace default via 2001:db8:{k}::1 dev up6"),
    )?;
    Ok(())
}

/// `tool` (iptables or ip6tables) masquerades what leaves `wan` in `ns`.
fn masquerade(ns: &str, tool: &str) -> Result<(), LabError> {
    sh(
        ns,
        &format!("{tool} -t nat -A POSTROUTING -o wan -j MASQUERADE"),
    )?;
    Ok(())
}

/// Client `k`'s IPv4 NAT changes its outside address (as a modem's public address
/// does): MASQUERADE forgets its mappings with the old address, and the client's next
/// datagrams leave from the new one, on new mappings.
pub fn move_nat(k: usize) -> Result<(), LabError> {
    let e = ns_edge4(k);
    sh(
        &e,
        &format!("ip addr del {}/24 dev wan", edge4_outside(k, false)),
    )?;
    sh(
        &e,
        &format!("ip addr add {}/24 dev wan", edge4_outside(k, true)),
    )?;
    sh(
        &e,
        &format!("ip route replace default via 10.250.{k}.1 dev wan"),
    )?;
    Ok(())
}

/// Client `k`'s IPv6 uplink goes away (its interface down: the kernel drops its
/// address and routes).
pub fn uplink_down(k: usize) -> Result<(), LabError> {
    sh(&ns_client(k), "ip link set dev up6 down")?;
    Ok(())
}

/// Client `k`'s IPv6 uplink comes back as an uplink does: the interface up, its address
/// and default route configured again (what SLAAC or DHCPv6 and the router's
/// advertisement would do).
pub fn uplink_up(k: usize) -> Result<(), LabError> {
    let c = ns_client(k);
    sh(&c, "ip link set dev up6 up")?;
    sh(
        &c,
        &format!("ip addr replace {}/64 dev up6 nodad", client_v6(k)),
    )?;
    add_v6_default(k)
}

/// Remove every namespace of the field lab (after stopping what runs in them); safe to
/// run at any time, also after a crash.
pub fn down() -> Result<Vec<String>, LabError> {
    let mut removed = Vec::new();
    for n in existing_namespaces() {
        for sig in [libc::SIGTERM, libc::SIGKILL] {
            let pids = run(&["ip", "netns", "pids", &n]).unwrap_or_default();
            let me = std::process::id() as i32;
            for p in pids
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
                .filter(|&p| p != me)
            {
                // SAFETY: sending a signal has no memory-safety preconditions.
                unsafe { libc::kill(p, sig) };
            }
            if !pids.trim().is_empty() {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        run(&["ip", "netns", "del", &n])?;
        removed.push(n);
    }
    Ok(removed)
}
