//! Reloading a running tunnel's configuration (SIGHUP, `systemctl reload braid@NAME`):
//! what changed between the file the tunnel runs with and the file now ([`plan`]),
//! which of the changes apply at once (channel weights, the log level, a server's
//! peers, a channel's addresses, a channel added or removed: `docs/tunnel.md`, "A
//! channel added or removed at run time") and which need a restart, and applying them
//! ([`apply`]).

use std::path::Path;

use braid_proto::{Mode, SchedulerKind};
use tracing::{error, info, warn};

use crate::config::{ChannelConfig, PeerConfig, SessionConfig, TunnelConfig};
use crate::session::StatsHandle;
use crate::FileConfig;

/// What a reload does.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// New channel weights, applied to the running session.
    pub weights: Option<Vec<u32>>,
    /// A new `tunnel.log_level` (`Some(None)`: the key was removed).
    pub log_level: Option<Option<String>>,
    /// A server's new `[[peer]]` list, applied to the running server (peers added,
    /// removed, their allowed IPs or names changed).
    pub peers: Option<Vec<PeerConfig>>,
    /// Channels (index, new settings) whose `local`, `remote` or `device` changed, on
    /// a tunnel that is no server: applied to the running session (a new socket for
    /// the channel, no new handshake).
    pub channels: Vec<(usize, ChannelConfig)>,
    /// A new channel list (a channel added or removed, or one's name, mtu or pace
    /// changed), on a tunnel that is no server: the session starts a new run over it,
    /// with a new handshake, in the same process (`Driver::change_channels`).
    pub channel_list: Option<Vec<ChannelConfig>>,
    /// The changed settings that only a restart applies, by name as in the file.
    pub restart: Vec<String>,
}

impl Plan {
    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        self.weights.is_none()
            && self.log_level.is_none()
            && self.peers.is_none()
            && self.channels.is_empty()
            && self.channel_list.is_none()
            && self.restart.is_empty()
    }
}

/// Compare the running configuration with the file's.
pub fn plan(old: &FileConfig, new: &FileConfig) -> Plan {
    let mut p = Plan::default();
    match (&old.tunnel, &new.tunnel) {
        (Some(a), Some(b)) => tunnel_changes(a, b, &mut p),
        (Some(_), None) => p.restart.push("[tunnel] (removed)".into()),
        _ => {}
    }
    // A server's channel sockets are shared by its peers: they need a restart.
    session_changes(&old.session, &new.session, old.peers.is_empty(), &mut p);
    match (old.peers.is_empty(), new.peers.is_empty()) {
        (true, true) => {}
        // A server stays a server: its peers change at once.
        (false, false) if old.peers != new.peers => p.peers = Some(new.peers.clone()),
        (false, false) => {}
        (true, false) => p
            .restart
            .push("[[peer]] sections (a point-to-point tunnel becomes a server)".into()),
        (false, true) => p
            .restart
            .push("[[peer]] sections (a server becomes a point-to-point tunnel)".into()),
    }
    p
}

/// Changes the log level on a reload (`None`: the default); says what it did, or why
/// not.
pub type SetLogLevel<'a> = &'a mut (dyn FnMut(Option<&str>) -> Result<String, String> + Send);

