#!/usr/bin/env bash
# Forwarding cost of braid over one unshaped veth pair between two network namespaces,
# everything measured in the same run:
#   tcp-plain    iperf3 TCP straight over the veth
#   tcp-MODE     iperf3 TCP through `braid tunnel` at both ends, per security mode
#                (encrypt, the default; auth; none), with the CPU time of the two tunnel
#                processes (utime+stime from /proc/PID/stat) per Gbit/s carried
#   tcp-MODE-2ch the same over two channels, one per veth pair (a second unshaped pair
#                joins the namespaces), with its ratio to the one-channel row
#   tcp-wg       iperf3 TCP through wireguard-go (user space, encrypting), if installed
#   udp-raw      one plain UDP socket per end (`braid bench udp-send` -> `udp-sink`)
#   udp-session  `braid bench send` -> `braid bench sink` over one braid channel (no TUN)
#   udp-MODE     plain UDP through `braid tunnel` at both ends, per security mode
# at 1400- and 200-byte UDP payloads. Every sender is backlogged (as fast as it can); the
# receive rate is the figure.
#
# BASE=/path/to/an/older/braid runs every tunnel row a second time with that binary
# (labelled base-...), so before and after are compared in one run.
#
# PACE=off (or a rate) sets the channel's `pace`; unset, the default ("auto": the tunnel
# times a train when the channel comes up and paces at 0.97 of what it measured, which on
# a loaded machine can be far below what the unshaped veth carries and then caps the
# TCP rows). PACE=off measures the data path alone. Each TCP row through the tunnel
# records the sending end's pace (pace_bps in the JSON; -1: unpaced).
#
# SERVER=1 (the default) adds, per security mode, one channel with end 1 a server
# (`[[peer]]`, fixed port) and end 2 its client: tcp-MODE-srv-down (iperf3 from the
# server's side to the client: the server's TUN reader and peer routing) and
# tcp-MODE-srv-up (from the client to the server: the server's per-peer TUN writer).
# SERVER=0 leaves them out.
#
# FLOWS=N runs every TCP row with N parallel flows (iperf3 -P N; default 1): the speed
# issue's four-flow figure is FLOWS=4 against a FLOWS=1 run.
#
# CHANNELS="1 2" (the default) runs each mode's tunnel rows over one channel, then two;
# CHANNELS=1 only one. UDP=0 leaves out every UDP row (TCP only: quicker).
#
# PERF=FILE records a perf profile (perf record -g, both tunnel processes) of the first
# TCP row through the tunnel with this build into FILE (if FILE does not exist yet).
#
# Needs root. Usage: sudo [BASE=old-braid] scripts/bench-tunnel.sh [DURATION [JSON-FILE]]
# DURATION defaults to 4s; the JSON (every row, the ratios, the load) goes to JSON-FILE
# if given.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "bench-tunnel.sh: needs root (network namespaces, TUN)" >&2; exit 1; }
DUR=${1:-4s}
JSON_OUT=${2:-}
SECS=${DUR%s}
cargo build --release -q -p braid
B=${CARGO_TARGET_DIR:-$PWD/target}/release/braid
BASE=${BASE:-}
PERF=${PERF:-}
PACE=${PACE:-}
MODES=${MODES:-encrypt auth none}
CHANNELS=${CHANNELS:-1 2}
UDP=${UDP:-1}
SERVER=${SERVER:-1}
FLOWS=${FLOWS:-1}
N1=bfw1-$$; N2=bfw2-$$
TMP=$(mktemp -d)
PIDS=()
TPIDS=()
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
# The second channel's pair.
ip link add bfc$$ netns "$N1" type veth peer name bfd$$ netns "$N2"
ip -n "$N1" addr add 10.204.0.1/24 dev bfc$$; ip -n "$N2" addr add 10.204.0.2/24 dev bfd$$
ip -n "$N1" link set dev bfc$$ up; ip -n "$N2" link set dev bfd$$ up

