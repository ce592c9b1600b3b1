#!/usr/bin/env bash
# Durability figures for docs/benchmarks.md (lanemq only; the side-by-side QoS 1 run against
# mosquitto is in interop/bench-vs-mosquitto.sh):
#   1. QoS 1 throughput, 10 publishers -> 1 subscriber, 64 B and 1 KiB, under each fsync policy
#   2. restart time with RECORDS records in the log: process start -> port accepts connections
#   3. write amplification: bytes the broker wrote to disk (/proc/PID/io write_bytes) per byte
#      of payload, QoS 1, with 0, 1 and 10 (online) subscribers
#   4. retention: one retained message, one last value and 200 messages queued for an offline
#      session, then RETENTION_MB of QoS 1 traffic with retention_max_bytes = 50 MiB: the
#      log's size (peak and settled) against the limit + one segment, and all of them still
#      delivered afterwards
#   5. offline sessions: OFFLINE_SESSIONS persistent sessions subscribe one topic and go away,
#      200 QoS 1 publishes of 64 B to it, then they come back and drain; publish time, broker
#      RSS per queued message, drain time; side by side with mosquitto (in memory), ROUNDS
#      alternating rounds
# Every load is bounded (duration or count); traffic on 127.0.0.1 only.
#
# Environment: DURATION=5  RECORDS=10000000  AMP_MESSAGES=200000  RETENTION_MB=300  SKIP_BUILD=1
#              OFFLINE_SESSIONS=5000  ROUNDS=3  SECTIONS="policy restart amp retention offline"
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DURATION=${DURATION:-5}
RECORDS=${RECORDS:-10000000}
AMP_MESSAGES=${AMP_MESSAGES:-200000}
RETENTION_MB=${RETENTION_MB:-300}
OFFLINE_SESSIONS=${OFFLINE_SESSIONS:-5000}
ROUNDS=${ROUNDS:-3}
SECTIONS=${SECTIONS:-"policy restart amp retention offline"}
BIN=target/release/lanemq
BENCH=target/release/lanemq-bench
[ -n "${SKIP_BUILD:-}" ] || cargo build --release -p lanemq -p lanemq-bench >&2
TMP=$(mktemp -d "${TMPDIR:-/tmp}/lanemq-durability.XXXXXX")
PID=""
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { # $1 port; prints ms waited
  python3 - "$1" <<'PY'
import socket, sys, time
t0 = time.monotonic()
while time.monotonic() - t0 < 120:
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.2).close()
        print(int((time.monotonic() - t0) * 1000)); sys.exit(0)
    except OSError:
        time.sleep(0.005)
sys.exit(1)
PY
}
start() { # $1 data dir, $2 fsync policy
  PORT=$(free_port)
  printf '[server]\nsys_interval_s = 0\n[storage]\nfsync = "%s"\nfsync_interval_ms = 10\n' "$2" >"$TMP/cfg.toml"
  "$BIN" serve --mqtt "127.0.0.1:$PORT" --data-dir "$1" --config "$TMP/cfg.toml" >>"$TMP/broker.log" 2>&1 &
  PID=$!
  wait_port "$PORT" >/dev/null
}
stop() { kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""; }
rate() { python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(round(r.get("recv_rate", r.get("received_per_s", 0))))' "$1" 2>/dev/null || echo "?"; }

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), git $(git rev-parse --short HEAD)"

if [[ " $SECTIONS " == *" policy "* ]]; then
  echo "== QoS 1, 10 publishers -> 1 subscriber, ${DURATION}s"
  for policy in always interval never; do
    for payload in 64 1024; do
      start "$TMP/d-$policy-$payload" "$policy"
      "$BENCH" --port "$PORT" --publishers 10 --subscribers 1 --qos 1 --payload "$payload" \
        --topic-mode fan-in --duration "$DURATION" --warmup 1 --quiet --json "$TMP/r.json" \
        --broker-pid "$PID" >"$TMP/out.txt" 2>&1 || true
      printf '%-8s %5sB  ' "$policy" "$payload"; grep -E "^received|^latency" "$TMP/out.txt" | tr '\n' ' '; echo
      stop
    done
  done
