#!/usr/bin/env bash
# Forwarding cost of braid over one unshaped veth pair, next to raw UDP between the same
# two network namespaces, measured in the same run, at 1400- and 200-byte payloads:
#   raw      one plain UDP socket per end (`braid bench udp-send` -> `udp-sink`)
#   session  `braid bench send` -> `braid bench sink` over one braid channel (no TUN)
#   tun-MODE plain UDP through `braid tunnel` at both ends (TUN -> braid -> veth -> braid
#            -> TUN), once per security mode: encrypt (the default), auth, none
# Every sender is backlogged (as fast as it can); the receive rate is the figure.
# Needs root. Usage: sudo scripts/bench-tunnel.sh [DURATION, default 4s]
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "bench-tunnel.sh: needs root (network namespaces, TUN)" >&2; exit 1; }
DUR=${1:-4s}
cargo build --release -q -p braid
B=$PWD/target/release/braid
N1=bfw1-$$; N2=bfw2-$$
TMP=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    ip netns del "$N1" 2>/dev/null || true
    ip netns del "$N2" 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

ip netns add "$N1"; ip netns add "$N2"
ip -n "$N1" link set dev lo up; ip -n "$N2" link set dev lo up
ip link add bfa$$ netns "$N1" type veth peer name bfb$$ netns "$N2"
ip -n "$N1" addr add 10.203.0.1/24 dev bfa$$; ip -n "$N2" addr add 10.203.0.2/24 dev bfb$$
ip -n "$N1" link set dev bfa$$ up; ip -n "$N2" link set dev bfb$$ up

KEY=$("$B" genkey)
KEYFILE=$TMP/bench.key
(umask 077; "$B" genkey > "$KEYFILE")
write_configs() { # security mode
    for end in 1 2; do
        other=$((3 - end))
        cat > "$TMP/t$end.toml" <<CFG
[tunnel]
name = "bft$end"
address = "10.78.0.$end/24"
control = "$TMP/t$end.sock"
log_interval = "0s"
[session]
key = "$KEY"
security = "$1"
[[channel]]
local = "10.203.0.$end:7000"
remote = "10.203.0.$other:7000"
CFG
    done
}

start_tunnels() {
    TPIDS=()
    ip netns exec "$N1" "$B" tunnel --config "$TMP/t1.toml" 2>"$TMP/t1.log" & TPIDS+=($!)
    ip netns exec "$N2" "$B" tunnel --config "$TMP/t2.toml" 2>"$TMP/t2.log" & TPIDS+=($!)
    PIDS+=("${TPIDS[@]}")
    for i in $(seq 100); do
        "$B" status --control "$TMP/t1.sock" --json 2>/dev/null | grep -q '"peer_seen": true' && return
        sleep 0.1
    done
    echo "bench-tunnel.sh: the tunnels did not come up:" >&2; cat "$TMP/t1.log" >&2; exit 1
}

stop_tunnels() {
    kill "${TPIDS[@]}" 2>/dev/null || true
    wait "${TPIDS[@]}" 2>/dev/null || true
}

run() { # label size sink-cmd send-cmd
    local label=$1 size=$2
    ip netns exec "$N2" $3 --json > "$TMP/sink.json" 2>"$TMP/sink.err" &
    local sp=$!
    sleep 0.5
    ip netns exec "$N1" $4 --size "$size" --duration "$DUR" --json > "$TMP/send.json" 2>"$TMP/send.err"
    wait $sp || { cat "$TMP/sink.err" >&2; exit 1; }
    python3 - "$label" "$size" "$TMP/send.json" "$TMP/sink.json" "$TMP/results" <<'PY'
import json, sys
label, size, send, sink, results = sys.argv[1:]
s, r = json.load(open(send)), json.load(open(sink))
print(f"{label:<12} {size:>5} {s['offered_pps']/1e3:12.1f} {r['pps']/1e3:12.1f} {r['goodput_bps']/1e9:10.3f} {r['loss_ratio']*100:8.2f}")
open(results, "a").write(f"{label} {size} {r['pps']} {r['goodput_bps']}\n")
PY
}

echo "braid forwarding cost over one unshaped veth pair ($(nproc) cores, ${DUR} per run, backlogged senders)"
printf "%-12s %5s %12s %12s %10s %8s\n" path bytes "sent kpps" "recv kpps" "recv Gb/s" "loss %"
for size in 1400 200; do
    run raw "$size" "$B bench udp-sink --bind 10.203.0.2:9000 --idle 1s" "$B bench udp-send --to 10.203.0.2:9000"
    run session "$size" "$B bench sink --channel 10.203.0.2:7100,10.203.0.1:7100 --key-file $KEYFILE --idle 1s" \
        "$B bench send --channel 10.203.0.1:7100,10.203.0.2:7100 --key-file $KEYFILE"
done
for mode in encrypt auth none; do
    write_configs "$mode"
    start_tunnels
    for size in 1400 200; do
        run "tun-$mode" "$size" "$B bench udp-sink --bind 10.78.0.2:9000 --idle 1s" "$B bench udp-send --to 10.78.0.2:9000"
    done
    stop_tunnels
done
echo
echo "ratio of received packet rate to raw UDP at the same size:"
python3 - "$TMP/results" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1])]
raw = {r[1]: float(r[2]) for r in rows if r[0] == "raw"}
for r in rows:
    if r[0] != "raw":
        print(f"  {r[0]:<12} {r[1]:>5} B: {float(r[2]) / raw[r[1]]:.2f} x raw")
PY
