#!/usr/bin/env bash
# Side-by-side benchmark: lanemq vs Debian's mosquitto (and, on request, two more peers:
# Debian's nats-server and rumqttd from crates.io), same load generator
# (target/release/lanemq-bench), same machine, runs ALTERNATING per round
# (mosquitto lanemq mosquitto lanemq ...) so drifting machine load hits all alike.
#
# Every broker run gets a fresh broker process on a free 127.0.0.1 port; the
# generator samples its RSS from /proc (the broker process itself, never a wrapper).
# All traffic stays on loopback.
#
# Peers and the MQTT version each is driven with (lanemq-bench --mqtt-version):
#   mosquitto  MQTT 5    Debian's mosquitto (apt-get when missing)
#   lanemq     MQTT 5    target/release/lanemq
#   nats       MQTT 3.1.1  Debian's nats-server (2.9.x; apt-get when missing): its MQTT listener
#                     speaks 3.1.1 only and has QoS 0/1 only (a scenario with QoS 2 would be
#                     skipped for it, with the reason printed; so are slow_consumer_*, see
#                     NATS_STUCK_FILTER). MQTT needs JetStream and a server_name,
#                     so each run writes a config into its temp dir: server_name, listen
#                     127.0.0.1:PORT2 (NATS clients, unused), jetstream { store_dir TMP },
#                     mqtt { listen 127.0.0.1:PORT, max_ack_pending 1024 (its default: QoS 1
#                     deliveries in flight per subscription), ack_wait 30s (default; redelivery
#                     only), consumer_memory_storage true (the MQTT consumers' state in memory,
#                     the nearest it has to mosquitto's `persistence false`; the message
#                     stream stays file-backed in TMP) }; in the throughput scenarios also
#                     max_pending 1GB and write_deadline 60s (no slow-consumer cut of a
#                     subscriber that is only behind, as mosquitto gets unlimited queues);
#                     slow_consumer_* keep nats' defaults (64 MB, 10 s): its own policy.
#   rumqttd    MQTT 3.1.1  rumqttd $RUMQTTD_VERSION from crates.io, installed with
#                     `cargo install rumqttd --version $RUMQTTD_VERSION --root target/peers`
#                     when target/peers/bin/rumqttd is missing (a benchmark peer, not a
#                     dependency of the project; ~12 min on 2 busy cores). Its README calls MQTT
#                     3.1.1 supported and MQTT 5 upcoming (the v5 listener is partial), so it
#                     is driven with 3.1.1 (its [v4] listener) in every scenario
#                     (RUMQTTD_MQTT=5: its [v5] listener instead). Config (TOML, -c): one
#                     listener on 127.0.0.1:PORT, next_connection_delay_ms 0 (sample: 1, an
#                     accept throttle), connection_timeout_ms 60000, max_payload_size 1 MiB,
#                     max_inflight_count 500 (in 0.20 this is the packets read per socket
#                     batch, the value of its sample ws listener; its QoS 1 window towards a
#                     subscriber is a fixed 100 = default INFLIGHT); router: max_connections
#                     IDLE_CONNS + 1024, max_outgoing_packet_count 200 (sample), and the
#                     in-memory commit log per topic max_segment_size 100 MB x
#                     max_segment_count 50 in the throughput scenarios (nothing falls off
#                     the log during a run, as mosquitto gets unlimited queues) and its
#                     sample's 100 MB x 10 in slow_consumer_* (its own policy).
#
# Environment:
#   ROUNDS=3          rounds per scenario (median is reported)
#   DURATION=5        measured seconds per run (plus WARMUP)
#   WARMUP=1          warm-up seconds per run
#   IDLE_CONNS=10000  idle connections for the RSS scenario
#   IDLE_HOLD=25      seconds they are held: RSS is read 1 s after the last CONNACK and at the
#                     end (lanemq hibernates a connection idle for mqtt.idle_hibernate_ms,
#                     10 s by default, within twice that)
#   INFLIGHT=100      QoS 1 window per publisher = mosquitto max_inflight_messages
#   SCENARIOS="fanin_q0 fanout_q0 fanin_q1 fanin_q1_1k latency_q0 idle"
#                     also available (docs/benchmarks.md, slow consumers): rate_q0 (10 -> 1
#                     QoS 0 at SLOW_RATE msg/s), slow_consumer_q0 (the same plus one subscriber
#                     on '#' that never reads), slow_consumer_q1 (fan-in QoS 1 as fast as
#                     possible plus one persistent QoS 1 subscriber on '#' that never reads).
#                     In slow_consumer_* mosquitto runs with its default queue limits.
#   SLOW_RATE=100000  offered rate of rate_q0 / slow_consumer_q0
#   BROKERS="mosquitto lanemq"  any of: mosquitto nats rumqttd lanemq, in the order they
#                     alternate, e.g. BROKERS="mosquitto nats rumqttd lanemq"
#   RESULTS=target/bench-results/<timestamp>   where the JSON goes
#   BENCH_DATA=docs/bench-data  family data files written from RESULTS ("" = none)
#   CHARTS=docs/charts  one chart per family, FAMILY.svg ("" = no charts); plotting runs in
#                     interop/.venv-plot (matplotlib, set up by interop/bench-plot.sh);
#                     RESULTS/data and RESULTS/charts get the same files in any case
#   SVG=              also all families in one chart file ("" = none)
#   LANEMQ_CMD='...'  lanemq command line; {PORT} and {DATA} are substituted
#                     (default: target/release/lanemq serve --mqtt 127.0.0.1:{PORT} --data-dir {DATA})
#   MOSQUITTO=/usr/sbin/mosquitto
#   MOSQ_NODELAY=auto mosquitto set_tcp_nodelay: auto = its default (false,
#                     Nagle on: much higher saturated throughput) for the
#                     throughput scenarios and true for latency_q0 (Nagle +
#                     delayed ACK adds ~10 ms there), i.e. its best config per
#                     scenario; or force true / false
#   NATS_SERVER=nats-server   (found on PATH or /usr/sbin; apt-get install nats-server if missing)
#   NATS_STUCK_FILTER=  nats skips slow_consumer_* (their stuck subscriber is on '#', and
#                     nats-server 2.9 delivers its own $MQTT/sess/... records to '#', before
#                     the SUBACK, which the generator rejects); e.g. 'lanemq-bench/#' (the
#                     generator's topic prefix: the same messages) runs nats with that filter
#   RUMQTTD=target/peers/bin/rumqttd   RUMQTTD_VERSION=0.20.0   RUMQTTD_MQTT=3 (or 5)
#   SKIP_BUILD=1      do not run cargo build (rumqttd is still installed when missing)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5}
WARMUP=${WARMUP:-1}
IDLE_CONNS=${IDLE_CONNS:-10000}
IDLE_HOLD=${IDLE_HOLD:-25}
INFLIGHT=${INFLIGHT:-100}
SCENARIOS=${SCENARIOS:-"fanin_q0 fanout_q0 fanin_q1 fanin_q1_1k latency_q0 idle"}
BROKERS=${BROKERS:-"mosquitto lanemq"}
RESULTS=${RESULTS:-$ROOT/target/bench-results/$(date +%Y%m%d-%H%M%S)}
BENCH_DATA=${BENCH_DATA-$ROOT/docs/bench-data}
CHARTS=${CHARTS-$ROOT/docs/charts}
SVG=${SVG-}
MOSQUITTO=${MOSQUITTO:-/usr/sbin/mosquitto}
MOSQ_NODELAY=${MOSQ_NODELAY:-auto}
NATS_SERVER=${NATS_SERVER:-$(command -v nats-server || echo /usr/sbin/nats-server)}
RUMQTTD=${RUMQTTD:-$ROOT/target/peers/bin/rumqttd}
RUMQTTD_VERSION=${RUMQTTD_VERSION:-0.20.0}
RUMQTTD_MQTT=${RUMQTTD_MQTT:-3}
NATS_STUCK_FILTER=${NATS_STUCK_FILTER:-}
BENCH=$ROOT/target/release/lanemq-bench
LANEMQ_BIN=$ROOT/target/release/lanemq

