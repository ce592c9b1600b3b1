# Shared helpers for the interop scripts (sourced, not executed).
#
#   start_broker [EXTRA_TOML]   start a broker on a free 127.0.0.1 port; sets PORT, BROKER_PID,
#                               BROKER_LOG, WORK (a temp dir removed on exit)
#   pass NAME / fail NAME REASON / skip NAME REASON / summary LABEL
#
# Environment:
#   LANEMQ_BIN       broker binary (default target/release/lanemq)
#   INTEROP_BROKER   lanemq (default) | mosquitto: run the same scenarios against
#                    mosquitto as a baseline, to validate the scripts themselves
#   KEEP_TMP=1       keep the temp dir (broker log, client output)

INTEROP_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LANEMQ_BIN=${LANEMQ_BIN:-$INTEROP_ROOT/target/release/lanemq}
INTEROP_BROKER=${INTEROP_BROKER:-lanemq}

N_PASS=0
N_FAIL=0
N_SKIP=0
FAILED_NAMES=()
BROKER_PID=""
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lanemq-interop.XXXXXX")

# apt_install [APT-OPTION...] PKG...: Debian packages, for scripts that install what they need;
# a package's service is not started (a temporary policy-rc.d), output goes to stderr.
apt_install() {
  echo "installing $* (Debian)" >&2
  local made_policy=0 rc
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d &&
      made_policy=1
  fi
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"; } >&2
  rc=$?
  if [ "$made_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
  return "$rc"
}

# require_mosquitto_clients: mosquitto_pub and mosquitto_sub, installed from Debian's packages
# when missing (mosquitto-clients); exit 2 if that fails.
require_mosquitto_clients() {
  local tool
  if ! command -v mosquitto_sub >/dev/null || ! command -v mosquitto_pub >/dev/null; then
    apt_install mosquitto-clients || true
  fi
  for tool in mosquitto_sub mosquitto_pub; do
    if ! command -v "$tool" >/dev/null; then
      echo "$tool not found and apt-get install mosquitto-clients failed" >&2
      exit 2
    fi
  done
}

# paho_python: prints the python of interop/.venv with paho-mqtt 2.x (PAHO_PYTHON or PY, when
# set, instead), creating the venv from PyPI when it is missing or holds another paho-mqtt;
# exit 2 if that fails.
paho_python() {
  local py=${PAHO_PYTHON:-${PY:-$INTEROP_ROOT/interop/.venv/bin/python}}
  local ok='import paho.mqtt, sys; sys.exit(0 if paho.mqtt.__version__.startswith("2.") else 1)'
  if ! "$py" -c "$ok" 2>/dev/null && [ "$py" = "$INTEROP_ROOT/interop/.venv/bin/python" ]; then
    echo "creating interop/.venv with paho-mqtt 2.x (PyPI)" >&2
    rm -rf "$INTEROP_ROOT/interop/.venv"
    { python3 -m venv "$INTEROP_ROOT/interop/.venv" &&
      "$INTEROP_ROOT/interop/.venv/bin/pip" install -q --disable-pip-version-check 'paho-mqtt==2.*'; } >&2
  fi
  if ! "$py" -c "$ok" 2>/dev/null; then
    echo "paho-mqtt 2.x is not available to $py and could not be installed" >&2
    exit 2
  fi
  echo "$py"
}

pass() {
  N_PASS=$((N_PASS + 1))
  echo "PASS: $1"
}
fail() {
  N_FAIL=$((N_FAIL + 1))
  FAILED_NAMES+=("$1")
  echo "FAIL: $1 -- $2"
}
skip() {
  N_SKIP=$((N_SKIP + 1))
  echo "SKIP: $1 -- $2"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# wait_port PORT SECONDS: until a TCP connect to 127.0.0.1:PORT succeeds.
wait_port() {
  local port=$1 secs=${2:-15} i
  for ((i = 0; i < secs * 10; i++)); do
    if timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  return 1
}

cleanup() {
  local rc=$?
  # Background clients started by the scenarios.
  local j
  for j in $(jobs -p); do kill "$j" 2>/dev/null || true; done
  if [ -n "$BROKER_PID" ]; then
    kill "$BROKER_PID" 2>/dev/null || true
    for _ in $(seq 1 30); do kill -0 "$BROKER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$BROKER_PID" 2>/dev/null || true
  fi
  if [ "$N_FAIL" -gt 0 ] && [ -f "${BROKER_LOG:-}" ]; then
    echo "--- last 30 lines of the broker log ($BROKER_LOG) ---"
    tail -n 30 "$BROKER_LOG" || true
  fi
  if [ "${KEEP_TMP:-0}" = 1 ]; then
    echo "temp dir kept: $WORK"
  else
    rm -rf "$WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_broker [EXTRA_TOML]: EXTRA_TOML is appended to the [server]/[mqtt] config.
start_broker() {
  local extra=${1:-}
  PORT=$(free_port)
  BROKER_LOG=$WORK/broker.log
  mkdir -p "$WORK/data"
  if [ "$INTEROP_BROKER" = mosquitto ]; then
    local mbin
    mbin=$(command -v mosquitto || echo /usr/sbin/mosquitto)
    cat >"$WORK/mosquitto.conf" <<EOF
listener $PORT 127.0.0.1
allow_anonymous true
persistence false
sys_interval 1
max_keepalive 65535
EOF
    "$mbin" -c "$WORK/mosquitto.conf" >"$BROKER_LOG" 2>&1 &
  else
    if [ ! -x "$LANEMQ_BIN" ]; then
      echo "broker binary $LANEMQ_BIN not found: cargo build --release -p lanemq" >&2
      exit 2
    fi
    printf '%s\n' "$extra" >"$WORK/lanemq.toml"
    RUST_LOG=${RUST_LOG:-info} "$LANEMQ_BIN" serve --mqtt "127.0.0.1:$PORT" \
      --data-dir "$WORK/data" --config "$WORK/lanemq.toml" >"$BROKER_LOG" 2>&1 &
  fi
  BROKER_PID=$!
  if ! wait_port "$PORT" 15; then
    echo "broker did not accept on 127.0.0.1:$PORT within 15 s" >&2
    cat "$BROKER_LOG" >&2 || true
    exit 2
  fi
  echo "broker: $INTEROP_BROKER pid $BROKER_PID on 127.0.0.1:$PORT"
}

# wait_grep FILE PATTERN SECONDS: until an extended-regex line matches in FILE.
wait_grep() {
  local file=$1 pat=$2 secs=${3:-5} i
  for ((i = 0; i < secs * 20; i++)); do
    grep -qE -- "$pat" "$file" 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}

summary() {
  local label=$1
  echo "----"
  if [ "$N_FAIL" -gt 0 ]; then
    echo "$label failures: ${FAILED_NAMES[*]}"
  fi
  echo "$label: $N_PASS passed, $N_FAIL failed, $N_SKIP skipped"
}

# stop_broker: stop the broker that start_broker started (SIGTERM, SIGKILL after 3 s), so that
# a script can start another one with a different configuration.
stop_broker() {
  [ -n "$BROKER_PID" ] || return 0
  kill "$BROKER_PID" 2>/dev/null || true
  for _ in $(seq 1 30); do kill -0 "$BROKER_PID" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$BROKER_PID" 2>/dev/null || true
  wait "$BROKER_PID" 2>/dev/null || true
  BROKER_PID=""
}

# add_results FILE: add the "PASS: name" / "FAIL: name -- reason" / "SKIP: ..." lines that a
# sub-runner (a Python script, say) printed to FILE to this script's totals.
add_results() {
  local file=$1 line
  while IFS= read -r line; do
    case "$line" in
      PASS:*) N_PASS=$((N_PASS + 1)) ;;
      SKIP:*) N_SKIP=$((N_SKIP + 1)) ;;
      FAIL:*)
        N_FAIL=$((N_FAIL + 1))
        line=${line#FAIL: }
        FAILED_NAMES+=("${line%% -- *}")
        ;;
    esac
  done <"$file"
}