fi

if [[ " $SECTIONS " == *" restart "* ]]; then
  echo "== restart with $RECORDS records in the log"
  D="$TMP/restart"
  start "$D" never
  per=$(( RECORDS / 10 ))
  "$BENCH" --port "$PORT" --publishers 10 --subscribers 0 --qos 0 --payload 16 --topic-mode fan-in \
    --count "$per" --duration 600 --timeout 900 --quiet >"$TMP/fill.txt" 2>&1 || true
  grep -E "^published" "$TMP/fill.txt" || cat "$TMP/fill.txt"
  stop
  du -sh "$D/log" | sed 's/^/log size: /'
  for i in 1 2 3; do
    PORT=$(free_port)
    printf '[server]\nsys_interval_s = 0\n' >"$TMP/cfg.toml"
    t0=$(date +%s%N)
    "$BIN" serve --mqtt "127.0.0.1:$PORT" --data-dir "$D" --config "$TMP/cfg.toml" >>"$TMP/broker.log" 2>&1 &
    PID=$!
    wait_port "$PORT" >/dev/null
    t1=$(date +%s%N)
    echo "restart $i: $(( (t1 - t0) / 1000000 )) ms from exec to accepting connections"
    stop
  done
  grep "log opened" "$TMP/broker.log" | tail -1 | sed 's/\x1b\[[0-9;]*m//g'
fi

if [[ " $SECTIONS " == *" amp "* ]]; then
  echo "== write amplification, QoS 1, 10 publishers, $AMP_MESSAGES messages of 64 B and 1 KiB"
  for payload in 64 1024; do
    for subs in 0 1 10; do
      start "$TMP/amp-$payload-$subs" always
      before=$(awk '/^write_bytes/ {print $2}' "/proc/$PID/io")
      per=$(( AMP_MESSAGES / 10 ))
      "$BENCH" --port "$PORT" --publishers 10 --subscribers "$subs" --qos 1 --payload "$payload" \
        --topic-mode fan-in --count "$per" --duration 300 --timeout 600 --quiet >"$TMP/amp.txt" 2>&1 || true
      sleep 1.5 # let the index thread flush
      after=$(awk '/^write_bytes/ {print $2}' "/proc/$PID/io")
      python3 -c "import sys; d=$after-$before; n=$AMP_MESSAGES*$payload; print(f'payload {$payload:>5} B  subscribers {$subs:>2}: {d/1e6:8.1f} MB written for {n/1e6:6.1f} MB of payload = {d/n:5.2f} bytes per payload byte')"
      stop
    done
  done
fi

if [[ " $SECTIONS " == *" retention "* ]]; then
  echo "== retention: retained + last value + 200 queued, then ${RETENTION_MB} MB of QoS 1, retention_max_bytes = 50 MiB"
  D="$TMP/retention"
  PORT=$(free_port)
  echo "default allow" >"$TMP/allow.acl"
  cat >"$TMP/cfg.toml" <<CFG