log() { printf '[bench] %s\n' "$*" >&2; }

TMP=$(mktemp -d /tmp/lanemq-bench.XXXXXX)
BROKER_PID=""
BROKER_DIR=""
cleanup() {
    stop_broker
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- set-up
if [[ -z ${SKIP_BUILD:-} ]]; then
    log "building release binaries"
    if ! cargo build --release -p lanemq -p lanemq-bench; then
        log "building lanemq failed; building lanemq-bench alone (lanemq runs will be skipped)"
        cargo build --release -p lanemq-bench
    fi
fi
[[ -x $BENCH ]] || { log "missing $BENCH"; exit 1; }

if [[ ! -x $MOSQUITTO ]]; then
    log "installing mosquitto"
    apt-get install -y mosquitto >/dev/null || { apt-get update >/dev/null && apt-get install -y mosquitto >/dev/null; }
fi
# The Debian package starts a system instance on :1883; we never use it.
command -v systemctl >/dev/null && systemctl stop mosquitto >/dev/null 2>&1 || true

# The optional peers, set up only when BROKERS names them; one that cannot be set up is
# skipped for the whole run with the reason (like lanemq without a binary).
declare -A SKIP_BROKER=()
wants() { [[ " $BROKERS " == *" $1 "* ]]; }
for b in $BROKERS; do
    case $b in
    mosquitto | nats | rumqttd | lanemq) ;;
    *) SKIP_BROKER[$b]="unknown broker (mosquitto, nats, rumqttd, lanemq)" ;;
    esac
