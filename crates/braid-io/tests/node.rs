//! Three `braid node`s on loopback (seed 003): they measure each other, exchange
//! authenticated UPDATEs until every node's table holds all six hops, choose paths,
//! ignore a fourth node that is not a member, and route around a node that stops.

use std::time::Duration as StdDuration;

use braid_io::node::{Node, NodeConfig, NodeHandle, Peer};
use braid_proto::overlay::{Metric, Path};
use braid_proto::Duration;
use tokio::net::UdpSocket;
use tokio::sync::oneshot;

/// Node `id` of the nodes at `sockets`, whose private keys are `keys`.
fn config(
    id: u16,
    sockets: &[std::net::SocketAddr],
    keys: &[[u8; 32]],
    route_to: Vec<u16>,
) -> NodeConfig {
    NodeConfig {
        id,
        listen: sockets[id as usize],
        peers: (0..sockets.len() as u16)
            .filter(|&p| p != id)
            .map(|p| Peer {
                id: p,
                addr: sockets[p as usize],
                public_key: braid_io::keys::public_key(&keys[p as usize]),
            })
            .collect(),
        private_key: keys[id as usize],
        ping: Duration::from_millis(50),
        slot: Duration::from_millis(40),
        train: 8,
        train_bytes: 1000,
        update: Duration::from_millis(50),
        dead_after: Duration::from_millis(400),
        eval: Duration::from_millis(25),
        routes: route_to,
        metric: Metric::Throughput,
        max_paths: 2,
        threshold: 0.5,
        consecutive: 3,
        flow: None,
    }
}

