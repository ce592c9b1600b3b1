#!/usr/bin/env bash
# One lanemq node against a three-node lanemq cluster on NATS JetStream, on this machine, with
# the same load generator (docs/benchmarks.md, "Cluster mode"). Starts three nats-server
# processes (JetStream, cluster routes, the log stream at R3), three lanemq nodes with
# --cluster, and one lanemq without it; rounds alternate between the two. Every broker runs its
# default configuration (the cluster's: replicas 3).
#
#   bash interop/bench-cluster.sh
#
# Setups, in alternating rounds: `single` (one lanemq without --cluster), `cluster3` (three
# lanemq nodes on the three nats-servers, JetStream R3) and `natsmqtt` (nats-server's own MQTT
# listener on the same three nats-servers: the peer; MQTT 3.1.1, QoS 0/1 only).
#
# Scenarios (lanemq-bench, 64 B payloads, MQTT 3.1.1 so that every setup runs the same):
#   fanin_q1   10 publishers -> 1 subscriber, QoS 1, as fast as acks come (inflight 100),
#              all clients on one node
#   cross_q1   the same with the publishers on node 1 and the subscriber on node 2
#   fanin_q0   10 publishers -> 1 subscriber, QoS 0, as fast as possible
#   latency_q1 the same as fanin_q1 at a fixed 5,000 msg/s: p99 without queueing
#   flood_q0   4 QoS 0 publishers flooding one topic (as fast as they can) while one paced
#              QoS 0 client publishes 1,000 msg/s to its own subscriber on the same node:
#              the paced client's p99 and loss (a flood must not queue everyone)
# CPU per message: user + system time of every broker process (one lanemq; or three lanemq
# and three nats-server; or the three nats-servers) divided by the messages received.
#
# Environment: ROUNDS=3 DURATION=5 SCENARIOS="fanin_q1 cross_q1 fanin_q0 latency_q1 flood_q0"
#   SETUPS="single cluster3 natsmqtt"
#   RESULTS=target/bench-results/cluster-<time>
#   LANEMQ_BIN=target/release/lanemq BENCH_BIN=target/release/lanemq-bench
#   CLUSTER_CONFIG=FILE  a configuration file for the three cluster nodes (a row that is not
#   the default configuration says so)
#   SKIP_BUILD=1 (otherwise: cargo build --release first; nats-server is installed from
#   Debian's packages when missing)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5}
LANEMQ_BIN=${LANEMQ_BIN:-$ROOT/target/release/lanemq}
BENCH_BIN=${BENCH_BIN:-$ROOT/target/release/lanemq-bench}
RESULTS=${RESULTS:-$ROOT/target/bench-results/cluster-$(date +%Y%m%d-%H%M%S)}
NATS_SERVER=${NATS_SERVER:-$(command -v nats-server || echo /usr/sbin/nats-server)}
if [ ! -x "$NATS_SERVER" ]; then
  echo "installing nats-server (Debian)" >&2
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nats-server; } >&2
  NATS_SERVER=$(command -v nats-server || echo /usr/sbin/nats-server)
fi
[ -x "$NATS_SERVER" ] || { echo "nats-server missing and apt-get install nats-server failed" >&2; exit 2; }
[ -n "${SKIP_BUILD:-}" ] || cargo build --release -p lanemq -p lanemq-bench >&2
[ -x "$LANEMQ_BIN" ] && [ -x "$BENCH_BIN" ] || { echo "cargo build --release -p lanemq -p lanemq-bench failed" >&2; exit 2; }
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

NP=($(port) $(port) $(port)); RP=($(port) $(port) $(port)); MP=($(port) $(port) $(port))
NATS_PIDS=()
for i in 0 1 2; do
  routes=""
  for j in 0 1 2; do [ "$j" = "$i" ] || routes+="\"nats-route://127.0.0.1:${RP[$j]}\", "; done
  cat >"$TMP/nats$i.conf" <<EOF
server_name: n$i
listen: 127.0.0.1:${NP[$i]}
jetstream { store_dir: "$TMP/js$i" }
mqtt { listen: 127.0.0.1:${MP[$i]} }
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
    ${CLUSTER_CONFIG:+--config "$CLUSTER_CONFIG"} \
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

