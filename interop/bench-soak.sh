#!/usr/bin/env bash
# Soak: does anything grow without bound under a steady load? (Not part of the test command.)
#
# Starts the broker with its default configuration (a temporary data directory; only the MQTT
# and admin ports are chosen free), drives a bounded steady QoS 1 load with lanemq-bench
# (PUBLISHERS publishers sending PAYLOAD-byte messages at SOAK_RATE msg/s in total to
# SUBSCRIBERS subscribers, for SOAK_SECS seconds), and every SAMPLE_S seconds records the
# broker's RSS (/proc/PID/status VmRSS), its open file descriptors (/proc/PID/fd, and how many
# of them are log segments), the disk use of the data directory and its log segments. Writes
# the samples to a CSV, a family data file for interop/bench_plot.py and its chart (through
# interop/bench-plot.sh), and prints the first and last samples.
#
#   SOAK_SECS=300 bash interop/bench-soak.sh
#   LANEMQ_BIN=/tmp/old-lanemq LABEL=before SOAK_SECS=300 SKIP_BUILD=1 bash interop/bench-soak.sh
#   LABEL=after COMPARE="before=target/bench-results/soak-X/soak.csv" bash interop/bench-soak.sh
#
# Environment:
#   SOAK_SECS=3600      load duration (the broker runs a few seconds more)
#   SOAK_RATE=40000     total publish rate, msg/s
#   SAMPLE_S=10         sampling period, seconds
#   PAYLOAD=256  PUBLISHERS=8  SUBSCRIBERS=1  INFLIGHT=100 (QoS 1 window per publisher)
#   LANEMQ_BIN=target/release/lanemq  BENCH_BIN=target/release/lanemq-bench
#   SKIP_BUILD=1        do not run `cargo build --release -p lanemq -p lanemq-bench` first
#   CONFIG=FILE         a configuration file instead of the defaults (e.g. to compare a
#                       storage.retention_max_bytes); unset: no file, the embedded default
#   LABEL=lanemq        the series name of this run in the chart
#   COMPARE="name=CSV ..."  earlier runs' soak.csv drawn next to this one
#   RESULTS=target/bench-results/soak-<time>
# Output in $RESULTS: soak.csv (t_s, rss_kib, fds, segment_fds, data_bytes, log_bytes,
# segments), soak.json and soak.svg (the chart), bench.json / bench.txt (lanemq-bench),
# broker.log, machine.txt, summary.txt.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
SOAK_SECS=${SOAK_SECS:-3600}
SOAK_RATE=${SOAK_RATE:-40000}
SAMPLE_S=${SAMPLE_S:-10}
PAYLOAD=${PAYLOAD:-256}
PUBLISHERS=${PUBLISHERS:-8}
SUBSCRIBERS=${SUBSCRIBERS:-1}
INFLIGHT=${INFLIGHT:-100}
LANEMQ_BIN=${LANEMQ_BIN:-target/release/lanemq}
BENCH_BIN=${BENCH_BIN:-target/release/lanemq-bench}
LABEL=${LABEL:-lanemq}
COMPARE=${COMPARE:-}
RESULTS=${RESULTS:-$ROOT/target/bench-results/soak-$(date +%Y%m%d-%H%M%S)}
[ -n "${SKIP_BUILD:-}" ] || cargo build --release -p lanemq -p lanemq-bench >&2
mkdir -p "$RESULTS"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/lanemq-soak.XXXXXX")
DATA=$TMP/data
PID=""
BENCH_PID=""
cleanup() {
  [ -n "$BENCH_PID" ] && kill "$BENCH_PID" 2>/dev/null && wait "$BENCH_PID" 2>/dev/null || true
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

. "$ROOT/interop/bench-lib.sh"

{
  echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/Mem:/ {print $2 " GiB"}')"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (work tree modified)')"
  echo "binary: $LANEMQ_BIN ($(stat -c %y "$LANEMQ_BIN" | cut -d. -f1))"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "open files limit: soft $(ulimit -Sn), hard $(ulimit -Hn)"
  echo "load: $PUBLISHERS publishers -> $SUBSCRIBERS subscribers, QoS 1, $PAYLOAD B, $SOAK_RATE msg/s, ${SOAK_SECS}s; sample every ${SAMPLE_S}s"
  echo "config: ${CONFIG:-the embedded default}"
} | tee "$RESULTS/machine.txt"

PORT=$(free_port)
args=(serve --mqtt "127.0.0.1:$PORT" --http 127.0.0.1:0 --data-dir "$DATA")
[ -z "${CONFIG:-}" ] || args+=(--config "$CONFIG")
"$LANEMQ_BIN" "${args[@]}" >"$RESULTS/broker.log" 2>&1 &
PID=$!
wait_port "$PORT" || { echo "broker did not start; see $RESULTS/broker.log" >&2; exit 1; }

