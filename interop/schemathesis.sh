#!/usr/bin/env bash
# Property-based fuzzing of the REST admin API from its own OpenAPI document
# (GET /api/v5/openapi.json) with schemathesis: for every documented operation it generates
# requests from the documented parameters and bodies (valid ones, and invalid ones in its
# negative mode) in four phases (examples, coverage, fuzzing, stateful: chains of calls
# following the links it infers, e.g. create a stream then read/update/delete it), and checks
# every answer. One PASS/FAIL line per check (from schemathesis' NDJSON report), one for
# schemathesis' own errors, then: the fixtures were made, the broker still serves, no panic.
# The checks:
#   not_a_server_error            no 5xx
#   status_code_conformance       every status returned is documented for that operation
#   content_type_conformance      every Content-Type returned is documented
#   response_schema_conformance   every body matches the documented schema
#   response_headers_conformance  documented response headers are present and valid
#   negative_data_rejection       a request the document calls invalid is refused (4xx)
#   missing_required_header       a request without a required header is refused
#   unsupported_method            an undocumented method on a documented path is 405
#   allow_header_conformance      ... with an `Allow` header listing the documented methods
#   ignored_auth                  without the token (or with a wrong one): 401
#   use_after_free                a deleted resource is gone
#   object_level_authorization    (no-op here: one token, one identity)
#   positive_data_acceptance      a request the document calls valid is accepted (2xx, or a
#                                 status that depends on state: 404, 409)
#   ensure_resource_availability  a resource a POST created is found by the GET after it
# That is every check schemathesis has. The document states what the server checks (patterns
# for topics, filters, lite patterns, names, offsets, durations, limits, base64; ranges). What
# OpenAPI 3.0 cannot state, the hooks below keep out of the generated requests, as the
# document says it in words: a body `name` that differs from the path's name, a base64 payload
# with payload_format_indicator 1 that is not UTF-8; `format: key-expression` gets its values
# from the grammar the document describes. The `/message_streams/...` aliases take no part in
# the stateful phase (see the config below).
# Nothing is excluded: every operation, DELETE and POST /publish included (the broker has no
# shutdown endpoint; the script checks it still serves afterwards).
#
# Against a broker with an admin listener on a free 127.0.0.1 port and a known token, streams
# enabled (a stream `events` with messages), a lite parent `agents` with lanes, a retained
# message and, when mosquitto_sub is installed, a connected client in a lane group `workers`.
# A schemathesis config (in the work dir) makes the path parameters of the read operations
# take those known names half of the time, so the 200 answers are checked too.
#
# Installs schemathesis (pinned below) from PyPI into interop/.venv-schemathesis when missing
# or of another version. Bounded and reproducible: a fixed seed, SCHEMATHESIS_MAX_EXAMPLES
# test cases per operation and phase, one worker, no example database, each request at most
# 15 s; the whole run is stopped after SCHEMATHESIS_TIMEOUT seconds (a FAIL).
#   bash interop/schemathesis.sh
# Environment: LANEMQ_BIN, KEEP_TMP=1 (see lib.sh; keeps the schemathesis output and its
# reports), SCHEMATHESIS_SEED (default 1), SCHEMATHESIS_MAX_EXAMPLES (default 250),
# SCHEMATHESIS_TIMEOUT (default 300), SCHEMATHESIS_EXTRA_CHECKS (checks added to the list:
# none today, every check is in it).
# Exit status: the number of failed checks (2: schemathesis could not be installed).
set -uo pipefail
source "$(dirname "$0")/lib.sh"

ST_VERSION=4.32.5
VENV="$INTEROP_ROOT/interop/.venv-schemathesis"
SEED=${SCHEMATHESIS_SEED:-1}
MAX_EXAMPLES=${SCHEMATHESIS_MAX_EXAMPLES:-250}
ST_TIMEOUT=${SCHEMATHESIS_TIMEOUT:-300}
CHECKS=not_a_server_error,status_code_conformance,content_type_conformance
CHECKS+=,response_schema_conformance,response_headers_conformance,negative_data_rejection
CHECKS+=,missing_required_header,unsupported_method,allow_header_conformance,ignored_auth
CHECKS+=,use_after_free,object_level_authorization,positive_data_acceptance
CHECKS+=,ensure_resource_availability
CHECKS+=${SCHEMATHESIS_EXTRA_CHECKS:+,$SCHEMATHESIS_EXTRA_CHECKS}

