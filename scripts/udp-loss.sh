#!/bin/bash
# Where UDP datagrams are lost through `braid tunnel` (encrypt, one channel, pace off,
# one unshaped veth pair between two network namespaces): `braid bench udp-send` into
# end 1's TUN device for 4 s, `braid bench udp-sink` behind end 2's. Prints the TUN
# devices' counters (`ip -s link`: end 1's TX dropped are datagrams braid did not read
# in time), the UDP counters of end 2's namespace, what the sender offered and the sink
# received (loss, one-way delay), and every nonzero drop counter of `braid status`.
#
# Needs root. Usage: sudo [SIZE=200] [EXTRA="--pps 50000"] [B=path/to/braid] scripts/udp-loss.sh
# (SIZE: datagram bytes, default 1400; EXTRA: more `udp-send` flags, default backlogged.)
# docs/performance.md, "Where UDP is lost through the tunnel", has its figures.
set -u
B=${B:-target/release/braid}
SIZE=${SIZE:-1400}
N1=ud1-$$; N2=ud2-$$; TMP=$(mktemp -d)
cleanup() { kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; ip netns del $N1; ip netns del $N2; rm -rf $TMP; }
trap cleanup EXIT
ip netns add $N1; ip netns add $N2
ip -n $N1 link set lo up; ip -n $N2 link set lo up
ip link add uda$$ netns $N1 type veth peer name udb$$ netns $N2
ip -n $N1 addr add 10.203.0.1/24 dev uda$$; ip -n $N2 addr add 10.203.0.2/24 dev udb$$
ip -n $N1 link set uda$$ up; ip -n $N2 link set udb$$ up
KEY=$($B genkey)
for end in 1 2; do other=$((3-end)); cat > $TMP/t$end.toml <<CFG
[tunnel]
name = "udt$end"
address = "10.78.0.$end/24"
control = "$TMP/t$end.sock"
log_interval = "0s"
[session]
key = "$KEY"
security = "encrypt"
[[channel]]
local = "10.203.0.$end:7000"
remote = "10.203.0.$other:7000"
pace = "off"
CFG
chmod 600 $TMP/t$end.toml; done
ip netns exec $N1 $B tunnel --config $TMP/t1.toml > $TMP/l1 2>&1 &
ip netns exec $N2 $B tunnel --config $TMP/t2.toml > $TMP/l2 2>&1 &
for i in $(seq 50); do $B status --control $TMP/t1.sock --json 2>/dev/null | grep -q '"peer_seen": *true' && break; sleep 0.1; done
snap() {
  echo "== $1"
  ip -n $N1 -s link show udt1 | sed -n '3,6p' | tr -s ' ' | sed 's/^/  tun1 /'
  ip -n $N2 -s link show udt2 | sed -n '3,6p' | tr -s ' ' | sed 's/^/  tun2 /'
  ip netns exec $N2 grep -A1 '^Udp:' /proc/net/snmp | tail -1 | cat
}
snap before
ip netns exec $N2 $B bench udp-sink --bind 10.78.0.2:9000 --idle 1s > $TMP/sink 2>&1 &
sleep 0.3
ip netns exec $N1 $B bench udp-send --to 10.78.0.2:9000 --size $SIZE --duration 4s ${EXTRA:-} > $TMP/send 2>&1
sleep 1.5
snap after
echo "== send"; cat $TMP/send; echo "== sink"; cat $TMP/sink
for e in 1 2; do echo "== status $e"; $B status --control $TMP/t$e.sock --json | python3 -c '
import json,sys; s=json.load(sys.stdin)
def walk(o,p=""):
    if isinstance(o,dict):
        for k,v in o.items(): walk(v,p+"."+k)
    elif isinstance(o,list):
        for i,v in enumerate(o): walk(v,p+"[%d]"%i)
    elif isinstance(o,(int,float)) and o and any(w in p for w in ("drop","lost","overflow","full","shed","late")): print(" ",p,o)
walk(s)'; done
