#!/usr/bin/env bash
# Interop with the real mosquitto_pub / mosquitto_sub clients, MQTT 3.1.1 and MQTT 5.
# Starts its own broker on a free 127.0.0.1 port; prints PASS/FAIL per scenario and exits
# non-zero if any failed. See docs/testing.md.
#
#   bash interop/mosquitto-clients.sh [SCENARIO_SUBSTRING...]
#
# Environment: LANEMQ_BIN, INTEROP_BROKER=mosquitto (baseline run), KEEP_TMP=1 (see lib.sh).
set -uo pipefail
source "$(dirname "$0")/lib.sh"

require_mosquitto_clients

start_broker '[server]
sys_interval_s = 1'

H=(-h 127.0.0.1 -p "$PORT")
FMT='MSG|%t|%q|%r|%p'
SUB_PID=""
SUB_OUT=""

# sub_bg NAME VERSION SECONDS [mosquitto_sub args...]: start a subscriber in the background
# (bounded by -W SECONDS), wait for its SUBACK. Sets SUB_PID and SUB_OUT. The caller passes
# -F/-C/-t etc.; messages must be printed with a format starting with "MSG|".
sub_bg() {
  local name=$1 ver=$2 secs=$3
  shift 3
  SUB_OUT=$WORK/$name.out
  stdbuf -oL -eL mosquitto_sub "${H[@]}" -V "$ver" -d -W "$secs" "$@" >"$SUB_OUT" 2>&1 &
  SUB_PID=$!
  if ! wait_grep "$SUB_OUT" 'received SUBACK' 5; then
    return 1
  fi
}

# msgs FILE: the message lines (without the MSG| marker), in order.
msgs() { grep '^MSG|' "$1" | sed 's/^MSG|//'; }

# wait_sub PID: wait for a background subscriber (already bounded by -W).
wait_sub() { wait "$1" 2>/dev/null || true; }

pub() {
  local ver=$1
  shift
  timeout 10 mosquitto_pub "${H[@]}" -V "$ver" "$@"
}

# expect NAME FILE EXPECTED: compare the message lines of FILE with EXPECTED (newline list).
expect() {
  local name=$1 file=$2 want=$3 got
  got=$(msgs "$file")
  if [ "$got" = "$want" ]; then
    pass "$name"
  else
    fail "$name" "expected [$(echo "$want" | paste -sd ';')] got [$(echo "$got" | paste -sd ';')]"
  fi
}

v_tag() { [ "$1" = mqttv5 ] && echo v5 || echo v311; }

# ---------------------------------------------------------------------------------------------

t_qos_delivery() {
  local V=$1 T n
  n="$(v_tag "$V") qos 0/1/2 delivery"
  T="qos/$(v_tag "$V")"
  sub_bg qos2-$V "$V" 10 -q 2 -t "$T" -C 3 -F "$FMT" || { fail "$n" "no SUBACK"; return; }
  local p2=$SUB_PID o2=$SUB_OUT
  sub_bg qos1-$V "$V" 10 -q 1 -t "$T" -C 3 -F "$FMT" || { fail "$n" "no SUBACK"; return; }
  local p1=$SUB_PID o1=$SUB_OUT
  local q
  for q in 0 1 2; do
    pub "$V" -q "$q" -t "$T" -m "m$q" || { fail "$n" "mosquitto_pub -q $q exited $?"; return; }
  done
  wait_sub "$p2"
  wait_sub "$p1"
  expect "$n (subscription QoS 2)" "$o2" "$T|0|0|m0
$T|1|0|m1
$T|2|0|m2"
  expect "$n (subscription QoS 1 downgrades)" "$o1" "$T|0|0|m0
$T|1|0|m1
$T|1|0|m2"
}

t_retained() {
  local V=$1 T n
  n="$(v_tag "$V") retained"
  T="ret/$(v_tag "$V")"
  pub "$V" -q 1 -r -t "$T" -m keep || { fail "$n set" "mosquitto_pub exited $?"; return; }
  sub_bg ret1-$V "$V" 5 -q 1 -t "$T" -C 1 -F "$FMT" || { fail "$n" "no SUBACK"; return; }
  wait_sub "$SUB_PID"
  expect "$n: delivered to a late subscriber with RETAIN=1" "$SUB_OUT" "$T|1|1|keep"
  # Live subscriber sees the clearing message (zero-length payload, forwarded like any other).
  pub "$V" -q 1 -r -n -t "$T" || { fail "$n clear" "mosquitto_pub exited $?"; return; }
  sub_bg ret2-$V "$V" 2 -q 1 -t "$T" -F "$FMT" || { fail "$n" "no SUBACK"; return; }
  wait_sub "$SUB_PID"
  expect "$n: cleared by an empty retained publish (-r -n)" "$SUB_OUT" ""
}