done
if wants nats && [[ ! -x $NATS_SERVER ]]; then
    # apt_install from interop/lib.sh (Debian packages, no service started). lib.sh is sourced
    # in a subshell only to take that function: its temp dir and traps stay in the subshell.
    eval "$(KEEP_TMP=0 bash -c 'source "$1" >/dev/null 2>&1; declare -f apt_install' _ "$ROOT/interop/lib.sh")"
    if ((EUID == 0)); then
        apt_install nats-server || true
    elif command -v sudo >/dev/null; then
        sudo bash -c "$(declare -f apt_install); apt_install nats-server" || true
    fi
    NATS_SERVER=$(command -v nats-server || echo /usr/sbin/nats-server)
    [[ -x $NATS_SERVER ]] || SKIP_BROKER[nats]="nats-server is not installed and apt-get install nats-server failed"
fi
if wants rumqttd && [[ ! -x $RUMQTTD ]]; then
    # Not --locked: rumqttd 0.20.0's lock file pins metrics 0.22.1, which current rustc rejects
    # (E0521); the semver-compatible metrics 0.22.4 builds. Run outside the workspace.
    log "installing rumqttd $RUMQTTD_VERSION from crates.io into target/peers (a few minutes)"
    if ! (cd "$TMP" && cargo install rumqttd --version "$RUMQTTD_VERSION" --root "$ROOT/target/peers") >&2; then
        log "cargo install rumqttd failed"
    fi
    [[ -x $RUMQTTD ]] || SKIP_BROKER[rumqttd]="$RUMQTTD is missing and cargo install rumqttd failed"
fi
for b in "${!SKIP_BROKER[@]}"; do log "SKIP $b: ${SKIP_BROKER[$b]}"; done

# Idle connections need one fd each on both sides.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
NOFILE=$(ulimit -n)
if [[ $NOFILE != unlimited ]] && ((NOFILE < IDLE_CONNS + 512)); then
    log "ulimit -n is $NOFILE; lowering IDLE_CONNS from $IDLE_CONNS to $((NOFILE - 512))"
    IDLE_CONNS=$((NOFILE - 512))
fi

if [[ -z ${LANEMQ_CMD:-} ]]; then
    if [[ ! -x $LANEMQ_BIN ]]; then
        SKIP_BROKER[lanemq]="$LANEMQ_BIN does not exist"
    elif ! timeout 10 "$LANEMQ_BIN" serve --help 2>&1 | grep -q -- '--mqtt'; then
        SKIP_BROKER[lanemq]="'$LANEMQ_BIN serve --help' does not offer --mqtt (no serve subcommand yet)"
    fi
    [[ -z ${SKIP_BROKER[lanemq]:-} ]] || log "SKIP lanemq: ${SKIP_BROKER[lanemq]}"
    LANEMQ_CMD="$LANEMQ_BIN serve --mqtt 127.0.0.1:{PORT} --data-dir {DATA}"
fi