KEY=$("$B" genkey)
KEYFILE=$TMP/bench.key
(umask 077; "$B" genkey > "$KEYFILE")
: > "$TMP/results"
write_configs() { # security mode, channels
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
$( [ "$1" = none ] && echo "allow_insecure = true" )
[[channel]]
local = "10.203.0.$end:7000"
remote = "10.203.0.$other:7000"
$( [ -n "$PACE" ] && echo "pace = \"$PACE\"" )
CFG
        if [ "$2" = 2 ]; then
            cat >> "$TMP/t$end.toml" <<CFG
[[channel]]
local = "10.204.0.$end:7000"
remote = "10.204.0.$other:7000"
$( [ -n "$PACE" ] && echo "pace = \"$PACE\"" )
CFG
        fi
        chmod 600 "$TMP/t$end.toml"
    done
}

# End 1 a server with end 2 as its one peer, one channel (security mode).
write_server_configs() {
    (umask 077; "$B" genkey > "$TMP/srv.key"; "$B" genkey > "$TMP/cli.key")
    cat > "$TMP/t1.toml" <<CFG
[tunnel]
name = "bft1"
address = "10.78.0.1/24"
control = "$TMP/t1.sock"
log_interval = "0s"
[session]
private_key_file = "$TMP/srv.key"
security = "$1"
$( [ "$1" = none ] && echo "allow_insecure = true" )
[[channel]]
local = "10.203.0.1:7000"
$( [ -n "$PACE" ] && echo "pace = \"$PACE\"" )
[[peer]]
name = "client"
public_key = "$("$B" pubkey < "$TMP/cli.key")"
allowed_ips = ["10.78.0.2/32"]
CFG
    cat > "$TMP/t2.toml" <<CFG
[tunnel]
name = "bft2"
address = "10.78.0.2/24"
control = "$TMP/t2.sock"
log_interval = "0s"
[session]
private_key_file = "$TMP/cli.key"
peer_public_key = "$("$B" pubkey < "$TMP/srv.key")"
security = "$1"
$( [ "$1" = none ] && echo "allow_insecure = true" )
[[channel]]
local = "10.203.0.2:0"
remote = "10.203.0.1:7000"
$( [ -n "$PACE" ] && echo "pace = \"$PACE\"" )
CFG
    chmod 600 "$TMP/t1.toml" "$TMP/t2.toml"
}

start_tunnels() { # binary
    TPIDS=()
    ip netns exec "$N1" "$1" tunnel --config "$TMP/t1.toml" 2>"$TMP/t1.log" & TPIDS+=($!)
    ip netns exec "$N2" "$1" tunnel --config "$TMP/t2.toml" 2>"$TMP/t2.log" & TPIDS+=($!)
    PIDS+=("${TPIDS[@]}")
    for i in $(seq 100); do
        # (End 2 is a client of end 1 in the server rows: its status says.)
        "$B" status --control "$TMP/t2.sock" --json 2>/dev/null | grep -q '"peer_seen": true' && return
        sleep 0.1
    done
    echo "bench-tunnel.sh: the tunnels did not come up:" >&2; cat "$TMP/t1.log" >&2; exit 1
}

stop_tunnels() {
    kill "${TPIDS[@]}" 2>/dev/null || true
    wait "${TPIDS[@]}" 2>/dev/null || true
    TPIDS=()
}

# CPU seconds (user + system, all threads) used so far by the processes TPIDS.
cpu_ticks() {
    local t=0 p
    for p in "${TPIDS[@]}"; do
        [ -r "/proc/$p/stat" ] || continue
        # Fields 14 and 15 after the ")" that ends the command name.
        t=$((t + $(sed 's/.*) //' "/proc/$p/stat" | awk '{print $12 + $13}')))
    done
    echo "$t"
}
HZ=$(getconf CLK_TCK)

