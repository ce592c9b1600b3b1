#!/usr/bin/env bash
# The Prometheus metrics (GET /metrics, docs/metrics.md) and the Grafana dashboard
# (docs/grafana/lanemq.json) against the real Prometheus. Starts a broker with an admin
# listener, a known token and a lite parent `agents`, creates a stream `sensors` over the REST
# API, runs a Prometheus of its own scraping the broker every second (bearer token), and makes
# real traffic with mosquitto_pub / mosquitto_sub: QoS 0, 1 and 2 to the stream's topics (one
# plain subscriber and one stream reader), QoS 1 to four lanes with a shared-subscription group
# `workers` taking some of them, and a few publishes nobody subscribes to. Then checks:
#   - the endpoint: the token is needed; Prometheus text 0.0.4 by default, OpenMetrics (ending
#     in `# EOF`) when Accept asks; /api/v5/prometheus/stats serves the same families;
#   - `promtool check metrics` (the Prometheus naming lint) on a scrape;
#   - a few figures of the scrape against the traffic made (messages received and sent, the
#     stream's records and reader, the lanes, the group's lag, the log's appends and fsyncs);
#   - `promtool check config` on the scrape config; Prometheus reports the target up;
#   - every PromQL expression of the dashboard (template variables replaced by this run's job,
#     instance, stream and parent, $__rate_interval by 1m) evaluates through /api/v1/query
#     without error and returns a series (histogram quantiles: a number); each template
#     variable's label_values() finds this run's value;
#   - the dashboard JSON: valid, schemaVersion, the DS_PROMETHEUS input and the datasource
#     variable, unique panel ids, a grid that fits, multi-value variables only under =~, and
#     every metric name it uses is in the scrape.
#
# Installs Debian's `prometheus` (prometheus + promtool) with apt-get when either is missing,
# without starting its service; curl likewise. Prometheus runs from the work dir (its own
# --storage.tsdb.path, --web.listen-address on a free 127.0.0.1 port) and is stopped at the end.
#   bash interop/prometheus.sh
# Environment: LANEMQ_BIN, KEEP_TMP=1 (see lib.sh). Exit status: the number of failed checks
# (2: a tool could not be installed).
set -uo pipefail
source "$(dirname "$0")/lib.sh"
DASHBOARD="$INTEROP_ROOT/docs/grafana/lanemq.json"
T0=$(date +%s)

require_mosquitto_clients
if [ "$INTEROP_BROKER" != lanemq ]; then
  echo "the metrics are lanemq's: no mosquitto baseline" >&2
  exit 0
fi

need=()
command -v curl >/dev/null || need+=(curl)
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  need+=(prometheus)
fi
if [ "${#need[@]}" -gt 0 ]; then
  t=$(date +%s)
  apt_install --no-install-recommends "${need[@]}" || { echo "cannot install ${need[*]}" >&2; exit 2; }
  echo "installed ${need[*]} in $(($(date +%s) - t)) s"
  T0=$(date +%s)
fi
for tool in prometheus promtool curl python3; do
  command -v "$tool" >/dev/null || { echo "$tool not found" >&2; exit 2; }
done
echo "prometheus: $(prometheus --version 2>&1 | head -1)"

# ---------------------------------------------------------------------------------------------
# The broker and Prometheus.

HPORT=$(free_port)
TOKEN="prom-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
printf 'default allow\n' >"$WORK/allow.acl"
start_broker "[server]
acl_file = \"$WORK/allow.acl\"

[admin]
bind = \"127.0.0.1:$HPORT\"
token = \"$TOKEN\"

[[lite.parents]]
name = \"agents\"
pattern = \"agents/{lane}/#\""
if ! wait_port "$HPORT" 10; then
  fail "admin listener" "nothing accepts on 127.0.0.1:$HPORT"
  summary prometheus
  exit "$N_FAIL"
fi
BASE="http://127.0.0.1:$HPORT"
AUTH="Authorization: Bearer $TOKEN"
JOB=lanemq
INSTANCE="127.0.0.1:$HPORT"