t_wildcards() {
  local V=$1 B n
  B="wc/$(v_tag "$V")"
  n="$(v_tag "$V") wildcards"
  sub_bg wcp-$V "$V" 10 -q 1 -t "$B/+/x" -C 2 -F "$FMT" || { fail "$n" "no SUBACK"; return; }
  local pp=$SUB_PID op=$SUB_OUT
  sub_bg wch-$V "$V" 10 -q 1 -t "$B/#" -C 5 -F "$FMT" || { fail "$n" "no SUBACK"; return; }
  local ph=$SUB_PID oh=$SUB_OUT
  local t
  for t in "$B/a/x" "$B/b/y" "$B/a/x/z" "$B" "$B/end/x"; do
    pub "$V" -q 1 -t "$t" -m p || { fail "$n" "mosquitto_pub exited $?"; return; }
  done
  wait_sub "$pp"
  wait_sub "$ph"
  expect "$n: single-level +" "$op" "$B/a/x|1|0|p
$B/end/x|1|0|p"
  expect "$n: multi-level # (matches the parent too)" "$oh" "$B/a/x|1|0|p
$B/b/y|1|0|p
$B/a/x/z|1|0|p
$B|1|0|p
$B/end/x|1|0|p"
}

t_sys() {
  local V=$1 n
  n="$(v_tag "$V") \$SYS/broker/uptime"
  sub_bg sys-$V "$V" 5 -t '$SYS/broker/uptime' -C 2 -F "$FMT" || { fail "$n" "no SUBACK"; return; }
  wait_sub "$SUB_PID"
  local got
  got=$(msgs "$SUB_OUT")
  if [ "$(echo "$got" | grep -cE '^\$SYS/broker/uptime\|0\|[01]\|[0-9]+( seconds)?$')" = 2 ]; then
    pass "$n readable and republished (sys_interval_s = 1)"
  else
    fail "$n" "expected 2 updates '\$SYS/broker/uptime|0|r|N seconds' within 5 s, got [$(echo "$got" | paste -sd ';')]"
  fi
  # [MQTT-4.7.2-1] '#' must not match topics beginning with '$'.
  sub_bg sysh-$V "$V" 3 -t '#' -F "$FMT" || { fail "$n" "no SUBACK"; return; }
  wait_sub "$SUB_PID"
  if msgs "$SUB_OUT" | grep -q '^\$SYS'; then
    fail "$(v_tag "$V") '#' does not match \$SYS" "got $(msgs "$SUB_OUT" | grep '^\$SYS' | head -3 | paste -sd ';')"
  else
    pass "$(v_tag "$V") '#' does not match \$SYS topics [MQTT-4.7.2-1]"
  fi
}

# start_will_client NAME VERSION [extra args...]: a mosquitto_pub -l client with a will, kept
# connected through a fifo. Sets WILL_PID once CONNACK has been received.
start_will_client() {
  local name=$1 ver=$2
  shift 2
  local fifo=$WORK/$name.fifo
  rm -f "$fifo"
  mkfifo "$fifo"
  stdbuf -oL -eL mosquitto_pub "${H[@]}" -V "$ver" -d -l -t "$name/unused" -i "$name" "$@" <"$fifo" \
    >"$WORK/$name.pub.out" 2>&1 &
  WILL_PID=$!
  exec 7>"$fifo"
  wait_grep "$WORK/$name.pub.out" 'received CONNACK' 5
}
stop_will_fifo() { exec 7>&- || true; }

t_will() {
  local V=$1 T n
  T="will/$(v_tag "$V")"
  n="$(v_tag "$V") will on kill -9"
  sub_bg will-$V "$V" 6 -q 1 -t "$T" -C 1 -F "$FMT" || { fail "$n" "no SUBACK"; return; }
  local sp=$SUB_PID so=$SUB_OUT
  if ! start_will_client "willc-$(v_tag "$V")" "$V" --will-topic "$T" --will-payload gone --will-qos 1; then
    stop_will_fifo
    fail "$n" "will client got no CONNACK"
    return
  fi
  kill -9 "$WILL_PID"
  wait "$WILL_PID" 2>/dev/null
  stop_will_fifo
  wait_sub "$sp"
  expect "$n" "$so" "$T|1|0|gone"
}