record() { # label kind size pps bps loss cpu_s
    echo "$*" >> "$TMP/results"
}

udp() { # label size sink-cmd send-cmd
    local label=$1 size=$2
    ip netns exec "$N2" $3 --json > "$TMP/sink.json" 2>"$TMP/sink.err" &
    local sp=$!
    sleep 0.5
    local c0; c0=$(cpu_ticks)
    ip netns exec "$N1" $4 --size "$size" --duration "$DUR" --json > "$TMP/send.json" 2>"$TMP/send.err"
    wait $sp || { cat "$TMP/sink.err" >&2; exit 1; }
    local c1; c1=$(cpu_ticks)
    python3 - "$label" "$size" "$TMP/send.json" "$TMP/sink.json" "$(( (c1 - c0) ))" "$HZ" "$SECS" >> "$TMP/results" <<'PY'
import json, sys
label, size, send, sink, ticks, hz, secs = sys.argv[1:]
s, r = json.load(open(send)), json.load(open(sink))
cpu = int(ticks) / int(hz)
print(f"udp {label} {size} {s['offered_pps']} {r['pps']} {r['goodput_bps']} {r['loss_ratio']} {cpu}")
PY
    tail -1 "$TMP/results" | awk '{printf "%-6s %-16s %5s %10.1f %10.1f %8.3f %7.2f %7.2f\n", $1, $2, $3, $4/1e3, $5/1e3, $6/1e9, $7*100, $8}'
}

tcp() { # label ip [iperf3 client options]
    local label=$1 ip=$2 opts=${3:-}
    ip netns exec "$N2" iperf3 -s -1 -B "$ip" -p 5201 > /dev/null 2>&1 &
    local sp=$!
    sleep 0.5
    local c0; c0=$(cpu_ticks)
    local perf_pid=
    if [ -n "$PERF" ] && [ "${#TPIDS[@]}" -gt 0 ] && [ "${label#base-}" = "$label" ] && [ ! -e "$PERF" ]; then
        # Both tunnel processes, from 0.5 s in to 0.5 s before the end of the run.
        (sleep 0.5; exec perf record -q -F 999 -g -o "$PERF" -p "$(IFS=,; echo "${TPIDS[*]}")" -- sleep "$(echo "$SECS - 1" | bc)") >/dev/null 2>&1 &
        perf_pid=$!
    fi
    ip netns exec "$N1" iperf3 -c "$ip" -p 5201 -t "$SECS" -P "$FLOWS" $opts -J > "$TMP/iperf.json" 2>"$TMP/iperf.err" || true
    [ -n "$perf_pid" ] && { wait "$perf_pid" || true; echo "perf profile of the tcp $label row: $PERF"; }
    local c1; c1=$(cpu_ticks)
    wait $sp 2>/dev/null || true
    # The sending end's pace (bit/s, 0: unpaced): a measured pace caps the row.
    local pace=0
    if [ -S "$TMP/t1.sock" ] && [ "${#TPIDS[@]}" -gt 0 ]; then
        pace=$("$B" status --control "$TMP/t1.sock" --json 2>/dev/null \
            | python3 -c 'import json,sys; print(json.load(sys.stdin)["channels"][0].get("pace_bps", 0))' 2>/dev/null || echo 0)
    fi
    python3 - "$label" "$TMP/iperf.json" "$(( (c1 - c0) ))" "$HZ" "$pace" >> "$TMP/results" <<'PY'
import json, sys
label, path, ticks, hz, pace = sys.argv[1:]
try:
    j = json.load(open(path))
    bps = j["end"]["sum_received"]["bits_per_second"]
    retr = j["end"]["sum_sent"].get("retransmits", 0)
    secs = j["end"]["sum_received"]["seconds"]
except (KeyError, ValueError):
    bps, retr, secs = 0.0, 0, 1.0
print(f"tcp {label} 0 0 0 {bps} {retr} {int(ticks) / int(hz)} {float(pace)}")
PY
    tail -1 "$TMP/results" | awk -v s="$SECS" '{g=$6/1e9; printf "%-6s %-16s %5s %10s %10s %8.3f %7s %7.2f  %s%s\n", $1, $2, "-", "-", "-", g, $7" rtx", $8, (g>0 && $8>0) ? sprintf("%.2f CPU-s/s per Gbit/s", $8/s/g) : "", ($9>0) ? sprintf(", paced at %.0f Mbit/s", $9/1e6) : ""}'
}