PPORT=$(free_port)
PROM="http://127.0.0.1:$PPORT"
PROM_PID=""
cat >"$WORK/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: $JOB
    scrape_interval: 1s
    scrape_timeout: 1s
    metrics_path: /metrics
    authorization:
      type: Bearer
      credentials: $TOKEN
    static_configs:
      - targets: ["$INSTANCE"]
EOF
if out=$(timeout 20 promtool check config "$WORK/prometheus.yml" 2>&1); then
  pass "promtool check config: the scrape job (bearer token, 1 s)"
else
  fail "promtool check config: the scrape job (bearer token, 1 s)" "$(echo "$out" | tail -3 | tr '\n' ' ')"
fi

stop_prometheus() {
  [ -n "$PROM_PID" ] || return 0
  kill "$PROM_PID" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$PROM_PID" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$PROM_PID" 2>/dev/null || true
  wait "$PROM_PID" 2>/dev/null || true
  PROM_PID=""
}
# Prometheus is stopped before lib.sh's cleanup removes the work dir (its TSDB is in there).
trap 'rc=$?; stop_prometheus; (exit $rc); cleanup' EXIT

prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
  --web.listen-address="127.0.0.1:$PPORT" --log.level=warn >"$WORK/prometheus.log" 2>&1 &
PROM_PID=$!
ready=0
deadline=$((SECONDS + 20))
while [ "$SECONDS" -lt "$deadline" ]; do
  if [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$PROM/-/ready")" = 200 ]; then
    ready=1
    break
  fi
  kill -0 "$PROM_PID" 2>/dev/null || break
  sleep 0.2
done
if [ "$ready" = 1 ]; then
  echo "prometheus: pid $PROM_PID on $PROM"
else
  fail "prometheus starts" "not ready within 20 s: $(tail -5 "$WORK/prometheus.log" | tr '\n' ' ')"
  summary prometheus
  exit "$N_FAIL"
fi

# ---------------------------------------------------------------------------------------------
# The endpoint itself.

# http_get NAME URL [curl args...]: body to $WORK/NAME.body, headers to $WORK/NAME.hdr;
# prints the status code.
http_get() {
  local name=$1 url=$2
  shift 2
  curl -sS --max-time 5 -o "$WORK/$name.body" -D "$WORK/$name.hdr" -w '%{http_code}' "$@" "$url"
}
ctype() { grep -i '^content-type:' "$WORK/$1.hdr" | head -1 | cut -d: -f2- | tr -d '\r' | sed 's/^ *//'; }

code=$(http_get noauth "$BASE/metrics")
if [ "$code" = 401 ]; then pass "/metrics without the token: 401"; else fail "/metrics without the token: 401" "HTTP $code"; fi

code=$(http_get text "$BASE/metrics" -H "$AUTH")
ct=$(ctype text)
if [ "$code" = 200 ] && [ "$ct" = "text/plain; version=0.0.4; charset=utf-8" ] &&
  ! grep -q '^# EOF' "$WORK/text.body"; then
  pass "/metrics: Prometheus text 0.0.4 by default"
else
  fail "/metrics: Prometheus text 0.0.4 by default" "HTTP $code, Content-Type [$ct]"
fi

code=$(http_get om "$BASE/metrics" -H "$AUTH" \
  -H 'Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5')
ct=$(ctype om)
if [ "$code" = 200 ] && [[ "$ct" == application/openmetrics-text* ]] &&
  [ "$(tail -n 1 "$WORK/om.body")" = "# EOF" ]; then
  pass "/metrics: OpenMetrics 1.0 when Accept asks (ends in # EOF)"
else
  fail "/metrics: OpenMetrics 1.0 when Accept asks (ends in # EOF)" "HTTP $code, Content-Type [$ct], last line [$(tail -n 1 "$WORK/om.body")]"
fi