/// One reload: re-read `path`, apply what the running tunnel can take (channel
/// weights, a channel's local, remote and device, a new channel list (a new run of the
/// session), a server's peers, the log level
/// through `set_log_level`, which answers
/// what it did) and log what needs a restart. `running` keeps what is in force.
/// What it did, in words (as logged), or, if the file could not be read or a change
/// that applies at once did not, why (the rest is still applied).
pub async fn apply(
    path: &Path,
    running: &mut FileConfig,
    stats: &StatsHandle,
    set_log_level: Option<SetLogLevel<'_>>,
) -> Result<String, String> {
    info!("reload: reading {}", path.display());
    let new = match FileConfig::load(path) {
        Ok(c) => c,
        Err(e) => {
            let m = format!("{e}; the tunnel keeps running with the settings it has");
            error!("reload: {m}");
            return Err(m);
        }
    };
    let plan = plan(running, &new);
    if plan.is_empty() {
        info!("reload: nothing changed");
        return Ok("nothing changed".into());
    }
    let mut done = Vec::new();
    let mut failed = Vec::new();
    // Each change is logged once here, whichever it was.
    let mut note = |r: Result<String, String>| match r {
        Ok(m) => {
            info!("reload: {m}");
            done.push(m)
        }
        Err(m) => {
            warn!("reload: {m}");
            failed.push(m)
        }
    };
    if let Some(w) = plan.weights {
        note(apply_weights(w, running, stats));
    }
    if let Some(peers) = plan.peers {
        note(apply_peers(peers, running, stats).await);
    }
    for (i, c) in plan.channels {
        note(apply_channel(i, c, running, stats).await);
    }
    if let Some(list) = plan.channel_list {
        note(apply_channel_list(list, running, stats).await);
    }
    if let Some(level) = plan.log_level {
        apply_log_level(level, running, set_log_level);
        done.push("log level changed".into());
    }
    if !plan.restart.is_empty() {
        let m = format!(
            "{} changed; the running tunnel keeps the old value until it restarts (systemctl restart braid@NAME)",
            plan.restart.join(", ")
        );
        warn!("reload: {m}");
        done.push(m);
    }
    if failed.is_empty() {
        Ok(done.join("; "))
    } else {
        Err(failed.join("; "))
    }
}

/// New channel weights into the running session (and `running`, once taken).
fn apply_weights(
    w: Vec<u32>,
    running: &mut FileConfig,
    stats: &StatsHandle,
) -> Result<String, String> {
    let old: Vec<u32> = running.session.channels.iter().map(|c| c.weight).collect();
    match stats.set_weights(w.clone()) {
        Ok(true) => {
            for (c, w) in running.session.channels.iter_mut().zip(&w) {
                c.weight = *w;
            }
            Ok(format!("channel weights {old:?} -> {w:?}"))
        }
        Ok(false) => {
            Err("the session is busy; channel weights not changed, reload again".to_string())
        }
        Err(e) => Err(format!("channel weights not changed: {e}")),
    }
}

/// A server's new peer list into the running server (and `running`, once taken).
async fn apply_peers(
    peers: Vec<PeerConfig>,
    running: &mut FileConfig,
    stats: &StatsHandle,
) -> Result<String, String> {
    match stats.set_peers(peers.clone()).await {
        Ok(what) => {
            running.peers = peers;
            Ok(what)
        }
        Err(e) => Err(format!("peers not changed: {e}")),
    }
}

/// Channel `i`'s new addresses or device into the running session (and `running`,
/// once taken).
async fn apply_channel(
    i: usize,
    c: ChannelConfig,
    running: &mut FileConfig,
    stats: &StatsHandle,
) -> Result<String, String> {
    let name = c.name.clone();
    match stats.set_channel(i, c.clone()).await {
        Ok(m) => {
            if let Some(x) = running.session.channels.get_mut(i) {
                x.local = c.local;
                x.remote = c.remote;
                x.device = c.device;
            }
            Ok(format!("channel {i} ({name}): {m}"))
        }
        Err(e) => Err(format!("channel {i} ({name}) not changed: {e}")),
    }
}

/// A new channel list into the running session (and `running`, once taken): a new
/// run of the session over it.
async fn apply_channel_list(
    list: Vec<ChannelConfig>,
    running: &mut FileConfig,
    stats: &StatsHandle,
) -> Result<String, String> {
    let mut cfg = running.session.clone();
    cfg.channels = list;
    match stats.set_channels(cfg.clone()).await {
        Ok(m) => {
            running.session.channels = cfg.channels;
            Ok(m)
        }
        Err(e) => Err(format!(
            "the channel list was not changed: {e}; the running channels are kept"
        )),
    }
}

