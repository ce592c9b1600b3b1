#!/usr/bin/env bash
# MQTT 5 interop scenarios with the Eclipse Paho Python client (paho-mqtt 2.x), see
# interop/paho_scenarios.py. Starts its own broker on a free 127.0.0.1 port.
#
#   bash interop/paho.sh [SCENARIO_SUBSTRING...]
#
# Needs interop/.venv with paho-mqtt 2.x (tests/run-all.sh creates it):
#   python3 -m venv interop/.venv && interop/.venv/bin/pip install 'paho-mqtt==2.*'
# Environment: PAHO_PYTHON (default interop/.venv/bin/python), LANEMQ_BIN,
# INTEROP_BROKER=mosquitto (baseline run), KEEP_TMP=1 (see lib.sh).
set -uo pipefail
source "$(dirname "$0")/lib.sh"

PY=${PAHO_PYTHON:-$INTEROP_ROOT/interop/.venv/bin/python}
if ! "$PY" -c 'import paho.mqtt, sys; sys.exit(0 if paho.mqtt.__version__.startswith("2.") else 1)' 2>/dev/null; then
  echo "paho-mqtt 2.x not available to $PY; create the venv:" >&2
  echo "  python3 -m venv interop/.venv && interop/.venv/bin/pip install 'paho-mqtt==2.*'" >&2
  exit 2
fi

start_broker '[server]
sys_interval_s = 0'

timeout 600 "$PY" -u "$INTEROP_ROOT/interop/paho_scenarios.py" --port "$PORT" "$@"
rc=$?
if [ "$rc" -ne 0 ]; then N_FAIL=$rc; fi
[ "$rc" -eq 0 ]
