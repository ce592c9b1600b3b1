#!/usr/bin/env bash
# Run eclipse/mosquitto's own broker tests (test/broker/*.py, the Python tests built on
# test/mosq_test.py; written against mosquitto 2.0.11) against lanemq, one fresh broker per test.
#
# Usage: interop/mosquitto-suite.sh [SUITE_DIR]
#
#   SUITE_DIR   the mosquitto sources' test/ directory (the one holding mosq_test.py and
#               broker/), its broker/ subdirectory, or the root of a mosquitto checkout.
#   MOSQ_SUITE  used when no SUITE_DIR is given: a mosquitto git directory (a clone's .git or a
#               bare mirror; test/ of MOSQ_REF, default v2.0.11, is extracted with git archive),
#               a .tar/.tar.gz/.tgz of the sources, or a directory as for SUITE_DIR.
#               Neither given: the script prints how to get the suite and exits 0 ("skipped").
#               The suite is never vendored into this repository; the script patches a copy.
#
# Environment:
#   LANEMQ_BIN       lanemq binary (default target/ci/lanemq)
#   INTEROP_BROKER   lanemq (default) | mosquitto: the same harness against mosquitto itself
#                    (MOSQUITTO_BIN, default the mosquitto on PATH), to validate the harness
#   MOSQ_TESTS       "01-connect-success 02-subpub-qos1 ..." run only these (names without .py)
#   TEST_TIMEOUT=20  seconds one test may take; a test still running then is a FAIL (timeout)
#   SUITE_TIMEOUT=570  seconds for the whole run: tests not started by then are FAILs
#                    ("not run"); a full run takes about 4.5 minutes on 2 cores
#   MOSQ_STRICT=1    compare the broker's packets byte for byte as upstream does (default:
#                    MQTT 5 properties compared regardless of their order, see below)
#   MOSQ_LOG_DIR     where each test's output (and for non-passes the broker log) is kept
#                    (default target/mosquitto-suite/<broker>); results.tsv there too
#   RUST_LOG         lanemq's log filter (default info)
#   KEEP_TMP=1       keep the temp dir (the patched suite copy, broker state)
#
# How a test runs. The copy of test/mosq_test.py gets a shim appended (MOSQ_EXTERNAL_BROKER
# set): start_broker() starts nothing itself and returns a stand-in process object for the
# broker this script runs on the test's port (127.0.0.1 only). Before each test the script
# starts lanemq fresh (own data directory) with the settings every test expects of mosquitto's
# defaults: anonymous clients allowed, Topic Alias Maximum 10 and Receive Maximum 20 announced
# (upstream's gen_connack() hard-codes both), 20 messages in flight to a client. A test that
# starts its broker with a mosquitto configuration file has it translated option by option
# to lanemq's (allow_anonymous,
# password_file, max_packet_size, max_keepalive, max_inflight_messages, max_queued_messages,
# maximum_qos, retain_available, sys_interval, persistence) and the broker restarted with it;
# with a configuration file and no allow_anonymous, anonymous clients are refused, as in
# mosquitto 2.0. An option without a lanemq equivalent (bridges, plugins and dynamic security,
# ACL files in mosquitto's format, TLS/PSK listener options, a second listener or mount point,
# message_size_limit, byte limits on queues, upgrade_outgoing_qos, check_retain_source) makes
# the test a SKIP naming the option. terminate() stops the broker (SIGTERM); the next
# start_broker() starts it again: from scratch, unless the configuration says
# `persistence true` and the test did not delete the persistence file (mosquitto-PORT.db),
# in which case lanemq restarts on its data directory, so the persistence tests check that
# sessions, subscriptions and queued messages survive a restart.
#
# Packet comparison. Upstream reads exactly len(expected) bytes and compares bytes. Unless
# MOSQ_STRICT=1, the shim reads whole MQTT packets and, on a connection whose CONNECT was
# MQTT 5, compares properties as a set (MQTT 5 fixes no order between different properties;
# user properties keep their order) and ignores a Maximum Packet Size in a CONNACK when the
# test expected none (lanemq always announces its limit, mosquitto only when configured).
# Everything else must match byte for byte.
#
# A test is a FAIL also when the broker log shows a panic or an abort (stack overflow), even
# one that happened while the test was ending.
#
# Output: one "PASS: name", "FAIL: name -- reason" or "SKIP: name -- reason" line per test,
# then the totals. Exit status: 0 no test failed, 1 a test failed, 2 setup error.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
LANEMQ_BIN=${LANEMQ_BIN:-$ROOT/target/ci/lanemq}
# shellcheck source=interop/lib.sh
. "$ROOT/interop/lib.sh"

