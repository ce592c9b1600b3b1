#!/usr/bin/env bash
# A storage failure, for real: the broker's data directory on a small tmpfs (mounted here, 64
# MiB) with the admin API on. Under QoS 1 publishes (mosquitto_pub), another file fills the
# disk, until the log fails a write and goes fail-stop (docs/durability.md, "A storage
# failure"). Checks:
#   - before: GET /api/v5/status 200, lanemq_log_failed 0;
#   - once the disk is full: a QoS 1 publish is not acknowledged, GET /api/v5/status answers
#     503 naming the storage error, lanemq_log_failed 1, /api/v5/stats log.failed and
#     log.failure, the broker logs the fail-stop;
#   - freeing the space does not make it claim health again (it does not resume by itself);
#   - after a restart on the freed disk: status 200, and every QoS 1 message acknowledged
#     before the failure is still there (a persistent subscriber gets them all).
#
#   sudo bash interop/storage-full.sh
#
# Needs root (mount). Installs mosquitto-clients and curl when missing (Debian).
set -uo pipefail
source "$(dirname "$0")/lib.sh"

if [ "$(id -u)" != 0 ]; then
  echo "storage-full needs root (mount -t tmpfs)" >&2
  exit 2
fi
if [ "$INTEROP_BROKER" != lanemq ]; then
  echo "the health check and the metrics are lanemq's: no mosquitto baseline" >&2
  exit 0
fi
require_mosquitto_clients
command -v curl >/dev/null || apt_install curl || true
command -v curl >/dev/null || { echo "curl missing and apt-get install curl failed" >&2; exit 2; }

DISK=$WORK/data
mkdir -p "$DISK"
if ! mount -t tmpfs -o size=64m tmpfs "$DISK"; then
  echo "cannot mount a tmpfs on $DISK" >&2
  exit 2
fi
storage_exit() {
  local rc=$?
  stop_broker 2>/dev/null || true
  umount "$DISK" 2>/dev/null || umount -l "$DISK" 2>/dev/null || true
  (exit "$rc")
  cleanup
}
trap storage_exit EXIT

HPORT=$(free_port)
CONF="[admin]
enable = true
bind = \"127.0.0.1:$HPORT\"
token = \"storage-full-token\"

[storage]
segment_bytes_max = 4194304
fsync = \"always\""
API=http://127.0.0.1:$HPORT/api/v5
AUTH=(-H "Authorization: Bearer storage-full-token")

status_code() { curl -s -o "$WORK/status.body" -w '%{http_code}' --max-time 3 "$API/status"; }
log_failed() { curl -s --max-time 3 "${AUTH[@]}" "http://127.0.0.1:$HPORT/metrics" | awk '$1 == "lanemq_log_failed" {print $2}'; }
wait_http() {
  local i
  for i in $(seq 1 100); do
    [ "$(status_code)" != 000 ] && return 0
    sleep 0.1
  done
  return 1
}

start_broker "$CONF"
wait_http || { fail start "the admin API did not answer"; summary storage-full; exit 1; }

# A persistent subscriber that goes offline: what was acknowledged waits for it in the log.
mosquitto_sub -p "$PORT" -i keeper -c -q 1 -t 'disk/#' -W 1 >/dev/null 2>&1
code=$(status_code)
[ "$code" = 200 ] && pass "status 200 on a healthy broker" || fail "status 200 on a healthy broker" "got $code: $(cat "$WORK/status.body")"
[ "$(log_failed)" = 0 ] && pass "lanemq_log_failed 0 on a healthy broker" || fail "lanemq_log_failed 0 on a healthy broker" "got '$(log_failed)'"

# 100 acknowledged messages of 8 KiB before the failure.
head -c 8192 /dev/urandom | base64 -w0 | head -c 8192 >"$WORK/payload"
acked=0
for i in $(seq 1 100); do
  if mosquitto_pub -p "$PORT" -i "pub-before" -q 1 -t "disk/before" -f "$WORK/payload" 2>/dev/null; then
    acked=$((acked + 1))
  fi
done
[ "$acked" = 100 ] && pass "100 QoS 1 messages acknowledged before the disk fills" || fail "100 QoS 1 messages acknowledged before the disk fills" "acked $acked"

# Another file takes every free byte, then publishes go on until one is refused.
dd if=/dev/zero of="$DISK/filler" bs=1M 2>/dev/null
refused=0
for i in $(seq 1 400); do
  if ! timeout 10 mosquitto_pub -p "$PORT" -i "pub-full" -q 1 -t "disk/full" -f "$WORK/payload" 2>/dev/null; then
    refused=1
    break
  fi
done
[ "$refused" = 1 ] && pass "a QoS 1 publish on a full disk is not acknowledged (after $i)" || fail "a QoS 1 publish on a full disk is not acknowledged" "400 publishes of 8 KiB all acknowledged on a full 64 MiB disk"

code=$(status_code)
body=$(cat "$WORK/status.body")
if [ "$code" = 503 ] && grep -q "cannot store messages" <<<"$body"; then
  pass "status 503 with the reason: ${body%$'\n'}"
else
  fail "status 503 once the log refuses writes" "got $code: $body"
fi
[ "$(log_failed)" = 1 ] && pass "lanemq_log_failed 1" || fail "lanemq_log_failed 1" "got '$(log_failed)'"
stats=$(curl -s --max-time 3 "${AUTH[@]}" "$API/stats")
if python3 -c 'import json,sys; l=json.loads(sys.argv[1])["log"]; sys.exit(0 if l["failed"] is True and l["failure"] else 1)' "$stats"; then
  pass "/api/v5/stats: log.failed true and log.failure"
else
  fail "/api/v5/stats: log.failed true and log.failure" "$(head -c 300 <<<"$stats")"
fi
wait_grep "$BROKER_LOG" "fail-stop" 5 && pass "the broker logs the fail-stop" || fail "the broker logs the fail-stop" "no 'fail-stop' line"

# Space back: the broker still says it cannot store (it never resumes by itself).
rm -f "$DISK/filler"
sleep 1
code=$(status_code)
[ "$code" = 503 ] && pass "still 503 after the space is freed (no resume without a restart)" || fail "still 503 after the space is freed" "got $code"

# Restart on the freed disk: healthy, and every acknowledged message is there.
stop_broker
start_broker "$CONF"
wait_http || fail restart "the admin API did not answer after the restart"
code=$(status_code)
[ "$code" = 200 ] && pass "status 200 after a restart on a freed disk" || fail "status 200 after a restart" "got $code: $(cat "$WORK/status.body")"
got=$(timeout 20 mosquitto_sub -p "$PORT" -i keeper -c -q 1 -t 'disk/#' -C 1000 -W 5 -F '%t' 2>/dev/null | grep -c '^disk/before$')
[ "$got" -ge 100 ] && pass "the persistent subscriber gets all 100 acknowledged messages after the restart" || fail "acknowledged messages kept" "got $got of 100"

summary storage-full
[ "$N_FAIL" -eq 0 ]
