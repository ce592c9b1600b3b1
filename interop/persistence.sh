#!/usr/bin/env bash
# Persistent sessions across broker restarts, with the real mosquitto_sub / mosquitto_pub.
# Starts its own broker ([storage] fsync = "always") on a free 127.0.0.1 port; prints
# PASS/FAIL per scenario and exits non-zero if any failed. See docs/testing.md.
#
#   bash interop/persistence.sh [SCENARIO_SUBSTRING...]
#
# Each scenario, for MQTT 5 (-c -x 3600) and MQTT 3.1.1 (-c), and for a graceful restart
# (SIGTERM) and a crash (kill -9):
#   1. mosquitto_sub -c -i ID -q 1 subscribes, then disconnects (-E);
#   2. mosquitto_pub publishes N QoS 1 messages (all acknowledged when it exits);
#   3. the broker restarts on the same port and data dir;
#   4. mosquitto_pub publishes K more (the subscriber is still offline: they reach it only
#      through the stored subscription);
#   5. the subscriber reconnects (same ID, -c) and must receive all N + K, in order, once.
#
# Environment: PERSIST_N (default 20), PERSIST_K (default 5), LANEMQ_BIN,
# INTEROP_BROKER=mosquitto (baseline run; mosquitto with persistence and autosave on every
# change), KEEP_TMP=1 (see lib.sh).
set -uo pipefail
source "$(dirname "$0")/lib.sh"

require_mosquitto_clients

N=${PERSIST_N:-20}
K=${PERSIST_K:-5}
FILTERS=("$@")
PORT=$(free_port)
BROKER_LOG=$WORK/broker.log
DATA=$WORK/data
mkdir -p "$DATA"
H=(-h 127.0.0.1 -p "$PORT")

# launch_broker: start the broker on $PORT with $DATA (both kept across restarts).
launch_broker() {
  if [ "$INTEROP_BROKER" = mosquitto ]; then
    local mbin
    mbin=$(command -v mosquitto || echo /usr/sbin/mosquitto)
    cat >"$WORK/mosquitto.conf" <<EOF
listener $PORT 127.0.0.1
allow_anonymous true
persistence true
persistence_location $DATA/
autosave_on_changes true
autosave_interval 1
user $(id -un)
EOF
    "$mbin" -c "$WORK/mosquitto.conf" >>"$BROKER_LOG" 2>&1 &
  else
    if [ ! -x "$LANEMQ_BIN" ]; then
      echo "broker binary $LANEMQ_BIN not found: cargo build --release -p lanemq" >&2
      exit 2
    fi
    cat >"$WORK/lanemq.toml" <<'EOF'
[server]
sys_interval_s = 0
shutdown_grace_ms = 2000

[storage]
fsync = "always"
EOF
    RUST_LOG=${RUST_LOG:-info} "$LANEMQ_BIN" serve --mqtt "127.0.0.1:$PORT" \
      --data-dir "$DATA" --config "$WORK/lanemq.toml" >>"$BROKER_LOG" 2>&1 &
  fi
  BROKER_PID=$!
  if ! wait_port "$PORT" 15; then
    echo "broker did not accept on 127.0.0.1:$PORT within 15 s" >&2
    tail -n 30 "$BROKER_LOG" >&2 || true
    exit 2
  fi
}

# stop_broker term|kill9: stop the broker (bounded) and reap it.
stop_broker() {
  local mode=$1 i
  if [ "$mode" = kill9 ]; then
    kill -9 "$BROKER_PID" 2>/dev/null || true
  else
    kill -TERM "$BROKER_PID" 2>/dev/null || true
    for ((i = 0; i < 150; i++)); do
      kill -0 "$BROKER_PID" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$BROKER_PID" 2>/dev/null; then
      echo "broker did not exit within 15 s of SIGTERM; killing it" >&2
      kill -9 "$BROKER_PID" 2>/dev/null || true
    fi
  fi
  wait "$BROKER_PID" 2>/dev/null || true
  BROKER_PID=""
}

selected() {
  local name=$1 f
  [ "${#FILTERS[@]}" -eq 0 ] && return 0
  for f in "${FILTERS[@]}"; do
    [[ "$name" == *"$f"* ]] && return 0
  done
  return 1
}

# publish_range VERSION TOPIC FROM TO: QoS 1 messages mFROM..mTO, one connection (-l).
publish_range() {
  local ver=$1 topic=$2 from=$3 to=$4
  seq "$from" "$to" | sed 's/^/m/' |
    timeout 30 mosquitto_pub "${H[@]}" -V "$ver" -q 1 -i "persist-pub-$$" -t "$topic" -l
}

# t_persist VERSION MODE
t_persist() {
  local ver=$1 mode=$2 tag name id topic sub_args out want got
  tag=$([ "$ver" = mqttv5 ] && echo v5 || echo v311)
  name="$tag persistent session survives broker restart ($mode)"
  selected "$name" || return 0
  id="persist-$tag-$mode"
  topic="persist/$tag/$mode"
  sub_args=(-V "$ver" -c -i "$id" -q 1)
  [ "$ver" = mqttv5 ] && sub_args+=(-x 3600)
  out=$WORK/$id.out

  # 1. subscribe, then disconnect (-E: exit once the SUBACK arrived).
  if ! timeout 10 mosquitto_sub "${H[@]}" "${sub_args[@]}" -t "$topic" -E >"$WORK/$id.sub1" 2>&1; then
    fail "$name" "initial mosquitto_sub -E failed: $(tr '\n' ' ' <"$WORK/$id.sub1")"
    return
  fi
  # 2. N messages while the subscriber is offline.
  if ! publish_range "$ver" "$topic" 1 "$N" >"$WORK/$id.pub1" 2>&1; then
    fail "$name" "mosquitto_pub (before the restart) failed: $(tr '\n' ' ' <"$WORK/$id.pub1")"
    return
  fi
  # 3. restart.
  stop_broker "$mode"
  launch_broker
  # 4. K more, still offline.
  if ! publish_range "$ver" "$topic" $((N + 1)) $((N + K)) >"$WORK/$id.pub2" 2>&1; then
    fail "$name" "mosquitto_pub (after the restart) failed: $(tr '\n' ' ' <"$WORK/$id.pub2")"
    return
  fi
  # 5. reconnect and receive everything.
  timeout 30 mosquitto_sub "${H[@]}" "${sub_args[@]}" -t "$topic" -C $((N + K + 1)) -W 5 \
    -F '%p' >"$out" 2>"$WORK/$id.sub2.err"
  want=$(seq 1 $((N + K)) | sed 's/^/m/')
  got=$(cat "$out")
  if [ "$got" = "$want" ]; then
    pass "$name: all $((N + K)) messages ($N before, $K after the restart), in order"
  else
    local missing extra
    missing=$(comm -23 <(echo "$want" | sort) <(echo "$got" | sort) | paste -sd ' ')
    extra=$(comm -13 <(echo "$want" | sort) <(echo "$got" | sort) | paste -sd ' ')
    fail "$name" "got $(echo "$got" | grep -c .) of $((N + K)) lines; missing [${missing}] extra/duplicate [${extra}]; received [$(echo "$got" | paste -sd ' ')]"
  fi
}

launch_broker
echo "broker: $INTEROP_BROKER pid $BROKER_PID on 127.0.0.1:$PORT (data dir $DATA)"

for v in mqttv5 mqttv311; do
  for m in term kill9; do
    t_persist "$v" "$m"
  done
done

summary persistence
[ "$N_FAIL" -eq 0 ]