TEST_TIMEOUT=${TEST_TIMEOUT:-20}
SUITE_TIMEOUT=${SUITE_TIMEOUT:-570}
MOSQ_REF=${MOSQ_REF:-v2.0.11}
MOSQ_STRICT=${MOSQ_STRICT:-0}
PYTHON=${PYTHON:-python3}
MOSQUITTO_BIN=${MOSQUITTO_BIN:-$(command -v mosquitto || echo /usr/sbin/mosquitto)}
LOG_DIR=${MOSQ_LOG_DIR:-$ROOT/target/mosquitto-suite/$INTEROP_BROKER}

suite_cleanup() {
  local rc=$?
  [ -x "$WORK/ctl.sh" ] && "$WORK/ctl.sh" stop >/dev/null 2>&1
  (exit "$rc")
  cleanup
}
trap suite_cleanup EXIT

# ---------------------------------------------------------------- locate the suite
# find_test_dir DIR: prints the directory holding mosq_test.py and broker/, or nothing.
find_test_dir() {
  local d=$1
  for c in "$d" "$d/.." "$d/test"; do
    if [ -f "$c/mosq_test.py" ] && [ -d "$c/broker" ]; then
      (cd "$c" && pwd)
      return
    fi
  done
}

SRC=""
if [ -n "${1:-}" ]; then
  SRC=$(find_test_dir "$1")
  [ -n "$SRC" ] || { echo "no mosquitto test suite (mosq_test.py and broker/) under '$1'" >&2; exit 2; }
elif [ -n "${MOSQ_SUITE:-}" ]; then
  mkdir -p "$WORK/src"
  if [ -d "$MOSQ_SUITE" ] && git --git-dir="$MOSQ_SUITE" rev-parse --git-dir >/dev/null 2>&1 &&
    ! [ -f "$MOSQ_SUITE/test/mosq_test.py" ]; then
    if ! git --git-dir="$MOSQ_SUITE" archive "$MOSQ_REF" test | tar -x -C "$WORK/src"; then
      echo "could not extract test/ at $MOSQ_REF from $MOSQ_SUITE (MOSQ_REF=<tag>)" >&2
      exit 2
    fi
  elif [ -d "$MOSQ_SUITE" ]; then
    cp -r "$MOSQ_SUITE"/. "$WORK/src"/
  elif [ -f "$MOSQ_SUITE" ]; then
    tar -xf "$MOSQ_SUITE" -C "$WORK/src" || { echo "cannot unpack $MOSQ_SUITE" >&2; exit 2; }
  else
    echo "MOSQ_SUITE=$MOSQ_SUITE: neither a directory nor an archive" >&2
    exit 2
  fi
  SRC=$(find_test_dir "$WORK/src")
  if [ -z "$SRC" ]; then
    SRC=$(find "$WORK/src" -name mosq_test.py -path '*/test/*' | head -1)
    SRC=${SRC:+$(dirname "$SRC")}
  fi
  [ -n "$SRC" ] || { echo "no test/mosq_test.py in $MOSQ_SUITE" >&2; exit 2; }
else
  echo "mosquitto's test suite not given."
  echo "Get the sources of mosquitto 2.0.11 (git tag v2.0.11) and run one of:"
  echo "  interop/mosquitto-suite.sh /path/to/mosquitto/test"
  echo "  MOSQ_SUITE=/path/to/mosquitto/.git interop/mosquitto-suite.sh"
  echo "mosquitto-suite: skipped"
  exit 0
fi

