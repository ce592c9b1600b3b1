#!/usr/bin/env bash
# Named streams with the Eclipse Paho Python client (paho-mqtt 2.x, MQTT 5), see
# interop/paho_streams.py: timestamp offsets, last-value streams (by topic, by a JSON path),
# resume of a persistent session after the last acknowledged position, subscription
# identifiers, stream user properties, auto-create, refusals; then resume across a broker
# restart (paho_streams.py --restart-phase 1, restart on the same data dir, phase 2).
# Starts its own broker on a free 127.0.0.1 port with ACL `default allow` and the streams the scenarios need.
#
#   bash interop/paho-streams.sh [SCENARIO_SUBSTRING...]   ("restart": the broker-restart one)
#
# Creates interop/.venv with paho-mqtt 2.x (PyPI) when it is missing (lib.sh paho_python).
# Environment: PAHO_PYTHON (default interop/.venv/bin/python), LANEMQ_BIN, KEEP_TMP=1 (lib.sh).
set -uo pipefail
source "$(dirname "$0")/lib.sh"

PY=$(paho_python) || exit 2
if [ "$INTEROP_BROKER" != lanemq ]; then
  echo "streams are a lanemq extension: no mosquitto baseline" >&2
  exit 0
fi

printf 'default allow\n' >"$WORK/allow.acl"
TOML="[server]
sys_interval_s = 0
acl_file = \"$WORK/allow.acl\"

[admin]
enable = false

[[streams]]
name = \"events\"
topic_filter = \"ev/#\"

[[streams]]
name = \"tsx\"
topic_filter = \"tsx/#\"

[[streams]]
name = \"lv\"
topic_filter = \"lv/#\"
is_lastvalue = true
key_expression = \"message.topic\"

[[streams]]
name = \"jk\"
topic_filter = \"jk/#\"
is_lastvalue = true
key_expression = \"payload.\$.device.id\"

[[streams]]
name = \"resume\"
topic_filter = \"rs/#\"

[[streams]]
name = \"subid\"
topic_filter = \"sid/#\"

[[streams]]
name = \"restart\"
topic_filter = \"rr/#\""
start_broker "$TOML"

OUT=$WORK/paho-streams.out
timeout 80 "$PY" -u "$INTEROP_ROOT/interop/paho_streams.py" --port "$PORT" "$@" | tee "$OUT"
rc=${PIPESTATUS[0]}
add_results "$OUT"
if [ "$rc" -ne 0 ] && ! grep -q '^FAIL:' "$OUT"; then
  fail "paho_streams.py" "exited $rc without a FAIL line"
fi

# Resume across a graceful broker restart (same data dir): phase 1, restart, phase 2.
if [ $# -eq 0 ] || [[ " $* " == *" restart "* ]]; then
  timeout 30 "$PY" -u "$INTEROP_ROOT/interop/paho_streams.py" --port "$PORT" --restart-phase 1 | tee "$OUT"
  add_results "$OUT"
  if grep -q '^PASS:' "$OUT"; then
    stop_broker
    start_broker "$TOML"
    timeout 30 "$PY" -u "$INTEROP_ROOT/interop/paho_streams.py" --port "$PORT" --restart-phase 2 | tee "$OUT"
    add_results "$OUT"
  fi
fi

summary paho-streams
exit "$N_FAIL"
