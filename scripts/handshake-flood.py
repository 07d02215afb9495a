#!/usr/bin/env python3
"""Handshake floods and replays against an established `braid tunnel` (issue 27).

Two network namespaces joined by two veth pairs (two channels), a `braid tunnel` in each,
then, from the sender's namespace with a raw socket (spoofing the sender's own channel
address, as anyone on the path could):

flood mode (default): one TCP flow (iperf3) through the tunnel for SECONDS, without a
flood once, then --runs times each (alternating, medians reported):
  init      full-speed random initiations (0xBA, the right version, key kind and length,
            random bytes after) on channel 0;
  junk      junk sealed datagrams (0xB8, random index, counter, body, tag), the same
            size, on channel 0 at the rate the initiation flood reached (--no-match:
            full speed): the reference, what any forged datagram costs;
  init-mac1 (with --mac1) the same, but with a valid mac1: the tunnels then use static
            keys, and mac1 is keyed by the receiver's public key, which the flooder knows
            (public keys are not secret); they pass the cheap check, so the responder
            goes under load and answers with cookie replies;
  and prints each flow's throughput, the rate the flooder reached (it takes a core of
  its own: on a 2-core machine the tunnels, iperf3 and the kernel share the other), the
  CPU each tunnel used and how busy the whole machine was during the flow, the 1-minute
  load, and the median of the runs' init / junk (goal >= 0.9).

replay mode (--replay): rekey_after = 20s; genuine initiations of the sender are recorded
  on its veths from the start and replayed (each to the channel it was seen on, spoofed
  from its source) at --rate per second (default 500) for 70 s while the sender pings the
  receiver's tunnel address every 100 ms: prints the pings lost (goal 0), the replays
  sent and the handshakes completed.

Everything is bounded in time and count, stays inside the namespaces it creates (named
PREFIX-a/PREFIX-b, PREFIX from --prefix) and is removed on every exit. Needs root, `ip`,
iperf3 (flood mode) and ping (replay mode).

  sudo scripts/handshake-flood.py [--seconds 8] [--runs 3] [--static-keys] [--mac1]
                                 [--no-match] [--json] [--braid PATH]
  sudo scripts/handshake-flood.py --replay [--rate 500] [--ping-seconds 70] [--json]
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A pre-shared key (base64 of 32 bytes); the flood with --mac1 derives mac1's key from it.
KEY_B64 = "1TmZIScY3/OtqxxyGcnv8N4FGBZHviUHPzrxwu6fHx4="
INIT_LEN = 144  # an initiation with a pre-shared key only (docs/wire.md)
INIT_LEN_STATIC = 192  # with static keys
HS_VERSION = 3

FLOODER = r'''
import os, socket, struct, sys, time, hashlib
kind, src, sport, dst, dport, secs, maxn, mac1key, length, keykind, cap, vers = sys.argv[1:13]
cap = float(cap); vers = int(vers)
secs = float(secs); maxn = int(maxn); sport = int(sport); dport = int(dport)
length = int(length); keykind = int(keykind)
def ip_udp(payload):
    udp = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
    h = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0,
                    socket.inet_aton(src), socket.inet_aton(dst))
    return h + udp
pool = []
for i in range(4096):
    r = os.urandom(length)
    if kind == "junk":
        p = b"\xb8\x01\x00\x00" + r[4:]
    else:
        p = bytes([0xBA, vers, keykind, 0]) + r[4:]
        if kind == "init-mac1":
            k = bytes.fromhex(mac1key)
            m = hashlib.blake2s(p[:-32], key=k, digest_size=16).digest()
            p = p[:-32] + m + bytes(16)
    pool.append(ip_udp(p))
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
addr = (dst, 0)
n = 0
t0 = time.time(); end = t0 + secs
send = s.sendto
# In slices of 256, so that a capped flood is paced finely, not in bursts of 4096.
while n < maxn:
    for k in range(0, len(pool), 256):
        for p in pool[k:k + 256]:
            try:
                send(p, addr)
            except OSError:
                pass
        n += 256
        now = time.time()
        if now >= end:
            break
        if cap > 0 and n > (now - t0) * cap:
            time.sleep(min(n / cap - (now - t0), end - now))
    if now >= end:
        break
print(n, time.time() - t0, flush=True)
'''

REPLAYER = r'''
import signal, socket, struct, sys, time, threading
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: stop.set())
ifaces = sys.argv[1].split(","); rate = float(sys.argv[2]); secs = float(sys.argv[3])
maxn = int(sys.argv[4]); keep = int(sys.argv[5])
recorded = []   # (src, sport, dst, dport, payload)
seen = set()
lock = threading.Lock()
def capture(iface):
    # ETH_P_ALL: a socket for one protocol is not shown the packets the host sends,
    # and the sender's own initiations are what we want.
    s = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(3))
    s.bind((iface, 0)); s.settimeout(0.2)
    while True:
        try:
            p, addr = s.recvfrom(65536)
        except socket.timeout:
            continue
        if addr[1] != 0x0800 or len(p) < 29 or p[9] != 17:
            continue
        hl = (p[0] & 15) * 4
        u = p[hl:hl + 8]; payload = p[hl + 8:]
        if not payload or payload[0] != 0xBA:
            continue
        sport, dport = struct.unpack("!HH", u[:4])
        key = payload
        with lock:
            if key in seen or len(recorded) >= keep:
                continue
            seen.add(key)
            recorded.append((socket.inet_ntoa(p[12:16]), sport, socket.inet_ntoa(p[16:20]), dport, payload))
for i in ifaces:
    threading.Thread(target=capture, args=(i,), daemon=True).start()
print("ready", flush=True)
def ip_udp(src, sport, dst, dport, payload):
    udp = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
    h = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0,
                    socket.inet_aton(src), socket.inet_aton(dst))
    return h + udp
r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
n = 0; t0 = time.time(); end = t0 + secs; i = 0
while time.time() < end and n < maxn and not stop.is_set():
    with lock:
        recs = list(recorded)
    if not recs:
        time.sleep(0.01); continue
    due = int((time.time() - t0) * rate)
    while n < due and n < maxn:
        src, sport, dst, dport, payload = recs[i % len(recs)]; i += 1
        try:
            r.sendto(ip_udp(src, sport, dst, dport, payload), (dst, 0))
        except OSError:
            pass
        n += 1
    time.sleep(0.002)
with lock:
    print(n, len(recorded), flush=True)
'''


def sh(*args, check=True, **kw):
    return subprocess.run(list(args), check=check, capture_output=True, text=True, **kw)


class Lab:
    def __init__(self, prefix, braid, rekey_after=None, static=False):
        self.static = static
        self.prefix = prefix
        self.braid = braid
        self.na, self.nb = f"{prefix}-a", f"{prefix}-b"
        self.tmp = tempfile.mkdtemp(prefix=f"{prefix}-")
        self.procs = []
        self.tunnels = []
        self.rekey_after = rekey_after
        self.veths = [(f"{prefix}a{c}", f"{prefix}b{c}") for c in range(2)]

    def __enter__(self):
        for n in (self.na, self.nb):
            sh("ip", "netns", "del", n, check=False)
            sh("ip", "netns", "add", n)
            sh("ip", "-n", n, "link", "set", "dev", "lo", "up")
        for c, (va, vb) in enumerate(self.veths):
            sh("ip", "link", "add", va, "netns", self.na, "type", "veth", "peer", "name", vb,
               "netns", self.nb)
            sh("ip", "-n", self.na, "addr", "add", f"10.211.{c}.1/24", "dev", va)
            sh("ip", "-n", self.nb, "addr", "add", f"10.211.{c}.2/24", "dev", vb)
            sh("ip", "-n", self.na, "link", "set", "dev", va, "up")
            sh("ip", "-n", self.nb, "link", "set", "dev", vb, "up")
        return self

    def __exit__(self, *exc):
        self.stop_tunnels()
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for n in (self.na, self.nb):
            sh("ip", "netns", "del", n, check=False)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def config(self, end):
        other = 3 - end
        chans = "".join(
            f'\n[[channel]]\nname = "c{c}"\nlocal = "10.211.{c}.{end}:7000"\n'
            f'remote = "10.211.{c}.{other}:7000"\n'
            for c in range(2)
        )
        rekey = f'rekey_after = "{self.rekey_after}"\n' if self.rekey_after else ""
        if self.static:
            self.public(end)  # our key file exists before the tunnel reads it
            keys = (f'private_key_file = "{self.tmp}/k{end}.key"\n'
                    f'peer_public_key = "{self.public(other)}"\n')
        else:
            keys = f'key = "{KEY_B64}"\n'
        path = os.path.join(self.tmp, f"t{end}.toml")
        with open(path, "w") as f:
            f.write(
                f'[tunnel]\nname = "{self.prefix}t{end}"\naddress = "10.79.0.{end}/24"\n'
                f'control = "{self.tmp}/t{end}.sock"\nlog_interval = "0s"\n\n'
                f'[session]\n{keys}{rekey}{chans}'
            )
        os.chmod(path, 0o600)
        return path

    def public(self, end):
        """End `end`'s static public key (made on first use)."""
        path = os.path.join(self.tmp, f"k{end}.key")
        if not os.path.exists(path):
            key = sh(self.braid, "genkey").stdout
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            os.write(fd, key.encode())
            os.close(fd)
        with open(path) as f:
            return sh(self.braid, "pubkey", input=f.read()).stdout.strip()

    def start_tunnels(self):
        for end, ns in ((1, self.na), (2, self.nb)):
            log = open(os.path.join(self.tmp, f"t{end}.log"), "w")
            p = subprocess.Popen(
                ["ip", "netns", "exec", ns, self.braid, "tunnel", "--config", self.config(end)],
                stdout=subprocess.DEVNULL, stderr=log)
            self.tunnels.append(p)
        deadline = time.time() + 15
        while time.time() < deadline:
            if all((self.status(e) or {}).get("peer_seen") for e in (1, 2)):
                return
            time.sleep(0.1)
        raise SystemExit("handshake-flood: the tunnels did not come up; logs in "
                         + open(os.path.join(self.tmp, "t1.log")).read())

    def stop_tunnels(self):
        for p in self.tunnels:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.tunnels:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.tunnels = []

    def status(self, end):
        r = subprocess.run([self.braid, "status", "--json", "--control",
                            os.path.join(self.tmp, f"t{end}.sock")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return None
        try:
            return json.loads(r.stdout)
        except ValueError:
            return None

    def py(self, ns, code, *args):
        return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", code,
                                 *map(str, args)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def iperf(self, secs):
        srv = subprocess.Popen(["ip", "netns", "exec", self.nb, "iperf3", "-s", "-1", "-B",
                                "10.79.0.2", "-p", "5201"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        self.procs.append(srv)
        time.sleep(0.5)
        r = subprocess.run(["ip", "netns", "exec", self.na, "iperf3", "-c", "10.79.0.2",
                            "-p", "5201", "-t", str(secs), "-J"], capture_output=True,
                           text=True, timeout=secs + 30)
        try:
            srv.wait(timeout=5)
        except subprocess.TimeoutExpired:
            srv.kill()
        try:
            return json.loads(r.stdout)["end"]["sum_received"]["bits_per_second"]
        except (ValueError, KeyError):
            return 0.0


def mac1_key(lab):
    """mac1's key for messages to B: BLAKE2s of a label and B's static public key
    (docs/security.md); with a pre-shared key only it would need the derived key."""
    import base64
    if not lab.static:
        return "00"
    return hashlib.blake2s(b"braid mac1 v2" + base64.b64decode(lab.public(2))).hexdigest()


def flood_run(lab, kind, secs, maxn, cap):
    """One iperf3 run of `secs` with a flood of `kind` (None: no flood) meanwhile."""
    fl = None
    if kind:
        length = INIT_LEN_STATIC if lab.static else INIT_LEN
        if lab.legacy:
            # Version 1 (before issue 27): no MACs, no timestamp.
            length -= 44
        fl = lab.py(lab.na, FLOODER, kind, "10.211.0.1", 7000, "10.211.0.2", 7000,
                    secs + 1.5, maxn, mac1_key(lab), length, int(lab.static), cap,
                    1 if lab.legacy else HS_VERSION)
        lab.procs.append(fl)
    t0, cpu0, m0 = time.time(), [proc_ticks(p.pid) for p in lab.tunnels], machine_ticks()
    bps = lab.iperf(secs)
    dt, m1 = time.time() - t0, machine_ticks()
    hz = os.sysconf("SC_CLK_TCK")
    cores = [(proc_ticks(p.pid) - c) / hz / dt for p, c in zip(lab.tunnels, cpu0)]
    busy = (m1[0] - m0[0]) / max(1, m1[1] - m0[1])
    sent, rate = 0, 0.0
    if fl:
        out, err = fl.communicate(timeout=secs + 30)
        try:
            n, t = out.split()
            sent, rate = int(n), int(n) / float(t)
        except ValueError:
            raise SystemExit(f"handshake-flood: the flooder failed: {err.strip()}")
    st = lab.status(2) or {}
    return {"kind": kind or "none", "tcp_bps": bps, "flood_sent": sent,
            "flood_pps": round(rate), "handshake_failures_b": st.get("handshake_failures"),
            "peer_seen_b": st.get("peer_seen"), "cpu_a": round(cores[0], 3),
            "cpu_b": round(cores[1], 3), "machine_busy": round(busy, 3)}


def proc_ticks(pid):
    """User and system CPU time of process `pid` so far, in clock ticks."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return int(rest[11]) + int(rest[12])
    except (OSError, IndexError, ValueError):
        return 0


def machine_ticks():
    """(busy, total) clock ticks of all CPUs so far (busy: neither idle nor iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v) - v[3] - v[4], sum(v)


def median(v):
    v = sorted(v)
    if not v:
        return 0.0
    m = len(v) // 2
    return v[m] if len(v) % 2 else (v[m - 1] + v[m]) / 2


def flood(args):
    rows = []
    ratios = []
    mac1_ratios = []

    def run(kind, cap):
        row = flood_run(lab, kind, args.seconds, args.max_datagrams, cap)
        row["cap_pps"] = round(cap)
        row["load1"] = round(os.getloadavg()[0], 2)
        rows.append(row)
        if not args.json:
            capped = f", capped at {cap:.0f}/s" if cap else ""
            print(f"{row['kind']:>10}: TCP {row['tcp_bps'] / 1e6:8.1f} Mbit/s  "
                  f"flood {row['flood_pps']:>7} datagrams/s ({row['flood_sent']} sent"
                  f"{capped}); tunnels' CPU A {row['cpu_a']:.2f} B {row['cpu_b']:.2f} cores, "
                  f"machine {100 * row['machine_busy']:.0f} % busy, load {row['load1']}",
                  flush=True)
        time.sleep(1)
        return row

    with Lab(args.prefix, args.braid, static=args.mac1 or args.static_keys) as lab:
        lab.legacy = args.legacy
        lab.start_tunnels()
        run(None, 0)
        # Each run: random initiations at full speed, and junk at the rate the
        # initiations reached (the goal compares the same rate; --no-match: junk at
        # full speed too). The order alternates, so that drift in the machine's load
        # does not favour either; the junk before an initiation flood takes the rate
        # of the one before it.
        init_rate = 0.0
        for k in range(args.runs):
            if k % 2 == 0:
                init = run("init", args.flood_rate)
                init_rate = init["flood_pps"]
                junk = run("junk", args.flood_rate if args.no_match else init_rate)
            else:
                junk = run("junk", args.flood_rate if args.no_match else init_rate)
                init = run("init", args.flood_rate)
                init_rate = init["flood_pps"]
            if junk["tcp_bps"]:
                ratios.append(init["tcp_bps"] / junk["tcp_bps"])
            if args.mac1:
                m = run("init-mac1", args.flood_rate)
                if junk["tcp_bps"]:
                    mac1_ratios.append(m["tcp_bps"] / junk["tcp_bps"])

    def med(k, field):
        return median([r[field] for r in rows if r["kind"] == k])

    by = {k: {"tcp_bps": round(med(k, "tcp_bps")), "flood_pps": round(med(k, "flood_pps")),
              "cpu_b": round(med(k, "cpu_b"), 3), "machine_busy": round(med(k, "machine_busy"), 3)}
          for k in dict.fromkeys(r["kind"] for r in rows)}
    ratio = median(ratios)
    res = {"mode": "flood", "seconds": args.seconds, "runs": args.runs, "median": by,
           "keys": "static" if args.mac1 or args.static_keys else "pre-shared",
           "junk_rate": "full speed" if args.no_match else "the initiations' rate",
           "rows": rows, "ratios_init_to_junk": [round(r, 3) for r in ratios],
           "ratio_init_to_junk": round(ratio, 3), "goal": 0.9, "pass": ratio >= 0.9,
           "cpus": os.cpu_count()}
    if mac1_ratios:
        res["ratios_init_mac1_to_junk"] = [round(r, 3) for r in mac1_ratios]
        res["ratio_init_mac1_to_junk"] = round(median(mac1_ratios), 3)
    return res


def replay(args):
    with Lab(args.prefix, args.braid, rekey_after=args.rekey_after) as lab:
        rp = lab.py(lab.na, REPLAYER, ",".join(v[0] for v in lab.veths), args.rate,
                    args.ping_seconds + 10, args.rate * (args.ping_seconds + 10), 64)
        lab.procs.append(rp)
        if rp.stdout.readline().strip() != "ready":
            raise SystemExit(f"handshake-flood: the recorder failed: {rp.stderr.read()}")
        lab.start_tunnels()
        count = int(args.ping_seconds * 10)
        ping = subprocess.run(["ip", "netns", "exec", lab.na, "ping", "-n", "-q", "-i", "0.1",
                               "-W", "1", "-c", str(count), "10.79.0.2"],
                              capture_output=True, text=True, timeout=args.ping_seconds + 60)
        m = re.search(r"(\d+) packets transmitted, (\d+) received", ping.stdout)
        sent, got = (int(m.group(1)), int(m.group(2))) if m else (count, 0)
        sa, sb = lab.status(1) or {}, lab.status(2) or {}
        rp.send_signal(signal.SIGTERM)
        out, _ = rp.communicate(timeout=30)
        replays, recorded = (out.split() + ["0", "0"])[:2] if out.strip() else ("?", "?")
    res = {"mode": "replay", "rekey_after": args.rekey_after, "rate": args.rate,
           "ping_seconds": args.ping_seconds, "pings_sent": sent, "pings_lost": sent - got,
           "replays_sent": replays, "initiations_recorded": recorded,
           "handshakes_a": sa.get("handshakes"), "handshakes_b": sb.get("handshakes"),
           "goal_lost": 0, "pass": sent - got == 0}
    if not args.json:
        print(f"replays at {args.rate}/s of the recorded initiations, rekey_after "
              f"{args.rekey_after}: {sent - got} of {sent} pings lost; handshakes A "
              f"{res['handshakes_a']} B {res['handshakes_b']}")
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replay", action="store_true", help="replay mode (else flood mode)")
    ap.add_argument("--seconds", type=float, default=8, help="each TCP run (flood mode)")
    ap.add_argument("--mac1", action="store_true",
                    help="also flood initiations with a valid mac1 (flood mode)")
    ap.add_argument("--runs", "--repeat", type=int, default=3, dest="runs",
                    help="runs of each flood kind, alternating; medians reported (flood mode)")
    ap.add_argument("--no-match", action="store_true",
                    help="junk at full speed too, not at the rate the initiations reached")
    ap.add_argument("--flood-rate", type=float, default=0,
                    help="cap on the flood, datagrams/s (default: as fast as it goes)")
    ap.add_argument("--legacy", action="store_true",
                    help="flood version-1 initiations (for a braid from before issue 27)")
    ap.add_argument("--static-keys", action="store_true",
                    help="static keys at both ends (else a pre-shared key only)")
    ap.add_argument("--max-datagrams", type=int, default=5_000_000,
                    help="at most this many flood datagrams per run")
    ap.add_argument("--rate", type=int, default=500, help="replays per second")
    ap.add_argument("--rekey-after", default="20s", help="rekey_after in replay mode")
    ap.add_argument("--ping-seconds", type=float, default=70, help="replay mode's ping run")
    ap.add_argument("--prefix", default="hsflood", help="namespace and interface prefix")
    ap.add_argument("--braid", default=os.path.join(ROOT, "target", "release", "braid"),
                    help="the braid binary (default: target/release/braid)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("handshake-flood: needs root (network namespaces, TUN, raw sockets)")
    for tool in ["ip"] + (["ping"] if args.replay else ["iperf3"]):
        if not shutil.which(tool):
            raise SystemExit(f"handshake-flood: needs {tool}")
    if not os.access(args.braid, os.X_OK):
        raise SystemExit(f"handshake-flood: no braid binary at {args.braid} "
                         "(cargo build --release -p braid, or --braid PATH)")
    if len(args.prefix) > 8:
        raise SystemExit("handshake-flood: --prefix must be at most 8 characters "
                         "(interface names)")
    res = replay(args) if args.replay else flood(args)
    if args.json:
        print(json.dumps(res, indent=2))
    elif not args.replay:
        for k, m in res["median"].items():
            print(f"median {k:>10}: TCP {m['tcp_bps'] / 1e6:8.1f} Mbit/s, "
                  f"flood {m['flood_pps']} datagrams/s, responder's CPU {m['cpu_b']:.2f} "
                  f"cores, machine {100 * m['machine_busy']:.0f} % busy")
        per = ", ".join(f"{r:.3f}" for r in res["ratios_init_to_junk"])
        print(f"init / junk = {res['ratio_init_to_junk']:.3f}, the median of {per} "
              f"(goal >= 0.9; junk at {res['junk_rate']})")
        if "ratio_init_mac1_to_junk" in res:
            per = ", ".join(f"{r:.3f}" for r in res["ratios_init_mac1_to_junk"])
            print(f"init-mac1 / junk = {res['ratio_init_mac1_to_junk']:.3f}, the median of {per}")
    sys.exit(0 if res["pass"] else 1)


if __name__ == "__main__":
    main()
