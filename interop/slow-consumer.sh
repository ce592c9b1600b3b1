#!/usr/bin/env bash
# Slow consumers with the real mosquitto clients: a `mosquitto_sub -t '#'` (QoS 0) and a
# persistent QoS 1 `mosquitto_sub -c` are sent SIGSTOP after subscribing, then mosquitto_pub
# publishes 40,000 QoS 1 messages of 512 bytes (20 MB) that a healthy mosquitto_sub reads.
# Checks: the publisher is acknowledged for everything and finishes (bounded: 30 s; a broker
# that paced publishers by its slowest subscriber, as lanemq did before, needs ~40 s), the
# healthy subscriber gets every message in order, the broker's in-memory queue bytes stay
# within `queued_bytes_max_total`, and after SIGCONT the persistent subscriber receives every
# message too (its queue was kept as log positions: nothing acknowledged is lost).
# Starts its own broker on a free 127.0.0.1 port.
#
#   bash interop/slow-consumer.sh
#
# Environment: LANEMQ_BIN, KEEP_TMP=1, INTEROP_BROKER=mosquitto (see lib.sh; the persistent
# check is lanemq-only: mosquitto drops beyond its max_queued_messages of 1000).
# Exit status: the number of failures.
set -uo pipefail
source "$(dirname "$0")/lib.sh"

require_mosquitto_clients
N=${SLOW_N:-40000}
PUB_LIMIT_S=${SLOW_PUB_LIMIT_S:-30}

ADMIN_PORT=$(free_port)
start_broker "[server]
sys_interval_s = 0

[mqtt]
outbound_buffer_bytes_max = 1048576
queued_bytes_max_total = 4194304

[admin]
enable = true
bind = \"127.0.0.1:$ADMIN_PORT\"
token = \"t0ken\""

H=(-h 127.0.0.1 -p "$PORT")
STOPPED=()
resume_all() {
  local p
  for p in "${STOPPED[@]}"; do kill -CONT "$p" 2>/dev/null || true; done
}
# lib.sh's cleanup (the broker, background clients, the temp dir) runs after the resume: a
# trap of our own replaces lib.sh's, which left the broker running after every run.
trap 'rc=$?; resume_all; (exit $rc); cleanup' EXIT

# sub_bg NAME ARGS...: mosquitto_sub in the background, output to $WORK/NAME.out; sets SUB_PID
# once its SUBACK arrived.
sub_bg() {
  local name=$1
  shift
  stdbuf -oL -eL mosquitto_sub "${H[@]}" -d -V mqttv5 "$@" >"$WORK/$name.out" 2>&1 &
  SUB_PID=$!
  wait_grep "$WORK/$name.out" 'received SUBACK' 5
}

# Two subscribers that stop reading: everything at QoS 0, and a persistent QoS 1 session.
sub_bg stuck0 -i stuck0 -q 0 -t '#' -F '%p' || fail stuck0-subscribe "no SUBACK"
STUCK0=$SUB_PID
sub_bg stuckp -i stuckp -c -x 600 -q 1 -t 'iso/#' -F 'M|%p' || fail stuckp-subscribe "no SUBACK"
STUCKP=$SUB_PID
kill -STOP "$STUCK0" "$STUCKP"
STOPPED=("$STUCK0" "$STUCKP")

# The healthy subscriber counts what it gets.
sub_bg healthy -i healthy -q 1 -t 'iso/t' -C "$N" -W 120 -F 'M|%p' || fail healthy-subscribe "no SUBACK"
HEALTHY=$SUB_PID

python3 -c "
import sys
pad = 'x' * 505
w = sys.stdout.write
for i in range($N):
    w('%06d %s\n' % (i, pad))
" >"$WORK/lines.txt"

t0=$(date +%s%N)
if timeout "$PUB_LIMIT_S" mosquitto_pub "${H[@]}" -V mqttv5 -q 1 -i pub -t iso/t -l <"$WORK/lines.txt"; then
  t1=$(date +%s%N)
  ms=$(((t1 - t0) / 1000000))
  echo "published $N QoS 1 messages in ${ms} ms with two stopped subscribers"
  pass publisher-acknowledged-while-subscribers-stopped
else
  fail publisher-acknowledged-while-subscribers-stopped "mosquitto_pub did not finish within ${PUB_LIMIT_S} s"
fi

wait "$HEALTHY" 2>/dev/null
got=$(grep -c '^M|' "$WORK/healthy.out")
if [ "$got" -eq "$N" ] && grep '^M|' "$WORK/healthy.out" | cut -c3-8 | sort -c 2>/dev/null; then
  pass healthy-subscriber-got-everything-in-order
else
  fail healthy-subscriber-got-everything-in-order "received $got of $N (or out of order)"
fi

if [ "$INTEROP_BROKER" = lanemq ]; then
  stats=$(python3 -c '
import sys, urllib.request
r = urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer t0ken"})
print(urllib.request.urlopen(r, timeout=10).read().decode())' "http://127.0.0.1:$ADMIN_PORT/api/v5/stats" || true)
  used=$(printf '%s' "$stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["queues"]["queued_bytes"])' 2>/dev/null || echo "?")
  dropped=$(printf '%s' "$stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["queues"]["dropped_qos0"])' 2>/dev/null || echo "?")
  spilled=$(printf '%s' "$stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["queues"]["spilled"])' 2>/dev/null || echo "?")
  echo "queued bytes in memory: $used (bound 4194304); QoS 0 dropped for the stopped subscriber: $dropped; QoS 1 kept as log positions: $spilled"
  if [[ $used =~ ^[0-9]+$ ]] && ((used <= 4194304 + 65536)) && [[ $dropped =~ ^[0-9]+$ ]] && ((dropped > 0)); then
    pass queue-memory-bounded
  else
    fail queue-memory-bounded "queued_bytes=$used dropped_qos0=$dropped"
  fi

  # The persistent subscriber wakes up: it receives all N (at least once, in order).
  kill -CONT "$STUCKP"
  for _ in $(seq 1 600); do
    [ "$(grep '^M|' "$WORK/stuckp.out" | cut -c3-8 | sort -u | wc -l)" -ge "$N" ] && break
    sleep 0.1
  done
  distinct=$(grep '^M|' "$WORK/stuckp.out" | cut -c3-8 | sort -u | wc -l)
  first_order_ok=$(grep '^M|' "$WORK/stuckp.out" | cut -c3-8 | awk '!seen[$0]++' | sort -c 2>/dev/null && echo yes || echo no)
  if [ "$distinct" -eq "$N" ] && [ "$first_order_ok" = yes ]; then
    pass stopped-persistent-subscriber-loses-nothing
  else
    fail stopped-persistent-subscriber-loses-nothing "got $distinct distinct of $N (in order: $first_order_ok)"
  fi
  kill "$STUCKP" 2>/dev/null || true
else
  skip stopped-persistent-subscriber-loses-nothing "lanemq-only (mosquitto drops beyond max_queued_messages)"
fi
resume_all
kill "$STUCK0" 2>/dev/null || true

summary slow-consumer
exit "$N_FAIL"
