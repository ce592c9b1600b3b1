#!/usr/bin/env bash
# Lanes (the lite-topic layer, docs/lanes.md) with the real mosquitto_pub / mosquitto_sub
# clients: two mosquitto_sub workers of one group share the lanes of a parent (each message
# once, with the `lane` / `lane-offset` user properties, per-lane order), a plain one-lane
# subscription with `-D subscribe user-property lane-offset 1` replays that lane from offset 1,
# the quota refusal (PUBACK 0x97) reaches mosquitto_pub, and the README example works as printed.
# Starts its own broker on a free 127.0.0.1 port (ACL `default allow`, parent `agents`).
#
#   bash interop/lanes.sh
#
# Environment: LANEMQ_BIN, KEEP_TMP=1 (see lib.sh). Exit status: the number of failures.
set -uo pipefail
source "$(dirname "$0")/lib.sh"

require_mosquitto_clients
if [ "$INTEROP_BROKER" != lanemq ]; then
  echo "lanes are a lanemq extension: no mosquitto baseline" >&2
  exit 0
fi

printf 'default allow\n' >"$WORK/allow.acl"
start_broker "[server]
sys_interval_s = 0
acl_file = \"$WORK/allow.acl\"

[admin]
enable = false

[[lite.parents]]
name = \"agents\"
pattern = \"agents/{lane}/#\"

[[lite.parents]]
name = \"tiny\"
pattern = \"tiny/{lane}\"
max_lanes = 1"

H=(-h 127.0.0.1 -p "$PORT")
pub() { timeout 10 mosquitto_pub "${H[@]}" -V mqttv5 -q 1 "$@"; }

sub_bg() {
  local name=$1 secs=$2
  shift 2
  local out=$WORK/$name.out
  stdbuf -oL -eL mosquitto_sub "${H[@]}" -d -W "$secs" -V mqttv5 -q 1 "$@" >"$out" 2>&1 &
  SUB_PID=$!
  wait_grep "$out" 'received SUBACK' 5
}
msgs() { grep '^MSG|' "$1" | sed 's/^MSG|//'; }

# ---------------------------------------------------------------------------------------------
# Two workers share the lanes of the parent.
sub_bg w1 6 -i w1 -t '$share/workers/agents/+/#' -F 'MSG|%t|%P|%p'
P1=$SUB_PID
sub_bg w2 6 -i w2 -t '$share/workers/agents/+/#' -F 'MSG|%t|%P|%p'
P2=$SUB_PID
for i in 0 1 2 3 4; do
  for l in a b c d; do pub -t "agents/$l/x" -m "$l$i"; done
done
wait "$P1" "$P2" 2>/dev/null
ALL=$( (msgs "$WORK/w1.out"; msgs "$WORK/w2.out") )
N=$(echo "$ALL" | grep -c . || true)
if [ "$N" = 20 ]; then pass "group: 20 messages, each once"; else fail "group: 20 messages, each once" "got $N"; fi
BAD=0
for l in a b c d; do
  for f in "$WORK/w1.out" "$WORK/w2.out"; do
    got=$(msgs "$f" | grep "^agents/$l/x|" | sed 's/.*|//' | paste -sd ' ')
    # Each worker's share of a lane is in lane order.
    want=$(echo "$got" | tr ' ' '\n' | sort -t"$l" -k2 -n | paste -sd ' ')
    [ "$got" = "$want" ] || BAD=1
  done
done
if [ $BAD = 0 ]; then pass "group: per-lane order"; else fail "group: per-lane order" "$ALL"; fi
if echo "$ALL" | grep -q '^agents/c/x|.*lane:c.*lane-offset:3.*|c3$'; then
  pass "group: lane and lane-offset user properties (%P)"
else
  fail "group: lane and lane-offset user properties (%P)" "$(echo "$ALL" | grep c3)"
fi
if [ -s "$WORK/w1.out" ] && [ -s "$WORK/w2.out" ] && msgs "$WORK/w1.out" | grep -q . && msgs "$WORK/w2.out" | grep -q .; then
  pass "group: both workers got lanes"
else
  fail "group: both workers got lanes" "w1=$(msgs "$WORK/w1.out" | wc -l) w2=$(msgs "$WORK/w2.out" | wc -l)"
fi

# A plain one-lane subscription with lane-offset 1 replays offsets 1.. of lane b, then live.
sub_bg replay 3 -t 'agents/b/#' -D subscribe user-property lane-offset 1 -F 'MSG|%p'
P3=$SUB_PID
pub -t agents/b/x -m b5
wait "$P3" 2>/dev/null
got=$(msgs "$WORK/replay.out" | paste -sd ' ')
if [ "$got" = "b1 b2 b3 b4 b5" ]; then pass "replay: lane-offset 1 then live"; else fail "replay: lane-offset 1 then live" "got [$got]"; fi

# The quota: the second lane of `tiny` is refused with 0x97.
pub -t tiny/one -m x >/dev/null 2>&1
out=$(pub -d -t tiny/two -m x 2>&1)
if echo "$out" | grep -qi 'quota\|0x97\|151'; then pass "quota: PUBACK 0x97 to mosquitto_pub"; else fail "quota: PUBACK 0x97 to mosquitto_pub" "$out"; fi

summary lanes
exit "$N_FAIL"
