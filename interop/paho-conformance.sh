#!/usr/bin/env bash
# Run the Eclipse Paho interoperability client tests (MQTT 3.1.1 client_test.py and
# MQTT 5 client_test5.py) against a freshly started broker.
#
# Usage: interop/paho-conformance.sh [PAHO_DIR]
#
#   PAHO_DIR   a checkout of https://github.com/eclipse/paho.mqtt.testing (or its
#              interoperability/ folder). Default: $PAHO_DIR, else /tmp/paho.
#              If it is not found the script prints how to get it and exits 0 ("skipped").
#              The suite is never vendored into this repository.
#
# Environment:
#   BROKER=lanemq|mosquitto   broker to test (default lanemq; mosquitto = baseline)
#   LANEMQ_BIN                lanemq binary (default target/release/lanemq)
#   MOSQUITTO_BIN             mosquitto binary (default: mosquitto on PATH, else /usr/sbin/mosquitto)
#   SUITES="v311 v5"          which suites to run
#   PAHO_TESTS="test_a ..."   run only these test method names (both suites)
#   TEST_TIMEOUT=90           seconds one test may take; a hung test is recorded as TIMEOUT
#                             and the suite resumes (fresh process, Paho cleanup re-run)
#   PYTHON=python3            interpreter (3.8+; the Paho client needs nothing beyond stdlib)
#   KEEP_TMP=1                keep the temp dir (broker log, suite logs, config)
#   PAHO_LOG_DIR              where logs/results are copied at the end
#                             (default target/paho-conformance/<broker>)
#
# Exit status: 0 all selected tests passed (or skipped: suite absent), 1 a test failed,
# 2 setup error (binary missing, broker did not start).
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PAHO=${1:-${PAHO_DIR:-/tmp/paho}}
BROKER=${BROKER:-lanemq}
SUITES=${SUITES:-"v311 v5"}
TEST_TIMEOUT=${TEST_TIMEOUT:-90}
PYTHON=${PYTHON:-python3}

if [ -f "$PAHO/interoperability/client_test5.py" ]; then
  IDIR="$PAHO/interoperability"
elif [ -f "$PAHO/client_test5.py" ]; then
  IDIR="$PAHO"
else
  echo "Paho interoperability suite not found at '$PAHO'."
  echo "Get it with:  git clone https://github.com/eclipse/paho.mqtt.testing /tmp/paho"
  echo "then run:     interop/paho-conformance.sh /tmp/paho   (or set PAHO_DIR)"
  echo "paho-conformance: skipped"
  exit 0
fi
IDIR=$(cd "$IDIR" && pwd)

