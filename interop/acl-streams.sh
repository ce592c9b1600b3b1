#!/usr/bin/env bash
# Stream ACLs end to end, with a stream that holds history (unlike interop/auth-acl.sh, whose
# brokers have no stream): mosquitto_sub/mosquitto_pub, then the same with Paho and the exact
# SUBACK reason codes (interop/paho_acl.py).
#   1. the default ACL (no acl_file: the embedded acl/default.acl): $stream/events, $s/...,
#      bind-by-filter and auto-create are refused (0x87); '#' gets ordinary traffic only;
#   2. acl/examples/stream-reader.acl: user `reader` replays $stream/events from earliest;
#      everyone else is refused there; reader is refused everywhere else under $stream/, $s/.
# Usernames are taken as given (no password file; mosquitto_passwd files: interop/auth-acl.sh).
#
#   bash interop/acl-streams.sh
#
# Environment: LANEMQ_BIN, PAHO_PYTHON, KEEP_TMP=1 (see lib.sh). Exit status: the number of
# failed scenarios.
set -uo pipefail
source "$(dirname "$0")/lib.sh"

require_mosquitto_clients
if [ "$INTEROP_BROKER" != lanemq ]; then
  echo "stream ACLs are a lanemq extension: no mosquitto baseline" >&2
  exit 0
fi
PY=$(paho_python) || exit 2
HAVE_PAHO=1

STREAM_TOML='[admin]
enable = false

[[streams]]
name = "events"
topic_filter = "t/#"'

H=()
pub() { timeout 10 mosquitto_pub "${H[@]}" -V mqttv5 -q 1 "$@"; }
msgs() { grep '^MSG|' "$1" | sed 's/^MSG|//'; }
n_msgs() { grep -c '^MSG|' "$1" 2>/dev/null || true; }
EARLIEST=(-D subscribe user-property stream-offset earliest)

# denied NAME ARGS...: mosquitto_sub (MQTT 5, stream-offset earliest, 2 s) must print "All
# subscription requests were denied.", get SUBACK 135 (0x87) and no message.
denied() {
  local name=$1 out=$WORK/denied.out rc code
  shift
  timeout 10 mosquitto_sub "${H[@]}" -V mqttv5 -q 1 "${EARLIEST[@]}" -d -W 2 -F 'MSG|%t %p' "$@" >"$out" 2>&1
  rc=$?
  code=$(grep -oE 'Subscribed \(mid: [0-9]+\): [0-9]+' "$out" | head -1 | grep -oE '[0-9]+$')
  if grep -q 'All subscription requests were denied' "$out" && [ "${code:-}" = 135 ] && [ "$(n_msgs "$out")" = 0 ]; then
    pass "$name (SUBACK 0x87)"
  else
    fail "$name" "exit $rc, SUBACK ${code:-?}, output [$(grep -v '^Client' "$out" | head -5 | paste -sd ';')]"
  fi
}

# replay NAME COUNT WANT ARGS...: mosquitto_sub from earliest, COUNT messages, compare.
replay() {
  local name=$1 count=$2 want=$3 out=$WORK/replay.out got
  shift 3
  timeout 10 mosquitto_sub "${H[@]}" -V mqttv5 -q 1 "${EARLIEST[@]}" -C "$count" -W 5 -F 'MSG|%t %p' "$@" >"$out" 2>&1
  got=$(msgs "$out")
  if [ "$got" = "$want" ]; then
    pass "$name"
  else
    fail "$name" "expected [$(paste -sd ';' <<<"$want")] got [$(paste -sd ';' <<<"$got")] $(grep -i denied "$out")"
  fi
}

history() {
  local i
  for i in 1 2 3; do pub -t "t/$i" -m "m$i" || fail "publish history t/$i" "mosquitto_pub exited $?"; done
}