wg_up() { # -> 0 if wireguard-go is running in both namespaces
    command -v wireguard-go >/dev/null && command -v wg >/dev/null || return 1
    local k1 k2
    k1=$(wg genkey); k2=$(wg genkey)
    TPIDS=()
    for end in 1 2; do
        local ns=$N1 other=2 key=$k1 peer=$k2
        [ "$end" = 2 ] && { ns=$N2; other=1; key=$k2; peer=$k1; }
        WG_PROCESS_FOREGROUND=1 ip netns exec "$ns" wireguard-go "bwg$end" > "$TMP/wg$end.log" 2>&1 &
        TPIDS+=($!)
        PIDS+=($!)
    done
    sleep 1
    for end in 1 2; do
        local ns=$N1 other=2 key=$k1 peer=$k2
        [ "$end" = 2 ] && { ns=$N2; other=1; key=$k2; peer=$k1; }
        echo "$key" > "$TMP/wg$end.key"
        ip netns exec "$ns" wg set "bwg$end" private-key "$TMP/wg$end.key" listen-port 7200 \
            peer "$(echo "$peer" | wg pubkey)" endpoint "10.203.0.$other:7200" allowed-ips 10.79.0.0/24 || return 1
        ip -n "$ns" addr add "10.79.0.$end/24" dev "bwg$end"
        ip -n "$ns" link set dev "bwg$end" up
    done
    ip netns exec "$N1" ping -c 1 -W 2 10.79.0.2 > /dev/null 2>&1 || return 1
}

echo "braid forwarding cost over one unshaped veth pair ($(nproc) cores, ${DUR} per run, backlogged senders, pace ${PACE:-default}, $FLOWS TCP flow(s) per row)"
echo "load: $(cat /proc/loadavg)"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
printf "%-6s %-16s %5s %10s %10s %8s %7s %7s\n" kind path bytes "sent kpps" "recv kpps" "Gbit/s" "loss %" "cpu s"
tcp plain 10.203.0.2
[ "$UDP" = 0 ] || for size in 1400 200; do
    udp raw "$size" "$B bench udp-sink --bind 10.203.0.2:9000 --idle 1s" "$B bench udp-send --to 10.203.0.2:9000"
    udp session "$size" "$B bench sink --channel 10.203.0.2:7100,10.203.0.1:7100 --key-file $KEYFILE --idle 1s" \
        "$B bench send --channel 10.203.0.1:7100,10.203.0.2:7100 --key-file $KEYFILE"
done
BINS=("$B")
[ -n "$BASE" ] && BINS=("$BASE" "$B")
for bin in "${BINS[@]}"; do
    prefix=""
    [ "$bin" != "$B" ] && prefix="base-"
    for mode in $MODES; do
        for nch in $CHANNELS; do
            label="${prefix}$mode"
            [ "$nch" = 1 ] || label="$label-${nch}ch"
            write_configs "$mode" "$nch"
            start_tunnels "$bin"
            tcp "$label" 10.78.0.2
            [ "$UDP" = 0 ] || for size in 1400 200; do
                udp "$label" "$size" "$B bench udp-sink --bind 10.78.0.2:9000 --idle 1s" "$B bench udp-send --to 10.78.0.2:9000"
            done
            stop_tunnels
        done
        if [ "$SERVER" != 0 ]; then
            write_server_configs "$mode"
            start_tunnels "$bin"
            tcp "${prefix}$mode-srv-down" 10.78.0.2
            tcp "${prefix}$mode-srv-up" 10.78.0.2 -R
            stop_tunnels
        fi
    done