if [ "$INTEROP_BROKER" != lanemq ]; then
  echo "the admin API is lanemq's own: no mosquitto baseline" >&2
  exit 0
fi

have=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("schemathesis"))' \
  2>/dev/null || true)
if [ "$have" != "$ST_VERSION" ]; then
  echo "installing schemathesis==$ST_VERSION into $VENV (had: ${have:-none})" >&2
  rm -rf "$VENV"
  { python3 -m venv "$VENV" &&
    "$VENV/bin/pip" install -q --disable-pip-version-check "schemathesis==$ST_VERSION"; } >&2 ||
    { echo "cannot install schemathesis==$ST_VERSION (is PyPI reachable?)" >&2; exit 2; }
fi

HPORT=$(free_port)
TOKEN="st-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
start_broker "[server]
sys_interval_s = 0

[admin]
bind = \"127.0.0.1:$HPORT\"
token = \"$TOKEN\"

[streams_config]
enable = true

[[streams]]
name = \"events\"
topic_filter = \"t/#\"

[[lite.parents]]
name = \"agents\"
pattern = \"agents/{lane}/#\""
if ! wait_port "$HPORT" 10; then
  fail "admin listener" "nothing accepts on 127.0.0.1:$HPORT"
  summary schemathesis
  exit "$N_FAIL"
fi
BASE="http://127.0.0.1:$HPORT"

# A connected client in group `workers` of `agents` (GET /clients/{clientid}, the group's
# lag; it takes the fixture lanes' messages). Once the fuzzing kicks it (DELETE
# /clients/st-worker) it is gone for good: a client that came back would make the kick look
# like a use-after-free.
WORKER_PID=""
if command -v mosquitto_sub >/dev/null; then
  mosquitto_sub -h 127.0.0.1 -p "$PORT" -V mqttv5 -i st-worker -q 1 \
    -t '$share/workers/agents/#' -W $((ST_TIMEOUT + 30)) >"$WORK/worker.out" 2>&1 &
  WORKER_PID=$!
else
  skip "mqtt client fixture" "mosquitto_sub not installed: no client, no group"
fi

# The fixtures, and the hooks schemathesis loads (SCHEMATHESIS_HOOKS):
#  - before a GET of a fixture (the path parameter took its known name from the dictionaries
#    below) outside the stateful phase, put the fixture back if the fuzzing deleted or changed
#    it: lite parent `agents` (pattern agents/{lane}/#) with lanes a1 and a2, stream `events`
#    (t/#) with a message, the retained message on `kept`. So the 200 answers are checked all
#    along, not only until the first DELETE. (Not in the stateful phase: there a GET after a
#    DELETE of the same name must be 404, and a fixture put back would look like a
#    use-after-free.)
#  - PUT /streams/config (and its alias) with `"enable": false` switches streams off, and every
#    stream endpoint then answers 503 SERVICE_UNAVAILABLE: documented, asserted by the tests,
#    and counted as a server error by not_a_server_error for the rest of the run. A generated
#    `false` is sent as `true` (every other field stays generated).
# Run as a script, it creates the fixtures (exit status 1 if one could not be made).
cat >"$WORK/st_hooks.py" <<'EOF'
import os
import sys

import requests

BASE = os.environ["ST_BASE"]
AUTH = {"Authorization": "Bearer " + os.environ["ST_TOKEN"]}
HTTP = requests.Session()
PARENT = {"name": "agents", "pattern": "agents/{lane}/#"}
STREAM = {"name": "events", "topic_filter": "t/#"}


def call(method, path, body=None):
    return HTTP.request(method, BASE + path, json=body, headers=AUTH, timeout=10).status_code