mkdir -p "$RESULTS"
{
    echo "date: $(date -Is)"
    echo "nproc: $(nproc)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
    echo "kernel: $(uname -r)"
    echo "mosquitto: $("$MOSQUITTO" -h 2>/dev/null | head -1 || true)"
    if wants nats && [[ -x $NATS_SERVER ]]; then echo "nats-server: $("$NATS_SERVER" --version 2>&1 | head -1)"; fi
    if wants rumqttd && [[ -x $RUMQTTD ]]; then echo "rumqttd: $("$RUMQTTD" --version 2>&1 | head -1)"; fi
    echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo "rounds: $ROUNDS duration: $DURATION warmup: $WARMUP inflight: $INFLIGHT idle: $IDLE_CONNS"
} >"$RESULTS/machine.txt"
cat "$RESULTS/machine.txt" >&2
LOAD_START=$(cat /proc/loadavg)
# write_meta: RESULTS/meta.json (commit, date, load average at start and end, rounds) for bench_plot.py
write_meta() {
    python3 - "$RESULTS/meta.json" "$(git rev-parse --short HEAD 2>/dev/null || echo '?')" "$(date -Is)" \
        "$LOAD_START" "$(cat /proc/loadavg)" "$ROUNDS" "$DURATION" "$WARMUP" "$SCENARIOS" "$BROKERS" <<'EOF'
import json, sys
keys = ["commit", "date", "loadavg_start", "loadavg_end", "rounds", "duration", "warmup", "scenarios", "brokers"]
m = dict(zip(keys, sys.argv[2:]))
for k in ("rounds", "duration", "warmup"):
    m[k] = int(m[k]) if m[k].isdigit() else m[k]
m["scenarios"], m["brokers"] = m["scenarios"].split(), m["brokers"].split()
with open(sys.argv[1], "w") as fh:
    json.dump(m, fh, indent=1)
    fh.write("\n")
EOF
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

wait_port() { # port timeout_tenths
    local i
    for ((i = 0; i < $2; i++)); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        if [[ -n $BROKER_PID ]] && ! kill -0 "$BROKER_PID" 2>/dev/null; then return 1; fi
        sleep 0.1
    done
    return 1
}

stop_broker() {
    [[ -n $BROKER_PID ]] || return 0
    kill "$BROKER_PID" 2>/dev/null || true
    local i
    for ((i = 0; i < 50; i++)); do
        kill -0 "$BROKER_PID" 2>/dev/null || break
        sleep 0.1
    done
    kill -9 "$BROKER_PID" 2>/dev/null || true
    wait "$BROKER_PID" 2>/dev/null || true
    BROKER_PID=""
    # Every broker's data directory goes with its run (the logs stay): a run's data left in
    # the page cache made the next runs that write much slower on this VM (the kernel copies
    # each write into memory the guest touches for the first time; docs/benchmarks.md,
    # "Rounds that fell").
    if [[ -n $BROKER_DIR ]]; then
        rm -rf "$BROKER_DIR/data"
        BROKER_DIR=""
    fi
}

# start_broker NAME SCENARIO -> sets PORT and BROKER_PID, returns 1 on failure
start_broker() {
    local nodelay=$MOSQ_NODELAY
    if [[ $nodelay == auto ]]; then
        if [[ $2 == latency_q0 ]]; then nodelay=true; else nodelay=false; fi
    fi
    PORT=$(free_port)
    local dir="$TMP/$1-$PORT"
    mkdir -p "$dir/data"
    BROKER_DIR=$dir
    case $1 in
    mosquitto)
        # Never drop for queue limits during a throughput benchmark; the slow-consumer
        # scenarios measure each broker's own policy, so mosquitto keeps its defaults there.
        local queue_limits="max_queued_messages 10000000
max_queued_bytes 0"
        [[ $2 == slow_consumer_* ]] && queue_limits="# default queue limits"
        cat >"$dir/mosquitto.conf" <<EOF
listener $PORT 127.0.0.1
allow_anonymous true
persistence false
$queue_limits
max_inflight_messages $INFLIGHT
max_connections -1
set_tcp_nodelay $nodelay
connection_messages false
log_dest file $dir/mosquitto.log
EOF
        "$MOSQUITTO" -c "$dir/mosquitto.conf" >"$dir/stdout.log" 2>&1 &
        ;;
    nats)
        # MQTT in nats-server needs JetStream and a server_name (see the header for the settings).
        local limits="max_pending: 1GB
write_deadline: \"60s\""
        [[ $2 == slow_consumer_* ]] && limits="# default max_pending (64 MB) and write_deadline"
        cat >"$dir/nats.conf" <<EOF