TMP=$(mktemp -d "${TMPDIR:-/tmp}/paho-conformance.XXXXXX")
BROKER_PID=""
LOG_DIR=${PAHO_LOG_DIR:-$ROOT/target/paho-conformance/$BROKER}
cleanup() {
  if [ -n "$BROKER_PID" ] && kill -0 "$BROKER_PID" 2>/dev/null; then
    kill "$BROKER_PID" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$BROKER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$BROKER_PID" 2>/dev/null
  fi
  if [ -d "$TMP" ] && mkdir -p "$LOG_DIR" 2>/dev/null; then
    rm -f "$LOG_DIR"/*.log "$LOG_DIR"/*.results
    cp "$TMP"/*.log "$TMP"/*.results "$TMP"/*.conf "$TMP"/*.toml "$TMP"/*.json "$LOG_DIR"/ 2>/dev/null
  fi
  if [ "${KEEP_TMP:-0}" = 1 ]; then echo "temp dir kept: $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

PORT=$("$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

# ---------------------------------------------------------------- broker configuration
start_lanemq() {
  local bin=${LANEMQ_BIN:-$ROOT/target/release/lanemq}
  if [ ! -x "$bin" ]; then
    echo "lanemq binary not found: $bin (cargo build --release, or set LANEMQ_BIN)" >&2
    exit 2
  fi
  mkdir -p "$TMP/data"
  # Keys the suite depends on (see docs in etc/lanemq.toml):
  #  max_keep_alive_s = 60      test_server_keep_alive: keepalive 120 -> CONNACK Server Keep Alive 60.
  #                             NOT server_keep_alive_s: imposing 60 on every client breaks
  #                             test_keepalive (5 s) and test_will_message (2 s).
  #  max_packet_size_bytes      < 65535 so test_maximum_packet_size checks DISCONNECT 0x95.
  #  receive_maximum = 20       test_flow_control2 sends receive_maximum+1 unreleased QoS 2.
  #  topic_alias_max > 0        test_client_topic_alias runs its full path only if announced.
  #  outbound_topic_aliases     test_server_topic_alias requires broker-assigned aliases.
  #  deny_subscribe             test_subscribe_failure (both suites) on test/nosubscribe.
  #  deny_subscribe_reason_code the MQTT 5 suite asserts SUBACK 0x80, not 0x87.
  cat > "$TMP/lanemq.toml" <<EOF
[server]
allow_anonymous = true

[mqtt]
max_keep_alive_s = 60
max_packet_size_bytes = 10000
receive_maximum = 20
topic_alias_max = 10
outbound_topic_aliases = true
deny_subscribe = ["test/nosubscribe"]
deny_subscribe_reason_code = 0x80
EOF
  "$bin" serve --mqtt "127.0.0.1:$PORT" --data-dir "$TMP/data" --config "$TMP/lanemq.toml" \
    >"$TMP/broker.log" 2>&1 &
  BROKER_PID=$!
}

start_mosquitto() {
  local bin=${MOSQUITTO_BIN:-$(command -v mosquitto || echo /usr/sbin/mosquitto)}
  if [ ! -x "$bin" ]; then echo "mosquitto not found (set MOSQUITTO_BIN)" >&2; exit 2; fi
  # mosquitto started as root drops to user "mosquitto": keep the temp files reachable.
  chmod 0777 "$TMP"
  {
    echo "listener $PORT 127.0.0.1"
    echo "allow_anonymous true"
    echo "persistence false"
    echo "max_keepalive 60"
    echo "max_packet_size 10000"
    echo "log_dest stdout"
    echo "log_type all"
  } > "$TMP/mosquitto.conf"
  # acl_file cannot refuse a SUBSCRIBE (it only filters delivery); the dynamic-security
  # plugin can: default allow everything, deny subscribePattern test/nosubscribe -> 0x80.
  local dynsec=""
  for f in /usr/lib/*/mosquitto_dynamic_security.so /usr/lib/mosquitto_dynamic_security.so \
           /usr/local/lib/mosquitto_dynamic_security.so; do
    [ -f "$f" ] && { dynsec=$f; break; }
  done
  if [ -n "$dynsec" ]; then
    cat > "$TMP/dynsec.json" <<'EOF'
{"defaultACLAccess":{"publishClientSend":true,"publishClientReceive":true,"subscribe":true,"unsubscribe":true},
 "clients":[],"groups":[{"groupname":"anon","roles":[{"rolename":"anon"}],"clients":[]}],
 "roles":[{"rolename":"anon","acls":[{"acltype":"subscribePattern","topic":"test/nosubscribe","priority":0,"allow":false}]}],
 "anonymousGroup":"anon"}
EOF
    chmod 0666 "$TMP/dynsec.json"
    echo "plugin $dynsec" >> "$TMP/mosquitto.conf"
    echo "plugin_opt_config_file $TMP/dynsec.json" >> "$TMP/mosquitto.conf"
  else
    echo "warning: mosquitto_dynamic_security.so not found; test_subscribe_failure will fail" >&2
  fi
  "$bin" -c "$TMP/mosquitto.conf" >"$TMP/broker.log" 2>&1 &
  BROKER_PID=$!
}

case "$BROKER" in
  lanemq) start_lanemq ;;
  mosquitto) start_mosquitto ;;
  *) echo "unknown BROKER=$BROKER (lanemq|mosquitto)" >&2; exit 2 ;;
esac

ready=0
for _ in $(seq 1 100); do
  if ! kill -0 "$BROKER_PID" 2>/dev/null; then break; fi
  if "$PYTHON" -c "import socket,sys; socket.create_connection(('127.0.0.1',$PORT),0.2).close()" 2>/dev/null; then
    ready=1; break
  fi
  sleep 0.1
done
if [ "$ready" != 1 ]; then
  echo "$BROKER did not start listening on 127.0.0.1:$PORT; broker log:" >&2
  tail -n 40 "$TMP/broker.log" >&2
  exit 2
fi
echo "broker: $BROKER (pid $BROKER_PID) on 127.0.0.1:$PORT; suite: $IDIR"

# ---------------------------------------------------------------- suite driver (our code)
# The Paho scripts hand sys.argv to unittest.main(), which rejects -p/--port, and a few
# tests loop forever on a broker that misbehaves. This driver runs the script as __main__
# with only "-p PORT", replaces unittest.main() with a runner that records every result
# in RESULTS and arms a per-test watchdog. Tests already recorded are skipped on resume.
cat > "$TMP/driver.py" <<'EOF'
import os, runpy, sys, threading, time, traceback, unittest

script, port, results = sys.argv[1], sys.argv[2], sys.argv[3]
only = os.environ.get("PAHO_TESTS", "").split()
limit = float(os.environ.get("TEST_TIMEOUT", "90"))
here = os.path.dirname(os.path.abspath(script))
sys.path.insert(0, here)
os.chdir(here)

def record(line):
    with open(results, "a") as f:
        f.write(line + "\n")

done = set()
if os.path.exists(results):
    for line in open(results):
        parts = line.split()
        if len(parts) >= 2 and parts[0] != "#":
            done.add(parts[0])