/// The new log level, through the logger braid set up (if it did).
fn apply_log_level(
    level: Option<String>,
    running: &mut FileConfig,
    set_log_level: Option<SetLogLevel<'_>>,
) {
    match set_log_level {
        Some(set) => {
            // Before and after the switch: one of the two shows at either level.
            info!(
                "reload: changing the log level to {}",
                level.as_deref().unwrap_or("info (the default)")
            );
            match set(level.as_deref()) {
                Ok(m) => info!("reload: {m}"),
                Err(m) => warn!("reload: {m}"),
            }
        }
        None => {
            warn!("reload: tunnel.log_level not applied: the logger was not set up by braid")
        }
    }
    if let Some(t) = &mut running.tunnel {
        t.log_level = level;
    }
}

fn tunnel_changes(a: &TunnelConfig, b: &TunnelConfig, p: &mut Plan) {
    if a.log_level != b.log_level {
        p.log_level = Some(b.log_level.clone());
    }
    let mut differ = |name: &str, changed: bool| {
        if changed {
            p.restart.push(format!("tunnel.{name}"));
        }
    };
    differ("name", a.name != b.name);
    differ("address", a.address != b.address);
    differ("mtu", a.mtu != b.mtu);
    differ("control", a.control != b.control);
    differ("metrics", a.metrics != b.metrics);
    differ("log_interval", a.log_interval != b.log_interval);
    // A key added to [tunnel] later and not named above still shows.
    let mut rest = b.clone();
    rest.log_level = a.log_level.clone();
    if p.restart.is_empty() && rest != *a {
        p.restart.push("[tunnel] settings".into());
    }
}

fn session_changes(a: &SessionConfig, b: &SessionConfig, movable: bool, p: &mut Plan) {
    let before = p.restart.len();
    channel_changes(a, b, movable, p);
    setting_changes(a, b, p);
    let same_channels = a.channels.len() == b.channels.len() && p.channel_list.is_none();
    // A setting added to the session later and not named above still shows.
    let mut rest = b.clone();
    if p.channel_list.is_some() {
        // The new list is applied whole (weights included).
        rest.channels.clone_from(&a.channels);
    } else if same_channels {
        for (r, x) in rest.channels.iter_mut().zip(&a.channels) {
            r.weight = x.weight;
            if movable {
                r.local = x.local;
                r.remote = x.remote;
                r.device.clone_from(&x.device);
            }
        }
    }
    if p.restart.len() == before && rest != *a {
        p.restart.push("[session] settings".into());
    }
    let old_w: Vec<u32> = a.channels.iter().map(|c| c.weight).collect();
    let new_w: Vec<u32> = b.channels.iter().map(|c| c.weight).collect();
    if same_channels && old_w != new_w {
        // The running session takes new weights only with the srr scheduler outside
        // trr mode (as adaptive weights); otherwise they wait for a restart.
        if a.core.scheduler == SchedulerKind::Srr && a.core.mode != Mode::Trr {
            p.weights = Some(new_w);
        } else {
            p.restart.push("channel weights".into());
        }
    }
}

/// The channels' count, name, MTU and pace (where `movable`, a tunnel's own sockets:
/// a new channel list, applied by a new run of the session, if the bond's largest
/// datagram stays; else a restart), and each channel's addresses and device (applied
/// at once where `movable`; else a restart). Weights are [`session_changes`]' own,
/// but for a new list, which carries them.
fn channel_changes(a: &SessionConfig, b: &SessionConfig, movable: bool, p: &mut Plan) {
    let listed = |x: &ChannelConfig, y: &ChannelConfig| {
        x.name != y.name || x.mtu != y.mtu || x.pace_bps != y.pace_bps || x.pace_auto != y.pace_auto
    };
    let relisted = a.channels.len() != b.channels.len()
        || a.channels
            .iter()
            .zip(&b.channels)
            .any(|(x, y)| listed(x, y));
    if movable && relisted {
        if a.max_inner() == b.max_inner() {
            p.channel_list = Some(b.channels.clone());
        } else {
            p.restart.push(format!(
                "the bond's largest datagram ({} -> {} bytes, from the channels' mtu and address families; both ends' runs must share it)",
                a.max_inner(),
                b.max_inner()
            ));
        }
        return;
    }
    if a.channels.len() != b.channels.len() {
        p.restart.push(format!(
            "the number of channels ({} -> {})",
            a.channels.len(),
            b.channels.len()
        ));
        return;
    }
    for (i, (x, y)) in a.channels.iter().zip(&b.channels).enumerate() {
        let mut differ = |name: &str, changed: bool| {
            if changed {
                p.restart.push(format!("channel[{i}].{name}"));
            }
        };
        differ("name", x.name != y.name);
        let moved = x.local != y.local || x.remote != y.remote || x.device != y.device;
        if !movable {
            differ("local", x.local != y.local);
            differ("remote", x.remote != y.remote);
            differ("device", x.device != y.device);
        }
        differ("mtu", x.mtu != y.mtu);
        differ(
            "pace",
            x.pace_bps != y.pace_bps || x.pace_auto != y.pace_auto,
        );
        if movable && moved {
            p.channels.push((i, y.clone()));
        }
    }
}

