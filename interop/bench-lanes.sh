#!/usr/bin/env bash
# Lanes (lite topics, issue 6) figures for docs/benchmarks.md (not part of the test command).
# Every broker is fresh (new data dir in a temp dir, admin API off) with the lite parent
# `agents` = `agents/{lane}/#` (ttl_s large, so nothing expires during the run).
#
#   idle   create LANES lanes (`agents/l-<i>/x`, one QoS 1 message of PAYLOAD bytes each,
#          PUBS connections, INFLIGHT window each): lane creation rate, broker RSS per idle lane;
#          then the active phase on the same broker: ACTIVE lanes at RATE msg/s for SECS s
#          (after WARMUP s) through a MEMBERS-member group `$share/bench/agents/+/#` that
#          subscribes with `lane-offset=latest` (so the idle lanes' messages are not replayed).
#   fresh  the same active phase on a fresh broker without the idle lanes (target: p99 within
#          1.25x of the idle run).
#   a2a    the RocketMQ-A2A shape: A2A_LANES lanes created, then on that broker, each for SECS s
#          through the same group: A2A_RATE msg/s to random lanes among them (target: p95 <= 10
#          ms); the same with A2A_NEW_RATE msg/s more to lanes created during the run (one
#          message each: creation under load, target p95 <= 10 ms); A2A_FAST_RATE msg/s (target
#          p95 <= 20 ms); then the broker is killed (-9) and restarted: time until a client gets
#          its CONNACK (the broker accepts clients only once storage, streams and lanes are open).
#   restart (opt-in) RESTART_LANES lanes created (one message each), then plain QoS 1 messages
#          outside the parent up to RESTART_RECORDS records in the log; kill -9 and restart: time
#          until a client gets its CONNACK (issue 13: 1 M lanes and 10 M records, <= 1 s).
#   plain  (opt-in) the active phase on a broker without lite parents: a plain MQTT shared
#          subscription (round robin, no per-lane order), the baseline for the lanes' latency.
#   control (opt-in) LANES messages to topics outside any lite parent (`bench/l-<i>/x`) on a
#          broker without lite parents: the broker RSS growth of storing the messages alone, to
#          read the per-lane figure against.
# The latency is publish (the bench writes the PUBLISH) to delivery (a member reads it), both in
# this one process, QoS 1 both ways, every delivery PUBACKed. Every load is bounded; all traffic
# is on 127.0.0.1.
#
# Environment: LANES=1000000 ACTIVE=1000 RATE=10000 SECS=10 WARMUP=1 MEMBERS=4
#              A2A_LANES=LANES/2 A2A_RATE=12500 A2A_NEW_RATE=2500 A2A_FAST_RATE=25000 PUBS=4
#              RESTART_LANES=LANES RESTART_RECORDS=10000000
#              INFLIGHT=1000 PAYLOAD=100 FSYNC= (empty: the broker's default, "always")
#              SECTIONS="idle fresh a2a" (add "plain", "control")  REPEAT=1 (active runs per broker in
#              idle/fresh, alternating; the table shows the median run by p99)  PAUSE=3 (seconds after
#              `sync` between a create phase and the active phase)  SKIP_BUILD=1  KEEP_TMP=1
#              LANEMQ_BIN=<target>/release/lanemq  LANEMQ_BENCH=<target>/release/lanemq-bench
#              NO_LITE=1 (omit the [lite] section: a broker without lanes, to test the tool)
#              STORAGE_TOML='index_cache_bytes = 268435456' (lines added to [storage])
# A quick run (under a minute): LANES=20000 SECS=5 interop/bench-lanes.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
LANES=${LANES:-1000000}
ACTIVE=${ACTIVE:-1000}
RATE=${RATE:-10000}
SECS=${SECS:-10}
WARMUP=${WARMUP:-1}
MEMBERS=${MEMBERS:-4}
A2A_LANES=${A2A_LANES:-$((LANES / 2))}
A2A_RATE=${A2A_RATE:-12500}
A2A_NEW_RATE=${A2A_NEW_RATE:-2500}
A2A_FAST_RATE=${A2A_FAST_RATE:-25000}
RESTART_LANES=${RESTART_LANES:-$LANES}
RESTART_RECORDS=${RESTART_RECORDS:-10000000}
PUBS=${PUBS:-4}
INFLIGHT=${INFLIGHT:-1000}
PAYLOAD=${PAYLOAD:-100}
FSYNC=${FSYNC:-}
SECTIONS=${SECTIONS:-"idle fresh a2a"}
REPEAT=${REPEAT:-1}
PAUSE=${PAUSE:-3}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${LANEMQ_BIN:-$TARGET/release/lanemq}
BENCH=${LANEMQ_BENCH:-$TARGET/release/lanemq-bench}
[ -n "${SKIP_BUILD:-}" ] || cargo build --release -p lanemq -p lanemq-bench >&2
for b in "$BIN" "$BENCH"; do
  [ -x "$b" ] || { echo "$b not found (cargo build --release -p lanemq -p lanemq-bench)" >&2; exit 2; }