async fn wait_for(what: &str, secs: u64, handles: &[NodeHandle], mut ok: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + StdDuration::from_secs(secs);
    while !ok() {
        if tokio::time::Instant::now() >= deadline {
            for (i, h) in handles.iter().enumerate() {
                let s = h.snapshot();
                eprintln!("node {i}: {:?}", s.stats);
                for a in 0..s.table.nodes() as u16 {
                    for b in 0..s.table.nodes() as u16 {
                        eprintln!("  {a}->{b}: {:?}", s.table.get(a, b));
                    }
                }
            }
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(StdDuration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_measure_share_and_route() {
    let keys: Vec<[u8; 32]> = (0..4)
        .map(|_| braid_io::keys::generate().unwrap())
        .collect();
    let mut socks = Vec::new();
    for _ in 0..4 {
        socks.push(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    }
    let addrs: Vec<_> = socks.iter().map(|s| s.local_addr().unwrap()).collect();
    let three = &addrs[..3];
    let mut handles: Vec<NodeHandle> = Vec::new();
    let mut stops = Vec::new();
    let mut tasks = Vec::new();
    let mut socks = socks.into_iter();
    for id in 0..3u16 {
        let routes = if id == 0 { vec![2] } else { Vec::new() };
        let node =
            Node::with_socket(config(id, three, &keys, routes), socks.next().unwrap()).unwrap();
        handles.push(node.handle());
        let (tx, rx) = oneshot::channel::<()>();
        stops.push(tx);
        tasks.push(tokio::spawn(node.run(async move {
            let _ = rx.await;
        })));
    }
    // A fourth node, which the three do not list as a member, says HELLO to them.
    let intruder =
        Node::with_socket(config(3, &addrs, &keys, Vec::new()), socks.next().unwrap()).unwrap();
    let (itx, irx) = oneshot::channel::<()>();
    let itask = tokio::spawn(intruder.run(async move {
        let _ = irx.await;
    }));

    // Every node learns all six hops: three of its own... two own, four by UPDATE.
    wait_for("six hops in every table", 10, &handles, || {
        handles.iter().all(|h| {
            let t = h.snapshot().table;
            (0..3u16).all(|a| (0..3u16).all(|b| a == b || t.get(a, b).is_some()))
        })
    })
    .await;
    // Node 0 routes to 2 over the direct path and through 1.
    wait_for("node 0's paths to 2", 5, &handles, || {
        handles[0]
            .snapshot()
            .routes
            .iter()
            .any(|(d, c)| *d == 2 && c.len() == 2)
    })
    .await;
    let s0 = handles[0].snapshot();
    let (_, paths) = &s0.routes[0];
    let mut got: Vec<Path> = paths.iter().map(|c| c.path).collect();
    got.sort();
    assert_eq!(got, [Path::direct(0, 2), Path::via(0, 1, 2)]);
    for (i, h) in handles.iter().enumerate() {
        let s = h.snapshot();
        assert!(
            s.stats.updates > 0 && s.stats.probes > 0,
            "node {i}: {:?}",
            s.stats
        );
        assert!(
            s.stats.auth_failures > 0,
            "node {i} never saw the intruder: {:?}",
            s.stats
        );
        // Nothing from the intruder got in (the table is sized by the largest id known).
        assert!(s.table.nodes() == 3 && s.table.get(0, 3).is_none());
        for a in 0..3u16 {
            for b in 0..3u16 {
                if let Some(m) = s.table.get(a, b) {
                    assert!(m.throughput_bps > 0.0 && m.rtt < Duration::from_secs(1));
                }
            }
        }
    }
    let _ = itx.send(());
    let _ = itask.await;

    // Node 1 stops: node 0 drops the relay path within dead_after plus an evaluation.
    let stop1 = stops.remove(1);
    let _ = stop1.send(());
    let stopped = std::time::Instant::now();
    wait_for("the route around the stopped relay", 5, &handles, || {
        handles[0]
            .snapshot()
            .routes
            .iter()
            .any(|(d, c)| *d == 2 && c.iter().all(|c| c.path.relay != Some(1)))
    })
    .await;
    let took = stopped.elapsed();
    assert!(
        took < StdDuration::from_secs(1),
        "routed around after {took:?}"
    );
    let last = handles[0].snapshot().changes.last().cloned().unwrap();
    assert!(last.reason.starts_with("dead"), "{last:?}");
    for s in stops {
        let _ = s.send(());
    }
    for t in tasks {
        let _ = t.await;
    }
}

#[test]
fn config_files_are_checked() {
    use braid_io::keys;
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("braid-node-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let private = keys::generate().unwrap();
    let kf = dir.join("node0.key");
    std::fs::write(&kf, keys::encode(&private) + "\n").unwrap();
    std::fs::set_permissions(&kf, std::fs::Permissions::from_mode(0o600)).unwrap();
    let own = keys::encode(&keys::public_key(&private));
    let p1 = keys::encode(&keys::public_key(&keys::generate().unwrap()));
    let p2 = keys::encode(&keys::public_key(&keys::generate().unwrap()));
    let good = format!(
        "id = 0\nlisten = \"127.0.0.1:7400\"\nprivate_key_file = \"node0.key\"\n\
         [[peer]]\nid = 1\naddr = \"127.0.0.1:7401\"\npublic_key = \"{p1}\"\n\
         [[peer]]\nid = 2\naddr = \"127.0.0.1:7402\"\npublic_key = \"{p2}\"\n\
         [probe]\nping_ms = 100\n[route]\nto = [2]\nmax_paths = 2\n"
    );
    let c = NodeConfig::parse(&good, &dir).unwrap();
    assert_eq!(
        (c.id, c.peers.len(), c.routes.clone(), c.max_paths),
        (0, 2, vec![2], 2)
    );
    // The flow's session settings: the tunnel's schema, keys and defaults.
    let flow =
        format!("{good}[flow]\nto = 2\n[flow.session]\nheartbeat = \"20ms\"\nmode = \"seq\"\n");
    let f = NodeConfig::parse(&flow, &dir).unwrap().flow.unwrap();
    assert_eq!(f.session.heartbeat.to_string(), "20ms");
    assert_eq!(f.session.mode, braid_proto::Mode::Seq);
    assert_eq!(f.session.arq, None, "unset: the schema's default");
    assert_eq!(c.ping, Duration::from_millis(100));
    assert_eq!(c.private_key, private);
    assert_eq!(c.peers[0].public_key, keys::decode(&p1).unwrap());
    let shared = format!("key = \"{}\"\n", keys::encode(&keys::generate().unwrap()));
    for (bad, needle) in [
        (good.replace("id = 0\n", "id = 1\n"), "peer[0]"),
        (good.replace("to = [2]", "to = [7]"), "route.to"),
        (good.replace("ping_ms", "pingms"), "probe.pingms"),
        (good.replace("max_paths = 2", "max_paths = 4"), "max_paths"),
        (
            format!("{good}[flow]\n[flow.session]\nhartbeat = \"20ms\"\n"),
            "flow.session.hartbeat",
        ),
        (
            format!("{good}[flow]\n[flow.session]\nkey_file = \"k\"\n"),
            "nodes' own keys",
        ),
        (
            format!("{good}[flow]\n[flow.session]\ndead_after = \"60ms\"\n"),
            "flow.session.dead_after",
        ),
        (good.replace("listen = \"127.0.0.1:7400\"\n", ""), "listen"),
        // The old shared key: refused, saying what to do instead.
        (
            good.replace("private_key_file = \"node0.key\"\n", &shared),
            "its own key pair",
        ),
        (
            good.replace("private_key_file = \"node0.key\"\n", ""),
            "`private_key_file` is required",
        ),
        (good.replace("node0.key", "missing.key"), "cannot read"),
        (
            good.replace(&format!("public_key = \"{p2}\"\n"), ""),
            "peer[1]: `public_key` is required",
        ),
        (good.replace(&p2, "secret"), "peer[1].public_key"),
        (good.replace(&p2, &own), "this node's own"),
        (good.replace(&p2, &p1), "same public key"),
        // A low-order point: no key pair has it.
        (
            good.replace(&p2, &keys::encode(&[0; 32])),
            "peer[1].public_key",
        ),
    ] {
        let e = NodeConfig::parse(&bad, &dir).unwrap_err();
        assert!(e.contains(needle), "{e:?} should mention {needle}");
    }
    // A private key others can read is refused, as the tunnel refuses it.
    std::fs::set_permissions(&kf, std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = NodeConfig::parse(&good, &dir).unwrap_err();
    assert!(e.contains("chmod 600"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