/// Each `[session]` setting that changed (all need a restart).
fn setting_changes(a: &SessionConfig, b: &SessionConfig, p: &mut Plan) {
    let mut differ = |name: &str, changed: bool| {
        if changed {
            p.restart.push(format!("session.{name}"));
        }
    };
    differ("mode", a.core.mode != b.core.mode);
    differ("scheduler", a.core.scheduler != b.core.scheduler);
    differ("key (key_file)", a.core.key != b.core.key);
    differ("security", a.core.security != b.core.security);
    differ("private_key_file", a.core.private_key != b.core.private_key);
    differ(
        "peer_public_key",
        a.core.peer_public_key != b.core.peer_public_key,
    );
    differ("rekey_after", a.core.rekey_after != b.core.rekey_after);
    differ("marker settings", a.core.markers != b.core.markers);
    differ(
        "trigger_every",
        a.core.trigger_every != b.core.trigger_every,
    );
    differ("receiver settings", a.core.receiver != b.core.receiver);
    differ("heartbeat", a.heartbeat() != b.heartbeat());
    differ("dead_after", a.dead_after() != b.dead_after());
    differ(
        "idle_heartbeat",
        a.core.idle_heartbeat != b.core.idle_heartbeat,
    );
    differ("idle_after", a.core.idle_after != b.core.idle_after);
    differ("rejoin_after", a.core.rejoin_after != b.core.rejoin_after);
    differ(
        "queue_packets",
        a.core.queue_packets != b.core.queue_packets,
    );
    differ("socket_buffer", a.socket_buffer != b.socket_buffer);
    differ("adaptive", a.core.adaptive != b.core.adaptive);
    differ("aqm", a.core.aqm != b.core.aqm);
    differ("arq", a.core.arq != b.core.arq);
    differ("credits", a.core.credits != b.core.credits);
    differ("demote", a.core.demote != b.core.demote);
    differ("return_path", a.core.return_path != b.core.return_path);
    differ("pace_burst", a.pace_burst != b.pace_burst);
    differ("pace_codel", a.pace_codel != b.pace_codel);
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[tunnel]
name = "braid0"
address = "10.77.0.1/24"

[session]
key = "0X9vg6gGoIsuUnuVh9Q41C0d5zENqadrCWYNpq6589U="

[[channel]]
local = "127.0.0.1:7001"
remote = "127.0.0.1:7101"
weight = 2

[[channel]]
local = "127.0.0.1:7002"
remote = "127.0.0.1:7102"
weight = 1
"#;

    fn cfg(text: &str) -> FileConfig {
        FileConfig::parse("t.toml", text, None).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn no_change_is_an_empty_plan() {
        assert!(plan(&cfg(BASE), &cfg(BASE)).is_empty());
    }

    #[test]
    fn weights_and_log_level_apply_at_once() {
        let new = BASE
            .replace("weight = 2", "weight = 5")
            .replace("[session]", "log_level = \"debug\"\n\n[session]");
        let p = plan(&cfg(BASE), &cfg(&new));
        assert_eq!(p.weights, Some(vec![5, 1]));
        assert_eq!(p.log_level, Some(Some("debug".to_string())));
        assert!(p.restart.is_empty(), "{:?}", p.restart);
    }

    #[test]
    fn other_changes_are_named_as_needing_a_restart() {
        let new = BASE
            .replace("127.0.0.1:7102", "127.0.0.1:7202")
            .replace("10.77.0.1/24", "10.78.0.1/24")
            .replace(
                "[session]\n",
                "[session]\nheartbeat = \"20ms\"\ndead_after = \"100ms\"\n",
            );
        let p = plan(&cfg(BASE), &cfg(&new));
        assert_eq!(
            p.restart,
            vec!["tunnel.address", "session.heartbeat", "session.dead_after"]
        );
        assert_eq!(p.weights, None);
        // The channel's new remote applies at once.
        assert_eq!(p.channels.len(), 1);
        assert_eq!(p.channels[0].0, 1);
    }

    #[test]
    fn a_channels_addresses_and_device_apply_at_once_and_its_mtu_waits() {
        let new = BASE.replace("127.0.0.1:7001", "127.0.0.2:7001").replace(
            "remote = \"127.0.0.1:7102\"",
            "remote = \"127.0.0.1:7102\"\ndevice = \"wwan0\"",
        );
        let p = plan(&cfg(BASE), &cfg(&new));
        assert!(p.restart.is_empty(), "{:?}", p.restart);
        let moved: Vec<usize> = p.channels.iter().map(|(i, _)| *i).collect();
        assert_eq!(moved, vec![0, 1]);
        assert_eq!(p.channels[0].1.local.to_string(), "127.0.0.2:7001");
        assert_eq!(p.channels[1].1.device.as_deref(), Some("wwan0"));
        // A smaller mtu lowers the bond's largest datagram, which both ends' runs
        // share: a restart.
        let p = plan(
            &cfg(BASE),
            &cfg(&BASE.replace("weight = 1", "weight = 1\nmtu = 1400")),
        );
        assert_eq!(p.restart.len(), 1, "{:?}", p.restart);
        assert!(
            p.restart[0].starts_with("the bond's largest datagram"),
            "{:?}",
            p.restart
        );
        assert!(p.channels.is_empty() && p.channel_list.is_none());
    }

    #[test]
    fn weights_wait_for_a_restart_when_the_running_scheduler_cannot_take_them() {
        let grr = |t: &str| t.replace("[session]\n", "[session]\nscheduler = \"grr\"\n");
        let new = grr(&BASE.replace("weight = 2", "weight = 5"));
        let p = plan(&cfg(&grr(BASE)), &cfg(&new));
        assert_eq!(p.weights, None);
        assert_eq!(p.restart, vec!["channel weights"]);
        // The running session (srr) takes them; the scheduler waits for the restart.
        let p = plan(&cfg(BASE), &cfg(&new));
        assert_eq!(p.weights, Some(vec![5, 1]));
        assert_eq!(p.restart, vec!["session.scheduler"]);
    }

    #[test]
    fn a_servers_peers_change_at_once_and_a_role_change_needs_a_restart() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("s.key");
        std::fs::write(&key, crate::keys::encode(&crate::keys::generate().unwrap())).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let public = |n: u8| crate::keys::encode(&crate::keys::public_key(&[n; 32]));
        let peer = |n: u8, ips: &str| {
            format!(
                "\n[[peer]]\nname = \"p{n}\"\npublic_key = \"{}\"\nallowed_ips = [{ips}]\n",
                public(n)
            )
        };
        let server = |peers: &str| {
            let text = format!(
                "[tunnel]\nname = \"srv\"\n\n[session]\nprivate_key_file = \"s.key\"\n\n[[channel]]\nlocal = \"0.0.0.0:7100\"\n{peers}"
            );
            FileConfig::parse("s.toml", &text, Some(dir.path())).unwrap_or_else(|e| panic!("{e}"))
        };
        let two = server(&(peer(1, "\"10.1.0.0/16\"") + &peer(2, "\"10.2.0.0/16\"")));
        assert!(plan(&two, &two).is_empty());
        let one = server(&peer(1, "\"10.1.0.0/16\""));
        let p = plan(&two, &one);
        assert_eq!(p.peers.as_ref().map(|v| v.len()), Some(1));
        assert!(p.restart.is_empty(), "{:?}", p.restart);
        let p = plan(&one, &two);
        assert_eq!(p.peers, Some(two.peers.clone()));
        // New allowed IPs for a peer: applied too.
        let moved =
            server(&(peer(1, "\"10.1.0.0/16\", \"10.3.0.0/16\"") + &peer(2, "\"10.2.0.0/16\"")));
        assert_eq!(plan(&two, &moved).peers, Some(moved.peers.clone()));
        // A point-to-point tunnel does not become a server without a restart.
        let p = plan(&cfg(BASE), &two);
        assert_eq!(p.peers, None);
        assert!(
            p.restart.iter().any(|r| r.contains("[[peer]]")),
            "{:?}",
            p.restart
        );
    }

    #[test]
    fn a_channel_added_removed_or_renamed_is_a_new_channel_list() {
        let three = format!(
            "{BASE}\n[[channel]]\nlocal = \"127.0.0.1:7003\"\nremote = \"127.0.0.1:7103\"\nweight = 3\n"
        );
        let p = plan(&cfg(BASE), &cfg(&three));
        assert!(p.restart.is_empty(), "{:?}", p.restart);
        assert_eq!(p.weights, None, "the list carries them");
        assert!(p.channels.is_empty());
        let list = p.channel_list.expect("a new channel list");
        assert_eq!(list.len(), 3);
        assert_eq!(list[2].local.to_string(), "127.0.0.1:7003");
        assert_eq!(list[2].weight, 3);
        // Removed again; and a channel renamed, with a weight changed alongside.
        let p = plan(&cfg(&three), &cfg(BASE));
        assert_eq!(p.channel_list.map(|l| l.len()), Some(2));
        assert!(p.restart.is_empty(), "{:?}", p.restart);
        let renamed = BASE
            .replace("weight = 2", "weight = 2\nname = \"lte\"")
            .replace("weight = 1", "weight = 4");
        let p = plan(&cfg(BASE), &cfg(&renamed));
        assert!(p.restart.is_empty() && p.weights.is_none(), "{p:?}");
        let list = p.channel_list.expect("a new channel list");
        assert_eq!((list[0].name.as_str(), list[1].weight), ("lte", 4));
        // Other changes in the same reload still need their restart.
        let p = plan(
            &cfg(BASE),
            &cfg(&three.replace("[session]\n", "[session]\nheartbeat = \"20ms\"\n")),
        );
        assert!(p.channel_list.is_some());
        assert_eq!(p.restart, vec!["session.heartbeat"]);
    }

    #[test]
    fn a_servers_channel_count_still_needs_a_restart() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("s.key");
        std::fs::write(&key, crate::keys::encode(&crate::keys::generate().unwrap())).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let peer = crate::keys::encode(&crate::keys::public_key(&[1; 32]));
        let server = |channels: &str| {
            let text = format!(
                "[tunnel]\nname = \"srv\"\n\n[session]\nprivate_key_file = \"s.key\"\n{channels}\n[[peer]]\nname = \"p\"\npublic_key = \"{peer}\"\nallowed_ips = [\"10.1.0.0/16\"]\n"
            );
            FileConfig::parse("s.toml", &text, Some(dir.path())).unwrap_or_else(|e| panic!("{e}"))
        };
        let one = "\n[[channel]]\nlocal = \"0.0.0.0:7100\"\n";
        let two = format!("{one}\n[[channel]]\nlocal = \"0.0.0.0:7101\"\n");
        let p = plan(&server(one), &server(&two));
        assert!(p.channel_list.is_none());
        assert_eq!(p.restart, vec!["the number of channels (1 -> 2)"]);
    }
}