# Every histogram in both formats: cumulative buckets ending in le="+Inf" equal to _count
# (OpenMetrics requires the +Inf bucket; histogram_quantile() gives NaN without it).
hist_check() {
  python3 - "$1" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
fams = re.findall(r"^# TYPE (\S+) histogram$", text, re.M)
bad = []
for f in fams:
    les = re.findall(r"^" + re.escape(f) + r'_bucket\{le="([^"]+)"\} (\S+)$', text, re.M)
    count = re.search(r"^" + re.escape(f) + r"_count (\S+)$", text, re.M)
    vals = [float(v) for _, v in les]
    if not les or les[-1][0] != "+Inf":
        bad.append(f"{f}: no le=\"+Inf\" bucket (last le=\"{les[-1][0] if les else None}\")")
    elif count is None or float(count.group(1)) != vals[-1]:
        bad.append(f"{f}: +Inf bucket {vals[-1]} != _count {count and count.group(1)}")
    elif vals != sorted(vals):
        bad.append(f"{f}: buckets not cumulative")
print("; ".join(bad) if bad else f"ok {len(fams)}")
PY
}
for fmt in text om; do
  name="/metrics ($fmt): every histogram ends in a +Inf bucket equal to _count"
  out=$(hist_check "$WORK/$fmt.body")
  case "$out" in
    "ok 0") fail "$name" "no histogram in the exposition" ;;
    ok*) pass "$name" ;;
    *) fail "$name" "$out" ;;
  esac
done

code=$(http_get emqx "$BASE/api/v5/prometheus/stats" -H "$AUTH")
if [ "$code" = 200 ] &&
  [ "$(grep '^# TYPE' "$WORK/emqx.body" | sort)" = "$(grep '^# TYPE' "$WORK/text.body" | sort)" ]; then
  pass "/api/v5/prometheus/stats: the same metric families"
else
  fail "/api/v5/prometheus/stats: the same metric families" "HTTP $code, $(grep -c '^# TYPE' "$WORK/emqx.body") vs $(grep -c '^# TYPE' "$WORK/text.body") families"
fi

# ---------------------------------------------------------------------------------------------
# Traffic, once Prometheus scrapes the broker (its first scrape comes a few seconds after start:
# target discovery is batched), so that every rate() sees the counters move.

scraping=0
deadline=$((SECONDS + 15))
while [ "$SECONDS" -lt "$deadline" ]; do
  n=$(curl -s --max-time 2 -G "$PROM/api/v1/query" --data-urlencode "query=up{job=\"$JOB\"} == 1" |
    python3 -c 'import json,sys; print(len(json.load(sys.stdin)["data"]["result"]))' 2>/dev/null || echo 0)
  if [ "${n:-0}" -ge 1 ]; then scraping=1; break; fi
  sleep 0.25
done
[ "$scraping" = 1 ] || echo "Prometheus has not scraped the broker after 15 s" >&2
sleep 1

STREAM=sensors
PARENT=agents
GROUP=workers
code=$(curl -sS --max-time 10 -o "$WORK/stream.json" -w '%{http_code}' -X POST \
  -H "$AUTH" -H 'Content-Type: application/json' \
  -d "{\"name\":\"$STREAM\",\"topic_filter\":\"$STREAM/#\"}" "$BASE/api/v5/streams")
if [ "$code" = 200 ] || [ "$code" = 201 ]; then
  pass "POST /api/v5/streams: stream $STREAM"
else
  fail "POST /api/v5/streams: stream $STREAM" "HTTP $code $(head -c 200 "$WORK/stream.json")"
fi

mq=(-h 127.0.0.1 -p "$PORT" -V mqttv5)
# A plain subscriber of the stream's topics (QoS 2: deliveries at every QoS) and a stream
# reader from the earliest message; both stay connected through the checks (bounded by -W).
stdbuf -oL -eL mosquitto_sub "${mq[@]}" -i prom-sub -q 2 -t "$STREAM/#" -W 80 -d -F 'MSG|%t %p' \
  >"$WORK/sub.out" 2>&1 &
stdbuf -oL -eL mosquitto_sub "${mq[@]}" -i prom-reader -q 1 -t "\$stream/$STREAM" -W 80 -d \
  -D subscribe user-property stream-offset earliest -F 'MSG|%t %p' >"$WORK/reader.out" 2>&1 &