t_will_delay() {
  local V=mqttv5 T=will/delay n="v5 will delay interval (-D will will-delay-interval 2, session expiry 10)"
  sub_bg willd "$V" 10 -q 1 -t "$T" -C 1 -F "$FMT" || { fail "$n" "no SUBACK"; return; }
  local sp=$SUB_PID so=$SUB_OUT
  if ! start_will_client willd-c "$V" -x 10 --will-topic "$T" --will-payload late --will-qos 1 \
    -D will will-delay-interval 2; then
    stop_will_fifo
    fail "$n" "will client got no CONNACK"
    return
  fi
  local t0
  t0=$(date +%s%N)
  kill -9 "$WILL_PID"
  wait "$WILL_PID" 2>/dev/null
  stop_will_fifo
  sleep 1
  if [ -n "$(msgs "$so")" ]; then
    fail "$n" "will published less than 1 s after the disconnect (expected after 2 s)"
    wait_sub "$sp"
    return
  fi
  if ! wait_grep "$so" '^MSG\|' 6; then
    fail "$n" "will not published within 7 s"
    return
  fi
  local ms=$((($(date +%s%N) - t0) / 1000000))
  wait_sub "$sp"
  if [ "$ms" -ge 1500 ] && [ "$ms" -le 6000 ]; then
    expect "$n (published after ${ms} ms)" "$so" "$T|1|0|late"
  else
    fail "$n" "will published after $ms ms, expected ~2000"
  fi
}

t_persistent() {
  local V=$1 T id n
  T="pers/$(v_tag "$V")"
  id="pers-$(v_tag "$V")"
  n="$(v_tag "$V") persistent session (-c -q 1): queued while offline"
  # Subscribe, then disconnect (-E: exit once the subscription is acknowledged).
  if ! timeout 10 mosquitto_sub "${H[@]}" -V "$V" -c -i "$id" -q 1 -t "$T" -E >/dev/null 2>&1; then
    fail "$n" "initial subscribe failed"
    return
  fi
  local i
  for i in 1 2 3; do
    pub "$V" -q 1 -t "$T" -m "off$i" || { fail "$n" "mosquitto_pub exited $?"; return; }
  done
  timeout 10 mosquitto_sub "${H[@]}" -V "$V" -c -i "$id" -q 1 -t "$T" -C 3 -W 5 -F "$FMT" \
    >"$WORK/$id.out" 2>&1
  expect "$n" "$WORK/$id.out" "$T|1|0|off1
$T|1|0|off2
$T|1|0|off3"
  # Remove the session again.
  timeout 10 mosquitto_sub "${H[@]}" -V "$V" -i "$id" -t "$T" -E >/dev/null 2>&1 || true
}

t_v5_properties() {
  local V=mqttv5 T=props/v5 n="v5 publish properties forwarded"
  sub_bg props "$V" 10 -q 1 -t "$T" -C 1 -F 'MSG|%t|%P|%C|%E|%R|%D|%F|%p' \
    || { fail "$n" "no SUBACK"; return; }
  local sp=$SUB_PID so=$SUB_OUT
  pub "$V" -q 1 -t "$T" -m body \
    -D publish user-property k v -D publish user-property k2 v2 \
    -D publish content-type text/plain -D publish message-expiry-interval 60 \
    -D publish response-topic resp/v5 -D publish correlation-data corr-42 \
    -D publish payload-format-indicator 1 || { fail "$n" "mosquitto_pub exited $?"; return; }
  wait_sub "$sp"
  local got
  got=$(msgs "$so")
  # %E is the remaining expiry: 59 or 60.
  if [[ "$got" =~ ^props/v5\|k:v\ k2:v2\|text/plain\|(59|60)\|resp/v5\|corr-42\|1\|body$ ]]; then
    pass "$n (user-property order, content-type, message-expiry-interval, response-topic, correlation-data, payload-format-indicator)"
  else
    fail "$n" "expected 'props/v5|k:v k2:v2|text/plain|60|resp/v5|corr-42|1|body' got [$got]"
  fi
}

t_rap() {
  local V=mqttv5 T=rap/v5 n="v5 retain-as-published (--retain-as-published)"
  pub "$V" -q 1 -r -t "$T" -m old || { fail "$n" "mosquitto_pub exited $?"; return; }
  sub_bg rap0 "$V" 10 -q 1 -t "$T" -C 2 -F "$FMT" || { fail "$n" "no SUBACK"; return; }
  local p0=$SUB_PID o0=$SUB_OUT
  sub_bg rap1 "$V" 10 -q 1 -t "$T" -C 2 --retain-as-published -F "$FMT" || { fail "$n" "no SUBACK"; return; }
  local p1=$SUB_PID o1=$SUB_OUT
  pub "$V" -q 1 -r -t "$T" -m new || { fail "$n" "mosquitto_pub exited $?"; return; }
  wait_sub "$p0"
  wait_sub "$p1"
  expect "$n: without rap a live retained message arrives with RETAIN=0" "$o0" "$T|1|1|old
$T|1|0|new"
  expect "$n: with rap it keeps RETAIN=1" "$o1" "$T|1|1|old
$T|1|1|new"
  pub "$V" -q 1 -r -n -t "$T" || true
}

