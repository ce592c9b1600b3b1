#!/usr/bin/env bash
# One lanemq node against a three-node lanemq cluster on NATS JetStream, on this machine, with
# the same load generator (docs/benchmarks.md, "Cluster mode"). Starts three nats-server
# processes (JetStream, cluster routes, the log stream at R3), three lanemq nodes with
# --cluster, and one lanemq without it; rounds alternate between the two. Every broker runs its
# default configuration (the cluster's: replicas 3).
#
#   bash interop/bench-cluster.sh
#
# Scenarios (lanemq-bench, all clients on one node, 64 B payloads):
#   fanin_q1   10 publishers -> 1 subscriber, QoS 1, as fast as acks come (inflight 100)
#   fanin_q0   10 publishers -> 1 subscriber, QoS 0, as fast as possible
#   latency_q1 the same as fanin_q1 at a fixed 5,000 msg/s: p99 without queueing
# CPU per message: user + system time of every broker process (one lanemq; or three lanemq
# and three nats-server) divided by the messages received.
#
# Environment: ROUNDS=3 DURATION=5 SCENARIOS="fanin_q1 fanin_q0 latency_q1"
#   RESULTS=target/bench-results/cluster-<time>
#   LANEMQ_BIN=target/release/lanemq BENCH_BIN=target/release/lanemq-bench
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5}
LANEMQ_BIN=${LANEMQ_BIN:-$ROOT/target/release/lanemq}
BENCH_BIN=${BENCH_BIN:-$ROOT/target/release/lanemq-bench}
RESULTS=${RESULTS:-$ROOT/target/bench-results/cluster-$(date +%Y%m%d-%H%M%S)}
NATS_SERVER=${NATS_SERVER:-$(command -v nats-server || echo /usr/sbin/nats-server)}
[ -x "$NATS_SERVER" ] || { echo "nats-server missing (apt-get install nats-server)" >&2; exit 2; }
[ -x "$LANEMQ_BIN" ] && [ -x "$BENCH_BIN" ] || { echo "cargo build --release --bins first" >&2; exit 2; }
mkdir -p "$RESULTS"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/lanemq-bench-cluster.XXXXXX")
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  sleep 1
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
  local i
  for ((i = 0; i < 600; i++)); do
    timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}
cpu_ticks() { # summed utime+stime of the given pids
  local t=0 p
  for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  echo "$t"
}

NP=($(port) $(port) $(port)); RP=($(port) $(port) $(port))
NATS_PIDS=()
for i in 0 1 2; do
  routes=""
  for j in 0 1 2; do [ "$j" = "$i" ] || routes+="\"nats-route://127.0.0.1:${RP[$j]}\", "; done
  cat >"$TMP/nats$i.conf" <<EOF
server_name: n$i
listen: 127.0.0.1:${NP[$i]}
jetstream { store_dir: "$TMP/js$i" }
cluster { name: bench, listen: 127.0.0.1:${RP[$i]}, routes: [ ${routes%, } ] }
EOF
  "$NATS_SERVER" -c "$TMP/nats$i.conf" >"$TMP/nats$i.log" 2>&1 &
  NATS_PIDS+=($!); PIDS+=($!)
done
URLS="nats://127.0.0.1:${NP[0]},nats://127.0.0.1:${NP[1]},nats://127.0.0.1:${NP[2]}"
NODE_PIDS=(); NODE_PORTS=()
for i in 0 1 2; do
  p=$(port)
  "$LANEMQ_BIN" serve --mqtt "127.0.0.1:$p" --http off --data-dir "$TMP/node$i" \
    --cluster "$URLS" --node-id "node$i" >"$TMP/node$i.log" 2>&1 &
  NODE_PIDS+=($!); PIDS+=($!); NODE_PORTS+=($p)
  wait_port "$p" || { echo "cluster node $i did not start"; tail "$TMP/node$i.log"; exit 1; }
done
SP=$(port)
"$LANEMQ_BIN" serve --mqtt "127.0.0.1:$SP" --http off --data-dir "$TMP/single" >"$TMP/single.log" 2>&1 &
SINGLE_PID=$!; PIDS+=($!)
wait_port "$SP" || { echo "single node did not start"; exit 1; }
{
  echo "date: $(date -Is)"; echo "nproc: $(nproc)"; echo "git: $(git rev-parse --short HEAD)"
  echo "nats-server: $("$NATS_SERVER" --version 2>&1 | head -1)"; echo "rounds: $ROUNDS duration: $DURATION"
} | tee "$RESULTS/machine.txt"