CSV=$RESULTS/soak.csv
echo "t_s,rss_kib,fds,segment_fds,data_bytes,log_bytes,segments" >"$CSV"
T0=$(date +%s.%N)
sample() {
  local t rss fds segfds data logb segs
  [ -d "/proc/$PID" ] || return 1
  t=$(python3 -c "import time; print(round(time.time() - $T0, 1))")
  # Files come and go while this runs (segments, journal rewrites): never fail on that.
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$PID/status" 2>/dev/null || true)
  fds=$(find "/proc/$PID/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l || true)
  segfds=$(find "/proc/$PID/fd" -mindepth 1 -maxdepth 1 -lname "$DATA/log/*.seg*" 2>/dev/null | wc -l || true)
  data=$(du -sB1 "$DATA" 2>/dev/null | cut -f1 || true)
  logb=$(du -sB1 "$DATA/log" 2>/dev/null | cut -f1 || true)
  segs=$(find "$DATA/log" -maxdepth 1 -name '*.seg' 2>/dev/null | wc -l || true)
  echo "$t,${rss:-0},$fds,$segfds,${data:-0},${logb:-0},$segs" >>"$CSV"
  printf '\r%6ss  RSS %6d MiB  fds %5d (segments %4d)  data %7d MiB  ' "$t" $((${rss:-0} / 1024)) "$fds" "$segfds" $((${data:-0} >> 20)) >&2
}
sample

"$BENCH_BIN" --port "$PORT" --publishers "$PUBLISHERS" --subscribers "$SUBSCRIBERS" --qos 1 \
  --payload "$PAYLOAD" --topic-mode fan-in --rate "$SOAK_RATE" --inflight "$INFLIGHT" \
  --duration "$SOAK_SECS" --quiet --json "$RESULTS/bench.json" --broker-pid "$PID" \
  >"$RESULTS/bench.txt" 2>&1 &
BENCH_PID=$!
next=$SAMPLE_S
while kill -0 "$BENCH_PID" 2>/dev/null; do
  now=$(python3 -c "import time; print(time.time() - $T0)")
  wait_s=$(python3 -c "print(max(0.0, $next - $now))")
  sleep "$wait_s"
  kill -0 "$BENCH_PID" 2>/dev/null || break
  sample || break
  next=$((next + SAMPLE_S))
done
wait "$BENCH_PID" || echo "lanemq-bench exited with status $? (see $RESULTS/bench.txt)" >&2
BENCH_PID=""
sample || true
echo >&2
kill "$PID"
wait "$PID" 2>/dev/null || true
PID=""

# The summary, the family data file and the chart.
python3 - "$RESULTS" "$LABEL" "$COMPARE" <<'PY' | tee "$RESULTS/summary.txt"
import csv, json, os, sys

results, label, compare = sys.argv[1], sys.argv[2], sys.argv[3]

def rows(path):
    with open(path) as fh:
        return [{k: float(v) for k, v in r.items()} for r in csv.DictReader(fh)]

runs = [(label, rows(os.path.join(results, "soak.csv")))]
for item in compare.split():
    name, _, path = item.partition("=")
    runs.append((name, rows(path)))

bench = {}
try:
    with open(os.path.join(results, "bench.json")) as fh:
        bench = json.load(fh)
except (OSError, ValueError):
    pass
machine = open(os.path.join(results, "machine.txt")).read().splitlines()

MIB = 1 << 20
# (summary label, CSV column, multiplier, unit, chart panel title or None)
metrics = [
    ("RSS", "rss_kib", 1 / 1024, "MiB", "broker RSS"),
    ("open file descriptors", "fds", 1, "fds", "broker open file descriptors"),
    ("of which log segments", "segment_fds", 1, "fds", "log segment files open in the broker"),
    ("data directory on disk", "data_bytes", 1 / MIB, "MiB", "data directory on disk"),
    ("log segment files", "segments", 1, "files", None),
]
for name, r in runs:
    first, last = r[0], r[-1]
    print(f"{name}: {len(r)} samples over {last['t_s']:.0f} s")
    for title, key, mul, unit, _ in metrics:
        print(f"  {title:<24} start {first[key] * mul:>10,.1f} {unit:<5}  end {last[key] * mul:>10,.1f} {unit:<5}  max {max(x[key] for x in r) * mul:>10,.1f} {unit}")
if bench:
    print(f"load ({label}): published {bench.get('published')}, {bench.get('msgs_per_sec_in') or 0:,.0f} msg/s in, "
          f"{bench.get('msgs_per_sec_out') or 0:,.0f} msg/s out")

# About a dozen groups along the run: the sample nearest to each time, for every run.
end = max(r[-1]["t_s"] for _, r in runs)
step = max(1, round(end / 12))
times = sorted({min(end, k * step) for k in range(0, 13)})

def at(r, t):
    best = min(r, key=lambda x: abs(x["t_s"] - t))
    return best if abs(best["t_s"] - t) <= step / 2 + 1 else None

def unit_t(t):
    return f"{t / 60:.0f} min" if end >= 600 else f"{t:.0f} s"

panels = []
for _, key, mul, unit, title in metrics:
    if title is None:
        continue
    values = {}
    for name, r in runs:
        vs = []
        for t in times:
            x = at(r, t)
            vs.append(None if x is None else round(x[key] * mul, 1))
        values[name] = vs
    panels.append({"title": title, "unit": unit,
                   "lower_is_better": True, "scale": "linear", "groups": [unit_t(t) for t in times],
                   "series": [n for n, _ in runs], "values": values})
fam = {
    "family": "soak",
    "title": "Soak: a default broker under a steady QoS 1 load",
    "source": "interop/bench-soak.sh",
    "machine": "; ".join(l for l in machine if l.startswith(("machine", "load:"))),
    "loadavg": next((l.split(": ", 1)[1] for l in machine if l.startswith("load average")), None),
    "note": "One sample per group (the nearest to that time), one run per series.",
    "panels": panels,
}
with open(os.path.join(results, "soak.json"), "w") as fh:
    json.dump(fam, fh, indent=1)
PY
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$RESULTS/machine.txt"
bash "$ROOT/interop/bench-plot.sh" --data "$RESULTS/soak.json" --out-dir "$RESULTS" >/dev/null ||
  echo "no chart (see interop/bench-plot.sh); the CSV and soak.json are in $RESULTS" >&2
echo "results: $RESULTS"