run_paho() {
  local acl=$1
  if [ "$HAVE_PAHO" = 0 ]; then
    skip "paho $acl ACL" "paho-mqtt 2.x not available to $PY (python3 -m venv interop/.venv && interop/.venv/bin/pip install 'paho-mqtt==2.*')"
    return
  fi
  local out=$WORK/paho-$acl.out rc
  timeout 60 "$PY" -u "$INTEROP_ROOT/interop/paho_acl.py" --port "$PORT" --acl "$acl" >"$out" 2>&1
  rc=$?
  cat "$out"
  add_results "$out"
  if [ "$rc" -ne 0 ] && ! grep -q '^FAIL:' "$out"; then
    fail "paho $acl ACL" "paho_acl.py exited $rc without a FAIL line"
  fi
}

# --- 1. the default ACL ------------------------------------------------------------------------
start_broker "[server]
sys_interval_s = 0

$STREAM_TOML"
H=(-h 127.0.0.1 -p "$PORT")
history

denied "default ACL: \$stream/events from earliest refused" -t '$stream/events'
denied "default ACL: \$s/earliest/t/# refused" -t '$s/earliest/t/#'
denied "default ACL: \$stream/events/t/# (bind by filter) refused" -t '$stream/events/t/#'
denied "default ACL: \$stream/fresh/t/# (auto-create) refused" -t '$stream/fresh/t/#'

n="default ACL: '#' receives the ordinary t/x publish once and nothing from the stream"
HASH_OUT=$WORK/hash.out
stdbuf -oL -eL mosquitto_sub "${H[@]}" -V mqttv5 -q 1 "${EARLIEST[@]}" -d -W 3 -t '#' -F 'MSG|%t %p' >"$HASH_OUT" 2>&1 &
HASH_PID=$!
if wait_grep "$HASH_OUT" 'received SUBACK' 5; then
  pub -t '$stream/events' -m direct >/dev/null 2>&1 || true # a topic, not the stream: '#' never matches it
  pub -t t/x -m visible || fail "$n" "mosquitto_pub exited $?"
  wait "$HASH_PID" 2>/dev/null
  got=$(msgs "$HASH_OUT")
  if [ "$got" = "t/x visible" ]; then pass "$n"; else fail "$n" "got [$(paste -sd ';' <<<"$got")]"; fi
else
  fail "$n" "no SUBACK"
fi

run_paho default
stop_broker

# --- 2. acl/examples/stream-reader.acl ----------------------------------------------------------
start_broker "[server]
sys_interval_s = 0
acl_file = \"$INTEROP_ROOT/acl/examples/stream-reader.acl\"

$STREAM_TOML"
H=(-h 127.0.0.1 -p "$PORT")
history

replay "stream-reader.acl: reader replays \$stream/events from earliest (history, original topics)" 3 "t/1 m1
t/2 m2
t/3 m3" -u reader -t '$stream/events'
denied "stream-reader.acl: user other refused on \$stream/events" -u other -t '$stream/events'
denied "stream-reader.acl: anonymous refused on \$stream/events" -t '$stream/events'
denied "stream-reader.acl: reader refused on \$stream/events/# (auto-create/bind)" -u reader -t '$stream/events/#'
denied "stream-reader.acl: reader refused on \$stream/fresh/t/# (auto-create)" -u reader -t '$stream/fresh/t/#'
denied "stream-reader.acl: reader refused on \$stream/other" -u reader -t '$stream/other'
denied "stream-reader.acl: reader refused on \$s/earliest/t/#" -u reader -t '$s/earliest/t/#'
n="stream-reader.acl: user other subscribes t/# and gets other's t/5 publish"
PLAIN_OUT=$WORK/plain.out
stdbuf -oL -eL mosquitto_sub "${H[@]}" -V mqttv5 -q 1 -u other -d -W 2 -t 't/#' -F 'MSG|%t %p' >"$PLAIN_OUT" 2>&1 &
PLAIN_PID=$!
if wait_grep "$PLAIN_OUT" 'received SUBACK' 5; then
  pub -u other -t t/5 -m m5 || fail "$n" "mosquitto_pub exited $?"
  wait "$PLAIN_PID" 2>/dev/null
  got=$(msgs "$PLAIN_OUT")
  if [ "$got" = "t/5 m5" ]; then pass "$n"; else fail "$n" "got [$(paste -sd ';' <<<"$got")]"; fi
else
  fail "$n" "no SUBACK"
fi

run_paho reader
stop_broker

summary acl-streams
exit "$N_FAIL"