def publish(topic, payload, retain=False):
    return call("POST", "/api/v5/publish", {"topic": topic, "payload": payload, "qos": 1, "retain": retain})


def ensure_parent():
    r = HTTP.get(BASE + "/api/v5/lite/parents/agents", headers=AUTH, timeout=10)
    if r.status_code == 404:
        call("POST", "/api/v5/lite/parents", PARENT)
    elif r.status_code == 200 and (r.json().get("pattern"), r.json().get("key_levels")) != (PARENT["pattern"], 1):
        call("PUT", "/api/v5/lite/parents/agents", PARENT)
    for lane in ("a1", "a2"):
        if call("GET", f"/api/v5/lite/parents/agents/lanes/{lane}") == 404:
            publish(f"agents/{lane}/task", f"job-{lane}")


def ensure_stream():
    r = HTTP.get(BASE + "/api/v5/stream/events", headers=AUTH, timeout=10)
    if r.status_code == 404:
        call("POST", "/api/v5/streams", STREAM)
    if r.status_code == 404 or (r.status_code == 200 and not r.json().get("stats", {}).get("message_count")):
        publish("t/1", "hello")


def ensure_retained():
    if call("GET", "/api/v5/mqtt/retainer/message/kept") == 404:
        publish("kept", "kept", retain=True)


FIXTURES = {"name": {"agents": ensure_parent, "events": ensure_stream}, "topic": {"kept": ensure_retained}}

if __name__ != "__main__":
    import base64
    import binascii

    import schemathesis
    from hypothesis import strategies as st

    # `format: key-expression` (a stream's last-value key): the document states the grammar
    # in words (a JSON path cannot be a pattern); valid ones are drawn from it.
    _ident = st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_]{0,8}\Z")
    schemathesis.openapi.format("key-expression", st.one_of(
        st.sampled_from(["message.from", "message.topic", "message.username", "message.qos"]),
        _ident.map(lambda n: "message.user_property." + n),
        st.integers(-5, 5).map(lambda n: "message.topic.%d" % n),
        st.lists(_ident, min_size=1, max_size=3).map(lambda p: "payload.$." + ".".join(p)),
        st.lists(_ident, min_size=1, max_size=3).map(
            lambda p: "json_value(message.payload,'" + ".".join(p) + "')"),
    ))

    def _cross_field_ok(case):
        """The rules between fields that OpenAPI 3.0 cannot state (and the document says in
        words): a body `name` equals the path's name (or is empty); a base64 payload with
        payload_format_indicator 1 decodes to UTF-8."""
        body = case.body
        name = (case.path_parameters or {}).get("name")
        if isinstance(body, dict) and isinstance(name, str) and isinstance(body.get("name"), str):
            if body["name"] not in ("", name):
                return False
        for item in body if isinstance(body, list) else [body]:
            if not isinstance(item, dict) or item.get("payload_encoding") != "base64":
                continue
            props = item.get("properties")
            if isinstance(props, dict) and props.get("payload_format_indicator") == 1:
                try:
                    base64.b64decode(str(item.get("payload", "")), validate=True).decode("utf-8")
                except (binascii.Error, UnicodeDecodeError, ValueError):
                    return False
        return True

    @schemathesis.hook
    def filter_case(ctx, case):
        return _cross_field_ok(case)

    @schemathesis.hook
    def before_call(ctx, case, **kwargs):
        method = case.method.upper()
        if method == "PUT" and case.path.endswith("/config") and isinstance(case.body, dict):
            if case.body.get("enable") is False:
                case.body["enable"] = True
        meta = getattr(case, "_meta", None)
        phase = str(getattr(getattr(meta, "phase", None), "name", "")).lower()
        if method != "GET" or "stateful" in phase:
            return
        for param, value in (case.path_parameters or {}).items():
            ensure = FIXTURES.get(param, {}).get(value)
            if ensure is not None:
                try:
                    ensure()
                except (requests.RequestException, ValueError):
                    pass  # the request under test goes out anyway and is checked