t_no_local_and_retain_handling() {
  # mosquitto_sub 2.0.x has no command-line option for the No Local or Retain Handling
  # subscription options (only --retain-as-published); interop/paho_scenarios.py covers them.
  if mosquitto_sub --help 2>&1 | grep -q -- '--no-local\|--nl'; then
    skip "v5 no-local (mosquitto_sub)" "this mosquitto_sub has a no-local flag; add a scenario"
  else
    skip "v5 no-local / retain handling (mosquitto_sub)" "mosquitto_sub $(mosquitto_sub --help 2>&1 | sed -n 's/.*version \([0-9.]*\).*/\1/p' | head -1) has no flag for them; covered by paho_scenarios.py"
  fi
}

t_subscription_identifier() {
  local V=mqttv5 T=subid/v5 n="v5 subscription identifier (-D subscribe subscription-identifier)"
  sub_bg subid "$V" 10 -q 1 -t "$T" -C 1 -D subscribe subscription-identifier 42 -F 'MSG|%t|%S|%p' \
    || { fail "$n" "no SUBACK (or the client rejected the property: $(head -c 300 "$WORK/subid.out"))"; return; }
  local sp=$SUB_PID so=$SUB_OUT
  pub "$V" -q 1 -t "$T" -m x || { fail "$n" "mosquitto_pub exited $?"; return; }
  wait_sub "$sp"
  expect "$n" "$so" "$T|42|x"
}

t_cross_version() {
  local n="v311 subscriber <- v5 publisher (QoS 2, with v5 properties)"
  sub_bg x311 mqttv311 10 -q 2 -t cross/a -C 1 -F "$FMT" || { fail "$n" "no SUBACK"; return; }
  local sp=$SUB_PID so=$SUB_OUT
  pub mqttv5 -q 2 -t cross/a -m from5 -D publish user-property k v -D publish content-type c \
    || { fail "$n" "mosquitto_pub exited $?"; return; }
  wait_sub "$sp"
  expect "$n" "$so" "cross/a|2|0|from5"
  n="v5 subscriber <- v311 publisher (QoS 2)"
  sub_bg x5 mqttv5 10 -q 2 -t cross/b -C 1 -F 'MSG|%t|%q|%r|%P|%p' || { fail "$n" "no SUBACK"; return; }
  sp=$SUB_PID so=$SUB_OUT
  pub mqttv311 -q 2 -t cross/b -m from311 || { fail "$n" "mosquitto_pub exited $?"; return; }
  wait_sub "$sp"
  expect "$n" "$so" "cross/b|2|0||from311"
}

t_bulk() {
  local V=$1 tag T n
  tag=$(v_tag "$V")
  T="bulk/$tag"
  n="$tag 1000 QoS 1 messages in order (mosquitto_pub -l)"
  sub_bg bulk-$V "$V" 20 -q 1 -t "$T" -C 1000 -F 'MSG|%p' || { fail "$n" "no SUBACK"; return; }
  local sp=$SUB_PID so=$SUB_OUT
  seq 1 1000 | timeout 20 mosquitto_pub "${H[@]}" -V "$V" -q 1 -t "$T" -l \
    || { fail "$n" "mosquitto_pub -l exited $?"; return; }
  wait_sub "$sp"
  expect "$n" "$so" "$(seq 1 1000)"
  n="$tag 300 KB retained payload intact"
  head -c 300000 /dev/urandom >"$WORK/big-$tag.bin"
  pub "$V" -q 1 -r -t "$T/big" -f "$WORK/big-$tag.bin" || { fail "$n" "mosquitto_pub exited $?"; return; }
  timeout 10 mosquitto_sub "${H[@]}" -V "$V" -q 1 -t "$T/big" -C 1 -W 5 -N -F '%p' >"$WORK/big-$tag.out" 2>/dev/null
  if cmp -s "$WORK/big-$tag.bin" "$WORK/big-$tag.out"; then
    pass "$n"
  else
    fail "$n" "received $(stat -c %s "$WORK/big-$tag.out") bytes, differing from the 300000 sent"
  fi
  pub "$V" -q 1 -r -n -t "$T/big" || true
}

SCENARIOS=()
for V in mqttv311 mqttv5; do
  SCENARIOS+=("t_qos_delivery $V" "t_retained $V" "t_wildcards $V" "t_sys $V" "t_will $V" "t_persistent $V" "t_bulk $V")
done
SCENARIOS+=(t_will_delay t_v5_properties t_rap t_subscription_identifier t_no_local_and_retain_handling t_cross_version)

for s in "${SCENARIOS[@]}"; do
  if [ $# -gt 0 ]; then
    match=0
    for f in "$@"; do [[ "$s" == *"$f"* ]] && match=1; done
    [ "$match" = 1 ] || continue
  fi
  $s
done

summary mosquitto-clients
[ "$N_FAIL" -eq 0 ]