# A member of the group `workers` takes 5 lane messages and leaves: the rest is lag.
stdbuf -oL -eL mosquitto_sub "${mq[@]}" -i prom-worker -q 1 -t "\$share/$GROUP/$PARENT/#" -C 5 \
  -W 10 -d -F 'MSG|%t %p' >"$WORK/worker.out" 2>&1 &
WORKER_PID=$!
for f in sub reader worker; do
  wait_grep "$WORK/$f.out" 'received SUBACK' 5 || echo "no SUBACK for $f" >&2
done

N_STREAM=0
for q in 0 1 2; do
  seq 1 20 | sed "s/^/reading-q$q-/" |
    timeout 5 mosquitto_pub "${mq[@]}" -i "prom-pub-q$q" -q "$q" -t "$STREAM/room$q/temp" -l ||
    echo "mosquitto_pub QoS $q to $STREAM failed" >&2
  N_STREAM=$((N_STREAM + 20))
done
N_LANE=0
for lane in a1 a2 a3 a4; do
  seq 1 5 | sed "s/^/job-$lane-/" |
    timeout 5 mosquitto_pub "${mq[@]}" -i "prom-pub-$lane" -q 1 -t "$PARENT/$lane/task" -l ||
    echo "mosquitto_pub to $PARENT/$lane failed" >&2
  N_LANE=$((N_LANE + 5))
done
for i in 1 2 3; do
  timeout 5 mosquitto_pub "${mq[@]}" -i "prom-pub-nobody-$i" -q 1 -t "nobody/listens/$i" -m "x$i" ||
    echo "mosquitto_pub to nobody/listens failed" >&2
done
N_PUB=$((N_STREAM + N_LANE + 3))

wait "$WORKER_PID" 2>/dev/null || true
for _ in $(seq 1 100); do
  [ "$(grep -c '^MSG|' "$WORK/sub.out")" -ge "$N_STREAM" ] &&
    [ "$(grep -c '^MSG|' "$WORK/reader.out")" -ge "$N_STREAM" ] && break
  sleep 0.1
done
echo "traffic: $N_PUB publishes; subscriber got $(grep -c '^MSG|' "$WORK/sub.out"), stream reader $(grep -c '^MSG|' "$WORK/reader.out"), worker $(grep -c '^MSG|' "$WORK/worker.out")"

# ---------------------------------------------------------------------------------------------
# (a) promtool's lint and the figures of one scrape.

code=$(http_get scrape "$BASE/metrics" -H "$AUTH")
[ "$code" = 200 ] || fail "scrape after the traffic" "HTTP $code"
SCRAPE=$WORK/scrape.body
lint=$(timeout 20 promtool check metrics <"$SCRAPE" 2>&1)
lint_rc=$?
echo "$lint" >"$WORK/promtool.out"
if [ "$lint_rc" = 0 ] && [ -z "$(echo "$lint" | tr -d '[:space:]')" ]; then
  pass "promtool check metrics: no problem"
else
  fail "promtool check metrics: no problem" "exit $lint_rc: $(echo "$lint" | head -20 | tr '\n' ';')"
fi