if __name__ == "__main__":
    codes = [call("POST", "/api/v5/streams", STREAM) if call("GET", "/api/v5/stream/events") == 404 else 200,
             publish("t/1", "hello"), publish("t/2", "second"),
             publish("agents/a1/task", "job-a1"), publish("agents/a2/task", "job-a2"),
             publish("kept", "kept", retain=True)]
    print("fixture answers:", codes)
    sys.exit(0 if all(c in (200, 202) for c in codes) else 1)
EOF
export ST_BASE="$BASE" ST_TOKEN="$TOKEN"
if "$VENV/bin/python" "$WORK/st_hooks.py"; then
  pass "fixtures: stream events, lite parent agents with lanes a1 a2, retained message"
else
  fail "fixtures" "a publish or stream creation failed"
fi

# Known names for the path parameters of the read operations, half of the time (the other
# half is generated). DELETEs and PUTs get generated names only (the stateful phase may still
# reach the fixtures through the names it reads in list answers).
cat >"$WORK/schemathesis.toml" <<'EOF'
[dictionaries]
parents = { values = ["agents"] }
lanes = { values = ["a1", "a2"] }
groups = { values = ["workers"] }
streams = { values = ["events"] }
topics = { values = ["kept"] }
clients = { values = ["st-worker"] }

[[operations]]
include-name-regex = "^GET /api/v5/lite/parents/\\{name\\}"
parameters = { "path.name" = { dictionary = "parents", probability = 0.5 }, "path.lane" = { dictionary = "lanes", probability = 0.5 }, "path.group" = { dictionary = "groups", probability = 0.5 } }

[[operations]]
include-name-regex = "^GET /api/v5/(stream|message_streams/streams)/\\{name\\}"
parameters = { "path.name" = { dictionary = "streams", probability = 0.5 } }

[[operations]]
include-name-regex = "^GET /api/v5/mqtt/retainer/message/"
parameters = { "path.topic" = { dictionary = "topics", probability = 0.5 } }

# The `/message_streams/...` paths are aliases of `/streams`, `/stream/{name}` (EMQX's two
# spellings): they get every phase but the stateful one, whose chains would otherwise create a
# stream on one spelling and delete it on the other, which ensure_resource_availability reads
# as a resource lost.
[[operations]]
include-path-regex = "^/api/v5/message_streams/"
phases.stateful.enabled = false

[[operations]]
include-name-regex = "^GET /api/v5/clients/\\{clientid\\}"
parameters = { "path.clientid" = { dictionary = "clients", probability = 0.5 } }
EOF

# --suppress-health-check filter_too_much: in negative mode an operation whose one input is
# a plain string path parameter (DELETE /mqtt/retainer/message/{topic}, GET
# /lite/parents/{name}) can only get non-strings, and most of those render as an empty, `.`
# or `..` segment that schemathesis itself throws away (they would route elsewhere); past a
# ratio Hypothesis calls that an error. A limit of the generator, not of the API.
OUT=$WORK/schemathesis.out
start=$(date +%s)
(cd "$WORK" && SCHEMATHESIS_HOOKS="$WORK/st_hooks.py" timeout "$ST_TIMEOUT" \
  "$VENV/bin/st" --config-file "$WORK/schemathesis.toml" run "$BASE/api/v5/openapi.json" \
  --header "Authorization: Bearer $TOKEN" \
  --checks "$CHECKS" \
  --max-examples "$MAX_EXAMPLES" --seed "$SEED" --workers 1 --request-timeout 15 \
  --generation-database none --no-color --suppress-health-check filter_too_much \
  --report ndjson,junit --report-dir "$WORK/report") >"$OUT" 2>&1
rc=$?
elapsed=$(($(date +%s) - start))
# The findings (failures, errors, warnings, summary), not the progress lines.
sed -n '/^=\{5,\} \(FAILURES\|ERRORS\|WARNINGS\|SUMMARY\)/,$p' "$OUT" | grep -v '^ *$' |
  grep -v 'discord\|Need more help' | head -c 20000