# ---------------------------------------------------------------- the patched copy
COPY=$WORK/suite
mkdir -p "$COPY"
cp "$SRC"/*.py "$COPY"/
cp -r "$SRC/broker" "$COPY/broker"
[ -d "$SRC/ssl" ] && cp -r "$SRC/ssl" "$COPY/ssl"
STATE=$WORK/broker
mkdir -p "$STATE" "$LOG_DIR"
rm -f "$LOG_DIR"/*.log "$LOG_DIR"/results.tsv
# mosquitto (the baseline) drops root to its own user unless told otherwise; keep the
# copy reachable and writable for its persistence files anyway.
chmod 755 "$WORK"
chmod -R a+rwX "$COPY" "$STATE"

if [ "$INTEROP_BROKER" = lanemq ] && [ ! -x "$LANEMQ_BIN" ]; then
  echo "lanemq binary not found: $LANEMQ_BIN (cargo build, or set LANEMQ_BIN)" >&2
  exit 2
fi
if [ "$INTEROP_BROKER" = mosquitto ] && [ ! -x "$MOSQUITTO_BIN" ]; then
  echo "mosquitto not found (set MOSQUITTO_BIN)" >&2
  exit 2
fi

# ctl.sh start fresh|keep CONFIG [PORT] | stop | hup: the one broker of the current test, on
# PORT (default $MOSQ_PORT).
# CONFIG is a lanemq TOML file (or a mosquitto .conf for the baseline). "fresh" starts on an
# empty data directory. The shim in mosq_test.py calls it for restarts.
cat >"$WORK/ctl.sh" <<'EOF'
#!/usr/bin/env bash
set -u
S=$MOSQ_STATE
# A stopped broker may stay a zombie for a while (its parent, ctl.sh, is gone): not alive.
live() { [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
alive() { [ -f "$S/pid" ] && live "$(cat "$S/pid")"; }
stop() {
  if alive; then
    local pid; pid=$(cat "$S/pid")
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 100); do live "$pid" || break; sleep 0.05; done
    kill -9 "$pid" 2>/dev/null
    for _ in $(seq 1 40); do live "$pid" || break; sleep 0.05; done
  fi
  rm -f "$S/pid" "$S/running"
}
case "$1" in
  stop) stop ;;
  hup) alive && kill -HUP "$(cat "$S/pid")" ;;
  start)
    stop
    mode=$2 cfg=$3 port=${4:-$MOSQ_PORT}
    if [ "$mode" = fresh ]; then rm -rf "$S/data"; fi
    mkdir -p "$S/data"
    echo "=== start ($mode) $(date +%T.%N) with $(basename "$cfg")" >>"$S/broker.log"
    if [ "$MOSQ_BROKER_KIND" = mosquitto ]; then
      "$MOSQUITTO_BIN" -v -c "$cfg" >>"$S/broker.log" 2>&1 &
    else
      RUST_LOG=${RUST_LOG:-info} "$LANEMQ_BIN" serve --mqtt "127.0.0.1:$port" \
        --data-dir "$S/data" --config "$cfg" --http off >>"$S/broker.log" 2>&1 &
    fi
    echo $! >"$S/pid"
    for _ in $(seq 1 200); do
      if ! alive; then
        echo "broker exited at start; log:" >&2; tail -n 20 "$S/broker.log" >&2; exit 1
      fi
      if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        { echo "$port"; cat "$cfg"; } >"$S/running"
        exit 0
      fi
      sleep 0.05
    done
    echo "broker not listening on 127.0.0.1:$port after 10 s" >&2
    exit 1
    ;;
esac
EOF
chmod 755 "$WORK/ctl.sh"

# The shim appended to the copy of mosq_test.py (ours; it overrides functions defined above it).
cat >"$WORK/lanemq_shim.py" <<'EOF'
# Appended to a temporary copy of mosquitto's test/mosq_test.py by lanemq's
# interop/mosquitto-suite.sh. It runs inside that module: the names below replace
# upstream's start_broker, expect_packet, do_send_receive and receive_unordered.
import os as _os, sys as _sys, subprocess as _sp, signal as _signal, weakref as _weakref

_CTL = _os.environ["MOSQ_EXTERNAL_BROKER"]
_STATE = _os.environ["MOSQ_STATE"]
_KIND = _os.environ.get("MOSQ_BROKER_KIND", "lanemq")
_STRICT = _os.environ.get("MOSQ_STRICT", "0") == "1"
_BASE_TOML = _os.environ["MOSQ_BASE_CONFIG"]
_persist_file = [None]


def _skip(reason):
    print("MOSQ-SKIP: %s" % reason)
    _sys.stdout.flush()
    _os._exit(77)


# mosquitto option -> why lanemq cannot take it (the test is skipped)
_UNSUPPORTED = [
    (("connection", "address", "addresses", "topic", "notifications", "restart_timeout",
      "cleansession", "try_private", "remote_", "local_", "start_type", "bridge_",
      "round_robin", "keepalive_interval", "idle_timeout", "threshold", "notification_topic"),
     "bridge"),
    (("auth_plugin", "plugin", "auth_opt_", "plugin_opt_"), "plugin / dynamic security"),
    (("acl_file",), "mosquitto-format ACL file (lanemq's ACL format differs)"),
    (("cafile", "capath", "certfile", "keyfile", "require_certificate", "crlfile",
      "use_identity_as_username", "use_subject_as_username", "psk_hint", "psk_file",
      "tls_version", "ciphers"), "TLS/PSK listener options"),
    (("mount_point", "allow_zero_length_clientid", "protocol", "socket_domain",
      "bind_interface", "http_dir", "use_username_as_clientid", "auto_id_prefix"),
     "listener option"),
    (("message_size_limit",), "payload size limit (lanemq limits whole packets)"),
    (("max_inflight_bytes", "max_queued_bytes"), "byte limits on inflight and queued messages"),
    (("upgrade_outgoing_qos",), "mosquitto extension (upgrades the QoS of deliveries)"),
    (("check_retain_source",), "mosquitto extension (retained messages re-checked by ACL)"),
]
_IGNORED = ("log_type", "log_dest", "log_timestamp", "autosave_interval", "autosave_on_changes",
            "persistence_location", "persistent_client_expiration", "user")


def _toml_str(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _translate(conf, port):
    """mosquitto .conf -> (lanemq TOML, persistence file or None); skips the test if an
    option has no lanemq equivalent."""
    server = {"allow_anonymous": "false", "shutdown_grace_ms": "500"}
    mqtt = {"topic_alias_max": "10", "receive_maximum": "20", "max_inflight_messages": "20"}
    ports = set()
    unsupported = []  # (rank, why, option)
    persistence = False
    pfile = "mosquitto.db"
    ploc = ""
    for raw in open(conf):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, _, val = line.partition(" ")
        val = val.strip()
        if key in ("port", "listener"):
            ports.add(int(val.split()[0]))
            if len(val.split()) > 1 and val.split()[1] not in ("127.0.0.1", "localhost"):
                _skip("listener option: bind address %s" % val.split()[1])
            continue
        if key == "per_listener_settings":
            continue  # one listener: the same settings either way
        if key == "allow_anonymous":
            server["allow_anonymous"] = "true" if val == "true" else "false"
        elif key == "password_file":
            server["password_file"] = _toml_str(_os.path.abspath(val))
        elif key == "sys_interval":
            server["sys_interval_s"] = val
        elif key == "max_packet_size":
            if 0 < int(val) < 64:
                _skip("max_packet_size %s: below lanemq's smallest Maximum Packet Size (64)" % val)
            mqtt["max_packet_size_bytes"] = val if int(val) > 0 else "268435455"
        elif key == "max_keepalive":
            mqtt["max_keep_alive_s"] = val
        elif key == "max_inflight_messages":
            # mosquitto applies it both ways: it is also the Receive Maximum it announces.
            mqtt["max_inflight_messages"] = val if int(val) > 0 else "65535"
            mqtt["receive_maximum"] = val if int(val) > 0 else "65535"
        elif key == "max_queued_messages":
            if int(val) > 0:
                mqtt["max_queued_messages"] = val
                mqtt["queue_overflow"] = '"drop_newest"'  # what mosquitto does with a full queue
        elif key == "maximum_qos":
            mqtt["maximum_qos"] = val
        elif key == "retain_available":
            mqtt["retain_available"] = "true" if val == "true" else "false"
        elif key == "max_connections":
            if int(val) > 0:
                mqtt["max_connections"] = val
        elif key == "persistence":
            persistence = val == "true"
        elif key == "persistence_file":
            pfile = val
        elif key in _IGNORED:
            if key == "persistence_location":
                ploc = val
        else:
            for rank, (names, why) in enumerate(_UNSUPPORTED):
                if any(key == n or (n.endswith("_") and key.startswith(n)) for n in names):
                    unsupported.append((rank, why, key))
                    break
            else:
                unsupported.append((len(_UNSUPPORTED), "no lanemq equivalent", key))
    if ports - {port}:
        unsupported.append((4, "listener option", "a second listener"))
    if unsupported:
        whys = []
        for _, why, _k in sorted(unsupported):
            if why not in whys:
                whys.append(why)
        keys = []
        for _, _w, k in sorted(unsupported):
            if k not in keys:
                keys.append(k)
        named = ", ".join("'%s'" % k for k in keys[:3])
        if len(keys) > 3:
            named += " and %d more" % (len(keys) - 3)
        _skip("%s (mosquitto option%s %s)" % ("; ".join(whys), "s" if len(keys) > 1 else "", named))
    text = "[server]\n" + "".join("%s = %s\n" % kv for kv in sorted(server.items()))
    text += "[mqtt]\n" + "".join("%s = %s\n" % kv for kv in sorted(mqtt.items()))
    return text, (_os.path.join(ploc, pfile) if persistence else None)


def _mosquitto_conf(conf, port):
    """Baseline: the test's own file with its listeners bound to 127.0.0.1."""
    out = ["user root\n"]
    if conf is None:
        out += ["listener %d 127.0.0.1\n" % port, "allow_anonymous true\n"]
    else:
        for raw in open(conf):
            parts = raw.split()
            if parts and parts[0] in ("port", "listener") and len(parts) == 2:
                out.append("listener %s 127.0.0.1\n" % parts[1])
            else:
                out.append(raw if raw.endswith("\n") else raw + "\n")
    return "".join(out)


def _running_config():
    try:
        with open(_os.path.join(_STATE, "running")) as f:
            return f.read()
    except OSError:
        return None


def _ctl(*args):
    r = _sp.run([_CTL] + list(args))
    if r.returncode != 0:
        raise IOError("broker control failed: %s" % (args,))


class ExternalBroker:
    """Stands for the broker process that upstream's start_broker() would return."""

    def __init__(self):
        self.returncode = None
        try:
            self.pid = int(open(_os.path.join(_STATE, "pid")).read())
        except (OSError, ValueError):
            self.pid = 0

    def terminate(self):
        if self.returncode is None:
            _ctl("stop")
            if _persist_file[0] and _KIND == "lanemq" and not _os.path.exists(_persist_file[0]):
                # lanemq's state is in its data directory; this marker stands for mosquitto's
                # persistence file, so a test that deletes it gets a fresh broker next time.
                open(_persist_file[0], "w").close()
            self.returncode = 0

    kill = terminate

    def send_signal(self, sig):
        if sig == _signal.SIGHUP:
            _ctl("hup")
        else:
            self.terminate()

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        return self.returncode

    def communicate(self, input=None, timeout=None):
        try:
            with open(_os.path.join(_STATE, "broker.log"), "rb") as f:
                tail = b"".join(f.readlines()[-40:])
        except OSError:
            tail = b""
        return (b"", b"--- broker log (last 40 lines) ---\n" + tail)


def start_broker(filename, cmd=None, port=0, use_conf=False, expect_fail=False):
    if cmd is not None:
        _skip("the test starts the broker with its own command line")
    conf = None
    if use_conf or port == 0:
        conf = filename.replace(".py", ".conf")
    if port == 0:
        port = int(_os.environ["MOSQ_PORT"])
    if conf is not None:
        if not _os.path.exists(conf):
            _skip("configuration file %s not found" % conf)
    if conf is None:
        text, pfile = open(_BASE_TOML).read(), None
    else:
        text, pfile = _translate(conf, port)
    if _KIND == "mosquitto":
        text = _mosquitto_conf(conf, port)
    _persist_file[0] = pfile
    keep = pfile is not None and _os.path.exists(pfile)
    if not keep and _running_config() == "%d\n%s" % (port, text):
        return ExternalBroker()  # the broker this script started is the one the test wants
    path = _os.path.join(_STATE, "config-%d" % _os.getpid())
    with open(path, "w") as f:
        f.write(text)
    try:
        _ctl("start", "keep" if keep else "fresh", path, str(port))
    except IOError:
        if expect_fail:
            return None
        print("FAIL: unable to start broker")
        raise
    return ExternalBroker()


# MOSQ_TRACE=1: every byte the test sends and receives, in hex, in the test's log.
if _os.environ.get("MOSQ_TRACE") == "1":
    import socket as _socket_mod

    class _TraceSocket(_socket_mod.socket):
        def send(self, data, *args):
            n = super().send(data, *args)
            print("  -> %s" % bytes(data[:n]).hex())
            return n

        def sendall(self, data, *args):
            print("  -> %s" % bytes(data).hex())
            return super().sendall(data, *args)

        def recv(self, n, *args):
            try:
                data = super().recv(n, *args)
            except OSError as e:
                print("  <- (%s)" % e.__class__.__name__)
                raise
            print("  <- %s" % (data.hex() if data else "(closed)"))
            return data

    _socket_mod.socket = _TraceSocket


# ------------------------------------------------------------------ packet comparison
_v5_socks = _weakref.WeakKeyDictionary()
_orig_do_send_receive = do_send_receive
_orig_expect_packet = expect_packet
_orig_receive_unordered = receive_unordered


def _varint(data, i):
    mult, val = 1, 0
    for _ in range(4):
        if i >= len(data):
            raise ValueError("short varint")
        b = data[i]
        i += 1
        val += (b & 127) * mult
        mult *= 128
        if not b & 128:
            return val, i
    raise ValueError("bad varint")


def _split(data):
    out, i = [], 0
    while i < len(data):
        rl, j = _varint(data, i + 1)
        if j + rl > len(data):
            raise ValueError("short packet")
        out.append(bytes(data[i:j + rl]))
        i = j + rl
    return out


def _recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


def _recv_packet(sock):
    first = sock.recv(1)
    if not first:
        return b""
    head = first
    while True:
        b = _recv_exact(sock, 1)
        head += b
        if not b or not b[0] & 128 or len(head) >= 5:
            break
    try:
        rl, _ = _varint(head, 1)
    except ValueError:
        return head
    return head + _recv_exact(sock, rl)


_PROP_KIND = {1: "b", 2: "4", 3: "s", 8: "s", 9: "d", 11: "v", 17: "4", 18: "s", 19: "2",
              21: "s", 22: "d", 23: "b", 24: "4", 25: "b", 26: "s", 28: "s", 31: "s", 33: "2",
              34: "2", 35: "2", 36: "b", 37: "b", 38: "p", 39: "4", 40: "b", 41: "b", 42: "b"}


def _props(data, i):
    """Properties at data[i:] -> (list of (id, raw bytes), index after them)."""
    plen, i = _varint(data, i)
    end = i + plen
    if end > len(data):
        raise ValueError("short properties")
    out = []
    while i < end:
        pid = data[i]
        kind = _PROP_KIND.get(pid)
        j = i + 1
        if kind == "b":
            j += 1
        elif kind == "2":
            j += 2
        elif kind == "4":
            j += 4
        elif kind == "v":
            _, j = _varint(data, j)
        elif kind in ("s", "d"):
            j += 2 + int.from_bytes(data[j:j + 2], "big")
        elif kind == "p":
            j += 2 + int.from_bytes(data[j:j + 2], "big")
            j += 2 + int.from_bytes(data[j:j + 2], "big")
        else:
            raise ValueError("unknown property %d" % pid)
        if j > end:
            raise ValueError("property overruns")
        out.append((pid, bytes(data[i:j])))
        i = j
    return out, end


def _canonical(pkt, drop=()):
    """An MQTT 5 packet with its properties sorted by identifier (stable, so repeated user
    properties and subscription identifiers keep their order); None if it does not parse."""
    try:
        rl, i = _varint(pkt, 1)
        if i + rl != len(pkt):
            return None
        t = pkt[0] >> 4
        if t == 2:  # CONNACK
            props, end = _props(pkt, i + 2)
            head, tail = pkt[:i + 2], pkt[end:]
        elif t == 3:  # PUBLISH
            j = i + 2 + int.from_bytes(pkt[i:i + 2], "big")
            if (pkt[0] >> 1) & 3:
                j += 2
            props, end = _props(pkt, j)
            head, tail = pkt[:j], pkt[end:]
        elif t in (4, 5, 6, 7):  # PUBACK PUBREC PUBREL PUBCOMP
            if rl < 4:
                return ("raw", bytes(pkt))
            props, end = _props(pkt, i + 3)
            head, tail = pkt[:i + 3], pkt[end:]
        elif t in (9, 11):  # SUBACK UNSUBACK
            props, end = _props(pkt, i + 2)
            head, tail = pkt[:i + 2], pkt[end:]
        elif t in (14, 15):  # DISCONNECT AUTH
            if rl < 2:
                return ("raw", bytes(pkt))
            props, end = _props(pkt, i + 1)
            head, tail = pkt[:i + 1], pkt[end:]
        else:
            return ("raw", bytes(pkt))
        props = sorted((p for p in props if p[0] not in drop), key=lambda p: p[0])
        return (pkt[0], bytes(head[i:]), tuple(props), bytes(tail))
    except (ValueError, IndexError):
        return None


def _same(sock, got, want):
    if got == want:
        return True
    if _STRICT or not _v5_socks.get(sock):
        return False
    try:
        gl, wl = _split(got), _split(want)
    except ValueError:
        return False
    if len(gl) != len(wl):
        return False
    for g, w in zip(gl, wl):
        drop = ()
        if w[0] >> 4 == 2:
            wc = _canonical(w)
            if wc is not None and all(p[0] != 39 for p in wc[2]):
                drop = (39,)  # Maximum Packet Size in a CONNACK the test did not expect
        gc, wc = _canonical(g, drop), _canonical(w)
        if gc is None or wc is None or gc != wc:
            return False
    print("(packets matched with properties compared as a set: got %s, expected %s)"
          % (got.hex(), want.hex()))
    return True


def _report(name, got, want):
    print("FAIL: Received incorrect " + name + ".")
    for label, p in (("Received", got), ("Expected", want)):
        try:
            print("%s: %s" % (label, to_string(p)))
        except Exception:
            pass
        print("%s (hex, %d bytes): %s" % (label, len(p), p.hex()))
    _sys.stdout.flush()


def _read_like(sock, want):
    """Whole packets, as many as `want` holds; a closed connection ends the read early."""
    try:
        n = len(_split(want))
    except ValueError:
        return None
    got = b""
    for _ in range(n):
        p = _recv_packet(sock)
        got += p
        if not p:
            break
    return got


def expect_packet(sock, name, expected):
    if _STRICT or len(expected) == 0:
        return _orig_expect_packet(sock, name, expected)
    got = _read_like(sock, expected)
    if got is None:
        return _orig_expect_packet(sock, name, expected)
    if _same(sock, got, expected):
        return True
    _report(name, got, expected)
    raise TestError


def do_send_receive(sock, send_packet, receive_packet, error_string="send receive error"):
    if len(send_packet) > 8 and send_packet[0] == 0x10:
        try:
            _, i = _varint(send_packet, 1)
            nlen = int.from_bytes(send_packet[i:i + 2], "big")
            _v5_socks[sock] = send_packet[i + 2 + nlen] == 5
        except (ValueError, IndexError, TypeError):
            pass
    return _orig_do_send_receive(sock, send_packet, receive_packet, error_string)


def receive_unordered(sock, recv1_packet, recv2_packet, error_string):
    if _STRICT:
        return _orig_receive_unordered(sock, recv1_packet, recv2_packet, error_string)
    got = _read_like(sock, recv1_packet + recv2_packet)
    if got is None:
        return _orig_receive_unordered(sock, recv1_packet, recv2_packet, error_string)
    if not got:
        raise ValueError(error_string)
    for want in (recv1_packet + recv2_packet, recv2_packet + recv1_packet):
        if _same(sock, got, want):
            return
    _report(error_string, got, recv2_packet + recv1_packet)
    raise ValueError(error_string)
EOF

{
  echo
  echo "# ---- lanemq interop/mosquitto-suite.sh: external broker ----"
  echo "if os.environ.get('MOSQ_EXTERNAL_BROKER'):"
  echo "    exec(open(os.environ['MOSQ_SHIM']).read())"
} >>"$COPY/mosq_test.py"

# Base broker configuration: what mosquitto -p PORT gives the tests.
cat >"$WORK/base.toml" <<'EOF'
[server]
allow_anonymous = true
shutdown_grace_ms = 500
[mqtt]
max_inflight_messages = 20
receive_maximum = 20
topic_alias_max = 10
EOF

# ---------------------------------------------------------------- static skips
# Tests whose subject is something lanemq does differently on purpose, beyond a config option.
static_skip() {
  case "$1" in
    09-pwfile-parse-invalid)
      echo "mosquitto skips malformed password-file lines; lanemq refuses to start on them (docs/security.md)" ;;
    03-publish-qos1-queued-bytes)
      echo "disabled upstream (commented out in test.py; Python 2 only: imports Queue)" ;;
    06-bridge-no-local)
      echo "bridge: mosquitto's bridge protocol levels (0x83/0x84, bit 7 set) are not MQTT" ;;
    01-connect-uname-password-success-no-tls)
      echo "plain-text password file (mosquitto reads it; lanemq refuses plain-text entries); not in upstream test.py" ;;
    *) return 1 ;;
  esac
}

# Ports a test takes (upstream test.py's first column; 1 when not listed).
ports_needed() {
  local n
  n=$(grep -E "^\s*\(([0-9]), '\./$1\.py'\)" "$COPY/broker/test.py" 2>/dev/null |
    sed -E "s/^\s*\(([0-9]).*/\1/" | head -1)
  echo "${n:-1}"
}

