#!/usr/bin/env bash
# MQTT 5 interop scenarios with the Eclipse Paho Python client (paho-mqtt 2.x), see
# interop/paho_scenarios.py. Starts its own broker on a free 127.0.0.1 port.
#
#   bash interop/paho.sh [SCENARIO_SUBSTRING...]
#
# Creates interop/.venv with paho-mqtt 2.x (PyPI) when it is missing (lib.sh paho_python).
# Environment: PAHO_PYTHON (default interop/.venv/bin/python), LANEMQ_BIN,
# INTEROP_BROKER=mosquitto (baseline run), KEEP_TMP=1 (see lib.sh).
set -uo pipefail
source "$(dirname "$0")/lib.sh"

PY=$(paho_python) || exit 2

start_broker '[server]
sys_interval_s = 0'

timeout 600 "$PY" -u "$INTEROP_ROOT/interop/paho_scenarios.py" --port "$PORT" "$@"
rc=$?
if [ "$rc" -ne 0 ]; then N_FAIL=$rc; fi
[ "$rc" -eq 0 ]
