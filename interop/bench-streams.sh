#!/usr/bin/env bash
# Named-stream figures for docs/benchmarks.md (not part of the test command):
#   1. publish throughput (QoS 1, 4 publishers, 100 B, no subscriber) with 0, 1, 10 and 10,000
#      streams defined, and mosquitto (Debian package) with the same load in the same run.
#      With N > 0 streams, stream 0 matches every bench topic (`lanemq-bench/#`) and the others
#      are distinct filters of a device fleet (`fleet/<i>/+/telemetry`, `fleet/<i>/status/#`)
#      that a bench topic never matches: the filter index has N entries to search on every publish.
#   2. replay of REPLAY messages (100 B) from `earliest` to one client, broker RSS growth,
#      a cold run (broker just restarted) and a warm one.
# The broker runs its default configuration (`fsync = "always"`, default index cache); ROUNDS
# rounds, the configurations alternating inside each round; median and worst are printed.
# Every load is bounded (--count); traffic on 127.0.0.1 only.
#
# Environment: COUNT=250000 (per publisher)  REPLAY=1000000  STREAMS="0 1 10 10000"  ROUNDS=3
#              SKIP_BUILD=1  SECTIONS="publish replay"  MOSQUITTO=/usr/sbin/mosquitto
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
COUNT=${COUNT:-250000}
REPLAY=${REPLAY:-1000000}
STREAMS=${STREAMS:-"0 1 10 10000"}
SECTIONS=${SECTIONS:-"publish replay"}
ROUNDS=${ROUNDS:-3}
MOSQUITTO=${MOSQUITTO:-/usr/sbin/mosquitto}
BIN=target/release/lanemq
BENCH=target/release/lanemq-bench
[ -n "${SKIP_BUILD:-}" ] || cargo build --release -p lanemq -p lanemq-bench >&2
TMP=$(mktemp -d "${TMPDIR:-/tmp}/lanemq-bench-streams.XXXXXX")
PID=""
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

. "$ROOT/interop/bench-lib.sh"
config() { # $1 number of streams -> $TMP/cfg.toml
  {
    printf '[server]\nsys_interval_s = 0\nacl_file = "%s/allow.acl"\n' "$TMP"
    printf '[admin]\nenable = false\n'
    printf '[streams_config]\nmax_stream_count = 20000\n'
    python3 -c '
import sys
n = int(sys.argv[1])
for i in range(n):
    if i == 0:
        f = "lanemq-bench/#"
    elif i % 2:
        f = "fleet/%d/+/telemetry" % i
    else:
        f = "fleet/%d/status/#" % i
    print("[[streams]]\nname = \"s%d\"\ntopic_filter = \"%s\"" % (i, f))
' "$1"
  } >"$TMP/cfg.toml"
  echo "default allow" >"$TMP/allow.acl"
}
start() { # $1 data dir
  PORT=$(free_port)
  "$BIN" serve --mqtt "127.0.0.1:$PORT" --data-dir "$1" --config "$TMP/cfg.toml" >>"$TMP/broker.log" 2>&1 &
  PID=$!
  wait_port "$PORT"
}
stop() { kill "$PID"; wait "$PID" 2>/dev/null || true; PID=""; }
field() { python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); v=r
for k in sys.argv[2].split("."): v=v[k]
print(round(v) if isinstance(v,float) and v>100 else v)' "$1" "$2"; }

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), git $(git rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg)"
PUB=(--publishers 4 --subscribers 0 --qos 1 --payload 100 --count "$COUNT" --inflight 500 --quiet)

# One row per configuration: median and worst of the rounds in $TMP/rows (name value value...).
summary() { # $1 file, $2.. column titles
  python3 - "$@" <<'PY'
import sys, statistics
def fmt(v):
    return "%d" % round(v) if v >= 100 else "%.2f" % v
path, titles = sys.argv[1], sys.argv[2:]
rows = {}
order = []
for line in open(path):
    name, *vals = line.rstrip("\n").split("\t")
    if name not in rows:
        order.append(name)
        rows[name] = []
    rows[name].append([float(v) for v in vals])
print("%-30s" % "", "".join("%26s" % t for t in titles))
for name in order:
    cols = list(zip(*rows[name]))
    cells = []
    for i, c in enumerate(cols):
        med = statistics.median(c)
        # worst: lowest rate for "/s" columns, highest for the others (memory, seconds)
        worst = min(c) if "/s" in titles[i] else max(c)
        cells.append("%26s" % ("%s (worst %s)" % (fmt(med), fmt(worst))))
    print("%-30s" % name, "".join(cells))
PY
}