[server]
sys_interval_s = 0
acl_file = "$TMP/allow.acl"
[storage]
retention_max_bytes = 52428800
retention_interval_s = 1
[[streams]]
name = "last"
topic_filter = "rt/last/+"
is_lastvalue = true
key_expression = "message.topic.2"
CFG
  "$BIN" serve --mqtt "127.0.0.1:$PORT" --data-dir "$D" --config "$TMP/cfg.toml" >>"$TMP/broker.log" 2>&1 &
  PID=$!
  wait_port "$PORT" >/dev/null
  mosquitto_sub -p "$PORT" -V mqttv5 -i rt-queue -c -x 3600 -q 1 -t rt/q -E
  mosquitto_pub -p "$PORT" -V mqttv5 -q 1 -r -t rt/status -m online
  mosquitto_pub -p "$PORT" -V mqttv5 -q 1 -t rt/last/dev1 -m v1
  seq 1 200 | mosquitto_pub -p "$PORT" -V mqttv5 -q 1 -t rt/q -l
  per=$(( RETENTION_MB * 1000000 / 1024 / 10 ))
  "$BENCH" --port "$PORT" --publishers 10 --subscribers 0 --qos 1 --payload 1024 --topic-mode fan-in \
    --count "$per" --duration 600 --timeout 900 --quiet >"$TMP/ret.txt" 2>&1 &
  BPID=$!
  peak=0
  while kill -0 "$BPID" 2>/dev/null; do
    b=$(du -sb "$D/log" | cut -f1); [ "$b" -gt "$peak" ] && peak=$b
    sleep 0.5
  done
  wait "$BPID" || true
  grep -E "^published" "$TMP/ret.txt" || cat "$TMP/ret.txt"
  sleep 3
  settled=$(du -sb "$D/log" | cut -f1); [ "$settled" -gt "$peak" ] && peak=$settled
  python3 -c "m=1<<20; print(f'log: peak {$peak/m:.1f} MiB, settled {$settled/m:.1f} MiB; limit + one segment = {50+64} MiB')"
  r=$(mosquitto_sub -p "$PORT" -V mqttv5 -t rt/status -C 1 -W 5 || echo MISSING)
  lv=$(mosquitto_sub -p "$PORT" -V mqttv5 -t '$stream/last' -D subscribe user-property stream-offset earliest -C 1 -W 5 || echo MISSING)
  q=$(mosquitto_sub -p "$PORT" -V mqttv5 -i rt-queue -c -x 3600 -q 1 -t rt/q -C 200 -W 10 | wc -l)
  echo "after: retained=$r last_value=$lv queued_delivered=$q/200"
  grep "carried" "$TMP/broker.log" | tail -1 | sed 's/\x1b\[[0-9;]*m//g'
  stop
fi

if [[ " $SECTIONS " == *" offline "* ]]; then
  echo "== offline sessions: $OFFLINE_SESSIONS sessions x 200 QoS 1 publishes of 64 B, $ROUNDS rounds (load $(cut -d' ' -f1-3 /proc/loadavg))"
  for r in $(seq 1 "$ROUNDS"); do
    for broker in lanemq mosquitto; do
      PORT=$(free_port)
      if [ "$broker" = lanemq ]; then
        "$BIN" serve --mqtt "127.0.0.1:$PORT" --data-dir "$TMP/offline-$r" >>"$TMP/broker.log" 2>&1 &
      else
        # mosquitto keeps queues in memory; its per-client queue limit raised above 200.
        printf 'listener %s 127.0.0.1\nallow_anonymous true\nmax_queued_messages 1000\n' "$PORT" >"$TMP/mosq.conf"
        mosquitto -c "$TMP/mosq.conf" >>"$TMP/mosq.log" 2>&1 &
      fi
      PID=$!
      wait_port "$PORT" >/dev/null
      "$BENCH" --port "$PORT" --offline-sessions "$OFFLINE_SESSIONS" --count 200 --payload 64 \
        --broker-pid "$PID" --quiet --timeout 600 --json "$TMP/off.json" >"$TMP/off.txt" 2>&1 || true
      python3 - "$TMP/off.json" "$broker" "$r" <<'PY'
import json, sys
o = json.load(open(sys.argv[1]))["offline"]
print(f"round {sys.argv[3]} {sys.argv[2]:<9} publish {o['publish_secs']:6.2f} s  RSS/queued {o['rss_per_queued_bytes']:6.1f} B  "
      f"drained {o['drained']}/{o['queued_expected']} in {o['drain_secs']:6.2f} s")
PY
      stop
    done
  done
fi
