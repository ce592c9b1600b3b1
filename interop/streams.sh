#!/usr/bin/env bash
# Named streams ($stream/<name>) end to end with the real mosquitto_pub / mosquitto_sub clients:
# replay from earliest with the original topics, latest, history then live without a gap or
# duplicate, @<position> resume, the stream user properties, and the refusals (MQTT 3.1.1,
# an unparsable stream-offset, a filter that does not match the stream's). Semantics:
# /work/shared/spec/streams.md. Starts its own broker on a free 127.0.0.1 port (ACL
# `default allow`, one stream `events` capturing `t/#`).
#
#   bash interop/streams.sh
#
# Environment: LANEMQ_BIN, KEEP_TMP=1 (see lib.sh). Exit status: the number of failures.
set -uo pipefail
source "$(dirname "$0")/lib.sh"

require_mosquitto_clients
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
topic_filter = \"t/#\""

H=(-h 127.0.0.1 -p "$PORT")
SUBV5=(-V mqttv5 -q 1)
off() { echo -D subscribe user-property stream-offset "$1"; }

pub() { timeout 10 mosquitto_pub "${H[@]}" -V mqttv5 -q 1 "$@"; }

# sub_bg NAME SECONDS [mosquitto_sub args...]: a subscriber in the background (bounded by -W),
# debug output on; waits for its SUBACK. Sets SUB_PID and SUB_OUT. Messages are printed with
# a format that starts with "MSG|".
sub_bg() {
  local name=$1 secs=$2
  shift 2
  SUB_OUT=$WORK/$name.out
  stdbuf -oL -eL mosquitto_sub "${H[@]}" -d -W "$secs" "$@" >"$SUB_OUT" 2>&1 &
  SUB_PID=$!
  wait_grep "$SUB_OUT" 'received SUBACK' 5
}
wait_sub() { wait "$1" 2>/dev/null || true; }
msgs() { grep '^MSG|' "$1" | sed 's/^MSG|//'; }
n_msgs() { grep -c '^MSG|' "$1" 2>/dev/null || true; }

expect() {
  local name=$1 file=$2 want=$3 got
  got=$(msgs "$file")
  if [ "$got" = "$want" ]; then
    pass "$name"
  else
    fail "$name" "expected [$(echo "$want" | paste -sd ';')] got [$(echo "$got" | paste -sd ';')]"
  fi
}

# wait_count FILE N SECONDS: until FILE holds at least N message lines.
wait_count() {
  local file=$1 n=$2 secs=$3 i
  for ((i = 0; i < secs * 20; i++)); do
    [ "$(n_msgs "$file")" -ge "$n" ] && return 0
    sleep 0.05
  done
  return 1
}

# ---------------------------------------------------------------------------------------------

HIST="MSG|t/1 m1
MSG|t/2 m2
MSG|t/3 m3
MSG|t/4 m4
MSG|t/5 m5"

t_history() {
  local n="earliest replays the 5 messages published before any subscriber, original topics, in order"
  local i
  for i in 1 2 3 4 5; do
    pub -t "t/$i" -m "m$i" || { fail "$n" "mosquitto_pub t/$i exited $?"; return; }
  done
  local out=$WORK/history.out
  # shellcheck disable=SC2046
  timeout 10 mosquitto_sub "${H[@]}" "${SUBV5[@]}" $(off earliest) -t '$stream/events' \
    -C 5 -W 5 -F 'MSG|%t %p' >"$out" 2>&1
  expect "$n" "$out" "$(sed 's/^MSG|//' <<<"$HIST")"
}

t_latest() {
  local n="latest (and no stream-offset) deliver only what is published after the subscription"
  # shellcheck disable=SC2046
  sub_bg latest 3 "${SUBV5[@]}" $(off latest) -t '$stream/events' -F 'MSG|%t %p' ||
    { fail "$n" "no SUBACK (latest)"; return; }
  local p1=$SUB_PID o1=$SUB_OUT
  sub_bg latest-default 3 "${SUBV5[@]}" -t '$stream/events' -F 'MSG|%t %p' ||
    { fail "$n" "no SUBACK (no stream-offset)"; return; }
  local p2=$SUB_PID o2=$SUB_OUT
  pub -t t/6 -m m6 || { fail "$n" "mosquitto_pub exited $?"; return; }
  wait_sub "$p1"
  wait_sub "$p2"
  expect "stream-offset latest delivers only a message published after SUBSCRIBE" "$o1" "t/6 m6"
  expect "no stream-offset means latest" "$o2" "t/6 m6"
}

t_history_then_live() {
  local n="earliest: history, then live messages, no gap, no duplicate"
  # m7 is published right after the SUBACK (while the history is being replayed), m8 after
  # the whole history arrived.
  # shellcheck disable=SC2046
  sub_bg live 4 "${SUBV5[@]}" $(off earliest) -t '$stream/events' -F 'MSG|%t %p' ||
    { fail "$n" "no SUBACK"; return; }
  local p=$SUB_PID o=$SUB_OUT
  pub -t t/7 -m m7 || { fail "$n" "mosquitto_pub exited $?"; return; }
  if ! wait_count "$o" 7 3; then
    fail "$n" "only $(n_msgs "$o") of the first 7 messages within 3 s"
    wait_sub "$p"
    return
  fi
  pub -t t/8 -m m8 || { fail "$n" "mosquitto_pub exited $?"; return; }
  wait_sub "$p"
  expect "$n" "$o" "$(sed 's/^MSG|//' <<<"$HIST")
t/6 m6
t/7 m7
t/8 m8"
}

