#!/usr/bin/env bash
# MQTT.js (npm package `mqtt` 5.16.0, the client of web and Node users) against lanemq:
# interop/mqttjs/scenarios.mjs — MQTT 5 and 3.1.1 connect, QoS 0/1/2 both ways in order,
# retained (and cleared), a delayed will after an abrupt close, a `$stream/` replay with
# `stream-offset=earliest` that then goes live, a lane group of two members (each message
# once, every lane in order, lane-offset 0..4, both members used), SCRAM-SHA-512/-256 enhanced
# authentication with re-authentication (a SCRAM client written on node:crypto).
#
# Installs what it needs: Debian's nodejs and npm when `node` is missing (apt-get), and the
# pinned package with `npm ci` (package-lock.json) into interop/mqttjs/node_modules.
#   bash interop/mqttjs.sh [SCENARIO...]      (names: substrings, e.g. `stream lane`)
# Exit status: the number of failed scenarios (2: a tool could not be installed).
set -uo pipefail
source "$(dirname "$0")/lib.sh"
DIR="$INTEROP_ROOT/interop/mqttjs"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  apt_install nodejs npm || { echo "cannot install nodejs/npm" >&2; exit 2; }
fi
major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if [ "$major" -lt 16 ]; then
  echo "node $major is too old for mqtt 5 (needs 16 or later)" >&2
  exit 2
fi
if [ ! -f "$DIR/node_modules/mqtt/package.json" ]; then
  (cd "$DIR" && npm ci --no-audit --no-fund --loglevel=error) >&2 ||
    { echo "npm ci failed (is the npm registry reachable?)" >&2; exit 2; }
fi

echo "default allow" >"$WORK/allow.acl"
# Users for the SCRAM scenario: carol from the real mosquitto_passwd when it is installed
# ($7$, served as SCRAM-SHA-512 with no migration), alice ($7$) and bob (SCRAM-SHA-256$) from
# `lanemq passwd`. Anonymous clients stay allowed for the other scenarios.
PASSWD=$WORK/passwd
rm -f "$PASSWD"
SCRAM_USERS=""
if command -v mosquitto_passwd >/dev/null; then
  mosquitto_passwd -c -b "$PASSWD" carol 'c4rol pw' && SCRAM_USERS="SCRAM-SHA-512:carol:c4rol pw,"
fi
echo 'alice-pw' | "$LANEMQ_BIN" passwd "$PASSWD" alice >/dev/null
echo 'bob-pw' | "$LANEMQ_BIN" passwd --scram-sha-256 "$PASSWD" bob >/dev/null
export SCRAM_USERS="${SCRAM_USERS}SCRAM-SHA-512:alice:alice-pw,SCRAM-SHA-256:bob:bob-pw"
start_broker "[server]
acl_file = \"$WORK/allow.acl\"
password_file = \"$PASSWD\"
auth_methods = [\"SCRAM-SHA-512\", \"SCRAM-SHA-256\"]
[[streams]]
name = \"events\"
topic_filter = \"ev/#\"
[[lite.parents]]
name = \"agents\"
pattern = \"agents/{lane}/#\""

node "$DIR/scenarios.mjs" "$PORT" "$@" >"$WORK/mqttjs.out" 2>&1
cat "$WORK/mqttjs.out"
while IFS= read -r line; do
  case "$line" in
    "PASS: "*) pass "${line#PASS: }" ;;
    "FAIL: "*) name=${line#FAIL: }; fail "${name%% -- *}" "${name#* -- }" ;;
  esac
done <"$WORK/mqttjs.out" >/dev/null
if ! grep -q "^mqttjs: " "$WORK/mqttjs.out"; then
  fail "mqttjs run" "node did not finish: $(tail -5 "$WORK/mqttjs.out")"
fi
summary mqttjs
exit "$N_FAIL"
