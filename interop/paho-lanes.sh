#!/usr/bin/env bash
# Lite-topic lanes (issue 6) with the Eclipse Paho Python client (paho-mqtt 2.x, MQTT 5), see
# interop/paho_lanes.py: a worker pool of 4 consumers over 1,000 lanes (every message processed,
# per-lane order, lane/lane-offset properties), a consumer killed mid-batch (nothing lost, handed
# over as new PUBLISH packets), a lone holder resuming its session (DUP=1), suspend of one lane
# (lane-suspend-ms) while others flow, retry (lane-retry-ms) to the dead-letter topic at
# max_attempts, reject (PUBACK 0x80) to $dlq/<group>/<topic>, TTL expiry, resume of one lane by
# lane-offset, new groups at latest / <n>, quota and key-length refusals, exclusive lane owners,
# two-level lane keys, a member's Receive Maximum; then group offsets and lanes across a broker
# restart (paho_lanes.py --restart-phase 1, restart on the same data dir, phase 2). Starts its own
# broker on a free 127.0.0.1 port with ACL `default allow` and the lite parents the scenarios need.
#
#   bash interop/paho-lanes.sh [SCENARIO_SUBSTRING...]   ("restart": the broker-restart one)
#
# Creates interop/.venv with paho-mqtt 2.x (PyPI) when it is missing (lib.sh paho_python).
# Environment: PAHO_PYTHON (default interop/.venv/bin/python), LANEMQ_BIN,
# KEEP_TMP=1 (lib.sh).
set -uo pipefail
source "$(dirname "$0")/lib.sh"

PY=$(paho_python) || exit 2
if [ "$INTEROP_BROKER" != lanemq ]; then
  echo "lanes are a lanemq extension: no mosquitto baseline" >&2
  exit 0
fi

printf 'default allow\n' >"$WORK/allow.acl"
TOML="[server]
sys_interval_s = 0
acl_file = \"$WORK/allow.acl\"

[admin]
enable = false

[lite]
sweep_interval_ms = 500

[[lite.parents]]
name = \"agents\"
pattern = \"agents/{lane}/#\"
mode = \"shared\"

[[lite.parents]]
name = \"crash\"
pattern = \"crash/{lane}/#\"
mode = \"shared\"

[[lite.parents]]
name = \"tasks\"
pattern = \"tasks/{lane}/#\"
mode = \"shared\"
max_attempts = 2

[[lite.parents]]
name = \"ttl\"
pattern = \"ttl/{lane}/#\"
mode = \"shared\"
ttl_s = 2

[[lite.parents]]
name = \"sess\"
pattern = \"sess/{lane}/#\"
mode = \"shared\"

[[lite.parents]]
name = \"quota\"
pattern = \"quota/{lane}/#\"
mode = \"shared\"
max_lanes = 3
max_key_bytes = 8

[[lite.parents]]
name = \"excl\"
pattern = \"excl/{lane}/#\"
mode = \"exclusive\"
key_levels = 1

[[lite.parents]]
name = \"mk\"
pattern = \"mk/{lane}/#\"
key_levels = 2

[[lite.parents]]
name = \"rm\"
pattern = \"rm/{lane}/#\""
start_broker "$TOML"

OUT=$WORK/paho-lanes.out
export PYTHONDONTWRITEBYTECODE=1  # no interop/__pycache__ left in the work tree
timeout 150 "$PY" -u "$INTEROP_ROOT/interop/paho_lanes.py" --port "$PORT" "$@" | tee "$OUT"
rc=${PIPESTATUS[0]}
add_results "$OUT"
if [ "$rc" -ne 0 ] && ! grep -q '^FAIL:' "$OUT"; then
  fail "paho_lanes.py" "exited $rc without a FAIL line"
fi
if ! kill -0 "$BROKER_PID" 2>/dev/null; then
  fail "broker" "the broker process is gone after the scenarios"
fi

# Group offsets and lanes across a graceful broker restart (same data dir): phase 1, restart,
# phase 2.
if [ $# -eq 0 ] || [[ " $* " == *" restart "* ]]; then
  timeout 30 "$PY" -u "$INTEROP_ROOT/interop/paho_lanes.py" --port "$PORT" --restart-phase 1 | tee "$OUT"
  add_results "$OUT"
  if grep -q '^PASS:' "$OUT"; then
    stop_broker
    start_broker "$TOML"
    timeout 30 "$PY" -u "$INTEROP_ROOT/interop/paho_lanes.py" --port "$PORT" --restart-phase 2 | tee "$OUT"
    add_results "$OUT"
  fi
fi

summary paho-lanes
exit "$N_FAIL"