server_name: lanemq-bench
listen: 127.0.0.1:$(free_port)
$limits
jetstream {
  store_dir: "$dir/data"
}
mqtt {
  listen: 127.0.0.1:$PORT
  max_ack_pending: 1024
  ack_wait: "30s"
  consumer_memory_storage: true
}
EOF
        "$NATS_SERVER" -c "$dir/nats.conf" >"$dir/stdout.log" 2>&1 &
        ;;
    rumqttd)
        # rumqttd's TOML (its rumqttd.toml sample); see the header for the settings.
        local segs=50 listener=v4
        [[ $2 == slow_consumer_* ]] && segs=10
        [[ $RUMQTTD_MQTT == 5 ]] && listener=v5
        cat >"$dir/rumqttd.toml" <<EOF
id = 0

[router]
id = 0
max_connections = $((IDLE_CONNS + 1024))
max_outgoing_packet_count = 200
max_segment_size = 104857600
max_segment_count = $segs

[$listener.1]
name = "$listener-1"
listen = "127.0.0.1:$PORT"
next_connection_delay_ms = 0
    [$listener.1.connections]
    connection_timeout_ms = 60000
    max_payload_size = 1048576
    max_inflight_count = 500
    dynamic_filters = true
EOF
        "$RUMQTTD" -q -c "$dir/rumqttd.toml" >"$dir/stdout.log" 2>&1 &
        ;;
    lanemq)
        local cmd=${LANEMQ_CMD//\{PORT\}/$PORT}
        cmd=${cmd//\{DATA\}/$dir/data}
        # shellcheck disable=SC2086 # word splitting of the command line is intended
        $cmd >"$dir/stdout.log" 2>&1 &
        ;;
    *)
        log "unknown broker '$1' (mosquitto, nats, rumqttd, lanemq)"
        return 1
        ;;
    esac
    BROKER_PID=$!
    if ! wait_port "$PORT" 100; then
        log "$1 did not start listening on $PORT; log:"
        tail -20 "$dir/stdout.log" >&2 || true
        stop_broker
        return 1
    fi
}

SLOW_RATE=${SLOW_RATE:-100000}

scenario_args() {
    local common="--duration $DURATION --warmup $WARMUP --drain 5 --inflight $INFLIGHT --quiet"
    case $1 in
    fanin_q0) echo "$common --topic-mode fan-in --publishers 10 --subscribers 1 --qos 0 --payload 64" ;;
    fanout_q0) echo "$common --topic-mode fan-out --publishers 1 --subscribers 10 --qos 0 --payload 64" ;;
    fanin_q1) echo "$common --topic-mode fan-in --publishers 10 --subscribers 1 --qos 1 --payload 64" ;;
    fanin_q1_1k) echo "$common --topic-mode fan-in --publishers 10 --subscribers 1 --qos 1 --payload 1024" ;;
    latency_q0) echo "$common --topic-mode fan-in --publishers 10 --subscribers 1 --qos 0 --payload 64 --rate $LAT_RATE" ;;
    idle) echo "--idle-connections $IDLE_CONNS --duration $IDLE_HOLD --keepalive 60 --connect-concurrency 200 --quiet" ;;
    rate_q0) echo "$common --topic-mode fan-in --publishers 10 --subscribers 1 --qos 0 --payload 64 --rate $SLOW_RATE" ;;
    slow_consumer_q0) echo "$common --topic-mode fan-in --publishers 10 --subscribers 1 --qos 0 --payload 64 --rate $SLOW_RATE --stuck-subscribers 1 --stuck-qos 0 --stuck-filter #" ;;
    slow_consumer_q1) echo "$common --topic-mode fan-in --publishers 10 --subscribers 1 --qos 1 --payload 64 --stuck-subscribers 1 --stuck-qos 1 --stuck-session-expiry 3600 --stuck-filter #" ;;
    *) return 1 ;;
    esac
}

# Median of mosquitto's fan-in QoS 0 delivered rate, halved, for latency_q0.
latency_rate() {
    python3 - "$RESULTS" <<'EOF'
import glob, json, statistics, sys
v = []
for f in glob.glob(sys.argv[1] + "/fanin_q0.mosquitto.r*.json"):
    with open(f) as fh:
        r = json.load(fh)
    if r.get("msgs_per_sec_out"):
        v.append(r["msgs_per_sec_out"])
print(int(statistics.median(v) / 2) if v else 0)
EOF
}

# broker_args BROKER: generator options of this broker (the MQTT version it is driven with;
# lanemq-bench's default is MQTT 5)
broker_args() {
    case $1 in
    nats) echo "--mqtt-version 3" ;;
    rumqttd) echo "--mqtt-version $RUMQTTD_MQTT" ;;
    esac
}