_timer = [None]
def arm(name):
    disarm()
    def expire():
        record("%s TIMEOUT after %ss" % (name, limit))
        sys.stdout.write("\n*** %s: TIMEOUT after %ss\n" % (name, limit))
        sys.stdout.flush()
        os._exit(3)
    _timer[0] = threading.Timer(limit, expire)
    _timer[0].daemon = True
    _timer[0].start()
def disarm():
    if _timer[0]:
        _timer[0].cancel()

class Result(unittest.TextTestResult):
    def startTest(self, test):
        arm(test._testMethodName)
        super().startTest(test)
    def stopTest(self, test):
        disarm()
        super().stopTest(test)
    @staticmethod
    def _name(test):
        return getattr(test, "_testMethodName", None) or str(test).split()[0]
    @staticmethod
    def _why(err):
        msg = "".join(traceback.format_exception_only(err[0], err[1])).strip().splitlines()
        return (msg[-1] if msg else "")[:200]
    def addSuccess(self, test):
        super().addSuccess(test); record("%s PASS" % self._name(test))
    def addFailure(self, test, err):
        super().addFailure(test, err); record("%s FAIL %s" % (self._name(test), self._why(err)))
    def addError(self, test, err):
        super().addError(test, err); record("%s ERROR %s" % (self._name(test), self._why(err)))
    def addSkip(self, test, reason):
        super().addSkip(test, reason); record("%s SKIP %s" % (self._name(test), reason))

def main(*args, **kwargs):
    cls = sys._getframe(1).f_globals["Test"]
    names = list(unittest.TestLoader().getTestCaseNames(cls))
    if only:
        names = [n for n in names if n in only]
    record("# total %d" % len(names))
    todo = [n for n in names if n not in done]
    if todo:
        # setUpClass (Paho cleanup) gets its own watchdog window
        arm("setUpClass")
        runner = unittest.TextTestRunner(stream=sys.stdout, verbosity=2, resultclass=Result)
        runner.run(unittest.TestSuite([cls(n) for n in todo]))
        disarm()
    sys.stdout.flush()
    os._exit(0)

unittest.main = main
sys.argv = [script, "-p", port]
runpy.run_path(script, run_name="__main__")
EOF

status=0
summary=""
for suite in $SUITES; do
  case "$suite" in
    v311) script="$IDIR/client_test.py" ;;
    v5) script="$IDIR/client_test5.py" ;;
    *) echo "unknown suite $suite" >&2; exit 2 ;;
  esac
  res="$TMP/$suite.results"; log="$TMP/$suite.log"
  : > "$res"
  echo
  echo "=== $suite: $(basename "$script") (log: $LOG_DIR/$suite.log)"
  for attempt in $(seq 1 40); do
    before=$(grep -vc '^#' "$res")
    PAHO_TESTS="${PAHO_TESTS:-}" TEST_TIMEOUT="$TEST_TIMEOUT" \
      "$PYTHON" "$TMP/driver.py" "$script" "$PORT" "$res" >>"$log" 2>&1
    rc=$?
    after=$(grep -vc '^#' "$res")
    if [ "$rc" -ne 3 ] || [ "$after" -eq "$before" ]; then break; fi
    if ! kill -0 "$BROKER_PID" 2>/dev/null; then break; fi
    echo "   (resuming after timeout)"
  done
  if grep -q '^setUpClass ' "$res"; then
    echo "   setUpClass (Paho cleanup) failed: $(grep '^setUpClass ' "$res" | head -1)"
  fi
  total=$(grep '^# total' "$res" | head -1 | awk '{print $3}')
  total=${total:-0}
  grep -v '^#' "$res" | grep -v '^setUpClass ' | sed 's/^/   /'
  pass=$(grep -c ' PASS$' "$res")
  ran=$(grep -v '^#' "$res" | grep -vc '^setUpClass ')
  notrun=$((total - ran))
  [ "$notrun" -gt 0 ] && echo "   $notrun test(s) not run"
  line="$suite: $pass/$total passed"
  echo "$line"
  summary="$summary$line"$'\n'
  if [ "$total" -eq 0 ] && [ -n "${PAHO_TESTS:-}" ]; then
    echo "   (no selected test in this suite)"
  elif [ "$pass" -ne "$total" ] || [ "$total" -eq 0 ]; then
    status=1
  fi
  if ! kill -0 "$BROKER_PID" 2>/dev/null; then
    echo "broker exited during $suite; last log lines:"; tail -n 20 "$TMP/broker.log"
    status=1; break
  fi
done

echo
echo "=== summary ($BROKER; logs and tracebacks: $LOG_DIR)"
printf "%s" "$summary"
if [ "$status" -ne 0 ]; then echo "paho-conformance: FAILED"; else echo "paho-conformance: passed"; fi
exit $status
