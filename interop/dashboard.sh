#!/usr/bin/env bash
# The web dashboard (docs/dashboard.md) in a real browser: Debian's `chromium`, headless,
# driven by playwright-core (pinned in interop/dashboard/package-lock.json) through
# interop/dashboard/dashboard.mjs. Against a broker with an admin listener and a known token,
# a lite parent `agents` with a few lanes and a group, and `mosquitto_sub -i dash-watcher`:
# login (none, wrong, right), the overview chart and figures, the client list and search,
# creating a stream in the form, the viewer showing a published message (from earliest, then
# live), the lanes tab, kicking dash-watcher (mosquitto_sub exits), deleting the stream, a
# stale token, logout, and no script error or CSP violation. One PASS/FAIL line per check.
#
# Installs what it needs: Debian's chromium (apt-get) when /usr/bin/chromium is missing,
# nodejs/npm likewise, and playwright-core with `npm ci` into interop/dashboard/node_modules.
#   bash interop/dashboard.sh
#   DASHBOARD_SCREENSHOTS=docs bash interop/dashboard.sh   # also rewrite docs/dashboard-*.png
# Screenshots always go to the work dir (KEEP_TMP=1 keeps it).
# Exit status: the number of failed checks (2: a tool could not be installed).
set -uo pipefail
source "$(dirname "$0")/lib.sh"
DIR="$INTEROP_ROOT/interop/dashboard"
CHROMIUM=/usr/bin/chromium
require_mosquitto_clients

if [ ! -x "$CHROMIUM" ]; then
  apt_install chromium || { echo "cannot install chromium" >&2; exit 2; }
fi
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  apt_install nodejs npm || { echo "cannot install nodejs/npm" >&2; exit 2; }
fi
major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if [ "$major" -lt 18 ]; then
  echo "node $major is too old for playwright-core (needs 18 or later)" >&2
  exit 2
fi
want=$(node -p 'require(process.argv[1]).dependencies["playwright-core"]' "$DIR/package.json")
have=$(node -p 'require(process.argv[1]).version' "$DIR/node_modules/playwright-core/package.json" 2>/dev/null || true)
if [ "$have" != "$want" ]; then
  (cd "$DIR" && npm ci --no-audit --no-fund --loglevel=error) >&2 ||
    { echo "npm ci failed (is the npm registry reachable?)" >&2; exit 2; }
fi

HPORT=$(free_port)
TOKEN="dash-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
start_broker "[admin]
bind = \"127.0.0.1:$HPORT\"
token = \"$TOKEN\"
[[lite.parents]]
name = \"agents\"
pattern = \"agents/{lane}/#\""
if ! wait_port "$HPORT" 10; then
  fail "admin listener" "nothing accepts on 127.0.0.1:$HPORT"
  summary dashboard
  exit "$N_FAIL"
fi

# Lanes with content: a group `workers` takes 3 messages, the rest stays as lag.
mq=(-h 127.0.0.1 -p "$PORT" -V mqttv5)
timeout 10 mosquitto_sub "${mq[@]}" -i dash-worker -q 1 -t '$share/workers/agents/#' -C 3 -W 8 \
  >"$WORK/worker.out" 2>&1 &
WORKER_PID=$!
sleep 0.3
for lane_n in a1:9 a2:6 a3:4 a4:3 a5:2; do
  lane=${lane_n%%:*}
  seq 1 "${lane_n#*:}" | sed "s/^/job-$lane-/" |
    timeout 5 mosquitto_pub "${mq[@]}" -i "dash-pub-$lane" -q 1 -t "agents/$lane/task" -l ||
    echo "mosquitto_pub to agents/$lane failed" >&2
done
wait "$WORKER_PID" 2>/dev/null || true

mosquitto_sub "${mq[@]}" -i dash-watcher -q 1 -t 'sensors/#' >"$WORK/watcher.out" 2>&1 &
WATCHER_PID=$!

SHOTS_DIR=""
if [ "${DASHBOARD_SCREENSHOTS:-}" = docs ]; then
  SHOTS_DIR="$INTEROP_ROOT/docs"
fi
start=$(date +%s)
DASH_URL="http://127.0.0.1:$HPORT" DASH_TOKEN="$TOKEN" MQTT_PORT="$PORT" \
  WATCHER_PID="$WATCHER_PID" WORK="$WORK" SHOTS_DIR="$SHOTS_DIR" CHROMIUM="$CHROMIUM" \
  timeout 80 node "$DIR/dashboard.mjs" >"$WORK/dashboard.out" 2>&1
rc=$?
cat "$WORK/dashboard.out"
add_results "$WORK/dashboard.out"
if ! grep -q "^dashboard: done" "$WORK/dashboard.out"; then
  fail "dashboard run" "the browser run did not finish (exit $rc): $(tail -3 "$WORK/dashboard.out" | tr '\n' ' ')"
fi
echo "browser run: $(( $(date +%s) - start )) s; screenshots in $WORK${SHOTS_DIR:+ and $SHOTS_DIR}"
summary dashboard
exit "$N_FAIL"