# sample EXPR: the sum of the samples whose name{labels} starts with EXPR (0 when none).
sample() {
  awk -v p="$1" 'index($0, p) == 1 { s += $NF } END { printf "%d\n", s }' "$SCRAPE"
}
# at_least NAME SAMPLE-PREFIX MIN
at_least() {
  local name=$1 prefix=$2 min=$3 v
  v=$(sample "$prefix")
  if [ "$v" -ge "$min" ]; then pass "$name ($v)"; else fail "$name" "$prefix: $v, expected at least $min"; fi
}
at_least "scrape: messages received count every publish" 'lanemq_messages_received_total{' "$N_PUB"
at_least "scrape: messages received at QoS 0" 'lanemq_messages_received_total{qos="0"}' 20
at_least "scrape: messages received at QoS 2" 'lanemq_messages_received_total{qos="2"}' 20
at_least "scrape: received payload bytes" 'lanemq_messages_received_payload_bytes_total{' $((N_STREAM * 10))
at_least "scrape: messages sent to the subscribers" 'lanemq_messages_sent_total{' $((2 * N_STREAM))
at_least "scrape: messages sent at QoS 2" 'lanemq_messages_sent_total{qos="2"}' 20
at_least "scrape: publishes with no subscriber" 'lanemq_messages_no_subscribers_total' 3
at_least "scrape: sessions online (subscriber, reader)" 'lanemq_sessions{state="online"}' 2
at_least "scrape: log appends" 'lanemq_log_appended_records_total' "$N_PUB"
at_least "scrape: log fsyncs in the histogram" 'lanemq_log_fsync_duration_seconds_count' 1
at_least "scrape: stream $STREAM records" "lanemq_stream_records{stream=\"$STREAM\"}" "$N_STREAM"
at_least "scrape: stream $STREAM reader" "lanemq_stream_readers{stream=\"$STREAM\"}" 1
at_least "scrape: lanes of $PARENT" "lanemq_lite_parent_lanes{parent=\"$PARENT\"}" 4
at_least "scrape: lag of group $GROUP" "lanemq_lite_group_lag_messages{parent=\"$PARENT\",group=\"$GROUP\"}" 1
at_least "scrape: lane messages committed" 'lanemq_lite_committed_total' 1
at_least "scrape: open fds" 'process_open_fds' 1

# ---------------------------------------------------------------------------------------------
# (b) Prometheus scrapes the broker; (c), (d) the dashboard's expressions and JSON.

