#!/usr/bin/env bash
# Authentication and ACL end to end with Debian's mosquitto clients (and mosquitto_passwd):
#   - the default ACL refuses `$stream/...` subscriptions and keeps `#` away from them;
#   - acl/examples/stream-reader.acl lets user `reader` (and nobody else) subscribe `$stream/events`;
#   - a file made by mosquitto_passwd authenticates; a wrong password gets CONNACK 0x86 / 0x04;
#   - SIGHUP reloads the ACL; a broken file keeps the rules in force;
#   - a reload revokes what the new rules deny: a mosquitto_sub on a topic and one on a
#     `$stream/` replay are disconnected (0x87) and get nothing published after the reload.
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

kill "$BROKER_PID"; wait "$BROKER_PID" 2>/dev/null; BROKER_PID=""

# --- a reload revokes ------------------------------------------------------------------------
printf 'default deny\nallow all publish filter:#\nallow all subscribe filter:live/#\nallow all subscribe filter:$stream/events\n' >"$WORK/revoke.acl"
start_broker "[server]
acl_file = \"$WORK/revoke.acl\"
[[streams]]
name = \"events\"
topic_filter = \"ev/#\""
timeout 20 mosquitto_sub -p "$PORT" -V mqttv5 -q 1 -t 'live/#' -v >"$WORK/live.out" 2>&1 &
SUB1=$!
timeout 20 mosquitto_sub -p "$PORT" -V mqttv5 -q 1 -t '$stream/events' -D subscribe user-property stream-offset earliest >"$WORK/stream.out" 2>&1 &
SUB2=$!
sleep 0.5
mosquitto_pub -p "$PORT" -V mqttv5 -q 1 -t live/x -m before-reload
mosquitto_pub -p "$PORT" -V mqttv5 -q 1 -t ev/x -m stream-before-reload
wait_grep "$WORK/live.out" "before-reload" 5 && wait_grep "$WORK/stream.out" "stream-before-reload" 5 &&
  pass "revoke: both subscribers receive before the reload" ||
  fail "revoke: both subscribers receive before the reload" "$(cat "$WORK/live.out" "$WORK/stream.out")"
printf 'default deny\nallow all publish filter:#\n' >"$WORK/revoke.acl"
kill -HUP "$BROKER_PID"
revoked_ok=
for _ in $(seq 1 50); do
  if sed 's/\x1b\[[0-9;]*m//g' "$BROKER_LOG" | grep -q "were revoked revoked=2"; then revoked_ok=1; break; fi
  sleep 0.1
done
if [ -n "$revoked_ok" ]; then
  pass "revoke: SIGHUP reports 2 subscriptions revoked"
else
  fail "revoke: SIGHUP reports 2 subscriptions revoked" "$(grep -i -E 'reload|revoked' "$BROKER_LOG" | tail -3)"
fi
sleep 0.3
mosquitto_pub -p "$PORT" -V mqttv5 -q 1 -t live/x -m after-reload
mosquitto_pub -p "$PORT" -V mqttv5 -q 1 -t ev/x -m stream-after-reload
sleep 0.5
if grep -q "after-reload" "$WORK/live.out" "$WORK/stream.out"; then
  fail "revoke: nothing arrives after the reload" "$(cat "$WORK/live.out" "$WORK/stream.out")"
else
  pass "revoke: nothing arrives after the reload"
fi
gone=0
for p in $SUB1 $SUB2; do
  for _ in $(seq 1 40); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
  kill -0 "$p" 2>/dev/null || gone=$((gone + 1))
done
[ "$gone" = 2 ] && pass "revoke: both subscribers were disconnected" ||
  fail "revoke: both subscribers were disconnected" "$gone of 2 gone; $(cat "$WORK/live.out" "$WORK/stream.out")"
kill $SUB1 $SUB2 2>/dev/null

summary auth-acl
exit "$N_FAIL"