if [[ " $SECTIONS " == *" publish "* ]]; then
  echo "== publish: QoS 1, 4 publishers x $COUNT messages of 100 B, no subscriber, $ROUNDS rounds"
  : >"$TMP/pub.rows"
  for round in $(seq "$ROUNDS"); do
    for n in $STREAMS; do
      config "$n"
      start "$TMP/d-$n"
      "$BENCH" --port "$PORT" "${PUB[@]}" --broker-pid "$PID" --json "$TMP/p-$n.json" >/dev/null
      printf 'lanemq, %s streams\t%s\t%s\n' "$n" "$(field "$TMP/p-$n.json" msgs_per_sec_in)" \
        "$(( $(field "$TMP/p-$n.json" broker_rss_max_kb) / 1024 ))" >>"$TMP/pub.rows"
      stop
      rm -rf "$TMP/d-$n"
    done
    if [ -x "$MOSQUITTO" ]; then
      PORT=$(free_port)
      printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\nmax_inflight_messages 500\nmax_queued_messages 0\n' "$PORT" >"$TMP/mosq.conf"
      "$MOSQUITTO" -c "$TMP/mosq.conf" >>"$TMP/mosq.log" 2>&1 &
      PID=$!
      wait_port "$PORT"
      "$BENCH" --port "$PORT" "${PUB[@]}" --broker-pid "$PID" --json "$TMP/p-mosq.json" >/dev/null
      printf 'mosquitto (no streams)\t%s\t%s\n' "$(field "$TMP/p-mosq.json" msgs_per_sec_in)" \
        "$(( $(field "$TMP/p-mosq.json" broker_rss_max_kb) / 1024 ))" >>"$TMP/pub.rows"
      stop
    fi
    echo "round $round done, load $(cut -d' ' -f1-3 /proc/loadavg)"
  done
  [ -x "$MOSQUITTO" ] || echo "mosquitto not installed ($MOSQUITTO): apt-get install -y mosquitto"
  summary "$TMP/pub.rows" "msg/s in" "RSS max MiB"
fi

if [[ " $SECTIONS " == *" replay "* ]]; then
  echo "== replay: $REPLAY messages of 100 B from earliest to one client (QoS 0 subscription), $ROUNDS rounds"
  config 1
  start "$TMP/replay"
  per=$(( REPLAY / 4 ))
  "$BENCH" --port "$PORT" --publishers 4 --subscribers 0 --qos 1 --payload 100 --count "$per" \
    --inflight 500 --quiet >/dev/null
  stop
  echo "data dir after the load: $(du -sm "$TMP/replay" | cut -f1) MiB ($(du -sm "$TMP/replay/log" 2>/dev/null | cut -f1) MiB log, $(du -sm "$TMP/replay/streams" 2>/dev/null | cut -f1) MiB stream entries, $(du -sm "$TMP/replay/index" 2>/dev/null | cut -f1) MiB index)"
  : >"$TMP/replay.rows"
  for round in $(seq "$ROUNDS"); do
    for run in cold warm; do
      [ "$run" = cold ] && start "$TMP/replay"
      "$BENCH" --port "$PORT" --stream-replay s0 --count "$(( per * 4 ))" --broker-pid "$PID" \
        --json "$TMP/r-$run.json" --quiet >/dev/null
      printf '%s\t%s\t%s\t%s\t%s\n' "$run" "$(field "$TMP/r-$run.json" replay.msgs_per_sec)" \
        "$(field "$TMP/r-$run.json" replay.first_message_secs)" \
        "$(( $(field "$TMP/r-$run.json" replay.rss_before_kb) / 1024 ))" \
        "$(( $(field "$TMP/r-$run.json" replay.rss_growth_kb) / 1024 ))" >>"$TMP/replay.rows"
    done
    stop
    echo "round $round done, load $(cut -d' ' -f1-3 /proc/loadavg)"
  done
  summary "$TMP/replay.rows" "msg/s" "first after s" "RSS before MiB" "RSS growth MiB"
fi
