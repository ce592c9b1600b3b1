#!/usr/bin/env bash
# Named streams with the Eclipse Paho Python client (paho-mqtt 2.x, MQTT 5), see
# interop/paho_streams.py: timestamp offsets, last-value streams (by topic, by a JSON path),
# resume of a persistent session after the last acknowledged position, subscription
# identifiers, stream user properties, auto-create, refusals. Starts its own broker on a free
# 127.0.0.1 port with ACL `default allow` and the streams the scenarios need.
#
#   bash interop/paho-streams.sh [SCENARIO_SUBSTRING...]
#
# Needs interop/.venv with paho-mqtt 2.x (tests/run-all.sh creates it):
#   python3 -m venv interop/.venv && interop/.venv/bin/pip install 'paho-mqtt==2.*'
# Environment: PAHO_PYTHON (default interop/.venv/bin/python), LANEMQ_BIN, KEEP_TMP=1 (lib.sh).
set -uo pipefail
source "$(dirname "$0")/lib.sh"

PY=${PAHO_PYTHON:-$INTEROP_ROOT/interop/.venv/bin/python}
if ! "$PY" -c 'import paho.mqtt, sys; sys.exit(0 if paho.mqtt.__version__.startswith("2.") else 1)' 2>/dev/null; then
  echo "paho-mqtt 2.x not available to $PY; create the venv:" >&2
  echo "  python3 -m venv interop/.venv && interop/.venv/bin/pip install 'paho-mqtt==2.*'" >&2
  exit 2
fi
if [ "$INTEROP_BROKER" != lanemq ]; then
  echo "streams are a lanemq extension: no mosquitto baseline" >&2
  exit 0
fi

printf 'default allow\n' >"$WORK/allow.acl"
start_broker "[server]
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
topic_filter = \"sid/#\""

timeout 100 "$PY" -u "$INTEROP_ROOT/interop/paho_streams.py" --port "$PORT" "$@"
rc=$?
if [ "$rc" -ne 0 ]; then N_FAIL=$rc; fi
[ "$rc" -eq 0 ]