# Samples taken after the traffic: wait until Prometheus has the stream's records, then two more
# scrapes so that every rate() has points on both sides of it.
got=0
deadline=$((SECONDS + 20))
while [ "$SECONDS" -lt "$deadline" ]; do
  v=$(curl -s --max-time 2 -G "$PROM/api/v1/query" \
    --data-urlencode "query=lanemq_stream_records{stream=\"$STREAM\"}" |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(int(float(r[0]["value"][1])) if r else 0)' 2>/dev/null || echo 0)
  if [ "${v:-0}" -ge "$N_STREAM" ]; then got=1; break; fi
  sleep 0.5
done
[ "$got" = 1 ] && sleep 2.5
[ "$got" = 1 ] || echo "Prometheus has no post-traffic sample of the stream after 20 s" >&2

timeout 45 python3 - "$PROM" "$DASHBOARD" "$SCRAPE" "$JOB" "$INSTANCE" "$STREAM" "$PARENT" \
  >"$WORK/checks.out" 2>&1 <<'PY'
import json, math, re, sys, urllib.error, urllib.parse, urllib.request

prom, dash_path, scrape_path, job, instance, stream, parent = sys.argv[1:8]
VALUES = {"job": job, "instance": instance, "stream": stream, "parent": parent,
          "__rate_interval": "1m", "__interval": "15s", "__range": "1h"}
MULTI = {"job", "instance", "stream", "parent"}
# May be absent in this run: nothing was refused; the cluster figures exist in cluster mode only
# (the Cluster row; interop/cluster.sh checks them on every node).
MAY_BE_EMPTY = {"lanemq_connections_refused_total", "lanemq_cluster_published_total",
                "lanemq_cluster_replicated_total", "lanemq_cluster_publish_failures_total",
                "lanemq_cluster_routed_offset", "lanemq_cluster_replicator_failed"}


def ok(name):
    print(f"PASS: {name}", flush=True)


def bad(name, why):
    print(f"FAIL: {name} -- {why}", flush=True)


def get(path, **params):
    url = prom + path + "?" + urllib.parse.urlencode(params, doseq=True)
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        try:
            return json.load(e)
        except Exception:
            return {"status": "error", "error": f"HTTP {e.code}"}
    except Exception as e:
        return {"status": "error", "error": repr(e)}


# (b) the target is up.
t = get("/api/v1/targets", state="active")
targets = [x for x in t.get("data", {}).get("activeTargets", []) if x["labels"].get("job") == job]
if targets and all(x["health"] == "up" and not x.get("lastError") for x in targets):
    ok(f"prometheus: target {instance} of job {job} is up")
else:
    bad(f"prometheus: target {instance} of job {job} is up",
        json.dumps([{k: x.get(k) for k in ("health", "lastError", "scrapeUrl")} for x in targets]))
r = get("/api/v1/query", query=f'up{{job="{job}"}}')
res = r.get("data", {}).get("result", [])
if res and res[0]["value"][1] == "1":
    ok("prometheus: up == 1")
else:
    bad("prometheus: up == 1", json.dumps(r)[:300])

# (d) the dashboard JSON.
try:
    with open(dash_path) as f:
        dash = json.load(f)
    ok("dashboard: valid JSON")
except Exception as e:
    bad("dashboard: valid JSON", repr(e))
    sys.exit(0)

problems = []
if not (isinstance(dash.get("schemaVersion"), int) and 36 <= dash["schemaVersion"] <= 41):
    problems.append(f"schemaVersion {dash.get('schemaVersion')!r}")
if not dash.get("uid") or not dash.get("title"):
    problems.append("no uid or title")
if not any(i.get("name") == "DS_PROMETHEUS" and i.get("pluginId") == "prometheus"
           for i in dash.get("__inputs", [])):
    problems.append("no DS_PROMETHEUS input")
variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
if variables.get("datasource", {}).get("type") != "datasource":
    problems.append("no datasource variable")
for v in ("stream", "parent"):
    if v not in variables:
        problems.append(f"no ${v} variable")
ok("dashboard: schema, inputs, variables") if not problems else bad(
    "dashboard: schema, inputs, variables", "; ".join(problems))


def all_panels(panels):
    for p in panels:
        yield p
        yield from all_panels(p.get("panels", []))


panels = list(all_panels(dash.get("panels", [])))
problems = []
ids = [p.get("id") for p in panels]
if len(ids) != len(set(ids)) or None in ids:
    problems.append("panel ids missing or repeated")
cells = {}
for p in panels:
    g = p.get("gridPos", {})
    x, y, w, h = (g.get(k) for k in ("x", "y", "w", "h"))
    if None in (x, y, w, h) or x < 0 or w < 1 or x + w > 24:
        problems.append(f"panel {p.get('title')!r}: gridPos {g}")
        continue
    for cx in range(x, x + w):
        for cy in range(y, y + h):
            if (cx, cy) in cells:
                problems.append(f"panel {p.get('title')!r} overlaps {cells[(cx, cy)]!r}")
                break
            cells[(cx, cy)] = p.get("title")
        else:
            continue
        break
    if p.get("type") != "row":
        if p.get("datasource", {}).get("uid") != "${datasource}":
            problems.append(f"panel {p.get('title')!r}: datasource {p.get('datasource')}")
        if not p.get("targets"):
            problems.append(f"panel {p.get('title')!r}: no query")
rows = [p["title"] for p in panels if p.get("type") == "row"]
for want in ("Overview", "Log and index", "Streams", "Lanes", "Process"):
    if want not in rows:
        problems.append(f"no row {want!r}")
ok(f"dashboard: {len(panels) - len(rows)} panels in {len(rows)} rows, ids and grid") \
    if not problems else bad("dashboard: panels, ids and grid", "; ".join(problems[:8]))

exprs = []  # (panel title, expression)
for p in panels:
    for t in p.get("targets", []):
        if t.get("expr"):
            exprs.append((p["title"], t["expr"]))
VAR_RE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")
misuse = []
for title, e in exprs:
    for m in re.finditer(r'(\w+)\s*(!=|=)(?![~=])\s*"([^"]*)"', e):
        if VAR_RE.search(m.group(3)) and any(n in MULTI for n in VAR_RE.search(m.group(3)).groups()):
            misuse.append(f"{title}: {m.group(0)}")
ok("dashboard: multi-value variables only under =~") if not misuse else bad(
    "dashboard: multi-value variables only under =~", "; ".join(misuse))

# Metric names: every lanemq_* / process_* name of the expressions is a sample of the scrape.
scraped = set()
with open(scrape_path) as f:
    for line in f:
        if line.strip() and not line.startswith("#"):
            scraped.add(re.split(r"[{ ]", line, 1)[0])
used = set()
for _, e in exprs:
    used |= set(re.findall(r"\b(?:lanemq|process)_[a-zA-Z0-9_]+", e))
for v in variables.values():
    if v.get("type") == "query":
        q = v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query", "")
        used |= set(re.findall(r"\b(?:lanemq|process)_[a-zA-Z0-9_]+", q))
missing = sorted(n for n in used if n not in scraped and n not in MAY_BE_EMPTY)
if missing:
    bad("dashboard: every metric name is in the scrape", ", ".join(missing))
else:
    ok(f"dashboard: every metric name is in the scrape ({len(used)} names)")
families = {n for n in scraped}
unused = sorted(n for n in families if n not in used
                and not re.sub(r"_(bucket|sum|count)$", "", n) + "_bucket" in used)
print(f"note: scrape samples no panel shows: {', '.join(unused) or 'none'}")


def subst(e):
    unknown = []

    def rep(m):
        name = m.group(1) or m.group(2) or m.group(3)
        if name in VALUES:
            return VALUES[name]
        unknown.append(name)
        return m.group(0)

    return VAR_RE.sub(rep, e), unknown


# (c) every expression evaluates, and returns something.
n_ok = 0
for title, e in exprs:
    q, unknown = subst(e)
    if unknown:
        bad(f"query [{title}]", f"unknown variable(s) {unknown} in {e}")
        continue
    r = get("/api/v1/query", query=q)
    if r.get("status") != "success":
        bad(f"query [{title}]", f"{r.get('errorType', '')} {r.get('error')}: {q}")
        continue
    if r.get("warnings"):
        print(f"note: [{title}] warnings {r['warnings']}: {q}")
    result = r["data"]["result"]
    names = set(re.findall(r"\b(?:lanemq|process)_[a-zA-Z0-9_]+", e))
    if not result:
        if names & MAY_BE_EMPTY:
            print(f"note: [{title}] empty (allowed: {', '.join(sorted(names & MAY_BE_EMPTY))}): {q}")
            n_ok += 1
            continue
        bad(f"query [{title}]", f"empty result: {q}")
        continue
    if "histogram_quantile" in e:
        vals = [float(s["value"][1]) for s in result]
        if not all(math.isfinite(v) for v in vals):
            bad(f"query [{title}]", f"not a number {vals}: {q}")
            continue
    n_ok += 1
if n_ok == len(exprs):
    ok(f"dashboard: all {len(exprs)} expressions evaluate in Prometheus with a result")

# The template variables' label_values(selector, label) find this run's value.
for name, v in variables.items():
    if v.get("type") != "query":
        continue
    q = v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query", "")
    m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", q)
    if not m:
        bad(f"variable ${name}", f"not label_values(selector, label): {q}")
        continue
    sel, label = subst(m.group(1))[0], m.group(2)
    r = get("/api/v1/series", **{"match[]": sel})
    vals = sorted({s.get(label) for s in r.get("data", []) if s.get(label)})
    if r.get("status") == "success" and VALUES[name] in vals:
        ok(f"variable ${name}: label_values finds {VALUES[name]}")
    else:
        bad(f"variable ${name}", f"{sel} / {label}: {vals} {r.get('error', '')}")
print("checks: done")
PY
rc=$?
cat "$WORK/checks.out"
add_results "$WORK/checks.out"
if ! grep -q '^checks: done' "$WORK/checks.out"; then
  fail "prometheus and dashboard checks" "the Python checks did not finish (exit $rc)"
fi

stop_prometheus
echo "run: $(($(date +%s) - T0)) s (besides any install)"
summary prometheus
exit "$N_FAIL"