run() { # name setup port sub-port lanemq-pids [-- nats-pids]
  local name=$1 setup=$2 p=$3 sp=$4; shift 4
  local lpids=() npids=() seen=0 x
  for x in "$@"; do
    if [ "$x" = -- ]; then seen=1; elif [ $seen = 0 ]; then lpids+=("$x"); else npids+=("$x"); fi
  done
  local args=(--port "$p" --publishers 10 --subscribers 1 --payload 64 --duration "$DURATION"
    --warmup 1 --drain 10 --inflight 100 --quiet --topic-prefix "bench/$name/$setup/$r"
    --mqtt-version 3)
  local flood=""
  case $name in
    fanin_q1) args+=(--qos 1) ;;
    cross_q1) args+=(--qos 1 --sub-port "$sp") ;;
    fanin_q0) args+=(--qos 0) ;;
    latency_q1) args+=(--qos 1 --rate 5000) ;;
    flood_q0)
      args=(--port "$p" --publishers 1 --subscribers 1 --payload 64 --duration "$DURATION"
        --warmup 1 --drain 10 --quiet --topic-prefix "bench/$name/$setup/$r/paced" --qos 0
        --rate 1000 --mqtt-version 3)
      "$BENCH_BIN" --port "$p" --publishers 4 --subscribers 1 --payload 64 --qos 0 \
        --duration $((DURATION + 2)) --warmup 0 --drain 5 --quiet --mqtt-version 3 \
        --topic-prefix "bench/$name/$setup/$r/flood" --json "$RESULTS/flooder.$setup.r$r.json" \
        >"$RESULTS/flooder.$setup.r$r.txt" 2>&1 &
      flood=$!
      sleep 0.5
      ;;
  esac
  local hz t0 t1 n0 n1
  hz=$(getconf CLK_TCK)
  t0=$(cpu_ticks "${lpids[@]}")
  n0=$(cpu_ticks "${npids[@]}")
  echo "[bench] $name $setup round $r (load $(cut -d' ' -f1-3 /proc/loadavg))"
  "$BENCH_BIN" "${args[@]}" --json "$RESULTS/$name.$setup.r$r.json" >"$RESULTS/$name.$setup.r$r.txt" 2>&1
  [ -n "$flood" ] && wait "$flood"
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

for i in 0 1 2; do wait_port "${MP[$i]}" || { echo "nats-server $i MQTT did not start"; exit 1; }; done
for r in $(seq 1 "$ROUNDS"); do
  for name in ${SCENARIOS:-fanin_q1 cross_q1 fanin_q0 latency_q1 flood_q0}; do
    for setup in ${SETUPS:-single cluster3 natsmqtt}; do
      case $setup in
        single) run "$name" single "$SP" "$SP" "$SINGLE_PID" ;;
        cluster3) run "$name" cluster3 "${NODE_PORTS[0]}" "${NODE_PORTS[1]}" "${NODE_PIDS[@]}" -- "${NATS_PIDS[@]}" ;;
        natsmqtt) run "$name" natsmqtt "${MP[0]}" "${MP[1]}" -- "${NATS_PIDS[@]}" ;;
      esac
    done
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
        d.get("cluster_cpu_us_per_msg", 0), d.get("lanemq_cpu_us_per_msg", 0), d.get("nats_cpu_us_per_msg", 0),
        d.get("loss", 0)))
print("| scenario | setup | msg/s out, median (worst) | p99 µs, median (worst) | loss, median (worst) | CPU µs/msg, median (lanemq + nats-server) |")
print("|---|---|---|---|---|---|")
for (name, setup), v in sorted(rows.items()):
    med = lambda i: statistics.median(x[i] for x in v)
    print("| %s | %s | %.1fk (%.1fk) | %d (%d) | %d (%d) | %.1f (%.1f + %.1f) |" % (
        name, setup, med(0) / 1e3, min(x[0] for x in v) / 1e3, med(1), max(x[1] for x in v),
        med(5), max(x[5] for x in v), med(2), med(3), med(4)))
def ratio(name, a, b, i, what):
    if (name, a) in rows and (name, b) in rows:
        va = statistics.median(x[i] for x in rows[(name, a)])
        vb = statistics.median(x[i] for x in rows[(name, b)])
        print("%s: %s / %s %s = %.2fx" % (name, a, b, what, va / vb if vb else float("nan")))
print()
for name in ("fanin_q1", "cross_q1"):
    ratio(name, "cluster3", "single", 2, "CPU per message (medians)")
    ratio(name, "cluster3", "natsmqtt", 0, "msg/s out (medians)")
EOF