OFFSETS=()
t_user_properties() {
  local n="delivered messages carry user properties stream-offset (@<n>), ts (µs), key (-F %P)"
  local out=$WORK/props.out
  # shellcheck disable=SC2046
  timeout 10 mosquitto_sub "${H[@]}" "${SUBV5[@]}" $(off earliest) -t '$stream/events' \
    -C 5 -W 5 -F 'MSG|%t|%P' >"$out" 2>&1
  local got bad=""
  got=$(msgs "$out")
  if [ "$(wc -l <<<"$got")" -ne 5 ]; then
    fail "$n" "expected 5 messages, got [$(paste -sd ';' <<<"$got")]"
    return
  fi
  local now_us line off_
  now_us=$(($(date +%s) * 1000000))
  while IFS= read -r line; do
    off_=$(grep -oE 'stream-offset:@[0-9]+' <<<"$line" | head -1 | cut -d@ -f2)
    local ts
    ts=$(grep -oE '(^|[ |])ts:[0-9]+' <<<"$line" | head -1 | grep -oE '[0-9]+$')
    if [ -z "$off_" ]; then bad="no stream-offset:@N in [$line]"; break; fi
    if [ -z "$ts" ] || [ "$ts" -gt $((now_us + 5000000)) ] || [ "$ts" -lt $((now_us - 600000000)) ]; then
      bad="ts missing or not a recent µs timestamp in [$line]"
      break
    fi
    if ! grep -qE '(^|[ |])key:' <<<"$line"; then bad="no key property in [$line]"; break; fi
    OFFSETS+=("$off_")
  done <<<"$got"
  if [ -n "$bad" ]; then fail "$n" "$bad"; return; fi
  local i
  for ((i = 1; i < ${#OFFSETS[@]}; i++)); do
    if [ "${OFFSETS[i]}" -le "${OFFSETS[i - 1]}" ]; then
      fail "$n" "stream-offset positions not increasing: ${OFFSETS[*]}"
      return
    fi
  done
  pass "$n (offsets ${OFFSETS[*]})"
}

t_position() {
  local n="stream-offset @<n> (a delivered message's position) resumes after that message"
  if [ "${#OFFSETS[@]}" -lt 2 ]; then
    skip "$n" "no positions from the user-properties scenario"
    return
  fi
  local out=$WORK/position.out
  # shellcheck disable=SC2046
  timeout 10 mosquitto_sub "${H[@]}" "${SUBV5[@]}" $(off "@${OFFSETS[1]}") -t '$stream/events' \
    -C 3 -W 5 -F 'MSG|%t %p' >"$out" 2>&1
  expect "$n (@${OFFSETS[1]} = position of m2)" "$out" "t/3 m3
t/4 m4
t/5 m5"
}

# refused NAME CODE ARGS...: mosquitto_sub must report that every subscription was denied
# ("All subscription requests were denied.", SUBACK reason code CODE, decimal as mosquitto_sub
# -d prints it) and print no message. mosquitto_sub 2.0 then disconnects cleanly: exit status 0.
refused() {
  local name=$1 want=$2 out=$WORK/refused.out rc
  shift 2
  timeout 10 mosquitto_sub "${H[@]}" -d -W 2 -F 'MSG|%t %p' "$@" >"$out" 2>&1
  rc=$?
  local code
  code=$(grep -oE 'Subscribed \(mid: [0-9]+\): [0-9]+' "$out" | head -1 | grep -oE '[0-9]+$')
  if grep -q 'All subscription requests were denied' "$out" && [ "${code:-}" = "$want" ] && [ "$(n_msgs "$out")" = 0 ]; then
    pass "$name (SUBACK $(printf '0x%02X' "$code"))"
  else
    fail "$name" "expected SUBACK $want; exit $rc, SUBACK ${code:-?}, output [$(grep -v '^Client' "$out" | head -5 | paste -sd ';')]"
  fi
}

t_v311_refused() {
  refused "MQTT 3.1.1 subscriber on \$stream/events is refused" 128 -V mqttv311 -q 1 -t '$stream/events'
}

t_bad_offset() {
  # shellcheck disable=SC2046
  refused "unparsable stream-offset (bogus) is refused" 131 "${SUBV5[@]}" $(off bogus) -t '$stream/events'
  # shellcheck disable=SC2046
  refused "stream-offset @ without a position is refused" 131 "${SUBV5[@]}" $(off @) -t '$stream/events'
}

t_bound_filter() {
  local n="\$stream/events/t/# (the stream's own filter) binds to events"
  local out=$WORK/bound.out
  # shellcheck disable=SC2046
  timeout 10 mosquitto_sub "${H[@]}" "${SUBV5[@]}" $(off earliest) -t '$stream/events/t/#' \
    -C 2 -W 5 -F 'MSG|%t %p' >"$out" 2>&1
  expect "$n" "$out" "t/1 m1
t/2 m2"
  # shellcheck disable=SC2046
  refused "\$stream/events/x/# (a different filter than the stream's) is refused" 131 "${SUBV5[@]}" $(off earliest) -t '$stream/events/x/#'
}

t_ordinary_unaffected() {
  local n="ordinary subscribers of t/# still get t/... publishes once"
  sub_bg plain 2 -V mqttv5 -q 1 -t 't/#' -F 'MSG|%t %p' || { fail "$n" "no SUBACK"; return; }
  local p=$SUB_PID o=$SUB_OUT
  pub -t t/9 -m m9 || { fail "$n" "mosquitto_pub exited $?"; return; }
  wait_sub "$p"
  expect "$n" "$o" "t/9 m9"
}

SCENARIOS=(t_history t_latest t_history_then_live t_user_properties t_position t_v311_refused
  t_bad_offset t_bound_filter t_ordinary_unaffected)
# The scenarios build on each other (the stream's content grows from one to the next): always
# all of them, in this order.
for s in "${SCENARIOS[@]}"; do
  "$s"
done

summary streams
exit "$N_FAIL"
