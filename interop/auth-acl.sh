#!/usr/bin/env bash
# Authentication and ACL end to end with Debian's mosquitto clients (and mosquitto_passwd):
#   - the default ACL refuses `$stream/...` subscriptions and keeps `#` away from them;
#   - acl/examples/stream-reader.acl lets user `reader` (and nobody else) subscribe `$stream/events`;
#   - a file made by mosquitto_passwd authenticates; a wrong password gets CONNACK 0x86 / 0x04;
#   - SIGHUP reloads the ACL; a broken file keeps the rules in force.
# Exit status: the number of failed scenarios.
set -uo pipefail
source "$(dirname "$0")/lib.sh"

for tool in mosquitto_sub mosquitto_pub mosquitto_passwd; do
  if ! command -v "$tool" >/dev/null; then
    echo "$tool not found (apt-get install mosquitto-clients mosquitto)" >&2
    exit 2
  fi
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)

# sub_result NAME ARGS...: run mosquitto_sub once (1 s), print "denied" / "granted".
sub_result() {
  local out
  out=$(timeout 5 mosquitto_sub -p "$PORT" -W 1 "$@" 2>&1)
  if grep -q "denied" <<<"$out"; then echo denied; else echo granted; fi
}

# --- default ACL --------------------------------------------------------------------------
start_broker ""
for v in mqttv5 mqttv311; do
  r=$(sub_result -V "$v" -t '$stream/events')
  [ "$r" = denied ] && pass "default ACL refuses \$stream/events ($v)" || fail "default ACL refuses \$stream/events ($v)" "got $r"
  r=$(sub_result -V "$v" -t '$s/earliest/#')
  [ "$r" = denied ] && pass "default ACL refuses \$s/earliest/# ($v)" || fail "default ACL refuses \$s/earliest/# ($v)" "got $r"
done
r=$(sub_result -V mqttv5 -t 'plain/#')
[ "$r" = granted ] && pass "default ACL allows ordinary filters" || fail "default ACL allows ordinary filters" "got $r"
# A subscriber to '#' gets ordinary traffic, never `$stream/` traffic.
timeout 4 mosquitto_sub -p "$PORT" -V mqttv5 -t '#' -v -W 3 >"$WORK/hash.out" 2>&1 &
HASH_PID=$!
sleep 0.5
mosquitto_pub -p "$PORT" -V mqttv5 -t '$stream/events' -m secret -q 1 >/dev/null 2>&1 || true
mosquitto_pub -p "$PORT" -V mqttv5 -t 'plain/x' -m visible -q 1
wait "$HASH_PID"
if grep -q "plain/x visible" "$WORK/hash.out" && ! grep -q secret "$WORK/hash.out"; then
  pass "'#' receives ordinary traffic and no \$stream/ traffic"
else
  fail "'#' receives ordinary traffic and no \$stream/ traffic" "$(cat "$WORK/hash.out")"
fi
kill "$BROKER_PID"; wait "$BROKER_PID" 2>/dev/null; BROKER_PID=""

# --- the stream-reader example --------------------------------------------------------------
start_broker "[server]
acl_file = \"$ROOT/acl/examples/stream-reader.acl\""
r=$(sub_result -V mqttv5 -u reader -t '$stream/events')
[ "$r" = granted ] && pass "reader may subscribe \$stream/events" || fail "reader may subscribe \$stream/events" "got $r"
r=$(sub_result -V mqttv5 -u reader -t '$stream/other')
[ "$r" = denied ] && pass "reader may not subscribe \$stream/other" || fail "reader may not subscribe \$stream/other" "got $r"
r=$(sub_result -V mqttv5 -u reader -t '$s/earliest/#')
[ "$r" = denied ] && pass "reader may not use \$s/" || fail "reader may not use \$s/" "got $r"
r=$(sub_result -V mqttv5 -u someone -t '$stream/events')
[ "$r" = denied ] && pass "others may not subscribe \$stream/events" || fail "others may not subscribe \$stream/events" "got $r"
r=$(sub_result -V mqttv5 -u someone -t 'a/b')
[ "$r" = granted ] && pass "others may subscribe ordinary topics" || fail "others may subscribe ordinary topics" "got $r"
kill "$BROKER_PID"; wait "$BROKER_PID" 2>/dev/null; BROKER_PID=""

# --- a password file made by mosquitto_passwd -------------------------------------------------
mosquitto_passwd -c -b "$WORK/passwd" alice 'correct horse' >/dev/null
start_broker "[server]
password_file = \"$WORK/passwd\"
allow_anonymous = false"
for v in mqttv5 mqttv311; do
  if mosquitto_pub -p "$PORT" -V "$v" -u alice -P 'correct horse' -t a -m x -q 1 2>/dev/null; then
    pass "mosquitto_passwd entry authenticates ($v)"
  else
    fail "mosquitto_passwd entry authenticates ($v)" "refused"
  fi
  out=$(mosquitto_pub -p "$PORT" -V "$v" -u alice -P wrong -t a -m x 2>&1)
  if grep -qi "bad user name or password" <<<"$out"; then
    pass "wrong password refused with bad user name or password ($v)"
  else
    fail "wrong password refused ($v)" "$out"
  fi
  out=$(mosquitto_pub -p "$PORT" -V "$v" -t a -m x 2>&1)
  if grep -qiE "refused|bad user name" <<<"$out"; then pass "anonymous refused ($v)"; else fail "anonymous refused ($v)" "$out"; fi
done
if grep -q "correct horse" "$BROKER_LOG"; then fail "password never logged" "found in the log"; else pass "password never logged"; fi
kill "$BROKER_PID"; wait "$BROKER_PID" 2>/dev/null; BROKER_PID=""

# --- SIGHUP reload --------------------------------------------------------------------------
printf 'default deny\nallow all publish,subscribe filter:open/#\n' >"$WORK/live.acl"
start_broker "[server]
acl_file = \"$WORK/live.acl\""
r=$(sub_result -V mqttv5 -t 'later/x')
[ "$r" = denied ] && pass "before reload: later/x denied" || fail "before reload: later/x denied" "got $r"
printf 'default deny\nallow all publish,subscribe filter:#\n' >"$WORK/live.acl"
kill -HUP "$BROKER_PID"
wait_grep "$BROKER_LOG" "reloaded" 5 || true
r=$(sub_result -V mqttv5 -t 'later/x')
[ "$r" = granted ] && pass "SIGHUP reload: later/x granted" || fail "SIGHUP reload: later/x granted" "got $r"
printf 'default deny\nallow all bogus filter:#\n' >"$WORK/live.acl"
kill -HUP "$BROKER_PID"
if wait_grep "$BROKER_LOG" "reload failed.*live.acl:2" 5; then
  pass "broken ACL reported with file:line"
else
  fail "broken ACL reported with file:line" "$(grep -i reload "$BROKER_LOG" | tail -2)"
fi
r=$(sub_result -V mqttv5 -t 'later/x')
[ "$r" = granted ] && pass "broken ACL: previous rules stay in force" || fail "broken ACL: previous rules stay in force" "got $r"

summary auth-acl
exit "$N_FAIL"