run() { # name setup port lanemq-pids [-- nats-pids]
  local name=$1 setup=$2 p=$3; shift 3
  local lpids=() npids=() seen=0 x
  for x in "$@"; do
    if [ "$x" = -- ]; then seen=1; elif [ $seen = 0 ]; then lpids+=("$x"); else npids+=("$x"); fi
  done
  local args=(--port "$p" --publishers 10 --subscribers 1 --payload 64 --duration "$DURATION"
    --warmup 1 --drain 10 --inflight 100 --quiet --topic-prefix "bench/$name/$setup/$r")
  case $name in
    fanin_q1) args+=(--qos 1) ;;
    fanin_q0) args+=(--qos 0) ;;
    latency_q1) args+=(--qos 1 --rate 5000) ;;
  esac
  local hz t0 t1 n0 n1
  hz=$(getconf CLK_TCK)
  t0=$(cpu_ticks "${lpids[@]}")
  n0=$(cpu_ticks "${npids[@]}")
  echo "[bench] $name $setup round $r (load $(cut -d' ' -f1-3 /proc/loadavg))"
  "$BENCH_BIN" "${args[@]}" --json "$RESULTS/$name.$setup.r$r.json" >"$RESULTS/$name.$setup.r$r.txt" 2>&1
  t1=$(cpu_ticks "${lpids[@]}")
  n1=$(cpu_ticks "${npids[@]}")
  python3 - "$RESULTS/$name.$setup.r$r.json" "$(( t1 - t0 ))" "$(( n1 - n0 ))" "$hz" <<'EOF'
import json, sys
path, lt, nt, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
d = json.load(open(path))
n = max(1, d["received"])
d["lanemq_cpu_us_per_msg"] = lt * 1e6 / hz / n
d["nats_cpu_us_per_msg"] = nt * 1e6 / hz / n
d["cluster_cpu_us_per_msg"] = (lt + nt) * 1e6 / hz / n
json.dump(d, open(path, "w"))
lat = d.get("latency") or {}
print("    %.1fk msg/s out, p99 %.0f us, CPU per message %.2f us (lanemq %.2f + nats-server %.2f), loss %d" % (
    d["msgs_per_sec_out"] / 1e3, lat.get("p99_us", 0), d["cluster_cpu_us_per_msg"],
    d["lanemq_cpu_us_per_msg"], d["nats_cpu_us_per_msg"], d["loss"]))
EOF
}

for r in $(seq 1 "$ROUNDS"); do
  for name in ${SCENARIOS:-fanin_q1 fanin_q0 latency_q1}; do
    run "$name" single "$SP" "$SINGLE_PID"
    run "$name" cluster3 "${NODE_PORTS[0]}" "${NODE_PIDS[@]}" -- "${NATS_PIDS[@]}"
  done
done

python3 - "$RESULTS" <<'EOF' | tee "$RESULTS/summary.md"
import glob, json, os, statistics, sys
res = sys.argv[1]
rows = {}
for f in sorted(glob.glob(os.path.join(res, "*.json"))):
    name, setup = os.path.basename(f).split(".")[:2]
    d = json.load(open(f))
    lat = d.get("latency") or {}
    rows.setdefault((name, setup), []).append((d["msgs_per_sec_out"], lat.get("p99_us", 0),
        d["cluster_cpu_us_per_msg"], d.get("lanemq_cpu_us_per_msg", 0), d.get("nats_cpu_us_per_msg", 0)))
print("| scenario | setup | msg/s out, median (worst) | p99 µs, median (worst) | CPU µs/msg, median (lanemq + nats-server) |")
print("|---|---|---|---|---|")
for (name, setup), v in sorted(rows.items()):
    med = lambda i: statistics.median(x[i] for x in v)
    print("| %s | %s | %.1fk (%.1fk) | %d (%d) | %.1f (%.1f + %.1f) |" % (
        name, setup, med(0) / 1e3, min(x[0] for x in v) / 1e3, med(1), max(x[1] for x in v),
        med(2), med(3), med(4)))
EOF