done
TMP=$(mktemp -d "${TMPDIR:-/tmp}/lanemq-bench-lanes.XXXXXX")
PID=""
ALL_PIDS=()
cleanup() {
  local p
  for p in "${ALL_PIDS[@]}"; do
    kill "$p" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  if [ "${KEEP_TMP:-0}" = 1 ]; then echo "temp dir kept: $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

. "$ROOT/interop/bench-lib.sh"
config() { # [nolite]
  {
    printf '[server]\nsys_interval_s = 0\nacl_file = "%s/allow.acl"\n' "$TMP"
    printf '[admin]\nenable = false\n[storage]\n'
    [ -z "$FSYNC" ] || printf 'fsync = "%s"\n' "$FSYNC"
    [ -z "${STORAGE_TOML:-}" ] || printf '%s\n' "$STORAGE_TOML"
    if [ -z "${NO_LITE:-}" ] && [ "${1:-}" != nolite ]; then
      printf '[[lite.parents]]\nname = "agents"\npattern = "agents/{lane}/#"\n'
      printf 'ttl_s = 2592000\nmode = "shared"\nmax_lanes = 100000000\n'
    fi
  } >"$TMP/cfg.toml"
  echo "default allow" >"$TMP/allow.acl"
}
start() { # $1 name (data dir and log) [nolite]: sets PORT and PID (also PORT_<name>, PID_<name>)
  config "${2:-}"
  sync # the write-back of an earlier section must not land in this one
  PORT=$(free_port)
  "$BIN" serve --mqtt "127.0.0.1:$PORT" --data-dir "$TMP/d-$1" --config "$TMP/cfg.toml" \
    >>"$TMP/broker-$1.log" 2>&1 &
  PID=$!
  ALL_PIDS+=("$PID")
  printf -v "PID_$1" %s "$PID"
  printf -v "PORT_$1" %s "$PORT"
  if ! wait_port "$PORT"; then
    echo "broker did not start:" >&2
    cat "$TMP/broker-$1.log" >&2
    exit 2
  fi
}
stop() { # [name]: the broker started last, or the named one
  local p=$PID
  [ -z "${1:-}" ] || { p=PID_$1; p=${!p}; }
  kill "$p" 2>/dev/null || true
  wait "$p" 2>/dev/null || true
}
use() { # name: run the next bench against that broker
  local v=PID_$1 w=PORT_$1
  PID=${!v}
  PORT=${!w}
}
# quiesce: after a create phase, write the dirty pages back (`sync`) and wait PAUSE seconds,
# so the active phase does not measure the write-back of the creation.
quiesce() {
  sync
  sleep "$PAUSE"
}
CMDS=()
LOADS=()
# bench NAME ARGS...: run lanemq-bench against the running broker, JSON to $TMP/NAME.json.
bench() {
  local name=$1
  shift
  local cmd=("$BENCH" --port "$PORT" --broker-pid "$PID" --payload "$PAYLOAD" --quiet "$@")
  CMDS+=("$name: lanemq-bench ${*}")
  echo "== $name (load $(cut -d' ' -f1-3 /proc/loadavg)): lanemq-bench $*" >&2
  LOADS+=("$name $(cut -d' ' -f1 /proc/loadavg)")
  local rc=0
  "${cmd[@]}" --json "$TMP/$name.json" >"$TMP/$name.txt" 2>&1 || rc=$?
  cat "$TMP/$name.txt" >&2
  if [ "$rc" != 0 ]; then
    echo "lanemq-bench $name exited with $rc" >&2
    tail -n 20 "$TMP"/broker-*.log >&2 || true
    exit 1
  fi
}
# field NAME PATH: a value from $TMP/NAME.json ("-" when absent).
field() {
  python3 - "$TMP/$1.json" "$2" <<'PY'
import json, sys
try:
    v = json.load(open(sys.argv[1]))
    for k in sys.argv[2].split("."):
        v = v[k]
except (OSError, KeyError, TypeError, ValueError):
    v = None
if v is None:
    print("-")
elif isinstance(v, float):
    print(f"{v:.0f}" if abs(v) >= 100 else f"{v:.2f}")
else:
    print(v)
PY
}
ms() { python3 -c 'import sys; v=sys.argv[1]; print("-" if v=="-" else "%.2f" % (float(v)/1000))' "$1"; }
ratio() { python3 -c 'import sys; a,b=sys.argv[1:]; print("-" if "-" in (a,b) or float(b)==0 else "%.2fx" % (float(a)/float(b)))' "$1" "$2"; }

# restart_probe NAME: kill -9 the broker NAME (started last), restart it on its data dir and
# time exec to the first CONNACK: sets RESTART_S, RESTART_LOG, RECORDS (MiB of log).
restart_probe() {
  kill -9 "$PID"
  wait "$PID" 2>/dev/null || true
  RECORDS=$(du -sm "$TMP/d-$1/log" | cut -f1)
  t0=$(date +%s.%N)
  "$BIN" serve --mqtt "127.0.0.1:$PORT" --data-dir "$TMP/d-$1" --config "$TMP/cfg.toml" \
    >>"$TMP/broker-$1.log" 2>&1 &
  PID=$!
  ALL_PIDS+=("$PID")
  RESTART_S=$(python3 - "$PORT" "$t0" <<'PY'
import socket, sys, time
port, t0 = int(sys.argv[1]), float(sys.argv[2])
# MQTT 5 CONNECT, clean start, keep alive 60, client id "restart-probe"
cid = b"restart-probe"
var = b"\x00\x04MQTT\x05\x02\x00\x3c\x00"
body = var + len(cid).to_bytes(2, "big") + cid
pkt = bytes([0x10, len(body)]) + body
while time.time() - t0 < 300:
    try:
        s = socket.create_connection(("127.0.0.1", port), 0.5)
        s.settimeout(120)
        s.sendall(pkt)
        if s.recv(1)[:1] == b"\x20":
            print("%.2f" % (time.time() - t0))
            sys.exit(0)
    except OSError:
        time.sleep(0.01)
print("-")
PY
)
  sleep 1
  RESTART_LOG=$(sed 's/\x1b\[[0-9;]*m//g' "$TMP/broker-$1.log" | grep "lite lanes recovered" | tail -1 |
    grep -o 'lanes=.*' || true)
}

CREATE=(--lanes create --publishers "$PUBS" --inflight "$INFLIGHT")
ACTIVE_ARGS=(--lanes active --lanes-active "$ACTIVE" --rate "$RATE" --duration "$SECS" --warmup "$WARMUP"
  --lanes-members "$MEMBERS" --lanes-offset latest --publishers "$PUBS" --inflight "$INFLIGHT" --drain 5)
START=$(date -u +%FT%TZ)

# idle and fresh: both brokers run side by side (only one has load at a time) and the active
# phase alternates between them REPEAT times, so drift of the machine hits both alike.
HAVE_IDLE= HAVE_FRESH=
if [[ " $SECTIONS " == *" idle "* ]]; then
  start idle
  HAVE_IDLE=1
  bench create --lanes-count "$LANES" "${CREATE[@]}"
  quiesce
fi
if [[ " $SECTIONS " == *" fresh "* ]]; then
  start fresh
  HAVE_FRESH=1
fi
for ((r = 1; r <= REPEAT; r++)); do
  if [ -n "$HAVE_IDLE" ]; then use idle; bench "active-idle-$r" "${ACTIVE_ARGS[@]}"; fi
  if [ -n "$HAVE_FRESH" ]; then use fresh; bench "active-fresh-$r" "${ACTIVE_ARGS[@]}"; fi
done
[ -z "$HAVE_IDLE" ] || stop idle
[ -z "$HAVE_FRESH" ] || stop fresh
if [[ " $SECTIONS " == *" a2a "* ]]; then
  start a2a
  bench a2a-create --lanes-count "$A2A_LANES" "${CREATE[@]}"
  quiesce
  A2A_ARGS=(--lanes active --lanes-active "$A2A_LANES" --lanes-pick random --duration "$SECS"
    --warmup "$WARMUP" --lanes-members "$MEMBERS" --lanes-offset latest --publishers "$PUBS"
    --inflight "$INFLIGHT" --drain 5)
  bench a2a-active --rate "$A2A_RATE" "${A2A_ARGS[@]}"
  bench a2a-new --rate "$A2A_RATE" --lanes-new-rate "$A2A_NEW_RATE" "${A2A_ARGS[@]}"
  bench a2a-fast --rate "$A2A_FAST_RATE" "${A2A_ARGS[@]}"
  restart_probe a2a
  RESTART_A2A=$RESTART_S RESTART_A2A_LOG=$RESTART_LOG RESTART_A2A_MB=$RECORDS
  stop
fi
if [[ " $SECTIONS " == *" restart "* ]]; then
  start restart
  bench restart-create --lanes-count "$RESTART_LANES" "${CREATE[@]}"
  FILL=$(((RESTART_RECORDS - RESTART_LANES) / PUBS))
  if [ "$FILL" -gt 0 ]; then
    bench restart-fill --publishers "$PUBS" --subscribers 0 --qos 1 --count "$FILL" --inflight "$INFLIGHT"
  fi
  restart_probe restart
  RESTART_R=$RESTART_S RESTART_R_LOG=$RESTART_LOG RESTART_R_MB=$RECORDS
  stop
fi
if [[ " $SECTIONS " == *" plain "* ]]; then
  start plain nolite
  bench active-plain "${ACTIVE_ARGS[@]}"
  stop
fi
if [[ " $SECTIONS " == *" control "* ]]; then
  start control nolite
  bench control --lanes-parent bench --lanes-count "$LANES" "${CREATE[@]}"
  stop
fi

# ---- report
echo
echo "### lanes benchmark ($START)"
echo
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/Mem:/{print $2}') GiB RAM;" \
  "git $(git rev-parse --short HEAD 2>/dev/null || echo '?'); fsync=${FSYNC:-default (always)}; payload $PAYLOAD B; QoS 1"
echo
echo "command: ${STORAGE_TOML:+STORAGE_TOML='$STORAGE_TOML' }LANES=$LANES ACTIVE=$ACTIVE RATE=$RATE SECS=$SECS WARMUP=$WARMUP MEMBERS=$MEMBERS REPEAT=$REPEAT" \
  "A2A_LANES=$A2A_LANES A2A_RATE=$A2A_RATE A2A_NEW_RATE=$A2A_NEW_RATE A2A_FAST_RATE=$A2A_FAST_RATE RESTART_LANES=$RESTART_LANES RESTART_RECORDS=$RESTART_RECORDS PUBS=$PUBS INFLIGHT=$INFLIGHT SECTIONS=\"$SECTIONS\" interop/bench-lanes.sh"
echo
echo "| figure | value | target |"
echo "|---|---|---|"
row() { echo "| $1 | $2 | ${3:-} |"; }
if [ -f "$TMP/create.json" ]; then
  row "lane creation ($LANES lanes, $PUBS publishers, window $INFLIGHT)" \
    "$(field create lanes.lanes_per_sec) lanes/s ($(field create lanes.acked) acked, $(field create lanes.ack_errors) refused, $(field create lanes.publish_secs) s)"
  row "broker RSS before / after the last PUBACK / settled" \
    "$(field create lanes.rss_before_kb) / $(field create lanes.rss_after_kb) / $(field create lanes.rss_settled_kb) KiB (quiet: $(field create lanes.settled) after $(field create lanes.settle_secs) s, broker CPU $(field create lanes.settle_cpu_secs) s meanwhile)"
  row "broker RSS per idle lane (settled − before) / lanes" "$(field create lanes.rss_per_lane_bytes) B" "≤ 200 B"
  if [ -f "$TMP/active-idle-1.json" ]; then
    later=$(field active-idle-1 lanes.rss_before_kb)
    row "broker RSS when the first active run started ($PAUSE s after sync), per idle lane" \
      "$later KiB, $(python3 -c 'import sys; b,a,n=sys.argv[1:]; print("-" if "-" in (b,a) else "%.0f" % ((float(a)-float(b))*1024/float(n)))' "$(field create lanes.rss_before_kb)" "$later" "$LANES") B" "≤ 200 B"
  fi
fi
if [ -f "$TMP/control.json" ]; then
  row "control: RSS per message outside any parent ($LANES topics)" "$(field control lanes.rss_per_lane_bytes) B" ""
fi
active_rows() { # NAME LABEL
  [ -f "$TMP/$1.json" ] || return 0
  row "$2: latency p50 / p95 / p99 / max" \
    "$(ms "$(field "$1" lanes.latency.p50_us)") / $(ms "$(field "$1" lanes.latency.p95_us)") / $(ms "$(field "$1" lanes.latency.p99_us)") / $(ms "$(field "$1" lanes.latency.max_us)") ms" "${3:-}"
  row "$2: published / delivered / lost / dup" \
    "$(field "$1" lanes.published) / $(field "$1" lanes.delivered) / $(field "$1" lanes.lost) / $(field "$1" lanes.duplicates) ($(field "$1" lanes.msgs_per_sec) msg/s in)" "lost 0"
  row "$2: per-lane order: sequence backwards / gaps; lane-offset breaks / backwards; missing lane props; stale" \
    "$(field "$1" lanes.seq_backwards) / $(field "$1" lanes.seq_gaps); $(field "$1" lanes.offset_breaks) / $(field "$1" lanes.offset_backwards); $(field "$1" lanes.missing_props); $(field "$1" lanes.stale)" "0 / 0; 0 / 0; 0; 0"
  row "$2: messages per member" "$(field "$1" lanes.per_member)" ""
}
# median NAME: the run NAME-<r> with the median p99 (the lower middle one for an even REPEAT).
median() {
  python3 - "$TMP" "$1" "$REPEAT" <<'PY'
import json, sys
tmp, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs = []
for r in range(1, n + 1):
    try:
        runs.append((json.load(open(f"{tmp}/{name}-{r}.json"))["lanes"]["latency"]["p99_us"], r))
    except (OSError, KeyError, TypeError, ValueError):
        pass
runs.sort()
print(f"{name}-{runs[(len(runs) - 1) // 2][1]}" if runs else "-")
PY
}
p99s() { # NAME: the p99 of every run, ms
  local r out=""
  for ((r = 1; r <= REPEAT; r++)); do out+="$(ms "$(field "$1-$r" lanes.latency.p99_us)") "; done
  echo "${out% }"
}
MI=$(median active-idle)
MF=$(median active-fresh)
[ "$MI" = - ] || active_rows "$MI" "$ACTIVE active lanes at $RATE msg/s, $MEMBERS members, with $LANES idle lanes"
[ "$REPEAT" = 1 ] || [ "$MI" = - ] || row "with $LANES idle lanes: p99 of each run" "$(p99s active-idle) ms"
[ "$MF" = - ] || active_rows "$MF" "$ACTIVE active lanes at $RATE msg/s, $MEMBERS members, fresh broker"
[ "$REPEAT" = 1 ] || [ "$MF" = - ] || row "fresh broker: p99 of each run" "$(p99s active-fresh) ms"
if [ "$MI" != - ] && [ "$MF" != - ]; then
  row "p99 with idle lanes / p99 fresh$([ "$REPEAT" = 1 ] || echo " (medians of $REPEAT)")" \
    "$(ratio "$(field "$MI" lanes.latency.p99_us)" "$(field "$MF" lanes.latency.p99_us)")" "≤ 1.25x"
fi
active_rows active-plain "baseline without lanes (plain \$share round robin), $ACTIVE topics at $RATE msg/s"
if [ -f "$TMP/a2a-create.json" ]; then
  row "A2A: $A2A_LANES lanes created" "$(field a2a-create lanes.lanes_per_sec) lanes/s, RSS per lane $(field a2a-create lanes.rss_per_lane_bytes) B"
fi
active_rows a2a-active "A2A: $A2A_RATE msg/s to random lanes of $A2A_LANES"
if [ -f "$TMP/a2a-active.json" ]; then
  row "A2A p95" "$(ms "$(field a2a-active lanes.latency.p95_us)") ms" "≤ 10 ms"
fi
active_rows a2a-new "A2A: $A2A_RATE msg/s to random lanes of $A2A_LANES + $A2A_NEW_RATE msg/s to new lanes"
if [ -f "$TMP/a2a-new.json" ]; then
  row "A2A with lanes created under load, p95" "$(ms "$(field a2a-new lanes.latency.p95_us)") ms" "≤ 10 ms"
fi
active_rows a2a-fast "A2A: $A2A_FAST_RATE msg/s to random lanes of $A2A_LANES"
if [ -f "$TMP/a2a-fast.json" ]; then
  row "A2A at $A2A_FAST_RATE msg/s, p95" "$(ms "$(field a2a-fast lanes.latency.p95_us)") ms" "≤ 20 ms"
fi
if [ -n "${RESTART_A2A:-}" ]; then
  row "restart after kill -9 ($RESTART_A2A_MB MiB of log, $A2A_LANES+ lanes): exec to first CONNACK" "$RESTART_A2A s ($RESTART_A2A_LOG)" ""
fi
if [ -n "${RESTART_R:-}" ]; then
  row "restart after kill -9: $RESTART_LANES lanes, $RESTART_RECORDS records ($RESTART_R_MB MiB of log): exec to first CONNACK" "$RESTART_R s ($RESTART_R_LOG)" "≤ 1 s"
fi
echo
echo "lanemq-bench commands (--port/--broker-pid/--payload $PAYLOAD/--quiet added; a fresh broker per section):"
for c in "${CMDS[@]}"; do echo "    $c"; done
echo "1-minute load average when each started (a shared machine skews latency): ${LOADS[*]}"