# ---------------------------------------------------------------- run
cd "$COPY/broker" || exit 2
TESTS=()
for f in [0-9][0-9]-*.py; do
  name=${f%.py}
  case "$name" in *-helper) continue ;; esac
  if [ -n "${MOSQ_TESTS:-}" ] && ! [[ " $MOSQ_TESTS " == *" $name "* ]]; then continue; fi
  TESTS+=("$name")
done
echo "mosquitto-suite: ${#TESTS[@]} tests from $SRC against $INTEROP_BROKER" \
  "(timeout ${TEST_TIMEOUT}s each, strict=$MOSQ_STRICT); logs: $LOG_DIR"
printf 'test\tresult\treason\n' >"$LOG_DIR/results.tsv"

export MOSQ_EXTERNAL_BROKER=$WORK/ctl.sh MOSQ_SHIM=$WORK/lanemq_shim.py MOSQ_STATE=$STATE
export MOSQ_BROKER_KIND=$INTEROP_BROKER MOSQ_STRICT LANEMQ_BIN MOSQUITTO_BIN
export MOSQ_BASE_CONFIG=$WORK/base.toml
START=$(date +%s)
for name in "${TESTS[@]}"; do
  log=$LOG_DIR/$name.log
  if [ $(($(date +%s) - START)) -ge "$SUITE_TIMEOUT" ]; then
    fail "$name" "not run: the suite's time limit (${SUITE_TIMEOUT}s) was reached"
    printf '%s\tFAIL\t%s\n' "$name" "not run (suite time limit)" >>"$LOG_DIR/results.tsv"
    continue
  fi
  if why=$(static_skip "$name"); then
    skip "$name" "$why"
    printf '%s\tSKIP\t%s\n' "$name" "$why" >>"$LOG_DIR/results.tsv"
    continue
  fi
  ports=()
  for _ in $(seq 1 "$(ports_needed "$name")"); do ports+=("$(free_port)"); done
  export MOSQ_PORT=${ports[0]}
  : >"$STATE/broker.log"
  : >"$log"
  base=$WORK/base.toml
  if [ "$INTEROP_BROKER" = mosquitto ]; then
    base=$WORK/base.conf
    printf 'user root\nlistener %s 127.0.0.1\nallow_anonymous true\n' "$MOSQ_PORT" >"$base"
  fi
  # One port: the broker runs before the test starts (start_broker() finds it running).
  # More: the test may listen on some of them itself; start_broker() starts the broker.
  if [ "${#ports[@]}" = 1 ] && ! "$WORK/ctl.sh" start fresh "$base" 2>>"$log"; then
    fail "$name" "broker did not start"
    printf '%s\tFAIL\t%s\n' "$name" "broker did not start" >>"$LOG_DIR/results.tsv"
    continue
  fi
  t0=$(date +%s.%N)
  timeout -k 2 "$TEST_TIMEOUT" "$PYTHON" "./$name.py" "${ports[@]}" >>"$log" 2>&1 </dev/null
  rc=$?
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  died=""
  if [ -f "$STATE/pid" ] && [ "$(awk '{print $3}' "/proc/$(cat "$STATE/pid")/stat" 2>/dev/null || echo Z)" = Z ]; then
    died=" (the broker process had exited)"
  fi
  "$WORK/ctl.sh" stop
  echo "--- exit $rc after ${secs}s" >>"$log"
  # A broker that panicked or aborted (also while the test was ending) fails the test.
  crash=$(grep -m1 -E "panicked at|fatal runtime error|overflowed its stack" "$STATE/broker.log")
  if [ -n "$crash" ] && [ "$rc" != 77 ]; then
    [ "$rc" = 0 ] && rc=1 && echo "FAIL: the test passed, but the broker crashed" >>"$log"
    died=" (the broker crashed: $crash)"
  fi
  case $rc in
    0)
      pass "$name"
      printf '%s\tPASS\t\n' "$name" >>"$LOG_DIR/results.tsv"
      ;;
    77)
      why=$(grep -m1 '^MOSQ-SKIP: ' "$log" | sed 's/^MOSQ-SKIP: //')
      skip "$name" "$why"
      printf '%s\tSKIP\t%s\n' "$name" "$why" >>"$LOG_DIR/results.tsv"
      ;;
    *)
      if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        why="timeout after ${TEST_TIMEOUT}s"
      else
        why=$(grep -m1 -E '^FAIL: ' "$log" | sed 's/^FAIL: //')
        [ -n "$why" ] || why=$(grep -E '^[A-Za-z_.]*(Error|Exception|TestError)\b' "$log" | tail -1)
        [ -n "$why" ] || why="exit status $rc"
      fi
      why="$why$died"
      fail "$name" "$why"
      printf '%s\tFAIL\t%s\n' "$name" "$why" >>"$LOG_DIR/results.tsv"
      cp "$STATE/broker.log" "$LOG_DIR/$name.broker.log" 2>/dev/null
      ;;
  esac
done
echo "elapsed: $(($(date +%s) - START)) s"
summary "mosquitto-suite ($INTEROP_BROKER)"
[ "$N_FAIL" -eq 0 ]