echo "schemathesis $ST_VERSION: exit $rc after $elapsed s (seed $SEED, $MAX_EXAMPLES examples per operation and phase)"
if [ "$rc" = 124 ]; then
  fail "schemathesis run" "stopped after $ST_TIMEOUT s (SCHEMATHESIS_TIMEOUT)"
fi

# One line per check, from the NDJSON event stream: how many test cases it checked, and the
# operations where it failed (with the first line of schemathesis' message).
"$VENV/bin/python" - "$WORK/report" "$CHECKS" >"$WORK/results.txt" 2>&1 <<'PY'
import glob, json, sys
from collections import OrderedDict

report_dir, wanted = sys.argv[1], sys.argv[2].split(",")
files = glob.glob(f"{report_dir}/ndjson-*.ndjson")
if not files:
    print("FAIL: schemathesis report -- no NDJSON report written")
    sys.exit(0)
checked = {c: 0 for c in wanted}
failed = {c: OrderedDict() for c in wanted}
errors = OrderedDict()
for line in open(files[0], encoding="utf-8"):
    ev = json.loads(line)
    if "ScenarioFinished" in ev:
        rec = ev["ScenarioFinished"].get("recorder", {})
        label = rec.get("label", "?")
        cases = rec.get("cases", {})
        for case_id, results in rec.get("checks", {}).items():
            case = cases.get(case_id, {}).get("value", {})
            op = f"{case.get('method', '')} {case.get('path', '')}".strip() or label
            for r in results:
                name = r.get("name")
                if name not in checked:
                    continue
                checked[name] += 1
                if r.get("status") == "failure":
                    info = (r.get("failure_info") or {}).get("failure") or {}
                    msg = f"{info.get('code', '')} {info.get('title', '')}: " + \
                        (info.get("message") or "").strip().splitlines()[0] if info.get("message") else info.get("title", "")
                    failed[name].setdefault(info.get("operation") or op, msg)
    elif "NonFatalError" in ev:
        e = ev["NonFatalError"]
        v = e.get("value")
        text = v.get("message") or v.get("title") or json.dumps(v) if isinstance(v, dict) else str(v)
        text = " ".join(str(text).split())[:300]
        errors.setdefault(e.get("label", "?"), text)
for name in wanted:
    if failed[name]:
        ops = "; ".join(f"{op} ({msg})" for op, msg in failed[name].items())
        print(f"FAIL: {name} -- {len(failed[name])} operation(s): {ops}")
    elif checked[name] == 0:
        print(f"FAIL: {name} -- never ran")
    else:
        print(f"PASS: {name} ({checked[name]} test cases)")
if errors:
    print("FAIL: schemathesis errors -- " + "; ".join(f"{k}: {v}" for k, v in errors.items()))
else:
    print("PASS: no schemathesis errors (health checks, unreachable operations)")
PY
cat "$WORK/results.txt"
add_results "$WORK/results.txt"
if [ "$rc" != 0 ] && [ "$rc" != 124 ] && ! grep -q '^FAIL:' "$WORK/results.txt"; then
  fail "schemathesis exit status" "$rc without a failed check (see the output above)"
fi

if [ -n "$WORKER_PID" ]; then
  kill "$WORKER_PID" 2>/dev/null || true
  wait "$WORKER_PID" 2>/dev/null || true
fi

# The broker must still be serving after the fuzzing.
status=$("$VENV/bin/python" -c 'import requests, sys
print(requests.get(sys.argv[1] + "/api/v5/status", timeout=5).status_code)' "$BASE" 2>/dev/null)
if kill -0 "$BROKER_PID" 2>/dev/null && [ "$status" = 200 ]; then
  pass "broker still serving after the fuzzing"
else
  fail "broker still serving after the fuzzing" "GET /api/v5/status: ${status:-no answer}"
fi
if grep -q 'panicked' "$BROKER_LOG"; then
  fail "no panic in the broker log" "$(grep -m1 'panicked' "$BROKER_LOG")"
else
  pass "no panic in the broker log"
fi

summary schemathesis
exit "$N_FAIL"