# skip_reason SCENARIO BROKER: why BROKER cannot take part in SCENARIO (nothing = it can)
skip_reason() {
    local args
    args=" $(scenario_args "$1") $(broker_args "$2") "
    if [[ $2 == nats && $args =~ \ --(stuck-)?qos\ 2\  ]]; then
        echo "nats-server's MQTT has QoS 0 and 1 only"
    elif [[ $2 == nats && $args == *" --stuck-filter # "* && -z $NATS_STUCK_FILTER ]]; then
        echo "nats-server 2.9 delivers its own session records (topic \$MQTT/sess/...) to a '#'" \
            "subscriber, before the SUBACK, which lanemq-bench rejects (NATS_STUCK_FILTER='lanemq-bench/#'" \
            "runs it with that filter instead)"
    elif [[ $args == *" --mqtt-version 3 "* && $args == *" --stuck-user-property "* ]]; then
        echo "the scenario needs MQTT 5 user properties; $2 is driven with MQTT 3.1.1"
    fi
}

run_one() { # scenario broker round
    local s=$1 b=$2 r=$3 out="$RESULTS/$1.$2.r$3.json"
    if ! start_broker "$b" "$s"; then
        return 0
    fi
    local args
    args="$(scenario_args "$s") $(broker_args "$b")"
    args=${args% }
    if [[ $b == nats && -n $NATS_STUCK_FILTER ]]; then
        args=${args/--stuck-filter \#/--stuck-filter $NATS_STUCK_FILTER}
    fi
    log "$s $b round $r: lanemq-bench --port $PORT $args (load $(cut -d' ' -f1-3 /proc/loadavg))"
    # shellcheck disable=SC2086
    local rc=0
    timeout 180 "$BENCH" --port "$PORT" --broker-pid "$BROKER_PID" --json "$out" $args >"$RESULTS/$1.$2.r$3.txt" 2>&1 || rc=$?
    ((rc == 0)) || log "run failed (exit $rc):"
    sed 's/^/    /' "$RESULTS/$1.$2.r$3.txt" >&2
    stop_broker
}

LAT_RATE=${LAT_RATE:-}
for s in $SCENARIOS; do
    if [[ $s == latency_q0 && -z $LAT_RATE ]]; then
        LAT_RATE=$(latency_rate)
        if [[ $LAT_RATE == 0 ]]; then
            LAT_RATE=20000
            log "no mosquitto fanin_q0 result; latency_q0 uses --rate $LAT_RATE"
        else
            log "latency_q0 at 50% of mosquitto's fan-in QoS 0 max: --rate $LAT_RATE"
        fi
        echo "latency_rate: $LAT_RATE" >>"$RESULTS/machine.txt"
    fi
    runs=""
    for b in $BROKERS; do
        [[ -z ${SKIP_BROKER[$b]:-} ]] || continue
        why=$(skip_reason "$s" "$b")
        if [[ -n $why ]]; then
            log "SKIP $s $b: $why"
            echo "$s $b: $why" >>"$RESULTS/skipped.txt"
        else
            runs+=" $b"
        fi
    done
    for ((round = 1; round <= ROUNDS; round++)); do
        for b in $runs; do
            run_one "$s" "$b" "$round"
        done
    done
done
for b in "${!SKIP_BROKER[@]}"; do echo "all scenarios $b: ${SKIP_BROKER[$b]}" >>"$RESULTS/skipped.txt"; done

write_meta
# results -> data files -> charts, once into RESULTS and once into docs/ (BENCH_DATA, CHARTS)
bash "$ROOT/interop/bench-plot.sh" "$RESULTS" --data-out "$RESULTS/data" --out-dir "$RESULTS/charts" \
    ${SVG:+--svg "$SVG"} | tee "$RESULTS/table.txt"
if [[ -s $RESULTS/skipped.txt ]]; then
    { echo; echo "skipped (a peer that cannot take part):"; sed 's/^/  /' "$RESULTS/skipped.txt"; } | tee -a "$RESULTS/table.txt"
fi
if [[ -n $BENCH_DATA || -n $CHARTS ]]; then
    bash "$ROOT/interop/bench-plot.sh" "$RESULTS" ${BENCH_DATA:+--data-out "$BENCH_DATA"} \
        ${CHARTS:+--out-dir "$CHARTS"} >/dev/null
fi
log "results in $RESULTS"