done
if wg_up; then
    tcp wireguard-go 10.79.0.2
    stop_tunnels
else
    stop_tunnels
    echo "(wireguard-go not installed or did not come up: no wireguard-go row)"
fi
echo "load: $(cat /proc/loadavg)"
echo
python3 - "$TMP/results" "$DUR" "$(nproc)" "$LOAD_BEFORE" "$(cut -d' ' -f1-3 /proc/loadavg)" "$JSON_OUT" "$FLOWS" <<'PY'
import json, re, sys
path, dur, cores, load0, load1, out, flows = sys.argv[1:]
secs = float(dur.rstrip("s"))
rows = []
for l in open(path):
    f = l.split()
    kind, label, size, sent, pps, bps, x, cpu = f[:8]
    r = {"kind": kind, "path": label, "cpu_s": float(cpu)}
    if len(f) > 8:
        r["pace_bps"] = float(f[8])
    if kind == "udp":
        r.update(size=int(size), sent_pps=float(sent), recv_pps=float(pps),
                 recv_bps=float(bps), loss=float(x))
    else:
        r.update(bps=float(bps), retransmits=int(x))
        gbps = float(bps) / 1e9
        r["cpu_per_gbps"] = float(cpu) / secs / gbps if gbps > 0 and float(cpu) > 0 else None
    rows.append(r)
raw = {r["size"]: r["recv_pps"] for r in rows if r["kind"] == "udp" and r["path"] == "raw"}
plain = next((r["bps"] for r in rows if r["kind"] == "tcp" and r["path"] == "plain"), None)
print("ratios (same run):")
for r in rows:
    if r["kind"] == "udp" and r["path"] != "raw" and raw.get(r["size"]):
        r["vs_raw"] = r["recv_pps"] / raw[r["size"]]
        print(f"  udp {r['path']:<16} {r['size']:>5} B: {r['vs_raw']:.2f} x raw UDP packet rate")
    if r["kind"] == "tcp" and r["path"] != "plain" and plain:
        r["vs_plain"] = r["bps"] / plain
        c = f", {r['cpu_per_gbps']:.2f} CPU-seconds per second per Gbit/s" if r["cpu_per_gbps"] else ""
        p = f" (paced at {r['pace_bps'] / 1e6:.0f} Mbit/s)" if r.get("pace_bps", 0) > 0 else ""
        print(f"  tcp {r['path']:<16} {r['bps'] / 1e9:.3f} Gbit/s = {r['vs_plain']:.3f} x plain TCP{c}{p}")
for r in rows:
    if r["kind"] == "tcp" and re.search(r"-[0-9]+ch$", r["path"]):
        one = next((x for x in rows if x["kind"] == "tcp" and x["path"] == r["path"].rsplit("-", 1)[0]), None)
        if one and one["bps"] > 0:
            r["vs_one_channel"] = r["bps"] / one["bps"]
            print(f"  tcp {r['path']:<16} {r['vs_one_channel']:.2f} x the one-channel row")
for r in rows:
    if r["path"].startswith("base-"):
        now = next((x for x in rows if x["kind"] == r["kind"] and x["path"] == r["path"][5:]
                    and x.get("size") == r.get("size")), None)
        key = "bps" if r["kind"] == "tcp" else "recv_pps"
        if now and r[key] > 0:
            now["vs_base"] = now[key] / r[key]
            print(f"  {r['kind']} {now['path']:<16} {r.get('size', ''):>5}: {now['vs_base']:.2f} x the BASE binary")
doc = {"duration_s": secs, "tcp_flows": int(flows), "cores": int(cores), "load_before": load0, "load_after": load1, "rows": rows}
if out:
    json.dump(doc, open(out, "w"), indent=1)
    print(f"JSON: {out}")
PY
